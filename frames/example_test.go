package frames_test

import (
	"errors"
	"fmt"

	"github.com/syncgate/syncgate/frames"
)

func ExampleDecode() {
	msg := []byte(`{"type":"mutate","v":1,"key":"m-1","seq":0,"name":"publish","input":{"topic":"room-1","data":{"text":"hi"}}}
{"type":"mutate","v":1,"key":"m-2","seq":"1","name":"publish","input":{}}`)

	frames.Split(msg, func(line []byte) bool {
		f, err := frames.Decode(line)
		var fe *frames.Error
		if errors.As(err, &fe) {
			// Answer with an error ack; the session stays open.
			ack, _ := frames.Encode(&frames.Ack{Ref: fe.Ref, Error: fe.Body()})
			fmt.Printf("%s\n", ack)
			return true
		}
		switch f := f.(type) {
		case *frames.Mutate:
			fmt.Printf("mutate %s seq %d: %s %s\n", f.Key, f.Seq, f.Name, f.Input)
		}
		return true
	})
	// Output:
	// mutate m-1 seq 0: publish {"topic":"room-1","data":{"text":"hi"}}
	// {"type":"ack","v":1,"ref":"m-2","lsn":null,"error":{"code":"X_BAD_FIELD","cause":"mutate.seq: want integer >= 0, got string","fix":"Send mutate.seq as integer >= 0."}}
}

func ExampleAppendPatchPrefix() {
	lsn := frames.FormatOffset(0, 43)
	row := []byte(`{"id":"` + lsn + `","data":{"text":"hi"},"actorId":null,"at":1767225600200}`)

	// Once per publication.
	body, err := frames.AppendPatchBody(nil, []frames.PatchOp{{Op: frames.PatchInsert, ID: lsn, Row: row, LSN: lsn}}, lsn)
	if err != nil {
		panic(err)
	}
	// Per subscriber: its own prefix, then the shared body.
	for _, sid := range []string{"s1", "chat"} {
		frame := append(frames.AppendPatchPrefix(nil, sid), body...)
		fmt.Printf("%s\n", frame)
	}
	// Output:
	// {"type":"patch","v":1,"sid":"s1","patches":[{"op":"insert","id":"0000000000000000_0000000000000043","row":{"id":"0000000000000000_0000000000000043","data":{"text":"hi"},"actorId":null,"at":1767225600200},"lsn":"0000000000000000_0000000000000043"}],"lsn":"0000000000000000_0000000000000043"}
	// {"type":"patch","v":1,"sid":"chat","patches":[{"op":"insert","id":"0000000000000000_0000000000000043","row":{"id":"0000000000000000_0000000000000043","data":{"text":"hi"},"actorId":null,"at":1767225600200},"lsn":"0000000000000000_0000000000000043"}],"lsn":"0000000000000000_0000000000000043"}
}

func ExampleFormatOffset() {
	a := frames.FormatOffset(0, 9)
	b := frames.FormatOffset(0, 10)
	hi, lo, err := frames.ParseOffset(b)
	fmt.Println(a, b, a < b)
	fmt.Println(hi, lo, err)
	// Output:
	// 0000000000000000_0000000000000009 0000000000000000_0000000000000010 true
	// 0 10 <nil>
}
