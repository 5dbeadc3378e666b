package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuf is a bytes.Buffer safe for the server's goroutines.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestNewHTTPServer_HTTP2GarbageLogsAtDebug: a client that negotiates
// HTTP/2 and sends garbage, which anyone can do once per connection as
// with a failed TLS handshake, is logged at debug level, not warn: at
// warn such connections would flood the log.
func TestNewHTTPServer_HTTP2GarbageLogsAtDebug(t *testing.T) {
	t.Parallel()
	certFile, keyFile, pool := selfSigned(t)
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuf
	hs := newHTTPServer(&config{MaxToken: 8 << 10}, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}),
		slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	hs.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = hs.ServeTLS(ln, "", "") }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
	})
	c, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: pool, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if p := c.ConnectionState().NegotiatedProtocol; p != "h2" {
		t.Fatalf("negotiated %q, want h2", p)
	}
	if _, err := c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n-- not an HTTP/2 preface --")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "preface") {
		if time.Now().After(deadline) {
			t.Fatalf("no log of the bad preface within 10s: %q", logs.String())
		}
		<-time.After(10 * time.Millisecond) // polling the log, with a deadline
	}
	if strings.Contains(logs.String(), "level=WARN") {
		t.Fatalf("a client's bad HTTP/2 preface logged at warn: %q", logs.String())
	}
}
