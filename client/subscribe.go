package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/syncgate/syncgate/frames"
)

// Subscription is one active subscription, returned by
// [Client.Subscribe]. Its methods may be called concurrently. With
// [Options.Reconnect] it outlives connections: the Client resubscribes it
// on every new one, from its cursor.
type Subscription struct {
	// Static after Subscribe.
	c       *Client
	sid     string
	target  frames.Target
	handler func(*frames.Patch)
	patches chan *frames.Patch // nil when handler is set; sent to and closed under dmu
	ready   chan struct{}      // closed when settled

	// Written before ready is closed, read-only after.
	snapshot *frames.Snapshot
	expired  bool
	err      error

	// Guarded by c.mu. settled is set once the subscription is live (its
	// snapshot arrived), failed, or abandoned by a cancelled Subscribe.
	settled   bool
	abandoned bool
	dropping  bool
	dropWait  []chan error // later Drops waiting for the outcome of the drop in flight
	via       *conn        // the connection of the latest subscribe add
	expiredOn *conn        // that add was answered X_CURSOR_EXPIRED
	snapOn    *conn        // the connection whose snapshot s follows
	resetOn   *conn        // snapOn said X_CURSOR_EXPIRED while live: its next snapshot is the new position
	resetLate bool         // snapOn reset while the latest add was pending (a take-over): its answer is the new position
	resume    *resumeGroup // the take-over waiting for its snapshot, or nil
	asked     []*conn      // while unsettled: the live connections its add was queued on, where giving up drops it

	// dmu is the delivery lock: two connections may carry patches for the
	// subscription while one takes over from the other, and the handler
	// must see them one at a time. It is held while the handler runs (or
	// a send to Patches waits), so nothing a handler may call takes it.
	dmu sync.Mutex
	// Guarded by dmu.
	from   *conn // the connection whose patches are delivered
	ended  bool  // Patches closed (or, with a handler, no more calls)
	resets int64 // cursor expirations on resume or while live

	dups atomic.Int64 // patch ops dropped as already delivered; added to under dmu

	mu sync.Mutex
	// Guarded by mu.
	cursor frames.Cursor
}

// Subscribe follows topic. It sends subscribe add with a fresh sid (with
// cursor, to resume after it, when cursor is non-nil), waits for the ack and
// the snapshot, and returns the live subscription.
//
// If handler is non-nil it is called in order for every patch of this
// subscription, one call at a time, from the read loop of the connection
// carrying it. It must not block for long: it blocks that read loop, which
// is backpressure by design (see the package doc). If handler is nil,
// patches go to [Subscription.Patches], a channel with a buffer of 1024;
// when it is full the read loop blocks until it is drained.
//
// An ack error is returned as a *frames.Error, except X_CURSOR_EXPIRED: the
// server then sends a fresh snapshot and the subscription is live, so
// Subscribe returns it with [Subscription.CursorExpired] true.
//
// If ctx ends first, Subscribe returns ctx.Err() and gives the
// subscription up, as a Phoenix join that times out leaves its channel.
// The server may still start it, so on each connection the add was
// queued on (one; two while a take-over re-sends it) the Client queues a
// drop for the sid right after it, without waiting for its ack: the
// session's subscription slot (the gateway's MaxSubscriptions) and the
// bandwidth are freed once the server reads it. Nothing of the
// subscription is passed on: its ack, snapshot and patches on that
// connection, and the drop's ack, are consumed, not given to
// [Options.OnFrame]. Should the server refuse the drop (X_INTERNAL: it
// could not drop the subscription), the drop is sent again after a
// backoff (see [Options.BackoffBase]), three times in all; refused every
// time, the subscription's patches stay consumed for the rest of the
// connection. A drop the server dropped over its rate (X_RATE_LIMITED)
// ends the connection (see the package doc, Pacing), and with it the
// subscription. A connection whose writes a take-over has stopped gets no
// drop: it is being closed, which ends the subscription too. With
// Reconnect a given-up subscription is never resubscribed, and a
// Subscribe waiting while the Client reconnects is sent on the new
// connection. A take-over sends a waiting Subscribe's add on its new
// connection too; if that connection ends before it takes over, the old
// one stays current and the Subscribe is answered there, where its add
// went first (an add that went to no live connection is sent on the
// connection that next takes over).
func (c *Client) Subscribe(ctx context.Context, topic string, cursor *frames.Cursor, handler func(*frames.Patch)) (*Subscription, error) {
	s := &Subscription{
		c:       c,
		target:  frames.Target{Kind: frames.TargetTopic, Topic: topic, Cursor: cursor},
		handler: handler,
		ready:   make(chan struct{}),
	}
	if handler == nil {
		s.patches = make(chan *frames.Patch, patchBuffer)
	}
	if err := c.lockSend(ctx); err != nil {
		return nil, err
	}
	if err := c.waitSendSpace(ctx); err != nil {
		c.unlockSend()
		return nil, err
	}
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		c.unlockSend()
		return nil, err
	}
	c.nextSID++
	s.sid = "s" + strconv.FormatInt(c.nextSID, 10)
	cn := c.cur
	if cn == nil && !c.opts.Reconnect {
		c.mu.Unlock()
		c.unlockSend()
		return nil, c.lastConn().endErr()
	}
	c.subs[s.sid] = s
	var err error
	if cn != nil {
		err = s.addOnLocked(cn, nil)
	}
	c.mu.Unlock()
	if cn != nil && err == nil {
		// Queued, not waited for: the ack (or the connection's end)
		// answers it.
		err = cn.postFrame(&frames.Subscribe{Op: frames.OpAdd, SID: s.sid, Target: s.target})
		if err == nil {
			s.addQueued(cn)
		}
	}
	c.unlockSend()
	if err != nil && !c.opts.Reconnect {
		if s.abandon() {
			return nil, err
		}
		// Settled already: the frame went out after all.
	}
	// With Reconnect a failed send is retried on the next connection.

	select {
	case <-s.ready:
	case <-ctx.Done():
		if s.abandon() {
			return nil, ctx.Err()
		}
		<-s.ready // settled meanwhile; it is closed already or about to be
	}
	if s.err != nil {
		return nil, s.err
	}
	return s, nil
}

// addOnLocked records that a subscribe add for s goes out on cn and queues
// the handler of its ack. Caller holds c.mu.
func (s *Subscription) addOnLocked(cn *conn, rg *resumeGroup) error {
	if err := cn.addSubWaiterLocked(s.sid, func(a *frames.Ack, err error) { s.handleAddAck(cn, a, err) }); err != nil {
		return err
	}
	s.via = cn
	s.expiredOn = nil
	s.resetLate = false
	s.resume = rg
	return nil
}

// addQueued records that s's add is queued on cn (see addQueuedLocked).
func (s *Subscription) addQueued(cn *conn) {
	c := s.c
	c.mu.Lock()
	drop := s.addQueuedLocked(cn)
	c.mu.Unlock()
	if drop {
		s.postDrop(cn)
	}
}

// addQueuedLocked records, once s's add is queued on cn, that cn may start
// the subscription, and reports whether the Subscribe gave up meanwhile
// (after the add went to cn, before it was queued): the caller then posts
// the drop to cn, where it follows the add. Whoever comes second, abandon
// or this, drops it. Caller holds c.mu.
func (s *Subscription) addQueuedLocked(cn *conn) (drop bool) {
	if s.abandoned {
		return s.giveUpOnLocked(cn, 0)
	}
	if s.settled {
		return false // a resume: settled subscriptions are not given up
	}
	s.asked = slices.DeleteFunc(s.asked, func(o *conn) bool { return o == cn || o.err != nil })
	s.asked = append(s.asked, cn)
	return false
}

// abandon forgets an unsettled subscription and reports whether it did; if
// it was settled already, the result in s stands. It queues a drop of s
// on every connection its add was queued on (not waiting for either).
func (s *Subscription) abandon() bool {
	c := s.c
	c.mu.Lock()
	if s.settled {
		c.mu.Unlock()
		return false
	}
	s.settled = true
	s.abandoned = true
	if c.subs[s.sid] == s {
		delete(c.subs, s.sid)
	}
	s.resumeDoneLocked()
	var drops []*conn
	for _, cn := range s.asked {
		if s.giveUpOnLocked(cn, 0) {
			drops = append(drops, cn)
		}
	}
	s.asked = nil
	c.mu.Unlock()
	for _, cn := range drops {
		s.postDrop(cn)
	}
	return true
}

// giveUpDropTries bounds the drops of a given-up subscription sent on one
// connection: one the server refuses is sent again after a backoff, at
// most this many times in all.
const giveUpDropTries = 3

// giveUpOnLocked readies the drop of the given-up s on cn, which was sent
// its add, and reports whether to post it (not if cn has ended: the
// server forgot s with it). tries is how many drops of s cn was sent
// before. Until the drop's ack, cn's frames for s are consumed: the add's
// ack (handleAddAck), snapshot and patches (cn.gaveUp) and then the
// drop's ack (the waiter queued here). Caller holds c.mu.
func (s *Subscription) giveUpOnLocked(cn *conn, tries int) bool {
	c, sid := s.c, s.sid
	err := cn.addSubWaiterLocked(sid, func(a *frames.Ack, err error) {
		switch {
		case err != nil:
			// The connection ended: the server forgot s with it.
		case a.Error == nil || a.Error.Code == frames.CodeNotSubscribed:
			c.mu.Lock()
			delete(cn.gaveUp, sid)
			c.mu.Unlock()
		case a.Error.Code == frames.CodeRateLimited:
			// Dropped over the rate: the connection starts over
			// (handleFrameAck), and no later one resubscribes s. (With
			// Reconnect this waiter then gets the connection's end.)
		case tries+1 < giveUpDropTries:
			// Refused: the server kept the subscription (X_INTERNAL: it
			// could not drop it, and asks for the drop again later). Ask
			// again after a backoff, for as long as cn lives; what it
			// sends for s stays consumed meanwhile.
			d := c.backoff(tries)
			cn.tasks.Go(func() {
				if c.opts.Sleep(cn.life, d) == nil {
					s.dropAgain(cn, tries+1)
				}
			})
		default:
			// Refused every time: what the server still sends for s
			// stays consumed for the rest of the connection.
		}
	})
	if err != nil {
		return false
	}
	if cn.gaveUp == nil {
		cn.gaveUp = make(map[string]struct{})
	}
	cn.gaveUp[sid] = struct{}{}
	return true
}

// dropAgain sends the drop of the given-up s on cn once more, after the
// server refused the last one; tries drops were sent before.
func (s *Subscription) dropAgain(cn *conn, tries int) {
	c := s.c
	c.mu.Lock()
	post := s.giveUpOnLocked(cn, tries)
	c.mu.Unlock()
	if post {
		s.postDrop(cn)
	}
}

// postDrop queues the drop of the given-up s on cn, fire and forget:
// giveUpOnLocked has readied it. If cn's writes have stopped (a take-over
// replaced it), cn is being closed, which ends s there too.
func (s *Subscription) postDrop(cn *conn) {
	_ = cn.postFrame(&frames.Subscribe{Op: frames.OpDrop, SID: s.sid, Target: s.target})
}

// settleLocked marks s settled with err (nil: live) and wakes Subscribe.
// Caller holds c.mu and has checked !s.settled.
func (s *Subscription) settleLocked(err error) {
	s.settled = true
	s.asked = nil
	s.err = err
	close(s.ready)
}

// resumeDoneLocked tells the take-over waiting for s, if any, that s is
// settled on the new connection. Caller holds c.mu.
func (s *Subscription) resumeDoneLocked() {
	if s.resume != nil {
		s.resume.doneLocked()
		s.resume = nil
	}
}

// handleAddAck handles the ack of a subscribe add sent on cn. On success
// the subscription waits for its snapshot. It runs on cn's read loop, or
// with cn's error when cn ends first.
func (s *Subscription) handleAddAck(cn *conn, a *frames.Ack, err error) {
	c := s.c
	if err != nil {
		// The connection ended before the ack. Without Reconnect the
		// Client's end settles s; with it, the next connection resends.
		return
	}
	err = ackError(a)
	c.mu.Lock()
	if s.abandoned || s.via != cn {
		// Given up (its drop follows on cn: the ack is consumed), or
		// the subscription has moved on to another connection.
		c.mu.Unlock()
		return
	}
	var fe *frames.Error
	if errors.As(err, &fe) && fe.Code == frames.CodeCursorExpired {
		// Taken for the subscription when its snapshot follows on cn
		// (handleFrameSnapshot): if cn ends first, the next
		// connection's answer decides.
		s.expiredOn = cn
		c.mu.Unlock()
		return
	}
	if err == nil {
		c.mu.Unlock()
		return
	}
	if fe.Code == frames.CodeInternal && c.opts.Reconnect && s.settled {
		// Not a refusal: the server failed to resume it (it could not
		// read the topic's log; it closes the connection with 1011) and
		// asks for the resume again. The subscription stays, and the
		// connection starts over, which resubscribes it from its cursor.
		c.mu.Unlock()
		cn.endWith(fmt.Errorf("client: the server could not resume subscription %q: %w", s.sid, err))
		return
	}
	// Refused: the subscription ends.
	if c.subs[s.sid] == s {
		delete(c.subs, s.sid)
	}
	s.resumeDoneLocked()
	first := !s.settled
	if first {
		s.settleLocked(err)
	}
	c.mu.Unlock()
	if !first {
		s.end()
		c.emit(Event{Kind: EventSubscriptionFailed, URL: cn.url, Sub: s, Err: err})
	}
}

// handleFrameSnapshot settles the subscription waiting for it on cn, or
// switches a resumed one over to cn.
func (cn *conn) handleFrameSnapshot(f *frames.Snapshot) {
	c := cn.c
	c.mu.Lock()
	s, ok := c.subs[f.SID]
	if !ok && cn.gaveUpLocked(f.SID) {
		c.mu.Unlock()
		return
	}
	if ok && s.snapOn == cn && s.resetOn == cn {
		s.resetOn = nil
		takeover := s.via != cn
		if takeover {
			s.resetLate = true
		}
		c.mu.Unlock()
		s.reset(cn, f, takeover)
		return
	}
	if ok && s.settled && s.snapOn == cn {
		// Unannounced, on the connection followed: a persisted topic's
		// log made where there was none. During a take-over (s.via is
		// already the new connection) the old one is still followed
		// until the new one answers, so its patches of the new log come
		// after this snapshot and must find the cursor naming that log;
		// logMade checks that cn's patches are the ones delivered.
		c.mu.Unlock()
		switch made, reset := s.logMade(cn, f); {
		case !made:
			c.onFrame(f)
		case reset:
			c.emit(Event{Kind: EventCursorExpired, URL: cn.url, Sub: s})
		}
		return
	}
	if !ok || s.via != cn || s.snapOn == cn {
		c.mu.Unlock()
		c.onFrame(f) // a later snapshot, or one nobody waits for
		return
	}
	s.snapOn = cn
	expired := s.expiredOn == cn
	resetLate := s.resetLate
	s.resetLate = false
	first := !s.settled
	if first {
		// Read after ready is closed. expired is this connection's
		// answer: an X_CURSOR_EXPIRED on a connection that ended before
		// the snapshot does not count.
		s.snapshot, s.expired = f, expired
	}
	// The take-over waiting for this snapshot is told once the position
	// is moved and reported, so EventResumed follows EventCursorExpired.
	rg := s.resume
	s.resume = nil
	c.mu.Unlock()
	defer func() {
		if rg != nil {
			c.mu.Lock()
			rg.doneLocked()
			c.mu.Unlock()
		}
	}()

	s.dmu.Lock()
	s.from = cn
	s.mu.Lock()
	switch {
	case first, expired:
		// A fresh position: on a cursor the server could not resume, the
		// snapshot's lsn is in the new node's offsets.
		s.cursor = f.Cursor
	case s.cursor.QID == "":
		s.cursor = f.Cursor
	case s.cursor.Digest != "" && f.Cursor.Digest != s.cursor.Digest && (f.Cursor.Digest != "" || resetLate):
		// Answered in another log than the one the cursor names: during
		// the take-over the old connection moved the cursor into a log
		// (made there, or replaced) after the resume went out from the
		// cursor before it, and the new connection continues that one
		// in the log it has, another (or none, the old one having
		// reported its log gone). The two positions are in different
		// logs: take the new connection's, and report the reset, since
		// records of the cursor's log after it may never come.
		s.cursor = f.Cursor
		expired = true
	case s.cursor.Digest == "" && f.Cursor.Digest != "" && f.Cursor.LSN == s.cursor.LSN:
		// Resumed from a cursor that named no log (the topic had no
		// stream, or it was built by hand): the server took it as a
		// position in the log it names.
		s.cursor.Digest = f.Cursor.Digest
	}
	s.mu.Unlock()
	if !first && expired {
		s.resets++
	}
	s.dmu.Unlock()

	if first {
		c.mu.Lock()
		if !s.settled {
			s.settleLocked(nil)
		}
		c.mu.Unlock()
		return
	}
	if expired {
		c.emit(Event{Kind: EventCursorExpired, URL: cn.url, Sub: s})
	}
}

// handleResetAck takes an X_CURSOR_EXPIRED the server sends a live
// subscription on its own, on the connection the subscription follows
// (its topic's log was replaced, or records were pruned before delivery):
// the snapshot that follows is the subscription's new position. It
// reports whether a was such an ack. A subscribe add is never pending for
// a subscription on the connection it follows, so the ack cannot be one's
// answer.
func (cn *conn) handleResetAck(a *frames.Ack) bool {
	if a.Error == nil || a.Error.Code != frames.CodeCursorExpired {
		return false
	}
	c := cn.c
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.subs[a.Ref]
	if !ok || !s.settled || s.snapOn != cn {
		return false
	}
	s.resetOn = cn
	return true
}

// logMade takes the snapshot f a persisted topic's subscription gets, with
// no X_CURSOR_EXPIRED, when the topic's stream is made where there was
// none: the subscription was at the start with nothing after it, the new
// log's start, so nothing is lost and the cursor only gains the log's
// digest (with which a later resume tells this log from one made after
// it). A cursor naming a log already got it from the old connection of a
// take-over, the new one having answered with none: if f names that log,
// its records after the cursor follow and the cursor stays; if another,
// the cursor's log was deleted meanwhile, so the cursor moves to f and
// reset reports that records of its old log may never come. made is false,
// the cursor left alone, for any other snapshot.
func (s *Subscription) logMade(cn *conn, f *frames.Snapshot) (made, reset bool) {
	s.dmu.Lock()
	defer s.dmu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.from != cn || f.Cursor.Digest == "" || f.Cursor.QID != s.cursor.QID {
		return false, false
	}
	switch s.cursor.Digest {
	case f.Cursor.Digest:
		return true, false
	case "":
		s.cursor = f.Cursor
		return true, false
	}
	s.cursor = f.Cursor
	s.resets++
	return true, true
}

// reset moves the subscription to the snapshot f that followed a reset
// on cn: its cursor (of another log, whose offsets start again, or past a
// gap) replaces the old one, so the patches that follow are not taken for
// ones already seen. During a take-over (the subscription was resent on
// another connection, which will answer from the cursor the Client had)
// cn's patches are no longer delivered: the new connection's answer
// carries on, and reports the reset (resetLate) if it does not itself
// continue the cursor's log.
func (s *Subscription) reset(cn *conn, f *frames.Snapshot, takeover bool) {
	s.dmu.Lock()
	if takeover {
		if s.from == cn {
			s.from = nil
		}
		s.dmu.Unlock()
		return
	}
	s.mu.Lock()
	s.cursor = f.Cursor
	s.mu.Unlock()
	s.resets++
	s.dmu.Unlock()
	s.c.emit(Event{Kind: EventCursorExpired, URL: cn.url, Sub: s})
}

func (cn *conn) handleFramePatch(f *frames.Patch) {
	c := cn.c
	c.mu.Lock()
	s, ok := c.subs[f.SID]
	live := ok && s.settled
	gaveUp := !ok && cn.gaveUpLocked(f.SID)
	c.mu.Unlock()
	if !live {
		if !c.opts.Reconnect && !gaveUp {
			c.onFrame(f)
		}
		return
	}
	s.deliver(cn, f)
}

// deliver hands p, which arrived on cn, to the handler or the channel,
// after updating the cursor. With Reconnect it drops patches from a
// connection the subscription has moved away from, and patches at or
// before the cursor (both connections carry them while one takes over).
// It runs on cn's read loop.
func (s *Subscription) deliver(cn *conn, p *frames.Patch) {
	s.dmu.Lock()
	defer s.dmu.Unlock()
	if s.ended || s.from != cn {
		return
	}
	if p.LSN != "" {
		s.mu.Lock()
		old := s.cursor.LSN
		if s.c.opts.Reconnect && old != "" && p.LSN <= old {
			s.mu.Unlock()
			s.dups.Add(int64(len(p.Patches)))
			return
		}
		if s.c.opts.Reconnect && old != "" && len(p.Patches) > 1 && p.Patches[0].LSN <= old {
			// A replayed batch that straddles the cursor: keep the ops
			// after it.
			q := *p
			q.Patches = nil
			for _, op := range p.Patches {
				if op.LSN > old {
					q.Patches = append(q.Patches, op)
				} else {
					s.dups.Add(1)
				}
			}
			p = &q
		}
		s.cursor.LSN = p.LSN
		s.mu.Unlock()
	}
	if s.handler != nil {
		s.handler(p)
		return
	}
	select {
	case s.patches <- p:
	case <-s.c.closing:
	}
}

// end closes the Patches channel (once) and stops deliveries.
func (s *Subscription) end() {
	s.dmu.Lock()
	defer s.dmu.Unlock()
	if s.ended {
		return
	}
	s.ended = true
	if s.patches != nil {
		close(s.patches)
	}
}

// SID returns the subscription id, unique within the Client.
func (s *Subscription) SID() string { return s.sid }

// Topic returns the subscribed topic.
func (s *Subscription) Topic() string { return s.target.Topic }

// Snapshot returns the snapshot the subscription started with. The caller
// must not modify it.
func (s *Subscription) Snapshot() *frames.Snapshot { return s.snapshot }

// CursorExpired reports whether the cursor passed to Subscribe could not be
// resumed, so the snapshot is a fresh one rather than a continuation. It is
// the answer of the connection the snapshot came on: with Reconnect, an
// X_CURSOR_EXPIRED on a connection that ended before its snapshot does not
// count if the next connection resumes the cursor. For expirations on
// later resumes see [EventCursorExpired].
func (s *Subscription) CursorExpired() bool { return s.expired }

// Patches returns the channel patches arrive on when Subscribe was given no
// handler, or nil. It is closed after a successful [Subscription.Drop],
// when a resubscribe is refused ([EventSubscriptionFailed]) and when the
// Client ends.
func (s *Subscription) Patches() <-chan *frames.Patch { return s.patches }

// Cursor returns the snapshot's cursor with LSN set to that of the last
// patch delivered: the patch is counted as soon as it is handed to the
// handler or put into the Patches channel. After a resume whose cursor
// expired, it is the new snapshot's cursor.
func (s *Subscription) Cursor() frames.Cursor {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cursor
}

// Duplicates returns how many patch ops were dropped because their lsn was
// at or before the cursor (with Reconnect, while two connections overlap).
//
// It does not wait for a delivery, so a patch handler may call it.
func (s *Subscription) Duplicates() int64 {
	return s.dups.Load()
}

// Drop sends subscribe drop and waits for the ack. Once the ack arrives no
// more patches are delivered and the Patches channel is closed. An ack
// error is returned as a *frames.Error; X_NOT_SUBSCRIBED still ends the
// subscription. Drop of a subscription already dropped returns nil; one
// while another Drop of it waits for its ack waits for the same outcome
// (or ctx) and returns what that Drop does (ctx aside). With
// Reconnect, a Drop while disconnected, or whose connection ends before
// the ack, ends the subscription at once (it is not resubscribed); so
// does one whose connection a take-over replaces before the ack (the
// drop may then never be written there: the server ends the subscription
// when the Client closes that connection), once the new connection is
// current.
//
// If ctx ends first, Drop returns ctx.Err(); the drop takes effect when its
// ack arrives, or as above.
func (s *Subscription) Drop(ctx context.Context) error {
	c := s.c
	errc := make(chan error, 1)
	if err := c.lockSend(ctx); err != nil {
		return err
	}
	if err := c.waitSendSpace(ctx); err != nil {
		c.unlockSend()
		return err
	}
	c.mu.Lock()
	if c.err == nil && c.subs[s.sid] != s {
		c.mu.Unlock()
		c.unlockSend()
		return nil
	}
	if c.err == nil && s.dropping {
		// A drop is in flight: wait for its outcome rather than send
		// another, which the server would refuse (X_NOT_SUBSCRIBED)
		// once the first has ended the subscription.
		s.dropWait = append(s.dropWait, errc)
		c.mu.Unlock()
		c.unlockSend()
		select {
		case err := <-errc:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	cn := c.cur
	if c.err == nil && cn == nil && c.opts.Reconnect {
		delete(c.subs, s.sid)
		s.resumeDoneLocked()
		c.mu.Unlock()
		c.unlockSend()
		s.end()
		return nil
	}
	var err error
	switch {
	case c.err != nil:
		err = c.err
	case cn == nil:
		err = c.last.err
	default:
		err = cn.addSubWaiterLocked(s.sid, func(a *frames.Ack, err error) {
			if err == nil {
				err = s.handleDropAck(a)
			} else if c.opts.Reconnect && !c.closed() {
				// The connection ended: the server forgot s with it.
				s.forget()
				err = nil
			}
			c.mu.Lock()
			waiting := s.dropWait
			s.dropWait = nil
			c.mu.Unlock()
			for _, w := range waiting {
				w <- err
			}
			errc <- err
		})
		s.dropping = err == nil
	}
	c.mu.Unlock()
	if err != nil {
		c.unlockSend()
		return err
	}
	// Queued, not waited for: once the waiter is in place the drop must
	// reach the wire, and its ack (or the connection's end) answers it.
	err = cn.postFrame(&frames.Subscribe{Op: frames.OpDrop, SID: s.sid, Target: s.target})
	c.unlockSend()
	if err != nil && !c.opts.Reconnect {
		return err // the connection has ended, and with it the Client
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// forget ends s locally.
func (s *Subscription) forget() {
	c := s.c
	c.mu.Lock()
	owned := c.subs[s.sid] == s
	if owned {
		delete(c.subs, s.sid)
	}
	s.resumeDoneLocked()
	c.mu.Unlock()
	if owned {
		s.end()
	}
}

// handleDropAck ends the subscription unless the server refused the drop
// for a reason other than not knowing the sid.
func (s *Subscription) handleDropAck(a *frames.Ack) error {
	err := ackError(a)
	if a.Error != nil && a.Error.Code != frames.CodeNotSubscribed {
		s.c.mu.Lock()
		s.dropping = false
		s.c.mu.Unlock()
		return err
	}
	s.forget()
	return err
}
