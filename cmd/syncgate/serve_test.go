package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
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
	"github.com/syncgate/syncgate/frames"
)

// lineWriter hands each written line to a channel; a line the channel
// has no room for is dropped and counted.
type lineWriter struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	lines   chan string
	dropped int // guarded by mu
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
			w.dropped++
		}
	}
}

var listeningRE = regexp.MustCompile(`listening on https?://(\S+) `)

// TestRun_ServeAndGracefulStop runs the real command on a loopback port,
// publishes through it to a persisted topic, reads the message back over
// the Durable Streams API, then cancels (as SIGTERM does): the node drains
// (the session gets a reconnect frame and 1012) and run returns nil (exit 0).
func TestRun_ServeAndGracefulStop(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &lineWriter{lines: make(chan string, 16)}
	done := make(chan error, 1)
	dataDir := t.TempDir()
	go func() {
		done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-build-id", "b1", "-data-dir", dataDir, "-persist", "t",
			"-drain-spread", "200ms", "-drain-grace", "1s"}, env(nil), out, io.Discard)
	}()
	addr := awaitListening(t, out, done)
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
	c.Close()
	raw := dialSession(t, addr)
	cancel()
	if code, r := raw.drained(t); code != websocket.StatusServiceRestart || r == nil || r.Reason != frames.ReasonDrain || r.AfterMs >= 200 {
		t.Fatalf("drain: close %d, reconnect %+v; want a reconnect frame inside the spread, then 1012", code, r)
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

// awaitListening returns the address run reports it listens on.
func awaitListening(t *testing.T, out *lineWriter, done <-chan error) string {
	t.Helper()
	for {
		select {
		case line := <-out.lines:
			if m := listeningRE.FindStringSubmatch(line); m != nil {
				return m[1]
			}
			t.Fatalf("unexpected first line %q", line)
		case err := <-done:
			t.Fatalf("run returned early: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("no listening line within 10s")
		}
	}
}

// wsSession is a frame-level WebSocket session with its hello answered.
type wsSession struct{ c *websocket.Conn }

func dialSession(t *testing.T, addr string) *wsSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws://"+addr+"/v1/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.CloseNow() })
	hello, _ := frames.Encode(&frames.Hello{Resume: []frames.Cursor{}})
	if err := c.Write(ctx, websocket.MessageText, hello); err != nil {
		t.Fatal(err)
	}
	if _, msg, err := c.Read(ctx); err != nil || !strings.Contains(string(msg), `"type":"hello"`) {
		t.Fatalf("hello answer %q, %v", msg, err)
	}
	return &wsSession{c}
}

// drained reads until the connection ends; it returns the close code and
// the reconnect frame seen, if any.
func (r *wsSession) drained(t *testing.T) (websocket.StatusCode, *frames.Reconnect) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var rec *frames.Reconnect
	for {
		_, msg, err := r.c.Read(ctx)
		if err != nil {
			return websocket.CloseStatus(err), rec
		}
		if f, err := frames.Decode(msg); err == nil {
			if rf, ok := f.(*frames.Reconnect); ok {
				rec = rf
			}
		}
	}
}

// TestRun_DrainOnSignal: on cancel (SIGTERM) every session is told its own
// slot of the drain spread and closed with 1012 no earlier; run returns nil
// within spread + grace.
func TestRun_DrainOnSignal(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &lineWriter{lines: make(chan string, 16)}
	done := make(chan error, 1)
	const spread, grace = time.Second, time.Second
	go func() {
		done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-data-dir", t.TempDir(),
			"-drain-spread", spread.String(), "-drain-grace", grace.String()}, env(nil), out, io.Discard)
	}()
	addr := awaitListening(t, out, done)
	const n = 20
	conns := make([]*wsSession, n)
	for i := range conns {
		conns[i] = dialSession(t, addr)
	}
	start := time.Now()
	cancel()
	type result struct {
		code websocket.StatusCode
		rec  *frames.Reconnect
		at   time.Duration
	}
	results := make(chan result, n)
	for _, c := range conns {
		go func() {
			code, rec := c.drained(t)
			results <- result{code, rec, time.Since(start)}
		}()
	}
	seen := map[int64]bool{}
	for range n {
		r := <-results
		if r.code != websocket.StatusServiceRestart || r.rec == nil || r.rec.Reason != frames.ReasonDrain {
			t.Fatalf("close %d, reconnect %+v; want reconnect drain then 1012", r.code, r.rec)
		}
		if r.rec.AfterMs < 0 || r.rec.AfterMs >= spread.Milliseconds() || seen[r.rec.AfterMs] {
			t.Fatalf("afterMs %d: outside the spread or given twice", r.rec.AfterMs)
		}
		seen[r.rec.AfterMs] = true
		if r.at < time.Duration(r.rec.AfterMs)*time.Millisecond {
			t.Fatalf("closed at %v, before its afterMs %d", r.at, r.rec.AfterMs)
		}
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
		if took := time.Since(start); took > spread+grace {
			t.Fatalf("run returned %v after the signal, over spread+grace", took)
		}
	case <-time.After(spread + grace + 10*time.Second):
		t.Fatal("run did not return after the drain")
	}
}

// TestRun_AdminDrain: POST /v1/admin/drain with the admin token drains the
// node and run returns nil, as on SIGTERM; without the token it is refused.
func TestRun_AdminDrain(t *testing.T) {
	out := &lineWriter{lines: make(chan string, 16)}
	done := make(chan error, 1)
	const token = "test-admin-token-0123456789"
	go func() {
		done <- run(context.Background(), []string{"-addr", "127.0.0.1:0", "-data-dir", t.TempDir(), "-drain-spread", "100ms", "-drain-grace", "1s"},
			env(map[string]string{"SYNCGATE_ADMIN_TOKEN": token}), out, io.Discard)
	}()
	addr := awaitListening(t, out, done)
	c := dialSession(t, addr)
	post := func(auth string) int {
		req, _ := http.NewRequest("POST", "http://"+addr+"/v1/admin/drain", nil)
		req.Header.Set("Authorization", auth)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post("Bearer nope-nope-nope-nope"); code != http.StatusUnauthorized {
		t.Fatalf("wrong token: %d", code)
	}
	if code := post("Bearer " + token); code != http.StatusAccepted {
		t.Fatalf("admin drain: %d", code)
	}
	if code, _ := c.drained(t); code != websocket.StatusServiceRestart {
		t.Fatalf("close %d, want 1012", code)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("run did not return after an admin drain")
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

// TestRun_VersionRefusesArguments: version takes no arguments; one it
// would ignore is a usage error, and the version is not printed. Its -h
// is the usage asked for (stdout, no error).
func TestRun_VersionRefusesArguments(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"version", "extra"}, {"version", "-short"}, {"version", "--", "x"}} {
		var out, errOut bytes.Buffer
		err := run(t.Context(), args, env(nil), &out, &errOut)
		if err == nil || out.Len() != 0 || (args[1] == "extra" && !strings.Contains(err.Error(), `"extra"`)) {
			t.Errorf("%q: err %v, stdout %q; want a usage error (naming a stray argument) and no version", args, err, out.String())
		}
	}
	var out, errOut bytes.Buffer
	err := run(t.Context(), []string{"version", "-h"}, env(nil), &out, &errOut)
	if err != nil || !strings.Contains(out.String(), "usage: syncgate version") || errOut.Len() != 0 {
		t.Errorf("version -h: err %v, stdout %q, stderr %q; want the usage on stdout alone", err, out.String(), errOut.String())
	}
}

// TestRun_CancelledBeforeListening: a signal during start-up (ctx ended
// before the listener is bound) stops the node cleanly, without binding
// its address or saying it listens: run returns nil with no "listening"
// line, and an address already taken is not even tried.
func TestRun_CancelledBeforeListening(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, addr := range []string{"127.0.0.1:0", taken.Addr().String()} {
		var out, logs bytes.Buffer
		err := run(ctx, []string{"-addr", addr, "-data-dir", t.TempDir(), "-drain-spread", "0s"}, env(nil), &out, &logs)
		if err != nil || strings.Contains(out.String(), "listening") || strings.Contains(logs.String(), "syncgate listening") {
			t.Errorf("-addr %s: err %v, stdout %q, logs %q; want nil and no listening line", addr, err, out.String(), logs.String())
		}
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

// TestRun_Help: -h and --help, before a command or after serve, print the
// usage to stdout and end run without an error (exit 0), as the flag
// package's own ExitOnError does; a flag that does not exist is still a
// usage error, said on stderr with nothing on stdout.
func TestRun_Help(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"-h"}, {"--help"}, {"-help"}, {"serve", "-h"}, {"serve", "--help"}, {"help"}} {
		var out, errOut bytes.Buffer
		err := run(t.Context(), args, env(nil), &out, &errOut)
		if err != nil || !strings.Contains(out.String(), "usage: syncgate") || !strings.Contains(out.String(), "-addr") || errOut.Len() != 0 {
			t.Errorf("%q: err %v, stdout %.80q, stderr %.80q; want no error and the usage with the flags on stdout alone", args, err, out.String(), errOut.String())
		}
	}
	var out, errOut bytes.Buffer
	err := run(t.Context(), []string{"-bogus"}, env(nil), &out, &errOut)
	if !errors.Is(err, errUsage) || !strings.Contains(errOut.String(), "-bogus") || out.Len() != 0 {
		t.Errorf("-bogus: err %v, stdout %.80q, stderr %.80q; want errUsage and the complaint on stderr alone", err, out.String(), errOut.String())
	}
}

// TestNewHTTPServer_Bounds: the node's http.Server closes idle keep-alive
// connections and bounds request headers at max-token plus 56 KiB: a
// larger header block gets 431, one with a max-size token passes. Its
// error log keeps failed TLS handshakes out of the warn level.
func TestNewHTTPServer_Bounds(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	hs := newHTTPServer(&config{MaxToken: 8 << 10}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}),
		slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
	// A failed TLS handshake, which anyone can cause, logs at debug only;
	// net/http's other errors at warn.
	hs.ErrorLog.Printf("http: TLS handshake error from 127.0.0.1:1234: EOF")
	hs.ErrorLog.Printf("http: Accept error: too many open files; retrying in 5ms")
	if strings.Contains(logs.String(), "handshake") || !strings.Contains(logs.String(), "level=WARN msg=\"http: Accept error") {
		t.Errorf("error log at info level: %q", logs.String())
	}
	if hs.IdleTimeout != httpIdleTimeout || hs.ReadHeaderTimeout <= 0 || hs.MaxHeaderBytes != 64<<10 {
		t.Fatalf("IdleTimeout %v, ReadHeaderTimeout %v, MaxHeaderBytes %d; want %v, > 0, 65536",
			hs.IdleTimeout, hs.ReadHeaderTimeout, hs.MaxHeaderBytes, httpIdleTimeout)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() {
		// Shutdown, not Close: it waits for the connection the 431 is
		// still closing (net/http lingers there half a second).
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
	})
	get := func(headerBytes int) int {
		req, err := http.NewRequest("GET", "http://"+ln.Addr().String()+"/", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+strings.Repeat("a", headerBytes))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(8 << 10); code != http.StatusOK {
		t.Errorf("a request with an 8 KiB token: %d", code)
	}
	if code := get(200 << 10); code != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("a 200 KiB header: %d, want 431", code)
	}
}
