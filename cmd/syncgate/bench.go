package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/syncgate/syncgate/client"
)

// syncgate bench is a load generator for a running gateway. Each command
// dials sessions with the client package, drives them, scrapes the
// server's /metrics around the measured window, and prints a human summary
// followed by exactly one JSON line starting with {"bench":"<command>".
//
// Files: bench.go (commands, common flags, connection setup), bench_connect.go,
// bench_fanout.go, bench_topics.go, bench_presence.go, bench_storm.go, bench_floor.go (one command each;
// bench_presence_conn.go holds presence's raw sessions;
// bench_storm_run.go is the storm's wave, shared with the drain test), bench_load.go
// (publisher and subscriber shared by fanout and topics), bench_hist.go
// (latency histogram), bench_metrics.go (/metrics scrape), bench_unix.go and
// bench_other.go (file-descriptor limit, process CPU time).

const benchUsage = `usage: syncgate bench <command> [flags]

Load-test a running gateway (append runs its own in process, storm two as child processes;
floor runs none).
Each command prints a summary, then one JSON line starting with {"bench":"<command>" (grep '^{"bench"').

Commands:
  connect -n N [-hold 2s]                    open N idle sessions: connects/s, connect time,
                                             server RSS per idle session
  fanout  -subs N -rate R -dur T [-size B]   N subscribers on one topic, one publisher:
                                             delivery rate, ratio, latency, CPU
  topics  -n N -rate R -dur T [-size B]      N topics with one subscriber each, one publisher
                                             round-robin: ack and delivery latency, CPU
  presence -members N -observers N -dur T   N members join one topic's presence, then update
           [-rate R]                         their meta R times/s; observers subscribe: presence
                                             frames and ops per observer per second, CPU per
                                             update, join- and update-to-observed latency
  append  [-phases ...] [-dur T]             the stream log in this process on a fresh data dir:
                                             fsynced appends (1 producer, one tx per append,
                                             group commit), Durable Streams HTTP appends and
                                             catch-up read over loopback
  storm   -n N [-spread 30s] [-mode both]    nodes A and B as child processes, N reconnecting
                                             sessions on A; A drains (plan) or is killed
                                             (close-all): accepts/s at B, time to resubscribe,
                                             % reconnected by spread+2s, messages lost
  floor   -subs N -rate R -dur T [-size B]   no gateway: fanout's traffic over plain TCP to a
                                             child process, the machine's lower bound for
                                             fanout's latency and CPU

Common flags: -url, -metrics, -dial-concurrency, -dial-timeout, -timeout,
-allow-remote, -source-ips (storm: none of -url, -metrics, -allow-remote). Run "syncgate bench <command> -h" for all flags.
`

// benchChildEnv marks a process a bench started from its own executable
// (a storm node, a floor sender). Under go test that executable is the test
// binary, which reads it to run its command line instead of tests.
const benchChildEnv = "SYNCGATE_BENCH_CHILD"

// benchBuildID is the build id every bench session sends in hello.
const benchBuildID = "syncgate-bench"

// fdSlack is the file descriptors a bench needs besides one per session:
// stdio, metrics scrapes, the runtime's poller, a margin.
const fdSlack = 64

// stragglerPoll is how often the wait for late deliveries looks for
// subscribers whose connection has ended (they will never catch up).
const stragglerPoll = 100 * time.Millisecond

func bench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, benchUsage)
		return errUsage
	}
	cmd, args := args[0], args[1:]
	switch cmd {
	case "connect":
		return benchConnect(ctx, args, stdout, stderr)
	case "fanout":
		return benchFanout(ctx, args, stdout, stderr)
	case "topics":
		return benchTopics(ctx, args, stdout, stderr)
	case "presence":
		return benchPresence(ctx, args, stdout, stderr)
	case "append":
		return benchAppend(ctx, args, stdout, stderr)
	case "storm":
		return benchStorm(ctx, args, stdout, stderr)
	case "floor":
		return benchFloor(ctx, args, stdout, stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, benchUsage)
		return flag.ErrHelp // asked for: exit 0
	default:
		fmt.Fprintf(stderr, "syncgate bench: unknown command %q\n\n%s", cmd, benchUsage)
		return errUsage
	}
}

// benchFlags are the flags every bench command takes.
type benchFlags struct {
	url             string
	metrics         string
	dialConcurrency int
	dialTimeout     time.Duration
	timeout         time.Duration
	allowRemote     bool
	sourceIPs       string
	cpuProfile      string
}

func (b *benchFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&b.url, "url", "ws://127.0.0.1:8080/v1/ws", "gateway WebSocket URL")
	fs.StringVar(&b.metrics, "metrics", "", "gateway metrics URL (default: http://<host of -url>/metrics)")
	fs.IntVar(&b.dialConcurrency, "dial-concurrency", 200, "sessions dialled (or closed) at once")
	fs.DurationVar(&b.dialTimeout, "dial-timeout", 10*time.Second, "bound on one session's dial + hello (+ subscribe)")
	fs.DurationVar(&b.timeout, "timeout", 2*time.Minute, "hard bound on the whole run")
	fs.BoolVar(&b.allowRemote, "allow-remote", false, "allow a gateway that is not on loopback (127.0.0.0/8, ::1)")
	fs.StringVar(&b.cpuProfile, "cpuprofile", "", "write the bench process's own CPU profile to this file")
	fs.StringVar(&b.sourceIPs, "source-ips", "", "comma-separated local IPs to dial from, round robin (e.g. 127.0.0.2,127.0.0.3): "+
		"each adds ~28k ports toward one server address")
}

// newFlagSet returns a flag set for command name whose usage starts with
// synopsis.
func newFlagSet(name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet("syncgate bench "+name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: syncgate bench %s %s\n\nFlags:\n", name, synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// benchEnv is what a bench command connects with, built by setup from the
// common flags. close releases its idle HTTP connections.
type benchEnv struct {
	flags      benchFlags
	wsURL      string
	metricsURL string
	dialHTTP   *http.Client // WebSocket upgrades
	scrapeHTTP *http.Client // /metrics
	dialer     net.Dialer
	sources    []netip.Addr
	nextSource atomic.Uint64
	profile    *os.File // -cpuprofile, stopped by close
}

// setup validates the common flags, refuses non-loopback targets unless
// -allow-remote, and raises the file-descriptor limit for conns sessions.
// It contacts nothing but the resolver (and not that for IP literals).
func (b benchFlags) setup(ctx context.Context, conns int) (*benchEnv, error) {
	e := &benchEnv{flags: b, wsURL: b.url, metricsURL: b.metrics}
	u, err := url.Parse(b.url)
	if err != nil {
		return nil, fmt.Errorf("bench: -url: %w", err)
	}
	if u.Scheme != "ws" && u.Scheme != "wss" || u.Host == "" {
		return nil, fmt.Errorf("bench: -url: want ws://host:port/path or wss://…, got %q", b.url)
	}
	if e.metricsURL == "" {
		m := url.URL{Scheme: "http", Host: u.Host, Path: "/metrics"}
		if u.Scheme == "wss" {
			m.Scheme = "https"
		}
		e.metricsURL = m.String()
	}
	mu, err := url.Parse(e.metricsURL)
	if err != nil || mu.Scheme != "http" && mu.Scheme != "https" || mu.Host == "" {
		return nil, fmt.Errorf("bench: -metrics: want http://host:port/metrics, got %q", e.metricsURL)
	}
	if !b.allowRemote {
		for _, c := range []struct{ flag, host string }{{"-url", u.Hostname()}, {"-metrics", mu.Hostname()}} {
			if err := checkLoopback(ctx, c.host); err != nil {
				return nil, fmt.Errorf("bench: %s: %w; benchmarks stay on this machine unless you pass -allow-remote", c.flag, err)
			}
		}
	}
	switch {
	case b.dialConcurrency < 1:
		return nil, errors.New("bench: -dial-concurrency must be at least 1")
	case b.dialTimeout <= 0:
		return nil, errors.New("bench: -dial-timeout must be positive")
	case b.timeout <= 0:
		return nil, errors.New("bench: -timeout must be positive")
	}
	for _, s := range strings.Split(b.sourceIPs, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		ip, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("bench: -source-ips: %w", err)
		}
		e.sources = append(e.sources, ip)
	}
	if err := raiseFDLimit(uint64(conns) + fdSlack); err != nil {
		return nil, fmt.Errorf("bench: %d sessions: %w", conns, err)
	}
	if b.cpuProfile != "" {
		f, err := os.Create(b.cpuProfile)
		if err != nil {
			return nil, fmt.Errorf("bench: -cpuprofile: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return nil, fmt.Errorf("bench: -cpuprofile: %w", err)
		}
		e.profile = f
	}

	e.dialer = net.Dialer{Timeout: b.dialTimeout, KeepAlive: -1}
	if !b.allowRemote {
		// Checked again on the address actually dialled, so a name that
		// resolves differently the second time cannot leave loopback.
		e.dialer.Control = loopbackOnly
	}
	e.dialHTTP = &http.Client{Transport: &http.Transport{
		DialContext:         e.dialContext,
		Proxy:               nil, // measure the gateway, not a proxy
		TLSHandshakeTimeout: b.dialTimeout,
		DisableCompression:  true,
	}}
	e.scrapeHTTP = &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			DialContext:       e.dialer.DialContext,
			Proxy:             nil,
			DisableKeepAlives: true, // nothing left open between scrapes
		},
	}
	return e, nil
}

// close releases idle HTTP connections (upgraded ones belong to their
// clients).
func (e *benchEnv) close() {
	if e.profile != nil {
		pprof.StopCPUProfile()
		e.profile.Close()
	}
	e.dialHTTP.CloseIdleConnections()
	e.scrapeHTTP.CloseIdleConnections()
}

func (e *benchEnv) dialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	d := e.dialer
	if n := uint64(len(e.sources)); n > 0 {
		d.LocalAddr = &net.TCPAddr{IP: e.sources[(e.nextSource.Add(1)-1)%n].AsSlice()}
	}
	return d.DialContext(ctx, network, addr)
}

// dial opens one session (upgrade + hello) within -dial-timeout.
func (e *benchEnv) dial(ctx context.Context) (*client.Client, error) {
	ctx, cancel := context.WithTimeout(ctx, e.flags.dialTimeout)
	defer cancel()
	return client.Dial(ctx, e.wsURL, &client.Options{BuildID: benchBuildID, HTTPClient: e.dialHTTP})
}

// checkLoopback returns an error unless every address host stands for is
// loopback. An IP literal is checked without a lookup.
func checkLoopback(ctx context.Context, host string) error {
	if host == "" {
		return errors.New("no host")
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if !ip.Unmap().IsLoopback() {
			return fmt.Errorf("host %s is not loopback (127.0.0.0/8 or ::1)", host)
		}
		return nil
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return fmt.Errorf("resolving %s: %w", host, err)
	}
	for _, ip := range ips {
		if !ip.Unmap().IsLoopback() {
			return fmt.Errorf("host %s resolves to %s, which is not loopback (127.0.0.0/8 or ::1)", host, ip)
		}
	}
	return nil
}

// loopbackOnly is a net.Dialer Control func that refuses to connect to a
// non-loopback address.
func loopbackOnly(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("bench: dialling %s: %w", address, err)
	}
	if !ap.Addr().Unmap().IsLoopback() {
		return fmt.Errorf("bench: refusing to dial %s: not loopback (pass -allow-remote)", address)
	}
	return nil
}

// warnPorts notes on stderr when conns sessions from one source address to
// one server address may exhaust the ephemeral port range.
func (e *benchEnv) warnPorts(stderr io.Writer, conns int) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return
	}
	lo, err1 := strconv.Atoi(f[0])
	hi, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		return
	}
	if ports := (hi - lo + 1) * max(1, len(e.sources)); conns > ports {
		fmt.Fprintf(stderr, "syncgate bench: warning: %d sessions but only %d ephemeral ports toward one server address "+
			"(ip_local_port_range %d-%d); add -source-ips 127.0.0.2,127.0.0.3,…\n", conns, ports, lo, hi)
	}
}

// forEach calls fn(i) for i in [0, n) on at most conc goroutines and waits
// for them. It stops handing out work once ctx ends.
func forEach(ctx context.Context, n, conc int, fn func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(n, conc) {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				fn(i)
			}
		})
	}
	wg.Wait()
}

// closeAll closes every non-nil client, conc at a time, and waits. It runs
// whatever the state of the bench's context, so no connection outlives a
// bench.
func closeAll(conc int, cs []*client.Client) {
	forEach(context.Background(), len(cs), conc, func(i int) {
		if cs[i] != nil {
			_ = cs[i].Close()
		}
	})
}

// firstError counts errors and keeps the first. Safe for concurrent use.
type firstError struct {
	n   atomic.Int64
	mu  sync.Mutex
	err error // guarded by mu
}

func (f *firstError) record(err error) {
	f.n.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil {
		f.err = err
	}
}

// first returns the first error's text, or "".
func (f *firstError) first() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil {
		return ""
	}
	return f.err.Error()
}

// runErr turns the end of the bench's context into an error that says
// which bound ended it.
func runErr(ctx context.Context, b benchFlags) error {
	if errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
		return fmt.Errorf("bench: -timeout %s reached before the run finished; every session was closed", b.timeout)
	}
	return fmt.Errorf("bench: interrupted; every session was closed: %w", ctx.Err())
}

// writeJSON writes v as one JSON line.
func writeJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("bench: encode result: %w", err)
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// perSecond returns n/d in units per second, 0 for an empty interval.
func perSecond(n float64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return round(n/d.Seconds(), 3)
}

// ratio returns a/b, 0 if b is 0.
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// round rounds x to digits decimal places.
func round(x float64, digits int) float64 {
	p := math.Pow10(digits)
	return math.Round(x*p) / p
}
