package storage

import (
	"context"
	"os"

	bolt "go.etcd.io/bbolt"
)

// Test seams for package storage_test.

// SetCommitHookForTest makes every write transaction call f just before
// commit; an error from f fails the commit as a failed fsync would (a real
// fsync failure cannot be produced in a test).
func SetCommitHookForTest(o *Options, f func() error) { o.commitHook = f }

// SetPublishHookForTest makes every commit call f after bbolt has
// committed and before the read cache is told: a reader's own transaction
// sees the commit meanwhile, the cache does not.
func SetPublishHookForTest(o *Options, f func()) { o.publishHook = f }

// SetCompactMinBytesForTest lowers the file size from which Open compacts.
func SetCompactMinBytesForTest(o *Options, n int64) { o.compactMinBytes = n }

// SetMetaCacheSizeForTest bounds the readers' meta cache to n streams.
func SetMetaCacheSizeForTest(o *Options, n int) { o.metaCacheSize = n }

// BoltForTest returns the underlying bbolt database.
func (db *DB) BoltForTest() *bolt.DB { return db.bolt }

// MaintainForTest runs one maintenance pass through the writer and
// returns its error.
func (db *DB) MaintainForTest(ctx context.Context) error {
	r := &request{op: opMaintain, maint: &maintStats{}}
	if err := db.submit(ctx, r); err != nil {
		return err
	}
	return r.err
}

// AppendBatchForTest applies reqs to stream name in one transaction, in
// order, as the group commit does with concurrent appends.
func (db *DB) AppendBatchForTest(name string, reqs []AppendRequest) ([]AppendResult, []error) {
	batch := make([]*request, len(reqs))
	for i := range reqs {
		batch[i] = &request{op: opAppend, name: name, app: &reqs[i], size: recordBytes(reqs[i].Records), done: make(chan struct{})}
	}
	db.commit(batch)
	res := make([]AppendResult, len(reqs))
	errs := make([]error, len(reqs))
	for i, r := range batch {
		errs[i] = r.err
		res[i] = AppendResult{Offset: FormatOffset(r.res.last), Duplicate: r.res.dup, Epoch: r.res.epoch, Seq: r.res.seq, Closed: r.res.closed}
	}
	return res, errs
}

// WatchesForTest is how many stream IDs have a Wait watch registered.
func (db *DB) WatchesForTest() int {
	db.mu.Lock()
	defer db.mu.Unlock()
	return len(db.waiters)
}

// CachedProducersForTest returns how many producer states the writer
// caches for stream name. Call it only on the writer's goroutine: from a
// commit hook.
func (db *DB) CachedProducersForTest(name string) int {
	for _, ws := range db.wcache {
		if ws.m.Name == name {
			return len(ws.prods)
		}
	}
	return 0
}

// ProducerStatesForTest returns how many producer states the file holds
// for stream name, and the count its producer bucket keeps of them (0:
// not counted; see producers.go).
func (db *DB) ProducerStatesForTest(name string) (states int, count uint64, err error) {
	err = db.bolt.View(func(tx *bolt.Tx) error {
		id := tx.Bucket(bucketNames).Get([]byte(name))
		if id == nil {
			return ErrNotFound
		}
		pb := tx.Bucket(bucketProds).Bucket(id)
		if pb == nil {
			return nil
		}
		states, count = int(countKeys(pb)), pb.Sequence()
		return nil
	})
	return states, count, err
}

// SetSyncDirForTest replaces the fsync of the DB file's directory.
func SetSyncDirForTest(o *Options, f func(dir string) error) { o.syncDir = f }

// SetOpenFileForTest replaces the os.OpenFile with which bbolt opens the
// DB file (and Open's compaction its files).
func SetOpenFileForTest(o *Options, f func(name string, flag int, perm os.FileMode) (*os.File, error)) {
	o.openFile = f
}
