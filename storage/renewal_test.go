package storage_test

import (
	"bytes"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/syncgate/syncgate/storage"
)

// rawMeta returns stream name's meta as the file holds it.
func rawMeta(t *testing.T, db *storage.DB, name string) []byte {
	t.Helper()
	var v []byte
	err := db.BoltForTest().View(func(tx *bolt.Tx) error {
		id := tx.Bucket([]byte("names")).Get([]byte(name))
		if id == nil {
			return storage.ErrNotFound
		}
		v = bytes.Clone(tx.Bucket([]byte("meta")).Get(id))
		return nil
	})
	if err != nil {
		t.Fatalf("meta of %q: %v", name, err)
	}
	return v
}

// TestDB_Maintain_RenewalWrittenWhenItMoves: the maintenance pass
// persists the TTL renewal of a stream a Wait holds, or one read since,
// only once it moves the expiry by a tenth of the TTL or more. It used
// to rewrite the meta of every watched stream at every pass (a page
// write per stream per pass, for an expiry a few seconds later). In
// memory the TTL still slides, and a restart finds the renewal as of
// the last pass that wrote it.
func TestDB_Maintain_RenewalWrittenWhenItMoves(t *testing.T) {
	clk := newClock()
	path := filepath.Join(t.TempDir(), "log.db")
	opts := &storage.Options{NoSync: true, Now: clk.Now}
	db := openDB2(t, path, opts)
	ctx := t.Context()
	const ttl = 10 * time.Second
	mustCreate(t, db, "w", storage.CreateOptions{TTL: ttl})
	mustCreate(t, db, "r", storage.CreateOptions{TTL: ttl})
	ch, _ := waitHeld(t, db, clk, "w", ttl) // half the TTL on
	if _, err := db.Read(ctx, "r", storage.ZeroOffset, 0); err != nil {
		t.Fatal(err)
	}
	maintain(t, db) // both renewed by half the TTL: written
	w, r := rawMeta(t, db, "w"), rawMeta(t, db, "r")

	for i := range 4 { // 4 × TTL/50: less than a tenth of the TTL in all
		clk.Advance(ttl / 50)
		if _, err := db.Read(ctx, "r", storage.ZeroOffset, 0); err != nil {
			t.Fatal(err)
		}
		maintain(t, db)
		if !bytes.Equal(rawMeta(t, db, "w"), w) || !bytes.Equal(rawMeta(t, db, "r"), r) {
			t.Fatalf("pass %d, %v after the last write: a renewal by less than a tenth of the TTL was written", i, time.Duration(i+1)*ttl/50)
		}
		if got, got2 := ttlLeftOf(t, db, "w"), ttlLeftOf(t, db, "r"); got != ttl || got2 != ttl {
			t.Fatalf("pass %d: TTLLeft %v (waited on), %v (just read); want %v", i, got, got2, ttl)
		}
	}
	// The Wait's renewal now moves the expiry by more than a tenth of
	// the TTL, the last read's still by less.
	clk.Advance(ttl / 10)
	maintain(t, db)
	if bytes.Equal(rawMeta(t, db, "w"), w) {
		t.Fatal("the renewal of the stream waited on, by more than a tenth of the TTL, was not written")
	}
	if !bytes.Equal(rawMeta(t, db, "r"), r) {
		t.Fatal("the renewal of the stream read, by less than a tenth of the TTL, was written")
	}
	if _, err := db.Read(ctx, "r", storage.ZeroOffset, 0); err != nil {
		t.Fatal(err)
	}
	maintain(t, db)
	if bytes.Equal(rawMeta(t, db, "r"), r) {
		t.Fatal("the renewal of the stream read, by more than a tenth of the TTL, was not written")
	}

	db.Close()
	wantErr(t, "Wait at Close", <-ch, storage.ErrClosedDB)
	db = openDB2(t, path, opts)
	for _, s := range []string{"w", "r"} {
		if got := ttlLeftOf(t, db, s); got != ttl {
			t.Fatalf("after a restart, TTLLeft of %q, renewed and written at the last pass: %v, want %v", s, got, ttl)
		}
	}
}
