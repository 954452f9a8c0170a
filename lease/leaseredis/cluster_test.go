package leaseredis_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
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
// primary is) or load the slot map, and the race subtests make 64 such calls at once, on a
// machine that runs the other packages' tests (and their Redis processes) beside them: at 1 s
// the concurrency subtest on Cluster timed out calls once under that load.
const topologyOpTimeout = 3 * time.Second

// topologyEngine is an engine with opts on a client of url (bounded by topologyOpTimeout), both
// closed in t.Cleanup.
func topologyEngine(t *testing.T, url string, opts leaseredis.Options) *leaseredis.Engine {
	t.Helper()
	e := clientEngine(t, url, topologyOpTimeout, opts)
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// topologyTarget is the conformance factory of a topology reached by url: each Target gets a key
// prefix of its own, LoseData flushes every primary, and Outage pauses every process (SIGSTOP), so
// that the store hangs and no failover starts. On a Cluster each Target runs as an ACL user with
// the README's rules for its prefix, on every node (aclUser).
func topologyTarget(url string, flush func(t testing.TB), nodes []*redistest.Server, cluster bool) leasetest.Factory {
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
		newEngine := func(t *testing.T, opts leaseredis.Options) *leaseredis.Engine {
			url := url
			if cluster {
				url = aclUser(t, url, nodes, opts.Prefix, true)
			}
			return clientEngine(t, url, topologyOpTimeout, opts)
		}
		eng := newEngine(t, opts)
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
			OpTimeout: topologyOpTimeout,
			Peer:      func(t *testing.T) lease.Store { return newEngine(t, opts) },
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
	}
}

// TestConformanceOnCluster runs the shared suite on a Redis Cluster of three primaries with a
// replica each, the sessions of the suite's users spread over its shards.
func TestConformanceOnCluster(t *testing.T) {
	c := redistest.StartCluster(t)
	leasetest.Run(t, topologyTarget(clusterURL(c), c.Flush, c.Nodes, true))
	t.Run("events travel only through the shard of their user", func(t *testing.T) { testShardedEvents(t, c) })
	t.Run("the next watch of a user reuses the subscription the last one left", func(t *testing.T) { testShardLinger(t, c) })
	t.Run("the sweep announces the expiries nobody watches on every shard", func(t *testing.T) { testClusterSweep(t, c) })
	t.Run("a revoke waits for the replica of its own shard", func(t *testing.T) { testClusterRevokeReplicas(t, c) })
	t.Run("a user who may not ask CLUSTER MYID is not ready, and leaves the events of the others alone", func(t *testing.T) { testNoClusterMyID(t, c) })
	t.Run("a node named without cluster=true is a mismatch", func(t *testing.T) {
		engine := func(url string) *leaseredis.Engine { return topologyEngine(t, url, leaseredis.Options{}) }
		if err := engine(c.Nodes[0].URL()).ServerMismatch(t.Context()); err == nil || !strings.Contains(err.Error(), "cluster=true") {
			t.Errorf("ServerMismatch = %v, want it to ask for cluster=true", err)
		}
		if err := engine(clusterURL(c)).ServerMismatch(t.Context()); err != nil {
			t.Errorf("ServerMismatch of the Cluster's URL = %v, want none", err)
		}
		node := c.Nodes[0].Addr()
		want := "the nodes at " + node + " refused the URL's user and password (WRONGPASS"
		if err := engine("redis://ghost:bad@" + node + "?cluster=true").ServerMismatch(t.Context()); err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("ServerMismatch with a password the nodes refuse = %v, want %q…", err, want)
		}
	})
}

// testShardLinger watches a session, stops, and watches it again: one SSUBSCRIBE in all.
func testShardLinger(t *testing.T, c *redistest.Cluster) {
	client, err := leaseredis.NewClient(clusterURL(c), topologyOpTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	eng, err := leaseredis.New(client, leaseredis.Options{Prefix: "linger", OpTimeout: topologyOpTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	before := commandCalls(t, c, "ssubscribe")
	for range 3 {
		w, err := eng.Watch(t.Context(), lease.Key{User: "lin", Session: "doc"}, "")
		if err != nil {
			t.Fatal(err)
		}
		w.Close()
	}
	if n := commandCalls(t, c, "ssubscribe") - before; n != 1 {
		t.Fatalf("three watches one after the other sent %d SSUBSCRIBEs, want 1", n)
	}
}

// commandCalls sums the calls of the command name over the nodes.
func commandCalls(t *testing.T, c *redistest.Cluster, name string) int {
	t.Helper()
	n := 0
	for _, node := range c.Nodes {
		n += redistest.CommandCalls(t, node.Client(t))[name]
	}
	return n
}

// testShardedEvents makes events for users spread over the shards, watched through another
// engine, and counts the Pub/Sub messages the nodes pass each other over the cluster bus (CLUSTER
// INFO): none for plain Pub/Sub, and for sharded Pub/Sub at most one per event (the primary of the
// user's shard to its replica). As a reference, the same number of plain PUBLISHes costs one
// message received by every other node each.
func testShardedEvents(t *testing.T, c *redistest.Cluster) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	newEngine := func() *leaseredis.Engine {
		client, err := leaseredis.NewClient(clusterURL(c), topologyOpTimeout)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = client.Close() })
		eng, err := leaseredis.New(client, leaseredis.Options{Prefix: "sharded", OpTimeout: topologyOpTimeout})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = eng.Close() })
		return eng
	}
	watcher, writer := newEngine(), newEngine()
	const users, rounds = 12, 5
	var watches []*lease.Watch
	for i := range users {
		w, err := watcher.Watch(ctx, lease.Key{User: fmt.Sprintf("user-%d", i), Session: "doc"}, "")
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		watches = append(watches, w)
	}

	before := busMessages(t, c)
	for r := range rounds {
		for i := range users {
			_, err := writer.Acquire(ctx, lease.AcquireRequest{Key: lease.Key{User: fmt.Sprintf("user-%d", i), Session: "doc"},
				Holder: lease.Holder{TabID: fmt.Sprintf("tab-%d", r)}, Mode: lease.ModeTakeover})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	for i, w := range watches {
		for r := range rounds {
			select {
			case ev := <-w.Events():
				if ev.Holder == nil || ev.Holder.TabID != fmt.Sprintf("tab-%d", r) {
					t.Fatalf("user-%d: event %+v, want the grant to tab-%d", i, ev, r)
				}
			case <-ctx.Done():
				t.Fatalf("user-%d: event %d did not arrive (watch: %v)", i, r, w.Err())
			}
		}
	}
	sharded := busMessages(t, c).minus(before)

	before = busMessages(t, c)
	client := c.Nodes[0].Client(t)
	for range users * rounds {
		if err := client.Publish(ctx, "sharded:reference", "x").Err(); err != nil {
			t.Fatal(err)
		}
	}
	plain := busMessages(t, c).minus(before)

	events := users * rounds
	t.Logf("%d events: sharded Pub/Sub passed %d messages over the cluster bus (by node: %v); as many plain PUBLISHes passed %d",
		events, sharded.total(), sharded, plain.total())
	if sharded.publish != 0 {
		t.Errorf("the events caused %d plain Pub/Sub messages over the cluster bus, want none", sharded.publish)
	}
	for addr, n := range sharded.perNode {
		if n > events {
			t.Errorf("node %s received %d sharded messages for %d events: events are not confined to their shard", addr, n, events)
		}
	}
}

// bus counts the Pub/Sub messages received over the cluster bus, per node.
type bus struct {
	publish int            // plain Pub/Sub, on every node
	perNode map[string]int // sharded Pub/Sub, by node
}

func (b bus) minus(o bus) bus {
	d := bus{publish: b.publish - o.publish, perNode: make(map[string]int)}
	for k, v := range b.perNode {
		d.perNode[k] = v - o.perNode[k]
	}
	return d
}

func (b bus) total() int {
	n := b.publish
	for _, v := range b.perNode {
		n += v
	}
	return n
}

func (b bus) String() string { return fmt.Sprint(b.perNode) }

// busMessages reads cluster_stats_messages_publish(shard)_received of every node.
func busMessages(t *testing.T, c *redistest.Cluster) bus {
	t.Helper()
	b := bus{perNode: make(map[string]int)}
	for _, n := range c.Nodes {
		info, err := n.Client(t).ClusterInfo(t.Context()).Result()
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(info, "\n") {
			k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
			x, _ := strconv.Atoi(v)
			switch k {
			case "cluster_stats_messages_publish_received":
				b.publish += x
			case "cluster_stats_messages_publishshard_received":
				b.perNode[n.Addr()] += x
			}
		}
	}
	return b
}

// testClusterSweep lets the leases of users spread over the shards expire where nobody watches
// and no call comes: the sweep of an engine whose period is a second records each expiry. The
// engine runs as an ACL user with the README's rules, which must allow the sweep's commands.
func testClusterSweep(t *testing.T, c *redistest.Cluster) {
	client, err := leaseredis.NewClient(aclUser(t, clusterURL(c), c.Nodes, "sweep", true), topologyOpTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	limits := lease.Limits{Min: 20 * time.Millisecond, Default: time.Second, Max: time.Minute, HiddenMax: time.Minute}
	eng, err := leaseredis.New(client, leaseredis.Options{Prefix: "sweep", OpTimeout: topologyOpTimeout,
		Limits: limits, IdleRetention: 4 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	ctx := t.Context()
	const users = 12
	for i := range users {
		k := lease.Key{User: fmt.Sprintf("user-%d", i), Session: "doc"}
		if _, err := eng.Acquire(ctx, lease.AcquireRequest{Key: k, Holder: lease.Holder{TabID: "tab-a"}, TTL: 20 * time.Millisecond}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		expired := map[string]bool{}
		q := lease.AuditQuery{}
		for {
			p, err := eng.Audit(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range p.Records {
				if r.Action == lease.AuditExpire {
					expired[r.Key.User] = true
				}
			}
			if p.Next == "" {
				break
			}
			q.Cursor = p.Next
		}
		if len(expired) == users {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("expiries recorded of %d users of %d after %v: %v", len(expired), users, 30*time.Second, expired)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// testClusterRevokeReplicas revokes the leases of users on every shard with RevokeReplicas 1,
// then with the replica of one user's shard stopped: only that user's revoke goes unconfirmed.
func testClusterRevokeReplicas(t *testing.T, c *redistest.Cluster) {
	const prefix = "replicas"
	client, err := leaseredis.NewClient(aclUser(t, clusterURL(c), c.Nodes, prefix, true), topologyOpTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	// WAIT gets three quarters of OpTimeout: as long as replicaOpTimeout (replicas_test.go).
	eng, err := leaseredis.New(client, leaseredis.Options{Prefix: prefix, OpTimeout: 3 * time.Second, RevokeReplicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	ctx := t.Context()
	revoke := func(user string) error {
		key := lease.Key{User: user, Session: "doc"}
		if _, err := eng.Acquire(ctx, lease.AcquireRequest{Key: key, Holder: lease.Holder{TabID: "tab-a"}}); err != nil {
			t.Fatal(err)
		}
		res, err := eng.Revoke(ctx, lease.RevokeRequest{Key: key, Admin: "root", Reason: "r"})
		if err == nil && !res.Revoked {
			t.Fatalf("the revoke of %s revoked nothing", user)
		}
		return err
	}
	// Users whose keys fall on every shard.
	shards := map[string]string{}
	for i := 0; len(shards) < 3 && i < 100; i++ {
		user := fmt.Sprintf("u%d", i)
		addr := c.PrimaryOf(t, prefix+":{"+user+"}:known").Addr()
		if _, ok := shards[addr]; !ok {
			shards[addr] = user
			if err := revoke(user); err != nil {
				t.Fatalf("the revoke of %s on %s: %v", user, addr, err)
			}
		}
	}
	if len(shards) != 3 {
		t.Fatalf("users on %d shards, want 3", len(shards))
	}
	want := map[string]int{}
	for addr := range shards {
		want[addr] = 1
	}
	if n, err := eng.Replicas(ctx); err != nil || !maps.Equal(n, want) {
		t.Fatalf("Replicas = %v, %v; want %v, each primary by its address", n, err, want)
	}
	stopped := c.PrimaryOf(t, prefix+":{u0}:known")
	replica := c.ReplicaOf(t, stopped)
	replica.Pause(t)
	defer replica.Resume(t)
	for addr, user := range shards {
		err := revoke(user)
		var re *lease.ReplicationError
		switch {
		case addr == stopped.Addr() && (!errors.As(err, &re) || re.Acked != 0 || re.Wanted != 1):
			t.Errorf("the revoke of %s, whose shard's replica is stopped: %v; want a ReplicationError of 0 of 1", user, err)
		case addr != stopped.Addr() && err != nil:
			t.Errorf("the revoke of %s on another shard: %v", user, err)
		}
	}
}

// testNoClusterMyID runs an engine as a user with the README's rules but +cluster|myid, first on
// a node whose library was just loaded: the library is shared by the node's users, and what that
// user could not learn (whether to publish sharded) must not decide for the others.
func testNoClusterMyID(t *testing.T, c *redistest.Cluster) {
	const prefix = "nomyid"
	key := lease.Key{User: "u1", Session: "doc"}
	primary := c.PrimaryOf(t, prefix+":{"+key.User+"}:lease:"+key.Session)
	if err := primary.Client(t).FunctionFlush(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	args := []any{"ACL", "SETUSER", "nomyid", "reset", "on", ">pw"}
	for _, r := range readmeACL(t, prefix, true) {
		if r != "+cluster|myid" {
			args = append(args, r)
		}
	}
	for _, n := range c.Nodes {
		if err := n.Client(t).Do(t.Context(), args...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	engine := func(url string) *leaseredis.Engine {
		return topologyEngine(t, url, leaseredis.Options{Prefix: prefix, OpTimeout: topologyOpTimeout})
	}
	addrs := c.Addrs()
	limited := engine("redis://nomyid:pw@" + addrs[0] + "?cluster=true&addr=" + strings.Join(addrs[1:], "&addr="))
	if _, err := limited.Acquire(t.Context(), lease.AcquireRequest{Key: key, Holder: lease.Holder{TabID: "t-limited"}, Mode: lease.ModeTry}); err != nil {
		t.Fatalf("the limited user's acquire: %v", err)
	}
	if err := limited.Ping(t.Context()); !errors.Is(err, lease.ErrUnavailable) {
		t.Errorf("Ping of a user without +cluster|myid = %v, want unavailable", err)
	}

	full := engine(aclUser(t, clusterURL(c), c.Nodes, prefix, true))
	w, err := full.Watch(t.Context(), key, "")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := full.Acquire(t.Context(), lease.AcquireRequest{Key: key, Holder: lease.Holder{TabID: "t-full"}, Mode: lease.ModeTakeover}); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-w.Events():
		if ev.Type != lease.EventTakenOver || ev.Holder == nil || ev.Holder.TabID != "t-full" {
			t.Fatalf("event %+v, want the takeover", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no event reached the watch of a user with the README's rules after a user without +cluster|myid ran first")
	}
}
