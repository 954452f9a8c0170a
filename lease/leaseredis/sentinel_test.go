package leaseredis_test

import (
	"testing"

	"github.com/tablease/tablease/internal/redistest"
	"github.com/tablease/tablease/lease/leasetest"
)

// TestConformanceOnSentinel runs the shared suite on a primary and its replica behind three
// sentinels, reached through the sentinels as a deployment would.
func TestConformanceOnSentinel(t *testing.T) {
	s := redistest.StartSentinel(t)
	nodes := append([]*redistest.Server{s.Primary, s.Replica}, s.Sentinels...)
	leasetest.Run(t, topologyTarget(sentinelURL(s), s.Primary.Flush, nodes, false))
}
