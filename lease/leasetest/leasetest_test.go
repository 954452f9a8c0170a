package leasetest_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/lease/leasemem"
	"github.com/tablease/tablease/lease/leasetest"
)

// errDown is what the store of an unreachableEngine says while it is down.
var errDown = errors.New("store unreachable")

// unreachableEngine puts a store that can be unplugged in front of the lease and admin calls of a
// lease.Store: while down, every such call waits for opTimeout (or its context) and fails with a
// *lease.UnavailableError, as a network engine with an operation timeout would. Its events and
// presence are the store's, which the plug does not cut. It lets the suite's outage test run
// without Redis.
type unreachableEngine struct {
	lease.Store
	opTimeout time.Duration
	down      atomic.Bool
}

func (u *unreachableEngine) wait(ctx context.Context, op string) error {
	if !u.down.Load() {
		return nil
	}
	timer := time.NewTimer(u.opTimeout)
	defer timer.Stop()
	select {
	case <-timer.C:
		return &lease.UnavailableError{Op: op, Err: errDown}
	case <-ctx.Done():
		return &lease.UnavailableError{Op: op, Err: ctx.Err()}
	}
}

func (u *unreachableEngine) Acquire(ctx context.Context, req lease.AcquireRequest) (lease.Lease, error) {
	if err := u.wait(ctx, "acquire"); err != nil {
		return lease.Lease{}, err
	}
	return u.Store.Acquire(ctx, req)
}

func (u *unreachableEngine) Renew(ctx context.Context, req lease.RenewRequest) (lease.Lease, error) {
	if err := u.wait(ctx, "renew"); err != nil {
		return lease.Lease{}, err
	}
	return u.Store.Renew(ctx, req)
}

func (u *unreachableEngine) Release(ctx context.Context, req lease.ReleaseRequest) (lease.ReleaseResult, error) {
	if err := u.wait(ctx, "release"); err != nil {
		return lease.ReleaseResult{}, err
	}
	return u.Store.Release(ctx, req)
}

func (u *unreachableEngine) Get(ctx context.Context, key lease.Key) (lease.Lease, error) {
	if err := u.wait(ctx, "get"); err != nil {
		return lease.Lease{}, err
	}
	return u.Store.Get(ctx, key)
}

func (u *unreachableEngine) Check(ctx context.Context, key lease.Key, tabID string, epoch int64) (lease.Lease, error) {
	if err := u.wait(ctx, "check"); err != nil {
		return lease.Lease{}, err
	}
	return u.Store.Check(ctx, key, tabID, epoch)
}

func (u *unreachableEngine) Ping(ctx context.Context) error {
	if err := u.wait(ctx, "ping"); err != nil {
		return err
	}
	return u.Store.Ping(ctx)
}

func (u *unreachableEngine) ListLeases(ctx context.Context, q lease.ListQuery) (lease.LeasePage, error) {
	if err := u.wait(ctx, "list leases"); err != nil {
		return lease.LeasePage{}, err
	}
	return u.Store.ListLeases(ctx, q)
}

func (u *unreachableEngine) Revoke(ctx context.Context, req lease.RevokeRequest) (lease.RevokeResult, error) {
	if err := u.wait(ctx, "revoke"); err != nil {
		return lease.RevokeResult{}, err
	}
	return u.Store.Revoke(ctx, req)
}

func (u *unreachableEngine) Audit(ctx context.Context, q lease.AuditQuery) (lease.AuditPage, error) {
	if err := u.wait(ctx, "audit"); err != nil {
		return lease.AuditPage{}, err
	}
	return u.Store.Audit(ctx, q)
}

// TestSuiteWithAnUnreachableStore runs the suite, its outage test included, against the memory
// engine behind a store that can be unplugged.
func TestSuiteWithAnUnreachableStore(t *testing.T) {
	leasetest.Run(t, func(t *testing.T, limits lease.Limits) leasetest.Target {
		const opTimeout = 200 * time.Millisecond
		opts := leasemem.Options{
			Limits:         limits,
			PresenceTTL:    leasetest.ShortPresenceTTL,
			HandoffTimeout: leasetest.ShortHandoffTimeout,
			HandoffReserve: leasetest.ShortHandoffReserve,
		}
		mem, err := leasemem.New(opts)
		if err != nil {
			t.Fatalf("leasemem.New: %v", err)
		}
		u := &unreachableEngine{Store: mem, opTimeout: opTimeout}
		return leasetest.Target{
			Engine: u,
			LoseData: func(t *testing.T) lease.Store {
				fresh, err := leasemem.New(opts)
				if err != nil {
					t.Fatalf("leasemem.New: %v", err)
				}
				return &unreachableEngine{Store: fresh, opTimeout: opTimeout}
			},
			Outage: func(t *testing.T) func() {
				u.down.Store(true)
				return func() { u.down.Store(false) }
			},
			OpTimeout: opTimeout,
			Limited: func(t *testing.T, perUser int) lease.Store {
				return memEngine(t, opts, func(o *leasemem.Options) { o.SessionsPerUser = perUser })
			},
			Forgetting: func(t *testing.T, idle time.Duration, perUser int) lease.Store {
				return memEngine(t, opts, func(o *leasemem.Options) { o.IdleRetention, o.SessionsPerUser = idle, perUser })
			},
			PresenceTTL:    leasetest.ShortPresenceTTL,
			HandoffTimeout: leasetest.ShortHandoffTimeout,
			HandoffReserve: leasetest.ShortHandoffReserve,
		}
	})
}

// peerView is a second handle on a memory engine, standing for a second instance on one store:
// closing it leaves the engine open.
type peerView struct{ *leasemem.Engine }

func (peerView) Close() error { return nil }

// TestSuiteWithAPeer runs the suite, its tests across instances included, against a memory engine
// and a second handle on it: the memory engine has no store to share, but the tests of the suite
// that need two instances run all the same.
func TestSuiteWithAPeer(t *testing.T) {
	leasetest.Run(t, func(t *testing.T, limits lease.Limits) leasetest.Target {
		opts := leasemem.Options{
			Limits:         limits,
			PresenceTTL:    leasetest.ShortPresenceTTL,
			HandoffTimeout: leasetest.ShortHandoffTimeout,
			HandoffReserve: leasetest.ShortHandoffReserve,
		}
		mem, err := leasemem.New(opts)
		if err != nil {
			t.Fatalf("leasemem.New: %v", err)
		}
		return leasetest.Target{
			Engine: mem,
			Peer:   func(t *testing.T) lease.Store { return peerView{mem} },
			Limited: func(t *testing.T, perUser int) lease.Store {
				return memEngine(t, opts, func(o *leasemem.Options) { o.SessionsPerUser = perUser })
			},
			Forgetting: func(t *testing.T, idle time.Duration, perUser int) lease.Store {
				return memEngine(t, opts, func(o *leasemem.Options) { o.IdleRetention, o.SessionsPerUser = idle, perUser })
			},
			PresenceTTL:    leasetest.ShortPresenceTTL,
			HandoffTimeout: leasetest.ShortHandoffTimeout,
			HandoffReserve: leasetest.ShortHandoffReserve,
		}
	})
}

// memEngine is a memory engine with opts as change leaves them.
func memEngine(t *testing.T, opts leasemem.Options, change func(o *leasemem.Options)) lease.Store {
	change(&opts)
	e, err := leasemem.New(opts)
	if err != nil {
		t.Fatalf("leasemem.New: %v", err)
	}
	return e
}
