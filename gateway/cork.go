package gateway

import (
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// writeBufferSize is the size of the bufio.Writer coder/websocket writes
// frames through. It only has to hold a frame header plus a control frame;
// data messages bypass it while corked (see corkConn), so a session holds a
// few hundred bytes for writing instead of net/http's 4 KiB.
const writeBufferSize = 256

// corkConn is the connection under coder/websocket. While the session's
// writer holds it corked, the header and payload writes of a message are
// collected and leave in one writev when it uncorks: one syscall per
// message whatever its size, with a small write buffer. Uncorked (control
// frames written by the reader, close frames), writes pass straight through.
//
// A writer that must not wait (a writerPool worker) uncorks with wait
// false: the writev then takes what the socket's buffer has room for, and
// the rest is kept, copied, as pending; flush writes it (waiting), and every
// other write goes after it, so the stream stays in order.
//
// It also keeps a write deadline on the socket: every write that reaches
// the socket first makes sure the deadline is at least three quarters of
// timeout away, re-arming it to a full timeout when not. One SetWriteDeadline
// per few seconds instead of two per message, and no stale deadline can fail
// a pong written after a quiet spell.
type corkConn struct {
	net.Conn
	raw     syscall.RawConn // for writes that do not wait; nil if the connection has none (TLS)
	timeout time.Duration   // set before the first write; 0 means no deadline

	direct atomic.Int32 // uncorked writes in progress (the reader's pongs and close echoes)

	mu       sync.Mutex
	corked   bool        // guarded by mu
	pending  bool        // guarded by mu: parts start with the unwritten rest of a message (an owned copy)
	lost     error       // guarded by mu: why a pending rest was dropped unwritten (see flush); then the stream is broken
	small    []byte      // guarded by mu: copies of short writes
	smallBuf *[]byte     // guarded by mu: the pooled buffer small started in, returned at uncork
	parts    net.Buffers // guarded by mu: pending writes in order
	deadline time.Time   // guarded by mu: the write deadline last set
}

// newCorkConn wraps c, finding its raw connection for writes that do not
// wait.
func newCorkConn(c net.Conn) *corkConn {
	return &corkConn{Conn: c, raw: rawConnOf(c)}
}

// nonBlocking reports whether uncork(false) can write without waiting.
func (c *corkConn) nonBlocking() bool { return c.raw != nil }

// busy reports whether a write is in progress outside the session's
// writer: coder/websocket's reader answering a ping or echoing a close. It
// holds the library's frame lock while it writes, and on a full socket
// that write waits, so a writer that must not wait leaves the connection
// to one that may. (Called by the writer, so its own writes never count.)
func (c *corkConn) busy() bool { return c.direct.Load() > 0 }

// armLocked keeps the write deadline far enough ahead of now.
func (c *corkConn) armLocked() error {
	if c.timeout <= 0 {
		return nil
	}
	now := time.Now()
	if c.deadline.Sub(now) >= c.timeout*3/4 {
		return nil
	}
	c.deadline = now.Add(c.timeout)
	return c.Conn.SetWriteDeadline(c.deadline)
}

var corkBufPool = sync.Pool{New: func() any { b := make([]byte, 0, 2*writeBufferSize); return &b }}

// Write collects p while corked. A write longer than writeBufferSize is the
// caller's own slice (bufio passes large writes through) and is referenced
// until uncork, which the session calls before that slice is reused; a
// shorter one may be bufio's buffer, reused on return, so it is copied.
func (c *corkConn) Write(p []byte) (int, error) {
	c.direct.Add(1) // only while uncorked does it matter: see busy
	defer c.direct.Add(-1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.corked {
		if err := c.armLocked(); err != nil {
			return 0, err
		}
		if c.pending {
			if err := c.writeAllLocked(); err != nil {
				c.lost = err
				return 0, err
			}
		}
		return c.Conn.Write(p)
	}
	if len(p) > writeBufferSize {
		c.parts = append(c.parts, p)
		return len(p), nil
	}
	if c.smallBuf == nil {
		c.smallBuf = corkBufPool.Get().(*[]byte)
		c.small = (*c.smallBuf)[:0]
	}
	start := len(c.small)
	if cap(c.small)-start < len(p) {
		// Growing would move bytes that parts already points at: give the
		// earlier copies their own slice and start a new one.
		c.small = make([]byte, 0, max(2*writeBufferSize, len(p)))
		start = 0
	}
	c.small = append(c.small, p...)
	c.parts = append(c.parts, c.small[start:len(c.small):len(c.small)])
	return len(p), nil
}

func (c *corkConn) cork() {
	c.mu.Lock()
	c.corked = true
	c.mu.Unlock()
}

// uncork writes everything collected since cork in one writev. With wait
// it waits for room in the socket as long as the write deadline allows.
// Without (possible when nonBlocking), it writes what the socket takes now;
// if that is not all, the rest is kept (copied, so the caller may reuse its
// buffers), blocked is true, and the caller must call flush, from a
// goroutine that may wait, before it writes again.
func (c *corkConn) uncork(wait bool) (blocked bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.corked = false
	if len(c.parts) > 0 {
		if err = c.armLocked(); err == nil {
			if wait || c.raw == nil {
				err = c.writeAllLocked()
			} else {
				blocked, err = c.writeNowLocked()
			}
		}
	}
	if !blocked {
		c.resetPartsLocked()
	}
	// Everything small held is written or copied: its buffer goes back.
	if c.smallBuf != nil {
		corkBufPool.Put(c.smallBuf)
		c.smallBuf = nil
	}
	c.small = nil
	return blocked, err
}

// flush writes the rest a non-waiting uncork left, waiting for the socket
// as long as the write deadline allows. It returns nil only once that
// rest is written, by flush or by an uncorked write before it; if the
// rest was dropped (the connection closed, or an uncorked write failed
// in it), the stream ends inside a message and flush returns why.
func (c *corkConn) flush() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.pending {
		return c.lost
	}
	if err := c.armLocked(); err != nil {
		return err
	}
	return c.writeAllLocked()
}

// writeAllLocked writes parts, waiting as needed, and empties them.
func (c *corkConn) writeAllLocked() error {
	bufs := c.parts // WriteTo consumes the slice header
	_, err := bufs.WriteTo(c.Conn)
	c.resetPartsLocked()
	return err
}

// writeNowLocked writes as much of parts as the socket takes without
// waiting. When the socket is full it keeps the rest as one owned copy and
// reports blocked.
func (c *corkConn) writeNowLocked() (blocked bool, err error) {
	bufs := c.parts // advanced as written; c.parts keeps its array for reuse
	for len(bufs) > 0 {
		n, full, err := c.writevNowLocked(bufs)
		advance(&bufs, n)
		if err != nil {
			c.resetPartsLocked()
			return false, err
		}
		if (full || n == 0) && len(bufs) > 0 {
			size := 0
			for _, b := range bufs {
				size += len(b)
			}
			rest := make([]byte, 0, size)
			for _, b := range bufs {
				rest = append(rest, b...)
			}
			clear(c.parts)
			c.parts = append(c.parts[:0], rest)
			c.pending = true
			return true, nil
		}
	}
	return false, nil
}

// resetPartsLocked empties parts, letting a large array go.
func (c *corkConn) resetPartsLocked() {
	clear(c.parts)
	c.parts = c.parts[:0]
	if cap(c.parts) > 16 {
		c.parts = nil
	}
	c.pending = false
}

// advance drops the first n bytes of bufs. It reslices *bufs and its first
// remaining element in place.
func advance(bufs *net.Buffers, n int) {
	b := *bufs
	for n > 0 && len(b) > 0 {
		if n < len(b[0]) {
			b[0] = b[0][n:]
			break
		}
		n -= len(b[0])
		b = b[1:]
	}
	*bufs = b
}

// Close sends what is still collected (a close frame coder/websocket echoed
// while the writer held the cork, say) before it closes the connection. The
// flush is best effort and bounded: skipped if the writer is writing right
// now (closing the socket is what unblocks it), and given one second, or
// no wait at all on a socket the shared writers write (nonBlocking).
func (c *corkConn) Close() error {
	if c.mu.TryLock() {
		switch {
		case len(c.parts) == 0:
		case c.raw != nil:
			// Without waiting: a shared writer may be about to take mu
			// for its next message (between cork and uncork).
			wasPending := c.pending
			if blocked, err := c.writeNowLocked(); wasPending && (blocked || err != nil) {
				c.lost = net.ErrClosed
			}
			c.resetPartsLocked()
		default:
			_ = c.Conn.SetWriteDeadline(time.Now().Add(time.Second))
			bufs := c.parts
			_, _ = bufs.WriteTo(c.Conn)
			c.resetPartsLocked()
		}
		c.corked = false
		c.mu.Unlock()
	}
	return c.Conn.Close()
}
