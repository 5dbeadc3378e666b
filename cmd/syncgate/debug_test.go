package main

import (
	"bytes"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"testing"
)

// TestServeDebug_CmdlineRedactsSecrets: /debug/pprof/cmdline does not
// show the values of -jwt-secret and -admin-token (pprof.Cmdline showed
// os.Args as they are), in any spelling the flag package takes, and
// shows the rest of the command line.
func TestServeDebug_CmdlineRedactsSecrets(t *testing.T) {
	t.Parallel()
	const secret, token = testJWTSecret, "admin-token-0123456789"
	args := []string{"syncgate", "serve", "-jwt-secret", secret, "--admin-token=" + token, "-addr", "127.0.0.1:0",
		"--jwt-secret", secret + "2", "-admin-token=" + token + "2"}
	var logs bytes.Buffer
	stop, err := serveDebug("127.0.0.1:0", args, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	addr := regexp.MustCompile(`addr=(\S+)`).FindStringSubmatch(logs.String())[1]
	resp, err := http.Get("http://" + addr + "/debug/pprof/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	got := string(b)
	if strings.Contains(got, secret) || strings.Contains(got, token) {
		t.Fatalf("/debug/pprof/cmdline shows a secret: %q", got)
	}
	want := strings.Join([]string{"syncgate", "serve", "-jwt-secret", "[redacted]", "--admin-token=[redacted]", "-addr", "127.0.0.1:0",
		"--jwt-secret", "[redacted]", "-admin-token=[redacted]"}, "\x00")
	if got != want {
		t.Fatalf("/debug/pprof/cmdline = %q, want %q", got, want)
	}
}
