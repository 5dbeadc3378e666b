package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/syncgate/syncgate/client"
	"github.com/syncgate/syncgate/frames"
)

// events collects a Client's events for a test.
type events struct {
	ch chan client.Event
}

func newEvents() *events { return &events{ch: make(chan client.Event, 256)} }

func (e *events) on(ev client.Event) {
	select {
	case e.ch <- ev:
	default:
	}
}

// wait returns the next event of kind, failing the test if ctx ends first.
func (e *events) wait(t *testing.T, ctx context.Context, kind client.EventKind) client.Event {
	t.Helper()
	for {
		select {
		case ev := <-e.ch:
			if ev.Kind == kind {
				return ev
			}
		case <-ctx.Done():
			t.Fatalf("waiting for event %s: %v", kind, ctx.Err())
		}
	}
}

// fakeClock is a settable clock for Options.Now.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano())
	return c
}
func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// sleeps records the delays the Client sleeps (returning at once).
type sleeps struct {
	mu sync.Mutex
	ds []time.Duration
}

func (s *sleeps) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.ds = append(s.ds, d)
	s.mu.Unlock()
	return ctx.Err()
}

func (s *sleeps) get() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.ds)
}

func dialReconnect(t *testing.T, url string, o *client.Options) *client.Client {
	t.Helper()
	o.Reconnect = true
	c, err := client.Dial(testCtx(t), url, o)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

// pushFrame writes f on the fake server's side of conn.
func pushFrame(t *testing.T, ctx context.Context, conn *websocket.Conn, f frames.Frame) {
	t.Helper()
	b, err := frames.Encode(f)
	noErr(t, err)
	noErr(t, conn.Write(ctx, websocket.MessageText, b))
}

// TestReconnect_AfterMsExact_FakeClock: the client waits exactly afterMs,
// with no jitter. An afterMs past frames.MaxAfterMs waits an hour; one
// past what a Duration holds in milliseconds once wrapped to a negative
// wait, and the client reconnected at once.
func TestReconnect_AfterMsExact_FakeClock(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		afterMs int64
		want    time.Duration
	}{
		{"exact", 1234, 1234 * time.Millisecond},
		{"over an hour", math.MaxInt64/int64(time.Millisecond) + 1, time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			fs := newFakeServer(t)
			clock := newFakeClock()
			var sl sleeps
			ev := newEvents()
			c := dialReconnect(t, fs.url(), &client.Options{Now: clock.now, Sleep: sl.sleep, OnEvent: ev.on,
				Rand: func(int64) int64 { t.Error("backoff used for a scheduled reconnect"); return 0 }})
			conn := recv(t, ctx, fs.conns)
			recv(t, ctx, fs.hellos)

			pushFrame(t, ctx, conn, &frames.Reconnect{AfterMs: tc.afterMs, Reason: frames.ReasonDrain})
			sched := ev.wait(t, ctx, client.EventReconnectScheduled)
			equal(t, "Delay", sched.Delay, tc.want)
			equal(t, "Reason", sched.Reason, frames.ReasonDrain)
			res := ev.wait(t, ctx, client.EventResumed)
			equal(t, "Resumed.Reason", res.Reason, frames.ReasonDrain)
			equal(t, "Resumed.Since", res.Since, sched.At.Add(tc.want))
			// The clock stood still: the wait is exactly afterMs, no jitter.
			equal(t, "sleeps", len(sl.get()), 1)
			equal(t, "sleep", sl.get()[0], tc.want)
			equal(t, "SessionID", c.SessionID(), "sess-2")
			h := recv(t, ctx, fs.hellos)
			equal(t, "hello.clientId", h.ClientID, c.ClientID())
		})
	}
}

func TestReconnect_AfterMs_RealTime(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fs := newFakeServer(t)
	dialReconnect(t, fs.url(), &client.Options{})
	conn := recv(t, ctx, fs.conns)
	recv(t, ctx, fs.hellos)

	const after = 300 * time.Millisecond
	start := time.Now()
	pushFrame(t, ctx, conn, &frames.Reconnect{AfterMs: int64(after / time.Millisecond), Reason: frames.ReasonDrain})
	recv(t, ctx, fs.hellos)
	got := time.Since(start)
	if got < after || got > after+250*time.Millisecond {
		t.Errorf("new hello %v after the reconnect frame, want %v (+ at most 250ms)", got, after)
	}
}

func TestReconnect_Overload_DialObeysAfterMs(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fs := newFakeServer(t)
	clock := newFakeClock()
	var sl sleeps
	ev := newEvents()
	c := dialReconnect(t, fs.url(), &client.Options{BuildID: "overload-once", Now: clock.now, Sleep: sl.sleep, OnEvent: ev.on})
	f := ev.wait(t, ctx, client.EventDialFailed)
	equal(t, "Reason", f.Reason, frames.ReasonOverload)
	equal(t, "Delay", f.Delay, 50*time.Millisecond)
	equal(t, "sleeps", len(sl.get()), 1)
	equal(t, "sleep", sl.get()[0], 50*time.Millisecond)
	equal(t, "SessionID", c.SessionID(), "sess-2")
}

// A refusal's afterMs is counted from the reconnect frame's arrival: once
// that moment has passed the wait is 0, never negative. The clock moves
// 100 ms at every reading, past the refusal's 50 ms.
func TestReconnect_Overload_DialFailedDelayNotNegative(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fs := newFakeServer(t)
	clock := newFakeClock()
	var sl sleeps
	ev := newEvents()
	now := func() time.Time {
		clock.advance(100 * time.Millisecond)
		return clock.now()
	}
	dialReconnect(t, fs.url(), &client.Options{BuildID: "overload-once", Now: now, Sleep: sl.sleep, OnEvent: ev.on})
	f := ev.wait(t, ctx, client.EventDialFailed)
	equal(t, "Reason", f.Reason, frames.ReasonOverload)
	equal(t, "Delay", f.Delay, 0)
	equal(t, "sleep", sl.get()[0], 0)
}

// TestReconnect_MakeBeforeBreak moves a subscriber to a new connection
// while a publisher publishes to a persisted topic: the subscriber must see
// every message exactly once, in order, and its old connection must stay
// open until the new one carries the subscription.
func TestReconnect_MakeBeforeBreak(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fs := newFakeServer(t)
	pub := dial(t, fs, nil)
	recv(t, ctx, fs.conns)
	ev := newEvents()
	c := dialReconnect(t, fs.url(), &client.Options{OnEvent: ev.on})
	old := recv(t, ctx, fs.conns)

	var mu sync.Mutex
	var got []string
	sub, err := c.Subscribe(ctx, "p:room", nil, func(p *frames.Patch) {
		mu.Lock()
		got = append(got, p.LSN)
		mu.Unlock()
	})
	noErr(t, err)

	const n = 400
	var want []string
	pubDone := make(chan struct{})
	moved := make(chan struct{})
	go func() {
		defer close(pubDone)
		for i := range n {
			if i == n/4 {
				// Not pushFrame: t.Fatal must not run on this goroutine.
				b, err := frames.Encode(&frames.Reconnect{AfterMs: 0, Reason: frames.ReasonDrain})
				if err == nil {
					err = old.Write(ctx, websocket.MessageText, b)
				}
				if err != nil {
					t.Errorf("sending reconnect: %v", err)
					return
				}
			}
			if i == 3*n/4 {
				<-moved
			}
			lsn, err := pub.Publish(ctx, "p:room", json.RawMessage(strconv.Itoa(i)))
			if err != nil {
				t.Errorf("Publish: %v", err)
				return
			}
			want = append(want, lsn)
		}
	}()
	ev.wait(t, ctx, client.EventResumed)
	close(moved)
	// The Client closed the old connection itself, normally, after the
	// take-over.
	equal(t, "old connection's close", recv(t, ctx, fs.closes), websocket.StatusNormalClosure)
	recv(t, ctx, pubDone)
	if t.Failed() || len(want) == 0 {
		t.FailNow() // the publisher said why
	}

	// Wait for the last message, then compare.
	last := want[len(want)-1]
	for {
		if sub.Cursor().LSN == last {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("cursor %s, want %s", sub.Cursor().LSN, last)
		case <-time.After(5 * time.Millisecond): // poll with a deadline
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(got, want) {
		t.Fatalf("got %d patches, want the %d published in order, exactly once", len(got), len(want))
	}
}

func TestReconnect_ResubscribeWithCursor(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fs := newFakeServer(t)
	pub := dial(t, fs, nil)
	recv(t, ctx, fs.conns)
	recv(t, ctx, fs.hellos)
	ev := newEvents()
	c := dialReconnect(t, fs.url(), &client.Options{OnEvent: ev.on, Sleep: (&sleeps{}).sleep})
	conn := recv(t, ctx, fs.conns)
	recv(t, ctx, fs.hellos)

	sub, err := c.Subscribe(ctx, "p:room", nil, nil)
	noErr(t, err)
	var want []string
	publish := func() {
		lsn, err := pub.Publish(ctx, "p:room", json.RawMessage(`1`))
		noErr(t, err)
		want = append(want, lsn)
	}
	publish()
	publish()
	equal(t, "first patch", recv(t, ctx, sub.Patches()).LSN, want[0])
	equal(t, "second patch", recv(t, ctx, sub.Patches()).LSN, want[1])

	// Cut the connection; publish while the client is away.
	noErr(t, conn.Close(4001, "slow consumer"))
	ev.wait(t, ctx, client.EventDisconnected)
	publish()
	publish()
	ev.wait(t, ctx, client.EventResumed)
	publish()
	for _, lsn := range want[2:] {
		equal(t, "patch after resume", recv(t, ctx, sub.Patches()).LSN, lsn)
	}
	select {
	case p := <-sub.Patches():
		t.Fatalf("extra patch %s", p.LSN)
	default:
	}
	equal(t, "Cursor", sub.Cursor().LSN, want[4])
}

func TestReconnect_CursorExpired_NewNode(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	a, b := newFakeServer(t), newFakeServer(t)
	pubA := dial(t, a, nil)
	pubB := dial(t, b, nil)
	ev := newEvents()
	c := dialReconnect(t, a.url(), &client.Options{OnEvent: ev.on, URLFor: func(int) string { return b.url() }})
	recv(t, ctx, a.conns)
	conn := recv(t, ctx, a.conns)

	sub, err := c.Subscribe(ctx, "room", nil, nil)
	noErr(t, err)
	for range 5 { // A's offsets run ahead of B's
		_, err := pubA.Publish(ctx, "room", json.RawMessage(`"a"`))
		noErr(t, err)
		recv(t, ctx, sub.Patches())
	}
	pushFrame(t, ctx, conn, &frames.Reconnect{AfterMs: 10, Reason: frames.ReasonDrain})
	exp := ev.wait(t, ctx, client.EventCursorExpired)
	equal(t, "expired sub", exp.Sub, sub)
	ev.wait(t, ctx, client.EventResumed)
	equal(t, "URL", c.URL(), b.url())

	lsn, err := pubB.Publish(ctx, "room", json.RawMessage(`"b"`))
	noErr(t, err)
	equal(t, "patch from B", recv(t, ctx, sub.Patches()).LSN, lsn)
}

func TestReconnect_ResendUnacked(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fs := newFakeServer(t)
	ev := newEvents()
	c := dialReconnect(t, fs.url(), &client.Options{OnEvent: ev.on, Sleep: (&sleeps{}).sleep})
	conn := recv(t, ctx, fs.conns)
	sub, err := c.Subscribe(ctx, "dropack1", nil, nil)
	noErr(t, err)

	// seq 0 is published but its ack lost; seqs 1-3 are not taken up.
	type res struct {
		i   int
		lsn string
		err error
	}
	results := make(chan res, 4)
	noErr(t, c.PublishAsync(ctx, "dropack1", json.RawMessage(`0`), func(lsn string, err error) { results <- res{0, lsn, err} }))
	recv(t, ctx, fs.held)
	for i := 1; i <= 3; i++ {
		noErr(t, c.PublishAsync(ctx, "hold1", json.RawMessage(strconv.Itoa(i)), func(lsn string, err error) { results <- res{i, lsn, err} }))
		recv(t, ctx, fs.held)
	}
	first := recv(t, ctx, sub.Patches()) // seq 0 reached its subscribers

	noErr(t, conn.Close(websocket.StatusGoingAway, "restart"))
	ev.wait(t, ctx, client.EventResumed)
	for i := range 4 {
		r := recv(t, ctx, results)
		equal(t, "completion order", r.i, i)
		noErr(t, r.err)
		if i == 0 {
			equal(t, "seq 0 lsn (the first ack, again)", r.lsn, first.LSN)
		}
	}
	// seq 0 was not published twice.
	select {
	case p := <-sub.Patches():
		t.Fatalf("seq 0 published again: %s", p.LSN)
	default:
	}
	// The next seq continues after the re-sent ones.
	_, err = c.Publish(ctx, "room", json.RawMessage(`4`))
	noErr(t, err)
}

func TestReconnect_Backoff(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fs := newFakeServer(t)
	dead := deadURL(t)
	clock := newFakeClock()
	var sl sleeps
	var mu sync.Mutex
	var ceilings []time.Duration
	ev := newEvents()
	const base, ceil = 10 * time.Millisecond, 80 * time.Millisecond
	good := atomic.Int64{} // attempts from this one on go to fs
	good.Store(1 << 30)
	c := dialReconnect(t, fs.url(), &client.Options{
		BackoffBase: base, BackoffCap: ceil, StableAfter: 10 * time.Second,
		Now: clock.now, Sleep: sl.sleep, OnEvent: ev.on,
		Rand: func(n int64) int64 {
			mu.Lock()
			ceilings = append(ceilings, time.Duration(n))
			mu.Unlock()
			return n - 1 // the top of the range: full jitter's bound
		},
		URLFor: func(n int) string {
			if int64(n) >= good.Load() {
				return fs.url()
			}
			return dead
		},
	})
	conn := recv(t, ctx, fs.conns)

	// The connection is lost: 5 attempts fail, the 6th succeeds.
	good.Store(6)
	noErr(t, conn.Close(websocket.StatusInternalError, "crash"))
	ev.wait(t, ctx, client.EventResumed)
	want := []time.Duration{10, 20, 40, 80, 80, 80}
	for i := range want {
		want[i] *= time.Millisecond
	}
	mu.Lock()
	got := slices.Clone(ceilings)
	ceilings = nil
	mu.Unlock()
	if !slices.Equal(got, want) {
		t.Errorf("backoff ceilings %v, want %v", got, want)
	}
	for i, d := range sl.get() {
		if d != want[i]-1 {
			t.Errorf("sleep %d = %v, want %v", i, d, want[i]-1)
		}
	}

	// Lost again at once: the backoff goes on growing.
	conn = recv(t, ctx, fs.conns)
	noErr(t, conn.Close(websocket.StatusInternalError, "crash"))
	ev.wait(t, ctx, client.EventResumed)
	// Then a session that stays up past StableAfter resets it.
	conn = recv(t, ctx, fs.conns)
	clock.advance(10 * time.Second)
	noErr(t, conn.Close(websocket.StatusInternalError, "crash"))
	ev.wait(t, ctx, client.EventResumed)
	mu.Lock()
	got = slices.Clone(ceilings)
	mu.Unlock()
	if !slices.Equal(got, []time.Duration{ceil, base}) {
		t.Errorf("ceilings after quick and stable sessions %v, want [%v %v]", got, ceil, base)
	}
	_ = c
}

// deadURL returns a ws:// URL on loopback where nothing listens.
func deadURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	noErr(t, err)
	addr := ln.Addr().String()
	noErr(t, ln.Close())
	return "ws://" + addr + "/v1/ws"
}

func TestReconnect_CloseWhileReconnecting(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fs := newFakeServer(t)
	dead := deadURL(t)
	ev := newEvents()
	c, err := client.Dial(ctx, fs.url(), &client.Options{Reconnect: true, OnEvent: ev.on,
		BackoffBase: time.Hour, BackoffCap: time.Hour, Rand: func(n int64) int64 { return n - 1 },
		URLFor: func(int) string { return dead }})
	noErr(t, err)
	conn := recv(t, ctx, fs.conns)
	sub, err := c.Subscribe(ctx, "room", nil, nil)
	noErr(t, err)

	noErr(t, conn.Close(websocket.StatusInternalError, "crash"))
	d := ev.wait(t, ctx, client.EventDisconnected)
	equal(t, "backoff", d.Delay, time.Hour-1)
	// Disconnected: a publish queues, a Drop ends the subscription locally.
	errc := make(chan error, 1)
	go func() {
		_, err := c.Publish(ctx, "room", json.RawMessage(`1`))
		errc <- err
	}()
	noErr(t, sub.Drop(ctx))
	if _, ok := <-sub.Patches(); ok {
		t.Error("Patches open after Drop")
	}
	if err := c.Send(ctx, &frames.Presence{Topic: "x", Op: "join", Members: []frames.Member{}}); !errors.Is(err, client.ErrNotConnected) {
		t.Errorf("Send while disconnected = %v, want ErrNotConnected", err)
	}

	start := time.Now()
	noErr(t, c.Close())
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Close took %v while sleeping a backoff", d)
	}
	if err := recv(t, ctx, errc); !errors.Is(err, net.ErrClosed) {
		t.Errorf("queued Publish = %v, want net.ErrClosed", err)
	}
	if !errors.Is(c.Err(), net.ErrClosed) {
		t.Errorf("Err = %v", c.Err())
	}
}

func TestReconnect_CloseDuringTakeOver(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fs := newFakeServer(t)
	ev := newEvents()
	c, err := client.Dial(ctx, fs.url(), &client.Options{Reconnect: true, OnEvent: ev.on})
	noErr(t, err)
	conn := recv(t, ctx, fs.conns)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Subscribe(ctx, "hold", nil, nil) // never answered
		errc <- err
	}()
	recv(t, ctx, fs.held)
	pushFrame(t, ctx, conn, &frames.Reconnect{AfterMs: 0, Reason: frames.ReasonRebalance})
	ev.wait(t, ctx, client.EventConnected)
	recv(t, ctx, fs.held) // resubscribed on the new connection: the take-over waits for it

	start := time.Now()
	noErr(t, c.Close())
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Close took %v during a take-over", d)
	}
	if err := recv(t, ctx, errc); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Subscribe = %v, want net.ErrClosed", err)
	}
}

// With Reconnect a subscribe the server dropped over its rate is not a
// refusal: the connection starts over and the subscribe is sent again on
// the next one, both for a new Subscribe and for a resubscribe during a
// take-over (which must not end a live subscription).
func TestReconnect_RateLimitedSubscribeIsSentAgain(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	t.Run("new", func(t *testing.T) {
		c := dialReconnect(t, newFakeServer(t).url(), &client.Options{Sleep: (&sleeps{}).sleep})
		if _, err := c.Subscribe(ctx, "limitedsub1", nil, nil); err != nil {
			t.Fatalf("Subscribe dropped on the first connection: %v", err)
		}
	})
	t.Run("resubscribe", func(t *testing.T) {
		fs := newFakeServer(t)
		c := dialReconnect(t, fs.url(), &client.Options{Sleep: (&sleeps{}).sleep})
		first := recv(t, ctx, fs.conns)
		// Persisted ("p:"), so a patch published while the resubscribe
		// was dropped is replayed from the cursor on connection 3.
		sub, err := c.Subscribe(ctx, "p:limitedsub2", nil, nil) // live on connection 1
		noErr(t, err)
		noErr(t, first.Close(websocket.StatusGoingAway, "restart"))
		// Connection 2 drops the resubscribe; connection 3 takes it.
		if _, err := c.Publish(ctx, "p:limitedsub2", json.RawMessage(`1`)); err != nil {
			t.Fatal(err)
		}
		if _, ok := <-sub.Patches(); !ok {
			t.Fatal("Patches closed: a dropped resubscribe ended the subscription")
		}
	})
}

// Attempts are counted from Dial's on: the supervisor's first attempt
// continues after the ones Dial made, so URLFor and Event.Attempt never
// see a number twice, and RoundRobin over two URLs moves to the other one
// on every reconnect even when Dial needed a retry.
func TestReconnect_AttemptsContinueDials(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	s := newScripted(t)
	dead := deadURL(t)
	rr := client.RoundRobin(dead, s.url())
	asked := make(chan int, 16)
	c := dialReconnect(t, dead, &client.Options{
		Sleep: (&sleeps{}).sleep,
		URLFor: func(n int) string {
			asked <- n
			return rr(n)
		},
	})
	equal(t, "Dial's URL", c.URL(), s.url())
	equal(t, "Dial's attempts", recv(t, ctx, asked), 1)
	sc := s.next(t)
	sc.send(t, &frames.Reconnect{AfterMs: 0, Reason: frames.ReasonDrain})
	if n := recv(t, ctx, asked); n != 2 {
		t.Fatalf("the reconnect's attempt is %d (URL %s), want 2 (URL %s): attempts restarted after Dial", n, rr(n), rr(2))
	}
}

// A Dial whose connection ends after its hello, before it becomes
// current, must not leave that dead connection current: calls would go
// to it until a later connection took over. The supervisor finds it
// ended and reconnects at once; meanwhile there is no connection. Here
// the backoff lasts until the test ends.
func TestReconnect_DialConnectionEndsBeforeCurrent(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	s := newScripted(t)
	rec := newRecorder()
	o := rec.options()
	noBackoff(o)
	client.SetDialedForTest(o, func(ended <-chan struct{}) {
		s.next(t).ws.CloseNow()
		recv(t, ctx, ended)
	})
	c, err := client.Dial(ctx, s.url(), o)
	noErr(t, err)
	t.Cleanup(func() { c.Close() })
	waitEvents(t, rec, client.EventDisconnected, 1)
	if err := c.Send(ctx, &frames.Presence{Topic: "x", Op: "join", Members: []frames.Member{}}); !errors.Is(err, client.ErrNotConnected) {
		t.Fatalf("Send after the connection ended = %v, want ErrNotConnected", err)
	}
}
