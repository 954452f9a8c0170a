package api

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tablease/tablease/internal/redistest"
	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/lease/leasemem"
	"github.com/tablease/tablease/lease/leaseredis"
)

// onEachEngine runs test on a harness over the memory engine and over a Redis engine, each on the
// real clock with presence entries that live presenceTTL (zero: the default).
func onEachEngine(t *testing.T, presenceTTL time.Duration, mods []func(*Options), test func(t *testing.T, h *harness)) {
	t.Run("memory", func(t *testing.T) {
		eng, err := leasemem.New(leasemem.Options{PresenceTTL: presenceTTL})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = eng.Close() })
		test(t, newHarness(t, append([]func(*Options){func(o *Options) { o.Engine, o.Now = eng, nil }}, mods...)...))
	})
	t.Run("redis", func(t *testing.T) {
		db := redistest.Shared(t)
		client, err := leaseredis.NewClient(db.URL(), leaseredis.DefaultOpTimeout)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = client.Close() })
		eng, err := leaseredis.New(client, leaseredis.Options{Prefix: db.Prefix(), PresenceTTL: presenceTTL})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = eng.Close() })
		test(t, newHarness(t, append([]func(*Options){func(o *Options) { o.Engine, o.Now = eng, nil }}, mods...)...))
	})
}

func tabPath(sid, tab string) string { return "/v1/sessions/" + sid + "/tabs/" + tab }

type tabPresenceAnswer struct {
	TabID          string `json:"tabId"`
	TTLMs          int64  `json:"ttlMs"`
	RefreshAfterMs int64  `json:"refreshAfterMs"`
}

// putTab announces tab with body (none when empty) and answers the presence answer.
func (h *harness) putTab(token, sid, tab, body string) tabPresenceAnswer {
	h.t.Helper()
	rec := h.do(request{method: http.MethodPut, path: tabPath(sid, tab), token: token, body: body})
	if rec.Code != http.StatusOK {
		h.t.Fatalf("PUT %s: %d %s", tabPath(sid, tab), rec.Code, rec.Body)
	}
	var out tabPresenceAnswer
	decodeStrict(h.t, rec, &out)
	return out
}

func (h *harness) deleteTab(token, sid, tab string) *httptest.ResponseRecorder {
	h.t.Helper()
	return h.do(request{method: http.MethodDelete, path: tabPath(sid, tab), token: token})
}

// expectTabs reads the next event, which must be a tabs event of type typ for tab.
func (c *sseClient) expectTabs(typ, tab string) tabsEventAnswer {
	c.t.Helper()
	var ev tabsEventAnswer
	it := c.expect("tabs", &ev)
	if ev.Type != typ || ev.Tab.TabID != tab {
		c.t.Fatalf("got tabs event %s, want %s of %s", it.Data, typ, tab)
	}
	return ev
}

func TestEveryTabOfABrowserIsListedWithItsOwnLabelThroughPutAndLeavesThroughDelete(t *testing.T) {
	onEachEngine(t, 0, nil, func(t *testing.T, h *harness) {
		ts := h.serve()
		alice := h.token("alice")
		// One browser: one stream (its carrier tab's, not listed), every tab announced by PUT.
		carrier := mustStream(t, ts, eventsPath("doc-1", "tabId=tab-a&presence=false"), alice, nil)
		var snap snapshotAnswer
		carrier.expect("snapshot", &snap)
		if len(snap.Tabs) != 0 {
			t.Fatalf("a stream with presence=false lists its tab: %+v", snap.Tabs)
		}

		got := h.putTab(alice, "doc-1", "tab-a", `{"label":"Events","hidden":false}`)
		if got != (tabPresenceAnswer{TabID: "tab-a", TTLMs: 45000, RefreshAfterMs: 15000}) {
			t.Fatalf("PUT answer %+v", got)
		}
		if ev := carrier.expectTabs("joined", "tab-a"); ev.Tab.Label != "Events" || ev.Tab.Hidden || ev.SessionID != "doc-1" {
			t.Fatalf("joined %+v", ev)
		}
		h.putTab(alice, "doc-1", "tab-b", `{"label":"Calendar","hidden":true}`)
		if ev := carrier.expectTabs("joined", "tab-b"); ev.Tab.Label != "Calendar" || !ev.Tab.Hidden {
			t.Fatalf("joined %+v", ev)
		}
		tabs := h.listTabs(alice, "doc-1")
		if len(tabs) != 2 || tabs[0].TabID != "tab-a" || tabs[0].Label != "Events" || tabs[0].Hidden ||
			tabs[1].TabID != "tab-b" || tabs[1].Label != "Calendar" || !tabs[1].Hidden {
			t.Fatalf("tabs %+v, want tab-a (Events, visible) and tab-b (Calendar, hidden)", tabs)
		}

		// A repeat refreshes the same entry: the latest label and hidden flag, announced as a
		// change, no new join; a repeat as it was announces nothing.
		h.putTab(alice, "doc-1", "tab-a", `{"label":"Events — /events/1","hidden":true}`)
		if ev := carrier.expectTabs("changed", "tab-a"); ev.Tab.Label != "Events — /events/1" || !ev.Tab.Hidden {
			t.Fatalf("changed %+v", ev)
		}
		h.putTab(alice, "doc-1", "tab-a", `{"label":"Events — /events/1","hidden":true}`)
		tabs = h.listTabs(alice, "doc-1")
		if len(tabs) != 2 || tabs[0].TabID != "tab-a" || tabs[0].Label != "Events — /events/1" || !tabs[0].Hidden || tabs[0].ConnectedAt == "" {
			t.Fatalf("tabs after the repeat %+v", tabs)
		}
		h.putTab(alice, "doc-1", "tab-b", "") // no body: no label, visible
		if tabs = h.listTabs(alice, "doc-1"); tabs[1].Label != "" || tabs[1].Hidden {
			t.Fatalf("tabs after an empty PUT %+v", tabs)
		}
		carrier.expectTabs("changed", "tab-b")

		if rec := h.deleteTab(alice, "doc-1", "tab-a"); rec.Code != http.StatusNoContent || rec.Body.Len() != 0 {
			t.Fatalf("DELETE: %d %s", rec.Code, rec.Body)
		}
		// The next tabs event is this leave: the repeat as it was announced nothing.
		carrier.expectTabs("left", "tab-a")
		for _, tab := range []string{"tab-a", "tab-never"} { // idempotent
			if rec := h.deleteTab(alice, "doc-1", tab); rec.Code != http.StatusNoContent {
				t.Fatalf("DELETE of %s again: %d %s", tab, rec.Code, rec.Body)
			}
		}
		if tabs = h.listTabs(alice, "doc-1"); len(tabs) != 1 || tabs[0].TabID != "tab-b" {
			t.Fatalf("tabs after the DELETE %+v", tabs)
		}
		h.putTab(alice, "doc-1", "tab-c", `{}`)
		carrier.expectTabs("joined", "tab-c") // the idempotent DELETEs announced nothing either
	})
}

func TestAPutThatArrivesAfterItsTabsLaterDeleteListsNothing(t *testing.T) {
	onEachEngine(t, 0, nil, func(t *testing.T, h *harness) {
		ts := h.serve()
		alice := h.token("alice")
		carrier := mustStream(t, ts, eventsPath("doc-1", "tabId=tab-a&presence=false"), alice, nil)
		carrier.expect("snapshot", &snapshotAnswer{})
		h.putTab(alice, "doc-1", "tab-a", `{"label":"A","seq":1764680400000}`)
		carrier.expectTabs("joined", "tab-a")
		h.putTab(alice, "doc-1", "tab-b", `{"label":"B","seq":5}`)
		carrier.expectTabs("joined", "tab-b")

		// tab-b's page goes: its DELETE (7) reaches the server before the PUT it sent just before
		// (6), which answers as if applied and lists nothing.
		if rec := h.do(request{method: http.MethodDelete, path: tabPath("doc-1", "tab-b") + "?seq=7", token: alice}); rec.Code != http.StatusNoContent {
			t.Fatalf("DELETE ?seq=7: %d %s", rec.Code, rec.Body)
		}
		carrier.expectTabs("left", "tab-b")
		if got := h.putTab(alice, "doc-1", "tab-b", `{"label":"B","seq":6}`); got != (tabPresenceAnswer{TabID: "tab-b", TTLMs: 45000, RefreshAfterMs: 15000}) {
			t.Fatalf("the late PUT answered %+v", got)
		}
		if tabs := h.listTabs(alice, "doc-1"); len(tabs) != 1 || tabs[0].TabID != "tab-a" {
			t.Fatalf("tabs after the late PUT %+v, want tab-a alone", tabs)
		}
		// Restored from the back/forward cache, the page lists itself again with a higher number.
		h.putTab(alice, "doc-1", "tab-b", `{"label":"B","seq":8}`)
		if tabs := h.listTabs(alice, "doc-1"); len(tabs) != 2 || tabs[1].TabID != "tab-b" {
			t.Fatalf("tabs after a PUT numbered above the DELETE %+v, want tab-a and tab-b", tabs)
		}
		carrier.expectTabs("joined", "tab-b")

		// Without numbers, as ever: the later request wins.
		h.deleteTab(alice, "doc-1", "tab-a")
		carrier.expectTabs("left", "tab-a")
		h.putTab(alice, "doc-1", "tab-a", `{"label":"A"}`)
		carrier.expectTabs("joined", "tab-a")

		for _, q := range []string{"0", "-1", "+7", "07", "7.0", "1e3", "x", "9007199254740992"} {
			wantError(t, h.do(request{method: http.MethodDelete, path: tabPath("doc-1", "tab-a") + "?seq=" + q, token: alice}), 400, CodeInvalidArgument)
			wantError(t, h.do(request{method: http.MethodPut, path: tabPath("doc-1", "tab-a"), token: alice, body: `{"seq":` + q + `}`}), 400, CodeInvalidArgument)
		}
		wantError(t, h.do(request{method: http.MethodPut, path: tabPath("doc-1", "tab-a"), token: alice, body: `{"seq":"7"}`}), 400, CodeInvalidArgument)
		if rec := h.do(request{method: http.MethodDelete, path: tabPath("doc-1", "tab-never") + "?seq=", token: alice}); rec.Code != http.StatusNoContent {
			t.Fatalf("DELETE ?seq= (empty: left out): %d %s", rec.Code, rec.Body)
		}
		if tabs := h.listTabs(alice, "doc-1"); len(tabs) != 2 {
			t.Fatalf("a refused request changed the tabs: %+v", tabs)
		}
	})
}

func TestAStreamWithPresenceFalseNeitherJoinsNorLeaves(t *testing.T) {
	onEachEngine(t, 0, nil, func(t *testing.T, h *harness) {
		ts := h.serve()
		alice := h.token("alice")
		watcher := mustStream(t, ts, eventsPath("doc-1", "tabId=tab-w"), alice, nil) // listed, as before
		watcher.expect("snapshot", nil)
		if tabs := h.listTabs(alice, "doc-1"); len(tabs) != 1 || tabs[0].TabID != "tab-w" {
			t.Fatalf("a stream without presence=false is not listed: %+v", tabs)
		}
		s := mustStream(t, ts, eventsPath("doc-1", "tabId=tab-s&label=S&presence=false"), alice, nil)
		s.expect("snapshot", nil)
		h.putTab(alice, "doc-1", "tab-s", `{"label":"by PUT"}`)
		// The first tabs event the watcher sees is the PUT's: the stream did not join.
		if ev := watcher.expectTabs("joined", "tab-s"); ev.Tab.Label != "by PUT" {
			t.Fatalf("joined %+v", ev)
		}
		s.close()
		s.expectEnd()
		h.putTab(alice, "doc-1", "tab-x", "")
		// Nor did it leave when it ended: the next event is tab-x's, and tab-s is still listed.
		watcher.expectTabs("joined", "tab-x")
		tabs := h.listTabs(alice, "doc-1")
		if len(tabs) != 3 || tabs[1].TabID != "tab-s" || tabs[1].Label != "by PUT" {
			t.Fatalf("tabs %+v", tabs)
		}
	})
}

func TestATabThatIsNotPutAgainLeavesWithinThePresenceTTL(t *testing.T) {
	const ttl = time.Second // a refresh may come two thirds of it late on a loaded machine
	onEachEngine(t, ttl, nil, func(t *testing.T, h *harness) {
		ts := h.serve()
		alice := h.token("alice")
		carrier := mustStream(t, ts, eventsPath("doc-1", "tabId=tab-k&presence=false"), alice, nil)
		carrier.expect("snapshot", nil)

		start := time.Now()
		got := h.putTab(alice, "doc-1", "tab-gone", `{"label":"closed without pagehide"}`)
		if got.TTLMs != ttl.Milliseconds() || got.RefreshAfterMs != ttl.Milliseconds()/3 {
			t.Fatalf("PUT answer %+v, want the engine's TTL and a third of it", got)
		}
		carrier.expectTabs("joined", "tab-gone")
		ev := carrier.expectTabs("left", "tab-gone")
		if ev.Reason != "timeout" {
			t.Fatalf("left %+v, want reason timeout", ev)
		}
		// The engine announces an expiry within a second of it (plus slack for a loaded machine).
		// Engines date entries by the wall clock, which the system may slew or step, and
		// time.Since reads the monotonic one: they may disagree by a few milliseconds.
		const clockSlack = 50 * time.Millisecond
		if d := time.Since(start); d < ttl-clockSlack || d > ttl+2*time.Second {
			t.Fatalf("the tab left %v after its PUT; its entry lives %v", d, ttl)
		}
		// The carrier's stream was open all along and never listed its tab.
		if tabs := h.listTabs(alice, "doc-1"); len(tabs) != 0 {
			t.Fatalf("tabs %+v", tabs)
		}

		// A tab PUT every refreshAfterMs stays listed, without churn.
		got = h.putTab(alice, "doc-1", "tab-live", "")
		carrier.expectTabs("joined", "tab-live")
		for end := time.Now().Add(3 * ttl); time.Now().Before(end); {
			time.Sleep(time.Duration(got.RefreshAfterMs) * time.Millisecond) // the client's pace
			got = h.putTab(alice, "doc-1", "tab-live", "")
			if tabs := h.listTabs(alice, "doc-1"); len(tabs) != 1 || tabs[0].TabID != "tab-live" {
				t.Fatalf("a tab refreshed every refreshAfterMs dropped out: %+v", tabs)
			}
		}
		if rec := h.deleteTab(alice, "doc-1", "tab-live"); rec.Code != http.StatusNoContent {
			t.Fatalf("DELETE: %d", rec.Code)
		}
		if ev := carrier.expectTabs("left", "tab-live"); ev.Reason != "" {
			t.Fatalf("left %+v, want a clean leave", ev)
		}
	})
}

func TestTabRoutesAreAuthorizedLikeTheOtherSessionRoutes(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.RateLimit = 1 }) // burst 2
	alice, bob := h.token("alice"), h.token("bob")
	doc2Only := h.token("carol", "doc-2")
	// Another user's: the refusals count against the user's rate limit (TestRefusedRequestsOfAValidTokenCountAgainstItsUser).
	doc2Refused := h.token("dave", "doc-2")
	for _, m := range []string{http.MethodPut, http.MethodDelete} {
		wantError(t, h.do(request{method: m, path: tabPath("doc-1", "tab-a")}), http.StatusUnauthorized, CodeUnauthenticated)
		wantError(t, h.do(request{method: m, path: tabPath("doc-1", "tab-a"), token: "not-a-token"}), http.StatusUnauthorized, CodeUnauthenticated)
		wantError(t, h.do(request{method: m, path: tabPath("doc-1", "tab-a"), token: doc2Refused}), http.StatusForbidden, CodeForbidden)
	}
	h.putTab(doc2Only, "doc-2", "tab-c", "")
	if rec := h.deleteTab(doc2Only, "doc-2", "tab-c"); rec.Code != http.StatusNoContent {
		t.Fatalf("DELETE within the sid claim: %d %s", rec.Code, rec.Body)
	}

	// Presence belongs to the token's user.
	h.putTab(alice, "doc-1", "tab-a", `{"label":"alice's"}`)
	if tabs := h.listTabs(alice, "doc-1"); len(tabs) != 1 {
		t.Fatalf("alice's tabs: %+v", tabs)
	}
	if tabs := h.listTabs(bob, "doc-1"); len(tabs) != 0 {
		t.Fatalf("bob sees alice's tabs: %+v", tabs)
	}
	if rec := h.deleteTab(bob, "doc-1", "tab-a"); rec.Code != http.StatusNoContent {
		t.Fatalf("bob's DELETE: %d", rec.Code)
	}
	// alice has spent her burst (PUT, GET): the next PUT and DELETE are limited, and the tab
	// bob tried to remove is still hers.
	for _, m := range []string{http.MethodPut, http.MethodDelete} {
		rec := h.do(request{method: m, path: tabPath("doc-1", "tab-a"), token: alice})
		wantError(t, rec, http.StatusTooManyRequests, CodeRateLimited)
		if rec.Header().Get("Retry-After") == "" {
			t.Fatal("429 without Retry-After")
		}
	}
	tabs, err := h.engine.Tabs(t.Context(), lease.Key{User: "alice", Session: "doc-1"})
	if err != nil || len(tabs) != 1 || tabs[0].Label != "alice's" {
		t.Fatalf("alice's tabs %+v, %v", tabs, err)
	}
}

func TestTabBodiesAndIdsAreValidatedStrictly(t *testing.T) {
	h := newHarness(t)
	alice := h.token("alice")
	long := strings.Repeat("t", 128)
	if got := h.putTab(alice, "doc-1", long, ""); got.TabID != long {
		t.Fatalf("PUT of a 128-character tab id: %+v", got)
	}
	if rec := h.deleteTab(alice, "doc-1", long); rec.Code != http.StatusNoContent {
		t.Fatalf("DELETE of a 128-character tab id: %d %s", rec.Code, rec.Body)
	}
	h.putTab(alice, "doc-1", "t%3A1", `{"label":"percent-encoded"}`)
	if tabs := h.listTabs(alice, "doc-1"); len(tabs) != 1 || tabs[0].TabID != "t:1" {
		t.Fatalf("tabs %+v", tabs)
	}
	// Whitespace alone is an empty body too.
	if got := h.putTab(alice, "doc-1", "t-blank", " \r\n\t "); got.TabID != "t-blank" {
		t.Fatalf("PUT of a body of whitespace: %+v", got)
	}
	h.deleteTab(alice, "doc-1", "t-blank")

	bad := []struct {
		name, path, body, contentType string
		status                        int
		code                          string
	}{
		{"an unknown field", tabPath("doc-1", "t1"), `{"label":"x","tabId":"t1"}`, "application/json", 400, CodeInvalidArgument},
		{"a label that is not a string", tabPath("doc-1", "t1"), `{"label":1}`, "application/json", 400, CodeInvalidArgument},
		{"hidden that is not a boolean", tabPath("doc-1", "t1"), `{"hidden":"true"}`, "application/json", 400, CodeInvalidArgument},
		{"a field given twice", tabPath("doc-1", "t1"), `{"hidden":true,"hidden":false}`, "application/json", 400, CodeInvalidArgument},
		{"a label over 200 characters", tabPath("doc-1", "t1"), `{"label":"` + strings.Repeat("l", 201) + `"}`, "application/json", 400, CodeInvalidArgument},
		{"a label with a control character", tabPath("doc-1", "t1"), `{"label":"a\u0007b"}`, "application/json", 400, CodeInvalidArgument},
		{"data after the object", tabPath("doc-1", "t1"), `{} {}`, "application/json", 400, CodeInvalidArgument},
		{"an array", tabPath("doc-1", "t1"), `[]`, "application/json", 400, CodeInvalidArgument},
		{"a body that is not JSON", tabPath("doc-1", "t1"), `label=x`, "application/x-www-form-urlencoded", 400, CodeInvalidArgument},
		{"a body without a Content-Type", tabPath("doc-1", "t1"), `{}`, "", 400, CodeInvalidArgument},
		{"a body over 16 KiB", tabPath("doc-1", "t1"), `{"label":"` + strings.Repeat("l", MaxBodyBytes) + `"}`, "application/json", 413, CodePayloadTooLarge},
		{"a tab id of 129 characters", tabPath("doc-1", long+"t"), "", "", 400, CodeInvalidArgument},
		{"a tab id with a space", tabPath("doc-1", "t%201"), "", "", 400, CodeInvalidArgument},
		{"the tab id ..", tabPath("doc-1", "%2E%2E"), "", "", 400, CodeInvalidArgument},
		{"a bad session id", tabPath("doc%201", "t1"), "", "", 400, CodeInvalidArgument},
	}
	for _, tc := range bad {
		t.Run(tc.name+" is refused", func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPut, tc.path, strings.NewReader(tc.body))
			if tc.contentType != "" {
				req.Header.Set("Content-Type", tc.contentType)
			}
			req.Header.Set("Authorization", "Bearer "+alice)
			rec := httptest.NewRecorder()
			h.srv.Handler().ServeHTTP(rec, req)
			wantError(t, rec, tc.status, tc.code)
		})
	}
	wantError(t, h.deleteTab(alice, "doc-1", long+"t"), 400, CodeInvalidArgument)
	wantError(t, h.do(request{method: http.MethodPost, path: tabPath("doc-1", "t1"), token: alice, body: `{}`}), 405, CodeMethodNotAllowed)
	wantError(t, h.get(eventsPath("doc-1", "tabId=t1&presence=no"), alice), 400, CodeInvalidArgument)
	wantError(t, h.get(eventsPath("doc-1", "tabId=t1&presence=FALSE"), alice), 400, CodeInvalidArgument)
	if tabs := h.listTabs(alice, "doc-1"); len(tabs) != 1 {
		t.Fatalf("a refused PUT listed a tab: %+v", tabs)
	}
}

func TestATabsPresenceIDIsAShortIdentifierNoStreamUses(t *testing.T) {
	seen := map[string]string{}
	for _, tab := range []string{"t", "tab-a", "tab-b", strings.Repeat("x", 128), strings.Repeat("x", 127) + "y"} {
		id := tabConnID(tab)
		if err := lease.ValidateID("conn", id); err != nil || len(id) > 64 {
			t.Fatalf("tabConnID(%q) = %q: %v", tab, id, err)
		}
		if id != tabConnID(tab) {
			t.Fatalf("tabConnID(%q) is not deterministic", tab)
		}
		if other, dup := seen[id]; dup {
			t.Fatalf("tabConnID(%q) = tabConnID(%q)", tab, other)
		}
		seen[id] = tab
		// A stream names its entry with rand.Text (package stream).
		if stream := rand.Text(); stream == id || strings.ContainsAny(stream, ".abcdefghijklmnopqrstuvwxyz") {
			t.Fatalf("a stream's connection id %q could collide with a tab's", stream)
		}
	}
}

func TestThePresenceAnswerHasItsDocumentedKeys(t *testing.T) {
	h := newHarness(t)
	rec := h.do(request{method: http.MethodPut, path: tabPath("doc-1", "t1"), token: h.token("alice"), body: `{"label":"L","hidden":true}`})
	hasKeys(t, rec.Body.String(), "tabId", "ttlMs", "refreshAfterMs")
	var m map[string]any
	_ = json.Unmarshal(rec.Body.Bytes(), &m)
	if m["tabId"] != "t1" {
		t.Fatalf("%s", rec.Body)
	}
}

// TestASessionListsAtMostMaxPresenceTabs: a PUT of one tab more than the session may list is 409
// TOO_MANY_TABS with the limit, and a PUT of a listed tab still refreshes it.
func TestASessionListsAtMostMaxPresenceTabs(t *testing.T) {
	onEachEngine(t, 0, nil, func(t *testing.T, h *harness) {
		alice := h.token("alice")
		for i := range lease.MaxPresence {
			h.putTab(alice, "doc-1", fmt.Sprintf("tab-%d", i), "")
		}
		rec := h.do(request{method: http.MethodPut, path: tabPath("doc-1", "tab-new"), token: alice})
		e := wantError(t, rec, http.StatusConflict, CodeTooManyTabs)
		if e.Error.Details["limit"] != float64(lease.MaxPresence) || *e.Error.Retryable {
			t.Errorf("details %v, retryable %v; want the limit %d, not retryable", e.Error.Details, *e.Error.Retryable, lease.MaxPresence)
		}
		h.putTab(alice, "doc-1", "tab-7", `{"label":"still here"}`)
	})
}
