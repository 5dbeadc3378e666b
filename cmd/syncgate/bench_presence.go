package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/syncgate/syncgate/frames"
)

// bench presence: -members sessions join the presence of one topic, then
// each updates its meta -rate times a second for -dur, staggered; -observers
// other sessions only subscribe to the topic. Phases:
//
//  1. setup: observers, then members, dial and subscribe (not measured);
//  2. joins: member i sends its join at i/members of -join-spread; a
//     sample of observers times each member from its join's send until
//     it first appears in a presence frame (join-to-observed);
//  3. updates (the measured window, server CPU scraped around it): member i
//     sends update k at (i/members + k)/rate; every observer counts
//     presence frames and member entries, the sample times each update
//     entry from its send (update-to-observed).

// presenceResult is the JSON line of bench presence.
type presenceResult struct {
	Bench       string  `json:"bench"`
	URL         string  `json:"url"`
	Topic       string  `json:"topic"`
	Members     int     `json:"members"`
	Observers   int     `json:"observers"`
	Sample      int     `json:"sample_observers"`
	Rate        float64 `json:"rate"` // updates per member per second
	DurS        float64 `json:"dur_s"`
	JoinSpreadS float64 `json:"join_spread_s"`
	MetaSize    int     `json:"meta_size"`

	Joins            int64       `json:"joins"`
	JoinsAcked       int64       `json:"joins_acked"`
	JoinToObserved   latencyJSON `json:"join_to_observed_ms"`
	JoinsUnobserved  int64       `json:"joins_unobserved"` // (sample observer, member) pairs never seen
	JoinP99Target    float64     `json:"join_p99_target_ms"`
	JoinP99TargetMet bool        `json:"join_p99_target_met"`

	Updates              int64       `json:"updates"`
	UpdatesPerS          float64     `json:"updates_per_s"`
	UpdatesAcked         int64       `json:"updates_acked"`
	Behind               int64       `json:"behind"` // updates due in the window but not sent
	UpdateToObserved     latencyJSON `json:"update_to_observed_ms"`
	UpdatesObservedRatio float64     `json:"updates_observed_ratio"` // on the sample: timed / (sent × sample)

	FramesPerObserverPerS  float64  `json:"presence_frames_per_observer_per_s"`
	OpsPerObserverPerS     float64  `json:"presence_ops_per_observer_per_s"`
	OpsPerFrame            float64  `json:"presence_ops_per_frame"`
	ServerCPUUsPerUpdate   *float64 `json:"server_cpu_us_per_update"`
	Errors                 int64    `json:"errors"` // error acks + failed sends
	FirstError             string   `json:"first_error,omitempty"`
	ObserverDisconnects    int      `json:"observer_disconnects"`
	MemberDisconnects      int      `json:"member_disconnects"`
	FirstDisconnect        string   `json:"first_disconnect,omitempty"`
	Undecodable            int64    `json:"undecodable"`
	ObserverOtherFrames    int64    `json:"observer_other_frames"`
	LatencyMethod          string   `json:"latency_method"`
	ObserverFramesCounted  int64    `json:"observer_presence_frames"`
	ObserverEntriesCounted int64    `json:"observer_presence_ops"`

	cpuJSON
}

// joinP99Target is issue 5's bound on p99 join-to-observed.
const joinP99Target = 250 * time.Millisecond

type presenceFlags struct {
	members, observers, sample, metaSize int
	rate                                 float64
	dur, joinSpread, wait                time.Duration
	topic                                string
}

func benchPresence(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		b benchFlags
		p presenceFlags
	)
	fs := newFlagSet("presence", "-members N -observers N -dur T [-rate R] [flags]")
	b.register(fs)
	fs.IntVar(&p.members, "members", 1000, "sessions that join the topic's presence and update their meta")
	fs.IntVar(&p.observers, "observers", 1000, "sessions that only subscribe to the topic")
	fs.IntVar(&p.sample, "sample", 50, "observers that decode every presence frame to time joins and updates (the rest only count)")
	fs.Float64Var(&p.rate, "rate", 1, "meta updates per member per second, staggered across members")
	fs.DurationVar(&p.dur, "dur", 10*time.Second, "length of the update window (the measured one)")
	fs.DurationVar(&p.joinSpread, "join-spread", time.Second, "members' joins are spread evenly over this, before the update window")
	fs.DurationVar(&p.wait, "wait", 5*time.Second, "after the joins and after the window, how long to wait for acks and presence frames")
	fs.IntVar(&p.metaSize, "meta-size", 64, fmt.Sprintf("bytes of each member's meta (send times + padding; at least %d, at most %d)", minPresenceMeta, maxPresenceMeta))
	fs.StringVar(&p.topic, "topic", "bench:presence", "the topic")
	if err := parseFlags(fs, args, stdout, stderr); err != nil {
		return err
	}
	switch {
	case p.members < 1 || p.observers < 1:
		return errors.New("bench: -members and -observers must be at least 1")
	case p.sample < 1:
		return errors.New("bench: -sample must be at least 1")
	case !(p.rate > 0) || math.IsInf(p.rate, 0):
		return errors.New("bench: -rate must be positive")
	case p.dur <= 0 || p.joinSpread < 0 || p.wait < 0:
		return errors.New("bench: -dur must be positive, -join-spread and -wait not negative")
	case p.metaSize > maxPresenceMeta:
		return fmt.Errorf("bench: -meta-size must be at most %d", maxPresenceMeta)
	case p.joinSpread+p.dur+2*p.wait >= b.timeout:
		return fmt.Errorf("bench: -timeout (%s) must exceed -join-spread + -dur + 2×-wait (%s) plus setup time",
			b.timeout, p.joinSpread+p.dur+2*p.wait)
	}
	p.metaSize = max(p.metaSize, minPresenceMeta)
	p.sample = min(p.sample, p.observers)
	conns := p.members + p.observers
	e, err := b.setup(ctx, conns)
	if err != nil {
		return err
	}
	defer e.close()
	e.warnPorts(stderr, conns)
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()

	var (
		counting atomic.Bool
		errs     firstError
	)
	joinHist, updateHist := newHistogram(), newHistogram()

	// 1. Setup: observers first, so that they see every join.
	obs := make([]*presObserver, p.observers)
	var fails firstError
	forEach(ctx, p.observers, b.dialConcurrency, func(i int) {
		o := &presObserver{counting: &counting}
		if i < p.sample {
			o.joinHist, o.updateHist, o.seen = joinHist.shard(i), updateHist.shard(i), map[string]struct{}{}
		}
		c, err := e.dialPresence(ctx, "", p.topic, o.handle)
		if err != nil {
			fails.record(fmt.Errorf("observer: %w", err))
			return
		}
		o.conn = c
		obs[i] = o
	})
	defer forEach(context.Background(), len(obs), b.dialConcurrency, func(i int) {
		if obs[i] != nil {
			obs[i].conn.Close()
		}
	})
	run := strconv.FormatUint(rand.Uint64()%(1<<32), 36) // member ids unique to this run
	mems := make([]*presMember, p.members)
	if fails.n.Load() == 0 {
		forEach(ctx, p.members, b.dialConcurrency, func(i int) {
			m := &presMember{joined: make(chan struct{}), errors: &errs}
			c, err := e.dialPresence(ctx, "bench-"+run+"-"+strconv.Itoa(i), p.topic, m.handle)
			if err != nil {
				fails.record(fmt.Errorf("member: %w", err))
				return
			}
			m.conn = c
			mems[i] = m
		})
	}
	// Members close first (deferred calls run last-in first-out).
	defer forEach(context.Background(), len(mems), b.dialConcurrency, func(i int) {
		if mems[i] != nil {
			mems[i].conn.Close()
		}
	})
	if ctx.Err() != nil {
		return runErr(ctx, b)
	}
	if n := fails.n.Load(); n > 0 {
		return fmt.Errorf("bench: %d of %d sessions failed to open; first: %s", n, conns, fails.first())
	}
	fmt.Fprintf(stdout, "presence: %d members + %d observers (%d timing) on %s; joins over %s, then %g updates/member/s for %s, %d-byte meta\n",
		p.members, p.observers, p.sample, p.topic, p.joinSpread, p.rate, p.dur, p.metaSize)

	// 2. Joins.
	var joins atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for i, m := range mems {
		wg.Go(func() {
			at := start.Add(time.Duration(float64(p.joinSpread) * float64(i) / float64(p.members)))
			if !sleepUntil(ctx, at) {
				return
			}
			t := time.Now()
			m.joinSent = t.UnixNano()
			meta := appendPresenceMeta(nil, m.joinSent, m.joinSent, p.metaSize)
			err := m.conn.send(ctx, &frames.Presence{Topic: p.topic, Op: frames.PresenceJoin,
				Members: []frames.Member{{Meta: meta, UpdatedAt: t.UnixMilli()}}})
			if err != nil {
				errs.record(fmt.Errorf("join: %w", err))
				m.joinOnce.Do(func() { close(m.joined) })
				return
			}
			joins.Add(1)
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return runErr(ctx, b)
	}
	joinDeadline := time.Now().Add(p.wait)
	waitFor(ctx, joinDeadline, func() bool {
		for _, m := range mems {
			select {
			case <-m.joined:
			default:
				return false
			}
		}
		for _, o := range obs[:p.sample] {
			if o.seenN.Load() < int64(p.members) {
				return false
			}
		}
		return true
	})
	if ctx.Err() != nil {
		return runErr(ctx, b)
	}
	joinsAcked := int64(0)
	for _, m := range mems {
		joinsAcked += min(m.acks.Load(), 1)
	}
	var unobserved int64
	for _, o := range obs[:p.sample] {
		unobserved += max(0, int64(p.members)-o.seenN.Load())
	}

	// 3. Updates.
	perMember := int64(math.Ceil(p.rate * p.dur.Seconds())) // at most; member i's last may fall past the window
	var updates, behind atomic.Int64
	win := e.startCPU(ctx, stderr)
	counting.Store(true)
	wstart := time.Now()
	wend := wstart.Add(p.dur)
	for i, m := range mems {
		wg.Go(func() {
			var meta []byte
			j := m.joinSent // repeated in every update's meta
			for k := range perMember {
				off := time.Duration((float64(i)/float64(p.members) + float64(k)) / p.rate * float64(time.Second))
				if off >= p.dur {
					return
				}
				if !sleepUntil(ctx, wstart.Add(off)) {
					return
				}
				if time.Now().After(wend.Add(time.Second)) { // a second behind: give up on the rest
					behind.Add(perMember - k)
					return
				}
				t := wstart.Add(off) // when it was due: lateness counts (see pace)
				meta = appendPresenceMeta(meta[:0], j, t.UnixNano(), p.metaSize)
				if err := m.conn.send(ctx, &frames.Presence{Topic: p.topic, Op: frames.PresenceUpdate,
					Members: []frames.Member{{Meta: meta, UpdatedAt: t.UnixMilli()}}}); err != nil {
					errs.record(fmt.Errorf("update: %w", err))
					return
				}
				updates.Add(1)
			}
		})
	}
	wg.Wait()
	counting.Store(false)
	wspan := time.Since(wstart)
	if ctx.Err() != nil {
		return runErr(ctx, b)
	}
	sent := updates.Load()
	waitFor(ctx, time.Now().Add(p.wait), func() bool {
		var acked int64
		for _, m := range mems {
			acked += m.acks.Load() + m.errs.Load()
		}
		if acked < joins.Load()+sent {
			return false
		}
		for _, o := range obs[:p.sample] {
			if o.updates.Load() < sent {
				// Coalescing may merge a member's updates (rate above
				// 1/window): stop once frames have stopped coming.
				return time.Since(time.Unix(0, o.lastFrame.Load())) > 500*time.Millisecond
			}
		}
		return true
	})
	if ctx.Err() != nil {
		return runErr(ctx, b)
	}
	cpu := win.stop(ctx, e, stderr, 0)

	r := presenceResult{
		Bench: "presence", URL: b.url, Topic: p.topic, Members: p.members, Observers: p.observers, Sample: p.sample,
		Rate: p.rate, DurS: p.dur.Seconds(), JoinSpreadS: p.joinSpread.Seconds(), MetaSize: p.metaSize,
		Joins: joins.Load(), JoinsAcked: joinsAcked, JoinToObserved: joinHist.snapshot().json(), JoinsUnobserved: unobserved,
		JoinP99Target: float64(joinP99Target.Milliseconds()),
		Updates:       sent, UpdatesPerS: perSecond(float64(sent), wspan), Behind: behind.Load(),
		UpdateToObserved: updateHist.snapshot().json(), LatencyMethod: histMethod,
		cpuJSON: cpu,
	}
	r.JoinP99TargetMet = r.JoinToObserved.Count > 0 && unobserved == 0 && r.JoinToObserved.P99 <= r.JoinP99Target
	var memberAcks int64
	for _, m := range mems {
		memberAcks += m.acks.Load()
		r.Errors += m.errs.Load()
		if err := m.conn.Err(); err != nil {
			r.MemberDisconnects++
			if r.FirstDisconnect == "" {
				r.FirstDisconnect = "member: " + err.Error()
			}
		}
	}
	r.UpdatesAcked = max(0, memberAcks-joinsAcked)
	r.Errors = max(r.Errors, errs.n.Load())
	r.FirstError = errs.first()
	var timed int64
	for i, o := range obs {
		r.ObserverFramesCounted += o.frames.Load()
		r.ObserverEntriesCounted += o.entries.Load()
		r.ObserverOtherFrames += o.other.Load()
		r.Undecodable += o.undecodable.Load()
		if i < p.sample {
			timed += o.updates.Load()
		}
		if err := o.conn.Err(); err != nil {
			r.ObserverDisconnects++
			if r.FirstDisconnect == "" {
				r.FirstDisconnect = "observer: " + err.Error()
			}
		}
	}
	r.FramesPerObserverPerS = perSecond(float64(r.ObserverFramesCounted)/float64(p.observers), wspan)
	r.OpsPerObserverPerS = perSecond(float64(r.ObserverEntriesCounted)/float64(p.observers), wspan)
	r.OpsPerFrame = round(ratio(float64(r.ObserverEntriesCounted), float64(r.ObserverFramesCounted)), 2)
	r.UpdatesObservedRatio = round(ratio(float64(timed), float64(sent)*float64(p.sample)), 4)
	if cpu.ServerCores != nil && sent > 0 { // cores × window: rounding costs < 0.1%
		r.ServerCPUUsPerUpdate = ptr(round(*cpu.ServerCores*cpu.WindowS/float64(sent)*1e6, 2))
	}

	met := "NOT met"
	if r.JoinP99TargetMet {
		met = "met"
	}
	fmt.Fprintf(stdout, "  joins      %d sent, %d acked; join-to-observed (%d samples) %s; %d unobserved; p99 ≤ %gms %s\n",
		r.Joins, r.JoinsAcked, r.JoinToObserved.Count, r.JoinToObserved, r.JoinsUnobserved, r.JoinP99Target, met)
	fmt.Fprintf(stdout, "  updates    %d sent (%.1f/s, %d behind), %d acked; update-to-observed (%d samples, ratio %.4f) %s\n",
		r.Updates, r.UpdatesPerS, r.Behind, r.UpdatesAcked, r.UpdateToObserved.Count, r.UpdatesObservedRatio, r.UpdateToObserved)
	fmt.Fprintf(stdout, "  observers  %.2f presence frames/s each, %.1f member entries/s each (%.1f per frame)\n",
		r.FramesPerObserverPerS, r.OpsPerObserverPerS, r.OpsPerFrame)
	s := "n/a"
	if r.ServerCPUUsPerUpdate != nil {
		s = fmt.Sprintf("%.1f µs", *r.ServerCPUUsPerUpdate)
	}
	fmt.Fprintf(stdout, "  server     %s CPU per update (every update fanned out to %d sessions)\n", s, conns)
	fmt.Fprintf(stdout, "  %s\n", r.cpuJSON)
	fmt.Fprintf(stdout, "  errors     %d (%d undecodable); %d observers, %d members disconnected\n",
		r.Errors, r.Undecodable, r.ObserverDisconnects, r.MemberDisconnects)
	if r.FirstError != "" {
		fmt.Fprintf(stdout, "             first error: %s\n", r.FirstError)
	}
	if r.FirstDisconnect != "" {
		fmt.Fprintf(stdout, "             first disconnect: %s\n", r.FirstDisconnect)
	}
	return writeJSON(stdout, r)
}

// sleepUntil sleeps until t; false if ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-tm.C:
		return true
	}
}

// waitFor polls done every 20ms until it is true, deadline passes or ctx
// ends.
func waitFor(ctx context.Context, deadline time.Time, done func() bool) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !done() && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
