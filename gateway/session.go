package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/time/rate"

	"github.com/syncgate/syncgate/fanout"
	"github.com/syncgate/syncgate/frames"
)

// session is one WebSocket connection. See the package doc for its
// goroutines.
type session struct {
	// Static after construction.
	srv     *Server
	conn    *websocket.Conn
	netConn *corkConn // under conn: corked per message; write deadlines are set here
	id      string
	remote  string
	ctx     context.Context // parent of writes: the server's baseCtx, cancelled last in Shutdown

	// Set by the hello handler on the reader goroutine before helloDone is
	// stored; read only by the reader afterwards. helloTimer is owned by the
	// reader, and dropped once hello arrives.
	helloDone  atomic.Bool
	helloTimer *time.Timer
	clientID   string
	prodName   string // producerName of the session's actor and clientID, "" without one
	epoch      int64
	prod       *producer
	mutated    bool // a mutate of this session has reached prod
	dropped    bool // a frame of this session was dropped (over the frame rate), could not be decoded, or was a mutate refused before its producer (a length, before hello)

	// Guarded by srv.buildMu (update.go): the build the client's hello
	// named, and whether the hello was answered.
	clientBuild   string
	helloAnswered bool

	// Owned by the reader goroutine. Nil until the first subscribe.
	subs map[string]*subscription
	// replayTurn (capacity 1) is held by the replayer of a persisted
	// topic's subscription while it queues (replayRoom). The reader makes
	// it before it starts the session's first replayer; read-only after.
	replayTurn chan struct{}

	// Security (auth.go, limits.go). auth is nil until hello, then
	// replaced whole by a refresh or at expiry; safe from any goroutine.
	// lim and the limited* times are owned by the reader; ip and
	// actorKey are set before run (ip) or by hello (actorKey) and
	// released when run ends.
	auth         atomic.Pointer[authState]
	tokens       tokenClock
	lim          *rate.Limiter              // nil: no frame rate limit
	syncs        *rate.Limiter              // presence lists sent on join (presence.go); nil until the first join
	limitedSince int64                      // Unix nanoseconds: start of the current run of refused frames
	limitedLast  int64                      // Unix nanoseconds: the last refused frame
	limitedSent  int64                      // Unix nanoseconds: the last X_RATE_LIMITED answer (set back by rateLimitAnswerEvery when a run starts, so its first is answered)
	limitedDrops int                        // frames refused since that answer
	flood        atomic.Pointer[floodState] // set by the reader at its first refused frame
	ip           string                     // counted in srv.perIP
	actorKey     string                     // counted in srv.perActor; "" when not counted

	// Send side; safe from any goroutine. q.mu also guards pingTimer's
	// re-arming and the decision to start a writer.
	q         sendQueue
	pooled    bool           // static: the writer is srv.pool rather than a goroutine (see spawnWriter)
	writers   sync.WaitGroup // the writer (pool turn or goroutine), while one runs
	pingTimer *time.Timer
	lastWrite int64 // owned by the running writer: Unix nanoseconds of its last batch
	lastGap   int64 // owned by the running writer: nanoseconds between its last two batches
	lastCount int   // owned by the running writer: frames in its last batch
	// pendingAt is the publish time (Unix nanoseconds) of the oldest patch
	// in a message left pending on a full socket, 0 if none, and pending
	// are its frames: its latency is observed, and its frames are counted
	// out (or dropped, if the flush fails), once the flush ends. Owned by
	// the running writer.
	pendingAt int64
	pending   []outItem
	// writeBroken is set by the writer after a failed write; owned by the
	// running writer.
	writeBroken bool

	// closing is set by closeWith; lastRead is when the reader last got a
	// message (Unix nanoseconds): inbound traffic proves the peer alive.
	closing  atomic.Bool
	lastRead atomic.Int64
}

// subscription is one session's subscription to a topic: the
// [fanout.Subscriber] the transport delivers to.
type subscription struct {
	s      *session
	sid    string
	topic  string
	prefix []byte // `{"type":"patch","v":1,"sid":"…"`, encoded once

	// Persisted topics only (see persist.go): the topic's tailer, and the
	// replay state of a subscription that resumes from a cursor.
	tailer *tailer
	replay *replay
}

// Deliver queues a broadcast patch for the session; it never blocks.
func (sub *subscription) Deliver(m *fanout.Message) {
	if kind, at, digest, ok := parseLogMark(m.Data); ok {
		switch kind {
		case markReplaced:
			if sub.replay == nil || !sub.replay.holdReset(false) {
				sub.logReset(digest)
			}
		case markCreated:
			if sub.replay == nil || !sub.replay.holdReset(true) {
				sub.logCreated(digest)
			}
		case markPruned:
			if sub.replay == nil || !sub.replay.holdGap(at, digest) {
				sub.logGap(at, digest)
			}
		}
		return
	}
	it := outItem{prefix: sub.prefix, body: m.Data, at: m.At.UnixNano(), kind: idxPatch}
	if sub.replay != nil && sub.replay.hold(it) {
		return
	}
	sub.s.enqueue(it)
}

func newSession(ctx context.Context, srv *Server, conn *websocket.Conn, netConn *corkConn, id, remote string) *session {
	s := &session{
		srv:     srv,
		conn:    conn,
		netConn: netConn,
		id:      id,
		remote:  remote,
		ctx:     ctx,
		ip:      clientIP(remote),
		lim:     newFrameLimiter(&srv.cfg),
		pooled:  srv.pool != nil && netConn != nil && netConn.nonBlocking(),
	}
	s.q.writers = &s.writers
	return s
}

// log returns the session's logger. It is built on use: sessions log
// rarely, and an idle session should not hold one.
func (s *session) log() *slog.Logger {
	return s.srv.log.With(logKeySession, s.id, logKeyRemote, s.remote)
}

// run serves the session until it ends. It is the reader goroutine; it
// waits for the writer and the timers before it returns.
func (s *session) run() {
	s.q.mu.Lock()
	s.pingTimer = time.AfterFunc(s.srv.cfg.PingInterval, s.pingTick)
	s.q.mu.Unlock()
	s.helloTimer = time.AfterFunc(s.srv.cfg.HelloTimeout, func() {
		if !s.helloDone.Load() {
			s.closeWith(reasonHelloTimeout)
		}
	})
	err := s.readLoop()
	if s.helloTimer != nil {
		s.helloTimer.Stop()
	}
	s.closeWith(readErrorReason(err))
	// Presence leaves at once, whatever the reason.
	s.srv.presence.closed(s)
	s.q.mu.Lock() // after closeWith no writer starts and the timer is not re-armed
	s.pingTimer.Stop()
	s.q.mu.Unlock()
	s.writers.Wait()
	for _, sub := range s.subs {
		// A transport over a network may fail: the subscription may then
		// stay registered there, so it is told and counted, and the other
		// subscriptions are unsubscribed all the same.
		if err := s.srv.transport.Unsubscribe(context.Background(), sub.topic, sub); err != nil {
			s.srv.metrics.unsubscribesFailed.Inc()
			s.log().Warn("unsubscribe at close failed", "topic", sub.topic, "err", err)
		}
		sub.endPersisted()
	}
	if s.prod != nil && s.clientID != "" {
		s.srv.producers.release(s.prod, s.srv.cfg.Now())
	}
	s.stopTokenClock()
	if s.actorKey != "" {
		s.srv.perActor.release(s.actorKey)
	}
	if s.srv.log.Enabled(context.Background(), slog.LevelDebug) {
		s.log().Debug("session closed", "reason", s.q.reason.String(), "err", err)
	}
}

func readErrorReason(err error) closeReason {
	switch {
	case errors.Is(err, websocket.ErrMessageTooBig):
		return reasonMessageTooBig
	case websocket.CloseStatus(err) != -1:
		return reasonClientClosed
	default:
		return reasonReadError
	}
}

func (s *session) readLoop() error {
	for {
		// No ctx: closing the connection is what ends a read, and a
		// cancellable ctx would cost a registration per message.
		typ, r, err := s.conn.Reader(context.Background())
		if err != nil {
			return err
		}
		bp := readBufPool.Get().(*[]byte)
		msg, err := readMessage(r, (*bp)[:0])
		var pause time.Duration
		if err != nil {
			readBufPool.Put(bp)
			return err
		}
		s.lastRead.Store(s.srv.cfg.Now().UnixNano())
		s.srv.metrics.bytesIn.Add(float64(len(msg)))
		if typ != websocket.MessageText {
			// A binary message counts as one frame against the rate, as
			// a bad text frame does, and as a frame the producer never
			// saw (see handleLine).
			s.dropped = true
			if now := s.srv.cfg.Now(); !s.allowFrame(now) {
				pause = s.rateLimited(nil, now)
			} else {
				s.srv.metrics.badFrames.Inc()
				s.sendError(frames.NewError(frames.CodeBadFrame, "", "binary WebSocket message",
					"send frames as JSON in text messages"))
			}
		} else {
			// Decoded frames do not point into msg, so the buffer is
			// reused for the next message.
			// A closing session handles nothing more: its acks could no
			// longer be sent, and a client retrying elsewhere must not
			// find its mutate already done here.
			lines := 0
			frames.Split(msg, func(line []byte) bool {
				lines++
				if s.closing.Load() {
					return false
				}
				// Every frame counts, bad ones too, and before it is
				// decoded: a flood must cost as little as possible.
				if now := s.srv.cfg.Now(); !s.allowFrame(now) {
					pause = max(pause, s.rateLimited(line, now))
					return true
				}
				if onReaderStack(line) {
					s.handleLine(s.ctx, line) // the frequent kind: no detour
				} else {
					s.onOwnStack(func() { s.handleLine(s.ctx, line) })
				}
				return true
			})
			if lines == 0 {
				// A message of no frame (empty, or blank lines) is
				// answered nothing but costs a read: it counts as one
				// frame against the rate, or a flood of them would be
				// free.
				if now := s.srv.cfg.Now(); !s.allowFrame(now) {
					pause = s.rateLimited(nil, now)
				}
			}
		}
		if cap(msg) <= 64<<10 {
			*bp = msg[:0]
			readBufPool.Put(bp)
		}
		if pause > 0 {
			s.pauseReading(pause)
		}
	}
}

// readBufPool holds inbound message buffers: an idle session holds none.
var readBufPool = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

// readMessage reads all of r into buf, growing it; the connection's read
// limit bounds the size.
func readMessage(r io.Reader, buf []byte) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// looksLikeMutate guesses from a frame's first bytes whether it is a
// mutate. It only picks where the frame is handled (see onOwnStack), never
// how, so a wrong guess costs a little time or memory, nothing else.
func looksLikeMutate(line []byte) bool {
	return bytes.Contains(line[:min(len(line), 40)], []byte(`"type":"mutate"`))
}

// maxReaderBrackets bounds the '[' and '{' of a frame handled on the
// reader's stack. frames.Decode checks JSON recursively, one call per
// nesting level, up to 10,000 levels: a mutate nested that deep, 20 KB on
// the wire, would grow the reader's stack to 512 KiB, and an idle session
// keeps it until several GCs have shrunk it, so a client could pin that
// much on every session it opens. Brackets inside strings count too: an
// over-count only sends the frame to onOwnStack.
const maxReaderBrackets = 64

// onReaderStack reports whether line is handled on the reader's own
// stack: a mutate (the frequent kind) that cannot nest deeply.
func onReaderStack(line []byte) bool {
	return looksLikeMutate(line) &&
		bytes.Count(line, []byte("["))+bytes.Count(line, []byte("{")) <= maxReaderBrackets
}

// onOwnStack runs fn on a goroutine of its own and waits for it. The
// reader goroutine lives as long as the session, and a Go stack shrinks
// only to a size at least four times its deepest parked point: decoding and
// answering frames (encoding/json reflection for hello and snapshot, the
// strict decoder) is deep enough to grow the reader's stack from 4 KiB to
// 8 KiB for the rest of an idle session's life. Run on a short-lived
// goroutine, it leaves the reader at 4 KiB. Mutates, the frequent kind,
// stay on the reader (a publishing session is not an idle one) unless
// they nest deeply (see onReaderStack).
func (s *session) onOwnStack(fn func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	<-done
}

// closeWith ends the session for reason r; the first reason wins. It never
// blocks: the writer (started here if none runs) sends the close frame,
// and one waiting for a pong stops waiting (session.ping).
func (s *session) closeWith(r closeReason) {
	s.q.mu.Lock()
	if s.q.reason != reasonNone {
		s.q.mu.Unlock()
		return
	}
	s.q.reason = r
	start := s.claimWriterLocked()
	// A writer pacing holds sends the close now, not after the hold.
	wake := s.q.held != holdNone && s.q.unholdLocked() == pushedWake
	// A writer waiting for a pong stops waiting (see session.ping): a
	// peer that cut the connection would never send it.
	stopPing := s.q.pingStop
	s.q.mu.Unlock()
	switch {
	case stopPing == nil:
	case r.sendsCloseFrame():
		// The peer may be alive and owed a close frame: a live one
		// answers the ping within a round trip, and the writer goes on
		// to the close then. Cancelled at once, the ping could still be
		// writing its frame, and coder/websocket would then cut the
		// connection: no close frame (see session.ping).
		time.AfterFunc(pingStopDelay, stopPing)
	default:
		stopPing() // after q.mu: it takes the context's own locks
	}
	s.closing.Store(true) // before the pool's turn, which holds no closing session
	if wake {
		s.srv.pool.add(s)
	}
	if f := s.flood.Load(); f != nil {
		close(f.wake) // a reader paused for a flood stops waiting
	}
	s.srv.metrics.closes[r].Inc()
	if start {
		s.spawnWriter()
	}
}

// claimWriterLocked marks a writer as running and joins it to s.writers
// (under q.mu, so run's Wait sees every Add). It reports whether the caller
// must spawn it.
func (s *session) claimWriterLocked() bool {
	if s.q.writing {
		return false
	}
	s.q.writing = true
	s.q.writers.Add(1)
	return true
}

// spawnWriter starts the writer claimed by claimWriterLocked: the pool when
// the connection can be written without waiting, else a goroutine.
func (s *session) spawnWriter() {
	if s.pooled {
		s.srv.pool.add(s)
		return
	}
	go s.ownWriter(nil)
}

// enqueue queues it for the writer and reports whether it did: a full
// queue closes the session as a slow consumer, and a closing session
// takes nothing more.
func (s *session) enqueue(it outItem) (queued bool) {
	switch s.q.push(it, s.srv.cfg.SendQueueMessages, s.srv.cfg.SendQueueBytes) {
	case pushedStart:
		s.spawnWriter()
	case pushedWake:
		s.srv.pool.add(s) // its entry in the held heap is stale now (takeHold)
	case pushFull:
		s.srv.metrics.drops[dropQueueFull].Inc()
		s.closeWith(reasonSlowConsumer)
		return false
	case pushClosed:
		s.srv.metrics.drops[dropSessionClosed].Inc()
		return false
	}
	return true
}

// sendFrameCap is the first buffer size for a frame send encodes: enough
// for an ack (the frame sent once per mutate), so encoding it allocates
// once instead of growing the buffer several times.
const sendFrameCap = 128

// send encodes f and queues it, and reports whether it did (see enqueue).
func (s *session) send(f frames.Frame) (queued bool) {
	b, err := frames.AppendEncode(make([]byte, 0, sendFrameCap), f)
	if err != nil {
		// Only a server bug can make our own frames unencodable.
		s.log().Error("encode failed", "type", f.FrameType(), "err", err)
		return false
	}
	return s.enqueue(outItem{body: b, kind: int8(frameIndex(f.FrameType()))})
}

// sendAck queues an ack for ref.
func (s *session) sendAck(ref string, lsn *string) {
	s.send(&frames.Ack{Ref: ref, LSN: lsn})
}

// sendError queues an error ack; the error's Ref says which frame it answers.
func (s *session) sendError(e *frames.Error) {
	if s.send(&frames.Ack{Ref: echoRef(e.Ref), Error: e.Body()}) {
		// Counted once queued: one refused (the session closing) is a
		// drop (drops_total), not an error ack sent.
		s.srv.metrics.errorsByCode.WithLabelValues(string(e.Code)).Inc()
	}
}

// echoRef returns ref, or "" when it is longer than any ref the server
// takes (a sid or key over maxIDLen, a presence topic over maxTopicLen):
// such a ref is not one the client can match, and not one to echo.
func echoRef(ref string) string {
	limit := maxIDLen
	if strings.HasPrefix(ref, presenceRefPrefix) {
		limit = len(presenceRefPrefix) + maxTopicLen
	}
	if len(ref) > limit {
		return ""
	}
	return ref
}

// presenceRefPrefix starts the ack ref of a presence frame.
const presenceRefPrefix = "presence:"
