package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/owner"
	"github.com/tablease/tablease/owner/catalog"
)

// MaxCatalogBytes bounds the body of PUT /v1/admin/catalog (1 MiB, the size of a stored document).
const MaxCatalogBytes = lease.MaxDocumentSize

// sessionCatalog answers GET /v1/sessions/{sid}/catalog?tabId=&route=: the tools the tab may
// register for its role on its route. Without tabId the caller is a viewer.
func (s *Server) sessionCatalog(c echo.Context) error {
	key, err := s.key(c)
	if err != nil {
		return err
	}
	tabID := c.QueryParam("tabId")
	if tabID != "" {
		if err := validTabID(tabID); err != nil {
			return err
		}
	}
	route := c.QueryParam("route")
	if route != "" {
		if err := catalog.CheckRoute(route); err != nil {
			return fieldError("route", strings.TrimPrefix(strings.TrimPrefix(err.Error(), "catalog: "), "route "))
		}
	}
	ctx := c.Request().Context()
	st, err := s.catalogs.Current(ctx)
	s.storeCall("catalog", err)
	if err != nil {
		return err
	}
	view := catalogViewJSON{Role: owner.RoleViewer, Version: st.Catalog.Version}
	if tabID != "" {
		l, err := s.engine.Get(ctx, key)
		s.metrics.observeOp("get", err)
		if err != nil {
			return err
		}
		view.Role = owner.RoleFor(l, tabID)
		if view.Role == owner.RoleOwner {
			epoch := l.Epoch
			view.Epoch = &epoch
		}
	}
	view.Tools = st.Catalog.For(view.Role, route)
	body, err := json.Marshal(view)
	if err != nil {
		return err
	}
	// The tag names this exact answer: the version, the role, the epoch and the route's tools.
	sum := sha256.Sum256(body)
	return sendCached(c, `"`+hex.EncodeToString(sum[:12])+`"`, body)
}

// sendCached answers body with its ETag, or 304 Not Modified without a body when the request's
// If-None-Match names that tag. Answers are private to the caller and revalidated every time.
func sendCached(c echo.Context, etag string, body []byte) error {
	h := c.Response().Header()
	h.Set("ETag", etag)
	h.Set("Cache-Control", "private, no-cache")
	if noneMatch(c.Request().Header.Get("If-None-Match"), etag) {
		return c.NoContent(http.StatusNotModified)
	}
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, body)
}

// noneMatch reports whether an If-None-Match header matches etag: "*", or a list of entity tags
// one of which is etag under the weak comparison (RFC 9110 §13.1.2: W/ is ignored).
func noneMatch(header, etag string) bool {
	header = strings.TrimSpace(header)
	if header == "" {
		return false
	}
	if header == "*" {
		return true
	}
	for _, tag := range strings.Split(header, ",") {
		if strings.TrimPrefix(strings.TrimSpace(tag), "W/") == strings.TrimPrefix(etag, "W/") {
			return true
		}
	}
	return false
}

// adminCatalog answers GET /v1/admin/catalog: the catalog served, whole (disabled tools
// included), in the form PUT takes back, with its version as ETag.
func (s *Server) adminCatalog(c echo.Context) error {
	st, err := s.catalogs.Fresh(c.Request().Context())
	s.storeCall("catalog", err)
	if err != nil {
		return err
	}
	body, err := json.Marshal(st.Catalog)
	if err != nil {
		return err
	}
	setCatalogSource(c, st)
	return sendCached(c, st.Catalog.ETag(), body)
}

func setCatalogSource(c echo.Context, st catalog.State) {
	h := c.Response().Header()
	if st.DocVersion != "" {
		h.Set("Last-Modified", st.UpdatedAt.UTC().Format(http.TimeFormat))
	}
}

// putCatalog answers PUT /v1/admin/catalog: it replaces the catalog when If-Match names the
// version served now (or is *). Without If-Match: 428 PRECONDITION_REQUIRED; with a stale one, or
// when another admin's PUT came first: 412 PRECONDITION_FAILED with the current version.
func (s *Server) putCatalog(c echo.Context) error {
	req := c.Request()
	ifMatch := strings.TrimSpace(req.Header.Get("If-Match"))
	if ifMatch == "" {
		return &Error{Code: CodePreconditionRequired,
			Message: `If-Match is required: send the ETag of GET /v1/admin/catalog (or "*" to replace whatever is there)`}
	}
	if ifMatch != "*" && !quotedETags(ifMatch) {
		// An unquoted tag (the body's version, most likely) matches no ETag: say so rather than
		// answer 412 as if someone else had changed the catalog.
		return errInvalid(`If-Match must be the ETag header of GET /v1/admin/catalog as it is, in quotes ("sha256:…"), or "*"`)
	}
	data, err := readCatalogBody(c)
	if err != nil {
		return err
	}
	next, err := catalog.Parse(data)
	if err != nil {
		return catalogInvalid(err)
	}
	ctx := req.Context()
	base, err := s.catalogs.Fresh(ctx)
	s.storeCall("catalog", err)
	if err != nil {
		return err
	}
	if !base.Catalog.MatchETag(ifMatch) {
		return preconditionFailed(c, base.Catalog.Version)
	}
	st, err := s.catalogs.Put(ctx, next, base)
	if err != nil {
		var vm *lease.VersionMismatchError
		if errors.As(err, &vm) { // another PUT won between the read and the write
			return preconditionFailed(c, vm.Current)
		}
	}
	s.storeCall("catalog", err)
	if err != nil {
		return err
	}
	disabled := 0
	for _, t := range next.Tools {
		if t.Disabled {
			disabled++
		}
	}
	p := principalOf(c)
	// The change is made: a failure to record it is logged, not answered as the change's failure.
	reason := fmt.Sprintf("catalog version %s replaced %s (%d tools, %d disabled)", next.Version, base.Catalog.Version, len(next.Tools), disabled)
	if err := s.engine.RecordCatalog(ctx, p.Sub, reason); err != nil {
		s.log.LogAttrs(ctx, slog.LevelError, "catalog replaced but not recorded in the audit log",
			slog.String("request_id", requestID(c)), slog.String("sub", p.Sub), slog.String("error", err.Error()))
	}
	s.log.LogAttrs(ctx, slog.LevelInfo, "catalog replaced",
		slog.String("request_id", requestID(c)),
		slog.String("sub", p.Sub),
		slog.String("previous_version", base.Catalog.Version),
		slog.String("version", next.Version),
		slog.Int("tools", len(next.Tools)),
		slog.Int("disabled", disabled))
	body, err := json.Marshal(st.Catalog)
	if err != nil {
		return err
	}
	setCatalogSource(c, st)
	c.Response().Header().Set("ETag", st.Catalog.ETag())
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, body)
}

// quotedETags reports whether v is a list of entity-tags as If-Match takes them (RFC 9110): each
// in quotes, weak ones after W/.
func quotedETags(v string) bool {
	for _, tag := range strings.Split(v, ",") {
		tag = strings.TrimPrefix(strings.TrimSpace(tag), "W/")
		if len(tag) < 2 || tag[0] != '"' || tag[len(tag)-1] != '"' {
			return false
		}
	}
	return true
}

// preconditionFailed is the 412 of a catalog PUT whose If-Match is not the current version, with
// that version in details and as the answer's ETag.
func preconditionFailed(c echo.Context, current string) *Error {
	c.Response().Header().Set("ETag", `"`+current+`"`) // the catalog's ETag (catalog.Catalog.ETag)
	return &Error{
		Code:    CodePreconditionFailed,
		Message: "the catalog changed since the version If-Match names; GET it again and reapply the change",
		Details: map[string]any{"version": current},
	}
}

// readCatalogBody reads a JSON body of at most MaxCatalogBytes.
func readCatalogBody(c echo.Context) ([]byte, error) {
	if err := jsonContentType(c); err != nil { // the type, charset and encoding of every body
		return nil, err
	}
	return readAtMost(c, MaxCatalogBytes, func() *Error {
		return &Error{Code: CodePayloadTooLarge, Message: "a catalog is at most 1 MiB"}
	})
}

// catalogInvalid is the 400 for a catalog that catalog.Parse refused, saying where.
func catalogInvalid(err error) *Error {
	e := errInvalid(err.Error())
	var ce *catalog.Error
	if errors.As(err, &ce) {
		d := map[string]any{}
		if ce.Index >= 0 {
			d["index"] = ce.Index
			d["tool"] = ce.Name
		}
		if ce.Field != "" {
			d["field"] = ce.Field
		}
		e.Details = d
	} else {
		e.Err = err
	}
	return e
}

// SeedCatalog stores Options.Catalog as the catalog when the store holds none yet, and answers
// which catalog the server serves (catalog.Source.Seed). Call it at start, and again while the
// store does not answer.
func (s *Server) SeedCatalog(ctx context.Context) (catalog.Status, error) {
	return s.catalogs.Seed(ctx)
}
