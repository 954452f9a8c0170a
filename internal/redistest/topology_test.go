package redistest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestClusterServesEverySlotAndFailsOverWhenAPrimaryDies(t *testing.T) {
	c := StartCluster(t)
	if len(c.Nodes) != 6 {
		t.Fatalf("%d nodes, want 6", len(c.Nodes))
	}
	cl := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), DisableIdentity: true})
	t.Cleanup(func() { _ = cl.Close() })
	ctx := ctxT(t, time.Minute)
	if err := cl.Set(ctx, "{k}:a", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	primary := c.PrimaryOf(t, "{k}:a")
	replica := c.ReplicaOf(t, primary)
	if err := poll(topologyTimeout, func() error { return hasKeys(replica.Addr()) }); err != nil {
		t.Fatalf("the replica did not get the key: %v", err)
	}

	primary.Stop(t)
	c.WaitHealthy(t)
	if got := c.PrimaryOf(t, "{k}:a"); got != replica {
		t.Fatalf("after the failover %s serves the key, want its replica %s", got.Addr(), replica.Addr())
	}
	if !IsPrimary(replica) {
		t.Fatal("the promoted replica does not answer ROLE as a primary")
	}

	primary.Restart(t)
	c.WaitHealthy(t)
	if IsPrimary(primary) {
		t.Fatal("the old primary came back as a primary; it should rejoin as a replica")
	}
}

// hasKeys answers nil once the node at addr holds a key in database 0.
func hasKeys(addr string) error {
	v, err := command(addr, "info", "keyspace")
	if err != nil {
		return err
	}
	if !strings.Contains(v.(string), "db0:keys=") {
		return errors.New("no key yet")
	}
	return nil
}

func TestSentinelFailsOverToTheReplicaAndBack(t *testing.T) {
	s := StartSentinel(t)
	if got := s.MasterAddr(t); got != s.Primary.Addr() {
		t.Fatalf("the sentinels name %s, want %s", got, s.Primary.Addr())
	}
	killed, _ := s.KillPrimary(t)
	if killed != s.Primary || s.MasterAddr(t) != s.Replica.Addr() {
		t.Fatalf("killed %s, and the sentinels name %s; want %s killed and %s named", killed.Addr(), s.MasterAddr(t), s.Primary.Addr(), s.Replica.Addr())
	}
	// Back, empty, it becomes the replica, and the next failover goes the other way.
	s.Rejoin(t, killed)
	if again, _ := s.KillPrimary(t); again != s.Replica || s.MasterAddr(t) != s.Primary.Addr() {
		t.Fatalf("the second failover killed %s and promoted %s", again.Addr(), s.MasterAddr(t))
	}
}
