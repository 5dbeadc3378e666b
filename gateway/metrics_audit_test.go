package gateway_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/coder/websocket"

	"github.com/syncgate/syncgate/frames"
	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/internal/gwtest"
)

// Every patch delivered to a session is either written (frames_out) or
// dropped (drops_total), also the ones still queued, or left unwritten in
// a failed round, when a slow consumer's session ends.
func TestMetrics_DropsCountFramesLostAtClose(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{SendQueueMessages: 8})
	stalled := dialStalled(t, srv.url, "t")
	pub := gwtest.Dial(t, srv.url, nil)
	pub.Hello("", 0)
	data := `"` + strings.Repeat("x", 16<<10) + `"`
	n := 0
	for ; metricValue(t, scrape(t, srv.ts.URL), `syncgate_closes_total{reason="slow_consumer"}`) == 0; n++ {
		if n == 5000 {
			t.Fatal("the stalled session was not closed as a slow consumer")
		}
		if ack := pub.Publish(fmt.Sprintf("k%d", n), int64(n), "t", data); ack.Error != nil {
			t.Fatalf("publish %d: %+v", n, ack.Error)
		}
	}
	stalled.CloseNow() // the writer waiting on the full socket fails now
	gwtest.Eventually(t, gwtest.Timeout, "the stalled session ends", func() bool {
		return metricValue(t, scrape(t, srv.ts.URL), "syncgate_sessions") == 1
	})
	m := scrape(t, srv.ts.URL)
	out := metricValue(t, m, `syncgate_frames_out_total{type="patch"}`)
	dropped := metricValue(t, m, `syncgate_drops_total{reason="queue_full"}`) +
		metricValue(t, m, `syncgate_drops_total{reason="session_closed"}`)
	if out+dropped != float64(n) {
		t.Fatalf("%d patches delivered to the session: %.0f written + %.0f dropped", n, out, dropped)
	}
}

// A binary message is answered X_BAD_FRAME as a text frame that fails to
// decode is, and counts as one in syncgate_frames_bad_total.
func TestMetrics_BinaryMessageCountsAsBadFrame(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{})
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("", 0)
	if err := c.C.Write(t.Context(), websocket.MessageBinary, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if ack := gwtest.Expect[*frames.Ack](c); ack.Error == nil || ack.Error.Code != frames.CodeBadFrame {
		t.Fatalf("binary message answered %+v", ack)
	}
	m := scrape(t, srv.ts.URL)
	if got := metricValue(t, m, `syncgate_error_acks_total{code="X_BAD_FRAME"}`); got != 1 {
		t.Fatalf("X_BAD_FRAME acks %v, want 1", got)
	}
	if got := metricValue(t, m, "syncgate_frames_bad_total"); got != 1 {
		t.Fatalf("syncgate_frames_bad_total %v after a binary message answered X_BAD_FRAME, want 1", got)
	}
}
