package frames

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// tricky is a string that needs every kind of escaping.
const tricky = "a\"b\\c\u2028d\u2029e\n\t\b\f\x00\x1f<>&é😀"

// roundTripFrames are frames as the gateway would build them, one or more
// per kind, with strings that need escaping and nil slices.
func roundTripFrames() map[string]Frame {
	cur := Cursor{QID: "topic:" + tricky, LSN: "0000000000000001_0000000000000002", Digest: "d", IDs: []string{"x", tricky}, Count: 2, At: -5}
	return map[string]Frame{
		"hello":       &Hello{BuildID: tricky, SessionID: ptr("s" + tricky), ActorID: ptr(""), Resume: []Cursor{cur}, Token: "t", ClientID: "c", Epoch: 9},
		"hello/nil":   &Hello{},
		"subscribe":   &Subscribe{Op: OpAdd, SID: tricky, Target: Target{Kind: TargetTopic, Topic: "room", Cursor: &cur}},
		"subscribe/q": &Subscribe{Op: OpDrop, SID: "q", Target: Target{Kind: TargetQuery, QID: "todos", Input: json.RawMessage(`{"a":[1,2.5e3,"<&>"]}`)}},
		"snapshot":    &Snapshot{SID: "s", Rows: []json.RawMessage{json.RawMessage(`{"id":"` + "\u2028" + `","v":null}`)}, Cursor: cur},
		"patch": &Patch{SID: tricky, LSN: "l", Patches: []PatchOp{
			{Op: PatchInsert, ID: "1", Row: json.RawMessage(`{"id":"1","data":"<b>&amp;</b>"}`), LSN: "1"},
			{Op: PatchDelete, ID: tricky, LSN: "2", Index: ptr[int64](1 << 40)},
		}},
		"patch/nil":        &Patch{SID: "s"},
		"mutate":           &Mutate{Key: tricky, Seq: 1<<63 - 1, Name: "publish", Input: json.RawMessage(`{"topic":"a","data":{"s":"\u00e9\ud83d\ude00"}}`)},
		"ack":              &Ack{Ref: tricky, LSN: ptr("0000000000000000_0000000000000001")},
		"ack/error":        &Ack{Ref: "k", Error: &ErrorBody{Code: CodeSeqGap, Cause: "mutate.seq: want 3, got " + tricky, Fix: "f", Docs: "d"}},
		"rebase":           &Rebase{Key: "k", Entity: tricky, Strategy: StrategyLastWriteWins, Row: json.RawMessage(`{"id":"x"}`)},
		"rebase/deleted":   &Rebase{Key: "k", Entity: "e", Strategy: StrategyCustom},
		"presence":         &Presence{Topic: "room", Op: PresenceJoin, Members: []Member{{ID: tricky, Meta: json.RawMessage(`[true,false]`), UpdatedAt: 1}}},
		"presence/count":   &Presence{Topic: "room", Op: PresenceUpdate, Members: []Member{}, Count: 1 << 40},
		"reconnect":        &Reconnect{AfterMs: 250, Reason: ReasonRebalance},
		"update-available": &UpdateAvailable{BuildID: ""},
	}
}

// normalized returns what f should decode back to: nil slices empty, nil
// raw values null, as the decoder produces them.
func normalized(f Frame) Frame {
	fixCursor := func(c Cursor) Cursor { c.IDs = nonNil(c.IDs); return c }
	switch f := f.(type) {
	case *Hello:
		h := *f
		h.Resume = nonNil(h.Resume)
		for i := range h.Resume {
			h.Resume[i] = fixCursor(h.Resume[i])
		}
		return &h
	case *Subscribe:
		s := *f
		if s.Target.Cursor != nil {
			s.Target.Cursor = ptr(fixCursor(*s.Target.Cursor))
		}
		return &s
	case *Snapshot:
		s := *f
		s.Rows = nonNil(s.Rows)
		s.Cursor = fixCursor(s.Cursor)
		return &s
	case *Patch:
		p := *f
		p.Patches = nonNil(p.Patches)
		return &p
	case *Presence:
		p := *f
		p.Members = nonNil(p.Members)
		return &p
	}
	return f
}

func TestEncode_RoundTrip(t *testing.T) {
	t.Parallel()
	for name, f := range roundTripFrames() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := mustEncode(t, f)
			checkWire(t, b, f.FrameType())
			if !json.Valid(b) {
				t.Fatalf("not JSON: %s", b)
			}
			if strings.Contains(string(b), "\u2028") && f.FrameType() != TypeSnapshot {
				t.Fatalf("U+2028 not escaped: %s", b)
			}
			got := mustDecode(t, string(b))
			assertEqual(t, "decoded", got, normalized(f))
			assertEqual(t, "re-encoded", string(mustEncode(t, got)), string(b))
		})
	}
}

func TestAppendEncode_Appends(t *testing.T) {
	t.Parallel()
	for name, f := range roundTripFrames() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dst := []byte("prefix\n")
			out, err := AppendEncode(dst, f)
			if err != nil {
				t.Fatal(err)
			}
			assertEqual(t, "appended", string(out), "prefix\n"+string(mustEncode(t, f)))
		})
	}
}

// TestEncode_HandMatchesReflect checks the hand-written ack, patch,
// presence and mutate encoders against encoding/json.
func TestEncode_HandMatchesReflect(t *testing.T) {
	t.Parallel()
	fs := roundTripFrames()
	// Frames that encode but do not decode back unchanged.
	fs["mutate/nil"] = &Mutate{Key: "k", Seq: -1, Name: tricky}
	fs["mutate/spaced"] = &Mutate{Key: "k", Seq: 7, Name: "n", Input: json.RawMessage(" [ 1 , {\"a\" : \"<\u2028>\"} ]\n")}
	for name, f := range fs {
		switch f.FrameType() {
		case TypeAck, TypePatch, TypePresence, TypeMutate:
		default:
			continue
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			want, err := appendReflect(nil, f)
			if err != nil {
				t.Fatal(err)
			}
			assertEqual(t, "hand", string(mustEncode(t, f)), string(want))
		})
	}
}

func TestAppendPatchPrefix_Body(t *testing.T) {
	t.Parallel()
	row := json.RawMessage(`{"id":"0000000000000000_0000000000000007","data":{"t":"x"},"actorId":null,"at":1}`)
	tests := []struct {
		name    string
		sid     string
		patches []PatchOp
		lsn     string
	}{
		{"plain", "s1", []PatchOp{{Op: PatchInsert, ID: "7", Row: row, LSN: "7"}}, "7"},
		{"sid needs escaping", "a\"b\u2028", []PatchOp{{Op: PatchInsert, ID: "7", Row: row, LSN: "7"}}, "7"},
		{"tricky everywhere", tricky, []PatchOp{{Op: tricky, ID: tricky, LSN: tricky, Index: ptr[int64](-1)}}, tricky},
		{"row with whitespace", "s", []PatchOp{{Op: PatchUpdate, ID: "1", Row: json.RawMessage(" {\"id\" : \"1\",\n\"a\": [1, 2]} "), LSN: "1"}}, "1"},
		{"no patches", "s", nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			prefix := AppendPatchPrefix(nil, tt.sid)
			frame, err := AppendPatchBody(prefix, tt.patches, tt.lsn)
			if err != nil {
				t.Fatal(err)
			}
			want := mustEncode(t, &Patch{SID: tt.sid, Patches: tt.patches, LSN: tt.lsn})
			assertEqual(t, "prefix+body", string(frame), string(want))
			reflectWant, err := appendReflect(nil, &Patch{SID: tt.sid, Patches: tt.patches, LSN: tt.lsn})
			if err != nil {
				t.Fatal(err)
			}
			assertEqual(t, "encoding/json", string(frame), string(reflectWant))
			checkWire(t, frame, TypePatch)
		})
	}
}

func TestEncode_Errors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		f    Frame
	}{
		{"nil", nil},
		{"nil ack", (*Ack)(nil)},
		{"nil patch", (*Patch)(nil)},
		{"nil hello", (*Hello)(nil)},
		{"foreign frame", foreignFrame{}},
		{"patch row not JSON", &Patch{SID: "s", Patches: []PatchOp{{Op: PatchInsert, ID: "1", Row: json.RawMessage(`{"id":`)}}}},
		{"patch row two values", &Patch{SID: "s", Patches: []PatchOp{{Op: PatchInsert, ID: "1", Row: json.RawMessage(`{} {}`)}}}},
		{"patch row empty", &Patch{SID: "s", Patches: []PatchOp{{Op: PatchInsert, ID: "1", Row: json.RawMessage{}}}}},
		{"patch row bad UTF-8", &Patch{SID: "s", Patches: []PatchOp{{Op: PatchInsert, ID: "1", Row: json.RawMessage("{\"id\":\"\xff\"}")}}}},
		{"mutate input not JSON", &Mutate{Key: "k", Name: "n", Input: json.RawMessage(`nope`)}},
		{"mutate input bad UTF-8", &Mutate{Key: "k", Name: "n", Input: json.RawMessage("\"\xc3\"")}},
		{"mutate input empty", &Mutate{Key: "k", Name: "n", Input: json.RawMessage{}}},
		{"mutate input two values", &Mutate{Key: "k", Name: "n", Input: json.RawMessage(`1,"topic":"x"`)}},
		{"nil mutate", (*Mutate)(nil)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dst := []byte("keep")
			out, err := AppendEncode(dst, tt.f)
			if !errors.Is(err, ErrUnencodable) {
				t.Fatalf("err = %v, want ErrUnencodable", err)
			}
			assertEqual(t, "dst", string(out), "keep")
		})
	}
}

type foreignFrame struct{}

func (foreignFrame) FrameType() Type { return TypeAck }

func TestError_Body(t *testing.T) {
	t.Parallel()
	e := NewError(CodeSeqGap, "m-1", "mutate.seq: want 4, got 6", "")
	if e.Fix != DefaultFix(CodeSeqGap) || e.Fix == "" {
		t.Fatalf("Fix = %q, want the default", e.Fix)
	}
	e.Docs = "https://example.com/errors#X_SEQ_GAP"
	b := mustEncode(t, &Ack{Ref: e.Ref, Error: e.Body()})
	a, ok := mustDecode(t, string(b)).(*Ack)
	if !ok {
		t.Fatalf("decoded %T", a)
	}
	assertEqual(t, "body", a.Error, e.Body())
	assertEqual(t, "ref", a.Ref, "m-1")
	if got := NewError(CodeInternal, "", "c", "do this").Fix; got != "do this" {
		t.Fatalf("explicit fix replaced: %q", got)
	}
}

// TestDefaultFix covers every code in errors.go.
func TestDefaultFix(t *testing.T) {
	t.Parallel()
	codes := []Code{CodeBadFrame, CodeProtocolVersion, CodeUnknownType, CodeMissingField, CodeBadField,
		CodeHelloRequired, CodeDuplicateHello, CodeUnexpectedFrame, CodeUnsupported, CodeBadTopic,
		CodeSIDInUse, CodeNotSubscribed, CodeCursorExpired, CodeUnknownMutation, CodeBadInput,
		CodeSeqGap, CodeSeqForgotten, CodeSeqReused, CodeEpochFenced, CodeTooManySubs, CodeInternal,
		CodeTokenRequired, CodeTokenExpired, CodeTokenNotYetValid, CodeBadToken, CodeTokenRejected,
		CodeForbidden, CodeRateLimited, CodeTooManySessions,
		CodePresenceNotSubscribed, CodePresenceNotJoined, CodePresenceConflict, CodePresenceRateLimited, CodeMetaTooLarge}
	if len(codes) != len(defaultFixes) {
		t.Fatalf("%d codes listed here, %d default fixes", len(codes), len(defaultFixes))
	}
	for _, c := range codes {
		if DefaultFix(c) == "" {
			t.Errorf("no default fix for %s", c)
		}
	}
}

func Test_appendString(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "plain", tricky, "\xff\xfe", "a\xc3", "\u2029x\u2028", "\x7f", strings.Repeat("é", 40)} {
		assertEqual(t, s, string(appendString(nil, s)), stdString(t, s))
	}
}

// stdString is encoding/json's encoding of s without HTML escaping.
func stdString(t testing.TB, s string) string {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		t.Fatal(err)
	}
	return strings.TrimSuffix(buf.String(), "\n")
}

// TestAppendPatch_Allocs is the broadcast path's alloc budget: nothing
// beyond growing dst.
func TestAppendPatch_Allocs(t *testing.T) {
	row := json.RawMessage(`{"id":"0000000000000000_0000000000000007","data":{"t":"x"},"actorId":null,"at":1}`)
	ops := []PatchOp{{Op: PatchInsert, ID: "0000000000000000_0000000000000007", Row: row, LSN: "0000000000000000_0000000000000007"}}
	buf := make([]byte, 0, 1024)
	ack := &Ack{Ref: "k", LSN: &ops[0].LSN}
	allocs := testing.AllocsPerRun(100, func() {
		b := AppendPatchPrefix(buf[:0], "sub-1")
		if _, err := AppendPatchBody(b, ops, ops[0].LSN); err != nil {
			t.Fatal(err)
		}
		if _, err := AppendEncode(buf[:0], ack); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocs per run, want 0", allocs)
	}
}

// TestAppendPresence_MatchesReflect: the hand-written presence encoder
// writes what encoding/json writes, also for values Decode never returns
// (nil members, nil or spaced meta), and refuses what it refuses.
func TestAppendPresence_MatchesReflect(t *testing.T) {
	t.Parallel()
	actor := "u\u2028\"<1>"
	tests := map[string]*Presence{
		"nil members":  {Topic: "t", Op: PresenceSync},
		"nil meta":     {Topic: "t", Op: PresenceJoin, Members: []Member{{ID: "a"}}},
		"spaced meta":  {Topic: "t", Op: PresenceUpdate, Members: []Member{{ID: "a", ActorID: &actor, Meta: json.RawMessage(" { \"k\" : [1, 2] } "), UpdatedAt: -5}}},
		"tricky":       {Topic: tricky, Op: tricky, Members: []Member{{ID: tricky, ActorID: &actor, Meta: json.RawMessage(`"x"`)}, {ID: "b", Meta: json.RawMessage(`{}`)}}, Count: 3},
		"many members": {Topic: "t", Op: PresenceSync, Members: make([]Member, 100)},
	}
	for name, p := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, err := AppendEncode(nil, p)
			if err != nil {
				t.Fatal(err)
			}
			want, err := appendReflect(nil, p)
			if err != nil {
				t.Fatal(err)
			}
			assertEqual(t, "hand vs encoding/json", string(got), string(want))
		})
	}
	bad := &Presence{Topic: "t", Op: PresenceJoin, Members: []Member{{ID: "a", Meta: json.RawMessage(`{"a":`)}}}
	if out, err := AppendEncode([]byte("keep"), bad); err == nil || string(out) != "keep" {
		t.Fatalf("invalid meta: %q, %v; want an error and dst unchanged", out, err)
	}
}

// TestAppendPublishInput checks the publish input against encoding/json,
// and that data which is not exactly one JSON value (which could add keys
// to the object) is refused with dst unchanged.
func TestAppendPublishInput(t *testing.T) {
	t.Parallel()
	type input struct {
		Topic string          `json:"topic"`
		Data  json.RawMessage `json:"data"`
	}
	for _, tt := range []struct {
		topic string
		data  json.RawMessage
	}{
		{"room", json.RawMessage(`{"text":"hi"}`)},
		{tricky, json.RawMessage(" [ 1 , \"<&>\u2028\" ]\t")},
		{"", nil},
		{"t", json.RawMessage(`"\ud83d\ude00"`)},
	} {
		var want bytes.Buffer
		enc := json.NewEncoder(&want)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(input{tt.topic, tt.data}); err != nil {
			t.Fatal(err)
		}
		got, err := AppendPublishInput([]byte("x"), tt.topic, tt.data)
		if err != nil {
			t.Fatalf("%q: %v", tt.data, err)
		}
		assertEqual(t, "input", string(got), "x"+strings.TrimSuffix(want.String(), "\n"))
	}
	for _, bad := range []string{``, `1,"topic":"x"`, `{"a":1}}`, `{"a":`, "\"\xff\""} {
		got, err := AppendPublishInput([]byte("keep"), "t", json.RawMessage(bad))
		if !errors.Is(err, ErrUnencodable) {
			t.Fatalf("data %q: err = %v, want ErrUnencodable", bad, err)
		}
		assertEqual(t, "dst", string(got), "keep")
	}
}

// TestEncode_DepthLimit: Encode refuses a frame that a raw field would
// nest deeper than Decode accepts (docs/protocol.md §2), and writes one
// that is just deep enough, which Decode takes back. The limit counts the
// frame's own object and the arrays and objects around the field.
func TestEncode_DepthLimit(t *testing.T) {
	t.Parallel()
	nest := func(n int) json.RawMessage { // n levels, innermost a row
		return json.RawMessage(strings.Repeat(`[`, n-1) + `{"id":"1"}` + strings.Repeat(`]`, n-1))
	}
	row := func(n int) json.RawMessage { // a row whose data nests n-1 levels
		return json.RawMessage(`{"id":"1","d":` + string(nest(n-1)) + `}`)
	}
	tests := []struct {
		name  string
		frame func(n int) Frame // n: the field's own nesting
		base  int               // levels around the field
	}{
		{"mutate input", func(n int) Frame { return &Mutate{Key: "k", Name: "n", Input: nest(n)} }, 1},
		{"patch row", func(n int) Frame {
			return &Patch{SID: "s", Patches: []PatchOp{{Op: PatchInsert, ID: "1", Row: row(n), LSN: ZeroOffset}}, LSN: ZeroOffset}
		}, 3},
		{"presence meta", func(n int) Frame {
			return &Presence{Topic: "t", Op: PresenceSync, Members: []Member{{ID: "m", Meta: nest(n)}}}
		}, 3},
		{"snapshot row", func(n int) Frame {
			return &Snapshot{SID: "s", Rows: []json.RawMessage{row(n)}, Cursor: Cursor{QID: "q"}}
		}, 2},
		{"rebase row", func(n int) Frame {
			return &Rebase{Key: "k", Strategy: StrategyCustom, Row: row(n)}
		}, 1},
		{"subscribe query input", func(n int) Frame {
			return &Subscribe{Op: OpAdd, SID: "s", Target: Target{Kind: TargetQuery, QID: "q", Input: nest(n)}}
		}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			n := maxDepth - tt.base
			b, err := Encode(tt.frame(n))
			if err != nil {
				t.Fatalf("%d levels around %d: %v", tt.base, n, err)
			}
			if _, err := Decode(b); err != nil {
				t.Fatalf("Decode of a frame %d deep: %v", maxDepth, err)
			}
			if b, err := Encode(tt.frame(n + 1)); !errors.Is(err, ErrUnencodable) {
				_, derr := Decode(b)
				t.Fatalf("a frame %d deep: Encode err = %v; Decode: %v", maxDepth+1, err, derr)
			}
		})
	}
	if _, err := AppendPublishInput(nil, "t", nest(maxDepth-2+1)); !errors.Is(err, ErrUnencodable) {
		t.Errorf("AppendPublishInput of data %d deep: %v", maxDepth-1, err)
	}
}
