package leasetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tablease/tablease/lease"
)

// Run runs the conformance suite against the engines newTarget makes: one fresh Target per subtest,
// whose engine the suite closes at the end of the subtest. Subtests run one after the other, so a
// factory may share one store between them as long as each Target starts empty.
//
// The suite runs in real time with short TTLs (a 20 ms minimum); it waits for expiries by polling
// with deadlines and never asserts on speed, except that with the store unreachable every call must
// give up within Target.OpTimeout plus two seconds. It allows a store to round the times it answers
// to the millisecond, and asks every answer (LostError.Current and ReleaseResult.Lease included)
// to carry the Key it is about.
//
// The events part (eventTests: lease.Feed and lease.Presence) holds to DESIGN's latency bound: an
// expiry is announced within a second of it, which the suite allows another second of slack. The
// admin part (adminTests: lease.Admin) and the handoff part (handoffTests: lease.ModeHandoff) check
// the events and audit records of what they do.
func Run(t *testing.T, newTarget Factory) {
	for _, group := range [][]struct {
		name string
		run  func(t *testing.T, newTarget Factory)
	}{tests, eventTests, adminTests, handoffTests} {
		for _, tc := range group {
			t.Run(tc.name, func(t *testing.T) { tc.run(t, newTarget) })
		}
	}
}

var tests = []struct {
	name string
	run  func(t *testing.T, newTarget Factory)
}{
	{"a free session is granted to the first tab with an epoch from the store clock", testFreeAcquire},
	{"a lease held by another tab is refused with who holds it and for how long", testHeld},
	{"the holder acquiring again keeps its epoch and extends the lease", testReacquire},
	{"a takeover grants a new epoch and the old holder loses the lease", testTakeover},
	{"a takeover by the holder keeps its epoch", testTakeoverByHolder},
	{"a takeover of a free session is an ordinary grant", testTakeoverFree},
	{"renew extends the lease and records whether the tab is hidden", testRenew},
	{"renew by another tab or at another epoch is lost and shows the holder", testRenewWrongTabOrEpoch},
	{"renew after expiry is lost and never resurrects the lease", testRenewAfterExpiry},
	{"release frees the lease and answers a retry the same way", testRelease},
	{"a stale release never frees a newer lease", testStaleRelease},
	{"a tab that says it is gone loses its lease and gets nothing from an acquire it sent before", testGoneTab},
	{"an acquire after a release gets a higher epoch", testAcquireAfterRelease},
	{"an acquire after expiry gets a higher epoch even for the same tab", testAcquireAfterExpiry},
	{"epochs strictly increase over a thousand grants", testThousandGrants},
	{"epochs keep increasing after the store loses its data", testLoseData},
	{"TTLs are clamped to the limits", testClampTTL},
	{"invalid arguments are refused and change nothing", testInvalid},
	{"the widest valid identifiers and labels are accepted", testValidBounds},
	{"check confirms the holder and refuses everyone else", testCheck},
	{"a session that never had a lease is free at epoch 0", testNeverUsed},
	{"sessions of different users and different sessions are independent", testIndependent},
	{"one of 64 tabs racing for a session wins every round", testRaceTry},
	{"racing acquires and releases never let two tabs hold at once", testRaceTryRelease},
	{"concurrent calls keep one tab per epoch and never confirm a superseded epoch", testHistory},
	{"an unreachable store is reported as unavailable and the leases survive it", testOutage},
	{"a user's sessions are bounded and a session the user has is never refused", testSessionLimit},
	{"a session is forgotten the idle retention after the last thing in it ended, and not before", testForgetting},
}

func testFreeAcquire(t *testing.T, newTarget Factory) {
	// A default TTL long enough that the Get below still finds the lease held on a slow machine.
	f := start(t, newTarget, lease.Limits{Min: 20 * time.Millisecond, Default: 1500 * time.Millisecond, Max: 2 * time.Second, HiddenMax: 3 * time.Second})
	key := lease.Key{User: "alice", Session: "doc-1"}
	h := lease.Holder{TabID: "tab-a", Label: "Events — /events/evt-1"}
	before := time.Now()
	l := f.acquireReq(lease.AcquireRequest{Key: key, Holder: h})

	if l.Key != key {
		t.Errorf("Key = %+v, want %+v", l.Key, key)
	}
	if !l.Held || l.Holder != h {
		t.Errorf("Held = %v, Holder = %+v; want true, %+v", l.Held, l.Holder, h)
	}
	grantedMicros := l.GrantedAt.UnixMicro()
	if l.Epoch < grantedMicros || l.Epoch >= grantedMicros+slack.Microseconds() {
		t.Errorf("Epoch = %d, want the store clock in microseconds at the grant (GrantedAt %v = %d µs)", l.Epoch, l.GrantedAt, grantedMicros)
	}
	if l.Epoch < 1 || l.Epoch >= lease.MaxEpoch {
		t.Errorf("Epoch = %d, want it in [1, 2^53)", l.Epoch)
	}
	if d := l.GrantedAt.Sub(before); d < -time.Hour || d > time.Hour {
		t.Errorf("GrantedAt = %v is more than an hour from the test's clock (%v): wrong unit?", l.GrantedAt, before)
	}
	if l.TTL != f.limits.Default {
		t.Errorf("TTL = %v, want the default %v", l.TTL, f.limits.Default)
	}
	if !near(l.ExpiresAt.Sub(l.GrantedAt), l.TTL) {
		t.Errorf("ExpiresAt - GrantedAt = %v, want the TTL %v", l.ExpiresAt.Sub(l.GrantedAt), l.TTL)
	}
	if l.Now.IsZero() || l.Now.Before(l.GrantedAt) {
		t.Errorf("Now = %v, want the store time of the answer, not before GrantedAt %v", l.Now, l.GrantedAt)
	}
	if r := l.Remaining(); r <= 0 || r > l.TTL {
		t.Errorf("Remaining() = %v, want it in (0, %v]", r, l.TTL)
	}
	if l.Transitions != 1 {
		t.Errorf("Transitions = %d, want 1", l.Transitions)
	}

	g := f.get(key)
	if !g.HeldBy(h.TabID, l.Epoch) || g.Holder != h {
		t.Errorf("Get after the grant = %+v, want held by %+v at epoch %d", g, h, l.Epoch)
	}
	if !nearTime(g.GrantedAt, l.GrantedAt) || !nearTime(g.ExpiresAt, l.ExpiresAt) || g.TTL != l.TTL || g.Transitions != 1 {
		t.Errorf("Get after the grant = %+v, want the times, TTL and transitions of the grant %+v", g, l)
	}
	if g.Now.Before(l.Now) {
		t.Errorf("Get answered at %v, before the grant's answer at %v", g.Now, l.Now)
	}

	// A hidden tab with an empty label is a holder like any other.
	key2 := lease.Key{User: "alice", Session: "doc-2"}
	h2 := lease.Holder{TabID: "tab-b", Hidden: true}
	l2 := f.acquireReq(lease.AcquireRequest{Key: key2, Holder: h2, Mode: lease.ModeTry})
	if l2.Holder != h2 || l2.TTL != f.limits.Default {
		t.Errorf("hidden acquire = %+v, want holder %+v with the default TTL", l2, h2)
	}
}

func testHeld(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	key := lease.Key{User: "alice", Session: "doc-1"}
	h := lease.Holder{TabID: "tab-a", Label: "first tab", Hidden: true}
	a := f.acquireReq(lease.AcquireRequest{Key: key, Holder: h, TTL: long})

	for _, mode := range []lease.Mode{"", lease.ModeTry} {
		_, err := f.eng.Acquire(f.ctx(), lease.AcquireRequest{Key: key, Holder: holder("tab-b"), TTL: long, Mode: mode})
		held := wantHeld(t, fmt.Sprintf("Acquire by another tab in mode %q", mode), err)
		if held.Holder != h {
			t.Errorf("HeldError.Holder = %+v, want %+v", held.Holder, h)
		}
		if held.Epoch != a.Epoch {
			t.Errorf("HeldError.Epoch = %d, want %d", held.Epoch, a.Epoch)
		}
		if held.Remaining <= 0 || held.Remaining > long {
			t.Errorf("HeldError.Remaining = %v, want it in (0, %v]", held.Remaining, long)
		}
	}
	if g := f.get(key); !g.HeldBy("tab-a", a.Epoch) || g.Transitions != 1 || !nearTime(g.ExpiresAt, a.ExpiresAt) {
		t.Errorf("Get after the refusals = %+v, want the first grant unchanged %+v", g, a)
	}
}

func testReacquire(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	key := lease.Key{User: "alice", Session: "doc-1"}
	a := f.acquireReq(lease.AcquireRequest{Key: key, Holder: lease.Holder{TabID: "tab-a", Label: "one"}, TTL: time.Second})
	f.waitStore(key, a.Now.Add(5*time.Millisecond))

	h := lease.Holder{TabID: "tab-a", Label: "two", Hidden: true}
	b := f.acquireReq(lease.AcquireRequest{Key: key, Holder: h, TTL: time.Second})
	if b.Epoch != a.Epoch {
		t.Errorf("re-acquire Epoch = %d, want the holder's %d", b.Epoch, a.Epoch)
	}
	if b.Transitions != a.Transitions {
		t.Errorf("re-acquire Transitions = %d, want %d: it is not a new grant", b.Transitions, a.Transitions)
	}
	if !nearTime(b.GrantedAt, a.GrantedAt) {
		t.Errorf("re-acquire GrantedAt = %v, want the grant's %v", b.GrantedAt, a.GrantedAt)
	}
	if !b.ExpiresAt.After(a.ExpiresAt) || !near(b.ExpiresAt.Sub(b.Now), time.Second) {
		t.Errorf("re-acquire ExpiresAt = %v (now %v), want one second from now, after %v", b.ExpiresAt, b.Now, a.ExpiresAt)
	}
	if b.Holder != h {
		t.Errorf("re-acquire Holder = %+v, want the new label and hidden flag %+v", b.Holder, h)
	}
	if g := f.get(key); g.Holder != h || g.Epoch != a.Epoch {
		t.Errorf("Get after the re-acquire = %+v, want holder %+v at epoch %d", g, h, a.Epoch)
	}
}

func testTakeover(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	key := lease.Key{User: "alice", Session: "doc-1"}
	a := f.acquire(key, "tab-a", long, lease.ModeTry)
	b := f.acquire(key, "tab-b", long, lease.ModeTakeover)
	if b.Epoch <= a.Epoch || b.Epoch >= lease.MaxEpoch {
		t.Errorf("takeover Epoch = %d, want above %d and below 2^53", b.Epoch, a.Epoch)
	}
	if b.Transitions != 2 {
		t.Errorf("takeover Transitions = %d, want 2", b.Transitions)
	}
	if b.GrantedAt.Before(a.GrantedAt) {
		t.Errorf("takeover GrantedAt = %v, before the first grant at %v", b.GrantedAt, a.GrantedAt)
	}

	_, err := f.eng.Renew(f.ctx(), lease.RenewRequest{Key: key, TabID: "tab-a", Epoch: a.Epoch})
	lost := wantLost(t, "Renew by the tab taken over", err)
	if !lost.Current.HeldBy("tab-b", b.Epoch) {
		t.Errorf("LostError.Current = %+v, want held by tab-b at %d", lost.Current, b.Epoch)
	}
	_, err = f.eng.Check(f.ctx(), key, "tab-a", a.Epoch)
	wantLost(t, "Check by the tab taken over", err)
	f.check(key, "tab-b", b.Epoch)

	_, err = f.eng.Acquire(f.ctx(), lease.AcquireRequest{Key: key, Holder: holder("tab-a"), TTL: long})
	if held := wantHeld(t, "Acquire in try mode by the tab taken over", err); held.Holder.TabID != "tab-b" || held.Epoch != b.Epoch {
		t.Errorf("HeldError = %+v, want tab-b at %d", held, b.Epoch)
	}
}

func testTakeoverByHolder(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	key := lease.Key{User: "alice", Session: "doc-1"}
	a := f.acquire(key, "tab-a", time.Second, lease.ModeTry)
	b := f.acquire(key, "tab-a", long, lease.ModeTakeover)
	if b.Epoch != a.Epoch || b.Transitions != a.Transitions {
		t.Errorf("takeover by the holder = epoch %d, transitions %d; want %d, %d", b.Epoch, b.Transitions, a.Epoch, a.Transitions)
	}
	if b.TTL != long || !near(b.ExpiresAt.Sub(b.Now), long) {
		t.Errorf("takeover by the holder: TTL %v, expires %v after now; want %v", b.TTL, b.ExpiresAt.Sub(b.Now), long)
	}
	f.renew(key, "tab-a", a.Epoch, 0, false)
}

func testTakeoverFree(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	key := lease.Key{User: "alice", Session: "doc-1"}
	a := f.acquire(key, "tab-a", long, lease.ModeTakeover)
	if a.Transitions != 1 || a.Epoch < a.GrantedAt.UnixMicro() {
		t.Errorf("takeover of a free session = %+v, want a first grant", a)
	}
	f.wantReleased(key, "tab-a", a.Epoch, true)
	b := f.acquire(key, "tab-b", long, lease.ModeTakeover)
	if b.Epoch <= a.Epoch || b.Transitions != 2 {
		t.Errorf("takeover of a released session = epoch %d, transitions %d; want above %d, 2", b.Epoch, b.Transitions, a.Epoch)
	}
}

func testRenew(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	key := lease.Key{User: "alice", Session: "doc-1"}
	a := f.acquire(key, "tab-a", time.Second, lease.ModeTry)
	f.waitStore(key, a.Now.Add(5*time.Millisecond))

	r := f.renew(key, "tab-a", a.Epoch, time.Second, false)
	if !r.ExpiresAt.After(a.ExpiresAt) || !near(r.ExpiresAt.Sub(r.Now), time.Second) {
		t.Errorf("renew ExpiresAt = %v (now %v), want one second from now, after %v", r.ExpiresAt, r.Now, a.ExpiresAt)
	}
	if r.Epoch != a.Epoch || r.Transitions != a.Transitions || !nearTime(r.GrantedAt, a.GrantedAt) {
		t.Errorf("renew = %+v, want the epoch, transitions and GrantedAt of the grant %+v", r, a)
	}
	if r.Holder != holder("tab-a") {
		t.Errorf("renew Holder = %+v, want %+v", r.Holder, holder("tab-a"))
	}

	r = f.renew(key, "tab-a", a.Epoch, 2500*time.Millisecond, true)
	if !r.Holder.Hidden || r.TTL != 2500*time.Millisecond {
		t.Errorf("hidden renew = hidden %v, TTL %v; want true, 2.5s", r.Holder.Hidden, r.TTL)
	}
	if r.Holder.Label != holder("tab-a").Label {
		t.Errorf("hidden renew Label = %q, want it kept", r.Holder.Label)
	}
	if g := f.get(key); !g.Holder.Hidden {
		t.Errorf("Get after a hidden renew = %+v, want Hidden", g)
	}
	r = f.renew(key, "tab-a", a.Epoch, 2500*time.Millisecond, false)
	if r.Holder.Hidden || r.TTL != f.limits.Max {
		t.Errorf("visible renew = hidden %v, TTL %v; want false, %v", r.Holder.Hidden, r.TTL, f.limits.Max)
	}
	if g := f.get(key); g.Holder.Hidden || g.Epoch != a.Epoch {
		t.Errorf("Get after a visible renew = %+v, want visible at epoch %d", g, a.Epoch)
	}
}

func testRenewWrongTabOrEpoch(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	key := lease.Key{User: "alice", Session: "doc-1"}
	a := f.acquire(key, "tab-a", long, lease.ModeTry)
	for _, tc := range []struct {
		name  string
		tab   string
		epoch int64
	}{
		{"another tab at the holder's epoch", "tab-b", a.Epoch},
		{"the holder at a later epoch", "tab-a", a.Epoch + 1},
		{"the holder at an earlier epoch", "tab-a", a.Epoch - 1},
	} {
		_, err := f.eng.Renew(f.ctx(), lease.RenewRequest{Key: key, TabID: tc.tab, Epoch: tc.epoch, TTL: long})
		lost := wantLost(t, "Renew by "+tc.name, err)
		if !lost.Current.HeldBy("tab-a", a.Epoch) || lost.Current.Holder != holder("tab-a") {
			t.Errorf("Renew by %s: LostError.Current = %+v, want held by tab-a at %d", tc.name, lost.Current, a.Epoch)
		}
		if lost.Current.Remaining() <= 0 {
			t.Errorf("Renew by %s: LostError.Current.Remaining() = %v, want positive", tc.name, lost.Current.Remaining())
		}
	}
	if g := f.get(key); !g.HeldBy("tab-a", a.Epoch) || !nearTime(g.ExpiresAt, a.ExpiresAt) {
		t.Errorf("Get after the refused renews = %+v, want the grant unchanged %+v", g, a)
	}
}

func testRenewAfterExpiry(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	key := lease.Key{User: "alice", Session: "doc-1"}
	a := f.acquire(key, "tab-a", f.limits.Min, lease.ModeTry)
	if a.TTL != f.limits.Min {
		t.Fatalf("TTL = %v, want the minimum %v", a.TTL, f.limits.Min)
	}
	free := f.waitFree(key)
	if free.Epoch != a.Epoch || free.Holder != (lease.Holder{}) {
		t.Errorf("Get after expiry = %+v, want free with the last epoch %d and no holder", free, a.Epoch)
	}
	if free.Now.Add(slack).Before(a.ExpiresAt) {
		t.Errorf("Get said free at %v, before the lease expired at %v", free.Now, a.ExpiresAt)
	}

	_, err := f.eng.Renew(f.ctx(), lease.RenewRequest{Key: key, TabID: "tab-a", Epoch: a.Epoch, TTL: long})
	lost := wantLost(t, "Renew after expiry", err)
	if lost.Current.Held || lost.Current.Epoch != a.Epoch {
		t.Errorf("LostError.Current = %+v, want free at the last epoch %d", lost.Current, a.Epoch)
	}
	_, err = f.eng.Check(f.ctx(), key, "tab-a", a.Epoch)
	wantLost(t, "Check after expiry", err)
	if g := f.get(key); g.Held || g.Epoch != a.Epoch || g.Transitions != 1 {
		t.Errorf("Get after a renew after expiry = %+v, want still free at epoch %d: a renew never resurrects", g, a.Epoch)
	}
	f.wantReleased(key, "tab-a", a.Epoch, false)
}

func testRelease(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	key := lease.Key{User: "alice", Session: "doc-1"}
	a := f.acquire(key, "tab-a", long, lease.ModeTry)

	r := f.wantReleased(key, "tab-a", a.Epoch, true)
	if r.Lease.Held || r.Lease.Epoch != a.Epoch || r.Lease.Holder != (lease.Holder{}) {
		t.Errorf("Release answered the lease %+v, want free at the last epoch %d", r.Lease, a.Epoch)
	}
	if g := f.get(key); g.Held || g.Epoch != a.Epoch || g.Transitions != 1 {
		t.Errorf("Get after release = %+v, want free at the last epoch %d", g, a.Epoch)
	}
	// A retried release gets the first answer; other tabs and epochs never release anything.
	f.wantReleased(key, "tab-a", a.Epoch, true)
	f.wantReleased(key, "tab-a", a.Epoch+1, false)
	f.wantReleased(key, "tab-a", a.Epoch-1, false)
	f.wantReleased(key, "tab-b", a.Epoch, false)
	f.wantReleased(key, "tab-a", a.Epoch, true)

	_, err := f.eng.Renew(f.ctx(), lease.RenewRequest{Key: key, TabID: "tab-a", Epoch: a.Epoch})
	wantLost(t, "Renew after release", err)
	_, err = f.eng.Check(f.ctx(), key, "tab-a", a.Epoch)
	wantLost(t, "Check after release", err)
	if g := f.get(key); g.Held || g.Epoch != a.Epoch {
		t.Errorf("Get at the end = %+v, want free at epoch %d", g, a.Epoch)
	}
}

func testGoneTab(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	key := lease.Key{User: "alice", Session: "doc-1"}
	gone := func(key lease.Key, tab string) lease.ReleaseResult {
		t.Helper()
		r, err := f.eng.Release(f.ctx(), lease.ReleaseRequest{Key: key, TabID: tab, Gone: true})
		if err != nil {
			t.Fatalf("Release of %s, gone: %v", tab, err)
		}
		if r.Lease.Key != key {
			t.Errorf("Release of %s, gone, answered the lease of %+v, want %+v", tab, r.Lease.Key, key)
		}
		return r
	}
	refused := func(key lease.Key, tab string) {
		t.Helper()
		for _, mode := range []lease.Mode{lease.ModeTry, lease.ModeTakeover, lease.ModeHandoff} {
			l, err := f.eng.Acquire(f.ctx(), lease.AcquireRequest{Key: key, Holder: holder(tab), TTL: long, Mode: mode})
			var retry *lease.RetryError
			if !errors.Is(err, lease.ErrTabGone) || !errors.As(err, &retry) || retry.RetryAfter <= 0 || retry.RetryAfter > lease.GoneWindow {
				t.Errorf("Acquire of the gone %s, mode %s = %+v, %v; want a *lease.RetryError matching lease.ErrTabGone, RetryAfter in (0, %v]", tab, mode, l, err, lease.GoneWindow)
			}
		}
	}

	// The holder goes: its lease ends, whatever its epoch, and its acquires grant nothing.
	a := f.acquire(key, "tab-a", long, lease.ModeTry)
	if r := gone(key, "tab-a"); !r.Released || r.Lease.Held || r.Lease.Epoch != a.Epoch {
		t.Errorf("Release of the holder, gone = %+v, want released, free at epoch %d", r, a.Epoch)
	}
	if r := gone(key, "tab-a"); !r.Released || r.Lease.Held {
		t.Errorf("the same release retried = %+v, want released as the first, the lease still free", r)
	}
	refused(key, "tab-a")
	// Other tabs are granted as ever, and the gone tab takes nothing from them.
	b := f.acquire(key, "tab-b", long, lease.ModeTry)
	refused(key, "tab-a")
	f.check(key, "tab-b", b.Epoch)

	// A tab that goes before its acquire arrives, on a held session and on one with no state: the
	// acquire grants nothing, the holder keeps its lease.
	if r := gone(key, "tab-c"); r.Released || !r.Lease.HeldBy("tab-b", b.Epoch) {
		t.Errorf("Release of a tab that holds nothing, gone = %+v, want not released, tab-b's lease", r)
	}
	refused(key, "tab-c")
	f.check(key, "tab-b", b.Epoch)
	fresh := lease.Key{User: "alice", Session: "doc-2"}
	if r := gone(fresh, "tab-d"); r.Released || r.Lease.Held || r.Lease.Epoch != 0 {
		t.Errorf("Release of a tab of a session with no state, gone = %+v, want not released, free at epoch 0", r)
	}
	refused(fresh, "tab-d")
	f.acquire(fresh, "tab-e", long, lease.ModeTry)

	// Tabs closed together: each one's acquires are refused, the latest lease.MaxGone of them.
	for i := range lease.MaxGone {
		gone(key, fmt.Sprintf("tab-w%d", i))
	}
	for i := range lease.MaxGone {
		refused(key, fmt.Sprintf("tab-w%d", i))
	}
	f.check(key, "tab-b", b.Epoch)

	// A gone release names no epoch.
	_, err := f.eng.Release(f.ctx(), lease.ReleaseRequest{Key: key, TabID: "tab-b", Epoch: b.Epoch, Gone: true})
	wantInvalid(t, "Release, gone, with an epoch", err)
	f.check(key, "tab-b", b.Epoch)
}

func testStaleRelease(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	key := lease.Key{User: "alice", Session: "doc-1"}

	// The old holder releasing after a takeover.
	a := f.acquire(key, "tab-a", long, lease.ModeTry)
	b := f.acquire(key, "tab-b", long, lease.ModeTakeover)
	r := f.wantReleased(key, "tab-a", a.Epoch, false)
	if !r.Lease.HeldBy("tab-b", b.Epoch) {
		t.Errorf("stale Release answered %+v, want the lease of tab-b at %d", r.Lease, b.Epoch)
	}
	f.wantReleased(key, "tab-b", a.Epoch, false)
	f.check(key, "tab-b", b.Epoch)

	// A release retried after another tab got the lease.
	f.wantReleased(key, "tab-b", b.Epoch, true)
	c := f.acquire(key, "tab-c", long, lease.ModeTry)
	f.wantReleased(key, "tab-b", b.Epoch, false)
	f.check(key, "tab-c", c.Epoch)

	// And after that tab released in turn.
	f.wantReleased(key, "tab-c", c.Epoch, true)
	f.wantReleased(key, "tab-b", b.Epoch, false)
	if g := f.get(key); g.Held || g.Epoch != c.Epoch {
		t.Errorf("Get at the end = %+v, want free at epoch %d", g, c.Epoch)
	}
}

func testAcquireAfterRelease(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	key := lease.Key{User: "alice", Session: "doc-1"}
	a := f.acquire(key, "tab-a", long, lease.ModeTry)
	f.wantReleased(key, "tab-a", a.Epoch, true)
	b := f.acquire(key, "tab-a", long, lease.ModeTry)
	if b.Epoch <= a.Epoch || b.Transitions != 2 {
		t.Errorf("same tab after release = epoch %d, transitions %d; want above %d, 2", b.Epoch, b.Transitions, a.Epoch)
	}
	f.wantReleased(key, "tab-a", b.Epoch, true)
	c := f.acquire(key, "tab-b", long, lease.ModeTry)
	if c.Epoch <= b.Epoch || c.Transitions != 3 {
		t.Errorf("another tab after release = epoch %d, transitions %d; want above %d, 3", c.Epoch, c.Transitions, b.Epoch)
	}
	// The old epoch of the same tab is dead.
	_, err := f.eng.Renew(f.ctx(), lease.RenewRequest{Key: key, TabID: "tab-a", Epoch: a.Epoch})
	wantLost(t, "Renew of a released epoch", err)
}

func testAcquireAfterExpiry(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	key := lease.Key{User: "alice", Session: "doc-1"}
	a := f.acquire(key, "tab-a", f.limits.Min, lease.ModeTry)
	f.waitFree(key)
	b := f.acquire(key, "tab-a", f.limits.Min, lease.ModeTry)
	if b.Epoch <= a.Epoch || b.Transitions != 2 {
		t.Errorf("same tab after expiry = epoch %d, transitions %d; want above %d, 2", b.Epoch, b.Transitions, a.Epoch)
	}
	if !b.GrantedAt.After(a.GrantedAt) {
		t.Errorf("GrantedAt = %v, want after the first grant at %v", b.GrantedAt, a.GrantedAt)
	}
	f.waitFree(key)
	c := f.acquire(key, "tab-b", long, lease.ModeTry)
	if c.Epoch <= b.Epoch || c.Transitions != 3 {
		t.Errorf("another tab after expiry = epoch %d, transitions %d; want above %d, 3", c.Epoch, c.Transitions, b.Epoch)
	}
	_, err := f.eng.Renew(f.ctx(), lease.RenewRequest{Key: key, TabID: "tab-a", Epoch: b.Epoch})
	wantLost(t, "Renew of an expired epoch", err)
}

func testThousandGrants(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	key := lease.Key{User: "alice", Session: "doc-1"}
	const grants = 1000
	var last lease.Lease
	for i := range grants {
		tab, mode := "tab-a", lease.ModeTakeover
		if i%2 == 1 {
			tab = "tab-b"
		}
		if i == 0 {
			mode = lease.ModeTry
		}
		l := f.acquire(key, tab, long, mode)
		if l.Epoch <= last.Epoch || l.Epoch >= lease.MaxEpoch {
			t.Fatalf("grant %d: epoch %d, want above %d and below 2^53", i+1, l.Epoch, last.Epoch)
		}
		if l.Transitions != int64(i+1) {
			t.Fatalf("grant %d: Transitions = %d, want %d", i+1, l.Transitions, i+1)
		}
		last = l
	}
	if g := f.get(key); !g.HeldBy("tab-b", last.Epoch) || g.Transitions != grants {
		t.Errorf("Get after %d grants = %+v, want tab-b at %d with %d transitions", grants, g, last.Epoch, grants)
	}
}

func testLoseData(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	if f.target.LoseData == nil {
		t.Skip("the target cannot lose its data (LoseData is nil)")
	}
	key := lease.Key{User: "alice", Session: "doc-1"}
	var last int64
	for i := range 5 {
		tab := fmt.Sprintf("tab-%d", i)
		l := f.acquire(key, tab, long, lease.ModeTry)
		if l.Epoch <= last {
			t.Fatalf("grant %d after the store lost its data: epoch %d, want above %d", i+1, l.Epoch, last)
		}
		// Takeovers may run epochs a little ahead of the clock.
		l = f.acquire(key, tab+"-again", long, lease.ModeTakeover)
		last = l.Epoch
		// DESIGN §2: no reissue once the store's clock has passed the last epoch.
		f.waitStore(key, time.UnixMicro(last+1))
		f.loseData()
		if g := f.get(key); g.Held {
			t.Fatalf("after LoseData the lease is still held: %+v", g)
		}
	}
	l := f.acquire(key, "tab-last", long, lease.ModeTry)
	if l.Epoch <= last {
		t.Fatalf("grant after the last loss: epoch %d, want above %d", l.Epoch, last)
	}
}

func testClampTTL(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	lim := f.limits
	for i, tc := range []struct {
		name   string
		ttl    time.Duration
		hidden bool
		want   time.Duration
	}{
		{"zero asks for the default", 0, false, lim.Default},
		{"below the minimum gets the minimum", time.Millisecond, false, lim.Min},
		{"within the bounds is granted as asked", 700 * time.Millisecond, false, 700 * time.Millisecond},
		{"a fraction of a millisecond is truncated", 250*time.Millisecond + 600*time.Microsecond, false, 250 * time.Millisecond},
		{"above the maximum gets the maximum", 10 * time.Second, false, lim.Max},
		{"a visible tab between the maximum and the hidden maximum gets the maximum", 2500 * time.Millisecond, false, lim.Max},
		{"a hidden tab asking for nothing gets the default", 0, true, lim.Default},
		{"a hidden tab below the minimum gets the minimum", time.Millisecond, true, lim.Min},
		{"a hidden tab may go past the maximum", 2500 * time.Millisecond, true, 2500 * time.Millisecond},
		{"a hidden tab above the hidden maximum gets the hidden maximum", time.Hour, true, lim.HiddenMax},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fixture{t: t, target: f.target, eng: f.eng, limits: f.limits}
			key := lease.Key{User: "alice", Session: fmt.Sprintf("clamp-%d", i)}
			a := f.acquireReq(lease.AcquireRequest{Key: key, Holder: lease.Holder{TabID: "tab-a", Hidden: tc.hidden}, TTL: tc.ttl})
			if a.TTL != tc.want || !near(a.ExpiresAt.Sub(a.GrantedAt), tc.want) {
				t.Errorf("Acquire with TTL %v, hidden %v: TTL %v, expires %v after the grant; want %v", tc.ttl, tc.hidden, a.TTL, a.ExpiresAt.Sub(a.GrantedAt), tc.want)
			}
			if r := a.Remaining(); r > tc.want {
				t.Errorf("Acquire: Remaining() = %v, above the TTL %v", r, tc.want)
			}
			key.Session += "-renew"
			b := f.acquire(key, "tab-b", long, lease.ModeTry)
			r := f.renew(key, "tab-b", b.Epoch, tc.ttl, tc.hidden)
			if r.TTL != tc.want || !near(r.ExpiresAt.Sub(r.Now), tc.want) {
				t.Errorf("Renew with TTL %v, hidden %v: TTL %v, expires %v after now; want %v", tc.ttl, tc.hidden, r.TTL, r.ExpiresAt.Sub(r.Now), tc.want)
			}
		})
	}

	t.Run("a negative TTL is invalid", func(t *testing.T) {
		key := lease.Key{User: "alice", Session: "clamp-negative"}
		_, err := f.eng.Acquire(t.Context(), lease.AcquireRequest{Key: key, Holder: holder("tab-a"), TTL: -time.Second})
		wantInvalid(t, "Acquire with a negative TTL", err)
		_, err = f.eng.Acquire(t.Context(), lease.AcquireRequest{Key: key, Holder: lease.Holder{TabID: "tab-a", Hidden: true}, TTL: -time.Nanosecond})
		wantInvalid(t, "hidden Acquire with a negative TTL", err)
		if g, err := f.eng.Get(t.Context(), key); err != nil || g.Held || g.Epoch != 0 {
			t.Errorf("Get after the refused acquires = %+v, %v; want a session that never had a lease", g, err)
		}
		a, err := f.eng.Acquire(t.Context(), lease.AcquireRequest{Key: key, Holder: holder("tab-a"), TTL: long})
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		_, err = f.eng.Renew(t.Context(), lease.RenewRequest{Key: key, TabID: "tab-a", Epoch: a.Epoch, TTL: -time.Millisecond})
		wantInvalid(t, "Renew with a negative TTL", err)
		if g, err := f.eng.Get(t.Context(), key); err != nil || !g.HeldBy("tab-a", a.Epoch) || !nearTime(g.ExpiresAt, a.ExpiresAt) {
			t.Errorf("Get after the refused renew = %+v, %v; want the grant unchanged %+v", g, err, a)
		}
	})
}

func testInvalid(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	good := lease.Key{User: "alice", Session: "doc-1"}
	held := lease.Key{User: "alice", Session: "doc-held"}
	a := f.acquire(held, "tab-a", long, lease.ModeTry)

	badIDs := []struct{ name, id string }{
		{"empty", ""},
		{"a dot", "."},
		{"two dots", ".."},
		{"a slash", "a/b"},
		{"a space", "a b"},
		{"braces", "{a}"},
		{"a star", "a*"},
		{"a newline", "a\n"},
		{"a non-ASCII letter", "café"},
		{"129 characters", strings.Repeat("a", 129)},
	}
	type call struct {
		name string
		do   func(ctx context.Context) error
	}
	var calls []call
	acq := func(req lease.AcquireRequest) func(ctx context.Context) error {
		return func(ctx context.Context) error { _, err := f.eng.Acquire(ctx, req); return err }
	}
	ren := func(req lease.RenewRequest) func(ctx context.Context) error {
		return func(ctx context.Context) error { _, err := f.eng.Renew(ctx, req); return err }
	}
	rel := func(req lease.ReleaseRequest) func(ctx context.Context) error {
		return func(ctx context.Context) error { _, err := f.eng.Release(ctx, req); return err }
	}
	get := func(key lease.Key) func(ctx context.Context) error {
		return func(ctx context.Context) error { _, err := f.eng.Get(ctx, key); return err }
	}
	chk := func(key lease.Key, tab string, epoch int64) func(ctx context.Context) error {
		return func(ctx context.Context) error { _, err := f.eng.Check(ctx, key, tab, epoch); return err }
	}
	for _, bad := range badIDs {
		for _, k := range []struct {
			part string
			key  lease.Key
		}{
			{"user", lease.Key{User: bad.id, Session: "doc-1"}},
			{"session", lease.Key{User: "alice", Session: bad.id}},
		} {
			what := fmt.Sprintf("a %s id with %s", k.part, bad.name)
			calls = append(calls,
				call{"Acquire with " + what, acq(lease.AcquireRequest{Key: k.key, Holder: holder("tab-a")})},
				call{"Renew with " + what, ren(lease.RenewRequest{Key: k.key, TabID: "tab-a", Epoch: a.Epoch})},
				call{"Release with " + what, rel(lease.ReleaseRequest{Key: k.key, TabID: "tab-a", Epoch: a.Epoch})},
				call{"Get with " + what, get(k.key)},
				call{"Check with " + what, chk(k.key, "tab-a", a.Epoch)},
			)
		}
		what := "a tab id with " + bad.name
		calls = append(calls,
			call{"Acquire with " + what, acq(lease.AcquireRequest{Key: good, Holder: lease.Holder{TabID: bad.id}})},
			call{"Acquire on a held lease with " + what, acq(lease.AcquireRequest{Key: held, Holder: lease.Holder{TabID: bad.id}, Mode: lease.ModeTakeover})},
			call{"Renew with " + what, ren(lease.RenewRequest{Key: held, TabID: bad.id, Epoch: a.Epoch})},
			call{"Release with " + what, rel(lease.ReleaseRequest{Key: held, TabID: bad.id, Epoch: a.Epoch})},
			call{"Check with " + what, chk(held, bad.id, a.Epoch)},
		)
	}
	for _, label := range []struct{ name, label string }{
		{"201 characters", strings.Repeat("é", 201)},
		{"a newline", "line\nbreak"},
		{"a NUL", "a\x00b"},
		{"a tab character", "a\tb"},
		{"invalid UTF-8", "a\xffb"},
	} {
		calls = append(calls,
			call{"Acquire with a label of " + label.name, acq(lease.AcquireRequest{Key: good, Holder: lease.Holder{TabID: "tab-a", Label: label.label}})},
			call{"Acquire by the holder with a label of " + label.name, acq(lease.AcquireRequest{Key: held, Holder: lease.Holder{TabID: "tab-a", Label: label.label}})},
		)
	}
	// ModeHandoff is valid or not by engine: the handoff part of the suite tells them apart.
	for _, mode := range []lease.Mode{"bogus", "TRY", "Takeover", "Handoff"} {
		calls = append(calls,
			call{fmt.Sprintf("Acquire in mode %q", mode), acq(lease.AcquireRequest{Key: good, Holder: holder("tab-a"), Mode: mode})},
			call{fmt.Sprintf("Acquire of a held lease in mode %q", mode), acq(lease.AcquireRequest{Key: held, Holder: holder("tab-b"), Mode: mode})},
		)
	}
	for _, epoch := range []int64{0, -1, lease.MaxEpoch, lease.MaxEpoch + 1, -lease.MaxEpoch} {
		what := fmt.Sprintf("epoch %d", epoch)
		calls = append(calls,
			call{"Renew at " + what, ren(lease.RenewRequest{Key: held, TabID: "tab-a", Epoch: epoch})},
			call{"Release at " + what, rel(lease.ReleaseRequest{Key: held, TabID: "tab-a", Epoch: epoch})},
			call{"Check at " + what, chk(held, "tab-a", epoch)},
		)
	}
	for _, c := range calls {
		wantInvalid(t, c.name, c.do(f.ctx()))
	}

	if g := f.get(good); g.Held || g.Epoch != 0 || g.Transitions != 0 {
		t.Errorf("Get after the invalid calls = %+v, want a session that never had a lease", g)
	}
	if g := f.get(held); !g.HeldBy("tab-a", a.Epoch) || g.Holder != holder("tab-a") || g.Transitions != 1 || !nearTime(g.ExpiresAt, a.ExpiresAt) {
		t.Errorf("Get after the invalid calls = %+v, want the grant unchanged %+v", g, a)
	}
}

func testValidBounds(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	const chars = "ABCXYZabcxyz0189._:@|-"
	long128 := strings.Repeat(chars, 128/len(chars)+1)[:lease.MaxIDLen]
	for _, tc := range []struct {
		name string
		key  lease.Key
		h    lease.Holder
	}{
		{"identifiers of 128 characters of every kind allowed", lease.Key{User: long128, Session: long128}, lease.Holder{TabID: long128}},
		{"identifiers of one character", lease.Key{User: "a", Session: "b"}, lease.Holder{TabID: "c"}},
		{"identifiers with three dots", lease.Key{User: "...", Session: "..."}, lease.Holder{TabID: "..."}},
		{"identifiers that look like store keys", lease.Key{User: "lease:alice", Session: "a|b:c@d"}, lease.Holder{TabID: "x:y"}},
		{"a label of 200 non-ASCII characters", lease.Key{User: "alice", Session: "label-200"}, lease.Holder{TabID: "tab-a", Label: strings.Repeat("é", 200)}},
		{"a label with spaces, punctuation and emoji", lease.Key{User: "alice", Session: "label-mixed"}, lease.Holder{TabID: "tab-a", Label: `Events — /events/evt-1 "quoted" 🚀 <b>&amp;</b>`}},
	} {
		l, err := f.eng.Acquire(f.ctx(), lease.AcquireRequest{Key: tc.key, Holder: tc.h, TTL: long})
		if err != nil {
			t.Errorf("Acquire with %s: %v", tc.name, err)
			continue
		}
		if l.Key != tc.key || l.Holder != tc.h {
			t.Errorf("Acquire with %s answered key %+v, holder %+v", tc.name, l.Key, l.Holder)
		}
		if g := f.get(tc.key); g.Holder != tc.h || g.Epoch != l.Epoch {
			t.Errorf("Get with %s = %+v, want holder %+v at %d", tc.name, g, tc.h, l.Epoch)
		}
		f.check(tc.key, tc.h.TabID, l.Epoch)
		f.renew(tc.key, tc.h.TabID, l.Epoch, long, false)
		f.wantReleased(tc.key, tc.h.TabID, l.Epoch, true)
	}
}

func testCheck(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	key := lease.Key{User: "alice", Session: "doc-1"}
	a := f.acquire(key, "tab-a", long, lease.ModeTry)
	c := f.check(key, "tab-a", a.Epoch)
	if c.Holder != holder("tab-a") || c.Transitions != 1 || c.Now.Before(a.Now) || c.Remaining() <= 0 {
		t.Errorf("Check = %+v, want the lease of the grant %+v", c, a)
	}

	for _, tc := range []struct {
		name  string
		tab   string
		epoch int64
	}{
		{"another tab", "tab-b", a.Epoch},
		{"a later epoch", "tab-a", a.Epoch + 1},
		{"an earlier epoch", "tab-a", a.Epoch - 1},
	} {
		_, err := f.eng.Check(f.ctx(), key, tc.tab, tc.epoch)
		if lost := wantLost(t, "Check by "+tc.name, err); !lost.Current.HeldBy("tab-a", a.Epoch) {
			t.Errorf("Check by %s: LostError.Current = %+v, want tab-a at %d", tc.name, lost.Current, a.Epoch)
		}
	}

	b := f.acquire(key, "tab-b", long, lease.ModeTakeover)
	_, err := f.eng.Check(f.ctx(), key, "tab-a", a.Epoch)
	if lost := wantLost(t, "Check after a takeover", err); !lost.Current.HeldBy("tab-b", b.Epoch) || lost.Current.Holder != holder("tab-b") {
		t.Errorf("Check after a takeover: LostError.Current = %+v, want tab-b at %d", lost.Current, b.Epoch)
	}
	f.check(key, "tab-b", b.Epoch)
	// Check never extends the lease.
	if g := f.get(key); !nearTime(g.ExpiresAt, b.ExpiresAt) {
		t.Errorf("ExpiresAt after checks = %v, want the grant's %v", g.ExpiresAt, b.ExpiresAt)
	}
}

func testNeverUsed(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	key := lease.Key{User: "alice", Session: "never-used"}
	wantNever := func(what string, l lease.Lease) {
		t.Helper()
		if l.Key != key || l.Held || l.Holder != (lease.Holder{}) || l.Epoch != 0 || l.Transitions != 0 ||
			!l.GrantedAt.IsZero() || !l.ExpiresAt.IsZero() || l.Remaining() != 0 {
			t.Errorf("%s = %+v, want a free lease of %+v with epoch 0 and zero times", what, l, key)
		}
	}
	g := f.get(key)
	wantNever("Get", g)
	if g.Now.IsZero() {
		t.Errorf("Get: Now is zero, want the store time")
	}
	_, err := f.eng.Renew(f.ctx(), lease.RenewRequest{Key: key, TabID: "tab-a", Epoch: 1})
	wantNever("LostError.Current of Renew", wantLost(t, "Renew", err).Current)
	_, err = f.eng.Check(f.ctx(), key, "tab-a", 1)
	wantNever("LostError.Current of Check", wantLost(t, "Check", err).Current)
	wantNever("Release", f.wantReleased(key, "tab-a", 1, false).Lease)
	wantNever("Get at the end", f.get(key))
}

func testIndependent(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	// Pairs that a store key built by joining the parts with a separator would confuse.
	keys := []lease.Key{
		{User: "alice", Session: "doc-1"},
		{User: "bob", Session: "doc-1"},
		{User: "alice", Session: "doc-2"},
		{User: "a:b", Session: "c"},
		{User: "a", Session: "b:c"},
		{User: "a|b", Session: "c"},
		{User: "a", Session: "b|c"},
		{User: "a.b", Session: "c"},
		{User: "a", Session: "b.c"},
		{User: "a-b", Session: "c"},
		{User: "a", Session: "b-c"},
		{User: "a_b", Session: "c"},
		{User: "a", Session: "b_c"},
		{User: "a@b", Session: "c"},
		{User: "a", Session: "b@c"},
	}
	grants := make([]lease.Lease, len(keys))
	for i, key := range keys {
		// The same tab id everywhere: tabs are namespaced by session too.
		grants[i] = f.acquire(key, "tab-1", long, lease.ModeTry)
		if grants[i].Transitions != 1 {
			t.Errorf("Acquire of %+v: Transitions = %d, want 1", key, grants[i].Transitions)
		}
	}
	// Ending and taking over the first leases changes nothing elsewhere.
	f.wantReleased(keys[0], "tab-1", grants[0].Epoch, true)
	f.acquire(keys[1], "tab-2", long, lease.ModeTakeover)
	for i, key := range keys[2:] {
		g := f.get(key)
		if !g.HeldBy("tab-1", grants[i+2].Epoch) || g.Transitions != 1 {
			t.Errorf("Get of %+v = %+v, want its own grant %+v", key, g, grants[i+2])
		}
	}
	// A tab's epoch in one session means nothing in another.
	_, err := f.eng.Renew(f.ctx(), lease.RenewRequest{Key: keys[2], TabID: "tab-1", Epoch: grants[3].Epoch})
	if grants[3].Epoch != grants[2].Epoch {
		wantLost(t, "Renew with the epoch of another session", err)
	}
	if g := f.get(keys[0]); g.Held || g.Epoch != grants[0].Epoch {
		t.Errorf("Get of the released %+v = %+v, want free at %d", keys[0], g, grants[0].Epoch)
	}
}

func testOutage(t *testing.T, newTarget Factory) {
	// A lease long enough to outlive the outage, so that the holder can renew afterwards.
	f := start(t, newTarget, lease.Limits{Min: 20 * time.Millisecond, Default: 300 * time.Millisecond, Max: 2 * time.Minute, HiddenMax: 2 * time.Minute})
	if f.target.Outage == nil {
		t.Skip("the target's store cannot be unreachable (Outage is nil)")
	}
	key := lease.Key{User: "alice", Session: "doc-1"}
	fresh := lease.Key{User: "alice", Session: "doc-fresh"}
	a := f.acquire(key, "tab-a", 2*time.Minute, lease.ModeTry)

	restore := f.target.Outage(t)
	var once sync.Once
	restoreOnce := func() { once.Do(restore) }
	t.Cleanup(restoreOnce)

	// None of these calls could end tab-a's lease if the store applied it late.
	bound := f.target.OpTimeout + 2*time.Second
	for _, op := range []struct {
		name string
		do   func(ctx context.Context) error
	}{
		{"Ping", func(ctx context.Context) error { return f.eng.Ping(ctx) }},
		{"Get", func(ctx context.Context) error { _, err := f.eng.Get(ctx, key); return err }},
		{"Acquire by another tab", func(ctx context.Context) error {
			_, err := f.eng.Acquire(ctx, lease.AcquireRequest{Key: key, Holder: holder("tab-b"), TTL: time.Second})
			return err
		}},
		{"Acquire of a free session", func(ctx context.Context) error {
			_, err := f.eng.Acquire(ctx, lease.AcquireRequest{Key: fresh, Holder: holder("tab-b"), TTL: time.Second})
			return err
		}},
		{"Renew by the holder", func(ctx context.Context) error {
			_, err := f.eng.Renew(ctx, lease.RenewRequest{Key: key, TabID: "tab-a", Epoch: a.Epoch, TTL: 2 * time.Minute})
			return err
		}},
		{"Renew by another tab", func(ctx context.Context) error {
			_, err := f.eng.Renew(ctx, lease.RenewRequest{Key: key, TabID: "tab-b", Epoch: a.Epoch})
			return err
		}},
		{"Release at a stale epoch", func(ctx context.Context) error {
			_, err := f.eng.Release(ctx, lease.ReleaseRequest{Key: key, TabID: "tab-a", Epoch: a.Epoch - 1})
			return err
		}},
		{"Check by the holder", func(ctx context.Context) error { _, err := f.eng.Check(ctx, key, "tab-a", a.Epoch); return err }},
		{"Check by another tab", func(ctx context.Context) error { _, err := f.eng.Check(ctx, key, "tab-b", a.Epoch); return err }},
	} {
		err, ok := within(bound, op.do)
		switch {
		case !ok:
			t.Errorf("%s with the store unreachable did not return within %v", op.name, bound)
		case errors.Is(err, lease.ErrLost) || errors.Is(err, lease.ErrHeld):
			t.Errorf("%s with the store unreachable = %v: store trouble must never be reported as a decision", op.name, err)
		case !errors.Is(err, lease.ErrUnavailable):
			t.Errorf("%s with the store unreachable = %v, want lease.ErrUnavailable", op.name, err)
		}
		var unavailable *lease.UnavailableError
		if err != nil && !errors.As(err, &unavailable) {
			t.Errorf("%s with the store unreachable = %v, want a *lease.UnavailableError", op.name, err)
		}
	}

	restoreOnce()
	deadline := time.Now().Add(f.target.OpTimeout + 30*time.Second)
	for {
		err, ok := within(bound, f.eng.Ping)
		if ok && err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the engine did not work again after the store came back: Ping = %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The lease survived; retry the first calls, which may meet connections broken by the outage.
	var r lease.Lease
	for {
		var err error
		r, err = f.eng.Renew(f.ctx(), lease.RenewRequest{Key: key, TabID: "tab-a", Epoch: a.Epoch, TTL: 2 * time.Minute})
		if err == nil {
			break
		}
		if !errors.Is(err, lease.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("Renew by the holder after the outage: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !r.HeldBy("tab-a", a.Epoch) || r.Transitions != 1 {
		t.Errorf("Renew after the outage = %+v, want tab-a at %d", r, a.Epoch)
	}
	_, err := f.eng.Acquire(f.ctx(), lease.AcquireRequest{Key: key, Holder: holder("tab-b"), TTL: time.Second})
	wantHeld(t, "Acquire by another tab after the outage", err)
	f.wantReleased(key, "tab-a", a.Epoch, true)
}

// within runs op with a context without deadline, and waits at most bound for its answer.
// ok is false when op did not return in time (it is left running).
func within(bound time.Duration, op func(ctx context.Context) error) (err error, ok bool) {
	done := make(chan error, 1)
	go func() { done <- op(context.Background()) }()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	select {
	case err := <-done:
		return err, true
	case <-timer.C:
		return nil, false
	}
}

func testSessionLimit(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	if f.target.Limited == nil {
		t.Skip("the Target has no Limited engine")
	}
	const perUser = 3
	eng := f.target.Limited(t, perUser)
	f.closeAtCleanup(eng)
	ctx := f.ctx()
	key := func(user, session string) lease.Key { return lease.Key{User: user, Session: session} }
	acquire := func(k lease.Key) (lease.Lease, error) {
		return eng.Acquire(ctx, lease.AcquireRequest{Key: k, Holder: lease.Holder{TabID: "tab-a", Label: "L"}, TTL: long})
	}
	wantLimit := func(what string, err error) {
		t.Helper()
		var le *lease.SessionLimitError
		if !errors.Is(err, lease.ErrTooManySessions) || !errors.As(err, &le) || le.Limit != perUser {
			t.Fatalf("%s: %v, want a *lease.SessionLimitError{Limit: %d} matching ErrTooManySessions", what, err, perUser)
		}
	}

	var held []lease.Lease
	for i := range perUser {
		l, err := acquire(key("alice", fmt.Sprintf("doc-%d", i)))
		if err != nil {
			t.Fatalf("acquire of session %d of %d: %v", i+1, perUser, err)
		}
		held = append(held, l)
	}
	_, err := acquire(key("alice", "doc-extra"))
	wantLimit("an acquire of one session more", err)
	_, err = eng.Join(ctx, key("alice", "doc-extra"), "conn-1", lease.Tab{TabID: "tab-a"}, 0)
	wantLimit("a join of one session more", err)
	_, err = eng.Watch(ctx, key("alice", "doc-extra"), "")
	wantLimit("a watch of one session more", err)
	// A tab that says it is gone, of a session the user has no state for, cannot be marked: the
	// release says so rather than answering as if it were.
	_, err = eng.Release(ctx, lease.ReleaseRequest{Key: key("alice", "doc-extra"), TabID: "tab-a", Gone: true})
	wantLimit("a gone release of one session more", err)
	if g, err := eng.Get(ctx, key("alice", "doc-extra")); err != nil || g.Epoch != 0 || g.Held {
		t.Fatalf("Get of the refused session = %+v, %v; want it untouched (free at epoch 0)", g, err)
	}
	if tabs, err := eng.Tabs(ctx, key("alice", "doc-extra")); err != nil || len(tabs) != 0 {
		t.Fatalf("Tabs of the refused session = %+v, %v; want none", tabs, err)
	}
	// Another user has sessions of its own.
	if _, err := acquire(key("bob", "doc-extra")); err != nil {
		t.Fatalf("another user's acquire: %v", err)
	}
	// A session the user has is never refused: a retry, a takeover, a renew, a join, a watch, a
	// release, a gone release.
	if w, err := eng.Watch(ctx, key("alice", "doc-1"), ""); err != nil {
		t.Fatalf("a watch of a session the user has: %v", err)
	} else {
		w.Close()
	}
	if _, err := acquire(key("alice", "doc-0")); err != nil {
		t.Fatalf("the holder's acquire again: %v", err)
	}
	if _, err := eng.Acquire(ctx, lease.AcquireRequest{Key: key("alice", "doc-1"), Holder: lease.Holder{TabID: "tab-b"}, Mode: lease.ModeTakeover}); err != nil {
		t.Fatalf("a takeover of a session the user has: %v", err)
	}
	if _, err := eng.Join(ctx, key("alice", "doc-2"), "conn-1", lease.Tab{TabID: "tab-a"}, 0); err != nil {
		t.Fatalf("a join of a session the user has: %v", err)
	}
	if r, err := eng.Release(ctx, lease.ReleaseRequest{Key: key("alice", "doc-2"), TabID: "tab-c", Gone: true}); err != nil || r.Released {
		t.Fatalf("a gone release of another tab of a session the user has = %+v, %v; want not released", r, err)
	}
	if r, err := eng.Release(ctx, lease.ReleaseRequest{Key: key("alice", "doc-0"), TabID: "tab-a", Epoch: held[0].Epoch}); err != nil || !r.Released {
		t.Fatalf("Release = %+v, %v", r, err)
	}
	// A released session keeps its state, and its place, for the idle retention.
	_, err = acquire(key("alice", "doc-extra"))
	wantLimit("an acquire of one session more after a release", err)
	l, err := acquire(key("alice", "doc-0"))
	if err != nil || l.Epoch <= held[0].Epoch {
		t.Fatalf("acquire of the released session = %+v, %v; want a grant above epoch %d", l, err, held[0].Epoch)
	}
	// A watched session counts, its watch ended or not, and is then the user's: watches cannot
	// keep ever more sessions.
	for i := range perUser {
		w, err := eng.Watch(ctx, key("carol", fmt.Sprintf("watched-%d", i)), "")
		if err != nil {
			t.Fatalf("watch of session %d of %d: %v", i+1, perUser, err)
		}
		w.Close()
	}
	_, err = eng.Watch(ctx, key("carol", "watched-extra"), "")
	wantLimit("a watch of one session more than the user watched", err)
	_, err = acquire(key("carol", "doc-extra"))
	wantLimit("an acquire of one session more than the user watched", err)
	if _, err := acquire(key("carol", "watched-0")); err != nil {
		t.Fatalf("an acquire of a session the user watched: %v", err)
	}
	// An admin's revoke is never refused.
	if _, err := eng.Revoke(ctx, lease.RevokeRequest{Key: key("alice", "doc-admin"), Admin: "root", Reason: "r", Block: time.Second}); err != nil {
		t.Fatalf("an admin's revoke of a session the user does not have: %v", err)
	}
}
