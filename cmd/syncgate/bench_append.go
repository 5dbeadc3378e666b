package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/storage"
)

// syncgate bench append measures the stream log, in this process, on a
// fresh data directory: sequential and concurrent idempotent appends with
// fsync, the one-transaction-per-append baseline, appends through the
// Durable Streams HTTP API of an in-process gateway on loopback, and a
// catch-up read over HTTP.

const appendSynopsis = `[-phases seq,tx1,group,http,read] [-dur 3s] [-producers 256] [-http-producers 64] [-size 200] [-read-records 1000000] [-dir DIR]`

type appendFlags struct {
	phases        string
	dur           time.Duration
	producers     int
	httpProducers int
	size          int
	readRecords   int
	dir           string
	timeout       time.Duration
}

// appendPhase is one phase's result.
type appendPhase struct {
	Phase       string      `json:"phase"`
	Producers   int         `json:"producers"`
	Appends     int64       `json:"appends"`
	Seconds     float64     `json:"seconds"`
	PerSecond   float64     `json:"per_second"` // acked appends, or records read in phase read
	Latency     latencyJSON `json:"latency"`
	Records     int64       `json:"records,omitempty"`
	Bytes       int64       `json:"bytes,omitempty"`
	BytesPerSec float64     `json:"bytes_per_second,omitempty"`
}

func benchAppend(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var f appendFlags
	fs := newFlagSet("append", appendSynopsis)
	fs.StringVar(&f.phases, "phases", "seq,tx1,group,http,read", "phases to run, in order: seq (1 producer), tx1 (one transaction per append, -producers), "+
		"group (group commit, -producers), http (Durable Streams POSTs, -http-producers), read (HTTP catch-up of -read-records)")
	fs.DurationVar(&f.dur, "dur", 3*time.Second, "length of each timed phase")
	fs.IntVar(&f.producers, "producers", 256, "concurrent producers in tx1 and group")
	fs.IntVar(&f.httpProducers, "http-producers", 64, "concurrent producers in http")
	fs.IntVar(&f.size, "size", 200, "record size in bytes")
	fs.IntVar(&f.readRecords, "read-records", 1000000, "records the read phase catches up on")
	fs.StringVar(&f.dir, "dir", "", "data directory, without an earlier run's logs (default: a new temporary directory, removed afterwards)")
	fs.DurationVar(&f.timeout, "timeout", 5*time.Minute, "hard bound on the whole run")
	if err := parseFlags(fs, args, stdout, stderr); err != nil {
		return err
	}
	if f.dur <= 0 || f.producers <= 0 || f.httpProducers <= 0 || f.size <= 0 || f.readRecords <= 0 {
		return errors.New("bench append: -dur, -producers, -http-producers, -size and -read-records must be positive")
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	dir := f.dir
	if dir == "" {
		d, err := os.MkdirTemp("", "syncgate-bench-append-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	var results []appendPhase
	for _, phase := range strings.Split(f.phases, ",") {
		phase = strings.TrimSpace(phase)
		switch phase {
		case "seq", "tx1", "group", "http", "read":
		default:
			return fmt.Errorf("bench append: unknown phase %q", phase)
		}
		// Each phase needs a new log: in an earlier run's, the producer
		// table holds the seqs the producers start from again, so every
		// append would be a duplicate, answered without a write and
		// counted all the same.
		file := filepath.Join(dir, phase+".db")
		if _, err := os.Stat(file); !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("bench append: -dir %s already holds %s (an earlier run's log?): use a new or empty -dir", dir, filepath.Base(file))
		}
		var r appendPhase
		var err error
		switch phase {
		case "seq":
			r, err = appendStorage(ctx, file, nil, phase, 1, f)
		case "tx1":
			// A batch bound of one byte makes every append its own
			// transaction and fsync: the design group commit replaces.
			r, err = appendStorage(ctx, file, &storage.Options{MaxBatchBytes: 1}, phase, f.producers, f)
		case "group":
			r, err = appendStorage(ctx, file, nil, phase, f.producers, f)
		case "http":
			r, err = appendHTTP(ctx, file, f)
		case "read":
			r, err = readHTTP(ctx, file, f)
		}
		if err != nil {
			return fmt.Errorf("bench append: %s: %w", phase, err)
		}
		if r.Phase == "read" {
			fmt.Fprintf(stdout, "%-6s %d records caught up at %.0f records/s, %.1f MB/s; per GET %s\n",
				r.Phase, r.Records, r.PerSecond, r.BytesPerSec/1e6, r.Latency)
		} else {
			fmt.Fprintf(stdout, "%-6s producers=%-4d appends=%-9d %10.0f acked/s  latency %s\n",
				r.Phase, r.Producers, r.Appends, r.PerSecond, r.Latency)
		}
		results = append(results, r)
	}
	return writeJSON(stdout, map[string]any{"bench": "append", "size": f.size, "dur_s": f.dur.Seconds(), "phases": results})
}

// timedProducers runs n producers, each calling one(i, seq) with seq
// 0, 1, 2, … until dur passes, and records each call's latency.
func timedProducers(ctx context.Context, phase string, n int, dur time.Duration, one func(ctx context.Context, i int, seq int64) error) (appendPhase, error) {
	hist := newHistogram()
	var total atomic.Int64
	var fail firstError
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(dur)
	for i := range n {
		wg.Go(func() {
			shard := hist.shard(i)
			for seq := int64(0); time.Now().Before(deadline) && ctx.Err() == nil; seq++ {
				t0 := time.Now()
				if err := one(ctx, i, seq); err != nil {
					fail.record(err)
					return
				}
				shard.record(int64(time.Since(t0)))
				total.Add(1)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if msg := fail.first(); msg != "" {
		return appendPhase{}, errors.New(msg)
	}
	if err := ctx.Err(); err != nil {
		return appendPhase{}, err
	}
	return appendPhase{Phase: phase, Producers: n, Appends: total.Load(), Seconds: round(elapsed.Seconds(), 3),
		PerSecond: perSecond(float64(total.Load()), elapsed), Latency: hist.snapshot().json()}, nil
}

// appendStorage appends size-byte records with n idempotent producers
// straight into a log at file.
func appendStorage(ctx context.Context, file string, opts *storage.Options, phase string, n int, f appendFlags) (appendPhase, error) {
	db, err := storage.Open(file, opts)
	if err != nil {
		return appendPhase{}, err
	}
	defer db.Close()
	if _, _, err := db.Create(ctx, "bench", storage.CreateOptions{ContentType: "application/octet-stream"}); err != nil {
		return appendPhase{}, err
	}
	rec := bytes.Repeat([]byte("x"), f.size)
	return timedProducers(ctx, phase, n, f.dur, func(ctx context.Context, i int, seq int64) error {
		_, err := db.Append(ctx, "bench", storage.AppendRequest{Records: [][]byte{rec},
			Producer: &storage.Producer{ID: "p" + strconv.Itoa(i), Seq: seq}})
		return err
	})
}

// benchGateway serves a gateway over a log at file on a loopback port.
type benchGateway struct {
	db   *storage.DB
	gw   *gateway.Server
	hs   *http.Server
	base string // http://127.0.0.1:port/v1/stream/
	http *http.Client
}

func startBenchGateway(file string, conns int) (*benchGateway, error) {
	db, err := storage.Open(file, nil)
	if err != nil {
		return nil, err
	}
	gw, err := gateway.New(gateway.Config{Log: db})
	if err != nil {
		db.Close()
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		db.Close()
		return nil, err
	}
	hs := &http.Server{Handler: gw.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	tr := &http.Transport{MaxIdleConnsPerHost: conns, DialContext: (&net.Dialer{Control: loopbackOnly}).DialContext}
	return &benchGateway{db: db, gw: gw, hs: hs, base: "http://" + ln.Addr().String() + "/v1/stream/",
		http: &http.Client{Transport: tr}}, nil
}

func (g *benchGateway) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = g.gw.Shutdown(ctx)
	_ = g.hs.Shutdown(ctx)
	g.http.CloseIdleConnections()
	_ = g.db.Close()
}

// do sends one request and fails unless it answers one of the 2xx codes.
func (g *benchGateway) do(req *http.Request) (*http.Response, []byte, error) {
	resp, err := g.http.Do(req)
	if err != nil {
		return nil, nil, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil && resp.StatusCode/100 != 2 {
		err = fmt.Errorf("%s %s: %s: %s", req.Method, req.URL.Path, resp.Status, bytes.TrimSpace(body))
	}
	return resp, body, err
}

// startBenchStream starts a gateway and creates the octet-stream stream
// "bench" through its HTTP API.
func startBenchStream(ctx context.Context, file string, conns int) (*benchGateway, error) {
	g, err := startBenchGateway(file, conns)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, g.base+"bench", nil)
	if err == nil {
		req.Header.Set("Content-Type", "application/octet-stream")
		_, _, err = g.do(req)
	}
	if err != nil {
		g.close()
		return nil, err
	}
	return g, nil
}

// appendHTTP appends through the Durable Streams API with idempotent
// producer headers.
func appendHTTP(ctx context.Context, file string, f appendFlags) (appendPhase, error) {
	g, err := startBenchStream(ctx, file, f.httpProducers)
	if err != nil {
		return appendPhase{}, err
	}
	defer g.close()
	rec := bytes.Repeat([]byte("x"), f.size)
	return timedProducers(ctx, "http", f.httpProducers, f.dur, func(ctx context.Context, i int, seq int64) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.base+"bench", bytes.NewReader(rec))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/octet-stream")
		req.Header.Set("Producer-Id", "p"+strconv.Itoa(i))
		req.Header.Set("Producer-Epoch", "0")
		req.Header.Set("Producer-Seq", strconv.FormatInt(seq, 10))
		_, _, err = g.do(req)
		return err
	})
}

// readHTTP writes f.readRecords records into a stream (1,000 per append,
// straight into the log), then times a catch-up read of all of them over
// HTTP, following Stream-Next-Offset until Stream-Up-To-Date.
func readHTTP(ctx context.Context, file string, f appendFlags) (appendPhase, error) {
	g, err := startBenchStream(ctx, file, 1)
	if err != nil {
		return appendPhase{}, err
	}
	defer g.close()
	rec := bytes.Repeat([]byte("x"), f.size)
	batch := make([][]byte, 1000)
	for i := range batch {
		batch[i] = rec
	}
	for left := f.readRecords; left > 0; left -= len(batch) {
		if _, err := g.db.Append(ctx, "bench", storage.AppendRequest{Records: batch[:min(left, len(batch))]}); err != nil {
			return appendPhase{}, err
		}
	}
	hist := newHistogram()
	var n int64
	start := time.Now()
	for offset := "-1"; ; {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.base+"bench?offset="+offset, nil)
		if err != nil {
			return appendPhase{}, err
		}
		t0 := time.Now()
		resp, body, err := g.do(req)
		if err != nil {
			return appendPhase{}, err
		}
		hist.shard(0).record(int64(time.Since(t0)))
		n += int64(len(body))
		if resp.Header.Get("Stream-Up-To-Date") == "true" {
			break
		}
		offset = resp.Header.Get("Stream-Next-Offset")
	}
	elapsed := time.Since(start)
	if want := int64(f.readRecords) * int64(f.size); n != want {
		return appendPhase{}, fmt.Errorf("read %d bytes, want %d", n, want)
	}
	return appendPhase{Phase: "read", Producers: 1, Appends: 0, Seconds: round(elapsed.Seconds(), 3),
		PerSecond: perSecond(float64(f.readRecords), elapsed), Latency: hist.snapshot().json(),
		Records: int64(f.readRecords), Bytes: n, BytesPerSec: perSecond(float64(n), elapsed)}, nil
}
