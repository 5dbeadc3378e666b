package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/syncgate/syncgate/frames"
)

// conn is one WebSocket connection of a Client: its read loop, its write
// lock and the acks it waits for.
type conn struct {
	// Static after connect returns.
	c     *Client
	ws    *websocket.Conn
	url   string
	hello *frames.Hello // the server's hello; set by the read loop before helloc is closed

	// Signals.
	helloc    chan struct{} // closed by the read loop when the handshake ends; see helloErr
	done      chan struct{} // closed when the read loop has exited
	wake      chan struct{} // one slot: a reconnect frame arrived
	closeOnce sync.Once
	closingc  chan struct{} // closed when we start closing it

	// Owned by the read loop. helloErr is read after helloc is closed.
	gotHello bool
	helloErr error
	rlog     *slog.Logger

	// wmu is the write lock: a one-slot channel so that waiting for it
	// honours ctx. Only its holder writes to ws.
	wmu chan struct{}
	// Guarded by wmu.
	wbuf []byte // encode buffer, reused

	// Guarded by c.mu.
	pending   map[string][]subWaiter // subscribe acks by sid, in send order
	err       error                  // why it ended; set before done is closed
	reconnect *frames.Reconnect      // the last reconnect frame received
	reconAt   time.Time              // when it arrived
	upAt      time.Time              // when it became current
}

// subWaiter handles the ack to one subscribe frame sent on a connection.
// It is called once, without c.mu held: with the ack, or with the
// connection's error when it ends first.
type subWaiter func(ack *frames.Ack, err error)

// maxKeptWriteBuf is the largest encode buffer kept for reuse.
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
		wake:     make(chan struct{}, 1),
		closingc: make(chan struct{}),
		wmu:      make(chan struct{}, 1),
		pending:  make(map[string][]subWaiter),
	}
	c.mu.Lock()
	c.live[cn] = struct{}{}
	c.mu.Unlock()
	c.conns.Go(cn.readLoop)

	hello := &frames.Hello{
		BuildID:  o.BuildID,
		Resume:   []frames.Cursor{},
		Token:    o.Token,
		ClientID: o.ClientID,
		Epoch:    o.Epoch,
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

// close closes the connection with 1000 and waits for the close handshake
// (bounded by the websocket package).
func (cn *conn) close() error {
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
	c.mu.Lock()
	if ws := cn.pending[f.Ref]; len(ws) > 0 {
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
	if ok {
		delete(c.mutates, f.Ref)
		if len(c.mutates) == 0 && c.idle != nil {
			close(c.idle)
			c.idle = nil
		}
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
	case !ok && c.opts.Reconnect && len(f.Ref) > len(c.keyPrefix) && f.Ref[:len(c.keyPrefix)] == c.keyPrefix:
		// The second ack of a mutate sent on two connections (a
		// take-over re-sent it): the first one counted.
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
	if !c.opts.Reconnect {
		c.shutdown(err)
	}
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

// send encodes f and writes it as one message under the write lock.
func (cn *conn) send(ctx context.Context, f frames.Frame) error {
	if err := cn.lockWrite(ctx); err != nil {
		return err
	}
	defer cn.unlockWrite()
	if cap(cn.wbuf) > maxKeptWriteBuf {
		cn.wbuf = nil
	}
	msg, err := frames.AppendEncode(cn.wbuf[:0], f)
	if err != nil {
		return fmt.Errorf("client: encode %s: %w", f.FrameType(), err)
	}
	cn.wbuf = msg
	return cn.writeLocked(msg)
}

// sendRaw writes msg under the write lock.
func (cn *conn) sendRaw(ctx context.Context, msg []byte) error {
	if err := cn.lockWrite(ctx); err != nil {
		return err
	}
	defer cn.unlockWrite()
	return cn.writeLocked(msg)
}

// lockWrite takes the write lock, giving up when ctx ends or the
// connection has ended.
func (cn *conn) lockWrite(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case cn.wmu <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-cn.done:
		return cn.endErr()
	}
	// Both may have become ready while we waited for the lock.
	if err := ctx.Err(); err != nil {
		cn.unlockWrite()
		return err
	}
	if err := cn.endErr(); err != nil {
		cn.unlockWrite()
		return err
	}
	return nil
}

func (cn *conn) unlockWrite() { <-cn.wmu }

// writeLocked writes msg as one text message within the write timeout.
// A failed write leaves the stream in an unknown state (part of the message
// may have been sent), so it ends the connection. Caller holds the write
// lock.
func (cn *conn) writeLocked(msg []byte) error {
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
