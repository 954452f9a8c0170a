package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tablease/tablease/internal/redistest"
	"github.com/tablease/tablease/internal/verifiedtokens"
	"github.com/tablease/tablease/lease/leaseredis"
)

// Benchmarks of the hot paths of a renew, so that a regression shows in benchstat:
//
//	go test -run XXX -bench 'Renew|DecodeBody|VerifyAccess' -count 10 ./api/ > new.txt
//	benchstat old.txt new.txt
//
// BenchmarkRenewOverHTTPOnRedis is the whole path (HTTP, auth, decoding, the Redis engine, the
// lease token, the answer) on a private redis-server; the others are its parts. The lease token's
// signing has its own benchmarks in owner/leasetoken.

// BenchmarkRenewOverHTTPOnRedis renews leases over loopback HTTP, each parallel client its own
// user, session and keep-alive connection, on a server with the Redis engine.
func BenchmarkRenewOverHTTPOnRedis(b *testing.B) {
	db := redistest.Start(b)
	client, err := leaseredis.NewClient(db.URL(), 0)
	if err != nil {
		b.Fatal(err)
	}
	eng, err := leaseredis.New(client, leaseredis.Options{})
	if err != nil {
		b.Fatal(err)
	}
	srv, err := New(Options{Engine: eng, Documents: eng, Nonces: eng, Auth: testAuthConfig(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	b.Cleanup(func() {
		srv.Close()
		_ = hs.Close()
		_ = eng.Close()
		_ = client.Close()
	})
	base := "http://" + ln.Addr().String() + "/v1/sessions/"
	var n atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		user := fmt.Sprintf("bench-%d", n.Add(1))
		token, err := IssueToken(testAuthConfig(), TokenSpec{Sub: user, TTL: time.Hour})
		if err != nil {
			b.Error(err)
			return
		}
		hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
		post := func(path string, body any, out any) bool {
			data, _ := json.Marshal(body)
			req, _ := http.NewRequest(http.MethodPost, base+"doc-1/lease"+path, bytes.NewReader(data))
			req.Header.Set("Authorization", "Bearer "+token)
			req.Header.Set("Content-Type", "application/json")
			resp, err := hc.Do(req)
			if err != nil {
				b.Error(err)
				return false
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				msg, _ := io.ReadAll(resp.Body)
				b.Errorf("POST %s: %d %s", path, resp.StatusCode, msg)
				return false
			}
			if out != nil {
				return json.NewDecoder(resp.Body).Decode(out) == nil
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			return true
		}
		var granted struct {
			Epoch int64 `json:"epoch"`
		}
		if !post("", map[string]any{"tabId": "tab-1", "ttlMs": 60000}, &granted) {
			return
		}
		renew := map[string]any{"tabId": "tab-1", "epoch": granted.Epoch, "ttlMs": 60000}
		for pb.Next() {
			if !post("/renew", renew, nil) {
				return
			}
		}
	})
}

// BenchmarkDecodeBody is the strict decoding of the bodies of the lease calls, as the browser
// client writes them.
func BenchmarkDecodeBody(b *testing.B) {
	for _, c := range []struct {
		name string
		data string
		body func() any
	}{
		{"acquire", `{"tabId":"t-Xk3_9aQz-Lm0PqR7sTuVwY","label":"Quarterly report","ttlMs":30000}`, func() any { return &acquireBody{} }},
		{"renew", `{"tabId":"tab-0123456789","epoch":1796280848881387,"ttlMs":30000,"hidden":false}`, func() any { return &renewBody{} }},
		{"release", `{"tabId":"t-Xk3_9aQz-Lm0PqR7sTuVwY","epoch":1796280848881387}`, func() any { return &releaseBody{} }},
		{"check", `{"tabId":"t-Xk3_9aQz-Lm0PqR7sTuVwY","epoch":1796280848881387}`, func() any { return &checkBody{} }},
	} {
		b.Run(c.name, func(b *testing.B) {
			data := []byte(c.data)
			b.ReportAllocs()
			for b.Loop() {
				if err := decodeJSON(data, c.body()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkVerifyAccessToken verifies an HS256 access token: "first" parses and checks it each
// time (a token not seen before), "again" answers from the tokens verified before.
func BenchmarkVerifyAccessToken(b *testing.B) {
	cfg := testAuthConfig()
	token, err := IssueToken(cfg, TokenSpec{Sub: "alice", Sessions: []string{"doc-1"}, TTL: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	for _, again := range []bool{false, true} {
		name := map[bool]string{false: "first", true: "again"}[again]
		b.Run(name, func(b *testing.B) {
			a, err := newAuthenticator(cfg, false, nil)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if !again {
					a.verified = verifiedtokens.Cache[*Principal]{}
				}
				if _, err := a.verify(context.Background(), token); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
