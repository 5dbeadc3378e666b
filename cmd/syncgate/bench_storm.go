package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/syncgate/syncgate/storage"
)

// syncgate bench storm: the reconnect wave of a deploy, measured. Two
// nodes, A and B, run as child processes of this binary (`serve` on
// 127.0.0.1, port 0, each on a fresh temp data dir); N reconnecting
// sessions (package client, URLFor: B) connect to A and subscribe to one
// persisted topic while a publisher, itself a reconnecting session, publishes
// to it; then A goes away and the sessions move to B:
//
//   - plan: POST /v1/admin/drain to A, which gives every session its own
//     slot in -spread and exits 0 after it;
//   - close-all: SIGKILL to A. Every connection ends at once, nobody sends
//     a reconnect frame, and the clients fall back to full-jitter backoff.
//
// Measured at B: accepts per second (B's syncgate_sessions_accepted_total
// sampled every 100ms; also the client-side log of connects to B), time to
// resubscribe, sessions live on B by spread + 2s, and A's exit.
//
// Messages lost. Each node has its own data dir, so a persisted topic's log
// is per node: a record appended to A stays in A's log. After both nodes
// have exited the bench opens both streams.db files and checks:
//
//   - lost_acked: acknowledged publishes found in neither log, and
//     in_both_logs / stored_twice: found more than once (a publish whose
//     ack was lost and that the client re-sent to B). These are the
//     target's "acknowledged messages lost". A drain answers every
//     publish before it closes, so plan mode has none in both logs; after
//     close-all's SIGKILL, a publish A stored whose ack died with it is
//     stored again by B (each node has its own log), so there
//     in_both_logs is at most unanswered_at_stop.
//   - missed: summed over subscribers, the acknowledged messages a
//     subscriber had to receive and did not: those in A's log acknowledged
//     before its move began (the scheduled reconnect time, or when it lost
//     A), and those in B's log whose publish was sent after it was live on
//     B. Messages in between are in the other node's log while the
//     subscriber is not on that node; with a shared stream log (two nodes
//     on one storage, as in the drain end-to-end test) they would be
//     replayed from the cursor, here they cannot be. They are counted as
//     unseen_split, not as lost.
//   - duplicates: a message number a subscriber got more than once.

const stormSynopsis = "-n N [-spread 30s] [-mode plan|close-all|both] [-rate R] [-dur T]"

// stormTopic is the persisted topic of the bench; stormPersist its pattern.
const (
	stormTopic   = "storm:bench"
	stormPersist = "storm:*"
)

// stormReport is the bench's JSON line.
type stormReport struct {
	Bench  string       `json:"bench"`
	N      int          `json:"n"`
	Spread float64      `json:"spread_s"`
	Grace  float64      `json:"grace_s"`
	Rate   float64      `json:"rate_per_s"`
	BRate  string       `json:"b_accept_rate"`
	Modes  []stormFinal `json:"modes"`
}

// stormFinal is one mode's figures: runStorm's and the logs'.
type stormFinal struct {
	stormResult
	PctByDeadline float64 `json:"pct_reconnected_by_deadline"`
	LostAcked     int64   `json:"lost_acked"`
	InBothLogs    int64   `json:"in_both_logs"`
	StoredTwice   int64   `json:"stored_twice"`
	InALog        int64   `json:"in_a_log"`
	InBLog        int64   `json:"in_b_log"`
	Missed        int64   `json:"missed"`
	MissedA       int64   `json:"missed_a"`
	MissedB       int64   `json:"missed_b"`
	// MissedAWindowMS is the longest a missed A-message was acknowledged
	// before its subscriber's move began: the seam A closes on.
	MissedAWindowMS float64 `json:"missed_a_window_ms"`
	UnseenSplit     int64   `json:"unseen_split"`
	BProfile        string  `json:"b_cpu_profile,omitempty"`
}

func benchStorm(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("storm", stormSynopsis)
	var b benchFlags
	fs.IntVar(&b.dialConcurrency, "dial-concurrency", 200, "sessions dialled (or closed) at once")
	fs.DurationVar(&b.dialTimeout, "dial-timeout", 30*time.Second, "bound on one session's first dial + hello + subscribe")
	fs.DurationVar(&b.timeout, "timeout", 10*time.Minute, "hard bound on the whole run")
	fs.StringVar(&b.cpuProfile, "cpuprofile", "", "write the bench process's own CPU profile to this file")
	fs.StringVar(&b.sourceIPs, "source-ips", "", "comma-separated local IPs to dial from, round robin")
	n := fs.Int("n", 10000, "sessions")
	spread := fs.Duration("spread", 30*time.Second, "A's drain spread (plan); both modes are judged by spread + 2s")
	grace := fs.Duration("grace", 5*time.Second, "A's drain grace")
	mode := fs.String("mode", "both", "plan, close-all, or both (plan first, each on fresh nodes)")
	rate := fs.Float64("rate", 2, "publishes per second to the topic every session subscribes to (each reaches all N)")
	dur := fs.Duration("dur", time.Second, "how long the publisher runs on A before A goes away")
	bRate := fs.String("accept-rate", "off", "node B's accept budget (per second, or off): off measures the clients' own wave")
	profB := fs.String("profile-b", "", "write a CPU profile of node B over the wave (spread + 2s) to this file (.plan/.close-all added with -mode both)")
	if err := parseFlags(fs, args, stdout, stderr); err != nil {
		return err
	}
	modes := []string{*mode}
	switch *mode {
	case stormPlan, stormCloseAll:
	case "both":
		modes = []string{stormPlan, stormCloseAll}
	default:
		return fmt.Errorf("bench: -mode: want plan, close-all or both, got %q", *mode)
	}
	switch {
	case *n < 1:
		return errors.New("bench: -n must be at least 1")
	case *spread < 100*time.Millisecond:
		return errors.New("bench: -spread must be at least 100ms")
	case *grace <= 0:
		return errors.New("bench: -grace must be positive")
	case !(*rate > 0) || *rate > 1e9:
		// The publisher ticks every second/rate: at least 1ns.
		return errors.New("bench: -rate must be positive and at most 1e9")
	case *dur <= 0:
		return errors.New("bench: -dur must be positive")
	}
	if *bRate != "off" {
		if v, err := strconv.ParseFloat(*bRate, 64); err != nil || v <= 0 {
			return fmt.Errorf("bench: -accept-rate: want a positive number or off, got %q", *bRate)
		}
	}
	b.url = "ws://127.0.0.1/v1/ws" // nodes are always on loopback
	// One per session and the publisher, and headroom for the sessions
	// that hold two while they take over (make-before-break).
	env, err := b.setup(ctx, *n+*n/2+1)
	if err != nil {
		return err
	}
	defer env.close()
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()

	rep := stormReport{Bench: "storm", N: *n, Spread: spread.Seconds(), Grace: grace.Seconds(), Rate: *rate, BRate: *bRate}
	for _, m := range modes {
		sc := stormCmd{env: env, n: *n, mode: m, spread: *spread, grace: *grace, rate: *rate, lead: *dur,
			bRate: *bRate, stderr: stderr}
		if *profB != "" {
			sc.profile = *profB
			if len(modes) > 1 {
				sc.profile += "." + m
			}
		}
		fmt.Fprintf(stderr, "storm %s: %d sessions to A...\n", m, *n)
		f, err := sc.run(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return runErr(ctx, b)
			}
			return fmt.Errorf("bench storm %s: %w", m, err)
		}
		rep.Modes = append(rep.Modes, *f)
	}
	printStorm(stdout, rep)
	return writeJSON(stdout, rep)
}

// stormCmd runs one mode on fresh nodes.
type stormCmd struct {
	env     *benchEnv
	n       int
	mode    string
	spread  time.Duration
	grace   time.Duration
	rate    float64
	lead    time.Duration
	bRate   string
	profile string
	stderr  io.Writer
}

func (sc *stormCmd) run(ctx context.Context) (*stormFinal, error) {
	dir, err := os.MkdirTemp("", "syncgate-storm-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	var tok [16]byte
	_, _ = rand.Read(tok[:])
	token := hex.EncodeToString(tok[:])
	common := []string{"-addr", "127.0.0.1:0", "-persist", stormPersist, "-admin-token", token,
		"-max-sessions", "off", "-log-level", "warn"}
	a, err := startNode(ctx, "A", filepath.Join(dir, "a"), append(common,
		"-drain-spread", sc.spread.String(), "-drain-grace", sc.grace.String(), "-accept-rate", "off"))
	if err != nil {
		return nil, err
	}
	defer a.kill()
	bArgs := append(common, "-drain-spread", "0s", "-drain-grace", "5s", "-accept-rate", sc.bRate)
	var debugAddr string
	if sc.profile != "" {
		if debugAddr, err = freeLoopbackAddr(); err != nil {
			return nil, err
		}
		bArgs = append(bArgs, "-debug-addr", debugAddr)
	}
	b, err := startNode(ctx, "B", filepath.Join(dir, "b"), bArgs)
	if err != nil {
		return nil, err
	}
	defer b.kill()

	var profErr error
	profDone := make(chan struct{})
	close(profDone)
	stopA := func(ctx context.Context) error {
		if sc.profile != "" {
			profDone = make(chan struct{})
			go func() {
				defer close(profDone)
				profErr = fetchProfile(ctx, "http://"+debugAddr, sc.spread+2*time.Second, sc.profile)
			}()
		}
		if sc.mode == stormCloseAll {
			return a.cmd.Process.Signal(syscall.SIGKILL)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+a.addr+"/v1/admin/drain", nil)
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := sc.env.scrapeHTTP.Do(req)
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return fmt.Errorf("POST /v1/admin/drain: %s: %s", resp.Status, bytes.TrimSpace(body))
		}
		return nil
	}
	var stopAt time.Time
	aDone := func(ctx context.Context) (time.Duration, error) {
		select {
		case <-a.done:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		return time.Since(stopAt), a.exitErr()
	}
	r, err := runStorm(ctx, stormConfig{
		n: sc.n, mode: sc.mode, spread: sc.spread, rate: sc.rate, topic: stormTopic, lead: sc.lead,
		urlA: "ws://" + a.addr + "/v1/ws", urlB: "ws://" + b.addr + "/v1/ws", metricsB: "http://" + b.addr + "/metrics",
		dialConc: sc.env.flags.dialConcurrency, dialHTTP: sc.env.dialHTTP, scrape: sc.env.scrapeHTTP,
		stopA: func(ctx context.Context) error {
			stopAt = time.Now()
			return stopA(ctx)
		},
		aDone:  aDone,
		settle: sc.spread + sc.grace + 10*time.Second,
	})
	<-profDone
	if err != nil {
		return nil, fmt.Errorf("%w%s%s", err, a.tail(), b.tail())
	}
	if profErr != nil {
		fmt.Fprintf(sc.stderr, "syncgate bench: warning: profile of B: %v\n", profErr)
	}
	// B: every session is closed; it drains at once and exits.
	if err := b.stop(ctx, 20*time.Second); err != nil {
		fmt.Fprintf(sc.stderr, "syncgate bench: warning: node B: %v%s\n", err, b.tail())
	}
	if sc.mode == stormCloseAll {
		r.AExit = "killed (SIGKILL)"
	}
	f := &stormFinal{stormResult: *r, PctByDeadline: round(100*float64(r.ByDeadline)/float64(sc.n), 2)}
	if sc.profile != "" && profErr == nil {
		f.BProfile = sc.profile
	}
	logA, err := readStormLog(ctx, filepath.Join(dir, "a", "streams.db"))
	if err != nil {
		return nil, fmt.Errorf("node A's log: %w", err)
	}
	logB, err := readStormLog(ctx, filepath.Join(dir, "b", "streams.db"))
	if err != nil {
		return nil, fmt.Errorf("node B's log: %w", err)
	}
	f.checkLogs(logA, logB)
	return f, nil
}

// checkLogs fills the log-based counts; see the comment at the top of the
// file for the definitions.
func (f *stormFinal) checkLogs(logA, logB map[int64]int) {
	r := &f.stormResult
	defer func() { f.Missed = f.MissedA + f.MissedB }()
	f.InALog, f.InBLog = int64(len(logA)), int64(len(logB))
	for _, i := range r.acked {
		na, nb := logA[i], logB[i]
		switch {
		case na+nb == 0:
			f.LostAcked++
		case na > 0 && nb > 0:
			f.InBothLogs++
		case na > 1 || nb > 1:
			f.StoredTwice++
		}
	}
	for _, s := range r.sessions {
		if s == nil {
			continue
		}
		got := make(map[int64]bool, len(s.got))
		for _, v := range s.got {
			got[v] = true
		}
		for _, i := range r.acked {
			if got[i] {
				continue
			}
			pt := r.pubs[i]
			needA := logA[i] > 0 && !s.since.IsZero() && pt.acked.Before(s.since) ||
				logA[i] > 0 && s.since.IsZero() && pt.acked.Before(r.start)
			needB := logB[i] > 0 && !s.resumedAt.IsZero() && pt.sent.After(s.resumedAt)
			switch {
			case needA:
				f.MissedA++
				if !s.since.IsZero() {
					f.MissedAWindowMS = max(f.MissedAWindowMS, round(float64(s.since.Sub(pt.acked))/1e6, 1))
				}
			case needB:
				f.MissedB++
			default:
				f.UnseenSplit++
			}
		}
	}
}

// readStormLog opens a node's stream log after the node has exited and
// counts each message number in the bench topic.
func readStormLog(ctx context.Context, file string) (map[int64]int, error) {
	db, err := storage.Open(file, nil)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	seen := make(map[int64]int)
	after := storage.ZeroOffset
	for {
		res, err := db.Read(ctx, stormTopic, after, 1<<20)
		if errors.Is(err, storage.ErrNotFound) {
			return seen, nil
		}
		if err != nil {
			return nil, err
		}
		for _, rec := range res.Records {
			var row struct {
				Data json.RawMessage `json:"data"`
			}
			if json.Unmarshal(rec.Data, &row) == nil {
				if i, err := strconv.ParseInt(string(row.Data), 10, 64); err == nil {
					seen[i]++
				}
			}
		}
		if len(res.Records) == 0 || res.UpToDate {
			return seen, nil
		}
		after = res.Next
	}
}

// stormNode is a `serve` child process.
type stormNode struct {
	name string
	cmd  *exec.Cmd
	addr string
	done chan struct{} // closed when the process has been waited for
	err  error         // Wait's; read after done
	log  *tailBuffer   // the end of its stderr
}

// startNode starts `serve` with args on a fresh data dir and waits for its
// listening line.
func startNode(ctx context.Context, name, dataDir string, args []string) (*stormNode, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	nd := &stormNode{name: name, done: make(chan struct{}), log: &tailBuffer{max: 8 << 10}}
	nd.cmd = exec.Command(exe, append([]string{"serve", "-data-dir", dataDir}, args...)...)
	nd.cmd.Env = append(os.Environ(), benchChildEnv+"=1")
	nd.cmd.Stderr = nd.log
	out, err := nd.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := nd.cmd.Start(); err != nil {
		return nil, fmt.Errorf("node %s: %w", name, err)
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "syncgate listening on http://"); ok {
				if i := strings.IndexByte(a, ' '); i >= 0 {
					a = a[:i]
				}
				select {
				case addr <- a:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, out)
		nd.err = nd.cmd.Wait()
		close(nd.done)
	}()
	t := time.NewTimer(30 * time.Second)
	defer t.Stop()
	select {
	case nd.addr = <-addr:
		return nd, nil
	case <-nd.done:
		return nil, fmt.Errorf("node %s exited before listening: %v%s", name, nd.err, nd.tail())
	case <-t.C:
	case <-ctx.Done():
	}
	nd.kill()
	return nil, fmt.Errorf("node %s did not start listening%s", name, nd.tail())
}

// exitErr is nil for exit status 0. Call after done.
func (nd *stormNode) exitErr() error {
	if nd.err != nil {
		return fmt.Errorf("node %s: %w", nd.name, nd.err)
	}
	return nil
}

// stop sends SIGTERM and waits up to d, then kills.
func (nd *stormNode) stop(ctx context.Context, d time.Duration) error {
	_ = nd.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-nd.done:
		return nd.exitErr()
	case <-t.C:
	case <-ctx.Done():
	}
	nd.kill()
	return fmt.Errorf("node %s did not exit within %v of SIGTERM; killed", nd.name, d)
}

// kill ends the process if it still runs and waits for it.
func (nd *stormNode) kill() {
	select {
	case <-nd.done:
		return
	default:
	}
	_ = nd.cmd.Process.Kill()
	<-nd.done
}

// tail is the end of the node's stderr, for error messages.
func (nd *stormNode) tail() string {
	s := strings.TrimSpace(nd.log.String())
	if s == "" {
		return ""
	}
	return fmt.Sprintf("\nnode %s stderr (end):\n%s", nd.name, s)
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// freeLoopbackAddr returns a loopback address whose port was free a moment
// ago (for B's -debug-addr, which is not printed on stdout).
func freeLoopbackAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// fetchProfile writes a CPU profile of d from the pprof server at base.
func fetchProfile(ctx context.Context, base string, d time.Duration, file string) error {
	secs := max(1, int(d.Round(time.Second).Seconds()))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/debug/pprof/profile?seconds="+strconv.Itoa(secs), nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Timeout: d + 30*time.Second}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("pprof: %s", resp.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// printStorm prints the modes side by side.
func printStorm(w io.Writer, rep stormReport) {
	fmt.Fprintf(w, "storm: %d sessions, spread %v, publisher %g/s, B's accept budget %s\n",
		rep.N, time.Duration(rep.Spread*float64(time.Second)), rep.Rate, rep.BRate)
	tw := func(label string, f func(m stormFinal) string) {
		fmt.Fprintf(w, "  %-34s", label)
		for _, m := range rep.Modes {
			fmt.Fprintf(w, "  %-22s", f(m))
		}
		fmt.Fprintln(w)
	}
	tw("", func(m stormFinal) string { return m.Mode })
	tw("peak accepts/s at B (server)", func(m stormFinal) string {
		return fmt.Sprintf("%.0f (limit %.0f)", deref(m.PeakAcceptsSrv), m.PlanLimit)
	})
	tw("peak connects/s to B (clients)", func(m stormFinal) string { return fmt.Sprintf("%.0f", m.PeakAcceptsS) })
	tw("reconnect frames", func(m stormFinal) string { return fmt.Sprint(m.ReconnectFrames) })
	tw("reconnected / by spread+2s", func(m stormFinal) string {
		return fmt.Sprintf("%d / %d (%.1f%%)", m.Reconnected, m.ByDeadline, m.PctByDeadline)
	})
	tw("last reconnect after A went", func(m stormFinal) string { return fmt.Sprintf("%.3fs", m.LastS) })
	tw("time to resubscribe p50", func(m stormFinal) string { return fmtMS(m.Resubscribe.P50) })
	tw("time to resubscribe p99", func(m stormFinal) string { return fmtMS(m.Resubscribe.P99) })
	tw("time to resubscribe max", func(m stormFinal) string { return fmtMS(m.Resubscribe.Max) })
	tw("published / acked", func(m stormFinal) string { return fmt.Sprintf("%d / %d", m.Published, m.Acked) })
	tw("acked lost (in no log)", func(m stormFinal) string { return fmt.Sprint(m.LostAcked) })
	tw("acked in both logs / twice", func(m stormFinal) string { return fmt.Sprintf("%d / %d", m.InBothLogs, m.StoredTwice) })
	tw("in A's log / in B's log", func(m stormFinal) string { return fmt.Sprintf("%d / %d", m.InALog, m.InBLog) })
	tw("missed by subscribers (A / B)", func(m stormFinal) string {
		return fmt.Sprintf("%d (%d / %d)", m.Missed, m.MissedA, m.MissedB)
	})
	tw("  missed on A: acked before move <=", func(m stormFinal) string {
		return fmtMS(m.MissedAWindowMS)
	})
	tw("unseen (other node's log)", func(m stormFinal) string { return fmt.Sprint(m.UnseenSplit) })
	tw("duplicates", func(m stormFinal) string { return fmt.Sprint(m.Duplicates) })
	tw("dropped at cursor (client)", func(m stormFinal) string { return fmt.Sprint(m.Dropped) })
	tw("A", func(m stormFinal) string {
		if m.AExitS == nil {
			return m.AExit
		}
		return fmt.Sprintf("%s after %.2fs", m.AExit, *m.AExitS)
	})
	for _, m := range rep.Modes {
		if m.FirstError != "" {
			fmt.Fprintf(w, "  %s: first publish error: %s\n", m.Mode, m.FirstError)
		}
	}
}

// deref is *p, or -1 for nil.
func deref(p *float64) float64 {
	if p == nil {
		return -1
	}
	return *p
}
