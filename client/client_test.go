package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/syncgate/syncgate/client"
	"github.com/syncgate/syncgate/frames"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testCtx bounds a test so that a bug fails it instead of hanging it.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// dial connects to fs and closes the client when the test ends.
func dial(t *testing.T, fs *fakeServer, opts *client.Options) *client.Client {
	t.Helper()
	c, err := client.Dial(testCtx(t), fs.url(), opts)
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

// recv receives one value from ch, failing the test if ctx ends first.
func recv[T any](t *testing.T, ctx context.Context, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-ctx.Done():
		t.Fatalf("waiting for %T: %v", *new(T), ctx.Err())
		panic("unreachable")
	}
}

func noErr(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("unexpected error: %v", err)
	}
}

func equal[T comparable](t *testing.T, name string, got, want T) {
	t.Helper()
	if got != want {
		t.Errorf("%s = %v, want %v", name, got, want)
	}
}

// wantCode checks that err is a *frames.Error with code.
func wantCode(t *testing.T, err error, code frames.Code) *frames.Error {
	t.Helper()
	var fe *frames.Error
	if !errors.As(err, &fe) {
		t.Fatalf("err = %v (%T), want *frames.Error %s", err, err, code)
	}
	equal(t, "code", fe.Code, code)
	return fe
}

func wantCloseStatus(t *testing.T, err error, code websocket.StatusCode) {
	t.Helper()
	if got := websocket.CloseStatus(err); got != code {
		t.Errorf("CloseStatus(%v) = %d, want %d", err, got, code)
	}
}

func TestDial_Hello(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fs := newFakeServer(t)
	c := dial(t, fs, &client.Options{BuildID: "b1", ClientID: "cli-7", Epoch: 3, Token: "tok"})

	sent := recv(t, ctx, fs.hellos)
	equal(t, "hello.buildId", sent.BuildID, "b1")
	equal(t, "hello.token", sent.Token, "tok")
	equal(t, "hello.clientId", sent.ClientID, "cli-7")
	equal(t, "hello.epoch", sent.Epoch, 3)
	equal(t, "hello.sessionId == nil", sent.SessionID == nil, true)
	equal(t, "hello.resume != nil", sent.Resume != nil, true)

	equal(t, "SessionID", c.SessionID(), "sess-1")
	equal(t, "ServerHello.BuildID", c.ServerHello().BuildID, "server-build")
	equal(t, "ServerHello.ClientID", c.ServerHello().ClientID, "cli-7")
	equal(t, "ServerHello.Epoch", c.ServerHello().Epoch, 3)
}

func TestDial_HelloRefused(t *testing.T) {
	t.Parallel()
	fs := newFakeServer(t)
	c, err := client.Dial(testCtx(t), fs.url(), &client.Options{BuildID: "refuse"})
	if c != nil {
		t.Fatal("Dial returned a client for a refused hello")
	}
	wantCode(t, err, frames.CodeBadField)
}

func TestDial_ContextCancel(t *testing.T) {
	t.Parallel()
	fs := newFakeServer(t)
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	// The server never answers a "silent" hello; cancel once it has it.
	go func() {
		select {
		case <-fs.hellos:
			cancel()
		case <-ctx.Done():
		}
	}()
	_, err := client.Dial(ctx, fs.url(), &client.Options{BuildID: "silent"})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Dial = %v, want context.Canceled", err)
	}
}

func TestClient_Subscribe_Handler(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	c := dial(t, newFakeServer(t), nil)

	got := make(chan *frames.Patch, 16)
	sub, err := c.Subscribe(ctx, "room", nil, func(p *frames.Patch) { got <- p })
	noErr(t, err)
	equal(t, "Snapshot.SID", sub.Snapshot().SID, sub.SID())
	equal(t, "Snapshot.Cursor.QID", sub.Snapshot().Cursor.QID, "topic:room")
	equal(t, "len(Snapshot.Rows)", len(sub.Snapshot().Rows), 0)
	equal(t, "CursorExpired", sub.CursorExpired(), false)
	equal(t, "Patches() == nil", sub.Patches() == nil, true)

	var lsns []string
	for i := range 3 {
		lsn, err := c.Publish(ctx, "room", json.RawMessage(`{"n":`+string(rune('0'+i))+`}`))
		noErr(t, err)
		lsns = append(lsns, lsn)
	}
	for i, lsn := range lsns {
		p := recv(t, ctx, got)
		equal(t, "patch.sid", p.SID, sub.SID())
		equal(t, "patch.lsn", p.LSN, lsn)
		equal(t, "len(patches)", len(p.Patches), 1)
		op := p.Patches[0]
		equal(t, "op", op.Op, frames.PatchInsert)
		var row struct {
			ID   string          `json:"id"`
			Data json.RawMessage `json:"data"`
		}
		noErr(t, json.Unmarshal(op.Row, &row))
		equal(t, "row.id", row.ID, lsn)
		equal(t, "row.data", string(row.Data), `{"n":`+string(rune('0'+i))+`}`)
	}
	equal(t, "Cursor.LSN", sub.Cursor().LSN, lsns[2])
	equal(t, "Cursor.QID", sub.Cursor().QID, "topic:room")
}

func TestClient_Subscribe_Channel(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	c := dial(t, newFakeServer(t), nil)

	sub, err := c.Subscribe(ctx, "room", nil, nil)
	noErr(t, err)
	var lsns []string
	for range 3 {
		lsn, err := c.Publish(ctx, "room", json.RawMessage(`"x"`))
		noErr(t, err)
		lsns = append(lsns, lsn)
	}
	for _, lsn := range lsns {
		p := recv(t, ctx, sub.Patches())
		equal(t, "patch.lsn", p.LSN, lsn)
	}

	noErr(t, sub.Drop(ctx))
	if _, ok := <-sub.Patches(); ok {
		t.Error("Patches not closed after Drop")
	}
	noErr(t, sub.Drop(ctx)) // already dropped

	// Dropped: a publish reaches nobody, and the client stays usable.
	_, err = c.Publish(ctx, "room", json.RawMessage(`"y"`))
	noErr(t, err)
}

func TestClient_Subscribe_AckError(t *testing.T) {
	t.Parallel()
	c := dial(t, newFakeServer(t), nil)
	sub, err := c.Subscribe(testCtx(t), "forbidden", nil, nil)
	if sub != nil {
		t.Error("Subscribe returned a subscription with an error")
	}
	fe := wantCode(t, err, frames.CodeBadTopic)
	if fe.Ref == "" {
		t.Error("frames.Error.Ref is empty, want the sid")
	}
}

func TestClient_Subscribe_CursorExpired(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	c := dial(t, newFakeServer(t), nil)

	cur := &frames.Cursor{QID: "topic:eph", LSN: "0000000000000009_0000000000000000"}
	sub, err := c.Subscribe(ctx, "eph", cur, nil)
	noErr(t, err)
	equal(t, "CursorExpired", sub.CursorExpired(), true)

	lsn, err := c.Publish(ctx, "eph", json.RawMessage(`1`))
	noErr(t, err)
	p := recv(t, ctx, sub.Patches())
	equal(t, "patch.lsn", p.LSN, lsn)
}

func TestClient_Subscribe_ContextCancel(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fs := newFakeServer(t)
	c := dial(t, fs, nil)

	sctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Subscribe(sctx, "hold", nil, nil)
		errc <- err
	}()
	recv(t, ctx, fs.held)
	cancel()
	if err := recv(t, ctx, errc); !errors.Is(err, context.Canceled) {
		t.Fatalf("Subscribe = %v, want context.Canceled", err)
	}
	_, err := c.Subscribe(ctx, "room", nil, nil)
	noErr(t, err)
}

func TestClient_Publish_LSN(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	c := dial(t, newFakeServer(t), nil)

	lsn1, err := c.Publish(ctx, "room", json.RawMessage(`{"a":1}`))
	noErr(t, err)
	lsn2, err := c.Publish(ctx, "room", json.RawMessage(`{"a":2}`))
	noErr(t, err)
	if lsn1 == "" || lsn2 <= lsn1 {
		t.Errorf("lsns %q, %q: want non-empty and increasing", lsn1, lsn2)
	}
}

func TestClient_Publish_AckError(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	c := dial(t, newFakeServer(t), nil)

	lsn, err := c.Publish(ctx, "forbidden", json.RawMessage(`{}`))
	equal(t, "lsn", lsn, "")
	fe := wantCode(t, err, frames.CodeBadTopic)
	if !strings.HasPrefix(fe.Ref, c.SessionID()) {
		t.Errorf("Ref = %q, want a key prefixed with the session id %q", fe.Ref, c.SessionID())
	}

	ack, err := c.Mutate(ctx, "no-such-mutation", json.RawMessage(`{}`))
	wantCode(t, err, frames.CodeUnknownMutation)
	if ack == nil || ack.Error == nil {
		t.Errorf("Mutate ack = %+v, want the ack with its error", ack)
	}

	// Seqs kept counting through the errors: the fake checks them.
	_, err = c.Publish(ctx, "room", json.RawMessage(`{}`))
	noErr(t, err)
}

func TestClient_Publish_ContextCancel(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fs := newFakeServer(t)
	c := dial(t, fs, nil)

	pctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Publish(pctx, "hold", json.RawMessage(`{}`))
		errc <- err
	}()
	recv(t, ctx, fs.held) // the mutate is on the server, waiting for its ack
	cancel()
	if err := recv(t, ctx, errc); !errors.Is(err, context.Canceled) {
		t.Fatalf("Publish = %v, want context.Canceled", err)
	}
	_, err := c.Publish(ctx, "room", json.RawMessage(`{}`))
	noErr(t, err)
}

func TestClient_PublishAsync_InOrder(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	c := dial(t, newFakeServer(t), nil)

	const n = 500
	type result struct {
		i   int
		lsn string
		err error
	}
	// Written only by the read loop; read after finished is closed.
	var results []result
	finished := make(chan struct{})
	for i := range n {
		err := c.PublishAsync(ctx, "room", json.RawMessage(`{}`), func(lsn string, err error) {
			results = append(results, result{i, lsn, err})
			if len(results) == n {
				close(finished)
			}
		})
		noErr(t, err)
	}
	recv(t, ctx, finished)
	for k, r := range results {
		if r.err != nil || r.i != k || (k > 0 && r.lsn <= results[k-1].lsn) {
			t.Fatalf("completion %d = %+v after %+v: want call %d, no error, increasing lsn", k, r, results[max(k-1, 0)], k)
		}
	}
}

// A publish the server drops over its rate (X_RATE_LIMITED, not taken
// up) puts the connection out of step: the server runs none of the later
// ones (X_SEQ_GAP). With Reconnect the client starts over on a new
// connection, whose hello says where it stands, and sends the
// unacknowledged publishes again: all succeed, in order, without the
// caller doing anything.
func TestClient_PublishAsync_StartsOverAfterRateLimit(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fs := newFakeServer(t)
	c := dial(t, fs, &client.Options{Reconnect: true, BackoffBase: time.Millisecond})
	const n = 5
	type result struct {
		lsn string
		err error
	}
	results := make(chan result, n)
	for i := range n {
		topic := "room"
		if i == 0 {
			topic = "limited1"
		}
		noErr(t, c.PublishAsync(ctx, topic, json.RawMessage(`{}`), func(lsn string, err error) { results <- result{lsn, err} }))
	}
	var last string
	for range n {
		r := recv(t, ctx, results)
		if r.err != nil || r.lsn <= last {
			t.Fatalf("publish after %q: %+v; want success at a higher lsn", last, r)
		}
		last = r.lsn
	}
	recv(t, ctx, fs.hellos) // the first connection's
	if h := recv(t, ctx, fs.hellos); h.Seq == nil || *h.Seq != 0 {
		t.Fatalf("the second connection's hello seq = %v, want 0 (the dropped publish's)", h.Seq)
	}
}

// Without Reconnect a connection out of step ends the Client: what waits
// fails with ErrOutOfStep rather than never being answered.
func TestClient_OutOfStepEndsClient(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	c, err := client.Dial(ctx, newFakeServer(t).url(), nil)
	noErr(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_, err = c.Publish(ctx, "limited1", json.RawMessage(`{}`))
	if !errors.Is(err, client.ErrOutOfStep) {
		t.Fatalf("Publish = %v, want ErrOutOfStep", err)
	}
	<-c.Done()
	if !errors.Is(c.Err(), client.ErrOutOfStep) {
		t.Fatalf("Err = %v, want ErrOutOfStep", c.Err())
	}
}

// Data that is not JSON fails PublishAsync before anything is sent: done
// is never called, no seq is used (the fake checks the next one), and the
// client goes on publishing.
func TestClient_PublishAsync_BadData(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	c := dial(t, newFakeServer(t), nil)
	for _, bad := range []string{`{"a":`, "\"\xff\"", `1 2`} {
		err := c.PublishAsync(ctx, "room", json.RawMessage(bad), func(string, error) {
			t.Errorf("done called for %q", bad)
		})
		if !errors.Is(err, frames.ErrUnencodable) {
			t.Fatalf("PublishAsync(%q) = %v, want frames.ErrUnencodable", bad, err)
		}
	}
	lsn := make(chan string, 1)
	noErr(t, c.PublishAsync(ctx, "room", json.RawMessage(`{"ok":true}`), func(l string, err error) {
		if err != nil {
			t.Errorf("publish after the refused ones: %v", err)
		}
		lsn <- l
	}))
	if l := recv(t, ctx, lsn); l == "" {
		t.Fatal("publish after the refused ones: no lsn")
	}
}

func TestClient_PublishAsync_Concurrent(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	c := dial(t, newFakeServer(t), nil)

	const senders, each = 4, 200
	var completed atomic.Int64
	var failed atomic.Pointer[error]
	finished := make(chan struct{})
	done := func(_ string, err error) {
		if err != nil {
			failed.CompareAndSwap(nil, &err)
		}
		if completed.Add(1) == senders*each {
			close(finished)
		}
	}
	var wg sync.WaitGroup
	for range senders {
		wg.Go(func() {
			for range each {
				if err := c.PublishAsync(ctx, "room", json.RawMessage(`{}`), done); err != nil {
					t.Errorf("PublishAsync: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	recv(t, ctx, finished)
	// The fake acks a seq out of order with X_SEQ_GAP.
	if p := failed.Load(); p != nil {
		t.Fatalf("a publish failed: %v", *p)
	}
}

func TestClient_BatchedFrames(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	other := make(chan frames.Frame, 16)
	c := dial(t, newFakeServer(t), &client.Options{OnFrame: func(f frames.Frame) { other <- f }})

	// Subscribe's ack and snapshot arrive in one message.
	sub, err := c.Subscribe(ctx, "room", nil, nil)
	noErr(t, err)

	// An undecodable line in a batch is skipped; the ack after it counts.
	_, err = c.Mutate(ctx, "garbage", json.RawMessage(`{}`)) // seq 0
	noErr(t, err)

	// A reconnect batched before the ack goes to OnFrame first.
	_, err = c.Mutate(ctx, "poke", json.RawMessage(`{}`)) // seq 1
	noErr(t, err)
	select {
	case f := <-other:
		rc, ok := f.(*frames.Reconnect)
		if !ok {
			t.Fatalf("OnFrame got %T, want *frames.Reconnect", f)
		}
		equal(t, "afterMs", rc.AfterMs, 250)
	default:
		t.Fatal("OnFrame did not get the reconnect batched before the ack")
	}

	// Two frames in one client message: the server answers with two acks
	// (and a patch) in one message; acks nobody waits for go to OnFrame.
	var msg []byte
	for i, key := range []string{"raw-a", "raw-b"} {
		b, err := frames.Encode(&frames.Mutate{
			Key: key, Seq: int64(2 + i), Name: "publish",
			Input: json.RawMessage(`{"topic":"room","data":"raw"}`),
		})
		noErr(t, err)
		if i > 0 {
			msg = append(msg, '\n')
		}
		msg = append(msg, b...)
	}
	noErr(t, c.SendRaw(ctx, msg))
	for _, key := range []string{"raw-a", "raw-b"} {
		f := recv(t, ctx, other)
		ack, ok := f.(*frames.Ack)
		if !ok {
			t.Fatalf("OnFrame got %T, want *frames.Ack", f)
		}
		equal(t, "ack.ref", ack.Ref, key)
		equal(t, "ack.error == nil", ack.Error == nil, true)
	}
	for range 2 {
		p := recv(t, ctx, sub.Patches())
		equal(t, "patch.sid", p.SID, sub.SID())
	}
}

func TestClient_Close_Idempotent(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	c, err := client.Dial(ctx, newFakeServer(t).url(), nil)
	noErr(t, err)
	sub, err := c.Subscribe(ctx, "room", nil, nil)
	noErr(t, err)

	noErr(t, c.Close())
	noErr(t, c.Close())
	recv(t, ctx, c.Done())
	if !errors.Is(c.Err(), net.ErrClosed) {
		t.Errorf("Err = %v, want net.ErrClosed", c.Err())
	}
	if _, ok := <-sub.Patches(); ok {
		t.Error("Patches not closed after Close")
	}
	if _, err := c.Publish(ctx, "room", json.RawMessage(`{}`)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Publish after Close = %v, want net.ErrClosed", err)
	}
	if _, err := c.Subscribe(ctx, "room", nil, nil); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Subscribe after Close = %v, want net.ErrClosed", err)
	}
}

func TestClient_ServerClose(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fs := newFakeServer(t)
	c := dial(t, fs, nil)

	conn := recv(t, ctx, fs.conns)
	noErr(t, conn.Close(4001, "slow consumer"))
	recv(t, ctx, c.Done())
	wantCloseStatus(t, c.Err(), 4001)
}

func TestClient_PendingFailedOnDisconnect(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	fs := newFakeServer(t)
	c := dial(t, fs, nil)
	conn := recv(t, ctx, fs.conns)

	errc := make(chan error, 3)
	go func() {
		_, err := c.Publish(ctx, "hold", json.RawMessage(`{}`))
		errc <- err
	}()
	recv(t, ctx, fs.held)
	go func() {
		_, err := c.Subscribe(ctx, "hold", nil, nil)
		errc <- err
	}()
	recv(t, ctx, fs.held)
	noErr(t, c.PublishAsync(ctx, "hold", json.RawMessage(`{}`), func(_ string, err error) { errc <- err }))
	recv(t, ctx, fs.held)

	noErr(t, conn.Close(4001, "slow consumer"))
	for range 3 {
		wantCloseStatus(t, recv(t, ctx, errc), 4001)
	}
	recv(t, ctx, c.Done())
	wantCloseStatus(t, c.Err(), 4001)
}

func TestClient_Close_FullPatches(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	c, err := client.Dial(ctx, newFakeServer(t).url(), nil)
	noErr(t, err)
	sub, err := c.Subscribe(ctx, "room", nil, nil)
	noErr(t, err)

	// Nobody drains Patches: after 1024 patches the read loop blocks
	// (backpressure), so the last ack never arrives.
	const n = 1024 + 2
	acked := make(chan struct{}, n)
	var lastErr atomic.Pointer[error]
	for i := range n {
		noErr(t, c.PublishAsync(ctx, "room", json.RawMessage(`{}`), func(_ string, err error) {
			if i == n-1 {
				lastErr.Store(&err)
			}
			acked <- struct{}{}
		}))
	}
	for range 1024 {
		recv(t, ctx, acked)
	}
	// The 1,024th patch may follow its ack: wait (with a deadline) until the
	// buffer is full, so the read loop is blocked on the 1,025th.
	for deadline := time.Now().Add(10 * time.Second); len(sub.Patches()) < 1024; {
		if time.Now().After(deadline) {
			t.Fatalf("patches buffered: %d, want 1024", len(sub.Patches()))
		}
		runtime.Gosched()
	}
	// Close must unblock the read loop and fail what is still pending.
	noErr(t, c.Close())
	if p := lastErr.Load(); p == nil {
		t.Error("the last PublishAsync never completed, want net.ErrClosed")
	} else if !errors.Is(*p, net.ErrClosed) {
		t.Errorf("last PublishAsync completed with %v, want net.ErrClosed", *p)
	}
	var got int
	for range sub.Patches() {
		got++
	}
	equal(t, "patches buffered", got, 1024)
}
