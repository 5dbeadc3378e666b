package storage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Options configures a [DB]. The zero value of every field selects the
// documented default.
type Options struct {
	// NoSync skips fsync on commit. For tests and benchmarks only: a
	// crash may lose or corrupt acknowledged appends. Default false.
	NoSync bool

	// MaxBatchBytes bounds the record bytes gathered into one transaction
	// (one fsync) by the group commit. Default 4 MiB. A single larger
	// request still commits, alone.
	MaxBatchBytes int

	// MaxBatchWait is how long the writer waits for more requests after
	// the first of a batch. Default 0: take what is queued; the fsync of
	// the previous batch is the natural batching window.
	MaxBatchWait time.Duration

	// MaxAppendBytes bounds one append's total record bytes (also the
	// initial records of a Create); above it the call fails with
	// [ErrTooLarge]. Default 8 MiB, at most [MaxAppendLimit].
	MaxAppendBytes int64

	// Retention is the default retention of every stream without its own
	// ([CreateOptions].Retention). Zero keeps everything.
	Retention Retention

	// MaintenanceInterval is the period of the maintenance pass
	// (retention pruning, producer expiry, removal of deleted and expired
	// streams' data, persistence of TTLs renewed by reads and Waits).
	// Default 5s.
	MaintenanceInterval time.Duration

	// PruneBatch bounds the records pruned, and the idle producer states
	// deleted, per stream per maintenance pass; ten times it bounds the
	// records of deleted streams removed per pass. Default 500.
	PruneBatch int

	// ProducerTTL is how long an idle producer's state is kept. A
	// producer that comes back after it starts afresh (seq 0). Default 7
	// days.
	ProducerTTL time.Duration

	// MaxProducersPerStream bounds the producer states one stream keeps
	// (each distinct Producer.ID is one, until ProducerTTL). A commit
	// that takes a stream past it forgets the stream's least recently
	// used states, by their last admitted append as ProducerTTL counts,
	// down to nine tenths of the bound, so the next such commit is a
	// tenth of the bound's new producers away. A forgotten producer is
	// treated as one whose ProducerTTL ran out. A commit never forgets
	// the producers it admits itself, so a single commit of many new
	// producers may leave a stream over the bound until the next one.
	// Zero means 10,000; negative means no bound.
	MaxProducersPerStream int

	// Logger receives maintenance and failure logs. Nil discards.
	Logger *slog.Logger

	// Now is the clock. Nil means time.Now.
	Now func() time.Time

	// OnFatal is called once, from the writer goroutine, when a commit or
	// fsync fails. After it every call returns [ErrFailed]. Nil logs at
	// Error level only.
	OnFatal func(error)

	// Test seams, set through export_test.go.
	commitHook      func() error                                                    // called inside each write tx before commit; an error fails the commit
	publishHook     func()                                                          // called after each commit, before the read cache learns of it
	compactMinBytes int64                                                           // file size from which Open compacts; default 64 MiB
	metaCacheSize   int                                                             // streams in the read cache; default maxCachedMetas
	syncDir         func(dir string) error                                          // fsyncs a directory; default syncDir
	openFile        func(name string, flag int, perm os.FileMode) (*os.File, error) // bbolt's; default os.OpenFile
}

// MaxAppendLimit is the largest [Options].MaxAppendBytes Open takes. Each
// record is one bbolt value (plus a 9-byte header), and a value over
// bbolt's limit (2 GiB) would fail the whole commit, and so the DB.
const MaxAppendLimit = 1 << 30

// Defaults.
const (
	defaultMaxBatchBytes  = 4 << 20
	defaultMaxAppendBytes = 8 << 20
	defaultMaintenance    = 5 * time.Second
	defaultPruneBatch     = 500
	defaultProducerTTL    = 7 * 24 * time.Hour
	defaultMaxProducers   = 10000
	defaultCompactMin     = 64 << 20
	defaultReadBytes      = 1 << 20
)

// Bucket names.
var (
	bucketNames = []byte("names") // stream name → id (8 bytes)
	bucketMeta  = []byte("meta")  // id → meta (binary, encodeMeta; older files JSON); its sequence allocates ids
	bucketRecs  = []byte("recs")  // id → bucket: position (8 bytes BE) → record value
	bucketProds = []byte("prods") // id → bucket: producer id → prodState; the bucket's sequence counts them (producers.go)
	bucketDead  = []byte("dead")  // id → empty: removed streams whose buckets are still to clear
)

// DB is a durable stream log in one bbolt file. Writes go through a
// single writer goroutine that commits many requests per transaction
// (group commit); reads run concurrently in read transactions. All
// methods may be called concurrently.
type DB struct {
	// Static after Open.
	bolt   *bolt.DB
	opts   Options
	log    *slog.Logger
	now    func() time.Time
	path   string
	reqs   chan *request
	quit   chan struct{} // closed by Close
	failCh chan struct{} // closed when the DB fails (fail)
	wdone  chan struct{} // closed when the writer exits
	mdone  chan struct{} // closed when the maintenance loop exits
	kick   chan struct{} // asks for an early maintenance pass
	closer sync.Once
	cache  *metaCache // decoded metas for readers; see cache.go

	// Owned by the writer goroutine.
	wcache map[uint64]*wstream

	failed   atomic.Bool
	isClosed atomic.Bool
	// sendMu orders queueing against Close: senders hold it shared while
	// they check isClosed and queue, Close takes it to set isClosed, so
	// nothing is queued after the writer's final drain.
	sendMu sync.RWMutex

	// Guarded by mu.
	mu       sync.Mutex
	access   map[uint64]int64         // id → last read or Wait's return, Unix ns, not yet persisted
	waiters  map[uint64]chan struct{} // id → closed on the next commit touching it
	watching map[uint64]int           // id → Waits blocked on a stream with a sliding TTL (holdTTL)
}

// Open opens (creating if needed) the log at path. opts may be nil; it is
// copied, never modified. A file whose free pages dominate is compacted
// first (see docs/storage.md).
func Open(path string, opts *Options) (*DB, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.MaxBatchBytes <= 0 {
		o.MaxBatchBytes = defaultMaxBatchBytes
	}
	if o.MaxAppendBytes <= 0 {
		o.MaxAppendBytes = defaultMaxAppendBytes
	}
	if o.MaxAppendBytes > MaxAppendLimit {
		return nil, fmt.Errorf("storage: MaxAppendBytes %d is over MaxAppendLimit (%d)", o.MaxAppendBytes, MaxAppendLimit)
	}
	if o.MaintenanceInterval <= 0 {
		o.MaintenanceInterval = defaultMaintenance
	}
	if o.PruneBatch <= 0 {
		o.PruneBatch = defaultPruneBatch
	}
	if o.ProducerTTL <= 0 {
		o.ProducerTTL = defaultProducerTTL
	}
	if o.MaxProducersPerStream == 0 {
		o.MaxProducersPerStream = defaultMaxProducers
	}
	if o.metaCacheSize <= 0 {
		o.metaCacheSize = maxCachedMetas
	}
	if o.compactMinBytes <= 0 {
		o.compactMinBytes = defaultCompactMin
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.syncDir == nil {
		o.syncDir = syncDir
	}
	if err := compactIfSparse(path, &o); err != nil {
		o.Logger.Warn("storage: compaction at open failed; continuing uncompacted", "path", path, "err", err)
	}
	bdb, err := openBolt(path, boltOptions(&o), &o)
	if err != nil {
		return nil, fmt.Errorf("storage: open %s: %w", path, err)
	}
	// The file's own fsyncs do not make its name durable: the entry bbolt
	// just created, or the rename of a compaction (this Open's, or one
	// whose directory sync failed before), is only on disk once the
	// directory is synced. Before anything is acknowledged, then, or a
	// power loss could take the file, or the compacted file, and every
	// append acknowledged in it.
	if err := o.syncDir(dirOf(path)); err != nil {
		bdb.Close()
		return nil, fmt.Errorf("storage: open %s: sync directory: %w", path, err)
	}
	bdb.AllocSize = 64 << 20 // grow the file (and fsync its size) rarely
	var gen uint64
	err = bdb.Update(func(tx *bolt.Tx) error {
		gen = uint64(tx.ID())
		for _, name := range [][]byte{bucketNames, bucketMeta, bucketRecs, bucketProds, bucketDead} {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		bdb.Close()
		return nil, fmt.Errorf("storage: init %s: %w", path, err)
	}
	db := &DB{
		bolt:     bdb,
		opts:     o,
		log:      o.Logger,
		now:      o.Now,
		path:     path,
		reqs:     make(chan *request, 4096),
		quit:     make(chan struct{}),
		failCh:   make(chan struct{}),
		wdone:    make(chan struct{}),
		mdone:    make(chan struct{}),
		kick:     make(chan struct{}, 1),
		cache:    newMetaCache(gen, o.metaCacheSize),
		access:   make(map[uint64]int64),
		wcache:   make(map[uint64]*wstream),
		waiters:  make(map[uint64]chan struct{}),
		watching: make(map[uint64]int),
	}
	go db.writer()
	go db.maintainLoop()
	return db, nil
}

func boltOptions(o *Options) *bolt.Options {
	return &bolt.Options{
		Timeout:        5 * time.Second,
		NoSync:         o.NoSync,
		NoGrowSync:     o.NoSync,
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
		// Address space only: avoids remapping (which waits for every
		// read transaction) as the file grows.
		InitialMmapSize: 1 << 30,
	}
}

// openBolt opens the bbolt file at path with bo, and checks that the
// file it locked is still the one path names. bbolt opens the file, then
// waits for its lock; a compaction in another process (compactIfSparse)
// may meanwhile rename its compacted file over path and release the lock
// of the old one, which this process would then hold and use: unlinked,
// never read again, with every append acknowledged in it, while the
// other process uses the file at path. On a mismatch it opens path again.
func openBolt(path string, bo *bolt.Options, o *Options) (*bolt.DB, error) {
	open := o.openFile
	if open == nil {
		open = os.OpenFile
	}
	for range maxOpenAttempts {
		var f *os.File
		bo.OpenFile = func(name string, flag int, perm os.FileMode) (*os.File, error) {
			var err error
			f, err = open(name, flag, perm)
			return f, err
		}
		bdb, err := bolt.Open(path, 0o600, bo)
		if err != nil {
			return nil, err
		}
		locked, err := f.Stat()
		if err != nil {
			bdb.Close()
			return nil, err
		}
		named, err := os.Stat(path)
		if err == nil && os.SameFile(locked, named) {
			return bdb, nil
		}
		bdb.Close()
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
	}
	return nil, fmt.Errorf("storage: %s was replaced by another file while it was being opened, %d times", path, maxOpenAttempts)
}

// maxOpenAttempts bounds openBolt's attempts.
const maxOpenAttempts = 5

// syncDir fsyncs directory dir, so that the names in it are durable. On
// Windows, where a directory cannot be synced (and a rename is durable
// with the file), it does nothing.
func syncDir(dir string) error {
	if runtime.GOOS == "windows" {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// Close stops the writer and the maintenance loop, after committing the
// requests already queued, and closes the file. It is idempotent; calls
// made after it return [ErrClosedDB].
func (db *DB) Close() error {
	var err error
	db.closer.Do(func() {
		db.sendMu.Lock()
		db.isClosed.Store(true)
		db.sendMu.Unlock()
		close(db.quit)
		<-db.mdone
		<-db.wdone
		err = db.bolt.Close()
	})
	return err
}

// check returns the error every call gets on a closed or failed DB.
func (db *DB) check() error {
	if db.failed.Load() {
		return ErrFailed
	}
	if db.isClosed.Load() {
		return ErrClosedDB
	}
	return nil
}

// fail marks the DB failed after a commit error and reports it once.
func (db *DB) fail(err error) {
	if db.failed.Swap(true) {
		return
	}
	close(db.failCh) // blocked Waits return ErrFailed: no commit will wake them
	db.log.Error("storage: commit failed; refusing all further calls", "path", db.path, "err", err)
	if db.opts.OnFatal != nil {
		db.opts.OnFatal(err)
	}
}

// submit queues r for the writer and waits for its answer. When ctx ends
// first the caller stops waiting, but r still commits wholly or not at
// all.
func (db *DB) submit(ctx context.Context, r *request) error {
	r.done = make(chan struct{})
	if err := db.enqueue(ctx, r); err != nil {
		return err
	}
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-db.wdone:
		select {
		case <-r.done:
			return nil
		default:
			return ErrClosedDB
		}
	}
}

// enqueue queues r for the writer. It fails only before queueing.
func (db *DB) enqueue(ctx context.Context, r *request) error {
	db.sendMu.RLock()
	defer db.sendMu.RUnlock()
	if db.isClosed.Load() {
		return ErrClosedDB
	}
	select {
	case db.reqs <- r:
		return nil
	default:
	}
	select {
	case db.reqs <- r:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// touchAccess records a read of stream id at now, to be persisted lazily.
func (db *DB) touchAccess(id uint64, now int64) {
	db.mu.Lock()
	if now > db.access[id] {
		db.access[id] = now
	}
	db.mu.Unlock()
}

// lastAccess returns when m's sliding TTL was last renewed, as of now
// (Unix ns): the later of its persisted access and an unpersisted read,
// or now while a Wait is blocked on it (holdTTL).
func (db *DB) lastAccess(m *meta, now int64) int64 {
	db.mu.Lock()
	a := db.access[m.ID]
	if db.watching[m.ID] > 0 {
		a = max(a, now)
	}
	db.mu.Unlock()
	return max(a, m.Access)
}

// holdTTL keeps stream id's sliding TTL from running out while a Wait is
// blocked on it, until releaseTTL. Only streams with a sliding TTL are
// held: Waits on the others cost nothing more.
func (db *DB) holdTTL(id uint64) {
	db.mu.Lock()
	db.watching[id]++
	db.mu.Unlock()
}

// releaseTTL ends a holdTTL at now, renewing the TTL then: it runs again
// from the Wait's return, as from a read.
func (db *DB) releaseTTL(id uint64, now int64) {
	db.mu.Lock()
	if db.watching[id]--; db.watching[id] <= 0 {
		delete(db.watching, id)
	}
	if now > db.access[id] {
		db.access[id] = now
	}
	db.mu.Unlock()
}

// Stream states as seen by a call.
const (
	stLive = iota
	stMissing
	stGone
)

// state classifies m at now: soft-deleted is gone; expired is missing,
// unless forks still read it, then gone.
func (db *DB) state(m *meta, now time.Time) int {
	if m.Deleted {
		return stGone
	}
	if db.expired(m, now) {
		if m.Forks > 0 {
			return stGone
		}
		return stMissing
	}
	return stLive
}

func (db *DB) expired(m *meta, now time.Time) bool {
	if !m.ExpiresAt.IsZero() && !now.Before(m.ExpiresAt) {
		return true
	}
	if m.TTL > 0 && now.UnixNano()-db.lastAccess(m, now.UnixNano()) >= int64(m.TTL) {
		return true
	}
	return false
}

// stateErr returns the error for a non-live state.
func stateErr(st int, name string) error {
	switch st {
	case stMissing:
		return fmt.Errorf("%w: %q", ErrNotFound, name)
	case stGone:
		return fmt.Errorf("%w: stream %q was deleted", ErrGone, name)
	}
	return nil
}

// watch returns a channel closed on the next commit that touches id.
func (db *DB) watch(id uint64) <-chan struct{} {
	db.mu.Lock()
	defer db.mu.Unlock()
	ch, ok := db.waiters[id]
	if !ok {
		ch = make(chan struct{})
		db.waiters[id] = ch
	}
	return ch
}

// wake closes the watch channels of ids.
func (db *DB) wake(ids []uint64) {
	if len(ids) == 0 {
		return
	}
	db.mu.Lock()
	for _, id := range ids {
		if ch, ok := db.waiters[id]; ok {
			close(ch)
			delete(db.waiters, id)
		}
	}
	db.mu.Unlock()
}

var errInternal = errors.New("storage: internal error")
