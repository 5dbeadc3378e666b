package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/syncgate/syncgate/frames"
	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/internal/gwtest"
	"github.com/syncgate/syncgate/storage"
)

// drained is what one client saw of a drain.
type drained struct {
	afterMs  int64
	reason   string
	gotAt    time.Time // when the reconnect frame arrived
	closedAt time.Time
	code     websocket.StatusCode
	err      error
}

// watchDrain reads c until it closes, recording the reconnect frame.
func watchDrain(c *gwtest.Conn) drained {
	var d drained
	for {
		f, err := c.NextErr(gwtest.Timeout)
		if err != nil {
			d.closedAt = time.Now()
			var ce websocket.CloseError
			if errors.As(err, &ce) {
				d.code = ce.Code
			} else {
				d.err = err
			}
			return d
		}
		if r, ok := f.(*frames.Reconnect); ok && d.gotAt.IsZero() {
			d.afterMs, d.reason, d.gotAt = r.AfterMs, r.Reason, time.Now()
		}
	}
}

// TestDrain_SpreadsSessionsAndLosesNothing drains a node of 200 sessions
// over 2 s: /readyz fails from the start, every session gets its own
// afterMs inside the spread and is closed with 1012 no earlier than it,
// new clients are turned away with a reconnect frame, Drain returns in
// time, and every publish the log acknowledged during the drain is in the
// log.
func TestDrain_SpreadsSessionsAndLosesNothing(t *testing.T) {
	t.Parallel()
	const (
		n      = 200
		spread = 2 * time.Second
		grace  = 2 * time.Second
	)
	db, err := storage.Open(filepath.Join(t.TempDir(), "log.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(gateway.Config{
		Log: db, Persist: []string{"chat:*"},
		DrainSpread: spread, DrainGrace: grace,
		Rand: rand.New(rand.NewPCG(1, 2)),
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := newTestServerFor(t, gw)
	t.Cleanup(func() {
		srv.close(t)
		if err := db.Close(); err != nil {
			t.Errorf("db close: %v", err)
		}
	})

	conns := make([]*gwtest.Conn, n)
	for i := range conns {
		conns[i] = gwtest.Dial(t, srv.url, nil)
		conns[i].Hello("", 0)
	}
	pub := gwtest.Dial(t, srv.url, nil)
	pub.Hello("publisher", 1)
	pub.Subscribe("s", "chat:room")

	// The publisher keeps publishing through the drain; it records what
	// was acknowledged, and what it saw of the drain.
	var acked []string // keys of the publishes acknowledged without an error
	pubDone := make(chan drained, 1)
	go func() {
		var d drained
		for seq := int64(0); ; seq++ {
			// A write that fails (the drain closed the connection) is seen
			// by the read below, which ends the loop.
			_ = pub.SendErr(&frames.Mutate{Key: fmt.Sprintf("k%d", seq), Seq: seq, Name: "publish",
				Input: []byte(fmt.Sprintf(`{"topic":"chat:room","data":%d}`, seq))})
			for {
				f, err := pub.NextErr(gwtest.Timeout)
				if err != nil {
					var ce websocket.CloseError
					if errors.As(err, &ce) {
						d.code = ce.Code
					}
					d.closedAt = time.Now()
					pubDone <- d
					return
				}
				if r, ok := f.(*frames.Reconnect); ok {
					d.afterMs, d.reason, d.gotAt = r.AfterMs, r.Reason, time.Now()
				}
				if a, ok := f.(*frames.Ack); ok && a.Ref == fmt.Sprintf("k%d", seq) {
					if a.Error == nil {
						acked = append(acked, a.Ref)
					}
					break
				}
			}
		}
	}()

	start := time.Now()
	drainErr := make(chan error, 1)
	go func() { drainErr <- gw.Drain(context.Background()) }()

	results := make([]drained, n)
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() { results[i] = watchDrain(c) })
	}

	// Readiness fails from the start (the drain flips it before it sends
	// anything) and stays failed.
	gwtest.Eventually(t, time.Second, "readyz 503", func() bool {
		return get(t, srv.ts.URL+"/readyz") == http.StatusServiceUnavailable
	})
	// A new client is turned away, told when to come back.
	late := gwtest.Dial(t, srv.url, nil)
	r := gwtest.Expect[*frames.Reconnect](late)
	if r.Reason != frames.ReasonDrain || r.AfterMs <= 0 || r.AfterMs > 1000 {
		t.Fatalf("late client: %+v", r)
	}
	late.ExpectClose(websocket.StatusServiceRestart)
	resp, err := http.Get(srv.ts.URL + "/v1/ws")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("plain GET /v1/ws during the drain: %s, Retry-After %q", resp.Status, resp.Header.Get("Retry-After"))
	}

	select {
	case err := <-drainErr:
		if err != nil {
			t.Fatalf("drain: %v", err)
		}
	case <-time.After(spread + grace + 5*time.Second):
		t.Fatal("drain did not return")
	}
	took := time.Since(start)
	if took > spread+grace {
		t.Errorf("drain took %v, over spread+grace %v", took, spread+grace)
	}
	if code := get(t, srv.ts.URL+"/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("readyz %d after the drain, want 503 still", code)
	}
	wg.Wait()
	pd := <-pubDone

	seen := map[int64]bool{}
	for i, d := range append(results, pd) {
		if d.err != nil || d.code != websocket.StatusServiceRestart {
			t.Fatalf("session %d: close %d, err %v; want 1012", i, d.code, d.err)
		}
		if d.reason != frames.ReasonDrain || d.gotAt.IsZero() {
			t.Fatalf("session %d: no reconnect frame (reason %q)", i, d.reason)
		}
		if d.afterMs < 0 || time.Duration(d.afterMs)*time.Millisecond >= spread {
			t.Fatalf("session %d: afterMs %d outside the spread %v", i, d.afterMs, spread)
		}
		if seen[d.afterMs] {
			t.Fatalf("session %d: afterMs %d given twice", i, d.afterMs)
		}
		seen[d.afterMs] = true
		if early := d.gotAt.Add(time.Duration(d.afterMs) * time.Millisecond).Sub(d.closedAt); early > 0 {
			t.Fatalf("session %d: closed %v before its afterMs %d", i, early, d.afterMs)
		}
	}
	// The slots cover the spread: each half holds about half the sessions.
	firstHalf := 0
	for ms := range seen {
		if time.Duration(ms)*time.Millisecond < spread/2 {
			firstHalf++
		}
	}
	if firstHalf < (n+1)/2-2 || firstHalf > (n+1)/2+2 {
		t.Fatalf("%d of %d sessions in the first half of the spread", firstHalf, n+1)
	}

	// Nothing acknowledged was lost: every acked offset is in the log.
	if len(acked) == 0 {
		t.Fatal("no publish acknowledged during the drain")
	}
	body := readStream(t, srv.ts.URL+"/v1/stream/chat:room?offset=-1")
	recs := strings.Count(body, `"key":`)
	if recs < len(acked) {
		t.Fatalf("log holds %d records, %d were acknowledged", recs, len(acked))
	}
	for _, key := range acked {
		if !strings.Contains(body, fmt.Sprintf(`"key":%q`, key)) {
			t.Fatalf("acknowledged publish %s is not in the log", key)
		}
	}
	m := scrape(t, srv.ts.URL)
	for _, want := range []string{
		fmt.Sprintf(`syncgate_closes_total{reason="drain"} %d`, n+1),
		`syncgate_sessions_rejected_total{reason="draining"} 2`,
		"syncgate_draining 1",
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func readStream(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %v", url, resp.Status, err)
	}
	return string(b)
}

// TestDrain_CutsAtDeadline: a session that never answers the close
// handshake is cut when ctx ends, and Drain says so.
func TestDrain_CutsAtDeadline(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{DrainSpread: 50 * time.Millisecond, DrainGrace: 30 * time.Second})
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("", 0)
	// c reads nothing from here on: the server's close handshake waits
	// for it.
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := srv.gw.Drain(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("drain: %v, want the deadline", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("drain took %v after its deadline", took)
	}
	// Drain again joins the finished drain.
	if err := srv.gw.Drain(context.Background()); err != nil {
		t.Fatalf("second drain: %v", err)
	}
}

// TestDrain_EmptyNodeAndShutdown: draining a node without sessions returns
// at once; Shutdown after it still works, and Drain after Shutdown too.
func TestDrain_EmptyNodeAndShutdown(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{})
	if err := srv.gw.Drain(t.Context()); err != nil {
		t.Fatal(err)
	}
	if code := get(t, srv.ts.URL+"/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("readyz after drain: %d", code)
	}
	srv.close(t)
	if err := srv.gw.Drain(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestDrain_CutsSessionsAlreadyClosing: a session whose close handshake is
// under way when the drain's time is up (its close frame went out, the
// peer never answers) is cut too. coder/websocket's CloseNow does not end
// a Close in progress, so the drain once waited out the library's 5 s.
func TestDrain_CutsSessionsAlreadyClosing(t *testing.T) {
	t.Parallel()
	// Slot close at about spread + grace/2 = 101 ms; the cut at 201 ms.
	srv := newTestServer(t, gateway.Config{DrainSpread: time.Millisecond, DrainGrace: 200 * time.Millisecond})
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("", 0)
	// c reads nothing from here on.
	start := time.Now()
	err := srv.gw.Drain(context.Background())
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("drain: %v, want it to say it cut a session", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("drain took %v, its bound spread + grace is 201ms", took)
	}
}

// TestDrain_ShutdownCutsRefusals: a client turned away by a draining node
// (reconnect, then close 1012) that never answers the close is cut when
// Shutdown's ctx ends, as sessions are.
func TestDrain_ShutdownCutsRefusals(t *testing.T) {
	t.Parallel()
	// The refusal would wait a minute for the close: only Shutdown's
	// cut ends it within shutdownCuts' bound.
	srv := silentRefusal(t, time.Minute)
	shutdownCuts(t, srv)
}

// silentRefusal starts a node whose refusals wait at most wait for a
// client's close (0: the default), drains it (it has no sessions, so it
// stays draining) and has one client turned away by it that reads
// nothing: its refusal has written the reconnect frame and waits for a
// close this client never sends.
func silentRefusal(t *testing.T, wait time.Duration) *testServer {
	t.Helper()
	gw, err := gateway.New(gateway.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if wait > 0 {
		gateway.SetRefusalWaitForTest(gw, wait)
	}
	srv := newTestServerFor(t, gw)
	if err := srv.gw.Drain(t.Context()); err != nil {
		t.Fatal(err)
	}
	c, _, err := websocket.Dial(t.Context(), srv.url, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.CloseNow() })
	gwtest.Eventually(t, gwtest.Timeout, "the reconnect frame written", func() bool {
		return strings.Contains(scrape(t, srv.ts.URL), `syncgate_frames_out_total{type="reconnect"} 1`)
	})
	return srv
}

// TestDrain_RefusalWaitsASecondForClose: a refused client that never
// answers the close is let go after about a second (the library alone
// would wait 5 s), so a Shutdown with a 4 s ctx finds it gone.
func TestDrain_RefusalWaitsASecondForClose(t *testing.T) {
	t.Parallel()
	srv := silentRefusal(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	if err := srv.gw.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown waited out its 4 s for one refusal: %v", err)
	}
}

// TestDrain_SlotsKeepTimeWithAnInjectedClock: the drain waits on real
// timers, so its slots must be timed on the real clock too, whatever
// Config.Now says. With a clock that stands still (as several tests
// inject), each slot's wait was counted from the drain's start again
// after the previous slot's: session k was closed at the sum of the
// first k slots, and the later ones were cut at the deadline instead of
// closed with 1012.
func TestDrain_SlotsKeepTimeWithAnInjectedClock(t *testing.T) {
	t.Parallel()
	const (
		n      = 5
		spread = 500 * time.Millisecond
		grace  = 2 * time.Second
		// overlap is min(1 s, grace/2); slack is what a loaded machine
		// may add to a close that is on time.
		overlap = time.Second
		slack   = time.Second
	)
	frozen := time.Unix(1_700_000_000, 0)
	srv := newTestServer(t, gateway.Config{DrainSpread: spread, DrainGrace: grace,
		Now: func() time.Time { return frozen }})
	conns := make([]*gwtest.Conn, n)
	for i := range conns {
		conns[i] = gwtest.Dial(t, srv.url, nil)
		conns[i].Hello("", 0)
	}
	results := make([]drained, n)
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Go(func() { results[i] = watchDrain(c) })
	}
	start := time.Now()
	if err := srv.gw.Drain(t.Context()); err != nil {
		t.Errorf("drain: %v", err)
	}
	wg.Wait()
	for i, d := range results {
		if d.code != websocket.StatusServiceRestart || d.gotAt.IsZero() {
			t.Errorf("session %d (afterMs %d, reconnect frame seen %v): close %d, err %v; want 1012 at its slot",
				i, d.afterMs, !d.gotAt.IsZero(), d.code, d.err)
			continue
		}
		if late := d.closedAt.Sub(start) - time.Duration(d.afterMs)*time.Millisecond - overlap; late > slack {
			t.Errorf("session %d: closed %v after its afterMs %d plus the overlap", i, late, d.afterMs)
		}
	}
}

// TestDrain_DuringShutdownWaitsForSessions: a Drain that begins while
// Shutdown is still closing the sessions returns only once they are gone
// (or cut at its deadline), as its doc says. It returned nil at once,
// with a session still in its close handshake: a caller that then closed
// the log took the drain for done.
func TestDrain_DuringShutdownWaitsForSessions(t *testing.T) {
	t.Parallel()
	const spread, grace = 50 * time.Millisecond, 200 * time.Millisecond
	srv := newTestServer(t, gateway.Config{DrainSpread: spread, DrainGrace: grace})
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("", 0)
	// c reads nothing from here on: Shutdown's close handshake with it
	// waits (coder/websocket gives a silent peer 5 s).
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), gwtest.Timeout)
		defer cancel()
		shut <- srv.gw.Shutdown(ctx)
	}()
	gwtest.Eventually(t, gwtest.Timeout, "Shutdown closing the session", func() bool {
		return strings.Contains(scrape(t, srv.ts.URL), `syncgate_closes_total{reason="shutdown"} 1`)
	})
	start := time.Now()
	err := srv.gw.Drain(t.Context())
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("drain during Shutdown: %v after %v, want it to cut the session still closing at spread+grace",
			err, time.Since(start))
	}
	select {
	case err := <-shut:
		if err != nil {
			t.Errorf("shutdown: %v", err)
		}
	case <-time.After(gwtest.Timeout):
		t.Fatal("shutdown did not return")
	}
}
