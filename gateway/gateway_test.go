package gateway_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/syncgate/syncgate/frames"
	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/internal/gwtest"
)

func TestGateway_HelloAnswered(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{BuildID: "b42"})
	c := gwtest.Dial(t, srv.url, nil)
	h := c.Hello("client-1", 3)
	if h.SessionID == nil || len(*h.SessionID) != 32 {
		t.Fatalf("sessionId = %v, want a 32-char id", h.SessionID)
	}
	if h.BuildID != "b42" || h.ClientID != "client-1" || h.Epoch != 3 || h.MaxMessage != 65536 {
		t.Fatalf("hello = %+v", h)
	}
	c2 := gwtest.Dial(t, srv.url, nil)
	if h2 := c2.Hello("", 0); *h2.SessionID == *h.SessionID {
		t.Fatal("two sessions share a sessionId")
	}
}

func TestGateway_TwoClientsPublishInOrder(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{})
	a := gwtest.Dial(t, srv.url, nil)
	b := gwtest.Dial(t, srv.url, nil)
	a.Hello("", 0)
	b.Hello("", 0)
	snapA := a.Subscribe("s1", "room:1")
	b.Subscribe("s9", "room:1")
	if snapA.Cursor.QID != "topic:room:1" || len(snapA.Rows) != 0 {
		t.Fatalf("snapshot = %+v", snapA)
	}
	const n = 50
	var lsns []string
	for i := range n {
		ack := b.Publish(fmt.Sprintf("k%d", i), int64(i), "room:1", fmt.Sprintf(`{"n":%d}`, i))
		if ack.Ref != fmt.Sprintf("k%d", i) || ack.Error != nil || ack.LSN == nil {
			t.Fatalf("ack %d = %+v", i, ack)
		}
		if i > 0 && *ack.LSN <= lsns[i-1] {
			t.Fatalf("lsn %q not after %q", *ack.LSN, lsns[i-1])
		}
		lsns = append(lsns, *ack.LSN)
	}
	for _, c := range []struct {
		conn *gwtest.Conn
		sid  string
	}{{a, "s1"}, {b, "s9"}} {
		for i := range n {
			p := gwtest.Expect[*frames.Patch](c.conn)
			if p.SID != c.sid || len(p.Patches) != 1 || p.LSN != lsns[i] {
				t.Fatalf("patch %d = %+v", i, p)
			}
			var row struct {
				ID      string          `json:"id"`
				Data    json.RawMessage `json:"data"`
				ActorID *string         `json:"actorId"`
				At      int64           `json:"at"`
			}
			if err := json.Unmarshal(p.Patches[0].Row, &row); err != nil {
				t.Fatal(err)
			}
			if row.ID != lsns[i] || string(row.Data) != fmt.Sprintf(`{"n":%d}`, i) || row.At == 0 || p.Patches[0].Op != "insert" {
				t.Fatalf("row %d = %s", i, p.Patches[0].Row)
			}
		}
	}
	if snapA.Cursor.LSN >= lsns[0] {
		t.Fatalf("snapshot cursor %q is not before the first patch %q", snapA.Cursor.LSN, lsns[0])
	}
}
