// Package browsertest runs a real headless Chromium for end-to-end tests of tablease's browser
// pages, through the Chrome DevTools Protocol (chromedp).
//
// A missing browser fails the test with a message that says how to install one; it never skips
// it. The browser is found at $TABLEASE_CHROMIUM, else /usr/bin/chromium, else the first of
// chromium, chromium-browser, google-chrome-stable and google-chrome on PATH. scripts/test (and
// so CI) installs Debian's chromium when it is missing.
//
// Screenshots go to $TABLEASE_ARTIFACTS, else ./artifacts/ beside the test (ignored by git).
package browsertest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// DefaultTimeout bounds one Do when the caller gives no context deadline of its own.
const DefaultTimeout = 20 * time.Second

// Flags are the command-line flags Chromium is started with (besides --user-data-dir and the
// pipe that chromedp adds): headless, no sandbox (containers and CI run as root), no GPU, and
// nothing that reaches the network on its own.
var Flags = []string{
	"headless",
	"no-sandbox",
	"disable-gpu",
	"disable-background-networking",
	"disable-component-update",
	"no-first-run",
	"disable-sync",
	"disable-default-apps",
	"disable-extensions",
	"disable-dev-shm-usage",
	"no-default-browser-check",
	"mute-audio",
	"hide-scrollbars",
}

// Chromium returns the path of the browser, or fails t with how to get one.
func Chromium(t testing.TB) string {
	t.Helper()
	path, err := findChromium(os.Getenv)
	if err != nil {
		t.Fatalf("browsertest: %v", err)
	}
	return path
}

func findChromium(getenv func(string) string) (string, error) {
	if p := getenv("TABLEASE_CHROMIUM"); p != "" {
		if isExecutable(p) {
			return p, nil
		}
		return "", fmt.Errorf("TABLEASE_CHROMIUM=%s is not an executable file", p)
	}
	if isExecutable("/usr/bin/chromium") {
		return "/usr/bin/chromium", nil
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome-stable", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	return "", errors.New("no Chromium found: install it (Debian: apt-get install -y chromium; ./scripts/test does it) " +
		"or set TABLEASE_CHROMIUM to the browser's path. Browser tests never skip")
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// Browser is one headless Chromium with one tab, stopped when the test ends.
type Browser struct {
	t   testing.TB
	ctx context.Context // the tab

	output *lockedBuffer // the browser's stdout and stderr

	mu      sync.Mutex // protects console
	console []string   // what the page wrote to its console, its uncaught exceptions, chromedp's errors
}

// Start starts Chromium. At cleanup it logs the page's console and the browser's output when the
// test failed, and stops the browser.
func Start(t testing.TB) *Browser {
	t.Helper()
	path := Chromium(t)
	dataDir, err := os.MkdirTemp("", "tablease-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	b := &Browser{t: t, output: &lockedBuffer{}}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.UserDataDir(dataDir),
		chromedp.WindowSize(1280, 900),
		chromedp.CombinedOutput(b.output),
	}
	for _, f := range Flags {
		opts = append(opts, chromedp.Flag(f, true))
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(allocCtx, chromedp.WithErrorf(func(format string, args ...any) {
		b.note("chromedp error: " + fmt.Sprintf(format, args...))
	}))
	b.ctx = ctx
	t.Cleanup(func() {
		if t.Failed() {
			b.logDiagnostics()
		}
		stop, cancel := context.WithTimeout(ctx, 10*time.Second)
		_ = chromedp.Cancel(stop) // closes the browser gracefully, waiting for it
		cancel()
		cancelTab()
		cancelAlloc()
		_ = os.RemoveAll(dataDir)
	})

	// The first Do starts the browser and binds it to ctx (which has no deadline); a failure here
	// is the browser failing to start.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("browsertest: starting %s: %v\nbrowser output:\n%s", path, err, b.output)
	}
	msgs := chromedp.Console(ctx)
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			line := fmt.Sprintf("console %s: %s", m.Type, m.Text)
			if m.URL != "" {
				line += " (" + m.URL + ")"
			}
			b.note(line)
		}
	}()
	return b
}

func (b *Browser) note(s string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.console = append(b.console, s)
}

// Console returns what the page wrote to its console so far, one line per message.
func (b *Browser) Console() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.console...)
}

func (b *Browser) logDiagnostics() {
	if lines := b.Console(); len(lines) > 0 {
		b.t.Logf("browser console:\n  %s", strings.Join(lines, "\n  "))
	}
	if out := b.output.String(); out != "" {
		b.t.Logf("browser output (last 4 KiB):\n%s", tail(out, 4<<10))
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// Context is the tab's chromedp context, for chromedp.Do and chromedp.Run.
func (b *Browser) Context() context.Context { return b.ctx }

// Do runs steps in the tab within DefaultTimeout, and fails the test with what as the step's
// name when they fail.
func (b *Browser) Do(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, DefaultTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.Screenshot("failed-" + what)
		b.t.Fatalf("browser: %s: %v", what, err)
	}
}

// Eval evaluates a JavaScript expression in the page and decodes its value into T.
func Eval[T any](b *Browser, expr string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, DefaultTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.t.Fatalf("browser: evaluating %s: %v", expr, err)
	}
	return v
}

// WaitFor polls a JavaScript expression until it is truthy, for at most timeout; what names it
// in the failure, which also shows the page's text.
func (b *Browser) WaitFor(what, expr string, timeout time.Duration) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, timeout+5*time.Second)
	defer cancel()
	_, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr,
		chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(timeout)))
	if err != nil {
		b.Screenshot("failed-" + what)
		text, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
		b.t.Fatalf("browser: waiting for %s: %v\npage text:\n%s", what, err, tail(text, 3000))
	}
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// ArtifactsDir is where tests save artifacts: $TABLEASE_ARTIFACTS, else ./artifacts/ (relative
// to the test's package directory). It is created when missing.
func ArtifactsDir(t testing.TB) string {
	t.Helper()
	dir := os.Getenv("TABLEASE_ARTIFACTS")
	if dir == "" {
		dir = "artifacts"
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("browsertest: artifacts directory: %v", err)
	}
	return dir
}

// Screenshot saves a PNG of the whole page as <test>-<name>.png in ArtifactsDir and returns its
// path. A screenshot that fails is logged, not fatal: it is evidence, not the test.
func (b *Browser) Screenshot(name string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Logf("browser: screenshot %s: %v", name, err)
		return ""
	}
	file := unsafeName.ReplaceAllString(b.t.Name()+"-"+name, "_") + ".png"
	path := filepath.Join(ArtifactsDir(b.t), file)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Logf("browser: saving screenshot: %v", err)
		return ""
	}
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	b.t.Logf("screenshot: %s", path)
	return path
}

// lockedBuffer collects the browser's output, written from the allocator's goroutines.
type lockedBuffer struct {
	mu sync.Mutex // protects b
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() > 1<<20 { // keep the first MiB: enough to see why it failed
		return len(p), nil
	}
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
