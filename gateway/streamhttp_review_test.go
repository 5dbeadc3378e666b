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
