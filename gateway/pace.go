package gateway

import (
	"runtime"
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
// out together. Quiet sessions (whose frames are further apart than the
// delay) are never held back, and a session whose queue fills up writes at
// once.
//
// The node is busy when its own CPU use over the last tick exceeds
// PaceCPU of its cores, or when it writes more than WriteBudget messages a
// second. While busy the delay grows by half each pacerTick (starting at
// pacerMinDelay); while clearly idle (CPU under 60% of PaceCPU and the rate
// under half the budget) it halves; in between it holds. It stays within
// [0, MaxWriteDelay].
type pacer struct {
	budget   float64 // writes per second
	cpuShare float64 // busy above this share of the cores
	cores    float64
	maxDelay int64 // nanoseconds
	cpuTime  func() time.Duration
	stop     <-chan struct{}
	gauge    interface{ Set(float64) }

	writes  atomic.Int64 // since the last tick
	delayNs atomic.Int64
}

const (
	pacerTick     = 50 * time.Millisecond
	pacerMinDelay = time.Millisecond
)

func newPacer(cfg Config, stop <-chan struct{}, gauge interface{ Set(float64) }) *pacer {
	return &pacer{
		budget:   float64(cfg.WriteBudget),
		cpuShare: cfg.PaceCPU,
		cores:    float64(runtime.GOMAXPROCS(0)),
		maxDelay: int64(cfg.MaxWriteDelay),
		cpuTime:  cfg.CPUTime,
		stop:     stop,
		gauge:    gauge,
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
	for {
		select {
		case <-p.stop:
			return
		case now := <-t.C:
			cpu := p.cpuTime()
			wall := now.Sub(last).Seconds()
			if wall <= 0 {
				continue
			}
			p.adjust(float64(p.writes.Swap(0))/wall, (cpu-lastCPU).Seconds()/wall/p.cores)
			last, lastCPU = now, cpu
		}
	}
}

// adjust moves the delay given the last tick's write rate (per second) and
// CPU use (the share of the node's cores, 0 when unknown).
func (p *pacer) adjust(rate, cpu float64) {
	d := p.delayNs.Load()
	busy := rate > p.budget || cpu > p.cpuShare
	idle := rate < p.budget/2 && cpu < p.cpuShare*0.6
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
	d = min(d, p.maxDelay)
	p.delayNs.Store(d)
	p.gauge.Set(time.Duration(d).Seconds())
}
