package chaos_test

import (
	"flag"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tablease/tablease/internal/chaos"
)

var (
	histories = flag.Int("chaos.histories", 294, "histories (sessions) to check in all, shared evenly by the fault scenarios")
	duration  = flag.Duration("chaos.duration", 0, "least time to run each fault scenario")
	failovers = flag.Int("chaos.failovers", 3, "Sentinel failovers to run the clients through, one per round")
)

func TestMain(m *testing.M) {
	code := m.Run()
	chaos.RemoveBinary()
	os.Exit(code)
}

// scenarios are the faults injected while the clients run, once per round.
var scenarios = []struct {
	name  string
	fault chaos.Fault
}{
	{"no fault", nil},
	{"Redis paused", func(t testing.TB, c *chaos.Cluster, r *chaos.Round) bool {
		c.Redis.Pause(t)
		r.AwaitCalls(2, true, 2*time.Second) // until clients saw the store unavailable
		c.Redis.Resume(t)
		return false
	}},
	{"Redis killed and restarted empty", func(t testing.TB, c *chaos.Cluster, r *chaos.Round) bool {
		c.Redis.Stop(t)
		r.AwaitCalls(2, true, 2*time.Second)
		c.Redis.Restart(t)
		return true
	}},
	{"FLUSHALL", func(t testing.TB, c *chaos.Cluster, r *chaos.Round) bool {
		c.Redis.Flush(t)
		return true
	}},
	{"a proxy delays and resets the connections to Redis", func(t testing.TB, c *chaos.Cluster, r *chaos.Round) bool {
		c.Proxy.Trouble(true)
		r.AwaitCalls(16, false, 2*time.Second)
		c.Proxy.Trouble(false)
		return false
	}},
	{"a proxy drops replies after Redis ran the command", func(t testing.TB, c *chaos.Cluster, r *chaos.Round) bool {
		c.Proxy.ResetReplies(true)
		c.Proxy.Trouble(true)
		r.AwaitCalls(16, false, 2*time.Second)
		c.Proxy.Trouble(false)
		c.Proxy.ResetReplies(false)
		return false
	}},
	{"a tablease instance killed and restarted", func(t testing.TB, c *chaos.Cluster, r *chaos.Round) bool {
		in := c.Instances[rand.IntN(len(c.Instances))]
		if err := in.Kill(); err != nil {
			t.Fatal(err)
		}
		r.AwaitCalls(2, true, time.Second)
		if err := in.Start(); err != nil {
			t.Fatal(err)
		}
		return false
	}},
}

// TestTheLeaseAPIIsLinearizableUnderChaos runs eight tabs against two tablease instances on one
// Redis under each fault scenario, and checks every session's history with porcupine.
// A long run: go test -run Chaos ./internal/chaos/ -chaos.histories=2000
func TestTheLeaseAPIIsLinearizableUnderChaos(t *testing.T) {
	c := chaos.StartCluster(t, 2)
	perScenario := (*histories + len(scenarios) - 1) / len(scenarios)
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			start := time.Now()
			rep := chaos.Run(t, c, chaos.Config{
				Name:      strings.ReplaceAll(sc.name, " ", "-"),
				Targets:   c.URLs(),
				Clients:   8,
				Sessions:  3,
				Calls:     6,
				Histories: perScenario,
				Duration:  *duration,
				Fault:     sc.fault,
				Artifacts: chaos.ArtifactsDir(),
			})
			t.Logf("%s: %d histories, %d calls, %d operations checked (%d with an unknown outcome), %d rounds, %d faults, illegal %d, undecided %d, in %s",
				sc.name, rep.Histories, rep.Calls, rep.Ops, rep.Unknown, rep.Rounds, rep.Faults, len(rep.Illegal), len(rep.Undecided),
				time.Since(start).Round(time.Millisecond))
			if strings.HasPrefix(sc.name, "a proxy") {
				t.Logf("the proxy reset %d connections so far", c.Proxy.Resets())
			}
			for _, e := range rep.Errors {
				t.Errorf("an answer the contract does not allow: %s", e)
			}
			for _, p := range rep.Illegal {
				t.Errorf("a history is not linearizable: %s", p)
			}
			for _, p := range rep.Undecided {
				t.Errorf("the check of a history did not finish: %s", p)
			}
		})
	}
}

// TestTheLeaseAPIIsLinearizableAcrossSentinelFailovers runs eight tabs against two tablease
// instances that reach Redis through Sentinel, and kills the primary once per round: the sentinels
// promote the replica, and the killed node rejoins, empty, as the replica of the next round. Every
// session's history is checked with porcupine. The replica is in sync on loopback, so the
// failover loses nothing the clients were told (README "Failure semantics" says what a lagging
// replica may lose). A long run: go test -run Sentinel ./internal/chaos/ -chaos.failovers=30
func TestTheLeaseAPIIsLinearizableAcrossSentinelFailovers(t *testing.T) {
	c := chaos.StartSentinelCluster(t, 2)
	const sessions = 3
	start := time.Now()
	rep := chaos.Run(t, c, chaos.Config{
		Name:      "sentinel-failover",
		Targets:   c.URLs(),
		Clients:   8,
		Sessions:  sessions,
		Calls:     6,
		Histories: sessions * *failovers,
		Fault: func(t testing.TB, c *chaos.Cluster, r *chaos.Round) bool {
			killed, _ := c.Sentinel.KillPrimary(t)
			r.AwaitCalls(2, true, time.Second) // clients saw the failover
			c.Sentinel.Rejoin(t, killed)
			return false
		},
		Artifacts: chaos.ArtifactsDir(),
	})
	t.Logf("Sentinel failover: %d histories, %d calls, %d operations checked (%d with an unknown outcome), %d failovers, illegal %d, undecided %d, in %s",
		rep.Histories, rep.Calls, rep.Ops, rep.Unknown, rep.Faults, len(rep.Illegal), len(rep.Undecided), time.Since(start).Round(time.Millisecond))
	for _, e := range rep.Errors {
		t.Errorf("an answer the contract does not allow: %s", e)
	}
	for _, p := range rep.Illegal {
		t.Errorf("a history is not linearizable: %s", p)
	}
	for _, p := range rep.Undecided {
		t.Errorf("the check of a history did not finish: %s", p)
	}
}
