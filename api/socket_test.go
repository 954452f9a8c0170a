package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/tablease/tablease/api/socket"
	"github.com/tablease/tablease/lease"
)

// socketReply is an answer read off a socket.
type socketReply struct {
	ID           json.RawMessage `json:"id"`
	Status       int             `json:"status"`
	RetryAfterMs *int64          `json:"retryAfterMs"`
	Body         json.RawMessage `json:"body"`
}

// dialSocket opens a socket to srv (an httptest server of the harness).
func dialSocket(t *testing.T, srv *httptest.Server, header http.Header) *websocket.Conn {
	t.Helper()
	conn, res, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(srv.URL, "http")+"/v1/socket", header)
	if err != nil {
		t.Fatalf("dial: %v (answer %v)", err, res)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// exchange sends msg on conn and reads its answer.
func exchange(t *testing.T, conn *websocket.Conn, msg string) socketReply {
	t.Helper()
	_ = conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if err := conn.WriteMessage(websocket.TextMessage, []byte(msg)); err != nil {
		t.Fatalf("send %s: %v", msg, err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	typ, data, err := conn.ReadMessage()
	if err != nil {
		t.Fatalf("answer to %s: %v", msg, err)
	}
	if typ != websocket.TextMessage {
		t.Fatalf("answer to %s is a frame of type %d, want text", msg, typ)
	}
	var r socketReply
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		t.Fatalf("answer to %s is not the answer shape: %v: %s", msg, err, data)
	}
	return r
}

// closeOf reads conn until it closes, and answers its close code and reason.
func closeOf(t *testing.T, conn *websocket.Conn) (int, string) {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		if _, _, err := conn.ReadMessage(); err != nil {
			var ce *websocket.CloseError
			if !errors.As(err, &ce) {
				t.Fatalf("the socket ended without a close frame: %v", err)
			}
			return ce.Code, ce.Text
		}
	}
}

// withoutToken is a JSON body without its lease token, which each server signs with its own key.
func withoutToken(t *testing.T, body []byte) string {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("body %s: %v", body, err)
	}
	delete(v, "token")
	out, _ := json.Marshal(v)
	return string(out)
}

// TestSocketCallsAnswerAsTheirHTTPRequests runs one history of calls over HTTP on one server and
// over a socket on another, each on its own clock at the same time: every answer is the same
// status and body (lease tokens aside, signed with each server's own key).
func TestSocketCallsAnswerAsTheirHTTPRequests(t *testing.T) {
	viaHTTP, viaSocket := newHarness(t), newHarness(t)
	srv := httptest.NewServer(viaSocket.srv.Handler())
	t.Cleanup(srv.Close)
	alice := viaHTTP.token("alice")
	conn := dialSocket(t, srv, nil)
	if r := exchange(t, conn, `{"id":1,"op":"auth","token":"`+viaSocket.token("alice")+`"}`); r.Status != 200 || !strings.Contains(string(r.Body), `"sub":"alice"`) {
		t.Fatalf("auth answered %d %s", r.Status, r.Body)
	}
	steps := []struct{ op, sid, body string }{
		{"acquire", "doc-1", `{"tabId":"t1","label":"Events"}`},
		{"acquire", "doc-1", `{"tabId":"t2"}`}, // 409 LEASE_HELD
		{"renew", "doc-1", `{"tabId":"t1","epoch":EPOCH,"hidden":true}`},
		{"renew", "doc-1", `{"tabId":"t1","epoch":1}`}, // 409 LEASE_LOST
		{"check", "doc-1", `{"tabId":"t1","epoch":EPOCH}`},
		{"acquire", "doc-1", `{"tabId":"t2","mode":"handoff"}`}, // 409 HANDOFF_PENDING
		{"renew", "doc-1", `{"tabId":"t1","epoch":EPOCH}`},
		{"release", "doc-1", `{"tabId":"t1","epoch":EPOCH}`},
		{"acquire", "doc-1", `{"tabId":"t2","mode":"takeover"}`},
		{"renew", "doc-1", `{"tabId":"t2","epoch":"x"}`},     // 400
		{"renew", "doc-1", `{"tabId":"t2","epoch":2,"x":1}`}, // 400 unknown field
		{"renew", "doc-1", `[]`},                             // 400 not an object
		{"renew", "doc-1", `{"tabId":"t2","epoch":1.5}`},     // 400 fraction
		{"acquire", "no/such", `{"tabId":"t2"}`},             // 400 session id
		{"release", "doc-1", `{"tabId":"t2","gone":true}`},
		{"check", "doc-2", `{"tabId":"t2","epoch":1}`},
	}
	epoch := int64(0) // of the last lease answered over HTTP
	for i, st := range steps {
		st.body = strings.ReplaceAll(st.body, "EPOCH", fmt.Sprint(epoch))
		path := "/v1/sessions/" + strings.ReplaceAll(st.sid, "/", "%2F") + "/lease"
		if st.op != "acquire" {
			path += "/" + st.op
		}
		rec := viaHTTP.post(path, alice, st.body)
		r := exchange(t, conn, fmt.Sprintf(`{"id":"m%d","op":%q,"sid":%q,"body":%s}`, i, st.op, st.sid, st.body))
		if string(r.ID) != fmt.Sprintf(`"m%d"`, i) {
			t.Fatalf("step %d: answer id %s", i, r.ID)
		}
		want := rec.Body.Bytes()
		var l struct{ Epoch int64 }
		if json.Unmarshal(want, &l) == nil && l.Epoch > 0 {
			epoch = l.Epoch
		}
		if r.Status != rec.Code || withoutToken(t, r.Body) != withoutToken(t, want) {
			t.Fatalf("step %d (%s %s %s):\nsocket %d %s\nHTTP   %d %s", i, st.op, st.sid, st.body, r.Status, r.Body, rec.Code, want)
		}
		if ra := rec.Header().Get("Retry-After"); (ra != "") != (r.RetryAfterMs != nil) {
			t.Fatalf("step %d: HTTP Retry-After %q, socket retryAfterMs %v", i, ra, r.RetryAfterMs)
		}
	}
	// The calls were logged and counted as requests of their routes, marked as carried.
	if !strings.Contains(viaSocket.logs.String(), `"route":"/v1/sessions/:sid/lease/renew","path":"/v1/sessions/doc-1/lease/renew"`) ||
		!strings.Contains(viaSocket.logs.String(), `"socket":true`) {
		t.Fatalf("the calls' log lines are missing:\n%s", viaSocket.logs.String())
	}
}

func TestSocketRefusesWhatItCannotServe(t *testing.T) {
	h := newHarness(t)
	srv := httptest.NewServer(h.srv.Handler())
	t.Cleanup(srv.Close)
	conn := dialSocket(t, srv, nil)
	alice := h.token("alice")
	for _, c := range []struct {
		msg    string
		status int
		code   string
		id     string
	}{
		{`{"id":1,"op":"renew","sid":"s","body":{"tabId":"t"}}`, 401, CodeUnauthenticated, "1"}, // before auth
		{`{"id":2,"op":"auth"}`, 400, CodeInvalidArgument, "2"},
		{`{"id":3,"op":"auth","token":"not-a-jwt"}`, 401, CodeUnauthenticated, "3"},
		{`not json`, 400, CodeInvalidArgument, "null"},
		{`{"op":"auth","token":"` + alice + `"}`, 400, CodeInvalidArgument, "null"}, // no id
		{`{"id":{},"op":"auth","token":"` + alice + `"}`, 400, CodeInvalidArgument, "null"},
		{`{"id":1,"id":2,"op":"auth","token":"` + alice + `"}`, 400, CodeInvalidArgument, "null"},
		{`{"id":"` + strings.Repeat("x", 65) + `","op":"renew","sid":"s"}`, 400, CodeInvalidArgument, "null"},
		{`{"id":"` + strings.Repeat("x", 64) + `","op":"renew","sid":"s"}`, 401, CodeUnauthenticated, `"` + strings.Repeat("x", 64) + `"`},
		{`{"id":3,"op":"renew","sid":"s","body":null}`, 400, CodeInvalidArgument, "3"}, // read, but for the null
		{`{"id":"n","op":null}`, 400, CodeInvalidArgument, `"n"`},
		{`{"id":3,"op":"auth","sid":"s","token":"` + alice + `"}`, 400, CodeInvalidArgument, "3"},
		{`{"id":4,"op":"auth","token":"` + alice + `","extra":1}`, 400, CodeInvalidArgument, "4"},
		{`{"id":5,"op":"auth","token":"` + alice + `"}`, 200, "", "5"},
		{`{"id":6,"op":"delete","sid":"s"}`, 400, CodeInvalidArgument, "6"},
		{`{"id":7,"op":"renew","body":{"tabId":"t"}}`, 400, CodeInvalidArgument, "7"},
		{`{"id":9,"op":"renew","sid":"s","token":"x","body":{}}`, 400, CodeInvalidArgument, "9"},
		{`{"id":10,"op":"auth","token":"` + h.token("bob") + `"}`, 403, CodeForbidden, "10"},
		{`{"id":"a\u0031","op":"renew","sid":"s","body":{"tabId":"t","epoch":1}}`, 409, CodeLeaseLost, `"a\u0031"`}, // alice's token is still the socket's
	} {
		r := exchange(t, conn, c.msg)
		if r.Status != c.status || string(r.ID) != c.id {
			t.Fatalf("%s answered id %s status %d %s, want id %s status %d", c.msg, r.ID, r.Status, r.Body, c.id, c.status)
		}
		if c.code != "" && !strings.Contains(string(r.Body), `"code":"`+c.code+`"`) {
			t.Fatalf("%s answered %s, want code %s", c.msg, r.Body, c.code)
		}
	}
	// A binary frame ends the socket with 1003.
	if err := conn.WriteMessage(websocket.BinaryMessage, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if code, _ := closeOf(t, conn); code != websocket.CloseUnsupportedData {
		t.Fatalf("a binary frame closed the socket with %d, want 1003", code)
	}
	// A message over 24 KiB ends it with 1009.
	conn = dialSocket(t, srv, nil)
	if err := conn.WriteMessage(websocket.TextMessage, bytes.Repeat([]byte(" "), 25<<10)); err != nil {
		t.Fatal(err)
	}
	if code, _ := closeOf(t, conn); code != websocket.CloseMessageTooBig {
		t.Fatalf("a message of 25 KiB closed the socket with %d, want 1009", code)
	}
}

func TestSocketHandshakeRefusalsAreAPIErrors(t *testing.T) {
	h := newHarness(t, func(o *Options) {
		o.Sockets = socket.Options{PerInstance: 1}
		o.CORSOrigins = []string{"https://app.example"}
	})
	// Not a WebSocket handshake.
	wantError(t, h.get("/v1/socket", ""), http.StatusBadRequest, CodeInvalidArgument)
	srv := httptest.NewServer(h.srv.Handler())
	t.Cleanup(srv.Close)
	url := "ws" + strings.TrimPrefix(srv.URL, "http") + "/v1/socket"
	// A credential in the handshake, which takes none.
	alice := h.token("alice")
	for _, c := range []struct {
		url    string
		header http.Header
	}{
		{url + "?token=" + alice, nil}, {url + "?access_token=" + alice, nil}, {url + "?ticket=x", nil},
		{url, http.Header{"Authorization": {"Bearer " + alice}}},
	} {
		_, res, err := websocket.DefaultDialer.Dial(c.url, c.header)
		if err == nil || res == nil || res.StatusCode != http.StatusUnauthorized || !strings.Contains(readAll(res), `"op\":\"auth`) {
			t.Fatalf("a handshake with a credential (%s %v): %v %v", c.url, c.header, err, res)
		}
	}
	// A page of an origin that may not call /v1.
	_, res, err := websocket.DefaultDialer.Dial(url, http.Header{"Origin": {"https://evil.example"}})
	if err == nil || res == nil || res.StatusCode != http.StatusForbidden || !strings.Contains(readAll(res), `"reason":"origin_not_allowed"`) {
		t.Fatalf("another origin's page: %v %v", err, res)
	}
	// A page of an allowed origin, up to the instance's limit of one socket.
	conn := dialSocket(t, srv, http.Header{"Origin": {"https://app.example"}})
	_, res, err = websocket.DefaultDialer.Dial(url, nil)
	if err == nil || res == nil || res.StatusCode != http.StatusTooManyRequests || res.Header.Get("Retry-After") == "" ||
		!strings.Contains(readAll(res), `"limit":"sockets_instance"`) {
		t.Fatalf("a socket over the instance's limit: %v %v", err, res)
	}
	// Shutdown ends the open socket with 1001, and refuses new ones.
	h.srv.Shutdown(context.Background())
	if code, _ := closeOf(t, conn); code != websocket.CloseGoingAway {
		t.Fatalf("shutdown closed the socket with %d, want 1001", code)
	}
	_, res, err = websocket.DefaultDialer.Dial(url, nil)
	if err == nil || res == nil || res.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("a socket during shutdown: %v %v", err, res)
	}
}

func readAll(res *http.Response) string {
	var b bytes.Buffer
	_, _ = b.ReadFrom(res.Body)
	return b.String()
}

func TestSocketsEndWhenNotUsed(t *testing.T) {
	h := newHarness(t, func(o *Options) {
		o.Sockets = socket.Options{AuthTimeout: 100 * time.Millisecond, IdleTimeout: 200 * time.Millisecond, PerUser: 1}
	})
	srv := httptest.NewServer(h.srv.Handler())
	t.Cleanup(srv.Close)
	// Without an accepted auth message: 1008, however many other messages it sends.
	conn := dialSocket(t, srv, nil)
	exchange(t, conn, `{"id":1,"op":"renew","sid":"s","body":{}}`)
	if code, reason := closeOf(t, conn); code != websocket.ClosePolicyViolation || !strings.Contains(reason, "auth") {
		t.Fatalf("a socket without auth closed with %d %q, want 1008", code, reason)
	}
	// Authenticated and idle: 1000 "idle"; meanwhile a second socket of the user is refused.
	conn = dialSocket(t, srv, nil)
	alice := h.token("alice")
	if r := exchange(t, conn, `{"id":1,"op":"auth","token":"`+alice+`"}`); r.Status != 200 {
		t.Fatalf("auth answered %d %s", r.Status, r.Body)
	}
	second := dialSocket(t, srv, nil)
	if r := exchange(t, second, `{"id":1,"op":"auth","token":"`+alice+`"}`); r.Status != 429 || !strings.Contains(string(r.Body), `"limit":"sockets_user"`) ||
		r.RetryAfterMs == nil || *r.RetryAfterMs != 5000 {
		t.Fatalf("a second socket of the user answered %d %s, want 429", r.Status, r.Body)
	}
	if code, reason := closeOf(t, conn); code != websocket.CloseNormalClosure || reason != "idle" {
		t.Fatalf("an idle socket closed with %d %q, want 1000 idle", code, reason)
	}
	// Once it is gone, the user may open another.
	_ = second.Close()
	deadline := time.Now().Add(10 * time.Second)
	for h.srv.sockets.Open() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	third := dialSocket(t, srv, nil)
	if r := exchange(t, third, `{"id":1,"op":"auth","token":"`+alice+`"}`); r.Status != 200 {
		t.Fatalf("auth after the idle socket ended answered %d %s", r.Status, r.Body)
	}
}

// TestSocketAuthFailuresCountAgainstTheAddress: an auth message whose token is refused is charged
// to the per-address limit, as a request that fails authentication is, so that a socket is no way
// around it.
func TestSocketAuthFailuresCountAgainstTheAddress(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.IPRateLimit = 1 }) // burst 2
	srv := httptest.NewServer(h.srv.Handler())
	t.Cleanup(srv.Close)
	conn := dialSocket(t, srv, nil)
	for i, want := range []int{401, 401, 429} {
		r := exchange(t, conn, fmt.Sprintf(`{"id":%d,"op":"auth","token":"not-a-token"}`, i))
		if r.Status != want || (want == 429 && !strings.Contains(string(r.Body), `"limit":"ip"`)) {
			t.Fatalf("bad auth message %d answered %d %s, want %d", i, r.Status, r.Body, want)
		}
	}
	// The address is out of tokens for HTTP too.
	rec := h.do(request{method: http.MethodPost, path: leasePath("s") + "/renew", token: "not-a-token", body: `{}`, remote: "127.0.0.1:1"})
	wantError(t, rec, http.StatusTooManyRequests, CodeRateLimited)
}

// TestSocketsLingerThroughTheRenewIntervalOfTheDefaultTTL: by default a socket keeps the goroutine
// of its last call for the renew interval of a lease of the default TTL plus socketLingerSlack (12 s
// at a default TTL of 30 s), so that the renews of a tab at the default TTL find it there, and
// only then waits in a goroutine of its own; Options.Sockets.Linger sets another.
func TestSocketsLingerThroughTheRenewIntervalOfTheDefaultTTL(t *testing.T) {
	// moved counts the sockets that wait in a goroutine of their own: one a socket's goroutine
	// started as it went idle (package socket, run).
	moved := func() int {
		buf := make([]byte, 1<<20)
		return strings.Count(string(buf[:runtime.Stack(buf, true)]), "created by github.com/tablease/tablease/api/socket.(*socket).run")
	}
	for _, tc := range []struct {
		name   string
		opts   func(*Options)
		moves  bool
		within time.Duration
	}{
		{"the default, at a default TTL of 30 s", func(o *Options) {
			o.Limits = lease.Limits{Min: time.Second, Default: 30 * time.Second, Max: time.Minute, HiddenMax: time.Minute}
		}, false, 3 * time.Second},
		{"Options.Sockets.Linger of 10 ms", func(o *Options) { o.Sockets.Linger = 10 * time.Millisecond }, true, 10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.opts)
			srv := httptest.NewServer(h.srv.Handler())
			t.Cleanup(srv.Close)
			before := moved()
			conn := dialSocket(t, srv, nil)
			if r := exchange(t, conn, `{"id":1,"op":"auth","token":"`+h.token("alice")+`"}`); r.Status != 200 {
				t.Fatalf("auth answered %d %s", r.Status, r.Body)
			}
			// Past socket.DefaultLinger (2 s), which a server that did not set the linger would
			// use, the socket of the first case still lingers; that of the second moved long ago.
			deadline := time.Now().Add(tc.within)
			for time.Now().Before(deadline) && moved() == before {
				time.Sleep(10 * time.Millisecond)
			}
			if got := moved() > before; got != tc.moves {
				t.Fatalf("within %v the socket came to wait in a goroutine of its own: %v, want %v", tc.within, got, tc.moves)
			}
		})
	}
}
