package gateway

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/syncgate/syncgate/auth"
	"github.com/syncgate/syncgate/fanout"
	"github.com/syncgate/syncgate/frames"
)

// Log attribute keys.
const (
	logKeySession = "session"
	logKeyRemote  = "remote"
)

// Server is the gateway. Its methods are safe for concurrent use.
type Server struct {
	// Static after New.
	cfg       Config
	log       *slog.Logger
	transport fanout.Transport
	publishAt fanout.AtPublisher // transport, if it can take a message's publish time (persist.go tail); else nil
	ownsHub   *fanout.Hub        // closed by Shutdown when New made it
	metrics   *metrics
	handler   http.Handler
	seq       *sequencer
	pacer     *pacer
	pool      *writerPool // nil when Config.Writers is negative
	producers *producers
	presence  *presenceHub
	baseCtx   context.Context // parent of every session; cancelled last in Shutdown
	cancel    context.CancelFunc
	stopSweep chan struct{}

	// Lifecycle. draining is set by Drain and Shutdown: /readyz fails and
	// upgrades are refused. closed is set by Shutdown under mu: then not
	// even a refusal is tracked. stopSweep is closed once, by Shutdown.
	draining atomic.Bool
	closed   atomic.Bool
	stopOnce sync.Once
	drainReq chan struct{} // closed by an admin drain request (DrainRequested)
	reqOnce  sync.Once

	budget *acceptBudget // admission: rate and session cap (budget.go)

	origins  *auth.OriginPolicy // checked before every upgrade (auth.go)
	persist  []auth.Pattern     // Config.Persist, parsed (persist.go)
	perIP    *counter           // sessions per client address (limits.go)
	perActor *counter           // sessions per actor (limits.go)

	httpWriters *keyedLimiters // HTTP stream writes per token sub (limits.go); nil without token keys or frame rate
	badTokens   *keyedLimiters // HTTP stream token checks per client address (badtoken.go); nil without token keys or when off

	randMu sync.Mutex
	rnd    *rand.Rand // guarded by randMu: drain slots and refusal jitter

	buildMu sync.RWMutex
	buildID string // guarded by buildMu: the build id announced in hello (update.go)

	tailMu    sync.Mutex
	tailers   map[string]*tailer // guarded by tailMu: persisted topics with local subscribers
	tailIndex sync.Map           // topic → *tailer: tailers, changed under tailMu, read without it (streamMade)

	refusalWait time.Duration // static: how long a refusal waits for the client's close; refusalCloseWait but in tests

	mu       sync.Mutex
	sessions map[*session]struct{}  // guarded by mu
	refusals map[*corkConn]struct{} // guarded by mu: refused connections saying reconnect (sayReconnect)
	cutting  bool                   // guarded by mu: Shutdown's ctx ended; refusals are cut
	refusing atomic.Int32           // refusals under way (accept.go, maxRefusing)
	drain    *drainRun              // guarded by mu: nil until Drain starts
	wg       sync.WaitGroup         // session handlers, refusals, the sweeper, the drain
}

// New returns a Server for cfg (see [Config] for defaults).
func New(cfg Config) (*Server, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	origins, err := auth.NewOriginPolicy(cfg.AllowedOrigins)
	if err != nil {
		return nil, fmt.Errorf("gateway: AllowedOrigins: %w", err)
	}
	s := &Server{
		origins:     origins,
		persist:     persistPatterns(cfg.Persist),
		perIP:       newCounter(cfg.MaxSessionsPerIP),
		perActor:    newCounter(cfg.MaxSessionsPerActor),
		cfg:         cfg,
		log:         cfg.Logger,
		transport:   cfg.Transport,
		seq:         &sequencer{seed: maphash.MakeSeed(), hi: uint64(cfg.Now().UnixMilli())},
		sessions:    map[*session]struct{}{},
		refusals:    map[*corkConn]struct{}{},
		tailers:     map[string]*tailer{},
		stopSweep:   make(chan struct{}),
		drainReq:    make(chan struct{}),
		rnd:         cfg.Rand,
		buildID:     cfg.BuildID,
		refusalWait: refusalCloseWait,
	}
	if cfg.Verifier != nil {
		s.httpWriters = newKeyedLimiters(cfg.FrameRate, cfg.FrameBurst, 0)
		s.badTokens = newKeyedLimiters(cfg.BadTokenRate, cfg.BadTokenBurst, maxBadTokenAddrs)
	}
	// The budget gets a source of its own, drawn from cfg.Rand, so a
	// seeded cfg.Rand makes both deterministic.
	s.budget = newAcceptBudget(cfg.AcceptRate, cfg.AcceptBurst, cfg.MaxSessions,
		rand.New(rand.NewPCG(cfg.Rand.Uint64(), cfg.Rand.Uint64())))
	if s.transport == nil {
		s.ownsHub = fanout.NewHub(fanout.HubConfig{Now: cfg.Now})
		s.transport = s.ownsHub
	}
	s.publishAt, _ = s.transport.(fanout.AtPublisher)
	reg := cfg.Registry
	if reg == nil {
		reg = newRegistry()
	}
	s.metrics = newMetrics(reg)
	s.producers = newProducers(&cfg, s.metrics)
	pcfg := cfg
	if cfg.Writers > 0 {
		var readyLate time.Duration
		if cfg.MaxWriteDelay > 0 {
			readyLate = cfg.MaxWriteDelay + poolLateWait
		}
		s.pool = newWriterPool(cfg.Writers, readyLate, cfg.OverloadWriteDelay, s.metrics.writerStalls.Inc)
		// With shared writers, sessions waiting for one no longer show as
		// runnable goroutines: the pool's late turns count as waits too.
		pcfg.SchedWaits = func() (long, total uint64) {
			l, t := cfg.SchedWaits()
			pl, pt := s.pool.waits()
			return l + pl, t + pt
		}
	}
	s.pacer = newPacer(pcfg, s.stopSweep, s.metrics.writeDelay)
	s.pacer.overloads = s.metrics.overloadTicks
	preg := cfg.Presence
	if preg == nil {
		if preg, err = newPresenceRegistry(cfg); err != nil {
			return nil, err
		}
	}
	s.presence = newPresenceHub(s, preg)
	s.baseCtx, s.cancel = context.WithCancel(context.Background())

	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/ws", s.serveWS)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", s.serveReady)
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	if cfg.AdminToken != "" {
		s.addAdminRoutes(mux)
	}
	s.handler = boundWrite(mux, cfg.WriteTimeout)
	if cfg.Log != nil {
		s.handler = streamsFirst(s.streamHandler(), s.handler)
	}
	if cfg.Verifier == nil && !cfg.Insecure {
		s.handler = loopbackOnly(s.handler)
	}
	s.handler = boundBody(s.handler, cfg.StreamBodyTimeout)

	s.wg.Go(s.sweepLoop)
	s.wg.Go(s.pacer.run)
	s.wg.Go(func() { s.presence.run(s.stopSweep) })
	return s, nil
}

// boundBody gives the body of every request d to arrive. net/http reads
// what a handler left unread of a body (up to 256 KiB) before it answers
// or takes the next request, and has no deadline of its own for that
// (syncgate serve sets no ReadTimeout: it would cut long-polls and SSE
// reads), so a request to any path that announced a body and never sent
// it held its connection and goroutine for as long as the client liked.
// The stream API sets the same deadline itself and lifts it once a body
// is whole; net/http clears it when it hands an upgraded connection over
// (TestGateway_UpgradeWithBodyNotCut).
func boundBody(h http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength != 0 { // -1: chunked, length unknown
			_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(d))
		}
		h.ServeHTTP(w, r)
	})
}

// boundWrite gives the answer of every request to h d to be written.
// Without it (syncgate serve sets no WriteTimeout: it would cut long-polls
// and SSE reads) a client that sends requests and never reads the answers
// held its connection for good, net/http blocked writing into a full
// socket. net/http lifts the deadline after each request, and when it
// hands an upgraded connection over. The stream API is not behind it: it
// bounds its reads' answers itself and leaves its writes' unbounded (a
// deadline could cut the answer of an append already made).
func boundWrite(h http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(d))
		h.ServeHTTP(w, r)
	})
}

// Handler serves /v1/ws, /healthz, /readyz and /metrics, the Durable
// Streams API when Config.Log is set, and the admin API when
// Config.AdminToken is set.
func (s *Server) Handler() http.Handler { return s.handler }

func (s *Server) serveReady(w http.ResponseWriter, _ *http.Request) {
	if s.draining.Load() {
		http.Error(w, "draining", http.StatusServiceUnavailable)
		return
	}
	_, _ = w.Write([]byte("ready\n"))
}

func (s *Server) serveWS(w http.ResponseWriter, r *http.Request) {
	// Admission comes first, before any session work (budget.go).
	if s.closed.Load() {
		s.refusePlain(w, rejectShutdown, time.Second)
		return
	}
	if s.draining.Load() {
		s.refuse(w, r, rejectDraining, s.budget.jitter(time.Millisecond, drainRefusalMax))
		return
	}
	if !isWebSocketUpgrade(r) {
		// It will not become a session, so it spends no token and takes
		// no place; it is told of a full node all the same.
		if reason, after, full := s.budget.full(s.cfg.Now()); full {
			s.refusePlain(w, reason, after)
			return
		}
		s.refuseNotUpgrade(w)
		return
	}
	if !s.checkOrigin(w, r) {
		return
	}
	// A malformed upgrade, like a plain request, can never become a
	// session: it gets its 4xx before it takes a place or a token. After
	// the Origin, so a foreign page learns nothing of it.
	if !s.checkHandshake(w, r) {
		return
	}
	// The per-address cap before the accept budget: a client refused for
	// its address must not spend a token that a session could have had.
	ip := clientIP(r.RemoteAddr)
	if !s.perIP.acquire(ip) {
		s.refuse(w, r, rejectPerIP, s.budget.jitter(fullDelayMin, fullDelayMax))
		return
	}
	if ok, reason, after := s.budget.admit(s.cfg.Now()); !ok {
		s.perIP.release(ip)
		s.refuse(w, r, reason, after)
		return
	}
	var netConn *corkConn
	conn, err := websocket.Accept(hijackSizer{w, &netConn}, r, acceptOptions)
	if err != nil {
		// Accept has written the HTTP error.
		s.perIP.release(ip)
		s.budget.release()
		s.metrics.rejected[rejectHandshake].Inc()
		s.log.Debug("upgrade refused", logKeyRemote, r.RemoteAddr, "err", err)
		return
	}
	conn.SetReadLimit(s.cfg.MaxFrameBytes)
	netConn.timeout = s.cfg.WriteTimeout // before the session writes anything
	sess := newSession(s.baseCtx, s, conn, netConn, newSessionID(), r.RemoteAddr)
	if !s.register(sess) {
		// A drain or Shutdown began while this client was upgrading.
		s.perIP.release(ip)
		s.budget.release()
		if s.track() {
			defer s.wg.Done()
			s.metrics.rejected[rejectDraining].Inc()
			s.sayReconnect(conn, netConn, frames.ReasonDrain, s.budget.jitter(time.Millisecond, drainRefusalMax),
				websocket.StatusServiceRestart, refusalText[rejectDraining])
			return
		}
		s.metrics.rejected[rejectShutdown].Inc()
		// Shutdown does not wait for this handler: bound its close.
		closeWithin(conn, netConn, websocket.StatusGoingAway, closeReasons[reasonShutdown].text, s.refusalWait)
		return
	}
	s.metrics.accepted.Inc()
	// The session gets a goroutine of its own (joined to s.wg by register)
	// and this handler returns, so net/http frees the request, its headers
	// and the handler's grown stack: an idle session keeps only what it
	// needs.
	go func() {
		defer s.unregister(sess)
		sess.run()
	}()
}

// track joins a refusal to s.wg unless Shutdown has begun; the caller then
// calls s.wg.Done.
func (s *Server) track() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed.Load() {
		return false
	}
	s.wg.Add(1)
	return true
}

// register adds sess unless the server is draining; it also joins s.wg, so
// Shutdown waits for the session.
func (s *Server) register(sess *session) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining.Load() {
		return false
	}
	s.sessions[sess] = struct{}{}
	s.wg.Add(1)
	s.metrics.sessions.Inc()
	return true
}

func (s *Server) unregister(sess *session) {
	s.mu.Lock()
	delete(s.sessions, sess)
	if s.drain != nil && len(s.sessions) == 0 {
		s.drain.idleLocked()
	}
	s.mu.Unlock()
	s.perIP.release(sess.ip)
	s.budget.release()
	s.metrics.sessions.Dec()
	s.wg.Done()
}

// Shutdown stops accepting sessions, fails /readyz, closes every session
// with 1001 after flushing what is queued for it, and waits for them (and
// for a drain under way, which it stops). After a [Server.Drain] there is
// normally no session left, and Shutdown only releases the rest. When
// ctx ends first, the remaining connections are cut without a close
// handshake and Shutdown returns ctx's error after they have stopped.
// Shutdown does not close the http.Server serving Handler: call its own
// Shutdown after this one. Calling Shutdown again waits again.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.draining.Store(true)
	s.closed.Store(true)
	s.stopOnce.Do(func() { close(s.stopSweep) })
	s.metrics.draining.Set(1)
	sessions := make([]*session, 0, len(s.sessions))
	for sess := range s.sessions {
		sessions = append(sessions, sess)
	}
	s.mu.Unlock()
	// No session joins after draining is set; act on them outside s.mu.
	for _, sess := range sessions {
		sess.closeWith(reasonShutdown)
	}

	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
		for _, sess := range sessions {
			sess.cut()
		}
		s.cutRefusals()
		<-done
	}
	if s.pool != nil {
		s.pool.close() // every session has ended: no writes are left
	}
	s.cancel()
	if s.ownsHub != nil {
		_ = s.ownsHub.Close()
	}
	return err
}

// sweepLoop forgets idle producers, and the refilled buckets of the HTTP
// writer limits and the bad-token budget, once a minute until Shutdown.
func (s *Server) sweepLoop() {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-s.stopSweep:
			return
		case <-t.C:
			if n := s.producers.sweep(s.cfg.Now()); n > 0 {
				s.log.Debug("forgot idle producers", "count", n)
			}
			if s.httpWriters != nil {
				s.httpWriters.sweep(s.cfg.Now())
			}
			if s.badTokens != nil {
				s.badTokens.sweep(s.cfg.Now())
			}
		}
	}
}

func newSessionID() string {
	var b [16]byte
	_, _ = crand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}
