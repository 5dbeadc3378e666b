package gateway_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/syncgate/syncgate/client"
	"github.com/syncgate/syncgate/frames"
	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/storage"
)

// The deadlines of Durable Streams requests (docs/security.md §6), over
// HTTP/1.1 and HTTP/2, whose write deadline is a timer that resets the
// stream when it fires, written or not.

// rawConn writes raw (a request as it goes on the wire, its body perhaps
// cut short) on a new connection to addr (host:port) and returns the
// connection, for more of the body, and a reader of its answers.
func rawConn(t *testing.T, addr, raw string) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write([]byte(raw)); err != nil {
		t.Fatal(err)
	}
	return conn, bufio.NewReader(conn)
}

// rawAnswer reads the answer on br and fails the test unless it has
// status want; what names the request.
func rawAnswer(t *testing.T, br *bufio.Reader, what string, want int) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%s: no answer: %v", what, err)
	}
	resp.Body.Close()
	if resp.StatusCode != want {
		t.Fatalf("%s: %s, want %d", what, resp.Status, want)
	}
}

// slowPost is the head of a text POST to path on addr promising n bytes
// of body, and the first of them.
func slowPost(addr, path string, n int, first string) string {
	return "POST " + path + " HTTP/1.1\r\nHost: " + addr + "\r\nContent-Type: text/plain\r\nContent-Length: " +
		strconv.Itoa(n) + "\r\n\r\n" + first
}

// TestStreamHTTP_SlowBodyAnswered: a body slower than WriteTimeout but
// within StreamBodyTimeout is appended and answered (a deadline from the
// request's start once cut that answer, and a retry appended twice); one
// past StreamBodyTimeout is answered 408 even when WriteTimeout is
// shorter.
func TestStreamHTTP_SlowBodyAnswered(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{WriteTimeout: 200 * time.Millisecond, StreamBodyTimeout: 2 * time.Second})
	const p = "/v1/stream/slow"
	s.do(t, "PUT", p, hdr("Content-Type", "text/plain"), "a").want(t, 201)

	addr := strings.TrimPrefix(s.base, "http://")
	conn, br := rawConn(t, addr, slowPost(addr, p, 2, "b"))
	<-time.After(500 * time.Millisecond) // the client is slow: that is what is tested
	if _, err := conn.Write([]byte("c")); err != nil {
		t.Fatal(err)
	}
	rawAnswer(t, br, "a body within its bound", http.StatusNoContent)
	_, br = rawConn(t, addr, slowPost(addr, p, 100, "xyz")) // and then nothing
	rawAnswer(t, br, "a stalled body", http.StatusRequestTimeout)
	s.do(t, "GET", p, nil, "").want(t, 200).wantBody(t, "abc")
}

// h2Server starts a gateway with a log behind TLS with HTTP/2, and
// returns its URL and a client that speaks HTTP/2 to it.
func h2Server(t *testing.T, cfg gateway.Config) (string, *http.Client) {
	t.Helper()
	db, err := storage.Open(filepath.Join(t.TempDir(), "s.db"), &storage.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	cfg.Log = db
	gw, err := gateway.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(gw.Handler())
	ts.EnableHTTP2 = true
	ts.StartTLS()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = gw.Shutdown(ctx)
		ts.Close()
	})
	c := ts.Client()
	c.Transport.(*http.Transport).ForceAttemptHTTP2 = true
	return ts.URL, c
}

func h2Do(t *testing.T, c *http.Client, method, url string, body io.Reader) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "text/plain")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	if resp.ProtoMajor != 2 {
		t.Fatalf("%s %s: %s, want HTTP/2", method, url, resp.Proto)
	}
	return resp
}

// TestStreamHTTP_H2Deadlines: over HTTP/2 a body slower than WriteTimeout
// is still appended and answered, and an SSE response idle for longer
// than WriteTimeout lives on to its keep-alive.
func TestStreamHTTP_H2Deadlines(t *testing.T) {
	t.Parallel()
	base, c := h2Server(t, gateway.Config{WriteTimeout: 300 * time.Millisecond, StreamBodyTimeout: 3 * time.Second,
		LongPollTimeout: 900 * time.Millisecond})
	h2Do(t, c, "PUT", base+"/v1/stream/b", strings.NewReader("a")).Body.Close()

	pr, pw := io.Pipe()
	go func() {
		_, _ = pw.Write([]byte("b"))
		<-time.After(600 * time.Millisecond) // the client is slow: that is what is tested
		_, _ = pw.Write([]byte("c"))
		pw.Close()
	}()
	resp := h2Do(t, c, "POST", base+"/v1/stream/b", pr)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("slow body over HTTP/2: %s, want 204", resp.Status)
	}

	resp = h2Do(t, c, "GET", base+"/v1/stream/b?offset=now&live=sse", nil)
	defer resp.Body.Close()
	buf := make([]byte, 4096)
	var got string
	for strings.Count(got, "event: control") < 2 { // the first control event, then the keep-alive
		n, err := resp.Body.Read(buf)
		got += string(buf[:n])
		if err != nil {
			t.Fatalf("SSE over HTTP/2 ended before its keep-alive: %v; got %q", err, got)
		}
	}
}

// TestPresence_ListBudgetKeepsTheClient: a join refused for the list
// budget is X_PRESENCE_RATE_LIMITED, not X_RATE_LIMITED, which the Go
// client takes as frames dropped and answers by starting over (a fresh
// session and a fresh budget).
func TestPresence_ListBudgetKeepsTheClient(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	srv := newTestServer(t, fastPresence(gateway.Config{Now: func() time.Time { return now }, MaxSubscriptions: 2}))
	refused := make(chan struct{}, 1)
	c := dialClient(t, srv.url, &client.Options{OnFrame: func(f frames.Frame) {
		if a, ok := f.(*frames.Ack); ok && a.Error != nil && a.Error.Code == frames.CodePresenceRateLimited {
			select {
			case refused <- struct{}{}:
			default:
			}
		}
	}})
	if _, err := c.Subscribe(t.Context(), "room", nil, func(*frames.Patch) {}); err != nil {
		t.Fatal(err)
	}
	for range 3 { // a budget of 2 lists: the third join is refused
		for _, op := range []string{frames.PresenceJoin, frames.PresenceLeave} {
			if err := c.Send(t.Context(), &frames.Presence{Topic: "room", Op: op, Members: []frames.Member{{Meta: []byte("null")}}}); err != nil {
				t.Fatalf("send: %v", err)
			}
		}
	}
	select {
	case <-refused:
	case <-time.After(10 * time.Second):
		t.Fatal("no X_PRESENCE_RATE_LIMITED")
	}
	// The refusal was read before this frame's answer: the client is
	// still up if a publish round trip works after it.
	if _, err := c.Publish(t.Context(), "room", []byte(`1`)); err != nil {
		t.Fatalf("publish after the refusal: %v (client error %v)", err, c.Err())
	}
}

// TestStreamHTTP_RefusedSlowBodyAnswered: a write refused before its body
// is read (a bad header, a foreign Origin), whose body trickles in, is
// still answered once StreamBodyTimeout passes: net/http reads the rest
// of a body before it answers, and that read is bounded too.
func TestStreamHTTP_RefusedSlowBodyAnswered(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{StreamBodyTimeout: 300 * time.Millisecond})
	host := strings.TrimPrefix(s.base, "http://")
	for _, tc := range []struct {
		head string
		want int
	}{
		{"PUT /v1/stream/x HTTP/1.1\r\nHost: " + host + "\r\nStream-TTL: abc\r\nContent-Length: 1000\r\n\r\nx", http.StatusBadRequest},
		{"POST /v1/stream/x HTTP/1.1\r\nHost: " + host + "\r\nOrigin: http://evil.example\r\nContent-Length: 1000\r\n\r\nx", http.StatusForbidden},
		{"POST /v1/stream/x HTTP/1.1\r\nHost: " + host + "\r\nOrigin: http://evil.example\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n", http.StatusForbidden},
	} {
		_, br := rawConn(t, host, tc.head)
		rawAnswer(t, br, strings.SplitN(tc.head, "\r\n", 2)[0], tc.want)
	}
}
