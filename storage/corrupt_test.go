package storage_test

import (
	"errors"
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
