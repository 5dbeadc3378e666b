package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"testing"

	"github.com/golang-jwt/jwt/v5"
)

// BenchmarkVerify_ES256FourKeys: what a token check costs the node at
// worst: an ES256 token without kid against four ES256 keys, which tries
// each key. A forged token (signed by none of them) costs every key's
// check; a good one signed by the last key costs as much. The HTTP stream
// API's bad-token budget (gateway/badtoken.go) is sized by this figure.
func BenchmarkVerify_ES256FourKeys(b *testing.B) {
	var keys []map[string]string
	var last *ecdsa.PrivateKey
	for i := range 4 {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			b.Fatal(err)
		}
		keys = append(keys, jwkOf(b, &k.PublicKey, string(rune('a'+i))))
		last = k
	}
	v := newVerifier(b, Config{Keys: jwks(b, keys...)})
	forger, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		key  *ecdsa.PrivateKey
		ok   bool
	}{{"forged", forger, false}, {"good", last, true}} {
		token := sign(b, jwt.SigningMethodES256, tc.key, "", claims())
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := v.Verify(token); (err == nil) != tc.ok {
					b.Fatalf("Verify: %v", err)
				}
			}
		})
	}
}
