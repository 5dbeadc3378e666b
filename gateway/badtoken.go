package gateway

// The bad-token budget of the HTTP stream API (Server.badTokens, a
// keyedLimiters of maxBadTokenAddrs, limits.go). Checking a token costs a
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
//
// checkStreamToken (streamhttp.go) reserves a token of the address's
// bucket for each check and settles it when the check ends: spent if the
// token was refused, free again if it verified.

// maxBadTokenAddrs bounds the bad-token table: an entry with its bucket
// is about 170 bytes (measured with IPv6 /64 keys), so under 3 MiB.
const maxBadTokenAddrs = 1 << 14
