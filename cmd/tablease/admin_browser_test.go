package main

import (
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/golang-jwt/jwt/v5"

	"github.com/tablease/tablease/api"
	"github.com/tablease/tablease/internal/browsertest"
	"github.com/tablease/tablease/internal/redistest"
)

// TestAdminConsoleRevokesALeaseInARealBrowser is the admin story end to end: the real `tablease
// serve` on a real Redis, a lease taken through the API by a tab, the admin console in a real
// Chromium, a revoke from the page, and the holder's renew answering LEASE_LOST. It saves
// screenshots to the artifacts directory (see internal/browsertest).
func TestAdminConsoleRevokesALeaseInARealBrowser(t *testing.T) {
	browsertest.Chromium(t) // fail first, and clearly, when there is no browser
	rds := redistest.Start(t)
	base, _ := startServer(t, e2eRedisEnv(t, rds))
	tab := client{t: t, base: base, token: e2eToken(t, "alice")}
	admin := client{t: t, base: base, token: e2eToken(t, "root", api.ScopeAdmin)}

	code, body := admin.do("GET", "/v1/admin/leases", nil)
	if code != 200 {
		t.Fatalf("GET /v1/admin/leases as an admin: %d %v", code, body)
	}
	if code, body := tab.do("GET", "/v1/admin/leases", nil); code != 403 || errCode(body) != "FORBIDDEN" {
		t.Fatalf("a tab's token on an admin route: %d %v", code, body)
	}

	const lease = "/v1/sessions/doc-1/lease"
	code, acq := tab.do("POST", lease, map[string]any{"tabId": "tab-a", "label": "Events — /events/evt-1"})
	if code != 200 || acq["role"] != "owner" {
		t.Fatalf("the tab acquires: %d %v", code, acq)
	}
	epoch := epochOf(t, acq)
	// A second lease, listed after the first: where focus goes once the first is revoked.
	if code, body := tab.do("POST", "/v1/sessions/doc-2/lease", map[string]any{"tabId": "tab-b"}); code != 200 {
		t.Fatalf("the second lease: %d %v", code, body)
	}

	b := browsertest.Start(t)
	b.Do("open the console",
		chromedp.Navigate(base+"/admin"),
		chromedp.WaitVisible(chromedp.CSS("#token")),
	)
	b.Do("enter the admin token",
		chromedp.SetValue(chromedp.CSS("#token"), admin.token),
		chromedp.Click(chromedp.CSS(`button[data-action="set-token"]`)),
	)
	const row = `button[data-action="revoke"][data-sub="alice"][data-sid="doc-1"]`
	b.WaitFor("the lease row", `document.querySelector('`+row+`') !== null`, 15*time.Second)
	rowText := browsertest.Eval[string](b, `document.querySelector('`+row+`').closest('tr').innerText`)
	for _, want := range []string{"alice", "doc-1", "tab-a", "Events — /events/evt-1", jsonInt(epoch)} {
		if !strings.Contains(rowText, want) {
			t.Errorf("the lease row lacks %q: %q", want, rowText)
		}
	}
	b.Screenshot("leases")

	b.Do("open the revoke dialog", chromedp.Click(chromedp.CSS(row)))
	b.WaitFor("the dialog", `document.getElementById('revoke-dialog').open`, 5*time.Second)
	b.Do("give a reason and confirm",
		chromedp.SendKeys(chromedp.CSS("#revoke-reason"), "support: tab stuck on an old route"),
		chromedp.Click(chromedp.CSS(`button[data-action="confirm-revoke"]`)),
	)
	b.WaitFor("the revoke result", `document.getElementById('status').textContent.includes('Revoked the lease of alice / doc-1')`, 10*time.Second)
	b.WaitFor("the row to go", `document.querySelector('`+row+`') === null`, 10*time.Second)
	// Focus was on the row's button: it goes to the row now in its place, so the list keeps its place.
	b.WaitFor("focus on the next row", `document.activeElement && document.activeElement.dataset.sid === 'doc-2'`, 5*time.Second)
	b.WaitFor("the revoke in the audit log", `[...document.querySelectorAll('#audit tbody tr[data-action="revoke"]')]`+
		`.some((tr) => tr.innerText.includes('support: tab stuck on an old route') && /admin root \(request [\w.:-]+\)/.test(tr.innerText))`, 10*time.Second)
	b.Screenshot("revoked")

	code, renew := tab.do("POST", lease+"/renew", map[string]any{"tabId": "tab-a", "epoch": epoch})
	if code != 409 || errCode(renew) != "LEASE_LOST" {
		t.Fatalf("the revoked holder's renew: %d %v, want 409 LEASE_LOST", code, renew)
	}
	code, chk := tab.do("POST", lease+"/check", map[string]any{"tabId": "tab-a", "epoch": epoch})
	if code != 409 || errCode(chk) != "LEASE_LOST" {
		t.Fatalf("the revoked holder's check: %d %v, want 409 LEASE_LOST", code, chk)
	}

	// Block the now free session from the "Revoke or block a session" form: the status names the
	// end of the block, and the looked-up session shows it as a badge, as the tab's lease does.
	b.Do("look up the session to block",
		chromedp.SetValue(chromedp.CSS("#block-sub"), "alice"),
		chromedp.SetValue(chromedp.CSS("#block-sid"), "doc-1"),
		chromedp.Click(chromedp.CSS(`button[data-action="open-block"]`)),
	)
	b.WaitFor("the block dialog", `document.getElementById('revoke-dialog').open`, 5*time.Second)
	b.Do("give a reason and block for the preset 5 minutes",
		chromedp.SendKeys(chromedp.CSS("#revoke-reason"), "support: cool down"),
		chromedp.Click(chromedp.CSS(`button[data-action="confirm-revoke"]`)),
	)
	b.WaitFor("the block result", `document.getElementById('status').textContent.includes('blocked until')`, 10*time.Second)
	const badge = `#session-lease .badge.blocked`
	b.WaitFor("the blocked badge", `document.querySelector('`+badge+`') !== null`, 10*time.Second)
	code, got := tab.do("GET", lease, nil)
	until, _ := got["blockedUntil"].(string)
	if code != 200 || until == "" {
		t.Fatalf("the tab's lease after the block: %d %v, want a blockedUntil", code, got)
	}
	if shown := browsertest.Eval[string](b, `document.querySelector('`+badge+`').dataset.blockedUntil`); shown != until {
		t.Errorf("the console's badge shows the block until %q, the tab's lease says %q", shown, until)
	}
	if text := browsertest.Eval[string](b, `document.getElementById('session-lease').innerText`); !strings.Contains(text, "Blocked until") {
		t.Errorf("the looked-up session reads %q, want it to say Blocked until", text)
	}
	b.Screenshot("blocked")
	if code, body := tab.do("POST", lease, map[string]any{"tabId": "tab-a"}); code != 423 || errCode(body) != "SESSION_BLOCKED" {
		t.Fatalf("an acquire during the block: %d %v, want 423 SESSION_BLOCKED", code, body)
	}

	if href := browsertest.Eval[string](b, `location.href`); strings.Contains(href, admin.token) {
		t.Fatal("the token is in the page's URL")
	}
	// Nothing of the token field goes into a URL even if its form were submitted without the page's
	// script (a GET of the form would carry every named field).
	if name := browsertest.Eval[string](b, `document.getElementById('token').name`); name != "" {
		t.Errorf("the token field has the name %q: a form submitted without the script would put it in the URL", name)
	}

	// A token whose scope is a list of strings, which the API takes, works in the page too.
	exp := time.Now().Add(time.Hour).Unix()
	listed, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "root", "scope": []string{api.ScopeAdmin},
		"iss": "e2e-idp", "aud": "tablease", "exp": exp}).SignedString([]byte(testSecret))
	if err != nil {
		t.Fatal(err)
	}
	// It is entered while a poll sent with the token before is on its way (held here): the lists
	// are loaded again with the new token once that poll ends.
	polls := holdRequests(t, b, "/v1/admin/leases", "*/v1/admin/leases*")
	polls.waitHeld(t)
	b.Do("enter a token whose scope is a list",
		chromedp.SetValue(chromedp.CSS("#token"), listed),
		chromedp.Click(chromedp.CSS(`button[data-action="set-token"]`)),
	)
	b.WaitFor("the token in use", `document.getElementById('token-state').textContent === 'Using a token for “root”, expires ' +
		new Date(`+jsonInt(exp)+` * 1000).toLocaleTimeString() + '.'`, 5*time.Second)
	polls.release(t)
	b.WaitFor("a refresh with it", `document.getElementById('status').textContent.startsWith('Up to date at')`, 10*time.Second)
	if reqs := polls.stop(); !slices.ContainsFunc(reqs[1:], func(r heldRequest) bool { return r.auth == "Bearer "+listed }) {
		t.Errorf("no load of the lease list after the held poll carried the new token: %v", reqs)
	}

	for _, line := range b.Console() {
		if (strings.Contains(line, "error") || strings.Contains(line, "exception")) && !strings.Contains(line, "dev/token") {
			t.Errorf("the console reported a problem: %s", line)
		}
	}

	// What the server would refuse is said when the token is entered: an expired one, and an
	// admin's token limited to sessions (sid), which admin routes refuse.
	for _, tt := range []struct {
		name   string
		claims jwt.MapClaims
		want   string
	}{
		{"an expired token", jwt.MapClaims{"exp": time.Now().Add(-time.Hour).Unix()}, `, expired `},
		{"a token with a sid claim", jwt.MapClaims{"exp": time.Now().Add(time.Hour).Unix(), "sid": "doc-1"}, ` — it has a sid claim, which admin routes refuse.`},
	} {
		tt.claims["sub"], tt.claims["scope"], tt.claims["iss"], tt.claims["aud"] = "root", api.ScopeAdmin, "e2e-idp", "tablease"
		tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, tt.claims).SignedString([]byte(testSecret))
		if err != nil {
			t.Fatal(err)
		}
		b.Do("enter "+tt.name,
			chromedp.SetValue(chromedp.CSS("#token"), tok),
			chromedp.Click(chromedp.CSS(`button[data-action="set-token"]`)),
		)
		b.WaitFor("the token line to say so", `document.getElementById('token-state').textContent.includes(`+jsString(tt.want)+`)`, 5*time.Second)
	}
}

// TestAdminConsoleRetriesARevokeUnderItsRequestID: a revoke whose replicas did not confirm it in
// time (TABLEASE_REVOKE_REPLICAS=1, the replica stopped) took effect on the primary and answered
// 503; confirming again from the same dialog, once the replica is back, is answered as that
// revoke: "Revoked the lease", with the tab it took the lease from. A revoke under a new request
// id would find nothing left to revoke.
func TestAdminConsoleRetriesARevokeUnderItsRequestID(t *testing.T) {
	browsertest.Chromium(t)
	primary, replica := redistest.StartReplicated(t)
	base, _ := startServer(t, map[string]string{
		"TABLEASE_REDIS_URL":         primary.URL(),
		"TABLEASE_REVOKE_REPLICAS":   "1",
		"TABLEASE_REDIS_TIMEOUT":     "1s",
		"TABLEASE_JWT_HS256_SECRET":  testSecret,
		"TABLEASE_JWT_ISSUER":        "e2e-idp",
		"TABLEASE_JWT_AUDIENCE":      "tablease",
		"TABLEASE_LEASE_SIGNING_KEY": keyFile(t),
	})
	tab := client{t: t, base: base, token: e2eToken(t, "alice")}
	code, acq := tab.do("POST", "/v1/sessions/doc-1/lease", map[string]any{"tabId": "tab-a"})
	if code != 200 {
		t.Fatalf("the tab acquires: %d %v", code, acq)
	}

	b := browsertest.Start(t)
	b.Do("open the console with an admin token",
		chromedp.Navigate(base+"/admin"),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SetValue(chromedp.CSS("#token"), e2eToken(t, "root", api.ScopeAdmin)),
		chromedp.Click(chromedp.CSS(`button[data-action="set-token"]`)),
	)
	const row = `button[data-action="revoke"][data-sub="alice"][data-sid="doc-1"]`
	b.WaitFor("the lease row", `document.querySelector('`+row+`') !== null`, 15*time.Second)
	b.Do("open the revoke dialog", chromedp.Click(chromedp.CSS(row)))
	b.WaitFor("the dialog", `document.getElementById('revoke-dialog').open`, 5*time.Second)

	replica.Pause(t)
	b.Do("revoke while the replica is stopped",
		chromedp.SendKeys(chromedp.CSS("#revoke-reason"), "support: stuck tab"),
		chromedp.Click(chromedp.CSS(`button[data-action="confirm-revoke"]`)),
	)
	b.WaitFor("the 503 and the way to retry", `document.getElementById('revoke-error').textContent.includes('STORE_UNAVAILABLE') &&
		document.getElementById('revoke-error').textContent.includes('Revoke again here to retry it')`, 15*time.Second)
	if code, body := tab.do("POST", "/v1/sessions/doc-1/lease/renew", map[string]any{"tabId": "tab-a", "epoch": epochOf(t, acq)}); code != 409 {
		t.Fatalf("the revoke took effect on the primary, but the holder renews: %d %v", code, body)
	}
	// A refresh finds the lease free, by the revoke that failed: the dialog stays one to retry it.
	b.WaitFor("a refresh to find the lease free", `document.getElementById('revoke-changed').textContent.includes('no tab holds the lease now')`, 15*time.Second)
	b.WaitFor("the dialog still a revoke", `document.querySelector('[data-action="confirm-revoke"]').textContent === 'Revoke'`, 5*time.Second)

	replica.Resume(t)
	b.Do("confirm again from the same dialog", chromedp.Click(chromedp.CSS(`button[data-action="confirm-revoke"]`)))
	b.WaitFor("the first revoke's answer", `document.getElementById('status').textContent.includes('Revoked the lease of alice / doc-1 (tab tab-a')`, 15*time.Second)
	b.WaitFor("the dialog to close", `!document.getElementById('revoke-dialog').open`, 5*time.Second)
}

// TestAdminConsoleAsksForADevTokenOnlyUnderALoopbackName: reached as 127.0.0.1, the console of a
// dev-mode server takes a /dev/token token by itself; reached under another name that resolves to
// the same server (console.test, mapped by Chromium's host rules), it asks /dev/token nothing,
// which would only fail there, and asks for a token instead. The page's fetch is wrapped before
// its scripts run, to count what it asks.
func TestAdminConsoleAsksForADevTokenOnlyUnderALoopbackName(t *testing.T) {
	browsertest.Chromium(t)
	base, _ := startServer(t, map[string]string{"TABLEASE_DEV": "true"})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	b := browsertest.Start(t, chromedp.Flag("host-resolver-rules", "MAP console.test 127.0.0.1"))
	const count = `window.devTokenAsks = 0;
		const fetchOf = window.fetch;
		window.fetch = function (input, init) {
			if (String(input instanceof Request ? input.url : input).includes('/dev/token')) window.devTokenAsks++;
			return fetchOf.call(this, input, init);
		};`
	if _, err := chromedp.Call(b.Context(), page.AddScriptToEvaluateOnNewDocument,
		page.AddScriptToEvaluateOnNewDocumentParams{Source: count}); err != nil {
		t.Fatal(err)
	}

	b.Do("open the console as 127.0.0.1", chromedp.Navigate(base+"/admin"), chromedp.WaitVisible(chromedp.CSS("#token")))
	b.WaitFor("the dev-mode token", `document.getElementById('token-state').textContent.startsWith('Dev mode: using a token for “admin”')`, 10*time.Second)
	if n := browsertest.Eval[int](b, `window.devTokenAsks`); n != 1 {
		t.Errorf("under 127.0.0.1 the console asked /dev/token %d times, want 1", n)
	}

	other := "http://console.test:" + u.Port() + "/admin"
	b.Do("open the console as console.test", chromedp.Navigate(other), chromedp.WaitVisible(chromedp.CSS("#token")))
	b.WaitFor("the request for a token", `document.getElementById('status').textContent === 'Enter an admin access token to begin.'`, 10*time.Second)
	if href := browsertest.Eval[string](b, `location.href`); href != other {
		t.Fatalf("the page is %s, want %s", href, other)
	}
	if n := browsertest.Eval[int](b, `window.devTokenAsks`); n != 0 {
		t.Errorf("under console.test, not a loopback name, the console asked /dev/token %d times, want 0", n)
	}
	if state := browsertest.Eval[string](b, `document.getElementById('token-state').textContent`); state != "No token yet." {
		t.Errorf("the token state reads %q, want No token yet.", state)
	}
}

// TestAdminConsoleTakesANewDevTokenAndGreysWhatItCannotRefresh: a token the console took from
// /dev/token and the server no longer accepts (a dev server started again has a new secret) is
// replaced by a new one from /dev/token, without the admin's doing; a token the admin pasted is
// never replaced, and while the server refuses it the lists are greyed and their buttons disabled.
func TestAdminConsoleTakesANewDevTokenAndGreysWhatItCannotRefresh(t *testing.T) {
	browsertest.Chromium(t)
	base, _ := startServer(t, map[string]string{"TABLEASE_DEV": "true"})
	b := browsertest.Start(t)
	b.Do("open the console", chromedp.Navigate(base+"/admin"), chromedp.WaitVisible(chromedp.CSS("#token")))
	b.WaitFor("the dev-mode token", `document.getElementById('token-state').textContent.startsWith('Dev mode: using a token for “admin”')`, 10*time.Second)
	first := browsertest.Eval[string](b, `sessionStorage.getItem('tablease.adminToken')`)

	// As after a restart of the dev server: the stored dev token is one the server refuses.
	const refused = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhZG1pbiJ9.c2lnbmVkIGJ5IGFub3RoZXIgc2VjcmV0"
	browsertest.Eval[bool](b, `(sessionStorage.setItem('tablease.adminToken', '`+refused+`'), true)`)
	b.Do("reload with a refused dev token", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("#token")))
	b.WaitFor("a new dev token in use", `sessionStorage.getItem('tablease.adminToken') !== '`+refused+`' && `+
		`document.getElementById('status').textContent.startsWith('Up to date at')`, 10*time.Second)
	if again := browsertest.Eval[string](b, `sessionStorage.getItem('tablease.adminToken')`); again == "" || again == refused {
		t.Fatalf("the stored token after the reload is %q, want a new one from /dev/token (the first was %q)", again, first)
	}

	// A pasted token that the server refuses stays, and what the page showed is greyed.
	b.Do("paste a token the server refuses",
		chromedp.SetValue(chromedp.CSS("#token"), "not-a-token"),
		chromedp.Click(chromedp.CSS(`button[data-action="set-token"]`)),
	)
	b.WaitFor("the refusal", `document.getElementById('status').textContent.includes('UNAUTHENTICATED')`, 10*time.Second)
	if stale := browsertest.Eval[bool](b, `document.body.hasAttribute('data-stale')`); !stale {
		t.Error("after a refused load the page is not marked stale")
	}
	if kept := browsertest.Eval[string](b, `sessionStorage.getItem('tablease.adminToken')`); kept != "not-a-token" {
		t.Errorf("the pasted token was replaced by %q", kept)
	}
}

// TestAdminConsoleOffersNoBlockLongerThanTheServerAllows: with TABLEASE_ADMIN_MAX_BLOCK=10m the
// revoke dialog offers no block over ten minutes, offers the ten minutes themselves, and a
// session looked up by name opens with its default block of five minutes.
func TestAdminConsoleOffersNoBlockLongerThanTheServerAllows(t *testing.T) {
	browsertest.Chromium(t)
	base, _ := startServer(t, map[string]string{"TABLEASE_DEV": "true", "TABLEASE_ADMIN_MAX_BLOCK": "10m"})
	b := browsertest.Start(t)
	b.Do("open the console", chromedp.Navigate(base+"/admin"), chromedp.WaitVisible(chromedp.CSS("#token")))
	const offered = `[...document.querySelectorAll('#revoke-block option')].map((o) => o.value + '=' + o.textContent).join('; ')`
	const want = "0=no block; 60000=1 minute; 300000=5 minutes; 600000=10 minutes (the longest allowed)"
	if err := b.Until(offered+` === `+jsString(want), 10*time.Second); err != nil {
		t.Fatalf("the block durations offered are %q, want %q: %v", browsertest.Eval[string](b, offered), want, err)
	}
	b.Do("look up a session by name",
		chromedp.SetValue(chromedp.CSS("#block-sub"), "alice"),
		chromedp.SetValue(chromedp.CSS("#block-sid"), "doc-1"),
		chromedp.Click(chromedp.CSS(`button[data-action="open-block"]`)),
	)
	b.WaitFor("the dialog with a block of five minutes", `document.getElementById('revoke-dialog').open && document.getElementById('revoke-block').value === '300000'`, 10*time.Second)
}

// TestAdminConsoleListsSessionsWhoseNamesRunTogether: identifiers may hold "|", so user "a" with
// session "b|c" and user "a|b" with session "c" are two leases that the console keeps apart, each
// in its row with the button that revokes that one.
func TestAdminConsoleListsSessionsWhoseNamesRunTogether(t *testing.T) {
	browsertest.Chromium(t)
	base, admin := longLeaseServer(t) // leases that outlast a slow start of Chromium
	for _, l := range []struct{ sub, sid, tab string }{{"a", "b|c", "tab-1"}, {"a|b", "c", "tab-2"}} {
		tab := client{t: t, base: base, token: e2eToken(t, l.sub)}
		if code, body := tab.do("POST", "/v1/sessions/"+url.PathEscape(l.sid)+"/lease", map[string]any{"tabId": l.tab}); code != 200 {
			t.Fatalf("%s acquires %s: %d %v", l.sub, l.sid, code, body)
		}
	}

	b := browsertest.Start(t)
	b.Do("open the console", chromedp.Navigate(base+"/admin"), chromedp.WaitVisible(chromedp.CSS("#token")))
	enterToken(b.Tab, "enter the admin token", admin.token)
	b.WaitFor("both rows", `document.querySelectorAll('#leases tbody tr').length === 2`, 15*time.Second)
	for _, l := range []struct{ sub, sid, tab string }{{"a", "b|c", "tab-1"}, {"a|b", "c", "tab-2"}} {
		row := browsertest.Eval[string](b, `(document.querySelector('button[data-action="revoke"][data-sub="`+l.sub+`"][data-sid="`+l.sid+`"]')?.closest('tr').innerText ?? '')`)
		if !strings.Contains(row, l.tab) {
			t.Errorf("the row whose button revokes %s / %s shows %q, want its holder %s", l.sub, l.sid, row, l.tab)
		}
	}
}
