package gateway_test

import (
	"strings"
	"testing"

	"github.com/syncgate/syncgate/gateway"
)

// TestStreamHTTP_StartPageIsRevalidated: a page read from the start
// (offset -1, or none) is not cacheable without revalidation, even when
// the chunk limit cuts it short: retention moves the start, and the same
// URL then returns other records. A cache that kept the old page (60 s,
// and 300 s more while it revalidates) would send its readers to an
// offset retention removed, and back to the stale page on their retry
// from the start. A page from an explicit offset never changes, and
// stays cacheable. (TestStreamHTTP_PrunedReadSaysWhereToRead shows the
// start moving.)
func TestStreamHTTP_StartPageIsRevalidated(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{})
	const p = "/v1/stream/startpage"
	text := hdr("Content-Type", "text/plain")
	big := func(c string) string { return strings.Repeat(c, 700<<10) } // two do not fit in one page
	s.do(t, "PUT", p, text, "").want(t, 201)
	s.do(t, "POST", p, text, big("a")).want(t, 204)
	s.do(t, "POST", p, text, big("b")).want(t, 204)

	for _, q := range []string{"?offset=-1", ""} {
		r := s.do(t, "GET", p+q, nil, "").want(t, 200).wantBody(t, big("a")).wantHeader(t, "Stream-Up-To-Date", "")
		if cc := r.header.Get("Cache-Control"); !strings.Contains(cc, "no-cache") && !strings.Contains(cc, "no-store") {
			t.Fatalf("GET %s: Cache-Control %q on a page from the start, which retention may change", q, cc)
		}
	}
	// A page from an explicit offset is still cacheable.
	r := s.do(t, "GET", p+"?offset="+zeroOffset, nil, "").want(t, 200).wantBody(t, big("a"))
	if cc := r.header.Get("Cache-Control"); cc != "public, max-age=60, stale-while-revalidate=300" {
		t.Fatalf("Cache-Control %q on a page cut short from an explicit offset", cc)
	}
}
