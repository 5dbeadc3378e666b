package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
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
	return startPersistNodeWith(t, dir, nil)
}

// startPersistNodeWith starts a node on a log opened with opts; tweak, if
// any, adjusts the gateway's configuration.
func startPersistNodeWith(t *testing.T, dir string, opts *storage.Options, tweak ...func(*gateway.Config)) *persistNode {
	t.Helper()
	db, err := storage.Open(filepath.Join(dir, "log.db"), opts)
	if err != nil {
		t.Fatal(err)
	}
	cfg := gateway.Config{Log: db, Persist: []string{"chat:*"}, LongPollTimeout: 500 * time.Millisecond}
	for _, f := range tweak {
		f(&cfg)
	}
	gw, err := gateway.New(cfg)
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

// scrape returns the node's /metrics text.
func (n *persistNode) scrape(t *testing.T) string {
	t.Helper()
	resp, err := http.Get(n.ts.URL + "/metrics")
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

// sendResume subscribes sid to topic from cursor lsn.
func sendResume(c *gwtest.Conn, sid, topic, lsn string) {
	c.Send(&frames.Subscribe{Op: frames.OpAdd, SID: sid, Target: frames.Target{Kind: frames.TargetTopic, Topic: topic,
		Cursor: &frames.Cursor{QID: "topic:" + topic, LSN: lsn, IDs: []string{}, At: 1}}})
}

// resume subscribes sid to topic from cursor lsn and checks the answer:
// an ack, then a snapshot with no rows at the cursor.
func resume(t *testing.T, c *gwtest.Conn, sid, topic, lsn string) {
	t.Helper()
	sendResume(c, sid, topic, lsn)
	if ack := gwtest.Expect[*frames.Ack](c); ack.Ref != sid || ack.Error != nil {
		t.Fatalf("resume ack %+v", ack)
	}
	if snap := gwtest.Expect[*frames.Snapshot](c); snap.SID != sid || snap.Cursor.LSN != lsn || len(snap.Rows) != 0 {
		t.Fatalf("resume snapshot %+v, want no rows at %s", snap, lsn)
	}
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
	if snap.Cursor.LSN != storage.ZeroOffset || snap.Cursor.Digest != "" {
		t.Fatalf("snapshot of a new topic at %s (digest %q), want %s and none (no stream yet)", snap.Cursor.LSN, snap.Cursor.Digest, storage.ZeroOffset)
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
	expectMade(t, sub, "s") // the publish made the stream: its digest, no reset
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
	resume(t, sub, "s", "chat:r", cursor)
	check(sub, 0)
	metrics := n.scrape(t)
	for _, want := range []string{`syncgate_resumes_total{outcome="replayed"} 1`, "syncgate_replayed_records_total 1000", "syncgate_persisted_tailers 1"} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
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
	resume(t, sub, "s", "chat:r", lsns[499])
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
// each must see every record after its cursor exactly once, in log order
// (a last record marks the end, so a duplicate of the one before shows).
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
		resume(t, c, "s", "chat:s", all.Records[k].Offset)
		subs, from = append(subs, c), append(from, k+1)
	}
	<-done
	// One more record marks the end: a record delivered twice comes
	// before it, where the data check below finds it.
	marker := fmt.Sprintf(`{"type":"mutate","v":1,"key":"k%d","seq":%d,"name":"publish","input":{"topic":"chat:s","data":%d}}`, total, total, total)
	if err := pub.C.Write(context.Background(), websocket.MessageText, []byte(marker)); err != nil {
		t.Fatal(err)
	}
	for i, c := range subs {
		ops := collect(t, c, "s", total+1-from[i])
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
		sendResume(c, "s", "chat:x", lsn)
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

// TestPersisted_GoClientResume resumes with package client: Subscribe
// returns a live subscription that is not expired, and its patches carry
// the backlog.
func TestPersisted_GoClientResume(t *testing.T) {
	t.Parallel()
	n := startPersistNode(t, t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, n.url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	makeStream(t, n.db, "chat:g")
	first, err := c.Subscribe(ctx, "chat:g", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	cursor := first.Cursor()
	if err := first.Drop(ctx); err != nil {
		t.Fatal(err)
	}
	var lsns []string
	for i := range 3 {
		lsn, err := c.Publish(ctx, "chat:g", json.RawMessage(fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		lsns = append(lsns, lsn)
	}
	sub, err := c.Subscribe(ctx, "chat:g", &cursor, nil)
	if err != nil || sub.CursorExpired() {
		t.Fatalf("resume: %v, expired %v", err, sub != nil && sub.CursorExpired())
	}
	var got []string
	for len(got) < len(lsns) {
		select {
		case p := <-sub.Patches():
			for _, op := range p.Patches {
				got = append(got, op.LSN)
			}
		case <-ctx.Done():
			t.Fatalf("resumed patches: got %v, want %v", got, lsns)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(lsns) || sub.Cursor().LSN != lsns[2] {
		t.Fatalf("resumed %v (cursor %s), want %v", got, sub.Cursor().LSN, lsns)
	}
	// The client sends back the log's digest, which a resume checks.
	if !strings.HasPrefix(cursor.Digest, "log:") || sub.Cursor().Digest != cursor.Digest {
		t.Fatalf("cursor digests: first %q, resumed %q", cursor.Digest, sub.Cursor().Digest)
	}
}

// TestPersisted_CursorPrunedByRetention: a cursor older than what the log
// keeps gets X_CURSOR_EXPIRED and a fresh snapshot, never a silent gap.
func TestPersisted_CursorPrunedByRetention(t *testing.T) {
	t.Parallel()
	n := startPersistNodeWith(t, t.TempDir(), &storage.Options{
		Retention: storage.Retention{MaxRecords: 5}, MaintenanceInterval: 10 * time.Millisecond})
	c := gwtest.Dial(t, n.url, nil)
	c.Hello("", 0)
	var lsns []string
	for i := range 20 {
		lsns = append(lsns, *c.Publish(fmt.Sprint("k", i), int64(i), "chat:p", fmt.Sprint(i)).LSN)
	}
	gwtest.Eventually(t, 10*time.Second, "retention prunes the topic's log to its last 5", func() bool {
		in, err := n.db.Head(context.Background(), "chat:p")
		return err == nil && in.Pruned == lsns[14]
	})
	// The client is told, then gets what the log still keeps, then live.
	sendResume(c, "s", "chat:p", lsns[0])
	ack := gwtest.Expect[*frames.Ack](c)
	if ack.Error == nil || ack.Error.Code != frames.CodeCursorExpired || !strings.Contains(ack.Error.Cause, "retention") {
		t.Fatalf("resume from a pruned offset: %+v", ack)
	}
	if snap := gwtest.Expect[*frames.Snapshot](c); snap.Cursor.LSN != lsns[14] {
		t.Fatalf("snapshot at %s, want the last pruned offset %s", snap.Cursor.LSN, lsns[14])
	}
	for i, op := range collect(t, c, "s", 5) {
		if op.LSN != lsns[15+i] {
			t.Fatalf("kept record %d at %s, want %s", i, op.LSN, lsns[15+i])
		}
	}
	live := c.Publish("live", 20, "chat:p", `"live"`)
	if op := collect(t, c, "s", 1)[0]; op.LSN != *live.LSN {
		t.Fatalf("live after the expired resume: %s, want %s", op.LSN, *live.LSN)
	}
}

// TestPersisted_PipelinedPublishes: one session's publishes do not wait
// for each other's commit; the log holds them in seq order and each ack
// names its record.
func TestPersisted_PipelinedPublishes(t *testing.T) {
	t.Parallel()
	n := startPersistNode(t, t.TempDir())
	c := gwtest.Dial(t, n.url, nil)
	c.Hello("pipe", 0)
	lsnOf := pipelinePublishes(t, c, "chat:pipe", 0, 500) // one message, 500 frames
	checkPublishLog(t, n, "chat:pipe", 0, 500, lsnOf)
}

// pipelinePublishes sends publishes seq from..from+count-1 (key k<seq>,
// data <seq>) to topic in one message and returns each key's acked lsn,
// failing the test on an error ack.
func pipelinePublishes(t *testing.T, c *gwtest.Conn, topic string, from, count int) map[string]string {
	t.Helper()
	var msg strings.Builder
	for i := from; i < from+count; i++ {
		if i > from {
			msg.WriteByte('\n')
		}
		fmt.Fprintf(&msg, `{"type":"mutate","v":1,"key":"k%d","seq":%d,"name":"publish","input":{"topic":%q,"data":%d}}`, i, i, topic, i)
	}
	c.SendRaw(msg.String())
	lsnOf := map[string]string{}
	for len(lsnOf) < count {
		ack := gwtest.Expect[*frames.Ack](c)
		if ack.Error != nil || ack.LSN == nil {
			t.Fatalf("ack %+v", ack)
		}
		lsnOf[ack.Ref] = *ack.LSN
	}
	return lsnOf
}

// checkPublishLog checks that topic's log holds exactly the publishes
// from..from+count-1 of pipelinePublishes, in order, each at its acked lsn.
func checkPublishLog(t *testing.T, n *persistNode, topic string, from, count int, lsnOf map[string]string) {
	t.Helper()
	res, err := n.db.Read(context.Background(), topic, storage.ZeroOffset, 1<<20)
	if err != nil || len(res.Records) != count {
		t.Fatalf("log holds %d records (%v), want the %d acked", len(res.Records), err, count)
	}
	for i, r := range res.Records {
		var rec struct {
			Key  string `json:"key"`
			Data int    `json:"data"`
		}
		if err := json.Unmarshal(r.Data, &rec); err != nil || rec.Data != from+i || rec.Key != fmt.Sprint("k", from+i) {
			t.Fatalf("record %d: %s (%v)", i, r.Data, err)
		}
		if lsnOf[rec.Key] != r.Offset {
			t.Fatalf("ack of %s named %s, the record is at %s", rec.Key, lsnOf[rec.Key], r.Offset)
		}
	}
}

// A persisted topic's stream deleted while a client pipelines publishes
// to it: the first append after the delete makes the stream anew, and
// every publish acked after it is in the new log, in seq order. (Retries
// that ran out of order used to be taken for duplicates of later seqs
// and acked without being written.)
func TestPersisted_PipelinedAcrossDelete(t *testing.T) {
	t.Parallel()
	n := startPersistNode(t, t.TempDir())
	c := gwtest.Dial(t, n.url, nil)
	c.Hello("pipe", 0)
	if ack := c.Publish("k0", 0, "chat:del", `0`); ack.Error != nil {
		t.Fatalf("first publish: %+v", ack.Error)
	}
	if err := n.db.Delete(context.Background(), "chat:del"); err != nil {
		t.Fatal(err)
	}
	lsnOf := pipelinePublishes(t, c, "chat:del", 1, 200)
	checkPublishLog(t, n, "chat:del", 1, 200, lsnOf)
}

// gatedLog holds every WaitID (the tailer's) until open is closed: a tailer that lags the
// log, as on a node whose tailer has not woken yet.
type gatedLog struct {
	*storage.DB
	open chan struct{}
}

func (g *gatedLog) WaitID(ctx context.Context, name, after string, id uint64) error {
	select {
	case <-g.open:
	case <-ctx.Done():
		return ctx.Err()
	}
	return g.DB.WaitID(ctx, name, after, id)
}

// TestPersisted_CursorAheadOfTheTailer: a cursor that is in the log but
// past this node's tailer (another node delivered it first) resumes once
// the tailer passes it: no X_CURSOR_EXPIRED, nothing twice.
func TestPersisted_CursorAheadOfTheTailer(t *testing.T) {
	t.Parallel()
	var log *headSignalLog
	db, srv := startWrappedNode(t, nil, func(db *storage.DB) gateway.StreamLog {
		log = &headSignalLog{gatedLog: gatedLog{DB: db, open: make(chan struct{})}, head: make(chan struct{})}
		return log
	})
	makeStream(t, db, "chat:lag")
	first := gwtest.Dial(t, srv.url, nil)
	first.Hello("", 0)
	first.Subscribe("s", "chat:lag") // starts the tailer at the empty log's tail
	ctx := context.Background()
	var lsns []string
	for i := range 3 {
		res, err := db.Append(ctx, "chat:lag", storage.AppendRequest{Records: [][]byte{[]byte(fmt.Sprint(i))}})
		if err != nil {
			t.Fatal(err)
		}
		lsns = append(lsns, res.Offset)
	}
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("", 0)
	log.armed.Store(true)
	sendResume(c, "s", "chat:lag", lsns[1]) // ahead of the gated tailer
	log.waitHead(t)                         // the wait's look at the log: the resume has joined
	close(log.open)
	if ack := gwtest.Expect[*frames.Ack](c); ack.Error != nil {
		t.Fatalf("resume ahead of the tailer: %+v", ack.Error)
	}
	if snap := gwtest.Expect[*frames.Snapshot](c); snap.Cursor.LSN != lsns[1] {
		t.Fatalf("snapshot at %s, want the cursor %s", snap.Cursor.LSN, lsns[1])
	}
	if op := collect(t, c, "s", 1)[0]; op.LSN != lsns[2] {
		t.Fatalf("first insert after the cursor: %s, want %s", op.LSN, lsns[2])
	}
	live, err := db.Append(ctx, "chat:lag", storage.AppendRequest{Records: [][]byte{[]byte(`"live"`)}})
	if err != nil {
		t.Fatal(err)
	}
	if op := collect(t, c, "s", 1)[0]; op.LSN != live.Offset {
		t.Fatalf("next insert %s, want the live record %s (nothing twice)", op.LSN, live.Offset)
	}
}

// A persisted topic's stream deleted over HTTP while it has subscribers,
// then made anew with records in it: each subscriber is told
// (X_CURSOR_EXPIRED and a snapshot at the new log's start) and then gets
// the new log's records, over HTTP and WebSocket alike, instead of waiting
// at offsets of the old one.
func TestPersisted_StreamDeletedAndMadeAnew(t *testing.T) {
	t.Parallel()
	n := startPersistNode(t, t.TempDir())
	makeStream(t, n.db, "chat:gone")
	sub := gwtest.Dial(t, n.url, nil)
	sub.Hello("", 0)
	first := sub.Subscribe("s", "chat:gone")
	if !strings.HasPrefix(first.Cursor.Digest, "log:") {
		t.Fatalf("snapshot digest %q, want the log's", first.Cursor.Digest)
	}
	pub := gwtest.Dial(t, n.url, nil)
	pub.Hello("", 0)
	for i := range 3 {
		if ack := pub.Publish(fmt.Sprint("k", i), int64(i), "chat:gone", fmt.Sprint(i)); ack.Error != nil {
			t.Fatalf("publish %d: %+v", i, ack.Error)
		}
	}
	old := collect(t, sub, "s", 3)

	do := func(method, body string) { streamRequest(t, n, method, "chat:gone", body) }
	do(http.MethodDelete, "")
	ack := gwtest.Expect[*frames.Ack](sub)
	if ack.Ref != "s" || ack.Error == nil || ack.Error.Code != frames.CodeCursorExpired {
		t.Fatalf("after the delete: ack %+v, want X_CURSOR_EXPIRED for s", ack)
	}
	if snap := gwtest.Expect[*frames.Snapshot](sub); snap.SID != "s" || snap.Cursor.LSN != storage.ZeroOffset || snap.Cursor.Digest != "" {
		t.Fatalf("after the delete: snapshot %+v, want one at %s with no log digest (there is no log)", snap, storage.ZeroOffset)
	}

	// Made anew with one record over HTTP (its offset is the old log's
	// first), then a WebSocket publish: a snapshot naming the new log, with
	// no second reset (nothing came between), then both records in the new
	// log's order.
	do(http.MethodPut, "")
	do(http.MethodPost, `{"from":"backend"}`)
	ack = pub.Publish("k3", 3, "chat:gone", `"ws"`)
	if ack.Error != nil {
		t.Fatalf("publish after the recreate: %+v", ack.Error)
	}
	resets, digest, ops := resetThenCollect(t, sub, "s", 2)
	if resets != 0 || !strings.HasPrefix(digest, "log:") || digest == first.Cursor.Digest {
		t.Fatalf("after the recreate: %d resets, digest %q; want none and a new log's (the first was %q)", resets, digest, first.Cursor.Digest)
	}
	if ops[0].LSN != old[0].LSN || rowData(t, ops[0]) != `{"from":"backend"}` ||
		ops[1].LSN != *ack.LSN || rowData(t, ops[1]) != `"ws"` {
		t.Fatalf("new log's records arrived as %+v (old log's first at %s)", ops, old[0].LSN)
	}

	// Deleted and made anew at once: whether or not the tailer saw the gap
	// (a reset to the new log, or one to no log and then the new log's
	// snapshot), there is one reset and the last snapshot names the newest
	// log.
	do(http.MethodDelete, "")
	do(http.MethodPut, "")
	do(http.MethodPost, `{"again":true}`)
	resets2, digest2, ops := resetThenCollect(t, sub, "s", 1)
	if resets2 != 1 || !strings.HasPrefix(digest2, "log:") || digest2 == digest {
		t.Fatalf("after the quick recreate: %d resets, digest %q, want 1 and a newer log's than %q", resets2, digest2, digest)
	}
	if ops[0].LSN != old[0].LSN || rowData(t, ops[0]) != `{"again":true}` {
		t.Fatalf("after the quick recreate: %+v", ops[0])
	}

	// Closed over HTTP, then deleted and made anew: the tailer of a closed
	// stream still notices.
	streamRequest(t, n, http.MethodPost, "chat:gone", "", "Stream-Closed", "true")
	do(http.MethodDelete, "")
	do(http.MethodPut, "")
	do(http.MethodPost, `{"third":true}`)
	resets3, _, ops := resetThenCollect(t, sub, "s", 1)
	if rowData(t, ops[0]) != `{"third":true}` {
		t.Fatalf("after the closed stream was made anew: %+v", ops[0])
	}
	want := fmt.Sprintf(`syncgate_resumes_total{outcome="expired"} %d`, 1+resets+resets2+resets3)
	if m := n.scrape(t); !strings.Contains(m, want) {
		t.Fatalf("resets not counted, want %s:\n%s", want, grepLines(m, "syncgate_resumes_total"))
	}
}

// resetThenCollect reads the resets of sid (X_CURSOR_EXPIRED and a
// snapshot at the start) and the snapshots naming a log made where there
// was none (no ack), then patches until it holds n inserts. It returns the
// number of resets, the last snapshot's digest and the inserts. It wants at
// least one snapshot, and the last to name a log.
func resetThenCollect(t *testing.T, c *gwtest.Conn, sid string, n int) (int, string, []frames.PatchOp) {
	t.Helper()
	resets, snaps, digest := 0, 0, ""
	for {
		var reset bool
		if ack, ok := c.Peek().(*frames.Ack); ok {
			if c.Next(); ack.Ref != sid || ack.Error == nil || ack.Error.Code != frames.CodeCursorExpired {
				t.Fatalf("after %d resets: ack %+v, want X_CURSOR_EXPIRED for %s", resets, ack, sid)
			}
			reset = true
		} else if _, ok := c.Peek().(*frames.Snapshot); !ok {
			break
		}
		snap := gwtest.Expect[*frames.Snapshot](c)
		if snap.SID != sid || snap.Cursor.LSN != storage.ZeroOffset || (!reset && digest != "") {
			t.Fatalf("snapshot %+v (reset %v, after one naming %q), want one at %s", snap, reset, digest, storage.ZeroOffset)
		}
		if reset {
			resets++
		}
		snaps, digest = snaps+1, snap.Cursor.Digest
	}
	if snaps == 0 || !strings.HasPrefix(digest, "log:") {
		t.Fatalf("%d snapshots, the last naming %q: want a log's", snaps, digest)
	}
	return resets, digest, collect(t, c, sid, n)
}

// streamRequest sends an HTTP request for topic's stream, with a JSON body
// and any headers given as name, value pairs, and fails the test unless it
// succeeds.
func streamRequest(t *testing.T, n *persistNode, method, topic, body string, header ...string) {
	t.Helper()
	req, err := http.NewRequest(method, n.ts.URL+"/v1/stream/"+topic, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("%s %s: %s", method, topic, resp.Status)
	}
}

// A subscription still replaying its backlog when the stream is deleted
// and made anew: the client gets part of the old log, then X_CURSOR_EXPIRED
// and a snapshot at the new log's start, then every record of the new log,
// none skipped (the replayer does not read the new log at old offsets).
func TestPersisted_ResetWhileReplaying(t *testing.T) {
	t.Parallel()
	n := startPersistNodeWith(t, t.TempDir(), nil, func(c *gateway.Config) { c.SendQueueBytes = 1 << 20 })
	const topic = "chat:replayreset"
	// A backlog far larger than the socket buffers and the send queue, so
	// that a replay to a client that does not read stalls in it.
	pad := strings.Repeat("x", 2000)
	streamRequest(t, n, http.MethodPut, topic, "")
	for range 10 {
		var b strings.Builder
		b.WriteByte('[')
		for i := range 1000 {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"old":%d,"pad":"%s"}`, i, pad)
		}
		b.WriteByte(']')
		streamRequest(t, n, http.MethodPost, topic, b.String())
	}
	live := gwtest.Dial(t, n.url, nil)
	live.Hello("", 0)
	live.Subscribe("l", topic)
	r := gwtest.Dial(t, n.url, nil)
	r.Hello("", 0)
	sendResume(r, "s", topic, storage.ZeroOffset)
	// The ack says the resume was taken before the log is replaced; without
	// waiting for it, a slow server may take the resume after the delete.
	if ack := gwtest.Expect[*frames.Ack](r); ack.Ref != "s" || ack.Error != nil {
		t.Fatalf("resume ack %+v %+v", ack, ack.Error)
	}
	gwtest.Expect[*frames.Snapshot](r)

	// The replay is stalled now or soon; replace the log under it. The
	// live subscriber shows when the tailer has reset and read the new log.
	streamRequest(t, n, http.MethodDelete, topic, "")
	streamRequest(t, n, http.MethodPut, topic, "")
	streamRequest(t, n, http.MethodPost, topic, `[{"new":0},{"new":1},{"new":2},{"new":3},{"new":4}]`)
	_, newDigest, newOps := resetThenCollect(t, live, "l", 5)

	old := 0
	for {
		f := r.Next()
		if p, ok := f.(*frames.Patch); ok {
			old += len(p.Patches)
			continue
		}
		ack, ok := f.(*frames.Ack)
		if !ok || ack.Ref != "s" || ack.Error == nil || ack.Error.Code != frames.CodeCursorExpired {
			t.Fatalf("after %d old records: %T %+v, want X_CURSOR_EXPIRED", old, f, f)
		}
		break
	}
	if old >= 10000 {
		t.Fatalf("the whole old log (%d) was replayed: the replay never stalled, so the test proves nothing", old)
	}
	snap := gwtest.Expect[*frames.Snapshot](r)
	if snap.Cursor.LSN != storage.ZeroOffset {
		t.Fatalf("snapshot after the reset at %s", snap.Cursor.LSN)
	}
	// When the tailer saw the log missing, then made anew, and the reset
	// named no log: a snapshot naming the new log follows (no second
	// reset).
	var got []frames.PatchOp
	digest := snap.Cursor.Digest
	switch r.Peek().(type) {
	case *frames.Ack, *frames.Snapshot:
		_, digest, got = resetThenCollect(t, r, "s", 5)
	default:
		got = collect(t, r, "s", 5)
	}
	if digest != newDigest {
		t.Fatalf("replaying subscriber's last snapshot names log %q, the live one's %q", digest, newDigest)
	}
	for i := range got {
		if got[i].LSN != newOps[i].LSN || rowData(t, got[i]) != rowData(t, newOps[i]) {
			t.Fatalf("new record %d: %+v, the live subscriber got %+v", i, got[i], newOps[i])
		}
	}
}

// A client offline while the topic's stream was deleted and made anew
// resumes with a cursor of the old log. The new log's offsets start again,
// so the cursor's offset may well lie inside it: the cursor's digest tells
// the logs apart, and the client is answered as a live subscriber was
// (X_CURSOR_EXPIRED, then the new log from its start), never replayed
// from the middle of the new log.
func TestPersisted_CursorOfADeletedLog(t *testing.T) {
	t.Parallel()
	n := startPersistNode(t, t.TempDir())
	const topic = "chat:reborn"
	makeStream(t, n.db, topic)
	c := gwtest.Dial(t, n.url, nil)
	c.Hello("", 0)
	snap := c.Subscribe("s", topic)
	for i := range 3 {
		if ack := c.Publish(fmt.Sprint("k", i), int64(i), topic, fmt.Sprint(i)); ack.Error != nil {
			t.Fatalf("publish %d: %+v", i, ack.Error)
		}
	}
	ops := collect(t, c, "s", 3)
	oldCursor := snap.Cursor
	oldCursor.LSN = ops[2].LSN
	c.Close()
	// Offline: no tailer runs for the topic while its stream is replaced.
	waitMetric(t, n, "syncgate_persisted_tailers 0")

	streamRequest(t, n, http.MethodDelete, topic, "")
	streamRequest(t, n, http.MethodPut, topic, "")
	streamRequest(t, n, http.MethodPost, topic, `[{"new":0},{"new":1},{"new":2},{"new":3},{"new":4}]`)

	r := gwtest.Dial(t, n.url, nil)
	r.Hello("", 0)
	r.Send(&frames.Subscribe{Op: frames.OpAdd, SID: "s", Target: frames.Target{Kind: frames.TargetTopic, Topic: topic, Cursor: &oldCursor}})
	ack := gwtest.Expect[*frames.Ack](r)
	if ack.Ref != "s" || ack.Error == nil || ack.Error.Code != frames.CodeCursorExpired || !strings.Contains(ack.Error.Cause, "deleted") {
		t.Fatalf("resume with the old log's cursor: ack %+v, want X_CURSOR_EXPIRED naming the deleted log", ack.Error)
	}
	snap = gwtest.Expect[*frames.Snapshot](r)
	if snap.Cursor.LSN != storage.ZeroOffset || !strings.HasPrefix(snap.Cursor.Digest, "log:") || snap.Cursor.Digest == oldCursor.Digest {
		t.Fatalf("snapshot %+v, want one at %s of the new log (old digest %q)", snap.Cursor, storage.ZeroOffset, oldCursor.Digest)
	}
	got := collect(t, r, "s", 5)
	for i, op := range got {
		if want := fmt.Sprintf(`{"new":%d}`, i); rowData(t, op) != want {
			t.Fatalf("record %d: %s, want %s", i, rowData(t, op), want)
		}
	}
	newCursor := snap.Cursor

	// A cursor of the new log resumes in it; the snapshot carries its digest.
	r2 := gwtest.Dial(t, n.url, nil)
	r2.Hello("", 0)
	newCursor.LSN = got[1].LSN
	r2.Send(&frames.Subscribe{Op: frames.OpAdd, SID: "s", Target: frames.Target{Kind: frames.TargetTopic, Topic: topic, Cursor: &newCursor}})
	if ack := gwtest.Expect[*frames.Ack](r2); ack.Error != nil {
		t.Fatalf("resume in the new log: %+v", ack.Error)
	}
	if snap := gwtest.Expect[*frames.Snapshot](r2); snap.Cursor.LSN != got[1].LSN || snap.Cursor.Digest != newCursor.Digest {
		t.Fatalf("resume in the new log: snapshot %+v", snap.Cursor)
	}
	if rest := collect(t, r2, "s", 3); rest[0].LSN != got[2].LSN {
		t.Fatalf("resume in the new log went on at %s, want %s", rest[0].LSN, got[2].LSN)
	}

	// A cursor without a digest (built by hand, or by an older client) is
	// taken as a position in the log there is now, as before digests.
	r3 := gwtest.Dial(t, n.url, nil)
	r3.Hello("", 0)
	resume(t, r3, "s", topic, got[3].LSN)
	if rest := collect(t, r3, "s", 1); rest[0].LSN != got[4].LSN {
		t.Fatalf("digest-less resume went on at %s, want %s", rest[0].LSN, got[4].LSN)
	}
	if m := n.scrape(t); !strings.Contains(m, `syncgate_resumes_total{outcome="expired"} 1`) {
		t.Fatalf("expired resume not counted:\n%s", grepLines(m, "syncgate_resumes_total"))
	}
}

// A persisted topic's stream deleted over HTTP while this node had no
// subscriber to it (no tailer watching) is subscribed to as one never
// made (not made anew by the subscribe, nor refused with X_INTERNAL); the
// next publish makes it, and the subscriber gets it.
func TestPersisted_SubscribeAfterDeleteWithoutTailer(t *testing.T) {
	t.Parallel()
	n := startPersistNode(t, t.TempDir())
	makeStream(t, n.db, "chat:gone")
	c := gwtest.Dial(t, n.url, nil)
	c.Hello("", 0)
	c.Subscribe("s", "chat:gone")
	c.Send(&frames.Subscribe{Op: frames.OpDrop, SID: "s", Target: frames.Target{Kind: frames.TargetTopic, Topic: "chat:gone"}})
	if ack := gwtest.Expect[*frames.Ack](c); ack.Error != nil {
		t.Fatalf("drop: %+v", ack.Error)
	}
	streamRequest(t, n, http.MethodDelete, "chat:gone", "")
	if snap := c.Subscribe("s2", "chat:gone"); snap.Cursor.Digest != "" { // fails the test on an error ack
		t.Fatalf("snapshot of a deleted stream names log %q", snap.Cursor.Digest)
	}
	notFound(t, n.db, "chat:gone")
	if ack := c.Publish("k0", 0, "chat:gone", `"back"`); ack.Error != nil {
		t.Fatalf("publish: %+v", ack.Error)
	}
	expectMade(t, c, "s2")
	if p := gwtest.Expect[*frames.Patch](c); p.SID != "s2" || !strings.Contains(string(p.Patches[0].Row), `"back"`) {
		t.Fatalf("patch %+v", p)
	}
}

// gateReplayLog holds reads from the log's start (the replayer's first
// page) until open is closed, and records how far other reads (the
// tailer's) have got.
type gateReplayLog struct {
	*storage.DB
	open     chan struct{}
	tailRead atomic.Pointer[string]
}

func (g *gateReplayLog) Read(ctx context.Context, name, after string, maxBytes int) (storage.ReadResult, error) {
	if after == storage.ZeroOffset {
		select {
		case <-g.open:
		case <-ctx.Done():
			return storage.ReadResult{}, ctx.Err()
		}
	}
	res, err := g.DB.Read(ctx, name, after, maxBytes)
	if err == nil && after != storage.ZeroOffset {
		next := res.Next
		g.tailRead.Store(&next)
	}
	return res, err
}

// Live patches held while a subscription replays are bounded by the send
// queue, in bytes (a quarter of SendQueueBytes) and in frames (a quarter
// of SendQueueMessages): past either, the replay reads them from the log
// instead, so queueing what is held when the replay ends never overflows
// the queue. Each bound was missing once, and a session only a moment
// behind was closed 4001 (slow consumer) at the seam of a resume.
func TestPersisted_HeldPatchesBounded(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name          string
		queue         func(c *gateway.Config)
		backlog, live int
		pad           int // bytes of padding per record
	}{
		{"bytes", func(c *gateway.Config) { c.SendQueueBytes = 256 << 10 }, 100, 400, 1000}, // 400 KiB held
		{"frames", func(c *gateway.Config) { c.SendQueueMessages = 256 }, 10, 1500, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var g *gateReplayLog
			n := startPersistNodeWith(t, t.TempDir(), &storage.Options{NoSync: true}, func(c *gateway.Config) {
				tt.queue(c)
				g = &gateReplayLog{DB: c.Log.(*storage.DB), open: make(chan struct{})}
				c.Log = g
			})
			topic := "chat:held-" + tt.name
			pad := strings.Repeat("x", tt.pad)
			appendN := func(from, count int) string {
				var tail string
				for i := from; i < from+count; i++ {
					res, err := n.db.Append(context.Background(), topic, storage.AppendRequest{Records: [][]byte{fmt.Appendf(nil, `{"i":%d,"pad":%q}`, i, pad)}})
					if err != nil {
						t.Fatal(err)
					}
					tail = res.Offset
				}
				return tail
			}
			streamRequest(t, n, http.MethodPut, topic, "")
			appendN(0, tt.backlog)
			c := gwtest.Dial(t, n.url, nil)
			c.C.SetReadLimit(-1)
			c.Hello("", 0)
			sendResume(c, "s", topic, storage.ZeroOffset) // the replayer waits at the gate
			tail := appendN(tt.backlog, tt.live)          // live patches, held
			gwtest.Eventually(t, gwtest.Timeout, "the tailer reads the live records", func() bool {
				p := g.tailRead.Load()
				return p != nil && *p == tail
			})
			close(g.open)
			got := 0
			for got < tt.backlog+tt.live {
				f, err := c.NextErr(gwtest.Timeout)
				if err != nil {
					t.Fatalf("after %d of %d inserts: %v", got, tt.backlog+tt.live, err)
				}
				p, ok := f.(*frames.Patch)
				if !ok {
					continue // the resume's ack and snapshot
				}
				for _, op := range p.Patches {
					if !strings.Contains(string(op.Row), fmt.Sprintf(`"i":%d,`, got)) {
						t.Fatalf("insert %d: %.60s", got, op.Row)
					}
					got++
				}
			}
		})
	}
}

// TestPersisted_FencedInTheLog: a client whose producer the log has seen
// at a higher epoch (another node, or an HTTP writer with its producer
// id) is answered X_EPOCH_FENCED, and nothing of it is written.
func TestPersisted_FencedInTheLog(t *testing.T) {
	t.Parallel()
	n := startPersistNode(t, t.TempDir())
	if _, _, err := n.db.Create(t.Context(), "chat:f", storage.CreateOptions{ContentType: "application/json"}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.db.Append(t.Context(), "chat:f", storage.AppendRequest{
		Records: [][]byte{[]byte(`"newer"`)}, Producer: &storage.Producer{ID: "app", Epoch: 5, Seq: 0},
	}); err != nil {
		t.Fatal(err)
	}
	c := gwtest.Dial(t, n.url, nil)
	c.Hello("app", 1)
	ack := c.Publish("k0", 0, "chat:f", `"older"`)
	if ack.Error == nil || ack.Error.Code != frames.CodeEpochFenced || ack.LSN != nil {
		t.Fatalf("publish from a fenced epoch: %+v", ack)
	}
	res, err := n.db.Read(t.Context(), "chat:f", storage.ZeroOffset, 0)
	if err != nil || len(res.Records) != 1 {
		t.Fatalf("log: %d records, %v; want only the newer epoch's", len(res.Records), err)
	}
}

// TestPersisted_HTTPCreateMustBeJSON: a PUT at a persisted topic's name
// of a type other than application/json (or of none, which defaults to
// octet-stream) is refused, since WebSocket subscribers could not read
// it; other names take any type.
func TestPersisted_HTTPCreateMustBeJSON(t *testing.T) {
	t.Parallel()
	n := startPersistNode(t, t.TempDir())
	put := func(name, ct string) (int, string) {
		return httpDo(t, "PUT", n.ts.URL+"/v1/stream/"+name, "", ct, "")
	}
	for _, ct := range []string{"text/plain", ""} {
		if code, body := put("chat:t", ct); code != http.StatusConflict || !strings.Contains(body, "application/json") {
			t.Fatalf("PUT chat:t as %q: %d %s, want 409 naming application/json", ct, code, body)
		}
	}
	if _, err := n.db.Head(t.Context(), "chat:t"); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("a refused PUT made the stream: %v", err)
	}
	if code, body := put("chat:t", "application/json; charset=utf-8"); code != http.StatusCreated {
		t.Fatalf("PUT chat:t as JSON: %d %s", code, body)
	}
	if code, body := put("notes:t", "text/plain"); code != http.StatusCreated {
		t.Fatalf("PUT of a topic that is not persisted: %d %s", code, body)
	}
}
