package main

import (
	"context"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/tablease/tablease/api"
	"github.com/tablease/tablease/internal/browsertest"
	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/lease/leasemem"
)

type tmpAdmin struct {
	eng  *leasemem.Engine
	mu   sync.Mutex
	keys []lease.Key
	recs []lease.AuditRecord
}

func (a *tmpAdmin) ListLeases(ctx context.Context, q lease.ListQuery) (lease.LeasePage, error) {
	var out lease.LeasePage
	for _, k := range a.keys {
		l, err := a.eng.Get(ctx, k)
		if err != nil {
			return out, err
		}
		if l.Held && (q.User == "" || q.User == k.User) {
			out.Leases = append(out.Leases, l)
		}
	}
	return out, nil
}

func (a *tmpAdmin) Revoke(ctx context.Context, req lease.RevokeRequest) (lease.RevokeResult, error) {
	l, _ := a.eng.Get(ctx, req.Key)
	if !l.Held {
		return lease.RevokeResult{Epoch: l.Epoch}, nil
	}
	n, err := a.eng.Acquire(ctx, lease.AcquireRequest{Key: req.Key, Holder: lease.Holder{TabID: "revoker"}, Mode: lease.ModeTakeover})
	if err != nil {
		return lease.RevokeResult{}, err
	}
	_, _ = a.eng.Release(ctx, lease.ReleaseRequest{Key: req.Key, TabID: "revoker", Epoch: n.Epoch})
	a.mu.Lock()
	a.recs = append([]lease.AuditRecord{{ID: "x", At: time.Now(), Key: req.Key, Action: lease.AuditRevoke, Epoch: n.Epoch, Admin: req.Admin, Reason: req.Reason, Previous: &lease.Previous{TabID: l.Holder.TabID, Epoch: l.Epoch}}}, a.recs...)
	a.mu.Unlock()
	return lease.RevokeResult{Revoked: true, Epoch: n.Epoch, Previous: &lease.Previous{TabID: l.Holder.TabID, Epoch: l.Epoch}}, nil
}

func (a *tmpAdmin) Audit(ctx context.Context, q lease.AuditQuery) (lease.AuditPage, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return lease.AuditPage{Records: append([]lease.AuditRecord(nil), a.recs...)}, nil
}

func TestTmpConsole(t *testing.T) {
	eng, _ := leasemem.New(leasemem.Options{})
	ad := &tmpAdmin{eng: eng, keys: []lease.Key{{User: "alice", Session: "doc-1"}, {User: "bob", Session: "x"}}}
	srv, err := api.New(api.Options{Engine: eng, Auth: cliAuth, Admin: ad})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	defer hs.Close()
	tab := client{t: t, base: hs.URL, token: mintToken(t, "alice")}
	admin := client{t: t, base: hs.URL, token: mintToken(t, "root", api.ScopeAdmin)}
	_, acq := tab.do("POST", "/v1/sessions/doc-1/lease", map[string]any{"tabId": "tab-a", "label": "<img src=x onerror=alert(1)> Events"})
	epoch := epochOf(t, acq)
	btab := client{t: t, base: hs.URL, token: mintToken(t, "bob")}
	btab.do("POST", "/v1/sessions/x/lease", map[string]any{"tabId": "tab-b", "label": "Bob"})

	b := browsertest.Start(t)
	b.Do("open", chromedp.Navigate(hs.URL+"/admin"), chromedp.WaitVisible(chromedp.CSS("#token")))
	b.Do("token", chromedp.SetValue(chromedp.CSS("#token"), admin.token), chromedp.Click(chromedp.CSS(`button[data-action="set-token"]`)))
	const row = `button[data-action="revoke"][data-sub="alice"][data-sid="doc-1"]`
	b.WaitFor("row", `document.querySelector('`+row+`') !== null`, 10*time.Second)
	time.Sleep(2500 * time.Millisecond)
	b.Screenshot("leases")
	b.Do("filter", chromedp.SetValue(chromedp.CSS("#filter-sub"), "bob"), chromedp.Click(chromedp.CSS(`button[data-action="filter"]`)))
	b.WaitFor("filtered", `document.querySelector('`+row+`') === null && document.querySelectorAll('#leases tbody tr').length === 1`, 10*time.Second)
	b.Do("clear", chromedp.Click(chromedp.CSS(`button[data-action="clear-filter"]`)))
	b.WaitFor("row again", `document.querySelector('`+row+`') !== null`, 10*time.Second)
	b.Do("open dialog", chromedp.Click(chromedp.CSS(row)))
	b.WaitFor("dialog", `document.getElementById('revoke-dialog').open`, 5*time.Second)
	b.Screenshot("dialog")
	b.Do("confirm", chromedp.SendKeys(chromedp.CSS("#revoke-reason"), "support: stuck"), chromedp.Click(chromedp.CSS(`button[data-action="confirm-revoke"]`)))
	b.WaitFor("status", `document.getElementById('status').textContent.includes('Revoked the lease of alice / doc-1')`, 10*time.Second)
	b.WaitFor("audit", `document.querySelectorAll('#audit tbody tr[data-action="revoke"]').length === 1`, 10*time.Second)
	t.Logf("focus: %s", browsertest.Eval[string](b, `document.activeElement.outerHTML.slice(0,120)`))
	b.Screenshot("revoked")
	code, renew := tab.do("POST", "/v1/sessions/doc-1/lease/renew", map[string]any{"tabId": "tab-a", "epoch": epoch})
	t.Logf("renew %d %v", code, renew)
	b.Do("block form", chromedp.SetValue(chromedp.CSS("#block-sub"), "carol"), chromedp.SetValue(chromedp.CSS("#block-sid"), "doc-9"), chromedp.Click(chromedp.CSS(`button[data-action="open-block"]`)))
	b.WaitFor("dialog2", `document.getElementById('revoke-dialog').open`, 5*time.Second)
	b.Screenshot("block")
	b.Do("esc", chromedp.KeyEvent("\x1b"))
	b.WaitFor("closed", `!document.getElementById('revoke-dialog').open`, 5*time.Second)
	t.Logf("console: %q", b.Console())
	t.Logf("status: %s", browsertest.Eval[string](b, `document.getElementById('status').textContent`))
	if strings.Contains(browsertest.Eval[string](b, `document.body.innerHTML`), "<img") {
		t.Fatal("label injected")
	}
}
