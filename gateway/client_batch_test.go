package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/syncgate/syncgate/client"
	"github.com/syncgate/syncgate/gateway"
)

// TestClient_BatchesFitServerLimit: the Go client batches pipelined
// publishes (16 KiB by default), and a gateway that accepts smaller client
// messages says so in its hello (maxMessage), so no batch is closed with
// 1009 and every publish arrives, in order.
func TestClient_BatchesFitServerLimit(t *testing.T) {
	t.Parallel()
	const n = 2000
	srv := newTestServer(t, gateway.Config{MaxFrameBytes: 1024})
	sub := dialClient(t, srv.url, nil)
	counter := newOrderedCounter(n)
	counter.c = sub
	if _, err := sub.Subscribe(t.Context(), "batched", nil, counter.patch); err != nil {
		t.Fatal(err)
	}
	pub := dialClient(t, srv.url, nil)
	if got := pub.ServerHello().MaxMessage; got != 1024 {
		t.Fatalf("hello maxMessage = %d, want 1024", got)
	}
	pad := strings.Repeat("x", 100)
	publishAll(t, pub, "batched", n, func(i int) string { return fmt.Sprintf(`{"i":%d,"pad":%q}`, i, pad) })
	waitAll(t, []*orderedCounter{counter}, time.Minute)
	if err := pub.Err(); err != nil {
		t.Fatalf("publisher ended: %v", err)
	}
}

// TestClient_CloseWritesQueued: publishes that PublishAsync has queued
// but not yet written when Close is called still reach the gateway, so a
// fire-and-forget publisher that closes at once loses none of them.
func TestClient_CloseWritesQueued(t *testing.T) {
	t.Parallel()
	const n = 500
	srv := newTestServer(t, gateway.Config{})
	sub := dialClient(t, srv.url, nil)
	counter := newOrderedCounter(n)
	counter.c = sub
	if _, err := sub.Subscribe(t.Context(), "closing", nil, counter.patch); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, srv.url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := c.PublishAsync(ctx, "closing", json.RawMessage(fmt.Sprintf(`{"i":%d}`, i)), func(string, error) {}); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	waitAll(t, []*orderedCounter{counter}, 10*time.Second)
}

// TestClient_PacesToServerRate: a gateway that limits frames says so in
// its hello (frameRate, frameBurst), and the Go client paces its frames
// below them: publishes pipelined far past the burst all succeed, in
// order, and the gateway drops none.
func TestClient_PacesToServerRate(t *testing.T) {
	t.Parallel()
	const n = 150
	srv := newTestServer(t, gateway.Config{FrameRate: 100, FrameBurst: 20, RateLimitClose: -1})
	sub := dialClient(t, srv.url, nil)
	counter := newOrderedCounter(n)
	counter.c = sub
	if _, err := sub.Subscribe(t.Context(), "paced", nil, counter.patch); err != nil {
		t.Fatal(err)
	}
	pub := dialClient(t, srv.url, nil)
	if h := pub.ServerHello(); h.FrameRate != 100 || h.FrameBurst != 20 {
		t.Fatalf("hello frameRate %v, frameBurst %d; want 100, 20", h.FrameRate, h.FrameBurst)
	}
	publishAll(t, pub, "paced", n, func(i int) string { return fmt.Sprintf(`{"i":%d}`, i) })
	waitAll(t, []*orderedCounter{counter}, time.Minute)
	if d := metricValue(t, scrape(t, srv.ts.URL), "syncgate_frames_rate_limited_total"); d != 0 {
		t.Fatalf("the gateway dropped %v frames over its rate", d)
	}
}
