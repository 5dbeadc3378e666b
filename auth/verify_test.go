package auth

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

var sentinels = []error{ErrTooLarge, ErrMalformed, ErrBadAlgorithm, ErrUnknownKey, ErrBadSignature,
	ErrMissingExp, ErrExpired, ErrNotYetValid, ErrAudience, ErrIssuer, ErrBadClaims}

// checkRefused asserts that err wraps want and no other sentinel, and that
// its text contains nothing of the token.
func checkRefused(t *testing.T, tok string, err, want error) {
	t.Helper()
	if err == nil {
		t.Fatalf("verified; want %v", want)
	}
	for _, s := range sentinels {
		if got := errors.Is(err, s); got != (s == want) {
			t.Errorf("errors.Is(%v, %v) = %v", err, s, got)
		}
	}
	checkNoLeak(t, tok, err.Error())
}

// checkNoLeak fails if text contains the token or any of its segments
// (segments shorter than 8 bytes could appear by chance).
func checkNoLeak(t testing.TB, tok, text string) {
	t.Helper()
	if tok != "" && strings.Contains(text, tok) {
		t.Fatalf("error text contains the token: %q", text)
	}
	for _, seg := range strings.Split(tok, ".") {
		if len(seg) >= 8 && strings.Contains(text, seg) {
			t.Fatalf("error text contains a token segment: %q", text)
		}
	}
}

// TestVerifier_Verify_table is the JWT table, and more: every
// refusal carries its own sentinel and no part of the token.
func TestVerifier_Verify_table(t *testing.T) {
	t.Parallel()
	rsaKey, ecKey := rsaKeys()[0], ecKeys()[0]
	rsaPEM := pemPublic(t, &rsaKey.PublicKey, "r1")
	keys := append(append([]byte{}, rsaPEM...), pemPublic(t, &ecKey.PublicKey, "e1")...)
	full := newVerifier(t, Config{Secret: testSecret, Keys: keys, Audience: "syncgate", Issuer: "https://issuer.example"})
	rsaOnly := newVerifier(t, Config{Keys: rsaPEM})
	hsOnly := newVerifier(t, Config{Secret: testSecret})
	issOnly := newVerifier(t, Config{Secret: testSecret, Issuer: "https://issuer.example"})
	audOnly := newVerifier(t, Config{Secret: testSecret, Audience: "syncgate"})

	hs := func(mod func(*Claims)) string {
		c := claims()
		if mod != nil {
			mod(c)
		}
		return sign(t, jwt.SigningMethodHS256, testSecret, "", c)
	}
	valid := hs(nil)
	parts := strings.Split(valid, ".")
	flip := func(s string, i int) string { // change one base64 character, keeping it canonical
		b := []byte(s)
		if b[i] == 'A' {
			b[i] = 'B'
		} else {
			b[i] = 'A'
		}
		return string(b)
	}
	otherPayload := strings.Split(hs(func(c *Claims) { c.Topics.Publish = []string{"**"} }), ".")[1]
	noneTok := sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, "", claims())
	// The classic confusion: an HS256 token whose HMAC key is the RSA public key's PEM text.
	confused := sign(t, jwt.SigningMethodHS256, rsaPEM, "r1", claims())
	nonCanonical := parts[0] + "." + parts[1] + "." + parts[2][:len(parts[2])-1] + string(parts[2][len(parts[2])-1]^1)

	for _, tc := range []struct {
		name string
		v    *Verifier
		tok  string
		want error // nil: verifies
	}{
		{"valid HS256", full, valid, nil},
		{"valid RS256", full, sign(t, jwt.SigningMethodRS256, rsaKey, "r1", claims()), nil},
		{"valid RS256 without kid", full, sign(t, jwt.SigningMethodRS256, rsaKey, "", claims()), nil},
		{"valid ES256", full, sign(t, jwt.SigningMethodES256, ecKey, "e1", claims()), nil},
		{"expired", full, hs(func(c *Claims) { c.ExpiresAt = jwt.NewNumericDate(testNow.Add(-time.Minute)) }), ErrExpired},
		{"expired within leeway", full, hs(func(c *Claims) { c.ExpiresAt = jwt.NewNumericDate(testNow.Add(-5 * time.Second)) }), nil},
		{"expired just past leeway", full, hs(func(c *Claims) { c.ExpiresAt = jwt.NewNumericDate(testNow.Add(-11 * time.Second)) }), ErrExpired},
		{"nbf in the future", full, hs(func(c *Claims) { c.NotBefore = jwt.NewNumericDate(testNow.Add(time.Minute)) }), ErrNotYetValid},
		{"nbf within leeway", full, hs(func(c *Claims) { c.NotBefore = jwt.NewNumericDate(testNow.Add(5 * time.Second)) }), nil},
		{"iat in the future", full, hs(func(c *Claims) { c.IssuedAt = jwt.NewNumericDate(testNow.Add(time.Minute)) }), ErrNotYetValid},
		{"no nbf no iat", full, hs(func(c *Claims) { c.NotBefore, c.IssuedAt = nil, nil }), nil},
		{"alg none", full, noneTok, ErrBadAlgorithm},
		{"alg none, empty signature", full, rawToken(`{"alg":"none","typ":"JWT"}`, `{"sub":"u1","exp":9999999999}`, nil), ErrBadAlgorithm},
		{"alg NONE", full, rawToken(`{"alg":"NONE"}`, `{"sub":"u1","exp":9999999999}`, nil), ErrBadAlgorithm},
		{"alg missing", full, rawToken(`{"typ":"JWT"}`, `{"sub":"u1","exp":9999999999}`, []byte("x")), ErrBadAlgorithm},
		{"alg HS384", full, sign(t, jwt.SigningMethodHS384, testSecret, "", claims()), ErrBadAlgorithm},
		{"alg PS256 with the RSA key", full, sign(t, jwt.SigningMethodPS256, rsaKey, "r1", claims()), ErrBadAlgorithm},
		{"HS256 keyed with the RSA public key, RS-only server", rsaOnly, confused, ErrBadAlgorithm},
		{"HS256 keyed with the RSA public key, HS+RS server", full, confused, ErrBadSignature},
		{"RS256 on an HS-only server", hsOnly, sign(t, jwt.SigningMethodRS256, rsaKey, "", claims()), ErrBadAlgorithm},
		{"ES256 on an RS-only server", rsaOnly, sign(t, jwt.SigningMethodES256, ecKey, "", claims()), ErrBadAlgorithm},
		{"RS256 signature under an ES256 header", full, func() string {
			p := strings.Split(sign(t, jwt.SigningMethodRS256, rsaKey, "e1", claims()), ".")
			h := strings.Split(sign(t, jwt.SigningMethodES256, ecKey, "e1", claims()), ".")[0]
			return h + "." + p[1] + "." + p[2]
		}(), ErrBadSignature},
		{"wrong aud", full, hs(func(c *Claims) { c.Audience = jwt.ClaimStrings{"other"} }), ErrAudience},
		{"missing aud", full, hs(func(c *Claims) { c.Audience = nil }), ErrAudience},
		{"aud among several", full, hs(func(c *Claims) { c.Audience = jwt.ClaimStrings{"other", "syncgate"} }), nil},
		{"wrong iss", full, hs(func(c *Claims) { c.Issuer = "https://evil.example" }), ErrIssuer},
		{"missing iss", full, hs(func(c *Claims) { c.Issuer = "" }), ErrIssuer},
		// jwt reports a missing aud and a missing iss alike (a required
		// claim is missing): the sentinel must name the one configured.
		{"missing iss, no aud, only iss configured", issOnly, hs(func(c *Claims) { c.Audience, c.Issuer = nil, "" }), ErrIssuer},
		{"empty aud, only aud configured", audOnly, hs(func(c *Claims) { c.Audience, c.Issuer = jwt.ClaimStrings{""}, "" }), ErrAudience},
		{"empty aud with the right iss", full, hs(func(c *Claims) { c.Audience = jwt.ClaimStrings{""} }), ErrAudience},
		{"aud and iss unchecked when not configured", hsOnly, hs(func(c *Claims) { c.Audience, c.Issuer = nil, "" }), nil},
		{"tampered signature", full, parts[0] + "." + parts[1] + "." + flip(parts[2], 5), ErrBadSignature},
		{"tampered payload", full, parts[0] + "." + otherPayload + "." + parts[2], ErrBadSignature},
		{"signed with another secret", full, sign(t, jwt.SigningMethodHS256, bytes.Repeat([]byte("k"), 32), "", claims()), ErrBadSignature},
		{"signed with another RSA key", full, sign(t, jwt.SigningMethodRS256, rsaKeys()[1], "", claims()), ErrBadSignature},
		{"non-canonical base64 signature", full, nonCanonical, ErrMalformed},
		// Go's base64 decoder skips line breaks: the first three used to
		// verify as the valid token written differently; the CR in the
		// payload used to fail the signature instead. The rest were
		// refused before too and pin the alphabet check.
		{"line feed in the signature", full, valid[:len(valid)-10] + "\n" + valid[len(valid)-10:], ErrMalformed},
		{"CRLF after the token", full, valid + "\r\n", ErrMalformed},
		{"line feed after the token", full, valid + "\n", ErrMalformed},
		{"carriage return in the payload", full, parts[0] + "." + parts[1][:8] + "\r" + parts[1][8:] + "." + parts[2], ErrMalformed},
		{"space before the token", full, " " + valid, ErrMalformed},
		{"padding on the signature", full, valid + "=", ErrMalformed},
		{"non-ASCII in the header", full, "é" + valid, ErrMalformed},
		{"invalid UTF-8", full, valid[:20] + "\xff" + valid[20:], ErrMalformed},
		{"missing exp", full, hs(func(c *Claims) { c.ExpiresAt = nil }), ErrMissingExp},
		{"missing exp and expired-looking nbf", full, hs(func(c *Claims) { c.ExpiresAt = nil; c.NotBefore = jwt.NewNumericDate(testNow.Add(time.Hour)) }), ErrMissingExp},
		{"oversized", full, hs(func(c *Claims) {
			c.Topics.Subscribe = []string{strings.Repeat("a", 255)}
			c.ID = strings.Repeat("x", 8192)
		}), ErrTooLarge},
		{"oversized garbage", full, strings.Repeat("A", 8193), ErrTooLarge},
		{"empty", full, "", ErrMalformed},
		{"two segments", full, parts[0] + "." + parts[1], ErrMalformed},
		{"four segments", full, valid + ".x", ErrMalformed},
		{"not base64", full, "!!!.???.***", ErrMalformed},
		{"header not JSON", full, rawToken(`alg`, `{}`, []byte("s")), ErrMalformed},
		{"exp of the wrong type", full, sign(t, jwt.SigningMethodHS256, testSecret, "", jwt.MapClaims{"sub": "u1", "exp": "tomorrow"}), ErrMalformed},
		{"topics of the wrong type", full, sign(t, jwt.SigningMethodHS256, testSecret, "", jwt.MapClaims{"sub": "u1", "exp": testNow.Add(time.Hour).Unix(), "topics": "room:*"}), ErrMalformed},
		{"crit header", full, func() string {
			tok := jwt.NewWithClaims(jwt.SigningMethodHS256, claims())
			tok.Header["crit"] = []string{"exp"}
			s, _ := tok.SignedString(testSecret)
			return s
		}(), ErrMalformed},
		{"kid not a string", full, func() string {
			tok := jwt.NewWithClaims(jwt.SigningMethodRS256, claims())
			tok.Header["kid"] = 7
			s, _ := tok.SignedString(rsaKey)
			return s
		}(), ErrMalformed},
		{"unknown kid", full, sign(t, jwt.SigningMethodRS256, rsaKey, "r9", claims()), ErrUnknownKey},
		{"kid of an ES key on an RS token", full, sign(t, jwt.SigningMethodRS256, rsaKey, "e1", claims()), ErrUnknownKey},
		{"kid ignored for HS256", full, sign(t, jwt.SigningMethodHS256, testSecret, "anything", claims()), nil},
		{"missing sub", full, hs(func(c *Claims) { c.Subject = "" }), ErrBadClaims},
		{"sub too long", full, hs(func(c *Claims) { c.Subject = strings.Repeat("u", 257) }), ErrBadClaims},
		{"bad pattern", full, hs(func(c *Claims) { c.Topics.Publish = []string{"room:4*"} }), ErrBadClaims},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			id, err := tc.v.Verify(tc.tok)
			if tc.want != nil {
				checkRefused(t, tc.tok, err, tc.want)
				if id != nil {
					t.Fatal("identity returned with an error")
				}
				return
			}
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			if id.ActorID != "u1" || id.Expires.IsZero() {
				t.Fatalf("identity %+v", id)
			}
		})
	}
}

func TestVerifier_Verify_identity(t *testing.T) {
	t.Parallel()
	v := newVerifier(t, Config{Secret: testSecret})
	id, err := v.Verify(sign(t, jwt.SigningMethodHS256, testSecret, "", claims()))
	if err != nil {
		t.Fatal(err)
	}
	if id.ActorID != "u1" {
		t.Errorf("ActorID %q", id.ActorID)
	}
	if want := testNow.Add(time.Hour); !id.Expires.Equal(want) {
		t.Errorf("Expires %v, want %v", id.Expires, want)
	}
	for _, c := range []struct {
		a     Action
		topic string
		want  bool
	}{
		{Subscribe, "room:1", true}, {Subscribe, "room:42", true}, {Subscribe, "room", false},
		{Publish, "room:42", true}, {Publish, "room:1", false},
		{Presence, "room:42", false},
	} {
		if got := id.Grants.Allow(c.a, c.topic); got != c.want {
			t.Errorf("Allow(%v, %q) = %v", c.a, c.topic, got)
		}
	}
}

// TestVerifier_Verify_clock checks that Verify reads the injected clock on
// every call, not once.
func TestVerifier_Verify_clock(t *testing.T) {
	t.Parallel()
	now := testNow
	v := newVerifier(t, Config{Secret: testSecret, Leeway: -1, Now: func() time.Time { return now }})
	tok := sign(t, jwt.SigningMethodHS256, testSecret, "", claims())
	if _, err := v.Verify(tok); err != nil {
		t.Fatal(err)
	}
	now = testNow.Add(time.Hour) // exp itself: expired (exp must be after now)
	if _, err := v.Verify(tok); !errors.Is(err, ErrExpired) {
		t.Fatalf("at exp: %v", err)
	}
	now = testNow.Add(-2 * time.Minute) // before nbf and iat, no leeway
	if _, err := v.Verify(tok); !errors.Is(err, ErrNotYetValid) {
		t.Fatalf("before nbf: %v", err)
	}
}

func TestNew_config(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"nothing", Config{}},
		{"short secret", Config{Secret: []byte("short")}},
		{"huge leeway", Config{Secret: testSecret, Leeway: time.Hour}},
		{"negative size", Config{Secret: testSecret, MaxTokenBytes: -1}},
		{"keys garbage", Config{Keys: []byte("not a key")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if _, err := New(tc.cfg); err == nil {
				t.Fatal("New accepted it")
			}
		})
	}
	v := newVerifier(t, Config{Secret: testSecret, Keys: pemPublic(t, &ecKeys()[0].PublicKey, "e1")})
	if got := v.Keys(); len(got) != 2 || got[0] != (KeyInfo{Alg: "HS256"}) || got[1] != (KeyInfo{Alg: "ES256", KID: "e1"}) {
		t.Fatalf("Keys() = %+v", got)
	}
}

// TestNew_secretThatIsAPublicKey: the HS/RS confusion in configuration
// form. A public key given as the HS256 secret (SYNCGATE_JWT_SECRET set to
// the issuer's PEM, say) lets anyone who has that public key mint tokens
// the secret verifies; New refuses such a secret, as PyJWT does since
// CVE-2022-29217. It used to be taken as any other 32 bytes.
func TestNew_secretThatIsAPublicKey(t *testing.T) {
	t.Parallel()
	r, e := rsaKeys()[0], ecKeys()[0]
	rsaPEM := pemPublic(t, &r.PublicKey, "")
	jwk, err := json.Marshal(jwkOf(t, &e.PublicKey, "e1"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		secret []byte
	}{
		{"PEM public key", rsaPEM},
		{"PEM public key with a line break before", append([]byte("\n"), rsaPEM...)},
		{"PEM certificate", []byte("-----BEGIN CERTIFICATE-----\nMIIB" + strings.Repeat("A", 40) + "\n-----END CERTIFICATE-----\n")},
		{"JWKS", jwks(t, jwkOf(t, &r.PublicKey, "r1"))},
		{"JWK", jwk},
		{"OpenSSH RSA key", []byte("ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7 user@host")},
		{"OpenSSH Ed25519 key", []byte("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl user@host")},
		{"OpenSSH ECDSA key", []byte("ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBEm user@host")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if _, err := New(Config{Secret: tc.secret}); err == nil {
				t.Fatal("New took a public key as the HS256 secret")
			} else if strings.Contains(err.Error(), string(tc.secret)) {
				t.Fatalf("error text contains the secret: %v", err)
			}
		})
	}
	// Secrets that merely contain such characters are fine.
	for _, s := range []string{"{0123456789abcdef0123456789abcdef}", "ssh-0123456789abcdef0123456789abcdef", "-----0123456789abcdef0123456789abcdef"} {
		if _, err := New(Config{Secret: []byte(s)}); err != nil {
			t.Errorf("secret %q: %v", s, err)
		}
	}
}
