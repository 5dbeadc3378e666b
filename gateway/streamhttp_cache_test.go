package gateway_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

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

// TestStreamHTTP_CachedPageEndsWithTheStream: a page cut short by the
// chunk limit may be cached (max-age=60), but not past the stream's life
// (PROTOCOL.md §5.5: catch-up Cache-Control is derived from the TTL and
// expiry): a cache would serve it after the stream expired. A sliding TTL
// runs again from the read, so the stream lives at least that long.
func TestStreamHTTP_CachedPageEndsWithTheStream(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{})
	text := func(kv ...string) http.Header { return hdr(append([]string{"Content-Type", "text/plain"}, kv...)...) }
	big := strings.Repeat("x", 700<<10) // two do not fit in one page
	exp := s.clock.Now().Add(30*time.Second + 500*time.Millisecond).UTC().Format(time.RFC3339Nano)
	for _, tc := range []struct {
		name   string
		create http.Header
		want   string
	}{
		{"ttl", text("Stream-TTL", "5"), "public, max-age=5"},
		{"ttl90", text("Stream-TTL", "90"), "public, max-age=60, stale-while-revalidate=30"},
		{"expires", text("Stream-Expires-At", exp), "public, max-age=30"},
		{"forever", text(), "public, max-age=60, stale-while-revalidate=300"},
	} {
		p := "/v1/stream/life-" + tc.name
		s.do(t, "PUT", p, tc.create, "").want(t, 201)
		s.do(t, "POST", p, text(), big).want(t, 204)
		s.do(t, "POST", p, text(), big).want(t, 204)
		s.do(t, "GET", p+"?offset="+zeroOffset, nil, "").want(t, 200).wantBody(t, big).
			wantHeader(t, "Stream-Up-To-Date", "").
			wantHeader(t, "Cache-Control", tc.want)
	}
	// One that has less than a second left is not cached.
	p := "/v1/stream/life-ending"
	s.do(t, "PUT", p, text("Stream-Expires-At", s.clock.Now().Add(10*time.Second).UTC().Format(time.RFC3339Nano)), "").want(t, 201)
	s.do(t, "POST", p, text(), big).want(t, 204)
	s.do(t, "POST", p, text(), big).want(t, 204)
	s.clock.Advance(9*time.Second + 500*time.Millisecond)
	s.do(t, "GET", p+"?offset="+zeroOffset, nil, "").want(t, 200).wantHeader(t, "Cache-Control", "no-cache")
}

// TestStreamHTTP_ReadErrorsAreNotCached: a read's 404 is heuristically
// cacheable (RFC 9110 §15.1), and caches do keep 404s for minutes by
// default; the stream made next (a reader often asks before its writer
// has made it) would stay hidden behind the cached 404. A read's errors
// say no-store, and carry no header of the answer they replace.
func TestStreamHTTP_ReadErrorsAreNotCached(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{})
	const p = "/v1/stream/notyet"
	for _, q := range []string{"", "?offset=now", "?offset=-1&live=long-poll", "?offset=-1&live=sse"} {
		s.do(t, "GET", p+q, nil, "").want(t, 404).wantHeader(t, "Cache-Control", "no-store")
	}
	s.do(t, "HEAD", p, nil, "").want(t, 404).wantHeader(t, "Cache-Control", "no-store")
	tail := s.do(t, "PUT", p, hdr("Content-Type", "text/plain"), "here").want(t, 201).header.Get("Stream-Next-Offset")
	s.do(t, "GET", p, nil, "").want(t, 200).wantBody(t, "here")
	s.do(t, "GET", p+"?offset=bad", nil, "").want(t, 400).wantHeader(t, "Cache-Control", "no-store")

	// A long-poll whose stream is deleted while it waits: a 404 like any
	// other, without the Stream-Cursor its wait had set.
	done := make(chan reply, 1)
	go func() {
		for {
			r, err := s.try("GET", p+"?offset="+tail+"&live=long-poll", nil, "")
			if err != nil || r.status != 204 { // 204: timed out before the delete
				done <- r
				return
			}
		}
	}()
	s.do(t, "DELETE", p, nil, "").want(t, 204)
	(<-done).want(t, 404).wantHeader(t, "Cache-Control", "no-store").wantHeader(t, "Stream-Cursor", "")
}
