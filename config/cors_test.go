package config

import (
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
)

func TestCORSOriginsAreReadFromTheEnvironmentOrTheFlag(t *testing.T) {
	base := map[string]string{"TABLEASE_JWT_HS256_SECRET": goodSecret, "TABLEASE_JWT_ISSUER": "idp", "TABLEASE_JWT_AUDIENCE": "aud"}
	c, err := Load(nil, env(base), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.CORSOrigins != nil {
		t.Fatalf("CORS origins by default: %q, want none (same origin only)", c.CORSOrigins)
	}

	m := map[string]string{"TABLEASE_CORS_ORIGINS": " https://App.example.com , http://localhost:5173,https://app.example.com:443"}
	for k, v := range base {
		m[k] = v
	}
	if c, err = Load(nil, env(m), io.Discard); err != nil {
		t.Fatal(err)
	}
	if want := []string{"https://app.example.com", "http://localhost:5173"}; !slices.Equal(c.CORSOrigins, want) {
		t.Fatalf("CORS origins %q, want %q", c.CORSOrigins, want)
	}
	if c, err = Load([]string{"--cors-origins", "https://other.example"}, env(m), io.Discard); err != nil {
		t.Fatal(err)
	}
	if want := []string{"https://other.example"}; !slices.Equal(c.CORSOrigins, want) {
		t.Fatalf("the flag gave %q, want %q", c.CORSOrigins, want)
	}
}

func TestEveryOriginIsAllowedInDevModeOnly(t *testing.T) {
	c, err := Load([]string{"--dev", "--cors-origins", "*"}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.CORSOrigins, []string{"*"}) {
		t.Fatalf("dev CORS origins %q", c.CORSOrigins)
	}
	_, err = Load(nil, env(map[string]string{
		"TABLEASE_JWT_HS256_SECRET": goodSecret, "TABLEASE_JWT_ISSUER": "idp", "TABLEASE_JWT_AUDIENCE": "aud",
		"TABLEASE_CORS_ORIGINS": "https://app.example.com,*",
	}), io.Discard)
	var ce *Error
	if !errors.As(err, &ce) || ce.Var != "TABLEASE_CORS_ORIGINS" || !strings.Contains(err.Error(), "dev mode") {
		t.Fatalf("* outside dev mode: %v, want an error naming TABLEASE_CORS_ORIGINS and dev mode", err)
	}
}

func TestBadCORSOriginsNameTheVariable(t *testing.T) {
	base := map[string]string{"TABLEASE_JWT_HS256_SECRET": goodSecret, "TABLEASE_JWT_ISSUER": "idp", "TABLEASE_JWT_AUDIENCE": "aud"}
	cases := map[string]string{
		"a trailing slash":     "https://app.example.com/",
		"a path":               "https://app.example.com/app",
		"a query":              "https://app.example.com?x=1",
		"a fragment":           "https://app.example.com#top",
		"userinfo":             "https://me@app.example.com",
		"another scheme":       "ftp://app.example.com",
		"no scheme":            "app.example.com",
		"an empty item":        "https://a.example,,https://b.example",
		"a trailing comma":     "https://a.example,",
		"a bad port":           "https://a.example:99999",
		"a wildcard in a host": "https://*.example.com",
		"the opaque origin":    "null",
	}
	for name, value := range cases {
		t.Run(name+" is refused", func(t *testing.T) {
			m := map[string]string{"TABLEASE_CORS_ORIGINS": value}
			for k, v := range base {
				m[k] = v
			}
			_, err := Load(nil, env(m), io.Discard)
			var ce *Error
			if !errors.As(err, &ce) || ce.Var != "TABLEASE_CORS_ORIGINS" {
				t.Fatalf("got %v, want an error naming TABLEASE_CORS_ORIGINS", err)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error spans lines: %q", err)
			}
			t.Log(err)
		})
	}
}
