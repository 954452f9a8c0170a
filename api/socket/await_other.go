//go:build !linux

package socket

import (
	"errors"
	"syscall"
)

// awaitable tells whether awaitReadable waits: on Linux alone. Elsewhere a socket waits for its
// next message in gorilla/websocket's read, in the goroutine that served its last.
const awaitable = false

func awaitReadable(syscall.RawConn) error {
	return errors.New("socket: no wait on the connection on this system")
}
