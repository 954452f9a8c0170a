package api

import (
	"time"

	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/owner"
	"github.com/tablease/tablease/owner/catalog"
)

// The JSON views of the API's answers (docs/DESIGN.md §3): each a struct with its JSON names and
// the function that renders it from the domain type.

// timeLayout is RFC 3339 in UTC with milliseconds.
const timeLayout = "2006-01-02T15:04:05.000Z07:00"

// leaseJSON is the lease object of DESIGN §3.
type leaseJSON struct {
	SessionID    string      `json:"sessionId"`
	Held         bool        `json:"held"`
	Holder       *holderJSON `json:"holder"`    // null when free
	Epoch        int64       `json:"epoch"`     // the last epoch when free; 0 when never granted
	GrantedAt    *string     `json:"grantedAt"` // null when never granted
	ExpiresAt    *string     `json:"expiresAt"` // null when never granted
	TTLMs        int64       `json:"ttlMs"`
	RemainingMs  int64       `json:"remainingMs"`
	RenewAfterMs int64       `json:"renewAfterMs"`
	Transitions  int64       `json:"transitions"`
	Role         string      `json:"role,omitempty"` // only when the request named a tabId
	// Handoff is the handoff in progress: requested (the holder was asked to let go) or reserved
	// (the lease is free and kept for the requester); absent when there is none.
	Handoff *handoffJSON `json:"handoff,omitempty"`
	// BlockedUntil is when an admin's block of the session ends (grants are refused with
	// SESSION_BLOCKED until then); null when no block is in force.
	BlockedUntil *string `json:"blockedUntil"`
	// Token is the lease token, only in answers to the holder (acquire, renew).
	Token string `json:"token,omitempty"`
}

type holderJSON struct {
	TabID  string `json:"tabId"`
	Label  string `json:"label"`
	Hidden bool   `json:"hidden"`
}

type handoffJSON struct {
	State       string      `json:"state"` // "requested" or "reserved"
	Requester   *holderJSON `json:"requester"`
	Until       *string     `json:"until"`
	RemainingMs int64       `json:"remainingMs"`
}

// handoffView renders the handoff of l as of l.Now; nil when none is in progress.
func handoffView(l lease.Lease) *handoffJSON {
	h := handoffShown(l)
	if h == nil {
		return nil
	}
	return &handoffJSON{State: handoffState(h), Requester: holderView(h.Requester), Until: timeView(h.Until), RemainingMs: h.Until.Sub(l.Now).Milliseconds()}
}

// handoffShown is the handoff of l in progress as of l.Now; nil when there is none.
func handoffShown(l lease.Lease) *lease.HandoffState {
	if h := l.Handoff; h != nil && h.Until.After(l.Now) {
		return h
	}
	return nil
}

// handoffState is the state a handoff's view names: "requested" or "reserved".
func handoffState(h *lease.HandoffState) string {
	if h.Reserved {
		return "reserved"
	}
	return "requested"
}

// blockedUntilView renders the end of the block of l as of l.Now; nil when none is in force.
func blockedUntilView(l lease.Lease) *string {
	if !blockInForce(l) {
		return nil
	}
	return timeView(l.BlockedUntil)
}

// blockInForce reports whether an admin's block of l is in force as of l.Now.
func blockInForce(l lease.Lease) bool { return l.BlockedUntil.After(l.Now) }

func holderView(h lease.Holder) *holderJSON {
	return &holderJSON{TabID: h.TabID, Label: h.Label, Hidden: h.Hidden}
}

func timeView(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := t.UTC().Format(timeLayout)
	return &s
}

// leaseView renders l; tabID, when not empty, adds the role of that tab.
func leaseView(l lease.Lease, tabID string) *leaseJSON {
	out := &leaseJSON{
		SessionID:    l.Key.Session,
		Held:         l.Held,
		Epoch:        l.Epoch,
		GrantedAt:    timeView(l.GrantedAt),
		ExpiresAt:    timeView(l.ExpiresAt),
		TTLMs:        l.TTL.Milliseconds(),
		RemainingMs:  l.Remaining().Milliseconds(),
		RenewAfterMs: lease.RenewAfter(l.TTL).Milliseconds(),
		Transitions:  l.Transitions,
		Handoff:      handoffView(l),
		BlockedUntil: blockedUntilView(l),
	}
	if l.Held {
		out.Holder = holderView(l.Holder)
	}
	if tabID != "" {
		out.Role = string(owner.RoleFor(l, tabID))
	}
	return out
}

// adminLeaseJSON is a lease as admins see it: the lease object of DESIGN §3 with the user it
// belongs to, and never a lease token or a role.
type adminLeaseJSON struct {
	Sub string `json:"sub"`
	*leaseJSON
}

func adminLeaseView(l lease.Lease) adminLeaseJSON {
	return adminLeaseJSON{Sub: l.Key.User, leaseJSON: leaseView(l, "")}
}

type adminLeasePageJSON struct {
	Leases     []adminLeaseJSON `json:"leases"`
	NextCursor *string          `json:"nextCursor"` // null on the last page
}

// adminPreviousJSON names the holder before a change.
type adminPreviousJSON struct {
	TabID string `json:"tabId"`
	Epoch int64  `json:"epoch"`
}

func adminPreviousView(p *lease.Previous) *adminPreviousJSON {
	if p == nil {
		return nil
	}
	return &adminPreviousJSON{TabID: p.TabID, Epoch: p.Epoch}
}

type revokeJSON struct {
	Revoked bool `json:"revoked"`
	// Epoch is the epoch the revoke minted when revoked, the last epoch otherwise.
	Epoch        int64              `json:"epoch"`
	BlockedUntil *string            `json:"blockedUntil"` // null when nothing is blocked
	Previous     *adminPreviousJSON `json:"previous"`     // null when the lease was free
}

type auditRecordJSON struct {
	ID        string             `json:"id"`
	At        *string            `json:"at"`
	Sub       string             `json:"sub"`
	SessionID string             `json:"sessionId"`
	Action    string             `json:"action"`
	Epoch     int64              `json:"epoch"`
	TabID     *string            `json:"tabId"` // the acting tab: grant, takeover, handoff, release
	Admin     *string            `json:"admin"` // the acting admin: revoke, block
	Previous  *adminPreviousJSON `json:"previous"`
	Reason    *string            `json:"reason"`
	Until     *string            `json:"until"`     // the end of a block
	RequestID *string            `json:"requestId"` // the admin's request, as the log names it: revoke, block
}

type auditPageJSON struct {
	Records    []auditRecordJSON `json:"records"`
	NextCursor *string           `json:"nextCursor"`
}

func optString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func auditRecordView(r lease.AuditRecord) auditRecordJSON {
	return auditRecordJSON{
		ID:        r.ID,
		At:        timeView(r.At),
		Sub:       r.Key.User,
		SessionID: r.Key.Session,
		Action:    string(r.Action),
		Epoch:     r.Epoch,
		TabID:     optString(r.TabID),
		Admin:     optString(r.Admin),
		Previous:  adminPreviousView(r.Previous),
		Reason:    optString(r.Reason),
		Until:     timeView(r.Until),
		RequestID: optString(r.RequestID),
	}
}

// catalogViewJSON is the answer of GET /v1/sessions/{sid}/catalog.
type catalogViewJSON struct {
	Role    owner.Role     `json:"role"`
	Epoch   *int64         `json:"epoch,omitempty"` // only for the owner
	Version string         `json:"version"`
	Tools   []catalog.Tool `json:"tools"`
}
