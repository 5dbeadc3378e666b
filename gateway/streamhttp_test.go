package gateway_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/syncgate/syncgate/auth"
	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/storage"
)

// fakeClock is a settable clock for the stream log, so TTL tests need no
// waiting.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// streamServer is a gateway serving the stream API over a real storage.DB
// in a temporary directory, on a loopback httptest server.
type streamServer struct {
	base   string // http://127.0.0.1:port
	client *http.Client
	gw     *gateway.Server
	clock  *fakeClock // the log's clock (real time unless a test advances it)
}

func newStreamServer(t testing.TB, cfg gateway.Config) *streamServer {
	t.Helper()
	return newStreamServerWith(t, cfg, nil)
}

// newStreamServerWith is newStreamServer with the log's options changed
// by opt (when not nil).
func newStreamServerWith(t testing.TB, cfg gateway.Config, opt func(*storage.Options)) *streamServer {
	t.Helper()
	clock := &fakeClock{t: time.Now()}
	opts := &storage.Options{NoSync: true, Now: clock.Now, MaxAppendBytes: cfg.MaxAppendBytes}
	if opt != nil {
		opt(opts)
	}
	db, err := storage.Open(filepath.Join(t.TempDir(), "streams.db"), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	cfg.Log = db
	if cfg.LongPollTimeout == 0 {
		cfg.LongPollTimeout = 200 * time.Millisecond
	}
	if cfg.Now == nil {
		cfg.Now = clock.Now
	}
	gw, err := gateway.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(gw.Handler())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := gw.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		ts.Close()
	})
	return &streamServer{base: ts.URL, client: ts.Client(), gw: gw, clock: clock}
}

// reply is a finished response.
type reply struct {
	status int
	header http.Header
	body   string
}

// hdr builds headers from name, value pairs.
func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

// do sends a request for path (relative to the server) and reads the
// whole response.
func (s *streamServer) do(t testing.TB, method, path string, h http.Header, body string) reply {
	t.Helper()
	r, err := s.try(method, path, h, body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return r
}

// try is do for any goroutine: it returns the error.
func (s *streamServer) try(method, path string, h http.Header, body string) (reply, error) {
	req, err := http.NewRequest(method, s.base+path, strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	for k, v := range h {
		req.Header[k] = v
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, string(b)}, err
}

// want fails the test unless r has status.
func (r reply) want(t testing.TB, status int) reply {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d (body %q)", r.status, status, r.body)
	}
	return r
}

// wantHeader fails the test unless header k of r is v ("" for absent).
func (r reply) wantHeader(t testing.TB, k, v string) reply {
	t.Helper()
	if got := r.header.Get(k); got != v {
		t.Fatalf("%s: %q, want %q", k, got, v)
	}
	return r
}

func (r reply) wantBody(t testing.TB, body string) reply {
	t.Helper()
	if r.body != body {
		t.Fatalf("body %q, want %q", r.body, body)
	}
	return r
}

const zeroOffset = storage.ZeroOffset

func TestStreamHTTP_CreateAppendRead(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{})
	const p = "/v1/stream/basic"

	r := s.do(t, "PUT", p, hdr("Content-Type", "text/plain"), "").want(t, 201).
		wantHeader(t, "Content-Type", "text/plain").
		wantHeader(t, "Stream-Next-Offset", zeroOffset).
		wantHeader(t, "Location", s.base+p)
	s.do(t, "PUT", p, hdr("Content-Type", "TEXT/PLAIN; charset=utf-8"), "").want(t, 200)
	s.do(t, "PUT", p, hdr("Content-Type", "application/json"), "").want(t, 409)

	var offsets []string
	for _, chunk := range []string{"chunk1", "chunk2", "chunk3"} {
		r = s.do(t, "POST", p, hdr("Content-Type", "text/plain"), chunk).want(t, 204)
		off := r.header.Get("Stream-Next-Offset")
		if len(offsets) > 0 && off <= offsets[len(offsets)-1] {
			t.Fatalf("offset %q after %q", off, offsets[len(offsets)-1])
		}
		offsets = append(offsets, off)
	}
	r = s.do(t, "GET", p, nil, "").want(t, 200).wantBody(t, "chunk1chunk2chunk3").
		wantHeader(t, "Content-Type", "text/plain").
		wantHeader(t, "Stream-Up-To-Date", "true").
		wantHeader(t, "Stream-Next-Offset", offsets[2])
	if r.header.Get("ETag") == "" {
		t.Fatal("no ETag")
	}
	s.do(t, "GET", p+"?offset=-1", nil, "").want(t, 200).wantBody(t, "chunk1chunk2chunk3")
	s.do(t, "GET", p+"?offset="+offsets[0], nil, "").want(t, 200).wantBody(t, "chunk2chunk3")
	s.do(t, "GET", p+"?offset="+offsets[2]+"&unknown=1", nil, "").want(t, 200).wantBody(t, "").
		wantHeader(t, "Stream-Up-To-Date", "true")

	s.do(t, "HEAD", p, nil, "").want(t, 200).wantBody(t, "").
		wantHeader(t, "Content-Type", "text/plain").
		wantHeader(t, "Stream-Next-Offset", offsets[2]).
		wantHeader(t, "Cache-Control", "no-store").
		wantHeader(t, "Stream-Closed", "")

	s.do(t, "DELETE", p, nil, "").want(t, 204)
	s.do(t, "GET", p, nil, "").want(t, 404)
	s.do(t, "DELETE", p, nil, "").want(t, 404)
	s.do(t, "PUT", p, hdr("Content-Type", "text/plain"), "fresh").want(t, 201)
	s.do(t, "GET", p, nil, "").want(t, 200).wantBody(t, "fresh")
}

func TestStreamHTTP_Headers(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{AllowedOrigins: []string{"http://example.com"}})
	check := func(r reply) {
		t.Helper()
		r.wantHeader(t, "X-Content-Type-Options", "nosniff").
			wantHeader(t, "Cross-Origin-Resource-Policy", "cross-origin").
			wantHeader(t, "Access-Control-Allow-Origin", "*").
			wantHeader(t, "Vary", "Origin")
		if !strings.Contains(r.header.Get("Access-Control-Expose-Headers"), "Stream-Next-Offset") {
			t.Fatalf("Access-Control-Expose-Headers %q", r.header.Get("Access-Control-Expose-Headers"))
		}
	}
	check(s.do(t, "GET", "/v1/stream/missing", nil, "").want(t, 404))
	check(s.do(t, "PUT", "/v1/stream/h", nil, "").want(t, 201).wantHeader(t, "Content-Type", "application/octet-stream"))
	check(s.do(t, "POST", "/v1/stream/h", hdr("Content-Type", "application/octet-stream"), "x").want(t, 204))
	check(s.do(t, "HEAD", "/v1/stream/h", nil, "").want(t, 200))
	check(s.do(t, "GET", "/v1/stream/h?offset=-1&live=long-poll", nil, "").want(t, 200))
	r := s.do(t, "OPTIONS", "/v1/stream/h", hdr("Origin", "http://example.com",
		"Access-Control-Request-Method", "GET", "Access-Control-Request-Headers", "if-none-match"), "").want(t, 204)
	check(r)
	if !strings.Contains(strings.ToLower(r.header.Get("Access-Control-Allow-Headers")), "if-none-match") {
		t.Fatalf("Access-Control-Allow-Headers %q", r.header.Get("Access-Control-Allow-Headers"))
	}
	check(s.do(t, "PATCH", "/v1/stream/h", nil, "").want(t, 405))
}

// TestStreamHTTP_OriginWithoutTokens: without token keys, a request from
// a page of a foreign origin (a preflight too) is refused 403 and changes
// nothing; no Origin (curl, a backend), the same host, or an allowlisted
// origin pass. With token keys the token decides, whatever the origin.
func TestStreamHTTP_OriginWithoutTokens(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{AllowedOrigins: []string{"https://app.example"}})
	const p = "/v1/stream/o"
	s.do(t, "PUT", p, hdr("Content-Type", "text/plain"), "a").want(t, 201)
	evil := func(kv ...string) http.Header {
		return hdr(append([]string{"Origin", "http://evil.example"}, kv...)...)
	}
	s.do(t, "POST", p, evil("Content-Type", "text/plain"), "evil").want(t, 403)
	s.do(t, "DELETE", p, evil(), "").want(t, 403)
	s.do(t, "GET", p, evil(), "").want(t, 403)
	s.do(t, "OPTIONS", p, evil("Access-Control-Request-Method", "DELETE"), "").want(t, 403)
	s.do(t, "POST", p, hdr("Origin", "null", "Content-Type", "text/plain"), "evil").want(t, 403)
	s.do(t, "POST", p, hdr("Origin", "https://app.example", "Content-Type", "text/plain"), "b").want(t, 204)
	s.do(t, "POST", p, hdr("Origin", s.base, "Content-Type", "text/plain"), "c").want(t, 204)
	s.do(t, "GET", p, nil, "").want(t, 200).wantBody(t, "abc")

	v, err := auth.New(auth.Config{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	ts := newStreamServer(t, gateway.Config{Verifier: v})
	tok := sign(t, jwt.SigningMethodHS256, testSecret, auth.Claims{
		RegisteredClaims: jwt.RegisteredClaims{Subject: "u", ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour))},
		Topics:           auth.TopicClaims{Subscribe: []string{"**"}, Manage: []string{"**"}}})
	ts.do(t, "PUT", p, evil("Authorization", "Bearer "+tok), "").want(t, 201)
	ts.do(t, "GET", p, evil(), "").want(t, 401)
}

// TestStreamHTTP_ErrorTexts: error bodies say what is wrong once, and
// what to do that can succeed.
func TestStreamHTTP_ErrorTexts(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{})
	text := hdr("Content-Type", "text/plain")
	s.do(t, "PUT", "/v1/stream/src", text, "abc").want(t, 201)
	beyond := storage.FormatOffset(99)
	r := s.do(t, "GET", "/v1/stream/src?offset="+beyond, nil, "").want(t, 400)
	if strings.Count(r.body, "bad request") != 1 || !strings.Contains(r.body, "Stream-Next-Offset") {
		t.Fatalf("offset beyond the tail: %q", r.body)
	}
	s.do(t, "PUT", "/v1/stream/fork", hdr("Content-Type", "text/plain", "Stream-Forked-From", "/v1/stream/src"), "").want(t, 201)
	s.do(t, "DELETE", "/v1/stream/src", nil, "").want(t, 204)
	if r := s.do(t, "PUT", "/v1/stream/src", text, "").want(t, 409); !strings.Contains(r.body, "use another name") || strings.Contains(r.body, "PUT the same headers") {
		t.Fatalf("PUT on a deleted stream its fork still reads: %q", r.body)
	}
}

func TestStreamHTTP_ETag(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{})
	const p = "/v1/stream/etag"
	s.do(t, "PUT", p, hdr("Content-Type", "text/plain"), "a").want(t, 201)
	etag := s.do(t, "GET", p, nil, "").want(t, 200).header.Get("ETag")
	s.do(t, "GET", p, hdr("If-None-Match", etag), "").want(t, 304).wantBody(t, "")
	s.do(t, "GET", p, hdr("If-None-Match", `"other"`), "").want(t, 200).wantBody(t, "a")
	s.do(t, "POST", p, hdr("Content-Type", "text/plain"), "b").want(t, 204)
	etag2 := s.do(t, "GET", p, hdr("If-None-Match", etag), "").want(t, 200).wantBody(t, "ab").header.Get("ETag")
	s.do(t, "POST", p, hdr("Stream-Closed", "true"), "").want(t, 204)
	if etag3 := s.do(t, "GET", p, nil, "").want(t, 200).header.Get("ETag"); etag3 == etag2 {
		t.Fatal("ETag did not change when the stream closed")
	}
	// A stream deleted and created again with equal offsets: a new tag.
	s.do(t, "DELETE", p, nil, "").want(t, 204)
	s.do(t, "PUT", p, hdr("Content-Type", "text/plain"), "z").want(t, 201)
	s.do(t, "GET", p, hdr("If-None-Match", etag), "").want(t, 200).wantBody(t, "z")
	// ... even with the same records, in another type: a 304 would keep
	// a cache's old Content-Type (the tag held offsets and body only).
	z := s.do(t, "GET", p, nil, "").want(t, 200).header.Get("ETag")
	s.do(t, "DELETE", p, nil, "").want(t, 204)
	s.do(t, "PUT", p, hdr("Content-Type", "application/octet-stream"), "z").want(t, 201)
	s.do(t, "GET", p, hdr("If-None-Match", z), "").want(t, 200).wantBody(t, "z").
		wantHeader(t, "Content-Type", "application/octet-stream")
}

// TestStreamHTTP_LongPollETag: a long-poll 200 carries the ETag a
// catch-up read of the same range does (PROTOCOL.md §5.6: its headers are
// a catch-up's; §8.1: every GET response but offset=now's has one).
func TestStreamHTTP_LongPollETag(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{})
	const p = "/v1/stream/lpetag"
	s.do(t, "PUT", p, hdr("Content-Type", "text/plain"), "a").want(t, 201)
	etag := s.do(t, "GET", p+"?offset=-1&live=long-poll", nil, "").want(t, 200).wantBody(t, "a").header.Get("ETag")
	if etag == "" {
		t.Fatal("no ETag on a long-poll 200")
	}
	s.do(t, "GET", p+"?offset=-1", nil, "").want(t, 200).wantHeader(t, "ETag", etag)
	s.do(t, "GET", p+"?offset=-1", hdr("If-None-Match", etag), "").want(t, 304)
}

func TestStreamHTTP_OffsetNow(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{})
	s.do(t, "PUT", "/v1/stream/now", hdr("Content-Type", "application/json"), `[{"a":1}]`).want(t, 201)
	tail := s.do(t, "GET", "/v1/stream/now", nil, "").want(t, 200).wantBody(t, `[{"a":1}]`).header.Get("Stream-Next-Offset")
	r := s.do(t, "GET", "/v1/stream/now?offset=now", nil, "").want(t, 200).wantBody(t, "[]").
		wantHeader(t, "Stream-Next-Offset", tail).
		wantHeader(t, "Stream-Up-To-Date", "true").
		wantHeader(t, "Cache-Control", "no-store")
	if r.header.Get("ETag") != "" {
		t.Fatal("ETag on offset=now")
	}
	s.do(t, "POST", "/v1/stream/now", hdr("Content-Type", "application/json"), `{"b":2}`).want(t, 204)
	s.do(t, "GET", "/v1/stream/now?offset="+tail, nil, "").want(t, 200).wantBody(t, `[{"b":2}]`)
	s.do(t, "GET", "/v1/stream/nothing?offset=now", nil, "").want(t, 404)
	s.do(t, "GET", "/v1/stream/nothing?offset=now&live=long-poll", nil, "").want(t, 404)
	s.do(t, "GET", "/v1/stream/nothing?offset=now&live=sse", nil, "").want(t, 404)
}

func TestStreamHTTP_JSONMode(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{})
	const p = "/v1/stream/json"
	ct := hdr("Content-Type", "application/json; charset=utf-8")
	s.do(t, "PUT", p, ct, "[]").want(t, 201).wantHeader(t, "Stream-Next-Offset", zeroOffset)
	s.do(t, "GET", p, nil, "").want(t, 200).wantBody(t, "[]")
	s.do(t, "POST", p, ct, `[{"id":1}, {"id":2}]`).want(t, 204)
	s.do(t, "POST", p, ct, ` [[1, 2], [3]] `).want(t, 204)
	s.do(t, "POST", p, ct, `"s"`).want(t, 204)
	s.do(t, "POST", p, ct, `[]`).want(t, 400)
	s.do(t, "POST", p, ct, `{"x":`).want(t, 400)
	s.do(t, "GET", p, nil, "").want(t, 200).
		wantHeader(t, "Content-Type", "application/json; charset=utf-8").
		wantBody(t, `[{"id":1},{"id":2},[1,2],[3],"s"]`)
}

func TestStreamHTTP_StreamSeq(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{})
	const p = "/v1/stream/seq"
	s.do(t, "PUT", p, hdr("Content-Type", "text/plain"), "").want(t, 201)
	for _, c := range []struct {
		seq    string
		status int
	}{{"09", 204}, {"10", 204}, {"2", 204}, {"10", 409}, {"2", 409}, {"a", 204}, {"B", 409}} {
		s.do(t, "POST", p, hdr("Content-Type", "text/plain", "stream-seq", c.seq), c.seq).want(t, c.status)
	}
	s.do(t, "GET", p, nil, "").want(t, 200).wantBody(t, "09102a")
}

func TestStreamHTTP_Producer(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{})
	const p = "/v1/stream/prod"
	s.do(t, "PUT", p, hdr("Content-Type", "text/plain"), "").want(t, 201)
	post := func(id, epoch, seq, body string) reply {
		return s.do(t, "POST", p, hdr("Content-Type", "text/plain", "Producer-Id", id, "Producer-Epoch", epoch, "Producer-Seq", seq), body)
	}
	post("A", "0", "0", "a0").want(t, 200).wantHeader(t, "Producer-Epoch", "0").wantHeader(t, "Producer-Seq", "0")
	post("B", "0", "0", "b0").want(t, 200)
	post("A", "0", "1", "a1").want(t, 200).wantHeader(t, "Producer-Seq", "1")
	post("A", "0", "0", "dup").want(t, 204).wantHeader(t, "Producer-Seq", "1")
	post("A", "0", "3", "gap").want(t, 409).wantHeader(t, "Producer-Expected-Seq", "2").wantHeader(t, "Producer-Received-Seq", "3")
	post("A", "1", "1", "x").want(t, 400)
	post("A", "1", "0", "a10").want(t, 200).wantHeader(t, "Producer-Epoch", "1")
	post("A", "0", "2", "zombie").want(t, 403).wantHeader(t, "Producer-Epoch", "1")
	s.do(t, "GET", p, nil, "").want(t, 200).wantBody(t, "a0b0a1a10")
}

// TestStreamHTTP_ProducerBound: past the log's producer bound the least
// recently used producer is forgotten, and its next request is answered
// as an expired producer's: a new producer that must start at seq 0.
func TestStreamHTTP_ProducerBound(t *testing.T) {
	t.Parallel()
	s := newStreamServerWith(t, gateway.Config{}, func(o *storage.Options) { o.MaxProducersPerStream = 2 })
	const p = "/v1/stream/bound"
	s.do(t, "PUT", p, hdr("Content-Type", "text/plain"), "").want(t, 201)
	post := func(id, seq, body string) reply {
		s.clock.Advance(time.Second)
		return s.do(t, "POST", p, hdr("Content-Type", "text/plain", "Producer-Id", id, "Producer-Epoch", "0", "Producer-Seq", seq), body)
	}
	post("A", "0", "a0").want(t, 200)
	post("B", "0", "b0").want(t, 200)
	post("C", "0", "c0").want(t, 200) // three states: A, the least recently used, goes
	post("B", "0", "dup").want(t, 204)
	post("A", "1", "a1").want(t, 409).wantHeader(t, "Producer-Expected-Seq", "0").wantHeader(t, "Producer-Received-Seq", "1")
	post("A", "0", "again").want(t, 200).wantHeader(t, "Producer-Seq", "0")
	s.do(t, "GET", p, nil, "").want(t, 200).wantBody(t, "a0b0c0again")
}

func TestStreamHTTP_Close(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{})
	const p = "/v1/stream/closing"
	s.do(t, "PUT", p, hdr("Content-Type", "text/plain"), "data").want(t, 201)
	tail := s.do(t, "POST", p, hdr("Stream-Closed", "TRUE"), "").want(t, 204).wantHeader(t, "Stream-Closed", "true").header.Get("Stream-Next-Offset")
	s.do(t, "POST", p, hdr("Stream-Closed", "true", "Content-Type", "application/json"), "").want(t, 204).wantHeader(t, "Stream-Next-Offset", tail)
	s.do(t, "POST", p, hdr("Content-Type", "text/plain"), "more").want(t, 409).
		wantHeader(t, "Stream-Closed", "true").wantHeader(t, "Stream-Next-Offset", tail)
	s.do(t, "HEAD", p, nil, "").want(t, 200).wantHeader(t, "Stream-Closed", "true")
	s.do(t, "GET", p, nil, "").want(t, 200).wantBody(t, "data").
		wantHeader(t, "Stream-Closed", "true").wantHeader(t, "Stream-Up-To-Date", "true")
	s.do(t, "GET", p+"?offset="+tail, nil, "").want(t, 200).wantBody(t, "").wantHeader(t, "Stream-Closed", "true")
	// A long-poll at the end of a closed stream returns at once.
	s.do(t, "GET", p+"?offset="+tail+"&live=long-poll", nil, "").want(t, 204).
		wantHeader(t, "Stream-Closed", "true").wantHeader(t, "Stream-Up-To-Date", "true").wantHeader(t, "Stream-Next-Offset", tail)

	// Append-and-close, created closed.
	s.do(t, "PUT", "/v1/stream/closed2", hdr("Content-Type", "text/plain", "Stream-Closed", "true"), "final").want(t, 201).wantHeader(t, "Stream-Closed", "true")
	s.do(t, "PUT", "/v1/stream/closed2", hdr("Content-Type", "text/plain"), "").want(t, 409)
	s.do(t, "PUT", "/v1/stream/c3", hdr("Content-Type", "text/plain"), "").want(t, 201)
	s.do(t, "POST", "/v1/stream/c3", hdr("Content-Type", "text/plain", "Stream-Closed", "true"), "last").want(t, 204).wantHeader(t, "Stream-Closed", "true")
	s.do(t, "GET", "/v1/stream/c3", nil, "").want(t, 200).wantBody(t, "last").wantHeader(t, "Stream-Closed", "true")
}

func TestStreamHTTP_LongPoll(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{LongPollTimeout: 100 * time.Millisecond})
	const p = "/v1/stream/lp"
	tail := s.do(t, "PUT", p, hdr("Content-Type", "text/plain"), "old").want(t, 201).header.Get("Stream-Next-Offset")

	r := s.do(t, "GET", p+"?offset=now&live=long-poll", nil, "").want(t, 204).
		wantHeader(t, "Stream-Next-Offset", tail).wantHeader(t, "Stream-Up-To-Date", "true")
	cursor := r.header.Get("Stream-Cursor")
	c, err := strconv.ParseInt(cursor, 10, 64)
	if err != nil {
		t.Fatalf("Stream-Cursor %q", cursor)
	}
	r = s.do(t, "GET", p+"?offset=-1&live=long-poll&cursor="+cursor, nil, "").want(t, 200).wantBody(t, "old").wantHeader(t, "Stream-Up-To-Date", "true")
	if c2, _ := strconv.ParseInt(r.header.Get("Stream-Cursor"), 10, 64); c2 <= c {
		t.Fatalf("echoed cursor %d, got %d: want a larger one", c, c2)
	}

	// A waiting long-poll gets what is appended (whether the append lands
	// before or during its wait).
	done := make(chan reply, 1)
	go func() {
		for {
			r, err := s.try("GET", p+"?offset="+tail+"&live=long-poll", nil, "")
			if err != nil || r.status != 204 { // 204: timed out before the append
				done <- r
				return
			}
		}
	}()
	s.do(t, "POST", p, hdr("Content-Type", "text/plain"), "new").want(t, 204)
	(<-done).want(t, 200).wantBody(t, "new").wantHeader(t, "Stream-Up-To-Date", "true")
}

// TestStreamHTTP_LongPollTimeoutAtItsLimit: a long-poll timeout as long
// as a time.Duration holds still answers: its write deadline (the wait
// plus WriteTimeout) overflowed into the past, and the answer was never
// written.
func TestStreamHTTP_LongPollTimeoutAtItsLimit(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{LongPollTimeout: math.MaxInt64})
	const p = "/v1/stream/lpmax"
	tail := s.do(t, "PUT", p, hdr("Content-Type", "text/plain"), "old").want(t, 201).header.Get("Stream-Next-Offset")
	done := make(chan error, 1)
	var got reply
	go func() {
		var err error
		got, err = s.try("GET", p+"?offset="+tail+"&live=long-poll", nil, "")
		done <- err
	}()
	s.do(t, "POST", p, hdr("Content-Type", "text/plain"), "new").want(t, 204)
	if err := <-done; err != nil {
		t.Fatalf("long-poll: %v", err)
	}
	got.want(t, 200).wantBody(t, "new")
}

// sseEvent is one parsed SSE event.
type sseEvent struct {
	name string
	data string // data lines joined by "\n"
}

// readSSE reads events from body until stop returns true or the body ends.
func readSSE(t *testing.T, body io.Reader, stop func([]sseEvent) bool) []sseEvent {
	t.Helper()
	var (
		events []sseEvent
		cur    sseEvent
		lines  []string
	)
	sc := bufio.NewScanner(body)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			cur.data = strings.Join(lines, "\n")
			events = append(events, cur)
			cur, lines = sseEvent{}, nil
			if stop(events) {
				return events
			}
		case strings.HasPrefix(line, "event: "):
			cur.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data:"):
			lines = append(lines, strings.TrimPrefix(line, "data:"))
		default:
			t.Fatalf("unexpected SSE line %q", line)
		}
	}
	return events
}

// openSSE starts an SSE read of path.
func (s *streamServer) openSSE(t *testing.T, path string) *http.Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", s.base+path, nil)
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("SSE: status %d, Content-Type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	return resp
}

func control(t *testing.T, e sseEvent) map[string]any {
	t.Helper()
	if e.name != "control" {
		t.Fatalf("event %q, want control", e.name)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(e.data), &m); err != nil {
		t.Fatalf("control %q: %v", e.data, err)
	}
	return m
}

func TestStreamHTTP_SSE(t *testing.T) {
	t.Parallel()
	// No keep-alive events: the tests count events.
	s := newStreamServer(t, gateway.Config{LongPollTimeout: time.Minute})
	untilControl := func(n int) func([]sseEvent) bool {
		return func(evs []sseEvent) bool {
			c := 0
			for _, e := range evs {
				if e.name == "control" {
					c++
				}
			}
			return c >= n
		}
	}

	t.Run("text", func(t *testing.T) {
		s.do(t, "PUT", "/v1/stream/sse-text", hdr("Content-Type", "text/plain"), "a\r\nb\rc\n\nevent: control\ndata:{}").want(t, 201)
		resp := s.openSSE(t, "/v1/stream/sse-text?offset=-1&live=sse")
		if resp.Header.Get("Stream-SSE-Data-Encoding") != "" || !strings.Contains(resp.Header.Get("Cache-Control"), "no-cache") {
			t.Fatalf("headers %v", resp.Header)
		}
		evs := readSSE(t, resp.Body, untilControl(1))
		if len(evs) != 2 || evs[0].name != "data" || evs[0].data != "a\nb\nc\n\nevent: control\ndata:{}" {
			t.Fatalf("events %q", evs)
		}
		if m := control(t, evs[1]); m["upToDate"] != true || m["streamCursor"] == nil {
			t.Fatalf("control %v", m)
		}
	})
	t.Run("json", func(t *testing.T) {
		s.do(t, "PUT", "/v1/stream/sse-json", hdr("Content-Type", "application/json"), `[{"id":1},{"id":2}]`).want(t, 201)
		evs := readSSE(t, s.openSSE(t, "/v1/stream/sse-json?offset=-1&live=sse").Body, untilControl(1))
		if len(evs) != 2 || evs[0].data != `[{"id":1},{"id":2}]` {
			t.Fatalf("events %q", evs)
		}
	})
	t.Run("binary", func(t *testing.T) {
		data := string([]byte{0, 10, 13, 0xff, 0xfe})
		s.do(t, "PUT", "/v1/stream/sse-bin", hdr("Content-Type", "application/x-protobuf"), data).want(t, 201)
		resp := s.openSSE(t, "/v1/stream/sse-bin?offset=-1&live=sse")
		if resp.Header.Get("Stream-SSE-Data-Encoding") != "base64" {
			t.Fatalf("headers %v", resp.Header)
		}
		evs := readSSE(t, resp.Body, untilControl(1))
		got, err := base64.StdEncoding.DecodeString(evs[0].data)
		if err != nil || string(got) != data {
			t.Fatalf("events %q", evs)
		}
	})
	t.Run("live append and close", func(t *testing.T) {
		s.do(t, "PUT", "/v1/stream/sse-live", hdr("Content-Type", "text/plain"), "").want(t, 201)
		resp := s.openSSE(t, "/v1/stream/sse-live?offset=now&live=sse")
		sc := bufio.NewReader(resp.Body)
		first := readSSE(t, sc, untilControl(1))
		if m := control(t, first[0]); m["streamNextOffset"] != zeroOffset || m["upToDate"] != true {
			t.Fatalf("first control %v", m)
		}
		s.do(t, "POST", "/v1/stream/sse-live", hdr("Content-Type", "text/plain", "Stream-Closed", "true"), "bye").want(t, 204)
		evs := readSSE(t, sc, func([]sseEvent) bool { return false }) // until the server ends the response
		if len(evs) != 2 || evs[0].name != "data" || evs[0].data != "bye" {
			t.Fatalf("events %q", evs)
		}
		if m := control(t, evs[1]); m["streamClosed"] != true || m["streamCursor"] != nil {
			t.Fatalf("final control %v", m)
		}
	})
	t.Run("errors", func(t *testing.T) {
		s.do(t, "GET", "/v1/stream/sse-text?live=sse", nil, "").want(t, 400)
		s.do(t, "GET", "/v1/stream/sse-missing?offset=-1&live=sse", nil, "").want(t, 404)
	})
}

func TestStreamHTTP_TTL(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{})
	s.do(t, "PUT", "/v1/stream/ttl", hdr("Content-Type", "text/plain", "Stream-TTL", "60"), "").want(t, 201)
	s.do(t, "HEAD", "/v1/stream/ttl", nil, "").want(t, 200).wantHeader(t, "Stream-TTL", "60")
	s.do(t, "PUT", "/v1/stream/ttl", hdr("Content-Type", "text/plain", "Stream-TTL", "60"), "").want(t, 200)
	s.do(t, "PUT", "/v1/stream/ttl", hdr("Content-Type", "text/plain", "Stream-TTL", "61"), "").want(t, 409)
	exp := s.clock.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	s.do(t, "PUT", "/v1/stream/exp", hdr("Content-Type", "text/plain", "Stream-Expires-At", exp), "").want(t, 201)
	s.do(t, "HEAD", "/v1/stream/exp", nil, "").want(t, 200).wantHeader(t, "Stream-Expires-At", exp)

	// Reads renew a sliding TTL; HEAD does not.
	s.clock.Advance(50 * time.Second)
	s.do(t, "GET", "/v1/stream/ttl?offset=now", nil, "").want(t, 200)
	s.clock.Advance(50 * time.Second)
	// HEAD's Stream-TTL is what is left, rounded up.
	s.do(t, "HEAD", "/v1/stream/ttl", nil, "").want(t, 200).wantHeader(t, "Stream-TTL", "10")
	s.clock.Advance(9*time.Second + 500*time.Millisecond)
	s.do(t, "HEAD", "/v1/stream/ttl", nil, "").want(t, 200).wantHeader(t, "Stream-TTL", "1")
	s.clock.Advance(1500 * time.Millisecond)
	s.do(t, "HEAD", "/v1/stream/ttl", nil, "").want(t, 404)
	s.do(t, "POST", "/v1/stream/ttl", hdr("Content-Type", "text/plain"), "x").want(t, 404)
	s.do(t, "PUT", "/v1/stream/ttl", hdr("Content-Type", "application/json"), "").want(t, 201)

	s.clock.Advance(time.Hour)
	s.do(t, "GET", "/v1/stream/exp", nil, "").want(t, 404)
}

// TestStreamHTTP_LiveReadKeepsTTL: a stream with a sliding TTL does not
// expire under a live read that waits on it longer than the TTL: the
// reader gets what is appended after, not a 404, and the stream is still
// there.
func TestStreamHTTP_LiveReadKeepsTTL(t *testing.T) {
	t.Parallel()
	for _, live := range []string{"long-poll", "sse"} {
		t.Run(live, func(t *testing.T) {
			t.Parallel()
			// Neither a long-poll timeout nor an SSE keep-alive within
			// the test: one wait holds the stream throughout.
			s := newStreamServer(t, gateway.Config{LongPollTimeout: 10 * time.Second})
			const p = "/v1/stream/watched"
			tail := s.do(t, "PUT", p, hdr("Content-Type", "text/plain", "Stream-TTL", "60"), "a").want(t, 201).header.Get("Stream-Next-Offset")
			// fullTTL polls HEAD until it shows the whole TTL left.
			fullTTL := func() bool {
				deadline := time.Now().Add(2 * time.Second)
				for s.do(t, "HEAD", p, nil, "").want(t, 200).header.Get("Stream-TTL") != "60" {
					if time.Now().After(deadline) {
						return false
					}
					time.Sleep(time.Millisecond) // polling, not synchronisation
				}
				return true
			}

			s.clock.Advance(30 * time.Second)
			var got func() string // what the reader gets next
			switch live {
			case "long-poll":
				ch := make(chan reply, 1)
				go func() {
					r, err := s.try("GET", p+"?offset="+tail+"&live=long-poll", nil, "")
					if err != nil {
						r.body = err.Error()
					}
					ch <- r
				}()
				got = func() string { return (<-ch).want(t, 200).body }
			case "sse":
				body := bufio.NewReader(s.openSSE(t, p+"?offset="+tail+"&live=sse").Body)
				readSSE(t, body, func(e []sseEvent) bool { return len(e) == 1 }) // the first control event
				got = func() string {
					evs := readSSE(t, body, func(e []sseEvent) bool { return len(e) == 1 })
					if len(evs) != 1 || evs[0].name != "data" {
						t.Fatalf("SSE events %q, want a data event", evs)
					}
					return evs[0].data
				}
			}
			// The reader's read renewed the TTL, 30 s in. Another 30 s
			// on, its wait still holds all of it.
			if !fullTTL() {
				t.Fatal("the live read's read did not renew the TTL")
			}
			s.clock.Advance(30 * time.Second)
			if !fullTTL() {
				t.Error("HEAD: a stream a live read waits on does not keep its whole TTL")
			}
			// Two TTLs after the read, the reader still waits on a live
			// stream, and gets what is appended.
			s.clock.Advance(61 * time.Second)
			s.do(t, "HEAD", p, nil, "").want(t, 200).wantHeader(t, "Stream-TTL", "60")
			s.do(t, "POST", p, hdr("Content-Type", "text/plain"), "b").want(t, 204)
			if b := got(); b != "b" {
				t.Fatalf("the reader got %q, want the append", b)
			}
			s.do(t, "HEAD", p, nil, "").want(t, 200)
		})
	}
}

func TestStreamHTTP_Fork(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{})
	s.do(t, "PUT", "/v1/stream/src", hdr("Content-Type", "text/plain"), "hello").want(t, 201)
	mid := s.do(t, "POST", "/v1/stream/src", hdr("Content-Type", "text/plain"), " world").want(t, 204).header.Get("Stream-Next-Offset")
	_ = mid
	r := s.do(t, "PUT", "/v1/stream/fork", hdr("Stream-Forked-From", "/v1/stream/src"), "").want(t, 201).
		wantHeader(t, "Content-Type", "text/plain")
	if r.header.Get("Stream-Forked-From") != "" {
		t.Fatal("fork headers leak into responses")
	}
	s.do(t, "POST", "/v1/stream/fork", hdr("Content-Type", "text/plain"), "!").want(t, 204)
	s.do(t, "POST", "/v1/stream/src", hdr("Content-Type", "text/plain"), "?").want(t, 204)
	s.do(t, "GET", "/v1/stream/fork", nil, "").want(t, 200).wantBody(t, "hello world!")
	s.do(t, "PUT", "/v1/stream/fork", hdr("Stream-Forked-From", "/v1/stream/src"), "").want(t, 200)

	s.do(t, "PUT", "/v1/stream/sub", hdr("Stream-Forked-From", "/v1/stream/src", "Stream-Fork-Offset", zeroOffset, "Stream-Fork-Sub-Offset", "3"), "XY").want(t, 201)
	s.do(t, "GET", "/v1/stream/sub", nil, "").want(t, 200).wantBody(t, "helXY")
	s.do(t, "PUT", "/v1/stream/sub2", hdr("Stream-Forked-From", "/v1/stream/src", "Stream-Fork-Offset", zeroOffset, "Stream-Fork-Sub-Offset", "6"), "").want(t, 400)
	s.do(t, "PUT", "/v1/stream/far", hdr("Stream-Forked-From", "/v1/stream/src", "Stream-Fork-Offset", "9999999999999999_9999999999999999"), "").want(t, 400)
	s.do(t, "PUT", "/v1/stream/nosrc", hdr("Stream-Forked-From", "/v1/stream/none"), "").want(t, 404)
	// A fork's type, when given, must be its source's; the message says
	// so rather than that the stream exists (it does not).
	if r := s.do(t, "PUT", "/v1/stream/badct", hdr("Content-Type", "application/json", "Stream-Forked-From", "/v1/stream/src"), "").want(t, 409); !strings.Contains(r.body, "source") || strings.Contains(r.body, "exists") {
		t.Fatalf("fork of another type: %q", r.body)
	}

	// A source deleted while it has forks is soft-deleted.
	s.do(t, "DELETE", "/v1/stream/src", nil, "").want(t, 204)
	s.do(t, "HEAD", "/v1/stream/src", nil, "").want(t, 410)
	s.do(t, "PUT", "/v1/stream/src", hdr("Content-Type", "text/plain"), "").want(t, 409)
	s.do(t, "PUT", "/v1/stream/fork2", hdr("Stream-Forked-From", "/v1/stream/src"), "").want(t, 409)
	s.do(t, "GET", "/v1/stream/fork", nil, "").want(t, 200).wantBody(t, "hello world!")
}

// TestStreamHTTP_ForkSourceURL: Stream-Forked-From may be the source's
// absolute URL on this server (as a 201's Location gives it); one naming
// another host is refused 400 and makes nothing. It was taken for the
// stream of the same path here.
func TestStreamHTTP_ForkSourceURL(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{})
	loc := s.do(t, "PUT", "/v1/stream/src", hdr("Content-Type", "text/plain"), "hello").want(t, 201).header.Get("Location")
	s.do(t, "PUT", "/v1/stream/fork", hdr("Stream-Forked-From", loc), "").want(t, 201)
	s.do(t, "GET", "/v1/stream/fork", nil, "").want(t, 200).wantBody(t, "hello")
	r := s.do(t, "PUT", "/v1/stream/elsewhere", hdr("Stream-Forked-From", "http://other.example:8080/v1/stream/src"), "").want(t, 400)
	if !strings.Contains(r.body, "another server") {
		t.Fatalf("fork of another host's stream: %q, want it named", r.body)
	}
	s.do(t, "HEAD", "/v1/stream/elsewhere", nil, "").want(t, 404)
}

// TestStreamHTTP_ForkDepth: a fork of a source already
// storage.MaxForkDepth forks deep is refused 400, with a message that
// names the bound and what to do instead, and creates nothing.
func TestStreamHTTP_ForkDepth(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{})
	const limit = storage.MaxForkDepth
	level := func(n int) string { return "/v1/stream/l" + strconv.Itoa(n) }
	s.do(t, "PUT", level(0), hdr("Content-Type", "text/plain"), "0;").want(t, 201)
	want := "0;"
	for n := 1; n <= limit; n++ {
		s.do(t, "PUT", level(n), hdr("Stream-Forked-From", level(n-1)), strconv.Itoa(n)+";").want(t, 201)
		want += strconv.Itoa(n) + ";"
	}
	s.do(t, "GET", level(limit), nil, "").want(t, 200).wantBody(t, want)

	r := s.do(t, "PUT", "/v1/stream/over", hdr("Stream-Forked-From", level(limit)), "").want(t, 400).
		wantHeader(t, "Content-Type", "text/plain; charset=utf-8")
	for _, part := range []string{"Stream-Forked-From", strconv.Itoa(limit) + " levels deep", "the stream it was forked from", "PUT its data as a new stream"} {
		if !strings.Contains(r.body, part) {
			t.Fatalf("over-deep fork: body %q does not say %q", r.body, part)
		}
	}
	s.do(t, "HEAD", "/v1/stream/over", nil, "").want(t, 404)
	s.do(t, "PUT", "/v1/stream/over", hdr("Stream-Forked-From", level(limit-1)), "").want(t, 201)
}

// TestStreamHTTP_ForkIntoPrunedRecords: a fork whose sub-offset needs
// source records that retention removed is refused 410, naming retention
// and where a fork can start, not as a deleted source.
func TestStreamHTTP_ForkIntoPrunedRecords(t *testing.T) {
	t.Parallel()
	s := newStreamServerWith(t, gateway.Config{}, func(o *storage.Options) {
		o.Retention = storage.Retention{MaxRecords: 2}
		o.MaintenanceInterval = 5 * time.Millisecond
	})
	js := hdr("Content-Type", "application/json")
	if r := s.do(t, "PUT", "/v1/stream/src", js, `[1,2]`); r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	for _, b := range []string{`[3]`, `[4]`, `[5]`} {
		if r := s.do(t, "POST", "/v1/stream/src", js, b); r.status != 204 && r.status != 200 {
			t.Fatalf("append %s: %d %s", b, r.status, r.body)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.do(t, "GET", "/v1/stream/src?offset="+zeroOffset, nil, "").status != 410 {
		if time.Now().After(deadline) {
			t.Fatal("retention never pruned the first records")
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline: maintenance runs on its own ticker
	}
	r := s.do(t, "PUT", "/v1/stream/fork", hdr("Content-Type", "application/json", "Stream-Forked-From", "/v1/stream/src",
		"Stream-Fork-Offset", zeroOffset, "Stream-Fork-Sub-Offset", "1"), "")
	if r.status != 410 || !strings.Contains(r.body, "retains") || strings.Contains(r.body, "deleted") {
		t.Fatalf("fork into pruned records: %d %q; want 410 naming retention", r.status, r.body)
	}
}

// TestStreamHTTP_PrunedReadSaysWhereToRead: a read from an offset whose
// records retention removed gets 410 with a message that names the offset
// to read from instead, as the 410 of a fork into pruned records does. A
// read from the start (offset -1, or none) is served from there: the
// client named no position it had, so it lost nothing.
func TestStreamHTTP_PrunedReadSaysWhereToRead(t *testing.T) {
	t.Parallel()
	s := newStreamServerWith(t, gateway.Config{}, func(o *storage.Options) {
		o.Retention = storage.Retention{MaxRecords: 2}
		o.MaintenanceInterval = 5 * time.Millisecond
	})
	const p = "/v1/stream/pruned"
	js := hdr("Content-Type", "application/json")
	s.do(t, "PUT", p, js, `[1,2]`).want(t, 201)
	for _, b := range []string{`3`, `4`, `5`} {
		s.do(t, "POST", p, js, b).want(t, 204)
	}
	deadline := time.Now().Add(10 * time.Second)
	var r reply
	fromZero := p + "?offset=" + zeroOffset // a Stream-Next-Offset of the empty stream
	for r = s.do(t, "GET", fromZero, nil, ""); r.status != 410; r = s.do(t, "GET", fromZero, nil, "") {
		if time.Now().After(deadline) {
			t.Fatal("retention never pruned the first records")
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline: maintenance runs on its own ticker
	}
	m := regexp.MustCompile(`read from offset ([0-9]{16}_[0-9]{16})`).FindStringSubmatch(r.body)
	if m == nil || m[1] == zeroOffset {
		t.Fatalf("410 %q names no offset to read from", r.body)
	}
	from := m[1]
	// A read from there is served up to the tail, or, if retention has
	// pruned more since (a pass at a time), is another 410 naming it.
	switch r := s.do(t, "GET", p+"?offset="+from, nil, ""); {
	case r.status == 200 && strings.HasSuffix(r.body, "5]"):
	case r.status == 410 && strings.Contains(r.body, "retains"):
	default:
		t.Fatalf("read from %s: %d %q; want 200 up to the tail, or 410 naming retention", from, r.status, r.body)
	}
	// From the start: whatever is kept (a pass at a time, until MaxRecords
	// 2 keeps 4 and 5 for good), never a 410.
	for _, q := range []string{"?offset=-1", "", "?offset=-1&live=long-poll"} {
		for {
			r := s.do(t, "GET", p+q, nil, "")
			if r.status != 200 || !strings.HasSuffix(r.body, "4,5]") || r.header.Get("Stream-Up-To-Date") != "true" {
				t.Fatalf("GET %s: %d %q (up to date %q), want 200 ending with 4,5", q, r.status, r.body, r.header.Get("Stream-Up-To-Date"))
			}
			if r.body == "[4,5]" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("GET %s: %q, never [4,5]", q, r.body)
			}
			time.Sleep(5 * time.Millisecond) // polling with a deadline: maintenance runs on its own ticker
		}
	}
}

func TestStreamHTTP_TooLarge(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{MaxAppendBytes: 1024})
	s.do(t, "PUT", "/v1/stream/big", hdr("Content-Type", "text/plain"), "").want(t, 201)
	s.do(t, "POST", "/v1/stream/big", hdr("Content-Type", "text/plain"), strings.Repeat("x", 1025)).want(t, 413)
	s.do(t, "POST", "/v1/stream/big", hdr("Content-Type", "text/plain"), strings.Repeat("x", 1024)).want(t, 204)

	// A JSON append is bounded in messages too: each costs the log more
	// than its bytes. 65,537 one-byte messages are a 413 that names the
	// bound, and nothing is written.
	j := newStreamServer(t, gateway.Config{})
	j.do(t, "PUT", "/v1/stream/j", hdr("Content-Type", "application/json"), "").want(t, 201)
	r := j.do(t, "POST", "/v1/stream/j", hdr("Content-Type", "application/json"), "["+strings.Repeat("0,", 1<<16)+"0]")
	if r.status != 413 || !strings.Contains(r.body, "65536 messages") {
		t.Fatalf("too many messages: %d %q", r.status, r.body)
	}
	j.do(t, "GET", "/v1/stream/j?offset=-1", nil, "").want(t, 200).wantBody(t, "[]")
}

// TestStreamHTTP_BadInput sends malformed requests: each must get a 4xx
// with a message, and leave the reference streams as they were.
func TestStreamHTTP_BadInput(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{})
	s.do(t, "PUT", "/v1/stream/ref", hdr("Content-Type", "text/plain"), "hello").want(t, 201)
	s.do(t, "PUT", "/v1/stream/refjson", hdr("Content-Type", "application/json"), `[1,2]`).want(t, 201)
	text := hdr("Content-Type", "text/plain")
	prod := func(id, epoch, seq string) http.Header {
		h := hdr("Content-Type", "text/plain")
		for k, v := range map[string]string{"Producer-Id": id, "Producer-Epoch": epoch, "Producer-Seq": seq} {
			if v != "-" {
				h[k] = []string{v}
			}
		}
		return h
	}
	with := func(h http.Header, kv ...string) http.Header {
		h = h.Clone()
		for i := 0; i < len(kv); i += 2 {
			h[http.CanonicalHeaderKey(kv[i])] = []string{kv[i+1]}
		}
		return h
	}
	fork := hdr("Stream-Forked-From", "/v1/stream/ref")
	cases := []struct {
		name, method, path string
		h                  http.Header
		body               string
		status             int
	}{
		{"empty offset", "GET", "/v1/stream/ref?offset=", nil, "", 400},
		{"two offsets", "GET", "/v1/stream/ref?offset=-1&offset=-1", nil, "", 400},
		{"offset comma", "GET", "/v1/stream/ref?offset=0,1", nil, "", 400},
		{"offset space", "GET", "/v1/stream/ref?offset=0%201", nil, "", 400},
		{"offset slash", "GET", "/v1/stream/ref?offset=..%2F..", nil, "", 400},
		{"offset NUL", "GET", "/v1/stream/ref?offset=%00", nil, "", 400},
		{"offset CRLF", "GET", "/v1/stream/ref?offset=%0D%0A", nil, "", 400},
		{"offset short", "GET", "/v1/stream/ref?offset=1_2", nil, "", 400},
		{"offset letters", "GET", "/v1/stream/ref?offset=abc", nil, "", 400},
		{"offset long", "GET", "/v1/stream/ref?offset=" + strings.Repeat("1", 100), nil, "", 400},
		{"malformed query", "GET", "/v1/stream/ref?offset=%zz", nil, "", 400},
		{"long-poll without offset", "GET", "/v1/stream/ref?live=long-poll", nil, "", 400},
		{"sse without offset", "GET", "/v1/stream/ref?live=sse", nil, "", 400},
		{"unknown live", "GET", "/v1/stream/ref?offset=-1&live=ws", nil, "", 400},
		{"empty live", "GET", "/v1/stream/ref?offset=-1&live=", nil, "", 400},
		{"TTL letters", "PUT", "/v1/stream/ref", with(text, "Stream-TTL", "abc"), "", 400},
		{"TTL negative", "PUT", "/v1/stream/ref", with(text, "Stream-TTL", "-1"), "", 400},
		{"TTL leading zero", "PUT", "/v1/stream/ref", with(text, "Stream-TTL", "00060"), "", 400},
		{"TTL plus", "PUT", "/v1/stream/ref", with(text, "Stream-TTL", "+60"), "", 400},
		{"TTL fraction", "PUT", "/v1/stream/ref", with(text, "Stream-TTL", "60.5"), "", 400},
		{"TTL exponent", "PUT", "/v1/stream/ref", with(text, "Stream-TTL", "1e3"), "", 400},
		{"TTL zero", "PUT", "/v1/stream/ref", with(text, "Stream-TTL", "0"), "", 400},
		{"TTL huge", "PUT", "/v1/stream/ref", with(text, "Stream-TTL", "99999999999999999999"), "", 400},
		{"TTL and Expires-At", "PUT", "/v1/stream/ref", with(text, "Stream-TTL", "60", "Stream-Expires-At", "2100-01-01T00:00:00Z"), "", 400},
		{"Expires-At garbage", "PUT", "/v1/stream/ref", with(text, "Stream-Expires-At", "not-a-timestamp"), "", 400},
		{"Expires-At past", "PUT", "/v1/stream/ref", with(text, "Stream-Expires-At", "2000-01-01T00:00:00Z"), "", 400},
		{"Content-Type malformed", "PUT", "/v1/stream/ref", hdr("Content-Type", "text/"), "", 400},
		{"new stream bad TTL", "PUT", "/v1/stream/newbad", with(text, "Stream-TTL", "x"), "data", 400},
		{"new stream bad JSON", "PUT", "/v1/stream/newbad", hdr("Content-Type", "application/json"), "{", 400},
		{"fork offset without source", "PUT", "/v1/stream/newbad", with(text, "Stream-Fork-Offset", zeroOffset), "", 400},
		{"sub-offset without source", "PUT", "/v1/stream/newbad", with(text, "Stream-Fork-Sub-Offset", "0"), "", 400},
		{"sub-offset negative", "PUT", "/v1/stream/newbad", with(fork, "Stream-Fork-Sub-Offset", "-1"), "", 400},
		{"sub-offset letters", "PUT", "/v1/stream/newbad", with(fork, "Stream-Fork-Sub-Offset", "abc"), "", 400},
		{"sub-offset fraction", "PUT", "/v1/stream/newbad", with(fork, "Stream-Fork-Sub-Offset", "1.5"), "", 400},
		{"sub-offset leading zero", "PUT", "/v1/stream/newbad", with(fork, "Stream-Fork-Sub-Offset", "05"), "", 400},
		{"sub-offset plus", "PUT", "/v1/stream/newbad", with(fork, "Stream-Fork-Sub-Offset", "+1"), "", 400},
		{"sub-offset too large", "PUT", "/v1/stream/newbad", with(fork, "Stream-Fork-Offset", zeroOffset, "Stream-Fork-Sub-Offset", "6"), "", 400},
		{"fork offset malformed", "PUT", "/v1/stream/newbad", with(fork, "Stream-Fork-Offset", "0,1"), "", 400},
		{"fork offset beyond tail", "PUT", "/v1/stream/newbad", with(fork, "Stream-Fork-Offset", "9999999999999999_9999999999999999"), "", 400},
		{"fork source not a path", "PUT", "/v1/stream/newbad", hdr("Stream-Forked-From", "ref"), "", 400},
		{"fork source empty", "PUT", "/v1/stream/newbad", hdr("Stream-Forked-From", "/v1/stream/"), "", 400},
		{"empty body", "POST", "/v1/stream/ref", text, "", 400},
		{"no Content-Type", "POST", "/v1/stream/ref", nil, "data", 400},
		{"Content-Type malformed", "POST", "/v1/stream/ref", hdr("Content-Type", "a b"), "data", 400},
		{"Content-Type mismatch", "POST", "/v1/stream/ref", hdr("Content-Type", "application/json"), "1", 409},
		{"empty Stream-Seq", "POST", "/v1/stream/ref", with(text, "Stream-Seq", ""), "data", 400},
		{"producer id only", "POST", "/v1/stream/ref", prod("p", "-", "-"), "data", 400},
		{"producer no seq", "POST", "/v1/stream/ref", prod("p", "0", "-"), "data", 400},
		{"producer empty id", "POST", "/v1/stream/ref", prod("", "0", "0"), "data", 400},
		{"producer epoch 1abc", "POST", "/v1/stream/ref", prod("p", "1abc", "0"), "data", 400},
		{"producer epoch 0xyz", "POST", "/v1/stream/ref", prod("p", "0xyz", "0"), "data", 400},
		{"producer epoch 1e3", "POST", "/v1/stream/ref", prod("p", "1e3", "0"), "data", 400},
		{"producer epoch -1", "POST", "/v1/stream/ref", prod("p", "-1", "0"), "data", 400},
		{"producer epoch 2^53", "POST", "/v1/stream/ref", prod("p", "9007199254740992", "0"), "data", 400},
		{"producer seq -1", "POST", "/v1/stream/ref", prod("p", "0", "-1"), "data", 400},
		{"producer seq +1", "POST", "/v1/stream/ref", prod("p", "0", "+1"), "data", 400},
		{"producer empty body", "POST", "/v1/stream/ref", prod("p", "0", "0"), "", 400},
		{"invalid JSON", "POST", "/v1/stream/refjson", hdr("Content-Type", "application/json"), `{"a":`, 400},
		{"empty JSON array", "POST", "/v1/stream/refjson", hdr("Content-Type", "application/json"), `[]`, 400},
		{"JSON trailing garbage", "POST", "/v1/stream/refjson", hdr("Content-Type", "application/json"), `1 2`, 400},
		{"JSON not UTF-8", "POST", "/v1/stream/refjson", hdr("Content-Type", "application/json"), "\"\xff\"", 400},
		{"reserved name", "GET", "/v1/stream/__ds/jwks.json", nil, "", 404},
		{"reserved name PUT", "PUT", "/v1/stream/__ds/x", text, "", 404},
		{"NUL in name", "PUT", "/v1/stream/a%00b", text, "", 400},
		{"name not UTF-8", "PUT", "/v1/stream/a%ffb", text, "", 400},
		{"name too long", "PUT", "/v1/stream/" + strings.Repeat("n", 1025), text, "", 400},
		{"no name", "PUT", "/v1/stream/", text, "", 400},
		{"method", "PATCH", "/v1/stream/ref", text, "x", 405},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := s.do(t, c.method, c.path, c.h, c.body).want(t, c.status)
			if c.method != "HEAD" && strings.TrimSpace(r.body) == "" {
				t.Fatal("no message in the error body")
			}
			if r.header.Get("X-Content-Type-Options") != "nosniff" {
				t.Fatal("no nosniff on an error")
			}
			s.do(t, "GET", "/v1/stream/ref", nil, "").want(t, 200).wantBody(t, "hello").
				wantHeader(t, "Stream-Next-Offset", storage.FormatOffset(1))
			s.do(t, "HEAD", "/v1/stream/ref", nil, "").want(t, 200).wantHeader(t, "Stream-TTL", "").wantHeader(t, "Content-Type", "text/plain")
			s.do(t, "GET", "/v1/stream/refjson", nil, "").want(t, 200).wantBody(t, "[1,2]")
			s.do(t, "HEAD", "/v1/stream/newbad", nil, "").want(t, 404)
		})
	}
}

// FuzzStreamRequest throws arbitrary methods, names, queries, headers and
// bodies at the stream API: no request may cause a 5xx or a panic, every
// 4xx carries a message, and a reference stream is never changed.
func FuzzStreamRequest(f *testing.F) {
	s := newStreamServer(f, gateway.Config{LongPollTimeout: 10 * time.Millisecond})
	h := s.gw.Handler()
	serve := func(method, target string, hd http.Header, body []byte) *httptest.ResponseRecorder {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond) // ends SSE reads
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, method, target, strings.NewReader(string(body)))
		if err != nil {
			return nil
		}
		req.Header = hd
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	put := serve("PUT", "/v1/stream/ref", hdr("Content-Type", "application/json"), []byte(`[{"a":1},"b"]`))
	if put.Code != 201 {
		f.Fatalf("creating ref: %d", put.Code)
	}
	refTail := put.Header().Get("Stream-Next-Offset")
	serve("PUT", "/v1/stream/tgt", hdr("Content-Type", "text/plain"), []byte("t"))

	methods := []string{"GET", "HEAD", "PUT", "POST", "DELETE", "OPTIONS", "PATCH"}
	f.Add(uint8(0), "ref", "offset=-1&live=sse", "", "", "", "", "", "", "", "", "", "", "", []byte(nil))
	f.Add(uint8(0), "ref", "offset=now&live=long-poll&cursor=5", "", "", "", "", "", "", "", "", "", "", "", []byte(nil))
	f.Add(uint8(3), "tgt", "", "text/plain", "", "", "1", "true", "p", "0", "0", "", "", "", []byte("x"))
	f.Add(uint8(2), "fork", "", "", "10", "", "", "", "", "", "", "/v1/stream/ref", refTail, "1", []byte("[]"))
	f.Add(uint8(2), "j", "", "application/json", "", "2100-01-01T00:00:00Z", "", "TRUE", "", "", "", "", "", "", []byte(`[1,[2]]`))
	f.Add(uint8(3), "ref", "", "application/json", "", "", "", "", "p", "9007199254740991", "1", "", "", "", []byte(`{"x":1}`))
	f.Add(uint8(4), "__ds/x", "", "", "", "", "", "", "", "", "", "", "", "", []byte(nil))
	f.Fuzz(func(t *testing.T, m uint8, name, query, ct, ttl, exp, seq, closed, pid, pepoch, pseq, from, foff, fsub string, body []byte) {
		hd := http.Header{}
		for k, v := range map[string]string{"Content-Type": ct, "Stream-Ttl": ttl, "Stream-Expires-At": exp, "Stream-Seq": seq,
			"Stream-Closed": closed, "Producer-Id": pid, "Producer-Epoch": pepoch, "Producer-Seq": pseq,
			"Stream-Forked-From": from, "Stream-Fork-Offset": foff, "Stream-Fork-Sub-Offset": fsub} {
			if v != "" {
				hd.Set(k, v)
			}
		}
		// Requests aimed at the reference stream may change it legitimately.
		target := "/v1/stream/" + name
		if !strings.Contains(target, "ref") {
			target += "?" + query
			method := methods[int(m)%len(methods)]
			rec := serve(method, target, hd, body)
			if rec != nil {
				if rec.Code >= 500 {
					t.Fatalf("%s %s %v: %d %q", method, target, hd, rec.Code, rec.Body)
				}
				if rec.Code >= 400 && method != "HEAD" && strings.TrimSpace(rec.Body.String()) == "" {
					t.Fatalf("%s %s %v: %d without a message", method, target, hd, rec.Code)
				}
			}
		}
		// Reads of the reference stream, with the fuzzed query, never fail
		// with a 5xx, and its content is unchanged.
		if rec := serve("GET", "/v1/stream/ref?"+query, hd, nil); rec != nil && rec.Code >= 500 {
			t.Fatalf("GET ref?%s: %d %q", query, rec.Code, rec.Body)
		}
		rec := serve("GET", "/v1/stream/ref", http.Header{}, nil)
		if rec.Code != 200 || rec.Body.String() != `[{"a":1},"b"]` || rec.Header().Get("Stream-Next-Offset") != refTail {
			t.Fatalf("ref changed: %d %q %q", rec.Code, rec.Body, rec.Header().Get("Stream-Next-Offset"))
		}
	})
}

var cursorRe = regexp.MustCompile(`^[0-9]+$`)

func TestStreamHTTP_SSECursor(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{})
	s.do(t, "PUT", "/v1/stream/cur", hdr("Content-Type", "text/plain"), "").want(t, 201)
	evs := readSSE(t, s.openSSE(t, "/v1/stream/cur?offset=-1&live=sse").Body, func(e []sseEvent) bool { return len(e) == 1 })
	c1, _ := control(t, evs[0])["streamCursor"].(string)
	if !cursorRe.MatchString(c1) {
		t.Fatalf("streamCursor %q", c1)
	}
	evs = readSSE(t, s.openSSE(t, "/v1/stream/cur?offset=-1&live=sse&cursor="+c1).Body, func(e []sseEvent) bool { return len(e) == 1 })
	c2, _ := control(t, evs[0])["streamCursor"].(string)
	n1, _ := strconv.Atoi(c1)
	if n2, _ := strconv.Atoi(c2); n2 <= n1 {
		t.Fatalf("echoed cursor %s, got %s", c1, c2)
	}
}

// TestStreamHTTP_SSECursorNeverGoesBack: within one SSE response the
// cursors of the control events never decrease, also for a client whose
// cursor is ahead of the clock (each event adds jitter to it): a client
// echoes the last one it saw, and must not go back to a cache key it
// already used (PROTOCOL.md §8.1).
func TestStreamHTTP_SSECursorNeverGoesBack(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{LongPollTimeout: 5 * time.Millisecond})
	s.do(t, "PUT", "/v1/stream/cur", hdr("Content-Type", "text/plain"), "").want(t, 201)
	const ahead = 1 << 40 // far past the current interval
	evs := readSSE(t, s.openSSE(t, "/v1/stream/cur?offset=-1&live=sse&cursor="+strconv.Itoa(ahead)).Body,
		func(e []sseEvent) bool { return len(e) == 20 })
	last := int64(ahead)
	for i, e := range evs {
		c, err := strconv.ParseInt(control(t, e)["streamCursor"].(string), 10, 64)
		if err != nil || c < last || c == ahead {
			t.Fatalf("control event %d: cursor %d after %d (client's %d)", i, c, last, int64(ahead))
		}
		last = c
	}
}

// TestStreamHTTP_CursorDoesNotWrap: a client cursor near the largest
// int64 gets a larger one, or the largest, never a negative one that
// wrapped around.
func TestStreamHTTP_CursorDoesNotWrap(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{LongPollTimeout: time.Millisecond})
	s.do(t, "PUT", "/v1/stream/cur", hdr("Content-Type", "text/plain"), "").want(t, 201)
	const maxInt64 = 1<<63 - 1
	for _, tc := range []struct{ client, want int64 }{{maxInt64 - 1, maxInt64}, {maxInt64, maxInt64}} {
		r := s.do(t, "GET", "/v1/stream/cur?offset=now&live=long-poll&cursor="+strconv.FormatInt(tc.client, 10), nil, "").want(t, 204)
		r.wantHeader(t, "Stream-Cursor", strconv.FormatInt(tc.want, 10))
	}
}

// TestStreamHTTP_ShutdownEndsLiveReads checks that Shutdown ends SSE
// responses and long-polls, so the http.Server's own Shutdown does not
// wait out their lifetime.
func TestStreamHTTP_ShutdownEndsLiveReads(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{LongPollTimeout: time.Minute})
	s.do(t, "PUT", "/v1/stream/live", hdr("Content-Type", "text/plain"), "").want(t, 201)
	body := bufio.NewReader(s.openSSE(t, "/v1/stream/live?offset=now&live=sse").Body)
	readSSE(t, body, func(e []sseEvent) bool { return len(e) == 1 })
	poll := make(chan reply, 1)
	go func() {
		r, _ := s.try("GET", "/v1/stream/live?offset=now&live=long-poll", nil, "")
		poll <- r
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.gw.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if evs := readSSE(t, body, func([]sseEvent) bool { return false }); len(evs) != 0 {
		t.Fatalf("events after shutdown: %q", evs)
	}
	(<-poll).want(t, 204).wantHeader(t, "Stream-Next-Offset", zeroOffset)
}

func TestStreamHTTP_SSEKeepAlive(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{LongPollTimeout: 20 * time.Millisecond})
	s.do(t, "PUT", "/v1/stream/idle", hdr("Content-Type", "text/plain"), "x").want(t, 201)
	evs := readSSE(t, s.openSSE(t, "/v1/stream/idle?offset=now&live=sse").Body, func(e []sseEvent) bool { return len(e) == 3 })
	for _, e := range evs {
		if m := control(t, e); m["upToDate"] != true || m["streamNextOffset"] != storage.FormatOffset(1) {
			t.Fatalf("control %v", m)
		}
	}
}

// A stream name is taken as sent: "a//b" and "x/../y" are names of their
// own, not paths the server cleans and redirects to another stream.
func TestStreamHTTP_NamesAreNotCleaned(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{})
	for _, tc := range []struct{ name, cleaned string }{
		{"a//b", "a/b"},
		{"x/../y", "y"},
		{"./z", "z"},
		{"w/", "w"},
	} {
		p := "/v1/stream/" + tc.name
		s.do(t, "PUT", p, hdr("Content-Type", "text/plain"), tc.name).want(t, 201).
			wantHeader(t, "Location", s.base+p).
			wantHeader(t, "X-Content-Type-Options", "nosniff")
		s.do(t, "GET", p, nil, "").want(t, 200).wantBody(t, tc.name)
		s.do(t, "GET", "/v1/stream/"+tc.cleaned, nil, "").want(t, 404)
	}
}

// remakeOnWait is a log whose first live wait deletes the stream, makes it
// anew and appends to it: the deletion lands while a live read waits.
type remakeOnWait struct {
	*storage.DB
	once sync.Once
}

func (l *remakeOnWait) remake() {
	l.once.Do(func() {
		ctx := context.Background()
		_ = l.DB.Delete(ctx, "s")
		_, _, _ = l.DB.Create(ctx, "s", storage.CreateOptions{ContentType: "text/plain"})
		_, _ = l.DB.Append(ctx, "s", storage.AppendRequest{Records: [][]byte{[]byte("NEW1"), []byte("NEW2"), []byte("NEW3")}})
	})
}

func (l *remakeOnWait) Wait(ctx context.Context, name, after string) error {
	l.remake()
	return l.DB.Wait(ctx, name, after)
}

func (l *remakeOnWait) WaitID(ctx context.Context, name, after string, id uint64) error {
	l.remake()
	return l.DB.WaitID(ctx, name, after, id)
}

// A live read never serves another incarnation's records from its offset:
// a stream deleted and made anew while a long-poll waits is a 404, and an
// SSE response ends without the new stream's records.
func TestStreamHTTP_LiveReadAcrossRemake(t *testing.T) {
	t.Parallel()
	for _, live := range []string{"long-poll", "sse"} {
		t.Run(live, func(t *testing.T) {
			db, err := storage.Open(filepath.Join(t.TempDir(), "streams.db"), &storage.Options{NoSync: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
			ctx := context.Background()
			if _, _, err := db.Create(ctx, "s", storage.CreateOptions{ContentType: "text/plain", Records: [][]byte{[]byte("OLD")}}); err != nil {
				t.Fatal(err)
			}
			gw, err := gateway.New(gateway.Config{Log: &remakeOnWait{DB: db}, LongPollTimeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			ts := httptest.NewServer(gw.Handler())
			t.Cleanup(func() {
				sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				_ = gw.Shutdown(sctx)
				ts.Close()
			})
			rctx, cancel := context.WithTimeout(ctx, 4*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(rctx, "GET", ts.URL+"/v1/stream/s?offset="+storage.FormatOffset(1)+"&live="+live, nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body) // SSE: read until the server ends it
			resp.Body.Close()
			if rctx.Err() != nil {
				t.Fatalf("the response did not end when the stream was made anew (%q)", body)
			}
			if strings.Contains(string(body), "NEW") {
				t.Fatalf("%d %q: served the new stream's records from the old stream's offset", resp.StatusCode, body)
			}
			if live == "long-poll" && resp.StatusCode != 404 {
				t.Fatalf("long-poll across a remake: %d %q, want 404", resp.StatusCode, body)
			}
		})
	}
}
