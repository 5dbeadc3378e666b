package auth

import (
	"crypto/ecdsa"
	"crypto/rsa"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Verify's errors, one per reason a token is refused. Each is wrapped with
// a detail that never contains the token.
var (
	ErrTooLarge     = errors.New("auth: token too large")              // over Config.MaxTokenBytes; not parsed at all
	ErrMalformed    = errors.New("auth: malformed token")              // not a compact JWS with JSON header and claims
	ErrBadAlgorithm = errors.New("auth: token algorithm not accepted") // alg none, unknown, or without a configured key
	ErrUnknownKey   = errors.New("auth: token names an unknown key")   // kid matches no key of the token's algorithm
	ErrBadSignature = errors.New("auth: token signature invalid")      // tampered, or signed with another key
	ErrMissingExp   = errors.New("auth: token has no exp claim")       // exp is required
	ErrExpired      = errors.New("auth: token expired")                // exp (plus leeway) has passed
	ErrNotYetValid  = errors.New("auth: token not valid yet")          // nbf or iat in the future (beyond leeway)
	ErrAudience     = errors.New("auth: token audience not accepted")  // aud missing or without Config.Audience
	ErrIssuer       = errors.New("auth: token issuer not accepted")    // iss missing or not Config.Issuer
	ErrBadClaims    = errors.New("auth: token claims invalid")         // sub missing or too long, or a bad topic pattern
)

// Algorithms the Verifier can accept, by key type.
const (
	algHS256 = "HS256"
	algRS256 = "RS256"
	algES256 = "ES256"
)

// Limits.
const (
	defaultMaxTokenBytes = 8 << 10
	defaultLeeway        = 10 * time.Second
	minSecretBytes       = 32 // RFC 7518 §3.2: an HS256 key has at least 256 bits
	maxSubjectBytes      = 256
)

// Config configures a [Verifier]. At least one of Secret and Keys must be
// set. [New] copies what it needs; the caller's value is not kept.
type Config struct {
	// Secret is the HS256 shared secret (SYNCGATE_JWT_SECRET), at least
	// 32 bytes. Empty (the default) means HS256 tokens are refused. A
	// public key's text (PEM, JWK or JWKS, OpenSSH) is refused: anyone who
	// has the public key could sign tokens with it.
	Secret []byte

	// Keys is the content of the SYNCGATE_JWT_KEYS file: the public keys
	// that verify RS256 and ES256 tokens, either as PEM or as a JWKS (a
	// JSON object with "keys"; detected by its leading '{'). See [New] for
	// what each form may hold. Empty (the default) means RS256 and ES256
	// tokens are refused.
	Keys []byte

	// Audience, when set, must be one of the token's aud values. Empty
	// (the default) means aud is not checked.
	Audience string

	// Issuer, when set, must equal the token's iss. Empty (the default)
	// means iss is not checked.
	Issuer string

	// Leeway is the clock skew allowed when comparing exp, nbf and iat
	// with Now. Zero means 10s; negative means none. At most 5 minutes.
	Leeway time.Duration

	// MaxTokenBytes bounds a token's length; a longer one is refused with
	// ErrTooLarge before it is parsed. Zero means 8192.
	MaxTokenBytes int

	// Now is the clock. Nil means time.Now.
	Now func() time.Time
}

// Verifier checks tokens. Its configuration is fixed by New; it is safe
// for concurrent use. It remembers the tokens it verified (cache.go), and
// the *Identity it returns for one is shared: callers must not change it.
type Verifier struct {
	secret   []byte // nil: no HS256
	keys     []publicKey
	algs     []string // accepted algorithms, in the order HS256, RS256, ES256
	maxBytes int
	audience string // Config.Audience: "" is unchecked
	issuer   string // Config.Issuer: "" is unchecked
	parser   *jwt.Parser
	cache    *tokenCache // the tokens verified (cache.go)
}

// Identity is what a verified token says about its bearer.
type Identity struct {
	// ActorID is the token's sub.
	ActorID string
	// Expires is the token's exp. Verify accepts the token until
	// Expires plus the leeway; the gateway tells the session at Expires.
	// A custom gateway.TokenVerifier may leave it zero: its identities
	// never expire (no expiry notice, and live HTTP reads are not cut).
	Expires time.Time
	// Grants are the topic patterns the token grants.
	Grants Grants
}

// Claims is the JSON payload of a syncgate token: the registered claims
// plus "topics". Token issuers (and tests) sign it with jwt.NewWithClaims.
type Claims struct {
	jwt.RegisteredClaims
	Topics TopicClaims `json:"topics,omitzero"`
}

// TopicClaims lists topic patterns per action (see the package doc for
// the pattern syntax).
type TopicClaims struct {
	Subscribe []string `json:"subscribe,omitempty"`
	Publish   []string `json:"publish,omitempty"`
	Presence  []string `json:"presence,omitempty"`
	// Manage grants the Durable Streams HTTP API's administrative
	// requests on a topic's stream: create, close, TTL and delete.
	Manage []string `json:"manage,omitempty"`
}

// New returns a Verifier for cfg.
//
// A PEM Keys value holds one or more blocks: "PUBLIC KEY" (PKIX, RSA or
// P-256 EC), "RSA PUBLIC KEY" (PKCS #1) or "CERTIFICATE" (only its public
// key is used; the chain is not checked). A block's kid is its "kid" PEM
// header, e.g.
//
//	-----BEGIN PUBLIC KEY-----
//	kid: 2026-01
//
//	MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA...
//	-----END PUBLIC KEY-----
//
// A JWKS holds keys of kty "RSA" or "EC" (crv "P-256"); keys whose use is
// not "sig" or whose alg is set to something other than RS256/ES256 are
// skipped, so an identity provider's full JWKS can be used as is. Private
// keys (PEM private key blocks, JWKS members "d", "p", "q", "dp", "dq",
// "qi", "oth") and symmetric ones ("k") are an error:
// the file must hold public keys only. RSA keys need at least 2048 bits,
// an odd modulus and an odd exponent from 3 to 2^31-1.
// A PEM block that does not decode is an error wherever it is, as is text
// after the last block; other text before or between blocks is skipped.
// Two keys with the same non-empty kid and algorithm are an error, and so
// is a Keys value that yields no key.
func New(cfg Config) (*Verifier, error) {
	if len(cfg.Secret) == 0 && len(cfg.Keys) == 0 {
		return nil, errors.New("auth: no secret and no keys configured")
	}
	v := &Verifier{maxBytes: cfg.MaxTokenBytes, audience: cfg.Audience, issuer: cfg.Issuer}
	if v.maxBytes == 0 {
		v.maxBytes = defaultMaxTokenBytes
	}
	leeway := cfg.Leeway
	switch {
	case leeway == 0:
		leeway = defaultLeeway
	case leeway < 0:
		leeway = 0
	case leeway > 5*time.Minute:
		return nil, fmt.Errorf("auth: leeway %v over the limit of 5m", leeway)
	}
	if v.maxBytes < 0 {
		return nil, errors.New("auth: negative MaxTokenBytes")
	}
	if len(cfg.Secret) > 0 {
		if len(cfg.Secret) < minSecretBytes {
			return nil, fmt.Errorf("auth: secret is %d bytes; HS256 needs at least %d", len(cfg.Secret), minSecretBytes)
		}
		if kind := asymmetricKeyText(cfg.Secret); kind != "" {
			// Whoever has the public key could sign HS256 tokens with it.
			return nil, fmt.Errorf("auth: the secret is %s, not a shared secret: give public keys as Keys, never as the HS256 secret", kind)
		}
		v.secret = append([]byte(nil), cfg.Secret...)
		v.algs = append(v.algs, algHS256)
	}
	if len(cfg.Keys) > 0 {
		keys, err := parseKeys(cfg.Keys)
		if err != nil {
			return nil, err
		}
		v.keys = keys
		for _, alg := range []string{algRS256, algES256} {
			for _, k := range keys {
				if k.alg == alg {
					v.algs = append(v.algs, alg)
					break
				}
			}
		}
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	v.cache = newTokenCache(maxCachedTokens, now)
	opts := []jwt.ParserOption{
		jwt.WithValidMethods(v.algs),
		jwt.WithExpirationRequired(),
		jwt.WithIssuedAt(),
		jwt.WithLeeway(leeway),
		jwt.WithTimeFunc(now),
		jwt.WithStrictDecoding(),
	}
	if cfg.Audience != "" {
		opts = append(opts, jwt.WithAudience(cfg.Audience))
	}
	if cfg.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(cfg.Issuer))
	}
	v.parser = jwt.NewParser(opts...)
	return v, nil
}

// KeyInfo describes one configured verification key, for logging at start.
type KeyInfo struct {
	Alg string // HS256, RS256 or ES256
	KID string // "" when the key has none
}

// Keys lists the configured keys: the secret (if any) first, then the
// public keys in file order.
func (v *Verifier) Keys() []KeyInfo {
	var out []KeyInfo
	if v.secret != nil {
		out = append(out, KeyInfo{Alg: algHS256})
	}
	for _, k := range v.keys {
		out = append(out, KeyInfo{Alg: k.alg, KID: k.kid})
	}
	return out
}

// Verify checks token and returns who it names and what it grants. The
// error wraps one of the package's sentinels and never contains the token.
// A token it has verified before is answered from memory, with the same
// *Identity, until its exp (see [Verifier.Cached]); the caller must not
// modify the Identity.
func (v *Verifier) Verify(token string) (*Identity, error) {
	if len(token) > v.maxBytes {
		return nil, fmt.Errorf("%w: %d bytes, over the limit of %d", ErrTooLarge, len(token), v.maxBytes)
	}
	k := keyOf(token) // once, for the lookup and the put
	if id, ok := v.cache.get(k); ok {
		return id, nil
	}
	id, err := v.verify(token)
	if err == nil {
		v.cache.put(k, id)
	}
	return id, err
}

// Cached returns token's identity if Verify has verified it and it has
// not reached its exp by the Verifier's clock; it checks no signature.
// Up to 16,384 tokens are remembered, by their SHA-256 (cache.go).
func (v *Verifier) Cached(token string) (*Identity, bool) {
	if len(token) > v.maxBytes {
		return nil, false
	}
	return v.cache.get(keyOf(token))
}

// verify is Verify without the cache.
func (v *Verifier) verify(token string) (*Identity, error) {
	if i := strings.IndexFunc(token, notCompactJWS); i >= 0 {
		// Go's base64 decoder skips '\r' and '\n', so without this a
		// token with line breaks in it would verify as the same token
		// written differently.
		return nil, fmt.Errorf("%w: byte %d is neither base64url nor a segment separator", ErrMalformed, i)
	}
	var c Claims
	t, err := v.parser.ParseWithClaims(token, &c, v.keyfunc)
	if err != nil {
		return nil, v.classify(t, &c, err)
	}
	if c.ExpiresAt == nil { // WithExpirationRequired already refused it; belt and braces
		return nil, fmt.Errorf("%w: add an exp claim", ErrMissingExp)
	}
	if c.Subject == "" {
		return nil, fmt.Errorf("%w: sub is missing or empty", ErrBadClaims)
	}
	if len(c.Subject) > maxSubjectBytes {
		return nil, fmt.Errorf("%w: sub is %d bytes, over the limit of %d", ErrBadClaims, len(c.Subject), maxSubjectBytes)
	}
	g, err := c.Topics.Grants()
	if err != nil {
		return nil, err
	}
	return &Identity{ActorID: c.Subject, Expires: c.ExpiresAt.Time, Grants: g}, nil
}

// notCompactJWS reports whether r cannot appear in a compact JWS: the
// base64url alphabet (RFC 4648 §5, no padding) and the '.' separators.
func notCompactJWS(r rune) bool {
	switch {
	case 'A' <= r && r <= 'Z', 'a' <= r && r <= 'z', '0' <= r && r <= '9', r == '-', r == '_', r == '.':
		return false
	}
	return true
}

// keyfunc hands the parser the keys that may verify t: the secret for
// HS256, public keys of the matching type (and kid) for RS256 and ES256.
// The parser has already refused algorithms outside v.algs; keyfunc checks
// again, and checks each key's Go type, so that no key verifies a token of
// another family whatever the parser does.
func (v *Verifier) keyfunc(t *jwt.Token) (any, error) {
	if _, ok := t.Header["crit"]; ok {
		return nil, fmt.Errorf("%w: crit header not supported", ErrMalformed)
	}
	kidVal, hasKid := t.Header["kid"]
	kid, ok := kidVal.(string)
	if hasKid && !ok {
		return nil, fmt.Errorf("%w: kid header is not a string", ErrMalformed)
	}
	alg := t.Method.Alg()
	switch alg {
	case algHS256:
		if v.secret == nil {
			return nil, fmt.Errorf("%w: no secret configured for HS256", ErrBadAlgorithm)
		}
		return v.secret, nil // kid is ignored: there is one secret
	case algRS256, algES256:
		var set jwt.VerificationKeySet
		for _, k := range v.keys {
			if k.alg != alg || hasKid && k.kid != kid {
				continue
			}
			switch k.pub.(type) {
			case *rsa.PublicKey:
				if alg != algRS256 {
					continue
				}
			case *ecdsa.PublicKey:
				if alg != algES256 {
					continue
				}
			default:
				continue
			}
			set.Keys = append(set.Keys, k.pub)
		}
		if len(set.Keys) == 0 {
			if hasKid {
				return nil, fmt.Errorf("%w: no %s key has the token's kid", ErrUnknownKey, alg)
			}
			return nil, fmt.Errorf("%w: no %s key configured", ErrBadAlgorithm, alg)
		}
		return set, nil
	}
	return nil, fmt.Errorf("%w: %s", ErrBadAlgorithm, alg)
}

// classify maps a parse error to one sentinel with a detail of our own:
// jwt's texts are not passed on, so nothing of the token leaks into the
// error. t and c are what the parser got to before failing.
func (v *Verifier) classify(t *jwt.Token, c *Claims, err error) error {
	if t == nil || t.Header == nil {
		return fmt.Errorf("%w: want three base64url segments with a JSON header", ErrMalformed)
	}
	alg, _ := t.Header["alg"].(string)
	if !v.accepts(alg) {
		return fmt.Errorf("%w: alg %s; this server accepts %v", ErrBadAlgorithm, algName(alg), v.algs)
	}
	// Our keyfunc's errors carry their own detail.
	for _, s := range []error{ErrMalformed, ErrBadAlgorithm, ErrUnknownKey} {
		if errors.Is(err, s) {
			return innermost(err, s)
		}
	}
	switch {
	case errors.Is(err, jwt.ErrTokenMalformed):
		return fmt.Errorf("%w: header, claims or signature do not decode (base64url without padding, JSON claims of the right types)", ErrMalformed)
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return fmt.Errorf("%w: signed with another key, or altered", ErrBadSignature)
	case errors.Is(err, jwt.ErrTokenInvalidClaims):
		// The signature was good; report the first claim at fault.
		switch {
		case c.ExpiresAt == nil:
			return fmt.Errorf("%w: add an exp claim", ErrMissingExp)
		case errors.Is(err, jwt.ErrTokenExpired):
			return fmt.Errorf("%w: at %s", ErrExpired, c.ExpiresAt.UTC().Format(time.RFC3339))
		case errors.Is(err, jwt.ErrTokenNotValidYet):
			return fmt.Errorf("%w: nbf %s", ErrNotYetValid, c.NotBefore.UTC().Format(time.RFC3339))
		case errors.Is(err, jwt.ErrTokenUsedBeforeIssued):
			return fmt.Errorf("%w: iat %s is in the future", ErrNotYetValid, c.IssuedAt.UTC().Format(time.RFC3339))
		// jwt says only "a required claim is missing" of an absent aud
		// (or one of just "") and of an absent iss: tell them apart by
		// what the token holds.
		case errors.Is(err, jwt.ErrTokenInvalidAudience) || v.audience != "" && !slices.Contains(c.Audience, v.audience):
			return fmt.Errorf("%w: aud must include this server's audience", ErrAudience)
		case errors.Is(err, jwt.ErrTokenInvalidIssuer) || v.issuer != "" && c.Issuer != v.issuer:
			return fmt.Errorf("%w: iss must be this server's issuer", ErrIssuer)
		}
	}
	return fmt.Errorf("%w: not a token this server can verify", ErrMalformed)
}

// innermost returns the error in err's tree that wraps sentinel directly
// (one of keyfunc's), so its detail survives jwt's wrapping.
func innermost(err, sentinel error) error {
	var found error
	var walk func(error)
	walk = func(e error) {
		if e == nil || found != nil {
			return
		}
		if u, ok := e.(interface{ Unwrap() error }); ok && u.Unwrap() == sentinel {
			found = e
			return
		}
		switch u := e.(type) {
		case interface{ Unwrap() []error }:
			for _, x := range u.Unwrap() {
				walk(x)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	walk(err)
	if found == nil {
		return sentinel
	}
	return found
}

// accepts reports whether alg is one of the configured algorithms.
func (v *Verifier) accepts(alg string) bool {
	for _, a := range v.algs {
		if a == alg {
			return true
		}
	}
	return false
}

// algName names alg in an error: a well-known algorithm by its name,
// anything else generically (the header is attacker-chosen text).
func algName(alg string) string {
	switch alg {
	case "none", "HS256", "HS384", "HS512", "RS256", "RS384", "RS512",
		"ES256", "ES384", "ES512", "PS256", "PS384", "PS512", "EdDSA":
		return fmt.Sprintf("%q", alg)
	case "":
		return "missing"
	}
	return "unsupported"
}
