package gateway

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// simulate runs clients that each arrive at arrive(i) (from the bubble's
// start) and retry after every refusal's delay, as a client honouring
// afterMs does, until admitted. It returns the admission times, sorted,
// and the number of refusals. It must run in a synctest bubble.
func simulate(t *testing.T, b *acceptBudget, clients int, arrive func(i int) time.Duration) (accepts []time.Duration, refusals int) {
	t.Helper()
	start := time.Now()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			time.Sleep(arrive(i)) // the bubble's fake clock: the client arrives then
			for {
				ok, reason, after := b.admit(time.Now())
				if ok {
					mu.Lock()
					accepts = append(accepts, time.Since(start))
					mu.Unlock()
					return
				}
				if reason != rejectRate || afterMs(after) <= 0 {
					t.Errorf("refusal %q after %v", reason, after)
					return
				}
				mu.Lock()
				refusals++
				mu.Unlock()
				time.Sleep(time.Duration(afterMs(after)) * time.Millisecond) // fake clock: the client waits its afterMs
			}
		})
	}
	wg.Wait()
	slices.Sort(accepts)
	return accepts, refusals
}

// maxPerSecond is the most admissions in any one-second window.
func maxPerSecond(accepts []time.Duration) int {
	most, j := 0, 0
	for i := range accepts {
		for accepts[i]-accepts[j] >= time.Second {
			j++
		}
		most = max(most, i-j+1)
	}
	return most
}

// TestAcceptBudget_StormUnderFakeTime: 5,000 clients at once against 500/s
// with a burst of 500. No one-second window admits more than rate + burst;
// the refused come back in their slots, one per token, so almost none is
// refused twice; all are in by the time the bucket needs, (5000-500)/500 s.
func TestAcceptBudget_StormUnderFakeTime(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const rate, burst, clients = 500, 500, 5000
		b := newAcceptBudget(rate, burst, -1, rand.New(rand.NewPCG(1, 2)))
		accepts, refusals := simulate(t, b, clients, func(int) time.Duration { return 0 })
		if len(accepts) != clients {
			t.Fatalf("%d of %d admitted", len(accepts), clients)
		}
		if most := maxPerSecond(accepts); most > rate+burst {
			t.Fatalf("%d admitted in one second, over rate+burst %d", most, rate+burst)
		}
		// After the burst, a window that starts past it admits no more
		// than the rate (plus the one token a window edge can catch).
		if most := maxPerSecond(accepts[burst:]); most > rate+1 {
			t.Fatalf("%d admitted in one second after the burst, over the rate %d", most, rate)
		}
		want := time.Duration(clients-burst) * time.Second / rate
		if last := accepts[len(accepts)-1]; last > want+50*time.Millisecond {
			t.Fatalf("last admitted at %v, want by %v", last, want)
		}
		if refusals > (clients-burst)*101/100 {
			t.Fatalf("%d refusals for %d refused clients: the refused came back out of step", refusals, clients-burst)
		}
	})
}

// TestAcceptBudget_FloodUnderFakeTime: clients keep arriving at twice the
// rate for 5 seconds, and every refused one retries when told. Admissions
// stay within rate + burst per second, and everyone gets in.
func TestAcceptBudget_FloodUnderFakeTime(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const rate, burst, clients = 200, 50, 2000
		b := newAcceptBudget(rate, burst, -1, rand.New(rand.NewPCG(3, 4)))
		accepts, _ := simulate(t, b, clients, func(i int) time.Duration {
			return time.Duration(i) * time.Second / (2 * rate)
		})
		if len(accepts) != clients {
			t.Fatalf("%d of %d admitted", len(accepts), clients)
		}
		if most := maxPerSecond(accepts); most > rate+burst {
			t.Fatalf("%d admitted in one second, over rate+burst %d", most, rate+burst)
		}
	})
}

// TestAcceptBudget_MaxSessions: the cap refuses once it is reached, with a
// delay in the documented window, and a released session makes room.
func TestAcceptBudget_MaxSessions(t *testing.T) {
	t.Parallel()
	b := newAcceptBudget(-1, 0, 3, rand.New(rand.NewPCG(5, 6)))
	now := time.Unix(0, 0)
	for range 3 {
		if ok, _, _ := b.admit(now); !ok {
			t.Fatal("refused under the cap")
		}
	}
	ok, reason, after := b.admit(now)
	if ok || reason != rejectMaxSessions || after < fullDelayMin || after >= fullDelayMax {
		t.Fatalf("over the cap: ok=%v reason=%q after=%v", ok, reason, after)
	}
	b.release()
	if ok, _, _ := b.admit(now); !ok {
		t.Fatal("refused after a release")
	}
}

// TestAcceptBudget_Off: a negative rate and cap admit everyone.
func TestAcceptBudget_Off(t *testing.T) {
	t.Parallel()
	b := newAcceptBudget(-1, 0, -1, rand.New(rand.NewPCG(5, 6)))
	now := time.Unix(0, 0)
	for range 100000 {
		if ok, _, _ := b.admit(now); !ok {
			t.Fatal("refused with no budget")
		}
	}
}

// TestAcceptBudget_TinyRate: at a rate whose token time does not fit a
// Duration, refusals are still spread over a minute (the slot once
// overflowed to 1µs: every refused client came straight back).
func TestAcceptBudget_TinyRate(t *testing.T) {
	t.Parallel()
	for _, r := range []float64{1e-3, 1e-11, 1e-300} {
		b := newAcceptBudget(r, 1, -1, rand.New(rand.NewPCG(1, 2)))
		now := time.Unix(1_700_000_000, 0)
		if ok, _, _ := b.admit(now); !ok {
			t.Fatalf("rate %g: first admit refused", r)
		}
		var sum time.Duration
		const n = 1000
		for range n {
			ok, reason, after := b.admit(now)
			if ok || reason != rejectRate || after <= 0 || after > maxRefusalDelay {
				t.Fatalf("rate %g: admit = %v, %q, %v", r, ok, reason, after)
			}
			sum += after
		}
		if mean := sum / n; mean < 20*time.Second || mean > 40*time.Second {
			t.Errorf("rate %g: mean refusal delay %v, want about 30s (uniform over a minute)", r, mean)
		}
		if reason, after, full := b.full(now); !full || reason != rejectRate || after <= 0 || after > maxRefusalDelay {
			t.Errorf("rate %g: full = %q, %v, %v", r, reason, after, full)
		}
	}
}
