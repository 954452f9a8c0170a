package leasetest

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/tablease/tablease/lease"
)

// limits are the TTL bounds the suite asks factories for unless a test needs others: short, so that
// expiry comes quickly, and far enough apart to tell each bound from the others.
var limits = lease.Limits{
	Min:       20 * time.Millisecond,
	Default:   300 * time.Millisecond,
	Max:       2 * time.Second,
	HiddenMax: 3 * time.Second,
}

const (
	// long is a TTL that outlasts any test that needs a lease to stay held (it is limits.Max).
	long = 2 * time.Second
	// waitFor bounds every poll: expiries the suite waits for are at most a few hundred ms away.
	waitFor = 10 * time.Second
	// pollEvery is the pause between two polls.
	pollEvery = 2 * time.Millisecond
	// slack is the rounding a store may apply to the times it answers (whole milliseconds).
	slack = time.Millisecond
)

// fixture is one subtest's Target. eng is the engine to call; it changes when the store loses
// its data.
type fixture struct {
	t      *testing.T
	target Target
	eng    lease.Store
	limits lease.Limits
}

// start makes the subtest's Target with the given limits and closes its engine at cleanup.
func start(t *testing.T, newTarget Factory, l lease.Limits) *fixture {
	t.Helper()
	target := newTarget(t, l)
	if target.Engine == nil {
		t.Fatal("the factory returned a Target without an Engine")
	}
	f := &fixture{t: t, target: target, eng: target.Engine, limits: l}
	f.closeAtCleanup(target.Engine)
	return f
}

func (f *fixture) closeAtCleanup(eng lease.Engine) {
	f.t.Cleanup(func() {
		if err := eng.Close(); err != nil {
			f.t.Errorf("Close: %v", err)
		}
	})
}

// loseData makes the store lose its data and switches to the engine LoseData returns.
func (f *fixture) loseData() {
	f.t.Helper()
	eng := f.target.LoseData(f.t)
	if eng == nil {
		f.t.Fatal("LoseData returned no engine")
	}
	if !sameEngine(eng, f.eng) {
		f.closeAtCleanup(eng)
	}
	f.eng = eng
}

func sameEngine(a, b lease.Store) bool {
	ta, tb := reflect.TypeOf(a), reflect.TypeOf(b)
	return ta == tb && ta.Comparable() && a == b
}

func (f *fixture) ctx() context.Context { return f.t.Context() }

// holder is the Holder the suite uses for tab: a label that names it, visible.
func holder(tab string) lease.Holder { return lease.Holder{TabID: tab, Label: "label of " + tab} }

func (f *fixture) acquire(key lease.Key, tab string, ttl time.Duration, mode lease.Mode) lease.Lease {
	f.t.Helper()
	return f.acquireReq(lease.AcquireRequest{Key: key, Holder: holder(tab), TTL: ttl, Mode: mode})
}

func (f *fixture) acquireReq(req lease.AcquireRequest) lease.Lease {
	f.t.Helper()
	l, err := f.eng.Acquire(f.ctx(), req)
	if err != nil {
		f.t.Fatalf("Acquire(%+v): %v", req, err)
	}
	if !l.HeldBy(req.Holder.TabID, l.Epoch) {
		f.t.Fatalf("Acquire(%+v) answered a lease not held by the tab: %+v", req, l)
	}
	return l
}

func (f *fixture) renew(key lease.Key, tab string, epoch int64, ttl time.Duration, hidden bool) lease.Lease {
	f.t.Helper()
	req := lease.RenewRequest{Key: key, TabID: tab, Epoch: epoch, TTL: ttl, Hidden: hidden}
	l, err := f.eng.Renew(f.ctx(), req)
	if err != nil {
		f.t.Fatalf("Renew(%+v): %v", req, err)
	}
	if !l.HeldBy(tab, epoch) {
		f.t.Fatalf("Renew(%+v) answered a lease not held by the tab at its epoch: %+v", req, l)
	}
	return l
}

func (f *fixture) release(key lease.Key, tab string, epoch int64) lease.ReleaseResult {
	f.t.Helper()
	req := lease.ReleaseRequest{Key: key, TabID: tab, Epoch: epoch}
	r, err := f.eng.Release(f.ctx(), req)
	if err != nil {
		f.t.Fatalf("Release(%+v): %v", req, err)
	}
	return r
}

func (f *fixture) get(key lease.Key) lease.Lease {
	f.t.Helper()
	l, err := f.eng.Get(f.ctx(), key)
	if err != nil {
		f.t.Fatalf("Get(%+v): %v", key, err)
	}
	return l
}

func (f *fixture) check(key lease.Key, tab string, epoch int64) lease.Lease {
	f.t.Helper()
	l, err := f.eng.Check(f.ctx(), key, tab, epoch)
	if err != nil {
		f.t.Fatalf("Check(%+v, %q, %d): %v", key, tab, epoch, err)
	}
	if !l.HeldBy(tab, epoch) {
		f.t.Fatalf("Check(%+v, %q, %d) answered a lease not held by the tab at its epoch: %+v", key, tab, epoch, l)
	}
	return l
}

// wantReleased fails unless Release(key, tab, epoch) answers want.
func (f *fixture) wantReleased(key lease.Key, tab string, epoch int64, want bool) lease.ReleaseResult {
	f.t.Helper()
	r := f.release(key, tab, epoch)
	if r.Released != want {
		f.t.Errorf("Release(%q, epoch %d) answered Released %v, want %v (lease after: %+v)", tab, epoch, r.Released, want, r.Lease)
	}
	return r
}

// wantLost fails unless err is a *lease.LostError, and returns it.
func wantLost(t *testing.T, what string, err error) *lease.LostError {
	t.Helper()
	var lost *lease.LostError
	if !errors.Is(err, lease.ErrLost) || !errors.As(err, &lost) {
		t.Fatalf("%s: got error %v, want a *lease.LostError matching lease.ErrLost", what, err)
	}
	return lost
}

// wantHeld fails unless err is a *lease.HeldError, and returns it.
func wantHeld(t *testing.T, what string, err error) *lease.HeldError {
	t.Helper()
	var held *lease.HeldError
	if !errors.Is(err, lease.ErrHeld) || !errors.As(err, &held) {
		t.Fatalf("%s: got error %v, want a *lease.HeldError matching lease.ErrHeld", what, err)
	}
	return held
}

// wantInvalid fails unless err is a *lease.InvalidError.
func wantInvalid(t *testing.T, what string, err error) {
	t.Helper()
	var invalid *lease.InvalidError
	if !errors.Is(err, lease.ErrInvalid) || !errors.As(err, &invalid) {
		t.Errorf("%s: got error %v, want a *lease.InvalidError matching lease.ErrInvalid", what, err)
	}
}

// waitFree polls Get until the lease of key is not held, and returns that answer.
func (f *fixture) waitFree(key lease.Key) lease.Lease {
	f.t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		l := f.get(key)
		if !l.Held {
			return l
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("the lease of %+v is still held %v after its expiry was due: %+v", key, waitFor, l)
		}
		time.Sleep(pollEvery)
	}
}

// waitStore polls Get until the store's clock is after t, and returns that answer.
func (f *fixture) waitStore(key lease.Key, t time.Time) lease.Lease {
	f.t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		l := f.get(key)
		if l.Now.After(t) {
			return l
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("the store's clock did not pass %v within %v (it says %v)", t, waitFor, l.Now)
		}
		time.Sleep(pollEvery)
	}
}

// near reports whether a and b differ by at most slack.
func near(a, b time.Duration) bool { return a-b <= slack && b-a <= slack }

// nearTime reports whether a and b differ by at most slack. (Sub saturates for times centuries
// apart, such as a zero time and now: the difference is compared, never negated.)
func nearTime(a, b time.Time) bool {
	d := a.Sub(b)
	return d >= -slack && d <= slack
}
