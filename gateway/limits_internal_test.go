package gateway

import (
	"context"
	"testing"
	"time"
)

// A refused frame past the refused-frames burst asks the reader to pause
// for one token's time (capped at maxReadPause), and a paused reader
// returns as soon as its session closes.
func TestPauseReading_WakesOnClose(t *testing.T) {
	srv, err := New(Config{FrameRate: 0.5, FrameBurst: 1, RateLimitClose: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	s := newSession(context.Background(), srv, nil, nil, "id", "test")
	s.q.writing = true // no writer goroutine: answers stay queued

	now := time.Now()
	if !s.allowFrame(now) || s.allowFrame(now) {
		t.Fatal("a bucket of one should take one frame and refuse the next")
	}
	line := []byte(`{"type":"subscribe","v":1}`)
	if d := s.rateLimited(line, now); d != 0 {
		t.Fatalf("first refused frame: pause %v, want none (the burst)", d)
	}
	s.allowFrame(now)
	if d := s.rateLimited(line, now); d != maxReadPause {
		t.Fatalf("second refused frame: pause %v, want %v (2s of debt, capped)", d, maxReadPause)
	}

	done := make(chan struct{})
	go func() {
		defer close(done)
		s.pauseReading(time.Hour)
	}()
	s.closeWith(reasonShutdown)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the paused reader did not return when the session closed")
	}
	// Closed already: no pause at all.
	s.pauseReading(time.Hour)
}
