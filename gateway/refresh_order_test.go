package gateway_test

import (
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/syncgate/syncgate/auth"
	"github.com/syncgate/syncgate/frames"
	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/internal/gwtest"
)

// TestAuth_RefreshHelloBeforeExpiryNotice: a refresh with a token past
// its exp but within the leeway is answered like a first hello with one
// (§6.11): the server's hello first, then the X_TOKEN_EXPIRED notice.
// The refresh armed the expiry timer before it queued its hello, so the
// notice (ref "") now and then came first and read as the refresh's
// refusal.
func TestAuth_RefreshHelloBeforeExpiryNotice(t *testing.T) {
	t.Parallel()
	a := newAuthServer(t, gateway.Config{TokenGrace: time.Minute}, nil, auth.Config{Leeway: time.Minute})
	fresh := sign(t, jwt.SigningMethodHS256, testSecret, a.claims("u1", time.Hour, all))
	c := a.claims("u1", 0, all)
	c.ExpiresAt = jwt.NewNumericDate(time.Now().Add(-2 * time.Second))
	stale := sign(t, jwt.SigningMethodHS256, testSecret, c)
	conn := gwtest.Dial(t, a.url, nil)
	if h, ack := helloWith(conn, fresh); h == nil {
		t.Fatalf("hello refused: %+v", ack)
	}
	for i := range 300 {
		conn.Send(&frames.Hello{Resume: []frames.Cursor{}, Token: stale})
		if f := conn.Next(); !isHello(f) {
			t.Fatalf("refresh %d: first frame %T %+v, want the server's hello", i, f, f)
		}
		if ack := gwtest.Expect[*frames.Ack](conn); ack.Ref != "" || ack.Error == nil || ack.Error.Code != frames.CodeTokenExpired {
			t.Fatalf("refresh %d: then %+v, want the X_TOKEN_EXPIRED notice", i, ack)
		}
	}
}
