package storage_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/syncgate/syncgate/storage"
)

// A process that opened the file, and waits for bbolt's lock on it while
// another process compacts it, must not go on with the old file once the
// compaction renamed the new one over its path: appends acknowledged in
// an unlinked file are lost. The swap is injected between bbolt's open of
// the file and its lock, as the other process's compaction does it.
func TestOpen_FileReplacedWhileWaitingForTheLock(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "log.db")
	newer := filepath.Join(dir, "compacted.db")
	for file, stream := range map[string]string{path: "old", newer: "new"} {
		db, err := storage.Open(file, &storage.Options{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		mustCreate(t, db, stream, storage.CreateOptions{Records: rec(stream)})
		db.Close()
	}
	// The other process: it holds the lock of the file at path ...
	other, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	opts := &storage.Options{NoSync: true}
	swapped := false
	storage.SetOpenFileForTest(opts, func(name string, flag int, perm os.FileMode) (*os.File, error) {
		f, err := os.OpenFile(name, flag, perm)
		if err == nil && name == path && !swapped {
			// ... and, once this process has opened it, renames its
			// compacted file over it and releases that lock.
			swapped = true
			if err := os.Rename(newer, path); err != nil {
				t.Error(err)
			}
			if err := other.Close(); err != nil {
				t.Error(err)
			}
		}
		return f, err
	})
	db, err := storage.Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	if !swapped {
		t.Fatal("the file was not opened through the seam")
	}
	if _, err := db.Head(t.Context(), "new"); err != nil {
		t.Fatalf("Open uses the file %s named before the rename: Head(new): %v", path, err)
	}
	mustAppend(t, db, "new", storage.AppendRequest{Records: rec("acked")})
	db.Close()

	db, err = storage.Open(path, &storage.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if got := content(t, db, "new"); got != "newacked" {
		t.Fatalf("after reopening %s: stream new holds %q; the acknowledged append is lost", path, got)
	}
}
