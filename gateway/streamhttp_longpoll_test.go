package gateway_test

import (
	"bufio"
	"context"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/storage"
)

// lateWake is a log whose live waits see a wakeup only as their context
// ends: the append that wakes a wait lands just as the long-poll times
// out. waiting gets a value when a wait starts (unless it holds one).
type lateWake struct {
	*storage.DB
	waiting chan struct{}
}

func (l *lateWake) WaitID(ctx context.Context, name, after string, id uint64) error {
	select {
	case l.waiting <- struct{}{}:
	default: // the test has not taken the last one
	}
	err := l.DB.WaitID(ctx, name, after, id)
	if err == nil {
		<-ctx.Done() // woken: return only as the wait runs out
	}
	return err
}

// lateWakeServer serves the stream API over a lateWake log.
func lateWakeServer(t *testing.T) (*streamServer, *lateWake) {
	t.Helper()
	db, err := storage.Open(filepath.Join(t.TempDir(), "streams.db"), &storage.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	log := &lateWake{DB: db, waiting: make(chan struct{}, 1)}
	gw, err := gateway.New(gateway.Config{Log: log, LongPollTimeout: time.Second}) // long enough for the append to land within it
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(gw.Handler())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = gw.Shutdown(ctx)
		ts.Close()
	})
	return &streamServer{base: ts.URL, client: ts.Client(), gw: gw}, log
}

// TestStreamHTTP_LongPollWokenAtItsTimeout: a long-poll whose wait is
// woken by an append as its timeout runs out answers with the data, not
// a 204 saying it is up to date at an offset that is no longer the tail.
func TestStreamHTTP_LongPollWokenAtItsTimeout(t *testing.T) {
	t.Parallel()
	s, log := lateWakeServer(t)
	const p = "/v1/stream/late"
	tail := s.do(t, "PUT", p, hdr("Content-Type", "text/plain"), "old").want(t, 201).header.Get("Stream-Next-Offset")

	done := make(chan reply, 1)
	go func() {
		r, _ := s.try("GET", p+"?offset="+tail+"&live=long-poll", nil, "")
		done <- r
	}()
	<-log.waiting
	s.do(t, "POST", p, hdr("Content-Type", "text/plain"), "new").want(t, 204)
	(<-done).want(t, 200).wantBody(t, "new").wantHeader(t, "Stream-Up-To-Date", "true")
}

// TestStreamHTTP_SSEWokenAtItsKeepAlive: an SSE response whose wait is
// woken by an append as its keep-alive interval runs out sends the data,
// not first a keep-alive saying it is up to date at an offset that is no
// longer the tail.
func TestStreamHTTP_SSEWokenAtItsKeepAlive(t *testing.T) {
	t.Parallel()
	s, log := lateWakeServer(t)
	const p = "/v1/stream/latesse"
	s.do(t, "PUT", p, hdr("Content-Type", "text/plain"), "old").want(t, 201)
	body := bufio.NewReader(s.openSSE(t, p+"?offset=now&live=sse").Body)
	readSSE(t, body, func(e []sseEvent) bool { return len(e) == 1 })
	<-log.waiting
	s.do(t, "POST", p, hdr("Content-Type", "text/plain"), "new").want(t, 204)
	evs := readSSE(t, body, func(e []sseEvent) bool { return len(e) == 1 })
	if len(evs) != 1 || evs[0].name != "data" || evs[0].data != "new" {
		t.Fatalf("events after the append: %q, want the data", evs)
	}
}
