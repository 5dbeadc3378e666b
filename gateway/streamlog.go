package gateway

import (
	"context"

	"github.com/syncgate/syncgate/storage"
)

// StreamLog is the durable log the gateway serves over HTTP (the Durable
// Streams API at /v1/stream/) and behind persisted topics. *storage.DB
// implements it; a JetStream backend will too. Methods may be called
// concurrently. See package storage for the semantics of each call.
type StreamLog interface {
	Create(ctx context.Context, name string, o storage.CreateOptions) (info storage.Info, created bool, err error)
	Head(ctx context.Context, name string) (storage.Info, error)
	Delete(ctx context.Context, name string) error
	Append(ctx context.Context, name string, req storage.AppendRequest) (storage.AppendResult, error)
	// AppendAsync is Append without waiting: appends submitted one after
	// another (by one goroutine) are applied in that order. done is called
	// exactly once, possibly on the log's own goroutine, so it must not
	// block or call the log.
	AppendAsync(name string, req storage.AppendRequest, done func(storage.AppendResult, error))
	Read(ctx context.Context, name, after string, maxBytes int) (storage.ReadResult, error)
	// Wait and WaitID keep a sliding TTL from running out while they are
	// blocked, and renew it as they return: a stream that a long-poll,
	// an SSE response or a persisted topic's tailer waits on does not
	// expire under it.
	Wait(ctx context.Context, name, after string) error
	WaitID(ctx context.Context, name, after string, id uint64) error
}
