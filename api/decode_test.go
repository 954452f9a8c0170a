package api

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestStrictDecoding(t *testing.T) {
	h := newHarness(t)
	alice := h.token("alice")
	held := readLease(t, h.post(leasePath("doc-1"), alice, `{"tabId":"tab-a"}`))
	epoch := held.Epoch

	pad := func(n int) string { return `{"tabId":"tab-a","label":"` + strings.Repeat("x", n) + `"}` }
	tests := []struct {
		name        string
		path        string // default: acquire on doc-1
		body        string
		contentType string // default application/json
		secondType  string // a second Content-Type header, when set
		encoding    string // Content-Encoding, when set
		status      int
		code        string
		field       string // details.field, when one is to blame
	}{
		{name: "an unknown field is refused", body: `{"tabId":"tab-a","color":"red"}`, status: 400, code: CodeInvalidArgument, field: "color"},
		{name: "a field spelt in another case is refused", body: `{"TABID":"tab-a"}`, status: 400, code: CodeInvalidArgument, field: "TABID"},
		{name: "a field given twice is refused", body: `{"tabId":"tab-a","tabId":"tab-b"}`, status: 400, code: CodeInvalidArgument, field: "tabId"},
		{name: "a tabId that is a number is refused", body: `{"tabId":5}`, status: 400, code: CodeInvalidArgument, field: "tabId"},
		{name: "hidden as a string is refused", body: `{"tabId":"tab-a","hidden":"yes"}`, status: 400, code: CodeInvalidArgument, field: "hidden"},
		{name: "a fractional ttlMs is refused", body: `{"tabId":"tab-a","ttlMs":1500.5}`, status: 400, code: CodeInvalidArgument, field: "ttlMs"},
		{name: "a ttlMs with an exponent is refused", body: `{"tabId":"tab-a","ttlMs":1e4}`, status: 400, code: CodeInvalidArgument, field: "ttlMs"},
		{name: "a ttlMs in a string is refused", body: `{"tabId":"tab-a","ttlMs":"45000"}`, status: 400, code: CodeInvalidArgument, field: "ttlMs"},
		{name: "a negative ttlMs is refused", body: `{"tabId":"tab-a","ttlMs":-1}`, status: 400, code: CodeInvalidArgument, field: "ttlMs"},
		{name: "a ttlMs beyond int64 is refused", body: `{"tabId":"tab-a","ttlMs":99999999999999999999}`, status: 400, code: CodeInvalidArgument, field: "ttlMs"},
		{name: "a zero ttlMs asks for the default", body: `{"tabId":"tab-a","ttlMs":0}`, status: 200},
		{name: "a null ttlMs is refused", body: `{"tabId":"tab-a","ttlMs":null}`, status: 400, code: CodeInvalidArgument, field: "ttlMs"},
		{name: "a null hidden is refused", body: `{"tabId":"tab-a","hidden": null}`, status: 400, code: CodeInvalidArgument, field: "hidden"},
		{name: "a null label is refused", body: `{"tabId":"tab-a","label":null}`, status: 400, code: CodeInvalidArgument, field: "label"},
		{name: "a null mode is refused", body: `{"tabId":"tab-a","mode":null}`, status: 400, code: CodeInvalidArgument, field: "mode"},
		{name: "an empty mode is refused", body: `{"tabId":"tab-a","mode":""}`, status: 400, code: CodeInvalidArgument, field: "mode"},
		{name: "a null epoch is refused", path: leasePath("doc-1") + "/renew", body: `{"tabId":"tab-a","epoch":null}`, status: 400, code: CodeInvalidArgument, field: "epoch"},
		{name: "invalid UTF-8 is refused", body: "{\"tabId\":\"tab-a\",\"label\":\"\xff\"}", status: 400, code: CodeInvalidArgument},
		{name: "a label in UTF-8 is accepted", body: `{"tabId":"tab-a","label":"Café ☕"}`, status: 200},
		{name: "a lone surrogate escaped is refused", body: `{"tabId":"tab-a","label":"\udead"}`, status: 400, code: CodeInvalidArgument},
		{name: "a surrogate pair escaped is accepted", body: `{"tabId":"tab-a","label":"\ud83d\ude00"}`, status: 200},
		{name: "trailing garbage is refused", body: `{"tabId":"tab-a"} x`, status: 400, code: CodeInvalidArgument},
		{name: "a second object is refused", body: `{"tabId":"tab-a"}{"tabId":"tab-a"}`, status: 400, code: CodeInvalidArgument},
		{name: "trailing whitespace is fine", body: "{\"tabId\":\"tab-a\"}\n\t ", status: 200},
		{name: "an empty body is refused", body: ``, status: 400, code: CodeInvalidArgument},
		{name: "a truncated body is refused", body: `{"tabId":"tab-a"`, status: 400, code: CodeInvalidArgument},
		{name: "an array body is refused", body: `[{"tabId":"tab-a"}]`, status: 400, code: CodeInvalidArgument},
		{name: "a text/plain body is refused", body: `{"tabId":"tab-a"}`, contentType: "text/plain", status: 400, code: CodeInvalidArgument},
		{name: "a JSON body with a charset is accepted", body: `{"tabId":"tab-a"}`, contentType: "application/json; charset=utf-8", status: 200},
		{name: "a second Content-Type is refused", body: `{"tabId":"tab-a"}`, secondType: "text/plain", status: 400, code: CodeInvalidArgument},
		{name: "a second Content-Type, JSON too, is refused", body: `{"tabId":"tab-a"}`, secondType: "application/json", status: 400, code: CodeInvalidArgument},
		{name: "a JSON body in another charset is refused", body: `{"tabId":"tab-a"}`, contentType: "application/json; charset=latin1", status: 400, code: CodeInvalidArgument},
		{name: "a body of 17 KiB is too large", body: pad(17 << 10), status: 413, code: CodePayloadTooLarge},
		{name: "a body just under 16 KiB reaches validation", body: pad(16<<10 - 40), status: 400, code: CodeInvalidArgument, field: "label"},
		{name: "a label over 200 characters is refused", body: pad(201), status: 400, code: CodeInvalidArgument, field: "label"},
		{name: "a label with a control character is refused", body: `{"tabId":"tab-a","label":"a\u0007b"}`, status: 400, code: CodeInvalidArgument, field: "label"},
		{name: "a missing tabId is refused", body: `{}`, status: 400, code: CodeInvalidArgument, field: "tabId"},
		{name: "a tabId with a slash is refused", body: `{"tabId":"tab/a"}`, status: 400, code: CodeInvalidArgument, field: "tabId"},
		{name: "a tabId of 129 characters is refused", body: `{"tabId":"` + strings.Repeat("t", 129) + `"}`, status: 400, code: CodeInvalidArgument, field: "tabId"},
		{name: "a sid with a space is refused", path: "/v1/sessions/doc%201/lease", body: `{"tabId":"tab-a"}`, status: 400, code: CodeInvalidArgument, field: "sessionId"},
		{name: "a sid of dot-dot is refused", path: "/v1/sessions/../lease", body: `{"tabId":"tab-a"}`, status: 400, code: CodeInvalidArgument, field: "sessionId"},
		{name: "a sid of 129 characters is refused", path: leasePath(strings.Repeat("s", 129)), body: `{"tabId":"tab-a"}`, status: 400, code: CodeInvalidArgument, field: "sessionId"},
		{name: "an epoch of 0 is refused", path: leasePath("doc-1") + "/renew", body: `{"tabId":"tab-a","epoch":0}`, status: 400, code: CodeInvalidArgument, field: "epoch"},
		{name: "a negative epoch is refused", path: leasePath("doc-1") + "/renew", body: `{"tabId":"tab-a","epoch":-5}`, status: 400, code: CodeInvalidArgument, field: "epoch"},
		{name: "an epoch of 2^53 is refused", path: leasePath("doc-1") + "/renew", body: `{"tabId":"tab-a","epoch":9007199254740992}`, status: 400, code: CodeInvalidArgument, field: "epoch"},
		{name: "a fractional epoch is refused", path: leasePath("doc-1") + "/renew", body: fmt.Sprintf(`{"tabId":"tab-a","epoch":%d.5}`, epoch), status: 400, code: CodeInvalidArgument, field: "epoch"},
		{name: "an epoch in a string is refused", path: leasePath("doc-1") + "/release", body: fmt.Sprintf(`{"tabId":"tab-a","epoch":"%d"}`, epoch), status: 400, code: CodeInvalidArgument, field: "epoch"},
		{name: "a missing epoch is refused", path: leasePath("doc-1") + "/check", body: `{"tabId":"tab-a"}`, status: 400, code: CodeInvalidArgument, field: "epoch"},
		{name: "an epoch of 2^53-1 is a valid number that has lost", path: leasePath("doc-1") + "/check", body: `{"tabId":"tab-a","epoch":9007199254740991}`, status: 409, code: CodeLeaseLost},
		{name: "the current epoch renews", path: leasePath("doc-1") + "/renew", body: fmt.Sprintf(`{"tabId":"tab-a","epoch":%d}`, epoch), status: 200},
		{name: "a bad tabId in the query of get is refused", path: leasePath("doc-1") + "?tabId=a%20b", status: 400, code: CodeInvalidArgument, field: "tabId"},
		{name: "a malformed escape in the query is refused", path: leasePath("doc-1") + "?tabId=tab-a%zz", status: 400, code: CodeInvalidArgument},
		{name: "a semicolon in the query is refused", path: leasePath("doc-1") + "?tabId=tab-a;x=1", status: 400, code: CodeInvalidArgument},
		{name: "a query parameter given twice is refused", path: leasePath("doc-1") + "?tabId=tab-a&tabId=tab-b", status: 400, code: CodeInvalidArgument, field: "tabId"},
		{name: "a compressed body is refused", body: `{"tabId":"tab-a"}`, encoding: "gzip", status: 400, code: CodeInvalidArgument},
		{name: "a body of identity encoding is accepted", body: `{"tabId":"tab-a"}`, encoding: "identity", status: 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := tt.path
			if path == "" {
				path = leasePath("doc-1")
			}
			method := http.MethodPost
			if tt.body == "" && strings.Contains(path, "?") {
				method = http.MethodGet
			}
			ct := tt.contentType
			if ct == "" {
				ct = "application/json"
			}
			headers := map[string]string{"Content-Type": ct}
			if tt.encoding != "" {
				headers["Content-Encoding"] = tt.encoding
			}
			var also http.Header
			if tt.secondType != "" {
				also = http.Header{"Content-Type": {tt.secondType}}
			}
			rec := h.do(request{method: method, path: path, token: alice, body: tt.body, headers: headers, also: also})
			if tt.status == 200 {
				if rec.Code != 200 {
					t.Fatalf("status %d: %s", rec.Code, rec.Body)
				}
				return
			}
			e := wantError(t, rec, tt.status, tt.code)
			if tt.field != "" && e.Error.Details["field"] != tt.field {
				t.Fatalf("details.field = %v, want %q (message %q)", e.Error.Details["field"], tt.field, e.Error.Message)
			}
		})
	}
}

func TestBodyLimitWithoutContentLength(t *testing.T) {
	h := newHarness(t)
	body := `{"tabId":"tab-a","label":"` + strings.Repeat("x", 17<<10) + `"}`
	req := httptest.NewRequest(http.MethodPost, leasePath("doc-1"), io.MultiReader(strings.NewReader(body)))
	req.ContentLength = -1 // as for a chunked request: only the reader can tell
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+h.token("alice"))
	rec := httptest.NewRecorder()
	h.srv.Handler().ServeHTTP(rec, req)
	wantError(t, rec, http.StatusRequestEntityTooLarge, CodePayloadTooLarge)
}

// TestABodyThatDoesNotArriveWithinTheReadTimeoutIs408: a client that sends its headers and then
// too little of its body, too slowly, is told the server stopped waiting, not that its body is
// invalid; the lease and the catalog bodies alike.
func TestABodyThatDoesNotArriveWithinTheReadTimeoutIs408(t *testing.T) {
	h := newHarness(t)
	ts := httptest.NewUnstartedServer(h.srv.Handler())
	ts.Config.ReadTimeout = 300 * time.Millisecond
	ts.Listener = h.srv.ProtocolErrors(ts.Listener)
	ts.Start()
	t.Cleanup(ts.Close)
	for _, req := range []struct{ method, path, token string }{
		{"POST", leasePath("doc-1"), h.token("alice")},
		{"PUT", "/v1/admin/catalog", h.adminToken("root")},
	} {
		conn, err := net.Dial("tcp", ts.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		_, err = fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: tablease\r\nAuthorization: Bearer %s\r\n"+
			"Content-Type: application/json\r\nIf-Match: *\r\nContent-Length: 40\r\n\r\n{\"tab", req.method, req.path, req.token)
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%s %s: no answer: %v", req.method, req.path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(body), `"code":"REQUEST_TIMEOUT"`) {
			t.Errorf("%s %s with a body that stopped coming: %d %s, want 408 REQUEST_TIMEOUT", req.method, req.path, resp.StatusCode, body)
		}
		_ = conn.Close()
	}
}

// TestABodyCutShortIs400: a client that closes its side of the connection before all the bytes its
// Content-Length promised is told its body could not be read.
func TestABodyCutShortIs400(t *testing.T) {
	h := newHarness(t)
	ts := httptest.NewUnstartedServer(h.srv.Handler())
	ts.Listener = h.srv.ProtocolErrors(ts.Listener)
	ts.Start()
	t.Cleanup(ts.Close)
	conn, err := net.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: tablease\r\nAuthorization: Bearer %s\r\n"+
		"Content-Type: application/json\r\nContent-Length: 40\r\n\r\n{\"tabId\":\"tab-1\"}", leasePath("doc-1"), h.token("alice"))
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "request body could not be read") {
		t.Errorf("a body cut short: %d %s, want 400 saying it could not be read", resp.StatusCode, body)
	}
}

// TestUnknownQueryParametersAreRefused: a /v1 route refuses a parameter it does not take, as
// unknown body fields are refused, rather than serving the request as if it had none.
func TestUnknownQueryParametersAreRefused(t *testing.T) {
	h := newHarness(t)
	tok := h.token("alice")
	if rec := h.post("/v1/sessions/doc-1/lease", tok, `{"tabId":"tab-1"}`); rec.Code != http.StatusOK {
		t.Fatalf("acquire: %d %s", rec.Code, rec.Body)
	}
	h.putTab(tok, "doc-1", "tab-2", `{"seq":5}`)
	for _, r := range h.srv.echo.Routes() {
		if !strings.HasPrefix(r.Path, "/v1/") || !slices.Contains([]string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodDelete}, r.Method) {
			continue
		}
		path := echoParam.ReplaceAllStringFunc(r.Path, func(p string) string {
			return map[string]string{":sid": "doc-1", ":sub": "alice", ":tabId": "tab-2"}[p]
		})
		rec := h.do(request{method: r.Method, path: path + "?tabid=tab-1", token: tok})
		if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), `"field":"tabid"`) {
			t.Errorf("%s %s?tabid=tab-1: %d %s; want 400 naming tabid", r.Method, path, rec.Code, rec.Body)
		}
	}
	// A misspelled seq does not delete the entry as an unnumbered DELETE would.
	rec := h.do(request{method: http.MethodDelete, path: "/v1/sessions/doc-1/tabs/tab-2?Seq=9", token: tok})
	if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "which takes seq") {
		t.Fatalf("DELETE ?Seq=9: %d %s", rec.Code, rec.Body)
	}
	if tabs := h.listTabs(tok, "doc-1"); len(tabs) != 1 {
		t.Fatalf("tabs after the refused DELETE: %+v", tabs)
	}
	// The parameters a route takes are served, and credentials are left to authentication.
	if rec := h.get("/v1/sessions/doc-1/lease?tabId=tab-1", tok); rec.Code != http.StatusOK {
		t.Fatalf("GET …/lease?tabId=: %d %s", rec.Code, rec.Body)
	}
	if rec := h.get("/v1/sessions/doc-1/lease?access_token=x", tok); rec.Code != http.StatusUnauthorized {
		t.Fatalf("GET …/lease?access_token=: %d %s", rec.Code, rec.Body)
	}
}

// TestOpenAPIQueryParametersAreThoseTheRoutesTake: the query parameters openapi.yaml gives each
// /v1 operation are those strictQuery lets through (queryParams).
func TestOpenAPIQueryParametersAreThoseTheRoutesTake(t *testing.T) {
	spec := loadSpec(t)
	paths, _ := spec.doc["paths"].(map[string]any)
	documented := map[string][]string{}
	for p, ops := range paths {
		if !strings.HasPrefix(p, "/v1/") {
			continue
		}
		item := ops.(map[string]any)
		shared, _ := item["parameters"].([]any) // the path's own, for each of its operations
		for method, op := range item {
			o, ok := op.(map[string]any)
			if !ok {
				continue
			}
			own, _ := o["parameters"].([]any)
			params := append(slices.Clip(shared), own...)
			var names []string
			for _, param := range params {
				pm := param.(map[string]any)
				if ref, ok := pm["$ref"].(string); ok {
					v, ok := spec.lookup(strings.Split(strings.TrimPrefix(ref, "#/"), "/")...)
					if !ok {
						t.Fatalf("%s %s: no %s", method, p, ref)
					}
					pm = v.(map[string]any)
				}
				if pm["in"] == "query" {
					names = append(names, pm["name"].(string))
				}
			}
			if len(names) > 0 {
				route := regexp.MustCompile(`\{([A-Za-z0-9_]+)\}`).ReplaceAllString(p, ":$1")
				slices.Sort(names)
				documented[strings.ToUpper(method)+" "+route] = names
			}
		}
	}
	for route, names := range queryParams {
		want := slices.Sorted(slices.Values(names))
		if !slices.Equal(documented[route], want) {
			t.Errorf("%s takes %v; openapi.yaml documents %v", route, want, documented[route])
		}
	}
	for route, names := range documented {
		if _, ok := queryParams[route]; !ok {
			t.Errorf("openapi.yaml documents %v for %s, which takes none", names, route)
		}
	}
}
