package storagetest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/syncgate/syncgate/storage"
)

// h bundles a Log with the test it serves.
type h struct {
	t   *testing.T
	l   Log
	ctx context.Context
}

func newH(t *testing.T, open func(t *testing.T) Log) *h {
	t.Helper()
	return &h{t: t, l: open(t), ctx: t.Context()}
}

func recs(ss ...string) [][]byte {
	out := make([][]byte, len(ss))
	for i, s := range ss {
		out[i] = []byte(s)
	}
	return out
}

func (h *h) create(name string, o storage.CreateOptions) storage.Info {
	h.t.Helper()
	in, created, err := h.l.Create(h.ctx, name, o)
	if err != nil {
		h.t.Fatalf("Create(%q): %v", name, err)
	}
	if !created {
		h.t.Fatalf("Create(%q): created = false, want true", name)
	}
	return in
}

func (h *h) append(name string, ss ...string) storage.AppendResult {
	h.t.Helper()
	res, err := h.l.Append(h.ctx, name, storage.AppendRequest{Records: recs(ss...)})
	if err != nil {
		h.t.Fatalf("Append(%q): %v", name, err)
	}
	return res
}

func (h *h) appendReq(name string, req storage.AppendRequest) storage.AppendResult {
	h.t.Helper()
	res, err := h.l.Append(h.ctx, name, req)
	if err != nil {
		h.t.Fatalf("Append(%q, %+v): %v", name, req, err)
	}
	return res
}

// readAll pages through name from after and returns the records' data.
func (h *h) readAll(name, after string) []string {
	h.t.Helper()
	var out []string
	for range 100000 {
		res, err := h.l.Read(h.ctx, name, after, 0)
		if err != nil {
			h.t.Fatalf("Read(%q, %s): %v", name, after, err)
		}
		for _, r := range res.Records {
			out = append(out, string(r.Data))
		}
		if res.UpToDate {
			return out
		}
		if res.Next == after {
			h.t.Fatalf("Read(%q, %s): no progress and not up to date", name, after)
		}
		after = res.Next
	}
	h.t.Fatalf("Read(%q): does not end", name)
	return nil
}

// content is readAll joined.
func (h *h) content(name string) string {
	h.t.Helper()
	return strings.Join(h.readAll(name, storage.ZeroOffset), "")
}

func (h *h) head(name string) storage.Info {
	h.t.Helper()
	in, err := h.l.Head(h.ctx, name)
	if err != nil {
		h.t.Fatalf("Head(%q): %v", name, err)
	}
	return in
}

func isErr(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: err = %v, want %v", what, err, target)
	}
}

func eq[T comparable](t *testing.T, what string, got, want T) {
	t.Helper()
	if got != want {
		t.Fatalf("%s = %v, want %v", what, got, want)
	}
}

func producerErr(t *testing.T, what string, err error, kind storage.ProducerErrorKind) *storage.ProducerError {
	t.Helper()
	var pe *storage.ProducerError
	if !errors.As(err, &pe) {
		t.Fatalf("%s: err = %v, want a *ProducerError", what, err)
	}
	if pe.Kind != kind {
		t.Fatalf("%s: kind = %d, want %d (%v)", what, pe.Kind, kind, err)
	}
	return pe
}

func closedErr(t *testing.T, what string, err error) *storage.ClosedError {
	t.Helper()
	var ce *storage.ClosedError
	if !errors.As(err, &ce) {
		t.Fatalf("%s: err = %v, want a *ClosedError", what, err)
	}
	return ce
}

func off(n uint64) string { return storage.FormatOffset(n) }

// eventually polls cond until it holds or 10 s pass.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not true within 10s", what)
		}
		time.Sleep(20 * time.Millisecond) // polling, not synchronisation
	}
}

func prod(id string, epoch, seq int64) *storage.Producer {
	return &storage.Producer{ID: id, Epoch: epoch, Seq: seq}
}

func isSentinel(err, target error) bool { return errors.Is(err, target) }
