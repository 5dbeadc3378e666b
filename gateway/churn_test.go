package gateway_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/syncgate/syncgate/frames"
	"github.com/syncgate/syncgate/gateway"
	"github.com/syncgate/syncgate/internal/gwtest"
	"github.com/syncgate/syncgate/storage"
)

// publishN publishes {"i":0} .. {"i":n-1} to topic from a connection of
// its own, pipelined in windows, on a goroutine; done is closed after the
// last ack (or the first failure, sent on errs).
func publishN(t *testing.T, url, topic string, n int) (done chan struct{}, errs chan error) {
	t.Helper()
	return publishNAs(t, url, topic, n, "churn-writer", nil)
}

// publishNAs is publishN as client clientID, stopping early once stop is
// closed.
func publishNAs(t *testing.T, url, topic string, n int, clientID string, stop chan struct{}) (done chan struct{}, errs chan error) {
	t.Helper()
	pub := gwtest.Dial(t, url, nil)
	pub.Hello(clientID, 0)
	done, errs = make(chan struct{}), make(chan error, 1)
	t.Cleanup(func() { // before Dial's: a publisher still reading ends with its connection
		_ = pub.C.CloseNow()
		<-done
	})
	go func() {
		defer close(done)
		const window = 32
		for i := 0; i < n; i += window {
			select {
			case <-stop:
				return
			default:
			}
			m := min(window, n-i)
			for j := range m {
				seq := i + j
				err := pub.SendErr(&frames.Mutate{Key: fmt.Sprint("k", seq), Seq: int64(seq), Name: "publish",
					Input: []byte(fmt.Sprintf(`{"topic":%q,"data":{"i":%d}}`, topic, seq))})
				if err != nil {
					errs <- err
					return
				}
			}
			for got := 0; got < m; {
				f, err := pub.NextErr(gwtest.Timeout)
				if err != nil {
					errs <- err
					return
				}
				if a, ok := f.(*frames.Ack); ok {
					if a.Error != nil {
						errs <- fmt.Errorf("publish ack %+v", a.Error)
						return
					}
					got++
				}
			}
		}
	}()
	return done, errs
}

// churnIndex returns the i of a row publishN published.
func churnIndex(t *testing.T, op frames.PatchOp) int {
	t.Helper()
	var row struct {
		Data struct {
			I *int `json:"i"`
		} `json:"data"`
	}
	if err := json.Unmarshal(op.Row, &row); err != nil || row.Data.I == nil {
		t.Fatalf("row %s: %v", op.Row, err)
	}
	return *row.Data.I
}

// A subscription dropped and resumed from its last patch over and over
// while a publisher writes gets every record exactly once, in order, and
// nothing for its sid between a drop's ack and the next subscribe's ack.
func TestPersisted_DropAndResumeChurn(t *testing.T) {
	t.Parallel()
	const topic, total = "chat:churn", 3000
	n := startPersistNodeWith(t, t.TempDir(), nil, func(c *gateway.Config) { c.FrameRate = -1 })
	c := gwtest.Dial(t, n.url, nil)
	c.Hello("", 0)
	// Make the stream first, so the digest is known.
	snap := c.Subscribe("a", topic)
	done, errs := publishN(t, n.url, topic, total)
	next, lsn, digest := 0, snap.Cursor.LSN, snap.Cursor.Digest
	live := true // between a subscribe's ack and its drop's ack
	dropAfter := 1
	seen := 0
	for next < total {
		f, err := c.NextErr(gwtest.Timeout)
		if err != nil {
			pubDone := false
			select {
			case <-done:
				pubDone = true
			default:
			}
			var perr error
			select {
			case perr = <-errs:
			default:
			}
			t.Fatalf("next frame: %v; next %d lsn %s live %v seen %d dropAfter %d; publisher done %v err %v", err, next, lsn, live, seen, dropAfter, pubDone, perr)
		}
		switch f := f.(type) {
		case *frames.Snapshot:
			if f.SID != "a" {
				t.Fatalf("snapshot %+v", f)
			}
			if f.Cursor.Digest != "" {
				digest = f.Cursor.Digest
			}
			if f.Cursor.LSN != lsn && !(f.Cursor.LSN == storage.ZeroOffset && next == 0) {
				t.Fatalf("snapshot at %s, want %s", f.Cursor.LSN, lsn)
			}
		case *frames.Patch:
			if !live {
				t.Fatalf("patch for %s after its drop was acked: %+v", f.SID, f)
			}
			for _, op := range f.Patches {
				if i := churnIndex(t, op); i != next {
					t.Fatalf("record %d (lsn %s), want %d (after %s)", i, op.LSN, next, lsn)
				}
				if op.LSN <= lsn {
					t.Fatalf("lsn %s not after %s", op.LSN, lsn)
				}
				next++
				lsn = op.LSN
				seen++
			}
			if seen >= dropAfter {
				c.Send(&frames.Subscribe{Op: frames.OpDrop, SID: "a", Target: frames.Target{Kind: frames.TargetTopic, Topic: topic}})
				seen, dropAfter = 0, dropAfter%17+1
				live = false // patches may still come before the ack: checked below
				awaitDropAck(t, c, "a", func(op frames.PatchOp) {
					if i := churnIndex(t, op); i != next {
						t.Fatalf("record %d, want %d", i, next)
					}
					next++
					lsn = op.LSN
				})
				c.Send(&frames.Subscribe{Op: frames.OpAdd, SID: "a", Target: frames.Target{Kind: frames.TargetTopic, Topic: topic,
					Cursor: &frames.Cursor{QID: "topic:" + topic, LSN: lsn, Digest: digest, IDs: []string{}, At: 1}}})
			}
		case *frames.Ack:
			if f.Ref != "a" || f.Error != nil {
				t.Fatalf("ack %+v %+v", f, f.Error)
			}
			live = true
		default:
			t.Fatalf("unexpected %T %+v", f, f)
		}
	}
	<-done
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
}

// An ephemeral topic's subscription dropped and added again with the same
// sid while several publishers write: no patch for the sid between a
// drop's ack and the next add's ack, and after each snapshot only patches
// with greater offsets, increasing.
func TestGateway_DropAndReaddChurn(t *testing.T) {
	t.Parallel()
	const topic, publishers, per = "room:churn", 3, 1 << 30
	srv := newTestServer(t, gateway.Config{FrameRate: -1})
	c := gwtest.Dial(t, srv.url, nil)
	c.Hello("", 0)
	snap := c.Subscribe("a", topic)
	stop := make(chan struct{})
	var dones []chan struct{}
	var errss []chan error
	for p := range publishers {
		done, errs := publishNAs(t, srv.url, topic, per, fmt.Sprint("w", p), stop)
		dones = append(dones, done)
		errss = append(errss, errs)
	}
	lsn := snap.Cursor.LSN
	live, seen, dropAfter, rounds := true, 0, 1, 0
	for rounds < 100 {
		switch f := c.Next().(type) {
		case *frames.Snapshot:
			lsn = f.Cursor.LSN
		case *frames.Patch:
			if !live {
				t.Fatalf("patch after the drop's ack: %+v", f)
			}
			for _, op := range f.Patches {
				if op.LSN <= lsn {
					t.Fatalf("lsn %s not after %s", op.LSN, lsn)
				}
				lsn = op.LSN
			}
			if seen++; seen >= dropAfter {
				seen, dropAfter = 0, dropAfter%7+1
				rounds++
				c.Send(&frames.Subscribe{Op: frames.OpDrop, SID: "a", Target: frames.Target{Kind: frames.TargetTopic, Topic: topic}})
				awaitDropAck(t, c, "a", func(op frames.PatchOp) {
					if op.LSN <= lsn {
						t.Fatalf("lsn %s not after %s", op.LSN, lsn)
					}
					lsn = op.LSN
				})
				live = false
				c.Send(&frames.Subscribe{Op: frames.OpAdd, SID: "a", Target: frames.Target{Kind: frames.TargetTopic, Topic: topic}})
			}
		case *frames.Ack:
			if f.Ref != "a" || f.Error != nil {
				t.Fatalf("ack %+v %+v", f, f.Error)
			}
			live = true
		default:
			t.Fatalf("unexpected %T %+v", f, f)
		}
	}
	close(stop)
	for i, d := range dones {
		<-d
		select {
		case err := <-errss[i]:
			t.Fatal(err)
		default:
		}
	}
}

// awaitDropAck reads c until the ack of sid's drop, handing each patch
// op read before it (patches may precede the ack) to op.
func awaitDropAck(t *testing.T, c *gwtest.Conn, sid string, op func(frames.PatchOp)) {
	t.Helper()
	for {
		g := c.Next()
		if a, ok := g.(*frames.Ack); ok && a.Ref == sid {
			if a.Error != nil {
				t.Fatalf("drop: %+v", a.Error)
			}
			return
		}
		p, ok := g.(*frames.Patch)
		if !ok {
			t.Fatalf("before the drop's ack: %T %+v", g, g)
		}
		for _, o := range p.Patches {
			op(o)
		}
	}
}
