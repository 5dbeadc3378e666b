package fanout

import (
	"context"
	"errors"
	"hash/maphash"
	"net"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// HubConfig configures a [Hub]. The zero value is ready to use.
type HubConfig struct {
	// Shards is the number of topic shards; each has its own lock.
	// Zero or negative means 64.
	Shards int

	// Now is the clock for Message.At (unless PublishAt gives it). Nil
	// means time.Now.
	Now func() time.Time
}

// defaultShards is HubConfig.Shards' default, as in centrifuge's hub.
const defaultShards = 64

// errNilSubscriber is returned by Subscribe for a nil Subscriber, which
// would otherwise panic later on a publisher's goroutine.
var errNilSubscriber = errors.New("fanout: nil subscriber")

// Hub is the in-process [Transport]: a topic→subscribers index split into
// shards by a hash of the topic.
//
// All methods may be called concurrently. Publish delivers synchronously: it
// calls every subscriber's Deliver on the caller's goroutine, under the read
// lock of the topic's shard, and returns when all have been called. So
// publishers to topics of different shards never contend, publishers to the
// same shard share its lock, and Subscribe and Unsubscribe wait for the
// Publish calls in progress on their shard. Holding the read lock across
// delivery is what makes "no Deliver after Unsubscribe returns" true, and is
// why Deliver must not block or call back into the Hub: Subscribe or
// Unsubscribe from Deliver deadlocks on its own shard, and Publish from
// Deliver can deadlock behind a waiting Subscribe.
//
// Publish allocates one [Message] per publication with subscribers and
// nothing for a topic without subscribers.
type Hub struct {
	// Static after construction.
	seed   maphash.Seed
	now    func() time.Time
	shards []shard

	// closed is set by Close before it empties the shards. Subscribe and
	// Publish read it while holding their shard's lock, so nothing is added
	// to or delivered from a shard after Close has emptied it.
	closed atomic.Bool
}

var (
	_ Transport   = (*Hub)(nil)
	_ AtPublisher = (*Hub)(nil)
)

// shard is one lock's worth of topics, padded to its own cache lines so
// publishers read-locking neighbouring shards do not share a line.
type shard struct {
	shardState
	_ [shardPad - unsafe.Sizeof(shardState{})%shardPad]byte
}

// shardPad covers two 64-byte lines: x86 prefetches lines in pairs.
const shardPad = 128

type shardState struct {
	mu sync.RWMutex
	// Guarded by mu. A topic has an entry only while it has at least one
	// subscriber. The entries are mutated in place under the write lock:
	// readers (Publish) iterate them only while holding the read lock, so
	// copy-on-write would buy nothing and would cost a full copy per
	// Subscribe, which is O(N²) garbage when N sessions rejoin a hot topic.
	topics map[string]*topicSubs
}

// topicSubs is one topic's subscribers. A small topic is searched by
// scanning list; past indexAbove subscribers pos indexes it, so joining or
// leaving a topic of 100,000 subscribers is O(1) rather than a scan of
// all of them (a drain makes every session of a node rejoin at once).
type topicSubs struct {
	list []Subscriber
	pos  map[Subscriber]int // list index of each subscriber; nil while small
}

// indexAbove is the subscriber count above which a topic gets its pos
// index; below indexAbove/2 it is dropped again (the gap keeps a topic
// that hovers around the threshold from rebuilding it on every change).
const indexAbove = 32

// find returns s's index in list, or -1.
func (ts *topicSubs) find(s Subscriber) int {
	if ts.pos != nil {
		if i, ok := ts.pos[s]; ok {
			return i
		}
		return -1
	}
	for i, x := range ts.list {
		if x == s {
			return i
		}
	}
	return -1
}

// add appends s, which is not in list. The index is updated first: a
// Subscriber whose dynamic type cannot be a map key (the Transport
// contract asks for pointers) then panics before anything has changed.
func (ts *topicSubs) add(s Subscriber) {
	switch {
	case ts.pos != nil:
		ts.pos[s] = len(ts.list)
	case len(ts.list)+1 > indexAbove:
		pos := make(map[Subscriber]int, 2*(len(ts.list)+1))
		for i, x := range ts.list {
			pos[x] = i
		}
		pos[s] = len(ts.list)
		ts.pos = pos
	}
	ts.list = append(ts.list, s)
}

// remove takes out the subscriber at index i. Order among subscribers does
// not matter: the last one moves into i.
func (ts *topicSubs) remove(i int) {
	last := len(ts.list) - 1
	if ts.pos != nil {
		delete(ts.pos, ts.list[i])
		if i != last {
			ts.pos[ts.list[last]] = i
		}
	}
	ts.list[i] = ts.list[last]
	ts.list[last] = nil // let the removed subscriber be collected
	ts.list = ts.list[:last]
	if ts.pos != nil && len(ts.list) < indexAbove/2 {
		ts.pos = nil
	}
	// Give back the memory of a topic that was hot and has cooled down
	// (a map does not shrink as entries are deleted: rebuild it too).
	if cap(ts.list) > 64 && len(ts.list) < cap(ts.list)/4 {
		ts.list = append(make([]Subscriber, 0, 2*len(ts.list)), ts.list...)
		if ts.pos != nil {
			pos := make(map[Subscriber]int, 2*len(ts.list))
			for i, x := range ts.list {
				pos[x] = i
			}
			ts.pos = pos
		}
	}
}

// NewHub returns an empty Hub. Close it when done.
func NewHub(cfg HubConfig) *Hub {
	n := cfg.Shards
	if n <= 0 {
		n = defaultShards
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	h := &Hub{
		seed:   maphash.MakeSeed(),
		now:    now,
		shards: make([]shard, n),
	}
	for i := range h.shards {
		h.shards[i].topics = make(map[string]*topicSubs)
	}
	return h
}

// shard returns topic's shard. The seed is per hub, so clients choosing
// topic names cannot aim them all at one shard.
func (h *Hub) shard(topic string) *shard {
	return &h.shards[maphash.String(h.seed, topic)%uint64(len(h.shards))]
}

// Publish calls Deliver, on the caller's goroutine, for every current
// subscriber of topic with one shared [Message] that holds data (not a
// copy): the caller must not modify data afterwards. It returns ctx.Err()
// if ctx is already cancelled, [net.ErrClosed] after Close, and nil
// otherwise, including when topic has no subscribers.
func (h *Hub) Publish(ctx context.Context, topic string, data []byte) error {
	return h.publish(ctx, topic, data, time.Time{})
}

// PublishAt is Publish with the Message's At set to at (zero: now, as
// Publish), for a message published before it reached the hub.
func (h *Hub) PublishAt(ctx context.Context, topic string, data []byte, at time.Time) error {
	return h.publish(ctx, topic, data, at)
}

// publish is Publish, with Message.At set to at if not zero. The clock is
// read only for a topic with subscribers.
func (h *Hub) publish(ctx context.Context, topic string, data []byte, at time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	sh := h.shard(topic)
	sh.mu.RLock()
	defer sh.mu.RUnlock() // deferred so a panicking Deliver does not wedge the shard
	if h.closed.Load() {
		return net.ErrClosed
	}
	ts := sh.topics[topic]
	if ts == nil {
		return nil
	}
	if at.IsZero() {
		at = h.now()
	}
	m := &Message{Topic: topic, Data: data, At: at}
	for _, s := range ts.list {
		s.Deliver(m)
	}
	return nil
}

// Subscribe adds s to topic's subscribers; subscribing it again is a no-op.
// It waits for Publish calls in progress on topic's shard, costs O(1)
// (amortised; a scan of at most 32 for a small topic), and returns
// ctx.Err() if ctx is already cancelled and [net.ErrClosed] after Close.
func (h *Hub) Subscribe(ctx context.Context, topic string, s Subscriber) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s == nil {
		return errNilSubscriber
	}
	sh := h.shard(topic)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if h.closed.Load() {
		return net.ErrClosed
	}
	ts := sh.topics[topic]
	if ts == nil {
		ts = &topicSubs{}
		sh.topics[topic] = ts
	} else if ts.find(s) >= 0 {
		return nil
	}
	ts.add(s)
	return nil
}

// Unsubscribe removes s from topic's subscribers and drops the topic when
// s was its last one. When it returns, no Deliver to s for topic is running
// or will start. It waits for Publish calls in progress on topic's shard
// and costs O(1), as Subscribe.
//
// Unsubscribe never fails: an unknown (topic, s) is a no-op and ctx is
// ignored, because the gateway unsubscribes while tearing down a session
// whose context is usually already cancelled.
func (h *Hub) Unsubscribe(_ context.Context, topic string, s Subscriber) error {
	sh := h.shard(topic)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	ts := sh.topics[topic]
	if ts == nil {
		return nil
	}
	i := ts.find(s)
	switch {
	case i < 0:
		return nil
	case len(ts.list) == 1:
		delete(sh.topics, topic)
		return nil
	}
	ts.remove(i)
	return nil
}

// Topics returns the number of topics with at least one subscriber. It
// locks each shard in turn, so it is meant for metrics, not hot paths.
func (h *Hub) Topics() int {
	n := 0
	for i := range h.shards {
		sh := &h.shards[i]
		sh.mu.RLock()
		n += len(sh.topics)
		sh.mu.RUnlock()
	}
	return n
}

// Subscribers returns the number of subscribers of topic.
func (h *Hub) Subscribers(topic string) int {
	sh := h.shard(topic)
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	if ts := sh.topics[topic]; ts != nil {
		return len(ts.list)
	}
	return 0
}

// Close drops every subscription. After it returns no Deliver is running
// or will start, Publish and Subscribe return [net.ErrClosed], and
// Unsubscribe is a no-op. Close is idempotent and always returns nil.
func (h *Hub) Close() error {
	h.closed.Store(true)
	for i := range h.shards {
		sh := &h.shards[i]
		sh.mu.Lock()
		sh.topics = nil // Subscribe checks closed before adding; Unsubscribe finds nothing
		sh.mu.Unlock()
	}
	return nil
}
