package gateway_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/syncgate/syncgate/frames"
	"github.com/syncgate/syncgate/gateway"
)

// TestGateway_StalledBodyBounded: a request outside the stream API that
// promises a body and never sends it is answered, and its connection
// closed, within StreamBodyTimeout. net/http reads what is left of an
// unread body (up to 256 KiB) after the handler, with no deadline of its
// own (syncgate serve sets no ReadTimeout: it would cut long-polls), so
// without one of ours the request held its connection and goroutine for
// as long as the client liked, however small the body it announced:
// slowloris past ReadHeaderTimeout.
func TestGateway_StalledBodyBounded(t *testing.T) {
	t.Parallel()
	const bound = 300 * time.Millisecond
	for _, tc := range []struct {
		name string
		cfg  gateway.Config
		host string // Host header; "" for the server's address
		path string
		want int
	}{
		{"healthz", gateway.Config{}, "", "/healthz", http.StatusOK},
		{"metrics", gateway.Config{}, "", "/metrics", http.StatusOK},
		{"ws without upgrade", gateway.Config{}, "", "/v1/ws", http.StatusUpgradeRequired},
		{"unknown path", gateway.Config{}, "", "/nope", http.StatusNotFound},
		{"admin without token", gateway.Config{AdminToken: adminToken}, "", "/v1/admin/drain", http.StatusUnauthorized},
		{"another host (421)", gateway.Config{}, "evil.example", "/healthz", http.StatusMisdirectedRequest},
		{"upgrade from a foreign origin", gateway.Config{}, "", "/v1/ws", http.StatusForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.cfg.StreamBodyTimeout = bound
			srv := newTestServer(t, tc.cfg)
			addr := strings.TrimPrefix(srv.ts.URL, "http://")
			host := tc.host
			if host == "" {
				host = addr
			}
			method := "GET"
			if strings.HasPrefix(tc.path, "/v1/admin/") {
				method = "POST"
			}
			head := ""
			if tc.want == http.StatusForbidden {
				head = "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n" +
					"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nOrigin: https://evil.example\r\n"
			}
			conn, br := rawConn(t, addr, method+" "+tc.path+" HTTP/1.1\r\nHost: "+host+
				"\r\n"+head+"Content-Length: 1000\r\n\r\nx") // and then nothing
			start := time.Now()
			rawAnswer(t, br, tc.name, tc.want)
			// Then the server must give up on the body and close.
			if err := conn.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
				t.Fatal(err)
			}
			_, err := io.Copy(io.Discard, br)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("connection still open %v after the request: the stalled body holds it", time.Since(start).Round(time.Millisecond))
			}
		})
	}
}

// bodyClaimConn adds "Content-Length: 1" to the first request written on
// it: an upgrade that claims a body, whose one byte is then the first of
// the client's first WebSocket frame.
type bodyClaimConn struct {
	net.Conn
	once sync.Once
}

func (c *bodyClaimConn) Write(p []byte) (int, error) {
	n := len(p)
	c.once.Do(func() {
		p = bytes.Replace(p, []byte("\r\n\r\n"), []byte("\r\nContent-Length: 1\r\n\r\n"), 1)
	})
	if _, err := c.Conn.Write(p); err != nil {
		return 0, err
	}
	return n, nil
}

// TestGateway_UpgradeWithBodyNotCut: the body deadline boundBody sets
// does not outlive the upgrade (net/http's Hijack clears the
// connection's deadlines): a session whose upgrade request claimed a
// body is still served after the deadline would have passed.
func TestGateway_UpgradeWithBodyNotCut(t *testing.T) {
	t.Parallel()
	const bound = 200 * time.Millisecond
	srv := newTestServer(t, gateway.Config{StreamBodyTimeout: bound})
	var d net.Dialer
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &bodyClaimConn{Conn: c}, nil
	}}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, srv.url, &websocket.DialOptions{HTTPClient: hc})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	<-time.After(3 * bound) // the client is slow: that is what is tested
	b, err := frames.Encode(&frames.Hello{BuildID: "test", Resume: []frames.Cursor{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Write(ctx, websocket.MessageText, b); err != nil {
		t.Fatal(err)
	}
	if _, msg, err := c.Read(ctx); err != nil || !strings.Contains(string(msg), `"hello"`) {
		t.Fatalf("hello after %v: %q, %v; want the server's hello", 3*bound, msg, err)
	}
}

// TestGateway_UnreadAnswersBounded: a client that sends requests and
// never reads the answers does not hold its connection past WriteTimeout.
// Without a write deadline (syncgate serve sets no WriteTimeout: it would
// cut long-polls and SSE) net/http blocked for good writing the answers
// of pipelined requests (or one /metrics page) into a full socket.
func TestGateway_UnreadAnswersBounded(t *testing.T) {
	t.Parallel()
	const wt = 300 * time.Millisecond
	srv := newTestServer(t, gateway.Config{WriteTimeout: wt})
	addr := strings.TrimPrefix(srv.ts.URL, "http://")
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := conn.(*net.TCPConn).SetReadBuffer(4096); err != nil {
		t.Fatal(err)
	}
	if err := conn.SetWriteDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	// Pipelined requests, never a read: once the socket buffers are full
	// the server's writes block, and then its reads of the requests.
	req := []byte(strings.Repeat("GET /metrics HTTP/1.1\r\nHost: "+addr+"\r\n\r\n", 64))
	start := time.Now()
	for {
		if _, err = conn.Write(req); err != nil {
			break
		}
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the server still holds the connection %v on: its answers wait for a client that does not read",
			time.Since(start).Round(time.Millisecond))
	}
}
