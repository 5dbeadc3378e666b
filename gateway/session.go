package gateway

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/syncgate/syncgate/fanout"
	"github.com/syncgate/syncgate/frames"
)

// session is one WebSocket connection. See the package doc for its
// goroutines.
type session struct {
	// Static after construction.
	srv  *Server
	conn *websocket.Conn
	id   string
	log  *slog.Logger
	done chan struct{} // closed by closeWith

	// Set by the hello handler on the reader goroutine before helloDone is
	// stored; read only by the reader afterwards.
	helloDone atomic.Bool
	clientID  string
	epoch     int64
	prod      *producer

	// Owned by the reader goroutine.
	subs map[string]*subscription

	// Send side; safe from any goroutine.
	q sendQueue

	// lastRead is when the reader last got a message (Unix nanoseconds);
	// inbound traffic proves the peer alive, so the writer skips pings.
	lastRead atomic.Int64

	// Written once by closeWith before done is closed.
	closeOnce sync.Once
	reason    closeReason
}

// subscription is one session's subscription to a topic: the
// [fanout.Subscriber] the transport delivers to.
type subscription struct {
	s      *session
	sid    string
	topic  string
	prefix []byte // `{"type":"patch","v":1,"sid":"…"`, encoded once
}

// Deliver queues a broadcast patch for the session; it never blocks.
func (sub *subscription) Deliver(m *fanout.Message) {
	sub.s.enqueue(outItem{prefix: sub.prefix, body: m.Data, at: m.At.UnixNano(), kind: idxPatch})
}

func newSession(srv *Server, conn *websocket.Conn, id, remote string) *session {
	return &session{
		srv:  srv,
		conn: conn,
		id:   id,
		log:  srv.log.With(logKeySession, id, logKeyRemote, remote),
		done: make(chan struct{}),
		subs: map[string]*subscription{},
		q:    sendQueue{wake: make(chan struct{}, 1)},
	}
}

// run serves the session until it ends; it is the reader goroutine and it
// owns the writer goroutine, which it waits for.
func (s *session) run(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { s.writeLoop(ctx) })
	hello := time.AfterFunc(s.srv.cfg.HelloTimeout, func() {
		if !s.helloDone.Load() {
			s.closeWith(reasonHelloTimeout)
		}
	})
	err := s.readLoop(ctx)
	hello.Stop()
	s.closeWith(readErrorReason(err))
	wg.Wait()
	for _, sub := range s.subs {
		_ = s.srv.transport.Unsubscribe(context.WithoutCancel(ctx), sub.topic, sub)
	}
	if s.prod != nil {
		s.srv.producers.release(s.prod, s.srv.cfg.Now())
	}
	s.log.Debug("session closed", "reason", s.reason.String(), "err", err)
}

func readErrorReason(err error) closeReason {
	switch {
	case errors.Is(err, websocket.ErrMessageTooBig):
		return reasonMessageTooBig
	case websocket.CloseStatus(err) != -1:
		return reasonClientClosed
	default:
		return reasonReadError
	}
}

func (s *session) readLoop(ctx context.Context) error {
	for {
		typ, msg, err := s.conn.Read(ctx)
		if err != nil {
			return err
		}
		s.lastRead.Store(s.srv.cfg.Now().UnixNano())
		s.srv.metrics.bytesIn.Add(float64(len(msg)))
		if typ != websocket.MessageText {
			s.sendError(frames.NewError(frames.CodeBadFrame, "", "binary WebSocket message",
				"send frames as JSON in text messages"))
			continue
		}
		frames.Split(msg, func(line []byte) bool {
			s.handleLine(ctx, line)
			return !s.isClosing()
		})
	}
}

// closeWith ends the session for reason r; the first reason wins. It never
// blocks: the writer goroutine sends the close frame.
func (s *session) closeWith(r closeReason) {
	s.closeOnce.Do(func() {
		s.reason = r
		s.q.close()
		close(s.done)
		s.srv.metrics.closes[r].Inc()
	})
}

func (s *session) isClosing() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// enqueue queues it for the writer. A full queue closes the session as a
// slow consumer.
func (s *session) enqueue(it outItem) {
	full, closed := s.q.push(it, s.srv.cfg.SendQueueMessages, s.srv.cfg.SendQueueBytes)
	switch {
	case full:
		s.srv.metrics.drops[dropQueueFull].Inc()
		s.closeWith(reasonSlowConsumer)
	case closed:
		s.srv.metrics.drops[dropSessionClosed].Inc()
	}
}

// send encodes f and queues it.
func (s *session) send(f frames.Frame) {
	b, err := frames.Encode(f)
	if err != nil {
		// Only a server bug can make our own frames unencodable.
		s.log.Error("encode failed", "type", f.FrameType(), "err", err)
		return
	}
	s.enqueue(outItem{body: b, kind: int8(frameIndex(f.FrameType()))})
}

// sendAck queues an ack for ref.
func (s *session) sendAck(ref string, lsn *string) {
	s.send(&frames.Ack{Ref: ref, LSN: lsn})
}

// sendError queues an error ack; the error's Ref says which frame it answers.
func (s *session) sendError(e *frames.Error) {
	s.srv.metrics.errorsByCode.WithLabelValues(string(e.Code)).Inc()
	s.send(&frames.Ack{Ref: e.Ref, Error: e.Body()})
}
