package auth

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"errors"
	"strings"
	"testing"

	"github.com/golang-jwt/jwt/v5"
)

// FuzzVerify feeds the hello token path arbitrary strings. The verifier
// holds a secret, an RSA and an EC key that the fuzzer never sees, so
// nothing it makes may verify, except a seed token left intact; no input
// panics, every refusal wraps exactly one sentinel, and no error text
// carries the token.
func FuzzVerify(f *testing.F) {
	r, e := rsaKeys()[0], ecKeys()[0]
	keys := append(pemPublic(f, &r.PublicKey, "r1"), pemPublic(f, &e.PublicKey, "e1")...)
	v := newVerifier(f, Config{Secret: testSecret, Keys: keys, Audience: "syncgate", Issuer: "https://issuer.example"})
	// Valid tokens as seeds, so the fuzzer mutates realistic input.
	valid := map[string]bool{}
	for _, tok := range []string{
		sign(f, jwt.SigningMethodHS256, testSecret, "", claims()),
		sign(f, jwt.SigningMethodRS256, r, "r1", claims()),
		sign(f, jwt.SigningMethodES256, e, "e1", claims()),
	} {
		valid[tok] = true
		f.Add(tok)
	}
	f.Add(sign(f, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, "", claims()))
	f.Add(sign(f, jwt.SigningMethodHS256, keys, "r1", claims()))
	f.Add("")
	f.Add("..")
	f.Add("e30.e30.")
	for tok := range valid {
		if _, err := v.Verify(tok); err != nil { // remembered: mutations run against a full cache
			f.Fatal(err)
		}
	}
	f.Fuzz(func(t *testing.T, tok string) {
		id, err := v.Verify(tok)
		if _, uerr := v.verify(tok); (err == nil) != (uerr == nil) {
			t.Fatalf("Verify (remembering) says %v, the check alone %v: %q", err, uerr, tok)
		}
		if err == nil {
			if !valid[tok] {
				// An ES256 signature (r, s) has the twin (r, n-s) that also
				// verifies; that is the only forgery-free way to get here
				// with a changed token, and it cannot change the claims.
				parts := strings.Split(tok, ".")
				ok := false
				for s := range valid {
					if sp := strings.Split(s, "."); sp[0] == parts[0] && sp[1] == parts[1] && strings.HasPrefix(sp[0], "eyJhbGciOiJFUzI1NiI") {
						ok = true
					}
				}
				if !ok {
					t.Fatalf("verified a token the fuzzer made: %q", tok)
				}
			}
			if id == nil || id.ActorID != "u1" {
				t.Fatalf("identity %+v", id)
			}
			return
		}
		n := 0
		for _, s := range sentinels {
			if errors.Is(err, s) {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("error %v wraps %d sentinels", err, n)
		}
		// Error texts contain no '.', so a token-shaped input (three
		// segments) can never appear in one by coincidence; other inputs
		// can be substrings of the fixed texts ("malformed token").
		if strings.Count(tok, ".") == 2 && strings.Contains(err.Error(), tok) {
			t.Fatalf("error text contains the token: %v", err)
		}
		if strings.Contains(err.Error(), ".") {
			t.Fatalf("error text has a '.', breaking the check above: %v", err)
		}
	})
}

// FuzzParseKeys feeds the keys file parser arbitrary text: no input
// panics, a PEM file yields a key per block or an error (no block is
// skipped), and every key it returns is a usable public key of the
// algorithm it is listed under, with no two sharing an algorithm and a
// non-empty kid.
func FuzzParseKeys(f *testing.F) {
	r, e := rsaKeys()[0], ecKeys()[0]
	rp, ep := pemPublic(f, &r.PublicKey, "r1"), pemPublic(f, &e.PublicKey, "e1")
	f.Add(append(append([]byte{}, rp...), ep...))
	f.Add(append([]byte("# comment\n"), ep...))
	f.Add(rp[:len(rp)/2])
	f.Add(append(append(append([]byte{}, rp[:len(rp)/2]...), '\n'), ep...)) // a damaged block before a good one
	f.Add(jwks(f, jwkOf(f, &r.PublicKey, "r1"), jwkOf(f, &e.PublicKey, "e1")))
	f.Add([]byte(`{"keys":[{"kty":"EC","crv":"P-256","x":"AA","y":"AA"}]}`))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, data []byte) {
		keys, err := parseKeys(data)
		if err != nil {
			if len(keys) != 0 {
				t.Fatalf("keys %d with error %v", len(keys), err)
			}
			return
		}
		if len(keys) == 0 {
			t.Fatal("no keys and no error")
		}
		if trimmed := bytes.TrimSpace(data); trimmed[0] != '{' && bytes.Count(data, pemBegin) != len(keys) {
			t.Fatalf("%d keys from %d PEM blocks: a block was skipped", len(keys), bytes.Count(data, pemBegin))
		}
		seen := map[[2]string]bool{}
		for _, k := range keys {
			switch p := k.pub.(type) {
			case *rsa.PublicKey:
				if k.alg != algRS256 || p.N.BitLen() < minRSABits {
					t.Fatalf("RSA key as %s of %d bits", k.alg, p.N.BitLen())
				}
			case *ecdsa.PublicKey:
				if k.alg != algES256 || p.Curve != elliptic.P256() {
					t.Fatalf("EC key as %s", k.alg)
				}
			default:
				t.Fatalf("key of type %T", k.pub)
			}
			if id := [2]string{k.alg, k.kid}; k.kid != "" && seen[id] {
				t.Fatalf("two %s keys with kid %q", k.alg, k.kid)
			} else {
				seen[id] = true
			}
		}
	})
}
