package storagetest

import (
	"fmt"
	"sync"
	"testing"

	"github.com/syncgate/syncgate/storage"
)

var producerTests = []test{
	{"Sequence", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{})
		r := h.appendReq("s", storage.AppendRequest{Records: recs("a"), Producer: prod("p", 0, 0)})
		eq(t, "Epoch", r.Epoch, 0)
		eq(t, "Seq", r.Seq, 0)
		eq(t, "Offset", r.Offset, off(1))
		h.appendReq("s", storage.AppendRequest{Records: recs("b"), Producer: prod("p", 0, 1)})
		r = h.appendReq("s", storage.AppendRequest{Records: recs("c", "d"), Producer: prod("p", 0, 2)})
		eq(t, "Offset", r.Offset, off(4))
		// Duplicates: nothing written, original offset, highest seq.
		for seq, want := range []string{off(1), off(2), off(4)} {
			d := h.appendReq("s", storage.AppendRequest{Records: recs("zzz"), Producer: prod("p", 0, int64(seq))})
			eq(t, fmt.Sprintf("dup %d Duplicate", seq), d.Duplicate, true)
			eq(t, fmt.Sprintf("dup %d Offset", seq), d.Offset, want)
			eq(t, fmt.Sprintf("dup %d Seq", seq), d.Seq, 2)
			eq(t, fmt.Sprintf("dup %d Offsets", seq), len(d.Offsets), 0)
		}
		eq(t, "content", h.content("s"), "abcd")
		// Gap.
		_, err := h.l.Append(h.ctx, "s", storage.AppendRequest{Records: recs("x"), Producer: prod("p", 0, 5)})
		pe := producerErr(t, "gap", err, storage.KindGap)
		eq(t, "ExpectedSeq", pe.ExpectedSeq, 3)
		eq(t, "ReceivedSeq", pe.ReceivedSeq, 5)
		// New epoch must start at 0.
		_, err = h.l.Append(h.ctx, "s", storage.AppendRequest{Records: recs("x"), Producer: prod("p", 1, 1)})
		pe = producerErr(t, "epoch seq", err, storage.KindEpochSeq)
		eq(t, "ReceivedSeq", pe.ReceivedSeq, 1)
		r = h.appendReq("s", storage.AppendRequest{Records: recs("e"), Producer: prod("p", 1, 0)})
		eq(t, "new epoch", r.Epoch, 1)
		// The old epoch is fenced.
		_, err = h.l.Append(h.ctx, "s", storage.AppendRequest{Records: recs("x"), Producer: prod("p", 0, 3)})
		pe = producerErr(t, "fenced", err, storage.KindFenced)
		eq(t, "CurrentEpoch", pe.CurrentEpoch, 1)
		eq(t, "content", h.content("s"), "abcde")
	}},
	{"UnknownProducer", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{})
		_, err := h.l.Append(h.ctx, "s", storage.AppendRequest{Records: recs("x"), Producer: prod("p", 0, 1)})
		pe := producerErr(t, "first seq 1", err, storage.KindGap)
		eq(t, "ExpectedSeq", pe.ExpectedSeq, 0)
		eq(t, "ReceivedSeq", pe.ReceivedSeq, 1)
		r := h.appendReq("s", storage.AppendRequest{Records: recs("x"), Producer: prod("q", 2, 0)})
		eq(t, "any epoch at seq 0", r.Epoch, 2)
	}},
	{"AllowGap", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{})
		g := func(epoch, seq int64) *storage.Producer {
			return &storage.Producer{ID: "ws", Epoch: epoch, Seq: seq, AllowGap: true}
		}
		r := h.appendReq("s", storage.AppendRequest{Records: recs("a"), Producer: g(0, 7)})
		eq(t, "Seq", r.Seq, 7)
		h.appendReq("s", storage.AppendRequest{Records: recs("b"), Producer: g(0, 9)})
		d := h.appendReq("s", storage.AppendRequest{Records: recs("x"), Producer: g(0, 8)})
		eq(t, "8 after 9 is a duplicate", d.Duplicate, true)
		eq(t, "dup of unknown seq: tail", d.Offset, off(2))
		d = h.appendReq("s", storage.AppendRequest{Records: recs("x"), Producer: g(0, 7)})
		eq(t, "dup 7 Offset", d.Offset, off(1))
		r = h.appendReq("s", storage.AppendRequest{Records: recs("c"), Producer: g(3, 5)})
		eq(t, "new epoch at 5", r.Epoch, 3)
		_, err := h.l.Append(h.ctx, "s", storage.AppendRequest{Records: recs("x"), Producer: g(2, 100)})
		producerErr(t, "fenced", err, storage.KindFenced)
		eq(t, "content", h.content("s"), "abc")
	}},
	{"Independent", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{})
		for i := range 2 {
			h.appendReq("s", storage.AppendRequest{Records: recs(fmt.Sprintf("A%d", i)), Producer: prod("A", 0, int64(i))})
			h.appendReq("s", storage.AppendRequest{Records: recs(fmt.Sprintf("B%d", i)), Producer: prod("B", 0, int64(i))})
		}
		eq(t, "content", h.content("s"), "A0B0A1B1")
	}},
	{"RefusedAppendKeepsState", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{ContentType: "text/plain"})
		_, err := h.l.Append(h.ctx, "s", storage.AppendRequest{Records: recs("x"), ContentType: "application/json", Producer: prod("p", 0, 0)})
		isErr(t, "content type", err, storage.ErrContentType)
		r := h.appendReq("s", storage.AppendRequest{Records: recs("a"), Producer: prod("p", 0, 0)})
		eq(t, "seq 0 still admitted", r.Duplicate, false)
		h.appendReq("s", storage.AppendRequest{Records: recs("b"), StreamSeq: "5"})
		_, err = h.l.Append(h.ctx, "s", storage.AppendRequest{Records: recs("x"), StreamSeq: "4", Producer: prod("p", 0, 1)})
		isErr(t, "stream seq", err, storage.ErrStreamSeq)
		r = h.appendReq("s", storage.AppendRequest{Records: recs("c"), StreamSeq: "6", Producer: prod("p", 0, 1)})
		eq(t, "seq 1 admitted", r.Seq, 1)
		eq(t, "content", h.content("s"), "abc")
	}},
	{"DuplicateBeforeStreamSeq", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{})
		h.appendReq("s", storage.AppendRequest{Records: recs("a"), StreamSeq: "1", Producer: prod("p", 0, 0)})
		d := h.appendReq("s", storage.AppendRequest{Records: recs("a"), StreamSeq: "1", Producer: prod("p", 0, 0)})
		eq(t, "Duplicate", d.Duplicate, true)
	}},
	{"ConcurrentDuplicates", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{})
		const n = 20
		var wg sync.WaitGroup
		results := make([]storage.AppendResult, n)
		for i := range n {
			wg.Go(func() {
				r, err := h.l.Append(h.ctx, "s", storage.AppendRequest{Records: recs("x"), Producer: prod("p", 0, 0)})
				if err != nil {
					t.Error(err)
				}
				results[i] = r
			})
		}
		wg.Wait()
		admitted := 0
		for _, r := range results {
			if !r.Duplicate {
				admitted++
			}
			eq(t, "Offset", r.Offset, off(1))
		}
		eq(t, "admitted", admitted, 1)
		eq(t, "content", h.content("s"), "x")
	}},
	{"ConcurrentProducers", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{})
		const producers, each = 16, 25
		var wg sync.WaitGroup
		for p := range producers {
			wg.Go(func() {
				id := fmt.Sprintf("p%d", p)
				for i := range each {
					req := storage.AppendRequest{Records: recs(fmt.Sprintf("%s:%d;", id, i)), Producer: prod(id, 0, int64(i))}
					r, err := h.l.Append(h.ctx, "s", req)
					if err != nil || r.Duplicate {
						t.Errorf("%s seq %d: %+v %v", id, i, r, err)
						return
					}
					if i%5 == 0 { // a retry
						d, err := h.l.Append(h.ctx, "s", req)
						if err != nil || !d.Duplicate || d.Offset != r.Offset {
							t.Errorf("%s retry %d: %+v %v (original %s)", id, i, d, err, r.Offset)
							return
						}
					}
				}
			})
		}
		wg.Wait()
		all := h.readAll("s", storage.ZeroOffset)
		eq(t, "records", len(all), producers*each)
		next := map[string]int{}
		for _, r := range all {
			var id string
			var seq int
			if _, err := fmt.Sscanf(r, "p%d:%d;", new(int), &seq); err != nil {
				t.Fatal(err)
			}
			id = r[:len(r)-len(fmt.Sprintf(":%d;", seq))]
			if next[id] != seq {
				t.Fatalf("%s: seq %d after %d", id, seq, next[id]-1)
			}
			next[id]++
		}
	}},
	{"NotInheritedByFork", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{})
		h.appendReq("s", storage.AppendRequest{Records: recs("a"), Producer: prod("p", 0, 0), StreamSeq: "9"})
		h.create("f", storage.CreateOptions{ForkFrom: "s"})
		r := h.appendReq("f", storage.AppendRequest{Records: recs("b"), Producer: prod("p", 0, 0), StreamSeq: "1"})
		eq(t, "fresh on fork", r.Duplicate, false)
		d := h.appendReq("f", storage.AppendRequest{Records: recs("b"), Producer: prod("p", 0, 0)})
		eq(t, "dup on fork", d.Duplicate, true)
		eq(t, "fork content", h.content("f"), "ab")
	}},
}
