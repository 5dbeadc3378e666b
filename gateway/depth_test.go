package gateway_test

import (
	"strings"
	"testing"

	"github.com/syncgate/syncgate/frames"
	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/internal/gwtest"
)

// nested is JSON nested d deep: [[…]].
func nested(d int) string { return strings.Repeat("[", d) + strings.Repeat("]", d) }

// TestPublish_DataTooDeepForARow: a publish's data may nest as deep as
// its mutate frame allows (frames.MaxDepth-2), but a topic row carries it
// two levels deeper, so data nested over MaxDepth-4 made a patch no
// client could decode (the Go client drops such a frame) while the
// publish was acked. It is refused X_BAD_INPUT; data at the limit is
// delivered, and its patch decodes. Over HTTP a persisted topic's message
// that deep is refused with 400.
func TestPublish_DataTooDeepForARow(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{})
	sub := gwtest.Dial(t, srv.url, nil)
	sub.Hello("", 0)
	sub.Subscribe("s", "room")
	pub := gwtest.Dial(t, srv.url, nil)
	pub.Hello("", 0)
	if ack := pub.Publish("deep", 0, "room", nested(frames.MaxDepth-3)); ack.Error == nil || ack.Error.Code != frames.CodeBadInput {
		t.Fatalf("publish of data nested %d deep: %+v, want X_BAD_INPUT", frames.MaxDepth-3, ack.Error)
	}
	if ack := pub.Publish("fits", 1, "room", nested(frames.MaxDepth-4)); ack.Error != nil {
		t.Fatalf("publish of data nested %d deep: %+v", frames.MaxDepth-4, ack.Error)
	}
	p := gwtest.Expect[*frames.Patch](sub)
	if got := frames.Depth(p.Patches[0].Row); got != frames.MaxDepth-3 { // the row object, then its data
		t.Fatalf("the delivered row nests %d deep, want %d", got, frames.MaxDepth-3)
	}

	s := newStreamServer(t, gateway.Config{Persist: []string{"chat:*"}})
	h := hdr("Content-Type", "application/json")
	// A JSON body's top-level array holds the messages: one level more.
	s.do(t, "POST", "/v1/stream/chat:1", h, nested(frames.MaxDepth-2)).want(t, 400)
	s.do(t, "POST", "/v1/stream/chat:1", h, nested(frames.MaxDepth-3)).want(t, 204)
}
