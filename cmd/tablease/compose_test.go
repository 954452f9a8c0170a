package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tablease/tablease/api"
	"github.com/tablease/tablease/internal/redistest"
	"github.com/tablease/tablease/internal/syncbuf"
)

// readEnvFile reads KEY=VALUE lines, skipping blank lines and # comments, as Compose reads an
// env_file: a value in single quotes is read without them.
func readEnvFile(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	env := make(map[string]string)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: %q is not KEY=VALUE", path, line)
		}
		if len(v) >= 2 && v[0] == '\'' && v[len(v)-1] == '\'' {
			v = v[1 : len(v)-1]
		}
		env[k] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return env
}

// TestTheEnvFileExampleReadsTheSameInAShell: the README mints a token with `set -a; .
// ./tablease.env`, so every assignment of tablease.env.example, the commented ones too once they
// are uncommented, must give a shell the value Compose reads (the Sentinel URL's & would run the
// rest of its line in the background).
func TestTheEnvFileExampleReadsTheSameInAShell(t *testing.T) {
	data, err := os.ReadFile("../../tablease.env.example")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	n := 0
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "# TABLEASE_"); ok && strings.Contains(rest, "=") {
			line = "TABLEASE_" + rest
		}
		if !strings.HasPrefix(line, "TABLEASE_") {
			continue
		}
		n++
		path := filepath.Join(dir, fmt.Sprintf("line-%d.env", n))
		if err := os.WriteFile(path, []byte(line+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		name, _, _ := strings.Cut(line, "=")
		want := readEnvFile(t, path)[name]
		out, err := exec.Command("sh", "-c", `set -a; . "$1"; printenv "$2"`, "sh", path, name).CombinedOutput()
		if err != nil || strings.TrimSuffix(string(out), "\n") != want {
			t.Errorf("%s: a shell reads %q (%v), Compose %q", line, out, err, want)
		}
	}
	if n < 8 {
		t.Fatalf("only %d assignments read: the example is not read as it is written", n)
	}
}

// TestComposeTopologyAsProcesses runs the topology of docker-compose.yml as processes: one Redis
// and two tablease binaries started from the same environment, tablease.env.example with what
// compose supplies filled in (the secret, the Redis address, the signing key file, a port each),
// and tells the two-tab story across them as a load balancer would spread it.
func TestComposeTopologyAsProcesses(t *testing.T) {
	compose, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"env_file: ${TABLEASE_ENV_FILE:-tablease.env}", "lease_signing_key", "noeviction", "/readyz", `"8081:8080"`, `"8082:8080"`} {
		if !strings.Contains(string(compose), want) {
			t.Fatalf("docker-compose.yml has no %q: this test no longer runs its topology", want)
		}
	}
	env := readEnvFile(t, "../../tablease.env.example")
	rds := redistest.Start(t)
	env["TABLEASE_JWT_HS256_SECRET"] = testSecret
	env["TABLEASE_REDIS_URL"] = rds.URL()
	env["TABLEASE_LEASE_SIGNING_KEY"] = keyFile(t)

	bin := filepath.Join(t.TempDir(), "tablease")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	var bases []string
	for i := range 2 {
		bases = append(bases, startProcess(t, bin, env, fmt.Sprintf("tablease-%d", i+1)))
	}

	tok, err := api.IssueToken(api.AuthConfig{HS256Secret: []byte(testSecret), Issuer: env["TABLEASE_JWT_ISSUER"], Audience: env["TABLEASE_JWT_AUDIENCE"]},
		api.TokenSpec{Sub: "alice", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	c1, c2 := client{t: t, base: bases[0], token: tok}, client{t: t, base: bases[1], token: tok}
	const lease = "/v1/sessions/doc-1/lease"

	code, a := c1.do("POST", lease, map[string]any{"tabId": "tab-a", "label": "Tab A"})
	if code != 200 || a["role"] != "owner" {
		t.Fatalf("A acquires through instance 1: %d %v", code, a)
	}
	epochA := epochOf(t, a)
	s := openEvents(t, c1.base, "/v1/sessions/doc-1/events?tabId=tab-a", tok)
	s.must("snapshot", 5*time.Second)

	code, b := c2.do("POST", lease, map[string]any{"tabId": "tab-b", "label": "Tab B"})
	if code != 409 || errCode(b) != "LEASE_HELD" {
		t.Fatalf("B is refused through instance 2: %d %v", code, b)
	}
	code, b = c2.do("POST", lease, map[string]any{"tabId": "tab-b", "label": "Tab B", "mode": "takeover"})
	if code != 200 || epochOf(t, b) <= epochA {
		t.Fatalf("B takes over through instance 2 with a higher epoch: %d %v", code, b)
	}
	awaitLease(t, s, "taken_over", "tab-b", epochOf(t, b), time.Second)

	code, a = c1.do("POST", lease+"/renew", map[string]any{"tabId": "tab-a", "epoch": epochA})
	if code != 409 || errCode(a) != "LEASE_LOST" {
		t.Fatalf("A's renew through instance 1 is LEASE_LOST: %d %v", code, a)
	}
	// The lease token instance 2 signed checks through instance 1: the instances share the key.
	token, _ := b["token"].(string)
	code, chk := c1.do("POST", lease+"/check", map[string]any{"token": token})
	if code != 200 || chk["valid"] != true {
		t.Fatalf("B's lease token from instance 2 checked through instance 1: %d %v", code, chk)
	}
}

// startProcess runs `bin serve` with env on a free port, as the compose service name does, and
// waits until /readyz answers 200 (its compose healthcheck). The process is stopped with SIGTERM
// at cleanup and must exit 0.
func startProcess(t *testing.T, bin string, env map[string]string, name string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(bin, "serve")
	cmd.Env = []string{"TABLEASE_ADDR=" + addr}
	for k, v := range env {
		if k != "TABLEASE_ADDR" {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	logs := &syncbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := redistest.StartChild(cmd); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("%s exited with %v; its log:\n%s", name, err, logs)
			}
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("%s did not exit within 15s of SIGTERM", name)
		}
	})
	base := "http://" + addr
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := http.Get(base + "/readyz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return base
			}
		}
		select {
		case err := <-exited:
			t.Fatalf("%s exited (%v) before it was ready; its log:\n%s", name, err, logs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s was not ready within 15s; its log:\n%s", name, logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
