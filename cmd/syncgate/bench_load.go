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
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/syncgate/syncgate/client"
	"github.com/syncgate/syncgate/frames"
)

// This file holds what fanout and topics share: the message layout, the
// subscriber that counts and times deliveries, the paced pipelined
// publisher, and the wait for acks and stragglers. The raw subscriber's
// connection is in bench_raw.go.

// loadFlags are the flags of the publishing benches.
type loadFlags struct {
	rate       float64
	dur        time.Duration
	size       int
	wait       time.Duration
	subscriber string // subscriberRaw or subscriberClient
}

// Subscriber implementations (-subscriber).
const (
	subscriberRaw    = "raw"    // bench_raw.go: reused buffers, patches scanned, not decoded
	subscriberClient = "client" // the client package's Subscribe with a handler
)

func (l *loadFlags) register(fs *flag.FlagSet) {
	fs.Float64Var(&l.rate, "rate", 1000, "publishes per second, in total")
	fs.DurationVar(&l.dur, "dur", 10*time.Second, "how long to publish")
	fs.IntVar(&l.size, "size", 100, "bytes of each message's data (a JSON object: send time + padding; at least "+
		strconv.Itoa(minDataSize)+")")
	fs.DurationVar(&l.wait, "wait", 5*time.Second, "after -dur, how long to wait for outstanding acks and deliveries")
	fs.StringVar(&l.subscriber, "subscriber", subscriberRaw, "how subscribers read deliveries: "+
		subscriberRaw+" (a lean reader that scans patches without decoding them, so the bench stays cheap) or "+
		subscriberClient+" (the client package's Subscribe, to measure the Go client)")
}

func (l *loadFlags) validate(b benchFlags) error {
	switch {
	case !(l.rate > 0) || math.IsInf(l.rate, 0):
		return errors.New("bench: -rate must be positive")
	case l.dur <= 0:
		return errors.New("bench: -dur must be positive")
	case l.size < 0 || l.size > maxDataSize:
		return fmt.Errorf("bench: -size must be between 0 and %d", maxDataSize)
	case l.wait < 0:
		return errors.New("bench: -wait must not be negative")
	case l.dur+l.wait >= b.timeout:
		return fmt.Errorf("bench: -timeout (%s) must exceed -dur + -wait (%s) plus setup time", b.timeout, l.dur+l.wait)
	case l.subscriber != subscriberRaw && l.subscriber != subscriberClient:
		return fmt.Errorf("bench: -subscriber must be %s or %s, got %q", subscriberRaw, subscriberClient, l.subscriber)
	}
	l.size = max(l.size, minDataSize)
	return nil
}

// Message data is {"t":<send time, Unix ns>,"p":"<padding>"}. The
// timestamp comes first so that a subscriber finds it with one scan of the
// row the gateway wraps around it: {"id":…,"data":{"t":…,"p":…},…}.
const (
	dataPrefix  = `{"t":`
	minDataSize = len(dataPrefix) + 19 + len(`,"p":""}`) // 19 digits: Unix ns until 2286
	maxDataSize = 1 << 20                                // the gateway's frame limit is far lower by default
)

var rowTimeKey = []byte(`"data":` + dataPrefix)

// appendData appends a message whose data is size bytes (or the minimum
// that carries t) to dst.
func appendData(dst []byte, t int64, size int) []byte {
	n := len(dst)
	dst = append(dst, dataPrefix...)
	dst = strconv.AppendInt(dst, t, 10)
	dst = append(dst, `,"p":"`...)
	for pad := size - (len(dst) - n) - len(`"}`); pad > 0; pad-- {
		dst = append(dst, 'x')
	}
	return append(dst, `"}`...)
}

// rowSendTime returns the send time in a delivered row (or in a patch op
// holding one), without decoding the rest of it: the first 1 to 19 digits
// after "data":{"t":, ended by ',' or '}'.
func rowSendTime(row []byte) (int64, bool) {
	i := bytes.Index(row, rowTimeKey)
	if i < 0 {
		return 0, false
	}
	t, _, ok := sendTimeAt(row, i+len(rowTimeKey))
	return t, ok
}

// sendTimeAt reads the send time whose first digit is b[i]: 1 to 19
// digits that fit an int64, ended by ',' or '}'. It returns the index past
// the digits.
func sendTimeAt(b []byte, i int) (t int64, end int, ok bool) {
	j := i
	for ; j < len(b) && j-i < 19 && '0' <= b[j] && b[j] <= '9'; j++ {
		t = t*10 + int64(b[j]-'0')
	}
	// 19 digits over math.MaxInt64 wrap to a negative t.
	return t, j, t >= 0 && j > i && j < len(b) && (b[j] == ',' || b[j] == '}')
}

// benchSub is one subscriber session: it counts its deliveries and records
// their latency. Its handlers run on the connection's reader: handle on the
// client's read loop (-subscriber client), handleMessage on the raw
// subscriber's (bench_raw.go).
type benchSub struct {
	// Set once the session is open, before deliveries start.
	conn subConn // *client.Client or *rawConn
	hist *histShard
	all  *countdown // ticked once when this subscriber has all it expects

	// Owned by the reader.
	scratch []scannedOp // ops of one patch, reused
	lastID  []byte      // id (offset) of the latest delivery counted

	count       atomic.Int64 // deliveries with a timestamp
	bad         atomic.Int64 // deliveries whose row had no timestamp
	fallback    atomic.Int64 // raw: lines the scan did not recognise, decoded instead
	undecodable atomic.Int64 // raw: fallback lines that did not decode either
	other       atomic.Int64 // raw: frames (or binary messages) other than our patches, ignored
	outOfOrder  atomic.Int64 // deliveries whose offset was not after the one before: not counted
	last        atomic.Int64 // Unix ns of the latest delivery, 0 before
	target      atomic.Int64 // deliveries expected; -1 until the publisher is done
	reached     atomic.Bool
}

func newBenchSub(hist *histShard, all *countdown) *benchSub {
	s := &benchSub{hist: hist, all: all}
	s.target.Store(-1)
	return s
}

// handle is the client.Subscribe handler.
func (s *benchSub) handle(p *frames.Patch) {
	s.handlePatch(time.Now().UnixNano(), p)
}

// handlePatch counts and times the ops of a decoded patch received at now
// (Unix ns).
func (s *benchSub) handlePatch(now int64, p *frames.Patch) {
	var n int64
	for i := range p.Patches {
		t, ok := rowSendTime(p.Patches[i].Row)
		if !ok {
			s.bad.Add(1)
			continue
		}
		if s.inOrder([]byte(p.Patches[i].ID)) {
			s.hist.record(now - t)
			n++
		}
	}
	s.add(now, n)
}

// inOrder reports whether a delivery with offset id comes after the last
// one counted, and then makes it the last; else it counts the delivery as
// out of order (a duplicate, or one that overtook an earlier offset), and
// the caller does not count it as delivered. Offsets of one topic grow
// strictly and have a fixed width (16digits_16digits), so comparing the
// bytes compares the offsets; a longer id is a later one.
func (s *benchSub) inOrder(id []byte) bool {
	if last := s.lastID; len(last) > 0 && (len(id) < len(last) || len(id) == len(last) && bytes.Compare(id, last) <= 0) {
		s.outOfOrder.Add(1)
		return false
	}
	s.lastID = append(s.lastID[:0], id...)
	return true
}

// add counts n deliveries received at now, whose latencies are recorded.
func (s *benchSub) add(now, n int64) {
	c := s.count.Add(n)
	s.last.Store(now)
	if t := s.target.Load(); t >= 0 && c >= t {
		s.reach()
	}
}

// expect sets how many deliveries s should get. Either expect or add sees
// the count reach it, whichever comes second.
func (s *benchSub) expect(n int64) {
	s.target.Store(n)
	if s.count.Load() >= n {
		s.reach()
	}
}

// reach ticks the countdown once.
func (s *benchSub) reach() {
	if s.reached.CompareAndSwap(false, true) {
		s.all.tick()
	}
}

// countdown closes done when tick has been called n times.
type countdown struct {
	left atomic.Int64
	done chan struct{}
}

func newCountdown(n int) *countdown {
	c := &countdown{done: make(chan struct{})}
	c.left.Store(int64(n))
	if n == 0 {
		close(c.done)
	}
	return c
}

func (c *countdown) tick() {
	if c.left.Add(-1) == 0 {
		close(c.done)
	}
}

// openSubs dials n subscriber sessions of kind mode (-subscriber),
// -dial-concurrency at a time, each following topic(i) into a benchSub. If
// any fails it closes the others and returns an error naming the first
// failure: results over fewer subscribers than asked for would be
// mislabelled.
func (e *benchEnv) openSubs(ctx context.Context, mode string, n int, topic func(i int) string,
	hist *histogram) ([]*benchSub, *countdown, error) {
	all := newCountdown(n)
	subs := make([]*benchSub, n)
	var fails firstError
	forEach(ctx, n, e.flags.dialConcurrency, func(i int) {
		s := newBenchSub(hist.shard(i), all)
		var err error
		if mode == subscriberRaw {
			err = e.dialRaw(ctx, s, topic(i))
		} else {
			err = e.subscribeClient(ctx, s, topic(i))
		}
		if s.conn != nil {
			subs[i] = s
		}
		if err != nil {
			fails.record(err)
		}
	})
	if fails.n.Load() == 0 && ctx.Err() == nil {
		return subs, all, nil
	}
	closeSubs(e.flags.dialConcurrency, subs)
	if ctx.Err() != nil {
		return nil, nil, runErr(ctx, e.flags)
	}
	return nil, nil, fmt.Errorf("bench: %d of %d subscribers failed; first: %s", fails.n.Load(), n, fails.first())
}

// subscribeClient opens a client session for s (-subscriber client) and
// subscribes it to topic with s.handle. s.conn is set once the session is
// open, even if the subscribe fails.
func (e *benchEnv) subscribeClient(ctx context.Context, s *benchSub, topic string) error {
	c, err := e.dial(ctx)
	if err != nil {
		return err
	}
	s.conn = c
	ctx, cancel := context.WithTimeout(ctx, e.flags.dialTimeout)
	defer cancel()
	if _, err := c.Subscribe(ctx, topic, nil, s.handle); err != nil {
		return fmt.Errorf("subscribe %s: %w", topic, err)
	}
	return nil
}

var _ subConn = (*client.Client)(nil)

// closeSubs closes every opened subscriber's connection, conc at a time,
// and waits; see closeAll.
func closeSubs(conc int, subs []*benchSub) {
	forEach(context.Background(), len(subs), conc, func(i int) {
		if subs[i] != nil {
			_ = subs[i].conn.Close()
		}
	})
}

// benchPub is the publisher session. Its completion callbacks run on the
// client's read loop; run runs on the bench's goroutine.
type benchPub struct {
	c          *client.Client
	ackHist    *histShard     // if set, send → ack latency
	topicAcked []atomic.Int64 // if set, acks by topic index

	acked     atomic.Int64
	errs      firstError
	completed atomic.Int64 // acks and errors
	target    atomic.Int64 // completions expected; -1 while publishing
	allDone   chan struct{}
	doneOnce  sync.Once
}

func newBenchPub(c *client.Client) *benchPub {
	p := &benchPub{c: c, allDone: make(chan struct{})}
	p.target.Store(-1)
	return p
}

func (p *benchPub) complete(t0 int64, topic int, err error) {
	if err != nil {
		p.errs.record(err)
	} else {
		p.acked.Add(1)
		if p.ackHist != nil {
			p.ackHist.record(time.Now().UnixNano() - t0)
		}
		if p.topicAcked != nil {
			p.topicAcked[topic].Add(1)
		}
	}
	if n, t := p.completed.Add(1), p.target.Load(); t >= 0 && n >= t {
		p.doneOnce.Do(func() { close(p.allDone) })
	}
}

// expect sets the number of completions to wait for; see benchSub.expect.
func (p *benchPub) expect(n int64) {
	p.target.Store(n)
	if p.completed.Load() >= n {
		p.doneOnce.Do(func() { close(p.allDone) })
	}
}

// pubRun is what the publish loop did.
type pubRun struct {
	start, end time.Time // first and last send
	sent       int64     // publishes handed to the client (PublishAsync returned)
	behind     int64     // publishes due in the window but never handed over
	err        error     // why publishing stopped early, if it did
}

// run publishes at l.rate for l.dur (see pace); message k goes to
// topics[k % len(topics)]. It also stops when the connection does.
func (p *benchPub) run(ctx context.Context, l loadFlags, topics []string) pubRun {
	buf := make([]byte, 0, l.size+8)
	return pace(ctx, l.rate, l.dur, func(k int64, at time.Time) error {
		ti := int(k % int64(len(topics)))
		buf = appendData(buf[:0], at.UnixNano(), l.size)
		err := p.c.PublishAsync(ctx, topics[ti], buf, func(_ string, err error) {
			p.complete(at.UnixNano(), ti, err)
		})
		if err != nil {
			return fmt.Errorf("publish: %w", err)
		}
		return nil
	})
}

// pace calls send(k, at) for k = 0, 1, … at rate a second for dur, at
// being when message k was due (start + k/rate), not when the call
// happens: latency measured from at includes the publisher's own
// lateness (a late wake-up, a client waiting for room in its queue)
// rather than hiding it (coordinated omission). It sleeps until the next
// message is due, at least minPace at a time, and then sends every one
// that is due. It stops early when ctx ends or send fails (err says
// why), and gives up catching up once it lags a second past the window
// (behind counts what was left).
func pace(ctx context.Context, rate float64, dur time.Duration, send func(k int64, at time.Time) error) pubRun {
	total := int64(math.Round(rate * dur.Seconds()))
	const maxLag = time.Second
	r := pubRun{start: time.Now()}
	end := r.start.Add(dur)
	dueAt := func(k int64) time.Time {
		return r.start.Add(time.Duration(float64(k) / rate * float64(time.Second)))
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for r.sent < total {
		if d := time.Until(dueAt(r.sent)); d > 0 {
			timer.Reset(max(d, minPace))
			select {
			case <-ctx.Done():
				r.err = ctx.Err()
				r.behind = total - r.sent
				r.end = time.Now()
				return r
			case <-timer.C:
			}
		}
		now := time.Now()
		if now.Sub(end) > maxLag {
			r.behind = total - r.sent
			r.end = now
			return r
		}
		for r.sent < total {
			at := dueAt(r.sent)
			if at.After(now) {
				break
			}
			if err := send(r.sent, at); err != nil {
				r.err = err
				r.behind = total - r.sent
				r.end = time.Now()
				return r
			}
			r.sent++
		}
	}
	r.end = time.Now()
	return r
}

// minPace is the shortest sleep of pace: at high rates a wake-up per
// message would cost the bench more CPU than it measures, so messages
// due within a millisecond go out together (their wait is counted).
const minPace = time.Millisecond

// loadResult is what the wait after publishing measured.
type loadResult struct {
	acked, pubErrors, unacked int64
	firstPubError             string
	delivered, bad            int64
	fallback, undecodable     int64     // raw subscriber: lines decoded, not scanned; and of those, undecodable
	other                     int64     // raw subscriber: other frames received
	outOfOrder                int64     // deliveries not after the subscriber's last: not counted
	lastDelivery              time.Time // zero if none
	disconnects               int
	firstDisconnect           string
}

// settle waits until every publish has completed and every subscriber has
// what was acked for it (expected(i)), or until deadline. Subscribers whose
// connection has ended are given up on. It then reads the counters.
func settle(ctx context.Context, p *benchPub, sent int64, subs []*benchSub, all *countdown,
	expected func(i int) int64, deadline time.Time) (loadResult, error) {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	timedOut := false

	p.expect(sent)
	select {
	case <-p.allDone:
	case <-timer.C:
		timedOut = true
	case <-ctx.Done():
		return loadResult{}, ctx.Err()
	}
	for i, s := range subs {
		s.expect(expected(i))
	}
	poll := time.NewTicker(stragglerPoll)
	defer poll.Stop()
wait:
	for !timedOut {
		select {
		case <-all.done:
			break wait
		case <-timer.C:
			break wait
		case <-ctx.Done():
			return loadResult{}, ctx.Err()
		case <-poll.C:
			for _, s := range subs {
				select {
				case <-s.conn.Done():
					s.reach() // it will never catch up
				default:
				}
			}
		}
	}

	r := loadResult{
		acked:         p.acked.Load(),
		pubErrors:     p.errs.n.Load(),
		firstPubError: p.errs.first(),
	}
	r.unacked = sent - r.acked - r.pubErrors
	var last int64
	for _, s := range subs {
		r.delivered += s.count.Load()
		r.bad += s.bad.Load()
		r.fallback += s.fallback.Load()
		r.undecodable += s.undecodable.Load()
		r.other += s.other.Load()
		r.outOfOrder += s.outOfOrder.Load()
		last = max(last, s.last.Load())
		if err := s.conn.Err(); err != nil {
			r.disconnects++
			if r.firstDisconnect == "" {
				r.firstDisconnect = err.Error()
			}
		}
	}
	if last > 0 {
		r.lastDelivery = time.Unix(0, last)
	}
	return r, nil
}

// cpuWindow measures server and bench CPU over the publishing window.
type cpuWindow struct {
	start       time.Time
	serverStart scrape
	benchStart  time.Duration
	benchOK     bool
}

func (e *benchEnv) startCPU(ctx context.Context, stderr io.Writer) cpuWindow {
	w := cpuWindow{serverStart: e.scrapeOrWarn(ctx, stderr, "before the window")}
	w.benchStart, w.benchOK = processCPU()
	w.start = time.Now()
	return w
}

// cpuJSON is CPU use over the window.
type cpuJSON struct {
	WindowS                float64  `json:"window_s"`
	ServerCores            *float64 `json:"server_cores"`
	BenchCores             *float64 `json:"bench_cores"`
	ServerCPUUsPerDelivery *float64 `json:"server_cpu_us_per_delivery"`
	ServerSlowConsumer     *float64 `json:"server_slow_consumer_closes"`
	ServerQueueDrops       *float64 `json:"server_queue_full_drops"`
	ServerMessagesPerS     *float64 `json:"server_messages_per_s"`
	ServerFramesPerMessage *float64 `json:"server_frames_per_message"`
	ServerWriteDelayMs     *float64 `json:"server_write_delay_ms"`
	// Pacing ticks (50 ms) the server counted as overloaded, and messages
	// its shared writers left to a session's own goroutine on a full
	// socket, in the window.
	ServerOverloadTicks *float64 `json:"server_overload_ticks"`
	ServerWritesBlocked *float64 `json:"server_writes_blocked"`
}

// stop ends the window; deliveries is what the server delivered in it.
func (w cpuWindow) stop(ctx context.Context, e *benchEnv, stderr io.Writer, deliveries int64) cpuJSON {
	benchEnd, ok := processCPU()
	wall := time.Since(w.start)
	after := e.scrapeOrWarn(ctx, stderr, "after the window")
	j := cpuJSON{WindowS: round(wall.Seconds(), 3)}
	if ok && w.benchOK {
		j.BenchCores = ptr(round(ratio((benchEnd-w.benchStart).Seconds(), wall.Seconds()), 3))
	}
	if d := delta(w.serverStart, after, metricCPU); d != nil {
		j.ServerCores = ptr(round(ratio(*d, wall.Seconds()), 3))
		if deliveries > 0 {
			j.ServerCPUUsPerDelivery = ptr(round(*d/float64(deliveries)*1e6, 3))
		}
	}
	j.ServerSlowConsumer = optRound(delta(w.serverStart, after, metricSlowConsumer), 0)
	j.ServerQueueDrops = optRound(delta(w.serverStart, after, metricQueueDrops), 0)
	if msgs := delta(w.serverStart, after, metricMessagesOut); msgs != nil && *msgs > 0 {
		j.ServerMessagesPerS = ptr(round(*msgs/wall.Seconds(), 0))
		var frames float64
		for series := range after {
			if strings.HasPrefix(series, metricFramesOut+"{") {
				if d := delta(w.serverStart, after, series); d != nil {
					frames += *d
				}
			}
		}
		j.ServerFramesPerMessage = ptr(round(frames / *msgs, 2))
	}
	if d, ok := after.get(metricWriteDelay); ok {
		j.ServerWriteDelayMs = ptr(round(d*1000, 2))
	}
	j.ServerOverloadTicks = optRound(delta(w.serverStart, after, metricOverloads), 0)
	j.ServerWritesBlocked = optRound(delta(w.serverStart, after, metricBlocked), 0)
	return j
}

// String is the summary line form.
func (j cpuJSON) String() string {
	s := "cpu        "
	if j.ServerCores != nil {
		s += fmt.Sprintf("server %.2f cores", *j.ServerCores)
		if j.ServerCPUUsPerDelivery != nil {
			s += fmt.Sprintf(" (%.2f µs/delivery)", *j.ServerCPUUsPerDelivery)
		}
	} else {
		s += "server n/a"
	}
	if j.BenchCores != nil {
		s += fmt.Sprintf(", bench %.2f cores", *j.BenchCores)
	}
	s += fmt.Sprintf(" over %.2fs", j.WindowS)
	if j.ServerMessagesPerS != nil && j.ServerFramesPerMessage != nil {
		s += fmt.Sprintf("; server wrote %.0f msgs/s, %.2f frames/msg", *j.ServerMessagesPerS, *j.ServerFramesPerMessage)
	}
	if j.ServerWriteDelayMs != nil {
		s += fmt.Sprintf(", pacing delay %.1fms at the end", *j.ServerWriteDelayMs)
	}
	if j.ServerOverloadTicks != nil && *j.ServerOverloadTicks > 0 {
		s += fmt.Sprintf(", overloaded %.0f ticks", *j.ServerOverloadTicks)
	}
	if j.ServerWritesBlocked != nil && *j.ServerWritesBlocked > 0 {
		s += fmt.Sprintf(", %.0f writes blocked", *j.ServerWritesBlocked)
	}
	if j.ServerSlowConsumer != nil && *j.ServerSlowConsumer > 0 {
		s += fmt.Sprintf("; server closed %.0f slow consumers", *j.ServerSlowConsumer)
	}
	return s
}

// subsJSON is what fanout and topics report about their subscribers.
type subsJSON struct {
	SubDisconnects  int    `json:"sub_disconnects"`
	FirstDisconnect string `json:"first_disconnect,omitempty"`
	// Raw subscriber only (0 with -subscriber client): frames it could not
	// scan and decoded instead, those that did not decode either, and
	// frames other than its patches.
	FallbackDecodes int64 `json:"fallback_decodes"`
	Undecodable     int64 `json:"undecodable_frames,omitempty"`
	OtherFrames     int64 `json:"other_frames"`
	// Deliveries whose offset was not after the subscriber's previous one
	// (a duplicate, or a message that overtook an earlier one). They are
	// not counted as delivered, so the delivery ratio counts each message
	// once and in order.
	OutOfOrder int64 `json:"out_of_order"`
}

func (r loadResult) subsJSON() subsJSON {
	return subsJSON{
		SubDisconnects: r.disconnects, FirstDisconnect: r.firstDisconnect,
		FallbackDecodes: r.fallback, Undecodable: r.undecodable, OtherFrames: r.other,
		OutOfOrder: r.outOfOrder,
	}
}

// print writes the summary's subscriber lines.
func (j subsJSON) print(w io.Writer, mode string) {
	fmt.Fprintf(w, "  subs       %d disconnected", j.SubDisconnects)
	if j.FirstDisconnect != "" {
		fmt.Fprintf(w, "; first: %s", j.FirstDisconnect)
	}
	if j.OutOfOrder > 0 {
		fmt.Fprintf(w, "; %d deliveries repeated or out of order (not counted)", j.OutOfOrder)
	}
	fmt.Fprintln(w)
	printRawCounts(w, mode, j.FallbackDecodes, j.Undecodable, j.OtherFrames)
}
