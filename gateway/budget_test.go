package gateway_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/syncgate/syncgate/frames"
	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/internal/gwtest"
)

// overloadClient is one client of the overload test: it connects, and when
// refused it waits afterMs and tries again, as the protocol says.
type overloadClient struct {
	refusals  []frames.Reconnect
	codes     []websocket.StatusCode
	admitted  time.Time
	conn      *websocket.Conn
	failure   error
	attempted int
}

// connect tries until admitted or the deadline. An admitted client has
// its hello answered and stays connected.
func (c *overloadClient) connect(url string, deadline time.Time) {
	for time.Now().Before(deadline) {
		c.attempted++
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		conn, _, err := websocket.Dial(ctx, url, nil)
		if err != nil {
			cancel()
			c.failure = err
			return
		}
		hello, _ := frames.Encode(&frames.Hello{BuildID: "", Resume: []frames.Cursor{}})
		_ = conn.Write(ctx, websocket.MessageText, hello)
		_, msg, err := conn.Read(ctx)
		if err != nil {
			cancel()
			c.failure = err
			_ = conn.CloseNow()
			return
		}
		f, err := frames.Decode(msg)
		if err != nil {
			cancel()
			c.failure = err
			_ = conn.CloseNow()
			return
		}
		switch f := f.(type) {
		case *frames.Hello:
			c.admitted = time.Now()
			c.conn = conn
			cancel()
			return
		case *frames.Reconnect:
			c.refusals = append(c.refusals, *f)
			_, _, err := conn.Read(ctx)
			var ce websocket.CloseError
			if errors.As(err, &ce) {
				c.codes = append(c.codes, ce.Code)
			} else {
				c.codes = append(c.codes, -1)
			}
			_ = conn.CloseNow()
			cancel()
			time.Sleep(time.Duration(f.AfterMs) * time.Millisecond) // honour afterMs: the behaviour under test
		default:
			cancel()
			c.failure = errors.New("unexpected first frame " + string(f.FrameType()))
			_ = conn.CloseNow()
			return
		}
	}
}

// TestOverload_RefusedClientsComeBackInStep: 5,000 clients connect at once
// to a node admitting 500 a second (burst 500). The node admits within its
// budget every second; every refused client gets a reconnect frame
// {afterMs > 0, reason "overload"} and close 1013; and, honouring afterMs,
// all are connected within the time the bucket needs, (5000-500)/500 s,
// plus a margin.
//
// Not parallel: 10,000 sockets at once would starve the package's other
// tests of CPU and be starved by them on a small machine, and a client
// whose SYNs the full listen backlog dropped waits out TCP's retransmit
// backoff (1 s, 3 s, 7 s, ...), which is not the budget under test.
func TestOverload_RefusedClientsComeBackInStep(t *testing.T) {
	if testing.Short() {
		t.Skip("5,000 connections over about 10 s")
	}
	const (
		clients = 5000
		rate    = 500
		burst   = 500
	)
	gw, err := gateway.New(gateway.Config{
		AcceptRate: rate, AcceptBurst: burst,
		Rand: rand.New(rand.NewPCG(9, 9)),
	})
	if err != nil {
		t.Fatal(err)
	}
	// The server's own admission times: what the clients observe comes a
	// CPU-dependent moment later.
	var admitMu sync.Mutex
	var admits []time.Time
	gateway.SetAdmitHookForTest(gw, func(now time.Time, ok bool) {
		if ok {
			admitMu.Lock()
			admits = append(admits, now)
			admitMu.Unlock()
		}
	})
	srv := newTestServerFor(t, gw)
	cs := make([]*overloadClient, clients)
	for i := range cs {
		cs[i] = &overloadClient{}
	}
	expected := time.Duration(clients-burst) * time.Second / rate
	start := time.Now()
	deadline := start.Add(expected + 20*time.Second)
	var wg sync.WaitGroup
	go1 := make(chan struct{})
	for _, c := range cs {
		wg.Go(func() {
			<-go1
			c.connect(srv.url, deadline)
		})
	}
	close(go1)
	wg.Wait()
	defer func() {
		for _, c := range cs {
			if c.conn != nil {
				_ = c.conn.CloseNow()
			}
		}
	}()

	var admitted []time.Duration
	refused := 0
	for i, c := range cs {
		if c.failure != nil || c.conn == nil {
			t.Fatalf("client %d: not admitted after %d attempts: %v", i, c.attempted, c.failure)
		}
		admitted = append(admitted, c.admitted.Sub(start))
		for j, r := range c.refusals {
			refused++
			if r.Reason != frames.ReasonOverload || r.AfterMs <= 0 {
				t.Fatalf("client %d refusal %d: %+v", i, j, r)
			}
			if c.codes[j] != websocket.StatusTryAgainLater {
				t.Fatalf("client %d refusal %d: close %d, want 1013", i, j, c.codes[j])
			}
		}
	}
	slices.Sort(admitted)
	last := admitted[len(admitted)-1]
	// How many are refused depends on how fast this machine completes
	// 5,000 handshakes (the bucket refills meanwhile); some must be.
	if refused == 0 {
		t.Fatal("no refusals: the budget did not act")
	}
	// Within budget: no one-second window of the server's admissions holds
	// more than rate + burst.
	admitMu.Lock()
	at := slices.Clone(admits)
	admitMu.Unlock()
	slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
	if len(at) != clients {
		t.Fatalf("%d admissions for %d clients", len(at), clients)
	}
	most, j := 0, 0
	for i := range at {
		for at[i].Sub(at[j]) >= time.Second {
			j++
		}
		most = max(most, i-j+1)
	}
	if most > rate+burst {
		t.Fatalf("%d admitted in one second, over rate+burst %d", most, rate+burst)
	}
	if last > expected+5*time.Second {
		t.Fatalf("last client admitted at %v, want by %v (+5s)", last, expected)
	}
	t.Logf("%d clients, %d refusals (%.2f per refused client), max %d admitted in a second, last at %v (bucket needs %v)",
		clients, refused, float64(refused)/float64(clients-burst), most, last.Round(time.Millisecond), expected)
	m := scrape(t, srv.ts.URL)
	if !strings.Contains(m, `syncgate_sessions_rejected_total{reason="rate_limit"}`) {
		t.Error("metrics lack the rate_limit refusals")
	}
}

// TestOverload_PlainRequestGets503: a non-WebSocket request over budget is
// answered 503 with Retry-After; so is one over the session cap.
func TestOverload_PlainRequestGets503(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{AcceptRate: 1, AcceptBurst: 1, MaxSessions: 1})
	first, _, err := websocket.Dial(t.Context(), srv.url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer first.CloseNow()
	resp, err := http.Get(srv.ts.URL + "/v1/ws")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("plain GET over budget: %s, Retry-After %q", resp.Status, resp.Header.Get("Retry-After"))
	}
	m := scrape(t, srv.ts.URL)
	if !strings.Contains(m, `syncgate_sessions_rejected_total{reason="max_sessions"} 1`) {
		t.Errorf("metrics: want one max_sessions refusal:\n%s", grepLines(m, "rejected"))
	}
}

// TestOverload_RefusalCap: while MaxRefusing refusals are under way, a
// WebSocket client over the budget is not upgraded only to be told to
// reconnect: it gets a plain 503 with Retry-After. Once they end, a
// refused client is upgraded and told again.
func TestOverload_RefusalCap(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{MaxSessions: 1, AcceptRate: -1})
	first := gwtest.Dial(t, srv.url, nil)
	first.Hello("", 0)
	gateway.AddRefusingForTest(srv.gw, gateway.MaxRefusing)
	_, resp, err := websocket.Dial(t.Context(), srv.url, nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("refusal over the cap: %v, response %v; want a plain 503", err, resp)
	}
	if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || secs < 1 || secs > 10 {
		t.Errorf("Retry-After = %q, want the node-full range 1-10 s", resp.Header.Get("Retry-After"))
	}
	gateway.AddRefusingForTest(srv.gw, -gateway.MaxRefusing)
	f, c := firstFrame(t, srv.url)
	defer c.CloseNow()
	if r, ok := f.(*frames.Reconnect); !ok || r.Reason != frames.ReasonOverload {
		t.Fatalf("under the cap: %+v, want a reconnect frame", f)
	}
}

// TestOverload_MaxSessions: over the cap a WebSocket client is told to
// come back later; once a session leaves, a new one gets in.
func TestOverload_MaxSessions(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{MaxSessions: 2, AcceptRate: -1})
	var keep []*websocket.Conn
	for range 2 {
		c, _, err := websocket.Dial(t.Context(), srv.url, nil)
		if err != nil {
			t.Fatal(err)
		}
		keep = append(keep, c)
	}
	c, _, err := websocket.Dial(t.Context(), srv.url, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, msg, err := c.Read(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	f, err := frames.Decode(msg)
	if r, ok := f.(*frames.Reconnect); err != nil || !ok || r.Reason != frames.ReasonOverload || r.AfterMs < 1000 {
		t.Fatalf("over the cap: %+v %v", f, err)
	}
	if _, _, err := c.Read(t.Context()); websocket.CloseStatus(err) != websocket.StatusTryAgainLater {
		t.Fatalf("over the cap: %v, want close 1013", err)
	}
	_ = keep[0].Close(websocket.StatusNormalClosure, "")
	gwtest.Eventually(t, 5*time.Second, "the session that left is unregistered", func() bool {
		return strings.Contains(scrape(t, srv.ts.URL), "\nsyncgate_sessions 1\n")
	})
	in := gwtest.Dial(t, srv.url, nil)
	in.Hello("", 0)
	_ = keep[1].CloseNow()
}

// firstFrame dials url, sends hello and returns the server's first frame:
// its hello if admitted, a reconnect if refused.
func firstFrame(t *testing.T, url string) (frames.Frame, *websocket.Conn) {
	t.Helper()
	c, _, err := websocket.Dial(t.Context(), url, nil)
	if err != nil {
		t.Fatal(err)
	}
	hello, err := frames.Encode(&frames.Hello{Resume: []frames.Cursor{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Write(t.Context(), websocket.MessageText, hello); err != nil {
		t.Fatal(err)
	}
	_, msg, err := c.Read(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	f, err := frames.Decode(msg)
	if err != nil {
		t.Fatal(err)
	}
	return f, c
}

// TestOverload_NoTokenForRequestsThatAreNoSessions: a plain GET of the
// WebSocket endpoint (426) and a client refused for its address spend no
// accept token. The clock stands still, so the bucket never refills.
func TestOverload_NoTokenForRequestsThatAreNoSessions(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	srv := newTestServer(t, gateway.Config{AcceptRate: 1, AcceptBurst: 2, MaxSessionsPerIP: 1,
		Now: func() time.Time { return now }})
	for range 3 {
		resp, err := http.Get(srv.ts.URL + "/v1/ws")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUpgradeRequired {
			t.Fatalf("plain GET: %s, want 426", resp.Status)
		}
	}
	f1, c1 := firstFrame(t, srv.url)
	if _, ok := f1.(*frames.Hello); !ok {
		t.Fatalf("first client after plain GETs: %+v, want hello", f1)
	}
	for range 3 { // over the per-address cap
		f, c := firstFrame(t, srv.url)
		c.CloseNow()
		if r, ok := f.(*frames.Reconnect); !ok || r.Reason != frames.ReasonOverload {
			t.Fatalf("client over the address cap: %+v", f)
		}
	}
	_ = c1.Close(websocket.StatusNormalClosure, "")
	gwtest.Eventually(t, 5*time.Second, "the first session unregistered", func() bool {
		return strings.Contains(scrape(t, srv.ts.URL), "\nsyncgate_sessions 0\n")
	})
	f2, c2 := firstFrame(t, srv.url)
	defer c2.CloseNow()
	if _, ok := f2.(*frames.Hello); !ok {
		t.Fatalf("second session, with a token left of the burst of 2: %+v\n%s", f2, grepLines(scrape(t, srv.ts.URL), "syncgate_sessions_rejected"))
	}
	m := scrape(t, srv.ts.URL)
	for _, want := range []string{`{reason="per_ip"} 3`, `{reason="handshake"} 3`, `{reason="rate_limit"} 0`} {
		if !strings.Contains(m, "syncgate_sessions_rejected_total"+want) {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(m, "syncgate_sessions_rejected"))
		}
	}
}

// TestOverload_FailedRefusalCountsAsHandshake: an over-budget request that
// asks for an upgrade but fails the handshake (a wrong version) is
// counted as a failed handshake, not as a refusal it never received.
func TestOverload_FailedRefusalCountsAsHandshake(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	srv := newTestServer(t, gateway.Config{AcceptRate: 1, AcceptBurst: 1, Now: func() time.Time { return now }})
	f, c := firstFrame(t, srv.url) // the only token
	defer c.CloseNow()
	if _, ok := f.(*frames.Hello); !ok {
		t.Fatalf("first client: %+v", f)
	}
	req, err := http.NewRequest("GET", srv.ts.URL+"/v1/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "12")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		t.Fatalf("version 12 upgraded")
	}
	m := scrape(t, srv.ts.URL)
	for _, want := range []string{`{reason="handshake"} 1`, `{reason="rate_limit"} 0`} {
		if !strings.Contains(m, "syncgate_sessions_rejected_total"+want) {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(m, "syncgate_sessions_rejected"))
		}
	}
}
