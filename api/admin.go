package api

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/tablease/tablease/lease"
)

// Admin routes (DESIGN §3), under authentication and scope
// lease:admin:
//
//	GET  /v1/admin/leases?sub=&cursor=&limit=                 → {leases: [adminLease], nextCursor}
//	GET  /v1/admin/users/{sub}/sessions/{sid}/lease           → adminLease
//	POST /v1/admin/users/{sub}/sessions/{sid}/lease/revoke    {reason, blockMs?} → {revoked, epoch, blockedUntil, previous}
//	GET  /v1/admin/audit?sub=&sid=&cursor=&limit=             → {records: [auditRecord], nextCursor}
//	GET  /v1/admin/limits                                      → {maxBlockMs}

// DefaultMaxBlock is the longest block an admin may ask for when Options.MaxBlock is zero.
const DefaultMaxBlock = time.Hour

// MaxCursorLen bounds the cursor of a page request.
const MaxCursorLen = 512

type revokeBody struct {
	Reason  *string         `json:"reason,omitempty"`
	BlockMs json.RawMessage `json:"blockMs,omitempty"`
}

// registerAdmin adds the admin lease routes to v1, each behind mw (authentication, rate limit,
// scope lease:admin).
func (s *Server) registerAdmin(v1 *echo.Group, mw []echo.MiddlewareFunc) {
	getAndHead(v1, "/admin/leases", s.adminListLeases, mw...)
	getAndHead(v1, "/admin/users/:sub/sessions/:sid/lease", s.adminGetLease, mw...)
	v1.POST("/admin/users/:sub/sessions/:sid/lease/revoke", chain(s.adminRevoke, mw...))
	getAndHead(v1, "/admin/audit", s.adminAudit, mw...)
	getAndHead(v1, "/admin/limits", s.adminLimits, mw...)
}

// adminLimits answers the bounds this server sets on admins' requests, for a console to offer no
// more: the longest block of a revoke (Options.MaxBlock, TABLEASE_ADMIN_MAX_BLOCK).
func (s *Server) adminLimits(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]int64{"maxBlockMs": s.maxBlock.Milliseconds()})
}

// adminKey is the lease named by the path of an admin route: /users/{sub}/sessions/{sid}. Echo
// hands path parameters over still percent-encoded, and clients encode ":", "@" and "|"
// (encodeURIComponent does), so they are decoded before they are checked.
func adminKey(c echo.Context) (lease.Key, error) {
	key := lease.Key{User: pathParam(c, "sub"), Session: pathParam(c, "sid")}
	if err := lease.ValidateID("sub", key.User); err != nil {
		return lease.Key{}, err
	}
	if err := lease.ValidateID("sessionId", key.Session); err != nil {
		return lease.Key{}, err
	}
	return key, nil
}

// pageQuery reads the query parameters of a page request: the identifiers named in ids (absent
// or empty means no filter), cursor and limit. Any other parameter was refused (strictQuery): a
// filter of another route (sid on the list of leases) would be ignored, and the answer read as
// filtered.
func pageQuery(c echo.Context, ids ...string) (map[string]string, string, int, error) {
	q := c.Request().URL.Query()
	out := make(map[string]string, len(ids))
	for _, name := range ids {
		v := q.Get(name)
		if v == "" {
			continue
		}
		if err := lease.ValidateID(name, v); err != nil {
			return nil, "", 0, err
		}
		out[name] = v
	}
	cursor := q.Get("cursor")
	if err := validateCursor(cursor); err != nil {
		return nil, "", 0, err
	}
	limit := 0 // the engine's default
	if v, ok := q["limit"]; ok {
		n, err := pageLimit(v[0])
		if err != nil {
			return nil, "", 0, err
		}
		limit = n
	}
	return out, cursor, limit, nil
}

// validateCursor checks an opaque cursor: at most MaxCursorLen characters of printable ASCII
// without spaces. What it means is the engine's business (a cursor it did not make is
// INVALID_ARGUMENT from the engine).
func validateCursor(cursor string) error {
	if len(cursor) > MaxCursorLen {
		return fieldError("cursor", "must be at most "+strconv.Itoa(MaxCursorLen)+" characters")
	}
	for i := 0; i < len(cursor); i++ {
		if c := cursor[i]; c <= ' ' || c > '~' {
			return fieldError("cursor", "must be the nextCursor of an earlier page")
		}
	}
	return nil
}

// pageLimit reads limit: a decimal integer from 1 to lease.MaxPageLimit, without sign or
// leading zero.
func pageLimit(v string) (int, error) {
	n, ok := queryInt(v, 1, lease.MaxPageLimit)
	if !ok {
		return 0, fieldError("limit", "must be an integer from 1 to "+strconv.Itoa(lease.MaxPageLimit))
	}
	return int(n), nil
}

func nextCursor(next string) *string { return optString(next) }

func (s *Server) adminListLeases(c echo.Context) (err error) {
	defer s.metrics.countInvalid("admin_list", &err)
	ids, cursor, limit, err := pageQuery(c, "sub")
	if err != nil {
		return err
	}
	page, err := s.admin.ListLeases(c.Request().Context(), lease.ListQuery{User: ids["sub"], Cursor: cursor, Limit: limit})
	s.metrics.observeOp("admin_list", err)
	if err != nil {
		return err
	}
	out := adminLeasePageJSON{Leases: make([]adminLeaseJSON, 0, len(page.Leases)), NextCursor: nextCursor(page.Next)}
	for _, l := range page.Leases {
		out.Leases = append(out.Leases, adminLeaseView(l))
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) adminGetLease(c echo.Context) (err error) {
	defer s.metrics.countInvalid("admin_get", &err)
	key, err := adminKey(c)
	if err != nil {
		return err
	}
	l, err := s.engine.Get(c.Request().Context(), key)
	s.metrics.observeOp("admin_get", err)
	if err != nil {
		return err
	}
	l.Key = key // the answer names the lease asked for, whatever the engine filled in
	return c.JSON(http.StatusOK, adminLeaseView(l))
}

// RevokeRequestID reports whether id, sent as a revoke's X-Request-ID, names the revoke, so that a
// retry with the same id is answered as the revoke was: the request ids the server keeps, which
// are also valid identifiers of the store.
func RevokeRequestID(id string) bool {
	return saneRequestID(id) && lease.ValidateID("requestId", id) == nil
}

// revokeRequestIDRule says which X-Request-ID a revoke takes (RevokeRequestID), in the answer
// that refuses another.
const revokeRequestIDRule = `must be 1–128 characters of A-Z a-z 0-9 . _ : - (not "." or ".."): ` +
	`on a revoke it names the revoke, so that a retry with it answers as the revoke did; send none for a revoke no retry repeats`

func (s *Server) adminRevoke(c echo.Context) (err error) {
	defer s.metrics.countInvalid("admin_revoke", &err)
	key, err := adminKey(c)
	if err != nil {
		return err
	}
	var b revokeBody
	if err := decodeBody(c, &b); err != nil {
		return err
	}
	var reason string // a missing reason is refused as a blank one
	if b.Reason != nil {
		reason = *b.Reason
	}
	if err := lease.ValidateReason(reason); err != nil {
		return err
	}
	blockMs, _, err := intField("blockMs", b.BlockMs)
	if err != nil {
		return err
	}
	if blockMs < 0 || blockMs > s.maxBlock.Milliseconds() {
		return fieldError("blockMs", "must be an integer from 0 to "+strconv.FormatInt(s.maxBlock.Milliseconds(), 10)+
			" (the configured maximum, "+s.maxBlock.String()+")")
	}
	req := lease.RevokeRequest{
		Key:    key,
		Admin:  principalOf(c).Sub,
		Reason: reason,
		Block:  time.Duration(blockMs) * time.Millisecond,
	}
	// A client that retries with the same X-Request-ID gets the first answer again. Only the
	// client's own id names the revoke: one the server made up for this request can never be sent
	// again, so remembering its answer would only cost the store. An id the server does not keep
	// is refused rather than replaced: replaced, its retry would be another revoke, answered as
	// one, and the client could not tell.
	if ids := c.Request().Header.Values(echo.HeaderXRequestID); len(ids) > 0 {
		if len(ids) > 1 { // which one names the revoke would be a guess
			return fieldError("X-Request-ID", "must be sent once on a revoke: it names the revoke, so that a retry with it answers as the revoke did")
		}
		if !RevokeRequestID(ids[0]) {
			return fieldError("X-Request-ID", revokeRequestIDRule)
		}
		req.RequestID = ids[0]
	}
	// The audit records lead to the log lines of this request, whoever made its id up.
	if id := requestID(c); lease.ValidateID("auditRequestId", id) == nil {
		req.AuditRequestID = id
	}
	res, err := s.admin.Revoke(c.Request().Context(), req)
	s.metrics.observeOp("admin_revoke", err)
	if err != nil {
		var repl *lease.ReplicationError
		if errors.As(err, &repl) && repl.Revoke != nil {
			s.logRevoke(c, req, *repl.Revoke, repl) // it took effect, though it answers 503
		}
		return err
	}
	s.logRevoke(c, req, res, nil)
	return c.JSON(http.StatusOK, revokeJSON{
		Revoked:      res.Revoked,
		Epoch:        res.Epoch,
		BlockedUntil: timeView(res.BlockedUntil),
		Previous:     adminPreviousView(res.Previous),
	})
}

// logRevoke writes what a revoke did, for the operator who reads the log rather than the audit log:
// the request line alone says only that an admin posted to the route. repl is set when too few
// replicas confirmed it: it took effect on the primary, and a failover may undo it.
func (s *Server) logRevoke(c echo.Context, req lease.RevokeRequest, res lease.RevokeResult, repl *lease.ReplicationError) {
	attrs := []slog.Attr{
		slog.String("request_id", requestID(c)),
		slog.String("sub", req.Admin),
		slog.String("user", req.Key.User),
		slog.String("session", req.Key.Session),
		slog.String("reason", req.Reason),
		slog.Bool("revoked", res.Revoked),
		slog.Int64("epoch", res.Epoch),
	}
	if res.Previous != nil {
		attrs = append(attrs, slog.String("previous_tab", res.Previous.TabID), slog.Int64("previous_epoch", res.Previous.Epoch))
	}
	if !res.BlockedUntil.IsZero() {
		attrs = append(attrs, slog.String("blocked_until", res.BlockedUntil.UTC().Format(timeLayout)))
	}
	msg, level := "lease revoked", slog.LevelInfo
	if !res.Revoked {
		msg = "revoke found no lease to end"
	}
	if res.Retried {
		// Its X-Request-ID names a revoke already made: the line says that one's outcome again.
		msg = "revoke retried, answered as the first (" + msg + "), and did nothing more"
	}
	if repl != nil {
		msg += ", on the primary only: too few replicas confirmed it in time (a failover may undo it; retry with the same X-Request-ID)"
		level = slog.LevelWarn
		attrs = append(attrs, slog.Int("replicas", repl.Acked), slog.Int("wanted", repl.Wanted))
	}
	s.log.LogAttrs(c.Request().Context(), level, msg, attrs...)
}

func (s *Server) adminAudit(c echo.Context) (err error) {
	defer s.metrics.countInvalid("admin_audit", &err)
	ids, cursor, limit, err := pageQuery(c, "sub", "sid")
	if err != nil {
		return err
	}
	if ids["sid"] != "" && ids["sub"] == "" {
		return fieldError("sid", "needs sub: sessions are namespaced by user")
	}
	page, err := s.admin.Audit(c.Request().Context(), lease.AuditQuery{
		User: ids["sub"], Session: ids["sid"], Cursor: cursor, Limit: limit,
	})
	s.metrics.observeOp("admin_audit", err)
	if err != nil {
		return err
	}
	out := auditPageJSON{Records: make([]auditRecordJSON, 0, len(page.Records)), NextCursor: nextCursor(page.Next)}
	for _, r := range page.Records {
		out.Records = append(out.Records, auditRecordView(r))
	}
	return c.JSON(http.StatusOK, out)
}
