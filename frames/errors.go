package frames

import "fmt"

// Code is a stable, machine-readable error code carried in ack.error.code.
// Codes never change meaning; new ones may be added.
type Code string

// Decoding errors: the frame itself is malformed.
const (
	CodeBadFrame        Code = "X_BAD_FRAME"        // not UTF-8, not JSON (nested over 10,000 deep included), not an object, empty
	CodeProtocolVersion Code = "X_PROTOCOL_VERSION" // "v" missing or not 1
	CodeUnknownType     Code = "X_UNKNOWN_TYPE"     // "type" missing or not one of the ten
	CodeMissingField    Code = "X_MISSING_FIELD"    // a required field is absent
	CodeBadField        Code = "X_BAD_FIELD"        // a field has the wrong JSON type, is empty where it must not be, or is outside its set, range or length limit
)

// Session errors: the frame is well formed but cannot be carried out.
const (
	CodeHelloRequired   Code = "X_HELLO_REQUIRED"         // a frame before hello
	CodeDuplicateHello  Code = "X_DUPLICATE_HELLO"        // a second hello on one session
	CodeUnexpectedFrame Code = "X_UNEXPECTED_FRAME"       // a server-only frame sent by a client
	CodeUnsupported     Code = "X_UNSUPPORTED"            // a feature this server does not offer (yet)
	CodeBadTopic        Code = "X_BAD_TOPIC"              // topic name empty, too long, or bad characters
	CodeSIDInUse        Code = "X_SID_IN_USE"             // subscribe add with a sid already active
	CodeNotSubscribed   Code = "X_NOT_SUBSCRIBED"         // subscribe drop of an unknown sid
	CodeCursorExpired   Code = "X_CURSOR_EXPIRED"         // the cursor cannot be resumed; a fresh snapshot follows
	CodeUnknownMutation Code = "X_UNKNOWN_MUTATION"       // mutate.name not known
	CodeBadInput        Code = "X_BAD_INPUT"              // mutate.input does not fit the mutation
	CodeSeqGap          Code = "X_SEQ_GAP"                // mutate.seq skips ahead of the next expected
	CodeSeqForgotten    Code = "X_SEQ_FORGOTTEN"          // a retry of a seq too old to remember
	CodeSeqReused       Code = "X_SEQ_REUSED"             // a seq already answered for another key
	CodeEpochFenced     Code = "X_EPOCH_FENCED"           // the producer epoch is older than the current one
	CodeTooManySubs     Code = "X_TOO_MANY_SUBSCRIPTIONS" // subscribe add over the session's subscription limit
	CodeInternal        Code = "X_INTERNAL"               // the server failed; retry later
)

// Security errors: who the client is, what it may do, and how much.
// docs/security.md maps each token failure to its code.
const (
	CodeTokenRequired    Code = "X_TOKEN_REQUIRED"      // hello without a token on a server that requires one
	CodeTokenExpired     Code = "X_TOKEN_EXPIRED"       // the token's exp has passed: refresh it with a new hello
	CodeTokenNotYetValid Code = "X_TOKEN_NOT_YET_VALID" // the token's nbf or iat is in the future
	CodeBadToken         Code = "X_BAD_TOKEN"           // the token is malformed, too large, lacks exp, or has bad claims
	CodeTokenRejected    Code = "X_TOKEN_REJECTED"      // signature, algorithm, key, audience or issuer not accepted; or another sub on refresh
	CodeForbidden        Code = "X_FORBIDDEN"           // the token does not grant this action on this topic
	CodeRateLimited      Code = "X_RATE_LIMITED"        // over the session's frame rate: the frame was dropped
	CodeTooManySessions  Code = "X_TOO_MANY_SESSIONS"   // the actor already has the most sessions allowed
)

// Presence errors: a presence frame is well formed but refused.
const (
	CodePresenceNotSubscribed Code = "X_PRESENCE_NOT_SUBSCRIBED" // presence join/update on a topic the session has not subscribed to
	CodePresenceNotJoined     Code = "X_PRESENCE_NOT_JOINED"     // presence update without a join, or after a leave
	CodePresenceConflict      Code = "X_PRESENCE_CONFLICT"       // the member id (hello.clientId) is held by another actor in the topic
	CodePresenceRateLimited   Code = "X_PRESENCE_RATE_LIMITED"   // a join that needs a member list, over the session's budget of lists
	CodeMetaTooLarge          Code = "X_META_TOO_LARGE"          // a presence member's meta is over the server's limit
)

// Error is a typed protocol error. It travels to the client as an ack:
// Ack{Ref: e.Ref, Error: e.Body()}. Ref, when known, is the ack ref of the
// frame that caused it (see [Ack]). [Decode] returns only *Error; use
// errors.As to get one.
type Error struct {
	Code  Code
	Cause string // what was wrong, naming the field
	Fix   string // what the sender should do instead
	Docs  string // optional link
	Ref   string
}

func (e *Error) Error() string {
	return fmt.Sprintf("frames: %s: %s", e.Code, e.Cause)
}

// NewError returns an error with the given code, ack ref, cause and fix.
// cause says what was wrong, naming the field ("mutate.seq: want 7, got
// 9"); fix says what the sender should do instead. An empty fix is
// replaced by the code's default (see [DefaultFix]).
func NewError(code Code, ref, cause, fix string) *Error {
	if fix == "" {
		fix = DefaultFix(code)
	}
	return &Error{Code: code, Cause: cause, Fix: fix, Ref: ref}
}

// DefaultFix returns a generic fix text for code, or "" for a code this
// package does not define. Errors that know more should say more.
func DefaultFix(code Code) string {
	return defaultFixes[code]
}

var defaultFixes = map[Code]string{
	CodeBadFrame:        "Send one JSON object per line, UTF-8, in a WebSocket text message.",
	CodeProtocolVersion: "Send \"v\": 1 in every frame; this server speaks protocol version 1.",
	CodeUnknownType:     "Set \"type\" to one of the ten frame types in docs/protocol.md.",
	CodeMissingField:    "Add the field named in the cause; see docs/protocol.md for the frame's fields.",
	CodeBadField:        "Send the field named in the cause with the JSON type and value the protocol allows.",
	CodeHelloRequired:   "Send hello as the first frame of every connection and wait for the server's hello.",
	CodeDuplicateHello:  "Send hello once per connection; open a new connection to start a new session.",
	CodeUnexpectedFrame: "Clients send only hello, subscribe, mutate and presence.",
	CodeUnsupported:     "Do not use this feature with this server version.",
	CodeBadTopic:        "Use a topic name of 1 to 255 bytes from A-Z a-z 0-9 and _ . : @ / -.",
	CodeSIDInUse:        "Pick a sid not active on this session, or drop the subscription first.",
	CodeNotSubscribed:   "Drop only sids this session has added and not yet dropped.",
	CodeCursorExpired:   "Treat messages between your cursor and the snapshot that follows as lost.",
	CodeUnknownMutation: "Use a mutation name this server knows, such as \"publish\".",
	CodeBadInput:        "Send mutate.input in the shape the mutation expects.",
	CodeSeqGap:          "Send mutates with seq increasing by 1; resend the missing seqs first.",
	CodeSeqForgotten:    "This retry is too old to answer; treat its outcome as unknown.",
	CodeSeqReused:       "This mutate was not applied: keep seq with clientId across restarts (hello.seq), or raise the epoch.",
	CodeEpochFenced:     "A newer connection of this producer took over; reconnect with a higher epoch.",
	CodeTooManySubs:     "Drop a subscription before adding another.",
	CodeInternal:        "Retry later; for a mutate, send a new one (next seq, new key): its outcome is recorded.",

	// Security errors.
	CodeTokenRequired:    "Send hello.token: a JWT from your token issuer.",
	CodeTokenExpired:     "Fetch a fresh token: send a new hello with it on this connection before the grace period ends, or, if the connection was closed, open a new one with it.",
	CodeTokenNotYetValid: "Check the clocks of the token issuer and this client; use the token once its nbf has passed.",
	CodeBadToken:         "Fix the token issuer: send a compact JWS with exp, sub and valid topic patterns.",
	CodeTokenRejected:    "Get a token from the issuer this server trusts, for this server's audience, for the same sub.",
	CodeForbidden:        "Ask your token issuer for a token that grants this action on this topic.",
	CodeRateLimited:      "Send fewer frames per second; resend the dropped frame after a pause.",
	CodeTooManySessions:  "Close another session of this actor before opening a new one.",

	// Presence errors.
	CodePresenceNotSubscribed: "Subscribe to the topic before joining its presence.",
	CodePresenceNotJoined:     "Send presence join (again) before update; a member expires when its session stops answering.",
	CodePresenceConflict:      "Use a hello.clientId of your own; another actor's session holds this one in the topic.",
	CodePresenceRateLimited:   "Send the join again after a pause; stay joined rather than leave and join again, and a member's changes come as diffs.",
	CodeMetaTooLarge:          "Send smaller presence meta (the server's limit is 512 bytes by default).",
}

// Body returns the wire form of e.
func (e *Error) Body() *ErrorBody {
	return &ErrorBody{Code: e.Code, Cause: e.Cause, Fix: e.Fix, Docs: e.Docs}
}
