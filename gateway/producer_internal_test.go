package gateway

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/syncgate/syncgate/frames"
)

// newTestProducers returns a table with metrics of its own.
func newTestProducers(window, max int, idle time.Duration, maxIdleBytes int64) *producers {
	cfg := Config{ProducerWindow: window, ProducerIdle: idle, MaxProducers: max, MaxIdleProducerBytes: maxIdleBytes}
	return newProducers(&cfg, newMetrics(prometheus.NewRegistry()))
}

// forgottenFor reads syncgate_producers_forgotten_total{reason} of tab.
func forgottenFor(t *testing.T, tab *producers, reason int) int {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(tab.forgotten[reason])
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 {
		t.Fatalf("gather: %v, %d families", err, len(mfs))
	}
	return int(mfs[0].GetMetric()[0].GetCounter().GetValue())
}

// TestProducers_Cap: a full table forgets producers with no session, and
// keeps those in use.
func TestProducers_Cap(t *testing.T) {
	tab := newTestProducers(4, 2, time.Hour, -1)
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
	if n := forgottenFor(t, tab, forgetTableFull); n != 1 {
		t.Fatalf("forgotten for a full table: %d, want 1", n)
	}
	checkIdle(t, tab)
}

// TestProducers_Sweep: the sweep forgets a producer idle for longer than
// idle, and keeps one idle for less and one a session holds (however old
// its last release), so a live client's seqs and acks are never lost.
func TestProducers_Sweep(t *testing.T) {
	tab := newTestProducers(4, 100, time.Hour, -1)
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
	if n := forgottenFor(t, tab, forgetExpired); n != 2 {
		t.Fatalf("forgotten as expired: %d, want 2", n)
	}
	checkIdle(t, tab)
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

// bigError returns an exec whose outcome is an error with a long cause,
// as an unknown 256-byte mutation name earns.
func bigError(key string) func() (outcome, <-chan outcome) {
	return func() (outcome, <-chan outcome) {
		return outcome{key: key, err: frames.NewError(frames.CodeUnknownMutation, key, "mutate.name: unknown mutation "+strings.Repeat("n", 500), "use a mutation this server knows")}, nil
	}
}

// fill runs n mutates from seq 0 on p, each with a 256-byte key earning a
// big error.
func fill(p *producer, n int) {
	for seq := range int64(n) {
		key := fmt.Sprintf("%0256d", seq)
		p.run(p.epoch, false, &frames.Mutate{Key: key, Seq: seq}, func(outcome) {}, bigError(key))
	}
}

// checkIdle checks the table's idle count against its records: the
// sum of the idle records' sizes, and the idle list in idleAt order.
func checkIdle(t *testing.T, tab *producers) {
	t.Helper()
	tab.mu.Lock()
	defer tab.mu.Unlock()
	var sum int64
	idle := 0
	for _, p := range tab.m {
		if p.sessions == 0 {
			sum += p.bytes.Load()
			idle++
		}
	}
	listed := 0
	for p := tab.oldest; p != nil; p = p.newer {
		if p.newer != nil && p.newer.idleAt.Before(p.idleAt) {
			t.Fatal("idle list out of idleAt order")
		}
		listed++
	}
	if sum != tab.idleBytes || idle != listed {
		t.Fatalf("idle records: %d listed, %d in the table; idleBytes %d, their sizes add up to %d", listed, idle, tab.idleBytes, sum)
	}
	if tab.maxIdleBytes >= 0 && tab.idleBytes > tab.maxIdleBytes {
		t.Fatalf("idleBytes %d over the budget %d", tab.idleBytes, tab.maxIdleBytes)
	}
}

// TestProducer_BytesFollowRing: a producer's size counts what its ring
// holds: outcomes that overwrite others replace their size, so a
// producer wrapping its ring many times stays at one window's worth, and
// a new epoch starts it over.
func TestProducer_BytesFollowRing(t *testing.T) {
	p := newProducer(0, 8)
	p.clientID = "cli"
	p.bytes.Add(3)
	empty := p.bytes.Load()
	fill(p, 8)
	full := p.bytes.Load()
	// Each outcome holds at least its key and its error's cause and ref.
	if min := empty + 8*(256+256+500); full < min {
		t.Fatalf("a full ring of big errors counts %d bytes, want at least %d", full, min)
	}
	for range 10 {
		p.next = 0 // the same outcomes again, over the old ones
		p.started = false
		fill(p, 8)
	}
	if got := p.bytes.Load(); got != full {
		t.Fatalf("after wrapping the ring: %d bytes, want %d as after one window", got, full)
	}
	p.mu.Lock()
	p.resetLocked(1)
	p.mu.Unlock()
	if got := p.bytes.Load(); got != empty {
		t.Fatalf("after a new epoch: %d bytes, want %d", got, empty)
	}
}

// TestProducers_IdleBytes: while the records with no session hold more
// than maxIdleBytes, the longest idle are forgotten first; a record in
// use never is, and its outcomes are still answered. A session taking an
// idle record up again takes its size out of the idle count.
func TestProducers_IdleBytes(t *testing.T) {
	probe := newProducer(0, 16)
	fill(probe, 16)
	size := probe.bytes.Load() + 2 // the ids below are two bytes long
	tab := newTestProducers(16, 1000, time.Hour, 5*size+size/2)
	t0 := time.Unix(1000, 0)

	live := tab.acquire("lv", 0) // in use throughout
	fill(live, 16)
	var ps []*producer
	for i := range 40 {
		p := tab.acquire(fmt.Sprintf("%02d", i), 0)
		fill(p, 16)
		if p.bytes.Load() != size {
			t.Fatalf("producer size %d, want %d", p.bytes.Load(), size)
		}
		tab.release(p, t0.Add(time.Duration(i)*time.Second))
		ps = append(ps, p)
		checkIdle(t, tab)
	}
	// Five fit: the newest five are kept, the rest forgotten.
	for i, p := range ps {
		if kept := tab.m[p.clientID] == p; kept != (i >= 35) {
			t.Fatalf("producer %d of 40 kept: %v", i, kept)
		}
	}
	if n := forgottenFor(t, tab, forgetIdleBytes); n != 35 {
		t.Fatalf("forgotten for idle bytes: %d, want 35", n)
	}
	if tab.m["lv"] != live {
		t.Fatal("the producer in use was forgotten")
	}
	var got outcome
	key := fmt.Sprintf("%0256d", 3)
	live.run(0, false, &frames.Mutate{Key: key, Seq: 3}, func(o outcome) { got = o }, func() (outcome, <-chan outcome) {
		t.Fatal("a retry on the producer in use ran again")
		return outcome{}, nil
	})
	if got.err == nil || got.err.Code != frames.CodeUnknownMutation || got.seq != 3 {
		t.Fatalf("retry on the producer in use: %+v", got)
	}

	// A session takes up the oldest idle record: it leaves the count,
	// and the next releases forget others around it.
	again := tab.acquire("35", 0)
	if again != ps[35] || tab.idleBytes != 4*size {
		t.Fatalf("acquired again: same record %v, idleBytes %d, want %d", again == ps[35], tab.idleBytes, 4*size)
	}
	for i := 40; i < 43; i++ {
		p := tab.acquire(fmt.Sprintf("%02d", i), 0)
		fill(p, 16)
		tab.release(p, t0.Add(time.Duration(i)*time.Second))
		checkIdle(t, tab)
	}
	if tab.m["35"] != again || tab.m["36"] != nil || tab.m["37"] != nil || tab.m["38"] != ps[38] {
		t.Fatal("want 35 (in use again) kept, 36 and 37 forgotten, 38 kept")
	}
	tab.release(again, t0.Add(50*time.Second)) // now the newest idle one
	checkIdle(t, tab)
	if tab.m["35"] != again || tab.m["38"] != nil {
		t.Fatal("want 35 kept as the newest idle record and 38 forgotten")
	}
}

// TestProducers_PendingResultCountedWhileIdle: the result of a pending
// outcome that arrives after the producer's last session ended counts
// against the idle budget: here it takes the record over it.
func TestProducers_PendingResultCountedWhileIdle(t *testing.T) {
	tab := newTestProducers(8, 1000, time.Hour, 4096)
	p := tab.acquire("cli", 0)
	later := make(chan outcome, 1)
	acks := make(chan outcome, 1)
	p.run(0, false, &frames.Mutate{Key: "k", Seq: 0}, func(o outcome) { acks <- o }, func() (outcome, <-chan outcome) { return outcome{}, later })
	tab.release(p, time.Unix(1000, 0))
	checkIdle(t, tab)
	if tab.idleBytes == 0 || tab.m["cli"] != p {
		t.Fatalf("idle with a pending outcome: idleBytes %d, kept %v", tab.idleBytes, tab.m["cli"] == p)
	}
	before := tab.idleBytes
	// The log refuses the append: an error with a long cause.
	later <- outcome{err: frames.NewError(frames.CodeInternal, "k", strings.Repeat("c", 4096), "")}
	<-acks // the table has been told before the ack
	checkIdle(t, tab)
	if tab.m["cli"] != nil || tab.idleBytes != 0 {
		t.Fatalf("after a 4 KiB result: kept %v, idleBytes %d (was %d), want it forgotten", tab.m["cli"] == p, tab.idleBytes, before)
	}
	if n := forgottenFor(t, tab, forgetIdleBytes); n != 1 {
		t.Fatalf("forgotten for idle bytes: %d, want 1", n)
	}
}

// TestProducers_PendingResultCounted: with no budget, the idle count grows
// by the size of a result that arrives while idle, and taking the record
// up again takes it all out.
func TestProducers_PendingResultCounted(t *testing.T) {
	tab := newTestProducers(8, 1000, time.Hour, -1)
	p := tab.acquire("cli", 0)
	later := make(chan outcome, 1)
	acks := make(chan outcome, 1)
	p.run(0, false, &frames.Mutate{Key: "k", Seq: 0}, func(o outcome) { acks <- o }, func() (outcome, <-chan outcome) { return outcome{}, later })
	tab.release(p, time.Unix(1000, 0))
	before := tab.idleBytes
	res := outcome{err: frames.NewError(frames.CodeInternal, "k", strings.Repeat("c", 4096), "")}
	later <- res
	<-acks
	checkIdle(t, tab)
	if want := before + resultBytes(res); tab.idleBytes != want {
		t.Fatalf("idleBytes %d, want %d", tab.idleBytes, want)
	}
	tab.acquire("cli", 0)
	if tab.idleBytes != 0 {
		t.Fatalf("idleBytes %d with every record in use", tab.idleBytes)
	}
}

// TestProducers_PendingResultRacesRelease: a pending outcome's result
// arriving while its producer's last session ends is counted once,
// whichever comes first.
func TestProducers_PendingResultRacesRelease(t *testing.T) {
	tab := newTestProducers(8, 1000, time.Hour, -1)
	res := outcome{err: frames.NewError(frames.CodeInternal, "k", strings.Repeat("c", 1000), "")}
	for i := range 200 {
		p := tab.acquire("cli", int64(i)) // a new epoch each time: an empty ring
		later := make(chan outcome)
		acks := make(chan outcome, 1)
		p.run(int64(i), false, &frames.Mutate{Key: "k", Seq: 0}, func(o outcome) { acks <- o }, func() (outcome, <-chan outcome) { return outcome{}, later })
		go func() { later <- res }()
		tab.release(p, time.Unix(1000, 0))
		<-acks
		checkIdle(t, tab)
	}
}

// TestProducer_PendingResultCountedOnRepeat: when a pending outcome's own
// slot has been taken by a later seq, its result counts on the slot of
// the mutate that repeated its key, which still holds it.
func TestProducer_PendingResultCountedOnRepeat(t *testing.T) {
	p := newProducer(0, 4)
	acks := make(chan outcome, 16)
	reply := func(o outcome) { acks <- o }
	later := make(chan outcome, 1)
	p.run(0, false, &frames.Mutate{Key: "k", Seq: 0}, reply, func() (outcome, <-chan outcome) { return outcome{}, later })
	p.run(0, false, &frames.Mutate{Key: "k", Seq: 1}, reply, func() (outcome, <-chan outcome) { t.Fatal("ran a repeated key"); return outcome{}, nil })
	for seq := int64(2); seq <= 4; seq++ { // seq 4 takes seq 0's slot
		key := fmt.Sprint("k", seq)
		p.run(0, false, &frames.Mutate{Key: key, Seq: seq}, reply, func() (outcome, <-chan outcome) { return outcome{key: key, lsn: key}, nil })
		<-acks
	}
	before := p.bytes.Load()
	res := outcome{lsn: strings.Repeat("9", 100)}
	later <- res
	<-acks
	<-acks
	p.mu.Lock()
	defer p.mu.Unlock()
	if got, want := p.bytes.Load(), before+resultBytes(res); got != want {
		t.Fatalf("bytes %d after the result, want %d", got, want)
	}
}
