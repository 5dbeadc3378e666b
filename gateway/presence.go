package gateway

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/syncgate/syncgate/auth"
	"github.com/syncgate/syncgate/frames"
	"github.com/syncgate/syncgate/presence"
)

// presenceHub is the gateway side of presence (docs/presence.md): it turns
// client presence frames into [presence.Registry] calls, keeps the holds of
// live sessions from expiring, and fans each topic's coalesced Diff out to
// the topic's local subscribers.
//
// Local subscribers are indexed here, not found through the Transport: a
// Diff goes to this node's subscribers only (with a cluster registry every
// node computes the same diffs), and the index is also what tells the
// handler that a session may join a topic's presence. A Diff is encoded
// once; every subscriber is handed the same bytes.
//
// Ordering (docs/presence.md, "What the gateway must do" 6): a joiner's
// Sync (or a requested one) must not be overtaken by a Diff computed
// before it. Join (or List) and the queueing of its ack and Sync, and
// Flush and the queueing of its frames,
// all run under mu, so each session's queue sees them in the order the
// registry produced them. Both are in-memory operations for the memory
// registry (a 1,000-member Sync costs about 0.1 ms to take, more to encode).
type presenceHub struct {
	// Static after newPresenceHub.
	srv       *Server
	reg       presence.Registry
	maxListed int // lists longer than this carry a count

	mu sync.Mutex
	// Guarded by mu. subs counts each local session's subscriptions per
	// topic; held is every session holding presence, with the last state it
	// wrote per topic (to join again if its holds expired).
	subs map[string]map[*session]int32
	held map[*session]map[string]presence.Member
}

func newPresenceHub(srv *Server, reg presence.Registry) *presenceHub {
	return &presenceHub{
		srv:       srv,
		reg:       reg,
		maxListed: srv.cfg.PresenceMaxListed,
		subs:      map[string]map[*session]int32{},
		held:      map[*session]map[string]presence.Member{},
	}
}

// presenceMaxSkew bounds how far a member's updatedAt may run ahead of
// the clock: the gateway clamps a session's writes to it (stampLocked),
// and the registry it builds is given the same bound, so both order a
// session's writes alike.
const presenceMaxSkew = time.Second

// newPresenceRegistry builds the in-process registry from cfg.
func newPresenceRegistry(cfg Config) (presence.Registry, error) {
	return presence.NewMemoryRegistry(presence.Config{
		TTL:        cfg.PresenceTTL,
		Window:     cfg.PresenceWindow,
		LeaveGrace: cfg.PresenceLeaveGrace,
		MaxSkew:    presenceMaxSkew,
		MaxListed:  cfg.PresenceMaxListed,
		Now:        cfg.Now,
	})
}

// run calls Flush every PresenceWindow/4 and refreshes the holds of live
// sessions every PresenceTTL/3 until stop is closed. One ticker for the
// node, not a timer per session.
func (p *presenceHub) run(stop <-chan struct{}) {
	flush := time.NewTicker(max(p.srv.cfg.PresenceWindow/4, time.Millisecond))
	defer flush.Stop()
	refresh := time.NewTicker(max(p.srv.cfg.PresenceTTL/3, time.Millisecond))
	defer refresh.Stop()
	for {
		select {
		case <-stop:
			return
		case <-flush.C:
			p.flush()
		case <-refresh.C:
			p.refresh()
		}
	}
}

// flush fans out the diffs whose window has closed.
func (p *presenceHub) flush() {
	p.mu.Lock()
	defer p.mu.Unlock()
	diffs, err := p.reg.Flush(context.Background())
	if err != nil {
		p.srv.log.Warn("presence flush failed", "err", err)
	}
	for i := range diffs {
		d := &diffs[i]
		subs := p.subs[d.Topic]
		if len(subs) == 0 {
			continue
		}
		items := p.encodeDiff(d)
		p.srv.metrics.presenceDiffs.Inc()
		for s := range subs {
			for _, it := range items {
				s.enqueue(it)
			}
		}
	}
}

// encodeDiff encodes d as up to three presence frames (join, update,
// leave; empty lists skipped), or one update with no members when only the
// count changed. Each frame carries the count.
func (p *presenceHub) encodeDiff(d *presence.Diff) []outItem {
	count := p.count(d.Total)
	items := make([]outItem, 0, 3)
	add := func(op string, ms []presence.Member, always bool) {
		if len(ms) == 0 && !always {
			return
		}
		b, err := frames.Encode(&frames.Presence{Topic: d.Topic, Op: op, Members: wireMembers(ms), Count: count})
		if err != nil {
			p.srv.log.Error("presence encode failed", "topic", d.Topic, "err", err)
			return
		}
		items = append(items, outItem{body: b, kind: idxPresence})
	}
	add(frames.PresenceJoin, d.Joins, false)
	add(frames.PresenceUpdate, d.Updates, false)
	add(frames.PresenceLeave, d.Leaves, false)
	if len(d.Joins)+len(d.Updates)+len(d.Leaves) == 0 {
		add(frames.PresenceUpdate, nil, true)
	}
	return items
}

// count is the wire count for a topic of total members: total when the
// lists are capped, else 0 (left out).
func (p *presenceHub) count(total int) int64 {
	if total > p.maxListed {
		return int64(total)
	}
	return 0
}

// syncCount is the wire count of sn: its Total when the lists are
// capped or when sn leaves a present member out, else 0. The second
// happens with Total within the limit: listed slots stay taken by members
// that left before their join was reported (neither listed to a joiner
// nor counted) until a Flush, or their leave grace, frees them for the
// members waiting.
func (p *presenceHub) syncCount(sn *presence.Sync) int64 {
	if sn.Total > len(sn.Members) {
		return int64(sn.Total)
	}
	return p.count(sn.Total)
}

func wireMembers(ms []presence.Member) []frames.Member {
	out := make([]frames.Member, len(ms))
	for i, m := range ms {
		out[i] = frames.Member(m)
	}
	return out
}

// refresh extends the holds of every session holding presence. A session
// whose holds expired anyway (a stall longer than the TTL) joins again
// with the states it wrote that won, stamped as they were written
// (stampLocked).
func (p *presenceHub) refresh() {
	p.mu.Lock()
	sessions := make([]*session, 0, len(p.held))
	for s := range p.held {
		sessions = append(sessions, s)
	}
	p.mu.Unlock()
	ctx := context.Background()
	for _, s := range sessions {
		err := p.reg.Refresh(ctx, s.id)
		if err == nil {
			continue
		}
		if !errors.Is(err, presence.ErrNotJoined) {
			p.srv.log.Warn("presence refresh failed", logKeySession, s.id, "err", err)
			continue
		}
		p.rejoin(ctx, s)
	}
}

func (p *presenceHub) rejoin(ctx context.Context, s *session) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rejoinLocked(ctx, s, "")
}

// rejoinLocked joins s's member again in every topic s holds but skip,
// with the states that won. Caller holds mu.
func (p *presenceHub) rejoinLocked(ctx context.Context, s *session, skip string) {
	for topic, m := range p.held[s] { // nil once the session closed
		if topic == skip {
			continue
		}
		// The state that won, stamped as it was written: the member may
		// still be held by another session (a second tab), whose newer
		// write must stay.
		if _, err := p.reg.Join(ctx, topic, s.id, m); err != nil {
			p.srv.log.Warn("presence rejoin failed", logKeySession, s.id, "topic", topic, "err", err)
			delete(p.held[s], topic)
			continue
		}
		p.srv.metrics.presenceRejoins.Inc()
	}
	if len(p.held[s]) == 0 {
		delete(p.held, s)
	}
}

// subscribed records a new subscription of s to topic.
func (p *presenceHub) subscribed(s *session, topic string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	m := p.subs[topic]
	if m == nil {
		m = map[*session]int32{}
		p.subs[topic] = m
	}
	m[s]++
}

// unsubscribed records the drop of a subscription of s to topic; the last
// one leaves the topic's presence.
func (p *presenceHub) unsubscribed(ctx context.Context, s *session, topic string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.removeSubLocked(s, topic) {
		p.leaveLocked(ctx, s, topic)
	}
}

// removeSubLocked drops one subscription of s to topic from the index and
// reports whether it was the session's last one there.
func (p *presenceHub) removeSubLocked(s *session, topic string) bool {
	m := p.subs[topic]
	if m == nil || m[s] == 0 {
		return true
	}
	if m[s]--; m[s] > 0 {
		return false
	}
	delete(m, s)
	if len(m) == 0 {
		delete(p.subs, topic)
	}
	return true
}

func (p *presenceHub) leaveLocked(ctx context.Context, s *session, topic string) {
	if _, ok := p.held[s][topic]; !ok {
		return
	}
	delete(p.held[s], topic)
	if len(p.held[s]) == 0 {
		delete(p.held, s)
	}
	if err := p.reg.Leave(ctx, topic, s.id); err != nil {
		p.srv.log.Warn("presence leave failed", logKeySession, s.id, "topic", topic, "err", err)
	}
}

// release lets go of all the presence s holds, at once. The writer calls
// it as the session closes, before the close handshake (which can wait
// seconds for a peer that vanished), and closed calls it again. It uses a
// context of its own: the session's may be cancelled by then.
func (p *presenceHub) release(s *session) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.releaseLocked(s)
}

func (p *presenceHub) releaseLocked(s *session) {
	if _, ok := p.held[s]; !ok {
		return
	}
	delete(p.held, s)
	if err := p.reg.LeaveAll(context.Background(), s.id); err != nil {
		p.srv.log.Warn("presence leave failed", logKeySession, s.id, "err", err)
	}
}

// closed removes an ended session from the index and lets go of any
// presence it still holds (a join handled while it was closing). It runs
// on the session's reader goroutine after the read loop ended: it reads
// s.subs.
func (p *presenceHub) closed(s *session) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, sub := range s.subs {
		p.removeSubLocked(s, sub.topic)
	}
	p.releaseLocked(s)
}

// presenceSyncRate is how many presence lists a session may be sent a
// second (on join or on its request), after a burst of one per
// subscription it may hold (MaxSubscriptions). A list costs the node up to MaxListed members'
// encoding under mu, against one small frame from the client.
const presenceSyncRate = 2

// errSyncRate refuses a join or request whose list the session's budget
// cannot pay.
var errSyncRate = errors.New("presence: over the session's rate of lists")

// join joins s's member m to topic and queues the ack and the Sync. A
// session that has joined topic already has its list and gets its
// diffs: its join writes m like an update and is acked without a second
// Sync, so repeating a join cannot make the node build and send the whole
// list again and again (one small frame against up to MaxListed members).
// A join that needs a Sync takes one from the session's budget of lists
// (leave then join again, or drop and subscribe again, would otherwise
// buy a list per frame or two); without one it is refused (errSyncRate)
// and changes nothing.
func (p *presenceHub) join(ctx context.Context, s *session, topic, ref string, m presence.Member) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, joined := p.held[s][topic]
	var list *rate.Reservation // the list this join is sent, if it needs one
	now := p.srv.cfg.Now()
	m = p.stampLocked(s, topic, m, now)
	if !joined {
		var err error
		if list, err = p.reserveListLocked(s, now); err != nil {
			return err
		}
	}
	if held := len(p.held[s]); held > 1 || held == 1 && !joined {
		// Holds expire per holder: after a stall this Join would make the
		// holder anew with this topic only, and the refresh loop's
		// Refresh would then not notice the others lost. (Joins are
		// bounded by the frame rate: the look costs little.)
		if err := p.reg.Refresh(ctx, s.id); errors.Is(err, presence.ErrNotJoined) {
			p.rejoinLocked(ctx, s, topic)
		}
	}
	sn, err := p.reg.Join(ctx, topic, s.id, m)
	if err != nil {
		if list != nil {
			list.CancelAt(now) // no list was sent
		}
		return err
	}
	p.holdLocked(s, topic, m)
	s.sendAck(ref, nil)
	if !joined {
		s.send(&frames.Presence{Topic: topic, Op: frames.PresenceSync, Members: wireMembers(sn.Members), Count: p.syncCount(&sn)})
	}
	return nil
}

// reserveListLocked takes one list from s's budget (presenceSyncRate,
// after a burst of MaxSubscriptions), or refuses with errSyncRate. A
// caller that then sends no list gives it back with CancelAt(now), at the
// reservation's own time: later, rate.Reservation gives nothing back.
// Only the session's reader (under mu) uses its limiter, so nothing comes
// between.
func (p *presenceHub) reserveListLocked(s *session, now time.Time) (*rate.Reservation, error) {
	if s.syncs == nil {
		s.syncs = rate.NewLimiter(presenceSyncRate, max(1, p.srv.cfg.MaxSubscriptions))
	}
	list := s.syncs.ReserveN(now, 1)
	if !list.OK() || list.DelayFrom(now) > 0 {
		list.CancelAt(now)
		return nil, errSyncRate
	}
	return list, nil
}

// list answers a subscriber's request for topic's member list (a sync
// frame from the client): the ack, then the Sync, queued under mu like a
// join's so no Diff computed before it overtakes it. It takes a list
// from the session's budget, as a join that needs one does. The caller
// has checked that s subscribes to topic: presence is readable by the
// topic's subscribers (its diffs reach them whether or not they may
// join), so the list needs no grant of its own (docs/security.md).
func (p *presenceHub) list(ctx context.Context, s *session, topic, ref string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.srv.cfg.Now()
	list, err := p.reserveListLocked(s, now)
	if err != nil {
		return err
	}
	sn, err := p.reg.List(ctx, topic, s.id)
	if err != nil {
		list.CancelAt(now)
		return err
	}
	s.sendAck(ref, nil)
	s.send(&frames.Presence{Topic: topic, Op: frames.PresenceSync, Members: wireMembers(sn.Members), Count: p.syncCount(&sn)})
	return nil
}

// update writes s's member m in topic. A registry that lost the member
// while the session held it (its hold expired in a stall longer than the
// TTL, before the refresh loop's rejoin) is joined again with the
// session's state that won (m, unless m lost by last-write-wins): the
// client joined and never left, so its update is not refused, and the
// rejoin that follows does not write the state m replaced. The rejoin
// here and the refresh loop's both write the session's state stamped as
// it was written, and the registry orders writes by their stamps, so
// neither undoes the other, in whichever order they come.
func (p *presenceHub) update(ctx context.Context, s *session, topic string, m presence.Member) error {
	p.mu.Lock()
	m = p.stampLocked(s, topic, m, p.srv.cfg.Now())
	p.mu.Unlock()
	err := p.reg.Update(ctx, topic, s.id, m)
	if err != nil && !errors.Is(err, presence.ErrNotJoined) {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.held[s][topic]; !ok {
		return err // not joined here either (nil: a leave came between)
	}
	if err != nil {
		if _, err := p.reg.Join(ctx, topic, s.id, m); err != nil {
			return err
		}
		p.srv.metrics.presenceRejoins.Inc()
		// Holds expire per holder: the registry lost the session's other
		// topics too, and the Join made the holder anew, so the refresh
		// loop's Refresh will not notice.
		p.rejoinLocked(ctx, s, topic)
	}
	p.holdLocked(s, topic, m)
	return nil
}

// stampLocked returns the write s's member in topic stands at after
// the client's write m, as the registry orders writes ([presence.Wins]):
// m with a concrete UpdatedAt, or the session's earlier write if that
// wins. UpdatedAt 0 or less ("now") is stamped now, but after the
// session's earlier write: a session's writes stamped "now" win in the
// order they arrive, also in one millisecond or after the clock stepped
// back (by less than presenceMaxSkew). Every stamp is clamped to
// now+presenceMaxSkew, as the registry clamps it.
//
// What it returns is what the session holds (holdLocked) and what a
// rejoin writes again, stamped as it was: "now" at the rejoin would beat
// a newer write of another session holding the member, or bring back a
// write that had lost.
func (p *presenceHub) stampLocked(s *session, topic string, m presence.Member, now time.Time) presence.Member {
	ms := now.UnixMilli()
	prev, ok := p.held[s][topic]
	if m.UpdatedAt <= 0 {
		m.UpdatedAt = ms
		if ok {
			m.UpdatedAt = max(ms, prev.UpdatedAt+1)
		}
	}
	m.UpdatedAt = min(m.UpdatedAt, ms+presenceMaxSkew.Milliseconds())
	if ok && !presence.Wins(m, s.id, prev, s.id) {
		return prev
	}
	return m
}

func (p *presenceHub) holdLocked(s *session, topic string, m presence.Member) {
	h := p.held[s]
	if h == nil {
		h = map[string]presence.Member{}
		p.held[s] = h
	}
	h[topic] = m
}

// leave lets go of s's member in topic.
func (p *presenceHub) leave(ctx context.Context, s *session, topic string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.leaveLocked(ctx, s, topic)
}

// memberID is the presence member id of s: its hello.clientId, which
// survives a reconnect, else its session id.
func (s *session) memberID() string {
	if s.clientID != "" {
		return s.clientID
	}
	return s.id
}

// subscribedTo reports whether s has a subscription to topic.
func (s *session) subscribedTo(topic string) bool {
	for _, sub := range s.subs {
		if sub.topic == topic {
			return true
		}
	}
	return false
}

// handleFramePresence carries out a client presence frame and answers it
// with an ack (ref "presence:<topic>") or a typed error; the ack of a join
// and of a sync (a request for the list) is followed by the topic's sync.
func (s *session) handleFramePresence(ctx context.Context, f *frames.Presence) {
	ref := presenceRefPrefix + f.Topic
	if err := validTopic(f.Topic); err != nil {
		s.sendError(frames.NewError(frames.CodeBadTopic, ref, "presence.topic: "+err.Error(), topicFix))
		return
	}
	p := s.srv.presence
	switch f.Op {
	case frames.PresenceLeave:
		p.leave(ctx, s, f.Topic)
		s.sendAck(ref, nil)
		return
	case frames.PresenceSync:
		// A request for the list: no grant beyond the subscription,
		// whose diffs carry the same members.
		switch {
		case len(f.Members) != 0:
			s.sendError(frames.NewError(frames.CodeBadField, ref, fmt.Sprintf("presence.members: a sync request carries no members, got %d", len(f.Members)),
				`send {"type":"presence","v":1,"topic":…,"op":"sync","members":[]}`))
		case !s.subscribedTo(f.Topic):
			s.sendError(frames.NewError(frames.CodePresenceNotSubscribed, ref, "presence: this session has no subscription to topic "+quote(f.Topic), "subscribe to the topic first"))
		default:
			if err := p.list(ctx, s, f.Topic, ref); err != nil {
				s.sendError(s.presenceError(ref, f.Topic, err))
			}
		}
		return
	}
	if len(f.Members) != 1 {
		s.sendError(frames.NewError(frames.CodeBadField, ref, fmt.Sprintf("presence.members: want exactly one member (your own), got %d", len(f.Members)),
			`send members: [{"id":"","actorId":null,"meta":{…},"updatedAt":<ms>}]; the server sets id and actorId`))
		return
	}
	if !s.allowed(auth.Presence, ref, f.Topic) {
		return
	}
	if !s.subscribedTo(f.Topic) {
		s.sendError(frames.NewError(frames.CodePresenceNotSubscribed, ref, "presence: this session has no subscription to topic "+quote(f.Topic), ""))
		return
	}
	in := f.Members[0]
	m := presence.Member{ID: s.memberID(), ActorID: s.actorID(), Meta: in.Meta, UpdatedAt: in.UpdatedAt}
	var err error
	if f.Op == frames.PresenceJoin {
		err = p.join(ctx, s, f.Topic, ref, m)
	} else {
		err = p.update(ctx, s, f.Topic, m)
	}
	if err != nil {
		s.sendError(s.presenceError(ref, f.Topic, err))
		return
	}
	if f.Op != frames.PresenceJoin {
		s.sendAck(ref, nil)
	}
}

// presenceError maps a registry error to the typed error that answers ref.
func (s *session) presenceError(ref, topic string, err error) *frames.Error {
	switch {
	case errors.Is(err, errSyncRate):
		return frames.NewError(frames.CodePresenceRateLimited, ref,
			fmt.Sprintf("presence: this session was sent %d member lists at once and %d a second since; this frame would need another", max(1, s.srv.cfg.MaxSubscriptions), presenceSyncRate), "")
	case errors.Is(err, presence.ErrMetaTooLarge):
		return frames.NewError(frames.CodeMetaTooLarge, ref, "presence.members[0].meta: over the server's limit", "")
	case errors.Is(err, presence.ErrIDConflict):
		return frames.NewError(frames.CodePresenceConflict, ref,
			"presence: member id "+quote(s.memberID())+" is held by another actor in topic "+quote(topic), "")
	case errors.Is(err, presence.ErrNotJoined):
		return frames.NewError(frames.CodePresenceNotJoined, ref, "presence: this session has not joined topic "+quote(topic)+" (or its member expired)", "")
	case errors.Is(err, presence.ErrNoID):
		return frames.NewError(frames.CodeBadField, ref, "presence: "+err.Error(), "")
	}
	s.log().Warn("presence failed", "topic", topic, "err", err)
	return frames.NewError(frames.CodeInternal, ref, "the server could not update presence in topic "+quote(topic), "retry the same frame later")
}
