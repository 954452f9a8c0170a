// Package leasemem is the in-memory lease.Engine: the embedded default when no Redis is
// configured (one tablease instance; tests and `tablease serve --dev`). It has the semantics of
// every engine and passes the same conformance suite, leasetest.Run.
//
// # Atomicity and time
//
// Every call is one critical section under Engine.mu: the engine reads its injected clock
// (Options.Now) inside that section, decides, and writes, so the decision and the time it was taken
// at cannot be separated. Times are truncated to whole microseconds and stripped of Go's monotonic
// reading, like the TIME of Redis, so that both engines answer with times of the same shape and an
// epoch granted at t is never below t in microseconds. A lease whose ExpiresAt is at or before the
// clock is not held.
//
// # Losing data
//
// Memory loses everything when the process restarts. A new Engine built with the same clock is
// exactly that, and is how the conformance suite simulates the loss. Epochs survive it because they
// are floored at the clock: the first grant of a new Engine is at least now in microseconds, above
// every epoch granted before unless the clock stepped back.
//
// # Bounded memory
//
// A session's entry holds its last epoch, its transition count and the tab and epoch of its last
// release. Entries of sessions whose lease has been free (released or expired) for longer than
// IdleRetention are deleted by a sweep that runs, at most once per SweepInterval of engine time,
// inside a writing call (Acquire, Renew or Release). Only Acquire creates entries, so memory is
// bounded by the sessions that held a lease in the last IdleRetention. Deleting an entry is safe
// for fencing because the sweep only deletes entries whose last epoch is below the clock in
// microseconds: a later grant in that session gets an epoch above it. What is forgotten is the
// history: Get of a pruned session answers epoch 0 and no transitions, like a session that never
// had a lease, and a release retried after the prune answers Released false.
package leasemem

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/tablease/tablease/lease"
)

const (
	// IdleRetention is how long the entry of a session whose lease is free is kept.
	IdleRetention = 10 * time.Minute
	// SweepInterval is the least engine time between two sweeps of idle entries.
	SweepInterval = time.Minute
)

// ErrClosed is the store error inside the *lease.UnavailableError that every call answers after
// Close.
var ErrClosed = errors.New("leasemem: engine closed")

// Options configure an Engine.
type Options struct {
	// Limits bound the TTLs granted. The zero value means lease.DefaultLimits; anything else must
	// pass Limits.Validate.
	Limits lease.Limits
	// Now is the engine's clock (default time.Now). The engine reads no other clock.
	Now func() time.Time
}

// Engine is an in-memory lease.Engine. Use New; the zero value is not usable.
type Engine struct {
	limits lease.Limits     // immutable after New
	now    func() time.Time // immutable after New

	// mu protects every field below; each call takes it once, for the whole of its decision.
	mu sync.Mutex
	// sessions maps a key to its state. An entry exists from the first Acquire of the key until the
	// sweep deletes it (see the package comment).
	sessions map[lease.Key]*entry
	// peak is the largest len(sessions) since the map was last allocated; the sweep reallocates the
	// map when it has shrunk well below it, since Go maps never give back their buckets.
	peak int
	// lastSweep is the engine time of the last sweep of idle entries.
	lastSweep time.Time
	// closed is set by Close; every later call fails with ErrClosed.
	closed bool
}

// entry is the state of one session; it is only touched with Engine.mu held.
type entry struct {
	holder lease.Holder // the last holder; meaningful while held
	// epoch is the last epoch granted, whether or not the lease is still held.
	epoch int64
	// grantedAt is when epoch was granted. expiresAt is when the lease ends: the grant or last
	// renew plus its TTL, or the time of the release. The lease is held while expiresAt > now.
	grantedAt time.Time
	expiresAt time.Time
	ttl       time.Duration // the TTL of the last grant or renew
	// transitions counts the epochs granted in this session.
	transitions int64
	// releasedTab and releasedEpoch name the lease that the last successful Release ended, until the
	// next grant (empty and 0 otherwise), so that a retried release answers as the first one did.
	releasedTab   string
	releasedEpoch int64
}

func (s *entry) held(now time.Time) bool { return s.expiresAt.After(now) }

func (s *entry) heldBy(tabID string, epoch int64, now time.Time) bool {
	return s.held(now) && s.holder.TabID == tabID && s.epoch == epoch
}

// New returns an empty engine. It fails with a *lease.InvalidError when opts.Limits are not
// ordered (see lease.Limits.Validate).
func New(opts Options) (*Engine, error) {
	limits := opts.Limits
	if limits == (lease.Limits{}) {
		limits = lease.DefaultLimits
	}
	if err := limits.Validate(); err != nil {
		return nil, err
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	return &Engine{limits: limits, now: now, sessions: make(map[lease.Key]*entry)}, nil
}

var _ lease.Engine = (*Engine)(nil)

// Acquire implements lease.Engine. A new grant (the lease is free or expired, or a takeover from
// another tab) gets lease.NextEpoch; the holder acquiring again, in either mode, keeps its epoch,
// has its label and hidden flag updated, and its lease extended from now by the clamped TTL.
func (e *Engine) Acquire(ctx context.Context, req lease.AcquireRequest) (lease.Lease, error) {
	mode, err := req.Validate()
	if err != nil {
		return lease.Lease{}, err
	}
	ttl, err := e.limits.Clamp(req.TTL, req.Holder.Hidden)
	if err != nil {
		return lease.Lease{}, err
	}
	now, unlock, err := e.begin(ctx, "acquire")
	if err != nil {
		return lease.Lease{}, err
	}
	defer unlock()
	e.sweep(now)

	s := e.sessions[req.Key]
	if s != nil && s.held(now) {
		if s.holder.TabID == req.Holder.TabID {
			s.holder = req.Holder
			s.expiresAt = now.Add(ttl)
			s.ttl = ttl
			return s.lease(req.Key, now), nil
		}
		if mode != lease.ModeTakeover {
			return lease.Lease{}, &lease.HeldError{Holder: s.holder, Epoch: s.epoch, Remaining: s.expiresAt.Sub(now)}
		}
	}
	var last int64
	if s != nil {
		last = s.epoch
	}
	epoch, err := lease.NextEpoch(last, now)
	if err != nil {
		return lease.Lease{}, err
	}
	if s == nil {
		s = &entry{}
		e.sessions[req.Key] = s
		e.peak = max(e.peak, len(e.sessions))
	}
	s.holder = req.Holder
	s.epoch = epoch
	s.grantedAt = now
	s.expiresAt = now.Add(ttl)
	s.ttl = ttl
	s.transitions++
	s.releasedTab, s.releasedEpoch = "", 0
	return s.lease(req.Key, now), nil
}

// Renew implements lease.Engine.
func (e *Engine) Renew(ctx context.Context, req lease.RenewRequest) (lease.Lease, error) {
	if err := req.Validate(); err != nil {
		return lease.Lease{}, err
	}
	ttl, err := e.limits.Clamp(req.TTL, req.Hidden)
	if err != nil {
		return lease.Lease{}, err
	}
	now, unlock, err := e.begin(ctx, "renew")
	if err != nil {
		return lease.Lease{}, err
	}
	defer unlock()
	e.sweep(now)

	s := e.sessions[req.Key]
	if s == nil || !s.heldBy(req.TabID, req.Epoch, now) {
		return lease.Lease{}, &lease.LostError{Current: e.lease(req.Key, now)}
	}
	s.holder.Hidden = req.Hidden
	s.expiresAt = now.Add(ttl)
	s.ttl = ttl
	return s.lease(req.Key, now), nil
}

// Release implements lease.Engine. Released is true when this call ended the lease, and also when
// the lease is still free since a release by the same tab and epoch ended it, so that a retried
// release gets the answer of the first one.
func (e *Engine) Release(ctx context.Context, req lease.ReleaseRequest) (lease.ReleaseResult, error) {
	if err := req.Validate(); err != nil {
		return lease.ReleaseResult{}, err
	}
	now, unlock, err := e.begin(ctx, "release")
	if err != nil {
		return lease.ReleaseResult{}, err
	}
	defer unlock()
	e.sweep(now)

	s := e.sessions[req.Key]
	switch {
	case s == nil:
		return lease.ReleaseResult{Lease: e.lease(req.Key, now)}, nil
	case s.heldBy(req.TabID, req.Epoch, now):
		s.expiresAt = now
		s.releasedTab, s.releasedEpoch = req.TabID, req.Epoch
		return lease.ReleaseResult{Released: true, Lease: s.lease(req.Key, now)}, nil
	default:
		retried := !s.held(now) && s.releasedTab == req.TabID && s.releasedEpoch == req.Epoch
		return lease.ReleaseResult{Released: retried, Lease: s.lease(req.Key, now)}, nil
	}
}

// Get implements lease.Engine.
func (e *Engine) Get(ctx context.Context, key lease.Key) (lease.Lease, error) {
	if err := key.Validate(); err != nil {
		return lease.Lease{}, err
	}
	now, unlock, err := e.begin(ctx, "get")
	if err != nil {
		return lease.Lease{}, err
	}
	defer unlock()
	return e.lease(key, now), nil
}

// Check implements lease.Engine.
func (e *Engine) Check(ctx context.Context, key lease.Key, tabID string, epoch int64) (lease.Lease, error) {
	if err := lease.ValidateCheck(key, tabID, epoch); err != nil {
		return lease.Lease{}, err
	}
	now, unlock, err := e.begin(ctx, "check")
	if err != nil {
		return lease.Lease{}, err
	}
	defer unlock()
	s := e.sessions[key]
	if s == nil || !s.heldBy(tabID, epoch, now) {
		return lease.Lease{}, &lease.LostError{Current: e.lease(key, now)}
	}
	return s.lease(key, now), nil
}

// Ping implements lease.Engine: it answers nil until Close.
func (e *Engine) Ping(ctx context.Context) error {
	_, unlock, err := e.begin(ctx, "ping")
	if err != nil {
		return err
	}
	unlock()
	return nil
}

// Close forgets every lease; later calls fail with a *lease.UnavailableError wrapping ErrClosed.
// Closing twice is not an error.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	e.sessions = nil
	return nil
}

// begin starts the critical section of one call: it fails with a *lease.UnavailableError when ctx
// is done or the engine is closed, and otherwise returns the engine time and the func that ends
// the section. The clock is read with e.mu held, so that times follow the order of the sections.
func (e *Engine) begin(ctx context.Context, op string) (time.Time, func(), error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, nil, &lease.UnavailableError{Op: op, Err: err}
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return time.Time{}, nil, &lease.UnavailableError{Op: op, Err: ErrClosed}
	}
	// Truncate strips the monotonic reading; UTC keeps answers independent of the clock's zone.
	return e.now().Truncate(time.Microsecond).UTC(), e.mu.Unlock, nil
}

// lease answers the state of key at now, a free lease with epoch 0 when there is no entry.
// e.mu must be held.
func (e *Engine) lease(key lease.Key, now time.Time) lease.Lease {
	if s := e.sessions[key]; s != nil {
		return s.lease(key, now)
	}
	return lease.Lease{Key: key, Now: now}
}

func (s *entry) lease(key lease.Key, now time.Time) lease.Lease {
	l := lease.Lease{
		Key:         key,
		Held:        s.held(now),
		Epoch:       s.epoch,
		GrantedAt:   s.grantedAt,
		ExpiresAt:   s.expiresAt,
		TTL:         s.ttl,
		Transitions: s.transitions,
		Now:         now,
	}
	if l.Held {
		l.Holder = s.holder
	}
	return l
}

// sweep deletes the entries that have been free for longer than IdleRetention, at most once per
// SweepInterval of engine time. e.mu must be held.
func (e *Engine) sweep(now time.Time) {
	if now.Sub(e.lastSweep) < SweepInterval && !now.Before(e.lastSweep) {
		return
	}
	e.lastSweep = now
	nowMicros := now.UnixMicro()
	for key, s := range e.sessions {
		// The epoch test keeps fencing safe even if epochs ran ahead of the clock.
		if now.Sub(s.expiresAt) > IdleRetention && s.epoch < nowMicros {
			delete(e.sessions, key)
		}
	}
	// Go maps keep their buckets after deletes: copy a map that shrank to a quarter of its peak.
	if e.peak >= 1024 && len(e.sessions) <= e.peak/4 {
		fresh := make(map[lease.Key]*entry, len(e.sessions))
		for key, s := range e.sessions {
			fresh[key] = s
		}
		e.sessions = fresh
		e.peak = len(fresh)
	}
}
