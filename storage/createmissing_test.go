package storage_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/syncgate/syncgate/storage"
)

// createMissing is a JSON append that makes its stream if there is none.
func createMissing(p *storage.Producer, data ...string) storage.AppendRequest {
	return storage.AppendRequest{Records: rec(data...), ContentType: "application/json", Producer: p, CreateMissing: true}
}

func notFound(t *testing.T, db *storage.DB, name, what string) {
	t.Helper()
	if in, err := db.Head(t.Context(), name); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("%s: Head(%q) = %+v, %v; want no stream", what, name, in, err)
	}
}

// Refused CreateMissing appends and admitted ones in one commit: each
// refusal changes nothing (a later append without CreateMissing finds no
// stream), the first admitted one makes the stream, and the later ones
// see it.
func TestDB_CreateMissing_RefusedInBatch(t *testing.T) {
	db := openDB(t, &storage.Options{NoSync: true, MaxAppendBytes: 100})
	p := func(id string, seq int64) *storage.Producer { return &storage.Producer{ID: id, Seq: seq} }
	big := string(make([]byte, 101))
	res, errs := db.AppendBatchForTest("s", []storage.AppendRequest{
		createMissing(p("p", 3), "gap"),    // unknown producer: must start at 0
		createMissing(p("p", 0), big),      // over MaxAppendBytes
		createMissing(nil, big),            // over MaxAppendBytes, no producer
		{Records: rec("plain")},            // without CreateMissing: still no stream
		createMissing(p("p", 0), "a"),      // admitted: makes the stream
		createMissing(p("p", 0), "dup"),    // its retry
		createMissing(p("p", 5), "gap2"),   // a gap on the stream just made
		createMissing(p("q", 0), "b", "c"), // another producer
		createMissing(p("r", 2), "gap3"),   // unknown on the stream
	})
	for i, want := range []string{"gap 0", "large", "large", "missing", "", "", "gap 1", "", "gap 0"} {
		var pe *storage.ProducerError
		got := ""
		switch err := errs[i]; {
		case err == nil:
		case errors.As(err, &pe) && pe.Kind == storage.KindGap:
			got = fmt.Sprint("gap ", pe.ExpectedSeq)
		case errors.Is(err, storage.ErrTooLarge):
			got = "large"
		case errors.Is(err, storage.ErrNotFound):
			got = "missing"
		default:
			got = err.Error()
		}
		if got != want {
			t.Fatalf("request %d: %q, want %q", i, got, want)
		}
	}
	if r := res[4]; r.Duplicate || r.Offset != storage.FormatOffset(1) || r.Seq != 0 {
		t.Fatalf("admitted append: %+v, want the first offset", r)
	}
	if r := res[5]; !r.Duplicate || r.Offset != storage.FormatOffset(1) {
		t.Fatalf("retry: %+v, want a duplicate at the first offset", r)
	}
	if r := res[7]; r.Duplicate || r.Offset != storage.FormatOffset(3) {
		t.Fatalf("second producer: %+v, want offset 3", r)
	}
	in, err := db.Head(t.Context(), "s")
	if err != nil || in.Tail != storage.FormatOffset(3) || in.ContentType != "application/json" {
		t.Fatalf("Head: %+v, %v", in, err)
	}
	if got := content(t, db, "s"); got != "abc" {
		t.Fatalf("content %q, want abc", got)
	}
	// The producer states are the admitted ones: p at 0, q at 0, no r.
	mustAppend(t, db, "s", storage.AppendRequest{Records: rec("d"), Producer: p("p", 1)})
	_, err = db.Append(t.Context(), "s", storage.AppendRequest{Records: rec("e"), Producer: p("r", 3)})
	var pe *storage.ProducerError
	if !errors.As(err, &pe) || pe.Kind != storage.KindGap || pe.ExpectedSeq != 0 {
		t.Fatalf("producer r after the batch: %v, want a gap expecting 0", err)
	}
}

// A commit of refused CreateMissing appends only leaves no stream, and
// the next admitted one makes it at the first offset.
func TestDB_CreateMissing_RefusedAlone(t *testing.T) {
	db := openDB(t, &storage.Options{NoSync: true, MaxAppendBytes: 100})
	_, errs := db.AppendBatchForTest("s", []storage.AppendRequest{
		createMissing(&storage.Producer{ID: "p", Seq: 3}, "x"),
		createMissing(nil, string(make([]byte, 101))),
	})
	if errs[0] == nil || errs[1] == nil {
		t.Fatalf("errors %v, want both refused", errs)
	}
	notFound(t, db, "s", "after a batch of refusals")
	_, err := db.Append(t.Context(), "s", createMissing(&storage.Producer{ID: "p", Seq: 1}, "x"))
	var pe *storage.ProducerError
	if !errors.As(err, &pe) || pe.Kind != storage.KindGap {
		t.Fatalf("Append of seq 1: %v, want a gap", err)
	}
	notFound(t, db, "s", "after a gap")
	if r := mustAppend(t, db, "s", createMissing(&storage.Producer{ID: "p"}, "a")); r.Offset != storage.FormatOffset(1) {
		t.Fatalf("admitted: %+v, want the first offset", r)
	}
}

// An expired stream stays expired when a CreateMissing append at its
// name is refused: no new stream takes its place.
func TestDB_CreateMissing_RefusedAtExpired(t *testing.T) {
	clk := newClock()
	db := openDB(t, &storage.Options{Now: clk.Now, NoSync: true})
	old := mustCreate(t, db, "s", storage.CreateOptions{ContentType: "application/json", TTL: time.Second})
	mustAppend(t, db, "s", createMissing(&storage.Producer{ID: "p"}, "old"))
	clk.Advance(2 * time.Second)
	notFound(t, db, "s", "expired")
	_, err := db.Append(t.Context(), "s", createMissing(&storage.Producer{ID: "p", Seq: 1}, "x"))
	var pe *storage.ProducerError
	if !errors.As(err, &pe) || pe.Kind != storage.KindGap || pe.ExpectedSeq != 0 {
		t.Fatalf("seq 1 at an expired stream: %v, want a gap expecting 0", err)
	}
	notFound(t, db, "s", "after the refused append")
	r := mustAppend(t, db, "s", createMissing(&storage.Producer{ID: "p"}, "new"))
	in, err := db.Head(t.Context(), "s")
	if err != nil || r.Offset != storage.FormatOffset(1) || in.ID == old.ID || in.Tail != storage.FormatOffset(1) {
		t.Fatalf("admitted: %+v; Head %+v, %v; want a new stream (not ID %d) at the first offset", r, in, err, old.ID)
	}
	if got := content(t, db, "s"); got != "new" {
		t.Fatalf("content %q", got)
	}
}
