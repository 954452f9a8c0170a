package api

import (
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/tablease/tablease/lease"
)

// maxDevTokenTTL bounds the ttl= of /dev/token.
const maxDevTokenTTL = 24 * time.Hour

// DevIssuer is the iss of every token /dev/token mints. A server accepts it only in dev mode (New
// refuses it as Auth.Issuer otherwise), so that a dev instance never mints a token that a
// deployment accepts, even one that shares its HS256 secret.
const DevIssuer = "tablease-dev"

// devToken answers GET /dev/token?sub=&scope=&sid=&ttl= with an HS256 access token whose iss is
// DevIssuer, in dev mode and to loopback clients only (anyone else gets 404, as if the route did
// not exist). scope= and sid= may repeat or hold several values (scopes separated by spaces,
// sessions by commas); ttl= is a Go duration, at most 24h (default 1h). A request whose Host is not
// a loopback name is refused (a page of a domain that resolves to 127.0.0.1, DNS rebinding), and so
// is one from a page of another origin (devSameOrigin); no CORS header is ever sent, and the answer
// is Cache-Control: no-store.
func (s *Server) devToken(c echo.Context) error {
	c.Response().Header().Set("Cache-Control", "no-store")
	if !loopback(c.Request().RemoteAddr) {
		return &Error{Code: CodeNotFound, Message: "no such route"}
	}
	if !loopbackHost(c.Request().Host) {
		return &Error{
			Code:    CodeForbidden,
			Message: "/dev/token answers requests to a loopback name only (localhost or a name under .localhost, or a loopback address such as 127.0.0.1 or [::1])",
			Details: map[string]any{"reason": "host_not_loopback"},
		}
	}
	if err := devSameOrigin(c.Request()); err != nil {
		return err
	}
	q := c.Request().URL.Query()
	spec := TokenSpec{Sub: q.Get("sub")}
	for _, v := range q["scope"] {
		spec.Scopes = append(spec.Scopes, strings.Fields(v)...)
	}
	for _, v := range q["sid"] {
		for _, sid := range strings.Split(v, ",") {
			// An empty item is refused (ValidateID, below) rather than dropped: sid=, dropped
			// whole would mint a token for every session.
			spec.Sessions = append(spec.Sessions, strings.TrimSpace(sid))
		}
	}
	if v := q.Get("ttl"); v != "" {
		d, err := time.ParseDuration(v)
		// Whole seconds, as the token's exp is: a shorter one would expire as it is issued.
		if err != nil || d < time.Second || d > maxDevTokenTTL || d%time.Second != 0 {
			return fieldError("ttl", "must be a Go duration of whole seconds between 1s and 24h, such as 1h or 90m")
		}
		spec.TTL = d
	}
	if err := lease.ValidateID("sub", spec.Sub); err != nil {
		return err
	}
	for _, sid := range spec.Sessions {
		if err := lease.ValidateID("sid", sid); err != nil {
			return err
		}
	}
	now := time.Now()
	cfg := s.authCfg
	cfg.Issuer = DevIssuer
	tok, err := issueToken(cfg, spec, now)
	if err != nil {
		return err
	}
	ttl := spec.TTL
	if ttl == 0 {
		ttl = defaultTokenTTL
	}
	return c.JSON(http.StatusOK, map[string]any{
		"token":     tok,
		"tokenType": "Bearer",
		"sub":       spec.Sub,
		"expiresAt": now.Truncate(time.Second).Add(ttl).UTC().Format(timeLayout),
	})
}

// loopback reports whether the connection's peer (never a forwarding header) is a loopback
// address.
func loopback(remoteAddr string) bool {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// loopbackHost reports whether the Host header names this machine: localhost, a name under
// .localhost (RFC 6761), or a loopback address, with any port.
func loopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	} else {
		host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
