package gateway_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/syncgate/syncgate/fanout"
	"github.com/syncgate/syncgate/frames"
	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/internal/gwtest"
	"github.com/syncgate/syncgate/storage"
)

// gatedTransport is a hub whose next Publish, once armed, waits for gate
// (after closing entered) before it reaches the hub.
type gatedTransport struct {
	hub     *fanout.Hub
	armed   atomic.Bool
	entered chan struct{}
	gate    chan struct{}
}

func (g *gatedTransport) Publish(ctx context.Context, topic string, data []byte) error {
	if g.armed.CompareAndSwap(true, false) {
		close(g.entered)
		<-g.gate
	}
	return g.hub.Publish(ctx, topic, data)
}

func (g *gatedTransport) Subscribe(ctx context.Context, topic string, s fanout.Subscriber) error {
	return g.hub.Subscribe(ctx, topic, s)
}

func (g *gatedTransport) Unsubscribe(ctx context.Context, topic string, s fanout.Subscriber) error {
	return g.hub.Unsubscribe(ctx, topic, s)
}

// The last subscriber of a persisted topic leaving while its tailer hands
// a page of records to the transport stops the tailer quietly: the
// records left in the page are not handed over, and no "fanout failed"
// warning is logged for each (the stopped tailer's Publish calls failed
// on its cancelled context, one warning per record).
func TestPersisted_LastSubscriberLeavesDuringHandOver(t *testing.T) {
	t.Parallel()
	const topic = "chat:leavemid"
	hub := fanout.NewHub(fanout.HubConfig{})
	t.Cleanup(func() { _ = hub.Close() })
	tr := &gatedTransport{hub: hub, entered: make(chan struct{}), gate: make(chan struct{})}
	logs := &syncBuffer{}
	db, srv := startWrappedNode(t, nil, func(db *storage.DB) gateway.StreamLog { return db }, func(c *gateway.Config) {
		c.Transport = tr
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	makeStream(t, db, topic)
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("", 0)
	c.Subscribe("s", topic)
	tr.armed.Store(true)
	recs := [][]byte{[]byte(`{"n":1}`), []byte(`{"n":2}`), []byte(`{"n":3}`)}
	if _, err := db.Append(t.Context(), topic, storage.AppendRequest{Records: recs}); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, "the tailer's hand-over", tr.entered)
	c.Send(&frames.Subscribe{Op: frames.OpDrop, SID: "s", Target: frames.Target{Kind: frames.TargetTopic, Topic: topic}})
	if ack := gwtest.Expect[*frames.Ack](c); ack.Ref != "s" || ack.Error != nil {
		t.Fatalf("drop: %+v %+v", ack, ack.Error)
	}
	close(tr.gate)
	c.Close()
	srv.close(t) // waits for the tailer
	if out := logs.String(); strings.Contains(out, "fanout failed") {
		t.Errorf("the stopped tailer logged failures:\n%s", out)
	}
}
