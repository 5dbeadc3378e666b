package gateway

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/syncgate/syncgate/internal/gwtest"
)

// pingPair is connPair whose client reports each ping it reads on pinged
// and does not answer it.
func pingPair(t *testing.T) (server *websocket.Conn, raw *corkConn, client *websocket.Conn, pinged <-chan struct{}) {
	t.Helper()
	pings := make(chan struct{}, 1)
	server, raw, client = connPairWith(t, &websocket.DialOptions{
		OnPingReceived: func(context.Context, []byte) bool {
			select {
			case pings <- struct{}{}:
			default:
			}
			return false // no pong
		},
	})
	return server, raw, client, pings
}

// askPing has s's writer ping, as pingTick does for a silent peer.
func askPing(s *session) {
	s.q.mu.Lock()
	s.q.pingDue = true
	start := s.claimWriterLocked()
	s.q.mu.Unlock()
	if start {
		s.spawnWriter()
	}
}

// waitWriters waits for s's writer to stop.
func waitWriters(t *testing.T, s *session) {
	t.Helper()
	stopped := make(chan struct{})
	go func() { s.writers.Wait(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the session's writer did not stop within 10s")
	}
}

// reasonOf is why s was closed, reasonNone if it was not.
func reasonOf(s *session) closeReason {
	s.q.mu.Lock()
	defer s.q.mu.Unlock()
	return s.q.reason
}

// waitPinging makes a session of srv on a pingPair, has its writer ping
// and returns once the client has read the ping: the writer then waits
// for a pong that will not come. The client's reads end with the error
// it got, on read.
func waitPinging(t *testing.T, srv *Server, name string) (s *session, cc *websocket.Conn, read <-chan error) {
	t.Helper()
	sc, raw, cc, pinged := pingPair(t)
	s = newSession(context.Background(), srv, sc, raw, name, "test")
	readErr := make(chan error, 1)
	go func() {
		for {
			if _, _, err := cc.Read(context.Background()); err != nil {
				readErr <- err
				return
			}
		}
	}()
	askPing(s)
	select {
	case <-pinged:
	case <-time.After(10 * time.Second):
		t.Fatal("no ping within 10s")
	}
	return s, cc, readErr
}

// TestSession_PingFailureReason: a ping that fails because the connection
// closed under it (here the client's close frame, which coder/websocket's
// reader answers and then closes the connection) leaves the close reason
// to the reader, which knows why; it used to close the session with
// ping_timeout (4002 in the metrics) whenever the writer got there first.
// A ping whose frame cannot be written is a failed write (write_error).
// The test plays the reader itself (readLoop, then closeWith, as run
// does), so that the writer is deterministically first.
func TestSession_PingFailureReason(t *testing.T) {
	srv, err := New(Config{PongTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())

	t.Run("closed by the peer", func(t *testing.T) {
		s, cc, _ := waitPinging(t, srv, "closed")
		// The writer now waits for a pong that will not come.
		go func() { _ = cc.Close(websocket.StatusNormalClosure, "") }()
		rerr := s.readLoop() // the close frame: the library echoes it and closes the connection
		waitWriters(t, s)    // the ping failed, and the writer dealt with it
		s.closeWith(readErrorReason(rerr))
		waitWriters(t, s)
		if r := reasonOf(s); r != reasonClientClosed {
			t.Fatalf("closed for %v (read: %v), want %v: the ping failed because the connection closed", r, rerr, reasonClientClosed)
		}
	})

	t.Run("ping frame not written", func(t *testing.T) {
		sc, raw, _, _ := pingPair(t)
		s := newSession(context.Background(), srv, sc, raw, "unwritable", "test")
		tcp, ok := raw.Conn.(*net.TCPConn)
		if !ok {
			t.Skipf("connection is %T", raw.Conn)
		}
		if err := tcp.CloseWrite(); err != nil { // every write now fails at once (EPIPE)
			t.Fatal(err)
		}
		askPing(s)
		waitWriters(t, s)
		if r := reasonOf(s); r != reasonWriteError || !s.writeBroken {
			t.Fatalf("closed for %v (writeBroken %v), want %v: the ping's frame could not be written", r, s.writeBroken, reasonWriteError)
		}
	})
}

// TestSession_ClosedWriteLeavesTheReason: a data write that fails with
// net.ErrClosed because the connection closed under it (here the client's
// close frame, which coder/websocket's reader answers and then closes the
// connection) leaves the close reason to the reader, which knows why:
// client_closed, not write_error. It used to be write_error whenever the
// writer got there first. The stream is still taken as broken: nothing
// more is written. As in TestSession_PingFailureReason the test plays the
// reader (readLoop, then closeWith, as run does), so that the writer is
// deterministically first; with the pool's writer and with the session's
// own.
func TestSession_ClosedWriteLeavesTheReason(t *testing.T) {
	srv, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	for _, own := range []bool{false, true} {
		t.Run(fmt.Sprintf("own writer %v", own), func(t *testing.T) {
			sc, raw, cc := connPair(t)
			s := newSession(context.Background(), srv, sc, raw, "closed", "test")
			if !own && !s.pooled {
				t.Skip("no shared writers on this system")
			}
			s.pooled = !own
			go func() { _ = cc.Close(websocket.StatusNormalClosure, "") }()
			rerr := s.readLoop() // the close frame: the library echoes it and closes the connection
			s.enqueue(outItem{body: []byte(`{"f":1}`), kind: idxPatch})
			waitWriters(t, s) // the write failed, and the writer dealt with it
			if !s.writeBroken {
				t.Fatal("the write to the closed connection did not fail")
			}
			s.closeWith(readErrorReason(rerr))
			waitWriters(t, s)
			if r := reasonOf(s); r != reasonClientClosed {
				t.Fatalf("closed for %v (read: %v), want %v: the write failed because the client closed", r, rerr, reasonClientClosed)
			}
		})
	}
}

// TestSession_NoHoldOnceItWouldEnd: a close, or a push that fills an
// eighth of the queue, ends a pacing hold (closeWith, push), but only one
// already marked (holdOwn, holdPool). One that came after holdFor looked
// at the session and before the hold was marked (for writeLoop: any time
// during its last write, since it checked nothing) ended nothing, and the
// writer then waited out the whole hold: the close frame, or the burst,
// came a pacing delay late (here 10 s). The clock's hook runs the event
// in that window: holdFor's call of Now is its last step.
func TestSession_NoHoldOnceItWouldEnd(t *testing.T) {
	now := time.Unix(1000, 0)
	const d = 10 * time.Second // the hold: far longer than the test may take
	var hook atomic.Pointer[func()]
	start := time.Now()
	srv, err := New(Config{
		Writers: 1, SendQueueMessages: 64,
		MaxWriteDelay: d, OverloadWriteDelay: d,
		CPUTime: func() time.Duration { return 100 * time.Since(start) }, // always busy
		Now: func() time.Time {
			if f := hook.Swap(nil); f != nil {
				(*f)()
			}
			return now
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	waitPaceDelay(t, srv, d)
	frame := outItem{body: []byte(`{"f":1}`), kind: idxPatch}
	eighth := srv.cfg.SendQueueMessages / 8
	for _, own := range []bool{false, true} {
		for _, event := range []string{"close", "burst"} {
			t.Run(fmt.Sprintf("own writer %v, %s", own, event), func(t *testing.T) {
				s, cc := pooledSession(t, srv, event)
				s.pooled = !own
				// A session that batches, written just now: held for the whole d.
				s.lastCount, s.lastGap, s.lastWrite = 64, int64(d), now.UnixNano()
				if got := s.holdFor(); got != d {
					t.Fatalf("holdFor = %v, want %v", got, d)
				}
				want := 1
				f := func() { s.closeWith(reasonShutdown) }
				if event == "burst" {
					want += eighth
					f = func() {
						for range eighth {
							s.enqueue(frame)
						}
					}
				}
				hook.Store(&f)
				s.enqueue(frame) // its writer's holdFor runs f
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				n := 0
				for n < want {
					_, msg, err := cc.Read(ctx)
					if err != nil {
						t.Fatalf("after %d of %d frames: %v (the hold is %v)", n, want, err, d)
					}
					n += bytes.Count(msg, []byte("\n")) + 1
				}
				if event == "burst" {
					s.closeWith(reasonShutdown)
				}
				_, _, err := cc.Read(ctx)
				if websocket.CloseStatus(err) != websocket.StatusGoingAway {
					t.Fatalf("after the frames the client read %v, want close 1001 within 5s (the hold is %v)", err, d)
				}
				waitWriters(t, s)
			})
		}
	}
}

// TestSession_CloseEndsPing: a session that closes while its writer waits
// for a pong ends the wait. The writer used to wait out PongTimeout (here
// 30 s) whatever closed the session: a peer that cut the connection (the
// reader's read_error) never answers, and run's wait for the writer, the
// unsubscribes and Server.Shutdown waited with it. The close keeps its
// reason, and a shutdown still sends its close frame. The test plays the
// reader itself, as TestSession_PingFailureReason does.
func TestSession_CloseEndsPing(t *testing.T) {
	const pongTimeout = 30 * time.Second
	srv, err := New(Config{PongTimeout: pongTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())

	// writerDone fails unless s's writer stops well within pongTimeout.
	writerDone := func(t *testing.T, s *session) {
		t.Helper()
		stopped := make(chan struct{})
		go func() { s.writers.Wait(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(5 * time.Second):
			t.Fatalf("the writer still waits for the pong 5s after the close (PongTimeout %v)", pongTimeout)
		}
	}

	t.Run("shutdown", func(t *testing.T) {
		s, _, read := waitPinging(t, srv, "shutdown")
		s.closeWith(reasonShutdown)
		writerDone(t, s)
		if r := reasonOf(s); r != reasonShutdown {
			t.Fatalf("closed for %v, want %v", r, reasonShutdown)
		}
		select {
		case err := <-read:
			if websocket.CloseStatus(err) != websocket.StatusGoingAway {
				t.Fatalf("the client read %v, want close 1001", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the client got no close frame within 5s")
		}
	})

	t.Run("cut by the peer", func(t *testing.T) {
		s, cc, _ := waitPinging(t, srv, "cut")
		_ = cc.CloseNow() // the TCP connection ends, without a close frame
		rerr := s.readLoop()
		s.closeWith(readErrorReason(rerr))
		writerDone(t, s)
		if r := reasonOf(s); r != reasonReadError {
			t.Fatalf("closed for %v (read: %v), want %v", r, rerr, reasonReadError)
		}
	})
}

// counterValue is the value of srv's counter name, of the sample with
// label = value ("" for a counter without labels), gathered from reg, the
// registry srv was made with.
func counterValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label == "" {
				return m.GetCounter().GetValue()
			}
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no sample %s{%s=%q}", name, label, value)
	return 0
}

// TestSession_FailedWriteCountsDrops: the frames of a message whose write
// fails never reach the client whole, so they count in
// syncgate_drops_total{reason="session_closed"}, like the frames after
// it, not in syncgate_frames_out_total; they used to count as frames
// out. So do those of a message a shared writer left pending on a full
// socket when its flush fails: such a message counts only once its rest
// is written.
func TestSession_FailedWriteCountsDrops(t *testing.T) {
	frame := func(body string) outItem { return outItem{prefix: []byte(`{"p":`), body: []byte(body), kind: idxPatch} }
	const out, drops = "syncgate_frames_out_total", "syncgate_drops_total"

	t.Run("write fails", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		srv, err := New(Config{MaxBatchBytes: 25, Registry: reg}) // two 10-byte frames a message
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Shutdown(context.Background())
		sc, raw, _ := connPair(t)
		s := newSession(context.Background(), srv, sc, raw, "failed", "test")
		tcp, ok := raw.Conn.(*net.TCPConn)
		if !ok {
			t.Skipf("connection is %T", raw.Conn)
		}
		if err := tcp.CloseWrite(); err != nil { // every write now fails at once (EPIPE)
			t.Fatal(err)
		}
		for _, body := range []string{`"aaa"}`, `"bbb"}`, `"ccc"}`, `"ddd"}`, `"eee"}`} {
			// push, not enqueue: no writer starts, the test writes.
			if r := s.q.push(frame(body), 100, 1<<20); r == pushFull || r == pushClosed {
				t.Fatal("push refused")
			}
		}
		items, _, _, _ := s.q.next(nil)
		if _, _, err := s.writeBatch(t.Context(), items, true); err == nil {
			t.Fatal("the write on a socket shut for writing succeeded")
		}
		if n := counterValue(t, reg, out, "type", "patch"); n != 0 {
			t.Errorf("%v patches counted out, want 0: none was written", n)
		}
		if n := counterValue(t, reg, drops, "reason", dropSessionClosed); n != 5 {
			t.Errorf("%v patches dropped, want all 5", n)
		}
	})

	t.Run("flush of a pending message fails", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		srv, err := New(Config{Writers: 1, Registry: reg})
		if err != nil {
			t.Fatal(err)
		}
		defer srv.Shutdown(context.Background())
		s, cc := pooledSession(t, srv, "pending")
		tcp, ok := s.netConn.Conn.(*net.TCPConn)
		if !ok {
			t.Skipf("connection is %T", s.netConn.Conn)
		}
		if err := tcp.SetWriteBuffer(8 << 10); err != nil {
			t.Fatal(err)
		}
		// The client reads nothing: a 2 MiB message fills the socket, and
		// the pool's turn leaves its rest pending for the session's own
		// goroutine to flush.
		s.enqueue(frame(`"` + strings.Repeat("x", 2<<20) + `"}`))
		gwtest.Eventually(t, gwtest.Timeout, "the message is left pending on the full socket", func() bool {
			return counterValue(t, reg, "syncgate_writes_blocked_total", "", "") == 1
		})
		if n := counterValue(t, reg, out, "type", "patch"); n != 0 {
			t.Errorf("%v patches counted out while their message waits to be flushed, want 0", n)
		}
		_ = cc.CloseNow() // with data unread: the flush fails
		waitWriters(t, s)
		if n := counterValue(t, reg, out, "type", "patch"); n != 0 {
			t.Errorf("%v patches counted out, want 0: the flush failed", n)
		}
		if n := counterValue(t, reg, drops, "reason", dropSessionClosed); n != 1 {
			t.Errorf("%v patches dropped, want 1", n)
		}
	})
}
