package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/syncgate/syncgate/frames"
)

// The sessions of bench presence. Both observers and members are raw
// frame-level sessions (like bench_raw.go's subscribers): the client
// package has no presence API, and at 1,000 updates a second fanned out to
// 2,000 sessions the bench must not cost more than the server it measures.
//
// An observer subscribes and counts the presence frames it receives and
// the member entries in them with a byte scan. A sample of observers also
// decodes every presence frame and times each entry against the send times
// the member put in its meta (see appendPresenceMeta). A member subscribes,
// joins, updates, and counts the acks of its presence frames.

// presSID is the only subscription of every presence bench session.
const presSID = "p1"

var (
	presencePrefix = []byte(`{"type":"presence"`)
	ackPrefix      = []byte(`{"type":"ack"`)
	ackOKSuffix    = []byte(`,"error":null}`)
	memberMarker   = []byte(`{"id":`) // starts each member entry: the server encodes id first
)

// Meta is {"j":<join send time>,"t":<this write's send time>,"p":"<pad>"},
// times in Unix ns. A join carries j = t; every update repeats the join's
// j, so an observer that first sees a member in an update (its join
// coalesced with it) still times the join.
const minPresenceMeta = len(`{"j":`) + 19 + len(`,"t":`) + 19 + len(`,"p":""}`)

// maxPresenceMeta is the server's default meta limit (presence.Config.MaxMetaBytes).
const maxPresenceMeta = 512

func appendPresenceMeta(dst []byte, j, t int64, size int) []byte {
	n := len(dst)
	dst = append(dst, `{"j":`...)
	dst = strconv.AppendInt(dst, j, 10)
	dst = append(dst, `,"t":`...)
	dst = strconv.AppendInt(dst, t, 10)
	dst = append(dst, `,"p":"`...)
	for pad := size - (len(dst) - n) - len(`"}`); pad > 0; pad-- {
		dst = append(dst, 'x')
	}
	return append(dst, `"}`...)
}

type presenceMeta struct {
	J int64 `json:"j"`
	T int64 `json:"t"`
}

// presConn is one raw session subscribed to the bench topic. Its reader
// hands each frame line to handle; Close waits for it.
type presConn struct {
	conn   *websocket.Conn
	handle func(now int64, line []byte)

	closing   chan struct{}
	done      chan struct{}
	closeOnce sync.Once

	mu  sync.Mutex
	err error // guarded by mu; why the connection ended
}

// dialPresence opens a session within -dial-timeout: hello (with clientID
// if set), subscribe to topic, then the server's hello, the ack and the
// snapshot. Lines after the snapshot go to handle, and so does every later
// line, on the reader goroutine.
func (e *benchEnv) dialPresence(ctx context.Context, clientID, topic string, handle func(now int64, line []byte)) (*presConn, error) {
	dctx, cancel := context.WithTimeout(ctx, e.flags.dialTimeout)
	defer cancel()
	conn, _, err := websocket.Dial(dctx, e.wsURL, &websocket.DialOptions{HTTPClient: e.dialHTTP})
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", e.wsURL, err)
	}
	conn.SetReadLimit(rawReadLimit)
	c := &presConn{conn: conn, handle: handle, closing: make(chan struct{}), done: make(chan struct{})}
	if err := c.handshake(dctx, clientID, topic); err != nil {
		conn.CloseNow()
		return nil, err
	}
	go c.readLoop()
	return c, nil
}

func (c *presConn) handshake(ctx context.Context, clientID, topic string) error {
	for _, f := range []frames.Frame{
		&frames.Hello{BuildID: benchBuildID, Resume: []frames.Cursor{}, ClientID: clientID},
		&frames.Subscribe{Op: frames.OpAdd, SID: presSID, Target: frames.Target{Kind: frames.TargetTopic, Topic: topic}},
	} {
		if err := c.send(ctx, f); err != nil {
			return err
		}
	}
	var hello, acked, live bool
	for !live {
		typ, msg, err := c.conn.Read(ctx)
		if err != nil {
			return fmt.Errorf("waiting for hello, ack and snapshot: %w", err)
		}
		if typ != websocket.MessageText {
			continue
		}
		now := time.Now().UnixNano()
		var ferr error
		frames.Split(msg, func(line []byte) bool {
			if live {
				c.handle(now, line)
				return true
			}
			f, err := frames.Decode(line)
			if err != nil {
				ferr = fmt.Errorf("undecodable frame during setup: %w", err)
				return false
			}
			switch f := f.(type) {
			case *frames.Hello:
				hello = true
			case *frames.Ack:
				if f.Error != nil {
					ferr = fmt.Errorf("subscribe %s: %s: %s", topic, f.Error.Code, f.Error.Cause)
					return false
				}
				acked = acked || f.Ref == presSID
			case *frames.Snapshot:
				if f.SID == presSID {
					live = hello && acked
				}
			}
			return true
		})
		if ferr != nil {
			return ferr
		}
	}
	return nil
}

// send encodes and writes f. Only one goroutine writes at a time: the
// handshake, then the member's pacer.
func (c *presConn) send(ctx context.Context, f frames.Frame) error {
	b, err := frames.Encode(f)
	if err != nil {
		return fmt.Errorf("encode %s: %w", f.FrameType(), err)
	}
	if err := c.conn.Write(ctx, websocket.MessageText, b); err != nil {
		return fmt.Errorf("send %s: %w", f.FrameType(), err)
	}
	return nil
}

func (c *presConn) readLoop() {
	err := readMessages(c.conn, func(text bool, msg []byte, at int64) {
		if text {
			frames.Split(msg, func(line []byte) bool {
				c.handle(at, line)
				return true
			})
		}
	})
	select {
	case <-c.closing:
		err = net.ErrClosed
	default:
		err = fmt.Errorf("connection ended: %w", err)
		c.conn.CloseNow()
	}
	c.mu.Lock()
	c.err = err
	c.mu.Unlock()
	close(c.done)
}

// Err is why the connection ended: nil while it is up, net.ErrClosed
// after Close.
func (c *presConn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close closes with 1000 and waits for the reader.
func (c *presConn) Close() {
	c.closeOnce.Do(func() {
		close(c.closing)
		_ = c.conn.Close(websocket.StatusNormalClosure, "")
	})
	<-c.done
}

// presObserver counts what one observer receives. Its handler runs on the
// connection's reader.
type presObserver struct {
	conn     *presConn
	counting *atomic.Bool // shared: true during the update window

	frames  atomic.Int64 // presence frames received while counting
	entries atomic.Int64 // member entries in them
	other   atomic.Int64 // other frames, any time

	// Sample observers only (joinHist != nil).
	joinHist    *histShard
	updateHist  *histShard
	seen        map[string]struct{} // owned by the reader: members seen present
	seenN       atomic.Int64
	updates     atomic.Int64 // update entries timed
	undecodable atomic.Int64
	lastFrame   atomic.Int64 // Unix ns of the latest presence frame
}

func (o *presObserver) handle(now int64, line []byte) {
	if !bytes.HasPrefix(line, presencePrefix) {
		o.other.Add(1)
		return
	}
	o.lastFrame.Store(now)
	if o.counting.Load() {
		o.frames.Add(1)
		o.entries.Add(int64(bytes.Count(line, memberMarker)))
	}
	if o.joinHist == nil {
		return
	}
	f, err := frames.Decode(line)
	p, ok := f.(*frames.Presence)
	if err != nil || !ok {
		o.undecodable.Add(1)
		return
	}
	if p.Op == frames.PresenceLeave {
		for _, m := range p.Members {
			delete(o.seen, m.ID)
		}
		return
	}
	for _, m := range p.Members {
		var meta presenceMeta
		if json.Unmarshal(m.Meta, &meta) != nil || meta.J == 0 {
			o.undecodable.Add(1)
			continue
		}
		if _, ok := o.seen[m.ID]; !ok {
			o.seen[m.ID] = struct{}{}
			o.seenN.Add(1)
			o.joinHist.record(now - meta.J)
		}
		if p.Op == frames.PresenceUpdate && meta.T != meta.J {
			o.updateHist.record(now - meta.T)
			o.updates.Add(1)
		}
	}
}

// presMember is one member session.
type presMember struct {
	conn     *presConn
	joinSent int64        // Unix ns; written by the join goroutine, read by the update one after wg.Wait
	acks     atomic.Int64 // presence acks without error
	errs     atomic.Int64 // acks with an error (any ref)
	joined   chan struct{}
	joinOnce sync.Once
	errors   *firstError // shared
}

func (m *presMember) handle(_ int64, line []byte) {
	if !bytes.HasPrefix(line, ackPrefix) {
		return
	}
	if bytes.HasSuffix(line, ackOKSuffix) {
		m.acks.Add(1)
	} else {
		m.errs.Add(1)
		err := errors.New("undecodable error ack")
		if f, derr := frames.Decode(line); derr == nil {
			if a, ok := f.(*frames.Ack); ok && a.Error != nil {
				err = fmt.Errorf("ack %s: %s: %s", a.Ref, a.Error.Code, a.Error.Cause)
			}
		}
		m.errors.record(err)
	}
	m.joinOnce.Do(func() { close(m.joined) }) // the first answer after setup is the join's
}
