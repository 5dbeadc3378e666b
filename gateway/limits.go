package gateway

import (
	"net"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/syncgate/syncgate/frames"
)

// Per-session frame rate. Every frame a client sends (hello included: a
// hello may cost a signature check) takes a token from the session's
// bucket (golang.org/x/time/rate, FrameRate per second, FrameBurst deep).
// A frame over the rate is dropped and answered with X_RATE_LIMITED; the
// session goes on. A session that stays over the rate for RateLimitClose
// (every frame refused, no second without a refusal) is abusive and is
// closed with 1008.

// allowFrame takes a token for one frame at now. Owned by the reader.
func (s *session) allowFrame(now time.Time) bool {
	if s.lim == nil || s.lim.AllowN(now, 1) {
		return true
	}
	ns := now.UnixNano()
	if ns-s.limitedLast > int64(time.Second) {
		s.limitedSince = ns // a new run of refusals
	}
	s.limitedLast = ns
	return false
}

// rateLimited answers a dropped frame, and closes the session when it has
// been over its rate for RateLimitClose.
func (s *session) rateLimited(ref string) {
	s.sendError(frames.NewError(frames.CodeRateLimited, ref, "over this session's limit of "+formatRate(s.srv.cfg.FrameRate)+" frames per second; the frame was dropped", ""))
	if d := s.srv.cfg.RateLimitClose; d > 0 && time.Duration(s.limitedLast-s.limitedSince) >= d {
		s.closeWith(reasonRateLimited)
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

// clientIP is the address part of r.RemoteAddr: behind a proxy that
// terminates TCP it is the proxy's (docs/security.md).
func clientIP(remoteAddr string) string {
	if h, _, err := net.SplitHostPort(remoteAddr); err == nil {
		return h
	}
	return remoteAddr
}

func formatRate(r float64) string { return strconv.FormatFloat(r, 'g', -1, 64) }
