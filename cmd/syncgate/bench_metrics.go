package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// Series the benches read from the gateway's /metrics.
const (
	metricCPU          = "process_cpu_seconds_total"
	metricRSS          = "process_resident_memory_bytes"
	metricHeapInuse    = "go_memstats_heap_inuse_bytes"
	metricGoroutines   = "go_goroutines"
	metricSessions     = "syncgate_sessions"
	metricSlowConsumer = `syncgate_closes_total{reason="slow_consumer"}`
	metricQueueDrops   = `syncgate_drops_total{reason="queue_full"}`
	metricMessagesOut  = "syncgate_messages_out_total"
	metricPatchesOut   = `syncgate_frames_out_total{type="patch"}`
	metricFramesOut    = "syncgate_frames_out_total"
	metricWriteDelay   = "syncgate_write_delay_seconds"
	metricOverloads    = "syncgate_overload_ticks_total"
	metricBlocked      = "syncgate_writes_blocked_total"
)

// scrape is one read of /metrics: sample value by series, the series
// written as in the exposition text (name, then labels if any).
type scrape map[string]float64

// get returns the series' value and whether it was present. A nil scrape
// (a failed one) has nothing.
func (s scrape) get(series string) (float64, bool) {
	v, ok := s[series]
	return v, ok
}

// delta returns after−before for series, or nil when either lacks it.
func delta(before, after scrape, series string) *float64 {
	a, ok1 := after.get(series)
	b, ok2 := before.get(series)
	if !ok1 || !ok2 {
		return nil
	}
	d := a - b
	return &d
}

// scrape reads the gateway's metrics. It fails on any HTTP or parse
// error; callers treat server metrics as optional and say so on stderr.
func (e *benchEnv) scrape(ctx context.Context) (scrape, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.metricsURL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := e.scrapeHTTP.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", e.metricsURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: %s", e.metricsURL, resp.Status)
	}
	s, err := parseMetrics(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", e.metricsURL, err)
	}
	return s, nil
}

// parseMetrics reads the Prometheus text format, keeping every sample.
// Timestamps after the value are ignored.
func parseMetrics(r io.Reader) (scrape, error) {
	s := scrape{}
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		// The series ends at the first space after the labels, if any.
		end := strings.LastIndexByte(line, '}') + 1
		sp := strings.IndexByte(line[end:], ' ')
		if sp < 0 {
			return nil, fmt.Errorf("bad sample line %q", line)
		}
		series, rest := line[:end+sp], strings.TrimSpace(line[end+sp:])
		if i := strings.IndexByte(rest, ' '); i >= 0 {
			rest = rest[:i]
		}
		v, err := strconv.ParseFloat(rest, 64)
		if err != nil {
			return nil, fmt.Errorf("bad sample line %q: %w", line, err)
		}
		s[series] = v
	}
	return s, sc.Err()
}

// scrapeOrWarn scrapes, printing a warning to stderr instead of failing:
// the client-side numbers stand without the server's.
func (e *benchEnv) scrapeOrWarn(ctx context.Context, stderr io.Writer, when string) scrape {
	s, err := e.scrape(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "syncgate bench: warning: no server metrics %s: %v\n", when, err)
	}
	return s
}

// ptr returns a pointer to v, for optional JSON fields.
func ptr[T any](v T) *T { return &v }

// optRound rounds *p, keeping nil.
func optRound(p *float64, digits int) *float64 {
	if p == nil {
		return nil
	}
	return ptr(round(*p, digits))
}
