package main

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/internal/gwtest"
)

// TestBench_TopicsFlood runs bench topics with one flooder at 10× a low
// frame rate: the flooder gets X_RATE_LIMITED answers and is closed 1008
// after RateLimitClose, and every normal delivery still arrives.
func TestBench_TopicsFlood(t *testing.T) {
	t.Parallel()
	gw, err := gateway.New(gateway.Config{FrameRate: 50, FrameBurst: 50, RateLimitClose: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(gw.Handler())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := gw.Shutdown(ctx); err != nil {
			t.Errorf("gateway shutdown: %v", err)
		}
		ts.Close()
	})
	var r topicsResult
	// The publisher's 20 msgs/s stay under the limit of 50.
	runBench(t, &r, "topics", "-url", gwtest.WSURL(ts.URL), "-n", "5", "-rate", "20", "-dur", "1.5s", "-wait", "3s",
		"-flooders", "1", "-flood-factor", "10", "-server-frame-rate", "50")
	if r.Sent != 30 || r.Acked != 30 || r.Delivered != 30 || r.Lost != 0 || r.PublishErrors != 0 {
		t.Errorf("sent %d, acked %d, delivered %d, lost %d, publish errors %d; want 30, 30, 30, 0, 0",
			r.Sent, r.Acked, r.Delivered, r.Lost, r.PublishErrors)
	}
	if r.Flooders != 1 || r.FloodRate != 500 || r.FloodSent < 200 {
		t.Errorf("flooders %d at %v/s sent %d; want 1 at 500/s, at least 200 sent", r.Flooders, r.FloodRate, r.FloodSent)
	}
	// The server answers a flood at most once per 100 ms (the first
	// refusal of a run, then one answer counting the drops since), so most
	// refused frames go unanswered.
	if r.FloodLimited < 2 || r.FloodUnanswered < 100 || r.FloodPublished < 1 {
		t.Errorf("flooder got %d X_RATE_LIMITED, %d unanswered, published %d; want at least 2, 100 and 1",
			r.FloodLimited, r.FloodUnanswered, r.FloodPublished)
	}
	if r.FloodClosed != 1 || r.FloodCloseCode != int(websocket.StatusPolicyViolation) {
		t.Errorf("flooder closed %d, code %d; want 1, 1008", r.FloodClosed, r.FloodCloseCode)
	}
	if r.FloodOtherErrs != 0 {
		t.Errorf("flooder got %d other errors; first: %s", r.FloodOtherErrs, r.FloodFirstErr)
	}
}
