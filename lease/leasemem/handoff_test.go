package leasemem

import (
	"errors"
	"testing"
	"time"

	"github.com/tablease/tablease/lease"
)

// newHandoffEngine is newEngine with the given handoff timeout and reserve window (zero: the
// defaults).
func newHandoffEngine(t *testing.T, timeout, reserve time.Duration) (*Engine, *fakeClock) {
	t.Helper()
	clock := newFakeClock()
	e, err := New(Options{Limits: testLimits, Now: clock.Now, HandoffTimeout: timeout, HandoffReserve: reserve})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { e.Close() })
	return e, clock
}

// acquireErr is an acquire by tab in mode that must fail; it answers the error.
func acquireErr(t *testing.T, e *Engine, key lease.Key, tab string, mode lease.Mode) error {
	t.Helper()
	l, err := e.Acquire(ctx, lease.AcquireRequest{Key: key, Holder: lease.Holder{TabID: tab}, TTL: time.Minute, Mode: mode})
	if err == nil {
		t.Fatalf("Acquire by %s in mode %q was granted: %+v", tab, mode, l)
	}
	return err
}

// wantPending fails unless err is the *lease.RetryError of ErrHandoffPending with exactly
// retryAfter.
func wantPending(t *testing.T, what string, err error, retryAfter time.Duration) {
	t.Helper()
	var retry *lease.RetryError
	if !errors.Is(err, lease.ErrHandoffPending) || !errors.As(err, &retry) || retry.RetryAfter != retryAfter {
		t.Fatalf("%s: %v, want a *lease.RetryError of ErrHandoffPending with RetryAfter %v", what, err, retryAfter)
	}
}

func TestNewChecksItsHandoffOptions(t *testing.T) {
	for _, tc := range []struct {
		name             string
		timeout, reserve time.Duration
		ok               bool
	}{
		{"zero means the defaults", 0, 0, true},
		{"whole milliseconds are accepted", time.Millisecond, time.Hour, true},
		{"a negative timeout is refused", -time.Second, 0, false},
		{"a timeout below a millisecond is refused", time.Microsecond, 0, false},
		{"a negative reserve window is refused", 0, -time.Second, false},
		{"a reserve window below a millisecond is refused", 0, 999 * time.Microsecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := New(Options{HandoffTimeout: tc.timeout, HandoffReserve: tc.reserve})
			if tc.ok != (err == nil) {
				t.Fatalf("New = %v, want ok %v", err, tc.ok)
			}
			if err != nil {
				var invalid *lease.InvalidError
				if !errors.As(err, &invalid) || (invalid.Field != "HandoffTimeout" && invalid.Field != "HandoffReserve") {
					t.Errorf("New = %v, want a *lease.InvalidError naming the option", err)
				}
				return
			}
			e.Close()
		})
	}
}

func TestHandoffTimesDefaultToTheContract(t *testing.T) {
	e, clock := newHandoffEngine(t, 0, 0)
	a := mustAcquire(t, e, alice, "tab-a", time.Minute, lease.ModeTry)
	wantPending(t, "the request", acquireErr(t, e, alice, "tab-b", lease.ModeHandoff), lease.DefaultHandoffTimeout)
	clock.Advance(time.Second)
	r, err := e.Release(ctx, lease.ReleaseRequest{Key: alice, TabID: "tab-a", Epoch: a.Epoch})
	if err != nil || !r.Released {
		t.Fatalf("Release = %+v, %v", r, err)
	}
	if ho := r.Lease.Handoff; ho == nil || !ho.Reserved || !ho.Until.Equal(r.Lease.Now.Add(lease.DefaultHandoffReserve)) {
		t.Errorf("Handoff after the release = %+v, want reserved for the default %v from %v", ho, lease.DefaultHandoffReserve, r.Lease.Now)
	}
}

func TestAHandoffRequestLapsesExactlyAtItsUntil(t *testing.T) {
	e, clock := newHandoffEngine(t, 15*time.Second, 10*time.Second)
	a := mustAcquire(t, e, alice, "tab-a", time.Minute, lease.ModeTry)
	wantPending(t, "the request", acquireErr(t, e, alice, "tab-b", lease.ModeHandoff), 15*time.Second)
	until := mustGet(t, e, alice).Handoff.Until

	clock.Advance(15*time.Second - time.Microsecond)
	wantPending(t, "a repeat a microsecond before the lapse", acquireErr(t, e, alice, "tab-b", lease.ModeHandoff), time.Microsecond)
	if ho := mustGet(t, e, alice).Handoff; ho == nil || !ho.Until.Equal(until) {
		t.Fatalf("Handoff a microsecond before the lapse = %+v, want the request until %v", ho, until)
	}

	clock.Advance(time.Microsecond)
	if ho := mustGet(t, e, alice).Handoff; ho != nil {
		t.Fatalf("Handoff at the lapse = %+v, want none", ho)
	}
	// The holder's release now reserves nothing, and anyone may take the lease.
	if !mustRelease(t, e, alice, "tab-a", a.Epoch) {
		t.Fatal("the holder's release after the lapse was refused")
	}
	if c := mustAcquire(t, e, alice, "tab-c", time.Minute, lease.ModeTry); c.Handoff != nil {
		t.Errorf("the grant after the lapse answered Handoff %+v", c.Handoff)
	}
}

func TestAReservationEndsExactlyAtItsUntil(t *testing.T) {
	e, clock := newHandoffEngine(t, 15*time.Second, 10*time.Second)
	a := mustAcquire(t, e, alice, "tab-a", time.Minute, lease.ModeTry)
	acquireErr(t, e, alice, "tab-b", lease.ModeHandoff)
	clock.Advance(3 * time.Second)
	mustRelease(t, e, alice, "tab-a", a.Epoch)

	clock.Advance(10*time.Second - time.Microsecond)
	wantPending(t, "another tab a microsecond before the end", acquireErr(t, e, alice, "tab-c", lease.ModeTry), time.Microsecond)
	clock.Advance(time.Microsecond)
	if c := mustAcquire(t, e, alice, "tab-c", time.Minute, lease.ModeTry); c.Epoch <= a.Epoch {
		t.Errorf("the grant at the end of the reservation: epoch %d, want above %d", c.Epoch, a.Epoch)
	}
	// The requester comes too late: the lease is held.
	var held *lease.HeldError
	if err := acquireErr(t, e, alice, "tab-b", lease.ModeTry); !errors.As(err, &held) {
		t.Errorf("the requester after the reservation ended: %v, want a *lease.HeldError", err)
	}
}

func TestAnExpiryReservesFromExpiresAtHoweverLateItIsAnnounced(t *testing.T) {
	for _, tc := range []struct {
		name     string
		announce time.Duration // after the expiry: when the first call sees it
		claimed  bool          // whether the requester's acquire then claims the reservation
	}{
		{"announced at once", 0, true},
		{"announced just before the reservation ends", 10*time.Second - time.Microsecond, true},
		{"announced when the reservation has ended", 10 * time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, clock := newHandoffEngine(t, 15*time.Second, 10*time.Second)
			w := mustWatch(t, e, alice, "")
			a := mustAcquire(t, e, alice, "tab-a", 5*time.Second, lease.ModeTry)
			clock.Advance(time.Second)
			acquireErr(t, e, alice, "tab-b", lease.ModeHandoff) // pending until 16 s, past the expiry at 5 s
			clock.Set(a.ExpiresAt.Add(tc.announce))

			b, err := e.Acquire(ctx, lease.AcquireRequest{Key: alice, Holder: lease.Holder{TabID: "tab-b"}, TTL: time.Minute})
			if err != nil {
				t.Fatalf("the requester's acquire: %v", err)
			}
			evs := []lease.Event{next(t, w), next(t, w), next(t, w), next(t, w)}
			if evs[0].Type != lease.EventGranted || evs[1].Type != lease.EventHandoffRequested {
				t.Fatalf("the first events are %s, %s; want granted, handoff_requested", evs[0].Type, evs[1].Type)
			}
			exp := evs[2]
			if exp.Type != lease.EventExpired || !exp.At.Equal(a.ExpiresAt) || exp.Requester == nil || exp.Requester.TabID != "tab-b" {
				t.Errorf("the expiry event = %+v, want expired at %v with the requester tab-b", exp, a.ExpiresAt)
			}
			grant := evs[3]
			if tc.claimed {
				if grant.Reason != lease.ReasonHandoff || grant.Previous == nil || *grant.Previous != (lease.Previous{TabID: "tab-a", Epoch: a.Epoch}) {
					t.Errorf("the grant event = %+v, want a handoff from tab-a at epoch %d", grant, a.Epoch)
				}
			} else if grant.Reason != "" || grant.Previous != nil {
				t.Errorf("the grant event = %+v, want an ordinary grant", grant)
			}
			if b.Epoch <= a.Epoch {
				t.Errorf("the requester's epoch %d, want above %d", b.Epoch, a.Epoch)
			}
		})
	}
}

func TestARequestThatLapsedBeforeTheExpiryReservesNothing(t *testing.T) {
	e, clock := newHandoffEngine(t, 2*time.Second, 10*time.Second)
	w := mustWatch(t, e, alice, "")
	a := mustAcquire(t, e, alice, "tab-a", 5*time.Second, lease.ModeTry)
	acquireErr(t, e, alice, "tab-b", lease.ModeHandoff) // lapses at 2 s; the lease expires at 5 s
	clock.Set(a.ExpiresAt)
	if g := mustGet(t, e, alice); g.Held || g.Handoff != nil {
		t.Fatalf("Get at the expiry = %+v, want free with no handoff", g)
	}
	next(t, w)
	next(t, w)
	if ev := next(t, w); ev.Type != lease.EventExpired || ev.Requester != nil {
		t.Errorf("the expiry event = %+v, want expired without a requester", ev)
	}
	mustAcquire(t, e, alice, "tab-c", time.Minute, lease.ModeTry)
}

func TestARetriedRevokeLeavesALaterRequestAlone(t *testing.T) {
	e, _ := newHandoffEngine(t, 0, 0)
	mustAcquire(t, e, alice, "tab-a", time.Minute, lease.ModeTry)
	acquireErr(t, e, alice, "tab-b", lease.ModeHandoff)
	req := lease.RevokeRequest{Key: alice, Admin: "root", Reason: "support", RequestID: "req-1"}
	mustRevoke(t, e, req)
	if g := mustGet(t, e, alice); g.Handoff != nil {
		t.Fatalf("Handoff after the revoke = %+v, want none", g.Handoff)
	}
	c := mustAcquire(t, e, alice, "tab-c", time.Minute, lease.ModeTry)
	acquireErr(t, e, alice, "tab-d", lease.ModeHandoff)
	mustRevoke(t, e, req) // the retry answers as the first did and changes nothing
	g := mustGet(t, e, alice)
	if !g.HeldBy("tab-c", c.Epoch) || g.Handoff == nil || g.Handoff.Requester.TabID != "tab-d" {
		t.Errorf("Get after the retried revoke = %+v, want tab-c holding with tab-d's request", g)
	}
}

func TestABlockComesBeforeAHandoff(t *testing.T) {
	e, _ := newHandoffEngine(t, 0, 0)
	a := mustAcquire(t, e, alice, "tab-a", time.Minute, lease.ModeTry)
	acquireErr(t, e, alice, "tab-b", lease.ModeHandoff)
	mustRelease(t, e, alice, "tab-a", a.Epoch)
	mustRevoke(t, e, lease.RevokeRequest{Key: alice, Admin: "root", Reason: "stop", Block: time.Minute})
	for _, tab := range []string{"tab-b", "tab-c"} {
		if err := acquireErr(t, e, alice, tab, lease.ModeHandoff); !errors.Is(err, lease.ErrBlocked) {
			t.Errorf("Acquire by %s in mode handoff of a blocked session: %v, want ErrBlocked", tab, err)
		}
	}
}

func TestPruningKeepsALongReservation(t *testing.T) {
	e, clock := newHandoffEngine(t, 0, 2*lease.DefaultIdleRetention)
	a := mustAcquire(t, e, alice, "tab-a", time.Minute, lease.ModeTry)
	acquireErr(t, e, alice, "tab-b", lease.ModeHandoff)
	mustRelease(t, e, alice, "tab-a", a.Epoch)
	clock.Advance(lease.DefaultIdleRetention + SweepInterval + time.Second)
	mustAcquire(t, e, lease.Key{User: "bob", Session: "other"}, "tab-x", time.Minute, lease.ModeTry) // sweeps
	if g := mustGet(t, e, alice); g.Epoch != a.Epoch || g.Handoff == nil || !g.Handoff.Reserved {
		t.Fatalf("Get after the sweep = %+v, want the reservation kept", g)
	}
	// The reservation ended: the session is kept for the idle retention more, as after a lease's end.
	clock.Advance(lease.DefaultIdleRetention)
	mustAcquire(t, e, lease.Key{User: "bob", Session: "other"}, "tab-x", time.Minute, lease.ModeTry)
	if g := mustGet(t, e, alice); g.Epoch != a.Epoch {
		t.Fatalf("Get just after the reservation ended = %+v, want the session kept", g)
	}
	clock.Advance(lease.DefaultIdleRetention)
	mustAcquire(t, e, lease.Key{User: "bob", Session: "other"}, "tab-x", time.Minute, lease.ModeTry)
	if g := mustGet(t, e, alice); g.Epoch != 0 {
		t.Errorf("Get, the idle retention after the reservation ended, = %+v, want the session pruned", g)
	}
}
