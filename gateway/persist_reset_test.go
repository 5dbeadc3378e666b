package gateway_test

import (
	"context"
	"errors"
	"fmt"
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

// Persisted topics whose stream is deleted or made anew under resumes
// (see also TestPersisted_StreamDeletedAndMadeAnew,
// TestPersisted_ResetWhileReplaying and TestPersisted_CursorOfADeletedLog).

// waitMetric polls the node's /metrics until it has the line want.
func waitMetric(t *testing.T, n *persistNode, want string) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		m := n.scrape(t)
		if strings.Contains(m, want) {
			return
		}
		select {
		case <-deadline:
			t.Fatalf("metrics never had %q:\n%s", want, m)
		case <-tick.C:
		}
	}
}

// startWrappedNode starts a gateway persisting chat:* on a bbolt log in a
// temp dir, seen through wrap (a log that holds or watches the tailer);
// tweak, if any, adjusts the gateway's configuration.
func startWrappedNode(t *testing.T, opts *storage.Options, wrap func(*storage.DB) gateway.StreamLog, tweak ...func(*gateway.Config)) (*storage.DB, *testServer) {
	t.Helper()
	db, err := storage.Open(filepath.Join(t.TempDir(), "log.db"), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	cfg := gateway.Config{Log: wrap(db), Persist: []string{"chat:*"}}
	for _, f := range tweak {
		f(&cfg)
	}
	gw, err := gateway.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return db, newTestServerFor(t, gw)
}

// newLogRecords is the body of the stream made anew in these tests.
var newLogRecords = [][]byte{[]byte(`{"new":0}`), []byte(`{"new":1}`), []byte(`{"new":2}`), []byte(`{"new":3}`), []byte(`{"new":4}`)}

// checkNewLog checks that ops are the made-anew stream's five records.
func checkNewLog(t *testing.T, who string, ops []frames.PatchOp) {
	t.Helper()
	for i, op := range ops {
		if want := string(newLogRecords[i]); rowData(t, op) != want || op.LSN != storage.FormatOffset(uint64(i+1)) {
			t.Fatalf("%s: record %d is %s at %s, want %s at %s", who, i, rowData(t, op), op.LSN, want, storage.FormatOffset(uint64(i+1)))
		}
	}
}

// headSignalLog is a gatedLog that closes head at the first Head once
// armed.
type headSignalLog struct {
	gatedLog
	armed atomic.Bool
	head  chan struct{}
}

// waitHead waits for the armed Head call.
func (l *headSignalLog) waitHead(t *testing.T) {
	t.Helper()
	select {
	case <-l.head:
	case <-time.After(gwtest.Timeout):
		t.Fatal("the log's head was not read")
	}
}

func (l *headSignalLog) Head(ctx context.Context, name string) (storage.Info, error) {
	if l.armed.CompareAndSwap(true, false) {
		close(l.head)
	}
	return l.DB.Head(ctx, name)
}

// A resume whose cursor is ahead of this node's tailer waits for the
// tailer to pass it; if meanwhile the stream is made anew and the tailer
// publishes the new log past the cursor's offset, the resume gets the
// reset and then every record of the new log (the wait compared offsets of
// two logs, and dropped the new log's records).
func TestPersisted_ResetWhileCatchingUp(t *testing.T) {
	t.Parallel()
	var log *headSignalLog
	db, srv := startWrappedNode(t, nil, func(db *storage.DB) gateway.StreamLog {
		log = &headSignalLog{gatedLog: gatedLog{DB: db, open: make(chan struct{})}, head: make(chan struct{})}
		return log
	})
	const topic = "chat:catchup"
	makeStream(t, db, topic)
	live := gwtest.Dial(t, srv.url, nil)
	live.Hello("", 0)
	live.Subscribe("l", topic) // the tailer, gated, at the empty log
	ctx := t.Context()
	for i := range 3 {
		if _, err := db.Append(ctx, topic, storage.AppendRequest{Records: [][]byte{fmt.Append(nil, i)}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Delete(ctx, topic); err != nil {
		t.Fatal(err)
	}
	if _, _, err := db.Create(ctx, topic, storage.CreateOptions{ContentType: "application/json", Records: newLogRecords}); err != nil {
		t.Fatal(err)
	}
	r := gwtest.Dial(t, srv.url, nil)
	r.Hello("", 0)
	log.armed.Store(true)
	sendResume(r, "s", topic, storage.FormatOffset(2)) // ahead of the tailer: it waits
	log.waitHead(t)                                    // the wait's look at the log: the resume has joined
	close(log.open)

	_, liveDigest, ops := resetThenCollect(t, live, "l", 5)
	checkNewLog(t, "live subscriber", ops)
	_, digest, ops := resetThenCollect(t, r, "s", 5)
	checkNewLog(t, "resumed subscriber", ops)
	if digest != liveDigest {
		t.Fatalf("resumed subscriber's snapshot names log %q, the live one's %q", digest, liveDigest)
	}
}

// lagLog holds the tailer after a WaitID returns, while hold is set: a
// tailer that has not yet acted on what it found.
type lagLog struct {
	*storage.DB
	hold atomic.Pointer[chan struct{}]
	held chan struct{}
}

func (l *lagLog) WaitID(ctx context.Context, name, after string, id uint64) error {
	err := l.DB.WaitID(ctx, name, after, id)
	if p := l.hold.Load(); p != nil {
		l.held <- struct{}{}
		<-*p
	}
	return err
}

// A resume with a cursor of the old log, before this node's tailer has
// acted on the stream's replacement, is never replayed from the new log
// at the old offsets: the replay finds the page is another stream's and
// stops, and the tailer's reset follows.
func TestPersisted_ReplayNeverReadsANewerLog(t *testing.T) {
	t.Parallel()
	var log *lagLog
	db, srv := startWrappedNode(t, nil, func(db *storage.DB) gateway.StreamLog {
		log = &lagLog{DB: db, held: make(chan struct{}, 1)}
		return log
	})
	const topic = "chat:lag"
	makeStream(t, db, topic)
	live := gwtest.Dial(t, srv.url, nil)
	live.Hello("", 0)
	snap := live.Subscribe("l", topic)
	ctx := t.Context()
	for i := range 3 {
		if _, err := db.Append(ctx, topic, storage.AppendRequest{Records: [][]byte{fmt.Appendf(nil, `{"old":%d}`, i)}}); err != nil {
			t.Fatal(err)
		}
	}
	old := collect(t, live, "l", 3)
	gate := make(chan struct{})
	log.hold.Store(&gate)
	if err := db.Delete(ctx, topic); err != nil {
		t.Fatal(err)
	}
	<-log.held // the tailer found the stream gone and is held before acting
	if _, _, err := db.Create(ctx, topic, storage.CreateOptions{ContentType: "application/json", Records: newLogRecords}); err != nil {
		t.Fatal(err)
	}
	cursor := snap.Cursor
	cursor.LSN = old[0].LSN
	r := gwtest.Dial(t, srv.url, nil)
	r.Hello("", 0)
	r.Send(&frames.Subscribe{Op: frames.OpAdd, SID: "s", Target: frames.Target{Kind: frames.TargetTopic, Topic: topic, Cursor: &cursor}})
	// The log the tailer is on is still the cursor's: the resume is
	// answered in it, with nothing replayed (the records read are another
	// log's).
	if ack := gwtest.Expect[*frames.Ack](r); ack.Error != nil {
		t.Fatalf("resume: %+v", ack.Error)
	}
	if s := gwtest.Expect[*frames.Snapshot](r); s.Cursor.LSN != cursor.LSN || s.Cursor.Digest != cursor.Digest {
		t.Fatalf("resume snapshot %+v, want the cursor's %+v", s.Cursor, cursor)
	}
	log.hold.Store(nil)
	close(gate)
	_, digest, ops := resetThenCollect(t, r, "s", 5)
	checkNewLog(t, "resumed subscriber", ops)
	if digest == cursor.Digest || !strings.HasPrefix(digest, "log:") {
		t.Fatalf("after the reset: digest %q, want the new log's (old %q)", digest, cursor.Digest)
	}
	_, _, ops = resetThenCollect(t, live, "l", 5)
	checkNewLog(t, "live subscriber", ops)
}

// A stream deleted and made anew empty is noticed by a tailer that found
// no stream (at once when made on this node, else within a second): its
// subscribers get a snapshot naming the new log (no second reset: they
// were at the zero offset with nothing after it), and a resume with the
// old log's cursor then gets the new log's digest too.
func TestPersisted_MadeAnewEmpty(t *testing.T) {
	t.Parallel()
	n := startPersistNode(t, t.TempDir())
	const topic = "chat:empty"
	makeStream(t, n.db, topic)
	live := gwtest.Dial(t, n.url, nil)
	live.Hello("", 0)
	snap := live.Subscribe("l", topic)
	streamRequest(t, n, http.MethodPost, topic, `{"a":1}`)
	ops := collect(t, live, "l", 1)
	streamRequest(t, n, http.MethodDelete, topic, "")
	if ack := gwtest.Expect[*frames.Ack](live); ack.Error == nil || ack.Error.Code != frames.CodeCursorExpired {
		t.Fatalf("after the delete: %+v", ack)
	}
	if s := gwtest.Expect[*frames.Snapshot](live); s.Cursor.Digest != "" {
		t.Fatalf("after the delete: digest %q, want none (no stream)", s.Cursor.Digest)
	}
	streamRequest(t, n, http.MethodPut, topic, "")
	s := gwtest.Expect[*frames.Snapshot](live)
	if !strings.HasPrefix(s.Cursor.Digest, "log:") || s.Cursor.Digest == snap.Cursor.Digest {
		t.Fatalf("after the empty recreate: digest %q, want a new log's (old %q)", s.Cursor.Digest, snap.Cursor.Digest)
	}
	cursor := snap.Cursor
	cursor.LSN = ops[0].LSN
	r := gwtest.Dial(t, n.url, nil)
	r.Hello("", 0)
	r.Send(&frames.Subscribe{Op: frames.OpAdd, SID: "s", Target: frames.Target{Kind: frames.TargetTopic, Topic: topic, Cursor: &cursor}})
	if ack := gwtest.Expect[*frames.Ack](r); ack.Error == nil || ack.Error.Code != frames.CodeCursorExpired {
		t.Fatalf("resume with the old log's cursor: %+v", ack)
	}
	if rs := gwtest.Expect[*frames.Snapshot](r); rs.Cursor.Digest != s.Cursor.Digest || rs.Cursor.LSN != storage.ZeroOffset {
		t.Fatalf("resume snapshot %+v, want the new log's start (%q)", rs.Cursor, s.Cursor.Digest)
	}
}

// The Go client across a reset while connected: the new log's records
// (whose offsets start again, below the old cursor) are delivered, not
// dropped as duplicates, and the cursor moves to the new log.
func TestPersisted_GoClientAcrossALiveReset(t *testing.T) {
	t.Parallel()
	n := startPersistNode(t, t.TempDir())
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	var mu sync.Mutex
	var events []client.EventKind
	c, err := client.Dial(ctx, n.url, &client.Options{Reconnect: true, OnEvent: func(e client.Event) {
		mu.Lock()
		events = append(events, e.Kind)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	makeStream(t, n.db, "chat:gc")
	got := make(chan frames.PatchOp, 100)
	sub, err := c.Subscribe(ctx, "chat:gc", nil, func(p *frames.Patch) {
		for _, op := range p.Patches {
			got <- op
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	next := func(what string) frames.PatchOp {
		t.Helper()
		select {
		case op := <-got:
			return op
		case <-ctx.Done():
			t.Fatalf("%s: no patch", what)
			return frames.PatchOp{}
		}
	}
	streamRequest(t, n, http.MethodPost, "chat:gc", `[1,2,3,4,5,6]`)
	for range 6 {
		next("old log")
	}
	before := sub.Cursor()
	streamRequest(t, n, http.MethodDelete, "chat:gc", "")
	streamRequest(t, n, http.MethodPut, "chat:gc", "")
	streamRequest(t, n, http.MethodPost, "chat:gc", `[10,20,30,40]`)
	for i, want := range []string{"10", "20", "30", "40"} {
		if op := next("new log"); rowData(t, op) != want || op.LSN != storage.FormatOffset(uint64(i+1)) {
			t.Fatalf("new log record %d: %s at %s, want %s", i, rowData(t, op), op.LSN, want)
		}
	}
	after := sub.Cursor()
	if after.LSN != storage.FormatOffset(4) || !strings.HasPrefix(after.Digest, "log:") || after.Digest == before.Digest {
		t.Fatalf("cursor after the reset %+v, before %+v", after, before)
	}
	if d := sub.Duplicates(); d != 0 {
		t.Fatalf("%d patches dropped as duplicates", d)
	}
	mu.Lock()
	defer mu.Unlock()
	expired := 0
	for _, k := range events {
		if k == client.EventCursorExpired {
			expired++
		}
	}
	if expired == 0 {
		t.Fatalf("no EventCursorExpired in %v", events)
	}
}

// A tailer that falls behind retention (here: held until maintenance has
// pruned records it never read) skips to the oldest record kept and tells
// its subscribers, instead of retrying the pruned read forever.
func TestPersisted_TailerBehindRetention(t *testing.T) {
	t.Parallel()
	var log *gatedLog
	db, srv := startWrappedNode(t, &storage.Options{Retention: storage.Retention{MaxRecords: 2}, MaintenanceInterval: 10 * time.Millisecond},
		func(db *storage.DB) gateway.StreamLog {
			log = &gatedLog{DB: db, open: make(chan struct{})}
			return log
		})
	const topic = "chat:behind"
	makeStream(t, db, topic)
	live := gwtest.Dial(t, srv.url, nil)
	live.Hello("", 0)
	snap := live.Subscribe("l", topic) // the tailer, gated, at the empty log
	ctx := t.Context()
	for _, rec := range newLogRecords { // one append each: retention removes whole appends
		if _, err := db.Append(ctx, topic, storage.AppendRequest{Records: [][]byte{rec}}); err != nil {
			t.Fatal(err)
		}
	}
	gwtest.Eventually(t, 10*time.Second, "retention keeps the last 2 records", func() bool {
		in, err := db.Head(ctx, topic)
		return err == nil && in.Pruned == storage.FormatOffset(3)
	})
	close(log.open)
	ack := gwtest.Expect[*frames.Ack](live)
	if ack.Ref != "l" || ack.Error == nil || ack.Error.Code != frames.CodeCursorExpired || !strings.Contains(ack.Error.Cause, "retention") {
		t.Fatalf("after the skip: ack %+v, want X_CURSOR_EXPIRED naming retention", ack.Error)
	}
	if s := gwtest.Expect[*frames.Snapshot](live); s.Cursor.LSN != storage.FormatOffset(3) || s.Cursor.Digest != snap.Cursor.Digest {
		t.Fatalf("after the skip: snapshot %+v, want one at %s of the same log", s.Cursor, storage.FormatOffset(3))
	}
	ops := collect(t, live, "l", 2)
	if rowData(t, ops[0]) != string(newLogRecords[3]) || rowData(t, ops[1]) != string(newLogRecords[4]) {
		t.Fatalf("kept records: %+v", ops)
	}
	if _, err := db.Append(ctx, topic, storage.AppendRequest{Records: [][]byte{[]byte(`"after"`)}}); err != nil {
		t.Fatal(err)
	}
	if op := collect(t, live, "l", 1)[0]; rowData(t, op) != `"after"` || op.LSN != storage.FormatOffset(6) {
		t.Fatalf("a record appended after the skip: %+v", op)
	}
	// A subscriber that joins now starts after what was delivered.
	late := gwtest.Dial(t, srv.url, nil)
	late.Hello("", 0)
	if s := late.Subscribe("l", topic); s.Cursor.LSN != storage.FormatOffset(6) {
		t.Fatalf("a later subscriber's snapshot at %s, want %s", s.Cursor.LSN, storage.FormatOffset(6))
	}
}

// A resume with a deleted log's cursor starts over in the new log, whose
// start retention has already removed: the client is told twice (deleted,
// then pruned), and gets what the new log keeps.
func TestPersisted_ResumeIntoAPrunedLog(t *testing.T) {
	t.Parallel()
	n := startPersistNodeWith(t, t.TempDir(), &storage.Options{
		Retention: storage.Retention{MaxRecords: 2}, MaintenanceInterval: 10 * time.Millisecond})
	const topic = "chat:reprune"
	makeStream(t, n.db, topic)
	c := gwtest.Dial(t, n.url, nil)
	c.Hello("", 0)
	snap := c.Subscribe("s", topic)
	streamRequest(t, n, http.MethodPost, topic, `{"old":0}`)
	cursor := snap.Cursor
	cursor.LSN = collect(t, c, "s", 1)[0].LSN
	c.Close()
	waitMetric(t, n, "syncgate_persisted_tailers 0")
	streamRequest(t, n, http.MethodDelete, topic, "")
	streamRequest(t, n, http.MethodPut, topic, "")
	for _, rec := range newLogRecords {
		streamRequest(t, n, http.MethodPost, topic, string(rec))
	}
	gwtest.Eventually(t, 10*time.Second, "retention keeps the new log's last 2 records", func() bool {
		in, err := n.db.Head(t.Context(), topic)
		return err == nil && in.Pruned == storage.FormatOffset(3)
	})
	r := gwtest.Dial(t, n.url, nil)
	r.Hello("", 0)
	r.Send(&frames.Subscribe{Op: frames.OpAdd, SID: "s", Target: frames.Target{Kind: frames.TargetTopic, Topic: topic, Cursor: &cursor}})
	for _, want := range []struct{ cause, lsn string }{{"deleted", storage.ZeroOffset}, {"retention", storage.FormatOffset(3)}} {
		ack := gwtest.Expect[*frames.Ack](r)
		if ack.Error == nil || ack.Error.Code != frames.CodeCursorExpired || !strings.Contains(ack.Error.Cause, want.cause) {
			t.Fatalf("want X_CURSOR_EXPIRED naming %q, got %+v", want.cause, ack.Error)
		}
		if s := gwtest.Expect[*frames.Snapshot](r); s.Cursor.LSN != want.lsn || s.Cursor.Digest == cursor.Digest {
			t.Fatalf("snapshot %+v, want one at %s of the new log", s.Cursor, want.lsn)
		}
	}
	ops := collect(t, r, "s", 2)
	if rowData(t, ops[0]) != string(newLogRecords[3]) || rowData(t, ops[1]) != string(newLogRecords[4]) {
		t.Fatalf("kept records: %+v", ops)
	}
}

// readGateLog holds a Read after a given offset until released, once.
type readGateLog struct {
	*storage.DB
	mu    sync.Mutex
	gates map[string]*readGate
}

type readGate struct{ entered, release chan struct{} }

// gate arms a gate for the next Read after offset after.
func (l *readGateLog) gate(after string) *readGate {
	g := &readGate{entered: make(chan struct{}), release: make(chan struct{})}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.gates == nil {
		l.gates = map[string]*readGate{}
	}
	l.gates[after] = g
	return g
}

func (l *readGateLog) Read(ctx context.Context, name, after string, maxBytes int) (storage.ReadResult, error) {
	l.mu.Lock()
	g := l.gates[after]
	delete(l.gates, after)
	l.mu.Unlock()
	if g != nil {
		close(g.entered)
		select {
		case <-g.release:
		case <-ctx.Done():
			return storage.ReadResult{}, ctx.Err()
		}
	}
	return l.DB.Read(ctx, name, after, maxBytes)
}

func waitClosed(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not within 10s", what)
	}
}

// A replaying subscription that holds live patches when the tailer skips
// records retention removed: it gets the patches it held, then the skip's
// X_CURSOR_EXPIRED and snapshot in their place, then what followed, as a
// live subscriber does; none of what it held is dropped.
func TestPersisted_GapWhileReplaying(t *testing.T) {
	t.Parallel()
	var log *readGateLog
	db, srv := startWrappedNode(t, &storage.Options{Retention: storage.Retention{MaxRecords: 5}, MaintenanceInterval: 5 * time.Millisecond},
		func(db *storage.DB) gateway.StreamLog {
			log = &readGateLog{DB: db}
			return log
		})
	const topic = "chat:gap"
	ctx := t.Context()
	appendN := func(from, to int) {
		for i := from; i <= to; i++ { // one append each: retention removes whole appends
			if _, err := db.Append(ctx, topic, storage.AppendRequest{Records: [][]byte{fmt.Append(nil, i)}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	makeStream(t, db, topic)
	live := gwtest.Dial(t, srv.url, nil)
	live.Hello("", 0)
	snap := live.Subscribe("l", topic)
	appendN(1, 3)
	collect(t, live, "l", 3)

	// A resume from 1 whose replay read waits; meanwhile 4 and 5 are held.
	replayRead := log.gate(storage.FormatOffset(1))
	tailRead := log.gate(storage.FormatOffset(5))
	r := gwtest.Dial(t, srv.url, nil)
	r.Hello("", 0)
	cursor := snap.Cursor
	cursor.LSN = storage.FormatOffset(1)
	r.Send(&frames.Subscribe{Op: frames.OpAdd, SID: "s", Target: frames.Target{Kind: frames.TargetTopic, Topic: topic, Cursor: &cursor}})
	waitClosed(t, "the replay's read", replayRead.entered)
	appendN(4, 5)
	collect(t, live, "l", 2)

	// The tailer's next read waits while retention removes 1..7.
	appendN(6, 12)
	waitClosed(t, "the tailer's read after 5", tailRead.entered)
	gwtest.Eventually(t, 10*time.Second, "retention keeps the last 5", func() bool {
		in, err := db.Head(ctx, topic)
		return err == nil && in.Pruned == storage.FormatOffset(7)
	})
	close(tailRead.release)
	if ack := gwtest.Expect[*frames.Ack](live); ack.Error == nil || ack.Error.Code != frames.CodeCursorExpired {
		t.Fatalf("live subscriber after the skip: %+v", ack)
	}
	if s := gwtest.Expect[*frames.Snapshot](live); s.Cursor.LSN != storage.FormatOffset(7) {
		t.Fatalf("live subscriber's snapshot at %s", s.Cursor.LSN)
	}
	collect(t, live, "l", 5)

	close(replayRead.release)
	var got []string
	for len(got) < 11 {
		switch f := r.Next().(type) {
		case *frames.Ack:
			if f.Ref != "s" || f.Error == nil || f.Error.Code != frames.CodeCursorExpired || !strings.Contains(f.Error.Cause, "retention") {
				t.Fatalf("after %v: ack %+v", got, f.Error)
			}
			got = append(got, "expired")
		case *frames.Snapshot:
			got = append(got, "snapshot@"+strings.TrimLeft(f.Cursor.LSN[17:], "0"))
		case *frames.Patch:
			for _, op := range f.Patches {
				got = append(got, rowData(t, op))
			}
		default:
			t.Fatalf("after %v: %T", got, f)
		}
	}
	want := "expired snapshot@3 4 5 expired snapshot@7 8 9 10 11 12"
	if strings.Join(got, " ") != want {
		t.Fatalf("replaying subscriber got %v, want %s", got, want)
	}
}

// prunedLogNode starts a node keeping 3 records per stream, with a live
// subscriber on topic that got records 1..10 (7 of them since removed),
// and returns the log (as wrapped) and the subscriber's first snapshot.
func prunedLogNode[L gateway.StreamLog](t *testing.T, topic string, wrap func(*storage.DB) L) (L, *testServer, *frames.Snapshot) {
	t.Helper()
	var log L
	db, srv := startWrappedNode(t, &storage.Options{Retention: storage.Retention{MaxRecords: 3}, MaintenanceInterval: 5 * time.Millisecond},
		func(db *storage.DB) gateway.StreamLog {
			log = wrap(db)
			return log
		})
	makeStream(t, db, topic)
	live := gwtest.Dial(t, srv.url, nil)
	live.Hello("", 0)
	snap := live.Subscribe("l", topic) // keeps the tailer running
	for i := 1; i <= 10; i++ {
		if _, err := db.Append(t.Context(), topic, storage.AppendRequest{Records: [][]byte{fmt.Append(nil, i)}}); err != nil {
			t.Fatal(err)
		}
		collect(t, live, "l", 1) // delivered before retention can remove it
	}
	gwtest.Eventually(t, 10*time.Second, "retention keeps the last 3", func() bool {
		in, err := db.Head(t.Context(), topic)
		return err == nil && in.Pruned == storage.FormatOffset(7)
	})
	return log, srv, snap
}

// resumeAt sends a subscribe of sid to topic with cursor at offset n.
func resumeAt(c *gwtest.Conn, sid, topic string, cursor frames.Cursor, n uint64) {
	cursor.LSN = storage.FormatOffset(n)
	c.Send(&frames.Subscribe{Op: frames.OpAdd, SID: sid, Target: frames.Target{Kind: frames.TargetTopic, Topic: topic, Cursor: &cursor}})
}

// headFailLog's Head fails while fail is set.
type headFailLog struct {
	*storage.DB
	fail atomic.Bool
}

func (l *headFailLog) Head(ctx context.Context, name string) (storage.Info, error) {
	if l.fail.Load() {
		return storage.Info{}, errors.New("head: injected failure")
	}
	return l.DB.Head(ctx, name)
}

// A replay whose read was pruned learns from the read itself (in its own
// transaction) where the stream can be read: it needs no second call,
// which could see another moment of the log.
func TestPersisted_PrunedReplayNeedsNoHead(t *testing.T) {
	t.Parallel()
	const topic = "chat:nohead"
	log, srv, snap := prunedLogNode(t, topic, func(db *storage.DB) *headFailLog { return &headFailLog{DB: db} })
	log.fail.Store(true) // the tailer runs already: only the resume below could call Head
	r := gwtest.Dial(t, srv.url, nil)
	r.Hello("", 0)
	resumeAt(r, "s", topic, snap.Cursor, 2)
	if ack := gwtest.Expect[*frames.Ack](r); ack.Error == nil || ack.Error.Code != frames.CodeCursorExpired || !strings.Contains(ack.Error.Cause, "retention") {
		t.Fatalf("resume into a pruned window: %+v", ack.Error)
	}
	if s := gwtest.Expect[*frames.Snapshot](r); s.Cursor.LSN != storage.FormatOffset(7) {
		t.Fatalf("snapshot at %s, want %s", s.Cursor.LSN, storage.FormatOffset(7))
	}
	for i, op := range collect(t, r, "s", 3) {
		if want := fmt.Sprint(8 + i); rowData(t, op) != want {
			t.Fatalf("kept record %d: %s, want %s", i, rowData(t, op), want)
		}
	}
}

// readFailLog fails a Read after offset failAt (set before use).
type readFailLog struct {
	*storage.DB
	failAt atomic.Pointer[string]
}

func (l *readFailLog) Read(ctx context.Context, name, after string, maxBytes int) (storage.ReadResult, error) {
	if p := l.failAt.Load(); p != nil && *p == after {
		return storage.ReadResult{}, errors.New("read: injected failure")
	}
	return l.DB.Read(ctx, name, after, maxBytes)
}

// A replay whose log read fails tells the client (X_INTERNAL, delivered)
// and closes 1011, so that the client resumes again.
func TestPersisted_ReplayReadFails(t *testing.T) {
	t.Parallel()
	const topic = "chat:readfail"
	log, srv, snap := prunedLogNode(t, topic, func(db *storage.DB) *readFailLog { return &readFailLog{DB: db} })
	at := storage.FormatOffset(8)
	log.failAt.Store(&at)
	r := gwtest.Dial(t, srv.url, nil)
	r.Hello("", 0)
	resumeAt(r, "s", topic, snap.Cursor, 8)
	expectLogFailure(t, r, "resume whose log read fails")
}

// A resume whose look at the log fails (Head) is told X_INTERNAL and the
// session closes 1011, as when its read fails, so that the client resumes
// again: not X_CURSOR_EXPIRED, which would tell it its messages were lost.
// Both looks: a cursor naming another log (awaitLog), and one ahead of the
// tailer (catchUp).
func TestPersisted_ResumeWhoseLookFails(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		digest string // "" for the log's own
		at     uint64
	}{
		{"cursor of another log", "log:zz.zz", 8},
		{"cursor ahead of the tailer", "", 12},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			log, srv, snap := prunedLogNode(t, "chat:lookfails", func(db *storage.DB) *headFailLog { return &headFailLog{DB: db} })
			log.fail.Store(true) // the tailer runs already: only the resume below calls Head
			cursor := snap.Cursor
			if tc.digest != "" {
				cursor.Digest = tc.digest
			}
			r := gwtest.Dial(t, srv.url, nil)
			r.Hello("", 0)
			resumeAt(r, "s", "chat:lookfails", cursor, tc.at)
			expectLogFailure(t, r, "resume whose look at the log fails")
		})
	}
}

// A drop of a subscription whose replay is reading the log ends the
// replay, not the session: the drop is acknowledged and the session goes
// on.
func TestPersisted_DropWhileReplayReads(t *testing.T) {
	t.Parallel()
	const topic = "chat:dropreplay"
	log, srv, snap := prunedLogNode(t, topic, func(db *storage.DB) *readGateLog { return &readGateLog{DB: db} })
	read := log.gate(storage.FormatOffset(8)) // never released: only the drop ends it
	r := gwtest.Dial(t, srv.url, nil)
	r.Hello("", 0)
	resumeAt(r, "s", topic, snap.Cursor, 8)
	waitClosed(t, "the replay's read", read.entered)
	r.Send(&frames.Subscribe{Op: frames.OpDrop, SID: "s", Target: frames.Target{Kind: frames.TargetTopic, Topic: topic}})
	// The subscribe, not answered yet, is answered first
	// (TestPersisted_DropBeforeTheResumeIsAnswered).
	if ack := gwtest.Expect[*frames.Ack](r); ack.Ref != "s" || ack.Error != nil {
		t.Fatalf("subscribe: %+v %+v", ack, ack.Error)
	}
	gwtest.Expect[*frames.Snapshot](r)
	if ack := gwtest.Expect[*frames.Ack](r); ack.Ref != "s" || ack.Error != nil {
		t.Fatalf("drop: %+v %+v", ack, ack.Error)
	}
	if s := r.Subscribe("again", topic); s.Cursor.LSN != storage.FormatOffset(10) {
		t.Fatalf("the session after the drop: snapshot at %s", s.Cursor.LSN)
	}
}

// oldLogLog holds the tailer once a WaitID finds its stream gone (the
// tailer has not reset yet) while holding is set, until the next Head
// call has answered: a resume's look at the log, on a node whose tailer
// is still on the deleted log. With deleteAgain, that Head deletes the
// stream there (the new log) before it lets the tailer go.
type oldLogLog struct {
	*storage.DB
	deleteAgain bool
	holding     atomic.Bool
	armed       atomic.Bool
	held        chan struct{} // capacity 1: the tailer is held
	release     chan struct{} // closed by the armed Head
}

func (l *oldLogLog) WaitID(ctx context.Context, name, after string, id uint64) error {
	err := l.DB.WaitID(ctx, name, after, id)
	if errors.Is(err, storage.ErrNotFound) && l.holding.Load() {
		l.held <- struct{}{}
		select {
		case <-l.release:
		case <-ctx.Done():
		}
	}
	return err
}

func (l *oldLogLog) Head(ctx context.Context, name string) (storage.Info, error) {
	info, err := l.DB.Head(ctx, name)
	if l.armed.CompareAndSwap(true, false) {
		if l.deleteAgain {
			_ = l.DB.Delete(ctx, name)
		}
		l.holding.Store(false)
		close(l.release)
	}
	return info, err
}

// resumeBeforeTheTailerReset sets up a node whose tailer is on topic's
// log (two records, which live got), then held after finding it deleted;
// a new log (newLogRecords) is made in its place, and r resumes at
// offset 2 of it, whose look at the log lets the tailer go (deleting the
// new log first, with deleteAgain). It returns the deleted log's digest.
func resumeBeforeTheTailerReset(t *testing.T, topic string, deleteAgain bool) (db *storage.DB, live, r *gwtest.Conn, cursor frames.Cursor, oldDigest string) {
	t.Helper()
	var log *oldLogLog
	db, srv := startWrappedNode(t, nil, func(db *storage.DB) gateway.StreamLog {
		log = &oldLogLog{DB: db, deleteAgain: deleteAgain, held: make(chan struct{}, 1), release: make(chan struct{})}
		return log
	})
	makeStream(t, db, topic)
	oldDigest = logDigest(t, db, topic)
	live = gwtest.Dial(t, srv.url, nil)
	live.Hello("", 0)
	live.Subscribe("l", topic)
	ctx := t.Context()
	for i := range 2 {
		if _, err := db.Append(ctx, topic, storage.AppendRequest{Records: [][]byte{fmt.Appendf(nil, `{"old":%d}`, i)}}); err != nil {
			t.Fatal(err)
		}
	}
	collect(t, live, "l", 2)
	log.holding.Store(true)
	if err := db.Delete(ctx, topic); err != nil {
		t.Fatal(err)
	}
	select {
	case <-log.held: // the tailer found the stream gone and is held before it resets
	case <-time.After(gwtest.Timeout):
		t.Fatal("the tailer did not find its stream gone")
	}
	if _, _, err := db.Create(ctx, topic, storage.CreateOptions{ContentType: "application/json", Records: newLogRecords}); err != nil {
		t.Fatal(err)
	}
	cursor = frames.Cursor{QID: "topic:" + topic, LSN: storage.FormatOffset(2), Digest: logDigest(t, db, topic), IDs: []string{}, At: 1}
	r = gwtest.Dial(t, srv.url, nil)
	r.Hello("", 0)
	log.armed.Store(true)
	r.Send(&frames.Subscribe{Op: frames.OpAdd, SID: "s", Target: frames.Target{Kind: frames.TargetTopic, Topic: topic, Cursor: &cursor}})
	return db, live, r, cursor, oldDigest
}

// A client got a cursor of a stream made anew (from another node sharing
// the log) before this node's tailer reset onto it: the tailer is still
// on the deleted log. The resume is not taken for one of a deleted log:
// it waits for the tailer's reset and is resumed from its cursor in the
// new log, with no X_CURSOR_EXPIRED, and gets each record after the
// cursor once, in order.
func TestPersisted_ResumeInTheNewLogBeforeTheTailerReset(t *testing.T) {
	t.Parallel()
	const topic = "chat:anew"
	db, live, r, cursor, _ := resumeBeforeTheTailerReset(t, topic, false)
	if ack := gwtest.Expect[*frames.Ack](r); ack.Ref != "s" || ack.Error != nil {
		t.Fatalf("resume in the new log: ack %+v, error %+v", ack, ack.Error)
	}
	if s := gwtest.Expect[*frames.Snapshot](r); s.Cursor.LSN != cursor.LSN || s.Cursor.Digest != cursor.Digest || len(s.Rows) != 0 {
		t.Fatalf("resume snapshot %+v, want no rows at the cursor %+v", s.Cursor, cursor)
	}
	ops := collect(t, r, "s", 3)
	for i, op := range ops {
		if want := string(newLogRecords[i+2]); rowData(t, op) != want || op.LSN != storage.FormatOffset(uint64(i+3)) {
			t.Fatalf("resumed subscriber: insert %d is %s at %s, want %s at %s", i, rowData(t, op), op.LSN, want, storage.FormatOffset(uint64(i+3)))
		}
	}
	res, err := db.Append(t.Context(), topic, storage.AppendRequest{Records: [][]byte{[]byte(`{"new":5}`)}})
	if err != nil {
		t.Fatal(err)
	}
	if op := collect(t, r, "s", 1)[0]; op.LSN != res.Offset {
		t.Fatalf("next insert %s, want the live record %s (nothing twice)", op.LSN, res.Offset)
	}
	_, _, ops = resetThenCollect(t, live, "l", 5)
	checkNewLog(t, "live subscriber", ops)
}

// As above, but the new log is deleted too before the tailer looks: the
// tailer resets to no stream, and no adoption follows. The resume is
// answered at once (not when the 5 s wait for the tailer's move runs
// out), with X_CURSOR_EXPIRED and a snapshot at the start that names no
// log, not the deleted one the tailer left.
func TestPersisted_ResumeInANewLogDeletedAgain(t *testing.T) {
	t.Parallel()
	_, _, r, _, oldDigest := resumeBeforeTheTailerReset(t, "chat:goneagain", true)
	start := time.Now()
	ack := gwtest.Expect[*frames.Ack](r)
	if took := time.Since(start); took > 2500*time.Millisecond {
		t.Errorf("answered after %v: the resume waited out the wait for an adoption that could not come", took)
	}
	if ack.Ref != "s" || ack.Error == nil || ack.Error.Code != frames.CodeCursorExpired {
		t.Fatalf("resume in a log deleted again: ack %+v, error %+v, want X_CURSOR_EXPIRED", ack, ack.Error)
	}
	s := gwtest.Expect[*frames.Snapshot](r)
	if s.Cursor.Digest == oldDigest || s.Cursor.Digest != "" || s.Cursor.LSN != storage.ZeroOffset {
		t.Fatalf("snapshot at %s digest %q (the deleted log was %q), want the start with no log", s.Cursor.LSN, s.Cursor.Digest, oldDigest)
	}
}

// lateDeleteLog orders one interleaving of a tailer resetting to no
// stream and a resume naming a log made elsewhere:
//
//  1. the tailer's Head after its log was deleted answers "none" and is
//     held before it returns (the new log is not made yet);
//  2. the test makes the new log; the resume's first look (awaitLog) sees
//     it and lets the tailer go, which resets to no stream;
//  3. the resume's look after that reset (awaitLog's re-check) still sees
//     the new log, and then it is deleted (elsewhere) before the tailer's
//     next look, which the log holds until then.
//
// Calls are told apart by their ctx: the first Head once armed is the
// tailer's (nothing else looks at the log after the delete until the
// resume), and the tailer passes the same ctx to every call; the resume
// (awaitLog) passes its replay's.
type lateDeleteLog struct {
	*storage.DB
	armed      atomic.Bool
	tailerCtx  atomic.Value  // <-chan struct{}: the tailer's ctx.Done()
	tailerSeen chan struct{} // closed when the tailer's held Head has read "none"
	tailerGo   chan struct{} // closed by the resume's first look
	recheck    chan struct{} // closed by the resume's second look, after the delete
	resumeN    atomic.Int32
	tailerN    atomic.Int32
}

func (l *lateDeleteLog) Head(ctx context.Context, name string) (storage.Info, error) {
	if !l.armed.Load() {
		return l.DB.Head(ctx, name)
	}
	l.tailerCtx.CompareAndSwap(nil, ctx.Done())
	if l.tailerCtx.Load() != ctx.Done() {
		info, err := l.DB.Head(ctx, name)
		switch l.resumeN.Add(1) {
		case 1:
			close(l.tailerGo)
		case 2:
			_ = l.DB.Delete(ctx, name) // another node deletes the new log
			close(l.recheck)
		}
		return info, err
	}
	switch l.tailerN.Add(1) {
	case 1:
		info, err := l.DB.Head(ctx, name)
		close(l.tailerSeen)
		select {
		case <-l.tailerGo:
		case <-ctx.Done():
		}
		return info, err
	case 2:
		select {
		case <-l.recheck:
		case <-ctx.Done():
		}
	}
	return l.DB.Head(ctx, name)
}

// A resume names a log made elsewhere while this node's tailer has reset
// to no stream; the resume's look after that reset still sees the log,
// which is then deleted before the tailer's next look: the tailer finds
// none, and the resume, told of that look (tailer.moved), looks again and
// is answered at once with X_CURSOR_EXPIRED, not when its 5 s wait for a
// move runs out.
func TestPersisted_ResumeInANewLogDeletedAfterItsRecheck(t *testing.T) {
	t.Parallel()
	const topic = "chat:latedelete"
	var log *lateDeleteLog
	db, srv := startWrappedNode(t, nil, func(db *storage.DB) gateway.StreamLog {
		log = &lateDeleteLog{DB: db, tailerSeen: make(chan struct{}), tailerGo: make(chan struct{}), recheck: make(chan struct{})}
		return log
	})
	makeStream(t, db, topic)
	live := gwtest.Dial(t, srv.url, nil)
	live.Hello("", 0)
	live.Subscribe("l", topic)
	log.armed.Store(true)
	ctx := t.Context()
	if err := db.Delete(ctx, topic); err != nil {
		t.Fatal(err)
	}
	select {
	case <-log.tailerSeen:
	case <-time.After(gwtest.Timeout):
		t.Fatal("the tailer did not look at the log after the delete")
	}
	if _, _, err := db.Create(ctx, topic, storage.CreateOptions{ContentType: "application/json", Records: newLogRecords}); err != nil {
		t.Fatal(err)
	}
	cursor := frames.Cursor{QID: "topic:" + topic, LSN: storage.FormatOffset(2), Digest: logDigest(t, db, topic), IDs: []string{}, At: 1}
	r := gwtest.Dial(t, srv.url, nil)
	r.Hello("", 0)
	start := time.Now()
	r.Send(&frames.Subscribe{Op: frames.OpAdd, SID: "s", Target: frames.Target{Kind: frames.TargetTopic, Topic: topic, Cursor: &cursor}})
	ack := gwtest.Expect[*frames.Ack](r)
	took := time.Since(start)
	if ack.Ref != "s" || ack.Error == nil || ack.Error.Code != frames.CodeCursorExpired {
		t.Fatalf("ack %+v, error %+v, want X_CURSOR_EXPIRED", ack, ack.Error)
	}
	if n := log.resumeN.Load(); n < 2 {
		t.Fatalf("interleaving not reached: awaitLog looked %d times", n)
	}
	if took > 2500*time.Millisecond {
		t.Errorf("answered after %v: awaitLog waited out catchUpWait for a move that could not come", took)
	}
}

// lookThenFailLog hides the topic's stream from the tailer's looks (a
// node whose tailer has not looked since the stream was made elsewhere)
// and, once the resume has had one good look, fails every Head: the log
// cannot be looked at any more, by the resume or the tailer. The tailer
// is told apart by its ctx, captured at its first look once armed (no
// other caller looks then).
type lookThenFailLog struct {
	*storage.DB
	armed     atomic.Bool
	tailerCtx atomic.Value // <-chan struct{}
	captured  chan struct{}
	once      sync.Once
	failing   atomic.Bool
}

func (l *lookThenFailLog) Head(ctx context.Context, name string) (storage.Info, error) {
	if !l.armed.Load() {
		return l.DB.Head(ctx, name)
	}
	if l.tailerCtx.CompareAndSwap(nil, ctx.Done()) {
		l.once.Do(func() { close(l.captured) })
	}
	switch {
	case l.failing.Load():
		return storage.Info{}, errors.New("head: injected failure")
	case l.tailerCtx.Load() == ctx.Done():
		return storage.Info{}, fmt.Errorf("%w: hidden from the tailer", storage.ErrNotFound)
	}
	info, err := l.DB.Head(ctx, name)
	l.failing.Store(true) // the resume's first look: every look after it fails
	return info, err
}

// A resume naming a log this node's tailer has not found, whose first look
// sees that log and whose later looks (and the tailer's) all fail, is not
// told its cursor expired: the server could not look at the log, which
// docs/protocol.md answers with X_INTERNAL and close 1011 ("a failed look
// is never taken for a lost cursor").
func TestPersisted_ResumeWhoseLaterLooksFail(t *testing.T) {
	t.Parallel()
	const topic = "chat:laterlooks"
	var log *lookThenFailLog
	db, srv := startWrappedNode(t, nil, func(db *storage.DB) gateway.StreamLog {
		log = &lookThenFailLog{DB: db, captured: make(chan struct{})}
		return log
	})
	live := gwtest.Dial(t, srv.url, nil)
	live.Hello("", 0)
	live.Subscribe("l", topic) // a tailer with no stream
	log.armed.Store(true)
	waitClosed(t, "the tailer's next look", log.captured)
	if _, _, err := db.Create(t.Context(), topic, storage.CreateOptions{ContentType: "application/json", Records: newLogRecords}); err != nil {
		t.Fatal(err)
	}
	cursor := frames.Cursor{QID: "topic:" + topic, LSN: storage.FormatOffset(2), Digest: logDigest(t, db, topic), IDs: []string{}, At: 1}
	r := gwtest.Dial(t, srv.url, nil)
	r.Hello("", 0)
	r.Send(&frames.Subscribe{Op: frames.OpAdd, SID: "s", Target: frames.Target{Kind: frames.TargetTopic, Topic: topic, Cursor: &cursor}})
	expectLogFailure(t, r, "resume whose later looks fail (not a lost cursor)")
}

// stuckTailerLog fails every Read while stuck is set (the tailer cannot
// pass what it waits for); with headsFail, also every Head after the
// first one made while stuck (a resume's catch-up sees the log once, then
// cannot look).
type stuckTailerLog struct {
	*storage.DB
	headsFail bool
	stuck     atomic.Bool
	looked    atomic.Bool
}

func (l *stuckTailerLog) Read(ctx context.Context, name, after string, maxBytes int) (storage.ReadResult, error) {
	if l.stuck.Load() {
		return storage.ReadResult{}, errors.New("read: injected failure")
	}
	return l.DB.Read(ctx, name, after, maxBytes)
}

func (l *stuckTailerLog) Head(ctx context.Context, name string) (storage.Info, error) {
	if l.headsFail && l.stuck.Load() && l.looked.Swap(true) {
		return storage.Info{}, errors.New("head: injected failure")
	}
	return l.DB.Head(ctx, name)
}

// A resume in the log ahead of a tailer stuck on a log it cannot read,
// whose wait for the tailer runs out, is told X_INTERNAL (close 1011),
// not that its cursor is no position in the log: whether the log can
// still be looked at or not, the server failed to read it.
func TestPersisted_CatchUpWhoseLogFails(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		headsFail bool
	}{
		{"tailer cannot read", false},
		{"nor can the log be looked at", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const topic = "chat:stuck"
			log, srv, snap := prunedLogNode(t, topic, func(db *storage.DB) *stuckTailerLog {
				return &stuckTailerLog{DB: db, headsFail: tc.headsFail}
			})
			log.stuck.Store(true)
			for i := 11; i <= 12; i++ { // the tailer wakes for them and cannot read them
				if _, err := log.DB.Append(t.Context(), topic, storage.AppendRequest{Records: [][]byte{fmt.Append(nil, i)}}); err != nil {
					t.Fatal(err)
				}
			}
			r := gwtest.Dial(t, srv.url, nil)
			r.Hello("", 0)
			resumeAt(r, "s", topic, snap.Cursor, 12) // in the log, past the tailer (10)
			expectLogFailure(t, r, "catch-up behind a tailer that cannot read the log")
		})
	}
}

// expectLogFailure expects the answer to a resume (sid "s") whose log the
// server failed to read or look at: X_INTERNAL, then close 1011.
func expectLogFailure(t *testing.T, r *gwtest.Conn, what string) {
	t.Helper()
	if ack := gwtest.Expect[*frames.Ack](r); ack.Ref != "s" || ack.Error == nil || ack.Error.Code != frames.CodeInternal {
		t.Fatalf("%s: %+v, want X_INTERNAL", what, ack.Error)
	}
	_, err := r.NextErr(10 * time.Second)
	if code := websocket.CloseStatus(err); code != websocket.StatusInternalError {
		t.Fatalf("%s, after X_INTERNAL: %v (close %d), want close 1011", what, err, code)
	}
}
