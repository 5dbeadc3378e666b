package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syncgate/syncgate/client"
	"github.com/syncgate/syncgate/frames"
)

// A take-over first waits (up to takeOverWait) for the old connection to
// answer the mutates it was sent. These tests drive that wait with the
// scripted server (reset_test.go), which answers only when told.

// A patch handler that publishes while a take-over waits for the old
// connection's acks must not wait for the take-over. The handler runs on
// the old connection's read loop, and the ack the take-over waits for is
// read only after the handler returns: a publish that waited for the
// take-over would wait until takeOverWait ended it.
func TestReconnect_TakeOver_PublishFromHandler(t *testing.T) {
	ctx, rec, c, s, sc1 := startScripted(t)
	type result struct {
		took time.Duration
		err  error
	}
	published := make(chan result, 1)
	acked := make(chan error, 2)
	sub := subscribeScripted(t, ctx, c, sc1, func(*frames.Patch) {
		start := time.Now()
		err := c.PublishAsync(ctx, "p:t", json.RawMessage(`2`), func(_ string, err error) { acked <- err })
		published <- result{time.Since(start), err}
	})
	sid := sub.SID()

	// m0 is in flight on the old connection when the take-over starts.
	noErr(t, c.PublishAsync(ctx, "p:t", json.RawMessage(`1`), func(_ string, err error) { acked <- err }))
	m0, sc2 := startTakeOver(t, rec, s, sc1)

	// The patch runs the handler; m0's ack is read after it returns.
	sc1.send(t, insert(sid, 1, "x"), &frames.Ack{Ref: m0.Key})
	bound := client.TakeOverWaitForTest / 2
	select {
	case r := <-published:
		noErr(t, r.err)
		if r.took > bound {
			t.Fatalf("PublishAsync in a patch handler took %v during a take-over", r.took)
		}
	case <-time.After(bound):
		t.Fatalf("PublishAsync in a patch handler still waiting after %v of a take-over", bound)
	}

	// The take-over goes on once m0 is answered: the resubscribe on sc2,
	// then the handler's mutate m1, held meanwhile and sent there only.
	// (Had the handler's publish taken the send lock before the
	// take-over did, m1 went out on sc1, and the take-over waits for its
	// ack there too.)
	var add *frames.Subscribe
	var m1 *frames.Mutate
	deadline := time.After(10 * time.Second)
	for add == nil {
		select {
		case f := <-sc1.in:
			m, ok := f.(*frames.Mutate)
			if !ok || m1 != nil {
				t.Fatalf("old connection got %T %+v", f, f)
			}
			m1 = m
			sc1.send(t, &frames.Ack{Ref: m1.Key})
		case f := <-sc2.in:
			var ok bool
			if add, ok = f.(*frames.Subscribe); !ok {
				t.Fatalf("new connection got %T %+v before the resubscribe", f, f)
			}
		case <-deadline:
			t.Fatal("no resubscribe on the new connection")
		}
	}
	if m1 == nil {
		m1 = expect[*frames.Mutate](t, sc2) // m0, answered on sc1, is not re-sent
		sc2.send(t, &frames.Ack{Ref: m1.Key})
	}
	equal(t, "handler's mutate seq", m1.Seq, m0.Seq+1)
	sc2.send(t, &frames.Ack{Ref: sid}, topicSnapshot(sid, 1, "log:a"))
	noErr(t, recv(t, ctx, acked))
	noErr(t, recv(t, ctx, acked))
	waitEvents(t, rec, client.EventResumed, 1)
}

// A take-over whose new connection ends while it waits for the old one's
// acks leaves the old one current: what was published meanwhile (held,
// not waiting) goes out there after what it was sent, in seq order.
func TestReconnect_TakeOver_FailsWhileWaiting(t *testing.T) {
	s := newScripted(t)
	ctx := testCtx(t)
	rec := newRecorder()
	o := rec.options()
	noBackoff(o) // the reconnect goes at once; none after the failed take-over
	c, err := client.Dial(ctx, s.url(), o)
	noErr(t, err)
	t.Cleanup(func() { c.Close() })
	sc1 := s.next(t)

	acked := make(chan error, 3)
	done := func(_ string, err error) { acked <- err }
	noErr(t, c.PublishAsync(ctx, "p:t", json.RawMessage(`0`), done))
	m0, sc2 := startTakeOver(t, rec, s, sc1)

	bound := client.TakeOverWaitForTest / 2
	pctx, cancel := context.WithTimeout(ctx, bound) // bounds only the wait to send
	defer cancel()
	start := time.Now()
	err = c.PublishAsync(pctx, "p:t", json.RawMessage(`1`), done)
	if took := time.Since(start); err != nil || took > bound {
		t.Fatalf("PublishAsync during a take-over: %v after %v", err, took)
	}
	sc2.ws.CloseNow() // before the take-over is done waiting
	waitEvents(t, rec, client.EventDialFailed, 1)

	m1 := expect[*frames.Mutate](t, sc1)
	equal(t, "seq on the old connection", m1.Seq, m0.Seq+1)
	noErr(t, c.PublishAsync(ctx, "p:t", json.RawMessage(`2`), done))
	m2 := expect[*frames.Mutate](t, sc1)
	equal(t, "next seq on the old connection", m2.Seq, m0.Seq+2)
	sc1.send(t, &frames.Ack{Ref: m0.Key}, &frames.Ack{Ref: m1.Key}, &frames.Ack{Ref: m2.Key})
	for range 3 {
		noErr(t, recv(t, ctx, acked))
	}
}

// Mutates held while a take-over waits for the old connection's acks
// count against the write queue's bound, as queued ones do: once what is
// held fills it, a PublishAsync waits (here until its ctx ends, using no
// seq) until the take-over sends what it holds.
func TestReconnect_TakeOver_HeldMutatesWaitForRoom(t *testing.T) {
	ctx, rec, c, s, sc1 := startScripted(t)
	acked := make(chan error, 16)
	done := func(_ string, err error) { acked <- err }
	noErr(t, c.PublishAsync(ctx, "p:t", json.RawMessage(`0`), done))
	m0, sc2 := startTakeOver(t, rec, s, sc1)

	// 16 KiB each: the fifth is over the 64 KiB bound.
	data := json.RawMessage(`"` + strings.Repeat("x", 16<<10) + `"`)
	pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	held := 0
	for ; held < 8; held++ {
		if err := c.PublishAsync(pctx, "p:t", data, done); err != nil {
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("PublishAsync %d: %v, want context.DeadlineExceeded", held, err)
			}
			break
		}
	}
	if held != 4 {
		t.Fatalf("%d PublishAsync calls held during the take-over, want 4 (64 KiB)", held)
	}

	// Once m0 is answered the take-over sends what it held, in seq
	// order; the one that gave up used no seq.
	sc1.send(t, &frames.Ack{Ref: m0.Key})
	for i := range held {
		m := expect[*frames.Mutate](t, sc2)
		equal(t, "held seq", m.Seq, m0.Seq+1+int64(i))
		sc2.send(t, &frames.Ack{Ref: m.Key})
	}
	noErr(t, c.PublishAsync(ctx, "p:t", data, done))
	m := expect[*frames.Mutate](t, sc2)
	equal(t, "seq after the held ones", m.Seq, m0.Seq+1+int64(held))
	sc2.send(t, &frames.Ack{Ref: m.Key})
	for range held + 2 {
		noErr(t, recv(t, ctx, acked))
	}
}

// A Drop made while a take-over waits for the old connection's acks goes
// to the old connection, which the take-over then replaces, stopping its
// writes: a drop still queued there is never sent, and its ack never
// comes. The subscription, which the take-over does not carry over, must
// end when the take-over makes the new connection current, and Drop
// return, not wait until the old connection is closed: here never, as
// the new connection ends before it carries the other subscription,
// which leaves the old one delivering with no later take-over to close
// it. The old connection's hello states a frame rate the Client keeps
// to, which holds the drop in its writer until the writes stop.
func TestReconnect_TakeOver_DropQueuedOnOld(t *testing.T) {
	// The Client keeps to half the burst, 4 frames, less the hello's:
	// the two subscribes and m0 go out, the drop waits some 1000 s.
	s := newScriptedHello(t, func(h *frames.Hello) { h.FrameRate, h.FrameBurst = 0.001, 8 })
	ctx := testCtx(t)
	rec := newRecorder()
	o := rec.options()
	noBackoff(o) // the reconnect goes at once; none after the new connection ends
	c, err := client.Dial(ctx, s.url(), o)
	noErr(t, err)
	t.Cleanup(func() { c.Close() })
	sc1 := s.next(t)
	a := subscribeScripted(t, ctx, c, sc1, nil)
	b := subscribeScripted(t, ctx, c, sc1, rec.handler(t))

	acked := make(chan error, 1)
	noErr(t, c.PublishAsync(ctx, "p:t", json.RawMessage(`0`), func(_ string, err error) { acked <- err }))
	m0, sc2 := startTakeOver(t, rec, s, sc1)

	dropped := make(chan error, 1)
	go func() { dropped <- a.Drop(ctx) }()
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !a.DroppingForTest() {
		select {
		case <-deadline:
			t.Fatal("Drop queued no drop")
		case <-tick.C:
		}
	}

	// The take-over goes on: b is resubscribed on the new connection, a
	// (being dropped) is not.
	sc1.send(t, &frames.Ack{Ref: m0.Key})
	noErr(t, recv(t, ctx, acked))
	resume := expect[*frames.Subscribe](t, sc2)
	equal(t, "resubscribed sid", resume.SID, b.SID())
	sc2.ws.CloseNow() // before it answers: the old connection stays open

	select {
	case err := <-dropped:
		noErr(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Drop still waiting 5s after the take-over replaced its connection")
	}
	// No patch of a after Drop returned: the old connection's are not
	// delivered (b's still are).
	sc1.send(t, insert(a.SID(), 1, "a1"), insert(b.SID(), 1, "b1"))
	rec.waitData(t, 1)
	for p := range a.Patches() {
		t.Fatalf("a patch after Drop: %+v", p)
	}
	// The drop never went out: the take-over threw it away with the old
	// connection's writes.
	select {
	case f := <-sc1.in:
		t.Fatalf("the old connection got %T %+v", f, f)
	default:
	}
}

// A take-over whose new connection ends after the take-over sent a
// waiting Subscribe's add there too, before it took over, leaves the old
// connection current: the Subscribe, whose add the old connection was
// sent, goes live on the old connection's answer, as if the take-over
// had never begun, not on a later take-over's.
func TestReconnect_TakeOver_FailsWithSubscribeWaiting(t *testing.T) {
	s := newScripted(t)
	ctx := testCtx(t)
	rec := newRecorder()
	o := rec.options()
	noBackoff(o) // the reconnect goes at once; none after the failed take-over
	hooked := make(chan struct{})
	var once sync.Once
	client.SetTakeOverForTest(o, func(ended <-chan struct{}) {
		once.Do(func() {
			close(hooked) // the test ends the new connection now
			select {
			case <-ended:
			case <-ctx.Done():
			}
		})
	})
	c, err := client.Dial(ctx, s.url(), o)
	noErr(t, err)
	t.Cleanup(func() { c.Close() })
	sc1 := s.next(t)

	type result struct {
		sub *client.Subscription
		err error
	}
	done := make(chan result, 1)
	go func() {
		sub, err := c.Subscribe(ctx, "p:t", nil, nil)
		done <- result{sub, err}
	}()
	add := expect[*frames.Subscribe](t, sc1)
	sc1.send(t, &frames.Reconnect{AfterMs: 0, Reason: frames.ReasonDrain})
	sc2 := s.next(t)
	recv(t, ctx, hooked)
	sc2.ws.CloseNow()
	waitEvents(t, rec, client.EventDialFailed, 1)

	sc1.send(t, &frames.Ack{Ref: add.SID}, topicSnapshot(add.SID, 0, "log:a"), insert(add.SID, 1, "x"))
	r := recv(t, ctx, done)
	noErr(t, r.err)
	if p := recv(t, ctx, r.sub.Patches()); p.LSN != lsnOf(1) {
		t.Fatalf("patch %+v, want lsn %s", p, lsnOf(1))
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.frames) != 0 {
		t.Fatalf("OnFrame got %+v, want nothing", rec.frames)
	}
}

// noBackoff makes o's scheduled reconnects go at once and any backoff
// wait last until the test ends, so that a failed take-over leaves the
// Client where it is.
func noBackoff(o *client.Options) {
	o.Rand = func(n int64) int64 { return n - 1 }
	o.Sleep = func(ctx context.Context, d time.Duration) error {
		if d > 0 {
			<-ctx.Done()
		}
		return ctx.Err()
	}
}

// A Close while a take-over waits for the new connection's resubscribe
// snapshots interrupts it: the new connection did not take over, and no
// EventResumed says it did.
func TestReconnect_TakeOver_CloseWhileWaitingForSnapshots(t *testing.T) {
	ctx, rec, c, s, sc1 := startScripted(t)
	subscribeScripted(t, ctx, c, sc1, nil)
	sc1.send(t, &frames.Reconnect{AfterMs: 0, Reason: frames.ReasonDrain})
	sc2 := s.next(t)
	expect[*frames.Subscribe](t, sc2) // the resubscribe, never answered
	noErr(t, c.Close())
	if n := rec.count(client.EventResumed); n != 0 {
		t.Fatalf("%d EventResumed after Close interrupted the take-over, want 0", n)
	}
}

// A take-over whose new connection does not answer every resubscribe
// within takeOverWait goes on: the old connection is closed, and
// EventResumed says, in Err, that not every subscription is live on the
// new one. The one not answered goes live when it is. (It waits out the
// 10 s: takeOverWait is a constant.)
func TestReconnect_TakeOver_SnapshotsTimeOut(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out takeOverWait")
	}
	s := newScripted(t)
	ctx := testCtx(t)
	rec := newRecorder()
	o := rec.options()
	resumed := make(chan client.Event, 1)
	onEvent := o.OnEvent
	o.OnEvent = func(e client.Event) {
		onEvent(e)
		if e.Kind == client.EventResumed {
			resumed <- e
		}
	}
	noBackoff(o)
	c, err := client.Dial(ctx, s.url(), o)
	noErr(t, err)
	t.Cleanup(func() { c.Close() })
	sc1 := s.next(t)
	a := subscribeScripted(t, ctx, c, sc1, nil)
	b := subscribeScripted(t, ctx, c, sc1, rec.handler(t))

	sc1.send(t, &frames.Reconnect{AfterMs: 0, Reason: frames.ReasonDrain})
	sc2 := s.next(t)
	adds := map[string]*frames.Subscribe{}
	for range 2 {
		add := expect[*frames.Subscribe](t, sc2)
		adds[add.SID] = add
	}
	// a is answered; b is not, until the take-over has given up waiting.
	sc2.send(t, &frames.Ack{Ref: a.SID()}, topicSnapshot(a.SID(), 0, "log:a"))
	var e client.Event
	select {
	case e = <-resumed:
	case <-time.After(client.TakeOverWaitForTest + 10*time.Second):
		t.Fatal("no EventResumed after the take-over's wait")
	}
	if !errors.Is(e.Err, context.DeadlineExceeded) {
		t.Fatalf("EventResumed.Err = %v, want one that wraps context.DeadlineExceeded", e.Err)
	}
	if !strings.Contains(e.Err.Error(), "1 subscription(s)") {
		t.Fatalf("EventResumed.Err = %v, want it to count 1 subscription", e.Err)
	}
	// b goes live on the new connection when it is answered.
	if adds[b.SID()] == nil {
		t.Fatalf("no resubscribe of b: %v", adds)
	}
	sc2.send(t, &frames.Ack{Ref: b.SID()}, topicSnapshot(b.SID(), 0, "log:a"), insert(b.SID(), 1, "b1"))
	rec.waitData(t, 1)
}

// startTakeOver reads the mutate in flight on sc1, has the server drain
// it, and returns that mutate and the new connection once the take-over
// has begun: it then waits for the mutate's ack on sc1.
func startTakeOver(t *testing.T, rec *recorder, s *scripted, sc1 *scriptConn) (*frames.Mutate, *scriptConn) {
	t.Helper()
	m0 := expect[*frames.Mutate](t, sc1)
	sc1.send(t, &frames.Reconnect{AfterMs: 0, Reason: frames.ReasonDrain})
	sc2 := s.next(t)
	waitEvents(t, rec, client.EventConnected, 1)
	return m0, sc2
}
