package client_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/syncgate/syncgate/client"
	"github.com/syncgate/syncgate/frames"
)

// A persisted topic's log replaced (or pruned ahead of delivery) while a
// subscription is live: the server sends X_CURSOR_EXPIRED with ref = the
// sid, then a snapshot, on its own. These tests drive the server side by
// hand (scripted), since the interleavings they need (a reset between a
// drop and its ack, a reset on the old connection during a take-over) are
// timing the real gateway does not let a test choose. The gateway's
// TestPersisted_GoClientAcrossALiveReset covers the plain case end to end.

// scripted is a WebSocket server that answers hello and hands each
// connection to the test, which reads what the client sends and writes
// what the server would.
type scripted struct {
	srv   *httptest.Server
	conns chan *scriptConn
}

type scriptConn struct {
	ws *websocket.Conn
	in chan frames.Frame // what the client sent, hello excepted
}

func newScripted(t *testing.T) *scripted {
	t.Helper()
	return newScriptedHello(t, nil)
}

// newScriptedHello is newScripted whose hello answers are edited by edit
// (nil: none), e.g. to state a frame rate.
func newScriptedHello(t *testing.T, edit func(*frames.Hello)) *scripted {
	t.Helper()
	s := &scripted{conns: make(chan *scriptConn, 8)}
	var wg sync.WaitGroup
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		wg.Add(1)
		defer wg.Done()
		defer ws.CloseNow()
		sc := &scriptConn{ws: ws, in: make(chan frames.Frame, 64)}
		s.conns <- sc
		id := "sess"
		for {
			_, msg, err := ws.Read(context.Background())
			if err != nil {
				return
			}
			frames.Split(msg, func(line []byte) bool {
				f, err := frames.Decode(line)
				if err != nil {
					t.Errorf("scripted server: %v", err)
					return false
				}
				if h, ok := f.(*frames.Hello); ok {
					reply := &frames.Hello{BuildID: "scripted", SessionID: &id, Resume: []frames.Cursor{}, ClientID: h.ClientID, Epoch: h.Epoch}
					if edit != nil {
						edit(reply)
					}
					b, _ := frames.Encode(reply)
					_ = ws.Write(context.Background(), websocket.MessageText, b)
					return true
				}
				sc.in <- f
				return true
			})
		}
	}))
	t.Cleanup(func() {
		s.srv.CloseClientConnections()
		s.srv.Close()
		wg.Wait()
	})
	return s
}

func (s *scripted) url() string { return "ws" + strings.TrimPrefix(s.srv.URL, "http") + "/v1/ws" }

func (s *scripted) next(t *testing.T) *scriptConn {
	t.Helper()
	select {
	case sc := <-s.conns:
		return sc
	case <-time.After(10 * time.Second):
		t.Fatal("no connection")
		return nil
	}
}

// send writes fs to the client, one message each.
func (sc *scriptConn) send(t *testing.T, fs ...frames.Frame) {
	t.Helper()
	for _, f := range fs {
		b, err := frames.Encode(f)
		noErr(t, err)
		noErr(t, sc.ws.Write(context.Background(), websocket.MessageText, b))
	}
}

// expect returns the next frame the client sent, which must be a T.
func expect[T frames.Frame](t *testing.T, sc *scriptConn) T {
	t.Helper()
	select {
	case f := <-sc.in:
		v, ok := f.(T)
		if !ok {
			t.Fatalf("client sent %T %+v, want %T", f, f, v)
		}
		return v
	case <-time.After(10 * time.Second):
		var z T
		t.Fatalf("client sent no %T", z)
		return z
	}
}

func lsnOf(n int) string { return frames.FormatOffset(0, uint64(n)) }

func topicSnapshot(sid string, lsn int, digest string) *frames.Snapshot {
	return &frames.Snapshot{SID: sid, Rows: []json.RawMessage{}, Cursor: frames.Cursor{
		QID: "topic:p:t", LSN: lsnOf(lsn), Digest: digest, IDs: []string{}, At: 1}}
}

func insert(sid string, lsn int, data string) *frames.Patch {
	l := lsnOf(lsn)
	row := json.RawMessage(`{"id":"` + l + `","data":"` + data + `","actorId":null,"at":1}`)
	return &frames.Patch{SID: sid, LSN: l, Patches: []frames.PatchOp{{Op: frames.PatchInsert, ID: l, LSN: l, Row: row}}}
}

func cursorExpired(ref string) *frames.Ack {
	return &frames.Ack{Ref: ref, Error: &frames.ErrorBody{Code: frames.CodeCursorExpired, Cause: "the log was made anew", Fix: "start again"}}
}

// dataOf returns a patch op's row data.
func dataOf(t *testing.T, op frames.PatchOp) string {
	t.Helper()
	var row struct{ Data string }
	noErr(t, json.Unmarshal(op.Row, &row))
	return row.Data
}

// recorder collects what a subscription's handler and the Client's events
// and unclaimed frames report.
type recorder struct {
	mu     sync.Mutex
	data   []string
	events []client.EventKind
	frames []frames.Frame
	marked chan struct{} // closed when an ack with ref "marker" goes to OnFrame
}

func newRecorder() *recorder { return &recorder{marked: make(chan struct{})} }

func (r *recorder) options() *client.Options {
	return &client.Options{Reconnect: true, ClientID: "c1",
		OnEvent: func(e client.Event) {
			r.mu.Lock()
			r.events = append(r.events, e.Kind)
			r.mu.Unlock()
		},
		OnFrame: func(f frames.Frame) {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.frames = append(r.frames, f)
			if a, ok := f.(*frames.Ack); ok && a.Ref == "marker" {
				close(r.marked)
			}
		}}
}

func (r *recorder) handler(t *testing.T) func(*frames.Patch) {
	return func(p *frames.Patch) {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, op := range p.Patches {
			r.data = append(r.data, dataOf(t, op))
		}
	}
}

// waitData waits until the handler has seen n ops and returns them.
func (r *recorder) waitData(t *testing.T, n int) []string {
	t.Helper()
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		r.mu.Lock()
		got := append([]string(nil), r.data...)
		r.mu.Unlock()
		if len(got) >= n {
			return got
		}
		select {
		case <-deadline:
			t.Fatalf("handler saw %v, want %d ops", got, n)
		case <-tick.C:
		}
	}
}

func (r *recorder) count(k client.EventKind) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if e == k {
			n++
		}
	}
	return n
}

// subscribeScripted subscribes on sc's client and answers with an ack and
// a snapshot at lsn 0 of log "log:a".
func subscribeScripted(t *testing.T, ctx context.Context, c *client.Client, sc *scriptConn, handler func(*frames.Patch)) *client.Subscription {
	t.Helper()
	return subscribeScriptedAt(t, ctx, c, sc, handler, "log:a")
}

// subscribeScriptedAt is subscribeScripted with the snapshot's log digest
// ("": a topic with no stream yet).
func subscribeScriptedAt(t *testing.T, ctx context.Context, c *client.Client, sc *scriptConn, handler func(*frames.Patch), digest string) *client.Subscription {
	t.Helper()
	done := make(chan *client.Subscription, 1)
	go func() {
		sub, err := c.Subscribe(ctx, "p:t", nil, handler)
		if err != nil {
			t.Errorf("subscribe: %v", err)
		}
		done <- sub
	}()
	add := expect[*frames.Subscribe](t, sc)
	sc.send(t, &frames.Ack{Ref: add.SID}, topicSnapshot(add.SID, 0, digest))
	sub := <-done
	if sub == nil {
		t.FailNow()
	}
	return sub
}

// startScripted dials a reconnecting Client (events and unclaimed frames
// recorded) to a scripted server and returns its first connection.
func startScripted(t *testing.T) (context.Context, *recorder, *client.Client, *scripted, *scriptConn) {
	t.Helper()
	s := newScripted(t)
	ctx := testCtx(t)
	rec := newRecorder()
	c, err := client.Dial(ctx, s.url(), rec.options())
	noErr(t, err)
	t.Cleanup(func() { c.Close() })
	return ctx, rec, c, s, s.next(t)
}

func TestSubscription_ResetWhileLive(t *testing.T) {
	ctx, rec, c, _, sc := startScripted(t)
	sub := subscribeScripted(t, ctx, c, sc, rec.handler(t))
	sid := sub.SID()
	sc.send(t, insert(sid, 1, "old1"), insert(sid, 2, "old2"), insert(sid, 3, "old3"))
	rec.waitData(t, 3)
	// The log made anew: its offsets start again, below the cursor.
	sc.send(t, cursorExpired(sid), topicSnapshot(sid, 0, "log:b"), insert(sid, 1, "new1"), insert(sid, 2, "new2"))
	got := rec.waitData(t, 5)
	if strings.Join(got, ",") != "old1,old2,old3,new1,new2" {
		t.Fatalf("handler saw %v", got)
	}
	if cur := sub.Cursor(); cur.LSN != lsnOf(2) || cur.Digest != "log:b" {
		t.Fatalf("cursor %+v, want the new log's at %s", cur, lsnOf(2))
	}
	if d := sub.Duplicates(); d != 0 {
		t.Fatalf("%d dropped as duplicates", d)
	}
	if n := rec.count(client.EventCursorExpired); n != 1 {
		t.Fatalf("%d EventCursorExpired, want 1", n)
	}
}

// The server queued the reset before it read the client's drop: the
// drop's ack comes after the reset's, and Drop must take its own.
func TestSubscription_ResetBeforeDropAck(t *testing.T) {
	ctx, rec, c, s, sc := startScripted(t)
	sub := subscribeScripted(t, ctx, c, sc, nil)
	sid := sub.SID()
	dropped := make(chan error, 1)
	go func() { dropped <- sub.Drop(ctx) }()
	if f := expect[*frames.Subscribe](t, sc); f.Op != frames.OpDrop || f.SID != sid {
		t.Fatalf("client sent %+v, want the drop", f)
	}
	sc.send(t, cursorExpired(sid), topicSnapshot(sid, 0, "log:b"), &frames.Ack{Ref: sid})
	if err := <-dropped; err != nil {
		t.Fatalf("Drop: %v (the reset's ack taken for the drop's?)", err)
	}
	select {
	case _, open := <-sub.Patches():
		if open {
			t.Fatal("a patch after the drop")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Patches not closed after the drop")
	}
	// The dropped subscription is not resubscribed on the next connection.
	sc.send(t, &frames.Reconnect{AfterMs: 0, Reason: frames.ReasonDrain})
	sc2 := s.next(t)
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for rec.count(client.EventResumed) == 0 {
		select {
		case <-deadline:
			t.Fatal("no take-over")
		case <-tick.C:
		}
	}
	select {
	case f := <-sc2.in:
		t.Fatalf("the new connection got %T %+v", f, f)
	default:
	}
}

// A reset on the old connection while a take-over waits for the new
// connection's answer: the old connection's patches of the new log are
// not delivered as continuing the old one; the new connection, asked to
// resume from the old log's cursor, answers with the reset and the new
// log from its start.
func TestSubscription_ResetDuringTakeOver(t *testing.T) {
	ctx, rec, c, s, sc1 := startScripted(t)
	sub := subscribeScripted(t, ctx, c, sc1, rec.handler(t))
	sid := sub.SID()
	sc1.send(t, insert(sid, 1, "old1"), insert(sid, 2, "old2"), insert(sid, 3, "old3"))
	rec.waitData(t, 3)
	sc1.send(t, &frames.Reconnect{AfterMs: 0, Reason: frames.ReasonDrain})
	sc2 := s.next(t)
	resume := expect[*frames.Subscribe](t, sc2)
	if cur := resume.Target.Cursor; cur == nil || cur.LSN != lsnOf(3) || cur.Digest != "log:a" {
		t.Fatalf("resume cursor %+v, want the old log's at %s", resume.Target.Cursor, lsnOf(3))
	}
	// The old node resets; a marker shows when the client has read it all.
	sc1.send(t, cursorExpired(sid), topicSnapshot(sid, 0, "log:b"),
		insert(sid, 1, "new1"), insert(sid, 2, "new2"), insert(sid, 3, "new3"), insert(sid, 4, "new4"),
		&frames.Ack{Ref: "marker"})
	select {
	case <-rec.marked:
	case <-time.After(10 * time.Second):
		t.Fatal("the old connection's frames were not read")
	}
	sc2.send(t, cursorExpired(resume.SID), topicSnapshot(resume.SID, 0, "log:b"),
		insert(sid, 1, "new1"), insert(sid, 2, "new2"), insert(sid, 3, "new3"), insert(sid, 4, "new4"))
	got := rec.waitData(t, 7)
	if strings.Join(got, ",") != "old1,old2,old3,new1,new2,new3,new4" {
		t.Fatalf("handler saw %v", got)
	}
	if cur := sub.Cursor(); cur.LSN != lsnOf(4) || cur.Digest != "log:b" {
		t.Fatalf("cursor %+v, want the new log's at %s", cur, lsnOf(4))
	}
	if n := rec.count(client.EventCursorExpired); n != 1 {
		t.Fatalf("%d EventCursorExpired, want 1 (from the take-over)", n)
	}
}

// A persisted topic with no stream when subscribed (snapshot digest ""):
// when the stream is made the server sends, on its own and with no
// X_CURSOR_EXPIRED, a snapshot at the start naming the new log. The
// cursor takes the log's digest, the new log's records are delivered, and
// nothing is reported as expired; a take-over then resumes with the
// digest.
func TestSubscription_LogMadeWhileLive(t *testing.T) {
	ctx, rec, c, s, sc := startScripted(t)
	sub := subscribeScriptedAt(t, ctx, c, sc, rec.handler(t), "")
	sid := sub.SID()
	sc.send(t, topicSnapshot(sid, 0, "log:a"), insert(sid, 1, "first"), insert(sid, 2, "second"))
	if got := rec.waitData(t, 2); strings.Join(got, ",") != "first,second" {
		t.Fatalf("handler saw %v", got)
	}
	if cur := sub.Cursor(); cur.LSN != lsnOf(2) || cur.Digest != "log:a" {
		t.Fatalf("cursor %+v, want log:a's at %s", cur, lsnOf(2))
	}
	if n := rec.count(client.EventCursorExpired); n != 0 {
		t.Fatalf("%d EventCursorExpired, want none", n)
	}
	sc.send(t, &frames.Reconnect{AfterMs: 0, Reason: frames.ReasonDrain})
	resume := expect[*frames.Subscribe](t, s.next(t))
	if cur := resume.Target.Cursor; cur == nil || cur.LSN != lsnOf(2) || cur.Digest != "log:a" {
		t.Fatalf("resume cursor %+v, want log:a's at %s", resume.Target.Cursor, lsnOf(2))
	}
}

// A resume from a cursor that names no log (the topic had no stream) is
// answered with a snapshot at the cursor naming the log there is now: the
// cursor takes its digest.
func TestSubscription_ResumeNamesTheLog(t *testing.T) {
	ctx, rec, c, s, sc := startScripted(t)
	sub := subscribeScriptedAt(t, ctx, c, sc, rec.handler(t), "")
	sc.send(t, &frames.Reconnect{AfterMs: 0, Reason: frames.ReasonDrain})
	sc2 := s.next(t)
	resume := expect[*frames.Subscribe](t, sc2)
	if cur := resume.Target.Cursor; cur == nil || cur.LSN != lsnOf(0) || cur.Digest != "" {
		t.Fatalf("resume cursor %+v, want the start with no digest", resume.Target.Cursor)
	}
	sc2.send(t, &frames.Ack{Ref: resume.SID}, topicSnapshot(resume.SID, 0, "log:a"), insert(sub.SID(), 1, "first"))
	if got := rec.waitData(t, 1); strings.Join(got, ",") != "first" {
		t.Fatalf("handler saw %v", got)
	}
	if cur := sub.Cursor(); cur.LSN != lsnOf(1) || cur.Digest != "log:a" {
		t.Fatalf("cursor %+v, want log:a's at %s", cur, lsnOf(1))
	}
}

// The stream made while a take-over waits for the new connection's
// answer: the old connection, still followed, sends the snapshot naming
// the log and its first records; the new connection then answers the
// resume (sent from the start with no digest) naming the same log and
// replays. The cursor names the log, not a digest-less position past the
// start that a later resume would take as one in whatever log is there
// then.
func TestSubscription_LogMadeDuringTakeOver(t *testing.T) {
	ctx, rec, c, s, sc1 := startScripted(t)
	sub := subscribeScriptedAt(t, ctx, c, sc1, rec.handler(t), "")
	sid := sub.SID()
	sc1.send(t, &frames.Reconnect{AfterMs: 0, Reason: frames.ReasonDrain})
	sc2 := s.next(t)
	resume := expect[*frames.Subscribe](t, sc2)
	if cur := resume.Target.Cursor; cur == nil || cur.LSN != lsnOf(0) || cur.Digest != "" {
		t.Fatalf("resume cursor %+v, want the start with no digest", resume.Target.Cursor)
	}
	// The old node sees the stream made; a marker shows when the client
	// has read it all.
	sc1.send(t, topicSnapshot(sid, 0, "log:a"), insert(sid, 1, "first"), insert(sid, 2, "second"),
		&frames.Ack{Ref: "marker"})
	select {
	case <-rec.marked:
	case <-time.After(10 * time.Second):
		t.Fatal("the old connection's frames were not read")
	}
	if cur := sub.Cursor(); cur.LSN != lsnOf(2) || cur.Digest != "log:a" {
		t.Fatalf("cursor %+v after the old connection's frames, want log:a's at %s", cur, lsnOf(2))
	}
	sc2.send(t, &frames.Ack{Ref: resume.SID}, topicSnapshot(resume.SID, 0, "log:a"),
		insert(sid, 1, "first"), insert(sid, 2, "second"), insert(sid, 3, "third"))
	if got := rec.waitData(t, 3); strings.Join(got, ",") != "first,second,third" {
		t.Fatalf("handler saw %v", got)
	}
	if cur := sub.Cursor(); cur.LSN != lsnOf(3) || cur.Digest != "log:a" {
		t.Fatalf("cursor %+v, want log:a's at %s", cur, lsnOf(3))
	}
	if n := rec.count(client.EventCursorExpired); n != 0 {
		t.Fatalf("%d EventCursorExpired, want none", n)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, f := range rec.frames {
		if _, ok := f.(*frames.Snapshot); ok {
			t.Fatalf("OnFrame got the snapshot %+v", f)
		}
	}
}

// takeOverFromNoLog subscribes to a topic with no stream (snapshot digest
// ""), starts a take-over, and returns the old and new connections and
// the new connection's resume, sent from the start with no digest.
func takeOverFromNoLog(t *testing.T) (context.Context, *recorder, *client.Subscription, *scriptConn, *scriptConn, *frames.Subscribe) {
	t.Helper()
	ctx, rec, c, s, sc1 := startScripted(t)
	sub := subscribeScriptedAt(t, ctx, c, sc1, rec.handler(t), "")
	sc1.send(t, &frames.Reconnect{AfterMs: 0, Reason: frames.ReasonDrain})
	sc2 := s.next(t)
	resume := expect[*frames.Subscribe](t, sc2)
	if cur := resume.Target.Cursor; cur == nil || cur.LSN != lsnOf(0) || cur.Digest != "" {
		t.Fatalf("resume cursor %+v, want the start with no digest", resume.Target.Cursor)
	}
	return ctx, rec, sub, sc1, sc2, resume
}

// sendMarked writes fs to the client, then a marker, and waits until the
// client has read them all.
func (sc *scriptConn) sendMarked(t *testing.T, rec *recorder, fs ...frames.Frame) {
	t.Helper()
	sc.send(t, append(fs, &frames.Ack{Ref: "marker"})...)
	select {
	case <-rec.marked:
	case <-time.After(10 * time.Second):
		t.Fatal("the old connection's frames were not read")
	}
}

// checkSub checks what the handler saw, the cursor and the number of
// EventCursorExpired.
func checkSub(t *testing.T, rec *recorder, sub *client.Subscription, want string, lsn int, digest string, resets int) {
	t.Helper()
	if got := rec.waitData(t, len(strings.Split(want, ","))); strings.Join(got, ",") != want {
		t.Fatalf("handler saw %v, want %s", got, want)
	}
	if cur := sub.Cursor(); cur.LSN != lsnOf(lsn) || cur.Digest != digest {
		t.Fatalf("cursor %+v, want %s's at %s", cur, digest, lsnOf(lsn))
	}
	if n := rec.count(client.EventCursorExpired); n != resets {
		t.Fatalf("%d EventCursorExpired, want %d", n, resets)
	}
}

// As TestSubscription_LogMadeDuringTakeOver, but the new connection
// answers the resume in another log, log:b (log:a, which the old
// connection saw made, was deleted and log:b made meanwhile): the cursor
// moves to log:b, so its records are not dropped as duplicates of
// log:a's, and the reset is reported (log:a may have had records after
// the cursor that never came).
func TestSubscription_LogReplacedDuringTakeOver(t *testing.T) {
	_, rec, sub, sc1, sc2, resume := takeOverFromNoLog(t)
	sid := sub.SID()
	sc1.sendMarked(t, rec, topicSnapshot(sid, 0, "log:a"), insert(sid, 1, "a1"), insert(sid, 2, "a2"))
	sc2.send(t, &frames.Ack{Ref: resume.SID}, topicSnapshot(resume.SID, 0, "log:b"),
		insert(sid, 1, "b1"), insert(sid, 2, "b2"), insert(sid, 3, "b3"))
	checkSub(t, rec, sub, "a1,a2,b1,b2,b3", 3, "log:b", 1)
}

// The same, with the old connection reporting log:a's replacement (an
// X_CURSOR_EXPIRED and a snapshot at log:b's start) before the new one
// answers: the answer, with no error, is still the new position and
// reports the reset, once.
func TestSubscription_LogMadeThenReplacedDuringTakeOver(t *testing.T) {
	_, rec, sub, sc1, sc2, resume := takeOverFromNoLog(t)
	sid := sub.SID()
	sc1.sendMarked(t, rec, topicSnapshot(sid, 0, "log:a"), insert(sid, 1, "a1"), insert(sid, 2, "a2"),
		cursorExpired(sid), topicSnapshot(sid, 0, "log:b"), insert(sid, 1, "b1"))
	sc2.send(t, &frames.Ack{Ref: resume.SID}, topicSnapshot(resume.SID, 0, "log:b"),
		insert(sid, 1, "b1"), insert(sid, 2, "b2"), insert(sid, 3, "b3"))
	checkSub(t, rec, sub, "a1,a2,b1,b2,b3", 3, "log:b", 1)
}

// The old connection reports log:a deleted with no stream after it (a
// reset whose snapshot names no log), and the new connection answers the
// resume with no log: the cursor leaves log:a for the start, the reset is
// reported, and the log made later is taken from its start.
func TestSubscription_LogMadeThenDeletedDuringTakeOver(t *testing.T) {
	_, rec, sub, sc1, sc2, resume := takeOverFromNoLog(t)
	sid := sub.SID()
	sc1.sendMarked(t, rec, topicSnapshot(sid, 0, "log:a"), insert(sid, 1, "a1"), insert(sid, 2, "a2"),
		cursorExpired(sid), topicSnapshot(sid, 0, ""))
	sc2.send(t, &frames.Ack{Ref: resume.SID}, topicSnapshot(resume.SID, 0, ""),
		topicSnapshot(sid, 0, "log:b"), insert(sid, 1, "b1"), insert(sid, 2, "b2"))
	checkSub(t, rec, sub, "a1,a2,b1,b2", 2, "log:b", 1)
}

// The new connection answers the resume with no log (its node has not
// seen the stream made yet) and then sends the log's making: if it names
// the log the old connection saw made, its records continue the cursor
// (the first ones dropped as duplicates) and nothing is reported; if it
// names another (that log deleted and another made meanwhile), the
// cursor moves to it and the reset is reported.
func TestSubscription_LogMadeOnBothDuringTakeOver(t *testing.T) {
	for _, tc := range []struct {
		name, log, want string
		resets          int
	}{
		{"the same log", "a", "a1,a2,a3", 0},
		{"another log", "b", "a1,a2,b1,b2,b3", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, rec, sub, sc1, sc2, resume := takeOverFromNoLog(t)
			sid := sub.SID()
			sc1.sendMarked(t, rec, topicSnapshot(sid, 0, "log:a"), insert(sid, 1, "a1"), insert(sid, 2, "a2"))
			sc2.send(t, &frames.Ack{Ref: resume.SID}, topicSnapshot(resume.SID, 0, ""), topicSnapshot(sid, 0, "log:"+tc.log),
				insert(sid, 1, tc.log+"1"), insert(sid, 2, tc.log+"2"), insert(sid, 3, tc.log+"3"))
			checkSub(t, rec, sub, tc.want, 3, "log:"+tc.log, tc.resets)
		})
	}
}

// A patch handler may call its Subscription's methods but Drop (which
// waits for the read loop): Duplicates must not wait for the delivery
// the handler is part of.
func TestSubscription_DuplicatesFromHandler(t *testing.T) {
	ctx, _, c, _, sc := startScripted(t)
	var sub atomic.Pointer[client.Subscription]
	seen := make(chan int64, 1)
	s := subscribeScripted(t, ctx, c, sc, func(p *frames.Patch) {
		seen <- sub.Load().Duplicates()
	})
	sub.Store(s)
	sc.send(t, insert(s.SID(), 1, "x"))
	select {
	case n := <-seen:
		equal(t, "Duplicates", n, 0)
	case <-time.After(5 * time.Second):
		t.Fatal("Duplicates called from the patch handler still waiting after 5s")
	}
}

// Two Drops of one subscription at once: the second waits for the first's
// drop rather than sending its own (which the server, having ended the
// subscription, would refuse with X_NOT_SUBSCRIBED). Both return nil,
// and no patch is delivered after.
func TestSubscription_Drop_Concurrent(t *testing.T) {
	ctx, rec, c, _, sc := startScripted(t)
	sub := subscribeScripted(t, ctx, c, sc, nil)
	sid := sub.SID()

	dropped := make(chan error, 2)
	go func() { dropped <- sub.Drop(ctx) }()
	first := expect[*frames.Subscribe](t, sc)
	equal(t, "first drop", first.Op, frames.OpDrop)
	go func() { dropped <- sub.Drop(ctx) }()
	// The second Drop either waits for the first's outcome or sends a
	// drop of its own.
	var second *frames.Subscribe
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for second == nil && sub.DropWaitersForTest() == 0 {
		select {
		case f := <-sc.in:
			second, _ = f.(*frames.Subscribe)
			if second == nil {
				t.Fatalf("client sent %T %+v", f, f)
			}
		case <-deadline:
			t.Fatal("the second Drop neither waits nor sends")
		case <-tick.C:
		}
	}
	sc.send(t, &frames.Ack{Ref: sid})
	if second != nil {
		// What a server answers a drop of a sid it no longer has.
		sc.send(t, errAck(sid, frames.CodeNotSubscribed, "not subscribed"))
	}
	for range 2 {
		noErr(t, recv(t, ctx, dropped))
	}
	if second != nil {
		t.Fatal("the second Drop sent a drop of its own")
	}
	sc.send(t, insert(sid, 1, "x"), &frames.Ack{Ref: "marker"})
	select {
	case <-rec.marked:
	case <-time.After(10 * time.Second):
		t.Fatal("the patch was not read")
	}
	for p := range sub.Patches() {
		t.Fatalf("a patch after Drop: %+v", p)
	}
}
