package gateway_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/syncgate/syncgate/frames"
	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/internal/gwtest"
)

// dropFrame is a cheap frame the server always answers (X_NOT_SUBSCRIBED).
const dropFrame = `{"type":"subscribe","v":1,"op":"drop","sid":"nope","target":{"kind":"topic","topic":"t","cursor":null}}`

// A client at 10× its frame rate gets X_RATE_LIMITED for what is over the
// rate (the first refusal of a run, then at most one answer per 100 ms,
// counting the frames dropped meanwhile), while another session's
// publishes go through untouched.
func TestLimits_FrameRate(t *testing.T) {
	t.Parallel()
	const perSec = 50
	srv := newTestServer(t, gateway.Config{FrameRate: perSec, FrameBurst: perSec, RateLimitClose: -1})
	abuser := gwtest.Dial(t, srv.url, nil)
	abuser.Hello("", 0)
	good := gwtest.Dial(t, srv.url, nil)
	good.Hello("", 0)
	good.Subscribe("s", "room:1")

	// 10× the rate for one second: 500 frames, in 10 bursts of 50.
	const n = 10 * perSec
	start := time.Now()
	for burst := range 10 {
		for range n / 10 {
			abuser.SendRaw(dropFrame)
		}
		// The well-behaved session meanwhile.
		if ack := good.Publish(fmt.Sprintf("k%d", burst), int64(burst), "room:1", `1`); ack.Error != nil {
			t.Fatalf("good session refused: %+v", ack.Error)
		}
		gwtest.Expect[*frames.Patch](good)
		// Pace the bursts over about a second without sleeping on
		// anything but a timer channel.
		<-time.After(time.Until(start.Add(time.Duration(burst+1) * 100 * time.Millisecond)))
	}
	elapsed := time.Since(start).Seconds()
	// A marker frame, sent once the bucket has a token again, ends the
	// abuser's answers.
	marker := strings.Replace(dropFrame, `"nope"`, `"marker"`, 1)
	served, answers, dropped := 0, 0, 0
	for done := false; !done; {
		<-time.After(time.Second / perSec)
		abuser.SendRaw(marker)
		for {
			ack := gwtest.Expect[*frames.Ack](abuser)
			switch {
			case ack.Error.Code == frames.CodeRateLimited:
				answers++
				dropped++
				if _, more, ok := strings.Cut(ack.Error.Cause, ", and "); ok {
					var k int
					if _, err := fmt.Sscanf(more, "%d more", &k); err != nil {
						t.Fatalf("cause %q", ack.Error.Cause)
					}
					dropped += k
				}
			case ack.Error.Code == frames.CodeNotSubscribed && ack.Ref == "nope":
				served++
				continue
			case ack.Error.Code == frames.CodeNotSubscribed && ack.Ref == "marker":
				done = true
			default:
				t.Fatalf("ack %+v", ack.Error)
			}
			break
		}
	}
	if maxServed := perSec + int(perSec*elapsed) + 2; served > maxServed || served < perSec {
		t.Fatalf("served %d frames in %.2fs, want %d..%d", served, elapsed, perSec, maxServed)
	}
	// Drops after the last answer are told with the next one, which a
	// run that ends does not get: at most one window's frames (up to two
	// bursts, as a window may straddle them).
	if unreported := n - served - dropped; unreported < -int(perSec*elapsed) || unreported > n/5+5 {
		t.Fatalf("served %d + dropped %d (by the answers' counts) of the %d sent", served, dropped, n)
	}
	if maxAnswers := int(elapsed/0.1) + 12; answers < 1 || answers > maxAnswers {
		t.Fatalf("%d X_RATE_LIMITED answers for %d dropped frames, want 1..%d", answers, dropped, maxAnswers)
	}
}

// A session that stays over its rate for RateLimitClose is closed 1008.
func TestLimits_SustainedAbuseCloses1008(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{FrameRate: 10, FrameBurst: 10, RateLimitClose: 200 * time.Millisecond})
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("", 0)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), gwtest.Timeout)
		defer cancel()
		for ctx.Err() == nil {
			if c.C.Write(ctx, websocket.MessageText, []byte(dropFrame)) != nil {
				return
			}
		}
	}()
	c.ExpectClose(websocket.StatusPolicyViolation)
	<-done
}

// MaxSessionsPerIP counts each client address apart: a third session from
// 127.0.0.1 is told to come back (1013) while 127.0.0.2 still gets in.
func TestLimits_SessionsPerIP(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{MaxSessionsPerIP: 2})
	from := func(ip string) *websocket.DialOptions {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		return &websocket.DialOptions{HTTPClient: &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}}
	}
	a := gwtest.Dial(t, srv.url, nil)
	a.Hello("", 0)
	b := gwtest.Dial(t, srv.url, nil)
	b.Hello("", 0)
	third := gwtest.Dial(t, srv.url, nil)
	if r := gwtest.Expect[*frames.Reconnect](third); r.Reason != frames.ReasonOverload || r.AfterMs <= 0 {
		t.Fatalf("reconnect = %+v", r)
	}
	third.ExpectClose(websocket.StatusTryAgainLater)

	ctx, cancel := context.WithTimeout(context.Background(), gwtest.Timeout)
	defer cancel()
	other, _, err := websocket.Dial(ctx, srv.url, from("127.0.0.2"))
	if err != nil {
		t.Skipf("no second loopback address: %v", err)
	}
	defer other.CloseNow()
	hello, _ := frames.Encode(&frames.Hello{Resume: []frames.Cursor{}})
	if err := other.Write(ctx, websocket.MessageText, hello); err != nil {
		t.Fatal(err)
	}
	if _, msg, err := other.Read(ctx); err != nil || !strings.Contains(string(msg), `"type":"hello"`) {
		t.Fatalf("127.0.0.2: %q %v", msg, err)
	}
	// A freed slot is usable again.
	a.Close()
	gwtest.Eventually(t, gwtest.Timeout, "127.0.0.1 admitted again", func() bool {
		c := gwtest.Dial(t, srv.url, nil)
		f, err := c.NextErr(50 * time.Millisecond)
		if err != nil { // no reconnect frame: admitted
			return true
		}
		_, refused := f.(*frames.Reconnect)
		return !refused
	})
}

// The default cap: 128 subscriptions, the 129th refused.
func TestLimits_129thSubscription(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{})
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("", 0)
	for i := range 129 {
		c.Send(&frames.Subscribe{Op: frames.OpAdd, SID: fmt.Sprintf("s%d", i), Target: frames.Target{Kind: frames.TargetTopic, Topic: fmt.Sprintf("t:%d", i)}})
	}
	for i := range 128 {
		if ack := c.AwaitAck(fmt.Sprintf("s%d", i)); ack.Error != nil {
			t.Fatalf("subscription %d: %+v", i, ack.Error)
		}
	}
	if ack := c.AwaitAck("s128"); ack.Error == nil || ack.Error.Code != frames.CodeTooManySubs {
		t.Fatalf("129th: %+v", ack)
	}
}

// Origins through real upgrades, on the session path and on the refusal
// path of a full node (both check before websocket.Accept). The gateway's
// only origin table: it holds every case the first one (walking skeleton)
// had.
func TestLimits_OriginTable(t *testing.T) {
	t.Parallel()
	for _, full := range []bool{false, true} {
		cfg := gateway.Config{AllowedOrigins: []string{"app.example.com", "*.example.org", "https://pinned.example"}}
		if full {
			cfg.MaxSessions = 1
		}
		srv := newTestServer(t, cfg)
		if full {
			gwtest.Dial(t, srv.url, nil).Hello("", 0) // fills the node
		}
		host := strings.TrimPrefix(srv.ts.URL, "http://")
		for _, tc := range []struct {
			origin string
			ok     bool
		}{
			{"", true}, // not a browser
			{"http://" + host, true},
			{"https://app.example.com", true},
			{"https://a.b.example.org", true},
			{"https://pinned.example", true},
			{"http://pinned.example", false},
			{"https://example.org", false},
			{"https://evilexample.org", false},
			{"https://app.example.com.evil.example", false},
			{"https://evil.example", false},
			{"null", false},
			{"https://app.example.com:8443", false},
		} {
			hdr := http.Header{}
			if tc.origin != "" {
				hdr.Set("Origin", tc.origin)
			}
			ctx, cancel := context.WithTimeout(context.Background(), gwtest.Timeout)
			c, resp, err := websocket.Dial(ctx, srv.url, &websocket.DialOptions{HTTPHeader: hdr})
			cancel()
			switch {
			case tc.ok && err != nil:
				t.Errorf("full=%v origin %q refused: %v", full, tc.origin, err)
			case !tc.ok && err == nil:
				t.Errorf("full=%v origin %q upgraded", full, tc.origin)
			case !tc.ok && (resp == nil || resp.StatusCode != http.StatusForbidden):
				t.Errorf("full=%v origin %q: want 403, got %v", full, tc.origin, resp)
			}
			if c != nil {
				_ = c.CloseNow()
			}
		}
	}
}

func TestLimits_BadOriginPatternFailsNew(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"*", "null", "app*.example.com", "*.com", "ftp://x.example"} {
		if _, err := gateway.New(gateway.Config{AllowedOrigins: []string{p}}); err == nil {
			t.Errorf("pattern %q accepted", p)
		}
	}
}
