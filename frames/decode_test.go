package frames

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestDecode_Malformed(t *testing.T) {
	t.Parallel()
	const (
		sub  = `{"type":"subscribe","v":1,"op":"add","sid":"s1",`
		mut  = `{"type":"mutate","v":1,"key":"k1",`
		cur  = `"qid":"topic:a","lsn":"","digest":"","ids":[],"count":0,"at":0`
		hel  = `{"type":"hello","v":1,"buildId":"b","sessionId":null,"actorId":null,`
		pres = `{"type":"presence","v":1,"topic":"room","op":"join",`
	)
	tests := []struct {
		name  string
		line  string
		code  Code
		ref   string
		field string // Cause must start with it
	}{
		{"invalid UTF-8", "{\"type\":\"ack\",\"v\":1,\"ref\":\"\xff\"}", CodeBadFrame, "", "frame"},
		{"empty", ``, CodeBadFrame, "", "frame"},
		{"blank", " \t ", CodeBadFrame, "", "frame"},
		{"not JSON", `hello`, CodeBadFrame, "", "frame"},
		{"array", `[{"type":"ack","v":1}]`, CodeBadFrame, "", "frame"},
		{"string", `"ack"`, CodeBadFrame, "", "frame"},
		{"trailing data", `{"type":"reconnect","v":1,"afterMs":0,"reason":"drain"} x`, CodeBadFrame, "", "frame"},
		{"two objects", `{}{}`, CodeBadFrame, "", "frame"},
		{"truncated", `{"type":"mutate","v":1,"key":"k1"`, CodeBadFrame, "", "frame"},
		{"trailing comma", `{"type":"update-available","v":1,"buildId":"b",}`, CodeBadFrame, "", "frame"},
		{"too deep", `{"type":"mutate","v":1,"key":"k","seq":0,"name":"n","input":` + strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth) + `}`, CodeBadFrame, "", "frame"},
		{"v missing", `{}`, CodeProtocolVersion, "", "v"},
		{"v missing ref known", `{"type":"mutate","key":"k1","seq":0,"name":"publish","input":null}`, CodeProtocolVersion, "k1", "v"},
		{"v 2", `{"type":"subscribe","v":2,"sid":"s9"}`, CodeProtocolVersion, "s9", "v"},
		{"v string", `{"type":"ack","v":"1","ref":"","lsn":null,"error":null}`, CodeProtocolVersion, "", "v"},
		{"v fraction", `{"type":"ack","v":1.5,"ref":"","lsn":null,"error":null}`, CodeProtocolVersion, "", "v"},
		{"v wrong case", `{"type":"ack","V":1,"ref":"","lsn":null,"error":null}`, CodeProtocolVersion, "", "v"},
		{"v bad and type unknown", `{"type":"nope","v":7}`, CodeProtocolVersion, "", "v"},
		{"type missing", `{"v":1}`, CodeUnknownType, "", "type"},
		{"type number", `{"type":3,"v":1}`, CodeUnknownType, "", "type"},
		{"type wrong case", `{"type":"Hello","v":1}`, CodeUnknownType, "", "type"},
		{"type unknown", `{"type":"publish","v":1}`, CodeUnknownType, "", "type"},
		{"type key wrong case", `{"Type":"hello","v":1}`, CodeUnknownType, "", "type"},
		{"mutate key missing", `{"type":"mutate","v":1,"seq":0,"name":"publish","input":null}`, CodeMissingField, "", "mutate.key"},
		{"mutate key empty", `{"type":"mutate","v":1,"key":"","seq":0,"name":"publish","input":null}`, CodeBadField, "", "mutate.key"},
		{"mutate key number", `{"type":"mutate","v":1,"key":1,"seq":0,"name":"publish","input":null}`, CodeBadField, "", "mutate.key"},
		{"mutate seq missing", mut + `"name":"publish","input":null}`, CodeMissingField, "k1", "mutate.seq"},
		{"mutate seq negative", mut + `"seq":-1,"name":"publish","input":null}`, CodeBadField, "k1", "mutate.seq"},
		{"mutate seq fraction", mut + `"seq":1.5,"name":"publish","input":null}`, CodeBadField, "k1", "mutate.seq"},
		{"mutate seq exponent fraction", mut + `"seq":15e-1,"name":"publish","input":null}`, CodeBadField, "k1", "mutate.seq"},
		{"mutate seq string", mut + `"seq":"1","name":"publish","input":null}`, CodeBadField, "k1", "mutate.seq"},
		{"mutate seq overflow", mut + `"seq":9223372036854775808,"name":"publish","input":null}`, CodeBadField, "k1", "mutate.seq"},
		{"mutate seq null", mut + `"seq":null,"name":"publish","input":null}`, CodeBadField, "k1", "mutate.seq"},
		{"mutate name empty", mut + `"seq":0,"name":"","input":null}`, CodeBadField, "k1", "mutate.name"},
		{"mutate input missing", mut + `"seq":0,"name":"publish"}`, CodeMissingField, "k1", "mutate.input"},
		{"mutate input wrong case", mut + `"seq":0,"name":"publish","Input":{}}`, CodeMissingField, "k1", "mutate.input"},
		{"subscribe op unknown", `{"type":"subscribe","v":1,"op":"remove","sid":"s1","target":{"kind":"topic","topic":"a","cursor":null}}`, CodeBadField, "s1", "subscribe.op"},
		{"subscribe sid empty", `{"type":"subscribe","v":1,"op":"add","sid":"","target":{"kind":"topic","topic":"a","cursor":null}}`, CodeBadField, "", "subscribe.sid"},
		{"subscribe target missing", sub + `"tgt":{}}`, CodeMissingField, "s1", "subscribe.target"},
		{"subscribe target null", sub + `"target":null}`, CodeBadField, "s1", "subscribe.target"},
		{"subscribe kind unknown", sub + `"target":{"kind":"stream","topic":"a","cursor":null}}`, CodeBadField, "s1", "subscribe.target.kind"},
		{"subscribe topic empty", sub + `"target":{"kind":"topic","topic":"","cursor":null}}`, CodeBadField, "s1", "subscribe.target.topic"},
		{"subscribe query input missing", sub + `"target":{"kind":"query","qid":"q","cursor":null}}`, CodeMissingField, "s1", "subscribe.target.input"},
		{"subscribe query qid empty", sub + `"target":{"kind":"query","qid":"","input":{},"cursor":null}}`, CodeBadField, "s1", "subscribe.target.qid"},
		{"subscribe cursor missing", sub + `"target":{"kind":"topic","topic":"a"}}`, CodeMissingField, "s1", "subscribe.target.cursor"},
		{"cursor lsn number", sub + `"target":{"kind":"topic","topic":"a","cursor":{"qid":"topic:a","lsn":5,"digest":"","ids":[],"count":0,"at":0}}}`, CodeBadField, "s1", "subscribe.target.cursor.lsn: want string, got number"},
		{"cursor lsn malformed", sub + `"target":{"kind":"topic","topic":"a","cursor":{"qid":"topic:a","lsn":"42","digest":"","ids":[],"count":0,"at":0}}}`, CodeBadField, "s1", "subscribe.target.cursor.lsn"},
		{"cursor id not string", sub + `"target":{"kind":"topic","topic":"a","cursor":{"qid":"topic:a","lsn":"","digest":"","ids":["x",1],"count":0,"at":0}}}`, CodeBadField, "s1", "subscribe.target.cursor.ids[1]"},
		{"cursor count negative", sub + `"target":{"kind":"topic","topic":"a","cursor":{"qid":"topic:a","lsn":"","digest":"","ids":[],"count":-1,"at":0}}}`, CodeBadField, "s1", "subscribe.target.cursor.count"},
		{"cursor at missing", sub + `"target":{"kind":"topic","topic":"a","cursor":{"qid":"topic:a","lsn":"","digest":"","ids":[],"count":0}}}`, CodeMissingField, "s1", "subscribe.target.cursor.at"},
		{"hello resume missing", hel + `"clientId":"c"}`, CodeMissingField, "", "hello.resume"},
		{"hello sessionId number", `{"type":"hello","v":1,"buildId":"b","sessionId":5,"actorId":null,"resume":[]}`, CodeBadField, "", "hello.sessionId"},
		{"hello buildId missing", `{"type":"hello","v":1,"sessionId":null,"actorId":null,"resume":[]}`, CodeMissingField, "", "hello.buildId"},
		{"hello epoch negative", hel + `"resume":[],"epoch":-1}`, CodeBadField, "", "hello.epoch"},
		{"hello maxMessage negative", hel + `"resume":[],"maxMessage":-1}`, CodeBadField, "", "hello.maxMessage"},
		{"hello maxMessage string", hel + `"resume":[],"maxMessage":"64k"}`, CodeBadField, "", "hello.maxMessage"},
		{"hello seq negative", hel + `"resume":[],"seq":-1}`, CodeBadField, "", "hello.seq"},
		{"hello seq string", hel + `"resume":[],"seq":"3"}`, CodeBadField, "", "hello.seq"},
		{"hello frameRate negative", hel + `"resume":[],"frameRate":-1}`, CodeBadField, "", "hello.frameRate"},
		{"hello frameRate string", hel + `"resume":[],"frameRate":"fast"}`, CodeBadField, "", "hello.frameRate"},
		{"hello frameRate huge", hel + `"resume":[],"frameRate":1e999}`, CodeBadField, "", "hello.frameRate"},
		{"hello frameBurst fraction", hel + `"resume":[],"frameBurst":2.5}`, CodeBadField, "", "hello.frameBurst"},
		{"hello token null", hel + `"resume":[],"token":null}`, CodeBadField, "", "hello.token"},
		{"hello resume not cursors", hel + `"resume":[5]}`, CodeBadField, "", "hello.resume[0]"},
		{"hello resume cursor qid missing", hel + `"resume":[{` + cur + `},{"lsn":"","digest":"","ids":[],"count":0,"at":0}]}`, CodeMissingField, "", "hello.resume[1].qid"},
		{"snapshot row without id", `{"type":"snapshot","v":1,"sid":"q","rows":[{"x":1}],"cursor":{` + cur + `}}`, CodeBadField, "", "snapshot.rows[0]"},
		{"snapshot row id number", `{"type":"snapshot","v":1,"sid":"q","rows":[{"id":"a"},{"id":1}],"cursor":{` + cur + `}}`, CodeBadField, "", "snapshot.rows[1].id"},
		{"snapshot cursor null", `{"type":"snapshot","v":1,"sid":"q","rows":[],"cursor":null}`, CodeBadField, "", "snapshot.cursor"},
		{"patch op unknown", `{"type":"patch","v":1,"sid":"s","patches":[{"op":"upsert","id":"a","row":null,"lsn":""}],"lsn":""}`, CodeBadField, "", "patch.patches[0].op"},
		{"patch row array", `{"type":"patch","v":1,"sid":"s","patches":[{"op":"insert","id":"a","row":[],"lsn":""}],"lsn":""}`, CodeBadField, "", "patch.patches[0].row"},
		{"patch row missing", `{"type":"patch","v":1,"sid":"s","patches":[{"op":"delete","id":"a","lsn":""}],"lsn":""}`, CodeMissingField, "", "patch.patches[0].row"},
		{"patch index negative", `{"type":"patch","v":1,"sid":"s","patches":[{"op":"delete","id":"a","row":null,"lsn":"","index":-2}],"lsn":""}`, CodeBadField, "", "patch.patches[0].index"},
		{"patch lsn missing", `{"type":"patch","v":1,"sid":"s","patches":[]}`, CodeMissingField, "", "patch.lsn"},
		{"ack error fix missing", `{"type":"ack","v":1,"ref":"k","lsn":null,"error":{"code":"X_INTERNAL","cause":"boom"}}`, CodeMissingField, "", "ack.error.fix"},
		{"ack lsn number", `{"type":"ack","v":1,"ref":"k","lsn":5,"error":null}`, CodeBadField, "", "ack.lsn"},
		{"ack error missing", `{"type":"ack","v":1,"ref":"k","lsn":null}`, CodeMissingField, "", "ack.error"},
		{"rebase strategy unknown", `{"type":"rebase","v":1,"key":"k","entity":"e","strategy":"mine","row":null}`, CodeBadField, "", "rebase.strategy"},
		{"rebase row id missing", `{"type":"rebase","v":1,"key":"k","entity":"e","strategy":"custom","row":{"ID":"x"}}`, CodeBadField, "", "rebase.row"},
		{"presence op unknown", pres[:len(pres)-len(`"op":"join",`)] + `"op":"wave","members":[]}`, CodeBadField, "presence:room", "presence.op"},
		{"presence topic empty", `{"type":"presence","v":1,"topic":"","op":"join","members":[]}`, CodeBadField, "", "presence.topic"},
		{"presence member meta missing", pres + `"members":[{"id":"a","actorId":null,"updatedAt":1}]}`, CodeMissingField, "presence:room", "presence.members[0].meta"},
		{"presence member updatedAt fraction", pres + `"members":[{"id":"a","actorId":null,"meta":null,"updatedAt":0.5}]}`, CodeBadField, "presence:room", "presence.members[0].updatedAt"},
		{"presence count negative", pres + `"members":[],"count":-1}`, CodeBadField, "presence:room", "presence.count"},
		{"presence count string", pres + `"members":[],"count":"3"}`, CodeBadField, "presence:room", "presence.count"},
		{"presence count null", pres + `"members":[],"count":null}`, CodeBadField, "presence:room", "presence.count"},
		{"presence count fraction", pres + `"members":[],"count":2.5}`, CodeBadField, "presence:room", "presence.count"},
		{"reconnect afterMs negative", `{"type":"reconnect","v":1,"afterMs":-5,"reason":"drain"}`, CodeBadField, "", "reconnect.afterMs"},
		{"reconnect reason unknown", `{"type":"reconnect","v":1,"afterMs":5,"reason":"bored"}`, CodeBadField, "", "reconnect.reason"},
		{"update-available buildId null", `{"type":"update-available","v":1,"buildId":null}`, CodeBadField, "", "update-available.buildId"},
		{"update-available buildId missing", `{"type":"update-available","v":1}`, CodeMissingField, "", "update-available.buildId"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f, err := Decode([]byte(tt.line))
			if err == nil {
				t.Fatalf("Decode succeeded: %#v", f)
			}
			if f != nil {
				t.Errorf("Decode returned a frame with its error: %#v", f)
			}
			fe := asError(t, err)
			if fe.Code != tt.code {
				t.Errorf("Code = %s, want %s (cause %q)", fe.Code, tt.code, fe.Cause)
			}
			if fe.Ref != tt.ref {
				t.Errorf("Ref = %q, want %q", fe.Ref, tt.ref)
			}
			if !strings.HasPrefix(fe.Cause, tt.field) {
				t.Errorf("Cause = %q, want it to start with %q", fe.Cause, tt.field)
			}
			if !causeNamesField(fe) {
				t.Errorf("Cause = %q does not start with the field's path", fe.Cause)
			}
			if fe.Fix == "" {
				t.Error("Fix is empty")
			}
			if !utf8.ValidString(fe.Cause) || !utf8.ValidString(fe.Fix) {
				t.Errorf("Cause or Fix is not UTF-8: %q %q", fe.Cause, fe.Fix)
			}
			if !strings.HasPrefix(err.Error(), "frames: "+string(tt.code)) {
				t.Errorf("Error() = %q", err.Error())
			}
		})
	}
}

func TestDecode_Frames(t *testing.T) {
	t.Parallel()
	cursor := Cursor{QID: "topic:room-1", LSN: "0000000000000000_0000000000000042", Digest: "", IDs: []string{}, At: 1767225600000}
	want := map[string]Frame{
		"hello/client":      &Hello{BuildID: "web-2026.08.1", Resume: []Cursor{cursor}, ClientID: "tab-7f3a", Epoch: 2},
		"hello/client-seq":  &Hello{Resume: []Cursor{}, ClientID: "c", Seq: new(int64)},
		"hello/server":      &Hello{BuildID: "srv-1", SessionID: ptr("s_91"), Resume: []Cursor{}, MaxMessage: 65536, FrameRate: 1000, FrameBurst: 2000},
		"hello/server-slow": &Hello{BuildID: "srv-1", SessionID: ptr("s_92"), Resume: []Cursor{}, FrameRate: 0.5, FrameBurst: 1},
		"subscribe/topic": &Subscribe{Op: OpAdd, SID: "s1",
			Target: Target{Kind: TargetTopic, Topic: "room-1"}},
		"subscribe/topic-cursor": &Subscribe{Op: OpAdd, SID: "s2",
			Target: Target{Kind: TargetTopic, Topic: "room-1", Cursor: &Cursor{QID: "topic:room-1", IDs: []string{}}}},
		"subscribe/query": &Subscribe{Op: OpAdd, SID: "q1",
			Target: Target{Kind: TargetQuery, QID: "todos.open", Input: json.RawMessage(`{"list":"home","limit":50}`)}},
		"subscribe/drop": &Subscribe{Op: OpDrop, SID: "s1", Target: Target{Kind: TargetTopic, Topic: "room-1"}},
		"snapshot": &Snapshot{SID: "q1",
			Rows: []json.RawMessage{
				json.RawMessage(`{"id":"t1","title":"milk","done":false}`),
				json.RawMessage(`{"id":"t2","title":"eggs","done":true}`),
			},
			Cursor: Cursor{QID: "todos.open", LSN: "0000000000000003_0000000000000017", Digest: "9f2c", IDs: []string{"t1", "t2"}, Count: 2, At: 1767225600123}},
		"patch": &Patch{SID: "s1", LSN: "0000000000000000_0000000000000043", Patches: []PatchOp{{
			Op: PatchInsert, ID: "0000000000000000_0000000000000043", LSN: "0000000000000000_0000000000000043",
			Row: json.RawMessage(`{"id":"0000000000000000_0000000000000043","data":{"text":"hi"},"actorId":null,"at":1767225600200}`),
		}}},
		"patch/delete-index": &Patch{SID: "q1", LSN: "0000000000000003_0000000000000019", Patches: []PatchOp{
			{Op: PatchDelete, ID: "t1", LSN: "0000000000000003_0000000000000018"},
			{Op: PatchUpdate, ID: "t2", Row: json.RawMessage(`{"id":"t2","done":false}`), LSN: "0000000000000003_0000000000000019", Index: ptr[int64](0)},
		}},
		"mutate/publish": &Mutate{Key: "m-5c1e", Seq: 0, Name: "publish",
			Input: json.RawMessage(`{"topic":"room-1","data":{"text":"hello, world","from":"ada","n":1}}`)},
		"ack/ok": &Ack{Ref: "m-5c1e", LSN: ptr("0000000000000000_0000000000000043")},
		"ack/error": &Ack{Error: &ErrorBody{Code: CodeBadFrame, Cause: "frame: empty",
			Fix: "Send one JSON object per line.", Docs: "https://example.com/x"}},
		"rebase": &Rebase{Key: "m-77", Entity: "todos/t1", Strategy: StrategyServerWins,
			Row: json.RawMessage(`{"id":"t1","title":"milk","done":true}`)},
		"presence": &Presence{Topic: "room-1", Op: PresenceSync, Members: []Member{{
			ID: "s_91", ActorID: ptr("u_1"), Meta: json.RawMessage(`{"name":"Ada"}`), UpdatedAt: 1767225600000}}},
		"presence/count": &Presence{Topic: "room-1", Op: PresenceJoin, Count: 1500, Members: []Member{{
			ID: "tab-7f3a", ActorID: nil, Meta: json.RawMessage(`null`), UpdatedAt: 1767225600000}}},
		"reconnect":        &Reconnect{AfterMs: 1500, Reason: ReasonDrain},
		"update-available": &UpdateAvailable{BuildID: "web-2026.08.2"},
	}
	for _, tt := range validLines {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := mustDecode(t, tt.line)
			w, ok := want[tt.name]
			if !ok {
				t.Fatalf("no expectation for %s", tt.name)
			}
			assertEqual(t, "decoded", got, w)
			// The lines are written in wire form, so encoding reproduces them.
			assertEqual(t, "encoded", string(mustEncode(t, got)), tt.line)
		})
	}
}

func TestDecode_Lenient(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		line string
		want Frame
	}{
		{"whitespace and CR", " {\"type\" : \"reconnect\",\n \"v\":1, \"afterMs\": 10,\"reason\":\"overload\" }\r",
			&Reconnect{AfterMs: 10, Reason: ReasonOverload}},
		{"unknown fields ignored", `{"type":"reconnect","v":1,"afterMs":10,"reason":"drain","extra":{"a":[1,2]},"afterms":"x"}`,
			&Reconnect{AfterMs: 10, Reason: ReasonDrain}},
		{"field order free", `{"reason":"rebalance","afterMs":0,"v":1,"type":"reconnect"}`,
			&Reconnect{Reason: ReasonRebalance}},
		{"last duplicate wins", `{"type":"reconnect","v":1,"afterMs":"bad","afterMs":7,"reason":"drain"}`,
			&Reconnect{AfterMs: 7, Reason: ReasonDrain}},
		{"integer forms", `{"type":"reconnect","v":1.0,"afterMs":2.5e3,"reason":"drain"}`,
			&Reconnect{AfterMs: 2500, Reason: ReasonDrain}},
		{"escaped names and values", `{"\u0074ype":"upd\u0061te-available","v":1,"buildId":"\u00e9\ud83d\ude00\ud800\n"}`,
			&UpdateAvailable{BuildID: "é😀\ufffd\n"}},
		{"raw compacted", `{"type":"mutate","v":1,"key":"k","seq":3,"name":"publish","input": { "topic" : "a b" , "data" : [ 1 , "x y" ] } }`,
			&Mutate{Key: "k", Seq: 3, Name: "publish", Input: json.RawMessage(`{"topic":"a b","data":[1,"x y"]}`)}},
		{"lone surrogate kept in raw JSON", `{"type":"mutate","v":1,"key":"k\udc00","seq":0,"name":"n","input":{"a":"\ud800"}}`,
			&Mutate{Key: "k\ufffd", Name: "n", Input: json.RawMessage(`{"a":"\ud800"}`)}},
		{"input null", `{"type":"mutate","v":1,"key":"k","seq":0,"name":"n","input":null}`,
			&Mutate{Key: "k", Name: "n", Input: json.RawMessage(`null`)}},
		{"query fields ignored on topic target", `{"type":"subscribe","v":1,"op":"add","sid":"s","target":{"kind":"topic","topic":"t","qid":"q","input":5,"cursor":null}}`,
			&Subscribe{Op: OpAdd, SID: "s", Target: Target{Kind: TargetTopic, Topic: "t"}}},
		{"max int64", `{"type":"mutate","v":1,"key":"k","seq":9223372036854775807,"name":"n","input":0}`,
			&Mutate{Key: "k", Seq: 1<<63 - 1, Name: "n", Input: json.RawMessage(`0`)}},
		{"ack ref empty", `{"type":"ack","v":1,"ref":"","lsn":null,"error":null}`, &Ack{}},
		{"escaped offset", `{"type":"snapshot","v":1,"sid":"s","rows":[],"cursor":{"qid":"q","lsn":"0000000000000000_000000000000004\u0032","digest":"","ids":[],"count":0,"at":0}}`,
			&Snapshot{SID: "s", Rows: []json.RawMessage{}, Cursor: Cursor{QID: "q", LSN: "0000000000000000_0000000000000042", IDs: []string{}}}},
		{"max depth", `{"type":"mutate","v":1,"key":"k","seq":0,"name":"n","input":` + strings.Repeat("[", maxDepth-1) + strings.Repeat("]", maxDepth-1) + `}`,
			&Mutate{Key: "k", Name: "n", Input: json.RawMessage(strings.Repeat("[", maxDepth-1) + strings.Repeat("]", maxDepth-1))}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			assertEqual(t, "decoded", mustDecode(t, tt.line), tt.want)
		})
	}
}

// TestDecode_DoesNotRetain overwrites the input after decoding.
func TestDecode_DoesNotRetain(t *testing.T) {
	t.Parallel()
	for _, l := range validLines {
		line := []byte(l.line)
		f, err := Decode(line)
		if err != nil {
			t.Fatal(err)
		}
		before := string(mustEncode(t, f))
		for i := range line {
			line[i] = 'x'
		}
		assertEqual(t, l.name, string(mustEncode(t, f)), before)
	}
}

func Test_parseInt(t *testing.T) {
	t.Parallel()
	tests := []struct {
		tok  string
		want int64
		ok   bool
	}{
		{"0", 0, true}, {"-0", 0, true}, {"7", 7, true}, {"-7", -7, true},
		{"1.0", 1, true}, {"1.50e1", 15, true}, {"1e3", 1000, true}, {"1E+3", 1000, true},
		{"100e-2", 1, true}, {"0.0e-99999999999", 0, true}, {"0e99999999999", 0, true},
		{"9223372036854775807", 1<<63 - 1, true}, {"-9223372036854775808", -1 << 63, true},
		{"9223372036854775808", 0, false}, {"-9223372036854775809", 0, false},
		{"1.5", 0, false}, {"1e-1", 0, false}, {"1e19", 0, false}, {"1e999999999999", 0, false},
		{"0.000000000000000000000000001e27", 1, true}, {"12345678901234567890e-1", 1234567890123456789, true},
	}
	for _, tt := range tests {
		t.Run(tt.tok, func(t *testing.T) {
			t.Parallel()
			got, ok := parseInt([]byte(tt.tok))
			if got != tt.want || ok != tt.ok {
				t.Fatalf("parseInt(%s) = %d, %v; want %d, %v", tt.tok, got, ok, tt.want, tt.ok)
			}
		})
	}
}

func TestSplit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		msg  string
		want []string
	}{
		{"one", `{"a":1}`, []string{`{"a":1}`}},
		{"two", "{\"a\":1}\n{\"b\":2}", []string{`{"a":1}`, `{"b":2}`}},
		{"trailing newline", "x\n", []string{"x"}},
		{"CRLF", "x\r\ny\r\n", []string{"x", "y"}},
		{"blank lines", "\n\n x\n \t\r\n\ny", []string{" x", "y"}},
		{"empty", "", nil},
		{"only newlines", "\n\r\n\n", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var got []string
			Split([]byte(tt.msg), func(line []byte) bool {
				got = append(got, string(line))
				return true
			})
			assertEqual(t, "lines", got, tt.want)
		})
	}
	t.Run("stops", func(t *testing.T) {
		t.Parallel()
		n := 0
		Split([]byte("a\nb\nc"), func([]byte) bool { n++; return n < 2 })
		if n != 2 {
			t.Fatalf("fn called %d times after returning false at 2", n)
		}
	})
}

// TestSplit_Batch decodes a server batch: every kind in one message.
func TestSplit_Batch(t *testing.T) {
	t.Parallel()
	var msg []byte
	for _, l := range validLines {
		msg = append(msg, l.line...)
		msg = append(msg, '\n')
	}
	var got []string
	Split(msg, func(line []byte) bool {
		f := mustDecode(t, string(line))
		got = append(got, string(mustEncode(t, f)))
		return true
	})
	if len(got) != len(validLines) {
		t.Fatalf("got %d frames, want %d", len(got), len(validLines))
	}
	for i, l := range validLines {
		assertEqual(t, l.name, got[i], l.line)
	}
}

// TestDecode_TooDeepCause: a frame nested over the limit is valid JSON
// syntax up to the byte where it goes too deep; its cause says so rather
// than call a '[' unexpected.
func TestDecode_TooDeepCause(t *testing.T) {
	t.Parallel()
	for _, open := range []string{"[", `{"a":`} {
		line := `{"type":"mutate","v":1,"key":"k","seq":0,"name":"n","input":` + strings.Repeat(open, maxDepth) + `}`
		_, err := Decode([]byte(line))
		fe := asError(t, err)
		if fe.Code != CodeBadFrame || !strings.HasPrefix(fe.Cause, "frame: ") ||
			!strings.Contains(fe.Cause, "nested more than 10000 deep") {
			t.Errorf("%s...: %s %q", open, fe.Code, fe.Cause)
		}
	}
	// The encoders refuse a raw value nested too deep with the same words.
	_, err := Encode(&Mutate{Key: "k", Name: "n", Input: json.RawMessage(strings.Repeat("[", maxDepth+1) + strings.Repeat("]", maxDepth+1))})
	if err == nil || !strings.Contains(err.Error(), "nested more than 10000 deep") {
		t.Errorf("Encode of a too deep input: %v", err)
	}
}

// TestDecode_UTF8Cause: the cause of a frame that is not UTF-8 says where.
func TestDecode_UTF8Cause(t *testing.T) {
	t.Parallel()
	fe := asError(t, func() error { _, err := Decode([]byte("{\"type\":\"ack\",\"v\":1,\"ref\":\"é\xff\"}")); return err }())
	if fe.Code != CodeBadFrame || fe.Cause != "frame: not valid UTF-8 at byte 29" {
		t.Errorf("%s %q", fe.Code, fe.Cause)
	}
}
