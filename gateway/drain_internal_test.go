package gateway

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/syncgate/syncgate/storage"
)

// TestDrainPlan_SlotsCoverSpread: n sessions get n distinct delays, delay i
// inside slot i of spread/n, so the slots cover the spread and every
// stretch of it holds its share of sessions to within one.
func TestDrainPlan_SlotsCoverSpread(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		n      int
		spread time.Duration
	}{
		{"one", 1, 30 * time.Second},
		{"few", 7, time.Second},
		{"default spread", 10000, 30 * time.Second},
		{"more sessions than ms", 50000, 30 * time.Second},
		{"uneven", 997, 3 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			plan := drainPlan(tc.n, tc.spread, rand.New(rand.NewPCG(1, 2)))
			if len(plan) != tc.n {
				t.Fatalf("%d delays for %d sessions", len(plan), tc.n)
			}
			ms := tc.spread.Milliseconds()
			for i, d := range plan {
				lo := time.Duration(ms*int64(i)/int64(tc.n)) * time.Millisecond
				hi := time.Duration(ms*int64(i+1)/int64(tc.n)) * time.Millisecond
				if d%time.Millisecond != 0 {
					t.Fatalf("delay %d = %v, not in whole milliseconds", i, d)
				}
				if d < lo || (d >= hi && hi > lo) || (hi == lo && d != lo) {
					t.Fatalf("delay %d = %v, outside its slot [%v, %v)", i, d, lo, hi)
				}
				if i > 0 && (d < plan[i-1] || (int64(tc.n) <= ms && d == plan[i-1])) {
					t.Fatalf("delays %d and %d not rising (distinct while slots are ≥ 1ms): %v, %v", i-1, i, plan[i-1], d)
				}
			}
			// Uniform to within one slot: any window [a, b) of the spread
			// holds n·(b-a)/spread sessions, give or take the one session
			// of a slot cut by each end of the window.
			step := tc.spread / 13
			for a := time.Duration(0); a < tc.spread; a += step {
				b := min(a+step*3, tc.spread)
				got := 0
				for _, d := range plan {
					if d >= a && d < b {
						got++
					}
				}
				want := float64(tc.n) * float64(b-a) / float64(tc.spread)
				if float64(got) <= want-2 || float64(got) >= want+2 {
					t.Fatalf("window [%v, %v): %d sessions, want %.1f (within one slot at each end)", a, b, got, want)
				}
			}
		})
	}
}

// TestDrainPlan_Deterministic: the same random source gives the same plan;
// another gives another (the jitter is real).
func TestDrainPlan_Deterministic(t *testing.T) {
	t.Parallel()
	a := drainPlan(1000, 30*time.Second, rand.New(rand.NewPCG(7, 7)))
	b := drainPlan(1000, 30*time.Second, rand.New(rand.NewPCG(7, 7)))
	c := drainPlan(1000, 30*time.Second, rand.New(rand.NewPCG(8, 8)))
	if !slices.Equal(a, b) {
		t.Fatal("same seed, different plans")
	}
	if slices.Equal(a, c) {
		t.Fatal("different seeds, same plan: no jitter")
	}
}

// TestDrainPlan_NoSpread: a spread of zero (or less) tells everyone to go
// at once.
func TestDrainPlan_NoSpread(t *testing.T) {
	t.Parallel()
	for _, d := range drainPlan(5, -1, rand.New(rand.NewPCG(1, 1))) {
		if d != 0 {
			t.Fatalf("delay %v with no spread", d)
		}
	}
	if len(drainPlan(0, time.Second, nil)) != 0 {
		t.Fatal("a plan for no sessions")
	}
}

func TestAfterMs_RoundsUp(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]int64{0: 0, -time.Second: 0, 1: 1, time.Millisecond: 1, time.Millisecond + 1: 2, 1500 * time.Microsecond: 2} {
		if got := afterMs(d); got != want {
			t.Errorf("afterMs(%v) = %d, want %d", d, got, want)
		}
	}
}

// TestConfig_DrainBounds: a drain spread or grace over an hour is refused:
// no session may be told to wait longer than frames.MaxAfterMs.
func TestConfig_DrainBounds(t *testing.T) {
	for _, c := range []Config{{DrainSpread: time.Hour + 1}, {DrainGrace: math.MaxInt64}} {
		if _, err := c.withDefaults(); err == nil {
			t.Errorf("DrainSpread %v, DrainGrace %v: accepted", c.DrainSpread, c.DrainGrace)
		}
	}
	if _, err := (Config{DrainSpread: time.Hour, DrainGrace: time.Hour}).withDefaults(); err != nil {
		t.Errorf("an hour each: %v", err)
	}
}

// TestConfig_AcceptRateAndBuildID: a NaN rate or PaceCPU is refused (a
// rate read as "off"), a huge accept rate gets a burst within int's range, and a BuildID
// longer than a hello may carry is refused at New.
func TestConfig_AcceptRateAndBuildID(t *testing.T) {
	for _, c := range []Config{{AcceptRate: math.NaN()}, {FrameRate: math.NaN()}, {BadTokenRate: math.NaN()}, {PaceCPU: math.NaN()}} {
		if _, err := c.withDefaults(); err == nil {
			t.Errorf("%+v: NaN accepted", c)
		}
	}
	c, err := (Config{AcceptRate: 1e19}).withDefaults()
	if err != nil || c.AcceptBurst != 1<<30 {
		t.Errorf("AcceptRate 1e19: burst %d, %v; want %d", c.AcceptBurst, err, 1<<30)
	}
	if _, err := (Config{BuildID: strings.Repeat("b", maxBuildIDLen+1)}).withDefaults(); err == nil {
		t.Error("BuildID over maxBuildIDLen accepted")
	}
	if _, err := (Config{BuildID: strings.Repeat("b", maxBuildIDLen)}).withDefaults(); err != nil {
		t.Errorf("BuildID at the limit: %v", err)
	}
}

// TestConfig_MaxAppendBytes: an append bound over the log's limit is
// refused at New, not by the log's Open later (or by a failed commit).
func TestConfig_MaxAppendBytes(t *testing.T) {
	if _, err := (Config{MaxAppendBytes: storage.MaxAppendLimit + 1}).withDefaults(); err == nil {
		t.Error("MaxAppendBytes over storage.MaxAppendLimit accepted")
	}
	if _, err := (Config{MaxAppendBytes: storage.MaxAppendLimit}).withDefaults(); err != nil {
		t.Errorf("MaxAppendBytes at the limit: %v", err)
	}
}

// TestConfig_PersistPatterns: Persist patterns are token-grant patterns:
// "*" is one segment, a final "**" the rest; a bad one fails New.
func TestConfig_PersistPatterns(t *testing.T) {
	for _, bad := range []string{"room-*", "a*b", "chat:[", ""} {
		if _, err := (Config{Persist: []string{"ok:*", bad}}).withDefaults(); err == nil {
			t.Errorf("pattern %q accepted", bad)
		}
	}
	srv := &Server{persist: persistPatterns([]string{"chat:*", "orders:**"})}
	for topic, want := range map[string]bool{
		"chat:a": true, "chat:a:b": false, "chat:a/b": false, "chat": false,
		"orders:1": true, "orders:1:lines": true, "orders": false, "notes:a": false,
	} {
		if got := srv.persisted(topic); got != want {
			t.Errorf("persisted(%q) = %v, want %v", topic, got, want)
		}
	}
}
