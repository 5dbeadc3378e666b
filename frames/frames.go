// Package frames is the syncgate wire protocol, version 1: the ten frame
// kinds, their strict decoder and their encoder. It imports nothing of ours.
//
// Start with [Decode] and [Encode]. docs/protocol.md is the normative spec.
//
// # Protocol flow
//
//	client                                   server
//	hello {buildId, sessionId:null, ...}  →
//	                                      ←  hello {sessionId, actorId, ...}
//	subscribe {op:add, sid, target}       →
//	                                      ←  ack {ref:sid}
//	                                      ←  snapshot {sid, rows, cursor}
//	mutate {key, seq, name:"publish"}     →
//	                                      ←  ack {ref:key, lsn}
//	                                      ←  patch {sid, patches, lsn} (every subscriber)
//
// A WebSocket text message carries one frame or several separated by '\n'.
// Compact JSON never contains a raw newline, so splitting on '\n' is exact.
package frames

import (
	"encoding/json"
	"time"
)

// ProtocolVersion is the value of every frame's "v" field.
const ProtocolVersion = 1

// Type names a frame kind; it is the frame's "type" field.
type Type string

// The ten frame kinds. Direction is noted per kind; a frame sent the wrong
// way is answered with [CodeUnexpectedFrame].
const (
	TypeHello           Type = "hello"            // both: {buildId, sessionId|null, actorId|null, resume, token?, clientId?, epoch?, seq?, maxMessage?, frameRate?, frameBurst?}
	TypeSubscribe       Type = "subscribe"        // client: {op, sid, target}
	TypeSnapshot        Type = "snapshot"         // server: {sid, rows, cursor}
	TypePatch           Type = "patch"            // server: {sid, patches, lsn}
	TypeMutate          Type = "mutate"           // client: {key, seq, name, input}
	TypeAck             Type = "ack"              // server: {ref, lsn|null, error|null}
	TypeRebase          Type = "rebase"           // server: {key, entity, strategy, row|null}
	TypePresence        Type = "presence"         // both: {topic, op, members, count?}
	TypeReconnect       Type = "reconnect"        // server: {afterMs, reason}
	TypeUpdateAvailable Type = "update-available" // server: {buildId}
)

// Frame is one decoded protocol frame: a pointer to one of the ten frame
// structs below.
type Frame interface {
	FrameType() Type
}

// Cursor is a position in a subscription. For a topic, QID is
// "topic:<name>", LSN the last offset seen, Digest "" (on a persisted topic,
// the identity of the log LSN is an offset of), IDs empty, Count 0 and At
// the time in milliseconds since the Unix epoch.
type Cursor struct {
	QID    string   `json:"qid"`
	LSN    string   `json:"lsn"`
	Digest string   `json:"digest"`
	IDs    []string `json:"ids"`
	Count  int64    `json:"count"`
	At     int64    `json:"at"`
}

// Hello opens a session (client to server, SessionID nil) and is answered by
// the server with the session's id. Token, ClientID, Epoch, Seq,
// MaxMessage, FrameRate and FrameBurst
// are optional on the wire: their zero values are left out when encoding,
// and an absent field decodes to the zero value.
type Hello struct {
	BuildID   string   `json:"buildId"`
	SessionID *string  `json:"sessionId"`
	ActorID   *string  `json:"actorId"`
	Resume    []Cursor `json:"resume"`
	Token     string   `json:"token,omitempty"`
	ClientID  string   `json:"clientId,omitempty"`
	Epoch     int64    `json:"epoch,omitempty"`
	// Seq is sent by a client with a ClientID: the seq of the first mutate
	// this connection will carry (its lowest unacknowledged one, else its
	// next), every seq below it having been answered. The server's
	// producer continues there if it expected less. Nil: not said.
	Seq *int64 `json:"seq,omitempty"`
	// MaxMessage is sent by the server: the largest client message in
	// bytes it accepts (larger ones are closed with 1009), so that a
	// client batching its frames knows how far it may go.
	MaxMessage int64 `json:"maxMessage,omitempty"`
	// FrameRate and FrameBurst are sent by a server that limits each
	// session's frames: at most FrameRate per second on average, FrameBurst
	// at once. Frames over them are dropped (X_RATE_LIMITED), so a client
	// that sends fast paces itself below them. Absent: no limit.
	FrameRate  float64 `json:"frameRate,omitempty"`
	FrameBurst int64   `json:"frameBurst,omitempty"`
}

// Subscribe operations.
const (
	OpAdd  = "add"
	OpDrop = "drop"
)

// Target kinds.
const (
	TargetTopic = "topic"
	TargetQuery = "query"
)

// Target is what a subscription follows: a topic (Kind "topic", Topic set)
// or a live query (Kind "query", QID and Input set). Cursor is nil for a
// fresh subscription and set to resume.
type Target struct {
	Kind   string          `json:"kind"`
	Topic  string          `json:"topic,omitempty"`
	QID    string          `json:"qid,omitempty"`
	Input  json.RawMessage `json:"input,omitempty"`
	Cursor *Cursor         `json:"cursor"`
}

// Subscribe adds or drops the subscription named by SID (chosen by the
// client, unique within its session). Target is required on the wire for
// both ops; a drop uses only SID.
type Subscribe struct {
	Op     string `json:"op"`
	SID    string `json:"sid"`
	Target Target `json:"target"`
}

// Snapshot is the state of a subscription when it starts. Each row is a JSON
// object with a string "id".
type Snapshot struct {
	SID    string            `json:"sid"`
	Rows   []json.RawMessage `json:"rows"`
	Cursor Cursor            `json:"cursor"`
}

// Patch operations.
const (
	PatchInsert = "insert"
	PatchUpdate = "update"
	PatchDelete = "delete"
)

// PatchOp is one change to a subscription's rows. Row is nil for a delete.
// Index is the row's position in an ordered query, when it has one.
type PatchOp struct {
	Op    string          `json:"op"`
	ID    string          `json:"id"`
	Row   json.RawMessage `json:"row"`
	LSN   string          `json:"lsn"`
	Index *int64          `json:"index,omitempty"`
}

// Patch carries changes to one subscription; LSN is the offset of the last.
type Patch struct {
	SID     string    `json:"sid"`
	Patches []PatchOp `json:"patches"`
	LSN     string    `json:"lsn"`
}

// Mutate asks the server to run the named mutation. Seq counts from 0 per
// producer (clientId, epoch); Key identifies the mutation for idempotence.
type Mutate struct {
	Key   string          `json:"key"`
	Seq   int64           `json:"seq"`
	Name  string          `json:"name"`
	Input json.RawMessage `json:"input"`
}

// Ack answers a client frame. Ref is the subscribe's sid, the mutate's key,
// "presence:<topic>" for presence, or "" when the frame could not be parsed
// far enough to know. LSN is the offset the mutation produced, if any.
type Ack struct {
	Ref   string     `json:"ref"`
	LSN   *string    `json:"lsn"`
	Error *ErrorBody `json:"error"`
}

// ErrorBody is the wire form of a typed error.
type ErrorBody struct {
	Code  Code   `json:"code"`
	Cause string `json:"cause"`
	Fix   string `json:"fix"`
	Docs  string `json:"docs,omitempty"`
}

// Rebase strategies.
const (
	StrategyServerWins    = "server-wins"
	StrategyLastWriteWins = "last-write-wins"
	StrategyCustom        = "custom"
)

// Rebase tells a client that its optimistic mutation Key lost a conflict on
// Entity and what the row is now (nil if deleted).
type Rebase struct {
	Key      string          `json:"key"`
	Entity   string          `json:"entity"`
	Strategy string          `json:"strategy"`
	Row      json.RawMessage `json:"row"`
}

// Presence operations.
const (
	PresenceJoin   = "join"
	PresenceLeave  = "leave"
	PresenceUpdate = "update"
	PresenceSync   = "sync"
)

// Member is one session's presence in a topic. UpdatedAt is milliseconds
// since the Unix epoch.
type Member struct {
	ID        string          `json:"id"`
	ActorID   *string         `json:"actorId"`
	Meta      json.RawMessage `json:"meta"`
	UpdatedAt int64           `json:"updatedAt"`
}

// Presence carries membership changes (or, with Op "sync", the full list).
//
// Count is optional on the wire and sent by the server only: the total
// number of members present when the list leaves some out (the topic has
// more than the server lists, or a sync lists fewer while members that
// left before their join was sent hold listed places), so a client can
// show "and N more". Zero is left out when encoding, and an absent count
// decodes to zero: the list is complete.
type Presence struct {
	Topic   string   `json:"topic"`
	Op      string   `json:"op"`
	Members []Member `json:"members"`
	Count   int64    `json:"count,omitempty"`
}

// Reconnect reasons.
const (
	ReasonDrain     = "drain"
	ReasonOverload  = "overload"
	ReasonRebalance = "rebalance"
)

// Reconnect tells the client to open a new connection after AfterMs.
type Reconnect struct {
	AfterMs int64  `json:"afterMs"`
	Reason  string `json:"reason"`
}

// MaxAfterMs is the longest wait a reconnect frame asks for: one hour.
// A server never sends more; a client takes a larger afterMs as this
// (see [Reconnect.Delay]).
const MaxAfterMs = 3_600_000

// Delay is how long the client waits: AfterMs, at most MaxAfterMs.
func (r *Reconnect) Delay() time.Duration {
	return time.Duration(min(max(r.AfterMs, 0), MaxAfterMs)) * time.Millisecond
}

// UpdateAvailable tells the client a newer app build is current.
type UpdateAvailable struct {
	BuildID string `json:"buildId"`
}

func (*Hello) FrameType() Type           { return TypeHello }
func (*Subscribe) FrameType() Type       { return TypeSubscribe }
func (*Snapshot) FrameType() Type        { return TypeSnapshot }
func (*Patch) FrameType() Type           { return TypePatch }
func (*Mutate) FrameType() Type          { return TypeMutate }
func (*Ack) FrameType() Type             { return TypeAck }
func (*Rebase) FrameType() Type          { return TypeRebase }
func (*Presence) FrameType() Type        { return TypePresence }
func (*Reconnect) FrameType() Type       { return TypeReconnect }
func (*UpdateAvailable) FrameType() Type { return TypeUpdateAvailable }
