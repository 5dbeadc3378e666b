package gateway_test

import (
	"bufio"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/syncgate/syncgate/gateway"
)

// TestStreamHTTP_IdleSSEKeepsNoPage: an SSE response that has sent a big
// page and waits for more holds neither the page nor the buffer it was
// framed in: readers that caught up on a big stream and now idle cost a
// few KiB each, not the size of their last page, for up to the response's
// lifetime. Not parallel: it measures the heap.
func TestStreamHTTP_IdleSSEKeepsNoPage(t *testing.T) {
	s := newStreamServer(t, gateway.Config{LongPollTimeout: time.Minute}) // no keep-alives
	const p = "/v1/stream/bigidle"
	page := strings.Repeat("x", 900<<10)
	s.do(t, "PUT", p, hdr("Content-Type", "text/plain"), page).want(t, 201)

	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	const readers = 16
	before := heap()
	for range readers {
		body := bufio.NewReader(s.openSSE(t, p+"?offset=-1&live=sse").Body)
		evs := readSSEAsBrowser(t, body, func(e []sseEvent) bool { return len(e) == 2 })
		if len(evs) != 2 || evs[0].data != page {
			t.Fatalf("%d events, want the page and a control event", len(evs))
		}
	}
	// Each response is now waiting for more (it sent its control event
	// after the page, then waits); the readers' own buffers are garbage.
	grown := int64(heap()) - int64(before)
	t.Logf("heap grew %d KiB for %d idle SSE readers", grown>>10, readers)
	if limit := int64(readers) * int64(len(page)) / 4; grown > limit {
		t.Fatalf("heap grew %d KiB for %d idle SSE readers (at most %d KiB): each holds its last page", grown>>10, readers, limit>>10)
	}
}
