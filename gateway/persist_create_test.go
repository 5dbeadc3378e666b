package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/syncgate/syncgate/auth"
	"github.com/syncgate/syncgate/frames"
	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/internal/gwtest"
	"github.com/syncgate/syncgate/storage"
)

// Persisted topics whose stream does not exist yet: a subscribe does not
// make it (only a publish or a PUT does), and the subscriber gets the
// stream's records once it is made, from its start, without a reset.

// expectMade reads what sid gets when its topic's stream is made: a
// snapshot with no rows at the zero offset naming the new log (no
// X_CURSOR_EXPIRED), and returns its digest.
func expectMade(t *testing.T, c *gwtest.Conn, sid string) string {
	t.Helper()
	switch f := c.Next().(type) {
	case *frames.Snapshot:
		if f.SID != sid || f.Cursor.LSN != storage.ZeroOffset || len(f.Rows) != 0 || !strings.HasPrefix(f.Cursor.Digest, "log:") {
			t.Fatalf("snapshot %+v, want one for %s at %s naming the new log", f, sid, storage.ZeroOffset)
		}
		return f.Cursor.Digest
	default:
		t.Fatalf("when the stream was made: %T %+v, want a snapshot naming the log", f, f)
		return ""
	}
}

// notFound checks that topic has no stream in db.
func notFound(t *testing.T, db *storage.DB, topic string) {
	t.Helper()
	if info, err := db.Head(context.Background(), topic); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("Head(%s) = %+v, %v; want no stream", topic, info, err)
	}
}

// A session that may only subscribe makes no stream however many new
// topic names it subscribes to; a publish by a writer then makes one, and
// its subscriber gets the record, at the log's first offset, with no
// X_CURSOR_EXPIRED.
func TestPersisted_SubscribeMakesNoStream(t *testing.T) {
	t.Parallel()
	db := tempLog(t)
	a := newAuthServer(t, gateway.Config{Log: db, Persist: []string{"chat:*"}}, nil, auth.Config{})

	reader := gwtest.Dial(t, a.url, nil)
	tok := sign(t, jwt.SigningMethodHS256, testSecret, a.claims("reader", time.Hour, auth.TopicClaims{Subscribe: []string{"chat:*"}}))
	if _, ack := helloWith(reader, tok); ack != nil {
		t.Fatalf("reader hello: %+v", ack)
	}
	const n = 50
	for i := range n {
		snap := reader.Subscribe(fmt.Sprint("s", i), fmt.Sprint("chat:new", i))
		if snap.Cursor.LSN != storage.ZeroOffset || snap.Cursor.Digest != "" {
			t.Fatalf("snapshot of a topic with no stream: %+v, want %s with no digest", snap.Cursor, storage.ZeroOffset)
		}
	}
	for i := range n {
		notFound(t, db, fmt.Sprint("chat:new", i))
	}
	// Nor may it make one by publishing.
	if ack := reader.Publish("k", 0, "chat:new7", `"no"`); ack.Error == nil || ack.Error.Code != frames.CodeForbidden {
		t.Fatalf("publish without the grant: %+v", ack)
	}
	notFound(t, db, "chat:new7")

	writer := gwtest.Dial(t, a.url, nil)
	wtok := sign(t, jwt.SigningMethodHS256, testSecret, a.claims("writer", time.Hour, auth.TopicClaims{Publish: []string{"chat:*"}}))
	if _, ack := helloWith(writer, wtok); ack != nil {
		t.Fatalf("writer hello: %+v", ack)
	}
	ack := writer.Publish("k0", 0, "chat:new7", `{"text":"first"}`)
	if ack.Error != nil || ack.LSN == nil || *ack.LSN != storage.FormatOffset(1) {
		t.Fatalf("first publish: %+v, want the log's first offset", ack)
	}
	digest := expectMade(t, reader, "s7")
	ops := collect(t, reader, "s7", 1)
	if ops[0].LSN != *ack.LSN || rowData(t, ops[0]) != `{"text":"first"}` {
		t.Fatalf("patch %+v for ack %s", ops[0], *ack.LSN)
	}
	info, err := db.Head(context.Background(), "chat:new7")
	if want := "log:" + strconv.FormatUint(info.ID, 36) + "." + strconv.FormatInt(info.CreatedAt.UnixNano(), 36); err != nil || digest != want {
		t.Fatalf("Head after the publish: %+v, %v; snapshot digest %q, want %q", info, err, digest, want)
	}
	// The others still have none; the next publish arrives as a plain patch.
	for i := range n {
		if i != 7 {
			notFound(t, db, fmt.Sprint("chat:new", i))
		}
	}
	ack = writer.Publish("k1", 1, "chat:new7", `2`)
	if ops := collect(t, reader, "s7", 1); ack.Error != nil || ops[0].LSN != *ack.LSN {
		t.Fatalf("second publish %+v arrived as %+v", ack, ops)
	}
	noExpiredCursors(t, a.ts.URL)
}

// A stream made over HTTP (PUT with records) while a topic has
// subscribers but no stream reaches them at once, from its first record;
// a resume from the cursor they had before it existed (the zero offset, no
// digest) replays it from its start, and a resume from the cursor they
// have now continues.
func TestPersisted_MadeOverHTTPWhileSubscribed(t *testing.T) {
	t.Parallel()
	n := startPersistNode(t, t.TempDir())
	const topic = "chat:later"
	live := gwtest.Dial(t, n.url, nil)
	live.Hello("", 0)
	before := live.Subscribe("l", topic).Cursor
	notFound(t, n.db, topic)

	streamRequest(t, n, http.MethodPut, topic, `[{"a":1},{"a":2}]`)
	digest := expectMade(t, live, "l")
	ops := collect(t, live, "l", 2)
	for i, op := range ops {
		if want := fmt.Sprintf(`{"a":%d}`, i+1); op.LSN != storage.FormatOffset(uint64(i+1)) || rowData(t, op) != want {
			t.Fatalf("record %d arrived as %s at %s, want %s at %s", i, rowData(t, op), op.LSN, want, storage.FormatOffset(uint64(i+1)))
		}
	}

	// The cursor from before the stream: resumed at its start.
	r := gwtest.Dial(t, n.url, nil)
	r.Hello("", 0)
	r.Send(&frames.Subscribe{Op: frames.OpAdd, SID: "r", Target: frames.Target{Kind: frames.TargetTopic, Topic: topic, Cursor: &before}})
	if ack := gwtest.Expect[*frames.Ack](r); ack.Ref != "r" || ack.Error != nil {
		t.Fatalf("resume from before the stream: %+v", ack)
	}
	if s := gwtest.Expect[*frames.Snapshot](r); s.Cursor.LSN != storage.ZeroOffset || s.Cursor.Digest != digest {
		t.Fatalf("resume snapshot %+v, want the new log's start (%s)", s.Cursor, digest)
	}
	if got := collect(t, r, "r", 2); got[0].LSN != ops[0].LSN || got[1].LSN != ops[1].LSN {
		t.Fatalf("replayed %+v, want %+v", got, ops)
	}

	// The cursor the live subscriber has now (its last patch, the new
	// log's digest): resumed after it.
	now := frames.Cursor{QID: "topic:" + topic, LSN: ops[1].LSN, Digest: digest, IDs: []string{}, At: 1}
	r2 := gwtest.Dial(t, n.url, nil)
	r2.Hello("", 0)
	r2.Send(&frames.Subscribe{Op: frames.OpAdd, SID: "r", Target: frames.Target{Kind: frames.TargetTopic, Topic: topic, Cursor: &now}})
	if ack := gwtest.Expect[*frames.Ack](r2); ack.Error != nil {
		t.Fatalf("resume: %+v", ack)
	}
	if s := gwtest.Expect[*frames.Snapshot](r2); s.Cursor.LSN != ops[1].LSN || s.Cursor.Digest != digest {
		t.Fatalf("resume snapshot %+v", s.Cursor)
	}
	streamRequest(t, n, http.MethodPost, topic, `{"a":3}`)
	for _, c := range []*gwtest.Conn{live, r, r2} {
		sid := map[*gwtest.Conn]string{live: "l", r: "r", r2: "r"}[c]
		if op := collect(t, c, sid, 1)[0]; op.LSN != storage.FormatOffset(3) || rowData(t, op) != `{"a":3}` {
			t.Fatalf("%s: third record %+v", sid, op)
		}
	}
}

// A subscription that resumes while its topic has no stream is answered
// from the zero offset (resumed, or expired for an offset that cannot be
// in a stream that does not exist), and gets the stream's first record
// when a publish makes it.
func TestPersisted_ResumeBeforeTheStream(t *testing.T) {
	t.Parallel()
	n := startPersistNode(t, t.TempDir())
	c := gwtest.Dial(t, n.url, nil)
	c.Hello("", 0)
	resume(t, c, "z", "chat:z", storage.ZeroOffset)
	sendResume(c, "x", "chat:x", storage.FormatOffset(5))
	if ack := gwtest.Expect[*frames.Ack](c); ack.Ref != "x" || ack.Error == nil || ack.Error.Code != frames.CodeCursorExpired {
		t.Fatalf("resume at an offset of no stream: %+v", ack)
	}
	if s := gwtest.Expect[*frames.Snapshot](c); s.SID != "x" || s.Cursor.LSN != storage.ZeroOffset || s.Cursor.Digest != "" {
		t.Fatalf("resume at an offset of no stream: snapshot %+v", s)
	}
	notFound(t, n.db, "chat:z")
	notFound(t, n.db, "chat:x")

	pub := gwtest.Dial(t, n.url, nil)
	pub.Hello("w", 0)
	for i, topic := range []string{"chat:z", "chat:x"} {
		ack := pub.Publish(fmt.Sprint("k", i), int64(i), topic, `"hi"`)
		if ack.Error != nil {
			t.Fatalf("publish to %s: %+v", topic, ack.Error)
		}
		sid := strings.TrimPrefix(topic, "chat:")
		expectMade(t, c, sid)
		if op := collect(t, c, sid, 1)[0]; op.LSN != *ack.LSN || op.LSN != storage.FormatOffset(1) {
			t.Fatalf("%s: %+v for ack %s", topic, op, *ack.LSN)
		}
	}
}

// makeStream makes topic's JSON stream in db, as a publish or a PUT would:
// a subscribe does not.
func makeStream(t *testing.T, db *storage.DB, topic string) {
	t.Helper()
	if _, _, err := db.Create(context.Background(), topic, storage.CreateOptions{ContentType: "application/json"}); err != nil {
		t.Fatal(err)
	}
}

// hiddenLog hides its streams from Head while hidden is set: a node whose
// tailer has not looked since a stream was made elsewhere.
type hiddenLog struct {
	*storage.DB
	hidden atomic.Bool
}

func (l *hiddenLog) Head(ctx context.Context, name string) (storage.Info, error) {
	if l.hidden.Load() {
		return storage.Info{}, storage.ErrNotFound
	}
	return l.DB.Head(ctx, name)
}

// Two nodes on one log. Node B has a subscriber on a topic with no
// stream, so its tailer waits; a publish on node A makes the stream, which
// B has not looked for yet. A client that got the records on A resumes on
// B with a cursor naming that log: it is resumed after its cursor, not
// told the log was deleted and sent the whole log again.
func TestPersisted_ResumeOnAnotherNodeBeforeItSawTheStream(t *testing.T) {
	t.Parallel()
	db := tempLog(t)
	a := newTestServer(t, gateway.Config{Log: db, Persist: []string{"chat:*"}})
	blog := &hiddenLog{DB: db}
	blog.hidden.Store(true)
	b := newTestServer(t, gateway.Config{Log: blog, Persist: []string{"chat:*"}})
	const topic = "chat:shared"

	live := gwtest.Dial(t, b.url, nil)
	live.Hello("", 0)
	if snap := live.Subscribe("l", topic); snap.Cursor.Digest != "" {
		t.Fatalf("snapshot on B %+v, want no log", snap.Cursor)
	}
	pub := gwtest.Dial(t, a.url, nil)
	pub.Hello("p", 0)
	var lsns []string
	for i := range 3 {
		ack := pub.Publish(fmt.Sprint("k", i), int64(i), topic, strconv.Itoa(i))
		if ack.Error != nil {
			t.Fatalf("publish %d on A: %+v", i, ack.Error)
		}
		lsns = append(lsns, *ack.LSN)
	}
	info, err := db.Head(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	digest := "log:" + strconv.FormatUint(info.ID, 36) + "." + strconv.FormatInt(info.CreatedAt.UnixNano(), 36)

	// B may see the stream now; its tailer's next look is up to a second
	// away. The client was at the second record on A.
	blog.hidden.Store(false)
	cursor := frames.Cursor{QID: "topic:" + topic, LSN: lsns[1], Digest: digest, IDs: []string{}, At: 1}
	r := gwtest.Dial(t, b.url, nil)
	r.Hello("", 0)
	r.Send(&frames.Subscribe{Op: frames.OpAdd, SID: "r", Target: frames.Target{Kind: frames.TargetTopic, Topic: topic, Cursor: &cursor}})
	if ack := gwtest.Expect[*frames.Ack](r); ack.Ref != "r" || ack.Error != nil {
		t.Fatalf("resume on B with the cursor of the log there: ref %q, error %+v", ack.Ref, ack.Error)
	}
	if s := gwtest.Expect[*frames.Snapshot](r); s.Cursor.LSN != lsns[1] || s.Cursor.Digest != digest {
		t.Fatalf("resume snapshot %+v, want %s of %s", s.Cursor, lsns[1], digest)
	}
	if op := collect(t, r, "r", 1)[0]; op.LSN != lsns[2] || rowData(t, op) != "2" {
		t.Fatalf("replayed %+v, want the third record at %s", op, lsns[2])
	}
	ack := pub.Publish("k3", 3, topic, "3")
	if ack.Error != nil {
		t.Fatalf("publish 3 on A: %+v", ack.Error)
	}
	if op := collect(t, r, "r", 1)[0]; op.LSN != *ack.LSN {
		t.Fatalf("live after the resume: %+v, want %s", op, *ack.LSN)
	}
	// The subscriber that was waiting gets the log from its start.
	if d := expectMade(t, live, "l"); d != digest {
		t.Fatalf("made snapshot on B names %q, want %q", d, digest)
	}
	lsns = append(lsns, *ack.LSN)
	for i, op := range collect(t, live, "l", 4) {
		if want := lsns[i]; op.LSN != want {
			t.Fatalf("live record %d at %s, want %s", i, op.LSN, want)
		}
	}
	noExpiredCursors(t, b.ts.URL)
}

// An HTTP append (POST, the publish grant) at a persisted topic's name
// makes its stream, as a WebSocket publish does, and its subscribers get
// the records at once; data that is not JSON makes none (409, as a PUT
// there). A read of the name before then is a 404: the stream does not
// exist.
func TestPersisted_HTTPPostMakesTheStream(t *testing.T) {
	t.Parallel()
	n := startPersistNode(t, t.TempDir())
	const topic = "chat:post"
	url := n.ts.URL + "/v1/stream/" + topic
	live := gwtest.Dial(t, n.url, nil)
	live.Hello("", 0)
	if snap := live.Subscribe("l", topic); snap.Cursor.Digest != "" {
		t.Fatalf("snapshot %+v, want no log", snap.Cursor)
	}
	if code, body := httpDo(t, http.MethodGet, url, "", "", ""); code != http.StatusNotFound {
		t.Fatalf("GET before any write: %d %s, want 404", code, body)
	}
	if code, body := httpDo(t, http.MethodPost, url, "", "text/plain", "hi"); code != http.StatusConflict || !strings.Contains(body, "application/json") {
		t.Fatalf("POST text/plain: %d %s, want 409 naming application/json", code, body)
	}
	if code, body := httpDo(t, http.MethodPost, url, "", "application/json", "{"); code != http.StatusBadRequest {
		t.Fatalf("POST of invalid JSON: %d %s, want 400", code, body)
	}
	req, err := http.NewRequest(http.MethodPost, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Stream-Closed", "true")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("close-only POST: %s, want 404 (a close makes no stream)", resp.Status)
	}
	notFound(t, n.db, topic)

	if code, body := httpDo(t, http.MethodPost, url, "", "application/json", `[{"n":1},{"n":2}]`); code != http.StatusNoContent {
		t.Fatalf("POST JSON: %d %s, want 204", code, body)
	}
	expectMade(t, live, "l")
	for i, op := range collect(t, live, "l", 2) {
		if want := fmt.Sprintf(`{"n":%d}`, i+1); op.LSN != storage.FormatOffset(uint64(i+1)) || rowData(t, op) != want {
			t.Fatalf("record %d arrived as %s at %s", i, rowData(t, op), op.LSN)
		}
	}
	if code, body := httpDo(t, http.MethodGet, url, "", "", ""); code != http.StatusOK || body != `[{"n":1},{"n":2}]` {
		t.Fatalf("GET after the POST: %d %s", code, body)
	}
	// Other names are not made by an append.
	if code, body := httpDo(t, http.MethodPost, n.ts.URL+"/v1/stream/notes:x", "", "application/json", `1`); code != http.StatusNotFound {
		t.Fatalf("POST at a name that is not persisted: %d %s, want 404", code, body)
	}
}

// A POST at a persisted topic's name that the log refuses (an unknown
// producer's seq 3, a gap; records over the log's append limit) makes no
// stream: the refusal changes nothing (docs/streams-http.md, Errors), so
// a read is still 404. The next admitted POST makes it, at the first
// offset.
func TestPersisted_HTTPPostRefusedMakesNoStream(t *testing.T) {
	t.Parallel()
	// The log's limit below the gateway's (8 MiB), so that the log refuses.
	s := newStreamServerWith(t, gateway.Config{Persist: []string{"chat:*"}}, func(o *storage.Options) { o.MaxAppendBytes = 16 })
	const p = "/v1/stream/chat:refused"
	post := func(seq, body string) reply {
		return s.do(t, http.MethodPost, p, hdr("Content-Type", "application/json", "Producer-Id", "A", "Producer-Epoch", "0", "Producer-Seq", seq), body)
	}
	post("3", `{"n":1}`).want(t, http.StatusConflict).wantHeader(t, "Producer-Expected-Seq", "0").wantHeader(t, "Producer-Received-Seq", "3")
	s.do(t, http.MethodGet, p, nil, "").want(t, http.StatusNotFound)
	post("0", `{"n":"more than sixteen bytes"}`).want(t, http.StatusRequestEntityTooLarge)
	s.do(t, http.MethodGet, p, nil, "").want(t, http.StatusNotFound)

	post("0", `{"n":1}`).want(t, http.StatusOK).wantHeader(t, "Stream-Next-Offset", storage.FormatOffset(1))
	s.do(t, http.MethodGet, p, nil, "").want(t, http.StatusOK).wantBody(t, `[{"n":1}]`)
}

// A message appended over HTTP reaches each WebSocket subscriber of a
// persisted topic as one patch, which its send queue must take whole: one
// larger than a quarter of the queue (SendQueueBytes/4) is refused with
// 413 (POST and PUT alike), and nothing is written. Accepted, it closed
// every live subscriber as a slow consumer (4001), and every resume from
// a cursor before it again. One at the bound reaches a live subscriber
// and a resume.
func TestPersisted_HTTPMessageFitsTheSendQueue(t *testing.T) {
	t.Parallel()
	const queue = 256 << 10
	n := startPersistNodeWith(t, t.TempDir(), nil, func(c *gateway.Config) { c.SendQueueBytes = queue })
	const topic = "chat:big"
	url := n.ts.URL + "/v1/stream/" + topic
	live := gwtest.Dial(t, n.url, nil)
	live.Hello("", 0)
	before := live.Subscribe("l", topic).Cursor

	message := func(size int) string { return `"` + strings.Repeat("x", size-2) + `"` }
	if code, body := httpDo(t, http.MethodPost, url, "", "application/json", message(queue/4+1)); code != http.StatusRequestEntityTooLarge || !strings.Contains(body, "send-queue-bytes") {
		t.Fatalf("POST of a message over a quarter of the send queue: %d %s, want 413 naming -send-queue-bytes", code, body)
	}
	notFound(t, n.db, topic)
	if code, body := httpDo(t, http.MethodPut, n.ts.URL+"/v1/stream/chat:bigput", "", "application/json", `[1,`+message(queue/4+1)+`]`); code != http.StatusRequestEntityTooLarge {
		t.Fatalf("PUT with a message over a quarter of the send queue: %d %s, want 413", code, body)
	}
	notFound(t, n.db, "chat:bigput")
	// Not a persisted topic: no WebSocket subscriber reads it.
	if code, body := httpDo(t, http.MethodPut, n.ts.URL+"/v1/stream/notes:big", "", "application/json", message(queue/4+1)); code != http.StatusCreated {
		t.Fatalf("PUT at a name that is not persisted: %d %s, want 201", code, body)
	}

	fits := message(queue / 4)
	if code, body := httpDo(t, http.MethodPost, url, "", "application/json", fits); code != http.StatusNoContent {
		t.Fatalf("POST of a message of a quarter of the send queue: %d %s, want 204", code, body)
	}
	expectMade(t, live, "l")
	if op := collect(t, live, "l", 1)[0]; rowData(t, op) != fits {
		t.Fatalf("live subscriber got %d bytes, want the message", len(rowData(t, op)))
	}
	r := gwtest.Dial(t, n.url, nil)
	r.Hello("", 0)
	r.Send(&frames.Subscribe{Op: frames.OpAdd, SID: "r", Target: frames.Target{Kind: frames.TargetTopic, Topic: topic, Cursor: &before}})
	if ack := gwtest.Expect[*frames.Ack](r); ack.Error != nil {
		t.Fatalf("resume from before the message: %+v", ack)
	}
	gwtest.Expect[*frames.Snapshot](r)
	if op := collect(t, r, "r", 1)[0]; rowData(t, op) != fits {
		t.Fatalf("resume got %d bytes, want the message", len(rowData(t, op)))
	}
}

// A record over that bound that reaches a persisted topic's log another
// way (here written to the log directly, as a fork of another stream, or
// a node with a larger queue, may have) is skipped, by the tailer and by
// a replay, with a warning in the node's log, and the next record is
// delivered. Sent, it closed every live subscriber as a slow consumer
// (4001), and every resume from a cursor before it again.
func TestPersisted_OversizedRecordIsSkipped(t *testing.T) {
	t.Parallel()
	const queue = 256 << 10
	logs := &syncBuffer{}
	n := startPersistNodeWith(t, t.TempDir(), nil, func(c *gateway.Config) {
		c.SendQueueBytes = queue
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	const topic = "chat:forked"
	live := gwtest.Dial(t, n.url, nil)
	live.Hello("", 0)
	before := live.Subscribe("l", topic).Cursor

	big := []byte(`"` + strings.Repeat("x", queue/4-1) + `"`)
	o := storage.CreateOptions{ContentType: "application/json", Records: [][]byte{big, []byte(`{"after":1}`)}}
	if _, _, err := n.db.Create(context.Background(), topic, o); err != nil {
		t.Fatal(err)
	}
	expectMade(t, live, "l")
	if op := collect(t, live, "l", 1)[0]; op.LSN != storage.FormatOffset(2) || rowData(t, op) != `{"after":1}` {
		t.Fatalf("live subscriber got %d bytes at %s, want the record after the oversized one", len(rowData(t, op)), op.LSN)
	}
	r := gwtest.Dial(t, n.url, nil)
	r.Hello("", 0)
	r.Send(&frames.Subscribe{Op: frames.OpAdd, SID: "r", Target: frames.Target{Kind: frames.TargetTopic, Topic: topic, Cursor: &before}})
	if ack := gwtest.Expect[*frames.Ack](r); ack.Error != nil {
		t.Fatalf("resume from before the records: %+v", ack)
	}
	gwtest.Expect[*frames.Snapshot](r)
	if op := collect(t, r, "r", 1)[0]; op.LSN != storage.FormatOffset(2) {
		t.Fatalf("resume got the record at %s, want only the one at %s", op.LSN, storage.FormatOffset(2))
	}
	if got := logs.String(); !strings.Contains(got, "larger than a quarter of a session's send queue") {
		t.Fatalf("no warning for the skipped record:\n%s", got)
	}
}

// With token keys, the append that makes a persisted topic's stream needs
// the publish grant (as a WebSocket publish), not manage.
func TestPersisted_HTTPPostMakesTheStreamWithPublish(t *testing.T) {
	t.Parallel()
	db := tempLog(t)
	a := newAuthServer(t, gateway.Config{Log: db, Persist: []string{"chat:*"}}, nil, auth.Config{})
	url := a.ts.URL + "/v1/stream/chat:backend"
	reader := sign(t, jwt.SigningMethodHS256, testSecret, a.claims("reader", time.Hour, auth.TopicClaims{Subscribe: []string{"chat:*"}}))
	if code, body := httpDo(t, http.MethodPost, url, "Bearer "+reader, "application/json", `1`); code != http.StatusForbidden {
		t.Fatalf("POST with subscribe only: %d %s, want 403", code, body)
	}
	notFound(t, db, "chat:backend")
	writer := sign(t, jwt.SigningMethodHS256, testSecret, a.claims("writer", time.Hour, auth.TopicClaims{Publish: []string{"chat:*"}}))
	if code, body := httpDo(t, http.MethodPost, url, "Bearer "+writer, "application/json", `1`); code != http.StatusNoContent {
		t.Fatalf("POST with publish: %d %s, want 204", code, body)
	}
	if info, err := db.Head(context.Background(), "chat:backend"); err != nil || info.Tail != storage.FormatOffset(1) {
		t.Fatalf("Head after the POST: %+v, %v", info, err)
	}
}

// headCountLog counts the log's Head calls: each is a look of a tailer
// (or a subscribe's).
type headCountLog struct {
	*storage.DB
	heads atomic.Int64
}

func (l *headCountLog) Head(ctx context.Context, name string) (storage.Info, error) {
	l.heads.Add(1)
	return l.DB.Head(ctx, name)
}

// waitLooked waits until a look of the tailer that began after heads (a
// count of the log's Head calls, read before) has ended, its result
// taken (t.refused set, say): the tailer looks one at a time, so that is
// once the look after it has begun. A look's Head call alone is not
// enough: under load the test could subscribe between the call and what
// the tailer makes of it. Nothing else may call Head meanwhile.
func waitLooked(t *testing.T, count func() int64, heads int64) {
	t.Helper()
	gwtest.Eventually(t, gwtest.Timeout, "the tailer looked", func() bool { return count() > heads+1 })
}

// startLoggedNode is startPersistNode logging into a buffer, its log's
// Head calls counted.
func startLoggedNode(t *testing.T) (*persistNode, *syncBuffer, *headCountLog) {
	t.Helper()
	logs, log := &syncBuffer{}, (*headCountLog)(nil)
	n := startPersistNodeWith(t, t.TempDir(), nil, func(c *gateway.Config) {
		log = &headCountLog{DB: c.Log.(*storage.DB)}
		c.Log = log
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	return n, logs, log
}

// makeTextStream makes topic's stream in db as text/plain, with three
// records: as a node that does not persist the name (or a PUT before it
// did) may have.
func makeTextStream(t *testing.T, db *storage.DB, topic string) {
	t.Helper()
	o := storage.CreateOptions{ContentType: "text/plain", Records: [][]byte{[]byte("a"), []byte("b"), []byte("c")}}
	if _, _, err := db.Create(context.Background(), topic, o); err != nil {
		t.Fatal(err)
	}
}

// expectBadTopic subscribes sid to topic and expects X_BAD_TOPIC (its
// stream is not JSON, or soft-deleted).
func expectBadTopic(t *testing.T, c *gwtest.Conn, sid, topic string) {
	t.Helper()
	c.Send(&frames.Subscribe{Op: frames.OpAdd, SID: sid, Target: frames.Target{Kind: frames.TargetTopic, Topic: topic}})
	if ack := gwtest.Expect[*frames.Ack](c); ack.Ref != sid || ack.Error == nil || ack.Error.Code != frames.CodeBadTopic {
		t.Fatalf("subscribe to %s: ref %q, error %+v, want X_BAD_TOPIC", topic, ack.Ref, ack.Error)
	}
}

const warnNotJSON = "its stream is not application/json"

// A stream that is not JSON appears where a topic's subscribers wait for
// one: it is not adopted (its records are not rows) and they keep
// waiting; the node says so once in its log, not at each look nor per
// record, and refuses new subscribers (X_BAD_TOPIC) as it does when no
// one was subscribed. A JSON stream made after its delete is adopted.
func TestPersisted_StreamNotJSONIsNoStream(t *testing.T) {
	t.Parallel()
	n, logs, log := startLoggedNode(t)
	const topic = "chat:text"
	live := gwtest.Dial(t, n.url, nil)
	live.Hello("", 0)
	live.Subscribe("l", topic)
	makeTextStream(t, n.db, topic)
	heads := log.heads.Load() // a look from now on sees it
	waitLooked(t, log.heads.Load, heads)
	c := gwtest.Dial(t, n.url, nil)
	c.Hello("", 0)
	expectBadTopic(t, c, "s", topic)
	// The tailer's next look (a second later) does not repeat the
	// warning.
	heads = log.heads.Load()
	waitLooked(t, log.heads.Load, heads)
	if got := logs.String(); strings.Count(got, warnNotJSON) != 1 || strings.Contains(got, "record is not JSON") {
		t.Fatalf("want one warning for the stream, none per record:\n%s", got)
	}

	streamRequest(t, n, http.MethodDelete, topic, "")
	streamRequest(t, n, http.MethodPut, topic, `[{"a":1}]`)
	expectMade(t, live, "l")
	if op := collect(t, live, "l", 1)[0]; op.LSN != storage.FormatOffset(1) || rowData(t, op) != `{"a":1}` {
		t.Fatalf("first record of the JSON stream: %s at %s", rowData(t, op), op.LSN)
	}
}

// A JSON stream deleted and replaced by one that is not JSON: its
// subscribers get the reset of a delete (the snapshot names no log), and
// wait for a JSON stream, as in TestPersisted_StreamNotJSONIsNoStream.
func TestPersisted_ReplacedByAStreamNotJSON(t *testing.T) {
	t.Parallel()
	n, logs, log := startLoggedNode(t)
	const topic = "chat:swap"
	makeStream(t, n.db, topic)
	live := gwtest.Dial(t, n.url, nil)
	live.Hello("", 0)
	live.Subscribe("l", topic)
	streamRequest(t, n, http.MethodPost, topic, `{"a":0}`)
	collect(t, live, "l", 1)

	if err := n.db.Delete(context.Background(), topic); err != nil {
		t.Fatal(err)
	}
	makeTextStream(t, n.db, topic)
	heads := log.heads.Load() // a look from now on sees it
	if ack := gwtest.Expect[*frames.Ack](live); ack.Error == nil || ack.Error.Code != frames.CodeCursorExpired {
		t.Fatalf("after the replacement: %+v", ack)
	}
	if s := gwtest.Expect[*frames.Snapshot](live); s.Cursor.LSN != storage.ZeroOffset || s.Cursor.Digest != "" {
		t.Fatalf("after the replacement: snapshot %+v, want the start naming no log", s.Cursor)
	}
	waitLooked(t, log.heads.Load, heads)
	c := gwtest.Dial(t, n.url, nil)
	c.Hello("", 0)
	expectBadTopic(t, c, "s", topic)

	streamRequest(t, n, http.MethodDelete, topic, "")
	streamRequest(t, n, http.MethodPut, topic, `[{"a":1}]`)
	expectMade(t, live, "l")
	if op := collect(t, live, "l", 1)[0]; op.LSN != storage.FormatOffset(1) || rowData(t, op) != `{"a":1}` {
		t.Fatalf("first record of the JSON stream: %s at %s", rowData(t, op), op.LSN)
	}
	if got := logs.String(); strings.Count(got, warnNotJSON) != 1 || strings.Contains(got, "record is not JSON") {
		t.Fatalf("want one warning for the stream, none per record:\n%s", got)
	}
}

// A stream that is not JSON, where subscribers wait, replaced by a JSON
// stream made elsewhere (another node sharing the log) before the node's
// tailer looks again: a new subscribe is not refused on the tailer's
// last look (the Go client would end the subscription for good); the
// node looks, takes the subscribe as one to a topic with no stream yet,
// and the JSON stream reaches it.
func TestPersisted_NotJSONReplacedElsewhere(t *testing.T) {
	t.Parallel()
	var log *trapHeadLog
	db, srv := startWrappedNode(t, nil, func(db *storage.DB) gateway.StreamLog {
		log = newTrapHeadLog(db)
		return log
	})
	const topic = "chat:retyped"
	live := gwtest.Dial(t, srv.url, nil)
	live.Hello("", 0)
	live.Subscribe("l", topic)
	makeTextStream(t, db, topic)
	heads := log.heads.Load() // a look from now on sees it
	waitLooked(t, log.heads.Load, heads)
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("", 0)
	expectBadTopic(t, c, "s", topic)

	log.trap(t) // the tailer's next look waits
	if err := db.Delete(context.Background(), topic); err != nil {
		t.Fatal(err)
	}
	if _, _, err := db.Create(context.Background(), topic, storage.CreateOptions{ContentType: "application/json", Records: [][]byte{[]byte(`{"a":1}`)}}); err != nil {
		t.Fatal(err)
	}
	if snap := c.Subscribe("s2", topic); snap.Cursor.LSN != storage.ZeroOffset || snap.Cursor.Digest != "" {
		t.Fatalf("subscribe after the JSON stream was made: snapshot %+v, want the start naming no log yet", snap.Cursor)
	}
	close(log.release)
	d := logDigest(t, db, topic)
	for _, sub := range []struct {
		c   *gwtest.Conn
		sid string
	}{{live, "l"}, {c, "s2"}} {
		if got := expectMade(t, sub.c, sub.sid); got != d {
			t.Fatalf("%s: made snapshot names %s, want %s", sub.sid, got, d)
		}
		if op := collect(t, sub.c, sub.sid, 1)[0]; op.LSN != storage.FormatOffset(1) || rowData(t, op) != `{"a":1}` {
			t.Fatalf("%s: first record %s at %s", sub.sid, rowData(t, op), op.LSN)
		}
	}
}

// A stream deleted while a fork keeps it (soft-deleted) is taken for no
// stream by its subscribers (the reset of a delete), and a new subscribe
// is refused (X_BAD_TOPIC) whether or not the topic has a tailer already,
// as docs/protocol.md §6.6 says; once the fork is gone the name is free.
func TestPersisted_SoftDeletedWhileSubscribed(t *testing.T) {
	t.Parallel()
	n := startPersistNode(t, t.TempDir())
	const topic = "chat:forked"
	ctx := context.Background()
	makeStream(t, n.db, topic)
	live := gwtest.Dial(t, n.url, nil)
	live.Hello("", 0)
	live.Subscribe("l", topic)
	if _, _, err := n.db.Create(ctx, "chat:fork", storage.CreateOptions{ContentType: "application/json", ForkFrom: topic}); err != nil {
		t.Fatal(err)
	}
	if err := n.db.Delete(ctx, topic); err != nil {
		t.Fatal(err)
	}
	if _, err := n.db.Head(ctx, topic); !errors.Is(err, storage.ErrGone) {
		t.Fatalf("Head of the deleted source: %v, want it soft-deleted", err)
	}
	if ack := gwtest.Expect[*frames.Ack](live); ack.Error == nil || ack.Error.Code != frames.CodeCursorExpired {
		t.Fatalf("after the delete: %+v, want X_CURSOR_EXPIRED", ack)
	}
	if s := gwtest.Expect[*frames.Snapshot](live); s.Cursor.LSN != storage.ZeroOffset || s.Cursor.Digest != "" {
		t.Fatalf("after the delete: snapshot %+v, want the start naming no log", s.Cursor)
	}
	c := gwtest.Dial(t, n.url, nil)
	c.Hello("", 0)
	expectBadTopic(t, c, "s", topic) // the tailer runs
	live.Send(&frames.Subscribe{Op: frames.OpDrop, SID: "l", Target: frames.Target{Kind: frames.TargetTopic, Topic: topic}})
	if ack := gwtest.Expect[*frames.Ack](live); ack.Error != nil {
		t.Fatalf("drop: %+v", ack.Error)
	}
	expectBadTopic(t, c, "s", topic) // a new tailer

	if err := n.db.Delete(ctx, "chat:fork"); err != nil {
		t.Fatal(err)
	}
	if snap := c.Subscribe("s", topic); snap.Cursor.Digest != "" {
		t.Fatalf("subscribe once the fork is gone: snapshot %+v", snap.Cursor)
	}
}

// A resume whose cursor names a log this node's log does not have, on a
// topic with no stream (it was got from a node with a log of its own, or
// the stream was deleted), expires; the cause does not claim the topic
// had a stream here.
func TestPersisted_CursorOfALogNotHere(t *testing.T) {
	t.Parallel()
	n := startPersistNode(t, t.TempDir())
	c := gwtest.Dial(t, n.url, nil)
	c.Hello("", 0)
	cursor := frames.Cursor{QID: "topic:chat:elsewhere", LSN: storage.FormatOffset(3), Digest: "log:1.dn824jm5qqhg", IDs: []string{}, At: 1}
	c.Send(&frames.Subscribe{Op: frames.OpAdd, SID: "r", Target: frames.Target{Kind: frames.TargetTopic, Topic: "chat:elsewhere", Cursor: &cursor}})
	ack := gwtest.Expect[*frames.Ack](c)
	if ack.Error == nil || ack.Error.Code != frames.CodeCursorExpired || !strings.Contains(ack.Error.Cause, "has no stream") {
		t.Fatalf("resume with another log's cursor on a topic with no stream: %+v, want X_CURSOR_EXPIRED saying it has no stream", ack.Error)
	}
	if s := gwtest.Expect[*frames.Snapshot](c); s.Cursor.LSN != storage.ZeroOffset || s.Cursor.Digest != "" {
		t.Fatalf("snapshot %+v, want the start naming no log", s.Cursor)
	}
}

// logDigest returns the cursor digest of topic's stream in db now.
func logDigest(t *testing.T, db *storage.DB, topic string) string {
	t.Helper()
	info, err := db.Head(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	return "log:" + strconv.FormatUint(info.ID, 36) + "." + strconv.FormatInt(info.CreatedAt.UnixNano(), 36)
}

// trapHeadLog holds the first Head call after trap until release is
// closed. With no other caller about, that is the next look of a tailer
// waiting for its topic's stream (at most a second away), which a test
// keeps from happening while it changes the log. Other Head calls are
// counted once answered.
type trapHeadLog struct {
	*storage.DB
	armed   atomic.Bool
	trapped chan struct{} // closed when the armed Head is held
	release chan struct{}
	heads   atomic.Int64
}

func newTrapHeadLog(db *storage.DB) *trapHeadLog {
	return &trapHeadLog{DB: db, trapped: make(chan struct{}), release: make(chan struct{})}
}

func (l *trapHeadLog) Head(ctx context.Context, name string) (storage.Info, error) {
	if l.armed.CompareAndSwap(true, false) {
		close(l.trapped)
		select {
		case <-l.release:
		case <-ctx.Done():
			return storage.Info{}, ctx.Err()
		}
		return l.DB.Head(ctx, name)
	}
	info, err := l.DB.Head(ctx, name)
	l.heads.Add(1)
	return info, err
}

// trap arms the trap and waits until a Head call is held in it.
func (l *trapHeadLog) trap(t *testing.T) {
	t.Helper()
	l.armed.Store(true)
	waitClosed(t, "a look held", l.trapped)
}

// A resume whose cursor names log D at its start, on a node whose tailer
// has no stream: the replayer sees D there and waits for the tailer's
// adoption, but before the tailer looks D is deleted and D2 made. The
// cursor is of a deleted log: it expires, and the resume gets D2 from its
// start; it is not answered as resumed in D2 (only a cursor that names no
// log is taken as a position in whatever log there is).
func TestPersisted_ResumeOfALogReplacedBeforeTheTailerSawIt(t *testing.T) {
	t.Parallel()
	var log *trapHeadLog
	db, srv := startWrappedNode(t, nil, func(db *storage.DB) gateway.StreamLog {
		log = newTrapHeadLog(db)
		return log
	})
	const topic = "chat:swapped"
	ctx := context.Background()
	live := gwtest.Dial(t, srv.url, nil)
	live.Hello("", 0)
	live.Subscribe("l", topic) // the tailer waits for a stream
	log.trap(t)                // and is held in its next look

	// Another node sharing the log makes D; the client got D's digest
	// there before any record.
	if _, _, err := db.Create(ctx, topic, storage.CreateOptions{ContentType: "application/json", Records: [][]byte{[]byte(`"d"`)}}); err != nil {
		t.Fatal(err)
	}
	d := logDigest(t, db, topic)
	heads := log.heads.Load()
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("", 0)
	resumeAt(c, "r", topic, frames.Cursor{QID: "topic:" + topic, Digest: d, IDs: []string{}, At: 1}, 0)
	gwtest.Eventually(t, gwtest.Timeout, "the replayer looked at the log", func() bool { return log.heads.Load() > heads })
	if err := db.Delete(ctx, topic); err != nil {
		t.Fatal(err)
	}
	if _, _, err := db.Create(ctx, topic, storage.CreateOptions{ContentType: "application/json", Records: [][]byte{[]byte(`"d2"`)}}); err != nil {
		t.Fatal(err)
	}
	d2 := logDigest(t, db, topic)
	close(log.release) // the tailer looks: it adopts D2

	if ack := gwtest.Expect[*frames.Ack](c); ack.Ref != "r" || ack.Error == nil || ack.Error.Code != frames.CodeCursorExpired {
		t.Fatalf("resume naming deleted log %s: ack %+v, want X_CURSOR_EXPIRED", d, ack)
	}
	if s := gwtest.Expect[*frames.Snapshot](c); s.Cursor.LSN != storage.ZeroOffset || s.Cursor.Digest != d2 {
		t.Fatalf("snapshot %+v, want the start of %s", s.Cursor, d2)
	}
	if op := collect(t, c, "r", 1)[0]; op.LSN != storage.FormatOffset(1) || rowData(t, op) != `"d2"` {
		t.Fatalf("first record of D2: %s at %s", rowData(t, op), op.LSN)
	}
	if got := expectMade(t, live, "l"); got != d2 {
		t.Fatalf("the live subscriber's snapshot names %s, want %s", got, d2)
	}
	if op := collect(t, live, "l", 1)[0]; op.LSN != storage.FormatOffset(1) {
		t.Fatalf("live: first record of D2 at %s", op.LSN)
	}
}

// noExpiredCursors fails the test if the node at url has counted a resume
// whose cursor expired (a reset its clients were told of).
func noExpiredCursors(t *testing.T, url string) {
	t.Helper()
	if m := scrape(t, url); !strings.Contains(m, `syncgate_resumes_total{outcome="expired"} 0`) {
		t.Fatalf("a resume's cursor was counted as expired:\n%s", grepLines(m, "syncgate_resumes_total"))
	}
}

// tempLog opens a stream log in the test's temporary directory, closed
// when the test ends.
func tempLog(t *testing.T) *storage.DB {
	t.Helper()
	db, err := storage.Open(filepath.Join(t.TempDir(), "log.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// A record that is valid JSON but not what a frame may carry (a raw
// newline between its tokens, which would split the batch its patch goes
// out in, or bytes that are not UTF-8, which browsers fail the connection
// on), reaching the log other than over HTTP (which compacts and checks
// messages), is skipped as one that is not JSON.
func TestPersisted_RecordAFrameCannotCarryIsSkipped(t *testing.T) {
	t.Parallel()
	n := startPersistNodeWith(t, t.TempDir(), nil)
	const topic = "chat:raw"
	live := gwtest.Dial(t, n.url, nil)
	live.Hello("", 0)
	live.Subscribe("l", topic)
	recs := [][]byte{[]byte("{\"a\":\n1}"), []byte("\"\xff\""), []byte(`{"after":1}`)}
	o := storage.CreateOptions{ContentType: "application/json", Records: recs}
	if _, _, err := n.db.Create(context.Background(), topic, o); err != nil {
		t.Fatal(err)
	}
	expectMade(t, live, "l")
	if op := collect(t, live, "l", 1)[0]; op.LSN != storage.FormatOffset(3) || rowData(t, op) != `{"after":1}` {
		t.Fatalf("live subscriber got %s at %s, want the record after the two it cannot be sent", rowData(t, op), op.LSN)
	}
}
