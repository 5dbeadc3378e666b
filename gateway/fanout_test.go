package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/syncgate/syncgate/client"
	"github.com/syncgate/syncgate/frames"
	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/internal/gwtest"
)

// orderedCounter checks that a subscription's patches arrive in offset order
// and signals when it has seen want of them.
type orderedCounter struct {
	want int
	done chan struct{}

	c *client.Client // for diagnostics

	mu   sync.Mutex
	n    int
	last string
	err  error
}

func newOrderedCounter(want int) *orderedCounter {
	return &orderedCounter{want: want, done: make(chan struct{})}
}

func (o *orderedCounter) patch(p *frames.Patch) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, op := range p.Patches {
		if op.LSN <= o.last && o.err == nil {
			o.err = fmt.Errorf("lsn %s after %s", op.LSN, o.last)
		}
		o.last = op.LSN
		o.n++
		if o.n == o.want {
			close(o.done)
		}
	}
}

func (o *orderedCounter) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n
}

func dialClient(t testing.TB, url string, opts *client.Options) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), gwtest.Timeout)
	defer cancel()
	c, err := client.Dial(ctx, url, opts)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// publishAll pipelines n publishes to topic and waits for every ack.
func publishAll(t testing.TB, pub *client.Client, topic string, n int, data func(i int) string) {
	t.Helper()
	var wg sync.WaitGroup
	var failed atomic.Int64
	var firstErr atomic.Value
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range n {
		wg.Add(1)
		err := pub.PublishAsync(ctx, topic, json.RawMessage(data(i)), func(_ string, err error) {
			if err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err)
			}
			wg.Done()
		})
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	wg.Wait()
	if f := failed.Load(); f > 0 {
		t.Fatalf("%d publishes failed, first: %v", f, firstErr.Load())
	}
}

// waitCount polls until every counter has seen at least n patches.
func waitCount(t testing.TB, counters []*orderedCounter, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for i, c := range counters {
		for c.count() < n {
			if time.Now().After(deadline) {
				var err error
				if c.c != nil {
					select {
					case <-c.c.Done():
						err = c.c.Err()
					default:
					}
				}
				t.Fatalf("subscriber %d got %d of %d within %v (connection error: %v)", i, c.count(), n, timeout, err)
			}
			select {
			case <-c.done:
			case <-time.After(time.Millisecond):
			}
		}
	}
}

func waitAll(t testing.TB, counters []*orderedCounter, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for i, c := range counters {
		select {
		case <-c.done:
		case <-deadline:
			t.Fatalf("subscriber %d got %d of %d within %v", i, c.count(), c.want, timeout)
		}
		c.mu.Lock()
		err := c.err
		c.mu.Unlock()
		if err != nil {
			t.Fatalf("subscriber %d: %v", i, err)
		}
	}
}

// TestGateway_Fanout1000x1000: 1,000 subscribers on one topic each receive
// all 1,000 messages in publish order.
func TestGateway_Fanout1000x1000(t *testing.T) {
	const subs, msgs = 1000, 1000
	srv := newTestServer(t, gateway.Config{})
	counters := make([]*orderedCounter, subs)
	for i := range counters {
		counters[i] = newOrderedCounter(msgs)
		c := dialClient(t, srv.url, nil)
		if _, err := c.Subscribe(t.Context(), "big", nil, counters[i].patch); err != nil {
			t.Fatal(err)
		}
	}
	pub := dialClient(t, srv.url, nil)
	publishAll(t, pub, "big", msgs, func(i int) string { return fmt.Sprintf(`{"i":%d}`, i) })
	waitAll(t, counters, 2*time.Minute)
}

// smallBufListener shrinks the kernel send buffer of accepted connections,
// so a client that stops reading backs up into the gateway's queue after
// kilobytes rather than megabytes.
type smallBufListener struct{ net.Listener }

func (l smallBufListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(8 << 10)
	}
	return c, err
}

// startSmallBuf serves gw on loopback with small kernel send buffers (see
// smallBufListener), shut down when the test ends.
func startSmallBuf(t *testing.T, gw *gateway.Server) *httptest.Server {
	t.Helper()
	ts := httptest.NewUnstartedServer(gw.Handler())
	ts.Listener = smallBufListener{ts.Listener}
	ts.Start()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = gw.Shutdown(ctx)
		ts.Close()
	})
	return ts
}

// TestGateway_StalledClientDoesNotSlowOthers: one client that never reads
// must not stop 100 others from getting every message; it is closed as a
// slow consumer and counted in /metrics. Both ways of writing: the shared
// writers (whose write to the stalled socket must hand over to a goroutine
// of the session's own, counted in syncgate_writes_blocked_total) and a
// goroutine per busy session.
func TestGateway_StalledClientDoesNotSlowOthers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		writers int
	}{{"shared writers", 0}, {"goroutine per session", -1}} {
		t.Run(tc.name, func(t *testing.T) { testStalledClient(t, tc.writers) })
	}
}

func testStalledClient(t *testing.T, writers int) {
	if writers >= 0 {
		skipWithoutSharedWriters(t)
	}
	const healthy, msgs = 100, 1000
	gw, err := gateway.New(gateway.Config{SendQueueBytes: 128 << 10, SendQueueMessages: 100000, WriteTimeout: 5 * time.Second, Writers: writers})
	if err != nil {
		t.Fatal(err)
	}
	ts := startSmallBuf(t, gw)
	url := gwtest.WSURL(ts.URL)

	dialStalled(t, url, "room") // closed at cleanup

	counters := make([]*orderedCounter, healthy)
	for i := range counters {
		counters[i] = newOrderedCounter(msgs)
		c := dialClient(t, url, nil)
		counters[i].c = c
		if _, err := c.Subscribe(t.Context(), "room", nil, counters[i].patch); err != nil {
			t.Fatal(err)
		}
	}
	// Publish in chunks and let the healthy subscribers catch up after each,
	// so only the stalled one can fall a queue behind, however slow this
	// machine (or the race detector) makes the healthy readers.
	pub := dialClient(t, url, nil)
	payload := `"` + strings.Repeat("x", 1000) + `"`
	const chunk = 50
	for sent := 0; sent < msgs; sent += chunk {
		publishAll(t, pub, "room", chunk, func(int) string { return payload })
		waitCount(t, counters, sent+chunk, time.Minute)
	}
	waitAll(t, counters, time.Minute)

	metrics := scrape(t, ts.URL)
	if !strings.Contains(metrics, `syncgate_closes_total{reason="slow_consumer"} 1`) {
		t.Fatalf("slow consumer not counted:\n%s", grepLines(metrics, "syncgate_closes_total"))
	}
	if !strings.Contains(metrics, `syncgate_drops_total{reason="queue_full"} 1`) {
		t.Fatalf("queue_full drop not counted:\n%s", grepLines(metrics, "syncgate_drops_total"))
	}
	blockedNone := strings.Contains(metrics, "syncgate_writes_blocked_total 0\n")
	if shared := writers >= 0; shared == blockedNone {
		t.Fatalf("shared writers %v, but:\n%s", shared, grepLines(metrics, "syncgate_writes_blocked_total"))
	}
}

// TestGateway_DeliveryLatencyAtFlush: a message a shared writer leaves
// pending on a full socket is observed in syncgate_delivery_latency_seconds
// once the rest of it has gone into the socket, not when its write began.
func TestGateway_DeliveryLatencyAtFlush(t *testing.T) {
	skipWithoutSharedWriters(t)
	gw, err := gateway.New(gateway.Config{MaxFrameBytes: 1 << 20, WriteTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ts := startSmallBuf(t, gw)
	url := gwtest.WSURL(ts.URL)
	stalled := dialStalled(t, url, "big")
	stalled.SetReadLimit(2 << 20)
	pub := gwtest.Dial(t, url, nil)
	pub.Hello("", 0)

	// Half a megabyte does not fit in the two sockets' small buffers.
	if ack := pub.Publish("k", 0, "big", `"`+strings.Repeat("x", 512<<10)+`"`); ack.Error != nil {
		t.Fatalf("publish: %+v", ack.Error)
	}
	acked := time.Now()
	gwtest.Eventually(t, gwtest.Timeout, "the write to the stalled client blocks", func() bool {
		return metricValue(t, scrape(t, ts.URL), "syncgate_writes_blocked_total") >= 1
	})
	if n := metricValue(t, scrape(t, ts.URL), "syncgate_delivery_latency_seconds_count"); n != 0 {
		t.Fatalf("%v deliveries observed while the only patch is still pending", n)
	}

	reading := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), gwtest.Timeout)
	defer cancel()
	_, msg, err := stalled.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if f, err := frames.Decode(msg); err != nil {
		t.Fatalf("the pending message: %v", err)
	} else if _, ok := f.(*frames.Patch); !ok || len(msg) < 512<<10 {
		t.Fatalf("the pending message is a %s of %d bytes, want the patch", f.FrameType(), len(msg))
	}
	var metrics string
	gwtest.Eventually(t, gwtest.Timeout, "the delivery observed", func() bool {
		metrics = scrape(t, ts.URL)
		return metricValue(t, metrics, "syncgate_delivery_latency_seconds_count") == 1
	})
	// The flush ended after the client began to read, and the patch was
	// published before its ack came.
	if sum, least := metricValue(t, metrics, "syncgate_delivery_latency_seconds_sum"), reading.Sub(acked).Seconds(); sum < least {
		t.Fatalf("delivery latency %.6f s, want at least %.6f s (from the ack to the first read)", sum, least)
	}
}

// skipWithoutSharedWriters skips a test of the shared writers' handover
// on a system where every session writes on a goroutine of its own (the
// gateway writes without waiting only on Linux, macOS and OpenBSD).
func skipWithoutSharedWriters(t *testing.T) {
	switch runtime.GOOS {
	case "linux", "darwin", "openbsd":
	default:
		t.Skip("no shared writers on " + runtime.GOOS)
	}
}

// dialStalled opens a session subscribed to topic that reads its hello, the
// subscription's ack and snapshot, then nothing until the test reads
// again; its receive buffer is small, so the gateway's writes back up
// after kilobytes. The connection is closed when the test ends.
func dialStalled(t *testing.T, url, topic string) *websocket.Conn {
	t.Helper()
	dialer := &net.Dialer{}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dialer.DialContext(ctx, network, addr)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetReadBuffer(8 << 10)
		}
		return c, err
	}}}
	ctx, cancel := context.WithTimeout(context.Background(), gwtest.Timeout)
	defer cancel()
	stalled, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPClient: hc})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stalled.CloseNow() })
	send := func(s string) {
		if err := stalled.Write(ctx, websocket.MessageText, []byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	send(`{"type":"hello","v":1,"buildId":"","sessionId":null,"actorId":null,"resume":[]}` + "\n" +
		`{"type":"subscribe","v":1,"op":"add","sid":"s","target":{"kind":"topic","topic":"` + topic + `","cursor":null}}`)
	for subscribed := false; !subscribed; { // up to the snapshot: subscribed before the publishes
		_, msg, err := stalled.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		frames.Split(msg, func(line []byte) bool {
			f, err := frames.Decode(line)
			if err != nil {
				t.Fatalf("stalled client's setup: %v", err)
			}
			_, subscribed = f.(*frames.Snapshot)
			return !subscribed
		})
	}
	return stalled
}

func scrape(t testing.TB, baseURL string) string {
	t.Helper()
	resp, err := http.Get(baseURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func grepLines(s, prefix string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
