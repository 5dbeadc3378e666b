package gateway

import (
	"fmt"
	"testing"
	"time"

	"github.com/syncgate/syncgate/frames"
)

// TestProducers_Cap: a full table forgets producers with no session, and
// keeps those in use.
func TestProducers_Cap(t *testing.T) {
	tab := &producers{window: 4, idle: time.Hour, max: 2, m: map[string]*producer{}}
	now := time.Unix(1000, 0)
	a := tab.acquire("a", 0)
	b := tab.acquire("b", 0)
	tab.release(b, now)
	tab.acquire("c", 0) // full: b (idle) goes, a (in use) stays
	if _, ok := tab.m["b"]; ok {
		t.Fatal("idle producer kept in a full table")
	}
	if tab.m["a"] != a || tab.m["c"] == nil {
		t.Fatalf("table = %v", tab.m)
	}
}

// TestProducers_Sweep: the sweep forgets a producer idle for longer than
// idle, and keeps one idle for less and one a session holds (however old
// its last release), so a live client's seqs and acks are never lost.
func TestProducers_Sweep(t *testing.T) {
	tab := &producers{window: 4, idle: time.Hour, max: 100, m: map[string]*producer{}}
	t0 := time.Unix(1000, 0)
	old := tab.acquire("old", 0)
	tab.release(old, t0)
	recent := tab.acquire("recent", 0)
	tab.release(recent, t0.Add(30*time.Minute))
	held := tab.acquire("held", 0)
	tab.acquire("held", 0) // a second session
	tab.release(held, t0)  // the first one left long ago
	if n := tab.sweep(t0.Add(time.Hour)); n != 0 {
		t.Fatalf("sweep at exactly idle forgot %d", n)
	}
	if n := tab.sweep(t0.Add(time.Hour + time.Second)); n != 1 {
		t.Fatalf("sweep forgot %d producers, want 1 (old)", n)
	}
	if _, ok := tab.m["old"]; ok {
		t.Fatal("the producer idle past idle is kept")
	}
	if tab.m["recent"] != recent || tab.m["held"] != held {
		t.Fatalf("table = %v: want recent and held kept", tab.m)
	}
	if n := tab.sweep(t0.Add(100 * time.Hour)); n != 1 || tab.m["held"] != held {
		t.Fatalf("much later: forgot %d, held kept %v; want 1 (recent) and held kept", n, tab.m["held"] == held)
	}
}

// TestProducer_PendingOutcome: a mutate whose outcome comes later is
// recorded at once, so the next seq runs meanwhile, and a retry of it is
// answered with the outcome once it arrives.
func TestProducer_PendingOutcome(t *testing.T) {
	p := newProducer(0, 8)
	acks := make(chan outcome, 16)
	reply := func(o outcome) { acks <- o }
	later := make(chan outcome, 1)
	p.run(0, false, &frames.Mutate{Key: "a", Seq: 0}, reply, func() (outcome, <-chan outcome) { return outcome{}, later })
	p.run(0, false, &frames.Mutate{Key: "b", Seq: 1}, reply, func() (outcome, <-chan outcome) { return outcome{key: "b", lsn: "2"}, nil })
	if o := <-acks; o.key != "b" || o.lsn != "2" {
		t.Fatalf("seq 1 while seq 0 is pending: %+v", o)
	}
	// A retry of the pending seq and a new seq with its key both wait.
	p.run(0, false, &frames.Mutate{Key: "a", Seq: 0}, reply, func() (outcome, <-chan outcome) { t.Fatal("ran a retry"); return outcome{}, nil })
	p.run(0, false, &frames.Mutate{Key: "a", Seq: 2}, reply, func() (outcome, <-chan outcome) { t.Fatal("ran a repeated key"); return outcome{}, nil })
	select {
	case o := <-acks:
		t.Fatalf("answered before the outcome: %+v", o)
	default:
	}
	later <- outcome{lsn: "1"}
	for range 3 {
		if o := <-acks; o.key != "a" || o.lsn != "1" || o.seq != 0 {
			t.Fatalf("pending outcome answered as %+v", o)
		}
	}
	if p.next != 3 {
		t.Fatalf("next = %d, want 3", p.next)
	}
}

// TestProducer_PendingBound: beyond window/2 pending mutates, run waits
// for the outcome instead of recording another pending one.
func TestProducer_PendingBound(t *testing.T) {
	p := newProducer(0, 4) // at most 2 pending
	acks := make(chan outcome, 16)
	reply := func(o outcome) { acks <- o }
	chans := []chan outcome{make(chan outcome, 1), make(chan outcome, 1), make(chan outcome, 1)}
	for i, ch := range chans[:2] {
		p.run(0, false, &frames.Mutate{Key: fmt.Sprint(i), Seq: int64(i)}, reply, func() (outcome, <-chan outcome) { return outcome{}, ch })
	}
	chans[2] <- outcome{lsn: "third"} // ready, so the bounded wait returns at once
	p.run(0, false, &frames.Mutate{Key: "2", Seq: 2}, reply, func() (outcome, <-chan outcome) { return outcome{}, chans[2] })
	if o := <-acks; o.lsn != "third" {
		t.Fatalf("third mutate: %+v", o)
	}
	p.mu.Lock()
	inflight := p.inflight
	p.mu.Unlock()
	if inflight != 2 {
		t.Fatalf("inflight = %d, want 2", inflight)
	}
	chans[0] <- outcome{lsn: "first"}
	chans[1] <- outcome{lsn: "second"}
	got := map[string]bool{}
	for range 2 {
		got[(<-acks).lsn] = true
	}
	if !got["first"] || !got["second"] {
		t.Fatalf("pending acks %v", got)
	}
}

// TestProducer_StartsMidSeq: a client-named producer new to this node
// starts at the seq its client presents, and its outcomes are found again:
// a retry of the seq and the same key under the next seq get the first
// ack, without running the mutate again.
func TestProducer_StartsMidSeq(t *testing.T) {
	p := newProducer(0, 8)
	p.clientID = "cli"
	acks := make(chan outcome, 16)
	reply := func(o outcome) { acks <- o }
	runs := 0
	exec := func(lsn string) func() (outcome, <-chan outcome) {
		return func() (outcome, <-chan outcome) { runs++; return outcome{key: "k", lsn: lsn}, nil }
	}
	p.run(0, false, &frames.Mutate{Key: "k", Seq: 1003}, reply, exec("1"))
	p.run(0, false, &frames.Mutate{Key: "k", Seq: 1003}, reply, exec("retry"))
	p.run(0, false, &frames.Mutate{Key: "k", Seq: 1004}, reply, exec("repeat"))
	p.run(0, false, &frames.Mutate{Key: "j", Seq: 1005}, reply, func() (outcome, <-chan outcome) { return outcome{key: "j", lsn: "2"}, nil })
	for i, want := range []string{"1", "1", "1", "2"} {
		if o := <-acks; o.err != nil || o.lsn != want {
			t.Fatalf("ack %d = %+v (err %v), want lsn %s", i, o, o.err, want)
		}
	}
	if runs != 1 {
		t.Fatalf("mutate ran %d times, want once", runs)
	}
	// Past a full window the ring wraps onto the slots it grew.
	for seq := int64(1006); seq < 1006+16; seq++ {
		key := fmt.Sprint("w", seq)
		p.run(0, false, &frames.Mutate{Key: key, Seq: seq}, reply, func() (outcome, <-chan outcome) { return outcome{key: key, lsn: key}, nil })
		<-acks
	}
	p.run(0, false, &frames.Mutate{Key: "w1020", Seq: 1020}, reply, exec("again"))
	if o := <-acks; o.lsn != "w1020" {
		t.Fatalf("retry after wrapping = %+v", o)
	}
	p.run(0, false, &frames.Mutate{Key: "k", Seq: 1003}, reply, exec("old"))
	if o := <-acks; o.err == nil || o.err.Code != frames.CodeSeqForgotten {
		t.Fatalf("retry older than the window = %+v", o)
	}
}

// TestProducer_FirstMutateMovesOn: a connection's first mutate moves a
// client-named producer on to its seq (every seq below it was answered
// elsewhere) only when no frame of the connection was dropped before it
// (first); otherwise the one before it may have been dropped, and it is
// X_SEQ_GAP. hello.seq (advance) moves it forward, never back.
func TestProducer_FirstMutateMovesOn(t *testing.T) {
	acks := make(chan outcome, 16)
	reply := func(o outcome) { acks <- o }
	ok := func(key string) func() (outcome, <-chan outcome) {
		return func() (outcome, <-chan outcome) { return outcome{key: key, lsn: key}, nil }
	}
	p := newProducer(0, 8)
	p.clientID = "cli"
	p.advance(0, 3)
	p.run(0, false, &frames.Mutate{Key: "k4", Seq: 4}, reply, ok("k4"))
	if o := <-acks; o.err == nil || o.err.Code != frames.CodeSeqGap {
		t.Fatalf("seq 4 after a drop, hello at 3: %+v, want X_SEQ_GAP", o)
	}
	p.run(0, true, &frames.Mutate{Key: "k5", Seq: 5}, reply, ok("k5"))
	if o := <-acks; o.err != nil || o.lsn != "k5" {
		t.Fatalf("seq 5 first on a connection, hello at 3: %+v, want it run", o)
	}
	p.advance(0, 2) // a stale hello: never backwards
	p.run(0, false, &frames.Mutate{Key: "k6", Seq: 6}, reply, ok("k6"))
	if o := <-acks; o.err != nil || o.lsn != "k6" {
		t.Fatalf("seq 6 after a stale hello: %+v", o)
	}
	p.advance(1, 9) // another epoch: ignored here (acquire resets a higher one)
	if p.next != 7 {
		t.Fatalf("next = %d after advance on another epoch, want 7", p.next)
	}
}
