package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/syncgate/syncgate/frames"
)

// Send encodes f, queues it on the current connection and waits until it
// is written (possibly batched with other queued frames). It is meant for
// tests and for frames this package has no method for: it assigns no seq,
// waits for no ack (any ack goes to [Options.OnFrame]) and is not re-sent
// after a reconnect. While a reconnecting Client has no connection it
// returns [ErrNotConnected].
//
// ctx bounds the wait for the frame's turn: if ctx ends first, Send
// returns ctx.Err() and the frame is never written. Once its write has
// started it is bounded by [Options.WriteTimeout], not by ctx, so a
// cancelled caller never cuts a message in half.
func (c *Client) Send(ctx context.Context, f frames.Frame) error {
	cn, err := c.sendConn()
	if err != nil {
		return err
	}
	return cn.send(ctx, f)
}

// SendRaw writes msg as one text message of its own, unchanged and never
// joined with other frames: several frames may be joined with '\n', and
// msg need not be valid. Like [Client.Send] it is meant for tests, and ctx
// works the same way.
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

// outMsg is one entry in a connection's write queue: a frame, a raw
// message, or a flush marker that writes nothing.
type outMsg struct {
	b     []byte
	alone bool       // written as a message of its own, never joined (SendRaw)
	flush bool       // a marker: answered once what precedes it is written
	w     *outWaiter // nil when nobody waits for the write
}

// outWaiter is a caller waiting for one queued message to be written. The
// caller and the writer race for state: the writer may write the message
// only if it moves it from outQueued to outTaken, which it does just before
// the write that carries it, and a caller whose ctx ends may leave only if
// it moves it to outAbandoned, so a caller told "not written" never has
// its message written.
type outWaiter struct {
	state atomic.Int32
	done  chan error // one slot: the write's outcome, once taken
}

const (
	outQueued int32 = iota
	outTaken
	outAbandoned
)

// minQueueBytes is the least a connection's write queue holds before
// senders wait for the writer (see conn.qlimit).
const minQueueBytes = 64 << 10

// queueLimit is how many bytes a connection's write queue, or a
// take-over's held mutates (mutateHold), hold before senders wait.
func (c *Client) queueLimit() int {
	return max(minQueueBytes, 2*c.opts.BatchBytes)
}

// errReplaced fails what was still queued on a connection that another
// has taken over from.
var errReplaced = errors.New("client: connection replaced by a newer one")

// send encodes f and writes it as one frame, waiting for the write.
func (cn *conn) send(ctx context.Context, f frames.Frame) error {
	msg, err := frames.AppendEncode(nil, f)
	if err != nil {
		return fmt.Errorf("client: encode %s: %w", f.FrameType(), err)
	}
	return cn.write(ctx, msg, false)
}

// sendRaw writes msg as a message of its own, unchanged, waiting for the
// write.
func (cn *conn) sendRaw(ctx context.Context, msg []byte) error {
	return cn.write(ctx, msg, true)
}

// flush waits until everything queued before it has been written (or the
// writes have stopped), for at most d.
func (cn *conn) flush(d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return cn.wait(ctx, outMsg{flush: true})
}

// write queues msg once the queue has room and waits until it is written,
// or until ctx ends before the writer has taken it (then it is never
// written). Once taken, the write is bounded by [Options.WriteTimeout],
// not by ctx.
func (cn *conn) write(ctx context.Context, msg []byte, alone bool) error {
	return cn.wait(ctx, outMsg{b: msg, alone: alone})
}

// wait queues m with a waiter once the queue has room, and waits as write
// says.
func (cn *conn) wait(ctx context.Context, m outMsg) error {
	if err := cn.waitSpace(ctx); err != nil {
		return err
	}
	w := &outWaiter{done: make(chan error, 1)}
	m.w = w
	if err := cn.post1(m); err != nil {
		return err
	}
	select {
	case err := <-w.done:
		return err
	case <-ctx.Done():
		if w.state.CompareAndSwap(outQueued, outAbandoned) {
			return ctx.Err()
		}
		return <-w.done
	}
}

// postFrame encodes f and posts it.
func (cn *conn) postFrame(f frames.Frame) error {
	msg, err := frames.AppendEncode(nil, f)
	if err != nil {
		return fmt.Errorf("client: encode %s: %w", f.FrameType(), err)
	}
	return cn.post(msg)
}

// post queues one frame without waiting for its write, and without
// waiting for room (callers that want backpressure call waitSpace first).
// It fails only if the connection's writes have stopped; a write that
// fails later ends the connection, and with it whatever waits for an
// answer.
func (cn *conn) post(msg []byte) error {
	return cn.post1(outMsg{b: msg})
}

func (cn *conn) post1(m outMsg) error {
	cn.qmu.Lock()
	if err := cn.qerr; err != nil {
		cn.qmu.Unlock()
		return err
	}
	cn.queue = append(cn.queue, m)
	cn.qbytes += len(m.b)
	cn.qmu.Unlock()
	select {
	case cn.qwake <- struct{}{}:
	default:
	}
	return nil
}

// waitSpace waits until the write queue holds less than its limit: the
// backpressure a sender faster than the connection feels. It returns
// ctx's error if ctx ends first, and nil at once if writes have stopped
// (the enqueue that follows reports that).
func (cn *conn) waitSpace(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	for {
		cn.qmu.Lock()
		if cn.qerr != nil || cn.qbytes < cn.qlimit {
			cn.qmu.Unlock()
			return nil
		}
		if cn.qspace == nil {
			cn.qspace = make(chan struct{})
		}
		space := cn.qspace
		cn.qmu.Unlock()
		select {
		case <-space:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// takeQueue hands the queue to the writer, leaving q (emptied) in its
// place, and wakes the senders waiting for room. Caller holds qmu.
func (cn *conn) takeQueueLocked(q []outMsg) []outMsg {
	q, cn.queue = cn.queue, q
	cn.qbytes = 0
	if cn.qspace != nil {
		close(cn.qspace)
		cn.qspace = nil
	}
	return q
}

// writeLoop is the connection's writer goroutine. Each time it wakes it
// takes the whole queue and writes it in as few messages as the batch
// limit allows: frames queued while a write runs go out together in the
// next one, the way the server batches. It exits when the connection has
// ended or a write has failed, failing what is still queued.
func (cn *conn) writeLoop() {
	defer close(cn.wdone)
	var q []outMsg
	for {
		select {
		case <-cn.qwake:
		case <-cn.done:
			cn.stopWrites(cn.endErr())
			return
		}
		cn.qmu.Lock()
		q = cn.takeQueueLocked(q)
		cn.qmu.Unlock()
		err := cn.writeBatches(q)
		clear(q) // let the written messages go
		q = q[:0]
		if err != nil {
			cn.stopWrites(err)
			return
		}
	}
}

// stopWrites makes every later enqueue fail with err (the first error
// stays), and fails what is queued.
func (cn *conn) stopWrites(err error) {
	cn.qmu.Lock()
	if cn.qerr == nil {
		cn.qerr = err
	}
	q := cn.takeQueueLocked(nil)
	cn.qmu.Unlock()
	failOut(q, err)
}

// failOut reports err to the waiters among q that are still waiting.
func failOut(q []outMsg, err error) {
	for _, m := range q {
		if m.w != nil && m.w.state.CompareAndSwap(outQueued, outTaken) {
			m.w.done <- err
		}
	}
}

// writeBatches writes q in order. Runs of frames are joined with '\n' into
// messages of at most the batch limit (a longer frame goes alone); a raw
// message always goes alone; a flush marker is answered once what precedes
// it is written; a message whose caller has left is skipped. Each waited
// message is claimed only once everything before it is written, just
// before the write that carries it. Once the writes are stopped
// (stopWrites) nothing more is written. On a write error the rest of q
// fails with it.
func (cn *conn) writeBatches(q []outMsg) error {
	limit := int(cn.batchLimit.Load())
	maxFrames := math.MaxInt // frames per message: at most the pace's burst
	if lim := cn.pace.Load(); lim != nil {
		maxFrames = lim.Burst()
	}
	var batch []outMsg // frames of the message being built, all claimed
	size := 0
	write := func() error {
		if len(batch) == 0 {
			return nil
		}
		msg := batch[0].b
		n := len(batch) // frames, as the server counts them
		if batch[0].alone {
			n = bytes.Count(msg, []byte{'\n'}) + 1
		}
		if len(batch) > 1 {
			buf := cn.wbuf[:0]
			for i, m := range batch {
				if i > 0 {
					buf = append(buf, '\n')
				}
				buf = append(buf, m.b...)
			}
			msg = buf
			if cap(buf) <= maxKeptWriteBuf {
				cn.wbuf = buf
			}
		}
		err := cn.paceWait(n)
		if err == nil {
			err = cn.stoppedErr()
		}
		if err == nil {
			err = cn.writeMsg(msg)
		}
		for _, m := range batch {
			if m.w != nil {
				m.w.done <- err
			}
		}
		batch, size = batch[:0], 0
		return err
	}
	for i, m := range q {
		// What m cannot join goes out first.
		if len(batch) > 0 && (m.flush || m.alone || size+1+len(m.b) > limit || len(batch) == maxFrames) {
			if err := write(); err != nil {
				failOut(q[i:], err)
				return err
			}
		}
		if m.w != nil && !m.w.state.CompareAndSwap(outQueued, outTaken) {
			continue // its caller gave up before the write
		}
		switch {
		case m.flush:
			m.w.done <- nil // everything before it is written
		case m.alone:
			batch = append(batch, m)
			if err := write(); err != nil {
				failOut(q[i+1:], err)
				return err
			}
		default:
			if len(batch) > 0 {
				size++
			}
			batch = append(batch, m)
			size += len(m.b)
		}
	}
	return write()
}

// stoppedErr returns why the writes were stopped, nil while they go on.
func (cn *conn) stoppedErr() error {
	cn.qmu.Lock()
	defer cn.qmu.Unlock()
	return cn.qerr
}
