package stream

import (
	"encoding/json"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/tablease/tablease/lease"
)

// sseWriter writes the events of one stream, each with a write deadline and flushed at once
// through an http.ResponseController; once a stream is taken over from net/http, as chunks
// straight to its connection (hijack.go).
type sseWriter struct {
	res     http.ResponseWriter      // nil once taken over
	rc      *http.ResponseController // nil once taken over
	conn    net.Conn                 // the connection once taken over
	broken  bool                     // a write failed: the response cannot be ended cleanly
	stalled bool                     // a write missed its deadline: the client stopped reading
	timeout time.Duration
	sent    *sentCounters
	buf     []byte // what the next flush writes; from sseBuffers, given back after the write
}

// sseBuffers keeps the buffers events are written from, so that an idle stream holds none.
var sseBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

func (w *sseWriter) init(res http.ResponseWriter, timeout time.Duration, sent *sentCounters) {
	// The controller is made on the innermost writer that wrappers (such as Echo's Response, whose
	// Flush swallows errors) unwrap to, so that Flush reports errors.
	inner := res
	for {
		u, ok := inner.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			break
		}
		inner = u.Unwrap()
	}
	w.res, w.rc, w.timeout, w.sent = res, http.NewResponseController(inner), timeout, sent
}

// begin sends the headers. The request's read deadline (http.Server.ReadTimeout) is lifted: it
// would otherwise end the stream when it passes.
func (w *sseWriter) begin() {
	_ = w.rc.SetReadDeadline(time.Time{})
	hdr := w.res.Header()
	hdr.Set("Content-Type", "text/event-stream")
	hdr.Set("Cache-Control", "no-cache, no-transform")
	hdr.Set("X-Accel-Buffering", "no")
	w.res.WriteHeader(http.StatusOK)
}

// grab makes sure buf is a buffer from the pool.
func (w *sseWriter) grab() {
	if w.buf == nil {
		w.buf = (*sseBuffers.Get().(*[]byte))[:0]
		if w.conn != nil {
			w.buf = w.buf[:chunkHead]
		}
	}
}

// flush writes buf with a deadline, flushes it, and gives buf back to the pool.
func (w *sseWriter) flush() error {
	var err error
	if w.conn != nil {
		err = w.writeChunk()
	} else {
		_ = w.rc.SetWriteDeadline(time.Now().Add(w.timeout)) // unsupported only by test recorders
		if _, err = w.res.Write(w.buf); err == nil {
			err = w.rc.Flush()
		}
	}
	if err != nil {
		w.broken = true
		w.stalled = writeEnd(err) == endWriteFailed
	}
	if cap(w.buf) <= 64<<10 { // a rare large event's buffer is left to the GC
		b := w.buf[:0]
		sseBuffers.Put(&b)
	}
	w.buf = nil
	return err
}

// end ends the response. net/http ends one it still serves once the handler returns: this gives it
// a fresh write deadline (the last one may have passed while the stream was idle). A stream taken
// over is ended by endChunked.
func (w *sseWriter) end() {
	switch {
	case w.conn != nil:
		w.endChunked()
	case w.rc != nil:
		_ = w.rc.SetWriteDeadline(time.Now().Add(w.timeout))
	}
}

// appendEvent appends one event to buf: its id (when not empty), its name and its data.
func (w *sseWriter) appendEvent(id, name string, data []byte) {
	w.grab()
	if id != "" {
		w.buf = append(w.buf, "id: "...)
		w.buf = append(w.buf, id...)
		w.buf = append(w.buf, '\n')
	}
	w.buf = append(w.buf, "event: "...)
	w.buf = append(w.buf, name...)
	w.buf = append(w.buf, "\ndata: "...)
	w.buf = append(w.buf, data...) // JSON from encoding/json holds no raw newline
	w.buf = append(w.buf, "\n\n"...)
}

// start writes what opens a watch: the snapshot, and the replay when the watch resumed, and then
// drops the watch's start (lease.Watch.DropStart), which an idle stream would otherwise hold. first
// adds the retry: field that opens a stream. It answers the id of the last event the client
// now has (the position of the snapshot, or the last replayed event).
func (w *sseWriter) start(views Views, watch *lease.Watch, tabID string, first bool) (string, error) {
	if first {
		w.grab()
		w.buf = append(w.buf, "retry: "...)
		w.buf = strconv.AppendInt(w.buf, streamRetry.Milliseconds(), 10)
		w.buf = append(w.buf, "\n\n"...)
	}
	data, err := views.Snapshot(watch, tabID)
	if err != nil {
		return "", err
	}
	id := watch.Position
	if watch.Resumed {
		id = "" // the replay carries the ids; the client's last id stays where it was until then
	}
	w.appendEvent(id, "snapshot", data)
	w.sent.snapshot.Inc()
	last := watch.Position
	for _, ev := range watch.Replay {
		data, err := views.Event(ev)
		if err != nil {
			return "", err
		}
		w.appendEvent(ev.ID, ev.Type.Stream(), data)
		w.sent.event(ev.Type.Stream())
		last = ev.ID
	}
	watch.DropStart()
	return last, w.flush()
}

func (w *sseWriter) event(views Views, ev lease.Event) error {
	data, err := views.Event(ev)
	if err != nil {
		return err
	}
	w.appendEvent(ev.ID, ev.Type.Stream(), data)
	w.sent.event(ev.Type.Stream())
	return w.flush()
}

type catalogEventJSON struct {
	Version string `json:"version"`
}

func (w *sseWriter) catalog(version string) error {
	data, err := json.Marshal(catalogEventJSON{Version: version})
	if err != nil {
		return err
	}
	w.appendEvent("", "catalog", data)
	w.sent.catalog.Inc()
	return w.flush()
}

func (w *sseWriter) comment(text string) error {
	w.grab()
	w.buf = append(w.buf, ": "...)
	w.buf = append(w.buf, text...)
	w.buf = append(w.buf, "\n\n"...)
	return w.flush()
}

type shutdownJSON struct {
	Reason  string `json:"reason"`
	RetryMs int64  `json:"retryMs"`
}

// The reasons of the final event.
const (
	reasonShutdown     = "the server is shutting down; reconnect"
	reasonCredential   = "the access token that opened the stream has expired (or its key was withdrawn); reconnect with a current one"
	reasonStore        = "the store does not serve this stream's calls (a Redis failover, or a primary that refuses writes); reconnect with Last-Event-ID"
	reasonResumeFailed = "the stream could not watch its session again; reconnect with Last-Event-ID"
)

// shutdown writes the final event of a stream that the server ends (its handler closes, its
// credential expired, or the store did not let it watch again: reason), with a short, jittered
// reconnection delay.
func (w *sseWriter) shutdown(reason string) error {
	retry := shutdownRetry + mrand.N(shutdownJitter)
	data, err := json.Marshal(shutdownJSON{Reason: reason, RetryMs: retry.Milliseconds()})
	if err != nil {
		return err
	}
	w.grab()
	w.buf = append(w.buf, "retry: "...)
	w.buf = strconv.AppendInt(w.buf, retry.Milliseconds(), 10)
	w.buf = append(w.buf, '\n')
	w.appendEvent("", "shutdown", data)
	w.sent.shutdown.Inc()
	return w.flush()
}
