package main

import (
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tablease/tablease/internal/browsertest"
	"github.com/tablease/tablease/internal/redistest"
)

// The README's complete page, as written, in two tabs of one browser: only its tablease URL is
// pointed at a test server, and its page's origin (another origin than tablease's) answers its
// token endpoint. The first tab is owner and hides the banner; the second is a viewer and shows
// it, and its "Use here" moves control; a tab handing control over hides it too; a problem the
// client reports is shown until tablease answers the tab again. A newcomer copies this page first.
func TestTheReadmePageWorksAsWritten(t *testing.T) {
	browsertest.Chromium(t)
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	page := readmeBlock(t, string(readme), "A complete page", "```html\n")
	const readmeBase = "https://lease.example.com"
	if !strings.Contains(page, readmeBase) || !strings.Contains(page, `"/auth/tablease-token"`) {
		t.Fatalf("the README's page no longer names %s and /auth/tablease-token; update this test:\n%s", readmeBase, page)
	}

	rds := redistest.Start(t)
	// The page as written, and one line more that lets the test reach its lease.
	const hook = "window.testLease = lease;\n  </script>"
	_, origin := startOtherOrigin(t, rds, true, "/auth/tablease-token", func(base string) string {
		return strings.Replace(strings.ReplaceAll(page, readmeBase, base), "</script>", hook, 1)
	})

	const (
		owner  = `document.body.dataset.role === 'owner' && document.getElementById('banner').hidden`
		viewer = `document.body.dataset.role === 'viewer' && !document.getElementById('banner').hidden`
	)
	b := browsertest.Start(t)
	first := b.NewTab("first")
	first.Do("open the README's page", chromedp.Navigate(origin+"/"))
	if err := first.Until(owner, 15*time.Second); err != nil {
		t.Fatalf("the first tab is not owner with the banner hidden: %v", err)
	}
	second := b.NewTab("second")
	second.Do("open the README's page again", chromedp.Navigate(origin+"/"))
	if err := second.Until(viewer, 15*time.Second); err != nil {
		t.Fatalf("the second tab is not a viewer showing the banner (its Use here button): %v", err)
	}
	browsertest.Eval[chromedp.Void](second, `document.querySelector('[data-action=use-here]').click()`)
	if err := second.Until(owner, 10*time.Second); err != nil {
		t.Fatalf("Use here did not make the second tab owner: %v", err)
	}
	if err := first.Until(viewer, 10*time.Second); err != nil {
		t.Fatalf("the first tab does not show the banner after the second took control: %v", err)
	}

	// A handoff the first tab asks for while the second runs a guarded call: the second lets go
	// once the call ends, and until then is handing control over, not controlled in another tab.
	browsertest.Eval[chromedp.Void](second, `void window.testLease.guard(() => new Promise((r) => { window.endCall = r; }))()`)
	browsertest.Eval[chromedp.Void](first, `void window.testLease.requestHandoff()`)
	if err := second.Until(`window.testLease.handoff === 'releasing'`, 10*time.Second); err != nil {
		t.Fatalf("the second tab is not handing over: %v", err)
	}
	if hidden := browsertest.Eval[bool](second, `document.getElementById('banner').hidden`); !hidden {
		t.Fatal("the tab handing control over says it is controlled in another tab")
	}
	browsertest.Eval[chromedp.Void](second, `window.endCall()`)
	if err := first.Until(owner, 15*time.Second); err != nil {
		t.Fatalf("the handoff did not make the first tab owner: %v", err)
	}
	if err := second.Until(viewer, 10*time.Second); err != nil {
		t.Fatalf("the second tab does not show the banner once the first has control: %v", err)
	}

	// A problem the client reports (as it does when getToken fails, while the stream stays up) is
	// over at the next answer of tablease to the tab.
	browsertest.Eval[chromedp.Void](first, `window.testLease.dispatchEvent(new CustomEvent('error', {detail: {error: new Error('token endpoint: 500')}}))`)
	if err := first.Until(`!document.getElementById('problem').hidden`, 5*time.Second); err != nil {
		t.Fatalf("the page does not show the problem the client reported: %v", err)
	}
	browsertest.Eval[chromedp.Void](first, `window.testLease.refresh()`)
	if err := first.Until(`document.getElementById('problem').hidden`, 10*time.Second); err != nil {
		t.Fatalf("the page still shows a problem after tablease answered the tab: %v", err)
	}

	// tablease cannot be reached as the page loads: the client's module does not load, and the
	// page says so rather than stay a viewer that says nothing.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	_, deadOrigin := startOtherOrigin(t, rds, true, "/auth/tablease-token", func(string) string {
		return strings.ReplaceAll(page, readmeBase, dead)
	})
	third := b.NewTab("third")
	third.Do("open the README's page with tablease unreachable", chromedp.Navigate(deadOrigin+"/"))
	if err := third.Until(`!document.getElementById('problem').hidden && document.getElementById('problem').textContent.includes('did not load')`, 15*time.Second); err != nil {
		t.Fatalf("the page does not say that the client did not load: %v", err)
	}
}

// readmeBlock is the first fenced block opening with fence after the line holding marker in doc.
func readmeBlock(t *testing.T, doc, marker, fence string) string {
	t.Helper()
	_, after, ok := strings.Cut(doc, marker)
	if !ok {
		t.Fatalf("the README has no %q", marker)
	}
	_, block, ok := strings.Cut(after, fence)
	if !ok {
		t.Fatalf("no %q block after %q in the README", fence, marker)
	}
	block, _, ok = strings.Cut(block, "\n```")
	if !ok {
		t.Fatalf("the %q block after %q does not end", fence, marker)
	}
	return block
}
