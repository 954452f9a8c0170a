package leaseredis_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tablease/tablease/internal/redistest"
	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/lease/leaseredis"
	"github.com/tablease/tablease/lease/leasetest"
)

// TestConformanceOnSentinel runs the shared suite on a primary and its replica behind three
// sentinels, reached through the sentinels as a deployment would.
func TestConformanceOnSentinel(t *testing.T) {
	s := redistest.StartSentinel(t)
	nodes := append([]*redistest.Server{s.Primary, s.Replica}, s.Sentinels...)
	leasetest.Run(t, topologyTarget(sentinelURL(s), s.Primary.Flush, nodes, false))
}

// TestAWatchStartsOverWhenItsSubscriptionNoLongerHearsTheWrites fails the primary over while
// the old one keeps running as a primary (the sentinels may not demote it: a partition between
// them and it, played by an ACL rule). go-redis moves the engine's commands to the new primary,
// but not its subscription, which stays on the old one and hears nothing of what is published
// now: the engine's heartbeat notices, and the watch starts over (lease.ErrResync) instead of
// staying silent for good.
func TestAWatchStartsOverWhenItsSubscriptionNoLongerHearsTheWrites(t *testing.T) {
	s := redistest.StartSentinel(t)
	var resubscribed atomic.Int32
	eng := topologyEngine(t, sentinelURL(s), leaseredis.Options{Prefix: "heartbeat", OpTimeout: topologyOpTimeout,
		OnResubscribe: func(time.Duration) { resubscribed.Add(1) }})
	key := lease.Key{User: "u1", Session: "doc"}
	w, err := eng.Watch(t.Context(), key, "")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()

	old := s.Primary
	if err := old.Client(t).Do(t.Context(), "ACL", "SETUSER", "default", "-replicaof", "-slaveof").Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Sentinels[0].Client(t).Do(t.Context(), "SENTINEL", "FAILOVER", redistest.MasterName).Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for s.MasterAddr(t) != s.Replica.Addr() || !redistest.IsPrimary(s.Replica) {
		if time.Now().After(deadline) {
			t.Fatal("the sentinels did not promote the replica")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Changes go on, through the new primary once the engine follows the sentinels.
	ended := time.After(30 * time.Second)
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case _, ok := <-w.Events():
			if ok {
				continue // heard before the subscription went deaf
			}
			if !errors.Is(w.Err(), lease.ErrResync) {
				t.Fatalf("the watch ended with %v, want lease.ErrResync", w.Err())
			}
			if n := resubscribed.Load(); n != 1 {
				t.Errorf("OnResubscribe was called %d times, want once", n)
			}
			return
		case <-tick.C:
			_, _ = eng.Acquire(t.Context(), lease.AcquireRequest{Key: key, Holder: lease.Holder{TabID: "t-" + time.Now().Format("150405.000")}, Mode: lease.ModeTakeover})
		case <-ended:
			t.Fatal("the watch stayed open and silent 30 s after the failover, its subscription on the old primary")
		}
	}
}
