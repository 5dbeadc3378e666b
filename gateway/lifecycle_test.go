package gateway_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/syncgate/syncgate/fanout"
	"github.com/syncgate/syncgate/frames"
	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/internal/gwtest"
)

func TestGateway_ShutdownClosesSessions1001(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{})
	conns := make([]*gwtest.Conn, 3)
	for i := range conns {
		conns[i] = gwtest.Dial(t, srv.url, nil)
		conns[i].Hello("", 0)
	}
	if code := get(t, srv.ts.URL+"/readyz"); code != http.StatusOK {
		t.Fatalf("readyz before shutdown: %d", code)
	}
	done := make(chan error, 1)
	go func() { done <- srv.gw.Shutdown(t.Context()) }()
	for _, c := range conns {
		c.ExpectClose(websocket.StatusGoingAway)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if code := get(t, srv.ts.URL+"/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("readyz after shutdown: %d", code)
	}
	if code := get(t, srv.ts.URL+"/healthz"); code != http.StatusOK {
		t.Fatalf("healthz after shutdown: %d", code)
	}
	_, resp, err := websocket.Dial(t.Context(), srv.url, nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("dial after shutdown: %v %+v", err, resp)
	}
}

func get(t testing.TB, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestGateway_ShutdownCutsClosingSessions: when Shutdown's ctx ends, a
// session already in its close handshake (1001 sent, the peer never
// answers) is cut, as Shutdown's doc says, not waited for.
func TestGateway_ShutdownCutsClosingSessions(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{})
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("", 0)
	// c reads nothing from here on.
	shutdownCuts(t, srv)
}

// shutdownCuts runs Shutdown with a 200 ms ctx, which must end first, and
// fails unless Shutdown returns well before coder/websocket's 5 s wait
// for a close frame: what it could not close, it cut.
func shutdownCuts(t *testing.T, srv *testServer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := srv.gw.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("shutdown: %v, want the deadline", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("shutdown took %v with a 200ms ctx", took)
	}
}

func TestGateway_Metrics(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{})
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("", 0)
	c.Subscribe("s", "t")
	c.Publish("k", 0, "t", `1`)
	gwtest.Expect[*frames.Patch](c)
	c.SendRaw(`nonsense`)
	gwtest.Expect[*frames.Ack](c)
	m := scrape(t, srv.ts.URL)
	for _, want := range []string{
		"syncgate_sessions 1",
		`syncgate_frames_in_total{type="mutate"} 1`,
		`syncgate_frames_in_total{type="subscribe"} 1`,
		`syncgate_frames_out_total{type="patch"} 1`,
		`syncgate_error_acks_total{code="X_BAD_FRAME"} 1`,
		"syncgate_frames_bad_total 1",
		"syncgate_publishes_total 1",
		"syncgate_delivery_latency_seconds_count 1",
		"syncgate_bytes_in_total",
		"syncgate_bytes_out_total",
		"process_resident_memory_bytes",
		"go_sched_latencies_seconds_count",
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// TestMetrics_Documented: docs/metrics.md names every syncgate_* metric
// the gateway registers, and no other, and lists every value of their
// reason and outcome labels.
func TestMetrics_Documented(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{})
	// Error acks by code are created on first use: make one.
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("", 0)
	c.SendRaw(`nonsense`)
	gwtest.Expect[*frames.Ack](c)
	doc, err := os.ReadFile("../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	registered := map[string]bool{}
	label := regexp.MustCompile(`(reason|outcome)="([a-z_]+)"`)
	for line := range strings.Lines(scrape(t, srv.ts.URL)) {
		if name, ok := strings.CutPrefix(line, "# TYPE syncgate_"); ok {
			registered["syncgate_"+strings.Fields(name)[0]] = true
		}
		// The reasons and outcomes are listed on the page too.
		if m := label.FindStringSubmatch(line); m != nil && strings.HasPrefix(line, "syncgate_") &&
			!strings.Contains(string(doc), "`"+m[2]+"`") {
			t.Errorf("docs/metrics.md does not list %s=%q (%s)", m[1], m[2], strings.Fields(line)[0])
		}
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("`(syncgate_[a-z_]+)`").FindAllStringSubmatch(string(doc), -1) {
		documented[m[1]] = true
	}
	if len(registered) < 20 {
		t.Fatalf("only %d syncgate_ metrics registered: %v", len(registered), registered)
	}
	for name := range registered {
		if !documented[name] {
			t.Errorf("%s is registered but not in docs/metrics.md", name)
		}
	}
	for name := range documented {
		if !registered[name] {
			t.Errorf("docs/metrics.md names %s, which is not registered", name)
		}
	}
}

// recordingTransport counts publishes on the way to a real Hub.
type recordingTransport struct {
	*fanout.Hub
	mu    sync.Mutex
	calls int
}

func (r *recordingTransport) Publish(ctx context.Context, topic string, data []byte) error {
	r.mu.Lock()
	r.calls++
	r.mu.Unlock()
	return r.Hub.Publish(ctx, topic, data)
}

// TestGateway_BroadcastEncodesOnce: a publish to N subscribers is one
// Transport.Publish of one body; each subscriber gets that body behind its
// own sid.
func TestGateway_BroadcastEncodesOnce(t *testing.T) {
	t.Parallel()
	hub := fanout.NewHub(fanout.HubConfig{})
	t.Cleanup(func() { _ = hub.Close() })
	rec := &recordingTransport{Hub: hub}
	srv := newTestServer(t, gateway.Config{Transport: rec})
	const n = 20
	conns := make([]*gwtest.Conn, n)
	for i := range conns {
		conns[i] = gwtest.Dial(t, srv.url, nil)
		conns[i].Hello("", 0)
		conns[i].Subscribe("sid-"+string(rune('a'+i)), "t")
	}
	pub := gwtest.Dial(t, srv.url, nil)
	pub.Hello("", 0)
	ack := pub.Publish("k", 0, "t", `{"x":1}`)
	var body string
	for i, c := range conns {
		p := gwtest.Expect[*frames.Patch](c)
		b, _ := frames.Encode(p)
		prefix := string(frames.AppendPatchPrefix(nil, p.SID))
		if p.LSN != *ack.LSN || !strings.HasPrefix(string(b), prefix) {
			t.Fatalf("subscriber %d: %s", i, b)
		}
		if i == 0 {
			body = strings.TrimPrefix(string(b), prefix)
		} else if got := strings.TrimPrefix(string(b), prefix); got != body {
			t.Fatalf("subscriber %d body %s, want %s", i, got, body)
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.calls != 1 {
		t.Fatalf("Transport.Publish called %d times for one publish", rec.calls)
	}
}

// TestGateway_PingTimeoutCloses4002: a client that stops reading (so never
// answers a ping) is closed with 4002 once the pong is late; a client that
// reads (and so answers) stays. The live client starts reading right
// after its hello, so no ping goes unanswered while the mute one dials;
// the pong timeout still leaves it half a second, since with 100 ms a
// fresh-clone CI run (the whole package in parallel under -race on 2
// cores) once saw its pong late.
func TestGateway_PingTimeoutCloses4002(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{PingInterval: 50 * time.Millisecond, PongTimeout: 500 * time.Millisecond})
	live := gwtest.Dial(t, srv.url, nil)
	live.Hello("", 0)
	// live keeps a read pending, which is what answers pings.
	liveErr := make(chan error, 1)
	go func() {
		_, err := live.NextErr(2 * time.Second)
		liveErr <- err
	}()
	mute := gwtest.Dial(t, srv.url, nil)
	mute.Hello("", 0)
	// Poll the metrics until the mute session is counted, then read its
	// close frame.
	gwtest.Eventually(t, gwtest.Timeout, "mute session closed for ping timeout", func() bool {
		return strings.Contains(scrape(t, srv.ts.URL), `syncgate_closes_total{reason="ping_timeout"} 1`)
	})
	mute.ExpectClose(gateway.StatusPingTimeout)
	if err := <-liveErr; err == nil || !strings.Contains(err.Error(), "deadline") {
		t.Fatalf("live session: want only a read timeout (still open), got %v", err)
	}
}

// TestGateway_PongAfterQuietSpell: the server's write deadline never goes
// stale: after a quiet spell far longer than WriteTimeout, the pong it
// writes for a client's ping (and then a frame) still goes out.
func TestGateway_PongAfterQuietSpell(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{WriteTimeout: 20 * time.Millisecond})
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("", 0)
	quiet := time.NewTimer(200 * time.Millisecond)
	<-quiet.C // the quiet spell itself is what is tested, not a synchronisation
	read := make(chan error, 1)
	go func() {
		_, err := c.NextErr(gwtest.Timeout) // keeps a read pending so the pong is seen
		read <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), gwtest.Timeout)
	defer cancel()
	if err := c.C.Ping(ctx); err != nil {
		t.Fatalf("ping after a quiet spell: %v", err)
	}
	if err := c.C.Write(ctx, websocket.MessageText, []byte(`nonsense`)); err != nil {
		t.Fatal(err)
	}
	if err := <-read; err != nil {
		t.Fatalf("frame after a quiet spell: %v", err)
	}
}
