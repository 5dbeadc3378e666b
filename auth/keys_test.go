package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

func TestVerifier_Verify_jwks(t *testing.T) {
	t.Parallel()
	r, e := rsaKeys(), ecKeys()
	encKey := jwkOf(t, &r[1].PublicKey, "enc")
	encKey["use"] = "enc"
	rs384 := jwkOf(t, &r[1].PublicKey, "rs384")
	rs384["alg"] = "RS384"
	okp := map[string]string{"kty": "OKP", "crv": "Ed25519", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}
	v := newVerifier(t, Config{Keys: jwks(t,
		jwkOf(t, &r[0].PublicKey, "r1"), jwkOf(t, &e[0].PublicKey, "e1"), jwkOf(t, &e[1].PublicKey, "e2"),
		encKey, rs384, okp)})
	if got := len(v.Keys()); got != 3 {
		t.Fatalf("%d keys; want 3 (enc, RS384 and OKP skipped): %+v", got, v.Keys())
	}
	for _, tc := range []struct {
		name string
		tok  string
		want error
	}{
		{"RS256 by kid", sign(t, jwt.SigningMethodRS256, r[0], "r1", claims()), nil},
		{"ES256 by kid", sign(t, jwt.SigningMethodES256, e[1], "e2", claims()), nil},
		{"ES256 without kid tries every EC key", sign(t, jwt.SigningMethodES256, e[1], "", claims()), nil},
		{"ES256 under another key's kid", sign(t, jwt.SigningMethodES256, e[1], "e1", claims()), ErrBadSignature},
		{"unknown kid", sign(t, jwt.SigningMethodES256, e[0], "e3", claims()), ErrUnknownKey},
		{"enc key does not verify", sign(t, jwt.SigningMethodRS256, r[1], "enc", claims()), ErrUnknownKey},
		{"enc key not tried without kid", sign(t, jwt.SigningMethodRS256, r[1], "", claims()), ErrBadSignature},
		{"HS256 without a secret", sign(t, jwt.SigningMethodHS256, testSecret, "", claims()), ErrBadAlgorithm},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := v.Verify(tc.tok)
			if tc.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			checkRefused(t, tc.tok, err, tc.want)
		})
	}
}

func TestVerifier_Verify_pem(t *testing.T) {
	t.Parallel()
	r, e := rsaKeys(), ecKeys()
	// A self-signed certificate for e[1]: only its key is used.
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "issuer"},
		NotBefore: testNow.Add(-time.Hour), NotAfter: testNow.Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &e[1].PublicKey, e[1])
	if err != nil {
		t.Fatal(err)
	}
	pkcs1 := pem.EncodeToMemory(&pem.Block{Type: "RSA PUBLIC KEY", Bytes: x509.MarshalPKCS1PublicKey(&r[1].PublicKey),
		Headers: map[string]string{"kid": "old"}})
	keys := strings.Join([]string{
		string(pemPublic(t, &r[0].PublicKey, "new")),
		string(pkcs1),
		string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
	}, "\n")
	v := newVerifier(t, Config{Keys: []byte(keys)})
	want := []KeyInfo{{"RS256", "new"}, {"RS256", "old"}, {"ES256", ""}}
	if got := v.Keys(); len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("Keys() = %+v", got)
	}
	for _, tok := range []string{
		sign(t, jwt.SigningMethodRS256, r[0], "new", claims()),
		sign(t, jwt.SigningMethodRS256, r[1], "old", claims()),
		sign(t, jwt.SigningMethodRS256, r[1], "", claims()), // rotation without kids
		sign(t, jwt.SigningMethodES256, e[1], "", claims()),
	} {
		if _, err := v.Verify(tok); err != nil {
			t.Errorf("refused: %v", err)
		}
	}
	tok := sign(t, jwt.SigningMethodRS256, r[1], "new", claims())
	if _, err := v.Verify(tok); !errors.Is(err, ErrBadSignature) {
		t.Errorf("old key under the new kid: %v", err)
	}
}

func TestNew_badKeys(t *testing.T) {
	t.Parallel()
	r, e := rsaKeys(), ecKeys()
	small, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	p384, err := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	privDER, err := x509.MarshalPKCS8PrivateKey(e[0])
	if err != nil {
		t.Fatal(err)
	}
	withD := jwkOf(t, &e[0].PublicKey, "e1")
	withD["d"] = "AAAA"
	oct := map[string]string{"kty": "oct", "k": "c2VjcmV0"}
	badX := jwkOf(t, &e[0].PublicKey, "e1")
	badX["x"] = badX["y"] // not on the curve
	for _, tc := range []struct {
		name string
		keys []byte
	}{
		{"private PEM", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: privDER})},
		{"EC PRIVATE KEY PEM", pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: []byte{1}})},
		{"unknown PEM type", pem.EncodeToMemory(&pem.Block{Type: "SECRET", Bytes: []byte{1}})},
		{"RSA 1024", pemPublic(t, &small.PublicKey, "")},
		{"P-384", pemPublic(t, &p384.PublicKey, "")},
		{"trailing junk", append(pemPublic(t, &r[0].PublicKey, ""), "junk"...)},
		{"duplicate kid", append(pemPublic(t, &r[0].PublicKey, "k"), pemPublic(t, &r[1].PublicKey, "k")...)},
		{"JWKS private member", jwks(t, withD)},
		{"JWKS symmetric key", jwks(t, oct)},
		{"JWKS point off the curve", jwks(t, badX)},
		{"JWKS nothing usable", jwks(t, map[string]string{"kty": "OKP", "crv": "Ed25519", "x": "AA"})},
		{"JWKS not JSON", []byte("{keys")},
		{"JWKS duplicate kid", jwks(t, jwkOf(t, &e[0].PublicKey, "k"), jwkOf(t, &e[1].PublicKey, "k"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if _, err := New(Config{Keys: tc.keys}); err == nil {
				t.Fatal("New accepted the keys")
			}
		})
	}
	// Same kid on keys of different algorithms is fine: the algorithm picks the family.
	if _, err := New(Config{Keys: jwks(t, jwkOf(t, &r[0].PublicKey, "k"), jwkOf(t, &e[0].PublicKey, "k"))}); err != nil {
		t.Fatal(err)
	}
}

// TestNew_pemBlockThatDoesNotDecode: pem.Decode skips a block that does
// not decode and goes on to the next one, so a damaged block (a key
// pasted short, a line lost, an END line missing) before a good one used
// to vanish without a word: the node started without that key, and its
// tokens were refused as of an unknown key. Only a damaged last block
// was refused (as text after the last block).
func TestNew_pemBlockThatDoesNotDecode(t *testing.T) {
	t.Parallel()
	r := rsaKeys()
	good := string(pemPublic(t, &r[0].PublicKey, "old"))
	next := string(pemPublic(t, &r[1].PublicKey, "new"))
	lines := strings.Split(next, "\n")
	for _, tc := range []struct {
		name string
		keys string
	}{
		{"bad base64 before a good block", strings.Replace(next, "M", "!", 3) + good},
		{"bad base64 between good blocks", good + strings.Replace(next, "M", "!", 3) + string(pemPublic(t, &ecKeys()[0].PublicKey, "ec"))},
		{"END line missing before a good block", strings.Replace(next, "-----END PUBLIC KEY-----", "", 1) + good},
		{"END line of another type", strings.Replace(next, "END PUBLIC KEY", "END RSA PUBLIC KEY", 1) + good},
		{"cut short before a good block", next[:len(next)/2] + "\n" + good},
		{"body lines lost", strings.Join(append(lines[:3:3], lines[len(lines)-2:]...), "\n") + good},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v, err := New(Config{Keys: []byte(tc.keys)})
			if err == nil {
				t.Fatalf("New accepted the keys as %+v", v.Keys())
			}
		})
	}
	// Text around the blocks that is not a block (a comment, the output
	// of openssl x509 -text) is still skipped, as pem.Decode does.
	v := newVerifier(t, Config{Keys: []byte("# rotated 2026-03\n" + good + "\nsubject=CN = issuer\n" + next)})
	if got := v.Keys(); len(got) != 2 {
		t.Fatalf("Keys() = %+v", got)
	}
}

// TestNew_jwksPrivateCRTMembers: an RSA JWK's CRT members (RFC 7518
// §6.3.2: dp, dq, qi, oth) are private key material as much as d, p and
// q are (dp with n and e factors n), so a file holding one leaks a
// private key and is refused. Only d, p, q and k used to be looked at.
func TestNew_jwksPrivateCRTMembers(t *testing.T) {
	t.Parallel()
	for _, m := range []string{"dp", "dq", "qi"} {
		t.Run(m, func(t *testing.T) {
			t.Parallel()
			k := jwkOf(t, &rsaKeys()[0].PublicKey, "r1")
			k[m] = "AQAB"
			if v, err := New(Config{Keys: jwks(t, k)}); err == nil {
				t.Fatalf("New accepted a JWK with %s as %+v", m, v.Keys())
			}
		})
	}
	t.Run("oth", func(t *testing.T) {
		t.Parallel()
		k := jwkOf(t, &rsaKeys()[0].PublicKey, "r1")
		keys := []byte(strings.Replace(string(jwks(t, k)), `"kty"`, `"oth":[{"r":"AQAB","d":"AQAB","t":"AQAB"}],"kty"`, 1))
		if v, err := New(Config{Keys: keys}); err == nil {
			t.Fatalf("New accepted a JWK with oth as %+v", v.Keys())
		}
	})
}

// TestNew_rsaKeyThatCannotVerify: an RSA key with an even modulus or an
// unusable exponent verifies nothing (crypto/rsa refuses it at every
// check), so it is refused at start like an EC point off its curve,
// whether it comes as PEM or JWKS. It used to load, and its tokens were
// refused as bad signatures; only a JWKS exponent was checked.
func TestNew_rsaKeyThatCannotVerify(t *testing.T) {
	t.Parallel()
	good := rsaKeys()[0].PublicKey
	even := new(big.Int).Set(good.N)
	even.SetBit(even, 0, 0)
	for _, tc := range []struct {
		name string
		pub  rsa.PublicKey
	}{
		{"even modulus", rsa.PublicKey{N: even, E: good.E}},
		{"exponent 1", rsa.PublicKey{N: good.N, E: 1}},
		{"even exponent", rsa.PublicKey{N: good.N, E: 65536}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pkcs1 := pem.EncodeToMemory(&pem.Block{Type: "RSA PUBLIC KEY", Bytes: x509.MarshalPKCS1PublicKey(&tc.pub)})
			for form, keys := range map[string][]byte{"PEM": pkcs1, "JWKS": jwks(t, jwkOf(t, &tc.pub, "r1"))} {
				if v, err := New(Config{Keys: keys}); err == nil {
					t.Errorf("%s: New accepted the key as %+v", form, v.Keys())
				}
			}
		})
	}
}
