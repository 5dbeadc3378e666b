package gateway

import (
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syncgate/syncgate/frames"
)

// outcome is the recorded result of one mutate: an offset or a typed error.
// A mutate that completes later (a persisted publish waiting for its
// commit) is recorded at once with wait set; its lsn and err are then
// those of wait.o once wait.done is closed.
type outcome struct {
	seq  int64
	key  string
	lsn  string
	err  *frames.Error
	wait *pendingOutcome
	size int64 // in a ring slot: what producer.bytes counts for it (recordLocked, countResultLocked)
}

// The estimate of what a producer record holds (producer.bytes), in
// bytes of memory on a 64-bit platform. It is meant as a bound that the
// strings a client chooses cannot escape, not an exact count: every
// string a record keeps is counted at its length, and everything else at
// a fixed cost.
const (
	producerBytes = 512                             // the record, its table entry, its keys map
	slotBytes     = int64(unsafe.Sizeof(outcome{})) // a ring slot, filled or not
	entryBytes    = 64                              // an outcome's keys-map entry
	errorBytes    = 96                              // a frames.Error
	pendingBytes  = 192                             // a pendingOutcome, its channel and goroutine's record
)

// resultBytes estimates what o's result (its offset or error) holds.
func resultBytes(o outcome) int64 {
	n := int64(len(o.lsn))
	if e := o.err; e != nil {
		n += errorBytes + int64(len(e.Code)+len(e.Cause)+len(e.Fix)+len(e.Docs)+len(e.Ref))
	}
	return n
}

// pendingOutcome is the result of a mutate still running.
type pendingOutcome struct {
	done chan struct{} // closed once o is set
	o    outcome
}

// replyLocked calls reply with o, or with its result once it is known: at
// once if it is, else from a goroutine that waits for it. At most
// window/2 such goroutines wait per producer, as at most that many of its
// mutates are pending: past that the caller waits for the result itself
// (the session's reader: backpressure), so that retries of a pending seq
// (or of its key) cannot pin a goroutine each while a commit is slow. The
// wait holds mu, as run's wait for a pending mutate does: the pending
// outcome's result is set, and done closed, without mu.
func (p *producer) replyLocked(o outcome, reply func(outcome)) {
	w := o.wait
	if w == nil {
		reply(o)
		return
	}
	select {
	case <-w.done:
		reply(w.o)
		return
	default:
	}
	if p.waiting.Load() >= int64(max(1, p.window/2)) {
		<-w.done
		reply(w.o)
		return
	}
	p.waiting.Add(1)
	go func() {
		<-w.done
		p.waiting.Add(-1)
		reply(w.o)
	}()
}

// producer is the mutation producer named by (hello.clientId, epoch), or a
// session without a clientId. It serialises its mutates and remembers the
// outcomes of the last window seqs so a retry gets the same ack.
type producer struct {
	// Set before the producer is shared.
	clientID string     // "" for a session-scoped producer
	tab      *producers // the table holding it; nil for a session-scoped producer
	window   int

	mu       sync.Mutex
	inflight int              // guarded by mu: mutates recorded but still running
	waiting  atomic.Int64     // goroutines of replyLocked waiting for a pending outcome; added to under mu
	started  bool             // guarded by mu: a mutate has run on this node
	epoch    int64            // guarded by mu
	next     int64            // guarded by mu: the next expected seq
	spent    bool             // guarded by mu: seq math.MaxInt64 was taken, so next (that seq) is answered and no seq is left
	ring     []outcome        // guarded by mu: outcome of seq at seq % window, grown lazily
	keys     map[string]int64 // guarded by mu: key → seq for outcomes in ring

	// bytes estimates what the record holds (producerBytes, ring slots
	// and outcomes). It changes under mu, as the ring does; the table
	// reads it without mu. idle is set while no session uses a named
	// producer: a size change (a pending outcome's result) is then passed
	// on to the table (producers.recount).
	bytes atomic.Int64
	idle  atomic.Bool

	// Guarded by producers.mu.
	sessions     int       // live sessions using it
	idleAt       time.Time // when sessions fell to 0
	counted      int64     // bytes counted in producers.idleBytes while idle
	older, newer *producer // neighbours in the table's idle list
}

func newProducer(epoch int64, window int) *producer {
	p := &producer{epoch: epoch, window: window}
	p.bytes.Store(producerBytes)
	return p
}

// resetLocked starts a new epoch at seq 0.
func (p *producer) resetLocked(epoch int64) {
	p.epoch, p.next, p.ring, p.keys, p.spent = epoch, 0, nil, nil, false
	p.bytes.Store(producerBytes + int64(len(p.clientID)))
}

// run applies the producer rules to mutate f from a session on epoch, then
// either replays a recorded outcome or calls exec and records its outcome.
// reply is called with the outcome to ack.
//
// exec either returns the outcome, or returns a channel on which the
// outcome arrives later (exactly one value; a persisted publish waiting for
// its commit). Then the mutate is recorded as pending at once, so the next
// seqs can run meanwhile, and reply is called when the outcome arrives, from
// another goroutine: acks of a producer's synchronous mutates leave in seq
// order, but a later mutate's ack may overtake a pending one's. At most
// window/2 mutates of a producer are pending; beyond that run waits for
// the outcome before it returns. A retry of a pending mutate is answered
// when its outcome arrives, and past window/2 such retries waiting run
// waits for that too (replyLocked).
//
// first says f is the first mutate its session has passed on, and no
// frame of the session was lost before it (dropped over the frame rate,
// undecodable, or binary): it is
// then the first mutate the client sent on this connection, which a
// client sends from its lowest unacknowledged seq, so every seq below it
// has been answered, here or by another node. A client-named producer
// that expects less continues there (see also advance).
func (p *producer) run(epoch int64, first bool, f *frames.Mutate, reply func(outcome), exec func() (outcome, <-chan outcome)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case epoch < p.epoch:
		reply(outcome{key: f.Key, err: frames.NewError(frames.CodeEpochFenced, f.Key,
			fmt.Sprintf("producer epoch %d is fenced: epoch %d is current", epoch, p.epoch),
			"this client was replaced by a newer instance; reconnect with a higher epoch if this one should win")})
		return
	case epoch > p.epoch:
		p.resetLocked(epoch)
	}
	if p.clientID != "" && (!p.started || first && f.Seq > p.next) {
		// A client-named producer this node has no record of (new here,
		// forgotten, or the node restarted), whose client did not say in
		// its hello where it stands (advance), continues at the seq it
		// presents; persisted appends are still deduplicated by the log.
		// So does one whose record a connection's first mutate shows to
		// be behind (the client published elsewhere meanwhile, or its
		// hello's seq was taken while an older connection still had
		// mutates in flight).
		p.next, p.spent = f.Seq, false
	}
	p.started = true
	switch {
	case f.Seq < p.next || p.spent:
		if o, ok := p.lookupLocked(f.Seq); ok {
			if o.key != f.Key {
				// Not a retry: another mutate under a seq already
				// answered (a client that kept its clientId but not its
				// seq, say). Its first ack would carry the other key,
				// which this client never matches; nothing is applied.
				reply(outcome{key: f.Key, err: frames.NewError(frames.CodeSeqReused, f.Key,
					fmt.Sprintf("mutate.seq %d was already answered for key %q; this mutate was not applied", f.Seq, o.key),
					fmt.Sprintf("send it as seq %d, the next one; a client that keeps its clientId across restarts keeps its seq too (hello.seq), or raises its epoch", p.next))})
				return
			}
			p.replyLocked(o, reply)
			return
		}
		reply(outcome{key: f.Key, err: frames.NewError(frames.CodeSeqForgotten, f.Key,
			fmt.Sprintf("mutate.seq %d is a retry older than the last %d outcomes this server remembers", f.Seq, p.window),
			fmt.Sprintf("do not retry it; the next seq is %d", p.next))})
		return
	case f.Seq > p.next:
		reply(outcome{key: f.Key, err: frames.NewError(frames.CodeSeqGap, f.Key,
			fmt.Sprintf("mutate.seq: expected %d, received %d", p.next, f.Seq),
			fmt.Sprintf("send seq %d next: seqs count from 0 by 1 per mutate of this producer", p.next))})
		return
	}
	o, repeat := p.repeatLocked(f.Key) // the same mutation sent again under a new seq
	if !repeat {
		var later <-chan outcome
		o, later = exec()
		if later != nil {
			if p.inflight >= max(1, p.window/2) {
				o = <-later // bound what is pending (its slot may still be overwritten by later seqs: countResultLocked)
			} else {
				p.startPendingLocked(f, later, reply)
				return
			}
		}
	}
	o.seq = f.Seq
	p.recordLocked(o)
	p.nextLocked()
	p.replyLocked(o, reply)
}

// nextLocked moves past the seq just recorded. The last seq a client may
// send (math.MaxInt64) has no next: the producer then stays there, spent,
// and takes every mutate as a retry, rather than wrap to a negative next
// that would make a retry of it X_SEQ_GAP.
func (p *producer) nextLocked() {
	if p.next == math.MaxInt64 {
		p.spent = true
		return
	}
	p.next++
}

// startPendingLocked records f as pending and answers it when later
// delivers.
func (p *producer) startPendingLocked(f *frames.Mutate, later <-chan outcome, reply func(outcome)) {
	w := &pendingOutcome{done: make(chan struct{})}
	p.recordLocked(outcome{seq: f.Seq, key: f.Key, wait: w})
	p.nextLocked()
	p.inflight++
	go func() {
		w.o = <-later
		w.o.seq, w.o.key = f.Seq, f.Key
		close(w.done)
		p.mu.Lock()
		p.inflight--
		p.countResultLocked(w)
		p.mu.Unlock()
		if p.idle.Load() {
			// Its sessions have ended: the table counts its size
			// (the load pairs with release's store of idle, then load
			// of bytes: one of them sees the other's change).
			p.tab.recount(p)
		}
		reply(w.o)
	}()
}

// countResultLocked adds the size of pending outcome w's result, which has
// just arrived, to the slot that holds w: the slot of its seq, or if a
// later seq has taken that, the slot of a later mutate that repeated its
// key. A slot that no longer holds w (the ring was reset or has moved on)
// counts nothing.
func (p *producer) countResultLocked(w *pendingOutcome) {
	slot := p.slotLocked(w.o.seq)
	if slot == nil || slot.wait != w {
		seq, ok := p.keys[w.o.key]
		if slot = p.slotLocked(seq); !ok || slot == nil || slot.wait != w {
			return
		}
	}
	n := resultBytes(w.o)
	slot.size += n
	p.bytes.Add(n)
}

// slotLocked returns the ring slot holding seq's outcome, or nil.
func (p *producer) slotLocked(seq int64) *outcome {
	i := int(seq % int64(p.window))
	if i >= len(p.ring) || p.ring[i].seq != seq {
		return nil
	}
	return &p.ring[i]
}

// advance applies a hello's seq on epoch. It overlaps with run's first
// rule, which alone would also converge (a lost frame gets X_SEQ_GAP, the
// client starts over, and the new connection's first mutate moves the
// producer on); the hello's seq saves that round, and is the only base a
// node with no record has when the connection's first frames were lost.
// Every seq below it has been
// answered (here or by another node), and it is the first this
// connection will send. A producer that expects less continues there (the
// client published through another node meanwhile: A, then B, then A); a
// new record starts there. Never backwards, and never on a stale epoch.
func (p *producer) advance(epoch, seq int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if epoch != p.epoch {
		return // fenced (lower); a higher one was reset by acquire
	}
	if !p.started || seq > p.next {
		p.next, p.spent = seq, false
	}
	p.started = true
}

func (p *producer) lookupLocked(seq int64) (outcome, bool) {
	i := int(seq % int64(p.window))
	if i >= len(p.ring) || p.ring[i].seq != seq || p.ring[i].key == "" {
		return outcome{}, false
	}
	return p.ring[i], true
}

// repeatLocked returns the recorded outcome of the mutate last sent under
// key, if the ring still holds it.
func (p *producer) repeatLocked(key string) (outcome, bool) {
	seq, ok := p.keys[key]
	if !ok {
		return outcome{}, false
	}
	return p.lookupLocked(seq)
}

// recordLocked stores o in its seq's slot. The ring grows to that slot
// when first reached: a client-named producer new to this node starts at
// whatever seq its client presents, not at 0, so the slots do not fill in
// order. The record's size (bytes) follows: the slots the ring grew by,
// and o's key and result in place of the outcome it overwrites. A
// pending outcome's result counts once it arrives (countResultLocked).
func (p *producer) recordLocked(o outcome) {
	i := int(o.seq % int64(p.window))
	if p.keys == nil {
		p.keys = map[string]int64{}
	}
	if i >= len(p.ring) {
		c := cap(p.ring)
		p.ring = append(p.ring, make([]outcome, i+1-len(p.ring))...)
		p.bytes.Add(int64(cap(p.ring)-c) * slotBytes)
	}
	old := p.ring[i]
	if old.key != "" && p.keys[old.key] == old.seq {
		delete(p.keys, old.key)
	}
	o.size = entryBytes + int64(len(o.key))
	if w := o.wait; w == nil {
		o.size += resultBytes(o)
	} else {
		o.size += pendingBytes
		select {
		case <-w.done: // a repeated key's outcome that has arrived
			o.size += resultBytes(w.o)
		default: // countResultLocked counts it when it arrives
		}
	}
	p.bytes.Add(o.size - old.size)
	p.ring[i] = o
	p.keys[o.key] = o.seq
}

// producerName names the producer of a client: its clientID, within its
// actor's names when the session has one (a token's sub). Another actor
// naming the same clientID gets another producer, so it cannot fence this
// one or take up its seqs. The length prefix keeps (actor, clientID)
// pairs apart whatever bytes they hold.
func producerName(actorID *string, clientID string) string {
	if actorID == nil {
		return clientID
	}
	return strconv.Itoa(len(*actorID)) + ":" + *actorID + ":" + clientID
}

// Reasons a producer record is forgotten, labelling
// syncgate_producers_forgotten_total.
const (
	forgetExpired   = iota // idle for longer than Config.ProducerIdle (sweep)
	forgetTableFull        // the table held Config.MaxProducers records (dropIdleLocked)
	forgetIdleBytes        // idle records over Config.MaxIdleProducerBytes (shrinkLocked)
	numForgetReasons
)

var forgetReasons = [numForgetReasons]string{"expired", "table_full", "idle_bytes"}

// producers is the node's table of client-named producers. Records no
// session uses (idle) are kept for idle after their last session ended,
// and forgotten early: all of them when the table holds max records, and
// the longest idle first while their size (producer.bytes) adds up to
// more than maxIdleBytes. A forgotten producer's client continues at the
// seq it presents (run, advance); its retries of seqs the record held get
// X_SEQ_FORGOTTEN or run again, and persisted appends are still
// deduplicated by the log. A record in use is never forgotten, so a
// connected client's retries are always answered from it.
type producers struct {
	window       int
	idle         time.Duration
	max          int
	maxIdleBytes int64 // negative: no cap

	forgotten [numForgetReasons]prometheus.Counter // by forget reason
	idleGauge prometheus.Gauge                     // idleBytes

	mu        sync.Mutex
	m         map[string]*producer // guarded by mu
	idleBytes int64                // guarded by mu: the counted bytes of the idle records
	oldest    *producer            // guarded by mu: the idle records, by idleAt, through newer
	newest    *producer            // guarded by mu
}

// newProducers returns the table for cfg (with its defaults), counting in m.
func newProducers(cfg *Config, m *metrics) *producers {
	return &producers{
		window:       cfg.ProducerWindow,
		idle:         cfg.ProducerIdle,
		max:          cfg.MaxProducers,
		maxIdleBytes: cfg.MaxIdleProducerBytes,
		forgotten:    m.producersForgotten,
		idleGauge:    m.producersIdleBytes,
		m:            map[string]*producer{},
	}
}

// acquire returns clientID's producer for a session on epoch; a higher epoch
// than the current one starts the producer over at seq 0.
func (t *producers) acquire(clientID string, epoch int64) *producer {
	t.mu.Lock()
	p, ok := t.m[clientID]
	switch {
	case !ok:
		if len(t.m) >= t.max {
			t.dropIdleLocked() // full: forget every producer with no session now
		}
		p = newProducer(epoch, t.window)
		p.clientID, p.tab = clientID, t
		p.bytes.Add(int64(len(clientID)))
		t.m[clientID] = p
	case p.sessions == 0:
		t.unlinkLocked(p)
	}
	p.sessions++
	t.mu.Unlock()
	p.mu.Lock()
	if epoch > p.epoch {
		p.resetLocked(epoch)
	}
	p.mu.Unlock()
	return p
}

// release ends a session's use of p. When it was the last, p's size counts
// against maxIdleBytes, and the longest idle records are forgotten while
// the idle ones hold more.
func (t *producers) release(p *producer, now time.Time) {
	if p.clientID == "" {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	p.sessions--
	if p.sessions > 0 {
		return
	}
	p.idleAt = now
	// Store idle before loading bytes: a pending outcome that arrives
	// now either is in the load or sees idle and recounts.
	p.idle.Store(true)
	p.counted = p.bytes.Load()
	t.idleBytes += p.counted
	// Insert by idleAt: normally at the newest end (now only grows).
	older := t.newest
	for older != nil && older.idleAt.After(now) {
		older = older.older
	}
	p.older = older
	if older == nil {
		p.newer, t.oldest = t.oldest, p
	} else {
		p.newer, older.newer = older.newer, p
	}
	if p.newer == nil {
		t.newest = p
	} else {
		p.newer.older = p
	}
	t.shrinkLocked()
}

// recount brings the table's count of idle p's size up to date, after a
// pending outcome of p arrived; then, like release, it forgets the longest
// idle records while the idle ones hold more than maxIdleBytes.
func (t *producers) recount(p *producer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p.sessions > 0 || t.m[p.clientID] != p {
		return // in use again (counted at its next release), or forgotten
	}
	n := p.bytes.Load()
	t.idleBytes += n - p.counted
	p.counted = n
	t.shrinkLocked()
}

// shrinkLocked forgets the longest idle records while the idle ones hold
// more than maxIdleBytes, and updates the gauge. Each step is O(1), so a
// release costs as many steps as it forgets records.
func (t *producers) shrinkLocked() {
	n := 0
	for t.maxIdleBytes >= 0 && t.idleBytes > t.maxIdleBytes && t.oldest != nil {
		t.forgetLocked(t.oldest)
		n++
	}
	if n > 0 {
		t.forgotten[forgetIdleBytes].Add(float64(n))
	}
	t.idleGauge.Set(float64(t.idleBytes))
}

// unlinkLocked takes idle p out of the idle list and its size out of
// idleBytes: a session uses it again, or it is forgotten.
func (t *producers) unlinkLocked(p *producer) {
	if p.older == nil {
		t.oldest = p.newer
	} else {
		p.older.newer = p.newer
	}
	if p.newer == nil {
		t.newest = p.older
	} else {
		p.newer.older = p.older
	}
	p.older, p.newer = nil, nil
	p.idle.Store(false)
	t.idleBytes -= p.counted
	p.counted = 0
	t.idleGauge.Set(float64(t.idleBytes))
}

// forgetLocked removes idle p from the table.
func (t *producers) forgetLocked(p *producer) {
	t.unlinkLocked(p)
	delete(t.m, p.clientID)
}

// sweep forgets producers idle since before now-idle. It returns how many.
// The idle list is in idleAt order, so it stops at the first one kept.
func (t *producers) sweep(now time.Time) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for t.oldest != nil && now.Sub(t.oldest.idleAt) > t.idle {
		t.forgetLocked(t.oldest)
		n++
	}
	if n > 0 {
		t.forgotten[forgetExpired].Add(float64(n))
	}
	return n
}

// dropIdleLocked forgets every producer no session is using.
func (t *producers) dropIdleLocked() {
	n := 0
	for t.oldest != nil {
		t.forgetLocked(t.oldest)
		n++
	}
	if n > 0 {
		t.forgotten[forgetTableFull].Add(float64(n))
	}
}
