//go:build unix

package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/syncgate/syncgate/frames"
)

// TestMain_SecondSignalStopsAtOnce runs the command in a child process
// (this test binary, as a bench child: main_test.go's init): the first
// SIGTERM starts an hour-long drain, the second ends the process at once
// by the signal's default action.
func TestMain_SecondSignalStopsAtOnce(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "serve", "-addr", "127.0.0.1:0", "-data-dir", t.TempDir(),
		"-drain-spread", "1h", "-drain-grace", "1h", "-log-level", "info")
	cmd.Env = append(os.Environ(), benchChildEnv+"=1")
	out := &lineWriter{lines: make(chan string, 64)}
	logs := &lineWriter{lines: make(chan string, 64)}
	cmd.Stdout, cmd.Stderr = out, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var waitErr error
	exited := make(chan struct{})
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	early := make(chan error, 1)
	go func() {
		<-exited
		early <- waitErr
	}()
	addr := awaitListening(t, out, early)
	s := dialSession(t, addr)

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, msg, err := s.c.Read(ctx)
	if err != nil {
		t.Fatalf("reading the drain's reconnect frame: %v", err)
	}
	f, err := frames.Decode(msg)
	rec, ok := f.(*frames.Reconnect)
	if err != nil || !ok {
		t.Fatalf("first frame of the drain: %s (%v)", msg, err)
	}
	if rec.AfterMs < 20_000 {
		t.Skipf("the session's slot (afterMs %d) could end the drain before the second signal", rec.AfterMs)
	}
	for seen := false; !seen; { // the handler has seen the first signal
		select {
		case line := <-logs.lines:
			seen = strings.Contains(line, "signal received")
		case <-ctx.Done():
			t.Fatal("no \"signal received\" log line")
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	t.Logf("second SIGTERM sent; the session's slot was afterMs %d", rec.AfterMs)
	select {
	case <-exited:
		err := waitErr
		exitErr, ok := errors.AsType[*exec.ExitError](err)
		if !ok {
			t.Fatalf("child exited with %v, want killed by SIGTERM", err)
		}
		if ws, ok := exitErr.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
			t.Fatalf("child: %v, want killed by SIGTERM", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the second SIGTERM did not end the draining process")
	}
}
