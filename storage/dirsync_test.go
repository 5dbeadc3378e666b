package storage_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/syncgate/syncgate/storage"
)

// Open makes the file's name durable before it acknowledges anything: it
// syncs the directory of a file it created, and of one a compaction
// renamed into place, and fails when it cannot (an fsync of the file
// alone does not make its directory entry survive a power loss).
func TestOpen_SyncsDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "log.db")
	var synced []string
	var fail bool
	opts := &storage.Options{NoSync: true, PruneBatch: 1000}
	storage.SetSyncDirForTest(opts, func(d string) error {
		synced = append(synced, d)
		if fail {
			return errors.New("injected directory fsync failure")
		}
		return nil
	})

	// A new file: its directory entry is synced before any commit is
	// acknowledged.
	db, err := storage.Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(synced, dir) {
		t.Fatalf("Open created %s and synced directories %q, not %s", path, synced, dir)
	}
	leaveSparse(t, db, 50)
	db.Close()

	// The directory cannot be synced: Open refuses the file, compacted or
	// not, rather than acknowledge appends whose file name may vanish.
	fail = true
	synced = nil
	o2 := *opts
	storage.SetCompactMinBytesForTest(&o2, 1<<20)
	before, _ := os.Stat(path)
	if db, err := storage.Open(path, &o2); err == nil {
		db.Close()
		t.Fatalf("Open succeeded though the directory could not be synced (synced: %q)", synced)
	}
	after, _ := os.Stat(path)
	if after.Size()*2 > before.Size() {
		t.Fatalf("not compacted: %d → %d bytes", before.Size(), after.Size())
	}
	if n := len(synced); n < 2 {
		t.Fatalf("%d directory syncs; want the compaction's and Open's", n)
	}

	// Once it can be, the compacted file opens with its content.
	fail = false
	db, err = storage.Open(path, &o2)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if got := content(t, db, "keep"); got != "kept" {
		t.Fatalf("after compaction: %q", got)
	}
}
