package lease

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Engines return the typed errors below, which match these with errors.Is.
var (
	// ErrHeld: another tab holds the lease.
	ErrHeld = errors.New("lease: held by another tab")
	// ErrLost: the tab and epoch named no longer hold the lease.
	ErrLost = errors.New("lease: lost")
	// ErrHandoffPending: the lease is reserved for a tab that asked for a handoff.
	ErrHandoffPending = errors.New("lease: handoff pending")
	// ErrBlocked: grants for the session are blocked for a while.
	ErrBlocked = errors.New("lease: session blocked")
	// ErrInvalid: an argument is malformed or out of range.
	ErrInvalid = errors.New("lease: invalid argument")
	// ErrUnavailable: the store could not be reached or did not answer in time.
	ErrUnavailable = errors.New("lease: store unavailable")
	// ErrTooManySessions: the user has state for as many sessions as the engine allows.
	ErrTooManySessions = errors.New("lease: too many sessions")
	// ErrTooManyTabs: the session's presence list holds MaxPresence connections already.
	ErrTooManyTabs = errors.New("lease: too many tabs")
	// ErrTabGone: the tab said it is gone (ReleaseRequest.Gone) less than GoneWindow ago.
	ErrTabGone = errors.New("lease: the tab is gone")
	// ErrNotReplicated: a write the engine was told to confirm on replicas took effect on the
	// store's primary, but fewer replicas than asked confirmed it in time (ReplicationError); it
	// also matches ErrUnavailable.
	ErrNotReplicated = fmt.Errorf("%w: not confirmed by enough replicas", ErrUnavailable)
)

// TabLimitError says that a Presence.Join would list one connection more than Limit in the
// session's presence list (see MaxPresence).
type TabLimitError struct {
	Limit int
}

func (e *TabLimitError) Error() string {
	return fmt.Sprintf("lease: the session lists %d connections already, the most allowed", e.Limit)
}

// Is makes errors.Is(err, ErrTooManyTabs) true.
func (e *TabLimitError) Is(target error) bool { return target == ErrTooManyTabs }

// SessionLimitError says that a call would give its user one session more than Limit (see
// SessionLimit).
type SessionLimitError struct {
	Limit int
}

func (e *SessionLimitError) Error() string {
	return fmt.Sprintf("lease: the user already has state for %d sessions, the most allowed", e.Limit)
}

// Is makes errors.Is(err, ErrTooManySessions) true.
func (e *SessionLimitError) Is(target error) bool { return target == ErrTooManySessions }

// HeldError says who holds the lease that Acquire could not take.
type HeldError struct {
	Holder    Holder
	Epoch     int64
	Remaining time.Duration
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("lease: held by tab %q for %s", e.Holder.TabID, e.Remaining.Round(time.Millisecond))
}

// Is makes errors.Is(err, ErrHeld) true.
func (e *HeldError) Is(target error) bool { return target == ErrHeld }

// LostError says what the lease is now, for a tab whose lease is gone.
type LostError struct {
	// Current is the lease as the store has it now (Held may be false).
	Current Lease
}

func (e *LostError) Error() string {
	if e.Current.Held {
		return fmt.Sprintf("lease: lost; now held by tab %q at epoch %d", e.Current.Holder.TabID, e.Current.Epoch)
	}
	return "lease: lost; the lease is free"
}

// Is makes errors.Is(err, ErrLost) true.
func (e *LostError) Is(target error) bool { return target == ErrLost }

// RetryError says how long a blocked or reserved session stays so.
type RetryError struct {
	Err error // ErrHandoffPending or ErrBlocked
	// RetryAfter is the time left until the state that refused the acquire ends at the latest: the
	// block; the pending handoff request (it may end sooner, when the holder lets go: watchers are
	// told released or expired); the handoff reservation.
	RetryAfter time.Duration
}

func (e *RetryError) Error() string {
	return fmt.Sprintf("%v; retry after %s", e.Err, e.RetryAfter.Round(time.Millisecond))
}

// Unwrap exposes ErrHandoffPending or ErrBlocked.
func (e *RetryError) Unwrap() error { return e.Err }

// InvalidError names the argument that is wrong.
type InvalidError struct {
	Field  string
	Reason string
}

func (e *InvalidError) Error() string { return fmt.Sprintf("lease: invalid %s: %s", e.Field, e.Reason) }

// Is makes errors.Is(err, ErrInvalid) true.
func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

// ReplicationError says that a write took effect on the store's primary but only Acked of the
// Wanted replicas confirmed it before the operation's time ran out: a failover to a replica that
// did not receive it would undo it. Retrying the call with the same request id answers as the
// write did, once enough replicas confirm it.
type ReplicationError struct {
	Op     string
	Wanted int
	Acked  int
	// Revoke is what a revoke did on the primary (Op "revoke"), when its answer was read: what
	// the log says of it, as of a revoke that replicas confirmed.
	Revoke *RevokeResult
}

func (e *ReplicationError) Error() string {
	return fmt.Sprintf("lease: %s took effect on the primary, but %d of the %d replicas asked for confirmed it in time", e.Op, e.Acked, e.Wanted)
}

// Is makes errors.Is(err, ErrNotReplicated) and errors.Is(err, ErrUnavailable) true.
func (e *ReplicationError) Is(target error) bool {
	return target == ErrNotReplicated || target == ErrUnavailable
}

// UnavailableError wraps the store's own error.
type UnavailableError struct {
	Op  string
	Err error
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("lease: store unavailable during %s: %v", e.Op, e.Err)
}

// Is makes errors.Is(err, ErrUnavailable) true.
func (e *UnavailableError) Is(target error) bool { return target == ErrUnavailable }

// Unwrap exposes the store's error (a context deadline, a network error).
func (e *UnavailableError) Unwrap() error { return e.Err }
