package storage

import (
	"context"
	"encoding/binary"
	"sync"

	bolt "go.etcd.io/bbolt"
)

// metaCache holds decoded stream metas for the read path (Head, Wait,
// Read), so that a call needs no bbolt transaction (Head, Wait) or no meta
// decoding (Read) when the stream is cached.
//
// Entries are immutable: the writer publishes fresh copies after each
// commit, so readers never see a half-updated meta. The cache as a whole
// is the committed state as of the bbolt transaction gen: the writer
// publishes each commit's changed and removed streams, and advances gen,
// before it wakes waiters or answers callers, so a caller that saw an
// append acknowledged also sees it here. Readers that miss load the meta
// from a read transaction and insert it only if that transaction is gen,
// so a stale meta is never inserted. A cached entry is used inside a read
// transaction only when the transaction's id is gen, which makes meta and
// records one snapshot.
type metaCache struct {
	max int // entries kept; static

	mu       sync.RWMutex
	gen      uint64           // bbolt txid the entries reflect: the last commit published
	advanced chan struct{}    // closed (and replaced) when gen advances
	names    map[string]*meta // name → meta; the same entries as ids
	ids      map[uint64]*meta
}

// maxCachedMetas bounds the read cache by default; an arbitrary entry is
// evicted to make room.
const maxCachedMetas = 10000

func newMetaCache(gen uint64, max int) *metaCache {
	return &metaCache{max: max, gen: gen, advanced: make(chan struct{}), names: make(map[string]*meta), ids: make(map[uint64]*meta)}
}

// get returns the cached meta of name (nil when not cached) and the
// transaction the cache reflects.
func (c *metaCache) get(name string) (*meta, uint64) {
	c.mu.RLock()
	m, gen := c.names[name], c.gen
	c.mu.RUnlock()
	return m, gen
}

// getID is get by stream id.
func (c *metaCache) getID(id uint64) (*meta, uint64) {
	c.mu.RLock()
	m, gen := c.ids[id], c.gen
	c.mu.RUnlock()
	return m, gen
}

// fill inserts m, loaded in read transaction gen, unless a later commit
// has been published since.
func (c *metaCache) fill(gen uint64, m *meta) {
	c.mu.Lock()
	if c.gen == gen {
		c.putLocked(m)
	}
	c.mu.Unlock()
}

func (c *metaCache) putLocked(m *meta) {
	if old := c.names[m.Name]; old != nil && old.ID != m.ID {
		delete(c.ids, old.ID) // removed in a commit published before
	}
	if old := c.ids[m.ID]; old == nil && len(c.ids) >= c.max {
		for _, e := range c.ids {
			c.removeLocked(e.ID, e.Name)
			break
		}
	}
	c.ids[m.ID] = m
	c.names[m.Name] = m
}

func (c *metaCache) removeLocked(id uint64, name string) {
	delete(c.ids, id)
	if e := c.names[name]; e != nil && e.ID == id {
		delete(c.names, name)
	}
}

// cacheUpdate is one stream's change in a commit: its new meta, or its
// removal.
type cacheUpdate struct {
	m       *meta // a fresh copy, nil when removed
	id      uint64
	name    string
	removed bool
}

// publish applies a commit's updates and advances the cache to gen, the
// committed transaction's id.
func (c *metaCache) publish(gen uint64, ups []cacheUpdate) {
	c.mu.Lock()
	for _, u := range ups {
		if u.removed {
			c.removeLocked(u.id, u.name)
		} else {
			c.putLocked(u.m)
		}
	}
	c.gen = gen
	close(c.advanced)
	c.advanced = make(chan struct{})
	c.mu.Unlock()
}

// published returns the last commit published (its bbolt txid) and a
// channel closed when a later one is.
func (c *metaCache) published() (uint64, <-chan struct{}) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.gen, c.advanced
}

// metaOf returns the committed meta of name (nil when there is none),
// from the cache when it has it, else from a read transaction. The result
// must not be modified.
func (db *DB) metaOf(ctx context.Context, name string) (*meta, error) {
	if m, _ := db.cache.get(name); m != nil {
		return m, nil
	}
	return db.fileMeta(ctx, name)
}

// fileMeta is metaOf as of the latest commit published, read from the
// file (see view).
func (db *DB) fileMeta(ctx context.Context, name string) (*meta, error) {
	var m *meta
	err := db.view(ctx, func(tx *bolt.Tx) error {
		var err error
		m, err = db.txMeta(tx, name)
		return err
	})
	return m, err
}

// view runs fn in a read transaction that shows no commit the writer has
// not published. bbolt shows a commit to new transactions once its meta
// page is written, before the fsync that makes it durable; the writer
// publishes it (to the cache, then to waiters and callers) only after.
// A reader that saw it earlier could hand on records that a crash, or a
// failed fsync, then takes back, and that Head does not show yet (a
// subscriber resuming from such a record was told its cursor was not in
// the log). A transaction ahead of the published commit is dropped, and
// view waits for the publish (at most the commit's fsync), the DB's
// failure, or ctx.
func (db *DB) view(ctx context.Context, fn func(*bolt.Tx) error) error {
	for {
		gen, advanced := db.cache.published()
		ahead := false
		err := db.bolt.View(func(tx *bolt.Tx) error {
			if uint64(tx.ID()) > gen {
				ahead = true
				return nil
			}
			return fn(tx)
		})
		if !ahead {
			return err
		}
		select {
		case <-advanced:
		case <-db.failCh:
			return ErrFailed
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// txMeta returns the meta of name as of tx (nil when there is none): the
// cached one when the cache is at tx, else decoded from tx (and cached).
// The result must not be modified.
func (db *DB) txMeta(tx *bolt.Tx, name string) (*meta, error) {
	gen := uint64(tx.ID())
	if m, at := db.cache.get(name); m != nil && at == gen {
		return m, nil
	}
	v := tx.Bucket(bucketNames).Get([]byte(name))
	if v == nil {
		return nil, nil
	}
	return db.loadMeta(tx, gen, binary.BigEndian.Uint64(v))
}

// txMetaByID is txMeta by stream id.
func (db *DB) txMetaByID(tx *bolt.Tx, id uint64) (*meta, error) {
	gen := uint64(tx.ID())
	if m, at := db.cache.getID(id); m != nil && at == gen {
		return m, nil
	}
	return db.loadMeta(tx, gen, id)
}

// loadMeta decodes stream id's meta from tx, whose id is gen, and caches
// it.
func (db *DB) loadMeta(tx *bolt.Tx, gen, id uint64) (*meta, error) {
	v := tx.Bucket(bucketMeta).Get(key8(id))
	if v == nil {
		return nil, nil
	}
	m := new(meta)
	if err := decodeMeta(v, m); err != nil {
		return nil, err
	}
	db.cache.fill(gen, m)
	return m, nil
}
