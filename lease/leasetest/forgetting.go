package leasetest

import (
	"errors"
	"testing"
	"time"

	"github.com/tablease/tablease/lease"
)

// testForgetting checks lease.DefaultIdleRetention on an engine that keeps the state of a session
// for idle after the last thing in it ended: its release, its lease's expiry, an admin's block,
// a handoff's reservation. Until then Get shows the session's last epoch and the session counts
// against the user's bound on sessions; then Get answers epoch 0 and no transitions, the session
// no longer counts, and the next grant's epoch is still above every epoch it had. Get's Now, the
// store's clock, says whether an answer came too early, whatever the machine's load.
func testForgetting(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, adminLimits)
	if f.target.Forgetting == nil {
		t.Fatal("the Target has no Forgetting engine")
	}
	const idle = 1500 * time.Millisecond
	const perUser = 4
	eng := f.target.Forgetting(t, idle, perUser)
	f.closeAtCleanup(eng)
	ctx := f.ctx()
	key := func(session string) lease.Key { return lease.Key{User: "alice", Session: session} }
	acquire := func(k lease.Key, tab string, ttl time.Duration, mode lease.Mode) (lease.Lease, error) {
		return eng.Acquire(ctx, lease.AcquireRequest{Key: k, Holder: holder(tab), TTL: ttl, Mode: mode})
	}
	grant := func(k lease.Key, tab string, ttl time.Duration) lease.Lease {
		t.Helper()
		l, err := acquire(k, tab, ttl, lease.ModeTry)
		if err != nil || !l.HeldBy(tab, l.Epoch) {
			t.Fatalf("Acquire of %s by %s = %+v, %v; want it granted", k.Session, tab, l, err)
		}
		return l
	}
	release := func(k lease.Key, tab string, epoch int64) lease.Lease {
		t.Helper()
		r, err := eng.Release(ctx, lease.ReleaseRequest{Key: k, TabID: tab, Epoch: epoch})
		if err != nil || !r.Released {
			t.Fatalf("Release of %s by %s at %d = %+v, %v; want it released", k.Session, tab, epoch, r, err)
		}
		return r.Lease
	}

	// ending is a session and when the last thing in it ended, on the store's clock.
	type ending struct {
		key       lease.Key
		what      string
		epoch     int64 // the session's last epoch
		end       time.Time
		held      bool // the session's lease is held until end
		forgotten bool
	}
	var endings []*ending

	k := key("released")
	l := grant(k, "tab-a", minute)
	endings = append(endings, &ending{k, "released", l.Epoch, release(k, "tab-a", l.Epoch).Now, false, false})

	k = key("expired")
	l = grant(k, "tab-a", 300*time.Millisecond)
	endings = append(endings, &ending{k, "expired", l.Epoch, l.ExpiresAt, true, false})

	k = key("blocked")
	grant(k, "tab-a", minute)
	r, err := eng.Revoke(ctx, lease.RevokeRequest{Key: k, Admin: "admin-1", Reason: "forgetting", Block: time.Second})
	if err != nil || !r.Revoked || r.BlockedUntil.IsZero() {
		t.Fatalf("Revoke with a block = %+v, %v; want the lease revoked and grants blocked", r, err)
	}
	endings = append(endings, &ending{k, "blocked by an admin", r.Epoch, r.BlockedUntil, false, false})

	k = key("reserved")
	l = grant(k, "tab-a", minute)
	if _, err := acquire(k, "tab-b", minute, lease.ModeHandoff); !errors.Is(err, lease.ErrHandoffPending) {
		t.Fatalf("a handoff request: %v, want lease.ErrHandoffPending", err)
	}
	freed := release(k, "tab-a", l.Epoch)
	if freed.Handoff == nil || !freed.Handoff.Reserved {
		t.Fatalf("the release during a handoff request answered %+v, want the lease reserved", freed)
	}
	endings = append(endings, &ending{k, "reserved by a handoff", l.Epoch, freed.Handoff.Until, false, false})

	// The user has state for perUser sessions: one more is refused until one is forgotten.
	extra := key("extra")
	if _, err := acquire(extra, "tab-a", minute, lease.ModeTry); !errors.Is(err, lease.ErrTooManySessions) {
		t.Fatalf("an acquire of a fifth session while four are kept: %v, want lease.ErrTooManySessions", err)
	}

	var last time.Time
	for _, e := range endings {
		if e.end.After(last) {
			last = e.end
		}
	}
	deadline := time.Now().Add(time.Until(last) + idle + waitFor)
	for left := len(endings); left > 0; {
		if time.Now().After(deadline) {
			for _, e := range endings {
				if !e.forgotten {
					t.Errorf("the session %s (end %v) is still kept %v after its end plus the retention", e.what, e.end, time.Since(e.end.Add(idle)).Round(time.Millisecond))
				}
			}
			t.FailNow()
		}
		for _, e := range endings {
			if e.forgotten {
				continue
			}
			g, err := eng.Get(ctx, e.key)
			if err != nil {
				t.Fatalf("Get of the session %s: %v", e.what, err)
			}
			switch {
			case g.Epoch == 0 && g.Transitions == 0 && !g.Held:
				if g.Now.Before(e.end.Add(idle - slack)) {
					t.Errorf("the session %s was forgotten at %v, %v after its end at %v; want the retention, %v, at least", e.what, g.Now, g.Now.Sub(e.end), e.end, idle)
				}
				e.forgotten = true
				left--
			case g.Epoch != e.epoch || g.Held && !(e.held && g.Now.Before(e.end)):
				t.Fatalf("Get of the session %s = %+v; want it at epoch %d (free from %v) until forgotten, then free at epoch 0", e.what, g, e.epoch, e.end)
			}
		}
		time.Sleep(10 * pollEvery)
	}

	// Forgotten sessions no longer count, and their next grants are fenced above their old epochs:
	// extra and perUser-1 of them take the user to the bound again.
	grant(extra, "tab-a", minute)
	for _, e := range endings[:perUser-1] {
		n := grant(e.key, "tab-c", minute)
		if n.Epoch <= e.epoch || n.Transitions != 1 {
			t.Errorf("the first grant of the forgotten session %s: epoch %d, %d transitions; want above %d, 1", e.what, n.Epoch, n.Transitions, e.epoch)
		}
	}
}
