package stream

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/tablease/tablease/lease"
)

// Request is one stream request, authenticated and decoded.
type Request struct {
	Key lease.Key
	// Tab is the stream's tab, listed with its label and hidden flag when Listed.
	Tab lease.Tab
	// After is the id of the last event the client saw (a valid lease.EventID), or empty.
	After string
	// Listed makes the stream join the presence list with Tab, refresh its entry every third of
	// the time to live the engine answers, and leave when it ends.
	Listed bool
	// RequestID names the request in the log.
	RequestID string
}

// Serve serves the stream req on w: it admits the stream, lists its tab (when req.Listed), starts
// the watch, and sends the headers, the snapshot and the replay, then every event until the client
// goes away, a write fails, the watch ends or the handler closes. Until the headers are sent it
// answers errors: ErrClosing, *LimitError, or the engine's (lease.ErrUnavailable, …); then nil.
//
// An HTTP/1.1 stream may be taken over from net/http once it has begun (see hijack.go): Serve
// then returns at once and the stream goes on in a goroutine of its own.
func (h *Handler) Serve(w http.ResponseWriter, r *http.Request, req Request) error {
	sc, err := h.openStream(w, r, req)
	if err != nil {
		return err
	}
	if sc.handOver(r) {
		return nil
	}
	defer sc.close()
	sc.run()
	return nil // once the stream has begun, nothing else can be answered
}

// streamConn is one open event stream. Only the goroutine serving the stream touches it.
//
// An idle stream waits in wait, whose frame is small, with nothing else on its goroutine's stack
// but run's and its caller's: the stack then shrinks at the next GCs (see BenchmarkIdleStreams in
// package api). What it waits for is kept down to three channels (the watch, the stream's wake and
// one timer), each costing a sudog while it waits.
type streamConn struct {
	h     *Handler
	st    *stream
	reqID string
	key   lease.Key
	tab   lease.Tab
	conn  string        // the presence connection id; empty when the stream is not listed
	ttl   time.Duration // of the presence entry, as the engine last answered
	w     *lease.Watch  // replaced when the stream resubscribes
	sse   sseWriter
	last  string // the id of the last event the client has

	// unlink stops telling the stream that its client went away when the request's context ends
	// (net/http ends it when the handler returns, which a stream taken over outlives).
	unlink func() bool
	// timer fires at the earlier of keepaliveAt and refreshAt (zero when not listed).
	timer       *time.Timer
	keepaliveAt time.Time
	refreshAt   time.Time
	// ev is the event wait received, until step has written it.
	ev lease.Event
}

// openStream admits the stream, lists its tab (when req.Listed) and starts the watch, then sends
// the headers, the snapshot and the replay. Until the headers are sent it answers errors.
func (h *Handler) openStream(w http.ResponseWriter, r *http.Request, req Request) (*streamConn, error) {
	st, err := h.admit(req.Key.User)
	if err != nil {
		return nil, err
	}
	ctx := r.Context()
	sc := &streamConn{h: h, st: st, reqID: req.RequestID, key: req.Key, tab: req.Tab}
	sc.unlink = context.AfterFunc(ctx, func() { st.tell(newsGone) })
	if req.Listed {
		if err := sc.join(ctx); err != nil {
			sc.close()
			return nil, err
		}
	}
	// The watch outlives the request when the stream is taken over: close ends it.
	if sc.w, err = h.feed.Watch(context.Background(), req.Key, req.After); err != nil {
		h.storeError("watch", err)
		sc.close()
		return nil, err
	}
	sc.sse.init(w, h.opts.WriteTimeout, h.sent)
	sc.sse.begin()
	if sc.last, err = sc.sse.start(h.views, sc.w, req.Tab.TabID, true); err != nil {
		sc.w.Close()
		sc.w = nil // the client is gone: run ends at once
	}
	return sc, nil
}

// join lists the stream's tab in the presence list. A stream that did not join (sc.conn empty)
// never refreshes nor leaves.
func (sc *streamConn) join(ctx context.Context) error {
	sc.conn = newConnID()
	ctx, cancel := context.WithTimeout(ctx, presenceCallTimeout)
	defer cancel()
	ttl, err := sc.h.presence.Join(ctx, sc.key, sc.conn, sc.tab)
	if err != nil {
		sc.h.storeError("join", err)
		if !errors.Is(err, lease.ErrInvalid) {
			// A Join that timed out may still be applied when the store comes back (Redis runs
			// the commands it had queued while paused): the tab would be listed, by a stream
			// refused with 503, until its entry expires. Take it off once the store answers.
			sc.h.leaveLater(sc.key, sc.conn, sc.tab.TabID)
		}
		sc.conn = ""
		return err
	}
	sc.ttl = ttl
	return nil
}

// leaveLater removes the presence entry of conn, which a failed Join may have left or may still
// leave, trying again until the store answers, for at most leaveLaterFor (past which the entry has
// expired by itself). It does not hold up Close: the entry would expire anyway.
func (h *Handler) leaveLater(key lease.Key, conn, tabID string) {
	go func() {
		delay := presenceRetry / 4
		deadline := time.Now().Add(leaveLaterFor)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), presenceCallTimeout)
			err := h.presence.Leave(ctx, key, conn, tabID)
			cancel()
			if err == nil || !errors.Is(err, lease.ErrUnavailable) || time.Now().Add(delay).After(deadline) {
				if err != nil {
					h.log.Info("a tab whose stream was refused may stay listed until its entry expires",
						slog.String("tab_id", tabID), slog.String("error", err.Error()))
				}
				return
			}
			time.Sleep(delay) // a retry's backoff, not a synchronisation
			delay = min(2*delay, 4*presenceRetry)
		}
	}()
}

// refresh joins again, and answers when to refresh next: a third of the TTL, or sooner after a
// failure.
func (sc *streamConn) refresh() time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), presenceCallTimeout)
	defer cancel()
	ttl, err := sc.h.presence.Join(ctx, sc.key, sc.conn, sc.tab)
	if err != nil {
		sc.h.storeError("join", err)
		return min(presenceRetry, RefreshAfter(sc.ttl))
	}
	sc.ttl = ttl
	return RefreshAfter(ttl)
}

// close ends the watch, ends the response (closing the connection of a stream taken over), takes
// the tab off the presence list and gives the stream's place back.
func (sc *streamConn) close() {
	if sc.w != nil {
		sc.w.Close()
	}
	sc.sse.end()
	if sc.conn != "" {
		ctx, cancel := context.WithTimeout(context.Background(), presenceCallTimeout)
		if err := sc.h.presence.Leave(ctx, sc.key, sc.conn, sc.tab.TabID); err != nil {
			sc.h.log.Debug("leaving the presence list", slog.String("request_id", sc.reqID), slog.String("error", err.Error()))
		}
		cancel()
	}
	if sc.unlink != nil {
		sc.unlink()
	}
	sc.h.leave(sc.st)
}

// run writes the stream until the client goes away, a write fails, the watch ends (other than
// with lease.ErrResync, after which it resubscribes) or the handler closes.
func (sc *streamConn) run() {
	if sc.w == nil {
		return
	}
	now := time.Now()
	sc.keepaliveAt = now.Add(sc.h.opts.Keepalive)
	if sc.conn != "" {
		sc.refreshAt = now.Add(RefreshAfter(sc.ttl))
	}
	sc.timer = time.NewTimer(sc.untilTimer(now))
	defer sc.timer.Stop()
	for sc.step(sc.wait()) {
	}
}

// What woke a stream (wait's answer).
const (
	wokeEvent = iota // sc.ev holds an event
	wokeEnded        // the watch ended
	wokeNews         // the stream's wake: news, or the handler closes
	wokeTimer        // a keepalive or a presence refresh is due
)

// wait blocks until the stream has something to do, and says what.
func (sc *streamConn) wait() int {
	var ok bool
	select {
	case sc.ev, ok = <-sc.w.Events():
		if !ok {
			return wokeEnded
		}
		return wokeEvent
	case <-sc.st.wake:
		return wokeNews
	case <-sc.timer.C:
		return wokeTimer
	}
}

// step does what woke the stream; it answers false when the stream ends.
func (sc *streamConn) step(woke int) bool {
	switch woke {
	case wokeEvent:
		ev := sc.ev
		sc.ev = lease.Event{} // an idle stream holds no event
		if sc.sse.event(sc.h.views, ev) != nil {
			return false
		}
		sc.last = ev.ID
	case wokeEnded:
		return sc.resubscribe()
	case wokeNews:
		return sc.news()
	case wokeTimer:
		return sc.due()
	}
	return true
}

// news handles the stream's wake: the client went away, the handler closes (the final event), or
// the catalog version changed (a catalog event).
func (sc *streamConn) news() bool {
	if sc.st.gone() {
		return false
	}
	select {
	case <-sc.h.closing:
		_ = sc.sse.shutdown()
		return false
	default:
	}
	if sc.st.news.And(^newsCatalog)&newsCatalog != 0 {
		return sc.sse.catalog(sc.h.catalogNow()) == nil
	}
	return true
}

// due sends the keepalive and refreshes the presence entry when their time has come, and sets the
// timer for the next one.
func (sc *streamConn) due() bool {
	now := time.Now()
	if !sc.refreshAt.IsZero() && !now.Before(sc.refreshAt) {
		sc.refreshAt = time.Now().Add(sc.refresh())
	}
	if !now.Before(sc.keepaliveAt) {
		if sc.keepaliveAt = sc.keepaliveAt.Add(sc.h.opts.Keepalive); sc.keepaliveAt.Before(now) {
			sc.keepaliveAt = now.Add(sc.h.opts.Keepalive) // behind: no catching up
		}
		if sc.sse.comment("keepalive") != nil {
			return false
		}
	}
	now = time.Now()
	sc.timer.Reset(sc.untilTimer(now))
	return true
}

// untilTimer is how long from now until the next keepalive or presence refresh.
func (sc *streamConn) untilTimer(now time.Time) time.Duration {
	next := sc.keepaliveAt
	if !sc.refreshAt.IsZero() && sc.refreshAt.Before(next) {
		next = sc.refreshAt
	}
	return max(next.Sub(now), 0)
}

// resubscribe handles the end of the watch: after lease.ErrResync it watches again from the last
// event sent and starts over with a snapshot and the replay; any other end ends the stream.
func (sc *streamConn) resubscribe() bool {
	err := sc.w.Err()
	sc.w.Close()
	sc.w = nil
	if errors.Is(err, lease.ErrResync) {
		if sc.w, err = sc.rewatch(); err == nil {
			sc.last, err = sc.sse.start(sc.h.views, sc.w, sc.tab.TabID, false)
			return err == nil
		}
		if errors.Is(err, errClosing) {
			_ = sc.sse.shutdown()
		}
	}
	if err != nil && !errors.Is(err, errGone) && !errors.Is(err, errClosing) {
		sc.h.log.Info("event stream ended by the store", slog.String("request_id", sc.reqID), slog.String("error", err.Error()))
	}
	return false
}

// RefreshAfter is when a presence entry of the given time to live is refreshed: every third of it.
func RefreshAfter(ttl time.Duration) time.Duration {
	return max(ttl/3, 10*time.Millisecond)
}

// rewatch watches the stream's session again after lease.ErrResync, from the last event sent,
// trying for at most rewatchFor while the store does not answer.
func (sc *streamConn) rewatch() (*lease.Watch, error) {
	delay := 50 * time.Millisecond
	deadline := time.Now().Add(rewatchFor)
	for {
		if sc.st.gone() {
			return nil, errGone
		}
		w, err := sc.h.feed.Watch(context.Background(), sc.key, sc.last)
		if err == nil || !errors.Is(err, lease.ErrUnavailable) || time.Now().Add(delay).After(deadline) {
			if err != nil {
				sc.h.storeError("watch", err)
			}
			return w, err
		}
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-sc.h.closing:
			t.Stop()
			return nil, errClosing
		}
		delay = min(2*delay, time.Second)
	}
}

// errClosing ends a stream whose handler closes; errGone one whose client went away.
var (
	errClosing = errors.New("stream: the handler is closing")
	errGone    = errors.New("stream: the client went away")
)

// newConnID names one connection of a tab in the presence list: 26 characters of the alphabet of
// rand.Text, which has no dot and no lower-case letter.
func newConnID() string { return rand.Text() }
