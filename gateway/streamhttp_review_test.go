package gateway_test

import (
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
