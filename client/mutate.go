package client

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/syncgate/syncgate/frames"
)

// MutationPublish is the mutate name of [Client.Publish].
const MutationPublish = "publish"

// Publish publishes data (a JSON value) to topic and waits for the ack. It
// returns the ack's lsn ("" if the server gave none), or a *frames.Error if
// the ack carries an error. A publish larger than the server accepts
// fails with [ErrTooLarge], sending nothing.
//
// If ctx ends first, Publish returns ctx.Err(); the message may still be
// published, and its ack goes to [Options.OnFrame].
func (c *Client) Publish(ctx context.Context, topic string, data json.RawMessage) (lsn string, err error) {
	input, err := frames.AppendPublishInput(nil, topic, data)
	if err != nil {
		return "", fmt.Errorf("client: %w", err)
	}
	ack, err := c.Mutate(ctx, MutationPublish, input)
	if err != nil {
		return "", err
	}
	return ackLSN(ack), nil
}

// PublishAsync publishes data to topic without waiting for the ack, so many
// publishes may be in flight. It returns once the mutate is queued for the
// connection's writer (which batches queued frames, see
// [Options.BatchBytes]); done
// is then called exactly once from the read loop, in ack order, with the
// ack's lsn or error (a *frames.Error, or the connection's error if it ends
// first). If PublishAsync returns an error, done is never called. done must
// not block for long (see the package doc).
//
// With [Options.Reconnect], while there is no connection or a take-over
// waits for the old connection's acks (see the package doc,
// Reconnecting), PublishAsync returns once the mutate is recorded, without
// waiting for either: it is sent, in seq order, once a connection can
// take it, and done is called as above. The mutates a take-over holds
// count against the write queue's bound as queued ones do: once they fill
// it, PublishAsync waits for the take-over to send them.
//
// ctx bounds only the wait for the send lock and for room in the write
// queue (see [Options.BatchBytes]); a PublishAsync that fails on ctx used
// no seq and sent nothing. PublishAsync may be called from many goroutines;
// seqs go on the wire in the order the calls take the send lock.
func (c *Client) PublishAsync(ctx context.Context, topic string, data json.RawMessage, done func(lsn string, err error)) error {
	tail, err := frames.NewPublishTail(topic, data)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	encode := func(key string, seq int64) ([]byte, error) {
		return frames.AppendPublishMutate(make([]byte, 0, mutateRoom+len(key)+tail.Len()), key, seq, tail), nil
	}
	_, err = c.sendMutate(ctx, encode, func(a *frames.Ack, err error) {
		if err == nil {
			err = ackError(a)
		}
		if err != nil {
			done("", err)
			return
		}
		done(ackLSN(a), nil)
	})
	return err
}

// Mutate runs the mutation name with input (a JSON value) and waits for the
// ack. The Client assigns the key and seq. If the ack carries an error,
// Mutate returns the ack together with that error as a *frames.Error.
// A name that is empty or over 256 bytes, and a frame larger than the
// server accepts ([ErrTooLarge]), fail before any seq is used.
//
// If ctx ends first, Mutate returns ctx.Err(); the mutation may still be
// applied (with Reconnect it is still re-sent on a new connection until
// acknowledged, since its seq is used), and its ack goes to
// [Options.OnFrame].
func (c *Client) Mutate(ctx context.Context, name string, input json.RawMessage) (*frames.Ack, error) {
	type result struct {
		ack *frames.Ack
		err error
	}
	if name == "" || len(name) > maxNameLen {
		// The server refuses it as a frame (X_BAD_FIELD), before its
		// producer sees the seq: a seq spent here would be a gap.
		return nil, fmt.Errorf("client: mutate name of %d bytes: want 1 to %d", len(name), maxNameLen)
	}
	resc := make(chan result, 1)
	encode := func(key string, seq int64) ([]byte, error) {
		return frames.AppendEncode(make([]byte, 0, mutateRoom+len(key)+len(name)+len(input)), &frames.Mutate{Key: key, Seq: seq, Name: name, Input: input})
	}
	m, err := c.sendMutate(ctx, encode, func(a *frames.Ack, err error) {
		resc <- result{a, err}
	})
	if err != nil {
		return nil, err
	}
	var r result
	select {
	case r = <-resc:
	case <-ctx.Done():
		if c.abandonMutation(m) {
			return nil, ctx.Err()
		}
		r = <-resc // answered meanwhile
	}
	if r.err != nil {
		return nil, r.err
	}
	return r.ack, ackError(r.ack)
}

// maxNameLen is the longest mutate name the protocol allows.
const maxNameLen = 256

// mutateRoom is what a mutate frame needs besides its key, name and input
// (or a publish's tail), so that encoding it allocates once.
const mutateRoom = 64

// sendMutate waits for room in the current connection's write queue,
// assigns the next seq and its key, encodes the mutate with them, records
// the mutation with fn as its ack waiter and queues it on the connection,
// all under the send lock, so seqs reach the wire in order. If it returns
// an error, fn is never called; if encode fails, the seq is not used.
//
// With Reconnect a connection whose writes have stopped, or no
// connection, is not an error: the mutation is re-sent on the next
// connection. Nor is a take-over waiting for the old connection's acks:
// the mutation is recorded but held, neither sent nor waited for, and the
// take-over sends it (see takeOver); what is held counts against the
// write queue's bound like what is queued.
func (c *Client) sendMutate(ctx context.Context, encode func(key string, seq int64) ([]byte, error), fn func(*frames.Ack, error)) (*mutation, error) {
	h, err := c.lockMutate(ctx)
	if err != nil {
		return nil, err // nothing recorded, the seq not used
	}
	defer c.unlockSend()
	held := h != nil

	seq := c.seq
	key := c.keyPrefix + strconv.FormatInt(seq, 10)
	msg, err := encode(key, seq)
	if err != nil {
		return nil, fmt.Errorf("client: encode mutate: %w", err) // seq not used
	}
	if lim := c.maxMessage(); lim > 0 && int64(len(msg)) > lim {
		// The server would close every connection it is sent on (1009),
		// and with Reconnect it would be re-sent on each, forever.
		return nil, fmt.Errorf("%w: a mutate of %d bytes, over the server's %d (hello.maxMessage)", ErrTooLarge, len(msg), lim) // seq not used
	}
	m := &mutation{seq: seq, key: key, msg: msg, fn: fn}
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, err
	}
	cn := c.cur
	if cn == nil && !c.opts.Reconnect {
		c.mu.Unlock()
		return nil, c.lastConn().endErr()
	}
	if held {
		cn = nil // the take-over sends it after the old connection's answers
		h.bytes += len(msg)
	}
	c.mutates[key] = m
	// From here the seq counts as sent: a failed write ends the connection.
	// (Under mu too, so that hello can read it: see Client.hello.)
	c.seq++
	c.mu.Unlock()
	if cn == nil {
		return m, nil // queued until a connection takes over (or the hold ends)
	}
	err = cn.post(msg)
	if err != nil && !c.opts.Reconnect && c.takeMutation(m) {
		return nil, err
	}
	// Queued, or the connection's writes had stopped but its end already
	// claimed the mutation (or will re-send it): fn reports the outcome.
	// A write that fails later ends the connection, which fails or
	// re-sends the mutation in the same way.
	return m, nil
}

// lockMutate takes the send lock for a mutate once there is room for it:
// in the current connection's write queue or, while a take-over holds
// mutates, among those held (queueLimit bytes), and returns the hold, or
// nil. Room among the held comes only when the take-over sends them,
// which needs the send lock: that wait is made without it.
func (c *Client) lockMutate(ctx context.Context) (*mutateHold, error) {
	for {
		if err := c.lockSend(ctx); err != nil {
			return nil, err
		}
		c.mu.Lock()
		h := c.hold // set and cleared under the send lock: it stays
		full := h != nil && h.bytes >= c.queueLimit()
		c.mu.Unlock()
		if h == nil {
			if err := c.waitSendSpace(ctx); err != nil {
				c.unlockSend()
				return nil, err
			}
			return nil, nil
		}
		if !full {
			return h, nil
		}
		c.unlockSend()
		select {
		case <-h.released:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-c.done:
			return nil, c.Err()
		}
	}
}

// maxMessage returns the largest client message the latest connection's
// server accepts, or 0 if it did not say.
func (c *Client) maxMessage() int64 {
	if cn := c.lastConn(); cn != nil && cn.hello != nil {
		return cn.hello.MaxMessage
	}
	return 0
}

// takeMutation forgets m and reports whether it was still waiting; if not,
// m.fn has been called or is about to be.
func (c *Client) takeMutation(m *mutation) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mutates[m.key] != m {
		return false
	}
	c.deleteMutationLocked(m)
	return true
}

// deleteMutationLocked forgets m, answered or taken back, and counts it
// off the take-over waiting for it, if any. Caller holds c.mu.
func (c *Client) deleteMutationLocked(m *mutation) {
	delete(c.mutates, m.key)
	if h := c.hold; h != nil && m.seq < h.seq && h.left > 0 {
		h.left--
		if h.left == 0 {
			close(h.answered)
		}
	}
}

// abandonMutation detaches the caller from m, which stays recorded (its
// seq is used, so it must still reach the server), and reports whether it
// did; if not, m.fn has been called or is about to be.
func (c *Client) abandonMutation(m *mutation) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mutates[m.key] != m {
		return false
	}
	m.fn = nil // its ack goes to OnFrame; the connection's end forgets it
	return true
}

// ackLSN returns the ack's lsn, or "".
func ackLSN(a *frames.Ack) string {
	if a.LSN == nil {
		return ""
	}
	return *a.LSN
}
