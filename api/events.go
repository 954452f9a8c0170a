package api

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tablease/tablease/lease"
)

// # The event stream
//
// GET /v1/sessions/{sid}/events?tabId=[&label=&hidden=&presence=] is a Server-Sent Events stream
// of the session {sid} of the caller (the token's sub, or the ticket's: see tickets.go), DESIGN §3.
// The stream lists its tab in the presence list (presence.go) unless presence=false, with which it
// neither joins, refreshes nor leaves: its client announces its tabs with PUT …/tabs/{tabId}.
//
//	retry: 2000                      once, at the start
//	id: <event id>                   the snapshot's id is the log position it was read at; none
//	event: snapshot                  when the log is empty or the snapshot opens a replay
//	data: {lease object, "tabs": [...], "resumed": bool}
//
//	id: <event id>                   then every change, in order, each with its id
//	event: lease | tabs
//	data: {...}
//
//	event: catalog                   no id: not in the session's log
//	data: {"version": "..."}
//
//	: keepalive                      every StreamOptions.Keepalive
//
// Every (re)connect starts with a snapshot. A connect that names the last event it saw
// (Last-Event-ID, or the lastEventId query parameter for an EventSource that cannot set headers)
// and whose events the session's log still holds is a resume: the snapshot (state at the end of
// the replay, "resumed": true, without an id so the client's last id is unchanged) is followed by
// the missed events with their ids. Otherwise the snapshot carries the id of the log position it
// was read at, and nothing older follows.
//
// When the engine ends the watch with lease.ErrResync (the reader fell behind, or the Redis
// engine lost its Pub/Sub link), the handler watches again from the last id it sent and does as on
// a reconnect: a fresh snapshot, then the replay. Any other end of the watch ends the stream.
//
// Every write has a deadline (StreamOptions.WriteTimeout) and is flushed at once, so a client that
// stops reading cannot hold a goroutine longer than that. Server.Close ends every stream with a
// final `event: shutdown` whose `retry:` is short and jittered, before the HTTP server shuts down.
//
// An HTTP/1.1 stream is handed over once it has begun: its connection is hijacked from net/http,
// whose handler returns, and the stream is served by one goroutine that writes the chunks of the
// body straight to the connection and waits on the watch, its wake and one timer, beside one that
// reads the connection to learn at once that the client went away (see handOver). An idle stream
// then costs about 12 KiB instead of 40 (BenchmarkIdleStreams). HTTP/2 and HTTP/1.0 streams stay
// with net/http (their handler serves them); they behave the same.

// Defaults of StreamOptions.
const (
	DefaultStreamsPerUser     = 32
	DefaultStreamsPerInstance = 10_000
	DefaultStreamKeepalive    = 15 * time.Second
	DefaultStreamWriteTimeout = 10 * time.Second
)

const (
	// streamRetry is the reconnection delay each stream asks of its client at the start.
	streamRetry = 2 * time.Second
	// shutdownRetry and shutdownJitter make the reconnection delay of the shutdown event: short,
	// spread so that the clients of a stopping instance do not all come back at once.
	shutdownRetry  = 250 * time.Millisecond
	shutdownJitter = time.Second
	// presenceCallTimeout bounds one Join or Leave of the stream's tab.
	presenceCallTimeout = 5 * time.Second
	// presenceRetry is how soon a failed refresh of the tab's presence is tried again.
	presenceRetry = time.Second
	// rewatchFor bounds the attempts to watch again after lease.ErrResync; past it the stream ends
	// and the client reconnects.
	rewatchFor = 5 * time.Second
	// closeWaitExtra is how much longer than a write's deadline Server.Close waits for streams.
	closeWaitExtra = presenceCallTimeout + time.Second
	// limitRetryAfter is the Retry-After of a stream refused by a limit.
	limitRetryAfter = 5 * time.Second
)

// StreamOptions configure the event streams. Zero values mean the defaults.
type StreamOptions struct {
	// PerUser bounds the open streams of one user (the token's sub) on this instance (default
	// DefaultStreamsPerUser); one more is 429 RATE_LIMITED.
	PerUser int
	// PerInstance bounds the open streams of this instance (default DefaultStreamsPerInstance);
	// one more is 429 RATE_LIMITED.
	PerInstance int
	// Keepalive is the interval of the comment lines that keep idle connections open through
	// proxies (default DefaultStreamKeepalive).
	Keepalive time.Duration
	// WriteTimeout bounds each write to a stream (default DefaultStreamWriteTimeout): a client
	// that does not read for that long loses its stream.
	WriteTimeout time.Duration
	// TicketSecret is the HMAC key of event tickets (see tickets.go), at least 32 bytes; every
	// instance sharing a store must have the same. Nil: a key derived from Auth.HS256Secret, or,
	// without one, a key generated for this process (then tickets work on this instance only).
	TicketSecret []byte
}

func (o StreamOptions) withDefaults() (StreamOptions, error) {
	switch {
	case o.PerUser < 0:
		return o, errors.New("api: Options.Streams.PerUser must not be negative")
	case o.PerInstance < 0:
		return o, errors.New("api: Options.Streams.PerInstance must not be negative")
	case o.Keepalive < 0:
		return o, errors.New("api: Options.Streams.Keepalive must not be negative")
	case o.WriteTimeout < 0:
		return o, errors.New("api: Options.Streams.WriteTimeout must not be negative")
	case o.TicketSecret != nil && len(o.TicketSecret) < MinTicketSecretLen:
		return o, errors.New("api: Options.Streams.TicketSecret must be at least 32 bytes")
	}
	if o.PerUser == 0 {
		o.PerUser = DefaultStreamsPerUser
	}
	if o.PerInstance == 0 {
		o.PerInstance = DefaultStreamsPerInstance
	}
	if o.Keepalive == 0 {
		o.Keepalive = DefaultStreamKeepalive
	}
	if o.WriteTimeout == 0 {
		o.WriteTimeout = DefaultStreamWriteTimeout
	}
	return o, nil
}

// streamHub keeps the open streams of the server: it enforces the limits, tells the streams of
// catalog changes, and ends them all on close.
type streamHub struct {
	feed     lease.Feed
	presence lease.Presence // nil: streams are not listed
	opts     StreamOptions
	catalogs *catalogSource
	log      *slog.Logger

	open    prometheus.Gauge
	refused *prometheus.CounterVec // reason
	sent    *prometheus.CounterVec // event

	closing chan struct{}  // closed by close: every stream sends its final event and ends
	running sync.WaitGroup // one per stream admitted

	mu      sync.Mutex // protects the fields below
	streams map[*stream]struct{}
	perUser map[string]int
	closed  bool
	// catalogVersion is the last catalog version the catalog source announced; stopCatalog stops
	// its watch, which runs while any stream is open (nil otherwise).
	catalogVersion string
	stopCatalog    func()
}

// stream is what the hub knows of one open stream.
type stream struct {
	user string
	// wake (capacity 1) has the stream look at its news and at the hub's closing.
	wake chan struct{}
	news atomic.Uint32 // newsCatalog | newsGone
	conn net.Conn      // the connection once handed over (see handOver), else nil; protected by streamHub.mu
}

// News of a stream (stream.news).
const (
	newsCatalog uint32 = 1 << iota // the catalog version changed since the stream last looked
	newsGone                       // the client went away; it stays
)

// tell adds news for st and wakes it. It never blocks.
func (st *stream) tell(news uint32) {
	st.news.Or(news)
	select {
	case st.wake <- struct{}{}:
	default: // already woken: it will see every news
	}
}

// gone reports whether the client went away.
func (st *stream) gone() bool { return st.news.Load()&newsGone != 0 }

func newStreamHub(feed lease.Feed, presence lease.Presence, opts StreamOptions, catalogs *catalogSource, log *slog.Logger, reg prometheus.Registerer) (*streamHub, error) {
	h := &streamHub{
		feed: feed, presence: presence, opts: opts, catalogs: catalogs, log: log,
		open: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tablease_event_streams",
			Help: "Event streams open on this instance.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tablease_event_streams_refused_total",
			Help: "Event streams refused, by reason (user_limit, instance_limit, closing).",
		}, []string{"reason"}),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tablease_events_sent_total",
			Help: "Events written to event streams, by event (snapshot, lease, tabs, catalog, shutdown).",
		}, []string{"event"}),
		closing: make(chan struct{}),
		streams: make(map[*stream]struct{}),
		perUser: make(map[string]int),
	}
	for _, c := range []prometheus.Collector{h.open, h.refused, h.sent} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, r := range []string{"user_limit", "instance_limit", "closing"} {
		h.refused.WithLabelValues(r)
	}
	return h, nil
}

// admit opens a stream for user, or refuses it with 429 RATE_LIMITED beyond a limit (503 while
// the server closes). The caller must call leave once the stream has ended.
func (h *streamHub) admit(user string) (*stream, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.closed:
		h.refused.WithLabelValues("closing").Inc()
		return nil, &Error{Code: CodeStoreUnavailable, Message: "this instance is shutting down; reconnect", Retryable: true, RetryAfter: time.Second}
	case len(h.streams) >= h.opts.PerInstance:
		h.refused.WithLabelValues("instance_limit").Inc()
		return nil, streamLimit("this instance serves as many event streams as it may", "instance", h.opts.PerInstance)
	case h.perUser[user] >= h.opts.PerUser:
		h.refused.WithLabelValues("user_limit").Inc()
		return nil, streamLimit("this user has as many event streams open as allowed; close one (one stream per browser profile is enough)", "user", h.opts.PerUser)
	}
	st := &stream{user: user, wake: make(chan struct{}, 1)}
	h.streams[st] = struct{}{}
	h.perUser[user]++
	h.running.Add(1)
	h.open.Inc()
	if h.stopCatalog == nil {
		h.stopCatalog = h.catalogs.watch(h.catalogChanged)
	}
	return st, nil
}

func streamLimit(msg, limit string, n int) *Error {
	return &Error{
		Code:       CodeRateLimited,
		Message:    msg,
		Retryable:  true,
		Details:    map[string]any{"retryAfterMs": limitRetryAfter.Milliseconds(), "limit": limit, "max": n},
		RetryAfter: limitRetryAfter,
	}
}

// leave forgets st, which has ended.
func (h *streamHub) leave(st *stream) {
	h.mu.Lock()
	delete(h.streams, st)
	if h.perUser[st.user]--; h.perUser[st.user] <= 0 {
		delete(h.perUser, st.user)
	}
	var stop func()
	if len(h.streams) == 0 {
		stop, h.stopCatalog = h.stopCatalog, nil
	}
	h.mu.Unlock()
	if stop != nil {
		stop()
	}
	h.open.Dec()
	h.running.Done()
}

// catalogChanged is the catalog source's watcher: it records the version and nudges every stream.
// It never blocks.
func (h *streamHub) catalogChanged(version string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.catalogVersion = version
	for st := range h.streams {
		st.tell(newsCatalog)
	}
}

func (h *streamHub) catalogNow() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.catalogVersion
}

// close makes every stream send its final event and end, refuses new ones, and waits until they
// have ended (at most a write deadline and a presence call, plus a second). It may be called more
// than once.
func (h *streamHub) close() {
	h.mu.Lock()
	if !h.closed {
		h.closed = true
		close(h.closing)
		for st := range h.streams {
			st.tell(0)
		}
	}
	h.mu.Unlock()
	done := make(chan struct{})
	go func() { h.running.Wait(); close(done) }()
	t := time.NewTimer(h.opts.WriteTimeout + closeWaitExtra)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		h.log.Warn("event streams did not all end in time at close")
		// http.Server.Shutdown does not know hijacked connections: end them here.
		h.mu.Lock()
		for st := range h.streams {
			if st.conn != nil {
				_ = st.conn.Close()
			}
		}
		h.mu.Unlock()
	}
}

// hijacked records that st is now served on conn, outside net/http.
func (h *streamHub) hijacked(st *stream, conn net.Conn) {
	h.mu.Lock()
	st.conn = conn
	h.mu.Unlock()
}

// streamQuery is what a stream request names besides its session.
type streamQuery struct {
	tab    lease.Tab
	after  string // the last event id the client saw; empty for none
	listed bool   // the stream lists its tab in the presence list (presence=true, the default)
}

// keyTicketTab is the Echo context key of the tab an event ticket was issued for.
const keyTicketTab = "tablease.ticketTab"

func parseStreamQuery(c echo.Context) (streamQuery, error) {
	var q streamQuery
	tabID := c.QueryParam("tabId")
	if ticketTab, ok := c.Get(keyTicketTab).(string); ok {
		if tabID != "" && tabID != ticketTab { // redeem checked it already
			return q, errTicketTab()
		}
		tabID = ticketTab
	}
	if tabID == "" {
		return q, fieldError("tabId", "is required")
	}
	if err := validTabID(tabID); err != nil {
		return q, err
	}
	label := c.QueryParam("label")
	if err := lease.ValidateLabel(label); err != nil {
		return q, err
	}
	var hidden bool
	switch v := c.QueryParam("hidden"); v {
	case "", "false":
	case "true":
		hidden = true
	default:
		return q, fieldError("hidden", `must be "true" or "false"`)
	}
	switch v := c.QueryParam("presence"); v {
	case "", "true":
		q.listed = true
	case "false":
	default:
		return q, fieldError("presence", `must be "true" or "false"`)
	}
	q.tab = lease.Tab{TabID: tabID, Label: label, Hidden: hidden}
	// An id that is not one of ours is treated as unknown: the stream starts from a snapshot, which
	// is always correct, rather than failing an EventSource for good.
	after := c.Request().Header.Get("Last-Event-ID")
	if after == "" {
		after = c.QueryParam("lastEventId")
	}
	if _, err := lease.ParseEventID(after); err == nil {
		q.after = after
	}
	return q, nil
}

// events serves GET /v1/sessions/{sid}/events. Once the stream has begun, an HTTP/1.1 connection
// is taken over from net/http (see handOver) and the handler returns; otherwise (HTTP/2, HTTP/1.0)
// the handler serves the stream until it ends.
func (s *Server) events(c echo.Context) error {
	sc, err := s.openStream(c)
	if err != nil {
		return err
	}
	if sc.handOver(c) {
		return nil // the stream goes on in a goroutine of its own
	}
	defer sc.close()
	sc.run()
	return nil // once the stream has begun, nothing else can be answered
}

// streamConn is one open event stream. Only the goroutine serving the stream touches it (the
// handler's, or the stream's own once the connection is handed over).
//
// An idle stream waits in wait, whose frame is small, with nothing else on its goroutine's stack
// but run's and serve's: the stack then shrinks to 2 KiB at the next GCs (see
// BenchmarkIdleStreams). What it waits for is kept down to three channels (the watch, the stream's
// wake and one timer), each costing a sudog while it waits.
type streamConn struct {
	s     *Server
	h     *streamHub
	st    *stream
	reqID string
	key   lease.Key
	tab   lease.Tab
	conn  string        // the presence connection id; empty without presence
	ttl   time.Duration // of the presence entry, as the engine last answered
	w     *lease.Watch  // replaced when the watch is renewed
	sse   sseWriter
	last  string // the id of the last event the client has

	// unlink stops telling the stream that its client went away when the request's context ends
	// (net/http ends it when the handler returns, which a stream handed over outlives).
	unlink func() bool
	// timer fires at the earlier of keepaliveAt and refreshAt (zero without presence).
	timer       *time.Timer
	keepaliveAt time.Time
	refreshAt   time.Time
	// ev is the event wait received, until step has written it.
	ev lease.Event
}

// openStream checks the request, admits the stream, lists its tab (unless presence=false) and
// starts the watch, then sends the headers, the snapshot and the replay. Until the headers are
// sent it answers errors.
func (s *Server) openStream(c echo.Context) (*streamConn, error) {
	key, err := s.key(c)
	if err != nil {
		return nil, err
	}
	q, err := parseStreamQuery(c)
	if err != nil {
		return nil, err
	}
	st, err := s.streams.admit(key.User)
	if err != nil {
		return nil, err
	}
	ctx := c.Request().Context()
	sc := &streamConn{s: s, h: s.streams, st: st, reqID: requestID(c), key: key, tab: q.tab}
	sc.unlink = context.AfterFunc(ctx, func() { st.tell(newsGone) })
	if q.listed {
		if err := sc.join(ctx); err != nil {
			sc.close()
			return nil, err
		}
	}
	// The watch outlives the request when the stream is handed over: Close ends it.
	if sc.w, err = sc.h.feed.Watch(context.Background(), key, q.after); err != nil {
		s.storeError("watch", err)
		sc.close()
		return nil, err
	}
	sc.sse.init(c, sc.h.opts.WriteTimeout)
	sc.sse.begin()
	if sc.last, err = sc.sse.start(sc.h, sc.w, q.tab.TabID, true); err != nil {
		sc.w.Close()
		sc.w = nil // the client is gone: run ends at once
	}
	return sc, nil
}

// handOver takes the connection of a stream that has begun over from net/http, and serves the
// stream from a goroutine of its own that writes chunks straight to the connection, while another
// waits for the client to go away; it answers false, and does nothing, when the stream stays with
// net/http. Once the handler has returned, an idle stream holds neither net/http's buffers (4 KiB
// to read, 4 + 2 KiB to write) nor its goroutine, nor the request.
//
// Only HTTP/1.1 is handed over: HTTP/2 cannot be, and net/http does not chunk an HTTP/1.0
// response, whereas the headers already sent announce a chunked body on HTTP/1.1.
// http.Server.Shutdown does not know the connections handed over: streamHub.close ends them.
func (sc *streamConn) handOver(c echo.Context) bool {
	req := c.Request()
	if sc.w == nil || req.Method != http.MethodGet || req.ProtoMajor != 1 || req.ProtoMinor < 1 {
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
	sc.sse.handedOver(conn)
	sc.h.hijacked(sc.st, conn)
	go watchClient(conn, sc.st)
	go sc.serve()
	return true
}

// serve runs a stream that was handed over, and closes it. A panic ends the stream, not the
// process, as net/http does for a handler.
func (sc *streamConn) serve() {
	defer sc.close()
	defer sc.recovered()
	sc.run()
}

func (sc *streamConn) recovered() {
	if r := recover(); r != nil {
		sc.s.log.Error("panic serving an event stream", slog.String("request_id", sc.reqID),
			slog.String("panic", fmt.Sprint(r)), slog.String("stack", string(debug.Stack())))
	}
}

// maxStrayBytes bounds what a client may send on the connection of its stream after its request;
// beyond, the stream ends.
const maxStrayBytes = 4 << 10

// watchClient reads conn, the connection of the stream st that was handed over, until the client
// closes it (or the stream does), and then tells st that its client went away: at once after a
// clean disconnect. What a client sends after its request is dropped.
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

// join lists the stream's tab in the presence list, when there is one. A stream that did not join
// (sc.conn empty) never refreshes nor leaves.
func (sc *streamConn) join(ctx context.Context) error {
	p := sc.h.presence
	if p == nil {
		return nil
	}
	sc.conn = newConnID()
	ctx, cancel := context.WithTimeout(ctx, presenceCallTimeout)
	defer cancel()
	ttl, err := p.Join(ctx, sc.key, sc.conn, sc.tab)
	if err != nil {
		sc.s.storeError("join", err)
		sc.conn = ""
		return err
	}
	sc.ttl = ttl
	return nil
}

// refresh joins again, and answers when to refresh next: a third of the TTL, or sooner after a
// failure.
func (sc *streamConn) refresh() time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), presenceCallTimeout)
	defer cancel()
	ttl, err := sc.h.presence.Join(ctx, sc.key, sc.conn, sc.tab)
	if err != nil {
		sc.s.storeError("join", err)
		return min(presenceRetry, refreshAfter(sc.ttl))
	}
	sc.ttl = ttl
	return refreshAfter(ttl)
}

// close ends the watch, ends the response (closing the connection of a stream that was handed
// over), takes the tab off the presence list and gives the stream's place back.
func (sc *streamConn) close() {
	if sc.w != nil {
		sc.w.Close()
	}
	sc.sse.end()
	if sc.conn != "" {
		ctx, cancel := context.WithTimeout(context.Background(), presenceCallTimeout)
		if err := sc.h.presence.Leave(ctx, sc.key, sc.conn, sc.tab.TabID); err != nil {
			sc.s.log.Debug("leaving the presence list", slog.String("request_id", sc.reqID), slog.String("error", err.Error()))
		}
		cancel()
	}
	if sc.unlink != nil {
		sc.unlink()
	}
	sc.h.leave(sc.st)
}

// run writes the stream until the client goes away, a write fails, the watch ends (other than
// with lease.ErrResync, which renews it) or the server closes.
func (sc *streamConn) run() {
	if sc.w == nil {
		return
	}
	now := time.Now()
	sc.keepaliveAt = now.Add(sc.h.opts.Keepalive)
	if sc.conn != "" {
		sc.refreshAt = now.Add(refreshAfter(sc.ttl))
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
	wokeNews         // the stream's wake: news, or the server closes
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
		if sc.sse.event(sc.h, ev) != nil {
			return false
		}
		sc.last = ev.ID
	case wokeEnded:
		return sc.renew()
	case wokeNews:
		return sc.news()
	case wokeTimer:
		return sc.due()
	}
	return true
}

// news handles the stream's wake: the client went away, the server closes (the final event), or
// the catalog version changed (a catalog event).
func (sc *streamConn) news() bool {
	if sc.st.gone() {
		return false
	}
	select {
	case <-sc.h.closing:
		_ = sc.sse.shutdown(sc.h)
		return false
	default:
	}
	if sc.st.news.And(^newsCatalog)&newsCatalog != 0 {
		return sc.sse.catalog(sc.h, sc.h.catalogNow()) == nil
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

// renew handles the end of the watch: after lease.ErrResync it watches again from the last event
// sent and starts over with a snapshot and the replay; any other end ends the stream.
func (sc *streamConn) renew() bool {
	err := sc.w.Err()
	sc.w.Close()
	sc.w = nil
	if errors.Is(err, lease.ErrResync) {
		if sc.w, err = sc.rewatch(); err == nil {
			sc.last, err = sc.sse.start(sc.h, sc.w, sc.tab.TabID, false)
			return err == nil
		}
		if errors.Is(err, errClosing) {
			_ = sc.sse.shutdown(sc.h)
		}
	}
	if err != nil && !errors.Is(err, errGone) && !errors.Is(err, errClosing) {
		sc.s.log.Info("event stream ended by the store", slog.String("request_id", sc.reqID), slog.String("error", err.Error()))
	}
	return false
}

// refreshAfter is when a presence entry of the given time to live is refreshed: every third of it.
func refreshAfter(ttl time.Duration) time.Duration {
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
				sc.s.storeError("watch", err)
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

// errClosing ends a stream whose server closes; errGone one whose client went away.
var (
	errClosing = errors.New("api: the server is closing")
	errGone    = errors.New("api: the client went away")
)

// newConnID names one connection of a tab in the presence list.
func newConnID() string { return rand.Text() }

// sseWriter writes the events of one stream, each with a write deadline and flushed at once:
// through net/http until the stream is handed over, then as chunks straight to the connection.
type sseWriter struct {
	res     *echo.Response           // nil once handed over
	rc      *http.ResponseController // nil once handed over
	conn    net.Conn                 // the connection once handed over
	broken  bool                     // a write failed: the response cannot be ended cleanly
	timeout time.Duration
	buf     []byte // what the next flush writes; from sseBuffers, given back after the write
}

// sseBuffers keeps the buffers events are written from, so that an idle stream holds none.
var sseBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// chunkHead is the room kept at the start of buf, once handed over, for the size line of the
// chunk: at most 16 hex digits and CRLF.
const chunkHead = 18

// lastChunk ends a chunked body.
var lastChunk = []byte("0\r\n\r\n")

func (w *sseWriter) init(c echo.Context, timeout time.Duration) {
	res := c.Response()
	// The controller is made on the underlying writer so that Flush reports errors (Echo's
	// Response.Flush swallows them).
	w.res, w.rc, w.timeout = res, http.NewResponseController(res.Writer), timeout
}

// handedOver makes w write to conn, the hijacked connection, and forget the response.
func (w *sseWriter) handedOver(conn net.Conn) {
	w.res, w.rc, w.conn = nil, nil, conn
}

// begin sends the headers. The request's read deadline (http.Server.ReadTimeout) is lifted: it
// would otherwise end the stream when it passes.
func (w *sseWriter) begin() {
	_ = w.rc.SetReadDeadline(time.Time{})
	hdr := w.res.Header()
	hdr.Set(echo.HeaderContentType, "text/event-stream")
	hdr.Set(echo.HeaderCacheControl, "no-cache, no-transform")
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
	}
	if cap(w.buf) <= 64<<10 { // a rare large event's buffer is left to the GC
		b := w.buf[:0]
		sseBuffers.Put(&b)
	}
	w.buf = nil
	return err
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

// end ends the response. net/http ends one it still serves once the handler returns: this gives it
// a fresh write deadline (the last one may have passed while the stream was idle). A stream that
// was handed over gets its last chunk, unless a write failed, and its connection is closed.
func (w *sseWriter) end() {
	switch {
	case w.conn != nil:
		if !w.broken {
			_ = w.conn.SetWriteDeadline(time.Now().Add(w.timeout))
			_, _ = w.conn.Write(lastChunk)
		}
		_ = w.conn.Close()
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

// start writes what opens a watch: the snapshot, and the replay when the watch resumed. first
// adds the retry: field that opens a stream. It answers the id of the last event the client
// now has (the position of the snapshot, or the last replayed event).
func (w *sseWriter) start(h *streamHub, watch *lease.Watch, tabID string, first bool) (string, error) {
	if first {
		w.grab()
		w.buf = append(w.buf, "retry: "...)
		w.buf = strconv.AppendInt(w.buf, streamRetry.Milliseconds(), 10)
		w.buf = append(w.buf, "\n\n"...)
	}
	snap := snapshotJSON{
		leaseJSON: leaseView(watch.Snapshot, tabID),
		Tabs:      tabsView(watch.Tabs),
		Resumed:   watch.Resumed,
	}
	data, err := json.Marshal(snap)
	if err != nil {
		return "", err
	}
	id := watch.Position
	if watch.Resumed {
		id = "" // the replay carries the ids; the client's last id stays where it was until then
	}
	w.appendEvent(id, "snapshot", data)
	h.sent.WithLabelValues("snapshot").Inc()
	last := watch.Position
	for _, ev := range watch.Replay {
		data, err := eventData(ev)
		if err != nil {
			return "", err
		}
		w.appendEvent(ev.ID, ev.Type.Stream(), data)
		h.sent.WithLabelValues(ev.Type.Stream()).Inc()
		last = ev.ID
	}
	return last, w.flush()
}

func (w *sseWriter) event(h *streamHub, ev lease.Event) error {
	data, err := eventData(ev)
	if err != nil {
		return err
	}
	w.appendEvent(ev.ID, ev.Type.Stream(), data)
	h.sent.WithLabelValues(ev.Type.Stream()).Inc()
	return w.flush()
}

func (w *sseWriter) catalog(h *streamHub, version string) error {
	data, err := json.Marshal(catalogEventJSON{Version: version})
	if err != nil {
		return err
	}
	w.appendEvent("", "catalog", data)
	h.sent.WithLabelValues("catalog").Inc()
	return w.flush()
}

func (w *sseWriter) comment(text string) error {
	w.grab()
	w.buf = append(w.buf, ": "...)
	w.buf = append(w.buf, text...)
	w.buf = append(w.buf, "\n\n"...)
	return w.flush()
}

// shutdown writes the final event of a stream whose server closes, with a short, jittered
// reconnection delay.
func (w *sseWriter) shutdown(h *streamHub) error {
	retry := shutdownRetry + mrand.N(shutdownJitter)
	data, err := json.Marshal(shutdownJSON{Reason: "the server is shutting down; reconnect", RetryMs: retry.Milliseconds()})
	if err != nil {
		return err
	}
	w.grab()
	w.buf = append(w.buf, "retry: "...)
	w.buf = strconv.AppendInt(w.buf, retry.Milliseconds(), 10)
	w.buf = append(w.buf, '\n')
	w.appendEvent("", "shutdown", data)
	h.sent.WithLabelValues("shutdown").Inc()
	return w.flush()
}

// snapshotJSON is the data of `event: snapshot`: the lease object as GET …/lease answers it for the
// tab, the tabs connected, and whether the events that follow are a replay of what the client
// missed (already included in the snapshot).
type snapshotJSON struct {
	*leaseJSON
	Tabs    []tabJSON `json:"tabs"`
	Resumed bool      `json:"resumed"`
}

// leaseEventJSON is the data of `event: lease` (DESIGN §3).
type leaseEventJSON struct {
	Type      lease.EventType `json:"type"`
	SessionID string          `json:"sessionId"`
	Epoch     int64           `json:"epoch"`
	Holder    *holderJSON     `json:"holder"`   // null when nobody holds the lease after the change
	Previous  *previousJSON   `json:"previous"` // null when there was no holder before
	Reason    string          `json:"reason"`
	At        *string         `json:"at"`
	// Requester is the tab that asked for a handoff: on handoff_requested, and on the released or
	// expired event that reserved the lease for it. Absent otherwise.
	Requester *holderJSON `json:"requester,omitempty"`
}

type previousJSON struct {
	TabID string `json:"tabId"`
	Epoch int64  `json:"epoch"`
}

// tabsEventJSON is the data of `event: tabs`.
type tabsEventJSON struct {
	Type      lease.EventType `json:"type"` // joined or left
	SessionID string          `json:"sessionId"`
	Tab       tabJSON         `json:"tab"`
	Reason    string          `json:"reason,omitempty"` // "timeout" for a tab whose entry expired
	At        *string         `json:"at"`
}

type catalogEventJSON struct {
	Version string `json:"version"`
}

type shutdownJSON struct {
	Reason  string `json:"reason"`
	RetryMs int64  `json:"retryMs"`
}

// eventData renders the data of a lease or tabs event.
func eventData(ev lease.Event) ([]byte, error) {
	if ev.Type.Stream() == "tabs" {
		var tab tabJSON
		if ev.Tab != nil {
			tab = tabView(*ev.Tab)
		}
		return json.Marshal(tabsEventJSON{Type: ev.Type, SessionID: ev.Key.Session, Tab: tab, Reason: ev.Reason, At: timeView(ev.At)})
	}
	out := leaseEventJSON{Type: ev.Type, SessionID: ev.Key.Session, Epoch: ev.Epoch, Reason: ev.Reason, At: timeView(ev.At)}
	if ev.Holder != nil {
		out.Holder = holderView(*ev.Holder)
	}
	if ev.Previous != nil {
		out.Previous = &previousJSON{TabID: ev.Previous.TabID, Epoch: ev.Previous.Epoch}
	}
	if ev.Requester != nil {
		out.Requester = holderView(*ev.Requester)
	}
	return json.Marshal(out)
}

// initStreams sets up the event streams, presence and tickets from opts: Feed, Presence and
// Nonces default to the Engine when it implements them, and a Feed needs Nonces.
func (s *Server) initStreams(opts Options, now func() time.Time) error {
	sopts, err := opts.Streams.withDefaults()
	if err != nil {
		return err
	}
	feed := opts.Feed
	if feed == nil {
		feed, _ = opts.Engine.(lease.Feed)
	}
	presence := opts.Presence
	if presence == nil {
		presence, _ = opts.Engine.(lease.Presence)
	}
	s.presence = presence
	if feed == nil {
		return nil
	}
	nonces := opts.Nonces
	if nonces == nil {
		n, ok := opts.Engine.(lease.Nonces)
		if !ok {
			return errors.New("api: Options.Nonces is required when there is a Feed and the Engine is not a lease.Nonces")
		}
		nonces = n
	}
	s.tickets = newTicketBook(sopts.TicketSecret, opts.Auth.HS256Secret, nonces, now)
	s.streams, err = newStreamHub(feed, presence, sopts, s.catalogs, s.log, s.registry)
	if err != nil {
		return fmt.Errorf("api: Options.Registry: %w", err)
	}
	return nil
}

// registerStreams adds the event-stream routes when there is a Feed, and the presence routes (GET
// …/tabs, PUT and DELETE …/tabs/{tabId}) when there is a Presence.
func (s *Server) registerStreams(v1 *echo.Group, authed []echo.MiddlewareFunc) {
	if s.streams != nil {
		v1.GET("/sessions/:sid/events", s.events, s.authenticateStream, s.rateLimit)
		v1.POST("/sessions/:sid/events/ticket", s.issueTicket, authed...)
	}
	if s.presence != nil {
		v1.GET("/sessions/:sid/tabs", s.tabs, authed...)
		v1.PUT("/sessions/:sid/tabs/:tabId", s.putTab, authed...)
		v1.DELETE("/sessions/:sid/tabs/:tabId", s.deleteTab, authed...)
	}
}
