package storage

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// opKind says what a request asks of the writer.
type opKind uint8

const (
	opAppend opKind = iota
	opCreate
	opDelete
	opMaintain
)

// request is one call queued for the writer. The writer fills the answer
// fields, then closes done.
type request struct {
	op     opKind
	name   string
	create *CreateOptions
	app    *AppendRequest
	size   int64                     // record bytes, for batching and the size check
	done   chan struct{}             // closed when answered, or
	cb     func(AppendResult, error) // called when answered (AppendAsync)

	// Answer.
	err     error
	res     appendRes
	created *createOut  // opCreate
	maint   *maintStats // opMaintain
}

// createOut is a Create's answer.
type createOut struct {
	info    Info
	created bool
}

// appendRes is an append's outcome in positions; the caller formats the
// offset strings, off the writer goroutine.
type appendRes struct {
	dup, closed bool
	first, last uint64 // positions of the first and last appended records; last is the tail otherwise
	n           int
	epoch, seq  int64
}

// writer is the single goroutine that applies every mutation. It takes
// what is queued (up to MaxBatchBytes), applies it in one bbolt
// transaction, commits (one fsync), and only then answers the callers.
func (db *DB) writer() {
	defer close(db.wdone)
	batch := make([]*request, 0, 256)
	var timer *time.Timer
	for {
		var first *request
		select {
		case first = <-db.reqs:
		case <-db.quit:
			// Commit what was queued before Close, then exit.
			for {
				batch = batch[:0]
				var size int64
			drain:
				for size < int64(db.opts.MaxBatchBytes) {
					select {
					case r := <-db.reqs:
						batch = append(batch, r)
						size += r.size
					default:
						break drain
					}
				}
				if len(batch) == 0 {
					return
				}
				db.commit(batch)
			}
		}
		batch = append(batch[:0], first)
		size := first.size
		var deadline <-chan time.Time
		if db.opts.MaxBatchWait > 0 {
			if timer == nil {
				timer = time.NewTimer(db.opts.MaxBatchWait)
			} else {
				timer.Reset(db.opts.MaxBatchWait)
			}
			deadline = timer.C
		}
	gather:
		for size < int64(db.opts.MaxBatchBytes) {
			select {
			case r := <-db.reqs:
				batch = append(batch, r)
				size += r.size
				continue
			default:
			}
			if deadline == nil {
				break
			}
			select {
			case r := <-db.reqs:
				batch = append(batch, r)
				size += r.size
			case <-deadline:
				deadline = nil
				break gather
			}
		}
		if timer != nil && deadline != nil {
			timer.Stop()
		}
		db.commit(batch)
		clear(batch)
	}
}

// commit applies batch in one transaction and answers every request.
func (db *DB) commit(batch []*request) {
	if db.failed.Load() {
		for _, r := range batch {
			r.err = ErrFailed
			r.answer()
		}
		return
	}
	b := batch1{db: db, now: db.now()}
	b.nowNs = b.now.UnixNano()
	err := db.bolt.Update(func(tx *bolt.Tx) error {
		defer b.endTx()
		b.init(tx)
		for _, r := range batch {
			if err := b.apply(r); err != nil {
				return err
			}
		}
		if err := b.flush(); err != nil {
			return err
		}
		if hook := db.opts.commitHook; hook != nil {
			return hook()
		}
		return nil
	})
	if err != nil {
		db.fail(err)
		for _, r := range batch {
			r.err = fmt.Errorf("%w: %v", ErrFailed, err)
			r.answer()
		}
		return
	}
	if hook := db.opts.publishHook; hook != nil {
		hook()
	}
	// Publish before anything can observe the commit: the access entries
	// dropped below are in the published metas, and woken waiters and
	// answered callers must see the commit in the cache.
	db.cache.publish(b.txid, b.ups)
	if len(b.persisted) > 0 {
		db.mu.Lock()
		for id, v := range b.persisted {
			if db.access[id] <= v {
				delete(db.access, id)
			}
		}
		db.mu.Unlock()
	}
	// At most one line per stream per tenth of the bound's new producers.
	for _, e := range b.evicted {
		db.log.Warn("storage: stream over its producer bound; least recently used producer states forgotten",
			"stream", e.name, "forgotten", e.n, "max_producers_per_stream", db.opts.MaxProducersPerStream)
	}
	db.wake(b.notify)
	for _, r := range batch {
		r.answer()
	}
}

// answer hands r's outcome to its caller.
func (r *request) answer() {
	if r.cb != nil {
		r.cb(r.appendResult())
		return
	}
	close(r.done)
}

// batch1 is the state of one write transaction: buckets, the streams
// loaded so far (requests in a batch see each other's effects through
// it), and what to wake after commit.
type batch1 struct {
	db    *DB
	tx    *bolt.Tx
	txid  uint64 // tx.ID(): the read transactions after the commit have it
	now   time.Time
	nowNs int64

	names, metas, recs, prods, dead *bolt.Bucket

	streams   map[uint64]*wstream // the writer's cache, db.wcache
	touched   []*wstream          // loaded or used in this transaction
	notify    []uint64
	persisted map[uint64]int64 // read-access times written to meta
	ups       []cacheUpdate    // for the read cache after commit
	evicted   []eviction       // producer states forgotten for the bound (producers.go), logged after commit
	arena     []byte
	scratch   []byte
}

// wstream is a stream as the writer knows it. The writer caches them
// across transactions (db.wcache): it is the only writer, so the cache is
// the committed state after each successful commit, and a failed commit
// fails the DB for good, so a cache ahead of the file never matters.
type wstream struct {
	m       meta
	dirty   bool // meta changed in this transaction
	removed bool
	inTx    bool         // in batch1.touched
	rec     *bolt.Bucket // this transaction's record bucket, nil until used
	prods   map[string]*prodEntry
}

// prodEntry is a producer's state as the writer knows it.
type prodEntry struct {
	st     prodState
	exists bool // known: stored, perhaps expired (not after it was forgotten on use)
	stored bool // its key is in the stream's producer bucket, or will be at this transaction's flush
	dirty  bool // changed in this transaction
}

func (b *batch1) init(tx *bolt.Tx) {
	b.tx = tx
	b.txid = uint64(tx.ID())
	b.names = tx.Bucket(bucketNames)
	b.metas = tx.Bucket(bucketMeta)
	b.recs = tx.Bucket(bucketRecs)
	b.prods = tx.Bucket(bucketProds)
	b.dead = tx.Bucket(bucketDead)
	if len(b.db.wcache) > maxCachedStreams {
		clear(b.db.wcache)
	}
	b.streams = b.db.wcache
}

// maxCachedStreams bounds the writer's stream cache; it is dropped whole
// when larger.
const maxCachedStreams = 10000

// use marks ws as part of this transaction.
func (b *batch1) use(ws *wstream) *wstream {
	if !ws.inTx {
		ws.inTx = true
		ws.rec = nil
		b.touched = append(b.touched, ws)
	}
	return ws
}

// endTx resets the per-transaction state of the cached streams. A
// stream's producer cache over maxCachedProducers is dropped whole (the
// file has every state): each distinct Producer-Id would otherwise stay
// in memory until ProducerTTL, and every commit that touches the stream
// walks the map.
func (b *batch1) endTx() {
	for _, ws := range b.touched {
		ws.inTx, ws.dirty, ws.rec = false, false, nil
		if len(ws.prods) > maxCachedProducers {
			ws.prods = nil
			continue
		}
		for _, pe := range ws.prods {
			pe.dirty = false
		}
	}
	b.touched = b.touched[:0]
}

// maxCachedProducers bounds the producer states the writer keeps in
// memory per stream between commits.
const maxCachedProducers = 1024

// alloc returns n bytes that stay valid for the transaction (bbolt keeps
// references to put keys and values until commit).
func (b *batch1) alloc(n int) []byte {
	if cap(b.arena)-len(b.arena) < n {
		if n >= 16<<10 {
			return make([]byte, n)
		}
		b.arena = make([]byte, 0, min(max(2*cap(b.arena), 4<<10), 256<<10))
	}
	l := len(b.arena)
	b.arena = b.arena[:l+n]
	return b.arena[l : l+n : l+n]
}

func (b *batch1) byName(name string) (*wstream, error) {
	v := b.names.Get([]byte(name))
	if v == nil {
		return nil, nil
	}
	return b.byID(binary.BigEndian.Uint64(v))
}

func (b *batch1) byID(id uint64) (*wstream, error) {
	if ws, ok := b.streams[id]; ok {
		return b.use(ws), nil
	}
	v := b.metas.Get(key8(id))
	if v == nil {
		return nil, nil
	}
	ws := &wstream{}
	if err := decodeMeta(v, &ws.m); err != nil {
		return nil, err
	}
	b.streams[id] = ws
	return b.use(ws), nil
}

// metaByID adapts byID for chain reads.
func (b *batch1) metaByID(id uint64) (*meta, error) {
	ws, err := b.byID(id)
	if err != nil || ws == nil {
		return nil, err
	}
	return &ws.m, nil
}

func (b *batch1) recBucket(ws *wstream) (*bolt.Bucket, error) {
	if ws.rec == nil {
		bk, err := b.recs.CreateBucketIfNotExists(key8(ws.m.ID))
		if err != nil {
			return nil, err
		}
		bk.FillPercent = 1.0 // keys only grow: pack pages full
		ws.rec = bk
	}
	return ws.rec, nil
}

// producer loads the state of producer pid on ws.
func (b *batch1) producer(ws *wstream, pid string) (*prodEntry, error) {
	if pe, ok := ws.prods[pid]; ok {
		return pe, nil
	}
	if ws.prods == nil {
		ws.prods = make(map[string]*prodEntry)
	}
	pe := &prodEntry{}
	if bk := b.prods.Bucket(key8(ws.m.ID)); bk != nil {
		if v := bk.Get([]byte(pid)); v != nil {
			if err := decodeProd(v, &pe.st); err != nil {
				return nil, err
			}
			pe.exists, pe.stored = true, true
		}
	}
	ws.prods[pid] = pe
	return pe, nil
}

// flush writes the dirty metas and producer states.
func (b *batch1) flush() error {
	for _, ws := range b.touched {
		id := ws.m.ID
		if ws.removed {
			b.ups = append(b.ups, cacheUpdate{id: id, name: ws.m.Name, removed: true})
			continue
		}
		if ws.dirty {
			if a := b.db.lastAccess(&ws.m, b.nowNs); a > ws.m.Access {
				ws.m.Access = a
				if b.persisted == nil {
					b.persisted = make(map[uint64]int64)
				}
				b.persisted[id] = a
			}
			b.scratch = encodeMeta(b.scratch[:0], &ws.m)
			v := b.alloc(len(b.scratch))
			copy(v, b.scratch)
			if err := b.metas.Put(key8(id), v); err != nil {
				return err
			}
			mc := new(meta)
			*mc = ws.m
			b.ups = append(b.ups, cacheUpdate{m: mc})
		}
		var pb *bolt.Bucket
		var added uint64
		for pid, pe := range ws.prods {
			if !pe.dirty {
				continue
			}
			if pb == nil {
				var err error
				if pb, err = b.prods.CreateBucketIfNotExists(key8(id)); err != nil {
					return err
				}
			}
			b.scratch = pe.st.encode(b.scratch[:0])
			v := b.alloc(len(b.scratch))
			copy(v, b.scratch)
			if err := pb.Put([]byte(pid), v); err != nil {
				return err
			}
			if !pe.stored {
				pe.stored = true
				added++
			}
		}
		if added > 0 {
			if err := b.countProducers(ws, pb, added); err != nil {
				return err
			}
		}
	}
	return nil
}

// apply runs one request. Per-request failures are answered in r; a
// returned error is a storage failure that aborts the transaction.
func (b *batch1) apply(r *request) error {
	switch r.op {
	case opAppend:
		return b.applyAppend(r)
	case opCreate:
		return b.applyCreate(r)
	case opDelete:
		return b.applyDelete(r)
	case opMaintain:
		return b.maintain(r)
	}
	return nil
}

// live loads name and checks that it is live; a nil stream has r.err set.
func (b *batch1) live(r *request) (*wstream, error) {
	ws, err := b.byName(r.name)
	if err != nil {
		return nil, err
	}
	if ws == nil {
		r.err = fmt.Errorf("%w: %q", ErrNotFound, r.name)
		return nil, nil
	}
	if st := b.db.state(&ws.m, b.now); st != stLive {
		r.err = stateErr(st, r.name)
		return nil, nil
	}
	return ws, nil
}

// refuseUndecodable answers r with err, and returns nil, when err is a
// stream's meta or a producer's state that does not decode (a damaged
// file, a newer binary's format): the request is refused, not the
// transaction, which would fail every request of the batch and the DB,
// and again after each restart at the first request for that stream.
// Other errors are returned. The caller must not have changed anything
// for r that the refusal leaves wrong.
func refuseUndecodable(r *request, err error) error {
	if errors.Is(err, errCorruptMeta) || errors.Is(err, errCorruptProducer) {
		r.err = err
		return nil
	}
	return err
}

func (b *batch1) applyAppend(r *request) error {
	req := r.app
	ws, err := b.live(r)
	if err != nil {
		return refuseUndecodable(r, err)
	}
	if ws == nil && req.CreateMissing && errors.Is(r.err, ErrNotFound) {
		return b.appendCreating(r)
	}
	if ws == nil {
		return nil
	}
	var pe *prodEntry
	if p := req.Producer; p != nil {
		if pe, err = b.producer(ws, p.ID); err != nil {
			return refuseUndecodable(r, err)
		}
	}
	m := &ws.m
	if m.TTL > 0 {
		m.Access = b.nowNs // any append, even a refused one, renews a sliding TTL
		ws.dirty = true
	}
	if !b.admit(r, m, pe) {
		return nil
	}
	return b.write(r, ws, pe)
}

// appendCreating applies an append with CreateMissing at a name with no
// stream (never made, deleted or expired). It runs the append's checks
// against the empty stream Create would make, and makes it only if they
// admit the append: a refused append (a producer's gap, too many bytes)
// changes nothing, so it leaves no empty stream behind, and a later
// request in the batch finds none.
func (b *batch1) appendCreating(r *request) error {
	req := r.app
	o := &CreateOptions{ContentType: req.ContentType}
	// What admit reads of the stream applyCreate makes from o: it is
	// open, with no Stream-Seq and no producers.
	fresh := meta{Name: r.name, ContentType: cmp.Or(o.ContentType, defaultContentType)}
	var pe *prodEntry
	if req.Producer != nil {
		pe = &prodEntry{}
	}
	r.err = nil
	if !b.admit(r, &fresh, pe) {
		return nil
	}
	cr := &request{op: opCreate, name: r.name, create: o, created: &createOut{}}
	if err := b.applyCreate(cr); err != nil {
		return err
	}
	if r.err = cr.err; r.err != nil {
		return nil
	}
	ws, err := b.live(r)
	if ws == nil {
		return err
	}
	if p := req.Producer; p != nil {
		if pe, err = b.producer(ws, p.ID); err != nil {
			return err
		}
	}
	return b.write(r, ws, pe)
}

// admit runs the checks of [AppendRequest] that follow the stream's
// existence, in its order, against the stream's meta m and the state pe
// of the request's producer (nil without one). It changes nothing but pe,
// which it forgets when idle past ProducerTTL. It reports whether the
// append is to be written; if not, it has answered r: with an error, or
// as a duplicate or a close-only request on a closed stream.
func (b *batch1) admit(r *request, m *meta, pe *prodEntry) bool {
	req, p := r.app, r.app.Producer
	closeOnly := len(req.Records) == 0
	if m.Closed {
		if p != nil && m.CloseProd != nil && *m.CloseProd == (closeProd{p.ID, p.Epoch, p.Seq}) {
			r.res = appendRes{dup: true, closed: true, last: m.Tail, epoch: pe.st.epoch, seq: pe.st.lastSeq}
			return false
		}
		if !closeOnly {
			// A retry of an append admitted before the close (a producer
			// that pipelined it ahead of the closing one) is answered as
			// the first time: a duplicate, not a refusal of data the
			// stream holds.
			if p != nil && b.producerDup(r, m, pe) {
				return false
			}
			r.err = &ClosedError{Tail: FormatOffset(m.Tail)}
			return false
		}
		if p == nil {
			r.res = appendRes{closed: true, last: m.Tail}
			return false
		}
	}
	if p != nil {
		if pe.exists && b.nowNs-pe.st.used >= int64(b.db.opts.ProducerTTL) {
			pe.st, pe.exists = prodState{}, false // idle too long: forgotten
		}
		dup, perr := checkProducer(pe, p)
		if perr != nil {
			r.err = perr
			return false
		}
		if dup {
			pos, ok := pe.st.lookup(p.Seq)
			if !ok {
				pos = m.Tail
			}
			r.res = appendRes{dup: true, closed: m.Closed, last: pos, epoch: pe.st.epoch, seq: pe.st.lastSeq}
			return false
		}
	}
	if !closeOnly {
		if req.ContentType != "" && NormalizeContentType(req.ContentType) != NormalizeContentType(m.ContentType) {
			r.err = fmt.Errorf("%w: %q is not %q", ErrContentType, req.ContentType, m.ContentType)
			return false
		}
		if req.StreamSeq != "" && req.StreamSeq <= m.StreamSeq {
			r.err = fmt.Errorf("%w: %q after %q", ErrStreamSeq, req.StreamSeq, m.StreamSeq)
			return false
		}
		if r.size > b.db.opts.MaxAppendBytes {
			r.err = fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, r.size, b.db.opts.MaxAppendBytes)
			return false
		}
	}
	return true
}

// producerDup answers r as a duplicate, and reports true, when the state
// pe of its producer (loaded, and not idle past ProducerTTL) has admitted
// its seq in its epoch. It changes nothing.
func (b *batch1) producerDup(r *request, m *meta, pe *prodEntry) bool {
	p := r.app.Producer
	if !pe.exists || b.nowNs-pe.st.used >= int64(b.db.opts.ProducerTTL) {
		return false
	}
	if dup, err := checkProducer(pe, p); err != nil || !dup {
		return false
	}
	pos, ok := pe.st.lookup(p.Seq)
	if !ok {
		pos = m.Tail
	}
	r.res = appendRes{dup: true, closed: m.Closed, last: pos, epoch: pe.st.epoch, seq: pe.st.lastSeq}
	return true
}

// write applies an admitted append to ws: its records, Stream-Seq,
// closure and producer state pe (nil without a producer).
func (b *batch1) write(r *request, ws *wstream, pe *prodEntry) error {
	req, p, m := r.app, r.app.Producer, &ws.m
	res := appendRes{first: m.Tail + 1, n: len(req.Records)}
	if err := b.appendRecords(ws, req.Records); err != nil {
		return err
	}
	if len(req.Records) > 0 && req.StreamSeq != "" {
		m.StreamSeq = req.StreamSeq
	}
	if req.Close && !m.Closed {
		m.Closed = true
		if p != nil {
			m.CloseProd = &closeProd{p.ID, p.Epoch, p.Seq}
		}
	}
	if p != nil {
		pe.st.admit(p.Epoch, p.Seq, m.Tail, b.nowNs)
		pe.exists, pe.dirty = true, true
		res.epoch, res.seq = p.Epoch, p.Seq
	}
	ws.dirty = true
	m.Access = b.nowNs
	b.notify = append(b.notify, m.ID)
	res.last, res.closed = m.Tail, m.Closed
	r.res = res
	return nil
}

// checkProducer applies the producer rules of [Producer] to the loaded
// state; it mutates nothing.
func checkProducer(pe *prodEntry, p *Producer) (dup bool, err error) {
	if !pe.exists {
		if p.Seq != 0 && !p.AllowGap {
			return false, &ProducerError{Kind: KindGap, ExpectedSeq: 0, ReceivedSeq: p.Seq}
		}
		return false, nil
	}
	st := &pe.st
	switch {
	case p.Epoch < st.epoch:
		return false, &ProducerError{Kind: KindFenced, CurrentEpoch: st.epoch}
	case p.Epoch > st.epoch:
		if p.Seq != 0 && !p.AllowGap {
			return false, &ProducerError{Kind: KindEpochSeq, ReceivedSeq: p.Seq}
		}
		return false, nil
	case p.Seq <= st.lastSeq:
		return true, nil
	case p.Seq == st.lastSeq+1 || p.AllowGap:
		return false, nil
	}
	return false, &ProducerError{Kind: KindGap, ExpectedSeq: st.lastSeq + 1, ReceivedSeq: p.Seq}
}

// appendRecords writes recs as one append at ws's tail.
func (b *batch1) appendRecords(ws *wstream, recs [][]byte) error {
	if len(recs) == 0 {
		return nil
	}
	bk, err := b.recBucket(ws)
	if err != nil {
		return err
	}
	m := &ws.m
	for i, d := range recs {
		var v []byte
		if i == 0 {
			v = b.alloc(9 + len(d))
			v[0] = flagStart
			binary.BigEndian.PutUint64(v[1:9], uint64(b.nowNs))
			copy(v[9:], d)
		} else {
			v = b.alloc(1 + len(d))
			v[0] = 0
			copy(v[1:], d)
		}
		m.Tail++
		k := b.alloc(8)
		binary.BigEndian.PutUint64(k, m.Tail)
		if err := bk.Put(k, v); err != nil {
			return err
		}
		m.Bytes += int64(len(d))
		m.Count++
	}
	return nil
}

func (b *batch1) applyDelete(r *request) error {
	ws, err := b.byName(r.name)
	if err != nil {
		return refuseUndecodable(r, err)
	}
	if ws == nil {
		r.err = fmt.Errorf("%w: %q", ErrNotFound, r.name)
		return nil
	}
	if st := b.db.state(&ws.m, b.now); st != stLive {
		// An expired stream is left to the maintenance pass: a refused
		// request changes nothing, and removing it would release its
		// fork source (and perhaps remove that too).
		r.err = stateErr(st, r.name)
		return nil
	}
	if ws.m.Forks > 0 {
		ws.m.Deleted = true
		ws.dirty = true
		b.notify = append(b.notify, ws.m.ID)
		return nil
	}
	return b.remove(ws)
}

// remove deletes ws's name and meta, queues its records for removal and
// releases its reference on its fork source, removing the source too when
// it was only kept for its forks (and so on up the chain).
func (b *batch1) remove(ws *wstream) error {
	for ws != nil {
		m := &ws.m
		id := key8(m.ID)
		if v := b.names.Get([]byte(m.Name)); v != nil && binary.BigEndian.Uint64(v) == m.ID {
			if err := b.names.Delete([]byte(m.Name)); err != nil {
				return err
			}
		}
		if err := b.metas.Delete(id); err != nil {
			return err
		}
		if err := b.dead.Put(id, nil); err != nil {
			return err
		}
		ws.removed = true
		delete(b.streams, m.ID)
		b.notify = append(b.notify, m.ID)
		if m.SrcID == 0 {
			return nil
		}
		src, err := b.byID(m.SrcID)
		if errors.Is(err, errCorruptMeta) {
			// The source cannot be released: it stays, as the
			// maintenance pass leaves it (maint.go).
			b.db.log.Warn("storage: fork source does not decode; not released", "stream", m.Name, "source_id", m.SrcID, "err", err)
			return nil
		}
		if err != nil || src == nil {
			return err
		}
		src.m.Forks--
		src.dirty = true
		if src.m.Forks > 0 || !(src.m.Deleted || b.db.expired(&src.m, b.now)) {
			return nil
		}
		ws = src
	}
	return nil
}

func (b *batch1) applyCreate(r *request) error {
	o := r.create
	ws, err := b.byName(r.name)
	if err != nil {
		return refuseUndecodable(r, err)
	}
	var expired *wstream // at r.name, removed once the Create is admitted
	if ws != nil {
		switch b.db.state(&ws.m, b.now) {
		case stGone:
			r.err = fmt.Errorf("%w: %q is deleted but still read by forks", ErrConflict, r.name)
			return nil
		case stMissing:
			expired = ws
		default:
			if !b.sameConfig(&ws.m, o) {
				r.err = fmt.Errorf("%w: %q", ErrConflict, r.name)
				return nil
			}
			r.created.info = ws.m.info()
			return nil
		}
	}
	if r.size > b.db.opts.MaxAppendBytes {
		r.err = fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, r.size, b.db.opts.MaxAppendBytes)
		return nil
	}
	m := meta{
		Name:         r.name,
		ContentType:  o.ContentType,
		TTL:          o.TTL,
		ExpiresAt:    o.ExpiresAt,
		ExpiresAtRaw: o.ExpiresAtRaw,
		Created:      b.now.Round(0),
		Access:       b.nowNs,
		Retention:    o.Retention,
	}
	if !o.ExpiresAt.IsZero() {
		m.ExpiresAt = o.ExpiresAt.UTC()
	}
	var src *wstream
	var prefix [][]byte
	if o.ForkFrom != "" {
		if src, err = b.byName(o.ForkFrom); err != nil {
			return refuseUndecodable(r, err)
		}
		if src == nil {
			r.err = fmt.Errorf("%w: fork source %q", ErrNotFound, o.ForkFrom)
			return nil
		}
		switch b.db.state(&src.m, b.now) {
		case stMissing:
			r.err = fmt.Errorf("%w: fork source %q", ErrNotFound, o.ForkFrom)
			return nil
		case stGone:
			r.err = fmt.Errorf("%w: fork source %q is deleted", ErrConflict, o.ForkFrom)
			return nil
		}
		sm := &src.m
		if o.ContentType == "" {
			m.ContentType = sm.ContentType
		} else if NormalizeContentType(o.ContentType) != NormalizeContentType(sm.ContentType) {
			r.err = fmt.Errorf("%w: fork content type %q is not the source's %q", ErrConflict, o.ContentType, sm.ContentType)
			return nil
		}
		var depth int
		if depth, err = b.forkDepth(sm, MaxForkDepth); err != nil {
			r.err = err
			return nil
		}
		if depth >= MaxForkDepth {
			r.err = &ForkDepthError{Source: o.ForkFrom, Max: MaxForkDepth}
			return nil
		}
		at := sm.Tail
		if o.ForkOffset == "" {
			m.ForkDefault = true
		} else {
			at, _ = ParseOffset(o.ForkOffset) // validated before queueing
			if at > sm.Tail {
				r.err = fmt.Errorf("%w: fork offset %s is beyond the source's tail", ErrBadRequest, o.ForkOffset)
				return nil
			}
		}
		if o.ForkSubOffset > 0 {
			if prefix, err = b.subPrefix(sm, at, o.ForkSubOffset); err != nil {
				r.err = err
				return nil
			}
		}
		if o.TTL == 0 && o.ExpiresAt.IsZero() {
			m.TTL, m.ExpiresAt, m.ExpiresAtRaw, m.Inherit = sm.TTL, sm.ExpiresAt, sm.ExpiresAtRaw, true
		}
		m.SrcID, m.ForkFrom, m.ForkSub = sm.ID, o.ForkFrom, o.ForkSubOffset
		m.Base, m.Tail, m.Pruned = at, at, at
	}
	if m.ContentType == "" {
		m.ContentType = defaultContentType
	}
	// Admitted: only now is the expired stream removed, so that a
	// refused Create changes nothing. Its removal cannot reach src, or
	// anything src reads: src is live, so it and its sources each keep a
	// fork (remove releases only streams left with none).
	if expired != nil {
		if err := b.remove(expired); err != nil {
			return err
		}
	}
	id, err := b.metas.NextSequence()
	if err != nil {
		return err
	}
	m.ID = id
	nws := &wstream{m: m}
	b.streams[id] = nws
	b.use(nws).dirty = true
	if err := b.names.Put([]byte(r.name), key8(id)); err != nil {
		return err
	}
	if _, err := b.recBucket(nws); err != nil {
		return err
	}
	if src != nil {
		src.m.Forks++
		src.dirty = true
	}
	if err := b.appendRecords(nws, prefix); err != nil {
		return err
	}
	if err := b.appendRecords(nws, o.Records); err != nil {
		return err
	}
	nws.m.Closed = o.Closed
	b.notify = append(b.notify, id)
	r.created.info, r.created.created = nws.m.info(), true
	return nil
}

// forkDepth returns the fork depth of sm (0 when it is not a fork), counting
// no further than limit: it loads at most limit-1 metas up sm's chain, so a
// fork costs the same whatever the depth of chains written before
// [MaxForkDepth] bounded them.
func (b *batch1) forkDepth(sm *meta, limit int) (int, error) {
	d, cur := 0, sm
	for cur.SrcID != 0 {
		if d++; d >= limit {
			break
		}
		src, err := b.byID(cur.SrcID)
		if err != nil {
			return 0, err
		}
		if src == nil {
			return 0, fmt.Errorf("%w: fork source %d of %q is missing", errInternal, cur.SrcID, sm.Name)
		}
		cur = &src.m
	}
	return d, nil
}

// subPrefix returns the fork prefix of sub records (JSON) or bytes of the
// append that starts right after position at in the chain of sm.
func (b *batch1) subPrefix(sm *meta, at uint64, sub int64) ([][]byte, error) {
	segs, err := chain(nil, sm, b.metaByID)
	if err != nil {
		return nil, err
	}
	var recs [][]byte
	var total int64
	err = scan(b.tx, segs, at, func(pos uint64, v []byte) bool {
		data, start, _ := recordData(v)
		if start && len(recs) > 0 {
			return false
		}
		recs = append(recs, data)
		total += int64(len(data))
		return true
	})
	if pe, ok := err.(*PrunedError); ok {
		pe.ID = sm.ID // the fork's source
	}
	if err != nil {
		return nil, err
	}
	if len(recs) == 0 {
		return nil, fmt.Errorf("%w: fork sub-offset %d with no append after the fork offset", ErrBadRequest, sub)
	}
	if isJSON(sm.ContentType) {
		if sub > int64(len(recs)) {
			return nil, fmt.Errorf("%w: fork sub-offset %d exceeds the append's %d messages", ErrBadRequest, sub, len(recs))
		}
		out := make([][]byte, sub)
		for i := range out {
			out[i] = append([]byte(nil), recs[i]...)
		}
		return out, nil
	}
	if sub > total {
		return nil, fmt.Errorf("%w: fork sub-offset %d exceeds the append's %d bytes", ErrBadRequest, sub, total)
	}
	p := make([]byte, 0, sub)
	for _, d := range recs {
		p = append(p, d[:min(int64(len(d)), sub-int64(len(p)))]...)
		if int64(len(p)) == sub {
			break
		}
	}
	return [][]byte{p}, nil
}

// sameConfig reports whether Create options o describe the existing m.
func (b *batch1) sameConfig(m *meta, o *CreateOptions) bool {
	ct := o.ContentType
	if ct == "" {
		ct = defaultContentType
		if o.ForkFrom != "" {
			ct = m.ContentType
		}
	}
	if NormalizeContentType(ct) != NormalizeContentType(m.ContentType) {
		return false
	}
	if m.Inherit {
		if o.TTL != 0 || !o.ExpiresAt.IsZero() {
			return false
		}
	} else if o.TTL != m.TTL || !o.ExpiresAt.Equal(m.ExpiresAt) {
		return false
	}
	if o.Closed != m.Closed || o.ForkFrom != m.ForkFrom || o.ForkSubOffset != m.ForkSub {
		return false
	}
	if m.SrcID == 0 {
		return o.ForkOffset == ""
	}
	if o.ForkOffset == "" {
		if m.ForkDefault {
			return true
		}
		src, err := b.byID(m.SrcID)
		return err == nil && src != nil && src.m.Tail == m.Base
	}
	at, err := ParseOffset(o.ForkOffset)
	return err == nil && at == m.Base
}
