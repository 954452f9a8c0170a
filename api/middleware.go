package api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/tablease/tablease/api/socket"
)

// Keys of values stored in the Echo context.
const (
	keyErrCode  = "tablease.errCode"
	keyErrCause = "tablease.errCause"
	// keyQuietRefusal is set on a request a rate limit refused that is logged at debug only: every
	// refusal of the per-address limit, and those of a user's limits but the first of a streak.
	keyQuietRefusal = "tablease.quietRefusal"
)

// maxLoggedLen bounds the path of a request in a log line.
const maxLoggedLen = 256

// loggedPath is the path of req as it goes into a log line: percent-encoded (the client's own
// spelling when that is valid percent-encoding, else every byte that a path may not hold as it is,
// non-ASCII and control bytes included, %-escaped), so that it holds only printable ASCII whichever
// handler writes it (JSON escapes only what JSON needs: U+0085, U+202E or DEL would go out raw),
// and cut at maxLoggedLen bytes, before an escape it would split, with "..." and the length it
// had, so that a client cannot make one log line as large as its request.
func loggedPath(req *http.Request) string {
	p := req.URL.EscapedPath()
	if len(p) <= maxLoggedLen {
		return p
	}
	cut := maxLoggedLen
	if i := strings.LastIndexByte(p[:cut], '%'); i >= cut-2 {
		cut = i // "%X" or "%": the escape would be split
	}
	return p[:cut] + "...(" + strconv.Itoa(len(p)) + " bytes)"
}

const maxRequestIDLen = 128

// headerRequestID is X-Request-ID as net/http keeps it in a header (canonical): a header read or
// written by this name directly is not canonicalized first, which allocates for this one.
const headerRequestID = "X-Request-Id"

// requestID is the id of the request being served: what observe put in its answer's header (""
// outside observe).
func requestID(c echo.Context) string {
	if id := c.Response().Header()[headerRequestID]; len(id) > 0 {
		return id[0]
	}
	return ""
}

// saneRequestID accepts a client's X-Request-ID when it is short and made of harmless characters,
// so that it can go into logs and headers as it is.
func saneRequestID(id string) bool {
	if id == "" || len(id) > maxRequestIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '-' || c == '_' || c == '.' || c == ':':
		default:
			return false
		}
	}
	return true
}

// NewRequestID is a request id as the server makes one: 32 hex digits from crypto/rand.
func NewRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

var knownMethods = map[string]bool{
	http.MethodGet: true, http.MethodHead: true, http.MethodPost: true, http.MethodPut: true,
	http.MethodPatch: true, http.MethodDelete: true, http.MethodOptions: true,
	http.MethodConnect: true, http.MethodTrace: true,
}

// routeLabel is the route pattern of the request for metrics and logs, "unmatched" for a 404 or
// 405, so that label values stay bounded whatever paths clients send, or "protocol_error" for the
// preface of HTTP/2, as for the other requests that are not HTTP/1.1 (see ProtocolErrors).
func (s *Server) routeLabel(c echo.Context) string {
	if h2Preface(c.Request()) {
		return routeProtocolError
	}
	p := c.Path()
	if s.routeSet[route{c.Request().Method, p}] {
		return p
	}
	return "unmatched"
}

func methodLabel(m string) string {
	if knownMethods[m] {
		return m
	}
	return methodOther
}

// h2Preface reports whether req is the preface of HTTP/2 with prior knowledge, which net/http
// hands on as a request of the method PRI: it is not valid HTTP/1.1, the one protocol served
// without TLS.
func h2Preface(req *http.Request) bool { return req.Method == "PRI" && req.RequestURI == "*" }

// nosniff is the value of X-Content-Type-Options on every answer, one slice for all (Header.Set
// would make one per answer).
var nosniff = []string{"nosniff"}

// served is the context of a request that the middlewares and handlers inside observe get: Echo's,
// with the request's verified caller (principalOf) and the tab of its event ticket, if any, in
// fields rather than in Echo's store, a map that Echo makes for each request that sets a value
// (two allocations; the other values, of refusals and errors, go there still).
type served struct {
	echo.Context
	principal *Principal
	ticketTab string // the tab an event ticket was issued for (redeemTicket)
}

// observe is the outermost middleware: it assigns the request id, turns panics into 500s, lets
// the error handler answer errors, and then logs the request and counts it. It never logs the
// Authorization header or the query string.
func (s *Server) observe(next echo.HandlerFunc) echo.HandlerFunc {
	return func(ec echo.Context) error {
		c := &served{Context: ec}
		start := time.Now()
		s.metrics.inFlight.Inc()
		req := c.Request()
		var id string
		if ids := req.Header[headerRequestID]; len(ids) > 0 && saneRequestID(ids[0]) {
			id = ids[0]
		} else {
			id = NewRequestID()
		}
		h := c.Response().Header()
		h[headerRequestID] = []string{id}
		h[echo.HeaderXContentTypeOptions] = nosniff

		if h2Preface(req) {
			h.Set(echo.HeaderConnection, "close")
			c.Error(errInvalid("HTTP/2 without TLS (prior knowledge) is not served: use HTTP/1.1"))
		} else if err := callRecovering(next, c); err != nil {
			c.Error(s.limitFailure(c, err)) // s.handleError writes the answer
		}
		s.logRequest(c, id, start)
		s.metrics.inFlight.Dec()
		return nil
	}
}

// logRequest logs and counts a request that has been answered. It is a function of its own so
// that its locals are not on the stack while the request runs (an idle event stream's stack is
// then small enough to shrink).
func (s *Server) logRequest(c echo.Context, id string, start time.Time) {
	req := c.Request()
	status := c.Response().Status
	route := s.routeLabel(c)
	method := methodLabel(req.Method)
	elapsed := time.Since(start)
	s.metrics.requests.WithLabelValues(route, method, strconv.Itoa(status)).Inc()
	s.metrics.duration.WithLabelValues(route, method).Observe(elapsed.Seconds())

	level := slog.LevelInfo
	switch {
	// A 5xx is a warning, but for the token's AUTH_UNAVAILABLE (a kid made up, or keys the fetch
	// logs about) and an answer to a client that went away, which nobody reads.
	case status >= 500 && c.Get(keyErrCode) != CodeAuthUnavailable && req.Context().Err() == nil:
		level = slog.LevelWarn
	case c.Get(keyQuietRefusal) != nil:
		level = slog.LevelDebug // a flood from one address or user leaves at most its burst in the log
	case status < 400 && s.failedOnly:
		level = slog.LevelDebug
	}
	if !s.log.Enabled(req.Context(), level) {
		return // no attribute is built for a line that would be dropped
	}
	attrs := []slog.Attr{
		slog.String("request_id", id),
		slog.String("method", method),
		slog.String("route", route),
		slog.String("path", loggedPath(req)),
		slog.String("peer", peerHost(req.RemoteAddr)),
		slog.Int("status", status),
		slog.Float64("duration_ms", float64(elapsed.Microseconds())/1000),
	}
	if p := principalOf(c); p != nil {
		attrs = append(attrs, slog.String("sub", p.Sub))
	}
	if socket.Carried(req.Context()) {
		attrs = append(attrs, slog.Bool("socket", true))
	}
	if code, ok := c.Get(keyErrCode).(string); ok {
		attrs = append(attrs, slog.String("code", code))
	}
	if cause, ok := c.Get(keyErrCause).(string); ok {
		attrs = append(attrs, slog.String("error", cause))
	}
	s.log.LogAttrs(req.Context(), level, "request", attrs...)
}

// peerHost is the host of a request's RemoteAddr (the peer of the connection: behind a proxy, the
// proxy), or the address as it is when it has no port.
func peerHost(addr string) string {
	if host, _, err := net.SplitHostPort(addr); err == nil {
		return host
	}
	return addr
}

// callRecovering runs h and turns a panic into an INTERNAL error (http.ErrAbortHandler is
// re-panicked, as net/http expects).
func callRecovering(h echo.HandlerFunc, c echo.Context) (err error) {
	defer func() {
		if r := recover(); r != nil {
			if r == http.ErrAbortHandler {
				panic(r)
			}
			err = &Error{Code: CodeInternal, Message: "internal error", Err: fmt.Errorf("panic: %v\n%s", r, debug.Stack())}
		}
	}()
	return h(c)
}

// rateLimit limits requests per user (the token's sub); it runs after authenticate and before
// every other check of the request (its session, its scope), so that refused requests count too.
func (s *Server) rateLimit(next echo.HandlerFunc) echo.HandlerFunc {
	return limitUsers(s.limiter, "requests", next)
}

// rateLimitChecks is rateLimit for POST …/lease/check, which has a bucket of its own per user:
// app backends' guards in strict mode send one for each write a tab makes, with the user's access
// token, and a burst of writes must not leave the user's tabs without the renews that keep their
// lease.
func (s *Server) rateLimitChecks(next echo.HandlerFunc) echo.HandlerFunc {
	return limitUsers(s.checkLimiter, "checks", next)
}

// limitUsers charges each request with a principal to its user's bucket in l, named limit.
func limitUsers(l *userLimiter, limit string, next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if p := principalOf(c); p != nil {
			if err := charge(c, l, p.Sub, limit); err != nil {
				return err
			}
		}
		return next(c)
	}
}

// chargeUser takes a token of sub's bucket of requests for c, and answers 429 RATE_LIMITED when it
// has none.
func (s *Server) chargeUser(c echo.Context, sub string) error {
	return charge(c, s.limiter, sub, "requests")
}

// charge takes a token of sub's bucket in l (none when nil) for c, and answers 429 RATE_LIMITED
// naming limit when it has none. Of a streak of refusals only the first is logged at info: a user
// (or a client of theirs in a loop) sending on leaves its burst and that line in the log.
func charge(c echo.Context, l *userLimiter, sub, limit string) error {
	if l == nil {
		return nil
	}
	if ok, wait, first := l.allow(sub); !ok {
		if !first {
			c.Set(keyQuietRefusal, true)
		}
		return rateLimited("too many requests for this user; retry after the Retry-After delay", limit, wait)
	}
	return nil
}

// limitFailure charges the per-address limit (Options.IPRateLimit) for a request that failed
// authentication (401) or, without a valid token, matched no route (404, 405), and answers 429
// RATE_LIMITED instead of err once the address has no token left. Requests with a valid token
// never use the address's bucket: a valid token passes whatever other clients behind the same
// address (a NAT, a proxy) did; one of no route is charged to its user's bucket instead, like
// every request with a valid token. (A request of no route has not been authenticated: its
// token, if any, is verified here.)
func (s *Server) limitFailure(c echo.Context, err error) error {
	switch errorFor(err).Code {
	case CodeUnauthenticated, CodeAuthUnavailable: // made-up kids answer the latter
	case CodeNotFound, CodeMethodNotAllowed:
		if principalOf(c) != nil {
			return err // authenticated by its route, and charged by rateLimit
		}
		if p, perr := s.principal(c.Request()); perr == nil {
			if limited := s.chargeUser(c, p.Sub); limited != nil {
				return limited
			}
			return err
		}
	default:
		return err
	}
	if limited := s.chargeAddress(c.Request().RemoteAddr); limited != nil {
		c.Set(keyQuietRefusal, true)
		return limited
	}
	return err
}

// chargeAddress charges a failed authentication to the per-address limit of the peer remote (a
// request's RemoteAddr), and answers 429 RATE_LIMITED once the address has no token left; nil
// while it has, and when the limit is off.
func (s *Server) chargeAddress(remote string) *Error {
	if s.ipLimit == nil {
		return nil
	}
	ok, wait, _ := s.ipLimit.allow(clientKey(remote))
	if ok {
		return nil
	}
	return rateLimited("too many failed or unauthenticated requests from this address; retry after the Retry-After delay", "ip", wait)
}

func contextWithTimeout(c echo.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(c.Request().Context(), d)
}
