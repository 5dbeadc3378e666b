package presence_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/syncgate/syncgate/presence"
	"github.com/syncgate/syncgate/presence/presencetest"
)

func newMemory(t testing.TB, cfg presence.Config) *presence.MemoryRegistry {
	t.Helper()
	r, err := presence.NewMemoryRegistry(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestMemoryRegistry_Contract(t *testing.T) {
	presencetest.Run(t, func(t *testing.T, cfg presence.Config) presence.Registry {
		return newMemory(t, cfg)
	})
}

func TestNewMemoryRegistry_Config(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  presence.Config
		ok   bool
	}{
		{"zero", presence.Config{}, true},
		{"negative TTL", presence.Config{TTL: -1}, false},
		{"negative MaxListed", presence.Config{MaxListed: -1}, false},
		{"grace below window", presence.Config{Window: time.Second, LeaveGrace: time.Millisecond}, false},
		{"grace default below window", presence.Config{Window: 2 * time.Second}, false},
		{"grace equal window", presence.Config{Window: time.Second, LeaveGrace: time.Second}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := presence.NewMemoryRegistry(tc.cfg)
			if (err == nil) != tc.ok {
				t.Errorf("NewMemoryRegistry(%+v) error = %v, want ok %v", tc.cfg, err, tc.ok)
			}
		})
	}
}

// TestMemoryRegistry_TTL_synctest runs the default configuration on the
// default clock inside a synctest bubble: the member expires after 30s
// without refresh and stays while refreshed every 10s.
func TestMemoryRegistry_TTL_synctest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := t.Context()
		r := newMemory(t, presence.Config{})
		for _, h := range []string{"alive", "quiet"} {
			if _, err := r.Join(ctx, "room", h, presence.Member{ID: h}); err != nil {
				t.Fatal(err)
			}
		}
		flush := func() []presence.Diff {
			ds, err := r.Flush(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return ds
		}
		time.Sleep(100 * time.Millisecond)
		if ds := flush(); len(ds) != 1 || len(ds[0].Joins) != 2 {
			t.Fatalf("joins: %+v", ds)
		}

		ticker := time.NewTicker(10 * time.Second) // TTL/3, as the gateway refreshes
		defer ticker.Stop()
		var leftAt time.Time
		start := time.Now()
		for time.Since(start) < 2*time.Minute {
			<-ticker.C
			if err := r.Refresh(ctx, "alive"); err != nil {
				t.Fatalf("Refresh(alive): %v", err)
			}
			for _, d := range flush() {
				if len(d.Leaves) != 1 || d.Leaves[0].ID != "quiet" || !leftAt.IsZero() {
					t.Fatalf("unexpected diff %+v", d)
				}
				leftAt = time.Now()
			}
		}
		// quiet (touched last at 0) is swept by the tick at 30s after start,
		// and its leave reported by the first tick after the 1s grace.
		if got := leftAt.Sub(start); got != 40*time.Second {
			t.Errorf("leave reported %v after start, want 40s", got)
		}
		if err := r.Refresh(ctx, "quiet"); !errors.Is(err, presence.ErrNotJoined) {
			t.Errorf("Refresh(quiet) = %v, want ErrNotJoined", err)
		}
	})
}

// TestMemoryRegistry_Flush_empty: topics whose members all left are
// forgotten after their last diff.
func TestMemoryRegistry_Flush_empty(t *testing.T) {
	t.Parallel()
	clock := presencetest.NewClock()
	r := newMemory(t, presence.Config{Now: clock.Now})
	ctx := context.Background()
	if _, err := r.Join(ctx, "room", "h", presence.Member{ID: "a"}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	if ds, _ := r.Flush(ctx); len(ds) != 1 {
		t.Fatalf("diffs = %+v", ds)
	}
	if err := r.Leave(ctx, "room", "h"); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Second)
	if ds, _ := r.Flush(ctx); len(ds) != 1 || len(ds[0].Leaves) != 1 || ds[0].Total != 0 {
		t.Fatalf("diffs = %+v", ds)
	}
	if n := presence.TopicsForTest(r); n != 0 {
		t.Errorf("%d topics remembered, want 0", n)
	}
}
