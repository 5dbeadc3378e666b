package gateway_test

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/syncgate/syncgate/auth"
	"github.com/syncgate/syncgate/frames"
	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/internal/gwtest"
)

// TestStreamHTTP_Tokens: with token keys the HTTP stream API wants the
// WebSocket's bearer token, and a stream's name is its topic: reads need
// the subscribe grant, appends the publish grant, creating, closing and
// deleting the manage grant, and a fork the subscribe grant on its source
// too. A missing or refused token is a 401 with WWW-Authenticate (saying
// invalid_token for a refused one), a missing grant a 403; a CORS preflight needs none, a cacheable page is
// cached privately, and a message may not claim another actor.
func TestStreamHTTP_Tokens(t *testing.T) {
	t.Parallel()
	v, err := auth.New(auth.Config{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	s := newStreamServer(t, gateway.Config{Verifier: v})
	token := func(topics auth.TopicClaims, exp time.Time) string {
		return sign(t, jwt.SigningMethodHS256, testSecret, auth.Claims{
			RegisteredClaims: jwt.RegisteredClaims{Subject: "backend", ExpiresAt: jwt.NewNumericDate(exp)}, Topics: topics})
	}
	hour := time.Now().Add(time.Hour)
	chat := []string{"chat:*"}
	var (
		reader   = token(auth.TopicClaims{Subscribe: chat}, hour)
		writer   = token(auth.TopicClaims{Subscribe: chat, Publish: chat}, hour)
		manager  = token(auth.TopicClaims{Subscribe: chat, Publish: chat, Manage: chat}, hour)
		other    = token(auth.TopicClaims{Subscribe: []string{"other:*"}, Publish: []string{"other:*"}, Manage: []string{"other:*"}}, hour)
		anyTopic = token(auth.TopicClaims{Subscribe: []string{"**"}, Manage: []string{"**"}}, hour)
		forker   = token(auth.TopicClaims{Subscribe: []string{"secret:*"}, Manage: chat}, hour)
		expired  = token(auth.TopicClaims{Manage: chat}, time.Now().Add(-time.Hour))
	)
	bearer := func(tok string) []string { return []string{"Authorization", "Bearer " + tok} }
	jsonType := []string{"Content-Type", "application/json"}
	with := func(kv ...[]string) map[string][]string {
		var flat []string
		for _, p := range kv {
			flat = append(flat, p...)
		}
		return hdr(flat...)
	}
	ok := func(r reply) {
		t.Helper()
		if r.status/100 != 2 {
			t.Fatalf("status %d (%q), want 2xx", r.status, r.body)
		}
	}
	const p = "/v1/stream/chat:1"

	for _, h := range [][]string{nil, {"Authorization", "Basic dXNlcjpwdw=="}, {"Authorization", "Bearer "}} {
		s.do(t, "PUT", p, with(jsonType, h), "").want(t, 401).wantHeader(t, "WWW-Authenticate", `Bearer realm="syncgate"`)
	}
	invalid := `Bearer realm="syncgate", error="invalid_token"`
	if r := s.do(t, "PUT", p, with(jsonType, bearer(expired)), "").want(t, 401).wantHeader(t, "WWW-Authenticate", invalid); !strings.Contains(r.body, "expired") {
		t.Fatalf("expired token: body %q does not say so", r.body)
	}
	s.do(t, "PUT", p, with(jsonType, bearer("not.a.jwt")), "").want(t, 401).wantHeader(t, "WWW-Authenticate", invalid)
	s.do(t, "PUT", p, with(jsonType, bearer(reader)), "").want(t, 403)
	s.do(t, "PUT", p, with(jsonType, bearer(writer)), "").want(t, 403) // creating is managing
	s.do(t, "PUT", p, with(jsonType, bearer(other)), "").want(t, 403)
	s.do(t, "PUT", p, with(jsonType, bearer(manager)), "").want(t, 201)

	s.do(t, "POST", p, with(jsonType, bearer(reader)), `{"n":1}`).want(t, 403)
	s.do(t, "POST", p, with(jsonType, bearer(other)), `{"n":1}`).want(t, 403)
	ok(s.do(t, "POST", p, with(jsonType, bearer(writer)), `{"n":1}`))
	// A record read as a WebSocket publish's may not speak for another
	// actor; the token's own sub, null or none is fine.
	for _, body := range []string{`{"data":"x","actorId":"alice","at":1}`, `[{"n":2},{"data":"x","actorId":"alice"}]`} {
		s.do(t, "POST", p, with(jsonType, bearer(writer)), body).want(t, 403)
	}
	for _, body := range []string{`{"data":"y","actorId":"backend","at":1}`, `{"data":"z","actorId":null}`} {
		ok(s.do(t, "POST", p, with(jsonType, bearer(writer)), body))
	}
	s.do(t, "PUT", "/v1/stream/chat:3", with(jsonType, bearer(manager)), `{"data":"x","actorId":"alice"}`).want(t, 403)

	s.do(t, "GET", p+"?offset=-1", with(bearer(other)), "").want(t, 403)
	s.do(t, "GET", p+"?offset=-1", nil, "").want(t, 401)
	s.do(t, "GET", p+"?offset=-1", with(bearer(reader)), "").want(t, 200).
		wantBody(t, `[{"n":1},{"data":"y","actorId":"backend","at":1},{"data":"z","actorId":null}]`)
	s.do(t, "HEAD", p, with(bearer(reader)), "").want(t, 200)
	// RFC 7235 allows more than one space after the scheme.
	s.do(t, "HEAD", p, hdr("Authorization", "bearer   "+reader), "").want(t, 200)
	s.do(t, "OPTIONS", p, nil, "").want(t, 204)

	// A fork reads its source: the subscribe grant on it is needed too.
	s.do(t, "PUT", "/v1/stream/secret:1", with(jsonType, bearer(anyTopic)), "").want(t, 201)
	fork := []string{"Stream-Forked-From", "/v1/stream/secret:1"}
	s.do(t, "PUT", "/v1/stream/chat:2", with(jsonType, fork, bearer(manager)), "").want(t, 403)
	s.do(t, "PUT", "/v1/stream/chat:2", with(jsonType, fork, bearer(forker)), "").want(t, 201)

	// A page cut short by the chunk limit may be cached, but privately.
	big := `"` + strings.Repeat("x", 700<<10) + `"`
	for range 2 {
		ok(s.do(t, "POST", "/v1/stream/chat:2", with(jsonType, bearer(writer)), big))
	}
	s.do(t, "GET", "/v1/stream/chat:2?offset="+zeroOffset, with(bearer(reader)), "").want(t, 200).
		wantHeader(t, "Cache-Control", "private, max-age=60, stale-while-revalidate=300")

	// Closing and deleting are managing.
	closing := []string{"Stream-Closed", "true"}
	s.do(t, "POST", "/v1/stream/chat:2", with(jsonType, closing, bearer(writer)), `{"n":3}`).want(t, 403)
	ok(s.do(t, "POST", "/v1/stream/chat:2", with(jsonType, closing, bearer(manager)), `{"n":3}`))
	s.do(t, "DELETE", p, with(bearer(writer)), "").want(t, 403)
	ok(s.do(t, "DELETE", p, with(bearer(manager)), ""))
}

// TestStreamHTTP_ActorCheckIsForJSONStreams: only a JSON stream's
// messages are read by WebSocket subscribers as publishes, so only there
// may an object with a data member not name another actor. The bytes of a
// stream of another type (text, NDJSON) are its own business, whatever
// they look like.
func TestStreamHTTP_ActorCheckIsForJSONStreams(t *testing.T) {
	t.Parallel()
	v, err := auth.New(auth.Config{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	s := newStreamServer(t, gateway.Config{Verifier: v})
	all := []string{"logs:*"}
	tok := sign(t, jwt.SigningMethodHS256, testSecret, auth.Claims{
		RegisteredClaims: jwt.RegisteredClaims{Subject: "backend", ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))},
		Topics:           auth.TopicClaims{Subscribe: all, Publish: all, Manage: all}})
	auditLine := `{"data":{"op":"login"},"actorId":"alice"}`
	for _, ct := range []string{"text/plain", "application/x-ndjson", "application/octet-stream"} {
		p := "/v1/stream/logs:" + strings.ReplaceAll(ct, "/", "-")
		h := hdr("Content-Type", ct, "Authorization", "Bearer "+tok)
		s.do(t, "PUT", p, h, auditLine).want(t, 201)
		s.do(t, "POST", p, h, auditLine).want(t, 204)
		s.do(t, "GET", p, h, "").want(t, 200).wantBody(t, auditLine+auditLine)
	}
	// A JSON stream's still may not.
	h := hdr("Content-Type", "application/json", "Authorization", "Bearer "+tok)
	s.do(t, "PUT", "/v1/stream/logs:json", h, "").want(t, 201)
	s.do(t, "POST", "/v1/stream/logs:json", h, auditLine).want(t, 403)
}

// TestStreamHTTP_LiveReadEndsAtTokenExp: a long-poll or SSE read made with
// a token ends by the token's exp, well before its own bound (a minute
// here), so a token cannot keep a live read open once it has expired; a
// token already past its exp (accepted within the verifier's leeway) gets
// catch-up reads but no live one.
func TestStreamHTTP_LiveReadEndsAtTokenExp(t *testing.T) {
	t.Parallel()
	v, err := auth.New(auth.Config{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	s := newStreamServer(t, gateway.Config{Verifier: v, LongPollTimeout: time.Minute})
	token := func(exp time.Time) string {
		return sign(t, jwt.SigningMethodHS256, testSecret, auth.Claims{
			RegisteredClaims: jwt.RegisteredClaims{Subject: "reader", ExpiresAt: jwt.NewNumericDate(exp)},
			Topics:           auth.TopicClaims{Subscribe: []string{"news"}, Manage: []string{"news"}}})
	}
	const p = "/v1/stream/news"
	s.do(t, "PUT", p, hdr("Content-Type", "text/plain", "Authorization", "Bearer "+token(time.Now().Add(time.Hour))), "hi").want(t, 201)

	// exp is in whole seconds: this one comes two to three seconds from now.
	exp := jwt.NewNumericDate(time.Now().Add(3 * time.Second)).Time
	soon := hdr("Authorization", "Bearer "+token(exp))
	type ended struct {
		r   reply
		err error
		at  time.Time
	}
	modes := []string{"long-poll", "sse"}
	done := make(chan ended, len(modes))
	for _, mode := range modes {
		offset := "-1"
		if mode == "long-poll" {
			offset = "now"
		}
		go func() {
			r, err := s.try("GET", p+"?offset="+offset+"&live="+mode, soon, "")
			done <- ended{r, err, time.Now()}
		}()
	}
	for range modes {
		select {
		case e := <-done:
			if e.err != nil {
				t.Fatal(e.err)
			}
			if e.at.Before(exp.Add(-100 * time.Millisecond)) {
				t.Errorf("a live read ended at %v, before the token's exp %v: status %d, body %q", e.at, exp, e.r.status, e.r.body)
			}
			switch ct := e.r.header.Get("Content-Type"); {
			case e.r.status == 204:
			case e.r.status == 200 && ct == "text/event-stream" && strings.Contains(e.r.body, "event: data"):
			default:
				t.Errorf("live read: status %d, Content-Type %q, body %q; want a 204 long-poll or an SSE stream that sent the data", e.r.status, ct, e.r.body)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a live read with a token expiring within three seconds was still open after 30 s")
		}
	}

	// Past exp, within the leeway (10 s by default): catch-up only.
	late := hdr("Authorization", "Bearer "+token(time.Now().Add(-3*time.Second)))
	s.do(t, "GET", p+"?offset=-1", late, "").want(t, 200).wantBody(t, "hi")
	for _, mode := range modes {
		r := s.do(t, "GET", p+"?offset=-1&live="+mode, late, "").want(t, 401)
		if got := r.header.Get("WWW-Authenticate"); !strings.Contains(got, `error="invalid_token"`) {
			t.Errorf("live=%s with an expired token: WWW-Authenticate %q, want error=\"invalid_token\"", mode, got)
		}
	}
}

// TestStreamHTTP_WriteRateBySub: with token keys, the HTTP writes of one
// token sub share a bucket of FrameRate, FrameBurst deep; a write over it
// gets 429 with Retry-After, appends nothing and is counted, while another
// sub and reads go on. Without token keys nothing is limited. The
// server's clock stands still here, so no token comes back mid-test.
func TestStreamHTTP_WriteRateBySub(t *testing.T) {
	t.Parallel()
	v, err := auth.New(auth.Config{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	s := newStreamServer(t, gateway.Config{Verifier: v, FrameRate: 0.5, FrameBurst: 3})
	token := func(sub string) []string {
		return []string{"Authorization", "Bearer " + sign(t, jwt.SigningMethodHS256, testSecret, auth.Claims{
			RegisteredClaims: jwt.RegisteredClaims{Subject: sub, ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))},
			Topics:           auth.TopicClaims{Subscribe: []string{"**"}, Publish: []string{"**"}, Manage: []string{"**"}}})}
	}
	text := []string{"Content-Type", "text/plain"}
	alice, bob := token("alice"), token("bob")
	with := func(kv ...[]string) map[string][]string {
		var flat []string
		for _, p := range kv {
			flat = append(flat, p...)
		}
		return hdr(flat...)
	}
	s.do(t, "PUT", "/v1/stream/a", with(text, alice), "").want(t, 201)
	s.do(t, "POST", "/v1/stream/a", with(text, alice), "1").want(t, 204)
	s.do(t, "POST", "/v1/stream/a", with(text, alice), "2").want(t, 204)
	r := s.do(t, "POST", "/v1/stream/a", with(text, alice), "3").want(t, 429)
	if ra := r.header.Get("Retry-After"); ra != "2" {
		t.Errorf("Retry-After %q, want 2 (one token at 0.5 a second)", ra)
	}
	if !strings.Contains(r.body, "too many writes") {
		t.Errorf("429 body %q does not say why", r.body)
	}
	s.do(t, "DELETE", "/v1/stream/a", with(alice), "").want(t, 429)
	// Reads and another sub are not held back.
	s.do(t, "GET", "/v1/stream/a?offset=-1", with(alice), "").want(t, 200).wantBody(t, "12")
	s.do(t, "POST", "/v1/stream/a", with(text, bob), "4").want(t, 204)
	if got := metricValue(t, scrape(t, s.base), "syncgate_http_writes_rate_limited_total"); got != 2 {
		t.Errorf("syncgate_http_writes_rate_limited_total = %v, want 2", got)
	}

	anon := newStreamServer(t, gateway.Config{FrameRate: 0.5, FrameBurst: 1})
	anon.do(t, "PUT", "/v1/stream/a", with(text), "").want(t, 201)
	for _, body := range []string{"1", "2", "3"} {
		anon.do(t, "POST", "/v1/stream/a", with(text), body).want(t, 204)
	}
}

// TestStreamHTTP_LiveReadsShareTheNodeCap: a live read takes a place
// under the node's session cap: with the one place held by a session, a
// long-poll gets 503 with a Retry-After of the node-full range (1-10 s)
// and a catch-up read still passes; once the session ends the long-poll
// is served, and its place is given back when it ends.
func TestStreamHTTP_LiveReadsShareTheNodeCap(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{MaxSessions: 1, LongPollTimeout: 100 * time.Millisecond})
	const p = "/v1/stream/live"
	s.do(t, "PUT", p, hdr("Content-Type", "text/plain"), "a").want(t, 201)

	ws := gwtest.Dial(t, gwtest.WSURL(s.base), nil)
	if h, ack := helloWith(ws, ""); h == nil {
		t.Fatalf("hello refused: %+v", ack)
	}
	r := s.do(t, "GET", p+"?offset=now&live=long-poll", nil, "").want(t, 503)
	if secs, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || secs < 1 || secs > 10 {
		t.Errorf("Retry-After = %q, want 1-10 s", r.header.Get("Retry-After"))
	}
	s.do(t, "GET", p+"?offset=-1", nil, "").want(t, 200).wantBody(t, "a")
	if got := metricValue(t, scrape(t, s.base), `syncgate_http_live_reads_refused_total{reason="max_sessions"}`); got != 1 {
		t.Errorf("live reads refused for max_sessions = %v, want 1", got)
	}
	ws.Close()
	gwtest.Eventually(t, gwtest.Timeout, "the session's place freed for a long-poll", func() bool {
		r, err := s.try("GET", p+"?offset=now&live=long-poll", nil, "")
		return err == nil && r.status == 204
	})
	gwtest.Eventually(t, gwtest.Timeout, "no live read counted once the long-polls ended", func() bool {
		return metricValue(t, scrape(t, s.base), "syncgate_http_live_reads") == 0
	})
	gwtest.Eventually(t, gwtest.Timeout, "the long-poll's place freed for a session", func() bool {
		ws := gwtest.Dial(t, gwtest.WSURL(s.base), nil)
		defer ws.Close()
		ws.Send(&frames.Hello{Resume: []frames.Cursor{}})
		f, err := ws.NextErr(gwtest.Timeout)
		_, ok := f.(*frames.Hello)
		return err == nil && ok
	})
}

// TestStreamHTTP_LiveReadsShareTheActorCap: a live read counts against
// its token's sub's session cap, as a WebSocket session does: over it a
// long-poll gets 429 with Retry-After, a catch-up read still passes, and
// once the session ends the long-poll is served.
func TestStreamHTTP_LiveReadsShareTheActorCap(t *testing.T) {
	t.Parallel()
	v, err := auth.New(auth.Config{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	s := newStreamServer(t, gateway.Config{Verifier: v, MaxSessionsPerActor: 1, LongPollTimeout: 100 * time.Millisecond})
	tok := sign(t, jwt.SigningMethodHS256, testSecret, auth.Claims{
		RegisteredClaims: jwt.RegisteredClaims{Subject: "u", ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))},
		Topics:           auth.TopicClaims{Subscribe: []string{"**"}, Manage: []string{"**"}}})
	bearer := hdr("Authorization", "Bearer "+tok)
	const p = "/v1/stream/live"
	s.do(t, "PUT", p, hdr("Authorization", "Bearer "+tok, "Content-Type", "text/plain"), "a").want(t, 201)

	ws := gwtest.Dial(t, gwtest.WSURL(s.base), nil)
	if h, ack := helloWith(ws, tok); h == nil {
		t.Fatalf("hello refused: %+v", ack)
	}
	s.do(t, "GET", p+"?offset=now&live=long-poll", bearer, "").want(t, 429).wantHeader(t, "Retry-After", "1")
	s.do(t, "GET", p+"?offset=-1", bearer, "").want(t, 200).wantBody(t, "a")
	if got := metricValue(t, scrape(t, s.base), `syncgate_http_live_reads_refused_total{reason="per_actor"}`); got != 1 {
		t.Errorf("live reads refused for per_actor = %v, want 1", got)
	}
	ws.Close()
	gwtest.Eventually(t, gwtest.Timeout, "the session's slot freed for a long-poll", func() bool {
		r, err := s.try("GET", p+"?offset=now&live=long-poll", bearer, "")
		return err == nil && r.status == 204
	})
}

// countingVerifier counts the tokens it checks; wait, when set, is
// called before each check (and may block it).
type countingVerifier struct {
	v    gateway.TokenVerifier
	n    atomic.Int64
	wait func()
}

func (c *countingVerifier) Verify(token string) (*auth.Identity, error) {
	c.n.Add(1)
	if c.wait != nil {
		c.wait()
	}
	return c.v.Verify(token)
}

// clientFrom returns a client of s whose connections come from ip, or
// skips the test if the host cannot bind it.
func (s *streamServer) clientFrom(t *testing.T, ip string) *streamServer {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	tr := &http.Transport{DialContext: d.DialContext}
	t.Cleanup(tr.CloseIdleConnections)
	c, err := d.Dial("tcp", strings.TrimPrefix(s.base, "http://"))
	if err != nil {
		t.Skipf("no loopback address %s: %v", ip, err)
	}
	c.Close()
	other := *s
	other.client = &http.Client{Transport: tr}
	return &other
}

// TestStreamHTTP_BadTokenBudget: the refused tokens of one client address
// share a bucket (BadTokenRate, BadTokenBurst): past it the address's
// requests with a token get 429 with Retry-After and their token is not
// checked, a good one included, while a request without a token still
// gets its 401 and another address is not held back. Good tokens take
// nothing from the bucket, and it refills. The server's clock stands
// still until the test moves it. Negative BadTokenRate turns it off.
func TestStreamHTTP_BadTokenBudget(t *testing.T) {
	t.Parallel()
	v, err := auth.New(auth.Config{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	cv := &countingVerifier{v: v}
	s := newStreamServer(t, gateway.Config{Verifier: cv, BadTokenRate: 1, BadTokenBurst: 3})
	good := hdr("Authorization", "Bearer "+sign(t, jwt.SigningMethodHS256, testSecret, auth.Claims{
		RegisteredClaims: jwt.RegisteredClaims{Subject: "u", ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))},
		Topics:           auth.TopicClaims{Subscribe: []string{"**"}, Manage: []string{"**"}}}))
	forged := hdr("Authorization", "Bearer "+sign(t, jwt.SigningMethodHS256, []byte("not the server's secret, but 32 bytes or more"), auth.Claims{
		RegisteredClaims: jwt.RegisteredClaims{Subject: "u", ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))}}))
	const p = "/v1/stream/s"
	checks := func(want int64) {
		t.Helper()
		if got := cv.n.Load(); got != want {
			t.Fatalf("the verifier checked %d tokens, want %d", got, want)
		}
	}

	s.do(t, "PUT", p, good, "").want(t, 201)
	for range 5 {
		s.do(t, "GET", p, good, "").want(t, 200) // good tokens take nothing
	}
	for range 3 {
		s.do(t, "GET", p, forged, "").want(t, 401).wantHeader(t, "WWW-Authenticate", `Bearer realm="syncgate", error="invalid_token"`)
	}
	checks(9)
	r := s.do(t, "GET", p, forged, "").want(t, 429).wantHeader(t, "Retry-After", "1").wantHeader(t, "WWW-Authenticate", "")
	if !strings.Contains(r.body, "too many refused tokens") {
		t.Errorf("429 body %q does not say why", r.body)
	}
	// Unchecked, the good token cannot be told from a forged one (only
	// the built-in *auth.Verifier's remembered tokens pass; this one is
	// wrapped).
	s.do(t, "GET", p, good, "").want(t, 429).wantHeader(t, "Retry-After", "1")
	s.do(t, "POST", p, good, "x").want(t, 429)
	checks(9)
	// A request without a token costs no check: it gets its 401.
	s.do(t, "GET", p, nil, "").want(t, 401).wantHeader(t, "WWW-Authenticate", `Bearer realm="syncgate"`)

	other := s.clientFrom(t, "127.0.0.2")
	other.do(t, "GET", p, forged, "").want(t, 401)
	other.do(t, "GET", p, good, "").want(t, 200)
	checks(11)
	if got := metricValue(t, scrape(t, s.base), "syncgate_http_tokens_rate_limited_total"); got != 3 {
		t.Errorf("syncgate_http_tokens_rate_limited_total = %v, want 3", got)
	}

	// A second on, 127.0.0.1 has one token back: a good token takes none
	// of it, a forged one takes it.
	s.clock.Advance(time.Second)
	s.do(t, "GET", p, good, "").want(t, 200)
	s.do(t, "GET", p, forged, "").want(t, 401)
	s.do(t, "GET", p, forged, "").want(t, 429)
	checks(13)

	off := newStreamServer(t, gateway.Config{Verifier: v, BadTokenRate: -1})
	for range 10 {
		off.do(t, "GET", p, forged, "").want(t, 401)
	}
}

// TestStreamHTTP_VerifiedTokensPassASpentBudget: a token the node has
// verified is served from its cache while its address has spent the
// bad-token budget (behind a proxy, every client's address), until its
// exp; a token never verified is refused unchecked.
func TestStreamHTTP_VerifiedTokensPassASpentBudget(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Now()}
	v, err := auth.New(auth.Config{Secret: testSecret, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	// A bucket of two that does not refill within the test.
	s := newStreamServer(t, gateway.Config{Verifier: v, Now: clock.Now, BadTokenRate: 0.001, BadTokenBurst: 2})
	token := func(secret []byte, sub string, ttl time.Duration) http.Header {
		return hdr("Authorization", "Bearer "+sign(t, jwt.SigningMethodHS256, secret, auth.Claims{
			RegisteredClaims: jwt.RegisteredClaims{Subject: sub, ExpiresAt: jwt.NewNumericDate(clock.Now().Add(ttl))},
			Topics:           auth.TopicClaims{Subscribe: []string{"**"}, Publish: []string{"**"}, Manage: []string{"**"}}}))
	}
	seen, fresh := token(testSecret, "seen", time.Minute), token(testSecret, "fresh", time.Hour)
	forged := token([]byte("not the server's secret, but 32 bytes or more"), "seen", time.Hour)
	const p = "/v1/stream/s"
	text := func(h http.Header) http.Header {
		h = h.Clone()
		h.Set("Content-Type", "text/plain")
		return h
	}
	s.do(t, "PUT", p, text(seen), "").want(t, 201)
	s.do(t, "GET", p, forged, "").want(t, 401)
	s.do(t, "GET", p, forged, "").want(t, 401)
	s.do(t, "GET", p, forged, "").want(t, 429)
	s.do(t, "GET", p, seen, "").want(t, 200)
	s.do(t, "POST", p, text(seen), "x").want(t, 204)
	s.do(t, "GET", p, fresh, "").want(t, 429)
	// At its exp the cache no longer answers for it: Verify would, with
	// its leeway, but the budget is spent.
	clock.Advance(time.Minute)
	s.do(t, "GET", p, seen, "").want(t, 429)
}

// TestStreamHTTP_TokenCacheKeepsTheVerifiersTime: a remembered token
// stops being served at its exp by the verifier's clock, the one Verify
// judges it by, not the gateway's (which the stream test server freezes).
func TestStreamHTTP_TokenCacheKeepsTheVerifiersTime(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Now()}
	v, err := auth.New(auth.Config{Secret: testSecret, Now: clock.Now, Leeway: -1})
	if err != nil {
		t.Fatal(err)
	}
	s := newStreamServer(t, gateway.Config{Verifier: v})
	bearer := hdr("Authorization", "Bearer "+sign(t, jwt.SigningMethodHS256, testSecret, auth.Claims{
		RegisteredClaims: jwt.RegisteredClaims{Subject: "u", ExpiresAt: jwt.NewNumericDate(clock.Now().Add(time.Minute))},
		Topics:           auth.TopicClaims{Subscribe: []string{"**"}, Manage: []string{"**"}}}))
	const p = "/v1/stream/s"
	h := bearer.Clone()
	h.Set("Content-Type", "text/plain")
	s.do(t, "PUT", p, h, "").want(t, 201)
	s.do(t, "GET", p, bearer, "").want(t, 200)
	clock.Advance(time.Hour)
	s.do(t, "GET", p, bearer, "").want(t, 401)
}

// revokingVerifier is a custom TokenVerifier built on the built-in one:
// it refuses the revoked token after the built-in check passed it (which
// the built-in one then remembers).
type revokingVerifier struct {
	*auth.Verifier
	revoked string
}

func (r *revokingVerifier) Verify(token string) (*auth.Identity, error) {
	id, err := r.Verifier.Verify(token)
	if err == nil && token == r.revoked {
		return nil, fmt.Errorf("%w: revoked", auth.ErrBadClaims)
	}
	return id, err
}

// TestStreamHTTP_CustomVerifierIsAlwaysAsked: a custom TokenVerifier that
// embeds the built-in one inherits its memory of verified tokens, but the
// stream API does not take that memory for the custom one's word: a token
// it revokes is refused every time.
func TestStreamHTTP_CustomVerifierIsAlwaysAsked(t *testing.T) {
	t.Parallel()
	v, err := auth.New(auth.Config{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	tok := sign(t, jwt.SigningMethodHS256, testSecret, auth.Claims{
		RegisteredClaims: jwt.RegisteredClaims{Subject: "u", ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))},
		Topics:           auth.TopicClaims{Subscribe: []string{"**"}, Manage: []string{"**"}}})
	s := newStreamServer(t, gateway.Config{Verifier: &revokingVerifier{Verifier: v, revoked: tok}})
	h := hdr("Authorization", "Bearer "+tok, "Content-Type", "text/plain")
	s.do(t, "PUT", "/v1/stream/s", h, "").want(t, 401)
	s.do(t, "PUT", "/v1/stream/s", h, "").want(t, 401)
}

// TestStreamHTTP_BadTokenChecksUnderWay: a token check under way holds
// its address's token until it ends, so requests sent at once cannot
// start more checks than the bucket could pay for: with a burst of two
// and two checks held inside the verifier, a third request is refused
// unchecked; once the two are refused, the bucket is spent.
func TestStreamHTTP_BadTokenChecksUnderWay(t *testing.T) {
	t.Parallel()
	v, err := auth.New(auth.Config{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}, 16), make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free)
	cv := &countingVerifier{v: v, wait: func() { entered <- struct{}{}; <-release }}
	s := newStreamServer(t, gateway.Config{Verifier: cv, BadTokenRate: 1, BadTokenBurst: 2})
	forged := hdr("Authorization", "Bearer not.a.jwt")
	const p = "/v1/stream/s"
	get := func() <-chan reply {
		c := make(chan reply, 1)
		go func() {
			r, err := s.try("GET", p, forged, "")
			if err != nil {
				t.Error(err)
			}
			c <- r
		}()
		return c
	}

	held := []<-chan reply{get(), get()}
	for range held {
		select {
		case <-entered:
		case <-time.After(gwtest.Timeout):
			t.Fatal("two requests did not reach the verifier")
		}
	}
	third := get()
	select {
	case r := <-third:
		if r.status != 429 {
			t.Errorf("a third request while two checks are under way: %d, want 429", r.status)
		}
	case <-entered:
		t.Error("a third check started while two were under way")
		free()
		<-third
	}
	free()
	for _, c := range held {
		if r := <-c; r.status != 401 {
			t.Errorf("a held check ended with %d, want 401", r.status)
		}
	}
	s.do(t, "GET", p, forged, "").want(t, 429)
	if got := cv.n.Load(); got != 2 {
		t.Fatalf("the verifier checked %d tokens, want 2", got)
	}
}

// TestStreamHTTP_ProducerIDOfAnotherActor: a WebSocket client's producer
// in a persisted topic's log is "<length of sub>:<sub>:<clientId>", so
// that another actor who learns the clientId can neither fence the client
// nor take up its seqs (docs/security.md §3). Over HTTP a Producer-Id is
// the client's to choose: one of that form naming another sub is refused
// (403), else a token that may publish to the topic could fence the
// client with a higher epoch, or jump its seqs so that its next publishes
// are acked as retries and never written.
func TestStreamHTTP_ProducerIDOfAnotherActor(t *testing.T) {
	t.Parallel()
	v, err := auth.New(auth.Config{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	s := newStreamServer(t, gateway.Config{Verifier: v, Persist: []string{"chat:*"}})
	token := func(sub string) string {
		return sign(t, jwt.SigningMethodHS256, testSecret, auth.Claims{
			RegisteredClaims: jwt.RegisteredClaims{Subject: sub, ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))},
			Topics:           auth.TopicClaims{Subscribe: []string{"chat:*"}, Publish: []string{"chat:*"}}})
	}
	alice := gwtest.Dial(t, "ws"+strings.TrimPrefix(s.base, "http")+"/v1/ws", nil)
	alice.Send(&frames.Hello{Resume: []frames.Cursor{}, Token: token("alice"), ClientID: "phone"})
	gwtest.Expect[*frames.Hello](alice)
	if ack := alice.Publish("m0", 0, "chat:1", `"first"`); ack.Error != nil {
		t.Fatalf("publish: %+v", ack.Error)
	}

	producer := func(id, epoch, seq string) http.Header {
		return hdr("Authorization", "Bearer "+token("mallory"), "Content-Type", "application/json",
			"Producer-Id", id, "Producer-Epoch", epoch, "Producer-Seq", seq)
	}
	// Seqs 1 and 2 in alice's place used to be 200, and alice's own
	// seqs 1 and 2 then acked but not written; epoch 1 fenced her.
	for _, p := range [][2]string{{"0", "1"}, {"0", "2"}, {"1", "0"}} {
		s.do(t, "POST", "/v1/stream/chat:1", producer("5:alice:phone", p[0], p[1]), `{"n":1}`).want(t, 403)
	}
	// Its own, and any other name, are fine.
	s.do(t, "POST", "/v1/stream/chat:1", producer("7:mallory:laptop", "0", "0"), `{"n":3}`).want(t, 200)
	s.do(t, "POST", "/v1/stream/chat:1", producer("ingest-1", "0", "0"), `{"n":4}`).want(t, 200)

	for seq := int64(1); seq <= 2; seq++ {
		if ack := alice.Publish(fmt.Sprintf("m%d", seq), seq, "chat:1", `"more"`); ack.Error != nil {
			t.Fatalf("publish seq %d after mallory's appends: %+v", seq, ack.Error)
		}
	}
	r := s.do(t, "GET", "/v1/stream/chat:1?offset=-1", hdr("Authorization", "Bearer "+token("alice")), "").want(t, 200)
	if n := strings.Count(r.body, `"more"`); n != 2 {
		t.Fatalf("alice's later publishes: %d in the log, want 2: %s", n, r.body)
	}
}

// TestStreamHTTP_ProducerIDIsPerSub: with token keys, a Producer-Id of
// any other form names a producer within the token's sub, so two subs
// that send the same one are two producers: neither fences the other with
// a higher epoch, nor takes up its seqs so that its appends are answered
// as retries and never written. Within its own sub the id is the same
// producer as "<length of sub>:<sub>:<id>".
func TestStreamHTTP_ProducerIDIsPerSub(t *testing.T) {
	t.Parallel()
	v, err := auth.New(auth.Config{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	s := newStreamServer(t, gateway.Config{Verifier: v})
	token := func(sub string) string {
		return sign(t, jwt.SigningMethodHS256, testSecret, auth.Claims{
			RegisteredClaims: jwt.RegisteredClaims{Subject: sub, ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))},
			Topics:           auth.TopicClaims{Subscribe: []string{"*"}, Publish: []string{"*"}, Manage: []string{"*"}}})
	}
	post := func(sub, pid, epoch, seq, body string) reply {
		return s.do(t, "POST", "/v1/stream/jobs", hdr("Authorization", "Bearer "+token(sub), "Content-Type", "application/json",
			"Producer-Id", pid, "Producer-Epoch", epoch, "Producer-Seq", seq), body)
	}
	s.do(t, "PUT", "/v1/stream/jobs", hdr("Authorization", "Bearer "+token("alice"), "Content-Type", "application/json"), "").want(t, 201)
	post("alice", "ingest", "0", "0", `"a0"`).want(t, 200)
	post("mallory", "ingest", "1", "0", `"m0"`).want(t, 200) // her own: alice's epoch 0 stands
	post("mallory", "ingest", "1", "1", `"m1"`).want(t, 200) // and her seq 1 is not alice's
	post("alice", "ingest", "0", "1", `"a1"`).want(t, 200)
	post("alice", "5:alice:ingest", "0", "2", `"a2"`).want(t, 200)
	post("alice", "ingest", "0", "2", `"a2"`).want(t, 204) // the same producer: a retry
	r := s.do(t, "GET", "/v1/stream/jobs?offset=-1", hdr("Authorization", "Bearer "+token("alice")), "").want(t, 200)
	if r.body != `["a0","m0","m1","a1","a2"]` {
		t.Fatalf("log = %s", r.body)
	}
}

// TestStreamHTTP_IdentityWithoutExpiry: a custom TokenVerifier may return
// an identity with no Expires, which a WebSocket session takes as never
// expiring; a live read takes it the same way, rather than as a token
// past its exp (401).
func TestStreamHTTP_IdentityWithoutExpiry(t *testing.T) {
	t.Parallel()
	v := opaqueVerifier{}
	s := newStreamServer(t, gateway.Config{Verifier: v, LongPollTimeout: 50 * time.Millisecond})
	h := hdr("Authorization", "Bearer opaque", "Content-Type", "text/plain")
	s.do(t, "PUT", "/v1/stream/s", h, "").want(t, 201)
	s.do(t, "GET", "/v1/stream/s?offset=now&live=long-poll", h, "").want(t, 204)
}

// opaqueVerifier takes any token for an identity that may do everything
// and never expires (an opaque-token service's, say).
type opaqueVerifier struct{}

func (opaqueVerifier) Verify(string) (*auth.Identity, error) {
	return &auth.Identity{ActorID: "svc", Grants: auth.AllowAll()}, nil
}
