package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
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

// persistNode is a gateway with a bbolt log in dir; stop ends both, so a
// test can start another node on the same files (a restart).
type persistNode struct {
	*testServer
	db   *storage.DB
	stop func()
}

func startPersistNode(t *testing.T, dir string) *persistNode {
	t.Helper()
	db, err := storage.Open(filepath.Join(dir, "log.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(gateway.Config{Log: db, Persist: []string{"chat:*"}, LongPollTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	srv := newTestServerFor(t, gw)
	var once sync.Once
	n := &persistNode{testServer: srv, db: db}
	n.stop = func() {
		once.Do(func() {
			srv.close(t)
			if err := db.Close(); err != nil {
				t.Errorf("db close: %v", err)
			}
		})
	}
	t.Cleanup(n.stop)
	return n
}

// resume subscribes sid to topic from cursor lsn.
func resume(c *gwtest.Conn, sid, topic, lsn string) {
	c.Send(&frames.Subscribe{Op: frames.OpAdd, SID: sid, Target: frames.Target{Kind: frames.TargetTopic, Topic: topic,
		Cursor: &frames.Cursor{QID: "topic:" + topic, LSN: lsn, IDs: []string{}, At: 1}}})
}

// collect reads patches for sid until it holds n inserts; it returns them.
func collect(t *testing.T, c *gwtest.Conn, sid string, n int) []frames.PatchOp {
	t.Helper()
	var ops []frames.PatchOp
	for len(ops) < n {
		switch f := c.Next().(type) {
		case *frames.Patch:
			if f.SID != sid {
				t.Fatalf("patch for sid %q, want %q", f.SID, sid)
			}
			if f.LSN != f.Patches[len(f.Patches)-1].LSN {
				t.Fatalf("patch lsn %s is not its last op's %s", f.LSN, f.Patches[len(f.Patches)-1].LSN)
			}
			ops = append(ops, f.Patches...)
		default:
			t.Fatalf("after %d inserts: unexpected %T %+v", len(ops), f, f)
		}
	}
	if len(ops) != n {
		t.Fatalf("got %d inserts, want %d", len(ops), n)
	}
	return ops
}

// rowData returns a patch row's data as a string.
func rowData(t *testing.T, op frames.PatchOp) string {
	t.Helper()
	var row struct {
		ID   string          `json:"id"`
		Data json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(op.Row, &row); err != nil {
		t.Fatalf("row %s: %v", op.Row, err)
	}
	if row.ID != op.LSN || op.ID != op.LSN {
		t.Fatalf("row id %q, op id %q, lsn %q: want all equal", row.ID, op.ID, op.LSN)
	}
	return string(row.Data)
}

func TestPersisted_PublishIsDurableAndOneLogWithHTTP(t *testing.T) {
	t.Parallel()
	n := startPersistNode(t, t.TempDir())
	sub := gwtest.Dial(t, n.url, nil)
	sub.Hello("", 0)
	snap := sub.Subscribe("s", "chat:a")
	if snap.Cursor.LSN != storage.ZeroOffset {
		t.Fatalf("snapshot of a new topic at %s, want %s", snap.Cursor.LSN, storage.ZeroOffset)
	}
	pub := gwtest.Dial(t, n.url, nil)
	pub.Hello("writer", 0)
	ack := pub.Publish("k0", 0, "chat:a", `{"text":"hi"}`)
	if ack.Error != nil || ack.LSN == nil {
		t.Fatalf("publish ack %+v", ack)
	}
	// Acknowledged means committed: the record is in the log.
	res, err := n.db.Read(context.Background(), "chat:a", storage.ZeroOffset, 0)
	if err != nil || len(res.Records) != 1 || res.Records[0].Offset != *ack.LSN {
		t.Fatalf("log after ack: %+v, %v", res, err)
	}
	op := collect(t, sub, "s", 1)[0]
	if op.LSN != *ack.LSN || rowData(t, op) != `{"text":"hi"}` {
		t.Fatalf("patch %+v for ack %s", op, *ack.LSN)
	}

	// The HTTP door appends to the same log: subscribers get it as a patch
	// whose row data is the record.
	resp, err := http.Post(n.ts.URL+"/v1/stream/chat:a", "application/json", strings.NewReader(`{"from":"backend"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("HTTP append: %s", resp.Status)
	}
	op = collect(t, sub, "s", 1)[0]
	if op.LSN <= *ack.LSN || rowData(t, op) != `{"from":"backend"}` {
		t.Fatalf("HTTP-appended record arrived as %+v", op)
	}
	// And a WebSocket publish is readable over HTTP.
	resp, err = http.Get(n.ts.URL + "/v1/stream/chat:a?offset=-1")
	if err != nil {
		t.Fatal(err)
	}
	var recs []map[string]json.RawMessage
	err = json.NewDecoder(resp.Body).Decode(&recs)
	resp.Body.Close()
	if err != nil || len(recs) != 2 || string(recs[0]["data"]) != `{"text":"hi"}` || string(recs[0]["key"]) != `"k0"` {
		t.Fatalf("HTTP read: %v %v", recs, err)
	}
}

func TestPersisted_ResumeAfterThousandAndAcrossRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	n := startPersistNode(t, dir)
	sub := gwtest.Dial(t, n.url, nil)
	sub.Hello("", 0)
	cursor := sub.Subscribe("s", "chat:r").Cursor.LSN
	sub.Close()

	pub := gwtest.Dial(t, n.url, nil)
	pub.Hello("p", 0)
	const total = 1000
	var lsns []string
	for i := range total {
		ack := pub.Publish(fmt.Sprint("k", i), int64(i), "chat:r", fmt.Sprint(i))
		if ack.Error != nil {
			t.Fatalf("publish %d: %+v", i, ack.Error)
		}
		lsns = append(lsns, *ack.LSN)
	}

	check := func(sub *gwtest.Conn, from int) {
		t.Helper()
		ops := collect(t, sub, "s", total-from)
		for i, op := range ops {
			if op.LSN != lsns[from+i] || rowData(t, op) != fmt.Sprint(from+i) {
				t.Fatalf("replayed insert %d: lsn %s data %s, want %s %d", i, op.LSN, op.Row, lsns[from+i], from+i)
			}
		}
	}
	sub = gwtest.Dial(t, n.url, nil)
	sub.Hello("", 0)
	resume(sub, "s", "chat:r", cursor)
	if ack := gwtest.Expect[*frames.Ack](sub); ack.Ref != "s" || ack.Error != nil {
		t.Fatalf("resume ack %+v", ack)
	}
	check(sub, 0)
	// Then live, with no duplicate at the seam.
	live := pub.Publish("live", total, "chat:r", `"live"`)
	if op := collect(t, sub, "s", 1)[0]; op.LSN != *live.LSN {
		t.Fatalf("live insert %s after replay, want %s", op.LSN, *live.LSN)
	}
	lsns = append(lsns, *live.LSN)
	pub.Close()
	sub.Close()

	// A restart: the log and the producer state survive.
	n.stop()
	n = startPersistNode(t, dir)
	sub = gwtest.Dial(t, n.url, nil)
	sub.Hello("", 0)
	resume(sub, "s", "chat:r", lsns[499])
	gwtest.Expect[*frames.Ack](sub)
	ops := collect(t, sub, "s", total+1-500)
	for i, op := range ops {
		if op.LSN != lsns[500+i] {
			t.Fatalf("after restart, insert %d at %s, want %s", i, op.LSN, lsns[500+i])
		}
	}
	// The producer's retry of its last acknowledged seq (as a client that
	// lost the ack would send it) is answered from the log with the
	// original offset and writes nothing.
	pub = gwtest.Dial(t, n.url, nil)
	pub.Hello("p", 0)
	if ack := pub.Publish("live", total, "chat:r", `"live"`); ack.Error != nil || *ack.LSN != lsns[total] {
		t.Fatalf("retry of seq %d after restart: %+v, want lsn %s", total, ack, lsns[total])
	}
	if info, err := n.db.Head(context.Background(), "chat:r"); err != nil || info.Tail != lsns[total] {
		t.Fatalf("log tail after the retry: %+v %v, want %s", info, err, lsns[total])
	}
	next := pub.Publish("next", total+1, "chat:r", `"next"`)
	if next.Error != nil {
		t.Fatalf("next seq after restart: %+v", next.Error)
	}
	if op := collect(t, sub, "s", 1)[0]; op.LSN != *next.LSN {
		t.Fatalf("live after restart: %s, want %s (the retry must not be delivered)", op.LSN, *next.LSN)
	}
}

// TestPersisted_SeamUnderLoad resumes subscribers while a publisher writes:
// each must see every record after its cursor exactly once, in log order.
func TestPersisted_SeamUnderLoad(t *testing.T) {
	t.Parallel()
	n := startPersistNode(t, t.TempDir())
	const total = 600
	pub := gwtest.Dial(t, n.url, nil)
	pub.Hello("p", 0)
	for i := range 100 {
		pub.Publish(fmt.Sprint("k", i), int64(i), "chat:s", fmt.Sprint(i))
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 100; i < total; i++ {
			msg := fmt.Sprintf(`{"type":"mutate","v":1,"key":"k%d","seq":%d,"name":"publish","input":{"topic":"chat:s","data":%d}}`, i, i, i)
			if err := pub.C.Write(context.Background(), websocket.MessageText, []byte(msg)); err != nil {
				t.Errorf("publish %d: %v", i, err)
				return
			}
		}
	}()
	all, err := n.db.Read(context.Background(), "chat:s", storage.ZeroOffset, 0)
	if err != nil {
		t.Fatal(err)
	}
	var subs []*gwtest.Conn
	var from []int
	for i := range 4 {
		c := gwtest.Dial(t, n.url, nil)
		c.Hello("", 0)
		k := 20 * i
		resume(c, "s", "chat:s", all.Records[k].Offset)
		gwtest.Expect[*frames.Ack](c)
		subs, from = append(subs, c), append(from, k+1)
	}
	<-done
	for i, c := range subs {
		ops := collect(t, c, "s", total-from[i])
		for j, op := range ops {
			if got, want := rowData(t, op), fmt.Sprint(from[i]+j); got != want {
				t.Fatalf("subscriber %d insert %d: data %s, want %s", i, j, got, want)
			}
			if j > 0 && op.LSN <= ops[j-1].LSN {
				t.Fatalf("subscriber %d: lsn %s after %s", i, op.LSN, ops[j-1].LSN)
			}
		}
	}
}

func TestPersisted_CursorNotFromTheLog(t *testing.T) {
	t.Parallel()
	n := startPersistNode(t, t.TempDir())
	c := gwtest.Dial(t, n.url, nil)
	c.Hello("", 0)
	c.Publish("k", 0, "chat:x", `1`)
	for _, lsn := range []string{
		frames.FormatOffset(1764430000000, 5), // an ephemeral topic's offset
		"0000000000000000_0000000000000099",   // past the log's tail
	} {
		resume(c, "s", "chat:x", lsn)
		ack := gwtest.Expect[*frames.Ack](c)
		if ack.Error == nil || ack.Error.Code != frames.CodeCursorExpired {
			t.Fatalf("cursor %s: ack %+v", lsn, ack)
		}
		if snap := gwtest.Expect[*frames.Snapshot](c); snap.Cursor.LSN != "0000000000000000_0000000000000001" {
			t.Fatalf("cursor %s: snapshot at %s", lsn, snap.Cursor.LSN)
		}
		c.Send(&frames.Subscribe{Op: frames.OpDrop, SID: "s", Target: frames.Target{Kind: frames.TargetTopic, Topic: "chat:x"}})
		if ack := gwtest.Expect[*frames.Ack](c); ack.Error != nil {
			t.Fatalf("drop: %+v", ack.Error)
		}
	}
}

func TestPersisted_TopicStreamNotJSON(t *testing.T) {
	t.Parallel()
	n := startPersistNode(t, t.TempDir())
	if _, _, err := n.db.Create(context.Background(), "chat:text", storage.CreateOptions{ContentType: "text/plain"}); err != nil {
		t.Fatal(err)
	}
	c := gwtest.Dial(t, n.url, nil)
	c.Hello("", 0)
	if ack := c.Publish("k", 0, "chat:text", `1`); ack.Error == nil || ack.Error.Code != frames.CodeBadTopic {
		t.Fatalf("publish to a text stream: %+v", ack)
	}
	// The session survives.
	if ack := c.Publish("k2", 1, "chat:ok", `1`); ack.Error != nil {
		t.Fatalf("next publish: %+v", ack.Error)
	}
}
