package gateway

import (
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syncgate/syncgate/fanout"
	"github.com/syncgate/syncgate/presence"
	"github.com/syncgate/syncgate/storage"
)

// Config configures a [Server]. The zero value is usable: every field
// documents its default. [New] copies it; the caller's value is not changed.
type Config struct {
	// Logger receives the gateway's logs. Nil discards them.
	Logger *slog.Logger

	// Transport carries publications between sessions. Nil means a new
	// in-process [fanout.Hub], closed by Shutdown. Persisted topics (see
	// Persist) need one that, like the Hub, delivers to this node's
	// subscribers before Publish returns: a resume that catches up with
	// the topic's tailer (joinLive, catchUp, awaitLog in persist.go)
	// reads what the tailer published as delivered. The contract allows
	// asynchronous delivery, which they would need a signal of their own
	// for.
	Transport fanout.Transport

	// Registry receives the gateway's metrics and is served at /metrics.
	// Nil means a new registry with the Go and process collectors (the Go
	// collector with the scheduler's latency histogram).
	Registry *prometheus.Registry

	// BuildID is the current app build, sent in the server's hello; a
	// client whose hello names another build (both non-empty) gets
	// update-available. [Server.SetBuildID] changes it at runtime.
	// Empty by default; at most 256 bytes, as a client's hello may carry,
	// else New fails.
	BuildID string

	// HelloTimeout bounds the wait for the client's hello; after it the
	// session is closed with 1008. Zero means 10s.
	HelloTimeout time.Duration

	// MaxFrameBytes is the largest WebSocket message a client may send;
	// a larger one closes the session with 1009. Zero means 65536.
	MaxFrameBytes int64

	// MaxBatchBytes bounds one outgoing WebSocket message that carries
	// several frames. A single larger frame is sent alone. Zero means 65536.
	MaxBatchBytes int

	// SendQueueMessages and SendQueueBytes bound a session's send queue;
	// overflowing either closes the session with 4001 (slow consumer).
	// Zero means 65536 frames and 4 MiB: the byte bound is the one that
	// usually acts; the frame bound caps bookkeeping for tiny frames.
	SendQueueMessages int
	SendQueueBytes    int

	// WriteTimeout bounds every network write. A Durable Streams read
	// (GET, HEAD) must be answered and taken within it, from the
	// request's start: a live read's bound grows with its wait, and an
	// SSE response's is per event. Zero means 10s.
	WriteTimeout time.Duration

	// PingInterval is how often the server pings each session; a session
	// that does not answer within PongTimeout is closed with 4002.
	// Zero means 25s and 10s.
	PingInterval time.Duration
	PongTimeout  time.Duration

	// AllowedOrigins lists extra Origin patterns allowed to open sessions
	// (auth.OriginPolicy syntax: "app.example.com", "localhost:5173",
	// "*.example.com", optionally with "https://" or "http://" in front to
	// pin the scheme; no other wildcard). The request's own host is always
	// allowed, and so is a request without an Origin header (a non-browser
	// client); "null" never is. A refused Origin gets HTTP 403 before the
	// upgrade. New fails on a bad pattern. Empty by default.
	AllowedOrigins []string

	// Security (auth.go, limits.go, docs/security.md).

	// Verifier checks hello.token; *auth.Verifier satisfies it. Nil means
	// anonymous dev mode: every session may use every topic, its actorId
	// is null, and requests whose Host is not a loopback name or address
	// are refused (421) unless Insecure is set.
	Verifier TokenVerifier

	// Insecure lets an anonymous gateway (no Verifier) answer requests
	// for any Host. It has no effect with a Verifier. False by default.
	Insecure bool

	// TokenGrace is how long a session whose token expired may still send
	// a refreshing hello; meanwhile its subscriptions keep flowing but its
	// grants are void. After it the session is closed with 1008. Zero
	// means 30s.
	TokenGrace time.Duration

	// FrameRate is the steady rate of frames per second a session may send
	// (a token bucket of FrameBurst); a frame over it is dropped and
	// answered with X_RATE_LIMITED, and a session that keeps flooding is
	// read more slowly (limits.go). Zero means 1000; negative turns the
	// limit off; NaN and +Inf are refused (the hello carries the rate, and
	// JSON has no infinity). FrameBurst zero means twice FrameRate (at most
	// 2^30). With a Verifier
	// the same bucket bounds the HTTP stream writes of each token sub,
	// across its requests (Server.httpWriters, limits.go).
	FrameRate  float64
	FrameBurst int

	// RateLimitClose is how long a session may stay over its frame rate
	// (refused frames with no second-long pause) before it is closed with
	// 1008. Zero means 10s; negative never closes.
	RateLimitClose time.Duration

	// MaxSessionsPerIP caps the sessions of one client IP address (the
	// TCP peer: behind a proxy, the proxy's; an IPv6 address by its /64,
	// which one host usually has whole). Over it a WebSocket client
	// gets a reconnect frame and close 1013, like an overloaded node. A
	// live Durable Streams read (long-poll, SSE) counts as a session; over
	// the cap it gets 429. Zero (the default) or negative means no cap.
	MaxSessionsPerIP int

	// MaxSessionsPerActor caps the sessions of one actor (token sub). Over
	// it the hello is answered X_TOO_MANY_SESSIONS and the session closed
	// with 1008. A live Durable Streams read with a token counts as a
	// session of its sub; over the cap it gets 429. Zero means 100;
	// negative means no cap. Anonymous sessions are not counted.
	MaxSessionsPerActor int

	// BadTokenRate is the steady rate per second of refused tokens the
	// Durable Streams HTTP API checks from one client address (the TCP
	// peer's IP, an IPv6 one by its /64: behind a proxy, the proxy's);
	// BadTokenBurst is the size of each address's bucket. A refused
	// token takes one from its address's bucket, one that verifies takes
	// none. Once the bucket is empty, the address's requests that carry a
	// token get 429 with Retry-After without their token being checked,
	// good tokens included (except those an *auth.Verifier remembers as
	// verified), until it refills (badtoken.go). The WebSocket
	// hello does not use it: the accept budget meters each hello's check.
	// Zero means 10 per second; negative turns the budget off; NaN is
	// refused. BadTokenBurst zero means twice BadTokenRate (at least 1, at
	// most 2^30). Without a Verifier there is no token to check, and no
	// budget.
	BadTokenRate  float64
	BadTokenBurst int

	// WriteBudget is the node's target rate of WebSocket messages written
	// per second. Above it, busy sessions batch more frames per message by
	// waiting up to MaxWriteDelay between their writes (see docs/architecture.md,
	// Pacing). Zero means 50000 per core (runtime.GOMAXPROCS): a message
	// costs the sender about 5-15 µs of CPU whatever its size.
	WriteBudget int

	// PaceCPU is the share of the node's cores (0-1) above which it paces
	// busy sessions whatever the write rate. Zero means 0.4: headroom for
	// bursts, so fanout does not queue behind a saturated CPU. NaN is
	// refused.
	PaceCPU float64

	// CPUTime returns the CPU time the process has used, for pacing. Nil
	// means getrusage (on non-Unix systems pacing follows the rate alone).
	CPUTime func() time.Duration

	// MaxWriteDelay bounds the wait pacing adds before a session's next
	// write, except while the node is overloaded (see SchedWaits), when
	// OverloadWriteDelay bounds it. Zero means 20ms; negative turns pacing
	// off.
	MaxWriteDelay time.Duration

	// OverloadWriteDelay bounds the pacing wait while the node is
	// overloaded, so that a backlog turns into fewer, larger writes rather
	// than into seconds of latency. It is never below MaxWriteDelay (a
	// smaller value means MaxWriteDelay, and then an overload gets no
	// more room than a busy spell). Zero means 75ms. Both are at most
	// maxPaceDelay.
	OverloadWriteDelay time.Duration

	// Writers is how many goroutines write for the sessions on TCP and
	// Unix sockets (see writerPool in gateway/pool.go): they take sessions
	// with frames to send in turn and never wait on a socket, so a publish
	// to thousands of sessions makes a few goroutines runnable rather than
	// one per session. Zero means one per core (runtime.GOMAXPROCS);
	// negative means every busy session writes from a goroutine of its own,
	// as TLS connections (which cannot be written without waiting) always
	// do, and every connection does on systems other than Linux, macOS and
	// OpenBSD.
	Writers int

	// SchedWaits returns how many goroutine scheduling waits (a runnable
	// goroutine waiting for a core) have been sampled since the process
	// started, and how many of them took about 1 ms or more: running
	// totals that never decrease. When the share of long waits, as a
	// moving average over a few 50 ms pacing ticks, exceeds 40%, the node
	// is overloaded: it paces as when busy, and the delay may grow to
	// OverloadWriteDelay. Nil means the Go runtime's
	// /sched/latencies:seconds. With shared writers (Writers) the pacer
	// adds the writer pool's own waits: sessions taken, and those taken
	// late (a paced one 5 ms or more after it was due, a ready one after
	// waiting MaxWriteDelay + 5 ms or more in the line, and, if pacing
	// could not batch it, longer than its frames come apart, up to
	// twice OverloadWriteDelay).
	SchedWaits func() (long, total uint64)

	// MaxSubscriptions caps active subscriptions per session.
	// Zero means 128.
	MaxSubscriptions int

	// ProducerWindow is how many recent mutate outcomes each producer
	// remembers for retries. Zero means 256.
	ProducerWindow int

	// MaxProducers caps the client-named producer records the node keeps;
	// when full, records with no session are forgotten early. Zero means
	// 100000.
	MaxProducers int

	// ProducerIdle is how long an unused producer record (one named by
	// hello.clientId) is kept after its last session ends. Zero means 24h.
	ProducerIdle time.Duration

	// MaxIdleProducerBytes bounds the memory held by the producer records
	// no session is using, as estimated from what they keep: each
	// remembered outcome's key, offset and error text, plus a fixed cost
	// per record, ring slot and outcome. Over it, the records idle longest
	// are forgotten first, before ProducerIdle (a retry of a forgotten
	// outcome gets X_SEQ_FORGOTTEN, or runs again if its client starts
	// over at that seq; the log still deduplicates persisted appends). A
	// record in use is never forgotten, so connected clients keep their
	// outcomes. Zero means 256 MiB (about 5,000 records with a full window of
	// 36-byte keys, far more of smaller ones); negative means no cap.
	MaxIdleProducerBytes int64

	// Now is the clock. Nil means time.Now.
	Now func() time.Time

	// Log is the durable stream log. Nil means no /v1/stream/ API and no
	// persisted topics.
	Log StreamLog

	// Persist lists topic patterns, in the syntax of a token's grants
	// (auth.ParsePattern: "chat:*" is one segment, "chat:**" the rest),
	// whose topics are persisted in Log. Empty by default. Requires Log.
	Persist []string

	// LongPollTimeout bounds a Durable Streams long-poll read that finds no
	// data. Zero means 30s.
	LongPollTimeout time.Duration

	// StreamBodyTimeout bounds the arrival of a Durable Streams request's
	// body (PUT, POST): a body still incomplete then gets 408. It bounds
	// the body of a request to any other path as well (net/http reads
	// what a handler left of one): past it the connection is closed.
	// Zero means 30s.
	StreamBodyTimeout time.Duration

	// MaxAppendBytes bounds one Durable Streams append body (HTTP 413 above
	// it). Zero means 8 MiB; at most storage.MaxAppendLimit (1 GiB), else
	// New fails.
	MaxAppendBytes int64

	// Stampede control (drain.go, budget.go, docs/architecture.md).

	// DrainSpread is the window over which [Server.Drain] spreads the
	// sessions' reconnects: session i of n is told to reconnect inside slot
	// i of DrainSpread/n. Zero means 30s. Negative means no plan: every
	// session is told afterMs 0 and closed at once (what a server without
	// a plan does; kept for comparisons). At most an hour, as is
	// DrainGrace: no session is told to wait longer (frames.MaxAfterMs).
	DrainSpread time.Duration

	// DrainGrace is the time a drain allows after the last slot for the
	// last sessions to close; [Server.Drain] cuts whatever is still open
	// DrainSpread+DrainGrace after it began. Zero means 5s.
	DrainGrace time.Duration

	// AcceptRate is the steady rate of new sessions per second the node
	// admits (a token bucket, golang.org/x/time/rate); AcceptBurst is the
	// bucket's size. Over it, a WebSocket client is told when to come back
	// (a reconnect frame, reason "overload", then close 1013); a plain
	// HTTP request gets 503 with Retry-After. Zero means 1000 per second;
	// negative turns the rate limit off; NaN is refused. AcceptBurst zero
	// means one second's worth of AcceptRate (at least 1, at most 2^30).
	AcceptRate  float64
	AcceptBurst int

	// MaxSessions caps the node's connected sessions, live stream reads
	// counted as sessions; over it new clients are refused as "node
	// full", told to come back in 1-10 s (a live read: 503 with
	// Retry-After). Zero means 100000; negative means no cap.
	MaxSessions int

	// AdminToken enables the admin API (/v1/admin/drain, /v1/admin/build)
	// and is the bearer token it requires; at least 16 bytes, with no
	// leading or trailing whitespace. Empty (the default) leaves the admin
	// API off: its paths answer 404.
	AdminToken string

	// Presence (presence.go, docs/presence.md).

	// Presence is the presence registry. Nil means a new in-process
	// registry (presence.NewMemoryRegistry) built from the fields below,
	// Now and a MaxSkew of 1s. The gateway stamps a client's updatedAt
	// itself, clamped to now+1s (presenceMaxSkew): give a registry of
	// your own that MaxSkew too, so both order a session's writes alike.
	Presence presence.Registry

	// PresenceTTL is how long a member whose session vanished (cut TCP,
	// crashed node) stays present; live sessions refresh their members
	// every PresenceTTL/3. Zero means 30s.
	PresenceTTL time.Duration

	// PresenceWindow is the coalescing window: a topic's presence changes
	// reach its subscribers at most once per window, in one batch. The
	// gateway flushes the registry every PresenceWindow/4. Zero means
	// 100ms. With a Presence registry, set it to the registry's window.
	PresenceWindow time.Duration

	// PresenceLeaveGrace is how long a member must stay gone before
	// subscribers are told it left; a rejoin inside it (a reload, a
	// reconnect) is no leave/join flap. Zero means 1s, or PresenceWindow
	// if longer. Ignored with a Presence registry.
	PresenceLeaveGrace time.Duration

	// PresenceMaxListed is how many members of a topic presence frames
	// list; beyond it they carry the total as count. Zero means 1000.
	// With a Presence registry, set it to the registry's limit.
	PresenceMaxListed int

	// Rand is the random source for drain slots and refusal jitter. The
	// server serialises its use. Nil means a source seeded from
	// crypto/rand.
	Rand *rand.Rand
}

// minAdminToken is the shortest admin token New accepts.
const minAdminToken = 16

// maxPaceDelay bounds MaxWriteDelay and OverloadWriteDelay: a write held
// longer would sit in a queue past any useful latency, and the pacer's
// arithmetic stays far from overflow.
const maxPaceDelay = 10 * time.Second

func (c Config) withDefaults() (Config, error) {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	setDefault(&c.HelloTimeout, 10*time.Second)
	setDefault(&c.MaxFrameBytes, 65536)
	setDefault(&c.MaxBatchBytes, 65536)
	setDefault(&c.SendQueueMessages, 65536)
	setDefault(&c.SendQueueBytes, 4<<20)
	setDefault(&c.WriteTimeout, 10*time.Second)
	setDefault(&c.PingInterval, 25*time.Second)
	setDefault(&c.PongTimeout, 10*time.Second)
	setDefault(&c.MaxSubscriptions, 128)
	setDefault(&c.WriteBudget, 50000*runtime.GOMAXPROCS(0))
	setDefault(&c.PaceCPU, 0.4)
	if c.CPUTime == nil {
		c.CPUTime = processCPU
	}
	setDefault(&c.MaxWriteDelay, 20*time.Millisecond)
	setDefault(&c.OverloadWriteDelay, 75*time.Millisecond)
	c.OverloadWriteDelay = max(c.OverloadWriteDelay, c.MaxWriteDelay) // never below it
	setDefault(&c.Writers, runtime.GOMAXPROCS(0))
	if c.SchedWaits == nil {
		c.SchedWaits = runtimeSchedWaits
	}
	setDefault(&c.ProducerWindow, 256)
	setDefault(&c.ProducerIdle, 24*time.Hour)
	setDefault(&c.MaxProducers, 100000)
	setDefault(&c.MaxIdleProducerBytes, 256<<20)
	setDefault(&c.LongPollTimeout, 30*time.Second)
	setDefault(&c.StreamBodyTimeout, 30*time.Second)
	setDefault(&c.MaxAppendBytes, 8<<20)
	setDefault(&c.DrainSpread, 30*time.Second)
	setDefault(&c.DrainGrace, 5*time.Second)
	setDefault(&c.AcceptRate, 1000)
	if c.AcceptBurst == 0 && c.AcceptRate > 0 {
		// At most 2^30: a float beyond int's range converts to whatever
		// the platform makes of it.
		c.AcceptBurst = max(1, int(min(c.AcceptRate+0.999999, 1<<30)))
	}
	setDefault(&c.MaxSessions, 100000)
	setDefault(&c.PresenceTTL, 30*time.Second)
	setDefault(&c.PresenceWindow, 100*time.Millisecond)
	setDefault(&c.PresenceLeaveGrace, max(time.Second, c.PresenceWindow))
	setDefault(&c.PresenceMaxListed, 1000)
	setDefault(&c.TokenGrace, 30*time.Second)
	setDefault(&c.FrameRate, 1000)
	if c.FrameBurst == 0 && c.FrameRate > 0 {
		c.FrameBurst = max(1, int(min(2*c.FrameRate, 1<<30))) // within int's range, as AcceptBurst
	}
	setDefault(&c.RateLimitClose, 10*time.Second)
	setDefault(&c.MaxSessionsPerActor, 100)
	setDefault(&c.BadTokenRate, 10)
	if c.BadTokenBurst == 0 && c.BadTokenRate > 0 {
		c.BadTokenBurst = max(1, int(min(2*c.BadTokenRate, 1<<30)))
	}
	if c.Rand == nil {
		c.Rand = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())) // the global source is seeded from crypto/rand
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	c.AllowedOrigins = append([]string(nil), c.AllowedOrigins...)
	c.Persist = append([]string(nil), c.Persist...)
	switch {
	case c.HelloTimeout < 0, c.MaxFrameBytes < 0, c.MaxBatchBytes < 0, c.SendQueueMessages < 0,
		c.SendQueueBytes < 0, c.WriteTimeout < 0, c.WriteBudget < 0, c.PingInterval < 0, c.PongTimeout < 0,
		c.MaxSubscriptions < 0, c.ProducerWindow < 0, c.ProducerIdle < 0, c.MaxProducers < 0, c.LongPollTimeout < 0, c.StreamBodyTimeout < 0, c.MaxAppendBytes < 0, c.PaceCPU < 0 || c.PaceCPU > 1,
		c.DrainGrace < 0, c.AcceptBurst < 0, c.TokenGrace < 0, c.FrameBurst < 0, c.BadTokenBurst < 0:
		return c, fmt.Errorf("gateway: negative limit in config")
	case c.PresenceTTL < 0, c.PresenceWindow < 0, c.PresenceLeaveGrace < 0, c.PresenceMaxListed < 0:
		return c, fmt.Errorf("gateway: negative presence setting in config")
	case math.IsNaN(c.AcceptRate), math.IsNaN(c.FrameRate), math.IsNaN(c.BadTokenRate), math.IsNaN(c.PaceCPU):
		// Every comparison with NaN is false: a NaN rate read as "off",
		// a NaN PaceCPU as never busy and never idle.
		return c, fmt.Errorf("gateway: AcceptRate, FrameRate, BadTokenRate and PaceCPU must be numbers, not NaN")
	case math.IsInf(c.FrameRate, 1):
		// Every hello carries it, and JSON has no infinity: no hello
		// could be answered.
		return c, fmt.Errorf("gateway: FrameRate is +Inf: give frames per second, or a negative rate to turn the limit off")
	case len(c.BuildID) > maxBuildIDLen:
		// Every hello carries it; a client's hello may carry no longer one.
		return c, fmt.Errorf("gateway: BuildID is %d bytes, over the limit of %d", len(c.BuildID), maxBuildIDLen)
	case c.DrainSpread > maxDrainWindow || c.DrainGrace > maxDrainWindow:
		// A session's afterMs is at most the spread (frames.MaxAfterMs).
		return c, fmt.Errorf("gateway: DrainSpread and DrainGrace must be at most %v", maxDrainWindow)
	case c.MaxWriteDelay > maxPaceDelay || c.OverloadWriteDelay > maxPaceDelay:
		return c, fmt.Errorf("gateway: MaxWriteDelay and OverloadWriteDelay must be at most %v", maxPaceDelay)
	case c.Presence == nil && c.PresenceLeaveGrace < c.PresenceWindow:
		return c, fmt.Errorf("gateway: PresenceLeaveGrace shorter than PresenceWindow")
	case c.AdminToken != "" && len(c.AdminToken) < minAdminToken:
		return c, fmt.Errorf("gateway: AdminToken must be at least %d bytes", minAdminToken)
	case strings.TrimSpace(c.AdminToken) != c.AdminToken:
		// A presented token is trimmed (adminOnly), so this one could never match.
		return c, fmt.Errorf("gateway: AdminToken starts or ends with whitespace (a newline from a file?): remove it")
	case persistError(c.Persist) != nil:
		return c, fmt.Errorf("gateway: %w", persistError(c.Persist))
	case len(c.Persist) > 0 && c.Log == nil:
		return c, fmt.Errorf("gateway: Persist needs a Log")
	case c.MaxFrameBytes > 1<<30:
		return c, fmt.Errorf("gateway: MaxFrameBytes (%d) is over 1 GiB", c.MaxFrameBytes)
	case c.MaxAppendBytes > storage.MaxAppendLimit:
		return c, fmt.Errorf("gateway: MaxAppendBytes (%d) is over 1 GiB", c.MaxAppendBytes)
	case int64(c.SendQueueBytes) < 2*c.MaxFrameBytes:
		// A patch carries a client's message plus its row and frame
		// wrapping, so one queue must hold more than one client message.
		return c, fmt.Errorf("gateway: SendQueueBytes (%d) must be at least twice MaxFrameBytes (%d)", c.SendQueueBytes, c.MaxFrameBytes)
	}
	return c, nil
}

func setDefault[T comparable](p *T, def T) {
	var zero T
	if *p == zero {
		*p = def
	}
}
