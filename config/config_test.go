package config

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

var goodSecret = strings.Repeat("s", 32)

func TestLoadDefaultsInDevMode(t *testing.T) {
	c, err := Load([]string{"--dev"}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Addr != "127.0.0.1:8080" || !c.Dev || c.Limits.Default != 45*time.Second || c.Limits.HiddenMax != 150*time.Second || c.RateLimit != 50 {
		t.Fatalf("unexpected defaults: %+v", c)
	}
	if c.Issuer == "" || c.Audience == "" {
		t.Fatalf("dev mode should default issuer and audience: %+v", c)
	}
}

func TestFlagsOverrideTheEnvironment(t *testing.T) {
	c, err := Load([]string{"--ttl-max", "90s", "--addr", "127.0.0.1:0"}, env(map[string]string{
		"TABLEASE_TTL_MAX": "100s", "TABLEASE_JWT_HS256_SECRET": goodSecret,
		"TABLEASE_JWT_ISSUER": "idp", "TABLEASE_JWT_AUDIENCE": "tablease",
	}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Limits.Max != 90*time.Second || c.Addr != "127.0.0.1:0" {
		t.Fatalf("flags did not win: %+v", c)
	}
}

func TestBadValuesNameTheirVariable(t *testing.T) {
	base := map[string]string{"TABLEASE_JWT_HS256_SECRET": goodSecret, "TABLEASE_JWT_ISSUER": "idp", "TABLEASE_JWT_AUDIENCE": "aud"}
	cases := []struct {
		name, key, value, wantVar string
	}{
		{"a short HS256 secret is refused", "TABLEASE_JWT_HS256_SECRET", "short", "TABLEASE_JWT_HS256_SECRET"},
		{"a TTL that is not a duration is refused", "TABLEASE_TTL_MAX", "ten", "TABLEASE_TTL_MAX"},
		{"a leeway over 30s is refused", "TABLEASE_JWT_LEEWAY", "31s", "TABLEASE_JWT_LEEWAY"},
		{"an address without a port is refused", "TABLEASE_ADDR", "localhost", "TABLEASE_ADDR"},
		{"a non-redis URL is refused", "TABLEASE_REDIS_URL", "http://x", "TABLEASE_REDIS_URL"},
		{"a negative rate limit is refused", "TABLEASE_RATE_LIMIT", "-1", "TABLEASE_RATE_LIMIT"},
		{"an unknown log format is refused", "TABLEASE_LOG_FORMAT", "xml", "TABLEASE_LOG_FORMAT"},
		{"a default above the maximum is refused", "TABLEASE_TTL_DEFAULT", "200s", "TABLEASE_TTL_MIN/DEFAULT/MAX/HIDDEN_MAX"},
		{"a missing issuer is refused outside dev mode", "TABLEASE_JWT_ISSUER", "", "TABLEASE_JWT_ISSUER"},
		{"a missing public keys file is refused", "TABLEASE_JWT_PUBLIC_KEYS", "/nonexistent/keys.pem", "TABLEASE_JWT_PUBLIC_KEYS"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := map[string]string{}
			for k, v := range base {
				m[k] = v
			}
			m[tc.key] = tc.value
			_, err := Load(nil, env(m), io.Discard)
			var ce *Error
			if !errors.As(err, &ce) || ce.Var != tc.wantVar {
				t.Fatalf("got %v, want an error naming %s", err, tc.wantVar)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error spans lines: %q", err)
			}
			if tc.key == "TABLEASE_JWT_HS256_SECRET" && strings.Contains(err.Error(), tc.value) {
				t.Fatalf("error leaks the secret: %q", err)
			}
		})
	}
}

func TestSecretIsRequiredOutsideDevMode(t *testing.T) {
	_, err := Load(nil, env(map[string]string{"TABLEASE_JWT_ISSUER": "i", "TABLEASE_JWT_AUDIENCE": "a"}), io.Discard)
	var ce *Error
	if !errors.As(err, &ce) || ce.Var != "TABLEASE_JWT_HS256_SECRET" {
		t.Fatalf("got %v", err)
	}
}

func TestFlagNames(t *testing.T) {
	if got := FlagName("TABLEASE_TTL_HIDDEN_MAX"); got != "ttl-hidden-max" {
		t.Fatal(got)
	}
}

func TestDevModeListensOnLoopbackOnly(t *testing.T) {
	_, err := Load([]string{"--dev", "--addr", "0.0.0.0:8080"}, env(nil), io.Discard)
	var ce *Error
	if !errors.As(err, &ce) || ce.Var != "TABLEASE_ADDR" {
		t.Fatalf("got %v", err)
	}
	for _, addr := range []string{"127.0.0.1:0", "[::1]:8080", "localhost:8080"} {
		if _, err := Load([]string{"--dev", "--addr", addr}, env(nil), io.Discard); err != nil {
			t.Fatalf("%s: %v", addr, err)
		}
	}
}
