package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/syncgate/syncgate/client"
	"github.com/syncgate/syncgate/frames"
)

// The storm run: N reconnecting sessions on node A, each subscribed to one
// persisted topic, a publisher publishing to it, then A goes away (a
// planned drain, or all at once) and the sessions move to node B. Used by
// `syncgate bench storm` (nodes are child processes) and by the drain
// end-to-end test (nodes in process, sharing one stream log).

// stormConfig says how to run one wave.
type stormConfig struct {
	n        int
	mode     string        // stormPlan or stormCloseAll
	spread   time.Duration // the drain's spread (plan); the window the report is judged by
	rate     float64       // publishes per second
	topic    string        // persisted
	urlA     string        // WebSocket URLs
	urlB     string
	metricsB string // B's /metrics, sampled every 100ms ("" : none)
	dialConc int
	dialHTTP *http.Client
	scrape   *http.Client
	// stopA makes A go away: an admin drain, or SIGKILL. It returns when
	// the order is given; aDone, if set, returns when A has finished
	// (drained and exited) and how.
	stopA func(ctx context.Context) error
	aDone func(ctx context.Context) (time.Duration, error)
	// settle bounds the wait for the wave after A goes.
	settle time.Duration
	// lead is how long the publisher runs before A goes away (default 1s).
	lead time.Duration
}

const (
	stormPlan     = "plan"
	stormCloseAll = "close-all"
)

// stormSession is one measured session.
type stormSession struct {
	c   *client.Client
	sub *client.Subscription

	mu sync.Mutex
	// Guarded by mu.
	scheduled bool
	resumedAt time.Time // on B
	since     time.Time
	connectsB []time.Time
	expired   int
	got       []int64 // message numbers received, in order
	maxGot    int64
}

func (s *stormSession) onEvent(urlB string) func(client.Event) {
	return func(e client.Event) {
		s.mu.Lock()
		defer s.mu.Unlock()
		switch e.Kind {
		case client.EventReconnectScheduled:
			s.scheduled = true
		case client.EventConnected:
			if e.URL == urlB {
				s.connectsB = append(s.connectsB, e.At)
			}
		case client.EventResumed:
			if e.URL == urlB && s.resumedAt.IsZero() {
				s.resumedAt, s.since = e.At, e.Since
			}
		case client.EventCursorExpired:
			s.expired++
		}
	}
}

// stormResult is one wave's figures.
type stormResult struct {
	Mode            string      `json:"mode"`
	N               int         `json:"n"`
	SpreadS         float64     `json:"spread_s"`
	Connected       int         `json:"connected"`
	ReconnectFrames int         `json:"reconnect_frames"`
	Reconnected     int         `json:"reconnected"`               // sessions live on B at the end
	ByDeadline      int         `json:"reconnected_by_deadline"`   // ... within spread + 2s of A going away
	LastS           float64     `json:"last_reconnect_s"`          // after A went away
	PeakAcceptsS    float64     `json:"peak_accepts_per_s"`        // client-side connects to B, busiest 1s window
	PeakAcceptsSrv  *float64    `json:"peak_accepts_per_s_server"` // B's syncgate_sessions_accepted_total, 100ms samples, busiest 1s
	PlanLimit       float64     `json:"plan_limit_per_s"`          // 1.5 × n / spread
	Resubscribe     latencyJSON `json:"resubscribe_ms"`            // from when the session had to move to live on B
	Published       int64       `json:"published"`
	Acked           int64       `json:"acked"`
	PublishErrors   int64       `json:"publish_errors"`
	// Publishes sent and not yet answered when A was told to go away:
	// after a SIGKILL (close-all) such a publish may be in A's log with its
	// ack lost, and the client's resend to B then stores it again in B's
	// (each node has its own log), so it bounds in_both_logs there.
	UnansweredAtStop int64    `json:"unanswered_at_stop"`
	Expired          int      `json:"cursor_expired"`
	Missing          int64    `json:"missing"` // acked messages some subscriber did not get (summed over subscribers)
	Duplicates       int64    `json:"duplicates"`
	Dropped          int64    `json:"dropped_at_cursor"` // patch ops the client dropped as at or before its cursor (Subscription.Duplicates)
	AExitS           *float64 `json:"a_exit_s,omitempty"`
	AExit            string   `json:"a_exit,omitempty"`
	FirstError       string   `json:"first_error,omitempty"`
	acked            []int64
	pubs             map[int64]*pubTimes // every publish sent, by message number; guarded by runStorm until it returns
	start            time.Time           // when A was told to go away
	sessions         []*stormSession
}

// pubTimes is when one publish was sent and (if it was) acknowledged.
type pubTimes struct {
	sent, acked time.Time
}

// runStorm runs one wave and closes every session it opened.
func runStorm(ctx context.Context, cfg stormConfig) (*stormResult, error) {
	r := &stormResult{Mode: cfg.mode, N: cfg.n, SpreadS: cfg.spread.Seconds(),
		PlanLimit: round(1.5*float64(cfg.n)/cfg.spread.Seconds(), 1)}
	opts := func(s *stormSession) *client.Options {
		return &client.Options{BuildID: benchBuildID, HTTPClient: cfg.dialHTTP, Reconnect: true,
			URLFor: func(int) string { return cfg.urlB }, OnEvent: s.onEvent(cfg.urlB)}
	}
	ss := make([]*stormSession, cfg.n)
	r.sessions = ss
	defer func() {
		forEach(context.Background(), len(ss), cfg.dialConc, func(i int) {
			if ss[i] != nil && ss[i].c != nil {
				_ = ss[i].c.Close()
			}
		})
	}()
	var fails firstError
	forEach(ctx, cfg.n, cfg.dialConc, func(i int) {
		s := &stormSession{maxGot: -1}
		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		c, err := client.Dial(dctx, cfg.urlA, opts(s))
		if err != nil {
			fails.record(err)
			return
		}
		s.c = c
		s.sub, err = c.Subscribe(dctx, cfg.topic, nil, func(p *frames.Patch) {
			for _, op := range p.Patches {
				var row struct {
					Data int64 `json:"data"`
				}
				if json.Unmarshal(op.Row, &row) == nil {
					s.mu.Lock()
					s.got = append(s.got, row.Data)
					s.maxGot = max(s.maxGot, row.Data)
					s.mu.Unlock()
				}
			}
		})
		if err != nil {
			fails.record(err)
		}
		ss[i] = s
	})
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for _, s := range ss {
		// A session whose subscribe failed would receive nothing: it is
		// not one the wave can measure.
		if s != nil && s.sub != nil {
			r.Connected++
		}
	}
	if r.Connected < cfg.n {
		return nil, fmt.Errorf("storm: %d of %d sessions connected to A and subscribed; first error: %s", r.Connected, cfg.n, fails.first())
	}

	// The publisher: a reconnecting client of its own, moved like the rest.
	pub, err := client.Dial(ctx, cfg.urlA, &client.Options{BuildID: benchBuildID, HTTPClient: cfg.dialHTTP, Reconnect: true,
		URLFor: func(int) string { return cfg.urlB }})
	if err != nil {
		return nil, fmt.Errorf("storm: publisher: %w", err)
	}
	defer pub.Close()
	var ackMu sync.Mutex
	var pubErr firstError
	var published, acked atomic.Int64
	r.pubs = make(map[int64]*pubTimes)
	inflight := sync.WaitGroup{}
	pubCtx, stopPub := context.WithCancel(ctx)
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		tick := time.NewTicker(time.Duration(float64(time.Second) / cfg.rate))
		defer tick.Stop()
		for i := int64(0); ; i++ {
			select {
			case <-pubCtx.Done():
				return
			case <-tick.C:
			}
			inflight.Add(1)
			published.Add(1)
			pt := &pubTimes{sent: time.Now()}
			ackMu.Lock()
			r.pubs[i] = pt
			ackMu.Unlock()
			err := pub.PublishAsync(pubCtx, cfg.topic, json.RawMessage(strconv.FormatInt(i, 10)), func(_ string, err error) {
				defer inflight.Done()
				if err != nil {
					pubErr.record(err)
					return
				}
				acked.Add(1)
				ackMu.Lock()
				pt.acked = time.Now()
				r.acked = append(r.acked, i)
				ackMu.Unlock()
			})
			if err != nil {
				inflight.Done()
				published.Add(-1)
				if pubCtx.Err() == nil {
					pubErr.record(err)
				}
				return
			}
		}
	}()
	stopPublisher := func() {
		stopPub()
		<-pubDone
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		done := make(chan struct{})
		go func() { inflight.Wait(); close(done) }()
		select {
		case <-done:
		case <-wctx.Done():
			_ = pub.Close() // fails what is still waiting
			<-done
		}
	}
	defer stopPublisher()

	// Sample B's accept counter.
	var samples []acceptSample
	sampleCtx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	defer func() { stopSampling(); <-sampled }()
	go func() {
		defer close(sampled)
		if cfg.metricsB == "" {
			return
		}
		e := &benchEnv{metricsURL: cfg.metricsB, scrapeHTTP: cfg.scrape}
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			if s, err := e.scrape(sampleCtx); err == nil {
				if v, ok := s.get(metricAccepted); ok {
					samples = append(samples, acceptSample{time.Now(), v})
				}
			}
			select {
			case <-sampleCtx.Done():
				return
			case <-tick.C:
			}
		}
	}()

	// Let the publisher run, then make A go away.
	lead := cfg.lead
	if lead <= 0 {
		lead = time.Second
	}
	if err := sleepCtx(ctx, lead); err != nil {
		return nil, err
	}
	start := time.Now()
	r.start = start
	if err := cfg.stopA(ctx); err != nil {
		return nil, fmt.Errorf("storm: stopping A: %w", err)
	}
	r.UnansweredAtStop = published.Load() - acked.Load() - pubErr.n.Load()
	aExit := make(chan struct{})
	if cfg.aDone != nil {
		go func() {
			defer close(aExit)
			d, err := cfg.aDone(ctx)
			r.AExitS = ptr(round(d.Seconds(), 3))
			r.AExit = "ok"
			if err != nil {
				r.AExit = err.Error()
			}
		}()
	} else {
		close(aExit)
	}

	// Wait for every session to be live on B.
	deadline := time.Now().Add(cfg.settle)
	for {
		moved := 0
		for _, s := range ss {
			s.mu.Lock()
			if !s.resumedAt.IsZero() {
				moved++
			}
			s.mu.Unlock()
		}
		if moved == cfg.n || time.Now().After(deadline) {
			break
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return nil, err
		}
	}
	// One more second of publishing on B, then stop and let deliveries land.
	if err := sleepCtx(ctx, time.Second); err != nil {
		return nil, err
	}
	stopPublisher()
	<-aExit
	stopSampling()
	<-sampled
	slices.Sort(r.acked)
	r.Published, r.Acked, r.PublishErrors = published.Load(), acked.Load(), pubErr.n.Load()
	r.FirstError = pubErr.first()
	last := int64(-1)
	if len(r.acked) > 0 {
		last = r.acked[len(r.acked)-1]
	}
	// Wait (bounded) until every live subscriber has the last acked message.
	waitUntil := time.Now().Add(10 * time.Second)
	for last >= 0 && time.Now().Before(waitUntil) {
		behind := 0
		for _, s := range ss {
			if !s.has(last) {
				behind++
			}
		}
		if behind == 0 {
			break
		}
		if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
			return nil, err
		}
	}
	// Close everything so the handlers' slices are final.
	forEach(context.Background(), len(ss), cfg.dialConc, func(i int) { _ = ss[i].c.Close() })

	hist := newHistogram()
	var connects []time.Time
	limit := start.Add(cfg.spread + 2*time.Second)
	for i, s := range ss {
		if s.scheduled {
			r.ReconnectFrames++
		}
		connects = append(connects, s.connectsB...)
		r.Expired += s.expired
		if !s.resumedAt.IsZero() {
			r.Reconnected++
			if !s.resumedAt.After(limit) {
				r.ByDeadline++
			}
			r.LastS = max(r.LastS, round(s.resumedAt.Sub(start).Seconds(), 3))
			hist.shard(i).record(int64(s.resumedAt.Sub(s.since)))
		}
		if s.sub != nil {
			r.Dropped += s.sub.Duplicates()
		}
		miss, dup := s.check(r.acked)
		r.Missing += miss
		r.Duplicates += dup
	}
	r.Resubscribe = hist.snapshot().json()

	r.PeakAcceptsS = peakPerSecond(connects)
	if len(samples) > 1 {
		r.PeakAcceptsSrv = ptr(peakFromSamples(samples))
	}
	return r, nil
}

// has reports whether the subscriber got message i.
func (s *stormSession) has(i int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxGot >= i
}

// check counts acked messages the subscriber missed, and messages it got
// more than once. Only messages published after it subscribed count: the
// publisher starts after every session is subscribed.
func (s *stormSession) check(acked []int64) (missing, dups int64) {
	seen := make(map[int64]int, len(s.got))
	for _, v := range s.got {
		seen[v]++
		if seen[v] == 2 {
			dups++
		}
	}
	for _, v := range acked {
		if seen[v] == 0 {
			missing++
		}
	}
	return missing, dups
}

type acceptSample struct {
	at time.Time
	v  float64
}

// peakPerSecond returns the most timestamps in any 1s window.
func peakPerSecond(ts []time.Time) float64 {
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	best, j := 0, 0
	for i := range ts {
		for ts[i].Sub(ts[j]) >= time.Second {
			j++
		}
		best = max(best, i-j+1)
	}
	return float64(best)
}

// peakFromSamples returns the largest counter increase over any 1s span
// of the samples (taken every 100ms).
func peakFromSamples(ss []acceptSample) float64 {
	best := 0.0
	j := 0
	for i := range ss {
		for ss[i].at.Sub(ss[j].at) > time.Second+50*time.Millisecond {
			j++
		}
		best = max(best, ss[i].v-ss[j].v)
	}
	return best
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// metricAccepted counts the WebSocket upgrades a node accepted.
const metricAccepted = "syncgate_sessions_accepted_total"
