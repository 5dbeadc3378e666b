package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/syncgate/syncgate/auth"
	"github.com/syncgate/syncgate/frames"
	"github.com/syncgate/syncgate/storage"
)

// maxClientIDLen bounds hello.clientId, which keys server memory.
const maxClientIDLen = 128

// handleLine decodes one frame and runs its handler. Every failure becomes
// an error ack; none ends the session.
func (s *session) handleLine(ctx context.Context, line []byte) {
	f, err := frames.Decode(line)
	if err != nil {
		// Possibly a mutate whose seq never reaches the producer: the
		// connection's next mutate is not taken for its first (run).
		s.dropped = true
		s.srv.metrics.badFrames.Inc()
		var fe *frames.Error
		if !errors.As(err, &fe) {
			fe = frames.NewError(frames.CodeBadFrame, "", err.Error(), "send a valid protocol v1 frame")
		}
		s.sendError(fe)
		return
	}
	if i := frameIndex(f.FrameType()); i >= 0 {
		s.srv.metrics.framesIn[i].Inc()
	}
	refused := checkLengths(f)
	if _, ok := f.(*frames.Hello); refused == nil && !ok && !s.helloDone.Load() {
		refused = frames.NewError(frames.CodeHelloRequired, refOf(f), "a "+string(f.FrameType())+" frame arrived before hello",
			"send hello as the first frame of every connection")
	}
	if refused != nil {
		if _, ok := f.(*frames.Mutate); ok {
			s.dropped = true // its seq never reaches the producer, as above
		}
		s.sendError(refused)
		return
	}
	switch f := f.(type) {
	case *frames.Hello:
		s.handleFrameHello(f)
	case *frames.Subscribe:
		s.handleFrameSubscribe(ctx, f)
	case *frames.Mutate:
		s.handleFrameMutate(ctx, f)
	case *frames.Presence:
		s.handleFramePresence(ctx, f)
	default:
		s.sendError(frames.NewError(frames.CodeUnexpectedFrame, "", "a client sent a "+string(f.FrameType())+" frame, which only the server sends",
			"clients send hello, subscribe, mutate and presence"))
	}
}

// retryAsNewMutate is the fix of a mutate's X_INTERNAL: the outcome is
// recorded under its seq, so a retry of the seq gets it again.
const retryAsNewMutate = "retry later as a new mutate (the next seq and a new key): this outcome is recorded, so the same seq or key gets it again"

// maxIDLen bounds the client-chosen identifiers the server keeps: a
// subscription's sid and a mutate's key and name (the producer remembers
// recent keys, so their size is memory a client could otherwise pin).
const maxIDLen = 256

// checkLengths refuses identifiers over maxIDLen.
func checkLengths(f frames.Frame) *frames.Error {
	var field string
	var n int
	switch f := f.(type) {
	case *frames.Subscribe:
		field, n = "subscribe.sid", len(f.SID)
	case *frames.Mutate:
		field, n = "mutate.key", len(f.Key)
		if len(f.Name) > n {
			field, n = "mutate.name", len(f.Name)
		}
	}
	if n <= maxIDLen {
		return nil
	}
	return frames.NewError(frames.CodeBadField, refOf(f), fmt.Sprintf("%s: %d bytes, over the limit of %d", field, n, maxIDLen),
		"use identifiers of at most 256 bytes, e.g. a UUID or a counter")
}

// refOf is the ack ref for a decoded frame (see frames.Ack).
func refOf(f frames.Frame) string {
	switch f := f.(type) {
	case *frames.Subscribe:
		return f.SID
	case *frames.Mutate:
		return f.Key
	case *frames.Presence:
		return presenceRefPrefix + f.Topic
	}
	return ""
}

func (s *session) handleFrameHello(f *frames.Hello) {
	if s.helloDone.Load() {
		if s.srv.cfg.Verifier != nil {
			s.refreshToken(f) // auth.go: a hello on a session with a token refreshes it
			return
		}
		s.sendError(frames.NewError(frames.CodeDuplicateHello, "", "hello was already received on this connection",
			"send hello once per connection; open a new connection to start over"))
		return
	}
	if len(f.ClientID) > maxClientIDLen {
		s.sendError(frames.NewError(frames.CodeBadField, "", fmt.Sprintf("hello.clientId: %d bytes, over the limit of %d", len(f.ClientID), maxClientIDLen),
			"use a client id of at most 128 bytes, e.g. a UUID"))
		return
	}
	if len(f.BuildID) > maxBuildIDLen {
		s.sendError(frames.NewError(frames.CodeBadField, "", fmt.Sprintf("hello.buildId: %d bytes, over the limit of %d", len(f.BuildID), maxBuildIDLen),
			"use a build id of at most 256 bytes, e.g. a version or a commit hash"))
		return
	}
	st := anonymous // dev mode: a token, if any, is ignored
	if s.srv.cfg.Verifier != nil {
		if st = s.authenticate(f.Token); st == nil {
			return // refused and closing (auth.go)
		}
		if s.srv.perActor.acquire(*st.actorID) {
			s.actorKey = *st.actorID
		} else if s.srv.perActor.max > 0 {
			s.srv.metrics.rejected[rejectPerActor].Inc()
			s.sendError(frames.NewError(frames.CodeTooManySessions, "", fmt.Sprintf("this actor already has %d sessions, the limit", s.srv.perActor.max), ""))
			s.closeWith(reasonTooManySessions)
			return
		}
	}
	s.auth.Store(st) // its expiry timer is armed once the hello is answered
	s.clientID, s.epoch = f.ClientID, f.Epoch
	if f.ClientID != "" {
		s.prodName = producerName(st.actorID, f.ClientID)
		s.prod = s.srv.producers.acquire(s.prodName, f.Epoch)
		if f.Seq != nil {
			s.prod.advance(f.Epoch, *f.Seq)
		}
	} // else the session is its own producer, made at its first mutate
	s.helloDone.Store(true)
	s.helloTimer.Stop()
	s.helloTimer = nil
	s.answerHello(s.serverHello(st.actorID), f.BuildID)
	// Only now: a token past its exp (accepted within the leeway) is
	// told X_TOKEN_EXPIRED at once, and that error ack, queued before the
	// server's hello, would read as the hello's refusal.
	s.setAuth(st)
}

// serverHello is the hello the server answers s's hello (or a token
// refresh) with: the session's id, actor and producer, and the limits a
// client's sending must keep to.
func (s *session) serverHello(actorID *string) *frames.Hello {
	id := s.id
	h := &frames.Hello{
		SessionID:  &id,
		ActorID:    actorID,
		Resume:     []frames.Cursor{},
		ClientID:   s.clientID,
		Epoch:      s.epoch,
		MaxMessage: s.srv.cfg.MaxFrameBytes,
	}
	if s.lim != nil {
		h.FrameRate, h.FrameBurst = s.srv.cfg.FrameRate, int64(s.srv.cfg.FrameBurst)
	}
	return h
}

func (s *session) handleFrameSubscribe(ctx context.Context, f *frames.Subscribe) {
	if f.Op == frames.OpDrop { // a drop is by sid alone, whatever its target
		sub, ok := s.subs[f.SID]
		if !ok {
			s.sendError(frames.NewError(frames.CodeNotSubscribed, f.SID, "subscribe.sid: no active subscription "+quote(f.SID),
				"drop only sids you added and have not dropped"))
			return
		}
		// The transport first: a subscription it could not drop (a
		// transport over a network may fail) is still delivered to, so it
		// stays the session's, for a retry and for run to unsubscribe at
		// close, rather than acked as dropped and left registered.
		if err := s.srv.transport.Unsubscribe(ctx, sub.topic, sub); err != nil {
			s.log().Warn("unsubscribe failed", "topic", sub.topic, "err", err)
			s.sendError(frames.NewError(frames.CodeInternal, f.SID, "the server could not drop subscription "+quote(f.SID)+"; it is still active",
				"retry the drop later"))
			return
		}
		delete(s.subs, f.SID)
		s.srv.presence.unsubscribed(ctx, s, sub.topic) // the last one leaves the topic's presence
		sub.endPersisted()                             // a replay stops before the drop is acked
		sub.answerDropped()                            // a resume not answered yet is, first
		s.sendAck(f.SID, nil)
		return
	}
	if f.Target.Kind != frames.TargetTopic {
		s.sendError(frames.NewError(frames.CodeUnsupported, f.SID, "subscribe.target.kind: query subscriptions are not available on this server yet",
			`subscribe to a topic: target {"kind":"topic","topic":"…","cursor":null}`))
		return
	}
	if err := validTopic(f.Target.Topic); err != nil {
		s.sendError(frames.NewError(frames.CodeBadTopic, f.SID, "subscribe.target.topic: "+err.Error(), topicFix))
		return
	}
	if !s.allowed(auth.Subscribe, f.SID, f.Target.Topic) {
		return
	}
	if _, ok := s.subs[f.SID]; ok {
		s.sendError(frames.NewError(frames.CodeSIDInUse, f.SID, "subscribe.sid: "+quote(f.SID)+" is already active",
			"pick a sid not in use on this connection, or drop it first"))
		return
	}
	if len(s.subs) >= s.srv.cfg.MaxSubscriptions {
		s.sendError(frames.NewError(frames.CodeTooManySubs, f.SID, fmt.Sprintf("this session already has %d subscriptions, the limit", len(s.subs)),
			"drop subscriptions you no longer need"))
		return
	}
	sub := &subscription{s: s, sid: f.SID, topic: f.Target.Topic, prefix: frames.AppendPatchPrefix(nil, f.SID)}
	if s.srv.persisted(sub.topic) {
		if err := s.subscribePersisted(ctx, f, sub); err != nil {
			s.sendError(s.logError(f.SID, "subscribe", sub.topic, err))
			return
		}
		s.addSub(sub)
		return
	}
	err := s.srv.subscribe(ctx, sub, func(tail string) {
		// Runs under the topic's stripe lock: nothing is published to the
		// topic until the ack and snapshot are queued.
		if f.Target.Cursor != nil {
			s.sendError(frames.NewError(frames.CodeCursorExpired, f.SID,
				"subscribe.target.cursor: topic "+quote(f.Target.Topic)+" is ephemeral; its messages are not kept, so a cursor cannot resume",
				"treat messages after your cursor as lost; the snapshot that follows starts the subscription afresh"))
		} else {
			s.sendAck(f.SID, nil)
		}
		s.sendSnapshot(f.SID, f.Target.Topic, tail, "")
	})
	if err != nil {
		s.log().Warn("subscribe failed", "topic", f.Target.Topic, "err", err)
		s.sendError(frames.NewError(frames.CodeInternal, f.SID, "the server could not subscribe", "retry later"))
		return
	}
	s.addSub(sub)
}

func (s *session) addSub(sub *subscription) {
	if s.subs == nil {
		s.subs = map[string]*subscription{}
	}
	s.subs[sub.sid] = sub
	s.srv.presence.subscribed(s, sub.topic)
}

// logError turns a failure of a persisted topic's log into the typed error
// that answers ref, logging what is the server's fault.
func (s *session) logError(ref, op, topic string, err error) *frames.Error {
	var pe *storage.ProducerError
	var ce *storage.ClosedError
	switch {
	case errors.As(err, &pe) && pe.Kind == storage.KindFenced:
		return frames.NewError(frames.CodeEpochFenced, ref,
			fmt.Sprintf("producer epoch %d is fenced in topic %s's log: epoch %d is current", s.epoch, quote(topic), pe.CurrentEpoch),
			"this client was replaced by a newer instance; reconnect with a higher epoch if this one should win")
	case errors.As(err, &ce):
		return frames.NewError(frames.CodeBadTopic, ref, "topic "+quote(topic)+"'s stream was closed over the Durable Streams API",
			"publish to another topic; a closed stream never accepts messages again")
	case errors.Is(err, storage.ErrGone):
		return frames.NewError(frames.CodeBadTopic, ref, "topic "+quote(topic)+"'s stream was deleted over the Durable Streams API while forks of it remain",
			"use another topic, or this one again once its forks are deleted")
	case errors.Is(err, storage.ErrContentType):
		err = errNotJSONStream
		fallthrough
	case errors.Is(err, errNotJSONStream), errors.Is(err, storage.ErrConflict):
		return frames.NewError(frames.CodeBadTopic, ref, "topic "+quote(topic)+": "+err.Error(),
			"persisted topics are JSON streams; use another topic name or recreate the stream as application/json")
	case errors.Is(err, storage.ErrTooLarge):
		return frames.NewError(frames.CodeBadInput, ref, "mutate.input.data is larger than the log accepts", "send smaller messages")
	}
	s.log().Warn(op+" on a persisted topic failed", "topic", topic, "err", err)
	fix := "retry the same frame later"
	if op == "publish" {
		fix = retryAsNewMutate // recorded like any outcome
	}
	return frames.NewError(frames.CodeInternal, ref, "the server could not "+op+" on topic "+quote(topic), fix)
}

// publishInput reads the input of the built-in "publish" mutation,
// {topic: string, data: any JSON}, without a reflective decode.
func publishInput(in []byte) (topic string, data []byte, ok bool) {
	var haveTopic bool
	isObj := frames.Fields(in, func(k []byte, v json.RawMessage) bool {
		switch string(k) {
		case "topic":
			topic, haveTopic = frames.Unquote(v)
		case "data":
			data = v
		}
		return true
	})
	return topic, data, isObj && haveTopic && len(data) > 0
}

func (s *session) handleFrameMutate(ctx context.Context, f *frames.Mutate) {
	if s.prod == nil {
		s.prod = newProducer(s.epoch, s.srv.cfg.ProducerWindow)
	}
	first := !s.mutated && !s.dropped
	s.mutated = true
	s.prod.run(s.epoch, first, f, s.sendOutcome, func() (outcome, <-chan outcome) {
		return s.mutate(ctx, f)
	})
}

// mutate carries out f; the producer records the outcome under f.Seq. A
// publish to a persisted topic completes later: its outcome arrives on the
// returned channel once the log has committed it.
func (s *session) mutate(ctx context.Context, f *frames.Mutate) (outcome, <-chan outcome) {
	o := outcome{key: f.Key}
	if f.Name != "publish" {
		o.err = frames.NewError(frames.CodeUnknownMutation, f.Key, "mutate.name: unknown mutation "+quote(f.Name),
			`use a mutation this server knows: "publish"`)
		return o, nil
	}
	topic, data, ok := publishInput(f.Input)
	if !ok {
		o.err = frames.NewError(frames.CodeBadInput, f.Key, "mutate.input: publish wants an object {topic: string, data: any JSON}",
			`send input like {"topic":"room:1","data":{"text":"hi"}}`)
		return o, nil
	}
	if err := validTopic(topic); err != nil {
		o.err = frames.NewError(frames.CodeBadTopic, f.Key, "mutate.input.topic: "+err.Error(), topicFix)
		return o, nil
	}
	if !fitsRow(data) {
		o.err = frames.NewError(frames.CodeBadInput, f.Key,
			fmt.Sprintf("mutate.input.data nests more than %d deep: a topic row's patch would nest over the frame limit (%d), and no subscriber could read it", maxRowDepth, frames.MaxDepth),
			"send flatter data")
		return o, nil
	}
	if o.err = s.forbidden(auth.Publish, f.Key, topic); o.err != nil {
		return o, nil // before any effect: no delivery, no log append
	}
	if s.srv.persisted(topic) {
		return s.publishPersisted(f, topic, data)
	}
	lsn, err := s.srv.publish(ctx, topic, s.actorID(), data)
	if err != nil {
		s.log().Warn("publish failed", "topic", topic, "err", err)
		o.err = frames.NewError(frames.CodeInternal, f.Key, "the server could not publish", retryAsNewMutate)
		return o, nil
	}
	o.lsn = lsn
	return o, nil
}

// sendOutcome acks a mutate with its (possibly replayed) outcome.
func (s *session) sendOutcome(o outcome) {
	if o.err != nil {
		s.sendError(o.err)
		return
	}
	lsn := o.lsn
	s.sendAck(o.key, &lsn)
}

func quote(s string) string { return fmt.Sprintf("%q", s) }
