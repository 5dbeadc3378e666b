package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync/atomic"
)

// topicsResult is the JSON line of bench topics.
type topicsResult struct {
	Bench      string  `json:"bench"`
	URL        string  `json:"url"`
	N          int     `json:"n"`
	Prefix     string  `json:"topic_prefix"`
	Rate       float64 `json:"rate"`
	DurS       float64 `json:"dur_s"`
	Size       int     `json:"size"`
	Subscriber string  `json:"subscriber"` // -subscriber: raw or client

	Sent              int64   `json:"sent"`
	Behind            int64   `json:"behind"`
	OfferedPerS       float64 `json:"offered_per_s"`
	Acked             int64   `json:"acked"`
	AckedPerS         float64 `json:"acked_per_s"`
	PublishErrors     int64   `json:"publish_errors"`
	FirstPublishError string  `json:"first_publish_error,omitempty"`
	Unacked           int64   `json:"unacked"`
	PublisherError    string  `json:"publisher_error,omitempty"`

	Delivered       int64       `json:"delivered"`
	Expected        int64       `json:"expected"` // acked + unacked (every publish without an error): each topic has one subscriber
	DeliveredPerS   float64     `json:"delivered_per_s"`
	DeliveryRatio   float64     `json:"delivery_ratio"`
	Lost            int64       `json:"lost"`
	Unparsable      int64       `json:"unparsable,omitempty"`
	DrainS          float64     `json:"drain_s"`
	AckLatency      latencyJSON `json:"ack_latency_ms"`
	DeliveryLatency latencyJSON `json:"delivery_latency_ms"`
	LatencyMethod   string      `json:"latency_method"`

	subsJSON
	cpuJSON
	floodJSON
}

func benchTopics(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		b      benchFlags
		l      loadFlags
		fl     floodFlags
		n      int
		prefix string
	)
	fs := newFlagSet("topics", "-n N -rate R -dur T [-size B] [flags]")
	b.register(fs)
	l.register(fs)
	fl.register(fs)
	fs.IntVar(&n, "n", 100, "topics, each with one subscriber session")
	fs.StringVar(&prefix, "topic-prefix", "bench:topics", "topic i is <prefix>:<i>")
	if err := parseFlags(fs, args, stdout, stderr); err != nil {
		return err
	}
	if n < 1 {
		return errors.New("bench: -n must be at least 1")
	}
	if err := l.validate(b); err != nil {
		return err
	}
	if err := fl.validate(); err != nil {
		return err
	}
	e, err := b.setup(ctx, n+1+fl.n)
	if err != nil {
		return err
	}
	defer e.close()
	e.warnPorts(stderr, n+1+fl.n)
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()

	topics := make([]string, n)
	for i := range topics {
		topics[i] = prefix + ":" + strconv.Itoa(i)
	}
	pc, err := e.dial(ctx)
	if err != nil {
		return fmt.Errorf("bench: publisher: %w", err)
	}
	defer pc.Close()
	pub := newBenchPub(pc)
	ackHist := newHistogram()
	pub.ackHist = ackHist.shard(0) // acks are recorded on one read loop
	pub.topicAcked = make([]atomic.Int64, n)

	hist := newHistogram()
	ss, all, err := e.openSubs(ctx, l.subscriber, n, func(i int) string { return topics[i] }, hist)
	if err != nil {
		return err
	}
	defer closeSubs(b.dialConcurrency, ss)
	flood, err := e.openFlooders(ctx, fl, prefix, l.size)
	if err != nil {
		return err
	}
	defer flood.close()

	fmt.Fprintf(stdout, "topics: %d topics (%s:0…) with one subscriber (%s) each, one publisher round-robin at %g msgs/s for %s, %d-byte data\n",
		n, prefix, l.subscriber, l.rate, l.dur, l.size)
	if fl.n > 0 {
		fmt.Fprintf(stdout, "topics: %d flooders send %s frames at %g/s each (%g × the server's %g/s) for the whole window\n",
			fl.n, fl.frame, fl.rate(), fl.factor, fl.serverRate)
	}
	win := e.startCPU(ctx, stderr)
	flood.start()
	run := pub.run(ctx, l, topics)
	flood.halt()
	if ctx.Err() != nil {
		return runErr(ctx, b)
	}
	lr, err := settle(ctx, pub, run.sent, ss, all, func(i int) int64 { return pub.topicAcked[i].Load() }, run.end.Add(l.wait))
	if err != nil {
		return runErr(ctx, b)
	}
	cpu := win.stop(ctx, e, stderr, lr.delivered)

	r := topicsResult{
		Bench: "topics", URL: b.url, N: n, Prefix: prefix, Rate: l.rate, DurS: l.dur.Seconds(), Size: l.size,
		Subscriber: l.subscriber, Sent: run.sent, Behind: run.behind, OfferedPerS: perSecond(float64(run.sent), run.end.Sub(run.start)),
		Acked: lr.acked, PublishErrors: lr.pubErrors, FirstPublishError: lr.firstPubError, Unacked: lr.unacked,
		Delivered: lr.delivered, Expected: lr.acked + lr.unacked, Unparsable: lr.bad,
		AckLatency: ackHist.snapshot().json(), DeliveryLatency: hist.snapshot().json(), LatencyMethod: histMethod,
		subsJSON: lr.subsJSON(),
		cpuJSON:  cpu,
	}
	r.floodJSON = flood.result(l.wait)
	if run.err != nil {
		r.PublisherError = run.err.Error()
	}
	// Acks and deliveries both trail the publishing window; rate them over
	// it, stretched to the last delivery when that came later.
	span := run.end.Sub(run.start)
	if !lr.lastDelivery.IsZero() {
		span = max(span, lr.lastDelivery.Sub(run.start))
		r.DrainS = round(max(0, lr.lastDelivery.Sub(run.end).Seconds()), 3)
	}
	r.AckedPerS = perSecond(float64(r.Acked), span)
	r.DeliveredPerS = perSecond(float64(r.Delivered), span)
	r.DeliveryRatio = round(ratio(float64(r.Delivered), float64(r.Expected)), 6)
	r.Lost = max(0, r.Expected-r.Delivered)

	fmt.Fprintf(stdout, "  published  %d sent (%.1f/s offered, %d behind), %d acked (%.1f/s), %d errors, %d unacked\n",
		r.Sent, r.OfferedPerS, r.Behind, r.Acked, r.AckedPerS, r.PublishErrors, r.Unacked)
	if r.FirstPublishError != "" {
		fmt.Fprintf(stdout, "             first publish error: %s\n", r.FirstPublishError)
	}
	if r.PublisherError != "" {
		fmt.Fprintf(stdout, "             publisher stopped: %s\n", r.PublisherError)
	}
	fmt.Fprintf(stdout, "  delivered  %d of %d (ratio %.4f, %d lost), %.1f/s, last %.3fs after publishing\n",
		r.Delivered, r.Expected, r.DeliveryRatio, r.Lost, r.DeliveredPerS, r.DrainS)
	if r.Unacked > 0 {
		fmt.Fprintf(stdout, "             %d publishes unacked when the wait ended: their deliveries were not waited for either (raise -wait)\n", r.Unacked)
	}
	fmt.Fprintf(stdout, "  ack        %s\n", r.AckLatency)
	fmt.Fprintf(stdout, "  delivery   %s\n", r.DeliveryLatency)
	fmt.Fprintf(stdout, "  %s\n", r.cpuJSON)
	r.subsJSON.print(stdout, r.Subscriber)
	r.floodJSON.print(stdout)
	return writeJSON(stdout, r)
}
