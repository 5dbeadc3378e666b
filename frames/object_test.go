package frames

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestFields(t *testing.T) {
	t.Parallel()
	var got []string
	ok := Fields(json.RawMessage(` {"topic":"a\"b","data":{"x":[1,"}"]},"t\u0065":null}`), func(k []byte, v json.RawMessage) bool {
		got = append(got, string(k)+"="+string(v))
		return true
	})
	want := []string{`topic="a\"b"`, `data={"x":[1,"}"]}`, `te=null`}
	if !ok || len(got) != len(want) {
		t.Fatalf("got %q ok %v", got, ok)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("field %d = %q, want %q", i, got[i], want[i])
		}
	}
	for _, notObj := range []string{`[1]`, `"s"`, `1`, ``, `null`} {
		if Fields(json.RawMessage(notObj), func([]byte, json.RawMessage) bool { return true }) {
			t.Errorf("Fields(%q) = true", notObj)
		}
	}
	if s, ok := Unquote(json.RawMessage(`"a\"b\u00e9"`)); !ok || s != `a"bé` {
		t.Fatalf("Unquote = %q %v", s, ok)
	}
	if _, ok := Unquote(json.RawMessage(`12`)); ok {
		t.Fatal("Unquote(12) ok")
	}
}

// TestDecode_DoesNotAliasInput: the gateway decodes out of a pooled read
// buffer that it reuses, so a decoded frame must not point into its input.
func TestDecode_DoesNotAliasInput(t *testing.T) {
	t.Parallel()
	for _, line := range []string{
		`{"type":"mutate","v":1,"key":"k1","seq":3,"name":"publish","input":{"topic":"t","data":{"a":[1,2,"x"]}}}`,
		`{"type":"subscribe","v":1,"op":"add","sid":"s","target":{"kind":"query","qid":"q","input":{"f":"v"},"cursor":{"qid":"q","lsn":"","digest":"d","ids":["a","b"],"count":2,"at":5}}}`,
		`{"type":"presence","v":1,"topic":"room","op":"join","members":[{"id":"m","actorId":"a","meta":{"n":"x"},"updatedAt":1}]}`,
		`{"type":"hello","v":1,"buildId":"b","sessionId":null,"actorId":null,"resume":[],"token":"tok","clientId":"c"}`,
	} {
		buf := []byte(line)
		f, err := Decode(buf)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := Encode(f)
		for i := range buf {
			buf[i] = 'X'
		}
		if got, _ := Encode(f); string(got) != string(want) {
			t.Fatalf("decoded frame changed with its input:\n%s\n%s", want, got)
		}
	}
}

func TestAppendInsertBody_MatchesAppendPatchBody(t *testing.T) {
	t.Parallel()
	lsn := FormatOffset(17, 42)
	row := []byte(`{"id":"` + lsn + `","data":{"a":[1,"x\u2028"]},"actorId":null,"at":5}`)
	want, err := AppendPatchBody([]byte("pre"), []PatchOp{{Op: PatchInsert, ID: lsn, Row: row, LSN: lsn}}, lsn)
	if err != nil {
		t.Fatal(err)
	}
	got := AppendInsertBody([]byte("pre"), lsn, func(dst []byte) []byte { return append(dst, row...) })
	if string(got) != string(want) {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

// TestUnquote_Malformed: Unquote is exported, so a token that is not one
// valid JSON string is refused rather than read past its end.
func TestUnquote_Malformed(t *testing.T) {
	t.Parallel()
	for _, tok := range []string{`"\"`, `"abc`, `"a"b"`, `"a" `, `"\x"`, `"\u12"`, `"\u12`, "\"a\nb\""} {
		var s string
		var ok bool
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("Unquote(%q) panicked: %v", tok, r)
				}
			}()
			s, ok = Unquote(json.RawMessage(tok))
		}()
		if ok {
			t.Errorf("Unquote(%q) = %q, true; want false", tok, s)
		}
	}
}

func TestDepth(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int{
		`1`: 0, `"[{"`: 0, `null`: 0, `[]`: 1, `{}`: 1, `[1,2]`: 1, `[[1]]`: 2, `{"a":{}}`: 2,
		`{"a":"]}]","b":[[{"c":[]}]]}`: 5, `[[],[],[[]]]`: 3, `"\"[["`: 0, ` [ { } ] `: 2,
	} {
		if got := Depth(json.RawMessage(in)); got != want {
			t.Errorf("Depth(%s) = %d, want %d", in, got, want)
		}
	}
	// A topic row's data that fits its patch: the 4 levels around it
	// plus its own make MaxDepth.
	data := strings.Repeat("[", MaxDepth-4) + strings.Repeat("]", MaxDepth-4)
	if Depth(json.RawMessage(data)) != MaxDepth-4 {
		t.Fatal("deep data")
	}
	b, err := Encode(&Patch{SID: "s", Patches: []PatchOp{{Op: PatchInsert, ID: ZeroOffset,
		Row: json.RawMessage(`{"id":"x","data":` + data + `}`), LSN: ZeroOffset}}, LSN: ZeroOffset})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Decode(b); err != nil {
		t.Fatal(err)
	}
}
