package frames

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

func lineOf(name string) []byte {
	for _, l := range validLines {
		if l.name == name {
			return []byte(l.line)
		}
	}
	panic("no line " + name)
}

func BenchmarkDecode_Mutate(b *testing.B) {
	line := lineOf("mutate/publish")
	b.ReportAllocs()
	b.SetBytes(int64(len(line)))
	for b.Loop() {
		if _, err := Decode(line); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecode_Subscribe(b *testing.B) {
	line := lineOf("subscribe/topic")
	b.ReportAllocs()
	b.SetBytes(int64(len(line)))
	for b.Loop() {
		if _, err := Decode(line); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecode_Mutate_stdMap is the baseline Decode replaced: one
// encoding/json unmarshal into a map, before any field checks.
func BenchmarkDecode_Mutate_stdMap(b *testing.B) {
	line := lineOf("mutate/publish")
	b.ReportAllocs()
	b.SetBytes(int64(len(line)))
	for b.Loop() {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(line, &m); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncode_Ack(b *testing.B) {
	lsn := FormatOffset(0, 43)
	ack := &Ack{Ref: "m-5c1e", LSN: &lsn}
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if buf, err = AppendEncode(buf[:0], ack); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEncode_Ack_std is the same ack through encoding/json.
func BenchmarkEncode_Ack_std(b *testing.B) {
	lsn := FormatOffset(0, 43)
	ack := &Ack{Ref: "m-5c1e", LSN: &lsn}
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if buf, err = appendReflect(buf[:0], ack); err != nil {
			b.Fatal(err)
		}
	}
}

// benchPatch is one insert of a topic message with a ~100 byte row.
func benchPatch() ([]PatchOp, string) {
	lsn := FormatOffset(0, 43)
	row := json.RawMessage(`{"id":"` + lsn + `","data":{"text":"hello, world"},"actorId":null,"at":1767225600200}`)
	return []PatchOp{{Op: PatchInsert, ID: lsn, Row: row, LSN: lsn}}, lsn
}

func BenchmarkAppendPatchBody(b *testing.B) {
	ops, lsn := benchPatch()
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	b.SetBytes(int64(len(ops[0].Row)))
	for b.Loop() {
		var err error
		if buf, err = AppendPatchBody(buf[:0], ops, lsn); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAppendPatchBody_std encodes the whole patch through
// encoding/json, for comparison.
func BenchmarkAppendPatchBody_std(b *testing.B) {
	ops, lsn := benchPatch()
	p := &Patch{SID: "s1", Patches: ops, LSN: lsn}
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	b.SetBytes(int64(len(ops[0].Row)))
	for b.Loop() {
		var err error
		if buf, err = appendReflect(buf[:0], p); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAppendPatchPrefix(b *testing.B) {
	buf := make([]byte, 0, 64)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendPatchPrefix(buf[:0], "sub-42")
	}
}

func BenchmarkEncode_Hello(b *testing.B) {
	f, err := Decode(lineOf("hello/server"))
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		if buf, err = AppendEncode(buf[:0], f); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEncode_PresenceSync encodes the sync a joiner of a 1,000-member
// topic receives, by hand (AppendEncode) and through encoding/json.
func BenchmarkEncode_PresenceSync(b *testing.B) {
	members := make([]Member, 1000)
	for i := range members {
		members[i] = Member{ID: fmt.Sprintf("client-%04d", i), Meta: json.RawMessage(`{"status":"online","t":1764430000000}`), UpdatedAt: 1764430000000}
	}
	p := &Presence{Topic: "room:1", Op: PresenceSync, Members: members}
	for _, enc := range []struct {
		name string
		fn   func([]byte, Frame) ([]byte, error)
	}{{"hand", AppendEncode}, {"encoding-json", appendReflect}} {
		b.Run(enc.name, func(b *testing.B) {
			b.ReportAllocs()
			var buf []byte
			for b.Loop() {
				var err error
				if buf, err = enc.fn(buf[:0], p); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(int64(len(buf)))
		})
	}
}

// benchMutate is a publish mutate as the Go client sends one: a 100-byte
// message, the size syncgate bench uses.
func benchMutate(b *testing.B) *Mutate {
	input, err := AppendPublishInput(nil, "bench:topics:42", json.RawMessage(`{"t":1764467000000000000,"pad":"`+strings.Repeat("x", 60)+`"}`))
	if err != nil {
		b.Fatal(err)
	}
	return &Mutate{Key: "s-5c1e:1234", Seq: 1234, Name: "publish", Input: input}
}

func BenchmarkEncode_Mutate(b *testing.B) {
	m := benchMutate(b)
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if buf, err = AppendEncode(buf[:0], m); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEncode_PublishMutate is the same frame as the Go client's
// PublishAsync builds it: the tail (input checked once), then the frame
// in a slice sized for it.
func BenchmarkEncode_PublishMutate(b *testing.B) {
	data := json.RawMessage(`{"t":1764467000000000000,"pad":"` + strings.Repeat("x", 60) + `"}`)
	b.ReportAllocs()
	for b.Loop() {
		tail, err := NewPublishTail("bench:topics:42", data)
		if err != nil {
			b.Fatal(err)
		}
		_ = AppendPublishMutate(make([]byte, 0, 64+11+tail.Len()), "s-5c1e:1234", 1234, tail)
	}
}

// BenchmarkEncode_PublishTwoPass is the same frame built as the Go client
// built it before AppendPublishMutate: the input, then the mutate around
// it, each into a new slice, data checked twice.
func BenchmarkEncode_PublishTwoPass(b *testing.B) {
	data := json.RawMessage(`{"t":1764467000000000000,"pad":"` + strings.Repeat("x", 60) + `"}`)
	b.ReportAllocs()
	for b.Loop() {
		input, err := AppendPublishInput(nil, "bench:topics:42", data)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := AppendEncode(nil, &Mutate{Key: "s-5c1e:1234", Seq: 1234, Name: "publish", Input: input}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEncode_Mutate_std is the same mutate through encoding/json.
func BenchmarkEncode_Mutate_std(b *testing.B) {
	m := benchMutate(b)
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if buf, err = appendReflect(buf[:0], m); err != nil {
			b.Fatal(err)
		}
	}
}
