package gateway

import (
	"errors"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/syncgate/syncgate/auth"
	"github.com/syncgate/syncgate/frames"
)

// TokenVerifier checks the token a client sends in hello. *auth.Verifier
// satisfies it. Verify's error must wrap one of the auth.Err… sentinels
// (they pick the error code the client gets) and must not contain the
// token. With a nil error it returns an identity with a non-empty
// ActorID; a hello it answers otherwise is refused (X_TOKEN_REJECTED) and
// logged as the verifier's error, a stream API request with 401. An identity with a zero Expires never
// expires: its sessions get no expiry notice, and its live HTTP reads run
// their full length.
type TokenVerifier interface {
	Verify(token string) (*auth.Identity, error)
}

var _ TokenVerifier = (*auth.Verifier)(nil)

// authState is what a session may do: set by hello, replaced by a
// refreshing hello, read by every subscribe, publish and presence frame.
// Immutable; sessions swap pointers.
type authState struct {
	actorID *string // nil for an anonymous session
	grants  auth.Grants
	expires time.Time // zero: never (anonymous)
	expired bool      // exp has passed: the session is in its grace period
}

// anonymous is the state of every session of a gateway without a
// verifier (dev mode): no actor, every grant.
var anonymous = &authState{grants: auth.AllowAll()}

// tokenCode maps a verification error to the code the client gets
// (docs/security.md, Refusals).
func tokenCode(err error) frames.Code {
	switch {
	case errors.Is(err, auth.ErrExpired):
		return frames.CodeTokenExpired
	case errors.Is(err, auth.ErrNotYetValid):
		return frames.CodeTokenNotYetValid
	case errors.Is(err, auth.ErrTooLarge), errors.Is(err, auth.ErrMalformed),
		errors.Is(err, auth.ErrMissingExp), errors.Is(err, auth.ErrBadClaims):
		return frames.CodeBadToken
	}
	// ErrBadAlgorithm, ErrUnknownKey, ErrBadSignature, ErrAudience,
	// ErrIssuer, and anything a custom verifier returns.
	return frames.CodeTokenRejected
}

// authenticate verifies a hello's token. On failure it sends the error ack
// and closes the session with 1008 (reasonAuth), and returns nil: a client
// whose token is refused fetches another and opens a new connection, as
// Centrifugo and Phoenix clients do on a refused connect. The token is
// never logged.
func (s *session) authenticate(token string) *authState {
	v := s.srv.cfg.Verifier
	if token == "" {
		s.refuseAuth(frames.NewError(frames.CodeTokenRequired, "", "hello.token: this server requires a token", ""))
		return nil
	}
	id, err := v.Verify(token)
	if err != nil {
		// auth's errors never contain the token: safe to log and to send.
		s.log().Info("token refused", "err", err)
		fix := "" // the code's own
		if errors.Is(err, auth.ErrExpired) {
			// Not the in-session notice's advice: a refused hello closes
			// the connection, so there is no grace to refresh in.
			fix = "fetch a fresh token and open a new connection with it: this one is closed with 1008"
		}
		s.refuseAuth(frames.NewError(tokenCode(err), "", "hello.token: "+err.Error(), fix))
		return nil
	}
	if id == nil || id.ActorID == "" {
		// A custom verifier's bug. Served, a nil identity would panic
		// the process, and an empty actor would be counted in the
		// per-actor cap under a key that is never released.
		s.log().Error("token verifier accepted a token without naming its actor: refused", "nil_identity", id == nil)
		s.refuseAuth(frames.NewError(frames.CodeTokenRejected, "", "hello.token: the server's token verifier named no actor for this token", ""))
		return nil
	}
	actor := id.ActorID
	return &authState{actorID: &actor, grants: id.Grants, expires: id.Expires}
}

// refuseAuth answers a hello with e and closes the session with 1008 once
// the answer is written.
func (s *session) refuseAuth(e *frames.Error) {
	s.sendError(e)
	s.closeWith(reasonAuth)
}

// refreshToken handles a hello on a session that already has a token: a
// refresh. The new token must verify and name the same sub; its grants and
// exp replace the old ones, and the server answers with its hello again
// (same sessionId). A refused refresh closes the session like a refused
// first hello.
func (s *session) refreshToken(f *frames.Hello) {
	old := s.auth.Load()
	st := s.authenticate(f.Token)
	if st == nil {
		return
	}
	if *st.actorID != *old.actorID {
		s.refuseAuth(frames.NewError(frames.CodeTokenRejected, "", "hello.token: a refreshing token must name the session's sub",
			"refresh with a token for the same actor; open a new connection to change actor"))
		return
	}
	// As on a first hello, the answer is queued before the new token's
	// timer is armed: a token past its exp (within the leeway) has the
	// X_TOKEN_EXPIRED notice sent at once, and queued before the hello it
	// would read as the refresh's refusal. The old token's timer is
	// stopped first, so that its notice cannot follow the answer either.
	s.stopTokenClock()
	s.srv.metrics.tokenRefreshes.Inc()
	h := s.serverHello(st.actorID)
	// Read and queued under buildMu, as answerHello does: a SetBuildID in
	// between would queue its update-available before a hello announcing
	// the build it replaced.
	s.srv.buildMu.RLock()
	h.BuildID = s.srv.buildID
	s.send(h)
	s.srv.buildMu.RUnlock()
	s.setAuth(st)
}

// tokenClock is a session's expiry timer. At the token's exp the session
// is told X_TOKEN_EXPIRED and its grants stop working (subscribe, publish
// and presence frames get X_TOKEN_EXPIRED); what it already subscribed to
// keeps flowing for Config.TokenGrace, so a refresh loses nothing. A
// refresh within the grace restores it; otherwise it is closed with 1008
// and receives nothing more.
type tokenClock struct {
	mu    sync.Mutex
	timer *time.Timer // guarded by mu
	gen   uint64      // guarded by mu: bumped by every setAuth and by stop; stale timers compare it
}

// setAuth installs st and (re)arms the expiry timer.
func (s *session) setAuth(st *authState) {
	if st.expires.IsZero() {
		s.auth.Store(st)
		return
	}
	c := &s.tokens
	c.mu.Lock()
	defer c.mu.Unlock()
	// Under mu, with the generation bumped: the timer of the token st
	// replaces, firing now, marks the state it loads as expired, and
	// must find its own (or stale generation), never st.
	s.auth.Store(st)
	c.gen++
	gen := c.gen
	if c.timer != nil {
		c.timer.Stop()
	}
	c.timer = time.AfterFunc(st.expires.Sub(s.srv.cfg.Now()), func() { s.tokenExpired(gen) })
}

// tokenExpired runs at the token's exp: it tells the client and starts the
// grace period.
func (s *session) tokenExpired(gen uint64) {
	notice := frames.NewError(frames.CodeTokenExpired, "", "the session's token expired; the session is closed with 1008 after a grace period of "+s.srv.cfg.TokenGrace.String(),
		"fetch a fresh token and send a new hello with it (same sub) on this connection before the grace period ends")
	c := &s.tokens
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen != gen {
		return // refreshed or ended meanwhile
	}
	st := *s.auth.Load()
	st.expired = true
	s.auth.Store(&st)
	c.timer = time.AfterFunc(s.srv.cfg.TokenGrace, func() { s.graceOver(gen) })
	// Queued under mu: a refresh stops the clock (under mu) before it
	// queues its hello, so the notice of the token it replaces is queued
	// before that hello or not at all. Queued after mu was released, it
	// could follow the refresh's hello and read as the new token's expiry.
	s.sendError(notice)
}

// graceOver closes the session at the end of its token's grace, unless
// a refresh came first. The close is made under mu, as tokenExpired's
// notice is queued: a refresh answered with its hello is never followed
// by the close of the token it replaced.
func (s *session) graceOver(gen uint64) {
	c := &s.tokens
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen == gen {
		s.closeWith(reasonTokenExpired)
	}
}

// stopTokenClock stops the expiry timer: for good when the session ended,
// else until the next setAuth (a refresh).
func (s *session) stopTokenClock() {
	c := &s.tokens
	c.mu.Lock()
	c.gen++
	if c.timer != nil {
		c.timer.Stop()
	}
	c.mu.Unlock()
}

// actorID is the session's actor, nil for an anonymous one (or before
// hello).
func (s *session) actorID() *string {
	if st := s.auth.Load(); st != nil {
		return st.actorID
	}
	return nil
}

// forbidden returns the error that refuses action on topic, or nil when
// the session's grants allow it. ref is the ack ref of the frame.
func (s *session) forbidden(action auth.Action, ref, topic string) *frames.Error {
	st := s.auth.Load()
	switch {
	case st == nil:
		return frames.NewError(frames.CodeHelloRequired, ref, "no hello on this connection yet", "")
	case st.expired:
		fix := "send a new hello with a fresh token (same sub), then resend this frame"
		if action == auth.Publish {
			// A mutate's outcome is recorded under its seq, this one too.
			fix = "send a new hello with a fresh token (same sub), then send the mutation again as a new mutate (the next seq and a new key): this outcome is recorded, so the same seq or key gets it again"
		}
		return frames.NewError(frames.CodeTokenExpired, ref, "the session's token expired: its grants no longer apply", fix)
	case !st.grants.Allow(action, topic):
		return frames.NewError(frames.CodeForbidden, ref, "the token does not grant "+action.String()+" on topic "+quote(topic), "")
	}
	return nil
}

// allowed reports whether the session may do action on topic; when it may
// not, it sends the refusal (X_FORBIDDEN, or X_TOKEN_EXPIRED in the grace
// period) as the ack of ref. Call it from frame handlers before any effect.
func (s *session) allowed(action auth.Action, ref, topic string) bool {
	if e := s.forbidden(action, ref, topic); e != nil {
		s.sendError(e)
		return false
	}
	return true
}

// loopbackOnly wraps h for an anonymous gateway: it refuses requests whose
// Host header is not a loopback name or address. "Same host" origin checks
// trust Host, which a DNS-rebinding page controls (evil.example resolving
// to 127.0.0.1 sends Host: evil.example): without tokens, the Host check
// is what keeps such a page off a developer's gateway.
func loopbackOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !loopbackHost(r.Host) {
			// Closed after the answer: net/http would otherwise first
			// read what is left of a body, which may never come. (It
			// still reads it after the answer: boundBody bounds that.)
			w.Header().Set("Connection", "close")
			http.Error(w, "this gateway runs without tokens (dev mode) and answers only requests for localhost; configure token keys, or run it with -insecure", http.StatusMisdirectedRequest)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// loopbackHost reports whether a Host header names the local machine:
// localhost, *.localhost (RFC 6761 §6.3), or a loopback IP. An empty Host
// (HTTP/1.0, in-process handlers) passes: browsers, the rebinding
// attacker's tool, always send one.
func loopbackHost(hostport string) bool {
	if hostport == "" {
		return true
	}
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
