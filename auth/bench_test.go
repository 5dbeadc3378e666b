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
// check; a good one signed by the last key costs as much the first time,
// and next to nothing once remembered. The HTTP stream API's bad-token
// budget (gateway/badtoken.go) is sized by the first figures.
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
		name   string
		key    *ecdsa.PrivateKey
		ok     bool
		verify func(string) (*Identity, error)
	}{
		{"forged", forger, false, v.Verify},
		{"good", last, true, v.verify},            // the check itself, as for a token seen the first time
		{"good remembered", last, true, v.Verify}, // answered from the cache (cache.go)
	} {
		token := sign(b, jwt.SigningMethodES256, tc.key, "", claims())
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := tc.verify(token); (err == nil) != tc.ok {
					b.Fatalf("Verify: %v", err)
				}
			}
		})
	}
}
