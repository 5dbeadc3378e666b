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
const readBufferSize = 512

// hijackSizer hands websocket.Accept the hijacked connection with small
// buffers instead of net/http's 4 KiB reader and 4 KiB writer, which every
// idle session would otherwise hold for its lifetime: a readBufferSize
// reader, and a writeBufferSize writer over a corkConn (which keeps one
// syscall per message). It records the corkConn in *conn; the session corks
// it around each message and sets write deadlines on it.
type hijackSizer struct {
	http.ResponseWriter
	conn **corkConn
}

func (h hijackSizer) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(h.ResponseWriter).Hijack()
	if err != nil {
		return c, brw, err
	}
	cc := &corkConn{Conn: c}
	*h.conn = cc
	// net/http flushed the 101 response before handing over its writer,
	// so replacing the writer loses nothing.
	w := bufio.NewWriterSize(cc, writeBufferSize)
	n := brw.Reader.Buffered()
	if n > readBufferSize {
		// The client sent ahead a lot: keep net/http's reader.
		return cc, bufio.NewReadWriter(brw.Reader, w), nil
	}
	// Carry over bytes the client sent right behind its upgrade request:
	// they must be the first the new reader returns.
	if n == 0 {
		return cc, bufio.NewReadWriter(bufio.NewReaderSize(c, readBufferSize), w), nil
	}
	pending, _ := brw.Reader.Peek(n)
	r := bufio.NewReaderSize(io.MultiReader(bytes.NewReader(bytes.Clone(pending)), c), readBufferSize)
	if _, err := r.Peek(n); err != nil {
		return cc, bufio.NewReadWriter(brw.Reader, w), nil
	}
	return cc, bufio.NewReadWriter(r, w), nil
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (h hijackSizer) Unwrap() http.ResponseWriter { return h.ResponseWriter }
