package gateway_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/internal/gwtest"
	"github.com/syncgate/syncgate/storage"
)

// streamStatus sends method to topic's stream on n with body (of content
// type ct, if not empty) and any headers given as name, value pairs, and
// returns the response's status and body.
func streamStatus(t *testing.T, n *persistNode, method, topic, ct, body string, header ...string) (int, string) {
	t.Helper()
	return httpDo(t, method, n.ts.URL+"/v1/stream/"+topic, "", ct, body, header...)
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

// deliveryLatency waits until srv has observed count deliveries in
// syncgate_delivery_latency_seconds, fails the test if it has observed
// more, and returns their sum in seconds.
func deliveryLatency(t *testing.T, srv *testServer, count float64) float64 {
	t.Helper()
	var m string
	gwtest.Eventually(t, gwtest.Timeout, fmt.Sprintf("%v deliveries observed", count), func() bool {
		m = scrape(t, srv.ts.URL)
		return metricValue(t, m, "syncgate_delivery_latency_seconds_count") >= count
	})
	if got := metricValue(t, m, "syncgate_delivery_latency_seconds_count"); got != count {
		t.Fatalf("%v deliveries observed, want %v", got, count)
	}
	return metricValue(t, m, "syncgate_delivery_latency_seconds_sum")
}

// A persisted topic's record is observed in
// syncgate_delivery_latency_seconds from its publish, the time its row
// carries (at), not from when the topic's tailer read it back from the
// log: the log write and the tailer's wait are in it, as they are in its
// subscribers' wait. On a clock that moves only when told, moved a second
// while the tailer is held before its read, the record's latency is that
// second (it was 0: the clock started when the tailer handed the record
// to the fanout). A message appended over HTTP in a publish's form gives
// its own at; one whose at is after the tailer's read counts from the
// read, never below 0.
func TestPersisted_DeliveryLatencyFromThePublish(t *testing.T) {
	t.Parallel()
	// A whole millisecond: a row's at is in milliseconds.
	clock := &fakeClock{t: time.UnixMilli(time.Now().UnixMilli())}
	var log *gatedLog
	_, srv := startWrappedNode(t, nil, func(db *storage.DB) gateway.StreamLog {
		log = &gatedLog{DB: db, open: make(chan struct{})}
		return log
	}, func(c *gateway.Config) { c.Now = clock.Now })
	const topic = "chat:latency"
	sub := gwtest.Dial(t, srv.url, nil)
	sub.Hello("", 0)
	sub.Subscribe("s", topic)
	pub := gwtest.Dial(t, srv.url, nil)
	pub.Hello("", 0)
	if ack := pub.Publish("k0", 0, topic, `{"n":0}`); ack.Error != nil {
		t.Fatalf("publish: %+v", ack.Error)
	}
	expectMade(t, sub, "s") // the tailer took the new stream; its wait for the record is held
	clock.Advance(time.Second)
	close(log.open)
	collect(t, sub, "s", 1)
	if sum := deliveryLatency(t, srv, 1); sum != 1 {
		t.Fatalf("a publish the tailer read a second later: latency %v s, want 1", sum)
	}

	post := func(body string) {
		t.Helper()
		if code, b := httpDo(t, http.MethodPost, srv.ts.URL+"/v1/stream/"+topic, "", "application/json", body); code != http.StatusNoContent {
			t.Fatalf("POST %s: %d %s", body, code, b)
		}
		collect(t, sub, "s", 1)
	}
	post(fmt.Sprintf(`{"data":1,"at":%d}`, clock.Now().Add(-250*time.Millisecond).UnixMilli()))
	if sum := deliveryLatency(t, srv, 2); sum != 1.25 {
		t.Fatalf("latency sum %v s after an HTTP message whose at is a quarter second old, want 1.25", sum)
	}
	post(fmt.Sprintf(`{"data":2,"at":%d}`, clock.Now().Add(time.Hour).UnixMilli()))
	if sum := deliveryLatency(t, srv, 3); sum != 1.25 {
		t.Fatalf("latency sum %v s after an HTTP message whose at is ahead of the clock, want 1.25 (it counts 0)", sum)
	}
}

// Records a resume replays from the log are not deliveries of a publish:
// they are old by design, and syncgate_delivery_latency_seconds does not
// observe them. A live record after the replay is observed.
func TestPersisted_ReplayIsNoDeliveryLatency(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.UnixMilli(time.Now().UnixMilli())}
	n := startPersistNodeWith(t, t.TempDir(), nil, func(c *gateway.Config) { c.Now = clock.Now })
	const topic = "chat:replayed"
	pub := gwtest.Dial(t, n.url, nil)
	pub.Hello("", 0)
	for i := range 3 {
		if ack := pub.Publish(fmt.Sprintf("k%d", i), int64(i), topic, `1`); ack.Error != nil {
			t.Fatalf("publish %d: %+v", i, ack.Error)
		}
	}
	clock.Advance(time.Hour)
	c := gwtest.Dial(t, n.url, nil)
	c.Hello("", 0)
	resume(t, c, "r", topic, storage.ZeroOffset)
	collect(t, c, "r", 3)
	if ack := pub.Publish("k3", 3, topic, `1`); ack.Error != nil {
		t.Fatalf("live publish: %+v", ack.Error)
	}
	collect(t, c, "r", 1)
	// Written in order by the session's one writer: the replayed frames'
	// observations, had there been any, came before the live one's.
	if sum := deliveryLatency(t, n.testServer, 1); sum != 0 {
		t.Fatalf("latency sum %v s, want 0: only the live record, on a still clock", sum)
	}
	if got := metricValue(t, n.scrape(t), "syncgate_replayed_records_total"); got != 3 {
		t.Fatalf("syncgate_replayed_records_total %v, want 3", got)
	}
}
