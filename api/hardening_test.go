package api

import (
	"net/http"
	"net/http/httptest"
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
	}{
		{"an exp given as a string is refused", hs(func(c jwt.MapClaims) { c["exp"] = itoa(farFuture) })},
		{"an nbf given as a string is refused", hs(func(c jwt.MapClaims) { c["nbf"] = "0" })},
		{"an iat given as a string is refused", hs(func(c jwt.MapClaims) { c["iat"] = "0" })},
		{"a scope list holding a number is refused", hs(func(c jwt.MapClaims) { c["scope"] = []any{"lease:admin", 7} })},
	} {
		t.Run(tt.name, func(t *testing.T) {
			wantError(t, h.get(leasePath("doc-1"), tt.token), http.StatusUnauthorized, CodeUnauthenticated)
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
