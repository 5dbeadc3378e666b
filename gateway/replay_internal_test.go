package gateway

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
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

// bubbleSession is a session of a gateway persisting chat:* on log, made
// in a synctest bubble, whose writer is stuck: frames stay queued until
// the test takes them (take). Its subscriptions, and the gateway, end in
// the test's cleanup, in the bubble.
type bubbleSession struct {
	srv  *Server
	s    *session
	ctx  context.Context
	subs []*subscription
}

func newBubbleSession(t *testing.T, log StreamLog, queue int) *bubbleSession {
	t.Helper()
	return newBubbleSessionWith(t, Config{Log: log, Persist: []string{"chat:*"}, SendQueueBytes: queue, Writers: -1})
}

// newBubbleSessionWith is newBubbleSession on a gateway made with cfg.
func newBubbleSessionWith(t *testing.T, cfg Config) *bubbleSession {
	t.Helper()
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b := &bubbleSession{srv: srv, s: newSession(ctx, srv, nil, nil, "id", "test"), ctx: ctx}
	b.s.q.writing = true // a writer is stuck
	t.Cleanup(func() {   // in the bubble, before it must be empty
		for _, sub := range b.subs {
			_ = srv.transport.Unsubscribe(ctx, sub.topic, sub)
			sub.endPersisted()
		}
		cancel()
		if err := srv.Shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return b
}

// subscribe subscribes sid to topic, resuming from cursor unless nil.
func (b *bubbleSession) subscribe(t *testing.T, sid, topic string, cursor *frames.Cursor) *subscription {
	t.Helper()
	sub := &subscription{s: b.s, sid: sid, topic: topic, prefix: frames.AppendPatchPrefix(nil, sid)}
	f := &frames.Subscribe{Op: frames.OpAdd, SID: sid, Target: frames.Target{Kind: frames.TargetTopic, Topic: topic, Cursor: cursor}}
	if err := b.s.subscribePersisted(b.ctx, f, sub); err != nil {
		t.Fatal(err)
	}
	b.subs = append(b.subs, sub)
	return sub
}

// take takes what the session has queued, as its writer would, and
// decodes it.
func (b *bubbleSession) take(t *testing.T) []frames.Frame {
	t.Helper()
	b.s.q.mu.Lock()
	empty := len(b.s.q.items) == 0
	b.s.q.mu.Unlock()
	if empty {
		return nil // next would stop the writer, and the session start one
	}
	taken, _, _, _ := b.s.q.next(nil)
	fs := make([]frames.Frame, 0, len(taken))
	for _, it := range taken {
		f, err := frames.Decode(append(append([]byte(nil), it.prefix...), it.body...))
		if err != nil {
			t.Fatal(err)
		}
		fs = append(fs, f)
	}
	return fs
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
	b := newBubbleSession(t, newMemLog(recs), queue)
	s := b.s
	var all []*subscription
	for i := range subs {
		all = append(all, b.subscribe(t, fmt.Sprint("s", i), topic, &frames.Cursor{QID: "topic:" + topic, LSN: storage.ZeroOffset, IDs: []string{}, At: 1}))
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
		for _, f := range b.take(t) { // the writer takes the queue
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

// growLog is a memLog that grows (add) and holds the tailer's WaitID
// until open is closed: a tailer that has not woken yet for what another
// node, or this one's other sessions, delivered first.
type growLog struct {
	*memLog
	open chan struct{}
	mu   sync.Mutex // guards memLog's info and recs
}

func newGrowLog() *growLog { return &growLog{memLog: newMemLog(nil), open: make(chan struct{})} }

func (l *growLog) Head(ctx context.Context, name string) (storage.Info, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.memLog.Head(ctx, name)
}

func (l *growLog) Read(ctx context.Context, name, after string, maxBytes int) (storage.ReadResult, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.memLog.Read(ctx, name, after, maxBytes)
}

// WaitID returns, once open, if the log has a record after `after`; else
// it waits for ctx.
func (l *growLog) WaitID(ctx context.Context, name, after string, id uint64) error {
	select {
	case <-l.open:
	case <-ctx.Done():
		return ctx.Err()
	}
	l.mu.Lock()
	more := after < l.info.Tail
	l.mu.Unlock()
	if more {
		return nil
	}
	return l.memLog.WaitID(ctx, name, after, id)
}

// add appends rec and returns its offset.
func (l *growLog) add(rec string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, []byte(rec))
	l.info.Tail = storage.FormatOffset(uint64(len(l.recs)))
	return l.info.Tail
}

// digest returns the cursor digest of the log.
func (l *growLog) digest() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return identOf(l.info).digest()
}

// sidFrames sums up the frames of fs for sid: "ack" (with an error's
// code), "snapshot <lsn> <digest>", "insert <lsn>".
func sidFrames(fs []frames.Frame, sid string) []string {
	var out []string
	for _, f := range fs {
		switch f := f.(type) {
		case *frames.Ack:
			if f.Ref == sid {
				if f.Error != nil {
					out = append(out, "ack "+string(f.Error.Code))
				} else {
					out = append(out, "ack")
				}
			}
		case *frames.Snapshot:
			if f.SID == sid {
				out = append(out, "snapshot "+f.Cursor.LSN+" "+f.Cursor.Digest)
			}
		case *frames.Patch:
			if f.SID == sid {
				for _, op := range f.Patches {
					out = append(out, "insert "+op.LSN)
				}
			}
		}
	}
	return out
}

// A resume whose cursor is ahead of this node's tailer is answered as
// soon as the tailer publishes past it, with the fake clock standing
// still: the wait is on the tailer's move, not a poll (it used to look
// every 2 ms, taking the topic's stripe lock each time). Without a move
// it gives up after catchUpWait, and the cursor expires.
func TestReplay_CatchUpWakesOnTheTailer(t *testing.T) {
	t.Parallel()
	const topic = "chat:catchup"
	for _, moves := range []bool{true, false} {
		t.Run(fmt.Sprint("moves=", moves), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				log := newGrowLog()
				b := newBubbleSession(t, log, 1<<20)
				b.subscribe(t, "live", topic, nil) // starts the tailer at the empty log; WaitID holds it
				var lsns []string
				for i := range 3 {
					lsns = append(lsns, log.add(fmt.Sprintf(`{"n":%d}`, i)))
				}
				b.subscribe(t, "s", topic, &frames.Cursor{QID: "topic:" + topic, LSN: lsns[1], Digest: log.digest(), IDs: []string{}, At: 1})
				synctest.Wait() // the replayer waits for the tailer
				if got := sidFrames(b.take(t), "s"); len(got) != 0 {
					t.Fatalf("before the tailer moved: %q", got)
				}
				start := time.Now()
				if !moves {
					time.Sleep(catchUpWait - time.Millisecond) // the fake clock: just short of the bound
					synctest.Wait()
					if got := sidFrames(b.take(t), "s"); len(got) != 0 {
						t.Fatalf("before the wait's bound: %q", got)
					}
					time.Sleep(time.Millisecond)
					synctest.Wait()
					want := []string{"ack " + string(frames.CodeCursorExpired), "snapshot " + storage.ZeroOffset + " " + log.digest()}
					if got := sidFrames(b.take(t), "s"); !slices.Equal(got, want) {
						t.Fatalf("after the wait's bound: %q, want %q", got, want)
					}
					return
				}
				close(log.open)
				synctest.Wait() // the tailer has published, and the replayer is done
				if d := time.Since(start); d != 0 {
					t.Fatalf("the fake clock moved %v", d)
				}
				want := []string{"ack", "snapshot " + lsns[1] + " " + log.digest(), "insert " + lsns[2]}
				if got := sidFrames(b.take(t), "s"); !slices.Equal(got, want) {
					t.Fatalf("once the tailer moved: %q, want %q", got, want)
				}
			})
		})
	}
}

// A replay keeps to the send queue's frame bound (SendQueueMessages) as
// it does to its byte bound: it queues a frame only while the queue holds
// fewer than half its frames. It used to look at bytes alone, so on a
// queue of 16 frames and 1 MiB a replay of small records queued its
// frames of about 12 KiB past the frame bound and closed the session
// 4001 (slow consumer) while its writer was a moment behind.
func TestReplay_ResumeStaysWithinTheQueuesFrames(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const topic, n, maxFrames = "chat:frames", 64 * 40, 16
		recs := make([][]byte, n)
		for i := range recs {
			recs[i] = []byte("1")
		}
		b := newBubbleSessionWith(t, Config{Log: newMemLog(recs), Persist: []string{"chat:*"},
			SendQueueBytes: 1 << 20, SendQueueMessages: maxFrames, Writers: -1})
		s := b.s
		b.subscribe(t, "s", topic, &frames.Cursor{QID: "topic:" + topic, LSN: storage.ZeroOffset, IDs: []string{}, At: 1})
		got := 0
		for {
			synctest.Wait() // the replayer has queued what it may
			s.q.mu.Lock()
			reason, items := s.q.reason, len(s.q.items)
			s.q.mu.Unlock()
			if reason != reasonNone {
				t.Fatalf("session closed (%v) after %d of %d records", reason, got, n)
			}
			if items == 0 {
				break
			}
			for _, f := range b.take(t) { // the writer takes the queue
				if p, ok := f.(*frames.Patch); ok {
					for _, op := range p.Patches {
						if want := storage.FormatOffset(uint64(got + 1)); op.LSN != want {
							t.Fatalf("insert at %s, want %s", op.LSN, want)
						}
						got++
					}
				}
			}
		}
		if got != n {
			t.Errorf("got %d of %d records", got, n)
		}
	})
}
