// Package presencetest is the contract suite every [presence.Registry]
// backend must pass unchanged. Start with [Run]; call it from one test per
// backend:
//
//	func TestMemoryRegistry_Contract(t *testing.T) {
//		presencetest.Run(t, func(t *testing.T, cfg presence.Config) presence.Registry {
//			r, err := presence.NewMemoryRegistry(cfg)
//			if err != nil {
//				t.Fatal(err)
//			}
//			return r
//		})
//	}
//
// Time is a [Clock] the suite advances by hand, passed as [presence.Config.Now]:
// the suite never sleeps and needs no testing/synctest, so a backend that
// talks to a real server (NATS KV) can run it. A backend must take every
// notion of time (TTL expiry, windows, clamping) from Config.Now.
package presencetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syncgate/syncgate/presence"
)

// Config is the configuration the suite runs with, before a subtest
// changes limits and sets Now. Backends are told it through newRegistry.
var Config = presence.Config{
	TTL:          30 * time.Second,
	Window:       100 * time.Millisecond,
	LeaveGrace:   time.Second,
	MaxSkew:      time.Second,
	MaxListed:    1000,
	MaxMetaBytes: 512,
}

// Run runs the contract suite as parallel subtests of t. newRegistry is
// called once per subtest with the configuration to honour (Now set to
// the subtest's [Clock]) and must return a fresh registry whose cleanup it
// registers with t.Cleanup. Topic and holder names are unique per subtest,
// so registries may share one backing store.
func Run(t *testing.T, newRegistry func(t *testing.T, cfg presence.Config) presence.Registry) {
	tests := []struct {
		name string
		fn   func(e *env)
	}{
		{"JoinSync", testJoinSync},
		{"Update", testUpdate},
		{"Leave", testLeave},
		{"List", testList},
		{"RejoinWithinGrace", testRejoinWithinGrace},
		{"LastWriteWins", testLastWriteWins},
		{"Clamp", testClamp},
		{"MultiHolder", testMultiHolder},
		{"HolderMovesID", testHolderMovesID},
		{"TTLExpiry", testTTLExpiry},
		{"TTLRefresh", testTTLRefresh},
		{"NoFlap", testNoFlap},
		{"MassReconnect", testMassReconnect},
		{"OneDiffPerWindow", testOneDiffPerWindow},
		{"LeaveAll", testLeaveAll},
		{"ListedLimit", testListedLimit},
		{"MetaLimit", testMetaLimit},
		{"Errors", testErrors},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := Config
			if tc.name == "ListedLimit" {
				cfg.MaxListed = 3
			}
			if tc.name == "MetaLimit" {
				cfg.MaxMetaBytes = 16
			}
			clock := NewClock()
			cfg.Now = clock.Now
			e := &env{t: t, cfg: cfg, clock: clock, prefix: names(t)}
			e.reg = newRegistry(t, cfg)
			tc.fn(e)
		})
	}
}

// Clock is a manual clock, safe for concurrent use. Its zero value is not
// usable; call NewClock.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock at 2026-01-01T00:00:00Z.
func NewClock() *Clock {
	return &Clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// env is one subtest's registry, clock and record of diffs.
type env struct {
	t      *testing.T
	cfg    presence.Config
	clock  *Clock
	reg    presence.Registry
	prefix string
	diffs  []presence.Diff // every Diff returned by Flush, in order
	probes int
}

// names returns a prefix unique to t using only [A-Za-z0-9_-].
func names(t *testing.T) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-':
			return r
		}
		return '_'
	}, t.Name())
}

func (e *env) topic(name string) string  { return e.prefix + "." + name }
func (e *env) holder(name string) string { return e.prefix + "/" + name }

// ms is the clock's time in ms since the epoch, plus d.
func (e *env) ms(d time.Duration) int64 { return e.clock.Now().Add(d).UnixMilli() }

func actor(name string) *string { return &name }

// member returns member id of actor "actor-"+id with the given meta.
func (e *env) member(id, meta string, updatedAt int64) presence.Member {
	var raw json.RawMessage
	if meta != "" {
		raw = json.RawMessage(meta)
	}
	return presence.Member{ID: id, ActorID: actor("actor-" + id), Meta: raw, UpdatedAt: updatedAt}
}

func (e *env) join(topic, holder string, m presence.Member) presence.Sync {
	e.t.Helper()
	s, err := e.reg.Join(e.t.Context(), e.topic(topic), e.holder(holder), m)
	if err != nil {
		e.t.Fatalf("Join(%s, %s, %s): %v", topic, holder, m.ID, err)
	}
	return s
}

func (e *env) update(topic, holder string, m presence.Member) {
	e.t.Helper()
	if err := e.reg.Update(e.t.Context(), e.topic(topic), e.holder(holder), m); err != nil {
		e.t.Fatalf("Update(%s, %s, %s): %v", topic, holder, m.ID, err)
	}
}

func (e *env) leave(topic, holder string) {
	e.t.Helper()
	if err := e.reg.Leave(e.t.Context(), e.topic(topic), e.holder(holder)); err != nil {
		e.t.Fatalf("Leave(%s, %s): %v", topic, holder, err)
	}
}

func (e *env) refresh(holder string) error {
	return e.reg.Refresh(e.t.Context(), e.holder(holder))
}

// probe returns topic's members as a new joiner sees them, without the
// probe itself, and Total without it. The probe joins and leaves at once,
// inside one window, so observers never see it.
func (e *env) probe(topic string) ([]presence.Member, int) {
	e.t.Helper()
	e.probes++
	h, id := "probe-"+strconv.Itoa(e.probes), "~probe"
	s := e.join(topic, h, presence.Member{ID: id})
	e.leave(topic, h)
	ms := slices.DeleteFunc(slices.Clone(s.Members), func(m presence.Member) bool { return m.ID == id })
	return ms, s.Total - 1
}

// get returns member id as a joiner of topic sees it.
func (e *env) get(topic, id string) (presence.Member, bool) {
	e.t.Helper()
	ms, _ := e.probe(topic)
	for _, m := range ms {
		if m.ID == id {
			return m, true
		}
	}
	return presence.Member{}, false
}

// flush calls Flush once and records its diffs.
func (e *env) flush() []presence.Diff {
	e.t.Helper()
	ds, err := e.reg.Flush(e.t.Context())
	if err != nil {
		e.t.Fatalf("Flush: %v", err)
	}
	if !slices.IsSortedFunc(ds, func(a, b presence.Diff) int { return strings.Compare(a.Topic, b.Topic) }) {
		e.t.Errorf("Flush: diffs not sorted by topic")
	}
	seen := map[string]bool{}
	for _, d := range ds {
		if seen[d.Topic] {
			e.t.Errorf("Flush: two diffs for topic %s", d.Topic)
		}
		seen[d.Topic] = true
		for _, l := range [][]presence.Member{d.Joins, d.Updates, d.Leaves} {
			if !slices.IsSortedFunc(l, func(a, b presence.Member) int { return strings.Compare(a.ID, b.ID) }) {
				e.t.Errorf("Flush: %s: member list not sorted by id", d.Topic)
			}
		}
	}
	e.diffs = append(e.diffs, ds...)
	return ds
}

// run advances the clock by d in steps of Window/4, flushing after each,
// the way the gateway's ticker does.
func (e *env) run(d time.Duration) {
	e.t.Helper()
	step := e.cfg.Window / 4
	for d > 0 {
		s := min(step, d)
		e.clock.Advance(s)
		d -= s
		e.flush()
	}
}

// mark returns a position in the diff record for since.
func (e *env) mark() int { return len(e.diffs) }

// since returns the diffs of topic recorded after mark.
func (e *env) since(mark int, topic string) []presence.Diff {
	var out []presence.Diff
	for _, d := range e.diffs[mark:] {
		if d.Topic == e.topic(topic) {
			out = append(out, d)
		}
	}
	return out
}

// ids returns the member ids of ms, in order.
func ids(ms []presence.Member) string {
	s := make([]string, len(ms))
	for i, m := range ms {
		s[i] = m.ID
	}
	return strings.Join(s, ",")
}

// describe formats ds for failure messages.
func describe(ds []presence.Diff) string {
	var b strings.Builder
	for _, d := range ds {
		fmt.Fprintf(&b, "[joins=%s updates=%s leaves=%s total=%d] ", ids(d.Joins), ids(d.Updates), ids(d.Leaves), d.Total)
	}
	return b.String()
}

// wantDiffs checks that the diffs of topic after mark are exactly want,
// each given as "joins|updates|leaves|total" with ids comma-separated.
func (e *env) wantDiffs(mark int, topic string, want ...string) {
	e.t.Helper()
	got := e.since(mark, topic)
	var g []string
	for _, d := range got {
		g = append(g, fmt.Sprintf("%s|%s|%s|%d", ids(d.Joins), ids(d.Updates), ids(d.Leaves), d.Total))
	}
	if !slices.Equal(g, want) {
		e.t.Fatalf("diffs of %s = %q, want %q", topic, g, want)
	}
}

// wantMember checks m's visible fields.
func wantMember(t *testing.T, what string, got, want presence.Member) {
	t.Helper()
	gotActor, wantActor := "<nil>", "<nil>"
	if got.ActorID != nil {
		gotActor = *got.ActorID
	}
	if want.ActorID != nil {
		wantActor = *want.ActorID
	}
	if got.ID != want.ID || gotActor != wantActor || string(got.Meta) != string(want.Meta) || got.UpdatedAt != want.UpdatedAt {
		t.Errorf("%s = {%s %s %s %d}, want {%s %s %s %d}", what,
			got.ID, gotActor, got.Meta, got.UpdatedAt, want.ID, wantActor, want.Meta, want.UpdatedAt)
	}
}

// testJoinSync: a joiner's sync lists everyone, itself included, at once;
// observers get one diff with all joins when the window closes.
func testJoinSync(e *env) {
	a := e.member("a", `{"n":1}`, e.ms(0))
	b := e.member("b", `{"n":2}`, e.ms(0))
	s := e.join("room", "h1", a)
	if s.Topic != e.topic("room") || ids(s.Members) != "a" || s.Total != 1 {
		e.t.Fatalf("first sync = %s %q total %d, want a, 1", s.Topic, ids(s.Members), s.Total)
	}
	wantMember(e.t, "sync a", s.Members[0], a)
	s = e.join("room", "h2", b)
	if ids(s.Members) != "a,b" || s.Total != 2 {
		e.t.Fatalf("second sync = %q total %d, want a,b 2", ids(s.Members), s.Total)
	}
	wantMember(e.t, "sync b", s.Members[1], b)

	m := e.mark()
	e.flush()
	e.clock.Advance(e.cfg.Window - time.Millisecond)
	e.flush()
	e.wantDiffs(m, "room") // the window is still open
	e.run(e.cfg.Window)
	e.wantDiffs(m, "room", "a,b|||2")
	d := e.since(m, "room")[0]
	wantMember(e.t, "diff a", d.Joins[0], a)
	wantMember(e.t, "diff b", d.Joins[1], b)

	m = e.mark()
	e.run(5 * e.cfg.Window)
	e.wantDiffs(m, "room")
}

// testUpdate: several updates in a window report the last; an update that
// changes nothing visible reports nothing; updates need a hold.
func testUpdate(e *env) {
	e.join("room", "h1", e.member("a", `1`, e.ms(0)))
	e.join("room", "h2", e.member("b", `1`, e.ms(0)))
	e.run(e.cfg.Window)

	m := e.mark()
	e.clock.Advance(time.Millisecond)
	e.update("room", "h1", e.member("a", `2`, e.ms(0)))
	e.clock.Advance(time.Millisecond)
	last := e.member("a", `3`, e.ms(0))
	e.update("room", "h1", last)
	e.run(e.cfg.Window)
	e.wantDiffs(m, "room", "|a||2")
	wantMember(e.t, "update", e.since(m, "room")[0].Updates[0], last)
	got, _ := e.get("room", "a")
	wantMember(e.t, "sync after update", got, last)

	m = e.mark()
	e.clock.Advance(time.Millisecond)
	e.update("room", "h1", e.member("a", `3`, e.ms(0))) // newer, same meta
	e.run(3 * e.cfg.Window)
	e.wantDiffs(m, "room")

	for _, tc := range []struct{ topic, holder, id string }{
		{"room", "h2", "a"},     // h2 holds b, not a
		{"room", "nobody", "a"}, // unknown holder
		{"other", "h1", "a"},    // h1 holds nothing in other
	} {
		err := e.reg.Update(e.t.Context(), e.topic(tc.topic), e.holder(tc.holder), e.member(tc.id, `9`, e.ms(0)))
		if !errors.Is(err, presence.ErrNotJoined) {
			e.t.Errorf("Update(%s, %s, %s) = %v, want ErrNotJoined", tc.topic, tc.holder, tc.id, err)
		}
	}
}

// testLeave: a leave is reported after the grace, and syncs list the
// member until then, as observers have it; leaving twice is not an error.
func testLeave(e *env) {
	e.join("room", "h1", e.member("a", ``, e.ms(0)))
	e.join("room", "h2", e.member("b", ``, e.ms(0)))
	e.run(e.cfg.Window)

	m := e.mark()
	e.leave("room", "h2")
	if ms, total := e.probe("room"); ids(ms) != "a,b" || total != 2 {
		e.t.Fatalf("sync after leave = %q total %d, want a,b 2 (b's leave pending)", ids(ms), total)
	}
	e.run(e.cfg.LeaveGrace - e.cfg.Window/2)
	e.wantDiffs(m, "room")
	e.run(e.cfg.Window)
	e.wantDiffs(m, "room", "||b|1")
	if ms, total := e.probe("room"); ids(ms) != "a" || total != 1 {
		e.t.Fatalf("sync after the leave's report = %q total %d, want a 1", ids(ms), total)
	}

	e.leave("room", "h2")
	e.leave("room", "nobody")
	e.leave("elsewhere", "h1")
	m = e.mark()
	e.run(e.cfg.LeaveGrace + 2*e.cfg.Window)
	e.wantDiffs(m, "room")
}

// testList: List gives an observer what a joiner's sync lists, without a
// joiner, and the observer then has every member it listed: one whose
// join was not reported yet has its leave reported. An empty topic is an
// empty list; an empty topic name is refused.
func testList(e *env) {
	ctx := e.t.Context()
	s, err := e.reg.List(ctx, e.topic("room"), e.holder("watcher"))
	if err != nil || s.Topic != e.topic("room") || s.Members == nil || len(s.Members) != 0 || s.Total != 0 {
		e.t.Fatalf("List of an empty topic = %s %#v total %d, %v; want an empty list", s.Topic, s.Members, s.Total, err)
	}
	if _, err := e.reg.List(ctx, "", e.holder("watcher")); !errors.Is(err, presence.ErrNoID) {
		e.t.Errorf("List(\"\") = %v, want ErrNoID", err)
	}

	a := e.member("a", `{"n":1}`, e.ms(0))
	e.join("room", "h1", a)
	e.run(e.cfg.Window)
	e.join("room", "h2", e.member("b", ``, e.ms(0))) // not reported yet
	s, err = e.reg.List(ctx, e.topic("room"), e.holder("watcher"))
	if err != nil || ids(s.Members) != "a,b" || s.Total != 2 {
		e.t.Fatalf("List = %q total %d, %v; want a,b 2", ids(s.Members), s.Total, err)
	}
	wantMember(e.t, "listed a", s.Members[0], a)

	// b leaves before its join was reported: the observer listed it, so
	// its leave is reported after the grace (without the List the join
	// and leave would cancel), and Total counts it until then.
	m := e.mark()
	e.leave("room", "h2")
	e.run(e.cfg.LeaveGrace + 2*e.cfg.Window)
	e.wantDiffs(m, "room", "|||2", "||b|1")
	if s, err = e.reg.List(ctx, e.topic("room"), e.holder("watcher")); err != nil || ids(s.Members) != "a" || s.Total != 1 {
		e.t.Fatalf("List after b's leave = %q total %d, %v; want a 1", ids(s.Members), s.Total, err)
	}
}

// testRejoinWithinGrace: a member that leaves and comes back within the
// grace (a page reload) is never reported gone, and a joiner in between
// has it all along: its sync lists it, and no diff takes it away.
func testRejoinWithinGrace(e *env) {
	e.join("room", "h1", e.member("a", ``, e.ms(0)))
	e.join("room", "h2", e.member("b", ``, e.ms(0)))
	e.run(e.cfg.Window)

	m := e.mark()
	e.leave("room", "h2") // the reload's old page
	s := e.join("room", "h3", e.member("c", ``, e.ms(0)))
	if ids(s.Members) != "a,b,c" {
		e.t.Fatalf("sync of a joiner during b's grace = %q, want a,b,c", ids(s.Members))
	}
	e.run(e.cfg.Window)
	e.join("room", "h4", e.member("b", ``, e.ms(0))) // the new page
	e.run(e.cfg.LeaveGrace + 2*e.cfg.Window)
	e.wantDiffs(m, "room", "c|||3")
	if ms, total := e.probe("room"); ids(ms) != "a,b,c" || total != 3 {
		e.t.Fatalf("sync after b came back = %q total %d, want a,b,c 3", ids(ms), total)
	}
}

// testLastWriteWins: the greatest (UpdatedAt, Meta, holder) wins, whatever
// the arrival order.
func testLastWriteWins(e *env) {
	t0 := e.ms(0) - 10000
	e.join("room", "h1", e.member("a", `"join"`, t0))
	e.update("room", "h1", e.member("a", `"new"`, t0+200))
	e.update("room", "h1", e.member("a", `"old"`, t0+100)) // arrives late: dropped
	got, _ := e.get("room", "a")
	wantMember(e.t, "out of order", got, e.member("a", `"new"`, t0+200))
	m := e.mark()
	e.run(e.cfg.Window)
	e.wantDiffs(m, "room", "a|||1")
	wantMember(e.t, "diff", e.since(m, "room")[0].Joins[0], e.member("a", `"new"`, t0+200))

	// Ties on UpdatedAt: the greater meta wins, in either order.
	e.update("room", "h1", e.member("a", `"x"`, t0+300))
	e.update("room", "h1", e.member("a", `"w"`, t0+300))
	e.join("room", "h2", e.member("b", `"w"`, t0+300))
	e.update("room", "h2", e.member("b", `"x"`, t0+300))
	for _, id := range []string{"a", "b"} {
		got, _ := e.get("room", id)
		wantMember(e.t, "tie "+id, got, e.member(id, `"x"`, t0+300))
	}

	// Two holders of one member: the later write wins whoever sent it.
	e.join("room", "h3", e.member("a", `"h3"`, t0+500))
	e.update("room", "h1", e.member("a", `"h1"`, t0+400))
	got, _ = e.get("room", "a")
	wantMember(e.t, "two holders", got, e.member("a", `"h3"`, t0+500))
	m = e.mark()
	e.run(e.cfg.Window)
	e.wantDiffs(m, "room", "b|a||2")
}

// testClamp: UpdatedAt is clamped to now+MaxSkew; zero means now.
func testClamp(e *env) {
	skew := e.cfg.MaxSkew
	e.join("room", "h1", e.member("a", `1`, e.ms(time.Hour)))
	got, _ := e.get("room", "a")
	wantMember(e.t, "clamped join", got, e.member("a", `1`, e.ms(skew)))

	// A write stamped before the clamped value loses until it is later.
	e.update("room", "h1", e.member("a", `2`, e.ms(skew-time.Millisecond)))
	got, _ = e.get("room", "a")
	wantMember(e.t, "older than clamp", got, e.member("a", `1`, e.ms(skew)))
	e.clock.Advance(skew)
	e.update("room", "h1", e.member("a", `3`, e.ms(time.Millisecond)))
	got, _ = e.get("room", "a")
	wantMember(e.t, "after clock caught up", got, e.member("a", `3`, e.ms(time.Millisecond)))

	e.join("room", "h2", e.member("b", `1`, 0))
	got, _ = e.get("room", "b")
	wantMember(e.t, "zero updatedAt", got, e.member("b", `1`, e.ms(0)))
}

// testMultiHolder: a member held by two holders is one member; it leaves
// only when its last holder leaves.
func testMultiHolder(e *env) {
	e.join("room", "old", e.member("a", `1`, e.ms(0)))
	e.run(e.cfg.Window)

	m := e.mark()
	s := e.join("room", "new", e.member("a", `1`, e.ms(0)))
	if ids(s.Members) != "a" || s.Total != 1 {
		e.t.Fatalf("sync of second holder = %q total %d, want a 1", ids(s.Members), s.Total)
	}
	e.leave("room", "old")
	e.run(e.cfg.LeaveGrace + 3*e.cfg.Window)
	e.wantDiffs(m, "room")
	if err := e.refresh("old"); !errors.Is(err, presence.ErrNotJoined) {
		e.t.Errorf("Refresh(old) after its leave = %v, want ErrNotJoined", err)
	}
	if err := e.refresh("new"); err != nil {
		e.t.Errorf("Refresh(new) = %v", err)
	}

	e.leave("room", "new")
	e.run(e.cfg.LeaveGrace + e.cfg.Window)
	e.wantDiffs(m, "room", "||a|0")
}

// testHolderMovesID: a holder joining with another id lets go of the first.
func testHolderMovesID(e *env) {
	e.join("room", "h1", e.member("a", ``, e.ms(0)))
	e.run(e.cfg.Window)
	m := e.mark()
	s := e.join("room", "h1", e.member("b", ``, e.ms(0)))
	if ids(s.Members) != "a,b" || s.Total != 2 {
		e.t.Fatalf("sync after move = %q total %d, want a,b 2 (a's leave pending)", ids(s.Members), s.Total)
	}
	e.run(e.cfg.LeaveGrace + e.cfg.Window)
	e.wantDiffs(m, "room", "b|||2", "||a|1")
}

// testTTLExpiry: a holder not refreshed for TTL is gone: observers get its
// leave after the grace (syncs list it until then), Refresh and Update say
// ErrNotJoined.
func testTTLExpiry(e *env) {
	e.join("room", "quiet", e.member("a", ``, e.ms(0)))
	e.join("room", "alive", e.member("b", ``, e.ms(0)))
	e.run(e.cfg.Window)
	m := e.mark()

	// alive refreshes at TTL/3; quiet never does.
	for e.clock.Now().Before(NewClock().Now().Add(e.cfg.TTL - e.cfg.TTL/3)) {
		e.clock.Advance(e.cfg.TTL / 3)
		e.flush()
		if err := e.refresh("alive"); err != nil {
			e.t.Fatalf("Refresh(alive): %v", err)
		}
	}
	// quiet joined at start+Window/... : expire it to the millisecond.
	expires := NewClock().Now().Add(e.cfg.TTL)
	e.clock.Advance(expires.Sub(e.clock.Now()) - time.Millisecond)
	if _, ok := e.get("room", "a"); !ok {
		e.t.Fatalf("a gone 1ms before its TTL")
	}
	e.clock.Advance(time.Millisecond)
	if ms, total := e.probe("room"); ids(ms) != "a,b" || total != 2 {
		e.t.Fatalf("sync at TTL = %q total %d, want a,b 2 (a's leave pending)", ids(ms), total)
	}
	if err := e.refresh("quiet"); !errors.Is(err, presence.ErrNotJoined) {
		e.t.Errorf("Refresh(quiet) after TTL = %v, want ErrNotJoined", err)
	}
	if err := e.reg.Update(e.t.Context(), e.topic("room"), e.holder("quiet"), e.member("a", `1`, e.ms(0))); !errors.Is(err, presence.ErrNotJoined) {
		e.t.Errorf("Update(quiet) after TTL = %v, want ErrNotJoined", err)
	}
	e.wantDiffs(m, "room")
	e.run(e.cfg.LeaveGrace + e.cfg.Window)
	e.wantDiffs(m, "room", "||a|1")
	if ms, total := e.probe("room"); ids(ms) != "b" || total != 1 {
		e.t.Fatalf("sync after a's leave was reported = %q total %d, want b 1", ids(ms), total)
	}
}

// testTTLRefresh: Refresh, Join and Update each restart a holder's TTL;
// Flush alone expires holders.
func testTTLRefresh(e *env) {
	e.join("room", "r", e.member("a", ``, e.ms(0)))
	e.join("room", "u", e.member("b", ``, e.ms(0)))
	e.join("room", "j", e.member("c", ``, e.ms(0)))
	e.run(e.cfg.Window)
	m := e.mark()
	for range 9 { // 3 TTLs
		e.clock.Advance(e.cfg.TTL / 3)
		e.flush()
		if err := e.refresh("r"); err != nil {
			e.t.Fatalf("Refresh: %v", err)
		}
		e.update("room", "u", e.member("b", ``, e.ms(0)))
		e.join("room", "j", e.member("c", ``, e.ms(0)))
	}
	e.run(e.cfg.LeaveGrace + e.cfg.Window)
	e.wantDiffs(m, "room")

	// Expiry needs no other call than Flush.
	e.clock.Advance(e.cfg.TTL)
	e.flush()
	e.run(e.cfg.LeaveGrace + e.cfg.Window)
	e.wantDiffs(m, "room", "||a,b,c|0")
}

// testNoFlap: a leave and rejoin inside the grace, and a join and leave
// inside the window, report nothing.
func testNoFlap(e *env) {
	e.join("room", "h1", e.member("a", `1`, e.ms(0)))
	e.run(e.cfg.Window)
	m := e.mark()

	// Break-before-make inside one window.
	e.leave("room", "h1")
	e.join("room", "h2", e.member("a", `1`, e.ms(0)))
	e.run(e.cfg.LeaveGrace + 2*e.cfg.Window)
	// Absent across several windows, back inside the grace.
	e.leave("room", "h2")
	e.run(e.cfg.LeaveGrace - e.cfg.Window)
	e.join("room", "h3", e.member("a", `1`, e.ms(0)))
	e.run(e.cfg.LeaveGrace + 2*e.cfg.Window)
	// A short visit inside one window.
	e.join("room", "h4", e.member("z", `1`, e.ms(0)))
	e.clock.Advance(e.cfg.Window / 2)
	e.leave("room", "h4")
	e.run(e.cfg.LeaveGrace + 2*e.cfg.Window)
	e.wantDiffs(m, "room")

	// Back with a new meta: one update, no leave or join.
	e.leave("room", "h3")
	e.run(2 * e.cfg.Window)
	e.join("room", "h5", e.member("a", `2`, e.ms(0)))
	e.run(e.cfg.LeaveGrace + 2*e.cfg.Window)
	e.wantDiffs(m, "room", "|a||1")
}

// testMassReconnect: 1,000 members leave and rejoin within 200 ms (half
// break-before-make, half make-before-break; every fourth with a new
// meta): no member flaps and observers get a handful of diffs.
func testMassReconnect(e *env) {
	const n = 1000
	id := func(i int) string { return fmt.Sprintf("m%04d", i) }
	for i := range n {
		e.join("room", "old"+strconv.Itoa(i), e.member(id(i), `{"v":1}`, e.ms(0)))
	}
	e.run(e.cfg.Window)
	if d := e.since(0, "room"); len(d) != 1 || len(d[0].Joins) != n || d[0].Total != n {
		e.t.Fatalf("initial diffs: %d, want one with %d joins", len(d), n)
	}

	m := e.mark()
	rejoin := func(i int) {
		meta := `{"v":1}`
		if i%4 == 0 {
			meta = `{"v":2}`
		}
		e.join("room", "new"+strconv.Itoa(i), e.member(id(i), meta, e.ms(0)))
	}
	// Over 200 ms, 10 members per ms: break-before-make members leave in
	// the first 100 ms and come back in the second; make-before-break
	// members join from a new holder, then leave from the old one.
	for ms := range 200 {
		for k := range 10 {
			i := (ms%100)*10 + k
			bbm := i%2 == 0
			switch {
			case ms < 100 && bbm:
				e.leave("room", "old"+strconv.Itoa(i))
			case ms >= 100 && bbm:
				rejoin(i)
			case ms < 100:
				rejoin(i)
			default:
				e.leave("room", "old"+strconv.Itoa(i))
			}
		}
		e.clock.Advance(time.Millisecond)
		if ms%5 == 4 {
			e.flush()
		}
	}
	e.run(e.cfg.LeaveGrace + 3*e.cfg.Window)

	ds := e.since(m, "room")
	if len(ds) > 4 {
		e.t.Errorf("%d diffs for a 200 ms mass reconnect, want at most 4: %s", len(ds), describe(ds))
	}
	updated := map[string]bool{}
	for _, d := range ds {
		if len(d.Joins) > 0 || len(d.Leaves) > 0 {
			e.t.Fatalf("flap: %d joins, %d leaves", len(d.Joins), len(d.Leaves))
		}
		if d.Total != n {
			e.t.Errorf("Total = %d, want %d", d.Total, n)
		}
		for _, u := range d.Updates {
			updated[u.ID] = true
		}
	}
	for i := range n {
		if updated[id(i)] != (i%4 == 0) {
			e.t.Errorf("member %s updated = %v, want %v", id(i), updated[id(i)], i%4 == 0)
		}
	}
	if ms, total := e.probe("room"); len(ms) != n || total != n {
		e.t.Errorf("sync after reconnect: %d members, total %d, want %d", len(ms), total, n)
	}
}

// testOneDiffPerWindow: a member updating every 10 ms costs observers at
// most one diff per window.
func testOneDiffPerWindow(e *env) {
	e.join("room", "h1", e.member("a", `0`, e.ms(0)))
	e.run(e.cfg.Window)
	m := e.mark()
	const d, step = time.Second, 10 * time.Millisecond
	var last presence.Member
	for i := range int(d / step) {
		last = e.member("a", strconv.Itoa(i+1), e.ms(0))
		e.update("room", "h1", last)
		e.run(step)
	}
	e.run(2 * e.cfg.Window)
	ds := e.since(m, "room")
	if max := int(d/e.cfg.Window) + 2; len(ds) > max || len(ds) < max/2 {
		e.t.Errorf("%d diffs over %v of updates, want between %d and %d", len(ds), d, max/2, max)
	}
	final := ds[len(ds)-1].Updates
	if len(final) != 1 {
		e.t.Fatalf("last diff: %s", describe(ds[len(ds)-1:]))
	}
	wantMember(e.t, "last update", final[0], last)
}

// testLeaveAll: LeaveAll lets go of every topic; diffs come one per topic.
func testLeaveAll(e *env) {
	for _, topic := range []string{"t1", "t2", "t3"} {
		e.join(topic, "h1", e.member("a", ``, e.ms(0)))
	}
	e.join("t2", "h2", e.member("b", ``, e.ms(0)))
	e.run(e.cfg.Window)
	m := e.mark()
	if err := e.reg.LeaveAll(e.t.Context(), e.holder("h1")); err != nil {
		e.t.Fatalf("LeaveAll: %v", err)
	}
	if err := e.reg.LeaveAll(e.t.Context(), e.holder("h1")); err != nil {
		e.t.Fatalf("second LeaveAll: %v", err)
	}
	if err := e.refresh("h1"); !errors.Is(err, presence.ErrNotJoined) {
		e.t.Errorf("Refresh after LeaveAll = %v, want ErrNotJoined", err)
	}
	e.run(e.cfg.LeaveGrace + e.cfg.Window)
	e.wantDiffs(m, "t1", "||a|0")
	e.wantDiffs(m, "t2", "||a|1")
	e.wantDiffs(m, "t3", "||a|0")
}

// testListedLimit: beyond MaxListed members are counted only, and listed
// oldest first when a listed member leaves. (Suite runs it with
// MaxListed 3.)
func testListedLimit(e *env) {
	for i := 1; i <= 4; i++ {
		e.join("room", "h"+strconv.Itoa(i), e.member("m"+strconv.Itoa(i), ``, e.ms(0)))
	}
	s := e.join("room", "h5", e.member("m5", ``, e.ms(0)))
	if ids(s.Members) != "m1,m2,m3,m5" || s.Total != 5 {
		e.t.Fatalf("sync of an unlisted joiner = %q total %d, want m1,m2,m3,m5 5", ids(s.Members), s.Total)
	}
	m := e.mark()
	e.run(e.cfg.Window)
	e.wantDiffs(m, "room", "m1,m2,m3|||5")
	// A List by an unlisted holder includes its member, as its Join's
	// Sync did; one by a holder holding nothing there does not.
	for _, tc := range []struct{ holder, want string }{{"h5", "m1,m2,m3,m5"}, {"h1", "m1,m2,m3"}, {"watcher", "m1,m2,m3"}} {
		if s, err := e.reg.List(e.t.Context(), e.topic("room"), e.holder(tc.holder)); err != nil || ids(s.Members) != tc.want || s.Total != 5 {
			e.t.Fatalf("List by %s = %q total %d, %v; want %s 5", tc.holder, ids(s.Members), s.Total, err, tc.want)
		}
	}

	m = e.mark()
	e.update("room", "h4", e.member("m4", `1`, e.ms(0))) // unlisted: not reported
	e.leave("room", "h5")                                // unlisted: Total only
	e.run(e.cfg.Window)
	e.wantDiffs(m, "room", "|||4")

	m = e.mark()
	e.leave("room", "h2")
	e.run(e.cfg.LeaveGrace + e.cfg.Window)
	e.wantDiffs(m, "room", "m4||m2|3")
	got := e.since(m, "room")[0].Joins[0]
	wantMember(e.t, "promoted", got, e.member("m4", `1`, got.UpdatedAt))

	// Its update while unlisted was reported by the join: coming back
	// within the grace with the same meta reports nothing.
	m = e.mark()
	e.leave("room", "h4")
	e.join("room", "h6", e.member("m4", `1`, e.ms(0)))
	e.run(e.cfg.LeaveGrace + e.cfg.Window)
	e.wantDiffs(m, "room")
}

// testMetaLimit: Meta up to MaxMetaBytes is accepted, longer refused.
// (Suite runs it with MaxMetaBytes 16.)
func testMetaLimit(e *env) {
	ok := `"` + strings.Repeat("x", 14) + `"`
	tooLong := `"` + strings.Repeat("x", 15) + `"`
	e.join("room", "h1", e.member("a", ok, e.ms(0)))
	if _, err := e.reg.Join(e.t.Context(), e.topic("room"), e.holder("h2"), e.member("b", tooLong, e.ms(0))); !errors.Is(err, presence.ErrMetaTooLarge) {
		e.t.Errorf("Join with %d-byte meta = %v, want ErrMetaTooLarge", len(tooLong), err)
	}
	if err := e.reg.Update(e.t.Context(), e.topic("room"), e.holder("h1"), e.member("a", tooLong, e.ms(time.Millisecond))); !errors.Is(err, presence.ErrMetaTooLarge) {
		e.t.Errorf("Update with %d-byte meta = %v, want ErrMetaTooLarge", len(tooLong), err)
	}
	if ms, total := e.probe("room"); ids(ms) != "a" || total != 1 || string(ms[0].Meta) != ok {
		e.t.Errorf("after refusals: %q total %d", ids(ms), total)
	}
}

// testErrors: empty names and an id held by another actor are refused and
// change nothing.
func testErrors(e *env) {
	ctx := e.t.Context()
	for _, tc := range []struct{ topic, holder, id string }{
		{"", "h", "a"}, {e.topic("room"), "", "a"}, {e.topic("room"), e.holder("h"), ""},
	} {
		if _, err := e.reg.Join(ctx, tc.topic, tc.holder, presence.Member{ID: tc.id}); !errors.Is(err, presence.ErrNoID) {
			e.t.Errorf("Join(%q, %q, %q) = %v, want ErrNoID", tc.topic, tc.holder, tc.id, err)
		}
	}
	e.join("room", "h1", e.member("a", ``, e.ms(0)))
	for _, other := range []*string{actor("mallory"), nil} {
		m := presence.Member{ID: "a", ActorID: other, UpdatedAt: e.ms(time.Millisecond)}
		if _, err := e.reg.Join(ctx, e.topic("room"), e.holder("h2"), m); !errors.Is(err, presence.ErrIDConflict) {
			e.t.Errorf("Join of a by another actor = %v, want ErrIDConflict", err)
		}
	}
	if err := e.refresh("h2"); !errors.Is(err, presence.ErrNotJoined) {
		e.t.Errorf("refused holder: Refresh = %v, want ErrNotJoined", err)
	}
	m := e.mark()
	e.run(e.cfg.Window)
	e.wantDiffs(m, "room", "a|||1")
}
