// Package gwtest holds test helpers for talking to a gateway over a real
// WebSocket at the frame level: raw sends (for malformed input), frame-by-
// frame reads that undo the server's batching, and close-code checks.
package gwtest

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/syncgate/syncgate/frames"
)

// Timeout bounds every wait in this package.
const Timeout = 10 * time.Second

// Conn is a raw protocol connection for tests. It is not safe for
// concurrent use.
type Conn struct {
	t       testing.TB
	C       *websocket.Conn
	pending [][]byte       // frames of the last message not yet returned
	held    []frames.Frame // frames read past while waiting for an ack
	// Messages counts WebSocket messages read; Frames counts frames.
	Messages, Frames int
	// MaxPerMessage is the most frames seen in one message.
	MaxPerMessage int
}

// WSURL turns an httptest server URL into its WebSocket endpoint.
func WSURL(httpURL string) string {
	return "ws" + strings.TrimPrefix(httpURL, "http") + "/v1/ws"
}

// Dial opens a connection to url; it is closed at the end of the test.
func Dial(t testing.TB, url string, hdr http.Header) *Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	c, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: hdr})
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	c.SetReadLimit(8 << 20)
	t.Cleanup(func() { _ = c.CloseNow() })
	return &Conn{t: t, C: c}
}

// SendRaw writes msg as one text message.
func (c *Conn) SendRaw(msg string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	if err := c.C.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// Send encodes f and writes it as one message.
func (c *Conn) Send(f frames.Frame) {
	c.t.Helper()
	b, err := frames.Encode(f)
	if err != nil {
		c.t.Fatalf("encode: %v", err)
	}
	c.SendRaw(string(b))
}

// SendErr is Send for goroutines other than the test's: it returns the
// error instead of failing the test (t.Fatal must not be called from
// them).
func (c *Conn) SendErr(f frames.Frame) error {
	b, err := frames.Encode(f)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	return c.C.Write(ctx, websocket.MessageText, b)
}

// Next returns the next frame, failing the test after Timeout.
func (c *Conn) Next() frames.Frame {
	c.t.Helper()
	f, err := c.NextErr(Timeout)
	if err != nil {
		c.t.Fatalf("next frame: %v", err)
	}
	return f
}

// Peek returns the frame Next would return, and leaves it to Next.
func (c *Conn) Peek() frames.Frame {
	c.t.Helper()
	f := c.Next()
	c.held = append([]frames.Frame{f}, c.held...)
	return f
}

// NextErr returns the next frame or the read error.
func (c *Conn) NextErr(timeout time.Duration) (frames.Frame, error) {
	if len(c.held) > 0 {
		f := c.held[0]
		c.held = c.held[1:]
		return f, nil
	}
	for len(c.pending) == 0 {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		_, msg, err := c.C.Read(ctx)
		cancel()
		if err != nil {
			return nil, err
		}
		c.Messages++
		n := 0
		frames.Split(msg, func(line []byte) bool {
			c.pending = append(c.pending, bytes.Clone(line))
			n++
			return true
		})
		c.MaxPerMessage = max(c.MaxPerMessage, n)
	}
	line := c.pending[0]
	c.pending = c.pending[1:]
	c.Frames++
	return frames.Decode(line)
}

// Hello sends a client hello and returns the server's reply.
func (c *Conn) Hello(clientID string, epoch int64) *frames.Hello {
	c.t.Helper()
	c.Send(&frames.Hello{BuildID: "test", Resume: []frames.Cursor{}, ClientID: clientID, Epoch: epoch})
	return Expect[*frames.Hello](c)
}

// Subscribe adds a topic subscription and checks its ack and snapshot.
func (c *Conn) Subscribe(sid, topic string) *frames.Snapshot {
	c.t.Helper()
	c.Send(&frames.Subscribe{Op: frames.OpAdd, SID: sid, Target: frames.Target{Kind: frames.TargetTopic, Topic: topic}})
	ack := Expect[*frames.Ack](c)
	if ack.Ref != sid || ack.Error != nil {
		c.t.Fatalf("subscribe %s: ack %+v, error %+v", sid, ack, ack.Error)
	}
	return Expect[*frames.Snapshot](c)
}

// Publish sends a publish mutate and returns its ack. Frames that arrive
// before the ack (such as the patch of the publisher's own subscription)
// are kept for the following Next calls, in order.
func (c *Conn) Publish(key string, seq int64, topic, data string) *frames.Ack {
	c.t.Helper()
	c.Send(&frames.Mutate{Key: key, Seq: seq, Name: "publish",
		Input: []byte(`{"topic":` + strQuote(topic) + `,"data":` + data + `}`)})
	return c.AwaitAck(key)
}

// AwaitAck reads until the ack for ref, holding other frames for Next.
func (c *Conn) AwaitAck(ref string) *frames.Ack {
	c.t.Helper()
	held := c.held
	c.held = nil
	defer func() { c.held = append(held, c.held...) }()
	for {
		f := c.Next()
		if ack, ok := f.(*frames.Ack); ok && ack.Ref == ref {
			return ack
		}
		held = append(held, f)
	}
}

// Expect reads the next frame and fails unless it is a T.
func Expect[T frames.Frame](c *Conn) T {
	c.t.Helper()
	f := c.Next()
	v, ok := f.(T)
	if !ok {
		var zero T
		c.t.Fatalf("want %T, got %T %+v", zero, f, f)
	}
	return v
}

// ExpectClose reads until the connection ends and checks the close code.
func (c *Conn) ExpectClose(want websocket.StatusCode) {
	c.t.Helper()
	deadline := time.Now().Add(Timeout)
	for time.Now().Before(deadline) {
		_, err := c.NextErr(time.Until(deadline))
		if err == nil {
			continue
		}
		var ce websocket.CloseError
		if !errors.As(err, &ce) {
			c.t.Fatalf("want close %d, got error %v", want, err)
		}
		if ce.Code != want {
			c.t.Fatalf("want close %d, got %d %q", want, ce.Code, ce.Reason)
		}
		return
	}
	c.t.Fatalf("want close %d: connection still open after %v", want, Timeout)
}

func strQuote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		if r == '"' || r == '\\' {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	b.WriteByte('"')
	return b.String()
}

// Eventually polls cond every few milliseconds until it holds, failing the
// test with msg after timeout.
func Eventually(t testing.TB, timeout time.Duration, msg string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(timeout)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("%s: not within %v", msg, timeout)
		}
	}
}

// Close ends the connection with a normal closure and waits for the
// server's close frame.
func (c *Conn) Close() {
	_ = c.C.Close(websocket.StatusNormalClosure, "")
}
