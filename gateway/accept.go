package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/syncgate/syncgate/frames"
)

// readBufferSize is the size of a session's connection read buffer. Client
// frames are small; a larger message is read straight into its destination
// by bufio, so a small buffer costs idle memory, not throughput.
const readBufferSize = 512

// hijackSizer hands websocket.Accept the hijacked connection with small
// buffers instead of net/http's 4 KiB reader and 4 KiB writer, which every
// idle session would otherwise hold for its lifetime: a readBufferSize
// reader, and a writeBufferSize writer over a corkConn (which keeps one
// syscall per message). It records the corkConn in *conn; the session corks
// it around each message and sets write deadlines on it.
type hijackSizer struct {
	http.ResponseWriter
	conn **corkConn
}

func (h hijackSizer) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(h.ResponseWriter).Hijack()
	if err != nil {
		return c, brw, err
	}
	cc := newCorkConn(c)
	*h.conn = cc
	// net/http flushed the 101 response before handing over its writer,
	// so replacing the writer loses nothing.
	w := bufio.NewWriterSize(cc, writeBufferSize)
	n := brw.Reader.Buffered()
	if n > readBufferSize {
		// The client sent ahead a lot: keep net/http's reader.
		return cc, bufio.NewReadWriter(brw.Reader, w), nil
	}
	// Carry over bytes the client sent right behind its upgrade request:
	// they must be the first the new reader returns.
	if n == 0 {
		return cc, bufio.NewReadWriter(bufio.NewReaderSize(c, readBufferSize), w), nil
	}
	pending, _ := brw.Reader.Peek(n)
	r := bufio.NewReaderSize(io.MultiReader(bytes.NewReader(bytes.Clone(pending)), c), readBufferSize)
	if _, err := r.Peek(n); err != nil {
		return cc, bufio.NewReadWriter(brw.Reader, w), nil
	}
	return cc, bufio.NewReadWriter(r, w), nil
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (h hijackSizer) Unwrap() http.ResponseWriter { return h.ResponseWriter }

// refusalText is the close reason a refused WebSocket client reads, by
// refusal reason.
var refusalText = map[string]string{
	rejectRate:        "over the accept rate: reconnect as the reconnect frame said",
	rejectMaxSessions: "node full: reconnect as the reconnect frame said",
	rejectDraining:    "server draining: reconnect as the reconnect frame said",
	rejectPerIP:       "too many sessions from this address: reconnect as the reconnect frame said",
}

// refuse turns a client away for reason, telling it to come back after
// after. A browser cannot read the status of a refused upgrade, so a
// WebSocket client gets the upgrade, one reconnect frame and a close: 1013
// (try again later) when the node is over budget, 1012 (service restart)
// when it is draining. Nothing else is done for it: no session, no hello.
// Any other request gets 503 with Retry-After, and so does a WebSocket
// client while maxRefusing refusals are under way: in a storm the refused
// must not cost the node more than the admitted.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, reason string, after time.Duration) {
	if !isWebSocketUpgrade(r) {
		s.refusePlain(w, reason, after)
		return
	}
	defer s.refusing.Add(-1)
	if s.refusing.Add(1) > maxRefusing || !s.track() {
		s.refusePlain(w, reason, after)
		return
	}
	defer s.wg.Done()
	if !s.checkOrigin(w, r) {
		return // a foreign page learns nothing, not even the node's load
	}
	var nc *corkConn
	conn, err := websocket.Accept(hijackSizer{w, &nc}, r, acceptOptions)
	if err != nil {
		s.metrics.rejected[rejectHandshake].Inc()
		return // Accept has written the HTTP error
	}
	s.metrics.rejected[reason].Inc()
	nc.timeout = s.cfg.WriteTimeout
	frameReason, code := frames.ReasonOverload, websocket.StatusTryAgainLater
	if reason == rejectDraining {
		frameReason, code = frames.ReasonDrain, websocket.StatusServiceRestart
	}
	s.sayReconnect(conn, nc, frameReason, after, code, refusalText[reason])
}

// acceptOptions are the options of every websocket.Accept. The Origin has
// been checked by checkOrigin (auth.OriginPolicy, stricter than the
// library's path.Match patterns), so the library's own check is off.
// Compression stays off (also the library's default): permessage-deflate
// costs memory per session and opens compression side channels.
var acceptOptions = &websocket.AcceptOptions{
	InsecureSkipVerify: true,
	CompressionMode:    websocket.CompressionDisabled,
}

// checkOrigin answers 403 and returns false when r's Origin is not
// allowed (auth.OriginPolicy: absent, same host, or an allowlisted
// pattern; never "null").
func (s *Server) checkOrigin(w http.ResponseWriter, r *http.Request) bool {
	if s.origins.Allow(r.Header.Get("Origin"), r.Host) {
		return true
	}
	s.metrics.rejected[rejectOrigin].Inc()
	http.Error(w, "origin not allowed: add it to SYNCGATE_ALLOWED_ORIGINS (docs/security.md)", http.StatusForbidden)
	return false
}

// retryAfter is a Retry-After value for d: whole seconds, rounded up, at
// least 1.
func retryAfter(d time.Duration) string { return strconv.FormatInt(retrySecs(d), 10) }

// retrySecs is d in whole seconds, rounded up, at least 1.
func retrySecs(d time.Duration) int64 { return max(1, int64((d+time.Second-1)/time.Second)) }

// refusePlain answers 503 with Retry-After.
func (s *Server) refusePlain(w http.ResponseWriter, reason string, after time.Duration) {
	s.metrics.rejected[reason].Inc()
	w.Header().Set("Retry-After", retryAfter(after))
	msg := "server is shutting down"
	switch reason {
	case rejectRate:
		msg = "over the accept rate; retry after the Retry-After delay"
	case rejectMaxSessions:
		msg = "node full; retry after the Retry-After delay"
	case rejectPerIP:
		msg = "too many sessions from this address; retry after the Retry-After delay"
	case rejectDraining:
		msg = "server draining; retry after the Retry-After delay (another node should answer)"
	}
	http.Error(w, msg, http.StatusServiceUnavailable)
}

// sayReconnect sends one reconnect frame on a connection that is not a
// session (nc is its socket), then closes it with code. The close waits
// (briefly, bounded by coder/websocket) for the client's close frame,
// reading and discarding whatever it sent meanwhile: closing the socket on
// unread data would reset the connection and could lose the reconnect
// frame. The caller is joined to s.wg; when Shutdown's ctx ends, it cuts
// the socket (cutRefusals) and the wait ends at once.
func (s *Server) sayReconnect(conn *websocket.Conn, nc *corkConn, reason string, after time.Duration, code websocket.StatusCode, text string) {
	if !s.holdRefusal(nc) {
		_ = conn.CloseNow()
		return
	}
	defer s.dropRefusal(nc)
	b, err := frames.Encode(&frames.Reconnect{AfterMs: afterMs(after), Reason: reason})
	if err != nil {
		_ = conn.CloseNow() // our own frame: unreachable
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.WriteTimeout)
	defer cancel()
	if err := conn.Write(ctx, websocket.MessageText, b); err != nil {
		_ = conn.CloseNow()
		return
	}
	s.metrics.framesOut[idxReconnect].Inc()
	// A client reading its reconnect frame answers the close at once.
	closeWithin(conn, nc, code, text, s.refusalWait)
}

// closeWithin closes conn with code and text, waiting at most d for the
// peer's close frame (not coder/websocket's 5 s): then the read fails and
// the library closes the socket under it, nc.
//
// The bound is a read deadline, which the close frame's write does not
// see (the write deadline, nc's timeout, bounds that). It was a timer
// closing nc: started before the close frame was written, on a starved
// machine it fired first, and a refused client got its reconnect frame
// and then EOF or a reset instead of the close code. The deadline still
// runs from before the write: a write that takes d or more leaves no
// time for the peer's answer, and the socket closes as soon as the
// frame is written.
func closeWithin(conn *websocket.Conn, nc net.Conn, code websocket.StatusCode, text string, d time.Duration) {
	_ = nc.SetReadDeadline(time.Now().Add(d))
	_ = conn.Close(code, text)
}

// Bounds of refusals: how many may be under way at once (beyond, a plain
// 503), and how long one waits for the client's close frame.
const (
	maxRefusing      = 4096
	refusalCloseWait = time.Second
)

// holdRefusal records a refused connection's socket, for Shutdown to cut;
// false if Shutdown is already cutting.
func (s *Server) holdRefusal(nc *corkConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cutting {
		return false
	}
	s.refusals[nc] = struct{}{}
	return true
}

func (s *Server) dropRefusal(nc *corkConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.refusals, nc)
}

// cutRefusals closes the socket of every refused connection still saying
// reconnect, and of any that comes after. The sockets are closed after mu
// is released, and all at once: closing a TLS connection writes its
// close_notify, which may wait up to the TLS package's 5 s on a peer that
// does not read, so one at a time a few thousand of them could hold
// Shutdown for hours, and the session registry must not wait on any. A
// refusal ending meanwhile closes its own socket too; a second Close only
// returns an error.
func (s *Server) cutRefusals() {
	s.mu.Lock()
	s.cutting = true
	ncs := make([]*corkConn, 0, len(s.refusals))
	for nc := range s.refusals {
		ncs = append(ncs, nc)
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, nc := range ncs {
		wg.Go(func() { _ = nc.Close() })
	}
	wg.Wait()
}

// afterMs is d in whole milliseconds, rounded up: a client that waits
// afterMs never comes back before d.
func afterMs(d time.Duration) int64 {
	return int64((max(d, 0) + time.Millisecond - 1) / time.Millisecond)
}

// refuseNotUpgrade answers a request to the WebSocket endpoint that asks
// for no upgrade (426, counted as a failed handshake).
func (s *Server) refuseNotUpgrade(w http.ResponseWriter) {
	s.metrics.rejected[rejectHandshake].Inc()
	w.Header().Set("Connection", "Upgrade")
	w.Header().Set("Upgrade", "websocket")
	http.Error(w, "this endpoint speaks WebSocket only: send an upgrade request (Upgrade: websocket, docs/protocol.md)", http.StatusUpgradeRequired)
}

// checkHandshake answers an upgrade request that websocket.Accept would
// refuse, with the status Accept would answer, counts it as a failed
// handshake and returns false. serveWS calls it before the per-IP cap and
// the accept budget: such a request (no Sec-WebSocket-Key, a version
// other than 13, …) can never become a session, so it must take no place
// and spend no token.
func (s *Server) checkHandshake(w http.ResponseWriter, r *http.Request) bool {
	code, msg := handshakeError(w.Header(), r)
	if code == 0 {
		return true
	}
	s.metrics.rejected[rejectHandshake].Inc()
	http.Error(w, msg, code)
	return false
}

// handshakeError reports why websocket.Accept would refuse r, as an HTTP
// status and message (0 if it would not), setting on h the headers Accept
// sets with that status. It follows coder/websocket's verifyClientRequest
// (RFC 6455 §4.2.1), which is not exported;
// Test_handshakeErrorMatchesAccept holds the two together.
func handshakeError(h http.Header, r *http.Request) (code int, msg string) {
	switch {
	case !r.ProtoAtLeast(1, 1):
		return http.StatusUpgradeRequired, "WebSocket handshake must be at least HTTP/1.1"
	case !headerHasToken(r.Header, "Connection", "upgrade"), !headerHasToken(r.Header, "Upgrade", "websocket"):
		h.Set("Connection", "Upgrade")
		h.Set("Upgrade", "websocket")
		return http.StatusUpgradeRequired, "WebSocket handshake needs Connection: Upgrade and Upgrade: websocket"
	case r.Method != http.MethodGet:
		return http.StatusMethodNotAllowed, "WebSocket handshake method must be GET"
	case r.Header.Get("Sec-WebSocket-Version") != "13":
		h.Set("Sec-WebSocket-Version", "13")
		return http.StatusBadRequest, "unsupported WebSocket protocol version (only 13 is supported)"
	}
	keys := r.Header.Values("Sec-WebSocket-Key")
	if len(keys) != 1 {
		return http.StatusBadRequest, "WebSocket handshake needs one Sec-WebSocket-Key"
	}
	if k, err := base64.StdEncoding.DecodeString(strings.TrimSpace(keys[0])); err != nil || len(k) != 16 {
		return http.StatusBadRequest, "invalid Sec-WebSocket-Key: must be 16 bytes in base64"
	}
	return 0, ""
}

// headerHasToken reports whether one of the comma-separated values of
// header key in h is token, ignoring case.
func headerHasToken(h http.Header, key, token string) bool {
	for _, v := range h.Values(key) {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// isWebSocketUpgrade reports whether r asks for a WebSocket upgrade: its
// Upgrade header lists websocket, as for websocket.Accept and
// handshakeError (the header is a list of protocols, RFC 9110 §7.8).
func isWebSocketUpgrade(r *http.Request) bool {
	return headerHasToken(r.Header, "Upgrade", "websocket")
}
