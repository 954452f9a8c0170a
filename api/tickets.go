package api

import (
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/tablease/tablease/api/stream"
)

// # Event tickets
//
// A browser's EventSource cannot send an Authorization header, and access tokens are never read
// from URLs. POST /v1/sessions/{sid}/events/ticket {tabId} (with the usual bearer token) answers
// a ticket that opens one event stream: GET …/events?ticket=<ticket>. Package stream issues and
// redeems tickets (single use, for their user, session and tab, stream.TicketTTL); a ticket it
// refuses is 401 UNAUTHENTICATED, and store trouble while recording its use is 503
// STORE_UNAVAILABLE.
//
// The ticket route is the only place a credential is read from a URL. Request logs never hold
// query strings, so tickets are never logged.

type ticketBody struct {
	TabID string `json:"tabId"`
}

type ticketJSON struct {
	Ticket      string `json:"ticket"`
	ExpiresInMs int64  `json:"expiresInMs"`
}

// issueTicket serves POST /v1/sessions/{sid}/events/ticket.
func (s *Server) issueTicket(c echo.Context) error {
	key, err := s.key(c)
	if err != nil {
		return err
	}
	var b ticketBody
	if err := decodeBody(c, &b); err != nil {
		return err
	}
	if err := validTabID(b.TabID); err != nil {
		return err
	}
	ticket, life, err := s.streams.IssueTicket(c.Request().Context(), key, b.TabID, principalOf(c).Expires)
	if err != nil {
		return err
	}
	c.Response().Header().Set(echo.HeaderCacheControl, "no-store")
	return c.JSON(http.StatusOK, ticketJSON{Ticket: ticket, ExpiresInMs: life.Milliseconds()})
}

// ticketError makes a ticket that package stream refused UNAUTHENTICATED; other errors pass.
func ticketError(err error) error {
	var te *stream.TicketError
	if errors.As(err, &te) {
		return unauthenticated(te.Reason)
	}
	return err
}

// authenticateStream authenticates GET …/events: with the Authorization header like every /v1
// route, or with ?ticket= (and then never with both). Any other credential in the URL is refused.
func (s *Server) authenticateStream(next echo.HandlerFunc) echo.HandlerFunc {
	withHeader := s.authenticate(next)
	return func(c echo.Context) error {
		q := c.QueryParams()
		if tokenInURL(q) {
			return unauthenticated("access tokens in URLs are refused; send an Authorization: Bearer header, or an event ticket as ?ticket=")
		}
		if !q.Has("ticket") {
			return withHeader(c)
		}
		if c.Request().Header.Get(echo.HeaderAuthorization) != "" {
			return unauthenticated("send either an Authorization header or an event ticket, not both")
		}
		if len(q["ticket"]) != 1 {
			return ticketError(stream.ErrTicketInvalid)
		}
		if err := s.redeemTicket(c, q.Get("ticket"), q.Get("tabId")); err != nil {
			return err
		}
		return next(c)
	}
}

// redeemTicket redeems the ticket of a stream request and makes its user the request's principal.
// It is a function of its own to keep the middleware's frame, which stays on the stack for the
// whole stream, small.
func (s *Server) redeemTicket(c echo.Context, ticket, tabID string) error {
	claims, err := s.streams.RedeemTicket(c.Request().Context(), ticket, pathParam(c, "sid"), tabID)
	if err != nil {
		return ticketError(err)
	}
	setPrincipal(c, &Principal{Sub: claims.Sub, Scopes: map[string]bool{}, Sessions: []string{claims.Sid}, Expires: time.UnixMilli(claims.Until)})
	c.(*served).ticketTab = claims.Tab
	return nil
}
