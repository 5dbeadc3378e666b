package client

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"net"
	"slices"

	"github.com/coder/websocket"

	"github.com/syncgate/syncgate/frames"
)

// readLoop reads messages until the connection ends, dispatching each frame
// in order, then fails everything still waiting. It is the only goroutine a
// Client starts; Close waits for it through c.done.
func (c *Client) readLoop() {
	var err error
	for {
		var typ websocket.MessageType
		var msg []byte
		// No ctx deadline: the loop ends when the connection does (Close,
		// a server close, or a network error).
		typ, msg, err = c.conn.Read(context.Background())
		if err != nil {
			break
		}
		if typ != websocket.MessageText {
			c.rlog.Debug("client: ignoring binary message", "len", len(msg))
			continue
		}
		frames.Split(msg, func(line []byte) bool {
			f, err := frames.Decode(line)
			if err != nil {
				c.rlog.Debug("client: ignoring undecodable frame", logKeyErr, err)
				return true
			}
			c.dispatch(f)
			return true
		})
	}
	c.shutdown(err)
}

// dispatch routes one frame. It runs on the read loop.
func (c *Client) dispatch(f frames.Frame) {
	switch f := f.(type) {
	case *frames.Hello:
		c.handleFrameHello(f)
	case *frames.Ack:
		c.handleFrameAck(f)
	case *frames.Snapshot:
		c.handleFrameSnapshot(f)
	case *frames.Patch:
		c.handleFramePatch(f)
	default:
		c.onFrame(f)
	}
}

// onFrame hands f to Options.OnFrame, if set.
func (c *Client) onFrame(f frames.Frame) {
	if c.opts.OnFrame != nil {
		c.opts.OnFrame(f)
	}
}

func (c *Client) handleFrameHello(f *frames.Hello) {
	if c.gotHello {
		c.onFrame(f)
		return
	}
	c.gotHello = true
	c.hello = f
	if f.SessionID != nil {
		c.rlog = c.rlog.With(logKeySession, *f.SessionID)
	}
	close(c.helloc)
}

func (c *Client) handleFrameAck(f *frames.Ack) {
	c.mu.Lock()
	w, ok := c.pending[f.Ref]
	if ok {
		delete(c.pending, f.Ref)
	}
	c.mu.Unlock()
	switch {
	case ok:
		w.fn(f, nil)
	case !c.gotHello && f.Error != nil:
		// The server refused the hello (bad token, bad field, ...).
		c.gotHello = true
		c.helloErr = ackError(f)
		close(c.helloc)
	default:
		c.onFrame(f)
	}
}

func (c *Client) handleFrameSnapshot(f *frames.Snapshot) {
	c.mu.Lock()
	s, ok := c.subs[f.SID]
	if ok && !s.settled {
		s.snapshot = f // read after ready is closed
		s.mu.Lock()
		s.cursor = f.Cursor
		s.mu.Unlock()
		s.settleLocked(nil)
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	c.onFrame(f) // a later snapshot, or one nobody waits for
}

func (c *Client) handleFramePatch(f *frames.Patch) {
	c.mu.Lock()
	s, ok := c.subs[f.SID]
	live := ok && s.settled
	c.mu.Unlock()
	if !live {
		c.onFrame(f)
		return
	}
	s.deliver(f)
}

// shutdown records why the connection ended and fails everything waiting
// on it. It runs once, at the end of the read loop.
func (c *Client) shutdown(readErr error) {
	var err error
	select {
	case <-c.closing:
		err = net.ErrClosed
	default:
		err = fmt.Errorf("client: connection ended: %w", readErr)
		c.rlog.Debug("client: connection ended", logKeyErr, readErr)
		c.conn.CloseNow() // release it whatever the read error was
	}

	c.mu.Lock()
	c.err = err
	pending := c.pending
	subs := c.subs
	c.pending = nil
	c.subs = nil
	c.mu.Unlock()

	// Fail waiters in the order they were sent, as their acks would have
	// arrived.
	ws := slices.SortedFunc(maps.Values(pending), func(a, b *waiter) int {
		return cmp.Compare(a.order, b.order)
	})
	for _, w := range ws {
		w.fn(nil, err)
	}
	for _, s := range subs {
		c.mu.Lock()
		if !s.settled {
			s.settleLocked(err)
		}
		c.mu.Unlock()
		if s.patches != nil {
			close(s.patches)
		}
	}
	close(c.done)
}
