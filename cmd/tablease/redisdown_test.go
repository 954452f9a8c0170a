package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tablease/tablease/api"
	"github.com/tablease/tablease/internal/redistest"
	"github.com/tablease/tablease/internal/syncbuf"
	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/owner/catalog"
)

// TestServeListensWithinOneRedisTimeoutWhenRedisDoesNotAnswer: a Redis that takes connections and
// never answers (a hung server, or an address that swallows packets) holds up the start for one
// TABLEASE_REDIS_TIMEOUT at most, which the start's calls to the store share (the server check,
// the eviction policy, the catalog). The server then listens and answers 503: /readyz, and a
// lease call with STORE_UNAVAILABLE.
func TestServeListensWithinOneRedisTimeoutWhenRedisDoesNotAnswer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // held open, never read nor answered
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})

	const timeout = 2 * time.Second
	env := map[string]string{
		"TABLEASE_REDIS_URL":         "redis://" + ln.Addr().String() + "/0",
		"TABLEASE_REDIS_TIMEOUT":     timeout.String(),
		"TABLEASE_JWT_HS256_SECRET":  testSecret,
		"TABLEASE_JWT_ISSUER":        "e2e-idp",
		"TABLEASE_JWT_AUDIENCE":      "tablease",
		"TABLEASE_LEASE_SIGNING_KEY": keyFile(t),
	}
	started := time.Now()
	s := serveAt(t, env, "127.0.0.1:0", &syncbuf.Buffer{})
	// One timeout and the start's own work; a wait per call would be two timeouts or more.
	if took := time.Since(started); took > timeout*3/2 {
		t.Fatalf("serve listened %v after it started, want at most one TABLEASE_REDIS_TIMEOUT (%v) and its own work; logs:\n%s",
			took.Round(time.Millisecond), timeout, s.logs)
	}
	base := "http://" + s.addr

	resp, err := http.Get(base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("/readyz answered %d, want 503 while Redis does not answer", resp.StatusCode)
	}

	auth := api.AuthConfig{HS256Secret: []byte(testSecret), Issuer: "e2e-idp", Audience: "tablease"}
	tok, err := api.IssueToken(auth, api.TokenSpec{Sub: "alice", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	tab := client{t: t, base: base, token: tok}
	if code, body := tab.do("POST", "/v1/sessions/doc-1/lease", map[string]any{"tabId": "tab-a"}); code != 503 || errCode(body) != "STORE_UNAVAILABLE" {
		t.Errorf("an acquire while Redis does not answer: %d %v, want 503 STORE_UNAVAILABLE", code, body)
	}
}

// TestTheFileCatalogIsStoredOnceRedisAnswers starts `tablease serve` with a catalog file while
// nothing listens on its Redis URL's port, then starts Redis there. The instance stores the
// file's catalog as a start with Redis up would have, and says so, so that an instance without a
// file on the same Redis serves the same version, not an empty catalog of its own.
func TestTheFileCatalogIsStoredOnceRedisAnswers(t *testing.T) {
	rds := redistest.Start(t)
	rds.Stop(t) // nothing listens on the URL's port until Restart
	const cat = `{"tools":[{"name":"search_events","description":"Search.","annotations":{"readOnlyHint":true}}]}`
	file := filepath.Join(t.TempDir(), "catalog.json")
	if err := os.WriteFile(file, []byte(cat), 0o600); err != nil {
		t.Fatal(err)
	}
	parsed, err := catalog.Parse([]byte(cat))
	if err != nil {
		t.Fatal(err)
	}
	want := parsed.Version
	env := redisServeEnv(rds.URL(), keyFile(t))
	env["TABLEASE_CATALOG_FILE"] = file
	a := serveAt(t, env, "127.0.0.1:0", &syncbuf.Buffer{})
	if !strings.Contains(a.logs.String(), "serving the file's catalog until the store answers") {
		t.Fatalf("the start did not say the store does not answer; logs:\n%s", a.logs)
	}

	rds.Restart(t)
	rdb := rds.Client(t)
	stored := func() string {
		v, _ := rdb.HGet(t.Context(), "tablease:doc:catalog", "version").Result()
		return v
	}
	if took, ok := within(time.Now(), 20*time.Second, func() bool { return stored() == want }); !ok {
		t.Fatalf("the store holds catalog version %q %v after Redis started, want the file's %s; logs:\n%s", stored(), took, want, a.logs)
	}
	// The line follows the store's answer, which the test may see first.
	if _, ok := within(time.Now(), 5*time.Second, func() bool { return strings.Contains(a.logs.String(), "stored the file's catalog") }); !ok {
		t.Fatalf("the instance did not say it stored the file's catalog; logs:\n%s", a.logs)
	}

	noFile := maps.Clone(env)
	delete(noFile, "TABLEASE_CATALOG_FILE")
	b := serveAt(t, noFile, "127.0.0.1:0", &syncbuf.Buffer{})
	tok := e2eToken(t, "alice")
	for name, s := range map[string]served{"the instance with the file": a, "an instance without a file": b} {
		c := client{t: t, base: "http://" + s.addr, token: tok}
		var got map[string]any
		serves := func() bool {
			var code int
			code, got = c.do("GET", "/v1/sessions/doc-1/catalog", nil)
			return code == 200 && got["version"] == want
		}
		if _, ok := within(time.Now(), 10*time.Second, serves); !ok {
			t.Fatalf("%s answers %v, want version %s; logs:\n%s", name, got, want, s.logs)
		}
	}
}

// setUpOnlyRedis is a Redis that answers the set-up of a connection (HELLO and CLIENT SETINFO,
// refused as an old Redis refuses them) and then never answers: a hung Redis, to which a client
// still sends its commands. sent counts the times s was sent to it.
func setUpOnlyRedis(t *testing.T) (url string, sent func(s string) int) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	conns := make(map[net.Conn]*bytes.Buffer) // held open until cleanup, with what each sent
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			got := &bytes.Buffer{}
			mu.Lock()
			conns[c] = got
			mu.Unlock()
			go func() {
				buf, answered := make([]byte, 4096), 0
				for {
					n, err := c.Read(buf)
					mu.Lock()
					got.Write(buf[:n])
					setUp := bytes.Count(got.Bytes(), []byte("\r\nhello\r\n")) + bytes.Count(got.Bytes(), []byte("\r\nclient\r\n"))
					mu.Unlock()
					for ; answered < setUp; answered++ {
						_, _ = c.Write([]byte("-ERR unknown command\r\n"))
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for c := range conns {
			c.Close()
		}
	})
	return "redis://" + ln.Addr().String() + "/0", func(s string) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, got := range conns {
			n += bytes.Count(got.Bytes(), []byte(s))
		}
		return n
	}
}

// TestServeStopsAtOnceWhileTheLateCatalogSeedWaitsForRedis: the seed of the catalog, tried again
// after a start Redis did not answer, ends with the server. A stop while a try waits for a hung
// Redis does not wait out the try's TABLEASE_REDIS_TIMEOUT (go-redis does not end a read when
// its context is cancelled; closing the store does).
func TestServeStopsAtOnceWhileTheLateCatalogSeedWaitsForRedis(t *testing.T) {
	url, sent := setUpOnlyRedis(t)
	const timeout = 3 * time.Second
	s := serveAt(t, map[string]string{
		"TABLEASE_REDIS_URL":         url,
		"TABLEASE_REDIS_TIMEOUT":     timeout.String(),
		"TABLEASE_JWT_HS256_SECRET":  testSecret,
		"TABLEASE_JWT_ISSUER":        "e2e-idp",
		"TABLEASE_JWT_AUDIENCE":      "tablease",
		"TABLEASE_LEASE_SIGNING_KEY": keyFile(t),
		"TABLEASE_CATALOG_FILE":      "../../web/demo/catalog.json",
	}, "127.0.0.1:0", &syncbuf.Buffer{})
	const key = "tablease:doc:catalog"
	atStart := sent(key)
	if _, ok := within(time.Now(), timeout, func() bool { return sent(key) > atStart }); !ok {
		t.Fatalf("the catalog was not tried again within %v of the start; logs:\n%s", timeout, s.logs)
	}
	stopping := time.Now()
	s.stop()
	if took := time.Since(stopping); took > timeout/2 {
		t.Fatalf("the stop took %v while the seed waited for Redis, want far less than TABLEASE_REDIS_TIMEOUT (%v)", took, timeout)
	}
}

// TestAStoredCatalogThatIsNotValidIsLoggedAsSuch: a stored catalog that does not parse (written
// by hand, or by a version that wrote another format) is an error of its own at start, saying
// what fails and how to mend it, not a store that does not answer.
func TestAStoredCatalogThatIsNotValidIsLoggedAsSuch(t *testing.T) {
	rds := redistest.Start(t)
	if err := rds.Client(t).HSet(t.Context(), "tablease:doc:catalog", "version", "sha256:x", "data", "not json", "updated_us", "1").Err(); err != nil {
		t.Fatal(err)
	}
	_, logs := startServer(t, redisServeEnv(rds.URL(), keyFile(t)))
	line := lineWith(logs.String(), "the stored tool catalog is not valid")
	if !strings.Contains(line, `"level":"ERROR"`) || !strings.Contains(line, "PUT /v1/admin/catalog") {
		t.Fatalf("no error line about the stored catalog; logs:\n%s", logs)
	}
	if strings.Contains(logs.String(), "until the store answers") {
		t.Fatalf("the start says the store does not answer; logs:\n%s", logs)
	}
}

// TestAnEvictionPolicyRedisDidNotAnswerAtTheStartIsReadOnceItAnswers: the loud warning of an
// evicting Redis is not lost to a Redis slow to answer as the instance starts.
func TestAnEvictionPolicyRedisDidNotAnswerAtTheStartIsReadOnceItAnswers(t *testing.T) {
	var logs syncbuf.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	var asked atomic.Int32
	read := func(context.Context) (string, error) {
		if asked.Add(1) <= 3 {
			return "", &lease.UnavailableError{Op: "config get", Err: errors.New("i/o timeout")}
		}
		return "allkeys-lru", nil
	}
	if checkEvictionPolicy(t.Context(), read, log, false) == nil {
		t.Fatal("a policy Redis did not answer was taken as read")
	}
	if !strings.Contains(logs.String(), "it is read again once Redis answers") {
		t.Fatalf("the start does not say the policy is read again: %s", logs.String())
	}
	go checkEvictionPolicyLater(t.Context(), read, log, time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), "REDIS MAXMEMORY-POLICY IS NOT noeviction") {
		if time.Now().After(deadline) {
			t.Fatalf("no warning of the evicting policy once Redis answered: %s", logs.String())
		}
		time.Sleep(time.Millisecond)
	}
	if n := strings.Count(logs.String(), "maxmemory-policy"); n != 2 {
		t.Errorf("%d lines about the policy, want the start's and the late warning: %s", n, logs.String())
	}
}
