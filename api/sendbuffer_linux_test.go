package api

import (
	"net"
	"syscall"
	"testing"
	"time"
)

// The socket send buffer of a stream taken over is capped at 128 KiB (as Linux reports it: twice
// what was set) on the listener cmd/tablease serves on, whose connections ProtocolErrors wraps.
// The test's listener gives every connection a larger buffer first, as Linux's autotuning would
// for a stream with events waiting.
func TestAStreamsSendBufferIsCappedOnTheServedListener(t *testing.T) {
	h := newHarness(t)
	accepted := make(chan *net.TCPConn, 1)
	ts := h.serveOn(func(ln net.Listener) net.Listener { return largeBufferListener{ln, accepted} })
	c := mustStream(t, ts, eventsPath("doc-1", "tabId=t"), h.token("alice"), nil)
	c.expect("snapshot", nil)
	var conn *net.TCPConn
	select {
	case conn = <-accepted:
	case <-time.After(waitFor):
		t.Fatal("no connection accepted")
	}

	const limit = 128 << 10
	deadline := time.Now().Add(waitFor)
	for {
		size := sendBufferOf(t, conn)
		if size <= limit {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the send buffer of the stream's socket is %d bytes, want at most %d", size, limit)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// largeBufferListener gives accepted connections a send buffer of 1 MiB and sends them on
// accepted (while it has room).
type largeBufferListener struct {
	net.Listener
	accepted chan *net.TCPConn
}

func (l largeBufferListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(1 << 20)
		select {
		case l.accepted <- tc:
		default:
		}
	}
	return c, err
}

// sendBufferOf is SO_SNDBUF of conn's socket.
func sendBufferOf(t *testing.T, conn *net.TCPConn) int {
	t.Helper()
	raw, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var size int
	var opErr error
	if err := raw.Control(func(fd uintptr) {
		size, opErr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF)
	}); err != nil {
		t.Fatal(err)
	}
	if opErr != nil {
		t.Fatal(opErr)
	}
	return size
}
