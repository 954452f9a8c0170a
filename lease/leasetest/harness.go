// Package leasetest is the conformance suite every lease.Store must pass. Engines run it from
// their own tests:
//
//	func TestConformance(t *testing.T) {
//		leasetest.Run(t, func(t *testing.T, limits lease.Limits) leasetest.Target { … })
//	}
//
// Behaviour that only one engine has is a bug this suite should catch: every part of it (leases,
// events and presence, admin operations, handoffs) runs against every engine.
package leasetest

import (
	"testing"
	"time"

	"github.com/tablease/tablease/lease"
)

// Target is one engine under test, on a store of its own that starts empty.
type Target struct {
	Engine lease.Store
	// LoseData makes the store lose every lease and counter, as a Redis restart without
	// persistence or a restarted memory engine would, and returns the engine to use afterwards
	// (the same one for Redis after FLUSHALL, a fresh one for memory).
	LoseData func(t *testing.T) lease.Store
	// Outage makes the store unreachable until the returned restore func is called; nil for an
	// engine whose store cannot be unreachable (memory).
	Outage func(t *testing.T) (restore func())
	// OpTimeout is the engine's configured bound on one store operation; with the store
	// unreachable, every call must fail with lease.ErrUnavailable within about this long.
	OpTimeout time.Duration

	// Peer returns another engine on the same store, as a second tablease instance on the same
	// Redis would have, with the same limits and options (the same key prefix, and a client and
	// expiry timer of its own); nil for a store that cannot be shared (memory). The suite closes
	// it. The tests across instances skip without it.
	Peer func(t *testing.T) lease.Store
	// PresenceTTL is the time to live the engine gives presence entries. The test of presence
	// expiry needs it short (at most MaxPresenceTTL; ShortPresenceTTL is a good choice) and skips
	// otherwise.
	PresenceTTL time.Duration
	// HandoffTimeout and HandoffReserve are the handoff timeout and reserve window the engine was
	// configured with (see lease.ModeHandoff). The handoff part of the suite needs both, at most
	// MaxHandoffWait (ShortHandoffTimeout and ShortHandoffReserve are good choices), and fails
	// without them.
	HandoffTimeout time.Duration
	HandoffReserve time.Duration

	// Limited returns an engine configured like Engine but bounding the sessions of each user at
	// perUser (see lease.ErrTooManySessions), on an empty store of its own. The suite closes it.
	// The test of the bound skips without it.
	Limited func(t *testing.T, perUser int) lease.Store
	// Forgetting returns an engine configured like Engine but keeping the state of a session for
	// idle after the last thing in it ended (see lease.DefaultIdleRetention) and bounding the
	// sessions of each user at perUser, on an empty store of its own. The suite closes it. The
	// test of when sessions are forgotten fails without it.
	Forgetting func(t *testing.T, idle time.Duration, perUser int) lease.Store
}

const (
	// ShortPresenceTTL is the presence TTL factories should configure for the suite.
	ShortPresenceTTL = time.Second
	// MaxPresenceTTL is the longest presence TTL the suite waits for.
	MaxPresenceTTL = 3 * time.Second

	// ShortHandoffTimeout and ShortHandoffReserve are the handoff timeout and reserve window
	// factories should configure for the suite: long enough for a few calls on a loaded machine,
	// short enough to wait for.
	ShortHandoffTimeout = 2 * time.Second
	ShortHandoffReserve = 2 * time.Second
	// MaxHandoffWait is the longest handoff timeout or reserve window the suite waits for.
	MaxHandoffWait = 5 * time.Second
)

// Factory makes a Target whose engine grants TTLs within limits. Close is the suite's job: it
// closes Target.Engine, and the engine LoseData returns when that is a different one, at the end
// of the subtest.
type Factory func(t *testing.T, limits lease.Limits) Target
