package gateway

import (
	"regexp"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/syncgate/syncgate/frames"
)

// frameTypes indexes the per-type counters; outgoing items carry the index.
var frameTypes = [...]frames.Type{
	frames.TypeHello, frames.TypeSubscribe, frames.TypeSnapshot, frames.TypePatch,
	frames.TypeMutate, frames.TypeAck, frames.TypeRebase, frames.TypePresence,
	frames.TypeReconnect, frames.TypeUpdateAvailable,
}

const (
	idxHello = iota
	idxSubscribe
	idxSnapshot
	idxPatch
	idxMutate
	idxAck
	idxRebase
	idxPresence
	idxReconnect
	idxUpdateAvailable
	numFrameTypes
)

func frameIndex(t frames.Type) int {
	for i, ft := range frameTypes {
		if ft == t {
			return i
		}
	}
	return -1
}

// Drop reasons label syncgate_drops_total.
const (
	dropQueueFull     = "queue_full"     // the frame overflowed the send queue (the session is closed 4001)
	dropSessionClosed = "session_closed" // the session was closing when the frame arrived, or closed before writing it (see finish, writeBatch)
)

// metrics holds the gateway's collectors, resolved once so hot paths do no
// label lookups.
type metrics struct {
	sessions          prometheus.Gauge
	accepted          prometheus.Counter
	rejected          map[string]prometheus.Counter // by reason (budget.go)
	draining          prometheus.Gauge
	framesIn          [numFrameTypes]prometheus.Counter
	framesOut         [numFrameTypes]prometheus.Counter
	badFrames         prometheus.Counter
	framesRateLimited prometheus.Counter
	httpRateLimited   prometheus.Counter
	httpTokensLimited prometheus.Counter
	liveReads         prometheus.Gauge
	liveReadsRefused  map[string]prometheus.Counter // by reason: rejectPerIP, rejectPerActor, rejectMaxSessions
	errorsByCode      *prometheus.CounterVec
	bytesIn           prometheus.Counter
	bytesOut          prometheus.Counter
	messagesOut       prometheus.Counter
	drops             map[string]prometheus.Counter
	closes            [numCloseReasons]prometheus.Counter
	deliveryLatency   prometheus.Histogram
	publishes         prometheus.Counter
	writeDelay        prometheus.Gauge
	overloadTicks     prometheus.Counter
	writesBlocked     prometheus.Counter
	writerStalls      prometheus.Counter
	tailers           prometheus.Gauge
	resumes           map[string]prometheus.Counter
	replayed          prometheus.Counter
	presenceDiffs     prometheus.Counter // presence.go
	presenceRejoins   prometheus.Counter
	tokenRefreshes    prometheus.Counter

	producersForgotten [numForgetReasons]prometheus.Counter // producer.go
	producersIdleBytes prometheus.Gauge

	unsubscribesFailed prometheus.Counter // session.run
}

// countFramesOut counts items in syncgate_frames_out_total, by type.
// writeBatch counts its frames itself, as it goes; this is for the frames
// of a message whose write completed later (a pending message's flush).
func (m *metrics) countFramesOut(items []outItem) {
	var counts [numFrameTypes]int
	for i := range items {
		counts[items[i].kind]++
	}
	for k, n := range counts {
		if n > 0 {
			m.framesOut[k].Add(float64(n))
		}
	}
}

// Resume outcomes label syncgate_resumes_total.
const (
	resumeReplayed = "replayed" // the backlog after the cursor was sent
	resumeExpired  = "expired"  // X_CURSOR_EXPIRED: pruned, or not an offset of the log
)

func newMetrics(reg *prometheus.Registry) *metrics {
	m := &metrics{
		sessions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "syncgate_sessions", Help: "Connected WebSocket sessions.",
		}),
		accepted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "syncgate_sessions_accepted_total", Help: "WebSocket upgrades accepted.",
		}),
		draining: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "syncgate_draining", Help: "1 once the node is draining or shutting down (/readyz fails), else 0.",
		}),
		badFrames: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "syncgate_frames_bad_total", Help: "Inbound frames that failed to decode, and binary messages.",
		}),
		framesRateLimited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "syncgate_frames_rate_limited_total", Help: "Inbound frames dropped, undecoded, for being over their session's frame rate.",
		}),
		httpRateLimited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "syncgate_http_writes_rate_limited_total", Help: "Durable Streams HTTP writes refused with 429 for being over their token sub's rate.",
		}),
		httpTokensLimited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "syncgate_http_tokens_rate_limited_total", Help: "Durable Streams HTTP requests refused with 429, their token unchecked, because their client address had spent its budget of refused tokens.",
		}),
		liveReads: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "syncgate_http_live_reads", Help: "Durable Streams HTTP live reads (long-poll, SSE) open; each holds a place under the session caps.",
		}),
		errorsByCode: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "syncgate_error_acks_total", Help: "Error acks queued for the client, by error code.",
		}, []string{"code"}),
		bytesIn: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "syncgate_bytes_in_total", Help: "WebSocket payload bytes received.",
		}),
		bytesOut: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "syncgate_bytes_out_total", Help: "WebSocket payload bytes sent.",
		}),
		messagesOut: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "syncgate_messages_out_total", Help: "WebSocket messages sent (each carries one or more frames).",
		}),
		deliveryLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "syncgate_delivery_latency_seconds",
			Help:    "Per message written that carries patches: time from the publish of its oldest patch until the whole message is in the socket (a write that found the socket full counts when its rest is written). A persisted topic's patch counts from its record's publish time (the at of its row, in ms), log write and tailer included; records a resume replays from the log are not observed.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}),
		publishes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "syncgate_publishes_total", Help: "Messages published (each encoded once): WebSocket publishes, and messages appended over HTTP to a persisted topic's stream (one per JSON message; a producer's duplicate counts none).",
		}),
		overloadTicks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "syncgate_overload_ticks_total", Help: "Pacing ticks (50 ms each) in which the node was overloaded: the moving average over a few ticks of the share of Go scheduler waits of about 1 ms or more exceeded 40% (with shared writers, the writer pool's late turns count as such waits: a paced session taken 5 ms or more after it was due, a ready one that waited max-write-delay + 5 ms or more and, if pacing could not batch it, longer than its frames come apart, at most twice overload-write-delay), and pacing's delay could grow to overload-write-delay.",
		}),
		writesBlocked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "syncgate_writes_blocked_total", Help: "Messages a shared writer could not hand to the socket at once (the peer's buffers were full): the session's own goroutine finished each, waiting up to write-timeout.",
		}),
		writerStalls: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "syncgate_writer_stalls_total", Help: "Shared writer turns that lasted over 100 ms (a write waiting on coder/websocket's lock behind a control frame the reader was writing to a full socket); each time another writer was started in the stuck one's place (at most twice -writers at once). Waits for a core count too.",
		}),
		writeDelay: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "syncgate_write_delay_seconds", Help: "Current pacing delay between a busy session's writes: raised while the node is over its CPU share or write budget, or overloaded; halved once well under both; held in between.",
		}),
		tailers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "syncgate_persisted_tailers", Help: "Persisted topics with local subscribers (one log tailer each).",
		}),
		replayed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "syncgate_replayed_records_total", Help: "Log records sent to resuming subscriptions of persisted topics.",
		}),
		tokenRefreshes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "syncgate_token_refreshes_total", Help: "Hellos that refreshed a live session's token. Refused tokens count in syncgate_error_acks_total by code.",
		}),
		unsubscribesFailed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "syncgate_unsubscribes_failed_total", Help: "Subscriptions a closing session could not unsubscribe from the transport (it returned an error): they may stay registered there.",
		}),
		presenceDiffs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "syncgate_presence_diffs_total", Help: "Presence diffs (one topic's coalesced changes over one window) fanned out to local subscribers, each encoded once.",
		}),
		presenceRejoins: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "syncgate_presence_rejoins_total", Help: "Presence members joined again because their live session's hold had expired (a stall longer than the TTL): by the refresh loop, or by the session's next presence update.",
		}),
		producersIdleBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "syncgate_producers_idle_bytes", Help: "Estimated bytes held by the records of client-named producers no session is using (bounded by Config.MaxIdleProducerBytes).",
		}),
		drops:    map[string]prometheus.Counter{},
		resumes:  map[string]prometheus.Counter{},
		rejected: map[string]prometheus.Counter{},
	}
	rejected := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "syncgate_sessions_rejected_total",
		Help: "Connection attempts at /v1/ws refused, by reason (rate_limit, max_sessions, draining, shutdown, handshake, origin, per_ip, per_actor).",
	}, []string{"reason"})
	for _, r := range rejectReasons {
		m.rejected[r] = rejected.WithLabelValues(r)
	}
	resumes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "syncgate_resumes_total", Help: "Subscribes with a cursor to persisted topics, by outcome; expired also counts live subscriptions sent a new snapshot because their log was replaced or retention skipped records they had not read.",
	}, []string{"outcome"})
	for _, o := range []string{resumeReplayed, resumeExpired} {
		m.resumes[o] = resumes.WithLabelValues(o)
	}
	framesIn := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "syncgate_frames_in_total", Help: "Frames received, by type.",
	}, []string{"type"})
	framesOut := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "syncgate_frames_out_total", Help: "Frames sent, by type.",
	}, []string{"type"})
	for i, t := range frameTypes {
		m.framesIn[i] = framesIn.WithLabelValues(string(t))
		m.framesOut[i] = framesOut.WithLabelValues(string(t))
	}
	drops := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "syncgate_drops_total", Help: "Outgoing frames dropped, by reason.",
	}, []string{"reason"})
	for _, r := range []string{dropQueueFull, dropSessionClosed} {
		m.drops[r] = drops.WithLabelValues(r)
	}
	closes := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "syncgate_closes_total", Help: "Sessions closed, by reason.",
	}, []string{"reason"})
	for r := range numCloseReasons {
		m.closes[r] = closes.WithLabelValues(r.String())
	}
	forgotten := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "syncgate_producers_forgotten_total", Help: "Records of client-named producers no session was using that were forgotten, by reason (expired, table_full, idle_bytes).",
	}, []string{"reason"})
	for r, name := range forgetReasons {
		m.producersForgotten[r] = forgotten.WithLabelValues(name)
	}
	liveRefused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "syncgate_http_live_reads_refused_total", Help: "Durable Streams HTTP live reads refused for the session caps, by reason (per_ip, per_actor: 429; max_sessions: 503).",
	}, []string{"reason"})
	m.liveReadsRefused = map[string]prometheus.Counter{}
	for _, r := range []string{rejectPerIP, rejectPerActor, rejectMaxSessions} {
		m.liveReadsRefused[r] = liveRefused.WithLabelValues(r)
	}
	reg.MustRegister(m.liveReads, liveRefused)
	reg.MustRegister(m.sessions, m.accepted, rejected, m.draining, framesIn, framesOut, m.badFrames, m.framesRateLimited, m.httpRateLimited, m.httpTokensLimited,
		m.errorsByCode, m.bytesIn, m.bytesOut, m.messagesOut, drops, closes, m.deliveryLatency, m.publishes, m.writeDelay, m.overloadTicks, m.writesBlocked, m.writerStalls,
		m.tailers, m.replayed, resumes, m.tokenRefreshes, m.unsubscribesFailed)
	reg.MustRegister(m.presenceDiffs, m.presenceRejoins)
	reg.MustRegister(forgotten, m.producersIdleBytes)
	return m
}

// newRegistry returns a registry with the Go and process collectors. The Go
// collector adds the runtime's scheduling latency (go_sched_latencies_seconds:
// how long goroutines wait runnable before they run). A long tail there
// means the node is CPU-bound and every goroutine, the readers of inbound
// frames among them, waits to run; the delivery latency histogram starts
// at the publish and cannot show that (see docs/metrics.md).
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
			collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/sched/latencies:seconds$`)})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}
