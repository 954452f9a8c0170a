package lease

// Store is what a lease engine is: the lease lifecycle (Engine), its events (Feed), the tabs
// present on each session (Presence) and the admin operations (Admin), all on one store.
// leasemem and leaseredis implement it, and leasetest checks every part of it.
type Store interface {
	Engine
	Feed
	Presence
	Admin
}
