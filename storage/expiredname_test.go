package storage_test

import (
	"context"
	"testing"
	"time"

	"github.com/syncgate/syncgate/storage"
)

// TestDB_RefusedAtExpiredChangesNothing: a Create or Delete at the name
// of an expired stream that is refused leaves the expired stream as it
// was; only an admitted Create, or the maintenance pass, removes it.
// Removing it is visible: an expired fork releases its source, and a
// soft-deleted source it was the last fork of goes with it (ErrGone
// becomes ErrNotFound, and its name is free). Delete and a refused
// Create used to remove it anyway.
func TestDB_RefusedAtExpiredChangesNothing(t *testing.T) {
	for _, tc := range []struct {
		name    string
		refused func(ctx context.Context, db *storage.DB) error
		want    error
	}{
		{"Delete", func(ctx context.Context, db *storage.DB) error {
			return db.Delete(ctx, "f")
		}, storage.ErrNotFound},
		{"CreateTooLarge", func(ctx context.Context, db *storage.DB) error {
			_, _, err := db.Create(ctx, "f", storage.CreateOptions{Records: rec("too large")})
			return err
		}, storage.ErrTooLarge},
		{"CreateForkOfMissing", func(ctx context.Context, db *storage.DB) error {
			_, _, err := db.Create(ctx, "f", storage.CreateOptions{ForkFrom: "nosuch"})
			return err
		}, storage.ErrNotFound},
		{"CreateForkOfItsSource", func(ctx context.Context, db *storage.DB) error {
			// The source reads as gone (it has a fork, expired), as it
			// does to a fork made at any other name.
			_, _, err := db.Create(ctx, "f", storage.CreateOptions{ForkFrom: "src"})
			return err
		}, storage.ErrConflict},
		{"CreateForkConflict", func(ctx context.Context, db *storage.DB) error {
			_, _, err := db.Create(ctx, "f", storage.CreateOptions{ForkFrom: "other", ContentType: "application/json"})
			return err
		}, storage.ErrConflict},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newClock()
			db := openDB(t, &storage.Options{Now: clk.Now, NoSync: true, MaxAppendBytes: 4})
			ctx := t.Context()
			mustCreate(t, db, "src", storage.CreateOptions{Records: rec("a")})
			mustCreate(t, db, "other", storage.CreateOptions{})
			mustCreate(t, db, "f", storage.CreateOptions{ForkFrom: "src", TTL: time.Second})
			if err := db.Delete(ctx, "src"); err != nil { // soft: f reads it
				t.Fatal(err)
			}
			clk.Advance(2 * time.Second)
			_, err := db.Head(ctx, "f")
			wantErr(t, "the expired fork", err, storage.ErrNotFound)

			wantErr(t, "the refused request", tc.refused(ctx, db), tc.want)
			_, err = db.Head(ctx, "src")
			wantErr(t, "the source of the expired fork after the refused request", err, storage.ErrGone)
			_, _, err = db.Create(ctx, "src", storage.CreateOptions{})
			wantErr(t, "Create at the source's name after the refused request", err, storage.ErrConflict)

			maintain(t, db)
			_, err = db.Head(ctx, "src")
			wantErr(t, "the source after the maintenance pass", err, storage.ErrNotFound)
		})
	}

	// An admitted Create at the expired name removes it at once.
	clk := newClock()
	db := openDB(t, &storage.Options{Now: clk.Now, NoSync: true})
	ctx := t.Context()
	mustCreate(t, db, "src", storage.CreateOptions{Records: rec("a")})
	mustCreate(t, db, "f", storage.CreateOptions{ForkFrom: "src", TTL: time.Second})
	if err := db.Delete(ctx, "src"); err != nil {
		t.Fatal(err)
	}
	clk.Advance(2 * time.Second)
	if _, created, err := db.Create(ctx, "f", storage.CreateOptions{Records: rec("b")}); err != nil || !created {
		t.Fatalf("Create at the expired fork's name: created %v, %v", created, err)
	}
	_, err := db.Head(ctx, "src")
	wantErr(t, "the source after a Create took its last fork's name", err, storage.ErrNotFound)
	if got := content(t, db, "f"); got != "b" {
		t.Fatalf("new stream at the name holds %q", got)
	}
}
