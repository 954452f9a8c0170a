package lease

import (
	"context"
	"time"
)

// Admin is what an engine offers administrators: listing leases, revoking and blocking, and the
// audit log. Engines implement it beside Engine; the api serves it under /v1/admin with scope
// lease:admin.
type Admin interface {
	// ListLeases lists the leases held at the store's clock, ordered by user and then session, a
	// page at a time. The cursor of a page is stable: a lease granted or ended meanwhile may appear
	// or vanish, but paging never repeats or skips a lease that stayed held throughout.
	ListLeases(ctx context.Context, q ListQuery) (LeasePage, error)
	// Revoke ends the lease of req.Key whoever holds it, minting a new epoch (so the old holder's
	// renew, release and check answer ErrLost), and records the revoke with req.Reason in the audit
	// log and as an EventRevoked. Revoking a free lease changes no epoch and answers Revoked false.
	// A positive req.Block blocks grants for that long: every Acquire fails with a *RetryError
	// wrapping ErrBlocked until it passes. A retried revoke answers as the first did.
	Revoke(ctx context.Context, req RevokeRequest) (RevokeResult, error)
	// Audit reads the audit log, newest first, filtered by user and session.
	Audit(ctx context.Context, q AuditQuery) (AuditPage, error)
}

// ListQuery selects leases to list. An empty User lists every user's leases.
type ListQuery struct {
	User   string
	Cursor string // from LeasePage.Next; empty for the first page
	Limit  int    // 1..MaxPageLimit; 0 means DefaultPageLimit
}

// Page limits of ListLeases and Audit.
const (
	DefaultPageLimit = 50
	MaxPageLimit     = 500
)

// LeasePage is one page of held leases.
type LeasePage struct {
	Leases []Lease
	Next   string // empty on the last page
}

// RevokeRequest asks to revoke the lease of Key.
type RevokeRequest struct {
	Key    Key
	Admin  string        // the sub of the admin who revokes (an identifier)
	Reason string        // why; required, at most MaxLabelLen printable characters
	Block  time.Duration // 0, or how long to block grants afterwards (bounded by the caller's config)
	// RequestID makes a retried revoke answer as the first did; optional.
	RequestID string
}

// RevokeResult is the answer to Revoke.
type RevokeResult struct {
	Revoked bool
	// Epoch is the epoch the revoke minted when Revoked, and the last epoch otherwise.
	Epoch int64
	// BlockedUntil is when grants open again; zero when nothing is blocked.
	BlockedUntil time.Time
	// Previous is the holder revoked; nil when the lease was free.
	Previous *Previous
}

// AuditAction names what an audit record records.
type AuditAction string

// Audit actions. Every state change of a lease is recorded, by the same atomic step that makes it.
const (
	AuditGrant    AuditAction = "grant"    // a free session was granted
	AuditTakeover AuditAction = "takeover" // a tab took the lease over from another
	AuditHandoff  AuditAction = "handoff"  // the lease moved by a handoff
	AuditRelease  AuditAction = "release"  // the holder released the lease
	AuditExpire   AuditAction = "expire"   // the lease expired without a renew
	AuditRevoke   AuditAction = "revoke"   // an admin revoked the lease
	AuditBlock    AuditAction = "block"    // an admin blocked grants for a while
)

// AuditRecord is one entry of the audit log.
type AuditRecord struct {
	ID     string // position in the log; opaque
	At     time.Time
	Key    Key
	Action AuditAction
	Epoch  int64 // the epoch after the change (for release and expire: the epoch that ended)
	// Actor is who made the change: the tab (TabID) for grant, takeover, handoff and release; the
	// admin's sub (Admin) for revoke and block; neither for expire.
	TabID string
	Admin string
	// Previous is the holder before the change, when there was one.
	Previous *Previous
	Reason   string
	// Until is the end of a block.
	Until time.Time
}

// AuditQuery selects audit records. Session requires User.
type AuditQuery struct {
	User    string
	Session string
	Cursor  string
	Limit   int
}

// AuditPage is one page of audit records, newest first.
type AuditPage struct {
	Records []AuditRecord
	Next    string
}
