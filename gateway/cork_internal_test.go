package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// countingConn records each Write call that reaches the socket.
type countingConn struct {
	net.Conn
	mu     sync.Mutex
	writes int
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.writes++
	c.mu.Unlock()
	return c.Conn.Write(p)
}

// TestCorkConn_OneWritePerMessage: while corked, a message's header and
// payload, whatever its size, leave in a single write (writev), in order,
// and uncorked writes pass straight through.
func TestCorkConn_OneWritePerMessage(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	cc := &corkConn{Conn: &countingConn{Conn: a}}
	got := make(chan []byte, 1)
	go func() {
		var buf bytes.Buffer
		_, _ = io.Copy(&buf, b)
		got <- buf.Bytes()
	}()
	var want bytes.Buffer
	for _, size := range []int{10, writeBufferSize, writeBufferSize + 1, 70_000} {
		head := bytes.Repeat([]byte{'h'}, 3)
		body := bytes.Repeat([]byte{byte('a' + size%26)}, size)
		tail := []byte("tail")
		cc.cork()
		for _, p := range [][]byte{head, body, tail} {
			if _, err := cc.Write(p); err != nil {
				t.Fatal(err)
			}
			want.Write(p)
		}
		before := cc.Conn.(*countingConn).writes
		if _, err := cc.uncork(true); err != nil {
			t.Fatal(err)
		}
		// net.Pipe has no writev, so net.Buffers falls back to one Write
		// per part: what matters here is nothing was written while corked.
		if before != 0 && size == 10 {
			t.Fatalf("wrote %d times while corked", before)
		}
	}
	if _, err := cc.Write([]byte("direct")); err != nil {
		t.Fatal(err)
	}
	want.WriteString("direct")
	a.Close()
	if g := <-got; !bytes.Equal(g, want.Bytes()) {
		t.Fatalf("stream differs: got %d bytes, want %d", len(g), want.Len())
	}
}

// TestCorkConn_WebSocketMessages sends messages of many sizes through
// coder/websocket over a corkConn on real TCP and checks they arrive intact.
func TestCorkConn_WebSocketMessages(t *testing.T) {
	srv, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	sc, raw, cc := connPair(t)
	s := newSession(context.Background(), srv, sc, raw, "id", "test")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cc.SetReadLimit(1 << 20)
	for _, size := range []int{1, 200, 255, 256, 257, 4096, 65536, 300_000} {
		msg := bytes.Repeat([]byte{'x'}, size)
		if _, err := s.writeMessage(ctx, msg, nil, true); err != nil {
			t.Fatal(err)
		}
		_, got, err := cc.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, msg) {
			t.Fatalf("size %d: got %d bytes", size, len(got))
		}
	}
}

// TestCorkConn_CloseFlushes: what was collected while corked still leaves
// when the connection is closed before the writer uncorks.
func TestCorkConn_CloseFlushes(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	cc := &corkConn{Conn: a}
	got := make(chan []byte, 1)
	go func() {
		buf, _ := io.ReadAll(b)
		got <- buf
	}()
	cc.cork()
	if _, err := cc.Write([]byte("close frame")); err != nil {
		t.Fatal(err)
	}
	if err := cc.Close(); err != nil {
		t.Fatal(err)
	}
	if g := <-got; string(g) != "close frame" {
		t.Fatalf("got %q", g)
	}
}

// tcpPair returns both ends of a real loopback TCP connection.
func tcpPair(t *testing.T) (server, client *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-accepted
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { _ = c.Close(); _ = s.Close() })
	return s.(*net.TCPConn), c.(*net.TCPConn)
}

// smallCorkPair is a corkConn over one end of a loopback TCP pair whose
// send and receive buffers are small, and the other end (c), which the
// test reads or not. It skips where writes cannot avoid waiting.
func smallCorkPair(t *testing.T) (cc *corkConn, c *net.TCPConn) {
	t.Helper()
	s, c := tcpPair(t)
	if err := s.SetWriteBuffer(8 << 10); err != nil {
		t.Fatal(err)
	}
	if err := c.SetReadBuffer(8 << 10); err != nil {
		t.Fatal(err)
	}
	cc = newCorkConn(s)
	if !cc.nonBlocking() {
		t.Skip("no writes without waiting on this system")
	}
	return cc, c
}

// TestCorkConn_UncorkWithoutWaiting fills a real socket whose peer does not
// read: an uncork that must not wait returns blocked instead of waiting,
// keeps the rest of the message, and writes it before anything written
// after (a pong from the reader, the next message), so the peer gets the
// stream intact and in order.
func TestCorkConn_UncorkWithoutWaiting(t *testing.T) {
	cc, c := smallCorkPair(t)
	cc.timeout = 10 * time.Second
	var want bytes.Buffer
	fillUntilBlocked(t, cc, &want)
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(c)
		got <- b
	}()
	// An uncorked write (coder/websocket's reader answering a ping) waits
	// for the rest of the message and goes after it.
	if _, err := cc.Write([]byte("pong")); err != nil {
		t.Fatal(err)
	}
	want.WriteString("pong")
	if err := cc.flush(); err != nil {
		t.Fatal(err)
	}
	cc.cork()
	if _, err := cc.Write([]byte("after")); err != nil {
		t.Fatal(err)
	}
	want.WriteString("after")
	if b, err := cc.uncork(false); err != nil || b {
		t.Fatalf("uncork after the peer read: blocked %v, err %v", b, err)
	}
	_ = cc.Close()
	if g := <-got; !bytes.Equal(g, want.Bytes()) {
		t.Fatalf("stream differs: got %d bytes, want %d (first difference at %d)", len(g), want.Len(), firstDiff(g, want.Bytes()))
	}
}

// fillUntilBlocked writes 16 KiB messages through cc, uncorking each
// without waiting, until one is left pending on the full socket; it adds
// every byte written or pending to want.
func fillUntilBlocked(t *testing.T, cc *corkConn, want *bytes.Buffer) {
	t.Helper()
	for i := 0; i < 1000; i++ {
		msg := bytes.Repeat([]byte{byte('a' + i%26)}, 16<<10)
		cc.cork()
		if _, err := cc.Write(msg[:3]); err != nil { // a header: copied
			t.Fatal(err)
		}
		if _, err := cc.Write(msg[3:]); err != nil { // a payload: referenced
			t.Fatal(err)
		}
		want.Write(msg)
		blocked, err := cc.uncork(false)
		if err != nil {
			t.Fatal(err)
		}
		// The caller may reuse its buffers at once.
		clear(msg)
		if blocked {
			return
		}
	}
	t.Fatal("16 MiB went into a socket nobody reads without blocking")
}

// TestCorkConn_FlushReportsADroppedRest: once the rest of a pending
// message is dropped unwritten, flush fails rather than let the writer go
// on after a cut frame: when the connection closes, and when an uncorked
// write (a pong) fails while writing that rest first.
func TestCorkConn_FlushReportsADroppedRest(t *testing.T) {
	for _, tc := range []struct {
		name string
		drop func(*corkConn) error
	}{
		{"closed", func(cc *corkConn) error { return cc.Close() }},
		{"pong timed out", func(cc *corkConn) error {
			if _, err := cc.Write([]byte("pong")); err == nil {
				return errors.New("a pong written after a rest nobody reads")
			}
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cc, _ := smallCorkPair(t)
			cc.timeout = 100 * time.Millisecond // the pong's wait; the peer never reads
			fillUntilBlocked(t, cc, new(bytes.Buffer))
			if err := tc.drop(cc); err != nil {
				t.Fatal(err)
			}
			if err := cc.flush(); err == nil {
				t.Fatal("flush = nil after the pending rest was dropped")
			}
		})
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestCorkConn_NoAllocs: a message written through a corked connection
// without waiting (a shared writer's path: header copied, payload
// referenced, one writev) allocates nothing once warm. test.sh runs it
// without -race, under which sync.Pool drops items at random.
func TestCorkConn_NoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts mean nothing under -race")
	}
	s, c := tcpPair(t)
	go func() { _, _ = io.Copy(io.Discard, c) }()
	cc := newCorkConn(s)
	if !cc.nonBlocking() {
		t.Skip("no writes without waiting on this system")
	}
	cc.timeout = 10 * time.Second
	header := []byte{0x81, 0x7e, 0x04, 0x00}
	payload := bytes.Repeat([]byte{'x'}, 1024)
	var failed error
	allocs := testing.AllocsPerRun(1000, func() {
		cc.cork()
		_, _ = cc.Write(header)
		_, _ = cc.Write(payload)
		if blocked, err := cc.uncork(false); err != nil || blocked {
			failed = fmt.Errorf("uncork: blocked %v, err %v", blocked, err)
		}
	})
	if failed != nil {
		t.Fatal(failed)
	}
	if allocs > 0 {
		t.Fatalf("%.1f allocations per message, want 0", allocs)
	}
}
