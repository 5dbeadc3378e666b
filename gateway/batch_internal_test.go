package gateway

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// connPair returns the server end of a real WebSocket on loopback and the
// client end.
func connPair(t *testing.T) (server, client *websocket.Conn) {
	t.Helper()
	ch := make(chan *websocket.Conn, 1)
	done := make(chan struct{})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			t.Error(err)
			return
		}
		ch <- c
		<-done
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(ts.URL, "http"), nil)
	if err != nil {
		t.Fatal(err)
	}
	server = <-ch
	t.Cleanup(func() {
		_ = client.CloseNow()
		_ = server.CloseNow()
		close(done)
		ts.Close()
	})
	return server, client
}

// TestSession_WriteBatchOneMessage: what is queued together goes out as one
// WebSocket message, frames separated by '\n', split only at MaxBatchBytes.
func TestSession_WriteBatchOneMessage(t *testing.T) {
	for _, tc := range []struct {
		name     string
		maxBatch int
		wantMsgs int
	}{
		{"all in one", 1 << 16, 1},
		{"split at bound", 25, 3}, // 10-byte frames: two per message (10+1+10), five frames
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, err := New(Config{MaxBatchBytes: tc.maxBatch})
			if err != nil {
				t.Fatal(err)
			}
			defer srv.Shutdown(context.Background())
			sc, cc := connPair(t)
			s := newSession(srv, sc, "id", "test")
			prefix := []byte(`{"p":`)
			for _, body := range []string{`"aaa"}`, `"bbb"}`, `"ccc"}`, `"ddd"}`, `"eee"}`} {
				s.enqueue(outItem{prefix: prefix, body: []byte(body), kind: idxPatch})
			}
			if err := s.writeBatch(t.Context(), s.q.swap(nil)); err != nil {
				t.Fatal(err)
			}
			var got [][]byte
			for range tc.wantMsgs {
				_, msg, err := cc.Read(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, msg)
			}
			all := bytes.Join(got, []byte("\n"))
			want := `{"p":"aaa"}` + "\n" + `{"p":"bbb"}` + "\n" + `{"p":"ccc"}` + "\n" + `{"p":"ddd"}` + "\n" + `{"p":"eee"}`
			if string(all) != want {
				t.Fatalf("got %q", all)
			}
		})
	}
}

func TestSendQueue_Bounds(t *testing.T) {
	q := sendQueue{wake: make(chan struct{}, 1)}
	it := outItem{body: make([]byte, 10)}
	for i := range 3 {
		if full, closed := q.push(it, 3, 100); full || closed {
			t.Fatalf("push %d refused", i)
		}
	}
	if full, _ := q.push(it, 3, 100); !full {
		t.Fatal("4th push over a 3-message bound accepted")
	}
	if _, closed := q.push(it, 3, 100); !closed {
		t.Fatal("push after overflow accepted")
	}
	q2 := sendQueue{wake: make(chan struct{}, 1)}
	if full, _ := q2.push(outItem{body: make([]byte, 101)}, 10, 100); !full {
		t.Fatal("push over the byte bound accepted")
	}
	q3 := sendQueue{wake: make(chan struct{}, 1)}
	q3.push(it, 10, 100)
	if got := q3.swap(nil); len(got) != 1 {
		t.Fatalf("swap returned %d items", len(got))
	}
	if got := q3.swap(nil); len(got) != 0 {
		t.Fatalf("second swap returned %d items", len(got))
	}
}
