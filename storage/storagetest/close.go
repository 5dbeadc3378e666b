package storagetest

import (
	"testing"

	"github.com/syncgate/syncgate/storage"
)

var closeTests = []test{
	{"CloseOnly", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{ContentType: "text/plain"})
		h.append("s", "a")
		r := h.appendReq("s", storage.AppendRequest{Close: true, ContentType: "application/json"})
		eq(t, "Closed", r.Closed, true)
		eq(t, "Offset", r.Offset, off(1))
		eq(t, "Offsets", len(r.Offsets), 0)
		r = h.appendReq("s", storage.AppendRequest{Close: true})
		eq(t, "again: Closed", r.Closed, true)
		eq(t, "again: Offset", r.Offset, off(1))
		eq(t, "Head Closed", h.head("s").Closed, true)
		for _, req := range []storage.AppendRequest{
			{Records: recs("x")},
			{Records: recs("x"), Close: true},
			{Records: recs("x"), ContentType: "application/json"}, // closed before content type
			{Records: recs("x"), StreamSeq: ""},
			{Records: recs("x"), Producer: prod("p", 0, 0)},
		} {
			_, err := h.l.Append(h.ctx, "s", req)
			ce := closedErr(t, "append to closed", err)
			eq(t, "ClosedError.Tail", ce.Tail, off(1))
		}
		res, err := h.l.Read(h.ctx, "s", off(1), 0)
		if err != nil {
			t.Fatal(err)
		}
		eq(t, "EOF Closed", res.Closed, true)
		eq(t, "EOF UpToDate", res.UpToDate, true)
		res, err = h.l.Read(h.ctx, "s", storage.ZeroOffset, 0)
		if err != nil {
			t.Fatal(err)
		}
		eq(t, "full Closed", res.Closed, true)
	}},
	{"CloseOnlyMissing", func(t *testing.T, h *h) {
		_, err := h.l.Append(h.ctx, "nope", storage.AppendRequest{Close: true})
		isErr(t, "close missing", err, storage.ErrNotFound)
	}},
	{"AppendAndClose", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{})
		h.append("s", "a")
		r := h.appendReq("s", storage.AppendRequest{Records: recs("b", "c"), Close: true})
		eq(t, "Closed", r.Closed, true)
		eq(t, "Offset", r.Offset, off(3))
		eq(t, "content", h.content("s"), "abc")
		res, err := h.l.Read(h.ctx, "s", storage.ZeroOffset, 1)
		if err != nil {
			t.Fatal(err)
		}
		eq(t, "partial read not Closed", res.Closed, false)
	}},
	{"ProducerClose", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{})
		h.appendReq("s", storage.AppendRequest{Records: recs("a"), Producer: prod("p", 0, 0)})
		r := h.appendReq("s", storage.AppendRequest{Records: recs("b"), Producer: prod("p", 0, 1), Close: true})
		eq(t, "Closed", r.Closed, true)
		eq(t, "Seq", r.Seq, 1)
		// The closing tuple again, even with another body: duplicate.
		d := h.appendReq("s", storage.AppendRequest{Records: recs("other"), Producer: prod("p", 0, 1), Close: true})
		eq(t, "Duplicate", d.Duplicate, true)
		eq(t, "dup Closed", d.Closed, true)
		eq(t, "dup Offset", d.Offset, off(2))
		eq(t, "dup Seq", d.Seq, 1)
		// A retry of an append admitted before the close is answered as
		// the first time: a duplicate (a producer that pipelined it ahead
		// of the closing one, its answer lost), on the closed stream.
		d = h.appendReq("s", storage.AppendRequest{Records: recs("x"), Producer: prod("p", 0, 0)})
		eq(t, "earlier dup", d.Duplicate, true)
		eq(t, "earlier dup Closed", d.Closed, true)
		eq(t, "earlier dup Offset", d.Offset, off(1))
		for _, p := range []*storage.Producer{prod("p", 0, 2), prod("q", 0, 0)} {
			_, err := h.l.Append(h.ctx, "s", storage.AppendRequest{Records: recs("x"), Producer: p})
			closedErr(t, "other tuple on closed", err)
		}
		eq(t, "content", h.content("s"), "ab")
	}},
	{"ProducerCloseOnly", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{})
		h.appendReq("s", storage.AppendRequest{Records: recs("a"), Producer: prod("p", 0, 0)})
		r := h.appendReq("s", storage.AppendRequest{Close: true, Producer: prod("p", 0, 1)})
		eq(t, "Duplicate", r.Duplicate, false)
		eq(t, "Closed", r.Closed, true)
		eq(t, "Epoch", r.Epoch, 0)
		eq(t, "Seq", r.Seq, 1)
		eq(t, "Offset", r.Offset, off(1))
		d := h.appendReq("s", storage.AppendRequest{Close: true, Producer: prod("p", 0, 1)})
		eq(t, "dup", d.Duplicate, true)
		eq(t, "dup Closed", d.Closed, true)
		// A close-only with a new seq on a closed stream: admitted no-op.
		r = h.appendReq("s", storage.AppendRequest{Close: true, Producer: prod("p", 0, 2)})
		eq(t, "later close-only Seq", r.Seq, 2)
		eq(t, "later close-only Closed", r.Closed, true)
		d = h.appendReq("s", storage.AppendRequest{Close: true, Producer: prod("p", 0, 0)})
		eq(t, "old seq dup", d.Duplicate, true)
		eq(t, "old seq Offset", d.Offset, off(1))
		_, err := h.l.Append(h.ctx, "s", storage.AppendRequest{Close: true, Producer: prod("p", 0, 9)})
		producerErr(t, "gap on close-only", err, storage.KindGap)
	}},
	{"ForkOfClosedIsOpen", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{Records: recs("a"), Closed: true})
		in := h.create("f", storage.CreateOptions{ForkFrom: "s"})
		eq(t, "fork Closed", in.Closed, false)
		h.append("f", "b")
		eq(t, "fork content", h.content("f"), "ab")
		h.appendReq("f", storage.AppendRequest{Close: true})
		h.create("g", storage.CreateOptions{ForkFrom: "f"})
		h.append("g", "c")
		eq(t, "source still closed", h.head("s").Closed, true)
	}},
}
