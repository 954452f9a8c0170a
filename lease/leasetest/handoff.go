package leasetest

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tablease/tablease/lease"
)

// handoffTests are the handoff part of the suite (lease.ModeHandoff). They run with adminLimits,
// so that a lease stays held for as long as a test needs, and check the events and audit records
// of every step.
var handoffTests = []struct {
	name string
	run  func(t *testing.T, newTarget Factory)
}{
	{"a handoff request notifies the holder once and answers HANDOFF_PENDING to every repeat", testHandoffRequest},
	{"a handoff of a free session is a grant, and by the holder a re-acquire", testHandoffFreeOrHolder},
	{"the holder's release reserves the lease for the requester, who claims it in any mode with a higher epoch", testHandoffRelease},
	{"during a reservation other tabs get HANDOFF_PENDING, and a takeover wins", testHandoffReserved},
	{"a takeover during a request wins and ends the request", testHandoffTakeover},
	{"a lease that expires while a handoff is requested is reserved for the requester", testHandoffExpiry},
	{"a request the holder does not answer lapses, and a reservation nobody claims ends", testHandoffTimeout},
	{"a revoke ends a handoff request and a reservation", testHandoffRevoke},
	{"a requester that says it is gone ends its request and its reservation", testHandoffGone},
	{"the holder asking for a new epoch keeps the lease at a higher epoch, and ends a handoff request", testNewEpoch},
	{"racing requesters notify the holder once, and only the requester claims the reservation", testHandoffRace},
}

// handoffFixture is a fixture that knows the engine's handoff timeout and reserve window.
type handoffFixture struct {
	*fixture
	timeout, reserve time.Duration // the engine's handoff timeout and reserve window
	adm              lease.Admin
}

// startHandoff starts a fixture with adminLimits.
func startHandoff(t *testing.T, newTarget Factory) *handoffFixture {
	t.Helper()
	f := start(t, newTarget, adminLimits)
	timeout, reserve := f.target.HandoffTimeout, f.target.HandoffReserve
	if timeout <= 0 || reserve <= 0 || timeout > MaxHandoffWait || reserve > MaxHandoffWait {
		t.Fatalf("the Target of %T must set HandoffTimeout and HandoffReserve to the engine's, each in (0, %v] (ShortHandoffTimeout, ShortHandoffReserve); they are %v and %v",
			f.eng, MaxHandoffWait, timeout, reserve)
	}
	return &handoffFixture{fixture: f, timeout: timeout, reserve: reserve, adm: f.admin()}
}

// watch watches key from a snapshot.
func (h *handoffFixture) watch(key lease.Key) *watcher {
	h.t.Helper()
	return h.fixture.watch(h.feed(), key, "")
}

// events fails unless the next events of w are exactly those wanted.
func (h *handoffFixture) events(w *watcher, what string, wanted ...want) []lease.Event {
	h.t.Helper()
	got := w.nextN(len(wanted))
	wantEvents(h.t, what, got, wanted...)
	return got
}

// records fails unless the audit log of key holds exactly the records wanted (oldest first).
func (h *handoffFixture) records(key lease.Key, what string, wanted ...rec) {
	h.t.Helper()
	got := h.auditPages(h.adm, lease.AuditQuery{User: key.User, Session: key.Session})
	wantRecords(h.t, what, got, reversed(wanted)...)
}

// pending makes an acquire by tab in mode that must be refused with a *lease.RetryError matching
// ErrHandoffPending and a RetryAfter in (0, atMost], and answers the RetryAfter.
func (h *handoffFixture) pending(key lease.Key, tab string, mode lease.Mode, atMost time.Duration) time.Duration {
	h.t.Helper()
	what := fmt.Sprintf("Acquire of %s by %s in mode %q", key.Session, tab, mode)
	l, err := h.eng.Acquire(h.ctx(), lease.AcquireRequest{Key: key, Holder: holder(tab), TTL: minute, Mode: mode})
	if err == nil {
		h.t.Fatalf("%s was granted (%+v), want HANDOFF_PENDING (if the lease had just expired or the window just ended, the machine is too slow for this test)", what, l)
	}
	var retry *lease.RetryError
	if !errors.Is(err, lease.ErrHandoffPending) || !errors.As(err, &retry) || errors.Is(err, lease.ErrHeld) || errors.Is(err, lease.ErrBlocked) {
		h.t.Fatalf("%s: got error %v, want a *lease.RetryError matching lease.ErrHandoffPending (and neither ErrHeld nor ErrBlocked)", what, err)
	}
	if retry.RetryAfter <= 0 || retry.RetryAfter > atMost+slack {
		h.t.Errorf("%s: RetryAfter = %v, want it in (0, %v]", what, retry.RetryAfter, atMost)
	}
	return retry.RetryAfter
}

// held makes an acquire by tab in mode that must be refused with a *lease.HeldError naming
// holderTab.
func (h *handoffFixture) held(key lease.Key, tab string, mode lease.Mode, holderTab string) {
	h.t.Helper()
	what := fmt.Sprintf("Acquire of %s by %s in mode %q", key.Session, tab, mode)
	_, err := h.eng.Acquire(h.ctx(), lease.AcquireRequest{Key: key, Holder: holder(tab), TTL: minute, Mode: mode})
	if he := wantHeld(h.t, what, err); he.Holder.TabID != holderTab {
		h.t.Errorf("%s: HeldError names %q, want %q", what, he.Holder.TabID, holderTab)
	}
}

// request makes tab ask for a handoff of key, which another tab holds: the acquire must be
// refused with HANDOFF_PENDING and a RetryAfter of the whole timeout, and Get must then show the
// request. It answers the request's Until.
func (h *handoffFixture) request(key lease.Key, tab string) time.Time {
	h.t.Helper()
	before := h.get(key)
	if !before.Held || before.Holder.TabID == tab {
		h.t.Fatalf("request: the lease of %s is %+v, want it held by another tab than %s", key.Session, before, tab)
	}
	retry := h.pending(key, tab, lease.ModeHandoff, h.timeout)
	if !near(retry, h.timeout) {
		h.t.Errorf("a new handoff request: RetryAfter = %v, want the handoff timeout %v", retry, h.timeout)
	}
	after := h.get(key)
	if !after.HeldBy(before.Holder.TabID, before.Epoch) {
		h.t.Fatalf("Get after the handoff request = %+v, want the lease unchanged: held by %s at epoch %d", after, before.Holder.TabID, before.Epoch)
	}
	ho := after.Handoff
	if ho == nil || ho.Reserved || ho.Requester != holder(tab) {
		h.t.Fatalf("Get after the handoff request by %s: Handoff = %s, want a request by %+v", tab, showHandoff(ho), holder(tab))
	}
	if ho.Until.Before(before.Now.Add(h.timeout-slack)) || ho.Until.After(after.Now.Add(h.timeout+slack)) {
		h.t.Errorf("Get after the handoff request: Until = %v, want the time of the request (%v to %v) plus the timeout %v", ho.Until, before.Now, after.Now, h.timeout)
	}
	return ho.Until
}

// wantHandoff fails unless l shows the handoff wanted: nil for none, or a request or reservation
// for requester until about until.
func (h *handoffFixture) wantHandoff(what string, l lease.Lease, requester string, reserved bool, until time.Time) {
	h.t.Helper()
	ho := l.Handoff
	if requester == "" {
		if ho != nil {
			h.t.Errorf("%s: Handoff = %s, want none", what, showHandoff(ho))
		}
		return
	}
	if ho == nil || ho.Requester != holder(requester) || ho.Reserved != reserved || !nearTime(ho.Until, until) {
		h.t.Errorf("%s: Handoff = %s, want {Requester %+v, Reserved %v, Until %v}", what, showHandoff(ho), holder(requester), reserved, until)
	}
}

// inTime fails the test, as too slow a machine, when the store's clock has reached until: the end
// of the window the checks before it needed.
func (h *handoffFixture) inTime(key lease.Key, until time.Time, window string) {
	h.t.Helper()
	if g := h.get(key); !g.Now.Before(until) {
		h.t.Fatalf("the store's clock (%v) reached the end of %s (%v) before the test was done with it: the machine is too slow for this test", g.Now, window, until)
	}
}

func showHandoff(ho *lease.HandoffState) string {
	if ho == nil {
		return "nil"
	}
	return fmt.Sprintf("{Requester %+v, Reserved %v, Until %v}", ho.Requester, ho.Reserved, ho.Until)
}

func handoffRequested(epoch int64, h lease.Holder, requester string) want {
	r := holder(requester)
	return want{typ: lease.EventHandoffRequested, epoch: epoch, holder: &h, requester: &r}
}

// releasedFor and expiredFor are the release and the expiry that reserve the lease for requester.
func releasedFor(tab string, epoch int64, requester string) want {
	w := released(tab, epoch)
	r := holder(requester)
	w.requester = &r
	return w
}

func expiredFor(tab string, epoch int64, requester string) want {
	w := expired(tab, epoch)
	r := holder(requester)
	w.requester = &r
	return w
}

// handedOver is the grant that claims the reservation that prevTab left at prevEpoch.
func handedOver(epoch int64, h lease.Holder, prevTab string, prevEpoch int64) want {
	return want{typ: lease.EventGranted, epoch: epoch, holder: &h, prev: &lease.Previous{TabID: prevTab, Epoch: prevEpoch}, reason: lease.ReasonHandoff}
}

func handoffRec(key lease.Key, l lease.Lease, tab, prevTab string, prevEpoch int64) rec {
	return rec{key: key, action: lease.AuditHandoff, epoch: l.Epoch, tab: tab, prev: &lease.Previous{TabID: prevTab, Epoch: prevEpoch}, at: l.GrantedAt}
}

func testHandoffRequest(t *testing.T, newTarget Factory) {
	h := startHandoff(t, newTarget)
	key := lease.Key{User: "alice", Session: "doc-1"}
	w := h.watch(key)
	a := h.acquire(key, "tab-a", minute, lease.ModeTry)
	h.wantHandoff("the grant", a, "", false, time.Time{})

	until := h.request(key, "tab-b")
	// The requester repeats: the same answer, counting down, and nothing else happens.
	left := h.timeout
	for range 3 {
		left = h.pending(key, "tab-b", lease.ModeHandoff, left)
	}
	// A second requester does not replace the first.
	h.pending(key, "tab-c", lease.ModeHandoff, left)
	// Acquires in mode try by other tabs, the requester's included, are refused as before.
	h.held(key, "tab-b", lease.ModeTry, "tab-a")
	h.held(key, "tab-c", lease.ModeTry, "tab-a")
	// The holder keeps renewing and checking; its own acquire in mode handoff is a re-acquire.
	h.renew(key, "tab-a", a.Epoch, minute, false)
	h.check(key, "tab-a", a.Epoch)
	if b := h.acquire(key, "tab-a", minute, lease.ModeHandoff); b.Epoch != a.Epoch || b.Transitions != 1 {
		t.Errorf("the holder's acquire in mode handoff answered epoch %d, %d transitions; want its epoch %d, 1", b.Epoch, b.Transitions, a.Epoch)
	}
	g := h.get(key)
	if !g.HeldBy("tab-a", a.Epoch) || g.Transitions != 1 {
		t.Errorf("Get during the request = %+v, want held by tab-a at epoch %d, 1 transition", g, a.Epoch)
	}
	h.wantHandoff("Get during the request", g, "tab-b", false, until)
	if ls := h.listPages(h.adm, lease.ListQuery{User: "alice"}); len(ls) != 1 {
		t.Errorf("ListLeases during the request listed %d leases, want 1", len(ls))
	} else {
		h.wantHandoff("ListLeases during the request", ls[0], "tab-b", false, until)
	}
	h.inTime(key, until, "the handoff request")

	// The fence: the holder renames itself.
	renamed := lease.Holder{TabID: "tab-a", Label: "renamed"}
	h.acquireReq(lease.AcquireRequest{Key: key, Holder: renamed, TTL: minute})
	evs := h.events(w, "the events of a request and its repeats",
		granted(a.Epoch, holder("tab-a")),
		handoffRequested(a.Epoch, holder("tab-a"), "tab-b"),
		updated(a.Epoch, renamed))
	if len(evs) == 3 && (evs[1].At.Before(a.GrantedAt) || !evs[1].At.Before(until)) {
		t.Errorf("handoff_requested At = %v, want the time of the request, between the grant %v and %v", evs[1].At, a.GrantedAt, until)
	}
	// A request changes no holder: the audit log has only the grant.
	h.records(key, "the audit log of a request", grantRec(key, a, "tab-a"))
}

func testHandoffFreeOrHolder(t *testing.T, newTarget Factory) {
	h := startHandoff(t, newTarget)
	key := lease.Key{User: "alice", Session: "doc-1"}
	w := h.watch(key)
	a := h.acquire(key, "tab-a", minute, lease.ModeHandoff)
	if a.Transitions != 1 {
		t.Errorf("a handoff of a free session: %d transitions, want 1", a.Transitions)
	}
	h.wantHandoff("a handoff of a free session", a, "", false, time.Time{})
	if b := h.acquire(key, "tab-a", minute, lease.ModeHandoff); b.Epoch != a.Epoch {
		t.Errorf("the holder's acquire in mode handoff answered epoch %d, want its epoch %d", b.Epoch, a.Epoch)
	}
	r := h.wantReleased(key, "tab-a", a.Epoch, true)
	h.wantHandoff("a release with no handoff requested", r.Lease, "", false, time.Time{})
	b := h.acquire(key, "tab-b", minute, lease.ModeHandoff)
	if b.Epoch <= a.Epoch {
		t.Errorf("a handoff of a released session: epoch %d, want above %d", b.Epoch, a.Epoch)
	}
	h.events(w, "the events of handoffs of a free session",
		granted(a.Epoch, holder("tab-a")), released("tab-a", a.Epoch), granted(b.Epoch, holder("tab-b")))
	h.records(key, "the audit log of handoffs of a free session",
		grantRec(key, a, "tab-a"), releaseRec(key, "tab-a", a.Epoch), grantRec(key, b, "tab-b"))
}

func testHandoffRelease(t *testing.T, newTarget Factory) {
	h := startHandoff(t, newTarget)
	for _, mode := range []lease.Mode{lease.ModeHandoff, lease.ModeTry, lease.ModeTakeover} {
		key := lease.Key{User: "alice", Session: "doc-" + string(mode)}
		w := h.watch(key)
		a := h.acquire(key, "tab-a", minute, lease.ModeTry)
		h.request(key, "tab-b")

		r := h.wantReleased(key, "tab-a", a.Epoch, true)
		if r.Lease.Held || r.Lease.Epoch != a.Epoch {
			t.Errorf("the release answered %+v, want the lease free at epoch %d", r.Lease, a.Epoch)
		}
		until := r.Lease.Now.Add(h.reserve)
		h.wantHandoff("the release during a request", r.Lease, "tab-b", true, until)
		h.wantHandoff("Get after the release", h.get(key), "tab-b", true, until)
		h.wantReleased(key, "tab-a", a.Epoch, true) // retried: the same answer

		b := h.acquire(key, "tab-b", minute, mode)
		if !b.GrantedAt.Before(until) {
			t.Fatalf("the requester's claim came at %v, after the reservation ended at %v: the machine is too slow for this test", b.GrantedAt, until)
		}
		if b.Epoch <= a.Epoch || b.Transitions != 2 {
			t.Errorf("the claim in mode %q: epoch %d, %d transitions; want above %d, 2", mode, b.Epoch, b.Transitions, a.Epoch)
		}
		h.wantHandoff("the claim", b, "", false, time.Time{})
		h.wantHandoff("Get after the claim", h.get(key), "", false, time.Time{})
		h.wantReleased(key, "tab-a", a.Epoch, false) // stale now
		h.held(key, "tab-a", lease.ModeTry, "tab-b")

		h.events(w, fmt.Sprintf("the events of a handoff claimed in mode %q", mode),
			granted(a.Epoch, holder("tab-a")),
			handoffRequested(a.Epoch, holder("tab-a"), "tab-b"),
			releasedFor("tab-a", a.Epoch, "tab-b"),
			handedOver(b.Epoch, holder("tab-b"), "tab-a", a.Epoch))
		h.records(key, fmt.Sprintf("the audit log of a handoff claimed in mode %q", mode),
			grantRec(key, a, "tab-a"), releaseRec(key, "tab-a", a.Epoch), handoffRec(key, b, "tab-b", "tab-a", a.Epoch))
	}
}

func testHandoffReserved(t *testing.T, newTarget Factory) {
	h := startHandoff(t, newTarget)
	key := lease.Key{User: "alice", Session: "doc-1"}
	w := h.watch(key)
	a := h.acquire(key, "tab-a", minute, lease.ModeTry)
	h.request(key, "tab-b")
	r := h.wantReleased(key, "tab-a", a.Epoch, true)
	until := r.Lease.Now.Add(h.reserve)

	// Every other tab, the one that let go included, is told to wait for the reservation.
	for _, tab := range []string{"tab-a", "tab-c"} {
		for _, mode := range []lease.Mode{lease.ModeTry, lease.ModeHandoff, ""} {
			h.pending(key, tab, mode, h.reserve)
		}
	}
	g := h.get(key)
	if g.Held || g.Epoch != a.Epoch || g.Transitions != 1 {
		t.Errorf("Get after the refused acquires = %+v, want the lease free at epoch %d, 1 transition", g, a.Epoch)
	}
	h.wantHandoff("Get after the refused acquires", g, "tab-b", true, until)
	h.inTime(key, until, "the reservation")

	// A takeover is an explicit user action: it wins, as an ordinary grant of a free lease.
	c := h.acquire(key, "tab-c", minute, lease.ModeTakeover)
	if c.Epoch <= a.Epoch || c.Transitions != 2 {
		t.Errorf("the takeover during the reservation: epoch %d, %d transitions; want above %d, 2", c.Epoch, c.Transitions, a.Epoch)
	}
	h.wantHandoff("the takeover during the reservation", c, "", false, time.Time{})
	// The requester finds the lease held by the tab that took it, and may ask that tab in turn.
	h.held(key, "tab-b", lease.ModeTry, "tab-c")
	h.request(key, "tab-b")

	h.events(w, "the events of a takeover during a reservation",
		granted(a.Epoch, holder("tab-a")),
		handoffRequested(a.Epoch, holder("tab-a"), "tab-b"),
		releasedFor("tab-a", a.Epoch, "tab-b"),
		granted(c.Epoch, holder("tab-c")),
		handoffRequested(c.Epoch, holder("tab-c"), "tab-b"))
	h.records(key, "the audit log of a takeover during a reservation",
		grantRec(key, a, "tab-a"), releaseRec(key, "tab-a", a.Epoch), grantRec(key, c, "tab-c"))
}

func testHandoffTakeover(t *testing.T, newTarget Factory) {
	h := startHandoff(t, newTarget)
	key := lease.Key{User: "alice", Session: "doc-1"}
	w := h.watch(key)
	a := h.acquire(key, "tab-a", minute, lease.ModeTry)
	h.request(key, "tab-b")
	c := h.acquire(key, "tab-c", minute, lease.ModeTakeover)
	if c.Epoch <= a.Epoch {
		t.Errorf("the takeover during a request: epoch %d, want above %d", c.Epoch, a.Epoch)
	}
	h.wantHandoff("the takeover during a request", c, "", false, time.Time{})
	h.wantHandoff("Get after the takeover", h.get(key), "", false, time.Time{})
	// The request ended with the lease it asked for: the release of the new holder reserves
	// nothing.
	r := h.wantReleased(key, "tab-c", c.Epoch, true)
	h.wantHandoff("the release after the takeover", r.Lease, "", false, time.Time{})
	d := h.acquire(key, "tab-d", minute, lease.ModeTry)
	h.events(w, "the events of a takeover during a request",
		granted(a.Epoch, holder("tab-a")),
		handoffRequested(a.Epoch, holder("tab-a"), "tab-b"),
		takenOver(c.Epoch, holder("tab-c"), "tab-a", a.Epoch),
		released("tab-c", c.Epoch),
		granted(d.Epoch, holder("tab-d")))
	h.records(key, "the audit log of a takeover during a request",
		grantRec(key, a, "tab-a"), takeoverRec(key, c, "tab-c", "tab-a", a.Epoch),
		releaseRec(key, "tab-c", c.Epoch), grantRec(key, d, "tab-d"))

	// The requester's own takeover is a takeover like any other.
	own := lease.Key{User: "alice", Session: "doc-own"}
	a2 := h.acquire(own, "tab-a", minute, lease.ModeTry)
	h.request(own, "tab-b")
	b2 := h.acquire(own, "tab-b", minute, lease.ModeTakeover)
	h.wantHandoff("the requester's takeover", b2, "", false, time.Time{})
	h.records(own, "the audit log of the requester's takeover",
		grantRec(own, a2, "tab-a"), takeoverRec(own, b2, "tab-b", "tab-a", a2.Epoch))
}

func testNewEpoch(t *testing.T, newTarget Factory) {
	h := startHandoff(t, newTarget)
	key := lease.Key{User: "alice", Session: "doc-1"}
	w := h.watch(key)
	a := h.acquire(key, "tab-a", minute, lease.ModeTry)
	h.request(key, "tab-b")

	// The holder, in any mode, with another label: a grant at a higher epoch, to the same tab.
	relabelled := lease.Holder{TabID: "tab-a", Label: "relabelled"}
	b := h.acquireReq(lease.AcquireRequest{Key: key, Holder: relabelled, TTL: minute, Mode: lease.ModeHandoff, NewEpoch: true})
	if !b.HeldBy("tab-a", b.Epoch) || b.Epoch <= a.Epoch || b.Holder != relabelled || b.Transitions != a.Transitions+1 || b.Epoch < b.GrantedAt.UnixMicro() {
		t.Fatalf("the holder's acquire asking for a new epoch = %+v; want tab-a (relabelled) at an epoch above %d, floored at the grant's time, one transition more", b, a.Epoch)
	}
	if !b.GrantedAt.After(a.GrantedAt) || !near(b.ExpiresAt.Sub(b.Now), minute) {
		t.Errorf("the new epoch: granted %v (the first grant %v), expires %v after now; want a new grant for a minute", b.GrantedAt, a.GrantedAt, b.ExpiresAt.Sub(b.Now))
	}
	h.wantHandoff("the new epoch", b, "", false, time.Time{})
	// The old epoch is over, the new one holds; the requester asks again as after any grant.
	_, err := h.eng.Renew(h.ctx(), lease.RenewRequest{Key: key, TabID: "tab-a", Epoch: a.Epoch, TTL: minute})
	wantErr(t, "a renew at the epoch before the new one", err, lease.ErrLost)
	h.renew(key, "tab-a", b.Epoch, minute, false)
	h.request(key, "tab-b")

	// Another tab asking for a new epoch gets what its mode gives: refused, or a takeover.
	h.pending(key, "tab-b", lease.ModeHandoff, h.timeout)
	_, err = h.eng.Acquire(h.ctx(), lease.AcquireRequest{Key: key, Holder: holder("tab-c"), TTL: minute, Mode: lease.ModeTry, NewEpoch: true})
	wantHeld(t, "another tab's acquire in mode try asking for a new epoch", err)
	c := h.acquireReq(lease.AcquireRequest{Key: key, Holder: holder("tab-c"), TTL: minute, Mode: lease.ModeTakeover, NewEpoch: true})
	h.wantReleased(key, "tab-c", c.Epoch, true)
	// Of a free session: an ordinary grant.
	d := h.acquireReq(lease.AcquireRequest{Key: key, Holder: holder("tab-d"), TTL: minute, NewEpoch: true})

	h.events(w, "the events of a new epoch",
		granted(a.Epoch, holder("tab-a")),
		handoffRequested(a.Epoch, holder("tab-a"), "tab-b"),
		want{typ: lease.EventGranted, epoch: b.Epoch, holder: &relabelled, prev: &lease.Previous{TabID: "tab-a", Epoch: a.Epoch}, reason: lease.ReasonNewEpoch},
		handoffRequested(b.Epoch, relabelled, "tab-b"),
		takenOver(c.Epoch, holder("tab-c"), "tab-a", b.Epoch),
		released("tab-c", c.Epoch),
		granted(d.Epoch, holder("tab-d")))
	newEpochRec := grantRec(key, b, "tab-a")
	newEpochRec.prev = &lease.Previous{TabID: "tab-a", Epoch: a.Epoch}
	h.records(key, "the audit log of a new epoch",
		grantRec(key, a, "tab-a"), newEpochRec, takeoverRec(key, c, "tab-c", "tab-a", b.Epoch),
		releaseRec(key, "tab-c", c.Epoch), grantRec(key, d, "tab-d"))
}

func testHandoffExpiry(t *testing.T, newTarget Factory) {
	h := startHandoff(t, newTarget)
	key := lease.Key{User: "alice", Session: "doc-1"}
	w := h.watch(key)
	// The lease expires well before the request would lapse.
	ttl := h.timeout / 2
	a := h.acquire(key, "tab-a", ttl, lease.ModeTry)
	requestUntil := h.request(key, "tab-b")
	if !requestUntil.After(a.ExpiresAt) {
		t.Fatalf("the request lapses at %v, not after the lease expires at %v", requestUntil, a.ExpiresAt)
	}

	free := h.waitFree(key)
	until := a.ExpiresAt.Add(h.reserve)
	h.wantHandoff("Get after the expiry", free, "tab-b", true, until)
	h.pending(key, "tab-c", lease.ModeTry, h.reserve)
	h.pending(key, "tab-a", lease.ModeTry, h.reserve)
	h.inTime(key, until, "the reservation")

	b := h.acquire(key, "tab-b", minute, lease.ModeHandoff)
	if !b.GrantedAt.Before(until) {
		t.Fatalf("the requester's claim came at %v, after the reservation ended at %v: the machine is too slow for this test", b.GrantedAt, until)
	}
	if b.Epoch <= a.Epoch {
		t.Errorf("the claim after the expiry: epoch %d, want above %d", b.Epoch, a.Epoch)
	}
	evs := h.events(w, "the events of a handoff by expiry",
		granted(a.Epoch, holder("tab-a")),
		handoffRequested(a.Epoch, holder("tab-a"), "tab-b"),
		expiredFor("tab-a", a.Epoch, "tab-b"),
		handedOver(b.Epoch, holder("tab-b"), "tab-a", a.Epoch))
	if len(evs) == 4 && !nearTime(evs[2].At, a.ExpiresAt) {
		t.Errorf("expired At = %v, want the lease's ExpiresAt %v", evs[2].At, a.ExpiresAt)
	}
	h.records(key, "the audit log of a handoff by expiry",
		grantRec(key, a, "tab-a"), expireRec(key, a), handoffRec(key, b, "tab-b", "tab-a", a.Epoch))
}

func testHandoffTimeout(t *testing.T, newTarget Factory) {
	h := startHandoff(t, newTarget)
	// Three sessions wait together: a request that lapses while the holder keeps the lease, one
	// asked again after it lapsed, and a reservation that nobody claims.
	lapse := lease.Key{User: "alice", Session: "doc-lapse"}
	again := lease.Key{User: "alice", Session: "doc-again"}
	unclaimed := lease.Key{User: "alice", Session: "doc-unclaimed"}
	wl, wa, wu := h.watch(lapse), h.watch(again), h.watch(unclaimed)

	a1 := h.acquire(lapse, "tab-a", minute, lease.ModeTry)
	u1 := h.request(lapse, "tab-b")
	a2 := h.acquire(again, "tab-a", minute, lease.ModeTry)
	u2 := h.request(again, "tab-b")
	a3 := h.acquire(unclaimed, "tab-a", minute, lease.ModeTry)
	h.request(unclaimed, "tab-b")
	r3 := h.wantReleased(unclaimed, "tab-a", a3.Epoch, true)
	u3 := r3.Lease.Now.Add(h.reserve)
	h.waitStore(lapse, later(u1, u2, u3))

	// The lapsed request: the holder keeps its lease, and its release reserves nothing.
	g := h.get(lapse)
	if !g.HeldBy("tab-a", a1.Epoch) {
		t.Errorf("Get after the request lapsed = %+v, want still held by tab-a at epoch %d", g, a1.Epoch)
	}
	h.wantHandoff("Get after the request lapsed", g, "", false, time.Time{})
	h.renew(lapse, "tab-a", a1.Epoch, minute, false)
	h.held(lapse, "tab-c", lease.ModeTry, "tab-a")
	r1 := h.wantReleased(lapse, "tab-a", a1.Epoch, true)
	h.wantHandoff("the release after the request lapsed", r1.Lease, "", false, time.Time{})
	c1 := h.acquire(lapse, "tab-c", minute, lease.ModeTry)
	h.events(wl, "the events of a request that lapsed",
		granted(a1.Epoch, holder("tab-a")),
		handoffRequested(a1.Epoch, holder("tab-a"), "tab-b"),
		released("tab-a", a1.Epoch),
		granted(c1.Epoch, holder("tab-c")))
	h.records(lapse, "the audit log of a request that lapsed",
		grantRec(lapse, a1, "tab-a"), releaseRec(lapse, "tab-a", a1.Epoch), grantRec(lapse, c1, "tab-c"))

	// Asking again after the lapse is a new request, told to the holder again.
	h.wantHandoff("Get after the first request lapsed", h.get(again), "", false, time.Time{})
	h.request(again, "tab-b")
	h.events(wa, "the events of a request made again after it lapsed",
		granted(a2.Epoch, holder("tab-a")),
		handoffRequested(a2.Epoch, holder("tab-a"), "tab-b"),
		handoffRequested(a2.Epoch, holder("tab-a"), "tab-b"))

	// The reservation nobody claimed: the lease is free for anyone, as an ordinary grant.
	g3 := h.get(unclaimed)
	if g3.Held || g3.Epoch != a3.Epoch {
		t.Errorf("Get after the reservation ended = %+v, want free at epoch %d", g3, a3.Epoch)
	}
	h.wantHandoff("Get after the reservation ended", g3, "", false, time.Time{})
	c3 := h.acquire(unclaimed, "tab-c", minute, lease.ModeTry)
	h.events(wu, "the events of a reservation nobody claimed",
		granted(a3.Epoch, holder("tab-a")),
		handoffRequested(a3.Epoch, holder("tab-a"), "tab-b"),
		releasedFor("tab-a", a3.Epoch, "tab-b"),
		granted(c3.Epoch, holder("tab-c")))
	h.records(unclaimed, "the audit log of a reservation nobody claimed",
		grantRec(unclaimed, a3, "tab-a"), releaseRec(unclaimed, "tab-a", a3.Epoch), grantRec(unclaimed, c3, "tab-c"))
}

// later is the latest of ts.
func later(ts ...time.Time) time.Time {
	var l time.Time
	for _, t := range ts {
		if t.After(l) {
			l = t
		}
	}
	return l
}

func testHandoffRevoke(t *testing.T, newTarget Factory) {
	h := startHandoff(t, newTarget)
	adm := h.admin()

	// A revoke of the held lease ends the request with it.
	key := lease.Key{User: "alice", Session: "doc-held"}
	w := h.watch(key)
	a := h.acquire(key, "tab-a", minute, lease.ModeTry)
	h.request(key, "tab-b")
	rv := h.revoke(adm, revokeReq(key, "support"))
	if !rv.Revoked {
		t.Fatalf("the revoke during a request answered %s, want Revoked", showResult(rv))
	}
	h.wantHandoff("Get after the revoke", h.get(key), "", false, time.Time{})
	b := h.acquire(key, "tab-b", minute, lease.ModeHandoff) // the lease is free, and reserved for nobody
	h.events(w, "the events of a revoke during a request",
		granted(a.Epoch, holder("tab-a")),
		handoffRequested(a.Epoch, holder("tab-a"), "tab-b"),
		want{typ: lease.EventRevoked, epoch: rv.Epoch, prev: &lease.Previous{TabID: "tab-a", Epoch: a.Epoch}, reason: "support"},
		granted(b.Epoch, holder("tab-b")))
	h.records(key, "the audit log of a revoke during a request",
		grantRec(key, a, "tab-a"), revokeRec(key, rv, "root", "support"), grantRec(key, b, "tab-b"))

	// A revoke of a free lease ends its reservation.
	free := lease.Key{User: "alice", Session: "doc-free"}
	wf := h.watch(free)
	a2 := h.acquire(free, "tab-a", minute, lease.ModeTry)
	h.request(free, "tab-b")
	h.wantReleased(free, "tab-a", a2.Epoch, true)
	if rv2 := h.revoke(adm, revokeReq(free, "support")); rv2.Revoked || rv2.Epoch != a2.Epoch {
		t.Errorf("the revoke of the reserved free lease answered %s, want Revoked false at epoch %d", showResult(rv2), a2.Epoch)
	}
	h.wantHandoff("Get after the revoke of the reserved lease", h.get(free), "", false, time.Time{})
	c2 := h.acquire(free, "tab-c", minute, lease.ModeTry)
	h.events(wf, "the events of a revoke during a reservation",
		granted(a2.Epoch, holder("tab-a")),
		handoffRequested(a2.Epoch, holder("tab-a"), "tab-b"),
		releasedFor("tab-a", a2.Epoch, "tab-b"),
		granted(c2.Epoch, holder("tab-c")))
	h.records(free, "the audit log of a revoke during a reservation",
		grantRec(free, a2, "tab-a"), releaseRec(free, "tab-a", a2.Epoch), grantRec(free, c2, "tab-c"))
}

func testHandoffGone(t *testing.T, newTarget Factory) {
	h := startHandoff(t, newTarget)
	gone := func(key lease.Key, tab string) lease.ReleaseResult {
		t.Helper()
		r, err := h.eng.Release(h.ctx(), lease.ReleaseRequest{Key: key, TabID: tab, Gone: true})
		if err != nil {
			t.Fatalf("Release of %s, gone: %v", tab, err)
		}
		return r
	}

	// Gone while its request is pending: the holder keeps its lease, and its release then reserves
	// nothing, so another tab's try is granted.
	key := lease.Key{User: "alice", Session: "doc-requested"}
	w := h.watch(key)
	a := h.acquire(key, "tab-a", minute, lease.ModeTry)
	requested := h.request(key, "tab-b")
	if r := gone(key, "tab-b"); r.Released || !r.Lease.HeldBy("tab-a", a.Epoch) {
		t.Errorf("the requester's gone release answered %+v, want not released, tab-a's lease", r)
	}
	h.wantHandoff("Get after the requester went", h.get(key), "", false, time.Time{})
	h.check(key, "tab-a", a.Epoch)
	h.wantHandoff("the holder's release after the requester went", h.wantReleased(key, "tab-a", a.Epoch, true).Lease, "", false, time.Time{})
	h.inTime(key, requested, "the request")
	c := h.acquire(key, "tab-c", minute, lease.ModeTry)
	h.events(w, "the events of a request whose requester went",
		granted(a.Epoch, holder("tab-a")),
		handoffRequested(a.Epoch, holder("tab-a"), "tab-b"),
		released("tab-a", a.Epoch),
		granted(c.Epoch, holder("tab-c")))

	// Gone once the lease is reserved for it: the lease is free for anyone.
	free := lease.Key{User: "alice", Session: "doc-reserved"}
	a2 := h.acquire(free, "tab-a", minute, lease.ModeTry)
	h.request(free, "tab-b")
	until := h.wantReleased(free, "tab-a", a2.Epoch, true).Lease.Now.Add(h.reserve)
	if r := gone(free, "tab-b"); r.Released || r.Lease.Held || r.Lease.Epoch != a2.Epoch {
		t.Errorf("the requester's gone release during the reservation answered %+v, want not released, free at epoch %d", r, a2.Epoch)
	}
	h.wantHandoff("Get after the requester of the reservation went", h.get(free), "", false, time.Time{})
	h.acquire(free, "tab-c", minute, lease.ModeTry)
	h.inTime(free, until, "the reservation")
}

func testHandoffRace(t *testing.T, newTarget Factory) {
	h := startHandoff(t, newTarget)
	key := lease.Key{User: "alice", Session: "doc-1"}
	w := h.watch(key)
	a := h.acquire(key, "tab-a", minute, lease.ModeTry)

	// Every racer asks a few times at once: one request is made, the others are repeats.
	const racers, rounds = 16, 4
	tabs := make([]string, racers)
	for i := range tabs {
		tabs[i] = fmt.Sprintf("tab-%02d", i)
	}
	race := func(mode lease.Mode, each func(tab string, l lease.Lease, err error)) {
		var wg sync.WaitGroup
		for _, tab := range tabs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					l, err := h.eng.Acquire(h.ctx(), lease.AcquireRequest{Key: key, Holder: holder(tab), TTL: minute, Mode: mode})
					each(tab, l, err)
				}
			}()
		}
		wg.Wait()
	}
	var mu sync.Mutex
	errs := map[string]int{}
	race(lease.ModeHandoff, func(tab string, l lease.Lease, err error) {
		mu.Lock()
		defer mu.Unlock()
		if !errors.Is(err, lease.ErrHandoffPending) {
			errs[fmt.Sprintf("%v (lease %+v)", err, l)]++
		}
	})
	for e, n := range errs {
		t.Errorf("racing handoff requests: %d answered %s, want HANDOFF_PENDING", n, e)
	}
	g := h.get(key)
	if !g.HeldBy("tab-a", a.Epoch) || g.Handoff == nil || g.Handoff.Reserved {
		t.Fatalf("Get after the racing requests = %+v (Handoff %s), want tab-a holding with one request", g, showHandoff(g.Handoff))
	}
	requester := g.Handoff.Requester.TabID
	until := h.wantReleased(key, "tab-a", a.Epoch, true).Lease.Now.Add(h.reserve)

	// Every racer, the requester among them, acquires at once: only the requester is granted.
	var winners []string
	errs = map[string]int{}
	race(lease.ModeTry, func(tab string, l lease.Lease, err error) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err == nil:
			if !l.HeldBy(tab, l.Epoch) {
				errs[fmt.Sprintf("a lease not held by the tab: %+v", l)]++
			} else if !slices.Contains(winners, tab) {
				winners = append(winners, tab)
			}
		case tab == requester:
			errs[fmt.Sprintf("the requester: %v", err)]++
		case !errors.Is(err, lease.ErrHandoffPending) && !errors.Is(err, lease.ErrHeld):
			errs[fmt.Sprintf("%v", err)]++
		}
	})
	for e, n := range errs {
		t.Errorf("racing acquires during the reservation: %d answered %s", n, e)
	}
	h.inTime(key, until, "the reservation")
	if len(winners) != 1 || winners[0] != requester {
		t.Errorf("racing acquires during the reservation granted %v, want only the requester %s", winners, requester)
	}
	b := h.get(key)
	h.events(w, "the events of racing requests and claims",
		granted(a.Epoch, holder("tab-a")),
		handoffRequested(a.Epoch, holder("tab-a"), requester),
		releasedFor("tab-a", a.Epoch, requester),
		handedOver(b.Epoch, holder(requester), "tab-a", a.Epoch))
}
