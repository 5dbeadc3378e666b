package gateway

import (
	"context"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// outItem is one frame waiting in a session's send queue. The frame's bytes
// are prefix followed by body; a broadcast patch shares body with every other
// subscriber and carries its subscription's pre-encoded prefix.
type outItem struct {
	prefix []byte
	body   []byte
	at     int64 // publish time in Unix nanoseconds, for the latency histogram; 0 if none
	kind   int8  // index into frameTypes
}

func (it *outItem) size() int { return len(it.prefix) + len(it.body) }

// sendQueue is a session's bounded queue between producers (handlers and
// fanout deliveries) and the writer goroutine. push never blocks.
type sendQueue struct {
	wake chan struct{} // capacity 1: "the queue is not empty"

	mu     sync.Mutex
	items  []outItem // guarded by mu
	bytes  int       // guarded by mu
	closed bool      // guarded by mu
}

// push appends it unless the queue is closed or would exceed its bounds.
// It reports full when the bounds are exceeded (the caller closes the
// session) and closed when the queue no longer accepts frames.
func (q *sendQueue) push(it outItem, maxItems, maxBytes int) (full, closed bool) {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return false, true
	}
	if len(q.items)+1 > maxItems || q.bytes+it.size() > maxBytes {
		q.closed = true
		q.mu.Unlock()
		return true, false
	}
	q.items = append(q.items, it)
	q.bytes += it.size()
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return false, false
}

// swap hands the queued items to the writer and takes spare (emptied) as the
// new backing slice, so steady state allocates nothing.
func (q *sendQueue) swap(spare []outItem) []outItem {
	clear(spare)
	q.mu.Lock()
	items := q.items
	q.items = spare[:0]
	q.bytes = 0
	q.mu.Unlock()
	return items
}

// close stops the queue accepting frames; queued frames stay for a flush.
func (q *sendQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
}

// writeBufPool holds batch buffers, so idle sessions hold none.
var writeBufPool = sync.Pool{New: func() any { b := make([]byte, 0, 16<<10); return &b }}

// writeLoop is the session's writer goroutine: the only code that writes to
// the connection. It drains the queue into batched messages, pings, and on
// close sends the close frame.
func (s *session) writeLoop(ctx context.Context) {
	ping := time.NewTicker(s.srv.cfg.PingInterval)
	defer ping.Stop()
	var batch []outItem
	for {
		select {
		case <-s.q.wake:
		case <-ping.C:
			if err := s.ping(ctx); err != nil {
				s.closeWith(reasonPingTimeout)
			}
			continue
		case <-s.done:
		}
		if s.isClosing() {
			break
		}
		batch = s.q.swap(batch)
		if err := s.writeBatch(ctx, batch); err != nil {
			s.log.Debug("write failed", "err", err)
			s.closeWith(reasonWriteError)
			break
		}
		if cap(batch) > 1024 && len(batch) < 64 {
			batch = nil // a burst has passed; let its memory go
		}
	}
	r := s.reason
	if r == reasonShutdown {
		// Going away: deliver what is already queued (acks included).
		s.q.close()
		if err := s.writeBatch(ctx, s.q.swap(nil)); err != nil {
			r = reasonWriteError
		}
	}
	if r.sendsCloseFrame() {
		c := closeReasons[r]
		_ = s.conn.Close(c.code, c.text) // bounded by the library: 5s write + 5s wait
	} else {
		_ = s.conn.CloseNow()
	}
}

// ping checks the peer is alive. A peer that sent anything within the last
// ping interval is alive without a ping, and so is one whose pong is late
// but whose messages kept arriving meanwhile: a client busy publishing can
// have its pong stuck behind its own backpressured writes.
func (s *session) ping(ctx context.Context) error {
	start := s.srv.cfg.Now()
	if time.Duration(start.UnixNano()-s.lastRead.Load()) < s.srv.cfg.PingInterval {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.srv.cfg.PongTimeout)
	defer cancel()
	err := s.conn.Ping(ctx)
	if err != nil && s.lastRead.Load() > start.UnixNano() && ctx.Err() != nil {
		return nil
	}
	return err
}

// writeBatch writes items as few WebSocket messages as MaxBatchBytes allows,
// frames separated by '\n'.
func (s *session) writeBatch(ctx context.Context, items []outItem) error {
	if len(items) == 0 {
		return nil
	}
	m := s.srv.metrics
	bp := writeBufPool.Get().(*[]byte)
	defer writeBufPool.Put(bp)
	buf := (*bp)[:0]
	var counts [numFrameTypes]int
	start := 0
	for i := range items {
		it := &items[i]
		if len(buf) > 0 && len(buf)+1+it.size() > s.srv.cfg.MaxBatchBytes {
			if err := s.writeMessage(ctx, buf, items[start:i]); err != nil {
				return err
			}
			buf, start = buf[:0], i
		}
		if len(buf) > 0 {
			buf = append(buf, '\n')
		}
		buf = append(buf, it.prefix...)
		buf = append(buf, it.body...)
		counts[it.kind]++
	}
	err := s.writeMessage(ctx, buf, items[start:])
	*bp = buf[:0]
	for k, n := range counts {
		if n > 0 {
			m.framesOut[k].Add(float64(n))
		}
	}
	return err
}

func (s *session) writeMessage(ctx context.Context, msg []byte, items []outItem) error {
	ctx, cancel := context.WithTimeout(ctx, s.srv.cfg.WriteTimeout)
	err := s.conn.Write(ctx, websocket.MessageText, msg)
	cancel()
	if err != nil {
		return err
	}
	m := s.srv.metrics
	m.bytesOut.Add(float64(len(msg)))
	m.messagesOut.Inc()
	now := s.srv.cfg.Now().UnixNano()
	for i := range items {
		if at := items[i].at; at != 0 {
			m.deliveryLatency.Observe(float64(now-at) / 1e9)
		}
	}
	return nil
}
