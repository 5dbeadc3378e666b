package fanout

import (
	"context"
	"time"
)

// Message is one publication. The same *Message, and the same Data bytes,
// is handed to every subscriber of the topic: encode once, fan out the same
// bytes. A Message is read-only after Publish; subscribers may keep it.
type Message struct {
	Topic string
	Data  []byte
	At    time.Time // when Publish was called (HubConfig.Now for the Hub), or the time given to PublishAt
}

// Subscriber receives the messages of the topics it is subscribed to.
//
// Deliver must not block and must not call back into the Transport (the Hub
// calls Deliver while holding a shard lock). It may be called concurrently
// from several goroutines when several goroutines publish.
//
// A Transport identifies a subscriber by interface equality, so its dynamic
// type must be comparable; use a pointer type.
type Subscriber interface {
	Deliver(m *Message)
}

// Transport moves messages between publishers and subscribers: the
// in-process [Hub] now, NATS subjects across nodes later. Every
// implementation must pass fanouttest.Run.
//
// All methods may be called concurrently. The contract:
//
//   - Publish hands data to every current subscriber of topic, possibly
//     asynchronously. The caller must not modify data after Publish. A
//     topic with no subscribers drops the message; that is not an error.
//   - Successive Publish calls from one goroutine to one topic reach each
//     subscriber in that order. Nothing is promised across publishers or
//     across topics.
//   - Subscribe is idempotent for the same (topic, s): s gets each message
//     once, and one Unsubscribe removes it.
//   - After Unsubscribe returns, s.Deliver is never called again for topic.
//     Unsubscribing an unknown (topic, s) is not an error.
//   - Publish with an already-cancelled ctx returns an error wrapping
//     ctx.Err() and delivers nothing.
//
// ctx carries cancellation only.
type Transport interface {
	Publish(ctx context.Context, topic string, data []byte) error
	Subscribe(ctx context.Context, topic string, s Subscriber) error
	Unsubscribe(ctx context.Context, topic string, s Subscriber) error
}

// AtPublisher is an optional capability of a [Transport], found by type
// assertion: PublishAt is Publish with the [Message.At] its subscribers
// get set to at, for a message published before it reached the transport
// (the gateway hands a persisted topic's records over when it reads them
// back from its log). A zero at means now, as for Publish. [Hub]
// implements it.
type AtPublisher interface {
	PublishAt(ctx context.Context, topic string, data []byte, at time.Time) error
}
