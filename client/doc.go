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
// goroutine. Each Client runs one read goroutine, owned by the Client and
// waited for in Close. Frames are written one at a time under a write lock
// with a write timeout ([Options.WriteTimeout]); a mutate's seq is assigned
// under that lock, so seqs reach the wire in order.
//
// # Callbacks and backpressure
//
// Patch handlers, PublishAsync completions and [Options.OnFrame] run on the
// read goroutine, in the order the server sent the frames. While one runs,
// nothing else is read: that is backpressure by design, and a callback that
// blocks for long stalls the whole connection (the server may then close it
// as a slow consumer, 4001, or for a ping timeout, 4002). A callback must
// return for Close to return, and must not call Close, Publish, Mutate,
// Subscribe or Drop on its own Client: they wait for the read goroutine,
// which is busy running the callback. PublishAsync and Send are safe.
//
// # Errors
//
// An ack carrying an error is returned as a *frames.Error (use errors.As);
// its Ref is the ack's ref. When the connection ends, every call still
// waiting for an ack fails with the error [Client.Err] reports; after
// [Client.Close] that error is net.ErrClosed. A server close is reported as
// a websocket.CloseError: websocket.CloseStatus(c.Err()) gives its code.
//
// This package does not reconnect yet.
package client
