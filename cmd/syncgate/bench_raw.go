package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/syncgate/syncgate/frames"
)

// The raw subscriber (-subscriber raw, the default) is how fanout and
// topics receive deliveries without the bench becoming the bottleneck. The
// client package decodes every patch strictly, allocates every message and
// hands it across goroutines; at a few hundred thousand deliveries a
// second that costs the bench as much CPU as the server it measures. The
// raw subscriber reads each message into a reused buffer and finds the
// send times with a scan that knows how the gateway encodes a topic
// message's patch (frames.AppendPatchPrefix and AppendInsertBody around
// the row of gateway's appendRow; see scanOp): a change to either layout
// shows as fallback decodes. Any line the scan does not
// recognise goes through the strict frames.Decode instead and is counted
// (fallback_decodes), so a change of layout shows in the results rather
// than as lost deliveries.
//
// Setup (hello, subscribe, ack, snapshot) is not the hot path: it uses
// frames.Encode and frames.Decode.

// rawReadLimit is the largest message a raw subscriber accepts. The server
// batches up to 64 KiB, but a single frame larger than that goes alone.
const rawReadLimit = 8 << 20

// rawBufSize is a raw subscriber's initial read buffer; it grows to the
// largest message seen.
const rawBufSize = 4 << 10

// rawSID is the raw subscriber's only subscription.
const rawSID = "s1"

var (
	// framePrefix starts every frame the gateway encodes: "type" comes
	// first (see frames.Encode).
	framePrefix = []byte(`{"type":"`)
	// patchPrefix starts a patch frame.
	patchPrefix = []byte(`{"type":"patch"`)
	// rawPatchHead is what a patch for rawSID starts with, up to its first
	// op.
	rawPatchHead = append(frames.AppendPatchPrefix(nil, rawSID), `,"patches":[`...)
	// patchTail follows the last op: the frame's lsn, then '}'.
	patchTail = []byte(`],"lsn":`)
	// The fixed parts of an insert op as scanOp reads it.
	opInsert          = []byte(`{"op":"insert","id":`)
	opRowID           = []byte(`,"row":{"id":`)
	rowTimeKeyAfterID = []byte(`,` + string(rowTimeKey))
	opLSN             = []byte(`},"lsn":`)
	rowAtKey          = []byte(`,"at":`)
	opIndex           = []byte(`,"index":`)
)

// subConn is a subscriber's connection: a *client.Client (-subscriber
// client) or a *rawConn.
type subConn interface {
	// Done is closed when the connection has ended and its reader exited.
	Done() <-chan struct{}
	// Err is why the connection ended, nil while it is up.
	Err() error
	// Close closes with 1000 and waits for the reader.
	Close() error
}

var _ subConn = (*rawConn)(nil)

// rawConn is one raw subscriber's connection. Its only goroutine is the
// reader, started by dialRaw once the subscription is live and waited for
// by Close. All methods may be called concurrently.
type rawConn struct {
	// Static after dialRaw.
	conn *websocket.Conn
	sub  *benchSub

	// Signals.
	closing   chan struct{} // closed when Close starts
	done      chan struct{} // closed when the reader has exited
	closeOnce sync.Once
	closeErr  error // result of the first Close

	mu  sync.Mutex
	err error // guarded by mu; why the connection ended, set before done is closed
}

// dialRaw opens a raw subscriber session for s on topic within
// -dial-timeout: upgrade, hello, subscribe, then the server's hello, the
// subscribe ack and the snapshot. On success s.conn is set and the reader
// is running; on failure nothing is left open.
func (e *benchEnv) dialRaw(ctx context.Context, s *benchSub, topic string) error {
	ctx, cancel := context.WithTimeout(ctx, e.flags.dialTimeout)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, e.wsURL, &websocket.DialOptions{HTTPClient: e.dialHTTP})
	if err != nil {
		return fmt.Errorf("raw subscriber: dial %s: %w", e.wsURL, err)
	}
	conn.SetReadLimit(rawReadLimit)
	r := &rawConn{conn: conn, sub: s, closing: make(chan struct{}), done: make(chan struct{})}
	if err := r.handshake(ctx, topic); err != nil {
		conn.CloseNow()
		return fmt.Errorf("raw subscriber: %w", err)
	}
	s.conn = r
	go r.readLoop()
	return nil
}

// handshake sends hello and subscribe add, then reads until it has the
// server's hello, the ack of the subscribe and its snapshot. Frames after
// the snapshot in the same message are deliveries.
func (r *rawConn) handshake(ctx context.Context, topic string) error {
	for _, f := range []frames.Frame{
		&frames.Hello{BuildID: benchBuildID, Resume: []frames.Cursor{}},
		&frames.Subscribe{Op: frames.OpAdd, SID: rawSID, Target: frames.Target{Kind: frames.TargetTopic, Topic: topic}},
	} {
		b, err := frames.Encode(f)
		if err != nil {
			return fmt.Errorf("encode %s: %w", f.FrameType(), err)
		}
		if err := r.conn.Write(ctx, websocket.MessageText, b); err != nil {
			return fmt.Errorf("send %s: %w", f.FrameType(), err)
		}
	}
	var hello, acked, live bool
	for !live {
		typ, msg, err := r.conn.Read(ctx)
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
				r.sub.handleLine(now, line)
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
					ferr = fmt.Errorf("subscribe %s: %w", topic, &frames.Error{
						Code: f.Error.Code, Cause: f.Error.Cause, Fix: f.Error.Fix, Docs: f.Error.Docs, Ref: f.Ref,
					})
					return false
				}
				acked = acked || f.Ref == rawSID
			case *frames.Snapshot:
				if f.SID == rawSID {
					if !hello || !acked {
						ferr = fmt.Errorf("subscribe %s: snapshot before the server's hello and the ack", topic)
						return false
					}
					live = true
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

// readLoop reads messages into one reused buffer and hands them to the
// subscriber until the connection ends.
func (r *rawConn) readLoop() {
	r.shutdown(readMessages(r.conn, func(text bool, msg []byte, at int64) {
		if !text {
			r.sub.other.Add(1)
			return
		}
		r.sub.handleMessage(at, msg)
	}))
}

// readMessages reads conn's messages into one reused buffer and hands each
// to fn with whether it is text and when it was read (Unix ns), until the
// connection ends; it returns the read error. No deadline: the loop ends
// when the connection does (Close, a server close, or a network error),
// and a ctx without Done keeps coder/websocket from arming a timer per
// read. fn must not keep msg.
func readMessages(conn *websocket.Conn, fn func(text bool, msg []byte, at int64)) error {
	var buf []byte
	for {
		typ, b, err := readMessage(conn, buf[:0])
		buf = b
		if err != nil {
			return err
		}
		fn(typ == websocket.MessageText, buf, time.Now().UnixNano())
	}
}

// readMessage appends the next message to buf, growing it as needed.
func readMessage(conn *websocket.Conn, buf []byte) (websocket.MessageType, []byte, error) {
	typ, rd, err := conn.Reader(context.Background())
	if err != nil {
		return 0, buf, err
	}
	for {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, max(rawBufSize, cap(buf)))
		}
		n, err := rd.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) {
			return typ, buf, nil
		}
		if err != nil {
			return 0, buf, err
		}
	}
}

// shutdown records why the connection ended. It runs once, at the end of
// the reader.
func (r *rawConn) shutdown(readErr error) {
	var err error
	select {
	case <-r.closing:
		err = net.ErrClosed
	default:
		err = fmt.Errorf("raw subscriber: connection ended: %w", readErr)
		r.conn.CloseNow() // release it whatever the read error was
	}
	r.mu.Lock()
	r.err = err
	r.mu.Unlock()
	close(r.done)
}

// Done returns a channel closed when the reader has exited.
func (r *rawConn) Done() <-chan struct{} { return r.done }

// Err returns why the connection ended, or nil while it is up; after
// Close, net.ErrClosed.
func (r *rawConn) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Close closes the connection with 1000 (normal closure) and waits for the
// reader. Later calls return nil.
func (r *rawConn) Close() error {
	first := false
	r.closeOnce.Do(func() {
		first = true
		close(r.closing)
		if err := r.conn.Close(websocket.StatusNormalClosure, ""); err != nil && !errors.Is(err, net.ErrClosed) {
			r.closeErr = fmt.Errorf("raw subscriber: close: %w", err)
		}
	})
	<-r.done
	if !first {
		return nil
	}
	return r.closeErr
}

// handleMessage handles each frame of one message received at now (Unix
// ns). It runs on the reader (or, for the message that carried the
// snapshot, on dialRaw before the reader starts).
func (s *benchSub) handleMessage(now int64, msg []byte) {
	frames.Split(msg, func(line []byte) bool {
		s.handleLine(now, line)
		return true
	})
}

// handleLine handles one frame: a patch found by scanPatch is counted
// without decoding; another frame the gateway encoded (it starts with
// {"type":") is counted in other; anything else, including a patch the
// scan does not recognise, is decoded strictly and counted in fallback.
func (s *benchSub) handleLine(now int64, line []byte) {
	if !bytes.HasPrefix(line, patchPrefix) && bytes.HasPrefix(line, framePrefix) {
		s.other.Add(1)
		return
	}
	ops, ok := scanPatch(line, rawPatchHead, s.scratch[:0])
	s.scratch = ops[:0] // keep what it grew to
	if ok {
		var n int64
		for _, op := range ops {
			if s.inOrder(op.id) {
				s.hist.record(now - op.t)
				n++
			}
		}
		s.add(now, n)
		return
	}
	s.fallback.Add(1)
	f, err := frames.Decode(line)
	if err != nil {
		s.undecodable.Add(1)
		return
	}
	if p, isPatch := f.(*frames.Patch); isPatch && p.SID == rawSID {
		s.handlePatch(now, p)
		return
	}
	s.other.Add(1)
}

// scannedOp is an op as scanPatch finds it.
type scannedOp struct {
	t  int64  // the bench's send time in the row's data
	id []byte // the op's id (its offset), unquoted; part of the line
}

// scanPatch appends to ops the send time and id of every op in line,
// which must be a whole patch frame laid out as the gateway encodes it and
// starting with head (the frame's prefix for one sid, up to and including
// ,"patches":[). Each op must be an insert whose row is laid out as the
// gateway lays out a topic message's, its data starting with the bench's
// timestamp (see rowSendTime). It reports false for anything else
// (another layout, another sid, another op, an op without a time, a
// truncated line); ops may then have been extended.
func scanPatch(line, head []byte, ops []scannedOp) ([]scannedOp, bool) {
	if !bytes.HasPrefix(line, head) {
		return ops, false
	}
	i := len(head)
	if i < len(line) && line[i] != ']' {
		for {
			t, id, end, ok := scanOp(line, i)
			if !ok {
				return ops, false
			}
			ops = append(ops, scannedOp{t: t, id: id})
			if i = end; i >= len(line) || line[i] != ',' {
				break
			}
			i++
		}
	}
	rest := line[i:]
	if !bytes.HasPrefix(rest, patchTail) {
		return ops, false
	}
	j := len(patchTail)
	if j >= len(rest) || rest[j] != '"' {
		return ops, false
	}
	j = skipString(rest, j)
	return ops, j >= 0 && j == len(rest)-2 && rest[j+1] == '}'
}

// scanOp reads the op at b[i:] as the gateway lays out a topic message's
// insert (frames.AppendInsertBody around gateway's appendRow),
// {"op":"insert","id":<lsn>,"row":{"id":<lsn>,"data":{"t":<send time>…},
// "actorId":…,"at":<n>},"lsn":<lsn>[,"index":<n>]}, and returns the send
// time, the op's id (unquoted) and the index just past the op. It checks the fixed parts and finds
// the strings' ends, but it does not parse the rest of the data: at a
// million deliveries a second, walking each row's JSON cost the bench half
// its CPU. The row ends at the first },"lsn":<the op's id> after the time
// that follows ,"at":<n>: a sequence that cannot lie inside a JSON string
// (its '"' after ',' would be escaped there), and that the bench's own
// data does not hold.
func scanOp(b []byte, i int) (t int64, opID []byte, end int, ok bool) {
	if i = expect(b, i, opInsert); i < 0 || i >= len(b) || b[i] != '"' {
		return 0, nil, 0, false
	}
	idStart := i
	if i = skipString(b, i); i < 0 { // the op's id
		return 0, nil, 0, false
	}
	id := b[idStart : i+1] // quoted
	if i = expect(b, i+1, opRowID); i < 0 || i >= len(b) || b[i] != '"' {
		return 0, nil, 0, false
	}
	if i = skipString(b, i); i < 0 { // the row's id
		return 0, nil, 0, false
	}
	if i = expect(b, i+1, rowTimeKeyAfterID); i < 0 {
		return 0, nil, 0, false
	}
	if t, i, ok = sendTimeAt(b, i); !ok {
		return 0, nil, 0, false
	}
	k := bytes.Index(b[i:], opLSN)
	if k < 0 {
		return 0, nil, 0, false
	}
	if !endsWithAt(b[:i+k]) {
		return 0, nil, 0, false
	}
	if i = expect(b, i+k+len(opLSN), id); i < 0 {
		return 0, nil, 0, false
	}
	if j := expect(b, i, opIndex); j >= 0 { // a query's row position
		if i = skipInt(b, j); i == j {
			return 0, nil, 0, false
		}
	}
	if i >= len(b) || b[i] != '}' {
		return 0, nil, 0, false
	}
	return t, id[1 : len(id)-1], i + 1, true
}

// endsWithAt reports whether b ends with the row's last member,
// ,"at":<integer>.
func endsWithAt(b []byte) bool {
	j := len(b)
	for j > 0 && '0' <= b[j-1] && b[j-1] <= '9' {
		j--
	}
	if j == len(b) {
		return false
	}
	if j > 0 && b[j-1] == '-' {
		j--
	}
	return bytes.HasSuffix(b[:j], rowAtKey)
}

// skipInt returns the index past the integer (an optional '-', then
// digits) at b[i:], or i if there is none.
func skipInt(b []byte, i int) int {
	j := i
	if j < len(b) && b[j] == '-' {
		j++
	}
	k := j
	for k < len(b) && '0' <= b[k] && b[k] <= '9' {
		k++
	}
	if k == j {
		return i
	}
	return k
}

// expect returns the index past want if b[i:] starts with it, else -1.
func expect(b []byte, i int, want []byte) int {
	if i < 0 || i > len(b) || !bytes.HasPrefix(b[i:], want) {
		return -1
	}
	return i + len(want)
}

// skipString returns the index of the quote that closes the JSON string
// whose opening quote is b[i], or -1 if it does not close within b.
func skipString(b []byte, i int) int {
	for k := i + 1; k < len(b); k++ {
		q := bytes.IndexByte(b[k:], '"')
		if q < 0 {
			return -1
		}
		k += q
		n := 0 // backslashes right before the quote: an odd count escapes it
		for m := k - 1; m > i && b[m] == '\\'; m-- {
			n++
		}
		if n%2 == 0 {
			return k
		}
	}
	return -1
}

// printRawCounts writes the raw subscriber's summary line, if it was used.
func printRawCounts(w io.Writer, mode string, fallback, undecodable, other int64) {
	if mode != subscriberRaw {
		return
	}
	fmt.Fprintf(w, "  raw subs   %d fallback decodes (%d undecodable), %d other frames\n", fallback, undecodable, other)
}
