package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tablease/tablease/internal/browsertest"
)

func TestTheDemoIsServedInDevModeOrWhenAskedFor(t *testing.T) {
	prod := map[string]string{
		"TABLEASE_JWT_HS256_SECRET": testSecret,
		"TABLEASE_JWT_ISSUER":       "e2e-idp",
		"TABLEASE_JWT_AUDIENCE":     "tablease",
	}
	with := func(extra map[string]string) map[string]string {
		m := map[string]string{}
		for k, v := range prod {
			m[k] = v
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	for _, tt := range []struct {
		name   string
		env    map[string]string
		served bool
	}{
		{"a deployment does not serve the demo", prod, false},
		{"a deployment with TABLEASE_DEMO=true serves it", with(map[string]string{"TABLEASE_DEMO": "true"}), true},
		{"dev mode serves it", map[string]string{"TABLEASE_DEV": "true"}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			base, _ := startServer(t, tt.env)
			for _, path := range []string{"/demo", "/demo/demo.js"} {
				resp, err := http.Get(base + path)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if !tt.served {
					if resp.StatusCode != http.StatusNotFound {
						t.Fatalf("%s: status %d, want 404", path, resp.StatusCode)
					}
					continue
				}
				csp := resp.Header.Get("Content-Security-Policy")
				if resp.StatusCode != http.StatusOK || !strings.Contains(csp, "connect-src 'self'") ||
					!strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") {
					t.Fatalf("%s: status %d, CSP %q", path, resp.StatusCode, csp)
				}
			}
		})
	}
}

func TestTheDemoTalksOnlyToItsOwnOrigin(t *testing.T) {
	var foreign atomic.Int64
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		foreign.Add(1)
		w.Header().Set("Access-Control-Allow-Origin", "*")
		http.Error(w, "not here", http.StatusTeapot)
	}))
	t.Cleanup(other.Close)
	base, _ := startServer(t, map[string]string{"TABLEASE_DEV": "true"})

	b := browsertest.Start(t)
	tab := b.NewTab("demo")
	tab.Do("open the demo with a base of another origin", chromedp.Navigate(base+"/demo?session=base-check&base="+other.URL))
	tab.WaitFor("the demo to get its token from its own server and hold the lease",
		`window.tablease && tablease.streamLive && tablease.role === 'owner'`, 15*time.Second)
	if n := foreign.Load(); n != 0 {
		t.Fatalf("the other origin got %d requests", n)
	}
}
