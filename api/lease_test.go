package api

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tablease/tablease/lease"
)

func TestLeaseLifecycle(t *testing.T) {
	h := newHarness(t)
	alice := h.token("alice")
	p := leasePath("doc-42")

	// Tab A acquires a free lease and becomes the owner.
	a := readLease(t, h.post(p, alice, `{"tabId":"tab-a","label":"Events — /events/evt-1"}`))
	if !a.Held || a.Role == nil || *a.Role != "owner" || a.Epoch <= 0 || a.Epoch >= 1<<53 {
		t.Fatalf("acquire answered %+v, want held by the owner with an epoch in [1, 2^53)", a)
	}
	if a.SessionID != "doc-42" || a.Holder == nil || a.Holder.TabID != "tab-a" || a.Holder.Label != "Events — /events/evt-1" || a.Holder.Hidden {
		t.Fatalf("acquire answered holder %+v of session %q", a.Holder, a.SessionID)
	}
	if a.TTLMs != 45000 || a.RemainingMs != 45000 || a.RenewAfterMs != 15000 || a.Transitions != 1 {
		t.Fatalf("acquire answered ttl %d remaining %d renewAfter %d transitions %d, want 45000 45000 15000 1",
			a.TTLMs, a.RemainingMs, a.RenewAfterMs, a.Transitions)
	}
	if a.GrantedAt == nil || *a.GrantedAt != "2026-12-02T13:00:00.123Z" || a.ExpiresAt == nil || *a.ExpiresAt != "2026-12-02T13:00:45.123Z" {
		t.Fatalf("acquire answered grantedAt %v expiresAt %v, want RFC 3339 UTC with milliseconds", a.GrantedAt, a.ExpiresAt)
	}

	// Tab B is told who holds it.
	e := wantError(t, h.post(p, alice, `{"tabId":"tab-b"}`), http.StatusConflict, CodeLeaseHeld)
	holder, _ := e.Error.Details["holder"].(map[string]any)
	if holder["tabId"] != "tab-a" || holder["label"] != "Events — /events/evt-1" || holder["hidden"] != false {
		t.Fatalf("LEASE_HELD details.holder = %v", e.Error.Details["holder"])
	}
	if e.Error.Details["remainingMs"] != float64(45000) || e.Error.Details["epoch"] != float64(a.Epoch) {
		t.Fatalf("LEASE_HELD details = %v", e.Error.Details)
	}
	if *e.Error.Retryable {
		t.Fatal("LEASE_HELD is retryable; it needs a user action")
	}

	// Tab A acquiring again keeps its epoch.
	if again := readLease(t, h.post(p, alice, `{"tabId":"tab-a","label":"Events — /events/evt-1"}`)); again.Epoch != a.Epoch {
		t.Fatalf("re-acquire by the holder changed the epoch %d → %d", a.Epoch, again.Epoch)
	}

	// Tab A renews later with a hidden tab's longer TTL.
	h.clock.Advance(10 * time.Second)
	r := readLease(t, h.post(p+"/renew", alice, fmt.Sprintf(`{"tabId":"tab-a","epoch":%d,"ttlMs":150000,"hidden":true}`, a.Epoch)))
	if r.Epoch != a.Epoch || r.TTLMs != 150000 || r.RemainingMs != 150000 || r.RenewAfterMs != 50000 || !r.Holder.Hidden || *r.Role != "owner" {
		t.Fatalf("renew answered %+v", r)
	}

	// Tab B takes over with a new epoch.
	b := readLease(t, h.post(p, alice, `{"tabId":"tab-b","mode":"takeover"}`))
	if b.Epoch <= a.Epoch || b.Holder.TabID != "tab-b" || *b.Role != "owner" || b.Transitions != 2 {
		t.Fatalf("takeover answered %+v after epoch %d", b, a.Epoch)
	}

	// Tab A's renew is refused with what the lease is now.
	e = wantError(t, h.post(p+"/renew", alice, fmt.Sprintf(`{"tabId":"tab-a","epoch":%d}`, a.Epoch)), http.StatusConflict, CodeLeaseLost)
	holder, _ = e.Error.Details["holder"].(map[string]any)
	if holder["tabId"] != "tab-b" || e.Error.Details["epoch"] != float64(b.Epoch) {
		t.Fatalf("LEASE_LOST details = %v, want holder tab-b at epoch %d", e.Error.Details, b.Epoch)
	}

	// Get: no role without tabId; viewer for A, owner for B.
	g := readLease(t, h.get(p, alice))
	if g.Role != nil || g.Epoch != b.Epoch || !g.Held {
		t.Fatalf("get without tabId answered %+v", g)
	}
	if g := readLease(t, h.get(p+"?tabId=tab-a", alice)); g.Role == nil || *g.Role != "viewer" {
		t.Fatalf("get for tab-a answered role %v, want viewer", g.Role)
	}
	if g := readLease(t, h.get(p+"?tabId=tab-b", alice)); g.Role == nil || *g.Role != "owner" {
		t.Fatalf("get for tab-b answered role %v, want owner", g.Role)
	}

	// Check: valid for B, lost for A.
	var ok struct {
		Valid bool        `json:"valid"`
		Lease leaseAnswer `json:"lease"`
	}
	rec := h.post(p+"/check", alice, fmt.Sprintf(`{"tabId":"tab-b","epoch":%d}`, b.Epoch))
	if rec.Code != http.StatusOK {
		t.Fatalf("check by the holder: %d %s", rec.Code, rec.Body)
	}
	decodeStrict(t, rec, &ok)
	if !ok.Valid || ok.Lease.Epoch != b.Epoch || *ok.Lease.Role != "owner" {
		t.Fatalf("check answered %+v", ok)
	}
	wantError(t, h.post(p+"/check", alice, fmt.Sprintf(`{"tabId":"tab-a","epoch":%d}`, a.Epoch)), http.StatusConflict, CodeLeaseLost)

	// Release: the stale tab releases nothing; the holder releases once; a retry is harmless.
	for _, step := range []struct {
		name string
		body string
		want string
	}{
		{"a stale tab never releases the newer lease", fmt.Sprintf(`{"tabId":"tab-a","epoch":%d}`, a.Epoch), `{"released":false}`},
		{"the holder releases", fmt.Sprintf(`{"tabId":"tab-b","epoch":%d}`, b.Epoch), `{"released":true}`},
		{"a retried release answers as the first did", fmt.Sprintf(`{"tabId":"tab-b","epoch":%d}`, b.Epoch), `{"released":true}`},
	} {
		rec := h.post(p+"/release", alice, step.body)
		if rec.Code != http.StatusOK || trimNL(rec.Body.String()) != step.want {
			t.Fatalf("%s: %d %s, want %s", step.name, rec.Code, rec.Body, step.want)
		}
	}

	// Free: held false, holder null, the last epoch.
	f := readLease(t, h.get(p+"?tabId=tab-b", alice))
	if f.Held || f.Holder != nil || f.Epoch != b.Epoch || f.RemainingMs != 0 || *f.Role != "viewer" {
		t.Fatalf("get after release answered %+v", f)
	}
	e = wantError(t, h.post(p+"/check", alice, fmt.Sprintf(`{"tabId":"tab-b","epoch":%d}`, b.Epoch)), http.StatusConflict, CodeLeaseLost)
	if v, present := e.Error.Details["holder"]; !present || v != nil || e.Error.Details["epoch"] != float64(b.Epoch) {
		t.Fatalf("LEASE_LOST on a free lease has details %v, want holder null and the last epoch", e.Error.Details)
	}
}

func TestLeaseAnswers(t *testing.T) {
	h := newHarness(t)
	alice, bob := h.token("alice"), h.token("bob")

	t.Run("a session that never had a lease is free at epoch 0 with null times", func(t *testing.T) {
		rec := h.get(leasePath("never"), alice)
		l := readLease(t, rec)
		if l.Held || l.Holder != nil || l.Epoch != 0 || l.GrantedAt != nil || l.ExpiresAt != nil || l.Transitions != 0 {
			t.Fatalf("answered %s", rec.Body)
		}
		for _, field := range []string{`"holder":null`, `"grantedAt":null`, `"expiresAt":null`, `"blockedUntil":null`} {
			if !strings.Contains(rec.Body.String(), field) {
				t.Fatalf("answer %s lacks %s", rec.Body, field)
			}
		}
	})
	t.Run("leases of different users are unrelated", func(t *testing.T) {
		readLease(t, h.post(leasePath("shared"), alice, `{"tabId":"t1"}`))
		if l := readLease(t, h.post(leasePath("shared"), bob, `{"tabId":"t2"}`)); l.Holder.TabID != "t2" {
			t.Fatalf("bob got %+v", l)
		}
	})
	t.Run("the TTL asked for is clamped to the maximum", func(t *testing.T) {
		if l := readLease(t, h.post(leasePath("clamp"), alice, `{"tabId":"t1","ttlMs":999999999999}`)); l.TTLMs != 120000 || l.RenewAfterMs != 40000 {
			t.Fatalf("answered ttl %d renewAfter %d", l.TTLMs, l.RenewAfterMs)
		}
	})
	t.Run("a lease that expired is free and renew does not resurrect it", func(t *testing.T) {
		l := readLease(t, h.post(leasePath("expire"), alice, `{"tabId":"t1","ttlMs":1000}`))
		h.clock.Advance(2 * time.Second)
		wantError(t, h.post(leasePath("expire")+"/renew", alice, fmt.Sprintf(`{"tabId":"t1","epoch":%d}`, l.Epoch)), http.StatusConflict, CodeLeaseLost)
		if g := readLease(t, h.get(leasePath("expire")+"?tabId=t1", alice)); g.Held || *g.Role != "viewer" {
			t.Fatalf("expired lease answered %+v", g)
		}
	})
	t.Run("a handoff is pending until the holder releases, then the requester gets a new epoch", func(t *testing.T) {
		a := readLease(t, h.post(leasePath("handoff"), alice, `{"tabId":"t1"}`))
		e := wantError(t, h.post(leasePath("handoff"), alice, `{"tabId":"t2","label":"Tab 2","mode":"handoff"}`), http.StatusConflict, CodeHandoffPending)
		if ms, _ := e.Error.Details["retryAfterMs"].(float64); ms <= 0 {
			t.Fatalf("HANDOFF_PENDING without retryAfterMs: %v", e.Error.Details)
		}
		g := h.get(leasePath("handoff")+"?tabId=t1", alice)
		if !strings.Contains(g.Body.String(), `"handoff":{"state":"requested","requester":{"tabId":"t2","label":"Tab 2","hidden":false}`) {
			t.Fatalf("the lease does not show the request: %s", g.Body)
		}
		wantError(t, h.post(leasePath("handoff"), alice, `{"tabId":"t3"}`), http.StatusConflict, CodeLeaseHeld)
		h.post(leasePath("handoff")+"/release", alice, fmt.Sprintf(`{"tabId":"t1","epoch":%d}`, a.Epoch))
		wantError(t, h.post(leasePath("handoff"), alice, `{"tabId":"t3"}`), http.StatusConflict, CodeHandoffPending)
		b := readLease(t, h.post(leasePath("handoff"), alice, `{"tabId":"t2","mode":"handoff"}`))
		if b.Epoch <= a.Epoch || b.Holder == nil || b.Holder.TabID != "t2" {
			t.Fatalf("the requester was not granted a new epoch: %+v", b)
		}
	})
	t.Run("an unknown mode is refused", func(t *testing.T) {
		wantError(t, h.post(leasePath("mode"), alice, `{"tabId":"t1","mode":"steal"}`), http.StatusBadRequest, CodeInvalidArgument)
	})
	t.Run("check with a malformed lease token is refused as invalid", func(t *testing.T) {
		e := wantError(t, h.post(leasePath("doc")+"/check", alice, `{"token":"abc.def.ghi"}`), http.StatusBadRequest, CodeInvalidArgument)
		if e.Error.Details["field"] != "token" || e.Error.Details["reason"] != "invalid_token" {
			t.Fatalf("details %v", e.Error.Details)
		}
	})
}

func trimNL(s string) string {
	for len(s) > 0 && (s[len(s)-1] == '\n' || s[len(s)-1] == '\r') {
		s = s[:len(s)-1]
	}
	return s
}

func TestPercentEncodedSessionIDsAreDecoded(t *testing.T) {
	h := newHarness(t)
	tok := h.token("alice", "doc:1")
	if rec := h.post("/v1/sessions/doc%3A1/lease", tok, `{"tabId":"t1"}`); rec.Code != 200 {
		t.Fatalf("acquire on doc%%3A1: %d %s", rec.Code, rec.Body)
	}
	rec := h.get("/v1/sessions/doc:1/lease?tabId=t1", tok)
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"role":"owner"`) {
		t.Fatalf("doc:1 and doc%%3A1 must name the same session: %d %s", rec.Code, rec.Body)
	}
	// Decoded once: a%2541 is the session a%41, which is no identifier, and not aA.
	alice := h.token("alice")
	for _, path := range []string{"/v1/sessions/a%2541/lease", "/v1/sessions/a%41%2541/lease"} {
		e := wantError(t, h.post(path, alice, `{"tabId":"t1"}`), http.StatusBadRequest, CodeInvalidArgument)
		if e.Error.Details["field"] != "sessionId" {
			t.Fatalf("%s: %v, want sessionId refused", path, e.Error)
		}
	}
}

// After a store lost data, a holder may hold its lease below an epoch it had minted; asking for a
// new epoch keeps the lease at a higher one, with a new token, and ends the old epoch.
func TestTheHolderMayAskForANewEpoch(t *testing.T) {
	h := newHarness(t)
	alice := h.token("alice")
	p := leasePath("doc-42")
	a := readLease(t, h.post(p, alice, `{"tabId":"tab-a"}`))
	e := wantError(t, h.post(p, alice, `{"tabId":"tab-a","newEpoch":"yes"}`), http.StatusBadRequest, CodeInvalidArgument)
	if e.Error.Details["field"] != "newEpoch" {
		t.Errorf("a newEpoch that is not a boolean: details %v, want field newEpoch", e.Error.Details)
	}
	h.clock.Advance(time.Millisecond)
	fresh := readLease(t, h.post(p, alice, `{"tabId":"tab-a","newEpoch":true}`))
	if fresh.Epoch <= a.Epoch || fresh.Holder.TabID != "tab-a" || *fresh.Role != "owner" || fresh.Transitions != 2 || fresh.Token == nil || *fresh.Token == *a.Token {
		t.Fatalf("the holder's acquire asking for a new epoch answered %+v after epoch %d; want tab-a at a higher epoch with a new token", fresh, a.Epoch)
	}
	wantError(t, h.post(p+"/renew", alice, fmt.Sprintf(`{"tabId":"tab-a","epoch":%d}`, a.Epoch)), http.StatusConflict, CodeLeaseLost)
	// Another tab asking for one gets what its mode gives.
	wantError(t, h.post(p, alice, `{"tabId":"tab-b","newEpoch":true}`), http.StatusConflict, CodeLeaseHeld)
}

// TestAGoneTabLosesItsLeaseAndGetsNoneFromAnAcquireSentBefore: a release with gone: true ends the
// tab's lease without an epoch, and an acquire of that tab arriving after it, in any mode, answers
// 409 TAB_GONE, the lease left as it is; a gone release that names an epoch is refused.
func TestAGoneTabLosesItsLeaseAndGetsNoneFromAnAcquireSentBefore(t *testing.T) {
	h := newHarness(t)
	alice := h.token("alice")
	p := leasePath("doc-42")
	readLease(t, h.post(p, alice, `{"tabId":"tab-a"}`))
	e := wantError(t, h.post(p+"/release", alice, `{"tabId":"tab-a","epoch":1,"gone":true}`), http.StatusBadRequest, CodeInvalidArgument)
	if e.Error.Details["field"] != "epoch" {
		t.Errorf("a gone release with an epoch: details %v, want field epoch", e.Error.Details)
	}
	for i := range 2 { // the second a retry, answered as the first
		rec := h.post(p+"/release", alice, `{"tabId":"tab-a","gone":true}`)
		if rec.Code != http.StatusOK || strings.TrimSpace(rec.Body.String()) != `{"released":true}` {
			t.Fatalf("gone release %d of the holder = %d %s, want 200 released", i+1, rec.Code, rec.Body)
		}
	}
	for _, mode := range []string{"try", "takeover", "handoff"} {
		rec := h.post(p, alice, `{"tabId":"tab-a","mode":"`+mode+`"}`)
		e := wantError(t, rec, http.StatusConflict, CodeTabGone)
		ms, _ := e.Error.Details["retryAfterMs"].(float64)
		if !*e.Error.Retryable || ms <= 0 || ms > float64(lease.GoneWindow.Milliseconds()) || rec.Header().Get("Retry-After") == "" {
			t.Errorf("TAB_GONE (mode %s): retryable %v, details %v, Retry-After %q; want retryable, retryAfterMs within the gone window and the header",
				mode, *e.Error.Retryable, e.Error.Details, rec.Header().Get("Retry-After"))
		}
	}
	// A refusal the contract names: neither a store failure nor an outage.
	metricsBody := h.get("/metrics", "").Body.String()
	for _, want := range []string{`tablease_lease_operations_total{op="acquire",result="tab_gone"} 3`, `tablease_store_errors_total{op="acquire"} 0`} {
		if !strings.Contains(metricsBody, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if logs := h.logs.String(); strings.Contains(logs, "store calls fail") {
		t.Errorf("TAB_GONE was logged as a store outage:\n%s", logs)
	}
	b := readLease(t, h.post(p, alice, `{"tabId":"tab-b"}`))
	// A tab that goes while its takeover is on its way: the takeover takes nothing.
	rec := h.post(p+"/release", alice, `{"tabId":"tab-c","gone":true}`)
	if rec.Code != http.StatusOK || strings.TrimSpace(rec.Body.String()) != `{"released":false}` {
		t.Fatalf("gone release of a tab that holds nothing = %d %s, want 200 not released", rec.Code, rec.Body)
	}
	wantError(t, h.post(p, alice, `{"tabId":"tab-c","mode":"takeover"}`), http.StatusConflict, CodeTabGone)
	if g := readLease(t, h.get(p+"?tabId=tab-b", alice)); g.Epoch != b.Epoch || g.Holder == nil || g.Holder.TabID != "tab-b" {
		t.Fatalf("the lease after the gone tab's takeover = %+v, want tab-b's at %d", g, b.Epoch)
	}
}
