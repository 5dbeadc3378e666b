package fanouttest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/syncgate/syncgate/fanout"
)

// WaitTimeout bounds every wait of the suite for a delivery. It is generous
// because backends may deliver asynchronously and CI runs under -race.
const WaitTimeout = 10 * time.Second

// Recorder is a [fanout.Subscriber] that keeps every message it receives,
// in order. Its methods may be called concurrently. Use a *Recorder: the
// transport identifies subscribers by pointer.
type Recorder struct {
	mu sync.Mutex
	// Guarded by mu.
	msgs    []*fanout.Message
	changed chan struct{} // closed and replaced on every Deliver; wakes all waiters
}

var _ fanout.Subscriber = (*Recorder)(nil)

// NewRecorder returns an empty Recorder.
func NewRecorder() *Recorder {
	return &Recorder{changed: make(chan struct{})}
}

// Deliver records m. It never blocks for long.
func (r *Recorder) Deliver(m *fanout.Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, m)
	close(r.changed)
	r.changed = make(chan struct{})
}

// Len returns the number of messages received so far.
func (r *Recorder) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.msgs)
}

// Messages returns a copy of the messages received so far.
func (r *Recorder) Messages() []*fanout.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*fanout.Message(nil), r.msgs...)
}

// Wait blocks until at least n messages have been received and returns a
// copy of them all, or returns ctx.Err() once ctx is done.
func (r *Recorder) Wait(ctx context.Context, n int) ([]*fanout.Message, error) {
	for {
		r.mu.Lock()
		if len(r.msgs) >= n {
			msgs := append([]*fanout.Message(nil), r.msgs...)
			r.mu.Unlock()
			return msgs, nil
		}
		changed := r.changed
		r.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// WaitN is Wait bounded by [WaitTimeout] that fails the test on timeout.
// Call it from the test's goroutine.
func (r *Recorder) WaitN(t testing.TB, n int) []*fanout.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), WaitTimeout)
	defer cancel()
	msgs, err := r.Wait(ctx, n)
	if err != nil {
		t.Fatalf("waiting for %d messages: got %d after %v", n, r.Len(), WaitTimeout)
	}
	return msgs
}
