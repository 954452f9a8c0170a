package api

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

func TestTokenClaimsAreReadStrictly(t *testing.T) {
	h := newHarness(t)
	hs := func(edit func(jwt.MapClaims)) string {
		c := validClaims(h.auth, "alice")
		edit(c)
		return sign(t, jwt.SigningMethodHS256, h.auth.HS256Secret, "", c)
	}
	farFuture := time.Now().Add(time.Hour).Unix()
	for _, tt := range []struct {
		name  string
		token string
		why   string // in the message, when set
	}{
		{"an exp given as a string is refused", hs(func(c jwt.MapClaims) { c["exp"] = itoa(farFuture) }), ""},
		{"an nbf given as a string is refused", hs(func(c jwt.MapClaims) { c["nbf"] = "0" }), ""},
		{"an iat given as a string is refused", hs(func(c jwt.MapClaims) { c["iat"] = "0" }), ""},
		{"a scope list holding a number is refused", hs(func(c jwt.MapClaims) { c["scope"] = []any{"lease:admin", 7} }), ""},
		// Beyond int64 seconds golang-jwt would read a date in the distant past: "expired".
		{"an exp beyond the year 9999 is malformed, not expired", hs(func(c jwt.MapClaims) { c["exp"] = 1e19 }), "malformed"},
		{"a negative iat is malformed", hs(func(c jwt.MapClaims) { c["iat"] = -1 }), "malformed"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := wantError(t, h.get(leasePath("doc-1"), tt.token), http.StatusUnauthorized, CodeUnauthenticated)
			if !strings.Contains(e.Error.Message, tt.why) {
				t.Errorf("message %q, want it to say %q", e.Error.Message, tt.why)
			}
		})
	}

	t.Run("a scope given as a JSON array is read as a list of scopes", func(t *testing.T) {
		tok := hs(func(c jwt.MapClaims) { c["scope"] = []string{"lease:read", ScopeAdmin} })
		rec := h.get("/v1/admin/catalog", tok)
		if rec.Code != http.StatusOK {
			t.Fatalf("status %d, want 200: %s", rec.Code, rec.Body)
		}
	})
	t.Run("a scope given as one string still holds several scopes", func(t *testing.T) {
		tok := hs(func(c jwt.MapClaims) { c["scope"] = "lease:read " + ScopeAdmin })
		if rec := h.get("/v1/admin/catalog", tok); rec.Code != http.StatusOK {
			t.Fatalf("status %d, want 200: %s", rec.Code, rec.Body)
		}
	})
}

func TestDuplicateAuthorizationHeadersAreRefused(t *testing.T) {
	h := newHarness(t)
	valid := h.token("alice")
	for _, tt := range []struct {
		name    string
		headers []string
	}{
		{"two valid tokens are refused", []string{"Bearer " + valid, "Bearer " + valid}},
		{"a valid token beside garbage is refused", []string{"Bearer " + valid, "Basic x"}},
		{"garbage before a valid token is refused", []string{"Basic x", "Bearer " + valid}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodGet, leasePath("doc-1"), nil)
			for _, v := range tt.headers {
				req.Header.Add("Authorization", v)
			}
			rec := httptest.NewRecorder()
			h.srv.Handler().ServeHTTP(rec, req)
			e := wantError(t, rec, http.StatusUnauthorized, CodeUnauthenticated)
			if !strings.Contains(e.Error.Message, "one Authorization header") {
				t.Errorf("message %q does not say why", e.Error.Message)
			}
		})
	}
}

func TestTokensLimitedToSessionsCannotUseAdminRoutes(t *testing.T) {
	h := newHarness(t)
	limited := func(sessions ...string) string {
		tok, err := IssueToken(h.auth, TokenSpec{Sub: "root", Scopes: []string{ScopeAdmin}, Sessions: sessions})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	for _, tt := range []struct {
		name, path, token string
	}{
		{"a token limited to the session the path names", "/v1/admin/users/bob/sessions/doc-1/lease", limited("doc-1")},
		{"a token limited to several sessions, one of them the path's", "/v1/admin/users/bob/sessions/doc-1/lease", limited("doc-1", "doc-2")},
		{"a limited token on a route without a session", "/v1/admin/leases", limited("doc-1")},
		{"a limited token on the audit log", "/v1/admin/audit", limited("doc-1")},
		{"a limited token on the catalog", "/v1/admin/catalog", limited("doc-1")},
	} {
		t.Run(tt.name+" is forbidden", func(t *testing.T) {
			e := wantError(t, h.get(tt.path, tt.token), http.StatusForbidden, CodeForbidden)
			if !strings.Contains(e.Error.Message, "sid") {
				t.Errorf("message %q does not say why", e.Error.Message)
			}
		})
	}
	t.Run("an admin token without sid passes", func(t *testing.T) {
		if rec := h.get("/v1/admin/catalog", limited()); rec.Code != http.StatusOK {
			t.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
	})
}

func TestDevModeNeverMintsTokensADeploymentAccepts(t *testing.T) {
	dev := newHarness(t, func(o *Options) { o.Dev = true })
	mint := func(host string) *httptest.ResponseRecorder {
		return dev.do(request{method: http.MethodGet, path: "/dev/token?sub=root&scope=lease:admin", remote: "127.0.0.1:5555", host: host})
	}
	rec := mint("localhost:8080")
	if rec.Code != http.StatusOK {
		t.Fatalf("/dev/token: %d %s", rec.Code, rec.Body)
	}
	var answer struct {
		Token string `json:"token"`
	}
	decodeStrict(t, rec, &struct {
		Token     *string `json:"token"`
		TokenType string  `json:"tokenType"`
		Sub       string  `json:"sub"`
		ExpiresAt string  `json:"expiresAt"`
	}{Token: &answer.Token})

	t.Run("the token's issuer is the dev issuer", func(t *testing.T) {
		claims := jwt.MapClaims{}
		if _, _, err := jwt.NewParser().ParseUnverified(answer.Token, claims); err != nil {
			t.Fatal(err)
		}
		if claims["iss"] != DevIssuer {
			t.Fatalf("iss = %v, want %s", claims["iss"], DevIssuer)
		}
	})
	t.Run("the dev server accepts its own tokens and those of the configured issuer", func(t *testing.T) {
		readLease(t, dev.get(leasePath("doc-1"), answer.Token))
		readLease(t, dev.get(leasePath("doc-1"), dev.token("alice")))
	})
	t.Run("a deployment with the same secret refuses the dev token", func(t *testing.T) {
		prod := newHarness(t)
		e := wantError(t, prod.get(leasePath("doc-1"), answer.Token), http.StatusUnauthorized, CodeUnauthenticated)
		if !strings.Contains(e.Error.Message, "issuer") {
			t.Errorf("message %q does not name the issuer", e.Error.Message)
		}
	})
	t.Run("a deployment cannot be configured with the dev issuer", func(t *testing.T) {
		auth := testAuthConfig()
		auth.Issuer = DevIssuer
		opts := Options{Engine: dev.engine, Auth: auth}
		memoryStores(&opts)
		if _, err := New(opts); err == nil || !strings.Contains(err.Error(), DevIssuer) {
			t.Fatalf("New = %v, want an error naming %s", err, DevIssuer)
		}
	})
	for _, host := range []string{"127.0.0.1:8080", "localhost", "LOCALHOST:80", "app.localhost:8080", "[::1]:8080", "127.1.2.3"} {
		t.Run("a request to the loopback name "+host+" gets a token", func(t *testing.T) {
			if rec := mint(host); rec.Code != http.StatusOK {
				t.Fatalf("%d %s", rec.Code, rec.Body)
			}
		})
	}
	for _, host := range []string{"evil.example:8080", "evil.example", "localhost.evil.example", "10.0.0.1:8080", "[::2]:80"} {
		t.Run("a request to the name "+host+" is refused (DNS rebinding)", func(t *testing.T) {
			rec := mint(host)
			e := wantError(t, rec, http.StatusForbidden, CodeForbidden)
			if e.Error.Details["reason"] != "host_not_loopback" {
				t.Errorf("details %v", e.Error.Details)
			}
			if cc := rec.Header().Get("Cache-Control"); cc != "no-store" {
				t.Errorf("Cache-Control = %q, want no-store", cc)
			}
		})
	}
}

func TestAnswersThatCarryALeaseTokenAreNotStored(t *testing.T) {
	h := newHarness(t)
	tok := h.token("alice")
	noStore := func(t *testing.T, rec *httptest.ResponseRecorder) leaseAnswer {
		t.Helper()
		l := readLease(t, rec)
		if l.Token == nil {
			t.Fatalf("no lease token in %s", rec.Body)
		}
		if cc := rec.Header().Get("Cache-Control"); cc != "no-store" {
			t.Fatalf("Cache-Control = %q, want no-store", cc)
		}
		return l
	}
	var l leaseAnswer
	t.Run("an acquire answer is Cache-Control: no-store", func(t *testing.T) {
		l = noStore(t, h.post(leasePath("doc-1"), tok, `{"tabId":"t-1"}`))
	})
	t.Run("a renew answer is Cache-Control: no-store", func(t *testing.T) {
		noStore(t, h.post(leasePath("doc-1")+"/renew", tok, `{"tabId":"t-1","epoch":`+itoa(l.Epoch)+`}`))
	})
}

func TestEveryAnswerIsNosniff(t *testing.T) {
	h := newHarness(t)
	for _, tt := range []struct {
		name string
		rec  *httptest.ResponseRecorder
	}{
		{"a lease", h.get(leasePath("doc-1"), h.token("alice"))},
		{"an error of /v1", h.get(leasePath("doc-1"), "")},
		{"an unknown route", h.get("/v1/nothing", "")},
		{"the health check", h.get("/healthz", "")},
	} {
		t.Run(tt.name+" is nosniff", func(t *testing.T) {
			if v := tt.rec.Header().Get("X-Content-Type-Options"); v != "nosniff" {
				t.Fatalf("X-Content-Type-Options = %q (status %d)", v, tt.rec.Code)
			}
		})
	}
}

func TestLoggedPathsAreTruncated(t *testing.T) {
	h := newHarness(t)
	long := "/v1/" + strings.Repeat("a", 15<<10)
	wantError(t, h.get(long, ""), http.StatusNotFound, CodeNotFound)
	logs := h.logs.String()
	if len(logs) > 4<<10 {
		t.Fatalf("a request with a 15 KiB path wrote %d bytes of log", len(logs))
	}
	if !strings.Contains(logs, "bytes)") {
		t.Fatalf("the log does not say the path was cut: %s", logs)
	}
}

// TestLogLinesHoldNoRawControlOrFormatCharacters: slog's JSON handler escapes only what JSON
// needs, so a path logged as net/http decoded it, or a claim's name in the reason a token was
// refused, would carry U+0085 (NEL), U+202E (right-to-left override) or DEL raw into a log line,
// which a terminal or a log viewer shows as something else.
func TestLogLinesHoldNoRawControlOrFormatCharacters(t *testing.T) {
	h := newHarness(t)
	for _, path := range []string{"/v1/a%C2%85b%E2%80%AEc%7Fd", "/v1/a\u0085b\u202ec"} {
		wantError(t, h.get(path, ""), http.StatusNotFound, CodeNotFound)
	}
	// A token whose claims give a key twice is refused, and the reason names the key.
	enc := base64.RawURLEncoding.EncodeToString
	now := time.Now().Unix()
	signing := enc([]byte(`{"alg":"HS256","typ":"JWT"}`)) + "." + enc([]byte(fmt.Sprintf(
		`{"iss":%q,"aud":%q,"sub":"alice","iat":%d,"exp":%d,"x\u0085\u202e\u007f":1,"x\u0085\u202e\u007f":2}`,
		h.auth.Issuer, h.auth.Audience, now-60, now+3600)))
	sig, err := jwt.SigningMethodHS256.Sign(signing, h.auth.HS256Secret)
	if err != nil {
		t.Fatal(err)
	}
	e := wantError(t, h.get(leasePath("doc-1"), signing+"."+enc(sig)), http.StatusUnauthorized, CodeUnauthenticated)
	if want := `"x\u0085\u202e\x7f" is given twice`; !strings.Contains(e.Error.Message, want) {
		t.Errorf("message %q lacks %s", e.Error.Message, want)
	}
	logs := h.logs.String()
	for _, raw := range []string{"\u0085", "\u202e", "\x7f"} {
		if strings.Contains(logs, raw) {
			t.Errorf("the log holds %q raw:\n%s", raw, logs)
		}
	}
	for _, want := range []string{`"path":"/v1/a%C2%85b%E2%80%AEc%7Fd"`, `"path":"/v1/a%C2%85b%E2%80%AEc"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("the log lacks %s:\n%s", want, logs)
		}
	}
}

func TestFailedAndUnauthenticatedRequestsAreLimitedPerAddress(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.IPRateLimit = 1 }) // burst 2
	from := func(remote string, r request) *httptest.ResponseRecorder {
		r.remote = remote
		if r.method == "" {
			r.method = http.MethodGet
		}
		return h.do(r)
	}
	const attacker = "192.0.2.7:4000"
	for range 2 {
		wantError(t, from(attacker, request{path: leasePath("doc-1")}), http.StatusUnauthorized, CodeUnauthenticated)
	}
	rec := from(attacker, request{path: leasePath("doc-1"), token: "not-a-jwt"})
	e := wantError(t, rec, http.StatusTooManyRequests, CodeRateLimited)
	if ra := rec.Header().Get("Retry-After"); ra != "1" {
		t.Errorf("Retry-After = %q, want 1", ra)
	}
	if e.Error.Details["limit"] != "ip" || e.Error.Details["retryAfterMs"] == nil || !*e.Error.Retryable {
		t.Errorf("429 answer %s", rec.Body)
	}

	t.Run("unknown routes from the same address are refused too", func(t *testing.T) {
		wantError(t, from(attacker, request{path: "/v1/" + strings.Repeat("x", 1000)}), http.StatusTooManyRequests, CodeRateLimited)
		wantError(t, from(attacker, request{path: "/nothing"}), http.StatusTooManyRequests, CodeRateLimited)
	})
	t.Run("refused requests are not logged at info level", func(t *testing.T) {
		if n := strings.Count(h.logs.String(), `"level":"INFO","msg":"request"`); n != 2 {
			t.Errorf("%d request lines at info level, want the 2 of the burst:\n%s", n, h.logs)
		}
	})
	t.Run("a valid token from the same address still passes", func(t *testing.T) {
		readLease(t, from(attacker, request{path: leasePath("doc-1"), token: h.token("alice")}))
	})
	t.Run("requests of no route with a valid token never use the address's bucket", func(t *testing.T) {
		const shared = "192.0.2.8:4000" // a NAT with a client that mistypes paths
		alice := h.token("alice")
		for range 5 {
			wantError(t, from(shared, request{path: "/v1/nope", token: alice}), http.StatusNotFound, CodeNotFound)
			wantError(t, from(shared, request{method: http.MethodDelete, path: leasePath("doc-1"), token: alice}),
				http.StatusMethodNotAllowed, CodeMethodNotAllowed)
		}
		wantError(t, from(shared, request{path: leasePath("doc-1")}), http.StatusUnauthorized, CodeUnauthenticated)
		wantError(t, from(shared, request{path: "/v1/nope", token: "not-a-jwt"}), http.StatusNotFound, CodeNotFound)
		wantError(t, from(shared, request{path: "/v1/nope", token: alice + "x"}), http.StatusTooManyRequests, CodeRateLimited)
	})
	t.Run("another address has a bucket of its own", func(t *testing.T) {
		wantError(t, from("198.51.100.1:4000", request{path: leasePath("doc-1")}), http.StatusUnauthorized, CodeUnauthenticated)
	})
	t.Run("the addresses of one IPv6 /64 share a bucket", func(t *testing.T) {
		for range 2 {
			wantError(t, from("[2001:db8:1:2::1]:4000", request{path: leasePath("doc-1")}), http.StatusUnauthorized, CodeUnauthenticated)
		}
		wantError(t, from("[2001:db8:1:2:ffff::9]:4000", request{path: leasePath("doc-1")}), http.StatusTooManyRequests, CodeRateLimited)
		wantError(t, from("[2001:db8:1:3::1]:4000", request{path: leasePath("doc-1")}), http.StatusUnauthorized, CodeUnauthenticated)
	})
	t.Run("public routes are not limited", func(t *testing.T) {
		if rec := from(attacker, request{path: "/healthz"}); rec.Code != http.StatusOK {
			t.Fatalf("/healthz: %d", rec.Code)
		}
	})
}

func TestClientKey(t *testing.T) {
	for _, tt := range []struct{ remote, want string }{
		{"192.0.2.7:4000", "192.0.2.7"},
		{"[::ffff:192.0.2.7]:4000", "192.0.2.7"},
		{"[2001:db8:1:2:3:4:5:6]:4000", "2001:db8:1:2::/64"},
		{"[fe80::1%eth0]:4000", "fe80::/64"},
		{"not an address", "not an address"},
	} {
		if got := clientKey(tt.remote); got != tt.want {
			t.Errorf("clientKey(%q) = %q, want %q", tt.remote, got, tt.want)
		}
	}
}

func TestOnlyNetHTTPsOwnErrorAnswersAreRewritten(t *testing.T) {
	for _, tt := range []struct {
		name    string
		written string
		status  string // "" when the write must pass unchanged
	}{
		{"net/http's 431", "HTTP/1.1 431 Request Header Fields Too Large" + netHTTPErrorHeaders + "431 Request Header Fields Too Large", "431"},
		{"net/http's 400", "HTTP/1.1 400 Bad Request" + netHTTPErrorHeaders + "400 Bad Request", "400"},
		{"net/http's 400 with a reason", "HTTP/1.1 400 Bad Request: missing required Host header" + netHTTPErrorHeaders + "400 Bad Request: missing required Host header", "400"},
		{"net/http's 501", "HTTP/1.1 501 Not Implemented" + netHTTPErrorHeaders + "Unsupported transfer encoding", "400"},
		{"net/http's 505", "HTTP/1.1 505 HTTP Version Not Supported: unsupported protocol version" + netHTTPErrorHeaders +
			"505 HTTP Version Not Supported: unsupported protocol version", "400"},
		{"net/http's 417", "HTTP/1.1 417 Expectation Failed\r\nConnection: close\r\nDate: Thu, 03 Dec 2026 02:00:00 GMT\r\nContent-Length: 0\r\n\r\n", "417"},
		{"net/http's 417 to HTTP/1.0", "HTTP/1.0 417 Expectation Failed\r\nConnection: close\r\nDate: Thu, 03 Dec 2026 02:00:00 GMT\r\n\r\n", "417"},
		{"a 417 with a body", "HTTP/1.1 417 Expectation Failed\r\nConnection: close\r\nDate: Thu, 03 Dec 2026 02:00:00 GMT\r\nContent-Length: 2\r\n\r\n{}", ""},
		{"an answer of a status net/http never writes by itself", "HTTP/1.1 500 Internal Server Error" + netHTTPErrorHeaders + "x", ""},
		{"a handler's answer", "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nDate: Thu, 03 Dec 2026 02:00:00 GMT\r\n\r\n{}", ""},
		{"a handler's text answer", "HTTP/1.1 400 Bad Request\r\nDate: Thu, 03 Dec 2026 02:00:00 GMT" + netHTTPErrorHeaders, ""},
		{"a chunk of an event stream", "1a\r\nevent: lease\r\ndata: {}\r\n\r\n", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out, told, id, ok := jsonProtocolError([]byte(tt.written))
			if tt.status == "" {
				if ok {
					t.Fatalf("rewritten to %q", out)
				}
				return
			}
			if !ok || !strings.HasPrefix(string(out), "HTTP/1.1 "+tt.status+" ") || !strings.Contains(string(out), "Content-Type: application/json\r\n") {
				t.Fatalf("got %q, %v", out, ok)
			}
			resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(string(out))), nil)
			if err != nil {
				t.Fatal(err)
			}
			var e errorAnswer
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || Codes[e.Error.Code] != resp.StatusCode {
				t.Fatalf("body %+v for status %d: %v", e, resp.StatusCode, err)
			}
			if resp.Header.Get("X-Request-ID") != id || id == "" || resp.Header.Get("X-Content-Type-Options") != "nosniff" ||
				resp.Header.Get("Cache-Control") != "no-store" {
				t.Fatalf("headers %v, want the X-Request-ID %q, nosniff and no-store", resp.Header, id)
			}
			if told.Code != e.Error.Code {
				t.Fatalf("the error told for the log is %s, the answer's %s", told.Code, e.Error.Code)
			}
		})
	}
}

func TestTheTableOfAddressesIsBounded(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	u := newUserLimiter(1, ipLimiterCap, func() time.Time { return now })
	for i := range ipLimiterCap + 1000 {
		u.allow(clientKey("[2001:db8:" + strconv.FormatInt(int64(i), 16) + "::1]:443"))
	}
	if n := u.size(); n > ipLimiterCap {
		t.Fatalf("%d addresses kept, cap %d", n, ipLimiterCap)
	}
}

// TestALongPathIsLoggedCutOutsideAnEscapeInASCII: a path over 256 bytes is logged cut, with its
// length, in ASCII, and never ends inside a %-escape, wherever the 256th byte falls.
func TestALongPathIsLoggedCutOutsideAnEscapeInASCII(t *testing.T) {
	for shift := range 3 {
		h := newHarness(t)
		path := "/v1/" + strings.Repeat("a", shift) + strings.Repeat("%C3%A9", 100)
		wantError(t, h.get(path, ""), http.StatusNotFound, CodeNotFound)
		logs := h.logs.String()
		i := strings.Index(logs, `"path":"`)
		if i < 0 {
			t.Fatalf("no path in the log:\n%s", logs)
		}
		logged, _, _ := strings.Cut(logs[i+len(`"path":"`):], `"`)
		head, rest, ok := strings.Cut(logged, "...(")
		if !ok || rest != strconv.Itoa(len(path))+" bytes)" || len(head) > 256 || !strings.HasPrefix(path, head) {
			t.Errorf("shift %d: the path is logged as %q, want a prefix of at most 256 bytes, ...(%d bytes)", shift, logged, len(path))
		}
		if j := strings.LastIndexByte(head, '%'); j >= 0 && j > len(head)-3 {
			t.Errorf("shift %d: the logged path %q ends inside an escape", shift, logged)
		}
		for _, r := range logged {
			if r < 0x20 || r > 0x7e {
				t.Errorf("shift %d: the logged path %q holds %U", shift, logged, r)
			}
		}
	}
}

// TestAFloodOfMalformedRequestsLeavesItsBurstInTheLog: the answers net/http gives by itself to
// requests that are not valid HTTP are charged to their address, and beyond its burst logged at
// debug only, as refused authentications are.
func TestAFloodOfMalformedRequestsLeavesItsBurstInTheLog(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.IPRateLimit = 1 }) // burst 2
	attacker := &net.TCPAddr{IP: net.IPv4(192, 0, 2, 7), Port: 4000}
	for range 50 {
		h.srv.logProtocolError(&Error{Code: CodeHeadersTooLarge, Message: "request headers too large"}, NewRequestID(), attacker)
	}
	if n := strings.Count(h.logs.String(), `"level":"INFO","msg":"request"`); n != 2 {
		t.Errorf("%d request lines at info level for 50 malformed requests, want the 2 of the burst:\n%s", n, h.logs)
	}
	if n := strings.Count(h.logs.String(), `"route":"protocol_error"`); n != 50 {
		t.Errorf("%d protocol_error lines at debug and info, want 50", n)
	}
}
