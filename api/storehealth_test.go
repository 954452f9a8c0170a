package api

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tablease/tablease/internal/syncbuf"
	"github.com/tablease/tablease/lease"
)

// TestAStoreOutageIsLoggedOnceWhenItBeginsAndOnceWhenItEnds: the first failure warns, the later
// ones add nothing, and only an answer a quiet second after the last failure ends the outage, as
// when a Cluster shard fails over while the others answer.
func TestAStoreOutageIsLoggedOnceWhenItBeginsAndOnceWhenItEnds(t *testing.T) {
	var buf bytes.Buffer
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	now := t0
	h := newStoreHealth(slog.New(slog.NewTextHandler(&buf, nil)), func() time.Time { return now })
	h.after = heldTimers(new([]func()))
	lines := func() []string { return strings.Split(strings.TrimSpace(buf.String()), "\n") }

	h.answered() // no outage: nothing to say
	if buf.Len() != 0 {
		t.Fatalf("logged before any failure: %s", buf.String())
	}
	down := errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")
	h.failed("renew", down)
	for i := range 4 {
		now = t0.Add(time.Duration(i+1) * 300 * time.Millisecond)
		h.answered() // another shard's call, within the quiet second
		h.failed("acquire", down)
	}
	if l := lines(); len(l) != 1 || !strings.Contains(l[0], "level=WARN") || !strings.Contains(l[0], "store calls fail") ||
		!strings.Contains(l[0], "op=renew") || !strings.Contains(l[0], "connection refused") {
		t.Fatalf("after 5 failures: %q, want one warning naming the first call and its error", l)
	}
	now = now.Add(storeQuiet - time.Millisecond)
	h.answered()
	if l := lines(); len(l) != 1 {
		t.Fatalf("an answer within the quiet second ended the outage: %q", l)
	}
	now = now.Add(time.Millisecond)
	h.answered()
	h.answered()
	l := lines()
	if len(l) != 2 {
		t.Fatalf("after the quiet second: %q, want one line more", l)
	}
	for _, want := range []string{"level=INFO", "store calls are served again", "outage_s=1.2", "failed_calls=5", "failed_renew=1", "failed_acquire=4"} {
		if !strings.Contains(l[1], want) {
			t.Errorf("the line of the end %q lacks %q", l[1], want)
		}
	}
	// The next outage is counted afresh.
	now = now.Add(time.Minute)
	h.failed("check", down)
	now = now.Add(2 * storeQuiet)
	h.answered()
	if l := lines(); len(l) != 4 || !strings.Contains(l[3], "failed_calls=1") || strings.Contains(l[3], "failed_renew") {
		t.Fatalf("a second outage: %q", l)
	}
}

// TestAStoreOutageInProgressAtTheStopIsClosed: a server that stops during an outage says so as it
// stops, with the outage's figures, so that every "store calls fail" has a closing line; one that
// stops with the store answering says nothing.
func TestAStoreOutageInProgressAtTheStopIsClosed(t *testing.T) {
	var buf bytes.Buffer
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	h := newStoreHealth(slog.New(slog.NewTextHandler(&buf, nil)), func() time.Time { return now })
	h.after = heldTimers(new([]func()))
	h.stopped()
	if buf.Len() != 0 {
		t.Fatalf("a stop with no outage logged: %s", buf.String())
	}
	h.failed("renew", errors.New("i/o timeout"))
	now = now.Add(1500 * time.Millisecond)
	h.failed("renew", errors.New("i/o timeout"))
	h.stopped()
	h.stopped() // once
	l := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(l) != 2 {
		t.Fatalf("lines %q, want the outage's start and its close", l)
	}
	for _, want := range []string{"level=WARN", "store calls still failed as the server stopped", "outage_s=1.5", "failed_calls=2", "failed_renew=2"} {
		if !strings.Contains(l[1], want) {
			t.Errorf("the closing line %q lacks %q", l[1], want)
		}
	}
}

// blockingAcquires is an engine whose acquires wait for their caller to give up, as a store call
// does that the client hangs up on.
type blockingAcquires struct{ lease.Store }

func (blockingAcquires) Acquire(ctx context.Context, _ lease.AcquireRequest) (lease.Lease, error) {
	<-ctx.Done()
	return lease.Lease{}, &lease.UnavailableError{Op: "acquire", Err: ctx.Err()}
}

// TestAClientThatHangsUpIsNoStoreOutage: a call given up because its client went away says
// nothing of the store: no "store calls fail", no store error counted, and a result of its own.
func TestAClientThatHangsUpIsNoStoreOutage(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.Engine = blockingAcquires{o.Engine} })
	ctx, hangUp := context.WithCancel(context.Background())
	req := httptest.NewRequest(http.MethodPost, leasePath("doc-1"), strings.NewReader(`{"tabId":"tab-1"}`)).WithContext(ctx)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+h.token("alice"))
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.srv.Handler().ServeHTTP(httptest.NewRecorder(), req)
	}()
	hangUp()
	<-done
	metricsBody := h.get("/metrics", "").Body.String()
	for _, want := range []string{`tablease_lease_operations_total{op="acquire",result="canceled"} 1`, `tablease_store_errors_total{op="acquire"} 0`} {
		if !strings.Contains(metricsBody, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if logs := h.logs.String(); strings.Contains(logs, "store calls fail") || strings.Contains(logs, `"level":"WARN"`) {
		t.Errorf("a client that hung up was logged as a store outage, or a warning:\n%s", logs)
	}
}

// TestAnOutageOpenedByCallsOtherThanLeaseOperationsIsClosedByThem: a stream's watch or join, a
// ticket's nonce, a catalog read or a presence list the store did not serve open an outage, and
// the same calls served close it, with no lease operation in between; a call whose caller gave
// up says nothing of the store, and a refusal of the store's own is an answer.
func TestAnOutageOpenedByCallsOtherThanLeaseOperationsIsClosedByThem(t *testing.T) {
	h := newHarness(t)
	var buf syncbuf.Buffer
	now := time.Now()
	h.srv.metrics.store = newStoreHealth(slog.New(slog.NewTextHandler(&buf, nil)), func() time.Time { return now })
	h.srv.metrics.store.after = heldTimers(new([]func()))
	down := &lease.UnavailableError{Op: "watch", Err: errors.New("connection refused")}
	h.srv.storeCall("watch", down)
	h.srv.storeCall("join", down)
	now = now.Add(2 * time.Second)
	h.srv.storeCall("watch", context.Canceled)
	if strings.Contains(buf.String(), "served again") {
		t.Fatalf("a canceled call ended the outage: %s", buf.String())
	}
	h.srv.storeCall("join", lease.ErrTooManyTabs)
	if !strings.Contains(buf.String(), "store calls are served again") || !strings.Contains(buf.String(), "failed_join=1") {
		t.Fatalf("the outage of a watch and a join was not closed by a join the store answered: %s", buf.String())
	}
	h.srv.storeCall("tabs", down)
	now = now.Add(2 * time.Second)
	h.srv.storeCall("tabs", nil)
	if n := strings.Count(buf.String(), "store calls are served again"); n != 2 {
		t.Fatalf("the second outage, of a presence list, was not closed by one served: %s", buf.String())
	}
}

// heldTimers is a storeHealth.after whose functions run only when the test calls them, from
// *due, in order.
func heldTimers(due *[]func()) func(time.Duration, func()) *time.Timer {
	return func(_ time.Duration, f func()) *time.Timer {
		*due = append(*due, f)
		return time.NewTimer(time.Hour) // stopped by stopRecheck, never read
	}
}

// TestAnOutageWhoseCallsWereServedWithinTheQuietSecondEnds: a call served right after the last
// failure (a retry as Redis came back) and nothing after it still ends the outage once the quiet
// second has passed, unless another call failed meanwhile.
func TestAnOutageWhoseCallsWereServedWithinTheQuietSecondEnds(t *testing.T) {
	var buf bytes.Buffer
	t0 := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	now := t0
	h := newStoreHealth(slog.New(slog.NewTextHandler(&buf, nil)), func() time.Time { return now })
	var due []func()
	h.after = heldTimers(&due)
	down := errors.New("i/o timeout")

	h.failed("new_nonce", down)
	now = t0.Add(300 * time.Millisecond)
	h.answered()
	h.answered() // one look is due, not two
	if len(due) != 1 || strings.Contains(buf.String(), "served again") {
		t.Fatalf("after a call served within the quiet second: %d looks due, log %s", len(due), buf.String())
	}
	now = t0.Add(storeQuiet)
	due[0]()
	if !strings.Contains(buf.String(), "store calls are served again") || !strings.Contains(buf.String(), "failed_new_nonce=1") {
		t.Fatalf("the outage did not end a quiet second after its last failure: %s", buf.String())
	}

	// Another outage, whose served call is followed by a failure: the look finds it not over.
	buf.Reset()
	due = nil
	now = t0.Add(time.Minute)
	h.failed("watch", down)
	now = now.Add(100 * time.Millisecond)
	h.answered()
	now = now.Add(100 * time.Millisecond)
	h.failed("watch", down)
	now = now.Add(storeQuiet)
	due[0]()
	if strings.Contains(buf.String(), "served again") {
		t.Fatalf("an outage with a failure after its last served call ended: %s", buf.String())
	}
	h.answered()
	if !strings.Contains(buf.String(), "store calls are served again") || !strings.Contains(buf.String(), "failed_watch=2") {
		t.Fatalf("a call served a quiet second after the last failure did not end the outage: %s", buf.String())
	}
}
