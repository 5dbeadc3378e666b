package gateway_test

import (
	"bufio"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/internal/gwtest"
)

// rawUpgrade sends a WebSocket upgrade request to srv whose Upgrade
// header is upgrade, and returns the response status.
func rawUpgrade(t *testing.T, srv *testServer, upgrade string) int {
	t.Helper()
	addr := strings.TrimPrefix(srv.ts.URL, "http://")
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(gwtest.Timeout))
	req := "GET /v1/ws HTTP/1.1\r\n" +
		"Host: " + addr + "\r\n" +
		"Connection: Upgrade\r\n" +
		"Upgrade: " + upgrade + "\r\n" +
		"Sec-WebSocket-Version: 13\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
	if _, err := c.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestAccept_UpgradeHeaderIsATokenList: the Upgrade header is a list of
// protocols (RFC 9110 §7.8); one that names websocket among others is a
// WebSocket upgrade, as websocket.Accept and checkHandshake take it. It
// was told 426 "send an upgrade request" (and, on a draining node, a
// plain 503 instead of the reconnect frame), so such a client could never
// connect.
func TestAccept_UpgradeHeaderIsATokenList(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{})
	for _, up := range []string{"websocket", "WebSocket", "websocket, foo/1", "foo/1, websocket"} {
		if code := rawUpgrade(t, srv, up); code != http.StatusSwitchingProtocols {
			t.Errorf("Upgrade: %s: status %d, want 101", up, code)
		}
	}
	if code := rawUpgrade(t, srv, "foo/1"); code != http.StatusUpgradeRequired {
		t.Errorf("Upgrade: foo/1: status %d, want 426", code)
	}
	if err := srv.gw.Drain(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Draining: upgraded to be told when to come back, not a plain 503.
	if code := rawUpgrade(t, srv, "foo/1, websocket"); code != http.StatusSwitchingProtocols {
		t.Errorf("draining, Upgrade: foo/1, websocket: status %d, want 101 (then reconnect)", code)
	}
}
