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
// fanout deliveries) and its writer. push never blocks.
//
// The writer goroutine exists only while there is work: push starts it when
// the queue goes from idle to non-empty, and it exits when it finds the
// queue empty. An idle session therefore holds no writer goroutine and no
// write buffer. At most one writer runs at a time, so it alone writes data
// frames to the connection.
type sendQueue struct {
	mu      sync.Mutex
	items   []outItem     // guarded by mu
	bytes   int           // guarded by mu
	writing bool          // guarded by mu: a writer goroutine is running (or must be started)
	pingDue bool          // guarded by mu: the writer should ping before it exits
	reason  closeReason   // guarded by mu: set once by closeWith; then nothing is accepted
	room    chan struct{} // guarded by mu: closed when the writer next takes the queue (waitRoom)

	writers *sync.WaitGroup // joined under mu whenever writing turns true
}

// pushResult says what became of a pushed frame.
type pushResult int8

const (
	pushed      pushResult = iota // queued; the running writer will send it
	pushedStart                   // queued; the caller must start a writer
	pushFull                      // refused: the queue is over a bound
	pushClosed                    // refused: the session is closing
)

// push appends it unless the session is closing or the queue would exceed
// maxItems or maxBytes.
func (q *sendQueue) push(it outItem, maxItems, maxBytes int) pushResult {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.reason != reasonNone:
		return pushClosed
	case len(q.items)+1 > maxItems || q.bytes+it.size() > maxBytes:
		return pushFull
	}
	q.items = append(q.items, it)
	q.bytes += it.size()
	if q.writing {
		return pushed
	}
	q.writing = true
	q.writers.Add(1)
	return pushedStart
}

// pressed reports whether the queue holds at least items frames or bytes.
func (q *sendQueue) pressed(items, bytes int) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items) >= items || q.bytes >= bytes
}

// keptQueueCap is the largest queue backing array an idle session keeps
// for its next frames (4 × 64 bytes).
const keptQueueCap = 4

// next hands the writer everything queued, taking spare (emptied) as the new
// backing slice so steady state allocates nothing. When there is nothing to
// do it marks the writer stopped and returns done; closing reports that the
// session is closing, with the reason.
func (q *sendQueue) next(spare []outItem) (items []outItem, ping bool, reason closeReason, done bool) {
	clear(spare)
	q.mu.Lock()
	defer q.mu.Unlock()
	items, ping, reason = q.items, q.pingDue, q.reason
	if len(items) == 0 && !ping && reason == reasonNone {
		q.writing = false
		// An idle session keeps a small backing array for its next
		// frames (so one that gets a frame now and then does not
		// allocate one per frame) and lets a big one go.
		switch {
		case cap(q.items) > 0 && cap(q.items) <= keptQueueCap:
		case cap(spare) > 0 && cap(spare) <= keptQueueCap:
			q.items = spare[:0]
		default:
			q.items = nil
		}
		return nil, false, reasonNone, true
	}
	q.items, q.bytes, q.pingDue = spare[:0], 0, false
	if q.room != nil {
		close(q.room)
		q.room = nil
	}
	return items, ping, reason, false
}

// waitRoom waits until the queue holds fewer than maxBytes, the session is
// closing, or ctx ends (then it returns ctx.Err()). A producer of bulk
// frames (a replay) calls it between pages so it never overflows the
// queue it shares with live traffic.
func (q *sendQueue) waitRoom(ctx context.Context, maxBytes int) error {
	for {
		q.mu.Lock()
		if q.bytes < maxBytes || q.reason != reasonNone {
			q.mu.Unlock()
			return nil
		}
		if q.room == nil {
			q.room = make(chan struct{})
		}
		room := q.room
		q.mu.Unlock()
		select {
		case <-room:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// writeBufPool holds batch buffers, so idle sessions hold none.
var writeBufPool = sync.Pool{New: func() any { b := make([]byte, 0, 16<<10); return &b }}

// writeLoop drains the queue into batched messages until it is empty, pings
// when asked, and, once the session is closing, sends the close frame.
func (s *session) writeLoop(ctx context.Context) {
	var batch []outItem
	var wait *time.Timer
	defer func() {
		if wait != nil {
			wait.Stop()
		}
	}()
	for {
		// Pacing: under load, a session writes at most once per delay so
		// that frames queued meanwhile share one message (see pacer). Only
		// a session whose last two writes were within twice the delay is
		// held (one whose frames come further apart has nothing to batch),
		// and one whose queue is an eighth full writes at once: pacing must
		// never be what makes a consumer slow.
		if d := s.srv.pacer.delay(); d > 0 && s.lastGap < 2*int64(d) &&
			!s.q.pressed(s.srv.cfg.SendQueueMessages/8, s.srv.cfg.SendQueueBytes/8) {
			// min(…, d): a wall clock stepped backwards must not stretch
			// the wait beyond the delay.
			if left := min(time.Duration(s.lastWrite+int64(d)-s.srv.cfg.Now().UnixNano()), d); left > 0 {
				if wait == nil {
					wait = time.NewTimer(left)
				} else {
					wait.Reset(left)
				}
				<-wait.C
			}
		}
		items, ping, reason, done := s.q.next(batch)
		if done {
			return
		}
		if reason != reasonNone {
			s.finish(ctx, reason, items)
			return
		}
		if err := s.writeBatch(context.Background(), items); err != nil {
			// The stream may hold part of a frame: nothing more is
			// written, not even a ping; the next round closes.
			s.log().Debug("write failed", "err", err)
			s.closeWith(reasonWriteError)
			batch = nil // items may be the queue's array again by the next round
			continue
		}
		if ping {
			if err := s.ping(ctx); err != nil {
				s.closeWith(reasonPingTimeout)
			}
		}
		batch = items
		if cap(batch) > 1024 {
			batch = nil // a burst has passed; let its memory go
		}
	}
}

// finish ends the connection for reason: on shutdown and drain it first
// delivers what is already queued (acks included).
func (s *session) finish(ctx context.Context, r closeReason, items []outItem) {
	s.srv.presence.release(s) // not after the handshake: a vanished peer makes it wait
	if r.flushes() {
		if err := s.writeBatch(context.Background(), items); err != nil {
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

// pingTick runs on the session's ping timer. A peer that sent anything
// within the last ping interval is alive without a ping; otherwise the
// writer is asked to ping.
func (s *session) pingTick() {
	s.q.mu.Lock()
	if s.q.reason != reasonNone {
		s.q.mu.Unlock()
		return // closing: not re-armed
	}
	start := false
	if time.Duration(s.srv.cfg.Now().UnixNano()-s.lastRead.Load()) >= s.srv.cfg.PingInterval {
		s.q.pingDue = true
		start = s.claimWriterLocked()
	}
	s.pingTimer.Reset(s.srv.cfg.PingInterval)
	s.q.mu.Unlock()
	if start {
		s.spawnWriter()
	}
}

// ping waits up to PongTimeout for a pong. A late pong is forgiven when
// messages kept arriving meanwhile: a client busy publishing can have its
// pong stuck behind its own backpressured writes.
func (s *session) ping(ctx context.Context) error {
	start := s.srv.cfg.Now().UnixNano()
	ctx, cancel := context.WithTimeout(ctx, s.srv.cfg.PongTimeout)
	defer cancel()
	err := s.conn.Ping(ctx)
	if err != nil && s.lastRead.Load() > start && ctx.Err() != nil {
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
	// Write deadlines are kept by corkConn on the raw connection (a
	// cancellable ctx would cost coder/websocket a callback registration per
	// message).
	now := s.srv.cfg.Now()
	s.lastGap, s.lastWrite = now.UnixNano()-s.lastWrite, now.UnixNano()
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
	if cap(buf) <= 2*s.srv.cfg.MaxBatchBytes {
		*bp = buf[:0] // a buffer grown by one huge frame is left to the GC
	} else {
		*bp = make([]byte, 0, 16<<10)
	}
	for k, n := range counts {
		if n > 0 {
			m.framesOut[k].Add(float64(n))
		}
	}
	return err
}

func (s *session) writeMessage(ctx context.Context, msg []byte, items []outItem) error {
	s.netConn.cork()
	err := s.conn.Write(ctx, websocket.MessageText, msg)
	if uerr := s.netConn.uncork(); err == nil {
		err = uerr
	}
	if err != nil {
		return err
	}
	s.srv.pacer.wrote()
	m := s.srv.metrics
	m.bytesOut.Add(float64(len(msg)))
	m.messagesOut.Inc()
	// One observation per message, for its oldest patch: the latency of
	// the frame that waited longest, at one histogram update per write
	// rather than per frame.
	oldest := int64(0)
	for i := range items {
		if at := items[i].at; at != 0 && (oldest == 0 || at < oldest) {
			oldest = at
		}
	}
	if oldest != 0 {
		m.deliveryLatency.Observe(float64(s.srv.cfg.Now().UnixNano()-oldest) / 1e9)
	}
	return nil
}
