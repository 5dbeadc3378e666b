package storage

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// segment is a range (lo, hi] of positions read from stream id's own
// records; positions <= pruned are gone.
type segment struct {
	id, lo, hi, pruned uint64
}

// chain appends to dst the segments of m's offset space in ascending
// order: the fork sources' records up to each fork offset, then m's own.
// A fork offset may lie below its source's own fork offset: that source
// then lends no records, and the sources above it only those up to the
// lowest fork offset on the way, hi.
func chain(dst []segment, m *meta, load func(uint64) (*meta, error)) ([]segment, error) {
	segs := append(dst, segment{m.ID, m.Base, m.Tail, m.Pruned})
	hi, cur := m.Base, m
	for cur.SrcID != 0 {
		src, err := load(cur.SrcID)
		if err != nil {
			return nil, err
		}
		if src == nil {
			return nil, fmt.Errorf("%w: fork source %d of %q is missing", errInternal, cur.SrcID, m.Name)
		}
		if hi > src.Base {
			segs = append(segs, segment{src.ID, src.Base, hi, src.Pruned})
		}
		hi, cur = min(hi, src.Base), src
	}
	for i, j := 0, len(segs)-1; i < j; i, j = i+1, j-1 {
		segs[i], segs[j] = segs[j], segs[i]
	}
	return segs, nil
}

// scan calls fn with each record after position after, in order, until fn
// returns false. The value is valid only during tx.
func scan(tx *bolt.Tx, segs []segment, after uint64, fn func(pos uint64, v []byte) bool) error {
	recs := tx.Bucket(bucketRecs)
	for _, s := range segs {
		if s.hi <= after {
			continue
		}
		start := max(after, s.lo)
		if start < s.pruned {
			return &PrunedError{Offset: FormatOffset(after), Pruned: FormatOffset(prunedOf(segs))}
		}
		bk := recs.Bucket(key8(s.id))
		if bk == nil {
			continue
		}
		c := bk.Cursor()
		for k, v := c.Seek(key8(start + 1)); k != nil; k, v = c.Next() {
			pos := binary.BigEndian.Uint64(k)
			if pos > s.hi {
				break
			}
			if !fn(pos, v) {
				return nil
			}
		}
	}
	return nil
}

// live checks that m, the meta of name (nil when there is none), is live
// at now.
func (db *DB) live(m *meta, name string, now time.Time) error {
	if m == nil {
		return fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	return stateErr(db.state(m, now), name)
}

// Head describes stream name. It never renews a TTL. A missing or expired
// stream is [ErrNotFound], a soft-deleted one [ErrGone].
func (db *DB) Head(ctx context.Context, name string) (Info, error) {
	if err := db.begin(ctx, name); err != nil {
		return Info{}, err
	}
	m, err := db.metaOf(ctx, name)
	if err != nil {
		return Info{}, err
	}
	now := db.now()
	if err := db.live(m, name, now); err != nil {
		return Info{}, err
	}
	if m.SrcID == 0 {
		in := m.info()
		in.TTLLeft = db.ttlLeft(m, now)
		return in, nil
	}
	// A fork's readable start depends on its sources' retention too: the
	// fork and its sources are read in one transaction (the cache may lag
	// a commit that removed both).
	var in Info
	err = db.view(ctx, func(tx *bolt.Tx) error {
		m, err := db.txMeta(tx, name)
		if err != nil {
			return err
		}
		if err := db.live(m, name, now); err != nil {
			return err
		}
		var segBuf [MaxForkDepth + 1]segment // the longest chain: no allocation
		segs, err := chain(segBuf[:0], m, func(id uint64) (*meta, error) { return db.txMetaByID(tx, id) })
		if err != nil {
			return err
		}
		in = m.info()
		in.Pruned = FormatOffset(prunedOf(segs))
		in.TTLLeft = db.ttlLeft(m, now)
		return nil
	})
	if err != nil {
		return Info{}, err
	}
	return in, nil
}

// ttlLeft is how much of m's sliding TTL is left at now (0 without one).
func (db *DB) ttlLeft(m *meta, now time.Time) time.Duration {
	if m.TTL <= 0 {
		return 0
	}
	return max(0, m.TTL-time.Duration(now.UnixNano()-db.lastAccess(m, now.UnixNano())))
}

// prunedOf is the last position retention removed across segs, as
// [Info].Pruned: a read after it finds no pruned segment (see scan).
func prunedOf(segs []segment) uint64 {
	var p uint64
	for _, s := range segs {
		if s.pruned > s.lo {
			p = max(p, min(s.pruned, s.hi))
		}
	}
	return p
}

// begin runs the checks every call starts with.
func (db *DB) begin(ctx context.Context, name string) error {
	if err := db.check(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return checkName(name)
}

// Read returns the records of stream name after offset after
// ([ZeroOffset] reads from the start): at least one record when there is
// any, then whole records while their total stays within maxBytes
// (maxBytes <= 0 means 1 MiB), each counted as its length plus
// ReadRecordCost. It renews a sliding TTL, also when nothing
// is returned; the renewal is kept in memory and persisted with the next
// write of the stream, or by the first maintenance pass at which it moves
// the expiry by a tenth of the TTL or more, so a crash may lose up to a
// tenth of the TTL plus one maintenance interval of renewal.
//
// Errors: an offset beyond the tail or malformed wraps [ErrBadRequest],
// one pruned by retention [ErrGone], a missing or expired stream
// [ErrNotFound], a soft-deleted one [ErrGone]. A fork's records up to its
// fork offset come from its source chain; reading a fork never renews its
// sources.
func (db *DB) Read(ctx context.Context, name, after string, maxBytes int) (ReadResult, error) {
	if err := db.begin(ctx, name); err != nil {
		return ReadResult{}, err
	}
	pos, err := ParseOffset(after)
	if err != nil {
		return ReadResult{}, err
	}
	if maxBytes <= 0 {
		maxBytes = defaultReadBytes
	}
	var res ReadResult
	err = db.view(ctx, func(tx *bolt.Tx) error {
		now := db.now()
		m, err := db.txMeta(tx, name)
		if err != nil {
			return err
		}
		if err := db.live(m, name, now); err != nil {
			return err
		}
		res.ID = m.ID
		if pos > m.Tail {
			return fmt.Errorf("%w: offset %s is beyond the tail %s", ErrBadRequest, after, FormatOffset(m.Tail))
		}
		if m.TTL > 0 {
			db.touchAccess(m.ID, now.UnixNano())
		}
		var segBuf [MaxForkDepth + 1]segment // the longest chain: no allocation
		segs, err := chain(segBuf[:0], m, func(id uint64) (*meta, error) { return db.txMetaByID(tx, id) })
		if err != nil {
			return err
		}
		// Gather the records (data still in tx) on the stack while few.
		var (
			recBuf [16]Record
			posBuf [16]uint64
		)
		recs, poss := recBuf[:0], posBuf[:0]
		total, budget := 0, 0
		err = scan(tx, segs, pos, func(p uint64, v []byte) bool {
			data, start, _ := recordData(v)
			cost := len(data) + ReadRecordCost
			if len(recs) > 0 && budget+cost > maxBytes {
				return false
			}
			recs = append(recs, Record{Data: data, Start: start})
			poss = append(poss, p)
			total += len(data)
			budget += cost
			return true
		})
		if pe, ok := err.(*PrunedError); ok {
			pe.ID = m.ID
		}
		if err != nil {
			return err
		}
		// A well-formed offset not beyond the tail is canonical: it is
		// Next as given when nothing is returned.
		res.Next = after
		next := pos
		if n := len(recs); n > 0 {
			if n <= len(recBuf) {
				res.Records = make([]Record, n) // recs is on the stack
			} else {
				res.Records = recs // already on the heap
			}
			copyRecords(res.Records, recs, poss, total)
			res.Next = res.Records[n-1].Offset
			next = poss[n-1]
		}
		res.Tail = res.Next
		if next != m.Tail {
			res.Tail = FormatOffset(m.Tail)
		}
		res.UpToDate = next == m.Tail
		res.Closed = m.Closed && next == m.Tail
		res.ContentType = m.ContentType
		return nil
	})
	if err != nil {
		return ReadResult{}, err
	}
	return res, nil
}

// copyRecords sets out (which may be recs) to recs, whose data is valid
// only in the read transaction, with their data copied into one buffer of
// total bytes and their offsets (positions poss) formatted into one
// string.
func copyRecords(out, recs []Record, poss []uint64, total int) {
	buf := make([]byte, 0, total)
	var offBuf [8 * offsetLen]byte
	offs := offBuf[:0]
	if len(recs) > len(offBuf)/offsetLen {
		offs = make([]byte, 0, len(recs)*offsetLen)
	}
	for i, r := range recs {
		l := len(buf)
		buf = append(buf, r.Data...)
		out[i] = Record{Data: buf[l:len(buf):len(buf)], Start: r.Start}
		offs = appendOffset(offs, poss[i])
	}
	s := string(offs)
	for i := range out {
		out[i].Offset = s[i*offsetLen : (i+1)*offsetLen]
	}
}

// Wait blocks until stream name has a record after offset after, or is
// closed, and then returns nil. It returns [ErrNotFound] or [ErrGone] if
// the stream is (or becomes) missing, expired or deleted (also when a
// stream of the same name was made meanwhile), an error
// wrapping [ErrBadRequest] for an offset beyond the tail, ctx.Err() when
// ctx ends, [ErrClosedDB] when the DB closes and [ErrFailed] when it
// fails (a commit or fsync failed). A fork wakes only for
// its own appends.
//
// A stream with a sliding TTL does not expire while a Wait is blocked on
// it, however long that is: a live reader keeps the stream it watches.
// Its TTL runs again from when the Wait returns, as from a read, and
// renewals are persisted as a read's are (see [DB.Read]). A fork's
// sources are not kept, and neither is an Expires-At, which ends the
// Wait with [ErrNotFound] when it comes.
func (db *DB) Wait(ctx context.Context, name, after string) error {
	return db.WaitID(ctx, name, after, 0)
}

// WaitID is Wait on the stream whose [Info].ID is id: if the stream of
// that name is another (the one with id was deleted, and perhaps made
// anew) it returns [ErrNotFound] at once or when that happens. An id of 0
// waits on whichever stream of the name Wait finds first.
func (db *DB) WaitID(ctx context.Context, name, after string, id uint64) error {
	if err := db.begin(ctx, name); err != nil {
		return err
	}
	pos, err := ParseOffset(after)
	if err != nil {
		return err
	}
	var timer *time.Timer
	held := false // the TTL of stream id is held (holdTTL)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
		if held {
			db.releaseTTL(id, db.now().UnixNano())
		}
	}()
	for { // id: the stream watched; 0 until known
		var ch <-chan struct{}
		if id != 0 {
			// Registered before the meta is read below: a commit it
			// misses closes ch, so no wakeup is lost. (The cache is
			// published before a commit wakes anyone.)
			ch = db.watch(id)
		}
		m, err := db.metaOf(ctx, name)
		if err != nil {
			return err
		}
		if m != nil && pos > m.Tail {
			// Reads see only published commits (view), so after is
			// beyond the tail, or the cache's entry for name was
			// evicted and refilled: the file decides.
			if m, err = db.fileMeta(ctx, name); err != nil {
				return err
			}
		}
		if id != 0 && (m == nil || m.ID != id) {
			// Deleted (and perhaps made anew) meanwhile: the stream waited
			// on is gone, and after is not a position in another one
			// (checked before the tail, which may now be behind after).
			// IDs never come back, so the watch on id is dropped.
			db.wake([]uint64{id})
			return fmt.Errorf("%w: stream %q was deleted", ErrNotFound, name)
		}
		if err := db.live(m, name, db.now()); err != nil {
			if id != 0 {
				db.wake([]uint64{id}) // expired or soft-deleted: for good
			}
			return err
		}
		if pos > m.Tail {
			return fmt.Errorf("%w: offset %s is beyond the tail %s", ErrBadRequest, after, FormatOffset(m.Tail))
		}
		if m.Closed || m.Tail > pos {
			return nil
		}
		if id == 0 {
			id = m.ID
			continue
		}
		if m.TTL > 0 && !held {
			// Live just above: from here on its TTL cannot run out
			// while this Wait waits.
			db.holdTTL(id)
			held = true
		}
		var tc <-chan time.Time
		if !m.ExpiresAt.IsZero() {
			// Only an absolute expiry can come while it waits.
			d := m.ExpiresAt.Sub(db.now())
			if timer == nil {
				timer = time.NewTimer(d)
			} else {
				timer.Reset(d)
			}
			tc = timer.C
		}
		select {
		case <-ch:
		case <-tc:
		case <-ctx.Done():
			return ctx.Err()
		case <-db.quit:
			return ErrClosedDB
		case <-db.failCh:
			return ErrFailed
		}
		if err := db.check(); err != nil {
			return err
		}
	}
}
