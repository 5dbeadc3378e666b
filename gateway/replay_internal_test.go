package gateway

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/syncgate/syncgate/frames"
	"github.com/syncgate/syncgate/storage"
)

// memLog is a persisted topic's stream held in memory, for tests that
// run the replay in a synctest bubble: Head and Read answer from recs,
// and WaitID waits for ctx (nothing is appended). Its other StreamLog
// methods are not implemented.
type memLog struct {
	StreamLog
	info storage.Info
	recs [][]byte // the record at offset i+1
}

func newMemLog(recs [][]byte) *memLog {
	return &memLog{recs: recs, info: storage.Info{
		ID: 1, CreatedAt: time.Unix(1, 0), ContentType: "application/json",
		Tail: storage.FormatOffset(uint64(len(recs))),
	}}
}

func (l *memLog) Head(ctx context.Context, name string) (storage.Info, error) { return l.info, nil }

func (l *memLog) WaitID(ctx context.Context, name, after string, id uint64) error {
	<-ctx.Done()
	return ctx.Err()
}

// Read returns whole records after `after` within maxBytes, each counted
// as storage.DB counts it (at least one).
func (l *memLog) Read(ctx context.Context, name, after string, maxBytes int) (storage.ReadResult, error) {
	pos, err := storage.ParseOffset(after)
	if err != nil {
		return storage.ReadResult{}, err
	}
	res := storage.ReadResult{ID: l.info.ID, Next: after, Tail: l.info.Tail, ContentType: l.info.ContentType}
	for budget := 0; pos < uint64(len(l.recs)); pos++ {
		rec := l.recs[pos]
		if budget += len(rec) + storage.ReadRecordCost; len(res.Records) > 0 && budget > maxBytes {
			break
		}
		res.Next = storage.FormatOffset(pos + 1)
		res.Records = append(res.Records, storage.Record{Offset: res.Next, Data: rec})
	}
	res.UpToDate = res.Next == res.Tail
	return res, nil
}

// A session's replays share its send queue: however many of its
// subscriptions resume at once, what they queue stays within three
// quarters of the queue while its writer is stuck on a client that reads
// nothing, so the session is not closed as a slow consumer (4001); once
// the writer drains it, every record arrives, in order. Each replayer
// used to keep the queue below half on its own and then queue a page of
// up to a quarter of it: eight at once went over.
func TestReplay_ConcurrentResumesStayWithinTheSendQueue(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		testReplayWithinQueue(t, 8, 300, `{"pad":"`+strings.Repeat("x", 200)+`"}`)
	})
}

// testReplayWithinQueue resumes subs subscriptions of one session from
// the start of a log of n records rec, taking the session's queue only
// when every replayer waits, as a writer stuck on a socket would.
func testReplayWithinQueue(t *testing.T, subs, n int, rec string) {
	const queue, topic = 128 << 10, "chat:replay"
	recs := make([][]byte, n)
	for i := range recs {
		recs[i] = []byte(rec)
	}
	srv, err := New(Config{Log: newMemLog(recs), Persist: []string{"chat:*"}, SendQueueBytes: queue, Writers: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := newSession(ctx, srv, nil, nil, "id", "test")
	s.q.writing = true // a writer is stuck: frames stay queued until the test takes them
	var all []*subscription
	t.Cleanup(func() { // in the bubble, before it must be empty
		for _, sub := range all {
			_ = srv.transport.Unsubscribe(ctx, topic, sub)
			sub.endPersisted()
		}
		cancel()
		if err := srv.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	})
	for i := range subs {
		sid := fmt.Sprint("s", i)
		sub := &subscription{s: s, sid: sid, topic: topic, prefix: frames.AppendPatchPrefix(nil, sid)}
		f := &frames.Subscribe{Op: frames.OpAdd, SID: sid, Target: frames.Target{Kind: frames.TargetTopic, Topic: topic,
			Cursor: &frames.Cursor{QID: "topic:" + topic, LSN: storage.ZeroOffset, IDs: []string{}, At: 1}}}
		if err := s.subscribePersisted(ctx, f, sub); err != nil {
			t.Fatal(err)
		}
		all = append(all, sub)
	}
	got := map[string]int{}
	for {
		synctest.Wait() // each replayer has queued what it may
		s.q.mu.Lock()
		queued, reason, items := s.q.bytes, s.q.reason, len(s.q.items)
		s.q.mu.Unlock()
		if reason != reasonNone {
			t.Fatalf("session closed (%v) after %v of %d records each", reason, got, n)
		}
		if queued > queue*3/4 {
			t.Fatalf("%d bytes queued, over three quarters of the queue's %d", queued, queue)
		}
		if items == 0 {
			break
		}
		taken, _, _, _ := s.q.next(nil) // the writer takes the queue
		for _, it := range taken {
			f, err := frames.Decode(append(append([]byte(nil), it.prefix...), it.body...))
			if err != nil {
				t.Fatal(err)
			}
			p, ok := f.(*frames.Patch)
			if !ok {
				continue // the resumes' acks and snapshots
			}
			for _, op := range p.Patches {
				if want := storage.FormatOffset(uint64(got[p.SID] + 1)); op.LSN != want {
					t.Fatalf("%s: insert at %s, want %s", p.SID, op.LSN, want)
				}
				got[p.SID]++
			}
		}
	}
	for _, sub := range all {
		if got[sub.sid] != n {
			t.Errorf("%s got %d of %d records", sub.sid, got[sub.sid], n)
		}
	}
}
