// Package fanout moves published messages to the subscribers of a topic.
// It imports nothing of ours.
//
// Start with [Transport], the interface the gateway uses, and [NewHub], its
// in-process implementation. Other backends (fanout/natsbus) implement the
// same interface and must pass the contract suite in fanout/fanouttest.
//
// # Messages
//
// A publication is encoded once: the transport builds one [Message] and
// hands the same pointer, with the same Data bytes, to every subscriber.
// Nobody modifies a Message or its Data after Publish. Its At is when
// Publish was called, or, through the optional [AtPublisher], the time the
// publisher gives (a message published before it reached the transport).
//
// # Subscribers
//
// A [Subscriber] is called on the publisher's goroutine (Hub) or on a
// transport goroutine (other backends). Deliver must not block and must not
// call back into the Transport: the gateway's sessions enqueue into their
// bounded send queue and return.
package fanout
