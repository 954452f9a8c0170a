package leasetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tablease/tablease/lease"
)

// adminTests are the admin part of the suite (lease.Admin).
var adminTests = []struct {
	name string
	run  func(t *testing.T, newTarget Factory)
}{
	{"a revoke of a held lease mints a higher epoch and the old holder's renew, release and check are lost", testRevokeHeld},
	{"the next acquire after a revoke gets a still higher epoch", testAcquireAfterRevoke},
	{"a revoke of a free lease answers false and changes nothing", testRevokeFree},
	{"a retried revoke with the same request id answers as the first did and changes nothing", testRevokeRetried},
	{"a block makes every acquire fail with ErrBlocked until it passes", testBlock},
	{"a new block replaces the old one, shorter or longer", testBlockReplaced},
	{"a revoke is announced to watchers as revoked, and no expiry of the revoked lease follows", testRevokeEvents},
	{"the audit log records every change with its actor, epoch and reason, newest first", testAudit},
	{"the audit log filters by user and session, and its pages cover every record exactly once", testAuditPages},
	{"the audit log under racing calls and revokes tells exactly the story of the changes", testAuditRace},
	{"the list shows only held leases, across users and by user, in key order, a page at a time", testList},
	{"list pages are stable while leases are granted and released between them", testListStable},
	{"invalid admin arguments are refused and change nothing", testAdminInvalid},
	{"admin calls with the store unreachable report it, and a revoke retried afterwards is answered once", testAdminOutage},
	{"a revoke and a block made on one instance hold on another", testAdminPeer},
	{"a catalog change is an admin's record in the admin's log that the user's own actions never push out", testRecordCatalog},
}

// adminLimits let the leases of the admin tests stay held for a minute, so that no test depends
// on being quick, while the minimum still expires a lease in 20 ms.
var adminLimits = lease.Limits{Min: 20 * time.Millisecond, Default: 300 * time.Millisecond, Max: time.Minute, HiddenMax: time.Minute}

// minute is a TTL that outlasts every admin test (adminLimits.Max).
const minute = time.Minute

// admin answers the Admin of the target.
func (f *fixture) admin() lease.Admin { return f.target.Engine }

// revokeReq is a revoke by the admin "root" with reason.
func revokeReq(key lease.Key, reason string) lease.RevokeRequest {
	return lease.RevokeRequest{Key: key, Admin: "root", Reason: reason}
}

// revoke revokes, failing the test on an error or an answer that contradicts itself.
func (f *fixture) revoke(adm lease.Admin, req lease.RevokeRequest) lease.RevokeResult {
	f.t.Helper()
	r, err := adm.Revoke(f.ctx(), req)
	if err != nil {
		f.t.Fatalf("Revoke(%+v): %v", req, err)
	}
	if r.Revoked != (r.Previous != nil) {
		f.t.Errorf("Revoke(%+v) = %+v: Previous must be set exactly when Revoked", req, r)
	}
	if r.Epoch < 0 || r.Epoch >= lease.MaxEpoch || (r.Revoked && r.Epoch < 1) {
		f.t.Errorf("Revoke(%+v) answered epoch %d, want it in [1, 2^53) (0 only for a session that never had a lease)", req, r.Epoch)
	}
	return r
}

func showResult(r lease.RevokeResult) string {
	s := fmt.Sprintf("{Revoked %v, Epoch %d, BlockedUntil %v, Retried %v", r.Revoked, r.Epoch, r.BlockedUntil, r.Retried)
	if r.Previous != nil {
		s += fmt.Sprintf(", Previous %+v", *r.Previous)
	}
	return s + "}"
}

// sameResult reports whether two revoke answers are the same, up to the rounding of times.
func sameResult(a, b lease.RevokeResult) bool {
	return a.Revoked == b.Revoked && a.Epoch == b.Epoch && nearTime(a.BlockedUntil, b.BlockedUntil) &&
		(a.Previous == nil) == (b.Previous == nil) && (a.Previous == nil || *a.Previous == *b.Previous)
}

// retryOf reports whether again answers a retry of the revoke that answered first: the same
// answer, said to be a retry, where first is not.
func retryOf(again, first lease.RevokeResult) bool {
	return sameResult(again, first) && again.Retried && !first.Retried
}

// wantBlocked fails unless Acquire of key by tab in mode is refused by a block that ends at until,
// with a RetryAfter of at most block.
func (f *fixture) wantBlocked(key lease.Key, tab string, mode lease.Mode, block time.Duration, until time.Time) {
	f.t.Helper()
	l, err := f.eng.Acquire(f.ctx(), lease.AcquireRequest{Key: key, Holder: holder(tab), TTL: minute, Mode: mode})
	if err == nil {
		if l.GrantedAt.Add(slack).Before(until) {
			f.t.Fatalf("Acquire by %s in mode %q was granted at %v, during a block until %v: %+v", tab, mode, l.GrantedAt, until, l)
		}
		f.t.Fatalf("Acquire by %s in mode %q came after the block of %v had passed: the machine is too slow for this test", tab, mode, block)
	}
	var retry *lease.RetryError
	if !errors.Is(err, lease.ErrBlocked) || !errors.As(err, &retry) || errors.Is(err, lease.ErrHeld) {
		f.t.Fatalf("Acquire by %s in mode %q during a block: %v, want a *lease.RetryError matching lease.ErrBlocked", tab, mode, err)
	}
	if retry.RetryAfter <= 0 || retry.RetryAfter > block+slack {
		f.t.Errorf("Acquire by %s in mode %q during a block of %v: RetryAfter = %v, want it in (0, %v]", tab, mode, block, retry.RetryAfter, block)
	}
}

// wantBlockedUntil fails unless Get of key answers BlockedUntil near until (zero: no block in
// force). A blocked session is free, so ListLeases never lists it: Get is where a block shows.
func (f *fixture) wantBlockedUntil(key lease.Key, when string, until time.Time) {
	f.t.Helper()
	g := f.get(key)
	switch {
	case until.IsZero():
		if !g.BlockedUntil.IsZero() {
			f.t.Errorf("Get %s answered BlockedUntil %v, want zero: no block is in force at %v", when, g.BlockedUntil, g.Now)
		}
	case !g.Now.Before(until):
		f.t.Fatalf("Get %s came after the block ending at %v had passed: the machine is too slow for this test", when, until)
	case g.BlockedUntil.IsZero() || !nearTime(g.BlockedUntil, until):
		f.t.Errorf("Get %s answered BlockedUntil %v, want the end of the block %v", when, g.BlockedUntil, until)
	case g.Held:
		f.t.Errorf("Get %s = %+v, want a free lease: a blocked session is never held", when, g)
	}
}

// acquireOnceUnblocked polls Acquire of key by tab until the block ends, and answers the grant.
func (f *fixture) acquireOnceUnblocked(key lease.Key, tab string) lease.Lease {
	f.t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		l, err := f.eng.Acquire(f.ctx(), lease.AcquireRequest{Key: key, Holder: holder(tab), TTL: minute})
		if err == nil {
			return l
		}
		if !errors.Is(err, lease.ErrBlocked) {
			f.t.Fatalf("Acquire by %s while waiting for the block to pass: %v", tab, err)
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("the block of %+v did not pass within %v", key, waitFor)
		}
		time.Sleep(pollEvery)
	}
}

// auditPages reads every page of q, checking what every page promises, and answers the records
// of all pages in order.
func (f *fixture) auditPages(adm lease.Admin, q lease.AuditQuery) []lease.AuditRecord {
	f.t.Helper()
	limit := q.Limit
	if limit == 0 {
		limit = lease.DefaultPageLimit
	}
	seen := map[string]bool{}
	var all []lease.AuditRecord
	for pages := 1; ; pages++ {
		p, err := adm.Audit(f.ctx(), q)
		if err != nil {
			f.t.Fatalf("Audit(%+v): %v", q, err)
		}
		if len(p.Records) > limit {
			f.t.Errorf("Audit(%+v) answered %d records, more than the limit %d", q, len(p.Records), limit)
		}
		for _, r := range p.Records {
			if r.ID == "" || seen[r.ID] {
				f.t.Errorf("Audit(%+v) answered a record with an empty or repeated ID: %s", q, showRecord(r))
			}
			seen[r.ID] = true
			if (q.User != "" && r.Key.User != q.User) || (q.Session != "" && r.Key.Session != q.Session) {
				f.t.Errorf("Audit(%+v) answered a record of another user or session: %s", q, showRecord(r))
			}
			if r.At.IsZero() {
				f.t.Errorf("Audit(%+v) answered a record without At: %s", q, showRecord(r))
			}
		}
		all = append(all, p.Records...)
		if p.Next == "" {
			return all
		}
		if len(p.Records) < limit {
			f.t.Errorf("Audit(%+v) answered %d records and a next cursor: a page that is not the last must hold %d", q, len(p.Records), limit)
		}
		if pages > 100_000 {
			f.t.Fatalf("Audit(%+v) keeps answering a next cursor", q)
		}
		q.Cursor = p.Next
	}
}

// listPages reads every page of q, checking what every page promises, and answers the leases of
// all pages in order.
func (f *fixture) listPages(adm lease.Admin, q lease.ListQuery) []lease.Lease {
	f.t.Helper()
	limit := q.Limit
	if limit == 0 {
		limit = lease.DefaultPageLimit
	}
	var all []lease.Lease
	for pages := 1; ; pages++ {
		p := f.listPage(adm, q)
		if len(p.Leases) > limit {
			f.t.Errorf("ListLeases(%+v) answered %d leases, more than the limit %d", q, len(p.Leases), limit)
		}
		all = append(all, p.Leases...)
		if p.Next == "" {
			return all
		}
		if len(p.Leases) < limit {
			f.t.Errorf("ListLeases(%+v) answered %d leases and a next cursor: a page that is not the last must hold %d", q, len(p.Leases), limit)
		}
		if pages > 100_000 {
			f.t.Fatalf("ListLeases(%+v) keeps answering a next cursor", q)
		}
		q.Cursor = p.Next
	}
}

// listPage reads one page and checks that it lists held leases of the user asked for, in order.
func (f *fixture) listPage(adm lease.Admin, q lease.ListQuery) lease.LeasePage {
	f.t.Helper()
	p, err := adm.ListLeases(f.ctx(), q)
	if err != nil {
		f.t.Fatalf("ListLeases(%+v): %v", q, err)
	}
	for i, l := range p.Leases {
		if !l.Held || l.Holder.TabID == "" || l.Remaining() <= 0 || l.Now.IsZero() {
			f.t.Errorf("ListLeases(%+v) listed a lease that is not held: %+v", q, l)
		}
		if q.User != "" && l.Key.User != q.User {
			f.t.Errorf("ListLeases(%+v) listed a lease of another user: %+v", q, l.Key)
		}
		if i > 0 && p.Leases[i-1].Key.Compare(l.Key) >= 0 {
			f.t.Errorf("ListLeases(%+v) listed %+v after %+v: want the order of users, then sessions", q, l.Key, p.Leases[i-1].Key)
		}
	}
	return p
}

func keysOf(ls []lease.Lease) []lease.Key {
	keys := make([]lease.Key, len(ls))
	for i, l := range ls {
		keys[i] = l.Key
	}
	return keys
}

// rec describes an expected audit record. A zero at is not checked.
type rec struct {
	key    lease.Key
	action lease.AuditAction
	epoch  int64
	tab    string // the acting tab
	admin  string // the acting admin
	prev   *lease.Previous
	reason string
	until  time.Time // the end of a block
	at     time.Time
	// requestID is the admin's request (RevokeRequest.AuditRequestID): revoke, block.
	requestID string
}

// req is w with the request id requestID.
func (w rec) req(requestID string) rec {
	w.requestID = requestID
	return w
}

func (w rec) String() string {
	s := fmt.Sprintf("%s/%s %s epoch %d", w.key.User, w.key.Session, w.action, w.epoch)
	if w.tab != "" {
		s += " tab " + w.tab
	}
	if w.admin != "" {
		s += " admin " + w.admin
	}
	if w.prev != nil {
		s += fmt.Sprintf(" previous %+v", *w.prev)
	}
	if w.reason != "" {
		s += fmt.Sprintf(" reason %q", w.reason)
	}
	if !w.until.IsZero() {
		s += fmt.Sprintf(" until %v", w.until)
	}
	if w.requestID != "" {
		s += " request " + w.requestID
	}
	return s
}

func showRecord(r lease.AuditRecord) string {
	s := fmt.Sprintf("%s %s/%s %s epoch %d at %v", r.ID, r.Key.User, r.Key.Session, r.Action, r.Epoch, r.At)
	if r.TabID != "" {
		s += " tab " + r.TabID
	}
	if r.Admin != "" {
		s += " admin " + r.Admin
	}
	if r.Previous != nil {
		s += fmt.Sprintf(" previous %+v", *r.Previous)
	}
	if r.Reason != "" {
		s += fmt.Sprintf(" reason %q", r.Reason)
	}
	if !r.Until.IsZero() {
		s += fmt.Sprintf(" until %v", r.Until)
	}
	if r.RequestID != "" {
		s += " request " + r.RequestID
	}
	return s
}

func (w rec) matches(r lease.AuditRecord) bool {
	if r.Key != w.key || r.Action != w.action || r.Epoch != w.epoch || r.TabID != w.tab || r.Admin != w.admin || r.Reason != w.reason ||
		r.RequestID != w.requestID {
		return false
	}
	if (r.Previous == nil) != (w.prev == nil) || (w.prev != nil && *r.Previous != *w.prev) {
		return false
	}
	if w.until.IsZero() != r.Until.IsZero() || !nearTime(w.until, r.Until) {
		return false
	}
	return w.at.IsZero() || nearTime(w.at, r.At)
}

// wantRecords fails unless got are exactly the records wanted, in order.
func wantRecords(t *testing.T, what string, got []lease.AuditRecord, wanted ...rec) {
	t.Helper()
	ok := len(got) == len(wanted)
	for i := 0; ok && i < len(got); i++ {
		ok = wanted[i].matches(got[i])
	}
	if ok {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: got %d records:\n", what, len(got))
	for _, r := range got {
		fmt.Fprintf(&b, "\t%s\n", showRecord(r))
	}
	fmt.Fprintf(&b, "want %d:\n", len(wanted))
	for _, w := range wanted {
		at := ""
		if !w.at.IsZero() {
			at = fmt.Sprintf(" at %v", w.at)
		}
		fmt.Fprintf(&b, "\t%s%s\n", w, at)
	}
	t.Error(b.String())
}

func grantRec(key lease.Key, l lease.Lease, tab string) rec {
	return rec{key: key, action: lease.AuditGrant, epoch: l.Epoch, tab: tab, at: l.GrantedAt}
}

func takeoverRec(key lease.Key, l lease.Lease, tab, prevTab string, prevEpoch int64) rec {
	return rec{key: key, action: lease.AuditTakeover, epoch: l.Epoch, tab: tab, prev: &lease.Previous{TabID: prevTab, Epoch: prevEpoch}, at: l.GrantedAt}
}

func releaseRec(key lease.Key, tab string, epoch int64) rec {
	return rec{key: key, action: lease.AuditRelease, epoch: epoch, tab: tab, prev: &lease.Previous{TabID: tab, Epoch: epoch}}
}

func expireRec(key lease.Key, l lease.Lease) rec {
	return rec{key: key, action: lease.AuditExpire, epoch: l.Epoch, prev: &lease.Previous{TabID: l.Holder.TabID, Epoch: l.Epoch}, at: l.ExpiresAt}
}

func revokeRec(key lease.Key, r lease.RevokeResult, admin, reason string) rec {
	return rec{key: key, action: lease.AuditRevoke, epoch: r.Epoch, admin: admin, prev: r.Previous, reason: reason}
}

func blockRec(key lease.Key, r lease.RevokeResult, admin, reason string) rec {
	return rec{key: key, action: lease.AuditBlock, epoch: r.Epoch, admin: admin, reason: reason, until: r.BlockedUntil}
}

// reversed answers the records wanted newest first, from a list oldest first.
func reversed(rs []rec) []rec {
	out := slices.Clone(rs)
	slices.Reverse(out)
	return out
}

func testRevokeHeld(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, adminLimits)
	adm := f.admin()
	key := lease.Key{User: "alice", Session: "doc-1"}
	other := lease.Key{User: "alice", Session: "doc-2"}
	bobs := lease.Key{User: "bob", Session: "doc-1"}
	a := f.acquire(key, "tab-a", minute, lease.ModeTry)
	o := f.acquire(other, "tab-a", minute, lease.ModeTry)
	b := f.acquire(bobs, "tab-a", minute, lease.ModeTry)

	r := f.revoke(adm, revokeReq(key, "the tab is stuck on an old route"))
	if !r.Revoked || r.Epoch <= a.Epoch {
		t.Errorf("Revoke of a held lease = %s, want Revoked with an epoch above the holder's %d", showResult(r), a.Epoch)
	}
	if r.Previous == nil || *r.Previous != (lease.Previous{TabID: "tab-a", Epoch: a.Epoch}) {
		t.Errorf("Revoke Previous = %+v, want tab-a at %d", r.Previous, a.Epoch)
	}
	if !r.BlockedUntil.IsZero() {
		t.Errorf("Revoke without a block answered BlockedUntil %v, want zero", r.BlockedUntil)
	}

	wantFreeAt := func(what string, l lease.Lease) {
		t.Helper()
		if l.Key != key || l.Held || l.Holder != (lease.Holder{}) || l.Epoch != r.Epoch || l.Remaining() != 0 {
			t.Errorf("%s = %+v, want the lease of %+v free at the revoke's epoch %d", what, l, key, r.Epoch)
		}
	}
	_, err := f.eng.Renew(f.ctx(), lease.RenewRequest{Key: key, TabID: "tab-a", Epoch: a.Epoch, TTL: minute})
	wantFreeAt("LostError.Current of the revoked holder's renew", wantLost(t, "Renew by the revoked holder", err).Current)
	_, err = f.eng.Check(f.ctx(), key, "tab-a", a.Epoch)
	wantFreeAt("LostError.Current of the revoked holder's check", wantLost(t, "Check by the revoked holder", err).Current)
	wantFreeAt("Release by the revoked holder", f.wantReleased(key, "tab-a", a.Epoch, false).Lease)
	// Nobody holds the epoch the revoke minted.
	_, err = f.eng.Renew(f.ctx(), lease.RenewRequest{Key: key, TabID: "tab-a", Epoch: r.Epoch})
	wantLost(t, "Renew at the revoke's epoch", err)
	_, err = f.eng.Check(f.ctx(), key, "tab-a", r.Epoch)
	wantLost(t, "Check at the revoke's epoch", err)

	g := f.get(key)
	wantFreeAt("Get after the revoke", g)
	if g.Transitions != 2 {
		t.Errorf("Get after the revoke: Transitions = %d, want 2: a revoke mints an epoch like a grant", g.Transitions)
	}
	if g.ExpiresAt.Before(a.GrantedAt) || g.ExpiresAt.After(g.Now) || !nearTime(g.GrantedAt, g.ExpiresAt) {
		t.Errorf("Get after the revoke: GrantedAt %v, ExpiresAt %v; want both the time of the revoke, between the grant %v and now %v",
			g.GrantedAt, g.ExpiresAt, a.GrantedAt, g.Now)
	}
	// The other sessions, of the same user and of another, keep their leases.
	f.check(other, "tab-a", o.Epoch)
	f.check(bobs, "tab-a", b.Epoch)
}

func testAcquireAfterRevoke(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, adminLimits)
	adm := f.admin()
	key := lease.Key{User: "alice", Session: "doc-1"}
	a := f.acquire(key, "tab-a", minute, lease.ModeTry)
	r1 := f.revoke(adm, revokeReq(key, "first"))

	// The revoked tab itself gets a new grant, not its old epoch back.
	b := f.acquire(key, "tab-a", minute, lease.ModeTry)
	if b.Epoch <= r1.Epoch || b.Transitions != 3 {
		t.Errorf("Acquire by the revoked tab = epoch %d, transitions %d; want above the revoke's %d, 3", b.Epoch, b.Transitions, r1.Epoch)
	}
	_, err := f.eng.Renew(f.ctx(), lease.RenewRequest{Key: key, TabID: "tab-a", Epoch: a.Epoch})
	wantLost(t, "Renew at the epoch before the revoke", err)

	// A lease taken over is revoked from its new holder; a takeover after the revoke is a grant.
	c := f.acquire(key, "tab-b", minute, lease.ModeTakeover)
	r2 := f.revoke(adm, revokeReq(key, "second"))
	if !r2.Revoked || r2.Epoch <= c.Epoch || r2.Previous == nil || *r2.Previous != (lease.Previous{TabID: "tab-b", Epoch: c.Epoch}) {
		t.Errorf("Revoke of a lease taken over = %s, want tab-b at %d revoked with a higher epoch", showResult(r2), c.Epoch)
	}
	d := f.acquire(key, "tab-c", minute, lease.ModeTakeover)
	if d.Epoch <= r2.Epoch || d.Transitions != 6 {
		t.Errorf("takeover after the revoke = epoch %d, transitions %d; want above %d, 6", d.Epoch, d.Transitions, r2.Epoch)
	}
	f.check(key, "tab-c", d.Epoch)
	if g := f.get(key); !g.HeldBy("tab-c", d.Epoch) || g.Transitions != 6 {
		t.Errorf("Get at the end = %+v, want tab-c at %d after 6 transitions", g, d.Epoch)
	}
}

func testRevokeFree(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, adminLimits)
	adm := f.admin()
	never := lease.Key{User: "alice", Session: "never-used"}
	released := lease.Key{User: "alice", Session: "released"}
	expired := lease.Key{User: "alice", Session: "expired"}
	revoked := lease.Key{User: "alice", Session: "revoked"}

	r := f.revoke(adm, revokeReq(never, "nothing to revoke"))
	if r.Revoked || r.Epoch != 0 || r.Previous != nil || !r.BlockedUntil.IsZero() {
		t.Errorf("Revoke of a session that never had a lease = %s, want false at epoch 0", showResult(r))
	}
	if g := f.get(never); g.Held || g.Epoch != 0 || g.Transitions != 0 || !g.GrantedAt.IsZero() {
		t.Errorf("Get after revoking a session that never had a lease = %+v, want it unchanged", g)
	}

	a := f.acquire(released, "tab-a", minute, lease.ModeTry)
	rel := f.wantReleased(released, "tab-a", a.Epoch, true)
	r = f.revoke(adm, revokeReq(released, "nothing to revoke"))
	if r.Revoked || r.Epoch != a.Epoch || r.Previous != nil {
		t.Errorf("Revoke of a released lease = %s, want false at the last epoch %d", showResult(r), a.Epoch)
	}
	if g := f.get(released); g.Held || g.Epoch != a.Epoch || g.Transitions != 1 || !nearTime(g.ExpiresAt, rel.Lease.ExpiresAt) {
		t.Errorf("Get after revoking a released lease = %+v, want it as the release left it %+v", g, rel.Lease)
	}
	// A retried release still answers as the first did: the revoke changed nothing.
	f.wantReleased(released, "tab-a", a.Epoch, true)

	e := f.acquire(expired, "tab-a", f.limits.Min, lease.ModeTry)
	f.waitFree(expired)
	r = f.revoke(adm, revokeReq(expired, "nothing to revoke"))
	if r.Revoked || r.Epoch != e.Epoch || r.Previous != nil {
		t.Errorf("Revoke of an expired lease = %s, want false at the last epoch %d", showResult(r), e.Epoch)
	}
	if g := f.get(expired); g.Held || g.Epoch != e.Epoch || g.Transitions != 1 {
		t.Errorf("Get after revoking an expired lease = %+v, want free at %d", g, e.Epoch)
	}

	h := f.acquire(revoked, "tab-a", minute, lease.ModeTry)
	first := f.revoke(adm, revokeReq(revoked, "first"))
	again := f.revoke(adm, revokeReq(revoked, "again"))
	if again.Revoked || again.Epoch != first.Epoch || again.Previous != nil {
		t.Errorf("a second revoke = %s, want false at the epoch %d of the first", showResult(again), first.Epoch)
	}
	if g := f.get(revoked); g.Held || g.Epoch != first.Epoch || g.Transitions != 2 {
		t.Errorf("Get after two revokes = %+v, want free at %d after 2 transitions", g, first.Epoch)
	}

	// Nothing is blocked, and only the one real revoke is in the audit log.
	for _, key := range []lease.Key{never, released, expired, revoked} {
		f.acquire(key, "tab-b", minute, lease.ModeTry)
	}
	var revokes []lease.AuditRecord
	for _, r := range f.auditPages(adm, lease.AuditQuery{User: "alice"}) {
		if r.Action == lease.AuditRevoke || r.Action == lease.AuditBlock {
			revokes = append(revokes, r)
		}
	}
	wantRecords(t, "the revoke and block records", revokes,
		revokeRec(revoked, first, "root", "first"))
	if first.Previous == nil || *first.Previous != (lease.Previous{TabID: "tab-a", Epoch: h.Epoch}) {
		t.Errorf("the first revoke = %s, want tab-a at %d revoked", showResult(first), h.Epoch)
	}
}

func testRevokeRetried(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, adminLimits)
	adm := f.admin()
	key := lease.Key{User: "alice", Session: "doc-1"}
	f.acquire(key, "tab-a", minute, lease.ModeTry)

	req1 := revokeReq(key, "retried")
	req1.RequestID, req1.AuditRequestID = "req-1", "log-1" // the audit records keep the latter
	r1 := f.revoke(adm, req1)
	if !r1.Revoked {
		t.Fatalf("the first revoke = %s, want Revoked", showResult(r1))
	}
	b := f.acquire(key, "tab-b", minute, lease.ModeTry)
	if again := f.revoke(adm, req1); !retryOf(again, r1) {
		t.Errorf("the retried revoke = %s, want the first answer %s", showResult(again), showResult(r1))
	}
	f.check(key, "tab-b", b.Epoch) // the retry did not revoke the lease granted since

	// Another request id, or another admin with the same one, is a new revoke.
	req2 := req1
	req2.Admin = "other-admin"
	r2 := f.revoke(adm, req2)
	if !r2.Revoked || r2.Previous == nil || *r2.Previous != (lease.Previous{TabID: "tab-b", Epoch: b.Epoch}) {
		t.Errorf("a revoke by another admin with the same request id = %s, want tab-b at %d revoked", showResult(r2), b.Epoch)
	}
	// A retry is answered as the first whatever revokes of the session came in between.
	if again := f.revoke(adm, req1); !retryOf(again, r1) {
		t.Errorf("the retried revoke after another revoke = %s, want the first answer %s", showResult(again), showResult(r1))
	}

	// A retry of a revoke that found the lease free answers false again, whoever holds it now.
	req3 := revokeReq(key, "nothing yet")
	req3.RequestID = "req-3"
	r3 := f.revoke(adm, req3)
	if r3.Revoked || r3.Epoch != r2.Epoch {
		t.Errorf("a revoke of the free lease = %s, want false at %d", showResult(r3), r2.Epoch)
	}
	c := f.acquire(key, "tab-c", minute, lease.ModeTry)
	if again := f.revoke(adm, req3); !retryOf(again, r3) {
		t.Errorf("the retried revoke of a free lease = %s, want the first answer %s", showResult(again), showResult(r3))
	}
	f.check(key, "tab-c", c.Epoch)
	// So does the retry of a revoke of a session that never had a lease.
	never := lease.Key{User: "alice", Session: "never-used"}
	req6 := revokeReq(never, "nothing ever")
	req6.RequestID = "req-6"
	r6 := f.revoke(adm, req6)
	n := f.acquire(never, "tab-n", minute, lease.ModeTry)
	if again := f.revoke(adm, req6); !retryOf(again, r6) || again.Revoked || again.Epoch != 0 {
		t.Errorf("the retried revoke of a session that never had a lease = %s, want the first answer %s", showResult(again), showResult(r6))
	}
	f.check(never, "tab-n", n.Epoch)
	// Without a request id, every revoke is new.
	r5 := f.revoke(adm, revokeReq(key, "plain"))
	if !r5.Revoked || r5.Previous == nil || r5.Previous.TabID != "tab-c" {
		t.Errorf("a revoke without a request id = %s, want tab-c revoked", showResult(r5))
	}
	if again := f.revoke(adm, req3); !retryOf(again, r3) {
		t.Errorf("the retried revoke after a revoke without a request id = %s, want the first answer %s", showResult(again), showResult(r3))
	}

	// A retried block answers the first block's end and records nothing more.
	blocked := lease.Key{User: "alice", Session: "doc-blocked"}
	d := f.acquire(blocked, "tab-d", minute, lease.ModeTry)
	req4 := revokeReq(blocked, "blocked for an hour")
	req4.Block, req4.RequestID, req4.AuditRequestID = time.Hour, "req-4", "log-4"
	r4 := f.revoke(adm, req4)
	if !r4.Revoked || r4.BlockedUntil.IsZero() {
		t.Errorf("a revoke with a block = %s, want Revoked and BlockedUntil", showResult(r4))
	}
	if again := f.revoke(adm, req4); !retryOf(again, r4) {
		t.Errorf("the retried revoke with a block = %s, want the first answer %s", showResult(again), showResult(r4))
	}

	wantRecords(t, "the audit of the session", f.auditPages(adm, lease.AuditQuery{User: "alice", Session: "doc-1"}), reversed([]rec{
		{key: key, action: lease.AuditGrant, epoch: r1.Previous.Epoch, tab: "tab-a"},
		revokeRec(key, r1, "root", "retried").req("log-1"),
		grantRec(key, b, "tab-b"),
		revokeRec(key, r2, "other-admin", "retried").req("log-1"),
		grantRec(key, c, "tab-c"),
		revokeRec(key, r5, "root", "plain"),
	})...)
	recs := f.auditPages(adm, lease.AuditQuery{User: "alice", Session: "doc-blocked"})
	wantRecords(t, "the audit of the blocked session", recs, reversed([]rec{
		grantRec(blocked, d, "tab-d"),
		revokeRec(blocked, r4, "root", "blocked for an hour").req("log-4"),
		blockRec(blocked, r4, "root", "blocked for an hour").req("log-4"),
	})...)
}

func testBlock(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, adminLimits)
	adm := f.admin()
	key := lease.Key{User: "alice", Session: "doc-1"}
	other := lease.Key{User: "alice", Session: "doc-2"}
	a := f.acquire(key, "tab-a", minute, lease.ModeTry)

	const block = time.Second
	req := revokeReq(key, "cool down")
	req.Block = block
	r := f.revoke(adm, req)
	if !r.Revoked || r.BlockedUntil.IsZero() {
		t.Fatalf("Revoke with a block = %s, want Revoked and BlockedUntil", showResult(r))
	}
	g := f.get(key) // its ExpiresAt is the time of the revoke
	if !near(r.BlockedUntil.Sub(g.ExpiresAt), block) {
		t.Errorf("BlockedUntil = %v, want the time of the revoke %v plus the block %v", r.BlockedUntil, g.ExpiresAt, block)
	}
	for _, tab := range []string{"tab-b", "tab-a"} {
		for _, mode := range []lease.Mode{lease.ModeTry, lease.ModeTakeover} {
			f.wantBlocked(key, tab, mode, block, r.BlockedUntil)
		}
	}
	_, err := f.eng.Acquire(f.ctx(), lease.AcquireRequest{Key: key, Holder: lease.Holder{TabID: "tab-h", Hidden: true}, TTL: minute})
	if !errors.Is(err, lease.ErrBlocked) {
		t.Errorf("Acquire by a hidden tab during a block: %v, want lease.ErrBlocked", err)
	}
	if g := f.get(key); g.Held || g.Epoch != r.Epoch || g.Transitions != 2 {
		t.Errorf("Get during the block = %+v, want free at %d after 2 transitions", g, r.Epoch)
	}
	f.wantBlockedUntil(key, "during the block", r.BlockedUntil)
	// The user's other sessions are not blocked.
	if o := f.acquire(other, "tab-b", minute, lease.ModeTry); !o.BlockedUntil.IsZero() {
		t.Errorf("the grant of another session of the user = %+v, want no BlockedUntil", o)
	}
	f.wantBlockedUntil(other, "of another session of the user", time.Time{})

	// A revoke without a block, during the block, answers the block and leaves it as it is.
	if r2 := f.revoke(adm, revokeReq(key, "still blocked?")); r2.Revoked || r2.Epoch != r.Epoch || !nearTime(r2.BlockedUntil, r.BlockedUntil) {
		t.Errorf("a revoke without a block during the block = %s, want false at %d, blocked until %v", showResult(r2), r.Epoch, r.BlockedUntil)
	}

	f.wantBlockedUntil(key, "after a revoke without a block, during the block", r.BlockedUntil)

	l := f.acquireOnceUnblocked(key, "tab-b")
	if l.GrantedAt.Add(slack).Before(r.BlockedUntil) {
		t.Errorf("granted at %v, before the block ended at %v", l.GrantedAt, r.BlockedUntil)
	}
	if !l.BlockedUntil.IsZero() {
		t.Errorf("the grant after the block answered BlockedUntil %v, want zero", l.BlockedUntil)
	}
	f.wantBlockedUntil(key, "after the block", time.Time{})
	if l.Epoch <= r.Epoch || l.Transitions != 3 {
		t.Errorf("the grant after the block = epoch %d, transitions %d; want above %d, 3", l.Epoch, l.Transitions, r.Epoch)
	}
	_, err = f.eng.Renew(f.ctx(), lease.RenewRequest{Key: key, TabID: "tab-a", Epoch: a.Epoch})
	wantLost(t, "Renew by the revoked holder after the block", err)
	if r3 := f.revoke(adm, lease.RevokeRequest{Key: other, Admin: "root", Reason: "no block"}); !r3.BlockedUntil.IsZero() {
		t.Errorf("a revoke without a block of a session never blocked answered BlockedUntil %v, want zero", r3.BlockedUntil)
	}

	// A session that never had a lease can be blocked too.
	never := lease.Key{User: "bob", Session: "never-used"}
	req = revokeReq(never, "not yet")
	req.Block = block
	rn := f.revoke(adm, req)
	if rn.Revoked || rn.Epoch != 0 || rn.BlockedUntil.IsZero() {
		t.Errorf("a block of a session that never had a lease = %s, want false at epoch 0 with BlockedUntil", showResult(rn))
	}
	f.wantBlocked(never, "tab-a", lease.ModeTry, block, rn.BlockedUntil)
	f.wantBlockedUntil(never, "of a session blocked before it had a lease", rn.BlockedUntil)
	if l := f.acquireOnceUnblocked(never, "tab-a"); l.GrantedAt.Add(slack).Before(rn.BlockedUntil) || l.Transitions != 1 || !l.BlockedUntil.IsZero() {
		t.Errorf("the grant after the block = %+v, want the first grant, after %v, with no BlockedUntil", l, rn.BlockedUntil)
	}
	f.wantBlockedUntil(never, "after the block of a session that had no lease", time.Time{})
	wantRecords(t, "the audit of the blocked session that never had a lease", f.auditPages(adm, lease.AuditQuery{User: "bob"}),
		rec{key: never, action: lease.AuditGrant, epoch: f.get(never).Epoch, tab: "tab-a"},
		blockRec(never, rn, "root", "not yet"))
}

func testBlockReplaced(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, adminLimits)
	adm := f.admin()
	key := lease.Key{User: "alice", Session: "doc-1"}
	f.acquire(key, "tab-a", minute, lease.ModeTry)

	hour := revokeReq(key, "an hour")
	hour.Block = time.Hour
	r1 := f.revoke(adm, hour)
	f.wantBlocked(key, "tab-b", lease.ModeTry, time.Hour, r1.BlockedUntil)

	const block = time.Second
	short := revokeReq(key, "a second")
	short.Block = block
	r2 := f.revoke(adm, short)
	if r2.Revoked || r2.Epoch != r1.Epoch || r2.BlockedUntil.IsZero() || !r2.BlockedUntil.Before(r1.BlockedUntil.Add(-time.Minute)) {
		t.Errorf("a shorter block = %s, want false at %d and a block ending long before %v", showResult(r2), r1.Epoch, r1.BlockedUntil)
	}
	f.wantBlocked(key, "tab-b", lease.ModeTry, block, r2.BlockedUntil)
	f.wantBlockedUntil(key, "after a shorter block replaced a longer one", r2.BlockedUntil)
	b := f.acquireOnceUnblocked(key, "tab-b")
	if b.GrantedAt.Add(slack).Before(r2.BlockedUntil) {
		t.Errorf("granted at %v, before the shorter block ended at %v", b.GrantedAt, r2.BlockedUntil)
	}

	// A longer block replaces a shorter one too.
	short.Block = 500 * time.Millisecond
	r3 := f.revoke(adm, short)
	r4 := f.revoke(adm, hour)
	if !r3.Revoked || r4.Revoked || !r4.BlockedUntil.After(r3.BlockedUntil.Add(time.Minute)) {
		t.Errorf("a short block %s then a long one %s: want the holder revoked, then the block lengthened", showResult(r3), showResult(r4))
	}
	f.wantBlocked(key, "tab-c", lease.ModeTakeover, time.Hour, r4.BlockedUntil)

	recs := f.auditPages(adm, lease.AuditQuery{User: "alice", Session: "doc-1", Limit: 4})
	wantRecords(t, "the newest records", recs[:min(4, len(recs))],
		blockRec(key, r4, "root", "an hour"),
		blockRec(key, r3, "root", "a second"),
		revokeRec(key, r3, "root", "a second"),
		grantRec(key, b, "tab-b"))
}

func testRevokeEvents(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, adminLimits)
	adm := f.admin()
	feed := f.feed()
	key := lease.Key{User: "alice", Session: "doc-1"}
	w := f.watch(feed, key, "")

	const ttl = 300 * time.Millisecond
	a := f.acquire(key, "tab-a", ttl, lease.ModeTry)
	const reason = "support: the tab is stuck"
	r := f.revoke(adm, revokeReq(key, reason))
	evs := w.nextN(2)
	revokedWant := want{typ: lease.EventRevoked, epoch: r.Epoch, prev: &lease.Previous{TabID: "tab-a", Epoch: a.Epoch}, reason: reason}
	wantEvents(t, "the events of a grant and its revoke", evs, granted(a.Epoch, holder("tab-a")), revokedWant)
	if g := f.get(key); !nearTime(evs[1].At, g.ExpiresAt) {
		t.Errorf("revoked At = %v, want the time of the revoke %v", evs[1].At, g.ExpiresAt)
	}

	// The revoked lease would have expired by now: nothing is announced of it.
	if ev, ok := w.nextWithin(ttl + expiryBound + eventSlack); ok {
		t.Errorf("after the revoke came %s, want nothing", show(ev))
	}
	// Neither a revoke of the free lease, nor its retry, nor a block, is an event.
	f.revoke(adm, revokeReq(key, "free"))
	req := revokeReq(key, "free, with an id")
	req.RequestID = "req-1"
	f.revoke(adm, req)
	f.revoke(adm, req)
	req = revokeReq(key, "a short block")
	req.Block = 50 * time.Millisecond
	f.revoke(adm, req)
	b := f.acquireOnceUnblocked(key, "tab-b")
	wantEvents(t, "the next event", []lease.Event{w.next()}, granted(b.Epoch, holder("tab-b")))

	// A watch resumed after the grant replays the revoke with its reason.
	x := f.watch(feed, key, evs[0].ID)
	if !x.w.Resumed {
		t.Fatalf("a watch after the first event was not resumed")
	}
	wantEvents(t, "the events replayed", x.w.Replay, revokedWant, granted(b.Epoch, holder("tab-b")))

	// Nobody watches a second session when its revoked lease would have expired, and calls that
	// find it then announce nothing either.
	quiet := lease.Key{User: "alice", Session: "doc-quiet"}
	// Long enough that the revoke below surely finds it held on a loaded machine, short enough
	// to wait out.
	q := f.acquire(quiet, "tab-a", time.Second, lease.ModeTry)
	pw := f.watch(feed, quiet, "")
	pos := pw.w.Position
	pw.w.Close()
	rq := f.revoke(adm, revokeReq(quiet, reason))
	f.waitStore(key, q.ExpiresAt.Add(slack))
	f.get(quiet)
	_, err := f.eng.Renew(f.ctx(), lease.RenewRequest{Key: quiet, TabID: "tab-a", Epoch: q.Epoch})
	wantLost(t, "Renew of the revoked lease after its expiry", err)
	f.wantReleased(quiet, "tab-a", q.Epoch, false)
	y := f.watch(feed, quiet, pos)
	if !y.w.Resumed {
		t.Fatalf("a watch of the quiet session after its grant was not resumed")
	}
	wantEvents(t, "the events of the quiet session after its grant", y.w.Replay,
		want{typ: lease.EventRevoked, epoch: rq.Epoch, prev: &lease.Previous{TabID: "tab-a", Epoch: q.Epoch}, reason: reason})

	// Nor is an expiry recorded in the audit log.
	for _, rc := range f.auditPages(adm, lease.AuditQuery{User: "alice"}) {
		if rc.Action == lease.AuditExpire {
			t.Errorf("the audit log records an expiry of a revoked lease: %s", showRecord(rc))
		}
	}
}

func testAudit(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, adminLimits)
	adm := f.admin()
	key := lease.Key{User: "alice", Session: "doc-1"}
	var wanted []rec // oldest first

	a := f.acquire(key, "tab-a", minute, lease.ModeTry)
	wanted = append(wanted, grantRec(key, a, "tab-a"))
	// Calls that change no holder record nothing.
	f.acquireReq(lease.AcquireRequest{Key: key, Holder: lease.Holder{TabID: "tab-a", Label: "renamed", Hidden: true}, TTL: minute})
	f.acquire(key, "tab-a", minute, lease.ModeTakeover)
	f.renew(key, "tab-a", a.Epoch, minute, false)
	_, err := f.eng.Acquire(f.ctx(), lease.AcquireRequest{Key: key, Holder: holder("tab-x"), TTL: minute})
	wantHeld(t, "Acquire by another tab", err)
	_, err = f.eng.Renew(f.ctx(), lease.RenewRequest{Key: key, TabID: "tab-x", Epoch: a.Epoch})
	wantLost(t, "Renew by another tab", err)
	f.wantReleased(key, "tab-x", a.Epoch, false)
	f.check(key, "tab-a", a.Epoch)
	f.get(key)

	b := f.acquire(key, "tab-b", minute, lease.ModeTakeover)
	wanted = append(wanted, takeoverRec(key, b, "tab-b", "tab-a", a.Epoch))
	f.wantReleased(key, "tab-a", a.Epoch, false) // stale: nothing
	rel := f.wantReleased(key, "tab-b", b.Epoch, true)
	f.wantReleased(key, "tab-b", b.Epoch, true) // retried: nothing
	release := releaseRec(key, "tab-b", b.Epoch)
	release.at = rel.Lease.ExpiresAt
	wanted = append(wanted, release)

	c := f.acquire(key, "tab-c", f.limits.Min, lease.ModeTry)
	wanted = append(wanted, grantRec(key, c, "tab-c"))
	// The expiry is recorded at the lease's ExpiresAt, whenever it is announced (here by a Get
	// well after it).
	f.waitStore(lease.Key{User: "alice", Session: "clock"}, c.ExpiresAt.Add(50*time.Millisecond))
	f.waitFree(key)
	wanted = append(wanted, expireRec(key, c))

	d := f.acquire(key, "tab-d", minute, lease.ModeTry)
	wanted = append(wanted, grantRec(key, d, "tab-d"))
	req := lease.RevokeRequest{Key: key, Admin: "ops@example.com", Reason: "Compromised tab — revoked 🚫", Block: 50 * time.Millisecond}
	r := f.revoke(adm, req)
	at := f.get(key).ExpiresAt // the time of the revoke
	revoke, block := revokeRec(key, r, req.Admin, req.Reason), blockRec(key, r, req.Admin, req.Reason)
	revoke.at, block.at = at, at
	wanted = append(wanted, revoke, block)
	if !near(r.BlockedUntil.Sub(at), req.Block) {
		t.Errorf("the block ends at %v, want the revoke's time %v plus %v", r.BlockedUntil, at, req.Block)
	}
	e := f.acquireOnceUnblocked(key, "tab-e")
	wanted = append(wanted, grantRec(key, e, "tab-e"))

	// Another session and another user, recorded apart.
	otherKey := lease.Key{User: "alice", Session: "doc-2"}
	o := f.acquire(otherKey, "tab-a", minute, lease.ModeTry)
	bobKey := lease.Key{User: "bob", Session: "doc-1"}
	bb := f.acquire(bobKey, "tab-a", minute, lease.ModeTry)

	got := f.auditPages(adm, lease.AuditQuery{User: "alice", Session: "doc-1"})
	wantRecords(t, "the audit of alice's doc-1", got, reversed(wanted)...)
	wantRecords(t, "the audit of alice", f.auditPages(adm, lease.AuditQuery{User: "alice"}),
		append([]rec{grantRec(otherKey, o, "tab-a")}, reversed(wanted)...)...)
	wantRecords(t, "the audit of bob", f.auditPages(adm, lease.AuditQuery{User: "bob"}), grantRec(bobKey, bb, "tab-a"))
	for i := 1; i < len(got); i++ {
		// The At of an expiry is the lease's ExpiresAt, from before it was announced.
		if got[i].Action != lease.AuditExpire && got[i-1].Action != lease.AuditExpire && got[i-1].At.Add(slack).Before(got[i].At) {
			t.Errorf("record %s comes after %s, which is older", showRecord(got[i]), showRecord(got[i-1]))
		}
	}
	// The records answered are the caller's: changing them changes nothing stored.
	for i := range got {
		if got[i].Previous != nil {
			got[i].Previous.TabID = "scribbled"
		}
	}
	wantRecords(t, "the audit of alice's doc-1, read again", f.auditPages(adm, lease.AuditQuery{User: "alice", Session: "doc-1"}), reversed(wanted)...)
}

func testAuditPages(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, adminLimits)
	adm := f.admin()
	// Users whose names a prefix match would confuse.
	keys := []lease.Key{
		{User: "alice", Session: "doc-1"},
		{User: "alice", Session: "doc-2"},
		{User: "alice", Session: "doc-10"},
		{User: "alice-b", Session: "doc-1"},
		{User: "bob", Session: "doc-1"},
		{User: "a", Session: "lice"},
	}
	holders := map[lease.Key]lease.Lease{}
	var wanted []rec // oldest first, across users
	for round := range 5 {
		for i, key := range keys {
			tab := fmt.Sprintf("tab-%d", round)
			switch h, held := holders[key]; {
			case (round+i)%4 == 3 && held:
				f.wantReleased(key, h.Holder.TabID, h.Epoch, true)
				wanted = append(wanted, releaseRec(key, h.Holder.TabID, h.Epoch))
				delete(holders, key)
			case held:
				l := f.acquire(key, tab, minute, lease.ModeTakeover)
				wanted = append(wanted, takeoverRec(key, l, tab, h.Holder.TabID, h.Epoch))
				holders[key] = l
			default:
				l := f.acquire(key, tab, minute, lease.ModeTry)
				wanted = append(wanted, grantRec(key, l, tab))
				holders[key] = l
			}
		}
		for _, key := range keys[round%2:] { // a revoke of the first lease held
			if _, held := holders[key]; held {
				r := f.revoke(adm, revokeReq(key, fmt.Sprintf("round %d", round)))
				wanted = append(wanted, revokeRec(key, r, "root", fmt.Sprintf("round %d", round)))
				delete(holders, key)
				break
			}
		}
	}
	filter := func(pred func(lease.Key) bool) []rec {
		var out []rec
		for _, w := range wanted {
			if pred(w.key) {
				out = append(out, w)
			}
		}
		return reversed(out)
	}

	queries := []struct {
		q    lease.AuditQuery
		want []rec // nil: every record, checked by user below
	}{
		{lease.AuditQuery{User: "alice"}, filter(func(k lease.Key) bool { return k.User == "alice" })},
		{lease.AuditQuery{User: "alice", Session: "doc-1"}, filter(func(k lease.Key) bool { return k == keys[0] })},
		{lease.AuditQuery{User: "alice", Session: "doc-10"}, filter(func(k lease.Key) bool { return k == keys[2] })},
		{lease.AuditQuery{User: "alice-b"}, filter(func(k lease.Key) bool { return k.User == "alice-b" })},
		{lease.AuditQuery{User: "a"}, filter(func(k lease.Key) bool { return k.User == "a" })},
		{lease.AuditQuery{User: "bob", Session: "doc-1"}, filter(func(k lease.Key) bool { return k == keys[4] })},
		{lease.AuditQuery{User: "carol"}, nil},
		{lease.AuditQuery{User: "alice", Session: "doc-3"}, nil},
		{lease.AuditQuery{}, nil},
	}
	var everything []lease.AuditRecord
	for _, tc := range queries {
		whole := f.auditPages(adm, lease.AuditQuery{User: tc.q.User, Session: tc.q.Session, Limit: lease.MaxPageLimit})
		what := fmt.Sprintf("Audit(user %q, session %q)", tc.q.User, tc.q.Session)
		switch {
		case tc.q.User == "":
			everything = whole
		case tc.want == nil:
			if len(whole) != 0 {
				t.Errorf("%s answered %d records, want none", what, len(whole))
			}
		default:
			wantRecords(t, what, whole, tc.want...)
		}
		for _, limit := range []int{0, 1, 2, 3, 7} {
			q := tc.q
			q.Limit = limit
			paged := f.auditPages(adm, q)
			if !slices.EqualFunc(paged, whole, func(a, b lease.AuditRecord) bool { return a.ID == b.ID }) {
				t.Errorf("%s a page of %d at a time answered %d records, want the %d of one page in the same order", what, limit, len(paged), len(whole))
			}
		}
	}

	// Across users: each user's records in order, every record once, newest first to the ms.
	if len(everything) != len(wanted) {
		t.Errorf("Audit of every user answered %d records, want %d", len(everything), len(wanted))
	}
	for _, user := range []string{"alice", "alice-b", "bob", "a"} {
		var mine []lease.AuditRecord
		for _, r := range everything {
			if r.Key.User == user {
				mine = append(mine, r)
			}
		}
		wantRecords(t, "the records of "+user+" in the audit of every user", mine, filter(func(k lease.Key) bool { return k.User == user })...)
	}
	for i := 1; i < len(everything); i++ {
		if everything[i-1].At.Add(slack).Before(everything[i].At) {
			t.Errorf("Audit of every user: %s comes after %s, which is older", showRecord(everything[i]), showRecord(everything[i-1]))
		}
	}

	// Records appended between pages never show up on later pages.
	for _, q := range []lease.AuditQuery{{User: "alice", Limit: 3}, {Limit: 3}} {
		whole := f.auditPages(adm, lease.AuditQuery{User: q.User, Limit: lease.MaxPageLimit})
		p, err := adm.Audit(f.ctx(), q)
		if err != nil || p.Next == "" {
			t.Fatalf("Audit(%+v) = %d records, next %q, %v; want a first page", q, len(p.Records), p.Next, err)
		}
		for i, key := range keys {
			f.acquire(key, fmt.Sprintf("tab-between-%d", i), minute, lease.ModeTakeover)
		}
		q.Cursor = p.Next
		rest := f.auditPages(adm, q)
		got := append(slices.Clone(p.Records), rest...)
		if !slices.EqualFunc(got, whole, func(a, b lease.AuditRecord) bool { return a.ID == b.ID }) {
			t.Errorf("Audit(%+v) with changes between its pages answered %d records, want the %d there were at its first page", q, len(got), len(whole))
		}
	}
}

// testAuditRace races tabs and an admin on one session, then reads the session's audit log and
// checks that it is exactly the story of what the calls answered: every grant and revoke once, in
// order of epochs, each record consistent with the state the records before it describe, and the
// end state that of Get.
func testAuditRace(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	adm := f.admin()
	key := lease.Key{User: "alice", Session: "doc-1"}

	const workers, ops, revokes = 6, 30, 12
	var (
		mu       sync.Mutex
		grants   = map[int64]string{} // epoch → tab, from the answers; guarded by mu
		revoked  = map[int64]string{} // epoch minted → tab revoked, from the answers; guarded by mu
		releases int                  // releases answered true; guarded by mu
	)
	ttls := []time.Duration{f.limits.Min, 50 * time.Millisecond, 200 * time.Millisecond}
	var wg sync.WaitGroup
	for i := range workers {
		tab := fmt.Sprintf("tab-%d", i+1)
		rng := rand.New(rand.NewPCG(uint64(i), 11))
		wg.Go(func() {
			var mine int64
			for range ops {
				ttl := ttls[rng.IntN(len(ttls))]
				switch p := rng.IntN(100); {
				case p < 50:
					mode := lease.ModeTry
					if p < 15 {
						mode = lease.ModeTakeover
					}
					l, err := f.eng.Acquire(f.ctx(), lease.AcquireRequest{Key: key, Holder: holder(tab), TTL: ttl, Mode: mode})
					switch {
					case err == nil:
						mu.Lock()
						grants[l.Epoch] = tab
						mu.Unlock()
						mine = l.Epoch
					case !errors.Is(err, lease.ErrHeld):
						t.Errorf("%s: Acquire: %v", tab, err)
					}
				case p < 70 && mine != 0:
					_, err := f.eng.Renew(f.ctx(), lease.RenewRequest{Key: key, TabID: tab, Epoch: mine, TTL: ttl})
					if errors.Is(err, lease.ErrLost) {
						mine = 0
					} else if err != nil {
						t.Errorf("%s: Renew: %v", tab, err)
					}
				case p < 90 && mine != 0:
					r, err := f.eng.Release(f.ctx(), lease.ReleaseRequest{Key: key, TabID: tab, Epoch: mine})
					if err != nil {
						t.Errorf("%s: Release: %v", tab, err)
					} else if r.Released {
						mu.Lock()
						releases++
						mu.Unlock()
					}
					mine = 0
				default:
					time.Sleep(time.Duration(1+rng.IntN(10)) * time.Millisecond) // a stalling tab, not a synchronisation
				}
			}
		})
	}
	wg.Go(func() {
		rng := rand.New(rand.NewPCG(99, 11))
		for i := range revokes {
			time.Sleep(time.Duration(rng.IntN(15)) * time.Millisecond) // spread the revokes over the race
			r, err := adm.Revoke(f.ctx(), lease.RevokeRequest{Key: key, Admin: "root", Reason: fmt.Sprintf("revoke %d", i)})
			if err != nil {
				t.Errorf("Revoke: %v", err)
				continue
			}
			if r.Revoked {
				mu.Lock()
				revoked[r.Epoch] = r.Previous.TabID
				mu.Unlock()
			}
		}
	})
	wg.Wait()
	if t.Failed() {
		return
	}
	end := f.get(key) // announces a last expiry, if any, before the log is read
	recs := f.auditPages(adm, lease.AuditQuery{User: "alice", Session: "doc-1", Limit: 7})
	slices.Reverse(recs)

	type state struct {
		tab   string
		epoch int64
	}
	var cur state
	var last int64
	seenGrants, seenRevokes := map[int64]bool{}, map[int64]bool{}
	nReleased := 0
	for _, r := range recs {
		bad := func(why string) { t.Errorf("%s: %s (state before: %+v)", showRecord(r), why, cur) }
		prevIsCur := cur.tab != "" && r.Previous != nil && *r.Previous == lease.Previous{TabID: cur.tab, Epoch: cur.epoch}
		switch r.Action {
		case lease.AuditGrant, lease.AuditTakeover:
			if grants[r.Epoch] != r.TabID || seenGrants[r.Epoch] || r.Admin != "" {
				bad("not a grant answered to that tab, or recorded twice")
			}
			if r.Epoch <= last {
				bad("a grant not above the epochs before it")
			}
			if r.Action == lease.AuditGrant && (cur.tab != "" || r.Previous != nil) {
				bad("a grant while the records say the lease is held: an end was not recorded")
			}
			if r.Action == lease.AuditTakeover && (!prevIsCur || r.TabID == cur.tab) {
				bad("taken over from someone else than the holder")
			}
			seenGrants[r.Epoch] = true
			cur, last = state{r.TabID, r.Epoch}, r.Epoch
		case lease.AuditRelease:
			if !prevIsCur || r.TabID != cur.tab || r.Epoch != cur.epoch {
				bad("released a lease that is not the current one, or by another tab")
			}
			nReleased++
			cur = state{}
		case lease.AuditExpire:
			if !prevIsCur || r.Epoch != cur.epoch || r.TabID != "" || r.Admin != "" {
				bad("an expiry of a lease that is not the current one, or with an actor")
			}
			cur = state{}
		case lease.AuditRevoke:
			if !prevIsCur || r.Epoch <= last || revoked[r.Epoch] != cur.tab || seenRevokes[r.Epoch] || r.Admin != "root" {
				bad("a revoke that is not one answered for the current holder, or recorded twice")
			}
			seenRevokes[r.Epoch] = true
			cur, last = state{}, r.Epoch
		default:
			bad("a record the race cannot cause")
		}
	}
	for epoch, tab := range grants {
		if !seenGrants[epoch] {
			t.Errorf("the grant of epoch %d to %s has no record", epoch, tab)
		}
	}
	for epoch, tab := range revoked {
		if !seenRevokes[epoch] {
			t.Errorf("the revoke of %s minting epoch %d has no record", tab, epoch)
		}
	}
	if nReleased != releases {
		t.Errorf("%d release records, but %d releases answered released", nReleased, releases)
	}
	if end.Held != (cur.tab != "") || (end.Held && (end.Holder.TabID != cur.tab || end.Epoch != cur.epoch)) {
		t.Errorf("the records end with %+v, but Get says %+v", cur, end)
	}
	if !end.Held && end.Epoch != last {
		t.Errorf("the records end with the epoch %d, but Get says the last epoch is %d", last, end.Epoch)
	}
	t.Logf("%d records: %d grants, %d revokes, %d releases", len(recs), len(grants), len(revoked), releases)
}

func testList(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, adminLimits)
	adm := f.admin()
	// Ordered by user, then session, byte by byte: "a"/"z" before "a-b"/"c" although "a-b/c" < "a/z".
	held := []lease.Key{
		{User: "a", Session: "z"},
		{User: "a-b", Session: "c"},
		{User: "alice", Session: "doc-1"},
		{User: "alice", Session: "doc-10"},
		{User: "alice", Session: "doc-2"},
		{User: "alice:x", Session: "doc-1"},
		{User: "bob", Session: "doc-1"},
	}
	expired := lease.Key{User: "alice", Session: "doc-expired"}
	e := f.acquire(expired, "tab-a", f.limits.Min, lease.ModeTry)
	// Free sessions of every kind.
	released := lease.Key{User: "alice", Session: "doc-released"}
	r := f.acquire(released, "tab-a", minute, lease.ModeTry)
	f.wantReleased(released, "tab-a", r.Epoch, true)
	revoked := lease.Key{User: "carol", Session: "doc-1"}
	f.acquire(revoked, "tab-a", minute, lease.ModeTry)
	f.revoke(adm, revokeReq(revoked, "listed no more"))
	blocked := lease.Key{User: "dave", Session: "doc-1"}
	req := revokeReq(blocked, "blocked, never held")
	req.Block = time.Hour
	f.revoke(adm, req)
	f.watch(f.feed(), lease.Key{User: "erin", Session: "watched"}, "")
	f.get(lease.Key{User: "frank", Session: "read"})
	// Wait for the short lease to expire at the store's clock, but not through a call on it: the
	// list must leave out a lease whose end was never announced.
	f.waitStore(released, e.ExpiresAt.Add(slack))

	grants := map[lease.Key]lease.Lease{}
	for i, key := range slices.Backward(held) { // granted in another order than listed
		grants[key] = f.acquireReq(lease.AcquireRequest{Key: key, Holder: lease.Holder{TabID: fmt.Sprintf("tab-%d", i), Label: "label " + key.Session, Hidden: i%2 == 0}, TTL: minute})
	}

	all := f.listPages(adm, lease.ListQuery{})
	if !slices.Equal(keysOf(all), held) {
		t.Errorf("ListLeases listed %+v, want the held leases %+v", keysOf(all), held)
	}
	for _, l := range all {
		g, ok := grants[l.Key]
		if !ok || !l.HeldBy(g.Holder.TabID, g.Epoch) || l.Holder != g.Holder || !nearTime(l.ExpiresAt, g.ExpiresAt) ||
			!nearTime(l.GrantedAt, g.GrantedAt) || l.Transitions != 1 || l.TTL != minute {
			t.Errorf("ListLeases listed %+v, want the grant %+v", l, g)
		}
	}
	for _, tc := range []struct {
		user string
		want []lease.Key
	}{
		{"alice", held[2:5]},
		{"a", held[:1]},
		{"a-b", held[1:2]},
		{"bob", held[6:]},
		{"carol", nil},
		{"nobody", nil},
	} {
		got := keysOf(f.listPages(adm, lease.ListQuery{User: tc.user}))
		if !slices.Equal(got, tc.want) {
			t.Errorf("ListLeases of %s listed %+v, want %+v", tc.user, got, tc.want)
		}
	}
	for _, limit := range []int{1, 2, 3, len(held), lease.MaxPageLimit} {
		for _, user := range []string{"", "alice"} {
			got := keysOf(f.listPages(adm, lease.ListQuery{User: user, Limit: limit}))
			want := held
			if user != "" {
				want = held[2:5]
			}
			if !slices.Equal(got, want) {
				t.Errorf("ListLeases of %q, %d at a time, listed %+v, want %+v", user, limit, got, want)
			}
		}
	}
	if p := f.listPage(adm, lease.ListQuery{Limit: len(held)}); p.Next != "" {
		t.Errorf("a page holding the last lease answered a next cursor %q, want none", p.Next)
	}
	// The lease that expired unannounced is free, as Get says.
	if g := f.get(expired); g.Held {
		t.Errorf("Get of the expired lease = %+v, want free", g)
	}
}

func testListStable(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, adminLimits)
	adm := f.admin()
	k := func(user, session string) lease.Key { return lease.Key{User: user, Session: session} }
	grants := map[lease.Key]lease.Lease{}
	grant := func(key lease.Key) { grants[key] = f.acquire(key, "tab-"+key.Session, minute, lease.ModeTry) }
	release := func(key lease.Key) {
		f.wantReleased(key, "tab-"+key.Session, grants[key].Epoch, true)
		delete(grants, key)
	}
	for _, key := range []lease.Key{k("alice", "doc-1"), k("alice", "doc-2"), k("alice", "doc-3"), k("bob", "doc-1"), k("bob", "doc-2"), k("bob", "doc-3")} {
		grant(key)
	}

	first := f.listPage(adm, lease.ListQuery{Limit: 2})
	if got := keysOf(first.Leases); !slices.Equal(got, []lease.Key{k("alice", "doc-1"), k("alice", "doc-2")}) || first.Next == "" {
		t.Fatalf("the first page listed %+v, next %q; want alice's doc-1 and doc-2 and a next cursor", got, first.Next)
	}
	// Between the pages: the leases listed end (the last one listed too: the cursor stays
	// valid), one not listed yet ends, and leases start before and after the cursor.
	release(k("alice", "doc-1"))
	release(k("alice", "doc-2"))
	release(k("bob", "doc-2"))
	grant(k("alice", "doc-0"))
	grant(k("alice", "doc-25"))
	grant(k("bob", "doc-4"))
	grant(k("a", "doc-9")) // a user before every user listed

	rest := f.listPages(adm, lease.ListQuery{Cursor: first.Next, Limit: 2})
	want := []lease.Key{k("alice", "doc-25"), k("alice", "doc-3"), k("bob", "doc-1"), k("bob", "doc-3"), k("bob", "doc-4")}
	if got := keysOf(rest); !slices.Equal(got, want) {
		t.Errorf("the pages after the changes listed %+v, want %+v", got, want)
	}
	// The cursor of one user's list, and of every user's, is the same kind of position.
	p := f.listPage(adm, lease.ListQuery{User: "bob", Cursor: first.Next})
	if got := keysOf(p.Leases); !slices.Equal(got, want[2:]) {
		t.Errorf("bob's leases after the first page's cursor = %+v, want %+v", got, want[2:])
	}
}

func testAdminInvalid(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, adminLimits)
	adm := f.admin()
	held := lease.Key{User: "alice", Session: "doc-held"}
	a := f.acquire(held, "tab-a", minute, lease.ModeTry)
	good := func() lease.RevokeRequest {
		return lease.RevokeRequest{Key: held, Admin: "root", Reason: "why", RequestID: "req-1"}
	}
	type call struct {
		name string
		do   func(ctx context.Context) error
	}
	var calls []call
	rev := func(name string, mod func(r *lease.RevokeRequest)) {
		req := good()
		mod(&req)
		calls = append(calls, call{"Revoke with " + name, func(ctx context.Context) error { _, err := adm.Revoke(ctx, req); return err }})
	}
	for _, bad := range []struct{ name, id string }{
		{"empty", ""}, {"a dot", "."}, {"two dots", ".."}, {"a slash", "a/b"}, {"a space", "a b"},
		{"braces", "{a}"}, {"a newline", "a\n"}, {"129 characters", strings.Repeat("a", 129)},
	} {
		rev("a user id with "+bad.name, func(r *lease.RevokeRequest) { r.Key.User = bad.id })
		rev("a session id with "+bad.name, func(r *lease.RevokeRequest) { r.Key.Session = bad.id })
		rev("an admin id with "+bad.name, func(r *lease.RevokeRequest) { r.Admin = bad.id })
		if bad.id != "" {
			rev("a request id with "+bad.name, func(r *lease.RevokeRequest) { r.RequestID = bad.id })
		}
		q := bad.id
		if q != "" { // an empty user or session is no filter
			calls = append(calls,
				call{"ListLeases of a user id with " + bad.name, func(ctx context.Context) error {
					_, err := adm.ListLeases(ctx, lease.ListQuery{User: q})
					return err
				}},
				call{"Audit of a user id with " + bad.name, func(ctx context.Context) error {
					_, err := adm.Audit(ctx, lease.AuditQuery{User: q})
					return err
				}},
				call{"Audit of a session id with " + bad.name, func(ctx context.Context) error {
					_, err := adm.Audit(ctx, lease.AuditQuery{User: "alice", Session: q})
					return err
				}},
			)
		}
	}
	for _, reason := range []struct{ name, reason string }{
		{"an empty reason", ""},
		{"a blank reason", "   "},
		{"a reason of 201 characters", strings.Repeat("é", 201)},
		{"a reason with a newline", "line\nbreak"},
		{"a reason with a NUL", "a\x00b"},
		{"a reason of invalid UTF-8", "a\xffb"},
	} {
		rev(reason.name, func(r *lease.RevokeRequest) { r.Reason = reason.reason })
	}
	for _, block := range []time.Duration{-time.Millisecond, -time.Hour, 1500 * time.Microsecond, time.Nanosecond} {
		rev(fmt.Sprintf("a block of %v", block), func(r *lease.RevokeRequest) { r.Block = block })
	}
	for _, limit := range []int{-1, lease.MaxPageLimit + 1, 1 << 40} {
		calls = append(calls,
			call{fmt.Sprintf("ListLeases with limit %d", limit), func(ctx context.Context) error {
				_, err := adm.ListLeases(ctx, lease.ListQuery{Limit: limit})
				return err
			}},
			call{fmt.Sprintf("Audit with limit %d", limit), func(ctx context.Context) error {
				_, err := adm.Audit(ctx, lease.AuditQuery{Limit: limit})
				return err
			}},
		)
	}
	for _, cursor := range []string{"not a cursor", "\x00", "a\nb"} {
		calls = append(calls,
			call{fmt.Sprintf("ListLeases with cursor %q", cursor), func(ctx context.Context) error {
				_, err := adm.ListLeases(ctx, lease.ListQuery{Cursor: cursor})
				return err
			}},
			call{fmt.Sprintf("Audit with cursor %q", cursor), func(ctx context.Context) error {
				_, err := adm.Audit(ctx, lease.AuditQuery{Cursor: cursor})
				return err
			}},
		)
	}
	calls = append(calls, call{"Audit of a session without a user", func(ctx context.Context) error {
		_, err := adm.Audit(ctx, lease.AuditQuery{Session: "doc-held"})
		return err
	}})
	for _, c := range calls {
		wantInvalid(t, c.name, c.do(f.ctx()))
	}

	// Nothing changed: the lease is held, nothing is blocked, the audit log holds the grant alone,
	// and the request id of the refused revokes was never remembered.
	if g := f.get(held); !g.HeldBy("tab-a", a.Epoch) || g.Transitions != 1 {
		t.Errorf("Get after the invalid calls = %+v, want the grant unchanged %+v", g, a)
	}
	wantRecords(t, "the audit log after the invalid calls", f.auditPages(adm, lease.AuditQuery{}), grantRec(held, a, "tab-a"))
	if r := f.revoke(adm, good()); !r.Revoked {
		t.Errorf("the first valid revoke with the request id of the refused ones = %s, want Revoked", showResult(r))
	}
	f.acquire(held, "tab-b", minute, lease.ModeTry)

	// The widest valid arguments are accepted.
	const chars = "ABCXYZabcxyz0189._:@|-"
	id128 := strings.Repeat(chars, 128/len(chars)+1)[:lease.MaxIDLen]
	wide := lease.RevokeRequest{Key: lease.Key{User: id128, Session: id128}, Admin: id128, Reason: strings.Repeat("é", 200), RequestID: id128}
	if _, err := adm.Revoke(f.ctx(), wide); err != nil {
		t.Errorf("Revoke with the widest valid arguments: %v", err)
	}
	wide.Reason = `a "quoted" reason — with <b>markup</b> & emoji 🚀`
	wide.RequestID = ""
	if _, err := adm.Revoke(f.ctx(), wide); err != nil {
		t.Errorf("Revoke with punctuation and emoji in the reason: %v", err)
	}
	if _, err := adm.ListLeases(f.ctx(), lease.ListQuery{User: id128, Limit: lease.MaxPageLimit}); err != nil {
		t.Errorf("ListLeases with the widest valid arguments: %v", err)
	}
	if _, err := adm.Audit(f.ctx(), lease.AuditQuery{User: id128, Session: id128, Limit: lease.MaxPageLimit}); err != nil {
		t.Errorf("Audit with the widest valid arguments: %v", err)
	}
}

func testAdminOutage(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, adminLimits)
	if f.target.Outage == nil {
		t.Skip("the target's store cannot be unreachable (Outage is nil)")
	}
	adm := f.admin()
	key := lease.Key{User: "alice", Session: "doc-1"}
	a := f.acquire(key, "tab-a", minute, lease.ModeTry)
	req := revokeReq(key, "during an outage")
	req.RequestID = "req-outage"

	restore := f.target.Outage(t)
	var once sync.Once
	restoreOnce := func() { once.Do(restore) }
	t.Cleanup(restoreOnce)
	bound := f.target.OpTimeout + 2*time.Second
	for _, op := range []struct {
		name string
		do   func(ctx context.Context) error
	}{
		{"ListLeases", func(ctx context.Context) error { _, err := adm.ListLeases(ctx, lease.ListQuery{}); return err }},
		{"Audit", func(ctx context.Context) error { _, err := adm.Audit(ctx, lease.AuditQuery{User: "alice"}); return err }},
		{"Revoke", func(ctx context.Context) error { _, err := adm.Revoke(ctx, req); return err }},
	} {
		err, ok := within(bound, op.do)
		var unavailable *lease.UnavailableError
		switch {
		case !ok:
			t.Errorf("%s with the store unreachable did not return within %v", op.name, bound)
		case !errors.Is(err, lease.ErrUnavailable) || !errors.As(err, &unavailable):
			t.Errorf("%s with the store unreachable = %v, want a *lease.UnavailableError", op.name, err)
		}
	}
	restoreOnce()

	// The revoke may or may not have reached the store; its retry is answered once either way.
	deadline := time.Now().Add(f.target.OpTimeout + 30*time.Second)
	var r lease.RevokeResult
	for {
		var err error
		r, err = adm.Revoke(f.ctx(), req)
		if err == nil {
			break
		}
		if !errors.Is(err, lease.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("Revoke retried after the outage: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !r.Revoked || r.Previous == nil || *r.Previous != (lease.Previous{TabID: "tab-a", Epoch: a.Epoch}) {
		t.Errorf("the revoke retried after the outage = %s, want tab-a at %d revoked", showResult(r), a.Epoch)
	}
	if again := f.revoke(adm, req); !sameResult(again, r) {
		t.Errorf("the revoke retried again = %s, want %s", showResult(again), showResult(r))
	}
	wantRecords(t, "the audit log after the outage", f.auditPages(adm, lease.AuditQuery{User: "alice"}),
		revokeRec(key, r, "root", "during an outage"), grantRec(key, a, "tab-a"))
}

func testAdminPeer(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, adminLimits)
	adm := f.admin()
	if f.target.Peer == nil {
		t.Skip("the store cannot be shared by two engines (Peer is nil)")
	}
	peer := f.target.Peer(t)
	if peer == nil {
		t.Fatal("Peer returned no engine")
	}
	f.closeAtCleanup(peer)
	var peerAdm lease.Admin = peer
	key := lease.Key{User: "alice", Session: "doc-1"}
	a := f.acquire(key, "tab-a", minute, lease.ModeTry)
	b, err := peer.Acquire(f.ctx(), lease.AcquireRequest{Key: lease.Key{User: "bob", Session: "doc-1"}, Holder: holder("tab-b"), TTL: minute})
	if err != nil {
		t.Fatalf("Acquire on the peer: %v", err)
	}
	if got := keysOf(f.listPages(adm, lease.ListQuery{})); !slices.Equal(got, []lease.Key{key, b.Key}) {
		t.Errorf("ListLeases lists %+v, want the lease granted here and the one granted on the peer", got)
	}

	req := revokeReq(key, "from the peer")
	req.RequestID, req.Block = "req-peer", time.Hour
	r := f.revoke(peerAdm, req)
	if !r.Revoked || r.BlockedUntil.IsZero() {
		t.Fatalf("Revoke on the peer = %s, want Revoked and blocked", showResult(r))
	}
	_, err = f.eng.Check(f.ctx(), key, "tab-a", a.Epoch)
	wantLost(t, "Check here of the lease revoked on the peer", err)
	f.wantBlocked(key, "tab-b", lease.ModeTakeover, time.Hour, r.BlockedUntil)
	if again := f.revoke(adm, req); !sameResult(again, r) {
		t.Errorf("the revoke retried here = %s, want the peer's answer %s", showResult(again), showResult(r))
	}
	wantRecords(t, "the audit log read here", f.auditPages(adm, lease.AuditQuery{User: "alice"}),
		blockRec(key, r, "root", "from the peer"), revokeRec(key, r, "root", "from the peer"), grantRec(key, a, "tab-a"))
}

func testRecordCatalog(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, adminLimits)
	ctx := f.ctx()
	before := time.Now()
	if err := f.admin().RecordCatalog(ctx, "root", "catalog v2 replaced v1"); err != nil {
		t.Fatalf("RecordCatalog: %v", err)
	}
	// The admin's own leases append records to the same log after it.
	root := lease.Key{User: "root", Session: "doc-1"}
	f.acquire(root, "tab-a", minute, lease.ModeTry)
	for _, q := range []lease.AuditQuery{{User: "root"}, {User: "root", Session: lease.CatalogSession}, {}} {
		p, err := f.admin().Audit(ctx, q)
		if err != nil {
			t.Fatalf("Audit(%+v): %v", q, err)
		}
		var found []lease.AuditRecord
		for _, r := range p.Records {
			if r.Action == lease.AuditCatalog {
				found = append(found, r)
			}
		}
		if len(found) != 1 {
			t.Fatalf("Audit(%+v) = %+v, want the one catalog record", q, p.Records)
		}
		r := found[0]
		if r.Key != (lease.Key{User: "root", Session: lease.CatalogSession}) || r.Admin != "root" || r.Reason != "catalog v2 replaced v1" ||
			r.TabID != "" || r.Previous != nil || r.Epoch != 0 || r.At.Before(before.Add(-time.Hour)) || r.ID == "" {
			t.Errorf("the catalog record = %+v, want root's, with its reason and store time", r)
		}
	}
	for _, bad := range []struct{ admin, reason string }{{"", "r"}, {"has space", "r"}, {"root", ""}, {"root", "  "}, {"root", strings.Repeat("r", lease.MaxLabelLen+1)}} {
		if err := f.admin().RecordCatalog(ctx, bad.admin, bad.reason); !errors.Is(err, lease.ErrInvalid) {
			t.Errorf("RecordCatalog(%q, %.20q) = %v, want ErrInvalid", bad.admin, bad.reason, err)
		}
	}
}
