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

// fakeServer is a stand-in for the gateway until the gateway end-to-end
// tests (in gateway/) cover the client. It speaks just enough of the
// protocol for these tests: the hello reply, ack + snapshot for subscribe,
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
type fakeServer struct {
	t   *testing.T
	srv *httptest.Server
	wg  sync.WaitGroup // connection handlers

	// Reports to the test; buffered, never block the handler.
	hellos chan *frames.Hello
	held   chan frames.Frame
	conns  chan *websocket.Conn

	mu sync.Mutex
	// Guarded by mu.
	lsn      int64
	sessions int
	live     map[*websocket.Conn]bool
}

func newFakeServer(t *testing.T) *fakeServer {
	t.Helper()
	fs := &fakeServer{
		t:      t,
		hellos: make(chan *frames.Hello, 16),
		held:   make(chan frames.Frame, 16),
		conns:  make(chan *websocket.Conn, 16),
		live:   make(map[*websocket.Conn]bool),
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
	session string
	nextSeq int64
	subs    map[string]string // sid → topic
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
	fc := &fakeConn{session: fmt.Sprintf("sess-%d", fs.sessions), subs: map[string]string{}}
	fs.mu.Unlock()
	defer func() {
		fs.mu.Lock()
		delete(fs.live, conn)
		fs.mu.Unlock()
	}()
	report(fs.conns, conn)

	for {
		_, msg, err := conn.Read(context.Background())
		if err != nil {
			return
		}
		var out [][]byte
		frames.Split(msg, func(line []byte) bool {
			f, err := frames.Decode(line)
			if err != nil {
				fs.t.Errorf("fake server: decode %q: %v", line, err)
				return true
			}
			for _, g := range fs.handle(fc, f) {
				if raw, ok := g.(rawLine); ok {
					out = append(out, raw)
					continue
				}
				b, err := frames.Encode(g)
				if err != nil {
					fs.t.Errorf("fake server: encode %T: %v", g, err)
					continue
				}
				out = append(out, b)
			}
			return true
		})
		if len(out) == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = conn.Write(ctx, websocket.MessageText, bytes.Join(out, []byte("\n")))
		cancel()
		if err != nil {
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

// handle answers one client frame.
func (fs *fakeServer) handle(fc *fakeConn, f frames.Frame) []frames.Frame {
	switch f := f.(type) {
	case *frames.Hello:
		report(fs.hellos, f)
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
		return fs.handleSubscribe(fc, f)
	case *frames.Mutate:
		return fs.handleMutate(fc, f)
	}
	return []frames.Frame{errAck("", frames.CodeUnexpectedFrame, "unexpected frame")}
}

func (fs *fakeServer) handleSubscribe(fc *fakeConn, f *frames.Subscribe) []frames.Frame {
	topic := f.Target.Topic
	switch {
	case topic == "hold":
		report(fs.held, frames.Frame(f))
		return nil
	case topic == "forbidden":
		return []frames.Frame{errAck(f.SID, frames.CodeBadTopic, "target.topic: forbidden")}
	case f.Op == frames.OpDrop:
		if _, ok := fc.subs[f.SID]; !ok {
			return []frames.Frame{errAck(f.SID, frames.CodeNotSubscribed, "sid: not subscribed")}
		}
		delete(fc.subs, f.SID)
		return []frames.Frame{&frames.Ack{Ref: f.SID}}
	}
	fc.subs[f.SID] = topic
	ack := &frames.Ack{Ref: f.SID}
	if f.Target.Cursor != nil { // every topic here is ephemeral
		ack = errAck(f.SID, frames.CodeCursorExpired, "target.cursor: topic is ephemeral")
	}
	fs.mu.Lock()
	lsn := fs.lsnLocked()
	fs.mu.Unlock()
	return []frames.Frame{ack, &frames.Snapshot{
		SID:    f.SID,
		Rows:   []json.RawMessage{},
		Cursor: frames.Cursor{QID: "topic:" + topic, LSN: lsn, IDs: []string{}},
	}}
}

func (fs *fakeServer) handleMutate(fc *fakeConn, f *frames.Mutate) []frames.Frame {
	if f.Seq != fc.nextSeq {
		return []frames.Frame{errAck(f.Key, frames.CodeSeqGap, fmt.Sprintf("seq: got %d, want %d", f.Seq, fc.nextSeq))}
	}
	fc.nextSeq++
	switch f.Name {
	case "garbage":
		return []frames.Frame{rawLine("this is not a frame"), &frames.Ack{Ref: f.Key}}
	case "poke":
		return []frames.Frame{&frames.Reconnect{AfterMs: 250, Reason: frames.ReasonDrain}, &frames.Ack{Ref: f.Key}}
	case "publish":
	default:
		return []frames.Frame{errAck(f.Key, frames.CodeUnknownMutation, "name: unknown")}
	}
	var in struct {
		Topic string          `json:"topic"`
		Data  json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(f.Input, &in); err != nil {
		return []frames.Frame{errAck(f.Key, frames.CodeBadInput, err.Error())}
	}
	switch in.Topic {
	case "hold":
		report(fs.held, frames.Frame(f))
		return nil
	case "forbidden":
		return []frames.Frame{errAck(f.Key, frames.CodeBadTopic, "input.topic: forbidden")}
	}

	fs.mu.Lock()
	fs.lsn++
	lsn := fs.lsnLocked()
	fs.mu.Unlock()
	out := []frames.Frame{&frames.Ack{Ref: f.Key, LSN: &lsn}}
	row, _ := json.Marshal(map[string]any{"id": lsn, "data": in.Data, "actorId": nil, "at": 0})
	for sid, topic := range fc.subs {
		if topic == in.Topic {
			out = append(out, &frames.Patch{
				SID:     sid,
				Patches: []frames.PatchOp{{Op: frames.PatchInsert, ID: lsn, Row: row, LSN: lsn}},
				LSN:     lsn,
			})
		}
	}
	return out
}

// lsnLocked formats the current lsn; fixed width, so lsns sort as strings.
func (fs *fakeServer) lsnLocked() string {
	return fmt.Sprintf("%016d_%016d", fs.lsn, 0)
}

func errAck(ref string, code frames.Code, cause string) *frames.Ack {
	return &frames.Ack{Ref: ref, Error: &frames.ErrorBody{Code: code, Cause: cause, Fix: "see the test"}}
}
