package presence

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"time"
)

// Member is one id's presence in a topic. Its fields match frames.Member
// (without the JSON tags), so the gateway converts with frames.Member(m).
//
// A Member returned by the registry shares Meta with the registry's state:
// treat it as read-only.
type Member struct {
	ID        string          // set by the gateway: hello.clientId, else the session id
	ActorID   *string         // set by the gateway from the session; nil for anonymous
	Meta      json.RawMessage // client-chosen JSON, at most Config.MaxMetaBytes; nil encodes as null
	UpdatedAt int64           // ms since the Unix epoch; orders writes (last write wins)
}

// Wins reports whether write a by holder ah beats write b by holder bh
// by last-write-wins (docs/presence.md): the greater (UpdatedAt, Meta
// bytewise, holder) key wins, with UpdatedAt already made concrete (a
// registry stamps 0 as now, clamped to now+MaxSkew). Equal keys are the
// same write. Every Registry orders writes by it, and a caller that must
// know which of two of its writes stands (the gateway) asks it.
func Wins(a Member, ah string, b Member, bh string) bool {
	if c := cmp.Compare(a.UpdatedAt, b.UpdatedAt); c != 0 {
		return c > 0
	}
	if c := bytes.Compare(a.Meta, b.Meta); c != 0 {
		return c > 0
	}
	return ah > bh
}

// Sync is a topic's member list for one joiner, taken when it joined, or
// for a holder or observer that asked (List).
type Sync struct {
	Topic string
	// Members are the listed members as observers have them, sorted by
	// ID: the present ones and those whose leave is still within
	// LeaveGrace (not reported yet), and the joiner itself even when it
	// is not listed (then len(Members) may be MaxListed+1); a List's, the
	// asking holder's member likewise. Members is empty, not nil, for a
	// topic nobody is in.
	Members []Member
	// Total counts every present member, listed or not, and those
	// listed whose leave is pending, as a Diff's Total does. Total minus
	// the listed members in Members is the "and N more" a client may
	// show.
	Total int
}

// Diff is the net change of one topic over one coalescing window. Each
// list is sorted by ID; a member appears in at most one list.
//
// Clients apply it idempotently: a join or update replaces the member's
// entry (adding it if absent), a leave removes it. The joiner's own join
// may arrive after its Sync; applying it changes nothing.
type Diff struct {
	Topic   string
	Joins   []Member // members now listed that observers did not have
	Updates []Member // listed members whose ActorID or Meta changed: the last state
	Leaves  []Member // listed members gone (their last state), left at least LeaveGrace ago; also one a Sync listed before its join was reported
	// Total counts every present member after the diff, listed or not. A
	// Diff whose lists are empty reports a change of Total only.
	Total int
}

// Registry is the presence behaviour the gateway consumes. Every
// implementation must pass presencetest.Run.
//
// All methods may be called concurrently. ctx carries cancellation only.
// holder identifies one session (its session id); topic is a validated
// topic name. The methods in the order the gateway calls them:
//
//   - Join adds holder's hold on member m in topic, or updates it when
//     holder already holds m there, and returns the topic's Sync (m's
//     accepted state included). If holder held another id in topic, it
//     lets go of it first.
//   - Update writes m's state for a member that holder holds in topic
//     (ErrNotJoined otherwise). A write that loses by last-write-wins is
//     not an error: it is dropped.
//   - Refresh extends holder's TTL; ErrNotJoined if holder holds nothing
//     (it left everything or already expired). Join and Update refresh too.
//   - List returns topic's Sync for holder, which asked for it: what a
//     Join would return, the member holder holds in topic included, and
//     none when it holds none there (a subscriber that only watches; an
//     empty holder is one). Like a Join's Sync, a member it lists before
//     observers were told of its join will have its leave reported. An
//     empty topic is an empty list, not an error.
//   - Leave lets go of holder's member in topic; not holding one is not an
//     error.
//   - LeaveAll lets go of everything holder holds (session closed).
//   - Flush sweeps expired holders and returns one Diff per topic whose
//     window has closed, sorted by topic. The owner calls it from a ticker,
//     every Window/4 or so.
type Registry interface {
	Join(ctx context.Context, topic, holder string, m Member) (Sync, error)
	Update(ctx context.Context, topic, holder string, m Member) error
	Refresh(ctx context.Context, holder string) error
	List(ctx context.Context, topic, holder string) (Sync, error)
	Leave(ctx context.Context, topic, holder string) error
	LeaveAll(ctx context.Context, holder string) error
	Flush(ctx context.Context) ([]Diff, error)
}

// Errors of Join and Update (ErrNoID of List too).
var (
	// ErrNoID: the member's ID (or the topic or holder) is empty.
	ErrNoID = errors.New("presence: empty member id, topic or holder")
	// ErrMetaTooLarge: Meta is longer than Config.MaxMetaBytes.
	ErrMetaTooLarge = errors.New("presence: meta too large")
	// ErrIDConflict: the member id is held by another actor.
	ErrIDConflict = errors.New("presence: member id held by another actor")
)

// Errors of Update and Refresh.
var (
	// ErrNotJoined: the holder does not hold that member in that topic
	// (Update), or holds nothing at all (Refresh): it never joined, left,
	// or expired.
	ErrNotJoined = errors.New("presence: not joined")
)

// Config configures a registry. The zero value is valid: every zero field
// takes its documented default. Backends share these fields.
type Config struct {
	// TTL is how long a holder stays without Join, Update or Refresh before
	// it expires. Defaults to 30s.
	TTL time.Duration
	// Window is the coalescing window: a topic's diffs are batched over it,
	// and a topic gets at most one Diff per Window. Defaults to 100ms.
	Window time.Duration
	// LeaveGrace is how long a member must stay absent before its leave is
	// reported; a rejoin inside it is no flap. Defaults to 1s; at least
	// Window.
	LeaveGrace time.Duration
	// MaxSkew bounds how far UpdatedAt may run ahead of the clock; later
	// values are clamped to now+MaxSkew. Defaults to 1s.
	MaxSkew time.Duration
	// MaxListed is how many members of a topic syncs and diffs list; the
	// rest are counted only. Defaults to 1000.
	MaxListed int
	// MaxMetaBytes is the largest Meta accepted. Defaults to 512.
	MaxMetaBytes int
	// Now is the clock. Nil means time.Now. Tests pass a fake clock, or
	// run under testing/synctest with the default.
	Now func() time.Time
}

// withDefaults returns a copy of c with defaults filled in, or an error for
// a value out of range.
func (c Config) withDefaults() (Config, error) {
	switch {
	case c.TTL < 0, c.Window < 0, c.LeaveGrace < 0, c.MaxSkew < 0, c.MaxListed < 0, c.MaxMetaBytes < 0:
		return c, errors.New("presence: negative Config value")
	}
	setDefault(&c.TTL, 30*time.Second)
	setDefault(&c.Window, 100*time.Millisecond)
	setDefault(&c.LeaveGrace, time.Second)
	setDefault(&c.MaxSkew, time.Second)
	setDefault(&c.MaxListed, 1000)
	setDefault(&c.MaxMetaBytes, 512)
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.LeaveGrace < c.Window {
		return c, errors.New("presence: LeaveGrace shorter than Window")
	}
	return c, nil
}

func setDefault[T time.Duration | int](p *T, v T) {
	if *p == 0 {
		*p = v
	}
}
