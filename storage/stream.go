package storage

import (
	"context"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// Create creates stream name with configuration o, or checks that an
// existing live stream has the same configuration (see [CreateOptions]):
// created reports which. info describes the stream either way. The name
// of an expired stream is free: Create makes a fresh stream there, and
// removes the expired one only then (a refused Create changes nothing).
//
// Errors: [ErrBadRequest] for a bad name, both TTL and ExpiresAt, a
// malformed fork offset, a fork offset beyond the source's tail or a bad
// sub-offset, and as a [*ForkDepthError] for a fork source already
// [MaxForkDepth] forks deep; [ErrConflict] for another configuration, a
// soft-deleted stream at name, a soft-deleted fork source or a fork
// content type that differs from the source's; [ErrNotFound] for a
// missing or expired fork source; [ErrTooLarge] for initial records over
// MaxAppendBytes.
func (db *DB) Create(ctx context.Context, name string, o CreateOptions) (info Info, created bool, err error) {
	if err := db.begin(ctx, name); err != nil {
		return Info{}, false, err
	}
	if err := validateCreate(&o); err != nil {
		return Info{}, false, err
	}
	r := &request{op: opCreate, name: name, create: &o, size: recordBytes(o.Records), created: &createOut{}}
	if err := db.submit(ctx, r); err != nil {
		return Info{}, false, err
	}
	return r.created.info, r.created.created, r.err
}

func validateCreate(o *CreateOptions) error {
	if o.TTL < 0 {
		return fmt.Errorf("%w: negative TTL", ErrBadRequest)
	}
	if o.TTL > 0 && !o.ExpiresAt.IsZero() {
		return fmt.Errorf("%w: both TTL and Expires-At", ErrBadRequest)
	}
	if o.ForkFrom == "" {
		if o.ForkOffset != "" || o.ForkSubOffset != 0 {
			return fmt.Errorf("%w: fork offset without a fork source", ErrBadRequest)
		}
		return nil
	}
	if err := checkName(o.ForkFrom); err != nil {
		return fmt.Errorf("%w: bad fork source name", ErrBadRequest)
	}
	if o.ForkOffset != "" {
		if _, err := ParseOffset(o.ForkOffset); err != nil {
			return err
		}
	}
	if o.ForkSubOffset < 0 {
		return fmt.Errorf("%w: negative fork sub-offset", ErrBadRequest)
	}
	return nil
}

func recordBytes(recs [][]byte) int64 {
	var n int64
	for _, r := range recs {
		n += int64(len(r))
	}
	return n
}

// Delete deletes stream name. A stream that forks still read is
// soft-deleted: it reads as [ErrGone] and is removed with its last fork.
// A missing or expired stream is [ErrNotFound] (an expired one is left
// to the maintenance pass), a soft-deleted one [ErrGone]. Its records are
// removed in the background, in bounded batches; the name is free at
// once.
func (db *DB) Delete(ctx context.Context, name string) error {
	if err := db.begin(ctx, name); err != nil {
		return err
	}
	r := &request{op: opDelete, name: name}
	if err := db.submit(ctx, r); err != nil {
		return err
	}
	return r.err
}

// Append appends req's records to stream name as one append, atomically
// with the producer state and the close it may carry. The checks and
// their order are [AppendRequest]'s; the producer rules are [Producer]'s.
// It returns after the records are durable (fsync), batched with
// concurrent appends into one transaction. Appends, admitted or not,
// renew a sliding TTL.
//
// Errors: [ErrBadRequest] (bad name, no records without Close, bad
// producer), [ErrNotFound], [ErrGone], [*ClosedError], [*ProducerError],
// [ErrContentType], [ErrStreamSeq], [ErrTooLarge], [ErrFailed].
func (db *DB) Append(ctx context.Context, name string, req AppendRequest) (AppendResult, error) {
	if err := db.begin(ctx, name); err != nil {
		return AppendResult{}, err
	}
	if len(req.Records) == 0 && !req.Close {
		return AppendResult{}, fmt.Errorf("%w: no records", ErrBadRequest)
	}
	if err := checkProducerArgs(req.Producer); err != nil {
		return AppendResult{}, err
	}
	r := &request{op: opAppend, name: name, app: &req, size: recordBytes(req.Records)}
	if err := db.submit(ctx, r); err != nil {
		return AppendResult{}, err
	}
	return r.appendResult()
}

// maxProducerIDLen bounds a producer id in bytes: the id is a key of the
// stream's producer bucket, and a key over bbolt's limit would fail the
// whole commit, and so the DB, not just the append that carries it.
const maxProducerIDLen = bolt.MaxKeySize

// checkProducerArgs validates an append's producer (nil: none).
func checkProducerArgs(p *Producer) error {
	if p != nil && (p.ID == "" || len(p.ID) > maxProducerIDLen || p.Epoch < 0 || p.Seq < 0) {
		return fmt.Errorf("%w: bad producer id, epoch or seq", ErrBadRequest)
	}
	return nil
}

// appendResult formats an answered append request's result.
func (r *request) appendResult() (AppendResult, error) {
	if r.err != nil {
		return AppendResult{}, r.err
	}
	res := AppendResult{
		Offset:    FormatOffset(r.res.last),
		Duplicate: r.res.dup,
		Epoch:     r.res.epoch,
		Seq:       r.res.seq,
		Closed:    r.res.closed,
	}
	if r.res.n == 1 {
		res.Offsets = []string{res.Offset}
	} else if r.res.n > 0 {
		res.Offsets = make([]string, r.res.n)
		buf := make([]byte, 0, r.res.n*offsetLen)
		for i := range res.Offsets {
			buf = appendOffset(buf, r.res.first+uint64(i))
		}
		s := string(buf)
		for i := range res.Offsets {
			res.Offsets[i] = s[i*offsetLen : (i+1)*offsetLen]
		}
		res.Offset = res.Offsets[r.res.n-1]
	}
	return res, nil
}

// AppendAsync is [DB.Append] without waiting for the commit: it queues the
// append and returns; done is called exactly once with the outcome, on
// the writer goroutine after the commit (or at once, on the caller's
// goroutine, when the request is refused before queueing), so done must
// not block or call the DB. Appends queued one after another by one
// goroutine are applied in that order. AppendAsync blocks only while the
// writer's queue is full (backpressure).
func (db *DB) AppendAsync(name string, req AppendRequest, done func(AppendResult, error)) {
	if err := db.begin(context.Background(), name); err != nil {
		done(AppendResult{}, err)
		return
	}
	if len(req.Records) == 0 && !req.Close {
		done(AppendResult{}, fmt.Errorf("%w: no records", ErrBadRequest))
		return
	}
	if err := checkProducerArgs(req.Producer); err != nil {
		done(AppendResult{}, err)
		return
	}
	r := &request{op: opAppend, name: name, app: &req, size: recordBytes(req.Records), cb: done}
	if err := db.enqueue(context.Background(), r); err != nil {
		done(AppendResult{}, err)
	}
}
