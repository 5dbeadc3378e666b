package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/syncgate/syncgate/client"
)

// lineWriter hands each written line to a channel.
type lineWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	lines chan string
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for {
		line, err := w.buf.ReadString('\n')
		if err != nil {
			w.buf.WriteString(line)
			return len(p), nil
		}
		select {
		case w.lines <- line:
		default:
		}
	}
}

var listeningRE = regexp.MustCompile(`listening on http://(\S+) `)

// TestRun_ServeAndGracefulStop runs the real command on a loopback port,
// publishes through it to a persisted topic, reads the message back over
// the Durable Streams API, then cancels (as SIGTERM does): the session gets
// 1001 and run returns nil (exit 0).
func TestRun_ServeAndGracefulStop(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &lineWriter{lines: make(chan string, 16)}
	done := make(chan error, 1)
	dataDir := t.TempDir()
	go func() {
		done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-build-id", "b1", "-data-dir", dataDir, "-persist", "t"}, env(nil), out, io.Discard)
	}()
	var addr string
	select {
	case line := <-out.lines:
		m := listeningRE.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("unexpected first line %q", line)
		}
		addr = m[1]
	case err := <-done:
		t.Fatalf("run returned early: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("no listening line within 10s")
	}
	dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer dcancel()
	c, err := client.Dial(dctx, "ws://"+addr+"/v1/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.ServerHello().BuildID != "b1" {
		t.Fatalf("server hello %+v", c.ServerHello())
	}
	if _, err := c.Subscribe(dctx, "t", nil, nil); err != nil {
		t.Fatal(err)
	}
	lsn, err := c.Publish(dctx, "t", json.RawMessage(`1`))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr + "/v1/stream/t?offset=-1")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"data":1`) || resp.Header.Get("Stream-Next-Offset") != lsn {
		t.Fatalf("stream t over HTTP: %s %q next=%s, want the message at %s", resp.Status, body, resp.Header.Get("Stream-Next-Offset"), lsn)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "streams.db")); err != nil {
		t.Fatalf("the log is not in -data-dir: %v", err)
	}
	cancel()
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("session not closed on shutdown")
	}
	if code := websocket.CloseStatus(c.Err()); code != websocket.StatusGoingAway {
		t.Fatalf("close = %v, want 1001", c.Err())
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("run did not return after cancel")
	}
}

func TestRun_Version(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"version"}, env(nil), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "syncgate ") {
		t.Fatalf("version output %q", out.String())
	}
}

func TestRun_BadConfigFails(t *testing.T) {
	err := run(context.Background(), []string{"-addr", ""}, env(nil), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "addr") {
		t.Fatalf("err = %v", err)
	}
	err = run(context.Background(), []string{"frobnicate"}, env(nil), io.Discard, io.Discard)
	if !errors.Is(err, errUsage) {
		t.Fatalf("unknown command: %v", err)
	}
}
