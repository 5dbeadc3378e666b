package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/syncgate/syncgate/frames"
)

// Flooders (bench topics -flooders N): extra sessions that each send frames
// at -flood-factor times the server's per-session frame rate
// (-server-frame-rate, which the bench cannot read from the server) for
// the whole publishing window, while the normal publisher and subscribers
// run as usual. They measure the frame-rate limit from both sides: how
// many X_RATE_LIMITED answers a flooder gets and whether it is closed
// (1008 after the server's rate-limit-close), and how much the others'
// latency suffers (compare a run without flooders).
//
// A flooder is a raw WebSocket session (hello, then one frame per
// message). With -flood-frame publish each frame is a publish mutate to a
// topic nobody subscribes to. The gateway wants a producer's seqs without
// gaps and drops rate-limited frames unseen, so a flooder sends the seq
// after the highest one the server has acknowledged: the first frame with
// a seq that gets through publishes, later ones with the same seq are
// answered from the server's outcome window as retries. With -flood-frame
// bad each frame is an unknown frame type, answered with an error ack:
// what refusing costs, with no publishing at all.

// Flood frame kinds (-flood-frame).
const (
	floodPublish = "publish"
	floodBad     = "bad"
)

// floodFlags are bench topics' flooder flags.
type floodFlags struct {
	n          int
	factor     float64
	serverRate float64
	frame      string
}

func (f *floodFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&f.n, "flooders", 0, "extra sessions that flood the gateway with frames for the whole window")
	fs.Float64Var(&f.factor, "flood-factor", 10, "each flooder sends this many times -server-frame-rate frames per second")
	fs.Float64Var(&f.serverRate, "server-frame-rate", 1000, "the gateway's per-session frame rate (its -frame-rate; "+
		"the bench cannot ask the server): flooders send -flood-factor times this")
	fs.StringVar(&f.frame, "flood-frame", floodPublish, "what flooders send: "+floodPublish+
		" (publish mutates to a topic nobody subscribes to) or "+floodBad+" (frames of an unknown type, refused without work)")
}

func (f *floodFlags) validate() error {
	switch {
	case f.n < 0:
		return errors.New("bench: -flooders must not be negative")
	case f.n == 0:
		return nil
	case !(f.factor > 0) || math.IsInf(f.factor, 0):
		return errors.New("bench: -flood-factor must be positive")
	case !(f.serverRate > 0) || math.IsInf(f.serverRate, 0):
		return errors.New("bench: -server-frame-rate must be positive")
	case f.frame != floodPublish && f.frame != floodBad:
		return fmt.Errorf("bench: -flood-frame must be %s or %s, got %q", floodPublish, floodBad, f.frame)
	}
	return nil
}

// rate is each flooder's frames per second.
func (f *floodFlags) rate() float64 { return f.factor * f.serverRate }

// rateLimitedCode is how an X_RATE_LIMITED ack shows in a line the gateway
// encoded; a line containing it is counted without decoding.
var rateLimitedCode = []byte(`"code":"` + string(frames.CodeRateLimited) + `"`)

// flooder is one flooding session. Its writer is the goroutine running
// flood; its reader is started by dialFlooder.
type flooder struct {
	conn  *websocket.Conn
	topic string
	frame string
	size  int

	start atomic.Int64 // Unix ns of the first flood frame, 0 before

	sent       atomic.Int64 // frames written after hello
	limited    atomic.Int64 // X_RATE_LIMITED acks
	ok         atomic.Int64 // acks without an error (publishes and their replays)
	otherErrs  firstError   // acks with another error
	nextSeq    atomic.Int64 // seq after the highest one acknowledged without error
	behind     int64        // frames due but not written (writer only, read after done)
	readerDone chan struct{}
	writerDone chan struct{} // closed when flood returns
	blocked    atomic.Bool   // its last write still waited for the server when the flood stopped

	mu        sync.Mutex
	closeCode websocket.StatusCode // guarded by mu: -1 until the server closes
	closedAt  time.Time            // guarded by mu
	endErr    error                // guarded by mu: why the reader stopped otherwise
}

// dialFlooder opens flooder session i: upgrade, hello, and the server's
// hello, within -dial-timeout; then its reader runs until the connection
// ends.
func (e *benchEnv) dialFlooder(ctx context.Context, i int, prefix, frame string, size int) (*flooder, error) {
	dctx, cancel := context.WithTimeout(ctx, e.flags.dialTimeout)
	defer cancel()
	conn, _, err := websocket.Dial(dctx, e.wsURL, &websocket.DialOptions{HTTPClient: e.dialHTTP})
	if err != nil {
		return nil, fmt.Errorf("flooder %d: dial %s: %w", i, e.wsURL, err)
	}
	conn.SetReadLimit(rawReadLimit)
	b, err := frames.Encode(&frames.Hello{BuildID: benchBuildID, Resume: []frames.Cursor{}})
	if err == nil {
		err = conn.Write(dctx, websocket.MessageText, b)
	}
	for err == nil {
		var msg []byte
		if _, msg, err = conn.Read(dctx); err == nil && bytes.HasPrefix(msg, []byte(`{"type":"hello"`)) {
			break
		}
	}
	if err != nil {
		conn.CloseNow()
		return nil, fmt.Errorf("flooder %d: hello: %w", i, err)
	}
	f := &flooder{conn: conn, topic: prefix + ":flood:" + strconv.Itoa(i), frame: frame, size: size,
		readerDone: make(chan struct{}), writerDone: make(chan struct{}), closeCode: -1}
	go f.read()
	return f, nil
}

// read counts the answers to the flood until the connection ends.
func (f *flooder) read() {
	defer close(f.readerDone)
	var buf []byte
	for {
		var err error
		_, buf, err = readMessage(f.conn, buf[:0])
		if err != nil {
			f.mu.Lock()
			if c := websocket.CloseStatus(err); c != -1 {
				f.closeCode, f.closedAt = c, time.Now()
			} else {
				f.endErr = err
			}
			f.mu.Unlock()
			return
		}
		frames.Split(buf, f.answer)
	}
}

// answer counts one frame from the server.
func (f *flooder) answer(line []byte) bool {
	if bytes.Contains(line, rateLimitedCode) {
		f.limited.Add(1)
		return true
	}
	fr, err := frames.Decode(line)
	if err != nil {
		f.otherErrs.record(fmt.Errorf("undecodable frame: %w", err))
		return true
	}
	a, ok := fr.(*frames.Ack)
	if !ok {
		return true // another frame: not an answer
	}
	if a.Error != nil {
		f.otherErrs.record(fmt.Errorf("%s: %s", a.Error.Code, a.Error.Cause))
		return true
	}
	f.ok.Add(1)
	// The key is fl<seq>: a frame sent again under a seq not yet answered
	// is a retry (same seq, same key), whose ack is the first one's.
	if s, ok := floodKeySeq(a.Ref); ok {
		for cur := f.nextSeq.Load(); s+1 > cur && !f.nextSeq.CompareAndSwap(cur, s+1); cur = f.nextSeq.Load() {
		}
	}
	return true
}

// floodKeySeq parses the seq out of a flood mutate's key fl<seq>.
func floodKeySeq(key string) (int64, bool) {
	if len(key) < 3 || key[:2] != "fl" {
		return 0, false
	}
	s, err := strconv.ParseInt(key[2:], 10, 64)
	return s, err == nil
}

// answered is how many flood frames have been answered.
func (f *flooder) answered() int64 {
	return f.limited.Load() + f.ok.Load() + f.otherErrs.n.Load()
}

// appendFrame appends flood frame number n to dst.
func (f *flooder) appendFrame(dst []byte, n int64) []byte {
	if f.frame == floodBad {
		return append(dst, `{"type":"flood","v":1,"n":`+strconv.FormatInt(n, 10)+`}`...)
	}
	// As frames.Encode lays out a mutate; keys and the topic need no
	// escaping.
	// Until seq is answered every frame sends it again, under the same
	// key: a retry, as a client's (the same seq under another key is
	// X_SEQ_REUSED).
	seq := f.nextSeq.Load()
	key := "fl" + strconv.FormatInt(seq, 10)
	dst = append(dst, `{"type":"mutate","v":1,"key":"`+key+`","seq":`+strconv.FormatInt(seq, 10)+
		`,"name":"publish","input":{"topic":"`+f.topic+`","data":`...)
	dst = appendData(dst, time.Now().UnixNano(), f.size)
	return append(dst, "}}"...)
}

// flood writes frames at rate per second, one per message, until stop is
// closed or the connection ends. Like the publisher it sends on each tick
// what is due since the start, and gives up catching up beyond a second.
func (f *flooder) flood(rate float64, stop <-chan struct{}) {
	defer close(f.writerDone)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	f.start.Store(start.UnixNano())
	var buf []byte
	var n int64
	for {
		due := int64(rate * time.Since(start).Seconds())
		if lag := due - n; float64(lag) > rate {
			f.behind += lag - int64(rate)
			n += lag - int64(rate)
		}
		for ; n < due; n++ {
			select {
			case <-stop: // a second's backlog can be long to write
				return
			default:
			}
			buf = f.appendFrame(buf[:0], n)
			// No deadline: the server reads whatever the rate; a write
			// fails once the connection has ended.
			if err := f.conn.Write(context.Background(), websocket.MessageText, buf); err != nil {
				return
			}
			f.sent.Add(1)
		}
		select {
		case <-stop:
			return
		case <-f.readerDone:
			return
		case <-tick.C:
		}
	}
}

// floodJSON is what bench topics reports about its flooders (all zero
// without -flooders).
type floodJSON struct {
	Flooders        int     `json:"flooders"`
	FloodFrame      string  `json:"flood_frame,omitempty"`
	FloodFactor     float64 `json:"flood_factor,omitempty"`
	ServerFrameRate float64 `json:"server_frame_rate,omitempty"`
	FloodRate       float64 `json:"flood_rate_per_flooder,omitempty"` // frames/s asked of each
	FloodSent       int64   `json:"flood_sent"`
	FloodSentPerS   float64 `json:"flood_sent_per_s"` // per flooder, over its time flooding
	FloodBehind     int64   `json:"flood_behind"`
	FloodLimited    int64   `json:"flood_rate_limited"` // X_RATE_LIMITED acks
	FloodOK         int64   `json:"flood_ok"`           // acks without error
	FloodPublished  int64   `json:"flood_published"`    // distinct seqs published
	FloodOtherErrs  int64   `json:"flood_other_errors"`
	FloodFirstErr   string  `json:"flood_first_other_error,omitempty"`
	FloodUnanswered int64   `json:"flood_unanswered"` // sent - answered
	FloodClosed     int     `json:"flood_closed"`     // flooders the server closed
	FloodCloseCode  int     `json:"flood_close_code,omitempty"`
	FloodFirstClose float64 `json:"flood_first_close_s,omitempty"` // after the flood started
	FloodEnded      int     `json:"flood_ended"`                   // flooders whose connection broke otherwise
	FloodBlocked    int     `json:"flood_blocked"`                 // flooders the server had stopped reading when the flood stopped
	FloodFirstEnd   string  `json:"flood_first_end,omitempty"`
}

// floodRun is the flooders of one bench run.
type floodRun struct {
	fl   floodFlags
	fs   []*flooder // nil where a dial failed (only until openFlooders returns)
	stop chan struct{}
	ran  bool // start was called
	wg   sync.WaitGroup
	end  time.Time
}

// openFlooders dials the flooders; on an error it closes those it opened.
func (e *benchEnv) openFlooders(ctx context.Context, fl floodFlags, prefix string, size int) (*floodRun, error) {
	r := &floodRun{fl: fl, fs: make([]*flooder, fl.n), stop: make(chan struct{})}
	var fails firstError
	forEach(ctx, fl.n, e.flags.dialConcurrency, func(i int) {
		f, err := e.dialFlooder(ctx, i, prefix, fl.frame, size)
		if err != nil {
			fails.record(err)
			return
		}
		r.fs[i] = f
	})
	if fails.n.Load() == 0 && ctx.Err() == nil {
		return r, nil
	}
	r.close()
	if ctx.Err() != nil {
		return nil, runErr(ctx, e.flags)
	}
	return nil, fmt.Errorf("bench: %d of %d flooders failed; first: %s", fails.n.Load(), fl.n, fails.first())
}

// start starts flooding.
func (r *floodRun) start() {
	r.ran = true
	for _, f := range r.fs {
		r.wg.Go(func() { f.flood(r.fl.rate(), r.stop) })
	}
}

// haltGrace is how long halt waits for a flooder's last write before it
// takes the server to have stopped reading it.
const haltGrace = 200 * time.Millisecond

// halt stops flooding and waits for the writers. A writer still waiting in
// a write after haltGrace is one the server stopped reading (it pauses a
// flooding session's reads, and the kernel frees a full socket buffer in
// large steps): its connection is closed, and the flooder counted as
// blocked.
func (r *floodRun) halt() {
	select {
	case <-r.stop:
		return
	default:
	}
	close(r.stop)
	r.end = time.Now()
	if !r.ran {
		return
	}
	grace := time.NewTimer(haltGrace)
	defer grace.Stop()
	expired := false
	for _, f := range r.fs {
		if !expired {
			select {
			case <-f.writerDone:
				continue
			case <-grace.C:
				expired = true
			}
		}
		select {
		case <-f.writerDone:
		default:
			f.blocked.Store(true)
			f.conn.CloseNow()
		}
	}
	r.wg.Wait()
}

// close halts the flood and closes every flooder's connection.
func (r *floodRun) close() {
	r.halt()
	for _, f := range r.fs {
		if f != nil {
			f.conn.CloseNow()
			<-f.readerDone
		}
	}
}

// result halts the flood, waits up to wait for the last answers, and sums
// the flooders' counts.
func (r *floodRun) result(wait time.Duration) floodJSON {
	r.halt()
	deadline := time.Now().Add(min(wait, 2*time.Second))
	for _, f := range r.fs {
		for f.answered() < f.sent.Load() && time.Now().Before(deadline) {
			select {
			case <-f.readerDone:
			case <-time.After(10 * time.Millisecond):
				continue
			}
			break
		}
	}
	j := floodJSON{Flooders: r.fl.n, FloodFrame: r.fl.frame, FloodFactor: r.fl.factor,
		ServerFrameRate: r.fl.serverRate, FloodRate: r.fl.rate()}
	var span time.Duration
	for _, f := range r.fs {
		j.FloodSent += f.sent.Load()
		j.FloodBehind += f.behind
		j.FloodLimited += f.limited.Load()
		j.FloodOK += f.ok.Load()
		j.FloodPublished += f.nextSeq.Load()
		j.FloodOtherErrs += f.otherErrs.n.Load()
		if j.FloodFirstErr == "" {
			j.FloodFirstErr = f.otherErrs.first()
		}
		start := time.Unix(0, f.start.Load())
		end := r.end
		f.mu.Lock()
		if f.closeCode != -1 {
			j.FloodClosed++
			end = f.closedAt
			if s := round(f.closedAt.Sub(start).Seconds(), 3); j.FloodCloseCode == 0 || s < j.FloodFirstClose {
				j.FloodCloseCode, j.FloodFirstClose = int(f.closeCode), s
			}
		} else if f.blocked.Load() {
			j.FloodBlocked++
		} else if f.endErr != nil {
			j.FloodEnded++
			if j.FloodFirstEnd == "" {
				j.FloodFirstEnd = f.endErr.Error()
			}
		}
		f.mu.Unlock()
		span += end.Sub(start)
	}
	if j.FloodFrame == floodBad {
		j.FloodPublished = 0
	}
	j.FloodUnanswered = max(0, j.FloodSent-j.FloodLimited-j.FloodOK-j.FloodOtherErrs)
	if len(r.fs) > 0 {
		j.FloodSentPerS = perSecond(float64(j.FloodSent)/float64(len(r.fs)), span/time.Duration(len(r.fs)))
	}
	return j
}

// print writes the summary's flooder lines.
func (j floodJSON) print(w io.Writer) {
	if j.Flooders == 0 {
		return
	}
	fmt.Fprintf(w, "  flooders   %d × %s at %g frames/s (%g × %g): %d sent (%.0f/s each, %d behind), %d X_RATE_LIMITED, "+
		"%d ok (%d published), %d other errors, %d unanswered\n",
		j.Flooders, j.FloodFrame, j.FloodRate, j.FloodFactor, j.ServerFrameRate, j.FloodSent, j.FloodSentPerS, j.FloodBehind,
		j.FloodLimited, j.FloodOK, j.FloodPublished, j.FloodOtherErrs, j.FloodUnanswered)
	if j.FloodFirstErr != "" {
		fmt.Fprintf(w, "             first other error: %s\n", j.FloodFirstErr)
	}
	if j.FloodClosed > 0 {
		fmt.Fprintf(w, "             %d closed by the server, first with %d after %.2fs\n", j.FloodClosed, j.FloodCloseCode, j.FloodFirstClose)
	} else {
		fmt.Fprintf(w, "             none closed by the server\n")
	}
	if j.FloodBlocked > 0 {
		fmt.Fprintf(w, "             %d still blocked in a write when the flood stopped (the server had paused reading them)\n", j.FloodBlocked)
	}
	if j.FloodEnded > 0 {
		fmt.Fprintf(w, "             %d connections ended otherwise; first: %s\n", j.FloodEnded, j.FloodFirstEnd)
	}
}
