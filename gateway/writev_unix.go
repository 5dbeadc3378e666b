//go:build darwin || linux || openbsd

package gateway

import (
	"net"
	"os"
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

// writevNow writes bufs to raw in one writev that does not wait: n is what
// the socket took, full reports that its buffer had no room for the rest.
func writevNow(raw syscall.RawConn, bufs [][]byte) (n int, full bool, err error) {
	var werr error
	err = raw.Write(func(fd uintptr) bool {
		for {
			n, werr = unix.Writev(int(fd), bufs)
			if werr != unix.EINTR {
				return true // one try: never wait for the socket here
			}
		}
	})
	n = max(n, 0)
	switch {
	case err != nil:
	case werr == unix.EAGAIN:
		full = true
	case werr != nil:
		err = os.NewSyscallError("writev", werr)
	}
	return n, full, err
}
