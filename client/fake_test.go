package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/syncgate/syncgate/frames"
)

// fakeServer is a stand-in for the gateway, for what the real one cannot
// be made to do on cue: hold or lose one ack, refuse the first hello with
// an overload, put an undecodable line or a reconnect frame before an
// ack. The client against the real gateway is tested in gateway/
// (client_*_test.go, fanout_test.go, auth_test.go, persist tests); these
// tests cover the client's own rules. It speaks just enough of the
// protocol for them: the hello reply, ack + snapshot for subscribe,
// ack + patch for publish (patches reach subscribers on the same
// connection only), and a per-connection seq check. All frames it sends in
// answer to one message are batched into one message, '\n'-separated.
//
// Magic values drive the cases the tests need:
//   - hello buildId "silent": no reply; "refuse": an error ack instead.
//   - topic "forbidden": subscribe and publish get an X_BAD_TOPIC ack.
//   - topic "hold": subscribe and publish get no answer; the frame is
//     reported on held.
//   - mutate name "garbage": an undecodable line precedes the ack.
//   - mutate name "poke": a reconnect frame precedes the ack.
//   - any other mutate name but "publish": an X_UNKNOWN_MUTATION ack.
//   - hello buildId "overload-once": the first such hello gets a
//     reconnect {afterMs: 50, overload} and close 1013; later ones pass.
//   - topic "hold1", "dropack1": on the fake's first session, a publish
//     gets no answer (hold1: not taken up; dropack1: published, ack lost).
//   - topic "limited1": on the fake's first session, the first publish is
//     answered X_RATE_LIMITED and not taken up, as the gateway drops a
//     frame over its rate. Topics ending "limitedsub1" ("limitedsub2"): a
//     subscribe on the fake's first (second) session, likewise.
//   - topics "p:*" are persisted: a subscribe with a cursor replays what
//     came after it; other topics answer a cursor with X_CURSOR_EXPIRED.
//
// Publishes reach the subscribers of every connection. A hello with a
// clientId makes the connection's mutates count per (clientId, epoch)
// across connections, with retries answered by the first ack.
type fakeServer struct {
	t   *testing.T
	srv *httptest.Server
	wg  sync.WaitGroup // connection handlers

	// Reports to the test; buffered, never block the handler.
	hellos chan *frames.Hello
	held   chan frames.Frame
	conns  chan *websocket.Conn
	closes chan websocket.StatusCode // the client's close code (-1: none)

	mu sync.Mutex
	// Guarded by mu.
	lsn       int64
	sessions  int
	live      map[*websocket.Conn]bool
	conns2    map[*fakeConn]bool
	logs      map[string][]*frames.Patch // persisted topics' patches
	producers map[string]*fakeProducer
	overload  bool // the overload-once hello was refused
}

// fakeProducer is a client-named producer: next expected seq and the acks
// sent, for retries.
type fakeProducer struct {
	next int64
	acks map[int64]*frames.Ack
}

func newFakeServer(t *testing.T) *fakeServer {
	t.Helper()
	fs := &fakeServer{
		t:         t,
		hellos:    make(chan *frames.Hello, 16),
		held:      make(chan frames.Frame, 16),
		conns:     make(chan *websocket.Conn, 16),
		closes:    make(chan websocket.StatusCode, 16),
		live:      make(map[*websocket.Conn]bool),
		conns2:    make(map[*fakeConn]bool),
		logs:      make(map[string][]*frames.Patch),
		producers: make(map[string]*fakeProducer),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/ws", fs.serve)
	fs.srv = httptest.NewServer(mux)
	t.Cleanup(fs.close)
	return fs
}

// url returns the WebSocket endpoint.
func (fs *fakeServer) url() string {
	return "ws" + strings.TrimPrefix(fs.srv.URL, "http") + "/v1/ws"
}

// close stops the server, cuts connections still open and waits for their
// handlers.
func (fs *fakeServer) close() {
	fs.srv.Close()
	fs.mu.Lock()
	for conn := range fs.live {
		conn.CloseNow()
	}
	fs.mu.Unlock()
	fs.wg.Wait()
}

// fakeConn is the fake server's state for one connection. It is owned by
// the connection's handler goroutine.
type fakeConn struct {
	conn     *websocket.Conn
	n        int // session number, from 1
	session  string
	producer string // clientId/epoch, or "" (seqs per connection)
	nextSeq  int64
	stalled  bool              // hold1 arrived: mutates are not taken up
	limited  bool              // limited1 was dropped once
	subs     map[string]string // sid → topic; guarded by fs.mu

	out [][]byte   // frames queued for the connection; guarded by fs.mu
	wmu sync.Mutex // held while writing
}

// enqueueLocked queues frames for fc. Caller holds fs.mu, so queues fill
// in one global order.
func (fs *fakeServer) enqueueLocked(fc *fakeConn, fr ...frames.Frame) {
	for _, g := range fr {
		if raw, ok := g.(rawLine); ok {
			fc.out = append(fc.out, raw)
			continue
		}
		b, err := frames.Encode(g)
		if err != nil {
			fs.t.Errorf("fake server: encode %T: %v", g, err)
			continue
		}
		fc.out = append(fc.out, b)
	}
}

// flush writes what is queued for fc as one message.
func (fs *fakeServer) flush(fc *fakeConn) {
	fc.wmu.Lock()
	defer fc.wmu.Unlock()
	fs.mu.Lock()
	out := fc.out
	fc.out = nil
	fs.mu.Unlock()
	if len(out) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = fc.conn.Write(ctx, websocket.MessageText, bytes.Join(out, []byte("\n")))
}

func (fs *fakeServer) serve(w http.ResponseWriter, r *http.Request) {
	// Add before Accept hijacks the connection: httptest's Close waits for
	// the request until then, so wg.Add cannot race with wg.Wait.
	fs.wg.Add(1)
	defer fs.wg.Done()
	conn, err := websocket.Accept(w, r, nil)
	if err != nil {
		fs.t.Errorf("fake server: accept: %v", err)
		return
	}
	defer conn.CloseNow()
	fs.mu.Lock()
	fs.live[conn] = true
	fs.sessions++
	fc := &fakeConn{conn: conn, n: fs.sessions, session: fmt.Sprintf("sess-%d", fs.sessions), subs: map[string]string{}}
	fs.conns2[fc] = true
	fs.mu.Unlock()
	defer func() {
		fs.mu.Lock()
		delete(fs.live, conn)
		delete(fs.conns2, fc)
		fs.mu.Unlock()
	}()
	report(fs.conns, conn)

	for {
		_, msg, err := conn.Read(context.Background())
		if err != nil {
			report(fs.closes, websocket.CloseStatus(err))
			return
		}
		touched := map[*fakeConn]bool{fc: true}
		closeWith := websocket.StatusCode(0)
		fs.mu.Lock()
		frames.Split(msg, func(line []byte) bool {
			f, err := frames.Decode(line)
			if err != nil {
				fs.t.Errorf("fake server: decode %q: %v", line, err)
				return true
			}
			if h, ok := f.(*frames.Hello); ok && h.BuildID == "overload-once" && !fs.overload {
				fs.overload = true
				fs.enqueueLocked(fc, &frames.Reconnect{AfterMs: 50, Reason: frames.ReasonOverload})
				closeWith = websocket.StatusTryAgainLater
				return false
			}
			fs.enqueueLocked(fc, fs.handleLocked(fc, f, touched)...)
			return true
		})
		fs.mu.Unlock()
		for other := range touched {
			fs.flush(other)
		}
		if closeWith != 0 {
			conn.Close(closeWith, "overload")
			return
		}
	}
}

// report sends v to a test without ever blocking the handler.
func report[T any](ch chan T, v T) {
	select {
	case ch <- v:
	default:
	}
}

// rawLine is a line the fake server sends as is.
type rawLine []byte

func (rawLine) FrameType() frames.Type { return "raw" }

// handleLocked answers one client frame; frames for other connections are
// queued on them, which are added to touched. Caller holds fs.mu.
func (fs *fakeServer) handleLocked(fc *fakeConn, f frames.Frame, touched map[*fakeConn]bool) []frames.Frame {
	switch f := f.(type) {
	case *frames.Hello:
		report(fs.hellos, f)
		if f.ClientID != "" {
			fc.producer = fmt.Sprintf("%s/%d", f.ClientID, f.Epoch)
		}
		switch f.BuildID {
		case "silent":
			return nil
		case "refuse":
			return []frames.Frame{errAck("", frames.CodeBadField, "hello.buildId: refused")}
		}
		return []frames.Frame{&frames.Hello{
			BuildID:   "server-build",
			SessionID: &fc.session,
			Resume:    []frames.Cursor{},
			ClientID:  f.ClientID,
			Epoch:     f.Epoch,
		}}
	case *frames.Subscribe:
		return fs.handleSubscribeLocked(fc, f)
	case *frames.Mutate:
		return fs.handleMutateLocked(fc, f, touched)
	}
	return []frames.Frame{errAck("", frames.CodeUnexpectedFrame, "unexpected frame")}
}

func (fs *fakeServer) handleSubscribeLocked(fc *fakeConn, f *frames.Subscribe) []frames.Frame {
	topic := f.Target.Topic
	switch {
	case topic == "hold":
		report(fs.held, frames.Frame(f))
		return nil
	case topic == "forbidden":
		return []frames.Frame{errAck(f.SID, frames.CodeBadTopic, "target.topic: forbidden")}
	case f.Op == frames.OpAdd && (strings.HasSuffix(topic, "limitedsub1") && fc.n == 1 || strings.HasSuffix(topic, "limitedsub2") && fc.n == 2):
		// Dropped over the rate, as the gateway drops a frame.
		return []frames.Frame{errAck(f.SID, frames.CodeRateLimited, "over the rate")}
	case f.Op == frames.OpDrop:
		if _, ok := fc.subs[f.SID]; !ok {
			return []frames.Frame{errAck(f.SID, frames.CodeNotSubscribed, "sid: not subscribed")}
		}
		delete(fc.subs, f.SID)
		return []frames.Frame{&frames.Ack{Ref: f.SID}}
	}
	fc.subs[f.SID] = topic
	cur := f.Target.Cursor
	if cur != nil && strings.HasPrefix(topic, "p:") {
		out := []frames.Frame{&frames.Ack{Ref: f.SID}, &frames.Snapshot{SID: f.SID, Rows: []json.RawMessage{}, Cursor: *cur}}
		for _, p := range fs.logs[topic] {
			if p.LSN > cur.LSN {
				q := *p
				q.SID = f.SID
				out = append(out, &q)
			}
		}
		return out
	}
	ack := &frames.Ack{Ref: f.SID}
	if cur != nil {
		ack = errAck(f.SID, frames.CodeCursorExpired, "target.cursor: topic is ephemeral")
	}
	return []frames.Frame{ack, &frames.Snapshot{
		SID:    f.SID,
		Rows:   []json.RawMessage{},
		Cursor: frames.Cursor{QID: "topic:" + topic, LSN: fs.lsnLocked(), IDs: []string{}},
	}}
}

func (fs *fakeServer) handleMutateLocked(fc *fakeConn, f *frames.Mutate, touched map[*fakeConn]bool) []frames.Frame {
	if fc.stalled {
		report(fs.held, frames.Frame(f))
		return nil
	}
	var pr *fakeProducer
	if fc.producer != "" {
		pr = fs.producers[fc.producer]
		if pr == nil {
			pr = &fakeProducer{next: f.Seq, acks: map[int64]*frames.Ack{}}
			fs.producers[fc.producer] = pr
		}
		if f.Seq < pr.next {
			if a := pr.acks[f.Seq]; a != nil {
				return []frames.Frame{a} // a retry: the first ack, nothing published
			}
		}
		if f.Seq != pr.next {
			return []frames.Frame{errAck(f.Key, frames.CodeSeqGap, fmt.Sprintf("seq: got %d, want %d", f.Seq, pr.next))}
		}
	} else if f.Seq != fc.nextSeq {
		return []frames.Frame{errAck(f.Key, frames.CodeSeqGap, fmt.Sprintf("seq: got %d, want %d", f.Seq, fc.nextSeq))}
	}
	var in struct {
		Topic string          `json:"topic"`
		Data  json.RawMessage `json:"data"`
	}
	if f.Name == "publish" {
		if err := json.Unmarshal(f.Input, &in); err != nil {
			return []frames.Frame{errAck(f.Key, frames.CodeBadInput, err.Error())}
		}
		switch {
		case in.Topic == "hold":
			fc.nextSeq++ // taken up, never answered
			if pr != nil {
				pr.next++
			}
			report(fs.held, frames.Frame(f))
			return nil
		case in.Topic == "limited1" && fc.n == 1 && !fc.limited:
			// Dropped over the rate, as the gateway drops a frame: not
			// taken up, the seq does not advance.
			fc.limited = true
			return []frames.Frame{errAck(f.Key, frames.CodeRateLimited, "over the rate")}
		case in.Topic == "hold1" && fc.n == 1:
			// Not taken up, nor anything after it on this connection (as
			// if it never arrived): the seq does not advance.
			fc.stalled = true
			report(fs.held, frames.Frame(f))
			return nil
		}
	}
	fc.nextSeq++
	out, ack := fs.runMutateLocked(fc, f, in.Topic, in.Data, touched)
	if pr != nil {
		pr.next++
		pr.acks[f.Seq] = ack
	}
	if in.Topic == "dropack1" && fc.n == 1 {
		report(fs.held, frames.Frame(f))
		return out[1:] // published, but the ack is lost
	}
	return out
}

// runMutateLocked carries out a mutate taken up: its answer, starting with
// the ack.
func (fs *fakeServer) runMutateLocked(fc *fakeConn, f *frames.Mutate, topic string, data json.RawMessage, touched map[*fakeConn]bool) ([]frames.Frame, *frames.Ack) {
	switch f.Name {
	case "garbage":
		a := &frames.Ack{Ref: f.Key}
		return []frames.Frame{a, rawLine("this is not a frame"), a}[1:], a
	case "poke":
		a := &frames.Ack{Ref: f.Key}
		return []frames.Frame{&frames.Reconnect{AfterMs: 250, Reason: frames.ReasonDrain}, a}, a
	case "publish":
	default:
		a := errAck(f.Key, frames.CodeUnknownMutation, "name: unknown")
		return []frames.Frame{a}, a
	}
	if topic == "forbidden" {
		a := errAck(f.Key, frames.CodeBadTopic, "input.topic: forbidden")
		return []frames.Frame{a}, a
	}
	fs.lsn++
	lsn := fs.lsnLocked()
	ack := &frames.Ack{Ref: f.Key, LSN: &lsn}
	out := []frames.Frame{ack}
	row, _ := json.Marshal(map[string]any{"id": lsn, "data": data, "actorId": nil, "at": 0})
	patch := frames.Patch{
		Patches: []frames.PatchOp{{Op: frames.PatchInsert, ID: lsn, Row: row, LSN: lsn}},
		LSN:     lsn,
	}
	if strings.HasPrefix(topic, "p:") {
		p := patch
		fs.logs[topic] = append(fs.logs[topic], &p)
	}
	for other := range fs.conns2 {
		for sid, t := range other.subs {
			if t != topic {
				continue
			}
			p := patch
			p.SID = sid
			if other == fc {
				out = append(out, &p)
			} else {
				fs.enqueueLocked(other, &p)
				touched[other] = true
			}
		}
	}
	return out, ack
}

// lsnLocked formats the current lsn; fixed width, so lsns sort as strings.
func (fs *fakeServer) lsnLocked() string {
	return fmt.Sprintf("%016d_%016d", fs.lsn, 0)
}

func errAck(ref string, code frames.Code, cause string) *frames.Ack {
	return &frames.Ack{Ref: ref, Error: &frames.ErrorBody{Code: code, Cause: cause, Fix: "see the test"}}
}
