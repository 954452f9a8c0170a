package guard_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tablease/tablease/internal/syncbuf"
	"github.com/tablease/tablease/owner/guard"
	"github.com/tablease/tablease/owner/leasetoken"
)

const issuer = "https://tablease.test"

var t0 = time.Date(2026, 12, 2, 13, 0, 0, 0, time.UTC)

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) { c.mu.Lock(); defer c.mu.Unlock(); c.now = c.now.Add(d) }

// fakeTablease serves a real KeySet's JWKS and answers /lease/check as told.
type fakeTablease struct {
	t      *testing.T
	clock  *clock
	keys   *leasetoken.KeySet
	signer *leasetoken.Signer
	srv    *httptest.Server

	jwksHits  atomic.Int32
	checkHits atomic.Int32

	mu          sync.Mutex
	checkStatus int           // what /lease/check answers; 200 by default
	checkBody   string        // overrides the body when set
	checkHang   bool          // /lease/check never answers
	checkDelay  time.Duration // /lease/check answers after this long
	lastAuth    string
	lastToken   string
	lastPath    string
}

func newFakeTablease(t *testing.T) *fakeTablease {
	t.Helper()
	f := &fakeTablease{t: t, clock: &clock{now: t0}, checkStatus: http.StatusOK}
	key, err := leasetoken.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	if f.keys, err = leasetoken.NewKeySet(key, leasetoken.KeySetOptions{Now: f.clock.Now}); err != nil {
		t.Fatal(err)
	}
	if f.signer, err = leasetoken.NewSigner(f.keys, issuer); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/jwks.json", func(w http.ResponseWriter, r *http.Request) {
		f.jwksHits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(f.keys.JWKS())
	})
	mux.HandleFunc("POST /v1/sessions/{sid}/lease/check", func(w http.ResponseWriter, r *http.Request) {
		f.checkHits.Add(1)
		var body struct{ Token string }
		_ = json.NewDecoder(r.Body).Decode(&body)
		f.mu.Lock()
		f.lastAuth, f.lastToken, f.lastPath = r.Header.Get("Authorization"), body.Token, r.URL.Path
		status, text, hang, delay := f.checkStatus, f.checkBody, f.checkHang, f.checkDelay
		f.mu.Unlock()
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
		if hang {
			<-r.Context().Done()
			return
		}
		if text == "" {
			switch status {
			case http.StatusOK:
				text = `{"valid":true,"lease":{"sessionId":"doc|A","held":true,"holder":{"tabId":"t-1","label":"","hidden":false},"epoch":7}}`
			case http.StatusConflict:
				text = `{"error":{"code":"LEASE_LOST","message":"lost","retryable":false,"details":{"epoch":8,"holder":{"tabId":"t-other","label":"","hidden":false}}}}`
			default:
				text = `{"error":{"code":"X","message":"x","retryable":false,"details":{}}}`
			}
		}
		w.Header().Set("Content-Type", "application/json")
		if status == http.StatusServiceUnavailable {
			w.Header().Set("Retry-After", "4")
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, text)
	})
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeTablease) setCheck(status int, body string, hang bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.checkStatus, f.checkBody, f.checkHang = status, body, hang
}

func (f *fakeTablease) token(sub, sid string, epoch int64) string {
	f.t.Helper()
	now := f.clock.Now()
	tok, err := f.signer.Sign(leasetoken.Claims{Subject: sub, Session: sid, Tab: "t-1", Epoch: epoch, IssuedAt: now, ExpiresAt: now.Add(45 * time.Second)})
	if err != nil {
		f.t.Fatal(err)
	}
	return tok
}

// app is a backend with one guarded mutation, POST /sessions/{sid}/items. Its own authentication
// is the X-User header; the session comes from the route.
type app struct {
	handler http.Handler
	jwks    *guard.JWKSClient
	guard   *guard.Guard
	seen    chan guard.Claims
}

func newApp(t *testing.T, tl *fakeTablease, configure func(*guard.Options)) *app {
	t.Helper()
	jwks, err := guard.NewJWKSClient(guard.JWKSOptions{BaseURL: tl.srv.URL, MinRefreshInterval: 10 * time.Second, Now: tl.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	opts := guard.Options{
		Keys:   jwks,
		Issuer: issuer,
		Now:    tl.clock.Now,
		Target: func(r *http.Request) (string, string, error) {
			return r.Header.Get("X-User"), r.PathValue("sid"), nil
		},
		BaseURL: tl.srv.URL,
	}
	if configure != nil {
		configure(&opts)
	}
	g, err := guard.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	a := &app{jwks: jwks, guard: g, seen: make(chan guard.Claims, 100)}
	mux := http.NewServeMux()
	mux.Handle("/sessions/{sid}/items", g.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, ok := guard.FromContext(r.Context())
		if ok {
			a.seen <- c
		}
		fmt.Fprintf(w, `{"ok":true,"epoch":%d,"guarded":%v}`, c.Epoch, ok)
	})))
	a.handler = mux
	return a
}

type rejection struct {
	Error struct {
		Code      string         `json:"code"`
		Message   string         `json:"message"`
		Retryable *bool          `json:"retryable"`
		Details   map[string]any `json:"details"`
	} `json:"error"`
}

func (a *app) do(t *testing.T, method, user, sid, token string) (*httptest.ResponseRecorder, rejection) {
	t.Helper()
	req := httptest.NewRequest(method, "/sessions/"+sid+"/items", strings.NewReader(`{"name":"x"}`))
	req.Header.Set("X-User", user)
	req.Header.Set("Authorization", "Bearer access-of-"+user)
	for v := range strings.SplitSeq(token, "\n") { // several lines: several headers
		if v != "" {
			req.Header.Add(guard.Header, v)
		}
	}
	rec := httptest.NewRecorder()
	a.handler.ServeHTTP(rec, req)
	var rej rejection
	if rec.Code != http.StatusOK {
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Fatalf("rejection with Content-Type %q: %s", ct, rec.Body)
		}
		dec := json.NewDecoder(rec.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&rej); err != nil {
			t.Fatalf("rejection body: %v", err)
		}
		if rej.Error.Code == "" || rej.Error.Message == "" || rej.Error.Retryable == nil || rej.Error.Details == nil {
			t.Fatalf("rejection lacks a field of the error shape: %+v", rej)
		}
	}
	return rec, rej
}

func expectRejected(t *testing.T, rec *httptest.ResponseRecorder, rej rejection, status int, code, reason string) {
	t.Helper()
	if rec.Code != status || rej.Error.Code != code {
		t.Fatalf("got %d %s, want %d %s: %s", rec.Code, rej.Error.Code, status, code, rec.Body)
	}
	if reason != "" && rej.Error.Details["reason"] != reason {
		t.Fatalf("reason %v, want %s", rej.Error.Details["reason"], reason)
	}
}

func TestGuardOffline(t *testing.T) {
	tl := newFakeTablease(t)
	a := newApp(t, tl, nil)
	good := tl.token("alice", "doc-A", 7)

	t.Run("a valid token passes and the handler sees its epoch", func(t *testing.T) {
		rec, _ := a.do(t, http.MethodPost, "alice", "doc-A", good)
		if rec.Code != http.StatusOK || rec.Body.String() != `{"ok":true,"epoch":7,"guarded":true}` {
			t.Fatalf("got %d %s", rec.Code, rec.Body)
		}
		c := <-a.seen
		if c.Subject != "alice" || c.Session != "doc-A" || c.Tab != "t-1" || c.Epoch != 7 || c.Issuer != issuer {
			t.Fatalf("claims in the context: %+v", c)
		}
	})

	expired := tl.token("alice", "doc-A", 7)
	tampered := func() string {
		parts := strings.Split(good, ".")
		return parts[0] + "." + strings.TrimSuffix(parts[1], parts[1][len(parts[1])-2:]) + "AA." + parts[2]
	}()
	otherKey, _ := leasetoken.GenerateKey()
	otherKeys, _ := leasetoken.NewKeySet(otherKey, leasetoken.KeySetOptions{Now: tl.clock.Now})
	otherSigner, _ := leasetoken.NewSigner(otherKeys, issuer)
	forged, _ := otherSigner.Sign(leasetoken.Claims{Subject: "alice", Session: "doc-A", Tab: "t", Epoch: 9, IssuedAt: t0, ExpiresAt: t0.Add(time.Hour)})

	tests := []struct {
		name, user, sid, token string
		reason                 string
		setup                  func()
	}{
		{name: "a request without the header is refused", user: "alice", sid: "doc-A", reason: guard.ReasonMissingToken},
		{name: "a token for session A is refused for session B", user: "alice", sid: "doc-B", token: good, reason: guard.ReasonWrongSession},
		{name: "another user's token is refused", user: "bob", sid: "doc-A", token: good, reason: guard.ReasonWrongUser},
		{name: "a tampered token is refused", user: "alice", sid: "doc-A", token: tampered, reason: guard.ReasonInvalidToken},
		{name: "garbage is refused", user: "alice", sid: "doc-A", token: "abc", reason: guard.ReasonInvalidToken},
		{name: "two headers are refused, even both valid", user: "alice", sid: "doc-A", token: good + "\n" + good, reason: guard.ReasonInvalidToken},
		// Once the JWKS may be fetched again (MinRefreshInterval, 10 s): the fetch the token
		// causes finds no such key. Within the interval, see TestGuardRefreshesOnceOnUnknownKid.
		{name: "a token signed by a key tablease does not publish is refused", user: "alice", sid: "doc-A", token: forged, reason: guard.ReasonUnknownKey,
			setup: func() { tl.clock.Add(10 * time.Second) }},
		{name: "a request the app cannot attribute is refused", user: "", sid: "doc-A", token: good, reason: guard.ReasonNoTarget},
		{name: "an expired token is refused", user: "alice", sid: "doc-A", token: expired, reason: guard.ReasonExpiredToken,
			setup: func() { tl.clock.Add(time.Hour) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.setup != nil {
				tt.setup()
			}
			rec, rej := a.do(t, http.MethodPost, tt.user, tt.sid, tt.token)
			expectRejected(t, rec, rej, http.StatusForbidden, guard.CodeNotLeaseOwner, tt.reason)
			if *rej.Error.Retryable {
				t.Fatal("a NOT_LEASE_OWNER rejection says retryable")
			}
		})
	}
	if len(a.seen) != 0 {
		t.Fatal("a refused request reached the handler")
	}
}

func TestGuardRefreshesOnceOnUnknownKid(t *testing.T) {
	tl := newFakeTablease(t)
	a := newApp(t, tl, nil)
	if rec, _ := a.do(t, http.MethodPost, "alice", "doc-A", tl.token("alice", "doc-A", 1)); rec.Code != http.StatusOK {
		t.Fatalf("before rotation: %d %s", rec.Code, rec.Body)
	}
	if n := tl.jwksHits.Load(); n != 1 {
		t.Fatalf("JWKS fetched %d times for the first token, want 1", n)
	}

	next, _ := leasetoken.GenerateKey()
	tl.clock.Add(time.Second)
	if err := tl.keys.Rotate(next, tl.clock.Now()); err != nil {
		t.Fatal(err)
	}
	fresh := tl.token("alice", "doc-A", 2)

	// Within MinRefreshInterval of the last fetch, unknown kids — the new key's and an
	// attacker's made-up ones — cause no fetch. The guard cannot tell them apart before the next
	// fetch, so it answers "try again when the JWKS may be fetched" (9 s), not "forged".
	for _, res := range concurrently(t, a, 20, fresh) {
		expectRejected(t, res.rec, res.rej, http.StatusServiceUnavailable, guard.CodeUnavailable, "")
		if ra := res.rec.Header().Get("Retry-After"); ra != "9" || !*res.rej.Error.Retryable {
			t.Fatalf("Retry-After %q, retryable %v, want 9 and true", ra, *res.rej.Error.Retryable)
		}
	}
	if n := tl.jwksHits.Load(); n != 1 {
		t.Fatalf("JWKS fetched %d times within the refresh interval, want 1", n)
	}

	// Once the interval has passed, the unknown kid triggers one fetch and the token passes,
	// however many requests carry it at once.
	tl.clock.Add(10 * time.Second)
	for _, res := range concurrently(t, a, 20, fresh) {
		if res.rec.Code != http.StatusOK {
			t.Fatalf("after rotation: %d %s", res.rec.Code, res.rec.Body)
		}
	}
	if n := tl.jwksHits.Load(); n != 2 {
		t.Fatalf("JWKS fetched %d times in all, want 2", n)
	}
	// The old key is still published, so tokens it signed before the rotation still pass.
	old := tl.keys.Published(tl.clock.Now())
	if len(old) != 2 {
		t.Fatalf("published %d keys", len(old))
	}
}

// TestGuardTellsAKidUnknownOnlyOnceASetFetchedAfterItsTokenLacksIt: a token of a key the JWKS
// does not have yet (an instance behind tablease's URL that had not the rotation's new key) gets
// 503 "try again" however often it comes, not 403 for the request that fetched and 503 for the
// next, until a set fetched after the token was signed (its iat, with the margin) decides: the
// key published since passes, a key never published is unknown_key, without another fetch.
func TestGuardTellsAKidUnknownOnlyOnceASetFetchedAfterItsTokenLacksIt(t *testing.T) {
	tl := newFakeTablease(t)
	a := newApp(t, tl, nil)
	if rec, _ := a.do(t, http.MethodPost, "alice", "doc-A", tl.token("alice", "doc-A", 1)); rec.Code != http.StatusOK {
		t.Fatalf("first token: %d %s", rec.Code, rec.Body)
	}
	tl.clock.Add(time.Minute) // the JWKS may be fetched again
	signWith := func(k leasetoken.SigningKey) string {
		t.Helper()
		keys, _ := leasetoken.NewKeySet(k, leasetoken.KeySetOptions{Now: tl.clock.Now})
		signer, _ := leasetoken.NewSigner(keys, issuer)
		now := tl.clock.Now()
		tok, err := signer.Sign(leasetoken.Claims{Subject: "alice", Session: "doc-A", Tab: "t-1", Epoch: 2, IssuedAt: now, ExpiresAt: now.Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	next, _ := leasetoken.GenerateKey()
	never, _ := leasetoken.GenerateKey()
	lagging, forged := signWith(next), signWith(never)
	for i, want := range []string{"10", "10", "9"} {
		for _, token := range []string{lagging, forged} {
			rec, rej := a.do(t, http.MethodPost, "alice", "doc-A", token)
			expectRejected(t, rec, rej, http.StatusServiceUnavailable, guard.CodeUnavailable, "")
			if ra := rec.Header().Get("Retry-After"); ra != want {
				t.Fatalf("call %d: Retry-After %q, want %s", i, ra, want)
			}
		}
		tl.clock.Add(time.Second / 2)
	}
	if n := tl.jwksHits.Load(); n != 2 {
		t.Fatalf("JWKS fetched %d times, want 2 (one by the first of the new kids)", n)
	}

	if err := tl.keys.Rotate(next, tl.clock.Now()); err != nil { // now published
		t.Fatal(err)
	}
	tl.clock.Add(10 * time.Second)
	if rec, _ := a.do(t, http.MethodPost, "alice", "doc-A", lagging); rec.Code != http.StatusOK {
		t.Fatalf("the key published since: %d %s", rec.Code, rec.Body)
	}
	rec, rej := a.do(t, http.MethodPost, "alice", "doc-A", forged)
	expectRejected(t, rec, rej, http.StatusForbidden, guard.CodeNotLeaseOwner, guard.ReasonUnknownKey)
	if n := tl.jwksHits.Load(); n != 3 {
		t.Fatalf("JWKS fetched %d times, want 3", n)
	}
}

type result struct {
	rec *httptest.ResponseRecorder
	rej rejection
}

// concurrently sends n requests with token at once (checking them on the test goroutine after).
func concurrently(t *testing.T, a *app, n int, token string) []result {
	t.Helper()
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := httptest.NewRequest(http.MethodPost, "/sessions/doc-A/items", nil)
			req.Header.Set("X-User", "alice")
			req.Header.Set(guard.Header, token)
			rec := httptest.NewRecorder()
			a.handler.ServeHTTP(rec, req)
			results[i].rec = rec
			_ = json.Unmarshal(rec.Body.Bytes(), &results[i].rej)
		}()
	}
	wg.Wait()
	for range len(a.seen) {
		<-a.seen
	}
	return results
}

func TestGuardFailsClosedWithoutKeys(t *testing.T) {
	tl := newFakeTablease(t)
	tok := tl.token("alice", "doc-A", 1)
	a := newApp(t, tl, func(o *guard.Options) {
		down, _ := guard.NewJWKSClient(guard.JWKSOptions{BaseURL: "http://127.0.0.1:1", Timeout: time.Second})
		o.Keys = down
	})
	rec, rej := a.do(t, http.MethodPost, "alice", "doc-A", tok)
	expectRejected(t, rec, rej, http.StatusServiceUnavailable, guard.CodeUnavailable, "")
	if !*rej.Error.Retryable || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("a 503 must be retryable with Retry-After: %v %q", *rej.Error.Retryable, rec.Header().Get("Retry-After"))
	}
}

func TestGuardStrict(t *testing.T) {
	tl := newFakeTablease(t)
	a := newApp(t, tl, func(o *guard.Options) { o.Strict = true; o.CheckTimeout = 300 * time.Millisecond })
	tok := tl.token("alice", "doc|A", 7)

	t.Run("a current epoch passes, with the token and the caller's access token sent to tablease", func(t *testing.T) {
		tl.setCheck(http.StatusOK, "", false)
		rec, _ := a.do(t, http.MethodPost, "alice", "doc|A", tok)
		if rec.Code != http.StatusOK {
			t.Fatalf("got %d %s", rec.Code, rec.Body)
		}
		<-a.seen
		tl.mu.Lock()
		defer tl.mu.Unlock()
		if tl.lastToken != tok || tl.lastAuth != "Bearer access-of-alice" || tl.lastPath != "/v1/sessions/doc|A/lease/check" {
			t.Fatalf("the check got token %t, auth %q, path %q", tl.lastToken == tok, tl.lastAuth, tl.lastPath)
		}
	})
	t.Run("a 409 from tablease is LEASE_LOST", func(t *testing.T) {
		tl.setCheck(http.StatusConflict, "", false)
		rec, rej := a.do(t, http.MethodPost, "alice", "doc|A", tok)
		expectRejected(t, rec, rej, http.StatusConflict, guard.CodeLeaseLost, "")
		if rej.Error.Details["tokenEpoch"] != float64(7) || rej.Error.Details["epoch"] != float64(8) {
			t.Fatalf("details %v", rej.Error.Details)
		}
	})
	t.Run("an epoch of the check's answer stays an integer in OnReject", func(t *testing.T) {
		var seen any
		b := newApp(t, tl, func(o *guard.Options) {
			o.Strict = true
			o.OnReject = func(r *http.Request, e *guard.Error) { seen = e.Details["epoch"] }
		})
		tl.setCheck(http.StatusConflict, `{"error":{"code":"LEASE_LOST","details":{"epoch":1796421145440197,"holder":null}}}`, false)
		rec, rej := b.do(t, http.MethodPost, "alice", "doc|A", tok)
		expectRejected(t, rec, rej, http.StatusConflict, guard.CodeLeaseLost, "")
		if got := fmt.Sprint(seen); got != "1796421145440197" {
			t.Errorf("OnReject saw the epoch as %s", got)
		}
	})
	t.Run("a refused check is NOT_LEASE_OWNER", func(t *testing.T) {
		tl.setCheck(http.StatusUnauthorized, "", false)
		rec, rej := a.do(t, http.MethodPost, "alice", "doc|A", tok)
		expectRejected(t, rec, rej, http.StatusForbidden, guard.CodeNotLeaseOwner, guard.ReasonCheckRefused)
	})
	for name, set := range map[string]func(){
		"a 503 from tablease fails closed":         func() { tl.setCheck(http.StatusServiceUnavailable, "", false) },
		"a 200 that is not an answer fails closed": func() { tl.setCheck(http.StatusOK, "<html>", false) },
		"a 200 valid without a lease fails closed": func() { tl.setCheck(http.StatusOK, `{"valid":true}`, false) },
		"a 200 valid for another tab fails closed": func() {
			tl.setCheck(http.StatusOK, `{"valid":true,"lease":{"held":true,"holder":{"tabId":"t-2"},"epoch":7}}`, false)
		},
		"a 200 valid for another epoch fails closed": func() {
			tl.setCheck(http.StatusOK, `{"valid":true,"lease":{"held":true,"holder":{"tabId":"t-1"},"epoch":8}}`, false)
		},
		"a check that hangs fails closed": func() { tl.setCheck(http.StatusOK, "", true) },
	} {
		t.Run(name, func(t *testing.T) {
			set()
			start := time.Now()
			rec, rej := a.do(t, http.MethodPost, "alice", "doc|A", tok)
			expectRejected(t, rec, rej, http.StatusServiceUnavailable, guard.CodeUnavailable, "")
			if !*rej.Error.Retryable || rec.Header().Get("Retry-After") == "" {
				t.Fatal("a 503 must be retryable with Retry-After")
			}
			if time.Since(start) > 10*time.Second {
				t.Fatal("the check was not bounded by CheckTimeout")
			}
		})
	}
	t.Run("a 503 names what tablease answered: its user's rate limit, or its store down", func(t *testing.T) {
		for _, tc := range []struct {
			status int
			body   string
			code   any
		}{
			{http.StatusTooManyRequests, `{"error":{"code":"RATE_LIMITED","message":"m","retryable":true,"details":{"retryAfterMs":900,"limit":"requests"}}}`, "RATE_LIMITED"},
			{http.StatusServiceUnavailable, `{"error":{"code":"STORE_UNAVAILABLE","message":"m","retryable":true,"details":{}}}`, "STORE_UNAVAILABLE"},
			{http.StatusBadGateway, `<html>`, nil},
		} {
			tl.setCheck(tc.status, tc.body, false)
			rec, rej := a.do(t, http.MethodPost, "alice", "doc|A", tok)
			expectRejected(t, rec, rej, http.StatusServiceUnavailable, guard.CodeUnavailable, "")
			if rej.Error.Details["status"] != float64(tc.status) || rej.Error.Details["code"] != tc.code {
				t.Fatalf("tablease's %d: details %v, want status %d and code %v", tc.status, rej.Error.Details, tc.status, tc.code)
			}
		}
	})
	t.Run("a mismatched token never reaches tablease", func(t *testing.T) {
		before := tl.checkHits.Load()
		rec, rej := a.do(t, http.MethodPost, "alice", "doc-B", tok)
		expectRejected(t, rec, rej, http.StatusForbidden, guard.CodeNotLeaseOwner, guard.ReasonWrongSession)
		if tl.checkHits.Load() != before {
			t.Fatal("the guard asked tablease about a token it had already refused")
		}
	})
	if len(a.seen) != 0 {
		t.Fatal("a refused request reached the handler")
	}
}

// TestGuardStrictWaitsOutTableasesStoreTimeout: with the default CheckTimeout, a check that
// tablease answers 503 after its own store timeout (TABLEASE_REDIS_TIMEOUT, default 2s) reaches
// the client as tablease's answer, with its Retry-After, not as a guard that gave up first.
func TestGuardStrictWaitsOutTableasesStoreTimeout(t *testing.T) {
	tl := newFakeTablease(t)
	var cause error
	a := newApp(t, tl, func(o *guard.Options) {
		o.Strict = true
		o.OnReject = func(r *http.Request, e *guard.Error) { cause = e.Err }
	})
	tl.setCheck(http.StatusServiceUnavailable, "", false)
	tl.mu.Lock()
	tl.checkDelay = 2*time.Second + 100*time.Millisecond
	tl.mu.Unlock()
	rec, rej := a.do(t, http.MethodPost, "alice", "doc-A", tl.token("alice", "doc-A", 3))
	expectRejected(t, rec, rej, http.StatusServiceUnavailable, guard.CodeUnavailable, "")
	if got := rec.Header().Get("Retry-After"); got != "4" {
		t.Fatalf("Retry-After %q, want tablease's 4 (the guard gave up before tablease answered: %v)", got, cause)
	}
}

func TestGuardStrictServerDown(t *testing.T) {
	tl := newFakeTablease(t)
	key := tl.keys.Active().Public()
	down := httptest.NewServer(http.NotFoundHandler())
	downURL := down.URL
	down.Close()
	a := newApp(t, tl, func(o *guard.Options) {
		o.Keys = leasetoken.PublicKeys{key}
		o.Strict = true
		o.BaseURL = downURL
	})
	rec, rej := a.do(t, http.MethodPost, "alice", "doc-A", tl.token("alice", "doc-A", 3))
	expectRejected(t, rec, rej, http.StatusServiceUnavailable, guard.CodeUnavailable, "")
	if !*rej.Error.Retryable || rec.Header().Get("Retry-After") != "1" {
		t.Fatalf("retryable %v, Retry-After %q", *rej.Error.Retryable, rec.Header().Get("Retry-After"))
	}
}

func TestGuardOptions(t *testing.T) {
	tl := newFakeTablease(t)
	keys := leasetoken.PublicKeys{tl.keys.Active().Public()}
	target := func(*http.Request) (string, string, error) { return "", "", nil }
	for name, opts := range map[string]guard.Options{
		"no keys":                         {Issuer: issuer, Target: target},
		"no issuer":                       {Keys: keys, Target: target},
		"no target":                       {Keys: keys, Issuer: issuer},
		"strict without base URL":         {Keys: keys, Issuer: issuer, Target: target, Strict: true},
		"strict with a relative base URL": {Keys: keys, Issuer: issuer, Target: target, Strict: true, BaseURL: "/tablease"},
	} {
		if _, err := guard.New(opts); err == nil {
			t.Errorf("New accepted %s", name)
		}
	}
	if _, err := guard.NewJWKSClient(guard.JWKSOptions{}); err == nil {
		t.Error("NewJWKSClient accepted no URL")
	}
}

func TestGuardSkipAndTargetErrors(t *testing.T) {
	tl := newFakeTablease(t)
	var rejected atomic.Int32
	a := newApp(t, tl, func(o *guard.Options) {
		o.Skip = guard.SafeMethods
		o.OnReject = func(*http.Request, *guard.Error) { rejected.Add(1) }
		o.Target = func(r *http.Request) (string, string, error) {
			if r.Header.Get("X-User") == "" {
				return "", "", &guard.Error{Status: http.StatusUnauthorized, Code: "UNAUTHENTICATED", Message: "Sign in."}
			}
			return r.Header.Get("X-User"), r.PathValue("sid"), nil
		}
	})
	rec, _ := a.do(t, http.MethodGet, "alice", "doc-A", "")
	if rec.Code != http.StatusOK || rec.Body.String() != `{"ok":true,"epoch":0,"guarded":false}` {
		t.Fatalf("a skipped GET: %d %s", rec.Code, rec.Body)
	}
	rec, rej := a.do(t, http.MethodPost, "", "doc-A", tl.token("alice", "doc-A", 1))
	expectRejected(t, rec, rej, http.StatusUnauthorized, "UNAUTHENTICATED", "")
	if rejected.Load() != 1 {
		t.Fatalf("OnReject called %d times", rejected.Load())
	}
}

func TestGuardWithoutOnRejectLogsWhatPointsAtTheSetup(t *testing.T) {
	tl := newFakeTablease(t)
	var logs syncbuf.Buffer
	a := newApp(t, tl, func(o *guard.Options) {
		o.Strict = true
		o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	tok := tl.token("alice", "doc-A", 7)
	lines := func() []string { return strings.Split(strings.TrimSpace(logs.String()), "\n") }

	// A route whose Target names no user: what to check is logged, the answer says none of it.
	rec, rej := a.do(t, http.MethodPost, "", "doc-A", tok)
	expectRejected(t, rec, rej, http.StatusForbidden, guard.CodeNotLeaseOwner, guard.ReasonNoTarget)
	if rej.Error.Message != "The user this request is made for is unknown." {
		t.Errorf("the answer of a Target that names no user does not say so: %+v", rej.Error)
	}
	if b, _ := json.Marshal(rej); strings.Contains(string(b), "Options.") {
		t.Errorf("the answer names the guard's options: %s", b)
	}
	if got := lines(); len(got) != 1 || !strings.Contains(got[0], "level=WARN") || !strings.Contains(got[0], "reason=no_target") ||
		!strings.Contains(got[0], "Options.Target") || !strings.Contains(got[0], "path=/sessions/doc-A/items") {
		t.Fatalf("the log after a no_target rejection: %q", got)
	}
	// The same kind again within 10 s is counted, not written.
	a.do(t, http.MethodPost, "", "doc-A", tok)
	if got := lines(); len(got) != 1 {
		t.Fatalf("a second no_target within 10 s was logged: %q", got)
	}

	// tablease refusing the strict check (a 401: the check had no valid access token).
	tl.setCheck(http.StatusUnauthorized, `{"error":{"code":"UNAUTHENTICATED","message":"an Authorization: Bearer access token is required"}}`, false)
	rec, rej = a.do(t, http.MethodPost, "alice", "doc-A", tok)
	expectRejected(t, rec, rej, http.StatusForbidden, guard.CodeNotLeaseOwner, guard.ReasonCheckRefused)
	if got := lines(); len(got) != 2 || !strings.Contains(got[1], "reason=check_refused") || !strings.Contains(got[1], "Options.AccessToken") {
		t.Fatalf("the log after a refused check: %q", got)
	}

	// What the tab itself answers for is not logged: another user's token, a lost lease, two
	// Tablease-Lease headers (refused as an invalid token, which a wrong Issuer would be logged as).
	a.do(t, http.MethodPost, "bob", "doc-A", tok)
	tl.setCheck(http.StatusConflict, "", false)
	a.do(t, http.MethodPost, "alice", "doc-A", tok)
	rec, rej = a.do(t, http.MethodPost, "alice", "doc-A", tok+"\n"+tok)
	expectRejected(t, rec, rej, http.StatusForbidden, guard.CodeNotLeaseOwner, guard.ReasonInvalidToken)
	if got := lines(); len(got) != 2 {
		t.Fatalf("ordinary rejections were logged: %q", got[2:])
	}

	// A 503 says what was asked of whom, each cause in a line of its own within the 10 s:
	// tablease's rate limit, its store, and, from another guard, the app's AccessToken.
	tl.setCheck(http.StatusTooManyRequests, `{"error":{"code":"RATE_LIMITED","message":"too many requests"}}`, false)
	a.do(t, http.MethodPost, "alice", "doc-A", tok)
	tl.setCheck(http.StatusServiceUnavailable, `{"error":{"code":"STORE_UNAVAILABLE","message":"the store is unavailable"}}`, false)
	a.do(t, http.MethodPost, "alice", "doc-A", tok)
	if got := lines(); len(got) != 4 || !strings.Contains(got[2], "TABLEASE_RATE_LIMIT") || !strings.Contains(got[3], "STORE_UNAVAILABLE is its Redis") {
		t.Fatalf("the log after a rate-limited and a store-refused check: %q", got[2:])
	}
	b := newApp(t, tl, func(o *guard.Options) {
		o.Strict = true
		o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		o.AccessToken = func(*http.Request) (string, error) { return "", errors.New("no access token in the app session") }
	})
	rec, rej = b.do(t, http.MethodPost, "alice", "doc-A", tok)
	expectRejected(t, rec, rej, http.StatusServiceUnavailable, guard.CodeUnavailable, "")
	if got := lines(); len(got) != 5 || !strings.Contains(got[4], "Options.AccessToken failed") || !strings.Contains(got[4], "no access token in the app session") {
		t.Fatalf("the log after AccessToken failed: %q", got[4:])
	}
	// A 502 page of a proxy, not tablease's error, says so; a bare 429 is still the rate limit.
	c := newApp(t, tl, func(o *guard.Options) {
		o.Strict = true
		o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	tl.setCheck(http.StatusBadGateway, `<html><body>Bad Gateway</body></html>`, false)
	c.do(t, http.MethodPost, "alice", "doc-A", tok)
	tl.setCheck(http.StatusTooManyRequests, ``, false)
	c.do(t, http.MethodPost, "alice", "doc-A", tok)
	if got := lines(); len(got) != 7 || !strings.Contains(got[5], "Options.BaseURL, or a proxy") || !strings.Contains(got[6], "TABLEASE_RATE_LIMIT") {
		t.Fatalf("the log after a proxy's 502 and a bare 429: %q", got[5:])
	}
}

// TestTheLoggedPathIsPercentEncoded: slog's JSON handler escapes only what JSON needs, so the
// path as net/http decoded it would carry U+0085, U+202E or DEL raw into the log line.
func TestTheLoggedPathIsPercentEncoded(t *testing.T) {
	tl := newFakeTablease(t)
	var logs syncbuf.Buffer
	a := newApp(t, tl, func(o *guard.Options) { o.Logger = slog.New(slog.NewJSONHandler(&logs, nil)) })
	rec, rej := a.do(t, http.MethodPost, "", "a%C2%85b%E2%80%AEc%7Fd", tl.token("alice", "doc-A", 7))
	expectRejected(t, rec, rej, http.StatusForbidden, guard.CodeNotLeaseOwner, guard.ReasonNoTarget)
	line := logs.String()
	if strings.ContainsAny(line, "\u0085\u202e\x7f") || !strings.Contains(line, `"path":"/sessions/a%C2%85b%E2%80%AEc%7Fd/items"`) {
		t.Fatalf("the log line: %q", line)
	}
}

func TestGuardWithOnRejectLogsNothing(t *testing.T) {
	tl := newFakeTablease(t)
	var logs syncbuf.Buffer
	a := newApp(t, tl, func(o *guard.Options) {
		o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		o.OnReject = func(*http.Request, *guard.Error) {}
	})
	a.do(t, http.MethodPost, "", "doc-A", tl.token("alice", "doc-A", 7))
	if logs.String() != "" {
		t.Fatalf("a guard with OnReject logged: %s", logs.String())
	}
}

func TestErrorMatchesSentinels(t *testing.T) {
	tl := newFakeTablease(t)
	a := newApp(t, tl, nil)
	req := httptest.NewRequest(http.MethodPost, "/x", nil)
	_, err := a.guard.Check(req)
	if !errors.Is(err, guard.ErrNotOwner) || errors.Is(err, guard.ErrLeaseLost) || errors.Is(err, guard.ErrUnavailable) {
		t.Fatalf("Check = %v", err)
	}
	var e *guard.Error
	if !errors.As(err, &e) || e.Status != http.StatusForbidden {
		t.Fatalf("Check = %#v", err)
	}
	if _, ok := guard.FromContext(context.Background()); ok {
		t.Fatal("FromContext found claims in an empty context")
	}
	lost := guard.NewLeaseLost(guard.Claims{Epoch: 5}, map[string]any{"resource": "item-1"})
	if !errors.Is(lost, guard.ErrLeaseLost) || lost.Status != http.StatusConflict || lost.Details["tokenEpoch"] != int64(5) || lost.Details["resource"] != "item-1" {
		t.Fatalf("NewLeaseLost = %+v", lost)
	}
	rec := httptest.NewRecorder()
	guard.WriteError(rec, errors.New("secret detail"))
	if rec.Code != http.StatusInternalServerError || strings.Contains(rec.Body.String(), "secret") {
		t.Fatalf("WriteError of a plain error: %d %s", rec.Code, rec.Body)
	}
}

// TestAGuardBehindTheSignersClockSaysSo: a guard whose clock is behind Redis's beyond the leeway
// sees a fresh token's iat in its future; its warning names the clock, not the Issuer.
func TestAGuardBehindTheSignersClockSaysSo(t *testing.T) {
	tl := newFakeTablease(t)
	var logs syncbuf.Buffer
	a := newApp(t, tl, func(o *guard.Options) {
		o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		o.Now = func() time.Time { return tl.clock.Now().Add(-time.Minute) }
	})
	rec, rej := a.do(t, http.MethodPost, "alice", "doc-A", tl.token("alice", "doc-A", 7))
	expectRejected(t, rec, rej, http.StatusForbidden, guard.CodeNotLeaseOwner, guard.ReasonInvalidToken)
	if got := logs.String(); !strings.Contains(got, "reason=invalid_token") || !strings.Contains(got, "clock is behind") || strings.Contains(got, "Options.Issuer") {
		t.Fatalf("the log of a guard a minute behind: %q", got)
	}
}
