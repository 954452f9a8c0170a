package lease

import (
	"errors"
	"fmt"
	"time"
)

// Limits bound the TTLs that engines grant.
type Limits struct {
	Min       time.Duration // shortest TTL granted (default 1s)
	Default   time.Duration // TTL when none is asked for (default 45s)
	Max       time.Duration // longest TTL for a visible tab (default 120s)
	HiddenMax time.Duration // longest TTL for a hidden tab (default 150s)
}

// DefaultLimits are the default TTL bounds (TABLEASE_TTL_*, in the README's configuration table).
var DefaultLimits = Limits{Min: time.Second, Default: 45 * time.Second, Max: 120 * time.Second, HiddenMax: 150 * time.Second}

// Validate checks that the bounds are ordered: 0 < Min <= Default <= Max <= HiddenMax, all in
// whole milliseconds. Its *InvalidError names the field at fault (Min, Default, Max or HiddenMax)
// and, in its reason, the field it must not be below.
func (l Limits) Validate() error {
	fields := []struct {
		name string
		d    time.Duration
	}{{"Min", l.Min}, {"Default", l.Default}, {"Max", l.Max}, {"HiddenMax", l.HiddenMax}}
	for i, f := range fields {
		switch {
		case f.d%time.Millisecond != 0:
			return &InvalidError{Field: f.name, Reason: "must be whole milliseconds"}
		case i == 0 && f.d <= 0:
			return &InvalidError{Field: f.name, Reason: "must be positive"}
		case i > 0 && f.d < fields[i-1].d:
			// Both values, since either may be the one set wrong.
			return &InvalidError{Field: f.name, Reason: fmt.Sprintf("%v must not be below %s (%v)", f.d, fields[i-1].name, fields[i-1].d)}
		}
	}
	return nil
}

// OrDefault returns l, or DefaultLimits when l is the zero value, and the verdict of Validate on
// what it returns: how engines and servers read their Limits option.
func (l Limits) OrDefault() (Limits, error) {
	if l == (Limits{}) {
		l = DefaultLimits
	}
	return l, l.Validate()
}

// Clamp returns the TTL to grant for a request: the default when ttl is zero, otherwise ttl
// bounded by Min and by Max (HiddenMax for a hidden tab), truncated to whole milliseconds.
// A negative ttl is invalid.
func (l Limits) Clamp(ttl time.Duration, hidden bool) (time.Duration, error) {
	if ttl < 0 {
		return 0, &InvalidError{Field: "ttlMs", Reason: "must not be negative"}
	}
	if ttl == 0 {
		ttl = l.Default
	}
	ttl = ttl.Truncate(time.Millisecond)
	upper := l.Max
	if hidden {
		upper = l.HiddenMax
	}
	return min(max(ttl, l.Min), upper), nil
}

// RenewAfter is when a holder should renew: a third of the TTL, so that two renews may fail before
// the lease expires.
func RenewAfter(ttl time.Duration) time.Duration {
	return (ttl / 3).Truncate(time.Millisecond)
}

// DefaultIdleRetention is how long, unless configured otherwise, an engine keeps the state of a
// session after the last thing in it ended: its lease, an admin's block, a handoff, its last
// change; and at least until the retry window of its last revoke with a RequestID ends
// (RevokeRetryWindow after the revoke, which answers its retries until then). Then the engine forgets the
// session: Get answers epoch 0 and no transitions, as for a session that never had a lease, a
// retried release answers Released false, and a watch that resumes starts from a snapshot. A
// free session keeps no holder (no tab id, label or hidden flag) even before that.
//
// Forgetting is safe for fencing because epochs are floored at the store's clock (NextEpoch): an
// engine forgets a session only once its clock is past the session's last epoch in microseconds,
// so the next grant's epoch is higher than every epoch the session had, exactly as after the store
// lost its data. The audit log is kept apart and outlives the sessions it records.
const DefaultIdleRetention = 10 * time.Minute

// MaxPresence bounds the presence list of a session: a Presence.Join of a connection the list
// does not hold fails with *TabLimitError (ErrTooManyTabs) while it holds MaxPresence live
// connections, and changes nothing; a refresh of a listed connection never fails so. One user's
// tabs on one session are a handful; the bound keeps a client that invents tab ids from making
// every join, snapshot and presence answer of the session ever larger.
const MaxPresence = 100

// Engines may bound the number of sessions each user has state for (held, or free and not yet
// forgotten, see DefaultIdleRetention; a watched session counts as long as its engine keeps what it
// watches, its event log included; an admin's revoke is never refused by the bound): an Acquire,
// Presence.Join, Feed.Watch or gone Release (ReleaseRequest.Gone) that would give the user one
// more fails with *SessionLimitError (ErrTooManySessions) and changes nothing. A session the user already has state for is never
// refused by the bound.

// ErrEpochExhausted: the next epoch would reach 2^53. It is a fault of the store's state or clock,
// not of the caller.
var ErrEpochExhausted = errors.New("lease: epoch space exhausted")

// NextEpoch is the epoch of a new grant: max(last+1, nowMicros), where now is the store's clock.
// This is the epoch rule of every engine: an epoch strictly increases per (user, session) with
// every new grant (and every Admin.Revoke that ends a lease), never with a renew or a re-acquire by
// the holder that does not ask for one (AcquireRequest.NewEpoch), and is floored at the store's clock in microseconds, so a store that lost its data
// cannot hand out an epoch it handed out before, unless its clock stepped back further than the
// time since the loss. Epochs stay below MaxEpoch (2^53) so that JavaScript reads them exactly;
// NextEpoch fails with ErrEpochExhausted when the result would leave that range.
func NextEpoch(last int64, now time.Time) (int64, error) {
	next := max(last+1, now.UnixMicro())
	if next >= MaxEpoch || next < 1 {
		return 0, ErrEpochExhausted
	}
	return next, nil
}
