// Package client is the Go client of the syncgate WebSocket protocol
// (package frames). Tests, the load generator (syncgate bench) and Go
// services use it.
//
// Start with [Dial]; it returns a [Client] once the server has answered the
// hello. Then [Client.Subscribe] follows a topic, [Client.Publish] and
// [Client.PublishAsync] publish to one, and [Client.Close] ends the session.
// See ExampleDial.
//
// # Concurrency
//
// All methods of [Client] and [Subscription] may be called from any
// goroutine. Each connection runs one read goroutine, owned by the Client
// and waited for in Close; with [Options.Reconnect] one more goroutine
// supervises the connections. Each connection also runs one write
// goroutine: frames are queued in the order the calls make them, and the
// writer sends whatever is queued, joined into batches of up to
// [Options.BatchBytes], each write bounded by [Options.WriteTimeout]. A
// mutate's seq is assigned and its frame queued under one send lock, so
// seqs reach the wire in order.
//
// # Pacing and dropped frames
//
// A server that limits each session's frames says so in its hello
// (frameRate, frameBurst; the gateway's -frame-rate and -frame-burst). The
// writer then keeps below them, at nine tenths of the rate and half the
// burst, waiting before a write that would go over: pipelined publishes
// past the burst wait in the client rather than being dropped by the
// server. Pacing makes drops rare, not impossible: the server counts
// frames as it reads them, so a server whose reader stalled can find a
// bunch. A frame it drops anyway (X_RATE_LIMITED: the first of a run is
// answered, then at most one per 100 ms, the rest not at all) leaves the
// connection out of step: the
// server runs none of this client's later mutates until it has the
// dropped one (X_SEQ_GAP), and a dropped subscribe was never taken up.
// The Client then ends that connection ([ErrOutOfStep]). With Reconnect
// it starts over as after any other end: the next hello says the lowest
// unacknowledged seq (hello.seq), every unacknowledged mutate is sent
// again in seq order, and every subscription resumes from its cursor.
// A subscribe or drop answered X_RATE_LIMITED is sent again there too,
// not refused. Without Reconnect the Client ends, and what waits fails
// with ErrOutOfStep rather than waiting forever.
//
// # Callbacks and backpressure
//
// Patch handlers, PublishAsync completions and [Options.OnFrame] run on the
// read goroutine, in the order the server sent the frames (while one
// connection takes over from another, both read goroutines run; a
// subscription's handler is still called one patch at a time, in order). While one runs,
// nothing else is read: that is backpressure by design, and a callback that
// blocks for long stalls the whole connection (the server may then close it
// as a slow consumer, 4001, or for a ping timeout, 4002; a connection that
// reads nothing for long may see only the server dropping it, 1006, since
// the close frame waits behind what it did not read). A callback must
// return for Close to return, and must not call Close, Publish, Mutate,
// Subscribe or Drop on its own Client: they wait for the read goroutine,
// which is busy running the callback. PublishAsync and Send are safe (also
// while a take-over waits for this connection's acks, though a
// PublishAsync past the bound of what a take-over holds then waits for
// that wait to end: see Reconnecting).
//
// # Errors
//
// An ack carrying an error is returned as a *frames.Error (use errors.As);
// its Ref is the ack's ref. When the connection ends, every call still
// waiting for an ack fails with the error [Client.Err] reports; after
// [Client.Close] that error is net.ErrClosed. A server close is reported as
// a websocket.CloseError: websocket.CloseStatus(c.Err()) gives its code.
// A mutate the server would refuse before its producer sees it fails
// before it uses a seq, so later mutates meet no gap: a name that is empty
// or over 256 bytes, and a frame over the hello's maxMessage
// ([ErrTooLarge]: sent, it would close the connection with 1009, and with
// Reconnect be re-sent on every connection).
//
// # Reconnecting
//
// Without [Options.Reconnect] a Client is one connection and ends with it.
// With it, a Client outlives its connections:
//
//   - A reconnect frame {afterMs, reason} (a planned drain, an overload
//     refusal) makes the Client open its next connection exactly afterMs
//     after the frame arrived, with no jitter of its own: the server has
//     already spread its clients. The take-over is make-before-break: the
//     old connection keeps delivering until the new one has completed its
//     hello and every subscription is live on it (or, at most, 10 s: see
//     [EventResumed]), then the Client closes the old one (1000). If the new one ends before that, the old one is
//     not closed: it keeps delivering the subscriptions it carries (it
//     sends nothing more; calls wait for the next connection) until a
//     later connection has taken over, and the Client retries with
//     backoff as after any other end. A close 1012 or 1013 after a
//     reconnect frame is part of the plan, not a failure.
//   - Any other end (read error, unexpected close, failed dial) is retried
//     with full-jitter exponential backoff: attempt k waits a uniformly
//     random time in [0, min(BackoffCap, BackoffBase·2^k)) (500 ms and
//     30 s by default); k restarts at 0 once a connection stayed up for
//     StableAfter (10 s).
//   - Every connection says hello with the same clientId and epoch (Dial
//     generates a clientId if Options.ClientID is empty), resubscribes
//     every live subscription with the same sid from [Subscription.Cursor],
//     and re-sends every mutate not yet acknowledged with its original key
//     and seq, in seq order, before any new one: the server dedupes by
//     (clientId, epoch, seq), so nothing acknowledged is lost and nothing
//     is applied twice. Before a planned take-over the Client first lets
//     the old connection acknowledge what it was sent (bounded wait, 10 s),
//     so the new node only gets what the old one never answered. That
//     wait holds up no caller: a mutate made meanwhile (Publish,
//     PublishAsync or Mutate; a PublishAsync in a patch handler too)
//     takes the next seq and is held, not sent on the old connection (it
//     would be in flight there as well as re-sent); it goes out on the
//     new connection after the old one's unanswered mutates, in seq
//     order, and is answered there (a Publish waits for that). What is
//     held is bounded as the write queue is (see [Options.BatchBytes]):
//     once it is full a mutate waits, as for a full queue, until the
//     take-over sends what it holds (in a patch handler on the old
//     connection, whose acks the take-over waits for, until that wait's
//     10 s are up). If the new connection ends before it takes over,
//     what was held goes on the old one, which stays current, after what
//     it was sent. Subscribe and Drop meanwhile go to the old
//     connection, and the take-over carries
//     a new subscription over like any other, but not one being dropped:
//     a Drop the old connection has not answered when the new one
//     becomes current ends its subscription then and returns (its drop
//     may never have been written; the old connection's close ends the
//     subscription on that server).
//   - Patches keep arriving on the same [Subscription] (handler or Patches
//     channel). A patch whose lsn is at or before the subscription's
//     cursor is dropped ([Subscription.Duplicates]): during a take-over
//     both connections carry the topic. A persisted topic resumes from the
//     cursor with no gap; an ephemeral one cannot (X_CURSOR_EXPIRED): the
//     subscription stays live from the new snapshot and the Client reports
//     [EventCursorExpired]. The same happens while connected when a
//     persisted topic's log is deleted or made anew: the server's
//     X_CURSOR_EXPIRED and snapshot move [Subscription.Cursor] to the new
//     log, whose offsets start again, so its patches are not dropped as
//     duplicates. A persisted topic subscribed before its stream existed
//     (a cursor with no digest) gets, when the stream is made, a snapshot
//     with no X_CURSOR_EXPIRED naming the log: the cursor takes its digest
//     and nothing is reported, as nothing was lost (also when it comes on
//     the old connection during a take-over). The new connection of a
//     take-over answers from the cursor the resume was sent with: if the
//     old connection meanwhile moved the cursor into a log (made there,
//     or replaced) and the new one answers in another, or with none
//     after the old one reported its log gone, or later names another
//     log made where it had none, the cursor takes the new connection's
//     position and the Client reports [EventCursorExpired], as the
//     records of the cursor's log after it may never come. A resume the
//     server could not serve (X_INTERNAL: it could not read the topic's
//     log, and closes with 1011) is not a refusal: the Client starts the
//     connection over and resumes from the cursor again.
//   - [Options.URLFor] picks each attempt's URL (e.g. [RoundRobin]), so a
//     client can move between nodes without a load balancer.
//   - [Options.OnEvent] reports each step ([Event]); Dial retries too, and
//     calls made while disconnected wait (Publish, Subscribe) or queue
//     (PublishAsync) until the next connection takes over.
//
// Only Close ends a reconnecting Client. Calls bounded by a ctx give up
// with it; a mutate given up on is still re-sent until acknowledged, since
// its seq is spent, and its ack goes to [Options.OnFrame]; a subscribe
// given up on is dropped where it was sent and never resubscribed (see
// [Client.Subscribe]).
package client
