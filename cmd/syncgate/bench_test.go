package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/syncgate/syncgate/frames"
	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/internal/gwtest"
)

// startGateway runs a gateway on a loopback httptest server and returns
// its WebSocket URL.
func startGateway(t *testing.T) string {
	t.Helper()
	_, ts := serveGateway(t, gateway.Config{})
	return gwtest.WSURL(ts.URL)
}

// serveGateway runs a gateway of cfg on a loopback httptest server, shut
// down (within 20 s) at the test's end.
func serveGateway(t *testing.T, cfg gateway.Config) (*gateway.Server, *httptest.Server) {
	t.Helper()
	gw, err := gateway.New(cfg)
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
	return gw, ts
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
	for _, mode := range []string{subscriberRaw, subscriberClient} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			url := startGateway(t)
			var r fanoutResult
			runBench(t, &r, "fanout", "-url", url, "-subs", "20", "-rate", "200", "-dur", "1s", "-subscriber", mode)
			if r.Subscriber != mode {
				t.Errorf("subscriber %q, want %q", r.Subscriber, mode)
			}
			if r.Sent != 200 || r.Acked != 200 || r.PublishErrors != 0 {
				t.Errorf("sent %d, acked %d, errors %d; want 200, 200, 0", r.Sent, r.Acked, r.PublishErrors)
			}
			if r.DeliveryRatio != 1 || r.Delivered != 200*20 || r.Lost != 0 {
				t.Errorf("delivered %d (ratio %v, lost %d); want 4000 (1, 0)", r.Delivered, r.DeliveryRatio, r.Lost)
			}
			if r.FallbackDecodes != 0 || r.Undecodable != 0 || r.Unparsable != 0 {
				t.Errorf("fallback decodes %d, undecodable %d, unparsable %d; want 0", r.FallbackDecodes, r.Undecodable, r.Unparsable)
			}
			if r.Latency.P99 <= 0 || r.Latency.Count != uint64(r.Delivered) || r.Latency.Max < r.Latency.P99 {
				t.Errorf("latency %+v", r.Latency)
			}
			if r.ServerCores == nil || r.BenchCores == nil || r.ServerCPUUsPerDelivery == nil {
				t.Errorf("CPU figures missing: %+v", r.cpuJSON)
			}
			if r.ServerOverloadTicks == nil || r.ServerWritesBlocked == nil {
				t.Errorf("pacing figures missing: %+v", r.cpuJSON)
			}
			if r.SubDisconnects != 0 || r.OutOfOrder != 0 {
				t.Errorf("%d subscribers disconnected (%s), %d deliveries out of order", r.SubDisconnects, r.FirstDisconnect, r.OutOfOrder)
			}
		})
	}
}

func TestBench_Topics(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{subscriberRaw, subscriberClient} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			url := startGateway(t)
			var r topicsResult
			runBench(t, &r, "topics", "-url", url, "-n", "20", "-rate", "200", "-dur", "1s", "-size", "200", "-subscriber", mode)
			if r.Subscriber != mode {
				t.Errorf("subscriber %q, want %q", r.Subscriber, mode)
			}
			if r.Sent != 200 || r.Acked != 200 || r.PublishErrors != 0 {
				t.Errorf("sent %d, acked %d, errors %d; want 200, 200, 0", r.Sent, r.Acked, r.PublishErrors)
			}
			if r.DeliveryRatio != 1 || r.Delivered != 200 || r.Lost != 0 {
				t.Errorf("delivered %d (ratio %v, lost %d); want 200 (1, 0)", r.Delivered, r.DeliveryRatio, r.Lost)
			}
			if r.FallbackDecodes != 0 || r.Undecodable != 0 || r.Unparsable != 0 {
				t.Errorf("fallback decodes %d, undecodable %d, unparsable %d; want 0", r.FallbackDecodes, r.Undecodable, r.Unparsable)
			}
			if r.AckLatency.P99 <= 0 || r.DeliveryLatency.P99 <= 0 || r.AckLatency.Count != 200 ||
				r.DeliveryLatency.Count != uint64(r.Delivered) {
				t.Errorf("ack latency %+v, delivery latency %+v", r.AckLatency, r.DeliveryLatency)
			}
			if r.Size != 200 {
				t.Errorf("size %d, want 200", r.Size)
			}
			if r.SubDisconnects != 0 || r.OutOfOrder != 0 {
				t.Errorf("%d subscribers disconnected (%s), %d deliveries out of order", r.SubDisconnects, r.FirstDisconnect, r.OutOfOrder)
			}
		})
	}
}

// TestBench_Append runs every phase of bench append, briefly, on a
// temporary directory: each phase appends (or reads) something, and the
// read phase reads back exactly what it wrote.
func TestBench_Append(t *testing.T) {
	var res struct {
		Phases []appendPhase `json:"phases"`
	}
	runBench(t, &res, "append", "-dur", "200ms", "-producers", "8", "-http-producers", "4",
		"-read-records", "3000", "-dir", t.TempDir())
	var names []string
	for _, p := range res.Phases {
		names = append(names, p.Phase)
		if p.PerSecond <= 0 || p.Latency.Count == 0 {
			t.Errorf("phase %s measured nothing: %+v", p.Phase, p)
		}
	}
	if fmt.Sprint(names) != "[seq tx1 group http read]" {
		t.Fatalf("phases %v", names)
	}
	if r := res.Phases[4]; r.Records != 3000 || r.Bytes != 3000*200 {
		t.Fatalf("read phase %+v", r)
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

// TestBench_Storm runs both modes with 50 sessions on two child nodes (the
// test binary, see init in storm_test.go).
func TestBench_Storm(t *testing.T) {
	t.Parallel()
	var r stormReport
	runBench(t, &r, "storm", "-n", "50", "-spread", "1s", "-grace", "2s", "-rate", "10")
	if r.N != 50 || len(r.Modes) != 2 || r.Modes[0].Mode != stormPlan || r.Modes[1].Mode != stormCloseAll {
		t.Fatalf("report: n %d, %d modes; want 50, plan then close-all", r.N, len(r.Modes))
	}
	for _, m := range r.Modes {
		if m.Connected != 50 || m.Reconnected != 50 {
			t.Errorf("%s: connected %d, reconnected %d; want 50, 50", m.Mode, m.Connected, m.Reconnected)
		}
		// A drain answers every publish before it closes; a SIGKILL can
		// lose the ack of a publish A stored, which the client then sends
		// to B: only those unanswered at the kill may be in both logs.
		bothAllowed := int64(0)
		if m.Mode == stormCloseAll {
			bothAllowed = m.UnansweredAtStop
		}
		if m.Acked == 0 || m.LostAcked != 0 || m.InBothLogs > bothAllowed || m.StoredTwice != 0 {
			t.Errorf("%s: acked %d, lost %d, in both logs %d (%d unanswered at A's stop), stored twice %d",
				m.Mode, m.Acked, m.LostAcked, m.InBothLogs, m.UnansweredAtStop, m.StoredTwice)
		}
		if m.InALog+m.InBLog < m.Acked {
			t.Errorf("%s: %d in A's log + %d in B's < %d acked", m.Mode, m.InALog, m.InBLog, m.Acked)
		}
		if m.PeakAcceptsSrv == nil || *m.PeakAcceptsSrv <= 0 {
			t.Errorf("%s: no accept samples from B", m.Mode)
		}
		if m.Resubscribe.Count != 50 {
			t.Errorf("%s: %d resubscribe times, want 50", m.Mode, m.Resubscribe.Count)
		}
	}
	plan := r.Modes[0]
	if plan.ReconnectFrames != 50 || plan.AExit != "ok" || plan.Missed != 0 || plan.Duplicates != 0 {
		t.Errorf("plan: %d reconnect frames, A %q, missed %d, duplicates %d; want 50, ok, 0, 0",
			plan.ReconnectFrames, plan.AExit, plan.Missed, plan.Duplicates)
	}
}

func TestBench_Floor(t *testing.T) {
	t.Parallel()
	var r floorResult
	runBench(t, &r, "floor", "-subs", "20", "-rate", "200", "-dur", "1s", "-size", "64")
	if r.Sent != 200 || r.Behind != 0 || r.SenderError != "" {
		t.Errorf("sent %d, behind %d, sender error %q; want 200, 0, none", r.Sent, r.Behind, r.SenderError)
	}
	if r.Delivered != 200*20 || r.Expected != r.Delivered || r.DeliveryRatio != 1 || r.Lost != 0 || r.Corrupt != 0 {
		t.Errorf("delivered %d of %d (ratio %v, lost %d, corrupt %d); want 4000 of 4000", r.Delivered, r.Expected,
			r.DeliveryRatio, r.Lost, r.Corrupt)
	}
	if r.Latency.Count != uint64(r.Delivered) || r.Latency.P99 <= 0 || r.Latency.Max < r.Latency.P99 {
		t.Errorf("latency %+v", r.Latency)
	}
	if r.SenderCPUUsPerDelivery <= 0 || r.ReceiverCPUUsPerDelivery <= 0 || r.RecordsPerWrite < 1 {
		t.Errorf("sender %v µs, receiver %v µs per delivery, %v records per write; want > 0, > 0, ≥ 1",
			r.SenderCPUUsPerDelivery, r.ReceiverCPUUsPerDelivery, r.RecordsPerWrite)
	}
}

// TestBench_FloorEach: with -each every message goes to one connection,
// round robin, so each of 20 gets a twentieth.
func TestBench_FloorEach(t *testing.T) {
	t.Parallel()
	var r floorResult
	runBench(t, &r, "floor", "-subs", "20", "-rate", "400", "-dur", "1s", "-size", "64", "-each")
	if !r.Each || r.Sent != 400 || r.Expected != 400 || r.Delivered != 400 || r.Lost != 0 || r.Corrupt != 0 {
		t.Errorf("each %v: sent %d, expected %d, delivered %d (lost %d, corrupt %d); want 400 of each", r.Each,
			r.Sent, r.Expected, r.Delivered, r.Lost, r.Corrupt)
	}
	if r.Latency.Count != 400 {
		t.Errorf("latency count %d, want 400", r.Latency.Count)
	}
}

func TestBench_Usage(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{nil, {"nope"}, {"fanout", "-bogus"}, {"topics", "extra"},
		{"fanout", "-subscriber", "fast", "-url", "ws://127.0.0.1:1/v1/ws"},
		{"floor", "-size", "8"}, {"floor", "-role", "boss"}, {"floor", "-wait", "-1s"}} {
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

// TestBench_Help: the usage of bench and of each bench command, asked
// for, goes to stdout and is no error (exit 0), as syncgate -h.
func TestBench_Help(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"-h"}, {"--help"}, {"help"}, {"fanout", "-h"}, {"connect", "--help"}} {
		var out, errOut bytes.Buffer
		err := run(t.Context(), append([]string{"bench"}, args...), env(nil), &out, &errOut)
		if err != nil || !strings.Contains(out.String(), "usage: syncgate bench") || errOut.Len() != 0 {
			t.Errorf("bench %q: err %v, stdout %.80q, stderr %.80q; want no error and the usage on stdout alone", args, err, out.String(), errOut.String())
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

// patchLine encodes a patch for sid with one insert op per send time in
// ts, each row laid out as the gateway writes a published message, at
// offsets 1, 2, ….
func patchLine(t *testing.T, sid string, ts ...int64) []byte {
	t.Helper()
	return patchLineFrom(t, sid, 1, ts...)
}

// patchLineFrom is patchLine with the ops at offsets first, first+1, ….
func patchLineFrom(t *testing.T, sid string, first int, ts ...int64) []byte {
	t.Helper()
	p := &frames.Patch{SID: sid}
	for i, ns := range ts {
		id := fmt.Sprintf("%016d_%016d", 1, first+i)
		row := fmt.Sprintf(`{"id":%q,"data":{"t":%d,"p":"x"},"actorId":null,"at":1}`, id, ns)
		p.Patches = append(p.Patches, frames.PatchOp{Op: frames.PatchInsert, ID: id, Row: json.RawMessage(row), LSN: id})
		p.LSN = id
	}
	b, err := frames.Encode(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func Test_scanPatch(t *testing.T) {
	t.Parallel()
	// line wraps ops in a patch frame for s1; ins is an insert op of row
	// (its id and lsn id); rowAt is a row as the gateway lays it out.
	line := func(ops ...string) []byte {
		return []byte(`{"type":"patch","v":1,"sid":"s1","patches":[` + strings.Join(ops, ",") + `],"lsn":"9"}`)
	}
	ins := func(id, row string) string {
		return `{"op":"insert","id":"` + id + `","row":` + row + `,"lsn":"` + id + `"}`
	}
	rowAt := func(id string, t int) string {
		return fmt.Sprintf(`{"id":%q,"data":{"t":%d,"p":"x"},"actorId":null,"at":1}`, id, t)
	}
	idx := int64(3)
	withIndex, err := frames.Encode(&frames.Patch{SID: rawSID, LSN: "9", Patches: []frames.PatchOp{{
		Op: frames.PatchInsert, ID: "9", LSN: "9", Index: &idx,
		Row: json.RawMessage(`{"id":"9","data":{"t":77,"p":"a\\\"]}{\\"},"actorId":"u1","at":1}`),
	}}})
	if err != nil {
		t.Fatal(err)
	}
	empty, err := frames.Encode(&frames.Patch{SID: rawSID, LSN: "5"})
	if err != nil {
		t.Fatal(err)
	}
	one := patchLine(t, rawSID, 123)
	tests := []struct {
		name string
		line []byte
		want []int64 // nil: not recognised
	}{
		{"one op", one, []int64{123}},
		{"three ops", patchLine(t, rawSID, 1, 22, 333), []int64{1, 22, 333}},
		{"no ops", empty, []int64{}},
		{"built here", line(ins("1", rowAt("1", 5)), ins("2", rowAt("2", 6))), []int64{5, 6}},
		{"index and escapes", withIndex, []int64{77}},
		{"other sid", patchLine(t, "s2", 123), nil},
		{"truncated", one[:len(one)-10], nil},
		{"truncated in row", one[:bytes.Index(one, []byte(`"p"`))], nil},
		{"trailing field", append(one[:len(one)-1:len(one)-1], `,"x":1}`...), nil},
		{"trailing garbage", append(slices.Clip(one), 'x'), nil},
		{"no time", line(ins("1", `{"id":"1","data":{"x":1},"actorId":null,"at":1}`)), nil},
		{"time too long", line(ins("1", `{"id":"1","data":{"t":12345678901234567890},"actorId":null,"at":1}`)), nil},
		{"time over int64", line(ins("1", `{"id":"1","data":{"t":9999999999999999999},"actorId":null,"at":1}`)), nil},
		{"not a patch", []byte(`{"type":"ack","v":1,"ref":"s1","lsn":null,"error":null}`), nil},
		{"a delete op", line(ins("1", rowAt("1", 5)), `{"op":"delete","id":"2","row":`+rowAt("2", 6)+`,"lsn":"2"}`), nil},
		{"an op without a time", line(ins("1", rowAt("1", 5)), ins("2", `{"id":"2","data":{"x":6},"actorId":null,"at":1}`)), nil},
		{"a second time later in the row", line(ins("1", `{"id":"1","data":{"t":5},"x":{"data":{"t":6}},"actorId":null,"at":1}`)), []int64{5}},
		{"the row's fields in another order", line(ins("1", `{"data":{"t":5},"id":"1","actorId":null,"at":1}`)), nil},
		{"a row without at", line(ins("1", `{"id":"1","data":{"t":5}}`)), nil},
		{"a row left open", []byte(`{"type":"patch","v":1,"sid":"s1","patches":[{"op":"insert","id":"1","row":{"id":"1","data":{"t":5},"lsn":"1"}],"lsn":"1"}`), nil},
		{"an op without its lsn", []byte(`{"type":"patch","v":1,"sid":"s1","patches":[{"op":"insert","id":"1","row":` + rowAt("1", 5) + `},{"op":"delete","id":"2","row":null,"lsn":"2"}],"lsn":"2"}`), nil},
		{"an op whose lsn is not its id", []byte(`{"type":"patch","v":1,"sid":"s1","patches":[{"op":"insert","id":"1","row":` + rowAt("1", 5) + `,"lsn":"2"}],"lsn":"2"}`), nil},
		{"a negative index", []byte(`{"type":"patch","v":1,"sid":"s1","patches":[{"op":"insert","id":"1","row":` + rowAt("1", 5) + `,"lsn":"1","index":-2}],"lsn":"1"}`), []int64{5}},
		{"an empty index", []byte(`{"type":"patch","v":1,"sid":"s1","patches":[{"op":"insert","id":"1","row":` + rowAt("1", 5) + `,"lsn":"1","index":}],"lsn":"1"}`), nil},
		{"an op in another layout", line(ins("1", rowAt("1", 5)), `{"id":"2","op":"insert","row":`+rowAt("2", 6)+`,"lsn":"2"}`), nil},
		{"keys inside strings", line(ins("1", `{"id":"1","data":{"t":5,"p":"\"data\":{\"t\":9},{\"op\":\"x},\"lsn\":\"1\"}"},"actorId":null,"at":1}`)), []int64{5}},
		{"garbage between ops", []byte(`{"type":"patch","v":1,"sid":"s1","patches":[` + ins("1", rowAt("1", 5)) + `x` + ins("2", rowAt("2", 6)) + `],"lsn":"2"}`), nil},
		{"empty", nil, nil},
	}
	ops, _ := scanPatch(patchLineFrom(t, rawSID, 7, 1, 2), rawPatchHead, nil)
	if len(ops) != 2 || string(ops[0].id) != "0000000000000001_0000000000000007" || string(ops[1].id) != "0000000000000001_0000000000000008" {
		t.Errorf("ops of two: %+v", ops)
	}
	for _, tt := range tests {
		ops, ok := scanPatch(tt.line, rawPatchHead, nil)
		var got []int64
		for _, op := range ops {
			got = append(got, op.t)
		}
		if ok != (tt.want != nil) || ok && !slices.Equal(got, tt.want) {
			t.Errorf("%s: scanPatch(%s) = %v, %v; want %v", tt.name, tt.line, got, ok, tt.want)
		}
	}
}

// Benchmark_scanPatch scans a patch of 40 inserts with 100-byte data,
// about what a subscriber gets per message at 1,000 × 1,000 msg/s.
func Benchmark_scanPatch(b *testing.B) {
	p := &frames.Patch{SID: rawSID}
	for i := range 40 {
		id := fmt.Sprintf("%016d_%016d", 0, i+1)
		data := appendData(nil, 1764467000000000000+int64(i), 100)
		row := fmt.Sprintf(`{"id":%q,"data":%s,"actorId":null,"at":1764467000000}`, id, data)
		p.Patches = append(p.Patches, frames.PatchOp{Op: frames.PatchInsert, ID: id, Row: json.RawMessage(row), LSN: id})
		p.LSN = id
	}
	line, err := frames.Encode(p)
	if err != nil {
		b.Fatal(err)
	}
	var ops []scannedOp
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	for b.Loop() {
		var ok bool
		if ops, ok = scanPatch(line, rawPatchHead, ops[:0]); !ok || len(ops) != 40 {
			b.Fatalf("scanPatch = %d ops, %v", len(ops), ok)
		}
	}
}

func Test_benchSub_handleMessage(t *testing.T) {
	t.Parallel()
	h := newHistogram()
	all := newCountdown(1)
	s := newBenchSub(h.shard(0), all)
	s.expect(4)
	const now = 1000

	// A batch of three frames: two patches (one op, then two) and an ack.
	lsn := "0000000000000000001_0000000000000007"
	ack, err := frames.Encode(&frames.Ack{Ref: "m-1", LSN: &lsn})
	if err != nil {
		t.Fatal(err)
	}
	msg := slices.Concat(patchLine(t, rawSID, 123), []byte("\n"), patchLineFrom(t, rawSID, 2, 400, 900), []byte("\n"), ack)
	s.handleMessage(now, msg)
	if s.count.Load() != 3 || s.other.Load() != 1 || s.fallback.Load() != 0 || s.last.Load() != now {
		t.Errorf("after batch: count %d, other %d, fallback %d, last %d; want 3, 1, 0, %d",
			s.count.Load(), s.other.Load(), s.fallback.Load(), s.last.Load(), now)
	}
	snap := h.snapshot()
	if snap.total != 3 || snap.max != now-123 || snap.quantile(0.01) != now-900 {
		t.Errorf("histogram: total %d, max %d, min %d; want 3, %d, %d", snap.total, snap.max, snap.quantile(0.01), now-123, now-900)
	}

	// A malformed patch falls back to Decode, which refuses it.
	one := patchLine(t, rawSID, 5)
	s.handleLine(now, one[:len(one)-3])
	if s.fallback.Load() != 1 || s.undecodable.Load() != 1 || s.count.Load() != 3 {
		t.Errorf("after malformed: fallback %d, undecodable %d, count %d; want 1, 1, 3",
			s.fallback.Load(), s.undecodable.Load(), s.count.Load())
	}
	select {
	case <-all.done:
		t.Fatal("countdown done before the fourth delivery")
	default:
	}

	// A valid patch in a layout the scan does not know (its sid escaped) is
	// decoded and counted.
	odd := bytes.Replace(patchLineFrom(t, rawSID, 4, 600), []byte(`"sid":"s1"`), []byte(`"sid":"s\u0031"`), 1)
	if _, ok := scanPatch(odd, rawPatchHead, nil); ok {
		t.Fatalf("scanPatch recognised %s", odd)
	}
	s.handleLine(now, odd)
	if s.fallback.Load() != 2 || s.undecodable.Load() != 1 || s.count.Load() != 4 {
		t.Errorf("after fallback: fallback %d, undecodable %d, count %d; want 2, 1, 4",
			s.fallback.Load(), s.undecodable.Load(), s.count.Load())
	}
	select {
	case <-all.done:
	default:
		t.Error("countdown not done after the expected deliveries")
	}

	// A delivery at or before the last offset, scanned or decoded, is out
	// of order and not counted.
	s.handleLine(now, patchLineFrom(t, rawSID, 4, 700, 800)) // offsets 4 (repeated) and 5
	s.handleLine(now, odd)                                   // offset 4, decoded
	if s.outOfOrder.Load() != 2 || s.count.Load() != 5 {
		t.Errorf("after repeats: out of order %d, count %d; want 2, 5", s.outOfOrder.Load(), s.count.Load())
	}
}

func Test_rawConn_serverClose(t *testing.T) {
	t.Parallel()
	gw, err := gateway.New(gateway.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(gw.Handler())
	defer ts.Close()
	e, err := benchFlags{url: gwtest.WSURL(ts.URL), dialConcurrency: 1, dialTimeout: 10 * time.Second, timeout: time.Minute}.setup(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer e.close()
	s := newBenchSub(newHistogram().shard(0), newCountdown(1))
	if err := e.dialRaw(t.Context(), s, "bench:close"); err != nil {
		t.Fatal(err)
	}
	defer s.conn.Close()
	if err := s.conn.Err(); err != nil {
		t.Fatalf("Err before the server closed: %v", err)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := gw.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.conn.Done():
	case <-ctx.Done():
		t.Fatal("reader still running after the server closed")
	}
	if err := s.conn.Err(); websocket.CloseStatus(err) != websocket.StatusGoingAway {
		t.Errorf("Err = %v; want the server's close 1001", err)
	}
	if err := s.conn.Close(); err != nil {
		t.Errorf("Close after the server closed: %v", err)
	}
}

func TestBench_Presence(t *testing.T) {
	t.Parallel()
	url := startGateway(t)
	var r presenceResult
	runBench(t, &r, "presence", "-url", url, "-members", "20", "-observers", "20", "-sample", "5",
		"-dur", "1s", "-rate", "2", "-join-spread", "200ms", "-wait", "3s")
	if r.Members != 20 || r.Observers != 20 || r.Sample != 5 {
		t.Errorf("members %d, observers %d, sample %d; want 20, 20, 5", r.Members, r.Observers, r.Sample)
	}
	if r.Joins != 20 || r.JoinsAcked != 20 || r.JoinsUnobserved != 0 || r.JoinToObserved.Count != 20*5 {
		t.Errorf("joins %d, acked %d, unobserved %d, timed %d; want 20, 20, 0, 100",
			r.Joins, r.JoinsAcked, r.JoinsUnobserved, r.JoinToObserved.Count)
	}
	if r.Updates != 40 || r.UpdatesAcked != 40 || r.Behind != 0 {
		t.Errorf("updates %d, acked %d, behind %d; want 40, 40, 0", r.Updates, r.UpdatesAcked, r.Behind)
	}
	if r.UpdateToObserved.Count != 40*5 || r.UpdatesObservedRatio != 1 || r.UpdateToObserved.P99 <= 0 {
		t.Errorf("update-to-observed %+v, ratio %v; want 200 samples, ratio 1", r.UpdateToObserved, r.UpdatesObservedRatio)
	}
	if r.FramesPerObserverPerS <= 0 || r.OpsPerObserverPerS <= 0 || r.OpsPerFrame < 1 {
		t.Errorf("frames/s %v, ops/s %v, ops/frame %v", r.FramesPerObserverPerS, r.OpsPerObserverPerS, r.OpsPerFrame)
	}
	if r.ServerCPUUsPerUpdate == nil || r.ServerCores == nil {
		t.Errorf("CPU figures missing: per update %v, %+v", r.ServerCPUUsPerUpdate, r.cpuJSON)
	}
	if r.Errors != 0 || r.Undecodable != 0 || r.ObserverDisconnects != 0 || r.MemberDisconnects != 0 {
		t.Errorf("errors %d (%s), undecodable %d, disconnects %d+%d (%s)", r.Errors, r.FirstError, r.Undecodable,
			r.ObserverDisconnects, r.MemberDisconnects, r.FirstDisconnect)
	}
}

// TestBench_AppendRefusesUsedDir: bench append on a -dir an earlier run
// used would reopen its logs, whose producer table already holds the
// seqs the producers start from again: every append would be a duplicate,
// answered without a write or an fsync, and counted as an append. It is
// refused, naming -dir.
func TestBench_AppendRefusesUsedDir(t *testing.T) {
	dir := t.TempDir()
	var res struct {
		Phases []appendPhase `json:"phases"`
	}
	runBench(t, &res, "append", "-phases", "seq", "-dur", "100ms", "-dir", dir)
	var out, errOut bytes.Buffer
	err := bench(t.Context(), []string{"append", "-phases", "seq", "-dur", "100ms", "-dir", dir}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "-dir") {
		t.Fatalf("second run on the same -dir: err = %v, want a refusal naming -dir; stdout:\n%s", err, out.String())
	}
}

// TestBench_RefusesBadRate: storm and floor refuse a -rate that is NaN,
// infinite or (storm) above 1e9 a second, naming -rate. Accepted, storm's
// publisher ticker got a non-positive interval and panicked after the
// nodes had started (leaving them running), and floor sent nothing. Each
// case also carries a later bad flag, so that a -rate accepted shows as
// the other flag's error, before any node or sender starts.
func TestBench_RefusesBadRate(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"storm", "-rate", "NaN", "-accept-rate", "bogus"},
		{"storm", "-rate", "+Inf", "-accept-rate", "bogus"},
		{"storm", "-rate", "2e9", "-accept-rate", "bogus"},
		{"floor", "-rate", "NaN", "-size", "1"},
		{"floor", "-rate", "+Inf", "-size", "1"},
	} {
		var out, errOut bytes.Buffer
		err := bench(t.Context(), args, &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), ": -rate") {
			t.Errorf("bench %v: err = %v, want one naming -rate", args, err)
		}
	}
}
