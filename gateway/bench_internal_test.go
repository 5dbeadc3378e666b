package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
)

// BenchmarkServer_PublishFanout measures the server's in-process work per
// publish to N subscribers: offset, encode once, hub delivery into N send
// queues, and the writers' swap (no sockets).
func BenchmarkServer_PublishFanout(b *testing.B) {
	for _, n := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("subs=%d", n), func(b *testing.B) {
			srv, err := New(Config{SendQueueMessages: 1 << 30, SendQueueBytes: 1 << 30})
			if err != nil {
				b.Fatal(err)
			}
			defer srv.Shutdown(context.Background())
			sessions := make([]*session, n)
			for i := range sessions {
				s := newSession(context.Background(), srv, nil, nil, fmt.Sprint(i), "bench")
				sub := &subscription{s: s, sid: "s", topic: "t", prefix: []byte(`{"type":"patch","v":1,"sid":"s"`)}
				if err := srv.subscribe(context.Background(), sub, func(string) {}); err != nil {
					b.Fatal(err)
				}
				sessions[i] = s
			}
			data := json.RawMessage(`{"t":1234567890123456789,"p":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}`)
			spare := make([][]outItem, n)
			for _, s := range sessions {
				s.q.writing = true // no writer goroutines: the loop below drains
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if _, err := srv.publish(context.Background(), "t", nil, data); err != nil {
					b.Fatal(err)
				}
				if i%64 == 63 {
					for j, s := range sessions {
						s.q.mu.Lock()
						spare[j], s.q.items = s.q.items, spare[j][:0]
						s.q.bytes = 0
						s.q.mu.Unlock()
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/delivery")
		})
	}
}
