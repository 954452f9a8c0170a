package api

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/tablease/tablease/lease"
)

// # Presence
//
// A tab is listed by GET /v1/sessions/{sid}/tabs while it has an event stream open on the session
// (through any instance): the stream joins the presence list when it starts (with the tab's
// label and hidden flag from the stream's query), refreshes its entry every third of the time to
// live the engine answers, and leaves when it ends. A tab whose instance died without leaving
// drops out when its entry expires (lease.DefaultPresenceTTL). Joins and leaves are `event: tabs`
// on the streams of the session.

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
	tabs, err := s.presence.Tabs(c.Request().Context(), key)
	if err != nil {
		s.storeError("tabs", err)
		return err
	}
	return c.JSON(http.StatusOK, tabsJSON{Tabs: tabsView(tabs)})
}
