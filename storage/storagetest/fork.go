package storagetest

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/syncgate/syncgate/storage"
)

var forkTests = []test{
	{"StitchedRead", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{ContentType: "text/plain"})
		h.append("s", "source")
		in := h.create("f", storage.CreateOptions{ForkFrom: "s"})
		eq(t, "fork type inherited", in.ContentType, "text/plain")
		eq(t, "ForkFrom", in.ForkFrom, "s")
		eq(t, "ForkOffset", in.ForkOffset, off(1))
		eq(t, "Tail", in.Tail, off(1))
		r := h.append("f", " fork")
		eq(t, "fork offset continues", r.Offset, off(2))
		h.append("s", " later")
		eq(t, "fork", h.content("f"), "source fork")
		eq(t, "source", h.content("s"), "source later")
		eq(t, "from fork offset", strings.Join(h.readAll("f", off(1)), ""), " fork")
		res, err := h.l.Read(h.ctx, "f", storage.ZeroOffset, 0)
		if err != nil {
			t.Fatal(err)
		}
		eq(t, "UpToDate", res.UpToDate, true)
		eq(t, "Offsets", res.Records[0].Offset+" "+res.Records[1].Offset, off(1)+" "+off(2))
		_, err = h.l.Read(h.ctx, "f", off(3), 0)
		isErr(t, "fork read beyond its tail", err, storage.ErrBadRequest)
	}},
	{"Offsets", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{})
		for _, s := range []string{"a", "b", "c"} {
			h.append("s", s)
		}
		for i := range 4 {
			name := fmt.Sprintf("f%d", i)
			h.create(name, storage.CreateOptions{ForkFrom: "s", ForkOffset: off(uint64(i))})
			eq(t, name, h.content(name), "abc"[:i])
		}
		for i, o := range []string{off(4), "9999999999999999_9999999999999999"} {
			_, _, err := h.l.Create(h.ctx, fmt.Sprintf("bad%d", i), storage.CreateOptions{ForkFrom: "s", ForkOffset: o})
			isErr(t, "beyond tail "+o, err, storage.ErrBadRequest)
		}
		_, _, err := h.l.Create(h.ctx, "bad", storage.CreateOptions{ForkFrom: "s", ForkOffset: "1_2"})
		isErr(t, "malformed", err, storage.ErrBadRequest)
		_, _, err = h.l.Create(h.ctx, "bad", storage.CreateOptions{ForkFrom: "nope"})
		isErr(t, "missing source", err, storage.ErrNotFound)
		h.create("empty", storage.CreateOptions{})
		h.create("fe", storage.CreateOptions{ForkFrom: "empty"})
		eq(t, "fork of empty", h.content("fe"), "")
	}},
	{"ContentType", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{ContentType: "application/json"})
		h.append("s", `{"from":"source"}`)
		_, _, err := h.l.Create(h.ctx, "bad", storage.CreateOptions{ForkFrom: "s", ContentType: "text/plain"})
		isErr(t, "mismatch", err, storage.ErrConflict)
		in := h.create("f", storage.CreateOptions{ForkFrom: "s", ContentType: "application/json; charset=utf-8"})
		eq(t, "verbatim", in.ContentType, "application/json; charset=utf-8")
		h.append("f", `{"from":"fork"}`)
		eq(t, "json", strings.Join(h.readAll("f", storage.ZeroOffset), ","), `{"from":"source"},{"from":"fork"}`)
		// The refused fork left no reference: deleting the source removes it.
		if err := h.l.Delete(h.ctx, "f"); err != nil {
			t.Fatal(err)
		}
		if err := h.l.Delete(h.ctx, "s"); err != nil {
			t.Fatal(err)
		}
		_, err = h.l.Head(h.ctx, "s")
		isErr(t, "source deleted", err, storage.ErrNotFound)
	}},
	{"Idempotent", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{})
		h.append("s", "hello")
		h.create("f", storage.CreateOptions{ForkFrom: "s"})
		h.append("s", "more")
		for i, o := range []storage.CreateOptions{
			{ForkFrom: "s"},
			{ForkFrom: "s", ForkOffset: off(1)},
			{ForkFrom: "s", ContentType: "application/octet-stream"},
		} {
			_, created, err := h.l.Create(h.ctx, "f", o)
			if err != nil || created {
				t.Fatalf("case %d: created=%v err=%v", i, created, err)
			}
		}
		h.create("g", storage.CreateOptions{ForkFrom: "s", ForkOffset: off(1), ForkSubOffset: 3})
		for i, o := range []storage.CreateOptions{
			{ForkFrom: "s", ForkOffset: off(1), ForkSubOffset: 2},
			{ForkFrom: "s", ForkOffset: off(0), ForkSubOffset: 3},
			{ForkFrom: "other", ForkOffset: off(1), ForkSubOffset: 3},
			{},
		} {
			_, _, err := h.l.Create(h.ctx, "g", o)
			isErr(t, fmt.Sprintf("conflict %d", i), err, storage.ErrConflict)
		}
		if _, created, err := h.l.Create(h.ctx, "g", storage.CreateOptions{ForkFrom: "s", ForkOffset: off(1), ForkSubOffset: 3}); err != nil || created {
			t.Fatalf("same sub-offset: %v %v", created, err)
		}
		_, _, err := h.l.Create(h.ctx, "s", storage.CreateOptions{ForkFrom: "f"})
		isErr(t, "plain stream re-created as fork", err, storage.ErrConflict)
	}},
	{"SubOffset", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{})
		h.append("s", "hello")
		in := h.create("f", storage.CreateOptions{ForkFrom: "s", ForkOffset: storage.ZeroOffset, ForkSubOffset: 3})
		eq(t, "ForkSubOffset", in.ForkSubOffset, 3)
		eq(t, "sub 3", h.content("f"), "hel")
		res, err := h.l.Read(h.ctx, "f", in.Tail, 0)
		if err != nil || len(res.Records) != 0 || !res.UpToDate {
			t.Fatalf("read at the fork's tail: %+v %v", res, err)
		}
		h.append("f", "LO")
		eq(t, "appends follow", h.content("f"), "helLO")
		h.create("g", storage.CreateOptions{ForkFrom: "s", ForkOffset: storage.ZeroOffset, ForkSubOffset: 3, Records: recs("XY")})
		eq(t, "initial records after the prefix", h.content("g"), "helXY")
		h.create("whole", storage.CreateOptions{ForkFrom: "s", ForkOffset: storage.ZeroOffset, ForkSubOffset: 5})
		eq(t, "sub = length", h.content("whole"), "hello")
		h.create("zero", storage.CreateOptions{ForkFrom: "s", ForkOffset: storage.ZeroOffset, ForkSubOffset: 0})
		eq(t, "sub 0", h.content("zero"), "")
		for i, o := range []storage.CreateOptions{
			{ForkFrom: "s", ForkOffset: storage.ZeroOffset, ForkSubOffset: 6},
			{ForkFrom: "s", ForkSubOffset: 1}, // default tail: nothing after
			{ForkFrom: "s", ForkOffset: storage.ZeroOffset, ForkSubOffset: -1},
		} {
			_, _, err := h.l.Create(h.ctx, fmt.Sprintf("bad%d", i), o)
			isErr(t, fmt.Sprintf("bad %d", i), err, storage.ErrBadRequest)
		}
		h.create("e", storage.CreateOptions{})
		_, _, err = h.l.Create(h.ctx, "bad", storage.CreateOptions{ForkFrom: "e", ForkOffset: storage.ZeroOffset, ForkSubOffset: 1})
		isErr(t, "empty source", err, storage.ErrBadRequest)
		// Mid-stream anchor.
		h.create("m", storage.CreateOptions{})
		h.append("m", "first")
		h.append("m", "second")
		h.create("mf", storage.CreateOptions{ForkFrom: "m", ForkOffset: off(1), ForkSubOffset: 3})
		eq(t, "mid-stream", h.content("mf"), "firstsec")
		// Closed source.
		h.create("c", storage.CreateOptions{Records: recs("closed"), Closed: true})
		h.create("cf", storage.CreateOptions{ForkFrom: "c", ForkOffset: storage.ZeroOffset, ForkSubOffset: 2})
		eq(t, "closed source", h.content("cf"), "cl")
	}},
	{"SubOffsetJSON", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{ContentType: "application/json"})
		h.append("s", `{"a":1}`, `{"b":2}`, `{"c":3}`, `{"d":4}`)
		h.create("f", storage.CreateOptions{ForkFrom: "s", ForkOffset: storage.ZeroOffset, ForkSubOffset: 2})
		eq(t, "sub 2", strings.Join(h.readAll("f", storage.ZeroOffset), ","), `{"a":1},{"b":2}`)
		h.create("g", storage.CreateOptions{ForkFrom: "s", ForkOffset: storage.ZeroOffset, ForkSubOffset: 4})
		_, _, err := h.l.Create(h.ctx, "bad", storage.CreateOptions{ForkFrom: "s", ForkOffset: storage.ZeroOffset, ForkSubOffset: 5})
		isErr(t, "sub > count", err, storage.ErrBadRequest)
	}},
	{"SubOffsetChain", func(t *testing.T, h *h) {
		h.create("a", storage.CreateOptions{Records: recs("abcdef")})
		h.create("b", storage.CreateOptions{ForkFrom: "a", ForkOffset: storage.ZeroOffset, ForkSubOffset: 4})
		h.create("c", storage.CreateOptions{ForkFrom: "b", ForkOffset: storage.ZeroOffset, ForkSubOffset: 2})
		h.append("c", "Z")
		eq(t, "chain", h.content("c"), "abZ")
		eq(t, "b", h.content("b"), "abcd")
	}},
	{"Recursive", func(t *testing.T, h *h) {
		h.create("l0", storage.CreateOptions{Records: recs("A")})
		h.create("l1", storage.CreateOptions{ForkFrom: "l0"})
		h.append("l1", "B")
		h.create("l2", storage.CreateOptions{ForkFrom: "l1"})
		h.append("l2", "C")
		h.append("l0", "x")
		h.append("l1", "y")
		eq(t, "l0", h.content("l0"), "Ax")
		eq(t, "l1", h.content("l1"), "ABy")
		eq(t, "l2", h.content("l2"), "ABC")
		eq(t, "l2 from 1", strings.Join(h.readAll("l2", off(1)), ""), "BC")
		res, err := h.l.Read(h.ctx, "l2", storage.ZeroOffset, 1)
		if err != nil || len(res.Records) != 1 || res.Next != off(1) {
			t.Fatalf("paged across levels: %+v %v", res, err)
		}
	}},
	{"DepthBound", func(t *testing.T, h *h) {
		// l0 is no fork; each lN forks l(N-1) at its tail and adds "N;",
		// up to a chain exactly MaxForkDepth forks deep. Each source then
		// gets an "x" its forks must not see.
		const limit = storage.MaxForkDepth
		level := func(n int) string { return fmt.Sprint("l", n) }
		h.create(level(0), storage.CreateOptions{Records: recs("0;")})
		want := []string{"0;"}
		for n := 1; n <= limit; n++ {
			h.create(level(n), storage.CreateOptions{ForkFrom: level(n - 1), Records: recs(fmt.Sprint(n, ";"))})
			h.append(level(n-1), "x")
			want = append(want, fmt.Sprint(n, ";"))
		}
		tip := level(limit)
		eq(t, "tip", h.content(tip), strings.Join(want, ""))
		eq(t, "tip's tail", h.head(tip).Tail, off(limit+1))
		// Page by page, one record each: every level's record, in order,
		// at its offset.
		after := storage.ZeroOffset
		for i, w := range want {
			res, err := h.l.Read(h.ctx, tip, after, 1)
			if err != nil || len(res.Records) != 1 {
				t.Fatalf("page %d: %+v %v", i, res, err)
			}
			eq(t, fmt.Sprint("record ", i), string(res.Records[0].Data), w)
			eq(t, fmt.Sprint("offset ", i), res.Records[0].Offset, off(uint64(i+1)))
			eq(t, fmt.Sprint("up to date ", i), res.UpToDate, i == len(want)-1)
			after = res.Next
		}

		over := func(what string, o storage.CreateOptions) {
			t.Helper()
			_, _, err := h.l.Create(h.ctx, "over", o)
			isErr(t, what, err, storage.ErrBadRequest)
			de, ok := errors.AsType[*storage.ForkDepthError](err)
			if !ok || de.Source != o.ForkFrom || de.Max != limit {
				t.Fatalf("%s: err = %#v, want a *ForkDepthError naming %q and %d", what, err, o.ForkFrom, limit)
			}
			_, err = h.l.Head(h.ctx, "over")
			isErr(t, what+": nothing created", err, storage.ErrNotFound)
		}
		over("fork of the tip", storage.CreateOptions{ForkFrom: tip})
		over("fork of the tip at 0", storage.CreateOptions{ForkFrom: tip, ForkOffset: storage.ZeroOffset})
		over("fork of the tip with a sub-offset", storage.CreateOptions{ForkFrom: tip, ForkOffset: off(limit), ForkSubOffset: 1})
		if _, created, err := h.l.Create(h.ctx, tip, storage.CreateOptions{ForkFrom: level(limit - 1), Records: recs(fmt.Sprint(limit, ";"))}); err != nil || created {
			t.Fatalf("re-Create of the tip: created=%v err=%v", created, err)
		}
		// An earlier ancestor can still be forked.
		h.create("alt", storage.CreateOptions{ForkFrom: level(limit - 1), ForkOffset: off(limit), Records: recs("alt")})
		eq(t, "alt", h.content("alt"), strings.Join(want[:limit], "")+"alt")
		// Soft-deleted levels are still read, so still counted.
		for n := 1; n < limit; n++ {
			if err := h.l.Delete(h.ctx, level(n)); err != nil {
				t.Fatal(err)
			}
		}
		over("fork of the tip over soft-deleted levels", storage.CreateOptions{ForkFrom: tip})
		eq(t, "tip over soft-deleted levels", h.content(tip), strings.Join(want, ""))
		// The refused forks took no reference on the tip: it is removed,
		// not soft-deleted.
		if err := h.l.Delete(h.ctx, tip); err != nil {
			t.Fatal(err)
		}
		_, err := h.l.Head(h.ctx, tip)
		isErr(t, "tip deleted", err, storage.ErrNotFound)
	}},
	{"CloseIndependent", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{Records: recs("a")})
		h.create("f", storage.CreateOptions{ForkFrom: "s"})
		h.appendReq("f", storage.AppendRequest{Close: true})
		eq(t, "source open", h.head("s").Closed, false)
		h.append("s", "b")
		h.create("g", storage.CreateOptions{ForkFrom: "s"})
		h.appendReq("s", storage.AppendRequest{Close: true})
		h.append("g", "c")
		eq(t, "g", h.content("g"), "abc")
	}},
	{"SoftDelete", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{Records: recs("src")})
		h.create("f", storage.CreateOptions{ForkFrom: "s"})
		h.append("f", "+fork")
		if err := h.l.Delete(h.ctx, "s"); err != nil {
			t.Fatal(err)
		}
		_, err := h.l.Head(h.ctx, "s")
		isErr(t, "Head", err, storage.ErrGone)
		_, err = h.l.Read(h.ctx, "s", storage.ZeroOffset, 0)
		isErr(t, "Read", err, storage.ErrGone)
		_, err = h.l.Append(h.ctx, "s", storage.AppendRequest{Records: recs("x")})
		isErr(t, "Append", err, storage.ErrGone)
		isErr(t, "Delete", h.l.Delete(h.ctx, "s"), storage.ErrGone)
		_, _, err = h.l.Create(h.ctx, "s", storage.CreateOptions{})
		isErr(t, "Create", err, storage.ErrConflict)
		_, _, err = h.l.Create(h.ctx, "g", storage.CreateOptions{ForkFrom: "s"})
		isErr(t, "fork of soft-deleted", err, storage.ErrConflict)
		eq(t, "fork still reads", h.content("f"), "src+fork")
		if err := h.l.Delete(h.ctx, "f"); err != nil {
			t.Fatal(err)
		}
		eventually(t, "source removed with its last fork", func() bool {
			_, err := h.l.Head(h.ctx, "s")
			return isSentinel(err, storage.ErrNotFound)
		})
		h.create("s", storage.CreateOptions{})
		eq(t, "fresh stream at the name", h.content("s"), "")
	}},
	{"DeleteCascade", func(t *testing.T, h *h) {
		h.create("l0", storage.CreateOptions{Records: recs("A")})
		h.create("l1", storage.CreateOptions{ForkFrom: "l0", Records: recs("B")})
		h.create("l2", storage.CreateOptions{ForkFrom: "l1", Records: recs("C")})
		for _, n := range []string{"l0", "l1"} {
			if err := h.l.Delete(h.ctx, n); err != nil {
				t.Fatal(err)
			}
		}
		eq(t, "l2 reads through soft-deleted levels", h.content("l2"), "ABC")
		if err := h.l.Delete(h.ctx, "l2"); err != nil {
			t.Fatal(err)
		}
		for _, n := range []string{"l0", "l1", "l2"} {
			eventually(t, n+" removed", func() bool {
				_, err := h.l.Head(h.ctx, n)
				return isSentinel(err, storage.ErrNotFound)
			})
		}
	}},
	{"DeleteMiddle", func(t *testing.T, h *h) {
		h.create("l0", storage.CreateOptions{Records: recs("A")})
		h.create("l1", storage.CreateOptions{ForkFrom: "l0", Records: recs("B")})
		h.create("l2", storage.CreateOptions{ForkFrom: "l1", Records: recs("C")})
		if err := h.l.Delete(h.ctx, "l1"); err != nil {
			t.Fatal(err)
		}
		eq(t, "l2", h.content("l2"), "ABC")
		eq(t, "l0", h.content("l0"), "A")
		// Deleting every fork of a live source leaves it alive.
		if err := h.l.Delete(h.ctx, "l2"); err != nil {
			t.Fatal(err)
		}
		eventually(t, "l1 removed", func() bool {
			_, err := h.l.Head(h.ctx, "l1")
			return isSentinel(err, storage.ErrNotFound)
		})
		eq(t, "l0 alive", h.content("l0"), "A")
	}},
	{"DeleteFork", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{Records: recs("A")})
		for i := range 10 {
			h.create(fmt.Sprintf("f%d", i), storage.CreateOptions{ForkFrom: "s", Records: recs(fmt.Sprint(i))})
		}
		for i := range 10 {
			eq(t, "fork", h.content(fmt.Sprintf("f%d", i)), fmt.Sprintf("A%d", i))
			if err := h.l.Delete(h.ctx, fmt.Sprintf("f%d", i)); err != nil {
				t.Fatal(err)
			}
		}
		_, err := h.l.Head(h.ctx, "f3")
		isErr(t, "deleted fork", err, storage.ErrNotFound)
		eq(t, "source unaffected", h.content("s"), "A")
	}},
	{"TTLInheritance", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{TTL: 10 * time.Second})
		eq(t, "inherited TTL", h.create("f", storage.CreateOptions{ForkFrom: "s"}).TTL, 10*time.Second)
		if _, created, err := h.l.Create(h.ctx, "f", storage.CreateOptions{ForkFrom: "s"}); err != nil || created {
			t.Fatalf("re-Create inherited: %v %v", created, err)
		}
		eq(t, "own TTL, uncapped", h.create("g", storage.CreateOptions{ForkFrom: "s", TTL: 99999 * time.Second}).TTL, 99999*time.Second)
		exp := time.Now().Add(time.Hour).UTC().Truncate(time.Millisecond)
		in := h.create("x", storage.CreateOptions{ForkFrom: "s", ExpiresAt: exp})
		if !in.ExpiresAt.Equal(exp) || in.TTL != 0 {
			t.Fatalf("own Expires-At: %+v", in)
		}
		h.create("e", storage.CreateOptions{ExpiresAt: exp, ExpiresAtRaw: "raw"})
		in = h.create("ef", storage.CreateOptions{ForkFrom: "e"})
		if !in.ExpiresAt.Equal(exp) || in.ExpiresAtRaw != "raw" {
			t.Fatalf("inherited Expires-At: %+v", in)
		}
	}},
}
