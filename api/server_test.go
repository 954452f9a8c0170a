package api

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/lease/leasemem"
)

func TestUnknownRoutesAndMethodsAnswerJSON(t *testing.T) {
	h := newHarness(t)
	alice := h.token("alice")
	tests := []struct {
		name   string
		method string
		path   string
		status int
		code   string
	}{
		{"an unknown path is NOT_FOUND", http.MethodGet, "/nope", 404, CodeNotFound},
		{"an unknown /v1 path is NOT_FOUND, not UNAUTHENTICATED", http.MethodGet, "/v1/nope", 404, CodeNotFound},
		{"a path under a session that does not exist is NOT_FOUND", http.MethodPost, "/v1/sessions/doc-1/lease/steal", 404, CodeNotFound},
		{"DELETE on the lease is METHOD_NOT_ALLOWED", http.MethodDelete, leasePath("doc-1"), 405, CodeMethodNotAllowed},
		{"GET on renew is METHOD_NOT_ALLOWED", http.MethodGet, leasePath("doc-1") + "/renew", 405, CodeMethodNotAllowed},
		{"POST on healthz is METHOD_NOT_ALLOWED", http.MethodPost, "/healthz", 405, CodeMethodNotAllowed},
		{"dev/token is not registered outside dev mode", http.MethodGet, "/dev/token?sub=alice", 404, CodeNotFound},
		{"a path below a tab is NOT_FOUND, not a bad tabId", http.MethodPut, "/v1/sessions/doc-1/tabs/t1/x", 404, CodeNotFound},
		{"a GET below a tab is NOT_FOUND, not METHOD_NOT_ALLOWED", http.MethodGet, "/v1/sessions/doc-1/tabs/t1/x", 404, CodeNotFound},
		{"a DELETE of a tab with a trailing slash is NOT_FOUND", http.MethodDelete, "/v1/sessions/doc-1/tabs/t1/", 404, CodeNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := h.do(request{method: tt.method, path: tt.path, token: alice})
			wantError(t, rec, tt.status, tt.code)
			if tt.status == 405 && rec.Header().Get("Allow") == "" {
				t.Error("405 without an Allow header")
			}
		})
	}
}

func TestOptionsAnswersTheAllowedMethodsWithoutAToken(t *testing.T) {
	h := newHarness(t)
	for path, want := range map[string]string{leasePath("doc-1"): "OPTIONS, GET, HEAD, POST", "/healthz": "OPTIONS, GET, HEAD"} {
		rec := h.do(request{method: http.MethodOptions, path: path})
		if rec.Code != http.StatusNoContent || rec.Header().Get("Allow") != want || rec.Body.Len() != 0 {
			t.Errorf("OPTIONS %s: %d, Allow %q, body %q; want 204, Allow %q and no body", path, rec.Code, rec.Header().Get("Allow"), rec.Body, want)
		}
	}
	wantError(t, h.do(request{method: http.MethodOptions, path: "/v1/nope"}), http.StatusNotFound, CodeNotFound)
}

func TestHealthAndReadiness(t *testing.T) {
	t.Run("healthz answers ok", func(t *testing.T) {
		h := newHarness(t)
		rec := h.get("/healthz", "")
		if rec.Code != 200 || trimNL(rec.Body.String()) != `{"status":"ok"}` {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
	})
	t.Run("readyz answers ok when the store answers", func(t *testing.T) {
		h := newHarness(t)
		if rec := h.get("/readyz", ""); rec.Code != 200 {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
	})
	for _, pingErr := range []error{
		&lease.UnavailableError{Op: "ping", Err: context.DeadlineExceeded},
		errors.New("dial tcp 10.0.0.1:6379: connection refused"),
	} {
		t.Run("readyz is STORE_UNAVAILABLE when the ping fails with "+pingErr.Error(), func(t *testing.T) {
			h := newHarness(t, func(o *Options) { o.Engine = failingPing{Store: o.Engine, err: pingErr} })
			rec := h.get("/readyz", "")
			e := wantError(t, rec, http.StatusServiceUnavailable, CodeStoreUnavailable)
			if !*e.Error.Retryable || rec.Header().Get("Retry-After") == "" {
				t.Fatalf("503 not retryable or without Retry-After: %v %s", rec.Header(), rec.Body)
			}
			if strings.Contains(rec.Body.String(), "10.0.0.1") {
				t.Fatalf("the answer leaks the store's address: %s", rec.Body)
			}
		})
	}
}

// failingPing is an engine whose store never answers a ping.
type failingPing struct {
	lease.Store
	err error
}

func (f failingPing) Ping(context.Context) error { return f.err }

// panicking is an engine that panics on Get.
type panicking struct{ lease.Store }

func (panicking) Get(context.Context, lease.Key) (lease.Lease, error) {
	panic("secret internal state")
}

func TestStoreTroubleIsNeverLoss(t *testing.T) {
	h := newHarness(t)
	alice := h.token("alice")
	l := readLease(t, h.post(leasePath("doc-1"), alice, `{"tabId":"tab-a"}`))
	if err := h.engine.Close(); err != nil { // every call now fails with an UnavailableError
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, method, path, body string
	}{
		{"acquire", http.MethodPost, leasePath("doc-1"), `{"tabId":"tab-a"}`},
		{"renew", http.MethodPost, leasePath("doc-1") + "/renew", `{"tabId":"tab-a","epoch":` + itoa(l.Epoch) + `}`},
		{"release", http.MethodPost, leasePath("doc-1") + "/release", `{"tabId":"tab-a","epoch":` + itoa(l.Epoch) + `}`},
		{"get", http.MethodGet, leasePath("doc-1"), ""},
		{"check", http.MethodPost, leasePath("doc-1") + "/check", `{"tabId":"tab-a","epoch":` + itoa(l.Epoch) + `}`},
	} {
		t.Run(tt.name+" with the store down is STORE_UNAVAILABLE, retryable, with Retry-After", func(t *testing.T) {
			rec := h.do(request{method: tt.method, path: tt.path, token: alice, body: tt.body})
			e := wantError(t, rec, http.StatusServiceUnavailable, CodeStoreUnavailable)
			if !*e.Error.Retryable || rec.Header().Get("Retry-After") != "1" {
				t.Fatalf("retryable %v, Retry-After %q", *e.Error.Retryable, rec.Header().Get("Retry-After"))
			}
		})
	}
	// The request lines name the cause, which the answers never do.
	if logs := h.logs.String(); !strings.Contains(logs, `"code":"STORE_UNAVAILABLE","error":"lease: store unavailable during acquire`) {
		t.Errorf("the log does not name the store's error:\n%s", logs)
	}
	metrics := h.get("/metrics", "").Body.String()
	for _, want := range []string{
		`tablease_store_errors_total{op="acquire"} 1`,
		`tablease_lease_operations_total{op="renew",result="unavailable"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestPanicIsAJSONInternalError(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.Engine = panicking{Store: o.Engine} })
	rec := h.do(request{method: http.MethodGet, path: leasePath("doc-1"), token: h.token("alice"), headers: map[string]string{"X-Request-ID": "req-panic-1"}})
	e := wantError(t, rec, http.StatusInternalServerError, CodeInternal)
	if strings.Contains(e.Error.Message, "secret internal state") || strings.Contains(rec.Body.String(), "goroutine") {
		t.Fatalf("the answer says something internal: %s", rec.Body)
	}
	logs := h.logs.String()
	if !strings.Contains(logs, "secret internal state") || !strings.Contains(logs, `"request_id":"req-panic-1"`) {
		t.Fatalf("the panic is not logged with the request id:\n%s", logs)
	}
}

func TestRequestID(t *testing.T) {
	h := newHarness(t)
	tests := []struct {
		name, sent string
		kept       bool
	}{
		{"a sane X-Request-ID is kept", "abc-123_DEF.4:5", true},
		{"a request without one gets one", "", false},
		{"an X-Request-ID with spaces is replaced", "a b", false},
		{"an X-Request-ID with a newline escape is replaced", "a%0d%0aSet-Cookie", false},
		{"an X-Request-ID of 129 characters is replaced", strings.Repeat("r", 129), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := request{method: http.MethodGet, path: "/healthz", headers: map[string]string{}}
			if tt.sent != "" {
				req.headers["X-Request-ID"] = tt.sent
			}
			got := h.do(req).Header().Get("X-Request-ID")
			if tt.kept && got != tt.sent {
				t.Fatalf("X-Request-ID = %q, want %q", got, tt.sent)
			}
			if !tt.kept && (got == "" || got == tt.sent || !saneRequestID(got)) {
				t.Fatalf("X-Request-ID = %q", got)
			}
		})
	}
}

// TestLogFailedRequestsOnlyWritesSuccessesAtDebug: with LogFailedRequestsOnly
// (TABLEASE_LOG_REQUESTS=failed) the request line of an answer below 400 is at debug, that of a
// refusal at info as always.
func TestLogFailedRequestsOnlyWritesSuccessesAtDebug(t *testing.T) {
	for _, quiet := range []bool{false, true} {
		h := newHarness(t, func(o *Options) { o.LogFailedRequestsOnly = quiet })
		readLease(t, h.do(request{path: leasePath("doc-1"), token: h.token("alice")}))
		wantError(t, h.do(request{path: leasePath("doc-1")}), http.StatusUnauthorized, CodeUnauthenticated)
		okLevel := "INFO"
		if quiet {
			okLevel = "DEBUG"
		}
		for _, want := range []string{`"level":"` + okLevel + `","msg":"request"`, `"level":"INFO","msg":"request"`} {
			if !strings.Contains(h.logs.String(), want) {
				t.Errorf("LogFailedRequestsOnly %v: no line %s in\n%s", quiet, want, h.logs)
			}
		}
		for _, line := range strings.Split(h.logs.String(), "\n") {
			if strings.Contains(line, `"msg":"request"`) && strings.Contains(line, `"status":200`) && !strings.Contains(line, `"level":"`+okLevel+`"`) {
				t.Errorf("LogFailedRequestsOnly %v: the 200's line is %s", quiet, line)
			}
			if strings.Contains(line, `"msg":"request"`) && strings.Contains(line, `"status":401`) && !strings.Contains(line, `"level":"INFO"`) {
				t.Errorf("LogFailedRequestsOnly %v: the 401's line is %s", quiet, line)
			}
		}
	}
}

// TestMetricsCountAUsersSessionBoundAsARefusalNotAStoreError: an acquire refused because the user
// is at the limit of sessions is a result of its own, and no store error (which alerts page on).
func TestMetricsCountAUsersSessionBoundAsARefusalNotAStoreError(t *testing.T) {
	reg := prometheus.NewRegistry()
	eng, err := leasemem.New(leasemem.Options{Limits: lease.DefaultLimits, SessionsPerUser: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close() })
	h := newHarness(t, func(o *Options) { o.Registry = reg; o.Engine = eng })
	alice := h.token("alice")
	readLease(t, h.post(leasePath("doc-1"), alice, `{"tabId":"tab-a"}`))
	wantError(t, h.post(leasePath("doc-2"), alice, `{"tabId":"tab-a"}`), 409, CodeTooManySessions)
	// A gone release of a session the user has no state for marks nothing, and says so.
	wantError(t, h.post(leasePath("doc-2")+"/release", alice, `{"tabId":"tab-a","gone":true}`), 409, CodeTooManySessions)
	body := h.get("/metrics", "").Body.String()
	if want := `tablease_lease_operations_total{op="acquire",result="too_many_sessions"} 1`; !strings.Contains(body, want) {
		t.Errorf("/metrics lacks %s", want)
	}
	if !strings.Contains(body, `tablease_store_errors_total{op="acquire"} 0`) {
		t.Errorf("a refused acquire counted as a store error:\n%s", body)
	}
	// Every op's store error counter is there from the start, at zero, so that an alert on its
	// rate is defined before the first failure.
	for _, op := range []string{"admin_list", "admin_get", "admin_audit", "admin_revoke", "tabs", "watch", "new_nonce", "use_nonce", "ping"} {
		if want := `tablease_store_errors_total{op="` + op + `"} 0`; !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestMetricsExposeTheCounters(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := newHarness(t, func(o *Options) { o.Registry = reg })
	alice := h.token("alice")
	readLease(t, h.post(leasePath("doc-1"), alice, `{"tabId":"tab-a"}`))
	wantError(t, h.post(leasePath("doc-1"), alice, `{"tabId":"tab-b"}`), 409, CodeLeaseHeld)
	wantError(t, h.post(leasePath("doc-2")+"/renew", alice, `{"tabId":"tab-b","epoch":12}`), 409, CodeLeaseLost)
	h.get("/a/random/path/that/must/not/become/a/label", "")
	// Input refused by the handler (a bad tab id, epoch 0, a body that is not JSON) counts as
	// invalid, as input the engine refuses would.
	wantError(t, h.post(leasePath("doc-1"), alice, `{"tabId":"a tab"}`), 400, CodeInvalidArgument)
	wantError(t, h.post(leasePath("doc-1")+"/renew", alice, `{"tabId":"tab-a","epoch":0}`), 400, CodeInvalidArgument)
	wantError(t, h.post(leasePath("doc-1")+"/release", alice, `{`), 400, CodeInvalidArgument)
	// A presence PUT is the op join, and one tab more than a session lists is too_many_tabs.
	for i := range lease.MaxPresence {
		h.putTab(alice, "doc-3", fmt.Sprintf("tab-%d", i), "")
	}
	wantError(t, h.do(request{method: http.MethodPut, path: tabPath("doc-3", "tab-new"), token: alice}), 409, CodeTooManyTabs)

	rec := h.get("/metrics", "")
	if rec.Code != 200 {
		t.Fatalf("/metrics: %d", rec.Code)
	}
	body := rec.Body.String()
	for _, want := range []string{
		`tablease_http_requests_total{method="POST",route="/v1/sessions/:sid/lease",status="200"} 1`,
		`tablease_http_requests_total{method="POST",route="/v1/sessions/:sid/lease",status="409"} 1`,
		`tablease_http_requests_total{method="GET",route="unmatched",status="404"} 1`,
		`tablease_http_request_duration_seconds_bucket{method="POST",route="/v1/sessions/:sid/lease/renew",le="+Inf"} 2`,
		`tablease_lease_operations_total{op="acquire",result="ok"} 1`,
		`tablease_lease_operations_total{op="acquire",result="held"} 1`,
		`tablease_lease_operations_total{op="renew",result="lost"} 1`,
		`tablease_lease_operations_total{op="acquire",result="invalid"} 1`,
		`tablease_lease_operations_total{op="renew",result="invalid"} 1`,
		`tablease_lease_operations_total{op="release",result="invalid"} 1`,
		`tablease_lease_operations_total{op="join",result="ok"} 100`,
		`tablease_lease_operations_total{op="join",result="too_many_tabs"} 1`,
		`# TYPE tablease_store_errors_total counter`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(body, "random/path") || strings.Contains(body, "doc-1") {
		t.Error("/metrics has raw paths in its labels")
	}
	t.Run("a second server on the same registry is refused, naming the field", func(t *testing.T) {
		opts := Options{Engine: h.engine, Auth: testAuthConfig(), Registry: reg}
		memoryStores(&opts)
		_, err := New(opts)
		if err == nil || !strings.Contains(err.Error(), "Registry") {
			t.Fatalf("New = %v", err)
		}
	})
}

// A rate limit fast enough that the next token is less than a millisecond away still answers a
// wait a client can honour: retryAfterMs is rounded up, never 0 ("retry at once").
func TestRateLimitWaitsUnderAMillisecondAnswerOne(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.RateLimit = 2000 }) // a token every 0.5 ms, burst 4000
	// The limiter's clock stands still, so that the burst runs out however slowly the requests go
	// (under -race on a busy machine they took more than the 0.5 ms a token takes to come back).
	still := time.Now()
	h.srv.limiter = newUserLimiter(2000, defaultLimiterCap, func() time.Time { return still })
	alice := h.token("alice")
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		rec := h.get(leasePath("doc-1"), alice)
		if rec.Code == http.StatusOK {
			continue
		}
		e := wantError(t, rec, http.StatusTooManyRequests, CodeRateLimited)
		if ms, _ := e.Error.Details["retryAfterMs"].(float64); ms != 1 {
			t.Fatalf("retryAfterMs = %v, want 1 (the wait rounded up); body %s", e.Error.Details["retryAfterMs"], rec.Body)
		}
		if ra := rec.Header().Get("Retry-After"); ra != "1" {
			t.Fatalf("Retry-After = %q, want 1", ra)
		}
		return
	}
	t.Fatal("the limit of 2,000 requests per second (burst 4,000) never answered 429 within 20 s")
}

func TestOpenAPIIsServed(t *testing.T) {
	h := newHarness(t)
	rec := h.get("/openapi.yaml", "")
	if rec.Code != 200 || !strings.HasPrefix(rec.Body.String(), "openapi: 3.1") {
		t.Fatalf("%d %.40s", rec.Code, rec.Body)
	}
	if !strings.Contains(rec.Body.String(), "\n  x-build-version: \"test\"\n") {
		t.Fatal("the served document lacks the build version")
	}
}

func TestRateLimit(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.RateLimit = 1 }) // burst 2
	alice, bob := h.token("alice"), h.token("bob")
	for range 2 {
		readLease(t, h.get(leasePath("doc-1"), alice))
	}
	rec := h.get(leasePath("doc-1"), alice)
	e := wantError(t, rec, http.StatusTooManyRequests, CodeRateLimited)
	if ra := rec.Header().Get("Retry-After"); ra != "1" {
		t.Fatalf("Retry-After = %q, want 1", ra)
	}
	if ms, _ := e.Error.Details["retryAfterMs"].(float64); !*e.Error.Retryable || ms < 1 || ms > 1000 || e.Error.Details["limit"] != "requests" {
		t.Fatalf("429 answer %s", rec.Body)
	}
	t.Run("another user has a bucket of their own", func(t *testing.T) {
		readLease(t, h.get(leasePath("doc-1"), bob))
	})
	t.Run("unauthenticated requests do not use a user's bucket", func(t *testing.T) {
		wantError(t, h.get(leasePath("doc-1"), ""), 401, CodeUnauthenticated)
	})
}

// TestAUsersFloodLeavesItsBurstAndOneRefusalInTheLog: of a streak of 429s for a user's limit
// only the first is logged at info, so that a client in a loop cannot flood the log (which
// TABLEASE_LOG_REQUESTS=failed would otherwise keep whole).
func TestAUsersFloodLeavesItsBurstAndOneRefusalInTheLog(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.RateLimit = 1 }) // burst 2
	still := time.Now()
	h.srv.limiter = newUserLimiter(1, defaultLimiterCap, func() time.Time { return still })
	alice := h.token("alice")
	for range 50 {
		h.get(leasePath("doc-1"), alice)
	}
	info := strings.Count(h.logs.String(), `"level":"INFO","msg":"request"`)
	refused := strings.Count(h.logs.String(), `"status":429`)
	if info != 3 || refused != 48 {
		t.Errorf("%d request lines at info, %d of 429 in all, want 3 (the burst of 2 and the first refusal) and 48:\n%s", info, refused, h.logs)
	}
}

// TestLeaseChecksHaveABucketOfTheirOwn: a user's lease checks (app backends' strict guards check
// each write) and the user's other requests (the renews that keep the tabs' lease) are limited
// apart, so that a burst of writes leaves the renews be.
func TestLeaseChecksHaveABucketOfTheirOwn(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.RateLimit = 1 }) // burst 2 each
	alice := h.token("alice")
	epoch := h.acquire(alice, "doc-1", "tab-1", "try") // one request of the 2
	check := fmt.Sprintf(`{"tabId":"tab-1","epoch":%d}`, epoch)
	for range 2 {
		if rec := h.post(leasePath("doc-1")+"/check", alice, check); rec.Code != http.StatusOK {
			t.Fatalf("a check within the burst: %d %s", rec.Code, rec.Body)
		}
	}
	rec := h.post(leasePath("doc-1")+"/check", alice, check)
	if e := wantError(t, rec, http.StatusTooManyRequests, CodeRateLimited); e.Error.Details["limit"] != "checks" {
		t.Fatalf("the third check's 429 names the limit %v, want checks: %s", e.Error.Details["limit"], rec.Body)
	}
	readLease(t, h.post(leasePath("doc-1")+"/renew", alice, check)) // the second of the 2
	rec = h.post(leasePath("doc-1")+"/renew", alice, check)
	if e := wantError(t, rec, http.StatusTooManyRequests, CodeRateLimited); e.Error.Details["limit"] != "requests" {
		t.Fatalf("the second renew's 429 names the limit %v, want requests: %s", e.Error.Details["limit"], rec.Body)
	}
}

// TestRefusedRequestsOfAValidTokenCountAgainstItsUser: a request refused for its session (a sid
// claim), its scope, or for matching no route still uses its user's bucket, so that a valid token
// cannot send them without limit.
func TestRefusedRequestsOfAValidTokenCountAgainstItsUser(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.RateLimit = 1 }) // burst 2
	for _, tc := range []struct {
		name, method, path, token string
		status                    int
	}{
		{"a session its sid claim does not list", http.MethodGet, leasePath("other"), h.token("carol", "only"), http.StatusForbidden},
		{"an admin route without the scope", http.MethodGet, "/v1/admin/leases", h.token("dave"), http.StatusForbidden},
		{"no route", http.MethodGet, "/v1/nope", h.token("erin"), http.StatusNotFound},
		{"a method the route does not have", http.MethodDelete, leasePath("doc-1"), h.token("frank"), http.StatusMethodNotAllowed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for range 2 {
				if rec := h.do(request{method: tc.method, path: tc.path, token: tc.token}); rec.Code != tc.status {
					t.Fatalf("%s %s: %d %s, want %d", tc.method, tc.path, rec.Code, rec.Body, tc.status)
				}
			}
			wantError(t, h.do(request{method: tc.method, path: tc.path, token: tc.token}), http.StatusTooManyRequests, CodeRateLimited)
		})
	}
}

func TestUserLimiterMemoryIsBounded(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	clock := func() time.Time { return now }
	u := newUserLimiter(10, 3, clock) // burst 20, refilled after 2s
	t.Run("beyond the cap the least recently seen user is dropped", func(t *testing.T) {
		for _, k := range []string{"a", "b", "c", "d", "e"} {
			if ok, _, _ := u.allow(k); !ok {
				t.Fatalf("first request of %s refused", k)
			}
		}
		if n := u.size(); n > 3 {
			t.Fatalf("%d limiters kept, cap 3", n)
		}
	})
	t.Run("idle limiters are dropped once they have refilled", func(t *testing.T) {
		now = now.Add(3 * time.Second)
		u.allow("z")
		if n := u.size(); n != 1 {
			t.Fatalf("%d limiters kept after the others idled, want 1", n)
		}
	})
	t.Run("a user over the limit waits for the next token", func(t *testing.T) {
		for range 20 {
			u.allow("y")
		}
		ok, wait, _ := u.allow("y")
		if ok || wait <= 0 || wait > 100*time.Millisecond {
			t.Fatalf("allow = %v, %s; want refused with a wait of at most 100ms", ok, wait)
		}
	})
}

func TestDevToken(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.Dev = true })
	tests := []struct {
		name   string
		remote string
		query  string
		status int
		code   string
	}{
		{"a loopback client gets a token", "127.0.0.1:5555", "sub=alice", 200, ""},
		{"an IPv6 loopback client gets a token", "[::1]:5555", "sub=alice&scope=lease:admin&sid=doc-1,doc-2&ttl=10m", 200, ""},
		{"a remote client is told the route does not exist", "192.0.2.10:5555", "sub=alice", 404, CodeNotFound},
		{"a forwarded header does not make a client local", "192.0.2.10:5555", "sub=alice", 404, CodeNotFound},
		{"a missing sub is refused", "127.0.0.1:5555", "", 400, CodeInvalidArgument},
		{"a bad sub is refused", "127.0.0.1:5555", "sub=a/b", 400, CodeInvalidArgument},
		{"a bad sid is refused", "127.0.0.1:5555", "sub=alice&sid=..", 400, CodeInvalidArgument},
		{"a sid list with an empty item is refused, not read as no sid", "127.0.0.1:5555", "sub=alice&sid=,", 400, CodeInvalidArgument},
		{"an empty sid is refused", "127.0.0.1:5555", "sub=alice&sid=doc-1&sid=", 400, CodeInvalidArgument},
		{"a bad ttl is refused", "127.0.0.1:5555", "sub=alice&ttl=forever", 400, CodeInvalidArgument},
		{"a ttl over a day is refused", "127.0.0.1:5555", "sub=alice&ttl=48h", 400, CodeInvalidArgument},
		{"a ttl under a second is refused", "127.0.0.1:5555", "sub=alice&ttl=500ms", 400, CodeInvalidArgument},
		{"a ttl of a nanosecond is refused", "127.0.0.1:5555", "sub=alice&ttl=1ns", 400, CodeInvalidArgument},
		{"a ttl of no whole seconds is refused", "127.0.0.1:5555", "sub=alice&ttl=1500ms", 400, CodeInvalidArgument},
		{"a parameter given twice is refused", "127.0.0.1:5555", "sub=alice&sub=bob", 400, CodeInvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := h.do(request{method: http.MethodGet, path: "/dev/token?" + tt.query, remote: tt.remote, host: "127.0.0.1:8080",
				headers: map[string]string{"X-Forwarded-For": "127.0.0.1", "X-Real-IP": "127.0.0.1"}})
			if cc := rec.Header().Get("Cache-Control"); cc != "no-store" {
				t.Errorf("Cache-Control = %q, want no-store", cc)
			}
			if tt.status != 200 {
				wantError(t, rec, tt.status, tt.code)
				return
			}
			var tok struct {
				Token     string `json:"token"`
				TokenType string `json:"tokenType"`
				Sub       string `json:"sub"`
				ExpiresAt string `json:"expiresAt"`
			}
			if rec.Code != 200 {
				t.Fatalf("%d %s", rec.Code, rec.Body)
			}
			decodeStrict(t, rec, &tok)
			readLease(t, h.get(leasePath("doc-1"), tok.Token)) // the token works
		})
	}
	t.Run("dev mode without an HS256 secret is refused", func(t *testing.T) {
		pub, _, _ := ed25519.GenerateKey(rand.Reader)
		auth := testAuthConfig()
		auth.HS256Secret = nil
		auth.PublicKeys = []PublicKey{{KID: "k", Key: pub}}
		opts := Options{Engine: h.engine, Auth: auth, Dev: true}
		memoryStores(&opts)
		if _, err := New(opts); err == nil || !strings.Contains(err.Error(), "HS256Secret") {
			t.Fatalf("New = %v", err)
		}
	})
}

func TestNewChecksItsOptions(t *testing.T) {
	h := newHarness(t)
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	tests := []struct {
		name  string
		edit  func(*Options)
		field string
	}{
		{"a missing engine is refused", func(o *Options) { o.Engine = nil }, "Engine"},
		{"unordered limits are refused", func(o *Options) {
			o.Limits = lease.Limits{Min: 10 * time.Second, Default: time.Second, Max: time.Minute, HiddenMax: time.Minute}
		}, "Limits"},
		{"no key at all is refused", func(o *Options) { o.Auth.HS256Secret = nil }, "HS256Secret"},
		{"a 31-byte secret is refused", func(o *Options) { o.Auth.HS256Secret = make([]byte, 31) }, "HS256Secret"},
		{"a missing issuer is refused", func(o *Options) { o.Auth.Issuer = "" }, "Issuer"},
		{"a missing audience is refused", func(o *Options) { o.Auth.Audience = " " }, "Audience"},
		{"a leeway over 30s is refused", func(o *Options) { o.Auth.Leeway = 31 * time.Second }, "Leeway"},
		{"a negative leeway is refused", func(o *Options) { o.Auth.Leeway = -time.Second }, "Leeway"},
		{"a public key without a kid is refused", func(o *Options) { o.Auth.PublicKeys = []PublicKey{{Key: pub}} }, "KID"},
		{"two public keys with one kid are refused", func(o *Options) { o.Auth.PublicKeys = []PublicKey{{KID: "k", Key: pub}, {KID: "k", Key: pub}} }, "KID"},
		{"an unsupported key type is refused", func(o *Options) { o.Auth.PublicKeys = []PublicKey{{KID: "k", Key: "not a key"}} }, "Key"},
		{"a negative rate limit is refused", func(o *Options) { o.RateLimit = -1 }, "RateLimit"},
		{"no document store is refused", func(o *Options) { o.Documents = nil }, "Options.Documents"},
		{"no nonce store is refused", func(o *Options) { o.Nonces = nil }, "Options.Nonces"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := Options{Engine: h.engine, Auth: testAuthConfig()}
			memoryStores(&opts)
			tt.edit(&opts)
			_, err := New(opts)
			if err == nil || !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("New = %v, want an error naming %s", err, tt.field)
			}
		})
	}
}

func TestLogsNeverCarryTokensOrTheSecret(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.Engine = panicking{Store: o.Engine} })
	alice := h.token("alice")
	expired, err := issueToken(h.auth, TokenSpec{Sub: "alice", TTL: time.Minute}, time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	forged := alice[:len(alice)-4] + "AAAA"
	for _, r := range []request{
		{method: http.MethodPost, path: leasePath("doc-1"), token: alice, body: `{"tabId":"tab-a"}`},
		{method: http.MethodGet, path: leasePath("doc-1"), token: alice}, // panics: logged as internal
		{method: http.MethodGet, path: leasePath("doc-1"), token: expired},
		{method: http.MethodGet, path: leasePath("doc-1"), token: forged},
		{method: http.MethodGet, path: leasePath("doc-1") + "?access_token=" + alice},
		{method: http.MethodGet, path: "/nope?token=" + alice},
	} {
		h.do(r)
	}
	logs := h.logs.String()
	if !strings.Contains(logs, `"request_id"`) || !strings.Contains(logs, `"sub":"alice"`) || !strings.Contains(logs, `"route":"/v1/sessions/:sid/lease"`) {
		t.Fatalf("the logs lack the request id, sub or route:\n%s", logs)
	}
	// Why each credential was refused, and the peer of the connection, for an operator telling a
	// misconfigured identity provider from a probe.
	for _, want := range []string{`"error":"the token's signature is not valid`, `"error":"the token has expired"`, `"peer":"192.0.2.1"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("the logs lack %s:\n%s", want, logs)
		}
	}
	for _, secret := range []string{alice, expired, forged, testSecret, strings.Split(alice, ".")[2], "access_token"} {
		if strings.Contains(logs, secret) {
			t.Fatalf("the logs carry %q:\n%s", secret, logs)
		}
	}
}

func TestErrorHandlerLeavesCommittedResponsesAlone(t *testing.T) {
	h := newHarness(t)
	h.srv.echo.GET("/test/committed", func(c echo.Context) error {
		if err := c.String(http.StatusOK, "partial"); err != nil {
			return err
		}
		return errors.New("failed after writing")
	})
	rec := h.get("/test/committed", "")
	body, _ := io.ReadAll(rec.Body)
	if rec.Code != 200 || string(body) != "partial" {
		t.Fatalf("%d %q", rec.Code, body)
	}
}

func TestEchoSharedErrorsAreNotModified(t *testing.T) {
	h := newHarness(t)
	h.get("/nope", "")
	h.do(request{method: http.MethodDelete, path: "/healthz"})
	if echo.ErrNotFound.Internal != nil || echo.ErrMethodNotAllowed.Internal != nil {
		t.Fatal("an Echo shared error value was modified")
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestHeadIsAnsweredWhereverGetIs checks every GET route but the event stream over a real
// server: a HEAD has the GET's status, Content-Type and ETag, and no body (RFC 9110 §9.3.2). The
// event stream is GET only: a HEAD would open a stream.
func TestHeadIsAnsweredWhereverGetIs(t *testing.T) {
	h := newHarness(t)
	alice, root := h.token("alice"), h.adminToken("root")
	readLease(t, h.post(leasePath("doc-1"), alice, `{"tabId":"tab-a"}`))
	ts := h.serve()
	send := func(method, path, token string) (*http.Response, []byte) {
		t.Helper()
		req, err := http.NewRequest(method, ts.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatal(err)
		}
		return res, body
	}
	for _, tt := range []struct{ path, token string }{
		{"/healthz", ""},
		{"/readyz", ""},
		{"/metrics", ""},
		{"/openapi.yaml", ""},
		{"/.well-known/jwks.json", ""},
		{leasePath("doc-1") + "?tabId=tab-a", alice},
		{"/v1/sessions/doc-1/catalog?tabId=tab-a", alice},
		{"/v1/sessions/doc-1/tabs", alice},
		{"/v1/admin/catalog", root},
		{"/v1/admin/leases", root},
		{"/v1/admin/users/alice/sessions/doc-1/lease", root},
		{"/v1/admin/audit?sub=alice", root},
		{"/sdk/tablease.js", ""},
		{leasePath("doc-1"), ""}, // a 401 alike
	} {
		get, getBody := send(http.MethodGet, tt.path, tt.token)
		head, headBody := send(http.MethodHead, tt.path, tt.token)
		if head.StatusCode != get.StatusCode || head.Header.Get("Content-Type") != get.Header.Get("Content-Type") ||
			head.Header.Get("ETag") != get.Header.Get("ETag") || len(headBody) != 0 || len(getBody) == 0 {
			t.Errorf("HEAD %s: %d %q ETag %q, %d bytes; GET: %d %q ETag %q, %d bytes", tt.path,
				head.StatusCode, head.Header.Get("Content-Type"), head.Header.Get("ETag"), len(headBody),
				get.StatusCode, get.Header.Get("Content-Type"), get.Header.Get("ETag"), len(getBody))
		}
	}
	res, _ := send(http.MethodHead, eventsPath("doc-1", "tabId=tab-a"), alice)
	if res.StatusCode != http.StatusMethodNotAllowed || !strings.Contains(res.Header.Get("Allow"), http.MethodGet) {
		t.Errorf("HEAD of the event stream: %d, Allow %q; want 405 with GET allowed", res.StatusCode, res.Header.Get("Allow"))
	}
}
