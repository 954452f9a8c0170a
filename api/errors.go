package api

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/owner/catalog"
)

// Error codes of DESIGN §3, plus METHOD_NOT_ALLOWED for 405 and the two preconditions of
// PUT /v1/admin/catalog.
const (
	CodeInvalidArgument  = "INVALID_ARGUMENT"
	CodeUnauthenticated  = "UNAUTHENTICATED"
	CodeForbidden        = "FORBIDDEN"
	CodeNotFound         = "NOT_FOUND"
	CodeMethodNotAllowed = "METHOD_NOT_ALLOWED"
	CodeLeaseHeld        = "LEASE_HELD"
	CodeLeaseLost        = "LEASE_LOST"
	CodeHandoffPending   = "HANDOFF_PENDING"
	CodeSessionBlocked   = "SESSION_BLOCKED"
	// CodeTooManySessions (409): the user has state for as many sessions as
	// TABLEASE_SESSIONS_PER_USER allows, and the call would add one.
	CodeTooManySessions = "TOO_MANY_SESSIONS"
	// CodeTooManyTabs (409): the session's presence list holds lease.MaxPresence connections and
	// this one is new; details.limit.
	CodeTooManyTabs = "TOO_MANY_TABS"
	// CodeTabGone (409): an acquire of a tab that said it is gone (a release with gone: true)
	// within lease.GoneWindow.
	CodeTabGone = "TAB_GONE"
	// CodePreconditionFailed (412): If-Match names a version that is no longer current.
	CodePreconditionFailed = "PRECONDITION_FAILED"
	// CodePreconditionRequired (428): a conditional write came without If-Match.
	CodePreconditionRequired = "PRECONDITION_REQUIRED"
	CodePayloadTooLarge      = "PAYLOAD_TOO_LARGE"
	CodeHeadersTooLarge      = "HEADERS_TOO_LARGE" // 431: headers over MaxHeaderBytes (ProtocolErrors)
	// CodeRequestTimeout (408): the request body did not arrive within the server's read timeout.
	CodeRequestTimeout = "REQUEST_TIMEOUT"
	// CodeExpectationFailed (417): an Expect header other than 100-continue (ProtocolErrors).
	CodeExpectationFailed = "EXPECTATION_FAILED"
	CodeRateLimited       = "RATE_LIMITED"
	CodeStoreUnavailable  = "STORE_UNAVAILABLE"
	// CodeAuthUnavailable (503): the key of the access token cannot be had now from
	// TABLEASE_JWT_JWKS_URL (not fetched yet, or the set may not be fetched again yet).
	CodeAuthUnavailable = "AUTH_UNAVAILABLE"
	CodeInternal        = "INTERNAL"
)

// Codes maps every error code to its HTTP status. Read it; never modify it.
var Codes = map[string]int{
	CodeInvalidArgument:      http.StatusBadRequest,
	CodeUnauthenticated:      http.StatusUnauthorized,
	CodeForbidden:            http.StatusForbidden,
	CodeNotFound:             http.StatusNotFound,
	CodeMethodNotAllowed:     http.StatusMethodNotAllowed,
	CodeLeaseHeld:            http.StatusConflict,
	CodeLeaseLost:            http.StatusConflict,
	CodeHandoffPending:       http.StatusConflict,
	CodeSessionBlocked:       http.StatusLocked,
	CodeTooManySessions:      http.StatusConflict,
	CodeTooManyTabs:          http.StatusConflict,
	CodeTabGone:              http.StatusConflict,
	CodePreconditionFailed:   http.StatusPreconditionFailed,
	CodePreconditionRequired: http.StatusPreconditionRequired,
	CodePayloadTooLarge:      http.StatusRequestEntityTooLarge,
	CodeHeadersTooLarge:      http.StatusRequestHeaderFieldsTooLarge,
	CodeRequestTimeout:       http.StatusRequestTimeout,
	CodeExpectationFailed:    http.StatusExpectationFailed,
	CodeRateLimited:          http.StatusTooManyRequests,
	CodeStoreUnavailable:     http.StatusServiceUnavailable,
	CodeAuthUnavailable:      http.StatusServiceUnavailable,
	CodeInternal:             http.StatusInternalServerError,
}

// Error is an error answer: it becomes {"error": {code, message, retryable, details}} with the
// status of its code. Handlers and middleware return it; the error handler writes it.
type Error struct {
	Code      string
	Message   string
	Retryable bool
	Details   map[string]any
	// RetryAfter, when positive, is sent as a Retry-After header (whole seconds, rounded up).
	RetryAfter time.Duration
	// Err is the cause, for the log of internal and store errors; never sent.
	Err error
}

func (e *Error) Error() string {
	if e.Err != nil {
		return e.Code + ": " + e.Message + ": " + e.Err.Error()
	}
	return e.Code + ": " + e.Message
}

// Unwrap exposes the cause.
func (e *Error) Unwrap() error { return e.Err }

// Status is the HTTP status of e's code (500 for an unknown code).
func (e *Error) Status() int {
	if s, ok := Codes[e.Code]; ok {
		return s
	}
	return http.StatusInternalServerError
}

func errInvalid(format string) *Error {
	return &Error{Code: CodeInvalidArgument, Message: format}
}

// domainErrors is the one table from domain errors to answers: handlers return the errors of the
// lease and catalog packages as they are, and errorFor answers them from here. The details come
// from the typed errors in errorFor.
var domainErrors = []struct {
	target    error
	code      string
	retryable bool
	message   string
}{
	{lease.ErrInvalid, CodeInvalidArgument, false, "invalid argument"},
	{lease.ErrHeld, CodeLeaseHeld, false, "another tab holds the lease"},
	{lease.ErrLost, CodeLeaseLost, false, "this tab no longer holds the lease at this epoch"},
	{lease.ErrHandoffPending, CodeHandoffPending, true, "a handoff is in progress: the holder was asked to let go, or the lease is reserved for the tab that asked"},
	{lease.ErrBlocked, CodeSessionBlocked, true, "grants for this session are blocked"},
	{lease.ErrTooManySessions, CodeTooManySessions, false, "this user has as many sessions as allowed; a session is forgotten ten minutes after its last use"},
	{lease.ErrTabGone, CodeTabGone, true, "this tab said it is gone (a release with gone: true), and gets no lease until its window ends (details.retryAfterMs); a new page load has a new tab id"},
	{lease.ErrTooManyTabs, CodeTooManyTabs, false, "this session lists as many tab connections as allowed; an entry lapses when its tab stops refreshing it"},
	{lease.ErrNotReplicated, CodeStoreUnavailable, true, "the revoke took effect on the Redis primary, but fewer of its replicas than TABLEASE_REVOKE_REPLICAS confirmed it in time, and a failover could undo it: retry; with the same X-Request-ID the retry answers as this revoke did once they confirm it (without one it answers that nothing is left to revoke)"},
	{lease.ErrUnavailable, CodeStoreUnavailable, true, "the lease store is unavailable; retry shortly"},
	{lease.ErrVersionMismatch, CodePreconditionFailed, false, "the document changed since the version the request names"},
	{catalog.ErrTooLarge, CodePayloadTooLarge, false, "the catalog is larger than 1 MiB once normalized"},
}

// retryAfterMs is d for details.retryAfterMs: whole milliseconds, rounded up like the Retry-After
// header's seconds, so that a client that waits that long finds the wait over (a wait under a
// millisecond, as a fast rate limit gives, would otherwise read 0: retry at once).
func retryAfterMs(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// rateLimited is the 429 RATE_LIMITED of a limit (details.limit) that asks for a wait: retryable,
// with the wait as Retry-After and details.retryAfterMs.
func rateLimited(message, limit string, wait time.Duration) *Error {
	return &Error{
		Code:       CodeRateLimited,
		Message:    message,
		Retryable:  true,
		Details:    map[string]any{"retryAfterMs": retryAfterMs(wait), "limit": limit},
		RetryAfter: wait,
	}
}

// storeRetryAfter is the Retry-After sent with STORE_UNAVAILABLE.
const storeRetryAfter = time.Second

// errorFor turns any error into the answer to send. Unknown errors are INTERNAL.
func errorFor(err error) *Error {
	var ae *Error
	if errors.As(err, &ae) {
		return ae
	}
	for _, row := range domainErrors {
		if !errors.Is(err, row.target) {
			continue
		}
		out := &Error{Code: row.code, Message: row.message, Retryable: row.retryable, Err: err}
		var (
			inv   *lease.InvalidError
			held  *lease.HeldError
			lost  *lease.LostError
			retry *lease.RetryError
			vm    *lease.VersionMismatchError
			limit *lease.SessionLimitError
			tabs  *lease.TabLimitError
			repl  *lease.ReplicationError
		)
		switch {
		case errors.As(err, &inv):
			out.Message = inv.Field + " " + inv.Reason
			out.Details = map[string]any{"field": inv.Field}
		case errors.As(err, &held):
			out.Details = map[string]any{
				"holder":      holderView(held.Holder),
				"epoch":       held.Epoch,
				"remainingMs": held.Remaining.Milliseconds(),
			}
		case errors.As(err, &lost):
			var holder any // JSON null when free
			if lost.Current.Held {
				holder = holderView(lost.Current.Holder)
			}
			out.Details = map[string]any{"holder": holder, "epoch": lost.Current.Epoch}
		case errors.As(err, &retry):
			out.Details = map[string]any{"retryAfterMs": retryAfterMs(retry.RetryAfter)}
			out.RetryAfter = retry.RetryAfter
		case errors.As(err, &vm):
			out.Details = map[string]any{"version": vm.Current}
		case errors.As(err, &limit):
			out.Details = map[string]any{"limit": limit.Limit}
		case errors.As(err, &tabs):
			out.Details = map[string]any{"limit": tabs.Limit}
		case errors.As(err, &repl):
			out.Details = map[string]any{"replicas": repl.Acked, "wanted": repl.Wanted}
		}
		if row.code == CodeStoreUnavailable {
			out.RetryAfter = storeRetryAfter
		}
		return out
	}
	var he *echo.HTTPError
	if errors.As(err, &he) {
		return fromEchoError(he)
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return tooLarge()
	}
	return &Error{Code: CodeInternal, Message: "internal error", Err: err}
}

func tooLarge() *Error {
	return &Error{Code: CodePayloadTooLarge, Message: "request body is larger than 16 KiB"}
}

// headersTooLarge is the answer to a request line and headers over 16 KiB (maxHeadSize).
func headersTooLarge() *Error {
	return &Error{Code: CodeHeadersTooLarge, Message: "the request line and headers are larger than 16 KiB"}
}

// fromEchoError maps the errors Echo itself returns (router 404/405, middleware). Echo's shared
// error values are only read, never modified.
func fromEchoError(he *echo.HTTPError) *Error {
	switch he.Code {
	case http.StatusNotFound:
		return &Error{Code: CodeNotFound, Message: "no such route"}
	case http.StatusMethodNotAllowed:
		return &Error{Code: CodeMethodNotAllowed, Message: "method not allowed on this route"}
	case http.StatusRequestEntityTooLarge:
		return tooLarge()
	case http.StatusUnauthorized:
		return &Error{Code: CodeUnauthenticated, Message: "authentication required"}
	case http.StatusForbidden:
		return &Error{Code: CodeForbidden, Message: "forbidden"}
	case http.StatusTooManyRequests:
		return &Error{Code: CodeRateLimited, Message: "too many requests", Retryable: true, RetryAfter: time.Second}
	case http.StatusServiceUnavailable:
		return &Error{Code: CodeStoreUnavailable, Message: "service unavailable", Retryable: true, RetryAfter: storeRetryAfter}
	}
	if he.Code >= 400 && he.Code < 500 {
		return &Error{Code: CodeInvalidArgument, Message: "bad request"}
	}
	return &Error{Code: CodeInternal, Message: "internal error", Err: he}
}

type errorBody struct {
	Error errorJSON `json:"error"`
}

type errorJSON struct {
	Code      string         `json:"code"`
	Message   string         `json:"message"`
	Retryable bool           `json:"retryable"`
	Details   map[string]any `json:"details"`
}

// retryAfterHeader is the Retry-After header of e (whole seconds, rounded up); "" when it has
// none.
func (e *Error) retryAfterHeader() string {
	if e.RetryAfter <= 0 {
		return ""
	}
	return strconv.FormatInt(int64((e.RetryAfter+time.Second-1)/time.Second), 10)
}

// body is the JSON error shape of e.
func (e *Error) body() errorBody {
	details := e.Details
	if details == nil {
		details = map[string]any{}
	}
	return errorBody{Error: errorJSON{Code: e.Code, Message: e.Message, Retryable: e.Retryable, Details: details}}
}

// handleError is Echo's HTTPErrorHandler: every error becomes the JSON error shape.
func (s *Server) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	ae := errorFor(err)
	c.Set(keyErrCode, ae.Code)
	switch {
	case ae.Code == CodeStoreUnavailable && ae.Err != nil:
		// The cause goes into the request's log line: a Redis that refuses every call (NOPERM,
		// READONLY) looks like an outage to clients, and only the log tells which it is.
		c.Set(keyErrCause, ae.Err.Error())
	case ae.Code == CodeInvalidArgument && ae.Details["field"] == "token" && ae.Err != nil:
		// Why a strict check refused a lease token (its reason and, for an unknown key, the kid),
		// which the answer's message says only in general.
		reason, _ := ae.Details["reason"].(string)
		c.Set(keyErrCause, reason+": "+ae.Err.Error())
	case ae.Code == CodeLeaseLost && ae.Details["reason"] == reasonExpiredToken:
		c.Set(keyErrCause, reasonExpiredToken+": "+ae.Message)
	case ae.Code == CodeUnauthenticated || ae.Code == CodeForbidden:
		// Why a credential was refused (expired, bad signature, another audience, a session the
		// token does not grant), from the answer's message, which never holds the token: so that
		// an operator tells a misconfigured identity provider from a probe.
		c.Set(keyErrCause, ae.Message)
	}
	if ae.Code == CodeInternal {
		s.log.LogAttrs(c.Request().Context(), slog.LevelError, "internal error",
			slog.String("request_id", requestID(c)),
			slog.String("method", c.Request().Method),
			slog.String("route", s.routeLabel(c)),
			slog.String("error", errString(ae.Err)))
	}
	h := c.Response().Header()
	// An error answers one request at one moment (a 503 or a 429 the next moment may be a 200),
	// and may come before the handler that would have said how its answers are cached.
	h.Set(echo.HeaderCacheControl, "no-store")
	if ae.RetryAfter > 0 {
		h.Set("Retry-After", ae.retryAfterHeader())
	}
	if ae.Code == CodeUnauthenticated {
		h.Set("WWW-Authenticate", `Bearer realm="tablease"`)
	}
	if werr := c.JSON(ae.Status(), ae.body()); werr != nil {
		s.log.Debug("writing error answer", slog.String("request_id", requestID(c)), slog.String("error", werr.Error()))
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// storeCall reports a call of op to the store that is not a lease operation (observeOp counts
// those): one the store did not serve is a store error, and one it answered, with a result or a
// refusal of its own, ends an outage as a served lease operation does.
func (s *Server) storeCall(op string, err error) {
	switch {
	case errors.Is(err, lease.ErrUnavailable):
		s.metrics.storeFailed(op, err)
	case errors.Is(err, context.Canceled): // the caller gave up: nothing learnt of the store
	default:
		s.metrics.store.answered()
	}
}
