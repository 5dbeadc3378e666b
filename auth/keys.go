package auth

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"strings"
)

// publicKey is one configured RS256 or ES256 verification key.
type publicKey struct {
	kid string
	alg string // algRS256 for *rsa.PublicKey, algES256 for *ecdsa.PublicKey on P-256
	pub any
}

const minRSABits = 2048

// pemBegin starts a PEM block's first line.
var pemBegin = []byte("-----BEGIN")

// parseKeys reads a PEM or JWKS key file (see New).
func parseKeys(data []byte) ([]publicKey, error) {
	var keys []publicKey
	var err error
	if trimmed := bytes.TrimSpace(data); len(trimmed) > 0 && trimmed[0] == '{' {
		keys, err = parseJWKS(trimmed)
	} else {
		keys, err = parsePEM(data)
	}
	if err != nil {
		return nil, err
	}
	if len(keys) == 0 {
		return nil, errors.New("auth: keys: no usable RS256 or ES256 public key")
	}
	seen := make(map[[2]string]bool)
	for _, k := range keys {
		if k.kid == "" {
			continue
		}
		id := [2]string{k.alg, k.kid}
		if seen[id] {
			return nil, fmt.Errorf("auth: keys: two %s keys have kid %q", k.alg, k.kid)
		}
		seen[id] = true
	}
	return keys, nil
}

func parsePEM(data []byte) ([]publicKey, error) {
	var keys []publicKey
	for n := 1; ; n++ {
		b, rest := pem.Decode(data)
		if b == nil {
			break
		}
		// pem.Decode skips a block that does not decode (bad base64, no
		// END line of its type) and returns the next one: the block's own
		// BEGIN line is the last in what it consumed, and any other is a
		// block it skipped. Without this a damaged key before a good one
		// was dropped without a word.
		if bytes.Count(data[:len(data)-len(rest)], pemBegin) > 1 {
			return nil, fmt.Errorf("auth: keys: a PEM block before block %d does not decode (damaged base64, or no END line of its type)", n)
		}
		data = rest
		var pub any
		var err error
		switch {
		case b.Type == "PUBLIC KEY":
			pub, err = x509.ParsePKIXPublicKey(b.Bytes)
		case b.Type == "RSA PUBLIC KEY":
			pub, err = x509.ParsePKCS1PublicKey(b.Bytes)
		case b.Type == "CERTIFICATE":
			var cert *x509.Certificate
			if cert, err = x509.ParseCertificate(b.Bytes); err == nil {
				pub = cert.PublicKey
			}
		case strings.Contains(b.Type, "PRIVATE KEY"):
			return nil, fmt.Errorf("auth: keys: PEM block %d is a private key; give public keys only", n)
		default:
			return nil, fmt.Errorf("auth: keys: PEM block %d has type %q; want PUBLIC KEY, RSA PUBLIC KEY or CERTIFICATE", n, b.Type)
		}
		if err != nil {
			return nil, fmt.Errorf("auth: keys: PEM block %d: %w", n, err)
		}
		k, err := newPublicKey(pub, b.Headers["kid"])
		if err != nil {
			return nil, fmt.Errorf("auth: keys: PEM block %d: %w", n, err)
		}
		keys = append(keys, k)
	}
	if len(bytes.TrimSpace(data)) > 0 {
		return nil, errors.New("auth: keys: text after the last PEM block, or a block that does not decode")
	}
	return keys, nil
}

// newPublicKey checks that pub is a key this package verifies with.
func newPublicKey(pub any, kid string) (publicKey, error) {
	switch p := pub.(type) {
	case *rsa.PublicKey:
		if p.N.BitLen() < minRSABits {
			return publicKey{}, fmt.Errorf("RSA key of %d bits; want at least %d", p.N.BitLen(), minRSABits)
		}
		// What crypto/rsa refuses at every check: such a key would load
		// and verify nothing, its tokens refused as bad signatures.
		if p.N.Bit(0) == 0 {
			return publicKey{}, errors.New("RSA modulus is even: not an RSA key")
		}
		if p.E < 3 || p.E%2 == 0 || p.E > 1<<31-1 {
			return publicKey{}, errors.New("RSA exponent is not a usable one (odd, 3 to 2^31-1)")
		}
		return publicKey{kid: kid, alg: algRS256, pub: p}, nil
	case *ecdsa.PublicKey:
		if p.Curve != elliptic.P256() {
			return publicKey{}, fmt.Errorf("EC key on %s; ES256 needs P-256", p.Curve.Params().Name)
		}
		return publicKey{kid: kid, alg: algES256, pub: p}, nil
	}
	return publicKey{}, fmt.Errorf("unsupported key type %T; want RSA or P-256 EC", pub)
}

// jwk is the subset of RFC 7517 / RFC 7518 §6 members this package reads.
type jwk struct {
	Kty string `json:"kty"`
	Kid string `json:"kid"`
	Use string `json:"use"`
	Alg string `json:"alg"`
	Crv string `json:"crv"`
	N   string `json:"n"`
	E   string `json:"e"`
	X   string `json:"x"`
	Y   string `json:"y"`
	// Private members: present means the file leaks a private key. The
	// RSA CRT members (RFC 7518 §6.3.2) count: dp with n and e factors n.
	D   string          `json:"d"`
	P   string          `json:"p"`
	Q   string          `json:"q"`
	DP  string          `json:"dp"`
	DQ  string          `json:"dq"`
	QI  string          `json:"qi"`
	Oth json.RawMessage `json:"oth"`
	K   string          `json:"k"`
}

// private reports whether j holds private or symmetric key material.
func (j *jwk) private() bool {
	return j.D != "" || j.P != "" || j.Q != "" || j.DP != "" || j.DQ != "" || j.QI != "" || len(j.Oth) > 0 || j.K != ""
}

func parseJWKS(data []byte) ([]publicKey, error) {
	var set struct {
		Keys []jwk `json:"keys"`
	}
	if err := json.Unmarshal(data, &set); err != nil {
		return nil, fmt.Errorf("auth: keys: JWKS: %w", err)
	}
	var keys []publicKey
	for i, j := range set.Keys {
		if j.private() {
			return nil, fmt.Errorf("auth: keys: JWKS key %d holds private or symmetric key material; give public keys only", i)
		}
		if j.Use != "" && j.Use != "sig" {
			continue
		}
		var pub any
		var want string
		switch j.Kty {
		case "RSA":
			want = algRS256
			n, err := b64int(j.N)
			if err != nil {
				return nil, fmt.Errorf("auth: keys: JWKS key %d: n: %w", i, err)
			}
			e, err := b64int(j.E)
			if err != nil {
				return nil, fmt.Errorf("auth: keys: JWKS key %d: e: %w", i, err)
			}
			if !e.IsInt64() || e.Int64() < 3 || e.Int64() > 1<<31-1 || e.Bit(0) == 0 {
				return nil, fmt.Errorf("auth: keys: JWKS key %d: e is not a usable RSA exponent", i)
			}
			pub = &rsa.PublicKey{N: n, E: int(e.Int64())}
		case "EC":
			want = algES256
			if j.Crv != "P-256" {
				continue
			}
			x, err1 := b64fixed(j.X, 32)
			y, err2 := b64fixed(j.Y, 32)
			if err := errors.Join(err1, err2); err != nil {
				return nil, fmt.Errorf("auth: keys: JWKS key %d: x, y: %w", i, err)
			}
			p, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), append(append([]byte{4}, x...), y...))
			if err != nil {
				return nil, fmt.Errorf("auth: keys: JWKS key %d: %w", i, err)
			}
			pub = p
		default:
			continue // e.g. OKP: not verified by this server
		}
		if j.Alg != "" && j.Alg != want {
			continue // e.g. an RS384 or PS256 key in an identity provider's set
		}
		k, err := newPublicKey(pub, j.Kid)
		if err != nil {
			return nil, fmt.Errorf("auth: keys: JWKS key %d: %w", i, err)
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// b64int decodes a base64url (unpadded) big-endian unsigned integer.
func b64int(s string) (*big.Int, error) {
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil {
		return nil, err
	}
	if len(b) == 0 {
		return nil, errors.New("empty")
	}
	return new(big.Int).SetBytes(b), nil
}

// b64fixed decodes a base64url (unpadded) value of exactly n bytes.
func b64fixed(s string, n int) ([]byte, error) {
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil {
		return nil, err
	}
	if len(b) != n {
		return nil, fmt.Errorf("%d bytes, want %d", len(b), n)
	}
	return b, nil
}

// sshKeyPrefixes start an OpenSSH public key line (authorized_keys, .pub).
var sshKeyPrefixes = []string{"ssh-rsa ", "ssh-dss ", "ssh-ed25519 ", "ecdsa-sha2-", "sk-ssh-ed25519@openssh.com ", "sk-ecdsa-sha2-"}

// asymmetricKeyText names the kind of key text secret is when it is the
// text of an asymmetric key (PEM of any type, a JWK or JWKS, an OpenSSH
// key), or returns "". Such a secret is the HS/RS confusion in
// configuration form: an RSA public key's PEM as the HS256 secret lets
// anyone who has that key sign tokens (PyJWT refuses these since
// CVE-2022-29217). The answer never contains the secret.
func asymmetricKeyText(secret []byte) string {
	s := bytes.TrimSpace(secret)
	if bytes.Contains(s, pemBegin) {
		return "a PEM block"
	}
	for _, p := range sshKeyPrefixes {
		if bytes.HasPrefix(s, []byte(p)) {
			return "an OpenSSH key"
		}
	}
	if len(s) > 0 && s[0] == '{' {
		var m map[string]json.RawMessage
		if json.Unmarshal(s, &m) == nil && (m["kty"] != nil || m["keys"] != nil) {
			return "a JWK or JWKS"
		}
	}
	return ""
}
