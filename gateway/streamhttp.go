package gateway

// The Durable Streams HTTP API (docs/streams-http.md): every path under
// /v1/stream/ names a stream of s.cfg.Log. This file routes requests and
// owns the headers and error responses they share; streamhttp_read.go
// serves GET and HEAD (catch-up, long-poll, SSE) and streamhttp_write.go
// serves PUT, POST and DELETE.
//
// Every response, errors included, carries the CORS and browser security
// headers. Every refused request gets a 4xx with a one-line plain-text body
// that says what is wrong and how to fix it, and leaves the stream as it
// was: requests are validated whole before the log is called, and the log
// applies an append or a create atomically.

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/syncgate/syncgate/auth"
	"github.com/syncgate/syncgate/storage"
)

// streamPrefix is where the stream API is mounted; the rest of the path is
// the stream's name.
const streamPrefix = "/v1/stream/"

// maxStreamNameBytes bounds a stream name (after unescaping).
const maxStreamNameBytes = 1024

// Protocol headers, in canonical form.
const (
	hdrNextOffset    = "Stream-Next-Offset"
	hdrUpToDate      = "Stream-Up-To-Date"
	hdrClosed        = "Stream-Closed"
	hdrCursor        = "Stream-Cursor"
	hdrSeq           = "Stream-Seq"
	hdrTTL           = "Stream-Ttl" // canonical form of Stream-TTL
	hdrExpiresAt     = "Stream-Expires-At"
	hdrForkedFrom    = "Stream-Forked-From"
	hdrForkOffset    = "Stream-Fork-Offset"
	hdrForkSubOffset = "Stream-Fork-Sub-Offset"
	hdrSSEEncoding   = "Stream-Sse-Data-Encoding"
	hdrProducerID    = "Producer-Id"
	hdrProducerEpoch = "Producer-Epoch"
	hdrProducerSeq   = "Producer-Seq"
	hdrExpectedSeq   = "Producer-Expected-Seq"
	hdrReceivedSeq   = "Producer-Received-Seq"
)

// CORS lists. Browsers compare header names case-insensitively.
const (
	corsAllowMethods  = "GET, HEAD, POST, PUT, DELETE, OPTIONS"
	corsAllowHeaders  = "Content-Type, Authorization, If-None-Match, Stream-Seq, Stream-TTL, Stream-Expires-At, Stream-Closed, Producer-Id, Producer-Epoch, Producer-Seq, Stream-Forked-From, Stream-Fork-Offset, Stream-Fork-Sub-Offset"
	corsExposeHeaders = "WWW-Authenticate, Retry-After, Stream-Next-Offset, Stream-Cursor, Stream-Up-To-Date, Stream-Closed, Stream-TTL, Stream-Expires-At, Stream-SSE-Data-Encoding, Producer-Epoch, Producer-Seq, Producer-Expected-Seq, Producer-Received-Seq, ETag, Content-Type, Location"
)

// streamsFirst sends every request under streamPrefix to streams and the
// rest to mux. http.ServeMux cleans paths, answering "a//b" or "a/../b"
// with a redirect to another name; a stream name is taken as it is sent
// (streamName), so stream requests never go through the mux.
func streamsFirst(streams, mux http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.EscapedPath(), streamPrefix) {
			streams.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// streamHandler serves the Durable Streams protocol over s.cfg.Log.
func (s *Server) streamHandler() http.Handler {
	return http.HandlerFunc(s.serveStream)
}

// serveStream sets the headers every response carries and dispatches on
// the method.
func (s *Server) serveStream(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cross-Origin-Resource-Policy", "cross-origin")
	h.Set("Access-Control-Allow-Origin", "*")
	h.Set("Access-Control-Expose-Headers", corsExposeHeaders)

	// A body must arrive within StreamBodyTimeout, also one the request is
	// refused before it reads (net/http drains up to 256 KiB of it before
	// the answer); readBody lifts the deadline once a body is whole.
	if r.ContentLength != 0 {
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(s.cfg.StreamBodyTimeout))
	}

	// Without token keys a request carries no credential, so any page the
	// browser has open could read, write and delete streams (the loopback
	// rule does not help: the browser is on loopback). There, the Origin
	// allowlist applies, as on /v1/ws; with token keys the token is the
	// credential, and pages of any origin may use the API with one.
	//
	// The answer then depends on Origin: a shared cache must not hand a
	// page fetched by an allowed origin to another (Access-Control-Allow-
	// Origin is "*", so that page could read it).
	if s.cfg.Verifier == nil {
		h.Set("Vary", "Origin")
	}
	if s.cfg.Verifier == nil && !s.origins.Allow(r.Header.Get("Origin"), r.Host) {
		s.fail(w, r, &requestError{http.StatusForbidden, "origin " + quote(r.Header.Get("Origin")) +
			" not allowed: without token keys the stream API serves only pages of the same host or of SYNCGATE_ALLOWED_ORIGINS (docs/security.md)"})
		return
	}

	// A reader that never reads must not hold the connection and its
	// buffers: a read's response (a page of up to 1 MiB) must be taken
	// within WriteTimeout; a live read moves this bound (long-poll:
	// extendWriteDeadline, SSE: writeSSE). A write's answer is small and
	// is not bounded here: a deadline set before its body and commit
	// could cut the answer of an append already made, and its client's
	// retry would append again. Its body has StreamBodyTimeout (readBody).
	// On HTTP/2 a write deadline is a timer that resets the stream when
	// it fires, writing or not, so it must cover the whole response.
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout)) // ErrNotSupported: a wrapped writer
	}

	if r.Method == http.MethodOptions {
		h.Set("Access-Control-Allow-Methods", corsAllowMethods)
		h.Set("Access-Control-Allow-Headers", corsAllowHeaders)
		h.Set("Access-Control-Max-Age", "86400")
		w.WriteHeader(http.StatusNoContent)
		return
	}
	name, err := streamName(r.URL.EscapedPath())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	id, aerr := s.authorizeStream(h, r, name)
	if aerr == nil {
		aerr = s.limitWrite(h, r, id)
	}
	if aerr != nil {
		s.fail(w, r, aerr)
		return
	}
	switch r.Method {
	case http.MethodGet:
		s.serveRead(w, r, name, id)
	case http.MethodHead:
		s.serveHead(w, r, name)
	case http.MethodPut:
		s.serveCreate(w, r, name, id)
	case http.MethodPost:
		s.serveAppend(w, r, name, id)
	case http.MethodDelete:
		s.serveDelete(w, r, name)
	default:
		h.Set("Allow", corsAllowMethods)
		s.fail(w, r, &requestError{http.StatusMethodNotAllowed,
			fmt.Sprintf("method %s is not supported on a stream: use GET, HEAD, POST, PUT or DELETE", r.Method)})
	}
}

// The WWW-Authenticate challenges of a 401: for a request without a
// bearer token, and for one whose token was refused or has expired.
const (
	challenge        = `Bearer realm="syncgate"`
	challengeInvalid = `Bearer realm="syncgate", error="invalid_token"`
)

// authorizeStream checks a stream request's bearer token when the gateway
// has token keys (Config.Verifier), with the grants of the WebSocket's
// tokens and a stream's name as the topic: a read (GET, HEAD) needs the
// subscribe grant, an append (POST) the publish grant, and what a
// WebSocket publish cannot do, creating (PUT, which also sets the type
// and TTL), closing (a POST with Stream-Closed: true) and deleting, the
// manage grant; a fork also needs the subscribe grant on its source. A
// missing or refused token is a 401, with its challenge set in h
// (error="invalid_token" for a refused one, RFC 6750 §3.1), a missing
// grant a 403, and a token from an address that has spent its budget of
// refused tokens a 429, unchecked (verifyStreamToken). It returns the
// token's identity, nil without a Verifier (the anonymous dev mode) and
// for methods the API does not serve, which pass.
func (s *Server) authorizeStream(h http.Header, r *http.Request, name string) (*auth.Identity, *requestError) {
	v := s.cfg.Verifier
	if v == nil {
		return nil, nil
	}
	type need struct {
		action auth.Action
		stream string
	}
	var needs []need
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		needs = append(needs, need{auth.Subscribe, name})
	case http.MethodPost:
		needs = append(needs, need{auth.Publish, name})
		if headerTrue(r.Header, hdrClosed) {
			needs = append(needs, need{auth.Manage, name})
		}
	case http.MethodDelete:
		needs = append(needs, need{auth.Manage, name})
	case http.MethodPut:
		needs = append(needs, need{auth.Manage, name})
		if src := r.Header.Get("Stream-Forked-From"); src != "" {
			if from, err := forkSource(src, r.Host); err == nil { // a malformed one is serveCreate's 400
				needs = append(needs, need{auth.Subscribe, from})
			}
		}
	default:
		return nil, nil
	}
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	token = strings.TrimLeft(token, " \t")
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		h.Set("WWW-Authenticate", challenge)
		return nil, &requestError{http.StatusUnauthorized,
			"this server requires a token: send the same JWT as in a WebSocket hello, as Authorization: Bearer <token>"}
	}
	id, rerr := s.verifyStreamToken(h, r, v, token)
	if rerr != nil {
		return nil, rerr
	}
	for _, n := range needs {
		if !id.Grants.Allow(n.action, n.stream) {
			return nil, &requestError{http.StatusForbidden,
				fmt.Sprintf("the token does not grant %s on %q (a stream's name is its topic)", n.action, n.stream)}
		}
	}
	return id, nil
}

// verifyStreamToken checks a stream request's token with v, within the
// bad-token budget of the request's client address (badtoken.go): once
// the address has spent it, the request gets 429 with Retry-After set in
// h, and its token is not checked, unless v is the built-in
// *auth.Verifier and remembers it as verified (auth.Verifier.Cached). Only
// that exact type: a custom TokenVerifier that embeds one (to add a
// revocation list, say) would inherit Cached, and its own refusals would
// be passed over. A refused token is a 401 with its challenge set in h.
func (s *Server) verifyStreamToken(h http.Header, r *http.Request, v TokenVerifier, token string) (*auth.Identity, *requestError) {
	if av, ok := v.(*auth.Verifier); ok {
		if id, ok := av.Cached(token); ok {
			return id, nil
		}
	}
	return s.checkStreamToken(h, r, v, token)
}

// checkStreamToken is verifyStreamToken's check, within the bad-token
// budget.
func (s *Server) checkStreamToken(h http.Header, r *http.Request, v TokenVerifier, token string) (*auth.Identity, *requestError) {
	b := s.badTokens
	if b == nil {
		return verifyBearer(h, v, token)
	}
	key := clientIP(r.RemoteAddr)
	e, retry := b.reserve(key, s.cfg.Now())
	if e == nil {
		s.metrics.httpTokensLimited.Inc()
		secs := retrySecs(retry)
		h.Set("Retry-After", retryAfter(retry))
		return nil, &requestError{http.StatusTooManyRequests, fmt.Sprintf(
			"too many refused tokens from this address (at most %s a second are checked, bursts of %d): this token was not checked; retry after %d s",
			formatRate(float64(b.limit)), b.burst, secs)}
	}
	refused := true // also if v panics
	defer func() { b.settle(key, e, refused, s.cfg.Now()) }()
	id, err := verifyBearer(h, v, token)
	refused = err != nil
	return id, err
}

// verifyBearer checks token with v; a refused one is a 401 with its
// challenge set in h. So is one a custom verifier accepts without naming
// its actor (see TokenVerifier), as a hello with it is refused: served, a
// nil identity would panic the handler, and an empty actor would share
// one writer bucket with every other such token.
func verifyBearer(h http.Header, v TokenVerifier, token string) (*auth.Identity, *requestError) {
	id, err := v.Verify(token)
	if err == nil && (id == nil || id.ActorID == "") {
		err = errors.New("the server's token verifier named no actor for this token")
	}
	if err != nil {
		h.Set("WWW-Authenticate", challengeInvalid)
		// auth's errors never contain the token.
		return nil, &requestError{http.StatusUnauthorized, "Authorization: " + err.Error()}
	}
	return id, nil
}

// limitWrite takes a token from the writer limit of id's sub for a write
// (PUT, POST, DELETE); over the limit it returns a 429 and sets
// Retry-After in h (see limits.go). Requests without a token, reads
// and other methods pass.
func (s *Server) limitWrite(h http.Header, r *http.Request, id *auth.Identity) *requestError {
	if id == nil || s.httpWriters == nil {
		return nil
	}
	switch r.Method {
	case http.MethodPut, http.MethodPost, http.MethodDelete:
	default:
		return nil
	}
	ok, retry := s.httpWriters.allow(id.ActorID, s.cfg.Now())
	if ok {
		return nil
	}
	s.metrics.httpRateLimited.Inc()
	secs := retrySecs(retry)
	h.Set("Retry-After", retryAfter(retry))
	return &requestError{http.StatusTooManyRequests, fmt.Sprintf(
		"too many writes for this token's sub: at most %s a second (bursts of %d) across its requests; retry after %d s",
		formatRate(float64(s.httpWriters.limit)), s.httpWriters.burst, secs)}
}

// checkRecordActors refuses, for a request that came with a token (id not
// nil), a record that a WebSocket subscriber would see under another
// actor: an object with a data member whose actorId is a string other
// than the token's sub (see recordRow, which reads such a record as a
// WebSocket publish's). Over HTTP a token writes only as its own actor.
// Only the records of a JSON stream (content type ct) are read so: a
// subscribe refuses a stream of another type (headOf), whose records are
// not checked.
func checkRecordActors(ct string, records [][]byte, id *auth.Identity) *requestError {
	if id == nil || !isJSON(ct) {
		return nil
	}
	for i, rec := range records {
		_, actor, _, isPublish := publishRecord(rec)
		if isPublish && actor != nil && *actor != id.ActorID {
			return &requestError{http.StatusForbidden, fmt.Sprintf(
				"message %d: actorId %q is not the token's sub: over HTTP a token writes only as its own actor (give your own sub, null, or no actorId)", i, *actor)}
		}
	}
	return nil
}

// scopeProducer names p within the token's sub, for a request that came
// with a token (id not nil), as a WebSocket client's producer is named in
// a persisted topic's log: "<length of sub>:<sub>:<Producer-Id>"
// (producerName). That is what keeps another actor who learns a
// producer's id from fencing it with a higher epoch or taking up its
// seqs (whose appends would then be answered as retries and not
// written). A Producer-Id already of that form must name the token's sub
// (else 403) and is kept as it is, so a backend may continue its own
// sub's WebSocket client's producer; every other one is scoped, so the
// same Producer-Id sent with two subs' tokens names two producers.
// Without token keys there are no subs, and names are used as sent.
func scopeProducer(p *storage.Producer, id *auth.Identity) *requestError {
	if p == nil || id == nil {
		return nil
	}
	sub, ok := producerSub(p.ID)
	switch {
	case !ok:
		p.ID = producerName(&id.ActorID, p.ID)
	case sub != id.ActorID:
		return &requestError{http.StatusForbidden, fmt.Sprintf(
			"Producer-Id %.80q names a producer of another sub (<length of sub>:<sub>:<id>): a token may use only its own sub's, or names of another form", p.ID)}
	}
	return nil
}

// producerSub returns the sub in a producer id of producerName's form
// with a sub, and whether it is of that form.
func producerSub(pid string) (string, bool) {
	n, rest, ok := strings.Cut(pid, ":")
	if !ok {
		return "", false
	}
	l, err := strconv.Atoi(n)
	if err != nil || strconv.Itoa(l) != n || l < 0 || len(rest) <= l || rest[l] != ':' {
		return "", false
	}
	return rest[:l], true
}

// streamName returns the stream named by an escaped request path (or a
// Stream-Forked-From path): everything after /v1/stream/, unescaped once,
// so a name may contain '/' (and "%2F" is one too).
func streamName(escapedPath string) (string, error) {
	rest, ok := strings.CutPrefix(escapedPath, streamPrefix)
	if !ok {
		return "", badRequest("the path must start with %s followed by the stream name", streamPrefix)
	}
	name, err := url.PathUnescape(rest)
	switch {
	case err != nil:
		return "", badRequest("the stream name is not a valid escaped URL path: %v", err)
	case name == "":
		return "", badRequest("missing stream name: use %s<name>", streamPrefix)
	case len(name) > maxStreamNameBytes:
		return "", badRequest("the stream name is %d bytes long: the limit is %d", len(name), maxStreamNameBytes)
	case !utf8.ValidString(name):
		return "", badRequest("the stream name is not valid UTF-8")
	case strings.ContainsFunc(name, isControl):
		return "", badRequest("the stream name contains a control character: remove it")
	case name == "__ds" || strings.HasPrefix(name, "__ds/"):
		return "", &requestError{http.StatusNotFound, "names under __ds/ are reserved for protocol extensions this server does not implement"}
	}
	return name, nil
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

// requestError is a refused request: its status and the message sent as
// the response body.
type requestError struct {
	status int
	msg    string
}

func (e *requestError) Error() string { return e.msg }

func badRequest(format string, args ...any) *requestError {
	return &requestError{http.StatusBadRequest, fmt.Sprintf(format, args...)}
}

// fail writes err as an error response. err is a *requestError or an
// error from s.cfg.Log (see package storage), mapped to its status with
// the headers the protocol names for it. Server-side failures are logged.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	h := w.Header()
	var (
		reqErr  *requestError
		closed  *storage.ClosedError
		prodErr *storage.ProducerError
		pruned  *storage.PrunedError
		status  int
		msg     string
	)
	switch {
	case errors.As(err, &reqErr):
		status, msg = reqErr.status, reqErr.msg
	case errors.As(err, &closed):
		h.Set(hdrClosed, "true")
		h.Set(hdrNextOffset, closed.Tail)
		status, msg = http.StatusConflict, "the stream is closed: it accepts no more data"
	case errors.As(err, &prodErr):
		switch prodErr.Kind {
		case storage.KindFenced:
			h.Set(hdrProducerEpoch, strconv.FormatInt(prodErr.CurrentEpoch, 10))
			status = http.StatusForbidden
			msg = fmt.Sprintf("stale Producer-Epoch: this producer is at epoch %d; a restarted producer must use a higher epoch with Producer-Seq 0", prodErr.CurrentEpoch)
		case storage.KindGap:
			h.Set(hdrExpectedSeq, strconv.FormatInt(prodErr.ExpectedSeq, 10))
			h.Set(hdrReceivedSeq, strconv.FormatInt(prodErr.ReceivedSeq, 10))
			status = http.StatusConflict
			msg = fmt.Sprintf("Producer-Seq gap: expected %d, received %d; send the missing batches first", prodErr.ExpectedSeq, prodErr.ReceivedSeq)
		default:
			status = http.StatusBadRequest
			msg = fmt.Sprintf("a new Producer-Epoch must start at Producer-Seq 0, received %d", prodErr.ReceivedSeq)
		}
	case errors.Is(err, storage.ErrNotFound):
		status, msg = http.StatusNotFound, "stream not found: create it with PUT"
	case errors.As(err, &pruned):
		status, msg = http.StatusGone, "gone: retention removed records after this offset: read from offset "+
			pruned.Pruned+", where what the stream retains starts"
	case errors.Is(err, storage.ErrGone):
		status, msg = http.StatusGone, "gone: the stream was deleted (its forks still read its data), or the offset is older than what the stream retains"
	case errors.Is(err, storage.ErrConflict) && strings.Contains(err.Error(), "still read by forks"):
		status, msg = http.StatusConflict, "the stream at this name was deleted, and its forks still read its data: use another name (this one is free once its last fork is deleted)"
	case errors.Is(err, storage.ErrConflict) && strings.Contains(err.Error(), "fork source"):
		status, msg = http.StatusConflict, "the fork's source was deleted (its own forks still read it): fork another stream"
	case errors.Is(err, storage.ErrConflict):
		status, msg = http.StatusConflict, "the stream exists with another configuration (content type, TTL, Expires-At, closed state or fork): PUT the same headers, or use another name"
	case errors.Is(err, storage.ErrContentType):
		status, msg = http.StatusConflict, "Content-Type does not match the stream's: send the content type the stream was created with"
	case errors.Is(err, storage.ErrStreamSeq):
		status, msg = http.StatusConflict, "Stream-Seq must be greater (byte-wise) than the last one accepted on this stream"
	case errors.Is(err, storage.ErrBadRequest):
		detail := strings.TrimPrefix(strings.TrimPrefix(err.Error(), storage.ErrBadRequest.Error()), ": ")
		status, msg = http.StatusBadRequest, "bad request: "+detail
		if strings.Contains(detail, "beyond the tail") {
			msg += ": read from an offset this server returned (Stream-Next-Offset), or from -1, the start"
		}
	case errors.Is(err, storage.ErrTooLarge):
		status, msg = http.StatusRequestEntityTooLarge, "the append is larger than the stream log accepts: split it into smaller appends"
	case errors.Is(err, storage.ErrFailed), errors.Is(err, storage.ErrClosedDB):
		status, msg = http.StatusServiceUnavailable, "the stream log is unavailable: retry later"
	case errors.Is(err, storage.ErrCorrupt):
		status, msg = http.StatusInternalServerError, "this stream's stored data does not decode (see the server's log): other streams are not affected"
	default:
		status, msg = http.StatusInternalServerError, "internal error"
	}
	if status >= 500 {
		s.log.Error("stream request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	// Headers a success would carry must not leak into the error.
	h.Del("Etag")
	h.Del("Cache-Control")
	h.Del("Content-Length")
	h.Del(hdrCursor)
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		// A read's 404 is heuristically cacheable (RFC 9110 §15.1), and
		// caches keep one for minutes by default: the stream made next
		// would stay hidden behind it. No read error is worth keeping.
		h.Set("Cache-Control", "no-store")
	}
	h.Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = fmt.Fprintln(w, msg)
}

// mediaType is a content type's media type, lowercased and without
// parameters: the form the protocol compares.
func mediaType(ct string) string {
	mt, _, _ := strings.Cut(ct, ";")
	return strings.ToLower(strings.TrimSpace(mt))
}

// isJSON reports whether a stream of content type ct is in JSON mode.
func isJSON(ct string) bool { return mediaType(ct) == "application/json" }

// headerTrue reports whether header k is "true" (any case); any other
// value counts as absent.
func headerTrue(h http.Header, k string) bool { return strings.EqualFold(h.Get(k), "true") }

// setClosed sets Stream-Closed: true when closed.
func setClosed(h http.Header, closed bool) {
	if closed {
		h.Set(hdrClosed, "true")
	}
}
