package gateway

import (
	"runtime"
	rtmetrics "runtime/metrics"
	"sync/atomic"
	"time"
)

// pacer makes busy sessions batch when the node is busy. Each WebSocket
// message costs the sender a syscall and a trip through the TCP stack
// whatever its size (5-15 µs of CPU on the machine in docs/benchmarks.md),
// so writing each frame alone stops scaling long before the CPU is spent on
// the frames themselves.
//
// While the pacing delay is non-zero, every session waits up to it after
// its last write before writing again, and the frames queued meanwhile go
// out together. Only sessions a hold would batch are held (see
// session.holdFor): not one whose frames come about a delay apart or
// further; one whose frames come fast waits only until a full batch has
// come, and one that gets only a few frames a delay at most a frame gap
// and a quarter after its last write. A session whose queue fills up
// writes at once.
//
// The node is busy when its own CPU use over the last tick exceeds
// PaceCPU of its cores, or when it writes more than WriteBudget messages a
// second. While busy the delay grows by half each pacerTick (starting at
// pacerMinDelay); while clearly idle (CPU under 60% of PaceCPU and the rate
// under half the budget) it halves; in between it holds. It stays within
// [0, MaxWriteDelay] ([0, OverloadWriteDelay] while overloaded).
//
// Overload is a stronger state, seen from the Go scheduler rather than
// from the node's own CPU: the share of scheduling waits of about a
// millisecond or more (runnable goroutines queueing for the cores:
// writers readied faster than they run, or other processes taking the
// cores), averaged over the last few ticks, above 40%. While overloaded
// the node counts as busy whatever its CPU and rate, and the delay may
// grow to OverloadWriteDelay; once the overload ends it eases back to
// MaxWriteDelay by a sixteenth per tick, so that an overload the average
// sees on and off keeps the delay up rather than swinging it (see
// easeBack). On the benchmark machine, with a
// goroutine per busy session, 5,000 subscribers × 100 msg/s (500,000
// deliveries a second on 2 cores) had a median tick share of 51%
// (quartiles 35-67%) and a p99 of seconds at the 50 ms bound; 1,000 ×
// 1,000 had 24% (13-41%, so it is sometimes judged overloaded too) and the
// topics run 21% (11-34%) (docs/benchmarks.md). With shared writers
// (writerPool) sessions waiting for a writer are no longer goroutines the
// scheduler sees, so the waits also count the sessions the pool took, as
// long those it took late (see writerPool.waits).
type pacer struct {
	budget     float64 // writes per second
	cpuShare   float64 // busy above this share of the cores
	cores      float64
	maxDelay   int64 // nanoseconds
	overDelay  int64 // nanoseconds: the bound while overloaded, at least maxDelay
	cpuTime    func() time.Duration
	schedWaits func() (long, total uint64)
	stop       <-chan struct{}
	gauge      interface{ Set(float64) }
	overloads  interface{ Inc() } // counts overloaded ticks; nil in tests

	writes    atomic.Int64 // since the last tick
	delayNs   atomic.Int64
	waitShare float64 // moving average of the long-wait share; owned by run
}

const (
	pacerTick     = 50 * time.Millisecond
	pacerMinDelay = time.Millisecond

	// overloadShare is the share of scheduling waits over longWait
	// (late turns for the writer pool, see writerPool.waits),
	// averaged with weight shareWeight for the newest tick, above which
	// the node is overloaded.
	overloadShare = 0.4
	shareWeight   = 0.25
	longWait      = time.Millisecond
	// easeBack is the share of the delay shed per tick on the way back
	// from an overload's bound to MaxWriteDelay: 1/16, so about 20 ticks
	// (1 s) from 75 to 20 ms while still busy. The overload average
	// flickers around its threshold under a sustained overload; at a
	// quarter per tick each flicker dropped the delay toward
	// MaxWriteDelay and the backlog grew meanwhile (5,000 × 100 on the
	// benchmark machine, with a temporary build that counted ready waits
	// from 10 ms: p99 119-133 ms against 101-108, three runs each;
	// docs/benchmarks.md, "A shorter pacing delay").
	easeBack = 16
	// minWaits is the fewest waits a tick needs for its share to count.
	minWaits = 100
)

func newPacer(cfg Config, stop <-chan struct{}, gauge interface{ Set(float64) }) *pacer {
	return &pacer{
		budget:     float64(cfg.WriteBudget),
		cpuShare:   cfg.PaceCPU,
		cores:      float64(runtime.GOMAXPROCS(0)),
		maxDelay:   int64(cfg.MaxWriteDelay),
		overDelay:  int64(cfg.OverloadWriteDelay),
		cpuTime:    cfg.CPUTime,
		schedWaits: cfg.SchedWaits,
		stop:       stop,
		gauge:      gauge,
	}
}

// wrote counts one WebSocket message written.
func (p *pacer) wrote() { p.writes.Add(1) }

// delay is how long a session should leave between its writes now.
func (p *pacer) delay() time.Duration { return time.Duration(p.delayNs.Load()) }

func (p *pacer) run() {
	if p.maxDelay <= 0 {
		return
	}
	t := time.NewTicker(pacerTick)
	defer t.Stop()
	last, lastCPU := time.Now(), p.cpuTime()
	lastLong, lastTotal := p.schedWaits()
	for {
		select {
		case <-p.stop:
			return
		case now := <-t.C:
			cpu := p.cpuTime()
			long, total := p.schedWaits()
			wall := now.Sub(last).Seconds()
			if wall <= 0 {
				continue
			}
			var over bool
			if long >= lastLong && total >= lastTotal && total-lastTotal >= long-lastLong {
				over = p.overloaded(long-lastLong, total-lastTotal)
			} // else counters that went backwards: judge nothing this tick
			if over && p.overloads != nil {
				p.overloads.Inc()
			}
			p.adjust(float64(p.writes.Swap(0))/wall, (cpu-lastCPU).Seconds()/wall/p.cores, over)
			last, lastCPU = now, cpu
			lastLong, lastTotal = long, total
		}
	}
}

// overloaded folds a tick with total scheduling waits, long of them over
// longWait (late, for the writer pool's turns: see writerPool.waits), into
// the moving average and reports whether it shows the node overloaded. A
// tick with fewer than minWaits waits counts the missing ones as short:
// the runtime samples about one wait in eight, so a quiet node reports
// almost none, and its average must still fall.
func (p *pacer) overloaded(long, total uint64) bool {
	share := float64(long) / float64(max(total, minWaits))
	p.waitShare += shareWeight * (share - p.waitShare)
	return p.waitShare > overloadShare
}

// schedLatencies is the runtime metric runtimeSchedWaits reads.
const schedLatencies = "/sched/latencies:seconds"

// runtimeSchedWaits counts the Go runtime's sampled scheduling waits since
// the process started, and those of longWait or more (see countWaits).
func runtimeSchedWaits() (long, total uint64) {
	s := []rtmetrics.Sample{{Name: schedLatencies}}
	rtmetrics.Read(s)
	if s[0].Value.Kind() != rtmetrics.KindFloat64Histogram {
		return 0, 0 // not offered by this runtime: never overloaded
	}
	return countWaits(s[0].Value.Float64Histogram(), longWait.Seconds())
}

// countWaits sums h's counts, and those of the buckets that start at min
// seconds or later. Bucket i holds [Buckets[i], Buckets[i+1]); the bucket
// that straddles min is not counted as long, so with the runtime's
// boundaries "long" starts at the first boundary at or above min (1.048576
// ms for 1 ms).
func countWaits(h *rtmetrics.Float64Histogram, min float64) (long, total uint64) {
	for i, n := range h.Counts {
		total += n
		if h.Buckets[i] >= min {
			long += n
		}
	}
	return long, total
}

// adjust moves the delay given the last tick's write rate (per second),
// CPU use (the share of the node's cores, 0 when unknown) and whether the
// scheduler showed the node overloaded.
func (p *pacer) adjust(rate, cpu float64, overload bool) {
	d := p.delayNs.Load()
	busy := rate > p.budget || cpu > p.cpuShare || overload
	idle := rate < p.budget/2 && cpu < p.cpuShare*0.6 && !overload
	bound := p.maxDelay
	switch {
	case overload:
		bound = p.overDelay
	case d > p.maxDelay:
		bound = max(p.maxDelay, d-d/easeBack) // ease back after an overload
	}
	switch {
	case busy && d == 0:
		d = int64(pacerMinDelay)
	case busy:
		d += d / 2
	case idle:
		d /= 2
		if d < int64(pacerMinDelay) {
			d = 0
		}
	}
	d = min(d, bound)
	p.delayNs.Store(d)
	p.gauge.Set(time.Duration(d).Seconds())
}
