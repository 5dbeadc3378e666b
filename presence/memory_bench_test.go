package presence_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/syncgate/syncgate/presence"
	"github.com/syncgate/syncgate/presence/presencetest"
)

const benchMembers = 1000

// benchTopic returns a registry whose topic "room" has benchMembers
// members m0… held by h0…, already reported.
func benchTopic(b *testing.B) (*presence.MemoryRegistry, *presencetest.Clock, []string, []string) {
	clock := presencetest.NewClock()
	r := newMemory(b, presence.Config{Now: clock.Now})
	ctx := context.Background()
	ids, holders := make([]string, benchMembers), make([]string, benchMembers)
	actor := "actor"
	for i := range ids {
		ids[i], holders[i] = "m"+strconv.Itoa(i), "h"+strconv.Itoa(i)
		m := presence.Member{ID: ids[i], ActorID: &actor, Meta: json.RawMessage(`{"cursor":[0,0]}`)}
		if _, err := r.Join(ctx, "room", holders[i], m); err != nil {
			b.Fatal(err)
		}
	}
	clock.Advance(time.Second)
	if _, err := r.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	return r, clock, ids, holders
}

// BenchmarkMemoryRegistry_Join: a second holder joins a member of a
// 1,000-member topic (a make-before-break reconnect); the cost is
// dominated by the 1,000-member Sync.
func BenchmarkMemoryRegistry_Join(b *testing.B) {
	r, _, ids, _ := benchTopic(b)
	ctx := context.Background()
	actor := "actor"
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		m := presence.Member{ID: ids[i%benchMembers], ActorID: &actor, Meta: json.RawMessage(`{"cursor":[0,0]}`)}
		s, err := r.Join(ctx, "room", "new"+strconv.Itoa(i%benchMembers), m)
		if err != nil || len(s.Members) != benchMembers {
			b.Fatal(err, len(s.Members))
		}
		i++
	}
}

// BenchmarkMemoryRegistry_Update: meta updates spread over a 1,000-member
// topic.
func BenchmarkMemoryRegistry_Update(b *testing.B) {
	r, clock, ids, holders := benchTopic(b)
	ctx := context.Background()
	actor := "actor"
	metas := make([]json.RawMessage, 64)
	for i := range metas {
		metas[i] = json.RawMessage(`{"cursor":[` + strconv.Itoa(i) + `,0]}`)
	}
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		if i%benchMembers == 0 {
			clock.Advance(time.Millisecond)
		}
		m := presence.Member{ID: ids[i%benchMembers], ActorID: &actor, Meta: metas[i%len(metas)], UpdatedAt: clock.Now().UnixMilli()}
		if err := r.Update(ctx, "room", holders[i%benchMembers], m); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkMemoryRegistry_Flush: one window of 1,000 members each
// updating once per second (100 updates per 100 ms window) and the Flush
// that closes it. ns/update is the registry's CPU per update, Flush
// included.
func BenchmarkMemoryRegistry_Flush(b *testing.B) {
	r, clock, ids, holders := benchTopic(b)
	ctx := context.Background()
	actor := "actor"
	const perWindow = benchMembers / 10 // 1,000 updates/s over 100 ms windows
	metas := [2]json.RawMessage{json.RawMessage(`{"cursor":[1,0]}`), json.RawMessage(`{"cursor":[2,0]}`)}
	next, round := 0, 0
	b.ReportAllocs()
	for b.Loop() {
		for range perWindow {
			m := presence.Member{ID: ids[next], ActorID: &actor, Meta: metas[round%2], UpdatedAt: clock.Now().UnixMilli()}
			if err := r.Update(ctx, "room", holders[next], m); err != nil {
				b.Fatal(err)
			}
			if next++; next == benchMembers {
				next, round = 0, round+1
			}
			clock.Advance(time.Millisecond)
		}
		ds, err := r.Flush(ctx)
		if err != nil || len(ds) != 1 || len(ds[0].Updates) != perWindow {
			b.Fatalf("Flush = %d diffs, %v", len(ds), err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*perWindow), "ns/update")
}
