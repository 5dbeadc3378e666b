package storage_test

import (
	"encoding/binary"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/syncgate/syncgate/storage"
)

// TestDB_Maintain_StreamThatDoesNotDecode: a maintenance step that fails
// is logged and retried on the next tick (docs/storage.md, Retention):
// one stream whose meta does not decode (a damaged file, or a newer
// binary's format) must not fail the DB, which would stop every stream
// and, as OnFatal exits, fail again at each restart's first pass.
func TestDB_Maintain_StreamThatDoesNotDecode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log.db")
	db, err := storage.Open(path, &storage.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	mustCreate(t, db, "a", storage.CreateOptions{})
	for _, d := range []string{"1", "2", "3"} {
		mustAppend(t, db, "a", storage.AppendRequest{Records: rec(d)})
	}
	bad := mustCreate(t, db, "bad", storage.CreateOptions{})
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	bdb, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = bdb.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("meta")).Put(binary.BigEndian.AppendUint64(nil, bad.ID), []byte{0xff})
	})
	if cerr := bdb.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}

	var fatals atomic.Int32
	db = openDB2(t, path, &storage.Options{NoSync: true, Retention: storage.Retention{MaxRecords: 1}, OnFatal: func(error) { fatals.Add(1) }})
	err = db.MaintainForTest(t.Context())
	if err == nil || errors.Is(err, storage.ErrFailed) {
		t.Fatalf("maintenance with a stream that does not decode: %v; want the step's error, not a failed DB", err)
	}
	if in, err := db.Head(t.Context(), "a"); err != nil || in.Pruned != storage.FormatOffset(2) {
		t.Fatalf("Head(a) after maintenance: %+v, %v; want it pruned to its last record", in, err)
	}
	mustAppend(t, db, "a", storage.AppendRequest{Records: rec("4")})
	if n := fatals.Load(); n != 0 {
		t.Fatalf("OnFatal called %d times", n)
	}
}

// openDB2 opens the DB at path and closes it at cleanup.
func openDB2(t *testing.T, path string, o *storage.Options) *storage.DB {
	t.Helper()
	db, err := storage.Open(path, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestDB_Maintain_RenewalOfStreamThatDoesNotDecode: the pass's first
// step, which persists the TTL renewals of reads and Waits, meets a
// stream whose meta no longer decodes (the file damaged while the DB
// runs, after a read renewed the stream). It used to return the decode
// error, which aborted the pass's transaction and so failed the DB; the
// stream must be skipped and reported as the later steps do, and the
// other streams' renewals and retention still done.
func TestDB_Maintain_RenewalOfStreamThatDoesNotDecode(t *testing.T) {
	clk := newClock()
	path := filepath.Join(t.TempDir(), "log.db")
	opts := &storage.Options{NoSync: true, Now: clk.Now, Retention: storage.Retention{MaxRecords: 1}}
	db := openDB2(t, path, opts)
	const ttl = 10 * time.Second
	mustCreate(t, db, "good", storage.CreateOptions{TTL: ttl})
	bad := mustCreate(t, db, "bad", storage.CreateOptions{TTL: ttl})
	mustCreate(t, db, "a", storage.CreateOptions{})
	for _, d := range []string{"1", "2", "3"} {
		mustAppend(t, db, "a", storage.AppendRequest{Records: rec(d)})
	}
	db.Close()

	// Reopened, the writer has loaded none of them: the pass decodes
	// their metas from the file.
	var fatals atomic.Int32
	o := *opts
	o.OnFatal = func(error) { fatals.Add(1) }
	db = openDB2(t, path, &o)
	clk.Advance(ttl / 2)
	for _, s := range []string{"good", "bad"} {
		if _, err := db.Read(t.Context(), s, storage.ZeroOffset, 0); err != nil { // renews
			t.Fatal(err)
		}
	}
	err := db.BoltForTest().Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("meta")).Put(key8(bad.ID), []byte{0xff})
	})
	if err != nil {
		t.Fatal(err)
	}
	err = db.MaintainForTest(t.Context())
	if err == nil || errors.Is(err, storage.ErrFailed) || !errors.Is(err, storage.ErrCorrupt) {
		t.Fatalf("maintenance renewing a stream that does not decode: %v; want the stream skipped with ErrCorrupt, not a failed DB", err)
	}
	if in, err := db.Head(t.Context(), "a"); err != nil || in.Pruned != storage.FormatOffset(2) {
		t.Fatalf("Head(a) after maintenance: %+v, %v; want it pruned to its last record", in, err)
	}
	mustAppend(t, db, "a", storage.AppendRequest{Records: rec("4")})
	if n := fatals.Load(); n != 0 {
		t.Fatalf("OnFatal called %d times", n)
	}

	// The renewal of the sound stream was persisted by that pass.
	db.Close()
	db = openDB2(t, path, opts)
	clk.Advance(ttl - time.Second)
	if _, err := db.Head(t.Context(), "good"); err != nil {
		t.Fatalf("Head(good) after a restart, a TTL less 1s after its read: %v; want its renewal persisted", err)
	}
}
