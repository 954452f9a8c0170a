package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tablease/tablease/internal/browsertest"
	"github.com/tablease/tablease/internal/redistest"
)

// TestRouteToolsInARealBrowser runs the demo's route-bound and interactive tools (web/demo, the
// client's route.js, call.js and tools.js) in a real headless Chromium against the real server on
// Redis: what docs/browser-client.md ("Route-bound tools", "Interactive and long-running tools")
// promises. The agent's calls go through the definitions the page exposes now (demo.exposed, the
// registry.sync pattern), as a WebMCP agent's would; a definition kept from an earlier page is how
// an agent that did not re-read the tools would call.
func TestRouteToolsInARealBrowser(t *testing.T) {
	browsertest.Chromium(t)
	rds := redistest.Start(t)

	t.Run("the tools follow SPA navigation list → event → another event → list, and a retired tool's call is refused", func(t *testing.T) {
		srv := startDemoServer(t, rds, nil)
		b := browsertest.Start(t)
		tab := srv.open(b.NewTab("nav"), "route-nav")
		tab.WaitFor("the tab to be owner", ownerJS, 15*time.Second)
		tab.WaitFor("the list page's tools", pageToolsJS("/events", "ask_user, get_event_details, save_event, search_events"), 5*time.Second)
		if path := browsertest.Eval[string](tab, `location.pathname`); path != "/demo/events" {
			t.Errorf("the demo opened at %s, want /demo/events", path)
		}
		keep(tab, "list", "get_event_details")
		if code := callKept(tab, "list", `{}`); code != "INVALID_ARGUMENT" {
			t.Errorf("get_event_details({}) on the list answered %s, want INVALID_ARGUMENT: the list's profile requires event_id", code)
		}

		// SPA navigation: the Details button calls history.pushState.
		browsertest.Eval[chromedp.Void](tab, `document.querySelector('[data-action="open-event"][data-event-id="evt-webmcp-intro"]').click()`)
		tab.WaitFor("the event page's tools", pageToolsJS("/events/evt-webmcp-intro", "ask_user, get_event_details, rename_event, save_event"), 5*time.Second)
		if got := browsertest.Eval[string](tab, `location.pathname + ' ' + document.body.dataset.page`); got != "/demo/events/evt-webmcp-intro detail" {
			t.Errorf("after Details the page is %q, want the event page", got)
		}
		if code := callKept(tab, "list", `{"event_id":"evt-webmcp-intro"}`); code != "ROUTE_CHANGED" {
			t.Errorf("the list's get_event_details called from the event page answered %s, want ROUTE_CHANGED (never run)", code)
		}
		keep(tab, "first", "get_event_details")

		// The detail-page rule: {} and the same id are this event, another id is refused.
		if got := eventOf(tab, "first", `{}`); got != "evt-webmcp-intro" {
			t.Errorf("get_event_details({}) on the event page read %s, want this event", got)
		}
		if got := eventOf(tab, "first", `{"event_id":"evt-webmcp-intro"}`); got != "evt-webmcp-intro" {
			t.Errorf("get_event_details with this event's id read %s, want this event", got)
		}
		type refusal struct {
			Code    string
			Details struct{ Param, Current, Given string }
		}
		r := browsertest.Eval[refusal](tab, `e2e.kept.first.execute({event_id: 'evt-a11y-night'}).then((r) => r.error)`)
		if r.Code != "ENTITY_MISMATCH" || r.Details.Param != "event_id" || r.Details.Current != "evt-webmcp-intro" || r.Details.Given != "evt-a11y-night" {
			t.Errorf("get_event_details with another event's id answered %+v, want ENTITY_MISMATCH naming both ids", r)
		}
		if code, out := callTool(tab, "get_event_details", `{}`); code != "ok" || !strings.Contains(out, "evt-webmcp-intro") {
			t.Errorf("the agent panel's get_event_details({}) on the event page answered %s: %s", code, out)
		}
		if code, out := callTool(tab, "save_event", `{}`); code != "ok" || !strings.Contains(out, `"event_id": "evt-webmcp-intro"`) {
			t.Errorf("save_event({}) on the event page answered %s: %s", code, out)
		}

		// Rendering the same route again registers nothing new.
		same := browsertest.Eval[bool](tab, `(async () => {
			const before = demo.exposed.get('get_event_details');
			history.replaceState(null, '', location.pathname + location.search);
			await new Promise((r) => setTimeout(r, 200));
			return demo.exposed.get('get_event_details') === before && demo.tracker.generation === e2e.generation;
		})()`)
		if !same {
			t.Error("re-rendering the same route replaced the exposed tool or counted a route change")
		}

		// Another event: a new instance; the first event's is retired.
		browsertest.Eval[chromedp.Void](tab, `demo.navigate('/events/evt-a11y-night')`)
		tab.WaitFor("the other event's tools", pageToolsJS("/events/evt-a11y-night", "ask_user, get_event_details, rename_event, save_event"), 5*time.Second)
		if code := callKept(tab, "first", `{}`); code != "ROUTE_CHANGED" {
			t.Errorf("the first event's get_event_details called on the second event's page answered %s, want ROUTE_CHANGED", code)
		}
		keep(tab, "second", "get_event_details")
		if got := eventOf(tab, "second", `{}`); got != "evt-a11y-night" {
			t.Errorf("get_event_details({}) on the second event's page read %s", got)
		}

		// Back to the list with the page's button, then the browser's back (popstate).
		clickAction(tab, "back")
		tab.WaitFor("the list page's tools again", pageToolsJS("/events", "ask_user, get_event_details, save_event, search_events"), 5*time.Second)
		if code := callKept(tab, "second", `{}`); code != "ROUTE_CHANGED" {
			t.Errorf("an event page's get_event_details called on the list answered %s, want ROUTE_CHANGED", code)
		}
		browsertest.Eval[chromedp.Void](tab, `history.back()`)
		tab.WaitFor("the second event's page after Back", pageToolsJS("/events/evt-a11y-night", "ask_user, get_event_details, rename_event, save_event"), 5*time.Second)

		// An event page loaded directly (a reload) shows its tools at once.
		tab.Do("load an event page", chromedp.Navigate(srv.base+"/demo/events/evt-edge-cache?session=route-nav"))
		tab.WaitFor("the reloaded event page's tools", `window.demo && `+pageToolsJS("/events/evt-edge-cache", "ask_user, get_event_details, rename_event, save_event")+
			` && tablease.role === 'owner'`, 15*time.Second)
		tab.Screenshot("event-page")
	})

	t.Run("ask_user resolves what the user answers, a cancel, and the agent's cancel; a second question is refused", func(t *testing.T) {
		srv := startDemoServer(t, rds, nil)
		b := browsertest.Start(t)
		tab := srv.open(b.NewTab("ask"), "route-ask")
		tab.WaitFor("the tab to be owner with ask_user", ownerJS+` && demo.exposed.has('ask_user')`, 15*time.Second)

		ask(tab, "a", "Which seat do you prefer?")
		tab.WaitFor("the question in its modal", modalJS("Which seat do you prefer?"), 5*time.Second)
		if left := browsertest.Eval[string](tab, `document.querySelector('[data-field="ask-deadline"]').textContent`); !strings.HasSuffix(left, " s") {
			t.Errorf("the modal shows its deadline as %q, want seconds left", left)
		}
		tab.Screenshot("ask-user")
		// One interaction at a time: a second question is refused, the first stays open.
		if code := browsertest.Eval[string](tab, `demo.exposed.get('ask_user').execute({question: 'And another?'}).then((r) => r.error ? r.error.code : 'ok')`); code != "INTERACTION_ALREADY_OPEN" {
			t.Errorf("a second ask_user while one is open answered %s, want INTERACTION_ALREADY_OPEN", code)
		}
		browsertest.Eval[chromedp.Void](tab, `document.querySelector('[data-field="ask-answer"]').value = '12A'; document.querySelector('[data-action="ask-submit"]').click()`)
		if got := answerOf(tab, "a"); got != `{"answer":"12A"}` {
			t.Errorf("the answered question resolved %s", got)
		}
		tab.WaitFor("the modal to close", `!document.getElementById('ask-modal').open`, 5*time.Second)

		ask(tab, "b", "Keep going?")
		tab.WaitFor("the second question", modalJS("Keep going?"), 5*time.Second)
		clickAction(tab, "ask-cancel")
		if got := answerOf(tab, "b"); got != `{"cancelled":true,"reason":"user_cancelled"}` {
			t.Errorf("the cancelled question resolved %s", got)
		}

		// The agent cancels (its per-call signal): the agent panel's "Cancel the call".
		browsertest.Eval[chromedp.Void](tab, `(() => {
			document.querySelector('[data-field="tool"]').value = 'ask_user';
			document.querySelector('[data-field="args"]').value = '{"question": "Still there?"}';
			delete document.querySelector('[data-field="agent-result"]').dataset.code;
			document.querySelector('[data-action="call-tool"]').click();
		})()`)
		tab.WaitFor("the agent panel's question", modalJS("Still there?"), 5*time.Second)
		clickAction(tab, "cancel-call")
		tab.WaitFor("the agent's cancel to settle the call", `document.querySelector('[data-field="agent-result"]').dataset.code === 'CANCELLED' && !document.getElementById('ask-modal').open`, 5*time.Second)
	})

	t.Run("an open question is closed by a route change with UI_CONTEXT_CLOSED and by a takeover with NOT_LEASE_OWNER", func(t *testing.T) {
		srv := startDemoServer(t, rds, nil)
		b := browsertest.Start(t)
		holder := srv.open(b.NewTab("holder"), "route-cut")
		holder.WaitFor("the first tab to be owner", ownerJS+` && demo.exposed.has('ask_user')`, 15*time.Second)
		other := srv.open(b.NewTab("other"), "route-cut")
		other.WaitFor("the second tab to be a viewer", viewerOfJS(holder.id), 10*time.Second)

		ask(holder, "route", "Save this one?")
		holder.WaitFor("the question", modalJS("Save this one?"), 5*time.Second)
		browsertest.Eval[chromedp.Void](holder, `demo.navigate('/events/evt-ts-types')`)
		if got := errorOf(holder, "route"); got.Code != "UI_CONTEXT_CLOSED" || got.Details["currentRoute"] != "/events/evt-ts-types" {
			t.Errorf("the question open while the page changed resolved %+v, want UI_CONTEXT_CLOSED with the new route", got)
		}
		holder.WaitFor("the modal to close with the page", `!document.getElementById('ask-modal').open`, 5*time.Second)

		ask(holder, "takeover", "Rename it?")
		holder.WaitFor("the question", modalJS("Rename it?"), 5*time.Second)
		clickAction(other, "use-here")
		if got := errorOf(holder, "takeover"); got.Code != "NOT_LEASE_OWNER" {
			t.Errorf("the question open while another tab took over resolved %+v, want NOT_LEASE_OWNER", got)
		}
		holder.WaitFor("the modal to close with the control", `!document.getElementById('ask-modal').open`, 5*time.Second)
		other.WaitFor("the other tab to be owner", ownerJS, 5*time.Second)
	})

	t.Run("a handoff request waits for the open question and is granted at its answer", func(t *testing.T) {
		srv := startDemoServer(t, rds, nil)
		b := browsertest.Start(t)
		holder := srv.open(b.NewTab("holder"), "route-handoff")
		holder.WaitFor("the first tab to be owner", ownerJS+` && demo.exposed.has('ask_user')`, 15*time.Second)
		asker := srv.open(b.NewTab("asker"), "route-handoff")
		asker.WaitFor("the second tab to be a viewer", viewerOfJS(holder.id), 10*time.Second)
		epoch := srv.mustHold(holder.session, holder.id)

		ask(holder, "q", "Book two seats?")
		holder.WaitFor("the question", modalJS("Book two seats?"), 5*time.Second)
		// Not awaited: the promise resolves when the handoff is done.
		browsertest.Eval[chromedp.Void](asker, `void tablease.requestHandoff().then((r) => (window.e2eHandoff = r.status))`)
		holder.WaitFor("the holder to be asked", `tablease.handoff === 'releasing'`, 5*time.Second)
		if got := srv.mustHold(holder.session, holder.id); got != epoch {
			t.Fatalf("the holder's epoch moved from %d to %d while its question was open", epoch, got)
		}
		if !browsertest.Eval[bool](holder, `document.getElementById('ask-modal').open`) {
			t.Fatal("the handoff request closed the holder's open question")
		}
		browsertest.Eval[chromedp.Void](holder, `document.querySelector('[data-field="ask-answer"]').value = 'yes'; document.querySelector('[data-action="ask-submit"]').click()`)
		if got := answerOf(holder, "q"); got != `{"answer":"yes"}` {
			t.Errorf("the question answered during the handoff resolved %s", got)
		}
		if err := asker.Until(`window.e2eHandoff === 'granted' && `+ownerJS, 10*time.Second); err != nil {
			t.Fatalf("the requester was not told granted: %v; it was told %s; page: %+v", err,
				browsertest.Eval[string](asker, `JSON.stringify(window.e2eHandoff) + ' ' + tablease.handoff`), stateOf(asker))
		}
		if got := srv.mustHold(asker.session, asker.id); got <= epoch {
			t.Errorf("the handoff's epoch %d is not above %d", got, epoch)
		}
	})

	t.Run("ask_user is settled at its deadline, before the agent's runtime gives up", func(t *testing.T) {
		// A catalog whose ask_user waits 3 s, on a store of its own (the stored catalog wins).
		var doc map[string]any
		raw, err := os.ReadFile("../../web/demo/catalog.json")
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, &doc); err != nil {
			t.Fatal(err)
		}
		for _, x := range doc["tools"].([]any) {
			if tool := x.(map[string]any); tool["name"] == "ask_user" {
				tool["timeoutMs"] = 3000
			}
		}
		short, _ := json.Marshal(doc)
		file := filepath.Join(t.TempDir(), "catalog.json")
		if err := os.WriteFile(file, short, 0o600); err != nil {
			t.Fatal(err)
		}
		srv := startDemoServer(t, redistest.Start(t), map[string]string{"TABLEASE_CATALOG_FILE": file})
		b := browsertest.Start(t)
		tab := srv.open(b.NewTab("deadline"), "route-deadline")
		tab.WaitFor("the tab to be owner with the 3 s ask_user", ownerJS+` && demo.exposed.get('ask_user') && demo.exposed.get('ask_user').timeoutMs === 3000`, 15*time.Second)
		ask(tab, "late", "Nobody will answer this?")
		tab.WaitFor("the question", modalJS("Nobody will answer this?"), 5*time.Second)
		got := errorOf(tab, "late")
		if got.Code != "TIMEOUT" || got.Details["timeoutMs"] != float64(3000) {
			t.Errorf("the unanswered question resolved %+v, want TIMEOUT with timeoutMs 3000", got)
		}
		if browsertest.Eval[bool](tab, `document.getElementById('ask-modal').open`) {
			t.Error("the modal is still open after the deadline settled the call")
		}
	})
}

// pageToolsJS is true when the demo is on route and exposes exactly names (sorted, ", ").
func pageToolsJS(route, names string) string {
	return `demo.tracker.route === ` + jsString(route) + ` && [...demo.exposed.keys()].sort().join(', ') === ` + jsString(names) +
		` && [...demo.exposed.values()].every((d) => d.route === null || d.route === ` + jsString(route) + `)`
}

// keep keeps the definition of tool exposed now as e2e.kept[key], and the route generation.
func keep(tab demoTab, key, tool string) {
	browsertest.Eval[chromedp.Void](tab, `(() => {
		window.e2e = window.e2e || {kept: {}, answers: {}};
		e2e.kept[`+jsString(key)+`] = demo.exposed.get(`+jsString(tool)+`);
		e2e.generation = demo.tracker.generation;
	})()`)
}

// callKept calls a kept definition with args and returns its error code, or "ok".
func callKept(tab demoTab, key, args string) string {
	return browsertest.Eval[string](tab, `e2e.kept[`+jsString(key)+`].execute(`+args+`).then((r) => r.error ? r.error.code : 'ok')`)
}

// eventOf calls a kept get_event_details with args and returns the id of the event it read.
func eventOf(tab demoTab, key, args string) string {
	return browsertest.Eval[string](tab, `e2e.kept[`+jsString(key)+`].execute(`+args+`).then((r) => r.error ? r.error.code : r.event_id)`)
}

// ask starts ask_user(question) through the exposed definition; its answer goes to e2e.answers[key].
func ask(tab demoTab, key, question string) {
	browsertest.Eval[chromedp.Void](tab, `(() => {
		window.e2e = window.e2e || {kept: {}, answers: {}};
		e2e.answers[`+jsString(key)+`] = undefined;
		demo.exposed.get('ask_user').execute({question: `+jsString(question)+`}).then((r) => (e2e.answers[`+jsString(key)+`] = r));
	})()`)
}

// answerOf waits for the answer of ask(key) and returns it as JSON.
func answerOf(tab demoTab, key string) string {
	tab.WaitFor("the answer of "+key, `e2e.answers[`+jsString(key)+`] !== undefined`, 10*time.Second)
	return browsertest.Eval[string](tab, `JSON.stringify(e2e.answers[`+jsString(key)+`])`)
}

type toolErr struct {
	Code    string
	Message string
	Details map[string]any
}

// errorOf waits for the answer of ask(key) and returns its error.
func errorOf(tab demoTab, key string) toolErr {
	tab.WaitFor("the answer of "+key, `e2e.answers[`+jsString(key)+`] !== undefined`, 10*time.Second)
	return browsertest.Eval[toolErr](tab, `e2e.answers[`+jsString(key)+`].error || {code: 'none: ' + JSON.stringify(e2e.answers[`+jsString(key)+`])}`)
}

// modalJS is true while the ask_user modal shows question.
func modalJS(question string) string {
	return `document.getElementById('ask-modal').open && document.querySelector('[data-field="ask-question"]').textContent === ` + jsString(question)
}
