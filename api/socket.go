package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tablease/tablease/api/socket"
	"github.com/tablease/tablease/internal/jsontext"
	"github.com/tablease/tablease/lease"
)

// # The lease socket
//
// GET /v1/socket opens a WebSocket that carries lease calls (DESIGN §3, "Lease socket"), served
// by package socket. This file wires it to the server: each call goes through the server's own
// Echo, every middleware included, as the HTTP request it stands for; an auth message's token is
// verified as a bearer token is; what package socket refuses is mapped to the error answers here,
// as events.go maps what package stream refuses.

// socketLingerSlack is how much longer than the time between the renews of a lease of the default
// TTL a socket waits for its next message in the goroutine of its last (socket.Options.Linger):
// a tab renews that long after it sent its last renew, and so a little sooner after its answer,
// unless its timers run late (a busy page). The renews of a tab at the default TTL (the browser
// client's, unless the app asks for another) then come to a socket that lingers: past the linger,
// a renew costs tablease about 40 % more CPU at the pace of tabs (README "Cost per
// operation"), and a socket waits with a small stack.
const socketLingerSlack = 2 * time.Second

// SocketLinger is the linger of the sockets of a server whose default TTL is ttl, unless
// Options.Sockets sets another: the renew interval of a lease of that TTL, plus socketLingerSlack.
func SocketLinger(ttl time.Duration) time.Duration {
	return lease.RenewAfter(ttl) + socketLingerSlack
}

// newSockets builds the socket handler of s, whose calls go through s.echo.
func (s *Server) newSockets(opts Options, limits lease.Limits, reg prometheus.Registerer) (*socket.Handler, error) {
	sockets := opts.Sockets
	if sockets.Linger == 0 {
		sockets.Linger = SocketLinger(limits.Default)
	}
	h, err := socket.New(socket.Config{
		Dispatch:    http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.echo.ServeHTTP(w, r) }),
		Verify:      s.verifySocketToken,
		Decode:      decodeMessage,
		Answer:      socketAnswer,
		CheckOrigin: func(r *http.Request) bool { return socketOrigin(r, s.cors) },
		Logger:      s.log,
		Registerer:  reg,
		Options:     sockets,
	})
	if err != nil {
		return nil, fmt.Errorf("api: Options.Sockets: %w", err)
	}
	return h, nil
}

// verifySocketToken verifies the token of an auth message as a bearer token is; a token refused
// (401) is charged to the per-address limit of the socket's peer, as a request that fails
// authentication is (limitFailure).
func (s *Server) verifySocketToken(ctx context.Context, token, remote string) (string, time.Time, error) {
	p, err := s.auth.verify(ctx, token)
	if err != nil {
		if code := errorFor(err).Code; code == CodeUnauthenticated || code == CodeAuthUnavailable {
			if limited := s.chargeAddress(remote); limited != nil {
				return "", time.Time{}, limited
			}
		}
		return "", time.Time{}, err
	}
	return p.Sub, p.Expires, nil
}

// openSocket serves GET /v1/socket. Its handshake carries no credential: one in the URL is
// refused as on every route, and so is an Authorization header, which the socket would not use.
func (s *Server) openSocket(c echo.Context) error {
	req := c.Request()
	if req.URL.RawQuery != "" {
		q := req.URL.Query()
		if tokenInURL(q) {
			return unauthenticated(`tokens in URLs are refused; send the access token in the socket's first message, {"op":"auth","token":…}`)
		}
		if q.Has("ticket") {
			return unauthenticated(`an event ticket opens GET …/events only; send the access token in the socket's first message, {"op":"auth","token":…}`)
		}
	}
	if req.Header.Get(echo.HeaderAuthorization) != "" {
		return unauthenticated(`the socket's handshake takes no credential; send the access token in its first message, {"op":"auth","token":…}`)
	}
	if err := s.sockets.Serve(c.Response(), req); err != nil {
		return socketError(err)
	}
	// The socket wrote its own 101 on the connection it took over, which it serves from now on:
	// the request's log line and metrics say so, and Echo writes nothing more.
	c.Response().Status = http.StatusSwitchingProtocols
	c.Response().Committed = true
	return nil
}

// decodeMessage decodes a socket message strictly, as request bodies are: its compact form
// (compactMessage) without encoding/json, any other with the general decoder. A message refused
// keeps its id, when it is a JSON object that gives one once (a null elsewhere, say), for its
// answer to echo.
func decodeMessage(data []byte, m *socket.Message) error {
	if compactMessage(data, m) {
		return nil
	}
	*m = socket.Message{}
	err := decodeAny(data, m)
	if err != nil {
		*m = socket.Message{}
		var fields map[string]json.RawMessage
		if json.Unmarshal(data, &fields) == nil && jsontext.RepeatedKey(data) != "id" {
			m.ID = fields["id"]
		}
	}
	return err
}

// bodyKey starts the body of a message in its compact form.
var bodyKey = []byte(`,"body":{`)

// compactMessage decodes a message in the form clients write it: id, op, sid and token in the
// compact form of compactFields, then, last, body: any JSON object. It answers false, having
// filled some of m maybe, for any other form; decodeAny then decodes it, with the same result for
// every message compactMessage accepts (FuzzCompactBodiesAgree). The general decoder was 8 % of
// tablease's CPU per renew over a socket (perf, 64 clients).
func compactMessage(data []byte, m *socket.Message) bool {
	head := data
	if i := bytes.Index(data, bodyKey); i >= 0 {
		// The compact form's strings hold no quote: the first ,"body":{ is the key's.
		if data[len(data)-1] != '}' {
			return false
		}
		body := data[i+len(bodyKey)-1 : len(data)-1]
		if body[len(body)-1] != '}' || !json.Valid(body) || jsontext.Check(body) != nil {
			return false
		}
		m.Body = body
		var buf [256]byte
		head = append(append(buf[:0], data[:i]...), '}')
	}
	var id string
	var idString bool
	ok := compactInto(head, []compactField{{key: "id", str: &id, number: (*json.RawMessage)(&m.ID), present: &idString},
		{key: "op", str: &m.Op}, {key: "sid", str: &m.SID}, {key: "token", str: &m.Token}})
	if ok && m.ID == nil && idString {
		m.ID = json.RawMessage(`"` + id + `"`)
	}
	return ok
}

// socketOrigin reports whether a page of r's Origin may open a socket: one of the server's own
// origin, or of an origin that may call /v1 (TABLEASE_CORS_ORIGINS). Its own is its host: behind a
// proxy that ends TLS, the request says http where the page says https (devSameOrigin, for
// /dev/token on loopback, compares the scheme too).
func socketOrigin(r *http.Request, cors *corsPolicy) bool {
	o := r.Header.Get("Origin")
	if cors != nil && cors.allows(o) {
		return true
	}
	u, err := url.Parse(o)
	return err == nil && u.Host != "" && strings.EqualFold(u.Host, r.Host)
}

// socketAnswer is an error as a socket answers it: the status, JSON body and Retry-After of the
// HTTP answer.
func socketAnswer(err error) (int, []byte, string) {
	ae := errorFor(socketError(err))
	body, _ := json.Marshal(ae.body())
	return ae.Status(), body, ae.retryAfterHeader()
}

// socketError maps what package socket refuses to its answer; other errors pass.
func socketError(err error) error {
	var (
		auth      *socket.AuthError
		limit     *socket.LimitError
		handshake *socket.HandshakeError
	)
	switch {
	case errors.Is(err, socket.ErrClosing):
		return &Error{Code: CodeStoreUnavailable, Message: "this instance is shutting down; reconnect", Retryable: true, RetryAfter: time.Second}
	case errors.As(err, &auth) && auth.Forbidden:
		return forbidden(auth.Reason)
	case errors.As(err, &auth):
		return unauthenticated(auth.Reason)
	case errors.As(err, &limit):
		e := rateLimited(limit.Error(), "sockets_"+limit.Limit, socketLimitRetryAfter)
		e.Details["max"] = limit.Max
		return e
	case errors.As(err, &handshake) && handshake.Status == http.StatusForbidden:
		e := forbidden(handshake.Reason)
		e.Details = map[string]any{"reason": "origin_not_allowed"} // as a CORS preflight's
		return e
	case errors.As(err, &handshake):
		return errInvalid(handshake.Reason)
	}
	return err
}

// socketLimitRetryAfter is the delay a refusal by a socket limit asks for.
const socketLimitRetryAfter = 5 * time.Second
