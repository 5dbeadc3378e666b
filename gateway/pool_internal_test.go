package gateway

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/syncgate/syncgate/internal/gwtest"
)

// onePoolWorker is a server whose writer pool has one worker; the caller
// shuts it down.
func onePoolWorker(t *testing.T) *Server {
	t.Helper()
	srv, err := New(Config{Writers: 1})
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

// pooledSession is a session of srv over a real socket pair, written by
// the pool, and the client's end; the test is skipped on systems without
// shared writers.
func pooledSession(t *testing.T, srv *Server, id string) (*session, *websocket.Conn) {
	t.Helper()
	sc, raw, cc := connPair(t)
	s := newSession(context.Background(), srv, sc, raw, id, "test")
	if !s.pooled {
		t.Skip("no shared writers on this system")
	}
	return s, cc
}

// TestWriterPool_HoldsUntilDue: a session the pool holds is written once
// its time is due, not before; the turn is counted for the pacer, and the
// session's writer is released after it.
func TestWriterPool_HoldsUntilDue(t *testing.T) {
	srv := onePoolWorker(t)
	defer srv.Shutdown(context.Background())
	s, cc := pooledSession(t, srv, "id")
	if r := s.q.push(outItem{body: []byte(`{"held":true}`), kind: idxPatch}, 100, 1<<20); r != pushedStart {
		t.Fatalf("push = %d, want pushedStart", r)
	}
	const hold = 30 * time.Millisecond
	start := time.Now()
	srv.pool.hold(s, hold)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, msg, err := cc.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited < hold {
		t.Fatalf("written after %v, before the %v hold was due", waited, hold)
	}
	if string(msg) != `{"held":true}` {
		t.Fatalf("got %q", msg)
	}
	released := make(chan struct{})
	go func() { s.writers.Wait(); close(released) }()
	select {
	case <-released:
	case <-ctx.Done():
		t.Fatal("the session's writer was never released")
	}
	if _, total := srv.pool.waits(); total != 1 {
		t.Fatalf("pool counted %d held turns, want 1", total)
	}
}

// TestWriterPool_ReplacesAStuckWorker: a turn that cannot go on (here the
// connection's lock is held by the test, as a reader writing a pong to a
// full socket would hold coder/websocket's) makes the pool start another
// worker, so other sessions are still written; when the stuck turn ends
// its worker retires and the pool is back to its size.
func TestWriterPool_ReplacesAStuckWorker(t *testing.T) {
	srv := onePoolWorker(t)
	defer srv.Shutdown(context.Background())
	stuck, stuckCC := pooledSession(t, srv, "stuck")
	other, otherCC := pooledSession(t, srv, "other")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	stuck.netConn.mu.Lock() // the only worker's turn at stuck waits for this
	locked := true
	defer func() {
		if locked {
			stuck.netConn.mu.Unlock()
		}
	}()
	stuck.enqueue(outItem{body: []byte(`{"s":1}`), kind: idxPatch})
	// The turn has no event to wait on: poll with a deadline.
	gwtest.Eventually(t, 5*time.Second, "the worker takes the stuck session", func() bool { return stuckTurnStarted(srv.pool) })
	other.enqueue(outItem{body: []byte(`{"o":1}`), kind: idxPatch})
	if _, msg, err := otherCC.Read(ctx); err != nil || string(msg) != `{"o":1}` {
		t.Fatalf("other session while a worker is stuck: %q, %v", msg, err)
	}

	stuck.netConn.mu.Unlock()
	locked = false
	if _, msg, err := stuckCC.Read(ctx); err != nil || string(msg) != `{"s":1}` {
		t.Fatalf("stuck session after its lock was released: %q, %v", msg, err)
	}
	workers := func() (n, stalls int) {
		srv.pool.mu.Lock()
		defer srv.pool.mu.Unlock()
		return len(srv.pool.all), srv.pool.stalls
	}
	gwtest.Eventually(t, 5*time.Second, "the stuck worker retires", func() bool { n, _ := workers(); return n == 1 })
	// At least the stuck turn (on a very slow machine the replacement's
	// own turn could outlast stuckTurn too).
	if _, stalls := workers(); stalls < 1 {
		t.Fatalf("%d stalls counted, want at least 1", stalls)
	}
}

// stuckTurnStarted reports whether some worker of p is in a turn.
func stuckTurnStarted(p *writerPool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, w := range p.all {
		if w.turnStart.Load() != 0 {
			return true
		}
	}
	return false
}

// TestWriterPool_YieldsAfterASlice: a worker whose turns have run for
// sliceLength without a wait yields its core. The turn is made long by
// holding the connection's lock (as in the test above) until the turn has
// lasted a slice.
func TestWriterPool_YieldsAfterASlice(t *testing.T) {
	srv := onePoolWorker(t)
	defer srv.Shutdown(context.Background())
	yielded := make(chan struct{}, 1)
	srv.pool.yield = func() { // before any session: the worker reads it after a turn
		select {
		case yielded <- struct{}{}:
		default:
		}
	}
	s, cc := pooledSession(t, srv, "id")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s.netConn.mu.Lock()
	locked := true
	defer func() {
		if locked {
			s.netConn.mu.Unlock()
		}
	}()
	s.enqueue(outItem{body: []byte(`{"long":true}`), kind: idxPatch})
	// The turn has no event to wait on: poll with a deadline.
	gwtest.Eventually(t, 5*time.Second, "the worker's turn lasts a slice", func() bool {
		srv.pool.mu.Lock()
		defer srv.pool.mu.Unlock()
		start := srv.pool.all[0].turnStart.Load()
		return start != 0 && time.Since(srv.pool.epoch)-time.Duration(start-1) >= sliceLength
	})
	s.netConn.mu.Unlock()
	locked = false
	if _, msg, err := cc.Read(ctx); err != nil || string(msg) != `{"long":true}` {
		t.Fatalf("after the long turn: %q, %v", msg, err)
	}
	select {
	case <-yielded:
	case <-ctx.Done():
		t.Fatal("the worker did not yield after a turn longer than a slice")
	}
}

// TestWorkerSlice: a stretch of turns ends a slice once it has lasted
// sliceLength, and the next one starts there; a wait for work starts one
// afresh, so quick turns after a rest do not yield.
func TestWorkerSlice(t *testing.T) {
	const l = int64(sliceLength)
	var s workerSlice
	s.begin(0)
	for _, tt := range []struct {
		begin int64 // if >= 0, the worker waited and begins again here
		end   int64 // the turn's end
		want  bool
	}{
		{-1, l / 2, false},
		{-1, l - 1, false},
		{-1, l, true},             // a whole slice: yield, the next begins at l
		{-1, l + l/2, false},      // half of the next
		{-1, 2*l + 1, true},       // its end
		{10 * l, 10*l + 1, false}, // after a wait: quick turns go on
		{-1, 10*l + l/2, false},
		{-1, 11 * l, true},
	} {
		if tt.begin >= 0 {
			s.begin(tt.begin)
		}
		if got := s.turnEnded(tt.end); got != tt.want {
			t.Fatalf("turn ending at %d (slice began %d): yield %v, want %v", tt.end, s.start, got, tt.want)
		}
	}
}

// TestWriterPool_CountsLateReadyTurns: a ready session taken after waiting
// readyLate or longer in the line counts as a long wait for the pacer, one
// taken sooner only in the total, and with readyLate zero ready turns are
// not counted at all. A session that a hold of the pool's bound would not
// batch (its frames come further apart) is late only once it has also
// waited longer than its frames come apart. (The line's clock is moved
// back rather than slept on: the pool keeps time since its epoch.)
func TestWriterPool_CountsLateReadyTurns(t *testing.T) {
	const (
		bound     = 75 * time.Millisecond
		readyLate = 25 * time.Millisecond
	)
	now := time.Now().UnixNano()
	last := func(count int, gap time.Duration) func(*session) {
		return func(s *session) { s.lastCount, s.lastGap, s.lastWrite = count, int64(gap), now }
	}
	fast := last(2, 20*time.Millisecond)
	for _, tc := range []struct {
		name        string
		readyLate   time.Duration
		last        func(*session)
		waited      time.Duration
		long, total uint64
	}{
		{"late", readyLate, fast, time.Second, 1, 1},
		{"on time", time.Hour, fast, time.Second, 0, 1},
		{"not counted", 0, fast, time.Second, 0, 0},
		{"fast, just late", readyLate, fast, readyLate, 1, 1},
		{"never written", readyLate, func(*session) {}, 30 * time.Millisecond, 1, 1},
		// 1.5 frames per bound is the least that batches (see batches).
		{"just batches", readyLate, last(1, bound*2/3), 30 * time.Millisecond, 1, 1},
		{"just does not batch", readyLate, last(1, bound*2/3+1), 30 * time.Millisecond, 0, 1},
		// Ten frames a second: a wait behind a big publish within its
		// frame gap is not late, one beyond it is.
		{"slow, within its gap", readyLate, last(1, 100*time.Millisecond), 60 * time.Millisecond, 0, 1},
		{"slow, behind its gap", readyLate, last(1, 100*time.Millisecond), 150 * time.Millisecond, 1, 1},
		{"slow batch, behind its frame gap", readyLate, last(3, 300*time.Millisecond), 150 * time.Millisecond, 1, 1},
		// The gap counts up to twice the bound: frames seconds apart, or
		// a session idle for hours, are late after 150 ms.
		{"very slow, within twice the bound", readyLate, last(1, 10*time.Second), 140 * time.Millisecond, 0, 1},
		{"very slow, past twice the bound", readyLate, last(1, 10*time.Second), 160 * time.Millisecond, 1, 1},
		// Written once: its gap runs from the zero time, so it is judged
		// as a session that has not written.
		{"written once", readyLate, func(s *session) { s.lastCount, s.lastGap, s.lastWrite = 1, now, now }, 30 * time.Millisecond, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newWriterPool(0, tc.readyLate, bound, nil) // no workers: the test takes the turn
			defer p.close()
			s := &session{}
			tc.last(s)
			p.add(s)
			p.mu.Lock()
			p.ready[p.head].since -= int64(tc.waited) // it joined the line that long ago
			p.mu.Unlock()
			got, due := p.next(&poolWorker{wake: make(chan struct{}, 1)}, time.NewTimer(time.Hour))
			if got != s || due {
				t.Fatalf("next = %p, due %v; want the ready session %p, not due", got, due, s)
			}
			if long, total := p.waits(); long != tc.long || total != tc.total {
				t.Fatalf("waits = %d long of %d, want %d of %d", long, total, tc.long, tc.total)
			}
		})
	}
}

// TestWriterPool_ReadyLateFollowsTheDelay: the server counts a ready turn
// as late after MaxWriteDelay + poolLateWait, and not at all with pacing
// off (no pacer reads the waits then); it counts only sessions a hold of
// the overload bound (at least MaxWriteDelay) would batch.
func TestWriterPool_ReadyLateFollowsTheDelay(t *testing.T) {
	for _, tc := range []struct {
		delay, over, want, bound time.Duration
	}{
		{0, 0, 20*time.Millisecond + poolLateWait, 75 * time.Millisecond}, // the defaults
		{40 * time.Millisecond, 0, 40*time.Millisecond + poolLateWait, 75 * time.Millisecond},
		{100 * time.Millisecond, 0, 100*time.Millisecond + poolLateWait, 100 * time.Millisecond},
		{0, 200 * time.Millisecond, 20*time.Millisecond + poolLateWait, 200 * time.Millisecond},
		{-1, 0, 0, 0}, // pacing off
	} {
		srv, err := New(Config{Writers: 1, MaxWriteDelay: tc.delay, OverloadWriteDelay: tc.over})
		if err != nil {
			t.Fatal(err)
		}
		late, bound := time.Duration(srv.pool.readyLate), time.Duration(srv.pool.holdBound)
		srv.Shutdown(context.Background())
		if late != tc.want || (tc.want > 0 && bound != tc.bound) {
			t.Errorf("MaxWriteDelay %v, OverloadWriteDelay %v: readyLate %v, holdBound %v; want %v, %v", tc.delay, tc.over, late, bound, tc.want, tc.bound)
		}
	}
}

// holdServer is a server whose pacer counts the node busy on every tick
// (CPUTime runs a hundred times faster than the wall clock) and reads its
// scheduling waits from sched, with a clock fixed at now; the caller shuts
// it down. It waits until the pacing delay has settled at want, where a
// busy node keeps it.
func holdServer(t *testing.T, now time.Time, sched func() (long, total uint64), want time.Duration) *Server {
	t.Helper()
	start := time.Now()
	srv, err := New(Config{
		Writers: 1, SendQueueMessages: 64,
		MaxWriteDelay: 20 * time.Millisecond, OverloadWriteDelay: 75 * time.Millisecond,
		CPUTime:    func() time.Duration { return 100 * time.Since(start) },
		SchedWaits: sched,
		Now:        func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for srv.pacer.delay() != want {
		if time.Now().After(deadline) {
			srv.Shutdown(context.Background())
			t.Fatalf("pacing delay %v, want it to settle at %v", srv.pacer.delay(), want)
		}
		time.Sleep(5 * time.Millisecond) // polling the pacer's state, with a deadline
	}
	return srv
}

// releaseWriter hands s, with its writer claimed, to the pool, which
// writes its queue (after a hold, if the pacer would hold it) and releases
// the writer.
func releaseWriter(t *testing.T, srv *Server, s *session) {
	t.Helper()
	srv.pool.add(s)
	released := make(chan struct{})
	go func() { s.writers.Wait(); close(released) }()
	select {
	case <-released:
	case <-time.After(10 * time.Second):
		t.Fatal("the session's writer was never released")
	}
}

// TestSession_HoldsOnlyWhatBatches: pacing holds a session only when a
// delay's wait would gather at least one and a half of its frames at the
// rate its last batch came, its last two writes were within twice the
// delay, and its queue is not pressed; the hold ends one delay after its
// last write, or sooner when a full batch (holdFull frames) would have
// come by then at that rate, or, for a session that would gather fewer
// than holdFew frames, a quarter gap after its next frame would have.
func TestSession_HoldsOnlyWhatBatches(t *testing.T) {
	now := time.Unix(1000, 0)
	const d = 20 * time.Millisecond
	srv := holdServer(t, now, func() (uint64, uint64) { return 0, 0 }, d)
	defer srv.Shutdown(context.Background())
	s, _ := pooledSession(t, srv, "id")
	ms := func(n float64) int64 { return int64(n * float64(time.Millisecond)) }
	for _, tc := range []struct {
		name  string
		count int
		gap   int64
		ago   int64 // the last write, before now
		want  time.Duration
	}{
		{"never written", 0, 0, 0, 0},
		{"a frame a delay apart", 1, ms(20), ms(5), 0},
		{"a frame 14 ms apart: 1.43 a delay", 1, ms(14), ms(5), 0},
		{"a frame 13 ms apart: 1.54 a delay, held 1.25 gaps", 1, ms(13), ms(5), 11250 * time.Microsecond},
		{"two frames a delay apart: held 12.5 ms", 2, ms(20), ms(5), 7500 * time.Microsecond},
		{"three frames 24 ms apart: held 10 ms", 3, ms(24), ms(5), 5 * time.Millisecond},
		{"four frames a delay apart: held the delay", 4, ms(20), ms(5), 15 * time.Millisecond},
		{"twenty frames a delay apart", 20, ms(20), ms(5), 15 * time.Millisecond},
		{"many frames, but writes two delays apart", 100, ms(40), ms(5), 0},
		{"64 frames a delay apart: a full batch a delay", 64, ms(20), ms(5), 15 * time.Millisecond},
		{"640 frames a delay apart: a full batch in 2 ms", 640, ms(20), 0, 2 * time.Millisecond},
		{"1280 frames 10 ms apart: a full batch in 0.5 ms", 1280, ms(10), 0, 500 * time.Microsecond},
		{"a full batch in 2 ms, 5 ms ago", 640, ms(20), ms(5), 0},
		{"64 frames 10 ms apart: a full batch in 10 ms", 64, ms(10), ms(5), 5 * time.Millisecond},
		{"128 frames 15 ms apart: a full batch in 7.5 ms", 128, ms(15), ms(5), 2500 * time.Microsecond},
		{"gap below zero (clock stepped back)", 1, -ms(1), ms(5), 15 * time.Millisecond},
		{"last write in the future (clock stepped back)", 20, ms(20), -ms(1000), d},
		{"a full batch in 2 ms, last write in the future", 640, ms(20), -ms(1000), 2 * time.Millisecond},
	} {
		s.lastCount, s.lastGap, s.lastWrite = tc.count, tc.gap, now.UnixNano()-tc.ago
		if got := s.holdFor(); got != tc.want {
			t.Errorf("%s: holdFor() = %v, want %v", tc.name, got, tc.want)
		}
	}

	s.lastCount, s.lastGap, s.lastWrite = 20, ms(20), now.UnixNano()-ms(5)
	for range srv.cfg.SendQueueMessages / 8 {
		s.q.push(outItem{body: []byte(`{}`), kind: idxPatch}, srv.cfg.SendQueueMessages, srv.cfg.SendQueueBytes)
	}
	if got := s.holdFor(); got != 0 {
		t.Errorf("a queue an eighth full: holdFor() = %v, want 0", got)
	}
	releaseWriter(t, srv, s)
}

// TestSession_OverloadHoldsFastSessionsWhole: while the node is overloaded
// (the delay above MaxWriteDelay) a session whose frames come fast is held
// for the whole delay, not only until a full batch has come, and so is one
// that gets a few frames a delay: every session's writes must thin out.
func TestSession_OverloadHoldsFastSessionsWhole(t *testing.T) {
	now := time.Unix(1000, 0)
	var waits uint64 // every scheduling wait long: overloaded from the first ticks
	srv := holdServer(t, now, func() (uint64, uint64) { waits += 1000; return waits, waits }, 75*time.Millisecond)
	defer srv.Shutdown(context.Background())
	s, _ := pooledSession(t, srv, "id")
	for _, count := range []int{640, 2} { // a fast session, and one that gets a few frames a delay
		s.lastCount, s.lastGap, s.lastWrite = count, int64(20*time.Millisecond), now.UnixNano()-int64(5*time.Millisecond)
		if got, want := s.holdFor(), 70*time.Millisecond; got != want {
			t.Errorf("%d frames in 20 ms: holdFor() = %v, want %v", count, got, want)
		}
	}
}

// TestSession_HoldEndsWhenTheQueueFills: pacing looks at a session's queue
// only when a hold starts, so a burst during a hold used to fill the queue
// and close a session whose client reads promptly as a slow consumer
// (4001). A push that fills an eighth of the queue now ends the hold, for
// both writers: the pool's held heap and a session's own writeLoop.
func TestSession_HoldEndsWhenTheQueueFills(t *testing.T) {
	now := time.Unix(1000, 0)
	const d = 10 * time.Second // the hold: far longer than the test may take
	start := time.Now()
	srv, err := New(Config{
		Writers: 1, SendQueueBytes: 128 << 10,
		MaxWriteDelay: d, OverloadWriteDelay: d,
		CPUTime: func() time.Duration { return 100 * time.Since(start) }, // always busy
		Now:     func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	waitPaceDelay(t, srv, d)
	body := []byte(`"` + strings.Repeat("x", 1000) + `"`)
	const frames = 200 // about 200 KB: over the 128 KiB bound, unless written meanwhile
	for _, own := range []bool{false, true} {
		s, cc := pooledSession(t, srv, fmt.Sprint("own-", own))
		s.pooled = !own
		// A session that batches, written just now: held for the whole d.
		s.lastCount, s.lastGap, s.lastWrite = 64, int64(d), now.UnixNano()
		if got := s.holdFor(); got != d {
			t.Fatalf("holdFor = %v, want %v", got, d)
		}
		// The last frames, under an eighth, may wait out the hold: the
		// client must get the others.
		const want = frames - 32
		got := make(chan int, 1)
		go func() {
			n := 0
			for n < want {
				_, msg, err := cc.Read(context.Background())
				if err != nil {
					break
				}
				n += bytes.Count(msg, []byte("\n")) + 1
			}
			got <- n
		}()
		// The load's shape (a frame every 2 ms), not synchronisation: the
		// queue's eighth comes in 32 ms, its bound in about 260.
		tick := time.NewTicker(2 * time.Millisecond)
		for i := range frames {
			<-tick.C
			if !s.enqueue(outItem{body: body, kind: idxPatch}) {
				t.Fatalf("own writer %v: frame %d refused: the session was closed (%v) while its client reads", own, i, s.q.reason)
			}
		}
		tick.Stop()
		select {
		case n := <-got:
			if n < want {
				t.Fatalf("own writer %v: client got %d frames, want %d or more", own, n, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("own writer %v: %d frames were not written within 5s (the hold is %v)", own, want, d)
		}
		// A close ends a hold too: the rest and the close frame come now.
		s.closeWith(reasonShutdown)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var err error
		for err == nil {
			_, _, err = cc.Read(ctx)
		}
		cancel()
		if websocket.CloseStatus(err) != websocket.StatusGoingAway {
			t.Fatalf("own writer %v: after the close the client read %v, want close 1001 within 5s (the hold is %v)", own, err, d)
		}
	}
}

// waitPaceDelay waits, polling with a deadline, until srv's pacing delay
// settles at d (a node the test keeps busy).
func waitPaceDelay(t *testing.T, srv *Server, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for srv.pacer.delay() != d {
		if time.Now().After(deadline) {
			t.Fatalf("pacing delay %v, want it to settle at %v", srv.pacer.delay(), d)
		}
		time.Sleep(5 * time.Millisecond) // polling the pacer's state, with a deadline
	}
}
