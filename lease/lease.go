// Package lease is the domain of tablease: fenced, expiring leases that give one browser tab the
// right to mutate within an agent session, the Engine interface that stores them, and their
// errors and events. It imports only the standard library; leasemem and leaseredis are the
// engines, and leasetest the conformance suite both pass.
//
// Time model: every decision about a lease (is it held, has it expired, which epoch comes next) is
// taken with the store's clock, inside the atomic step that makes the change; callers never supply
// the time. A Lease carries Now, the store time it was read at, so Remaining is exact for that
// answer: clients count Remaining down on their own monotonic clock rather than compare ExpiresAt
// with their wall clock.
//
// Epochs: see NextEpoch. Forgetting idle sessions, and why the epoch floor makes it safe: see
// DefaultIdleRetention. Events: see Feed. Handoff: see ModeHandoff. How the engines keep these
// rules: docs/engines.md.
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
	// Transitions counts the epochs minted in this session (by grants and by admin revokes), as
	// far as the store remembers.
	Transitions int64
	// Handoff is the handoff in progress at Now (see ModeHandoff): requested while Held, reserved
	// while free; nil when there is none.
	Handoff *HandoffState
	// BlockedUntil is when the admin's block of the session ends (see Admin.Revoke), while the
	// block is in force at Now; zero when grants are not blocked at Now. A blocked session is
	// always free: every Acquire fails with ErrBlocked until then.
	BlockedUntil time.Time
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
	// ModeHandoff asks the holder to let go, and claims the lease once it has. Both engines
	// (leasemem and leaseredis) implement it. With the engine's handoff timeout T and reserve window
	// R (DefaultHandoffTimeout and DefaultHandoffReserve unless configured):
	//
	//   - Request. An acquire in ModeHandoff of a lease another tab holds, when no handoff is
	//     requested, requests one: the lease is unchanged (the holder keeps it, and keeps renewing
	//     it), Lease.Handoff becomes {Requester: req.Holder, Until: now+T, Reserved: false}, the
	//     step appends EventHandoffRequested{Epoch and Holder: the holder's, Requester}, and the
	//     acquire fails with &RetryError{Err: ErrHandoffPending, RetryAfter: T}.
	//   - Repeats. While the request is pending, every acquire in ModeHandoff by another tab than the
	//     holder, by the requester (a repeat) or by a third tab alike, changes nothing, appends no
	//     event and fails with &RetryError{ErrHandoffPending, RetryAfter: the time until the request
	//     lapses}. The first request stands: a second requester does not replace it, and retries
	//     after it lapses. An acquire in ModeTry by another tab fails with *HeldError as always.
	//   - Release. When the holder releases while the request is pending, the lease is free and
	//     reserved for the requester: Lease.Handoff becomes {Requester, Until: release time + R,
	//     Reserved: true} and the EventReleased carries the Requester. When the lease expires while
	//     the request is pending (the request's Until is after the lease's ExpiresAt), the same
	//     happens with ExpiresAt for the release time: the reservation lasts until ExpiresAt + R,
	//     whenever the expiry is announced, and the EventExpired carries the Requester.
	//   - Claim. While the lease is reserved, an acquire by the requester (same TabID), in any mode,
	//     is granted a new epoch: EventGranted with Reason ReasonHandoff and Previous the tab that
	//     handed over (and its epoch), and an AuditHandoff record. An acquire by any other tab in
	//     ModeTry or ModeHandoff fails with &RetryError{ErrHandoffPending, RetryAfter: the
	//     reservation's time left}. When the reservation ends unclaimed, the lease is free for
	//     anyone.
	//   - Timeout. A request the holder has not answered by its Until lapses: Lease.Handoff is nil
	//     again, the lease stays the holder's, and a later release or expiry reserves nothing. An
	//     acquire in ModeHandoff after that is a new request (notified again). Taking over is then
	//     the requester's call (the browser client's takeoverOnTimeout).
	//   - Takeover wins. An acquire in ModeTakeover is an explicit user action and is granted as
	//     always: during a request, by any tab (EventTakenOver); during a reservation, by another tab
	//     than the requester (an ordinary EventGranted and AuditGrant: the lease was free), while the
	//     requester's own takeover claims the reservation. Either way the handoff is over.
	//   - Every new grant, every Admin.Revoke (of a held lease or of a free, reserved one), and the
	//     requester's Release with Gone end the handoff in progress. A lapse, the end of a
	//     reservation, and the end by a revoke of a free lease or by a gone requester append no event
	//     and no audit record of their own.
	//   - ModeHandoff by the holder, or of a free lease that is not reserved for another tab, is the
	//     same as ModeTry.
	ModeHandoff Mode = "handoff"
)

// Handoff defaults (DESIGN §3): how long a holder has to let go after a handoff request, and how
// long the lease then stays reserved for the requester.
const (
	DefaultHandoffTimeout = 15 * time.Second
	DefaultHandoffReserve = 10 * time.Second
)

// HandoffState is a handoff in progress (see ModeHandoff): requested (the holder was asked to let
// go and still holds the lease) or reserved (the holder let go; the lease is free and kept for the
// requester).
type HandoffState struct {
	// Requester is the tab that asked, with the label and hidden flag of its request. Only its
	// TabID decides who may claim a reservation.
	Requester Holder
	// Until is when the request lapses (requested), or when the reservation ends (reserved). At
	// Until and after, there is no handoff in progress.
	Until time.Time
	// Reserved is true once the holder let go (released, or let its lease expire) while the
	// request was pending.
	Reserved bool
}

// AcquireRequest asks for the lease of Key for Holder.
type AcquireRequest struct {
	Key    Key
	Holder Holder
	// TTL is the requested time to live; zero asks for the default. Engines clamp it (see Limits).
	TTL  time.Duration
	Mode Mode // empty means ModeTry
	// NewEpoch asks that an acquire by the holder itself be a grant with a new epoch rather than
	// keep its epoch: EventGranted with Reason ReasonNewEpoch and Previous the holder at its old
	// epoch, and an AuditGrant record with that Previous; like every grant, it ends a handoff in
	// progress. It is for a holder whose epoch a store that lost data took back below epochs it
	// had minted (a failover that lost the primary's last writes): the new epoch, floored at the
	// store's clock (NextEpoch), is above them, so resources fenced at them accept the holder's
	// writes, and the lease never leaves the tab meanwhile. It changes nothing for any other tab,
	// whose grant always has a new epoch.
	NewEpoch bool
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
	// Gone says the tab is gone for good (its page was unloaded), with Epoch 0: the release ends
	// the lease the tab holds at any epoch, and for GoneWindow the session refuses the tab's
	// acquires with ErrTabGone, so that an acquire the tab sent before it went, still on its way,
	// grants nothing; and it ends the handoff the tab asked for (see ModeHandoff), so that nothing
	// is reserved for a closed tab. The browser client sends it from pagehide when the tab holds
	// the lease, waits for an acquire's answer or for a handoff it asked for: otherwise the late
	// grant would leave the session to a closed tab until its expiry. The mark is state of the
	// session: for a session the user has no state for, at the limit of sessions, the release
	// fails with *SessionLimitError and marks nothing (an acquire of the tab arriving later is
	// refused alike, unless the user came under the limit meanwhile).
	Gone bool
}

// GoneWindow is how long a session refuses the acquires of a tab that said it is gone
// (ReleaseRequest.Gone): longer than any acquire it sent before may take to arrive.
const GoneWindow = time.Minute

// MaxGone bounds the gone tabs a session remembers at once: the latest MaxGone within their
// windows (a window of tabs closed together says so for each of its tabs of the session that held
// the lease or waited for an acquire's answer).
const MaxGone = 16

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
	// holds it and the mode does not allow taking it. A new grant (the lease is free, expired or
	// released, or a takeover from another tab) gets NextEpoch; the holder acquiring again, in any
	// mode, keeps its epoch, has its label and hidden flag updated, and its lease extended from now
	// by the clamped TTL, so a retried acquire never mints a second epoch; unless req.NewEpoch
	// asks for a new one (a grant: NextEpoch, the label, flag and TTL as asked). It fails with
	// *RetryError matching ErrBlocked while an admin's block lasts (see Admin.Revoke), with
	// *RetryError matching ErrHandoffPending when a handoff is requested or the lease is reserved
	// for another tab (see ModeHandoff), and with *RetryError matching ErrTabGone, RetryAfter the
	// time left in the tab's window, for a tab that said it is gone (ReleaseRequest.Gone), in
	// every mode.
	Acquire(ctx context.Context, req AcquireRequest) (Lease, error)
	// Renew extends the lease from now by the clamped TTL and records the hidden flag. It fails
	// with *LostError (ErrLost) unless req.TabID holds the lease at req.Epoch and it has not
	// expired: a renew never resurrects.
	Renew(ctx context.Context, req RenewRequest) (Lease, error)
	// Release ends the lease when req.TabID holds it at req.Epoch. It is idempotent: a retry of a
	// release that succeeded answers true again; releasing a lease that is free, expired or held
	// by someone else changes nothing and reports false. A release with req.Gone ends the lease
	// req.TabID holds at any epoch, and makes Acquire fail with ErrTabGone for that tab for
	// GoneWindow, for the latest MaxGone such tabs of the session (for a session that has no
	// state, its user at the bound of sessions, it fails with *SessionLimitError and marks
	// nothing: see ReleaseRequest.Gone).
	Release(ctx context.Context, req ReleaseRequest) (ReleaseResult, error)
	// Get reads the lease of key. A session that never had a lease is a free lease with epoch 0.
	Get(ctx context.Context, key Key) (Lease, error)
	// Check answers the current lease when tabID holds it at epoch, and *LostError (ErrLost)
	// otherwise. Guards call it before they let a mutation through.
	Check(ctx context.Context, key Key, tabID string, epoch int64) (Lease, error)
	// Ping reports whether the store answers the engine's calls (a *UnavailableError when not).
	Ping(ctx context.Context) error
	// Close releases the engine's resources (not the leases).
	Close() error
}
