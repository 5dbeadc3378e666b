package gateway

import (
	"container/heap"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// writerPool writes for the sessions whose connection can be written
// without waiting (TCP or Unix sockets on Linux, macOS and OpenBSD; see
// corkConn.nonBlocking): a few worker goroutines, one
// per core by default, take sessions with frames to send in the order they
// became ready, write each one's queue (in as few messages as
// MaxBatchBytes allows), and put it back in line if more came meanwhile.
//
// A goroutine per busy session (the other way, writeLoop) costs a
// goroutine start and a scheduler hand-off per idle-to-busy session, and a
// publish to 5,000 sessions makes 5,000 goroutines runnable at once: they
// overflow the Ps' run queues into the global one, where the reader of the
// next inbound publish waits behind them. The pool keeps the ready
// sessions as data, so the runtime sees a few workers and the readers.
//
// Pacing works as in writeLoop: a session the pacer holds is parked in a
// heap by the time it may write again, and workers take due sessions
// before ready ones. A write that would block (the peer reads slower than
// we write) is finished by a goroutine of the session's own (writeLoop),
// so one slow peer never stalls a worker; so are pings (which wait for the
// pong), the close, and a turn that finds the reader writing a control
// frame (corkConn.busy). Should a turn still wait (see stuckTurn), watch
// starts another worker in its place.
type writerPool struct {
	epoch    time.Time     // due times are monotonic nanoseconds since epoch
	stop     chan struct{} // closed by close: idle workers exit
	stopOnce sync.Once
	wg       sync.WaitGroup
	stalled  func() // called when a turn outlives stuckTurn; may be nil
	yield    func() // runtime.Gosched; tests replace it before the first session

	readyLate int64 // static: nanoseconds in the line after which a ready session's wait counts as long (see waits); 0: never counted
	holdBound int64 // static: the longest hold pacing may use; a ready session it would not batch is late only after its own frame gap (see waits)

	mu     sync.Mutex
	late   uint64         // guarded by mu: sessions taken late (see waits)
	taken  uint64         // guarded by mu: sessions taken
	ready  []readySession // guarded by mu: ready[head:] in arrival order
	head   int            // guarded by mu
	held   heldHeap       // guarded by mu: paced sessions by due time
	idle   []*poolWorker  // guarded by mu
	all    []*poolWorker  // guarded by mu: every running worker, for watch
	stalls int            // guarded by mu: workers watch replaced
	size   int            // static: the workers asked for; watch keeps at most twice as many
}

// stuckTurn is how long a worker's turn may last before the pool starts
// another worker in its place. A turn never waits on a socket, but it
// takes coder/websocket's write locks, which the reader holds while it
// writes a pong or a close echo; if that write waits on a full socket
// (a pong started between the turn's busy check and its write), so does
// the turn, up to WriteTimeout. The stuck worker retires when its turn
// ends, so the pool is back to its size.
const stuckTurn = 100 * time.Millisecond

// sliceLength is how long a worker takes turns without a break before it
// yields its core. The Go scheduler preempts a goroutine only after about
// 10 ms, so under a backlog a worker that never waits would keep a
// goroutine the network poller readied (the reader of the next publish, a
// reader with a pong to answer) waiting for a core that long. Yielding
// every half millisecond costs a scheduler pass per fifty or so turns; at
// 5,000 subscribers × 100 msg/s it cut the p99 by about a fifth
// (docs/benchmarks.md, "Workers yield").
const sliceLength = 500 * time.Microsecond

// poolWorker is one worker's wake-up line: whoever takes an idle worker
// off the pool's idle list sends on wake.
type poolWorker struct {
	wake      chan struct{}
	turnStart atomic.Int64 // nanoseconds since the pool's epoch when the current turn began, plus one; 0 between turns
	replaced  atomic.Bool  // set (under the pool's mu) when watch started another in its place
	idle      bool         // guarded by the pool's mu: on the idle list

	// Owned by the worker's goroutine (next and work).
	parked bool        // it waited for work since its slice began
	slice  workerSlice // its current stretch of turns without a wait
}

// workerSlice is a worker's stretch of turns without a wait for work;
// times are nanoseconds since the pool's epoch.
type workerSlice struct{ start int64 }

// begin starts a stretch at now: the worker starts, or has waited.
func (s *workerSlice) begin(now int64) { s.start = now }

// turnEnded reports whether a turn ending at now completes a slice, after
// which the worker yields; if so the next stretch starts at now.
func (s *workerSlice) turnEnded(now int64) bool {
	if now-s.start < int64(sliceLength) {
		return false
	}
	s.start = now
	return true
}

// newWriterPool starts workers writers. A ready session that waits in
// the line readyLate or longer counts as a long wait, one that a hold of
// holdBound would not batch only once it has also waited longer than its
// frames come apart (see waits); readyLate zero counts only held
// sessions.
func newWriterPool(workers int, readyLate, holdBound time.Duration, stalled func()) *writerPool {
	p := &writerPool{epoch: time.Now(), stop: make(chan struct{}), stalled: stalled, yield: runtime.Gosched, size: workers,
		readyLate: int64(readyLate), holdBound: int64(holdBound)}
	p.mu.Lock()
	for range workers {
		p.startLocked()
	}
	p.mu.Unlock()
	p.wg.Go(p.watch)
	return p
}

func (p *writerPool) startLocked() {
	w := &poolWorker{wake: make(chan struct{}, 1)}
	p.all = append(p.all, w)
	p.wg.Go(func() { p.work(w) })
}

// watch starts a worker in place of each one whose turn has lasted longer
// than stuckTurn, until the pool is closed, keeping at most twice the
// pool's size. (A turn's time also counts waits for a core: on a starved
// node a worker may be replaced that was only slow.)
func (p *writerPool) watch() {
	t := time.NewTicker(stuckTurn / 2)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		now := int64(time.Since(p.epoch))
		p.mu.Lock()
		for _, w := range p.all {
			if len(p.all) >= 2*p.size {
				break
			}
			if start := w.turnStart.Load(); start != 0 && !w.replaced.Load() && now-(start-1) > int64(stuckTurn) {
				w.replaced.Store(true)
				p.stalls++
				p.startLocked()
				if p.stalled != nil {
					p.stalled()
				}
			}
		}
		p.mu.Unlock()
	}
}

// retire reports whether w was replaced while its turn was stuck, and if
// so takes it off the pool: it must exit.
func (p *writerPool) retire(w *poolWorker) bool {
	if !w.replaced.Load() {
		return false // the common case, without the pool's lock
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.all = slices.DeleteFunc(p.all, func(x *poolWorker) bool { return x == w })
	return true
}

// close stops the workers once they are idle. The server calls it after
// every session has ended, so nothing is left in line. It may be called
// more than once.
func (p *writerPool) close() {
	p.stopOnce.Do(func() { close(p.stop) })
	p.wg.Wait()
}

// add puts s at the end of the line. s must have its writer claimed
// (claimWriterLocked): the pool is its writer now.
func (p *writerPool) add(s *session) {
	since := int64(time.Since(p.epoch))
	p.mu.Lock()
	p.ready = append(p.ready, readySession{s: s, since: since})
	w := p.takeIdleLocked()
	p.mu.Unlock()
	if w != nil {
		w.signal()
	}
}

// hold parks s for d. The pool keeps time on the monotonic clock, not
// Config.Now: a held session must come back after d whatever the wall
// clock (or a test's) says. A session whose hold would already be over
// (it is closing, or its queue filled an eighth since holdFor looked)
// goes in line instead.
func (p *writerPool) hold(s *session, d time.Duration) {
	// Marked held before it is in the heap: a push that ends the hold
	// early (sendQueue.push) in between puts s in line, and this entry is
	// stale from the start.
	gen, ok := s.q.holdPool(s.srv.cfg.SendQueueMessages, s.srv.cfg.SendQueueBytes)
	if !ok {
		p.add(s)
		return
	}
	due := int64(time.Since(p.epoch) + d)
	p.mu.Lock()
	// Idle workers sleep until the earliest due time there was when they
	// went idle (or until woken, if none was held): wake one only if this
	// is earlier. Waking one per hold would cost a wake-up per paced write.
	var w *poolWorker
	if len(p.held) == 0 || due < p.held[0].due {
		w = p.takeIdleLocked()
	}
	heap.Push(&p.held, heldSession{due: due, s: s, gen: gen})
	p.mu.Unlock()
	if w != nil {
		w.signal()
	}
}

func (p *writerPool) takeIdleLocked() *poolWorker {
	n := len(p.idle)
	if n == 0 {
		return nil
	}
	w := p.idle[n-1]
	p.idle[n-1] = nil
	p.idle = p.idle[:n-1]
	w.idle = false
	return w
}

func (w *poolWorker) signal() {
	select {
	case w.wake <- struct{}{}:
	default: // already signalled
	}
}

// poolLateWait is how late a held session must be taken to count as a long
// wait. It is longer than the scheduler's longWait because the pool counts
// every turn (the runtime samples about one wait in eight, so the pool's
// turns dominate the share), and sessions written together come due
// together and queue for the workers for a few milliseconds at ordinary
// load: at 1 ms the topics benchmark (50,000 publishes a second to 1,000
// sessions, a node at about 0.75 cores) counted 36 overloaded ticks in a
// run, at 5 ms none, while 5,000 × 100 still counted 113 and 127
// (docs/benchmarks.md, "Shared writers"; measured when only held
// sessions were counted, at a 50 ms MaxWriteDelay).
const poolLateWait = 5 * time.Millisecond

// waits counts the sessions taken since the pool started (total) and those
// taken late (long): the pool's counterpart of the runtime's scheduling
// waits, which the pacer's overload test reads (see pacer).
//
// A held session is late when taken poolLateWait or more after it was
// due: held sessions are taken before ready ones, so one taken late means
// the workers (or the cores under them) are saturated.
//
// A ready session is late when it waited in the line readyLate or longer,
// which the server sets to MaxWriteDelay plus poolLateWait: longer than
// pacing holds a session outside an overload. A shorter wait is not
// counted as long, since a publish to thousands of sessions makes the
// last of them wait some milliseconds whatever the load. Ready waits must
// count: pacing holds only sessions a hold would batch (session.holdFor),
// whose writes come close together; when the workers fall behind, a
// session's writes drift apart, so it stops being held and its lateness
// would go unseen. A session never held (one getting a frame about every
// delay) counts as late from readyLate too. On the benchmark machine,
// with a 20 ms MaxWriteDelay and only held sessions counted, 5,000
// subscribers × 100 msg/s counted no overloaded tick in a traced run, and
// three runs gave a p99 of 160-248 ms against 102-146 for a 50 ms bound
// (docs/benchmarks.md, "A shorter pacing delay").
//
// A ready session that a hold of holdBound (the overload bound) would not
// batch (session.batches) is late only once it has also waited as long as
// its frames come apart (at its last batch's rate, and at most twice
// holdBound: see session.frameGap). Pacing gains nothing on such a
// session (a subscriber getting ten frames a second), so a wait shorter
// than its own frame gap costs it nothing and says nothing about whether
// the delay should grow: counted from readyLate, 5,000 subscribers × 10
// msg/s, where each publish leaves the last sessions about 60 ms in the
// line, was judged overloaded in 42-192 of its 200 ticks (three runs),
// and meanwhile every other session on the node could be held up to the
// overload bound (docs/benchmarks.md, "Lateness by a session's own frame
// rate"). A longer wait still counts: many such sessions whose writers
// fall behind them are an overload the scheduler cannot see, since
// sessions waiting in the line are not goroutines.
func (p *writerPool) waits() (long, total uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.late, p.taken
}

// next returns the session to write for next: the earliest held one that
// is due (due true), else the first ready one, else it waits. It returns
// nil once the pool is closed and idle.
func (p *writerPool) next(w *poolWorker, t *time.Timer) (s *session, due bool) {
	for {
		p.mu.Lock()
		n := int64(time.Since(p.epoch))
		if len(p.held) > 0 && p.held[0].due <= n {
			h := heap.Pop(&p.held).(heldSession)
			p.taken++
			if n-h.due >= int64(poolLateWait) {
				p.late++
			}
			p.mu.Unlock()
			if !h.s.q.takeHold(h.gen) {
				continue // ended early by a push, which put s in line
			}
			return h.s, true
		}
		if p.head < len(p.ready) {
			r := p.ready[p.head]
			p.ready[p.head] = readySession{}
			p.head++
			if p.readyLate > 0 {
				p.taken++
				if n-r.since >= max(p.readyLate, r.s.frameGap(p.holdBound)) {
					p.late++
				}
			}
			switch {
			case p.head == len(p.ready):
				p.ready, p.head = p.ready[:0], 0
			case p.head >= 1024 && 2*p.head >= len(p.ready):
				k := copy(p.ready, p.ready[p.head:])
				clear(p.ready[k:])
				p.ready, p.head = p.ready[:k], 0
			}
			p.mu.Unlock()
			return r.s, false
		}
		if cap(p.ready) > 4096 {
			p.ready = nil // a burst has passed
		}
		if len(p.held) == 0 && cap(p.held) > 4096 {
			p.held = nil
		}
		var due <-chan time.Time
		if len(p.held) > 0 {
			t.Reset(time.Duration(p.held[0].due - n))
			due = t.C
		}
		// A signal left from an earlier wake-up (sent by someone who took
		// this worker off the list while its timer fired) is stale now.
		select {
		case <-w.wake:
		default:
		}
		p.idle = append(p.idle, w)
		w.idle = true
		p.mu.Unlock()
		w.parked = true
		select {
		case <-w.wake:
		case <-due:
		case <-p.stop:
			return nil, false
		}
		if due != nil {
			t.Stop()
		}
		p.mu.Lock()
		if w.idle { // woken by the timer: still listed
			i := slices.Index(p.idle, w)
			p.idle = slices.Delete(p.idle, i, i+1)
			w.idle = false
		}
		p.mu.Unlock()
	}
}

func (p *writerPool) work(w *poolWorker) {
	t := time.NewTimer(time.Hour)
	t.Stop()
	var batch []outItem
	w.slice.begin(int64(time.Since(p.epoch)))
	for {
		s, due := p.next(w, t)
		if s == nil {
			return
		}
		start := int64(time.Since(p.epoch))
		if w.parked {
			w.parked = false
			w.slice.begin(start)
		}
		w.turnStart.Store(start + 1)
		batch = s.writeTurn(batch, due)
		w.turnStart.Store(0)
		// Before retiring: a retiring worker yields once more, harmlessly.
		if w.slice.turnEnded(int64(time.Since(p.epoch))) {
			p.yield()
		}
		if p.retire(w) {
			return
		}
	}
}

// readySession is a session in the line, since when it joined it
// (nanoseconds since the pool's epoch).
type readySession struct {
	s     *session
	since int64
}

// heldSession is a session the pacer holds until due.
type heldSession struct {
	due int64 // nanoseconds since the pool's epoch
	s   *session
	gen uint32 // the hold's generation (sendQueue.holdPool)
}

// heldHeap is a min-heap of held sessions by due time.
type heldHeap []heldSession

func (h heldHeap) Len() int           { return len(h) }
func (h heldHeap) Less(i, j int) bool { return h[i].due < h[j].due }
func (h heldHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *heldHeap) Push(x any)        { *h = append(*h, x.(heldSession)) }
func (h *heldHeap) Pop() any {
	old := *h
	n := len(old) - 1
	x := old[n]
	old[n] = heldSession{}
	*h = old[:n]
	return x
}
