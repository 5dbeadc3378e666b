package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/syncgate/syncgate/gateway"
)

// serve runs the gateway until ctx ends, then shuts it down: sessions are
// closed with 1001 (flushing what is queued), then the HTTP server stops.
func serve(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := parseConfig(args, getenv, stderr)
	if err != nil {
		return err
	}
	log := newLogger(cfg, stderr)
	cfg.Gateway.Logger = log
	gw, err := gateway.New(cfg.Gateway)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("addr (SYNCGATE_ADDR): %w", err)
	}
	hs := &http.Server{
		Handler:           gw.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	log.Info("syncgate listening", "addr", ln.Addr().String(), "version", versionString(),
		"ws", "ws://"+ln.Addr().String()+"/v1/ws")
	fmt.Fprintf(stdout, "syncgate listening on http://%s (WebSocket: ws://%s/v1/ws)\n", ln.Addr(), ln.Addr())

	select {
	case err := <-served:
		_ = gw.Shutdown(context.Background())
		return fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down", "timeout", cfg.ShutdownTimeout.String())
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	gerr := gw.Shutdown(sctx)
	herr := hs.Shutdown(sctx)
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("http server: %w", err)
	}
	if err := errors.Join(gerr, herr); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	log.Info("stopped")
	return nil
}

func newLogger(cfg *config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
