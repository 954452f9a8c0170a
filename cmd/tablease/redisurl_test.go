package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tablease/tablease/internal/redistest"
)

// redisServeEnv is the environment of a serve on the Redis of url, with the lease-token key file
// key, listening on a free port.
func redisServeEnv(url, key string) map[string]string {
	return map[string]string{
		"TABLEASE_REDIS_URL":         url,
		"TABLEASE_JWT_HS256_SECRET":  testSecret,
		"TABLEASE_JWT_ISSUER":        "e2e-idp",
		"TABLEASE_JWT_AUDIENCE":      "tablease",
		"TABLEASE_LEASE_SIGNING_KEY": key,
		"TABLEASE_ADDR":              "127.0.0.1:0",
	}
}

// TestServeStopsOnABadRedisURLWithOneLineNamingTheProblem: a Redis URL the engine cannot use is a
// configuration error like any bad value: exit code 2 and one line, before anything starts.
func TestServeStopsOnABadRedisURLWithOneLineNamingTheProblem(t *testing.T) {
	key := keyFile(t)
	for _, tc := range []struct {
		url, problem string
	}{
		{"http://cache:6379", "redis:// or rediss://"},
		{"foo://x", "redis:// or rediss://"},
		{"redis://[::1", "missing ']' in host"},
		{"redis://app:hunter2-secret@[::1", "missing ']' in host"},
		{"redis://app:hunter2%zz@cache:6379", "invalid URL escape"},
		{"redis://app:hunter2-secret@cache:6379?cluster=maybe", `cluster="maybe" is not a boolean`},
		{"redis://app:hunter2-secret@cache:6379?cluster=true&master_name=tablease", "exclude each other"},
		{"rediss://app:hunter2-secret@cache:6379?pool=9", "unexpected option: pool"},
		{"redis://app:hunter2-secret@cache:6379/db7", "invalid database number"},
		{"redis://app:hunter2-secret@cache:99999/0", "port 99999 is not from 1 to 65535"},
		{"redis://app:hunter2-secret@cache:0/0?master_name=tablease", "port 0 is not from 1 to 65535"},
		{"redis://sentinel:hunter2-secret@s1:26379/0?master_name=tablease&dial_timeout=soon", "invalid dial_timeout"},
		{"redis://app:hunter2-secret@n1:6379?cluster=true&addr=n2:6379&pool_size=many", `pool_size="many" is not a whole number`},
		{"redis://app:hunter2-secret@cache:6379/0?pool_size=-1", `pool_size="-1" is not a whole number from 0 to 1000`},
		{"redis://app:hunter2-secret@cache:6379/0?pool_size=1048576&min_idle_conns=1048576", `pool_size="1048576" is not a whole number from 0 to 1000`},
		{"redis://sentinel:hunter2-secret@s1:26379/0?master_name=tablease&max_active_conns=-5", `max_active_conns="-5"`},
		{"redis://app:hunter2-secret@cache:6379/0?pipeline_read_buffer_size=99999999999", `pipeline_read_buffer_size="99999999999" is not a whole number from 0 to 1048576`},
		{"rediss://app:hunter2-secret@cache:6380/0?ca_file=/nonexistent/redis-ca.pem", "ca_file: open /nonexistent/redis-ca.pem"},
		{"redis://app:hunter2-secret@cache:6379/0?ca_file=/etc/ssl/ca.pem", "ca_file is for rediss:// only"},
		{"rediss://app:hunter2-secret@cache:6380/0?cert_file=/nonexistent/c.pem&key_file=/nonexistent/c.key", "cert_file and key_file: open /nonexistent/c.pem"},
		{"rediss://app:hunter2-secret@cache:6380/0?cert_file=/etc/ssl/c.pem", "cert_file and key_file go together"},
	} {
		t.Run(tc.url, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			env := redisServeEnv(tc.url, key)
			p := Program{Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string { return env[k] },
				OnListen: func(string) { t.Error("serve listened with a bad Redis URL") }}
			if code := p.Main(context.Background(), []string{"serve"}); code != 2 {
				t.Fatalf("exit code %d, want 2 (a configuration error); stderr %q", code, stderr.String())
			}
			out := stderr.String()
			const prefix = "tablease: configuration: TABLEASE_REDIS_URL: "
			if strings.Count(out, "\n") != 1 || !strings.HasSuffix(out, "\n") || !strings.HasPrefix(out, prefix) ||
				!strings.Contains(out, tc.problem) {
				t.Fatalf("want one line %q… naming %q, got %q", prefix, tc.problem, out)
			}
			if strings.Contains(out, "hunter2") {
				t.Fatalf("the line shows the URL's password: %q", out)
			}
			if stdout.Len() != 0 {
				t.Fatalf("stdout %q, want nothing", stdout.String())
			}
		})
	}
}

// TestServeStopsOnAURLThatReachesAReplicaWithExitCodeTwo: a URL of one server that reaches a
// replica is a bad value that only the start can find, once Redis answers: exit code 2, and the
// last line names it, as config.Load's lines do.
func TestServeStopsOnAURLThatReachesAReplicaWithExitCodeTwo(t *testing.T) {
	primary, replica := redistest.Start(t), redistest.Start(t)
	host, port, _ := net.SplitHostPort(primary.Addr())
	if err := replica.Client(t).ReplicaOf(t.Context(), host, port).Err(); err != nil {
		t.Fatal(err)
	}
	const want = "configuration: TABLEASE_REDIS_URL: the server is a replica"
	if last := serveRefuses(t, replica.URL()); !strings.HasPrefix(last, want) {
		t.Fatalf("last line %q, want %q…", last, want)
	}
}

// TestServeStopsOnAClusterURLOfOneServerWithExitCodeTwo: cluster=true against a server that is not
// a Cluster node (its cluster support disabled) is refused at start as a replica is: exit code 2,
// and the last line names TABLEASE_REDIS_URL and what to change.
func TestServeStopsOnAClusterURLOfOneServerWithExitCodeTwo(t *testing.T) {
	rds := redistest.Start(t)
	want := "configuration: TABLEASE_REDIS_URL: the server at " + rds.Addr() +
		" is outside a Redis Cluster (CLUSTER SLOTS answers no slot map); remove cluster=true"
	if last := serveRefuses(t, "redis://"+rds.Addr()+"?cluster=true"); last != want {
		t.Fatalf("last line %q, want %q", last, want)
	}
}

// TestServeStopsOnCredentialsRedisRefusesWithExitCodeTwo: a password Redis refuses is a
// configuration error the start finds once Redis answers, not an outage to wait out with 503s.
func TestServeStopsOnCredentialsRedisRefusesWithExitCodeTwo(t *testing.T) {
	rds := redistest.Start(t)
	const want = "configuration: TABLEASE_REDIS_URL: the server refused the URL's user and password (WRONGPASS"
	if last := serveRefuses(t, "redis://ghost:hunter2-secret@"+rds.Addr()+"/0"); !strings.HasPrefix(last, want) || strings.Contains(last, "hunter2") {
		t.Fatalf("last line %q, want %q… without the password", last, want)
	}
}

// serveRefuses runs serve on the Redis URL url, which it must refuse once Redis answers (exit
// code 2; a serve that listens is stopped, and t fails), and answers why, as its last line says.
func serveRefuses(t *testing.T, url string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	env := redisServeEnv(url, keyFile(t))
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	p := Program{Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string { return env[k] },
		OnListen: func(string) { t.Errorf("serve listened on %s", url); stop() }}
	if code := p.Main(ctx, []string{"serve"}); code != 2 {
		t.Fatalf("exit code %d, want 2 (a configuration error); stderr %q", code, stderr.String())
	}
	return stoppedBecause(t, stderr.String())
}

// stoppedBecause is the err of the last line of the JSON log out, which must be the line
// "tablease stopped" that ends it, and end with a newline.
func stoppedBecause(t *testing.T, out string) string {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	var last struct{ Level, Msg, Err string }
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil || !strings.HasSuffix(out, "\n") ||
		last.Msg != "tablease stopped" || last.Level != "ERROR" {
		t.Fatalf("the last line is not the log's ERROR \"tablease stopped\" (%v): %q", err, out)
	}
	return last.Err
}

// TestServeStopsOnAnUnusablePublicKeysFileWithOneLine: a TABLEASE_JWT_PUBLIC_KEYS file that cannot
// be read or holds no usable key is a configuration error like any bad value: one plain line,
// before the log starts, as for the other key files.
func TestServeStopsOnAnUnusablePublicKeysFileWithOneLine(t *testing.T) {
	garbage := filepath.Join(t.TempDir(), "keys.pem")
	if err := os.WriteFile(garbage, []byte("-----BEGIN PUBLIC KEY-----\nbm90IGEga2V5\n-----END PUBLIC KEY-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{garbage, filepath.Join(t.TempDir(), "missing.pem")} {
		var stdout, stderr bytes.Buffer
		env := map[string]string{
			"TABLEASE_JWT_PUBLIC_KEYS":   file,
			"TABLEASE_JWT_ISSUER":        "e2e-idp",
			"TABLEASE_JWT_AUDIENCE":      "tablease",
			"TABLEASE_LEASE_SIGNING_KEY": keyFile(t),
			"TABLEASE_ADDR":              "127.0.0.1:0",
		}
		p := Program{Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string { return env[k] },
			OnListen: func(string) { t.Error("serve listened with an unusable public keys file") }}
		if code := p.Main(context.Background(), []string{"serve"}); code != 2 {
			t.Fatalf("%s: exit code %d, want 2 (a configuration error); stderr %q", file, code, stderr.String())
		}
		out := stderr.String()
		why, plain := strings.CutPrefix(strings.TrimSuffix(out, "\n"), "tablease: ")
		const prefix = "configuration: TABLEASE_JWT_PUBLIC_KEYS: "
		if !plain || strings.Count(out, "\n") != 1 || !strings.HasPrefix(why, prefix) || !strings.Contains(why, file) || strings.Contains(why, "jwk:") {
			t.Fatalf("%s: want one line %q… naming the file, got %q", file, prefix, out)
		}
	}
}

// TestTheSweepsOfARedisInstanceAreCounted: on Redis, /metrics counts the sweeps of expiries
// nobody announced (README "Operations"), from zero.
func TestTheSweepsOfARedisInstanceAreCounted(t *testing.T) {
	rds := redistest.Start(t)
	base, logs := startServer(t, map[string]string{
		"TABLEASE_REDIS_URL":         rds.URL(),
		"TABLEASE_JWT_HS256_SECRET":  testSecret,
		"TABLEASE_JWT_ISSUER":        "metrics-idp",
		"TABLEASE_JWT_AUDIENCE":      "tablease",
		"TABLEASE_LEASE_SIGNING_KEY": keyFile(t),
	})
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, want := range []string{`tablease_sweeps_total{result="ok"} 0`, `tablease_sweeps_total{result="failed"} 0`, "tablease_sweep_expiries_total 0", "tablease_event_resubscriptions_total 0"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s; server:\n%s", want, logs)
		}
	}
}
