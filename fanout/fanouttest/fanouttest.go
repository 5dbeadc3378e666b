// Package fanouttest is the contract suite every [fanout.Transport] backend
// must pass unchanged. Start with [Run]; call it from one test per backend:
//
//	func TestHub_Contract(t *testing.T) {
//		fanouttest.Run(t, func(t *testing.T) fanout.Transport {
//			h := fanout.NewHub(fanout.HubConfig{})
//			t.Cleanup(func() { h.Close() })
//			return h
//		})
//	}
//
// Backends may deliver asynchronously: the suite waits for deliveries with
// a deadline ([WaitTimeout]) and never sleeps. It checks only the
// [fanout.Transport] contract, not in-process properties of the Hub such as
// every subscriber seeing the same *Message.
package fanouttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncgate/syncgate/fanout"
)

// Run runs the contract suite as parallel subtests of t. newTransport is
// called once per subtest and must return a fresh transport whose cleanup
// it registers with t.Cleanup. Subtests run in parallel; their topic names
// are unique per subtest and use only [A-Za-z0-9_-], so transports may share
// one backing server (subjects on one NATS server, say).
func Run(t *testing.T, newTransport func(t *testing.T) fanout.Transport) {
	tests := []struct {
		name string
		fn   func(t *testing.T, tr fanout.Transport)
	}{
		{"Deliver", testDeliver},
		{"OrderPerPublisher", testOrderPerPublisher},
		{"ManySubscribers", testManySubscribers},
		{"TopicIsolation", testTopicIsolation},
		{"UnsubscribeOneTopic", testUnsubscribeOneTopic},
		{"NoDeliveryAfterUnsubscribe", testNoDeliveryAfterUnsubscribe},
		{"Resubscribe", testResubscribe},
		{"SubscribeIdempotent", testSubscribeIdempotent},
		{"UnsubscribeUnknown", testUnsubscribeUnknown},
		{"ConcurrentChurn", testConcurrentChurn},
		{"PublishCancelledContext", testPublishCancelledContext},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, newTransport(t))
		})
	}
}

// testDeliver: one subscriber gets what is published, bytes intact.
func testDeliver(t *testing.T, tr fanout.Transport) {
	ctx := t.Context()
	topic := topicName(t, "t")
	mustPublish(t, tr, topic, []byte("nobody listens")) // no subscribers: dropped, not an error

	r := NewRecorder()
	mustSubscribe(t, tr, topic, r)
	all := make([]byte, 256) // every byte value, NUL and '\n' included
	for i := range all {
		all[i] = byte(i)
	}
	mustPublish(t, tr, topic, all)
	mustPublish(t, tr, topic, []byte{})
	// A third publish marks the end: a second delivery of either of the
	// first two arrives before it (order per publisher), so the count up
	// to it is exact. (WaitN returns at least what it waits for.)
	mustPublish(t, tr, topic, []byte("end"))

	msgs := r.WaitN(t, 3)
	if len(msgs) != 3 || string(msgs[2].Data) != "end" {
		t.Fatalf("got %d messages before the end marker, want 2", len(msgs)-1)
	}
	for i, want := range [][]byte{all, {}} {
		m := msgs[i]
		if m.Topic != topic {
			t.Errorf("message %d: Topic = %q, want %q", i, m.Topic, topic)
		}
		if !bytes.Equal(m.Data, want) {
			t.Errorf("message %d: Data = %q, want %q", i, m.Data, want)
		}
		if m.At.IsZero() {
			t.Errorf("message %d: At is zero", i)
		}
	}
	if err := tr.Unsubscribe(ctx, topic, r); err != nil {
		t.Fatalf("Unsubscribe: %v", err)
	}
}

// testOrderPerPublisher: messages from one goroutine arrive in order at
// every subscriber.
func testOrderPerPublisher(t *testing.T, tr fanout.Transport) {
	const subscribers, messages = 4, 1000
	topic := topicName(t, "t")
	rs := make([]*Recorder, subscribers)
	for i := range rs {
		rs[i] = NewRecorder()
		mustSubscribe(t, tr, topic, rs[i])
	}
	for i := range messages {
		mustPublish(t, tr, topic, seq(i))
	}
	for i, r := range rs {
		checkSeq(t, fmt.Sprintf("subscriber %d", i), r.WaitN(t, messages), messages)
	}
}

// testManySubscribers: every subscriber of a busy topic gets every message.
func testManySubscribers(t *testing.T, tr fanout.Transport) {
	const subscribers, messages = 200, 10
	topic := topicName(t, "t")
	rs := make([]*Recorder, subscribers)
	for i := range rs {
		rs[i] = NewRecorder()
		mustSubscribe(t, tr, topic, rs[i])
	}
	for i := range messages {
		mustPublish(t, tr, topic, seq(i))
	}
	for i, r := range rs {
		checkSeq(t, fmt.Sprintf("subscriber %d", i), r.WaitN(t, messages), messages)
	}
}

// testTopicIsolation: a subscriber gets only its own topic's messages, also
// when another topic's name extends its own.
func testTopicIsolation(t *testing.T, tr fanout.Transport) {
	names := []string{"a", "b", "a_b"}
	rs := make([]*Recorder, len(names))
	for i, name := range names {
		rs[i] = NewRecorder()
		mustSubscribe(t, tr, topicName(t, name), rs[i])
	}
	// Two rounds: the second gives a misrouted message of the first time
	// to arrive before the counts are checked.
	for round := range 2 {
		for _, name := range names {
			mustPublish(t, tr, topicName(t, name), []byte(fmt.Sprintf("%s/%d", name, round)))
		}
	}
	for i, name := range names {
		// At least 2 (WaitN); a misrouted one is caught by its topic.
		msgs := rs[i].WaitN(t, 2)
		for _, m := range msgs {
			if m.Topic != topicName(t, name) || !strings.HasPrefix(string(m.Data), name+"/") {
				t.Errorf("subscriber of %q got %q on topic %q", name, m.Data, m.Topic)
			}
		}
	}
}

// testUnsubscribeOneTopic: a subscriber of two topics that unsubscribes
// from one still gets the other's messages, and no more of the first's
// (a backend keyed by subscriber alone would drop both).
func testUnsubscribeOneTopic(t *testing.T, tr fanout.Transport) {
	a, b := topicName(t, "a"), topicName(t, "b")
	r := NewRecorder()
	mustSubscribe(t, tr, a, r)
	mustSubscribe(t, tr, b, r)
	if err := tr.Unsubscribe(t.Context(), a, r); err != nil {
		t.Fatalf("Unsubscribe: %v", err)
	}
	mustPublish(t, tr, a, []byte("a/after"))
	mustPublish(t, tr, b, []byte("b/1"))
	mustPublish(t, tr, b, []byte("b/2"))
	// Topics are not ordered with each other: wait for b's two, then
	// mark the end on a fresh subscription to a, after which a's message
	// has been delivered to everyone it was going to reach.
	r.WaitN(t, 2)
	end := NewRecorder()
	mustSubscribe(t, tr, a, end)
	mustPublish(t, tr, a, []byte("a/end"))
	end.WaitN(t, 1)
	for _, m := range r.Messages() {
		if m.Topic != b {
			t.Errorf("after unsubscribing from %q, got %q on %q", a, m.Data, m.Topic)
		}
	}
	if n := r.Len(); n != 2 {
		t.Errorf("got %d messages, want b's 2", n)
	}
}

// testNoDeliveryAfterUnsubscribe: subscribers leave one by one while
// several publishers publish continuously; once Unsubscribe has returned,
// the leaver's Deliver is never called again, and a subscriber that stays
// misses nothing.
//
// Subscribers that only count are subscribed first, so a backend delivering
// in subscription order spends time on them between picking its
// subscriber list and reaching the leavers: that is when a backend that
// does not synchronise Unsubscribe with delivery gets caught.
func testNoDeliveryAfterUnsubscribe(t *testing.T, tr fanout.Transport) {
	const publishers, leavers, fillers = 4, 8, 32
	topic := topicName(t, "t")
	for range fillers {
		mustSubscribe(t, tr, topic, &counter{})
	}
	keeper := NewRecorder()
	mustSubscribe(t, tr, topic, keeper)
	gs := make([]*lateGuard, leavers)
	for i := range gs {
		gs[i] = &lateGuard{Recorder: NewRecorder()}
		mustSubscribe(t, tr, topic, gs[i])
	}

	pubCtx, stop := context.WithCancel(t.Context())
	var total atomic.Int64 // published by all publishers, for flow control
	counts := make([]int, publishers)
	errs := make([]error, publishers)
	var wg sync.WaitGroup
	for p := range publishers {
		wg.Go(func() { counts[p], errs[p] = publishUntil(pubCtx, tr, topic, p, &total, keeper) })
	}
	stopped := false
	stopPublishers := func() {
		if !stopped {
			stopped = true
			stop()
			wg.Wait()
		}
	}
	defer stopPublishers() // the owner waits for its publishers even on t.Fatal

	for i, g := range gs {
		keeper.WaitN(t, keeper.Len()+50) // the stream is flowing
		g.WaitN(t, 1)                    // also to g: it leaves mid-stream
		if err := tr.Unsubscribe(t.Context(), topic, g); err != nil {
			t.Fatalf("Unsubscribe %d: %v", i, err)
		}
		g.gone.Store(true)
	}
	keeper.WaitN(t, keeper.Len()+200) // keep publishing after the last Unsubscribe
	stopPublishers()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("publishers: %v", err)
	}

	// A marker behind everything published: once keeper has it, an
	// asynchronous backend has had its chance to misdeliver to the leavers.
	mustPublish(t, tr, topic, []byte("marker"))
	n := int(total.Load())
	msgs := keeper.WaitN(t, n+1)
	if len(msgs) != n+1 || string(msgs[n].Data) != "marker" {
		t.Errorf("keeper: got %d messages, last %q; want %d then the marker", len(msgs), msgs[len(msgs)-1].Data, n)
	}
	checkPublishers(t, "keeper", msgs[:min(n, len(msgs))], counts)
	for i, g := range gs {
		if late := g.late.Load(); late != 0 {
			t.Errorf("leaver %d: Deliver called %d times after Unsubscribe returned", i, late)
		}
	}
}

// publishUntil publishes "p:0", "p:1", ... to topic until ctx is done and
// returns how many it published. It keeps the publishers at most window
// messages ahead of keeper so an asynchronous backend is not flooded into
// dropping.
func publishUntil(ctx context.Context, tr fanout.Transport, topic string, p int, total *atomic.Int64, keeper *Recorder) (int, error) {
	const window = 256
	for n := 0; ; n++ {
		if ctx.Err() != nil {
			return n, nil
		}
		data := fmt.Appendf(nil, "%d:%d", p, n)
		if err := tr.Publish(context.Background(), topic, data); err != nil {
			return n, fmt.Errorf("publisher %d: Publish #%d: %w", p, n, err)
		}
		if sent := int(total.Add(1)); sent > window {
			if _, err := keeper.Wait(ctx, sent-window); err != nil {
				return n + 1, nil // stopped
			}
		}
	}
}

// checkPublishers reports unless msgs holds, for every publisher p,
// exactly "p:0" .. "p:<counts[p]-1>" in that order, interleaved in any way.
func checkPublishers(t *testing.T, who string, msgs []*fanout.Message, counts []int) {
	t.Helper()
	next := make([]int, len(counts))
	for _, m := range msgs {
		ps, ns, ok := strings.Cut(string(m.Data), ":")
		p, err1 := strconv.Atoi(ps)
		n, err2 := strconv.Atoi(ns)
		if !ok || err1 != nil || err2 != nil || p < 0 || p >= len(counts) {
			t.Errorf("%s: unexpected message %q", who, m.Data)
			return
		}
		if n != next[p] {
			t.Errorf("%s: publisher %d: got message %d, want %d (lost, duplicated or reordered)", who, p, n, next[p])
			return
		}
		next[p]++
	}
	for p, want := range counts {
		if next[p] != want {
			t.Errorf("%s: publisher %d: got %d messages, want %d", who, p, next[p], want)
		}
	}
}

// lateGuard counts deliveries after gone is set.
type lateGuard struct {
	*Recorder
	gone atomic.Bool
	late atomic.Int64
}

func (g *lateGuard) Deliver(m *fanout.Message) {
	if g.gone.Load() {
		g.late.Add(1)
	}
	g.Recorder.Deliver(m)
}

// testResubscribe: a topic whose last subscriber left works again for a
// new subscription (the Hub drops the topic; natsbus drops the subject).
func testResubscribe(t *testing.T, tr fanout.Transport) {
	topic := topicName(t, "t")
	r := NewRecorder()
	mustSubscribe(t, tr, topic, r)
	mustPublish(t, tr, topic, seq(0))
	r.WaitN(t, 1)
	if err := tr.Unsubscribe(t.Context(), topic, r); err != nil {
		t.Fatalf("Unsubscribe: %v", err)
	}
	mustPublish(t, tr, topic, []byte("while away"))
	mustSubscribe(t, tr, topic, r)
	mustPublish(t, tr, topic, seq(1))
	msgs := r.WaitN(t, 2)
	checkSeq(t, "resubscriber", msgs, 2)
}

// testSubscribeIdempotent: subscribing twice delivers once, and a single
// Unsubscribe undoes both.
func testSubscribeIdempotent(t *testing.T, tr fanout.Transport) {
	const messages = 3
	topic := topicName(t, "t")
	r := NewRecorder()
	witness := NewRecorder()
	mustSubscribe(t, tr, topic, r)
	mustSubscribe(t, tr, topic, r)
	mustSubscribe(t, tr, topic, witness)
	for i := range messages {
		mustPublish(t, tr, topic, seq(i))
	}
	witness.WaitN(t, messages)
	r.WaitN(t, messages)
	if err := tr.Unsubscribe(t.Context(), topic, r); err != nil {
		t.Fatalf("Unsubscribe: %v", err)
	}
	// Unsubscribe has returned, so r's count is final: a duplicate
	// delivery would have to have happened already.
	mustPublish(t, tr, topic, []byte("marker"))
	witness.WaitN(t, messages+1)
	checkSeq(t, "double subscriber", r.Messages(), messages)
}

// testUnsubscribeUnknown: unsubscribing what is not subscribed is not an
// error and disturbs nobody.
func testUnsubscribeUnknown(t *testing.T, tr fanout.Transport) {
	ctx := t.Context()
	topic := topicName(t, "t")
	stranger, r := NewRecorder(), NewRecorder()
	if err := tr.Unsubscribe(ctx, topicName(t, "never"), stranger); err != nil {
		t.Errorf("Unsubscribe of a never-used topic: %v", err)
	}
	mustSubscribe(t, tr, topic, r)
	if err := tr.Unsubscribe(ctx, topic, stranger); err != nil {
		t.Errorf("Unsubscribe of a non-subscriber: %v", err)
	}
	mustPublish(t, tr, topic, seq(0))
	checkSeq(t, "subscriber", r.WaitN(t, 1), 1)
	for i := range 2 {
		if err := tr.Unsubscribe(ctx, topic, r); err != nil {
			t.Errorf("Unsubscribe #%d: %v", i+1, err)
		}
	}
}

// testConcurrentChurn: many goroutines publish, subscribe and unsubscribe
// on a few shared topics at once; it must finish (no deadlock), stay
// race-free, and leave the transport working.
func testConcurrentChurn(t *testing.T, tr fanout.Transport) {
	const workers, rounds = 8, 300
	ctx := t.Context()
	topics := []string{topicName(t, "a"), topicName(t, "b"), topicName(t, "c"), topicName(t, "d")}

	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			subs := []*counter{{}, {}}
			for i := range rounds {
				topic, s := topics[(w+i)%len(topics)], subs[i%len(subs)]
				var err error
				switch (7*i + w) % 3 {
				case 0:
					err = tr.Subscribe(ctx, topic, s)
				case 1:
					err = tr.Publish(ctx, topic, seq(i))
				case 2:
					err = tr.Unsubscribe(ctx, topic, s)
				}
				if err != nil {
					t.Errorf("worker %d round %d: %v", w, i, err)
					return
				}
			}
			for _, topic := range topics {
				for _, s := range subs {
					if err := tr.Unsubscribe(ctx, topic, s); err != nil {
						t.Errorf("worker %d cleanup: %v", w, err)
					}
				}
			}
		})
	}
	finished := make(chan struct{})
	go func() {
		wg.Wait()
		close(finished)
	}()
	timer := time.NewTimer(WaitTimeout)
	defer timer.Stop()
	select {
	case <-finished:
	case <-timer.C:
		t.Fatalf("churn did not finish within %v: deadlock?", WaitTimeout)
	}

	r := NewRecorder()
	mustSubscribe(t, tr, topics[0], r)
	mustPublish(t, tr, topics[0], seq(0))
	checkSeq(t, "subscriber after churn", r.WaitN(t, 1), 1)
}

// counter is a subscriber that only counts.
type counter struct{ n atomic.Int64 }

func (c *counter) Deliver(*fanout.Message) { c.n.Add(1) }

// testPublishCancelledContext: Publish with a cancelled ctx fails with
// ctx's error and delivers nothing.
func testPublishCancelledContext(t *testing.T, tr fanout.Transport) {
	topic := topicName(t, "t")
	r := NewRecorder()
	mustSubscribe(t, tr, topic, r)
	cctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := tr.Publish(cctx, topic, []byte("cancelled"))
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Publish with cancelled ctx = %v, want an error wrapping context.Canceled", err)
	}
	// Two markers, the second published after the first arrived: a
	// backend that delivered the refused message late, after the first
	// marker, shows it before the second.
	mustPublish(t, tr, topic, []byte("marker"))
	r.WaitN(t, 1)
	mustPublish(t, tr, topic, []byte("marker2"))
	msgs := r.WaitN(t, 2)
	var got []string
	for _, m := range msgs {
		got = append(got, string(m.Data))
	}
	if len(got) != 2 || got[0] != "marker" || got[1] != "marker2" {
		t.Errorf("got %q; want only the two markers", got)
	}
}

// topicName returns a topic unique to t and name, made of [A-Za-z0-9_-].
func topicName(t *testing.T, name string) string {
	clean := strings.Map(func(r rune) rune {
		if 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '_' {
			return r
		}
		return '-'
	}, t.Name())
	return clean + "-" + name
}

func seq(i int) []byte { return strconv.AppendInt(nil, int64(i), 10) }

// checkSeq reports unless msgs is exactly seq(0) .. seq(n-1).
func checkSeq(t *testing.T, who string, msgs []*fanout.Message, n int) {
	t.Helper()
	if len(msgs) != n {
		t.Errorf("%s: got %d messages, want %d", who, len(msgs), n)
	}
	for i, m := range msgs[:min(n, len(msgs))] {
		if want := seq(i); !bytes.Equal(m.Data, want) {
			t.Errorf("%s: message %d is %q, want %q (lost, duplicated or reordered)", who, i, m.Data, want)
			return
		}
	}
}

func mustPublish(t *testing.T, tr fanout.Transport, topic string, data []byte) {
	t.Helper()
	if err := tr.Publish(t.Context(), topic, data); err != nil {
		t.Fatalf("Publish(%q): %v", topic, err)
	}
}

func mustSubscribe(t *testing.T, tr fanout.Transport, topic string, s fanout.Subscriber) {
	t.Helper()
	if err := tr.Subscribe(t.Context(), topic, s); err != nil {
		t.Fatalf("Subscribe(%q): %v", topic, err)
	}
}
