package api

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/tablease/tablease/api/stream"
	"github.com/tablease/tablease/lease"
)

// # Tabs: the presence routes
//
// GET /v1/sessions/{sid}/tabs lists the tabs present on the session (through any instance). A tab
// is present through either of two kinds of entries of the engine's lease.Presence, and is listed
// while at least one of its entries lives:
//
//   - an event stream opened without presence=false: the stream joins when it starts (with the
//     label and hidden flag of its query), refreshes its entry every third of the time to live the
//     engine answers, and leaves when it ends;
//   - PUT /v1/sessions/{sid}/tabs/{tabId} (body {"label"?, "hidden"?, "seq"?}, empty allowed):
//     joins with the connection id tabConnID(tabId), so that a repeat refreshes the same entry and
//     records the latest label and hidden flag; it answers {tabId, ttlMs, refreshAfterMs}, and the
//     client repeats it every refreshAfterMs. DELETE of the same path (?seq= optional) leaves (204,
//     idempotent). seq orders a tab's PUTs and DELETE, which may arrive in any order (the DELETE
//     goes with keepalive as the page goes, on a connection of its own): the engine applies none
//     whose number is not above the latest it applied (lease.Presence.Join), and the PUT answers
//     as if applied.
//
// Browsers share one stream among their tabs: their client opens it with presence=false and
// announces every tab with PUT. An entry nobody refreshes expires (lease.DefaultPresenceTTL) and
// its tab leaves. Joins and leaves are `event: tabs` on the streams of the session.

// tabJSON is a tab as GET …/tabs lists it.
type tabJSON struct {
	TabID       string  `json:"tabId"`
	Label       string  `json:"label"`
	Hidden      bool    `json:"hidden"`
	ConnectedAt *string `json:"connectedAt"`
}

func tabView(t lease.Tab) tabJSON {
	return tabJSON{TabID: t.TabID, Label: t.Label, Hidden: t.Hidden, ConnectedAt: timeView(t.ConnectedAt)}
}

// tabsView renders tabs as a list that is never null.
func tabsView(tabs []lease.Tab) []tabJSON {
	out := make([]tabJSON, 0, len(tabs))
	for _, t := range tabs {
		out = append(out, tabView(t))
	}
	return out
}

type tabsJSON struct {
	Tabs []tabJSON `json:"tabs"`
}

// tabs serves GET /v1/sessions/{sid}/tabs.
func (s *Server) tabs(c echo.Context) error {
	key, err := s.key(c)
	if err != nil {
		return err
	}
	tabs, err := s.engine.Tabs(c.Request().Context(), key)
	s.storeCall("tabs", err)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, tabsJSON{Tabs: tabsView(tabs)})
}

// tabConnID is the presence connection id of the entry of tabID that PUT …/tabs/{tabId} keeps: the
// same for every PUT of the tab, an identifier of 36 characters whatever the tab id's length, and
// never the id of a stream's entry (package stream names those with rand.Text, whose alphabet has
// no dot and no lower-case letter).
func tabConnID(tabID string) string {
	sum := sha256.Sum256([]byte(tabID))
	return "tab." + hex.EncodeToString(sum[:16])
}

// tabPresenceBody is the body of PUT …/tabs/{tabId}; absent fields are "", false and none.
type tabPresenceBody struct {
	Label  string          `json:"label"`
	Hidden bool            `json:"hidden"`
	Seq    json.RawMessage `json:"seq,omitempty"`
}

// errSeq refuses a seq: the number that orders a tab's PUTs and DELETE is 0 when left out, else an
// integer in [1, 2^53).
func errSeq() error { return fieldError("seq", "must be an integer in [1, 2^53)") }

// seqBody reads the seq of a PUT's body.
func seqBody(raw json.RawMessage) (int64, error) {
	v, present, err := intField("seq", raw)
	if err != nil || (present && (v < 1 || lease.ValidateSeq(v) != nil)) {
		return 0, errSeq()
	}
	return v, nil
}

// seqQuery reads the seq of a DELETE's query, decimal digits with no sign or leading zero; empty
// is the same as left out.
func seqQuery(v string) (int64, error) {
	if v == "" {
		return 0, nil
	}
	n, ok := queryInt(v, 1, lease.MaxEpoch-1)
	if !ok {
		return 0, errSeq()
	}
	return n, nil
}

// tabPresenceJSON answers PUT …/tabs/{tabId}: the entry lives ttlMs unless repeated; repeat it
// every refreshAfterMs.
type tabPresenceJSON struct {
	TabID          string `json:"tabId"`
	TTLMs          int64  `json:"ttlMs"`
	RefreshAfterMs int64  `json:"refreshAfterMs"`
}

// tabKey reads the session and the tab of PUT and DELETE …/tabs/{tabId}.
func (s *Server) tabKey(c echo.Context) (lease.Key, string, error) {
	key, err := s.key(c)
	if err != nil {
		return key, "", err
	}
	tabID := pathParam(c, "tabId")
	if err := validTabID(tabID); err != nil {
		return key, "", err
	}
	return key, tabID, nil
}

// putTab serves PUT /v1/sessions/{sid}/tabs/{tabId}: the tab is listed, with the body's label and
// hidden flag, until the answered TTL passes without another PUT.
func (s *Server) putTab(c echo.Context) (err error) {
	defer s.metrics.countInvalid("join", &err)
	key, tabID, err := s.tabKey(c)
	if err != nil {
		return err
	}
	var b tabPresenceBody
	if err := decodeOptionalBody(c, &b); err != nil {
		return err
	}
	if err := lease.ValidateLabel(b.Label); err != nil {
		return err
	}
	seq, err := seqBody(b.Seq)
	if err != nil {
		return err
	}
	ttl, err := s.engine.Join(c.Request().Context(), key, tabConnID(tabID), lease.Tab{TabID: tabID, Label: b.Label, Hidden: b.Hidden}, seq)
	s.metrics.observeOp("join", err)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, tabPresenceJSON{TabID: tabID, TTLMs: ttl.Milliseconds(), RefreshAfterMs: stream.RefreshAfter(ttl).Milliseconds()})
}

// deleteTab serves DELETE /v1/sessions/{sid}/tabs/{tabId}[?seq=]: the entry PUT keeps is removed
// (the tab stays listed while a stream of its own lists it), unless a PUT with a higher seq came
// first. Deleting a tab that is not listed is 204 too.
func (s *Server) deleteTab(c echo.Context) error {
	key, tabID, err := s.tabKey(c)
	if err != nil {
		return err
	}
	seq, err := seqQuery(c.QueryParam("seq"))
	if err != nil {
		return err
	}
	err = s.engine.Leave(c.Request().Context(), key, tabConnID(tabID), tabID, seq)
	s.storeCall("leave", err)
	if err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}
