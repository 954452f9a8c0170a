package api

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

const (
	appOrigin   = "https://app.example.com"
	otherOrigin = "https://evil.example.net"
)

func corsHarness(t *testing.T, origins ...string) *harness {
	t.Helper()
	return newHarness(t, func(o *Options) { o.CORSOrigins = origins; o.RateLimit = 1 })
}

// varyHas reports whether the Vary headers of hdr name field.
func varyHas(hdr http.Header, field string) bool {
	for _, v := range hdr.Values("Vary") {
		for _, f := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(f), field) {
				return true
			}
		}
	}
	return false
}

// wantCORS checks the CORS headers of an actual answer to origin.
func wantCORS(t *testing.T, hdr http.Header, origin string) {
	t.Helper()
	if got := hdr.Values("Access-Control-Allow-Origin"); !slices.Equal(got, []string{origin}) {
		t.Fatalf("Access-Control-Allow-Origin = %q, want %q", got, origin)
	}
	if got := hdr.Get("Access-Control-Expose-Headers"); got != "Retry-After, ETag, X-Request-ID" {
		t.Fatalf("Access-Control-Expose-Headers = %q", got)
	}
	if !varyHas(hdr, "Origin") {
		t.Fatalf("Vary = %q, want Origin", hdr.Values("Vary"))
	}
	if hdr.Get("Access-Control-Allow-Credentials") != "" {
		t.Fatal("Access-Control-Allow-Credentials is sent; the API uses no cookies")
	}
}

// noCORS checks that hdr holds no CORS header at all.
func noCORS(t *testing.T, hdr http.Header) {
	t.Helper()
	for k := range hdr {
		if strings.HasPrefix(http.CanonicalHeaderKey(k), "Access-Control-") {
			t.Fatalf("%s: %q is sent, want no CORS header", k, hdr.Values(k))
		}
	}
}

func preflight(h *harness, path, origin string) *httptest.ResponseRecorder {
	h.t.Helper()
	hdr := map[string]string{"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization,content-type"}
	if origin != "" {
		hdr["Origin"] = origin
	}
	return h.do(request{method: http.MethodOptions, path: path, headers: hdr})
}

func TestAPreflightFromAnAllowedOriginNeedsNoTokenAndIsNeverRateLimited(t *testing.T) {
	h := corsHarness(t, appOrigin, "http://localhost:5173")
	alice := h.token("alice")
	for i := 0; i < 3; i++ { // the limit of 1/s (burst 2) is spent
		h.get(leasePath("doc-1"), alice)
	}
	wantError(t, h.get(leasePath("doc-1"), alice), http.StatusTooManyRequests, CodeRateLimited)
	for _, path := range []string{
		leasePath("doc-1"), leasePath("doc-1") + "/renew", "/v1/sessions/doc-1/events", "/v1/sessions/doc-1/tabs",
		"/v1/sessions/doc-1/tabs/tab-a", "/v1/admin/catalog", "/v1/admin/leases",
	} {
		for i := 0; i < 5; i++ {
			rec := preflight(h, path, appOrigin)
			if rec.Code != http.StatusNoContent || rec.Body.Len() != 0 {
				t.Fatalf("preflight of %s: %d %s, want 204 without a body", path, rec.Code, rec.Body)
			}
			hdr := rec.Header()
			want := map[string]string{
				"Access-Control-Allow-Origin":  appOrigin,
				"Access-Control-Allow-Methods": "GET, POST, PUT, DELETE",
				"Access-Control-Allow-Headers": "Authorization, Content-Type, Last-Event-ID, If-None-Match, If-Match, X-Request-ID",
				"Access-Control-Max-Age":       "600",
			}
			for k, v := range want {
				if got := hdr.Get(k); got != v {
					t.Fatalf("preflight of %s: %s = %q, want %q", path, k, got, v)
				}
			}
			for _, v := range []string{"Origin", "Access-Control-Request-Method", "Access-Control-Request-Headers"} {
				if !varyHas(hdr, v) {
					t.Fatalf("preflight of %s: Vary = %q lacks %s", path, hdr.Values("Vary"), v)
				}
			}
			if hdr.Get("Access-Control-Allow-Credentials") != "" {
				t.Fatal("a preflight allows credentials")
			}
		}
	}
	if rec := preflight(h, leasePath("doc-1"), "http://localhost:5173"); rec.Header().Get("Access-Control-Allow-Origin") != "http://localhost:5173" {
		t.Fatalf("the second origin listed: %q", rec.Header().Get("Access-Control-Allow-Origin"))
	}
}

func TestAPreflightFromAnotherOriginIsForbiddenWithoutCORSHeaders(t *testing.T) {
	h := corsHarness(t, appOrigin)
	for _, o := range []string{otherOrigin, "https://app.example.com:8443", "http://app.example.com", "null", "https://APP.example.com"} {
		rec := preflight(h, leasePath("doc-1"), o)
		e := wantError(t, rec, http.StatusForbidden, CodeForbidden)
		if e.Error.Details["reason"] != "origin_not_allowed" {
			t.Fatalf("details %v", e.Error.Details)
		}
		noCORS(t, rec.Header())
	}
	// An OPTIONS that is not a preflight (no Origin) is answered as without CORS.
	rec := preflight(h, leasePath("doc-1"), "")
	if rec.Code != http.StatusNoContent || rec.Header().Get("Allow") == "" {
		t.Fatalf("OPTIONS without Origin: %d %v", rec.Code, rec.Header())
	}
	noCORS(t, rec.Header())
}

func TestEveryAnswerToAnAllowedOriginCarriesCORSHeadersErrorsIncluded(t *testing.T) {
	h := corsHarness(t, appOrigin) // 1 request/s per user, burst 2: every request below has a user of its own
	big := `{"tabId":"` + strings.Repeat("x", MaxBodyBytes) + `"}`
	cases := []struct {
		name   string
		req    request // token: "user" for a token of the request's own user, "restricted" for one limited to doc-2
		status int
		code   string
	}{
		{"a lease", request{method: http.MethodPost, path: leasePath("doc-1"), token: "user", body: `{"tabId":"tab-a"}`}, 200, ""},
		{"400", request{method: http.MethodPost, path: leasePath("doc-1"), token: "user", body: `{"tabId":1}`}, 400, CodeInvalidArgument},
		{"401", request{method: http.MethodGet, path: leasePath("doc-1")}, 401, CodeUnauthenticated},
		{"403", request{method: http.MethodGet, path: leasePath("doc-1"), token: "restricted"}, 403, CodeForbidden},
		{"404", request{method: http.MethodGet, path: "/v1/nothing-here", token: "user"}, 404, CodeNotFound},
		{"405", request{method: http.MethodPatch, path: leasePath("doc-1"), token: "user"}, 405, CodeMethodNotAllowed},
		{"409", request{method: http.MethodPost, path: leasePath("doc-1"), token: "user", body: `{"tabId":"tab-c"}`}, 409, CodeLeaseHeld},
		{"413", request{method: http.MethodPost, path: leasePath("doc-1"), token: "user", body: big}, 413, CodePayloadTooLarge},
		{"429", request{method: http.MethodGet, path: leasePath("doc-1"), token: "user"}, 429, CodeRateLimited},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for j, o := range []string{appOrigin, otherOrigin, ""} {
				r := tc.req
				sub := "u" + itoa(int64(i)) + "-" + itoa(int64(j))
				switch r.token {
				case "user":
					r.token = h.token(sub)
				case "restricted":
					r.token = h.token(sub, "doc-2")
				}
				r.headers = map[string]string{}
				if o != "" {
					r.headers["Origin"] = o
				}
				switch tc.code {
				case CodeLeaseHeld:
					h.post(leasePath("doc-1"), r.token, `{"tabId":"tab-b"}`)
				case CodeRateLimited:
					for k := 0; k < 2; k++ {
						h.do(r)
					}
				}
				rec := h.do(r)
				if tc.code == "" {
					if rec.Code != tc.status {
						t.Fatalf("%d %s", rec.Code, rec.Body)
					}
				} else {
					wantError(t, rec, tc.status, tc.code)
				}
				switch o {
				case appOrigin:
					wantCORS(t, rec.Header(), appOrigin)
					if tc.code == CodeRateLimited && rec.Header().Get("Retry-After") == "" {
						t.Fatal("429 without Retry-After")
					}
				default:
					noCORS(t, rec.Header())
					if !varyHas(rec.Header(), "Origin") {
						t.Fatalf("Vary = %q, want Origin on every /v1 answer", rec.Header().Values("Vary"))
					}
				}
			}
		})
	}
	// 503: the store is down.
	_ = h.engine.Close()
	rec := h.do(request{method: http.MethodGet, path: leasePath("doc-9"), token: h.token("dave"), headers: map[string]string{"Origin": appOrigin}})
	wantError(t, rec, http.StatusServiceUnavailable, CodeStoreUnavailable)
	wantCORS(t, rec.Header(), appOrigin)
}

func TestTheEventStreamCarriesCORSHeadersOnItsHijackedConnection(t *testing.T) {
	h := corsHarness(t, appOrigin)
	h.srv.limiter = nil // streams here are not what the limit is about
	ts := h.serve()
	alice := h.token("alice")
	c, resp := openStream(t, ts, eventsPath("doc-1", "tabId=tab-a"), alice, map[string]string{"Origin": appOrigin})
	if c == nil {
		t.Fatalf("stream: %d", resp.StatusCode)
	}
	c.expect("snapshot", nil)
	if resp.ProtoMajor != 1 || resp.ProtoMinor != 1 {
		t.Fatalf("the stream is HTTP/%d.%d; the test is about the HTTP/1.1 hand-over", resp.ProtoMajor, resp.ProtoMinor)
	}
	wantCORS(t, resp.Header, appOrigin)
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	// The stream goes on after the hand-over: an event arrives.
	h.acquire(alice, "doc-1", "tab-a", "try")
	c.expectLease("granted")

	other := mustStream(t, ts, eventsPath("doc-1", "tabId=tab-b"), alice, map[string]string{"Origin": otherOrigin})
	other.expect("snapshot", nil)
	noCORS(t, other.resp.Header)

	// A stream refused before it begins (no token) still names the origin.
	_, resp = openStream(t, ts, eventsPath("doc-1", "tabId=tab-c"), "", map[string]string{"Origin": appOrigin})
	wantCORS(t, resp.Header, appOrigin)
	httpError(t, resp, http.StatusUnauthorized, CodeUnauthenticated)
}

func TestInDevModeStarAllowsEveryOriginByNamingIt(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.CORSOrigins = []string{AnyOrigin}; o.Dev = true })
	for _, o := range []string{appOrigin, "http://localhost:3000", "http://[::1]:8080"} {
		rec := preflight(h, leasePath("doc-1"), o)
		if rec.Code != http.StatusNoContent || rec.Header().Get("Access-Control-Allow-Origin") != o {
			t.Fatalf("preflight from %s: %d %v", o, rec.Code, rec.Header())
		}
		rec = h.do(request{method: http.MethodGet, path: leasePath("doc-1"), token: h.token("alice"), headers: map[string]string{"Origin": o}})
		if rec.Code != 200 {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
		wantCORS(t, rec.Header(), o)
	}
	// Not an origin at all: no CORS header, never "*".
	for _, o := range []string{"null", "file://", "https://app.example.com/path"} {
		rec := h.do(request{method: http.MethodGet, path: leasePath("doc-1"), token: h.token("alice"), headers: map[string]string{"Origin": o}})
		noCORS(t, rec.Header())
	}
}

func TestWithoutCORSOriginsNoAnswerCarriesCORSHeaders(t *testing.T) {
	h := newHarness(t)
	alice := h.token("alice")
	// A preflight carries the query of the request it precedes: it is answered as any other,
	// without CORS headers (which the browser reports as a CORS refusal), not 400 for a
	// parameter the OPTIONS does not take.
	for _, path := range []string{leasePath("doc-1"), leasePath("doc-1") + "?tabId=t-1", "/v1/sessions/doc-1/events?tabId=t-1&tabId=t-2"} {
		rec := preflight(h, path, appOrigin)
		if rec.Code != http.StatusNoContent {
			t.Fatalf("OPTIONS %s: %d %s", path, rec.Code, rec.Body)
		}
		noCORS(t, rec.Header())
	}
	for _, r := range []request{
		{method: http.MethodGet, path: leasePath("doc-1"), token: alice},
		{method: http.MethodGet, path: leasePath("doc-1")},
		{method: http.MethodGet, path: "/v1/nothing-here"},
	} {
		r.headers = map[string]string{"Origin": appOrigin}
		rec := h.do(r)
		noCORS(t, rec.Header())
		if varyHas(rec.Header(), "Origin") {
			t.Fatalf("Vary: Origin without CORS origins")
		}
	}
}

func TestStarOrAMalformedOriginIsRefusedByNew(t *testing.T) {
	for _, origins := range [][]string{{AnyOrigin}, {"https://app.example.com/"}, {"HTTPS://APP.example.com"}, {""}} {
		opts := Options{Engine: newHarness(t).engine, Auth: testAuthConfig(), CORSOrigins: origins}
		memoryStores(&opts)
		if _, err := New(opts); err == nil || !strings.Contains(err.Error(), "CORSOrigins") {
			t.Fatalf("New with CORSOrigins %q: %v, want an error naming CORSOrigins", origins, err)
		}
	}
}

func TestDevTokenNeverAnswersAnotherOrigin(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.Dev = true; o.CORSOrigins = []string{AnyOrigin} })
	devReq := func(origin string) *httptest.ResponseRecorder {
		r := request{method: http.MethodGet, path: "http://127.0.0.1:8080/dev/token?sub=alice", remote: "127.0.0.1:5000"}
		if origin != "" {
			r.headers = map[string]string{"Origin": origin}
		}
		return h.do(r)
	}
	for _, o := range []string{"", "http://127.0.0.1:8080"} {
		rec := devReq(o)
		if rec.Code != 200 {
			t.Fatalf("/dev/token with Origin %q: %d %s", o, rec.Code, rec.Body)
		}
		noCORS(t, rec.Header())
	}
	for _, o := range []string{appOrigin, "http://localhost:8080", "http://127.0.0.1:8081", "https://127.0.0.1:8080", "null"} {
		rec := devReq(o)
		e := wantError(t, rec, http.StatusForbidden, CodeForbidden)
		if e.Error.Details["reason"] != "cross_origin" {
			t.Fatalf("details %v", e.Error.Details)
		}
		noCORS(t, rec.Header())
	}
	rec := h.do(request{method: http.MethodOptions, path: "/dev/token", headers: map[string]string{"Origin": appOrigin, "Access-Control-Request-Method": "GET"}, remote: "127.0.0.1:5000"})
	noCORS(t, rec.Header())
}

func TestTheSDKStillAllowsEveryOrigin(t *testing.T) {
	h := corsHarness(t, appOrigin)
	rec := h.do(request{method: http.MethodGet, path: "/sdk/tablease.js", headers: map[string]string{"Origin": otherOrigin}})
	if rec.Code != 200 || rec.Header().Get("Access-Control-Allow-Origin") != "*" {
		t.Fatalf("/sdk/tablease.js: %d, Access-Control-Allow-Origin %q", rec.Code, rec.Header().Get("Access-Control-Allow-Origin"))
	}
}
