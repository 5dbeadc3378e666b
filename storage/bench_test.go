package storage_test

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncgate/syncgate/storage"
)

// benchAppend runs b.N appends of 200-byte records with fsync on, spread
// over producers goroutines (each its own idempotent producer) writing to
// streams streams, and reports appends/s and latency percentiles.
func benchAppend(b *testing.B, producers, streams int) {
	db := openDB(b, nil)
	for s := range streams {
		if _, _, err := db.Create(b.Context(), fmt.Sprintf("s%d", s), storage.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	payload := make([]byte, 200)
	lat := make([][]time.Duration, producers)
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for p := range producers {
		wg.Go(func() {
			name := fmt.Sprintf("s%d", p%streams)
			pr := &storage.Producer{ID: fmt.Sprintf("p%d", p)}
			recs := [][]byte{payload}
			var mine []time.Duration
			for seq := int64(0); next.Add(1) <= int64(b.N); seq++ {
				pr.Seq = seq
				t0 := time.Now()
				if _, err := db.Append(b.Context(), name, storage.AppendRequest{Records: recs, Producer: pr}); err != nil {
					b.Error(err)
					return
				}
				mine = append(mine, time.Since(t0))
			}
			lat[p] = mine
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	all := slices.Concat(lat...)
	slices.Sort(all)
	if len(all) == 0 {
		return
	}
	pct := func(q float64) float64 { return float64(all[int(q*float64(len(all)-1))]) / 1e6 }
	b.ReportMetric(float64(len(all))/elapsed.Seconds(), "appends/s")
	b.ReportMetric(pct(0.50), "p50_ms")
	b.ReportMetric(pct(0.99), "p99_ms")
}

func BenchmarkDB_Append(b *testing.B) {
	b.Run("producers=1", func(b *testing.B) { benchAppend(b, 1, 1) })
	b.Run("producers=256/streams=1", func(b *testing.B) { benchAppend(b, 256, 1) })
	b.Run("producers=256/streams=256", func(b *testing.B) { benchAppend(b, 256, 256) })
}

// BenchmarkDB_Read measures a 100-record page read (200-byte records).
func BenchmarkDB_Read(b *testing.B) {
	db := openDB(b, &storage.Options{NoSync: true})
	db.Create(b.Context(), "s", storage.CreateOptions{})
	recs := make([][]byte, 1000)
	for i := range recs {
		recs[i] = make([]byte, 200)
	}
	if _, err := db.Append(b.Context(), "s", storage.AppendRequest{Records: recs}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if _, err := db.Read(b.Context(), "s", storage.FormatOffset(uint64(i%900)), 100*200); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDB_ReadForkChain: a Read of a page of 100 records of 200 bytes
// at the tip of a fork chain of depth 0 (no fork) and MaxForkDepth, whose
// records all come from the chain's root; the chain's metas are in the
// read cache, as a tip read often is.
func BenchmarkDB_ReadForkChain(b *testing.B) {
	for _, depth := range []int{0, storage.MaxForkDepth} {
		b.Run(fmt.Sprintf("depth=%d", depth), func(b *testing.B) {
			db := openDB(b, &storage.Options{NoSync: true})
			recs := make([][]byte, 1000)
			for i := range recs {
				recs[i] = make([]byte, 200)
			}
			if _, _, err := db.Create(b.Context(), "f0", storage.CreateOptions{Records: recs}); err != nil {
				b.Fatal(err)
			}
			tip := "f0"
			for d := 1; d <= depth; d++ {
				name := fmt.Sprint("f", d)
				if _, _, err := db.Create(b.Context(), name, storage.CreateOptions{ForkFrom: tip}); err != nil {
					b.Fatal(err)
				}
				tip = name
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if _, err := db.Read(b.Context(), tip, storage.FormatOffset(uint64(i%900)), 100*200); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDB_WaitRead measures the tailing read path the gateway runs
// per persisted topic at a low per-topic rate: in each round one appender
// appends one 200-byte record to each of streams streams (AppendAsync, no
// fsync, so mostly one commit per round) and waits until every stream's
// tailer, looping Wait + Read, has read it. An op is one delivered
// record; cpu-ns/rec is the process CPU time per record.
func BenchmarkDB_WaitRead(b *testing.B) {
	for _, streams := range []int{1, 16, 100} {
		b.Run(fmt.Sprintf("streams=%d", streams), func(b *testing.B) { benchWaitRead(b, streams) })
	}
}

func benchWaitRead(b *testing.B, streams int) {
	db := openDB(b, &storage.Options{NoSync: true})
	names := make([]string, streams)
	for s := range names {
		names[s] = fmt.Sprintf("s%d", s)
		if _, _, err := db.Create(b.Context(), names[s], storage.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	rounds := max(b.N/streams, 1)
	payload := make([]byte, 200)
	got := make(chan int, streams)
	var wg sync.WaitGroup
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	for _, name := range names {
		wg.Go(func() {
			after := storage.ZeroOffset
			for n := 0; n < rounds; {
				if err := db.Wait(b.Context(), name, after); err != nil {
					b.Error(err)
					return
				}
				res, err := db.Read(b.Context(), name, after, 256<<10)
				if err != nil {
					b.Error(err)
					return
				}
				n += len(res.Records)
				after = res.Next
				got <- len(res.Records)
			}
		})
	}
	recs := [][]byte{payload}
	failed := func(_ storage.AppendResult, err error) {
		if err != nil {
			b.Error(err)
		}
	}
	for range rounds {
		for _, name := range names {
			db.AppendAsync(name, storage.AppendRequest{Records: recs}, failed)
		}
		for want := streams; want > 0; {
			want -= <-got
		}
	}
	wg.Wait()
	cpu := cpuTime() - cpu0
	b.StopTimer()
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(rounds*streams), "cpu-ns/rec")
}

// BenchmarkDB_ProducerEviction measures the commit that takes a stream
// over MaxProducersPerStream (the default, 10,000): one new producer's
// append to a stream holding 10,000 producer states, which forgets the
// 1,001 least recently used. Producer ids are not in the order of their
// last use, and states share a last use in groups of 10 (one commit
// each), as under group commit. Between ops, untimed, the stream is
// brought back to 10,000 states.
func BenchmarkDB_ProducerEviction(b *testing.B) {
	const limit, group = 10000, 10
	clk := newClock()
	db := openDB(b, &storage.Options{NoSync: true, Now: clk.Now, MaxProducersPerStream: limit, MaintenanceInterval: time.Hour})
	if _, _, err := db.Create(b.Context(), "s", storage.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	next := uint64(0)
	id := func() string { // a bijection of next: ids out of key order
		next++
		return fmt.Sprintf("%016x", next*0x9e3779b97f4a7c15)
	}
	fill := func(to int) {
		n, _, err := db.ProducerStatesForTest("s")
		if err != nil {
			b.Fatal(err)
		}
		for ; n < to; n += group {
			clk.Advance(time.Millisecond)
			reqs := make([]storage.AppendRequest, group)
			for i := range reqs {
				reqs[i] = storage.AppendRequest{Records: rec("x"), Producer: &storage.Producer{ID: id()}}
			}
			if _, errs := db.AppendBatchForTest("s", reqs); errors.Join(errs...) != nil {
				b.Fatal(errors.Join(errs...))
			}
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		fill(limit)
		clk.Advance(time.Millisecond)
		b.StartTimer()
		if _, err := prodAppend(db, "s", id(), 0, 0); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if n, count, err := db.ProducerStatesForTest("s"); err != nil || n != limit-limit/10 || count != uint64(n) {
		b.Fatalf("%d states, counted %d (%v); want %d", n, count, err, limit-limit/10)
	}
}
