package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tablease/tablease/api/stream"
	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/owner/catalog"
)

// # The event stream
//
// GET /v1/sessions/{sid}/events?tabId=[&label=&hidden=&presence=] is a Server-Sent Events stream
// of the session {sid} of the caller (the token's sub, or the ticket's: see tickets.go), DESIGN §3,
// served by package stream. This file authenticates and decodes the request, maps what stream
// refuses to the error answers, and renders the data of the events that carry lease state with
// the views of the rest of the API. The stream lists its tab in the presence list unless
// presence=false, with which it neither joins, refreshes nor leaves: its client announces its tabs
// with PUT …/tabs/{tabId} (tabs.go).
//
// A connect may name the last event it saw with Last-Event-ID, or the lastEventId query parameter
// for an EventSource that cannot set headers; an id that is not one of ours is treated as unknown:
// the stream starts from a snapshot, which is always correct, rather than failing an EventSource
// for good.

// newStreams builds the event streams, with the presence of their tabs and their tickets.
func newStreams(opts Options, now func() time.Time, log *slog.Logger, reg prometheus.Registerer, storeCall func(string, error), catalogs *catalog.Source) (*stream.Handler, error) {
	if opts.Nonces == nil {
		return nil, errors.New("api: Options.Nonces is required")
	}
	h, err := stream.New(stream.Config{
		Feed:        opts.Engine,
		Presence:    opts.Engine,
		Nonces:      opts.Nonces,
		Views:       streamViews{catalogs: catalogs, keepalive: opts.Streams.KeepaliveInterval()},
		Catalog:     catalogs.Watch,
		HS256Secret: opts.Auth.HS256Secret,
		Now:         now,
		Logger:      log,
		Registerer:  reg,
		StoreCall:   storeCall,
		Options:     opts.Streams,
	})
	if err != nil {
		return nil, fmt.Errorf("api: Options.Streams: %w", err)
	}
	return h, nil
}

// registerStreams adds the event-stream and ticket routes, and the tab routes (GET …/tabs, PUT and
// DELETE …/tabs/{tabId}).
func (s *Server) registerStreams(v1 *echo.Group, authed []echo.MiddlewareFunc) {
	v1.GET("/sessions/:sid/events", s.events, s.authenticateStream, s.rateLimit, requireSession) // no HEAD: it would open a stream
	v1.POST("/sessions/:sid/events/ticket", chain(s.issueTicket, authed...))
	getAndHead(v1, "/sessions/:sid/tabs", s.tabs, authed...)
	v1.PUT("/sessions/:sid/tabs/:tabId", chain(s.putTab, authed...))
	v1.DELETE("/sessions/:sid/tabs/:tabId", chain(s.deleteTab, authed...))
}

// events serves GET /v1/sessions/{sid}/events.
func (s *Server) events(c echo.Context) error {
	req, err := s.streamRequest(c)
	if err != nil {
		return err
	}
	// The snapshot names the catalog version served, which GET …/catalog would answer now: read
	// again when this instance's copy is older than its max age (an instance that no stream kept
	// polling missed another's PUT). A store that does not answer leaves the copy it has; the
	// stream's own calls report the outage.
	if _, err := s.catalogs.Current(c.Request().Context()); err == nil {
		s.storeCall("catalog", nil)
	}
	return streamError(s.streams.Serve(c.Response(), c.Request(), req))
}

// streamRequest decodes a stream request.
func (s *Server) streamRequest(c echo.Context) (stream.Request, error) {
	var q stream.Request
	key, err := s.key(c)
	if err != nil {
		return q, err
	}
	tabID := c.QueryParam("tabId")
	if ticketTab := c.(*served).ticketTab; ticketTab != "" {
		if tabID != "" && tabID != ticketTab { // redeem checked it already
			return q, ticketError(stream.ErrTicketTab)
		}
		tabID = ticketTab
	}
	if tabID == "" {
		return q, fieldError("tabId", "is required")
	}
	if err := validTabID(tabID); err != nil {
		return q, err
	}
	label := c.QueryParam("label")
	if err := lease.ValidateLabel(label); err != nil {
		return q, err
	}
	var hidden bool
	switch v := c.QueryParam("hidden"); v {
	case "", "false":
	case "true":
		hidden = true
	default:
		return q, fieldError("hidden", `must be "true" or "false"`)
	}
	switch v := c.QueryParam("presence"); v {
	case "", "true":
		q.Listed = true
	case "false":
	default:
		return q, fieldError("presence", `must be "true" or "false"`)
	}
	q.Key, q.Tab, q.RequestID = key, lease.Tab{TabID: tabID, Label: label, Hidden: hidden}, requestID(c)
	p := principalOf(c)
	q.Until = p.Expires
	if p.keyKept != nil {
		q.Kept = p.keyKept
	}
	after := c.Request().Header.Get("Last-Event-ID")
	if after == "" {
		after = c.QueryParam("lastEventId")
	}
	if _, err := lease.ParseEventID(after); err == nil {
		q.After = after
	}
	return q, nil
}

// streamError maps what package stream refuses to its answer; other errors are the engine's,
// which the error table maps.
func streamError(err error) error {
	var limit *stream.LimitError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, stream.ErrClosing):
		return &Error{Code: CodeStoreUnavailable, Message: "this instance is shutting down; reconnect", Retryable: true, RetryAfter: time.Second}
	case errors.As(err, &limit):
		e := rateLimited(limit.Error(), limit.Limit, stream.LimitRetryAfter)
		e.Details["max"] = limit.Max
		return e
	}
	return ticketError(err)
}

// streamViews render the data of the stream's events with the views of the API; catalogs names
// the catalog version in snapshots.
type streamViews struct {
	catalogs  *catalog.Source
	keepalive time.Duration // the interval of the stream's keepalive comments
}

// snapshotJSON is the data of `event: snapshot`: the lease object as GET …/lease answers it for the
// tab, the tabs connected, and whether the events that follow are a replay of what the client
// missed (already included in the snapshot), and the version of the tool catalog served, so that
// a client whose stream was down when the catalog changed learns of it on reconnecting; and the
// interval of the keepalive comments, so that a client that hears nothing for longer takes its
// stream for stalled (a proxy that holds it open without passing anything on).
type snapshotJSON struct {
	*leaseJSON
	Tabs           []tabJSON `json:"tabs"`
	Resumed        bool      `json:"resumed"`
	CatalogVersion string    `json:"catalogVersion,omitempty"`
	KeepaliveMs    int64     `json:"keepaliveMs"`
}

func (v streamViews) Snapshot(w *lease.Watch, tabID string) ([]byte, error) {
	snap := snapshotJSON{leaseJSON: leaseView(w.Snapshot, tabID), Tabs: tabsView(w.Tabs), Resumed: w.Resumed, KeepaliveMs: v.keepalive.Milliseconds()}
	if version, ok := v.catalogs.Served(); ok {
		snap.CatalogVersion = version
	}
	return json.Marshal(snap)
}

// leaseEventJSON is the data of `event: lease` (DESIGN §3).
type leaseEventJSON struct {
	Type      lease.EventType `json:"type"`
	SessionID string          `json:"sessionId"`
	Epoch     int64           `json:"epoch"`
	Holder    *holderJSON     `json:"holder"`   // null when nobody holds the lease after the change
	Previous  *previousJSON   `json:"previous"` // null when there was no holder before
	Reason    string          `json:"reason"`
	At        *string         `json:"at"`
	// Requester is the tab that asked for a handoff: on handoff_requested, and on the released or
	// expired event that reserved the lease for it. Absent otherwise.
	Requester *holderJSON `json:"requester,omitempty"`
}

type previousJSON struct {
	TabID string `json:"tabId"`
	Epoch int64  `json:"epoch"`
}

// tabsEventJSON is the data of `event: tabs`.
type tabsEventJSON struct {
	Type      lease.EventType `json:"type"` // joined or left
	SessionID string          `json:"sessionId"`
	Tab       tabJSON         `json:"tab"`
	Reason    string          `json:"reason,omitempty"` // "timeout" for a tab whose entry expired
	At        *string         `json:"at"`
}

// Event renders the data of a lease or tabs event.
func (streamViews) Event(ev lease.Event) ([]byte, error) {
	if ev.Type.Stream() == "tabs" {
		var tab tabJSON
		if ev.Tab != nil {
			tab = tabView(*ev.Tab)
		}
		return json.Marshal(tabsEventJSON{Type: ev.Type, SessionID: ev.Key.Session, Tab: tab, Reason: ev.Reason, At: timeView(ev.At)})
	}
	out := leaseEventJSON{Type: ev.Type, SessionID: ev.Key.Session, Epoch: ev.Epoch, Reason: ev.Reason, At: timeView(ev.At)}
	if ev.Holder != nil {
		out.Holder = holderView(*ev.Holder)
	}
	if ev.Previous != nil {
		out.Previous = &previousJSON{TabID: ev.Previous.TabID, Epoch: ev.Previous.Epoch}
	}
	if ev.Requester != nil {
		out.Requester = holderView(*ev.Requester)
	}
	return json.Marshal(out)
}
