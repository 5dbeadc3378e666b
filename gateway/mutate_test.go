package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/syncgate/syncgate/fanout"
	"github.com/syncgate/syncgate/frames"
	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/internal/gwtest"
)

func TestGateway_RetriedSeqGetsFirstAckAndPublishesOnce(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{})
	sub := gwtest.Dial(t, srv.url, nil)
	sub.Hello("", 0)
	sub.Subscribe("s", "t")

	pub := gwtest.Dial(t, srv.url, nil)
	pub.Hello("browser-1", 0)
	first := pub.Publish("k0", 0, "t", `1`)
	again := pub.Publish("k0", 0, "t", `1`)
	if first.Error != nil || again.Error != nil || *again.LSN != *first.LSN || again.Ref != "k0" {
		t.Fatalf("first %+v, retry %+v", first, again)
	}
	// The same key under the next seq is the same mutation: same ack.
	sameKey := pub.Publish("k0", 1, "t", `1`)
	if sameKey.Error != nil || *sameKey.LSN != *first.LSN {
		t.Fatalf("same key, next seq: %+v", sameKey)
	}
	next := pub.Publish("k2", 2, "t", `2`)
	if next.Error != nil || *next.LSN <= *first.LSN {
		t.Fatalf("next: %+v", next)
	}
	// A reconnect of the same client (same clientId and epoch) continues
	// the producer: a retry of seq 2 is still answered from the record.
	pub2 := gwtest.Dial(t, srv.url, nil)
	pub2.Hello("browser-1", 0)
	if r := pub2.Publish("k2", 2, "t", `2`); r.Error != nil || *r.LSN != *next.LSN {
		t.Fatalf("retry after reconnect: %+v", r)
	}
	// An answered seq under another key is no retry (a client that kept
	// its clientId but lost its seq): refused under its own key, with the
	// seq's key named, and not applied.
	if r := pub2.Publish("other", 2, "t", `"lost"`); r.Ref != "other" || r.Error == nil || r.Error.Code != frames.CodeSeqReused ||
		!strings.Contains(r.Error.Cause, `"k2"`) {
		t.Fatalf("seq 2 under another key: %+v", r)
	}
	gap := pub2.Publish("k9", 9, "t", `9`)
	if gap.Error == nil || gap.Error.Code != frames.CodeSeqGap {
		t.Fatalf("gap: %+v", gap)
	}
	if r := pub2.Publish("k3", 3, "t", `3`); r.Error != nil {
		t.Fatalf("seq 3 after a refused gap: %+v", r.Error)
	}
	// The subscriber saw exactly three messages: 1, 2, 3.
	for _, want := range []string{*first.LSN, *next.LSN} {
		if p := gwtest.Expect[*frames.Patch](sub); p.LSN != want {
			t.Fatalf("patch lsn %s, want %s", p.LSN, want)
		}
	}
	if p := gwtest.Expect[*frames.Patch](sub); string(p.Patches[0].Row) == "" || p.LSN <= *next.LSN {
		t.Fatalf("third patch %+v", p)
	}
}

func TestGateway_EpochFencing(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{})
	old := gwtest.Dial(t, srv.url, nil)
	old.Hello("app", 1)
	if r := old.Publish("a", 0, "t", `1`); r.Error != nil {
		t.Fatal(r.Error)
	}
	newer := gwtest.Dial(t, srv.url, nil)
	newer.Hello("app", 2)
	if r := newer.Publish("b", 0, "t", `1`); r.Error != nil {
		t.Fatalf("new epoch starts at seq 0: %+v", r.Error)
	}
	if r := old.Publish("c", 1, "t", `1`); r.Error == nil || r.Error.Code != frames.CodeEpochFenced {
		t.Fatalf("old epoch: %+v", r)
	}
	stale := gwtest.Dial(t, srv.url, nil)
	stale.Hello("app", 0)
	if r := stale.Publish("d", 0, "t", `1`); r.Error == nil || r.Error.Code != frames.CodeEpochFenced {
		t.Fatalf("lower epoch: %+v", r)
	}
}

func TestGateway_ForgottenSeq(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{ProducerWindow: 4})
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("", 0)
	for i := range 6 {
		if r := c.Publish(string(rune('a'+i)), int64(i), "t", `1`); r.Error != nil {
			t.Fatal(r.Error)
		}
	}
	if r := c.Publish("a", 0, "t", `1`); r.Error == nil || r.Error.Code != frames.CodeSeqForgotten {
		t.Fatalf("retry beyond the window: %+v", r)
	}
	if r := c.Publish("c", 2, "t", `1`); r.Error != nil {
		t.Fatalf("retry inside the window: %+v", r.Error)
	}
}

func TestGateway_DropStopsPatches(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{})
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("", 0)
	c.Subscribe("a", "t")
	c.Subscribe("b", "u")
	c.Send(&frames.Subscribe{Op: frames.OpDrop, SID: "a", Target: frames.Target{Kind: frames.TargetTopic, Topic: "t"}})
	if ack := gwtest.Expect[*frames.Ack](c); ack.Ref != "a" || ack.Error != nil {
		t.Fatalf("drop ack %+v", ack)
	}
	c.Publish("k0", 0, "t", `"dropped"`)
	c.Publish("k1", 1, "u", `"kept"`)
	// The only patch is for b: had a's arrived, it would come first.
	if p := gwtest.Expect[*frames.Patch](c); p.SID != "b" {
		t.Fatalf("patch after drop: %+v", p)
	}
	// The sid is free again.
	c.Subscribe("a", "t")
}

func TestGateway_CursorOnEphemeralTopic(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{})
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("", 0)
	c.Send(&frames.Subscribe{Op: frames.OpAdd, SID: "r", Target: frames.Target{Kind: frames.TargetTopic, Topic: "t",
		Cursor: &frames.Cursor{QID: "topic:t", LSN: frames.FormatOffset(1, 7), IDs: []string{}}}})
	ack := gwtest.Expect[*frames.Ack](c)
	if ack.Ref != "r" || ack.Error == nil || ack.Error.Code != frames.CodeCursorExpired {
		t.Fatalf("ack = %+v", ack)
	}
	snap := gwtest.Expect[*frames.Snapshot](c)
	if snap.SID != "r" {
		t.Fatalf("snapshot = %+v", snap)
	}
	c.Publish("k", 0, "t", `1`)
	if p := gwtest.Expect[*frames.Patch](c); p.SID != "r" || p.LSN <= snap.Cursor.LSN {
		t.Fatalf("patch = %+v", p)
	}
}

func TestGateway_SidInUseAndSubscriptionLimit(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{MaxSubscriptions: 2})
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("", 0)
	c.Subscribe("a", "t1")
	add := func(sid, topic string) *frames.Ack {
		c.Send(&frames.Subscribe{Op: frames.OpAdd, SID: sid, Target: frames.Target{Kind: frames.TargetTopic, Topic: topic}})
		return gwtest.Expect[*frames.Ack](c)
	}
	if ack := add("a", "t2"); ack.Error == nil || ack.Error.Code != frames.CodeSIDInUse {
		t.Fatalf("sid in use: %+v", ack)
	}
	c.Subscribe("b", "t2")
	if ack := add("c", "t3"); ack.Error == nil || ack.Error.Code != frames.CodeTooManySubs {
		t.Fatalf("limit: %+v", ack)
	}
}

// failingTransport is a real Hub whose Publish fails while fail is set: a
// fault the in-process hub cannot otherwise produce (a NATS transport
// will, when its connection drops).
type failingTransport struct {
	*fanout.Hub
	fail atomic.Bool
}

func (f *failingTransport) Publish(ctx context.Context, topic string, data []byte) error {
	if f.fail.Load() {
		return errors.New("injected publish failure")
	}
	return f.Hub.Publish(ctx, topic, data)
}

// A mutate that failed because the server did (X_INTERNAL) is recorded
// like any outcome: a retry of its seq gets the same answer and runs
// nothing, and the next seq runs (the producer is not left waiting for a
// seq the client has been answered for).
func TestGateway_InternalErrorIsRecorded(t *testing.T) {
	t.Parallel()
	hub := fanout.NewHub(fanout.HubConfig{})
	t.Cleanup(func() { _ = hub.Close() })
	tr := &failingTransport{Hub: hub}
	srv := newTestServer(t, gateway.Config{Transport: tr})
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("", 0)
	tr.fail.Store(true)
	if r := c.Publish("k", 0, "t", `1`); r.Error == nil || r.Error.Code != frames.CodeInternal {
		t.Fatalf("failing publish: %+v", r)
	}
	tr.fail.Store(false)
	if r := c.Publish("k", 0, "t", `1`); r.Error == nil || r.Error.Code != frames.CodeInternal {
		t.Fatalf("retry of the failed seq: %+v, want the recorded X_INTERNAL", r)
	}
	if r := c.Publish("k1", 1, "t", `1`); r.Error != nil || r.LSN == nil {
		t.Fatalf("next seq after the failure: %+v %+v", r, r.Error)
	}
}

func TestGateway_IdentifierLengthLimits(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{})
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("", 0)
	ok, long := strings.Repeat("s", 256), strings.Repeat("s", 257)
	c.Subscribe(ok, "t")
	c.Send(&frames.Subscribe{Op: frames.OpAdd, SID: long, Target: frames.Target{Kind: frames.TargetTopic, Topic: "t"}})
	if ack := gwtest.Expect[*frames.Ack](c); ack.Error == nil || ack.Error.Code != frames.CodeBadField || ack.Ref != "" {
		t.Fatalf("257-byte sid: %+v", ack)
	}
	if r := c.Publish(ok, 0, "t", `1`); r.Error != nil {
		t.Fatalf("256-byte key: %+v", r.Error)
	}
	gwtest.Expect[*frames.Patch](c)
	c.Send(&frames.Mutate{Key: long, Seq: 1, Name: "publish", Input: []byte(`{"topic":"t","data":1}`)})
	if ack := gwtest.Expect[*frames.Ack](c); ack.Error == nil || ack.Error.Code != frames.CodeBadField {
		t.Fatalf("257-byte key: %+v", ack)
	}
	c.Send(&frames.Mutate{Key: "k", Seq: 1, Name: long, Input: []byte(`{}`)})
	if ack := gwtest.Expect[*frames.Ack](c); ack.Error == nil || ack.Error.Code != frames.CodeBadField || ack.Ref != "k" {
		t.Fatalf("257-byte name: %+v", ack)
	}
}

// TestGateway_DropByQueryTarget: a drop is by sid whatever the target says.
func TestGateway_DropByQueryTarget(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{})
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("", 0)
	c.Subscribe("a", "t")
	c.Subscribe("b", "u")
	c.Send(&frames.Subscribe{Op: frames.OpDrop, SID: "a", Target: frames.Target{Kind: frames.TargetQuery, QID: "q", Input: []byte(`{}`)}})
	if ack := gwtest.Expect[*frames.Ack](c); ack.Ref != "a" || ack.Error != nil {
		t.Fatalf("drop ack %+v", ack)
	}
	// Dropped, as TestGateway_DropStopsPatches checks for a topic target.
	c.Publish("k0", 0, "t", `"dropped"`)
	c.Publish("k1", 1, "u", `"kept"`)
	if p := gwtest.Expect[*frames.Patch](c); p.SID != "b" {
		t.Fatalf("patch after drop: %+v", p)
	}
	c.Subscribe("a", "t") // the sid is free again
}

// A client that published through node A, then B, then A again
// continues on A: its hello says where it stands (hello.seq), and a
// connection's first mutate, when no frame of the connection was dropped
// before it, is the lowest the client has not had answered, so A moves
// on to it even when the hello's seq was taken too early (an older
// connection still had mutates in flight). A retry of a seq A answered
// before still gets A's first ack, and a gap within a connection is
// X_SEQ_GAP.
func TestGateway_ProducerBackFromAnotherNode(t *testing.T) {
	t.Parallel()
	a := newTestServer(t, gateway.Config{})
	b := newTestServer(t, gateway.Config{})
	visit := func(srv *testServer, helloSeq, from int64) (*gwtest.Conn, *frames.Ack) {
		c := gwtest.Dial(t, srv.url, nil)
		c.Send(&frames.Hello{Resume: []frames.Cursor{}, ClientID: "app", Seq: &helloSeq})
		gwtest.Expect[*frames.Hello](c)
		var first *frames.Ack
		for seq := from; seq < from+3; seq++ {
			r := c.Publish(fmt.Sprint("k", seq), seq, "t", `1`)
			if r.Error != nil {
				t.Fatalf("seq %d: %+v", seq, r.Error)
			}
			if first == nil {
				first = r
			}
		}
		return c, first
	}
	c, firstOnA := visit(a, 0, 0)
	c.Close()
	c, _ = visit(b, 3, 3)
	c.Close()
	c, _ = visit(a, 3, 6) // the hello's seq is stale: 3, 4 and 5 were answered by B
	if r := c.Publish("k10", 10, "t", `1`); r.Error == nil || r.Error.Code != frames.CodeSeqGap {
		t.Fatalf("gap within a connection: %+v, want X_SEQ_GAP", r)
	}
	if r := c.Publish("k0", 0, "t", `1`); r.Error != nil || *r.LSN != *firstOnA.LSN {
		t.Fatalf("retry of seq 0 on A: %+v, want A's first ack %s", r, *firstOnA.LSN)
	}
}

// A frame that cannot be decoded may have been a mutate: the connection's
// next mutate is then not taken for its first, and a seq beyond the one
// expected is X_SEQ_GAP rather than run ahead of the broken one.
func TestGateway_ProducerAfterUndecodableFrame(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{})
	c := gwtest.Dial(t, srv.url, nil)
	three := int64(3)
	c.Send(&frames.Hello{Resume: []frames.Cursor{}, ClientID: "app", Seq: &three})
	gwtest.Expect[*frames.Hello](c)
	c.SendRaw(`{"type":"mutate","v":1,"key":"k3","seq":3,`) // cut short
	if ack := gwtest.Expect[*frames.Ack](c); ack.Error == nil || ack.Error.Code != frames.CodeBadFrame {
		t.Fatalf("broken frame: %+v", ack)
	}
	if r := c.Publish("k4", 4, "t", `4`); r.Error == nil || r.Error.Code != frames.CodeSeqGap {
		t.Fatalf("seq 4 after a broken frame: %+v, want X_SEQ_GAP", r)
	}
	if r := c.Publish("k3", 3, "t", `3`); r.Error != nil {
		t.Fatalf("seq 3 sent again: %+v", r.Error)
	}
}

// TestGateway_IdleProducerBytes: the records of producers with no session
// are bounded in bytes node-wide. Over the budget the longest idle is
// forgotten (its client's retry of an old seq gets X_SEQ_FORGOTTEN), a
// newer one is still answered from its record, and a connected client's
// record is never forgotten.
func TestGateway_IdleProducerBytes(t *testing.T) {
	t.Parallel()
	// visit connects as clientID, publishes once (seq 0) and sends seven
	// mutates that each earn an error with long texts (seqs 1-7).
	visit := func(srv *testServer, clientID string) (*gwtest.Conn, *frames.Ack) {
		c := gwtest.Dial(t, srv.url, nil)
		c.Hello(clientID, 0)
		first := c.Publish("k0", 0, "t", `1`)
		if first.Error != nil {
			t.Fatalf("%s: %+v", clientID, first.Error)
		}
		for seq := int64(1); seq < 8; seq++ {
			key := fmt.Sprintf("%0256d", seq)
			c.Send(&frames.Mutate{Key: key, Seq: seq, Name: strings.Repeat("n", 256), Input: []byte(`{}`)})
			if ack := c.AwaitAck(key); ack.Error == nil || ack.Error.Code != frames.CodeUnknownMutation {
				t.Fatalf("%s seq %d: %+v", clientID, seq, ack)
			}
		}
		return c, first
	}
	metric := func(srv *testServer, name string) float64 { return metricValue(t, scrape(t, srv.ts.URL), name) }
	const (
		idleBytes   = "syncgate_producers_idle_bytes"
		forgotBytes = `syncgate_producers_forgotten_total{reason="idle_bytes"}`
	)
	// One such record's size, measured on a node without a budget.
	probe := newTestServer(t, gateway.Config{MaxIdleProducerBytes: -1})
	c, _ := visit(probe, "p")
	c.Close()
	gwtest.Eventually(t, gwtest.Timeout, "the probe's record is idle", func() bool { return metric(probe, idleBytes) > 0 })
	size := metric(probe, idleBytes)

	// Room for one idle record, not two.
	srv := newTestServer(t, gateway.Config{MaxIdleProducerBytes: int64(size * 1.5)})
	live, liveFirst := visit(srv, "l") // stays connected throughout
	c, _ = visit(srv, "a")
	c.Close()
	gwtest.Eventually(t, gwtest.Timeout, "a's record is idle", func() bool { return metric(srv, idleBytes) > 0 })
	c, bFirst := visit(srv, "b")
	c.Close()
	gwtest.Eventually(t, gwtest.Timeout, "a's record is forgotten", func() bool { return metric(srv, forgotBytes) == 1 })
	if b := metric(srv, idleBytes); b <= 0 || b > size*1.5 {
		t.Fatalf("idle bytes %v, want one record's (%v)", b, size)
	}

	// Each client comes back past its eight seqs and retries seq 0.
	retry := func(clientID string) *frames.Ack {
		c := gwtest.Dial(t, srv.url, nil)
		eight := int64(8)
		c.Send(&frames.Hello{Resume: []frames.Cursor{}, ClientID: clientID, Seq: &eight})
		gwtest.Expect[*frames.Hello](c)
		return c.Publish("k0", 0, "t", `1`)
	}
	if r := retry("a"); r.Error == nil || r.Error.Code != frames.CodeSeqForgotten {
		t.Fatalf("a, forgotten: retry of seq 0 = %+v, want X_SEQ_FORGOTTEN", r)
	}
	if r := retry("b"); r.Error != nil || *r.LSN != *bFirst.LSN {
		t.Fatalf("b, remembered: retry of seq 0 = %+v, want its first ack %s", r, *bFirst.LSN)
	}
	if r := live.Publish("k0", 0, "t", `1`); r.Error != nil || *r.LSN != *liveFirst.LSN {
		t.Fatalf("the connected client's retry of seq 0 = %+v, want its first ack %s", r, *liveFirst.LSN)
	}
	if n := metric(srv, forgotBytes); n != 1 {
		t.Fatalf("%v records forgotten for the budget, want 1 (a)", n)
	}
}

// A mutate refused for a key or name over its length limit, or for coming
// before hello, never reaches the producer either (an over-long key
// refused, the client cannot even match the answer): as after an
// undecodable frame, the connection's next mutate is not taken for its
// first, and a seq beyond the one expected is X_SEQ_GAP rather than run
// ahead of the refused one.
func TestGateway_ProducerAfterRefusedMutate(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("k", 257)
	for _, tt := range []struct {
		name        string
		m           *frames.Mutate
		beforeHello bool
		code        frames.Code
	}{
		{"long key", &frames.Mutate{Key: long, Seq: 3, Name: "publish", Input: []byte(`{"topic":"t","data":3}`)}, false, frames.CodeBadField},
		{"long name", &frames.Mutate{Key: "k3", Seq: 3, Name: long, Input: []byte(`{}`)}, false, frames.CodeBadField},
		{"before hello", &frames.Mutate{Key: "k3", Seq: 3, Name: "publish", Input: []byte(`{"topic":"t","data":3}`)}, true, frames.CodeHelloRequired},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := newTestServer(t, gateway.Config{})
			c := gwtest.Dial(t, srv.url, nil)
			refused := func() {
				c.Send(tt.m)
				if ack := gwtest.Expect[*frames.Ack](c); ack.Error == nil || ack.Error.Code != tt.code {
					t.Fatalf("refused mutate: %+v, want %s", ack, tt.code)
				}
			}
			if tt.beforeHello {
				refused()
			}
			three := int64(3)
			c.Send(&frames.Hello{Resume: []frames.Cursor{}, ClientID: "app", Seq: &three})
			gwtest.Expect[*frames.Hello](c)
			if !tt.beforeHello {
				refused()
			}
			if r := c.Publish("k4", 4, "t", `4`); r.Error == nil || r.Error.Code != frames.CodeSeqGap {
				t.Fatalf("seq 4 after a refused mutate: %+v, want X_SEQ_GAP", r)
			}
			if r := c.Publish("k3", 3, "t", `3`); r.Error != nil {
				t.Fatalf("seq 3 sent again: %+v", r.Error)
			}
		})
	}
}

// TestGateway_RetryOfLastSeq: seq is any integer >= 0 in the signed 64-bit
// range, so a client may send 2^63-1. Its retry gets its first ack. The
// producer's next expected seq used to wrap to -2^63 after it, so the
// retry got X_SEQ_GAP ("expected -9223372036854775808").
func TestGateway_RetryOfLastSeq(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{})
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("app", 0)
	first := c.Publish("k", math.MaxInt64, "t", `1`)
	if first.Error != nil {
		t.Fatalf("seq 2^63-1: %+v", first.Error)
	}
	if r := c.Publish("k", math.MaxInt64, "t", `1`); r.Error != nil || *r.LSN != *first.LSN {
		t.Fatalf("retry of seq 2^63-1: %+v %+v, want its first ack %s", r, r.Error, *first.LSN)
	}
}

// unsubFailingTransport is a real Hub whose Unsubscribe fails while fail
// is set, as a transport over a network may (the Transport contract
// allows it; the Hub never fails).
type unsubFailingTransport struct {
	*fanout.Hub
	fail atomic.Bool
}

func (f *unsubFailingTransport) Unsubscribe(ctx context.Context, topic string, s fanout.Subscriber) error {
	if f.fail.Load() {
		return errors.New("injected unsubscribe failure")
	}
	return f.Hub.Unsubscribe(ctx, topic, s)
}

// A drop the transport could not carry out is not acked as done: the
// subscription, still registered with the transport, stays the session's
// (X_INTERNAL), so no patch follows a successful drop ack, the drop can be
// sent again, and the session's close unsubscribes it.
func TestGateway_DropThatFailsStaysSubscribed(t *testing.T) {
	t.Parallel()
	hub := fanout.NewHub(fanout.HubConfig{})
	t.Cleanup(func() { _ = hub.Close() })
	tr := &unsubFailingTransport{Hub: hub}
	srv := newTestServer(t, gateway.Config{Transport: tr})
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("", 0)
	c.Subscribe("a", "t")
	drop := func() *frames.Ack {
		t.Helper()
		c.Send(&frames.Subscribe{Op: frames.OpDrop, SID: "a", Target: frames.Target{Kind: frames.TargetTopic, Topic: "t"}})
		return gwtest.Expect[*frames.Ack](c)
	}
	tr.fail.Store(true)
	if ack := drop(); ack.Ref != "a" || ack.Error == nil || ack.Error.Code != frames.CodeInternal {
		t.Fatalf("drop the transport refused: %+v %+v, want X_INTERNAL", ack, ack.Error)
	}
	// Still subscribed: a's patch comes (before the ack on an ephemeral
	// topic), and a second add of the sid is refused.
	if r := c.Publish("k0", 0, "t", `1`); r.Error != nil {
		t.Fatal(r.Error)
	}
	if p := gwtest.Expect[*frames.Patch](c); p.SID != "a" {
		t.Fatalf("patch %+v", p)
	}
	c.Send(&frames.Subscribe{Op: frames.OpAdd, SID: "a", Target: frames.Target{Kind: frames.TargetTopic, Topic: "t"}})
	if ack := gwtest.Expect[*frames.Ack](c); ack.Error == nil || ack.Error.Code != frames.CodeSIDInUse {
		t.Fatalf("add of a sid whose drop failed: %+v %+v, want X_SID_IN_USE", ack, ack.Error)
	}
	// The session's close unsubscribes it, failing transport or not once
	// it works again.
	tr.fail.Store(false)
	c.Close()
	gwtest.Eventually(t, gwtest.Timeout, "the closed session's subscription unsubscribed", func() bool {
		return hub.Subscribers("t") == 0
	})

	// Dropped again once the transport works: acked, and no patch after.
	d := gwtest.Dial(t, srv.url, nil)
	d.Hello("", 0)
	d.Subscribe("a", "t")
	d.Subscribe("b", "u")
	tr.fail.Store(true)
	d.Send(&frames.Subscribe{Op: frames.OpDrop, SID: "a", Target: frames.Target{Kind: frames.TargetTopic, Topic: "t"}})
	if ack := gwtest.Expect[*frames.Ack](d); ack.Error == nil || ack.Error.Code != frames.CodeInternal {
		t.Fatalf("drop the transport refused: %+v", ack)
	}
	tr.fail.Store(false)
	d.Send(&frames.Subscribe{Op: frames.OpDrop, SID: "a", Target: frames.Target{Kind: frames.TargetTopic, Topic: "t"}})
	if ack := gwtest.Expect[*frames.Ack](d); ack.Ref != "a" || ack.Error != nil {
		t.Fatalf("drop again: %+v %+v", ack, ack.Error)
	}
	d.Publish("k0", 0, "t", `"dropped"`)
	d.Publish("k1", 1, "u", `"kept"`)
	if p := gwtest.Expect[*frames.Patch](d); p.SID != "b" {
		t.Fatalf("patch after the drop's ack: %+v", p)
	}
	if n := hub.Subscribers("t"); n != 0 {
		t.Fatalf("%d subscribers of t left in the transport after the drop", n)
	}
}

// TestGateway_UnsubscribeFailingAtClose: an Unsubscribe the transport
// fails at the session's close (the subscription may stay registered
// there) is logged at warn with its topic and counted in
// syncgate_unsubscribes_failed_total, and does not stop the session's
// other unsubscribes. They used to be ignored.
func TestGateway_UnsubscribeFailingAtClose(t *testing.T) {
	t.Parallel()
	hub := fanout.NewHub(fanout.HubConfig{})
	t.Cleanup(func() { _ = hub.Close() })
	tr := &unsubFailingTransport{Hub: hub}
	logs := &syncBuffer{}
	srv := newTestServer(t, gateway.Config{Transport: tr, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("", 0)
	c.Subscribe("a", "topic-a")
	c.Subscribe("b", "topic-b")
	tr.fail.Store(true)
	c.Close()
	gwtest.Eventually(t, gwtest.Timeout, "the closed session unregistered", func() bool {
		return metricValue(t, scrape(t, srv.ts.URL), "syncgate_sessions") == 0
	})
	if got := metricValue(t, scrape(t, srv.ts.URL), "syncgate_unsubscribes_failed_total"); got != 2 {
		t.Errorf("syncgate_unsubscribes_failed_total %v, want 2 (both subscriptions tried)", got)
	}
	out := logs.String()
	for _, topic := range []string{"topic-a", "topic-b"} {
		if !strings.Contains(out, "level=WARN") || !strings.Contains(out, "topic="+topic) {
			t.Errorf("no warning names %s:\n%s", topic, out)
		}
	}
}
