package gateway_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/golang-jwt/jwt/v5"

	"github.com/syncgate/syncgate/auth"
	"github.com/syncgate/syncgate/client"
	"github.com/syncgate/syncgate/frames"
	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/internal/gwtest"
)

var testSecret = []byte("0123456789abcdef0123456789abcdef-gateway-test")

var testRSA = sync.OnceValue(func() *rsa.PrivateKey {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	return k
})

func rsaPEM(t testing.TB) []byte {
	der, err := x509.MarshalPKIXPublicKey(&testRSA().PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

// syncBuffer is a log sink safe for the gateway's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// authServer is a gateway with an HS256 secret and an RSA key, its clock
// now, logging everything at debug level into logs.
type authServer struct {
	*testServer
	now  func() time.Time
	logs *syncBuffer
}

func newAuthServer(t *testing.T, cfg gateway.Config, now func() time.Time, opts auth.Config) *authServer {
	t.Helper()
	if now == nil {
		now = time.Now
	}
	opts.Secret, opts.Keys, opts.Now = testSecret, rsaPEM(t), now
	v, err := auth.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	cfg.Verifier, cfg.Now = v, now
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	return &authServer{testServer: newTestServer(t, cfg), now: now, logs: logs}
}

// claims returns claims for sub expiring in d (on the server's clock)
// with the given grants.
func (a *authServer) claims(sub string, d time.Duration, topics auth.TopicClaims) auth.Claims {
	return auth.Claims{
		RegisteredClaims: jwt.RegisteredClaims{Subject: sub, ExpiresAt: jwt.NewNumericDate(a.now().Add(d))},
		Topics:           topics,
	}
}

func sign(t testing.TB, method jwt.SigningMethod, key any, c jwt.Claims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(method, c).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var all = auth.TopicClaims{Subscribe: []string{"**"}, Publish: []string{"**"}, Presence: []string{"**"}}

// hello sends a hello with token and returns the server's hello or the
// error ack.
func helloWith(c *gwtest.Conn, token string) (*frames.Hello, *frames.Ack) {
	c.Send(&frames.Hello{Resume: []frames.Cursor{}, Token: token})
	switch f := c.Next().(type) {
	case *frames.Hello:
		return f, nil
	case *frames.Ack:
		return nil, f
	default:
		panic(fmt.Sprintf("unexpected %T", f))
	}
}

func TestAuth_HelloTokenTable(t *testing.T) {
	t.Parallel()
	a := newAuthServer(t, gateway.Config{}, nil, auth.Config{Audience: "syncgate", Issuer: "https://id.example", Leeway: -1})
	good := func() auth.Claims {
		c := a.claims("u1", time.Hour, all)
		c.Audience, c.Issuer = jwt.ClaimStrings{"syncgate"}, "https://id.example"
		return c
	}
	with := func(f func(*auth.Claims)) auth.Claims { c := good(); f(&c); return c }
	valid := sign(t, jwt.SigningMethodHS256, testSecret, good())
	tampered := valid[:len(valid)-4] + "AAAA"
	if tampered == valid {
		tampered = valid[:len(valid)-4] + "BBBB"
	}
	parts := strings.Split(valid, ".")
	none := strings.Join([]string{"eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0", parts[1], ""}, ".")
	tokens := []struct {
		name  string
		token string
		code  frames.Code // "" = accepted
	}{
		{"valid HS256", valid, ""},
		{"valid RS256", sign(t, jwt.SigningMethodRS256, testRSA(), good()), ""},
		{"no token", "", frames.CodeTokenRequired},
		{"expired", sign(t, jwt.SigningMethodHS256, testSecret, with(func(c *auth.Claims) {
			c.ExpiresAt = jwt.NewNumericDate(time.Now().Add(-time.Minute))
		})), frames.CodeTokenExpired},
		{"nbf in the future", sign(t, jwt.SigningMethodHS256, testSecret, with(func(c *auth.Claims) {
			c.NotBefore = jwt.NewNumericDate(time.Now().Add(time.Minute))
		})), frames.CodeTokenNotYetValid},
		{"alg none", none, frames.CodeTokenRejected},
		{"HS256 signed with the RSA public key", sign(t, jwt.SigningMethodHS256, rsaPEM(t), good()), frames.CodeTokenRejected},
		{"wrong aud", sign(t, jwt.SigningMethodHS256, testSecret, with(func(c *auth.Claims) { c.Audience = jwt.ClaimStrings{"other"} })), frames.CodeTokenRejected},
		{"wrong iss", sign(t, jwt.SigningMethodHS256, testSecret, with(func(c *auth.Claims) { c.Issuer = "https://evil.example" })), frames.CodeTokenRejected},
		{"tampered signature", tampered, frames.CodeTokenRejected},
		{"missing exp", sign(t, jwt.SigningMethodHS256, testSecret, with(func(c *auth.Claims) { c.ExpiresAt = nil })), frames.CodeBadToken},
		{"bad pattern", sign(t, jwt.SigningMethodHS256, testSecret, with(func(c *auth.Claims) { c.Topics.Subscribe = []string{"room-*"} })), frames.CodeBadToken},
		{"oversized", strings.Repeat("a", 9000), frames.CodeBadToken},
		{"garbage", "not.a.token", frames.CodeBadToken},
	}
	for _, tc := range tokens {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := gwtest.Dial(t, a.url, nil)
			h, ack := helloWith(c, tc.token)
			if tc.code == "" {
				if h == nil || h.ActorID == nil || *h.ActorID != "u1" {
					t.Fatalf("hello = %+v, ack %+v", h, ack)
				}
				return
			}
			if ack == nil || ack.Error == nil || ack.Error.Code != tc.code {
				t.Fatalf("want %s, got hello %+v ack %+v", tc.code, h, ack)
			}
			if tc.token != "" && strings.Contains(ack.Error.Cause, tc.token) {
				t.Fatal("the cause contains the token")
			}
			if strings.Contains(ack.Error.Fix, "grace") {
				// The connection closes: there is no grace to refresh in.
				t.Fatalf("fix %q advises a grace period the refused hello does not get", ack.Error.Fix)
			}
			c.ExpectClose(websocket.StatusPolicyViolation)
		})
	}
	t.Cleanup(func() {
		// Subtests have ended: the log holds every refusal.
		logs := a.logs.String()
		if !strings.Contains(logs, "token refused") {
			t.Errorf("refusals not logged:\n%s", logs)
		}
		for _, tc := range tokens {
			if sig := tc.token[strings.LastIndexByte(tc.token, '.')+1:]; len(sig) > 8 && strings.Contains(logs, sig) {
				t.Errorf("%s: the token appears in the logs", tc.name)
			}
		}
	})
}

func TestAuth_ForbiddenAttemptsDeliverNothing(t *testing.T) {
	t.Parallel()
	a := newAuthServer(t, gateway.Config{FrameRate: -1}, nil, auth.Config{})
	watcher := gwtest.Dial(t, a.url, nil)
	if h, ack := helloWith(watcher, sign(t, jwt.SigningMethodHS256, testSecret, a.claims("watcher", time.Hour, all))); h == nil {
		t.Fatalf("watcher refused: %+v", ack.Error)
	}
	for i, topic := range []string{"secret:1", "room:43", "room:42"} {
		watcher.Subscribe(fmt.Sprintf("w%d", i), topic)
	}
	attacker := gwtest.Dial(t, a.url, nil)
	grants := auth.TopicClaims{Subscribe: []string{"room:*"}, Publish: []string{"room:42"}}
	if h, _ := helloWith(attacker, sign(t, jwt.SigningMethodHS256, testSecret, a.claims("attacker", time.Hour, grants))); h == nil || *h.ActorID != "attacker" {
		t.Fatalf("attacker hello = %+v", h)
	}
	const n = 1000
	seq := int64(0)
	for i := range n {
		switch i % 3 {
		case 0:
			attacker.Send(&frames.Subscribe{Op: frames.OpAdd, SID: fmt.Sprintf("s%d", i),
				Target: frames.Target{Kind: frames.TargetTopic, Topic: fmt.Sprintf("secret:%d", i)}})
		case 1:
			attacker.Send(&frames.Mutate{Key: fmt.Sprintf("k%d", i), Seq: seq, Name: "publish", Input: []byte(`{"topic":"secret:1","data":1}`)})
			seq++
		case 2:
			attacker.Send(&frames.Mutate{Key: fmt.Sprintf("k%d", i), Seq: seq, Name: "publish", Input: []byte(`{"topic":"room:43","data":1}`)})
			seq++
		}
	}
	for i := range n {
		ack := gwtest.Expect[*frames.Ack](attacker)
		if ack.Error == nil || ack.Error.Code != frames.CodeForbidden {
			t.Fatalf("attempt %d: ack %+v %+v", i, ack, ack.Error)
		}
	}
	// A granted publish as a marker: it is the first and only thing the
	// watcher sees, with the attacker's actorId.
	if ack := attacker.Publish("marker", seq, "room:42", `"marker"`); ack.Error != nil {
		t.Fatalf("granted publish refused: %+v", ack.Error)
	}
	p := gwtest.Expect[*frames.Patch](watcher)
	if p.SID != "w2" || !strings.Contains(string(p.Patches[0].Row), `"actorId":"attacker"`) {
		t.Fatalf("watcher got %+v %s", p, p.Patches[0].Row)
	}
}

// expiringClock returns a clock that runs with real time but reads exp-lead
// now, so a token with a whole-second exp expires after lead.
func expiringClock(lead time.Duration) (now func() time.Time, exp time.Time) {
	exp = time.Unix(time.Now().Unix()+3600, 0)
	off := time.Until(exp.Add(-lead))
	return func() time.Time { return time.Now().Add(off) }, exp
}

func TestAuth_ExpiryRefreshAndGrace(t *testing.T) {
	t.Parallel()
	// Leads long enough for the setup (four dials and hellos, three
	// subscribes) and for the steps in the grace, on a loaded machine
	// under -race.
	now, exp := expiringClock(2 * time.Second)
	a := newAuthServer(t, gateway.Config{TokenGrace: 2 * time.Second}, now, auth.Config{Leeway: -1})
	token := func(sub string, e time.Time) string {
		c := a.claims(sub, 0, all)
		c.ExpiresAt = jwt.NewNumericDate(e)
		return sign(t, jwt.SigningMethodHS256, testSecret, c)
	}
	pub := gwtest.Dial(t, a.url, nil)
	helloWith(pub, token("pub", exp.Add(time.Hour)))
	open := func(sub string) *gwtest.Conn {
		c := gwtest.Dial(t, a.url, nil)
		if h, ack := helloWith(c, token(sub, exp)); h == nil {
			t.Fatalf("%s refused: %+v", sub, ack.Error)
		}
		c.Subscribe("s", "room:1")
		return c
	}
	refreshed, stale, other := open("u1"), open("u2"), open("u3")
	expiredNotice := func(c *gwtest.Conn) {
		t.Helper()
		ack := gwtest.Expect[*frames.Ack](c)
		if ack.Error == nil || ack.Error.Code != frames.CodeTokenExpired {
			t.Fatalf("want X_TOKEN_EXPIRED, got %+v", ack)
		}
	}
	for _, c := range []*gwtest.Conn{refreshed, stale, other} {
		expiredNotice(c)
	}
	// In the grace period grants are void...
	stale.Send(&frames.Subscribe{Op: frames.OpAdd, SID: "s2", Target: frames.Target{Kind: frames.TargetTopic, Topic: "room:2"}})
	if ack := gwtest.Expect[*frames.Ack](stale); ack.Error == nil || ack.Error.Code != frames.CodeTokenExpired || ack.Ref != "s2" {
		t.Fatalf("subscribe in grace: %+v", ack)
	}
	// ...while reads go on: a presence list is answered, as diffs flow.
	stale.Send(&frames.Presence{Topic: "room:1", Op: frames.PresenceSync, Members: []frames.Member{}})
	if ack := gwtest.Expect[*frames.Ack](stale); ack.Error != nil || ack.Ref != "presence:room:1" {
		t.Fatalf("presence list request in grace: %+v", ack)
	}
	if p := gwtest.Expect[*frames.Presence](stale); p.Op != frames.PresenceSync || len(p.Members) != 0 {
		t.Fatalf("presence list in grace: %+v", p)
	}
	// A mutate's refusal is recorded under its seq, like any outcome: the
	// fix says to send it again as a new mutate, not to resend it.
	if ack := refreshed.Publish("k0", 0, "room:1", `"grace"`); ack.Error == nil || ack.Error.Code != frames.CodeTokenExpired ||
		!strings.Contains(ack.Error.Fix, "new mutate") {
		t.Fatalf("publish in grace: %+v", ack)
	}
	// ...a refresh restores them; another sub is refused.
	if h, ack := helloWith(refreshed, token("u1", exp.Add(time.Hour))); h == nil || *h.ActorID != "u1" {
		t.Fatalf("refresh refused: %+v", ack)
	}
	if ack := refreshed.Publish("k0", 0, "room:1", `"grace"`); ack.Error == nil || ack.Error.Code != frames.CodeTokenExpired {
		t.Fatalf("seq 0 again after the refresh: %+v, want its recorded X_TOKEN_EXPIRED", ack)
	}
	if _, ack := helloWith(other, token("someone-else", exp.Add(time.Hour))); ack == nil || ack.Error.Code != frames.CodeTokenRejected {
		t.Fatalf("refresh with another sub: %+v", ack)
	}
	other.ExpectClose(websocket.StatusPolicyViolation)
	stale.ExpectClose(websocket.StatusPolicyViolation) // at expiry + grace
	// After the grace: the refreshed session still receives and publishes.
	if ack := pub.Publish("k1", 0, "room:1", `"after"`); ack.Error != nil {
		t.Fatal(ack.Error)
	}
	if p := gwtest.Expect[*frames.Patch](refreshed); !strings.Contains(string(p.Patches[0].Row), `"after"`) {
		t.Fatalf("refreshed got %s", p.Patches[0].Row)
	}
	if ack := refreshed.Publish("k2", 1, "room:1", `"mine"`); ack.Error != nil {
		t.Fatal(ack.Error)
	}
}

// TestAuth_HelloBeforeExpiryNotice: a token past its exp but within the
// leeway is accepted, and the session is told X_TOKEN_EXPIRED at once;
// that notice (an error ack with ref "") must come after the server's
// hello, or the client reads it as its hello's refusal. The notice's
// timer used to be armed before the hello was queued, and now and then
// won the race to the queue.
func TestAuth_HelloBeforeExpiryNotice(t *testing.T) {
	t.Parallel()
	a := newAuthServer(t, gateway.Config{TokenGrace: time.Minute}, nil, auth.Config{Leeway: time.Minute})
	c := a.claims("u1", 0, all)
	c.ExpiresAt = jwt.NewNumericDate(time.Now().Add(-2 * time.Second))
	tok := sign(t, jwt.SigningMethodHS256, testSecret, c)
	// The race was lost about once in fifty hellos on a 2-core machine.
	for i := range 300 {
		conn := gwtest.Dial(t, a.url, nil)
		conn.Send(&frames.Hello{Resume: []frames.Cursor{}, Token: tok})
		if f := conn.Next(); !isHello(f) {
			t.Fatalf("hello %d: first frame %T %+v, want the server's hello", i, f, f)
		}
		if ack := gwtest.Expect[*frames.Ack](conn); ack.Ref != "" || ack.Error == nil || ack.Error.Code != frames.CodeTokenExpired {
			t.Fatalf("hello %d: then %+v, want the X_TOKEN_EXPIRED notice", i, ack)
		}
		conn.Close()
	}
}

func isHello(f frames.Frame) bool { _, ok := f.(*frames.Hello); return ok }

func TestAuth_SessionsPerActor(t *testing.T) {
	t.Parallel()
	a := newAuthServer(t, gateway.Config{MaxSessionsPerActor: 1}, nil, auth.Config{})
	tok := sign(t, jwt.SigningMethodHS256, testSecret, a.claims("u1", time.Hour, all))
	first := gwtest.Dial(t, a.url, nil)
	if h, _ := helloWith(first, tok); h == nil {
		t.Fatal("first session refused")
	}
	second := gwtest.Dial(t, a.url, nil)
	if _, ack := helloWith(second, tok); ack == nil || ack.Error.Code != frames.CodeTooManySessions {
		t.Fatalf("second session: %+v", ack)
	}
	second.ExpectClose(websocket.StatusPolicyViolation)
	first.Close()
	gwtest.Eventually(t, gwtest.Timeout, "the actor's slot is freed", func() bool {
		c := gwtest.Dial(t, a.url, nil)
		h, _ := helloWith(c, tok)
		return h != nil
	})
}

func TestGateway_AnonymousNeedsLoopbackHost(t *testing.T) {
	t.Parallel()
	for _, insecure := range []bool{false, true} {
		srv := newTestServer(t, gateway.Config{Insecure: insecure})
		for host, loop := range map[string]bool{"": true, "localhost:1": true, "127.0.0.1:8080": true, "[::1]:80": true,
			"app.localhost": true, "evil.example": false, "evil.example:8080": false, "10.0.0.1": false} {
			req, _ := http.NewRequest("GET", srv.ts.URL+"/healthz", nil)
			req.Host = host
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			want := http.StatusOK
			if !loop && !insecure {
				want = http.StatusMisdirectedRequest
			}
			if resp.StatusCode != want {
				t.Errorf("insecure=%v host %q: %d, want %d", insecure, host, resp.StatusCode, want)
			}
		}
	}
}

// TestGateway_MisdirectedSlowBodyAnswered: a request for another host
// whose body never comes is answered 421 at once, not after net/http has
// waited for the rest of the body.
func TestGateway_MisdirectedSlowBodyAnswered(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{})
	_, br := rawConn(t, strings.TrimPrefix(srv.ts.URL, "http://"), slowPost("evil.example", "/v1/stream/x", 1000, "x"))
	rawAnswer(t, br, "a POST for another host", http.StatusMisdirectedRequest)
}

// FuzzHelloToken sends arbitrary tokens through the gateway's hello path:
// each gets a hello (never, for random input) or a typed error ack and a
// close, never a crash or another code.
func FuzzHelloToken(f *testing.F) {
	v, err := auth.New(auth.Config{Secret: testSecret})
	if err != nil {
		f.Fatal(err)
	}
	// Thousands of connects a second: no accept budget (it would answer with reconnect frames).
	srv := newTestServer(f, gateway.Config{Verifier: v, FrameRate: -1, MaxSessionsPerActor: -1, AcceptRate: -1})
	f.Add("")
	f.Add("a.b.c")
	f.Add("eyJhbGciOiJub25lIn0.e30.")
	// A token signed with the secret may get a hello, and nothing else:
	// the fuzzer never sees the secret, so nothing it makes verifies.
	// (Not "only this seed": with -fuzz each worker process signs its own,
	// a second apart, and the cached corpus holds earlier runs' tokens.)
	valid := sign(f, jwt.SigningMethodHS256, testSecret, auth.Claims{RegisteredClaims: jwt.RegisteredClaims{Subject: "u", ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))}})
	f.Add(valid)
	signed := func(token string) bool {
		// Laxer than the gateway's verifier (no strict decoding, no
		// leeway rules): a hello for a token even this refuses is forged.
		_, err := jwt.NewParser(jwt.WithValidMethods([]string{"HS256"})).Parse(token, func(*jwt.Token) (any, error) { return []byte(testSecret), nil })
		return err == nil
	}
	codes := map[frames.Code]bool{frames.CodeTokenRequired: true, frames.CodeTokenExpired: true, frames.CodeTokenNotYetValid: true,
		frames.CodeBadToken: true, frames.CodeTokenRejected: true, frames.CodeBadField: true, frames.CodeBadFrame: true}
	f.Fuzz(func(t *testing.T, token string) {
		ctx, cancel := context.WithTimeout(context.Background(), gwtest.Timeout)
		defer cancel()
		c, _, err := websocket.Dial(ctx, srv.url, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		b, err := frames.Encode(&frames.Hello{Resume: []frames.Cursor{}, Token: token})
		if err != nil {
			return
		}
		if err := c.Write(ctx, websocket.MessageText, b); err != nil {
			t.Fatal(err)
		}
		_, msg, err := c.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		fr, err := frames.Decode(bytes.TrimSpace(msg))
		if err != nil {
			t.Fatalf("server sent %q: %v", msg, err)
		}
		switch fr := fr.(type) {
		case *frames.Hello:
			if !signed(token) {
				t.Fatalf("hello for a token not signed with the secret: %q", token)
			}
		case *frames.Ack:
			if token == valid {
				t.Fatalf("the valid token refused: %+v", fr.Error)
			}
			if fr.Error == nil || !codes[fr.Error.Code] {
				t.Fatalf("ack %+v", fr.Error)
			}
			if len(token) > 8 && strings.Contains(fr.Error.Cause, token) {
				t.Fatal("cause contains the token")
			}
		default:
			t.Fatalf("got %T", fr)
		}
	})
}

// A producer is named by (actor, clientId): another actor naming the same
// clientId gets a producer of its own and can neither fence the first
// (X_EPOCH_FENCED) nor take up its seqs; the same actor's newer epoch
// still fences it.
func TestAuth_ProducerIsPerActor(t *testing.T) {
	t.Parallel()
	a := newAuthServer(t, gateway.Config{}, nil, auth.Config{})
	dial := func(sub string, epoch int64) *gwtest.Conn {
		c := gwtest.Dial(t, a.url, nil)
		c.Send(&frames.Hello{Resume: []frames.Cursor{}, ClientID: "app", Epoch: epoch,
			Token: sign(t, jwt.SigningMethodHS256, testSecret, a.claims(sub, time.Hour, all))})
		if _, ok := c.Next().(*frames.Hello); !ok {
			t.Fatalf("hello of %s refused", sub)
		}
		return c
	}
	alice := dial("alice", 0)
	if ack := alice.Publish("a0", 0, "room:1", `1`); ack.Error != nil {
		t.Fatalf("alice seq 0: %+v", ack.Error)
	}
	mallory := dial("mallory", 1)
	if ack := mallory.Publish("a1", 0, "room:1", `2`); ack.Error != nil {
		t.Fatalf("mallory seq 0: %+v", ack.Error)
	}
	ack := alice.Publish("a1", 1, "room:1", `3`)
	if ack.Error != nil || ack.LSN == nil {
		t.Fatalf("alice seq 1 after another actor used her clientId: %+v", ack.Error)
	}
	alice2 := dial("alice", 1)
	if ack := alice2.Publish("b0", 0, "room:1", `4`); ack.Error != nil {
		t.Fatalf("alice's newer epoch: %+v", ack.Error)
	}
	if ack := alice.Publish("a2", 2, "room:1", `5`); ack.Error == nil || ack.Error.Code != frames.CodeEpochFenced {
		t.Fatalf("alice's older epoch after her newer one: %+v, want X_EPOCH_FENCED", ack)
	}
}

// The Go client's TokenFunc supplies each hello's token and answers the
// server's X_TOKEN_EXPIRED with a refreshing hello on the same
// connection: the session outlives its first token's exp and grace.
func TestAuth_ClientTokenFuncRefreshes(t *testing.T) {
	t.Parallel()
	const grace = 600 * time.Millisecond
	now, exp := expiringClock(400 * time.Millisecond)
	a := newAuthServer(t, gateway.Config{TokenGrace: grace}, now, auth.Config{Leeway: -1})
	var calls atomic.Int64
	c := dialClient(t, a.url, &client.Options{TokenFunc: func(context.Context) (string, error) {
		e := exp // the first token expires soon, later ones in an hour
		if calls.Add(1) > 1 {
			e = exp.Add(time.Hour)
		}
		cl := a.claims("u1", 0, all)
		cl.ExpiresAt = jwt.NewNumericDate(e)
		return sign(t, jwt.SigningMethodHS256, testSecret, cl), nil
	}})
	gwtest.Eventually(t, gwtest.Timeout, "the client refreshes its token", func() bool {
		return metricValue(t, scrape(t, a.ts.URL), "syncgate_token_refreshes_total") == 1
	})
	gwtest.Eventually(t, gwtest.Timeout, "the first token's grace is over", func() bool {
		return now().After(exp.Add(grace + 200*time.Millisecond))
	})
	if err := c.Err(); err != nil {
		t.Fatalf("client ended: %v", err)
	}
	if _, err := c.Publish(t.Context(), "room:1", json.RawMessage(`1`)); err != nil {
		t.Fatalf("publish after the grace: %v", err)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("TokenFunc called %d times, want 2 (hello, refresh)", n)
	}
}
