package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

func TestHeadersAreBoundedAt16KiB(t *testing.T) {
	base, _ := startServer(t, map[string]string{"TABLEASE_DEV": "true"})
	get := func(t *testing.T, header, value string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, base+"/v1/sessions/doc-1/lease", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(header, value)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	t.Run("a 24 KiB header is refused by the server, in JSON", func(t *testing.T) {
		resp := get(t, "X-Filler", strings.Repeat("a", 24<<10))
		var body struct {
			Error struct{ Code string } `json:"error"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge ||
			body.Error.Code != "HEADERS_TOO_LARGE" || resp.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("status %d, Content-Type %q, code %q, err %v", resp.StatusCode, resp.Header.Get("Content-Type"), body.Error.Code, err)
		}
	})
	t.Run("a 12 KiB Authorization header gets a JSON 401", func(t *testing.T) {
		resp := get(t, "Authorization", "Bearer "+strings.Repeat("a", 12<<10))
		var body struct {
			Error struct{ Code string } `json:"error"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != http.StatusUnauthorized || body.Error.Code != "UNAUTHENTICATED" {
			t.Fatalf("status %d, code %q, err %v", resp.StatusCode, body.Error.Code, err)
		}
	})
}

func TestMalformedRequestsAreAnsweredInJSON(t *testing.T) {
	base, _ := startServer(t, map[string]string{"TABLEASE_DEV": "true"})
	host := strings.TrimPrefix(base, "http://")
	for _, tt := range []struct{ name, request string }{
		{"a header line without a colon", "GET /healthz HTTP/1.1\r\nHost: " + host + "\r\nno colon here\r\n\r\n"},
		{"a malformed Host", "GET /healthz HTTP/1.1\r\nHost: a b\r\n\r\n"},
		{"a missing Host", "GET /healthz HTTP/1.1\r\n\r\n"},
		{"a bad Content-Length", "POST /v1/sessions/doc-1/lease HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: x\r\n\r\n"},
	} {
		t.Run(tt.name+" gets a JSON 400", func(t *testing.T) {
			conn, err := net.Dial("tcp", host)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := io.WriteString(conn, tt.request); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body struct {
				Error struct {
					Code    string
					Message string
				} `json:"error"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != http.StatusBadRequest ||
				body.Error.Code != "INVALID_ARGUMENT" || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("status %d, Content-Type %q, body %+v, err %v", resp.StatusCode, resp.Header.Get("Content-Type"), body, err)
			}
			t.Logf("message: %s", body.Error.Message)
		})
	}
}
