package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/syncgate/syncgate/frames"
)

// takeOverWait bounds two waits of a take-over (make-before-break): for the
// old connection's in-flight mutates to be acknowledged before the new
// connection takes them, and for the new connection's resubscribe
// snapshots before the old connection is closed. Neither holds the send
// lock.
const takeOverWait = 10 * time.Second

// EventKind says what an [Event] reports.
type EventKind int

// Event kinds.
const (
	// EventReconnectScheduled: the server sent a reconnect frame. Delay is
	// its afterMs, Reason its reason; the Client opens its next connection
	// at At + Delay, while the current one keeps delivering.
	EventReconnectScheduled EventKind = iota + 1
	// EventDisconnected: the current connection ended without a reconnect
	// frame. Err says why; Delay is the backoff before the next attempt.
	EventDisconnected
	// EventDialFailed: connection attempt Attempt to URL failed with Err;
	// Delay is the wait before the next one (what is left of the
	// server's afterMs, counted from its reconnect frame's arrival, if it
	// refused with one, Reason then set; else backoff). It is never
	// negative.
	EventDialFailed
	// EventConnected: a new connection to URL completed its hello; the
	// Client now resubscribes and re-sends on it.
	EventConnected
	// EventResumed: the new connection took over: every subscription is
	// live on it (or failed, see EventSubscriptionFailed) and unacknowledged
	// mutates were re-sent. Since is when the reconnect began: the
	// scheduled time (Reason set), or when the connection was lost. If the
	// new connection has not answered every resubscribe within 10 s it
	// takes over anyway (the old one is closed), and Err, which wraps
	// context.DeadlineExceeded, says how many are not live yet: each gets
	// no patches until the new connection answers it (then it resumes
	// from its cursor, or fails as above). A take-over that Close
	// interrupts emits nothing.
	EventResumed
	// EventCursorExpired: Sub could not be resumed from its cursor
	// (X_CURSOR_EXPIRED, e.g. an ephemeral topic), or the server reset it
	// while live (its persisted topic's log was deleted or made anew), or
	// a take-over's two connections put it in two different logs of its
	// persisted topic (see the package doc, Reconnecting): it continues
	// from a fresh snapshot, and messages between the old cursor and it
	// are lost.
	EventCursorExpired
	// EventSubscriptionFailed: the new connection refused Sub's resubscribe
	// with Err; Sub has ended (its Patches channel is closed).
	EventSubscriptionFailed
)

var eventNames = map[EventKind]string{
	EventReconnectScheduled: "reconnect-scheduled",
	EventDisconnected:       "disconnected",
	EventDialFailed:         "dial-failed",
	EventConnected:          "connected",
	EventResumed:            "resumed",
	EventCursorExpired:      "cursor-expired",
	EventSubscriptionFailed: "subscription-failed",
}

func (k EventKind) String() string {
	if s, ok := eventNames[k]; ok {
		return s
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Event reports a step of reconnection to [Options.OnEvent]. Fields not
// named by the Kind's doc are zero.
type Event struct {
	Kind    EventKind
	At      time.Time // when it happened (Options.Now)
	URL     string
	Attempt int           // the attempt's number: Dial's first is 0, and every later one (Dial's retries included) the next
	Reason  string        // the server's reconnect reason, "" for an unscheduled one
	Delay   time.Duration // see the Kind
	Since   time.Time     // EventResumed: when the reconnect began
	Err     error
	Sub     *Subscription
}

// backoff returns the full-jitter delay before retry number attempt
// (from 0): uniform in [0, min(cap, base·2^attempt)).
func (c *Client) backoff(attempt int) time.Duration {
	ceil := c.opts.BackoffCap
	if attempt < 62 {
		if d := c.opts.BackoffBase << attempt; d > 0 && d < ceil && d>>attempt == c.opts.BackoffBase {
			ceil = d
		}
	}
	return time.Duration(c.opts.Rand(int64(ceil)))
}

// untilDeadline returns how long from now until at+d: 0 once it has
// passed (the frame that set it arrived more than d ago), never less, as
// Event.Delay reports it.
func (c *Client) untilDeadline(at time.Time, d time.Duration) time.Duration {
	return max(0, at.Add(d).Sub(c.opts.Now()))
}

// dialRetry makes the first connection for Dial with Reconnect, retrying
// until ctx ends; a refused hello is final. n is the number of the
// attempt that connected (0: the first), from which the supervisor
// counts on.
func (c *Client) dialRetry(ctx context.Context) (cn *conn, n int, err error) {
	url := c.url
	for attempt := 0; ; n++ {
		if n > 0 && c.opts.URLFor != nil {
			url = c.opts.URLFor(n)
		}
		cn, err := c.connect(ctx, url)
		if err == nil {
			return cn, n, nil
		}
		if r, ok := errors.AsType[*errHelloRefused](err); ok {
			return nil, n, r.err
		}
		if ctx.Err() != nil {
			return nil, n, err
		}
		var wait time.Duration
		reason := ""
		if r, ok := errors.AsType[*retryError](err); ok {
			wait = c.untilDeadline(r.at, r.frame.Delay())
			reason = r.reason
		} else {
			wait = c.backoff(attempt)
			attempt++
		}
		c.emit(Event{Kind: EventDialFailed, URL: url, Attempt: n, Reason: reason, Delay: wait, Err: err})
		if serr := c.opts.Sleep(ctx, wait); serr != nil {
			return nil, n, fmt.Errorf("%w (last attempt: %w)", serr, err)
		}
	}
}

// supervise owns the Client's connections with Reconnect: it waits for the
// current one to be told to move (a reconnect frame) or to end, opens the
// next one at the right time, lets it take over, and on Close closes them
// all and ends the Client. n is the number of Dial's attempt that made
// cur.
func (c *Client) supervise(ctx context.Context, cur *conn, n int) {
	attempt := 0 // backoff attempts since the last stable connection
	// n counts connection attempts on from Dial's (the first is 0), so
	// URLFor and Event.Attempt never see a number twice.
	for ctx.Err() == nil {
		// Wait for a reason to move.
		var (
			wait   time.Duration
			reason string
			since  time.Time
		)
		select {
		case <-ctx.Done():
			continue
		case <-cur.wake:
		case <-cur.done:
		}
		c.mu.Lock()
		rf, rat, up, ended := cur.reconnect, cur.reconAt, cur.upAt, cur.err
		c.mu.Unlock()
		now := c.opts.Now()
		if rf != nil {
			delay := rf.Delay()
			reason, wait, since = rf.Reason, c.untilDeadline(rat, delay), rat.Add(delay)
			c.emit(Event{Kind: EventReconnectScheduled, At: rat, URL: cur.url, Reason: reason, Delay: delay})
			attempt = 0 // a server-assigned delay is not a failure
		} else {
			if !up.IsZero() && now.Sub(up) >= c.opts.StableAfter {
				attempt = 0
			}
			wait, since = c.backoff(attempt), now
			attempt++
			c.emit(Event{Kind: EventDisconnected, URL: cur.url, Delay: wait, Err: ended})
		}

		// Connect, retrying, then take over from cur (if still up).
		for ctx.Err() == nil {
			if c.opts.Sleep(ctx, wait) != nil {
				break
			}
			n++
			url := c.url
			if c.opts.URLFor != nil {
				url = c.opts.URLFor(n)
			}
			next, err := c.connect(ctx, url)
			if err == nil {
				c.emit(Event{Kind: EventConnected, URL: url, Attempt: n, Reason: reason})
				if c.takeOver(ctx, cur, next, Event{Kind: EventResumed, URL: url, Attempt: n, Reason: reason, Since: since}) {
					cur = next
					break
				}
				err = next.endErr()
			}
			if ctx.Err() != nil {
				break
			}
			var rerr *retryError
			switch {
			case errors.As(err, &rerr):
				wait = c.untilDeadline(rerr.at, rerr.frame.Delay())
				c.emit(Event{Kind: EventDialFailed, URL: url, Attempt: n, Reason: rerr.reason, Delay: wait, Err: err})
			default:
				// A refused hello is retried too: the next node may accept.
				wait = c.backoff(attempt)
				attempt++
				c.emit(Event{Kind: EventDialFailed, URL: url, Attempt: n, Delay: wait, Err: unwrapRefused(err)})
			}
		}
	}

	// Closing: close every connection, wait for their read loops, end.
	c.mu.Lock()
	live := slices.Collect(maps.Keys(c.live))
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, cn := range live {
		wg.Go(func() { _ = cn.close() }) // at once: each may wait out a handshake
	}
	wg.Wait()
	c.conns.Wait()
	c.shutdown(net.ErrClosed)
}

// takeOver makes next the current connection, make-before-break: old (the
// previous current connection, possibly ended) keeps delivering while next
// resubscribes every subscription from its cursor; in-flight mutates get
// their acks on old, or are re-sent on next in seq order if old ends
// first, and mutates made while it waits for those acks are held and sent
// after them. old is closed once every subscription is live on next; if next
// ends first, old is left delivering (its writes stopped) and closed by
// the next take-over that succeeds. It reports whether next became
// current; if not, next has ended (or the Client is closing).
// resumed is emitted once the subscriptions are live on next, or with
// Err set once takeOverWait has passed without, before old is closed; not
// if the Client closes first.
func (c *Client) takeOver(ctx context.Context, old, next *conn, resumed Event) bool {
	if c.lockSend(ctx) != nil {
		next.closeNow()
		return false
	}
	// Let old answer what it was sent: a mutate re-sent elsewhere would
	// be applied twice where the two nodes do not share a producer table.
	// Not under the send lock: a patch handler on old's read loop that
	// publishes would wait for the lock while the acks waited for queue
	// up unread behind it, and only takeOverWait would end the wait.
	// Mutates made meanwhile take their seqs in order but are held,
	// neither sent nor waited for (sendMutate): sent on old they would
	// be in flight there again, and re-sent on next too. Below, under
	// the send lock again, they go to next after old's unanswered ones,
	// in seq order, as mutates made while disconnected do; or, if next
	// fails first, to old, which stays current, after what it was sent.
	// Subscribes and drops meanwhile go to old, as before a take-over
	// (one sent there is carried over to next below).
	h := c.holdMutates(old)
	if h != nil {
		c.unlockSend()
		h.wait(ctx, old, next)
		if c.lockSend(ctx) != nil {
			// The Client is closing (ctx is the supervisor's): what
			// is held fails with it.
			next.closeNow()
			return false
		}
	}

	rg := &resumeGroup{done: make(chan struct{})}
	var adds []*Subscription
	var was []addedFrom // adds[i] was at was[i] before, should next fail
	c.mu.Lock()
	if h != nil {
		// Senders waiting for room among the held try again, once they
		// have the send lock: after what is held has gone out below.
		close(h.released)
	}
	c.hold = nil // under the send lock until it is released below
	for _, s := range c.subs {
		if s.abandoned || s.dropping {
			continue
		}
		from := addedFrom{via: s.via, expiredOn: s.expiredOn}
		if err := s.addOnLocked(next, rg); err != nil {
			break // next has ended; its error is found below
		}
		rg.left++
		adds = append(adds, s)
		was = append(was, from)
	}
	if rg.left == 0 {
		close(rg.done)
	}
	ms := slices.SortedFunc(maps.Values(c.mutates), func(a, b *mutation) int { return cmp.Compare(a.seq, b.seq) })
	c.mu.Unlock()
	if c.opts.takeOverForTest != nil {
		c.opts.takeOverForTest(next.done)
	}

	ok := true
	posted := 0
	for _, s := range adds {
		cur := s.Cursor()
		target := s.target
		if cur.QID != "" {
			target.Cursor = &cur
		}
		// Queued, not waited for: each subscribe's ack (or next's end)
		// answers it, and next's writer keeps the order.
		if next.postFrame(&frames.Subscribe{Op: frames.OpAdd, SID: s.sid, Target: target}) != nil {
			ok = false
			break
		}
		posted++
	}
	for _, m := range ms {
		if !ok {
			break
		}
		if next.post(m.msg) != nil {
			ok = false
		}
	}
	c.mu.Lock()
	// A Subscribe that gave up after its add went to next, before it was
	// queued, is dropped there now, after it.
	var giveUps []*Subscription
	for _, s := range adds[:posted] {
		if s.addQueuedLocked(next) {
			giveUps = append(giveUps, s)
		}
	}
	var owed []subWaiter
	if ok && next.err == nil && c.err == nil {
		c.cur, c.last = next, next
		if old != nil && old != next {
			// What old has not written yet must not go out there as
			// well: its mutates were just re-sent on next. (A message
			// old's writer is writing at this moment still goes out;
			// the take-over waited for old's acks first to make that
			// rare.) A drop sent there may be thrown away with it:
			// its Drop is answered below.
			old.stopWrites(errReplaced)
			owed = old.takeDropsLocked()
		}
	} else {
		ok = false
		// The subscriptions stay where they were: a reset on that
		// connection is then not taken for one during a take-over, and
		// a Subscribe still waiting is answered where its add went (old,
		// which stays current), not left for a later take-over while
		// old's answer is passed over.
		for i, s := range adds {
			switch {
			case s.via != next:
			case s.snapOn != nil:
				s.via, s.resume = s.snapOn, nil
			default:
				s.via, s.expiredOn, s.resume = was[i].via, was[i].expiredOn, nil
			}
		}
	}
	var held [][]byte
	cur := c.cur
	if !ok && h != nil && cur != nil {
		// old stays current: what was held goes there, after what old
		// was sent and before any later mutate (the send lock is still
		// held). Held mutates next answered before it ended are done
		// with.
		for _, m := range ms {
			if m.seq >= h.seq && c.mutates[m.key] == m {
				held = append(held, m.msg)
			}
		}
	}
	c.mu.Unlock()
	for _, s := range giveUps {
		s.postDrop(next)
	}
	for _, msg := range held {
		if cur.post(msg) != nil {
			break // old has ended too: they go to the next connection
		}
	}
	c.unlockSend()
	// Not under the send lock: ending a subscription waits for its
	// delivery on old's read loop, whose handler may be publishing.
	replaced := errReplaced
	if c.closed() {
		replaced = net.ErrClosed
	}
	for _, w := range owed {
		w(nil, replaced)
	}
	if !ok {
		next.closeNow()
		return false
	}
	next.setCurrent(c.opts.Now())

	// Make before break: old goes once next carries every subscription.
	t := time.NewTimer(takeOverWait)
	defer t.Stop()
	select {
	case <-rg.done:
	case <-next.done:
		select {
		case <-rg.done:
		default:
			// next ended before it carried every subscription: old,
			// which still does, keeps delivering (it sends nothing more:
			// what it had was re-sent on next, and goes again on the
			// connection after it) until a later take-over closes it.
			// The supervisor reconnects as after any other end.
			return true
		}
	case <-t.C:
		c.mu.Lock()
		if left := rg.left; left > 0 {
			resumed.Err = fmt.Errorf("client: %d subscription(s) not resubscribed within %v: %w", left, takeOverWait, context.DeadlineExceeded)
		}
		c.mu.Unlock()
	case <-ctx.Done():
		// The Client is closing: next did not take over, and the
		// supervisor closes every connection.
		return true
	}
	c.emit(resumed)
	// old, and any connection an earlier failed take-over left
	// delivering.
	c.mu.Lock()
	var olds []*conn
	for cn := range c.live {
		if cn != next {
			olds = append(olds, cn)
		}
	}
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, cn := range olds {
		wg.Go(func() { _ = cn.close() }) // at once: each may wait out a handshake
	}
	wg.Wait()
	return true
}

// addedFrom is where a subscription's latest add went before a take-over
// sent it to the new connection, and whether that one's answer was
// X_CURSOR_EXPIRED.
type addedFrom struct {
	via, expiredOn *conn
}

// takeDropsLocked takes from cn, whose writes a take-over has just
// stopped, the ack waiters of the subscriptions being dropped there: a
// drop still queued was thrown away, and its ack would never come. The
// take-over did not carry those subscriptions over, so calling the
// waiters with an error ends them and answers their Drop, as when a
// connection ends. In their place cn keeps waiters that consume the acks
// of drops written after all. Caller holds c.mu.
func (cn *conn) takeDropsLocked() []subWaiter {
	var owed []subWaiter
	for sid, ws := range cn.pending {
		if s := cn.c.subs[sid]; s == nil || !s.dropping {
			continue
		}
		owed = append(owed, ws...)
		cn.pending[sid] = slices.Repeat([]subWaiter{func(*frames.Ack, error) {}}, len(ws))
	}
	return owed
}

// mutateHold is a take-over's wait for the old connection to answer the
// mutates it was sent; meanwhile new mutates are held (see takeOver).
// Guarded by c.mu.
type mutateHold struct {
	seq      int64         // the first seq held: every one below it was sent on old
	left     int           // of those, how many are unanswered
	answered chan struct{} // closed when left reaches 0
	bytes    int           // of the mutates held; at queueLimit senders wait for released
	released chan struct{} // closed when the take-over stops holding
}

// holdMutates starts holding new mutates while old answers its unanswered
// ones, and returns the hold; nil (no hold) if old has ended or has none.
// Caller holds the send lock.
func (c *Client) holdMutates(old *conn) *mutateHold {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.mutates) == 0 || old == nil || old.err != nil {
		return nil
	}
	// Every mutate recorded has a lower seq, and old, current, was sent
	// all of them (or a take-over re-sent them there).
	c.hold = &mutateHold{seq: c.seq, left: len(c.mutates), answered: make(chan struct{}), released: make(chan struct{})}
	return c.hold
}

// wait waits, bounded by takeOverWait, until old has answered every
// mutate sent before the hold, or old or next ends, or ctx does.
func (h *mutateHold) wait(ctx context.Context, old, next *conn) {
	t := time.NewTimer(takeOverWait)
	defer t.Stop()
	select {
	case <-h.answered:
	case <-old.done:
	case <-next.done:
	case <-t.C:
	case <-ctx.Done():
	}
}

// resumeGroup counts the subscriptions a take-over waits for. Guarded by
// c.mu.
type resumeGroup struct {
	left int
	done chan struct{} // closed when left reaches 0
}

func (rg *resumeGroup) doneLocked() {
	rg.left--
	if rg.left == 0 {
		close(rg.done)
	}
}
