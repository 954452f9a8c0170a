package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tablease/tablease/lease"
)

// fakeAdmin is a lease.Admin that records its calls and answers what the test set. It tests the
// HTTP layer only; the engines' own behaviour is checked by leasetest and the end-to-end tests.
type fakeAdmin struct {
	mu      sync.Mutex // protects everything below
	lists   []lease.ListQuery
	revokes []lease.RevokeRequest
	audits  []lease.AuditQuery

	leasePage lease.LeasePage
	revokeRes lease.RevokeResult
	auditPage lease.AuditPage
	err       error // returned by every call when set
}

func (f *fakeAdmin) ListLeases(_ context.Context, q lease.ListQuery) (lease.LeasePage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lists = append(f.lists, q)
	return f.leasePage, f.err
}

func (f *fakeAdmin) Revoke(_ context.Context, req lease.RevokeRequest) (lease.RevokeResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.revokes = append(f.revokes, req)
	return f.revokeRes, f.err
}

func (f *fakeAdmin) Audit(_ context.Context, q lease.AuditQuery) (lease.AuditPage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.audits = append(f.audits, q)
	return f.auditPage, f.err
}

func (f *fakeAdmin) RecordCatalog(context.Context, string, string) error { return f.err }

func (f *fakeAdmin) calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.lists) + len(f.revokes) + len(f.audits)
}

// newAdminHarness is a harness whose server serves the admin routes from a fakeAdmin.
func newAdminHarness(t *testing.T, mods ...func(*Options)) (*harness, *fakeAdmin) {
	t.Helper()
	fa := &fakeAdmin{}
	h := newHarness(t, append([]func(*Options){func(o *Options) { o.Engine = withAdmin(o.Engine, fa) }}, mods...)...)
	return h, fa
}

// harness.adminToken (in catalog_test.go) makes an access token with the scope lease:admin.

// errSecret stands for an unexpected engine error whose text must never reach a client.
var errSecret = errors.New("s3cr3t internal detail")

const revokePath = "/v1/admin/users/alice/sessions/doc-1/lease/revoke"

func TestAdminRoutesNeedTheAdminScope(t *testing.T) {
	h, fa := newAdminHarness(t)
	routes := []struct{ method, path, body string }{
		{http.MethodGet, "/v1/admin/leases", ""},
		{http.MethodGet, "/v1/admin/users/alice/sessions/doc-1/lease", ""},
		{http.MethodPost, revokePath, `{"reason":"test"}`},
		{http.MethodGet, "/v1/admin/audit", ""},
		{http.MethodGet, "/v1/admin/limits", ""},
	}
	tabToken := h.token("alice")
	otherScope, err := IssueToken(h.auth, TokenSpec{Sub: "bob", Scopes: []string{"lease:read"}, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range routes {
		t.Run(r.method+" "+r.path, func(t *testing.T) {
			rec := h.do(request{method: r.method, path: r.path, body: r.body})
			wantError(t, rec, http.StatusUnauthorized, CodeUnauthenticated)

			rec = h.do(request{method: r.method, path: r.path, body: r.body, token: tabToken})
			e := wantError(t, rec, http.StatusForbidden, CodeForbidden)
			if !strings.Contains(e.Error.Message, ScopeAdmin) {
				t.Fatalf("the message should name the missing scope: %q", e.Error.Message)
			}
			rec = h.do(request{method: r.method, path: r.path, body: r.body, token: otherScope})
			wantError(t, rec, http.StatusForbidden, CodeForbidden)
		})
	}
	if n := fa.calls(); n != 0 {
		t.Fatalf("the engine was called %d times for refused requests", n)
	}
}

type adminLeaseAnswer struct {
	Sub string `json:"sub"`
	leaseAnswer
}

func TestAdminListsLeasesAPageAtATime(t *testing.T) {
	h, fa := newAdminHarness(t)
	now := h.clock.Now()
	fa.leasePage = lease.LeasePage{
		Leases: []lease.Lease{{
			Key: lease.Key{User: "alice", Session: "doc-1"}, Held: true,
			Holder: lease.Holder{TabID: "tab-a", Label: "Events — /events/1"}, Epoch: 1764680400123456,
			GrantedAt: now.Add(-5 * time.Second), ExpiresAt: now.Add(40 * time.Second), TTL: 45 * time.Second,
			Transitions: 2, Now: now,
		}},
		Next: "alice|doc-1",
	}
	tok := h.adminToken("root")
	rec := h.get("/v1/admin/leases?sub=alice&limit=10&cursor=alice|doc-0", tok)
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	var page struct {
		Leases     []adminLeaseAnswer `json:"leases"`
		NextCursor *string            `json:"nextCursor"`
	}
	decodeStrict(t, rec, &page)
	if len(page.Leases) != 1 || page.NextCursor == nil || *page.NextCursor != "alice|doc-1" {
		t.Fatalf("page: %s", rec.Body)
	}
	l := page.Leases[0]
	if l.Sub != "alice" || l.SessionID != "doc-1" || !l.Held || l.Holder == nil || l.Holder.TabID != "tab-a" ||
		l.Epoch != 1764680400123456 || l.RemainingMs != 40000 || l.Role != nil || l.Token != nil {
		t.Fatalf("lease: %s", rec.Body)
	}
	want := lease.ListQuery{User: "alice", Cursor: "alice|doc-0", Limit: 10}
	if len(fa.lists) != 1 || fa.lists[0] != want {
		t.Fatalf("engine asked %+v, want %+v", fa.lists, want)
	}

	t.Run("the last page has a null nextCursor and an empty list is []", func(t *testing.T) {
		fa.mu.Lock()
		fa.leasePage = lease.LeasePage{}
		fa.mu.Unlock()
		rec := h.get("/v1/admin/leases", tok)
		if rec.Code != http.StatusOK || strings.TrimSpace(rec.Body.String()) != `{"leases":[],"nextCursor":null}` {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
		if got := fa.lists[len(fa.lists)-1]; got != (lease.ListQuery{}) {
			t.Fatalf("without parameters the engine gets the zero query (its defaults), got %+v", got)
		}
	})
}

func TestAdminPageParametersAreValidated(t *testing.T) {
	h, fa := newAdminHarness(t)
	tok := h.adminToken("root")
	long := strings.Repeat("c", MaxCursorLen+1)
	tests := []struct {
		name, query, field string
	}{
		{"a sub that is not an identifier is refused", "sub=al%20ice", "sub"},
		{"a sub of dots is refused", "sub=..", "sub"},
		{"a limit of zero is refused", "limit=0", "limit"},
		{"a limit over 500 is refused", "limit=501", "limit"},
		{"a negative limit is refused", "limit=-1", "limit"},
		{"a fractional limit is refused", "limit=1.5", "limit"},
		{"a limit with a leading zero is refused", "limit=010", "limit"},
		{"an empty limit is refused", "limit=", "limit"},
		{"a cursor over 512 characters is refused", "cursor=" + long, "cursor"},
		{"a cursor with a control character is refused", "cursor=a%0Ab", "cursor"},
		{"a parameter given twice is refused", "sub=a&sub=b", "sub"},
		{"a parameter of no route is refused, not ignored", "user=alice", "user"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, route := range []string{"/v1/admin/leases?", "/v1/admin/audit?"} {
				e := wantError(t, h.get(route+tt.query, tok), http.StatusBadRequest, CodeInvalidArgument)
				if e.Error.Details["field"] != tt.field {
					t.Fatalf("%s: details %v, want field %s", route, e.Error.Details, tt.field)
				}
			}
		})
	}
	t.Run("a limit of 500 and a cursor of 512 characters are accepted", func(t *testing.T) {
		rec := h.get("/v1/admin/leases?limit=500&cursor="+long[:MaxCursorLen], tok)
		if rec.Code != http.StatusOK {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
	})
	t.Run("the list of leases has no session filter: sid is refused, not ignored", func(t *testing.T) {
		e := wantError(t, h.get("/v1/admin/leases?sub=alice&sid=doc-1", tok), http.StatusBadRequest, CodeInvalidArgument)
		if e.Error.Details["field"] != "sid" || !strings.Contains(e.Error.Message, "sub, cursor, limit") {
			t.Fatalf("%+v", e.Error)
		}
	})
	t.Run("the audit log by session needs the user", func(t *testing.T) {
		e := wantError(t, h.get("/v1/admin/audit?sid=doc-1", tok), http.StatusBadRequest, CodeInvalidArgument)
		if e.Error.Details["field"] != "sid" {
			t.Fatalf("details %v", e.Error.Details)
		}
	})
	if len(fa.audits) != 0 {
		t.Fatalf("refused requests reached the engine: %+v", fa.audits)
	}
}

func TestAdminReadsTheLeaseOfAnyUser(t *testing.T) {
	h, _ := newAdminHarness(t)
	acq := readLease(t, h.post(leasePath("doc-1"), h.token("alice"), `{"tabId":"tab-a","label":"Tab A"}`))

	rec := h.get("/v1/admin/users/alice/sessions/doc-1/lease", h.adminToken("root"))
	if rec.Code != http.StatusOK {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	var l adminLeaseAnswer
	decodeStrict(t, rec, &l)
	if l.Sub != "alice" || l.SessionID != "doc-1" || !l.Held || l.Holder.TabID != "tab-a" || l.Epoch != acq.Epoch ||
		l.Role != nil || l.Token != nil {
		t.Fatalf("admin read: %s", rec.Body)
	}

	rec = h.get("/v1/admin/users/bob/sessions/doc-1/lease", h.adminToken("root"))
	decodeStrict(t, rec, &l)
	if l.Sub != "bob" || l.Held || l.Epoch != 0 {
		t.Fatalf("bob's doc-1 is another, free lease: %s", rec.Body)
	}

	t.Run("identifiers may come percent-encoded", func(t *testing.T) {
		rec := h.get("/v1/admin/users/a%7Cb%40idp/sessions/doc%3A1/lease", h.adminToken("root"))
		decodeStrict(t, rec, &l)
		if rec.Code != http.StatusOK || l.Sub != "a|b@idp" || l.SessionID != "doc:1" {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
	})

	for _, p := range []string{
		"/v1/admin/users/al%20ice/sessions/doc-1/lease",
		"/v1/admin/users/a%2Fb/sessions/doc-1/lease",
		"/v1/admin/users/alice/sessions/%2E%2E/lease",
		"/v1/admin/users/" + strings.Repeat("a", 129) + "/sessions/doc-1/lease",
	} {
		wantError(t, h.get(p, h.adminToken("root")), http.StatusBadRequest, CodeInvalidArgument)
	}
}

func TestAdminRevoke(t *testing.T) {
	h, fa := newAdminHarness(t, func(o *Options) { o.MaxBlock = 10 * time.Minute })
	until := h.clock.Now().Add(5 * time.Minute)
	fa.revokeRes = lease.RevokeResult{Revoked: true, Epoch: 1764680400999999, BlockedUntil: until,
		Previous: &lease.Previous{TabID: "tab-a", Epoch: 1764680400123456}}
	tok := h.adminToken("root")

	rec := h.do(request{method: http.MethodPost, path: revokePath, token: tok,
		body:    `{"reason":"stuck tab — user asked","blockMs":300000}`,
		headers: map[string]string{"X-Request-ID": "retry-1"}})
	if rec.Code != http.StatusOK {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	var out struct {
		Revoked      bool    `json:"revoked"`
		Epoch        int64   `json:"epoch"`
		BlockedUntil *string `json:"blockedUntil"`
		Previous     *struct {
			TabID string `json:"tabId"`
			Epoch int64  `json:"epoch"`
		} `json:"previous"`
	}
	decodeStrict(t, rec, &out)
	if !out.Revoked || out.Epoch != 1764680400999999 || out.BlockedUntil == nil ||
		*out.BlockedUntil != until.UTC().Format(timeLayout) || out.Previous == nil || out.Previous.TabID != "tab-a" {
		t.Fatalf("answer: %s", rec.Body)
	}
	want := lease.RevokeRequest{Key: lease.Key{User: "alice", Session: "doc-1"}, Admin: "root",
		Reason: "stuck tab — user asked", Block: 5 * time.Minute, RequestID: "retry-1", AuditRequestID: "retry-1"}
	if len(fa.revokes) != 1 || fa.revokes[0] != want {
		t.Fatalf("engine asked %+v, want %+v", fa.revokes, want)
	}
	// The log says what the revoke did, beside the request line that says only who posted.
	logged := h.logs.String()
	for _, want := range []string{`"msg":"lease revoked"`, `"request_id":"retry-1"`, `"sub":"root"`, `"user":"alice"`,
		`"session":"doc-1"`, `"reason":"stuck tab — user asked"`, `"revoked":true`, `"previous_tab":"tab-a"`,
		`"previous_epoch":1764680400123456`, `"blocked_until":"` + until.UTC().Format(timeLayout) + `"`} {
		if !strings.Contains(logged, want) {
			t.Errorf("the log lacks %s:\n%s", want, logged)
		}
	}

	t.Run("revoking nothing answers revoked false with nulls", func(t *testing.T) {
		fa.mu.Lock()
		fa.revokeRes = lease.RevokeResult{Epoch: 42}
		fa.mu.Unlock()
		rec := h.post(revokePath, tok, `{"reason":"cleanup"}`)
		if rec.Code != http.StatusOK ||
			strings.TrimSpace(rec.Body.String()) != `{"revoked":false,"epoch":42,"blockedUntil":null,"previous":null}` {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
		if got := fa.revokes[len(fa.revokes)-1]; got.Block != 0 || got.RequestID != "" {
			t.Fatalf("without blockMs nothing is blocked, and without X-Request-ID no request id is passed (the one the server makes up cannot be retried): %+v", got)
		}
		if !strings.Contains(h.logs.String(), `"msg":"revoke found no lease to end"`) {
			t.Errorf("the log does not say the revoke ended nothing:\n%s", h.logs.String())
		}
	})

	t.Run("a retry under the same request id is answered as the first, and logged as a retry", func(t *testing.T) {
		fa.mu.Lock()
		fa.revokeRes = lease.RevokeResult{Revoked: true, Epoch: 43, Previous: &lease.Previous{TabID: "tab-a", Epoch: 41}, Retried: true}
		fa.mu.Unlock()
		rec := h.do(request{method: http.MethodPost, path: revokePath, token: tok, body: `{"reason":"stuck"}`, headers: map[string]string{"X-Request-ID": "retry-2"}})
		if rec.Code != http.StatusOK ||
			strings.TrimSpace(rec.Body.String()) != `{"revoked":true,"epoch":43,"blockedUntil":null,"previous":{"tabId":"tab-a","epoch":41}}` {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
		if line := lineWithText(h.logs.String(), `"request_id":"retry-2","sub"`); !strings.Contains(line, `"msg":"revoke retried, answered as the first (lease revoked), and did nothing more"`) {
			t.Errorf("the retry is not logged as one: %q", line)
		}
	})

	t.Run("the largest block is accepted", func(t *testing.T) {
		rec := h.post(revokePath, tok, `{"reason":"r","blockMs":600000}`)
		if rec.Code != http.StatusOK {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
	})
}

func TestAdminRevokeValidatesItsBody(t *testing.T) {
	h, fa := newAdminHarness(t, func(o *Options) { o.MaxBlock = time.Hour })
	tok := h.adminToken("root")
	tests := []struct {
		name, path, body, field string
	}{
		{"a missing reason is refused", revokePath, `{}`, "reason"},
		{"a null reason is refused", revokePath, `{"reason":null}`, "reason"},
		{"a blank reason is refused", revokePath, `{"reason":"   "}`, "reason"},
		{"a reason over 200 characters is refused", revokePath, `{"reason":"` + strings.Repeat("é", 201) + `"}`, "reason"},
		{"a reason with a control character is refused", revokePath, `{"reason":"a\nb"}`, "reason"},
		{"a reason that is not a string is refused", revokePath, `{"reason":5}`, "reason"},
		{"a negative blockMs is refused", revokePath, `{"reason":"r","blockMs":-1}`, "blockMs"},
		{"a blockMs over the configured maximum is refused", revokePath, `{"reason":"r","blockMs":3600001}`, "blockMs"},
		{"a fractional blockMs is refused", revokePath, `{"reason":"r","blockMs":1.5}`, "blockMs"},
		{"a blockMs in a string is refused", revokePath, `{"reason":"r","blockMs":"60000"}`, "blockMs"},
		{"an unknown field is refused", revokePath, `{"reason":"r","until":"tomorrow"}`, ""},
		{"a bad user in the path is refused", "/v1/admin/users/a%2Fb/sessions/doc-1/lease/revoke", `{"reason":"r"}`, "sub"},
		{"a bad session in the path is refused", "/v1/admin/users/alice/sessions/%2E/lease/revoke", `{"reason":"r"}`, "sessionId"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := wantError(t, h.post(tt.path, tok, tt.body), http.StatusBadRequest, CodeInvalidArgument)
			if tt.field != "" && e.Error.Details["field"] != tt.field {
				t.Fatalf("details %v, want field %s", e.Error.Details, tt.field)
			}
		})
	}
	t.Run("a body that is not JSON is refused", func(t *testing.T) {
		rec := h.do(request{method: http.MethodPost, path: revokePath, token: tok, headers: map[string]string{"Content-Type": "text/plain"}})
		wantError(t, rec, http.StatusBadRequest, CodeInvalidArgument)
	})
	if n := fa.calls(); n != 0 {
		t.Fatalf("refused requests reached the engine %d times", n)
	}
	t.Run("a reason of exactly 200 characters is accepted", func(t *testing.T) {
		rec := h.post(revokePath, tok, `{"reason":"`+strings.Repeat("é", 200)+`"}`)
		if rec.Code != http.StatusOK {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
	})
}

// A revoke's X-Request-ID is its retry key: one the server would replace by an id of its own
// would make the retry another revoke, so it is refused, where other routes replace it.
func TestAdminRevokeRefusesARequestIDItDoesNotKeep(t *testing.T) {
	h, fa := newAdminHarness(t)
	tok := h.adminToken("root")
	for _, id := range []string{"", "root@idp", "a/b", "{retry}", "a b", ".", "..", strings.Repeat("r", 129), strings.Repeat("r", 200)} {
		t.Run(fmt.Sprintf("%.20q", id), func(t *testing.T) {
			rec := h.do(request{method: http.MethodPost, path: revokePath, token: tok, body: `{"reason":"r"}`,
				headers: map[string]string{"X-Request-ID": id}})
			e := wantError(t, rec, http.StatusBadRequest, CodeInvalidArgument)
			if e.Error.Details["field"] != "X-Request-ID" || !strings.Contains(e.Error.Message, "1–128 characters of A-Z a-z 0-9 . _ : -") {
				t.Fatalf("%s: want details.field X-Request-ID and the rule", rec.Body)
			}
		})
	}
	// Two, each good alone: which one names the revoke would be a guess.
	rec := h.do(request{method: http.MethodPost, path: revokePath, token: tok, body: `{"reason":"r"}`,
		also: http.Header{"X-Request-Id": {"retry-a", "retry-b"}}})
	if e := wantError(t, rec, http.StatusBadRequest, CodeInvalidArgument); e.Error.Details["field"] != "X-Request-ID" || !strings.Contains(e.Error.Message, "sent once") {
		t.Fatalf("two X-Request-ID headers: %s", rec.Body)
	}
	if n := fa.calls(); n != 0 {
		t.Fatalf("refused revokes reached the engine %d times", n)
	}
	// Elsewhere an unusable id is replaced by one the server makes up.
	rec = h.do(request{method: http.MethodGet, path: "/v1/admin/users/alice/sessions/doc-1/lease", token: tok,
		headers: map[string]string{"X-Request-ID": "root@idp"}})
	if got := rec.Header().Get("X-Request-ID"); rec.Code != http.StatusOK || got == "root@idp" || len(got) != 32 {
		t.Fatalf("%d, X-Request-ID %q: %s", rec.Code, got, rec.Body)
	}
	rec = h.do(request{method: http.MethodPost, path: revokePath, token: tok, body: `{"reason":"r"}`,
		headers: map[string]string{"X-Request-ID": strings.Repeat("r", 128)}})
	if rec.Code != http.StatusOK || len(fa.revokes) != 1 || fa.revokes[0].RequestID != strings.Repeat("r", 128) {
		t.Fatalf("an id of 128 characters names the revoke: %d %s %+v", rec.Code, rec.Body, fa.revokes)
	}
}

func TestAdminErrorsGoThroughTheOneTable(t *testing.T) {
	h, fa := newAdminHarness(t)
	tok := h.adminToken("root")
	tests := []struct {
		name   string
		err    error
		status int
		code   string
	}{
		{"store trouble is 503 and retryable", &lease.UnavailableError{Op: "revoke", Err: context.DeadlineExceeded}, http.StatusServiceUnavailable, CodeStoreUnavailable},
		{"a cursor the engine did not make is 400", &lease.InvalidError{Field: "cursor", Reason: "is not a cursor of this list"}, http.StatusBadRequest, CodeInvalidArgument},
		{"an unexpected error is a 500 that says nothing internal", errSecret, http.StatusInternalServerError, CodeInternal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fa.mu.Lock()
			fa.err = tt.err
			fa.mu.Unlock()
			for _, rec := range []*httptest.ResponseRecorder{
				h.get("/v1/admin/leases", tok),
				h.post(revokePath, tok, `{"reason":"r"}`),
				h.get("/v1/admin/audit", tok),
			} {
				e := wantError(t, rec, tt.status, tt.code)
				if strings.Contains(rec.Body.String(), "s3cr3t") {
					t.Fatalf("the internal error leaked: %s", rec.Body)
				}
				if tt.code == CodeStoreUnavailable && (rec.Header().Get("Retry-After") == "" || !*e.Error.Retryable) {
					t.Fatalf("503 without Retry-After or retryable: %v %s", rec.Header(), rec.Body)
				}
			}
		})
	}
}

func TestARevokeTooFewReplicasConfirmedSaysSoAndHowToRetry(t *testing.T) {
	h, fa := newAdminHarness(t)
	fa.mu.Lock()
	fa.err = &lease.ReplicationError{Op: "revoke", Wanted: 2, Acked: 1,
		Revoke: &lease.RevokeResult{Revoked: true, Epoch: 20, Previous: &lease.Previous{TabID: "tab-a", Epoch: 10}}}
	fa.mu.Unlock()
	rec := h.post(revokePath, h.adminToken("root"), `{"reason":"r"}`)
	e := wantError(t, rec, http.StatusServiceUnavailable, CodeStoreUnavailable)
	if rec.Header().Get("Retry-After") == "" || !*e.Error.Retryable {
		t.Fatalf("503 without Retry-After or retryable: %v %s", rec.Header(), rec.Body)
	}
	if e.Error.Details["replicas"] != float64(1) || e.Error.Details["wanted"] != float64(2) {
		t.Fatalf("details = %v, want replicas 1 and wanted 2", e.Error.Details)
	}
	if !strings.Contains(e.Error.Message, "took effect") || !strings.Contains(e.Error.Message, "X-Request-ID") {
		t.Fatalf("the message does not say the revoke took effect and how to retry it: %q", e.Error.Message)
	}
	// It took effect on the primary: the log says what it did, as a warning that says why.
	logged := h.logs.String()
	for _, want := range []string{`"level":"WARN","msg":"lease revoked, on the primary only`, `"user":"alice"`,
		`"previous_tab":"tab-a"`, `"epoch":20`, `"replicas":1`, `"wanted":2`} {
		if !strings.Contains(logged, want) {
			t.Errorf("the log lacks %s:\n%s", want, logged)
		}
	}
	// Redis answered: no outage of the store, though the revoke is counted as a store error.
	if strings.Contains(logged, "store calls fail") {
		t.Errorf("a revoke too few replicas confirmed opened a store outage:\n%s", logged)
	}
	if m := h.get("/metrics", "").Body.String(); !strings.Contains(m, `tablease_store_errors_total{op="admin_revoke"} 1`) {
		t.Errorf("the revoke is not counted as a store error")
	}
}

func TestAdminAuditLog(t *testing.T) {
	h, fa := newAdminHarness(t)
	at := h.clock.Now()
	fa.auditPage = lease.AuditPage{
		Records: []lease.AuditRecord{
			{ID: "r2", At: at, Key: lease.Key{User: "alice", Session: "doc-1"}, Action: lease.AuditRevoke, Epoch: 20,
				Admin: "root", Previous: &lease.Previous{TabID: "tab-a", Epoch: 10}, Reason: "stuck", Until: at.Add(time.Minute), RequestID: "req-9"},
			{ID: "r1", At: at.Add(-time.Second), Key: lease.Key{User: "alice", Session: "doc-1"}, Action: lease.AuditGrant,
				Epoch: 10, TabID: "tab-a"},
		},
		Next: "r1",
	}
	rec := h.get("/v1/admin/audit?sub=alice&sid=doc-1&limit=2&cursor=r3", h.adminToken("root"))
	if rec.Code != http.StatusOK {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	want := `{"records":[` +
		`{"id":"r2","at":"2026-12-02T13:00:00.123Z","sub":"alice","sessionId":"doc-1","action":"revoke","epoch":20,"tabId":null,"admin":"root","previous":{"tabId":"tab-a","epoch":10},"reason":"stuck","until":"2026-12-02T13:01:00.123Z","requestId":"req-9"},` +
		`{"id":"r1","at":"2026-12-02T13:00:00.123Z","sub":"alice","sessionId":"doc-1","action":"grant","epoch":10,"tabId":"tab-a","admin":null,"previous":null,"reason":null,"until":null,"requestId":null}` +
		`],"nextCursor":"r1"}`
	want = strings.Replace(want, `"at":"2026-12-02T13:00:00.123Z","sub":"alice","sessionId":"doc-1","action":"grant"`,
		`"at":"2026-12-02T12:59:59.123Z","sub":"alice","sessionId":"doc-1","action":"grant"`, 1)
	if got := strings.TrimSpace(rec.Body.String()); got != want {
		t.Fatalf("audit page:\n got %s\nwant %s", got, want)
	}
	wantQ := lease.AuditQuery{User: "alice", Session: "doc-1", Cursor: "r3", Limit: 2}
	if len(fa.audits) != 1 || fa.audits[0] != wantQ {
		t.Fatalf("engine asked %+v, want %+v", fa.audits, wantQ)
	}
}

func TestNewChecksMaxBlock(t *testing.T) {
	h := newHarness(t)
	for _, d := range []time.Duration{-time.Second, time.Microsecond} {
		o := Options{Engine: h.engine, Auth: testAuthConfig(), MaxBlock: d}
		memoryStores(&o)
		if _, err := New(o); err == nil || !strings.Contains(err.Error(), "MaxBlock") {
			t.Fatalf("MaxBlock %s: err %v, want one naming MaxBlock", d, err)
		}
	}
}

func TestLeaseAnswersShowTheBlockInForce(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.MaxBlock = time.Hour })
	alice, root := h.token("alice"), h.adminToken("root")
	readLease(t, h.post(leasePath("doc-1"), alice, `{"tabId":"tab-a"}`))
	adminPath := "/v1/admin/users/alice/sessions/doc-1/lease"
	if a := readLease(t, h.get(leasePath("doc-1"), alice)); a.BlockedUntil != nil {
		t.Fatalf("a lease never blocked answered blockedUntil %q, want null", *a.BlockedUntil)
	}

	rec := h.post(revokePath, root, `{"reason":"cool down","blockMs":60000}`)
	if rec.Code != http.StatusOK {
		t.Fatalf("revoke: %d %s", rec.Code, rec.Body)
	}
	var res struct {
		Revoked      bool    `json:"revoked"`
		Epoch        int64   `json:"epoch"`
		BlockedUntil *string `json:"blockedUntil"`
		Previous     any     `json:"previous"`
	}
	decodeStrict(t, rec, &res)
	want := h.clock.Now().Add(time.Minute).UTC().Format(timeLayout)
	if res.BlockedUntil == nil || *res.BlockedUntil != want {
		t.Fatalf("the revoke answered %s, want blockedUntil %s", rec.Body, want)
	}
	l := readLease(t, h.get(leasePath("doc-1")+"?tabId=tab-b", alice))
	if l.Held || l.BlockedUntil == nil || *l.BlockedUntil != want {
		t.Fatalf("the tab's lease during the block = %+v, want free with blockedUntil %s", l, want)
	}
	var adm adminLeaseAnswer
	decodeStrict(t, h.get(adminPath, root), &adm)
	if adm.BlockedUntil == nil || *adm.BlockedUntil != want {
		t.Fatalf("the admin lease during the block = %+v, want blockedUntil %s", adm, want)
	}

	h.clock.Advance(time.Minute)
	if l := readLease(t, h.get(leasePath("doc-1"), alice)); l.BlockedUntil != nil {
		t.Fatalf("the tab's lease once the block passed answered blockedUntil %q, want null", *l.BlockedUntil)
	}
	rec = h.get(adminPath, root)
	adm = adminLeaseAnswer{}
	decodeStrict(t, rec, &adm)
	if adm.BlockedUntil != nil || !strings.Contains(rec.Body.String(), `"blockedUntil":null`) {
		t.Fatalf("the admin lease once the block passed = %s, want blockedUntil null", rec.Body)
	}
}

// TestAdminLimitsAnswerTheConfiguredMaximumBlock: what a console needs to offer no block longer
// than the server allows, and the revoke's bound agrees with it.
func TestAdminLimitsAnswerTheConfiguredMaximumBlock(t *testing.T) {
	for _, tt := range []struct {
		max  time.Duration
		want int64
	}{{0, DefaultMaxBlock.Milliseconds()}, {10 * time.Minute, 600000}} {
		h, _ := newAdminHarness(t, func(o *Options) { o.MaxBlock = tt.max })
		tok := h.adminToken("root")
		rec := h.get("/v1/admin/limits", tok)
		var got struct {
			MaxBlockMs *int64 `json:"maxBlockMs"`
		}
		if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &got) != nil || got.MaxBlockMs == nil || *got.MaxBlockMs != tt.want {
			t.Fatalf("MaxBlock %v: GET /v1/admin/limits = %d %s, want maxBlockMs %d", tt.max, rec.Code, rec.Body, tt.want)
		}
		over := fmt.Sprintf(`{"reason":"r","blockMs":%d}`, tt.want+1)
		wantError(t, h.post(revokePath, tok, over), http.StatusBadRequest, CodeInvalidArgument)
	}
}

// lineWithText is the first line of logs that holds s, or "".
func lineWithText(logs, s string) string {
	for line := range strings.Lines(logs) {
		if strings.Contains(line, s) {
			return line
		}
	}
	return ""
}
