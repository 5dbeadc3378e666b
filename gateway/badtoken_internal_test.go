package gateway

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/syncgate/syncgate/auth"
)

// TestBadTokenBudget_RefusedTokensSpendIt: refused tokens take from an
// address's bucket and good ones do not; a spent address is told when a
// token is back, others are not held back, and the bucket refills.
func TestBadTokenBudget_RefusedTokensSpendIt(t *testing.T) {
	t.Parallel()
	b := newKeyedLimiters(2, 3, 16) // a token every 500 ms
	t0 := time.Unix(1000, 0)
	check := func(key string, refused bool, now time.Time) bool {
		t.Helper()
		bk, _ := b.reserve(key, now)
		if bk == nil {
			return false
		}
		b.settle(key, bk, refused, now)
		return true
	}
	for i := range 10 {
		if !check("a", false, t0) {
			t.Fatalf("good token %d refused: good tokens take nothing", i)
		}
	}
	for i := range 3 {
		if !check("a", true, t0) {
			t.Fatalf("refused token %d within the burst was not checked", i)
		}
	}
	if bk, retry := b.reserve("a", t0); bk != nil || retry != 500*time.Millisecond {
		t.Fatalf("spent address: reserve = %v, %v; want nil, 500ms", bk, retry)
	}
	if !check("b", true, t0) {
		t.Fatal("another address was held back")
	}
	if bk, _ := b.reserve("a", t0.Add(499*time.Millisecond)); bk != nil {
		t.Fatal("a check was let start before a token was back")
	}
	if !check("a", true, t0.Add(500*time.Millisecond)) {
		t.Fatal("no check once a token was back")
	}
	if newKeyedLimiters(0, 0, 16) != nil || newKeyedLimiters(-1, 0, 16) != nil {
		t.Fatal("a budget that is off was made")
	}
}

// TestBadTokenBudget_ChecksUnderWayCount: a check under way holds a token
// until it ends, so checks begun at once never outnumber the bucket; one
// that verifies gives its token back.
func TestBadTokenBudget_ChecksUnderWayCount(t *testing.T) {
	t.Parallel()
	b := newKeyedLimiters(1, 3, 16)
	t0 := time.Unix(1000, 0)
	var open []*keyedLimiter
	for range 3 {
		bk, _ := b.reserve("a", t0)
		if bk == nil {
			t.Fatal("a check within the burst was refused")
		}
		open = append(open, bk)
	}
	if bk, retry := b.reserve("a", t0); bk != nil || retry != time.Second {
		t.Fatalf("a fourth check at once: reserve = %v, %v; want nil, 1s", bk, retry)
	}
	b.settle("a", open[0], false, t0) // verified: its token is free again
	bk, _ := b.reserve("a", t0)
	if bk == nil {
		t.Fatal("a good token's check did not give its token back")
	}
	for _, o := range append(open[1:], bk) {
		b.settle("a", o, true, t0)
	}
	if bk, _ := b.reserve("a", t0); bk != nil {
		t.Fatal("three refused tokens left the burst of three unspent")
	}
}

// TestBadTokenBudget_Bounded: the table never holds more than its bound;
// the addresses beyond it share the overflow bucket, and once the
// entries have refilled a sweep (on demand, at most once a second) makes
// room again. An address whose checks all verified leaves no entry.
func TestBadTokenBudget_Bounded(t *testing.T) {
	t.Parallel()
	const max = 4
	b := newKeyedLimiters(1, 2, max)
	t0 := time.Unix(1000, 0)
	for i := range 1000 {
		key := "10.0." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256)
		if bk, _ := b.reserve(key, t0); bk != nil {
			b.settle(key, bk, true, t0)
		}
		if n := len(b.keys); n > max {
			t.Fatalf("after %d addresses the table holds %d, over its bound %d", i+1, n, max)
		}
	}
	// The overflow took two refused tokens (its burst), then refused the
	// other 994 addresses.
	if bk, retry := b.reserve("192.0.2.1", t0); bk != nil || retry != time.Second {
		t.Fatalf("a new address with the table full and the overflow spent: reserve = %v, %v; want nil, 1s", bk, retry)
	}
	// Refilled and a second on: the sweep on demand frees the table.
	t1 := t0.Add(2 * time.Second)
	bk, _ := b.reserve("192.0.2.1", t1)
	if bk == nil || bk == &b.overflow {
		t.Fatalf("after the refill, a new address got %p (overflow %p), want an entry of its own", bk, &b.overflow)
	}
	b.settle("192.0.2.1", bk, false, t1)
	if len(b.keys) != 0 {
		t.Fatalf("the table holds %d entries; want none (all refilled, the last verified)", len(b.keys))
	}
	// The minute sweep forgets refilled entries too, and only those.
	for _, key := range []string{"a", "b", "a", "b"} {
		bk, _ := b.reserve(key, t1)
		b.settle(key, bk, true, t1)
	}
	if n := b.sweep(t1.Add(time.Second)); n != 0 {
		t.Fatalf("a sweep before the refill dropped %d", n)
	}
	if n := b.sweep(t1.Add(2 * time.Second)); n != 2 || len(b.keys) != 0 {
		t.Fatalf("a sweep after the refill dropped %d, left %d", n, len(b.keys))
	}
}

// TestBadTokenBudget_ClockBackwards: a time earlier than one already
// given is taken as that one, so an address gains no token from it.
// Given an earlier time, rate.Limiter refills from it again; here a check
// whose end read the clock before another's reaches the budget after it.
func TestBadTokenBudget_ClockBackwards(t *testing.T) {
	t.Parallel()
	b := newKeyedLimiters(1, 2, 16)
	t0 := time.Unix(1000, 0)
	first, _ := b.reserve("a", t0)
	second, _ := b.reserve("a", t0)
	b.settle("a", first, true, t0.Add(time.Second))
	b.settle("a", second, true, t0.Add(500*time.Millisecond))
	// Both refused by t0+1s: half a token back at t0+1.5s, one at t0+2s.
	if bk, _ := b.reserve("a", t0.Add(1500*time.Millisecond)); bk != nil {
		t.Fatal("the earlier time gave the address a token")
	}
	if bk, _ := b.reserve("a", t0.Add(2*time.Second)); bk == nil {
		t.Fatal("no token a second after the refusals")
	}
}

// TestBadTokenBudget_RetryAfterBounded: a rate so low that the wait for a
// token would overflow a Duration is told a day.
func TestBadTokenBudget_RetryAfterBounded(t *testing.T) {
	t.Parallel()
	b := newKeyedLimiters(1e-12, 1, 16)
	t0 := time.Unix(1000, 0)
	bk, _ := b.reserve("a", t0)
	b.settle("a", bk, true, t0)
	if bk, retry := b.reserve("a", t0); bk != nil || retry != maxRetryAfter {
		t.Fatalf("reserve = %v, %v; want nil, %v", bk, retry, maxRetryAfter)
	}
}

// TestConfig_BadTokenDefaults: zero means 10 a second, bursts of 20; a
// lone rate gets twice its value as burst; negative turns the budget
// off, and so does having no Verifier; a negative burst is refused.
func TestConfig_BadTokenDefaults(t *testing.T) {
	t.Parallel()
	v := verifierFunc(func(string) (*auth.Identity, error) { return nil, auth.ErrBadSignature })
	for _, tc := range []struct {
		cfg         Config
		rate, burst float64
	}{
		{Config{Verifier: v}, 10, 20},
		{Config{Verifier: v, BadTokenRate: 0.2}, 0.2, 1},
		{Config{Verifier: v, BadTokenRate: 3, BadTokenBurst: 5}, 3, 5},
		{Config{Verifier: v, BadTokenRate: -1}, 0, 0},
		{Config{}, 0, 0},
	} {
		s, err := New(tc.cfg)
		if err != nil {
			t.Fatal(err)
		}
		var rate, burst float64
		if s.badTokens != nil {
			rate, burst = float64(s.badTokens.limit), float64(s.badTokens.burst)
		}
		if rate != tc.rate || burst != tc.burst {
			t.Errorf("BadTokenRate %v, BadTokenBurst %d: budget %v a second, bursts of %v; want %v, %v",
				tc.cfg.BadTokenRate, tc.cfg.BadTokenBurst, rate, burst, tc.rate, tc.burst)
		}
		if err := s.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := New(Config{Verifier: v, BadTokenBurst: -1}); err == nil {
		t.Fatal("a negative BadTokenBurst was accepted")
	}
}

type verifierFunc func(string) (*auth.Identity, error)

func (f verifierFunc) Verify(token string) (*auth.Identity, error) { return f(token) }
