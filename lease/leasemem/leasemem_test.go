package leasemem

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/lease/leasetest"
)

func TestConformance(t *testing.T) {
	leasetest.Run(t, func(t *testing.T, limits lease.Limits) leasetest.Target {
		opts := Options{
			Limits:         limits,
			PresenceTTL:    leasetest.ShortPresenceTTL,
			HandoffTimeout: leasetest.ShortHandoffTimeout,
			HandoffReserve: leasetest.ShortHandoffReserve,
		}
		eng, err := New(opts)
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		return leasetest.Target{
			Engine: eng,
			// Memory loses its data when the process restarts: a new engine on the same clock.
			LoseData: func(t *testing.T) lease.Store {
				fresh, err := New(opts)
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				return fresh
			},
			Limited: func(t *testing.T, perUser int) lease.Store {
				o := opts
				o.SessionsPerUser = perUser
				limited, err := New(o)
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				return limited
			},
			Forgetting: func(t *testing.T, idle time.Duration, perUser int) lease.Store {
				o := opts
				o.IdleRetention, o.SessionsPerUser = idle, perUser
				forgetting, err := New(o)
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				return forgetting
			},
			PresenceTTL:    leasetest.ShortPresenceTTL,
			HandoffTimeout: leasetest.ShortHandoffTimeout,
			HandoffReserve: leasetest.ShortHandoffReserve,
		}
	})
}

// fakeClock is a clock that moves only when told to.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 12, 2, 13, 0, 0, 123456789, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

var testLimits = lease.Limits{Min: time.Second, Default: 10 * time.Second, Max: 120 * time.Second, HiddenMax: 150 * time.Second}

func newEngine(t *testing.T) (*Engine, *fakeClock) {
	t.Helper()
	clock := newFakeClock()
	e, err := New(Options{Limits: testLimits, Now: clock.Now})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { e.Close() })
	return e, clock
}

var (
	alice = lease.Key{User: "alice", Session: "doc-1"}
	ctx   = context.Background()
)

func mustAcquire(t *testing.T, e *Engine, key lease.Key, tab string, ttl time.Duration, mode lease.Mode) lease.Lease {
	t.Helper()
	l, err := e.Acquire(ctx, lease.AcquireRequest{Key: key, Holder: lease.Holder{TabID: tab}, TTL: ttl, Mode: mode})
	if err != nil {
		t.Fatalf("Acquire(%+v, %q): %v", key, tab, err)
	}
	return l
}

func mustGet(t *testing.T, e *Engine, key lease.Key) lease.Lease {
	t.Helper()
	l, err := e.Get(ctx, key)
	if err != nil {
		t.Fatalf("Get(%+v): %v", key, err)
	}
	return l
}

func mustRelease(t *testing.T, e *Engine, key lease.Key, tab string, epoch int64) bool {
	t.Helper()
	r, err := e.Release(ctx, lease.ReleaseRequest{Key: key, TabID: tab, Epoch: epoch})
	if err != nil {
		t.Fatalf("Release: %v", err)
	}
	return r.Released
}

func TestNewChecksItsOptions(t *testing.T) {
	for _, tc := range []struct {
		name   string
		limits lease.Limits
		ok     bool
	}{
		{"zero limits mean the defaults", lease.Limits{}, true},
		{"ordered limits are accepted", testLimits, true},
		{"a zero minimum is refused", lease.Limits{Default: time.Second, Max: time.Second, HiddenMax: time.Second}, false},
		{"a default below the minimum is refused", lease.Limits{Min: 2 * time.Second, Default: time.Second, Max: 3 * time.Second, HiddenMax: 3 * time.Second}, false},
		{"a hidden maximum below the maximum is refused", lease.Limits{Min: time.Second, Default: time.Second, Max: 3 * time.Second, HiddenMax: 2 * time.Second}, false},
		{"a fraction of a millisecond is refused", lease.Limits{Min: time.Second, Default: time.Second + time.Microsecond, Max: 3 * time.Second, HiddenMax: 3 * time.Second}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := New(Options{Limits: tc.limits})
			if tc.ok != (err == nil) {
				t.Fatalf("New = %v, want ok %v", err, tc.ok)
			}
			if err != nil {
				if !errors.Is(err, lease.ErrInvalid) {
					t.Errorf("New = %v, want lease.ErrInvalid", err)
				}
				return
			}
			defer e.Close()
			want := tc.limits
			if want == (lease.Limits{}) {
				want = lease.DefaultLimits
			}
			l, err := e.Acquire(ctx, lease.AcquireRequest{Key: alice, Holder: lease.Holder{TabID: "tab-a"}})
			if err != nil || l.TTL != want.Default {
				t.Errorf("Acquire = %+v, %v; want the default TTL %v", l, err, want.Default)
			}
		})
	}
}

func TestTimesComeFromTheClockInMicroseconds(t *testing.T) {
	e, clock := newEngine(t)
	l := mustAcquire(t, e, alice, "tab-a", 0, lease.ModeTry)
	now := clock.Now().Truncate(time.Microsecond)
	if l.Epoch != now.UnixMicro() {
		t.Errorf("Epoch = %d, want the clock in microseconds %d", l.Epoch, now.UnixMicro())
	}
	if !l.Now.Equal(now) || !l.GrantedAt.Equal(now) || !l.ExpiresAt.Equal(now.Add(testLimits.Default)) {
		t.Errorf("Now, GrantedAt, ExpiresAt = %v, %v, %v; want %v, %v, %v", l.Now, l.GrantedAt, l.ExpiresAt, now, now, now.Add(testLimits.Default))
	}
	if l.Now.Location() != time.UTC {
		t.Errorf("Now is in %v, want UTC", l.Now.Location())
	}

	clock.Advance(3 * time.Second)
	g := mustGet(t, e, alice)
	if !g.Now.Equal(now.Add(3*time.Second)) || g.Remaining() != testLimits.Default-3*time.Second {
		t.Errorf("Get 3s later: Now %v, Remaining %v; want %v, %v", g.Now, g.Remaining(), now.Add(3*time.Second), testLimits.Default-3*time.Second)
	}
	_, err := e.Acquire(ctx, lease.AcquireRequest{Key: alice, Holder: lease.Holder{TabID: "tab-b"}})
	var held *lease.HeldError
	if !errors.As(err, &held) || held.Remaining != 7*time.Second {
		t.Errorf("Acquire by another tab = %v, want a HeldError with 7s remaining", err)
	}
}

func TestTheLeaseEndsExactlyAtExpiresAt(t *testing.T) {
	e, clock := newEngine(t)
	a := mustAcquire(t, e, alice, "tab-a", 5*time.Second, lease.ModeTry)

	clock.Advance(5*time.Second - time.Microsecond)
	if _, err := e.Check(ctx, alice, "tab-a", a.Epoch); err != nil {
		t.Fatalf("Check a microsecond before expiry: %v", err)
	}
	_, err := e.Acquire(ctx, lease.AcquireRequest{Key: alice, Holder: lease.Holder{TabID: "tab-b"}})
	if !errors.Is(err, lease.ErrHeld) {
		t.Fatalf("Acquire by another tab a microsecond before expiry = %v, want ErrHeld", err)
	}

	clock.Advance(time.Microsecond)
	if g := mustGet(t, e, alice); g.Held || g.Remaining() != 0 || g.Epoch != a.Epoch {
		t.Errorf("Get at ExpiresAt = %+v, want free at epoch %d", g, a.Epoch)
	}
	if _, err := e.Renew(ctx, lease.RenewRequest{Key: alice, TabID: "tab-a", Epoch: a.Epoch}); !errors.Is(err, lease.ErrLost) {
		t.Errorf("Renew at ExpiresAt = %v, want ErrLost", err)
	}
	if _, err := e.Check(ctx, alice, "tab-a", a.Epoch); !errors.Is(err, lease.ErrLost) {
		t.Errorf("Check at ExpiresAt = %v, want ErrLost", err)
	}
	b := mustAcquire(t, e, alice, "tab-b", 0, lease.ModeTry)
	if b.Epoch != a.Epoch+5_000_000 {
		t.Errorf("Epoch of the next grant = %d, want the clock %d", b.Epoch, a.Epoch+5_000_000)
	}
}

func TestEpochsRunAheadOfAStoppedClockAndStayAboveIt(t *testing.T) {
	e, clock := newEngine(t)
	first := mustAcquire(t, e, alice, "tab-0", 0, lease.ModeTry)
	for i := 1; i <= 5; i++ {
		l := mustAcquire(t, e, alice, fmt.Sprintf("tab-%d", i), 0, lease.ModeTakeover)
		if l.Epoch != first.Epoch+int64(i) {
			t.Fatalf("takeover %d at the same instant: epoch %d, want %d", i, l.Epoch, first.Epoch+int64(i))
		}
	}
	// A clock that steps back does not lower the epochs of a session the engine remembers.
	clock.Advance(-time.Hour)
	l := mustAcquire(t, e, alice, "tab-x", 0, lease.ModeTakeover)
	if l.Epoch != first.Epoch+6 {
		t.Errorf("takeover after the clock stepped back: epoch %d, want %d", l.Epoch, first.Epoch+6)
	}
}

func TestANewEngineDoesNotReissueEpochsOnceTheClockPassedThem(t *testing.T) {
	clock := newFakeClock()
	opts := Options{Limits: testLimits, Now: clock.Now}
	var last int64
	for i := range 3 {
		e, err := New(opts)
		if err != nil {
			t.Fatal(err)
		}
		l := mustAcquire(t, e, alice, "tab-a", 0, lease.ModeTry)
		if l.Epoch <= last {
			t.Fatalf("engine %d granted epoch %d, not above %d", i, l.Epoch, last)
		}
		last = l.Epoch
		e.Close()
		clock.Advance(time.Microsecond)
	}
}

func TestReleaseAnswersARetryTheSameWay(t *testing.T) {
	e, clock := newEngine(t)
	a := mustAcquire(t, e, alice, "tab-a", 0, lease.ModeTry)
	first := mustRelease(t, e, alice, "tab-a", a.Epoch)
	retry := mustRelease(t, e, alice, "tab-a", a.Epoch)
	if !first || !retry {
		t.Fatal("release and its retry: want both released")
	}
	// Once the lease was granted again, the old release is history, even after that lease expired.
	b := mustAcquire(t, e, alice, "tab-b", time.Second, lease.ModeTry)
	clock.Advance(2 * time.Second)
	if mustGet(t, e, alice).Held {
		t.Fatal("the lease of tab-b did not expire")
	}
	if mustRelease(t, e, alice, "tab-a", a.Epoch) {
		t.Error("a release retried after another grant answered released")
	}
	// A lease that expired was not ended by the release.
	if mustRelease(t, e, alice, "tab-b", b.Epoch) {
		t.Error("a release of an expired lease answered released")
	}
}

func TestIdleSessionsArePruned(t *testing.T) {
	e, clock := newEngine(t)
	released := lease.Key{User: "alice", Session: "released"}
	expired := lease.Key{User: "alice", Session: "expired"}
	kept := lease.Key{User: "alice", Session: "kept"}
	t0 := clock.Now()

	r := mustAcquire(t, e, released, "tab-a", 0, lease.ModeTry)
	mustRelease(t, e, released, "tab-a", r.Epoch)
	x := mustAcquire(t, e, expired, "tab-a", time.Second, lease.ModeTry)
	// kept is held by a hidden tab that renews well before its lease ends.
	k, err := e.Acquire(ctx, lease.AcquireRequest{Key: kept, Holder: lease.Holder{TabID: "tab-k", Hidden: true}, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}

	renewKept := func() {
		t.Helper()
		if _, err := e.Renew(ctx, lease.RenewRequest{Key: kept, TabID: "tab-k", Epoch: k.Epoch, TTL: time.Hour, Hidden: true}); err != nil {
			t.Fatalf("Renew of the kept lease at %v: %v", clock.Now().Sub(t0), err)
		}
	}
	for clock.Now().Sub(t0) < lease.DefaultIdleRetention {
		clock.Advance(time.Minute)
		renewKept()
	}
	if n := e.size(); n != 3 {
		t.Fatalf("%d entries after %v, want 3: nothing has been free for longer than %v yet", n, lease.DefaultIdleRetention, lease.DefaultIdleRetention)
	}

	// Past the idle retention since the release, but the last sweep was under SweepInterval ago.
	clock.Set(t0.Add(lease.DefaultIdleRetention + 500*time.Millisecond))
	renewKept()
	if n := e.size(); n != 3 {
		t.Fatalf("%d entries before the next sweep is due, want 3", n)
	}
	clock.Set(t0.Add(lease.DefaultIdleRetention + SweepInterval + 500*time.Millisecond))
	renewKept()
	if n := e.size(); n != 1 {
		t.Fatalf("%d entries after the sweep, want 1 (the lease still held)", n)
	}
	for _, key := range []lease.Key{released, expired} {
		if g := mustGet(t, e, key); g.Held || g.Epoch != 0 || g.Transitions != 0 {
			t.Errorf("Get of the pruned %+v = %+v, want a session that never had a lease", key, g)
		}
	}
	if g := mustGet(t, e, kept); !g.HeldBy("tab-k", k.Epoch) || g.Transitions != 1 {
		t.Errorf("Get of the kept lease = %+v, want tab-k at %d", g, k.Epoch)
	}

	// Fencing survives the prune: the old epochs stay dead and new ones are higher.
	if _, err := e.Renew(ctx, lease.RenewRequest{Key: expired, TabID: "tab-a", Epoch: x.Epoch}); !errors.Is(err, lease.ErrLost) {
		t.Errorf("Renew of a pruned epoch = %v, want ErrLost", err)
	}
	if mustRelease(t, e, released, "tab-a", r.Epoch) {
		t.Error("a release retried after the prune answered released")
	}
	for _, old := range []lease.Lease{r, x} {
		if l := mustAcquire(t, e, old.Key, "tab-b", 0, lease.ModeTry); l.Epoch <= old.Epoch {
			t.Errorf("grant after the prune of %+v: epoch %d, want above %d", old.Key, l.Epoch, old.Epoch)
		}
	}
}

func TestPruningNeverForgetsAnEpochAheadOfTheClock(t *testing.T) {
	e, clock := newEngine(t)
	t0 := clock.Now()
	clock.Set(t0.Add(time.Hour))
	a := mustAcquire(t, e, alice, "tab-a", 0, lease.ModeTry)

	// The clock steps back an hour: the next grant continues from the last epoch, an hour ahead of
	// the clock, and is released at once.
	clock.Set(t0)
	b := mustAcquire(t, e, alice, "tab-b", 0, lease.ModeTakeover)
	if b.Epoch != a.Epoch+1 {
		t.Fatalf("grant with the clock behind the last epoch: %d, want %d", b.Epoch, a.Epoch+1)
	}
	mustRelease(t, e, alice, "tab-b", b.Epoch)

	// Free for longer than the idle retention, but its epoch is still ahead of the clock: kept.
	other := lease.Key{User: "bob", Session: "other"}
	for range 3 * int(lease.DefaultIdleRetention/SweepInterval) {
		clock.Advance(SweepInterval)
		mustAcquire(t, e, other, "tab-o", 0, lease.ModeTakeover)
	}
	if g := mustGet(t, e, alice); g.Epoch != b.Epoch || g.Transitions != 2 {
		t.Fatalf("Get = %+v, want the entry kept with epoch %d", g, b.Epoch)
	}
	if l := mustAcquire(t, e, alice, "tab-c", 0, lease.ModeTry); l.Epoch != b.Epoch+1 {
		t.Errorf("grant with the clock still behind the last epoch: %d, want %d", l.Epoch, b.Epoch+1)
	}
}

func TestPruningGivesBackTheMap(t *testing.T) {
	e, clock := newEngine(t)
	const n = 3000
	for i := range n {
		key := lease.Key{User: "alice", Session: fmt.Sprintf("doc-%d", i)}
		l := mustAcquire(t, e, key, "tab-a", 0, lease.ModeTry)
		mustRelease(t, e, key, "tab-a", l.Epoch)
	}
	clock.Advance(lease.DefaultIdleRetention + SweepInterval)
	mustAcquire(t, e, alice, "tab-a", 0, lease.ModeTry)
	e.mu.Lock()
	size, peak := len(e.sessions), e.peak
	e.mu.Unlock()
	if size != 1 || peak != 1 {
		t.Errorf("after the sweep: %d entries, peak %d; want 1, 1", size, peak)
	}
}

func TestCallsFailAfterClose(t *testing.T) {
	e, _ := newEngine(t)
	a := mustAcquire(t, e, alice, "tab-a", 0, lease.ModeTry)
	if err := e.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := e.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	for name, call := range map[string]func() error{
		"Acquire": func() error {
			_, err := e.Acquire(ctx, lease.AcquireRequest{Key: alice, Holder: lease.Holder{TabID: "tab-b"}})
			return err
		},
		"Renew": func() error {
			_, err := e.Renew(ctx, lease.RenewRequest{Key: alice, TabID: "tab-a", Epoch: a.Epoch})
			return err
		},
		"Release": func() error {
			_, err := e.Release(ctx, lease.ReleaseRequest{Key: alice, TabID: "tab-a", Epoch: a.Epoch})
			return err
		},
		"Get":   func() error { _, err := e.Get(ctx, alice); return err },
		"Check": func() error { _, err := e.Check(ctx, alice, "tab-a", a.Epoch); return err },
		"Ping":  func() error { return e.Ping(ctx) },
	} {
		err := call()
		var unavailable *lease.UnavailableError
		if !errors.Is(err, lease.ErrUnavailable) || !errors.Is(err, ErrClosed) || !errors.As(err, &unavailable) {
			t.Errorf("%s after Close = %v, want a *lease.UnavailableError wrapping ErrClosed", name, err)
		}
	}
}

func TestACanceledCallChangesNothing(t *testing.T) {
	e, _ := newEngine(t)
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := e.Acquire(canceled, lease.AcquireRequest{Key: alice, Holder: lease.Holder{TabID: "tab-a"}})
	if !errors.Is(err, lease.ErrUnavailable) || !errors.Is(err, context.Canceled) {
		t.Errorf("Acquire with a canceled context = %v, want ErrUnavailable wrapping context.Canceled", err)
	}
	if g := mustGet(t, e, alice); g.Held || g.Epoch != 0 {
		t.Errorf("Get = %+v, want nothing granted", g)
	}
	if err := e.Ping(canceled); !errors.Is(err, lease.ErrUnavailable) {
		t.Errorf("Ping with a canceled context = %v, want ErrUnavailable", err)
	}
	// Invalid arguments are reported as such even then.
	if _, err := e.Get(canceled, lease.Key{}); !errors.Is(err, lease.ErrInvalid) {
		t.Errorf("Get of an invalid key with a canceled context = %v, want ErrInvalid", err)
	}
}

func TestTheClockIsReadOncePerCall(t *testing.T) {
	clock := newFakeClock()
	var reads int
	e, err := New(Options{Limits: testLimits, Now: func() time.Time { reads++; return clock.Now() }})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	a := mustAcquire(t, e, alice, "tab-a", 0, lease.ModeTry)
	e.Renew(ctx, lease.RenewRequest{Key: alice, TabID: "tab-a", Epoch: a.Epoch})
	e.Check(ctx, alice, "tab-a", a.Epoch)
	e.Get(ctx, alice)
	e.Release(ctx, lease.ReleaseRequest{Key: alice, TabID: "tab-a", Epoch: a.Epoch})
	e.Ping(ctx)
	if reads != 6 {
		t.Errorf("the clock was read %d times in 6 calls, want 6", reads)
	}
}
