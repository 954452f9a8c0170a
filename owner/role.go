package owner

import "github.com/tablease/tablease/lease"

// Role is what a tab may do in a session.
type Role string

const (
	// RoleOwner is the role of the tab that holds a valid lease: it may run mutation tools.
	RoleOwner Role = "owner"
	// RoleViewer is the role of every other tab: it may run read-only tools only.
	RoleViewer Role = "viewer"
)

// Valid reports whether r is RoleOwner or RoleViewer.
func (r Role) Valid() bool { return r == RoleOwner || r == RoleViewer }

// RoleFor is the role of tabID given the lease l as read from the store: owner when the tab holds
// the lease and it has time remaining at l.Now, viewer otherwise (also for an empty tabID).
func RoleFor(l lease.Lease, tabID string) Role {
	if tabID != "" && l.Held && l.Holder.TabID == tabID && l.Remaining() > 0 {
		return RoleOwner
	}
	return RoleViewer
}
