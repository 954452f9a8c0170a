package api

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/tablease/tablease/lease"
)

// # Event tickets
//
// A browser's EventSource cannot send an Authorization header, and access tokens are never read
// from URLs. POST /v1/sessions/{sid}/events/ticket {tabId} (with the usual bearer token) answers
// a ticket that opens one event stream: GET …/events?ticket=<ticket>. A ticket is
//
//	t1.<base64url(JSON {sub, sid, tab, exp (unix ms), n (nonce)})>.<base64url(HMAC-SHA256)>
//
// The MAC (crypto/hmac) is over "t1." and the encoded claims, with the ticket key: a key derived
// from StreamOptions.TicketSecret, or from Auth.HS256Secret, or generated per process. Derived
// keys are HMAC-SHA256(secret, "tablease event ticket key v1"), so a ticket is never a valid
// access token nor the reverse. A ticket is valid for TicketTTL, for its user, session and tab
// only, and once: the stream that redeems it records its nonce as used in lease.Nonces (the
// store shared by every instance), until well after the ticket expires. A reused, expired,
// forged, or foreign (other session, other tab) ticket is 401 UNAUTHENTICATED; store trouble
// while recording the nonce is 503 STORE_UNAVAILABLE.
//
// The ticket route is the only place a credential is read from a URL. Request logs never hold
// query strings, so tickets are never logged.

// TicketTTL is how long an event ticket may be redeemed after it was issued.
const TicketTTL = 30 * time.Second

// MinTicketSecretLen is the shortest StreamOptions.TicketSecret accepted (32 bytes).
const MinTicketSecretLen = 32

const (
	ticketVersion = "t1"
	// maxTicketLen bounds a ticket before it is parsed: three identifiers, a time and a nonce.
	maxTicketLen = 1024
	// ticketKeyLabel separates the ticket key from every other use of the secret it is derived
	// from.
	ticketKeyLabel = "tablease event ticket key v1"
)

// ticketBook issues and redeems event tickets. It is immutable after newTicketBook.
type ticketBook struct {
	key    []byte
	nonces lease.Nonces
	now    func() time.Time
}

// newTicketBook derives the ticket key: from secret when given, else from hs256 when given, else
// from a random key (tickets then work on this instance only).
func newTicketBook(secret, hs256 []byte, nonces lease.Nonces, now func() time.Time) *ticketBook {
	base := secret
	if len(base) == 0 {
		base = hs256
	}
	if len(base) == 0 {
		base = make([]byte, 32)
		_, _ = rand.Read(base) // never fails (Go 1.24+)
	}
	mac := hmac.New(sha256.New, base)
	mac.Write([]byte(ticketKeyLabel))
	return &ticketBook{key: mac.Sum(nil), nonces: nonces, now: now}
}

type ticketClaims struct {
	Sub   string `json:"sub"`
	Sid   string `json:"sid"`
	Tab   string `json:"tab"`
	Exp   int64  `json:"exp"` // unix milliseconds
	Nonce string `json:"n"`
}

var b64 = base64.RawURLEncoding

func (b *ticketBook) sign(signed string) []byte {
	mac := hmac.New(sha256.New, b.key)
	mac.Write([]byte(signed))
	return mac.Sum(nil)
}

// issue makes a ticket for tab of key, valid for TicketTTL from now.
func (b *ticketBook) issue(key lease.Key, tab string) (string, error) {
	claims := ticketClaims{Sub: key.User, Sid: key.Session, Tab: tab, Exp: b.now().Add(TicketTTL).UnixMilli(), Nonce: rand.Text()}
	payload, err := json.Marshal(claims)
	if err != nil {
		return "", err
	}
	signed := ticketVersion + "." + b64.EncodeToString(payload)
	return signed + "." + b64.EncodeToString(b.sign(signed)), nil
}

func errTicketInvalid() *Error { return unauthenticated("the event ticket is not valid") }

func errTicketExpired() *Error {
	return unauthenticated("the event ticket has expired; ask for a new one")
}

func errTicketUsed() *Error {
	return unauthenticated("the event ticket has been used already; ask for a new one")
}

func errTicketSession() *Error {
	return unauthenticated("the event ticket was issued for another session")
}

func errTicketTab() *Error { return unauthenticated("the event ticket was issued for another tab") }

// redeem checks ticket for session sid and tab tabID (any tab when empty), and records it as
// used. It answers the ticket's claims, or an UNAUTHENTICATED *Error that never echoes the
// ticket. A ticket refused for any reason but reuse is not used up.
func (b *ticketBook) redeem(ctx context.Context, ticket, sid, tabID string) (ticketClaims, error) {
	var claims ticketClaims
	if len(ticket) > maxTicketLen {
		return claims, errTicketInvalid()
	}
	version, rest, ok1 := strings.Cut(ticket, ".")
	payloadB64, macB64, ok2 := strings.Cut(rest, ".")
	if !ok1 || !ok2 || version != ticketVersion {
		return claims, errTicketInvalid()
	}
	mac, err := b64.DecodeString(macB64)
	if err != nil || !hmac.Equal(mac, b.sign(ticket[:len(version)+1+len(payloadB64)])) {
		return claims, errTicketInvalid()
	}
	payload, err := b64.DecodeString(payloadB64)
	if err != nil {
		return claims, errTicketInvalid()
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&claims); err != nil ||
		lease.ValidateID("sub", claims.Sub) != nil || lease.ValidateID("sid", claims.Sid) != nil ||
		lease.ValidateID("tab", claims.Tab) != nil || lease.ValidateID("nonce", claims.Nonce) != nil {
		return claims, errTicketInvalid() // signed by us, so only a key shared with something else
	}
	now := b.now()
	exp := time.UnixMilli(claims.Exp)
	switch {
	case !exp.After(now):
		return claims, errTicketExpired()
	case exp.Sub(now) > TicketTTL+time.Minute: // issued by a clock far ahead: refuse rather than trust
		return claims, errTicketInvalid()
	case claims.Sid != sid:
		return claims, errTicketSession()
	case tabID != "" && claims.Tab != tabID:
		return claims, errTicketTab()
	}
	// Remembered well past the expiry, so that an instance whose clock runs behind cannot accept
	// it again after the store forgot it.
	fresh, err := b.nonces.UseNonce(ctx, claims.Nonce, min(exp.Sub(now)+TicketTTL+time.Minute, lease.MaxNonceTTL))
	if err != nil {
		return claims, err
	}
	if !fresh {
		return claims, errTicketUsed()
	}
	return claims, nil
}

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
	ticket, err := s.tickets.issue(key, b.TabID)
	if err != nil {
		return err
	}
	c.Response().Header().Set(echo.HeaderCacheControl, "no-store")
	return c.JSON(http.StatusOK, ticketJSON{Ticket: ticket, ExpiresInMs: TicketTTL.Milliseconds()})
}

// authenticateStream authenticates GET …/events: with the Authorization header like every /v1
// route, or with ?ticket= (and then never with both). Any other credential in the URL is refused.
func (s *Server) authenticateStream(next echo.HandlerFunc) echo.HandlerFunc {
	withHeader := s.authenticate(next)
	return func(c echo.Context) error {
		q := c.QueryParams()
		if q.Has("access_token") || q.Has("token") {
			return unauthenticated("access tokens in URLs are refused; send an Authorization: Bearer header, or an event ticket as ?ticket=")
		}
		if !q.Has("ticket") {
			return withHeader(c)
		}
		if c.Request().Header.Get(echo.HeaderAuthorization) != "" {
			return unauthenticated("send either an Authorization header or an event ticket, not both")
		}
		if len(q["ticket"]) != 1 {
			return errTicketInvalid()
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
	claims, err := s.tickets.redeem(c.Request().Context(), ticket, pathParam(c, "sid"), tabID)
	if err != nil {
		var ae *Error
		if !errors.As(err, &ae) {
			s.storeError("use nonce", err)
		}
		return err
	}
	c.Set(keyPrincipal, &Principal{Sub: claims.Sub, Scopes: map[string]bool{}, Sessions: []string{claims.Sid}})
	c.Set(keyTicketTab, claims.Tab)
	return nil
}
