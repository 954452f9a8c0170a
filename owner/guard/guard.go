// Package guard is what an application backend imports to refuse mutations from a browser tab that
// does not hold the tablease lease of the session the mutation touches.
//
// The tab's client (tablease.js, guard(handler)) sends the lease token it got from tablease in the
// Tablease-Lease header. For each request the guard:
//
//  1. reads the token (missing, or in more than one header: 403 NOT_LEASE_OWNER);
//  2. verifies it offline — signature against tablease's JWKS (JWKSClient) or given keys,
//     algorithm, typ, issuer, expiry (invalid, expired, or of a key the JWKS fetched for it
//     lacks: 403 NOT_LEASE_OWNER; keys unreachable, or a key not in the JWKS fetched before the
//     token came while it may not be fetched again yet: 503);
//  3. asks the application which user and session the request touches (Options.Target: the user
//     from the application's own authentication, the session from the route) and refuses a token
//     of another user or session (403 NOT_LEASE_OWNER);
//  4. in strict mode, asks tablease whether the epoch is still current, with
//     POST <base>/v1/sessions/{sid}/lease/check {"token": …} (409 from tablease: 409 LEASE_LOST;
//     tablease unreachable, timing out or failing, or a 200 that vouches for another lease than
//     the token's tab and epoch: 503, fail closed, with tablease's status and error code in
//     details when it answered);
//  5. puts the verified claims in the request context (FromContext), so the handler can fence
//     its writes with the epoch.
//
// Rejections use the error shape of tablease and its SDK, {"error": {"code", "message",
// "retryable", "details"}}. A request without proof of ownership is 403 (the caller is
// authenticated, but not allowed to mutate), a proof that tablease says is stale is 409 LEASE_LOST
// (a conflict with the current state, as tablease answers it), and no decision is 503 with
// Retry-After.
//
// Offline verification proves the tab held the lease at that epoch until the token's exp; it
// cannot tell that another tab took over a second ago. Strict mode closes that window for the
// check itself, not for the time between the check and the write: only fencing does that
// (docs/fencing.md). Use both for writes that matter.
//
// guard/guardecho adapts the guard to Echo v4.
package guard

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/tablease/tablease/internal/loglimit"
	"github.com/tablease/tablease/owner/leasetoken"
)

// Header is the request header that carries the lease token.
const Header = "Tablease-Lease"

// Claims are the verified claims of a lease token.
type Claims = leasetoken.Claims

// Options configure a Guard.
type Options struct {
	// Keys find the keys that verify tokens: a *JWKSClient for tablease's JWKS, or
	// leasetoken.PublicKeys. Required.
	Keys leasetoken.KeySource
	// Issuer is tablease's issuer name, the required iss of lease tokens. Required.
	Issuer string
	// Leeway is the clock skew tolerated on exp and iat; default leasetoken.DefaultLeeway, at most
	// leasetoken.MaxLeeway.
	Leeway time.Duration
	// Target tells which user and session the request touches: sub from the application's own
	// authentication, sid from the route or the resource. Required. An error that is a *Error is
	// answered as it is; any other error (or an empty sub or sid) is 403 NOT_LEASE_OWNER.
	Target func(r *http.Request) (sub, sid string, err error)
	// Skip, when set, lets requests for which it returns true through unchecked (and without
	// claims in the context). SafeMethods skips GET, HEAD and OPTIONS. Default: check every
	// request.
	Skip func(r *http.Request) bool

	// Strict makes the guard ask tablease, for every request, whether the token's epoch is still
	// current (POST BaseURL/v1/sessions/{sid}/lease/check). Default false: offline only.
	Strict bool
	// BaseURL is tablease's base URL. Required when Strict.
	BaseURL string
	// AccessToken gives the access token the check is made with (tablease requires one for every
	// /v1 call). Default: the bearer token of the incoming request's Authorization header, passed
	// through. An error is answered 503.
	AccessToken func(r *http.Request) (string, error)
	// HTTPClient makes the checks; default http.DefaultClient (CheckTimeout bounds each call).
	HTTPClient *http.Client
	// CheckTimeout bounds one check; default 3s. Keep it above tablease's TABLEASE_REDIS_TIMEOUT
	// (default 2s): tablease answers a check that its store could not serve with 503 and a
	// Retry-After once that time has passed, and a guard that gave up first answers 503 with
	// "tablease is unreachable" and Retry-After 1, which misleads the operator and the client.
	CheckTimeout time.Duration

	// OnReject, when set, is called with every rejection before it is written (for logs and
	// metrics; e.Err has the cause). Without it, the rejections that point at the application's
	// setup or at tablease rather than at the tab are logged to Logger: ReasonNoTarget,
	// ReasonCheckRefused, ReasonInvalidToken, ReasonUnknownKey and CodeUnavailable.
	OnReject func(r *http.Request, e *Error)
	// Logger receives, when OnReject is nil, a warning for each of those rejections, with its cause
	// and what to check, at most one with the same hint every 10 s from this Guard. Default
	// slog.Default().
	Logger *slog.Logger
	// Now is the clock for token expiry; default time.Now.
	Now func() time.Time
}

// SafeMethods reports whether r is a GET, HEAD or OPTIONS request: a Skip for a guard that wraps
// a whole router whose mutations are the other methods.
func SafeMethods(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return true
	}
	return false
}

// Guard checks lease tokens. It is safe for concurrent use.
type Guard struct {
	opts     Options
	verifier *leasetoken.Verifier
	checkURL func(sid string) string
	logLimit *loglimit.Limit // the setup warnings logged without OnReject
}

// New checks opts and makes a Guard.
func New(opts Options) (*Guard, error) {
	if opts.Keys == nil {
		return nil, errors.New("guard: Options.Keys is required (a *JWKSClient or leasetoken.PublicKeys)")
	}
	if opts.Target == nil {
		return nil, errors.New("guard: Options.Target is required")
	}
	v, err := leasetoken.NewVerifier(opts.Keys, leasetoken.VerifierOptions{Issuer: opts.Issuer, Leeway: opts.Leeway, Now: opts.Now})
	if err != nil {
		return nil, fmt.Errorf("guard: %w", err)
	}
	g := &Guard{opts: opts, verifier: v, logLimit: loglimit.New(10*time.Second, time.Now)}
	if g.opts.Logger == nil {
		g.opts.Logger = slog.Default()
	}
	if opts.Strict {
		base, err := url.Parse(opts.BaseURL)
		if opts.BaseURL == "" || err != nil || (base.Scheme != "https" && base.Scheme != "http") || base.Host == "" {
			return nil, fmt.Errorf("guard: Options.BaseURL %q must be tablease's absolute http(s) URL in strict mode", opts.BaseURL)
		}
		prefix := strings.TrimRight(opts.BaseURL, "/") + "/v1/sessions/"
		g.checkURL = func(sid string) string { return prefix + url.PathEscape(sid) + "/lease/check" }
	}
	if opts.CheckTimeout < 0 {
		return nil, errors.New("guard: Options.CheckTimeout must not be negative")
	}
	if g.opts.CheckTimeout == 0 {
		g.opts.CheckTimeout = 3 * time.Second
	}
	if g.opts.HTTPClient == nil {
		g.opts.HTTPClient = http.DefaultClient
	}
	if g.opts.AccessToken == nil {
		g.opts.AccessToken = bearerToken
	}
	return g, nil
}

func bearerToken(r *http.Request) (string, error) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", nil
	}
	return strings.TrimSpace(token), nil
}

// Applies reports whether the guard checks r (false when Options.Skip says to skip it).
func (g *Guard) Applies(r *http.Request) bool { return g.opts.Skip == nil || !g.opts.Skip(r) }

// Middleware refuses requests that fail Check with a JSON rejection, and passes the others to next
// with the claims in the request context (FromContext).
func (g *Guard) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !g.Applies(r) {
			next.ServeHTTP(w, r)
			return
		}
		c, err := g.Check(r)
		if err != nil {
			WriteError(w, err)
			return
		}
		next.ServeHTTP(w, r.WithContext(NewContext(r.Context(), c)))
	})
}

// setupHints are the rejections that point at the application's setup or at tablease rather than
// at the tab, by details.reason (CodeUnavailable by its code), with what to check. A guard without
// OnReject logs them (Options.Logger): the answer's message is for the tab's user, and says none
// of this.
var setupHints = map[string]string{
	ReasonNoTarget:     "Options.Target named no user or session for this request: guard only the routes that touch a session (Options.Skip)",
	ReasonCheckRefused: "tablease refused the strict check (details.status): a 401 is a check sent without a valid access token (Options.AccessToken), a 400 a lease token tablease's own keys do not verify",
	ReasonInvalidToken: "the lease token did not verify: Options.Issuer must be the iss tablease signs with (TABLEASE_LEASE_ISSUER; tablease-dev in dev mode), or the token was forged",
	ReasonUnknownKey:   "the lease token's key is not in tablease's JWKS: instances out of step in a key rotation (README, Key rotation), or a forged token",
	CodeUnavailable:    "no decision: tablease's JWKS or its /lease/check did not answer in time, or failed",
}

// Causes of rejections that setupHint tells apart from the others of their kind.
var (
	errSeveralHeaders = errors.New("several Tablease-Lease headers")   // the request's, not the setup's
	errAccessToken    = errors.New("access token for the lease check") // Options.AccessToken failed
)

// setupHint answers the kind of e (its details.reason, or CodeUnavailable) and what to check when
// e points at the application's setup or at tablease (setupHints); ok is false otherwise. A 503
// says what was asked of whom: the app's AccessToken, tablease's limit or store, or nothing that
// answered.
func setupHint(e *Error) (kind, hint string, ok bool) {
	if e.Code == CodeUnavailable {
		switch {
		case errors.Is(e.Err, errAccessToken):
			hint = "Options.AccessToken failed, so no strict check was sent: it must give an access token of the request's user that tablease accepts"
		case e.Details["status"] == http.StatusTooManyRequests:
			hint = "tablease refused the strict check for the user's limit of lease checks (TABLEASE_RATE_LIMIT, per user and instance: each strict check is one)"
		case e.Details["status"] != nil && e.Details["code"] == nil:
			hint = "what answered the strict check (details.status) gave no error of tablease's: Options.BaseURL, or a proxy in front of tablease"
		case e.Details["status"] != nil:
			hint = "tablease could not decide the strict check (details.status and details.code are its answer: 503 STORE_UNAVAILABLE is its Redis, 503 AUTH_UNAVAILABLE the keys of the access token sent)"
		default:
			hint = setupHints[CodeUnavailable]
		}
		return CodeUnavailable, hint, true
	}
	if errors.Is(e.Err, errSeveralHeaders) {
		return "", "", false
	}
	if errors.Is(e.Err, jwt.ErrTokenUsedBeforeIssued) {
		return ReasonInvalidToken, "the lease token was issued later than this host's clock says it is now, beyond Options.Leeway: this host's clock is behind Redis's, which dates the tokens (keep it NTP-synchronised, docs/fencing.md)", true
	}
	kind, _ = e.Details["reason"].(string)
	hint, ok = setupHints[kind]
	return kind, hint, ok
}

// logSetupFault logs a rejection that setupHint explains, at most one with each hint every 10 s
// per guard (and how many were left out).
func (g *Guard) logSetupFault(r *http.Request, e *Error) {
	kind, hint, ok := setupHint(e)
	if !ok {
		return
	}
	allow, left, _ := g.logLimit.Allow(hint)
	if !allow {
		return
	}
	attrs := []any{slog.String("code", e.Code), slog.String("reason", kind), slog.String("method", r.Method),
		slog.String("path", r.URL.EscapedPath()), slog.String("check", hint)}
	if e.Err != nil {
		attrs = append(attrs, slog.String("error", e.Err.Error()))
	}
	if left > 0 {
		attrs = append(attrs, slog.Int("left_out", left))
	}
	g.opts.Logger.Warn("tablease guard refused a request", attrs...)
}

// Check runs the guard's checks on r (whatever Skip says) and returns the verified claims, or a
// *Error to answer with (WriteError). OnReject is called with every rejection.
func (g *Guard) Check(r *http.Request) (Claims, error) {
	c, e := g.check(r)
	if e != nil {
		if g.opts.OnReject != nil {
			g.opts.OnReject(r, e)
		} else {
			g.logSetupFault(r, e)
		}
		return Claims{}, e
	}
	return c, nil
}

func (g *Guard) check(r *http.Request) (Claims, *Error) {
	if len(r.Header.Values(Header)) > 1 { // which one would the app's proxies and the guard read?
		return Claims{}, notOwner(ReasonInvalidToken, "Send one Tablease-Lease header, not several.", errSeveralHeaders)
	}
	token := strings.TrimSpace(r.Header.Get(Header))
	if token == "" {
		return Claims{}, notOwner(ReasonMissingToken, "This request changes data and needs the lease of the session: no Tablease-Lease header.", nil)
	}
	c, err := g.verifier.Verify(r.Context(), token)
	switch {
	case err == nil:
	case errors.Is(err, leasetoken.ErrKeysUnavailable):
		retryAfter := 1
		var due interface{ RetryAfter() time.Duration }
		if errors.As(err, &due) {
			retryAfter = min(int(due.RetryAfter()/time.Second), 60)
		}
		return Claims{}, unavailable("The lease token cannot be verified now: tablease's keys cannot be had, or do not have the token's key yet.", retryAfter, err)
	case errors.Is(err, leasetoken.ErrTokenExpired):
		return Claims{}, notOwner(ReasonExpiredToken, "The lease token has expired.", err)
	case errors.Is(err, leasetoken.ErrUnknownKey):
		return Claims{}, notOwner(ReasonUnknownKey, "The lease token is signed by an unknown key.", err)
	default:
		return Claims{}, notOwner(ReasonInvalidToken, "The lease token is invalid.", err)
	}

	sub, sid, err := g.opts.Target(r)
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			return Claims{}, e
		}
		return Claims{}, notOwner(ReasonNoTarget, "The session this request touches is unknown.", err)
	}
	switch {
	case sub == "":
		return Claims{}, notOwner(ReasonNoTarget, "The user this request is made for is unknown.", errors.New("guard: Options.Target returned an empty sub (no user)"))
	case sid == "":
		return Claims{}, notOwner(ReasonNoTarget, "The session this request touches is unknown.", errors.New("guard: Options.Target returned an empty sid (no session)"))
	}
	if c.Subject != sub {
		return Claims{}, notOwner(ReasonWrongUser, "The lease token belongs to another user.", nil)
	}
	if c.Session != sid {
		return Claims{}, notOwner(ReasonWrongSession, "The lease token is for another session.", nil)
	}
	if g.opts.Strict {
		if e := g.strictCheck(r, sid, token, c); e != nil {
			return Claims{}, e
		}
	}
	return c, nil
}

// maxCheckBody bounds the answer of /lease/check that the guard reads.
const maxCheckBody = 64 << 10

func (g *Guard) strictCheck(r *http.Request, sid, token string, c Claims) *Error {
	access, err := g.opts.AccessToken(r)
	if err != nil {
		return unavailable("The lease cannot be checked now.", 1, fmt.Errorf("%w: %w", errAccessToken, err))
	}
	body, _ := json.Marshal(map[string]string{"token": token})
	ctx, cancel := context.WithTimeout(r.Context(), g.opts.CheckTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.checkURL(sid), bytes.NewReader(body))
	if err != nil {
		return unavailable("The lease cannot be checked now.", 1, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	if access != "" {
		req.Header.Set("Authorization", "Bearer "+access)
	}
	resp, err := g.opts.HTTPClient.Do(req)
	if err != nil {
		return unavailable("The lease cannot be checked now: tablease is unreachable.", 1, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxCheckBody))
	if err != nil {
		return unavailable("The lease cannot be checked now.", 1, err)
	}
	var answer struct {
		Valid *bool `json:"valid"`
		Lease *struct {
			Held   bool `json:"held"`
			Holder *struct {
				TabID string `json:"tabId"`
			} `json:"holder"`
			Epoch json.Number `json:"epoch"`
		} `json:"lease"`
		Error *struct {
			Code    string         `json:"code"`
			Details map[string]any `json:"details"`
		} `json:"error"`
	}
	// Numbers as they were written (json.Number): an epoch in details stays an integer in the
	// guard's answer and in logs, not a float64 printed as 1.79e+15.
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	jsonErr := dec.Decode(&answer)

	switch {
	case resp.StatusCode == http.StatusOK:
		if jsonErr != nil || answer.Valid == nil {
			return unavailable("The lease cannot be checked now.", 1, fmt.Errorf("lease check: unexpected answer %.200q", raw))
		}
		if !*answer.Valid {
			return leaseLost(c, nil, errors.New("lease check: valid is false"))
		}
		// The lease it vouches for must be the token's: anything else is not tablease's answer
		// (a BaseURL that names another service), and proves nothing.
		if l := answer.Lease; l == nil || !l.Held || l.Holder == nil || l.Holder.TabID != c.Tab || l.Epoch.String() != strconv.FormatInt(c.Epoch, 10) {
			return unavailable("The lease cannot be checked now.", 1, fmt.Errorf("lease check: a valid answer for another lease than the token's: %.200q", raw))
		}
		return nil
	case resp.StatusCode == http.StatusConflict:
		var details map[string]any
		if jsonErr == nil && answer.Error != nil {
			details = answer.Error.Details
		}
		return leaseLost(c, details, fmt.Errorf("lease check: %s", resp.Status))
	case resp.StatusCode == http.StatusBadRequest, resp.StatusCode == http.StatusUnauthorized, resp.StatusCode == http.StatusForbidden:
		e := notOwner(ReasonCheckRefused, "tablease refused to check the lease for this request.", fmt.Errorf("lease check: %s %.200q", resp.Status, raw))
		e.Details["status"] = resp.StatusCode
		return e
	}
	retryAfter, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	e := unavailable("The lease cannot be checked now.", min(max(retryAfter, 1), 60), fmt.Errorf("lease check: %s %.200q", resp.Status, raw))
	// What tablease answered, so that a client can tell its user's rate limit (429 RATE_LIMITED)
	// from its store being down (503 STORE_UNAVAILABLE).
	e.Details["status"] = resp.StatusCode
	if jsonErr == nil && answer.Error != nil && answer.Error.Code != "" {
		e.Details["code"] = answer.Error.Code
	}
	return e
}

// NewLeaseLost is the 409 LEASE_LOST rejection for a request made under the lease of c that can
// no longer act: what tablease answers a strict check with, and what a handler answers when its
// fenced write finds that a newer epoch already wrote (docs/fencing.md). details are copied into
// the response's details, next to "tokenEpoch".
func NewLeaseLost(c Claims, details map[string]any) *Error {
	return leaseLost(c, details, nil)
}

func leaseLost(c Claims, details map[string]any, cause error) *Error {
	d := map[string]any{}
	for k, v := range details {
		d[k] = v
	}
	d["tokenEpoch"] = c.Epoch
	return &Error{
		Status:  http.StatusConflict,
		Code:    CodeLeaseLost,
		Message: "The lease this request was made under is no longer current: another tab took control, or the lease ended.",
		Details: d,
		Err:     cause,
	}
}

type ctxKey struct{}

// NewContext returns ctx carrying c (what the middleware does; for tests of handlers).
func NewContext(ctx context.Context, c Claims) context.Context {
	return context.WithValue(ctx, ctxKey{}, c)
}

// FromContext returns the verified claims the guard put in ctx; ok is false for a request the
// guard did not check. The handler fences its writes with c.Epoch (docs/fencing.md).
func FromContext(ctx context.Context) (c Claims, ok bool) {
	c, ok = ctx.Value(ctxKey{}).(Claims)
	return c, ok
}
