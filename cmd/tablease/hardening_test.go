package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
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
	// A request whose line and headers take n bytes in all, the last header padded to fit.
	sized := func(n int) string {
		head := "GET /v1/sessions/doc-1/lease HTTP/1.1\r\nHost: " + strings.TrimPrefix(base, "http://") + "\r\nX-Filler: "
		return head + strings.Repeat("a", n-len(head)-len("\r\n\r\n")) + "\r\n\r\n"
	}
	t.Run("a request line and headers of 16 KiB are served", func(t *testing.T) {
		resp, _ := raw(t, base, sized(16<<10))
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("status %d, want the 401 of a request without a token", resp.StatusCode)
		}
	})
	t.Run("one byte more is refused, in JSON", func(t *testing.T) {
		resp, body := raw(t, base, sized(16<<10+1))
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge || body.Error.Code != "HEADERS_TOO_LARGE" {
			t.Fatalf("status %d, body %+v", resp.StatusCode, body)
		}
	})
	// net/http counts from the first request of a connection only: the next ones are the api's.
	healthz := "GET /healthz HTTP/1.1\r\nHost: " + strings.TrimPrefix(base, "http://") + "\r\n\r\n"
	t.Run("so on a kept-alive connection: 16 KiB are served", func(t *testing.T) {
		resp, _ := raw(t, base, healthz, sized(16<<10))
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("status %d, want the 401 of a request without a token", resp.StatusCode)
		}
	})
	t.Run("and one byte more is refused, in JSON, the connection closed", func(t *testing.T) {
		for _, n := range []int{16<<10 + 1, 18 << 10, 20<<10 - 100} {
			resp, body := raw(t, base, healthz, sized(n))
			if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge || body.Error.Code != "HEADERS_TOO_LARGE" || !resp.Close {
				t.Errorf("%d bytes: status %d, body %+v, connection closed %v", n, resp.StatusCode, body, resp.Close)
			}
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
	base, logs := startServer(t, map[string]string{"TABLEASE_DEV": "true"})
	host := strings.TrimPrefix(base, "http://")
	for _, tt := range []struct{ name, request string }{
		{"a header line without a colon", "GET /healthz HTTP/1.1\r\nHost: " + host + "\r\nno colon here\r\n\r\n"},
		{"a malformed Host", "GET /healthz HTTP/1.1\r\nHost: a b\r\n\r\n"},
		{"a missing Host", "GET /healthz HTTP/1.1\r\n\r\n"},
		{"a bad Content-Length", "POST /v1/sessions/doc-1/lease HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: x\r\n\r\n"},
		{"an unknown transfer coding", "POST /v1/sessions/doc-1/lease HTTP/1.1\r\nHost: " + host + "\r\nTransfer-Encoding: gzip\r\n\r\n"},
		{"a request line of HTTP/2.0", "GET /healthz HTTP/2.0\r\nHost: " + host + "\r\n\r\n"},
		{"the preface of HTTP/2 with prior knowledge", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"},
	} {
		t.Run(tt.name+" gets a JSON 400", func(t *testing.T) {
			resp, body := raw(t, base, tt.request)
			if resp.StatusCode != http.StatusBadRequest || body.Error.Code != "INVALID_ARGUMENT" {
				t.Fatalf("status %d, body %+v", resp.StatusCode, body)
			}
			t.Logf("message: %s", body.Error.Message)
			// Logged like any answer, under the id the answer gave, so that a client's report of it
			// can be found, with the route protocol_error and the address that sent it.
			id := `"request_id":"` + resp.Header.Get("X-Request-ID") + `"`
			deadline := time.Now().Add(5 * time.Second)
			for {
				line := lineWith(logs.String(), id)
				if line != "" {
					if !strings.Contains(line, `"route":"protocol_error"`) || !strings.Contains(line, `"peer":"127.0.0.1"`) {
						t.Fatalf("the log line lacks the route protocol_error or the peer: %s", line)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("no log line with %s:\n%s", id, logs.String())
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	// net/http answers an Expect other than 100-continue by itself, before any handler.
	t.Run("an Expect other than 100-continue gets a JSON 417, logged and counted", func(t *testing.T) {
		resp, body := raw(t, base, "POST /v1/sessions/doc-1/lease HTTP/1.1\r\nHost: "+host+"\r\nExpect: 200-ok\r\nContent-Length: 2\r\n\r\n{}")
		if resp.StatusCode != http.StatusExpectationFailed || body.Error.Code != "EXPECTATION_FAILED" || !resp.Close {
			t.Fatalf("status %d, body %+v, connection closed %v", resp.StatusCode, body, resp.Close)
		}
		id := `"request_id":"` + resp.Header.Get("X-Request-ID") + `"`
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			line := lineWith(logs.String(), id)
			if line != "" {
				if !strings.Contains(line, `"route":"protocol_error"`) || !strings.Contains(line, `"status":417`) || !strings.Contains(line, `"code":"EXPECTATION_FAILED"`) {
					t.Fatalf("the log line: %s", line)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no log line with %s:\n%s", id, logs.String())
			}
		}
		metrics, err := http.Get(base + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer metrics.Body.Close()
		text, _ := io.ReadAll(metrics.Body)
		if !strings.Contains(string(text), `tablease_http_requests_total{method="OTHER",route="protocol_error",status="417"} 1`) {
			t.Fatalf("the 417 is not counted:\n%s", text)
		}
	})
	// net/http reads only the first Expect line, and finds 100-continue among its values: the api
	// refuses what it would otherwise serve as 100-continue alone.
	for _, expect := range []string{"Expect: 100-continue, foo\r\n", "Expect: 100-continue\r\nExpect: foo\r\n"} {
		t.Run(fmt.Sprintf("an Expect of %q gets a JSON 417", expect), func(t *testing.T) {
			resp, body := raw(t, base, "POST /v1/sessions/doc-1/lease HTTP/1.1\r\nHost: "+host+"\r\n"+expect+"Content-Length: 2\r\n\r\n{}")
			if resp.StatusCode != http.StatusExpectationFailed || body.Error.Code != "EXPECTATION_FAILED" || !resp.Close || resp.Header.Get("X-Request-ID") == "" {
				t.Fatalf("status %d, body %+v, connection closed %v, request id %q", resp.StatusCode, body, resp.Close, resp.Header.Get("X-Request-ID"))
			}
		})
	}
	for _, expect := range []string{"Expect: 100-Continue\r\n", "Expect:\r\n", "Expect: 100-continue\r\nExpect: 100-continue\r\n"} {
		t.Run(fmt.Sprintf("an Expect of %q is served", expect), func(t *testing.T) {
			resp, body := raw(t, base, "POST /v1/sessions/doc-1/lease HTTP/1.1\r\nHost: "+host+"\r\n"+expect+"Content-Length: 2\r\n\r\n{}")
			if resp.StatusCode != http.StatusUnauthorized || body.Error.Code != "UNAUTHENTICATED" {
				t.Fatalf("status %d, body %+v; want the 401 of a request without a token", resp.StatusCode, body)
			}
		})
	}
	// A proxy in front that framed a request by its Content-Length would read the rest of the
	// chunked body as a request of its own: net/http serves the request by its Transfer-Encoding,
	// and the connection must close after it, whatever follows on it.
	t.Run("a request with both Content-Length and Transfer-Encoding closes its connection", func(t *testing.T) {
		conn, err := net.Dial("tcp", host)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		smuggled := "POST /v1/sessions/doc-1/lease/release HTTP/1.1\r\nHost: " + host + "\r\nContent-Type: application/json\r\n" +
			"Content-Length: 40\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" +
			"GET /healthz HTTP/1.1\r\nHost: " + host + "\r\n\r\n"
		if _, err := io.WriteString(conn, smuggled); err != nil {
			t.Fatal(err)
		}
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		r := bufio.NewReader(conn)
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || !resp.Close {
			t.Fatalf("status %d, connection closed %v; want the 401 of a request without a token, and the connection closed", resp.StatusCode, resp.Close)
		}
		if rest, err := io.ReadAll(r); err != nil || len(rest) != 0 {
			t.Fatalf("after the answer the connection gave %q (%v); want it closed with nothing more: the GET that followed was served", rest, err)
		}
	})
	t.Run("OPTIONS * gets the JSON 404 of a request of no route", func(t *testing.T) {
		resp, body := raw(t, base, "OPTIONS * HTTP/1.1\r\nHost: "+host+"\r\n\r\n")
		if resp.StatusCode != http.StatusNotFound || body.Error.Code != "NOT_FOUND" {
			t.Fatalf("status %d, body %+v", resp.StatusCode, body)
		}
	})
}

// lineWith is the first line of logs that holds s, or "".
func lineWith(logs, s string) string {
	for line := range strings.Lines(logs) {
		if strings.Contains(line, s) {
			return line
		}
	}
	return ""
}

// errorBody is the JSON shape of every error answer.
type errorBody struct {
	Error struct {
		Code    string
		Message string
	} `json:"error"`
}

// raw sends request as it is to the server at base and reads the answer, which must be a JSON
// error with the headers every answer has; a 401 and a 200 pass with their body unread.
func raw(t *testing.T, base string, requests ...string) (*http.Response, errorBody) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	r := bufio.NewReader(conn)
	var resp *http.Response
	for _, request := range requests {
		if resp != nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		if _, err := io.WriteString(conn, request); err != nil {
			t.Fatal(err)
		}
		if resp, err = http.ReadResponse(r, nil); err != nil {
			t.Fatal(err)
		}
	}
	defer resp.Body.Close()
	if resp.Header.Get("X-Request-ID") == "" || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("status %d with headers %v: want an X-Request-ID and nosniff", resp.StatusCode, resp.Header)
	}
	var body errorBody
	if resp.StatusCode >= 400 {
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("status %d, Content-Type %q: the body is not a JSON error: %v", resp.StatusCode, resp.Header.Get("Content-Type"), err)
		}
	}
	return resp, body
}
