//go:build !(darwin || linux || openbsd)

package gateway

import (
	"net"
	"syscall"
)

// rawConnOf returns nil: on this system every write waits (writeLoop).
func rawConnOf(net.Conn) syscall.RawConn { return nil }

// writevNow is never called when rawConnOf returns nil.
func writevNow(syscall.RawConn, [][]byte) (int, bool, error) {
	panic("gateway: writevNow without a raw connection")
}
