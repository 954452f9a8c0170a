package main

import (
	"encoding/json"
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
	t.Run("a 24 KiB header is refused by the server", func(t *testing.T) {
		if resp := get(t, "X-Filler", strings.Repeat("a", 24<<10)); resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Fatalf("status %d, want 431", resp.StatusCode)
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
