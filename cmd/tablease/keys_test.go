package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tablease/tablease/api"
	"github.com/tablease/tablease/internal/redistest"
	"github.com/tablease/tablease/owner/leasetoken"
)

// keyFile runs `tablease keygen --out` and returns the path of the key.
func keyFile(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "lease-key.pem")
	var stderr bytes.Buffer
	p := Program{Stdout: io.Discard, Stderr: &stderr, Getenv: func(string) string { return "" }}
	if code := p.Main(context.Background(), []string{"keygen", "--out", path}); code != 0 {
		t.Fatalf("keygen exited %d: %s", code, stderr.String())
	}
	return path
}

func TestKeygenWritesASigningKeyOnlyItsOwnerCanRead(t *testing.T) {
	dir := t.TempDir()
	priv, pub := filepath.Join(dir, "k.pem"), filepath.Join(dir, "k.pub.pem")
	var stdout, stderr bytes.Buffer
	p := Program{Stdout: &stdout, Stderr: &stderr, Getenv: func(string) string { return "" }}
	if code := p.Main(context.Background(), []string{"keygen", "--out", priv, "--public-out", pub}); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	fi, err := os.Stat(priv)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("the key file has mode %v, want 0600", fi.Mode().Perm())
	}
	key, err := leasetoken.LoadPrivateKeyFile(priv)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(priv)
	if !strings.HasPrefix(string(data), "-----BEGIN PRIVATE KEY-----") || key.Algorithm() != leasetoken.AlgEdDSA {
		t.Fatalf("not an Ed25519 PKCS#8 PEM key: %s %q", key.Algorithm(), firstLine(string(data)))
	}
	pubData, _ := os.ReadFile(pub)
	pk, err := leasetoken.ParsePublicKeyPEM(pubData)
	if err != nil || pk.KeyID() != key.KeyID() || !strings.HasPrefix(string(pubData), "-----BEGIN PUBLIC KEY-----") {
		t.Fatalf("public key %v %v", pk.KeyID(), err)
	}
	if !strings.Contains(stderr.String(), key.KeyID()) || stdout.Len() != 0 {
		t.Fatalf("stdout %q stderr %q", stdout.String(), stderr.String())
	}

	// It never overwrites a key.
	stderr.Reset()
	if code := p.Main(context.Background(), []string{"keygen", "--out", priv}); code != 1 {
		t.Fatalf("overwriting answered %d", code)
	}
	if again, _ := leasetoken.LoadPrivateKeyFile(priv); again.KeyID() != key.KeyID() {
		t.Fatal("keygen replaced an existing key")
	}

	// A run that cannot write the private key leaves no public key behind.
	pub2 := filepath.Join(dir, "k2.pub.pem")
	if code := p.Main(context.Background(), []string{"keygen", "--out", priv, "--public-out", pub2}); code != 1 {
		t.Fatalf("keygen onto an existing key answered %d", code)
	}
	if _, err := os.Stat(pub2); !os.IsNotExist(err) {
		t.Errorf("a failed keygen left %s behind (%v)", pub2, err)
	}

	// Without --out the key goes to stdout.
	stdout.Reset()
	if code := p.Main(context.Background(), []string{"keygen"}); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if _, err := leasetoken.ParsePrivateKeyPEM(stdout.Bytes()); err != nil {
		t.Fatalf("stdout is not a key: %v", err)
	}
}

func firstLine(s string) string { line, _, _ := strings.Cut(s, "\n"); return line }

// TestTwoInstancesOnRedisShareLeaseKeysAndTheCatalog runs two `tablease serve` on one Redis with
// one signing key: a lease token from one instance checks on the other, and a catalog PUT through
// one is served by the other.
func TestTwoInstancesOnRedisShareLeaseKeysAndTheCatalog(t *testing.T) {
	rds := redistest.Start(t)
	dir := t.TempDir()
	catalogFile := filepath.Join(dir, "catalog.json")
	const cat = `{"tools":[{"name":"search_events","description":"Search.","annotations":{"readOnlyHint":true}},` +
		`{"name":"save_event","description":"Save."}]}`
	if err := os.WriteFile(catalogFile, []byte(cat), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"TABLEASE_REDIS_URL":         rds.URL(),
		"TABLEASE_JWT_HS256_SECRET":  testSecret,
		"TABLEASE_JWT_ISSUER":        "e2e-idp",
		"TABLEASE_JWT_AUDIENCE":      "tablease",
		"TABLEASE_LOG_FORMAT":        "text",
		"TABLEASE_LEASE_SIGNING_KEY": keyFile(t),
		"TABLEASE_CATALOG_FILE":      catalogFile,
	}
	baseA, logsA := startServer(t, env)
	baseB, logsB := startServer(t, env)
	auth := api.AuthConfig{HS256Secret: []byte(testSecret), Issuer: "e2e-idp", Audience: "tablease"}
	tok, _ := api.IssueToken(auth, api.TokenSpec{Sub: "alice", TTL: time.Hour})
	admin, _ := api.IssueToken(auth, api.TokenSpec{Sub: "root", Scopes: []string{api.ScopeAdmin}, TTL: time.Hour})
	a, b := client{t: t, base: baseA, token: tok}, client{t: t, base: baseB, token: tok}

	code, l := a.do("POST", "/v1/sessions/doc-1/lease", map[string]any{"tabId": "tab-a"})
	leaseToken, _ := l["token"].(string)
	if code != 200 || leaseToken == "" {
		t.Fatalf("acquire on A: %d %v", code, l)
	}
	if code, c := b.do("POST", "/v1/sessions/doc-1/lease/check", map[string]any{"token": leaseToken}); code != 200 || c["valid"] != true {
		t.Fatalf("B checks A's token: %d %v", code, c)
	}
	jwksA, jwksB := get(t, baseA+"/.well-known/jwks.json"), get(t, baseB+"/.well-known/jwks.json")
	if jwksA != jwksB || !strings.Contains(jwksA, `"kty":"OKP"`) {
		t.Fatalf("the instances publish different keys:\n%s\n%s", jwksA, jwksB)
	}

	// The file was seeded once; both serve it. A PUT through A reaches B within its max age.
	for _, c := range []client{a, b} {
		if code, v := c.do("GET", "/v1/sessions/doc-1/catalog?tabId=tab-a", nil); code != 200 || len(v["tools"].([]any)) != 2 {
			t.Fatalf("catalog: %d %v", code, v)
		}
	}
	if !strings.Contains(logsA.String()+logsB.String(), "stored the file's catalog") {
		t.Fatalf("no instance said it seeded the catalog:\n%s\n%s", logsA, logsB)
	}
	killed := strings.Replace(cat, `"description":"Save."`, `"description":"Save.","disabled":true`, 1)
	req, _ := http.NewRequest("PUT", baseA+"/v1/admin/catalog", strings.NewReader(killed))
	req.Header.Set("Authorization", "Bearer "+admin)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("If-Match", "*")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("PUT: %d", resp.StatusCode)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, v := b.do("GET", "/v1/sessions/doc-1/catalog?tabId=tab-a", nil)
		if len(v["tools"].([]any)) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("B still serves the old catalog: %v", v)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, body)
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatal(fmt.Errorf("GET %s: %w", url, err))
	}
	return string(body)
}
