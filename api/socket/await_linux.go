package socket

import (
	"errors"
	"syscall"
)

// awaitable tells whether awaitReadable waits: it does on Linux.
const awaitable = true

// awaitReadable waits until the connection raw has something to read (a frame, its end, or an
// error: the read that follows tells which), reading nothing, or until its read deadline passes
// (an error that is a timeout, as those of net.Conn's reads). It looks first (MSG_PEEK), as Go's
// poller is to be asked to wait only once a read found nothing; most often it finds nothing, and
// the look is the read that would have told so. A wake-up of the poller counts as readable: at
// worst, gorilla/websocket's read then waits as it would have.
func awaitReadable(raw syscall.RawConn) error {
	var b [1]byte
	looked := false
	return raw.Read(func(fd uintptr) bool {
		if looked {
			return true
		}
		for {
			_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			switch {
			case errors.Is(err, syscall.EINTR):
				continue
			case errors.Is(err, syscall.EAGAIN):
				looked = true
				return false
			}
			return true
		}
	})
}
