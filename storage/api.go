// Package storage is syncgate's durable stream log on bbolt: named streams
// of records addressed by offsets, idempotent producers, group commit,
// retention and compaction.
//
// The model is the Durable Streams protocol's (PROTOCOL.md of the
// durable-streams project): a stream has a content type fixed at creation,
// an optional TTL (sliding: appends and reads renew it, and it does not
// run out while a Wait is blocked on the stream; Head does not renew it) or
// Expires-At (absolute), may be closed for good, may be a fork of another
// stream at an offset, and carries per-producer (id, epoch, seq) state that
// is committed in the same bbolt transaction as the records it admits.
//
// Offsets are strings of the form "%016d_%016d". The first part is 0; the
// second counts the records of the stream's offset space (a fork continues
// its source's numbering). A record's offset is the position just after
// it: reading after offset X returns the records whose offset is greater
// than X. Offsets are strictly increasing, byte-wise sortable, stable
// across restarts and never derived from a clock. [ZeroOffset] is the start
// of every stream.
//
// All methods of [DB] may be called concurrently.
package storage

import (
	"errors"
	"fmt"
	"time"
)

// ZeroOffset is the offset before the first record of any stream.
const ZeroOffset = "0000000000000000_0000000000000000"

// Retention bounds what a stream keeps. Zero fields mean no bound. Records
// are pruned oldest first, in whole appends, on the maintenance tick (an
// append over [Options].PruneBatch records over several ticks, so a read
// may meanwhile start in its middle); an append over a bound is pruned
// whole, even the newest.
type Retention struct {
	MaxAge     time.Duration
	MaxBytes   int64
	MaxRecords int64
}

// CreateOptions is a stream's configuration. Create is idempotent: a
// second Create with an equal configuration succeeds without change, a
// different one fails with [ErrConflict]. Equal means: the same normalized
// content type ([NormalizeContentType]), TTL, Expires-At, closed state and
// fork source, fork offset and sub-offset. Records are not compared.
type CreateOptions struct {
	// ContentType is stored verbatim and echoed by [Info]. Empty means
	// "application/octet-stream". A stream is in JSON mode when the
	// normalized type is "application/json": each record is then one JSON
	// value (a message), and the caller splits arrays into messages.
	ContentType string

	// TTL, when positive, expires the stream TTL after its last append,
	// read or Wait (never while a Wait is blocked on it: see [DB.Wait]).
	// ExpiresAt, when not zero, expires it at that instant.
	// Setting both is [ErrBadRequest]. ExpiresAtRaw is echoed by Info.
	TTL          time.Duration
	ExpiresAt    time.Time
	ExpiresAtRaw string

	// Closed creates the stream closed (after Records, if any).
	Closed bool

	// Records is the initial content, written as one append. May be nil.
	Records [][]byte

	// ForkFrom names a source stream: the new stream reads as the source's
	// records up to ForkOffset, then its own. ForkOffset "" means the
	// source's tail at creation. ForkSubOffset > 0 makes the fork's first
	// own records a prefix of the source's append that starts right after
	// ForkOffset: its first ForkSubOffset records in JSON mode, else the
	// first ForkSubOffset bytes of its record. Initial Records follow the
	// prefix. Producer and Stream-Seq state are never inherited. A fork
	// without TTL and ExpiresAt inherits the source's. A source that is
	// deleted while it has forks is soft-deleted: it reads as [ErrGone]
	// and is removed with its last fork. A source already [MaxForkDepth]
	// forks deep cannot be forked ([*ForkDepthError]).
	ForkFrom      string
	ForkOffset    string
	ForkSubOffset int64

	// Retention overrides the DB's default retention for this stream.
	// Nil means the default. Not part of the equality check.
	Retention *Retention
}

// Info describes a stream.
type Info struct {
	Name         string
	ContentType  string // verbatim, as created
	TTL          time.Duration
	ExpiresAt    time.Time
	ExpiresAtRaw string
	Closed       bool

	// TTLLeft is, from Head, how much of a sliding TTL is left: TTL less
	// the time since the last append, read or Wait, all of it while a
	// Wait is blocked on the stream (0 without a TTL).
	TTLLeft time.Duration

	Tail      string // offset after the last record; ZeroOffset when empty
	CreatedAt time.Time

	// Pruned is the offset up to which retention removed records the
	// stream reads (its own, or, from Head, a fork's sources' too;
	// ZeroOffset when none): a read after it finds what is kept.
	Pruned string

	// ID tells this stream apart from any other of the same name in the
	// same database: a stream deleted and made anew gets a new, larger ID.
	// IDs of different databases are unrelated (pair it with CreatedAt).
	ID uint64

	// ForkFrom, ForkOffset and ForkSubOffset are as created (ForkOffset
	// resolved to the concrete offset).
	ForkFrom      string
	ForkOffset    string
	ForkSubOffset int64
}

// Producer names an idempotent producer's position: a record batch is
// admitted at most once per (stream, ID, Epoch, Seq).
//
// Rules, in order, with per-(stream, ID) state {epoch, lastSeq}:
//   - unknown ID: Seq must be 0 (else [*ProducerError] KindGap, expected 0);
//   - Epoch < epoch: KindFenced, naming the current epoch;
//   - Epoch > epoch: Seq must be 0 (else KindEpochSeq); the new epoch starts;
//   - same epoch: Seq <= lastSeq is a duplicate (nothing written;
//     [AppendResult].Duplicate), Seq == lastSeq+1 is admitted, a larger Seq
//     is KindGap naming the expected and received seq.
//
// A producer idle for [Options].ProducerTTL or longer, or forgotten to keep
// its stream within [Options].MaxProducersPerStream, is an unknown ID
// again. One whose stored state does not decode is never forgotten: its
// appends are refused with [ErrCorrupt] while the stream lives, so that a
// retry cannot be appended twice.
//
// AllowGap relaxes the "must be 0" and "must be lastSeq+1" rules to
// "greater than lastSeq" (any Seq for an unknown ID or a new epoch). The
// WebSocket door uses it: one client's mutate seqs span all topics, so
// a single stream sees a subsequence of them.
type Producer struct {
	ID       string // not empty, at most 32 KiB (bbolt's key limit)
	Epoch    int64
	Seq      int64
	AllowGap bool
}

// AppendRequest is one append. The checks run in this order: stream
// exists and is live; closed (a closed stream refuses records with
// [*ClosedError], except a producer duplicate of the append that closed
// it or of one admitted before it, and accepts a close-only request as a
// no-op); producer; content
// type; Stream-Seq; sizes. Nothing is written unless every check passes
// (with CreateMissing, not even the stream).
type AppendRequest struct {
	// Records to append in order, as one append. Empty only with Close.
	Records [][]byte

	// ContentType, when not empty, must equal the stream's after
	// normalization, else [ErrContentType]. Ignored for close-only.
	ContentType string

	// StreamSeq, when not empty, must be byte-wise greater than the last
	// StreamSeq accepted on the stream, else [ErrStreamSeq]. It is stored
	// on success.
	StreamSeq string

	// Producer, when not nil, makes the append idempotent.
	Producer *Producer

	// Close closes the stream after Records, atomically with them.
	Close bool

	// CreateMissing creates the stream, with ContentType and no other
	// options, when it does not exist (never created, deleted, or
	// expired), in the same transaction as the append. The checks then
	// run against that new, empty stream before it is made, and it is
	// made only if the append is admitted: a refused append (a
	// producer's gap, too many bytes) leaves no stream. Appends submitted
	// in order then stay in order across a delete: none goes to a stream
	// made by a retry that runs after later appends.
	CreateMissing bool
}

// AppendResult is the outcome of an admitted or duplicate append.
type AppendResult struct {
	// Offset is the offset after the append's last record (the stream's
	// tail for a close-only request). For a duplicate it is the offset the
	// original append returned if the producer's recent history has it
	// (the last 64 appends), else the stream's current tail.
	Offset string

	// Offsets holds each appended record's offset (nil for a duplicate or
	// close-only).
	Offsets []string

	// Duplicate reports a producer retry: nothing was written.
	Duplicate bool

	// Epoch and Seq are the producer's current epoch and highest admitted
	// seq after the call (zero without a producer).
	Epoch int64
	Seq   int64

	// Closed reports that the stream is closed after the call.
	Closed bool
}

// Record is one record read from a stream.
type Record struct {
	// Offset is the position just after this record.
	Offset string
	// Data is the record's bytes. The caller must not modify it.
	Data []byte
	// Start marks the first record of an append.
	Start bool
}

// ReadResult is a page of records.
type ReadResult struct {
	Records []Record
	// Next is the offset to read after next: the last returned record's
	// offset, or the requested offset when none were returned.
	Next string
	// Tail is the stream's tail when read.
	Tail string
	// UpToDate reports Next == Tail.
	UpToDate bool
	// Closed reports that the stream is closed and Next is its final
	// offset.
	Closed bool
	// ContentType is the stream's, verbatim.
	ContentType string
	// ID is the [Info].ID of the stream read: a reader that must not
	// take a stream made anew for the one it reads compares it.
	ID uint64
}

// Errors. Every error a DB method returns wraps one of these sentinels
// (test with errors.Is) or is a [*ProducerError] or [*ClosedError]; a
// [*PrunedError] wraps ErrGone, a [*ForkDepthError] ErrBadRequest.
var (
	ErrNotFound    = errors.New("storage: stream not found")                         // HTTP 404; also expired streams
	ErrGone        = errors.New("storage: gone")                                     // soft-deleted stream, or offset pruned by retention (410)
	ErrConflict    = errors.New("storage: stream exists with another configuration") // 409
	ErrContentType = errors.New("storage: content type does not match the stream")   // 409
	ErrStreamSeq   = errors.New("storage: Stream-Seq is not greater than the last")  // 409
	ErrBadRequest  = errors.New("storage: bad request")                              // 400: bad name, offset, sub-offset, options, fork depth
	ErrTooLarge    = errors.New("storage: append too large")                         // 413
	ErrFailed      = errors.New("storage: store failed")                             // a commit or fsync failed; the DB refuses everything after
	ErrCorrupt     = errors.New("storage: stored data does not decode")              // a stream's meta or a producer's state (a damaged file, another binary's format): that stream's requests, or that producer's appends (for good: its state is never forgotten), are refused, the DB goes on
	ErrClosedDB    = errors.New("storage: database closed")
)

// ProducerErrorKind says which producer rule refused an append.
type ProducerErrorKind int

const (
	// KindFenced: the epoch is lower than the producer's current epoch.
	KindFenced ProducerErrorKind = iota + 1
	// KindGap: the seq is past the next expected one.
	KindGap
	// KindEpochSeq: a new epoch did not start at seq 0.
	KindEpochSeq
)

// ProducerError refuses an append by the producer rules.
type ProducerError struct {
	Kind         ProducerErrorKind
	CurrentEpoch int64 // KindFenced
	ExpectedSeq  int64 // KindGap
	ReceivedSeq  int64 // KindGap, KindEpochSeq
}

func (e *ProducerError) Error() string {
	switch e.Kind {
	case KindFenced:
		return fmt.Sprintf("storage: producer epoch fenced: current epoch is %d", e.CurrentEpoch)
	case KindGap:
		return fmt.Sprintf("storage: producer seq gap: expected %d, received %d", e.ExpectedSeq, e.ReceivedSeq)
	default:
		return fmt.Sprintf("storage: a new producer epoch must start at seq 0, received %d", e.ReceivedSeq)
	}
}

// PrunedError is a read's answer when retention removed records after the
// offset asked for (also Create's, for a fork sub-offset in a pruned
// source). It wraps [ErrGone], and says, as of the call's own
// transaction, which stream was read and after which offset it can be
// read now.
type PrunedError struct {
	Offset string // the offset the read was after
	Pruned string // a read after this offset finds what is kept (see [Info].Pruned)
	ID     uint64 // the stream's [Info].ID
}

func (e *PrunedError) Error() string {
	return "storage: gone: offset " + e.Offset + " was pruned by retention (readable after " + e.Pruned + ")"
}

func (e *PrunedError) Unwrap() error { return ErrGone }

// MaxForkDepth bounds a fork chain: a stream that is not a fork has depth
// 0, a fork has its source's depth plus one, and Create refuses to fork a
// source whose depth is already MaxForkDepth, with a [*ForkDepthError].
// Every Read and Head of a fork walks its whole chain, one meta per level
// (from the read cache, or decoded from the file when the cache is behind
// a commit), and a deleted source is kept while forks read it: without a
// bound, whoever may fork could make every read of a chain's tip
// arbitrarily slow, and keep any number of deleted streams on disk. With
// the metas cached, a page of 100 records at depth 16 costs about as much
// as at depth 0 (BenchmarkDB_ReadForkChain: 14.2 against 12.6 µs).
const MaxForkDepth = 16

// ForkDepthError refuses a fork whose source is already [MaxForkDepth]
// forks deep. It wraps [ErrBadRequest]. Forking the source's own source,
// or an earlier ancestor, still works where they hold the records wanted;
// otherwise a copy of the data (a new stream) starts a new chain.
type ForkDepthError struct {
	Source string // the fork source's name (CreateOptions.ForkFrom)
	Max    int    // MaxForkDepth
}

func (e *ForkDepthError) Error() string {
	return fmt.Sprintf("storage: bad request: fork source %q is already %d forks deep, the most a fork source may be", e.Source, e.Max)
}

func (e *ForkDepthError) Unwrap() error { return ErrBadRequest }

// ClosedError refuses records for a closed stream. Tail is its final
// offset.
type ClosedError struct{ Tail string }

func (e *ClosedError) Error() string { return "storage: stream is closed at " + e.Tail }

// ReadRecordCost is what a record costs a read page beyond its data: its
// [Record], its offset string and their share of the page's bookkeeping.
// Counted against Read's maxBytes, it bounds a page of tiny records (a
// 1 MiB page of one-byte JSON messages would otherwise be a million
// Records).
const ReadRecordCost = 64
