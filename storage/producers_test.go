package storage_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/syncgate/syncgate/storage"
)

// wantStates fails the test unless stream name's file holds want producer
// states and its count of them says so.
func wantStates(t *testing.T, db *storage.DB, name string, want int) {
	t.Helper()
	n, count, err := db.ProducerStatesForTest(name)
	if err != nil {
		t.Fatal(err)
	}
	if n != want || count != uint64(want) {
		t.Fatalf("stream %q holds %d producer states, counted %d; want %d", name, n, count, want)
	}
}

// lockedBuffer is a bytes.Buffer for a logger on another goroutine.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// prodAppend appends one record as producer (id, epoch, seq).
func prodAppend(db *storage.DB, name, id string, epoch, seq int64) (storage.AppendResult, error) {
	return db.Append(context.Background(), name, storage.AppendRequest{Records: rec(id), Producer: &storage.Producer{ID: id, Epoch: epoch, Seq: seq}})
}

// TestDB_ProducerBound_LeastRecentlyUsedGo: a stream keeps at most
// MaxProducersPerStream producer states; past it the least recently used
// are forgotten, down to nine tenths of the bound, and a producer that
// appended recently survives however early it first appeared.
func TestDB_ProducerBound_LeastRecentlyUsedGo(t *testing.T) {
	clk := newClock()
	var logs lockedBuffer
	db := openDB(t, &storage.Options{NoSync: true, Now: clk.Now, MaxProducersPerStream: 10, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	mustCreate(t, db, "s", storage.CreateOptions{})
	app := func(id string, seq int64) (storage.AppendResult, error) {
		clk.Advance(time.Second)
		return prodAppend(db, "s", id, 0, seq)
	}
	for i := range 10 {
		if _, err := app(fmt.Sprint("p", i), 0); err != nil {
			t.Fatal(err)
		}
	}
	wantStates(t, db, "s", 10)
	if _, err := app("p0", 1); err != nil { // p0 is now the most recently used
		t.Fatal(err)
	}
	if _, err := app("p10", 0); err != nil { // 11 > 10: down to 9, p1 and p2 go
		t.Fatal(err)
	}
	wantStates(t, db, "s", 9)
	if l := logs.String(); !strings.Contains(l, "producer states forgotten") || !strings.Contains(l, "forgotten=2") {
		t.Fatalf("log %q: want the eviction of 2 states", l)
	}
	if r, err := app("p0", 1); err != nil || !r.Duplicate {
		t.Fatalf("p0, used recently, retries seq 1: %+v, %v; want a duplicate", r, err)
	}
	if r, err := app("p3", 0); err != nil || !r.Duplicate {
		t.Fatalf("p3, the oldest kept, retries seq 0: %+v, %v; want a duplicate", r, err)
	}
	for _, id := range []string{"p1", "p2"} {
		_, err := app(id, 1)
		if pe, ok := errors.AsType[*storage.ProducerError](err); !ok || pe.Kind != storage.KindGap || pe.ExpectedSeq != 0 {
			t.Fatalf("%s, forgotten, sends seq 1: %v; want a gap expecting 0", id, err)
		}
	}
	wantStates(t, db, "s", 9) // refused appends store nothing
	for i := 11; i < 40; i++ {
		if _, err := app(fmt.Sprint("p", i), 0); err != nil {
			t.Fatal(err)
		}
		n, count, err := db.ProducerStatesForTest("s")
		if err != nil || n > 10 || count != uint64(n) {
			t.Fatalf("after producer %d: %d states, counted %d (%v); want at most 10, counted right", i, n, count, err)
		}
	}
	if r, err := app("p39", 0); err != nil || !r.Duplicate {
		t.Fatalf("the newest producer retries: %+v, %v; want a duplicate", r, err)
	}
}

// TestDB_ProducerBound_EvictedIsExpired: a producer forgotten for the
// bound is treated exactly as one whose ProducerTTL ran out: the same
// requests after it get the same answers, strict and AllowGap producers,
// fencing included.
func TestDB_ProducerBound_EvictedIsExpired(t *testing.T) {
	type answer struct {
		res storage.AppendResult
		err string
	}
	run := func(o storage.Options, idle time.Duration) []answer {
		clk := newClock()
		o.NoSync, o.Now = true, clk.Now
		db := openDB(t, &o)
		mustCreate(t, db, "s", storage.CreateOptions{})
		for seq := range int64(3) {
			mustAppend(t, db, "s", storage.AppendRequest{Records: rec("p"), Producer: &storage.Producer{ID: "p", Epoch: 1, Seq: seq}})
		}
		mustAppend(t, db, "s", storage.AppendRequest{Records: rec("w"), Producer: &storage.Producer{ID: "w", Epoch: 2, Seq: 9, AllowGap: true}})
		clk.Advance(idle)
		mustAppend(t, db, "s", storage.AppendRequest{Records: rec("q"), Producer: &storage.Producer{ID: "q"}})
		mustAppend(t, db, "s", storage.AppendRequest{Records: rec("r"), Producer: &storage.Producer{ID: "r"}})
		var out []answer
		for _, p := range []storage.Producer{
			{ID: "p", Epoch: 1, Seq: 3},                 // next seq of a forgotten producer
			{ID: "p", Epoch: 0, Seq: 0},                 // a stale epoch is no longer fenced
			{ID: "p", Epoch: 0, Seq: 0},                 // and is then a duplicate
			{ID: "w", Epoch: 1, Seq: 4, AllowGap: true}, // lower epoch and seq than before
			{ID: "w", Epoch: 1, Seq: 4, AllowGap: true},
		} {
			r, err := db.Append(t.Context(), "s", storage.AppendRequest{Records: rec("x"), Producer: &p})
			a := answer{res: r}
			if err != nil {
				a.err = err.Error()
			}
			out = append(out, a)
		}
		return out
	}
	evicted := run(storage.Options{MaxProducersPerStream: 2}, time.Minute)
	expired := run(storage.Options{ProducerTTL: time.Hour}, 2*time.Hour)
	if fmt.Sprint(evicted) != fmt.Sprint(expired) {
		t.Fatalf("after eviction:\n%+v\nafter expiry:\n%+v", evicted, expired)
	}
	if evicted[0].err == "" || evicted[1].err != "" || !evicted[2].res.Duplicate || evicted[3].err != "" {
		t.Fatalf("answers %+v: want a gap, an admitted stale epoch, a duplicate, an admitted lower epoch", evicted)
	}
}

// TestDB_ProducerBound_SameCommit: a commit never forgets the producers
// it admits, even past the bound; the next commit that adds one does.
func TestDB_ProducerBound_SameCommit(t *testing.T) {
	clk := newClock()
	db := openDB(t, &storage.Options{NoSync: true, Now: clk.Now, MaxProducersPerStream: 3})
	mustCreate(t, db, "s", storage.CreateOptions{})
	var reqs []storage.AppendRequest
	for i := range 5 {
		reqs = append(reqs, storage.AppendRequest{Records: rec("x"), Producer: &storage.Producer{ID: fmt.Sprint("p", i)}})
	}
	_, errs := db.AppendBatchForTest("s", reqs)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	wantStates(t, db, "s", 5)
	clk.Advance(time.Second)
	if _, err := prodAppend(db, "s", "new", 0, 0); err != nil {
		t.Fatal(err)
	}
	wantStates(t, db, "s", 3)
	if r, err := prodAppend(db, "s", "new", 0, 0); err != nil || !r.Duplicate {
		t.Fatalf("the producer that took the stream over the bound: %+v, %v; want it kept", r, err)
	}
}

// TestDB_ProducerBound_Restart: the count is in the file, so the bound
// holds after a restart; a file written before the count was kept is
// counted when a producer is added to it; the maintenance pass keeps the
// count right as producers expire.
func TestDB_ProducerBound_Restart(t *testing.T) {
	clk := newClock()
	path := filepath.Join(t.TempDir(), "log.db")
	opts := &storage.Options{NoSync: true, Now: clk.Now, MaxProducersPerStream: 10, ProducerTTL: time.Hour}
	open := func() *storage.DB {
		t.Helper()
		db, err := storage.Open(path, opts)
		if err != nil {
			t.Fatal(err)
		}
		return db
	}
	db := open()
	mustCreate(t, db, "s", storage.CreateOptions{})
	id := mustCreate(t, db, "legacy", storage.CreateOptions{}).ID
	for i := range 10 {
		clk.Advance(time.Second)
		for _, s := range []string{"s", "legacy"} {
			if _, err := prodAppend(db, s, fmt.Sprint("p", i), 0, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	db.Close()

	// "legacy" as an older version left it: states, no count.
	bdb, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = bdb.Update(func(tx *bolt.Tx) error {
		var k [8]byte
		for i := range k {
			k[i] = byte(id >> (56 - 8*i))
		}
		return tx.Bucket([]byte("prods")).Bucket(k[:]).SetSequence(0)
	})
	bdb.Close()
	if err != nil {
		t.Fatal(err)
	}

	db = open()
	defer db.Close()
	wantStates(t, db, "s", 10)
	if n, count, err := db.ProducerStatesForTest("legacy"); err != nil || n != 10 || count != 0 {
		t.Fatalf("legacy stream: %d states, counted %d (%v); want 10, not counted", n, count, err)
	}
	clk.Advance(time.Second)
	for _, s := range []string{"s", "legacy"} {
		if _, err := prodAppend(db, s, "new", 0, 0); err != nil {
			t.Fatal(err)
		}
		wantStates(t, db, s, 9)
	}

	// p0 and p1 were evicted; p2-p5 (used 3-6 s in) are now idle over an
	// hour, p6 not.
	clk.Advance(time.Hour - 4500*time.Millisecond)
	for _, s := range []string{"s", "legacy"} {
		if _, err := prodAppend(db, s, "newer", 0, 0); err != nil { // 10 states: no eviction
			t.Fatal(err)
		}
		wantStates(t, db, s, 10)
	}
	maintain(t, db)
	for _, s := range []string{"s", "legacy"} {
		wantStates(t, db, s, 6) // p6-p9, new, newer
	}
}

// TestDB_ProducerBound_Off: a negative bound keeps every state (until
// ProducerTTL), still counted.
func TestDB_ProducerBound_Off(t *testing.T) {
	db := openDB(t, &storage.Options{NoSync: true, MaxProducersPerStream: -1})
	mustCreate(t, db, "s", storage.CreateOptions{})
	for i := range 30 {
		if _, err := prodAppend(db, "s", fmt.Sprint("p", i), 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	wantStates(t, db, "s", 30)
}

// TestDB_Producer_LongID: a producer id is a key in the stream's producer
// bucket; one longer than bbolt allows a key is a bad request, and must
// not fail the commit it is in (which would fail the DB for good).
func TestDB_Producer_LongID(t *testing.T) {
	var fatals atomic.Int32
	db := openDB(t, &storage.Options{NoSync: true, OnFatal: func(error) { fatals.Add(1) }})
	mustCreate(t, db, "s", storage.CreateOptions{})
	long := strings.Repeat("p", bolt.MaxKeySize+1)
	_, err := prodAppend(db, "s", long, 0, 0)
	wantErr(t, "Append with a producer id over bbolt's key limit", err, storage.ErrBadRequest)
	done := make(chan error, 1)
	db.AppendAsync("s", storage.AppendRequest{Records: rec("x"), Producer: &storage.Producer{ID: long}}, func(_ storage.AppendResult, err error) { done <- err })
	wantErr(t, "AppendAsync with a producer id over bbolt's key limit", <-done, storage.ErrBadRequest)
	if _, err := prodAppend(db, "s", strings.Repeat("p", bolt.MaxKeySize), 0, 0); err != nil {
		t.Fatalf("Append with a producer id at bbolt's key limit: %v", err)
	}
	mustAppend(t, db, "s", storage.AppendRequest{Records: rec("y")})
	if n := fatals.Load(); n != 0 {
		t.Fatalf("OnFatal called %d times", n)
	}
}
