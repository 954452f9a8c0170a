package main

import (
	"testing"
	"time"

	"github.com/tablease/tablease/api"
	"github.com/tablease/tablease/internal/redistest"
)

// TestTheSessionsOfAUserAreBoundedOverHTTP runs the server with TABLEASE_SESSIONS_PER_USER=2 on
// each engine: a third session of a user is refused with 409 TOO_MANY_SESSIONS, by an acquire, a
// presence PUT and an event stream without presence alike, while the user's own sessions and other users' stay open.
func TestTheSessionsOfAUserAreBoundedOverHTTP(t *testing.T) {
	for _, engine := range []string{"memory", "redis"} {
		t.Run(engine, func(t *testing.T) {
			env := map[string]string{
				"TABLEASE_JWT_HS256_SECRET":  testSecret,
				"TABLEASE_JWT_ISSUER":        "e2e-idp",
				"TABLEASE_JWT_AUDIENCE":      "tablease",
				"TABLEASE_LOG_FORMAT":        "text",
				"TABLEASE_LEASE_SIGNING_KEY": keyFile(t),
				"TABLEASE_SESSIONS_PER_USER": "2",
			}
			if engine == "redis" {
				env["TABLEASE_REDIS_URL"] = redistest.Start(t).URL()
			}
			base, _ := startServer(t, env)
			as := func(sub string) client {
				tok, err := api.IssueToken(api.AuthConfig{HS256Secret: []byte(testSecret), Issuer: "e2e-idp", Audience: "tablease"},
					api.TokenSpec{Sub: sub, TTL: time.Hour})
				if err != nil {
					t.Fatal(err)
				}
				return client{t: t, base: base, token: tok}
			}
			alice, bob := as("alice"), as("bob")
			acquire := func(c client, sid string) (int, map[string]any) {
				return c.do("POST", "/v1/sessions/"+sid+"/lease", map[string]any{"tabId": "tab-a", "label": "Tab A"})
			}
			for _, sid := range []string{"doc-1", "doc-2"} {
				if code, body := acquire(alice, sid); code != 200 {
					t.Fatalf("acquire of %s: %d %v", sid, code, body)
				}
			}
			wantRefused := func(what string, code int, body map[string]any) {
				t.Helper()
				e, _ := body["error"].(map[string]any)
				details, _ := e["details"].(map[string]any)
				if code != 409 || errCode(body) != "TOO_MANY_SESSIONS" || e["retryable"] != false || details["limit"] != float64(2) {
					t.Fatalf("%s: %d %v, want 409 TOO_MANY_SESSIONS with details.limit 2", what, code, body)
				}
			}
			code, body := acquire(alice, "doc-3")
			wantRefused("an acquire of a third session", code, body)
			code, body = alice.do("PUT", "/v1/sessions/doc-3/tabs/tab-a", map[string]any{"label": "Tab A"})
			wantRefused("a presence PUT of a third session", code, body)
			code, body = alice.do("GET", "/v1/sessions/doc-3/events?tabId=tab-a&presence=false", nil)
			wantRefused("an event stream of a third session, without presence", code, body)
			if code, body := acquire(bob, "doc-3"); code != 200 {
				t.Fatalf("another user's acquire: %d %v", code, body)
			}
			if code, body := alice.do("PUT", "/v1/sessions/doc-2/tabs/tab-b", nil); code != 200 {
				t.Fatalf("a presence PUT of a session the user has: %d %v", code, body)
			}
			if code, body := acquire(alice, "doc-1"); code != 200 {
				t.Fatalf("the holder's acquire again: %d %v", code, body)
			}
		})
	}
}
