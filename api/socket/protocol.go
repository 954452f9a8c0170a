package socket

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorilla/websocket"

	"github.com/tablease/tablease/lease"
)

// The protocol is docs/DESIGN.md §3, "Lease socket" (its one normative copy): each text frame
// holds one JSON object (Message) and is answered, in order, by one ({"id","status","body"} and
// "retryAfterMs" when the HTTP answer had Retry-After); an auth message sets the access token that
// the calls then carry as their Authorization header; a call is the POST of calls[op].

// maxMessageBytes bounds a message: a request body of the API (16 KiB) or an access token (8 KiB)
// and the envelope. A longer one closes the socket with code 1009.
const maxMessageBytes = 24 << 10

// maxIDLen bounds a message's id as written (a string's between its quotes).
const maxIDLen = 64

// Message is what a client sends.
type Message struct {
	ID    json.RawMessage `json:"id"`
	Op    string          `json:"op"`
	SID   string          `json:"sid"`
	Body  json.RawMessage `json:"body"`
	Token string          `json:"token"`
}

// calls are the requests the calls stand for, by op: a POST of the path after /v1/sessions/{sid}.
var calls = map[string]string{
	"acquire": "/lease",
	"renew":   "/lease/renew",
	"release": "/lease/release",
	"check":   "/lease/check",
}

// An AuthError refuses a call on a socket without an accepted auth message (401), or an auth
// message for another user than the socket's (403).
type AuthError struct {
	Forbidden bool
	Reason    string
}

func (e *AuthError) Error() string { return e.Reason }

var errNoAuth = &AuthError{Reason: `send {"op":"auth","token":"<access token>"} before the calls`}

// socket is one open socket.
type socket struct {
	h            *Handler
	conn         *websocket.Conn // set under h.mu once upgraded
	ctx          context.Context // of the calls
	remote, host string          // of the upgrade request, for the calls
	user         string          // set by the first accepted auth message, under h.mu
	bearer       []string        // the Authorization header of the calls: "Bearer <token>" of the last accepted auth message
	stopping     atomic.Bool     // the instance is closing: end after the call being served

	// The goroutine that serves the socket's messages (run), one at a time: only it touches the
	// fields below, and those of the call.
	watched  *watchedConn    // the connection, as gorilla/websocket reads it (frames.go)
	raw      syscall.RawConn // the TCP connection under it, when awaitReadable may wait on it; nil otherwise
	deadline time.Time       // by when the next message must come: the auth timeout, then the idle one

	in  bytes.Buffer // the message being served
	rec recorder     // the answer of the call being served
	out []byte       // the answer being written

	// The request of the call being served, made anew from base for each (call): base has the
	// calls' context, the socket's addresses and header, which a call sets.
	base, req *http.Request
	url       url.URL
	body      bytes.Reader
	bodyRC    io.ReadCloser // body, as a request's
}

// start begins serving the socket, upgraded: run, in a goroutine of its own.
func (s *socket) start() {
	s.conn.SetReadLimit(maxMessageBytes)
	s.deadline = time.Now().Add(s.h.opts.AuthTimeout)
	if awaitable {
		s.raw = rawConn(s.watched)
	}
	go s.run(false)
}

// run serves the socket's messages until it ends, then closes its connection and has its Handler
// forget it. A socket whose next message did not come within Options.Linger of its last answer
// (or of its opening) goes on waiting in a new goroutine, run with idle, and this one ends: a
// goroutine keeps the stack that the calls it served grew (often 16 to 32 KiB), and a socket idle
// that long (a hidden tab's, which renews seldom) then waits with a stack of a few KiB and none of
// the buffers of its calls.
func (s *socket) run(idle bool) {
	if (!idle || s.awaitIdle()) && s.serve(idle) {
		s.shed()
		go s.run(true)
		return
	}
	s.h.leave(s)
}

// stopped closes the socket when the instance is closing, and reports whether it did. The read
// deadline is set before it is asked: stop sets them the other way round, so that one of the two
// sees the other's.
func (s *socket) stopped() bool {
	if s.stopping.Load() {
		s.close(websocket.CloseGoingAway, "server shutting down")
		return true
	}
	return false
}

// awaitIdle waits, in the goroutine of an idle socket (run), for the socket's next message, until
// its deadline or its end, and answers whether something came to read; it closes the socket
// otherwise. Its frames and those it calls are few and small: the garbage collector halves the
// stack of a goroutine that uses a quarter of it, and so the stack of an idle socket's goroutine
// may shrink to the smallest.
func (s *socket) awaitIdle() bool {
	_ = s.conn.SetReadDeadline(s.deadline)
	if s.stopped() {
		return false
	}
	if err := awaitReadable(s.raw); err != nil {
		s.ended(err)
		return false
	}
	return true
}

// serve serves the socket's messages (the first at once when ready: something came to read),
// and answers true when the next has not come within Options.Linger of the last answer (the
// socket then goes on in a new goroutine: run), false once the socket ended.
func (s *socket) serve(ready bool) (idle bool) {
	h := s.h
	for {
		// Wait for the next message on the connection itself when gorilla/websocket holds none
		// (frames.go), until Options.Linger from now: a read of gorilla's that times out would end
		// the socket.
		await := !ready && s.raw != nil && !s.watched.frames.buffered()
		ready = false
		waitBy, shortened := s.deadline, false
		if await {
			if by := time.Now().Add(h.opts.Linger); by.Before(waitBy) {
				waitBy, shortened = by, true
			}
		}
		_ = s.conn.SetReadDeadline(waitBy)
		if s.stopped() {
			return false
		}
		if await {
			if err := awaitReadable(s.raw); err != nil {
				var ne net.Error
				if shortened && errors.As(err, &ne) && ne.Timeout() && !s.stopping.Load() {
					return true
				}
				s.ended(err)
				return false
			}
			if shortened {
				_ = s.conn.SetReadDeadline(s.deadline) // the message's rest may take until then
				if s.stopped() {
					return false
				}
			}
		}
		typ, r, err := s.conn.NextReader()
		if err == nil && typ != websocket.TextMessage {
			s.close(websocket.CloseUnsupportedData, "text messages only")
			return false
		}
		if err == nil {
			s.in.Reset()
			_, err = s.in.ReadFrom(r)
		}
		if err != nil {
			s.ended(err)
			return false
		}
		s.watched.frames.took()
		answer := s.message(s.in.Bytes())
		_ = s.conn.SetWriteDeadline(time.Now().Add(h.opts.WriteTimeout))
		if err := s.conn.WriteMessage(websocket.TextMessage, answer); err != nil {
			h.log.Debug("socket ended: its client did not take an answer", "peer", s.remote, "sub", s.user, "error", err.Error())
			_ = s.conn.Close()
			return false
		}
		if s.bearer != nil {
			s.deadline = time.Now().Add(h.opts.IdleTimeout)
		}
	}
}

// shed lets go of what the socket keeps from call to call, as it goes idle (run): the buffers of
// the message, the answer and the call's request, which the next call makes anew.
func (s *socket) shed() {
	s.in = bytes.Buffer{}
	s.out = nil
	s.rec = recorder{}
	s.base, s.req, s.bodyRC = nil, nil, nil
	s.body.Reset(nil)
	s.url = url.URL{}
}

// ended closes the socket after a read failed with err.
func (s *socket) ended(err error) {
	var ne net.Error
	switch {
	case s.stopping.Load():
		s.close(websocket.CloseGoingAway, "server shutting down")
	case errors.As(err, &ne) && ne.Timeout() && s.bearer == nil:
		s.close(websocket.ClosePolicyViolation, "no accepted auth message within "+s.h.opts.AuthTimeout.String())
	case errors.As(err, &ne) && ne.Timeout():
		s.close(websocket.CloseNormalClosure, "idle")
	default: // the client closed it, went away, or broke the protocol (answered by gorilla/websocket)
		_ = s.conn.Close()
	}
}

// close sends a close frame of code and reason, and closes the connection.
func (s *socket) close(code int, reason string) {
	_ = s.conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(code, reason), time.Now().Add(time.Second))
	_ = s.conn.Close()
}

// stop has the socket end after the call it is serving, if any (Handler.Close, under h.mu). A
// socket still upgrading has no conn yet: run sees stopping first.
func (s *socket) stop() {
	s.stopping.Store(true)
	if s.conn != nil {
		_ = s.conn.SetReadDeadline(time.Unix(1, 0))
	}
}

// message answers one message.
func (s *socket) message(data []byte) []byte {
	var m Message
	if err := s.h.cfg.Decode(data, &m); err != nil {
		id := m.ID
		if validID(id) != nil {
			id = nil
		}
		return s.refuse(id, err)
	}
	if err := validID(m.ID); err != nil {
		return s.refuse(nil, err)
	}
	if m.Op == "auth" {
		return s.auth(&m)
	}
	suffix, ok := calls[m.Op]
	switch {
	case !ok:
		return s.refuse(m.ID, &lease.InvalidError{Field: "op", Reason: `must be "auth", "acquire", "renew", "release" or "check"`})
	case m.Token != "":
		return s.refuse(m.ID, &lease.InvalidError{Field: "token", Reason: "goes in an auth message only"})
	case m.SID == "":
		return s.refuse(m.ID, &lease.InvalidError{Field: "sid", Reason: "is required: the session of the call"})
	case s.bearer == nil:
		return s.refuse(m.ID, errNoAuth)
	}
	return s.call(&m, suffix)
}

// validID checks the id of a message: a number or a string, at most maxIDLen bytes as written.
func validID(id json.RawMessage) error {
	n := len(id)
	if n > 0 && id[0] == '"' {
		n -= 2
	}
	switch {
	case len(id) == 0:
		return &lease.InvalidError{Field: "id", Reason: "is required: a number or a string that the answer echoes"}
	case n > maxIDLen:
		return &lease.InvalidError{Field: "id", Reason: "must be at most " + strconv.Itoa(maxIDLen) + " bytes"}
	case id[0] == '"', id[0] == '-', id[0] >= '0' && id[0] <= '9':
		return nil
	}
	return &lease.InvalidError{Field: "id", Reason: "must be a number or a string"}
}

// auth serves an auth message.
func (s *socket) auth(m *Message) []byte {
	switch {
	case m.Token == "":
		return s.refuse(m.ID, &lease.InvalidError{Field: "token", Reason: "is required in an auth message"})
	case m.SID != "":
		return s.refuse(m.ID, &lease.InvalidError{Field: "sid", Reason: "is not taken by an auth message, which carries a token only"})
	case m.Body != nil:
		return s.refuse(m.ID, &lease.InvalidError{Field: "body", Reason: "is not taken by an auth message, which carries a token only"})
	}
	sub, until, err := s.h.cfg.Verify(s.ctx, m.Token, s.remote)
	if err != nil {
		return s.refuse(m.ID, err)
	}
	switch {
	case s.user == "":
		if err := s.h.join(s, sub); err != nil {
			return s.refuse(m.ID, err)
		}
	case sub != s.user:
		return s.refuse(m.ID, &AuthError{Forbidden: true, Reason: "a socket carries the calls of one user: open another socket for another user"})
	}
	s.bearer = []string{"Bearer " + m.Token}
	body, _ := json.Marshal(struct {
		Sub         string `json:"sub"`
		ExpiresInMs int64  `json:"expiresInMs"`
	}{sub, max(0, time.Until(until).Milliseconds())})
	return s.answer(m.ID, http.StatusOK, body, "")
}

// call serves a call as the HTTP request it stands for: a POST of suffix after the session's path.
// The socket's one request is made anew for each call, from its base and in place, as are its URL,
// body and header: a call allocates only what the route does, which is what a request served by
// net/http allocates.
func (s *socket) call(m *Message, suffix string) []byte {
	if s.base == nil {
		s.base = (&http.Request{
			Method: http.MethodPost, Host: s.host, RemoteAddr: s.remote,
			Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: http.Header{},
		}).WithContext(s.ctx)
		s.req = new(http.Request)
		s.bodyRC = io.NopCloser(&s.body)
	}
	path := "/v1/sessions/" + m.SID + suffix
	escaped := path
	if sid := url.PathEscape(m.SID); sid != m.SID {
		escaped = "/v1/sessions/" + sid + suffix
	}
	s.url = url.URL{Path: path}
	if escaped != path {
		s.url.RawPath = escaped
	}
	s.body.Reset(m.Body)
	h := s.base.Header
	clear(h)
	h["Authorization"], h["Content-Type"] = s.bearer, contentTypeJSON
	*s.req = *s.base
	s.req.URL, s.req.RequestURI = &s.url, escaped
	s.req.Body, s.req.ContentLength = s.bodyRC, int64(len(m.Body))
	s.rec.reset()
	s.h.cfg.Dispatch.ServeHTTP(&s.rec, s.req)
	return s.answer(m.ID, s.rec.status, s.rec.body, s.rec.header.Get("Retry-After"))
}

// contentTypeJSON is the Content-Type of every call's request.
var contentTypeJSON = []string{"application/json"}

// refuse answers a message with err, rendered as the API renders it.
func (s *socket) refuse(id json.RawMessage, err error) []byte {
	status, body, retryAfter := s.h.cfg.Answer(err)
	return s.answer(id, status, body, retryAfter)
}

// answer is the answer to message id: its status, its body (JSON, or empty), and the value of
// the Retry-After header the HTTP answer had (delay-seconds), if any.
func (s *socket) answer(id json.RawMessage, status int, body []byte, retryAfter string) []byte {
	b := append(s.out[:0], `{"id":`...)
	if id == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, id...)
	}
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	if retryAfter != "" { // most answers have none, and ParseInt's error for "" allocates
		if secs, err := strconv.ParseInt(retryAfter, 10, 64); err == nil && secs >= 0 {
			b = append(b, `,"retryAfterMs":`...)
			b = strconv.AppendInt(b, secs*1000, 10)
		}
	}
	if body = bytes.TrimRight(body, "\n"); len(body) > 0 {
		b = append(b, `,"body":`...)
		b = append(b, body...)
	}
	s.out = append(b, '}')
	return s.out
}

// recorder is the http.ResponseWriter of a call: it keeps the answer, which is small.
type recorder struct {
	header http.Header
	status int
	body   []byte
}

func (r *recorder) reset() {
	if r.header == nil {
		r.header = http.Header{}
	}
	clear(r.header)
	r.status = 0
	r.body = r.body[:0]
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	r.body = append(r.body, p...)
	return len(p), nil
}
