package main

import (
	"math/bits"
	"runtime"
	"sync/atomic"
	"time"
)

// The latency histogram is log-linear, like HDR histograms: values below
// histSub nanoseconds have a bucket each; above, every power of two is cut
// into histHalf equal buckets. A bucket is then at most 1/64 of its lower
// bound wide, and reporting its midpoint is within 1/128 (0.8%) of any
// value in it. Memory is fixed (histBuckets counters per shard) however
// many samples arrive, so a long fanout run keeps every delivery.
const (
	histSubBits  = 7
	histSub      = 1 << histSubBits // exact buckets below this many ns
	histHalf     = histSub / 2      // buckets per power of two above
	histMaxShift = 34               // largest value kept: just under 2^41 ns (~36 min)
	histBuckets  = histSub + histMaxShift*histHalf
	histMaxValue = int64(1)<<(histMaxShift+histSubBits) - 1
)

// histMethod describes the histogram in results.
const histMethod = "log-linear histogram, 64 buckets per power of two, midpoints within 0.8%; max exact"

// histogram records latencies from many goroutines. Each recorder uses its
// own shard (by subscriber index) so that concurrent read loops rarely
// touch the same counters; shards are summed when read.
type histogram struct {
	shards []histShard
}

type histShard struct {
	counts [histBuckets]atomic.Uint64
	max    atomic.Int64
	_      [56]byte // keep the next shard's hot counters off this cache line
}

// newHistogram returns a histogram with enough shards for the machine's
// parallelism.
func newHistogram() *histogram {
	return &histogram{shards: make([]histShard, min(64, max(8, 4*runtime.GOMAXPROCS(0))))}
}

// shard returns the shard for recorder i.
func (h *histogram) shard(i int) *histShard { return &h.shards[i%len(h.shards)] }

// record adds one latency of d nanoseconds. Negative values (a clock step)
// count as 0; values beyond histMaxValue as histMaxValue.
func (s *histShard) record(d int64) {
	d = min(max(d, 0), histMaxValue)
	s.counts[histIndex(d)].Add(1)
	for {
		m := s.max.Load()
		if d <= m || s.max.CompareAndSwap(m, d) {
			return
		}
	}
}

func histIndex(v int64) int {
	if v < histSub {
		return int(v)
	}
	shift := bits.Len64(uint64(v)) - histSubBits // ≥ 1
	top := int(v >> shift)                       // in [histHalf, histSub)
	return histSub + (shift-1)*histHalf + top - histHalf
}

// histMid returns the midpoint of bucket i.
func histMid(i int) int64 {
	if i < histSub {
		return int64(i)
	}
	j := i - histSub
	shift := j/histHalf + 1
	low := int64(j%histHalf+histHalf) << shift
	return low + int64(1)<<(shift-1)
}

// histSnapshot is a histogram summed over its shards.
type histSnapshot struct {
	counts [histBuckets]uint64
	total  uint64
	max    int64
}

func (h *histogram) snapshot() *histSnapshot {
	var s histSnapshot
	for i := range h.shards {
		sh := &h.shards[i]
		for j := range sh.counts {
			n := sh.counts[j].Load()
			s.counts[j] += n
			s.total += n
		}
		s.max = max(s.max, sh.max.Load())
	}
	return &s
}

// quantile returns the q-quantile (0 < q ≤ 1) in nanoseconds: the
// midpoint of the bucket holding the sample of rank ⌈q·total⌉, never more
// than the exact max. It returns 0 when empty.
func (s *histSnapshot) quantile(q float64) int64 {
	if s.total == 0 {
		return 0
	}
	rank := uint64(q * float64(s.total))
	if float64(rank) < q*float64(s.total) {
		rank++
	}
	rank = max(rank, 1)
	var seen uint64
	for i, n := range s.counts {
		seen += n
		if seen >= rank {
			return min(histMid(i), s.max)
		}
	}
	return s.max
}

// latencyJSON is a latency distribution in milliseconds.
type latencyJSON struct {
	Count uint64  `json:"count"`
	P50   float64 `json:"p50"`
	P95   float64 `json:"p95"`
	P99   float64 `json:"p99"`
	Max   float64 `json:"max"`
}

func (s *histSnapshot) json() latencyJSON {
	return latencyJSON{
		Count: s.total,
		P50:   nsToMS(s.quantile(0.50)),
		P95:   nsToMS(s.quantile(0.95)),
		P99:   nsToMS(s.quantile(0.99)),
		Max:   nsToMS(s.max),
	}
}

// String is the summary line form: p50 … p95 … p99 … max ….
func (l latencyJSON) String() string {
	return "p50 " + fmtMS(l.P50) + "  p95 " + fmtMS(l.P95) + "  p99 " + fmtMS(l.P99) + "  max " + fmtMS(l.Max)
}

func nsToMS(ns int64) float64 { return round(float64(ns)/1e6, 4) }

func fmtMS(ms float64) string {
	return time.Duration(ms * 1e6).Round(time.Microsecond).String()
}
