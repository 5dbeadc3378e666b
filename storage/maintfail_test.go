package storage_test

import (
	"encoding/binary"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"

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
