package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/tablease/tablease/internal/browsertest"
	"github.com/tablease/tablease/internal/redistest"
)

// TestClientUnderBrowserLifecycles runs the browser client (web/sdk/tablease.js) through what a
// browser does to its tabs besides opening and closing them: freezing the tab that carries the
// shared event stream, crashing it, cutting a tab off the network, serving the app from another
// origin, and a guarded mutation that never ends. Each subtest has its own server, browser and
// session, and the default TTL (45 s) unless it says otherwise: within the bounds below a tab can
// learn of a takeover only through the event stream, not from its next renew (every 15 s).
//
// The bounds are the client's promises: after a takeover made elsewhere every tab that is not
// frozen shows the new holder, and an owner tab refuses mutations, within two seconds, even when
// the tab that carries the stream is frozen; a resumed tab is read-only until the server has
// confirmed it.
func TestClientUnderBrowserLifecycles(t *testing.T) {
	browsertest.Chromium(t) // fail first, and clearly, when there is no browser
	rds := redistest.Start(t)

	t.Run("an owner tab behind a frozen carrier refuses mutations and shows the new holder within two seconds of a takeover made elsewhere", func(t *testing.T) {
		const session = "frozen-carrier-owner"
		srv := startDemoServer(t, rds, nil)
		carrier, owner := ownerBehindCarrier(t, srv, browsertest.Start(t), session)
		srv.mustHold(session, owner.id)
		if got := guardAnswer(owner); got != "ran" {
			t.Fatalf("a guarded mutation in the owner tab answered %s before the takeover, want ran; client: %v", got, lifecycleOf(owner))
		}

		carrier.Freeze()
		took := time.Now()
		srv.takeOverElsewhere(session, elsewhereTab)
		var last string
		refused, ok := within(took, lateBound, func() bool {
			last = guardAnswer(owner)
			return last == "NOT_LEASE_OWNER"
		})
		switch {
		case !ok:
			t.Errorf("the owner tab still answered a guarded mutation with %s %v after the takeover made elsewhere while the carrier was frozen, "+
				"want NOT_LEASE_OWNER within %v; owner: %v; carrier (frozen): %v", last, refused.Round(time.Millisecond), takeoverBound, lifecycleOf(owner), lifecycleOf(carrier))
		case refused > takeoverBound:
			t.Errorf("the owner tab refused its guarded mutation only %v after the takeover made elsewhere while the carrier was frozen, want within %v; owner: %v",
				refused.Round(time.Millisecond), takeoverBound, lifecycleOf(owner))
		default:
			t.Logf("the owner tab refused its guarded mutation %v after the takeover made elsewhere (carrier frozen)", refused.Round(time.Millisecond))
		}
		shown, ok := showsWithin(owner, viewerOfJS(elsewhereTab), took, lateBound)
		switch {
		case !ok:
			t.Errorf("the owner tab does not show %s in control %v after the takeover (carrier frozen); owner: %v",
				elsewhereTab, shown.Round(time.Millisecond), lifecycleOf(owner))
		case shown > takeoverBound:
			t.Errorf("the owner tab showed %s in control only %v after the takeover (carrier frozen), want within %v",
				elsewhereTab, shown.Round(time.Millisecond), takeoverBound)
		}

		carrier.Resume()
		if s := lifecycleOf(carrier); s.Role == "owner" || s.ClientRole == "owner" || s.State == "owner" {
			t.Errorf("the resumed carrier is owner before the server confirmed anything: %v", s)
		}
		if got := guardAnswer(carrier); got == "ran" {
			t.Errorf("the resumed carrier ran a guarded mutation; client: %v", lifecycleOf(carrier))
		}
		if err := carrier.Until(viewerOfJS(elsewhereTab), 5*time.Second); err != nil {
			t.Fatalf("the resumed carrier does not show %s in control: %v; client: %v", elsewhereTab, err, lifecycleOf(carrier))
		}
		if s := lifecycleOf(carrier); s.State != "viewer" {
			t.Errorf("the resumed carrier shows the new holder but tablease.state is %q, want viewer: %v", s.State, s)
		}
	})

	t.Run("a viewer tab behind a frozen carrier shows the new holder within two seconds of a takeover made elsewhere", func(t *testing.T) {
		const session = "frozen-carrier-viewer"
		srv := startDemoServer(t, rds, nil)
		// Another browser of the same user holds the lease before any tab opens: both tabs are viewers.
		srv.takeOverElsewhere(session, "first-browser")
		b := browsertest.Start(t)
		carrier := srv.open(b.NewTab("carrier"), session)
		carrier.WaitFor("the first tab to be a viewer of the other browser", viewerOfJS("first-browser"), 10*time.Second)
		viewer := srv.open(b.NewTab("viewer"), session)
		viewer.WaitFor("the second tab to be a viewer of the other browser", viewerOfJS("first-browser"), 10*time.Second)
		checkCarrier(t, carrier, viewer)

		carrier.Freeze()
		took := time.Now()
		srv.takeOverElsewhere(session, elsewhereTab)
		shown, ok := showsWithin(viewer, viewerOfJS(elsewhereTab), took, lateBound)
		switch {
		case !ok:
			t.Errorf("the viewer tab does not show %s in control %v after the takeover made elsewhere while the carrier was frozen, want within %v; "+
				"viewer: %v; carrier (frozen): %v", elsewhereTab, shown.Round(time.Millisecond), takeoverBound, lifecycleOf(viewer), lifecycleOf(carrier))
		case shown > takeoverBound:
			t.Errorf("the viewer tab showed %s in control only %v after the takeover made elsewhere while the carrier was frozen, want within %v",
				elsewhereTab, shown.Round(time.Millisecond), takeoverBound)
		default:
			t.Logf("the viewer tab showed the new holder %v after the takeover made elsewhere (carrier frozen)", shown.Round(time.Millisecond))
		}

		carrier.Resume()
		if err := carrier.Until(viewerOfJS(elsewhereTab), 5*time.Second); err != nil {
			t.Fatalf("the resumed carrier does not show %s in control: %v; client: %v", elsewhereTab, err, lifecycleOf(carrier))
		}
	})

	t.Run("an owner tab hidden behind the carrier, its timers throttled, stays owner without stream drops and runs mutations", func(t *testing.T) {
		// A minimised window's page is hidden and its timers fire a second or more apart, longer
		// than carrierTimeoutMs (1 s): at each of its checks the carrier, with nothing to say, has
		// been quiet that long. Only a ping it leaves unanswered may count against it.
		const (
			session = "hidden-follower-owner"
			watch   = 12 * time.Second
		)
		srv := startDemoServer(t, rds, nil)
		b := browsertest.Start(t)
		carrier, owner := ownerBehind(t, srv, session, b.NewTab("carrier"), func() *browsertest.Tab { return b.NewWindow("owner") })
		browsertest.Eval[bool](owner, `(window.seen = [],
			tablease.on("state", (e) => seen.push("state " + e.state + " (" + e.reason + ")")),
			tablease.on("stream", (e) => seen.push("stream live=" + e.live + " carrier=" + e.carrier)), true)`)
		var renews, checks atomic.Int64
		countRequests(t, owner, map[string]*atomic.Int64{"/lease/renew": &renews, "/lease/check": &checks})

		owner.Minimize()
		start := time.Now()
		for time.Since(start) < watch {
			if s := lifecycleOf(owner); s.State != "owner" {
				t.Errorf("the hidden owner read %q %v after it was hidden, want owner all along: %v", s.State, time.Since(start).Round(time.Millisecond), s)
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
		if seen := browsertest.Eval[[]string](owner, `seen`); len(seen) > 0 {
			t.Errorf("the hidden owner's state or stream changed %d times in %v behind a carrier that answers (want none): %v", len(seen), watch, seen)
		}
		// One renew says the tab is hidden; the next is due a third of the hidden TTL later.
		if n := renews.Load(); n > 2 {
			t.Errorf("the hidden owner renewed %d times in %v, want at most 2", n, watch)
		}
		if got := guardAnswer(owner); got != "ran" {
			t.Errorf("a guarded mutation in the hidden owner answered %s, want ran; client: %v", got, lifecycleOf(owner))
		}
		if n := checks.Load(); n != 0 {
			t.Errorf("the hidden owner's guard asked the server %d times: the carrier answers its ping, want none", n)
		}
		checkCarrier(t, carrier, owner)
		owner.Restore()
	})

	t.Run("a frozen carrier that owned the lease never runs a mutation once resumed, and the other tab shows the takeover within two seconds", func(t *testing.T) {
		const session = "frozen-carrier-is-owner"
		srv := startDemoServer(t, rds, nil)
		b := browsertest.Start(t)
		carrier, viewer := srv.ownerAndViewer(b, session, "carrier", "viewer")
		srv.mustHold(session, carrier.id)
		checkCarrier(t, carrier, viewer)

		carrier.Freeze()
		took := time.Now()
		srv.takeOverElsewhere(session, elsewhereTab)
		shown, ok := showsWithin(viewer, viewerOfJS(elsewhereTab), took, lateBound)
		switch {
		case !ok:
			t.Errorf("the viewer tab does not show %s in control %v after the takeover made elsewhere while the owner carrier was frozen, want within %v; "+
				"viewer: %v; carrier (frozen): %v", elsewhereTab, shown.Round(time.Millisecond), takeoverBound, lifecycleOf(viewer), lifecycleOf(carrier))
		case shown > takeoverBound:
			t.Errorf("the viewer tab showed %s in control only %v after the takeover made elsewhere while the owner carrier was frozen, want within %v",
				elsewhereTab, shown.Round(time.Millisecond), takeoverBound)
		default:
			t.Logf("the viewer tab showed the new holder %v after the takeover made elsewhere (owner carrier frozen)", shown.Round(time.Millisecond))
		}

		resumed := time.Now()
		carrier.Resume()
		if s := lifecycleOf(carrier); s.Role == "owner" || s.ClientRole == "owner" || s.State == "owner" {
			t.Errorf("the carrier is owner right after it resumed, before the server confirmed it: %v", s)
		}
		var ran []time.Duration
		settled, ok := within(resumed, 5*time.Second, func() bool {
			if guardAnswer(carrier) == "ran" {
				ran = append(ran, time.Since(resumed).Round(time.Millisecond))
			}
			v, err := browsertest.TryEval[bool](carrier, "Boolean("+viewerOfJS(elsewhereTab)+")", time.Second)
			return err == nil && v
		})
		if len(ran) > 0 {
			t.Errorf("the resumed carrier ran guarded mutations %v after it resumed, though its lease had been taken over while it was frozen", ran)
		}
		if !ok {
			t.Fatalf("the resumed carrier does not show %s in control %v after it resumed; client: %v", elsewhereTab, settled.Round(time.Millisecond), lifecycleOf(carrier))
		}
		if s := lifecycleOf(carrier); s.State != "viewer" {
			t.Errorf("the resumed carrier shows the new holder but tablease.state is %q, want viewer: %v", s.State, s)
		}
		t.Logf("the resumed carrier showed the new holder %v after it resumed", settled.Round(time.Millisecond))
		// It lost control while frozen, when no request may be sent: it keeps its read-only tools.
		if err := carrier.Until(exposedJS("get_event_details, search_events"), 5*time.Second); err != nil {
			t.Errorf("the resumed carrier does not expose the read-only tools: %v; exposed: %s", err,
				browsertest.Eval[string](carrier, `document.querySelector('[data-field="exposed"]').textContent`))
		}
	})

	t.Run("when the carrier tab crashes the other tab carries the stream and shows a takeover made elsewhere within two seconds", func(t *testing.T) {
		const session = "crashed-carrier"
		srv := startDemoServer(t, rds, nil)
		b := browsertest.Start(t)
		carrier, other := srv.ownerAndViewer(b, session, "carrier", "other")
		checkCarrier(t, carrier, other)

		carrier.Crash() // no pagehide: the browser frees the stream's Web Lock
		if err := other.Until(`tablease.streamCarrier === true && tablease.streamLive`, 10*time.Second); err != nil {
			t.Errorf("the remaining tab does not carry a live event stream after the carrier crashed: %v; client: %v", err, lifecycleOf(other))
		}
		other.WaitFor("the remaining tab's event stream to be live", `tablease.streamLive`, 10*time.Second)

		took := time.Now()
		srv.takeOverElsewhere(session, elsewhereTab)
		shown, ok := showsWithin(other, viewerOfJS(elsewhereTab), took, lateBound)
		switch {
		case !ok:
			t.Errorf("the remaining tab does not show %s in control %v after the takeover made elsewhere, want within %v; client: %v",
				elsewhereTab, shown.Round(time.Millisecond), takeoverBound, lifecycleOf(other))
		case shown > takeoverBound:
			t.Errorf("the remaining tab showed %s in control only %v after the takeover made elsewhere, want within %v",
				elsewhereTab, shown.Round(time.Millisecond), takeoverBound)
		default:
			t.Logf("after the carrier crashed, the remaining tab showed the new holder %v after the takeover made elsewhere", shown.Round(time.Millisecond))
		}
	})

	// "Use here", then close (or freeze) the old tab, which carried the event stream: the new owner
	// takes the stream over and may have missed news meanwhile, so it confirms its lease; that is
	// no loss of control, and its running mutation goes on (an open question ends with the same
	// period of ownership: web/sdk/call.test.mjs).
	for _, end := range []string{"closed", "frozen"} {
		t.Run("the running mutation of the owner goes on when the tab that carried the stream is "+end, func(t *testing.T) {
			session := "carrier-" + end
			srv := startDemoServer(t, rds, nil)
			old, owner := ownerBehindCarrier(t, srv, browsertest.Start(t), session)

			// A guarded mutation that waits for the test.
			browsertest.Eval[chromedp.Void](owner, `(() => {
				const m = window.work = {aborted: false, answer: null, release: null};
				tablease.guard(async (args, lease) => {
					lease.signal.addEventListener("abort", () => (m.aborted = true));
					await new Promise((r) => (m.release = r));
					return "done";
				})({}).then((answer) => (m.answer = answer));
			})()`)
			owner.WaitFor("the mutation to be running", `work.release !== null && tablease.inFlight === 1`, 5*time.Second)

			if end == "closed" {
				old.Close()
			} else {
				old.Freeze()
			}
			owner.WaitFor("the owner to carry the stream", `tablease.streamCarrier === true && tablease.streamLive`, 10*time.Second)
			owner.WaitFor("the owner to be owner", ownerJS, 5*time.Second)
			if s := lifecycleOf(owner); browsertest.Eval[bool](owner, `work.aborted`) || s.InFlight != 1 {
				t.Fatalf("the owner's running mutation was ended when the old tab was %s: aborted %v; client: %v", end, browsertest.Eval[bool](owner, `work.aborted`), s)
			}
			browsertest.Eval[chromedp.Void](owner, `work.release()`)
			owner.WaitFor("the mutation to answer", `work.answer !== null`, 5*time.Second)
			if got := browsertest.Eval[string](owner, `JSON.stringify(work.answer)`); got != `"done"` {
				t.Errorf("the owner's mutation answered %s after the old tab was %s, want its own result; client: %v", got, end, lifecycleOf(owner))
			}
			srv.mustHold(session, owner.id)
		})
	}

	t.Run("a page on another origin that imports the client", func(t *testing.T) {
		t.Run("is owner when its origin is allowed", func(t *testing.T) {
			srv, page := startCrossOrigin(t, rds, true)
			b := browsertest.Start(t)
			tab := b.NewTab("other-origin")
			tab.Do("open the page on another origin", chromedp.Navigate(page+"/?session=cross-allowed"))
			if err := tab.Until(`window.startResult !== undefined`, 15*time.Second); err != nil {
				t.Fatalf("start() did not settle on the page at %s: %v; page: %v", page, err, crossOriginOf(tab))
			}
			if err := tab.Until(`tablease.role === 'owner' && document.body.dataset.role === 'owner'`, 10*time.Second); err != nil {
				t.Fatalf("the page at %s with TABLEASE_CORS_ORIGINS=%s is not owner: %v; page: %v", page, page, err, crossOriginOf(tab))
			}
			srv.mustHold("cross-allowed", browsertest.Eval[string](tab, `tablease.tabId`))
			if s := crossOriginOf(tab); len(s.Errors) > 0 || s.Start != "started" {
				t.Errorf("the allowed page reported %v and start() %s, want no error and started", s.Errors, s.Start)
			}
		})

		t.Run("reports an error from start() and stays a viewer when its origin is not allowed", func(t *testing.T) {
			srv, page := startCrossOrigin(t, rds, false)
			b := browsertest.Start(t)
			tab := b.NewTab("other-origin")
			tab.Do("open the page on another origin", chromedp.Navigate(page+"/?session=cross-refused"))
			if err := tab.Until(`window.tablease && window.leaseErrors.length > 0`, 10*time.Second); err != nil {
				t.Fatalf("the page at %s, whose origin is not in TABLEASE_CORS_ORIGINS, emitted no error event: %v; page: %v", page, err, crossOriginOf(tab))
			}
			s := crossOriginOf(tab)
			if len(s.Errors) == 0 {
				t.Fatalf("the page's error events cannot be read: %v", s)
			}
			if e := s.Errors[0]; e.Message == "" || e.Code == "" {
				t.Errorf("the first error event has code %q and message %q, want both set; page: %v", e.Code, e.Message, s)
			}
			t.Logf("the page on another origin reported: %v", s.Errors)
			if s.ClientRole != "viewer" || s.Role != "viewer" {
				t.Errorf("the refused page is not a viewer: %v", s)
			}
			if code, g := srv.api.do("GET", "/v1/sessions/cross-refused/lease", nil); code != 200 || g["held"] != false {
				t.Errorf("the server's lease of the refused page's session: %d %v; want free", code, g)
			}
		})
	})

	t.Run("a page whose CSP forbids the lease socket renews over HTTP, and keeps its lease", func(t *testing.T) {
		// connect-src names tablease's http origin, not its ws one: the page's WebSocket errs at
		// once, and tells no close.
		const session = "csp-without-ws"
		srv, page := startOriginNamed(t, rds, "localhost", true, "/token", func(base string) string {
			return crossOriginHTML(t, crossOriginOptions{Base: base, CSP: "connect-src 'self' " + base, TTLMs: 6000})
		})
		b := browsertest.Start(t)
		tab := demoTab{Tab: b.NewTab("csp"), session: session}
		tab.Do("open the page whose CSP forbids WebSockets", chromedp.Navigate(page+"/?session="+session))
		if err := tab.Until(`tablease.role === 'owner'`, 15*time.Second); err != nil {
			t.Fatalf("the page is not owner: %v; page: %v", err, crossOriginOf(tab.Tab))
		}
		tab.id = browsertest.Eval[string](tab, `tablease.tabId`)
		epoch := srv.mustHold(session, tab.id)
		var overHTTP atomic.Int64
		countHTTP(t, tab, map[string]*atomic.Int64{"/lease/renew": &overHTTP})
		// Renews every 2 s: five within 12 s, each in time, the lease never lost.
		if _, ok := within(time.Now(), 12*time.Second, func() bool { return overHTTP.Load() >= 5 }); !ok {
			t.Errorf("%d renews over HTTP within 12 s, want 5; page: %v", overHTTP.Load(), crossOriginOf(tab.Tab))
		}
		if got := srv.mustHold(session, tab.id); got != epoch {
			t.Errorf("the page holds epoch %d, had %d: it lost its lease meanwhile", got, epoch)
		}
		if s := crossOriginOf(tab.Tab); len(s.Errors) > 0 {
			t.Errorf("the page reported errors: %v", s.Errors)
		}
	})

	t.Run("tabs of a page that is not a secure context, which cannot share a stream, keep the origin's connections for their renews", func(t *testing.T) {
		// Without Web Locks each tab's stream is a connection of its own, and Chromium opens six
		// per origin over HTTP/1.1: eight tabs' streams would leave none for the renews, the
		// module imports and the takeovers. Only the visible tabs and the owner keep one.
		const session = "insecure-context"
		srv, page := startCrossOriginNamed(t, rds, "app.test", true)
		b := browsertest.Start(t, chromedp.Flag("host-resolver-rules", "MAP app.test 127.0.0.1"))
		start := func(tab *browsertest.Tab) {
			t.Helper()
			tab.Do("open the page on app.test", chromedp.Navigate(page+"/?session="+session))
			if err := tab.Until(`window.startResult !== undefined`, 15*time.Second); err != nil {
				t.Fatalf("start() did not settle on %s: %v; page: %v; streams open: %v", page, err, crossOriginOf(tab), srv.streamsNow(t))
			}
		}
		owner := b.NewWindow("owner")
		start(owner)
		if err := owner.Until(`tablease.role === 'owner'`, 10*time.Second); err != nil {
			t.Fatalf("the first tab is not owner: %v; page: %v", err, crossOriginOf(owner))
		}
		if insecure := browsertest.Eval[bool](owner, `!window.isSecureContext && !navigator.locks`); !insecure {
			t.Fatal("the page on app.test is a secure context with Web Locks: this test needs one without")
		}
		owner.Minimize()
		for i := range 7 {
			viewer := b.NewWindow(fmt.Sprint("viewer-", i))
			start(viewer)
			viewer.Minimize()
		}
		front := b.NewWindow("front")
		start(front)
		if err := front.Until(`tablease.streamLive`, 10*time.Second); err != nil {
			t.Fatalf("the visible tab has no live stream: %v; page: %v", err, crossOriginOf(front))
		}
		if n, ok := srv.streamsWithin(t, 2, 5*time.Second); !ok {
			t.Fatalf("%v event streams open with the owner and seven viewers hidden and one tab shown, want 2 (the owner's, the shown tab's)", n)
		}
		frontID := browsertest.Eval[string](front, `tablease.tabId`)
		if took := browsertest.Eval[string](front, `tablease.takeover().then(() => "granted", (e) => String(e?.code ?? e))`); took != "granted" {
			t.Fatalf("takeover() from the visible tab answered %s; page: %v; streams open: %v", took, crossOriginOf(front), srv.streamsNow(t))
		}
		srv.mustHold(session, frontID)
		if err := owner.Until(`tablease.role === 'viewer'`, 5*time.Second); err != nil {
			t.Fatalf("the hidden owner does not show the takeover: %v; page: %v", err, crossOriginOf(owner))
		}
		if n, ok := srv.streamsWithin(t, 1, 5*time.Second); !ok {
			t.Fatalf("%v event streams open once the hidden owner lost the lease, want the shown tab's alone", n)
		}
	})

	t.Run("every tab of the browser is listed with its own tabId, and a closed tab leaves the list at once", func(t *testing.T) {
		const session = "presence"
		srv := startDemoServer(t, rds, nil)
		b := browsertest.Start(t)
		first, second := srv.ownerAndViewer(b, session, "first", "second")

		want := []string{first.id, second.id}
		slices.Sort(want)
		listed, ok := srv.tabsWithin(session, want, 5*time.Second)
		if !ok {
			t.Fatalf("GET …/sessions/%s/tabs lists %v, want both tabs %v, each with its own tabId (first carries the stream, second follows: %v / %v)",
				session, listed, want, lifecycleOf(first), lifecycleOf(second))
		}
		for _, tab := range listed {
			if tab.Label == "" || tab.ConnectedAt == "" {
				t.Errorf("GET …/tabs lists %+v: want the tab's label and when it joined", tab)
			}
		}

		closed := time.Now()
		second.Close() // pagehide
		listed, ok = srv.tabsWithin(session, []string{first.id}, 3*time.Second)
		if !ok {
			t.Fatalf("GET …/tabs lists %v %v after the second tab closed, want only the first %s", listed, time.Since(closed).Round(time.Millisecond), first.id)
		}
		t.Logf("the closed tab left the list %v after it closed", time.Since(closed).Round(time.Millisecond))
		// No setting shortens the presence TTL (45 s), so a crashed tab's leaving is not checked here.
	})

	t.Run("after Redis restarts empty every tab is listed again at once, not at its next refresh", func(t *testing.T) {
		const session = "presence-restart"
		own := redistest.Start(t) // restarted below: the other subtests' Redis stays up
		srv := startDemoServer(t, own, nil)
		b := browsertest.Start(t)
		first, second := srv.ownerAndViewer(b, session, "first", "second")
		want := []string{first.id, second.id}
		slices.Sort(want)
		if listed, ok := srv.tabsWithin(session, want, 5*time.Second); !ok {
			t.Fatalf("GET …/tabs lists %v, want both tabs %v", listed, want)
		}
		// The stream's connection stays up: the instance's watch starts over on it with a fresh
		// snapshot, which lists no tab. The tabs refresh their entries every 15 s.
		own.Restart(t)
		restarted := time.Now()
		if listed, ok := srv.tabsWithin(session, want, 3*time.Second); !ok {
			t.Fatalf("GET …/tabs lists %v %v after Redis restarted empty, want both tabs %v again within 3 s (first: %v / second: %v)",
				listed, time.Since(restarted).Round(time.Millisecond), want, lifecycleOf(first), lifecycleOf(second))
		}
		t.Logf("every tab was listed again %v after Redis restarted", time.Since(restarted).Round(time.Millisecond))
	})

	t.Run("tabs frozen and resumed while the stream changes carrier leave one stream open, and the owner in control", func(t *testing.T) {
		const session = "carrier-churn"
		srv := startDemoServer(t, rds, nil)
		b := browsertest.Start(t)
		var tabs []demoTab
		for _, name := range []string{"first", "second", "third"} {
			tab := srv.open(b.NewTab(name), session)
			// A getToken that takes 300 ms, as an identity provider's may: a carrier that steps
			// down while it waits must not open its stream afterwards.
			browsertest.Eval[bool](tab, `(() => { const g = tablease._api._getToken; `+
				`tablease._api._getToken = (o) => new Promise((r) => setTimeout(r, 300)).then(() => g(o)); return true; })()`)
			tabs = append(tabs, tab)
		}
		owner := tabs[0]
		owner.WaitFor("the first tab to be owner", ownerJS, 15*time.Second)
		carrierOf := func(but demoTab) demoTab {
			for _, tab := range tabs {
				if tab.Tab != but.Tab && browsertest.Eval[bool](tab, `tablease.streamCarrier`) {
					return tab
				}
			}
			return demoTab{}
		}
		for cycle := range 4 {
			carrier := carrierOf(demoTab{})
			if carrier.Tab == nil {
				t.Fatalf("cycle %d: no tab carries the stream: %v / %v / %v", cycle, lifecycleOf(tabs[0]), lifecycleOf(tabs[1]), lifecycleOf(tabs[2]))
			}
			carrier.Freeze()
			// The tab the stream goes to is frozen in turn while it waits for its token.
			var next demoTab
			if _, ok := within(time.Now(), 2*time.Second, func() bool { next = carrierOf(carrier); return next.Tab != nil }); !ok {
				t.Fatalf("cycle %d: no tab took the stream from the frozen carrier: %v / %v / %v", cycle, lifecycleOf(tabs[0]), lifecycleOf(tabs[1]), lifecycleOf(tabs[2]))
			}
			next.Freeze()
			time.Sleep(2 * time.Second) // frozen for a while, as a background tab is
			carrier.Resume()
			next.Resume()
		}
		// Every stream the server still has open must be one the browser uses: one, once the
		// tabs settle (a stream left open holds one of the browser's six connections to the
		// server for good; six of them stop every request of the page).
		var open float64
		hc := &http.Client{Timeout: 5 * time.Second}
		settled, ok := within(time.Now(), 10*time.Second, func() bool {
			n, err := openStreams(hc, srv.base)
			open = n
			return err == nil && n == 1
		})
		if !ok {
			t.Errorf("the server has %v event streams open %v after the tabs settled, want 1: %v / %v / %v",
				open, settled.Round(time.Millisecond), lifecycleOf(tabs[0]), lifecycleOf(tabs[1]), lifecycleOf(tabs[2]))
		}
		if err := owner.Until(ownerJS, 10*time.Second); err != nil {
			t.Errorf("the first tab is no longer owner: %v; client: %v", err, lifecycleOf(owner))
		}
		if got := guardAnswer(owner); got != "ran" {
			t.Errorf("the owner's guarded mutation answered %s, want ran; client: %v", got, lifecycleOf(owner))
		}
	})

	t.Run("a guarded mutation that never settles keeps neither a takeover nor a later handoff from completing", func(t *testing.T) {
		const session = "wedge"
		srv := startDemoServer(t, rds, nil)
		b := browsertest.Start(t)
		holder, other := srv.ownerAndViewer(b, session, "holder", "other")

		// A guarded mutation that never settles and ignores its signal.
		browsertest.Eval[chromedp.Void](holder, `(() => {
			const m = window.stuck = {started: false, aborted: false, answer: null};
			tablease.guard(async (args, lease) => {
				m.started = true;
				lease.signal.addEventListener("abort", () => (m.aborted = true));
				await new Promise(() => {});
			})({}).then((answer) => (m.answer = answer));
		})()`)
		holder.WaitFor("the never-ending mutation to be running", `stuck.started && tablease.inFlight === 1`, 5*time.Second)

		clickAction(other, "use-here")
		other.WaitFor("the second tab to be owner after Use here", ownerJS, 5*time.Second)
		holder.WaitFor("the first tab to be a viewer of the second", viewerOfJS(other.id), 5*time.Second)
		if err := holder.Until(`stuck.aborted && tablease.inFlight === 0`, 2*time.Second); err != nil {
			t.Errorf("after the takeover the old holder's never-ending mutation is still counted or its signal did not abort: %v; "+
				"signal aborted %v, client: %v", err, browsertest.Eval[bool](holder, `stuck.aborted`), lifecycleOf(holder))
		}
		// The guarded call was answered as the control ended, though its handler never settles.
		const answered = `stuck.answer?.error?.code === "NOT_LEASE_OWNER" && stuck.answer.error.details.mayHaveActed === true && stuck.answer.error.details.reason === "lost"`
		if err := holder.Until(answered, 2*time.Second); err != nil {
			t.Errorf("the never-ending mutation's call was not answered NOT_LEASE_OWNER with mayHaveActed after the takeover: %v; answer %s",
				err, browsertest.Eval[string](holder, `JSON.stringify(stuck.answer)`))
		}

		browsertest.Eval[bool](holder, `tablease.takeover().then(() => true)`)
		holder.WaitFor("the first tab to be owner again", ownerJS, 5*time.Second)
		other.WaitFor("the second tab to be a viewer of the first again", viewerOfJS(holder.id), 5*time.Second)
		epoch := srv.mustHold(session, holder.id)
		if got := guardAnswer(holder); got != "ran" {
			t.Errorf("a guarded mutation in the holder after it took control back answered %s, want ran; client: %v", got, lifecycleOf(holder))
		}

		asked := time.Now()
		browsertest.Eval[chromedp.Void](other, `(() => {
			window.handoffResult = null;
			tablease.requestHandoff().then((r) => (window.handoffResult = r.status));
		})()`)
		if err := other.Until(ownerJS, 5*time.Second); err != nil {
			code, g := srv.api.do("GET", "/v1/sessions/"+session+"/lease?tabId="+other.id, nil)
			t.Errorf("the handoff asked by the second tab did not complete within 5s: %v; asking tab: %v; holder: %v; server: %d %v",
				err, lifecycleOf(other), lifecycleOf(holder), code, g)
			srv.checkNoWedge(t, holder, session)
			t.FailNow()
		}
		if err := holder.Until(viewerOfJS(other.id), time.Until(asked.Add(5*time.Second))); err != nil {
			t.Fatalf("the old holder does not show the asking tab in control within 5s of the request: %v; client: %v", err, lifecycleOf(holder))
		}
		t.Logf("the handoff completed %v after the request", time.Since(asked).Round(time.Millisecond))
		if next := srv.mustHold(session, other.id); next <= epoch {
			t.Errorf("the handoff's epoch %d is not above the holder's %d", next, epoch)
		}
		if s := lifecycleOf(holder); s.Handoff != "" || s.InFlight != 0 {
			t.Errorf("after the handoff the old holder still shows handoff %q and %d mutations in flight: %v", s.Handoff, s.InFlight, s)
		}
	})

	t.Run("a tab restored from the back/forward cache while offline joins the browser's stream once online, not one of its own", func(t *testing.T) {
		const session = "bfcache-offline"
		srv := startDemoServer(t, rds, nil)
		b := browsertest.Start(t)
		first, second := srv.ownerAndViewer(b, session, "first", "second")

		// Away, then back while offline: the page comes back from the cache (pageshow) and its
		// getToken fails, as one that asks an identity provider does offline (the demo keeps
		// the token it was given, so it is wrapped).
		browsertest.Eval[bool](second, `addEventListener("pageshow", (e) => { window.restored = e.persisted; }), true`)
		browsertest.Eval[bool](second, `(() => { const g = tablease._api._getToken; tablease._api._getToken = `+
			`async (o) => { if (!navigator.onLine) throw new Error("the identity provider is out of reach"); return g(o); }; return true; })()`)
		second.Do("leave the demo", chromedp.Navigate(srv.base+"/healthz"))
		second.SetOffline(true)
		second.Do("go back to the demo", chromedp.Evaluate[chromedp.Void]("history.back()"))
		second.WaitFor("the page restored from the back/forward cache", `window.restored === true && tablease.state !== "away"`, 10*time.Second)
		streams := srv.watchStreams(t)
		second.SetOffline(false)
		second.WaitFor("the restored tab to follow the stream again", `tablease.streamLive && !tablease.streamCarrier`, 15*time.Second)
		// Its next request settles its group at once; give a stream of its own time to open.
		srv.takeOverElsewhere(session, "t-elsewhere")
		for _, tab := range []demoTab{first, second} {
			tab.WaitFor("the tab to show the takeover made elsewhere", viewerOfJS("t-elsewhere"), 5*time.Second)
		}
		maxOpen, now, samples, err := streams.stop()
		if err != nil {
			t.Fatalf("reading tablease_event_streams from /metrics: %v", err)
		}
		if maxOpen > 1 || now != 1 {
			t.Errorf("tablease_event_streams reached %v (now %v) over %d samples after the tab came back online; want the browser's one stream; second: %v",
				maxOpen, now, samples, lifecycleOf(second))
		}
	})

	t.Run("an owner tab that goes offline is read-only before its lease can lapse, and owner again soon after it is back online", func(t *testing.T) {
		const (
			session = "offline"
			ttl     = 6 * time.Second
			margin  = 1500 * time.Millisecond // the client's marginMs (a quarter of 6 s is more)
			slack   = time.Second
		)
		srv := startDemoServer(t, rds, map[string]string{"TABLEASE_TTL_DEFAULT": ttl.String()})
		b := browsertest.Start(t)
		owner := srv.open(b.NewTab("owner"), session)
		owner.WaitFor("the tab to be owner", ownerJS, 15*time.Second)
		srv.mustHold(session, owner.id)
		if got := guardAnswer(owner); got != "ran" {
			t.Fatalf("a guarded mutation in the owner tab answered %s before it went offline, want ran; client: %v", got, lifecycleOf(owner))
		}

		offline := time.Now()
		owner.SetOffline(true)
		var last string
		refused, ok := within(offline, ttl+lateBound, func() bool {
			last = guardAnswer(owner)
			return last == "NOT_LEASE_OWNER"
		})
		if !ok {
			t.Fatalf("the offline tab still answered a guarded mutation with %s %v after it went offline (TTL %v); client: %v",
				last, refused.Round(time.Millisecond), ttl, lifecycleOf(owner))
		}
		t.Logf("the offline tab refused its guarded mutation %v after it went offline (TTL %v)", refused.Round(time.Millisecond), ttl)
		if bound := ttl - margin + slack; refused > bound {
			t.Errorf("the offline tab refused its guarded mutation only %v after it went offline, want within %v (the TTL %v less the margin %v, and %v)",
				refused.Round(time.Millisecond), bound, ttl, margin, slack)
		}
		if s := lifecycleOf(owner); s.Role != "viewer" || s.ClientRole != "viewer" {
			t.Errorf("the offline tab refuses mutations but does not show it is read-only: %v", s)
		}

		online := time.Now()
		owner.SetOffline(false)
		back, ok := showsWithin(owner, ownerJS, online, lateBound)
		if !ok {
			t.Fatalf("the tab is not owner %v after it came back online; client: %v; server: %v",
				back.Round(time.Millisecond), lifecycleOf(owner), srv.leaseOf(session, owner.id))
		}
		t.Logf("the tab was owner again %v after it came back online", back.Round(time.Millisecond))
		if back > backOnlineBound {
			t.Errorf("the tab was owner again only %v after it came back online, want within %v", back.Round(time.Millisecond), backOnlineBound)
		}
		srv.mustHold(session, owner.id)
		if got := guardAnswer(owner); got != "ran" {
			t.Errorf("a guarded mutation in the tab back online answered %s, want ran; client: %v", got, lifecycleOf(owner))
		}
	})

	// A connection that went silent (a proxy holding the request, packets dropped): the tab's first
	// renew is never answered; every other call goes on. Over HTTP, CDP's Fetch domain pauses the
	// request and never lets it go; over the lease socket, the page's WebSocket send drops the
	// message. The client gives a renew up at half the time left before its deadline (TTL 6 s:
	// 1.25 s), so a retry renews the lease before it can lapse. What must not happen is a tab that
	// waits out requestTimeoutMs (10 s) and loses the lease, or one that renews no more and takes
	// the lease again every TTL, each time under a new epoch.
	silentRenew := func(t *testing.T, query string, holdFirstRenew func(owner demoTab) (held func() bool)) {
		const (
			session = "silent-renew"
			ttl     = 6 * time.Second
		)
		srv := startDemoServer(t, rds, map[string]string{"TABLEASE_TTL_DEFAULT": ttl.String()})
		b := browsertest.Start(t)
		owner := srv.openWith(b.NewTab("owner"), session, query)
		owner.WaitFor("the tab to be owner", ownerJS, 15*time.Second)
		first := srv.mustHold(session, owner.id)
		held := holdFirstRenew(owner)
		if _, ok := within(time.Now(), 2*ttl, held); !ok {
			t.Fatalf("no renew was sent within %v; client: %v", 2*ttl, lifecycleOf(owner))
		}
		hung := time.Now()

		// Watch the server's epoch for the tab for five TTLs: it must not change.
		tick := time.NewTicker(500 * time.Millisecond)
		defer tick.Stop()
		epoch := first
		for now := range tick.C {
			code, g := srv.api.do("GET", "/v1/sessions/"+session+"/lease?tabId="+owner.id, nil)
			if code != 200 {
				t.Fatalf("GET …/lease: %d %v", code, g)
			}
			if e := epochOf(t, g); e != epoch {
				t.Errorf("the lease was taken again under epoch %d (was %d) %v after the renew was held: the held renew cost the lease; client: %v",
					e, epoch, now.Sub(hung).Round(time.Millisecond), lifecycleOf(owner))
				epoch = e
			}
			if now.Sub(hung) > 5*ttl {
				break
			}
		}
		owner.WaitFor("the tab to be owner", ownerJS, 2*ttl)
		if got := srv.mustHold(session, owner.id); got != epoch {
			t.Errorf("the tab holds epoch %d, the watch ended at %d", got, epoch)
		}
		if got := guardAnswer(owner); got != "ran" {
			t.Errorf("a guarded mutation answered %s, want ran; client: %v", got, lifecycleOf(owner))
		}
	}
	t.Run("a renew request that is never answered costs nothing: the tab keeps its lease and renews it steadily", func(t *testing.T) {
		silentRenew(t, "&socket=false", func(owner demoTab) func() bool {
			ctx := owner.Context()
			var held atomic.Bool
			paused := chromedp.Events(ctx, fetch.RequestPaused)
			go func() {
				for ev, err := range paused {
					if err != nil {
						return
					}
					if held.CompareAndSwap(false, true) {
						continue // the first renew: never answered
					}
					_, _ = chromedp.Call(ctx, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: ev.RequestID})
				}
			}()
			if _, err := chromedp.Call(ctx, fetch.Enable, fetch.EnableParams{Patterns: []*fetch.RequestPattern{{URLPattern: "*/lease/renew*"}}}); err != nil {
				t.Fatalf("Fetch.enable: %v", err)
			}
			return held.Load
		})
	})
	t.Run("a renew message that is never answered costs nothing: the tab keeps its lease and renews it steadily", func(t *testing.T) {
		silentRenew(t, "", func(owner demoTab) func() bool {
			browsertest.Eval[bool](owner, `(() => {
				const send = WebSocket.prototype.send;
				WebSocket.prototype.send = function (data) {
					if (!window.renewDropped && String(data).includes('"op":"renew"')) return void (window.renewDropped = true);
					return send.call(this, data);
				};
				return true;
			})()`)
			return func() bool { return browsertest.Eval[bool](owner, `window.renewDropped === true`) }
		})
	})

	t.Run("an owner tab renews over a lease socket, frozen and resumed as well, and closes it at pagehide", func(t *testing.T) {
		const (
			session = "lease-socket"
			// Renews every 2.5 s: past the 1 s after which the server's end of a socket waits in a
			// goroutine of its own (TABLEASE_SOCKET_LINGER), so that each renew comes to an idle
			// socket.
			ttl = 7500 * time.Millisecond
		)
		srv := startDemoServer(t, rds, map[string]string{"TABLEASE_TTL_DEFAULT": ttl.String(), "TABLEASE_SOCKET_LINGER": "1s"})
		b := browsertest.Start(t)
		owner := srv.open(b.NewTab("owner"), session)
		owner.WaitFor("the tab to be owner", ownerJS, 15*time.Second)
		var overSocket, overHTTP, auths atomic.Int64
		countSocketCalls(t, owner, "renew", &overSocket)
		countSocketCalls(t, owner, "auth", &auths)
		countHTTP(t, owner, map[string]*atomic.Int64{"/lease/renew": &overHTTP})
		hc := &http.Client{Timeout: 5 * time.Second}
		sockets := func() float64 {
			n, err := metricValue(hc, srv.base, "tablease_sockets_open")
			if err != nil {
				t.Fatalf("reading tablease_sockets_open: %v", err)
			}
			return n
		}
		if _, ok := within(time.Now(), 3*ttl, func() bool { return overSocket.Load() >= 3 }); !ok {
			t.Fatalf("%d renews over the socket, %d over HTTP within %v, want 3 over the socket; client: %v", overSocket.Load(), overHTTP.Load(), 3*ttl, lifecycleOf(owner))
		}
		if n := overHTTP.Load(); n != 0 {
			t.Errorf("%d renews went over HTTP while the socket was up, want none", n)
		}
		if n := sockets(); n != 1 {
			t.Errorf("tablease_sockets_open is %v with one owner tab renewing, want 1", n)
		}

		browsertest.Eval[bool](owner, `(window.errors = [], tablease.on("error", (e) => errors.push(e.error.code + ": " + e.error.message)), true)`)
		owner.Freeze()
		owner.Resume()
		// The page is hidden once resumed (Chromium's freeze hides it): it renews at once, with the
		// hidden TTL, over a socket (the one it had, or a new one when Chromium closed that one).
		before := overSocket.Load()
		if _, ok := within(time.Now(), 3*ttl, func() bool { return overSocket.Load() > before && sockets() == 1 }); !ok {
			t.Errorf("after resume: %d renews over a socket (%d before), %d auth messages, tablease_sockets_open %v; client: %v",
				overSocket.Load(), before, auths.Load(), sockets(), lifecycleOf(owner))
		}
		if errs := browsertest.Eval[[]string](owner, `errors`); len(errs) > 0 {
			t.Errorf("the frozen and resumed owner reported errors: %v", errs)
		}
		// (A renew on its way as the page froze may have gone over HTTP: Chromium may close a
		// frozen page's socket.)
		owner.WaitFor("the resumed tab to be owner", ownerJS, 2*ttl)

		// Left, the page closes its socket, which keeps it eligible for the back/forward cache
		// (Chromium does not keep a page with an open WebSocket there).
		browsertest.Eval[bool](owner, `addEventListener("pageshow", (e) => { window.restored = e.persisted; }), true`)
		owner.Do("leave the demo", chromedp.Navigate(srv.base+"/healthz"))
		if _, ok := within(time.Now(), 5*time.Second, func() bool { return sockets() == 0 }); !ok {
			t.Errorf("the socket of a page left is still open on the server (tablease_sockets_open %v)", sockets())
		}
		owner.Do("go back to the demo", chromedp.Evaluate[chromedp.Void]("history.back()"))
		owner.WaitFor("the page restored from the back/forward cache", `window.restored === true`, 10*time.Second)
		owner.WaitFor("the restored tab to be owner again", ownerJS, 3*ttl)
	})

	t.Run("a tool disabled while a viewer tab's server was out of reach is unregistered as soon as its stream is back", func(t *testing.T) {
		// catalog events are not replayed: the snapshot of the reconnect names the version served.
		// The viewer's role does not change across the outage, so nothing else reads the catalog.
		const session = "catalog-outage"
		srv := startDemoServer(t, rds, nil)
		other := startDemoServer(t, rds, nil) // another instance on the same Redis, for the admin
		srv.takeOverElsewhere(session, elsewhereTab)
		b := browsertest.Start(t)
		viewer := srv.open(b.NewTab("viewer"), session)
		viewer.WaitFor("the viewer to expose the read-only tools", exposedJS("get_event_details, search_events"), 10*time.Second)

		srv.stop()
		viewer.WaitFor("the stream to be down", `!tablease.streamLive`, 10*time.Second)
		other.putCatalog(disableTool(t, "search_events"))
		srv.start()
		back := time.Now()
		viewer.WaitFor("the stream to be back", `tablease.streamLive`, lateBound)
		shown, ok := showsWithin(viewer, exposedJS("get_event_details"), back, lateBound)
		if !ok {
			t.Fatalf("the viewer still exposed %q %v after the server was back; client: %v", browsertest.Eval[string](viewer,
				`document.querySelector('[data-field="exposed"]').textContent`), shown.Round(time.Millisecond), lifecycleOf(viewer))
		}
		t.Logf("the disabled tool was unregistered %v after the server was back", shown.Round(time.Millisecond))
	})

	t.Run("after a server restart an owner tab is owner again, and its event stream back, within a round trip of each other", func(t *testing.T) {
		const session = "restart"
		srv := startDemoServer(t, rds, nil)
		b := browsertest.Start(t)
		owner := srv.open(b.NewTab("owner"), session)
		owner.WaitFor("the tab to be owner", ownerJS, 15*time.Second)
		browsertest.Eval[bool](owner, `(() => {
			window.restart = {};
			tablease.on("stream", (d) => { if (d.live && window.restart.stopped && window.restart.streamAt === undefined) window.restart.streamAt = performance.now(); });
			tablease.on("rolechange", (d) => { if (d.role === "owner" && window.restart.stopped && window.restart.ownerAt === undefined) window.restart.ownerAt = performance.now(); });
			return true;
		})()`)

		browsertest.Eval[bool](owner, `window.restart.stopped = true`)
		srv.stop()
		owner.WaitFor("the tab to be read-only", `!tablease.streamLive && tablease.role === 'viewer'`, 10*time.Second)
		// The renews and the stream's reconnects back off, each on its own: after five failed
		// renews the next is seconds away.
		owner.WaitFor("the renews to back off", `tablease._attempts.renew >= 5`, 30*time.Second)
		srv.start()
		owner.WaitFor("the stream to be back and the tab owner", `window.restart.streamAt !== undefined && window.restart.ownerAt !== undefined`, lateBound)
		// Whichever reaches the server first, the renew or the stream's reconnect, brings the
		// other at once, not when its own backoff ends.
		gap := browsertest.Eval[float64](owner, `window.restart.ownerAt - window.restart.streamAt`)
		t.Logf("the tab was owner again %.0f ms after its event stream was back", gap)
		if gap > 1000 || gap < -1000 {
			t.Errorf("the tab was owner again %.0f ms after its event stream was back, want within a round trip (1 s) of it; client: %v", gap, lifecycleOf(owner))
		}
		srv.mustHold(session, owner.id)
		if got := guardAnswer(owner); got != "ran" {
			t.Errorf("a guarded mutation in the owner tab after the restart answered %s, want ran; client: %v", got, lifecycleOf(owner))
		}
	})

	t.Run("a tab closed while its takeover is on its way gets nothing from it, whether the takeover or the close reaches the server first", func(t *testing.T) {
		for _, late := range []string{"request", "answer"} {
			session := "closed-mid-takeover-" + late
			srv := startDemoServer(t, rds, nil)
			srv.takeOverElsewhere(session, elsewhereTab)
			proxy := holdTakeovers(t, srv.base, late == "request")
			via := srv
			via.base = proxy.url
			tab := via.open(browsertest.Start(t).NewTab("closing"), session)
			tab.WaitFor("the tab to be a viewer", viewerOfJS(elsewhereTab), 10*time.Second)
			browsertest.Eval[bool](tab, `(tablease.takeover().catch(() => {}), true)`) // "Use here"
			proxy.waitHeld(t)
			tab.Close()
			proxy.waitGone(t, tab.id)
			proxy.let()
			if code, g := srv.api.do("GET", "/v1/sessions/"+session+"/lease", nil); code != 200 || holderOf(g) == tab.id {
				t.Errorf("the takeover's %s late: the closed tab holds the lease: %d %v", late, code, g)
			} else if late == "request" && holderOf(g) != elsewhereTab {
				t.Errorf("the takeover's request late: the lease is %v, want %s's as before", g, elsewhereTab)
			}
		}
	})

	t.Run("a tab frozen right after \"Use here\" does not take control on resume from a tab that took it meanwhile", func(t *testing.T) {
		const session = "frozen-mid-takeover"
		srv := startDemoServer(t, rds, nil)
		srv.takeOverElsewhere(session, elsewhereTab)
		tab := srv.open(browsertest.Start(t).NewTab("frozen"), session)
		tab.WaitFor("the tab to be a viewer", viewerOfJS(elsewhereTab), 10*time.Second)
		// A getToken that waits 300 ms, as an identity provider's may: the page freezes before it
		// answers, so the takeover is not sent yet (a frozen page runs no timer).
		browsertest.Eval[bool](tab, `(() => { const g = tablease._api._getToken; `+
			`tablease._api._getToken = (o) => new Promise((r) => setTimeout(r, 300)).then(() => g(o)); `+
			`window.takeoverOutcome = null; tablease.takeover().then(() => { window.takeoverOutcome = "granted"; }, `+
			`(e) => { window.takeoverOutcome = e.code; }); return true; })()`) // "Use here"
		tab.Freeze()
		later := srv.takeOverElsewhere(session, "another-tab") // the user, in another browser, later
		tab.Resume()
		tab.WaitFor("the takeover to be settled", `window.takeoverOutcome !== null`, 10*time.Second)
		if got := browsertest.Eval[string](tab, `window.takeoverOutcome`); got != "CANCELLED" {
			t.Errorf("the takeover the page froze before sending settled as %q, want CANCELLED", got)
		}
		if code, g := srv.api.do("GET", "/v1/sessions/"+session+"/lease", nil); code != 200 || holderOf(g) != "another-tab" || epochOf(t, g) != later {
			t.Errorf("after the resume the lease is %d %v, want another-tab's at epoch %d: the takeover the page froze before sending took it", code, g, later)
		}
	})

	// README, guarantee 6: a call answered 503 may still take effect later (Redis runs a call it
	// read before the instance gave up waiting for it). A "Use here" taken so left its tab a viewer
	// showing "Use here" while the server listed it as the holder, and no tab in control until the
	// lease expired. A proxy plays it: the takeover reaches the server, the browser gets a 503.
	t.Run("a \"Use here\" answered 503 that the store applied after all makes its tab owner", func(t *testing.T) {
		const session = "late-takeover"
		srv := startDemoServer(t, rds, nil)
		srv.takeOverElsewhere(session, elsewhereTab)
		target, err := url.Parse(srv.base)
		if err != nil {
			t.Fatal(err)
		}
		rp := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(target) }, FlushInterval: -1}
		var once atomic.Bool
		proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/lease") || !bytes.Contains(body, []byte(`"takeover"`)) || !once.CompareAndSwap(false, true) {
				rp.ServeHTTP(w, r)
				return
			}
			rp.ServeHTTP(httptest.NewRecorder(), r) // granted, its answer lost
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"error":{"code":"STORE_UNAVAILABLE","message":"the lease store is unavailable; retry shortly","retryable":true,"details":{}}}`)
		}))
		t.Cleanup(proxy.Close)
		via := srv
		via.base = proxy.URL
		tab := via.open(browsertest.Start(t).NewTab("late"), session)
		tab.WaitFor("the tab to be a viewer", viewerOfJS(elsewhereTab), 10*time.Second)
		browsertest.Eval[bool](tab, `(() => { window.takeoverOutcome = null; tablease.takeover().then(() => { window.takeoverOutcome = "granted"; }, `+
			`(e) => { window.takeoverOutcome = e.code; }); return true; })()`) // "Use here"
		tab.WaitFor("the takeover to be answered", `window.takeoverOutcome !== null`, 10*time.Second)
		if got := browsertest.Eval[string](tab, `window.takeoverOutcome`); got != "STORE_UNAVAILABLE" {
			t.Fatalf("the takeover settled as %q, want the proxy's STORE_UNAVAILABLE", got)
		}
		epoch := srv.mustHold(session, tab.id)
		tab.WaitFor("the tab the server lists as holder to be its owner", `tablease.role === "owner"`, 10*time.Second)
		if got := browsertest.Eval[float64](tab, `tablease.epoch`); got != float64(epoch) {
			t.Errorf("the tab is owner at epoch %v, the server granted it %d", got, epoch)
		}
		srv.mustHold(session, tab.id)
	})
}

// takeoverProxy stands between the browser and a server: it holds the first takeover (a POST of
// …/lease with mode takeover) until let is called, and sees the releases that say a tab is gone.
type takeoverProxy struct {
	url   string
	held  chan struct{} // closed once the takeover is held
	letGo chan struct{} // closed by let
	done  chan struct{} // closed once the held takeover was answered
	mu    sync.Mutex
	gone  map[string]bool // tab ids of the releases with gone: true that reached the server
}

// holdTakeovers starts a takeoverProxy to base. With late request the takeover reaches the server
// once let is called, whatever the browser did meanwhile (a closed tab's request goes on, as one
// the network delivers late); otherwise it reaches the server at once and its answer is held.
func holdTakeovers(t *testing.T, base string, lateRequest bool) *takeoverProxy {
	target, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	rp := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(target) }, FlushInterval: -1}
	p := &takeoverProxy{held: make(chan struct{}), letGo: make(chan struct{}), done: make(chan struct{}), gone: map[string]bool{}}
	var once atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || (!strings.HasSuffix(r.URL.Path, "/lease") && !strings.HasSuffix(r.URL.Path, "/lease/release")) {
			rp.ServeHTTP(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		var b struct {
			TabID, Mode string
			Gone        bool
		}
		_ = json.Unmarshal(body, &b)
		switch {
		case b.Gone:
			rec := httptest.NewRecorder()
			rp.ServeHTTP(rec, r)
			p.mu.Lock()
			p.gone[b.TabID] = rec.Code == http.StatusOK
			p.mu.Unlock()
			return
		case b.Mode != "takeover" || !once.CompareAndSwap(false, true):
			rp.ServeHTTP(w, r)
			return
		}
		defer close(p.done)
		// The browser drops the request when its tab closes: the server gets it all the same.
		r = r.WithContext(context.WithoutCancel(r.Context()))
		close(p.held)
		rec := httptest.NewRecorder()
		if !lateRequest {
			rp.ServeHTTP(rec, r)
		}
		<-p.letGo
		if lateRequest {
			rp.ServeHTTP(rec, r)
		}
	}))
	t.Cleanup(srv.Close)
	p.url = srv.URL
	return p
}

func (p *takeoverProxy) waitHeld(t *testing.T) {
	t.Helper()
	select {
	case <-p.held:
	case <-time.After(10 * time.Second):
		t.Fatal("no takeover reached the proxy within 10 s")
	}
}

// waitGone waits until a release saying tab is gone has reached the server.
func (p *takeoverProxy) waitGone(t *testing.T, tab string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		p.mu.Lock()
		ok, seen := p.gone[tab]
		p.mu.Unlock()
		switch {
		case seen && ok:
			return
		case seen:
			t.Fatalf("the release saying %s is gone was not answered 200", tab)
		case time.Now().After(deadline):
			t.Fatalf("no release saying %s is gone reached the server within 10 s of its close", tab)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// let lets the held takeover go on, and waits until the server answered it.
func (p *takeoverProxy) let() {
	close(p.letGo)
	<-p.done
}

const (
	// elsewhereTab is the tab of another browser of the same user that takes the lease over.
	elsewhereTab = "other-browser"
	// takeoverBound is how soon every tab that is not frozen shows a takeover made elsewhere, and
	// an owner tab refuses mutations after it.
	takeoverBound = 2 * time.Second
	// backOnlineBound is how soon a tab whose network came back is owner again.
	backOnlineBound = 5 * time.Second
	// lateBound is how long a test goes on waiting after a bound has passed, to say how late the
	// client was (under the 45 s TTL, past the 15 s renew).
	lateBound = 20 * time.Second
)

// takeOverElsewhere takes the lease of session for tabID as another browser of the same user
// does (mode takeover), and returns the new epoch.
func (s demoServer) takeOverElsewhere(session, tabID string) int64 {
	s.t.Helper()
	code, body := s.api.do("POST", "/v1/sessions/"+session+"/lease", map[string]any{"tabId": tabID, "mode": "takeover", "label": "another browser"})
	if code != 200 || holderOf(body) != tabID {
		s.t.Fatalf("the takeover of %s by %s: %d %v", session, tabID, code, body)
	}
	return epochOf(s.t, body)
}

// leaseOf is the server's answer about the lease of session, for failure messages.
func (s demoServer) leaseOf(session, tabID string) string {
	s.t.Helper()
	code, g := s.api.do("GET", "/v1/sessions/"+session+"/lease?tabId="+tabID, nil)
	epoch, _ := g["epoch"].(float64)
	return fmt.Sprintf("%d held=%v holder=%s epoch=%d handoff=%v", code, g["held"], holderOf(g), int64(epoch), g["handoff"])
}

// listedTab is one tab of GET …/tabs.
type listedTab struct {
	TabID, Label, ConnectedAt string
	Hidden                    bool
}

// tabsWithin polls GET /v1/sessions/{session}/tabs until it lists exactly the tabIds want
// (sorted), for at most d; it returns the last listing and whether it matched.
func (s demoServer) tabsWithin(session string, want []string, d time.Duration) ([]listedTab, bool) {
	s.t.Helper()
	var listed []listedTab
	_, ok := within(time.Now(), d, func() bool {
		code, body := s.api.do("GET", "/v1/sessions/"+session+"/tabs", nil)
		if code != 200 {
			s.t.Fatalf("GET …/sessions/%s/tabs: %d %v", session, code, body)
		}
		listed = listed[:0]
		var ids []string
		list, _ := body["tabs"].([]any)
		for _, x := range list {
			m, _ := x.(map[string]any)
			tab := listedTab{}
			tab.TabID, _ = m["tabId"].(string)
			tab.Label, _ = m["label"].(string)
			tab.ConnectedAt, _ = m["connectedAt"].(string)
			tab.Hidden, _ = m["hidden"].(bool)
			listed = append(listed, tab)
			ids = append(ids, tab.TabID)
		}
		slices.Sort(ids)
		return slices.Equal(ids, want)
	})
	return listed, ok
}

// checkNoWedge waits until the server no longer shows a handoff pending on session (the request
// lapsed), and then fails t when holder, which the server still shows holding the lease, refuses
// a guarded mutation or still shows a handoff.
func (s demoServer) checkNoWedge(t *testing.T, holder demoTab, session string) {
	t.Helper()
	var g map[string]any
	_, ok := within(time.Now(), lateBound, func() bool {
		_, g = s.api.do("GET", "/v1/sessions/"+session+"/lease?tabId="+holder.id, nil)
		return g["handoff"] == nil
	})
	if !ok {
		t.Errorf("the handoff request never lapsed on the server: %v", g)
		return
	}
	if g["held"] != true || holderOf(g) != holder.id {
		return // the holder no longer holds the lease: nothing may be wedged
	}
	epoch := epochOf(t, g)
	if err := holder.Until(`tablease.handoff === null`, 3*time.Second); err != nil {
		t.Errorf("the handoff request lapsed, the holder still holds epoch %d, but it still shows handoff: %v; client: %v", epoch, err, lifecycleOf(holder))
	}
	if got := guardAnswer(holder); got != "ran" {
		t.Errorf("the holder is wedged: the server shows it holding epoch %d with no handoff pending, but its guarded mutation answers %s; client: %v",
			epoch, got, lifecycleOf(holder))
	}
}

// checkCarrier fails t (and goes on) unless carrier, the tab opened first, carries the browser's
// event stream and the followers do not.
// ownerBehindCarrier opens two tabs of session in b: the first takes the lease and carries the
// event stream; the second takes control ("Use here", a takeover), and the first, a viewer now,
// keeps carrying the stream. It answers the two.
func ownerBehindCarrier(t *testing.T, srv demoServer, b *browsertest.Browser, session string) (carrier, owner demoTab) {
	t.Helper()
	return ownerBehind(t, srv, session, b.NewTab("carrier"), func() *browsertest.Tab { return b.NewTab("owner") })
}

// ownerBehind is ownerBehindCarrier with the carrier's tab given, and the owner's opened by
// newOwner once the carrier holds the lease.
func ownerBehind(t *testing.T, srv demoServer, session string, carrierTab *browsertest.Tab, newOwner func() *browsertest.Tab) (carrier, owner demoTab) {
	t.Helper()
	carrier = srv.open(carrierTab, session)
	carrier.WaitFor("the first tab to be owner", ownerJS, 15*time.Second)
	owner = srv.open(newOwner(), session)
	owner.WaitFor("the second tab to be a viewer", viewerOfJS(carrier.id), 10*time.Second)
	browsertest.Eval[bool](owner, `tablease.takeover().then(() => true)`)
	owner.WaitFor("the second tab to be owner", ownerJS, 5*time.Second)
	carrier.WaitFor("the first tab to be a viewer of the second", viewerOfJS(owner.id), 5*time.Second)
	checkCarrier(t, carrier, owner)
	return carrier, owner
}

// countRequests counts the calls tab makes whose path ends with each key: its requests
// (countHTTP), and the messages of the same calls on its lease socket (countSocketCalls: a message
// of op renew is a POST …/lease/renew).
func countRequests(t *testing.T, tab demoTab, counts map[string]*atomic.Int64) {
	t.Helper()
	countHTTP(t, tab, counts)
	for suffix, n := range counts {
		if op, ok := strings.CutPrefix(suffix, "/lease/"); ok {
			countSocketCalls(t, tab, op, n)
		}
	}
}

// countHTTP counts the requests tab sends whose URL path ends with each key, and lets them go on
// (CDP's Fetch domain).
func countHTTP(t *testing.T, tab demoTab, counts map[string]*atomic.Int64) {
	t.Helper()
	ctx := tab.Context()
	paused := chromedp.Events(ctx, fetch.RequestPaused)
	go func() {
		for ev, err := range paused {
			if err != nil {
				return
			}
			if u, err := url.Parse(ev.Request.URL); err == nil {
				for suffix, n := range counts {
					if strings.HasSuffix(u.Path, suffix) {
						n.Add(1)
					}
				}
			}
			_, _ = chromedp.Call(ctx, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: ev.RequestID})
		}
	}()
	var patterns []*fetch.RequestPattern
	for suffix := range counts {
		patterns = append(patterns, &fetch.RequestPattern{URLPattern: "*" + suffix + "*"})
	}
	if _, err := chromedp.Call(ctx, fetch.Enable, fetch.EnableParams{Patterns: patterns}); err != nil {
		t.Fatalf("Fetch.enable: %v", err)
	}
}

// countSocketCalls counts the messages of op that tab sends on its lease socket (the Network
// domain's frames).
func countSocketCalls(t *testing.T, tab demoTab, op string, n *atomic.Int64) {
	t.Helper()
	ctx := tab.Context()
	frames := chromedp.Events(ctx, network.WebSocketFrameSent)
	go func() {
		for ev, err := range frames {
			if err != nil {
				return
			}
			var m struct{ Op string }
			if ev.Response != nil && json.Unmarshal(ev.Response.PayloadData, &m) == nil && m.Op == op {
				n.Add(1)
			}
		}
	}()
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatalf("Network.enable: %v", err)
	}
}

func checkCarrier(t *testing.T, carrier demoTab, followers ...demoTab) {
	t.Helper()
	if err := carrier.Until(`tablease.streamCarrier === true`, 5*time.Second); err != nil {
		t.Errorf("tab %s, opened first, does not carry the event stream: %v; client: %v", carrier.Name(), err, lifecycleOf(carrier))
	}
	for _, f := range followers {
		if s := lifecycleOf(f); s.StreamCarrier != false {
			t.Errorf("tab %s, opened after %s, shows streamCarrier %v, want false: %v", f.Name(), carrier.Name(), s.StreamCarrier, s)
		}
	}
}

// guardJS runs a guarded mutation in the tab: "ran" when it ran, else the code of its refusal.
const guardJS = `tablease.guard(async () => "ran")({}).then((r) => r === "ran" ? "ran" : (r && r.error && r.error.code) || JSON.stringify(r))`

func guardAnswer(tab demoTab) string {
	got, err := browsertest.TryEval[string](tab, guardJS, 5*time.Second)
	if err != nil {
		return "no answer: " + err.Error()
	}
	return got
}

// within calls cond until it is true, or until late has passed since start; it returns how long
// after start cond was first true (or when it gave up) and whether it was.
func within(start time.Time, late time.Duration, cond func() bool) (time.Duration, bool) {
	for {
		if cond() {
			return time.Since(start), true
		}
		if time.Since(start) > late {
			return time.Since(start), false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// showsWithin polls expr in tab until it is true, or until late has passed since start.
func showsWithin(tab demoTab, expr string, start time.Time, late time.Duration) (time.Duration, bool) {
	return within(start, late, func() bool {
		ok, err := browsertest.TryEval[bool](tab, "Boolean("+expr+")", time.Second)
		return err == nil && ok
	})
}

// clientLifecycle is what a demo tab's client says of itself, for assertions and failure messages.
type clientLifecycle struct {
	State         string // tablease.state; "(undefined)" when the client has none
	StreamCarrier any    // tablease.streamCarrier as it is; "(undefined)" when missing
	StreamLive    bool
	Role          string // document.body.dataset.role
	ClientRole    string // tablease.role
	Holder        string
	Epoch         int64
	Handoff       string
	InFlight      int
	Err           string // the page did not answer
}

func (c clientLifecycle) String() string {
	if c.Err != "" {
		return "{unreadable: " + c.Err + "}"
	}
	return fmt.Sprintf("{state=%s streamCarrier=%v streamLive=%v role=%s tablease.role=%s holder=%s epoch=%d handoff=%q inFlight=%d}",
		c.State, c.StreamCarrier, c.StreamLive, c.Role, c.ClientRole, c.Holder, c.Epoch, c.Handoff, c.InFlight)
}

func lifecycleOf(tab demoTab) clientLifecycle {
	s, err := browsertest.TryEval[clientLifecycle](tab, `({
		state: tablease.state === undefined ? "(undefined)" : String(tablease.state),
		streamCarrier: tablease.streamCarrier === undefined ? "(undefined)" : tablease.streamCarrier,
		streamLive: Boolean(tablease.streamLive),
		role: document.body.dataset.role || "",
		clientRole: tablease.role,
		holder: tablease.lease.holder ? tablease.lease.holder.tabId : "",
		epoch: tablease.lease.epoch || 0,
		handoff: tablease.handoff || "",
		inFlight: tablease.inFlight,
	})`, 5*time.Second)
	if err != nil {
		return clientLifecycle{Err: err.Error()}
	}
	return s
}

// ownerAndViewer opens two tabs of session in b: the first, which becomes the owner and carries
// the stream, then the second, a viewer of it.
func (s demoServer) ownerAndViewer(b *browsertest.Browser, session, first, second string) (demoTab, demoTab) {
	s.t.Helper()
	owner := s.open(b.NewTab(first), session)
	owner.WaitFor("the first tab to be owner", ownerJS, 15*time.Second)
	viewer := s.open(b.NewTab(second), session)
	viewer.WaitFor("the second tab to be a viewer", viewerOfJS(owner.id), 10*time.Second)
	return owner, viewer
}

// crossOriginPage is the page served from another origin than tablease's: it imports the client
// from tablease, takes its access token from its own origin, and records the client's error events.
var crossOriginPage = template.Must(template.New("page").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>An app on another origin</title>
{{if .CSP}}<meta http-equiv="Content-Security-Policy" content="{{.CSP}}">{{end}}</head>
<body data-role="viewer">
<p>An app on another origin than tablease.</p>
<script type="module">
import { TabLease } from "{{.Base}}/sdk/tablease.js";
window.leaseErrors = [];
async function getToken() {
  const res = await fetch("/token", { cache: "no-store" });
  return (await res.json()).token;
}
const lease = new TabLease({
  baseUrl: "{{.Base}}",
  sessionId: new URLSearchParams(location.search).get("session"),
  getToken,
  label: "An app on another origin",
  {{if .TTLMs}}ttlMs: {{.TTLMs}},{{end}}
});
window.tablease = lease;
lease.on("error", ({ error }) => leaseErrors.push({ code: String(error?.code ?? ""), message: String(error?.message ?? "") }));
lease.on("rolechange", ({ role }) => { document.body.dataset.role = role; });
lease.start().then(() => (window.startResult = "started"), (e) => (window.startResult = "rejected: " + (e?.message ?? e)));
</script>
</body></html>
`))

// startCrossOrigin starts tablease (its origin allowed by TABLEASE_CORS_ORIGINS when allow) and a
// page server on another origin (startOtherOrigin) that answers / with crossOriginPage and /token
// with an access token of the demo's user.
func startCrossOrigin(t *testing.T, rds *redistest.Server, allow bool) (demoServer, string) {
	t.Helper()
	return startCrossOriginNamed(t, rds, "localhost", allow)
}

// startCrossOriginNamed is startCrossOrigin with the page's origin on host (startOriginNamed).
func startCrossOriginNamed(t *testing.T, rds *redistest.Server, host string, allow bool) (demoServer, string) {
	t.Helper()
	return startOriginNamed(t, rds, host, allow, "/token", func(base string) string {
		return crossOriginHTML(t, crossOriginOptions{Base: base})
	})
}

// crossOriginOptions are crossOriginPage's: tablease's base URL, the page's Content-Security-Policy
// (none when empty) and the TTL its client asks for (the server's default when 0).
type crossOriginOptions struct {
	Base, CSP string
	TTLMs     int
}

func crossOriginHTML(t *testing.T, o crossOriginOptions) string {
	t.Helper()
	var b strings.Builder
	if err := crossOriginPage.Execute(&b, o); err != nil {
		t.Fatalf("the page on another origin: %v", err)
	}
	return b.String()
}

// startOtherOrigin starts tablease (its origin allowed by TABLEASE_CORS_ORIGINS when allow) and a
// page server on http://localhost:P, another origin than tablease's http://127.0.0.1:S. The page
// server answers / with page(tablease's base URL) and tokenPath with {"token"} of the demo's user.
func startOtherOrigin(t *testing.T, rds *redistest.Server, allow bool, tokenPath string, page func(base string) string) (demoServer, string) {
	t.Helper()
	return startOriginNamed(t, rds, "localhost", allow, tokenPath, page)
}

// startOriginNamed is startOtherOrigin with the page's origin http://host:P: a name other than
// localhost must be mapped to 127.0.0.1 by the browser's host rules, and its pages are not a
// secure context (no Web Locks).
func startOriginNamed(t *testing.T, rds *redistest.Server, host string, allow bool, tokenPath string, page func(base string) string) (demoServer, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	origin := fmt.Sprintf("http://%s:%d", host, ln.Addr().(*net.TCPAddr).Port)
	var extra map[string]string
	if allow {
		extra = map[string]string{"TABLEASE_CORS_ORIGINS": origin}
	}
	srv := startDemoServer(t, rds, extra)
	if !strings.HasPrefix(srv.base, "http://127.0.0.1:") {
		t.Fatalf("tablease listens on %s, want 127.0.0.1 so that localhost is another origin", srv.base)
	}
	html := page(srv.base)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		fmt.Fprint(w, html)
	})
	mux.HandleFunc("GET "+tokenPath, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		fmt.Fprintf(w, `{"token":%s}`, jsString(srv.api.token))
	})
	server := httptest.NewUnstartedServer(mux)
	server.Listener.Close()
	server.Listener = ln
	server.Start()
	t.Cleanup(server.Close)
	return srv, origin
}

// crossOriginState is what the page on another origin shows.
type crossOriginState struct {
	Role, ClientRole, State, Start string
	StreamLive                     bool
	Errors                         []struct{ Code, Message string }
	Err                            string
}

func (c crossOriginState) String() string {
	if c.Err != "" {
		return "{unreadable: " + c.Err + "}"
	}
	return fmt.Sprintf("{role=%s tablease.role=%s state=%s start()=%s streamLive=%v errors=%+v}", c.Role, c.ClientRole, c.State, c.Start, c.StreamLive, c.Errors)
}

func crossOriginOf(tab *browsertest.Tab) crossOriginState {
	s, err := browsertest.TryEval[crossOriginState](tab, `({
		role: document.body.dataset.role || "",
		clientRole: window.tablease ? tablease.role : "(no client: the module did not load)",
		state: window.tablease && tablease.state !== undefined ? String(tablease.state) : "(undefined)",
		start: window.startResult === undefined ? "(pending)" : String(window.startResult),
		streamLive: Boolean(window.tablease && tablease.streamLive),
		errors: window.leaseErrors || [],
	})`, 5*time.Second)
	if err != nil {
		return crossOriginState{Err: err.Error()}
	}
	return s
}

// disableTool is the demo's catalog file with every entry of the tool name disabled.
func disableTool(t *testing.T, name string) []byte {
	t.Helper()
	raw, err := os.ReadFile("../../web/demo/catalog.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Tools []map[string]any `json:"tools"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, tool := range doc.Tools {
		if tool["name"] == name {
			tool["disabled"] = true
			n++
		}
	}
	if n == 0 {
		t.Fatalf("the demo's catalog has no tool %s", name)
	}
	out, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// putCatalog replaces the stored catalog as an admin does, whatever its version.
func (s demoServer) putCatalog(doc []byte) {
	s.t.Helper()
	req, err := http.NewRequest("PUT", s.base+"/v1/admin/catalog", bytes.NewReader(doc))
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+s.admin.token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("If-Match", "*")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		body, _ := io.ReadAll(resp.Body)
		s.t.Fatalf("PUT /v1/admin/catalog: %d %s", resp.StatusCode, body)
	}
}
