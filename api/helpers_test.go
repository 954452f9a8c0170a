package api

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tablease/tablease/internal/syncbuf"
	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/lease/leasemem"
)

const testSecret = "test-secret-0123456789-abcdefghijklmnopqrstuvwxyz"

func testAuthConfig() AuthConfig {
	return AuthConfig{
		HS256Secret: []byte(testSecret),
		Issuer:      "https://idp.example.test",
		Audience:    "tablease-test",
		Leeway:      0,
	}
}

// fakeClock is the engine's clock; tests move it forward by hand.
type fakeClock struct {
	mu sync.Mutex // protects t
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

type harness struct {
	t      *testing.T
	srv    *Server
	engine *leasemem.Engine
	clock  *fakeClock
	logs   *syncbuf.Buffer
	auth   AuthConfig
}

// newHarness builds a server on a fresh memory engine; mods adjust the options.
func newHarness(t *testing.T, mods ...func(*Options)) *harness {
	t.Helper()
	clock := &fakeClock{t: time.Date(2026, 12, 2, 13, 0, 0, 123_000_000, time.UTC)}
	eng, err := leasemem.New(leasemem.Options{Limits: lease.DefaultLimits, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close() })
	logs := &syncbuf.Buffer{}
	opts := Options{
		Engine:  eng,
		Limits:  lease.DefaultLimits,
		Auth:    testAuthConfig(),
		Logger:  slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Version: "test",
		Now:     clock.Now,
	}
	memoryStores(&opts)
	for _, m := range mods {
		m(&opts)
	}
	srv, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return &harness{t: t, srv: srv, engine: eng, clock: clock, logs: logs, auth: opts.Auth}
}

// memoryStores gives o the document and nonce stores of this process that go with the memory
// engine, which is neither: New needs both.
func memoryStores(o *Options) {
	o.Documents = leasemem.NewDocumentStore(nil)
	o.Nonces = leasemem.NewNonceStore(nil)
}

// token is a valid HS256 access token for sub.
func (h *harness) token(sub string, sessions ...string) string {
	h.t.Helper()
	tok, err := IssueToken(h.auth, TokenSpec{Sub: sub, Sessions: sessions, TTL: time.Hour})
	if err != nil {
		h.t.Fatal(err)
	}
	return tok
}

type request struct {
	method  string
	path    string
	token   string // sent as a Bearer token when not empty
	body    string // sent with Content-Type: application/json when not empty
	headers map[string]string
	also    http.Header // added after headers: a header given more than once
	remote  string
	host    string // the Host header; default example.com
}

func (h *harness) do(r request) *httptest.ResponseRecorder {
	h.t.Helper()
	var body io.Reader
	if r.body != "" {
		body = strings.NewReader(r.body)
	}
	req := httptest.NewRequest(r.method, r.path, body)
	if r.body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if r.token != "" {
		req.Header.Set("Authorization", "Bearer "+r.token)
	}
	for k, v := range r.headers {
		req.Header.Set(k, v)
	}
	for k, vs := range r.also {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if r.remote != "" {
		req.RemoteAddr = r.remote
	}
	if r.host != "" {
		req.Host = r.host
	}
	rec := httptest.NewRecorder()
	h.srv.Handler().ServeHTTP(rec, req)
	return rec
}

func (h *harness) post(path, token, body string) *httptest.ResponseRecorder {
	return h.do(request{method: http.MethodPost, path: path, token: token, body: body})
}

func (h *harness) get(path, token string) *httptest.ResponseRecorder {
	return h.do(request{method: http.MethodGet, path: path, token: token})
}

// leaseAnswer is the lease object as a client reads it.
type leaseAnswer struct {
	SessionID    string      `json:"sessionId"`
	Held         bool        `json:"held"`
	Holder       *holderJSON `json:"holder"`
	Epoch        int64       `json:"epoch"`
	GrantedAt    *string     `json:"grantedAt"`
	ExpiresAt    *string     `json:"expiresAt"`
	TTLMs        int64       `json:"ttlMs"`
	RemainingMs  int64       `json:"remainingMs"`
	RenewAfterMs int64       `json:"renewAfterMs"`
	Transitions  int64       `json:"transitions"`
	BlockedUntil *string     `json:"blockedUntil"`
	Role         *string     `json:"role"`
	Token        *string     `json:"token"`
}

type errorAnswer struct {
	Error struct {
		Code      string         `json:"code"`
		Message   string         `json:"message"`
		Retryable *bool          `json:"retryable"`
		Details   map[string]any `json:"details"`
	} `json:"error"`
}

func decodeStrict(t *testing.T, rec *httptest.ResponseRecorder, v any) {
	t.Helper()
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("Content-Type = %q, want application/json; body %s", ct, rec.Body)
	}
	dec := json.NewDecoder(bytes.NewReader(rec.Body.Bytes()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("decoding %s: %v", rec.Body, err)
	}
}

func readLease(t *testing.T, rec *httptest.ResponseRecorder) leaseAnswer {
	t.Helper()
	if rec.Code != http.StatusOK {
		t.Fatalf("status = %d, want 200; body %s", rec.Code, rec.Body)
	}
	var l leaseAnswer
	decodeStrict(t, rec, &l)
	return l
}

// wantError checks the status and the JSON error shape and returns the error.
func wantError(t *testing.T, rec *httptest.ResponseRecorder, status int, code string) errorAnswer {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("status = %d, want %d; body %s", rec.Code, status, rec.Body)
	}
	var e errorAnswer
	decodeStrict(t, rec, &e)
	if e.Error.Code != code {
		t.Fatalf("code = %q, want %q; body %s", e.Error.Code, code, rec.Body)
	}
	if e.Error.Message == "" || e.Error.Retryable == nil || e.Error.Details == nil {
		t.Fatalf("error lacks message, retryable or details: %s", rec.Body)
	}
	if Codes[code] != status {
		t.Fatalf("code %s is mapped to %d in Codes, answered with %d", code, Codes[code], status)
	}
	if cc := rec.Header().Get("Cache-Control"); cc != "no-store" {
		t.Fatalf("Cache-Control = %q, want no-store on an error answer", cc)
	}
	return e
}

func leasePath(sid string) string { return "/v1/sessions/" + sid + "/lease" }
