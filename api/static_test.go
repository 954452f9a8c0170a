package api

import (
	"io/fs"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/tablease/tablease/web"
)

func TestBrowserFilesAreServedWithTheirTypesAndHeaders(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.Demo = true })
	tests := []struct {
		path, contentType string
		csp               bool
	}{
		{"/admin", "text/html; charset=utf-8", true},
		{"/admin/", "text/html; charset=utf-8", true},
		{"/admin/index.html", "text/html; charset=utf-8", true},
		{"/admin/admin.js", "text/javascript; charset=utf-8", true},
		{"/admin/admin.css", "text/css; charset=utf-8", true},
		{"/sdk/tablease.js", "text/javascript; charset=utf-8", false},
		// The modules tablease.js imports, each served beside it.
		{"/sdk/http.js", "text/javascript; charset=utf-8", false},
		{"/sdk/sse.js", "text/javascript; charset=utf-8", false},
		{"/sdk/stream.js", "text/javascript; charset=utf-8", false},
		{"/sdk/socket.js", "text/javascript; charset=utf-8", false},
		{"/sdk/lease.js", "text/javascript; charset=utf-8", false},
		{"/sdk/tools.js", "text/javascript; charset=utf-8", false},
		{"/sdk/route.js", "text/javascript; charset=utf-8", false},
		{"/sdk/call.js", "text/javascript; charset=utf-8", false},
		{"/sdk/tablease.d.ts", "text/plain; charset=utf-8", false},
		{"/demo", "text/html; charset=utf-8", false},
		{"/demo/", "text/html; charset=utf-8", false},
		// The demo's routes answer its page, so that they can be reloaded.
		{"/demo/events", "text/html; charset=utf-8", false},
		{"/demo/events/evt-webmcp-intro", "text/html; charset=utf-8", false},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			rec := h.get(tt.path, "")
			if rec.Code != http.StatusOK || rec.Body.Len() == 0 {
				t.Fatalf("status %d, %d bytes", rec.Code, rec.Body.Len())
			}
			hd := rec.Header()
			if got := hd.Get("Content-Type"); got != tt.contentType {
				t.Fatalf("Content-Type %q, want %q", got, tt.contentType)
			}
			if hd.Get("X-Content-Type-Options") != "nosniff" || hd.Get("Cache-Control") == "" || hd.Get("ETag") == "" {
				t.Fatalf("headers: %v", hd)
			}
			csp := hd.Get("Content-Security-Policy")
			if tt.csp && (!strings.Contains(csp, "default-src 'self'") || strings.Contains(csp, "unsafe-inline") ||
				!strings.Contains(csp, "frame-ancestors 'none'")) {
				t.Fatalf("the admin console needs a strict CSP, got %q", csp)
			}
			rec2 := h.do(request{method: http.MethodGet, path: tt.path, headers: map[string]string{"If-None-Match": hd.Get("ETag")}})
			if rec2.Code != http.StatusNotModified || rec2.Body.Len() != 0 {
				t.Fatalf("a matching If-None-Match answers %d with %d bytes, want 304 and none", rec2.Code, rec2.Body.Len())
			}
		})
	}
	t.Run("HEAD answers like GET", func(t *testing.T) {
		rec := h.do(request{method: http.MethodHead, path: "/admin/admin.js"})
		if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "text/javascript; charset=utf-8" {
			t.Fatalf("%d %v", rec.Code, rec.Header())
		}
	})
	t.Run("the client may be imported from other origins", func(t *testing.T) {
		if got := h.get("/sdk/tablease.js", "").Header().Get("Access-Control-Allow-Origin"); got != "*" {
			t.Fatalf("Access-Control-Allow-Origin %q", got)
		}
	})
}

func TestUnknownBrowserFilesAreJSON404s(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.Demo = true })
	for _, p := range []string{
		"/admin/nope.js",
		"/admin/../server.go",
		"/admin/%2e%2e/web.go",
		"/sdk/",
		"/sdk",
		"/demo/../../go.mod",
		"/demo/nope.js",
		"/admin//admin.js",
		"/admin/events",
	} {
		rec := h.get(p, "")
		if rec.Code != http.StatusNotFound {
			t.Errorf("%s: status %d, want 404", p, rec.Code)
			continue
		}
		wantError(t, rec, http.StatusNotFound, CodeNotFound)
	}
}

// The console runs under default-src 'self': inline script, inline handlers, inline styles and
// javascript: URLs would be blocked, so none may appear.
var scriptTag = regexp.MustCompile(`(?is)<script([^>]*)>(.*?)</script>`)

func TestTheAdminConsoleNeedsNothingInline(t *testing.T) {
	inline := []struct {
		what string
		re   *regexp.Regexp
	}{
		{"an inline event handler", regexp.MustCompile(`(?i)\son[a-z]+\s*=`)},
		{"a style attribute or element", regexp.MustCompile(`(?i)(\sstyle\s*=|<style)`)},
		{"a javascript: URL", regexp.MustCompile(`(?i)javascript:`)},
	}
	err := fs.WalkDir(web.FS(), "admin", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".html") {
			return err
		}
		body, err := fs.ReadFile(web.FS(), p)
		if err != nil {
			return err
		}
		for _, in := range inline {
			if loc := in.re.FindIndex(body); loc != nil {
				t.Errorf("%s has %s: %q", p, in.what, body[loc[0]:min(loc[1]+40, len(body))])
			}
		}
		for _, m := range scriptTag.FindAllSubmatch(body, -1) {
			if !strings.Contains(string(m[1]), "src=") || strings.TrimSpace(string(m[2])) != "" {
				t.Errorf("%s has an inline script: %q", p, m[0])
			}
		}
		if !strings.Contains(string(body), `<script type="module" src="/admin/admin.js">`) {
			t.Errorf("%s does not load /admin/admin.js as a module by its absolute path", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestTheAdminConsoleNeverWritesServerDataAsHTML(t *testing.T) {
	js, err := fs.ReadFile(web.FS(), "admin/admin.js")
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"} {
		if strings.Contains(string(js), bad) {
			t.Errorf("admin.js uses %s: labels and reasons come from users and must go through textContent", bad)
		}
	}
	if strings.Contains(string(js), "localStorage") {
		t.Error("admin.js uses localStorage: the token belongs in sessionStorage only")
	}
}

func TestTheDemoIsServedOnlyInDevModeOrWhenAskedFor(t *testing.T) {
	for _, tt := range []struct {
		name   string
		mod    func(*Options)
		served bool
	}{
		{"a deployment does not serve the demo", func(*Options) {}, false},
		{"Options.Demo serves it", func(o *Options) { o.Demo = true }, true},
		{"dev mode serves it", func(o *Options) { o.Dev = true }, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, tt.mod)
			for _, p := range []string{"/demo", "/demo/", "/demo/demo.js", "/demo/events"} {
				rec := h.get(p, "")
				if !tt.served {
					wantError(t, rec, http.StatusNotFound, CodeNotFound)
					continue
				}
				csp := rec.Header().Get("Content-Security-Policy")
				if rec.Code != http.StatusOK || !strings.Contains(csp, "connect-src 'self'") || strings.Contains(csp, "unsafe-inline") ||
					rec.Header().Get("X-Frame-Options") != "DENY" {
					t.Fatalf("%s: status %d, CSP %q", p, rec.Code, csp)
				}
			}
		})
	}
}
