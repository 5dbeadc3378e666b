package frames

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/big"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// malformedSeeds are broken frames for the fuzzers to start from.
var malformedSeeds = []string{
	``, `{}`, `[]`, `null`, `{"type":"hello"}`, `{"type":"nope","v":1}`,
	`{"type":"mutate","v":1,"key":"k","seq":-1,"name":"n","input":null}`,
	`{"type":"subscribe","v":1,"op":"add","sid":"s","target":{"kind":"topic","topic":"t","cursor":{"qid":"q","lsn":"1_2","digest":"","ids":[1],"count":0,"at":0}}}`,
	`{"type":"snapshot","v":1,"sid":"s","rows":[{"id":1}],"cursor":{}}`,
	"{\"type\":\"ack\",\"v\":1,\"ref\":\"\xff\"}",
	`{"type":"reconnect","v":1e0,"afterMs":1.5,"reason":"drain"}`,
	`{"\u0074ype":"update-available","v":1,"buildId":"\ud800"}`,
	`{"type":"mutate","v":1,"key":"k","seq":0,"name":"n","input":[[[[{"a":  1 }]]]]}`,
}

func FuzzDecode(f *testing.F) {
	for _, l := range validLines {
		f.Add([]byte(l.line))
	}
	for _, s := range malformedSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		fr, err := Decode(line)
		if err != nil {
			fe := asError(t, err)
			if fe.Code == "" || fe.Cause == "" || fe.Fix == "" {
				t.Fatalf("incomplete error: %#v", fe)
			}
			if fe.Code != CodeBadFrame && !json.Valid(line) {
				t.Fatalf("invalid JSON reported as %s", fe.Code)
			}
			if !causeNamesField(fe) {
				t.Fatalf("%s cause %q does not start with the field's path", fe.Code, fe.Cause)
			}
			ack := mustEncode(t, &Ack{Ref: fe.Ref, Error: fe.Body()})
			checkWire(t, ack, TypeAck)
			return
		}
		if !json.Valid(line) || !utf8.Valid(line) {
			t.Fatalf("Decode accepted invalid input %q", line)
		}
		e1 := mustEncode(t, fr)
		checkWire(t, e1, fr.FrameType())
		if !json.Valid(e1) {
			t.Fatalf("Encode wrote invalid JSON: %s", e1)
		}
		fr2, err := Decode(e1)
		if err != nil {
			t.Fatalf("Decode(Encode(Decode(x))) failed: %v\nx:  %q\ne1: %s", err, line, e1)
		}
		if !reflect.DeepEqual(fr, fr2) {
			t.Fatalf("decoded frames differ:\n %#v\n %#v", fr, fr2)
		}
		if e2 := mustEncode(t, fr2); !bytes.Equal(e1, e2) {
			t.Fatalf("encoding not stable:\n%s\n%s", e1, e2)
		}
	})
}

// causeNamesField reports whether e's cause starts with what it is about,
// as docs/protocol.md §2 promises: "frame:", "v:", "type:", or for a
// field error the field's path from its frame type ("mutate.seq: ...").
func causeNamesField(e *Error) bool {
	switch e.Code {
	case CodeBadFrame:
		return strings.HasPrefix(e.Cause, "frame: ")
	case CodeProtocolVersion:
		return strings.HasPrefix(e.Cause, "v: ")
	case CodeUnknownType:
		return strings.HasPrefix(e.Cause, "type: ")
	}
	path, _, ok := strings.Cut(e.Cause, ": ")
	if !ok || strings.ContainsAny(path, " \"") {
		return false
	}
	for _, t := range allFrameTypes {
		if strings.HasPrefix(path, string(t)+".") {
			return true
		}
	}
	return false
}

// FuzzSplit checks that a message splits into the same lines as its two
// halves cut at a line boundary, and that no line holds '\n' or is blank.
func FuzzSplit(f *testing.F) {
	f.Add([]byte(validLines[0].line+"\n"+validLines[1].line), 10)
	f.Add([]byte("a\r\n\r\n b\n\n"), 3)
	f.Add([]byte(""), 0)
	f.Fuzz(func(t *testing.T, msg []byte, cut int) {
		lines := func(b []byte) []string {
			var out []string
			Split(b, func(line []byte) bool {
				if bytes.IndexByte(line, '\n') >= 0 || isBlank(line) {
					t.Fatalf("bad line %q", line)
				}
				out = append(out, string(line))
				return true
			})
			return out
		}
		whole := lines(msg)
		if cut < 0 {
			cut = -cut
		}
		if len(msg) > 0 {
			cut %= len(msg) + 1
		} else {
			cut = 0
		}
		if i := bytes.IndexByte(msg[cut:], '\n'); i >= 0 {
			cut += i + 1 // move to the start of the next line
		} else {
			cut = len(msg)
		}
		halves := append(lines(msg[:cut]), lines(msg[cut:])...)
		if len(whole) != len(halves) || len(whole) > 0 && !reflect.DeepEqual(whole, halves) {
			t.Fatalf("whole %q, halves %q", whole, halves)
		}
		var n int
		Split(msg, func([]byte) bool { n++; return false })
		if n > 1 {
			t.Fatalf("Split went on after false")
		}
	})
}

// FuzzJSON compares the package's JSON reader with encoding/json.
func FuzzJSON(f *testing.F) {
	for _, l := range validLines {
		f.Add([]byte(l.line))
	}
	for _, s := range malformedSeeds {
		f.Add([]byte(s))
	}
	for _, s := range []string{`"a\u00e9\ud83d\ude00\ud800\udc00\udc00x"`, `1.5e3`, `-0.0`, `[1 , {"a" : "b c"} ]`, `"\/\b\f"`, "\"\x01\"", `01`, `1.`, `-`, `1e`, `tru`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ok, _ := validate(b)
		if want := json.Valid(b); ok != want {
			t.Fatalf("validate(%q) = %v, json.Valid = %v", b, ok, want)
		}
		if !ok {
			return
		}
		var std bytes.Buffer
		if err := json.Compact(&std, b); err != nil {
			t.Fatal(err)
		}
		if got := appendCompact(nil, b); !bytes.Equal(got, std.Bytes()) {
			t.Fatalf("appendCompact = %q, json.Compact = %q", got, std.Bytes())
		}
		// Depth is how far the validator's depth may start below maxDepth.
		if d := Depth(b); d > 0 {
			if fit := (validator{b: b, depth: maxDepth - d}); !fit.run() {
				t.Fatalf("Depth(%q) = %d, but it does not fit in %d levels", b, d, d)
			}
			if over := (validator{b: b, depth: maxDepth - d + 1}); over.run() || !over.deep {
				t.Fatalf("Depth(%q) = %d, but it fits in %d levels", b, d, d-1)
			}
		}
		v := bytes.TrimSpace(b)
		if got := needsCompact(v); !got && !bytes.Equal(v, std.Bytes()) {
			t.Fatalf("needsCompact(%q) = false, but compacting changes it", v)
		}
		switch c := v[0]; {
		case c == '"' && utf8.Valid(v): // Decode checks UTF-8 first
			var s string
			if err := json.Unmarshal(v, &s); err != nil {
				t.Fatal(err)
			}
			if got := unquote(v); got != s {
				t.Fatalf("unquote(%s) = %q, encoding/json %q", v, got, s)
			}
		case c == '-' || isDigit(c):
			checkParseInt(t, string(v))
		}
	})
}

// checkParseInt compares parseInt with exact rational arithmetic.
func checkParseInt(t *testing.T, tok string) {
	if i := strings.IndexAny(tok, "eE"); i >= 0 && len(strings.TrimLeft(tok[i+1:], "+-0")) > 3 {
		return // big.Rat would build a huge power of ten
	}
	r, ok := new(big.Rat).SetString(tok)
	if !ok {
		t.Fatalf("big.Rat rejects %s", tok)
	}
	want := r.IsInt() && r.Num().IsInt64()
	got, gotOK := parseInt([]byte(tok))
	if gotOK != want || want && got != r.Num().Int64() {
		t.Fatalf("parseInt(%s) = %d, %v; exact value %s", tok, got, gotOK, r.RatString())
	}
}

func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", tricky, "\xff", "\u2028"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := string(appendString(nil, s)), stdString(t, s); got != want {
			t.Fatalf("appendString(%q) = %s, encoding/json %s", s, got, want)
		}
	})
}

// FuzzPublishInput compares AppendPublishInput with encoding/json (HTML
// escaping off, as Encode), and checks that whatever it accepts is an
// object with exactly the keys topic and data, and that NewPublishTail and
// AppendPublishMutate write the mutate AppendEncode makes of it.
func FuzzPublishInput(f *testing.F) {
	for _, s := range []string{`{"a":1}`, ` [1 , 2] `, `1,"topic":"x"`, `"\u2028<&>"`, "\"\xff\"", ``, `{} {}`} {
		f.Add(tricky, []byte(s))
	}
	f.Fuzz(func(t *testing.T, topic string, data []byte) {
		got, err := AppendPublishInput(nil, topic, data)
		if err != nil {
			if json.Valid(data) && utf8.Valid(data) {
				t.Fatalf("AppendPublishInput(%q) refused valid data: %v", data, err)
			}
			if _, err := NewPublishTail(topic, data); err == nil {
				t.Fatalf("NewPublishTail(%q) took what AppendPublishInput refused", data)
			}
			return
		}
		var want bytes.Buffer
		enc := json.NewEncoder(&want)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(struct {
			Topic string          `json:"topic"`
			Data  json.RawMessage `json:"data"`
		}{topic, data}); err != nil {
			t.Fatalf("accepted %q, which encoding/json refuses: %v", data, err)
		}
		if w := bytes.TrimSuffix(want.Bytes(), []byte("\n")); !bytes.Equal(got, w) {
			t.Fatalf("AppendPublishInput = %s, encoding/json %s", got, w)
		}
		n := 0
		if !Fields(got, func(key []byte, _ json.RawMessage) bool {
			n++
			return n == 1 && string(key) == "topic" || n == 2 && string(key) == "data"
		}) || n != 2 {
			t.Fatalf("AppendPublishInput = %s: not an object of topic and data", got)
		}
		// The mutate made from a tail is the mutate of that input, byte for
		// byte.
		tail, err := NewPublishTail(topic, data)
		if err != nil {
			t.Fatalf("NewPublishTail refused what AppendPublishInput took: %v", err)
		}
		one := AppendPublishMutate([]byte("x"), "k:1", 7, tail)
		two, err := AppendEncode([]byte("x"), &Mutate{Key: "k:1", Seq: 7, Name: "publish", Input: got})
		if err != nil || !bytes.Equal(one, two) {
			t.Fatalf("AppendPublishMutate = %s, AppendEncode of the input %s (%v)", one, two, err)
		}
	})
}

// FuzzEncode builds frames of every kind from arbitrary strings and raw
// JSON and checks what Encode promises for any input: an error wrapping
// ErrUnencodable, or one line of valid UTF-8 JSON (no raw '\n', the
// batch separator) that Decode reads as JSON of the right type, whatever
// it then says of the fields.
func FuzzEncode(f *testing.F) {
	f.Add("s1", "insert", []byte(`{"id":"1"}`), []byte(`{"a" : "\u2028"}`))
	f.Add("s\n1", "x\u2028", []byte("{\"id\":\"1\",\n\"b\":[1,\r\n2]}"), []byte("\"\xff\""))
	f.Add("\xff", "\r\n", []byte("\t[\n]\n"), []byte(`{"id":"\ud800"}`))
	f.Fuzz(func(t *testing.T, s, str string, row, meta []byte) {
		for _, fr := range []Frame{
			&Patch{SID: s, Patches: []PatchOp{{Op: str, ID: s, Row: row, LSN: str}}, LSN: str},
			&Snapshot{SID: s, Rows: []json.RawMessage{row}, Cursor: Cursor{QID: str, IDs: []string{s}}},
			&Presence{Topic: s, Op: str, Members: []Member{{ID: str, ActorID: &s, Meta: meta}}},
			&Rebase{Key: s, Entity: str, Row: row},
			&Mutate{Key: s, Name: str, Input: meta},
			&Ack{Ref: s, LSN: &str, Error: &ErrorBody{Code: Code(str), Cause: s, Fix: str, Docs: str}},
			&Subscribe{Op: str, SID: s, Target: Target{Kind: TargetQuery, QID: str, Input: meta}},
			&Hello{BuildID: s, SessionID: &str, Token: str, ClientID: s},
			&Reconnect{Reason: str},
			&UpdateAvailable{BuildID: str},
		} {
			b, err := Encode(fr)
			if err != nil {
				if !errors.Is(err, ErrUnencodable) {
					t.Fatalf("Encode(%T): %v", fr, err)
				}
				continue
			}
			checkWire(t, b, fr.FrameType())
			if !json.Valid(b) {
				t.Fatalf("Encode wrote invalid JSON: %q", b)
			}
			if _, err := Decode(b); err != nil {
				if fe := asError(t, err); fe.Code == CodeBadFrame || fe.Code == CodeProtocolVersion || fe.Code == CodeUnknownType {
					t.Fatalf("Encode wrote %q, which Decode refuses: %v", b, err)
				}
			}
		}
	})
}
