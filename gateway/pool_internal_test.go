package gateway

import (
	"context"
	"testing"
	"time"
)

// TestWriterPool_HoldsUntilDue: a session the pool holds is written once
// its time is due, not before; the turn is counted for the pacer, and the
// session's writer is released after it.
func TestWriterPool_HoldsUntilDue(t *testing.T) {
	srv, err := New(Config{Writers: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	sc, raw, cc := connPair(t)
	s := newSession(context.Background(), srv, sc, raw, "id", "test")
	if !s.pooled {
		t.Skip("no shared writers on this system")
	}
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
