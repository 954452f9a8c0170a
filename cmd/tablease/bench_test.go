package main

import (
	"bytes"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/tablease/tablease/internal/redistest"
)

// TestBenchDrivesARunningServer runs `tablease bench` briefly against a server on Redis, with this
// process as the one whose CPU and RSS it reads, and checks every work reports figures and no
// errors.
func TestBenchDrivesARunningServer(t *testing.T) {
	rds := redistest.Start(t)
	env := map[string]string{
		"TABLEASE_REDIS_URL":         rds.URL(),
		"TABLEASE_JWT_HS256_SECRET":  testSecret,
		"TABLEASE_JWT_ISSUER":        "bench-idp",
		"TABLEASE_JWT_AUDIENCE":      "tablease",
		"TABLEASE_LEASE_SIGNING_KEY": keyFile(t),
		"TABLEASE_RATE_LIMIT":        "0",
		// Answers kept 2.5 s for retries (5 × the timeout), which the memory work waits out.
		"TABLEASE_REDIS_TIMEOUT": "500ms",
	}
	base, logs := startServer(t, env)
	var out, errOut bytes.Buffer
	p := Program{Stdout: &out, Stderr: &errOut, Getenv: func(k string) string { return env[k] }}
	code := p.Main(t.Context(), []string{"bench", "--url", base, "--redis", rds.URL(), "--json",
		"--duration", "300ms", "--concurrency", "2", "--streams", "20", "--sockets", "20", "--takeovers", "5", "--sessions", "400",
		"--pid", "tablease=" + strconv.Itoa(os.Getpid())})
	if code != 0 {
		t.Fatalf("bench exited %d:\n%s\nserver:\n%s", code, errOut.String(), logs)
	}
	var results []benchResult
	if err := json.Unmarshal(out.Bytes(), &results); err != nil {
		t.Fatalf("bench --json printed %q: %v", out.String(), err)
	}
	byWork := map[string][]benchResult{}
	for _, r := range results {
		if r.Errors != 0 {
			t.Errorf("%s: %d errors", r.Work, r.Errors)
		}
		byWork[r.Work] = append(byWork[r.Work], r)
	}
	for _, w := range []string{"renew", "acquire+release"} {
		r := byWork[w]
		if len(r) != 1 || r[0].Ops == 0 || r[0].PerSecond <= 0 || r[0].P50Ms <= 0 || r[0].P99Ms < r[0].P50Ms {
			t.Errorf("%s: %+v, want operations with their rate and latencies", w, r)
		} else if _, ok := r[0].CPUMicros["tablease"]; !ok {
			t.Errorf("%s: no CPU per operation of the tablease process: %+v", w, r[0])
		} else if want := map[string]float64{"renew": 1, "acquire+release": 2}[w]; r[0].FunctionMicros <= 0 ||
			r[0].FunctionCalls <= 0 || r[0].FunctionCalls > want*1.1 ||
			(r[0].FunctionCalls < want && w != "renew") { // renews that queue together share a call (batch.go)
			t.Errorf("%s: %.1f µs in %.2f function calls per operation, want some in %v", w, r[0].FunctionMicros, r[0].FunctionCalls, want)
		}
	}
	if r := byWork["takeover→event"]; len(r) != 1 || r[0].Ops != 5 || r[0].P50Ms <= 0 {
		t.Errorf("takeover→event: %+v, want 5 timed takeovers", r)
	}
	if r := byWork["idle streams"]; len(r) != 1 || r[0].Ops != 20 || r[0].Bytes != 0 || !strings.Contains(r[0].Note, "not measured below") {
		t.Errorf("idle streams: %+v, want 20 streams, too few for the RSS per stream", r)
	}
	if r := byWork["idle sockets"]; len(r) != 1 || r[0].Ops != 20 || r[0].Bytes != 0 || !strings.Contains(r[0].Note, "not measured below") {
		t.Errorf("idle sockets: %+v, want 20 sockets, too few for the RSS per socket", r)
	}
	if r := byWork["redis memory"]; len(r) != 3 || r[0].Bytes <= 0 || !strings.Contains(r[0].Note, "held lease") ||
		!strings.Contains(r[2].Note, "answer expired") || r[2].Bytes >= r[1].Bytes {
		t.Errorf("redis memory: %+v, want bytes per held lease, per free session, and less once the answers kept for retries expired", r)
	}

	// Over lease sockets: the same calls, and a guard's check, one function call each.
	out.Reset()
	code = p.Main(t.Context(), []string{"bench", "--url", base, "--redis", rds.URL(), "--json", "--transport", "socket",
		"--duration", "300ms", "--concurrency", "2", "--work", "renew,acquire,check"})
	if code != 0 {
		t.Fatalf("bench --transport socket exited %d:\n%s\nserver:\n%s", code, errOut.String(), logs)
	}
	results = nil
	if err := json.Unmarshal(out.Bytes(), &results); err != nil || len(results) != 3 {
		t.Fatalf("bench --transport socket --json printed %q: %v", out.String(), err)
	}
	for _, r := range results {
		if want := map[string]float64{"renew": 1, "acquire+release": 2, "check": 1}[r.Work]; r.Errors != 0 || r.Ops == 0 || r.FunctionCalls < want || r.FunctionCalls > want*1.1 {
			t.Errorf("%s over sockets: %+v, want operations without errors, %v function calls each", r.Work, r, want)
		}
	}
	if !strings.Contains(logs.String(), `"route":"/v1/sessions/:sid/lease/renew"`) || !strings.Contains(logs.String(), `"socket":true`) {
		t.Errorf("the server's log has no renew carried by a socket:\n%s", logs)
	}

	// At a pace: each of 4 clients renews every 200 ms for 1 s, 5 renews each at most (at 0, 200,
	// …, 800 ms of its start, which is at most 150 ms in), where back to back they make hundreds.
	out.Reset()
	code = p.Main(t.Context(), []string{"bench", "--url", base, "--json", "--work", "renew",
		"--duration", "1s", "--concurrency", "4", "--pace", "200ms"})
	if code != 0 {
		t.Fatalf("bench --pace exited %d:\n%s\nserver:\n%s", code, errOut.String(), logs)
	}
	results = nil
	if err := json.Unmarshal(out.Bytes(), &results); err != nil || len(results) != 1 {
		t.Fatalf("bench --pace --json printed %q: %v", out.String(), err)
	}
	if r := results[0]; r.Errors != 0 || r.Ops < 4 || r.Ops > 20 {
		t.Errorf("renew at a pace of 200 ms, 4 clients, 1 s: %+v, want 4 to 20 renews without errors", r)
	}
}

func TestBenchRefusesBadFlagsWithUsage(t *testing.T) {
	env := map[string]string{"TABLEASE_JWT_HS256_SECRET": testSecret, "TABLEASE_JWT_ISSUER": "i", "TABLEASE_JWT_AUDIENCE": "a"}
	for _, args := range [][]string{
		{"bench", "--work", "nothing"},
		{"bench", "--work", "memory"}, // needs --redis
		{"bench", "--pid", "tablease"},
		{"bench", "--concurrency", "0"},
		{"bench", "--sessions-per-user", "0"},
		{"bench", "--pace", "-1s"},
	} {
		var errOut bytes.Buffer
		p := Program{Stdout: &bytes.Buffer{}, Stderr: &errOut, Getenv: func(k string) string { return env[k] }}
		if code := p.Main(t.Context(), args); code != 2 || errOut.Len() == 0 {
			t.Errorf("%v: exit %d, stderr %q; want 2 with a message", args, code, errOut.String())
		}
	}
	var errOut bytes.Buffer
	p := Program{Stdout: &bytes.Buffer{}, Stderr: &errOut, Getenv: func(string) string { return "" }}
	if code := p.Main(t.Context(), []string{"bench"}); code != 2 || !strings.Contains(errOut.String(), "TABLEASE_JWT_HS256_SECRET") {
		t.Errorf("without the server's secret: exit %d, %q", code, errOut.String())
	}
}

// TestBenchSaysWhatItsErrorsWere: a bench refused by the server's rate limit names the first
// refusal and the setting, rather than a bare count of errors.
func TestBenchSaysWhatItsErrorsWere(t *testing.T) {
	env := map[string]string{
		"TABLEASE_JWT_HS256_SECRET": testSecret,
		"TABLEASE_JWT_ISSUER":       "bench-idp",
		"TABLEASE_JWT_AUDIENCE":     "tablease",
		"TABLEASE_RATE_LIMIT":       "1",
	}
	base, logs := startServer(t, env)
	var out, errOut bytes.Buffer
	p := Program{Stdout: &out, Stderr: &errOut, Getenv: func(k string) string { return env[k] }}
	if code := p.Main(t.Context(), []string{"bench", "--url", base, "--work", "renew", "--duration", "300ms", "--concurrency", "2"}); code != 0 {
		t.Fatalf("bench exited %d:\n%s\nserver:\n%s", code, errOut.String(), logs)
	}
	if s := out.String(); !strings.Contains(s, "429 RATE_LIMITED") || !strings.Contains(s, "TABLEASE_RATE_LIMIT=0") {
		t.Errorf("the summary does not say what the errors were:\n%s", s)
	}
}

// TestBenchFlagsAreInTheREADME: every flag `tablease bench --help` lists is described in the
// README's "Cost per operation", where its figures are explained.
func TestBenchFlagsAreInTheREADME(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n### Cost per operation\n")
	if !ok {
		t.Fatal(`README.md has no section "Cost per operation"`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	section, _, _ = strings.Cut(section, "\n### ")
	var out bytes.Buffer
	p := Program{Stdout: &out, Stderr: &out, Getenv: func(string) string { return "" }}
	if code := p.Main(t.Context(), []string{"bench", "--help"}); code != 0 {
		t.Fatalf("bench --help: exit %d: %s", code, out.String())
	}
	n := 0
	for _, line := range strings.Split(out.String(), "\n") {
		name, ok := strings.CutPrefix(line, "  -")
		if !ok {
			continue
		}
		name, _, _ = strings.Cut(name, " ")
		n++
		if !strings.Contains(section, "`--"+name) {
			t.Errorf("--%s is not described in the README's Cost per operation", name)
		}
	}
	if n < 10 {
		t.Fatalf("only %d flags read from bench --help:\n%s", n, out.String())
	}
}
