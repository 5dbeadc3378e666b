package gateway

import (
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// The bad-token budget of the HTTP stream API. Checking a token costs a
// signature check per key of its algorithm (about 300 µs for a token
// without kid against four ES256 keys, auth's BenchmarkVerify_ES256FourKeys),
// a refused one as much as a good one. A
// WebSocket client pays for each check with an admission from the accept
// budget (a refused hello closes its session); an HTTP client could send
// a forged token per request on a keep-alive connection, unmetered. So
// the refused tokens of one client address share a token bucket
// (Config.BadTokenRate per second, BadTokenBurst deep): each refused
// token takes one, a token that verifies takes none, and once the bucket
// is empty the address's requests that carry a token are answered 429
// with Retry-After before their token is looked at. A good token among
// them is refused too (telling it apart would cost the check the budget
// saves), unless the verifier remembers it as verified (auth's
// Verifier.Cached, verifyStreamToken). A request without a token is a
// cheap 401 and is not counted.
//
// A check under way counts as refused until it ends: an address is let
// start a check only while its bucket holds more tokens than it has
// checks under way, so many requests sent at once (HTTP/2 streams, many
// connections) cannot start more checks than the bucket could pay for.
//
// An address is keyed as clientIP gives it, as for MaxSessionsPerIP: the
// TCP peer (behind a proxy, the proxy's), an IPv6 one by its /64.
//
// The table holds the addresses with a check under way or a bucket not
// yet refilled (a full bucket is the same as none): an entry goes when
// its last check ends with its bucket full, or at a sweep once it has
// refilled. It holds at most maxBadTokenAddrs; when full it is swept (at
// most once a second), and the addresses that still find no room share
// one more bucket, overflow, so an attacker with more addresses than
// that gains one address's budget, not one per address.

// maxBadTokenAddrs bounds the bad-token table: an entry with its bucket
// is about 170 bytes (measured with IPv6 /64 keys), so under 3 MiB.
const maxBadTokenAddrs = 1 << 14

// badTokenSweepEvery bounds how often a full table is swept on demand.
const badTokenSweepEvery = time.Second

// badTokenBudget is the table of per-address buckets. Its methods are
// safe for concurrent use. Times reach the buckets under mu and never go
// backwards (a time earlier than the last is taken as the last): given an
// earlier time, rate.Limiter would refill from it again.
type badTokenBudget struct {
	limit rate.Limit // static
	burst int        // static
	max   int        // static: the table's bound

	mu       sync.Mutex
	addrs    map[string]*badTokenBucket // guarded by mu
	overflow badTokenBucket             // guarded by mu: shared by the addresses that find the table full
	last     time.Time                  // guarded by mu: the latest time given
	swept    time.Time                  // guarded by mu: when the table was last swept
}

// badTokenBucket is one address's bucket, or the overflow's.
type badTokenBucket struct {
	lim    *rate.Limiter // nil until a token is refused: a full bucket
	checks int           // checks under way: the entry stays in the table while there are any
}

// newBadTokenBudget returns the budget for BadTokenRate and
// BadTokenBurst, or nil when it is off.
func newBadTokenBudget(r float64, burst, max int) *badTokenBudget {
	if r <= 0 {
		return nil
	}
	return &badTokenBudget{limit: rate.Limit(r), burst: burst, max: max, addrs: map[string]*badTokenBucket{}}
}

// begin lets the address key start a token check at now, returning its
// bucket for end; or, when the address has spent its budget, nil and how
// long until it may check one again (at most maxRetryAfter).
func (b *badTokenBudget) begin(key string, now time.Time) (*badTokenBucket, time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now = b.advanceLocked(now)
	bk := b.addrs[key]
	if bk == nil {
		if len(b.addrs) >= b.max && now.Sub(b.swept) >= badTokenSweepEvery {
			b.sweepLocked(now)
		}
		if len(b.addrs) < b.max {
			bk = &badTokenBucket{}
			b.addrs[key] = bk
		} else {
			bk = &b.overflow
		}
	}
	free := float64(b.burst)
	if bk.lim != nil {
		free = bk.lim.TokensAt(now)
	}
	free -= float64(bk.checks)
	if free < 1 {
		// In float seconds, capped: a rate of a token a century would
		// overflow a Duration.
		secs := min((1-free)/float64(b.limit), maxRetryAfter.Seconds())
		return nil, time.Duration(secs * float64(time.Second))
	}
	bk.checks++
	return bk, 0
}

// end ends a check begun for key on bk at now: a refused token takes a
// token from bk (begin kept one for it). An address's entry whose last
// check ends with its bucket full goes.
func (b *badTokenBudget) end(key string, bk *badTokenBucket, refused bool, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now = b.advanceLocked(now)
	bk.checks--
	if refused {
		if bk.lim == nil {
			bk.lim = rate.NewLimiter(b.limit, b.burst)
		}
		bk.lim.AllowN(now, 1) // cannot fail: begin saw a token for each check under way
	}
	if bk != &b.overflow && b.idleLocked(bk, now) {
		delete(b.addrs, key)
	}
}

// sweep forgets the addresses whose bucket has refilled, with no check
// under way, and returns how many.
func (b *badTokenBudget) sweep(now time.Time) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sweepLocked(b.advanceLocked(now))
}

func (b *badTokenBudget) sweepLocked(now time.Time) int {
	b.swept = now
	n := 0
	for key, bk := range b.addrs {
		if b.idleLocked(bk, now) {
			delete(b.addrs, key)
			n++
		}
	}
	return n
}

// idleLocked reports whether bk is as good as a new bucket at now.
func (b *badTokenBudget) idleLocked(bk *badTokenBucket, now time.Time) bool {
	return bk.checks == 0 && (bk.lim == nil || bk.lim.TokensAt(now) >= float64(b.burst))
}

// advanceLocked returns now, or the latest time given if now is earlier.
func (b *badTokenBudget) advanceLocked(now time.Time) time.Time {
	b.last = maxTime(now, b.last)
	return b.last
}
