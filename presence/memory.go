package presence

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"sync"
	"time"
)

// MemoryRegistry is the in-process [Registry]: one node's presence, in
// memory. It starts no goroutines and never blocks on I/O; its methods
// ignore ctx. All methods may be called concurrently.
//
// One mutex guards all state: an operation is a few map updates, and
// Flush costs O(changed members) per window, so at thousands of updates per
// second the lock is not the bottleneck. Shard by topic if it becomes one.
type MemoryRegistry struct {
	cfg Config // static after NewMemoryRegistry

	mu        sync.Mutex
	topics    map[string]*topic
	holders   map[string]*holder
	pending   map[*topic]struct{} // topics with unreported changes (due set)
	nextSweep time.Time           // no holder expires before this; zero: sweep on next call
}

var _ Registry = (*MemoryRegistry)(nil)

// holder is one session's holds. Guarded by MemoryRegistry.mu.
type holder struct {
	expires time.Time
	held    map[string]*member // topic name → the member held there
}

// topic is one topic's members. Guarded by MemoryRegistry.mu.
type topic struct {
	name    string
	members map[string]*member // present members, and listed ones whose leave is unreported
	present int                // members with at least one holder
	listed  int                // members with listed set (present or leave unreported)
	sorted  []*member          // the listed members, sorted by ID
	waiting []*member          // unlisted members in join order; entries may be gone
	stale   int                // gone entries in waiting
	changed []*member          // listed members with unreported changes (member.dirty)
	due     time.Time          // when the window closes; zero: nothing pending
	total   int                // Total of the last Diff
}

// member is one member's state. Guarded by MemoryRegistry.mu.
type member struct {
	t        *topic
	state    Member
	writer   string    // holder whose write is state (LWW tie-break)
	holders  []string  // usually one, two during make-before-break
	leftAt   time.Time // when the last holder let go
	listed   bool      // reported in syncs and diffs
	visible  bool      // observers were told it is present
	modified bool      // ActorID or Meta changed since last reported
	dirty    bool      // in t.changed
	gone     bool      // removed from t.members
	synced   bool      // listed in another holder's sync (a Join's or a List's) before observers were told it joined: its leave is reported
}

// NewMemoryRegistry returns an empty registry, or an error if cfg has a
// value out of range.
func NewMemoryRegistry(cfg Config) (*MemoryRegistry, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &MemoryRegistry{
		cfg:     cfg,
		topics:  make(map[string]*topic),
		holders: make(map[string]*holder),
		pending: make(map[*topic]struct{}),
	}, nil
}

// Join implements [Registry.Join].
func (r *MemoryRegistry) Join(_ context.Context, topicName, holderID string, m Member) (Sync, error) {
	if err := r.check(topicName, holderID, m); err != nil {
		return Sync{}, err
	}
	now := r.cfg.Now()
	m.UpdatedAt = r.clamp(m.UpdatedAt, now)

	r.mu.Lock()
	defer r.mu.Unlock()
	r.sweepLocked(now)
	t := r.topics[topicName]
	if t != nil {
		if mem := t.members[m.ID]; mem != nil && len(mem.holders) > 0 && !sameActor(mem.state.ActorID, m.ActorID) {
			return Sync{}, ErrIDConflict
		}
	} else {
		t = &topic{name: topicName, members: make(map[string]*member)}
		r.topics[topicName] = t
	}
	h := r.holders[holderID]
	if h == nil {
		h = &holder{held: make(map[string]*member)}
		r.holders[holderID] = h
	}
	r.touchLocked(h, now)

	mem := h.held[topicName]
	if mem != nil && mem.state.ID != m.ID {
		r.releaseLocked(mem, holderID, now)
		mem = nil
	}
	if mem != nil {
		r.writeLocked(mem, holderID, m, now)
	} else {
		mem = r.holdLocked(t, holderID, m, now)
		h.held[topicName] = mem
	}
	return syncLocked(t, mem), nil
}

// Update implements [Registry.Update].
func (r *MemoryRegistry) Update(_ context.Context, topicName, holderID string, m Member) error {
	if err := r.check(topicName, holderID, m); err != nil {
		return err
	}
	now := r.cfg.Now()
	m.UpdatedAt = r.clamp(m.UpdatedAt, now)

	r.mu.Lock()
	defer r.mu.Unlock()
	r.sweepLocked(now)
	h := r.holders[holderID]
	if h == nil {
		return ErrNotJoined
	}
	mem := h.held[topicName]
	if mem == nil || mem.state.ID != m.ID {
		return ErrNotJoined
	}
	r.touchLocked(h, now)
	r.writeLocked(mem, holderID, m, now)
	return nil
}

// Refresh implements [Registry.Refresh].
func (r *MemoryRegistry) Refresh(_ context.Context, holderID string) error {
	now := r.cfg.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sweepLocked(now)
	h := r.holders[holderID]
	if h == nil {
		return ErrNotJoined
	}
	r.touchLocked(h, now)
	return nil
}

// Leave implements [Registry.Leave].
func (r *MemoryRegistry) Leave(_ context.Context, topicName, holderID string) error {
	now := r.cfg.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sweepLocked(now)
	h := r.holders[holderID]
	if h == nil {
		return nil
	}
	mem := h.held[topicName]
	if mem == nil {
		return nil
	}
	r.releaseLocked(mem, holderID, now)
	delete(h.held, topicName)
	if len(h.held) == 0 {
		delete(r.holders, holderID)
	}
	return nil
}

// LeaveAll implements [Registry.LeaveAll].
func (r *MemoryRegistry) LeaveAll(_ context.Context, holderID string) error {
	now := r.cfg.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sweepLocked(now)
	if h := r.holders[holderID]; h != nil {
		r.dropHolderLocked(holderID, h, now)
	}
	return nil
}

// List implements [Registry.List]. Like a Join's Sync it costs one pass
// over the listed members.
func (r *MemoryRegistry) List(_ context.Context, topicName, holderID string) (Sync, error) {
	if topicName == "" {
		return Sync{}, ErrNoID
	}
	now := r.cfg.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sweepLocked(now)
	t := r.topics[topicName]
	if t == nil {
		return Sync{Topic: topicName, Members: []Member{}}, nil
	}
	var self *member
	if h := r.holders[holderID]; h != nil {
		self = h.held[topicName]
	}
	return syncLocked(t, self), nil
}

// Flush implements [Registry.Flush]. It costs O(members changed since the
// last Diff) plus O(topics with pending changes), and allocates only the
// Diffs it returns.
func (r *MemoryRegistry) Flush(context.Context) ([]Diff, error) {
	now := r.cfg.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sweepLocked(now)
	var diffs []Diff
	for t := range r.pending {
		if now.Before(t.due) {
			continue
		}
		if d, ok := r.flushTopicLocked(t, now); ok {
			diffs = append(diffs, d)
		}
		if t.due.IsZero() {
			delete(r.pending, t)
			if len(t.members) == 0 {
				delete(r.topics, t.name)
			}
		}
	}
	slices.SortFunc(diffs, func(a, b Diff) int { return strings.Compare(a.Topic, b.Topic) })
	return diffs, nil
}

// check validates the arguments of Join and Update.
func (r *MemoryRegistry) check(topicName, holderID string, m Member) error {
	switch {
	case topicName == "", holderID == "", m.ID == "":
		return ErrNoID
	case len(m.Meta) > r.cfg.MaxMetaBytes:
		return ErrMetaTooLarge
	}
	return nil
}

// clamp returns updatedAt bounded by now+MaxSkew; zero or negative means now.
func (r *MemoryRegistry) clamp(updatedAt int64, now time.Time) int64 {
	ms := now.UnixMilli()
	if updatedAt <= 0 {
		return ms
	}
	return min(updatedAt, ms+r.cfg.MaxSkew.Milliseconds())
}

// touchLocked extends h's TTL.
func (r *MemoryRegistry) touchLocked(h *holder, now time.Time) {
	h.expires = now.Add(r.cfg.TTL)
	if r.nextSweep.IsZero() || h.expires.Before(r.nextSweep) {
		r.nextSweep = h.expires
	}
}

// sweepLocked drops the holders that expired by now. It scans only when
// the earliest known expiry has passed; refreshes only move expiries later,
// so nextSweep stays a lower bound between scans.
func (r *MemoryRegistry) sweepLocked(now time.Time) {
	if now.Before(r.nextSweep) {
		return
	}
	var next time.Time
	for id, h := range r.holders {
		if !now.Before(h.expires) {
			r.dropHolderLocked(id, h, now)
			continue
		}
		if next.IsZero() || h.expires.Before(next) {
			next = h.expires
		}
	}
	r.nextSweep = next
}

// dropHolderLocked lets go of everything h holds and forgets it.
func (r *MemoryRegistry) dropHolderLocked(id string, h *holder, now time.Time) {
	for _, mem := range h.held {
		r.releaseLocked(mem, id, now)
	}
	delete(r.holders, id)
}

// holdLocked adds holderID as a holder of m's member in t, creating or
// reviving the member. The caller records the hold in the holder.
func (r *MemoryRegistry) holdLocked(t *topic, holderID string, m Member, now time.Time) *member {
	mem := t.members[m.ID]
	switch {
	case mem == nil:
		mem = &member{t: t, state: own(m, Member{}), writer: holderID, holders: []string{holderID}}
		t.members[m.ID] = mem
		if t.listed < r.cfg.MaxListed {
			t.list(mem)
		} else {
			t.waiting = append(t.waiting, mem)
		}
	case len(mem.holders) == 0:
		// A listed member whose leave is not reported yet comes back: no
		// flap. It is absent, so the write is accepted whatever its
		// UpdatedAt.
		if differs(mem.state, m) {
			mem.modified = true
		}
		mem.state = own(m, mem.state)
		mem.writer = holderID
		mem.holders = append(mem.holders, holderID)
		mem.leftAt = time.Time{}
	default:
		// Make-before-break: one more holder of a present member.
		mem.holders = append(mem.holders, holderID)
		r.writeLocked(mem, holderID, m, now)
		return mem
	}
	mem.t.present++
	r.markLocked(mem, now)
	return mem
}

// writeLocked applies holderID's write m to mem if it wins by
// last-write-wins.
func (r *MemoryRegistry) writeLocked(mem *member, holderID string, m Member, now time.Time) {
	if !Wins(m, holderID, mem.state, mem.writer) {
		return
	}
	if differs(mem.state, m) {
		mem.modified = true
		r.markLocked(mem, now)
	}
	mem.state = own(m, mem.state)
	mem.writer = holderID
}

// releaseLocked removes holderID from mem's holders. The caller removes the
// hold from the holder.
func (r *MemoryRegistry) releaseLocked(mem *member, holderID string, now time.Time) {
	i := slices.Index(mem.holders, holderID)
	if i < 0 {
		return
	}
	mem.holders = slices.Delete(mem.holders, i, i+1)
	if len(mem.holders) > 0 {
		return
	}
	t := mem.t
	t.present--
	mem.leftAt = now
	if !mem.listed {
		// Never reported: only Total changes.
		delete(t.members, mem.state.ID)
		mem.gone = true
		t.stale++
		if t.stale > len(t.waiting)/2 {
			t.waiting = slices.DeleteFunc(t.waiting, func(m *member) bool { return m.gone })
			t.stale = 0
		}
	}
	r.markLocked(mem, now)
}

// markLocked records an unreported change of mem and opens its topic's
// window if none is open. Changes of unlisted members only change Total.
func (r *MemoryRegistry) markLocked(mem *member, now time.Time) {
	t := mem.t
	if mem.listed && !mem.dirty {
		mem.dirty = true
		t.changed = append(t.changed, mem)
	}
	// The window closes Window after the first change; a due time set
	// further out (a leave waiting for its grace) is brought forward.
	if due := now.Add(r.cfg.Window); t.due.IsZero() || due.Before(t.due) {
		t.due = due
	}
	r.pending[t] = struct{}{}
}

// flushTopicLocked closes t's window: it returns t's Diff, and false if
// observers would see no change. Leaves still inside their grace stay
// pending, and t.due moves to when the next can be reported but at least
// one Window from now; otherwise t.due becomes zero.
func (r *MemoryRegistry) flushTopicLocked(t *topic, now time.Time) (Diff, bool) {
	d := Diff{Topic: t.name}
	keep := t.changed[:0]
	var next time.Time
	for _, mem := range t.changed {
		if len(mem.holders) == 0 {
			if mem.visible || mem.synced {
				if at := mem.leftAt.Add(r.cfg.LeaveGrace); now.Before(at) {
					keep = append(keep, mem)
					if next.IsZero() || at.Before(next) {
						next = at
					}
					continue
				}
				d.Leaves = append(d.Leaves, mem.state)
			}
			delete(t.members, mem.state.ID)
			mem.gone, mem.dirty = true, false
			t.unlist(mem)
			continue
		}
		mem.dirty = false
		switch {
		case !mem.visible:
			d.Joins = append(d.Joins, mem.state)
			mem.visible = true
		case mem.modified:
			d.Updates = append(d.Updates, mem.state)
		}
		mem.modified, mem.synced = false, false
	}
	clear(t.changed[len(keep):])
	t.changed = keep

	// Fill freed slots with unlisted members, oldest first.
	for t.listed < r.cfg.MaxListed && len(t.waiting) > 0 {
		mem := t.waiting[0]
		t.waiting[0] = nil
		t.waiting = t.waiting[1:]
		if mem.gone {
			t.stale--
			continue
		}
		t.list(mem)
		// The join carries its state: changes made while it was unlisted
		// are reported.
		mem.visible, mem.modified = true, false
		d.Joins = append(d.Joins, mem.state)
	}

	t.due = time.Time{}
	if len(keep) > 0 {
		t.due = now.Add(r.cfg.Window)
		if next.After(t.due) {
			t.due = next
		}
	}
	// Observers still see the members whose leave is pending.
	d.Total = t.present + len(keep)
	if len(d.Joins) == 0 && len(d.Updates) == 0 && len(d.Leaves) == 0 && d.Total == t.total {
		return Diff{}, false
	}
	t.total = d.Total
	for _, l := range [][]Member{d.Joins, d.Updates, d.Leaves} {
		slices.SortFunc(l, byID)
	}
	return d, true
}

// syncLocked returns t's listed members as observers have them (the
// present ones, and the visible ones whose leave is not reported yet:
// within the grace), and self unless self is nil (a List by a holder
// that holds nothing in t). It costs one pass over the listed members,
// which t keeps sorted. A member it lists before observers were told of
// its join is marked synced: the joiner (or the caller of List) has it,
// so its leave must be reported even if it never becomes visible. A visible member it lists
// while its leave is pending is what observers have too: if it comes back
// within the grace nobody is told anything, the joiner included, and if
// it does not, its leave reaches the joiner with everyone's.
func syncLocked(t *topic, self *member) Sync {
	ms := make([]Member, 0, t.listed+1)
	pending := 0
	addSelf := self != nil && !self.listed
	for _, mem := range t.sorted {
		if addSelf && self.state.ID < mem.state.ID {
			ms = append(ms, self.state)
			addSelf = false
		}
		switch {
		case len(mem.holders) > 0:
			ms = append(ms, mem.state)
			if !mem.visible && mem != self {
				mem.synced = true
			}
		case mem.visible:
			ms = append(ms, mem.state) // its leave is pending
			pending++
		}
	}
	if addSelf {
		ms = append(ms, self.state)
	}
	return Sync{Topic: t.name, Members: ms, Total: t.present + pending}
}

// list marks mem listed.
func (t *topic) list(mem *member) {
	mem.listed = true
	t.listed++
	i, _ := slices.BinarySearchFunc(t.sorted, mem.state.ID, cmpID)
	t.sorted = slices.Insert(t.sorted, i, mem)
}

// unlist removes listed mem from t.sorted.
func (t *topic) unlist(mem *member) {
	t.listed--
	if i, ok := slices.BinarySearchFunc(t.sorted, mem.state.ID, cmpID); ok {
		t.sorted = slices.Delete(t.sorted, i, i+1)
	}
}

func cmpID(mem *member, id string) int { return strings.Compare(mem.state.ID, id) }

// differs reports whether observers would see a change from a to b.
func differs(a, b Member) bool {
	return !sameActor(a.ActorID, b.ActorID) || !bytes.Equal(a.Meta, b.Meta)
}

func sameActor(a, b *string) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// own returns m with Meta and ActorID owned by the registry, reusing prev's
// when equal so an unchanged write allocates nothing.
func own(m, prev Member) Member {
	if bytes.Equal(m.Meta, prev.Meta) && (m.Meta == nil) == (prev.Meta == nil) {
		m.Meta = prev.Meta
	} else if m.Meta != nil {
		m.Meta = bytes.Clone(m.Meta)
	}
	if sameActor(m.ActorID, prev.ActorID) {
		m.ActorID = prev.ActorID
	} else if m.ActorID != nil {
		a := *m.ActorID
		m.ActorID = &a
	}
	return m
}

func byID(a, b Member) int { return strings.Compare(a.ID, b.ID) }
