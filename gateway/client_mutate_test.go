package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/syncgate/syncgate/client"
	"github.com/syncgate/syncgate/frames"
	"github.com/syncgate/syncgate/gateway"
)

// TestClient_MutateBadNameUsesNoSeq: a mutate whose name the gateway
// refuses as a frame (empty, or over 256 bytes: X_BAD_FIELD) never
// reaches the producer, so its seq is not taken up there. The client
// must not spend a seq on it either: the next publish succeeds rather
// than meeting X_SEQ_GAP and ending the Client (ErrOutOfStep).
func TestClient_MutateBadNameUsesNoSeq(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"", strings.Repeat("n", 257)} {
		srv := newTestServer(t, gateway.Config{})
		c := dialClient(t, srv.url, nil)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := c.Publish(ctx, "room", json.RawMessage(`1`)); err != nil {
			t.Fatalf("first publish: %v", err)
		}
		if _, err := c.Mutate(ctx, name, json.RawMessage(`{}`)); err == nil {
			t.Fatalf("mutate named %.10q…: no error", name)
		}
		if _, err := c.Publish(ctx, "room", json.RawMessage(`2`)); err != nil {
			t.Fatalf("publish after a mutate named %.10q…: %v", name, err)
		}
		if err := c.Err(); err != nil {
			t.Fatalf("client ended: %v", err)
		}
	}
}

// TestClient_PublishOverMaxMessage: a publish whose frame is larger than
// the gateway accepts (hello.maxMessage) would be closed with 1009 on
// every connection it is sent on; with Reconnect it was re-sent on each
// new one, forever, and every later mutate waited behind it. It fails at
// once instead, using no seq, and the Client carries on.
func TestClient_PublishOverMaxMessage(t *testing.T) {
	t.Parallel()
	for _, reconnect := range []bool{false, true} {
		srv := newTestServer(t, gateway.Config{MaxFrameBytes: 1024})
		c := dialClient(t, srv.url, &client.Options{Reconnect: reconnect})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		big := json.RawMessage(`"` + strings.Repeat("x", 2000) + `"`)
		_, err := c.Publish(ctx, "room", big)
		if err == nil || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("reconnect=%v: oversized publish: %v, want an error at once", reconnect, err)
		}
		var fe *frames.Error
		if errors.As(err, &fe) {
			t.Fatalf("reconnect=%v: oversized publish answered by the server: %v", reconnect, err)
		}
		if _, err := c.Publish(ctx, "room", json.RawMessage(`1`)); err != nil {
			t.Fatalf("reconnect=%v: publish after the oversized one: %v", reconnect, err)
		}
	}
}
