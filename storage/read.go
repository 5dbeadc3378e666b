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

// chain returns the segments of m's offset space in ascending order: the
// fork sources' records up to each fork offset, then m's own.
func chain(m *meta, load func(uint64) (*meta, error)) ([]segment, error) {
	segs := []segment{{m.ID, m.Base, m.Tail, m.Pruned}}
	hi, cur := m.Base, m
	for cur.SrcID != 0 {
		src, err := load(cur.SrcID)
		if err != nil {
			return nil, err
		}
		if src == nil {
			return nil, fmt.Errorf("%w: fork source %d of %q is missing", errInternal, cur.SrcID, m.Name)
		}
		segs = append(segs, segment{src.ID, src.Base, hi, src.Pruned})
		hi, cur = src.Base, src
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
			return fmt.Errorf("%w: offset %s was pruned by retention", ErrGone, FormatOffset(after))
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

// viewMeta loads the meta of name in tx (nil when there is none).
func viewMeta(tx *bolt.Tx, name string) (*meta, error) {
	v := tx.Bucket(bucketNames).Get([]byte(name))
	if v == nil {
		return nil, nil
	}
	return viewMetaByID(tx, binary.BigEndian.Uint64(v))
}

func viewMetaByID(tx *bolt.Tx, id uint64) (*meta, error) {
	v := tx.Bucket(bucketMeta).Get(key8(id))
	if v == nil {
		return nil, nil
	}
	m := new(meta)
	if err := decodeMeta(v, m); err != nil {
		return nil, err
	}
	return m, nil
}

// liveMeta loads name and checks it is live at now.
func (db *DB) liveMeta(tx *bolt.Tx, name string, now time.Time) (*meta, error) {
	m, err := viewMeta(tx, name)
	if err != nil {
		return nil, err
	}
	if m == nil {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	if err := stateErr(db.state(m, now), name); err != nil {
		return nil, err
	}
	return m, nil
}

// Head describes stream name. It never renews a TTL. A missing or expired
// stream is [ErrNotFound], a soft-deleted one [ErrGone].
func (db *DB) Head(ctx context.Context, name string) (Info, error) {
	if err := db.begin(ctx, name); err != nil {
		return Info{}, err
	}
	var in Info
	err := db.bolt.View(func(tx *bolt.Tx) error {
		m, err := db.liveMeta(tx, name, db.now())
		if err != nil {
			return err
		}
		in = m.info()
		return nil
	})
	return in, err
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
// (maxBytes <= 0 means 1 MiB). It renews a sliding TTL, also when nothing
// is returned; the renewal is kept in memory and persisted with the next
// write or maintenance pass, so a crash may lose up to one maintenance
// interval of renewal.
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
	err = db.bolt.View(func(tx *bolt.Tx) error {
		now := db.now()
		m, err := db.liveMeta(tx, name, now)
		if err != nil {
			return err
		}
		if pos > m.Tail {
			return fmt.Errorf("%w: offset %s is beyond the tail %s", ErrBadRequest, after, FormatOffset(m.Tail))
		}
		if m.TTL > 0 {
			db.touchAccess(m.ID, now.UnixNano())
		}
		segs, err := chain(m, func(id uint64) (*meta, error) { return viewMetaByID(tx, id) })
		if err != nil {
			return err
		}
		type ref struct {
			pos   uint64
			data  []byte
			start bool
		}
		var refs []ref
		total := 0
		err = scan(tx, segs, pos, func(p uint64, v []byte) bool {
			data, start, _ := recordData(v)
			if len(refs) > 0 && total+len(data) > maxBytes {
				return false
			}
			refs = append(refs, ref{p, data, start})
			total += len(data)
			return true
		})
		if err != nil {
			return err
		}
		next := pos
		if len(refs) > 0 {
			buf := make([]byte, 0, total)
			res.Records = make([]Record, len(refs))
			for i, r := range refs {
				l := len(buf)
				buf = append(buf, r.data...)
				res.Records[i] = Record{Offset: FormatOffset(r.pos), Data: buf[l:len(buf):len(buf)], Start: r.start}
			}
			next = refs[len(refs)-1].pos
		}
		res.Next = FormatOffset(next)
		res.Tail = FormatOffset(m.Tail)
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

// Wait blocks until stream name has a record after offset after, or is
// closed, and then returns nil. It returns [ErrNotFound] or [ErrGone] if
// the stream is (or becomes) missing, expired or deleted, an error
// wrapping [ErrBadRequest] for an offset beyond the tail, ctx.Err() when
// ctx ends, and [ErrClosedDB] when the DB closes. A fork wakes only for
// its own appends. Wait does not renew a TTL.
func (db *DB) Wait(ctx context.Context, name, after string) error {
	if err := db.begin(ctx, name); err != nil {
		return err
	}
	pos, err := ParseOffset(after)
	if err != nil {
		return err
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	var id uint64 // the stream watched; 0 until known
	for {
		var (
			ready  bool
			ch     <-chan struct{}
			expiry time.Time
			again  bool
		)
		if id != 0 {
			// Registered before the snapshot below: a commit it misses
			// closes ch, so no wakeup is lost.
			ch = db.watch(id)
		}
		err := db.bolt.View(func(tx *bolt.Tx) error {
			now := db.now()
			m, err := db.liveMeta(tx, name, now)
			if err != nil {
				return err
			}
			if pos > m.Tail {
				return fmt.Errorf("%w: offset %s is beyond the tail %s", ErrBadRequest, after, FormatOffset(m.Tail))
			}
			if m.Closed || m.Tail > pos {
				ready = true
				return nil
			}
			if m.ID != id {
				id, again = m.ID, true
				return nil
			}
			expiry = db.expiry(m)
			return nil
		})
		if err != nil || ready {
			return err
		}
		if again {
			continue
		}
		var tc <-chan time.Time
		if !expiry.IsZero() {
			d := expiry.Sub(db.now())
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
		}
		if err := db.check(); err != nil {
			return err
		}
	}
}

// expiry returns when m expires if nothing renews it (zero: never).
func (db *DB) expiry(m *meta) time.Time {
	var t time.Time
	if m.TTL > 0 {
		t = time.Unix(0, db.lastAccess(m)).Add(m.TTL)
	}
	if !m.ExpiresAt.IsZero() && (t.IsZero() || m.ExpiresAt.Before(t)) {
		t = m.ExpiresAt
	}
	return t
}
