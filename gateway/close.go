package gateway

import "github.com/coder/websocket"

// closeReason says why a session ended. It picks the close code and text
// sent to the client and labels syncgate_closes_total.
type closeReason int

const (
	reasonNone            closeReason = iota
	reasonClientClosed                // the client closed the connection
	reasonReadError                   // the connection failed while reading
	reasonWriteError                  // a write failed or timed out (not one that found the connection closed: see writeFailed)
	reasonMessageTooBig               // a client message exceeded MaxFrameBytes
	reasonHelloTimeout                // no hello within HelloTimeout
	reasonSlowConsumer                // the send queue overflowed
	reasonPingTimeout                 // no pong within PongTimeout
	reasonShutdown                    // the server is shutting down
	reasonDrain                       // the session's drain slot came (Server.Drain)
	reasonAuth                        // hello's token was refused (auth.go)
	reasonTokenExpired                // the token expired and was not refreshed within TokenGrace
	reasonRateLimited                 // over the frame rate for RateLimitClose
	reasonTooManySessions             // the actor has MaxSessionsPerActor sessions
	reasonLogError                    // a persisted topic's log could not be read for a replay
	numCloseReasons
)

// Close codes syncgate sends besides the standard ones (docs/protocol.md).
const (
	StatusSlowConsumer websocket.StatusCode = 4001
	StatusPingTimeout  websocket.StatusCode = 4002
)

var closeReasons = [numCloseReasons]struct {
	label string
	code  websocket.StatusCode
	text  string // at most 123 bytes: it is a close frame's reason
}{
	reasonNone:          {"none", websocket.StatusInternalError, "internal error"},
	reasonClientClosed:  {"client_closed", websocket.StatusNormalClosure, ""},
	reasonReadError:     {"read_error", websocket.StatusAbnormalClosure, ""},
	reasonWriteError:    {"write_error", websocket.StatusAbnormalClosure, ""},
	reasonMessageTooBig: {"message_too_big", websocket.StatusMessageTooBig, "message too big"},
	reasonHelloTimeout:  {"hello_timeout", websocket.StatusPolicyViolation, "no hello frame within the hello timeout"},
	reasonSlowConsumer:  {"slow_consumer", StatusSlowConsumer, "slow consumer: send queue overflowed; reconnect and resume from your cursor"},
	reasonPingTimeout:   {"ping_timeout", StatusPingTimeout, "no pong within the pong timeout"},
	reasonShutdown:      {"shutdown", websocket.StatusGoingAway, "server shutting down"},
	reasonDrain:         {"drain", websocket.StatusServiceRestart, "server restarting: reconnect as the reconnect frame said"},

	reasonAuth:            {"auth", websocket.StatusPolicyViolation, "token refused: see the error ack"},
	reasonTokenExpired:    {"token_expired", websocket.StatusPolicyViolation, "token expired and not refreshed within the grace period"},
	reasonRateLimited:     {"rate_limited", websocket.StatusPolicyViolation, "over the frame rate for too long"},
	reasonTooManySessions: {"too_many_sessions", websocket.StatusPolicyViolation, "too many sessions for this actor"},
	reasonLogError:        {"log_error", websocket.StatusInternalError, "could not read a topic's log: see the error ack; reconnect and resume"},
}

func (r closeReason) String() string { return closeReasons[r].label }

// sendsCloseFrame reports whether the server starts a close handshake for r;
// for the others the connection is already gone or the peer sent the close.
func (r closeReason) sendsCloseFrame() bool {
	switch r {
	case reasonHelloTimeout, reasonSlowConsumer, reasonPingTimeout, reasonShutdown, reasonDrain, reasonNone,
		reasonAuth, reasonTokenExpired, reasonRateLimited, reasonTooManySessions, reasonLogError:
		return true
	}
	return false
}

// flushes reports whether the writer delivers what is queued before the
// close frame: a server-initiated goodbye (shutdown, drain) does, so acks
// already decided reach the client, and so does a policy close, so the
// error ack that explains it does.
func (r closeReason) flushes() bool {
	switch r {
	case reasonShutdown, reasonDrain, reasonAuth, reasonTokenExpired, reasonRateLimited, reasonTooManySessions,
		reasonLogError:
		return true
	}
	return false
}
