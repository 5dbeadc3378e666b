package fanout_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncgate/syncgate/fanout"
	"github.com/syncgate/syncgate/fanout/fanouttest"
)

func TestHub_Contract(t *testing.T) {
	t.Parallel()
	for _, shards := range []int{0, 1} { // default, and every topic in one shard
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			t.Parallel()
			fanouttest.Run(t, func(t *testing.T) fanout.Transport {
				return newHub(t, fanout.HubConfig{Shards: shards})
			})
		})
	}
}

// newHub returns a Hub closed when t ends.
func newHub(t testing.TB, cfg fanout.HubConfig) *fanout.Hub {
	h := fanout.NewHub(cfg)
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return h
}

// lastSub keeps the last message it got. Publish calls Deliver on the
// caller's goroutine, so synchronous tests can read m without locking.
type lastSub struct {
	m *fanout.Message
	n int
}

func (s *lastSub) Deliver(m *fanout.Message) { s.m, s.n = m, s.n+1 }

func TestHub_Publish_SameMessage(t *testing.T) {
	t.Parallel()
	at := time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC)
	h := newHub(t, fanout.HubConfig{Now: func() time.Time { return at }})
	ctx := t.Context()
	subs := make([]*lastSub, 100)
	for i := range subs {
		subs[i] = &lastSub{}
		if err := h.Subscribe(ctx, "room", subs[i]); err != nil {
			t.Fatal(err)
		}
	}
	data := []byte("encoded once")
	if err := h.Publish(ctx, "room", data); err != nil {
		t.Fatal(err)
	}
	first := subs[0].m
	if first == nil {
		t.Fatal("subscriber 0 got nothing: Publish must deliver before it returns")
	}
	if first.Topic != "room" || !first.At.Equal(at) || &first.Data[0] != &data[0] || len(first.Data) != len(data) {
		t.Errorf("message = {%q %q %v}, want topic room, the published slice itself, At %v", first.Topic, first.Data, first.At, at)
	}
	for i, s := range subs {
		if s.m != first || s.n != 1 {
			t.Errorf("subscriber %d: got %p (%d deliveries), want %p once", i, s.m, s.n, first)
		}
	}
}

// PublishAt gives the Message the time it is given, not the clock's; a
// zero time means now. (Its allocations: TestHub_Publish_Allocs.)
func TestHub_PublishAt(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC)
	h := newHub(t, fanout.HubConfig{Now: func() time.Time { return now }})
	ctx := t.Context()
	s := &lastSub{}
	if err := h.Subscribe(ctx, "room", s); err != nil {
		t.Fatal(err)
	}
	at := now.Add(-time.Second)
	if err := h.PublishAt(ctx, "room", []byte("x"), at); err != nil {
		t.Fatal(err)
	}
	if s.n != 1 || !s.m.At.Equal(at) {
		t.Fatalf("%d deliveries, At %v: want one at %v", s.n, s.m.At, at)
	}
	if err := h.PublishAt(ctx, "room", []byte("y"), time.Time{}); err != nil {
		t.Fatal(err)
	}
	if s.n != 2 || !s.m.At.Equal(now) {
		t.Fatalf("%d deliveries, At %v: want a second one at the clock's %v", s.n, s.m.At, now)
	}
}

func TestHub_Publish_Allocs(t *testing.T) {
	h := newHub(t, fanout.HubConfig{})
	ctx := context.Background()
	for range 100 {
		if err := h.Subscribe(ctx, "hot", &lastSub{}); err != nil {
			t.Fatal(err)
		}
	}
	data := []byte("payload")
	tests := []struct {
		topic string
		max   float64
	}{
		{"hot", 1}, // the one shared Message
		{"empty", 0},
	}
	for _, tc := range tests {
		allocs := testing.AllocsPerRun(100, func() {
			if err := h.Publish(ctx, tc.topic, data); err != nil {
				t.Fatal(err)
			}
		})
		if allocs > tc.max {
			t.Errorf("Publish to %q: %v allocs, want <= %v", tc.topic, allocs, tc.max)
		}
		at := time.Now()
		allocs = testing.AllocsPerRun(100, func() {
			if err := h.PublishAt(ctx, tc.topic, data, at); err != nil {
				t.Fatal(err)
			}
		})
		if allocs > tc.max {
			t.Errorf("PublishAt to %q: %v allocs, want <= %v", tc.topic, allocs, tc.max)
		}
	}
}

func TestHub_Topics_Cleanup(t *testing.T) {
	t.Parallel()
	h := newHub(t, fanout.HubConfig{})
	ctx := t.Context()
	subs := []*lastSub{{}, {}, {}}
	topics := []string{"a", "b", "c", "d", "e"}
	for _, topic := range topics {
		for _, s := range subs {
			for range 2 { // idempotent: counted once
				if err := h.Subscribe(ctx, topic, s); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if got := h.Topics(); got != len(topics) {
		t.Errorf("Topics() = %d, want %d", got, len(topics))
	}
	if got := h.Subscribers("a"); got != len(subs) {
		t.Errorf(`Subscribers("a") = %d, want %d`, got, len(subs))
	}
	for _, topic := range topics {
		for _, s := range subs {
			if err := h.Unsubscribe(ctx, topic, s); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := h.Topics(); got != 0 {
		t.Errorf("Topics() after all unsubscribed = %d, want 0", got)
	}
	if got := h.Subscribers("a"); got != 0 {
		t.Errorf(`Subscribers("a") after all unsubscribed = %d, want 0`, got)
	}
}

// TestHub_Unsubscribe_Many removes most of a hot topic's subscribers in
// random order; exactly the rest must still get each message once.
func TestHub_Unsubscribe_Many(t *testing.T) {
	t.Parallel()
	const total, keep = 1000, 10
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	h := newHub(t, fanout.HubConfig{})
	ctx := t.Context()
	subs := make([]*lastSub, total)
	for i := range subs {
		subs[i] = &lastSub{}
		if err := h.Subscribe(ctx, "hot", subs[i]); err != nil {
			t.Fatal(err)
		}
	}
	rng.Shuffle(len(subs), func(i, j int) { subs[i], subs[j] = subs[j], subs[i] })
	for _, s := range subs[keep:] {
		if err := h.Unsubscribe(ctx, "hot", s); err != nil {
			t.Fatal(err)
		}
	}
	if got := h.Subscribers("hot"); got != keep {
		t.Fatalf("Subscribers = %d, want %d", got, keep)
	}
	if err := h.Publish(ctx, "hot", []byte("x")); err != nil {
		t.Fatal(err)
	}
	for i, s := range subs {
		want := 0
		if i < keep {
			want = 1
		}
		if s.n != want {
			t.Errorf("subscriber %d got %d deliveries, want %d", i, s.n, want)
		}
	}
}

func TestHub_Subscribe_Errors(t *testing.T) {
	t.Parallel()
	h := newHub(t, fanout.HubConfig{})
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	if err := h.Subscribe(t.Context(), "a", nil); err == nil {
		t.Error("Subscribe(nil) = nil, want an error")
	}
	if err := h.Subscribe(cancelled, "a", &lastSub{}); !errors.Is(err, context.Canceled) {
		t.Errorf("Subscribe with cancelled ctx = %v, want context.Canceled", err)
	}
	if got := h.Topics(); got != 0 {
		t.Errorf("Topics() = %d after failed Subscribes, want 0", got)
	}
}

// TestHub_Unsubscribe_CancelledContext: the gateway unsubscribes while
// tearing down a session whose ctx is already cancelled.
func TestHub_Unsubscribe_CancelledContext(t *testing.T) {
	t.Parallel()
	h := newHub(t, fanout.HubConfig{})
	s := &lastSub{}
	if err := h.Subscribe(t.Context(), "a", s); err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(t.Context())
	cancel()
	if err := h.Unsubscribe(cancelled, "a", s); err != nil {
		t.Errorf("Unsubscribe with cancelled ctx = %v, want nil", err)
	}
	if got := h.Subscribers("a"); got != 0 {
		t.Errorf("Subscribers = %d after Unsubscribe with cancelled ctx, want 0", got)
	}
}

func TestHub_Close(t *testing.T) {
	t.Parallel()
	h := fanout.NewHub(fanout.HubConfig{})
	ctx := t.Context()
	s := &lastSub{}
	if err := h.Subscribe(ctx, "a", s); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := h.Close(); err != nil {
			t.Errorf("Close #%d = %v, want nil", i+1, err)
		}
	}
	if err := h.Publish(ctx, "a", []byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Publish after Close = %v, want net.ErrClosed", err)
	}
	if err := h.Subscribe(ctx, "a", s); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Subscribe after Close = %v, want net.ErrClosed", err)
	}
	if err := h.Unsubscribe(ctx, "a", s); err != nil {
		t.Errorf("Unsubscribe after Close = %v, want nil", err)
	}
	if s.n != 0 {
		t.Errorf("subscriber got %d deliveries after Close", s.n)
	}
	if got := h.Topics(); got != 0 {
		t.Errorf("Topics() after Close = %d, want 0", got)
	}
}

// TestHub_Close_StopsDelivery: once Close returns, no Deliver runs or
// starts, even with publishers still going.
func TestHub_Close_StopsDelivery(t *testing.T) {
	t.Parallel()
	h := fanout.NewHub(fanout.HubConfig{})
	ctx := t.Context()
	s := &closeGuard{delivered: make(chan struct{}, 1)}
	if err := h.Subscribe(ctx, "a", s); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for h.Publish(ctx, "a", []byte("x")) == nil {
			}
		})
	}
	<-s.delivered // publishers are running
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	s.closed.Store(true)
	wg.Wait() // every publisher has seen net.ErrClosed
	if n := s.late.Load(); n != 0 {
		t.Errorf("Deliver called %d times after Close returned", n)
	}
}

type closeGuard struct {
	delivered chan struct{}
	closed    atomic.Bool
	late      atomic.Int64
}

func (g *closeGuard) Deliver(*fanout.Message) {
	if g.closed.Load() {
		g.late.Add(1)
	}
	select {
	case g.delivered <- struct{}{}:
	default:
	}
}

// TestHub_Publish_DeliverPanics: a panicking subscriber must not leave its
// shard locked.
func TestHub_Publish_DeliverPanics(t *testing.T) {
	t.Parallel()
	h := newHub(t, fanout.HubConfig{Shards: 1})
	ctx := t.Context()
	if err := h.Subscribe(ctx, "a", panicSub{}); err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("Publish did not propagate the subscriber's panic")
			}
		}()
		_ = h.Publish(ctx, "a", nil)
	}()
	if err := h.Unsubscribe(ctx, "a", panicSub{}); err != nil { // would deadlock on a held lock
		t.Fatal(err)
	}
	if got := h.Topics(); got != 0 {
		t.Errorf("Topics() = %d, want 0", got)
	}
}

type panicSub struct{}

func (panicSub) Deliver(*fanout.Message) { panic("subscriber bug") }

func ExampleHub() {
	h := fanout.NewHub(fanout.HubConfig{})
	defer h.Close()
	ctx := context.Background()

	s := &printSub{name: "alice"}
	_ = h.Subscribe(ctx, "room:1", s)
	_ = h.Publish(ctx, "room:1", []byte(`{"hello":"world"}`))
	_ = h.Unsubscribe(ctx, "room:1", s)
	_ = h.Publish(ctx, "room:1", []byte("nobody hears this"))
	fmt.Println("topics:", h.Topics())
	// Output:
	// alice got room:1 {"hello":"world"}
	// topics: 0
}

// printSub stands in for a gateway session, which would enqueue m.Data
// into its bounded send queue instead of printing.
type printSub struct{ name string }

func (s *printSub) Deliver(m *fanout.Message) { fmt.Println(s.name, "got", m.Topic, string(m.Data)) }

// TestHub_SubscribersModel drives one topic through random joins, repeated
// joins and leaves across the size where its index is built and dropped
// (2,000 steps at 10% joins, then 2,000 at 80%, and so on), and checks it
// against a plain set: the count and the index's agreement with the list
// after every step, and after every 50th, that a publish reaches each
// member exactly once and nobody else. It also counts how often the index
// was built and dropped, so a change of thresholds cannot quietly leave
// either path untested.
func TestHub_SubscribersModel(t *testing.T) {
	t.Parallel()
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	h := newHub(t, fanout.HubConfig{})
	ctx := t.Context()
	pool := make([]*lastSub, 120)
	for i := range pool {
		pool[i] = &lastSub{}
	}
	in := make(map[*lastSub]bool)
	builds, drops := 0, 0
	indexed := false
	for step := range 20000 {
		s := pool[rng.IntN(len(pool))]
		// Drift the size up and down so it crosses the index threshold
		// both ways many times.
		join := rng.IntN(100) < 10+70*int(step/2000%2)
		if join {
			if err := h.Subscribe(ctx, "t", s); err != nil {
				t.Fatal(err)
			}
			in[s] = true
		} else {
			if err := h.Unsubscribe(ctx, "t", s); err != nil {
				t.Fatal(err)
			}
			delete(in, s)
		}
		if got := h.Subscribers("t"); got != len(in) {
			t.Fatalf("step %d: Subscribers = %d, want %d", step, got, len(in))
		}
		if err := fanout.CheckIndex(h, "t"); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		switch now := fanout.Indexed(h, "t"); {
		case now && !indexed:
			builds++
		case !now && indexed:
			drops++
		}
		indexed = fanout.Indexed(h, "t")
		if step%50 != 0 {
			continue
		}
		before := make([]int, len(pool))
		for i, p := range pool {
			before[i] = p.n
		}
		if err := h.Publish(ctx, "t", []byte("x")); err != nil {
			t.Fatal(err)
		}
		for i, p := range pool {
			want := before[i]
			if in[p] {
				want++
			}
			if p.n != want {
				t.Fatalf("step %d: subscriber %d (member %v) got %d deliveries, want %d", step, i, in[p], p.n-before[i], want-before[i])
			}
		}
	}
	if builds < 3 || drops < 3 {
		t.Fatalf("the index was built %d and dropped %d times; the walk must cross both thresholds several times", builds, drops)
	}
}
