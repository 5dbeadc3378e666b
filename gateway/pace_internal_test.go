package gateway

import (
	"math"
	rtmetrics "runtime/metrics"
	"sync/atomic"
	"testing"
	"time"
)

type gaugeRecorder struct{ v float64 }

func (g *gaugeRecorder) Set(v float64) { g.v = v }

// TestPacer_Adjust: the delay starts when the node is busy (CPU over its
// share, or writes over budget), grows while busy within its bound, holds in
// between, and falls back to zero once clearly idle.
func TestPacer_Adjust(t *testing.T) {
	g := &gaugeRecorder{}
	cfg, err := Config{WriteBudget: 1000, PaceCPU: 0.5, MaxWriteDelay: 50 * time.Millisecond}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	p := newPacer(cfg, nil, g)
	p.adjust(500, 0.1, false)
	if p.delay() != 0 {
		t.Fatalf("idle: delay %v", p.delay())
	}
	p.adjust(2000, 0.1, false) // over the write budget
	if p.delay() != pacerMinDelay {
		t.Fatalf("first busy tick: delay %v, want %v", p.delay(), pacerMinDelay)
	}
	p.adjust(100, 0.9, false) // CPU over its share
	if want := pacerMinDelay * 3 / 2; p.delay() != want {
		t.Fatalf("second busy tick: delay %v, want %v", p.delay(), want)
	}
	for range 30 {
		p.adjust(100, 0.9, false)
	}
	if p.delay() != 50*time.Millisecond || g.v != 0.05 {
		t.Fatalf("bound: delay %v gauge %v", p.delay(), g.v)
	}
	p.adjust(100, 0.4, false) // between idle and busy: hold
	if p.delay() != 50*time.Millisecond {
		t.Fatalf("hold: delay %v", p.delay())
	}
	for range 10 {
		p.adjust(100, 0.1, false)
	}
	if p.delay() != 0 || g.v != 0 {
		t.Fatalf("idle again: delay %v gauge %v", p.delay(), g.v)
	}
}

// TestPacer_Overload: an overloaded node paces even with its own CPU and
// write rate low, its delay may grow to OverloadWriteDelay, and after the
// overload it eases back to MaxWriteDelay (not to zero) while busy, by a
// sixteenth per tick.
func TestPacer_Overload(t *testing.T) {
	g := &gaugeRecorder{}
	cfg, err := Config{WriteBudget: 1000, PaceCPU: 0.5, MaxWriteDelay: 50 * time.Millisecond, OverloadWriteDelay: 80 * time.Millisecond}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	p := newPacer(cfg, nil, g)
	p.adjust(100, 0.1, true) // low CPU and rate, but overloaded
	if p.delay() != pacerMinDelay {
		t.Fatalf("first overloaded tick: delay %v, want %v", p.delay(), pacerMinDelay)
	}
	for range 40 {
		p.adjust(100, 0.9, true)
	}
	if p.delay() != 80*time.Millisecond || g.v != 0.08 {
		t.Fatalf("overload bound: delay %v gauge %v, want 80ms", p.delay(), g.v)
	}
	p.adjust(100, 0.9, false) // still busy, no longer overloaded
	if want := 75 * time.Millisecond; p.delay() != want {
		t.Fatalf("easing back: delay %v, want %v", p.delay(), want)
	}
	for range 10 {
		p.adjust(100, 0.9, false)
	}
	if p.delay() != 50*time.Millisecond {
		t.Fatalf("after the overload: delay %v, want the normal bound 50ms", p.delay())
	}
}

// TestConfig_WriteDelays: the pacing bounds default to 20 and 75 ms, and
// a bound over maxPaceDelay is refused rather than left to overflow.
func TestConfig_WriteDelays(t *testing.T) {
	cfg, err := Config{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MaxWriteDelay != 20*time.Millisecond || cfg.OverloadWriteDelay != 75*time.Millisecond {
		t.Fatalf("defaults: MaxWriteDelay %v, OverloadWriteDelay %v; want 20ms, 75ms", cfg.MaxWriteDelay, cfg.OverloadWriteDelay)
	}
	for _, c := range []Config{{MaxWriteDelay: maxPaceDelay + 1}, {OverloadWriteDelay: math.MaxInt64}} {
		if _, err := c.withDefaults(); err == nil {
			t.Errorf("MaxWriteDelay %v, OverloadWriteDelay %v: accepted", c.MaxWriteDelay, c.OverloadWriteDelay)
		}
	}
}

// TestPacer_OverloadBoundNotBelowMax: an OverloadWriteDelay under
// MaxWriteDelay does not shrink the delay when the node is overloaded.
func TestPacer_OverloadBoundNotBelowMax(t *testing.T) {
	cfg, err := Config{WriteBudget: 1000, PaceCPU: 0.5, MaxWriteDelay: 30 * time.Millisecond, OverloadWriteDelay: 10 * time.Millisecond}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	p := newPacer(cfg, nil, &gaugeRecorder{})
	for range 40 {
		p.adjust(100, 0.9, false)
	}
	if p.delay() != 30*time.Millisecond {
		t.Fatalf("busy bound: delay %v, want 30ms", p.delay())
	}
	for range 5 {
		p.adjust(100, 0.9, true)
	}
	if p.delay() != 30*time.Millisecond {
		t.Fatalf("overloaded: delay %v, want MaxWriteDelay (30ms)", p.delay())
	}
}

// TestPacer_Overloaded: the moving average of the long-wait share decides:
// a bad tick or two is not an overload, a run of them is, a tick with too few
// waits does not move it, and it falls back once the waits are short.
func TestPacer_Overloaded(t *testing.T) {
	cfg, err := Config{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	p := newPacer(cfg, nil, &gaugeRecorder{})
	for i := range 2 {
		if p.overloaded(900, 1000) {
			t.Fatalf("%d ticks at 90%% made an overload", i+1)
		}
	}
	if !p.overloaded(900, 1000) {
		t.Fatalf("three ticks at 90%% (average %.2f) did not", p.waitShare)
	}
	for range 4 {
		p.overloaded(200, 1000) // 20%, as the lighter benchmarks
	}
	if p.overloaded(200, 1000) {
		t.Fatalf("still overloaded after five ticks at 20%% (average %.2f)", p.waitShare)
	}
	// A quiet node reports almost no waits: the missing ones count as
	// short, so the average falls instead of freezing.
	for range 3 {
		p.overloaded(900, 1000)
	}
	for range 5 {
		p.overloaded(5, 5) // all long, but only 5 of minWaits
	}
	if p.overloaded(0, 0) {
		t.Fatalf("still overloaded after six quiet ticks (average %.2f)", p.waitShare)
	}
}

// TestCountWaits checks which buckets count as long: those starting at
// the bound or later; not the one straddling it, nor the -Inf one.
func TestCountWaits(t *testing.T) {
	inf := math.Inf(1)
	h := &rtmetrics.Float64Histogram{
		Counts:  []uint64{1, 2, 4, 8, 16},
		Buckets: []float64{-inf, 0.0005, 0.0009, 0.0010, 0.0020, inf},
	}
	// [−Inf,0.5ms) [0.5,0.9ms) [0.9,1.0ms) [1.0,2.0ms) [2.0ms,+Inf)
	long, total := countWaits(h, 0.001)
	if long != 8+16 || total != 31 {
		t.Fatalf("countWaits(1ms) = %d, %d; want 24, 31", long, total)
	}
	long, _ = countWaits(h, 0.00095) // inside [0.9,1.0ms): that bucket is short
	if long != 8+16 {
		t.Fatalf("countWaits(0.95ms) long = %d, want 24", long)
	}
	if long, total := countWaits(&rtmetrics.Float64Histogram{Buckets: []float64{-inf}}, 0.001); long != 0 || total != 0 {
		t.Fatalf("empty histogram: %d, %d", long, total)
	}
}

// TestRuntimeSchedWaits reads the real runtime metric: goroutines that
// wait for each other must leave samples, never more long than total.
func TestRuntimeSchedWaits(t *testing.T) {
	_, before := runtimeSchedWaits()
	done := make(chan struct{})
	for range 1000 {
		go func() { done <- struct{}{} }()
	}
	for range 1000 {
		<-done
	}
	long, total := runtimeSchedWaits()
	if total <= before {
		t.Fatalf("no scheduling waits sampled: total %d, before %d", total, before)
	}
	if long > total {
		t.Fatalf("long %d > total %d", long, total)
	}
}

// TestPacer_RunOverload runs the pacer's loop with injected clocks: the
// node's own CPU and write rate stay at zero, but the scheduler reports
// 90% of its waits as long, so the delay must climb to
// OverloadWriteDelay; once the waits are short again it must come back down.
func TestPacer_RunOverload(t *testing.T) {
	var long, total atomic.Uint64
	share := atomic.Int64{} // percent of each tick's waits that are long
	share.Store(90)
	var sparse atomic.Bool
	var reads atomic.Int64
	g := &syncGauge{}
	cfg, err := Config{
		MaxWriteDelay:      4 * time.Millisecond,
		OverloadWriteDelay: 6 * time.Millisecond,
		CPUTime:            func() time.Duration { return 0 },
		SchedWaits: func() (uint64, uint64) {
			reads.Add(1)
			// Each read adds a tick's worth of waits: 1,000 at 90%
			// long, or, once sparse, 5 (all long).
			if sparse.Load() {
				long.Add(5)
				return long.Load(), total.Add(5)
			}
			long.Add(uint64(10 * share.Load()))
			return long.Load(), total.Add(1000)
		},
	}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	p := newPacer(cfg, stop, g)
	ticks := &countInc{}
	p.overloads = ticks
	done := make(chan struct{})
	go func() { defer close(done); p.run() }()
	defer func() { close(stop); <-done }()

	waitDelay := func(want time.Duration) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for p.delay() != want {
			if time.Now().After(deadline) {
				t.Fatalf("delay %v, want %v within 10s", p.delay(), want)
			}
			time.Sleep(pacerTick / 5) // polling the pacer with a deadline
		}
	}
	waitDelay(6 * time.Millisecond)
	if ticks.n.Load() == 0 {
		t.Fatal("no overloaded tick counted")
	}
	// The load stops: almost no waits are sampled any more. The pacer
	// must not stay overloaded on its last average.
	sparse.Store(true)
	waitDelay(0) // not overloaded, not busy, clearly idle: back to none
	if g.get() != 0 {
		t.Fatalf("gauge %v after the overload, want 0", g.get())
	}
	n, r := ticks.n.Load(), reads.Load()
	deadline := time.Now().Add(10 * time.Second)
	for reads.Load() < r+5 { // five more ticks (each reads SchedWaits once)
		if time.Now().After(deadline) {
			t.Fatal("the pacer stopped ticking")
		}
		time.Sleep(pacerTick / 5) // polling the tick count with a deadline
	}
	if m := ticks.n.Load(); m != n {
		t.Fatalf("%d more overloaded ticks on a quiet node", m-n)
	}
}

// syncGauge is a gauge safe to read while the pacer's loop sets it.
type syncGauge struct{ v atomic.Uint64 }

func (g *syncGauge) Set(v float64) { g.v.Store(math.Float64bits(v)) }
func (g *syncGauge) get() float64  { return math.Float64frombits(g.v.Load()) }

// countInc counts Inc calls.
type countInc struct{ n atomic.Int64 }

func (c *countInc) Inc() { c.n.Add(1) }
