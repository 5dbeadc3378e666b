package storage_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/syncgate/syncgate/storage"
)

// damage runs f in a write transaction on the closed DB file at path.
func damage(t *testing.T, path string, f func(tx *bolt.Tx) error) {
	t.Helper()
	bdb, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = bdb.Update(f)
	if cerr := bdb.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestDB_RequestOnStreamThatDoesNotDecode: a request that meets a
// stream's meta or a producer's state that does not decode (a damaged
// file, a newer binary's format) is refused alone. It used to abort the
// batch's transaction, which fails the DB: every other request of the
// batch got ErrFailed, every later call too, and OnFatal (the process
// exits) ran again at each restart on the first request for that stream.
func TestDB_RequestOnStreamThatDoesNotDecode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log.db")
	db, err := storage.Open(path, &storage.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	mustCreate(t, db, "good", storage.CreateOptions{})
	bad := mustCreate(t, db, "bad", storage.CreateOptions{})
	src := mustCreate(t, db, "src", storage.CreateOptions{Records: rec("s")})
	mustCreate(t, db, "fork", storage.CreateOptions{ForkFrom: "src"})
	prods := mustCreate(t, db, "prods", storage.CreateOptions{})
	mustAppend(t, db, "prods", storage.AppendRequest{Records: rec("p0"), Producer: &storage.Producer{ID: "p", Seq: 0}})
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	damage(t, path, func(tx *bolt.Tx) error {
		metas := tx.Bucket([]byte("meta"))
		if err := metas.Put(key8(bad.ID), []byte{0xff}); err != nil {
			return err
		}
		if err := metas.Put(key8(src.ID), []byte{0xff}); err != nil {
			return err
		}
		return tx.Bucket([]byte("prods")).Bucket(key8(prods.ID)).Put([]byte("p"), []byte{0xff})
	})

	var fatals atomic.Int32
	db = openDB2(t, path, &storage.Options{NoSync: true, MaxBatchWait: 20 * time.Millisecond, OnFatal: func(error) { fatals.Add(1) }})
	ctx := t.Context()
	notFailed := func(what string, err error) {
		t.Helper()
		if err == nil || errors.Is(err, storage.ErrFailed) || !errors.Is(err, storage.ErrCorrupt) {
			t.Errorf("%s: %v; want the request refused with ErrCorrupt, not the DB failed", what, err)
		}
	}

	// In one batch (MaxBatchWait gathers them) with appends to a sound stream.
	var wg sync.WaitGroup
	var goodErrs [2]error
	var badErr error
	var mu sync.Mutex
	wg.Add(3)
	db.AppendAsync("good", storage.AppendRequest{Records: rec("1")}, func(_ storage.AppendResult, err error) {
		mu.Lock()
		goodErrs[0] = err
		mu.Unlock()
		wg.Done()
	})
	db.AppendAsync("bad", storage.AppendRequest{Records: rec("x")}, func(_ storage.AppendResult, err error) {
		mu.Lock()
		badErr = err
		mu.Unlock()
		wg.Done()
	})
	db.AppendAsync("good", storage.AppendRequest{Records: rec("2")}, func(_ storage.AppendResult, err error) {
		mu.Lock()
		goodErrs[1] = err
		mu.Unlock()
		wg.Done()
	})
	wg.Wait()
	notFailed("Append to the stream that does not decode", badErr)
	for i, err := range goodErrs {
		if err != nil {
			t.Errorf("append %d to the sound stream in the same batch: %v", i, err)
		}
	}

	_, _, err = db.Create(ctx, "bad", storage.CreateOptions{})
	notFailed("Create at its name", err)
	notFailed("Delete", db.Delete(ctx, "bad"))
	_, _, err = db.Create(ctx, "fork2", storage.CreateOptions{ForkFrom: "bad"})
	notFailed("Create a fork of it", err)
	_, err = db.Append(ctx, "prods", storage.AppendRequest{Records: rec("p1"), Producer: &storage.Producer{ID: "p", Seq: 1}})
	notFailed("Append by a producer whose state does not decode", err)
	// A fork whose source does not decode is removed; the source is left.
	if err := db.Delete(ctx, "fork"); err != nil {
		t.Errorf("Delete of a fork whose source does not decode: %v", err)
	}

	mustAppend(t, db, "good", storage.AppendRequest{Records: rec("3")})
	if got := content(t, db, "good"); got != "123" {
		t.Fatalf("sound stream holds %q, want 123", got)
	}
	if n := fatals.Load(); n != 0 {
		t.Fatalf("OnFatal called %d times", n)
	}
}

func key8(n uint64) []byte {
	var k [8]byte
	for i := range k {
		k[7-i] = byte(n >> (8 * i))
	}
	return k[:]
}

// TestDB_DamagedProducerStateIsKept: a producer state that does not
// decode is refused (ErrCorrupt) for good: neither the maintenance pass
// nor the producer bound's eviction deletes it, whatever the last use it
// seems to hold. Both used to (it sorted as the oldest), after which the
// producer was unknown, and its retry of an append the stream already
// holds, at seq 0, was appended again: a duplicate no one was told of.
func TestDB_DamagedProducerStateIsKept(t *testing.T) {
	clk := newClock()
	path := filepath.Join(t.TempDir(), "log.db")
	opts := &storage.Options{NoSync: true, Now: clk.Now, ProducerTTL: time.Hour}
	db := openDB2(t, path, opts)
	s := mustCreate(t, db, "s", storage.CreateOptions{})
	for _, p := range []string{"bad", "badring", "idle"} {
		mustAppend(t, db, "s", storage.AppendRequest{Records: rec(p), Producer: &storage.Producer{ID: p}})
	}
	db.Close()
	damage(t, path, func(tx *bolt.Tx) error {
		pb := tx.Bucket([]byte("prods")).Bucket(key8(s.ID))
		if err := pb.Put([]byte("bad"), []byte{0xff}); err != nil {
			return err
		}
		// Epoch 0, seq 0, last use 0 (long past ProducerTTL), then a
		// ring of 200 entries: over its 64, so it does not decode.
		return pb.Put([]byte("badring"), []byte{0, 0, 0, 200, 1})
	})
	refused := func(what string) {
		t.Helper()
		for _, p := range []string{"bad", "badring"} {
			_, err := db.Append(t.Context(), "s", storage.AppendRequest{Records: rec(p), Producer: &storage.Producer{ID: p}})
			if !errors.Is(err, storage.ErrCorrupt) || errors.Is(err, storage.ErrFailed) {
				t.Fatalf("%s: producer %q, whose state does not decode, retries seq 0: %v; want it refused with ErrCorrupt", what, p, err)
			}
		}
	}

	o := *opts
	o.MaxProducersPerStream = 4
	db = openDB2(t, path, &o)
	refused("before maintenance")
	clk.Advance(2 * time.Hour)
	if err := db.MaintainForTest(t.Context()); err != nil && (!errors.Is(err, storage.ErrCorrupt) || errors.Is(err, storage.ErrFailed)) {
		t.Fatalf("maintenance: %v; want nil or ErrCorrupt, not a failed DB", err)
	}
	refused("after maintenance")
	wantStates(t, db, "s", 2) // the idle one expired, the damaged two kept

	// Past the bound (4), the least recently used state that decodes goes.
	for i := range 3 {
		clk.Advance(time.Second)
		if _, err := prodAppend(db, "s", fmt.Sprint("n", i), 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	wantStates(t, db, "s", 4)
	refused("after an eviction")
	if r, err := prodAppend(db, "s", "n0", 0, 0); err != nil || r.Duplicate {
		t.Fatalf("n0, the least recently used state that decodes, retries seq 0: %+v, %v; want it forgotten (appended)", r, err)
	}
	if got := content(t, db, "s"); got != "badbadringidlen0n1n2n0" {
		t.Fatalf("stream holds %q; want no append by a producer whose state does not decode", got)
	}
}
