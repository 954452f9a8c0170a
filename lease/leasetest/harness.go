// Package leasetest is the conformance suite every lease.Engine must pass. Engines run it from
// their own tests:
//
//	func TestConformance(t *testing.T) {
//		leasetest.Run(t, func(t *testing.T, limits lease.Limits) leasetest.Target { … })
//	}
//
// Behaviour that only one engine has is a bug this suite should catch.
package leasetest

import (
	"testing"
	"time"

	"github.com/tablease/tablease/lease"
)

// Target is one engine under test, on a store of its own that starts empty.
type Target struct {
	Engine lease.Engine
	// LoseData makes the store lose every lease and counter, as a Redis restart without
	// persistence or a restarted memory engine would, and returns the engine to use afterwards
	// (the same one for Redis after FLUSHALL, a fresh one for memory).
	LoseData func(t *testing.T) lease.Engine
	// Outage makes the store unreachable until the returned restore func is called; nil for an
	// engine whose store cannot be unreachable (memory).
	Outage func(t *testing.T) (restore func())
	// OpTimeout is the engine's configured bound on one store operation; with the store
	// unreachable, every call must fail with lease.ErrUnavailable within about this long.
	OpTimeout time.Duration
}

// Factory makes a Target whose engine grants TTLs within limits. Close is the suite's job: it
// closes Target.Engine, and the engine LoseData returns when that is a different one, at the end
// of the subtest.
type Factory func(t *testing.T, limits lease.Limits) Target
