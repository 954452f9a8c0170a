package guard

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
)

// Error codes of the guard's rejections, in the error shape of tablease and its SDK:
// {"error": {"code", "message", "retryable", "details"}}.
const (
	// CodeNotLeaseOwner (403): no lease token, or one that is invalid, expired, signed by an
	// unknown key, or for another user or session; or tablease refused to check it.
	CodeNotLeaseOwner = "NOT_LEASE_OWNER"
	// CodeLeaseLost (409): the token is valid but tablease says its epoch is no longer current
	// (strict mode): another tab took over, or the lease expired or was released or revoked.
	CodeLeaseLost = "LEASE_LOST"
	// CodeUnavailable (503, retryable): the guard could not reach a decision — tablease's JWKS
	// or /lease/check could not be reached. The guard fails closed.
	CodeUnavailable = "LEASE_CHECK_UNAVAILABLE"
)

// Sentinel errors matched (errors.Is) by *Error according to its Code.
var (
	ErrNotOwner    = errors.New("guard: not the lease owner")
	ErrLeaseLost   = errors.New("guard: lease lost")
	ErrUnavailable = errors.New("guard: lease check unavailable")
)

// Reasons in details.reason of a NOT_LEASE_OWNER rejection.
const (
	ReasonMissingToken = "missing_token" // no Tablease-Lease header
	ReasonInvalidToken = "invalid_token" // malformed, wrongly signed, wrong issuer or type
	ReasonExpiredToken = "expired_token" // the token's exp passed: renew and use the new token
	ReasonUnknownKey   = "unknown_key"   // signed by a key tablease does not publish
	ReasonWrongUser    = "wrong_user"    // the token is another user's
	ReasonWrongSession = "wrong_session" // the token is for another session
	ReasonNoTarget     = "no_target"     // the application could not tell the user or session
	ReasonCheckRefused = "check_refused" // tablease refused the strict check (401/403/400)
)

// Error is a rejection. It is what Check returns and what WriteError writes.
type Error struct {
	Status    int    // HTTP status: 403, 409 or 503 for the guard's own; a handler may write others (a 400)
	Code      string // CodeNotLeaseOwner, CodeLeaseLost or CodeUnavailable
	Message   string // a human sentence, safe to show
	Retryable bool
	Details   map[string]any
	// RetryAfter is the Retry-After header in seconds for a 503; 0 for none.
	RetryAfter int
	// Err is the cause, for logs; never sent.
	Err error
}

func (e *Error) Error() string {
	msg := "guard: " + e.Code + ": " + e.Message
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap exposes the cause.
func (e *Error) Unwrap() error { return e.Err }

// Is matches ErrNotOwner, ErrLeaseLost or ErrUnavailable according to Code.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrNotOwner:
		return e.Code == CodeNotLeaseOwner
	case ErrLeaseLost:
		return e.Code == CodeLeaseLost
	case ErrUnavailable:
		return e.Code == CodeUnavailable
	}
	return false
}

// MarshalJSON writes the response body: {"error":{"code","message","retryable","details"}}.
func (e *Error) MarshalJSON() ([]byte, error) {
	details := e.Details
	if details == nil {
		details = map[string]any{}
	}
	type body struct {
		Code      string         `json:"code"`
		Message   string         `json:"message"`
		Retryable bool           `json:"retryable"`
		Details   map[string]any `json:"details"`
	}
	return json.Marshal(struct {
		Error body `json:"error"`
	}{body{e.Code, e.Message, e.Retryable, details}})
}

// WriteError writes err as a JSON rejection: a *Error as itself, anything else as a 500
// {"error":{"code":"INTERNAL",…}} that says nothing about the cause.
func WriteError(w http.ResponseWriter, err error) {
	var e *Error
	if !errors.As(err, &e) {
		e = &Error{Status: http.StatusInternalServerError, Code: "INTERNAL", Message: "Internal error."}
	}
	body, merr := json.Marshal(e)
	if merr != nil {
		body = []byte(`{"error":{"code":"INTERNAL","message":"Internal error.","retryable":false,"details":{}}}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	if e.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	w.WriteHeader(e.Status)
	_, _ = w.Write(append(body, '\n'))
}

func notOwner(reason, message string, cause error) *Error {
	return &Error{
		Status:  http.StatusForbidden,
		Code:    CodeNotLeaseOwner,
		Message: message,
		Details: map[string]any{"reason": reason},
		Err:     cause,
	}
}

func unavailable(message string, retryAfter int, cause error) *Error {
	if retryAfter <= 0 {
		retryAfter = 1
	}
	return &Error{
		Status:     http.StatusServiceUnavailable,
		Code:       CodeUnavailable,
		Message:    message,
		Retryable:  true,
		Details:    map[string]any{},
		RetryAfter: retryAfter,
		Err:        cause,
	}
}
