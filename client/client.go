package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/syncgate/syncgate/frames"
)

// Defaults for zero [Options] fields.
const (
	DefaultReadLimit    = 4 << 20          // bytes per inbound message
	DefaultWriteTimeout = 10 * time.Second // per outbound message
)

// patchBuffer is the capacity of a Subscription's Patches channel.
const patchBuffer = 1024

// Log attribute keys.
const (
	logKeySession = "session"
	logKeyErr     = "err"
)

// Options configures a [Client]. The zero value is valid.
type Options struct {
	// BuildID is the app build sent in hello. Defaults to "".
	BuildID string

	// ClientID, if set, names an idempotent producer: the server then counts
	// mutate seqs per (ClientID, Epoch) instead of per session. Every Client
	// starts at seq 0, so a new Client with the same ClientID must use a
	// higher Epoch. Defaults to "" (seqs counted per session).
	ClientID string

	// Epoch is the producer epoch sent with ClientID. Defaults to 0.
	Epoch int64

	// Token is the credential sent in hello. Defaults to "" (none).
	Token string

	// Header is sent with the upgrade request (for example Origin).
	// Defaults to none.
	Header http.Header

	// HTTPClient performs the upgrade request. Defaults to
	// http.DefaultClient.
	HTTPClient *http.Client

	// ReadLimit is the largest inbound WebSocket message in bytes; a larger
	// one ends the connection with 1009. Zero or negative means
	// DefaultReadLimit (4 MiB).
	ReadLimit int64

	// WriteTimeout bounds each outbound message. A write that times out
	// ends the connection, since part of the message may be on the wire.
	// Zero or negative means DefaultWriteTimeout (10s).
	WriteTimeout time.Duration

	// Logger receives debug logs (undecodable frames, connection end).
	// Defaults to discarding them.
	Logger *slog.Logger

	// OnFrame, if set, is called from the read loop for every frame the
	// client does not consume itself: reconnect, update-available, presence,
	// rebase, and acks, snapshots and patches nobody waits for (for example
	// the ack of a mutate whose Publish was cancelled, or of a frame written
	// with Send). It must not block for long; see the package doc.
	// Defaults to dropping such frames.
	OnFrame func(frames.Frame)
}

// cloneWithDefaults returns a copy of opts (which may be nil) with zero
// fields set to their defaults; the caller's value is never modified.
func cloneWithDefaults(opts *Options) Options {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.ReadLimit <= 0 {
		o.ReadLimit = DefaultReadLimit
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = DefaultWriteTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// Client is one session with a syncgate server, opened by [Dial].
//
// All methods may be called concurrently. Lock order (outermost first): the
// write lock wmu, then mu, then a Subscription's mu.
type Client struct {
	// Static after Dial returns.
	conn      *websocket.Conn
	opts      Options
	hello     *frames.Hello // the server's hello; set by the read loop before helloc is closed
	keyPrefix string        // mutate keys are keyPrefix + seq

	// Signals.
	helloc    chan struct{} // closed by the read loop when the handshake ends; see helloErr
	closing   chan struct{} // closed when Close starts
	done      chan struct{} // closed when the read loop has exited
	closeOnce sync.Once
	closeErr  error // result of the first Close

	// Owned by the read loop. helloErr is read by Dial after helloc is closed.
	gotHello bool
	helloErr error // an ack error received instead of the server's hello
	rlog     *slog.Logger

	// wmu is the write lock: a one-slot channel so that waiting for it
	// honours ctx. Only its holder writes to conn.
	wmu chan struct{}
	// Guarded by wmu.
	seq  int64  // seq of the next mutate
	wbuf []byte // encode buffer, reused

	mu sync.Mutex
	// Guarded by mu.
	pending    map[string]*waiter       // by ack ref: a subscribe's sid or a mutate's key
	subs       map[string]*Subscription // by sid
	nextSID    int64
	nextWaiter uint64
	err        error // why the connection ended; set once, before done is closed
}

// A waiter is a request waiting for its ack. fn is called exactly once,
// without mu held: from the read loop with the ack, or with the connection's
// error when it ends. A waiter removed with removeWaiter is never called.
type waiter struct {
	fn    func(ack *frames.Ack, err error)
	order uint64 // registration order; set by addWaiterLocked
}

// Dial connects to url (ws://host/v1/ws), sends hello and waits for the
// server's hello. opts may be nil. ctx bounds the upgrade and the handshake
// only; the connection lives until [Client.Close] or the server ends it.
//
// If the server answers the hello with an error ack, Dial returns it as a
// *frames.Error.
func Dial(ctx context.Context, url string, opts *Options) (*Client, error) {
	o := cloneWithDefaults(opts)
	conn, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{
		HTTPClient: o.HTTPClient,
		HTTPHeader: o.Header,
	})
	if err != nil {
		return nil, fmt.Errorf("client: dial %s: %w", url, err)
	}
	conn.SetReadLimit(o.ReadLimit)

	c := &Client{
		conn:    conn,
		opts:    o,
		rlog:    o.Logger,
		helloc:  make(chan struct{}),
		closing: make(chan struct{}),
		done:    make(chan struct{}),
		wmu:     make(chan struct{}, 1),
		pending: make(map[string]*waiter),
		subs:    make(map[string]*Subscription),
	}
	go c.readLoop()

	hello := &frames.Hello{
		BuildID:  o.BuildID,
		Resume:   []frames.Cursor{},
		Token:    o.Token,
		ClientID: o.ClientID,
		Epoch:    o.Epoch,
	}
	if err := c.Send(ctx, hello); err != nil {
		c.Close()
		return nil, fmt.Errorf("client: send hello: %w", err)
	}
	select {
	case <-c.helloc:
	case <-c.done:
		return nil, fmt.Errorf("client: waiting for hello: %w", c.Err())
	case <-ctx.Done():
		c.Close()
		return nil, fmt.Errorf("client: waiting for hello: %w", ctx.Err())
	}
	if c.helloErr != nil {
		c.Close()
		return nil, c.helloErr
	}
	c.keyPrefix = c.SessionID() + ":"
	return c, nil
}

// SessionID returns the session id the server assigned in its hello, or ""
// if it sent none.
func (c *Client) SessionID() string {
	if c.hello.SessionID == nil {
		return ""
	}
	return *c.hello.SessionID
}

// ServerHello returns the server's hello. The caller must not modify it.
func (c *Client) ServerHello() *frames.Hello {
	return c.hello
}

// Done returns a channel that is closed when the connection has ended and
// the read loop has exited.
func (c *Client) Done() <-chan struct{} {
	return c.done
}

// Err returns why the connection ended, or nil while it is up. After
// [Client.Close] it is net.ErrClosed; after a server close,
// websocket.CloseStatus(err) is the server's close code.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close closes the connection with 1000 (normal closure) and returns once
// the read loop has exited, which waits for a running callback to return.
// Calls still waiting for an ack fail with net.ErrClosed. Close is
// idempotent: later calls return nil.
func (c *Client) Close() error {
	first := false
	c.closeOnce.Do(func() {
		first = true
		close(c.closing)
		err := c.conn.Close(websocket.StatusNormalClosure, "")
		if err != nil && !errors.Is(err, net.ErrClosed) {
			c.closeErr = fmt.Errorf("client: close: %w", err)
		}
	})
	<-c.done
	if !first {
		return nil
	}
	return c.closeErr
}

// addWaiter registers w for ack ref ref. It fails once the connection has
// ended, and if ref is already pending.
func (c *Client) addWaiter(ref string, w *waiter) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.addWaiterLocked(ref, w)
}

func (c *Client) addWaiterLocked(ref string, w *waiter) error {
	if c.err != nil {
		return c.err
	}
	if _, dup := c.pending[ref]; dup {
		return fmt.Errorf("client: ref %q already waiting for an ack", ref)
	}
	c.nextWaiter++
	w.order = c.nextWaiter
	c.pending[ref] = w
	return nil
}

// removeWaiter unregisters w and reports whether it was still registered;
// if not, w.fn has been called or is about to be.
func (c *Client) removeWaiter(ref string, w *waiter) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.removeWaiterLocked(ref, w)
}

func (c *Client) removeWaiterLocked(ref string, w *waiter) bool {
	if c.pending[ref] != w {
		return false
	}
	delete(c.pending, ref)
	return true
}

// ackError returns the ack's error as a *frames.Error, or nil.
func ackError(a *frames.Ack) error {
	if a.Error == nil {
		return nil
	}
	return &frames.Error{
		Code:  a.Error.Code,
		Cause: a.Error.Cause,
		Fix:   a.Error.Fix,
		Docs:  a.Error.Docs,
		Ref:   a.Ref,
	}
}
