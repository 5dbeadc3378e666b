package gateway

import (
	"context"
	"testing"
	"time"
)

// A refused frame past the refused-frames burst asks the reader to pause
// for one token's time, capped at maxReadPause along with the debt; and a
// paused reader returns as soon as its session closes.
func TestPauseReading_WakesOnClose(t *testing.T) {
	// Refused frames are read at 10/floodReadShare = 1 per second, one at
	// once.
	srv, err := New(Config{FrameRate: 10, FrameBurst: 10, RateLimitClose: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	s := newSession(context.Background(), srv, nil, nil, "id", "test")
	s.q.writing = true // no writer goroutine: answers stay queued

	now := time.Now()
	for range 10 {
		if !s.allowFrame(now) {
			t.Fatal("the burst refused a frame")
		}
	}
	if s.allowFrame(now) {
		t.Fatal("a frame past the burst was let through")
	}
	line := []byte(`{"type":"subscribe","v":1}`)
	if d := s.rateLimited(line, now); d != 0 {
		t.Fatalf("first refused frame: pause %v, want none (its burst)", d)
	}
	if d := s.rateLimited(line, now); d != maxReadPause {
		t.Fatalf("second refused frame: pause %v, want %v (1s, capped)", d, maxReadPause)
	}
	// The capped frame left no debt: a second on, a token is there again.
	if d := s.rateLimited(line, now.Add(time.Second)); d != 0 {
		t.Fatalf("refused frame a second later: pause %v, want none", d)
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

// TestWriterLimits_SweepDropsFullBuckets: the minute sweep forgets a sub
// once its bucket has refilled (a new one would be the same), not before.
func TestWriterLimits_SweepDropsFullBuckets(t *testing.T) {
	w := newKeyedLimiters(2, 4, 0) // refills from empty in 2 s
	t0 := time.Unix(1000, 0)
	for range 4 {
		if ok, _ := w.allow("a", t0); !ok {
			t.Fatal("a write within the burst was refused")
		}
	}
	if ok, retry := w.allow("a", t0); ok || retry != 500*time.Millisecond {
		t.Fatalf("over the burst: allow = %v, %v; want false, 500ms", ok, retry)
	}
	if n := w.sweep(t0.Add(time.Second)); n != 0 {
		t.Fatalf("sweep of a half-full bucket dropped %d", n)
	}
	if n := w.sweep(t0.Add(2 * time.Second)); n != 1 || len(w.keys) != 0 {
		t.Fatalf("sweep of a full bucket dropped %d, left %d", n, len(w.keys))
	}
	if newKeyedLimiters(0, 0, 0) != nil || newKeyedLimiters(-1, 0, 0) != nil {
		t.Fatal("a frame rate that is off still made writer limits")
	}
}

// TestWriterLimits_RetryAfterBounded: a rate so low that the wait for a
// token would overflow a Duration is told a day.
func TestWriterLimits_RetryAfterBounded(t *testing.T) {
	w := newKeyedLimiters(1e-12, 1, 0)
	t0 := time.Unix(1000, 0)
	w.allow("a", t0)
	if ok, retry := w.allow("a", t0); ok || retry != maxRetryAfter {
		t.Fatalf("allow = %v, %v; want false, %v", ok, retry, maxRetryAfter)
	}
}

// TestWriterLimits_ClockBackwards: a request that read the clock before
// another took the lock brings an earlier time; it must not make the
// bucket refill the same stretch twice. rate.Limiter moves its clock
// back to the time of an allowed request, so with two tokens at one a
// second, writes at t, t+1s, t+0.5s (the late one) and t+1.5s would get
// four tokens where the stretch paid for three.
func TestWriterLimits_ClockBackwards(t *testing.T) {
	t.Parallel()
	w := newKeyedLimiters(1, 2, 0)
	t0 := time.Unix(1000, 0)
	for _, d := range []time.Duration{0, time.Second, 500 * time.Millisecond} {
		if ok, _ := w.allow("a", t0.Add(d)); !ok {
			t.Fatalf("write at t+%v refused", d)
		}
	}
	if ok, _ := w.allow("a", t0.Add(1500*time.Millisecond)); ok {
		t.Fatal("the earlier time refilled half a second a second time")
	}
}

// TestClientIP: the per-address limits' key for a RemoteAddr: the IPv4
// address, an IPv6 address's /64.
func TestClientIP(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ addr, want string }{
		{"192.0.2.7:4000", "192.0.2.7"},
		{"[::ffff:192.0.2.7]:4000", "192.0.2.7"},
		{"[2001:db8:1:2:3:4:5:6]:4000", "2001:db8:1:2::/64"},
		{"[2001:db8:1:2:ffff::1]:1", "2001:db8:1:2::/64"},
		{"[2001:db8:1:3::1]:1", "2001:db8:1:3::/64"},
		{"[fe80::1%eth0]:1", "fe80::/64"},
		{"[64:ff9b::c000:207]:1", "192.0.2.7"},                    // NAT64, well-known prefix
		{"[64:ff9b::c000:208]:1", "192.0.2.8"},                    // another IPv4 client behind it
		{"[::ffff:0:c000:207]:1", "192.0.2.7"},                    // SIIT's IPv4-translated form
		{"[64:ff9b:1:0:0:1:c000:207]:1", "64:ff9b:1::1:c000:207"}, // local-use NAT64: the whole address
		{"192.0.2.7", "192.0.2.7"},                                // no port
		{"@", "@"},                                                // a Unix socket's peer
		{"", ""},
	} {
		if got := clientIP(tc.addr); got != tc.want {
			t.Errorf("clientIP(%q) = %q, want %q", tc.addr, got, tc.want)
		}
	}
}
