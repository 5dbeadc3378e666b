package gateway

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Refusal reasons label syncgate_sessions_rejected_total.
const (
	rejectRate        = "rate_limit"   // over AcceptRate/AcceptBurst
	rejectMaxSessions = "max_sessions" // MaxSessions connected
	rejectDraining    = "draining"     // a drain is under way (Server.Drain)
	rejectShutdown    = "shutdown"     // after Shutdown: plain 503, no upgrade
	rejectHandshake   = "handshake"    // the WebSocket handshake failed
	rejectOrigin      = "origin"       // a foreign Origin: 403 before the upgrade (auth.OriginPolicy)
	rejectPerIP       = "per_ip"       // MaxSessionsPerIP sessions from the client's address
	rejectPerActor    = "per_actor"    // MaxSessionsPerActor sessions of the hello's actor (counted after the upgrade)
)

var rejectReasons = []string{rejectRate, rejectMaxSessions, rejectDraining, rejectShutdown, rejectHandshake,
	rejectOrigin, rejectPerIP, rejectPerActor}

// Bounds of the afterMs told to refused clients.
const (
	// maxRefusalDelay caps the delay a rate refusal can be given; past it
	// refusals are spread uniformly over (0, maxRefusalDelay].
	maxRefusalDelay = time.Minute
	// fullDelayMin and fullDelayMax bound the delay of a max-sessions
	// refusal: nobody knows when sessions leave, so the refused are spread
	// wide and mostly come back to a node with room (or, behind a load
	// balancer, to another node).
	fullDelayMin = time.Second
	fullDelayMax = 10 * time.Second
	// drainRefusalMax bounds the delay of a client refused by a draining
	// node: the load balancer has stopped (or is about to stop) routing
	// here, so its next attempt should go elsewhere soon.
	drainRefusalMax = time.Second
)

// acceptBudget decides, at the very start of the upgrade path, whether a new
// session may be admitted: a token bucket for the rate and a counter for
// the session cap. Its methods are safe for concurrent use.
//
// A refused client is told when to come back. Rate refusals are given
// consecutive slots of one token's time (1/rate) after the point up to
// which earlier refusals were already scheduled (the horizon), jittered
// within the slot: the refused come back at the bucket's own rate, one per
// token, instead of all together, and none of them comes back before its
// token exists.
type acceptBudget struct {
	lim *rate.Limiter // nil: no rate limit
	max int64         // < 0: no cap

	active atomic.Int64 // sessions admitted and live reads held, not yet released

	mu      sync.Mutex
	rnd     *rand.Rand // guarded by mu
	horizon time.Time  // guarded by mu: the end of the last rate-refusal slot handed out
	last    time.Time  // guarded by mu: the latest time given to lim

	hookForTest func(now time.Time, ok bool, after time.Duration) // set before use; called under mu
}

// newAcceptBudget returns a budget of r sessions per second (burst b; r <= 0:
// unlimited) and at most maxSessions sessions (< 0: no cap). The budget
// owns rnd.
func newAcceptBudget(r float64, b, maxSessions int, rnd *rand.Rand) *acceptBudget {
	a := &acceptBudget{max: int64(maxSessions), rnd: rnd}
	if r > 0 {
		a.lim = rate.NewLimiter(rate.Limit(r), b)
	}
	return a
}

// admit reserves a session at time now. On success the caller must call
// release once the session (or the failed attempt) is over. On refusal it
// returns the reason and how long the client should wait.
func (a *acceptBudget) admit(now time.Time) (ok bool, reason string, after time.Duration) {
	if !a.hold() {
		return false, rejectMaxSessions, a.jitter(fullDelayMin, fullDelayMax)
	}
	if a.lim == nil {
		return true, "", 0
	}
	a.mu.Lock()
	// The limiter must see time move forward: given an earlier time than
	// the last, it refills from that earlier time again, and a crowd of
	// goroutines that read the clock before queueing here would leak
	// tokens. So the order of this lock is the order of time.
	now = maxTime(now, a.last)
	a.last = now
	ok = a.lim.AllowN(now, 1)
	if !ok {
		after = a.rateDelayLocked(now)
	}
	if a.hookForTest != nil {
		a.hookForTest(now, ok, after)
	}
	a.mu.Unlock()
	if ok {
		return true, "", 0
	}
	a.active.Add(-1)
	return false, rejectRate, after
}

// full reports whether admit at now would refuse, and then why and for
// how long, without taking a token or a place: for requests that will not
// become sessions (a plain GET of the WebSocket endpoint).
func (a *acceptBudget) full(now time.Time) (reason string, after time.Duration, full bool) {
	if a.max >= 0 && a.active.Load() >= a.max {
		return rejectMaxSessions, a.jitter(fullDelayMin, fullDelayMax), true
	}
	if a.lim == nil {
		return "", 0, false
	}
	a.mu.Lock()
	now = maxTime(now, a.last)
	tokens := a.lim.TokensAt(now)
	a.mu.Unlock()
	if tokens >= 1 {
		return "", 0, false
	}
	secs := (1 - tokens) / float64(a.lim.Limit())
	return rejectRate, time.Duration(min(secs*float64(time.Second), float64(maxRefusalDelay))), true
}

// hold takes a place under the session cap, without the rate: for a
// live stream read, which holds a connection open as a session does but
// is not a new client arriving (a long-poll comes back every few
// seconds). The caller must call release when it ends.
func (a *acceptBudget) hold() bool {
	if n := a.active.Add(1); a.max >= 0 && n > a.max {
		a.active.Add(-1)
		return false
	}
	return true
}

// release gives back a place taken by admit or hold.
func (a *acceptBudget) release() { a.active.Add(-1) }

// rateDelayLocked hands a rate refusal at now the next free slot. The
// caller holds mu, so a refusal and its slot are one decision.
func (a *acceptBudget) rateDelayLocked(now time.Time) time.Duration {
	// In float first: at a rate under about 1e-10 a second the slot does
	// not fit a Duration, and such a slot is past maxRefusalDelay anyway.
	slot := maxRefusalDelay
	if secs := float64(time.Second) / float64(a.lim.Limit()); secs < float64(maxRefusalDelay) {
		slot = max(time.Duration(secs), time.Microsecond)
	}
	if a.horizon.Before(now) {
		a.horizon = now
	}
	start := a.horizon.Sub(now) + slot // a token is made during the first slot: come back after it
	if start+slot > maxRefusalDelay {
		return time.Duration(1 + a.rnd.Int64N(int64(maxRefusalDelay)))
	}
	a.horizon = a.horizon.Add(slot)
	return start + time.Duration(a.rnd.Int64N(int64(slot)))
}

func maxTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return b
	}
	return a
}

// jitter returns a delay uniform in [lo, hi).
func (a *acceptBudget) jitter(lo, hi time.Duration) time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	return lo + time.Duration(a.rnd.Int64N(int64(hi-lo)))
}
