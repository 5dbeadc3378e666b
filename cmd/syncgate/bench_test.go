package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/internal/gwtest"
)

// startGateway runs a gateway on a loopback httptest server and returns
// its WebSocket URL.
func startGateway(t *testing.T) string {
	t.Helper()
	gw, err := gateway.New(gateway.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(gw.Handler())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if err := gw.Shutdown(ctx); err != nil {
			t.Errorf("gateway shutdown: %v", err)
		}
		ts.Close()
	})
	return gwtest.WSURL(ts.URL)
}

// runBench runs syncgate bench with args and decodes its JSON line into v.
func runBench(t *testing.T, v any, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	if err := bench(ctx, args, &out, &errOut); err != nil {
		t.Fatalf("bench %v: %v\nstdout:\n%s\nstderr:\n%s", args, err, out.String(), errOut.String())
	}
	stdout := out.String()
	var lines []string
	for line := range strings.Lines(stdout) {
		if strings.HasPrefix(line, `{"bench"`) {
			lines = append(lines, line)
		}
	}
	if len(lines) != 1 || !strings.HasPrefix(lines[0], `{"bench":"`+args[0]+`"`) {
		t.Fatalf("want exactly one JSON line for %s, got %d; stdout:\n%s", args[0], len(lines), stdout)
	}
	if err := json.Unmarshal([]byte(lines[0]), v); err != nil {
		t.Fatalf("JSON line: %v\n%s", err, lines[0])
	}
	t.Logf("stdout:\n%s", stdout)
	if errOut.Len() > 0 {
		t.Logf("stderr:\n%s", errOut.String())
	}
	return lines[0]
}

func TestBench_Fanout(t *testing.T) {
	t.Parallel()
	url := startGateway(t)
	var r fanoutResult
	runBench(t, &r, "fanout", "-url", url, "-subs", "20", "-rate", "200", "-dur", "1s")
	if r.Sent != 200 || r.Acked != 200 || r.PublishErrors != 0 {
		t.Errorf("sent %d, acked %d, errors %d; want 200, 200, 0", r.Sent, r.Acked, r.PublishErrors)
	}
	if r.DeliveryRatio != 1 || r.Delivered != 200*20 || r.Lost != 0 {
		t.Errorf("delivered %d (ratio %v, lost %d); want 4000 (1, 0)", r.Delivered, r.DeliveryRatio, r.Lost)
	}
	if r.Latency.P99 <= 0 || r.Latency.Count != uint64(r.Delivered) || r.Latency.Max < r.Latency.P99 {
		t.Errorf("latency %+v", r.Latency)
	}
	if r.ServerCores == nil || r.BenchCores == nil || r.ServerCPUUsPerDelivery == nil {
		t.Errorf("CPU figures missing: %+v", r.cpuJSON)
	}
	if r.SubDisconnects != 0 {
		t.Errorf("%d subscribers disconnected: %s", r.SubDisconnects, r.FirstDisconnect)
	}
}

func TestBench_Topics(t *testing.T) {
	t.Parallel()
	url := startGateway(t)
	var r topicsResult
	runBench(t, &r, "topics", "-url", url, "-n", "20", "-rate", "500", "-dur", "1s", "-size", "200")
	if r.Sent != 500 || r.Acked != 500 || r.PublishErrors != 0 {
		t.Errorf("sent %d, acked %d, errors %d; want 500, 500, 0", r.Sent, r.Acked, r.PublishErrors)
	}
	if r.DeliveryRatio != 1 || r.Delivered != 500 {
		t.Errorf("delivered %d (ratio %v); want 500 (1)", r.Delivered, r.DeliveryRatio)
	}
	if r.AckLatency.P99 <= 0 || r.DeliveryLatency.P99 <= 0 || r.AckLatency.Count != 500 {
		t.Errorf("ack latency %+v, delivery latency %+v", r.AckLatency, r.DeliveryLatency)
	}
	if r.Size != 200 {
		t.Errorf("size %d, want 200", r.Size)
	}
}

func TestBench_Connect(t *testing.T) {
	t.Parallel()
	url := startGateway(t)
	var r connectResult
	runBench(t, &r, "connect", "-url", url, "-n", "50", "-hold", "200ms")
	if r.Connected != 50 || r.Failed != 0 {
		t.Errorf("connected %d, failed %d (%s); want 50, 0", r.Connected, r.Failed, r.FirstError)
	}
	if r.SessionsSeen == nil || *r.SessionsSeen < 50 {
		t.Errorf("sessions seen %v, want ≥ 50", r.SessionsSeen)
	}
	if r.RSSPerSessionKiB == nil || r.RSSHeldBytes == nil || *r.RSSHeldBytes <= 0 {
		t.Errorf("RSS per session %v, held %v: want both reported", r.RSSPerSessionKiB, r.RSSHeldBytes)
	}
	if r.ConnectsPerS <= 0 || r.ConnectTime.P99 <= 0 {
		t.Errorf("connects/s %v, connect time %+v", r.ConnectsPerS, r.ConnectTime)
	}
}

func TestBench_RefusesRemote(t *testing.T) {
	t.Parallel()
	// A non-loopback IP literal is refused before any lookup or dial: with
	// nothing listening at 10.1.2.3, a dial would hang until -dial-timeout.
	tests := []struct {
		name string
		args []string
	}{
		{"fanout", []string{"fanout", "-url", "ws://10.1.2.3:1/v1/ws", "-subs", "1", "-rate", "1", "-dur", "1s"}},
		{"topics", []string{"topics", "-url", "ws://10.1.2.3:1/v1/ws", "-n", "1", "-rate", "1", "-dur", "1s"}},
		{"connect", []string{"connect", "-url", "ws://10.1.2.3:1/v1/ws", "-n", "1"}},
		{"metrics", []string{"connect", "-url", "ws://127.0.0.1:1/v1/ws", "-metrics", "http://10.1.2.3:1/metrics", "-n", "1"}},
		{"ipv6", []string{"connect", "-url", "ws://[2001:db8::1]:1/v1/ws", "-n", "1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var out, errOut bytes.Buffer
			args := slices.Concat(tt.args, []string{"-dial-timeout", "1m", "-timeout", "2m"})
			start := time.Now()
			err := bench(t.Context(), args, &out, &errOut)
			if err == nil || !strings.Contains(err.Error(), "not loopback") || !strings.Contains(err.Error(), "-allow-remote") {
				t.Fatalf("err = %v; want a refusal naming loopback and -allow-remote", err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("refusal took %s", d)
			}
			if out.Len() != 0 {
				t.Errorf("stdout: %q", out.String())
			}
		})
	}
}

func TestBench_Usage(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{nil, {"nope"}, {"fanout", "-bogus"}, {"topics", "extra"}} {
		var out, errOut bytes.Buffer
		err := bench(t.Context(), args, &out, &errOut)
		if err == nil {
			t.Errorf("bench %q: no error", args)
		}
		if len(args) < 2 && (!errors.Is(err, errUsage) || !strings.Contains(errOut.String(), "connect") ||
			!strings.Contains(errOut.String(), "fanout") || !strings.Contains(errOut.String(), "topics")) {
			t.Errorf("bench %q: err %v, stderr %q; want usage listing the commands", args, err, errOut.String())
		}
	}
}

func Test_loopbackOnly(t *testing.T) {
	t.Parallel()
	for addr, ok := range map[string]bool{
		"127.0.0.1:8080": true, "127.9.9.9:1": true, "[::1]:80": true, "[::ffff:127.0.0.1]:80": true,
		"10.1.2.3:1": false, "[2001:db8::1]:1": false, "0.0.0.0:80": false,
	} {
		if err := loopbackOnly("tcp", addr, nil); (err == nil) != ok {
			t.Errorf("loopbackOnly(%s) = %v", addr, err)
		}
	}
}

func Test_appendData(t *testing.T) {
	t.Parallel()
	ts := time.Now().UnixNano()
	for _, size := range []int{minDataSize, 100, 1000} {
		d := appendData([]byte("junk"), ts, size)[4:]
		if len(d) != size {
			t.Errorf("size %d: got %d bytes: %s", size, len(d), d)
		}
		var v struct {
			T int64  `json:"t"`
			P string `json:"p"`
		}
		if err := json.Unmarshal(d, &v); err != nil || v.T != ts {
			t.Errorf("size %d: %s: %v, t=%d", size, d, err, v.T)
		}
		row := `{"id":"0000001700000000000_0000000000000042","data":` + string(d) + `,"actorId":null,"at":1700000000000}`
		if got, ok := rowSendTime([]byte(row)); !ok || got != ts {
			t.Errorf("rowSendTime(%s) = %d, %v; want %d", row, got, ok, ts)
		}
	}
	for _, row := range []string{`{"id":"1","data":{"x":1}}`, `{"id":"1","data":{"t":"1"}}`, ``} {
		if _, ok := rowSendTime([]byte(row)); ok {
			t.Errorf("rowSendTime(%s) found a time", row)
		}
	}
}

func Test_histogramError(t *testing.T) {
	t.Parallel()
	for _, v := range []int64{0, 1, 127, 128, 129, 1000, 12345, 999_999, 1_000_000, 123_456_789, 5e9, histMaxValue} {
		h := newHistogram()
		h.shard(3).record(v)
		s := h.snapshot()
		for _, q := range []float64{0.5, 0.99, 1} {
			got := s.quantile(q)
			if e := math.Abs(float64(got-v)) / math.Max(float64(v), 1); e > 0.01 {
				t.Errorf("value %d: q%v = %d (error %.4f)", v, q, got, e)
			}
		}
		if s.max != v || s.total != 1 {
			t.Errorf("value %d: max %d, total %d", v, s.max, s.total)
		}
	}
	// Every value maps into a bucket whose midpoint is within 1%.
	for v := int64(0); v < 1<<22; v += 1 + v/1000 {
		if mid := histMid(histIndex(v)); math.Abs(float64(mid-v)) > 0.01*float64(max(v, 1)) {
			t.Fatalf("value %d: bucket %d midpoint %d", v, histIndex(v), mid)
		}
	}
	if got := histIndex(histMaxValue); got != histBuckets-1 {
		t.Errorf("histIndex(max) = %d, want %d", got, histBuckets-1)
	}
	h := newHistogram()
	for i := range 100 {
		h.shard(i).record(int64(i+1) * 1000)
	}
	s := h.snapshot()
	for q, want := range map[float64]int64{0.5: 50_000, 0.95: 95_000, 0.99: 99_000, 1: 100_000} {
		if got := s.quantile(q); math.Abs(float64(got-want)) > 0.01*float64(want) {
			t.Errorf("q%v = %d, want %d ±1%%", q, got, want)
		}
	}
}

func Test_parseMetrics(t *testing.T) {
	t.Parallel()
	s, err := parseMetrics(strings.NewReader(`# HELP x y
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 1.25
syncgate_closes_total{reason="slow_consumer"} 3
syncgate_sessions 5 1700000000000
process_resident_memory_bytes 1.2345e+07
`))
	if err != nil {
		t.Fatal(err)
	}
	for series, want := range map[string]float64{
		metricCPU: 1.25, metricSlowConsumer: 3, metricSessions: 5, metricRSS: 12345000,
	} {
		if got, ok := s.get(series); !ok || got != want {
			t.Errorf("%s = %v, %v; want %v", series, got, ok, want)
		}
	}
	if _, err := parseMetrics(strings.NewReader("novalue\n")); err == nil {
		t.Error("no error for a line without a value")
	}
}
