package leaseredis_test

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
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
	var silence atomic.Int64
	eng := topologyEngine(t, sentinelURL(s), leaseredis.Options{Prefix: "heartbeat", OpTimeout: topologyOpTimeout,
		OnResubscribe: func(d time.Duration) { resubscribed.Add(1); silence.Store(int64(d)) }})
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
			// The silence told is the one measured, past the threshold it is judged by (twice the
			// operation timeout), not the threshold.
			if d := time.Duration(silence.Load()); d <= 2*topologyOpTimeout {
				t.Errorf("OnResubscribe was told a silence of %s, want more than %s", d, 2*topologyOpTimeout)
			}
			return
		case <-tick.C:
			_, _ = eng.Acquire(t.Context(), lease.AcquireRequest{Key: key, Holder: lease.Holder{TabID: "t-" + time.Now().Format("150405.000")}, Mode: lease.ModeTakeover})
		case <-ended:
			t.Fatal("the watch stayed open and silent 30 s after the failover, its subscription on the old primary")
		}
	}
}

// TestServerMismatchOfSentinels: a Sentinel URL whose master_name none of the Sentinels that answer
// knows is a mismatch that names them, and so is a URL of one server that reaches a Sentinel. The
// primary's name is not, nor a wrong one that no Sentinel answers, nor one that the user may not
// ask about. Replicas names the primary by the address that the Sentinels give.
func TestServerMismatchOfSentinels(t *testing.T) {
	s := redistest.StartSentinel(t)
	addrs := s.Addrs()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := l.Addr().String()
	l.Close()
	mismatch := func(url string) error {
		return topologyEngine(t, url, leaseredis.Options{OpTimeout: topologyOpTimeout}).ServerMismatch(t.Context())
	}

	url := "redis://" + addrs[0] + "/0?master_name=wrong&addr=" + down + "&addr=" + addrs[1]
	want := fmt.Sprintf("no Sentinel at %s knows a primary named \"wrong\"; set master_name to a name that SENTINEL MASTERS lists",
		strings.Join(slices.Sorted(slices.Values(addrs[:2])), ", "))
	if err := mismatch(url); err == nil || err.Error() != want {
		t.Errorf("ServerMismatch of a master_name the Sentinels do not know = %v, want %q", err, want)
	}
	if err := mismatch(sentinelURL(s)); err != nil {
		t.Errorf("ServerMismatch of the primary's master_name = %v, want none", err)
	}
	if err := mismatch("redis://" + down + "/0?master_name=wrong"); err != nil {
		t.Errorf("ServerMismatch of Sentinels that do not answer = %v, want none", err)
	}
	if err := s.Sentinels[0].Client(t).Do(t.Context(), "ACL", "SETUSER", "noask", "on", ">pw", "+@all", "-sentinel|get-master-addr-by-name").Err(); err != nil {
		t.Fatal(err)
	}
	if err := mismatch("redis://noask:pw@" + addrs[0] + "/0?master_name=wrong"); err != nil {
		t.Errorf("ServerMismatch as a Sentinel user who may not ask for the primary = %v, want none", err)
	}
	want = "the Sentinels at " + addrs[0] + " refused the URL's user and password (WRONGPASS"
	if err := mismatch("redis://noask:bad@" + addrs[0] + "/0?master_name=" + redistest.MasterName); err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("ServerMismatch with a password the Sentinel refuses = %v, want %q…", err, want)
	}
	want = "the primary refused the user and password of username= and password= (WRONGPASS"
	if err := mismatch(sentinelURL(s) + "&username=ghost&password=bad"); err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("ServerMismatch with a primary's password it refuses = %v, want %q…", err, want)
	}

	const sentinel = "the server is a Redis Sentinel; name the primary it monitors with master_name=<name>, and the other Sentinels with addr=<host:port>"
	if err := mismatch("redis://" + addrs[0] + "/0"); err == nil || err.Error() != sentinel {
		t.Errorf("ServerMismatch of a URL of one server that reaches a Sentinel = %v, want %q", err, sentinel)
	}

	if err := mismatch("redis://" + addrs[0] + "/1"); err == nil || !strings.HasPrefix(err.Error(), "the server does not know a command of tablease's") {
		t.Errorf("ServerMismatch of a URL of one server, database 1, that reaches a Sentinel = %v, want it refused", err)
	}

	primary := s.MasterAddr(t)
	want = "the server at " + primary + " is Redis, not Sentinel (SENTINEL is an unknown command): with master_name the URL names the Sentinels (port 26379 by default); to use one server, drop master_name"
	if err := mismatch("redis://" + primary + "/0?master_name=" + redistest.MasterName + "&addr=" + down); err == nil || err.Error() != want {
		t.Errorf("ServerMismatch of a master_name URL that names the primary = %v, want %q", err, want)
	}
	want = "the server at " + addrs[0] + " is outside a Redis Cluster (CLUSTER SLOTS answers no slot map); remove cluster=true"
	if err := mismatch("redis://" + addrs[0] + "?cluster=true"); err == nil || err.Error() != want {
		t.Errorf("ServerMismatch of cluster=true on a Sentinel = %v, want %q", err, want)
	}

	eng := topologyEngine(t, sentinelURL(s), leaseredis.Options{OpTimeout: topologyOpTimeout})
	if n, err := eng.Replicas(t.Context()); err != nil || !maps.Equal(n, map[string]int{s.MasterAddr(t): 1}) {
		t.Errorf("Replicas = %v, %v; want 1 of %s", n, err, s.MasterAddr(t))
	}
}
