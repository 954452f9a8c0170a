//go:build !linux

package stream

import (
	"log/slog"
	"net"
)

// watchHangup has the stream st told (newsGone) once the client of conn, its connection taken
// over, goes away: a goroutine of the stream's own reads conn (see hangup_linux.go for Linux).
func watchHangup(conn net.Conn, st *stream, _ *slog.Logger) { go watchClient(conn, st) }

// forgetHangup ends a watch: the goroutine ends with the connection.
func forgetHangup(uint64) {}
