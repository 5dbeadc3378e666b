package gateway

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// connPair returns the server end of a real WebSocket on loopback and the
// client end.
func connPair(t *testing.T) (server *websocket.Conn, raw *corkConn, client *websocket.Conn) {
	t.Helper()
	return connPairWith(t, nil)
}

// connPairWith is connPair with the client dialled with opts.
func connPairWith(t *testing.T, opts *websocket.DialOptions) (server *websocket.Conn, raw *corkConn, client *websocket.Conn) {
	t.Helper()
	ch := make(chan *websocket.Conn, 1)
	done := make(chan struct{})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(hijackSizer{w, &raw}, r, nil)
		if err != nil {
			t.Error(err)
			return
		}
		ch <- c
		<-done
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	client, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(ts.URL, "http"), opts)
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
	return server, raw, client
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
			sc, raw, cc := connPair(t)
			s := newSession(context.Background(), srv, sc, raw, "id", "test")
			prefix := []byte(`{"p":`)
			for _, body := range []string{`"aaa"}`, `"bbb"}`, `"ccc"}`, `"ddd"}`, `"eee"}`} {
				// push, not enqueue: no writer starts, the test writes.
				if r := s.q.push(outItem{prefix: prefix, body: []byte(body), kind: idxPatch}, 100, 1<<20); r == pushFull || r == pushClosed {
					t.Fatal("push refused")
				}
			}
			items, _, _, _ := s.q.next(nil)
			if _, _, err := s.writeBatch(t.Context(), items, true); err != nil {
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
	var wg sync.WaitGroup
	q := sendQueue{writers: &wg}
	it := outItem{body: make([]byte, 10)}
	for i, want := range []pushResult{pushedStart, pushed, pushed, pushFull} {
		if got := q.push(it, 3, 100); got != want {
			t.Fatalf("push %d = %d, want %d", i, got, want)
		}
	}
	if got := q.push(outItem{body: make([]byte, 80)}, 10, 100); got != pushFull {
		t.Fatalf("push over the byte bound = %d", got)
	}
	items, _, _, done := q.next(nil)
	if len(items) != 3 || done {
		t.Fatalf("next returned %d items, done %v", len(items), done)
	}
	if _, _, _, done := q.next(items); !done {
		t.Fatal("empty queue not done")
	}
	if got := q.push(it, 3, 100); got != pushedStart {
		t.Fatalf("push after the writer stopped = %d, want a new writer", got)
	}
	q.mu.Lock()
	q.reason = reasonShutdown
	q.mu.Unlock()
	if got := q.push(it, 3, 100); got != pushClosed {
		t.Fatalf("push while closing = %d", got)
	}
	wg.Add(-2) // the two writers this test claimed and never ran
}

// TestSendQueue_ReleaseKeepsArrays: a pool worker that stops a session
// whose queue array is too big to keep idle takes that array as its spare
// and leaves the session the small one it wrote from (cleared), so neither
// array is dropped; a session with a small array keeps its own. A session
// with more queued is not stopped and the worker keeps what it wrote.
func TestSendQueue_ReleaseKeepsArrays(t *testing.T) {
	var wg sync.WaitGroup
	it := outItem{body: []byte("x"), at: 1}
	for _, tc := range []struct {
		name               string
		own, written       int // capacities
		queued             bool
		stopped            bool
		wantOwn, wantSpare int // capacities after
	}{
		{"big own, small written: swapped", 16, 2, false, true, 2, 16},
		{"small own: kept", 4, 2, false, true, 4, 2},
		{"both big: own dropped", 16, 8, false, true, 0, 8},
		{"more queued: not stopped", 16, 2, true, false, 16, 2},
	} {
		q := sendQueue{writers: &wg, writing: true, items: make([]outItem, 0, tc.own)}
		if tc.queued {
			q.items = append(q.items, it)
		}
		written := append(make([]outItem, 0, tc.written), it)
		before := q.items[:1] // every case starts with an own array
		stopped, spare := q.release(written)
		if tc.name == "big own, small written: swapped" && (cap(spare) == 0 || &spare[:1][0] != &before[0] || len(spare) != 0) {
			t.Errorf("%s: the spare is not the session's former, empty array", tc.name)
		}
		if stopped != tc.stopped || cap(q.items) != tc.wantOwn || cap(spare) != tc.wantSpare {
			t.Errorf("%s: stopped %v, session's cap %d, spare's cap %d; want %v, %d, %d",
				tc.name, stopped, cap(q.items), cap(spare), tc.stopped, tc.wantOwn, tc.wantSpare)
		}
		if stopped && q.writing {
			t.Errorf("%s: stopped but still writing", tc.name)
		}
		if kept := q.items[:cap(q.items)]; cap(q.items) > 0 && kept[0].at != 0 && !tc.queued {
			t.Errorf("%s: the session kept a written frame in its array", tc.name)
		}
	}
}
