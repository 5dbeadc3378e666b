package auth

import (
	"crypto/sha256"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// TestTokenCache_Bounded: a full cache makes room by dropping its expired
// entries first, then arbitrary ones until an eighth is free; it never
// holds more than its bound, and what it serves has not reached its exp.
func TestTokenCache_Bounded(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	c := newTokenCache(64, func() time.Time { return now })
	soon := &Identity{ActorID: "soon", Expires: now.Add(time.Minute)}
	later := &Identity{ActorID: "later", Expires: now.Add(time.Hour)}
	for i := range 64 {
		id := later
		if i%2 == 0 {
			id = soon
		}
		c.put(keyOf("t"+strconv.Itoa(i)), id)
	}
	if len(c.m) != 64 {
		t.Fatalf("%d entries after 64 puts into a cache of 64", len(c.m))
	}
	// A minute on, the 32 "soon" entries have expired: the next put
	// drops them and keeps every "later" one.
	now = now.Add(time.Minute)
	c.put(keyOf("new"), later)
	if len(c.m) != 33 {
		t.Fatalf("%d entries after the expired went, want 33", len(c.m))
	}
	for i := 1; i < 64; i += 2 {
		if _, ok := c.get(keyOf("t" + strconv.Itoa(i))); !ok {
			t.Fatalf("unexpired entry t%d was dropped", i)
		}
	}
	if _, ok := c.get(keyOf("t0")); ok {
		t.Fatal("an entry at its exp was served")
	}
	// Full of unexpired entries: arbitrary ones go, an eighth at once.
	for i := range 1000 {
		c.put(keyOf("more"+strconv.Itoa(i)), later)
		if len(c.m) > 64 {
			t.Fatalf("%d entries, over the bound of 64", len(c.m))
		}
	}
	if _, ok := c.get(keyOf("more999")); !ok {
		t.Fatal("the newest entry was dropped")
	}
	// An identity already at its exp (Verify's leeway let it through) is
	// not kept.
	c.put(keyOf("late"), &Identity{Expires: now})
	if _, ok := c.get(keyOf("late")); ok {
		t.Fatal("an identity at its exp was kept")
	}
	var nilCache *tokenCache
	nilCache.put(keyOf("x"), later)
	if _, ok := nilCache.get(keyOf("x")); ok {
		t.Fatal("a nil cache served a token")
	}
}

// TestVerifier_RemembersVerifiedTokens: Verify remembers a token it
// passed, by the Verifier's clock until the token's exp: Cached answers
// for it, and Verify answers from memory with the same Identity. A
// refused token and one never verified are not remembered; past exp the
// token is checked again (and refused, with no leeway).
func TestVerifier_RemembersVerifiedTokens(t *testing.T) {
	t.Parallel()
	now := testNow
	v := newVerifier(t, Config{Secret: testSecret, Leeway: -1, Now: func() time.Time { return now }})
	c := claims()
	good := sign(t, jwt.SigningMethodHS256, testSecret, "", c)
	forged := sign(t, jwt.SigningMethodHS256, []byte("another secret, also 32 bytes long or more"), "", c)
	if _, ok := v.Cached(good); ok {
		t.Fatal("a token never verified is cached")
	}
	id, err := v.Verify(good)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := v.Cached(good); !ok || got != id {
		t.Fatalf("Cached after Verify = %v, %v; want the same identity", got, ok)
	}
	if again, err := v.Verify(good); err != nil || again != id {
		t.Fatalf("Verify again = %v, %v; want the remembered identity", again, err)
	}
	if _, err := v.Verify(forged); err == nil {
		t.Fatal("forged token verified")
	}
	if _, ok := v.Cached(forged); ok {
		t.Fatal("a refused token is cached")
	}
	now = c.ExpiresAt.Time
	if _, ok := v.Cached(good); ok {
		t.Fatal("a token at its exp is still cached")
	}
	if _, err := v.Verify(good); !errors.Is(err, ErrExpired) {
		t.Fatalf("Verify at exp with no leeway: %v, want ErrExpired", err)
	}
}

// TestVerifier_Verify_rememberedOnlyAsVerified: the cache answers only what
// Verify would: not once the clock is stepped back before the time the
// token was verified (it may be before its nbf again), and not for a token
// that differs from a remembered one by a byte Verify refuses.
func TestVerifier_Verify_rememberedOnlyAsVerified(t *testing.T) {
	t.Parallel()
	now := testNow
	v := newVerifier(t, Config{Secret: testSecret, Leeway: -1, Now: func() time.Time { return now }})
	good := sign(t, jwt.SigningMethodHS256, testSecret, "", claims()) // nbf a minute before testNow
	if _, err := v.Verify(good); err != nil {
		t.Fatal(err)
	}
	for _, odd := range []string{good + "\n", good + "=", " " + good, good[:10] + "\n" + good[10:]} {
		if _, err := v.Verify(odd); !errors.Is(err, ErrMalformed) {
			t.Errorf("Verify(%q): %v, want ErrMalformed", odd, err)
		}
		if _, ok := v.Cached(odd); ok {
			t.Errorf("Cached(%q) answered", odd)
		}
	}
	now = testNow.Add(-2 * time.Minute) // before the token's nbf
	if _, ok := v.Cached(good); ok {
		t.Fatal("Cached answered with the clock behind the verification")
	}
	if _, err := v.Verify(good); !errors.Is(err, ErrNotYetValid) {
		t.Fatalf("Verify before nbf: %v, want ErrNotYetValid", err)
	}
}

// Test_keyOf: the cache key is the token's SHA-256, for tokens that end
// within, at and past a block of the hash.
func Test_keyOf(t *testing.T) {
	t.Parallel()
	for _, n := range []int{0, 1, 31, 32, 33, 63, 64, 65, 127, 128, 129, 1000} {
		tok := strings.Repeat("a.b_c-", n/6+1)[:n]
		if got, want := keyOf(tok), tokenKey(sha256.Sum256([]byte(tok))); got != want {
			t.Errorf("keyOf of %d bytes = %x, want %x", n, got, want)
		}
	}
}

// TestVerifier_Verify_rememberedAllocatesNothing: a token answered from
// memory costs no allocation (BenchmarkVerify_ES256FourKeys "good
// remembered"), nor does Cached.
func TestVerifier_Verify_rememberedAllocatesNothing(t *testing.T) {
	v := newVerifier(t, Config{Secret: testSecret})
	good := sign(t, jwt.SigningMethodHS256, testSecret, "", claims())
	if _, err := v.Verify(good); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() {
		if _, err := v.Verify(good); err != nil {
			t.Fatal(err)
		}
		if _, ok := v.Cached(good); !ok {
			t.Fatal("not cached")
		}
	}); n != 0 {
		t.Fatalf("a remembered token: %v allocations, want none", n)
	}
}
