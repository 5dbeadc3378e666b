package gateway

import (
	"testing"
	"time"
)

// TestProducers_Cap: a full table forgets producers with no session, and
// keeps those in use.
func TestProducers_Cap(t *testing.T) {
	tab := &producers{window: 4, idle: time.Hour, max: 2, m: map[string]*producer{}}
	now := time.Unix(1000, 0)
	a := tab.acquire("a", 0)
	b := tab.acquire("b", 0)
	tab.release(b, now)
	tab.acquire("c", 0) // full: b (idle) goes, a (in use) stays
	if _, ok := tab.m["b"]; ok {
		t.Fatal("idle producer kept in a full table")
	}
	if tab.m["a"] != a || tab.m["c"] == nil {
		t.Fatalf("table = %v", tab.m)
	}
}
