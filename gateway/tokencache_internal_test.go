package gateway

import (
	"strconv"
	"testing"
	"time"

	"github.com/syncgate/syncgate/auth"
)

// TestTokenCache_Bounded: a full cache makes room by dropping its expired
// entries first, then arbitrary ones until an eighth is free; it never
// holds more than its bound, and what it serves has not reached its exp.
func TestTokenCache_Bounded(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	c := newTokenCache(64, func() time.Time { return now })
	soon := &auth.Identity{ActorID: "soon", Expires: now.Add(time.Minute)}
	later := &auth.Identity{ActorID: "later", Expires: now.Add(time.Hour)}
	for i := range 64 {
		id := later
		if i%2 == 0 {
			id = soon
		}
		c.put("t"+strconv.Itoa(i), id)
	}
	if len(c.m) != 64 {
		t.Fatalf("%d entries after 64 puts into a cache of 64", len(c.m))
	}
	// A minute on, the 32 "soon" entries have expired: the next put
	// drops them and keeps every "later" one.
	now = now.Add(time.Minute)
	c.put("new", later)
	if len(c.m) != 33 {
		t.Fatalf("%d entries after the expired went, want 33", len(c.m))
	}
	for i := 1; i < 64; i += 2 {
		if _, ok := c.get("t" + strconv.Itoa(i)); !ok {
			t.Fatalf("unexpired entry t%d was dropped", i)
		}
	}
	if _, ok := c.get("t0"); ok {
		t.Fatal("an entry at its exp was served")
	}
	// Full of unexpired entries: arbitrary ones go, an eighth at once.
	for i := range 1000 {
		c.put("more"+strconv.Itoa(i), later)
		if len(c.m) > 64 {
			t.Fatalf("%d entries, over the bound of 64", len(c.m))
		}
	}
	if _, ok := c.get("more999"); !ok {
		t.Fatal("the newest entry was dropped")
	}
	// An identity already at its exp (Verify's leeway let it through) is
	// not kept.
	c.put("late", &auth.Identity{Expires: now})
	if _, ok := c.get("late"); ok {
		t.Fatal("an identity at its exp was kept")
	}
	var nilCache *tokenCache
	nilCache.put("x", later)
	if _, ok := nilCache.get("x"); ok {
		t.Fatal("a nil cache served a token")
	}
}
