package storage_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/syncgate/syncgate/storage"
)

// TestDB_Fork_BelowSourceBase: a fork of a fork, at an offset below the
// source's own fork offset, reads its grand-source only up to that
// offset, then its own records: each position once, in order.
func TestDB_Fork_BelowSourceBase(t *testing.T) {
	db := openDB(t, &storage.Options{NoSync: true})
	mustCreate(t, db, "g", storage.CreateOptions{Records: rec("a", "b", "c", "d")})
	mustCreate(t, db, "s", storage.CreateOptions{ForkFrom: "g", ForkOffset: storage.FormatOffset(3)})
	mustAppend(t, db, "s", storage.AppendRequest{Records: rec("s")})
	mustCreate(t, db, "f", storage.CreateOptions{ForkFrom: "s", ForkOffset: storage.FormatOffset(1)})
	mustAppend(t, db, "f", storage.AppendRequest{Records: rec("f")})
	res, err := db.Read(t.Context(), "f", storage.ZeroOffset, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range res.Records {
		got = append(got, r.Offset[len(r.Offset)-1:]+"="+string(r.Data))
	}
	if want := "[1=a 2=f]"; fmt.Sprint(got) != want || !res.UpToDate {
		t.Fatalf("fork f reads %v (up to date %v), want %s", got, res.UpToDate, want)
	}
	// A fork of f at sub-offset 1 after offset 1 copies the first byte of f's append.
	mustCreate(t, db, "ff", storage.CreateOptions{ForkFrom: "f", ForkOffset: storage.FormatOffset(1), ForkSubOffset: 1})
	if c := content(t, db, "ff"); c != "af" {
		t.Fatalf("fork ff reads %q, want %q", c, "af")
	}

	// The source's own retention does not reach a fork below its base.
	pdb := openDB(t, &storage.Options{NoSync: true, Retention: storage.Retention{MaxRecords: 1}})
	mustCreate(t, pdb, "g", storage.CreateOptions{Records: rec("a", "b", "c", "d"), Retention: &storage.Retention{}})
	mustCreate(t, pdb, "s", storage.CreateOptions{ForkFrom: "g", ForkOffset: storage.FormatOffset(3)})
	mustAppend(t, pdb, "s", storage.AppendRequest{Records: rec("x")})
	mustAppend(t, pdb, "s", storage.AppendRequest{Records: rec("y")}) // MaxRecords 1: x goes
	maintain(t, pdb)
	mustCreate(t, pdb, "f", storage.CreateOptions{ForkFrom: "s", ForkOffset: storage.FormatOffset(1), Retention: &storage.Retention{}})
	in, err := pdb.Head(t.Context(), "f")
	if err != nil || in.Pruned != storage.ZeroOffset {
		t.Fatalf("Head(f) = %+v, %v; want nothing pruned", in, err)
	}
	_, err = pdb.Read(t.Context(), "f", storage.ZeroOffset, 0)
	var pe *storage.PrunedError
	if errors.As(err, &pe) {
		t.Fatalf("Read(f): %v; nothing f reads was pruned", err)
	}
	if c := content(t, pdb, "f"); c != "a" {
		t.Fatalf("fork f reads %q, want %q", c, "a")
	}
}
