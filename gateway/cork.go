package gateway

import (
	"net"
	"sync"
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
// It also keeps a write deadline on the socket: every write that reaches
// the socket first makes sure the deadline is at least three quarters of
// timeout away, re-arming it to a full timeout when not. One SetWriteDeadline
// per few seconds instead of two per message, and no stale deadline can fail
// a pong written after a quiet spell.
type corkConn struct {
	net.Conn
	timeout time.Duration // set before the first write; 0 means no deadline

	mu       sync.Mutex
	corked   bool        // guarded by mu
	small    []byte      // guarded by mu: copies of short writes, pooled while corked
	parts    net.Buffers // guarded by mu: pending writes in order
	deadline time.Time   // guarded by mu: the write deadline last set
}

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
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.corked {
		if err := c.armLocked(); err != nil {
			return 0, err
		}
		return c.Conn.Write(p)
	}
	if len(p) > writeBufferSize {
		c.parts = append(c.parts, p)
		return len(p), nil
	}
	if c.small == nil {
		c.small = (*corkBufPool.Get().(*[]byte))[:0]
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

// uncork writes everything collected since cork in one writev.
func (c *corkConn) uncork() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.corked = false
	var err error
	if len(c.parts) > 0 {
		if err = c.armLocked(); err == nil {
			bufs := c.parts // WriteTo consumes the slice header
			_, err = bufs.WriteTo(c.Conn)
		}
	}
	clear(c.parts)
	c.parts = c.parts[:0]
	if cap(c.parts) > 16 {
		c.parts = nil
	}
	if c.small != nil {
		if cap(c.small) == 2*writeBufferSize {
			b := c.small[:0]
			corkBufPool.Put(&b)
		}
		c.small = nil
	}
	return err
}

// Close sends what is still collected (a close frame coder/websocket echoed
// while the writer held the cork, say) before it closes the connection. The
// flush is best effort and bounded: skipped if the writer is writing right
// now (closing the socket is what unblocks it), and given one second.
func (c *corkConn) Close() error {
	if c.mu.TryLock() {
		if len(c.parts) > 0 {
			_ = c.Conn.SetWriteDeadline(time.Now().Add(time.Second))
			bufs := c.parts
			_, _ = bufs.WriteTo(c.Conn)
			clear(c.parts)
			c.parts = c.parts[:0]
		}
		c.corked = false
		c.mu.Unlock()
	}
	return c.Conn.Close()
}
