package auth

import (
	"crypto/sha256"
	"sync"
	"time"
)

// tokenCache remembers the identities of the tokens a Verifier has
// verified, so a client that sends the same token again (an HTTP stream
// reader or writer with every request, a WebSocket client with each
// reconnect of a drain's wave) pays for its signature check once. The
// gateway also lets a remembered token through while its client address
// has spent its budget of refused tokens ([Verifier.Cached]): behind a
// proxy every client shares that budget, and one client's refused tokens
// would otherwise lock the others out.
//
// An entry is keyed by the token's SHA-256, so the cache keeps no token,
// and a token that differs in any byte is a miss. It is used only before
// the identity's Expires by the Verifier's clock, and not while the clock
// is behind the time the token was verified: otherwise Verify decides
// again, with its leeway, so the cache answers only what Verify would. A Verifier is immutable (its keys,
// audience and issuer are fixed by New), so nothing else can make a
// verified token go bad. When full, expired entries go first, then
// arbitrary ones (Go's map order) until an eighth is free: a miss costs
// only the check the cache would have saved.
type tokenCache struct {
	max int              // static: the most entries kept
	now func() time.Time // static: the verifier's clock, which Verify compares exp with

	mu sync.Mutex
	m  map[tokenKey]cached // guarded by mu
}

// cached is a remembered token's identity and when it was verified.
type cached struct {
	id *Identity
	at time.Time
}

// maxCachedTokens bounds the token cache: an entry is the key, a map
// slot and a shared *Identity (its grants' patterns included), a few
// hundred bytes for the usual token, so a few MiB (tokens of 8 KiB of
// claims, which only the issuer can mint, would make it about 100 MiB).
const maxCachedTokens = 1 << 14

// newTokenCache returns a cache of at most max tokens whose expiry is
// told by now, the verifier's clock.
func newTokenCache(max int, now func() time.Time) *tokenCache {
	return &tokenCache{max: max, now: now, m: map[tokenKey]cached{}}
}

// tokenKey is token's key in the cache: its SHA-256.
type tokenKey [sha256.Size]byte

// keyOf returns token's key without allocating: sha256.Sum256([]byte(token))
// would copy a token of over 32 bytes to the heap, on every request. The
// token goes to the hash through a buffer on the stack instead (the
// digest stays on the stack too: TestVerifier_Verify_rememberedAllocatesNothing).
func keyOf(token string) (k tokenKey) {
	h := sha256.New()
	var buf [sha256.BlockSize]byte
	for len(token) > 0 {
		n := copy(buf[:], token)
		h.Write(buf[:n])
		token = token[n:]
	}
	h.Sum(k[:0])
	return k
}

// get returns the identity of the token whose key is k if it was
// verified and has not reached its exp, and the clock is not behind the
// time it was verified (stepped back, the token might be before its nbf
// or iat again: Verify decides). A nil cache has nothing.
func (c *tokenCache) get(k tokenKey) (*Identity, bool) {
	if c == nil {
		return nil, false
	}
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[k]
	if !ok {
		return nil, false
	}
	if now.Before(e.at) || !now.Before(e.id.Expires) {
		delete(c.m, k)
		return nil, false
	}
	return e.id, true
}

// put records that the token whose key is k verified as id, unless id
// has reached its exp (Verify's leeway let it through: not worth
// keeping). A nil cache keeps nothing.
func (c *tokenCache) put(k tokenKey, id *Identity) {
	if c == nil {
		return
	}
	now := c.now()
	if !now.Before(id.Expires) {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[k]; !ok && len(c.m) >= c.max {
		c.evictLocked(now)
	}
	c.m[k] = cached{id, now}
}

// evictLocked makes room: every expired entry goes, and arbitrary ones
// until an eighth of the cache is free, so the sweep of the whole map
// runs at most once per max/8 new tokens.
func (c *tokenCache) evictLocked(now time.Time) {
	for k, e := range c.m {
		if !now.Before(e.id.Expires) {
			delete(c.m, k)
		}
	}
	for k := range c.m {
		if len(c.m) <= c.max-max(1, c.max/8) {
			break
		}
		delete(c.m, k)
	}
}
