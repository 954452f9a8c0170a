// Package socket carries calls of the lease API over one kept WebSocket per client, GET
// /v1/socket (docs/DESIGN.md §3, "Lease socket"). A call message stands for an HTTP request
// of the API and is served by the very handler of its route (Config.Dispatch), so that its rules,
// answers, limits, logs and metrics are the route's own: the socket only saves what each HTTP
// request costs a connection (reading a request head, writing a response head, the wakeups of
// net/http's connection loop), about a third of what a renew costs a busy tablease (README "Cost
// per operation").
//
// One goroutine at a time serves a socket: it reads a message, serves it, writes its answer and
// reads the next, so that answers come in the order of the messages; a socket idle for a while
// waits in a new goroutine, with a small stack (run, in protocol.go; frames.go). The protocol
// (messages, answers, close codes) is in protocol.go.
package socket

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/gorilla/websocket"
	"github.com/prometheus/client_golang/prometheus"
)

// Defaults of Options.
const (
	DefaultPerUser      = 32
	DefaultPerInstance  = 10_000
	DefaultIdleTimeout  = 60 * time.Second
	DefaultAuthTimeout  = 10 * time.Second
	DefaultWriteTimeout = 10 * time.Second
	DefaultLinger       = 2 * time.Second
)

// Options bound the sockets of an instance; zero values are the defaults.
type Options struct {
	// PerUser bounds the sockets of one user (counted from their first auth message); one more
	// is refused with a *LimitError answer to that message.
	PerUser int
	// PerInstance bounds the open sockets of the instance; one more is refused before the
	// WebSocket handshake with a *LimitError.
	PerInstance int
	// IdleTimeout closes a socket that sent no message for that long (close code 1000, "idle").
	IdleTimeout time.Duration
	// AuthTimeout closes a socket whose first valid auth message did not arrive within that
	// long of its opening (close code 1008).
	AuthTimeout time.Duration
	// WriteTimeout closes a socket whose client did not take an answer within that long.
	WriteTimeout time.Duration
	// Linger is how long a socket waits for its next message in the goroutine that served its
	// last, before it lets go of that goroutine's stack and of its calls' buffers and waits in a
	// new goroutine (run, in protocol.go). Going idle costs a wake-up at the end of the linger, a
	// new goroutine and, at the next call, a stack grown and buffers made anew: set it longer than
	// the time between the calls of most clients (a tab's renews), so that their calls do not pay
	// it, and the sockets of clients that call less often wait with a small stack.
	Linger time.Duration
}

func (o Options) withDefaults() (Options, error) {
	if o.PerUser < 0 || o.PerInstance < 0 || o.IdleTimeout < 0 || o.AuthTimeout < 0 || o.WriteTimeout < 0 || o.Linger < 0 {
		return o, errors.New("socket: Options must not be negative")
	}
	if o.PerUser == 0 {
		o.PerUser = DefaultPerUser
	}
	if o.PerInstance == 0 {
		o.PerInstance = DefaultPerInstance
	}
	if o.IdleTimeout == 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.AuthTimeout == 0 {
		o.AuthTimeout = DefaultAuthTimeout
	}
	if o.WriteTimeout == 0 {
		o.WriteTimeout = DefaultWriteTimeout
	}
	if o.Linger == 0 {
		o.Linger = DefaultLinger
	}
	return o, nil
}

// Config is what a Handler needs of the API that it carries.
type Config struct {
	// Dispatch serves each call as the HTTP request it stands for. Required.
	Dispatch http.Handler
	// Verify checks the access token of an auth message of a socket opened from remote (the
	// handshake's RemoteAddr): it answers the user it names and until when it is valid, or the
	// error to answer the message with. Required.
	Verify func(ctx context.Context, token, remote string) (sub string, until time.Time, err error)
	// Decode decodes a message strictly, as the API decodes request bodies. When it refuses one,
	// it leaves in m.ID the message's id if the message gives one (once), for the answer to echo.
	// Required.
	Decode func(data []byte, m *Message) error
	// Answer renders an error as the API answers it: its status, its JSON body and the value of
	// its Retry-After header ("" without). It renders the errors of this package (*AuthError,
	// *LimitError, ErrClosing, lease.InvalidError) and those of Verify and Decode. Required.
	Answer func(err error) (status int, body []byte, retryAfter string)
	// CheckOrigin says whether a browser page of the request's Origin may open a socket; a
	// request without Origin (not a browser's) is not asked about. Required.
	CheckOrigin func(r *http.Request) bool
	// Logger receives a line when a socket ends for another reason than its client closing it;
	// nil discards.
	Logger *slog.Logger
	// Registerer receives the gauge of open sockets; nil registers nothing.
	Registerer prometheus.Registerer
	Options    Options
}

// Handler serves the sockets of an instance. Make it with New.
type Handler struct {
	cfg      Config
	opts     Options
	log      *slog.Logger
	upgrader websocket.Upgrader
	open     prometheus.Gauge

	mu      sync.Mutex
	sockets map[*socket]struct{}
	perUser map[string]int
	closing bool
	done    sync.WaitGroup
}

// New checks cfg and makes a Handler.
func New(cfg Config) (*Handler, error) {
	switch {
	case cfg.Dispatch == nil, cfg.Verify == nil, cfg.Decode == nil, cfg.Answer == nil, cfg.CheckOrigin == nil:
		return nil, errors.New("socket: Config.Dispatch, Verify, Decode, Answer and CheckOrigin are required")
	}
	opts, err := cfg.Options.withDefaults()
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := &Handler{cfg: cfg, opts: opts, log: log, sockets: map[*socket]struct{}{}, perUser: map[string]int{},
		open: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tablease_sockets_open", Help: "Lease sockets open on this instance (GET /v1/socket)."})}
	h.upgrader = websocket.Upgrader{
		ReadBufferSize:  readBufferSize,
		WriteBufferSize: writeBufferSize,
		// An idle socket holds no write buffer: it takes one from the pool for each answer.
		WriteBufferPool: &sync.Pool{},
		// Serve checks the origin before the handshake, to answer a refusal as the API does.
		CheckOrigin: func(*http.Request) bool { return true },
		// A handshake the upgrader refuses is answered by the API (Serve returns a *HandshakeError).
		Error: func(w http.ResponseWriter, _ *http.Request, _ int, _ error) {
			w.Header().Set("Sec-WebSocket-Version", "13")
		},
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(h.open); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// Buffers of a socket: a call message is a few hundred bytes, and gorilla/websocket reads a
// longer one through the buffer in pieces.
const (
	readBufferSize  = 1 << 10
	writeBufferSize = 2 << 10
)

// Serve upgrades r to a socket, served from then on by a goroutine of its own: the HTTP request
// is answered (101), and its handler may return. It answers an error, and does not upgrade, when
// the request is not a WebSocket handshake this server takes (*HandshakeError), or the instance
// has as many sockets as allowed (*LimitError) or is closing (ErrClosing).
func (h *Handler) Serve(w http.ResponseWriter, r *http.Request) error {
	if !websocket.IsWebSocketUpgrade(r) {
		return &HandshakeError{Status: http.StatusBadRequest, Reason: "GET /v1/socket opens a WebSocket: the request must ask to upgrade to websocket"}
	}
	if r.Header.Get("Origin") != "" && !h.cfg.CheckOrigin(r) {
		return &HandshakeError{Status: http.StatusForbidden, Reason: "pages of this origin may not open a socket (TABLEASE_CORS_ORIGINS)"}
	}
	s := &socket{h: h, remote: r.RemoteAddr, host: r.Host}
	if err := h.admit(s); err != nil {
		return err
	}
	hj := &hijacker{ResponseWriter: w}
	conn, err := h.upgrader.Upgrade(hj, r, nil)
	if err != nil {
		h.leave(s)
		var he websocket.HandshakeError
		if errors.As(err, &he) {
			return &HandshakeError{Status: http.StatusBadRequest, Reason: "the WebSocket handshake is not valid: " + he.Error()}
		}
		return &HandshakeError{Status: http.StatusBadRequest, Reason: "the connection cannot be taken over as a WebSocket"}
	}
	h.mu.Lock()
	s.conn = conn
	h.mu.Unlock()
	s.watched = hj.conn
	// The calls' context: net/http ends the request's when the handler returns, and a call runs
	// on the socket's goroutine, which ends only once it is answered.
	s.ctx = context.WithValue(context.WithoutCancel(r.Context()), carriedKey{}, true)
	s.start()
	return nil
}

// carriedKey marks the context of a call that a socket carries (Carried).
type carriedKey struct{}

// Carried reports whether ctx is the context of a call carried by a socket rather than of an HTTP
// request of its own: the API's request log says so.
func Carried(ctx context.Context) bool { return ctx.Value(carriedKey{}) != nil }

// admit counts s among the instance's sockets, unless it has as many as allowed or is closing.
func (h *Handler) admit(s *socket) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.closing:
		return ErrClosing
	case len(h.sockets) >= h.opts.PerInstance:
		return &LimitError{Limit: "instance", Max: h.opts.PerInstance}
	}
	h.sockets[s] = struct{}{}
	h.done.Add(1)
	h.open.Inc()
	return nil
}

// join counts s among the sockets of user, unless the user has as many as allowed.
func (h *Handler) join(s *socket, user string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.perUser[user] >= h.opts.PerUser {
		return &LimitError{Limit: "user", Max: h.opts.PerUser}
	}
	h.perUser[user]++
	s.user = user
	return nil
}

// leave forgets s.
func (h *Handler) leave(s *socket) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.sockets[s]; !ok {
		return
	}
	delete(h.sockets, s)
	if s.user != "" {
		if h.perUser[s.user]--; h.perUser[s.user] == 0 {
			delete(h.perUser, s.user)
		}
	}
	h.open.Dec()
	h.done.Done()
}

// Open is the number of sockets open on the instance.
func (h *Handler) Open() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.sockets)
}

// Close refuses new sockets and ends those open: each finishes the call it is serving, answers
// it, and closes with code 1001 (going away). It waits for them until ctx ends, then closes
// their connections. It may be called more than once.
func (h *Handler) Close(ctx context.Context) {
	h.mu.Lock()
	h.closing = true
	for s := range h.sockets {
		s.stop()
	}
	h.mu.Unlock()
	ended := make(chan struct{})
	go func() { h.done.Wait(); close(ended) }()
	select {
	case <-ended:
	case <-ctx.Done():
		h.mu.Lock()
		for s := range h.sockets {
			if s.conn != nil {
				_ = s.conn.Close()
			}
		}
		h.mu.Unlock()
		<-ended
	}
}

// ErrClosing refuses a socket while the instance shuts down.
var ErrClosing = errors.New("socket: the instance is shutting down")

// A LimitError refuses a socket, or a user's first auth message on it, beyond Options.PerInstance
// or Options.PerUser.
type LimitError struct {
	Limit string // "instance" or "user"
	Max   int
}

func (e *LimitError) Error() string {
	if e.Limit == "user" {
		return "this user has as many sockets open as allowed; close one (one socket per tab is enough)"
	}
	return "this instance has as many sockets open as allowed; retry later, or use HTTP"
}

// A HandshakeError refuses a request to open a socket before the handshake.
type HandshakeError struct {
	Status int // 400 or 403
	Reason string
}

func (e *HandshakeError) Error() string { return e.Reason }
