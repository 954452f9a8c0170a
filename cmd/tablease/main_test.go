package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/tablease/tablease/api"
	"github.com/tablease/tablease/internal/jwk"
	"github.com/tablease/tablease/internal/loglimit"
	"github.com/tablease/tablease/internal/redistest"
	"github.com/tablease/tablease/internal/syncbuf"
	"github.com/tablease/tablease/lease/leaseredis"
)

const testSecret = "0123456789abcdef0123456789abcdef-e2e"

// e2eAuth is the identity provider of the end-to-end tests that start the server with
// TABLEASE_JWT_HS256_SECRET testSecret, TABLEASE_JWT_ISSUER e2e-idp and TABLEASE_JWT_AUDIENCE
// tablease; e2eToken mints its access tokens.
var e2eAuth = api.AuthConfig{HS256Secret: []byte(testSecret), Issuer: "e2e-idp", Audience: "tablease"}

// e2eRedisEnv is the environment of a server on rds that takes e2eToken's access tokens and signs
// lease tokens with a key of its own.
func e2eRedisEnv(t *testing.T, rds *redistest.Server) map[string]string {
	return map[string]string{
		"TABLEASE_REDIS_URL":         rds.URL(),
		"TABLEASE_JWT_HS256_SECRET":  testSecret,
		"TABLEASE_JWT_ISSUER":        "e2e-idp",
		"TABLEASE_JWT_AUDIENCE":      "tablease",
		"TABLEASE_LEASE_SIGNING_KEY": keyFile(t),
		"TABLEASE_LOG_FORMAT":        "text",
	}
}

func e2eToken(t *testing.T, sub string, scopes ...string) string {
	t.Helper()
	tok, err := api.IssueToken(e2eAuth, api.TokenSpec{Sub: sub, Scopes: scopes, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// startServer runs `tablease serve` in-process with env and returns its base URL. The server is
// stopped (as by SIGTERM) at cleanup, and must exit 0 within its shutdown timeout.
func startServer(t *testing.T, env map[string]string) (string, *syncbuf.Buffer) {
	t.Helper()
	s := serveAt(t, env, "127.0.0.1:0", &syncbuf.Buffer{})
	return "http://" + s.addr, s.logs
}

// served is a `tablease serve` that serveAt started.
type served struct {
	addr string
	logs *syncbuf.Buffer
	stop func() // stops the server as SIGTERM does and waits until it exited 0; then does nothing
}

// serveAt runs `tablease serve --addr addr` in-process with env, logging to logs, until stop or
// the test's cleanup.
func serveAt(t *testing.T, env map[string]string, addr string, logs *syncbuf.Buffer) served {
	t.Helper()
	addrs := make(chan string, 1)
	ctx, cancel := context.WithCancel(context.Background())
	p := Program{
		Stdout: io.Discard,
		Stderr: logs,
		Getenv: func(k string) string { return env[k] },
		Environ: func() []string {
			var kv []string
			for k, v := range env {
				kv = append(kv, k+"="+v)
			}
			return kv
		},
		OnListen: func(addr string) { addrs <- addr },
	}
	done := make(chan int, 1)
	go func() { done <- p.Main(ctx, []string{"serve", "--addr", addr}) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case code := <-done:
				if code != 0 {
					t.Errorf("serve exited %d; logs:\n%s", code, logs)
				}
			case <-time.After(15 * time.Second):
				t.Errorf("serve did not stop within 15s of the signal")
			}
		})
	}
	t.Cleanup(stop)
	select {
	case addr := <-addrs:
		return served{addr: addr, logs: logs, stop: stop}
	case code := <-done:
		t.Fatalf("serve exited %d before listening; logs:\n%s", code, logs)
	case <-time.After(15 * time.Second):
		t.Fatalf("serve did not listen within 15s; logs:\n%s", logs)
	}
	return served{}
}

type client struct {
	t     *testing.T
	base  string
	token string
}

// do sends a JSON request and decodes the JSON answer into a map.
func (c client) do(method, path string, body any) (int, map[string]any) {
	c.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		c.t.Fatalf("%s %s: answer is not JSON: %v", method, path, err)
	}
	return resp.StatusCode, out
}

func errCode(body map[string]any) string {
	e, _ := body["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

func epochOf(t *testing.T, body map[string]any) int64 {
	t.Helper()
	f, ok := body["epoch"].(float64)
	if !ok {
		t.Fatalf("no epoch in %v", body)
	}
	return int64(f)
}

func TestTwoTabStoryOverHTTPOnRedis(t *testing.T) {
	rds := redistest.Start(t)
	base, _ := startServer(t, e2eRedisEnv(t, rds))
	tok, err := api.IssueToken(api.AuthConfig{HS256Secret: []byte(testSecret), Issuer: "e2e-idp", Audience: "tablease"},
		api.TokenSpec{Sub: "alice", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	c := client{t: t, base: base, token: tok}
	const lease = "/v1/sessions/doc-1/lease"

	code, a := c.do("POST", lease, map[string]any{"tabId": "tab-a", "label": "Tab A"})
	if code != 200 || a["role"] != "owner" {
		t.Fatalf("A acquires: %d %v", code, a)
	}
	epochA := epochOf(t, a)

	code, b := c.do("POST", lease, map[string]any{"tabId": "tab-b", "label": "Tab B"})
	holder, _ := b["error"].(map[string]any)["details"].(map[string]any)["holder"].(map[string]any)
	if code != 409 || errCode(b) != "LEASE_HELD" || holder["tabId"] != "tab-a" {
		t.Fatalf("B is refused with A as holder: %d %v", code, b)
	}

	code, b = c.do("POST", lease, map[string]any{"tabId": "tab-b", "label": "Tab B", "mode": "takeover"})
	if code != 200 || epochOf(t, b) <= epochA {
		t.Fatalf("B takes over with a higher epoch: %d %v", code, b)
	}
	epochB := epochOf(t, b)

	code, a = c.do("POST", lease+"/renew", map[string]any{"tabId": "tab-a", "epoch": epochA})
	if code != 409 || errCode(a) != "LEASE_LOST" {
		t.Fatalf("A's renew is LEASE_LOST: %d %v", code, a)
	}

	code, a = c.do("POST", lease+"/release", map[string]any{"tabId": "tab-a", "epoch": epochA})
	if code != 200 || a["released"] != false {
		t.Fatalf("A's stale release frees nothing: %d %v", code, a)
	}
	code, g := c.do("GET", lease+"?tabId=tab-a", nil)
	if code != 200 || g["held"] != true || g["role"] != "viewer" || epochOf(t, g) != epochB {
		t.Fatalf("B still holds after A's stale release: %d %v", code, g)
	}

	code, b = c.do("POST", lease+"/release", map[string]any{"tabId": "tab-b", "epoch": epochB})
	if code != 200 || b["released"] != true {
		t.Fatalf("B releases: %d %v", code, b)
	}

	code, a = c.do("POST", lease, map[string]any{"tabId": "tab-a", "label": "Tab A"})
	if code != 200 || epochOf(t, a) <= epochB {
		t.Fatalf("A acquires again with a higher epoch than %d: %d %v", epochB, code, a)
	}
}

func TestServeRefusesBadConfigurationWithOneLine(t *testing.T) {
	var stderr bytes.Buffer
	p := Program{Stdout: io.Discard, Stderr: &stderr, Getenv: func(k string) string {
		return map[string]string{"TABLEASE_JWT_HS256_SECRET": "too-short"}[k]
	}}
	if code := p.Main(context.Background(), []string{"serve"}); code != 2 {
		t.Fatalf("exit code %d, want 2", code)
	}
	out := strings.TrimSpace(stderr.String())
	if strings.Count(out, "\n") != 0 || !strings.Contains(out, "TABLEASE_JWT_HS256_SECRET") || strings.Contains(out, "too-short") {
		t.Fatalf("want one line naming the variable and not the secret, got %q", out)
	}
}

func TestDevModeServesTokensAndLeasesOnMemory(t *testing.T) {
	base, logs := startServer(t, map[string]string{"TABLEASE_DEV": "true"})
	resp, err := http.Get(base + "/dev/token?sub=alice")
	if err != nil {
		t.Fatal(err)
	}
	var tok struct {
		Token string `json:"token"`
	}
	err = json.NewDecoder(resp.Body).Decode(&tok)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || tok.Token == "" {
		t.Fatalf("dev token: %d %v %+v", resp.StatusCode, err, tok)
	}
	c := client{t: t, base: base, token: tok.Token}
	if code, body := c.do("POST", "/v1/sessions/doc-1/lease", map[string]any{"tabId": "t1"}); code != 200 || body["token"] == nil {
		t.Fatalf("acquire on the memory engine, with a lease token signed by a generated key: %d %v", code, body)
	}
	if !strings.Contains(logs.String(), "dev mode on http://") {
		t.Fatalf("no startup line saying what to open:\n%s", logs)
	}
	if strings.Contains(logs.String(), tok.Token) {
		t.Fatal("a token appeared in the logs")
	}
}

func TestTokenCommandMintsAVerifiableToken(t *testing.T) {
	var stdout, stderr bytes.Buffer
	env := map[string]string{"TABLEASE_JWT_HS256_SECRET": testSecret, "TABLEASE_JWT_ISSUER": "idp", "TABLEASE_JWT_AUDIENCE": "aud"}
	p := Program{Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string { return env[k] }}
	if code := p.Main(context.Background(), []string{"token", "--sub", "alice", "--scope", "lease:admin", "--sid", "doc-1,doc-2", "--ttl", "10m"}); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	claims := jwt.MapClaims{}
	_, err := jwt.ParseWithClaims(strings.TrimSpace(stdout.String()), claims, func(*jwt.Token) (any, error) { return []byte(testSecret), nil },
		jwt.WithValidMethods([]string{"HS256"}), jwt.WithIssuer("idp"), jwt.WithAudience("aud"), jwt.WithExpirationRequired())
	if err != nil {
		t.Fatal(err)
	}
	if claims["sub"] != "alice" || claims["scope"] != "lease:admin" || fmt.Sprint(claims["sid"]) != "[doc-1 doc-2]" {
		t.Fatalf("claims: %v", claims)
	}
	if code := p.Main(context.Background(), []string{"token", "--sub", "bad sub"}); code != 2 {
		t.Fatalf("a bad sub must be a usage error, got %d", code)
	}
	for _, args := range [][]string{{"--sub", "alice", "--ttl", "1ms"}, {"--sub", "alice", "extra"}} {
		if code := p.Main(context.Background(), append([]string{"token"}, args...)); code != 2 {
			t.Errorf("token %q answered %d, want a usage error", args, code)
		}
	}

	// The secret is trimmed as the server trims it, so that the server accepts the token.
	env["TABLEASE_JWT_HS256_SECRET"] = " " + testSecret + "\n"
	stdout.Reset()
	if code := p.Main(context.Background(), []string{"token", "--sub", "alice"}); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if _, err := jwt.Parse(strings.TrimSpace(stdout.String()), func(*jwt.Token) (any, error) { return []byte(testSecret), nil },
		jwt.WithValidMethods([]string{"HS256"})); err != nil {
		t.Errorf("a token signed with a secret given with spaces around it: %v", err)
	}
}

// --sid limits a token to sessions: a list with an empty item, or with an item that is not a
// session id, is refused, since a token left with no session would have no sid claim and be good
// for every session.
func TestTokenCommandRefusesASessionListItCannotRead(t *testing.T) {
	var stdout, stderr bytes.Buffer
	env := map[string]string{"TABLEASE_JWT_HS256_SECRET": testSecret}
	p := Program{Stdout: &stdout, Stderr: &stderr, Getenv: func(k string) string { return env[k] }}
	for _, tt := range []struct{ sid, says string }{
		{",", `"," has an empty item`},
		{"", `"" has an empty item`},
		{"doc-1,", `"doc-1," has an empty item`},
		{"doc-1,,doc-2", `has an empty item`},
		{"d1,d 2", `"d 2" is not a session id: it may contain only A-Z a-z 0-9 . _ : @ | -`},
		{"a/b", `"a/b" is not a session id`},
		{"..", `".." is not a session id`},
	} {
		stdout.Reset()
		stderr.Reset()
		if code := p.Main(context.Background(), []string{"token", "--sub", "alice", "--scope", "lease:admin", "--sid", tt.sid}); code != 2 || stdout.Len() != 0 {
			t.Errorf("--sid %q: exit %d, stdout %q: want a usage error and no token", tt.sid, code, stdout.String())
		}
		if line := stderr.String(); !strings.HasPrefix(line, "tablease token: --sid: ") || !strings.Contains(line, tt.says) || strings.Count(line, "\n") != 1 {
			t.Errorf("--sid %q: stderr %q, want one line saying %s", tt.sid, line, tt.says)
		}
	}
	stdout.Reset()
	if code := p.Main(context.Background(), []string{"token", "--sub", "alice", "--sid", "doc-1, a|b@idp"}); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	claims := jwt.MapClaims{}
	if _, _, err := jwt.NewParser().ParseUnverified(strings.TrimSpace(stdout.String()), claims); err != nil || fmt.Sprint(claims["sid"]) != "[doc-1 a|b@idp]" {
		t.Fatalf("claims %v, %v: want the two sessions, spaces around the comma left out", claims, err)
	}
}

func TestVersionAndUsage(t *testing.T) {
	var stdout, stderr bytes.Buffer
	p := Program{Stdout: &stdout, Stderr: &stderr, Getenv: func(string) string { return "" }}
	if code := p.Main(context.Background(), []string{"version"}); code != 0 || !strings.HasPrefix(stdout.String(), "tablease ") {
		t.Fatalf("version: %d %q", code, stdout.String())
	}
	if code := p.Main(context.Background(), []string{"frobnicate"}); code != 2 || !strings.Contains(stderr.String(), "unknown command") {
		t.Fatalf("unknown command: %d %q", code, stderr.String())
	}
	stderr.Reset()
	if code := p.Main(context.Background(), []string{"version", "extra"}); code != 2 || !strings.Contains(stderr.String(), "no arguments") {
		t.Fatalf("version extra: %d %q, want 2 and a line", code, stderr.String())
	}
}

func TestGoRedisLinesGoIntoTheServiceLog(t *testing.T) {
	var buf bytes.Buffer
	var p atomic.Pointer[slog.Logger]
	p.Store(slog.New(slog.NewJSONHandler(&buf, nil)))
	redisLog{log: &p}.Printf(context.Background(), "redis: connection pool: failed to dial after %d attempts: %s\n", 2, "connection refused")
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("not one JSON line: %q: %v", buf.String(), err)
	}
	if line["level"] != "WARN" || line["msg"] != "redis client" ||
		line["detail"] != "redis: connection pool: failed to dial after 2 attempts: connection refused" {
		t.Fatalf("logged %v", line)
	}
}

// TestGoRedisSentinelNewsIsInfo: what the sentinels answered at every start (the primary they
// name, another sentinel) is logged at info; their failures stay warnings.
func TestGoRedisSentinelNewsIsInfo(t *testing.T) {
	var buf bytes.Buffer
	var p atomic.Pointer[slog.Logger]
	p.Store(slog.New(slog.NewJSONHandler(&buf, nil)))
	r := redisLog{log: &p}
	r.Printf(context.Background(), "sentinel: new master=%q addr=%q", "tablease", "10.0.0.1:6379")
	r.Printf(context.Background(), "sentinel: discovered new sentinel=%q for master=%q", "s2", "tablease")
	r.Printf(context.Background(), "sentinel: GetMasterAddrByName name=%q failed: %s", "tablease", "i/o timeout")
	var levels []any
	for l := range strings.SplitSeq(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("not a JSON line: %q: %v", l, err)
		}
		levels = append(levels, m["level"])
	}
	if !slices.Equal(levels, []any{"INFO", "INFO", "WARN"}) {
		t.Fatalf("levels %v, want INFO, INFO, WARN; log %s", levels, buf.String())
	}
}

// TestGoRedisLinesRepeatedWithinASecondAreCounted: while Redis is out of reach go-redis writes the
// same line many times a second; one a second of each format is logged, with the number left out.
func TestGoRedisLinesRepeatedWithinASecondAreCounted(t *testing.T) {
	var buf bytes.Buffer
	var p atomic.Pointer[slog.Logger]
	p.Store(slog.New(slog.NewJSONHandler(&buf, nil)))
	now := time.Unix(1_800_000_000, 0)
	r := redisLog{log: &p, limit: loglimit.New(time.Second, func() time.Time { return now })}
	const dial = "redis: failed to dial %s\n"
	start := now
	for i := range 25 {
		now = start.Add(time.Duration(i) * 10 * time.Millisecond)
		r.Printf(context.Background(), dial, "127.0.0.1:6379")
	}
	lastLeftOut := now
	r.Printf(context.Background(), "redis: sentinel %s does not answer\n", "s1") // another format
	now = now.Add(time.Minute)                                                   // a later outage
	r.Printf(context.Background(), dial, "127.0.0.1:6380")
	var lines []map[string]any
	for l := range strings.SplitSeq(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("not a JSON line: %q: %v", l, err)
		}
		lines = append(lines, m)
	}
	if len(lines) != 3 || lines[0]["repeated"] != nil || lines[1]["detail"] != "redis: sentinel s1 does not answer" ||
		lines[2]["repeated"] != float64(24) || lines[2]["repeated_last"] != lastLeftOut.Format(time.RFC3339Nano) {
		t.Fatalf("logged %v; want the first dial line, the sentinel line, then a dial line saying 24 were left out, the last at %v",
			lines, lastLeftOut.Format(time.RFC3339Nano))
	}
}

// TestServeWarnsOfAVariableNothingReads: a misspelt TABLEASE_ variable is ignored, as every
// unknown variable is, but serve says so at start, with the variable it is most likely meant as.
func TestServeWarnsOfAVariableNothingReads(t *testing.T) {
	_, logs := startServer(t, map[string]string{"TABLEASE_DEV": "true", "TABLEASE_TTL_MAXX": "5s"})
	for _, want := range []string{`"level":"WARN"`, `"variable":"TABLEASE_TTL_MAXX"`, `"did_you_mean":"TABLEASE_TTL_MAX"`} {
		if line := lineWith(logs.String(), `"variable":"TABLEASE_TTL_MAXX"`); !strings.Contains(line, want) {
			t.Fatalf("no warning with %s: %q", want, logs.String())
		}
	}
}

// TestServeLogsTheAccessTokenKeys: the start says which access tokens it accepts, with the kid
// and algorithm of each key of TABLEASE_JWT_PUBLIC_KEYS (a PEM block's kid header, else its
// RFC 7638 thumbprint), for whoever sets up the identity provider.
func TestServeLogsTheAccessTokenKeys(t *testing.T) {
	named, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	unnamed, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var file bytes.Buffer
	for i, k := range []ed25519.PublicKey{named, unnamed} {
		der, err := x509.MarshalPKIXPublicKey(k)
		if err != nil {
			t.Fatal(err)
		}
		block := &pem.Block{Type: "PUBLIC KEY", Bytes: der}
		if i == 0 {
			block.Headers = map[string]string{"kid": "idp-1"}
		}
		pem.Encode(&file, block)
	}
	path := filepath.Join(t.TempDir(), "keys.pem")
	if err := os.WriteFile(path, file.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	thumb, err := jwk.Thumbprint(unnamed)
	if err != nil {
		t.Fatal(err)
	}
	_, logs := startServer(t, map[string]string{
		"TABLEASE_JWT_PUBLIC_KEYS":   path,
		"TABLEASE_JWT_HS256_SECRET":  testSecret,
		"TABLEASE_JWT_ISSUER":        "keys-idp",
		"TABLEASE_JWT_AUDIENCE":      "tablease",
		"TABLEASE_LEASE_SIGNING_KEY": keyFile(t),
	})
	line := lineWith(logs.String(), `"msg":"access tokens"`)
	for _, want := range []string{`"issuer":"keys-idp"`, `"audience":"tablease"`, `"hs256":true`, `"keys":["idp-1 EdDSA","` + thumb + ` EdDSA"]`} {
		if !strings.Contains(line, want) {
			t.Fatalf("the start's access tokens line lacks %s: %q\n%s", want, line, logs.String())
		}
	}
}

// TestServeTakesAccessTokensOfAJWKSURL: with TABLEASE_JWT_JWKS_URL alone (no secret, no PEM
// file), the start fetches the identity provider's set and logs its keys, and a token it signed
// works end to end.
func TestServeTakesAccessTokensOfAJWKSURL(t *testing.T) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	idp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, `{"keys":[{"kty":"OKP","crv":"Ed25519","x":%q,"kid":"idp-ed","use":"sig","alg":"EdDSA"}]}`,
			base64.RawURLEncoding.EncodeToString(pub))
	}))
	t.Cleanup(idp.Close)
	base, logs := startServer(t, map[string]string{
		"TABLEASE_JWT_JWKS_URL":      idp.URL + "/.well-known/jwks.json",
		"TABLEASE_JWT_ISSUER":        "jwks-idp",
		"TABLEASE_JWT_AUDIENCE":      "tablease",
		"TABLEASE_LEASE_SIGNING_KEY": keyFile(t),
	})
	if line := lineWith(logs.String(), `"msg":"access-token keys fetched"`); !strings.Contains(line, `"keys":["idp-ed EdDSA"]`) {
		t.Fatalf("the start does not log the fetched keys: %q\n%s", line, logs.String())
	}
	if line := lineWith(logs.String(), `"msg":"access tokens"`); !strings.Contains(line, `"jwks":"`+idp.URL) || !strings.Contains(line, `"hs256":false`) {
		t.Fatalf("the start's access tokens line: %q", line)
	}
	tok := jwt.NewWithClaims(jwt.SigningMethodEdDSA, jwt.MapClaims{"iss": "jwks-idp", "aud": "tablease", "sub": "alice", "exp": time.Now().Add(time.Hour).Unix()})
	tok.Header["kid"] = "idp-ed"
	signed, err := tok.SignedString(priv)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/sessions/doc-1/lease", strings.NewReader(`{"tabId":"tab-1"}`))
	req.Header.Set("Authorization", "Bearer "+signed)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"epoch":1`) {
		t.Fatalf("acquire with the identity provider's token: %d %s", resp.StatusCode, body)
	}
}

// TestTheStartSaysWhatTheInstanceRunsWith: the start's log names the Redis (without its
// credentials) and the functions library it calls, and the settings it runs with.
func TestTheStartSaysWhatTheInstanceRunsWith(t *testing.T) {
	rds := redistest.Start(t)
	env := e2eRedisEnv(t, rds)
	env["TABLEASE_RATE_LIMIT"] = "7"
	env["TABLEASE_CORS_ORIGINS"] = "https://app.example.com"
	_, logs := startServer(t, env)
	var listening, settings string
	for _, line := range strings.Split(logs.String(), "\n") {
		switch {
		case strings.Contains(line, `msg="tablease listening"`):
			listening = line
		case strings.Contains(line, `msg="tablease settings"`):
			settings = line
		}
	}
	for _, want := range []string{"engine=redis", "redis=" + rds.URL(), "redis_functions=" + leaseredis.LibraryName()} {
		if !strings.Contains(listening, want) {
			t.Errorf("the line of the start %q lacks %q", listening, want)
		}
	}
	for _, want := range []string{"rate_limit=7", "cors_origins=https://app.example.com", "ttl_default=45s", "log_requests=all", "shutdown_timeout=10s"} {
		if !strings.Contains(settings, want) {
			t.Errorf("the settings line %q lacks %q", settings, want)
		}
	}
}

func TestTheRedisTargetLoggedHasNoCredentials(t *testing.T) {
	for in, want := range map[string]string{
		"redis://127.0.0.1:6379/0":                                    "redis://127.0.0.1:6379/0",
		"redis://app:s3cret@redis.internal:6379/2":                    "redis://redis.internal:6379/2",
		"rediss://:s3cret@redis.internal:6380/0":                      "rediss://redis.internal:6380/0",
		"redis://s1:26379/0?master_name=tl&password=s3cret":           "redis://s1:26379/0?master_name=tl",
		"redis://n1:7000?addr=n2:7000&username=u&sentinel_password=p": "redis://n1:7000?addr=n2%3A7000",
	} {
		if got := redisTarget(in); got != want || strings.Contains(got, "s3cret") {
			t.Errorf("redisTarget(%q) = %q, want %q", in, got, want)
		}
	}
}
