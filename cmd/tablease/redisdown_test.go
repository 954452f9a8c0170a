package main

import (
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/tablease/tablease/api"
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
	s := serveAt(t, env, "127.0.0.1:0", &syncBuffer{})
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
