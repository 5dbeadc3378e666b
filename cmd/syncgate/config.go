package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"go.yaml.in/yaml/v3"

	"github.com/syncgate/syncgate/auth"
	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/storage"
)

// config is everything `syncgate serve` is told.
type config struct {
	Addr            string
	DataDir         string
	MaxAppend       int64 // also bounds the log's appends
	Retention       storage.Retention
	LogFormat       string
	LogLevel        slog.Level
	DebugAddr       string
	ShutdownTimeout time.Duration
	Gateway         gateway.Config

	// Security (serve.go builds the verifier from these).
	JWTSecret   secret // HS256 shared secret; never logged
	JWTKeys     string // path of the PEM or JWKS public key file
	JWTAudience string
	JWTIssuer   string
	JWTLeeway   time.Duration // auth.Config.Leeway: negative means none
	MaxToken    int
	Insecure    bool // anonymous mode on a non-loopback address
	TLSCert     string
	TLSKey      string

	// leaveGraceSet: presence-leave-grace was given (flag, env or file),
	// not defaulted; unset, it follows a presence-window above it.
	leaveGraceSet bool
}

// secret is a string that never prints: every fmt verb and slog show
// "[redacted]", so a config dump cannot leak it.
type secret string

func (secret) String() string               { return "[redacted]" }
func (secret) GoString() string             { return "[redacted]" }
func (secret) LogValue() slog.Value         { return slog.StringValue("[redacted]") }
func (secret) Format(f fmt.State, _ rune)   { _, _ = io.WriteString(f, "[redacted]") }
func (secret) MarshalText() ([]byte, error) { return []byte("[redacted]"), nil }

// anonymous reports whether no token key is configured (dev mode).
func (c *config) anonymous() bool { return c.JWTSecret == "" && c.JWTKeys == "" }

// boolSettings are the settings whose flag may be given without a value.
var boolSettings = map[string]bool{"insecure": true}

// listSettings are the settings that take a comma-separated list, and so
// in the YAML file a list; any other takes one value.
var listSettings = map[string]bool{"persist": true, "allowed-origins": true}

// setting is one knob: a flag, its environment variable, and its key in the
// YAML config file (the flag's name).
type setting struct {
	name  string // flag name and YAML key
	env   string
	def   string
	usage string
	set   func(c *config, v string) error
}

func durationSetting(p func(*config) *time.Duration) func(*config, string) error {
	return func(c *config, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return fmt.Errorf("want a duration like 500ms or 10s, got %q", v)
		}
		*p(c) = d
		return nil
	}
}

// positiveDurationSetting is durationSetting for settings where 0 means
// nothing sensible (the gateway would quietly take its default instead).
func positiveDurationSetting(p func(*config) *time.Duration) func(*config, string) error {
	return func(c *config, v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return fmt.Errorf("want a duration above 0 like 500ms or 10s, got %q", v)
		}
		*p(c) = d
		return nil
	}
}

// maxFrameLimit bounds max-frame: far above any sane message, and low
// enough that sizes derived from it (twice it, for the send queue) cannot
// overflow.
const maxFrameLimit = 1 << 30

// maxWriters bounds writers: the gateway starts that many goroutines at
// once (and may run twice as many), so a stray digit must not start
// millions of them. Far more than the cores of any machine it runs on,
// which is where more writers stop helping.
const maxWriters = 4096

// int64Setting parses a non-negative integer (0 meaning "no bound").
func int64Setting(p func(*config) *int64) func(*config, string) error {
	return func(c *config, v string) error {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return fmt.Errorf("want a non-negative integer, got %q", v)
		}
		*p(c) = n
		return nil
	}
}

func intSetting(p func(*config) *int) func(*config, string) error {
	return func(c *config, v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return fmt.Errorf("want a positive integer, got %q", v)
		}
		*p(c) = n
		return nil
	}
}

// rateSetting parses a rate per second into *p: a positive number (at
// most 1e9), or off, stored as -1.
func rateSetting(p func(*config) *float64) func(*config, string) error {
	return func(c *config, v string) error {
		if v == "off" {
			*p(c) = -1
			return nil
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || !(f > 0) || f > 1e9 {
			return fmt.Errorf("want a positive number or off, got %q", v)
		}
		*p(c) = f
		return nil
	}
}

// wordIntSetting parses a positive integer into *p, or word (off, auto),
// stored as the value its gateway field gives that meaning.
func wordIntSetting(word string, stored int, p func(*config) *int) func(*config, string) error {
	return func(c *config, v string) error {
		if v == word {
			*p(c) = stored
			return nil
		}
		return intSetting(p)(c, v)
	}
}

var settings = []setting{
	{"addr", "SYNCGATE_ADDR", "127.0.0.1:8080", "listen address (host:port)",
		func(c *config, v string) error { c.Addr = v; return nil }},
	{"data-dir", "SYNCGATE_DATA_DIR", "./data", "directory for durable data: the stream log is <data-dir>/streams.db",
		func(c *config, v string) error { c.DataDir = v; return nil }},
	{"persist", "SYNCGATE_PERSIST", "", "comma-separated topic patterns whose topics are persisted in the stream log, in the syntax of token grants: chat:* (one segment), chat:** (any depth); e.g. chat:*,orders:** (YAML: a list)",
		func(c *config, v string) error {
			c.Gateway.Persist = nil
			for _, p := range strings.Split(v, ",") {
				if p = strings.TrimSpace(p); p != "" {
					if _, err := auth.ParsePattern(p); err != nil {
						return fmt.Errorf("bad pattern %q: %w (the syntax of token grants: docs/security.md)", p, err)
					}
					c.Gateway.Persist = append(c.Gateway.Persist, p)
				}
			}
			return nil
		}},
	{"long-poll-timeout", "SYNCGATE_LONG_POLL_TIMEOUT", "30s", "how long a Durable Streams long-poll read waits for data before answering 204",
		positiveDurationSetting(func(c *config) *time.Duration { return &c.Gateway.LongPollTimeout })},
	{"max-append", "SYNCGATE_MAX_APPEND", "8388608", "largest Durable Streams append body in bytes (HTTP 413 above it; 1024 to 1 GiB)",
		func(c *config, v string) error {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 1024 || n > storage.MaxAppendLimit {
				return fmt.Errorf("want an integer from 1024 to %d (1 GiB), got %q", storage.MaxAppendLimit, v)
			}
			c.Gateway.MaxAppendBytes = n
			c.MaxAppend = n
			return nil
		}},
	{"retention-max-age", "SYNCGATE_RETENTION_MAX_AGE", "0s", "default retention of every stream and persisted topic: records older than this are pruned (0s: keep)",
		durationSetting(func(c *config) *time.Duration { return &c.Retention.MaxAge })},
	{"retention-max-bytes", "SYNCGATE_RETENTION_MAX_BYTES", "0", "default retention: oldest records are pruned above this many bytes per stream (0: no bound)",
		int64Setting(func(c *config) *int64 { return &c.Retention.MaxBytes })},
	{"retention-max-records", "SYNCGATE_RETENTION_MAX_RECORDS", "0", "default retention: oldest records are pruned above this many records per stream (0: no bound)",
		int64Setting(func(c *config) *int64 { return &c.Retention.MaxRecords })},
	{"build-id", "SYNCGATE_BUILD_ID", "", "current app build id, sent in hello; a client whose hello names another build gets update-available (change it at runtime with POST /v1/admin/build)",
		func(c *config, v string) error {
			if len(v) > 256 {
				// A client hello's buildId is refused beyond it, so no
				// client could ever be on this build.
				return fmt.Errorf("want at most 256 bytes, got %d", len(v))
			}
			c.Gateway.BuildID = v
			return nil
		}},
	{"hello-timeout", "SYNCGATE_HELLO_TIMEOUT", "10s", "time a new connection has to send hello (else close 1008)",
		positiveDurationSetting(func(c *config) *time.Duration { return &c.Gateway.HelloTimeout })},
	{"max-frame", "SYNCGATE_MAX_FRAME", "65536", "largest client message in bytes (else close 1009)",
		func(c *config, v string) error {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 256 || n > maxFrameLimit {
				return fmt.Errorf("want an integer from 256 to %d (1 GiB), got %q", maxFrameLimit, v)
			}
			c.Gateway.MaxFrameBytes = n
			return nil
		}},
	{"max-batch", "SYNCGATE_MAX_BATCH", "65536", "largest batched server message in bytes",
		intSetting(func(c *config) *int { return &c.Gateway.MaxBatchBytes })},
	{"send-queue-messages", "SYNCGATE_SEND_QUEUE_MESSAGES", "65536", "frames queued per session before it is closed as a slow consumer (4001)",
		intSetting(func(c *config) *int { return &c.Gateway.SendQueueMessages })},
	{"send-queue-bytes", "SYNCGATE_SEND_QUEUE_BYTES", "4194304", "bytes queued per session before it is closed as a slow consumer (4001)",
		intSetting(func(c *config) *int { return &c.Gateway.SendQueueBytes })},
	{"write-timeout", "SYNCGATE_WRITE_TIMEOUT", "10s", "deadline for every network write",
		positiveDurationSetting(func(c *config) *time.Duration { return &c.Gateway.WriteTimeout })},
	{"ping-interval", "SYNCGATE_PING_INTERVAL", "25s", "how often an otherwise silent session is pinged",
		positiveDurationSetting(func(c *config) *time.Duration { return &c.Gateway.PingInterval })},
	{"pong-timeout", "SYNCGATE_PONG_TIMEOUT", "10s", "close a session whose pong is this late (4002)",
		positiveDurationSetting(func(c *config) *time.Duration { return &c.Gateway.PongTimeout })},
	{"write-budget", "SYNCGATE_WRITE_BUDGET", "auto", "WebSocket messages per second the node aims to stay under by batching busy sessions' frames (auto: 50000 per core)",
		func(c *config, v string) error {
			if v == "auto" {
				c.Gateway.WriteBudget = 0
				return nil
			}
			return intSetting(func(c *config) *int { return &c.Gateway.WriteBudget })(c, v)
		}},
	{"pace-cpu", "SYNCGATE_PACE_CPU", "0.4", "share of the cores (0-1) above which busy sessions' frames are batched whatever the write rate",
		func(c *config, v string) error {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || !(f > 0) || f > 1 { // !(f > 0): NaN too
				return fmt.Errorf("want a number in (0, 1], got %q", v)
			}
			c.Gateway.PaceCPU = f
			return nil
		}},
	{"max-write-delay", "SYNCGATE_MAX_WRITE_DELAY", "20ms", "longest a busy session's frames wait to share a message when over the write budget or the CPU share (0s turns pacing off; at most 10s)",
		func(c *config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 || d > 10*time.Second {
				return fmt.Errorf("want a duration like 20ms, at most 10s, got %q", v)
			}
			if d == 0 {
				d = -1 // gateway.Config: negative means off
			}
			c.Gateway.MaxWriteDelay = d
			return nil
		}},
	{"overload-write-delay", "SYNCGATE_OVERLOAD_WRITE_DELAY", "75ms", "longest a busy session's frames wait to share a message while the node is overloaded (never less than max-write-delay; at most 10s)",
		func(c *config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 || d > 10*time.Second {
				return fmt.Errorf("want a duration like 75ms, over 0 and at most 10s, got %q", v)
			}
			c.Gateway.OverloadWriteDelay = d
			return nil
		}},
	{"writers", "SYNCGATE_WRITERS", "auto", "goroutines that write for sessions on TCP and Unix-socket connections, taking busy sessions in turn (auto: one per core; off: a goroutine per busy session, as TLS connections, and all on systems other than Linux, macOS and OpenBSD, always have; at most 4096)",
		func(c *config, v string) error {
			switch v {
			case "auto":
				c.Gateway.Writers = 0
				return nil
			case "off":
				c.Gateway.Writers = -1
				return nil
			}
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 || n > maxWriters {
				return fmt.Errorf("want auto, off or an integer from 1 to %d, got %q", maxWriters, v)
			}
			c.Gateway.Writers = n
			return nil
		}},
	{"max-subscriptions", "SYNCGATE_MAX_SUBSCRIPTIONS", "128", "active subscriptions per session",
		intSetting(func(c *config) *int { return &c.Gateway.MaxSubscriptions })},
	{"presence-ttl", "SYNCGATE_PRESENCE_TTL", "30s", "how long a presence member stays after its socket or node vanished; live sessions refresh theirs every third of it",
		positiveDurationSetting(func(c *config) *time.Duration { return &c.Gateway.PresenceTTL })},
	{"presence-window", "SYNCGATE_PRESENCE_WINDOW", "100ms", "presence coalescing window: a topic's joins, updates and leaves reach subscribers at most once per window, batched",
		positiveDurationSetting(func(c *config) *time.Duration { return &c.Gateway.PresenceWindow })},
	{"presence-leave-grace", "SYNCGATE_PRESENCE_LEAVE_GRACE", "1s", "how long a member must stay gone before subscribers see it leave; a rejoin inside it (reload, reconnect) is no flap. At least presence-window (unset, it follows a presence-window above 1s)",
		func(c *config, v string) error {
			c.leaveGraceSet = true
			return positiveDurationSetting(func(c *config) *time.Duration { return &c.Gateway.PresenceLeaveGrace })(c, v)
		}},
	{"allowed-origins", "SYNCGATE_ALLOWED_ORIGINS", "", "comma-separated Origin patterns allowed besides the request's own host: host[:port] (app.example.com, localhost:5173), *.domain (any subdomain, never domain itself), optionally https:// or http:// in front to pin the scheme; no other wildcard, never null",
		func(c *config, v string) error {
			c.Gateway.AllowedOrigins = nil
			for _, o := range strings.Split(v, ",") {
				if o = strings.TrimSpace(o); o != "" {
					c.Gateway.AllowedOrigins = append(c.Gateway.AllowedOrigins, o)
				}
			}
			_, err := auth.NewOriginPolicy(c.Gateway.AllowedOrigins)
			return err
		}},
	{"jwt-secret", "SYNCGATE_JWT_SECRET", "", "HS256 shared secret (at least 32 bytes, no leading or trailing whitespace) that verifies hello tokens; never logged. Prefer the environment to the flag",
		func(c *config, v string) error {
			if v != "" && len(v) < 32 {
				return fmt.Errorf("want at least 32 bytes (e.g. openssl rand -hex 32), got %d", len(v))
			}
			if strings.TrimSpace(v) != v {
				// The issuer signs with the secret it was given; one read
				// with a newline would verify none of its tokens.
				return fmt.Errorf("the secret starts or ends with whitespace (a newline from a file?): remove it")
			}
			c.JWTSecret = secret(v)
			return nil
		}},
	{"jwt-keys", "SYNCGATE_JWT_KEYS", "", "path of a file of RS256/ES256 public keys (PEM blocks or a JWKS) that verify hello tokens",
		func(c *config, v string) error { c.JWTKeys = v; return nil }},
	{"jwt-audience", "SYNCGATE_JWT_AUDIENCE", "", "if set, a token's aud must contain it",
		func(c *config, v string) error { c.JWTAudience = v; return nil }},
	{"jwt-issuer", "SYNCGATE_JWT_ISSUER", "", "if set, a token's iss must equal it",
		func(c *config, v string) error { c.JWTIssuer = v; return nil }},
	{"jwt-leeway", "SYNCGATE_JWT_LEEWAY", "10s", "clock skew allowed when checking a token's exp, nbf and iat (0s: none; at most 5m)",
		func(c *config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 || d > 5*time.Minute {
				return fmt.Errorf("want a duration from 0s to 5m, got %q", v)
			}
			c.JWTLeeway = d
			if d == 0 {
				c.JWTLeeway = -1 // auth.Config: zero is its default, negative none
			}
			return nil
		}},
	{"max-token", "SYNCGATE_MAX_TOKEN", "8192", "largest hello token in bytes; a longer one is refused (X_BAD_TOKEN) before it is parsed (a hello over max-frame is closed 1009 first)",
		func(c *config, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 256 || n > 1<<20 {
				return fmt.Errorf("want a number of bytes from 256 to 1048576, got %q", v)
			}
			c.MaxToken = n
			return nil
		}},
	{"insecure", "SYNCGATE_INSECURE", "false", "without jwt-secret or jwt-keys (anonymous dev mode), listen on a non-loopback address and answer any Host anyway",
		func(c *config, v string) error {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return fmt.Errorf("want true or false, got %q", v)
			}
			c.Insecure, c.Gateway.Insecure = b, b
			return nil
		}},
	{"token-grace", "SYNCGATE_TOKEN_GRACE", "30s", "how long a session whose token expired may send a refreshing hello before it is closed (1008)",
		func(c *config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return fmt.Errorf("want a positive duration like 30s, got %q", v)
			}
			c.Gateway.TokenGrace = d
			return nil
		}},
	{"frame-rate", "SYNCGATE_FRAME_RATE", "1000", "frames per second a session may send (token bucket); over it frames are dropped with X_RATE_LIMITED; with token keys also HTTP stream writes per token sub (429) (off: no limit)",
		rateSetting(func(c *config) *float64 { return &c.Gateway.FrameRate })},
	{"frame-burst", "SYNCGATE_FRAME_BURST", "auto", "size of a session's frame token bucket, and with token keys of each token sub's HTTP stream write bucket (auto: twice frame-rate)",
		wordIntSetting("auto", 0, func(c *config) *int { return &c.Gateway.FrameBurst })},
	{"rate-limit-close", "SYNCGATE_RATE_LIMIT_CLOSE", "10s", "close a session (1008) that stays over its frame rate this long without a second's pause (off: never)",
		func(c *config, v string) error {
			if v == "off" {
				c.Gateway.RateLimitClose = -1
				return nil
			}
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return fmt.Errorf("want a positive duration like 10s, or off, got %q", v)
			}
			c.Gateway.RateLimitClose = d
			return nil
		}},
	{"max-sessions-per-ip", "SYNCGATE_MAX_SESSIONS_PER_IP", "off", "sessions one client IP may hold, live stream reads included; over it a client is told to come back (1013; a live read: 429). Behind a proxy every client shares its address: leave off there",
		wordIntSetting("off", 0, func(c *config) *int { return &c.Gateway.MaxSessionsPerIP })},
	{"max-sessions-per-actor", "SYNCGATE_MAX_SESSIONS_PER_ACTOR", "100", "sessions one actor (token sub) may hold, live stream reads included; over it the hello gets X_TOO_MANY_SESSIONS and close 1008, a live read 429 (off: no cap)",
		wordIntSetting("off", -1, func(c *config) *int { return &c.Gateway.MaxSessionsPerActor })},
	{"bad-token-rate", "SYNCGATE_BAD_TOKEN_RATE", "10", "refused tokens per second the HTTP stream API checks from one client address (an IPv6 one by its /64); past its bucket, that address's requests with a token get 429 unchecked, good tokens too unless already verified, until it refills. Behind a proxy its clients share one budget (off: no limit)",
		rateSetting(func(c *config) *float64 { return &c.Gateway.BadTokenRate })},
	{"bad-token-burst", "SYNCGATE_BAD_TOKEN_BURST", "auto", "size of each client address's bucket of refused tokens on the HTTP stream API (auto: twice bad-token-rate)",
		wordIntSetting("auto", 0, func(c *config) *int { return &c.Gateway.BadTokenBurst })},
	{"tls-cert", "SYNCGATE_TLS_CERT", "", "PEM certificate (chain) file: with tls-key, serve https and wss directly",
		func(c *config, v string) error { c.TLSCert = v; return nil }},
	{"tls-key", "SYNCGATE_TLS_KEY", "", "PEM private key file of tls-cert",
		func(c *config, v string) error { c.TLSKey = v; return nil }},
	{"debug-addr", "SYNCGATE_DEBUG_ADDR", "", "if set, serve Go profiling (/debug/pprof/) on this separate address, e.g. 127.0.0.1:6060",
		func(c *config, v string) error { c.DebugAddr = v; return nil }},
	{"drain-spread", "SYNCGATE_DRAIN_SPREAD", "30s", "on SIGTERM/SIGINT or an admin drain, the window over which sessions are told to reconnect, each in its own slot (0s: all at once; at most 1h)",
		func(c *config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				return fmt.Errorf("want a duration like 30s, got %q", v)
			}
			if d > time.Hour {
				return fmt.Errorf("at most 1h (clients wait at most an hour), got %q", v)
			}
			if d == 0 {
				d = -1 // gateway.Config: negative means no plan
			}
			c.Gateway.DrainSpread = d
			return nil
		}},
	{"drain-grace", "SYNCGATE_DRAIN_GRACE", "5s", "time after the drain spread for the last sessions to close before they are cut (at most 1h)",
		func(c *config, v string) error {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return fmt.Errorf("want a positive duration like 5s, got %q", v)
			}
			if d > time.Hour {
				return fmt.Errorf("at most 1h, got %q", v)
			}
			c.Gateway.DrainGrace = d
			return nil
		}},
	{"shutdown-timeout", "SYNCGATE_SHUTDOWN_TIMEOUT", "5s", "bound for the last stop step after the drain: closing any session left (1001); in-flight HTTP requests then get 5s of their own",
		positiveDurationSetting(func(c *config) *time.Duration { return &c.ShutdownTimeout })},
	{"accept-rate", "SYNCGATE_ACCEPT_RATE", "1000", "new sessions admitted per second (token bucket); over it clients are told when to come back (off: no limit)",
		rateSetting(func(c *config) *float64 { return &c.Gateway.AcceptRate })},
	{"accept-burst", "SYNCGATE_ACCEPT_BURST", "auto", "size of the accept token bucket: new sessions admitted at once above the rate (auto: one second's worth of accept-rate)",
		wordIntSetting("auto", 0, func(c *config) *int { return &c.Gateway.AcceptBurst })},
	{"max-sessions", "SYNCGATE_MAX_SESSIONS", "100000", "connected sessions and live stream reads the node holds at most; over it clients are told when to come back (off: no cap)",
		wordIntSetting("off", -1, func(c *config) *int { return &c.Gateway.MaxSessions })},
	{"max-idle-producer-bytes", "SYNCGATE_MAX_IDLE_PRODUCER_BYTES", "268435456", "estimated bytes the node keeps of the producer records (recent mutate outcomes, for retries) of clients with no session; over it the longest idle are forgotten first (off: no cap)",
		func(c *config, v string) error {
			if v == "off" {
				c.Gateway.MaxIdleProducerBytes = -1
				return nil
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n <= 0 {
				return fmt.Errorf("want a positive number of bytes or off, got %q", v)
			}
			c.Gateway.MaxIdleProducerBytes = n
			return nil
		}},
	{"admin-token", "SYNCGATE_ADMIN_TOKEN", "", "bearer token (at least 16 bytes) enabling the admin API, POST /v1/admin/drain and /v1/admin/build; empty: admin API off. Prefer the environment to the flag",
		func(c *config, v string) error {
			if v != "" && len(v) < 16 {
				return fmt.Errorf("want at least 16 bytes (e.g. openssl rand -hex 32), got %d", len(v))
			}
			if strings.TrimSpace(v) != v {
				// A client's token is trimmed, so this one could never match.
				return fmt.Errorf("the token starts or ends with whitespace (a newline from a file?): remove it")
			}
			c.Gateway.AdminToken = v
			return nil
		}},
	{"log-format", "SYNCGATE_LOG_FORMAT", "text", "log format: text or json",
		func(c *config, v string) error {
			if v != "text" && v != "json" {
				return fmt.Errorf("want text or json, got %q", v)
			}
			c.LogFormat = v
			return nil
		}},
	{"log-level", "SYNCGATE_LOG_LEVEL", "info", "log level: debug, info, warn or error (any case)",
		func(c *config, v string) error {
			// Not slog.Level's UnmarshalText, which takes offsets
			// (info+100, debug-4) that only a typo would give here.
			switch strings.ToLower(v) {
			case "debug":
				c.LogLevel = slog.LevelDebug
			case "info":
				c.LogLevel = slog.LevelInfo
			case "warn":
				c.LogLevel = slog.LevelWarn
			case "error":
				c.LogLevel = slog.LevelError
			default:
				return fmt.Errorf("want debug, info, warn or error, got %q", v)
			}
			return nil
		}},
}

// serveUsage heads the usage of `syncgate serve`, above its flags.
const serveUsage = `usage: syncgate [serve] [flags]   run the gateway
       syncgate version           print the version
       syncgate bench <command>   load-test a running gateway (syncgate bench -h)

Every flag but -config is also an environment variable and a key of the
-config YAML file; a flag beats the environment, which beats the file.

Flags:
`

// parseConfig builds the config from, in rising precedence: defaults, the
// YAML file named by -config / SYNCGATE_CONFIG, environment, flags. The
// flag package writes its usage and complaints to flagOut; the error is
// flag.ErrHelp if the usage was asked for (-h, -help, --help), errUsage
// for a bad flag.
func parseConfig(args []string, getenv func(string) string, flagOut io.Writer) (*config, error) {
	c := &config{}
	for _, s := range settings {
		if err := s.set(c, s.def); err != nil {
			panic("bad default for " + s.name + ": " + err.Error())
		}
	}
	c.leaveGraceSet = false
	fs := flag.NewFlagSet("syncgate", flag.ContinueOnError)
	fs.SetOutput(flagOut)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), serveUsage)
		fs.PrintDefaults()
	}
	var flagged []func() error
	configPath := getenv("SYNCGATE_CONFIG")
	fs.Func("config", "optional YAML config file with the same keys as these flags (env: SYNCGATE_CONFIG)", func(v string) error {
		configPath = v
		return nil
	})
	for _, s := range settings {
		fn := func(v string) error {
			flagged = append(flagged, func() error {
				if err := s.set(c, v); err != nil {
					return fmt.Errorf("flag -%s: %w", s.name, err)
				}
				return nil
			})
			return nil
		}
		usage := fmt.Sprintf("%s (env: %s, default %q)", s.usage, s.env, s.def)
		if boolSettings[s.name] {
			fs.BoolFunc(s.name, usage, fn)
		} else {
			fs.Func(s.name, usage, fn)
		}
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, errUsage // the flag package has printed why
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if configPath != "" {
		if err := loadYAML(c, configPath); err != nil {
			return nil, err
		}
	}
	for _, s := range settings {
		if v, ok := lookupEnv(getenv, s.env); ok {
			if err := s.set(c, v); err != nil {
				return nil, fmt.Errorf("environment %s: %w", s.env, err)
			}
		}
	}
	for _, apply := range flagged {
		if err := apply(); err != nil {
			return nil, err
		}
	}
	return c, c.validate()
}

// lookupEnv treats an empty variable as unset.
func lookupEnv(getenv func(string) string, name string) (string, bool) {
	v := getenv(name)
	return v, v != ""
}

func loadYAML(c *config, path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	// Decoded as nodes, not into Go values: a value is taken as written,
	// as a flag would take it (build-id: 1.10 stays "1.10", not 1.1).
	// Every document is read (yaml.Unmarshal reads the first only, and
	// the settings of another would be dropped without a word); an empty
	// one (a lone ---, a null) holds no settings, and at most one may
	// hold any.
	var root *yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(b))
	for {
		var doc yaml.Node
		if err := dec.Decode(&doc); err == io.EOF {
			break
		} else if err != nil {
			return fmt.Errorf("config file %s: %w", path, err)
		}
		if len(doc.Content) == 0 {
			continue
		}
		n := yamlDeref(doc.Content[0])
		if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
			continue
		}
		if root != nil {
			return fmt.Errorf("config file %s: line %d: a second YAML document (after ---): put every setting in one", path, n.Line)
		}
		root = n
	}
	if root == nil {
		return nil // no settings
	}
	if root.Kind != yaml.MappingNode {
		return fmt.Errorf("config file %s: want a mapping of setting names to values", path)
	}
	pairs, err := yamlPairs(root)
	if err != nil {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	byName := map[string]setting{}
	for _, s := range settings {
		byName[s.name] = s
	}
	for _, p := range pairs {
		k, vn := p[0].Value, p[1]
		s, ok := byName[k]
		if !ok {
			return fmt.Errorf("config file %s: line %d: unknown key %q (keys are the flag names, e.g. addr, hello-timeout)", path, p[0].Line, k)
		}
		v, err := yamlScalar(vn, listSettings[k])
		if err == nil {
			err = s.set(c, v)
			if err != nil {
				// A number YAML spells otherwise (1_000, 0x80, 1e3) is
				// tried as the number it means.
				if n, ok := yamlNumber(vn); ok && s.set(c, n) == nil {
					err = nil
				}
			}
		}
		if err != nil {
			return fmt.Errorf("config file %s: line %d: key %s: %w", path, vn.Line, k, err)
		}
	}
	return nil
}

// yamlPairs returns m's key/value pairs in the order to apply them: what
// merge keys (<<) bring first (of a list of mappings, the last first),
// then m's own, which override them. A key
// may appear once in each mapping, m's own and each merged one (as YAML
// requires of a mapping); a merged mapping's key may be m's too.
func yamlPairs(m *yaml.Node) ([][2]*yaml.Node, error) {
	var merged, own [][2]*yaml.Node
	seen := map[string]bool{}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		if k.Value == "<<" && k.Tag == "!!merge" {
			srcs := []*yaml.Node{yamlDeref(v)}
			if srcs[0].Kind == yaml.SequenceNode {
				srcs = srcs[0].Content
			}
			// An earlier mapping's key overrides a later one's (the
			// merge key spec), so the earliest is applied last.
			for _, src := range slices.Backward(srcs) {
				src = yamlDeref(src)
				if src.Kind != yaml.MappingNode {
					return nil, fmt.Errorf("line %d: a merge key (<<) takes a mapping", k.Line)
				}
				ps, err := yamlPairs(src)
				if err != nil {
					return nil, err
				}
				merged = append(merged, ps...)
			}
			continue
		}
		if seen[k.Value] {
			return nil, fmt.Errorf("line %d: key %s appears twice", k.Line, k.Value)
		}
		seen[k.Value] = true
		own = append(own, [2]*yaml.Node{k, v})
	}
	return append(merged, own...), nil
}

// yamlDeref follows an alias to the node it names.
func yamlDeref(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// yamlScalar returns the text of a YAML scalar as written, the string a
// flag would take ("" for null); if list, a list becomes a
// comma-separated string (a null element is an empty one). A list for a
// setting of one value is an error: joined, it would be one value
// nobody meant (jwt-audience: [api, web] the audience "api,web").
func yamlScalar(n *yaml.Node, list bool) (string, error) {
	n = yamlDeref(n)
	switch n.Kind {
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "", nil
		}
		return n.Value, nil
	case yaml.SequenceNode:
		if !list {
			return "", fmt.Errorf("want one value, not a list (only persist and allowed-origins take lists)")
		}
		parts := make([]string, len(n.Content))
		for i, e := range n.Content {
			if e = yamlDeref(e); e.Kind != yaml.ScalarNode {
				return "", fmt.Errorf("want a list of scalars")
			}
			if e.Tag != "!!null" {
				parts[i] = e.Value
			}
		}
		return strings.Join(parts, ","), nil
	}
	if !list {
		return "", fmt.Errorf("want one value")
	}
	return "", fmt.Errorf("want a value or a list")
}

// yamlNumber returns the decimal form of a scalar YAML reads as an
// integer or a whole float (1_000, 0x80, 1e3), if it is one.
func yamlNumber(n *yaml.Node) (string, bool) {
	n = yamlDeref(n)
	if n.Kind != yaml.ScalarNode || (n.Tag != "!!int" && n.Tag != "!!float") {
		return "", false
	}
	var f float64
	if err := n.Decode(&f); err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
		return "", false
	}
	return strconv.FormatInt(int64(f), 10), true
}

func (c *config) validate() error {
	if c.Addr == "" {
		return errors.New("addr (SYNCGATE_ADDR) must not be empty")
	}
	host, _, err := net.SplitHostPort(c.Addr)
	if err != nil {
		// Before the loopback check, which would call it not loopback.
		return fmt.Errorf("addr (SYNCGATE_ADDR) %q: want host:port, e.g. 127.0.0.1:8080: %w", c.Addr, err)
	}
	if strings.ContainsFunc(host, unicode.IsSpace) {
		// No host name or IP holds blanks: the listen would fail later,
		// on a lookup of that name.
		return fmt.Errorf("addr (SYNCGATE_ADDR) %q: the host has blanks; want host:port, e.g. 127.0.0.1:8080, or :8080 for every interface", c.Addr)
	}
	if strings.TrimSpace(c.DataDir) == "" {
		// Blanks alone are no directory anyone means: the log would
		// land in a directory named "   " under the working directory.
		return fmt.Errorf("data-dir (SYNCGATE_DATA_DIR) must not be empty or blank, got %q", c.DataDir)
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return errors.New("tls-cert (SYNCGATE_TLS_CERT) and tls-key (SYNCGATE_TLS_KEY) go together")
	}
	if c.anonymous() && !c.Insecure && !loopbackAddr(c.Addr) {
		return fmt.Errorf("addr (SYNCGATE_ADDR) %s is not a loopback address, and no token keys are set: "+
			"set SYNCGATE_JWT_SECRET or SYNCGATE_JWT_KEYS, or run anonymous anyway with -insecure (SYNCGATE_INSECURE=true)", c.Addr)
	}
	if g := &c.Gateway; g.PresenceLeaveGrace < g.PresenceWindow {
		if c.leaveGraceSet {
			return fmt.Errorf("presence-leave-grace (SYNCGATE_PRESENCE_LEAVE_GRACE=%v) must be at least presence-window (SYNCGATE_PRESENCE_WINDOW=%v)",
				g.PresenceLeaveGrace, g.PresenceWindow)
		}
		// The 1s default, as the gateway's own: never below the window.
		g.PresenceLeaveGrace = g.PresenceWindow
	}
	if int64(c.Gateway.SendQueueBytes) < 2*c.Gateway.MaxFrameBytes {
		return fmt.Errorf("send-queue-bytes (SYNCGATE_SEND_QUEUE_BYTES=%d) must be at least twice max-frame (SYNCGATE_MAX_FRAME=%d)",
			c.Gateway.SendQueueBytes, c.Gateway.MaxFrameBytes)
	}
	return nil
}

// loopbackAddr reports whether a listen address binds only the local
// machine: localhost or a loopback IP (an empty host binds every
// interface).
func loopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
