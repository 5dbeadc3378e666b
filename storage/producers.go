package storage

import (
	"encoding/binary"
	"slices"

	bolt "go.etcd.io/bbolt"
)

// Producer states per stream are bounded by
// [Options].MaxProducersPerStream: without a bound, a client allowed to
// append could name a new producer in every request and grow the file,
// and the maintenance pass that scans the states, for ProducerTTL.
//
// Each stream's producer bucket (prods/<id>) keeps the number of keys it
// holds in its own bbolt sequence, written in the transaction that adds
// or deletes them, so the bound costs nothing per append until a commit
// takes a stream past it. That commit forgets the stream's least recently
// used states down to nine tenths of the bound (two passes over the
// bucket, reading only each state's last use), so such commits are a
// tenth of the bound's new producers apart.
//
// A sequence of 0 means "not counted": files written before the count
// was kept have 0 there whatever their buckets hold. Such a bucket is
// counted by the first commit that adds a producer to it (and by the
// maintenance pass, which walks every bucket anyway); a bucket whose
// count is truly 0 is empty, so counting it costs nothing.

// eviction is one stream's producer states forgotten for the bound in a
// commit, logged after it.
type eviction struct {
	name string
	n    int
}

// countProducers updates the count of ws's producer bucket pb after its
// flush stored added new keys, and forgets the least recently used
// states when the count is over the bound.
func (b *batch1) countProducers(ws *wstream, pb *bolt.Bucket, added uint64) error {
	n := pb.Sequence()
	if n == 0 {
		n = countKeys(pb) // not counted yet: the new keys are in it
	} else {
		n += added
	}
	if limit := b.db.opts.MaxProducersPerStream; limit > 0 && n > uint64(limit) {
		var err error
		if n, err = b.evictProducers(ws, pb, n, uint64(limit)); err != nil {
			return err
		}
	}
	return pb.SetSequence(n)
}

// countKeys counts the keys of pb.
func countKeys(pb *bolt.Bucket) uint64 {
	var n uint64
	c := pb.Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		n++
	}
	return n
}

// evictProducers deletes the least recently used producer states of ws
// from pb, counted as count, until it holds limit - limit/10, and returns
// how many it holds then. It walks pb twice: the first walk also
// recounts it, so a count that drifted is corrected (and nothing is
// deleted if the true count is within limit). States the current
// transaction changed are never deleted: they are the newest, and their
// appends were admitted in it. Nor is a state that does not decode, as
// the maintenance pass keeps it (expireProducers): the states that go
// are decoded whole first, and when one does not, the walks run again
// without it (a damaged file only), so the stream may keep more than
// limit - limit/10 when many do not decode.
//
// The first walk keeps only uses, which sort fast; the second copies the
// few keys that go, in key order, which is also the cheapest order to
// delete them in. One walk that keeps every key and sorts (use, key)
// pairs was slower, and one that keeps the oldest in a bounded heap no
// faster within the noise, for more code (BenchmarkDB_ProducerEviction,
// docs/benchmarks.md).
func (b *batch1) evictProducers(ws *wstream, pb *bolt.Bucket, count, limit uint64) (uint64, error) {
	var damaged map[string]bool // found not to decode: kept
	keep := func(k []byte) bool {
		pe, ok := ws.prods[string(k)]
		return (ok && pe.dirty) || damaged[string(k)]
	}
	var n uint64
	var keys [][]byte
	c := pb.Cursor()
	for {
		n = 0
		used := make([]int64, 0, min(count, 1<<20))
		for k, v := c.First(); k != nil; k, v = c.Next() {
			n++
			if u := prodUsed(v); !keep(k) && u != minUsed { // minUsed: does not decode
				used = append(used, u)
			}
		}
		if n <= limit {
			return n, nil
		}
		evict := min(n-(limit-limit/10), uint64(len(used)))
		if evict == 0 {
			return n, nil
		}
		// Every state used before the evict-th oldest use goes, and as
		// many used at that instant as make up the number, in key order.
		slices.Sort(used)
		cut := used[evict-1]
		atCut := evict
		for _, u := range used[:evict] {
			if u < cut {
				atCut--
			}
		}
		found := len(damaged)
		keys = make([][]byte, 0, evict)
		for k, v := c.First(); k != nil && uint64(len(keys)) < evict; k, v = c.Next() {
			if keep(k) {
				continue
			}
			u := prodUsed(v)
			if u > cut || u == minUsed {
				continue
			}
			if !prodDecodes(v) {
				if damaged == nil {
					damaged = make(map[string]bool)
				}
				damaged[string(k)] = true
				continue
			}
			if u == cut {
				if atCut == 0 {
					continue
				}
				atCut--
			}
			keys = append(keys, append([]byte(nil), k...))
		}
		if len(damaged) == found {
			break
		}
		// The cut counted states that do not decode: again without them.
	}
	for _, k := range keys {
		if err := pb.Delete(k); err != nil {
			return 0, err
		}
		delete(ws.prods, string(k))
	}
	b.evicted = append(b.evicted, eviction{name: ws.m.Name, n: len(keys)})
	return n - uint64(len(keys)), nil
}

// prodUsed returns the last use (Unix ns) of an encoded producer state,
// without decoding its ring; the oldest possible for one that does not
// decode.
func prodUsed(v []byte) int64 {
	for range 2 { // epoch, lastSeq
		_, n := binary.Uvarint(v)
		if n <= 0 {
			return minUsed
		}
		v = v[n:]
	}
	u, n := binary.Varint(v)
	if n <= 0 {
		return minUsed
	}
	return u
}

// minUsed sorts a state that does not decode before every other.
const minUsed = -1 << 63
