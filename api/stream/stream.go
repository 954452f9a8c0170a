// Package stream serves the event stream of a session: Server-Sent Events of its lease and tabs,
// resumable by event id, with the presence entry of the stream's tab, the single-use tickets that
// open a stream for an EventSource, and the limits and shutdown of the streams of an instance.
// Package api authenticates and decodes the requests, and renders the lease state of the events.
package stream

// GET /v1/sessions/{sid}/events is a stream of the session of the caller, DESIGN §3:
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
//	: keepalive                      every Options.Keepalive
//
// Every (re)connect starts with a snapshot. A connect that names the last event it saw and whose
// events the session's log still holds is a resume: the snapshot (state at the end of the replay,
// "resumed": true, without an id so the client's last id is unchanged) is followed by the missed
// events with their ids. Otherwise the snapshot carries the id of the log position it was read at,
// and nothing older follows.
//
// When the engine ends the watch with lease.ErrResync (the reader fell behind, or the Redis
// engine lost its Pub/Sub link), the stream watches again from the last id it sent and does as on
// a reconnect: a fresh snapshot, then the replay. Any other end of the watch ends the stream.
//
// Every write has a deadline (Options.WriteTimeout) and is flushed at once, so a client that
// stops reading cannot hold a goroutine longer than that. Handler.Close ends every stream with a
// final `event: shutdown` whose `retry:` is short and jittered, before the HTTP server shuts down.

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tablease/tablease/lease"
)

// Defaults of Options.
const (
	DefaultPerUser      = 32
	DefaultPerInstance  = 10_000
	DefaultKeepalive    = 15 * time.Second
	DefaultWriteTimeout = 10 * time.Second
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
	// leaveLaterFor bounds the attempts to remove the entry of a stream whose Join failed; it is
	// longer than lease.DefaultPresenceTTL, after which the entry has expired anyway.
	leaveLaterFor = 2 * time.Minute
	// rewatchFor bounds the attempts to watch again after lease.ErrResync; past it the stream ends
	// and the client reconnects.
	rewatchFor = 5 * time.Second
	// closeWaitExtra is how much longer than a write's deadline Close waits for streams.
	closeWaitExtra = presenceCallTimeout + time.Second
	// LimitRetryAfter is how long a client refused by a limit should wait (LimitError).
	LimitRetryAfter = 5 * time.Second
)

// Options bound and tune the streams. Zero values mean the defaults.
type Options struct {
	// PerUser bounds the open streams of one user on this instance (default DefaultPerUser); one
	// more is a *LimitError.
	PerUser int
	// PerInstance bounds the open streams of this instance (default DefaultPerInstance); one more
	// is a *LimitError.
	PerInstance int
	// Keepalive is the interval of the comment lines that keep idle connections open through
	// proxies (default DefaultKeepalive).
	Keepalive time.Duration
	// WriteTimeout bounds each write to a stream (default DefaultWriteTimeout): a client that does
	// not read for that long loses its stream.
	WriteTimeout time.Duration
	// TicketSecret is the HMAC key of event tickets (see tickets.go), at least MinTicketSecretLen
	// bytes; every instance sharing a store must have the same. Nil: a key derived from
	// Config.HS256Secret, or, without one, a key generated for this process (then tickets work on
	// this instance only).
	TicketSecret []byte
}

// KeepaliveInterval is Keepalive, or DefaultKeepalive when it is zero: what the snapshot tells
// clients, so that one that hears nothing for longer takes its stream for stalled.
func (o Options) KeepaliveInterval() time.Duration {
	if o.Keepalive == 0 {
		return DefaultKeepalive
	}
	return o.Keepalive
}

func (o Options) withDefaults() (Options, error) {
	switch {
	case o.PerUser < 0:
		return o, errors.New("stream: Options.PerUser must not be negative")
	case o.PerInstance < 0:
		return o, errors.New("stream: Options.PerInstance must not be negative")
	case o.Keepalive < 0:
		return o, errors.New("stream: Options.Keepalive must not be negative")
	case o.WriteTimeout < 0:
		return o, errors.New("stream: Options.WriteTimeout must not be negative")
	case o.TicketSecret != nil && len(o.TicketSecret) < MinTicketSecretLen:
		return o, errors.New("stream: Options.TicketSecret must be at least 32 bytes")
	}
	if o.PerUser == 0 {
		o.PerUser = DefaultPerUser
	}
	if o.PerInstance == 0 {
		o.PerInstance = DefaultPerInstance
	}
	if o.Keepalive == 0 {
		o.Keepalive = o.KeepaliveInterval()
	}
	if o.WriteTimeout == 0 {
		o.WriteTimeout = DefaultWriteTimeout
	}
	return o, nil
}

// Views render the data of the events that carry lease state, so that a snapshot is the lease
// object exactly as the rest of the API answers it.
type Views interface {
	// Snapshot renders the data of `event: snapshot` of w for the tab tabID.
	Snapshot(w *lease.Watch, tabID string) ([]byte, error)
	// Event renders the data of a lease or tabs event.
	Event(ev lease.Event) ([]byte, error)
}

// WatchCatalog calls changed with the new version whenever the tool catalog served changes, until
// stop is called; changed must not block.
type WatchCatalog func(changed func(version string)) (stop func())

// Config is what a Handler depends on.
type Config struct {
	Feed     lease.Feed     // required
	Presence lease.Presence // required
	Nonces   Nonces         // required: makes tickets single use
	Views    Views          // required
	Catalog  WatchCatalog   // required
	// HS256Secret, when Options.TicketSecret is nil, is what the ticket key is derived from.
	HS256Secret []byte
	// Now is the clock of tickets; default time.Now.
	Now func() time.Time
	// Logger receives what goes wrong with streams; nil discards.
	Logger *slog.Logger
	// Registerer receives the metrics of the streams. Required.
	Registerer prometheus.Registerer
	// StoreCall is told of every call of op to the store ("watch", "join", "new_nonce",
	// "use_nonce") with its error, nil when it succeeded; nil ignores them.
	StoreCall func(op string, err error)
	Options   Options
}

// Handler serves the event streams of an instance: it enforces the limits, tells the streams of
// catalog changes, issues and redeems tickets, and ends every stream on Close.
type Handler struct {
	feed      lease.Feed
	presence  lease.Presence
	views     Views
	catalog   WatchCatalog
	opts      Options
	log       *slog.Logger
	storeCall func(op string, err error)
	tickets   *ticketBook

	open    prometheus.Gauge
	refused *prometheus.CounterVec // reason
	ended   [len(endReasons)]prometheus.Counter
	sent    *sentCounters

	closing chan struct{}  // closed by Close: every stream sends its final event and ends
	running sync.WaitGroup // one per stream admitted

	mu      sync.Mutex // protects the fields below
	streams map[*stream]struct{}
	perUser map[string]int
	closed  bool
	// catalogVersion is the last catalog version announced; stopCatalog stops the catalog watch,
	// which runs while any stream is open (nil otherwise).
	catalogVersion string
	stopCatalog    func()
}

// New checks cfg and makes a Handler.
func New(cfg Config) (*Handler, error) {
	opts, err := cfg.Options.withDefaults()
	switch {
	case err != nil:
		return nil, err
	case cfg.Feed == nil:
		return nil, errors.New("stream: Config.Feed is required")
	case cfg.Presence == nil:
		return nil, errors.New("stream: Config.Presence is required")
	case cfg.Nonces == nil:
		return nil, errors.New("stream: Config.Nonces is required")
	case cfg.Views == nil:
		return nil, errors.New("stream: Config.Views is required")
	case cfg.Catalog == nil:
		return nil, errors.New("stream: Config.Catalog is required")
	case cfg.Registerer == nil:
		return nil, errors.New("stream: Config.Registerer is required")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	storeCall := cfg.StoreCall
	if storeCall == nil {
		storeCall = func(string, error) {}
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	h := &Handler{
		feed: cfg.Feed, presence: cfg.Presence, views: cfg.Views, catalog: cfg.Catalog,
		opts: opts, log: log, storeCall: storeCall,
		tickets: newTicketBook(opts.TicketSecret, cfg.HS256Secret, cfg.Nonces, now),
		open: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tablease_event_streams",
			Help: "Event streams open on this instance.",
		}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tablease_event_streams_refused_total",
			Help: "Event streams refused, by reason (user_limit, instance_limit, too_many_tabs, closing).",
		}, []string{"reason"}),
		closing: make(chan struct{}),
		streams: make(map[*stream]struct{}),
		perUser: make(map[string]int),
	}
	sent := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tablease_events_sent_total",
		Help: "Events written to event streams, by event (snapshot, lease, tabs, catalog, shutdown).",
	}, []string{"event"})
	ended := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tablease_event_streams_ended_total",
		Help: "Event streams ended, by reason (client_gone, write_failed, shutdown, token_expired, store, panic, key_withdrawn).",
	}, []string{"reason"})
	for i, r := range endReasons {
		h.ended[i] = ended.WithLabelValues(r)
	}
	for _, c := range []prometheus.Collector{h.open, h.refused, sent, ended} {
		if err := cfg.Registerer.Register(c); err != nil {
			return nil, err
		}
	}
	for _, r := range []string{"user_limit", "instance_limit", "too_many_tabs", "closing"} {
		h.refused.WithLabelValues(r)
	}
	h.sent = newSentCounters(sent)
	return h, nil
}

// sentCounters count the events written, by event name; the writer of every stream shares them.
type sentCounters struct {
	snapshot, lease, tabs, catalog, shutdown prometheus.Counter
}

func newSentCounters(v *prometheus.CounterVec) *sentCounters {
	return &sentCounters{
		snapshot: v.WithLabelValues("snapshot"),
		lease:    v.WithLabelValues("lease"),
		tabs:     v.WithLabelValues("tabs"),
		catalog:  v.WithLabelValues("catalog"),
		shutdown: v.WithLabelValues("shutdown"),
	}
}

// event counts one event of a lease or tabs stream name (lease.EventType.Stream).
func (c *sentCounters) event(name string) {
	if name == "tabs" {
		c.tabs.Inc()
	} else {
		c.lease.Inc()
	}
}

// ErrClosing refuses a stream while the handler closes: the client should reconnect, to another
// instance.
var ErrClosing = errors.New("stream: this instance is shutting down; reconnect")

// LimitError refuses a stream beyond a limit: Limit is "user" or "instance", Max its value.
type LimitError struct {
	Limit string
	Max   int
}

func (e *LimitError) Error() string {
	if e.Limit == "user" {
		return "this user has as many event streams open as allowed; close one (one stream per browser profile is enough)"
	}
	return "this instance serves as many event streams as it may"
}

// stream is what the handler knows of one open stream.
type stream struct {
	user string
	// wake has the stream look at its news and at the handler's closing; it never blocks.
	wake func()
	news atomic.Uint32 // newsCatalog | newsGone
	// closer ends the stream's connection when it outlives Close's wait (see hijack.go); nil while
	// net/http serves it. Protected by Handler.mu.
	closer interface{ Close() error }
	// hangup is the stream's registration in the process's watch of disconnects
	// (hangup_linux.go), set when it is taken over; 0 for none.
	hangup uint64
}

// News of a stream (stream.news).
const (
	newsCatalog uint32 = 1 << iota // the catalog version changed since the stream last looked
	newsGone                       // the client went away; it stays
)

// tell adds news for st and wakes it. It never blocks.
func (st *stream) tell(news uint32) {
	st.news.Or(news)
	st.wake()
}

// gone reports whether the client went away.
func (st *stream) gone() bool { return st.news.Load()&newsGone != 0 }

// admit opens st, a stream of user whose wake is set, or refuses it with *LimitError beyond a
// limit (ErrClosing while the handler closes). The caller must call leave once the stream has
// ended.
func (h *Handler) admit(st *stream) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.closed:
		h.refused.WithLabelValues("closing").Inc()
		return ErrClosing
	case len(h.streams) >= h.opts.PerInstance:
		h.refused.WithLabelValues("instance_limit").Inc()
		return &LimitError{Limit: "instance", Max: h.opts.PerInstance}
	case h.perUser[st.user] >= h.opts.PerUser:
		h.refused.WithLabelValues("user_limit").Inc()
		return &LimitError{Limit: "user", Max: h.opts.PerUser}
	}
	h.streams[st] = struct{}{}
	h.perUser[st.user]++
	h.running.Add(1)
	h.open.Inc()
	if h.stopCatalog == nil {
		h.stopCatalog = h.catalog(h.catalogChanged)
	}
	return nil
}

// leave forgets st, which has ended.
func (h *Handler) leave(st *stream) {
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

// catalogChanged is the catalog watcher: it records the version and nudges every stream. It never
// blocks.
func (h *Handler) catalogChanged(version string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.catalogVersion = version
	for st := range h.streams {
		st.tell(newsCatalog)
	}
}

func (h *Handler) catalogNow() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.catalogVersion
}

// Open is the number of streams open.
func (h *Handler) Open() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.streams)
}

// Close makes every stream send its final event and end, refuses new ones (ErrClosing), and waits
// until they have ended: at most a write deadline and a presence call, plus a second, or until ctx
// ends. Streams still open then have their connections closed. Call it before
// http.Server.Shutdown, which never ends a stream by itself. It may be called more than once.
func (h *Handler) Close(ctx context.Context) {
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
		return
	case <-t.C:
	case <-ctx.Done():
	}
	// http.Server.Shutdown does not know connections taken from it: end them here. (With a
	// context already done, as a shutdown timeout of 0 makes it, there may be none left.)
	h.mu.Lock()
	if len(h.streams) > 0 {
		h.log.Warn("event streams did not all end in time at close", "streams", len(h.streams))
	}
	for st := range h.streams {
		if st.closer != nil {
			_ = st.closer.Close()
		}
	}
	h.mu.Unlock()
}
