package netconn

import (
	"crypto/tls"
	"net"
	"testing"
)

type wrapper struct{ net.Conn }

func (w wrapper) NetConn() net.Conn { return w.Conn }

// TestTCPIsFoundThroughWrappers: the TCP connection is found under wrappers that answer NetConn,
// and a crypto/tls.Conn among them is told.
func TestTCPIsFoundThroughWrappers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tc := c.(*net.TCPConn)
	for _, tt := range []struct {
		name       string
		conn       net.Conn
		want       *net.TCPConn
		readsAhead bool
	}{
		{"itself", tc, tc, false},
		{"wrapped twice", wrapper{wrapper{tc}}, tc, false},
		{"under TLS", wrapper{tls.Server(tc, &tls.Config{})}, tc, true},
		{"none", wrapper{&net.UnixConn{}}, nil, false},
	} {
		got, ahead := TCP(tt.conn)
		if got != tt.want || ahead != tt.readsAhead {
			t.Errorf("%s: TCP answered %p, %v; want %p, %v", tt.name, got, ahead, tt.want, tt.readsAhead)
		}
	}
}
