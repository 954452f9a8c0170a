package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Timing of the topologies: a Cluster node that stops answering for NodeTimeout is failed over,
// and Redis Cluster promotes its replica within about two node timeouts. Sentinel fails over a
// primary that answered no PING for SentinelDownAfter, plus an election. Both are a few times the
// period at which the nodes ping each other (Sentinel: a second; Cluster: half the node timeout),
// so that a late answer on a loaded machine (tests run beside -race builds on two cores) is not
// taken for a failure: a failover of a healthy primary loses the writes its replica has not
// received yet, and may promote a replica that has not synced at all.
const (
	NodeTimeout       = 3 * time.Second
	SentinelDownAfter = 3 * time.Second
	sentinelFailover  = 2 * time.Second  // failover-timeout: a failed attempt is retried after twice this
	topologyTimeout   = 30 * time.Second // bound on forming a topology or waiting for a failover
)

// role makes a Server a node of a topology.
type role struct {
	conf    string // a config file, read first (a sentinel's: Sentinel rewrites it)
	cluster bool   // a Cluster node: --cluster-enabled with a bus port of its own
	busPort int    // the cluster bus port, picked with the client port
	replica string // host:port of the primary this server replicates at its first start
	// sentinel marks a sentinel: --sentinel, and none of the server options that would not apply.
	sentinel bool
}

// args are the arguments that follow the common ones.
func (r *role) args() []string {
	var a []string
	if r.cluster {
		a = append(a, "--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", strconv.Itoa(int(NodeTimeout.Milliseconds())),
			"--cluster-port", strconv.Itoa(r.busPort))
	}
	if r.replica != "" {
		host, port, _ := net.SplitHostPort(r.replica)
		a = append(a, "--replicaof", host, port)
	}
	if r.sentinel {
		a = append(a, "--sentinel")
	} else {
		// A replica that joins syncs at once, not after the default 5 s that a primary waits for
		// more replicas: until it has synced, a failover to it would lose the data.
		a = append(a, "--repl-diskless-sync-delay", "0")
	}
	return a
}

// startNode starts a node of a topology in a directory of its own, stopped in t.Cleanup.
func startNode(t testing.TB, r *role, conf string) *Server {
	t.Helper()
	bin, err := lookPath("tests of Redis Cluster and Sentinel need it")
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	s := &Server{bin: bin, dir: t.TempDir(), dbs: 16, role: r}
	if conf != "" {
		r.conf = filepath.Join(s.dir, "sentinel.conf")
		if err := os.WriteFile(r.conf, []byte(conf), 0o600); err != nil {
			t.Fatalf("redistest: %v", err)
		}
	}
	t.Cleanup(func() {
		if err := s.kill(); err != nil {
			t.Errorf("redistest: stopping redis-server: %v", err)
		}
	})
	if err := s.start(); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return s
}

// Cluster is a Redis Cluster of three primaries with one replica each, on loopback ports, with a
// node timeout of NodeTimeout; its nodes are stopped in t.Cleanup. A node may be stopped
// (Server.Stop) to make the Cluster fail over, and restarted, when it rejoins as a replica.
type Cluster struct {
	Nodes []*Server // every node, in the order redis-cli was given them
}

// StartCluster starts the six nodes, forms the Cluster with redis-cli --cluster create and waits
// until every node sees every slot served and every replica in sync.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("redistest: redis-cli is not in PATH (%v): install Redis 7 or later (apt-get install redis-server; it comes with redis-tools)", err)
	}
	c := &Cluster{}
	for range 6 {
		c.Nodes = append(c.Nodes, startNode(t, &role{cluster: true}, ""))
	}
	args := []string{"--cluster", "create"}
	args = append(args, c.Addrs()...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), topologyTimeout)
	defer cancel()
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	c.WaitHealthy(t)
	return c
}

// Addrs are the host:port of every node.
func (c *Cluster) Addrs() []string {
	var a []string
	for _, n := range c.Nodes {
		a = append(a, n.Addr())
	}
	return a
}

// running answers the nodes that run.
func (c *Cluster) running() []*Server {
	var r []*Server
	for _, n := range c.Nodes {
		n.mu.Lock()
		up := n.proc != nil
		n.mu.Unlock()
		if up {
			r = append(r, n)
		}
	}
	return r
}

// WaitHealthy waits until every running node answers cluster_state:ok, sees all 16384 slots
// served by running primaries, and every running replica is in sync with its primary. It fails the
// test after a while.
func (c *Cluster) WaitHealthy(t testing.TB) {
	t.Helper()
	if err := poll(topologyTimeout, func() error { return c.healthy() }); err != nil {
		t.Fatalf("redistest: the Cluster did not become healthy: %v", err)
	}
}

func (c *Cluster) healthy() error {
	up := c.running()
	alive := make(map[string]bool)
	for _, n := range up {
		alive[n.Addr()] = true
	}
	for _, n := range up {
		info, err := command(n.Addr(), "cluster", "info")
		if err != nil {
			return err
		}
		if !strings.Contains(info.(string), "cluster_state:ok") {
			return fmt.Errorf("%s: cluster_state is not ok", n.Addr())
		}
		shards, err := clusterShards(n.Addr())
		if err != nil {
			return err
		}
		total := 0
		for _, sh := range shards {
			primary := shardPrimary(sh)
			for _, r := range sh.Slots {
				total += int(r.End - r.Start + 1)
				if !alive[primary] {
					return fmt.Errorf("%s: slots %d-%d are served by %q, which is down", n.Addr(), r.Start, r.End, primary)
				}
			}
		}
		if total != 16384 {
			return fmt.Errorf("%s sees %d slots served", n.Addr(), total)
		}
		repl, err := command(n.Addr(), "info", "replication")
		if err != nil {
			return err
		}
		r := repl.(string)
		if strings.Contains(r, "role:slave") && !strings.Contains(r, "master_link_status:up") {
			return fmt.Errorf("%s: a replica not in sync", n.Addr())
		}
	}
	return nil
}

// clusterShards answers CLUSTER SHARDS of the node at addr.
func clusterShards(addr string) ([]redis.ClusterShard, error) {
	cl := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true, MaxRetries: -1})
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	return cl.ClusterShards(ctx).Result()
}

// shardPrimary answers the host:port of the primary of sh that is online, or "".
func shardPrimary(sh redis.ClusterShard) string {
	for _, n := range sh.Nodes {
		if n.Role == "master" && n.Health == "online" {
			return net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10))
		}
	}
	return ""
}

// PrimaryOf answers the running node that serves key as a primary, as the running nodes agree.
func (c *Cluster) PrimaryOf(t testing.TB, key string) *Server {
	t.Helper()
	up := c.running()
	if len(up) == 0 {
		t.Fatal("redistest: no node of the Cluster runs")
	}
	v, err := command(up[0].Addr(), "cluster", "keyslot", key)
	if err != nil {
		t.Fatalf("redistest: CLUSTER KEYSLOT: %v", err)
	}
	slot := v.(int64)
	shards, err := clusterShards(up[0].Addr())
	if err != nil {
		t.Fatalf("redistest: CLUSTER SHARDS: %v", err)
	}
	for _, sh := range shards {
		for _, r := range sh.Slots {
			if slot >= r.Start && slot <= r.End {
				for _, n := range c.Nodes {
					if n.Addr() == shardPrimary(sh) {
						return n
					}
				}
			}
		}
	}
	t.Fatalf("redistest: no primary serves slot %d", slot)
	return nil
}

// ReplicaOf answers the node that replicates primary, as primary's replication info says.
func (c *Cluster) ReplicaOf(t testing.TB, primary *Server) *Server {
	t.Helper()
	v, err := command(primary.Addr(), "info", "replication")
	if err != nil {
		t.Fatalf("redistest: INFO replication: %v", err)
	}
	for line := range strings.SplitSeq(v.(string), "\n") {
		// slave0:ip=127.0.0.1,port=1234,state=online,offset=…
		if !strings.HasPrefix(line, "slave0:") {
			continue
		}
		for f := range strings.SplitSeq(strings.TrimPrefix(line, "slave0:"), ",") {
			if p, ok := strings.CutPrefix(f, "port="); ok {
				for _, n := range c.Nodes {
					if strconv.Itoa(n.port) == strings.TrimSpace(p) {
						return n
					}
				}
			}
		}
	}
	t.Fatalf("redistest: %s has no replica", primary.Addr())
	return nil
}

// Flush deletes every key of every primary (FLUSHALL); the replicas follow.
func (c *Cluster) Flush(t testing.TB) {
	t.Helper()
	for _, n := range c.running() {
		if v, err := command(n.Addr(), "role"); err == nil {
			if a, ok := v.([]any); ok && len(a) > 0 && a[0] == "master" {
				if err := do(n.Addr(), 0, "flushall"); err != nil {
					t.Fatalf("redistest: FLUSHALL on %s: %v", n.Addr(), err)
				}
			}
		}
	}
}

// IsPrimary reports whether s answers ROLE as a primary.
func IsPrimary(s *Server) bool {
	v, err := command(s.Addr(), "role")
	if err != nil {
		return false
	}
	a, ok := v.([]any)
	return ok && len(a) > 0 && a[0] == "master"
}

// Sentinel is a primary, a replica of it and three sentinels monitoring them under the name
// MasterName, with a down-after of SentinelDownAfter; every process is stopped in t.Cleanup.
type Sentinel struct {
	Primary   *Server // the primary at the start; after a failover, MasterAddr says which is
	Replica   *Server
	Sentinels []*Server
}

// MasterName is the name under which the sentinels monitor the primary.
const MasterName = "tablease"

// StartReplicated starts a primary and a replica of it, and waits until the replica is in sync
// and the primary counts it; both are stopped in t.Cleanup. The test may pause the replica
// (Server.Pause) so that it stops acknowledging.
func StartReplicated(t testing.TB) (primary, replica *Server) {
	t.Helper()
	primary = startNode(t, &role{}, "")
	replica = startNode(t, &role{replica: primary.Addr()}, "")
	err := poll(topologyTimeout, func() error {
		r, err := command(replica.Addr(), "info", "replication")
		if err != nil {
			return err
		}
		p, err := command(primary.Addr(), "info", "replication")
		if err != nil {
			return err
		}
		if !strings.Contains(r.(string), "master_link_status:up") || !strings.Contains(p.(string), "connected_slaves:1") {
			return fmt.Errorf("the replica is not in sync")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return primary, replica
}

// StartSentinel starts the primary, its replica and three sentinels, and waits until every
// sentinel sees the primary, its replica and the two other sentinels.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	s := &Sentinel{}
	s.Primary, s.Replica = StartReplicated(t)
	conf := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d 2\n"+
		"sentinel down-after-milliseconds %[1]s %[3]d\n"+
		"sentinel failover-timeout %[1]s %[4]d\n"+
		"sentinel parallel-syncs %[1]s 1\n",
		MasterName, s.Primary.port, SentinelDownAfter.Milliseconds(), sentinelFailover.Milliseconds())
	for range 3 {
		s.Sentinels = append(s.Sentinels, startNode(t, &role{sentinel: true}, conf))
	}
	err := poll(topologyTimeout, func() error {
		for _, n := range s.Sentinels {
			v, err := command(n.Addr(), "sentinel", "master", MasterName)
			if err != nil {
				return err
			}
			m := pairs(v)
			if m["num-slaves"] != "1" || m["num-other-sentinels"] != "2" || m["flags"] != "master" {
				return fmt.Errorf("sentinel %s sees %v", n.Addr(), m)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("redistest: the Sentinel setup did not form: %v", err)
	}
	return s
}

// Addrs are the host:port of the sentinels.
func (s *Sentinel) Addrs() []string {
	var a []string
	for _, n := range s.Sentinels {
		a = append(a, n.Addr())
	}
	return a
}

// MasterAddr answers the primary's address as the first sentinel that answers names it.
func (s *Sentinel) MasterAddr(t testing.TB) string {
	t.Helper()
	var last error
	for _, n := range s.Sentinels {
		v, err := command(n.Addr(), "sentinel", "get-master-addr-by-name", MasterName)
		if err != nil {
			last = err
			continue
		}
		if a, ok := v.([]any); ok && len(a) == 2 {
			return net.JoinHostPort(fmt.Sprint(a[0]), fmt.Sprint(a[1]))
		}
	}
	t.Fatalf("redistest: no sentinel names the primary: %v", last)
	return ""
}

// KillPrimary kills the node the sentinels name as the primary and waits until they name the other
// one and it answers as a primary. It answers the node killed and when the promotion was seen
// finished.
func (s *Sentinel) KillPrimary(t testing.TB) (killed *Server, promoted time.Time) {
	t.Helper()
	killed, next := s.Primary, s.Replica
	if s.MasterAddr(t) == s.Replica.Addr() {
		killed, next = s.Replica, s.Primary
	}
	killed.Stop(t)
	err := poll(topologyTimeout, func() error {
		if s.MasterAddr(t) != next.Addr() || !IsPrimary(next) {
			return fmt.Errorf("the sentinels have not promoted %s", next.Addr())
		}
		return nil
	})
	if err != nil {
		t.Fatalf("redistest: %v\n%s", err, s.logs())
	}
	return killed, time.Now()
}

// Rejoin restarts n, a node KillPrimary killed, as a replica of the primary the sentinels name (as
// they would make it, only sooner), and waits until it is in sync. It comes back empty.
func (s *Sentinel) Rejoin(t testing.TB, n *Server) {
	t.Helper()
	primary := s.MasterAddr(t)
	n.mu.Lock()
	n.role.replica = primary
	n.mu.Unlock()
	n.Restart(t)
	_, port, _ := net.SplitHostPort(primary)
	err := poll(topologyTimeout, func() error {
		v, err := command(n.Addr(), "info", "replication")
		if err != nil {
			return err
		}
		r := v.(string)
		if !strings.Contains(r, "role:slave") || !strings.Contains(r, "master_port:"+port+"\r") ||
			!strings.Contains(r, "master_link_status:up") {
			return fmt.Errorf("%s does not replicate %s in sync yet", n.Addr(), primary)
		}
		// Every sentinel must see it as a healthy replica, or it could not promote it next.
		for _, x := range s.Sentinels {
			v, err := command(x.Addr(), "sentinel", "replicas", MasterName)
			if err != nil {
				return err
			}
			ok := false
			for _, r := range v.([]any) {
				m := pairs(r)
				ok = ok || (m["name"] == n.Addr() && m["flags"] == "slave" && m["master-link-status"] == "ok")
			}
			if !ok {
				return fmt.Errorf("sentinel %s does not see %s as a healthy replica yet", x.Addr(), n.Addr())
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("redistest: %v\n%s", err, s.logs())
	}
}

// logs answers the tail of every process's log, for a failure message.
func (s *Sentinel) logs() string {
	var b strings.Builder
	for _, n := range append([]*Server{s.Primary, s.Replica}, s.Sentinels...) {
		fmt.Fprintf(&b, "--- %s:\n%s\n", n.Addr(), lastLines(n.Log(), 40))
	}
	return b.String()
}

// lastLines answers the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// pairs reads a flat list of names and values, as SENTINEL MASTER answers.
func pairs(v any) map[string]string {
	m := make(map[string]string)
	if a, ok := v.([]any); ok {
		for i := 0; i+1 < len(a); i += 2 {
			m[fmt.Sprint(a[i])] = fmt.Sprint(a[i+1])
		}
	}
	if mm, ok := v.(map[any]any); ok {
		for k, x := range mm {
			m[fmt.Sprint(k)] = fmt.Sprint(x)
		}
	}
	return m
}

// command runs one command on a short-lived connection to addr and answers its reply.
func command(addr string, args ...any) (any, error) {
	c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true, MaxRetries: -1, Protocol: 2})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	return c.Do(ctx, args...).Result()
}

// poll calls f until it answers nil, and answers its last error after d.
func poll(d time.Duration, f func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}
