package leasemem

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tablease/tablease/lease"
)

func newAuditEngine(t *testing.T, retention time.Duration, maxRecords int) (*Engine, *fakeClock) {
	t.Helper()
	clock := newFakeClock()
	e, err := New(Options{Limits: testLimits, Now: clock.Now, AuditRetention: retention, AuditMaxRecords: maxRecords})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { e.Close() })
	return e, clock
}

func mustRevoke(t *testing.T, e *Engine, req lease.RevokeRequest) lease.RevokeResult {
	t.Helper()
	r, err := e.Revoke(ctx, req)
	if err != nil {
		t.Fatalf("Revoke(%+v): %v", req, err)
	}
	return r
}

// mustAudit reads every page of q.
func mustAudit(t *testing.T, e *Engine, q lease.AuditQuery) []lease.AuditRecord {
	t.Helper()
	var all []lease.AuditRecord
	for {
		p, err := e.Audit(ctx, q)
		if err != nil {
			t.Fatalf("Audit(%+v): %v", q, err)
		}
		all = append(all, p.Records...)
		if p.Next == "" {
			return all
		}
		q.Cursor = p.Next
	}
}

// epochsOf answers the actions and epochs of records, for messages and comparisons.
func epochsOf(recs []lease.AuditRecord) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = fmt.Sprintf("%s/%s %s %d", r.Key.User, r.Key.Session, r.Action, r.Epoch)
	}
	return out
}

// users is the number of users with an audit log, for tests.
func (e *Engine) users() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.audit)
}

func TestNewRefusesNegativeAuditOptions(t *testing.T) {
	for _, opts := range []Options{{AuditRetention: -time.Second}, {AuditMaxRecords: -1}} {
		if _, err := New(opts); !errors.Is(err, lease.ErrInvalid) {
			t.Errorf("New(%+v) = %v, want lease.ErrInvalid", opts, err)
		}
	}
}

func TestTheAuditLogKeepsAtMostAuditMaxRecordsPerUser(t *testing.T) {
	e, clock := newAuditEngine(t, 0, 5)
	bob := lease.Key{User: "bob", Session: "doc-1"}
	mustAcquire(t, e, bob, "tab-b", 0, lease.ModeTry)
	var epochs []int64
	for i := range 12 {
		clock.Advance(time.Millisecond)
		epochs = append(epochs, mustAcquire(t, e, alice, fmt.Sprintf("tab-%d", i%2), 0, lease.ModeTakeover).Epoch)
	}
	got := mustAudit(t, e, lease.AuditQuery{User: "alice", Limit: 2})
	if len(got) != 5 {
		t.Fatalf("alice's audit = %v, want her 5 newest records", epochsOf(got))
	}
	for i, r := range got {
		if want := epochs[len(epochs)-1-i]; r.Epoch != want {
			t.Errorf("alice's record %d has epoch %d, want %d: the newest kept, newest first (%v)", i, r.Epoch, want, epochsOf(got))
		}
	}
	// One user's busy sessions never push out another user's records.
	if b := mustAudit(t, e, lease.AuditQuery{User: "bob"}); len(b) != 1 || b[0].Action != lease.AuditGrant {
		t.Errorf("bob's audit = %v, want his grant", epochsOf(b))
	}
	if all := mustAudit(t, e, lease.AuditQuery{Limit: 3}); len(all) != 6 || all[5].Key != bob {
		t.Errorf("the audit of every user = %v, want alice's 5 then bob's older grant", epochsOf(all))
	}
}

func TestAuditRecordsGoAfterTheRetentionAndTheSweepForgetsEmptyLogs(t *testing.T) {
	e, clock := newAuditEngine(t, time.Hour, 0)
	t0 := clock.Now()
	doc2 := lease.Key{User: "alice", Session: "doc-2"}
	a := mustAcquire(t, e, alice, "tab-a", 0, lease.ModeTry) // recorded at t0
	mustRelease(t, e, alice, "tab-a", a.Epoch)
	clock.Set(t0.Add(30 * time.Minute))
	b := mustAcquire(t, e, doc2, "tab-a", 0, lease.ModeTry) // recorded at t0+30m
	mustRelease(t, e, doc2, "tab-a", b.Epoch)

	clock.Set(t0.Add(time.Hour))
	if got := mustAudit(t, e, lease.AuditQuery{User: "alice"}); len(got) != 4 {
		t.Errorf("the audit at the retention = %v, want all 4 records (kept for exactly the retention)", epochsOf(got))
	}
	// Read-only queries answer exactly what is within the retention, whenever the sweep runs.
	clock.Set(t0.Add(time.Hour + time.Microsecond))
	for _, q := range []lease.AuditQuery{{User: "alice"}, {}, {User: "alice", Session: "doc-2"}} {
		if got := mustAudit(t, e, q); len(got) != 2 || got[0].Key != doc2 || got[1].Key != doc2 {
			t.Errorf("Audit(%+v) just past the retention of the first records = %v, want doc-2's two", q, epochsOf(got))
		}
	}
	if got := mustAudit(t, e, lease.AuditQuery{User: "alice", Session: alice.Session}); len(got) != 0 {
		t.Errorf("the audit of doc-1 past its records' retention = %v, want none", epochsOf(got))
	}
	clock.Set(t0.Add(2 * time.Hour))
	if got := mustAudit(t, e, lease.AuditQuery{}); len(got) != 0 {
		t.Errorf("the audit past every record's retention = %v, want none", epochsOf(got))
	}
	if n := e.users(); n != 1 {
		t.Fatalf("%d audit logs before a sweep, want alice's", n)
	}
	// A writing call sweeps, and forgets the log it emptied.
	mustAcquire(t, e, lease.Key{User: "bob", Session: "doc-1"}, "tab-b", 0, lease.ModeTry)
	if n := e.users(); n != 1 {
		t.Errorf("%d audit logs after the sweep, want bob's alone", n)
	}
}

func TestAnExpiryIsRecordedWhenTheSweepDeletesTheSessionUnannounced(t *testing.T) {
	e, clock := newEngine(t)
	a := mustAcquire(t, e, alice, "tab-a", time.Second, lease.ModeTry)
	clock.Advance(lease.DefaultIdleRetention + SweepInterval)
	mustAcquire(t, e, lease.Key{User: "bob", Session: "doc-1"}, "tab-b", 0, lease.ModeTry) // sweeps
	if n := e.size(); n != 1 {
		t.Fatalf("%d entries after the sweep, want bob's alone", n)
	}
	got := mustAudit(t, e, lease.AuditQuery{User: "alice"})
	if len(got) != 2 || got[0].Action != lease.AuditExpire || got[0].Epoch != a.Epoch || !got[0].At.Equal(a.ExpiresAt) {
		t.Errorf("alice's audit = %+v, want the expiry at %v recorded by the sweep, then the grant", got, a.ExpiresAt)
	}
}

// TestTheSweepAnnouncesAnExpiryNobodyElseAnnounces: the next sweep after an expiry nobody watches
// and no call touches records it, long before the session is forgotten.
func TestTheSweepAnnouncesAnExpiryNobodyElseAnnounces(t *testing.T) {
	e, clock := newEngine(t)
	a := mustAcquire(t, e, alice, "tab-a", time.Second, lease.ModeTry) // sweeps, first
	clock.Advance(time.Second + SweepInterval)
	mustAcquire(t, e, lease.Key{User: "bob", Session: "doc-1"}, "tab-b", 0, lease.ModeTry) // sweeps
	got := mustAudit(t, e, lease.AuditQuery{User: "alice"})
	if len(got) != 2 || got[0].Action != lease.AuditExpire || got[0].Epoch != a.Epoch || !got[0].At.Equal(a.ExpiresAt) {
		t.Errorf("alice's audit = %+v, want the expiry at %v recorded by the sweep, then the grant", got, a.ExpiresAt)
	}
	if n := e.size(); n != 2 {
		t.Errorf("%d entries after the sweep, want 2: alice's is kept for the idle retention", n)
	}
}

func TestAPageCursorSurvivesTheRecordsDroppedAfterIt(t *testing.T) {
	e, clock := newAuditEngine(t, 0, 4)
	for i := range 4 {
		clock.Advance(time.Millisecond)
		mustAcquire(t, e, alice, fmt.Sprintf("tab-%d", i), 0, lease.ModeTakeover)
	}
	first, err := e.Audit(ctx, lease.AuditQuery{User: "alice", Limit: 1})
	if err != nil || len(first.Records) != 1 || first.Next == "" {
		t.Fatalf("the first page = %+v, %v; want one record and a next cursor", first, err)
	}
	// Four more changes push out every record there was, the one the cursor names included.
	for i := range 4 {
		clock.Advance(time.Millisecond)
		mustAcquire(t, e, alice, fmt.Sprintf("tab-%d", i), 0, lease.ModeTakeover)
	}
	rest := mustAudit(t, e, lease.AuditQuery{User: "alice", Cursor: first.Next})
	if len(rest) != 0 {
		t.Errorf("the pages after the cursor = %v, want none: what was older than the cursor is gone", epochsOf(rest))
	}
}

func TestAuditIDsFollowTheChangesWhenTheClockStepsBack(t *testing.T) {
	e, clock := newEngine(t)
	t0 := clock.Now()
	bob := lease.Key{User: "bob", Session: "doc-1"}
	a := mustAcquire(t, e, alice, "tab-a", 0, lease.ModeTry)
	clock.Set(t0.Add(-time.Hour))
	b := mustAcquire(t, e, bob, "tab-b", 0, lease.ModeTry)
	mustRelease(t, e, alice, "tab-a", a.Epoch)
	got := mustAudit(t, e, lease.AuditQuery{Limit: 1})
	want := []string{
		fmt.Sprintf("alice/doc-1 release %d", a.Epoch),
		fmt.Sprintf("bob/doc-1 grant %d", b.Epoch),
		fmt.Sprintf("alice/doc-1 grant %d", a.Epoch),
	}
	if fmt.Sprint(epochsOf(got)) != fmt.Sprint(want) {
		t.Errorf("the audit after the clock stepped back = %v, want the reverse order of the changes %v", epochsOf(got), want)
	}
}

func TestRevokeAndBlockTakeTheirTimesFromTheEngineClock(t *testing.T) {
	e, clock := newEngine(t)
	a := mustAcquire(t, e, alice, "tab-a", 0, lease.ModeTry)
	clock.Advance(1500 * time.Millisecond)
	at := clock.Now().Truncate(time.Microsecond)
	r := mustRevoke(t, e, lease.RevokeRequest{Key: alice, Admin: "root", Reason: "why", Block: 3 * time.Second})
	if !r.Revoked || r.Epoch != max(a.Epoch+1, at.UnixMicro()) || !r.BlockedUntil.Equal(at.Add(3*time.Second)) {
		t.Errorf("Revoke at %v = %+v, want the epoch max(last+1, now µs) and a block until now+3s", at, r)
	}
	if g := mustGet(t, e, alice); !g.GrantedAt.Equal(at) || !g.ExpiresAt.Equal(at) || g.Epoch != r.Epoch {
		t.Errorf("Get after the revoke = %+v, want free at %d, granted and ended at %v", g, r.Epoch, at)
	}
	clock.Advance(time.Second)
	_, err := e.Acquire(ctx, lease.AcquireRequest{Key: alice, Holder: lease.Holder{TabID: "tab-b"}})
	var retry *lease.RetryError
	if !errors.As(err, &retry) || !errors.Is(err, lease.ErrBlocked) || retry.RetryAfter != 2*time.Second {
		t.Fatalf("Acquire a second into the block = %v, want ErrBlocked retrying after exactly 2s", err)
	}
	// The block ends at BlockedUntil: a grant at that instant is allowed, as a lease ends at its
	// ExpiresAt.
	clock.Set(r.BlockedUntil.Add(-time.Microsecond))
	if _, err := e.Acquire(ctx, lease.AcquireRequest{Key: alice, Holder: lease.Holder{TabID: "tab-b"}}); !errors.Is(err, lease.ErrBlocked) {
		t.Fatalf("Acquire a microsecond before the block ends = %v, want ErrBlocked", err)
	}
	clock.Set(r.BlockedUntil)
	if l := mustAcquire(t, e, alice, "tab-b", 0, lease.ModeTry); !l.GrantedAt.Equal(r.BlockedUntil) || l.Epoch <= r.Epoch {
		t.Errorf("Acquire as the block ends = %+v, want a grant at %v above epoch %d", l, r.BlockedUntil, r.Epoch)
	}
	recs := mustAudit(t, e, lease.AuditQuery{User: "alice"})
	if len(recs) != 4 || !recs[1].At.Equal(at) || !recs[1].Until.Equal(r.BlockedUntil) || !recs[2].At.Equal(at) {
		t.Errorf("the audit = %+v, want grant, revoke and block at %v (until %v), grant", recs, at, r.BlockedUntil)
	}
}

func TestPruningKeepsBlocksAndTheAuditLog(t *testing.T) {
	e, clock := newEngine(t)
	t0 := clock.Now()
	blocked := lease.Key{User: "alice", Session: "blocked"}
	released := lease.Key{User: "alice", Session: "released"}
	other := lease.Key{User: "bob", Session: "doc-1"}

	b := mustAcquire(t, e, blocked, "tab-a", 0, lease.ModeTry)
	r := mustRevoke(t, e, lease.RevokeRequest{Key: blocked, Admin: "root", Reason: "cool down", Block: 2 * time.Hour})
	l := mustAcquire(t, e, released, "tab-a", 0, lease.ModeTry)
	mustRelease(t, e, released, "tab-a", l.Epoch)
	before := mustAudit(t, e, lease.AuditQuery{User: "alice"})

	// Well past the idle retention and a sweep: the released session is pruned, the blocked one kept.
	for clock.Now().Sub(t0) < lease.DefaultIdleRetention+2*SweepInterval {
		clock.Advance(SweepInterval)
		mustAcquire(t, e, other, "tab-o", 0, lease.ModeTakeover)
	}
	if n := e.size(); n != 2 {
		t.Fatalf("%d entries, want 2: the blocked session and bob's, the released one pruned", n)
	}
	if g := mustGet(t, e, released); g.Epoch != 0 {
		t.Fatalf("Get of the released session = %+v, want it pruned", g)
	}
	if _, err := e.Acquire(ctx, lease.AcquireRequest{Key: blocked, Holder: lease.Holder{TabID: "tab-b"}}); !errors.Is(err, lease.ErrBlocked) {
		t.Errorf("Acquire of the blocked session after the sweep = %v, want ErrBlocked", err)
	}
	if g := mustGet(t, e, blocked); g.Epoch != r.Epoch || g.Transitions != 2 {
		t.Errorf("Get of the blocked session after the sweep = %+v, want free at %d", g, r.Epoch)
	}
	// The audit log outlives the pruned session.
	if after := mustAudit(t, e, lease.AuditQuery{User: "alice"}); fmt.Sprint(epochsOf(after)) != fmt.Sprint(epochsOf(before)) {
		t.Errorf("alice's audit after the prune = %v, want it as before %v", epochsOf(after), epochsOf(before))
	}

	// Once the block has passed, the session is pruned like any other.
	clock.Set(r.BlockedUntil.Add(lease.DefaultIdleRetention))
	for range 3 {
		clock.Advance(SweepInterval)
		mustAcquire(t, e, other, "tab-o", 0, lease.ModeTakeover)
	}
	if n := e.size(); n != 1 {
		t.Errorf("%d entries after the block passed and the session idled, want bob's alone", n)
	}
	if l := mustAcquire(t, e, blocked, "tab-b", 0, lease.ModeTry); l.Epoch <= r.Epoch || l.Epoch <= b.Epoch {
		t.Errorf("a grant after the prune = epoch %d, want above the revoke's %d", l.Epoch, r.Epoch)
	}
}

func TestPruningKeepsARevokeForItsRetries(t *testing.T) {
	e, clock := newEngine(t)
	never := lease.Key{User: "alice", Session: "never-used"}
	other := lease.Key{User: "bob", Session: "doc-1"}
	req := lease.RevokeRequest{Key: never, Admin: "root", Reason: "nothing yet", RequestID: "req-1"}
	r := mustRevoke(t, e, req)
	if r.Revoked || r.Epoch != 0 {
		t.Fatalf("Revoke of a session that never had a lease = %+v, want false at epoch 0", r)
	}
	// Sweeps run within the retry window: the revoke is remembered.
	for range int(lease.RevokeRetryWindow/SweepInterval) - 1 {
		clock.Advance(SweepInterval)
		mustAcquire(t, e, other, "tab-o", 0, lease.ModeTakeover)
	}
	if n := e.size(); n != 2 {
		t.Fatalf("%d entries within the retry window, want 2: the revoke remembered, and bob's", n)
	}
	a := mustAcquire(t, e, never, "tab-a", 0, lease.ModeTry)
	if again := mustRevoke(t, e, req); again.Revoked || again.Epoch != 0 {
		t.Errorf("the retried revoke = %+v, want the first answer (false at 0)", again)
	}
	if _, err := e.Check(ctx, never, "tab-a", a.Epoch); err != nil {
		t.Errorf("Check by the tab granted since: %v; the retry must not revoke it", err)
	}
	mustRelease(t, e, never, "tab-a", a.Epoch)

	// Past the window and the idle retention, the entry goes, and so does the memory of the revoke.
	clock.Advance(lease.RevokeRetryWindow + lease.DefaultIdleRetention + SweepInterval)
	mustAcquire(t, e, other, "tab-o", 0, lease.ModeTakeover)
	if n := e.size(); n != 1 {
		t.Errorf("%d entries past the retry window, want bob's alone", n)
	}
}

func TestAdminCallsFailAfterClose(t *testing.T) {
	e, _ := newEngine(t)
	mustAcquire(t, e, alice, "tab-a", 0, lease.ModeTry)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	_, err1 := e.Revoke(ctx, lease.RevokeRequest{Key: alice, Admin: "root", Reason: "why"})
	_, err2 := e.ListLeases(ctx, lease.ListQuery{})
	_, err3 := e.Audit(ctx, lease.AuditQuery{})
	for i, err := range []error{err1, err2, err3} {
		if !errors.Is(err, lease.ErrUnavailable) || !errors.Is(err, ErrClosed) {
			t.Errorf("admin call %d after Close = %v, want lease.ErrUnavailable wrapping ErrClosed", i+1, err)
		}
	}
}

func TestAUsersOwnActionsNeverPushAnAdminsRecordsOut(t *testing.T) {
	e, clock := newAuditEngine(t, 0, 5)
	ctx := t.Context()
	mustAcquire(t, e, alice, "tab-0", 0, lease.ModeTry)
	if _, err := e.Revoke(ctx, lease.RevokeRequest{Key: alice, Admin: "root", Reason: "why", Block: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	for i := range 12 {
		clock.Advance(2 * time.Millisecond)
		mustAcquire(t, e, alice, fmt.Sprintf("tab-%d", i%2), 0, lease.ModeTakeover)
	}
	got := mustAudit(t, e, lease.AuditQuery{User: "alice"})
	var own, admin []lease.AuditAction
	for _, r := range got {
		if r.Admin != "" {
			admin = append(admin, r.Action)
		} else {
			own = append(own, r.Action)
		}
	}
	if len(own) != 5 || !slices.Equal(admin, []lease.AuditAction{lease.AuditBlock, lease.AuditRevoke}) {
		t.Fatalf("alice's audit after 13 of her own changes and an admin's revoke = %v, want her 5 newest and the admin's block and revoke", got)
	}
	if got[len(got)-1].Action != lease.AuditRevoke {
		t.Errorf("the oldest record kept = %+v, want the revoke: the log stays in the order of the changes", got[len(got)-1])
	}
}

// BenchmarkAcquireReleaseOfAUserAtTheAuditBound is the usual change of a busy user, whose audit log
// is at AuditMaxRecords: each record drops the oldest, which must not cost the log's length.
func BenchmarkAcquireReleaseOfAUserAtTheAuditBound(b *testing.B) {
	e, err := New(Options{Limits: testLimits})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = e.Close() })
	ctx := b.Context()
	cycle := func() {
		l, err := e.Acquire(ctx, lease.AcquireRequest{Key: alice, Holder: lease.Holder{TabID: "tab-a"}, Mode: lease.ModeTry})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := e.Release(ctx, lease.ReleaseRequest{Key: alice, TabID: "tab-a", Epoch: l.Epoch}); err != nil {
			b.Fatal(err)
		}
	}
	for range lease.DefaultAuditMaxRecords / 2 {
		cycle()
	}
	b.ReportAllocs()
	for b.Loop() {
		cycle()
	}
}

// TestPruningKeepsARevokedSessionUntilItsWindowEndsAndABlockedOneTheRetentionAfterItsBlock: a
// revoke with a request id keeps its session until its retry window ends (the revoke is its last
// change too), and a block the idle retention after it ends.
func TestPruningKeepsARevokedSessionUntilItsWindowEndsAndABlockedOneTheRetentionAfterItsBlock(t *testing.T) {
	e, clock := newEngine(t)
	revoked := lease.Key{User: "alice", Session: "revoked"}
	blocked := lease.Key{User: "alice", Session: "blocked"}
	t0 := clock.Now()
	for _, k := range []lease.Key{revoked, blocked} {
		mustAcquire(t, e, k, "tab-a", 0, lease.ModeTry)
	}
	if _, err := e.Revoke(ctx, lease.RevokeRequest{Key: revoked, Admin: "root", Reason: "why", RequestID: "r1"}); err != nil {
		t.Fatal(err)
	}
	const block = 5 * time.Minute
	if _, err := e.Revoke(ctx, lease.RevokeRequest{Key: blocked, Admin: "root", Reason: "why", Block: block}); err != nil {
		t.Fatal(err)
	}
	sweepAt := func(d time.Duration) {
		t.Helper()
		clock.Set(t0.Add(d))
		mustAcquire(t, e, lease.Key{User: "bob", Session: "other"}, "tab-x", time.Minute, lease.ModeTry) // sweeps
	}
	kept := func(k lease.Key, want bool, when string) {
		t.Helper()
		if g := mustGet(t, e, k); (g.Epoch != 0) != want {
			t.Errorf("%s at %s: %+v, want kept %v", k.Session, when, g, want)
		}
	}
	sweepAt(lease.RevokeRetryWindow - time.Minute)
	kept(revoked, true, "its retry window's end, less a minute")
	kept(blocked, true, "its retry window's end, less a minute")
	sweepAt(lease.RevokeRetryWindow + SweepInterval + time.Second)
	kept(revoked, false, "its retry window's end")
	kept(blocked, true, "the revoked one's retry window's end: its block ended less than the retention ago")
	sweepAt(block + lease.DefaultIdleRetention - time.Minute)
	kept(blocked, true, "the block's end plus the retention, less a minute")
	sweepAt(block + lease.DefaultIdleRetention + SweepInterval + time.Second)
	kept(blocked, false, "the block's end plus the retention")
}
