package gateway

import (
	"context"
	"errors"
	"net"
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
// The writer (a writerPool turn or a goroutine of the session's own, see
// spawnWriter) exists only while there is work: push claims it when the
// queue goes from idle to non-empty, and it stops when it finds the queue
// empty. An idle session therefore holds no writer goroutine and no write
// buffer. At most one writer runs at a time, so it alone writes data frames
// to the connection.
type sendQueue struct {
	mu      sync.Mutex
	items   []outItem     // guarded by mu
	bytes   int           // guarded by mu
	writing bool          // guarded by mu: a writer is claimed (running, in the pool's line, or about to start)
	pingDue bool          // guarded by mu: the writer should ping before it exits
	reason  closeReason   // guarded by mu: set once by closeWith; then nothing is accepted
	room    chan struct{} // guarded by mu: closed when the writer next takes the queue (waitRoom)
	held    holdKind      // guarded by mu: the writer is held by pacing, and by whom (see push)
	holdGen uint32        // guarded by mu: counts holds, so that a pool's entry of an ended hold is known (takeHold)
	wake    chan struct{} // guarded by mu: ends writeLoop's hold early; made at its first hold
	// pingStop ends the writer's ping (its wait for the pong): set while
	// one runs (session.ping), called by closeWith. Guarded by mu.
	pingStop context.CancelFunc

	writers *sync.WaitGroup // joined under mu whenever writing turns true
}

// pushResult says what became of a pushed frame.
type pushResult int8

const (
	pushed      pushResult = iota // queued; the running writer will send it
	pushedStart                   // queued; the caller must start a writer
	pushFull                      // refused: the queue is over a bound
	pushClosed                    // refused: the session is closing
	pushedWake                    // queued; the pool held the writer: the caller must put the session in its line
)

// holdKind says whether, and where, pacing holds a session's writer.
type holdKind int8

const (
	holdNone holdKind = iota
	holdPool          // in the pool's held heap (writerPool.hold)
	holdOwn           // writeLoop waiting on its timer
)

// push appends it unless the session is closing or the queue would exceed
// maxItems or maxBytes. A push that fills an eighth of either bound while
// pacing holds the writer ends the hold: holdFor checks the queue only
// when a hold starts, and a burst during it would otherwise close a
// healthy session as a slow consumer. writeLoop's hold is woken here;
// the pool's is ended here too, and the caller puts the session in line
// (pushedWake).
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
		if q.held != holdNone && (len(q.items) >= maxItems/8 || q.bytes >= maxBytes/8) {
			return q.unholdLocked()
		}
		return pushed
	}
	q.writing = true
	q.writers.Add(1)
	return pushedStart
}

// unholdLocked ends a pacing hold early (see push).
func (q *sendQueue) unholdLocked() pushResult {
	by := q.held
	q.held = holdNone
	q.holdGen++
	if by == holdOwn {
		select {
		case q.wake <- struct{}{}:
		default:
		}
		return pushed
	}
	return pushedWake
}

// holdOwn marks writeLoop's writer held, and returns the channel that
// push signals to end the hold early. It reports false, marking nothing,
// if the hold would already be over (see endsHoldLocked).
func (q *sendQueue) holdOwn(maxItems, maxBytes int) (wake <-chan struct{}, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.endsHoldLocked(maxItems, maxBytes) {
		return nil, false
	}
	if q.wake == nil {
		q.wake = make(chan struct{}, 1)
	}
	select {
	case <-q.wake: // left by a push racing the last hold's timer
	default:
	}
	q.held = holdOwn
	q.holdGen++
	return q.wake, true
}

// holdPool marks the writer held in the pool's heap and returns the
// hold's generation, for takeHold. It reports false, marking nothing, if
// the hold would already be over (see endsHoldLocked).
func (q *sendQueue) holdPool(maxItems, maxBytes int) (gen uint32, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.endsHoldLocked(maxItems, maxBytes) {
		return 0, false
	}
	q.held = holdPool
	q.holdGen++
	return q.holdGen, true
}

// endsHoldLocked reports whether a hold about to be marked would be over
// at once: the session is closing, or its queue holds an eighth of either
// bound. closeWith and push end only a hold already marked, and the
// writer decides to hold (holdFor) before it marks the hold, so a close
// or a burst in between (for writeLoop, also one during its last write)
// would otherwise wait out the whole hold.
func (q *sendQueue) endsHoldLocked(maxItems, maxBytes int) bool {
	return q.reason != reasonNone || len(q.items) >= maxItems/8 || q.bytes >= maxBytes/8
}

// takeHold ends the pool's hold gen when it comes due, and reports
// whether it was still on: false if push ended it early (the session went
// in line then, so this entry of the held heap is stale).
func (q *sendQueue) takeHold(gen uint32) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.held != holdPool || q.holdGen != gen {
		return false
	}
	q.held = holdNone
	return true
}

// endHold ends writeLoop's hold when its timer fired first.
func (q *sendQueue) endHold() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.held == holdOwn {
		q.held = holdNone
	}
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
		q.stopWriterLocked(spare)
		return nil, false, reasonNone, true
	}
	q.items, q.bytes, q.pingDue = spare[:0], 0, false
	if q.room != nil {
		close(q.room)
		q.room = nil
	}
	return items, ping, reason, false
}

// release marks the writer stopped if there is nothing for it to do, and
// reports whether it did. A pool worker calls it after a write, with
// written, the array it wrote from: a session with more queued goes back
// in line instead. It returns the array the worker keeps for its next
// session's queue (see next): written, or, when the session is stopped
// holding an array too big to keep idle (the spare an earlier turn gave
// it), that one, the session keeping written instead if that is small.
// Dropping such an array made the session's next frame allocate another:
// over the topics benchmark sendQueue.push allocated about a sixth of all
// bytes, and keeping the arrays cut its share by about 30%
// (docs/benchmarks.md, "Queue arrays kept on release").
func (q *sendQueue) release(written []outItem) (stopped bool, spare []outItem) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) > 0 || q.pingDue || q.reason != reasonNone {
		return false, written
	}
	own := q.items // empty, and cleared when the writer installed it (next)
	if cap(own) > keptQueueCap && cap(written) > 0 && cap(written) <= keptQueueCap {
		clear(written)
		q.items = nil // so that stopWriterLocked takes written
		q.stopWriterLocked(written)
		return true, own
	}
	q.stopWriterLocked(nil)
	return true, written
}

// stopWriterLocked marks the writer stopped. An idle session keeps a small
// backing array for its next frames (so one that gets a frame now and then
// does not allocate one per frame) and lets a big one go; spare, the
// writer's emptied array, may be the one it keeps.
func (q *sendQueue) stopWriterLocked(spare []outItem) {
	q.writing = false
	switch {
	case cap(q.items) > 0 && cap(q.items) <= keptQueueCap:
	case cap(spare) > 0 && cap(spare) <= keptQueueCap:
		q.items = spare[:0]
	default:
		q.items = nil
	}
}

// waitRoom waits until the queue holds fewer than maxItems frames and
// fewer than maxBytes, the session is closing, or ctx ends (then it
// returns ctx.Err()). A producer of bulk frames (a replay) calls it
// between pages so it never overflows the queue it shares with live
// traffic.
func (q *sendQueue) waitRoom(ctx context.Context, maxItems, maxBytes int) error {
	for {
		q.mu.Lock()
		if len(q.items) < maxItems && q.bytes < maxBytes || q.reason != reasonNone {
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

// writeRound is what a writer takes from the queue at once (see next).
type writeRound struct {
	items  []outItem
	ping   bool
	reason closeReason
}

// writeLoop drains the queue into batched messages until it is empty, pings
// when asked, and, once the session is closing, sends the close frame. It
// starts with first when that is non-nil: a round a pool worker took but
// cannot finish without waiting.
func (s *session) writeLoop(ctx context.Context, first *writeRound) {
	var batch []outItem
	var wait *time.Timer
	defer func() {
		if wait != nil {
			wait.Stop()
		}
	}()
	for {
		var r writeRound
		if first != nil {
			r, first = *first, nil
		} else {
			if left := s.holdFor(); left > 0 {
				if wake, ok := s.q.holdOwn(s.srv.cfg.SendQueueMessages, s.srv.cfg.SendQueueBytes); ok {
					if wait == nil {
						wait = time.NewTimer(left)
					} else {
						wait.Reset(left)
					}
					select {
					case <-wait.C:
						s.q.endHold()
					case <-wake: // the queue filled an eighth (push), or the session is closing
						wait.Stop()
					}
				}
			}
			var done bool
			r.items, r.ping, r.reason, done = s.q.next(batch)
			if done {
				return
			}
		}
		if r.reason != reasonNone {
			s.finish(ctx, r.reason, r.items)
			return
		}
		if _, _, err := s.writeBatch(context.Background(), r.items, true); err != nil {
			s.writeFailed(err)
			batch = nil // items may be the queue's array again by the next round
			continue
		}
		if r.ping {
			if err := s.ping(ctx); err != nil {
				s.pingFailed(err)
			}
		}
		batch = r.items
		if cap(batch) > 1024 {
			batch = nil // a burst has passed; let its memory go
		}
	}
}

// writeFailed closes the session after a failed write. The stream may hold
// part of a frame: nothing more is written, not even a ping; the writer's
// next round sends no close frame either.
//
// A write that fails with net.ErrClosed found the connection closed under
// it: by coder/websocket once it has answered the client's close frame,
// or by a cut, which comes after closeWith. The reader fails then too,
// and run closes the session with the reader's reason, which knows why
// (client_closed for the client's close frame): taking the reason here
// would race the reader for it and call a client's own close a write
// error (see pingFailed, likewise). Until then a write fails at once
// with nothing written (the library checks for a closed connection before
// it writes a frame), its frames counted as drops.
func (s *session) writeFailed(err error) {
	s.log().Debug("write failed", "err", err)
	s.writeBroken = true
	if errors.Is(err, net.ErrClosed) {
		return // the reader's reason
	}
	s.closeWith(reasonWriteError)
}

// pingFailed closes the session after a failed ping, for what failed.
// Only a pong that did not come within PongTimeout (or a ping frame that
// could not be written in that time) is ping_timeout. A connection that
// closed under the ping (coder/websocket closes it once it has answered
// the peer's close frame, and on a cut) fails the reader too, and run
// then closes the session with the reader's reason: taking the reason
// here would race the reader for it and call a client's own close a
// ping timeout. A ping cancelled (closeWith ends it, see session.ping)
// means the session is closing: the writer's next round closes it for
// the reason closeWith set. Any other error is the ping frame's write
// failing.
func (s *session) pingFailed(err error) {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		s.closeWith(reasonPingTimeout)
	case errors.Is(err, net.ErrClosed):
		// The reader's reason.
	case errors.Is(err, context.Canceled):
		// closeWith's reason. A no-op but when the cancel was s.ctx's,
		// which Shutdown cancels only after closing every session.
		s.closeWith(reasonShutdown)
	default:
		s.writeFailed(err)
	}
}

// holdFor is how long pacing holds the session's next write. Under load, a
// session writes at most once per delay so that frames queued meanwhile
// share one message (see pacer). Only a session that would batch is held:
// its last two writes were within twice the delay, and at the rate its
// last batch came (its frames over the time since the write before) a
// delay's wait would gather at least one and a half frames. A session
// whose frames come about a delay apart gains nothing from a hold but
// the wait: on the benchmark machine, with subscribers each getting a
// frame every 20 ms, the node wrote about 7% fewer messages when they
// were held (2.14 frames per message against 2.00), at a p50 of 13.6 ms
// against 3.9 (docs/benchmarks.md, "Hold only what batches"). A hold
// ends one delay after the session's last write, or sooner: once a full
// batch (holdFull frames) would have come, and, for a session that would
// gather fewer than holdFew frames, a frame gap and a quarter after its
// last write (both at its last batch's rate, which follows the holds:
// such a session's writes alternate between short and full-delay holds,
// and a frame waits at most about one of its gaps). A session
// that has not written yet is not held, and one whose queue is an eighth
// full writes at once: pacing must never be what makes a consumer slow
// (nor may a burst during a hold: see push, which ends it).
// Only the session's writer may call it.
func (s *session) holdFor() time.Duration {
	d := int64(s.srv.pacer.delay())
	if d <= 0 || s.lastGap >= 2*d || !s.batches(d) ||
		s.q.pressed(s.srv.cfg.SendQueueMessages/8, s.srv.cfg.SendQueueBytes/8) {
		return 0
	}
	if s.lastGap > 0 && d <= s.srv.pacer.maxDelay {
		// A session whose frames come fast (a publisher's acks, a
		// subscriber of a hot topic) waits only until a full batch has
		// come at its last batch's rate. Not while the node is
		// overloaded (the delay above MaxWriteDelay): then every
		// session's writes must thin out.
		d = min(d, holdFull*s.lastGap/int64(s.lastCount))
		if d*int64(s.lastCount) < holdFew*s.lastGap {
			// One whose frames come only a few a delay waits about
			// until its next frame, not the one after: on the benchmark
			// machine 1,000 subscribers getting a frame every 10 ms
			// had a p99 of 18.1 ms against 22.2 when held the whole
			// delay, for about 10% more server CPU per delivery
			// (docs/benchmarks.md, "Low-rate sessions wait for one
			// frame").
			gap := s.lastGap / int64(s.lastCount)
			d = min(d, gap+gap/4)
		}
	}
	// min(…, d): a wall clock stepped backwards must not stretch the wait
	// beyond the delay.
	return time.Duration(max(min(s.lastWrite+d-s.srv.cfg.Now().UnixNano(), d), 0))
}

// holdFull is the batch, in frames, a hold waits for at most. A
// pipelining publisher's acks come at tens of thousands a second: held for
// the whole delay they waited 12 ms at the median on the benchmark
// machine, held until 64 had come 4.4 ms, at the same server CPU
// (docs/benchmarks.md, "Hold only what batches").
const holdFull = 64

// holdFew is the batch, in frames, below which a hold lasts at most a
// frame gap and a quarter after the session's last write (see holdFor).
const holdFew = 4

// holdMinNum/holdMinDen is the batch, in frames, that a hold must be
// expected to gather for the session to be held.
const (
	holdMinNum = 3
	holdMinDen = 2
)

// batches reports whether a hold of d nanoseconds would batch s at the
// rate its last batch came; never for a session that has not written.
// Only s's writer may call it, or the pool while s waits in its line.
func (s *session) batches(d int64) bool {
	return s.lastCount > 0 && batches(s.lastCount, s.lastGap, d)
}

// frameGap is how far apart s's frames came in its last batch (its gap
// over its count), at most twice d, if a hold of d nanoseconds would not
// batch it; else 0, as it is for a session that has written at most once
// (its first gap runs from lastWrite's zero, so it is as large as
// lastWrite). The bound keeps a session whose frames came seconds apart,
// or that was idle for hours, from waiting that long before it counts as
// late. The same callers as batches.
func (s *session) frameGap(d int64) int64 {
	if s.lastCount == 0 || s.lastGap >= s.lastWrite || s.batches(d) {
		return 0
	}
	return min(s.lastGap/int64(s.lastCount), 2*d)
}

// batches reports whether frames coming count in gap nanoseconds would
// gather at least holdMinNum/holdMinDen in a wait of d nanoseconds. A gap
// of zero or less (a clock stepped backwards) counts as batching;
// session.batches never asks with a count of zero.
func batches(count int, gap, d int64) bool {
	return gap <= 0 || holdMinDen*int64(count)*d >= holdMinNum*gap
}

// writeTurn is a pool worker's turn at s (see writerPool): unless the
// pacer holds it (or due says it was held already), it writes what s has
// queued without waiting; then it holds s if the pacer would, else puts it
// back in line if more came meanwhile, else lets it go.
// Whatever would wait (a full socket, a ping, the close) goes on to a
// writer goroutine of the session's own. It returns the array the worker
// may reuse for its next session's queue.
func (s *session) writeTurn(spare []outItem, due bool) []outItem {
	pool := s.srv.pool
	if !due && !s.closing.Load() {
		if left := s.holdFor(); left > 0 {
			pool.hold(s, left)
			return spare
		}
	}
	items, ping, reason, done := s.q.next(spare)
	if done {
		s.writers.Done()
		return nil // s may have kept spare as its queue array
	}
	// busy: the reader is writing a control frame, which may be waiting
	// for room in the socket while it holds coder/websocket's frame lock.
	if ping || reason != reasonNone || s.netConn.busy() {
		go s.ownWriter(&writeRound{items: items, ping: ping, reason: reason})
		return nil
	}
	blocked, rest, err := s.writeBatch(context.Background(), items, false)
	switch {
	case err != nil:
		s.writeFailed(err)
		pool.add(s) // its next turn hands the close to ownWriter
		return nil
	case blocked:
		s.srv.metrics.writesBlocked.Inc()
		go func() {
			// The rest belongs to the batch just written: pacing goes by
			// that batch's gap and count, not by the time the flush took.
			gap, count := s.lastGap, s.lastCount
			if err := s.netConn.flush(); err != nil {
				s.writeFailed(err)
				s.srv.metrics.drops[dropSessionClosed].Add(float64(len(s.pending) + len(rest)))
			} else {
				s.srv.metrics.countFramesOut(s.pending)
				s.observeDelivery(s.pendingAt)
				if _, _, err := s.writeBatch(context.Background(), rest, true); err != nil {
					s.writeFailed(err)
				}
			}
			s.pendingAt, s.pending = 0, nil
			s.lastGap, s.lastCount = gap, count
			s.ownWriter(nil)
		}()
		return nil
	}
	spare = items // the array given to next now belongs to s
	if left := s.holdFor(); left > 0 && !s.closing.Load() {
		// Paced: hold it now, as writeLoop waits, rather than let it go
		// and come back with every frame: the session keeps its queue
		// array instead of growing a new one each round.
		pool.hold(s, left)
	} else {
		var stopped bool
		if stopped, spare = s.q.release(items); stopped {
			s.writers.Done()
		} else {
			pool.add(s)
		}
	}
	if cap(spare) > 1024 {
		return nil // a burst has passed; let its memory go
	}
	return spare
}

// ownWriter is the session's writer goroutine from first on, until its
// queue is empty (spawnWriter starts it without first).
func (s *session) ownWriter(first *writeRound) {
	defer s.writers.Done()
	s.writeLoop(s.ctx, first)
}

// cut ends the connection at once, without a close handshake, also one
// whose handshake is under way: coder/websocket's CloseNow then only waits
// for that Close (up to 5 s for a peer that never answers), so the socket
// itself is closed too, which fails the handshake's reads and writes.
func (s *session) cut() {
	if s.netConn != nil {
		_ = s.netConn.Close()
	}
	_ = s.conn.CloseNow()
}

// finish ends the connection for reason: on shutdown and drain it first
// delivers what is already queued (acks included).
func (s *session) finish(ctx context.Context, r closeReason, items []outItem) {
	s.srv.presence.release(s) // not after the handshake: a vanished peer makes it wait
	if s.writeBroken || !r.flushes() {
		s.srv.metrics.drops[dropSessionClosed].Add(float64(len(items))) // discarded unwritten
	}
	if s.writeBroken {
		// The stream may end inside a frame: a session already closing
		// for another reason must not write its queue or a close frame
		// after it.
		_ = s.conn.CloseNow()
		return
	}
	if r.flushes() {
		if _, _, err := s.writeBatch(context.Background(), items, true); err != nil {
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

// pingStopDelay is how long after a close that sends a close frame the
// writer's wait for a pong is ended (see session.ping).
const pingStopDelay = time.Second

// ping waits up to PongTimeout for a pong. A late pong is forgiven when
// messages kept arriving meanwhile: a client busy publishing can have its
// pong stuck behind its own backpressured writes.
//
// A session that closes meanwhile (a cut the reader saw, Shutdown, a
// drain slot) ends the wait: closeWith cancels the ping's ctx
// (q.pingStop), so the writer goes on to the close rather than after
// PongTimeout, and run, its unsubscribes and Shutdown do not wait for a
// pong that a cut peer will never send. Ping then fails with
// context.Canceled (see pingFailed). A cancel that lands while the ping
// frame itself is being written (up to the library's last step of the
// write) makes coder/websocket close the connection (its write-timeout
// hook), so no close frame can follow. For a close without a close frame
// (the peer cut the connection, or closed it) that is no loss, and the
// cancel is made at once; for one with a close frame it is made
// pingStopDelay later, when the write is long over (a live peer has
// answered by then, and the writer gone on to the close). The cancel
// is made once per ping, that is at most once per PingInterval of the
// peer's silence; nothing is added per frame.
func (s *session) ping(ctx context.Context) error {
	start := s.srv.cfg.Now().UnixNano()
	ctx, cancel := context.WithTimeout(ctx, s.srv.cfg.PongTimeout)
	defer cancel()
	s.q.mu.Lock()
	if s.q.reason != reasonNone {
		s.q.mu.Unlock()
		return nil // closing: the next round sends the close, no ping
	}
	s.q.pingStop = cancel
	s.q.mu.Unlock()
	err := s.conn.Ping(ctx)
	s.q.mu.Lock()
	s.q.pingStop = nil
	s.q.mu.Unlock()
	if err != nil && s.lastRead.Load() > start && ctx.Err() != nil {
		return nil
	}
	return err
}

// writeBatch writes items as few WebSocket messages as MaxBatchBytes allows,
// frames separated by '\n'. With wait false (the connection must be
// nonBlocking) it stops when the socket is full: blocked is true, the
// message in flight is pending in netConn (see corkConn.uncork) and its
// frames in s.pending, and rest are the items not yet written.
//
// A frame counts in frames_out once its message is in the socket: the
// frames of a message whose write fails are drops, as are those after it
// (nothing is written after a failed write), and those of a pending
// message count when its flush ends (writeTurn).
func (s *session) writeBatch(ctx context.Context, items []outItem, wait bool) (blocked bool, rest []outItem, err error) {
	if len(items) == 0 {
		return false, nil, nil
	}
	// Write deadlines are kept by corkConn on the raw connection (a
	// cancellable ctx would cost coder/websocket a callback registration per
	// message).
	now := s.srv.cfg.Now()
	s.lastGap, s.lastWrite, s.lastCount = now.UnixNano()-s.lastWrite, now.UnixNano(), len(items)
	m := s.srv.metrics
	bp := writeBufPool.Get().(*[]byte)
	defer writeBufPool.Put(bp)
	buf := (*bp)[:0]
	var counts [numFrameTypes]int
	var last []outItem // the frames of the message that failed or was left pending
	defer func() {
		if err != nil || blocked {
			// last is not in the socket (yet): its frames are not out.
			for i := range last {
				counts[last[i].kind]--
			}
			if err != nil {
				m.drops[dropSessionClosed].Add(float64(len(last) + len(rest)))
			} else {
				s.pending = last
			}
		}
		for k, n := range counts {
			if n > 0 {
				m.framesOut[k].Add(float64(n))
			}
		}
	}()
	start := 0
	for i := range items {
		it := &items[i]
		if len(buf) > 0 && len(buf)+1+it.size() > s.srv.cfg.MaxBatchBytes {
			blocked, err = s.writeMessage(ctx, buf, items[start:i], wait)
			if err != nil || blocked {
				last = items[start:i]
				return blocked, items[i:], err
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
	last = items[start:]
	blocked, err = s.writeMessage(ctx, buf, last, wait)
	if cap(buf) <= 2*s.srv.cfg.MaxBatchBytes {
		*bp = buf[:0] // a buffer grown by one huge frame is left to the GC
	} else {
		*bp = make([]byte, 0, 16<<10)
	}
	return blocked, nil, err
}

// writeMessage writes msg, the frames of items, as one WebSocket message
// (see writeBatch for wait and blocked). A message left pending counts as
// written in the messages and bytes out (the rest of it goes before
// anything else, or the session ends), but not in the delivery latency,
// which is observed when the flush ends (see pendingAt), nor are its
// frames counted out until then (see writeBatch).
func (s *session) writeMessage(ctx context.Context, msg []byte, items []outItem, wait bool) (blocked bool, err error) {
	s.netConn.cork()
	err = s.conn.Write(ctx, websocket.MessageText, msg)
	blocked, uerr := s.netConn.uncork(wait)
	if err == nil {
		err = uerr
	}
	if err != nil {
		return false, err
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
	if blocked {
		s.pendingAt = oldest
	} else {
		s.observeDelivery(oldest)
	}
	return blocked, nil
}

// observeDelivery records the delivery latency of a message whose oldest
// patch was published at (Unix nanoseconds), if it carried one (at != 0).
func (s *session) observeDelivery(at int64) {
	if at != 0 {
		s.srv.metrics.deliveryLatency.Observe(float64(s.srv.cfg.Now().UnixNano()-at) / 1e9)
	}
}
