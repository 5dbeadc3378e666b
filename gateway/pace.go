package gateway

import (
	"sync/atomic"
	"time"
)

// pacer keeps the node's WebSocket write rate near a budget by making busy
// sessions batch. Each message costs the sender a syscall and a trip
// through the TCP stack whatever its size (5-15 µs of CPU on the machine in
// docs/benchmarks.md), so writing each frame alone stops scaling long
// before the CPU is spent on the frames themselves.
//
// When the node writes more than WriteBudget messages a second, every
// session waits up to the current delay after its last write before
// writing again, and the frames queued meanwhile go out together. Quiet
// sessions (whose frames are further apart than the delay) are never held
// back, a session whose queue fills up writes at once, and with the rate
// under budget the delay is zero.
//
// Every pacerTick the delay is scaled by measured rate / budget (halved
// when the rate is under half the budget), within [0, MaxWriteDelay].
type pacer struct {
	budget   float64 // writes per second
	maxDelay int64   // nanoseconds
	stop     <-chan struct{}
	gauge    interface{ Set(float64) }

	writes  atomic.Int64 // since the last tick
	delayNs atomic.Int64
}

const (
	pacerTick     = 50 * time.Millisecond
	pacerMinDelay = 250 * time.Microsecond
)

func newPacer(budget int, maxDelay time.Duration, stop <-chan struct{}, gauge interface{ Set(float64) }) *pacer {
	return &pacer{budget: float64(budget), maxDelay: int64(maxDelay), stop: stop, gauge: gauge}
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
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			p.adjust(float64(p.writes.Swap(0)) / pacerTick.Seconds())
		}
	}
}

// adjust moves the delay toward the value that would bring rate to budget.
func (p *pacer) adjust(rate float64) {
	d := p.delayNs.Load()
	switch {
	case rate > p.budget && d == 0:
		d = int64(pacerMinDelay)
	case rate > p.budget:
		d = int64(float64(d) * rate / p.budget)
	case rate < p.budget/2:
		d /= 2
	}
	if d < int64(pacerMinDelay) && rate <= p.budget {
		d = 0
	}
	d = min(d, p.maxDelay)
	p.delayNs.Store(d)
	p.gauge.Set(time.Duration(d).Seconds())
}
