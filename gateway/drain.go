package gateway

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/syncgate/syncgate/frames"
)

// maxDrainOverlap bounds how long a drained session is kept open past its
// afterMs. The client opens its new connection at afterMs; the old one
// stays up a moment longer so the new one is established before the old
// goes (make-before-break). The overlap is min(maxDrainOverlap,
// DrainGrace/2), so it always fits in the grace.
const maxDrainOverlap = time.Second

// maxDrainWindow bounds Config.DrainSpread and DrainGrace: no session is
// told to wait longer than frames.MaxAfterMs.
const maxDrainWindow = frames.MaxAfterMs * time.Millisecond

// drainPlan gives n sessions n delays over spread, in whole milliseconds
// (the unit of afterMs): delay i lies in slot i, [i·spread/n, (i+1)·spread/n)
// rounded to milliseconds, uniformly jittered within it by rnd. So every
// slot holds exactly one session, and any stretch of the spread holds its
// share of the sessions to within one slot at each end. The delays never
// fall with i, and they are distinct while slots are at least 1 ms wide
// (n ≤ spread in ms). A spread ≤ 0 gives every session delay 0.
func drainPlan(n int, spread time.Duration, rnd *rand.Rand) []time.Duration {
	plan := make([]time.Duration, n)
	ms := spread.Milliseconds()
	if ms <= 0 {
		return plan
	}
	for i := range plan {
		lo := ms * int64(i) / int64(n)
		hi := ms * int64(i+1) / int64(n)
		d := lo
		if hi > lo {
			d += rnd.Int64N(hi - lo)
		}
		plan[i] = time.Duration(d) * time.Millisecond
	}
	return plan
}

// drainRun is one drain. Its fields are static except as noted.
type drainRun struct {
	// start is when the drain began, on the real clock, not Config.Now:
	// the drain waits on real timers (its slots, its deadline), so the
	// time it counts against them must be real too. An injected clock that
	// stands still (or runs at its own pace) would otherwise count every
	// slot from the start again after the one before.
	start   time.Time
	n       int           // sessions connected when it began
	idle    chan struct{} // closed when no session is left
	isIdle  bool          // guarded by Server.mu
	overlap time.Duration
}

// idleLocked closes d.idle once; the caller holds Server.mu.
func (d *drainRun) idleLocked() {
	if !d.isIdle {
		d.isIdle = true
		close(d.idle)
	}
}

// Drain puts the node in lame-duck mode and moves its sessions away over
// Config.DrainSpread (docs/architecture.md, Stampede control):
//
//   - /readyz answers 503 at once, so the load balancer stops routing here;
//   - new clients are refused: a WebSocket client gets a reconnect frame
//     {afterMs: under a second, jittered, reason "drain"} and close 1012;
//   - every connected session is sent, at once, a reconnect frame
//     {afterMs: its own slot of the spread (drainPlan), reason "drain"};
//   - each session is served until its afterMs has passed (plus a short
//     overlap, see maxDrainOverlap), then closed with 1012 after its queue
//     is flushed.
//
// Drain returns nil once every session is closed. It returns ctx's error
// when ctx ends first, and an error wrapping context.DeadlineExceeded
// DrainSpread+DrainGrace after the drain began; then it cuts the sessions
// still open (without a close handshake) and returns once they have
// stopped. Calling Drain again (or concurrently, or after an admin drain)
// joins the drain under way. Drain does not stop the server: call
// [Server.Shutdown] after it, then the http.Server's Shutdown.
func (s *Server) Drain(ctx context.Context) error {
	d := s.startDrain()
	limit := s.cfg.DrainGrace
	if s.cfg.DrainSpread > 0 {
		limit += s.cfg.DrainSpread
	}
	t := time.NewTimer(limit - time.Since(d.start))
	defer t.Stop()
	var err error
	select {
	case <-d.idle:
		return nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-t.C:
		err = context.DeadlineExceeded
	}
	s.mu.Lock()
	open := make([]*session, 0, len(s.sessions))
	for sess := range s.sessions {
		open = append(open, sess)
	}
	s.mu.Unlock()
	for _, sess := range open {
		sess.cut()
	}
	<-d.idle
	if len(open) == 0 {
		return nil // they all closed just in time
	}
	return fmt.Errorf("gateway: drain cut %d sessions: %w", len(open), err)
}

// DrainRequested is closed when an admin drain (POST /v1/admin/drain) was
// requested. The drain has then already begun; the program should stop as
// on SIGTERM: call Drain (which joins it), then Shutdown.
func (s *Server) DrainRequested() <-chan struct{} { return s.drainReq }

// startDrain begins the drain, or returns the one under way.
func (s *Server) startDrain() *drainRun {
	s.mu.Lock()
	if d := s.drain; d != nil {
		s.mu.Unlock()
		return d
	}
	d := &drainRun{start: time.Now(), idle: make(chan struct{}), n: len(s.sessions)}
	if s.cfg.DrainSpread > 0 {
		d.overlap = min(maxDrainOverlap, s.cfg.DrainGrace/2)
	}
	s.drain = d
	s.draining.Store(true) // under mu: no session registers after this
	sessions := make([]*session, 0, len(s.sessions))
	for sess := range s.sessions {
		sessions = append(sessions, sess)
	}
	// After Shutdown began there is no plan: it is closing the sessions
	// already. The drain is idle once they are gone (unregister), not
	// before.
	run := len(sessions) > 0 && !s.closed.Load()
	switch {
	case run:
		s.wg.Add(1) // under mu: Shutdown's Wait cannot have begun
	case len(sessions) == 0:
		d.idleLocked()
	}
	s.mu.Unlock()
	s.metrics.draining.Set(1)
	spread := "none (all at once)"
	if s.cfg.DrainSpread > 0 {
		spread = s.cfg.DrainSpread.String()
	}
	s.log.Info("drain started", "sessions", len(sessions), "spread", spread, "grace", s.cfg.DrainGrace.String())
	if !run {
		return d
	}
	s.randMu.Lock()
	plan := drainPlan(len(sessions), s.cfg.DrainSpread, s.rnd)
	s.randMu.Unlock()
	// Map order already shuffles which session gets which slot.
	after := make([]int64, len(plan))
	for i, sess := range sessions {
		after[i] = plan[i].Milliseconds()
		sess.send(&frames.Reconnect{AfterMs: after[i], Reason: frames.ReasonDrain})
	}
	go func() {
		defer s.wg.Done()
		s.runDrain(d, sessions, after)
	}()
	return d
}

// runDrain closes each session at its afterMs plus the overlap, in slot
// order, until all are closed or Shutdown begins.
func (s *Server) runDrain(d *drainRun, sessions []*session, after []int64) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for i, sess := range sessions {
		at := time.Duration(after[i])*time.Millisecond + d.overlap
		if wait := at - time.Since(d.start); wait > 0 {
			t.Reset(wait)
			select {
			case <-t.C:
			case <-d.idle:
				return
			case <-s.stopSweep:
				return
			}
		}
		sess.closeWith(reasonDrain)
	}
}
