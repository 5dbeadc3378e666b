package storagetest

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syncgate/syncgate/storage"
)

var namesTests = []test{
	{"BadNames", func(t *testing.T, h *h) {
		for _, name := range []string{"", strings.Repeat("x", 1025), "a\x00b", "a\nb", "a\x7fb", "bad\xffutf8"} {
			_, _, err := h.l.Create(h.ctx, name, storage.CreateOptions{})
			isErr(t, fmt.Sprintf("Create(%q)", name), err, storage.ErrBadRequest)
			_, err = h.l.Head(h.ctx, name)
			isErr(t, fmt.Sprintf("Head(%q)", name), err, storage.ErrBadRequest)
			_, err = h.l.Append(h.ctx, name, storage.AppendRequest{Records: recs("x")})
			isErr(t, fmt.Sprintf("Append(%q)", name), err, storage.ErrBadRequest)
			_, err = h.l.Read(h.ctx, name, storage.ZeroOffset, 0)
			isErr(t, fmt.Sprintf("Read(%q)", name), err, storage.ErrBadRequest)
			isErr(t, fmt.Sprintf("Delete(%q)", name), h.l.Delete(h.ctx, name), storage.ErrBadRequest)
		}
	}},
	{"GoodNames", func(t *testing.T, h *h) {
		for _, name := range []string{"a", "events/abc", "a:b/c.d-e_f", "ünïcödé/名前", strings.Repeat("y", 1024), "__ds/x"} {
			h.create(name, storage.CreateOptions{})
			h.append(name, "v")
			eq(t, "content of "+name, h.content(name), "v")
		}
	}},
	{"BadOffsets", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{})
		h.append("s", "a")
		for _, o := range []string{"", "-1", "now", "0,1", "0 1", "0000000000000000_000000000000000", "0000000000000000-0000000000000001",
			"000000000000000a_0000000000000000", "0000000000000000_00000000000000001", "../0000000000000000_000000000000", "0000000000000000_000000000000000\n"} {
			_, err := h.l.Read(h.ctx, "s", o, 0)
			isErr(t, fmt.Sprintf("Read(%q)", o), err, storage.ErrBadRequest)
		}
		for _, o := range []string{off(2), "9999999999999999_9999999999999999", "0000000000000001_0000000000000000"} {
			_, err := h.l.Read(h.ctx, "s", o, 0)
			isErr(t, fmt.Sprintf("Read beyond tail %q", o), err, storage.ErrBadRequest)
		}
	}},
}

var createTests = []test{
	{"Defaults", func(t *testing.T, h *h) {
		in := h.create("s", storage.CreateOptions{})
		eq(t, "ContentType", in.ContentType, "application/octet-stream")
		eq(t, "Tail", in.Tail, storage.ZeroOffset)
		eq(t, "Closed", in.Closed, false)
		eq(t, "Name", in.Name, "s")
		if in.CreatedAt.IsZero() {
			t.Fatal("CreatedAt is zero")
		}
		if in.ID == 0 {
			t.Fatal("ID is zero")
		}
		eq(t, "Pruned", in.Pruned, storage.ZeroOffset)
		res, err := h.l.Read(h.ctx, "s", storage.ZeroOffset, 0)
		if err != nil {
			t.Fatal(err)
		}
		eq(t, "records", len(res.Records), 0)
		eq(t, "UpToDate", res.UpToDate, true)
		eq(t, "Next", res.Next, storage.ZeroOffset)
		eq(t, "ContentType", res.ContentType, "application/octet-stream")
	}},
	{"IDsDiffer", func(t *testing.T, h *h) {
		// Another stream, or the same name made anew, never shares an ID;
		// Head and a repeated Create report the stream's own.
		a := h.create("a", storage.CreateOptions{})
		b := h.create("b", storage.CreateOptions{})
		if a.ID == b.ID {
			t.Fatalf("streams a and b share ID %d", a.ID)
		}
		again, created, err := h.l.Create(h.ctx, "a", storage.CreateOptions{})
		if err != nil || created {
			t.Fatalf("Create(a) again: created %v, %v", created, err)
		}
		eq(t, "ID of a created again", again.ID, a.ID)
		head, err := h.l.Head(h.ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		eq(t, "ID from Head", head.ID, a.ID)
		res, err := h.l.Read(h.ctx, "a", storage.ZeroOffset, 0)
		if err != nil {
			t.Fatal(err)
		}
		eq(t, "ID from Read", res.ID, a.ID)
		h.append("b", "x", "y")
		fork := h.create("bf", storage.CreateOptions{ForkFrom: "b", ForkOffset: off(1)})
		if fork.ID == b.ID {
			t.Fatalf("fork shares its source's ID %d", b.ID)
		}
		if fh, err := h.l.Head(h.ctx, "bf"); err != nil || fh.Pruned != storage.ZeroOffset {
			t.Fatalf("fork of an unpruned stream: Pruned %q (%v), want %s", fh.Pruned, err, storage.ZeroOffset)
		}
		if err := h.l.Delete(h.ctx, "a"); err != nil {
			t.Fatal(err)
		}
		anew := h.create("a", storage.CreateOptions{})
		if anew.ID == a.ID || anew.ID == b.ID {
			t.Fatalf("a made anew has ID %d, as before (a %d, b %d)", anew.ID, a.ID, b.ID)
		}
	}},
	{"Idempotent", func(t *testing.T, h *h) {
		exp := time.Date(2099, 1, 2, 3, 4, 5, 6e6, time.UTC)
		o := storage.CreateOptions{ContentType: "text/plain", ExpiresAt: exp, ExpiresAtRaw: "2099-01-02T03:04:05.006Z", Records: recs("a")}
		in := h.create("s", o)
		eq(t, "ContentType", in.ContentType, "text/plain")
		eq(t, "ExpiresAtRaw", in.ExpiresAtRaw, "2099-01-02T03:04:05.006Z")
		if !in.ExpiresAt.Equal(exp) {
			t.Fatalf("ExpiresAt = %v", in.ExpiresAt)
		}
		// Same config (normalized type, other records) → no change.
		o2 := o
		o2.ContentType = "TEXT/PLAIN; charset=utf-8"
		o2.Records = recs("b")
		in2, created, err := h.l.Create(h.ctx, "s", o2)
		if err != nil || created {
			t.Fatalf("second Create: created=%v err=%v", created, err)
		}
		eq(t, "ContentType stays verbatim", in2.ContentType, "text/plain")
		eq(t, "Tail", in2.Tail, off(1))
		eq(t, "content", h.content("s"), "a")
	}},
	{"Conflicts", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{ContentType: "text/plain", TTL: time.Hour})
		for i, o := range []storage.CreateOptions{
			{ContentType: "application/json", TTL: time.Hour},
			{ContentType: "text/plain", TTL: 2 * time.Hour},
			{ContentType: "text/plain"},
			{ContentType: "text/plain", TTL: time.Hour, Closed: true},
			{TTL: time.Hour},
		} {
			_, _, err := h.l.Create(h.ctx, "s", o)
			isErr(t, fmt.Sprintf("case %d", i), err, storage.ErrConflict)
		}
		h.create("e", storage.CreateOptions{ExpiresAt: time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC)})
		_, _, err := h.l.Create(h.ctx, "e", storage.CreateOptions{ExpiresAt: time.Date(2098, 1, 1, 0, 0, 0, 0, time.UTC)})
		isErr(t, "other Expires-At", err, storage.ErrConflict)
	}},
	{"BadOptions", func(t *testing.T, h *h) {
		for i, o := range []storage.CreateOptions{
			{TTL: time.Hour, ExpiresAt: time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC)},
			{TTL: -time.Second},
			{ForkOffset: storage.ZeroOffset},
			{ForkSubOffset: 1},
		} {
			_, _, err := h.l.Create(h.ctx, "s", o)
			isErr(t, fmt.Sprintf("case %d", i), err, storage.ErrBadRequest)
		}
		_, err := h.l.Head(h.ctx, "s")
		isErr(t, "Head after refused creates", err, storage.ErrNotFound)
	}},
	{"InitialRecordsAndTTL", func(t *testing.T, h *h) {
		in := h.create("s", storage.CreateOptions{ContentType: "application/json", TTL: time.Hour, Records: recs(`{"a":1}`, `2`)})
		eq(t, "Tail", in.Tail, off(2))
		eq(t, "TTL", in.TTL, time.Hour)
		res, err := h.l.Read(h.ctx, "s", storage.ZeroOffset, 0)
		if err != nil {
			t.Fatal(err)
		}
		eq(t, "records", len(res.Records), 2)
		eq(t, "Start[0]", res.Records[0].Start, true)
		eq(t, "Start[1]", res.Records[1].Start, false)
		eq(t, "Head TTL", h.head("s").TTL, time.Hour)
	}},
	{"Closed", func(t *testing.T, h *h) {
		in := h.create("s", storage.CreateOptions{Closed: true, Records: recs("final")})
		eq(t, "Closed", in.Closed, true)
		eq(t, "Tail", in.Tail, off(1))
		_, created, err := h.l.Create(h.ctx, "s", storage.CreateOptions{Closed: true})
		if err != nil || created {
			t.Fatalf("re-Create closed: %v %v", created, err)
		}
		_, _, err = h.l.Create(h.ctx, "s", storage.CreateOptions{})
		isErr(t, "re-Create open", err, storage.ErrConflict)
		res, err := h.l.Read(h.ctx, "s", storage.ZeroOffset, 0)
		if err != nil {
			t.Fatal(err)
		}
		eq(t, "Closed", res.Closed, true)
		eq(t, "UpToDate", res.UpToDate, true)
		// Open stream closed later: Create open conflicts, Create closed matches.
		h.create("t", storage.CreateOptions{})
		h.appendReq("t", storage.AppendRequest{Close: true})
		_, _, err = h.l.Create(h.ctx, "t", storage.CreateOptions{})
		isErr(t, "re-Create open after close", err, storage.ErrConflict)
		if _, _, err = h.l.Create(h.ctx, "t", storage.CreateOptions{Closed: true}); err != nil {
			t.Fatal(err)
		}
	}},
	{"TooLarge", func(t *testing.T, h *h) {
		big := make([]byte, 32<<20)
		_, _, err := h.l.Create(h.ctx, "s", storage.CreateOptions{Records: [][]byte{big}})
		isErr(t, "Create 32 MiB", err, storage.ErrTooLarge)
		h.create("s", storage.CreateOptions{})
		_, err = h.l.Append(h.ctx, "s", storage.AppendRequest{Records: [][]byte{big[:16<<20], big[16<<20:]}})
		isErr(t, "Append 32 MiB", err, storage.ErrTooLarge)
		eq(t, "Tail", h.head("s").Tail, storage.ZeroOffset)
		// 1 MiB is fine everywhere.
		h.appendReq("s", storage.AppendRequest{Records: [][]byte{big[:1<<20]}})
	}},
}

var appendReadTests = []test{
	{"OffsetsIncrease", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{ContentType: "text/plain"})
		r1 := h.append("s", "a")
		eq(t, "Offset", r1.Offset, off(1))
		r2 := h.append("s", "b", "c", "d")
		eq(t, "Offset", r2.Offset, off(4))
		eq(t, "len(Offsets)", len(r2.Offsets), 3)
		for i, o := range r2.Offsets {
			eq(t, fmt.Sprintf("Offsets[%d]", i), o, off(uint64(2+i)))
		}
		eq(t, "Duplicate", r2.Duplicate, false)
		eq(t, "Closed", r2.Closed, false)
		eq(t, "Epoch/Seq", r2.Epoch+r2.Seq, 0)
		eq(t, "Tail", h.head("s").Tail, off(4))
		eq(t, "from zero", h.content("s"), "abcd")
		eq(t, "from 1", strings.Join(h.readAll("s", off(1)), ""), "bcd")
		eq(t, "from 3", strings.Join(h.readAll("s", off(3)), ""), "d")
		res, err := h.l.Read(h.ctx, "s", off(4), 0)
		if err != nil {
			t.Fatal(err)
		}
		eq(t, "at tail: records", len(res.Records), 0)
		eq(t, "at tail: UpToDate", res.UpToDate, true)
		eq(t, "at tail: Next", res.Next, off(4))
		eq(t, "at tail: Tail", res.Tail, off(4))
		eq(t, "ContentType", res.ContentType, "text/plain")
	}},
	{"Paging", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{})
		h.append("s", strings.Repeat("a", 100), strings.Repeat("b", 100), strings.Repeat("c", 100))
		h.append("s", strings.Repeat("d", 500))
		// Each record costs its length and ReadRecordCost: two fit, three do not.
		res, err := h.l.Read(h.ctx, "s", storage.ZeroOffset, 3*(100+storage.ReadRecordCost)-1)
		if err != nil {
			t.Fatal(err)
		}
		eq(t, "records", len(res.Records), 2)
		eq(t, "Next", res.Next, off(2))
		eq(t, "UpToDate", res.UpToDate, false)
		eq(t, "Tail", res.Tail, off(4))
		eq(t, "Offset[1]", res.Records[1].Offset, off(2))
		// A record bigger than maxBytes still comes alone.
		res, err = h.l.Read(h.ctx, "s", off(3), 10)
		if err != nil {
			t.Fatal(err)
		}
		eq(t, "records", len(res.Records), 1)
		eq(t, "len", len(res.Records[0].Data), 500)
		eq(t, "Start", res.Records[0].Start, true)
		eq(t, "UpToDate", res.UpToDate, true)
		// 100 KiB in 1 KiB records, paged.
		h.create("big", storage.CreateOptions{})
		var want bytes.Buffer
		for i := range 100 {
			rec := bytes.Repeat([]byte{byte(i)}, 1024)
			want.Write(rec)
			h.appendReq("big", storage.AppendRequest{Records: [][]byte{rec}})
		}
		var got []byte
		after := storage.ZeroOffset
		for {
			res, err := h.l.Read(h.ctx, "big", after, 10<<10)
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Records) > 10 {
				t.Fatalf("page of %d records over 10 KiB", len(res.Records))
			}
			for _, r := range res.Records {
				got = append(got, r.Data...)
			}
			after = res.Next
			if res.UpToDate {
				break
			}
		}
		if !bytes.Equal(got, want.Bytes()) {
			t.Fatal("paged content differs")
		}
	}},
	{"BinaryExact", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{})
		data := []byte{0, 1, 0xff, 0xfe, '\n', 0}
		h.appendReq("s", storage.AppendRequest{Records: [][]byte{data, {}}})
		res, err := h.l.Read(h.ctx, "s", storage.ZeroOffset, 0)
		if err != nil {
			t.Fatal(err)
		}
		eq(t, "records", len(res.Records), 2)
		if !bytes.Equal(res.Records[0].Data, data) || len(res.Records[1].Data) != 0 {
			t.Fatalf("data = %v", res.Records)
		}
	}},
	{"Refusals", func(t *testing.T, h *h) {
		_, err := h.l.Append(h.ctx, "nope", storage.AppendRequest{Records: recs("x")})
		isErr(t, "missing stream", err, storage.ErrNotFound)
		_, err = h.l.Read(h.ctx, "nope", storage.ZeroOffset, 0)
		isErr(t, "Read missing", err, storage.ErrNotFound)
		_, err = h.l.Head(h.ctx, "nope")
		isErr(t, "Head missing", err, storage.ErrNotFound)
		h.create("s", storage.CreateOptions{ContentType: "application/json; charset=utf-8"})
		_, err = h.l.Append(h.ctx, "s", storage.AppendRequest{})
		isErr(t, "empty append", err, storage.ErrBadRequest)
		_, err = h.l.Append(h.ctx, "s", storage.AppendRequest{Records: recs("1"), ContentType: "text/plain"})
		isErr(t, "content type", err, storage.ErrContentType)
		h.appendReq("s", storage.AppendRequest{Records: recs("1"), ContentType: "Application/JSON"})
		h.appendReq("s", storage.AppendRequest{Records: recs("2")})
		eq(t, "Tail", h.head("s").Tail, off(2))
		_, err = h.l.Append(h.ctx, "s", storage.AppendRequest{Records: recs("x"), Producer: &storage.Producer{ID: "", Seq: 0}})
		isErr(t, "empty producer id", err, storage.ErrBadRequest)
		_, err = h.l.Append(h.ctx, "s", storage.AppendRequest{Records: recs("x"), Producer: prod("p", -1, 0)})
		isErr(t, "negative epoch", err, storage.ErrBadRequest)
	}},
	{"ConcurrentAppendsAndReaders", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{})
		const writers, each = 10, 20
		var wg sync.WaitGroup
		offsets := make(chan string, writers*each)
		stop := make(chan struct{})
		var rwg sync.WaitGroup
		for range 3 {
			rwg.Go(func() {
				prev := 0
				for {
					select {
					case <-stop:
						return
					default:
					}
					n := len(h.readAllNoFatal(t, "s"))
					if n < prev {
						t.Errorf("reader saw %d records after %d", n, prev)
						return
					}
					prev = n
				}
			})
		}
		for w := range writers {
			wg.Go(func() {
				for i := range each {
					res, err := h.l.Append(h.ctx, "s", storage.AppendRequest{Records: recs(fmt.Sprintf("%d-%d;", w, i))})
					if err != nil {
						t.Error(err)
						return
					}
					offsets <- res.Offset
				}
			})
		}
		wg.Wait()
		close(stop)
		rwg.Wait()
		close(offsets)
		seen := map[string]bool{}
		for o := range offsets {
			if seen[o] {
				t.Fatalf("offset %s returned twice", o)
			}
			seen[o] = true
		}
		all := h.readAll("s", storage.ZeroOffset)
		eq(t, "records", len(all), writers*each)
		got := map[string]bool{}
		for _, r := range all {
			got[r] = true
		}
		eq(t, "distinct records", len(got), writers*each)
	}},
}

// readAllNoFatal is readAll for helper goroutines: it reports with Errorf.
func (h *h) readAllNoFatal(t *testing.T, name string) []string {
	var out []string
	after := storage.ZeroOffset
	for {
		res, err := h.l.Read(h.ctx, name, after, 0)
		if err != nil {
			t.Error(err)
			return out
		}
		for _, r := range res.Records {
			out = append(out, string(r.Data))
		}
		if res.UpToDate {
			return out
		}
		after = res.Next
	}
}

var streamSeqTests = []test{
	{"ByteOrder", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{})
		h.appendReq("s", storage.AppendRequest{Records: recs("1"), StreamSeq: "a"})
		_, err := h.l.Append(h.ctx, "s", storage.AppendRequest{Records: recs("2"), StreamSeq: "B"})
		isErr(t, "B after a", err, storage.ErrStreamSeq)
		_, err = h.l.Append(h.ctx, "s", storage.AppendRequest{Records: recs("2"), StreamSeq: "a"})
		isErr(t, "a after a", err, storage.ErrStreamSeq)
		h.appendReq("s", storage.AppendRequest{Records: recs("2"), StreamSeq: "b"})
		h.appendReq("s", storage.AppendRequest{Records: recs("3")}) // no seq: no check
		h.appendReq("s", storage.AppendRequest{Records: recs("4"), StreamSeq: "ba"})
		_, err = h.l.Append(h.ctx, "s", storage.AppendRequest{Records: recs("5"), StreamSeq: "b"})
		isErr(t, "b after ba", err, storage.ErrStreamSeq)
		eq(t, "content", h.content("s"), "1234")
	}},
	{"ConcurrentSameSeq", func(t *testing.T, h *h) {
		h.create("s", storage.CreateOptions{})
		var wg sync.WaitGroup
		var mu sync.Mutex
		ok := 0
		for range 5 {
			wg.Go(func() {
				_, err := h.l.Append(h.ctx, "s", storage.AppendRequest{Records: recs("x"), StreamSeq: "007"})
				mu.Lock()
				defer mu.Unlock()
				if err == nil {
					ok++
				} else if !isSentinel(err, storage.ErrStreamSeq) {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		eq(t, "admitted", ok, 1)
		eq(t, "content", h.content("s"), "x")
	}},
}
