package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/syncgate/syncgate/client"
	"github.com/syncgate/syncgate/frames"
)

// A Subscribe whose ctx ends before the server answers gives the
// subscription up, as a Phoenix join that times out leaves its channel:
// the server may still start it, so the Client queues a drop for the sid
// after the add. Nothing of it reaches OnFrame (the add's ack, snapshot
// and patches, the drop's ack), and with Reconnect it is not resubscribed
// on the next connection. The scripted server holds the answer to the add
// until the test has cancelled.
func TestClient_Subscribe_GiveUpDrops(t *testing.T) {
	for _, reconnect := range []bool{false, true} {
		t.Run(fmt.Sprintf("reconnect=%v", reconnect), func(t *testing.T) {
			s := newScripted(t)
			ctx := testCtx(t)
			rec := newRecorder()
			o := rec.options()
			o.Reconnect = reconnect
			c, err := client.Dial(ctx, s.url(), o)
			noErr(t, err)
			t.Cleanup(func() { c.Close() })
			sc := s.next(t)

			add := giveUp(t, ctx, c, sc)
			drop := expect[*frames.Subscribe](t, sc)
			if drop.Op != frames.OpDrop || drop.SID != add.SID {
				t.Fatalf("after the add the client sent %+v, want a drop of %q", drop, add.SID)
			}

			// The server had started it: its answers, then the drop's ack.
			sc.sendMarked(t, rec, &frames.Ack{Ref: add.SID}, topicSnapshot(add.SID, 0, "log:a"),
				insert(add.SID, 1, "x"), &frames.Ack{Ref: add.SID})
			rec.mu.Lock()
			got := append([]frames.Frame(nil), rec.frames...)
			rec.mu.Unlock()
			if len(got) != 1 {
				t.Fatalf("OnFrame got %d frames, want only the marker: %+v", len(got), got)
			}

			// Another subscription works; with Reconnect the next
			// connection resubscribes it and not the given-up one: the
			// mutate made after the take-over comes next there.
			sub := subscribeScripted(t, ctx, c, sc, nil)
			if sub.SID() == add.SID {
				t.Fatalf("sid %q used again", add.SID)
			}
			if !reconnect {
				return
			}
			sc.send(t, &frames.Reconnect{AfterMs: 0, Reason: frames.ReasonDrain})
			sc2 := s.next(t)
			resume := expect[*frames.Subscribe](t, sc2)
			equal(t, "resubscribed sid", resume.SID, sub.SID())
			sc2.send(t, &frames.Ack{Ref: resume.SID}, topicSnapshot(resume.SID, 0, "log:a"))
			waitEvents(t, rec, client.EventResumed, 1)
			noErr(t, c.PublishAsync(ctx, "p:t", json.RawMessage(`1`), func(string, error) {}))
			expect[*frames.Mutate](t, sc2)
		})
	}
}

// A given-up subscription's drop that the server refuses (X_INTERNAL: it
// could not drop the subscription, which stays active, and asks for the
// drop again later) is sent again after a backoff, three times in all;
// the subscription's frames stay consumed meanwhile.
func TestClient_Subscribe_GiveUpDropRefusedIsSentAgain(t *testing.T) {
	s := newScripted(t)
	ctx := testCtx(t)
	rec := newRecorder()
	o := rec.options()
	var backoffs atomic.Int32
	o.Rand = func(int64) int64 { backoffs.Add(1); return 0 } // each retry's backoff, none waited
	c, err := client.Dial(ctx, s.url(), o)
	noErr(t, err)
	t.Cleanup(func() { c.Close() })
	sc := s.next(t)

	add := giveUp(t, ctx, c, sc)
	refused := &frames.Ack{Ref: add.SID, Error: &frames.ErrorBody{Code: frames.CodeInternal,
		Cause: "the server could not drop the subscription; it is still active", Fix: "retry the drop later"}}
	sc.send(t, &frames.Ack{Ref: add.SID}, topicSnapshot(add.SID, 0, "log:a"))
	for i := range 3 {
		drop := expect[*frames.Subscribe](t, sc)
		if drop.Op != frames.OpDrop || drop.SID != add.SID {
			t.Fatalf("drop %d: the client sent %+v, want a drop of %q", i+1, drop, add.SID)
		}
		sc.send(t, insert(add.SID, i+1, "x"), refused)
	}
	// The third refusal is the last: no backoff for a fourth drop, and
	// the next frame is a mutate made now.
	sc.sendMarked(t, rec)
	equal(t, "retries", backoffs.Load(), 2)
	noErr(t, c.PublishAsync(ctx, "p:t", json.RawMessage(`1`), func(string, error) {}))
	expect[*frames.Mutate](t, sc)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.frames) != 1 {
		t.Fatalf("OnFrame got %d frames, want only the marker: %+v", len(rec.frames), rec.frames)
	}
}

// A Subscribe still waiting when a take-over re-sends its add on the new
// connection, and giving up then, drops it on the new connection (the old
// one's writes are stopped, or stop, and it is closed); the take-over does
// not wait for it.
func TestReconnect_SubscribeGiveUpDuringTakeOver(t *testing.T) {
	ctx, rec, c, s, sc1 := startScripted(t)
	cancel, errc := subscribeCancellable(ctx, c)
	defer cancel()
	add := expect[*frames.Subscribe](t, sc1)
	sc1.send(t, &frames.Reconnect{AfterMs: 0, Reason: frames.ReasonDrain})
	sc2 := s.next(t)
	resume := expect[*frames.Subscribe](t, sc2)
	equal(t, "resubscribed sid", resume.SID, add.SID)
	cancel()
	if err := recv(t, ctx, errc); !errors.Is(err, context.Canceled) {
		t.Fatalf("Subscribe = %v, want context.Canceled", err)
	}
	drop := expect[*frames.Subscribe](t, sc2)
	if drop.Op != frames.OpDrop || drop.SID != add.SID {
		t.Fatalf("after the add the new connection got %+v, want a drop of %q", drop, add.SID)
	}
	waitEvents(t, rec, client.EventResumed, 1)
	sc2.sendMarked(t, rec, &frames.Ack{Ref: add.SID}, topicSnapshot(add.SID, 0, "log:a"), &frames.Ack{Ref: add.SID})
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.frames) != 1 {
		t.Fatalf("OnFrame got %d frames, want only the marker: %+v", len(rec.frames), rec.frames)
	}
}

// subscribeCancellable subscribes c to "p:t" on another goroutine, under a
// ctx that cancel ends, and returns Subscribe's error on errc.
// giveUp starts a Subscribe on c, reads its add on sc, and cancels it
// before any answer: it returns the add once Subscribe has returned
// context.Canceled.
func giveUp(t *testing.T, ctx context.Context, c *client.Client, sc *scriptConn) *frames.Subscribe {
	t.Helper()
	cancel, errc := subscribeCancellable(ctx, c)
	defer cancel()
	add := expect[*frames.Subscribe](t, sc)
	cancel()
	if err := recv(t, ctx, errc); !errors.Is(err, context.Canceled) {
		t.Fatalf("Subscribe = %v, want context.Canceled", err)
	}
	return add
}

func subscribeCancellable(ctx context.Context, c *client.Client) (cancel context.CancelFunc, errc <-chan error) {
	sctx, cancel := context.WithCancel(ctx)
	ch := make(chan error, 1)
	go func() {
		_, err := c.Subscribe(sctx, "p:t", nil, nil)
		ch <- err
	}()
	return cancel, ch
}
