package gateway_test

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/syncgate/syncgate/frames"
	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/internal/gwtest"
	"github.com/syncgate/syncgate/storage"
)

// heldAnswerLog is a log whose appends commit as usual but whose answers
// wait until release is closed: the gateway sees its publishes pending.
type heldAnswerLog struct {
	*storage.DB
	release chan struct{}
	once    sync.Once
}

func (l *heldAnswerLog) AppendAsync(name string, req storage.AppendRequest, done func(storage.AppendResult, error)) {
	l.DB.AppendAsync(name, req, func(res storage.AppendResult, err error) {
		go func() {
			<-l.release
			done(res, err)
		}()
	})
}

func (l *heldAnswerLog) open() { l.once.Do(func() { close(l.release) }) }

// readerWaitsInProducer reports whether a session's reader is parked on
// a channel inside the producer (waiting for a pending outcome).
func readerWaitsInProducer() bool {
	buf := make([]byte, 16<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte("[chan receive")) && bytes.Contains(g, []byte("(*producer).")) &&
			bytes.Contains(g, []byte("(*session).readLoop")) {
			return true
		}
	}
	return false
}

// TestProducer_RetriesOfAPendingSeqAreBounded: retries of a publish still
// waiting for its commit (the same seq again, or its key under the next
// seqs) wait for its outcome without a goroutine each beyond a bound:
// past half the producer window of them, the session's reader waits for
// the outcome itself, as it does past that many pending publishes. Each
// such retry used to park a goroutine until the commit, so a client could
// pin as many as it could send while a commit was slow. Not parallel: it
// counts the process's goroutines.
func TestProducer_RetriesOfAPendingSeqAreBounded(t *testing.T) {
	var hl *heldAnswerLog
	_, srv := startWrappedNode(t, nil, func(db *storage.DB) gateway.StreamLog {
		hl = &heldAnswerLog{DB: db, release: make(chan struct{})}
		return hl
	})
	t.Cleanup(hl.open) // before the node stops (cleanups run last first)
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("app", 0)
	base := runtime.NumGoroutine()
	// Within the frame burst (2000) and the message size (64 KiB).
	const retries, perMessage = 1500, 300
	c.Send(&frames.Mutate{Key: "k0", Seq: 0, Name: "publish", Input: []byte(`{"topic":"chat:p","data":0}`)}) // its answer is held
	for m := range retries / perMessage {
		var msg strings.Builder
		for i := m * perMessage; i < (m+1)*perMessage; i++ {
			seq := 0
			if i%2 == 1 && i < 200 {
				seq = 1 + i/2 // its key under the next seqs (within the window): a retry too
			}
			if msg.Len() > 0 {
				msg.WriteByte('\n')
			}
			fmt.Fprintf(&msg, `{"type":"mutate","v":1,"key":"k0","seq":%d,"name":"publish","input":{"topic":"chat:p","data":0}}`, seq)
		}
		c.SendRaw(msg.String())
	}
	var piled bool
	gwtest.Eventually(t, gwtest.Timeout, "the reader waits, or the retries pile up", func() bool {
		piled = runtime.NumGoroutine() > base+retries/2
		return piled || readerWaitsInProducer()
	})
	if piled {
		t.Fatalf("%d goroutines for %d retries of a pending publish (%d before)", runtime.NumGoroutine(), retries, base)
	}
	hl.open()
	var lsn string
	for i := range retries + 1 {
		ack := gwtest.Expect[*frames.Ack](c)
		if ack.Ref != "k0" || ack.Error != nil || ack.LSN == nil || (lsn != "" && *ack.LSN != lsn) {
			t.Fatalf("ack %d: %+v %+v, want k0 at %q", i, ack, ack.Error, lsn)
		}
		lsn = *ack.LSN
	}
}
