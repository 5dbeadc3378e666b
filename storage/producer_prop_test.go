package storage_test

import (
	"errors"
	"fmt"
	"testing"

	"pgregory.net/rapid"

	"github.com/syncgate/syncgate/storage"
)

// prodModel is the producer state machine of [storage.Producer] in plain
// Go: per id {epoch, lastSeq} and the offsets of the last 64 admitted
// appends of the current epoch.
type prodModel struct {
	tail  uint64
	state map[string]*modelProd
}

type modelProd struct {
	epoch, last int64
	ring        []modelEnt // newest first
}

type modelEnt struct {
	seq int64
	pos uint64
}

// outcome is what an append did, comparable between model and DB.
type outcome struct {
	kind     string // "ok", "dup", "gap", "fenced", "epochseq"
	offset   string
	epoch    int64
	seq      int64
	expected int64 // gap
	current  int64 // fenced
}

func (m *prodModel) apply(p storage.Producer, n int) outcome {
	st := m.state[p.ID]
	admit := func() outcome {
		if st == nil {
			st = &modelProd{}
			m.state[p.ID] = st
		}
		if st.epoch != p.Epoch {
			st.ring = nil
		}
		m.tail += uint64(n)
		st.epoch, st.last = p.Epoch, p.Seq
		st.ring = append([]modelEnt{{p.Seq, m.tail}}, st.ring...)
		if len(st.ring) > 64 {
			st.ring = st.ring[:64]
		}
		return outcome{kind: "ok", offset: storage.FormatOffset(m.tail), epoch: p.Epoch, seq: p.Seq}
	}
	switch {
	case st == nil:
		if p.Seq != 0 && !p.AllowGap {
			return outcome{kind: "gap", expected: 0, seq: p.Seq}
		}
		return admit()
	case p.Epoch < st.epoch:
		return outcome{kind: "fenced", current: st.epoch}
	case p.Epoch > st.epoch:
		if p.Seq != 0 && !p.AllowGap {
			return outcome{kind: "epochseq", seq: p.Seq}
		}
		return admit()
	case p.Seq <= st.last:
		off := m.tail
		for _, e := range st.ring {
			if e.seq == p.Seq {
				off = e.pos
				break
			}
		}
		return outcome{kind: "dup", offset: storage.FormatOffset(off), epoch: st.epoch, seq: st.last}
	case p.Seq == st.last+1 || p.AllowGap:
		return admit()
	}
	return outcome{kind: "gap", expected: st.last + 1, seq: p.Seq}
}

func dbOutcome(r storage.AppendResult, err error, seq int64) outcome {
	var pe *storage.ProducerError
	switch {
	case err == nil && r.Duplicate:
		return outcome{kind: "dup", offset: r.Offset, epoch: r.Epoch, seq: r.Seq}
	case err == nil:
		return outcome{kind: "ok", offset: r.Offset, epoch: r.Epoch, seq: r.Seq}
	case errors.As(err, &pe) && pe.Kind == storage.KindGap:
		return outcome{kind: "gap", expected: pe.ExpectedSeq, seq: pe.ReceivedSeq}
	case errors.As(err, &pe) && pe.Kind == storage.KindFenced:
		return outcome{kind: "fenced", current: pe.CurrentEpoch}
	case errors.As(err, &pe) && pe.Kind == storage.KindEpochSeq:
		return outcome{kind: "epochseq", seq: pe.ReceivedSeq}
	}
	return outcome{kind: "error: " + err.Error()}
}

// TestDB_ProducerProperty compares random producer appends, applied one
// by one and in group-commit batches, with the model. rapid prints the
// seed of a failure (rerun with -rapid.seed).
func TestDB_ProducerProperty(t *testing.T) {
	db := openDB(t, &storage.Options{NoSync: true})
	run := 0
	rapid.Check(t, func(rt *rapid.T) {
		run++
		name := fmt.Sprintf("s%d", run)
		if _, _, err := db.Create(t.Context(), name, storage.CreateOptions{}); err != nil {
			rt.Fatal(err)
		}
		m := &prodModel{state: map[string]*modelProd{}}
		steps := rapid.IntRange(1, 60).Draw(rt, "steps")
		for i := 0; i < steps; {
			batch := rapid.IntRange(1, 4).Draw(rt, "batch")
			var reqs []storage.AppendRequest
			var want []outcome
			for range batch {
				p := storage.Producer{
					ID:       rapid.SampledFrom([]string{"a", "b", "c"}).Draw(rt, "id"),
					Epoch:    rapid.Int64Range(0, 2).Draw(rt, "epoch"),
					Seq:      rapid.Int64Range(0, 6).Draw(rt, "seq"),
					AllowGap: rapid.Bool().Draw(rt, "allowGap"),
				}
				n := rapid.IntRange(1, 3).Draw(rt, "records")
				recs := make([][]byte, n)
				for j := range recs {
					recs[j] = []byte(fmt.Sprintf("%s/%d/%d", p.ID, p.Epoch, p.Seq))
				}
				reqs = append(reqs, storage.AppendRequest{Records: recs, Producer: &p})
				want = append(want, m.apply(p, n))
			}
			var got []outcome
			if len(reqs) == 1 {
				r, err := db.Append(t.Context(), name, reqs[0])
				got = append(got, dbOutcome(r, err, reqs[0].Producer.Seq))
			} else {
				rs, errs := db.AppendBatchForTest(name, reqs)
				for j := range rs {
					got = append(got, dbOutcome(rs[j], errs[j], reqs[j].Producer.Seq))
				}
			}
			for j := range want {
				if got[j] != want[j] {
					rt.Fatalf("step %d, request %+v: got %+v, want %+v", i+j, *reqs[j].Producer, got[j], want[j])
				}
			}
			i += batch
		}
		in, err := db.Head(t.Context(), name)
		if err != nil || in.Tail != storage.FormatOffset(m.tail) {
			rt.Fatalf("tail %s, model %d (%v)", in.Tail, m.tail, err)
		}
	})
}
