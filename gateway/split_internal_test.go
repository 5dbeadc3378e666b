package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"
)

// splitByUnmarshal is what splitRecords computes, the slow way: each
// element of a JSON array, compacted.
func splitByUnmarshal(body []byte) [][]byte {
	var v json.RawMessage
	if json.Unmarshal(body, &v) != nil {
		return nil
	}
	msgs := []json.RawMessage{v}
	if bytes.HasPrefix(v, []byte("[")) {
		msgs = nil
		_ = json.Unmarshal(v, &msgs)
	}
	out := make([][]byte, len(msgs))
	for i, m := range msgs {
		var b bytes.Buffer
		_ = json.Compact(&b, m)
		out[i] = b.Bytes()
	}
	return out
}

func TestSplitRecords(t *testing.T) {
	for _, body := range []string{
		`1`, `"a,b]"`, ` [ ] `, `[1]`, `[1, 2 ,3]`, `[[1,2],{"a":[3,{"b":"]"}]},"x\"],[",null]`,
		`{"k":[1,2]}`, `["\\", "\\\"", "]"]`, "[\n {\"a\" : 1}\n]",
	} {
		got, err := splitRecords("application/json", []byte(body), true)
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if want := splitByUnmarshal([]byte(body)); !equalRecords(got, want) {
			t.Fatalf("%s: split into %q, want %q", body, got, want)
		}
	}
	// Too many messages is a 413, at the bound and not before.
	at := "[" + strings.Repeat("0,", maxAppendMessages-1) + "0]"
	if recs, err := splitRecords("application/json", []byte(at), false); err != nil || len(recs) != maxAppendMessages {
		t.Fatalf("%d messages: %d records, %v", maxAppendMessages, len(recs), err)
	}
	over := "[" + strings.Repeat("0,", maxAppendMessages) + "0]"
	var re *requestError
	if _, err := splitRecords("application/json", []byte(over), false); !errors.As(err, &re) || re.status != http.StatusRequestEntityTooLarge {
		t.Fatalf("%d messages: %v, want a 413", maxAppendMessages+1, err)
	}
}

// splitRecords agrees with encoding/json on every valid JSON body.
func FuzzSplitRecords(f *testing.F) {
	for _, s := range []string{`[1,"a"]`, `{"a":[1,2]}`, `["\\\"]",[[]],{}]`, `[ ]`, `"x"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := splitRecords("application/json", body, true)
		if len(body) == 0 {
			return // a PUT with no body: no records
		}
		if !json.Valid(body) {
			if err == nil {
				t.Fatalf("%q: invalid JSON accepted", body)
			}
			return
		}
		if err != nil {
			// Only two refusals of valid JSON are right: invalid UTF-8
			// inside a string (json.Valid does not check it), and an
			// array over maxAppendMessages (a 413).
			var re *requestError
			if utf8.Valid(body) && (!errors.As(err, &re) || re.status != http.StatusRequestEntityTooLarge) {
				t.Fatalf("%q: valid JSON refused: %v", body, err)
			}
			return
		}
		if want := splitByUnmarshal(body); !equalRecords(got, want) {
			t.Fatalf("%q: split into %q, want %q", body, got, want)
		}
	})
}

func equalRecords(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}
