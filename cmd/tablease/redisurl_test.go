package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
)

func TestServeStopsOnABadRedisURLWithOneLineNamingTheProblem(t *testing.T) {
	key := keyFile(t)
	for _, tc := range []struct {
		url, problem string
	}{
		{"http://cache:6379", "redis:// or rediss://"},
		{"redis://app:hunter2-secret@cache:6379?cluster=maybe", `cluster="maybe" is not a boolean`},
		{"redis://app:hunter2-secret@cache:6379?cluster=true&master_name=tablease", "exclude each other"},
		{"rediss://app:hunter2-secret@cache:6379?pool=9", "unexpected option: pool"},
		{"redis://app:hunter2-secret@cache:6379/db7", "invalid database number"},
	} {
		t.Run(tc.url, func(t *testing.T) {
			var stderr bytes.Buffer
			env := map[string]string{
				"TABLEASE_REDIS_URL":         tc.url,
				"TABLEASE_JWT_HS256_SECRET":  testSecret,
				"TABLEASE_JWT_ISSUER":        "e2e-idp",
				"TABLEASE_JWT_AUDIENCE":      "tablease",
				"TABLEASE_LEASE_SIGNING_KEY": key,
				"TABLEASE_ADDR":              "127.0.0.1:0",
			}
			p := Program{Stdout: io.Discard, Stderr: &stderr, Getenv: func(k string) string { return env[k] }}
			if code := p.Main(context.Background(), []string{"serve"}); code == 0 {
				t.Fatal("serve started with a bad Redis URL")
			}
			out := strings.TrimSpace(stderr.String())
			// The JSON log escapes the quotes of the problem.
			named := strings.Contains(out, tc.problem) || strings.Contains(out, strings.ReplaceAll(tc.problem, `"`, `\"`))
			if strings.Count(out, "\n") != 0 || !strings.Contains(out, "TABLEASE_REDIS_URL") || !named {
				t.Fatalf("want one line naming TABLEASE_REDIS_URL and %q, got %q", tc.problem, out)
			}
			if strings.Contains(out, "hunter2") {
				t.Fatalf("the line shows the URL's password: %q", out)
			}
		})
	}
}
