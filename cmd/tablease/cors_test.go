package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestServeAnswersPreflightsOfTheConfiguredOrigins(t *testing.T) {
	base, _ := startServer(t, map[string]string{
		"TABLEASE_JWT_HS256_SECRET": testSecret, "TABLEASE_JWT_ISSUER": "idp", "TABLEASE_JWT_AUDIENCE": "aud",
		"TABLEASE_CORS_ORIGINS": "https://app.example.com, http://localhost:5173",
	})
	for origin, want := range map[string]int{"http://localhost:5173": http.StatusNoContent, "https://other.example": http.StatusForbidden} {
		req, err := http.NewRequest(http.MethodOptions, base+"/v1/sessions/doc-1/lease", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Origin", origin)
		req.Header.Set("Access-Control-Request-Method", "POST")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		allow := resp.Header.Get("Access-Control-Allow-Origin")
		if resp.StatusCode != want || (want == http.StatusNoContent) != (allow == origin) {
			t.Fatalf("preflight from %s: %d, Access-Control-Allow-Origin %q", origin, resp.StatusCode, allow)
		}
	}
}

func TestServeRefusesEveryOriginOutsideDevMode(t *testing.T) {
	var stderr bytes.Buffer
	env := map[string]string{
		"TABLEASE_JWT_HS256_SECRET": testSecret, "TABLEASE_JWT_ISSUER": "idp", "TABLEASE_JWT_AUDIENCE": "aud",
		"TABLEASE_CORS_ORIGINS": "*",
	}
	p := Program{Stdout: io.Discard, Stderr: &stderr, Getenv: func(k string) string { return env[k] }}
	if code := p.Main(context.Background(), []string{"serve"}); code != 2 {
		t.Fatalf("exit code %d, want 2", code)
	}
	out := strings.TrimSpace(stderr.String())
	if strings.Count(out, "\n") != 0 || !strings.Contains(out, "TABLEASE_CORS_ORIGINS") {
		t.Fatalf("want one line naming TABLEASE_CORS_ORIGINS, got %q", out)
	}
	stderr.Reset()
	if code := p.Main(context.Background(), []string{"serve", "--cors-origins", "https://app.example.com/"}); code != 2 {
		t.Fatalf("a trailing slash: exit code %d, want 2", code)
	}
	if out := strings.TrimSpace(stderr.String()); strings.Count(out, "\n") != 0 || !strings.Contains(out, "TABLEASE_CORS_ORIGINS") {
		t.Fatalf("want one line naming TABLEASE_CORS_ORIGINS, got %q", out)
	}
}
