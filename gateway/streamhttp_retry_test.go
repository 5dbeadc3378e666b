package gateway_test

// Requests sent again (a PUT of an existing fork, a producer's retry, a
// long-poll revalidating its page) are answered as the first time.

import (
	"net/http"
	"testing"
	"time"

	"github.com/syncgate/syncgate/gateway"
)

// TestStreamHTTP_ForkRetryAfterSourceDeleted: a repeated PUT of an
// existing fork, with the headers that made it, is answered 200 whatever
// became of its source since: the configuration it names is the fork's.
func TestStreamHTTP_ForkRetryAfterSourceDeleted(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{})
	s.do(t, "PUT", "/v1/stream/src", hdr("Content-Type", "text/plain"), "hello").want(t, 201)
	s.do(t, "PUT", "/v1/stream/fork", hdr("Stream-Forked-From", "/v1/stream/src"), "").want(t, 201)
	s.do(t, "DELETE", "/v1/stream/src", nil, "").want(t, 204)
	s.do(t, "HEAD", "/v1/stream/src", nil, "").want(t, 410)
	s.do(t, "PUT", "/v1/stream/fork", hdr("Stream-Forked-From", "/v1/stream/src"), "").want(t, 200).
		wantHeader(t, "Content-Type", "text/plain")
	// With its type named, as without.
	s.do(t, "PUT", "/v1/stream/fork", hdr("Content-Type", "text/plain", "Stream-Forked-From", "/v1/stream/src"), "").want(t, 200)
	// Another configuration is still refused.
	s.do(t, "PUT", "/v1/stream/fork", hdr("Stream-Forked-From", "/v1/stream/src", "Stream-TTL", "60"), "").want(t, 409)
	// A new fork of the deleted source is still refused.
	s.do(t, "PUT", "/v1/stream/fork2", hdr("Stream-Forked-From", "/v1/stream/src"), "").want(t, 409)
	s.do(t, "GET", "/v1/stream/fork", nil, "").want(t, 200).wantBody(t, "hello")

	// A source that expired while its fork is read: the same.
	s.do(t, "PUT", "/v1/stream/tsrc", hdr("Content-Type", "text/plain", "Stream-TTL", "60"), "hi").want(t, 201)
	s.do(t, "PUT", "/v1/stream/tfork", hdr("Stream-Forked-From", "/v1/stream/tsrc"), "").want(t, 201)
	s.clock.Advance(40 * time.Second)
	s.do(t, "GET", "/v1/stream/tfork", nil, "").want(t, 200).wantBody(t, "hi")
	s.clock.Advance(40 * time.Second)
	s.do(t, "HEAD", "/v1/stream/tsrc", nil, "").want(t, 410)
	s.do(t, "PUT", "/v1/stream/tfork", hdr("Stream-Forked-From", "/v1/stream/tsrc"), "").want(t, 200)
}

// TestStreamHTTP_LongPollIfNoneMatch: a long-poll 200 carries the ETag a
// catch-up of the same range would, and honours If-None-Match as a
// catch-up does (PROTOCOL.md §8.1, for catch-up and long-poll reads): a
// cache revalidating its long-poll response gets 304, not the page again.
func TestStreamHTTP_LongPollIfNoneMatch(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{})
	const p = "/v1/stream/lpinm"
	s.do(t, "PUT", p, hdr("Content-Type", "text/plain"), "a").want(t, 201)
	etag := s.do(t, "GET", p+"?offset=-1&live=long-poll", nil, "").want(t, 200).header.Get("ETag")
	r := s.do(t, "GET", p+"?offset=-1&live=long-poll", hdr("If-None-Match", etag), "").want(t, 304).
		wantHeader(t, "ETag", etag).wantBody(t, "")
	if r.header.Get("Stream-Cursor") == "" {
		t.Fatal("no Stream-Cursor on a long-poll 304")
	}
	// Another tag gets the page.
	s.do(t, "GET", p+"?offset=-1&live=long-poll", hdr("If-None-Match", `"other"`), "").want(t, 200).wantBody(t, "a")
}

// TestStreamHTTP_ProducerRetryAfterClose: a producer that pipelines an
// append and then the append that closes the stream, and retries the
// first (its answer was lost), gets the first answer again: 204, a
// duplicate, with the original offset, not 409 for the closed stream,
// which would tell it that data the stream holds was refused.
func TestStreamHTTP_ProducerRetryAfterClose(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{})
	const p = "/v1/stream/prodclose"
	prod := func(seq string, close bool) http.Header {
		h := hdr("Content-Type", "text/plain", "Producer-Id", "p", "Producer-Epoch", "0", "Producer-Seq", seq)
		if close {
			h.Set("Stream-Closed", "true")
		}
		return h
	}
	s.do(t, "PUT", p, hdr("Content-Type", "text/plain"), "").want(t, 201)
	first := s.do(t, "POST", p, prod("0", false), "a").want(t, 200).header.Get("Stream-Next-Offset")
	s.do(t, "POST", p, prod("1", true), "b").want(t, 200).wantHeader(t, "Stream-Closed", "true")
	s.do(t, "POST", p, prod("0", false), "a").want(t, 204).
		wantHeader(t, "Stream-Next-Offset", first).
		wantHeader(t, "Stream-Closed", "true").
		wantHeader(t, "Producer-Seq", "1")
	// New data is still refused, from this producer or another.
	s.do(t, "POST", p, prod("2", false), "c").want(t, 409).wantHeader(t, "Stream-Closed", "true")
	s.do(t, "POST", p, hdr("Content-Type", "text/plain"), "c").want(t, 409)
	s.do(t, "GET", p, nil, "").want(t, 200).wantBody(t, "ab")
}
