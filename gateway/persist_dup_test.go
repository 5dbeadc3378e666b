package gateway_test

import (
	"strings"
	"testing"

	"github.com/syncgate/syncgate/frames"
	"github.com/syncgate/syncgate/internal/gwtest"
	"github.com/syncgate/syncgate/storage"
)

// TestPersisted_ReusedSeqAfterRestart: a client that kept its clientId
// but not its seq sends a new mutate under a seq the log already holds,
// after this node restarted (its outcome window gone). The log takes the
// seq for a duplicate; the mutate is not a retry (its key is another), so
// it gets X_SEQ_REUSED, as from the window before the restart, and not an
// ack naming another mutate's record while its own message was never
// written. A true retry is still answered with its record, and a seq the
// client used for another topic is not taken for this one's.
func TestPersisted_ReusedSeqAfterRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	n := startPersistNode(t, dir)
	lsns := map[string]string{}
	for _, p := range []struct{ client, key, topic string }{
		{"exact", "a", "chat:r"}, {"exact", "b", "chat:r"}, // seq 0 is a's record
		{"other", "u", "chat:u"}, {"other", "v", "chat:r"}, // seq 0 went to another topic
		{"retry", "c", "chat:r"},
	} {
		c := gwtest.Dial(t, n.url, nil)
		c.Hello(p.client, 0)
		seq := int64(0)
		if p.key == "b" || p.key == "v" {
			seq = 1
		}
		r := c.Publish(p.key, seq, p.topic, `"`+p.key+`"`)
		if r.Error != nil {
			t.Fatalf("%s: %+v", p.key, r.Error)
		}
		lsns[p.key] = *r.LSN
		c.Close()
	}
	n.stop()

	n = startPersistNode(t, dir)
	for _, client := range []string{"exact", "other"} {
		c := gwtest.Dial(t, n.url, nil)
		c.Hello(client, 0)
		if r := c.Publish("lost", 0, "chat:r", `"lost"`); r.Error == nil || r.Error.Code != frames.CodeSeqReused || r.LSN != nil {
			t.Fatalf("%s: seq 0 under a new key after a restart: %+v %+v, want X_SEQ_REUSED", client, r, r.Error)
		}
	}
	c := gwtest.Dial(t, n.url, nil)
	c.Hello("retry", 0)
	if r := c.Publish("c", 0, "chat:r", `"c"`); r.Error != nil || *r.LSN != lsns["c"] {
		t.Fatalf("a true retry after a restart: %+v %+v, want its first ack %s", r, r.Error, lsns["c"])
	}
	res, err := n.db.Read(t.Context(), "chat:r", storage.ZeroOffset, 0)
	if err != nil || len(res.Records) != 4 {
		t.Fatalf("log: %d records (%v), want a, b, v and c", len(res.Records), err)
	}
	for _, r := range res.Records {
		if strings.Contains(string(r.Data), "lost") {
			t.Fatalf("log holds %s", r.Data)
		}
	}
}
