package gateway

import (
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
	p.adjust(500, 0.1)
	if p.delay() != 0 {
		t.Fatalf("idle: delay %v", p.delay())
	}
	p.adjust(2000, 0.1) // over the write budget
	if p.delay() != pacerMinDelay {
		t.Fatalf("first busy tick: delay %v, want %v", p.delay(), pacerMinDelay)
	}
	p.adjust(100, 0.9) // CPU over its share
	if want := pacerMinDelay * 3 / 2; p.delay() != want {
		t.Fatalf("second busy tick: delay %v, want %v", p.delay(), want)
	}
	for range 30 {
		p.adjust(100, 0.9)
	}
	if p.delay() != 50*time.Millisecond || g.v != 0.05 {
		t.Fatalf("bound: delay %v gauge %v", p.delay(), g.v)
	}
	p.adjust(100, 0.4) // between idle and busy: hold
	if p.delay() != 50*time.Millisecond {
		t.Fatalf("hold: delay %v", p.delay())
	}
	for range 10 {
		p.adjust(100, 0.1)
	}
	if p.delay() != 0 || g.v != 0 {
		t.Fatalf("idle again: delay %v gauge %v", p.delay(), g.v)
	}
}
