package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// testNow is the fixed clock of the tests.
var testNow = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func fixedNow() time.Time { return testNow }

var testSecret = []byte("0123456789abcdef0123456789abcdef-test-secret")

// Keys are generated once per test binary: RSA generation is slow under -race.
var (
	rsaKeys = sync.OnceValue(func() [2]*rsa.PrivateKey {
		var out [2]*rsa.PrivateKey
		for i := range out {
			k, err := rsa.GenerateKey(rand.Reader, 2048)
			if err != nil {
				panic(err)
			}
			out[i] = k
		}
		return out
	})
	ecKeys = sync.OnceValue(func() [2]*ecdsa.PrivateKey {
		var out [2]*ecdsa.PrivateKey
		for i := range out {
			k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			if err != nil {
				panic(err)
			}
			out[i] = k
		}
		return out
	})
)

// pemPublic encodes pub as a PKIX PUBLIC KEY block with an optional kid.
func pemPublic(t testing.TB, pub any, kid string) []byte {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	b := &pem.Block{Type: "PUBLIC KEY", Bytes: der}
	if kid != "" {
		b.Headers = map[string]string{"kid": kid}
	}
	return pem.EncodeToMemory(b)
}

// jwkOf returns the JWKS member for pub.
func jwkOf(t testing.TB, pub any, kid string) map[string]string {
	t.Helper()
	b64 := base64.RawURLEncoding.EncodeToString
	switch p := pub.(type) {
	case *rsa.PublicKey:
		return map[string]string{"kty": "RSA", "kid": kid, "use": "sig", "alg": "RS256",
			"n": b64(p.N.Bytes()), "e": b64(big.NewInt(int64(p.E)).Bytes())}
	case *ecdsa.PublicKey:
		raw, err := p.Bytes()
		if err != nil {
			t.Fatal(err)
		}
		return map[string]string{"kty": "EC", "kid": kid, "crv": "P-256", "x": b64(raw[1:33]), "y": b64(raw[33:])}
	}
	t.Fatalf("jwkOf %T", pub)
	return nil
}

func jwks(t testing.TB, keys ...map[string]string) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{"keys": keys})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// claims returns valid claims for u1 at testNow, audience and issuer set.
func claims() *Claims {
	return &Claims{
		RegisteredClaims: jwt.RegisteredClaims{
			Subject:   "u1",
			Audience:  jwt.ClaimStrings{"syncgate"},
			Issuer:    "https://issuer.example",
			IssuedAt:  jwt.NewNumericDate(testNow.Add(-time.Minute)),
			NotBefore: jwt.NewNumericDate(testNow.Add(-time.Minute)),
			ExpiresAt: jwt.NewNumericDate(testNow.Add(time.Hour)),
		},
		Topics: TopicClaims{Subscribe: []string{"room:*"}, Publish: []string{"room:42"}},
	}
}

// sign signs c with method and key, setting the kid header when non-empty.
func sign(t testing.TB, method jwt.SigningMethod, key any, kid string, c jwt.Claims) string {
	t.Helper()
	tok := jwt.NewWithClaims(method, c)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// rawToken joins header and claims JSON with a signature, unsigned.
func rawToken(header, payload string, sig []byte) string {
	b64 := base64.RawURLEncoding.EncodeToString
	return b64([]byte(header)) + "." + b64([]byte(payload)) + "." + b64(sig)
}

func newVerifier(t testing.TB, cfg Config) *Verifier {
	t.Helper()
	if cfg.Now == nil {
		cfg.Now = fixedNow
	}
	v, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
