//go:build darwin || linux || openbsd

package gateway

import (
	"net"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// rawConnOf returns the raw connection of a TCP or Unix socket, and nil
// for anything else: a TLS connection, or a wrapper (whose own Write a
// write to the file descriptor would bypass).
func rawConnOf(c net.Conn) syscall.RawConn {
	var sc syscall.Conn
	switch c := c.(type) {
	case *net.TCPConn:
		sc = c
	case *net.UnixConn:
		sc = c
	default:
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return raw
}

// rawWritev is one writev that does not wait, as a function RawConn.Write
// can call. They are pooled so that a write allocates no closure and its
// variables, and an idle connection holds none.
type rawWritev struct {
	bufs [][]byte
	n    int
	err  error
	fn   func(fd uintptr) bool
}

var rawWritevPool = sync.Pool{New: func() any { return newRawWritev() }}

func newRawWritev() *rawWritev {
	w := &rawWritev{}
	w.fn = func(fd uintptr) bool {
		for {
			w.n, w.err = unix.Writev(int(fd), w.bufs)
			if w.err != unix.EINTR {
				return true // one try: never wait for the socket here
			}
		}
	}
	return w
}

// writevNowLocked writes bufs to the socket in one writev that does not
// wait: n is what the socket took, full reports that its buffer had no room
// for the rest.
func (c *corkConn) writevNowLocked(bufs [][]byte) (n int, full bool, err error) {
	w := rawWritevPool.Get().(*rawWritev)
	w.bufs = bufs
	err = c.raw.Write(w.fn)
	n, werr := max(w.n, 0), w.err
	w.bufs, w.n, w.err = nil, 0, nil
	rawWritevPool.Put(w)
	switch {
	case err != nil:
	case werr == unix.EAGAIN:
		full = true
	case werr != nil:
		err = os.NewSyscallError("writev", werr)
	}
	return n, full, err
}
