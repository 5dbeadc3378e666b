package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// syncgate bench floor measures the machine, not the gateway: the fanout of
// bench fanout (N subscribers, R messages a second for T) carried by plain
// TCP between two processes and nothing else: no WebSocket, no JSON, no
// hub, no pacing delay. No gateway on this machine, with its load generator
// on the same cores, can deliver sooner than this at its batching (a
// gateway that batches more spends less CPU per delivery and waits
// longer), so it tells a latency target the machine cannot meet from one
// the gateway misses.
//
// The sender is a child process in the gateway's place. Each connection
// has a writer goroutine and an unbounded queue: a publish appends the
// record to every queue and wakes its writer, which sends whatever is
// queued in one write. That is the gateway's natural batching without its
// pacing delay, and the publisher never blocks on a slow reader, so no
// latency hides in a stalled publisher. The receiver is this process, in
// the bench's place: a goroutine per connection reads into a 64 KiB
// buffer and records each record's latency. A record is -size bytes: its
// send time (Unix ns, 8 bytes little endian), then 'x' padding. The send
// time is taken as the publish loop reaches the message, as bench fanout's
// publisher does, so both measure from the same moment.
//
// The two processes talk over the child's stdio: it prints its address,
// waits for "go" on stdin once the connections are up, publishes, writes
// out its queues, prints its report (one JSON line) and closes. It stops
// when its stdin ends: a receiver that is gone never leaves it behind.

const floorSynopsis = "-subs N -rate R -dur T [-size B] [-each]"

// floorDefaultSize is about a patch frame of bench fanout's default -size
// 100 as the gateway sends it (360 bytes).
const floorDefaultSize = 360

// floorMinSize holds the send time and one byte of padding. The receiver
// checks a record's first and last padding bytes to catch a record
// boundary gone astray.
const floorMinSize = 9

// floorListenPrefix starts the sender's first line; the address follows.
const floorListenPrefix = "floor sender listening on "

type floorFlags struct {
	subs    int
	rate    float64
	dur     time.Duration
	size    int
	wait    time.Duration
	timeout time.Duration
	role    string
	each    bool
}

func (f *floorFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&f.subs, "subs", 100, "receiving connections")
	fs.Float64Var(&f.rate, "rate", 1000, "messages per second, each to every connection")
	fs.DurationVar(&f.dur, "dur", 10*time.Second, "how long to send")
	fs.IntVar(&f.size, "size", floorDefaultSize, "bytes per message (the default is about a patch frame of bench fanout's default -size)")
	fs.DurationVar(&f.wait, "wait", 5*time.Second, "after -dur, how long to wait for the last deliveries")
	fs.DurationVar(&f.timeout, "timeout", 2*time.Minute, "hard bound on the whole run")
	fs.BoolVar(&f.each, "each", false, "send each message to one connection, round robin, as bench topics publishes to one subscriber's topic each (-rate is then the total)")
	fs.StringVar(&f.role, "role", "", "internal: 'sender' runs the sending side, which bench floor starts as a child process")
}

func (f *floorFlags) validate() error {
	switch {
	case f.subs < 1:
		return errors.New("bench floor: -subs must be at least 1")
	case !(f.rate > 0) || math.IsInf(f.rate, 0):
		return errors.New("bench floor: -rate must be positive")
	case f.dur <= 0:
		return errors.New("bench floor: -dur must be positive")
	case f.wait < 0 || f.timeout <= 0:
		return errors.New("bench floor: -wait must be at least 0 and -timeout positive")
	case f.size < floorMinSize || f.size > 64<<10:
		return fmt.Errorf("bench floor: -size must be from %d to 65536 bytes", floorMinSize)
	case f.role != "" && f.role != "sender":
		return fmt.Errorf("bench floor: unknown -role %q", f.role)
	}
	return nil
}

// floorSenderReport is the sender's JSON line to the receiver.
type floorSenderReport struct {
	Sent    int64   `json:"sent"`
	Behind  int64   `json:"behind"`
	StartNs int64   `json:"start_ns"` // start of the publish loop, Unix ns
	EndNs   int64   `json:"end_ns"`   // last send
	Cores   float64 `json:"cores"`    // CPU over go → queues written out
	CPUS    float64 `json:"cpu_s"`
	Writes  int64   `json:"writes"`
	Err     string  `json:"err,omitempty"`
}

// floorResult is the JSON line of bench floor.
type floorResult struct {
	Bench string  `json:"bench"`
	Subs  int     `json:"subs"`
	Each  bool    `json:"each"` // -each: one connection per message, round robin
	Rate  float64 `json:"rate"`
	DurS  float64 `json:"dur_s"`
	Size  int     `json:"size"`

	Sent        int64   `json:"sent"`
	Behind      int64   `json:"behind"`
	OfferedPerS float64 `json:"offered_per_s"`
	SenderError string  `json:"sender_error,omitempty"`

	Delivered     int64       `json:"delivered"`
	Expected      int64       `json:"expected"` // sent × subs (-each: sent)
	DeliveredPerS float64     `json:"delivered_per_s"`
	DeliveryRatio float64     `json:"delivery_ratio"`
	Lost          int64       `json:"lost"`
	Corrupt       int64       `json:"corrupt"` // connections that read a record without its padding
	DrainS        float64     `json:"drain_s"`
	Latency       latencyJSON `json:"latency_ms"`
	LatencyMethod string      `json:"latency_method"`

	SenderCores              float64 `json:"sender_cores"`
	ReceiverCores            float64 `json:"receiver_cores"`
	SenderCPUUsPerDelivery   float64 `json:"sender_cpu_us_per_delivery"`
	ReceiverCPUUsPerDelivery float64 `json:"receiver_cpu_us_per_delivery"`
	WritesPerS               float64 `json:"sender_writes_per_s"`
	RecordsPerWrite          float64 `json:"records_per_write"`
}

func benchFloor(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var f floorFlags
	fs := newFlagSet("floor", floorSynopsis)
	f.register(fs)
	if err := parseFlags(fs, args, stdout, stderr); err != nil {
		return err
	}
	if err := f.validate(); err != nil {
		return err
	}
	if err := raiseFDLimit(uint64(f.subs) + fdSlack); err != nil {
		return fmt.Errorf("bench floor: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	if f.role == "sender" {
		return floorSend(ctx, f, os.Stdin, stdout)
	}
	return floorReceive(ctx, f, stdout, stderr)
}

// floorQueue is one connection's queue on the sender.
type floorQueue struct {
	conn net.Conn
	wake chan struct{} // capacity 1: the writer has something to take

	mu  sync.Mutex
	buf []byte // guarded by mu
}

func (q *floorQueue) push(rec []byte) {
	q.mu.Lock()
	q.buf = append(q.buf, rec...)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// write sends what is queued, in one write each time it is woken, until
// wake is closed and the queue empty. After a failed write it only drains.
func (q *floorQueue) write(writes *atomic.Int64, firstErr *firstError) {
	var out []byte
	failed := false
	for range q.wake {
		q.mu.Lock()
		out, q.buf = q.buf, out[:0]
		q.mu.Unlock()
		if len(out) == 0 || failed {
			continue
		}
		if _, err := q.conn.Write(out); err != nil {
			firstErr.record(fmt.Errorf("write: %w", err))
			failed = true
			continue
		}
		writes.Add(1)
	}
}

// floorSend is the sender: listen, accept f.subs connections, wait for go,
// publish, write out, report on out, close. The end of in (the receiver
// gone) ends it at any point.
func floorSend(ctx context.Context, f floorFlags, in io.Reader, out io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	goSignal := make(chan struct{})
	go func() {
		defer cancel()
		br := bufio.NewReader(in)
		if line, err := br.ReadString('\n'); err != nil || line != "go\n" {
			return
		}
		close(goSignal)
		_, _ = io.Copy(io.Discard, br)
	}()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("bench floor sender: %w", err)
	}
	defer ln.Close()
	fmt.Fprintf(out, "%s%s\n", floorListenPrefix, ln.Addr())
	var (
		mu     sync.Mutex
		qs     []*floorQueue // guarded by mu until the connections are up
		closed bool          // guarded by mu
	)
	closeAll := func() {
		mu.Lock()
		defer mu.Unlock()
		closed = true
		for _, q := range qs {
			q.conn.Close()
		}
	}
	// Closing the listener and the connections unblocks Accept and the
	// writers when ctx ends; when it does not, they are closed on return.
	stop := context.AfterFunc(ctx, func() { ln.Close(); closeAll() })
	defer stop()
	defer closeAll()
	for len(qs) < f.subs {
		c, err := ln.Accept()
		if err != nil {
			return fmt.Errorf("bench floor sender: accept: %w", err)
		}
		mu.Lock()
		if closed {
			c.Close()
		}
		qs = append(qs, &floorQueue{conn: c, wake: make(chan struct{}, 1)})
		mu.Unlock()
	}
	select {
	case <-goSignal:
	case <-ctx.Done():
		return fmt.Errorf("bench floor sender: waiting for go: %w", context.Cause(ctx))
	}

	var (
		writes   atomic.Int64
		firstErr firstError
		wg       sync.WaitGroup
	)
	for _, q := range qs {
		wg.Go(func() { q.write(&writes, &firstErr) })
	}
	cpu0, _ := processCPU()
	t0 := time.Now()
	rec := make([]byte, f.size)
	for i := 8; i < len(rec); i++ {
		rec[i] = 'x'
	}
	run := pace(ctx, f.rate, f.dur, func(k int64, at time.Time) error {
		binary.LittleEndian.PutUint64(rec, uint64(at.UnixNano()))
		if f.each {
			qs[k%int64(len(qs))].push(rec)
			return nil
		}
		for _, q := range qs {
			q.push(rec)
		}
		return nil
	})
	for _, q := range qs {
		close(q.wake)
	}
	wg.Wait()
	cpu1, _ := processCPU()
	wall := time.Since(t0)
	r := floorSenderReport{
		Sent: run.sent, Behind: run.behind, StartNs: run.start.UnixNano(), EndNs: run.end.UnixNano(),
		CPUS: (cpu1 - cpu0).Seconds(), Cores: ratio((cpu1 - cpu0).Seconds(), wall.Seconds()), Writes: writes.Load(),
	}
	if run.err != nil {
		r.Err = run.err.Error()
	} else if e := firstErr.first(); e != "" {
		r.Err = e
	}
	return json.NewEncoder(out).Encode(r)
}

// floorSender is the child process, as seen by the receiver.
type floorSender struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string // its stdout, line by line; closed at EOF
	stderr *tailBuffer
}

func startFloorSender(ctx context.Context, f floorFlags) (*floorSender, string, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, "", err
	}
	s := &floorSender{lines: make(chan string, 4), stderr: &tailBuffer{max: 8 << 10}}
	s.cmd = exec.CommandContext(ctx, exe, "bench", "floor", "-role", "sender",
		"-subs", fmt.Sprint(f.subs), "-rate", fmt.Sprint(f.rate), "-dur", f.dur.String(),
		"-size", fmt.Sprint(f.size), "-timeout", f.timeout.String(), "-each="+fmt.Sprint(f.each))
	s.cmd.Env = append(os.Environ(), benchChildEnv+"=1")
	s.cmd.Stderr = s.stderr
	if s.stdin, err = s.cmd.StdinPipe(); err != nil {
		return nil, "", err
	}
	out, err := s.cmd.StdoutPipe()
	if err != nil {
		return nil, "", err
	}
	if err := s.cmd.Start(); err != nil {
		return nil, "", fmt.Errorf("bench floor: starting the sender: %w", err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			s.lines <- sc.Text()
		}
		close(s.lines)
	}()
	select {
	case l, ok := <-s.lines:
		if a, found := strings.CutPrefix(l, floorListenPrefix); ok && found {
			return s, a, nil
		}
	case <-ctx.Done():
	}
	s.stop()
	return nil, "", fmt.Errorf("bench floor: the sender did not start: %s", s.stderr)
}

// report waits for the sender's JSON line and its exit.
func (s *floorSender) report() (floorSenderReport, error) {
	var r floorSenderReport
	var got bool
	for l := range s.lines {
		if strings.HasPrefix(l, "{") && !got {
			got = json.Unmarshal([]byte(l), &r) == nil
		}
	}
	err := s.cmd.Wait()
	if !got {
		return r, fmt.Errorf("bench floor: the sender gave no report (%v): %s", err, s.stderr)
	}
	return r, nil
}

// stop kills the sender and waits for it.
func (s *floorSender) stop() {
	_ = s.cmd.Process.Kill()
	for range s.lines {
	}
	_ = s.cmd.Wait()
}

// floorConn is one receiving connection.
type floorConn struct {
	conn    net.Conn
	hist    *histShard
	count   atomic.Int64
	last    atomic.Int64 // Unix ns of the last record read
	corrupt bool         // owned by read
}

// read records every record's latency until the connection ends.
func (c *floorConn) read(size int) {
	buf := make([]byte, 64<<10)
	have := 0
	for {
		n, err := c.conn.Read(buf[have:])
		now := time.Now().UnixNano()
		have += n
		k := 0
		for ; have-k >= size; k += size {
			if buf[k+8] != 'x' || buf[k+size-1] != 'x' {
				// Count what came before; closing tells the sender
				// to stop writing here.
				c.corrupt = true
				c.count.Add(int64(k / size))
				c.conn.Close()
				return
			}
			c.hist.record(now - int64(binary.LittleEndian.Uint64(buf[k:])))
		}
		if k > 0 {
			c.count.Add(int64(k / size))
			c.last.Store(now)
			have = copy(buf, buf[k:have])
		}
		if err != nil {
			return
		}
	}
}

func floorReceive(ctx context.Context, f floorFlags, stdout, stderr io.Writer) error {
	snd, addr, err := startFloorSender(ctx, f)
	if err != nil {
		return err
	}
	hist := newHistogram()
	cs := make([]*floorConn, f.subs)
	d := net.Dialer{Control: loopbackOnly}
	for i := range cs {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			for _, c := range cs[:i] {
				c.conn.Close()
			}
			snd.stop()
			return fmt.Errorf("bench floor: dial %s: %w", addr, err)
		}
		cs[i] = &floorConn{conn: c, hist: hist.shard(i)}
	}
	each := "each to every connection"
	if f.each {
		each = "each to one connection, round robin"
	}
	fmt.Fprintf(stdout, "floor: %d connections over plain TCP, %g msgs/s (%s) for %s, %d-byte messages\n",
		f.subs, f.rate, each, f.dur, f.size)
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Go(func() { c.read(f.size) })
	}
	cpu0, _ := processCPU()
	t0 := time.Now()
	if _, err := io.WriteString(snd.stdin, "go\n"); err != nil {
		fmt.Fprintf(stderr, "bench floor: starting the sender: %v\n", err)
	}
	// The sender closes every connection once it has written everything;
	// past -dur + -wait (or on ctx) the receiver stops reading.
	readers := make(chan struct{})
	go func() { wg.Wait(); close(readers) }()
	limit := time.NewTimer(f.dur + time.Second + f.wait)
	select {
	case <-readers:
	case <-limit.C:
	case <-ctx.Done():
	}
	limit.Stop()
	for _, c := range cs {
		c.conn.Close()
	}
	<-readers
	cpu1, _ := processCPU()
	if ctx.Err() != nil {
		snd.stop()
		return fmt.Errorf("bench floor: stopped after -timeout %s or by a signal: %w", f.timeout, ctx.Err())
	}
	var last int64
	r := floorResult{Bench: "floor", Subs: f.subs, Each: f.each, Rate: f.rate, DurS: f.dur.Seconds(), Size: f.size,
		LatencyMethod: histMethod}
	for _, c := range cs {
		r.Delivered += c.count.Load()
		last = max(last, c.last.Load())
		if c.corrupt {
			r.Corrupt++
		}
	}
	wall := time.Since(t0)
	if last > 0 {
		wall = time.Unix(0, last).Sub(t0)
	}
	sr, err := snd.report()
	if err != nil {
		return err
	}
	start, end := time.Unix(0, sr.StartNs), time.Unix(0, sr.EndNs)
	r.Sent, r.Behind, r.SenderError = sr.Sent, sr.Behind, sr.Err
	r.OfferedPerS = perSecond(float64(sr.Sent), end.Sub(start))
	r.Expected = sr.Sent * int64(f.subs)
	if f.each {
		r.Expected = sr.Sent
	}
	r.DeliveryRatio = round(ratio(float64(r.Delivered), float64(r.Expected)), 6)
	r.Lost = max(0, r.Expected-r.Delivered)
	span := end.Sub(start)
	if last > 0 {
		span = max(span, time.Unix(0, last).Sub(start))
		r.DrainS = round(max(0, time.Unix(0, last).Sub(end).Seconds()), 3)
	}
	r.DeliveredPerS = perSecond(float64(r.Delivered), span)
	r.Latency = hist.snapshot().json()
	r.SenderCores = round(sr.Cores, 3)
	r.ReceiverCores = round(ratio((cpu1-cpu0).Seconds(), wall.Seconds()), 3)
	if r.Delivered > 0 {
		r.SenderCPUUsPerDelivery = round(sr.CPUS/float64(r.Delivered)*1e6, 3)
		r.ReceiverCPUUsPerDelivery = round((cpu1-cpu0).Seconds()/float64(r.Delivered)*1e6, 3)
	}
	r.WritesPerS = round(perSecond(float64(sr.Writes), span), 0)
	r.RecordsPerWrite = round(ratio(float64(r.Delivered), float64(sr.Writes)), 2)

	fmt.Fprintf(stdout, "  sent       %d (%.1f/s offered, %d behind)\n", r.Sent, r.OfferedPerS, r.Behind)
	if r.SenderError != "" {
		fmt.Fprintf(stdout, "             sender: %s\n", r.SenderError)
	}
	fmt.Fprintf(stdout, "  delivered  %d of %d (ratio %.4f, %d lost, %d corrupt), %.0f deliveries/s, last %.3fs after sending\n",
		r.Delivered, r.Expected, r.DeliveryRatio, r.Lost, r.Corrupt, r.DeliveredPerS, r.DrainS)
	fmt.Fprintf(stdout, "  latency    %s (%d samples)\n", r.Latency, r.Latency.Count)
	fmt.Fprintf(stdout, "  cpu        sender %.2f cores (%.2f µs/delivery), receiver %.2f cores (%.2f µs/delivery); %.0f writes/s, %.2f records/write\n",
		r.SenderCores, r.SenderCPUUsPerDelivery, r.ReceiverCores, r.ReceiverCPUUsPerDelivery, r.WritesPerS, r.RecordsPerWrite)
	return writeJSON(stdout, r)
}
