// Package auth checks who a client is and what it may do: it verifies the
// JWT a client sends in its hello ([Verifier.Verify]), turns the token's
// claims into per-topic [Grants], and decides which browser origins may
// open a session ([OriginPolicy]). It imports the standard library and
// github.com/golang-jwt/jwt/v5 only; it reads no environment variables
// and no files: cmd/syncgate reads SYNCGATE_JWT_SECRET and the
// SYNCGATE_JWT_KEYS file and passes their contents in a [Config].
//
// Start at [New] and [Verifier.Verify]; docs/security.md explains the
// threat model and every control.
//
// # Tokens
//
// A token is a compact JWS (three base64url segments, strict decoding, no
// padding) of at most [Config.MaxTokenBytes] bytes, checked before any
// parsing. Accepted algorithms follow from the configured keys: HS256 when
// [Config.Secret] is set, RS256 when the keys hold an RSA key, ES256 when
// they hold a P-256 key. "none" and every other algorithm are refused, and
// a key only ever verifies its own algorithm: an RSA or EC public key is
// never used as an HMAC secret and the secret never checks an RS/ES token.
// A [Config.Secret] that is a key's text (PEM, JWK or JWKS, OpenSSH) is
// refused by New: whoever has the public key could sign with it.
// Key headers that point elsewhere (jku, x5u, jwk, x5c) are ignored: keys
// come from the configuration only. A token with a "crit" header is
// refused.
//
// Claims: exp is required; nbf and iat, when present, must not be in the
// future; exp, nbf and iat are compared with [Config.Leeway] of slack. aud
// must contain [Config.Audience] and iss must equal [Config.Issuer] when
// those are set. sub (1-256 bytes) becomes the session's actor id. The
// optional "topics" claim grants topic patterns per action:
//
//	{"sub":"u1","exp":1767225600,
//	 "topics":{"subscribe":["room:*"],"publish":["room:42"],"presence":["room:*"]}}
//
// A token without "topics" grants nothing. A fourth action, "manage",
// matters only to the Durable Streams HTTP API: creating, closing (or
// setting the TTL of) and deleting a topic's stream.
//
// # Key selection
//
// A token with a "kid" header is checked only against the keys of its
// algorithm whose kid equals it; none such is [ErrUnknownKey]. A token
// without "kid" is checked against every key of its algorithm, so keys can
// be rotated by listing old and new side by side. HS256 tokens use the one
// secret whatever their kid. A PEM key's kid is its "kid" PEM header (see
// [New]); a JWKS key's kid is its "kid" member.
//
// # Topic patterns
//
// A pattern is a topic name (the characters A-Z a-z 0-9 _ . : @ / -) in
// which whole segments may be wildcards. Segments are the runs between the
// separators ':' and '/'. The rules, all of them:
//
//   - A segment "*" matches exactly one non-empty segment of the topic,
//     which contains no separator.
//   - A last segment "**" matches the non-empty rest of the topic,
//     separators included: "room:**" matches "room:1" and "room:1/chat",
//     not "room" nor "room:". A pattern that is just "**" matches every
//     topic.
//   - Every other byte, separators included, matches itself exactly
//     (case-sensitive). A pattern without wildcards matches only itself.
//
// '*' anywhere else ("room-*", "a*b", "***", "**:x") makes the pattern
// invalid, and a token carrying an invalid pattern is refused
// ([ErrBadClaims]) rather than half-applied. Patterns are never turned
// into regular expressions.
//
// # Errors
//
// Verify's errors wrap exactly one of the sentinels (ErrTooLarge,
// ErrMalformed, ErrBadAlgorithm, ErrUnknownKey, ErrBadSignature,
// ErrMissingExp, ErrExpired, ErrNotYetValid, ErrAudience, ErrIssuer,
// ErrBadClaims); use errors.Is. Their texts never contain the token or
// any part of it, so they can be logged and sent to the client as a cause.
//
// # Concurrency
//
// Grants and an OriginPolicy are immutable after construction; a
// Verifier's configuration is (it remembers what it verified, under a
// lock). All are safe for concurrent use.
package auth
