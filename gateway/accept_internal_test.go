package gateway

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/coder/websocket"
)

// Test_handshakeErrorMatchesAccept: handshakeError refuses exactly the
// upgrade requests websocket.Accept refuses, with Accept's status and
// headers, so checking it before the accept budget changes no answer.
// (A recorder cannot be hijacked: Accept answers a request it takes 501.)
func Test_handshakeErrorMatchesAccept(t *testing.T) {
	t.Parallel()
	const key = "dGhlIHNhbXBsZSBub25jZQ=="
	cases := []struct {
		name string
		edit func(r *http.Request)
	}{
		{"valid", func(*http.Request) {}},
		{"key with spaces", func(r *http.Request) { r.Header.Set("Sec-WebSocket-Key", " "+key+" ") }},
		{"Connection list", func(r *http.Request) { r.Header.Set("Connection", "keep-alive, Upgrade") }},
		{"Upgrade in capitals", func(r *http.Request) { r.Header.Set("Upgrade", "WebSocket") }},
		{"HTTP/1.0", func(r *http.Request) { r.Proto, r.ProtoMajor, r.ProtoMinor = "HTTP/1.0", 1, 0 }},
		{"no Connection", func(r *http.Request) { r.Header.Del("Connection") }},
		{"Connection keep-alive", func(r *http.Request) { r.Header.Set("Connection", "keep-alive") }},
		{"Upgrade h2c", func(r *http.Request) { r.Header.Set("Upgrade", "h2c") }},
		{"POST", func(r *http.Request) { r.Method = http.MethodPost }},
		{"no version", func(r *http.Request) { r.Header.Del("Sec-WebSocket-Version") }},
		{"version 8", func(r *http.Request) { r.Header.Set("Sec-WebSocket-Version", "8") }},
		{"no key", func(r *http.Request) { r.Header.Del("Sec-WebSocket-Key") }},
		{"two keys", func(r *http.Request) { r.Header.Add("Sec-WebSocket-Key", key) }},
		{"key not base64", func(r *http.Request) { r.Header.Set("Sec-WebSocket-Key", "not base64!") }},
		{"key of 15 bytes", func(r *http.Request) { r.Header.Set("Sec-WebSocket-Key", "AAAAAAAAAAAAAAAAAAAA") }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			req := func() *http.Request {
				r := httptest.NewRequest(http.MethodGet, "http://example.com/v1/ws", nil)
				r.Header.Set("Connection", "Upgrade")
				r.Header.Set("Upgrade", "websocket")
				r.Header.Set("Sec-WebSocket-Version", "13")
				r.Header.Set("Sec-WebSocket-Key", key)
				c.edit(r)
				return r
			}
			lib := httptest.NewRecorder()
			_, err := websocket.Accept(lib, req(), acceptOptions)
			if err == nil {
				t.Fatal("Accept upgraded a recorder")
			}
			ours := http.Header{}
			code, _ := handshakeError(ours, req())
			if code == 0 {
				if lib.Code != http.StatusNotImplemented {
					t.Fatalf("handshakeError takes it; Accept refused it %d: %s", lib.Code, lib.Body)
				}
				return
			}
			if code != lib.Code {
				t.Fatalf("handshakeError %d, Accept %d: %s", code, lib.Code, lib.Body)
			}
			for _, h := range []string{"Connection", "Upgrade", "Sec-WebSocket-Version"} {
				if got, want := ours.Get(h), lib.Header().Get(h); got != want {
					t.Errorf("%s: %q, Accept sets %q", h, got, want)
				}
			}
		})
	}
}
