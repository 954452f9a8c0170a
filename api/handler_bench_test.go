package api

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/tablease/tablease/lease/leasemem"
)

// Benchmarks of the api's own work for a renew and an acquire+release: the handler chain served
// in process (no network) on the memory engine, so that the figures are the api layer's cost
// (routing, middleware, auth, decoding, the lease token, the answer, the log line) without the
// network or Redis; and an acquire+release over a lease socket on loopback, the socket's and its
// client's work added. The request log is written, at info level, to io.Discard.
//
//	go test -run XXX -bench 'Handler|OverSocket' -count 10 ./api/ > new.txt

func benchHandler(b *testing.B) (http.Handler, string) {
	b.Helper()
	eng, err := leasemem.New(leasemem.Options{})
	if err != nil {
		b.Fatal(err)
	}
	opts := Options{Engine: eng, Auth: testAuthConfig(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	memoryStores(&opts)
	srv, err := New(opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		srv.Close()
		_ = eng.Close()
	})
	token, err := IssueToken(testAuthConfig(), TokenSpec{Sub: "bench", TTL: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	return srv.Handler(), token
}

func benchPost(b *testing.B, h http.Handler, token, path, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodPost, "/v1/sessions/doc-1/lease"+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != http.StatusOK {
		b.Fatalf("POST %s: %d %s", path, w.Code, w.Body)
	}
	return w
}

// BenchmarkRenewHandler renews one lease again and again.
func BenchmarkRenewHandler(b *testing.B) {
	h, token := benchHandler(b)
	var granted struct {
		Epoch int64 `json:"epoch"`
	}
	w := benchPost(b, h, token, "", `{"tabId":"tab-1","ttlMs":60000}`)
	if err := json.Unmarshal(w.Body.Bytes(), &granted); err != nil {
		b.Fatal(err)
	}
	body, _ := json.Marshal(map[string]any{"tabId": "tab-1", "epoch": granted.Epoch, "ttlMs": 60000})
	b.ReportAllocs()
	for b.Loop() {
		benchPost(b, h, token, "/renew", string(body))
	}
}

// BenchmarkAcquireReleaseHandler acquires a lease and releases it (two requests per op).
func BenchmarkAcquireReleaseHandler(b *testing.B) {
	h, token := benchHandler(b)
	b.ReportAllocs()
	for b.Loop() {
		w := benchPost(b, h, token, "", `{"tabId":"tab-1","ttlMs":60000}`)
		var granted struct {
			Epoch int64 `json:"epoch"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &granted); err != nil {
			b.Fatal(err)
		}
		benchPost(b, h, token, "/release", `{"tabId":"tab-1","epoch":`+jsonInt(granted.Epoch)+`}`)
	}
}

func jsonInt(v int64) string { d, _ := json.Marshal(v); return string(d) }

// BenchmarkAcquireReleaseOverSocket acquires a lease and releases it over one lease socket, as
// the browser client does (two calls per op): the handler chain as above, and the socket's own
// work, with the client's, over loopback TCP.
func BenchmarkAcquireReleaseOverSocket(b *testing.B) {
	h, token := benchHandler(b)
	srv := httptest.NewServer(h)
	b.Cleanup(srv.Close)
	conn, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(srv.URL, "http")+"/v1/socket", nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	call := func(msg string) []byte {
		if err := conn.WriteMessage(websocket.TextMessage, []byte(msg)); err != nil {
			b.Fatal(err)
		}
		_, data, err := conn.ReadMessage()
		if err != nil {
			b.Fatal(err)
		}
		if !bytes.Contains(data, []byte(`"status":200`)) {
			b.Fatalf("%s answered %s", msg, data)
		}
		return data
	}
	call(`{"id":0,"op":"auth","token":"` + token + `"}`)
	b.ReportAllocs()
	for b.Loop() {
		var granted struct {
			Body struct {
				Epoch int64 `json:"epoch"`
			} `json:"body"`
		}
		if err := json.Unmarshal(call(`{"id":1,"op":"acquire","sid":"doc-1","body":{"tabId":"tab-1","ttlMs":60000}}`), &granted); err != nil {
			b.Fatal(err)
		}
		call(`{"id":2,"op":"release","sid":"doc-1","body":{"tabId":"tab-1","epoch":` + jsonInt(granted.Body.Epoch) + `}}`)
	}
}
