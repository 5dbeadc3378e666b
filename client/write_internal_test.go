package client

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/syncgate/syncgate/frames"
)

// recordingServer accepts one WebSocket connection and reports every
// message it reads on msgs until the connection ends.
func recordingServer(t *testing.T) (url string, msgs <-chan string) {
	t.Helper()
	ch := make(chan string, 64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer ws.CloseNow()
		for {
			_, b, err := ws.Read(context.Background())
			if err != nil {
				return
			}
			ch <- string(b)
		}
	}))
	t.Cleanup(srv.Close)
	return "ws" + strings.TrimPrefix(srv.URL, "http"), ch
}

// writerConn dials url and returns a conn with just what writeBatches
// needs: no read loop and no writer goroutine, so the test decides what
// one wake-up of the writer finds queued.
func writerConn(t *testing.T, url string, batchBytes int) *conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.CloseNow() })
	o := cloneWithDefaults(&Options{BatchBytes: batchBytes})
	cn := &conn{c: &Client{opts: o}, ws: ws, closingc: make(chan struct{}), helloc: make(chan struct{}),
		qwake: make(chan struct{}, 1), qlimit: (&Client{opts: o}).queueLimit()}
	cn.batchLimit.Store(int64(o.BatchBytes))
	return cn
}

// waitQueued waits for the wake-up every enqueue sends the writer (the
// harness runs no writer, so nothing else takes it), then checks that
// exactly one message is queued.
func waitQueued(t *testing.T, cn *conn) {
	t.Helper()
	select {
	case <-cn.qwake:
	case <-time.After(5 * time.Second):
		t.Fatal("nothing was queued within 5s")
	}
	cn.qmu.Lock()
	n := len(cn.queue)
	cn.qmu.Unlock()
	if n != 1 {
		t.Fatalf("%d messages queued, want 1", n)
	}
}

// takeQueue takes what is queued on cn, as the writer does when it wakes.
func takeQueue(cn *conn) []outMsg {
	cn.qmu.Lock()
	defer cn.qmu.Unlock()
	return cn.takeQueueLocked(nil)
}

// waited returns a queued message whose caller waits for the write.
func waited(s string, alone bool) outMsg {
	return outMsg{b: []byte(s), alone: alone, w: &outWaiter{done: make(chan error, 1)}}
}

func recvMsg(t *testing.T, msgs <-chan string) string {
	t.Helper()
	select {
	case m := <-msgs:
		return m
	case <-time.After(5 * time.Second):
		t.Fatal("no message within 5s")
		return ""
	}
}

// TestWriteBatches checks how one wake-up of the writer splits the queue
// into messages: runs of frames joined with '\n' up to BatchBytes, a
// longer frame alone, a raw message never joined, a message whose caller
// left skipped, and order kept throughout.
func TestWriteBatches(t *testing.T) {
	t.Parallel()
	url, msgs := recordingServer(t)
	cn := writerConn(t, url, 40)
	x := func(c byte, n int) string { return strings.Repeat(string(c), n) }
	left := waited("never", false)
	left.w.state.Store(outAbandoned)
	raw := waited("raw{not json", true)
	last := waited(strings.Repeat("g", 5), false)
	marker := outMsg{flush: true, w: &outWaiter{done: make(chan error, 1)}}
	q := []outMsg{
		{b: []byte(x('a', 10))}, {b: []byte(x('b', 10))}, {b: []byte(x('c', 10))}, // 32 bytes joined
		{b: []byte(x('d', 30))}, // 32+1+30 > 40: a new message
		marker,                  // ends the message: d goes out before it is answered
		left,                    // skipped
		{b: []byte(x('e', 50))}, // over BatchBytes: alone
		raw,                     // alone, though short
		{b: []byte(x('f', 5))}, last,
	}
	if err := cn.writeBatches(q); err != nil {
		t.Fatal(err)
	}
	want := []string{
		x('a', 10) + "\n" + x('b', 10) + "\n" + x('c', 10),
		x('d', 30),
		x('e', 50),
		"raw{not json",
		x('f', 5) + "\n" + x('g', 5),
	}
	for i, w := range want {
		if got := recvMsg(t, msgs); got != w {
			t.Fatalf("message %d = %q, want %q", i, got, w)
		}
	}
	if err := <-marker.w.done; err != nil {
		t.Fatalf("flush marker: %v", err)
	}
	if err := <-raw.w.done; err != nil {
		t.Fatalf("raw message: %v", err)
	}
	if err := <-last.w.done; err != nil {
		t.Fatalf("last message: %v", err)
	}
	if len(left.w.done) != 0 || left.w.state.Load() != outAbandoned {
		t.Fatal("the abandoned message was taken")
	}
}

// TestWriteBatches_Off checks that a negative BatchBytes writes every
// frame as its own message.
func TestWriteBatches_Off(t *testing.T) {
	t.Parallel()
	url, msgs := recordingServer(t)
	cn := writerConn(t, url, -1)
	q := []outMsg{{b: []byte("1")}, {b: []byte("2")}, {b: []byte("3")}}
	if err := cn.writeBatches(q); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"1", "2", "3"} {
		if got := recvMsg(t, msgs); got != w {
			t.Fatalf("message = %q, want %q", got, w)
		}
	}
}

// TestWriteBatches_Error checks that a failed write fails every waiter
// from the failed message on, and that the writer then refuses new
// messages with the same error.
func TestWriteBatches_Error(t *testing.T) {
	t.Parallel()
	url, _ := recordingServer(t)
	cn := writerConn(t, url, 0)
	cn.ws.CloseNow()
	q := []outMsg{waited("1", false), waited("2", true), {b: []byte("3")}}
	err := cn.writeBatches(q)
	if err == nil {
		t.Fatal("write on a closed connection succeeded")
	}
	for i, m := range q[:2] {
		if got := <-m.w.done; !errors.Is(got, err) {
			t.Fatalf("waiter %d got %v, want %v", i, got, err)
		}
	}
	cn.stopWrites(err)
	if got := cn.post([]byte("4")); !errors.Is(got, err) {
		t.Fatalf("post after stop = %v, want %v", got, err)
	}
}

// TestWriteBatches_ErrorPaths checks that every failing write answers each
// waiter exactly once (a second answer would block the writer forever on
// the one-slot channel) whatever the shape of the queue.
func TestWriteBatches_ErrorPaths(t *testing.T) {
	t.Parallel()
	url, _ := recordingServer(t)
	for name, q := range map[string][]outMsg{
		"alone only":    {waited("r", true)},
		"alone last":    {waited("1", false), waited("r", true)},
		"flush first":   {{flush: true, w: &outWaiter{done: make(chan error, 1)}}, waited("1", false)},
		"flush after":   {waited("1", false), {flush: true, w: &outWaiter{done: make(chan error, 1)}}},
		"final batch":   {waited("1", false), waited("2", false)},
		"over the size": {waited(strings.Repeat("a", 30), false), waited(strings.Repeat("b", 30), false), waited("c", false)},
	} {
		cn := writerConn(t, url, 40)
		cn.ws.CloseNow()
		done := make(chan error, 1)
		go func() { done <- cn.writeBatches(q) }()
		select {
		case err := <-done:
			if err == nil {
				t.Fatalf("%s: write on a closed connection succeeded", name)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: writeBatches blocked", name)
		}
		for i, m := range q {
			if len(m.w.done) != 1 {
				t.Fatalf("%s: waiter %d has %d answers, want 1", name, i, len(m.w.done))
			}
			if m.flush && i == 0 {
				if err := <-m.w.done; err != nil {
					t.Fatalf("%s: a leading flush marker has nothing to wait for, got %v", name, err)
				}
			} else if err := <-m.w.done; err == nil {
				t.Fatalf("%s: waiter %d told its write succeeded", name, i)
			}
		}
	}
}

// TestWriteBatches_Stopped checks that nothing is written once the writes
// are stopped, even what the writer had already taken from the queue.
func TestWriteBatches_Stopped(t *testing.T) {
	t.Parallel()
	url, msgs := recordingServer(t)
	cn := writerConn(t, url, 0)
	m := waited("late", false)
	cn.stopWrites(errReplaced)
	if err := cn.writeBatches([]outMsg{m}); !errors.Is(err, errReplaced) {
		t.Fatalf("writeBatches after stop = %v, want errReplaced", err)
	}
	if err := <-m.w.done; !errors.Is(err, errReplaced) {
		t.Fatalf("waiter got %v, want errReplaced", err)
	}
	select {
	case got := <-msgs:
		t.Fatalf("the server got %q after the writes stopped", got)
	case <-time.After(20 * time.Millisecond):
	}
}

// TestWrite_CtxEndsAfterTaken checks that a caller whose frame the writer
// has claimed waits for the write's outcome even if its ctx ends.
func TestWrite_CtxEndsAfterTaken(t *testing.T) {
	t.Parallel()
	url, msgs := recordingServer(t)
	cn := writerConn(t, url, 0)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- cn.write(ctx, []byte("claimed"), false) }()
	waitQueued(t, cn)
	q := takeQueue(cn)
	if !q[0].w.state.CompareAndSwap(outQueued, outTaken) {
		t.Fatal("could not claim the frame")
	}
	cancel()
	select {
	case err := <-errc:
		t.Fatalf("write returned %v before its claimed frame was written", err)
	case <-time.After(20 * time.Millisecond):
	}
	if err := cn.writeMsg(q[0].b); err != nil {
		t.Fatal(err)
	}
	q[0].w.done <- nil
	if err := <-errc; err != nil {
		t.Fatalf("write = %v, want the write's outcome (nil)", err)
	}
	if got := recvMsg(t, msgs); got != "claimed" {
		t.Fatalf("message = %q", got)
	}
}

// TestWriteBatches_Exact checks the boundary: a batch exactly BatchBytes
// long is one message, one byte more is two.
func TestWriteBatches_Exact(t *testing.T) {
	t.Parallel()
	url, msgs := recordingServer(t)
	cn := writerConn(t, url, 9) // "1234\n5678" is 9 bytes
	q := []outMsg{{b: []byte("1234")}, {b: []byte("5678")}, {b: []byte("9")}}
	if err := cn.writeBatches(q); err != nil {
		t.Fatal(err)
	}
	// "1234\n56789" would be 10 bytes: two messages.
	if err := cn.writeBatches([]outMsg{{b: []byte("1234")}, {b: []byte("56789")}}); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"1234\n5678", "9", "1234", "56789"} {
		if got := recvMsg(t, msgs); got != w {
			t.Fatalf("message = %q, want %q", got, w)
		}
	}
}

// TestWrite_CtxEndsBeforeTaken checks that a caller whose ctx ends while
// its frame is still queued gets ctx's error and the frame is never
// written, while a frame queued after it still is.
func TestWrite_CtxEndsBeforeTaken(t *testing.T) {
	t.Parallel()
	url, msgs := recordingServer(t)
	cn := writerConn(t, url, 0) // no writer goroutine: the frame stays queued
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- cn.write(ctx, []byte("cancelled"), false) }()
	waitQueued(t, cn)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("write = %v, want context.Canceled", err)
	}
	if err := cn.post([]byte("after")); err != nil {
		t.Fatal(err)
	}
	if err := cn.writeBatches(takeQueue(cn)); err != nil {
		t.Fatal(err)
	}
	if got := recvMsg(t, msgs); got != "after" {
		t.Fatalf("message = %q, want only the frame queued after the cancelled one", got)
	}
}

// TestWaitSpace checks the queue's backpressure: a sender waits while the
// queue holds its limit, gives up with ctx, and goes on once the writer
// has taken the queue.
func TestWaitSpace(t *testing.T) {
	t.Parallel()
	url, _ := recordingServer(t)
	cn := writerConn(t, url, 0)
	if err := cn.post(make([]byte, cn.qlimit)); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := cn.waitSpace(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waitSpace on a full queue = %v, want DeadlineExceeded", err)
	}
	errc := make(chan error, 1)
	go func() { errc <- cn.waitSpace(context.Background()) }()
	select {
	case err := <-errc:
		t.Fatalf("waitSpace returned %v while the queue was full", err)
	case <-time.After(20 * time.Millisecond):
	}
	takeQueue(cn)
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waitSpace still waiting 5s after the writer took the queue")
	}
	cn.stopWrites(errReplaced)
	if err := cn.waitSpace(context.Background()); err != nil {
		t.Fatalf("waitSpace after stop = %v, want nil (the enqueue reports it)", err)
	}
	if err := cn.post([]byte("x")); !errors.Is(err, errReplaced) {
		t.Fatalf("post after stop = %v, want errReplaced", err)
	}
}

// TestHello_LowersBatchLimit checks that the server's maxMessage caps the
// batch size, and never raises it or turns batching back on.
func TestHello_LowersBatchLimit(t *testing.T) {
	t.Parallel()
	url, _ := recordingServer(t)
	for _, tt := range []struct {
		batch      int
		maxMessage int64
		want       int64
	}{
		{0, 1000, 1000},
		{0, 0, DefaultBatchBytes},
		{0, 1 << 20, DefaultBatchBytes},
		{-1, 1000, -1},
	} {
		cn := writerConn(t, url, tt.batch)
		cn.handleFrameHello(&frames.Hello{MaxMessage: tt.maxMessage})
		if got := cn.batchLimit.Load(); got != tt.want {
			t.Errorf("BatchBytes %d, maxMessage %d: limit %d, want %d", tt.batch, tt.maxMessage, got, tt.want)
		}
	}
}
