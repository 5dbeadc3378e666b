package gateway_test

import (
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/syncgate/syncgate/frames"
	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/internal/gwtest"
)

// TestGateway_MalformedFrames sends each bad frame on one session and checks
// its typed error; the same session must then still publish.
func TestGateway_MalformedFrames(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{})
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("", 0)
	cases := []struct {
		name, frame string
		code        frames.Code
		ref         string
	}{
		{"not json", `hello there`, frames.CodeBadFrame, ""},
		{"truncated", `{"type":"mutate","v":1`, frames.CodeBadFrame, ""},
		{"array", `[1,2]`, frames.CodeBadFrame, ""},
		{"string", `"hello"`, frames.CodeBadFrame, ""},
		{"null", `null`, frames.CodeBadFrame, ""},
		{"invalid utf8", "{\"type\":\"hello\",\"v\":1,\"buildId\":\"\xff\"}", frames.CodeBadFrame, ""},
		{"missing v", `{"type":"hello","buildId":"","sessionId":null,"actorId":null,"resume":[]}`, frames.CodeProtocolVersion, ""},
		{"v 2", `{"type":"subscribe","v":2,"op":"add","sid":"a","target":{"kind":"topic","topic":"t","cursor":null}}`, frames.CodeProtocolVersion, "a"},
		{"v string", `{"type":"hello","v":"1"}`, frames.CodeProtocolVersion, ""},
		{"missing type", `{"v":1}`, frames.CodeUnknownType, ""},
		{"unknown type", `{"type":"publish","v":1}`, frames.CodeUnknownType, ""},
		{"type number", `{"type":7,"v":1}`, frames.CodeUnknownType, ""},
		{"subscribe no sid", `{"type":"subscribe","v":1,"op":"add","target":{"kind":"topic","topic":"t","cursor":null}}`, frames.CodeMissingField, ""},
		{"subscribe bad op", `{"type":"subscribe","v":1,"op":"join","sid":"s1","target":{"kind":"topic","topic":"t","cursor":null}}`, frames.CodeBadField, "s1"},
		{"subscribe bad kind", `{"type":"subscribe","v":1,"op":"add","sid":"s1","target":{"kind":"table","topic":"t","cursor":null}}`, frames.CodeBadField, "s1"},
		{"subscribe no target", `{"type":"subscribe","v":1,"op":"add","sid":"s1"}`, frames.CodeMissingField, "s1"},
		{"subscribe no cursor", `{"type":"subscribe","v":1,"op":"add","sid":"s1","target":{"kind":"topic","topic":"t"}}`, frames.CodeMissingField, "s1"},
		{"subscribe bad cursor lsn", `{"type":"subscribe","v":1,"op":"add","sid":"s1","target":{"kind":"topic","topic":"t","cursor":{"qid":"topic:t","lsn":5,"digest":"","ids":[],"count":0,"at":0}}}`, frames.CodeBadField, "s1"},
		{"subscribe bad topic chars", `{"type":"subscribe","v":1,"op":"add","sid":"s2","target":{"kind":"topic","topic":"a b","cursor":null}}`, frames.CodeBadTopic, "s2"},
		{"subscribe topic too long", `{"type":"subscribe","v":1,"op":"add","sid":"s3","target":{"kind":"topic","topic":"` + strings.Repeat("x", 256) + `","cursor":null}}`, frames.CodeBadTopic, "s3"},
		{"subscribe query", `{"type":"subscribe","v":1,"op":"add","sid":"s4","target":{"kind":"query","qid":"q","input":{},"cursor":null}}`, frames.CodeUnsupported, "s4"},
		{"drop unknown sid", `{"type":"subscribe","v":1,"op":"drop","sid":"nope","target":{"kind":"topic","topic":"t","cursor":null}}`, frames.CodeNotSubscribed, "nope"},
		{"mutate seq string", `{"type":"mutate","v":1,"key":"k1","seq":"0","name":"publish","input":{}}`, frames.CodeBadField, "k1"},
		{"mutate seq fraction", `{"type":"mutate","v":1,"key":"k1","seq":0.5,"name":"publish","input":{}}`, frames.CodeBadField, "k1"},
		{"mutate seq negative", `{"type":"mutate","v":1,"key":"k1","seq":-1,"name":"publish","input":{}}`, frames.CodeBadField, "k1"},
		{"mutate no input", `{"type":"mutate","v":1,"key":"k1","seq":0,"name":"publish"}`, frames.CodeMissingField, "k1"},
		{"mutate empty key", `{"type":"mutate","v":1,"key":"","seq":0,"name":"publish","input":{}}`, frames.CodeBadField, ""},
		{"mutate unknown name", `{"type":"mutate","v":1,"key":"k2","seq":0,"name":"explode","input":{}}`, frames.CodeUnknownMutation, "k2"},
		{"publish no topic", `{"type":"mutate","v":1,"key":"k3","seq":1,"name":"publish","input":{"data":1}}`, frames.CodeBadInput, "k3"},
		{"publish no data", `{"type":"mutate","v":1,"key":"k4","seq":2,"name":"publish","input":{"topic":"t"}}`, frames.CodeBadInput, "k4"},
		{"publish input not object", `{"type":"mutate","v":1,"key":"k5","seq":3,"name":"publish","input":[1]}`, frames.CodeBadInput, "k5"},
		{"publish bad topic", `{"type":"mutate","v":1,"key":"k6","seq":4,"name":"publish","input":{"topic":"","data":1}}`, frames.CodeBadTopic, "k6"},
		{"seq gap", `{"type":"mutate","v":1,"key":"k7","seq":9,"name":"publish","input":{"topic":"t","data":1}}`, frames.CodeSeqGap, "k7"},
		{"second hello", `{"type":"hello","v":1,"buildId":"","sessionId":null,"actorId":null,"resume":[]}`, frames.CodeDuplicateHello, ""},
		{"server-only ack", `{"type":"ack","v":1,"ref":"x","lsn":null,"error":null}`, frames.CodeUnexpectedFrame, ""},
		{"server-only patch", `{"type":"patch","v":1,"sid":"x","patches":[],"lsn":""}`, frames.CodeUnexpectedFrame, ""},
		{"presence join without a member", `{"type":"presence","v":1,"topic":"room","op":"join","members":[]}`, frames.CodeBadField, "presence:room"},
		{"presence bad op", `{"type":"presence","v":1,"topic":"room","op":"dance","members":[]}`, frames.CodeBadField, "presence:room"},
		// Refs over their length limit are not echoed, whatever the error.
		{"long sid, no target", `{"type":"subscribe","v":1,"op":"add","sid":"` + strings.Repeat("s", 1000) + `"}`, frames.CodeMissingField, ""},
		{"long key, bad seq", `{"type":"mutate","v":1,"key":"` + strings.Repeat("k", 1000) + `","seq":"0","name":"publish","input":{}}`, frames.CodeBadField, ""},
		{"long presence topic, bad op", `{"type":"presence","v":1,"topic":"` + strings.Repeat("r", 1000) + `","op":"dance","members":[]}`, frames.CodeBadField, ""},
	}
	for _, tc := range cases {
		c.SendRaw(tc.frame)
		ack, ok := c.Next().(*frames.Ack)
		if !ok || ack.Error == nil {
			t.Fatalf("%s: want an error ack, got %+v", tc.name, ack)
		}
		if ack.Error.Code != tc.code || ack.Ref != tc.ref {
			t.Errorf("%s: got code %s ref %q (cause %q), want %s ref %q", tc.name, ack.Error.Code, ack.Ref, ack.Error.Cause, tc.code, tc.ref)
		}
		if ack.Error.Cause == "" || ack.Error.Fix == "" {
			t.Errorf("%s: error without cause or fix: %+v", tc.name, ack.Error)
		}
	}
	// Binary messages are refused too.
	if err := c.C.Write(t.Context(), websocket.MessageBinary, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if ack := gwtest.Expect[*frames.Ack](c); ack.Error == nil || ack.Error.Code != frames.CodeBadFrame {
		t.Fatalf("binary: %+v", ack)
	}
	// The session survived all of it: seqs 0-4 were used by recorded
	// outcomes, so the next is 5.
	c.Subscribe("ok", "t")
	if ack := c.Publish("good", 5, "t", `"still here"`); ack.Error != nil || ack.LSN == nil {
		t.Fatalf("publish after errors: %+v %+v", ack, ack.Error)
	}
	if p := gwtest.Expect[*frames.Patch](c); p.SID != "ok" {
		t.Fatalf("patch = %+v", p)
	}
}

func TestGateway_FrameBeforeHello(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{})
	c := gwtest.Dial(t, srv.url, nil)
	c.SendRaw(`{"type":"subscribe","v":1,"op":"add","sid":"s1","target":{"kind":"topic","topic":"t","cursor":null}}`)
	ack := gwtest.Expect[*frames.Ack](c)
	if ack.Error == nil || ack.Error.Code != frames.CodeHelloRequired || ack.Ref != "s1" {
		t.Fatalf("ack = %+v", ack)
	}
	c.Hello("", 0) // still allowed
	c.Subscribe("s1", "t")
}

func TestGateway_OversizedFrameCloses1009(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{MaxFrameBytes: 1024})
	for _, size := range []int{1023, 1024} {
		c := gwtest.Dial(t, srv.url, nil)
		c.Hello("", 0)
		// A frame of exactly size bytes is accepted (an error ack for the
		// unknown mutation proves the server read it).
		c.SendRaw(padFrame(size))
		if ack := gwtest.Expect[*frames.Ack](c); ack.Error == nil || ack.Error.Code != frames.CodeUnknownMutation {
			t.Fatalf("size %d: %+v", size, ack)
		}
	}
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("", 0)
	c.SendRaw(padFrame(1025))
	c.ExpectClose(websocket.StatusMessageTooBig)
}

// padFrame is a mutate frame of exactly n bytes.
func padFrame(n int) string {
	head := `{"type":"mutate","v":1,"key":"k","seq":0,"name":"x","input":"`
	tail := `"}`
	return head + strings.Repeat("a", n-len(head)-len(tail)) + tail
}

func TestGateway_HelloTimeoutCloses1008(t *testing.T) {
	t.Parallel()
	srv := newTestServer(t, gateway.Config{HelloTimeout: 100 * time.Millisecond})
	c := gwtest.Dial(t, srv.url, nil)
	c.ExpectClose(websocket.StatusPolicyViolation)
}
