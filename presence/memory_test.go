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

// view is one client's member list of a topic: a Sync, then every Diff
// applied as docs/protocol.md §6.10 says (join and update upsert, leave
// removes).
type view map[string]bool

func newView(s presence.Sync) view {
	v := view{}
	for _, m := range s.Members {
		v[m.ID] = true
	}
	return v
}

func (v view) apply(ds []presence.Diff, topic string) {
	for _, d := range ds {
		if d.Topic != topic {
			continue
		}
		for _, m := range append(d.Joins, d.Updates...) {
			v[m.ID] = true
		}
		for _, m := range d.Leaves {
			delete(v, m.ID)
		}
	}
}

// settle flushes every Window/4 for d, applying the diffs to each view.
func settle(t *testing.T, r *presence.MemoryRegistry, clock *presencetest.Clock, d time.Duration, vs ...view) {
	t.Helper()
	for step := 25 * time.Millisecond; d > 0; d -= step {
		clock.Advance(step)
		ds, err := r.Flush(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range vs {
			v.apply(ds, "room")
		}
	}
}

func mustJoin(t *testing.T, r *presence.MemoryRegistry, holder, id string) presence.Sync {
	t.Helper()
	s, err := r.Join(context.Background(), "room", holder, presence.Member{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestMemoryRegistry_Sync_unreportedJoinLeaves: a member that joined in the
// open window is in a joiner's sync; when it leaves before the window
// closes the joiner must still be told (a leave), or it keeps a member
// that is gone.
func TestMemoryRegistry_Sync_unreportedJoinLeaves(t *testing.T) {
	t.Parallel()
	clock := presencetest.NewClock()
	r := newMemory(t, presence.Config{Now: clock.Now})
	mustJoin(t, r, "h1", "a")
	settle(t, r, clock, 200*time.Millisecond)

	mustJoin(t, r, "h2", "x")
	c := newView(mustJoin(t, r, "h3", "c"))
	if !c["x"] {
		t.Fatalf("sync %v misses x", c)
	}
	if err := r.Leave(context.Background(), "room", "h2"); err != nil {
		t.Fatal(err)
	}
	settle(t, r, clock, 3*time.Second, c)
	if c["x"] {
		t.Errorf("joiner's list %v keeps x, which left", c)
	}
}
