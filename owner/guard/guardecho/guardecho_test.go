package guardecho_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/tablease/tablease/owner/guard"
	"github.com/tablease/tablease/owner/guard/guardecho"
	"github.com/tablease/tablease/owner/leasetoken"
)

func TestEchoMiddleware(t *testing.T) {
	now := time.Date(2026, 12, 2, 13, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	key, _ := leasetoken.GenerateKey()
	keys, _ := leasetoken.NewKeySet(key, leasetoken.KeySetOptions{Now: clock})
	signer, _ := leasetoken.NewSigner(keys, "tablease")
	tok, err := signer.Sign(leasetoken.Claims{Subject: "alice", Session: "doc-A", Tab: "t", Epoch: 42, IssuedAt: now, ExpiresAt: now.Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	colon, err := signer.Sign(leasetoken.Claims{Subject: "alice", Session: "a:b@c", Tab: "t", Epoch: 42, IssuedAt: now, ExpiresAt: now.Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	docA, err := signer.Sign(leasetoken.Claims{Subject: "alice", Session: "docA", Tab: "t", Epoch: 42, IssuedAt: now, ExpiresAt: now.Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	g, err := guard.New(guard.Options{
		Keys:   keys,
		Issuer: "tablease",
		Now:    clock,
		Skip:   guard.SafeMethods,
		Target: func(r *http.Request) (string, string, error) {
			return r.Header.Get("X-User"), r.PathValue("sid"), nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	e := echo.New()
	handler := func(c echo.Context) error {
		claims, ok := guardecho.Claims(c)
		return c.JSON(http.StatusOK, map[string]any{"epoch": claims.Epoch, "guarded": ok})
	}
	e.POST("/sessions/:sid/items", handler, guardecho.Middleware(g))
	e.GET("/sessions/:sid/items", handler, guardecho.Middleware(g))

	// A Target that does not depend on the route.
	g2, _ := guard.New(guard.Options{Keys: keys, Issuer: "tablease", Now: clock, Target: func(r *http.Request) (string, string, error) {
		return r.Header.Get("X-User"), "doc-A", nil
	}})
	e.PUT("/doc-a", handler, guardecho.Middleware(g2))

	tests := []struct {
		name, method, path, token string
		status                    int
		code                      string
	}{
		{"a valid token passes with its epoch", http.MethodPut, "/doc-a", tok, http.StatusOK, ""},
		{"a missing token is refused in the guard's shape", http.MethodPut, "/doc-a", "", http.StatusForbidden, guard.CodeNotLeaseOwner},
		{"a skipped GET passes unchecked", http.MethodGet, "/sessions/doc-A/items", "", http.StatusOK, ""},
		{"Echo's :sid is the Target's r.PathValue(\"sid\")", http.MethodPost, "/sessions/doc-A/items", tok, http.StatusOK, ""},
		{"a token for another session is refused", http.MethodPost, "/sessions/doc-B/items", tok, http.StatusForbidden, guard.CodeNotLeaseOwner},
		// encodeURIComponent("a:b@c"): Echo routes on the still-encoded RawPath.
		{"a percent-encoded :sid is decoded for the Target", http.MethodPost, "/sessions/a%3Ab%40c/items", colon, http.StatusOK, ""},
		{"an unencoded one passes alike", http.MethodPost, "/sessions/a:b@c/items", colon, http.StatusOK, ""},
		// %2541 is a literal "%41": Go keeps the decoded Path alone, which must not be decoded again.
		{"a decoded path is not decoded twice", http.MethodPost, "/sessions/doc%2541/items", docA, http.StatusForbidden, guard.CodeNotLeaseOwner},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := httptest.NewRequest(tt.method, tt.path, nil)
			req.Header.Set("X-User", "alice")
			if tt.token != "" {
				req.Header.Set(guard.Header, tt.token)
			}
			rec := httptest.NewRecorder()
			e.ServeHTTP(rec, req)
			if rec.Code != tt.status {
				t.Fatalf("got %d %s", rec.Code, rec.Body)
			}
			var body map[string]any
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatal(err)
			}
			if tt.code != "" {
				errObj, _ := body["error"].(map[string]any)
				if errObj["code"] != tt.code {
					t.Fatalf("body %s", rec.Body)
				}
				return
			}
			if tt.method != http.MethodGet && (body["epoch"] != float64(42) || body["guarded"] != true) {
				t.Fatalf("body %s", rec.Body)
			}
		})
	}
}
