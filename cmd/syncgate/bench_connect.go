package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/syncgate/syncgate/client"
)

// connectResult is the JSON line of bench connect.
type connectResult struct {
	Bench string  `json:"bench"`
	URL   string  `json:"url"`
	N     int     `json:"n"`
	HoldS float64 `json:"hold_s"`

	Connected    int         `json:"connected"`
	Failed       int64       `json:"failed"`
	FirstError   string      `json:"first_error,omitempty"`
	ConnectS     float64     `json:"connect_s"` // wall time to open them all
	ConnectsPerS float64     `json:"connects_per_s"`
	ConnectTime  latencyJSON `json:"connect_ms"` // dial + hello, per session
	TimeMethod   string      `json:"connect_time_method"`
	DroppedHeld  int         `json:"dropped_during_hold"`
	FirstDrop    string      `json:"first_drop,omitempty"`

	// From the server's /metrics: before dialling and at the end of the
	// hold. Per-session figures divide by connected sessions. Absent if
	// /metrics could not be read.
	SessionsSeen           *float64 `json:"sessions_seen"`
	RSSBeforeBytes         *float64 `json:"rss_before_bytes"`
	RSSHeldBytes           *float64 `json:"rss_held_bytes"`
	RSSPerSessionKiB       *float64 `json:"rss_per_session_kib"`
	HeapInusePerSessionKiB *float64 `json:"heap_inuse_per_session_kib"`
	GoroutinesPerSession   *float64 `json:"goroutines_per_session"`
}

func benchConnect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		b    benchFlags
		n    int
		hold time.Duration
	)
	fs := newFlagSet("connect", "-n N [-hold 2s] [flags]")
	b.register(fs)
	fs.IntVar(&n, "n", 1000, "sessions to open")
	fs.DurationVar(&hold, "hold", 2*time.Second, "how long to hold them idle before scraping the server's memory")
	if err := parseFlags(fs, args, stdout, stderr); err != nil {
		return err
	}
	switch {
	case n < 1:
		return errors.New("bench: -n must be at least 1")
	case hold < 0:
		return errors.New("bench: -hold must not be negative")
	case hold >= b.timeout:
		return fmt.Errorf("bench: -timeout (%s) must exceed -hold (%s) plus connect time", b.timeout, hold)
	}
	e, err := b.setup(ctx, n)
	if err != nil {
		return err
	}
	defer e.close()
	e.warnPorts(stderr, n)
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()

	fmt.Fprintf(stdout, "connect: %d sessions to %s, %d at a time, held %s\n", n, b.url, b.dialConcurrency, hold)
	before := e.scrapeOrWarn(ctx, stderr, "before dialling")

	hist := newHistogram()
	cs := make([]*client.Client, n)
	defer closeAll(b.dialConcurrency, cs)
	var fails firstError
	start := time.Now()
	forEach(ctx, n, b.dialConcurrency, func(i int) {
		t0 := time.Now()
		c, err := e.dial(ctx)
		if err != nil {
			fails.record(err)
			return
		}
		hist.shard(i).record(int64(time.Since(t0)))
		cs[i] = c
	})
	dialDur := time.Since(start)
	if ctx.Err() != nil {
		return runErr(ctx, b)
	}

	if fails.n.Load() == int64(n) {
		hold = 0 // nothing to hold
	}
	timer := time.NewTimer(hold)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-ctx.Done():
		return runErr(ctx, b)
	}
	held := e.scrapeOrWarn(ctx, stderr, "while holding")

	r := connectResult{
		Bench: "connect", URL: b.url, N: n, HoldS: hold.Seconds(),
		Failed: fails.n.Load(), FirstError: fails.first(),
		ConnectS: round(dialDur.Seconds(), 3), ConnectTime: hist.snapshot().json(), TimeMethod: histMethod,
	}
	for _, c := range cs {
		if c == nil {
			continue
		}
		r.Connected++
		if err := c.Err(); err != nil {
			r.DroppedHeld++
			if r.FirstDrop == "" {
				r.FirstDrop = err.Error()
			}
		}
	}
	r.ConnectsPerS = perSecond(float64(r.Connected), dialDur)
	if v, ok := held.get(metricSessions); ok {
		r.SessionsSeen = ptr(v)
	}
	if v, ok := before.get(metricRSS); ok {
		r.RSSBeforeBytes = ptr(v)
	}
	if v, ok := held.get(metricRSS); ok {
		r.RSSHeldBytes = ptr(v)
	}
	if r.Connected > 0 {
		per := func(series string, unit float64) *float64 {
			d := delta(before, held, series)
			if d == nil {
				return nil
			}
			return ptr(round(*d/unit/float64(r.Connected), 3))
		}
		r.RSSPerSessionKiB = per(metricRSS, 1024)
		r.HeapInusePerSessionKiB = per(metricHeapInuse, 1024)
		r.GoroutinesPerSession = per(metricGoroutines, 1)
	}

	fmt.Fprintf(stdout, "  connected  %d of %d in %.3fs (%.1f/s), %d failed\n", r.Connected, n, r.ConnectS, r.ConnectsPerS, r.Failed)
	if r.FirstError != "" {
		fmt.Fprintf(stdout, "             first error: %s\n", r.FirstError)
	}
	fmt.Fprintf(stdout, "  connect    %s\n", r.ConnectTime)
	if r.DroppedHeld > 0 {
		fmt.Fprintf(stdout, "  dropped    %d during the hold; first: %s\n", r.DroppedHeld, r.FirstDrop)
	}
	if r.SessionsSeen != nil {
		fmt.Fprintf(stdout, "  server     %.0f sessions", *r.SessionsSeen)
		if r.RSSPerSessionKiB != nil {
			fmt.Fprintf(stdout, ", RSS %.1f → %.1f MiB: %.2f KiB per idle session",
				*r.RSSBeforeBytes/(1<<20), *r.RSSHeldBytes/(1<<20), *r.RSSPerSessionKiB)
		}
		if r.HeapInusePerSessionKiB != nil {
			fmt.Fprintf(stdout, " (heap in use %.2f KiB", *r.HeapInusePerSessionKiB)
			if r.GoroutinesPerSession != nil {
				fmt.Fprintf(stdout, ", %.2f goroutines", *r.GoroutinesPerSession)
			}
			fmt.Fprint(stdout, ")")
		}
		fmt.Fprintln(stdout)
	}
	if err := writeJSON(stdout, r); err != nil {
		return err
	}
	if r.Connected == 0 {
		return fmt.Errorf("bench: no session connected; first error: %s", r.FirstError)
	}
	return nil
}
