package lease

import (
	"context"
	"encoding/base64"
	"strconv"
	"strings"
	"time"
)

// Admin is what an engine offers administrators: listing leases, revoking and blocking, and the
// audit log. Engines implement it beside Engine; the api serves it under /v1/admin with scope
// lease:admin. Engines that implement it pass the admin part of leasetest.Run.
//
// Errors: a bad argument is an *InvalidError (ErrInvalid; see the Validate methods below, which
// every engine calls first); store trouble is an *UnavailableError (ErrUnavailable), and a revoke
// that fails with it may or may not have happened (retry it with the same RequestID).
type Admin interface {
	// ListLeases lists the leases held at the store's clock (a lease whose ExpiresAt has come is
	// not listed), ordered by user and then session (Key.Compare), a page at a time. Each page
	// starts strictly after the key its cursor names, so the cursor is stable: a lease granted or
	// ended meanwhile may appear or vanish, but paging never repeats or skips a lease that stayed
	// held throughout. A page holds Limit leases unless it is the last. It announces nothing (no
	// EventExpired).
	ListLeases(ctx context.Context, q ListQuery) (LeasePage, error)
	// Revoke ends the lease of req.Key whoever holds it, in one atomic step: it announces an
	// expiry that was not announced yet (as every call does, see Feed), then, when a tab holds the
	// lease, mints a new epoch (NextEpoch), clears the holder and appends both an AuditRevoke record
	// and an EventRevoked{Epoch: the new epoch, Holder: nil, Previous: the holder, Reason}. The old
	// holder's renew, release and check then answer ErrLost, and no EventExpired ever follows for
	// either epoch. Afterwards the lease is free at the new epoch: Get answers Held false, that
	// Epoch, one more Transition (a revoke mints an epoch like a grant), and GrantedAt and
	// ExpiresAt at the time of the revoke. The next grant gets a higher epoch still.
	//
	// Revoking a free lease (never held, released or expired) changes no epoch, appends no record
	// and no event, and answers Revoked false with the last epoch.
	//
	// A revoke (that is not a retry) ends the handoff in progress, if any (see ModeHandoff): a
	// pending request with the lease it revokes, and the reservation of a free lease, silently.
	//
	// A positive req.Block blocks grants until the revoke's time plus Block (BlockedUntil): every
	// Acquire, in any mode and by any tab, fails with &RetryError{Err: ErrBlocked, RetryAfter: the
	// time left} until then. A block is recorded as an AuditBlock (after the AuditRevoke, when the
	// same call revokes), also on a free lease. A new block replaces the session's block, whether
	// it ends earlier or later; a zero Block leaves the current block as it is. A blocked session
	// is always free: the revoke that blocks it ends its lease first, and nothing grants it.
	//
	// A revoke with a RequestID is answered once: a revoke with the Admin and RequestID of a
	// revoke of the session within RevokeRetryWindow changes nothing and answers exactly what that
	// one answered, whatever happened since, other revokes of the session included.
	// This holds for a revoke that found the lease free too, so that a retry never revokes a tab
	// that was granted the lease after the first attempt.
	//
	// An engine told to confirm revokes on replicas (leaseredis.Options.RevokeReplicas) answers
	// only once they confirmed it, and a *ReplicationError when too few did in time: the revoke
	// took effect on the primary, and a retry with the same RequestID answers as it did once they
	// confirm it.
	Revoke(ctx context.Context, req RevokeRequest) (RevokeResult, error)
	// Audit reads the audit log, newest first, filtered by user and session, a page at a time.
	// The records of one user come in exactly the reverse order of the changes they record (an
	// expiry is recorded when it is announced, see Feed); records of different users come by the
	// time they were appended, to the millisecond. Each page starts strictly after the record its
	// cursor names: records appended meanwhile never show up on later pages, and records dropped
	// meanwhile (retention, see DefaultAuditRetention) are skipped. A page holds Limit records
	// unless it is the last.
	Audit(ctx context.Context, q AuditQuery) (AuditPage, error)
	// RecordCatalog appends an AuditCatalog record of a change of the tool catalog by admin, to
	// admin's own log (Key: admin and CatalogSession), as an admin's record (see
	// DefaultAuditMaxRecords), with reason saying what changed (ValidateReason). The change itself
	// is the document store's; the caller records it once the store took it.
	RecordCatalog(ctx context.Context, admin, reason string) error
}

// CatalogSession is the Key.Session of AuditCatalog records: not a session, the tool catalog.
const CatalogSession = "catalog"

// ValidateCatalogRecord checks the arguments of Admin.RecordCatalog.
func ValidateCatalogRecord(admin, reason string) error {
	if err := ValidateID("admin", admin); err != nil {
		return err
	}
	return ValidateReason(reason)
}

// Audit log bounds. Engines keep each user's audit records for DefaultAuditRetention, and at most
// DefaultAuditMaxRecords records of the user's own actions (grant, takeover, handoff, release,
// expire) and, apart, at most as many of admins' actions (revoke, block), unless configured
// otherwise; the oldest of each kind are dropped first, so a user's own actions never push an
// admin's records out (Redis trims in whole stream nodes, and may keep up to a hundred more). The
// records of a user outlive the user's session state.
const (
	DefaultAuditRetention  = 7 * 24 * time.Hour
	DefaultAuditMaxRecords = 10_000
)

// RevokeRetryWindow is how long, at least, an engine remembers each revoke with a RequestID, to
// answer its retries.
const RevokeRetryWindow = 10 * time.Minute

// ListQuery selects leases to list. An empty User lists every user's leases.
type ListQuery struct {
	User   string // an identifier, or empty
	Cursor string // from LeasePage.Next (see LeaseCursor); empty for the first page
	Limit  int    // 1..MaxPageLimit; 0 means DefaultPageLimit
}

// Page limits of ListLeases and Audit.
const (
	DefaultPageLimit = 50
	MaxPageLimit     = 500
)

// LeasePage is one page of held leases.
type LeasePage struct {
	Leases []Lease // each with its Key and Now
	Next   string  // empty on the last page
}

// RevokeRequest asks to revoke the lease of Key.
type RevokeRequest struct {
	Key   Key
	Admin string // the sub of the admin who revokes (an identifier)
	// Reason says why: required, not blank, at most MaxLabelLen printable characters.
	Reason string
	// Block is 0, or how long to block grants afterwards: whole milliseconds, bounded by the
	// caller's configuration.
	Block time.Duration
	// RequestID makes a retried revoke answer as the first did (see Admin.Revoke); optional, an
	// identifier when set.
	RequestID string
	// AuditRequestID is the id under which the caller logs this request (its X-Request-ID, or
	// one made up for it), kept in the revoke's audit records so that they lead to its log
	// lines; optional, an identifier when set.
	AuditRequestID string
}

// RevokeResult is the answer to Revoke.
type RevokeResult struct {
	Revoked bool
	// Epoch is the epoch the revoke minted when Revoked, and the last epoch otherwise.
	Epoch int64
	// BlockedUntil is when grants open again, whether this revoke or an earlier one blocked
	// them; zero when grants are not blocked.
	BlockedUntil time.Time
	// Previous is the holder revoked; nil when the lease was free.
	Previous *Previous
	// Retried is true when the call was a retry of a revoke with the same RequestID, answered as
	// that revoke was, which it did not repeat.
	Retried bool
}

// AuditAction names what an audit record records.
type AuditAction string

// Audit actions. Every state change of a lease is recorded, by the same atomic step that makes it.
// A handoff shows as the holder's release (or expiry) and then the requester's AuditHandoff; the
// request itself, its lapse and the end of a reservation change no holder and are not recorded.
const (
	AuditGrant    AuditAction = "grant"    // a free session was granted, or the holder a new epoch
	AuditTakeover AuditAction = "takeover" // a tab took the lease over from another
	AuditHandoff  AuditAction = "handoff"  // the requester claimed a handoff reservation (see ModeHandoff)
	AuditRelease  AuditAction = "release"  // the holder released the lease
	AuditExpire   AuditAction = "expire"   // the lease expired without a renew
	AuditRevoke   AuditAction = "revoke"   // an admin revoked the lease
	AuditBlock    AuditAction = "block"    // an admin blocked grants for a while
	AuditCatalog  AuditAction = "catalog"  // an admin replaced the tool catalog (see Admin.RecordCatalog)
)

// AuditRecord is one entry of the audit log.
type AuditRecord struct {
	ID string // position in the log; opaque and unique
	// At is the store time of the change; for expire, the lease's ExpiresAt (the record is
	// appended when the expiry is announced, which may be later).
	At     time.Time
	Key    Key
	Action AuditAction
	Epoch  int64 // the epoch after the change (for release and expire: the epoch that ended)
	// Actor is who made the change: the tab (TabID) for grant, takeover, handoff and release; the
	// admin's sub (Admin) for revoke and block; neither for expire.
	TabID string
	Admin string
	// Previous is the holder before the change, when there was one: the tab taken over (takeover),
	// the tab that handed the lease over and its epoch (handoff), the tab that released or whose
	// lease expired, at the epoch that ended (release, expire), the holder revoked (revoke), the
	// holder at its old epoch (the grant of a new epoch to the holder itself); nil for the grant
	// of a free session and for block.
	Previous *Previous
	Reason   string // the admin's, for revoke and block; what changed, for catalog; empty otherwise
	// Until is the end of a block; zero for the other actions.
	Until time.Time
	// RequestID is the id of the admin's request that made the change (revoke, block: the
	// RevokeRequest's AuditRequestID), as its log lines name it; empty otherwise.
	RequestID string
}

// AuditQuery selects audit records. Session requires User (sessions are namespaced by user).
type AuditQuery struct {
	User    string // an identifier, or empty for every user
	Session string // an identifier, or empty for every session of User
	Cursor  string // from AuditPage.Next; empty for the first page
	Limit   int    // 1..MaxPageLimit; 0 means DefaultPageLimit
}

// AuditPage is one page of audit records, newest first.
type AuditPage struct {
	Records []AuditRecord
	Next    string // empty on the last page
}

// Compare orders keys by user, then by session, byte by byte: the order of ListLeases. It is not
// the order of the keys joined with a separator ("a"/"z" comes before "a-b"/"c").
func (k Key) Compare(other Key) int {
	if c := strings.Compare(k.User, other.User); c != 0 {
		return c
	}
	return strings.Compare(k.Session, other.Session)
}

// LeaseCursor is the cursor of a ListLeases page whose last lease is last: the next page starts
// strictly after it. Cursors are printable ASCII without spaces (base64url), opaque to clients.
func LeaseCursor(last Key) string {
	return base64.RawURLEncoding.EncodeToString([]byte(last.User + "/" + last.Session))
}

// ParseLeaseCursor reads a cursor made by LeaseCursor. It fails with an *InvalidError for
// anything else.
func ParseLeaseCursor(cursor string) (Key, error) {
	bad := &InvalidError{Field: "cursor", Reason: "must be the next cursor of an earlier page"}
	raw, err := base64.RawURLEncoding.DecodeString(cursor)
	if err != nil {
		return Key{}, bad
	}
	user, session, ok := strings.Cut(string(raw), "/")
	k := Key{User: user, Session: session}
	if !ok || k.Validate() != nil {
		return Key{}, bad
	}
	return k, nil
}

// Validate checks the user filter and the limit of a ListQuery, and returns the limit with the
// default applied. The cursor is checked by ParseLeaseCursor.
func (q ListQuery) Validate() (int, error) {
	if q.User != "" {
		if err := ValidateID("sub", q.User); err != nil {
			return 0, err
		}
	}
	return pageLimit(q.Limit)
}

// Validate checks the filters and the limit of an AuditQuery, and returns the limit with the
// default applied. The cursor is the engine's to read: one it cannot read is an *InvalidError.
func (q AuditQuery) Validate() (int, error) {
	if q.User != "" {
		if err := ValidateID("sub", q.User); err != nil {
			return 0, err
		}
	}
	if q.Session != "" {
		if q.User == "" {
			return 0, &InvalidError{Field: "sessionId", Reason: "needs a user: sessions are namespaced by user"}
		}
		if err := ValidateID("sessionId", q.Session); err != nil {
			return 0, err
		}
	}
	return pageLimit(q.Limit)
}

func pageLimit(limit int) (int, error) {
	switch {
	case limit == 0:
		return DefaultPageLimit, nil
	case limit < 0 || limit > MaxPageLimit:
		return 0, &InvalidError{Field: "limit", Reason: "must be from 1 to " + strconv.Itoa(MaxPageLimit) + ", or 0 for the default"}
	}
	return limit, nil
}

// Validate checks the key, admin, reason, block and request id of a revoke.
func (r RevokeRequest) Validate() error {
	if err := r.Key.Validate(); err != nil {
		return err
	}
	if err := ValidateID("admin", r.Admin); err != nil {
		return err
	}
	if err := ValidateReason(r.Reason); err != nil {
		return err
	}
	if r.Block < 0 || r.Block%time.Millisecond != 0 {
		return &InvalidError{Field: "blockMs", Reason: "must be zero or a positive whole number of milliseconds"}
	}
	if r.RequestID != "" {
		if err := ValidateID("requestId", r.RequestID); err != nil {
			return err
		}
	}
	if r.AuditRequestID != "" {
		if err := ValidateID("auditRequestId", r.AuditRequestID); err != nil {
			return err
		}
	}
	return nil
}
