// Package gateway serves syncgate's WebSocket endpoint and its HTTP
// companions (/healthz, /readyz, /metrics).
//
// Start with [New] and [Server.Handler]; stop with [Server.Drain] (which
// spreads the sessions' reconnects over Config.DrainSpread), then
// [Server.Shutdown]. Admission is rationed by an accept budget
// (Config.AcceptRate, AcceptBurst, MaxSessions); see budget.go and
// docs/architecture.md, Stampede control.
//
// # Sessions
//
// Every WebSocket connection is one session with a reader goroutine (which
// decodes frames and runs their handlers) and, only while it has something
// to send, one writer (which owns the connection's write side). They meet
// at a bounded send queue. On a TCP or Unix socket (on Linux, macOS and
// OpenBSD) the writer is a turn of a shared writerPool worker
// (Config.Writers, one per core by default), which never waits on a
// socket: what would wait (a full socket, a ping, the close, a control
// frame the reader is writing) moves to a goroutine of the session's own,
// which is the writer on connections that cannot be written without
// waiting (TLS, other systems) or when Writers is negative. Publishers
// never block on a session: a session whose queue overflows is closed
// with 4001 (slow consumer).
//
// # Broadcast
//
// A publish is encoded once: the patch body (everything after the sid) is
// built once and handed through the [fanout.Transport] to every subscribed
// session, whose writer prepends the subscription's pre-encoded prefix. The
// writer drains the whole queue into one WebSocket message (frames separated
// by '\n') up to Config.MaxBatchBytes, so many frames cost one flush. When
// the node is busy, the pacer makes busy sessions leave a short delay
// between writes so that more frames share each message (see pace.go).
//
// # Ordering
//
// Topic offsets are assigned under a per-topic stripe lock that is held
// across Transport.Publish, and subscribing takes the same lock while it
// queues the ack and snapshot. So a subscriber sees its snapshot before any
// patch, and patches in offset order.
package gateway
