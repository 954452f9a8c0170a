package browsertest

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

func TestFindChromium(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "chrome")
	if err := os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Run("TABLEASE_CHROMIUM wins", func(t *testing.T) {
		got, err := findChromium(func(k string) string { return map[string]string{"TABLEASE_CHROMIUM": exe}[k] })
		if err != nil || got != exe {
			t.Fatalf("got %q, %v", got, err)
		}
	})
	t.Run("a TABLEASE_CHROMIUM that cannot run is an error, not a fallback", func(t *testing.T) {
		_, err := findChromium(func(k string) string { return map[string]string{"TABLEASE_CHROMIUM": plain}[k] })
		if err == nil || !strings.Contains(err.Error(), "TABLEASE_CHROMIUM") {
			t.Fatalf("err %v", err)
		}
	})
}

func TestTheBrowserLoadsAPageRunsItsModuleAndSavesAScreenshot(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(`<!doctype html><title>t</title><button id="b" type="button">go</button><p id="out"></p>` +
			`<script type="module" src="/m.js"></script>`))
	})
	mux.HandleFunc("/m.js", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/javascript")
		_, _ = w.Write([]byte(`document.getElementById('b').addEventListener('click', () => {` +
			`document.getElementById('out').textContent = 'clicked'; console.log('hello from the page'); });`))
	})
	hs := httptest.NewServer(mux)
	defer hs.Close()

	t.Setenv("TABLEASE_ARTIFACTS", t.TempDir())
	b := Start(t)
	b.Do("open the page", chromedp.Navigate(hs.URL), chromedp.WaitVisible(chromedp.CSS("#b")))
	b.Do("click", chromedp.Click(chromedp.CSS("#b")))
	b.WaitFor("the module to react", `document.getElementById('out').textContent === 'clicked'`, DefaultTimeout)
	if got := Eval[string](b, `document.title`); got != "t" {
		t.Fatalf("title %q", got)
	}
	path := b.Screenshot("page")
	if fi, err := os.Stat(path); err != nil || fi.Size() == 0 || filepath.Dir(path) != os.Getenv("TABLEASE_ARTIFACTS") {
		t.Fatalf("screenshot %q: %v", path, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !slices.ContainsFunc(b.Console(), func(l string) bool { return strings.Contains(l, "hello from the page") }) {
		if time.Now().After(deadline) {
			t.Fatalf("the page's console.log never arrived: %q", b.Console())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestTabsShareTheProfileAndCloseRunsPagehideButCrashDoesNot(t *testing.T) {
	var mu sync.Mutex
	var hidden []string // the tabs whose pagehide sent its keepalive request
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write([]byte(`<!doctype html><title>t</title><script>
			window.heard = [];
			new BroadcastChannel('c').onmessage = (e) => window.heard.push(e.data);
			addEventListener('pagehide', () => fetch('/gone?' + location.hash.slice(1), {method: 'POST', keepalive: true}));
		</script>`))
	})
	mux.HandleFunc("/gone", func(_ http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		hidden = append(hidden, r.URL.RawQuery)
	})
	hs := httptest.NewServer(mux)
	defer hs.Close()
	gone := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(hidden)
	}

	t.Setenv("TABLEASE_ARTIFACTS", t.TempDir())
	b := Start(t)
	tabs := map[string]*Tab{}
	for _, name := range []string{"a", "b", "c"} {
		tabs[name] = b.NewTab(name)
		tabs[name].Do("open the page", chromedp.Navigate(hs.URL+"/#"+name))
	}
	Eval[chromedp.Void](tabs["a"], `new BroadcastChannel('c').postMessage('hello')`)
	tabs["b"].WaitFor("the message of tab a", `window.heard.includes('hello')`, 5*time.Second)
	tabs["c"].WaitFor("the message of tab a", `window.heard.includes('hello')`, 5*time.Second)

	tabs["a"].Crash()
	tabs["b"].Close()
	deadline := time.Now().Add(5 * time.Second)
	for !slices.Equal(gone(), []string{"b"}) {
		if time.Now().After(deadline) {
			t.Fatalf("pagehide requests from %v, want from the closed tab b only", gone())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := Eval[string](tabs["c"], `location.hash`); got != "#c" {
		t.Fatalf("the tab left open answers %q", got)
	}
	if err := tabs["a"].Until(`true`, 500*time.Millisecond); err == nil {
		t.Fatal("the crashed tab still evaluates scripts")
	}
	if gone := gone(); !slices.Equal(gone, []string{"b"}) {
		t.Fatalf("pagehide requests from %v after the crash, want from the closed tab b only", gone)
	}
}
