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

// devToken answers GET /dev/token?sub=&scope=&sid=&ttl= with an HS256 access token, in dev mode
// and to loopback clients only (anyone else gets 404, as if the route did not exist). scope= and
// sid= may repeat or hold several values (scopes separated by spaces, sessions by commas); ttl= is
// a Go duration, at most 24h (default 1h). A request from a page of another origin is refused
// (devSameOrigin), and no CORS header is ever sent.
func (s *Server) devToken(c echo.Context) error {
	if !loopback(c.Request().RemoteAddr) {
		return &Error{Code: CodeNotFound, Message: "no such route"}
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
			if sid = strings.TrimSpace(sid); sid != "" {
				spec.Sessions = append(spec.Sessions, sid)
			}
		}
	}
	if v := q.Get("ttl"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 || d > maxDevTokenTTL {
			return fieldError("ttl", "must be a Go duration between 1s and 24h, such as 1h or 90m")
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
	tok, err := issueToken(s.authCfg, spec, now)
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
