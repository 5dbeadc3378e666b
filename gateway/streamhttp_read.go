package gateway

// Reads of the Durable Streams API: HEAD, and GET in its three modes
// (catch-up, long-poll, SSE), plus what they share: the query, the body
// rendering per content type, ETags and cursors.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/syncgate/syncgate/auth"
	"github.com/syncgate/syncgate/storage"
)

const (
	// maxReadChunk bounds the record bytes of one read response or SSE
	// data event (a single larger record still goes out whole). A response
	// it cuts short carries neither Stream-Up-To-Date nor Stream-Closed.
	maxReadChunk = 1 << 20

	// maxOffsetLen bounds an offset in a query or header; real ones are 33
	// bytes.
	maxOffsetLen = 64

	// sseLifetime bounds one SSE response, so that clients reconnect with
	// their last offset now and then (PROTOCOL.md §8.2 suggests about 60s;
	// it lets caches collapse readers and spreads readers over nodes).
	sseLifetime = 60 * time.Second

	// sseKeepBuffer is the most an SSE response keeps of the buffer it
	// frames its events in between them.
	sseKeepBuffer = 64 << 10

	// cursorInterval and cursorEpoch define Stream-Cursor: the number of
	// whole intervals since the epoch (PROTOCOL.md §8.1).
	cursorInterval = 20 * time.Second
)

var cursorEpoch = time.Date(2024, 10, 9, 0, 0, 0, 0, time.UTC)

// Read modes (the live query parameter).
const (
	liveNone     = ""
	liveLongPoll = "long-poll"
	liveSSE      = "sse"
)

// offsetNow is the offset query value meaning "the tail".
const offsetNow = "now"

// readQuery is a GET's validated query.
type readQuery struct {
	after  string // the offset to read after; offsetNow for "now"
	start  bool   // offset -1 (or none): the stream's start, which is where retention kept records (readAfter)
	live   string // liveNone, liveLongPoll or liveSSE
	cursor int64  // the client's cursor; -1 when absent or not a number
}

// parseReadQuery validates a GET's query string. Unknown parameters are
// ignored; offset, live and cursor may appear at most once.
func parseReadQuery(rawQuery string) (readQuery, error) {
	q := readQuery{after: storage.ZeroOffset, start: true, cursor: -1}
	vals, err := url.ParseQuery(rawQuery)
	if err != nil {
		return q, badRequest("malformed query string: %v", err)
	}
	for _, k := range []string{"offset", "live", "cursor"} {
		if len(vals[k]) > 1 {
			return q, badRequest("query parameter %q is given %d times: give it once", k, len(vals[k]))
		}
	}
	offsets, hasOffset := vals["offset"]
	if hasOffset {
		off := offsets[0]
		switch {
		case off == "":
			return q, badRequest("empty offset: use offset=-1 for the start, offset=now for the tail, or a Stream-Next-Offset value")
		case off == "-1":
		case off == offsetNow:
			q.after, q.start = offsetNow, false
		case !validOffsetSyntax(off):
			return q, badRequest("malformed offset %.70q: use -1, now, or a Stream-Next-Offset value", off)
		default:
			q.after, q.start = off, false
		}
	}
	q.live = vals.Get("live")
	_, hasLive := vals["live"]
	switch q.live {
	case liveNone:
		if hasLive {
			return q, badRequest("empty live mode: use live=long-poll or live=sse, or omit live for a catch-up read")
		}
	case liveLongPoll, liveSSE:
		if !hasOffset {
			return q, badRequest("live=%s needs an offset: use offset=-1, offset=now or a Stream-Next-Offset value", q.live)
		}
	default:
		return q, badRequest("unknown live mode %.40q: use live=long-poll or live=sse, or omit it for a catch-up read", q.live)
	}
	if c, err := strconv.ParseInt(vals.Get("cursor"), 10, 64); err == nil && c >= 0 {
		q.cursor = c
	}
	return q, nil
}

// validOffsetSyntax is the gateway's whitelist for offsets: short, digits
// and '_' only. The log checks the exact form.
func validOffsetSyntax(s string) bool {
	if s == "" || len(s) > maxOffsetLen {
		return false
	}
	for i := range len(s) {
		if c := s[i]; (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
}

// serveHead answers HEAD with the stream's metadata. It does not renew
// the stream's TTL.
func (s *Server) serveHead(w http.ResponseWriter, r *http.Request, name string) {
	info, err := s.cfg.Log.Head(r.Context(), name)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	h := w.Header()
	h.Set("Content-Type", info.ContentType)
	h.Set(hdrNextOffset, info.Tail)
	h.Set("Cache-Control", "no-store")
	if info.TTL > 0 {
		// What is left of it, in whole seconds rounded up: a live
		// stream never shows 0.
		left := info.TTLLeft
		if left <= 0 {
			left = info.TTL // a log that does not say
		}
		h.Set(hdrTTL, strconv.FormatInt(int64((left+time.Second-1)/time.Second), 10))
	}
	switch {
	case info.ExpiresAtRaw != "":
		h.Set(hdrExpiresAt, info.ExpiresAtRaw)
	case !info.ExpiresAt.IsZero():
		h.Set(hdrExpiresAt, info.ExpiresAt.UTC().Format(time.RFC3339Nano))
	}
	setClosed(h, info.Closed)
	w.WriteHeader(http.StatusOK)
}

// serveRead answers GET in the mode the query asks for.
//
// With a token (id not nil), a live read ends by the token's exp, as a
// WebSocket session is told at exp: the client comes back from its offset
// with a fresh token. A token past its exp, still accepted within the
// verifier's leeway, gets catch-up reads only.
func (s *Server) serveRead(w http.ResponseWriter, r *http.Request, name string, id *auth.Identity) {
	q, err := parseReadQuery(r.URL.RawQuery)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var until time.Time // zero: no bound but the mode's own
	// A zero Expires never expires (TokenVerifier).
	if id != nil && q.live != liveNone && !id.Expires.IsZero() {
		until = id.Expires
		if !until.After(s.cfg.Now()) {
			w.Header().Set("WWW-Authenticate", challengeInvalid)
			s.fail(w, r, &requestError{http.StatusUnauthorized,
				"the token has reached its exp: a live read needs a token that has not, so fetch a fresh one (catch-up reads still take this one within the leeway)"})
			return
		}
	}
	if q.live != liveNone {
		release, after, rerr := s.holdLiveRead(r, id)
		if rerr != nil {
			w.Header().Set("Retry-After", retryAfter(after))
			s.fail(w, r, rerr)
			return
		}
		defer release()
	}
	switch q.live {
	case liveLongPoll:
		s.serveLongPoll(w, r, name, q, until)
	case liveSSE:
		s.serveSSE(w, r, name, q, until)
	default:
		s.serveCatchUp(w, r, name, q)
	}
}

// holdLiveRead counts a live read against the caps of WebSocket sessions
// it is like (a connection held open to be written to): per client
// address (MaxSessionsPerIP) and per actor (MaxSessionsPerActor, with a
// token), 429 over either, and the node's (MaxSessions), 503 over it.
// release ends the count; after is the Retry-After of a refusal.
func (s *Server) holdLiveRead(r *http.Request, id *auth.Identity) (release func(), after time.Duration, err *requestError) {
	ip := clientIP(r.RemoteAddr)
	if !s.perIP.acquire(ip) {
		s.metrics.liveReadsRefused[rejectPerIP].Inc()
		return nil, time.Second, s.tooManyLive(fmt.Sprintf("this address already has %d sessions and live reads open, the limit", s.perIP.max))
	}
	if id != nil && !s.perActor.acquire(id.ActorID) {
		s.perIP.release(ip)
		s.metrics.liveReadsRefused[rejectPerActor].Inc()
		return nil, time.Second, s.tooManyLive(fmt.Sprintf("this token's sub already has %d sessions and live reads open, the limit", s.perActor.max))
	}
	if !s.budget.hold() {
		s.releaseLiveRead(ip, id)
		s.metrics.liveReadsRefused[rejectMaxSessions].Inc()
		return nil, s.budget.jitter(fullDelayMin, fullDelayMax), &requestError{http.StatusServiceUnavailable,
			fmt.Sprintf("node full: %d sessions and live reads open, its limit; retry after the Retry-After delay, or read without live (catch-up reads are not counted)", s.budget.max)}
	}
	s.metrics.liveReads.Inc()
	return func() { s.metrics.liveReads.Dec(); s.budget.release(); s.releaseLiveRead(ip, id) }, 0, nil
}

// releaseLiveRead gives back the per-address and per-actor places of a
// live read.
func (s *Server) releaseLiveRead(ip string, id *auth.Identity) {
	if id != nil {
		s.perActor.release(id.ActorID)
	}
	s.perIP.release(ip)
}

func (s *Server) tooManyLive(why string) *requestError {
	return &requestError{http.StatusTooManyRequests, why + ": close one, or read without live (catch-up reads are not counted)"}
}

// liveFor is how long a live read may last: d, or less when until (not
// zero) comes sooner.
func (s *Server) liveFor(d time.Duration, until time.Time) time.Duration {
	if !until.IsZero() {
		d = min(d, until.Sub(s.cfg.Now()))
	}
	return d
}

// resolveNow replaces offset "now" by the stream's tail, and returns the
// stream's metadata when it looked it up.
func (s *Server) resolveNow(ctx context.Context, name string, q *readQuery) (*storage.Info, error) {
	if q.after != offsetNow {
		return nil, nil
	}
	info, err := s.cfg.Log.Head(ctx, name)
	if err != nil {
		return nil, err
	}
	q.after = info.Tail
	return &info, nil
}

// readAfter reads a page after q.after. A read from the stream's start
// (offset -1) whose first records retention removed begins where the
// stream's records now start, and q.after becomes that offset: the client
// named no position it had, so it missed nothing it read; 410 is for an
// offset the client got from the stream (a Stream-Next-Offset), which
// says it did. Pruning runs on maintenance ticks, so a second look
// rarely finds more pruned; it looks at most maxStartLooks times.
func (s *Server) readAfter(ctx context.Context, name string, q *readQuery) (storage.ReadResult, error) {
	res, err := s.cfg.Log.Read(ctx, name, q.after, maxReadChunk)
	for i := 1; q.start && i < maxStartLooks; i++ {
		var pe *storage.PrunedError
		if !errors.As(err, &pe) {
			break
		}
		q.after = pe.Pruned
		res, err = s.cfg.Log.Read(ctx, name, q.after, maxReadChunk)
	}
	q.start = false
	return res, err
}

// maxStartLooks bounds readAfter's reads of a stream pruned meanwhile.
const maxStartLooks = 3

// serveCatchUp answers a GET without live: the records after the offset,
// up to maxReadChunk, with an ETag that If-None-Match can match for a 304.
// offset=now answers with no records and the tail.
func (s *Server) serveCatchUp(w http.ResponseWriter, r *http.Request, name string, q readQuery) {
	info, err := s.resolveNow(r.Context(), name, &q)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	// The read renews a sliding TTL, offset=now included.
	fromStart := q.start // readAfter clears it
	res, err := s.readAfter(r.Context(), name, &q)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	h := w.Header()
	if info != nil {
		// offset=now: no data, whatever was appended since the lookup.
		res.Records, res.Next, res.UpToDate, res.Closed = nil, info.Tail, true, info.Closed
		h.Set("Cache-Control", "no-store")
		writePage(w, http.StatusOK, res, renderBody(res))
		return
	}
	body := renderBody(res)
	etag := pageETag(q.after, res, body)
	h.Set("Etag", etag)
	if res.UpToDate || res.Closed || fromStart {
		// The same URL returns more once the stream grows, and, from the
		// start, other records once retention moves the start: caches
		// must revalidate (cheap, with the ETag).
		h.Set("Cache-Control", "no-cache")
	} else {
		h.Set("Cache-Control", s.pageCacheControl(r.Context(), name, res.ID))
	}
	if etagMatches(r.Header.Get("If-None-Match"), etag) {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	writePage(w, http.StatusOK, res, body)
}

// How long a cache may keep a page cut short by the chunk limit, and serve
// it while it revalidates, when the stream lives longer.
const (
	pageMaxAge               = 60 * time.Second
	pageStaleWhileRevalidate = 300 * time.Second
)

// pageCacheControl is the Cache-Control of a page of stream name (whose
// Info.ID is id) cut short by the chunk limit. Such a page never changes,
// so caches may keep it for pageMaxAge and serve it for
// pageStaleWhileRevalidate more while they revalidate, but not past the
// stream's life, which its TTL and expiry bound (PROTOCOL.md §5.5 derives
// the header from them): the read just renewed a sliding TTL, so the
// stream lives at least the TTL; an Expires-At is absolute. Less than a
// second left, or a stream gone (or made anew) since the read, is
// "no-cache". Behind tokens only the client that may read a page may
// cache it: "private".
func (s *Server) pageCacheControl(ctx context.Context, name string, id uint64) string {
	info, err := s.cfg.Log.Head(ctx, name)
	if err != nil || info.ID != id {
		return "no-cache"
	}
	life := time.Duration(math.MaxInt64)
	if info.TTL > 0 {
		life = info.TTL
	}
	if !info.ExpiresAt.IsZero() {
		life = min(life, info.ExpiresAt.Sub(s.cfg.Now()))
	}
	secs := int64(life / time.Second)
	if secs < 1 {
		return "no-cache"
	}
	maxAge := min(secs, int64(pageMaxAge/time.Second))
	swr := min(secs-maxAge, int64(pageStaleWhileRevalidate/time.Second))
	scope := "public"
	if s.cfg.Verifier != nil {
		scope = "private"
	}
	cc := scope + ", max-age=" + strconv.FormatInt(maxAge, 10)
	if swr > 0 {
		cc += ", stale-while-revalidate=" + strconv.FormatInt(swr, 10)
	}
	return cc
}

// serveLongPoll answers a GET with live=long-poll: the records after the
// offset as soon as there are any, else 204 after s.cfg.LongPollTimeout or
// at until, whichever is sooner (at once for a closed stream at its end).
// Both carry Stream-Cursor.
func (s *Server) serveLongPoll(w http.ResponseWriter, r *http.Request, name string, q readQuery, until time.Time) {
	if _, err := s.resolveNow(r.Context(), name, &q); err != nil {
		s.fail(w, r, err)
		return
	}
	wait := s.liveFor(s.cfg.LongPollTimeout, until)
	extendWriteDeadline(w, wait, s.cfg.WriteTimeout)
	waitCtx, cancel := s.liveContext(r.Context(), wait)
	defer cancel()

	h := w.Header()
	var id uint64 // the stream the first read found
	for {
		res, err := s.readAfter(r.Context(), name, &q)
		switch {
		case err != nil:
		case id == 0:
			id = res.ID
		case res.ID != id:
			// Deleted and made anew while this request waited: the
			// offset belongs to the stream that is gone.
			err = fmt.Errorf("%w: %q was deleted during the long-poll", storage.ErrNotFound, name)
		}
		if err != nil {
			s.fail(w, r, err)
			return
		}
		h.Set(hdrCursor, s.cursor(q.cursor))
		if len(res.Records) > 0 {
			// A catch-up's headers (PROTOCOL.md §5.6), its ETag too, and
			// its 304 for a matching If-None-Match (§8.1).
			body := renderBody(res)
			etag := pageETag(q.after, res, body)
			h.Set("Etag", etag)
			h.Set("Cache-Control", "no-cache")
			if etagMatches(r.Header.Get("If-None-Match"), etag) {
				w.WriteHeader(http.StatusNotModified)
				return
			}
			writePage(w, http.StatusOK, res, body)
			return
		}
		if res.Closed {
			writePage(w, http.StatusNoContent, res, nil)
			return
		}
		err = s.cfg.Log.WaitID(waitCtx, name, q.after, id)
		switch {
		case r.Context().Err() != nil:
			return // the client left
		case err == nil:
			// Woken, perhaps just as the wait ran out: the read above
			// answers with what woke it, never a 204 at an offset that
			// is no longer the tail.
			continue
		case waitCtx.Err() != nil:
			// Timed out (or the server is shutting down): nothing new.
			// The offset stays the one asked for, so nothing appended in
			// between is skipped.
			res.UpToDate = true
			h.Set("Cache-Control", "no-store")
			writePage(w, http.StatusNoContent, res, nil)
			return
		default:
			s.fail(w, r, err)
			return
		}
	}
}

// liveContext returns a context for a live read's wait: it ends after d,
// with the request, or when the server shuts down.
func (s *Server) liveContext(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(parent, d)
	stop := context.AfterFunc(s.baseCtx, cancel)
	return ctx, func() { stop(); cancel() }
}

// extendWriteDeadline lets a live response outlast the http.Server's
// WriteTimeout: the deadline becomes now+wait+write, or as far as a
// Duration reaches if that sum overflows (it would land in the past, and
// the answer would never be written).
func extendWriteDeadline(w http.ResponseWriter, wait, write time.Duration) {
	d := wait + write
	if d < wait {
		d = math.MaxInt64
	}
	// ErrNotSupported (a wrapped or test ResponseWriter) leaves the
	// server's own deadline, which is all that can be done.
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(d))
}

// writePage writes the headers of a read response for res, then body.
func writePage(w http.ResponseWriter, status int, res storage.ReadResult, body []byte) {
	h := w.Header()
	h.Set(hdrNextOffset, res.Next)
	if res.UpToDate {
		h.Set(hdrUpToDate, "true")
	}
	setClosed(h, res.Closed)
	if status == http.StatusNoContent {
		w.WriteHeader(status)
		return
	}
	h.Set("Content-Type", res.ContentType)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// renderBody is the response body for res's records: a JSON array of the
// messages for a JSON-mode stream, else the records' bytes back to back.
func renderBody(res storage.ReadResult) []byte {
	if isJSON(res.ContentType) {
		return appendJSONArray(nil, res.Records)
	}
	n := 0
	for _, rec := range res.Records {
		n += len(rec.Data)
	}
	body := make([]byte, 0, n)
	for _, rec := range res.Records {
		body = append(body, rec.Data...)
	}
	return body
}

// appendJSONArray appends the records, each one JSON message, as a JSON
// array.
func appendJSONArray(b []byte, recs []storage.Record) []byte {
	b = append(b, '[')
	for i, rec := range recs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, rec.Data...)
	}
	return append(b, ']')
}

// pageETag identifies a read response: its offset range, a hash of the
// stream's identity (its log id and content type) and of the body, so
// that a stream deleted and created again never matches an old tag, even
// with the same records in another type, and whether it ends a closed
// stream.
func pageETag(start string, res storage.ReadResult, body []byte) string {
	sum := fnv.New64a()
	var id [8]byte
	binary.BigEndian.PutUint64(id[:], res.ID)
	_, _ = sum.Write(id[:])
	_, _ = sum.Write([]byte(res.ContentType))
	_, _ = sum.Write([]byte{0})
	_, _ = sum.Write(body)
	var b strings.Builder
	b.WriteString(`"`)
	b.WriteString(start)
	b.WriteString(":")
	b.WriteString(res.Next)
	b.WriteString(":")
	b.WriteString(hex.EncodeToString(sum.Sum(nil)))
	if res.Closed {
		b.WriteString(":c")
	}
	b.WriteString(`"`)
	return b.String()
}

// etagMatches reports whether an If-None-Match value matches etag
// (RFC 9110 §13.1.2: weak comparison, a list, or "*").
func etagMatches(ifNoneMatch, etag string) bool {
	if ifNoneMatch == "" {
		return false
	}
	for v := range strings.SplitSeq(ifNoneMatch, ",") {
		v = strings.TrimSpace(v)
		if v == "*" || strings.TrimPrefix(v, "W/") == etag {
			return true
		}
	}
	return false
}

// cursor returns the Stream-Cursor for a live response to a client that
// sent clientCursor (-1 for none): the current interval number, or, when
// the client is already there, a later one with jitter, so that a cached
// response is never served again to the same client (PROTOCOL.md §8.1).
func (s *Server) cursor(clientCursor int64) string {
	return strconv.FormatInt(s.cursorNum(clientCursor), 10)
}

// cursorNum is cursor as a number.
func (s *Server) cursorNum(clientCursor int64) int64 {
	c := int64(s.cfg.Now().Sub(cursorEpoch) / cursorInterval)
	if clientCursor >= c {
		// 1 to an hour's worth of intervals ahead (20 s to 1 h), and
		// never past the largest int64: a cursor that wrapped to a
		// negative one would be ignored when echoed.
		if room := math.MaxInt64 - clientCursor; room > 0 {
			return clientCursor + 1 + rand.Int64N(min(room, int64(time.Hour/cursorInterval)))
		}
		return math.MaxInt64
	}
	return c
}

// sseCursors returns the cursors of one SSE response's control events to
// a client that sent clientCursor: each is cursor's, but never less than
// the one before. A client ahead of the clock gets new jitter for each
// event, and the last cursor it saw, the one it echoes, must not take it
// back to a cache key it already used.
func (s *Server) sseCursors(clientCursor int64) func() string {
	last := int64(-1)
	return func() string {
		last = max(last, s.cursorNum(clientCursor))
		return strconv.FormatInt(last, 10)
	}
}

// sseControl is the payload of an SSE control event.
type sseControl struct {
	NextOffset string `json:"streamNextOffset"`
	Cursor     string `json:"streamCursor,omitempty"`
	UpToDate   bool   `json:"upToDate,omitempty"`
	Closed     bool   `json:"streamClosed,omitempty"`
}

// serveSSE answers a GET with live=sse: a text/event-stream of data
// events, each followed by a control event with the offset after it, then
// live data as it is appended. Idle for s.cfg.LongPollTimeout, it sends a
// keep-alive control event. It ends at the closed stream's end, after
// sseLifetime or at until (whichever is sooner), or at shutdown; the client
// reconnects from its last offset.
func (s *Server) serveSSE(w http.ResponseWriter, r *http.Request, name string, q readQuery, until time.Time) {
	if _, err := s.resolveNow(r.Context(), name, &q); err != nil {
		s.fail(w, r, err)
		return
	}
	res, err := s.readAfter(r.Context(), name, &q)
	if err != nil {
		s.fail(w, r, err) // still before any SSE header
		return
	}
	ct := mediaType(res.ContentType)
	binary := !strings.HasPrefix(ct, "text/") && ct != "application/json"
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	if binary {
		h.Set(hdrSSEEncoding, "base64")
	}
	rc := http.NewResponseController(w)
	w.WriteHeader(http.StatusOK)

	life, cancel := s.liveContext(r.Context(), s.liveFor(sseLifetime, until))
	defer cancel()
	cursor := s.sseCursors(q.cursor)
	var buf bytes.Buffer
	for first := true; ; first = false {
		buf.Reset()
		if len(res.Records) > 0 {
			appendSSEData(&buf, res, binary)
		}
		if len(res.Records) > 0 || first || res.Closed {
			appendSSEControl(&buf, res, cursor)
		}
		if err := s.writeSSE(w, rc, buf.Bytes()); err != nil || res.Closed {
			return
		}
		q.after = res.Next
		// Sent. A response that waits now keeps neither the page nor a
		// buffer grown to frame it: idle, it costs a few KiB, not up to
		// sseLifetime of its last page.
		res.Records = nil
		if buf.Cap() > sseKeepBuffer {
			buf = bytes.Buffer{}
		}
		for res.UpToDate {
			// Caught up: wait for more, with a keep-alive when idle.
			waitCtx, stop := context.WithTimeout(life, s.cfg.LongPollTimeout)
			err := s.cfg.Log.WaitID(waitCtx, name, q.after, res.ID)
			// Woken just as the interval ran out is not idle: the read
			// below sends what woke it, with no keep-alive before it
			// that says the old offset is the tail.
			idle := err != nil && waitCtx.Err() != nil
			stop()
			switch {
			case life.Err() != nil:
				return
			case idle:
				buf.Reset()
				appendSSEControl(&buf, storage.ReadResult{Next: q.after, UpToDate: true}, cursor)
				if s.writeSSE(w, rc, buf.Bytes()) != nil {
					return
				}
				continue
			case err != nil:
				// Deleted or expired (or made anew): end the response;
				// the client's reconnect gets the status.
				return
			}
			break
		}
		id := res.ID
		if res, err = s.cfg.Log.Read(life, name, q.after, maxReadChunk); err != nil || res.ID != id {
			return // never another incarnation's records in one response
		}
	}
}

// writeSSE writes and flushes one or more whole events, each write under
// its own deadline, lifted once the events are flushed: on HTTP/2 a
// deadline is a timer that resets the stream when it fires, so one left
// set would end an SSE response idle between events.
func (s *Server) writeSSE(w http.ResponseWriter, rc *http.ResponseController, events []byte) error {
	_ = rc.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
	if _, err := w.Write(events); err != nil {
		return err
	}
	if err := rc.Flush(); err != nil {
		return err
	}
	_ = rc.SetWriteDeadline(time.Time{})
	return nil
}

// appendSSEData appends one data event carrying res's records: a JSON
// array for a JSON-mode stream, the text for text/*, else base64. Each
// line of the payload goes on its own data: line; CR, LF and CRLF all end
// a line, so a payload can never start an event of its own.
func appendSSEData(buf *bytes.Buffer, res storage.ReadResult, binary bool) {
	payload := renderBody(res)
	if binary {
		payload = base64.StdEncoding.AppendEncode(nil, payload)
	}
	buf.WriteString("event: data\n")
	for {
		i := bytes.IndexAny(payload, "\r\n")
		if i < 0 {
			break
		}
		appendSSEDataLine(buf, payload[:i])
		if payload[i] == '\r' && i+1 < len(payload) && payload[i+1] == '\n' {
			i++
		}
		payload = payload[i+1:]
	}
	appendSSEDataLine(buf, payload)
	buf.WriteByte('\n')
}

// appendSSEDataLine appends one data: line carrying line (which has no CR
// or LF). A reader drops one space after the colon (WHATWG HTML, "Parsing
// an event stream"), so a line that starts with a space gets one more,
// which the reader drops, and keeps its own.
func appendSSEDataLine(buf *bytes.Buffer, line []byte) {
	buf.WriteString("data:")
	if len(line) > 0 && line[0] == ' ' {
		buf.WriteByte(' ')
	}
	buf.Write(line)
	buf.WriteByte('\n')
}

// appendSSEControl appends a control event for res: the offset to resume
// from, a cursor (from cursor) unless the stream is closed, and the
// up-to-date and closed flags.
func appendSSEControl(buf *bytes.Buffer, res storage.ReadResult, cursor func() string) {
	c := sseControl{NextOffset: res.Next, UpToDate: res.UpToDate, Closed: res.Closed}
	if !res.Closed {
		c.Cursor = cursor()
	}
	b, _ := json.Marshal(c) // strings and bools always encode
	buf.WriteString("event: control\ndata:")
	buf.Write(b)
	buf.WriteString("\n\n")
}
