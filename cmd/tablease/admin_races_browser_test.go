package main

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/tablease/tablease/api"
	"github.com/tablease/tablease/internal/browsertest"
	"github.com/tablease/tablease/internal/redistest"
)

// TestAdminConsoleShowsOnlyWhatItsLoadsWereFor races the console's actions against its own 2 s
// polls, holding a request of the page (CDP's Fetch domain) while the operator acts: what a load
// brings back is shown only when the token, filters and pages it went out with are still the
// page's, and a revoke on its way cannot be dismissed as cancelled.
func TestAdminConsoleShowsOnlyWhatItsLoadsWereFor(t *testing.T) {
	browsertest.Chromium(t)
	// Leases that outlive the test: the lists' pages must not shrink as it runs.
	base, admin := longLeaseServer(t)
	// 110 grants by two users: the audit log has three pages of 50, the lease list three.
	users := []client{{t: t, base: base, token: e2eToken(t, "ann")}, {t: t, base: base, token: e2eToken(t, "bob")}}
	grant := func(u client, sid string) {
		t.Helper()
		if code, body := u.do("POST", "/v1/sessions/"+sid+"/lease", map[string]any{"tabId": "tab-" + sid}); code != 200 {
			t.Fatalf("acquire %s: %d %v", sid, code, body)
		}
	}
	for i := range 110 {
		grant(users[i%2], fmt.Sprintf("doc-%03d", i))
	}
	// Each subtest has a browser of its own, whose failures are that subtest's.
	open := func(t *testing.T, name string) *browsertest.Tab {
		tab := browsertest.Start(t).NewTab(name)
		tab.Do("open the console", chromedp.Navigate(base+"/admin"), chromedp.WaitVisible(chromedp.CSS("#token")))
		enterToken(tab, "enter the admin token", admin.token)
		tab.WaitFor("the lists", `document.querySelectorAll('#audit tbody tr').length === 50 && `+
			`document.getElementById('status').textContent.startsWith('Up to date at')`, 15*time.Second)
		return tab
	}
	auditIDs := func(tab *browsertest.Tab) []string {
		return browsertest.Eval[[]string](tab, `[...document.querySelectorAll('#audit tbody tr')].map((tr) => tr.dataset.id)`)
	}
	serverAuditIDs := func(n int) []string {
		t.Helper()
		code, body := admin.do("GET", fmt.Sprintf("/v1/admin/audit?limit=%d", n), nil)
		if code != 200 {
			t.Fatalf("GET /v1/admin/audit: %d %v", code, body)
		}
		var ids []string
		for _, r := range body["records"].([]any) {
			ids = append(ids, r.(map[string]any)["id"].(string))
		}
		return ids
	}

	t.Run("older records asked for while a poll is on its way follow the page that poll brings", func(t *testing.T) {
		tab := open(t, "older")
		polls := holdRequests(t, tab, "/v1/admin/audit", "*/v1/admin/*")
		polls.waitHeld(t)
		tab.Do("ask for older records", chromedp.Click(chromedp.CSS(`button[data-action="audit-more"]`)))
		for i := range 5 {
			grant(users[0], fmt.Sprintf("late-%d", i))
		}
		polls.release(t)
		tab.WaitFor("the older records", `document.querySelectorAll('#audit tbody tr').length === 100`, 10*time.Second)
		polls.stop()
		if got, want := auditIDs(tab), serverAuditIDs(100); !slices.Equal(got, want) {
			t.Errorf("the audit log shows\n%v\nwant the server's newest 100, newest first:\n%v", got, want)
		}
		summary := browsertest.Eval[string](tab, `document.getElementById('audit-summary').textContent`)
		if !strings.Contains(summary, "not refreshed") {
			t.Errorf("with older records shown the summary reads %q; want it to say the log is not refreshed", summary)
		}

		// Refresh now during a load of older records: the newest come back, the older are dropped.
		older := holdRequests(t, tab, "cursor=", "*/v1/admin/audit*")
		tab.Do("ask for older records once more", chromedp.Click(chromedp.CSS(`button[data-action="audit-more"]`)))
		older.waitHeld(t)
		tab.Do("refresh now", chromedp.Click(chromedp.CSS(`button[data-action="refresh"]`)))
		older.release(t)
		tab.WaitFor("the newest 50 records", `document.querySelectorAll('#audit tbody tr').length === 50 && `+
			`!document.getElementById('audit-summary').textContent.includes('not refreshed')`, 10*time.Second)
		older.stop()
		if got, want := auditIDs(tab), serverAuditIDs(50); !slices.Equal(got, want) {
			t.Errorf("after Refresh now the audit log shows\n%v\nwant the server's newest 50:\n%v", got, want)
		}

		// Refresh now shows the newest records again.
		grant(users[1], "later")
		newest := serverAuditIDs(1)[0]
		tab.Do("refresh now", chromedp.Click(chromedp.CSS(`button[data-action="refresh"]`)))
		tab.WaitFor("the newest record at the top", `document.querySelector('#audit tbody tr').dataset.id === `+jsString(newest)+
			` && document.querySelectorAll('#audit tbody tr').length === 50`, 10*time.Second)
	})

	t.Run("a filter set while a poll is on its way never shows that poll's rows under its caption", func(t *testing.T) {
		tab := open(t, "filter")
		// Every change to the table or its caption is checked in the page: rows of other users under
		// the caption of bob's records are a violation.
		browsertest.Eval[bool](tab, `(() => {
			window.violations = [];
			const check = () => {
				if (!document.getElementById('audit-summary').textContent.includes('for bob')) return;
				const users = [...document.querySelectorAll('#audit tbody tr')].map((tr) => tr.cells[2].textContent);
				if (users.some((u) => u !== 'bob')) window.violations.push(users.join(','));
			};
			new MutationObserver(check).observe(document.getElementById('audit'), { subtree: true, childList: true, characterData: true });
			return true;
		})()`)
		polls := holdRequests(t, tab, "/v1/admin/audit", "*/v1/admin/*")
		polls.waitHeld(t)
		tab.Do("filter the audit log by bob",
			chromedp.SetValue(chromedp.CSS("#audit-sub"), "bob"),
			chromedp.Click(chromedp.CSS(`#audit-filter button[type="submit"]`)),
		)
		polls.release(t)
		tab.WaitFor("bob's records", `document.getElementById('audit-summary').textContent.includes('for bob')`, 10*time.Second)
		// The load after the filter went out after the held one ended: wait for the next poll's
		// request, sent once no load is on its way.
		seen := len(polls.seen())
		if err := polls.waitFor(seen+1, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		polls.stop()
		if v := browsertest.Eval[[]string](tab, `window.violations`); len(v) > 0 {
			t.Errorf("the audit log showed other users' records under the caption of bob's: %q", v)
		}
	})

	t.Run("a token forgotten while a load is on its way brings nothing back", func(t *testing.T) {
		tab := open(t, "forget")
		polls := holdRequests(t, tab, "/v1/admin/leases", "*/v1/admin/*")
		polls.waitHeld(t)
		tab.Do("forget the token", chromedp.Click(chromedp.CSS(`button[data-action="forget-token"]`)))
		polls.release(t)
		enterToken(tab, "enter the token again", admin.token)
		tab.WaitFor("the lists", `document.getElementById('status').textContent.startsWith('Up to date at')`, 10*time.Second)
		sentOnlyWith(t, polls.stop(), admin.token)
	})

	t.Run("a revoke on its way stays in its dialog until it is answered", func(t *testing.T) {
		tab := open(t, "revoke")
		row := `button[data-action="revoke"][data-sub="ann"][data-sid="doc-000"]`
		tab.Do("open the revoke dialog", chromedp.Click(chromedp.CSS(row)))
		tab.WaitFor("the dialog", `document.getElementById('revoke-dialog').open`, 5*time.Second)
		revokes := holdRequests(t, tab, "/lease/revoke", "*/lease/revoke*")
		tab.Do("confirm, then press Escape",
			chromedp.SendKeys(chromedp.CSS("#revoke-reason"), "e2e: a slow revoke"),
			chromedp.Click(chromedp.CSS(`button[data-action="confirm-revoke"]`)),
		)
		revokes.waitHeld(t)
		// Twice: Chromium closes a modal dialog at a second Escape whatever its cancel handler says,
		// and the console opens it again from its close event, a task that may run after the key's:
		// the dialog must be open again within a moment, not at once.
		for i := range 2 {
			tab.Do("press Escape", chromedp.KeyEvent(kb.Escape))
			if err := tab.Until(`document.getElementById('revoke-dialog').open`, 2*time.Second); err != nil {
				t.Errorf("Escape %d closed the dialog of a revoke on its way: %v", i+1, err)
			}
		}
		if s := browsertest.Eval[string](tab, `document.getElementById('status').textContent`); strings.Contains(s, "cancelled") {
			t.Errorf("the status says %q of a revoke on its way", s)
		}
		revokes.release(t)
		tab.WaitFor("the revoke's answer", `!document.getElementById('revoke-dialog').open && `+
			`document.getElementById('status').textContent.includes('Revoked the lease of ann / doc-000')`, 10*time.Second)
		revokes.stop()
	})

	t.Run("a dialog follows its session's holder, and says what it no longer knows", func(t *testing.T) {
		tab := open(t, "holder")
		tab.Do("look up a held session to revoke or block",
			chromedp.SetValue(chromedp.CSS("#block-sub"), "bob"),
			chromedp.SetValue(chromedp.CSS("#block-sid"), "doc-001"),
			chromedp.Click(chromedp.CSS(`button[data-action="open-block"]`)),
		)
		tab.WaitFor("the revoke dialog", `document.getElementById('revoke-dialog').open && `+
			`document.getElementById('revoke-title').textContent === 'Revoke lease'`, 5*time.Second)
		code, took := users[1].do("POST", "/v1/sessions/doc-001/lease", map[string]any{"tabId": "tab-thief", "mode": "takeover"})
		if code != 200 {
			t.Fatalf("takeover: %d %v", code, took)
		}
		tab.WaitFor("the dialog to name the new holder", `document.getElementById('revoke-changed').textContent.includes('now held by tab tab-thief')`, 10*time.Second)
		if code, body := users[1].do("POST", "/v1/sessions/doc-001/lease/release", map[string]any{"tabId": "tab-thief", "epoch": epochOf(t, took)}); code != 200 {
			t.Fatalf("release: %d %v", code, body)
		}
		tab.WaitFor("the dialog to say no tab holds it, and to offer a block", `document.getElementById('revoke-changed').textContent.includes('no tab holds the lease now') && `+
			`document.getElementById('revoke-title').textContent === 'Block session'`, 10*time.Second)

		// A revoke whose answer is lost may have taken effect: closing its dialog says so.
		revokes := holdRequests(t, tab, "/lease/revoke", "*/lease/revoke*")
		tab.Do("block for a minute",
			chromedp.SendKeys(chromedp.CSS("#revoke-reason"), "e2e: a lost answer"),
			chromedp.SetValue(chromedp.CSS("#revoke-block"), "60000"),
			chromedp.Click(chromedp.CSS(`button[data-action="confirm-revoke"]`)),
		)
		revokes.fail(t)
		tab.WaitFor("the dialog to say it may have taken effect", `document.getElementById('revoke-error').textContent.includes('may have taken effect')`, 10*time.Second)
		revokes.stop()
		tab.Do("cancel", chromedp.Click(chromedp.CSS(`button[data-action="cancel-revoke"]`)))
		if s := browsertest.Eval[string](tab, `document.getElementById('status').textContent`); !strings.Contains(s, "may have taken effect") {
			t.Errorf("closing the dialog of a revoke that may have taken effect says %q", s)
		}
	})

	t.Run("a token forgotten while a session is looked up opens no dialog", func(t *testing.T) {
		tab := open(t, "lookup")
		lookups := holdRequests(t, tab, "/v1/admin/users/", "*/v1/admin/*")
		tab.Do("look up a session",
			chromedp.SetValue(chromedp.CSS("#block-sub"), "ann"),
			chromedp.SetValue(chromedp.CSS("#block-sid"), "doc-002"),
			chromedp.Click(chromedp.CSS(`button[data-action="open-block"]`)),
		)
		lookups.waitHeld(t)
		tab.Do("forget the token", chromedp.Click(chromedp.CSS(`button[data-action="forget-token"]`)))
		lookups.release(t)
		enterToken(tab, "enter the token again", admin.token)
		tab.WaitFor("the lists", `document.getElementById('status').textContent.startsWith('Up to date at')`, 10*time.Second)
		if browsertest.Eval[bool](tab, `document.getElementById('revoke-dialog').open`) {
			t.Error("the lookup made under the forgotten token opened its dialog")
		}
		sentOnlyWith(t, lookups.stop(), admin.token)
	})

	t.Run("the token line says so when the token expires while the page is open", func(t *testing.T) {
		tab := open(t, "expiry")
		short, err := api.IssueToken(e2eAuth, api.TokenSpec{Sub: "root", Scopes: []string{api.ScopeAdmin}, TTL: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		enterToken(tab, "enter a token that expires in 2 s", short)
		tab.WaitFor("the token line to say it expires", `document.getElementById('token-state').textContent.includes(', expires ')`, 5*time.Second)
		tab.WaitFor("the token line to say it expired", `document.getElementById('token-state').textContent.includes(', expired ')`, 10*time.Second)
	})

	t.Run("the lists that cannot be refreshed offer no paging", func(t *testing.T) {
		tab := open(t, "stale")
		const pagers = `[...document.querySelectorAll('[data-action="next-page"], [data-action="audit-more"]')]`
		if !browsertest.Eval[bool](tab, pagers+`.every((b) => !b.disabled)`) {
			t.Fatal("Next page and Older records are disabled with more pages to show")
		}
		// A token signed with another secret: the server refuses it, and the lists go stale.
		const refused = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJyb290Iiwic2NvcGUiOiJsZWFzZTphZG1pbiJ9.c2lnbmVkIGJ5IGFub3RoZXIgc2VjcmV0"
		enterToken(tab, "enter a token the server refuses", refused)
		tab.WaitFor("the stale lists with no paging", `document.body.hasAttribute('data-stale') && `+pagers+`.every((b) => b.disabled)`, 10*time.Second)
	})
}

// enterToken enters token in the console's token field and uses it.
// longLeaseServer starts a server on a Redis of its own whose leases last ten minutes, so that
// what a console test lists does not change under a slow browser, and answers its URL and an
// admin's client.
func longLeaseServer(t *testing.T) (base string, admin client) {
	t.Helper()
	env := e2eRedisEnv(t, redistest.Start(t))
	env["TABLEASE_TTL_DEFAULT"], env["TABLEASE_TTL_MAX"], env["TABLEASE_TTL_HIDDEN_MAX"] = "10m", "10m", "10m"
	base, _ = startServer(t, env)
	return base, client{t: t, base: base, token: e2eToken(t, "root", api.ScopeAdmin)}
}

func enterToken(tab *browsertest.Tab, what, token string) {
	tab.Do(what,
		chromedp.SetValue(chromedp.CSS("#token"), token),
		chromedp.Click(chromedp.CSS(`button[data-action="set-token"]`)),
	)
}

// sentOnlyWith fails t for each request that went out without the bearer token.
func sentOnlyWith(t *testing.T, reqs []heldRequest, token string) {
	t.Helper()
	for _, r := range reqs {
		if r.auth != "Bearer "+token {
			t.Errorf("%s went out with Authorization %q", r.path, r.auth)
		}
	}
}

// heldRequests records the requests of a tab whose URL matches a pattern (CDP's Fetch domain),
// holds the first whose path holds a given string, and lets the others go on.
type heldRequests struct {
	ctx  context.Context
	held chan fetch.RequestID
	mu   sync.Mutex
	reqs []heldRequest
	news chan struct{} // one value per request seen, dropped when full
	done atomic.Bool   // stopped: the events of the tab's next holder are none of this one's
}

type heldRequest struct{ path, auth string }

// holdRequests starts recording the requests that match patterns and holding the first whose path
// and query contain hold (waitHeld waits for it).
func holdRequests(t *testing.T, tab interface{ Context() context.Context }, hold string, patterns ...string) *heldRequests {
	t.Helper()
	h := &heldRequests{ctx: tab.Context(), held: make(chan fetch.RequestID, 1), news: make(chan struct{}, 64)}
	paused := chromedp.Events(h.ctx, fetch.RequestPaused)
	holding := true
	go func() {
		for ev, err := range paused {
			if err != nil || h.done.Load() {
				return
			}
			u, _ := url.Parse(ev.Request.URL)
			auth, _ := ev.Request.Headers["Authorization"].(string)
			h.mu.Lock()
			h.reqs = append(h.reqs, heldRequest{path: u.RequestURI(), auth: auth})
			first := holding && strings.Contains(u.RequestURI(), hold)
			if first {
				holding = false
			}
			h.mu.Unlock()
			select {
			case h.news <- struct{}{}:
			default:
			}
			if first {
				h.held <- ev.RequestID
				continue
			}
			_, _ = chromedp.Call(h.ctx, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: ev.RequestID})
		}
	}()
	var ps []*fetch.RequestPattern
	for _, p := range patterns {
		ps = append(ps, &fetch.RequestPattern{URLPattern: p})
	}
	if _, err := chromedp.Call(h.ctx, fetch.Enable, fetch.EnableParams{Patterns: ps}); err != nil {
		t.Fatalf("Fetch.enable: %v", err)
	}
	return h
}

// waitHeld waits until a request is held.
func (h *heldRequests) waitHeld(t *testing.T) {
	t.Helper()
	select {
	case id := <-h.held:
		h.held <- id
	case <-time.After(10 * time.Second):
		t.Fatalf("no request to hold within 10 s; seen: %v", h.seen())
	}
}

// release lets the held request go on.
func (h *heldRequests) release(t *testing.T) {
	t.Helper()
	if _, err := chromedp.Call(h.ctx, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: <-h.held}); err != nil {
		t.Fatalf("Fetch.continueRequest: %v", err)
	}
}

// fail fails the held request as a network failure.
func (h *heldRequests) fail(t *testing.T) {
	t.Helper()
	if _, err := chromedp.Call(h.ctx, fetch.FailRequest, fetch.FailRequestParams{RequestID: <-h.held, ErrorReason: network.ErrorReasonFailed}); err != nil {
		t.Fatalf("Fetch.failRequest: %v", err)
	}
}

// waitFor waits until n requests were seen.
func (h *heldRequests) waitFor(n int, timeout time.Duration) error {
	deadline := time.After(timeout)
	for len(h.seen()) < n {
		select {
		case <-h.news:
		case <-deadline:
			return fmt.Errorf("%d requests seen within %v, want %d: %v", len(h.seen()), timeout, n, h.seen())
		}
	}
	return nil
}

func (h *heldRequests) seen() []heldRequest {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.reqs)
}

// stop ends the recording and returns the requests seen, in order.
func (h *heldRequests) stop() []heldRequest {
	h.done.Store(true)
	_, _ = chromedp.Call(h.ctx, fetch.Disable, cdp.Empty{})
	return h.seen()
}
