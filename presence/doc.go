// Package presence keeps who is present in each topic: members with a TTL,
// last-write-wins state and coalesced join/update/leave diffs. It imports
// nothing of ours and publishes nothing itself: it returns a joiner's
// [Sync] and, per topic and window, one batched [Diff] that the gateway
// encodes once and fans out.
//
// Start with [Registry], the interface the gateway consumes, and
// [NewMemoryRegistry], its in-process implementation. Other backends (a
// NATS KV registry) implement the same interface and must pass the contract
// suite in presence/presencetest. docs/presence.md is the long form.
//
// # Members and holders
//
// A [Member] is one id's presence in a topic. The gateway sets the id (the
// session's hello.clientId, else its session id), so a client that
// reconnects stays one member. A member may be held by several holders
// (sessions) at once, as during a make-before-break reconnect: it leaves
// only when its last holder leaves or expires. A holder holds at most one
// member per topic.
//
// # Last write wins
//
// A member's state is the write with the greatest (UpdatedAt, Meta, holder)
// key: UpdatedAt first, then the Meta bytes compared with [bytes.Compare],
// then the writing holder's id compared as strings. The greater key wins, so
// the outcome does not depend on the order writes arrive in. UpdatedAt is
// clamped to the registry clock plus [Config.MaxSkew]; zero or negative
// means "now". [Wins] is the comparison, for every Registry and for a
// caller that must know which of two writes stands. A join of an absent
// member is always accepted: LWW orders writes to a present member, not a
// member against its own past.
//
// # TTL
//
// Each holder expires [Config.TTL] after its last Join, Update or Refresh;
// the gateway calls Refresh at TTL/3 while the socket lives, so only a
// vanished node or socket expires. Expired holders are swept lazily by every
// method call, Flush included.
//
// # Coalescing
//
// Changes are not reported one by one. A topic's first unreported change
// opens a window of [Config.Window]; the Flush after it closes returns one
// Diff for the topic with the net change: a member that joined and left
// inside the window is not reported (but for its leave, if a joiner's Sync
// listed it meanwhile), several updates report only the last state. A
// leave is reported only once the member has been absent for
// [Config.LeaveGrace], so a member that leaves and rejoins within the grace
// (a page reload, a break-before-make reconnect) does not flap; until its
// leave is reported, a Sync still lists it, as observers still have it. A
// topic gets at most one Diff per Window.
//
// # Limits
//
// At most [Config.MaxListed] members of a topic are listed (reported in syncs
// and diffs, in join order); the others are counted in [Sync.Total] and
// [Diff.Total] only and are listed, oldest first, as listed members leave.
// Meta is at most [Config.MaxMetaBytes]. Refusals are the sentinel errors
// below.
package presence
