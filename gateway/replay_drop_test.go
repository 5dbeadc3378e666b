package gateway_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/syncgate/syncgate/frames"
	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/internal/gwtest"
	"github.com/syncgate/syncgate/storage"
)

// A resume dropped while its replay reads the log, before the subscribe
// was answered, still gets its answer (an ack and a snapshot at the
// cursor) before the drop's ack: every subscribe is answered, in order,
// so a client that matches answers to frames by sid (the Go client
// queues a waiter per frame) does not take the drop's ack for the
// add's and wait for the drop's forever, consuming every later frame
// for the sid (a re-add of it then never settles). The drop used to be
// the only answer.
func TestPersisted_DropBeforeTheResumeIsAnswered(t *testing.T) {
	t.Parallel()
	const topic = "chat:dropunanswered"
	var log *readGateLog
	db, srv := startWrappedNode(t, nil, func(db *storage.DB) gateway.StreamLog {
		log = &readGateLog{DB: db}
		return log
	})
	makeStream(t, db, topic)
	for i := 1; i <= 5; i++ {
		if _, err := db.Append(context.Background(), topic, storage.AppendRequest{Records: [][]byte{fmt.Appendf(nil, `{"n":%d}`, i)}}); err != nil {
			t.Fatal(err)
		}
	}
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("", 0)
	snap := c.Subscribe("live", topic)        // the tailer, and the log's digest
	read := log.gate(storage.FormatOffset(2)) // never released: only the drop ends it
	cursor := snap.Cursor
	resumeAt(c, "s", topic, cursor, 2)
	waitClosed(t, "the replay's read", read.entered)
	c.Send(&frames.Subscribe{Op: frames.OpDrop, SID: "s", Target: frames.Target{Kind: frames.TargetTopic, Topic: topic}})

	if ack := gwtest.Expect[*frames.Ack](c); ack.Ref != "s" || ack.Error != nil {
		t.Fatalf("the subscribe's answer: ack %+v %+v", ack, ack.Error)
	}
	if s := gwtest.Expect[*frames.Snapshot](c); s.SID != "s" || s.Cursor.LSN != storage.FormatOffset(2) || s.Cursor.Digest != cursor.Digest || len(s.Rows) != 0 {
		t.Fatalf("the subscribe's snapshot %+v, want none of its rows at its cursor", s)
	}
	if ack := gwtest.Expect[*frames.Ack](c); ack.Ref != "s" || ack.Error != nil {
		t.Fatalf("the drop's answer: ack %+v %+v", ack, ack.Error)
	}
	// Nothing more for s: the next frames answer a re-add of it.
	if s := c.Subscribe("s", topic); s.Cursor.LSN != storage.FormatOffset(5) {
		t.Fatalf("re-added: snapshot at %s", s.Cursor.LSN)
	}
}
