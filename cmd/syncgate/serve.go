package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	stdlog "log"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/syncgate/syncgate/auth"
	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/storage"
)

// serve runs the gateway until ctx ends (SIGTERM, SIGINT) or an admin
// drain is requested, then stops it in this order: drain (readiness fails
// at once, every session is told its reconnect slot and closed with 1012
// in it; bounded by drain-spread + drain-grace), gateway Shutdown (what is
// left, bounded by shutdown-timeout), HTTP server, and the deferred close
// of the stream log, which flushes it. A drained node returns nil: exit 0,
// as does one whose ctx ends before it listens (it binds nothing).
func serve(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var flagOut flagOutput
	cfg, err := parseConfig(args, getenv, &flagOut)
	flagOut.flush(err, stdout, stderr)
	if err != nil {
		return err
	}
	log := newLogger(cfg, stderr)
	cfg.Gateway.Logger = log
	db, err := openLog(cfg, log)
	if err != nil {
		return err
	}
	defer func() {
		if err := db.Close(); err != nil {
			log.Error("closing the stream log", "err", err)
		}
	}()
	cfg.Gateway.Log = db
	if err := setVerifier(cfg, log); err != nil {
		return err
	}
	var tlsConfig *tls.Config
	if cfg.TLSCert != "" {
		// Loaded before anything starts, so a bad file is a start error
		// naming its settings, not a stop after "listening".
		cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return fmt.Errorf("tls-cert (SYNCGATE_TLS_CERT), tls-key (SYNCGATE_TLS_KEY): %w", err)
		}
		tlsConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	gw, err := gateway.New(cfg.Gateway)
	if err != nil {
		return err
	}
	hs := newHTTPServer(cfg, gw.Handler(), log)
	hs.TLSConfig = tlsConfig
	if ctx.Err() != nil {
		// A signal during start-up: there is nothing to drain, and no
		// one is to be told the node listens, or to reach it.
		_ = gw.Shutdown(context.Background())
		log.Info("signal received during start-up: stopped before binding addr")
		return nil
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		_ = gw.Shutdown(context.Background())
		return fmt.Errorf("addr (SYNCGATE_ADDR): %w", err)
	}
	if cfg.DebugAddr != "" {
		stopDebug, err := serveDebug(cfg.DebugAddr, os.Args, log)
		if err != nil {
			_ = ln.Close()
			_ = gw.Shutdown(context.Background())
			return err
		}
		defer stopDebug()
	}
	served := make(chan error, 1)
	scheme, ws := "http", "ws"
	if cfg.TLSCert != "" {
		scheme, ws = "https", "wss"
		go func() { served <- hs.ServeTLS(ln, "", "") }() // hs.TLSConfig holds the pair
	} else {
		go func() { served <- hs.Serve(ln) }()
	}
	log.Info("syncgate listening", "addr", ln.Addr().String(), "version", versionString(),
		"ws", ws+"://"+ln.Addr().String()+"/v1/ws")
	fmt.Fprintf(stdout, "syncgate listening on %s://%s (WebSocket: %s://%s/v1/ws)\n", scheme, ln.Addr(), ws, ln.Addr())

	select {
	case err := <-served:
		_ = gw.Shutdown(context.Background())
		return fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
		log.Info("signal received: draining (send it again to stop at once)")
	case <-gw.DrainRequested():
		log.Info("admin drain requested: draining")
	}
	spread := max(cfg.Gateway.DrainSpread, 0)
	grace := cfg.Gateway.DrainGrace
	dctx, dcancel := context.WithTimeout(context.Background(), spread+grace)
	defer dcancel()
	start := time.Now()
	if err := gw.Drain(dctx); err != nil {
		// Sessions still open at spread+grace (a dead peer, a stuck TCP
		// write) were cut without a close handshake: expected on a bad
		// network, not a failed stop.
		log.Warn("drain: sessions cut at spread+grace", "err", err)
	}
	log.Info("drained", "took", time.Since(start).Round(time.Millisecond).String())
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if err := gw.Shutdown(sctx); err != nil {
		log.Warn("sessions cut at the shutdown timeout", "err", err)
	}
	// The plain HTTP requests get their own short budget: the sessions'
	// may have used up sctx. gw.Shutdown has ended long-poll and SSE reads.
	hctx, hcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer hcancel()
	if err := hs.Shutdown(hctx); err != nil {
		log.Warn("http requests cut at shutdown", "err", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("http server: %w", err)
	}
	log.Info("stopped")
	return nil
}

// Bounds of the HTTP server's connections (the WebSocket sessions, once
// upgraded, have their own: docs/security.md §6).
const (
	// httpIdleTimeout closes a keep-alive connection that sends no next
	// request, and with it whatever it left unread in its socket.
	httpIdleTimeout = 2 * time.Minute
	// httpHeaderSlack is what request headers may hold besides a token
	// (the Authorization header's): MaxHeaderBytes is it plus max-token.
	httpHeaderSlack = 56 << 10
)

// newHTTPServer returns the node's http.Server for handler. Its request
// headers must arrive within 10 s and be at most max-token plus 56 KiB
// (64 KiB at the default max-token); an idle keep-alive connection is
// closed after 2 minutes. Per-request read and write bounds are the
// handlers' (the stream API's, docs/streams-http.md).
func newHTTPServer(cfg *config, handler http.Handler, log *slog.Logger) *http.Server {
	maxToken := cfg.MaxToken
	if maxToken <= 0 {
		maxToken = 8 << 10 // auth's default
	}
	return &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       httpIdleTimeout,
		MaxHeaderBytes:    maxToken + httpHeaderSlack,
		ErrorLog:          stdlog.New(httpErrorLog{log}, "", 0),
	}
}

// httpErrorLog writes net/http's error log to slog: at warn level, but
// what a client causes at debug (clientLogPrefixes). Anyone can cause
// one per connection (connect, send garbage, close), so at warn they
// would flood the log.
type httpErrorLog struct{ log *slog.Logger }

// clientLogPrefixes begin net/http's messages about a client's misdeeds:
// a failed TLS handshake, and with TLS an HTTP/2 connection that does
// not speak HTTP/2 (a bad preface, a protocol error, no SETTINGS).
var clientLogPrefixes = []string{
	"http: TLS handshake error",
	"http2: server: error reading preface",
	"http2: server connection error from",
	"timeout waiting for SETTINGS frames",
}

func (h httpErrorLog) Write(p []byte) (int, error) {
	msg := strings.TrimSuffix(string(p), "\n")
	level := slog.LevelWarn
	for _, prefix := range clientLogPrefixes {
		if strings.HasPrefix(msg, prefix) {
			level = slog.LevelDebug
		}
	}
	h.log.Log(context.Background(), level, msg)
	return len(p), nil
}

// setVerifier builds the token verifier from the jwt settings, reading the
// keys file, or says loudly that the node runs anonymous. The secret is
// never logged.
func setVerifier(cfg *config, log *slog.Logger) error {
	if cfg.anonymous() {
		msg := "NO TOKEN KEYS: running anonymous (dev mode): every client may read and write every topic; set SYNCGATE_JWT_SECRET or SYNCGATE_JWT_KEYS in production"
		if cfg.Insecure {
			msg += "; -insecure: listening beyond loopback and answering any Host"
		}
		log.Warn(msg, "addr", cfg.Addr)
		return nil
	}
	ac := auth.Config{Secret: []byte(cfg.JWTSecret), Audience: cfg.JWTAudience, Issuer: cfg.JWTIssuer,
		Leeway: cfg.JWTLeeway, MaxTokenBytes: cfg.MaxToken}
	if cfg.JWTKeys != "" {
		b, err := os.ReadFile(cfg.JWTKeys)
		if err != nil {
			return fmt.Errorf("jwt-keys (SYNCGATE_JWT_KEYS): %w", err)
		}
		if len(b) == 0 {
			// auth.Config takes empty Keys as none: beside a secret the
			// node would start with HS256 only, alone it would say no
			// keys are configured.
			return fmt.Errorf("jwt-keys (SYNCGATE_JWT_KEYS) %s: the file is empty", cfg.JWTKeys)
		}
		ac.Keys = b
	}
	v, err := auth.New(ac)
	if err != nil {
		return fmt.Errorf("jwt settings: %w", err)
	}
	var keys []string
	for _, k := range v.Keys() {
		keys = append(keys, k.Alg+" kid="+k.KID)
	}
	log.Info("tokens required", "keys", keys, "audience", cfg.JWTAudience, "issuer", cfg.JWTIssuer)
	cfg.Gateway.Verifier = v
	return nil
}

// openLog opens the stream log in the data directory. A failed commit or
// fsync ends the process with status 3: the page cache may have lost what
// was written, so nothing more may be acknowledged (docs/storage.md).
func openLog(cfg *config, log *slog.Logger) (*storage.DB, error) {
	if err := os.MkdirAll(cfg.DataDir, 0o750); err != nil {
		return nil, fmt.Errorf("data-dir (SYNCGATE_DATA_DIR): %w", err)
	}
	file := filepath.Join(cfg.DataDir, "streams.db")
	db, err := storage.Open(file, &storage.Options{
		Logger:         log.With("component", "storage"),
		MaxAppendBytes: cfg.MaxAppend,
		Retention:      cfg.Retention,
		OnFatal: func(err error) {
			log.Error("stream log write failed; exiting so nothing uncertain is acknowledged", "file", file, "err", err)
			os.Exit(3)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("stream log %s: %w", file, err)
	}
	return db, nil
}

// serveDebug serves net/http/pprof on its own listener, apart from the
// public handler, and returns a function that stops it. Its
// /debug/pprof/cmdline shows args (the process's command line) with the
// values of the secret settings hidden (redactArgs).
func serveDebug(addr string, args []string, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("debug-addr (SYNCGATE_DEBUG_ADDR): %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	cmdline := strings.Join(redactArgs(args), "\x00")
	mux.HandleFunc("/debug/pprof/cmdline", func(w http.ResponseWriter, _ *http.Request) {
		// As pprof.Cmdline, which shows os.Args as they are.
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, cmdline)
	})
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = hs.Serve(ln) }()
	log.Info("debug (pprof) listening", "addr", ln.Addr().String())
	return func() { _ = hs.Close(); <-done }, nil
}

// secretSettings are the settings whose values never leave the process:
// redactArgs hides them on the command line.
var secretSettings = map[string]bool{"jwt-secret": true, "admin-token": true}

// redactArgs returns a copy of a command line with the value of every
// secret setting given as a flag (-name v, -name=v, also with two dashes)
// replaced by "[redacted]".
func redactArgs(args []string) []string {
	out := slices.Clone(args)
	for i := 1; i < len(out); i++ {
		a := out[i]
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !secretSettings[name] {
			continue
		}
		if hasValue {
			out[i] = a[:strings.IndexByte(a, '=')+1] + "[redacted]"
		} else if i+1 < len(out) {
			i++
			out[i] = "[redacted]"
		}
	}
	return out
}

func newLogger(cfg *config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
