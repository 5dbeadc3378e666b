package client

import (
	"context"
	"fmt"

	"github.com/coder/websocket"

	"github.com/syncgate/syncgate/frames"
)

// maxKeptWriteBuf is the largest encode buffer kept for reuse.
const maxKeptWriteBuf = 64 << 10

// Send encodes f and writes it as one text message. It is meant for tests
// and for frames this package has no method for: it assigns no seq and
// waits for no ack (any ack goes to [Options.OnFrame]).
//
// ctx bounds the wait for the write lock. The write itself is bounded by
// [Options.WriteTimeout], not by ctx, so a cancelled caller never cuts a
// message in half.
func (c *Client) Send(ctx context.Context, f frames.Frame) error {
	if err := c.lockWrite(ctx); err != nil {
		return err
	}
	defer c.unlockWrite()
	msg, err := c.encodeLocked(f)
	if err != nil {
		return err
	}
	return c.writeLocked(msg)
}

// SendRaw writes msg as one text message, unchanged: several frames may be
// joined with '\n', and msg need not be valid. Like [Client.Send] it is
// meant for tests.
func (c *Client) SendRaw(ctx context.Context, msg []byte) error {
	if err := c.lockWrite(ctx); err != nil {
		return err
	}
	defer c.unlockWrite()
	return c.writeLocked(msg)
}

// lockWrite takes the write lock, giving up when ctx ends or the
// connection has ended.
func (c *Client) lockWrite(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case c.wmu <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-c.done:
		return c.Err()
	}
	// Both may have become ready while we waited for the lock.
	if err := ctx.Err(); err != nil {
		c.unlockWrite()
		return err
	}
	if err := c.Err(); err != nil {
		c.unlockWrite()
		return err
	}
	return nil
}

func (c *Client) unlockWrite() { <-c.wmu }

// encodeLocked encodes f into the reusable buffer; the result is valid
// until the write lock is released. Caller holds the write lock.
func (c *Client) encodeLocked(f frames.Frame) ([]byte, error) {
	if cap(c.wbuf) > maxKeptWriteBuf {
		c.wbuf = nil
	}
	msg, err := frames.AppendEncode(c.wbuf[:0], f)
	if err != nil {
		return nil, fmt.Errorf("client: encode %s: %w", f.FrameType(), err)
	}
	c.wbuf = msg
	return msg, nil
}

// writeLocked writes msg as one text message within the write timeout.
// A failed write leaves the stream in an unknown state (part of the message
// may have been sent), so it ends the connection. Caller holds the write
// lock.
func (c *Client) writeLocked(msg []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.WriteTimeout)
	defer cancel()
	if err := c.conn.Write(ctx, websocket.MessageText, msg); err != nil {
		select {
		case <-c.closing: // Close is running the close handshake
		default:
			c.conn.CloseNow()
		}
		return fmt.Errorf("client: write: %w", err)
	}
	return nil
}
