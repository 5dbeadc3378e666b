package storage_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/syncgate/syncgate/storage"
)

// clock is an injectable clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func rec(ss ...string) [][]byte {
	out := make([][]byte, len(ss))
	for i, s := range ss {
		out[i] = []byte(s)
	}
	return out
}

func mustAppend(t *testing.T, db *storage.DB, name string, req storage.AppendRequest) storage.AppendResult {
	t.Helper()
	r, err := db.Append(t.Context(), name, req)
	if err != nil {
		t.Fatalf("Append(%q): %v", name, err)
	}
	return r
}

func mustCreate(t *testing.T, db *storage.DB, name string, o storage.CreateOptions) storage.Info {
	t.Helper()
	in, _, err := db.Create(t.Context(), name, o)
	if err != nil {
		t.Fatalf("Create(%q): %v", name, err)
	}
	return in
}

func content(t *testing.T, db *storage.DB, name string) string {
	t.Helper()
	var b bytes.Buffer
	after := storage.ZeroOffset
	for {
		res, err := db.Read(t.Context(), name, after, 0)
		if err != nil {
			t.Fatalf("Read(%q, %s): %v", name, after, err)
		}
		for _, r := range res.Records {
			b.Write(r.Data)
		}
		if res.UpToDate {
			return b.String()
		}
		after = res.Next
	}
}

func wantErr(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: err = %v, want %v", what, err, target)
	}
}

func maintain(t *testing.T, db *storage.DB) {
	t.Helper()
	if err := db.MaintainForTest(t.Context()); err != nil {
		t.Fatal(err)
	}
}

func TestDB_Open_OptionsNotMutated(t *testing.T) {
	o := &storage.Options{}
	openDB(t, o)
	if o.MaxBatchBytes != 0 || o.PruneBatch != 0 || o.Logger != nil || o.Now != nil || o.MaintenanceInterval != 0 {
		t.Fatalf("Open modified the caller's options: %+v", *o)
	}
	db := openDB(t, nil)
	mustCreate(t, db, "s", storage.CreateOptions{})
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	_, err := db.Head(t.Context(), "s")
	wantErr(t, "Head after Close", err, storage.ErrClosedDB)
	_, err = db.Append(t.Context(), "s", storage.AppendRequest{Records: rec("x")})
	wantErr(t, "Append after Close", err, storage.ErrClosedDB)
}

func TestDB_Restart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log.db")
	db, err := storage.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	mustCreate(t, db, "s", storage.CreateOptions{ContentType: "text/plain", TTL: time.Hour})
	var offsets []string
	for i := range 100 {
		r := mustAppend(t, db, "s", storage.AppendRequest{Records: rec(fmt.Sprint(i % 10)), Producer: &storage.Producer{ID: "p", Epoch: 1, Seq: int64(i)}, StreamSeq: fmt.Sprintf("%04d", i)})
		offsets = append(offsets, r.Offset)
	}
	mustCreate(t, db, "f", storage.CreateOptions{ForkFrom: "s", ForkOffset: storage.FormatOffset(5)})
	mustAppend(t, db, "f", storage.AppendRequest{Records: rec("F")})
	mustCreate(t, db, "c", storage.CreateOptions{})
	mustAppend(t, db, "c", storage.AppendRequest{Records: rec("x"), Close: true, Producer: &storage.Producer{ID: "q"}})
	before := content(t, db, "s")
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	db, err = storage.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if got := content(t, db, "s"); got != before {
		t.Fatalf("content after reopen = %q, want %q", got, before)
	}
	// A retried seq is a duplicate answered with its original offset (the
	// last 64 are remembered), an older one with the tail.
	for _, seq := range []int64{99, 50, 36} {
		d := mustAppend(t, db, "s", storage.AppendRequest{Records: rec("dup"), Producer: &storage.Producer{ID: "p", Epoch: 1, Seq: seq}})
		if !d.Duplicate || d.Offset != offsets[seq] || d.Seq != 99 {
			t.Fatalf("retry of seq %d after reopen: %+v, want duplicate at %s", seq, d, offsets[seq])
		}
	}
	d := mustAppend(t, db, "s", storage.AppendRequest{Records: rec("dup"), Producer: &storage.Producer{ID: "p", Epoch: 1, Seq: 3}})
	if !d.Duplicate || d.Offset != offsets[99] {
		t.Fatalf("retry of an old seq: %+v, want duplicate at the tail", d)
	}
	_, err = db.Append(ctx, "s", storage.AppendRequest{Records: rec("x"), StreamSeq: "0099"})
	wantErr(t, "Stream-Seq after reopen", err, storage.ErrStreamSeq)
	_, err = db.Append(ctx, "s", storage.AppendRequest{Records: rec("x"), Producer: &storage.Producer{ID: "p", Epoch: 0, Seq: 100}})
	var pe *storage.ProducerError
	if !errors.As(err, &pe) || pe.Kind != storage.KindFenced {
		t.Fatalf("fenced after reopen: %v", err)
	}
	r := mustAppend(t, db, "s", storage.AppendRequest{Records: rec("n"), Producer: &storage.Producer{ID: "p", Epoch: 1, Seq: 100}})
	if r.Offset != storage.FormatOffset(101) {
		t.Fatalf("next offset = %s", r.Offset)
	}
	if got := content(t, db, "f"); got != before[:5]+"F" {
		t.Fatalf("fork after reopen = %q", got)
	}
	in, err := db.Head(ctx, "c")
	if err != nil || !in.Closed {
		t.Fatalf("closed after reopen: %+v %v", in, err)
	}
	d = mustAppend(t, db, "c", storage.AppendRequest{Records: rec("y"), Close: true, Producer: &storage.Producer{ID: "q"}})
	if !d.Duplicate || !d.Closed {
		t.Fatalf("closing tuple after reopen: %+v", d)
	}
	if in, _ := db.Head(ctx, "s"); in.TTL != time.Hour || in.ContentType != "text/plain" {
		t.Fatalf("info after reopen: %+v", in)
	}
}

func TestDB_TTL(t *testing.T) {
	clk := newClock()
	path := filepath.Join(t.TempDir(), "log.db")
	opts := &storage.Options{Now: clk.Now, NoSync: true}
	db, err := storage.Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { db.Close() }()
	ctx := t.Context()
	mustCreate(t, db, "s", storage.CreateOptions{TTL: 10 * time.Second})
	clk.Advance(8 * time.Second)
	if _, err := db.Read(ctx, "s", storage.ZeroOffset, 0); err != nil { // renews
		t.Fatal(err)
	}
	clk.Advance(8 * time.Second)
	if _, err := db.Head(ctx, "s"); err != nil { // 16 s after create, 8 after the read
		t.Fatalf("renewed by read: %v", err)
	}
	mustAppend(t, db, "s", storage.AppendRequest{Close: true}) // close-only renews
	clk.Advance(9 * time.Second)
	if _, err := db.Head(ctx, "s"); err != nil { // Head does not renew
		t.Fatalf("renewed by close-only: %v", err)
	}
	clk.Advance(time.Second)
	_, err = db.Head(ctx, "s")
	wantErr(t, "Head after TTL", err, storage.ErrNotFound)
	_, err = db.Read(ctx, "s", storage.ZeroOffset, 0)
	wantErr(t, "Read after TTL", err, storage.ErrNotFound)
	_, err = db.Append(ctx, "s", storage.AppendRequest{Records: rec("x")})
	wantErr(t, "Append after TTL", err, storage.ErrNotFound)
	wantErr(t, "Wait after TTL", db.Wait(ctx, "s", storage.ZeroOffset), storage.ErrNotFound)
	// The name is free: a brand-new stream of any config.
	in, created, err := db.Create(ctx, "s", storage.CreateOptions{ContentType: "application/json", TTL: time.Hour})
	if err != nil || !created || in.Tail != storage.ZeroOffset {
		t.Fatalf("Create after expiry: %+v %v %v", in, created, err)
	}

	// Expires-At is never extended.
	mustCreate(t, db, "e", storage.CreateOptions{ExpiresAt: clk.Now().Add(3 * time.Second)})
	clk.Advance(2 * time.Second)
	db.Read(ctx, "e", storage.ZeroOffset, 0)
	clk.Advance(time.Second)
	_, err = db.Head(ctx, "e")
	wantErr(t, "Head after Expires-At", err, storage.ErrNotFound)

	// A read's renewal is persisted by the maintenance pass and survives a
	// restart.
	mustCreate(t, db, "r", storage.CreateOptions{TTL: 10 * time.Second})
	clk.Advance(9 * time.Second)
	db.Read(ctx, "r", storage.ZeroOffset, 0)
	maintain(t, db)
	db.Close()
	if db, err = storage.Open(path, opts); err != nil {
		t.Fatal(err)
	}
	clk.Advance(9 * time.Second)
	if _, err := db.Head(ctx, "r"); err != nil {
		t.Fatalf("persisted renewal: %v", err)
	}

	// Reading a fork never renews its source; an expired source with a
	// fork reads as gone, and is removed once the fork goes.
	mustCreate(t, db, "src", storage.CreateOptions{TTL: 10 * time.Second, Records: rec("a")})
	if in := mustCreate(t, db, "fork", storage.CreateOptions{ForkFrom: "src", TTL: time.Hour}); in.TTL != time.Hour {
		t.Fatalf("fork TTL %v", in.TTL)
	}
	for range 3 {
		clk.Advance(5 * time.Second)
		if got := content(t, db, "fork"); got != "a" {
			t.Fatalf("fork = %q", got)
		}
	}
	_, err = db.Head(ctx, "src")
	wantErr(t, "expired source with a fork", err, storage.ErrGone)
	_, _, err = db.Create(ctx, "src", storage.CreateOptions{})
	wantErr(t, "Create at an expired source with forks", err, storage.ErrConflict)
	maintain(t, db)
	if got := content(t, db, "fork"); got != "a" {
		t.Fatalf("fork after maintenance = %q", got)
	}
	if err := db.Delete(ctx, "fork"); err != nil {
		t.Fatal(err)
	}
	_, err = db.Head(ctx, "src")
	wantErr(t, "source after its last fork", err, storage.ErrNotFound)

	// A fork that expires releases its reference.
	mustCreate(t, db, "src2", storage.CreateOptions{Records: rec("b")})
	mustCreate(t, db, "fork2", storage.CreateOptions{ForkFrom: "src2", TTL: time.Second})
	if err := db.Delete(ctx, "src2"); err != nil {
		t.Fatal(err)
	}
	_, err = db.Head(ctx, "src2")
	wantErr(t, "soft-deleted", err, storage.ErrGone)
	clk.Advance(2 * time.Second)
	_, err = db.Head(ctx, "fork2")
	wantErr(t, "expired fork", err, storage.ErrNotFound)
	maintain(t, db)
	_, err = db.Head(ctx, "src2")
	wantErr(t, "source after its fork expired", err, storage.ErrNotFound)
}

// ttlLeftOf returns Head's TTLLeft of stream name.
func ttlLeftOf(t *testing.T, db *storage.DB, name string) time.Duration {
	t.Helper()
	in, err := db.Head(t.Context(), name)
	if err != nil {
		t.Fatalf("Head(%q): %v", name, err)
	}
	return in.TTLLeft
}

// waitHeld starts a Wait on stream name, whose sliding TTL is ttl, and
// returns once it holds the TTL: half the TTL later (on clk) Head shows
// all of it left, which only a renewal since can do. The Wait's error
// comes on the channel; cancel ends it (t's cleanup does too).
func waitHeld(t *testing.T, db *storage.DB, clk *clock, name string, ttl time.Duration) (<-chan error, context.CancelFunc) {
	t.Helper()
	wctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	ch := make(chan error, 1)
	go func() { ch <- db.Wait(wctx, name, storage.ZeroOffset) }()
	clk.Advance(ttl / 2)
	deadline := time.Now().Add(5 * time.Second)
	for ttlLeftOf(t, db, name) != ttl {
		if time.Now().After(deadline) {
			t.Fatalf("%s: with a Wait blocked on it, Head's TTLLeft = %v, want the whole TTL (%v)", name, ttlLeftOf(t, db, name), ttl)
		}
		time.Sleep(time.Millisecond) // polling, not synchronisation
	}
	return ch, cancel
}

// TestDB_Wait_KeepsTTL: a stream with a sliding TTL does not expire while
// a Wait is blocked on it, however long; its TTL runs again from when the
// Wait returns, and the maintenance pass persists the renewal as it does
// a read's. An absolute expiry still ends the Wait.
func TestDB_Wait_KeepsTTL(t *testing.T) {
	clk := newClock()
	path := filepath.Join(t.TempDir(), "log.db")
	opts := &storage.Options{Now: clk.Now, NoSync: true}
	db := openDB2(t, path, opts)
	ctx := t.Context()
	const ttl = 10 * time.Second

	mustCreate(t, db, "s", storage.CreateOptions{TTL: ttl})
	mustCreate(t, db, "idle", storage.CreateOptions{TTL: ttl})
	ch, cancel := waitHeld(t, db, clk, "s", ttl)
	clk.Advance(3 * ttl)
	_, err := db.Head(ctx, "idle")
	wantErr(t, "a stream no one waits on", err, storage.ErrNotFound)
	if got := ttlLeftOf(t, db, "s"); got != ttl {
		t.Fatalf("TTLLeft %v after 3.5 TTLs of waiting, want %v", got, ttl)
	}
	if _, err := db.Read(ctx, "s", storage.ZeroOffset, 0); err != nil {
		t.Fatalf("Read while a Wait holds the stream: %v", err)
	}
	cancel()
	wantErr(t, "Wait", <-ch, context.Canceled)
	clk.Advance(ttl - time.Second)
	if got := ttlLeftOf(t, db, "s"); got != time.Second {
		t.Fatalf("TTLLeft %v a TTL less 1s after the Wait returned, want 1s", got)
	}
	clk.Advance(time.Second)
	_, err = db.Head(ctx, "s")
	wantErr(t, "a TTL after the Wait returned", err, storage.ErrNotFound)

	// The renewal of a Wait still blocked is persisted by the maintenance
	// pass, and survives a restart (the Wait's own end, at Close, is not).
	mustCreate(t, db, "p", storage.CreateOptions{TTL: ttl})
	ch, _ = waitHeld(t, db, clk, "p", ttl)
	clk.Advance(3 * ttl)
	maintain(t, db)
	db.Close()
	wantErr(t, "Wait at Close", <-ch, storage.ErrClosedDB)
	db = openDB2(t, path, opts)
	clk.Advance(ttl - time.Second)
	if got := ttlLeftOf(t, db, "p"); got != time.Second {
		t.Fatalf("TTLLeft %v after restart, want 1s", got)
	}

	// Expires-At is absolute: a Wait neither extends it nor outlives it.
	// (The Wait's timer runs on real time: the time left on the clock, at
	// most 100 ms, before it looks again.)
	mustCreate(t, db, "e", storage.CreateOptions{ExpiresAt: clk.Now().Add(100 * time.Millisecond)})
	ech := make(chan error, 1)
	go func() { ech <- db.Wait(ctx, "e", storage.ZeroOffset) }()
	clk.Advance(100 * time.Millisecond)
	_, err = db.Head(ctx, "e")
	wantErr(t, "Head at Expires-At", err, storage.ErrNotFound)
	select {
	case err = <-ech:
		wantErr(t, "Wait at Expires-At", err, storage.ErrNotFound)
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return at Expires-At")
	}
}

func TestDB_Retention(t *testing.T) {
	clk := newClock()
	db := openDB(t, &storage.Options{Now: clk.Now, NoSync: true, PruneBatch: 3, Retention: storage.Retention{MaxRecords: 10}})
	ctx := t.Context()
	mustCreate(t, db, "s", storage.CreateOptions{})
	for i := range 30 {
		mustAppend(t, db, "s", storage.AppendRequest{Records: rec(fmt.Sprintf("%02d", i))})
	}
	maintain(t, db)
	// Bounded: one pass prunes PruneBatch records.
	_, err := db.Read(ctx, "s", storage.FormatOffset(2), 0)
	wantErr(t, "pruned offset", err, storage.ErrGone)
	var pe *storage.PrunedError
	if !errors.As(err, &pe) || pe.Offset != storage.FormatOffset(2) || pe.Pruned != storage.FormatOffset(3) || pe.ID == 0 {
		t.Fatalf("pruned read: %#v, want a PrunedError readable after %s", err, storage.FormatOffset(3))
	}
	res, err := db.Read(ctx, "s", storage.FormatOffset(3), 0)
	if err != nil || string(res.Records[0].Data) != "03" {
		t.Fatalf("first retained: %+v %v", res, err)
	}
	headPruned := func(want uint64) {
		t.Helper()
		in, err := db.Head(ctx, "s")
		if err != nil || in.Pruned != storage.FormatOffset(want) {
			t.Fatalf("Head: Pruned %q (%v), want %s", in.Pruned, err, storage.FormatOffset(want))
		}
	}
	headPruned(3)
	for range 10 {
		maintain(t, db)
	}
	_, err = db.Read(ctx, "s", storage.ZeroOffset, 0)
	wantErr(t, "read from zero", err, storage.ErrGone)
	res, err = db.Read(ctx, "s", storage.FormatOffset(20), 0)
	if err != nil || len(res.Records) != 10 || string(res.Records[0].Data) != "20" {
		t.Fatalf("after pruning: %d records, %v", len(res.Records), err)
	}
	headPruned(20)
	// A fork reads its source up to the fork offset: its Pruned is the
	// source's, and a read after it works.
	mustCreate(t, db, "f", storage.CreateOptions{ForkFrom: "s", ForkOffset: storage.FormatOffset(25)})
	if in, err := db.Head(ctx, "f"); err != nil || in.Pruned != storage.FormatOffset(20) {
		t.Fatalf("fork: Pruned %q (%v), want the source's %s", in.Pruned, err, storage.FormatOffset(20))
	}
	if res, err := db.Read(ctx, "f", storage.FormatOffset(20), 0); err != nil || len(res.Records) != 5 {
		t.Fatalf("fork read after its Pruned: %d records, %v", len(res.Records), err)
	}
	_, err = db.Read(ctx, "f", storage.FormatOffset(19), 0)
	wantErr(t, "fork read before its Pruned", err, storage.ErrGone)
	if !errors.As(err, &pe) || pe.Pruned != storage.FormatOffset(20) {
		t.Fatalf("fork's pruned read: %#v, want one readable after %s", err, storage.FormatOffset(20))
	}

	// Per-stream override, by bytes, whole appends.
	mustCreate(t, db, "b", storage.CreateOptions{Retention: &storage.Retention{MaxBytes: 10}})
	mustAppend(t, db, "b", storage.AppendRequest{Records: rec("aaaa", "bbbb")})
	mustAppend(t, db, "b", storage.AppendRequest{Records: rec("cccc")})
	mustAppend(t, db, "b", storage.AppendRequest{Records: rec("dddd", "eeee")})
	for range 3 {
		maintain(t, db)
	}
	// 20 bytes: the first two appends (12 bytes) go, whole.
	_, err = db.Read(ctx, "b", storage.FormatOffset(2), 0)
	wantErr(t, "pruned by bytes", err, storage.ErrGone)
	res, err = db.Read(ctx, "b", storage.FormatOffset(3), 0)
	if err != nil || len(res.Records) != 2 || !res.Records[0].Start {
		t.Fatalf("by bytes: %+v %v", res, err)
	}

	// By age.
	mustCreate(t, db, "a", storage.CreateOptions{Retention: &storage.Retention{MaxAge: time.Minute}})
	mustAppend(t, db, "a", storage.AppendRequest{Records: rec("old")})
	clk.Advance(2 * time.Minute)
	mustAppend(t, db, "a", storage.AppendRequest{Records: rec("new")})
	maintain(t, db)
	_, err = db.Read(ctx, "a", storage.ZeroOffset, 0)
	wantErr(t, "aged out", err, storage.ErrGone)
	if got := content2(t, db, "a", storage.FormatOffset(1)); got != "new" {
		t.Fatalf("by age: %q", got)
	}
}

func content2(t *testing.T, db *storage.DB, name, after string) string {
	t.Helper()
	res, err := db.Read(t.Context(), name, after, 0)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	for _, r := range res.Records {
		b.Write(r.Data)
	}
	return b.String()
}

// producerTTLLog opens a log whose producers expire after an hour idle,
// with stream "s" holding seqs 0-2 of producer "p", each record data.
func producerTTLLog(t *testing.T, data string) (*clock, *storage.DB) {
	t.Helper()
	clk := newClock()
	db := openDB(t, &storage.Options{Now: clk.Now, NoSync: true, ProducerTTL: time.Hour})
	mustCreate(t, db, "s", storage.CreateOptions{})
	for i := range 3 {
		mustAppend(t, db, "s", storage.AppendRequest{Records: rec(data), Producer: &storage.Producer{ID: "p", Seq: int64(i)}})
	}
	return clk, db
}

func TestDB_ProducerExpiry(t *testing.T) {
	clk, db := producerTTLLog(t, "x")
	clk.Advance(59 * time.Minute)
	mustAppend(t, db, "s", storage.AppendRequest{Records: rec("x"), Producer: &storage.Producer{ID: "q", Seq: 0}})
	clk.Advance(2 * time.Minute)
	maintain(t, db)
	_, err := db.Append(t.Context(), "s", storage.AppendRequest{Records: rec("x"), Producer: &storage.Producer{ID: "p", Seq: 3}})
	var pe *storage.ProducerError
	if !errors.As(err, &pe) || pe.Kind != storage.KindGap || pe.ExpectedSeq != 0 {
		t.Fatalf("expired producer: %v, want a gap expecting 0", err)
	}
	r := mustAppend(t, db, "s", storage.AppendRequest{Records: rec("x"), Producer: &storage.Producer{ID: "p", Seq: 0}})
	if r.Duplicate {
		t.Fatal("expired producer's seq 0 is a duplicate")
	}
	d := mustAppend(t, db, "s", storage.AppendRequest{Records: rec("x"), Producer: &storage.Producer{ID: "q", Seq: 0}})
	if !d.Duplicate {
		t.Fatal("live producer q forgot its state")
	}
}

// TestDB_ProducerExpiryAtTheTTL: maintenance removes a producer idle for
// exactly ProducerTTL, the moment from which the append path forgets it.
func TestDB_ProducerExpiryAtTheTTL(t *testing.T) {
	clk, db := producerTTLLog(t, "x")
	clk.Advance(time.Hour)
	maintain(t, db)
	if n, _, err := db.ProducerStatesForTest("s"); err != nil || n != 0 {
		t.Fatalf("%d producer states after ProducerTTL idle (%v), want 0", n, err)
	}
}

// TestDB_ProducerExpiryOnAppend: a producer idle past ProducerTTL is
// forgotten by the append that finds it, before any maintenance pass has
// removed it: its seq 0 is a new record, not a duplicate of the old one.
func TestDB_ProducerExpiryOnAppend(t *testing.T) {
	clk, db := producerTTLLog(t, "old")
	clk.Advance(2 * time.Hour)
	r := mustAppend(t, db, "s", storage.AppendRequest{Records: rec("new"), Producer: &storage.Producer{ID: "p", Seq: 0}})
	if r.Duplicate {
		t.Fatal("a producer idle past its TTL: seq 0 answered as a duplicate, the record dropped")
	}
	res, err := db.Read(t.Context(), "s", storage.ZeroOffset, 0)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(res.Records); n != 4 || string(res.Records[3].Data) != "new" {
		t.Fatalf("log has %d records (%+v); want 4, the last \"new\"", n, res.Records)
	}
}

// leaveSparse makes db's file mostly free pages for Open to compact: a
// stream "keep" with one record "kept", and a stream of pages × 80 KB
// deleted and cleared (in bounded maintenance passes).
func leaveSparse(t *testing.T, db *storage.DB, pages int) {
	t.Helper()
	mustCreate(t, db, "keep", storage.CreateOptions{Records: rec("kept")})
	mustCreate(t, db, "big", storage.CreateOptions{})
	blob := bytes.Repeat([]byte("z"), 4000)
	for range pages {
		recs := make([][]byte, 20)
		for j := range recs {
			recs[j] = blob
		}
		mustAppend(t, db, "big", storage.AppendRequest{Records: recs})
	}
	if err := db.Delete(t.Context(), "big"); err != nil {
		t.Fatal(err)
	}
	for range pages/20 + 2 {
		maintain(t, db)
	}
}

func TestDB_Compaction(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log.db")
	opts := &storage.Options{NoSync: true, PruneBatch: 1000}
	db, err := storage.Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	leaveSparse(t, db, 100)
	db.Close()
	fi, _ := os.Stat(path)
	o2 := *opts
	storage.SetCompactMinBytesForTest(&o2, 1<<20)
	db, err = storage.Open(path, &o2)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	fi2, _ := os.Stat(path)
	if fi2.Size()*4 > fi.Size() {
		t.Fatalf("not compacted: %d → %d bytes", fi.Size(), fi2.Size())
	}
	t.Logf("compacted %d → %d bytes", fi.Size(), fi2.Size())
	if got := content(t, db, "keep"); got != "kept" {
		t.Fatalf("after compaction: %q", got)
	}
	_, err = db.Head(t.Context(), "big")
	wantErr(t, "deleted stream", err, storage.ErrNotFound)
	mustAppend(t, db, "keep", storage.AppendRequest{Records: rec("!")})
	if err := db.BoltForTest().View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			return err
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func TestDB_CommitFailure(t *testing.T) {
	var fail atomic.Bool
	var fatals atomic.Int32
	opts := &storage.Options{NoSync: true, OnFatal: func(error) { fatals.Add(1) }}
	// A seam: a real fsync failure cannot be produced here.
	storage.SetCommitHookForTest(opts, func() error {
		if fail.Load() {
			return errors.New("injected fsync failure")
		}
		return nil
	})
	db := openDB(t, opts)
	ctx := t.Context()
	mustCreate(t, db, "s", storage.CreateOptions{})
	mustAppend(t, db, "s", storage.AppendRequest{Records: rec("a")})
	fail.Store(true)
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			_, err := db.Append(ctx, "s", storage.AppendRequest{Records: rec("b")})
			if !errors.Is(err, storage.ErrFailed) {
				t.Errorf("Append during failure: %v", err)
			}
		})
	}
	wg.Wait()
	fail.Store(false)
	_, err := db.Append(ctx, "s", storage.AppendRequest{Records: rec("c")})
	wantErr(t, "Append after failure", err, storage.ErrFailed)
	_, err = db.Read(ctx, "s", storage.ZeroOffset, 0)
	wantErr(t, "Read after failure", err, storage.ErrFailed)
	_, err = db.Head(ctx, "s")
	wantErr(t, "Head after failure", err, storage.ErrFailed)
	_, _, err = db.Create(ctx, "t", storage.CreateOptions{})
	wantErr(t, "Create after failure", err, storage.ErrFailed)
	if n := fatals.Load(); n != 1 {
		t.Fatalf("OnFatal called %d times", n)
	}
}

func TestDB_SameBatch(t *testing.T) {
	db := openDB(t, &storage.Options{NoSync: true})
	mustCreate(t, db, "s", storage.CreateOptions{})
	p := func(seq int64) *storage.Producer { return &storage.Producer{ID: "p", Seq: seq} }
	res, errs := db.AppendBatchForTest("s", []storage.AppendRequest{
		{Records: rec("a"), Producer: p(0)},
		{Records: rec("b"), Producer: p(1)},
		{Records: rec("dup"), Producer: p(0)},
		{Records: rec("gap"), Producer: p(5)},
		{Records: rec("c"), StreamSeq: "1"},
		{Records: rec("d"), StreamSeq: "1"},
		{Records: rec("e"), Close: true},
		{Records: rec("f")},
	})
	for i, want := range []string{"", "", "", "gap", "", "seq", "", "closed"} {
		var pe *storage.ProducerError
		var ce *storage.ClosedError
		got := ""
		switch err := errs[i]; {
		case err == nil:
		case errors.As(err, &pe) && pe.Kind == storage.KindGap && pe.ExpectedSeq == 2:
			got = "gap"
		case errors.Is(err, storage.ErrStreamSeq):
			got = "seq"
		case errors.As(err, &ce) && ce.Tail == storage.FormatOffset(4):
			got = "closed"
		default:
			got = err.Error()
		}
		if got != want {
			t.Fatalf("request %d: %q, want %q", i, got, want)
		}
	}
	if !res[2].Duplicate || res[2].Offset != storage.FormatOffset(1) || res[2].Seq != 1 {
		t.Fatalf("duplicate in the batch: %+v", res[2])
	}
	if got := content(t, db, "s"); got != "abce" {
		t.Fatalf("content = %q", got)
	}
}

func TestDB_BatchLimits(t *testing.T) {
	// Batches are cut at MaxBatchBytes; a request bigger than that
	// commits alone; MaxAppendBytes refuses.
	db := openDB(t, &storage.Options{NoSync: true, MaxBatchBytes: 1000, MaxAppendBytes: 3000})
	mustCreate(t, db, "s", storage.CreateOptions{})
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			if _, err := db.Append(t.Context(), "s", storage.AppendRequest{Records: [][]byte{bytes.Repeat([]byte{'x'}, 150*i)}}); err != nil {
				t.Errorf("append %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if in, _ := db.Head(t.Context(), "s"); in.Tail != storage.FormatOffset(20) {
		t.Fatalf("tail %s", in.Tail)
	}
	_, err := db.Append(t.Context(), "s", storage.AppendRequest{Records: [][]byte{make([]byte, 3001)}})
	wantErr(t, "over MaxAppendBytes", err, storage.ErrTooLarge)
}

func TestDB_Wait_Expiry(t *testing.T) {
	// Real clock: Wait notices expiry by itself (no commit wakes it). Only
	// an Expires-At can come while it waits: a sliding TTL cannot run out
	// under a blocked Wait (TestDB_Wait_KeepsTTL).
	db := openDB(t, &storage.Options{NoSync: true})
	mustCreate(t, db, "s", storage.CreateOptions{ExpiresAt: time.Now().Add(200 * time.Millisecond)})
	errc := make(chan error, 1)
	go func() { errc <- db.Wait(t.Context(), "s", storage.ZeroOffset) }()
	select {
	case err := <-errc:
		wantErr(t, "Wait on an expiring stream", err, storage.ErrNotFound)
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not notice expiry")
	}
}

// TestDB_Wait_WatchesOfDeadStreams: a stream ID never comes back, so no
// watch may stay registered for one that was deleted, expired or made
// anew, whether the waiter was waiting then or came later with the ID.
func TestDB_Wait_WatchesOfDeadStreams(t *testing.T) {
	db := openDB(t, &storage.Options{NoSync: true})
	ctx := t.Context()
	waitWatches := func(what string, n int) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for db.WatchesForTest() != n {
			select {
			case <-deadline:
				t.Fatalf("%s: %d watches, want %d", what, db.WatchesForTest(), n)
			case <-tick.C:
			}
		}
	}
	old := mustCreate(t, db, "s", storage.CreateOptions{})
	errc := make(chan error, 2)
	go func() { errc <- db.WaitID(ctx, "s", storage.ZeroOffset, old.ID) }()
	go func() { errc <- db.Wait(ctx, "s", storage.ZeroOffset) }()
	waitWatches("two waiting", 1) // one ID, one channel
	if err := db.Delete(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		wantErr(t, "waiting when deleted", <-errc, storage.ErrNotFound)
	}
	waitWatches("after the delete", 0)
	wantErr(t, "WaitID of a deleted stream", db.WaitID(ctx, "s", storage.ZeroOffset, old.ID), storage.ErrNotFound)
	waitWatches("after WaitID of a deleted stream", 0)
	mustCreate(t, db, "s", storage.CreateOptions{})
	wantErr(t, "WaitID of a stream made anew", db.WaitID(ctx, "s", storage.ZeroOffset, old.ID), storage.ErrNotFound)
	waitWatches("after WaitID of a stream made anew", 0)
	exp := mustCreate(t, db, "e", storage.CreateOptions{ExpiresAt: time.Now().Add(100 * time.Millisecond)})
	wantErr(t, "WaitID of an expiring stream", db.WaitID(ctx, "e", storage.ZeroOffset, exp.ID), storage.ErrNotFound)
	waitWatches("after expiry", 0)
}

// TestDB_HeadOfAForkBeingDeleted: Head of a fork reads its sources too,
// in the same transaction as the fork, so a delete that removes both (the
// source was kept only for the fork) answers not found, never a missing
// source.
func TestDB_HeadOfAForkBeingDeleted(t *testing.T) {
	db := openDB(t, &storage.Options{NoSync: true})
	ctx := t.Context()
	for i := range 100 {
		src, fork := fmt.Sprint("s", i), fmt.Sprint("f", i)
		mustCreate(t, db, src, storage.CreateOptions{})
		mustAppend(t, db, src, storage.AppendRequest{Records: rec("x")})
		mustCreate(t, db, fork, storage.CreateOptions{ForkFrom: src})
		if err := db.Delete(ctx, src); err != nil { // soft: the fork keeps it
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- db.Delete(ctx, fork) }()
		for {
			_, err := db.Head(ctx, fork)
			if errors.Is(err, storage.ErrNotFound) || errors.Is(err, storage.ErrGone) {
				break
			}
			if err != nil {
				t.Fatalf("round %d: Head of a fork being deleted: %v", i, err)
			}
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

func TestDB_AppendAsync(t *testing.T) {
	db := openDB(t, &storage.Options{NoSync: true})
	mustCreate(t, db, "s", storage.CreateOptions{})
	const n = 500
	var mu sync.Mutex
	offsets := make([]string, n)
	calls := make([]int, n)
	var wg sync.WaitGroup
	wg.Add(n)
	for i := range n {
		req := storage.AppendRequest{Records: rec(fmt.Sprintf("%03d", i)), Producer: &storage.Producer{ID: "p", Seq: int64(i)}}
		db.AppendAsync("s", req, func(r storage.AppendResult, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("async %d: %v", i, err)
			}
			offsets[i] = r.Offset
			calls[i]++
			wg.Done()
		})
	}
	wg.Wait()
	for i := range n {
		if calls[i] != 1 || offsets[i] != storage.FormatOffset(uint64(i+1)) {
			t.Fatalf("async %d: %d calls, offset %s", i, calls[i], offsets[i])
		}
	}
	// Refused before queueing: done runs at once.
	var got error
	db.AppendAsync("bad\x00name", storage.AppendRequest{Records: rec("x")}, func(_ storage.AppendResult, err error) { got = err })
	wantErr(t, "bad name", got, storage.ErrBadRequest)
	// Queued before Close: committed and answered; after Close: refused.
	var answered atomic.Int32
	for i := range 100 {
		db.AppendAsync("s", storage.AppendRequest{Records: rec(fmt.Sprint(i))}, func(_ storage.AppendResult, err error) {
			if err == nil {
				answered.Add(1)
			}
		})
	}
	db.Close()
	if answered.Load() != 100 {
		t.Fatalf("%d of 100 queued appends answered by Close", answered.Load())
	}
	db.AppendAsync("s", storage.AppendRequest{Records: rec("x")}, func(_ storage.AppendResult, err error) { got = err })
	wantErr(t, "after Close", got, storage.ErrClosedDB)
}

// The writer's producer cache per stream is bounded: thousands of
// distinct Producer-Ids do not all stay in memory, and a producer whose
// state was dropped from it still gets its duplicate from the file.
func TestDB_ProducerCacheBounded(t *testing.T) {
	var self atomic.Pointer[storage.DB]
	var last atomic.Int64 // written on the writer's goroutine
	o := &storage.Options{NoSync: true}
	storage.SetCommitHookForTest(o, func() error {
		if db := self.Load(); db != nil {
			last.Store(int64(db.CachedProducersForTest("s")))
		}
		return nil
	})
	db := openDB(t, o)
	self.Store(db)
	mustCreate(t, db, "s", storage.CreateOptions{})
	first := mustAppend(t, db, "s", storage.AppendRequest{Records: rec("x"), Producer: &storage.Producer{ID: "p0"}})
	const producers = 3000
	var wg sync.WaitGroup
	for i := 1; i < producers; i++ {
		wg.Add(1)
		db.AppendAsync("s", storage.AppendRequest{Records: rec("x"), Producer: &storage.Producer{ID: fmt.Sprint("p", i)}},
			func(_ storage.AppendResult, err error) {
				if err != nil {
					t.Error(err)
				}
				wg.Done()
			})
	}
	wg.Wait()
	// One more commit, without a producer: its hook sees what the
	// commits before left in the cache.
	mustAppend(t, db, "s", storage.AppendRequest{Records: rec("y")})
	if n := last.Load(); n > 1024 {
		t.Fatalf("the writer keeps %d producer states of %d between commits", n, producers)
	}
	res, err := db.Append(t.Context(), "s", storage.AppendRequest{Records: rec("x"), Producer: &storage.Producer{ID: "p0"}})
	if err != nil || !res.Duplicate || res.Offset != first.Offset {
		t.Fatalf("retry of p0 after its state left the cache: %+v, %v; want a duplicate at %s", res, err, first.Offset)
	}
}

// TestDB_ForkDepth_Restart: the fork depth bound is computed from the
// file, so it holds after a restart, when no meta of the chain is cached.
func TestDB_ForkDepth_Restart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log.db")
	db, err := storage.Open(path, &storage.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	const limit = storage.MaxForkDepth
	mustCreate(t, db, "l0", storage.CreateOptions{Records: rec("0;")})
	var want bytes.Buffer
	want.WriteString("0;")
	for n := 1; n <= limit; n++ {
		mustCreate(t, db, fmt.Sprint("l", n), storage.CreateOptions{ForkFrom: fmt.Sprint("l", n-1), Records: rec(fmt.Sprint(n, ";"))})
		fmt.Fprint(&want, n, ";")
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	db, err = storage.Open(path, &storage.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tip := fmt.Sprint("l", limit)
	_, _, err = db.Create(t.Context(), "over", storage.CreateOptions{ForkFrom: tip})
	de, ok := errors.AsType[*storage.ForkDepthError](err)
	if !ok || de.Source != tip || de.Max != limit || !errors.Is(err, storage.ErrBadRequest) {
		t.Fatalf("fork of the tip after restart: err = %#v", err)
	}
	if got := content(t, db, tip); got != want.String() {
		t.Fatalf("tip after restart = %q, want %q", got, want.String())
	}
	mustCreate(t, db, "alt", storage.CreateOptions{ForkFrom: fmt.Sprint("l", limit-1)})
}
