package storage_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncgate/syncgate/storage"
)

// TestDB_MetaCache_Concurrent runs readers against a writer that appends
// to, deletes and recreates streams, with a read cache smaller than the
// stream count so that loads, evictions and publishes race. Records are
// "gen.k": every Read must see one generation's records 1..k in order,
// consistent with its Tail, and the writer must read its own writes.
func TestDB_MetaCache_Concurrent(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	o := storage.Options{NoSync: true}
	storage.SetMetaCacheSizeForTest(&o, 2)
	db := openDB(t, &o)
	ctx := t.Context()
	const streams = 5
	gens := make([]int, streams)
	counts := make([]int, streams)
	for i := range streams {
		mustCreate(t, db, fmt.Sprint("s", i), storage.CreateOptions{})
	}

	// The readers stop when the writer is done or fails.
	var done atomic.Bool
	var wg sync.WaitGroup
	rctx, cancel := context.WithCancel(ctx)
	defer func() {
		done.Store(true)
		cancel()
		wg.Wait()
	}()
	for r := range 3 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(r)))
			for !done.Load() {
				name := fmt.Sprint("s", rng.IntN(streams))
				res, err := db.Read(rctx, name, storage.ZeroOffset, 0)
				if rctx.Err() != nil {
					return
				}
				if errors.Is(err, storage.ErrNotFound) {
					continue
				}
				if err != nil {
					t.Errorf("Read(%s): %v", name, err)
					return
				}
				if err := checkGen(res); err != nil {
					t.Errorf("Read(%s): %v", name, err)
					return
				}
				// Wait after a record that exists returns at once.
				if len(res.Records) > 0 {
					err := db.Wait(rctx, name, storage.ZeroOffset)
					if err != nil && !errors.Is(err, storage.ErrNotFound) && rctx.Err() == nil {
						t.Errorf("Wait(%s): %v", name, err)
						return
					}
				}
			}
		})
	}

	rng := rand.New(rand.NewPCG(seed, 99))
	for op := 0; op < 1500 && !t.Failed(); op++ {
		i := rng.IntN(streams)
		name := fmt.Sprint("s", i)
		if rng.IntN(10) == 0 {
			if err := db.Delete(ctx, name); err != nil {
				t.Fatalf("Delete(%s): %v", name, err)
			}
			if _, err := db.Head(ctx, name); !errors.Is(err, storage.ErrNotFound) {
				t.Fatalf("Head(%s) after Delete: %v", name, err)
			}
			gens[i]++
			counts[i] = 0
			mustCreate(t, db, name, storage.CreateOptions{})
		} else {
			counts[i]++
			data := fmt.Sprintf("%d.%d", gens[i], counts[i])
			if _, err := db.Append(ctx, name, storage.AppendRequest{Records: [][]byte{[]byte(data)}}); err != nil {
				t.Fatalf("Append(%s): %v", name, err)
			}
		}
		// Read your own writes, through Head, Wait and Read.
		tail := storage.FormatOffset(uint64(counts[i]))
		in, err := db.Head(ctx, name)
		if err != nil || in.Tail != tail {
			t.Fatalf("Head(%s) = %s, %v; want tail %s", name, in.Tail, err, tail)
		}
		if counts[i] > 0 {
			if err := db.Wait(ctx, name, storage.FormatOffset(uint64(counts[i]-1))); err != nil {
				t.Fatalf("Wait(%s): %v", name, err)
			}
			res, err := db.Read(ctx, name, storage.FormatOffset(uint64(counts[i]-1)), 0)
			if err != nil || len(res.Records) != 1 || string(res.Records[0].Data) != fmt.Sprintf("%d.%d", gens[i], counts[i]) {
				t.Fatalf("Read(%s) of the last record = %+v, %v", name, res, err)
			}
		}
	}
}

// checkGen checks a Read from the start of a stream whose records are
// "gen.1", "gen.2", ... .
func checkGen(res storage.ReadResult) error {
	gen := ""
	for i, r := range res.Records {
		g, k, ok := strings.Cut(string(r.Data), ".")
		if !ok || (gen != "" && g != gen) || k != strconv.Itoa(i+1) {
			return fmt.Errorf("record %d is %q", i, r.Data)
		}
		gen = g
		if r.Offset != storage.FormatOffset(uint64(i+1)) {
			return fmt.Errorf("record %d has offset %s", i, r.Offset)
		}
	}
	next := storage.FormatOffset(uint64(len(res.Records)))
	if res.Next != next || !res.UpToDate || res.Tail != next {
		return fmt.Errorf("%d records, Next %s, Tail %s, UpToDate %v", len(res.Records), res.Next, res.Tail, res.UpToDate)
	}
	return nil
}

// TestDB_ReadWaitsForThePublish: between a commit and the writer
// publishing it (after its fsync), a Read does not return the new
// records: bbolt already shows the commit to new transactions, but a
// crash or a failed fsync could still take it back, and Head does not
// show it yet (a subscriber resuming from such a record was told its
// cursor was not in the log, then got the record again). The Read waits
// for the publish, and a Wait after the offset it gives waits for the
// next append.
func TestDB_ReadWaitsForThePublish(t *testing.T) {
	t.Parallel()
	var armed atomic.Bool
	held, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	o := storage.Options{NoSync: true}
	storage.SetPublishHookForTest(&o, func() {
		if armed.CompareAndSwap(true, false) {
			close(held)
			<-release
		}
	})
	db := openDB(t, &o)
	t.Cleanup(free) // before the DB's close, which waits for the writer (cleanups run last first)
	ctx := t.Context()
	in := mustCreate(t, db, "s", storage.CreateOptions{})
	mustAppend(t, db, "s", storage.AppendRequest{Records: rec("a")})

	armed.Store(true)
	appended := make(chan error, 1)
	go func() {
		_, err := db.Append(ctx, "s", storage.AppendRequest{Records: rec("b")})
		appended <- err
	}()
	<-held // committed, not published
	rctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	res, err := db.Read(rctx, "s", storage.ZeroOffset, 0)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Read before the publish: %d records, %v; want it to wait for the publish", len(res.Records), err)
	}
	type result struct {
		res storage.ReadResult
		err error
	}
	read := make(chan result, 1)
	go func() {
		res, err := db.Read(ctx, "s", storage.ZeroOffset, 0)
		read <- result{res, err}
	}()
	free()
	if err := <-appended; err != nil {
		t.Fatal(err)
	}
	r := <-read
	if r.err != nil || len(r.res.Records) != 2 {
		t.Fatalf("Read across the publish: %d records, %v; want 2", len(r.res.Records), r.err)
	}
	waited := make(chan error, 1)
	go func() { waited <- db.WaitID(ctx, "s", r.res.Next, in.ID) }()
	mustAppend(t, db, "s", storage.AppendRequest{Records: rec("c")})
	if err := <-waited; err != nil {
		t.Fatalf("Wait woken by the next append: %v", err)
	}
}
