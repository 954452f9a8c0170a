// Package netconn finds the TCP connection under a connection net/http hands over, through the
// wrappers it comes in that answer NetConn (crypto/tls.Conn, the listener wrapper of package api,
// the socket's of package api/socket): for the event streams and the lease sockets, which set
// its options and wait on it.
package netconn

import (
	"crypto/tls"
	"net"
)

// TCP answers the TCP connection under conn: conn itself, or what the wrappers it comes in
// answer to NetConn; nil when there is none. readsAhead reports whether one of those wrappers may
// hold bytes it read from the TCP connection and did not hand on yet (crypto/tls.Conn keeps the
// records it decrypted): whether the TCP connection is readable then tells nothing of them.
func TCP(conn net.Conn) (tc *net.TCPConn, readsAhead bool) {
	for {
		switch c := conn.(type) {
		case *net.TCPConn:
			return c, readsAhead
		case *tls.Conn:
			readsAhead = true
			conn = c.NetConn()
		case interface{ NetConn() net.Conn }:
			conn = c.NetConn()
		default:
			return nil, readsAhead
		}
	}
}
