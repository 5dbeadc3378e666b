package gateway

import (
	"errors"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/syncgate/syncgate/frames"
)

// Per-session frame rate. Every frame a client sends (hello included: a
// hello may cost a signature check) takes a token from the session's
// bucket (golang.org/x/time/rate, FrameRate per second, FrameBurst deep).
// A frame over the rate is dropped before it is decoded. The first refused
// frame of a run is answered with X_RATE_LIMITED, then at most one answer
// per rateLimitAnswerEvery, whose cause counts the frames dropped since the
// last: answering every dropped frame of a flood would cost the node the
// CPU the limit is there to save (bench topics -flooders). The session goes
// on. A session that stays over the rate for RateLimitClose (no second
// without a refused frame, though most of its frames may be served: one a
// little over its rate for that long counts) is abusive and is closed
// with 1008.
//
// Dropping a frame still costs reading it, and a client can send frames far
// faster than it is allowed to, so a flood is also read more slowly: the
// reader takes in refused frames at no more than FrameRate/floodReadShare
// per second (a second bucket, FrameBurst/floodReadShare deep) and, once
// that is spent, pauses before its next read until it has a token again.
// The flood waits in TCP buffers and the client's writes block; the work a
// session costs the node is bounded by its rate, not by how fast it can
// send. A client within its rate never pauses. Which of a flood's frames are dropped and which are
// served later is not defined: the session is served FrameRate frames per
// second on average, FrameBurst at once.

// rateLimitAnswerEvery bounds how often a flooding session is answered.
const rateLimitAnswerEvery = 100 * time.Millisecond

// floodReadShare sets how many refused frames a flooding session's reader
// still takes in: FrameRate/floodReadShare per second, which at the
// default rate still allows an X_RATE_LIMITED answer every
// rateLimitAnswerEvery.
const floodReadShare = 10

// maxReadPause bounds one pause of a flooding session's reader and the debt
// of refused frames it may owe, so that a message packed with refused
// frames cannot stall it for longer. It is well under the second without a
// refusal that ends a run: a client that keeps it up is paused again and
// again, its run goes on, and RateLimitClose closes it.
const maxReadPause = 500 * time.Millisecond

// floodState is what a session that was once over its rate keeps: made by
// the reader at the first refused frame, so a session that never floods
// carries one nil pointer.
type floodState struct {
	lim  *rate.Limiter // refused frames the reader still takes in at once
	wake chan struct{} // closed by closeWith: a paused reader returns
}

// allowFrame takes a token for one frame at now. Owned by the reader.
func (s *session) allowFrame(now time.Time) bool {
	if s.lim == nil || s.lim.AllowN(now, 1) {
		return true
	}
	ns := now.UnixNano()
	if ns-s.limitedLast > int64(time.Second) || s.flood.Load() == nil {
		s.limitedSince = ns // a new run of refusals
		// Its first frame is answered, and only it: frames refused at the
		// same clock reading (a coarse clock, a message of many frames)
		// are its others, not firsts of runs of their own.
		s.limitedSent = ns - int64(rateLimitAnswerEvery)
	}
	s.limitedLast = ns
	return false
}

// rateLimited handles a dropped frame: it answers the first of a run and
// then one per rateLimitAnswerEvery (decoding only the frames it answers,
// for their ref), and closes the session when it has been over its rate
// for RateLimitClose.
// It returns how long the reader should pause before its next read.
func (s *session) rateLimited(line []byte, now time.Time) time.Duration {
	s.srv.metrics.framesRateLimited.Inc()
	s.dropped = true
	s.limitedDrops++
	if s.limitedLast-s.limitedSent >= int64(rateLimitAnswerEvery) {
		// The frame's own ref, which a client matches answers by: also
		// that of a malformed frame when it could be read, as its
		// X_BAD_* answer would carry.
		ref := ""
		var ferr *frames.Error
		if f, err := frames.Decode(line); err == nil {
			ref = refOf(f)
		} else if errors.As(err, &ferr) {
			ref = ferr.Ref
		}
		cause := "over this session's limit of " + formatRate(s.srv.cfg.FrameRate) + " frames per second; this frame was dropped"
		if s.limitedDrops > 1 {
			cause += ", and " + strconv.Itoa(s.limitedDrops-1) + " more since the last X_RATE_LIMITED"
		}
		s.sendError(frames.NewError(frames.CodeRateLimited, ref, cause, ""))
		s.limitedSent, s.limitedDrops = s.limitedLast, 0
	}
	if d := s.srv.cfg.RateLimitClose; d > 0 && time.Duration(s.limitedLast-s.limitedSince) >= d {
		s.closeWith(reasonRateLimited)
		return 0
	}
	f := s.flood.Load()
	if f == nil {
		f = &floodState{lim: rate.NewLimiter(s.lim.Limit()/floodReadShare, max(1, s.lim.Burst()/floodReadShare)), wake: make(chan struct{})}
		s.flood.Store(f)
	}
	r := f.lim.ReserveN(now, 1)
	d := r.DelayFrom(now)
	if d > maxReadPause {
		r.CancelAt(now) // the debt stays within one pause
		d = maxReadPause
	}
	return d
}

// pauseReading waits d before the reader's next read, or until the session
// closes.
func (s *session) pauseReading(d time.Duration) {
	f := s.flood.Load()
	if s.closing.Load() { // closeWith stores closing before it loads flood
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-f.wake:
	}
}

func newFrameLimiter(cfg *Config) *rate.Limiter {
	if cfg.FrameRate <= 0 {
		return nil
	}
	return rate.NewLimiter(rate.Limit(cfg.FrameRate), cfg.FrameBurst)
}

// counter counts sessions per key (a client IP, an actor) against a cap.
// Its methods are safe for concurrent use.
type counter struct {
	max int // <= 0: no cap, and nothing is counted

	mu sync.Mutex
	n  map[string]int // guarded by mu: keys with at least one session
}

func newCounter(max int) *counter { return &counter{max: max, n: map[string]int{}} }

// acquire counts one more session for key unless key has max already.
func (c *counter) acquire(key string) bool {
	if c.max <= 0 {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[key] >= c.max {
		return false
	}
	c.n[key]++
	return true
}

// release forgets one session of key (acquired before).
func (c *counter) release(key string) {
	if c.max <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[key] <= 1 {
		delete(c.n, key)
		return
	}
	c.n[key]--
}

// clientIP is the client address of r.RemoteAddr as the per-address
// limits count it (MaxSessionsPerIP, the bad-token budget): behind a
// proxy that terminates TCP it is the proxy's (docs/security.md). An
// IPv4 address is itself (also when written IPv4-mapped); an IPv6 address
// counts by its /64, since a host usually has a whole /64 and could use a
// new address per connection, except where a translator writes IPv4
// clients as IPv6 addresses (NAT64, SIIT): in the well-known /96 prefixes
// the client is the IPv4 address in the low 32 bits, and in the local-use
// 64:ff9b:1::/48 (whose embedding the operator chooses) the whole address.
// Anything else (a Unix socket's peer) is its own key.
func clientIP(remoteAddr string) string {
	h, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		h = remoteAddr
	}
	a, err := netip.ParseAddr(h)
	switch {
	case err != nil, a.Is4():
		return h
	case a.Is4In6():
		return a.Unmap().String()
	case nat64WellKnown.Contains(a), siitTranslated.Contains(a):
		b := a.As16()
		return netip.AddrFrom4([4]byte(b[12:])).String()
	case nat64Local.Contains(a):
		return a.WithZone("").String()
	}
	p, _ := a.Prefix(64) // cannot fail for 64 bits of an IPv6 address; drops a zone
	return p.String()
}

// Prefixes under which translators write IPv4 clients as IPv6 addresses.
var (
	nat64WellKnown = netip.MustParsePrefix("64:ff9b::/96")    // RFC 6052
	nat64Local     = netip.MustParsePrefix("64:ff9b:1::/48")  // RFC 8215
	siitTranslated = netip.MustParsePrefix("::ffff:0:0:0/96") // RFC 2765's IPv4-translated form
)

func formatRate(r float64) string { return strconv.FormatFloat(r, 'g', -1, 64) }

// The frame rate's counterpart for the HTTP stream API: with token keys,
// the writes (PUT, POST, DELETE under /v1/stream/) of one token sub share
// a token bucket of Config.FrameRate per second, FrameBurst deep, across
// all its requests and connections (Server.httpWriters, a keyedLimiters
// without a bound). A write over it gets 429 with Retry-After (the
// Durable Streams protocol's answer to a rate limit) and does nothing.
// Reads are not limited: a live read costs a wait, not a write. Without
// token keys (the anonymous dev mode) there is no sub to key on, and no
// limit. A sub's bucket is kept while it is in use; sweep (once a
// minute) drops the full ones, so the table holds the subs that wrote
// within a burst's refill time plus a minute. Subs come from verified
// tokens, so a client cannot mint new keys.

// maxRetryAfter bounds the wait a refused request is told of.
const maxRetryAfter = 24 * time.Hour

// keyedSweepEvery bounds how often a full bounded table is swept on
// demand.
const keyedSweepEvery = time.Second

// keyedLimiters is a table of token buckets by key (limit per second,
// burst deep): the HTTP writer limits by token sub, the bad-token budget
// by client address (badtoken.go). Its methods are safe for concurrent
// use.
//
// A token is taken at once (allow), or held while the work it pays for is
// under way and then spent or given back (reserve, settle): a key may
// take or hold one only while its bucket has more tokens than it has
// held, so work started at once never outruns the bucket.
//
// The table holds the keys with a token held or a bucket not yet
// refilled (a full bucket is the same as none): an entry goes when its
// last held token is settled with its bucket full, or at a sweep once it
// has refilled. With a bound (max > 0) it holds at most max keys; when
// full it is swept (at most once per keyedSweepEvery), and the keys that
// still find no room share one more bucket, overflow, so more keys than
// that gain one key's budget, not one each.
//
// Times reach the buckets under mu and never go backwards: concurrent
// callers read the clock before they queue for mu, so a time earlier
// than the latest given is taken as that one, since rate.Limiter given
// an earlier time refills from it again (as in acceptBudget.admit). A
// clock stepped back (only a test's, or a wall clock without a monotonic
// reading) stops the refill until it passes the time it was at.
type keyedLimiters struct {
	limit rate.Limit // static
	burst int        // static
	max   int        // static: the table's bound; 0 for none

	mu       sync.Mutex
	keys     map[string]*keyedLimiter // guarded by mu
	overflow keyedLimiter             // guarded by mu: shared by the keys that find the table full
	last     time.Time                // guarded by mu: the latest time given
	swept    time.Time                // guarded by mu: when the table was last swept
}

// keyedLimiter is one key's bucket, or the overflow's.
type keyedLimiter struct {
	lim  *rate.Limiter // nil until a token is spent: a full bucket
	held int           // tokens reserved and not yet settled: the entry stays while there are any
}

// newKeyedLimiters returns a table of buckets of r per second, burst
// deep, holding at most max keys (0: no bound), or nil when r <= 0 (the
// limit is off).
func newKeyedLimiters(r float64, burst, max int) *keyedLimiters {
	if r <= 0 {
		return nil
	}
	return &keyedLimiters{limit: rate.Limit(r), burst: burst, max: max, keys: map[string]*keyedLimiter{}}
}

// allow takes a token from key's bucket at now. When there is none it
// reports how long until there is (at most maxRetryAfter).
func (k *keyedLimiters) allow(key string, now time.Time) (ok bool, retry time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	now = k.advanceLocked(now)
	e, retry := k.reserveLocked(key, now)
	if e == nil {
		return false, retry
	}
	k.settleLocked(key, e, true, now)
	return true, 0
}

// reserve holds a token of key's bucket at now for settle, returning the
// bucket; or, when the key has none to spare, nil and how long until it
// has (at most maxRetryAfter).
func (k *keyedLimiters) reserve(key string, now time.Time) (*keyedLimiter, time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.reserveLocked(key, k.advanceLocked(now))
}

// settle ends a hold that reserve made for key on e, at now: spend takes
// the token from e's bucket, otherwise it is free again.
func (k *keyedLimiters) settle(key string, e *keyedLimiter, spend bool, now time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.settleLocked(key, e, spend, k.advanceLocked(now))
}

func (k *keyedLimiters) reserveLocked(key string, now time.Time) (*keyedLimiter, time.Duration) {
	e := k.keys[key]
	if e == nil {
		if k.max > 0 && len(k.keys) >= k.max && now.Sub(k.swept) >= keyedSweepEvery {
			k.sweepLocked(now)
		}
		if k.max <= 0 || len(k.keys) < k.max {
			e = &keyedLimiter{}
			k.keys[key] = e
		} else {
			e = &k.overflow
		}
	}
	free := float64(k.burst)
	if e.lim != nil {
		free = e.lim.TokensAt(now)
	}
	free -= float64(e.held)
	if free < 1 {
		// In float seconds, capped: a rate of a token a century would
		// overflow a Duration.
		secs := min((1-free)/float64(k.limit), maxRetryAfter.Seconds())
		return nil, time.Duration(secs * float64(time.Second))
	}
	e.held++
	return e, 0
}

func (k *keyedLimiters) settleLocked(key string, e *keyedLimiter, spend bool, now time.Time) {
	e.held--
	if spend {
		if e.lim == nil {
			e.lim = rate.NewLimiter(k.limit, k.burst)
		}
		e.lim.AllowN(now, 1) // cannot fail: reserve saw a token for each one held
	}
	if e != &k.overflow && k.idleLocked(e, now) {
		delete(k.keys, key)
	}
}

// sweep forgets the keys whose bucket has refilled, with no token held
// (a new bucket would be the same), and returns how many.
func (k *keyedLimiters) sweep(now time.Time) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.sweepLocked(k.advanceLocked(now))
}

func (k *keyedLimiters) sweepLocked(now time.Time) int {
	k.swept = now
	n := 0
	for key, e := range k.keys {
		if k.idleLocked(e, now) {
			delete(k.keys, key)
			n++
		}
	}
	return n
}

// idleLocked reports whether e is as good as a new bucket at now.
func (k *keyedLimiters) idleLocked(e *keyedLimiter, now time.Time) bool {
	return e.held == 0 && (e.lim == nil || e.lim.TokensAt(now) >= float64(k.burst))
}

// advanceLocked returns now, or the latest time given if now is earlier.
func (k *keyedLimiters) advanceLocked(now time.Time) time.Time {
	k.last = maxTime(now, k.last)
	return k.last
}
