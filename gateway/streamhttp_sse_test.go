package gateway_test

import (
	"bufio"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/syncgate/syncgate/gateway"
)

// readSSEAsBrowser parses SSE events as the EventSource processing
// model does (WHATWG HTML, "Parsing an event stream"): lines end at CR,
// LF or CRLF, and one space after a field's colon is dropped. It reads
// until stop returns true or the body ends.
func readSSEAsBrowser(t *testing.T, body io.Reader, stop func([]sseEvent) bool) []sseEvent {
	t.Helper()
	var (
		events []sseEvent
		cur    sseEvent
		data   []string
	)
	br := bufio.NewReader(body)
	var line []byte
	for {
		b, err := br.ReadByte()
		if err != nil {
			return events
		}
		if b != '\r' && b != '\n' {
			line = append(line, b)
			continue
		}
		if b == '\r' {
			if next, err := br.Peek(1); err == nil && next[0] == '\n' {
				_, _ = br.ReadByte()
			}
		}
		l := string(line)
		line = line[:0]
		if l == "" {
			if data != nil {
				cur.data = strings.Join(data, "\n")
				events = append(events, cur)
				if stop(events) {
					return events
				}
			}
			cur, data = sseEvent{}, nil
			continue
		}
		field, value, _ := strings.Cut(l, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "event":
			cur.name = value
		case "data":
			data = append(data, value)
		}
	}
}

// TestStreamHTTP_SSELeadingSpace: a text stream's line that starts with
// a space reaches an SSE client with its space. A client drops one space
// after "data:" (as EventSource does), so a line written right after the
// colon lost its first space.
func TestStreamHTTP_SSELeadingSpace(t *testing.T) {
	t.Parallel()
	s := newStreamServer(t, gateway.Config{LongPollTimeout: time.Minute})
	const text = " indented\n  two\n\tthree\nplain\r  crlf\r\n "
	s.do(t, "PUT", "/v1/stream/sse-space", hdr("Content-Type", "text/plain"), text).want(t, 201)
	resp := s.openSSE(t, "/v1/stream/sse-space?offset=-1&live=sse")
	evs := readSSEAsBrowser(t, resp.Body, func(e []sseEvent) bool { return len(e) == 2 })
	if len(evs) != 2 || evs[0].name != "data" {
		t.Fatalf("events %q", evs)
	}
	// SSE carries no CR: each line end arrives as LF.
	want := strings.NewReplacer("\r\n", "\n", "\r", "\n").Replace(text)
	if evs[0].data != want {
		t.Fatalf("data %q, want %q", evs[0].data, want)
	}
}
