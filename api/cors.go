package api

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/tablease/tablease/internal/origin"
)

// # Cross-origin requests
//
// Options.CORSOrigins lets pages of other origins call /v1 from a browser. Nothing configured
// means same origin only: no CORS header is ever sent, and everything answers as without this
// file. With origins configured, on every path under /v1/:
//
//   - A preflight (OPTIONS with Origin and Access-Control-Request-Method) from an allowed origin
//     answers 204 with Access-Control-Allow-Origin (the origin itself), -Allow-Methods,
//     -Allow-Headers and -Max-Age, before authentication and rate limiting: it needs no token and
//     is never limited. A preflight from any other origin answers 403 FORBIDDEN
//     (details.reason "origin_not_allowed") without CORS headers.
//   - Every other answer to an allowed origin, errors and event streams included, carries
//     Access-Control-Allow-Origin (the origin itself) and Access-Control-Expose-Headers; other
//     origins get none. Access-Control-Allow-Credentials is never sent: the API authenticates
//     with the Authorization header, not cookies.
//   - Every answer carries Vary: Origin.
//
// "*" (dev mode only) allows every origin of the form scheme://host[:port]; the answer still names
// the request's origin, never "*". /sdk/ allows every origin by itself (static.go), and /dev/token
// never answers another origin (devSameOrigin).

// CORS headers of the answers to allowed origins.
const (
	corsAllowMethods  = "GET, POST, PUT, DELETE"
	corsAllowHeaders  = "Authorization, Content-Type, Last-Event-ID, If-None-Match, If-Match, X-Request-ID"
	corsExposeHeaders = "Retry-After, ETag, X-Request-ID"
	corsMaxAge        = "600" // seconds a browser may cache a preflight
)

// AnyOrigin in Options.CORSOrigins allows every origin; New refuses it outside dev mode.
const AnyOrigin = "*"

// corsPolicy is the set of origins allowed to call /v1. It is immutable after newCORSPolicy.
type corsPolicy struct {
	any     bool
	allowed map[string]bool // origins as browsers send them
}

// newCORSPolicy checks origins (each as origin.Parse answers it, or AnyOrigin in dev mode) and
// answers nil when there are none: same origin only.
func newCORSPolicy(origins []string, dev bool) (*corsPolicy, error) {
	if len(origins) == 0 {
		return nil, nil
	}
	p := &corsPolicy{allowed: make(map[string]bool)}
	for _, o := range origins {
		if o == AnyOrigin {
			if !dev {
				return nil, errors.New(`api: Options.CORSOrigins: "*" is allowed in dev mode only`)
			}
			p.any = true
			continue
		}
		norm, err := origin.Parse(o)
		if err != nil {
			return nil, fmt.Errorf("api: Options.CORSOrigins: %w", err)
		}
		if norm != o {
			return nil, fmt.Errorf("api: Options.CORSOrigins: %q must be written as a browser sends it: %q", o, norm)
		}
		p.allowed[o] = true
	}
	return p, nil
}

// allows reports whether a request whose Origin header is o may read the answer.
func (p *corsPolicy) allows(o string) bool {
	if o == "" {
		return false
	}
	if p.any {
		norm, err := origin.Parse(o)
		return err == nil && norm == o
	}
	return p.allowed[o]
}

// underV1 reports whether path is served by the /v1 API.
func underV1(path string) bool { return strings.HasPrefix(path, "/v1/") }

// cors is the middleware of the policy; it runs inside observe, before routing's handlers and
// their middleware (authentication, rate limit).
func (p *corsPolicy) cors(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		req := c.Request()
		if !underV1(req.URL.Path) {
			return next(c)
		}
		h := c.Response().Header()
		h.Add(echo.HeaderVary, echo.HeaderOrigin)
		o := req.Header.Get(echo.HeaderOrigin)
		allowed := p.allows(o)
		if req.Method == http.MethodOptions && o != "" && req.Header.Get(echo.HeaderAccessControlRequestMethod) != "" {
			h.Add(echo.HeaderVary, echo.HeaderAccessControlRequestMethod)
			h.Add(echo.HeaderVary, echo.HeaderAccessControlRequestHeaders)
			if !allowed {
				return &Error{
					Code:    CodeForbidden,
					Message: "this origin may not call the API from a browser (TABLEASE_CORS_ORIGINS does not list it)",
					Details: map[string]any{"reason": "origin_not_allowed"},
				}
			}
			h.Set(echo.HeaderAccessControlAllowOrigin, o)
			h.Set(echo.HeaderAccessControlAllowMethods, corsAllowMethods)
			h.Set(echo.HeaderAccessControlAllowHeaders, corsAllowHeaders)
			h.Set(echo.HeaderAccessControlMaxAge, corsMaxAge)
			return c.NoContent(http.StatusNoContent)
		}
		if allowed {
			h.Set(echo.HeaderAccessControlAllowOrigin, o)
			h.Set(echo.HeaderAccessControlExposeHeaders, corsExposeHeaders)
		}
		return next(c)
	}
}

// devSameOrigin refuses, with 403 FORBIDDEN (details.reason "cross_origin"), a request to
// /dev/token whose Origin header is present and is not the server's own origin (the scheme of the
// connection and the Host header): a page of another origin never gets a token, whatever
// TABLEASE_CORS_ORIGINS says.
func devSameOrigin(req *http.Request) error {
	vals := req.Header.Values(echo.HeaderOrigin)
	if len(vals) == 0 {
		return nil
	}
	scheme := "http"
	if req.TLS != nil {
		scheme = "https"
	}
	own, err := origin.Parse(scheme + "://" + req.Host)
	if err == nil && len(vals) == 1 && vals[0] == own {
		return nil
	}
	return &Error{
		Code:    CodeForbidden,
		Message: "/dev/token answers pages of the server's own origin only",
		Details: map[string]any{"reason": "cross_origin"},
	}
}
