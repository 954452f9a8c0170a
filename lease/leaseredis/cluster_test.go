package leaseredis_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tablease/tablease/internal/redistest"
	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/lease/leaseredis"
	"github.com/tablease/tablease/lease/leasetest"
)

// clusterURL is the URL of c as an operator writes it: one node, the others as addr options.
func clusterURL(c *redistest.Cluster) string {
	addrs := c.Addrs()
	return "redis://" + addrs[0] + "?cluster=true&addr=" + strings.Join(addrs[1:], "&addr=")
}

// sentinelURL is the URL of s as an operator writes it: one sentinel, the others as addr options.
func sentinelURL(s *redistest.Sentinel) string {
	addrs := s.Addrs()
	return "redis://" + addrs[0] + "?master_name=" + redistest.MasterName + "&addr=" + strings.Join(addrs[1:], "&addr=")
}

// topologyOpTimeout bounds each store operation on a topology. It is longer than on one server: a
// new client's first calls dial through the sentinels (every new connection asks them where the
// primary is) or load the slot map, and the race subtests make 64 such calls at once.
const topologyOpTimeout = time.Second

// topologyTarget is the conformance factory of a topology reached by url: each Target gets a key
// prefix of its own, LoseData flushes every primary, and Outage pauses every process (SIGSTOP), so
// that the store hangs and no failover starts.
func topologyTarget(url string, flush func(t testing.TB), nodes []*redistest.Server) leasetest.Factory {
	n := 0
	return func(t *testing.T, limits lease.Limits) leasetest.Target {
		n++
		opts := leaseredis.Options{
			Limits:         limits,
			Prefix:         fmt.Sprintf("conformance-%d", n),
			OpTimeout:      topologyOpTimeout,
			PresenceTTL:    leasetest.ShortPresenceTTL,
			HandoffTimeout: leasetest.ShortHandoffTimeout,
			HandoffReserve: leasetest.ShortHandoffReserve,
		}
		newEngine := func(t *testing.T) *leaseredis.Engine {
			client, err := leaseredis.NewClient(url, topologyOpTimeout)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = client.Close() })
			eng, err := leaseredis.New(client, opts)
			if err != nil {
				t.Fatal(err)
			}
			return eng
		}
		eng := newEngine(t)
		return leasetest.Target{
			Engine: eng,
			LoseData: func(t *testing.T) lease.Store {
				flush(t)
				return eng
			},
			Outage: func(t *testing.T) func() {
				for _, s := range nodes {
					s.Pause(t)
				}
				return func() {
					for _, s := range nodes {
						s.Resume(t)
					}
				}
			},
			OpTimeout:      topologyOpTimeout,
			Peer:           func(t *testing.T) lease.Store { return newEngine(t) },
			PresenceTTL:    leasetest.ShortPresenceTTL,
			HandoffTimeout: leasetest.ShortHandoffTimeout,
			HandoffReserve: leasetest.ShortHandoffReserve,
		}
	}
}

// TestConformanceOnCluster runs the shared suite on a Redis Cluster of three primaries with a
// replica each, the sessions of the suite's users spread over its shards.
func TestConformanceOnCluster(t *testing.T) {
	c := redistest.StartCluster(t)
	leasetest.Run(t, topologyTarget(clusterURL(c), c.Flush, c.Nodes))
}
