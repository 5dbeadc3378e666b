// Package storagetest is the behavioural contract of syncgate's stream
// log: one suite that every backend (bbolt, JetStream) runs unchanged.
// It is about what the API promises (package storage's docs and the
// Durable Streams semantics in docs/storage.md), never about how a backend
// stores it. Time-dependent rules (TTL expiry, retention, producer
// expiry) need an injected clock and are tested by each backend itself,
// but for one that real time checks in a second and a half: a Wait keeps
// a sliding TTL from running out (Wait/KeepsSlidingTTL).
package storagetest

import (
	"context"
	"testing"

	"github.com/syncgate/syncgate/storage"
)

// Log is the method set under test; *storage.DB implements it, as does
// the gateway's StreamLog. The semantics are [storage.DB]'s; among them,
// Wait and WaitID keep a sliding TTL from running out while they are
// blocked, and renew it as they return.
type Log interface {
	Create(ctx context.Context, name string, o storage.CreateOptions) (info storage.Info, created bool, err error)
	Head(ctx context.Context, name string) (storage.Info, error)
	Delete(ctx context.Context, name string) error
	Append(ctx context.Context, name string, req storage.AppendRequest) (storage.AppendResult, error)
	Read(ctx context.Context, name, after string, maxBytes int) (storage.ReadResult, error)
	Wait(ctx context.Context, name, after string) error
	WaitID(ctx context.Context, name, after string, id uint64) error
}

// Run runs the contract suite. open returns a fresh, empty Log for each
// subtest and arranges its cleanup with t.Cleanup. Subtests run in
// parallel.
//
// Backends must refuse an append of 32 MiB with [storage.ErrTooLarge].
func Run(t *testing.T, open func(t *testing.T) Log) {
	groups := []struct {
		name  string
		tests []test
	}{
		{"Names", namesTests},
		{"Create", createTests},
		{"AppendRead", appendReadTests},
		{"StreamSeq", streamSeqTests},
		{"Producer", producerTests},
		{"Close", closeTests},
		{"Fork", forkTests},
		{"Delete", deleteTests},
		{"Wait", waitTests},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			for _, tc := range g.tests {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					tc.fn(t, newH(t, open))
				})
			}
		})
	}
}

// test is one named subtest.
type test struct {
	name string
	fn   func(t *testing.T, h *h)
}
