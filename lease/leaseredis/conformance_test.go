package leaseredis_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/tablease/tablease/internal/redistest"
	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/lease/leaseredis"
	"github.com/tablease/tablease/lease/leasetest"
)

// conformanceOpTimeout is short so that the outage subtest, where every call waits for it, is
// quick, and long enough that a call on a loaded machine (the race detector, the other packages'
// tests beside it) is not cut short.
const conformanceOpTimeout = time.Second

// TestConformance runs the shared suite on a private redis-server of its own: the suite runs its
// subtests one after the other, so each Target may FLUSHALL it (LoseData) and pause it with SIGSTOP
// (Outage: the store hangs rather than refuses, the harder case, and keeps its data). Each Target
// also gets a key prefix of its own, so that no subtest could see another's keys or events (the
// users index and the audit logs included), and runs as an ACL user with the README's rules for
// that prefix (aclUser). Its Peer is a second engine, with a client of its own,
// on the same server and prefix, as a second tablease instance would be.
func TestConformance(t *testing.T) {
	srv := redistest.Start(t)
	n := 0
	leasetest.Run(t, func(t *testing.T, limits lease.Limits) leasetest.Target {
		n++
		opts := leaseredis.Options{
			Limits:         limits,
			Prefix:         fmt.Sprintf("conformance-%d", n),
			OpTimeout:      conformanceOpTimeout,
			PresenceTTL:    leasetest.ShortPresenceTTL,
			HandoffTimeout: leasetest.ShortHandoffTimeout,
			HandoffReserve: leasetest.ShortHandoffReserve,
		}
		newEngine := func(t *testing.T, opts leaseredis.Options) *leaseredis.Engine {
			return clientEngine(t, aclUser(t, srv.URL(), []*redistest.Server{srv}, opts.Prefix, false), conformanceOpTimeout, opts)
		}
		eng := newEngine(t, opts)
		return leasetest.Target{
			Engine: eng,
			LoseData: func(t *testing.T) lease.Store {
				srv.Flush(t)
				return eng
			},
			Outage: func(t *testing.T) func() {
				srv.Pause(t)
				return func() { srv.Resume(t) }
			},
			OpTimeout: conformanceOpTimeout,
			Peer:      func(t *testing.T) lease.Store { return newEngine(t, opts) },
			Limited: func(t *testing.T, perUser int) lease.Store {
				o := opts
				o.Prefix += "-limited"
				o.SessionsPerUser = perUser
				return newEngine(t, o)
			},
			Forgetting: func(t *testing.T, idle time.Duration, perUser int) lease.Store {
				o := opts
				o.Prefix += "-forgetting"
				o.IdleRetention, o.SessionsPerUser = idle, perUser
				return newEngine(t, o)
			},
			PresenceTTL:    leasetest.ShortPresenceTTL,
			HandoffTimeout: leasetest.ShortHandoffTimeout,
			HandoffReserve: leasetest.ShortHandoffReserve,
		}
	})
}

// clientEngine is an engine with opts on a client of url bounded by opTimeout. The client is
// closed in t.Cleanup; the engine is the caller's (the conformance suite closes its own).
func clientEngine(t *testing.T, url string, opTimeout time.Duration, opts leaseredis.Options) *leaseredis.Engine {
	t.Helper()
	client, err := leaseredis.NewClient(url, opTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	e, err := leaseredis.New(client, opts)
	if err != nil {
		t.Fatal(err)
	}
	return e
}
