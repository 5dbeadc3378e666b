package frames

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
	"unicode/utf8"
)

// validLines holds one valid frame of each kind (and a few variants), as a
// client or server would write them. Tests, fuzz seeds and benchmarks share
// them.
var validLines = []struct {
	name string
	line string
}{
	{"hello/client", `{"type":"hello","v":1,"buildId":"web-2026.08.1","sessionId":null,"actorId":null,"resume":[{"qid":"topic:room-1","lsn":"0000000000000000_0000000000000042","digest":"","ids":[],"count":0,"at":1767225600000}],"clientId":"tab-7f3a","epoch":2}`},
	{"hello/client-seq", `{"type":"hello","v":1,"buildId":"","sessionId":null,"actorId":null,"resume":[],"clientId":"c","seq":0}`},
	{"hello/server", `{"type":"hello","v":1,"buildId":"srv-1","sessionId":"s_91","actorId":null,"resume":[],"maxMessage":65536,"frameRate":1000,"frameBurst":2000}`},
	{"hello/server-slow", `{"type":"hello","v":1,"buildId":"srv-1","sessionId":"s_92","actorId":null,"resume":[],"frameRate":0.5,"frameBurst":1}`},
	{"subscribe/topic", `{"type":"subscribe","v":1,"op":"add","sid":"s1","target":{"kind":"topic","topic":"room-1","cursor":null}}`},
	{"subscribe/topic-cursor", `{"type":"subscribe","v":1,"op":"add","sid":"s2","target":{"kind":"topic","topic":"room-1","cursor":{"qid":"topic:room-1","lsn":"","digest":"","ids":[],"count":0,"at":0}}}`},
	{"subscribe/query", `{"type":"subscribe","v":1,"op":"add","sid":"q1","target":{"kind":"query","qid":"todos.open","input":{"list":"home","limit":50},"cursor":null}}`},
	{"subscribe/drop", `{"type":"subscribe","v":1,"op":"drop","sid":"s1","target":{"kind":"topic","topic":"room-1","cursor":null}}`},
	{"snapshot", `{"type":"snapshot","v":1,"sid":"q1","rows":[{"id":"t1","title":"milk","done":false},{"id":"t2","title":"eggs","done":true}],"cursor":{"qid":"todos.open","lsn":"0000000000000003_0000000000000017","digest":"9f2c","ids":["t1","t2"],"count":2,"at":1767225600123}}`},
	{"patch", `{"type":"patch","v":1,"sid":"s1","patches":[{"op":"insert","id":"0000000000000000_0000000000000043","row":{"id":"0000000000000000_0000000000000043","data":{"text":"hi"},"actorId":null,"at":1767225600200},"lsn":"0000000000000000_0000000000000043"}],"lsn":"0000000000000000_0000000000000043"}`},
	{"patch/delete-index", `{"type":"patch","v":1,"sid":"q1","patches":[{"op":"delete","id":"t1","row":null,"lsn":"0000000000000003_0000000000000018"},{"op":"update","id":"t2","row":{"id":"t2","done":false},"lsn":"0000000000000003_0000000000000019","index":0}],"lsn":"0000000000000003_0000000000000019"}`},
	{"mutate/publish", `{"type":"mutate","v":1,"key":"m-5c1e","seq":0,"name":"publish","input":{"topic":"room-1","data":{"text":"hello, world","from":"ada","n":1}}}`},
	{"ack/ok", `{"type":"ack","v":1,"ref":"m-5c1e","lsn":"0000000000000000_0000000000000043","error":null}`},
	{"ack/error", `{"type":"ack","v":1,"ref":"","lsn":null,"error":{"code":"X_BAD_FRAME","cause":"frame: empty","fix":"Send one JSON object per line.","docs":"https://example.com/x"}}`},
	{"rebase", `{"type":"rebase","v":1,"key":"m-77","entity":"todos/t1","strategy":"server-wins","row":{"id":"t1","title":"milk","done":true}}`},
	{"presence", `{"type":"presence","v":1,"topic":"room-1","op":"sync","members":[{"id":"s_91","actorId":"u_1","meta":{"name":"Ada"},"updatedAt":1767225600000}]}`},
	{"presence/count", `{"type":"presence","v":1,"topic":"room-1","op":"join","members":[{"id":"tab-7f3a","actorId":null,"meta":null,"updatedAt":1767225600000}],"count":1500}`},
	{"reconnect", `{"type":"reconnect","v":1,"afterMs":1500,"reason":"drain"}`},
	{"update-available", `{"type":"update-available","v":1,"buildId":"web-2026.08.2"}`},
}

// mustDecode decodes line and fails the test on error.
func mustDecode(t testing.TB, line string) Frame {
	t.Helper()
	f, err := Decode([]byte(line))
	if err != nil {
		t.Fatalf("Decode(%s): %v", line, err)
	}
	return f
}

// mustEncode encodes f and fails the test on error.
func mustEncode(t testing.TB, f Frame) []byte {
	t.Helper()
	b, err := Encode(f)
	if err != nil {
		t.Fatalf("Encode(%#v): %v", f, err)
	}
	return b
}

func assertEqual[T any](t testing.TB, name string, got, want T) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s:\n got  %#v\n want %#v", name, got, want)
	}
}

// checkWire fails unless b is a well-formed wire frame of type typ.
func checkWire(t testing.TB, b []byte, typ Type) {
	t.Helper()
	if bytes.IndexByte(b, '\n') >= 0 {
		t.Fatalf("encoded frame holds a raw newline: %q", b)
	}
	if !utf8.Valid(b) {
		t.Fatalf("encoded frame is not UTF-8: %q", b)
	}
	if head := `{"type":"` + string(typ) + `","v":1`; !bytes.HasPrefix(b, []byte(head)) {
		t.Fatalf("encoded frame does not start with %s: %s", head, b)
	}
}

// asError returns err as *Error, failing the test if it is not one.
func asError(t testing.TB, err error) *Error {
	t.Helper()
	var fe *Error
	if !errors.As(err, &fe) {
		t.Fatalf("error %v (%T) is not a *frames.Error", err, err)
	}
	return fe
}

func ptr[T any](v T) *T { return &v }
