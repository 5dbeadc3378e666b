//go:build !(darwin || linux || openbsd)

package gateway

import (
	"net"
	"syscall"
)

// rawConnOf returns nil: on this system every write waits (writeLoop).
func rawConnOf(net.Conn) syscall.RawConn { return nil }

// writevNowLocked is never called when rawConnOf returns nil.
func (c *corkConn) writevNowLocked([][]byte) (int, bool, error) {
	panic("gateway: a write without waiting on a system without them")
}
