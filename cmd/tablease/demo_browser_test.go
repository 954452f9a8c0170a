package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tablease/tablease/api"
	"github.com/tablease/tablease/internal/browsertest"
	"github.com/tablease/tablease/internal/redistest"
	"github.com/tablease/tablease/internal/syncbuf"
)

// TestDemoInARealBrowser runs the demo (/demo, web/demo) and its client (web/sdk/tablease.js) in
// tabs of one real headless Chromium, against the real `tablease serve` on a real Redis: what
// docs/browser-client.md promises a user who opens an app in several tabs. Every subtest has its
// own server (some need a short TTL), browser and session. Tabs of one browser share its profile,
// so they share Web Locks, BroadcastChannel, localStorage and the six HTTP/1.1 connections per
// origin. Screenshots of both roles go to the artifacts directory (see internal/browsertest).
func TestDemoInARealBrowser(t *testing.T) {
	browsertest.Chromium(t) // fail first, and clearly, when there is no browser
	rds := redistest.Start(t)

	t.Run("of two tabs the first is owner and the second a viewer whose catalog is read-only", func(t *testing.T) {
		srv := startDemoServer(t, rds, nil)
		b := browsertest.Start(t)
		owner := srv.open(b.NewTab("first"), "two-tabs")
		owner.WaitFor("the first tab to be owner", ownerJS, 15*time.Second)
		viewer := srv.open(b.NewTab("second"), "two-tabs")
		viewer.WaitFor("the second tab to be a viewer of the first", viewerOfJS(owner.id), 10*time.Second)
		srv.mustHold(owner.session, owner.id)

		// What the server hands each tab (GET …/catalog?tabId=&route=), as the client asks.
		if tools, role := srv.catalog(owner.session, viewer.id); role != "viewer" || !slices.Equal(tools, []string{"get_event_details:ro", "search_events:ro"}) {
			t.Errorf("the server's catalog for the viewer: role %q, tools %v; want viewer with only get_event_details and search_events, read-only", role, tools)
		}
		if tools, role := srv.catalog(owner.session, owner.id); role != "owner" ||
			!slices.Equal(tools, []string{"ask_user:rw", "get_event_details:ro", "save_event:rw", "search_events:ro"}) {
			t.Errorf("the server's catalog for the owner: role %q, tools %v; want owner with the list page's four tools", role, tools)
		}
		// The same through the page: the client's catalog() and the tools the demo exposes.
		const pageCatalog = `tablease.catalog('/events').then((c) => ({role: c.role, serverRole: c.serverRole,
			tools: c.tools.map((t) => t.name + (t.annotations && t.annotations.readOnlyHint === true ? ':ro' : ':rw')).sort()}))`
		type catalogAnswer struct {
			Role, ServerRole string
			Tools            []string
		}
		got := browsertest.Eval[catalogAnswer](viewer, pageCatalog)
		if got.Role != "viewer" || got.ServerRole != "viewer" || !slices.Equal(got.Tools, []string{"get_event_details:ro", "search_events:ro"}) {
			t.Errorf("tablease.catalog() in the viewer tab: %+v; want only the read-only tools", got)
		}
		got = browsertest.Eval[catalogAnswer](owner, pageCatalog)
		if got.Role != "owner" || got.ServerRole != "owner" || len(got.Tools) != 4 {
			t.Errorf("tablease.catalog() in the owner tab: %+v; want the list page's four tools", got)
		}
		viewer.WaitFor("the viewer to expose only the read-only tools", exposedJS("get_event_details, search_events"), 5*time.Second)
		owner.WaitFor("the owner to expose every tool of the list page", exposedJS("ask_user, get_event_details, save_event, search_events"), 5*time.Second)

		// A mutation tool called in the viewer is refused without running.
		if code, out := callTool(viewer, "save_event", `{"event_id":"evt-webmcp-intro"}`); code != "NOT_LEASE_OWNER" {
			t.Errorf("save_event in the viewer tab answered %s: %s", code, out)
		}
		if code, out := callTool(owner, "save_event", `{"event_id":"evt-webmcp-intro"}`); code != "ok" {
			t.Errorf("save_event in the owner tab answered %s: %s", code, out)
		}
		if code, out := callTool(viewer, "search_events", `{"q":"webmcp"}`); code != "ok" {
			t.Errorf("search_events (read-only) in the viewer tab answered %s: %s", code, out)
		}
		owner.Screenshot("owner")
		viewer.Screenshot("viewer")
	})

	t.Run("Use here moves control and the old tab's mutation tools are refused within a second", func(t *testing.T) {
		srv := startDemoServer(t, rds, nil)
		b := browsertest.Start(t)
		old := srv.open(b.NewTab("old"), "use-here")
		old.WaitFor("the first tab to be owner", ownerJS, 15*time.Second)
		next := srv.open(b.NewTab("new"), "use-here")
		next.WaitFor("the second tab to be a viewer", viewerOfJS(old.id), 10*time.Second)
		oldEpoch := srv.mustHold(old.session, old.id)
		if code, out := callTool(old, "save_event", `{"event_id":"evt-webmcp-intro"}`); code != "ok" {
			t.Fatalf("save_event in the owner tab before the takeover answered %s: %s", code, out)
		}

		clicked := time.Now()
		clickAction(next, "use-here")
		deadline := clicked.Add(time.Second)
		var code, out string
		for {
			code, out = callTool(old, "save_event", `{"event_id":"evt-webmcp-intro"}`)
			if code == "NOT_LEASE_OWNER" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the old tab's save_event still answered %s %v after the click on Use here, want NOT_LEASE_OWNER within 1s: %s",
					code, time.Since(clicked).Round(time.Millisecond), out)
			}
		}
		if err := old.Until(viewerOfJS(next.id), time.Until(deadline)); err != nil {
			old.Screenshot("failed-viewer")
			t.Fatalf("the old tab does not show that the new tab controls the session within 1s of the click: %v; page: %+v", err, stateOf(old))
		}
		refusedAfter := time.Since(clicked)
		if !strings.Contains(out, "NOT_LEASE_OWNER") {
			t.Errorf("the agent panel does not show the refusal: %q", out)
		}
		next.WaitFor("the new tab to be owner", ownerJS, 5*time.Second)
		if epoch := srv.mustHold(old.session, next.id); epoch <= oldEpoch {
			t.Errorf("the takeover's epoch %d is not above the old one %d", epoch, oldEpoch)
		}
		if code, out := callTool(next, "save_event", `{"event_id":"evt-webmcp-intro"}`); code != "ok" {
			t.Errorf("save_event in the new owner answered %s: %s", code, out)
		}
		t.Logf("the old tab refused its mutation tool and showed the viewer banner %v after the click", refusedAfter.Round(time.Millisecond))
		next.Screenshot("owner-after-use-here")
		old.Screenshot("viewer-refused")
	})

	t.Run("a handoff asked from the viewer moves control at the holder's next safe point", func(t *testing.T) {
		srv := startDemoServer(t, rds, nil)
		b := browsertest.Start(t)
		holder := srv.open(b.NewTab("holder"), "handoff")
		holder.WaitFor("the first tab to be owner", ownerJS, 15*time.Second)
		asker := srv.open(b.NewTab("asker"), "handoff")
		asker.WaitFor("the second tab to be a viewer", viewerOfJS(holder.id), 10*time.Second)
		oldEpoch := srv.mustHold(holder.session, holder.id)
		events := openEvents(t, srv.base, "/v1/sessions/handoff/events?tabId=e2e-observer", srv.api.token)
		events.must("snapshot", 5*time.Second)

		// A guarded mutation that stays in flight until the test lets it finish: the holder's
		// safe point is when no guarded handler runs.
		browsertest.Eval[chromedp.Void](holder, `(() => {
			const m = window.e2eMutation = {started: false, answer: null};
			const gate = new Promise((resolve) => (m.finish = resolve));
			const run = tablease.guard(async (args, lease) => {
				m.started = true;
				m.epoch = lease.epoch;
				await gate;
				return {done: true, epoch: lease.epoch};
			});
			run({}).then((answer) => (m.answer = answer));
		})()`)
		holder.WaitFor("the guarded mutation to be running", `e2eMutation.started && tablease.inFlight === 1`, 5*time.Second)

		clickAction(asker, "request-handoff")
		asker.WaitFor("the asking tab to be waiting for the handoff", `tablease.handoff === 'requesting' && `+
			`!document.querySelector('[data-field="handoff-status"]').hidden`, 5*time.Second)
		// The server records the request, in the same step as its event, while the holder keeps the lease.
		asked := events.handoffRequested(t, 5*time.Second)
		if r, _ := asked["requester"].(map[string]any); r["tabId"] != asker.id || holderOf(asked) != holder.id {
			t.Fatalf("the handoff request is %v; want the asking tab %s asking the holder %s", asked, asker.id, holder.id)
		}
		code, g := srv.api.do("GET", "/v1/sessions/handoff/lease?tabId="+asker.id, nil)
		h, _ := g["handoff"].(map[string]any)
		if r, _ := h["requester"].(map[string]any); code != 200 || h["state"] != "requested" || r["tabId"] != asker.id {
			t.Fatalf("the lease answer after the request: %d %v; want handoff requested by %s", code, g, asker.id)
		}
		if g["held"] != true || holderOf(g) != holder.id || epochOf(t, g) != oldEpoch {
			t.Fatalf("while the handoff is requested the lease is %v; want it still held by %s at epoch %d", g, holder.id, oldEpoch)
		}
		// The holder hears of it and keeps the lease while the mutation runs, refusing new guarded calls.
		holder.WaitFor("the holder to hear of the request",
			`document.querySelector('[data-field="log"]').innerText.includes('handoff: requested')`, 5*time.Second)
		code, g = srv.api.do("GET", "/v1/sessions/handoff/lease?tabId="+asker.id, nil)
		if h, _ := g["handoff"].(map[string]any); code != 200 || g["held"] != true || holderOf(g) != holder.id || h["state"] != "requested" {
			t.Fatalf("the holder let go while its guarded mutation was in flight: %d %v", code, g)
		}
		if !browsertest.Eval[bool](holder, `tablease.handoff === 'releasing' && tablease.inFlight === 1 && `+
			`!document.querySelector('[data-field="owner-note"]').hidden`) {
			t.Fatalf("the holder does not show that it hands over once the mutation ends: %+v", stateOf(holder))
		}
		if code, out := callTool(holder, "save_event", `{"event_id":"evt-webmcp-intro"}`); code != "NOT_LEASE_OWNER" {
			t.Errorf("save_event in the holder asked to hand over answered %s, want NOT_LEASE_OWNER: %s", code, out)
		}
		holder.Screenshot("asked-to-hand-over")
		asker.Screenshot("asking")

		finished := time.Now()
		browsertest.Eval[chromedp.Void](holder, `e2eMutation.finish()`)
		deadline := finished.Add(5 * time.Second)
		end := events.lease(t, oldEpoch, time.Until(deadline))
		if r, _ := end["requester"].(map[string]any); end["type"] != "released" || r["tabId"] != asker.id {
			t.Fatalf("the holder's lease ended with %v, want released at its safe point and reserved for %s", end, asker.id)
		}
		granted := events.grant(t, time.Until(deadline))
		if granted["type"] != "granted" || granted["reason"] != "handoff" || holderOf(granted) != asker.id {
			t.Fatalf("after the release the lease went as %v; want granted to %s with reason handoff", granted, asker.id)
		}
		if err := asker.Until(ownerJS, time.Until(deadline)); err != nil {
			t.Fatalf("the asking tab is not owner within 5s of the mutation's end: %v; page: %+v", err, stateOf(asker))
		}
		if err := holder.Until(viewerOfJS(asker.id), time.Until(deadline)); err != nil {
			t.Fatalf("the old holder does not show the asking tab in control within 5s of the mutation's end: %v; page: %+v", err, stateOf(holder))
		}
		t.Logf("the asking tab was owner %v after the holder's mutation finished", time.Since(finished).Round(time.Millisecond))
		if epoch := srv.mustHold(asker.session, asker.id); epoch <= oldEpoch {
			t.Errorf("the handoff's epoch %d is not above the old one %d", epoch, oldEpoch)
		}
		type mutation struct {
			Done  bool
			Epoch int64
		}
		if got := browsertest.Eval[mutation](holder, `e2eMutation.answer`); !got.Done || got.Epoch != oldEpoch {
			t.Errorf("the in-flight mutation answered %+v; want it done under epoch %d", got, oldEpoch)
		}
		if code, out := callTool(asker, "save_event", `{"event_id":"evt-webmcp-intro"}`); code != "ok" {
			t.Errorf("save_event in the new owner answered %s: %s", code, out)
		}
		asker.Screenshot("owner")
		holder.Screenshot("viewer")
	})

	t.Run("closing the owner tab releases the lease and another tab takes it at once", func(t *testing.T) {
		srv := startDemoServer(t, rds, nil) // the default TTL, 45s: only a release frees the lease sooner
		b := browsertest.Start(t)
		closing := srv.open(b.NewTab("closing"), "close")
		closing.WaitFor("the first tab to be owner", ownerJS, 15*time.Second)
		other := srv.open(b.NewTab("other"), "close")
		other.WaitFor("the second tab to be a viewer", viewerOfJS(closing.id), 10*time.Second)
		epoch := srv.mustHold(closing.session, closing.id)
		events := openEvents(t, srv.base, "/v1/sessions/close/events?tabId=e2e-observer", srv.api.token)
		events.must("snapshot", 5*time.Second)

		closed := time.Now()
		closing.Close() // pagehide: the client releases with fetch(…, {keepalive: true})
		end := events.lease(t, epoch, 10*time.Second)
		if end["type"] != "released" {
			t.Fatalf("the closed tab's lease ended with %v, want released (by its pagehide)", end)
		}
		granted := events.grant(t, 10*time.Second)
		if holderOf(granted) != other.id {
			t.Fatalf("after the release the lease went to %v, want the other tab %s", granted, other.id)
		}
		other.WaitFor("the other tab to be owner", ownerJS, 5*time.Second)
		srv.mustHold(other.session, other.id)
		t.Logf("the other tab held the lease %v after the owner tab closed (TTL 45s)", time.Since(closed).Round(time.Millisecond))
	})

	t.Run("a crashed owner tab's lease goes to another tab within the TTL", func(t *testing.T) {
		const ttl = 3 * time.Second
		srv := startDemoServer(t, rds, map[string]string{
			"TABLEASE_TTL_DEFAULT":    ttl.String(),
			"TABLEASE_TTL_MAX":        ttl.String(),
			"TABLEASE_TTL_HIDDEN_MAX": ttl.String(),
		})
		b := browsertest.Start(t)
		crashing := srv.open(b.NewTab("crashing"), "crash")
		crashing.WaitFor("the first tab to be owner", ownerJS, 15*time.Second)
		other := srv.open(b.NewTab("other"), "crash")
		other.WaitFor("the second tab to be a viewer", viewerOfJS(crashing.id), 10*time.Second)
		epoch := srv.mustHold(crashing.session, crashing.id)
		events := openEvents(t, srv.base, "/v1/sessions/crash/events?tabId=e2e-observer", srv.api.token)
		events.must("snapshot", 5*time.Second)

		crashed := time.Now()
		crashing.Crash() // the renderer dies: no pagehide, no release
		deadline := crashed.Add(ttl + 4*time.Second)
		end := events.lease(t, epoch, time.Until(deadline))
		if end["type"] != "expired" {
			t.Fatalf("the crashed tab's lease ended with %v, want expired: nothing can release it", end)
		}
		granted := events.grant(t, time.Until(deadline))
		if holderOf(granted) != other.id {
			t.Fatalf("after the expiry the lease went to %v, want the other tab %s", granted, other.id)
		}
		other.WaitFor("the other tab to be owner", ownerJS, 5*time.Second)
		t.Logf("the other tab held the lease %v after the owner tab crashed (TTL %v)", time.Since(crashed).Round(time.Millisecond), ttl)
	})

	t.Run("eight tabs over HTTP/1.1 share one event stream and all see a takeover within two seconds", func(t *testing.T) {
		srv := startDemoServer(t, rds, nil)
		streams := srv.watchStreams(t)
		b := browsertest.Start(t)
		var tabs []demoTab
		for i := range 8 {
			tabs = append(tabs, srv.open(b.NewTab(fmt.Sprintf("tab%d", i+1)), "eight"))
		}
		first, last := tabs[0], tabs[len(tabs)-1]
		first.WaitFor("the first tab to be owner", ownerJS, 15*time.Second)
		for _, tab := range tabs[1:] {
			tab.WaitFor("a viewer of the first tab", viewerOfJS(first.id), 10*time.Second)
		}
		if proto := browsertest.Eval[string](first, `performance.getEntriesByType('navigation')[0].nextHopProtocol`); proto != "http/1.1" {
			t.Fatalf("the page was loaded over %q, want http/1.1 (six connections per origin)", proto)
		}

		clicked := time.Now()
		clickAction(last, "use-here")
		deadline := clicked.Add(2 * time.Second)
		pending := slices.Clone(tabs)
		for len(pending) > 0 {
			pending = slices.DeleteFunc(pending, func(tab demoTab) bool {
				want := viewerOfJS(last.id)
				if tab.id == last.id {
					want = ownerJS
				}
				ok, err := browsertest.TryEval[bool](tab, "Boolean("+want+")", time.Second)
				return err == nil && ok
			})
			if len(pending) > 0 && time.Now().After(deadline) {
				for _, tab := range pending {
					t.Errorf("tab %s does not show the takeover by %s %v after the click: %+v",
						tab.Name(), last.Name(), time.Since(clicked).Round(time.Millisecond), stateOf(tab))
				}
				t.FailNow()
			}
		}
		t.Logf("all eight tabs showed the takeover %v after the click", time.Since(clicked).Round(time.Millisecond))
		srv.mustHold("eight", last.id)

		// One stream, but every tab is listed: each announces itself (PUT …/tabs/{tabId}).
		code, body := srv.api.do("GET", "/v1/sessions/eight/tabs", nil)
		listed, _ := body["tabs"].([]any)
		var ids []string
		for _, x := range listed {
			tab, _ := x.(map[string]any)
			ids = append(ids, fmt.Sprint(tab["tabId"]))
		}
		var want []string
		for _, tab := range tabs {
			want = append(want, tab.id)
		}
		slices.Sort(ids)
		slices.Sort(want)
		if code != 200 || !slices.Equal(ids, want) {
			t.Errorf("GET …/tabs: %d %v; want each of the eight tabs once: %v", code, body, want)
		}
		maxOpen, now, samples, err := streams.stop()
		if err != nil {
			t.Fatalf("reading tablease_event_streams from /metrics: %v", err)
		}
		if maxOpen > 1 || now != 1 {
			t.Errorf("tablease_event_streams reached %v (now %v) over %d samples while eight tabs ran; want one stream for the browser",
				maxOpen, now, samples)
		}
		t.Logf("tablease_event_streams: at most %v over %d samples", maxOpen, samples)
	})

	t.Run("an admin revoke reaches the owner tab, which shows it is no longer in control", func(t *testing.T) {
		srv := startDemoServer(t, rds, nil)
		b := browsertest.Start(t)
		owner := srv.open(b.NewTab("owner"), "revoke")
		owner.WaitFor("the tab to be owner", ownerJS, 15*time.Second)
		epoch := srv.mustHold(owner.session, owner.id)

		// A block keeps the tab from taking the lease again at once (it would: the lease is free).
		code, body := srv.admin.do("POST", "/v1/admin/users/"+demoSub+"/sessions/revoke/lease/revoke",
			map[string]any{"reason": "e2e: support revoked the tab", "blockMs": 60000})
		if code != 200 || body["revoked"] != true || epochOf(t, body) <= epoch {
			t.Fatalf("the admin revoke: %d %v", code, body)
		}
		owner.WaitFor("the revoked tab to be a viewer with the banner",
			`document.body.dataset.role === 'viewer' && tablease.role === 'viewer' && !tablease.lease.held && `+
				bannerJS("No tab controls this session")+
				` && document.querySelector('[data-field="log"]').innerText.includes('revoked')`, 5*time.Second)
		if code, out := callTool(owner, "save_event", `{"event_id":"evt-webmcp-intro"}`); code != "NOT_LEASE_OWNER" {
			t.Errorf("save_event in the revoked tab answered %s: %s", code, out)
		}
		if code, g := srv.api.do("GET", "/v1/sessions/revoke/lease?tabId="+owner.id, nil); code != 200 || g["held"] != false {
			t.Errorf("the lease after the revoke (with a block): %d %v; want free", code, g)
		}
		owner.Screenshot("revoked")
	})

	t.Run("a Use here refused by an admin's block leaves the tab taking control when the block ends", func(t *testing.T) {
		srv := startDemoServer(t, rds, nil)
		b := browsertest.Start(t)
		owner := srv.open(b.NewTab("owner"), "blocked")
		owner.WaitFor("the tab to be owner", ownerJS, 15*time.Second)

		const block = 4 * time.Second
		code, body := srv.admin.do("POST", "/v1/admin/users/"+demoSub+"/sessions/blocked/lease/revoke",
			map[string]any{"reason": "e2e: a short block", "blockMs": block.Milliseconds()})
		if code != 200 || body["revoked"] != true {
			t.Fatalf("the admin revoke: %d %v", code, body)
		}
		ends, err := time.Parse(time.RFC3339Nano, fmt.Sprint(body["blockedUntil"]))
		if err != nil {
			t.Fatalf("the revoke's blockedUntil: %v (%v)", err, body)
		}
		// The page's own takeover during the block is refused, and cancels the retry the client had
		// scheduled for the end of the block: the client must schedule it again.
		if got := browsertest.Eval[string](owner, `tablease.takeover().then(() => "granted", (e) => e.code)`); got != "SESSION_BLOCKED" {
			t.Fatalf("takeover() during the block answered %s, want SESSION_BLOCKED", got)
		}
		owner.WaitFor("the tab to be owner again once the block ended", ownerJS, time.Until(ends)+10*time.Second)
		if late := time.Since(ends); late > 3*time.Second {
			t.Errorf("the tab took control %v after the block ended", late.Round(time.Millisecond))
		}
		srv.mustHold("blocked", owner.id)
	})
}

const demoSub = "demo" // the demo asks /dev/token?sub=demo

// demoServer is a `tablease serve` for the demo: dev mode (the demo takes its token from
// /dev/token) on Redis, with the demo's catalog, and clients for the demo's user and an admin.
type demoServer struct {
	t     *testing.T
	base  string
	logs  *syncbuf.Buffer
	api   client // the demo's user
	admin client // scope lease:admin
	env   map[string]string
	proc  *served // the running server, which restart replaces
}

func startDemoServer(t *testing.T, rds *redistest.Server, extra map[string]string) demoServer {
	t.Helper()
	env := e2eRedisEnv(t, rds)
	env["TABLEASE_DEV"] = "true"
	env["TABLEASE_CATALOG_FILE"] = "../../web/demo/catalog.json"
	for k, v := range extra {
		env[k] = v
	}
	proc := serveAt(t, env, "127.0.0.1:0", &syncbuf.Buffer{})
	base, logs := "http://"+proc.addr, proc.logs
	return demoServer{t: t, base: base, logs: logs,
		api:   client{t: t, base: base, token: e2eToken(t, demoSub)},
		admin: client{t: t, base: base, token: e2eToken(t, "root", api.ScopeAdmin)},
		env:   env, proc: &proc,
	}
}

// stop stops the server as SIGTERM does; start serves again on the same address, with the same
// configuration and Redis (the leases are kept), as a restarted instance would.
func (s demoServer) stop() { s.proc.stop() }

func (s demoServer) start() {
	s.t.Helper()
	*s.proc = serveAt(s.t, s.env, s.proc.addr, s.logs)
}

// demoTab is a tab showing the demo.
type demoTab struct {
	*browsertest.Tab
	session string
	id      string // the tabId of its TabLease
}

// open shows the demo of session in tab and waits until its client has started (its first
// answer is in) with the event stream connected.
func (s demoServer) open(tab *browsertest.Tab, session string) demoTab {
	s.t.Helper()
	return s.openWith(tab, session, "")
}

// openWith is open with more of the demo's query (such as "&socket=false").
func (s demoServer) openWith(tab *browsertest.Tab, session, query string) demoTab {
	s.t.Helper()
	tab.Do("open the demo", chromedp.Navigate(s.base+"/demo?session="+session+query))
	tab.WaitFor("the demo to start", `window.tablease && tablease.streamLive && `+
		`document.querySelector('[data-field="tab-id"]').textContent === tablease.tabId`, 15*time.Second)
	return demoTab{Tab: tab, session: session, id: browsertest.Eval[string](tab, `tablease.tabId`)}
}

// mustHold checks with the server that tabID holds the lease of session, and returns its epoch.
func (s demoServer) mustHold(session, tabID string) int64 {
	s.t.Helper()
	code, g := s.api.do("GET", "/v1/sessions/"+session+"/lease?tabId="+tabID, nil)
	if code != 200 || g["held"] != true || holderOf(g) != tabID || g["role"] != "owner" {
		s.t.Fatalf("the server does not show tab %s holding %s: %d %v", tabID, session, code, g)
	}
	return epochOf(s.t, g)
}

// catalog is the server's catalog answer for tabID on the demo's route: each tool as name:ro or
// name:rw by its readOnlyHint, and the role.
func (s demoServer) catalog(session, tabID string) (tools []string, role string) {
	s.t.Helper()
	code, body := s.api.do("GET", "/v1/sessions/"+session+"/catalog?route=/events&tabId="+tabID, nil)
	if code != 200 {
		s.t.Fatalf("GET …/catalog: %d %v", code, body)
	}
	list, _ := body["tools"].([]any)
	for _, x := range list {
		tool, _ := x.(map[string]any)
		ann, _ := tool["annotations"].(map[string]any)
		mode := ":rw"
		if ann["readOnlyHint"] == true {
			mode = ":ro"
		}
		tools = append(tools, fmt.Sprint(tool["name"])+mode)
	}
	slices.Sort(tools)
	role, _ = body["role"].(string)
	return tools, role
}

// streamWatch samples the server's tablease_event_streams gauge every 50 ms.
type streamWatch struct {
	done chan struct{}
	wg   sync.WaitGroup

	mu      sync.Mutex // protects the fields below
	max     float64
	last    float64
	samples int
	err     error
}

func (s demoServer) watchStreams(t *testing.T) *streamWatch {
	w := &streamWatch{done: make(chan struct{})}
	hc := &http.Client{Timeout: 5 * time.Second}
	w.wg.Go(func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			n, err := openStreams(hc, s.base)
			w.mu.Lock()
			if err != nil && w.err == nil {
				w.err = err
			}
			if err == nil {
				w.max, w.last = max(w.max, n), n
				w.samples++
			}
			w.mu.Unlock()
			select {
			case <-w.done:
				return
			case <-tick.C:
			}
		}
	})
	t.Cleanup(func() { w.stopOnce() })
	return w
}

func (w *streamWatch) stopOnce() {
	select {
	case <-w.done:
	default:
		close(w.done)
	}
	w.wg.Wait()
}

// stop ends the sampling and returns the highest and the last count, or the first error.
func (w *streamWatch) stop() (maxOpen, last float64, samples int, err error) {
	w.stopOnce()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil && w.samples == 0 {
		w.err = errors.New("no sample")
	}
	return w.max, w.last, w.samples, w.err
}

// openStreams reads the gauge tablease_event_streams from base's /metrics.
func openStreams(hc *http.Client, base string) (float64, error) {
	return metricValue(hc, base, "tablease_event_streams")
}

// streamsNow is how many event streams the server has open, for a failure's message.
func (s demoServer) streamsNow(t *testing.T) string {
	n, err := openStreams(&http.Client{Timeout: 5 * time.Second}, s.base)
	if err != nil {
		return err.Error()
	}
	return fmt.Sprint(n)
}

// streamsWithin waits until the server has want event streams open, d at most; it answers the
// last count read.
func (s demoServer) streamsWithin(t *testing.T, want float64, d time.Duration) (float64, bool) {
	t.Helper()
	hc := &http.Client{Timeout: 5 * time.Second}
	var n float64
	_, ok := within(time.Now(), d, func() bool {
		var err error
		n, err = openStreams(hc, s.base)
		return err == nil && n == want
	})
	return n, ok
}

// lease reads the stream until the lease event that ends epoch (released, expired, taken over,
// revoked), and returns it; events about the lease before (a renew's updated) are skipped.
func (s *eventStream) lease(t *testing.T, epoch int64, within time.Duration) map[string]any {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ev, ok := s.next(deadline)
		if !ok {
			t.Fatalf("no event ended epoch %d within %v", epoch, within)
		}
		var m map[string]any
		if ev.name != "lease" || json.Unmarshal([]byte(ev.data), &m) != nil {
			continue
		}
		switch m["type"] {
		case "released", "expired", "revoked":
			if n, _ := m["epoch"].(float64); int64(n) == epoch {
				return m
			}
		case "taken_over":
			if p, _ := m["previous"].(map[string]any); p != nil {
				if n, _ := p["epoch"].(float64); int64(n) == epoch {
					return m
				}
			}
		}
	}
}

// grant reads the stream until the next granted (or taken_over) event and returns it.
func (s *eventStream) grant(t *testing.T, within time.Duration) map[string]any {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ev, ok := s.next(deadline)
		if !ok {
			t.Fatalf("no tab was granted the lease within %v", within)
		}
		var m map[string]any
		if ev.name == "lease" && json.Unmarshal([]byte(ev.data), &m) == nil && (m["type"] == "granted" || m["type"] == "taken_over") {
			return m
		}
	}
}

// handoffRequested reads the stream until the next handoff_requested event and returns it.
func (s *eventStream) handoffRequested(t *testing.T, within time.Duration) map[string]any {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ev, ok := s.next(deadline)
		if !ok {
			t.Fatalf("no handoff was requested within %v", within)
		}
		var m map[string]any
		if ev.name == "lease" && json.Unmarshal([]byte(ev.data), &m) == nil && m["type"] == "handoff_requested" {
			return m
		}
	}
}

// ownerJS is true in a demo tab that is the owner, by its page and by its client.
const ownerJS = `document.body.dataset.role === 'owner' && tablease.role === 'owner' && ` +
	`getComputedStyle(document.getElementById('viewer-banner')).display === 'none'`

// viewerOfJS is true in a demo tab that is a viewer and shows that holder controls the session.
func viewerOfJS(holder string) string {
	return `document.body.dataset.role === 'viewer' && tablease.role === 'viewer' && ` +
		`tablease.lease.held && tablease.lease.holder.tabId === ` + jsString(holder) + ` && ` + bannerJS("Controlled in another tab")
}

// bannerJS is true when the viewer banner is shown with text.
func bannerJS(text string) string {
	return `getComputedStyle(document.getElementById('viewer-banner')).display !== 'none' && ` +
		`document.getElementById('viewer-banner').innerText.includes(` + jsString(text) + `)`
}

// exposedJS is true when the demo lists exactly names as the tools exposed to the agent now.
func exposedJS(names string) string {
	return `document.querySelector('[data-field="exposed"]').textContent.split(', ').sort().join(', ') === ` + jsString(names)
}

func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// clickAction clicks the demo's button data-action=name. A tab that is not in front takes no
// mouse input in headless Chromium, so it is element.click().
func clickAction(tab demoTab, name string) {
	browsertest.Eval[chromedp.Void](tab, `document.querySelector('[data-action=`+jsString(name)+`]').click()`)
}

// callTool calls a tool from the demo's agent panel, as an agent would, and returns the error
// code of the answer ("ok" when none) and what the panel shows.
func callTool(tab demoTab, tool, args string) (code, shown string) {
	type answer struct{ Code, Shown string }
	a := browsertest.Eval[answer](tab, `(async () => {
		const out = document.querySelector('[data-field="agent-result"]');
		delete out.dataset.code;
		out.textContent = '';
		document.querySelector('[data-field="tool"]').value = `+jsString(tool)+`;
		document.querySelector('[data-field="args"]').value = `+jsString(args)+`;
		document.querySelector('[data-action="call-tool"]').click();
		for (let i = 0; i < 200 && !out.dataset.code; i++) await new Promise((r) => setTimeout(r, 10));
		return {code: out.dataset.code || 'no answer within 2s', shown: out.textContent};
	})()`)
	return a.Code, a.Shown
}

// pageState is what a demo tab shows and its client knows, for failure messages.
type pageState struct {
	Role, ClientRole, Holder, Banner string
	Epoch                            int64
	StreamLive                       bool
}

func stateOf(tab demoTab) pageState {
	s, err := browsertest.TryEval[pageState](tab, `({role: document.body.dataset.role, clientRole: tablease.role,
		holder: tablease.lease.holder ? tablease.lease.holder.tabId : '', epoch: tablease.lease.epoch,
		streamLive: tablease.streamLive, banner: document.getElementById('viewer-banner').innerText})`, 5*time.Second)
	if err != nil {
		return pageState{Banner: "unreadable: " + err.Error()}
	}
	return s
}
