package client

import (
	"context"
	"errors"
	"strconv"
	"sync"

	"github.com/syncgate/syncgate/frames"
)

// Subscription is one active subscription, returned by
// [Client.Subscribe]. Its methods may be called concurrently.
type Subscription struct {
	// Static after Subscribe.
	c       *Client
	sid     string
	target  frames.Target
	handler func(*frames.Patch)
	patches chan *frames.Patch // nil when handler is set; sent to and closed by the read loop only
	ready   chan struct{}      // closed when settled

	// Written before ready is closed, read-only after.
	snapshot *frames.Snapshot
	expired  bool
	err      error

	// Guarded by c.mu. settled is set once the subscription is live (its
	// snapshot arrived), failed, or abandoned by a cancelled Subscribe.
	settled bool

	mu sync.Mutex
	// Guarded by mu.
	cursor frames.Cursor
}

// Subscribe follows topic. It sends subscribe add with a fresh sid (with
// cursor, to resume after it, when cursor is non-nil), waits for the ack and
// the snapshot, and returns the live subscription.
//
// If handler is non-nil it is called from the read loop, in order, for every
// patch of this subscription. It must not block for long: it blocks the read
// loop, which is backpressure by design (see the package doc). If handler is
// nil, patches go to [Subscription.Patches], a channel with a buffer of 1024;
// when it is full the read loop blocks until it is drained.
//
// An ack error is returned as a *frames.Error, except X_CURSOR_EXPIRED: the
// server then sends a fresh snapshot and the subscription is live, so
// Subscribe returns it with [Subscription.CursorExpired] true.
//
// If ctx ends first, Subscribe returns ctx.Err(). The server may still
// start the subscription; its snapshot and patches then go to
// [Options.OnFrame].
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
	w := &waiter{fn: s.handleAddAck}

	c.mu.Lock()
	c.nextSID++
	s.sid = "s" + strconv.FormatInt(c.nextSID, 10)
	if err := c.addWaiterLocked(s.sid, w); err != nil {
		c.mu.Unlock()
		return nil, err
	}
	c.subs[s.sid] = s
	c.mu.Unlock()

	err := c.Send(ctx, &frames.Subscribe{Op: frames.OpAdd, SID: s.sid, Target: s.target})
	if err != nil {
		if s.abandon(w) {
			return nil, err
		}
		// Settled already: the frame went out after all.
	}

	select {
	case <-s.ready:
	case <-ctx.Done():
		if s.abandon(w) {
			return nil, ctx.Err()
		}
		<-s.ready // settled meanwhile; it is closed already or about to be
	}
	if s.err != nil {
		return nil, s.err
	}
	return s, nil
}

// abandon forgets an unsettled subscription and reports whether it did; if
// it was settled already, the result in s stands.
func (s *Subscription) abandon(w *waiter) bool {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.settled {
		return false
	}
	s.settled = true
	c.removeWaiterLocked(s.sid, w)
	if c.subs[s.sid] == s {
		delete(c.subs, s.sid)
	}
	return true
}

// settleLocked marks s settled with err (nil: live) and wakes Subscribe.
// Caller holds c.mu and has checked !s.settled.
func (s *Subscription) settleLocked(err error) {
	s.settled = true
	s.err = err
	close(s.ready)
}

// handleAddAck is the waiter for the subscribe add ack. On success it
// records an expired cursor and leaves the subscription waiting for its
// snapshot.
func (s *Subscription) handleAddAck(a *frames.Ack, err error) {
	if err == nil {
		err = ackError(a)
	}
	var fe *frames.Error
	if errors.As(err, &fe) && fe.Code == frames.CodeCursorExpired {
		s.expired = true // read after ready is closed
		return
	}
	if err == nil {
		return
	}
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if s.settled {
		return // abandoned
	}
	if c.subs[s.sid] == s {
		delete(c.subs, s.sid)
	}
	s.settleLocked(err)
}

// deliver hands p to the handler or the channel, after updating the cursor.
// It runs on the read loop.
func (s *Subscription) deliver(p *frames.Patch) {
	if p.LSN != "" {
		s.mu.Lock()
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

// SID returns the subscription id, unique within the Client.
func (s *Subscription) SID() string { return s.sid }

// Snapshot returns the snapshot the subscription started with. The caller
// must not modify it.
func (s *Subscription) Snapshot() *frames.Snapshot { return s.snapshot }

// CursorExpired reports whether the cursor passed to Subscribe could not be
// resumed, so the snapshot is a fresh one rather than a continuation.
func (s *Subscription) CursorExpired() bool { return s.expired }

// Patches returns the channel patches arrive on when Subscribe was given no
// handler, or nil. It is closed after a successful [Subscription.Drop] and
// when the connection ends.
func (s *Subscription) Patches() <-chan *frames.Patch { return s.patches }

// Cursor returns the snapshot's cursor with LSN set to that of the last
// patch delivered: the patch is counted as soon as it is handed to the
// handler or put into the Patches channel.
func (s *Subscription) Cursor() frames.Cursor {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cursor
}

// Drop sends subscribe drop and waits for the ack. Once the ack arrives no
// more patches are delivered and the Patches channel is closed. An ack
// error is returned as a *frames.Error; X_NOT_SUBSCRIBED still ends the
// subscription. Drop of a subscription already dropped returns nil.
//
// If ctx ends first, Drop returns ctx.Err() and the subscription stays
// live on the client; the ack goes to [Options.OnFrame].
func (s *Subscription) Drop(ctx context.Context) error {
	c := s.c
	errc := make(chan error, 1)
	w := &waiter{fn: func(a *frames.Ack, err error) {
		if err == nil {
			err = s.handleDropAck(a)
		}
		errc <- err
	}}

	c.mu.Lock()
	if c.err == nil && c.subs[s.sid] != s {
		c.mu.Unlock()
		return nil
	}
	err := c.addWaiterLocked(s.sid, w)
	c.mu.Unlock()
	if err != nil {
		return err
	}

	err = c.Send(ctx, &frames.Subscribe{Op: frames.OpDrop, SID: s.sid, Target: s.target})
	if err != nil && c.removeWaiter(s.sid, w) {
		return err
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		if c.removeWaiter(s.sid, w) {
			return ctx.Err()
		}
		return <-errc
	}
}

// handleDropAck ends the subscription unless the server refused the drop
// for a reason other than not knowing the sid. It runs on the read loop,
// the only sender on s.patches.
func (s *Subscription) handleDropAck(a *frames.Ack) error {
	err := ackError(a)
	if a.Error != nil && a.Error.Code != frames.CodeNotSubscribed {
		return err
	}
	c := s.c
	c.mu.Lock()
	owned := c.subs[s.sid] == s
	if owned {
		delete(c.subs, s.sid)
	}
	c.mu.Unlock()
	if owned && s.patches != nil {
		close(s.patches)
	}
	return err
}
