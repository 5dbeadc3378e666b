package storagetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/syncgate/syncgate/storage"
)

var deleteTests = []test{
	{"Recreate", func(t *testing.T, h *h) {
		isErr(t, "missing", h.l.Delete(h.ctx, "s"), storage.ErrNotFound)
		h.create("s", storage.CreateOptions{ContentType: "text/plain", Records: recs("a", "b")})
		h.appendReq("s", storage.AppendRequest{Records: recs("c"), Producer: prod("p", 0, 0), StreamSeq: "z"})
		if err := h.l.Delete(h.ctx, "s"); err != nil {
			t.Fatal(err)
		}
		_, err := h.l.Head(h.ctx, "s")
		isErr(t, "Head after delete", err, storage.ErrNotFound)
		isErr(t, "Delete again", h.l.Delete(h.ctx, "s"), storage.ErrNotFound)
		in := h.create("s", storage.CreateOptions{ContentType: "application/json"})
		eq(t, "fresh tail", in.Tail, storage.ZeroOffset)
		eq(t, "fresh content", h.content("s"), "")
		r := h.appendReq("s", storage.AppendRequest{Records: recs("1"), Producer: prod("p", 0, 0), StreamSeq: "a"})
		eq(t, "fresh producer state", r.Duplicate, false)
	}},
	{"CreateMissing", func(t *testing.T, h *h) {
		mk := func(seq int64, data string) storage.AppendRequest {
			p := prod("p", 0, seq)
			p.AllowGap = true
			return storage.AppendRequest{Records: recs(data), ContentType: "application/json", Producer: p, CreateMissing: true}
		}
		h.appendReq("s", mk(3, "1"))
		eq(t, "made by the append", h.head("s").ContentType, "application/json")
		h.appendReq("s", mk(4, "2"))
		eq(t, "appended to", h.content("s"), "12")
		if err := h.l.Delete(h.ctx, "s"); err != nil {
			t.Fatal(err)
		}
		r := h.appendReq("s", mk(5, "3"))
		eq(t, "after delete: duplicate", r.Duplicate, false)
		eq(t, "after delete: a fresh stream", h.content("s"), "3")
		// An existing stream is used as it is, never made anew.
		h.create("t", storage.CreateOptions{ContentType: "text/plain"})
		_, err := h.l.Append(h.ctx, "t", mk(0, "4"))
		isErr(t, "other content type", err, storage.ErrContentType)
		h.create("u", storage.CreateOptions{ContentType: "application/json", Closed: true})
		_, err = h.l.Append(h.ctx, "u", mk(0, "5"))
		closedErr(t, "closed stream", err)
		_, err = h.l.Append(h.ctx, "v", storage.AppendRequest{Records: recs("6")})
		isErr(t, "missing, without CreateMissing", err, storage.ErrNotFound)
	}},
	{"CreateMissingRefused", func(t *testing.T, h *h) {
		// An append refused by a check that would refuse it on the new
		// stream makes no stream: a refused append changes nothing.
		missing := func(what string) {
			t.Helper()
			_, err := h.l.Head(h.ctx, "s")
			isErr(t, what+": Head", err, storage.ErrNotFound)
		}
		mk := func(seq int64, data ...[]byte) storage.AppendRequest {
			return storage.AppendRequest{Records: data, ContentType: "application/json", Producer: prod("p", 0, seq), CreateMissing: true}
		}
		_, err := h.l.Append(h.ctx, "s", mk(3, []byte("1")))
		pe := producerErr(t, "unknown producer at seq 3", err, storage.KindGap)
		eq(t, "expected seq", pe.ExpectedSeq, 0)
		missing("after a producer gap")
		big := make([]byte, 32<<20)
		_, err = h.l.Append(h.ctx, "s", mk(0, big[:16<<20], big[16<<20:]))
		isErr(t, "32 MiB", err, storage.ErrTooLarge)
		missing("after a refused size")

		// The next admitted append makes it, at the first offset, and
		// its producer starts at seq 0 as if nothing had come before.
		r := h.appendReq("s", mk(0, []byte("1")))
		eq(t, "first offset", r.Offset, off(1))
		eq(t, "duplicate", r.Duplicate, false)
		in := h.head("s")
		eq(t, "tail", in.Tail, off(1))
		eq(t, "content type", in.ContentType, "application/json")
		r = h.appendReq("s", mk(0, []byte("1")))
		eq(t, "retry: duplicate", r.Duplicate, true)
		eq(t, "retry: offset", r.Offset, off(1))
		eq(t, "content", h.content("s"), "1")

		// Likewise at a name whose stream was deleted.
		if err := h.l.Delete(h.ctx, "s"); err != nil {
			t.Fatal(err)
		}
		_, err = h.l.Append(h.ctx, "s", mk(1, []byte("2")))
		producerErr(t, "after delete, seq 1", err, storage.KindGap)
		missing("after delete and a producer gap")
		r = h.appendReq("s", mk(0, []byte("3")))
		eq(t, "after delete: first offset", r.Offset, off(1))
		eq(t, "after delete: content", h.content("s"), "3")
	}},
	{"Closed", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{Closed: true})
		if err := h.l.Delete(h.ctx, "s"); err != nil {
			t.Fatal(err)
		}
		_, err := h.l.Head(h.ctx, "s")
		isErr(t, "Head", err, storage.ErrNotFound)
	}},
}

// waitResult runs Wait in a goroutine.
func waitAsync(ctx context.Context, l Log, name, after string) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- l.Wait(ctx, name, after) }()
	return ch
}

// notYet asserts that ch has not delivered within a short while. Absence
// can only be observed by waiting; 100 ms keeps the suite fast.
func notYet(t *testing.T, what string, ch <-chan error) {
	t.Helper()
	select {
	case err := <-ch:
		t.Fatalf("%s: Wait returned early: %v", what, err)
	case <-time.After(100 * time.Millisecond):
	}
}

func waitFor(t *testing.T, what string, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: Wait did not return", what)
		return nil
	}
}

var waitTests = []test{
	{"Immediate", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{})
		h.append("s", "a")
		if err := h.l.Wait(h.ctx, "s", storage.ZeroOffset); err != nil {
			t.Fatal(err)
		}
		isErr(t, "missing", h.l.Wait(h.ctx, "nope", storage.ZeroOffset), storage.ErrNotFound)
		isErr(t, "malformed", h.l.Wait(h.ctx, "s", "x"), storage.ErrBadRequest)
		h.create("c", storage.CreateOptions{Closed: true})
		if err := h.l.Wait(h.ctx, "c", storage.ZeroOffset); err != nil {
			t.Fatalf("closed: %v", err)
		}
	}},
	{"WakesOnAppend", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{})
		h.append("s", "a")
		ch := waitAsync(h.ctx, h.l, "s", off(1))
		notYet(t, "before append", ch)
		h.append("s", "b")
		if err := waitFor(t, "append", ch); err != nil {
			t.Fatal(err)
		}
		res, err := h.l.Read(h.ctx, "s", off(1), 0)
		if err != nil || len(res.Records) != 1 || string(res.Records[0].Data) != "b" {
			t.Fatalf("read after wake: %+v %v", res, err)
		}
	}},
	{"WakesOnClose", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{})
		ch := waitAsync(h.ctx, h.l, "s", storage.ZeroOffset)
		notYet(t, "before close", ch)
		h.appendReq("s", storage.AppendRequest{Close: true})
		if err := waitFor(t, "close", ch); err != nil {
			t.Fatal(err)
		}
	}},
	{"WakesOnDelete", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{})
		ch := waitAsync(h.ctx, h.l, "s", storage.ZeroOffset)
		notYet(t, "before delete", ch)
		if err := h.l.Delete(h.ctx, "s"); err != nil {
			t.Fatal(err)
		}
		isErr(t, "deleted", waitFor(t, "delete", ch), storage.ErrNotFound)
		h.create("g", storage.CreateOptions{})
		h.create("gf", storage.CreateOptions{ForkFrom: "g"})
		ch = waitAsync(h.ctx, h.l, "g", storage.ZeroOffset)
		notYet(t, "before soft delete", ch)
		if err := h.l.Delete(h.ctx, "g"); err != nil {
			t.Fatal(err)
		}
		isErr(t, "soft-deleted", waitFor(t, "soft delete", ch), storage.ErrGone)
	}},
	{"DeletedAndMadeAnew", func(t *testing.T, h *h) {
		// Whether Wait sees the stream missing or already made anew, the
		// stream it waited on is gone: never a wait on the new one at
		// the old one's offset, nor a complaint that the offset is
		// beyond the new one's tail (the new one left empty).
		for _, refill := range []bool{true, false} {
			h.create("s", storage.CreateOptions{})
			h.append("s", "a")
			ch := waitAsync(h.ctx, h.l, "s", off(1))
			notYet(t, "before delete", ch)
			if err := h.l.Delete(h.ctx, "s"); err != nil {
				t.Fatal(err)
			}
			h.create("s", storage.CreateOptions{})
			if refill {
				h.append("s", "x")
			}
			isErr(t, fmt.Sprintf("made anew (refilled %v)", refill), waitFor(t, "delete and create", ch), storage.ErrNotFound)
			if err := h.l.Delete(h.ctx, "s"); err != nil {
				t.Fatal(err)
			}
		}
	}},
	{"WaitID", func(t *testing.T, h *h) {
		// On the stream it names, WaitID is Wait; on another stream of
		// the name it answers not found, at once or when it comes to be.
		old := h.create("s", storage.CreateOptions{})
		ch := make(chan error, 1)
		go func() { ch <- h.l.WaitID(h.ctx, "s", storage.ZeroOffset, old.ID) }()
		notYet(t, "before the append", ch)
		h.append("s", "a")
		if err := waitFor(t, "append", ch); err != nil {
			t.Fatal(err)
		}
		go func() { ch <- h.l.WaitID(h.ctx, "s", off(1), old.ID) }()
		notYet(t, "before the delete", ch)
		if err := h.l.Delete(h.ctx, "s"); err != nil {
			t.Fatal(err)
		}
		anew := h.create("s", storage.CreateOptions{})
		h.append("s", "x")
		isErr(t, "made anew while waiting", waitFor(t, "delete and create", ch), storage.ErrNotFound)
		// Made anew before the call, at an offset the new one has as its
		// tail, and at one beyond it: not found, not a wait or a bad offset.
		for _, o := range []string{off(1), off(2)} {
			isErr(t, "old ID at "+o, h.l.WaitID(h.ctx, "s", o, old.ID), storage.ErrNotFound)
		}
		if err := h.l.WaitID(h.ctx, "s", storage.ZeroOffset, anew.ID); err != nil {
			t.Fatalf("WaitID on the new stream: %v", err)
		}
	}},
	{"Context", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{})
		ctx, cancel := context.WithCancel(h.ctx)
		ch := waitAsync(ctx, h.l, "s", storage.ZeroOffset)
		notYet(t, "before cancel", ch)
		cancel()
		if err := waitFor(t, "cancel", ch); !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
	}},
	{"ForkWakesOnOwnAppends", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{Records: recs("a")})
		in := h.create("f", storage.CreateOptions{ForkFrom: "s"})
		if err := h.l.Wait(h.ctx, "f", storage.ZeroOffset); err != nil {
			t.Fatalf("inherited data: %v", err)
		}
		ch := waitAsync(h.ctx, h.l, "f", in.Tail)
		h.append("s", "source")
		notYet(t, "source append", ch)
		h.append("f", "fork")
		if err := waitFor(t, "fork append", ch); err != nil {
			t.Fatal(err)
		}
		eq(t, "fork", h.content("f"), "afork")
	}},
	{"KeepsSlidingTTL", func(t *testing.T, h *h) {
		// A blocked Wait keeps a sliding TTL from running out, however
		// long it waits; the TTL runs again from when it returns. On real
		// time (the suite has no clock): the Wait starts at once after
		// the create, and lasts three TTLs, past which a stream no one
		// waits on is gone.
		const ttl = 500 * time.Millisecond
		h.create("idle", storage.CreateOptions{TTL: ttl})
		h.create("s", storage.CreateOptions{TTL: ttl})
		ctx, cancel := context.WithTimeout(h.ctx, 3*ttl)
		defer cancel()
		if err := h.l.Wait(ctx, "s", storage.ZeroOffset); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait on a stream with a TTL a third of the wait: %v, want it to run to its deadline", err)
		}
		h.head("s")
		_, err := h.l.Head(h.ctx, "idle")
		isErr(t, "the stream no one waited on", err, storage.ErrNotFound)
	}},
	{"Many", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{})
		chs := make([]<-chan error, 50)
		for i := range chs {
			chs[i] = waitAsync(h.ctx, h.l, "s", storage.ZeroOffset)
		}
		h.append("s", "a")
		for _, ch := range chs {
			if err := waitFor(t, "many", ch); err != nil {
				t.Fatal(err)
			}
		}
	}},
}
