package main

import (
	"context"
	"errors"
	"fmt"
	"io"
)

// fanoutResult is the JSON line of bench fanout.
type fanoutResult struct {
	Bench      string  `json:"bench"`
	URL        string  `json:"url"`
	Subs       int     `json:"subs"`
	Topic      string  `json:"topic"`
	Rate       float64 `json:"rate"`
	DurS       float64 `json:"dur_s"`
	Size       int     `json:"size"`
	Subscriber string  `json:"subscriber"` // -subscriber: raw or client

	Sent              int64   `json:"sent"`
	Behind            int64   `json:"behind"` // due in the window but never sent (publisher fell behind)
	OfferedPerS       float64 `json:"offered_per_s"`
	Acked             int64   `json:"acked"`
	PublishErrors     int64   `json:"publish_errors"`
	FirstPublishError string  `json:"first_publish_error,omitempty"`
	Unacked           int64   `json:"unacked"`
	PublisherError    string  `json:"publisher_error,omitempty"`

	Delivered     int64       `json:"delivered"`
	Expected      int64       `json:"expected"` // (acked + unacked) × subs: every publish without an error
	DeliveredPerS float64     `json:"delivered_per_s"`
	DeliveryRatio float64     `json:"delivery_ratio"`
	Lost          int64       `json:"lost"`
	Unparsable    int64       `json:"unparsable,omitempty"`
	DrainS        float64     `json:"drain_s"` // last delivery − end of publishing
	Latency       latencyJSON `json:"latency_ms"`
	LatencyMethod string      `json:"latency_method"`

	subsJSON
	cpuJSON
}

func benchFanout(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		b     benchFlags
		l     loadFlags
		subs  int
		topic string
	)
	fs := newFlagSet("fanout", "-subs N -rate R -dur T [-size B] [flags]")
	b.register(fs)
	l.register(fs)
	fs.IntVar(&subs, "subs", 100, "subscriber sessions, all on -topic")
	fs.StringVar(&topic, "topic", "bench:fanout", "topic to publish to")
	if err := parseFlags(fs, args, stdout, stderr); err != nil {
		return err
	}
	if subs < 1 {
		return errors.New("bench: -subs must be at least 1")
	}
	if err := l.validate(b); err != nil {
		return err
	}
	e, err := b.setup(ctx, subs+1)
	if err != nil {
		return err
	}
	defer e.close()
	e.warnPorts(stderr, subs+1)
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()

	pc, err := e.dial(ctx)
	if err != nil {
		return fmt.Errorf("bench: publisher: %w", err)
	}
	defer pc.Close()
	pub := newBenchPub(pc)

	hist := newHistogram()
	ss, all, err := e.openSubs(ctx, l.subscriber, subs, func(int) string { return topic }, hist)
	if err != nil {
		return err
	}
	defer closeSubs(b.dialConcurrency, ss)

	fmt.Fprintf(stdout, "fanout: %d subscribers (%s) on %q, %g msgs/s for %s, %d-byte data\n",
		subs, l.subscriber, topic, l.rate, l.dur, l.size)
	win := e.startCPU(ctx, stderr)
	run := pub.run(ctx, l, []string{topic})
	if ctx.Err() != nil {
		return runErr(ctx, b)
	}
	lr, err := settle(ctx, pub, run.sent, ss, all, func(int) int64 { return pub.acked.Load() }, run.end.Add(l.wait))
	if err != nil {
		return runErr(ctx, b)
	}
	cpu := win.stop(ctx, e, stderr, lr.delivered)

	r := fanoutResult{
		Bench: "fanout", URL: b.url, Subs: subs, Topic: topic, Rate: l.rate, DurS: l.dur.Seconds(), Size: l.size,
		Subscriber: l.subscriber, Sent: run.sent, Behind: run.behind, OfferedPerS: perSecond(float64(run.sent), run.end.Sub(run.start)),
		Acked: lr.acked, PublishErrors: lr.pubErrors, FirstPublishError: lr.firstPubError, Unacked: lr.unacked,
		Delivered: lr.delivered, Expected: (lr.acked + lr.unacked) * int64(subs), Unparsable: lr.bad,
		Latency: hist.snapshot().json(), LatencyMethod: histMethod,
		subsJSON: lr.subsJSON(),
		cpuJSON:  cpu,
	}
	if run.err != nil {
		r.PublisherError = run.err.Error()
	}
	r.DeliveryRatio = round(ratio(float64(r.Delivered), float64(r.Expected)), 6)
	r.Lost = max(0, r.Expected-r.Delivered)
	// Deliveries trail the publishing window; rate them over it, stretched
	// to the last delivery when that came later.
	span := run.end.Sub(run.start)
	if !lr.lastDelivery.IsZero() {
		span = max(span, lr.lastDelivery.Sub(run.start))
		r.DrainS = round(max(0, lr.lastDelivery.Sub(run.end).Seconds()), 3)
	}
	r.DeliveredPerS = perSecond(float64(r.Delivered), span)

	fmt.Fprintf(stdout, "  published  %d sent (%.1f/s offered, %d behind), %d acked, %d errors, %d unacked\n",
		r.Sent, r.OfferedPerS, r.Behind, r.Acked, r.PublishErrors, r.Unacked)
	if r.FirstPublishError != "" {
		fmt.Fprintf(stdout, "             first publish error: %s\n", r.FirstPublishError)
	}
	if r.PublisherError != "" {
		fmt.Fprintf(stdout, "             publisher stopped: %s\n", r.PublisherError)
	}
	fmt.Fprintf(stdout, "  delivered  %d of %d (ratio %.4f, %d lost), %.0f deliveries/s, last %.3fs after publishing\n",
		r.Delivered, r.Expected, r.DeliveryRatio, r.Lost, r.DeliveredPerS, r.DrainS)
	if r.Unacked > 0 {
		fmt.Fprintf(stdout, "             %d publishes unacked when the wait ended: their deliveries were not waited for either (raise -wait)\n", r.Unacked)
	}
	fmt.Fprintf(stdout, "  latency    %s (%d samples)\n", r.Latency, r.Latency.Count)
	fmt.Fprintf(stdout, "  %s\n", r.cpuJSON)
	r.subsJSON.print(stdout, r.Subscriber)
	return writeJSON(stdout, r)
}
