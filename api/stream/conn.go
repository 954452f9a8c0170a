package stream

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"runtime/debug"
	"strings"
	"sync/atomic"
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
	// Until, when set, is when the credential that opened the stream stops being accepted: the
	// stream ends then with its final event (event: shutdown), and the client opens another with
	// a current credential. A stream is authorized when it opens, so without an end an expired or
	// withdrawn token would keep receiving the session's events.
	Until time.Time
	// Kept, when set, is asked with each keepalive whether the credential is still accepted (its
	// key not withdrawn): false ends the stream as at Until.
	Kept func() bool
}

// Serve serves the stream req on w: it admits the stream, lists its tab (when req.Listed), starts
// the watch, and sends the headers, the snapshot and the replay, then every event until the client
// goes away, a write fails, the watch ends or the handler closes. Until the headers are sent it
// answers errors: ErrClosing, *LimitError, or the engine's (lease.ErrUnavailable, …); then nil.
//
// Once it has begun, a stream is written by a goroutine that runs only while the stream has
// something to do (see streamConn.kick). An HTTP/1.1 stream may be taken over from net/http (see
// hijack.go): Serve then returns at once. Otherwise it returns when the stream ends.
func (h *Handler) Serve(w http.ResponseWriter, r *http.Request, req Request) error {
	sc, err := h.openStream(w, r, req)
	if err != nil {
		return err
	}
	sc.schedule()
	if sc.handOver(r) {
		sc.drain()
		return nil
	}
	sc.done = make(chan struct{})
	sc.drain()
	<-sc.done
	return nil // once the stream has begun, nothing else can be answered
}

// streamConn is one open event stream.
//
// An idle stream has no goroutine of its own: what it waits for (an event of its watch, its news
// from the handler, the timer of its keepalive and presence refresh) calls kick, which starts a
// goroutine to run drain unless one runs already. drain does all there is to do, again while it
// is kicked meanwhile, and ends. Only the goroutine that runs drain touches the fields below
// state (and the one that opens the stream, before the first drain).
type streamConn struct {
	h     *Handler
	st    stream // the handler's part
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
	// state says whether a goroutine runs drain (runBusy, runAgain); it starts runBusy: the
	// stream is opening, and Serve runs the first drain.
	state atomic.Int32
	ended endReason // why it ends, once it does (beside state, in what would be padding)
	// timer kicks the stream at the earlier of keepaliveAt and refreshAt (zero when not listed).
	timer       *time.Timer
	keepaliveAt time.Time
	refreshAt   time.Time
	until       time.Time   // Request.Until: the stream ends then (zero: never)
	kept        func() bool // Request.Kept
	// done, when not nil, is closed once the stream has ended: Serve waits for it while net/http
	// serves the stream.
	done chan struct{}
	// opened is when the stream was admitted (Unix ns). With ended, the stream stays within the
	// allocation size class of 448 bytes.
	opened int64
}

// endReason says why a stream ended, for its log line and tablease_event_streams_ended_total.
type endReason uint8

const (
	endClientGone   endReason = iota // the client went away (its connection closed or was reset)
	endWriteFailed                   // a write missed its deadline (a reader too slow, a peer gone silent)
	endShutdown                      // the instance shuts down
	endTokenExpired                  // the access token that opened the stream expired
	endStore                         // its watch ended and could not start again (the store did not answer)
	endPanic                         // serving it panicked
	endKeyWithdrawn                  // the key that verified its access token was withdrawn (Request.Kept)
)

// writeEnd is why a stream whose write failed with err ends: a write that missed its deadline
// (the client does not read) is write_failed; any other failure (a reset, a closed pipe) means the
// client went away.
func writeEnd(err error) endReason {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return endWriteFailed
	}
	return endClientGone
}

// endReasons are the names of the endReasons, in order.
var endReasons = [...]string{"client_gone", "write_failed", "shutdown", "token_expired", "store", "panic", "key_withdrawn"}

// States of a streamConn.
const (
	runBusy  int32 = iota // a goroutine runs drain (or the stream is opening)
	runAgain              // a goroutine runs drain, and the stream was kicked since it began
	runIdle               // nothing runs: the next kick starts drain
	runEnded              // the stream has ended
)

// openStream admits the stream, lists its tab (when req.Listed) and starts the watch, then sends
// the headers, the snapshot and the replay. Until the headers are sent it answers errors.
func (h *Handler) openStream(w http.ResponseWriter, r *http.Request, req Request) (*streamConn, error) {
	// The session and the tab are substrings of the request line, which the stream, its watch and
	// its presence entry would keep for as long as they run: copies let it go.
	req.Key.Session = strings.Clone(req.Key.Session)
	req.Tab.TabID, req.Tab.Label = strings.Clone(req.Tab.TabID), strings.Clone(req.Tab.Label)
	sc := &streamConn{h: h, reqID: req.RequestID, key: req.Key, tab: req.Tab, until: req.Until, kept: req.Kept, opened: time.Now().UnixNano()}
	sc.st.user, sc.st.wake = req.Key.User, sc.kick
	err := h.admit(&sc.st)
	if err != nil {
		return nil, err
	}
	ctx := r.Context()
	sc.unlink = context.AfterFunc(ctx, func() { sc.st.tell(newsGone) })
	if req.Listed {
		if err := sc.join(ctx); err != nil {
			sc.close()
			h.leave(&sc.st)
			return nil, err
		}
	}
	// The watch outlives the request when the stream is taken over: close ends it.
	sc.w, err = h.feed.Watch(context.Background(), req.Key, req.After)
	h.storeCall("watch", err)
	if err != nil {
		sc.close()
		h.leave(&sc.st)
		return nil, err
	}
	sc.sse.init(w, h.opts.WriteTimeout, h.sent)
	sc.sse.begin()
	if sc.last, err = sc.sse.start(h.views, sc.w, req.Tab.TabID, true); err != nil {
		sc.w.Close()
		sc.w = nil // the client is gone: the first drain ends the stream
	}
	return sc, nil
}

// join lists the stream's tab in the presence list. A stream that did not join (sc.conn empty)
// never refreshes nor leaves.
func (sc *streamConn) join(ctx context.Context) error {
	sc.conn = newConnID()
	ctx, cancel := context.WithTimeout(ctx, presenceCallTimeout)
	defer cancel()
	ttl, err := sc.h.presence.Join(ctx, sc.key, sc.conn, sc.tab, 0)
	sc.h.storeCall("join", err)
	if err != nil {
		if errors.Is(err, lease.ErrTooManyTabs) {
			sc.h.refused.WithLabelValues("too_many_tabs").Inc()
		}
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
			err := h.presence.Leave(ctx, key, conn, tabID, 0)
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

// refresh joins again, sets when to refresh next (a third of the TTL, or sooner after a failure),
// and reports whether the join succeeded.
func (sc *streamConn) refresh() bool {
	ctx, cancel := context.WithTimeout(context.Background(), presenceCallTimeout)
	defer cancel()
	ttl, err := sc.h.presence.Join(ctx, sc.key, sc.conn, sc.tab, 0)
	sc.h.storeCall("join", err)
	if err != nil {
		sc.refreshAt = time.Now().Add(min(presenceRetry, RefreshAfter(sc.ttl)))
		return false
	}
	sc.ttl = ttl
	sc.refreshAt = time.Now().Add(RefreshAfter(ttl))
	return true
}

// close ends the watch, ends the response (closing the connection of a stream taken over) and
// takes the tab off the presence list. The caller then gives the stream's place back (h.leave),
// after what it logs of the end: Handler.Close waits for the places, and a shutdown's last line
// comes after every stream's.
func (sc *streamConn) close() {
	if sc.w != nil {
		sc.w.Close()
	}
	forgetHangup(sc.st.hangup)
	sc.sse.end()
	if sc.conn != "" {
		ctx, cancel := context.WithTimeout(context.Background(), presenceCallTimeout)
		if err := sc.h.presence.Leave(ctx, sc.key, sc.conn, sc.tab.TabID, 0); err != nil {
			sc.h.log.Debug("leaving the presence list", slog.String("request_id", sc.reqID), slog.String("error", err.Error()))
		}
		cancel()
	}
	if sc.unlink != nil {
		sc.unlink()
	}
}

// schedule sets the stream's timer and has its watch kick it: from now on, drain runs it.
func (sc *streamConn) schedule() {
	if sc.w == nil {
		return
	}
	now := time.Now()
	sc.keepaliveAt = now.Add(sc.h.opts.Keepalive)
	if sc.conn != "" {
		sc.refreshAt = now.Add(RefreshAfter(sc.ttl))
	}
	sc.timer = time.AfterFunc(sc.untilTimer(now), sc.st.wake)
	sc.w.OnReady(sc.st.wake)
}

// kick has the stream look at what it has to do: it starts a goroutine that runs drain, unless one
// runs already (which then looks again). It never blocks.
func (sc *streamConn) kick() {
	for {
		switch sc.state.Load() {
		case runIdle:
			if sc.state.CompareAndSwap(runIdle, runBusy) {
				go sc.drain()
				return
			}
		case runBusy:
			if sc.state.CompareAndSwap(runBusy, runAgain) {
				return
			}
		default: // runAgain: it will look again; runEnded
			return
		}
	}
}

// drain runs the stream while it has something to do, and ends it when it is over. A panic ends
// the stream, not the process, as net/http does for a handler.
func (sc *streamConn) drain() {
	defer func() {
		if r := recover(); r != nil {
			sc.h.log.Error("panic serving an event stream", slog.String("request_id", sc.reqID),
				slog.String("panic", fmt.Sprint(r)), slog.String("stack", string(debug.Stack())))
			sc.ended = endPanic
			sc.end()
		}
	}()
	for {
		sc.state.Store(runBusy)
		if !sc.work() {
			sc.end()
			return
		}
		if sc.state.CompareAndSwap(runBusy, runIdle) {
			return
		}
	}
}

// end ends the stream: nothing runs it any more. It logs why, and for how long the stream ran.
func (sc *streamConn) end() {
	sc.state.Store(runEnded)
	if sc.timer != nil {
		sc.timer.Stop()
	}
	sc.close()
	reason := endReasons[sc.ended]
	sc.h.ended[sc.ended].Inc()
	sc.h.log.Info("event stream ended", slog.String("request_id", sc.reqID), slog.String("sub", sc.key.User),
		slog.String("session", sc.key.Session), slog.String("reason", reason),
		slog.Float64("duration_s", float64(time.Now().UnixNano()-sc.opened)/1e9))
	sc.h.leave(&sc.st)
	if sc.done != nil {
		close(sc.done)
	}
}

// work writes what the stream has to: its news, the events its watch holds, and the keepalive and
// presence refresh when they are due. It answers false when the stream ends: the client went
// away, a write failed, the watch ended (other than with lease.ErrResync, after which it
// resubscribes) or the handler closes.
func (sc *streamConn) work() bool {
	if sc.w == nil {
		return false // the client went away before the stream began
	}
	for {
		if !sc.news() {
			return false
		}
		select {
		case ev, ok := <-sc.w.Events():
			if !ok {
				if !sc.resubscribe() {
					return false
				}
				continue
			}
			if err := sc.sse.event(sc.h.views, *ev); err != nil {
				sc.ended = writeEnd(err)
				return false
			}
			sc.last = ev.ID
			continue
		default:
		}
		return sc.due()
	}
}

// news handles the stream's news: the client went away, the handler closes (the final event), or
// the catalog version changed (a catalog event).
func (sc *streamConn) news() bool {
	if sc.st.gone() {
		return false
	}
	select {
	case <-sc.h.closing:
		_ = sc.sse.shutdown(reasonShutdown)
		sc.ended = endShutdown
		return false
	default:
	}
	if sc.st.news.And(^newsCatalog)&newsCatalog != 0 {
		if err := sc.sse.catalog(sc.h.catalogNow()); err != nil {
			sc.ended = writeEnd(err)
			return false
		}
	}
	return true
}

// due sends the keepalive and refreshes the presence entry when their time has come, and sets the
// timer for the next one.
func (sc *streamConn) due() bool {
	now := time.Now()
	if !sc.until.IsZero() && !now.Before(sc.until) {
		_ = sc.sse.shutdown(reasonCredential)
		sc.ended = endTokenExpired
		return false
	}
	if now.Before(sc.keepaliveAt) && (sc.refreshAt.IsZero() || now.Before(sc.refreshAt)) {
		// Nothing is due. The timer may have fired for a time that moved since (a resync
		// refreshes the presence entry early): set it for the first again.
		sc.timer.Reset(sc.untilTimer(now))
		return true
	}
	if !sc.refreshAt.IsZero() && !now.Before(sc.refreshAt) {
		sc.refresh()
	}
	if !now.Before(sc.keepaliveAt) {
		if sc.kept != nil && !sc.kept() {
			_ = sc.sse.shutdown(reasonCredential)
			sc.ended = endKeyWithdrawn
			return false
		}
		if sc.keepaliveAt = sc.keepaliveAt.Add(sc.h.opts.Keepalive); sc.keepaliveAt.Before(now) {
			sc.keepaliveAt = now.Add(sc.h.opts.Keepalive) // behind: no catching up
		}
		if err := sc.sse.comment("keepalive"); err != nil {
			sc.ended = writeEnd(err)
			return false
		}
	}
	now = time.Now()
	sc.timer.Reset(sc.untilTimer(now))
	return true
}

// untilTimer is how long from now until the next keepalive, presence refresh or the stream's end.
func (sc *streamConn) untilTimer(now time.Time) time.Duration {
	next := sc.keepaliveAt
	if !sc.refreshAt.IsZero() && sc.refreshAt.Before(next) {
		next = sc.refreshAt
	}
	if !sc.until.IsZero() && sc.until.Before(next) {
		next = sc.until
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
			sc.w.OnReady(sc.st.wake)
			if sc.last, err = sc.sse.start(sc.h.views, sc.w, sc.tab.TabID, false); err != nil {
				sc.ended = writeEnd(err)
			}
			return err == nil
		}
		if errors.Is(err, errClosing) {
			_ = sc.sse.shutdown(reasonShutdown)
		}
	}
	switch {
	case errors.Is(err, errGone):
		sc.ended = endClientGone
	case errors.Is(err, errClosing):
		sc.ended = endShutdown
	default:
		sc.ended = endStore
	}
	if err != nil && !errors.Is(err, errGone) && !errors.Is(err, errClosing) {
		// The client is told, as at a shutdown, rather than left with a bare end of the stream.
		reason := reasonResumeFailed
		if errors.Is(err, lease.ErrUnavailable) {
			reason = reasonStore
		}
		_ = sc.sse.shutdown(reason)
		sc.h.log.Info("event stream ended by the store", slog.String("request_id", sc.reqID),
			slog.String("sub", sc.key.User), slog.String("session", sc.key.Session), slog.String("error", err.Error()))
	}
	return false
}

// RefreshAfter is when a presence entry of the given time to live is refreshed: every third of it.
func RefreshAfter(ttl time.Duration) time.Duration {
	return max(ttl/3, 10*time.Millisecond)
}

// rewatch watches the stream's session again after lease.ErrResync, from the last event sent,
// trying for at most rewatchFor while the store does not answer. What the store lost may include
// the tab's presence entry (a Redis restarted empty): a stream that lists its tab refreshes the
// entry first, at each try until it succeeds, rather than a third of the TTL later, so that the
// snapshot of the watch lists the tab.
func (sc *streamConn) rewatch() (*lease.Watch, error) {
	delay := 50 * time.Millisecond
	deadline := time.Now().Add(rewatchFor)
	refreshed := sc.conn == "" // a stream that is not listed (presence=false) has nothing to refresh
	for {
		if sc.st.gone() {
			return nil, errGone
		}
		if !refreshed {
			refreshed = sc.refresh()
		}
		w, err := sc.h.feed.Watch(context.Background(), sc.key, sc.last)
		if err == nil || !errors.Is(err, lease.ErrUnavailable) || time.Now().Add(delay).After(deadline) {
			sc.h.storeCall("watch", err)
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
