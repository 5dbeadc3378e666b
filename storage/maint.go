package storage

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"time"

	bolt "go.etcd.io/bbolt"
)

// maintStats counts what a maintenance pass did.
type maintStats struct {
	pruned, producers, expired, cleared int
	corrupt                             int // streams skipped: meta does not decode
	corruptProducers                    int // producer states kept that do not decode
}

// maintainLoop asks the writer for a maintenance pass every
// MaintenanceInterval. A failed pass is logged and retried next tick.
func (db *DB) maintainLoop() {
	defer close(db.mdone)
	t := time.NewTicker(db.opts.MaintenanceInterval)
	defer t.Stop()
	for {
		select {
		case <-db.quit:
			return
		case <-t.C:
		case <-db.kick:
		}
		r := &request{op: opMaintain, maint: &maintStats{}}
		if err := db.submit(context.Background(), r); err != nil {
			if !errors.Is(err, ErrClosedDB) {
				db.log.Error("storage: maintenance failed", "err", err)
			}
			continue
		}
		if r.err != nil {
			db.log.Warn("storage: maintenance step failed; retrying next tick", "err", r.err, "streams_corrupt", r.maint.corrupt, "producers_corrupt", r.maint.corruptProducers)
		} else if s := *r.maint; s != (maintStats{}) {
			db.log.Debug("storage: maintenance", "pruned", s.pruned, "producers_expired", s.producers, "streams_expired", s.expired, "records_cleared", s.cleared)
		}
	}
}

// maintain runs one maintenance pass inside the writer's transaction:
// persist access times renewed by reads and by blocked Waits (once they
// move by TTL/renewalStep), remove expired streams, prune by retention,
// expire idle producers, clear removed streams' records. Each step's
// work per stream is bounded by PruneBatch.
func (b *batch1) maintain(r *request) error {
	db := b.db
	// Renewals: load those streams so flush persists their access (a
	// stream a Wait holds is renewed now, lastAccess).
	db.mu.Lock()
	ids := make([]uint64, 0, len(db.access)+len(db.watching))
	for id := range db.access {
		ids = append(ids, id)
	}
	for id := range db.watching {
		if _, ok := db.access[id]; !ok {
			ids = append(ids, id)
		}
	}
	db.mu.Unlock()
	for _, id := range ids {
		ws, err := b.byID(id)
		if errors.Is(err, errCorruptMeta) {
			// Damaged since the read or Wait that renewed it: nothing
			// to persist it in. The scan below reports it.
			db.mu.Lock()
			delete(db.access, id)
			db.mu.Unlock()
			continue
		}
		if err != nil {
			return err
		}
		if ws == nil || ws.m.TTL <= 0 {
			db.mu.Lock()
			delete(db.access, id) // the stream is gone, or has no sliding TTL
			db.mu.Unlock()
			continue
		}
		// Written only once the renewal moves the expiry by a tenth of
		// the TTL: a stream a Wait holds is renewed to now at every pass,
		// and rewriting its meta each time (a page write per stream per
		// pass) would buy a restart a few seconds of TTL. An unwritten
		// renewal stays in memory (lastAccess), so the TTL still slides.
		if db.lastAccess(&ws.m, b.nowNs)-ws.m.Access >= int64(ws.m.TTL/renewalStep) {
			ws.dirty = true
		}
	}

	ids = ids[:0]
	c := b.metas.Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		ids = append(ids, binary.BigEndian.Uint64(k))
	}
	for _, id := range ids {
		ws, err := b.byID(id)
		if errors.Is(err, errCorruptMeta) {
			// Nothing was changed for it: the step is logged, the other
			// streams are kept, and the next pass tries again. Failing
			// the commit would fail the DB, at every restart's first pass.
			if r.err == nil {
				r.err = fmt.Errorf("stream id %d: %w", id, err)
			}
			r.maint.corrupt++
			continue
		}
		if err != nil {
			return err
		}
		if ws == nil {
			continue
		}
		m := &ws.m
		if m.Forks == 0 && (m.Deleted || db.expired(m, b.now)) {
			if err := b.remove(ws); err != nil {
				return err
			}
			r.maint.expired++
			continue
		}
		n, err := b.prune(ws)
		if err != nil {
			return err
		}
		r.maint.pruned += n
		kept := 0
		if n, kept, err = b.expireProducers(ws); err != nil {
			return err
		}
		r.maint.producers += n
		if kept > 0 {
			// Kept, and refused on use, for good (see expireProducers):
			// logged at each pass, as a meta that does not decode is.
			if r.err == nil {
				r.err = fmt.Errorf("stream %q: %d producer states kept: %w", m.Name, kept, errCorruptProducer)
			}
			r.maint.corruptProducers += kept
		}
	}

	ids = ids[:0]
	c = b.dead.Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		ids = append(ids, binary.BigEndian.Uint64(k))
	}
	budget := db.opts.PruneBatch * 10
	for _, id := range ids {
		if budget <= 0 {
			break
		}
		n, done, err := b.clear(id, budget)
		if err != nil {
			return err
		}
		budget -= n
		r.maint.cleared += n
		if done {
			if err := b.dead.Delete(key8(id)); err != nil {
				return err
			}
		}
	}
	return nil
}

// renewalStep: the maintenance pass persists a sliding TTL's renewal
// once it moves the expiry by TTL/renewalStep or more. A crash loses at
// most that much renewal, plus one MaintenanceInterval.
const renewalStep = 10

// prune removes ws's oldest appends beyond its retention, at most
// PruneBatch records.
func (b *batch1) prune(ws *wstream) (int, error) {
	ret := b.db.opts.Retention
	if ws.m.Retention != nil {
		ret = *ws.m.Retention
	}
	if ret == (Retention{}) || ws.m.Count == 0 {
		return 0, nil
	}
	bk, err := b.recBucket(ws)
	if err != nil {
		return 0, err
	}
	m := &ws.m
	ageLimit := b.nowNs - int64(ret.MaxAge)
	var keys [][]byte
	count, bytes := m.Count, m.Bytes
	dropping := false
	c := bk.Cursor()
	for k, v := c.First(); k != nil && len(keys) < b.db.opts.PruneBatch; k, v = c.Next() {
		data, start, at := recordData(v)
		if start || !dropping {
			dropping = (ret.MaxRecords > 0 && count > ret.MaxRecords) ||
				(ret.MaxBytes > 0 && bytes > ret.MaxBytes) ||
				(ret.MaxAge > 0 && start && at < ageLimit) ||
				(!start && len(keys) == 0) // a partly pruned append: finish it
			if !dropping {
				break
			}
		}
		keys = append(keys, append([]byte(nil), k...))
		count--
		bytes -= int64(len(data))
	}
	for _, k := range keys {
		if err := bk.Delete(k); err != nil {
			return 0, err
		}
	}
	if len(keys) > 0 {
		m.Count, m.Bytes = count, bytes
		m.Pruned = binary.BigEndian.Uint64(keys[len(keys)-1])
		ws.dirty = true
	}
	return len(keys), nil
}

// expireProducers deletes ws's producers idle for ProducerTTL or longer,
// at most PruneBatch, and keeps the bucket's count of them (producers.go)
// right: exact when the walk saw every key. It returns how many it
// deleted, and how many states it kept because they do not decode.
//
// A state that does not decode is never deleted: its producer's appends
// are refused (ErrCorrupt) until the stream is deleted. Forgetting it
// would make the producer unknown, and its retry at seq 0 of an append
// the stream holds would be appended again, silently. Its last use
// cannot be trusted either, even when it reads as idle.
func (b *batch1) expireProducers(ws *wstream) (deleted, kept int, err error) {
	pb := b.prods.Bucket(key8(ws.m.ID))
	if pb == nil {
		return 0, 0, nil
	}
	limit := b.nowNs - int64(b.db.opts.ProducerTTL)
	var keys [][]byte
	var seen uint64
	c := pb.Cursor()
	k, v := c.First()
	for ; k != nil && len(keys) < b.db.opts.PruneBatch; k, v = c.Next() {
		seen++
		if pe, ok := ws.prods[string(k)]; ok && pe.dirty {
			continue
		}
		// Only the last use matters here: prodUsed reads it without
		// decoding the state's history; only a state that goes is
		// decoded whole, to keep one that does not decode.
		if prodUsed(v) > limit { // used within ProducerTTL, as the append path keeps
			continue
		}
		if !prodDecodes(v) {
			kept++
			continue
		}
		keys = append(keys, append([]byte(nil), k...))
	}
	n, was := pb.Sequence(), pb.Sequence()
	switch {
	case k == nil: // every key seen
		n = seen - uint64(len(keys))
	case n != 0:
		n -= min(n, uint64(len(keys)))
	}
	for _, k := range keys {
		if err := pb.Delete(k); err != nil {
			return 0, 0, err
		}
		delete(ws.prods, string(k))
	}
	if n != was {
		if err := pb.SetSequence(n); err != nil {
			return 0, 0, err
		}
	}
	return len(keys), kept, nil
}

// clear deletes up to budget records of removed stream id, and its
// buckets once empty.
func (b *batch1) clear(id uint64, budget int) (n int, done bool, err error) {
	k8 := key8(id)
	if bk := b.recs.Bucket(k8); bk != nil {
		var keys [][]byte
		c := bk.Cursor()
		for k, _ := c.First(); k != nil && len(keys) < budget; k, _ = c.Next() {
			keys = append(keys, append([]byte(nil), k...))
		}
		for _, k := range keys {
			if err := bk.Delete(k); err != nil {
				return 0, false, err
			}
		}
		if len(keys) == budget {
			return len(keys), false, nil
		}
		n = len(keys)
		if err := b.recs.DeleteBucket(k8); err != nil {
			return 0, false, err
		}
	}
	if b.prods.Bucket(k8) != nil {
		if err := b.prods.DeleteBucket(k8); err != nil {
			return 0, false, err
		}
	}
	return n, true, nil
}

// compactIfSparse compacts the file at path by copying it forward into a
// new file, when it is at least compactMinBytes and its free pages are
// more than half of it. It runs only in Open, before the DB is in use, so
// it needs no coordination with readers or the writer; it holds the
// file's lock from before it reads it until after the rename, so another
// process cannot use the file it replaces (see openBolt).
func compactIfSparse(path string, o *Options) error {
	fi, err := os.Stat(path)
	if err != nil || fi.Size() < o.compactMinBytes {
		return nil
	}
	src, err := openBolt(path, boltOptions(o), o)
	if err != nil {
		return err
	}
	if fi, err = os.Stat(path); err != nil {
		src.Close()
		return err
	}
	free := int64(src.Stats().FreePageN) * int64(src.Info().PageSize)
	if free*2 <= fi.Size() {
		return src.Close()
	}
	tmp := path + ".compact"
	os.Remove(tmp)
	dstOpts := boltOptions(o)
	dstOpts.NoSync = true // synced once below
	dst, err := bolt.Open(tmp, 0o600, dstOpts)
	if err != nil {
		src.Close()
		return err
	}
	err = bolt.Compact(dst, src, 64<<20)
	if err == nil {
		err = dst.Sync()
	}
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// Renamed while src's lock is held: a process that opened path
		// before, and waits for that lock, finds path renamed once it has
		// it, and opens the compacted file instead (openBolt).
		err = os.Rename(tmp, path)
	}
	src.Close()
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("compact: %w", err)
	}
	o.Logger.Info("storage: compacted", "path", path, "before", fi.Size(), "free", free)
	// Until the directory is synced the rename may not survive a power
	// loss; Open syncs it again, and fails, before it acknowledges
	// anything in the compacted file.
	if err := o.syncDir(dirOf(path)); err != nil {
		return fmt.Errorf("compacted, but sync directory: %w", err)
	}
	return nil
}

func dirOf(path string) string {
	for i := len(path) - 1; i >= 0; i-- {
		if path[i] == '/' {
			if i == 0 {
				return "/"
			}
			return path[:i]
		}
	}
	return "."
}
