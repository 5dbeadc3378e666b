package gateway

import (
	"testing"
	"time"
)

type gaugeRecorder struct{ v float64 }

func (g *gaugeRecorder) Set(v float64) { g.v = v }

// TestPacer_Adjust: the delay starts when writes exceed the budget, scales
// with the overshoot, stays within the bound, and falls back to zero once
// writes are well under budget.
func TestPacer_Adjust(t *testing.T) {
	g := &gaugeRecorder{}
	p := newPacer(1000, 50*time.Millisecond, nil, g)
	p.adjust(500)
	if p.delay() != 0 {
		t.Fatalf("under budget: delay %v", p.delay())
	}
	p.adjust(2000)
	if p.delay() != pacerMinDelay {
		t.Fatalf("first overshoot: delay %v, want %v", p.delay(), pacerMinDelay)
	}
	p.adjust(4000)
	if p.delay() != 4*pacerMinDelay {
		t.Fatalf("4x overshoot: delay %v, want %v", p.delay(), 4*pacerMinDelay)
	}
	for range 20 {
		p.adjust(1e6)
	}
	if p.delay() != 50*time.Millisecond || g.v != 0.05 {
		t.Fatalf("bound: delay %v gauge %v", p.delay(), g.v)
	}
	p.adjust(800) // between half and the budget: hold
	if p.delay() != 50*time.Millisecond {
		t.Fatalf("hold: delay %v", p.delay())
	}
	for range 10 {
		p.adjust(100)
	}
	if p.delay() != 0 || g.v != 0 {
		t.Fatalf("idle: delay %v gauge %v", p.delay(), g.v)
	}
}
