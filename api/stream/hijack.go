package stream

import (
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/tablease/tablease/internal/netconn"
)

// Taking an HTTP/1.1 stream over from net/http.
//
// Once its headers and snapshot are sent, the connection of an HTTP/1.1 stream is hijacked from
// net/http, whose handler returns; each event is written as a chunk of the body straight to the
// connection (by the goroutine that runs the stream while it has something to do, see
// streamConn), and the connection is watched for the client's going (watchHangup: on Linux one
// goroutine of the process for every stream, hangup_linux.go; elsewhere a goroutine per stream,
// watchClient). An idle stream then holds neither net/http's buffers (4 KiB to read, 4 + 2 KiB to
// write) nor a goroutine and the handler's frames on its stack, nor the request: it costs a
// fraction of what it costs served by its handler (BenchmarkIdleStreams in package api measures
// both).
// Everything else about the stream is the same either way: the default path (writer.go, the
// handler's goroutine waiting for the stream to end) serves HTTP/2, which cannot be hijacked, and
// HTTP/1.0, whose response net/http does not chunk.
//
// http.Server.Shutdown does not know the connections taken over: Handler.Close ends them.

// chunkHead is the room kept at the start of buf, once taken over, for the size line of the
// chunk: at most 16 hex digits and CRLF.
const chunkHead = 18

// lastChunk ends a chunked body.
var lastChunk = []byte("0\r\n\r\n")

// maxStrayBytes bounds what a client may send on the connection of its stream after its request;
// beyond, the stream ends.
const maxStrayBytes = 4 << 10

// sendBuffer is the socket send buffer of a stream taken over (Linux doubles it, and lets an
// unset one grow to tcp_wmem's maximum, 4 MiB by default): a client that stops reading fills it
// with some 128 KiB of events, and the next write then waits out its deadline and ends the stream,
// instead of the kernel holding megabytes for it. A snapshot and a full replay fit.
const sendBuffer = 64 << 10

// handOver takes the connection of a stream that has begun over from net/http; it answers false,
// and does nothing, when the stream stays with net/http.
//
// Only HTTP/1.1 is taken over: HTTP/2 cannot be, and net/http does not chunk an HTTP/1.0
// response, whereas the headers already sent announce a chunked body on HTTP/1.1.
func (sc *streamConn) handOver(r *http.Request) bool {
	if sc.w == nil || r.Method != http.MethodGet || r.ProtoMajor != 1 || r.ProtoMinor < 1 {
		return false
	}
	// Hijack flushes what net/http buffered. Its reader and writer are dropped: a client sends
	// nothing after its request, and chunks go to the connection unbuffered.
	conn, _, err := sc.sse.rc.Hijack()
	if err != nil {
		return false // http.ErrNotSupported
	}
	// From now on watchClient tells when the client goes away; unlink would keep the request's
	// context, which net/http ends when the handler returns.
	sc.unlink()
	sc.unlink = nil
	if tc, _ := netconn.TCP(conn); tc != nil {
		_ = tc.SetWriteBuffer(sendBuffer)
	}
	sc.sse.res, sc.sse.rc, sc.sse.conn = nil, nil, conn
	sc.h.mu.Lock()
	sc.st.closer = conn
	sc.h.mu.Unlock()
	watchHangup(conn, &sc.st, sc.h.log)
	return true
}

// watchClient reads conn, the connection of the stream st that was taken over, until the client
// closes it (or the stream does), and then tells st that its client went away: at once after a
// clean disconnect. What a client sends after its request is dropped. It is the goroutine of one
// stream where the process's watch of every stream cannot be had (watchHangup).
func watchClient(conn net.Conn, st *stream) {
	defer st.tell(newsGone)
	buf := make([]byte, 16)
	for n := 0; n < maxStrayBytes; {
		k, err := conn.Read(buf)
		if err != nil {
			return
		}
		n += k
	}
}

// writeChunk writes buf, after its chunkHead, as one chunk of the body, in one write.
func (w *sseWriter) writeChunk() error {
	var head [chunkHead]byte
	h := strconv.AppendUint(head[:0], uint64(len(w.buf)-chunkHead), 16)
	h = append(h, '\r', '\n')
	from := chunkHead - len(h)
	copy(w.buf[from:], h)
	w.buf = append(w.buf, '\r', '\n')
	_ = w.conn.SetWriteDeadline(time.Now().Add(w.timeout))
	_, err := w.conn.Write(w.buf[from:])
	return err
}

// endChunked ends the body of a stream taken over with its last chunk, unless a write failed,
// and closes its connection. When a write missed its deadline (the client stopped reading), the
// close is a reset (SO_LINGER 0): the kernel drops at once the bytes it holds for the client,
// instead of keeping them, and the socket, for as long as it tries to deliver them through a
// window the client keeps shut (minutes), outside the limits of the streams.
func (w *sseWriter) endChunked() {
	if !w.broken {
		_ = w.conn.SetWriteDeadline(time.Now().Add(w.timeout))
		if _, err := w.conn.Write(lastChunk); err != nil {
			w.stalled = writeEnd(err) == endWriteFailed
		}
	}
	if tc, _ := netconn.TCP(w.conn); w.stalled && tc != nil {
		_ = tc.SetLinger(0)
	}
	_ = w.conn.Close()
}
