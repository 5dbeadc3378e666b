package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"hash/maphash"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/syncgate/syncgate/fanout"
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
	ownsHub   *fanout.Hub // closed by Shutdown when New made it
	metrics   *metrics
	handler   http.Handler
	seq       *sequencer
	pacer     *pacer
	producers *producers
	baseCtx   context.Context // parent of every session; cancelled last in Shutdown
	cancel    context.CancelFunc
	stopSweep chan struct{}

	draining atomic.Bool // set once by Shutdown: /readyz fails, upgrades refused

	streams sync.Map // persisted topics whose stream this node has created or found

	tailMu  sync.Mutex
	tailers map[string]*tailer // guarded by tailMu: persisted topics with local subscribers

	mu       sync.Mutex
	sessions map[*session]struct{} // guarded by mu
	wg       sync.WaitGroup        // session handlers and the sweeper
}

// New returns a Server for cfg (see [Config] for defaults).
func New(cfg Config) (*Server, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg:       cfg,
		log:       cfg.Logger,
		transport: cfg.Transport,
		seq:       &sequencer{seed: maphash.MakeSeed(), hi: uint64(cfg.Now().UnixMilli())},
		producers: &producers{window: cfg.ProducerWindow, idle: cfg.ProducerIdle, max: cfg.MaxProducers, m: map[string]*producer{}},
		sessions:  map[*session]struct{}{},
		tailers:   map[string]*tailer{},
		stopSweep: make(chan struct{}),
	}
	if s.transport == nil {
		s.ownsHub = fanout.NewHub(fanout.HubConfig{Now: cfg.Now})
		s.transport = s.ownsHub
	}
	reg := cfg.Registry
	if reg == nil {
		reg = newRegistry()
	}
	s.metrics = newMetrics(reg)
	s.pacer = newPacer(cfg, s.stopSweep, s.metrics.writeDelay)
	s.baseCtx, s.cancel = context.WithCancel(context.Background())

	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/ws", s.serveWS)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", s.serveReady)
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	if cfg.Log != nil {
		mux.Handle("/v1/stream/", s.streamHandler())
	}
	s.handler = mux

	s.wg.Go(s.sweepLoop)
	s.wg.Go(s.pacer.run)
	return s, nil
}

// Handler serves /v1/ws, /healthz, /readyz and /metrics.
func (s *Server) Handler() http.Handler { return s.handler }

func (s *Server) serveReady(w http.ResponseWriter, _ *http.Request) {
	if s.draining.Load() {
		http.Error(w, "draining", http.StatusServiceUnavailable)
		return
	}
	_, _ = w.Write([]byte("ready\n"))
}

func (s *Server) serveWS(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		s.metrics.rejected.WithLabelValues("draining").Inc()
		w.Header().Set("Retry-After", "1")
		http.Error(w, "server is shutting down", http.StatusServiceUnavailable)
		return
	}
	var netConn *corkConn
	conn, err := websocket.Accept(hijackSizer{w, &netConn}, r, &websocket.AcceptOptions{
		OriginPatterns:  s.cfg.AllowedOrigins,
		CompressionMode: websocket.CompressionDisabled,
	})
	if err != nil {
		// Accept has written the HTTP error (403 for a foreign Origin).
		s.metrics.rejected.WithLabelValues("handshake").Inc()
		s.log.Debug("upgrade refused", logKeyRemote, r.RemoteAddr, "err", err)
		return
	}
	conn.SetReadLimit(s.cfg.MaxFrameBytes)
	netConn.timeout = s.cfg.WriteTimeout // before the session writes anything
	sess := newSession(s.baseCtx, s, conn, netConn, newSessionID(), r.RemoteAddr)
	if !s.register(sess) {
		_ = conn.Close(websocket.StatusGoingAway, closeReasons[reasonShutdown].text)
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
	s.mu.Unlock()
	s.metrics.sessions.Dec()
	s.wg.Done()
}

// Shutdown stops accepting sessions, fails /readyz, closes every session
// with 1001 after flushing what is queued for it, and waits for them. When
// ctx ends first, the remaining connections are cut without a close
// handshake and Shutdown returns ctx's error after they have stopped.
// Shutdown does not close the http.Server serving Handler: call its own
// Shutdown after this one. Calling Shutdown again waits again.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if !s.draining.Swap(true) {
		close(s.stopSweep)
	}
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
			_ = sess.conn.CloseNow()
		}
		<-done
	}
	s.cancel()
	if s.ownsHub != nil {
		_ = s.ownsHub.Close()
	}
	return err
}

// sweepLoop forgets idle producers once a minute until Shutdown.
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
		}
	}
}

func newSessionID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}
