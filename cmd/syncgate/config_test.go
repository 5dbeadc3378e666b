package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syncgate/syncgate/gateway"
)

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestParseConfig_Defaults(t *testing.T) {
	t.Parallel()
	c, err := parseConfig(nil, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Addr != "127.0.0.1:8080" || c.DataDir != "./data" || c.LogFormat != "text" {
		t.Fatalf("defaults: %+v", c)
	}
	g := c.Gateway
	if g.HelloTimeout != 10*time.Second || g.MaxFrameBytes != 65536 || g.PingInterval != 25*time.Second || g.PongTimeout != 10*time.Second {
		t.Fatalf("gateway defaults: %+v", g)
	}
}

// TestParseConfig_Writers: auto, off and a count map onto Config.Writers
// (zero, negative, the count).
func TestParseConfig_Writers(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]int{"auto": 0, "off": -1, "3": 3, "4096": 4096} {
		c, err := parseConfig([]string{"-writers", v}, env(nil), io.Discard)
		if err != nil {
			t.Fatalf("-writers %s: %v", v, err)
		}
		if c.Gateway.Writers != want {
			t.Errorf("-writers %s: Writers = %d, want %d", v, c.Gateway.Writers, want)
		}
	}
}

// TestParseConfig_MaxIdleProducerBytes: a byte count and off map onto
// Config.MaxIdleProducerBytes (the count, negative); the default is the
// gateway's.
func TestParseConfig_MaxIdleProducerBytes(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]int64{"off": -1, "1048576": 1 << 20, "": 256 << 20} {
		var args []string
		if v != "" {
			args = []string{"-max-idle-producer-bytes", v}
		}
		c, err := parseConfig(args, env(nil), io.Discard)
		if err != nil {
			t.Fatalf("-max-idle-producer-bytes %q: %v", v, err)
		}
		if got := c.Gateway.MaxIdleProducerBytes; got != want {
			t.Errorf("-max-idle-producer-bytes %q: MaxIdleProducerBytes = %d, want %d", v, got, want)
		}
	}
}

// TestParseConfig_BadTokens: -bad-token-rate and -bad-token-burst map
// onto the gateway's bad-token budget: off is negative, auto zero (the
// gateway's defaults, 10 a second and twice that).
func TestParseConfig_BadTokens(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args  []string
		env   map[string]string
		rate  float64
		burst int
	}{
		{nil, nil, 10, 0},
		{[]string{"-bad-token-rate", "2.5", "-bad-token-burst", "4"}, nil, 2.5, 4},
		{nil, map[string]string{"SYNCGATE_BAD_TOKEN_RATE": "off", "SYNCGATE_BAD_TOKEN_BURST": "auto"}, -1, 0},
	} {
		c, err := parseConfig(tc.args, env(tc.env), io.Discard)
		if err != nil {
			t.Fatalf("%v %v: %v", tc.args, tc.env, err)
		}
		if g := c.Gateway; g.BadTokenRate != tc.rate || g.BadTokenBurst != tc.burst {
			t.Errorf("%v %v: BadTokenRate %v, BadTokenBurst %d; want %v, %d", tc.args, tc.env, g.BadTokenRate, g.BadTokenBurst, tc.rate, tc.burst)
		}
	}
}

// TestParseConfig_WriteDelays: -max-write-delay and -overload-write-delay
// map onto the gateway's pacing bounds, 0s turning pacing off.
func TestParseConfig_WriteDelays(t *testing.T) {
	t.Parallel()
	c, err := parseConfig([]string{"-max-write-delay", "0s"}, env(map[string]string{"SYNCGATE_OVERLOAD_WRITE_DELAY": "120ms"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if g := c.Gateway; g.MaxWriteDelay >= 0 || g.OverloadWriteDelay != 120*time.Millisecond {
		t.Fatalf("MaxWriteDelay %v (want negative: off), OverloadWriteDelay %v (want 120ms)", g.MaxWriteDelay, g.OverloadWriteDelay)
	}
}

// TestParseConfig_Precedence: flags beat env, env beats the YAML file,
// the file beats defaults.
func TestParseConfig_Precedence(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "syncgate.yaml")
	yaml := "addr: 127.0.0.1:9000\nhello-timeout: 3s\nmax-frame: 4096\nallowed-origins:\n  - a.example.com\n  - '*.b.example.com'\nlog-format: json\n"
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := parseConfig([]string{"-hello-timeout", "500ms", "-build-id="}, env(map[string]string{
		"SYNCGATE_CONFIG":        file,
		"SYNCGATE_MAX_FRAME":     "2048",
		"SYNCGATE_HELLO_TIMEOUT": "2s", // the flag must beat it, and the file
		"SYNCGATE_BUILD_ID":      "b-env",
	}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Addr != "127.0.0.1:9000" {
		t.Errorf("addr from file: %q", c.Addr)
	}
	if c.Gateway.HelloTimeout != 500*time.Millisecond {
		t.Errorf("hello-timeout: the flag should beat env and file, got %v", c.Gateway.HelloTimeout)
	}
	if c.Gateway.MaxFrameBytes != 2048 {
		t.Errorf("max-frame: env should beat the file, got %d", c.Gateway.MaxFrameBytes)
	}
	if got := strings.Join(c.Gateway.AllowedOrigins, ","); got != "a.example.com,*.b.example.com" {
		t.Errorf("allowed-origins from a YAML list: %q", got)
	}
	if c.LogFormat != "json" {
		t.Errorf("log-format: %q", c.LogFormat)
	}
	if c.Gateway.BuildID != "" {
		t.Errorf("build-id: a flag given empty should beat the environment, got %q", c.Gateway.BuildID)
	}
}

// TestParseConfig_StreamLog: the log's settings, from a YAML file (persist
// as a list) and the environment.
func TestParseConfig_StreamLog(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "syncgate.yaml")
	yaml := "persist:\n  - 'chat:*'\n  - orders:*\nretention-max-age: 24h\nretention-max-records: 1000\n"
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := parseConfig(nil, env(map[string]string{
		"SYNCGATE_CONFIG":              file,
		"SYNCGATE_RETENTION_MAX_BYTES": "1048576",
		"SYNCGATE_LONG_POLL_TIMEOUT":   "500ms",
	}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(c.Gateway.Persist, ","); got != "chat:*,orders:*" {
		t.Errorf("persist from a YAML list: %q", got)
	}
	if r := c.Retention; r.MaxAge != 24*time.Hour || r.MaxRecords != 1000 || r.MaxBytes != 1<<20 {
		t.Errorf("retention: %+v", r)
	}
	if c.Gateway.LongPollTimeout != 500*time.Millisecond {
		t.Errorf("long-poll-timeout: %v", c.Gateway.LongPollTimeout)
	}
}

// TestParseConfig_YAMLTakesValuesAsWritten: a YAML value is the text a
// flag would take, whatever type YAML would give it (1.10 is not 1.1, a
// long digit string is not a float, a date is a string).
func TestParseConfig_YAMLTakesValuesAsWritten(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "syncgate.yaml")
	yaml := "build-id: 1.10\njwt-audience: 0755\nadmin-token: 1234567890123456789012345\n"
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := parseConfig(nil, env(map[string]string{"SYNCGATE_CONFIG": file}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Gateway.BuildID != "1.10" || c.JWTAudience != "0755" || c.Gateway.AdminToken != "1234567890123456789012345" {
		t.Fatalf("build-id %q, jwt-audience %q, admin-token %q: want them as written", c.Gateway.BuildID, c.JWTAudience, c.Gateway.AdminToken)
	}
	date := filepath.Join(dir, "date.yaml")
	if err := os.WriteFile(date, []byte("build-id: 2026-01-05\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if c, err := parseConfig(nil, env(map[string]string{"SYNCGATE_CONFIG": date}), io.Discard); err != nil || c.Gateway.BuildID != "2026-01-05" {
		t.Fatalf("a date as build-id: %q, %v", c.Gateway.BuildID, err)
	}
	for i, text := range []string{
		"addr: 127.0.0.1:1\naddr: 127.0.0.1:2\n",
		"<<: {addr: 127.0.0.1:1, addr: 127.0.0.1:2}\n", // twice in one merged mapping
	} {
		twice := filepath.Join(dir, fmt.Sprintf("twice%d.yaml", i))
		if err := os.WriteFile(twice, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		if c, err := parseConfig(nil, env(map[string]string{"SYNCGATE_CONFIG": twice}), io.Discard); err == nil || !strings.Contains(err.Error(), "addr") {
			var got string
			if c != nil {
				got = c.Addr
			}
			t.Fatalf("%q: %v (addr %q), want an error naming the key given twice", text, err, got)
		}
	}
}

// TestParseConfig_YAMLForms: what YAML offers beyond plain scalars keeps
// working with values read as written: merge keys (explicit keys win),
// aliases in lists, null list elements, and numbers YAML spells
// otherwise for numeric settings.
func TestParseConfig_YAMLForms(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "syncgate.yaml")
	yaml := "build-id: &p b:*\n" + // every key must be a setting: the anchor sits on one
		"max-subscriptions: 0x80\n" +
		"<<: {max-sessions: 1_000, max-subscriptions: 7}\n" +
		"persist: [\"a:*\", ~, *p]\n"
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := parseConfig(nil, env(map[string]string{"SYNCGATE_CONFIG": file}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Gateway.MaxSubscriptions != 128 {
		t.Errorf("max-subscriptions: %d, want 128 (0x80, over the merged 7)", c.Gateway.MaxSubscriptions)
	}
	if c.Gateway.MaxSessions != 1000 {
		t.Errorf("max-sessions from a merge key: %d, want 1000", c.Gateway.MaxSessions)
	}
	if got := strings.Join(c.Gateway.Persist, ","); got != "a:*,b:*" {
		t.Errorf("persist: %q, want a:*,b:* (null dropped, alias followed)", got)
	}
}

// TestParseConfig_YAMLMergeListOrder: with a list of mappings under a
// merge key, a key in an earlier mapping overrides the same key in a
// later one (the YAML merge key spec, and what yaml.v3 itself does when
// it decodes into a map); the mapping's own keys override them all.
func TestParseConfig_YAMLMergeListOrder(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "syncgate.yaml")
	yaml := "<<: [{max-sessions: 1000, max-subscriptions: 7}, {max-sessions: 2000, max-subscriptions: 8, max-frame: 4096}]\n" +
		"max-subscriptions: 9\n"
	if err := os.WriteFile(file, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := parseConfig(nil, env(map[string]string{"SYNCGATE_CONFIG": file}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if g := c.Gateway; g.MaxSessions != 1000 || g.MaxSubscriptions != 9 || g.MaxFrameBytes != 4096 {
		t.Errorf("max-sessions %d, max-subscriptions %d, max-frame %d; want 1000 (the first merged mapping), 9 (own), 4096 (the second)",
			g.MaxSessions, g.MaxSubscriptions, g.MaxFrameBytes)
	}
}

// TestParseConfig_LogLevel: log-level is one of debug, info, warn and
// error, in any case; slog's other forms (an offset such as info+100 or
// debug-4, a bare number) are refused with an error naming the setting
// and the levels it takes.
func TestParseConfig_LogLevel(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]slog.Level{"debug": slog.LevelDebug, "INFO": slog.LevelInfo, "Warn": slog.LevelWarn, "error": slog.LevelError} {
		c, err := parseConfig([]string{"-log-level", v}, env(nil), io.Discard)
		if err != nil || c.LogLevel != want {
			t.Errorf("-log-level %s: %v, want level %v", v, err, want)
		}
	}
	for _, v := range []string{"info+100", "debug-4", "ERROR+4", "0", "warning", "trace"} {
		c, err := parseConfig(nil, env(map[string]string{"SYNCGATE_LOG_LEVEL": v}), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "SYNCGATE_LOG_LEVEL") || !strings.Contains(err.Error(), "debug, info, warn or error") {
			var got slog.Level
			if c != nil {
				got = c.LogLevel
			}
			t.Errorf("SYNCGATE_LOG_LEVEL=%s: err %v (level %v); want an error naming the setting and the levels it takes", v, err, got)
		}
	}
}

func TestParseConfig_Errors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	badKey := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(badKey, []byte("adr: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string // the error must name the setting
	}{
		{"bad duration env", nil, map[string]string{"SYNCGATE_HELLO_TIMEOUT": "ten"}, "SYNCGATE_HELLO_TIMEOUT"},
		{"bad duration flag", []string{"-pong-timeout", "soon"}, nil, "-pong-timeout"},
		{"small frame", nil, map[string]string{"SYNCGATE_MAX_FRAME": "10"}, "SYNCGATE_MAX_FRAME"},
		{"log format", nil, map[string]string{"SYNCGATE_LOG_FORMAT": "xml"}, "SYNCGATE_LOG_FORMAT"},
		{"bad origin pattern", nil, map[string]string{"SYNCGATE_ALLOWED_ORIGINS": "a.example,[x"}, "SYNCGATE_ALLOWED_ORIGINS"},
		{"unknown yaml key", nil, map[string]string{"SYNCGATE_CONFIG": badKey}, `"adr"`},
		{"missing file", nil, map[string]string{"SYNCGATE_CONFIG": filepath.Join(dir, "nope.yaml")}, "config file"},
		{"queue smaller than frame", nil, map[string]string{"SYNCGATE_SEND_QUEUE_BYTES": "1000"}, "SYNCGATE_SEND_QUEUE_BYTES"},
		{"stray argument", []string{"extra"}, nil, `"extra"`},
		{"negative retention", nil, map[string]string{"SYNCGATE_RETENTION_MAX_RECORDS": "-1"}, "SYNCGATE_RETENTION_MAX_RECORDS"},
		{"bad persist pattern", nil, map[string]string{"SYNCGATE_PERSIST": "chat:["}, "SYNCGATE_PERSIST"},
		{"persist pattern with a partial wildcard", []string{"-persist", "room-*"}, nil, "-persist"},
		{"leeway over 5m", []string{"-jwt-leeway", "6m"}, nil, "-jwt-leeway"},
		{"tiny max token", nil, map[string]string{"SYNCGATE_MAX_TOKEN": "10"}, "SYNCGATE_MAX_TOKEN"},
		{"writers zero", nil, map[string]string{"SYNCGATE_WRITERS": "0"}, "SYNCGATE_WRITERS"},
		{"writers word", []string{"-writers", "many"}, nil, "-writers"},
		{"overload delay zero", []string{"-overload-write-delay", "0s"}, nil, "-overload-write-delay"},
		{"write delay over 10s", []string{"-max-write-delay", "11s"}, nil, "-max-write-delay"},
		{"hello timeout zero", []string{"-hello-timeout", "0s"}, nil, "-hello-timeout"},
		{"shutdown timeout zero", []string{"-shutdown-timeout", "0s"}, nil, "-shutdown-timeout"},
		{"drain spread over an hour", []string{"-drain-spread", "61m"}, nil, "-drain-spread"},
		{"drain grace over an hour", nil, map[string]string{"SYNCGATE_DRAIN_GRACE": "2h"}, "SYNCGATE_DRAIN_GRACE"},
		{"build id too long", []string{"-build-id", strings.Repeat("b", 257)}, nil, "-build-id"},
		{"presence ttl zero", nil, map[string]string{"SYNCGATE_PRESENCE_TTL": "0"}, "SYNCGATE_PRESENCE_TTL"},
		{"max frame huge", nil, map[string]string{"SYNCGATE_MAX_FRAME": "9000000000000000000"}, "SYNCGATE_MAX_FRAME"},
		{"max append over 1 GiB", []string{"-max-append", "1073741825"}, nil, "-max-append"},
		{"admin token with a newline", nil, map[string]string{"SYNCGATE_ADMIN_TOKEN": "0123456789abcdef0123\n"}, "SYNCGATE_ADMIN_TOKEN"},
		{"jwt secret with a newline", nil, map[string]string{"SYNCGATE_JWT_SECRET": testJWTSecret + "\n"}, "SYNCGATE_JWT_SECRET"},
		{"blank data dir", []string{"-data-dir", "   "}, nil, "data-dir (SYNCGATE_DATA_DIR)"},
		{"blank data dir in env", nil, map[string]string{"SYNCGATE_DATA_DIR": " \t"}, "data-dir (SYNCGATE_DATA_DIR)"},
		{"addr host of blanks", []string{"-addr", "   :8080", "-insecure"}, nil, "addr (SYNCGATE_ADDR)"},
		{"jwt secret with a leading space", []string{"-jwt-secret", " " + testJWTSecret}, nil, "-jwt-secret"},
		{"bad token rate zero", []string{"-bad-token-rate", "0"}, nil, "-bad-token-rate"},
		{"bad token burst zero", nil, map[string]string{"SYNCGATE_BAD_TOKEN_BURST": "0"}, "SYNCGATE_BAD_TOKEN_BURST"},
		{"overload delay word", nil, map[string]string{"SYNCGATE_OVERLOAD_WRITE_DELAY": "long"}, "SYNCGATE_OVERLOAD_WRITE_DELAY"},
		{"idle producer bytes zero", []string{"-max-idle-producer-bytes", "0"}, nil, "-max-idle-producer-bytes"},
		{"idle producer bytes word", nil, map[string]string{"SYNCGATE_MAX_IDLE_PRODUCER_BYTES": "lots"}, "SYNCGATE_MAX_IDLE_PRODUCER_BYTES"},
		{"writers huge", []string{"-writers", "100000000"}, nil, "-writers"},
		{"writers over the bound", nil, map[string]string{"SYNCGATE_WRITERS": "4097"}, "SYNCGATE_WRITERS"},
		{"pace cpu NaN", []string{"-pace-cpu", "NaN"}, nil, "-pace-cpu"},
		{"pace cpu nan in env", nil, map[string]string{"SYNCGATE_PACE_CPU": "nan"}, "SYNCGATE_PACE_CPU"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := parseConfig(tc.args, env(tc.env), io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %s", err, tc.want)
			}
		})
	}
}

// TestParseConfig_PresenceLeaveGraceFollowsWindow: a presence-window
// above the leave grace's 1s default raises the grace with it (as the
// gateway's own default does), so the node starts; a leave grace set
// shorter than the window is refused with a message naming both
// settings, not left to gateway.New's "PresenceLeaveGrace".
func TestParseConfig_PresenceLeaveGraceFollowsWindow(t *testing.T) {
	t.Parallel()
	c, err := parseConfig([]string{"-presence-window", "2s"}, env(nil), io.Discard)
	if err != nil {
		t.Fatalf("-presence-window 2s alone: %v", err)
	}
	if g := c.Gateway; g.PresenceLeaveGrace != 2*time.Second {
		t.Errorf("PresenceLeaveGrace %v, want 2s (the window, above the 1s default)", g.PresenceLeaveGrace)
	}
	gw, err := gateway.New(c.Gateway)
	if err != nil {
		t.Fatalf("gateway.New refuses what parseConfig accepted: %v", err)
	}
	if err := gw.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		env  map[string]string
	}{
		{[]string{"-presence-window", "2s", "-presence-leave-grace", "1s"}, nil},
		{nil, map[string]string{"SYNCGATE_PRESENCE_WINDOW": "3s", "SYNCGATE_PRESENCE_LEAVE_GRACE": "2s"}},
	} {
		_, err := parseConfig(tc.args, env(tc.env), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "presence-leave-grace") || !strings.Contains(err.Error(), "presence-window") {
			t.Errorf("%v %v: err = %v, want one naming presence-leave-grace and presence-window", tc.args, tc.env, err)
		}
	}
}

// TestParseConfig_YAMLListOnlyForLists: only the list settings (persist,
// allowed-origins) take a YAML list. A list given to any other key is
// refused with an error naming the key, not joined with commas into one
// value: jwt-audience: [api, web] would otherwise require the audience
// "api,web" and refuse every token, data-dir: [a, b] would be a directory
// named "a,b".
func TestParseConfig_YAMLListOnlyForLists(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for i, y := range []string{
		"jwt-audience: [api, web]\n",
		"data-dir:\n  - /var/lib/a\n  - /var/lib/b\n",
		"hello-timeout: [5s]\n",
		"insecure: [true]\n",
	} {
		key, _, _ := strings.Cut(y, ":")
		file := filepath.Join(dir, fmt.Sprintf("c%d.yaml", i))
		if err := os.WriteFile(file, []byte(y), 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := parseConfig(nil, env(map[string]string{"SYNCGATE_CONFIG": file}), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "key "+key+":") || !strings.Contains(err.Error(), "list") {
			var got string
			if c != nil {
				got = fmt.Sprintf(" (jwt-audience %q, data-dir %q, hello-timeout %v)", c.JWTAudience, c.DataDir, c.Gateway.HelloTimeout)
			}
			t.Errorf("%q: err = %v%s; want an error naming %s and saying it takes no list", y, err, got, key)
		}
	}
}

// TestParseConfig_AddrWithoutPort: an addr that is not host:port is
// refused for what it is, naming the setting, whether or not token keys
// are set; not as a non-loopback address ("127.0.0.1 is not a loopback
// address"), which sent the operator after -insecure.
func TestParseConfig_AddrWithoutPort(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		env  map[string]string
	}{
		{[]string{"-addr", "127.0.0.1"}, nil},
		{nil, map[string]string{"SYNCGATE_ADDR": "localhost"}},
		{[]string{"-addr", "[::1]"}, map[string]string{"SYNCGATE_JWT_SECRET": testJWTSecret}},
	} {
		_, err := parseConfig(tc.args, env(tc.env), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "addr (SYNCGATE_ADDR)") || !strings.Contains(err.Error(), "port") ||
			strings.Contains(err.Error(), "loopback") {
			t.Errorf("%v %v: err = %v; want one naming addr and saying the port is missing", tc.args, tc.env, err)
		}
	}
}

// TestParseConfig_YAMLOneDocument: a config file's settings are in one
// YAML document. A second one with settings (after ---) is refused, not
// silently ignored with the settings in it; an empty document (a lone
// ---, as an empty template renders, or a null) holds none, like an
// empty file, and is no error.
func TestParseConfig_YAMLOneDocument(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, text string) string {
		file := filepath.Join(dir, name)
		if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return file
	}
	file := write("two.yaml", "addr: 127.0.0.1:9000\n---\nhello-timeout: 3s\n")
	c, err := parseConfig(nil, env(map[string]string{"SYNCGATE_CONFIG": file}), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "config file") || !strings.Contains(err.Error(), "document") {
		var got time.Duration
		if c != nil {
			got = c.Gateway.HelloTimeout
		}
		t.Errorf("err = %v (hello-timeout %v); want an error: the second document's settings were not applied", err, got)
	}
	for name, text := range map[string]string{
		"dashes.yaml":   "---\n",
		"comment.yaml":  "# nothing set yet\n--- # here\n",
		"null.yaml":     "~\n",
		"trailing.yaml": "---\nhello-timeout: 3s\n---\n",
	} {
		c, err := parseConfig(nil, env(map[string]string{"SYNCGATE_CONFIG": write(name, text)}), io.Discard)
		if err != nil {
			t.Errorf("%q: %v, want no error (an empty document holds no settings)", text, err)
			continue
		}
		if strings.Contains(text, "hello-timeout") && c.Gateway.HelloTimeout != 3*time.Second {
			t.Errorf("%q: hello-timeout %v, want 3s", text, c.Gateway.HelloTimeout)
		}
	}
}
