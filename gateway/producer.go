package gateway

import (
	"fmt"
	"strconv"
	"sync"
	"time"

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
}

// pendingOutcome is the result of a mutate still running.
type pendingOutcome struct {
	done chan struct{} // closed once o is set
	o    outcome
}

// replyWhenDone calls reply with o, or with its result once it is known:
// at once if it is, else from a goroutine that waits for it.
func replyWhenDone(o outcome, reply func(outcome)) {
	w := o.wait
	if w == nil {
		reply(o)
		return
	}
	select {
	case <-w.done:
		reply(w.o)
	default:
		go func() {
			<-w.done
			reply(w.o)
		}()
	}
}

// producer is the mutation producer named by (hello.clientId, epoch), or a
// session without a clientId. It serialises its mutates and remembers the
// outcomes of the last window seqs so a retry gets the same ack.
type producer struct {
	clientID string // "" for a session-scoped producer
	window   int

	mu       sync.Mutex
	inflight int              // guarded by mu: mutates recorded but still running
	started  bool             // guarded by mu: a mutate has run on this node
	epoch    int64            // guarded by mu
	next     int64            // guarded by mu: the next expected seq
	ring     []outcome        // guarded by mu: outcome of seq at seq % window, grown lazily
	keys     map[string]int64 // guarded by mu: key → seq for outcomes in ring
	sessions int              // guarded by producers.mu: live sessions using it
	idleAt   time.Time        // guarded by producers.mu: when sessions fell to 0
}

func newProducer(epoch int64, window int) *producer {
	return &producer{epoch: epoch, window: window}
}

// resetLocked starts a new epoch at seq 0.
func (p *producer) resetLocked(epoch int64) {
	p.epoch, p.next, p.ring, p.keys = epoch, 0, nil, nil
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
// the outcome before it returns.
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
		p.next = f.Seq
	}
	p.started = true
	switch {
	case f.Seq < p.next:
		if o, ok := p.lookupLocked(f.Seq); ok {
			replyWhenDone(o, reply)
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
				o = <-later // bound what is pending (and so never overwritten in the ring)
			} else {
				p.startPendingLocked(f, later, reply)
				return
			}
		}
	}
	o.seq = f.Seq
	p.recordLocked(o)
	p.next++
	replyWhenDone(o, reply)
}

// startPendingLocked records f as pending and answers it when later
// delivers.
func (p *producer) startPendingLocked(f *frames.Mutate, later <-chan outcome, reply func(outcome)) {
	w := &pendingOutcome{done: make(chan struct{})}
	p.recordLocked(outcome{seq: f.Seq, key: f.Key, wait: w})
	p.next++
	p.inflight++
	go func() {
		w.o = <-later
		w.o.seq, w.o.key = f.Seq, f.Key
		close(w.done)
		p.mu.Lock()
		p.inflight--
		p.mu.Unlock()
		reply(w.o)
	}()
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
		p.next = seq
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
// order.
func (p *producer) recordLocked(o outcome) {
	i := int(o.seq % int64(p.window))
	if p.keys == nil {
		p.keys = map[string]int64{}
	}
	if i >= len(p.ring) {
		p.ring = append(p.ring, make([]outcome, i+1-len(p.ring))...)
	}
	if old := p.ring[i]; old.key != "" && p.keys[old.key] == old.seq {
		delete(p.keys, old.key)
	}
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

// producers is the node's table of client-named producers. It holds at
// most max entries with no session; beyond that, idle ones are forgotten
// early (their clients' retries then get X_SEQ_FORGOTTEN or run again).
type producers struct {
	window int
	idle   time.Duration
	max    int

	mu sync.Mutex
	m  map[string]*producer // guarded by mu
}

// acquire returns clientID's producer for a session on epoch; a higher epoch
// than the current one starts the producer over at seq 0.
func (t *producers) acquire(clientID string, epoch int64) *producer {
	t.mu.Lock()
	p, ok := t.m[clientID]
	if !ok {
		if len(t.m) >= t.max {
			t.dropIdleLocked() // full: forget every producer with no session now
		}
		p = newProducer(epoch, t.window)
		p.clientID = clientID
		t.m[clientID] = p
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

// release ends a session's use of p.
func (t *producers) release(p *producer, now time.Time) {
	if p.clientID == "" {
		return
	}
	t.mu.Lock()
	p.sessions--
	if p.sessions == 0 {
		p.idleAt = now
	}
	t.mu.Unlock()
}

// sweep forgets producers idle since before now-idle. It returns how many.
func (t *producers) sweep(now time.Time) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for id, p := range t.m {
		if p.sessions == 0 && now.Sub(p.idleAt) > t.idle {
			delete(t.m, id)
			n++
		}
	}
	return n
}

// dropIdleLocked forgets every producer no session is using.
func (t *producers) dropIdleLocked() {
	for id, p := range t.m {
		if p.sessions == 0 {
			delete(t.m, id)
		}
	}
}
