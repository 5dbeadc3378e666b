package gateway_test

import (
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/syncgate/syncgate/auth"
	"github.com/syncgate/syncgate/frames"
	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/internal/gwtest"
)

// verifierFunc is a custom gateway.TokenVerifier.
type verifierFunc func(token string) (*auth.Identity, error)

func (f verifierFunc) Verify(token string) (*auth.Identity, error) { return f(token) }

// actorless are the identities a custom verifier that breaks its
// contract accepts a token with: none, or one naming no actor.
var actorless = []struct {
	name string
	id   *auth.Identity
}{
	{"empty ActorID", &auth.Identity{Expires: time.Now().Add(time.Hour), Grants: auth.AllowAll()}},
	{"nil identity", nil},
}

// TestAuth_CustomVerifierWithoutActor: a custom TokenVerifier that
// accepts a token without naming its actor (a nil identity, or one with
// an empty ActorID) breaks the interface's contract. Its hello is
// refused (X_TOKEN_REJECTED, close 1008) instead of being served: a nil
// identity used to panic the process, and an empty ActorID was counted
// in the per-actor cap under "" and never released, so after
// MaxSessionsPerActor such sessions (closed or not) every later one was
// refused with X_TOO_MANY_SESSIONS.
func TestAuth_CustomVerifierWithoutActor(t *testing.T) {
	t.Parallel()
	for _, tc := range actorless {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v := verifierFunc(func(string) (*auth.Identity, error) { return tc.id, nil })
			s := newTestServer(t, gateway.Config{Verifier: v, MaxSessionsPerActor: 1})
			for range 2 {
				c := gwtest.Dial(t, s.url, nil)
				if h, ack := helloWith(c, "any"); h != nil || ack.Error == nil || ack.Error.Code != frames.CodeTokenRejected {
					t.Fatalf("hello answered %+v, %+v; want X_TOKEN_REJECTED", h, ack)
				}
				c.ExpectClose(websocket.StatusPolicyViolation)
			}
		})
	}
}

// TestStreamHTTP_CustomVerifierWithoutActor: the stream API refuses such
// a token too (401): a nil identity used to panic the handler, and an
// empty ActorID gave every such request one shared writer bucket.
func TestStreamHTTP_CustomVerifierWithoutActor(t *testing.T) {
	t.Parallel()
	for _, tc := range actorless {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v := verifierFunc(func(string) (*auth.Identity, error) { return tc.id, nil })
			s := newStreamServer(t, gateway.Config{Verifier: v})
			h := hdr("Authorization", "Bearer any", "Content-Type", "text/plain")
			s.do(t, "PUT", "/v1/stream/s", h, "").want(t, 401)
			s.do(t, "GET", "/v1/stream/s", h, "").want(t, 401)
		})
	}
}
