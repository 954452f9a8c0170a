package api

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"
)

// # Protocol errors
//
// net/http answers some requests before any handler sees them: headers over
// http.Server.MaxHeaderBytes (431), requests that are not valid HTTP/1.1 (400: a malformed request
// line, header or Host, a bad Content-Length…), a transfer coding it does not know (501) and a
// protocol version it does not serve (505). It writes them straight to the connection as
// text/plain, in one write with no Date header, then closes the connection. It also answers a
// request whose Expect is not 100-continue by itself (sendExpectationFailed): a 417 with no body,
// whose only headers are Connection: close, a Date and, but to HTTP/1.0, Content-Length: 0.
// ProtocolErrors wraps the listener so that those answers, and only those, become the JSON error
// shape every error of the api has, with a new X-Request-ID and nosniff: 431 HEADERS_TOO_LARGE,
// 417 EXPECTATION_FAILED, and 400 INVALID_ARGUMENT for the others, its message naming what was
// wrong as net/http says it (which holds nothing of the request).

// maxHeadSize bounds a request line and its headers together (16 KiB; see MaxHeaderBytes).
const maxHeadSize = 16 << 10

// framing is the middleware of what net/http lets through of a request's framing: a head over
// maxHeadSize on a kept-alive connection (boundedHead), an Expect it would serve as 100-continue
// alone (onlyContinue), a chunked body (closeAfterChunked). One middleware for the three, as Echo
// builds the closure of each middleware anew for every request.
func framing(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if err := boundedHead(c); err != nil {
			return err
		}
		if !onlyContinue(c.Request()) {
			c.Response().Header().Set(echo.HeaderConnection, "close")
			return expectationFailed417()
		}
		closeAfterChunked(c)
		return next(c)
	}
}

// boundedHead refuses a request whose line and headers are over maxHeadSize, as net/http does for
// the first request of a connection (MaxHeaderBytes): on a kept-alive connection net/http has
// buffered up to 4 KiB of the next request before it starts counting, so that request could
// carry up to 20 KiB. It counts the request as net/http parsed it (whitespace around header values
// aside), and closes the connection after the answer, as net/http does.
func boundedHead(c echo.Context) error {
	if headSize(c.Request()) > maxHeadSize {
		c.Response().Header().Set(echo.HeaderConnection, "close")
		return headersTooLarge()
	}
	return nil
}

// onlyContinue reports whether the Expect headers of req name nothing besides 100-continue.
// net/http reads the first header line only, and serves "100-continue, foo", or a second Expect
// line, as if it were 100-continue alone: framing refuses those, as net/http refuses an
// Expect other than 100-continue (417 EXPECTATION_FAILED, sent before the body is asked for, the
// connection closed after it).
func onlyContinue(req *http.Request) bool {
	for _, line := range req.Header.Values("Expect") {
		for v := range strings.SplitSeq(line, ",") {
			// An empty value expects nothing, as net/http reads it.
			if v = strings.TrimSpace(v); v != "" && !strings.EqualFold(v, "100-continue") {
				return false
			}
		}
	}
	return true
}

// closeAfterChunked closes the connection after the answer to a request whose body came chunked.
// net/http serves a request that carries both Transfer-Encoding and Content-Length by the first,
// deleting the second, so the api cannot tell it from a plain chunked one; and RFC 9112 §6.1 wants
// the connection closed after such a request: a proxy in front that framed it by its
// Content-Length would take what follows for another request (request smuggling). Browsers never
// send chunked bodies over HTTP/1.1, so closing after every one costs the rare client that does a
// new connection.
func closeAfterChunked(c echo.Context) {
	if len(c.Request().TransferEncoding) > 0 {
		c.Response().Header().Set(echo.HeaderConnection, "close")
	}
}

// headSize is the size of r's request line and headers on the wire, as net/http parsed them.
func headSize(r *http.Request) int {
	n := len(r.Method) + 1 + len(r.RequestURI) + 1 + len(r.Proto) + len("\r\n")
	if r.Host != "" {
		n += len("Host: \r\n") + len(r.Host)
	}
	for name, values := range r.Header {
		for _, v := range values {
			n += len(name) + len(": \r\n") + len(v)
		}
	}
	return n + len("\r\n")
}

// routeProtocolError and methodOther are the labels of requests that are not valid HTTP/1.1.
const routeProtocolError, methodOther = "protocol_error", "OTHER"

// ProtocolErrors wraps ln so that the errors net/http answers by itself are JSON (see above), and
// logged and counted as the answers of routes are, with the route "protocol_error" and the method
// "OTHER" (net/http read neither). Serve the api with http.Server.Serve(s.ProtocolErrors(ln)).
func (s *Server) ProtocolErrors(ln net.Listener) net.Listener { return protocolListener{ln, s} }

type protocolListener struct {
	net.Listener
	s *Server
}

func (l protocolListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &protocolConn{Conn: c, s: l.s}, nil
}

// protocolConn rewrites net/http's own error answers on their way out; every other write passes.
type protocolConn struct {
	net.Conn
	s *Server
}

// netHTTPErrorHeaders are the headers of every answer net/http writes by itself.
const netHTTPErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

func (c *protocolConn) Write(p []byte) (int, error) {
	if out, e, id, ok := jsonProtocolError(p); ok {
		_, err := c.Conn.Write(out)
		c.s.logProtocolError(e, id, c.RemoteAddr())
		if err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// logProtocolError logs and counts the answer e, with request id id, that net/http gave by itself
// to the peer at addr. The line has no path and no duration: net/http read no request. Such
// answers are charged to the peer's address as failed authentications are (limitFailure): beyond
// its burst they are logged at debug only, so that a flood of them from one address leaves at
// most its burst in the log (their answer is net/http's all the same).
func (s *Server) logProtocolError(e *Error, id string, addr net.Addr) {
	status := e.Status()
	s.metrics.requests.WithLabelValues(routeProtocolError, methodOther, strconv.Itoa(status)).Inc()
	level := slog.LevelInfo
	if s.ipLimit != nil {
		if ok, _, _ := s.ipLimit.allow(clientKey(addr.String())); !ok {
			level = slog.LevelDebug
		}
	}
	s.log.LogAttrs(context.Background(), level, "request",
		slog.String("request_id", id), slog.String("method", methodOther), slog.String("route", routeProtocolError),
		slog.String("peer", peerHost(addr.String())), slog.Int("status", status), slog.String("code", e.Code),
		slog.String("error", e.Message))
}

// CloseWrite lets net/http half-close the connection after a 431, as it does without the wrapper.
func (c *protocolConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// NetConn answers the connection c wraps, as crypto/tls.Conn's does: package stream sets the send
// buffer of a stream's socket through it, and resets the socket of a stream whose client stopped
// reading.
func (c *protocolConn) NetConn() net.Conn { return c.Conn }

// jsonProtocolError answers the JSON rewrite of p when p is a whole error answer of net/http's
// own (netHTTPError), with the error it tells and the request id it gives.
func jsonProtocolError(p []byte) ([]byte, *Error, string, bool) {
	const prefix = "HTTP/1.1 "
	e := netHTTPError(p)
	if e == nil {
		return nil, nil, "", false
	}
	body, err := json.Marshal(errorBody{Error: errorJSON{Code: e.Code, Message: e.Message, Details: map[string]any{}}})
	if err != nil {
		return nil, nil, "", false
	}
	var out bytes.Buffer
	out.WriteString(prefix + strconv.Itoa(e.Status()) + " " + http.StatusText(e.Status()) + "\r\n")
	out.WriteString("Content-Type: application/json\r\nX-Content-Type-Options: nosniff\r\nCache-Control: no-store\r\nConnection: close\r\n")
	id := NewRequestID()
	out.WriteString("X-Request-Id: " + id + "\r\n")
	out.WriteString("Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n")
	out.Write(body)
	return out.Bytes(), e, id, true
}

// netHTTPError is the error that p tells when it is a whole error answer of net/http's own: its
// 417 (expectationFailed), or "HTTP/1.1 <status> <text>[: <reason>]" and netHTTPErrorHeaders, then
// the body; nil for every other write.
func netHTTPError(p []byte) *Error {
	const prefix = "HTTP/1.1 "
	if len(p) > 1024 {
		return nil
	}
	if expectationFailed(p) {
		return expectationFailed417()
	}
	if !bytes.HasPrefix(p, []byte(prefix)) {
		return nil
	}
	statusLine, _, found := bytes.Cut(p[len(prefix):], []byte(netHTTPErrorHeaders))
	if !found || bytes.ContainsAny(statusLine, "\r\n") || len(statusLine) < 4 {
		return nil
	}
	msg := "malformed HTTP request"
	if _, reason, ok := bytes.Cut(statusLine, []byte(": ")); ok {
		msg += ": " + string(reason)
	}
	switch status, _ := strconv.Atoi(string(statusLine[:3])); status {
	case http.StatusRequestHeaderFieldsTooLarge:
		return headersTooLarge()
	case http.StatusBadRequest, http.StatusHTTPVersionNotSupported:
		return errInvalid(msg)
	case http.StatusNotImplemented: // the only one net/http writes: a Transfer-Encoding it does not know
		return errInvalid(msg + ": unsupported transfer encoding (only chunked is)")
	}
	return nil
}

// expectationFailed417 is the error of a request whose Expect is not 100-continue alone.
func expectationFailed417() *Error {
	return &Error{Code: CodeExpectationFailed, Message: "the Expect header asks for what this server does not do: only 100-continue is served"}
}

// expectationFailed reports whether p is net/http's answer to a request whose Expect is not
// 100-continue: "HTTP/1.x 417 Expectation Failed", Connection: close, a Date, and Content-Length: 0
// to HTTP/1.1 (none to HTTP/1.0), with no body. No handler of the api answers 417, and its answers
// have a Content-Type.
func expectationFailed(p []byte) bool {
	rest, ok := bytes.CutPrefix(p, []byte("HTTP/1."))
	if !ok || len(rest) == 0 || (rest[0] != '0' && rest[0] != '1') {
		return false
	}
	rest, ok = bytes.CutPrefix(rest[1:], []byte(" 417 Expectation Failed\r\nConnection: close\r\nDate: "))
	if !ok {
		return false
	}
	date, rest, ok := bytes.Cut(rest, []byte("\r\n"))
	if !ok || len(date) != len(http.TimeFormat) {
		return false
	}
	return string(rest) == "\r\n" || string(rest) == "Content-Length: 0\r\n\r\n"
}
