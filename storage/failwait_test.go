package storage_test

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncgate/syncgate/storage"
)

// A Wait blocked when a commit fails returns ErrFailed at once, as every
// later call does: no commit will ever wake it, and a tailer must not
// take the failed DB for a quiet stream until its own deadline.
func TestDB_Wait_DBFails(t *testing.T) {
	var fail atomic.Bool
	opts := &storage.Options{NoSync: true, OnFatal: func(error) {}}
	storage.SetCommitHookForTest(opts, func() error {
		if fail.Load() {
			return errors.New("injected fsync failure")
		}
		return nil
	})
	db := openDB(t, opts)
	info := mustCreate(t, db, "s", storage.CreateOptions{})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	waited := make(chan error, 1)
	go func() { waited <- db.WaitID(ctx, "s", info.Tail, info.ID) }()
	// Poll (with the deadline above) until the Wait has registered.
	for db.WatchesForTest() == 0 {
		if ctx.Err() != nil {
			t.Fatal("Wait never registered")
		}
		runtime.Gosched()
	}
	fail.Store(true)
	_, err := db.Append(t.Context(), "s", storage.AppendRequest{Records: rec("lost")})
	wantErr(t, "Append", err, storage.ErrFailed)
	wantErr(t, "Wait blocked when the DB failed", <-waited, storage.ErrFailed)
}
