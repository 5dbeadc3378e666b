package gateway_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/syncgate/syncgate/internal/gwtest"
	"github.com/syncgate/syncgate/storage"
)

// streamStatus sends method to topic's stream on n with body (of content
// type ct, if not empty) and any headers given as name, value pairs, and
// returns the response's status and body.
func streamStatus(t *testing.T, n *persistNode, method, topic, ct, body string, header ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, n.ts.URL+"/v1/stream/"+topic, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// publishesOf returns n's syncgate_publishes_total.
func publishesOf(t *testing.T, n *persistNode) float64 {
	t.Helper()
	return metricValue(t, n.scrape(t), "syncgate_publishes_total")
}

// Messages appended over HTTP to a persisted topic's stream reach its
// WebSocket subscribers as a WebSocket publish's do, and count in
// syncgate_publishes_total alike: one per message (a JSON array's
// element), counted when the append is admitted (the response is
// written after it). A producer's retry answered as a duplicate writes
// nothing and counts nothing; nor does a refused write, a close, a
// repeated PUT, or an append to a stream that is not a persisted topic's.
// A PUT that makes a persisted topic's stream with data counts its
// messages. (They used to count nothing: only WebSocket publishes did.)
func TestPersisted_HTTPAppendsCountAsPublishes(t *testing.T) {
	t.Parallel()
	n := startPersistNode(t, t.TempDir())
	const topic = "chat:http"
	sub := gwtest.Dial(t, n.url, nil)
	sub.Hello("", 0)
	sub.Subscribe("s", topic)
	want := func(step string, count float64) {
		t.Helper()
		if got := publishesOf(t, n); got != count {
			t.Fatalf("after %s: syncgate_publishes_total %v, want %v", step, got, count)
		}
	}
	must := func(step string, code, status int, body string) {
		t.Helper()
		if code != status {
			t.Fatalf("%s: %d %s, want %d", step, code, body, status)
		}
	}
	want("nothing", 0)

	code, body := streamStatus(t, n, http.MethodPost, topic, "application/json", `{"n":0}`)
	must("POST of one message", code, http.StatusNoContent, body)
	expectMade(t, sub, "s")
	collect(t, sub, "s", 1)
	want("a POST of one message", 1)
	code, body = streamStatus(t, n, http.MethodPost, topic, "application/json", `[{"n":1},{"n":2},{"n":3}]`)
	must("POST of three messages", code, http.StatusNoContent, body)
	collect(t, sub, "s", 3)
	want("a POST of three messages", 4)

	prod := func(seq string) []string {
		return []string{"Producer-Id", "backend", "Producer-Epoch", "0", "Producer-Seq", seq}
	}
	code, body = streamStatus(t, n, http.MethodPost, topic, "application/json", `[{"n":4},{"n":5}]`, prod("0")...)
	must("a producer's POST", code, http.StatusOK, body)
	collect(t, sub, "s", 2)
	want("a producer's POST of two messages", 6)
	code, body = streamStatus(t, n, http.MethodPost, topic, "application/json", `[{"n":4},{"n":5}]`, prod("0")...)
	must("the producer's retry", code, http.StatusNoContent, body)
	want("the producer's retry (a duplicate)", 6)

	// Refused: a producer's gap, another content type, a body that is
	// not JSON.
	code, body = streamStatus(t, n, http.MethodPost, topic, "application/json", `{"n":6}`, prod("5")...)
	must("a producer's gap", code, http.StatusConflict, body)
	code, body = streamStatus(t, n, http.MethodPost, topic, "text/plain", `hi`)
	must("POST of another type", code, http.StatusConflict, body)
	code, body = streamStatus(t, n, http.MethodPost, topic, "application/json", `{`)
	must("POST of invalid JSON", code, http.StatusBadRequest, body)
	want("refused POSTs", 6)

	// A PUT that makes a persisted topic's stream with data publishes it;
	// a repeated PUT writes nothing.
	code, body = streamStatus(t, n, http.MethodPut, "chat:put", "application/json", `[{"n":0},{"n":1}]`)
	must("PUT with two messages", code, http.StatusCreated, body)
	want("a PUT with two messages", 8)
	code, body = streamStatus(t, n, http.MethodPut, "chat:put", "application/json", `[{"n":0},{"n":1}]`)
	must("a repeated PUT", code, http.StatusOK, body)
	want("a repeated PUT", 8)

	// Not a persisted topic: no WebSocket subscriber reads it.
	code, body = streamStatus(t, n, http.MethodPut, "notes:x", "application/json", `[1]`)
	must("PUT at a name that is not persisted", code, http.StatusCreated, body)
	code, body = streamStatus(t, n, http.MethodPost, "notes:x", "application/json", `[2,3]`)
	must("POST at a name that is not persisted", code, http.StatusNoContent, body)
	want("writes to a stream that is not a topic's", 8)

	// A close publishes nothing, and a closed stream takes nothing.
	code, body = streamStatus(t, n, http.MethodPost, topic, "", "", "Stream-Closed", "true")
	must("a close", code, http.StatusNoContent, body)
	code, body = streamStatus(t, n, http.MethodPost, topic, "application/json", `{"n":7}`)
	must("POST to the closed stream", code, http.StatusConflict, body)
	want("a close and a POST it refused", 8)
}

// A WebSocket publish retried after a restart (the node has no record of
// its client's producer, so the retry reaches the log) is answered by the
// log as a duplicate: acked with the original offset, nothing written,
// and no publish counted. (It used to count: the append's callback
// counted every admitted append, duplicates too.)
func TestPersisted_RetryTheLogAnswersCountsNoPublish(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const topic = "chat:retry"
	n := startPersistNode(t, dir)
	c := gwtest.Dial(t, n.url, nil)
	c.Hello("writer", 0)
	first := c.Publish("k0", 0, topic, `{"n":0}`)
	if first.Error != nil || first.LSN == nil {
		t.Fatalf("publish: %+v", first)
	}
	if got := publishesOf(t, n); got != 1 {
		t.Fatalf("syncgate_publishes_total %v after a publish, want 1", got)
	}
	_ = c.C.CloseNow()
	n.stop()

	n = startPersistNode(t, dir)
	c = gwtest.Dial(t, n.url, nil)
	c.Hello("writer", 0)
	if ack := c.Publish("k0", 0, topic, `{"n":0}`); ack.Error != nil || ack.LSN == nil || *ack.LSN != *first.LSN {
		t.Fatalf("the retry after the restart: ack %+v, want the original offset %s", ack, *first.LSN)
	}
	res, err := n.db.Read(t.Context(), topic, storage.ZeroOffset, 0)
	if err != nil || len(res.Records) != 1 {
		t.Fatalf("log after the retry: %d records, %v; want the one", len(res.Records), err)
	}
	if got := publishesOf(t, n); got != 0 {
		t.Fatalf("syncgate_publishes_total %v after a retry the log answered as a duplicate, want 0", got)
	}
	if ack := c.Publish("k1", 1, topic, `{"n":1}`); ack.Error != nil {
		t.Fatalf("the next publish: %+v", ack.Error)
	}
	if got := publishesOf(t, n); got != 1 {
		t.Fatalf("syncgate_publishes_total %v after a new publish, want 1", got)
	}
}
