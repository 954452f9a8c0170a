package api

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tablease/tablease/lease"
)

// flakyReleases is an engine whose next failing releases the store does not answer.
type flakyReleases struct {
	lease.Store
	failing atomic.Int32
	calls   atomic.Int32
}

func (f *flakyReleases) Release(ctx context.Context, req lease.ReleaseRequest) (lease.ReleaseResult, error) {
	f.calls.Add(1)
	if f.failing.Add(-1) >= 0 {
		return lease.ReleaseResult{}, &lease.UnavailableError{Op: "release", Err: context.DeadlineExceeded}
	}
	return f.Store.Release(ctx, req)
}

// TestAGoneReleaseTheStoreDidNotAnswerIsSentAgain: the page that sent it is gone, so the server
// sends it again until the store answers, and the tab's lease ends then; a release of a tab that
// stays is the tab's to retry.
func TestAGoneReleaseTheStoreDidNotAnswerIsSentAgain(t *testing.T) {
	flaky := &flakyReleases{}
	h := newHarness(t, func(o *Options) { flaky.Store = o.Engine; o.Engine = flaky })
	alice := h.token("alice")
	p := leasePath("doc-1")
	readLease(t, h.post(p, alice, `{"tabId":"tab-a"}`))

	flaky.failing.Store(1)
	wantError(t, h.post(p+"/release", alice, `{"tabId":"tab-a","epoch":1}`), http.StatusServiceUnavailable, CodeStoreUnavailable)
	flaky.failing.Store(2)
	wantError(t, h.post(p+"/release", alice, `{"tabId":"tab-a","gone":true}`), http.StatusServiceUnavailable, CodeStoreUnavailable)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(h.get("/metrics", "").Body.String(), `tablease_gone_release_retries_total{result="served"} 1`) {
		if time.Now().After(deadline) {
			t.Fatalf("the gone release was not served on a retry; logs:\n%s", h.logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if l := readLease(t, h.get(p, alice)); l.Holder != nil {
		t.Fatalf("the gone tab still holds the lease: %+v", l)
	}
	// The plain release once, the gone one three times (503, a retry the store did not answer, the
	// retry it did): the plain one was not sent again.
	if n := flaky.calls.Load(); n != 4 {
		t.Fatalf("%d releases reached the engine, want 4", n)
	}
	wantError(t, h.post(p, alice, `{"tabId":"tab-a"}`), http.StatusConflict, CodeTabGone)
	if !strings.Contains(h.logs.String(), "a gone release the store did not answer was served on a retry") {
		t.Fatalf("the retry is not logged:\n%s", h.logs.String())
	}
}

// TestGoneReleasesBeingRetriedEndWithTheServer: a stop ends the retries, each with a warning.
func TestGoneReleasesBeingRetriedEndWithTheServer(t *testing.T) {
	flaky := &flakyReleases{}
	h := newHarness(t, func(o *Options) { flaky.Store = o.Engine; o.Engine = flaky })
	flaky.failing.Store(1 << 30)
	wantError(t, h.post(leasePath("doc-1")+"/release", h.token("alice"), `{"tabId":"tab-a","gone":true}`), http.StatusServiceUnavailable, CodeStoreUnavailable)
	h.srv.Close()
	if !strings.Contains(h.logs.String(), "was still being retried as the server stopped") ||
		!strings.Contains(h.get("/metrics", "").Body.String(), `tablease_gone_release_retries_total{result="stopped"} 1`) {
		t.Fatalf("the stop does not end the retry with a warning:\n%s", h.logs.String())
	}
}
