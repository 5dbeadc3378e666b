package storage_test

import (
	"path/filepath"
	"testing"

	"github.com/syncgate/syncgate/storage"
	"github.com/syncgate/syncgate/storage/storagetest"
)

// openDB opens a DB in t's temp dir and closes it at cleanup.
func openDB(t testing.TB, o *storage.Options) *storage.DB {
	t.Helper()
	db, err := storage.Open(filepath.Join(t.TempDir(), "log.db"), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	})
	return db
}

func TestDB_Contract(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts storage.Options
	}{
		{"fsync", storage.Options{}},
		{"nosync-batchwait", storage.Options{NoSync: true, MaxBatchWait: 2e6, MaxBatchBytes: 4096}},
		{"nosync-cache1", cacheSize(storage.Options{NoSync: true}, 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			storagetest.Run(t, func(t *testing.T) storagetest.Log {
				o := tc.opts
				return openDB(t, &o)
			})
		})
	}
}

// cacheSize returns o with a read cache of n streams.
func cacheSize(o storage.Options, n int) storage.Options {
	storage.SetMetaCacheSizeForTest(&o, n)
	return o
}

// An append bound whose records could exceed a bbolt value is refused at
// Open: such a record would fail its whole commit, and so the DB.
func TestOpen_MaxAppendLimit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log.db")
	if db, err := storage.Open(path, &storage.Options{MaxAppendBytes: storage.MaxAppendLimit + 1}); err == nil {
		db.Close()
		t.Fatal("Open took MaxAppendBytes over MaxAppendLimit")
	}
	openDB(t, &storage.Options{MaxAppendBytes: storage.MaxAppendLimit})
}
