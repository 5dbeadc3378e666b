package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/time/rate"

	"github.com/syncgate/syncgate/frames"
)

// conn is one WebSocket connection of a Client: its read loop, its write
// queue and writer goroutine, and the acks it waits for.
type conn struct {
	// Static after connect returns.
	c     *Client
	ws    *websocket.Conn
	url   string
	hello *frames.Hello // the server's hello; set by the read loop before helloc is closed

	// Signals.
	helloc    chan struct{} // closed by the read loop when the handshake ends; see helloErr
	done      chan struct{} // closed when the read loop has exited
	wdone     chan struct{} // closed when the writer goroutine has exited
	wake      chan struct{} // one slot: a reconnect frame arrived
	closeOnce sync.Once
	closingc  chan struct{} // closed when we start closing it

	// life ends when the read loop starts shutting the connection down;
	// tasks are the goroutines it bounds (token refreshes, the resend of
	// a refused drop), waited for before the connection counts as ended.
	life    context.Context
	endLife context.CancelFunc
	tasks   sync.WaitGroup

	// Owned by the read loop. helloErr is read after helloc is closed.
	gotHello  bool
	helloErr  error
	outOfStep error // the connection is ended and started over (endWith): why
	rlog      *slog.Logger

	// The write queue: the writer goroutine (writeLoop) alone writes to
	// ws, taking whatever is queued and joining it into batches.
	qmu        sync.Mutex
	queue      []outMsg      // guarded by qmu
	qbytes     int           // guarded by qmu; bytes in queue
	qspace     chan struct{} // guarded by qmu; closed when the writer takes the queue
	qerr       error         // guarded by qmu; set once writes have stopped
	qlimit     int           // static: senders that wait for room wait above this
	qwake      chan struct{} // one slot: the queue has grown
	batchLimit atomic.Int64  // largest batch: BatchBytes, lowered to the server's maxMessage
	wbuf       []byte        // batch buffer, owned by the writer goroutine

	// Guarded by c.mu.
	pending   map[string][]subWaiter // subscribe acks by sid, in send order
	gaveUp    map[string]struct{}    // sids of given-up Subscribes dropped here, until the drop's ack: their frames are consumed
	err       error                  // why it ended; set before done is closed
	reconnect *frames.Reconnect      // the last reconnect frame received
	reconAt   time.Time              // when it arrived
	upAt      time.Time              // when it became current

	// pace keeps the writer within the server's frame rate (its hello's
	// frameRate and frameBurst); nil while unknown or unlimited. Set by
	// the read loop before helloc is closed.
	pace atomic.Pointer[rate.Limiter]
}

// subWaiter handles the ack to one subscribe frame sent on a connection.
// It is called once, without c.mu held: with the ack, or with the
// connection's error when it ends first.
type subWaiter func(ack *frames.Ack, err error)

// maxKeptWriteBuf is the largest batch buffer kept for reuse.
const maxKeptWriteBuf = 64 << 10

// connect dials url, starts the read loop, sends hello and waits for the
// server's hello. A refused hello is an *errHelloRefused; a connection
// that ended with a reconnect frame is a *retryError.
func (c *Client) connect(ctx context.Context, url string) (*conn, error) {
	o := &c.opts
	ws, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{
		HTTPClient: o.HTTPClient,
		HTTPHeader: o.Header,
	})
	if err != nil {
		return nil, fmt.Errorf("client: dial %s: %w", url, err)
	}
	ws.SetReadLimit(o.ReadLimit)
	cn := &conn{
		c:        c,
		ws:       ws,
		url:      url,
		rlog:     o.Logger.With(logKeyURL, url),
		helloc:   make(chan struct{}),
		done:     make(chan struct{}),
		wdone:    make(chan struct{}),
		wake:     make(chan struct{}, 1),
		closingc: make(chan struct{}),
		qwake:    make(chan struct{}, 1),
		qlimit:   c.queueLimit(),
		pending:  make(map[string][]subWaiter),
	}
	cn.life, cn.endLife = context.WithCancel(context.Background())
	cn.batchLimit.Store(int64(o.BatchBytes))
	c.mu.Lock()
	c.live[cn] = struct{}{}
	c.mu.Unlock()
	c.conns.Go(cn.readLoop)
	c.conns.Go(cn.writeLoop)

	hello, err := c.hello(ctx)
	if err != nil {
		cn.closeNow()
		return nil, err
	}
	if err := cn.send(ctx, hello); err != nil {
		cn.closeNow()
		return nil, fmt.Errorf("client: send hello: %w", err)
	}
	select {
	case <-cn.helloc:
	case <-cn.done:
		return nil, cn.retryErr(fmt.Errorf("client: waiting for hello: %w", cn.endErr()))
	case <-ctx.Done():
		cn.closeNow()
		return nil, fmt.Errorf("client: waiting for hello: %w", ctx.Err())
	case <-c.closing:
		cn.closeNow()
		return nil, net.ErrClosed
	}
	if cn.helloErr != nil {
		cn.closeNow()
		return nil, &errHelloRefused{cn.helloErr}
	}
	return cn, nil
}

// retryError is a connection attempt that the server refused with a
// reconnect frame (overload): retry after its delay.
type retryError struct {
	err    error
	at     time.Time // when the reconnect frame arrived
	frame  *frames.Reconnect
	reason string
}

func (e *retryError) Error() string { return e.err.Error() }
func (e *retryError) Unwrap() error { return e.err }

// retryErr wraps err in a *retryError if the connection got a reconnect
// frame.
func (cn *conn) retryErr(err error) error {
	c := cn.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if cn.reconnect == nil {
		return err
	}
	return &retryError{err: err, at: cn.reconAt, frame: cn.reconnect, reason: cn.reconnect.Reason}
}

func (cn *conn) sessionID() string {
	if cn == nil || cn.hello == nil || cn.hello.SessionID == nil {
		return ""
	}
	return *cn.hello.SessionID
}

// setCurrent records when the connection became current.
func (cn *conn) setCurrent(t time.Time) {
	cn.c.mu.Lock()
	cn.upAt = t
	cn.c.mu.Unlock()
}

// endErr returns why the connection ended, nil while it is up.
func (cn *conn) endErr() error {
	cn.c.mu.Lock()
	defer cn.c.mu.Unlock()
	return cn.err
}

// close writes what is queued, closes the connection with 1000 and waits
// for the close handshake (bounded by the websocket package).
func (cn *conn) close() error {
	// What was queued before goes out first (a PublishAsync that
	// returned is on the wire before the close frame), unless the writes
	// have stopped or this takes longer than one write may. Outside the
	// Once, so a closeNow meanwhile is not held up.
	select {
	case <-cn.closingc:
	default:
		_ = cn.flush(cn.c.opts.WriteTimeout)
	}
	var err error
	cn.closeOnce.Do(func() {
		close(cn.closingc)
		err = cn.ws.Close(websocket.StatusNormalClosure, "")
		if err != nil && !netClosed(err) {
			err = fmt.Errorf("client: close: %w", err)
		} else {
			err = nil
		}
	})
	return err
}

// closeNow cuts the connection without a close handshake.
func (cn *conn) closeNow() {
	cn.closeOnce.Do(func() { close(cn.closingc) })
	cn.ws.CloseNow()
}

// readLoop reads messages until the connection ends, dispatching each frame
// in order, then fails the acks still waiting on this connection.
func (cn *conn) readLoop() {
	var err error
	for {
		var typ websocket.MessageType
		var msg []byte
		// No ctx deadline: the loop ends when the connection does (Close,
		// a server close, or a network error).
		typ, msg, err = cn.ws.Read(context.Background())
		if err != nil {
			break
		}
		if typ != websocket.MessageText {
			cn.rlog.Debug("client: ignoring binary message", "len", len(msg))
			continue
		}
		frames.Split(msg, func(line []byte) bool {
			if cn.c.closed() {
				// Close has started: what is still pending fails with
				// net.ErrClosed, so no late ack may complete it first.
				// The loop goes on reading for the close handshake.
				return false
			}
			f, err := frames.Decode(line)
			if err != nil {
				cn.rlog.Debug("client: ignoring undecodable frame", logKeyErr, err)
				return true
			}
			cn.dispatch(f)
			return true
		})
	}
	if cn.outOfStep != nil {
		err = cn.outOfStep
	}
	cn.shutdown(err)
}

// dispatch routes one frame. It runs on the read loop.
func (cn *conn) dispatch(f frames.Frame) {
	switch f := f.(type) {
	case *frames.Hello:
		cn.handleFrameHello(f)
	case *frames.Ack:
		cn.handleFrameAck(f)
	case *frames.Snapshot:
		cn.handleFrameSnapshot(f)
	case *frames.Patch:
		cn.handleFramePatch(f)
	case *frames.Reconnect:
		cn.handleFrameReconnect(f)
	default:
		cn.c.onFrame(f)
	}
}

func (cn *conn) handleFrameHello(f *frames.Hello) {
	if cn.gotHello {
		cn.c.onFrame(f)
		return
	}
	cn.gotHello = true
	cn.hello = f
	if !cn.c.opts.Reconnect {
		// The one connection's mutate keys are prefixed by its session
		// id. Set here, before helloc is closed, since this loop reads it
		// for every unclaimed ack, and one may follow the hello at once
		// (a token already past its exp): set later, it raced with that
		// read, and the empty prefix took any ack for a repeated
		// mutate's and dropped it.
		cn.c.keyPrefix = cn.sessionID() + ":"
	}
	if lim := cn.batchLimit.Load(); f.MaxMessage > 0 && f.MaxMessage < lim {
		cn.batchLimit.Store(f.MaxMessage) // batches must fit the server's limit
	}
	if f.FrameRate > 0 && f.FrameBurst > 0 {
		cn.pace.Store(newPace(f.FrameRate, f.FrameBurst, cn.c.opts.Now()))
	}
	if f.SessionID != nil {
		cn.rlog = cn.rlog.With(logKeySession, *f.SessionID)
	}
	close(cn.helloc)
}

func (cn *conn) handleFrameAck(f *frames.Ack) {
	if cn.handleResetAck(f) {
		// A live subscription's log was replaced; its snapshot follows.
		// (Before the waiters: a drop of it may be waiting, and the drop
		// is never answered X_CURSOR_EXPIRED.)
		return
	}
	c := cn.c
	if f.Error != nil && f.Error.Code == frames.CodeRateLimited {
		// Whatever it answers, frames sent after it may have been
		// dropped with no answer at all.
		defer cn.startOver(f)
	}
	c.mu.Lock()
	if ws := cn.pending[f.Ref]; len(ws) > 0 {
		if f.Error != nil && f.Error.Code == frames.CodeRateLimited && c.opts.Reconnect {
			// A dropped subscribe (or drop) is not refused: it waits,
			// and the connection's end makes the next one send it again.
			c.mu.Unlock()
			return
		}
		w := ws[0]
		if len(ws) == 1 {
			delete(cn.pending, f.Ref)
		} else {
			cn.pending[f.Ref] = ws[1:]
		}
		c.mu.Unlock()
		w(f, nil)
		return
	}
	m, ok := c.mutates[f.Ref]
	if ok && outOfStep(f) {
		// Not run: it stays waiting, and the connection starts over.
		c.mu.Unlock()
		cn.startOver(f)
		return
	}
	if ok {
		c.deleteMutationLocked(m)
	}
	c.mu.Unlock()
	switch {
	case ok && m.fn != nil:
		m.fn(f, nil)
	case !cn.gotHello && f.Error != nil:
		// The server refused the hello (bad token, bad field, ...).
		cn.gotHello = true
		cn.helloErr = ackError(f)
		close(cn.helloc)
	case f.Error != nil && f.Error.Code == frames.CodeTokenExpired && f.Ref == "" && c.opts.TokenFunc != nil:
		cn.tasks.Go(cn.refreshToken) // not on the read loop: TokenFunc may take a while
		c.onFrame(f)
	case !ok && len(f.Ref) > len(c.keyPrefix) && f.Ref[:len(c.keyPrefix)] == c.keyPrefix:
		// The second ack of a mutate sent twice (a take-over or a
		// resend sent it again): the first one counted.
		cn.rlog.Debug("client: dropping a repeated mutate ack", "ref", f.Ref)
	default:
		c.onFrame(f)
	}
}

func (cn *conn) handleFrameReconnect(f *frames.Reconnect) {
	c := cn.c
	if !c.opts.Reconnect {
		c.onFrame(f)
		return
	}
	at := c.opts.Now()
	c.mu.Lock()
	cn.reconnect, cn.reconAt = f, at
	c.mu.Unlock()
	select {
	case cn.wake <- struct{}{}:
	default:
	}
}

// shutdown records why the connection ended and fails the subscribe acks
// still waiting on it. Without Reconnect it ends the Client. It runs once,
// at the end of the read loop.
func (cn *conn) shutdown(readErr error) {
	c := cn.c
	var err error
	select {
	case <-c.closing:
		err = net.ErrClosed
	default:
		err = fmt.Errorf("client: connection ended: %w", readErr)
		cn.rlog.Debug("client: connection ended", logKeyErr, readErr)
	}
	cn.ws.CloseNow() // release it whatever the read error was
	cn.endLife()     // a token refresh gives up

	c.mu.Lock()
	cn.err = err
	pending := cn.pending
	cn.pending = nil
	if c.cur == cn {
		c.cur = nil
	}
	delete(c.live, cn)
	c.mu.Unlock()
	for _, ws := range pending {
		for _, w := range ws {
			w(nil, err)
		}
	}
	close(cn.done)
	<-cn.wdone // the writer exits once done is closed; its writes fail on the closed socket
	// A refresh still running (TokenFunc, or its hello's send, which
	// fails now that the writer has stopped) ends before the connection
	// counts as ended: without Reconnect Close returns when it does.
	cn.tasks.Wait()
	if !c.opts.Reconnect {
		c.shutdown(err)
	}
}

// gaveUpLocked reports whether sid is a given-up Subscribe's whose drop
// went out on cn and is not yet answered: its frames are consumed.
// Caller holds c.mu.
func (cn *conn) gaveUpLocked(sid string) bool {
	_, ok := cn.gaveUp[sid]
	return ok
}

// addSubWaiterLocked queues w for the next subscribe ack with ref sid. It
// fails once the connection has ended. Caller holds c.mu.
func (cn *conn) addSubWaiterLocked(sid string, w subWaiter) error {
	if cn.err != nil {
		return cn.err
	}
	cn.pending[sid] = append(cn.pending[sid], w)
	return nil
}

// writeMsg writes msg as one text message within the write timeout.
// A failed write leaves the stream in an unknown state (part of the message
// may have been sent), so it ends the connection. Only the writer
// goroutine calls it.
func (cn *conn) writeMsg(msg []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), cn.c.opts.WriteTimeout)
	defer cancel()
	if err := cn.ws.Write(ctx, websocket.MessageText, msg); err != nil {
		select {
		case <-cn.closingc: // close is running the close handshake
		default:
			cn.ws.CloseNow()
		}
		if e := cn.endErr(); e != nil && errors.Is(e, net.ErrClosed) {
			return e
		}
		return fmt.Errorf("client: write: %w", err)
	}
	return nil
}

// outOfStep reports whether ack says the server dropped a frame over its
// rate (X_RATE_LIMITED: the first of a run is answered, the rest of the
// run get no answer) or is missing a seq of this client's (X_SEQ_GAP,
// after such a drop). The server then runs none of this client's later
// mutates until it has the missing one, and a dropped subscribe was never
// taken up.
func outOfStep(ack *frames.Ack) bool {
	return ack.Error != nil && (ack.Error.Code == frames.CodeRateLimited || ack.Error.Code == frames.CodeSeqGap)
}

// startOver ends a connection the server dropped frames on. With
// Reconnect the next connection says hello with the lowest unacknowledged
// seq, then sends every unacknowledged mutate again, in seq order, and
// resubscribes from the cursors, as after any other end; without it the
// Client ends, failing what is still waiting with this error.
func (cn *conn) startOver(ack *frames.Ack) {
	cn.endWith(fmt.Errorf("%w: %s for %q: %s", ErrOutOfStep, ack.Error.Code, ack.Ref, ack.Error.Cause))
}

// endWith cuts the connection from its read loop, which then ends with
// err (the first one given stays). With Reconnect the next connection
// starts over from the lowest unacknowledged seq and the cursors.
func (cn *conn) endWith(err error) {
	if cn.outOfStep != nil {
		return
	}
	cn.outOfStep = err
	cn.rlog.Info("client: starting the connection over", logKeyErr, err)
	cn.closeNow()
}

// newPace returns the writer's limiter for a server that takes rate frames
// a second, burst at once: a tenth below the rate and half the burst, since
// the network may bunch frames the writer spaced, less the token the
// hello took.
func newPace(frameRate float64, burst int64, now time.Time) *rate.Limiter {
	lim := rate.NewLimiter(rate.Limit(0.9*frameRate), int(max(1, burst/2)))
	lim.AllowN(now, 1) // the hello
	return lim
}

// paceWait waits until the writer may send n more frames, or until the
// connection ends (then it returns its error).
func (cn *conn) paceWait(n int) error {
	lim := cn.pace.Load()
	if lim == nil {
		return nil
	}
	var d time.Duration
	now := cn.c.opts.Now()
	for n > 0 { // a raw message (SendRaw) may hold more frames than the burst
		k := min(n, lim.Burst())
		d = max(d, lim.ReserveN(now, k).DelayFrom(now))
		n -= k
	}
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-cn.done:
		return cn.endErr()
	}
}

// hello returns the hello a new connection opens with, its token from
// TokenFunc when set.
func (c *Client) hello(ctx context.Context) (*frames.Hello, error) {
	o := &c.opts
	h := &frames.Hello{
		BuildID:  o.BuildID,
		Resume:   []frames.Cursor{},
		Token:    o.Token,
		ClientID: o.ClientID,
		Epoch:    o.Epoch,
	}
	if o.ClientID != "" {
		// Where this connection's mutates start: the lowest one not yet
		// acknowledged (re-sent first), else the next. Every seq below it
		// has been answered, so a node that expects less (the client
		// published through another node meanwhile) continues there.
		c.mu.Lock()
		seq := c.seq
		for _, m := range c.mutates {
			seq = min(seq, m.seq)
		}
		c.mu.Unlock()
		h.Seq = &seq
	}
	if o.TokenFunc != nil {
		tctx, cancel := context.WithTimeout(ctx, o.WriteTimeout)
		defer cancel()
		tok, err := o.TokenFunc(tctx)
		if err != nil {
			return nil, fmt.Errorf("client: token: %w", err)
		}
		h.Token = tok
	}
	return h, nil
}

// refreshToken answers the server's X_TOKEN_EXPIRED: a hello with a fresh
// token on the same connection. A failure is logged; the server closes the
// session at the end of its grace, and Reconnect then opens a new one
// (whose hello asks TokenFunc again).
func (cn *conn) refreshToken() {
	// Bounded by the connection's life: it ends with the connection
	// (Close included), and the read loop waits for it. hello bounds
	// TokenFunc by WriteTimeout too.
	ctx := cn.life
	h, err := cn.c.hello(ctx)
	if err == nil {
		err = cn.send(ctx, h)
	}
	if err != nil {
		cn.rlog.Warn("client: token refresh failed", "err", err)
	}
}
