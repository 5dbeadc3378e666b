package presence_test

import (
	"context"
	"fmt"
	"time"

	"github.com/syncgate/syncgate/presence"
	"github.com/syncgate/syncgate/presence/presencetest"
)

// The gateway's calls: Join answers the joiner with a Sync at once;
// observers learn of changes from Flush, one Diff per topic per window.
func ExampleMemoryRegistry() {
	ctx := context.Background()
	clock := presencetest.NewClock()
	r, _ := presence.NewMemoryRegistry(presence.Config{Now: clock.Now})

	s, _ := r.Join(ctx, "room", "session-1", presence.Member{ID: "alice", Meta: []byte(`{"typing":false}`)})
	fmt.Println("sync:", len(s.Members), "member(s)")
	_ = r.Update(ctx, "room", "session-1", presence.Member{ID: "alice", Meta: []byte(`{"typing":true}`)})

	clock.Advance(100 * time.Millisecond) // one window; the gateway ticks every 25ms
	diffs, _ := r.Flush(ctx)
	for _, d := range diffs {
		fmt.Printf("%s: join %s %s, total %d\n", d.Topic, d.Joins[0].ID, d.Joins[0].Meta, d.Total)
	}

	_ = r.LeaveAll(ctx, "session-1") // the session closed
	clock.Advance(time.Second)       // LeaveGrace
	diffs, _ = r.Flush(ctx)
	fmt.Printf("%s: leave %s, total %d\n", diffs[0].Topic, diffs[0].Leaves[0].ID, diffs[0].Total)
	// Output:
	// sync: 1 member(s)
	// room: join alice {"typing":true}, total 1
	// room: leave alice, total 0
}
