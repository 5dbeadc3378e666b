package gateway_test

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/syncgate/syncgate/frames"
	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/internal/gwtest"
)

// dropFrame is a cheap frame the server always answers (X_NOT_SUBSCRIBED).
const dropFrame = `{"type":"subscribe","v":1,"op":"drop","sid":"nope","target":{"kind":"topic","topic":"t","cursor":null}}`

// A client flooding far over its frame rate gets X_RATE_LIMITED for what
// is over the rate (the first refusal of a run, then at most one answer per
// 100 ms, counting the frames dropped meanwhile), is read no faster than
// its rate and a tenth while it floods (the rest waits in TCP buffers), and
// another session's publishes go through meanwhile.
func TestLimits_FrameRate(t *testing.T) {
	t.Parallel()
	const perSec = 50 // and a burst of 50
	srv := newTestServer(t, gateway.Config{FrameRate: perSec, FrameBurst: perSec, RateLimitClose: -1})
	abuser := gwtest.Dial(t, srv.url, nil)
	abuser.Hello("", 0)
	good := gwtest.Dial(t, srv.url, nil)
	good.Hello("", 0)
	good.Subscribe("s", "room:1")

	// The abuser's answers, read as they come.
	var answers, droppedByAnswers, served atomic.Int64
	var unexpected atomic.Pointer[frames.Ack]
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		for {
			f, err := abuser.NextErr(gwtest.Timeout)
			if err != nil {
				return
			}
			ack, ok := f.(*frames.Ack)
			switch {
			case ok && ack.Error != nil && ack.Error.Code == frames.CodeRateLimited:
				answers.Add(1)
				droppedByAnswers.Add(1)
				if _, more, ok := strings.Cut(ack.Error.Cause, ", and "); ok {
					var k int64
					if _, err := fmt.Sscanf(more, "%d more", &k); err != nil {
						unexpected.Store(ack)
					}
					droppedByAnswers.Add(k)
				}
			case ok && ack.Error != nil && ack.Error.Code == frames.CodeNotSubscribed:
				served.Add(1)
			case ok:
				unexpected.Store(ack)
			}
		}
	}()

	// The abuser writes as fast as the socket takes it, for about a
	// second; the well-behaved session publishes ten times meanwhile.
	stop := make(chan struct{})
	floodDone := make(chan struct{})
	var sent int
	start := time.Now()
	go func() {
		defer close(floodDone)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if abuser.C.Write(context.Background(), websocket.MessageText, []byte(dropFrame)) != nil {
				return
			}
			sent++
		}
	}()
	for i := range 10 {
		if ack := good.Publish(fmt.Sprintf("k%d", i), int64(i), "room:1", `1`); ack.Error != nil {
			t.Fatalf("good session refused: %+v", ack.Error)
		}
		gwtest.Expect[*frames.Patch](good)
		<-time.After(time.Until(start.Add(time.Duration(i+1) * 100 * time.Millisecond)))
	}
	// The abuser's last write may wait long for room in the socket's
	// buffers, which the kernel frees in large steps: it is stopped by
	// closing the connection once the server's counts are read.
	close(stop)
	elapsed := time.Since(start).Seconds()
	m := scrape(t, srv.ts.URL)
	dropped := metricValue(t, m, "syncgate_frames_rate_limited_total")
	// Subscribes the server decoded: the good session's, and the abuser's
	// that were within its rate.
	decoded := metricValue(t, m, `syncgate_frames_in_total{type="subscribe"}`) - 1
	read := dropped + decoded
	// Within the rate, plus a tenth of it (and of the burst) refused.
	if maxRead := 1.1*perSec + 1.1*perSec*elapsed + 4; read > maxRead {
		t.Fatalf("read %.0f of the abuser's %d frames in %.2fs (%.0f served, %.0f dropped), want at most %.0f",
			read, sent, elapsed, decoded, dropped, maxRead)
	}
	if maxServed := perSec + perSec*elapsed + 2; decoded > maxServed || decoded < perSec {
		t.Fatalf("served %.0f frames in %.2fs, want %d..%.0f", decoded, elapsed, perSec, maxServed)
	}
	abuser.C.CloseNow()
	<-floodDone
	<-readDone
	elapsed = time.Since(start).Seconds()
	if float64(sent) < 4*read {
		t.Fatalf("the abuser sent only %d frames in %.2fs (%.0f read): not a flood", sent, elapsed, read)
	}
	// The server may have read a little more since.
	m = scrape(t, srv.ts.URL)
	dropped = metricValue(t, m, "syncgate_frames_rate_limited_total")
	decoded = metricValue(t, m, `syncgate_frames_in_total{type="subscribe"}`) - 1
	if a := unexpected.Load(); a != nil {
		t.Fatalf("unexpected ack %+v", a.Error)
	}
	if maxAnswers := int64(elapsed/0.1) + 2; answers.Load() < 1 || answers.Load() > maxAnswers {
		t.Fatalf("%d X_RATE_LIMITED answers in %.2fs, want 1..%d", answers.Load(), elapsed, maxAnswers)
	}
	if d := float64(droppedByAnswers.Load()); d > dropped {
		t.Fatalf("the answers count %.0f dropped frames, the server %.0f", d, dropped)
	}
	if served.Load() > int64(decoded) {
		t.Fatalf("%d frames answered as served, %.0f decoded", served.Load(), decoded)
	}
}

// metricValue is the value of the sample named name (with its labels, as
// exposed) in a /metrics text.
func metricValue(t testing.TB, metrics, name string) float64 {
	t.Helper()
	for _, l := range strings.Split(metrics, "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric %s: %v", name, err)
			}
			return f
		}
	}
	t.Fatalf("no metric %s in:\n%s", name, metrics)
	return 0
}

// A session that stays over its rate for RateLimitClose is closed 1008,
// whether it sends a frame per message or packs many frames into each
// (which makes the reader pause as long as it may between messages).
func TestLimits_SustainedAbuseCloses1008(t *testing.T) {
	t.Parallel()
	for _, perMessage := range []int{1, 400} {
		t.Run(fmt.Sprintf("frames per message %d", perMessage), func(t *testing.T) {
			t.Parallel()
			srv := newTestServer(t, gateway.Config{FrameRate: 100, FrameBurst: 100, RateLimitClose: 1500 * time.Millisecond})
			c := gwtest.Dial(t, srv.url, nil)
			c.Hello("", 0)
			msg := []byte(strings.TrimSuffix(strings.Repeat(dropFrame+"\n", perMessage), "\n"))
			done := make(chan struct{})
			go func() {
				defer close(done)
				ctx, cancel := context.WithTimeout(context.Background(), gwtest.Timeout)
				defer cancel()
				for ctx.Err() == nil {
					if c.C.Write(ctx, websocket.MessageText, msg) != nil {
						return
					}
				}
			}()
			c.ExpectClose(websocket.StatusPolicyViolation)
			<-done
		})
	}
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
	// Admitted is a hello answered; refused is a reconnect frame (and a
	// close). A silence is neither: it waits for the answer.
	gwtest.Eventually(t, gwtest.Timeout, "127.0.0.1 admitted again", func() bool {
		c := gwtest.Dial(t, srv.url, nil)
		defer c.C.CloseNow()
		if err := c.SendErr(&frames.Hello{Resume: []frames.Cursor{}}); err != nil {
			return false // refused and closed before the hello went out
		}
		f, err := c.NextErr(gwtest.Timeout)
		if err != nil {
			t.Fatalf("a session from 127.0.0.1 after a slot was freed: %v", err)
		}
		_, admitted := f.(*frames.Hello)
		return admitted
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

// Binary messages count against the frame rate: past the burst they are
// dropped with X_RATE_LIMITED rather than each answered X_BAD_FRAME.
func TestLimits_BinaryCountsAgainstFrameRate(t *testing.T) {
	t.Parallel()
	const burst = 5
	srv := newTestServer(t, gateway.Config{FrameRate: 1, FrameBurst: burst, RateLimitClose: -1})
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("", 0)
	for range 4 * burst {
		if err := c.C.Write(context.Background(), websocket.MessageBinary, []byte{0}); err != nil {
			t.Fatal(err)
		}
	}
	bad := 0
	for {
		ack := gwtest.Expect[*frames.Ack](c)
		if ack.Error == nil {
			t.Fatalf("ack without error: %+v", ack)
		}
		if ack.Error.Code == frames.CodeRateLimited {
			break
		}
		if ack.Error.Code != frames.CodeBadFrame {
			t.Fatalf("ack %+v", ack.Error)
		}
		if bad++; bad > burst { // the hello took a token; one may refill meanwhile
			t.Fatalf("%d binary messages answered X_BAD_FRAME at a burst of %d", bad, burst)
		}
	}
	if bad < burst-1 {
		t.Fatalf("rate limited after %d binary messages, burst %d", bad, burst)
	}
	if n := metricValue(t, scrape(t, srv.ts.URL), "syncgate_frames_rate_limited_total"); n < 1 {
		t.Fatalf("syncgate_frames_rate_limited_total = %v", n)
	}
}

// Messages of no frame (empty, or blank lines) are answered nothing, but
// count against the frame rate: past the burst they are dropped with
// X_RATE_LIMITED, and a flood of them is closed 1008 like any other.
func TestLimits_EmptyMessagesCountAgainstFrameRate(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{FrameRate: 1, FrameBurst: 5, RateLimitClose: 500 * time.Millisecond})
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("", 0)
	for _, msg := range []string{"", "\n", "\n\n", "", "", "", ""} {
		if err := c.C.Write(context.Background(), websocket.MessageText, []byte(msg)); err != nil {
			t.Fatal(err)
		}
	}
	if ack := gwtest.Expect[*frames.Ack](c); ack.Error == nil || ack.Error.Code != frames.CodeRateLimited {
		t.Fatalf("after seven empty messages at a burst of 5: %+v, want X_RATE_LIMITED", ack)
	}
	// Kept up, the flood closes the session.
	stop := make(chan struct{})
	flooded := make(chan struct{})
	go func() {
		defer close(flooded)
		tick := time.NewTicker(5 * time.Millisecond) // the flood's pace: 200/s against 1/s
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if c.C.Write(context.Background(), websocket.MessageText, nil) != nil {
				return // closed
			}
		}
	}()
	c.ExpectClose(websocket.StatusPolicyViolation)
	close(stop)
	<-flooded
}

// Frames refused at one instant are one run: only its first is answered
// X_RATE_LIMITED, however many share the clock reading (a coarse clock, or
// a message of many frames read within one tick).
func TestLimits_RateLimitedOncePerInstant(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	srv := newTestServer(t, gateway.Config{Now: clock.Now, FrameRate: 1, FrameBurst: 1, RateLimitClose: -1})
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("", 0) // takes the only token
	c.SendRaw(strings.TrimSuffix(strings.Repeat(dropFrame+"\n", 5), "\n"))
	gwtest.Eventually(t, gwtest.Timeout, "five frames refused", func() bool {
		return metricValue(t, scrape(t, srv.ts.URL), "syncgate_frames_rate_limited_total") == 5
	})
	clock.Advance(2 * time.Second) // a token again, and a new run
	c.SendRaw(dropFrame)
	answers := 0
	for {
		ack := gwtest.Expect[*frames.Ack](c)
		if ack.Error == nil {
			t.Fatalf("ack without error: %+v", ack)
		}
		if ack.Error.Code == frames.CodeNotSubscribed {
			break
		}
		if ack.Error.Code != frames.CodeRateLimited {
			t.Fatalf("ack %+v", ack.Error)
		}
		answers++
	}
	if answers != 1 {
		t.Fatalf("%d X_RATE_LIMITED answers to five frames refused at one instant, want 1", answers)
	}
}

// A frame dropped over the rate that is malformed too is answered with
// its own ref when that could be read, as its X_BAD_* answer would be (a
// client matches answers to frames by ref): it was "".
func TestLimits_RateLimitedMalformedKeepsItsRef(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	srv := newTestServer(t, gateway.Config{Now: clock.Now, FrameRate: 1, FrameBurst: 1, RateLimitClose: -1})
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("", 0) // takes the only token
	c.SendRaw(`{"type":"subscribe","v":1,"op":"bogus","sid":"s9","target":{"kind":"topic","topic":"t","cursor":null}}`)
	if ack := gwtest.Expect[*frames.Ack](c); ack.Error == nil || ack.Error.Code != frames.CodeRateLimited || ack.Ref != "s9" {
		t.Fatalf("answer %+v (%+v), want X_RATE_LIMITED with ref s9", ack, ack.Error)
	}
}

// A frame rate the hello cannot carry is refused at New: +Inf is not JSON,
// so no session's hello could be answered (-Inf is off, as any negative
// rate). A huge finite one gets a burst within int's range, announced in
// the hello, not whatever the conversion of its double made of it.
func TestLimits_FrameRateBounds(t *testing.T) {
	t.Parallel()
	if _, err := gateway.New(gateway.Config{FrameRate: math.Inf(1)}); err == nil {
		t.Error("FrameRate +Inf accepted")
	}
	off := newTestServer(t, gateway.Config{FrameRate: math.Inf(-1)})
	if h := gwtest.Dial(t, off.url, nil).Hello("", 0); h.FrameRate != 0 || h.FrameBurst != 0 {
		t.Errorf("hello at FrameRate -Inf (off): frameRate %v, frameBurst %d; want neither", h.FrameRate, h.FrameBurst)
	}
	srv := newTestServer(t, gateway.Config{FrameRate: 1e19})
	c := gwtest.Dial(t, srv.url, nil)
	if h := c.Hello("", 0); h.FrameRate != 1e19 || h.FrameBurst != 1<<30 {
		t.Fatalf("hello at FrameRate 1e19: frameRate %v, frameBurst %d; want a burst of %d", h.FrameRate, h.FrameBurst, 1<<30)
	}
}
