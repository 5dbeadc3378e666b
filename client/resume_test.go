package client_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/syncgate/syncgate/client"
	"github.com/syncgate/syncgate/frames"
)

// A resume the server cannot serve because it could not read the topic's
// log is answered X_INTERNAL (ref = the sid) and close 1011: "reconnect
// and resume again" (docs/protocol.md §6.5). The subscription is not
// refused: the next connection resumes it from its cursor.
func TestSubscription_ResumeInternalErrorResumesAgain(t *testing.T) {
	s := newScripted(t)
	ctx := testCtx(t)
	rec := newRecorder()
	o := rec.options()
	o.Rand = func(int64) int64 { return 0 } // no backoff wait
	c, err := client.Dial(ctx, s.url(), o)
	noErr(t, err)
	t.Cleanup(func() { c.Close() })
	sc1 := s.next(t)
	sub := subscribeScripted(t, ctx, c, sc1, rec.handler(t))
	sid := sub.SID()
	sc1.send(t, insert(sid, 1, "one"))
	rec.waitData(t, 1)
	sc1.ws.CloseNow() // an unscheduled end

	sc2 := s.next(t)
	resume := expect[*frames.Subscribe](t, sc2)
	if cur := resume.Target.Cursor; cur == nil || cur.LSN != lsnOf(1) {
		t.Fatalf("resume cursor %+v, want %s", resume.Target.Cursor, lsnOf(1))
	}
	sc2.send(t, &frames.Ack{Ref: sid, Error: &frames.ErrorBody{Code: frames.CodeInternal,
		Cause: "the server could not read the topic's log", Fix: "reconnect and resume from your cursor"}})
	_ = sc2.ws.Close(websocket.StatusInternalError, "log failed")

	sc3 := s.next(t)
	again := expect[*frames.Subscribe](t, sc3)
	if again.SID != sid || again.Target.Cursor == nil || again.Target.Cursor.LSN != lsnOf(1) {
		t.Fatalf("second resume %+v, want sid %s from %s", again, sid, lsnOf(1))
	}
	sc3.send(t, &frames.Ack{Ref: sid}, topicSnapshot(sid, 1, "log:a"), insert(sid, 2, "two"))
	if got := rec.waitData(t, 2); strings.Join(got, ",") != "one,two" {
		t.Fatalf("handler saw %v", got)
	}
	if n := rec.count(client.EventSubscriptionFailed); n != 0 {
		t.Fatalf("%d EventSubscriptionFailed, want none", n)
	}
}

// A first subscribe answered X_CURSOR_EXPIRED whose connection ends
// before the snapshot is sent again from the caller's cursor on the next
// connection. If that one resumes it cleanly, nothing was lost:
// CursorExpired reports the answer the subscription went live with, not
// the first connection's.
func TestSubscription_CursorExpiredThenCleanResume(t *testing.T) {
	s := newScripted(t)
	ctx := testCtx(t)
	o := newRecorder().options()
	o.Rand = func(int64) int64 { return 0 } // no backoff wait
	c, err := client.Dial(ctx, s.url(), o)
	noErr(t, err)
	t.Cleanup(func() { c.Close() })
	sc1 := s.next(t)

	cur := &frames.Cursor{QID: "topic:p:t", LSN: lsnOf(5), Digest: "log:a", IDs: []string{}}
	type result struct {
		sub *client.Subscription
		err error
	}
	done := make(chan result, 1)
	go func() {
		sub, err := c.Subscribe(ctx, "p:t", cur, nil)
		done <- result{sub, err}
	}()
	add := expect[*frames.Subscribe](t, sc1)
	// The ack, then the connection ends before the snapshot.
	sc1.send(t, cursorExpired(add.SID))
	sc1.ws.CloseNow()

	sc2 := s.next(t)
	again := expect[*frames.Subscribe](t, sc2)
	if again.Target.Cursor == nil || again.Target.Cursor.LSN != lsnOf(5) {
		t.Fatalf("resubscribe %+v, want from %s", again.Target.Cursor, lsnOf(5))
	}
	sc2.send(t, &frames.Ack{Ref: again.SID}, topicSnapshot(again.SID, 5, "log:a"))
	r := <-done
	noErr(t, r.err)
	equal(t, "CursorExpired", r.sub.CursorExpired(), false)
}

// waitEvents waits until rec has seen n events of kind k.
func waitEvents(t *testing.T, rec *recorder, k client.EventKind, n int) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for rec.count(k) < n {
		select {
		case <-deadline:
			t.Fatalf("%d %s events, want %d", rec.count(k), k, n)
		case <-tick.C:
		}
	}
}

// A take-over whose new connection ends after it became current but before
// the subscriptions are live on it leaves the old connection, which still
// carries them, delivering until a later connection takes over: it is not
// closed, as if the take-over had succeeded.
func TestSubscription_FailedTakeOverKeepsOld(t *testing.T) {
	s := newScripted(t)
	ctx := testCtx(t)
	rec := newRecorder()
	o := rec.options()
	// The scheduled reconnect goes at once; the backoff after the failed
	// take-over waits for gate.
	gate := make(chan struct{})
	o.Rand = func(n int64) int64 { return n - 1 }
	o.Sleep = func(ctx context.Context, d time.Duration) error {
		if d > 0 {
			select {
			case <-gate:
			case <-ctx.Done():
			}
		}
		return ctx.Err()
	}
	c, err := client.Dial(ctx, s.url(), o)
	noErr(t, err)
	t.Cleanup(func() { c.Close() })
	sc1 := s.next(t)
	sub := subscribeScripted(t, ctx, c, sc1, rec.handler(t))
	sid := sub.SID()
	sc1.send(t, insert(sid, 1, "one"))
	rec.waitData(t, 1)

	sc1.send(t, &frames.Reconnect{AfterMs: 0, Reason: frames.ReasonDrain})
	sc2 := s.next(t)
	expect[*frames.Subscribe](t, sc2)
	// A publish waits for the send lock the take-over holds, then goes
	// to the current connection: its arrival on sc2 shows sc2 is current.
	acked := make(chan error, 1)
	noErr(t, c.PublishAsync(ctx, "p:t", json.RawMessage(`1`), func(_ string, err error) { acked <- err }))
	m := expect[*frames.Mutate](t, sc2)
	sc2.ws.CloseNow() // before answering the resubscribe
	waitEvents(t, rec, client.EventDisconnected, 1)
	if n := rec.count(client.EventResumed); n != 0 {
		t.Fatalf("%d EventResumed for a take-over whose connection ended first", n)
	}

	// The old connection still delivers.
	sc1.send(t, insert(sid, 2, "two"))
	if got := rec.waitData(t, 2); strings.Join(got, ",") != "one,two" {
		t.Fatalf("handler saw %v", got)
	}

	// The next connection takes over; the old one is closed then.
	close(gate)
	sc3 := s.next(t)
	resume := expect[*frames.Subscribe](t, sc3)
	if cur := resume.Target.Cursor; cur == nil || cur.LSN != lsnOf(2) {
		t.Fatalf("resume cursor %+v, want %s", resume.Target.Cursor, lsnOf(2))
	}
	again := expect[*frames.Mutate](t, sc3)
	equal(t, "re-sent seq", again.Seq, m.Seq)
	sc3.send(t, &frames.Ack{Ref: again.Key}, &frames.Ack{Ref: sid}, topicSnapshot(sid, 2, "log:a"), insert(sid, 3, "three"))
	noErr(t, recv(t, ctx, acked))
	if got := rec.waitData(t, 3); strings.Join(got, ",") != "one,two,three" {
		t.Fatalf("handler saw %v", got)
	}
	waitEvents(t, rec, client.EventResumed, 1)
	// sc1 was closed by the client: the scripted server's read ends.
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for sc1.ws.Write(ctx, websocket.MessageText, []byte(`{"type":"ack","ref":"x"}`)) == nil {
		select {
		case <-ctx.Done():
			t.Fatal("the old connection was not closed after a later take-over")
		case <-tick.C: // poll with a deadline
		}
	}
}

// Without Reconnect the mutate keys are prefixed by the session id, which
// the read loop reads for every unclaimed ack: taking it from the hello
// must not race with an ack that follows the hello at once (a token
// already past its exp is told so right after the hello).
func TestClient_AckRightAfterHello(t *testing.T) {
	ctx := testCtx(t)
	var wg sync.WaitGroup
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		wg.Add(1)
		defer wg.Done()
		defer ws.CloseNow()
		if _, _, err := ws.Read(ctx); err != nil {
			return
		}
		id := "sess"
		var msg []byte
		for _, f := range []frames.Frame{
			&frames.Hello{BuildID: "srv", SessionID: &id, Resume: []frames.Cursor{}},
			&frames.Ack{Ref: "x", Error: &frames.ErrorBody{Code: frames.CodeTokenExpired, Cause: "token: expired", Fix: "refresh"}},
		} {
			b, _ := frames.Encode(f)
			msg = append(append(msg, b...), '\n')
		}
		_ = ws.Write(ctx, websocket.MessageText, msg[:len(msg)-1])
		_, _, _ = ws.Read(ctx) // until the client closes
	}))
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
		wg.Wait()
	})
	got := make(chan frames.Frame, 1)
	c, err := client.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"), &client.Options{OnFrame: func(f frames.Frame) { got <- f }})
	noErr(t, err)
	t.Cleanup(func() { c.Close() })
	if a, ok := recv(t, ctx, got).(*frames.Ack); !ok || a.Ref != "x" {
		t.Fatalf("OnFrame got %+v", a)
	}
}
