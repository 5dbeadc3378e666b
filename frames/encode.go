package frames

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"
)

// ErrUnencodable is returned (wrapped, with the reason) by the encoders
// for a frame that cannot be put on the wire: a nil frame, a Frame type
// not defined in this package, or a json.RawMessage field that is not one
// valid JSON value in UTF-8 or that would nest the frame deeper than
// 10,000 arrays and objects (which Decode refuses).
var ErrUnencodable = errors.New("frames: frame cannot be encoded")

// Encode returns the wire form of f: compact JSON with "type" and then
// "v":1 first, then the frame's fields in struct order. Strings are
// escaped as encoding/json does without HTML escaping: '<', '>' and '&'
// stay as they are, U+2028 and U+2029 are escaped, invalid UTF-8 becomes
// U+FFFD. json.RawMessage fields are compacted; nil ones are written as
// null, nil slices as []. The result never contains a raw '\n' and is
// valid UTF-8.
//
// Encode does not check that f would pass [Decode]'s rules (a non-empty
// sid, a known enum value, ...); building valid frames is the caller's
// job. It does check what makes a frame unreadable JSON: raw fields that
// are not JSON or nest the frame over 10,000 deep. Every frame returned
// by Decode encodes, and decodes back to an equal frame.
func Encode(f Frame) ([]byte, error) {
	return AppendEncode(nil, f)
}

// AppendEncode appends the wire form of f (see [Encode]) to dst and
// returns the extended slice. On error it returns dst unchanged.
//
// Ack, patch, presence and mutate frames (the ones sent at high rates) are
// written by hand without reflection or allocation beyond growing dst; the
// other kinds go through encoding/json.
func AppendEncode(dst []byte, f Frame) ([]byte, error) {
	switch f := f.(type) {
	case *Ack:
		if f == nil {
			break
		}
		return appendAck(dst, f), nil
	case *Patch:
		if f == nil {
			break
		}
		out, err := AppendPatchBody(AppendPatchPrefix(dst, f.SID), f.Patches, f.LSN)
		if err != nil {
			return dst, err
		}
		return out, nil
	case *Presence:
		if f == nil {
			break
		}
		return appendPresence(dst, f)
	case *Mutate:
		if f == nil {
			break
		}
		return appendMutate(dst, f)
	default:
		return appendReflect(dst, f)
	}
	return dst, fmt.Errorf("%w: nil %T", ErrUnencodable, f)
}

// AppendPatchPrefix appends the start of a patch frame,
// {"type":"patch","v":1,"sid":<sid>, to dst. With a body from
// [AppendPatchBody] it forms a whole frame, byte for byte what [Encode]
// writes for the same Patch.
//
// A broadcast encodes the body once per publication; each subscriber's
// writer sends its own prefix (which can be computed once per
// subscription) followed by the shared body.
func AppendPatchPrefix(dst []byte, sid string) []byte {
	dst = append(dst, `{"type":"patch","v":1,"sid":`...)
	return appendString(dst, sid)
}

// AppendPatchBody appends the rest of a patch frame,
// ,"patches":[...],"lsn":<lsn>}, to dst (see [AppendPatchPrefix]). A nil
// patches slice is written as []. Each op's Row must be nil (written as
// null) or one valid JSON value in UTF-8; it is copied, compacted if it
// holds whitespace. On error it returns dst unchanged and an error
// wrapping [ErrUnencodable].
func AppendPatchBody(dst []byte, patches []PatchOp, lsn string) ([]byte, error) {
	n := len(dst)
	dst = append(dst, `,"patches":[`...)
	for i := range patches {
		op := &patches[i]
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"op":`...)
		dst = appendString(dst, op.Op)
		dst = append(dst, `,"id":`...)
		dst = appendString(dst, op.ID)
		dst = append(dst, `,"row":`...)
		if op.Row == nil {
			dst = append(dst, "null"...)
		} else {
			var err error
			if dst, err = appendRaw(dst, op.Row, depthPatchRow); err != nil {
				return dst[:n], fmt.Errorf("%w: patch.patches[%d].row: %w", ErrUnencodable, i, err)
			}
		}
		dst = append(dst, `,"lsn":`...)
		dst = appendString(dst, op.LSN)
		if op.Index != nil {
			dst = append(dst, `,"index":`...)
			dst = strconv.AppendInt(dst, *op.Index, 10)
		}
		dst = append(dst, '}')
	}
	dst = append(dst, `],"lsn":`...)
	dst = appendString(dst, lsn)
	return append(dst, '}'), nil
}

// AppendInsertBody appends the body of a patch carrying one insert op at
// offset lsn, the form a topic message takes: the same bytes as
// AppendPatchBody(dst, []PatchOp{{Op: PatchInsert, ID: lsn, Row: row,
// LSN: lsn}}, lsn), where row is what appendRow appends. Unlike
// AppendPatchBody it does not check the row, so appendRow must append one
// valid, compact JSON object in UTF-8 built from parts the caller has
// already validated (a decoded frame's RawMessage fields are), nesting at
// most 9,997 deep (the frame's 10,000 less the three levels around the
// row). A value taken from a decoded frame may nest deeper than that in
// a row: a mutate's input.data sits two levels deeper in a topic row
// ({"patches":[{"row":{"data":) than in the mutate ({"input":{"data":).
// It is the broadcast hot path: once per publish, without a validating
// pass or a copy.
func AppendInsertBody(dst []byte, lsn string, appendRow func(dst []byte) []byte) []byte {
	dst = append(dst, `,"patches":[{"op":"insert","id":`...)
	dst = appendString(dst, lsn)
	dst = append(dst, `,"row":`...)
	dst = appendRow(dst)
	dst = append(dst, `,"lsn":`...)
	dst = appendString(dst, lsn)
	dst = append(dst, `}],"lsn":`...)
	dst = appendString(dst, lsn)
	return append(dst, '}')
}

// appendPresence writes a presence frame by hand: a sync of a busy topic
// lists every member, and the server sends one to each joiner.
func appendPresence(dst []byte, p *Presence) ([]byte, error) {
	start := len(dst)
	dst = append(dst, `{"type":"presence","v":1,"topic":`...)
	dst = appendString(dst, p.Topic)
	dst = append(dst, `,"op":`...)
	dst = appendString(dst, p.Op)
	dst = append(dst, `,"members":[`...)
	for i := range p.Members {
		m := &p.Members[i]
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"id":`...)
		dst = appendString(dst, m.ID)
		dst = append(dst, `,"actorId":`...)
		if m.ActorID == nil {
			dst = append(dst, "null"...)
		} else {
			dst = appendString(dst, *m.ActorID)
		}
		dst = append(dst, `,"meta":`...)
		if len(m.Meta) == 0 {
			dst = append(dst, "null"...) // as encoding/json writes a nil RawMessage
		} else {
			var err error
			if dst, err = appendRaw(dst, m.Meta, depthMemberMeta); err != nil {
				return dst[:start], fmt.Errorf("%w: presence: members[%d].meta: %w", ErrUnencodable, i, err)
			}
		}
		dst = append(dst, `,"updatedAt":`...)
		dst = strconv.AppendInt(dst, m.UpdatedAt, 10)
		dst = append(dst, '}')
	}
	dst = append(dst, ']')
	if p.Count != 0 {
		dst = append(dst, `,"count":`...)
		dst = strconv.AppendInt(dst, p.Count, 10)
	}
	return append(dst, '}'), nil
}

func appendAck(dst []byte, a *Ack) []byte {
	dst = append(dst, `{"type":"ack","v":1,"ref":`...)
	dst = appendString(dst, a.Ref)
	dst = append(dst, `,"lsn":`...)
	if a.LSN == nil {
		dst = append(dst, "null"...)
	} else {
		dst = appendString(dst, *a.LSN)
	}
	dst = append(dst, `,"error":`...)
	if e := a.Error; e == nil {
		dst = append(dst, "null"...)
	} else {
		dst = append(dst, `{"code":`...)
		dst = appendString(dst, string(e.Code))
		dst = append(dst, `,"cause":`...)
		dst = appendString(dst, e.Cause)
		dst = append(dst, `,"fix":`...)
		dst = appendString(dst, e.Fix)
		if e.Docs != "" {
			dst = append(dst, `,"docs":`...)
			dst = appendString(dst, e.Docs)
		}
		dst = append(dst, '}')
	}
	return append(dst, '}')
}

// appendMutate appends m as appendReflect would (encoding/json, HTML
// escaping off).
func appendMutate(dst []byte, m *Mutate) ([]byte, error) {
	out := append(dst, `{"type":"mutate","v":1,"key":`...)
	out = appendString(out, m.Key)
	out = append(out, `,"seq":`...)
	out = strconv.AppendInt(out, m.Seq, 10)
	out = append(out, `,"name":`...)
	out = appendString(out, m.Name)
	out = append(out, `,"input":`...)
	out, err := appendRawOrNull(out, m.Input, depthMutateInput)
	if err != nil {
		return dst, fmt.Errorf("%w: mutate: input: %w", ErrUnencodable, err)
	}
	return append(out, '}'), nil
}

// AppendPublishInput appends the input of the built-in "publish" mutation,
// {"topic":<topic>,"data":<data>}, to dst: what an encoding/json Encoder
// with HTML escaping off writes for that object (as [Encode] escapes),
// data compacted (nil data is null). It fails, returning dst
// unchanged, if data is not one valid JSON value in UTF-8.
func AppendPublishInput(dst []byte, topic string, data json.RawMessage) ([]byte, error) {
	out := append(dst, `{"topic":`...)
	out = appendString(out, topic)
	out = append(out, `,"data":`...)
	out, err := appendRawOrNull(out, data, depthPublishData)
	if err != nil {
		return dst, fmt.Errorf("%w: publish input: data: %w", ErrUnencodable, err)
	}
	return append(out, '}'), nil
}

// PublishTail is what follows the key and seq in the mutate frame of the
// built-in "publish" mutation: its name and the input AppendPublishInput
// makes of a topic and data, encoded and checked. A client makes it before
// it takes a seq, so that data that is not JSON uses none, and then
// writes the frame with AppendPublishMutate. The zero PublishTail stands
// for a null input.
type PublishTail struct{ b []byte }

// NewPublishTail encodes the tail of a publish of data to topic. It fails
// if data is not one valid JSON value in UTF-8.
func NewPublishTail(topic string, data json.RawMessage) (PublishTail, error) {
	b := append(make([]byte, 0, len(publishTailHead)+len(topic)+len(data)+32), publishTailHead...) // {"topic":,"data":}} and the quotes
	b, err := AppendPublishInput(b, topic, data)
	if err != nil {
		return PublishTail{}, err
	}
	return PublishTail{b: append(b, '}')}, nil
}

// Len is the tail's length in bytes.
func (t PublishTail) Len() int { return len(t.b) }

// publishTailHead starts a publish mutate's tail.
const publishTailHead = `,"name":"publish","input":`

// AppendPublishMutate appends the mutate frame of the built-in "publish"
// mutation with key, seq and tail: the bytes AppendEncode writes for
// that Mutate, without checking the input again.
func AppendPublishMutate(dst []byte, key string, seq int64, tail PublishTail) []byte {
	dst = append(dst, `{"type":"mutate","v":1,"key":`...)
	dst = appendString(dst, key)
	dst = append(dst, `,"seq":`...)
	dst = strconv.AppendInt(dst, seq, 10)
	if tail.b == nil {
		return append(dst, publishTailHead+"null}"...)
	}
	return append(dst, tail.b...)
}

// appendRawOrNull is appendRaw, with a nil raw written as null (as
// encoding/json writes a nil RawMessage).
func appendRawOrNull(dst, raw []byte, depth int) ([]byte, error) {
	if raw == nil {
		return append(dst, "null"...), nil
	}
	return appendRaw(dst, raw, depth)
}

// The arrays and objects around a raw field in its frame, the frame's own
// object included. A raw value may nest maxDepth minus these, or the
// frame would be deeper than Decode accepts.
const (
	depthMutateInput = 1 // {"input":
	depthPublishData = 2 // {"input":{"data":
	depthPatchRow    = 3 // {"patches":[{"row":
	depthMemberMeta  = 3 // {"members":[{"meta":
	depthSnapshotRow = 2 // {"rows":[
	depthRebaseRow   = 1 // {"row":
	depthTargetInput = 2 // {"target":{"input":
)

// errRawUTF8 is the reason for a raw field holding invalid UTF-8.
var errRawUTF8 = errors.New("not valid UTF-8")

// appendRaw appends the JSON text raw, compacted, after checking that it
// is one valid JSON value in UTF-8 that nests at most maxDepth-depth
// deep (depth: the levels around it in the frame).
func appendRaw(dst, raw []byte, depth int) ([]byte, error) {
	if !utf8.Valid(raw) {
		return dst, errRawUTF8
	}
	v := validator{b: raw, depth: depth}
	if !v.run() {
		se := v.err()
		if se.deep {
			return dst, errors.New(se.String())
		}
		return dst, errors.New("not JSON: " + se.String())
	}
	if v.ws {
		return appendCompact(dst, raw), nil
	}
	return append(dst, raw...), nil
}

// strSafe[c] is true for the bytes a JSON string holds as they are:
// printable ASCII except '"' and '\\'. Bytes >= utf8.RuneSelf start a
// multi-byte rune and take the slow path.
var strSafe = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string, escaped exactly as
// encoding/json does with HTML escaping off.
func appendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if strSafe[c] {
			i++
			continue
		}
		if c < utf8.RuneSelf {
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			// Valid JSON, but JavaScript before ES2019 reads them as line
			// terminators; encoding/json escapes them too.
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// header is the start of every frame on the wire.
type header struct {
	Type Type `json:"type"`
	V    int  `json:"v"`
}

// appendReflect encodes f with encoding/json. Embedding the frame after a
// header puts "type" and "v" first and keeps the struct's field order.
func appendReflect(dst []byte, f Frame) ([]byte, error) {
	var v any
	switch f := f.(type) {
	case *Hello:
		if f != nil {
			h := *f
			h.Resume = nonNilCursors(h.Resume)
			v = struct {
				header
				*Hello
			}{header{TypeHello, ProtocolVersion}, &h}
		}
	case *Subscribe:
		if f != nil {
			if err := checkRawDepth(f.Target.Input, depthTargetInput); err != nil {
				return dst, fmt.Errorf("%w: subscribe: target.input: %w", ErrUnencodable, err)
			}
			s := *f
			if c := s.Target.Cursor; c != nil && c.IDs == nil {
				cc := *c
				cc.IDs = []string{}
				s.Target.Cursor = &cc
			}
			if s.Target.Kind == TargetQuery && s.Target.Input == nil {
				s.Target.Input = json.RawMessage("null")
			}
			v = struct {
				header
				*Subscribe
			}{header{TypeSubscribe, ProtocolVersion}, &s}
		}
	case *Snapshot:
		if f != nil {
			for i, r := range f.Rows {
				if err := checkRawDepth(r, depthSnapshotRow); err != nil {
					return dst, fmt.Errorf("%w: snapshot: rows[%d]: %w", ErrUnencodable, i, err)
				}
			}
			s := *f
			s.Rows = nonNil(s.Rows)
			s.Cursor.IDs = nonNil(s.Cursor.IDs)
			v = struct {
				header
				*Snapshot
			}{header{TypeSnapshot, ProtocolVersion}, &s}
		}
	case *Patch:
		if f != nil {
			p := *f
			p.Patches = nonNil(p.Patches)
			v = struct {
				header
				*Patch
			}{header{TypePatch, ProtocolVersion}, &p}
		}
	case *Mutate:
		if f != nil {
			v = struct {
				header
				*Mutate
			}{header{TypeMutate, ProtocolVersion}, f}
		}
	case *Ack:
		if f != nil {
			v = struct {
				header
				*Ack
			}{header{TypeAck, ProtocolVersion}, f}
		}
	case *Rebase:
		if f != nil {
			if err := checkRawDepth(f.Row, depthRebaseRow); err != nil {
				return dst, fmt.Errorf("%w: rebase: row: %w", ErrUnencodable, err)
			}
			v = struct {
				header
				*Rebase
			}{header{TypeRebase, ProtocolVersion}, f}
		}
	case *Presence:
		if f != nil {
			p := *f
			p.Members = nonNil(p.Members)
			v = struct {
				header
				*Presence
			}{header{TypePresence, ProtocolVersion}, &p}
		}
	case *Reconnect:
		if f != nil {
			v = struct {
				header
				*Reconnect
			}{header{TypeReconnect, ProtocolVersion}, f}
		}
	case *UpdateAvailable:
		if f != nil {
			v = struct {
				header
				*UpdateAvailable
			}{header{TypeUpdateAvailable, ProtocolVersion}, f}
		}
	}
	if v == nil {
		return dst, fmt.Errorf("%w: %T", ErrUnencodable, f)
	}
	buf := bytes.NewBuffer(dst)
	enc := json.NewEncoder(buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return dst, fmt.Errorf("%w: %s: %w", ErrUnencodable, f.FrameType(), err)
	}
	out := buf.Bytes()
	out = out[:len(out)-1] // Encoder.Encode ends with '\n'
	if !utf8.Valid(out[len(dst):]) {
		// encoding/json fixes strings but copies RawMessage bytes as they are.
		return dst, fmt.Errorf("%w: %s: raw JSON field: %w", ErrUnencodable, f.FrameType(), errRawUTF8)
	}
	return out, nil
}

// checkRawDepth reports an error if raw, depth levels deep in its frame,
// nests the frame deeper than maxDepth. It leaves other faults of raw to
// encoding/json, and looks only at a raw long enough to nest that deep.
func checkRawDepth(raw []byte, depth int) error {
	if len(raw) < 2*(maxDepth-depth+1) { // each level takes two brackets
		return nil
	}
	v := validator{b: raw, depth: depth}
	if v.run() || !v.deep {
		return nil
	}
	se := v.err()
	return errors.New(se.String())
}

// nonNil returns s, or an empty slice if s is nil, so it encodes as [].
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// nonNilCursors is nonNil for a cursor list, also fixing each cursor's IDs.
// It copies only when something is nil.
func nonNilCursors(cs []Cursor) []Cursor {
	if cs == nil {
		return []Cursor{}
	}
	for i := range cs {
		if cs[i].IDs == nil {
			out := append([]Cursor(nil), cs...)
			for j := range out {
				out[j].IDs = nonNil(out[j].IDs)
			}
			return out
		}
	}
	return cs
}
