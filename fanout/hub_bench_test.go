package fanout_test

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/syncgate/syncgate/fanout"
)

// benchSub is the cheapest realistic subscriber: one uncontended atomic
// add, standing in for a non-blocking enqueue.
type benchSub struct{ n atomic.Uint64 }

func (s *benchSub) Deliver(*fanout.Message) { s.n.Add(1) }

func BenchmarkHub_Publish(b *testing.B) {
	for _, subs := range []int{0, 1, 100, 1000, 10000} {
		b.Run(fmt.Sprintf("subs=%d", subs), func(b *testing.B) {
			h := newHub(b, fanout.HubConfig{})
			ctx := context.Background()
			for range subs {
				if err := h.Subscribe(ctx, "room", &benchSub{}); err != nil {
					b.Fatal(err)
				}
			}
			data := []byte(`{"v":1,"type":"patch","sid":"s1","patches":[],"lsn":42}`)
			b.ReportAllocs()
			for b.Loop() {
				if err := h.Publish(ctx, "room", data); err != nil {
					b.Fatal(err)
				}
			}
			if subs > 0 {
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(subs), "ns/delivery")
			}
		})
	}
}

// BenchmarkHub_PublishParallel publishes from GOMAXPROCS goroutines over
// many topics, so shards, not one lock, are what contends.
func BenchmarkHub_PublishParallel(b *testing.B) {
	const topics, subsPerTopic = 1024, 10
	h := newHub(b, fanout.HubConfig{})
	ctx := context.Background()
	names := make([]string, topics)
	for i := range names {
		names[i] = "room:" + strconv.Itoa(i)
		for range subsPerTopic {
			if err := h.Subscribe(ctx, names[i], &benchSub{}); err != nil {
				b.Fatal(err)
			}
		}
	}
	data := []byte(`{"v":1,"type":"patch"}`)
	var next atomic.Uint64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := next.Add(7919) // spread goroutines over different topics
		for pb.Next() {
			i++
			if err := h.Publish(ctx, names[i%topics], data); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkHub_SubscribeUnsubscribe joins and leaves a topic that already
// has existing subscribers: O(1) per operation once the topic is indexed.
func BenchmarkHub_SubscribeUnsubscribe(b *testing.B) {
	for _, existing := range []int{0, 1000, 100000} {
		b.Run(fmt.Sprintf("existing=%d", existing), func(b *testing.B) {
			h := newHub(b, fanout.HubConfig{})
			ctx := context.Background()
			for range existing {
				if err := h.Subscribe(ctx, "room", &benchSub{}); err != nil {
					b.Fatal(err)
				}
			}
			s := &benchSub{}
			b.ReportAllocs()
			for b.Loop() {
				if err := h.Subscribe(ctx, "room", s); err != nil {
					b.Fatal(err)
				}
				if err := h.Unsubscribe(ctx, "room", s); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
