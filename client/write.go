package client

import (
	"context"

	"github.com/syncgate/syncgate/frames"
)

// Send encodes f and writes it as one text message on the current
// connection. It is meant for tests and for frames this package has no
// method for: it assigns no seq, waits for no ack (any ack goes to
// [Options.OnFrame]) and is not re-sent after a reconnect. While a
// reconnecting Client has no connection it returns [ErrNotConnected].
//
// ctx bounds the wait for the write lock. The write itself is bounded by
// [Options.WriteTimeout], not by ctx, so a cancelled caller never cuts a
// message in half.
func (c *Client) Send(ctx context.Context, f frames.Frame) error {
	cn, err := c.sendConn()
	if err != nil {
		return err
	}
	return cn.send(ctx, f)
}

// SendRaw writes msg as one text message, unchanged: several frames may be
// joined with '\n', and msg need not be valid. Like [Client.Send] it is
// meant for tests.
func (c *Client) SendRaw(ctx context.Context, msg []byte) error {
	cn, err := c.sendConn()
	if err != nil {
		return err
	}
	return cn.sendRaw(ctx, msg)
}

// sendConn returns the current connection, or why there is none.
func (c *Client) sendConn() (*conn, error) {
	cn, err := c.current()
	switch {
	case err != nil:
		return nil, err
	case cn == nil && !c.opts.Reconnect:
		return nil, c.lastConn().endErr()
	case cn == nil:
		return nil, ErrNotConnected
	}
	return cn, nil
}
