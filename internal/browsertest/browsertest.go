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
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/inspector"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/target"
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

// Browser is one headless Chromium, stopped when the test ends. It starts with one tab, whose
// methods (Do, WaitFor, Screenshot, Context) are the Browser's; NewTab opens more.
type Browser struct {
	*Tab // the first tab

	t testing.TB

	output *lockedBuffer // the browser's stdout and stderr

	mu      sync.Mutex // protects console
	console []string   // what the pages wrote to their consoles, their uncaught exceptions, chromedp's errors
}

// Tab is one tab of a Browser. The tabs of one browser share its profile, as the tabs of one
// user's browser do: localStorage, Web Locks, BroadcastChannel, and the pool of HTTP connections
// (six per origin over HTTP/1.1). In headless Chromium every tab reports itself visible and its
// timers run unthrottled (unless its window is minimised: NewWindow, Minimize), but a tab that is
// not in front does not take mouse input: click with element.click() through Eval rather than
// chromedp.Click.
type Tab struct {
	b    *Browser
	name string // "" for the first tab
	ctx  context.Context
}

// Page is a Browser (its first tab) or a Tab, for Eval.
type Page interface {
	tab() *Tab
}

func (t *Tab) tab() *Tab { return t }

// Start starts Chromium, with Flags and then opts (such as a chromedp.Flag of a test's own). At
// cleanup it logs the page's console and the browser's output when the test failed, and stops the
// browser.
func Start(t testing.TB, opts ...chromedp.ExecAllocatorOption) *Browser {
	t.Helper()
	path := Chromium(t)
	dataDir, err := os.MkdirTemp("", "tablease-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	b := &Browser{t: t, output: &lockedBuffer{}}
	all := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.UserDataDir(dataDir),
		chromedp.WindowSize(1280, 900),
		chromedp.CombinedOutput(b.output),
	}
	for _, f := range Flags {
		all = append(all, chromedp.Flag(f, true))
	}
	all = append(all, opts...)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), all...)
	ctx, cancelTab := chromedp.NewContext(allocCtx, chromedp.WithErrorf(func(format string, args ...any) {
		b.note("chromedp error: " + fmt.Sprintf(format, args...))
	}))
	b.Tab = &Tab{b: b, ctx: ctx}
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
	b.Tab.collectConsole()
	return b
}

// collectConsole notes what the tab writes to its console, until the tab closes.
func (t *Tab) collectConsole() {
	msgs := chromedp.Console(t.ctx)
	prefix := "console "
	if t.name != "" {
		prefix = t.name + ": console "
	}
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			line := fmt.Sprintf("%s%s: %s", prefix, m.Type, m.Text)
			if m.URL != "" {
				line += " (" + m.URL + ")"
			}
			t.b.note(line)
		}
	}()
}

// NewTab opens a new tab (about:blank) in the browser; name tells its console lines and its
// screenshots apart. The tab is closed when the test ends, unless Close or Crash ended it before.
func (b *Browser) NewTab(name string) *Tab {
	b.t.Helper()
	return b.open(name)
}

// NewWindow opens a tab in a window of its own, which Minimize can hide without hiding the others.
func (b *Browser) NewWindow(name string) *Tab {
	b.t.Helper()
	return b.open(name, chromedp.WithNewWindow(true))
}

func (b *Browser) open(name string, opts ...chromedp.ContextOption) *Tab {
	b.t.Helper()
	ctx, cancel := chromedp.NewContext(b.Tab.ctx, opts...)
	// The first Do creates the target and binds it to ctx, which must have no deadline.
	if err := chromedp.Do(ctx); err != nil {
		cancel()
		b.t.Fatalf("browsertest: opening tab %s: %v", name, err)
	}
	t := &Tab{b: b, name: name, ctx: ctx}
	b.t.Cleanup(cancel)
	t.collectConsole()
	return t
}

// Name is the name the tab was opened with ("" for the first tab).
func (t *Tab) Name() string { return t.name }

// Close closes the tab as a user does (Page.close): the page's pagehide and unload handlers run,
// and requests they send with keepalive go out. It returns once the tab is gone.
func (t *Tab) Close() {
	b := t.b
	b.t.Helper()
	ctx, cancel := context.WithTimeout(t.ctx, DefaultTimeout)
	defer cancel()
	id := chromedp.FromContext(t.ctx).Target.TargetID
	if _, err := chromedp.Call(ctx, page.Close, cdp.Empty{}); err != nil {
		b.t.Fatalf("browser: closing tab %s: %v", t.name, err)
	}
	for {
		infos, err := chromedp.Targets(ctx)
		if err != nil {
			b.t.Fatalf("browser: closing tab %s: listing targets: %v", t.name, err)
		}
		if !slices.ContainsFunc(infos, func(i *target.Info) bool { return i.TargetID == id }) {
			return
		}
		select {
		case <-ctx.Done():
			b.t.Fatalf("browser: tab %s was still open %v after Page.close", t.name, DefaultTimeout)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Crash kills the tab's renderer (Page.crash), as an out-of-memory kill or a crash does: no
// pagehide, no unload, no request goes out. The browser frees what the tab held (its Web Locks,
// its connections). It returns once the browser reports the crash; the tab answers nothing after.
func (t *Tab) Crash() {
	b := t.b
	b.t.Helper()
	ctx, cancel := context.WithTimeout(t.ctx, DefaultTimeout)
	defer cancel()
	crashed := chromedp.Events(ctx, inspector.TargetCrashed)
	// Page.crash never answers: the renderer that would answer is gone.
	go func() { _, _ = chromedp.Call(ctx, page.Crash, cdp.Empty{}) }()
	for _, err := range crashed {
		if err != nil {
			b.t.Fatalf("browser: crashing tab %s: %v", t.name, err)
		}
		return
	}
	b.t.Fatalf("browser: tab %s did not crash within %v", t.name, DefaultTimeout)
}

// Freeze freezes the tab's page as Chrome freezes a background tab to save power
// (Page.setWebLifecycleState frozen): the page's freeze event runs, then its timers and tasks stop
// until Resume, and BroadcastChannel messages sent to it wait for Resume too. What the tab holds
// stays held: its Web Locks (the tabs waiting for them keep waiting), its connections. Eval still
// answers while the page is frozen, but a promise that needs one of its tasks waits for Resume.
func (t *Tab) Freeze() {
	t.b.t.Helper()
	t.setLifecycle("freezing", page.SetWebLifecycleStateStateFrozen)
}

// Resume makes a frozen page active again (Page.setWebLifecycleState active): its resume event
// runs, then what waited for it.
func (t *Tab) Resume() {
	t.b.t.Helper()
	t.setLifecycle("resuming", page.SetWebLifecycleStateStateActive)
}

func (t *Tab) setLifecycle(what string, state page.SetWebLifecycleStateState) {
	b := t.b
	b.t.Helper()
	ctx, cancel := context.WithTimeout(t.ctx, DefaultTimeout)
	defer cancel()
	if _, err := chromedp.Call(ctx, page.SetWebLifecycleState, page.SetWebLifecycleStateParams{State: state}); err != nil {
		b.t.Fatalf("browser: %s tab %s: %v", what, t.name, err)
	}
}

// Minimize minimises the tab's window (open it with NewWindow, or every tab of the first window
// goes with it), as a user does: the page turns hidden (visibilitychange) and Chromium throttles
// its timers to once a second or less, as it does a background tab's. It returns once the page
// reports itself hidden. Restore shows the window again.
func (t *Tab) Minimize() {
	t.b.t.Helper()
	t.setWindowState("minimizing", browser.WindowStateMinimized, "hidden")
}

// Restore shows the window Minimize minimised; it returns once the page reports itself visible.
func (t *Tab) Restore() {
	t.b.t.Helper()
	t.setWindowState("restoring", browser.WindowStateNormal, "visible")
}

func (t *Tab) setWindowState(what string, state browser.WindowState, visibility string) {
	b := t.b
	b.t.Helper()
	ctx, cancel := context.WithTimeout(t.ctx, DefaultTimeout)
	defer cancel()
	w, err := chromedp.Call(ctx, browser.GetWindowForTarget, browser.GetWindowForTargetParams{})
	if err == nil {
		_, err = chromedp.Call(ctx, browser.SetWindowBounds, browser.SetWindowBoundsParams{WindowID: w.WindowID, Bounds: &browser.Bounds{WindowState: state}})
	}
	if err != nil {
		b.t.Fatalf("browser: %s the window of tab %s: %v", what, t.name, err)
	}
	t.WaitFor("the page to be "+visibility, fmt.Sprintf("document.visibilityState === %q", visibility), DefaultTimeout)
}

// SetOffline cuts the tab off the network (true) or connects it again (false), as a lost Wi-Fi
// does: every new request of the tab fails at once while it is offline
// (Network.emulateNetworkConditionsByRule with one rule for every URL), and navigator.onLine
// follows, with the window's offline and online events (Network.overrideNetworkState). A response
// already open (an event stream) is not broken: it stays open, and what the server sends on it may
// still arrive (to silence it, cut the connection itself: a proxy that stops forwarding). The
// emulation is the tab's own; other tabs keep their network.
func (t *Tab) SetOffline(offline bool) {
	b := t.b
	b.t.Helper()
	ctx, cancel := context.WithTimeout(t.ctx, DefaultTimeout)
	defer cancel()
	cond := &network.Conditions{Offline: offline, DownloadThroughput: -1, UploadThroughput: -1}
	if _, err := chromedp.Call(ctx, network.EmulateNetworkConditionsByRule,
		network.EmulateNetworkConditionsByRuleParams{MatchedNetworkConditions: []*network.Conditions{cond}}); err != nil {
		b.t.Fatalf("browser: tab %s offline=%v: %v", t.name, offline, err)
	}
	if _, err := chromedp.Call(ctx, network.OverrideNetworkState,
		network.OverrideNetworkStateParams{Offline: offline, DownloadThroughput: -1, UploadThroughput: -1}); err != nil {
		b.t.Fatalf("browser: tab %s navigator.onLine=%v: %v", t.name, !offline, err)
	}
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
func (t *Tab) Context() context.Context { return t.ctx }

// Do runs steps in the tab within DefaultTimeout, and fails the test with what as the step's
// name when they fail.
func (t *Tab) Do(what string, steps ...chromedp.Action[chromedp.Void]) {
	t.b.t.Helper()
	ctx, cancel := context.WithTimeout(t.ctx, DefaultTimeout)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Screenshot("failed-" + what)
		t.b.t.Fatalf("browser: %s%s: %v", t.label(), what, err)
	}
}

func (t *Tab) label() string {
	if t.name == "" {
		return ""
	}
	return "tab " + t.name + ": "
}

// Eval evaluates a JavaScript expression in the page and decodes its value into T. A promise is
// awaited.
func Eval[T any](p Page, expr string) T {
	t := p.tab()
	t.b.t.Helper()
	v, err := TryEval[T](p, expr, DefaultTimeout)
	if err != nil {
		t.b.t.Fatalf("browser: %sevaluating %s: %v", t.label(), expr, err)
	}
	return v
}

// TryEval is Eval that returns the error (an exception thrown by expr, or no answer within
// timeout) instead of failing the test.
func TryEval[T any](p Page, expr string, timeout time.Duration) (T, error) {
	ctx, cancel := context.WithTimeout(p.tab().ctx, timeout)
	defer cancel()
	return chromedp.Run(ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
}

// WaitFor evaluates a JavaScript expression every 50 ms until it is truthy, for at most timeout;
// what names it in the failure, which also shows the page's text and saves a screenshot. An
// expression that throws (window.app not defined yet) counts as false; a promise counts by what
// it resolves to. The polling runs from the test, not in the page, so it survives navigations
// and does not depend on the page's timers.
func (t *Tab) WaitFor(what, expr string, timeout time.Duration) {
	t.b.t.Helper()
	if err := t.Until(expr, timeout); err != nil {
		t.Screenshot("failed-" + what)
		text, _ := TryEval[string](t, `document.body ? document.body.innerText : ""`, 5*time.Second)
		t.b.t.Fatalf("browser: %swaiting for %s: %v\npage text:\n%s", t.label(), what, err, tail(text, 3000))
	}
}

// Until is WaitFor that returns nil once expr is truthy, or an error naming the expression and
// its last exception once timeout has passed, instead of failing the test.
func (t *Tab) Until(expr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := TryEval[bool](t, "Promise.resolve((\n"+expr+"\n)).then(Boolean)", max(time.Until(deadline), 100*time.Millisecond))
		if err == nil && ok {
			return nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = errors.New("still false")
			}
			return fmt.Errorf("%s after %v: %w", expr, timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
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

// Screenshot saves a PNG of the whole page as <test>-<name>.png in ArtifactsDir (with the tab's
// name before <name> for a tab from NewTab) and returns its path. A screenshot that fails is
// logged, not fatal: it is evidence, not the test.
func (t *Tab) Screenshot(name string) string {
	b := t.b
	b.t.Helper()
	ctx, cancel := context.WithTimeout(t.ctx, 10*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Logf("browser: %sscreenshot %s: %v", t.label(), name, err)
		return ""
	}
	if t.name != "" {
		name = t.name + "-" + name
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
