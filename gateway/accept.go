package gateway

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
)

// readBufferSize is the size of a session's connection read buffer. Client
// frames are small; a larger message is read straight into its destination
// by bufio, so a small buffer costs idle memory, not throughput.
const readBufferSize = 1024

// hijackSizer hands websocket.Accept the hijacked connection with a
// readBufferSize read buffer instead of net/http's 4 KiB one, which every
// idle session would otherwise hold for its lifetime.
type hijackSizer struct{ http.ResponseWriter }

func (h hijackSizer) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(h.ResponseWriter).Hijack()
	if err != nil {
		return c, brw, err
	}
	n := brw.Reader.Buffered()
	if n > readBufferSize {
		return c, brw, nil // the client sent ahead a lot: keep net/http's buffer
	}
	// Carry over bytes the client sent right behind its upgrade request:
	// they must be the first the new reader returns.
	pending, _ := brw.Reader.Peek(n)
	r := bufio.NewReaderSize(io.MultiReader(bytes.NewReader(bytes.Clone(pending)), c), readBufferSize)
	if n > 0 {
		if _, err := r.Peek(n); err != nil {
			return c, brw, nil
		}
	}
	return c, bufio.NewReadWriter(r, brw.Writer), nil
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (h hijackSizer) Unwrap() http.ResponseWriter { return h.ResponseWriter }
