package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tablease/tablease/api"
	"github.com/tablease/tablease/lease/leasemem"
	"github.com/tablease/tablease/owner/leasetoken"
)

const (
	secret      = "eventsapp-test-secret-0123456789abcdef"
	idp         = "https://idp.example.test"
	audience    = "tablease"
	leaseIssuer = "tablease-example"
)

// world is a tablease server (memory engine, its own signing key) and the events app in front of
// it, both on real HTTP listeners.
type world struct {
	t        *testing.T
	tablease string // base URL
	app      string // base URL
	access   string // alice's access token, accepted by both
}

func newWorld(t *testing.T, strict bool) *world {
	t.Helper()
	auth := api.AuthConfig{HS256Secret: []byte(secret), Issuer: idp, Audience: audience}
	return newWorldWith(t, auth, leaseIssuer, false, func(tableaseURL string) Options {
		return Options{
			TableaseURL: tableaseURL, LeaseIssuer: leaseIssuer, Strict: strict,
			AccessSecret: []byte(secret), AccessIssuer: idp, AccessAudience: audience,
		}
	})
}

// newWorldWith is newWorld with tablease's access-token settings, lease issuer and dev mode, and
// the app's options for the URL tablease listens on.
func newWorldWith(t *testing.T, auth api.AuthConfig, leaseIssuer string, dev bool, appOpts func(tableaseURL string) Options) *world {
	t.Helper()
	eng, err := leasemem.New(leasemem.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close() })
	key, err := leasetoken.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	keys, err := leasetoken.NewKeySet(key, leasetoken.KeySetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := api.New(api.Options{
		Engine:      eng,
		Auth:        auth,
		LeaseKeys:   keys,
		LeaseIssuer: leaseIssuer,
		Dev:         dev,
		Documents:   leasemem.NewDocumentStore(nil),
		Nonces:      leasemem.NewNonceStore(nil),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)

	app, err := newApp(appOpts(ts.URL))
	if err != nil {
		t.Fatal(err)
	}
	as := httptest.NewServer(app)
	t.Cleanup(as.Close)

	access, err := api.IssueToken(auth, api.TokenSpec{Sub: "alice", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return &world{t: t, tablease: ts.URL, app: as.URL, access: access}
}

// call sends a JSON request with alice's access token (and a lease token when given) and decodes
// the JSON answer.
func (w *world) call(method, url, leaseToken string, body any) (int, map[string]any) {
	w.t.Helper()
	var rd *bytes.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		w.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+w.access)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if leaseToken != "" {
		req.Header.Set("Tablease-Lease", leaseToken)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		w.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		w.t.Fatalf("%s %s: the answer is not JSON: %v", method, url, err)
	}
	return resp.StatusCode, out
}

// acquire takes the lease of doc-1 for tab and returns its token and epoch.
func (w *world) acquire(tab, mode string) (string, int64) {
	w.t.Helper()
	code, l := w.call("POST", w.tablease+"/v1/sessions/doc-1/lease", "", map[string]any{"tabId": tab, "mode": mode})
	tok, _ := l["token"].(string)
	epoch, _ := l["epoch"].(float64)
	if code != 200 || tok == "" {
		w.t.Fatalf("%s acquires: %d %v", tab, code, l)
	}
	return tok, int64(epoch)
}

func (w *world) rename(leaseToken, name string) (int, map[string]any) {
	w.t.Helper()
	return w.call("POST", w.app+"/api/sessions/doc-1/events/evt-1/rename", leaseToken, map[string]any{"name": name})
}

func errorCode(body map[string]any) (string, map[string]any) {
	e, _ := body["error"].(map[string]any)
	code, _ := e["code"].(string)
	details, _ := e["details"].(map[string]any)
	return code, details
}

func wantRefused(t *testing.T, status int, body map[string]any, wantStatus int, wantCode string) map[string]any {
	t.Helper()
	code, details := errorCode(body)
	if status != wantStatus || code != wantCode {
		t.Fatalf("answered %d %v, want %d %s", status, body, wantStatus, wantCode)
	}
	return details
}

func TestTheBackendRefusesAWriteFromATabWhoseLeaseWasTakenOver(t *testing.T) {
	for _, strict := range []bool{true, false} {
		t.Run(fmt.Sprintf("strict=%v", strict), func(t *testing.T) {
			w := newWorld(t, strict)
			tokA, epochA := w.acquire("tab-a", "try")

			// Tab A writes with its token.
			code, ev := w.call("PUT", w.app+"/api/sessions/doc-1/events/evt-1", tokA, map[string]any{"name": "Go meetup", "date": "2026-12-02"})
			if code != 200 || ev["leaseEpoch"] != float64(epochA) {
				t.Fatalf("A saves: %d %v", code, ev)
			}
			if code, ev := w.rename(tokA, "Go meetup (moved)"); code != 200 || ev["name"] != "Go meetup (moved)" {
				t.Fatalf("A renames: %d %v", code, ev)
			}
			// Reading needs no lease.
			if code, list := w.call("GET", w.app+"/api/sessions/doc-1/events", "", nil); code != 200 || len(list["events"].([]any)) != 1 {
				t.Fatalf("list: %d %v", code, list)
			}

			// Tab B takes over.
			tokB, epochB := w.acquire("tab-b", "takeover")
			if epochB <= epochA {
				t.Fatalf("takeover epoch %d <= %d", epochB, epochA)
			}

			if strict {
				// The guard asks tablease: A's epoch is no longer current.
				code, body := w.rename(tokA, "stale write")
				details := wantRefused(t, code, body, http.StatusConflict, "LEASE_LOST")
				if details["tokenEpoch"] != float64(epochA) || details["epoch"] != float64(epochB) {
					t.Fatalf("LEASE_LOST details %v", details)
				}
			} else {
				// Offline, the guard cannot know yet (the window docs/fencing.md describes): A's
				// token is genuine and unexpired, and nobody newer has written evt-1.
				if code, body := w.rename(tokA, "write in the window"); code != 200 {
					t.Fatalf("A's write before B wrote: %d %v", code, body)
				}
			}

			// B writes: a higher epoch always passes the fence.
			if code, ev := w.rename(tokB, "B's name"); code != 200 || ev["leaseEpoch"] != float64(epochB) {
				t.Fatalf("B renames: %d %v", code, ev)
			}

			// Now A's stale write is refused in both modes: by tablease in strict mode, by the fence
			// offline, which has seen B's higher epoch.
			code, body := w.rename(tokA, "stale write")
			details := wantRefused(t, code, body, http.StatusConflict, "LEASE_LOST")
			if !strict && (details["resource"] != "evt-1" || details["resourceEpoch"] != float64(epochB) || details["tokenEpoch"] != float64(epochA)) {
				t.Fatalf("fence details %v", details)
			}
			code, body = w.call("PUT", w.app+"/api/sessions/doc-1/events/evt-1", tokA, map[string]any{"name": "stale save"})
			wantRefused(t, code, body, http.StatusConflict, "LEASE_LOST")
			if _, ev := w.call("GET", w.app+"/api/sessions/doc-1/events/evt-1", "", nil); ev["name"] != "B's name" {
				t.Fatalf("a refused write changed the event: %v", ev)
			}

			// B keeps writing.
			if code, body := w.rename(tokB, "B again"); code != 200 {
				t.Fatalf("B renames again: %d %v", code, body)
			}
		})
	}
}

func TestTheBackendRefusesWritesWithoutAProofForThisSession(t *testing.T) {
	w := newWorld(t, false)
	tokA, _ := w.acquire("tab-a", "try")
	url := w.app + "/api/sessions/doc-1/events/evt-1"

	code, body := w.call("PUT", url, "", map[string]any{"name": "x"})
	if d := wantRefused(t, code, body, http.StatusForbidden, "NOT_LEASE_OWNER"); d["reason"] != "missing_token" {
		t.Fatalf("details %v", d)
	}
	code, body = w.call("PUT", w.app+"/api/sessions/doc-2/events/evt-1", tokA, map[string]any{"name": "x"})
	if d := wantRefused(t, code, body, http.StatusForbidden, "NOT_LEASE_OWNER"); d["reason"] != "wrong_session" {
		t.Fatalf("details %v", d)
	}
	code, body = w.call("PUT", url, tokA[:len(tokA)-4]+"AAAA", map[string]any{"name": "x"})
	if d := wantRefused(t, code, body, http.StatusForbidden, "NOT_LEASE_OWNER"); d["reason"] != "invalid_token" {
		t.Fatalf("details %v", d)
	}
	code, body = w.call("POST", w.app+"/api/sessions/doc-1/events/nope/rename", tokA, map[string]any{"name": "x"})
	wantRefused(t, code, body, http.StatusNotFound, "NOT_FOUND")

	w.access = "not-a-token"
	code, body = w.call("GET", url, "", nil)
	wantRefused(t, code, body, http.StatusUnauthorized, "UNAUTHENTICATED")
}

func TestTheFenceKeepsTheHighestEpochPerEvent(t *testing.T) {
	tbl := newEventTable()
	k := rowKey{user: "alice", session: "doc-1", id: "evt-1"}
	now := time.Now()
	if _, err := tbl.rename(k, "x", 5, now); err != errNotFound {
		t.Fatalf("rename of a missing event: %v", err)
	}
	steps := []struct {
		name  string
		epoch int64
		ok    bool
	}{
		{"the first write creates the row", 10, true},
		{"the same epoch writes again", 10, true},
		{"a higher epoch takes over the row", 20, true},
		{"a lower epoch is refused", 10, false},
		{"the current epoch still writes", 20, true},
	}
	for _, s := range steps {
		_, err := tbl.upsert(k, eventBody{Name: s.name}, s.epoch, now)
		if (err == nil) != s.ok {
			t.Fatalf("%s: %v", s.name, err)
		}
	}
	if ev, _ := tbl.get(k); ev.LeaseEpoch != 20 || ev.Name != "the current epoch still writes" {
		t.Fatalf("row %+v", ev)
	}
	// Another session's rows are fenced separately: its epochs are not comparable.
	other := rowKey{user: "alice", session: "doc-2", id: "evt-1"}
	if _, err := tbl.upsert(other, eventBody{Name: "other"}, 1, now); err != nil {
		t.Fatal(err)
	}
}

// The package comment's quick start: tablease in dev mode (access and lease tokens of the dev
// issuer) and the app with nothing set but the shared secret and tablease's URL.
func TestTheQuickStartDefaultsAcceptTheTokensOfADevModeTablease(t *testing.T) {
	auth := api.AuthConfig{HS256Secret: []byte(secret), Issuer: api.DevIssuer, Audience: "tablease"}
	w := newWorldWith(t, auth, api.DevIssuer, true, func(tableaseURL string) Options {
		env := map[string]string{"TABLEASE_JWT_HS256_SECRET": secret, "TABLEASE_URL": tableaseURL}
		opts, _, err := optionsFromEnv(func(k string) string { return env[k] })
		if err != nil {
			t.Fatal(err)
		}
		return opts
	})
	tok, _ := w.acquire("tab-a", "try")
	if code, body := w.call("PUT", w.app+"/api/sessions/doc-1/events/evt-1", tok, map[string]any{"name": "Go meetup", "date": "2026-12-02"}); code != 200 {
		t.Fatalf("a write with the holder's lease token: %d %v", code, body)
	}
}

// Started without the shared secret, as the README's list of commands shows it, the app says which
// variable to set, in the words of its environment.
func TestWithoutTheSharedSecretTheAppNamesTheVariable(t *testing.T) {
	_, _, err := optionsFromEnv(func(string) string { return "" })
	if err == nil || !strings.HasPrefix(err.Error(), "TABLEASE_JWT_HS256_SECRET: ") {
		t.Fatalf("optionsFromEnv with nothing set: %v, want an error naming TABLEASE_JWT_HS256_SECRET", err)
	}
}
