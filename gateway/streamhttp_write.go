package gateway

// Writes of the Durable Streams API: PUT (create, fork), POST (append,
// close) and DELETE, with the validation of their headers and bodies.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/syncgate/syncgate/auth"
	"github.com/syncgate/syncgate/frames"
	"github.com/syncgate/syncgate/storage"
)

const (
	// maxDrainBytes bounds how much of a refused (413) body is read and
	// discarded so that the client sees the response rather than a reset
	// connection. Beyond it the connection is closed.
	maxDrainBytes = 64 << 20

	// maxStreamSeqBytes and maxProducerIDBytes bound those headers.
	maxStreamSeqBytes  = 1024
	maxProducerIDBytes = 256

	// maxSafeInteger is the largest Producer-Epoch or Producer-Seq: 2^53-1,
	// so that JavaScript clients represent them exactly.
	maxSafeInteger = 1<<53 - 1
)

// decimalRe is the form of Stream-TTL and Stream-Fork-Sub-Offset: a
// decimal integer without sign or leading zeros.
var decimalRe = regexp.MustCompile(`^(0|[1-9][0-9]*)$`)

// serveCreate answers PUT: it creates the stream (201 with Location), or
// finds it with the same configuration (200), or refuses (409).
func (s *Server) serveCreate(w http.ResponseWriter, r *http.Request, name string, id *auth.Identity) {
	ctx := r.Context()
	opts, err := s.parseCreateHeaders(r.Header, r.Host)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	body, err := s.readBody(w, r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if opts.ContentType == "" {
		opts.ContentType = "application/octet-stream"
		if opts.ForkFrom != "" {
			// A fork without Content-Type takes its source's. A repeated
			// PUT of an existing fork takes the fork's: its source may
			// since have been deleted or have expired, and the fork's
			// configuration is still the one the request names (200).
			src, err := s.cfg.Log.Head(ctx, opts.ForkFrom)
			if err != nil {
				fork, ferr := s.cfg.Log.Head(ctx, name)
				if ferr != nil || fork.ForkFrom != opts.ForkFrom {
					s.fail(w, r, forkSourceError(err))
					return
				}
				src = fork
			}
			opts.ContentType = src.ContentType
		}
	}
	if s.persisted(name) && !isJSON(opts.ContentType) {
		// WebSocket subscribers read a persisted topic's records as JSON
		// rows: another type would leave the topic unusable.
		s.fail(w, r, &requestError{http.StatusConflict, fmt.Sprintf(
			"%q is a persisted topic (-persist): its stream must be application/json, not %q; PUT it with Content-Type: application/json",
			name, opts.ContentType)})
		return
	}
	if opts.Records, err = splitRecords(opts.ContentType, body, true); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := checkRecordActors(opts.ContentType, opts.Records, id); err != nil {
		s.fail(w, r, err)
		return
	}
	if err := s.checkPersistedSizes(name, opts.ContentType, opts.Records); err != nil {
		s.fail(w, r, err)
		return
	}
	info, created, err := s.cfg.Log.Create(ctx, name, opts)
	if err != nil {
		if opts.ForkFrom != "" {
			err = forkSourceError(err)
		} else if errors.Is(err, storage.ErrGone) {
			err = &requestError{http.StatusConflict, "a deleted stream that still has forks holds this name: delete its forks first, or use another name"}
		}
		s.fail(w, r, err)
		return
	}
	if created {
		s.streamMade(name) // a persisted topic's subscribers may wait for it
		s.countPublishes(name, opts.ContentType, len(opts.Records))
	}
	h := w.Header()
	h.Set("Content-Type", info.ContentType)
	h.Set(hdrNextOffset, info.Tail)
	setClosed(h, info.Closed)
	if !created {
		w.WriteHeader(http.StatusOK)
		return
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	h.Set("Location", scheme+"://"+r.Host+r.URL.EscapedPath())
	w.WriteHeader(http.StatusCreated)
}

// forkSourceError maps the errors of a fork's creation that concern its
// source: a fork point in records retention removed is gone (410); a
// soft-deleted source cannot be forked (409), nor forked as another
// content type (409); nor can a source already
// storage.MaxForkDepth forks deep (400: the request names a source this
// server never forks, whatever its state).
func forkSourceError(err error) error {
	if pe, ok := errors.AsType[*storage.PrunedError](err); ok {
		return &requestError{http.StatusGone, "gone: the fork point is older than what the Stream-Forked-From source retains: fork at offset " +
			pe.Pruned + " or later"}
	}
	if de, ok := errors.AsType[*storage.ForkDepthError](err); ok {
		return badRequest("the Stream-Forked-From source is a fork %d levels deep, the most this server forks: "+
			"fork the stream it was forked from instead (at an offset the two share), or read the source and PUT its data as a new stream", de.Max)
	}
	if errors.Is(err, storage.ErrGone) {
		return &requestError{http.StatusConflict, "the Stream-Forked-From source was deleted: it can no longer be forked"}
	}
	if errors.Is(err, storage.ErrConflict) && strings.Contains(err.Error(), "fork content type") {
		return &requestError{http.StatusConflict, "Content-Type is not the Stream-Forked-From source's: a fork has its source's type; omit Content-Type to take it"}
	}
	if errors.Is(err, storage.ErrNotFound) {
		return &requestError{http.StatusNotFound, "stream not found: the Stream-Forked-From source (or the stream) does not exist"}
	}
	return err
}

// parseCreateHeaders validates a PUT's headers into create options
// (without records); host is the request's (see forkSource).
func (s *Server) parseCreateHeaders(h http.Header, host string) (storage.CreateOptions, error) {
	o := storage.CreateOptions{Closed: headerTrue(h, hdrClosed)}
	var err error
	if o.ContentType, err = contentType(h); err != nil {
		return o, err
	}
	ttl, hasTTL := h[hdrTTL]
	exp, hasExp := h[hdrExpiresAt]
	switch {
	case hasTTL && hasExp:
		return o, badRequest("Stream-TTL and Stream-Expires-At are exclusive: send one of them")
	case hasTTL:
		v := ttl[0]
		n, err := strconv.ParseInt(v, 10, 64)
		switch {
		case !decimalRe.MatchString(v):
			return o, badRequest("malformed Stream-TTL %.40q: give whole seconds, e.g. 3600 (no sign, leading zeros, fraction or exponent)", v)
		case err != nil || n > math.MaxInt64/int64(time.Second):
			return o, badRequest("Stream-TTL %.40q is too large: give at most %d seconds", v, math.MaxInt64/int64(time.Second))
		case n == 0:
			return o, badRequest("Stream-TTL 0 would expire the stream at once: give at least 1 second, or omit it for no expiry")
		}
		o.TTL = time.Duration(n) * time.Second
	case hasExp:
		v := exp[0]
		t, err := time.Parse(time.RFC3339Nano, v)
		switch {
		case err != nil:
			return o, badRequest("malformed Stream-Expires-At %.60q: give an RFC 3339 timestamp, e.g. 2030-01-01T00:00:00Z", v)
		case !t.After(s.cfg.Now()):
			return o, badRequest("Stream-Expires-At %.60q is in the past: give a future instant", v)
		}
		o.ExpiresAt, o.ExpiresAtRaw = t, v
	}

	from, hasFrom := h[hdrForkedFrom]
	off, hasOff := h[hdrForkOffset]
	sub, hasSub := h[hdrForkSubOffset]
	if !hasFrom {
		if hasOff || hasSub {
			return o, badRequest("Stream-Fork-Offset and Stream-Fork-Sub-Offset need Stream-Forked-From: name the source stream")
		}
		return o, nil
	}
	if o.ForkFrom, err = forkSource(from[0], host); err != nil {
		return o, err
	}
	if hasOff {
		if !validOffsetSyntax(off[0]) {
			return o, badRequest("malformed Stream-Fork-Offset %.70q: give a Stream-Next-Offset value of the source, or omit it to fork at the tail", off[0])
		}
		o.ForkOffset = off[0]
	}
	if hasSub {
		v := sub[0]
		n, err := strconv.ParseInt(v, 10, 64)
		if !decimalRe.MatchString(v) || err != nil {
			return o, badRequest("malformed Stream-Fork-Sub-Offset %.40q: give a count without sign or leading zeros, e.g. 3", v)
		}
		o.ForkSubOffset = n
	}
	return o, nil
}

// forkSource returns the stream a Stream-Forked-From value names: its
// path (/v1/stream/<name>) or an absolute URL with that path on this
// server (host: the request's Host, as the Location of a 201 gives it).
// A URL naming another host is refused rather than taken for the stream
// of the same path here.
func forkSource(v, host string) (string, error) {
	u, err := url.Parse(v)
	if err == nil {
		if u.Host != "" && !strings.EqualFold(u.Host, host) {
			return "", badRequest("Stream-Forked-From %.80q names another server than this one (%.60s): a fork's source must be a stream of this server; give its path, e.g. %ssource", v, host, streamPrefix)
		}
		var name string
		if name, err = streamName(u.EscapedPath()); err == nil {
			return name, nil
		}
	}
	return "", badRequest("malformed Stream-Forked-From %.80q: give the source stream's path, e.g. %ssource (%v)", v, streamPrefix, err)
}

// contentType returns the request's Content-Type ("" when absent), which
// must be a well-formed media type.
func contentType(h http.Header) (string, error) {
	ct := h.Get("Content-Type")
	if ct == "" {
		return "", nil
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil || !strings.Contains(mt, "/") {
		return "", badRequest("malformed Content-Type %.80q: give a media type such as text/plain or application/json", ct)
	}
	return ct, nil
}

// serveAppend answers POST: an append (204, or 200 for a producer's new
// batch), a close (Stream-Closed: true, with or without a body), or a
// producer's retry (204, nothing written). An append with data at a
// persisted topic's name makes its stream if there is none, as a
// WebSocket publish to the topic does (with the same publish grant): a
// backend may write to a topic nobody has published to yet. Data of
// another type than JSON makes none (409, as a PUT there).
func (s *Server) serveAppend(w http.ResponseWriter, r *http.Request, name string, id *auth.Identity) {
	req, err := parseAppendHeaders(r.Header)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if err := scopeProducer(req.Producer, id); err != nil {
		s.fail(w, r, err)
		return
	}
	body, err := s.readBody(w, r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	switch {
	case len(body) == 0 && !req.Close:
		s.fail(w, r, badRequest("empty body: an append needs data (to close the stream, send Stream-Closed: true)"))
		return
	case len(body) == 0:
		// Close-only: the content type does not matter.
		req.ContentType = ""
	case req.ContentType == "":
		s.fail(w, r, badRequest("missing Content-Type: send the stream's content type with the data"))
		return
	default:
		if req.Records, err = splitRecords(req.ContentType, body, false); err != nil {
			s.fail(w, r, s.explainBodyError(r.Context(), name, req.ContentType, err))
			return
		}
		if err := checkRecordActors(req.ContentType, req.Records, id); err != nil {
			s.fail(w, r, err)
			return
		}
		if err := s.checkPersistedSizes(name, req.ContentType, req.Records); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	// A persisted topic's stream is made by its first append, in the
	// same commit, as by a WebSocket publish.
	makes := len(req.Records) > 0 && s.persisted(name)
	req.CreateMissing = makes && isJSON(req.ContentType)
	res, err := s.cfg.Log.Append(r.Context(), name, req)
	if err != nil {
		if makes && !req.CreateMissing && errors.Is(err, storage.ErrNotFound) {
			// WebSocket subscribers read a persisted topic's records
			// as JSON rows: as a PUT there (serveCreate).
			err = &requestError{http.StatusConflict, fmt.Sprintf(
				"%q is a persisted topic (-persist): its stream must be application/json, not %q; POST it with Content-Type: application/json",
				name, req.ContentType)}
		}
		s.fail(w, r, err)
		return
	}
	if req.CreateMissing {
		s.streamMade(name) // its subscribers may wait for it
	}
	if !res.Duplicate {
		s.countPublishes(name, req.ContentType, len(req.Records))
	}
	h := w.Header()
	h.Set(hdrNextOffset, res.Offset)
	setClosed(h, res.Closed)
	status := http.StatusNoContent
	if req.Producer != nil {
		h.Set(hdrProducerEpoch, strconv.FormatInt(res.Epoch, 10))
		h.Set(hdrProducerSeq, strconv.FormatInt(res.Seq, 10))
		if !res.Duplicate && len(req.Records) > 0 {
			status = http.StatusOK // a producer's new data
		}
	}
	w.WriteHeader(status)
}

// countPublishes counts in syncgate_publishes_total the n messages an
// HTTP write (of content type ct) added to stream name, if it is a
// persisted topic's: each reaches the topic's WebSocket subscribers as
// one patch, as a WebSocket publish does, so it counts as one whichever
// door it came through. A stream of another type than JSON there is no
// topic's (a subscribe is refused), and a producer's retry answered as
// a duplicate wrote nothing: the caller does not count it.
func (s *Server) countPublishes(name, ct string, n int) {
	if n > 0 && isJSON(ct) && s.persisted(name) {
		s.metrics.publishes.Add(float64(n))
	}
}

// explainBodyError returns the error for a body that splitRecords refused
// (bodyErr), unless the request fails for a reason the protocol ranks
// first: the stream is missing or gone, closed, or of another content
// type. Only a refused body costs this extra lookup.
func (s *Server) explainBodyError(ctx context.Context, name, ct string, bodyErr error) error {
	info, err := s.cfg.Log.Head(ctx, name)
	switch {
	case errors.Is(err, storage.ErrNotFound) && s.persisted(name):
		// A good body would have made it (serveAppend).
		return bodyErr
	case err != nil:
		return err
	case info.Closed:
		return &storage.ClosedError{Tail: info.Tail}
	case mediaType(info.ContentType) != mediaType(ct):
		return storage.ErrContentType
	}
	return bodyErr
}

// checkPersistedSizes refuses (413), at a persisted topic's name, a
// message larger than its subscribers are sent (Server.maxRow: a quarter
// of a session's send queue), which the tailer and a replay would skip.
// Only a JSON stream's messages are rows (ct: the request's content type;
// a subscribe refuses another type).
func (s *Server) checkPersistedSizes(name, ct string, records [][]byte) *requestError {
	if !isJSON(ct) || !s.persisted(name) {
		return nil
	}
	limit := s.maxRow()
	for i, rec := range records {
		if len(rec) > limit {
			return &requestError{http.StatusRequestEntityTooLarge, fmt.Sprintf(
				"message %d is %d bytes: %q is a persisted topic (-persist), whose WebSocket subscribers take a message of at most %d bytes (a quarter of -send-queue-bytes); split it, or raise -send-queue-bytes",
				i, len(rec), name, limit)}
		}
		if !fitsRow(rec) {
			return badRequest("message %d nests more than %d deep: %q is a persisted topic (-persist), whose WebSocket subscribers could not read it in a patch (frames nest at most %d deep); send flatter data",
				i, maxRowDepth, name, frames.MaxDepth)
		}
	}
	return nil
}

// parseAppendHeaders validates a POST's headers into an append request
// (without records).
func parseAppendHeaders(h http.Header) (storage.AppendRequest, error) {
	req := storage.AppendRequest{Close: headerTrue(h, hdrClosed)}
	var err error
	if req.ContentType, err = contentType(h); err != nil {
		return req, err
	}
	if seq, ok := h[hdrSeq]; ok {
		switch v := seq[0]; {
		case v == "":
			return req, badRequest("empty Stream-Seq: give a value greater than the last one, or omit the header")
		case len(v) > maxStreamSeqBytes:
			return req, badRequest("Stream-Seq is %d bytes long: the limit is %d", len(v), maxStreamSeqBytes)
		default:
			req.StreamSeq = v
		}
	}
	req.Producer, err = parseProducer(h)
	return req, err
}

// parseProducer returns the producer named by the Producer-* headers, nil
// when there are none.
func parseProducer(h http.Header) (*storage.Producer, error) {
	var missing []string
	for _, k := range []string{hdrProducerID, hdrProducerEpoch, hdrProducerSeq} {
		if _, ok := h[k]; !ok {
			missing = append(missing, k)
		}
	}
	switch len(missing) {
	case 3:
		return nil, nil
	case 0:
	default:
		return nil, badRequest("Producer-Id, Producer-Epoch and Producer-Seq go together: missing %s", strings.Join(missing, ", "))
	}
	p := &storage.Producer{ID: h.Get(hdrProducerID)}
	switch {
	case p.ID == "":
		return nil, badRequest("empty Producer-Id: name the producer, e.g. with a UUID")
	case len(p.ID) > maxProducerIDBytes:
		return nil, badRequest("Producer-Id is %d bytes long: the limit is %d", len(p.ID), maxProducerIDBytes)
	}
	var err error
	if p.Epoch, err = producerNumber(h, hdrProducerEpoch); err != nil {
		return nil, err
	}
	if p.Seq, err = producerNumber(h, hdrProducerSeq); err != nil {
		return nil, err
	}
	return p, nil
}

// producerNumber parses Producer-Epoch or Producer-Seq: a decimal integer
// from 0 to 2^53-1.
func producerNumber(h http.Header, k string) (int64, error) {
	v := h.Get(k)
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || n > maxSafeInteger || strings.HasPrefix(v, "+") {
		return 0, badRequest("malformed %s %.40q: give a decimal integer from 0 to %d", k, v, int64(maxSafeInteger))
	}
	return int64(n), nil
}

// readBody reads the request body, up to s.cfg.MaxAppendBytes; a larger
// one is drained (within limits) and refused with 413. The body must
// arrive within StreamBodyTimeout of the request's start (serveStream
// sets the deadline: a body trickled in must not hold the connection and
// its buffer). A body read whole lifts the deadline, so it cannot end the
// request's context while the append commits. On an error it stays:
// net/http reads what is left of the body before it writes the answer,
// and must not wait for it.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) (body []byte, err error) {
	defer func() {
		if err == nil && r.ContentLength != 0 {
			_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
		}
	}()
	limit := s.cfg.MaxAppendBytes
	tooLarge := &requestError{http.StatusRequestEntityTooLarge,
		fmt.Sprintf("the body is larger than %d bytes: split it into smaller appends", limit)}
	if r.ContentLength > limit {
		_, _ = io.CopyN(io.Discard, r.Body, maxDrainBytes)
		return nil, tooLarge
	}
	body, err = io.ReadAll(io.LimitReader(r.Body, limit+1))
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return nil, &requestError{http.StatusRequestTimeout,
			fmt.Sprintf("the body did not arrive within %v: send it at once, or smaller appends", s.cfg.StreamBodyTimeout)}
	}
	if err != nil {
		return nil, badRequest("reading the body: %v", err)
	}
	if int64(len(body)) > limit {
		_, _ = io.CopyN(io.Discard, r.Body, maxDrainBytes)
		return nil, tooLarge
	}
	return body, nil
}

// splitRecords turns a request body into the stream's records. For a
// JSON-mode content type the body must be one JSON value: an array is
// flattened one level into messages, anything else is one message, and
// each is stored compacted. An empty array (or body) means no records,
// which only a PUT may send. Other content types take the body as one
// record.
func splitRecords(ct string, body []byte, put bool) ([][]byte, error) {
	if !isJSON(ct) {
		if len(body) == 0 {
			return nil, nil
		}
		return [][]byte{body}, nil
	}
	if len(body) == 0 && put {
		return nil, nil
	}
	if !utf8.Valid(body) {
		return nil, badRequest("the JSON body is not valid UTF-8")
	}
	// One compacted copy of the body, whose messages are subslices: no
	// allocation per message. Compact also checks the JSON, in the same
	// pass.
	var b bytes.Buffer
	b.Grow(len(body))
	if err := json.Compact(&b, body); err != nil {
		return nil, badRequest("the body is not valid JSON (%v): a JSON stream takes one JSON value, an array of messages or a single message", err)
	}
	v := b.Bytes()
	if v[0] != '[' {
		return [][]byte{v}, nil
	}
	recs, ok := splitArray(v, maxAppendMessages)
	switch {
	case !ok:
		return nil, &requestError{http.StatusRequestEntityTooLarge,
			fmt.Sprintf("the JSON array holds more than %d messages: split it into smaller appends", maxAppendMessages)}
	case len(recs) == 0 && !put:
		return nil, badRequest("empty JSON array: an append needs at least one message")
	}
	return recs, nil
}

// maxAppendMessages bounds the messages of one JSON append. Each costs
// the log a key, an offset and bookkeeping whatever its size, so a body
// of tiny messages (an 8 MiB "[0,0,...]" is 4 million) would cost far
// more memory and commit time than its bytes suggest.
const maxAppendMessages = 1 << 16

// splitArray returns the elements of the compacted JSON array arr as
// subslices of it, or ok false if there are more than max.
func splitArray(arr []byte, max int) (elems [][]byte, ok bool) {
	depth, inString, escaped := 0, false, false
	start := 1
	for i := 1; i < len(arr); i++ {
		c := arr[i]
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '[' || c == '{':
			depth++
		case depth > 0 && (c == ']' || c == '}'):
			depth--
		case depth == 0 && (c == ',' || c == ']'): // the end of an element
			if i > start {
				if len(elems) == max {
					return nil, false
				}
				elems = append(elems, arr[start:i:i])
			}
			start = i + 1
		}
	}
	return elems, true
}

// serveDelete answers DELETE: 204, and the stream is gone (a stream with
// forks stays readable through them).
func (s *Server) serveDelete(w http.ResponseWriter, r *http.Request, name string) {
	if err := s.cfg.Log.Delete(r.Context(), name); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
