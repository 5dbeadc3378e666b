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

// TestAuth_NoExpiryNoticeAfterFreshRefresh: once a refresh with a token
// that has not expired is answered, the session is told nothing more of
// the token it replaced. The notice of an old token's timer that fired
// just before the refresh must come before the refresh's hello, or the
// client reads it as its new token's expiry. The timer queued its notice
// after releasing the clock's lock, so a refresh could stop the clock and
// queue its hello in between: the test failed within a few hundred rounds.
func TestAuth_NoExpiryNoticeAfterFreshRefresh(t *testing.T) {
	t.Parallel()
	a := newAuthServer(t, gateway.Config{TokenGrace: time.Minute, FrameRate: -1}, nil, auth.Config{Leeway: time.Minute})
	fresh := sign(t, jwt.SigningMethodHS256, testSecret, a.claims("u1", time.Hour, all))
	c := a.claims("u1", 0, all)
	c.ExpiresAt = jwt.NewNumericDate(time.Now().Add(-2 * time.Second))
	stale := sign(t, jwt.SigningMethodHS256, testSecret, c)
	conn := gwtest.Dial(t, a.url, nil)
	if h, ack := helloWith(conn, fresh); h == nil {
		t.Fatalf("hello refused: %+v", ack)
	}
	encode := func(token string) string {
		b, err := frames.Encode(&frames.Hello{Resume: []frames.Cursor{}, Token: token})
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	staleLine, freshLine := encode(stale), encode(fresh)
	for i := range 3000 {
		// One message: the stale token's timer fires at once, while the
		// reader goes on to the fresh one.
		conn.SendRaw(staleLine + "\n" + freshLine)
		hellos := 0
		for hellos < 2 {
			nf, err := conn.NextErr(5 * time.Second)
			if err != nil {
				t.Fatalf("round %d after %d hellos: %v", i, hellos, err)
			}
			switch f := nf.(type) {
			case *frames.Hello:
				hellos++
			case *frames.Ack:
				if f.Error == nil || f.Error.Code != frames.CodeTokenExpired || hellos != 1 {
					t.Fatalf("round %d: after %d hellos got %+v; a notice may only come between the stale refresh's hello and the fresh one's", i, hellos, f)
				}
			default:
				t.Fatalf("round %d: unexpected %T", i, f)
			}
		}
		// A marker: its ack must be the next frame, no notice before it.
		conn.Send(&frames.Subscribe{Op: frames.OpDrop, SID: "marker", Target: frames.Target{Kind: frames.TargetTopic, Topic: "x"}})
		if ack := gwtest.Expect[*frames.Ack](conn); ack.Ref != "marker" {
			t.Fatalf("round %d: after the fresh refresh's hello got %+v (%+v), want the marker's ack", i, ack, ack.Error)
		}
	}
}
