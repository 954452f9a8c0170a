// Package lease is the domain of tablease: fenced, expiring leases that give one browser tab the
// right to mutate within an agent session.
//
// # Time model
//
// Every decision about a lease (is it held, has it expired, which epoch comes next) is taken with
// the store's clock: Redis answers redis.call('TIME') inside the script that makes the change, and
// the memory engine reads its injected clock inside the critical section that makes the change.
// Callers never supply the time. A Lease carries Now, the store time at which it was read, so
// Remaining is exact for that answer; clients should count down Remaining on their own monotonic
// clock rather than compare ExpiresAt with their wall clock.
//
// # Epochs
//
// Epoch is the fencing token. It strictly increases per (user, session) with every new grant and is
// floored at the store's clock in microseconds: next = max(last+1, now_us). A store that lost its
// data therefore cannot hand out an epoch it handed out before, unless its clock stepped back
// further than the time since the loss. Epochs stay below 2^53 so that JavaScript reads them
// exactly.
//
// # Events
//
// Every change of a session's state (its lease, or the tabs present on its event stream) produces
// its events in the same atomic step that makes the change: one Lua script in Redis, one critical
// section in memory. There is no change without its event and no event without its change. The
// step appends the events to a bounded per-session log, where each gets an id that strictly
// increases per session (EventID), and hands them to the session's watchers. The methods of Engine
// are unchanged by this: events are their side effect, observed through the Feed and Presence
// interfaces that engines implement beside Engine. Feed documents which call produces which
// event.
//
// An expiry changes the state without a call, so it is announced by whoever sees it first: the
// engine's expiry timer for sessions that have watchers (within a second, with no call needed), or
// any call that touches the session, before its own event. The step that announces an expiry marks
// the epoch whose end it announced, so every expiry is announced exactly once, however many
// instances share the store.
//
// This package imports only the standard library; engines live in leasemem and leaseredis, and the
// conformance suite that both must pass lives in leasetest.
package lease

import (
	"context"
	"time"
)

// MaxEpoch is the exclusive upper bound of an epoch: 2^53, the limit of exact integers in
// JavaScript.
const MaxEpoch int64 = 1 << 53

// Key names the lease of one session of one user. Both parts are identifiers (see ValidateID).
type Key struct {
	User    string // the sub of the access token
	Session string // the agent-session id chosen by the app
}

// Validate reports whether both parts of k are valid identifiers.
func (k Key) Validate() error {
	if err := ValidateID("sub", k.User); err != nil {
		return err
	}
	return ValidateID("sessionId", k.Session)
}

// Holder is the tab that holds a lease.
type Holder struct {
	TabID  string
	Label  string
	Hidden bool // the tab reported itself hidden, and may hold a longer TTL
}

// Lease is the state of the lease of one session as read from the store at Now.
type Lease struct {
	Key  Key
	Held bool
	// Holder is the zero value when Held is false.
	Holder Holder
	// Epoch is the current epoch while held, and the last epoch granted when free, as far as the
	// store remembers (0 when the session never had a lease, or the store forgot it; the epoch
	// floor keeps the next grant higher all the same).
	Epoch int64
	// GrantedAt is when the current (or last) epoch was granted; ExpiresAt when the lease ends
	// unless renewed, or when it was released. Both are zero when the session never had a lease.
	// A lease whose ExpiresAt is not after the store's clock is not held.
	GrantedAt time.Time
	ExpiresAt time.Time
	// TTL is the time to live granted by the last acquire or renew.
	TTL time.Duration
	// Transitions counts the grants of new epochs in this session, as far as the store remembers.
	Transitions int64
	// Now is the store time at which this state was read.
	Now time.Time
}

// Remaining is how long the lease stays valid after Now; zero when it is not held.
func (l Lease) Remaining() time.Duration {
	if !l.Held || !l.ExpiresAt.After(l.Now) {
		return 0
	}
	return l.ExpiresAt.Sub(l.Now)
}

// HeldBy reports whether tab holds the lease at epoch.
func (l Lease) HeldBy(tabID string, epoch int64) bool {
	return l.Held && l.Holder.TabID == tabID && l.Epoch == epoch
}

// Mode says how Acquire treats a lease held by another tab.
type Mode string

const (
	// ModeTry grants when the lease is free, expired, or already held by the same tab (keeping
	// its epoch); otherwise it fails with ErrHeld.
	ModeTry Mode = "try"
	// ModeTakeover grants even when another tab holds the lease, with a new epoch. When the same
	// tab already holds it, the epoch is kept, so a retried takeover does not mint a second epoch.
	ModeTakeover Mode = "takeover"
	// ModeHandoff asks the holder to let go. It is part of the contract but no engine implements it
	// yet: engines answer it with an InvalidError.
	ModeHandoff Mode = "handoff"
)

// AcquireRequest asks for the lease of Key for Holder.
type AcquireRequest struct {
	Key    Key
	Holder Holder
	// TTL is the requested time to live; zero asks for the default. Engines clamp it (see Limits).
	TTL  time.Duration
	Mode Mode // empty means ModeTry
}

// RenewRequest extends the lease held by TabID at Epoch.
type RenewRequest struct {
	Key    Key
	TabID  string
	Epoch  int64
	TTL    time.Duration // zero asks for the default
	Hidden bool
}

// ReleaseRequest gives up the lease held by TabID at Epoch.
type ReleaseRequest struct {
	Key   Key
	TabID string
	Epoch int64
}

// ReleaseResult is the answer to Release.
type ReleaseResult struct {
	// Released is true when this call ended the lease, and when it repeats the release that did
	// (same tab and epoch, the lease still free since): a retried release answers the same. It is
	// false when the lease was already free or expired, or is held by another tab or epoch, which a
	// release never touches.
	Released bool
	// Lease is the state after the call.
	Lease Lease
}

// Engine stores leases. Implementations must pass leasetest.Run. All methods are safe for
// concurrent use, take the time from the store, and make every change in one atomic step. A lease
// is held until its ExpiresAt; at ExpiresAt and after, it is free.
//
// Errors: a bad identifier, label, epoch or mode is an *InvalidError (ErrInvalid); store trouble
// is an *UnavailableError (ErrUnavailable) and never a decision about the lease.
type Engine interface {
	// Acquire grants the lease to req.Holder, or fails with *HeldError (ErrHeld) when another tab
	// holds it and the mode does not allow taking it.
	Acquire(ctx context.Context, req AcquireRequest) (Lease, error)
	// Renew extends the lease from now by the clamped TTL and records the hidden flag. It fails
	// with *LostError (ErrLost) unless req.TabID holds the lease at req.Epoch and it has not
	// expired: a renew never resurrects.
	Renew(ctx context.Context, req RenewRequest) (Lease, error)
	// Release ends the lease when req.TabID holds it at req.Epoch. It is idempotent: a retry of a
	// release that succeeded answers true again; releasing a lease that is free, expired or held
	// by someone else changes nothing and reports false.
	Release(ctx context.Context, req ReleaseRequest) (ReleaseResult, error)
	// Get reads the lease of key. A session that never had a lease is a free lease with epoch 0.
	Get(ctx context.Context, key Key) (Lease, error)
	// Check answers the current lease when tabID holds it at epoch, and *LostError (ErrLost)
	// otherwise. Guards call it before they let a mutation through.
	Check(ctx context.Context, key Key, tabID string, epoch int64) (Lease, error)
	// Ping reports whether the store answers.
	Ping(ctx context.Context) error
	// Close releases the engine's resources (not the leases).
	Close() error
}
