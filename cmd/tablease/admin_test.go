package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tablease/tablease/api"
	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/lease/leasemem"
)

// recordingAdmin is a lease.Admin that answers what the test set and records what it was asked:
// the CLI tests check the command line and its output against the real HTTP API, not the engines.
type recordingAdmin struct {
	mu        sync.Mutex // protects the fields below
	lists     []lease.ListQuery
	revokes   []lease.RevokeRequest
	audits    []lease.AuditQuery
	leasePage lease.LeasePage
	revokeRes lease.RevokeResult
	revokeErr error
	auditPage lease.AuditPage
}

func (r *recordingAdmin) ListLeases(_ context.Context, q lease.ListQuery) (lease.LeasePage, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lists = append(r.lists, q)
	return r.leasePage, nil
}

func (r *recordingAdmin) Revoke(_ context.Context, req lease.RevokeRequest) (lease.RevokeResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.revokes = append(r.revokes, req)
	return r.revokeRes, r.revokeErr
}

func (r *recordingAdmin) RecordCatalog(context.Context, string, string) error { return nil }

func (r *recordingAdmin) Audit(_ context.Context, q lease.AuditQuery) (lease.AuditPage, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.audits = append(r.audits, q)
	return r.auditPage, nil
}

var cliAuth = api.AuthConfig{HS256Secret: []byte(testSecret), Issuer: "cli-idp", Audience: "tablease"}

type cliEnv struct {
	t      *testing.T
	url    string
	admin  *recordingAdmin
	engine *leasemem.Engine
	token  string // an admin token
}

func newCLIEnv(t *testing.T) *cliEnv {
	t.Helper()
	eng, err := leasemem.New(leasemem.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close() })
	ra := &recordingAdmin{}
	// The memory engine, whose admin operations are ra's.
	engine := struct {
		lease.Engine
		lease.Feed
		lease.Presence
		lease.Admin
	}{eng, eng, eng, ra}
	srv, err := api.New(api.Options{
		Engine:    engine,
		Auth:      cliAuth,
		Documents: leasemem.NewDocumentStore(nil),
		Nonces:    leasemem.NewNonceStore(nil),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return &cliEnv{t: t, url: hs.URL, admin: ra, engine: eng, token: mintToken(t, "root", api.ScopeAdmin)}
}

func mintToken(t *testing.T, sub string, scopes ...string) string {
	t.Helper()
	tok, err := api.IssueToken(cliAuth, api.TokenSpec{Sub: sub, Scopes: scopes, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// run runs `tablease admin args…` with TABLEASE_URL pointing at the test server.
func (e *cliEnv) run(t *testing.T, token string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	env := map[string]string{"TABLEASE_URL": e.url, "TABLEASE_TOKEN": token}
	p := Program{Stdout: &out, Stderr: &errb, Getenv: func(k string) string { return env[k] }}
	code = p.Main(context.Background(), append([]string{"admin"}, args...))
	if strings.Contains(out.String()+errb.String(), token) && token != "" {
		t.Fatalf("the token was printed:\n%s%s", out.String(), errb.String())
	}
	return code, out.String(), errb.String()
}

func TestAdminLeasesPrintsATableOrTheJSON(t *testing.T) {
	e := newCLIEnv(t)
	now := time.Now()
	e.admin.leasePage = lease.LeasePage{Leases: []lease.Lease{{
		Key: lease.Key{User: "alice", Session: "doc-1"}, Held: true,
		Holder: lease.Holder{TabID: "tab-a", Label: "Events\x1b[31m — /events/1", Hidden: true}, Epoch: 1764680400123456,
		GrantedAt: now, ExpiresAt: now.Add(41200 * time.Millisecond), TTL: 45 * time.Second, Now: now,
	}}, Next: "alice|doc-1"}

	code, out, errOut := e.run(t, e.token, "leases", "--sub", "alice", "--limit", "20", "--url", e.url)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"USER", "SESSION", "HOLDER", "alice", "doc-1", "tab-a (hidden)", "1764680400123456", "41.2s",
		"more: tablease admin leases --limit '20' --sub 'alice' --url '" + e.url + "' --cursor 'alice|doc-1'"} { // the next page as this one was asked
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\x1b") {
		t.Errorf("a control character from the server reached the terminal: %q", out)
	}
	if got := e.admin.lists[0]; got != (lease.ListQuery{User: "alice", Limit: 20}) {
		t.Fatalf("the server was asked %+v", got)
	}

	code, out, _ = e.run(t, e.token, "leases", "--json", "--cursor", "alice|doc-0")
	var page map[string]any
	if code != 0 || json.Unmarshal([]byte(out), &page) != nil || page["nextCursor"] != "alice|doc-1" {
		t.Fatalf("--json prints the answer as it is: exit %d, %q", code, out)
	}
	if got := e.admin.lists[1].Cursor; got != "alice|doc-0" {
		t.Fatalf("cursor sent as %q", got)
	}

	e.admin.mu.Lock()
	e.admin.leasePage = lease.LeasePage{}
	e.admin.mu.Unlock()
	if code, out, _ := e.run(t, e.token, "leases"); code != 0 || !strings.Contains(out, "no active leases") || strings.Contains(out, "more:") {
		t.Fatalf("an empty list: exit %d, %q", code, out)
	}
}

func TestAdminLeaseExitsThreeWhenTheSessionIsFree(t *testing.T) {
	e := newCLIEnv(t)
	l, err := e.engine.Acquire(context.Background(), lease.AcquireRequest{
		Key: lease.Key{User: "a|b", Session: "doc:1"}, Holder: lease.Holder{TabID: "tab-a", Label: "Tab A"}})
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut := e.run(t, e.token, "lease", "--sub", "a|b", "--sid", "doc:1")
	if code != 0 || !strings.Contains(out, "tab-a (visible)") || !strings.Contains(out, "Tab A") ||
		!strings.Contains(out, "held") || !strings.Contains(out, "yes") {
		t.Fatalf("a held lease: exit %d\n%s%s", code, out, errOut)
	}
	if !strings.Contains(out, strings.TrimSpace(jsonInt(l.Epoch))) {
		t.Fatalf("the epoch is missing:\n%s", out)
	}
	code, out, _ = e.run(t, e.token, "lease", "--sub", "bob", "--sid", "doc-1")
	if code != 3 || !strings.Contains(out, "no") {
		t.Fatalf("a free lease exits 3: exit %d\n%s", code, out)
	}
	code, out, _ = e.run(t, e.token, "lease", "--sub", "bob", "--sid", "doc-1", "--json")
	if code != 3 || !strings.Contains(out, `"held":false`) {
		t.Fatalf("--json of a free lease: exit %d %q", code, out)
	}
}

// A block in force shows in the table, as it does in --json (blockedUntil).
func TestAdminLeaseShowsABlockInForce(t *testing.T) {
	e := newCLIEnv(t)
	key := lease.Key{User: "alice", Session: "doc-1"}
	if _, err := e.engine.Revoke(context.Background(), lease.RevokeRequest{Key: key, Admin: "root", Reason: "stuck tab", Block: 5 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	l, err := e.engine.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	want := l.BlockedUntil.UTC().Format("2006-01-02T15:04:05.000Z07:00")
	code, out, errOut := e.run(t, e.token, "lease", "--sub", "alice", "--sid", "doc-1")
	if code != 3 || !regexp.MustCompile(`(?m)^grants blocked until +`+regexp.QuoteMeta(want)+`$`).MatchString(out) {
		t.Fatalf("a blocked free session: exit %d, want 3 and its block until %s\n%s%s", code, want, out, errOut)
	}
	code, out, _ = e.run(t, e.token, "lease", "--sub", "bob", "--sid", "doc-1")
	if code != 3 || strings.Contains(out, "blocked") {
		t.Fatalf("a session with no block: exit %d\n%s", code, out)
	}
}

func jsonInt(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

func TestAdminRevoke(t *testing.T) {
	e := newCLIEnv(t)
	until := time.Date(2026, 12, 2, 13, 5, 0, 0, time.UTC)
	e.admin.revokeRes = lease.RevokeResult{Revoked: true, Epoch: 99, BlockedUntil: until, Previous: &lease.Previous{TabID: "tab-a", Epoch: 42}}

	code, out, errOut := e.run(t, e.token, "revoke", "--sub", "alice", "--sid", "doc-1", "--reason", "stuck tab", "--block", "5m")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "revoked alice/doc-1 (held by tab tab-a at epoch 42); new epoch 99") ||
		!strings.Contains(out, "grants blocked until 2026-12-02T13:05:00.000Z") {
		t.Fatalf("output:\n%s", out)
	}
	got := e.admin.revokes[0]
	if got.Key != (lease.Key{User: "alice", Session: "doc-1"}) || got.Admin != "root" || got.Reason != "stuck tab" || got.Block != 5*time.Minute {
		t.Fatalf("the server was asked %+v", got)
	}

	e.admin.mu.Lock()
	e.admin.revokeRes = lease.RevokeResult{Epoch: 99}
	e.admin.mu.Unlock()
	code, out, _ = e.run(t, e.token, "revoke", "--sub", "alice", "--sid", "doc-1", "--reason", "again")
	if code != 3 || !strings.Contains(out, "nothing to revoke: alice/doc-1 is free (last epoch 99)") {
		t.Fatalf("revoking nothing exits 3: exit %d\n%s", code, out)
	}
	if e.admin.revokes[1].Block != 0 {
		t.Fatalf("without --block nothing is blocked: %+v", e.admin.revokes[1])
	}
}

// TestAdminRevokeThatMayHaveTakenEffectPrintsItsRetry: every revoke is sent under a request id;
// when its outcome is unknown (here, replicas that did not confirm it) the CLI prints the command
// that retries it under the same id, which the server answers as the revoke did.
func TestAdminRevokeThatMayHaveTakenEffectPrintsItsRetry(t *testing.T) {
	e := newCLIEnv(t)
	e.admin.revokeErr = &lease.ReplicationError{Op: "revoke", Wanted: 1, Acked: 0}
	code, _, errOut := e.run(t, e.token, "revoke", "--sub", "alice", "--sid", "doc-1", "--reason", "stuck tab", "--block", "5m")
	if code != 1 || !strings.Contains(errOut, "503 STORE_UNAVAILABLE") {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	first := e.admin.revokes[0].RequestID
	if !api.RevokeRequestID(first) {
		t.Fatalf("the revoke was sent under the request id %q, which does not name a revoke", first)
	}
	retry := "tablease admin revoke --block '5m0s' --reason 'stuck tab' --sid 'doc-1' --sub 'alice' --request-id '" + first + "'"
	if !strings.Contains(errOut, retry) {
		t.Fatalf("stderr %q\ndoes not give the retry %q", errOut, retry)
	}

	e.admin.mu.Lock()
	e.admin.revokeErr = nil
	e.admin.revokeRes = lease.RevokeResult{Revoked: true, Epoch: 99}
	e.admin.mu.Unlock()
	if code, _, errOut := e.run(t, e.token, "revoke", "--sub", "alice", "--sid", "doc-1", "--reason", "stuck tab", "--block", "5m0s", "--request-id", first); code != 0 {
		t.Fatalf("the retry: exit %d, stderr %q", code, errOut)
	}
	if got := e.admin.revokes[1].RequestID; got != first {
		t.Fatalf("the retry was sent under %q, want the first revoke's %q", got, first)
	}
	if code, _, _ := e.run(t, e.token, "revoke", "--sub", "alice", "--sid", "doc-1", "--reason", "another"); code != 0 || e.admin.revokes[2].RequestID == first {
		t.Fatalf("a new revoke reused the id %q (exit %d)", first, code)
	}

	t.Run("a refusal is final: no retry is offered", func(t *testing.T) {
		code, _, errOut := e.run(t, mintToken(t, "alice"), "revoke", "--sub", "alice", "--sid", "doc-1", "--reason", "r")
		if code != 1 || strings.Contains(errOut, "--request-id") {
			t.Fatalf("exit %d, stderr %q", code, errOut)
		}
	})
}

func TestAdminAudit(t *testing.T) {
	e := newCLIEnv(t)
	at := time.Date(2026, 12, 2, 13, 0, 0, 0, time.UTC)
	e.admin.auditPage = lease.AuditPage{Records: []lease.AuditRecord{
		{ID: "2", At: at, Key: lease.Key{User: "alice", Session: "doc-1"}, Action: lease.AuditRevoke, Epoch: 99, Admin: "root",
			Previous: &lease.Previous{TabID: "tab-a", Epoch: 42}, Reason: "stuck tab", RequestID: "req-7"},
		{ID: "1", At: at.Add(-time.Minute), Key: lease.Key{User: "alice", Session: "doc-1"}, Action: lease.AuditGrant, Epoch: 42, TabID: "tab-a"},
	}, Next: "1"}
	code, out, errOut := e.run(t, e.token, "audit", "--sub", "alice", "--sid", "doc-1", "--limit", "2")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"TIME", "ACTION", "revoke", "admin root (request req-7)", "tab-a@42", "stuck tab", "grant", "tab tab-a",
		"older: tablease admin audit --limit '2' --sid 'doc-1' --sub 'alice' --cursor '1'"} {
		if !strings.Contains(out, want) {
			t.Errorf("the audit table lacks %q:\n%s", want, out)
		}
	}
	if got := e.admin.audits[0]; got != (lease.AuditQuery{User: "alice", Session: "doc-1", Limit: 2}) {
		t.Fatalf("the server was asked %+v", got)
	}
}

func TestAdminUsageErrorsExitTwoAndSendNothing(t *testing.T) {
	e := newCLIEnv(t)
	tests := []struct {
		name  string
		token string
		args  []string
		want  string
	}{
		{"no command prints the usage", "usage-test-token", nil, "usage: tablease admin"},
		{"an unknown command is refused", "usage-test-token", []string{"frobnicate"}, `unknown command "frobnicate"`},
		{"a missing token is refused", "", []string{"leases"}, "TABLEASE_TOKEN is not set"},
		{"revoke needs a reason", "usage-test-token", []string{"revoke", "--sub", "alice", "--sid", "doc-1"}, "--reason is required"},
		{"a blank reason is refused", "usage-test-token", []string{"revoke", "--sub", "alice", "--sid", "doc-1", "--reason", "  "}, "--reason is required"},
		{"a reason over 200 characters is refused", "usage-test-token", []string{"revoke", "--sub", "alice", "--sid", "doc-1", "--reason", strings.Repeat("r", 201)}, "at most 200"},
		{"a negative block is refused", "usage-test-token", []string{"revoke", "--sub", "alice", "--sid", "doc-1", "--reason", "r", "--block", "-1m"}, "--block"},
		{"a request id the server would replace is refused", "usage-test-token", []string{"revoke", "--sub", "alice", "--sid", "doc-1", "--reason", "r", "--request-id", "a b"}, "--request-id must be"},
		{"revoke needs the session", "usage-test-token", []string{"revoke", "--sub", "alice", "--reason", "r"}, "--sid is required"},
		{"lease needs the user", "usage-test-token", []string{"lease", "--sid", "doc-1"}, "--sub is required"},
		{"a bad user is refused", "usage-test-token", []string{"leases", "--sub", "al ice"}, "--sub may contain only"},
		{"the audit log by session needs the user", "usage-test-token", []string{"audit", "--sid", "doc-1"}, "--sid needs --sub"},
		{"a limit out of range is refused", "usage-test-token", []string{"leases", "--limit", "501"}, "--limit must be from 1 to 500"},
		{"a limit of 0 is refused", "usage-test-token", []string{"audit", "--limit", "0"}, "--limit must be from 1 to 500"},
		{"a stray argument is refused", "usage-test-token", []string{"leases", "alice"}, `unexpected argument "alice"`},
		{"an unknown flag is refused", "usage-test-token", []string{"leases", "--token", "abc"}, "flag provided but not defined"},
		{"a URL that is not http is refused", "usage-test-token", []string{"leases", "--url", "ftp://example.com"}, "--url must be"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, _, errOut := e.run(t, tt.token, tt.args...)
			if code != 2 || !strings.Contains(errOut, tt.want) {
				t.Fatalf("exit %d, want 2, stderr %q, want it to contain %q", code, errOut, tt.want)
			}
		})
	}
	if n := len(e.admin.lists) + len(e.admin.revokes) + len(e.admin.audits); n != 0 {
		t.Fatalf("usage errors reached the server %d times", n)
	}
	if code, out, _ := e.run(t, "usage-test-token", "--help"); code != 0 || !strings.Contains(out, "exit codes") {
		t.Fatalf("--help: exit %d %q", code, out)
	}
	// A command's --help is on stdout, what was asked for; a bad flag is one line on stderr.
	if code, out, errOut := e.run(t, "usage-test-token", "leases", "--help"); code != 0 || !strings.Contains(out, "usage: tablease admin leases") || errOut != "" {
		t.Fatalf("leases --help: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if _, _, errOut := e.run(t, "usage-test-token", "leases", "--bogus"); strings.Count(errOut, "\n") != 1 {
		t.Fatalf("a bad flag wrote %q, want one line", errOut)
	}
}

func TestAdminServerErrorsExitOneWithTheCodeAndMessage(t *testing.T) {
	e := newCLIEnv(t)
	code, _, errOut := e.run(t, mintToken(t, "alice"), "leases")
	if code != 1 || !strings.Contains(errOut, "403 FORBIDDEN: the access token lacks the scope lease:admin") {
		t.Fatalf("a tab's token: exit %d, stderr %q", code, errOut)
	}
	code, _, errOut = e.run(t, "not-a-jwt", "audit")
	if code != 1 || !strings.Contains(errOut, "401 UNAUTHENTICATED") {
		t.Fatalf("a bad token: exit %d, stderr %q", code, errOut)
	}

	t.Run("an unreachable server says where it tried", func(t *testing.T) {
		hs := httptest.NewServer(http.NotFoundHandler())
		url := hs.URL
		hs.Close()
		var out, errb bytes.Buffer
		env := map[string]string{"TABLEASE_TOKEN": e.token}
		p := Program{Stdout: &out, Stderr: &errb, Getenv: func(k string) string { return env[k] }}
		code := p.Main(context.Background(), []string{"admin", "leases", "--url", url, "--timeout", "5s"})
		if code != 1 || !strings.Contains(errb.String(), "cannot reach "+url) {
			t.Fatalf("exit %d, stderr %q", code, errb.String())
		}
	})

	t.Run("a server that does not answer in time is not said to be unreachable", func(t *testing.T) {
		answered := make(chan struct{})
		hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select { // reached, and never answers before the client gives up
			case <-r.Context().Done():
			case <-answered:
			}
		}))
		defer hs.Close()
		defer close(answered)
		var out, errb bytes.Buffer
		env := map[string]string{"TABLEASE_TOKEN": e.token}
		p := Program{Stdout: &out, Stderr: &errb, Getenv: func(k string) string { return env[k] }}
		code := p.Main(context.Background(), []string{"admin", "revoke", "--sub", "a", "--sid", "b", "--reason", "r",
			"--url", hs.URL, "--timeout", "200ms"})
		if code != 1 || !strings.Contains(errb.String(), "no answer from "+hs.URL+" within --timeout (200ms)") ||
			strings.Contains(errb.String(), "cannot reach") || !strings.Contains(errb.String(), "--request-id") {
			t.Fatalf("exit %d, stderr %q; want no answer within --timeout, and the retry", code, errb.String())
		}
	})

	t.Run("something that is not tablease is named as such", func(t *testing.T) {
		hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusBadGateway)
			_, _ = w.Write([]byte("<html>bad gateway</html>"))
		}))
		defer hs.Close()
		var out, errb bytes.Buffer
		env := map[string]string{"TABLEASE_TOKEN": e.token, "TABLEASE_URL": hs.URL}
		p := Program{Stdout: &out, Stderr: &errb, Getenv: func(k string) string { return env[k] }}
		code := p.Main(context.Background(), []string{"admin", "lease", "--sub", "a", "--sid", "b"})
		if code != 1 || !strings.Contains(errb.String(), "502 Bad Gateway without a tablease error") {
			t.Fatalf("exit %d, stderr %q", code, errb.String())
		}
	})
}
