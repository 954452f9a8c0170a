package leaseredis_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tablease/tablease/internal/redistest"
	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/lease/leaseredis"
)

// follower watches a session as the event stream does: again after every end, from the last id
// it saw, so that a resumed watch replays what it missed and any other starts from a snapshot.
// seen is the highest epoch an event or a snapshot showed it.
type follower struct {
	mu   sync.Mutex
	seen int64
}

func (f *follower) saw(epoch int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seen = max(f.seen, epoch)
}

func (f *follower) epoch() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.seen
}

func follow(ctx context.Context, feed lease.Feed, key lease.Key) *follower {
	f := &follower{}
	go func() {
		after := ""
		for ctx.Err() == nil {
			w, err := feed.Watch(ctx, key, after)
			if err != nil {
				time.Sleep(50 * time.Millisecond) // the store is failing over: try again
				continue
			}
			if !w.Resumed {
				f.saw(w.Snapshot.Epoch)
			}
			for _, ev := range w.Replay {
				after = ev.ID
				f.saw(ev.Epoch)
			}
			if w.Position != "" && !w.Resumed {
				after = w.Position
			}
			for ev := range w.Events() {
				after = ev.ID
				f.saw(ev.Epoch)
			}
			w.Close()
		}
	}()
	return f
}

// clusterEngine starts a Cluster and an engine on it under prefix, as the README's ACL rules let
// it run on every node.
func clusterEngine(t *testing.T, prefix string) (*redistest.Cluster, *leaseredis.Engine) {
	c := redistest.StartCluster(t)
	url := aclUser(t, clusterURL(c), c.Nodes, prefix, true)
	return c, topologyEngine(t, url, leaseredis.Options{Prefix: prefix, OpTimeout: topologyOpTimeout})
}

// A watch on a Cluster must hear every change, or end and be replayed what it missed: never sit
// on a node that no longer gets the events of its session. After a failover the old primary is a
// replica, which accepts a subscription before its new primary sends it the shard's messages.
func TestWatchesOnAClusterHearEveryChangeAcrossAFailover(t *testing.T) {
	c, e := clusterEngine(t, "failover")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	key := lease.Key{User: "alice", Session: "doc-1"}
	f := follow(ctx, e, key)

	takeover := changer(t, ctx, e, key, f)
	for i := range 5 {
		takeover(i, "before the failover")
	}

	primary := c.PrimaryOf(t, "{alice}")
	replica := c.ReplicaOf(t, primary)
	rc := redis.NewClient(&redis.Options{Addr: replica.Addr(), DisableIdentity: true})
	defer rc.Close()
	// Changes while the replica takes over, and for a while after: the instance's subscription
	// moves to the new primary. A new Cluster's primaries may not know the replica for one yet and
	// refuse their votes, and a manual failover gives up after 5 s: it is asked again.
	promoted := time.Now().Add(30 * time.Second)
	var asked time.Time
	i := 0
	for ; !redistest.IsPrimary(replica); i++ {
		if time.Now().After(promoted) {
			t.Fatalf("%s is no primary 30 s after its first CLUSTER FAILOVER", replica.Addr())
		}
		if time.Since(asked) > 6*time.Second {
			if err := rc.Do(ctx, "cluster", "failover").Err(); err != nil {
				t.Fatalf("CLUSTER FAILOVER on %s: %v", replica.Addr(), err)
			}
			asked = time.Now()
		}
		takeover(i, "during the failover")
		time.Sleep(50 * time.Millisecond)
	}
	for end := i + 40; i < end; i++ {
		takeover(i, "after the failover")
		time.Sleep(50 * time.Millisecond)
	}
}

// changer answers a function that makes one change of key on e (a takeover by one of two tabs in
// turn), retrying while the store fails over, and waits until f has heard of it.
func changer(t *testing.T, ctx context.Context, e *leaseredis.Engine, key lease.Key, f *follower) func(i int, what string) {
	tabs := []string{"tab-a", "tab-b"}
	return func(i int, what string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		var l lease.Lease
		for {
			var err error
			l, err = e.Acquire(ctx, lease.AcquireRequest{Key: key, Holder: lease.Holder{TabID: tabs[i%2]}, TTL: time.Minute, Mode: lease.ModeTakeover})
			if err == nil {
				break
			}
			if !errors.Is(err, lease.ErrUnavailable) || time.Now().After(deadline) {
				t.Fatalf("%s: takeover %d: %v", what, i, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		heard := time.Now().Add(3 * time.Second)
		for f.epoch() < l.Epoch {
			if time.Now().After(heard) {
				t.Fatalf("%s: takeover %d to epoch %d was not heard within 3 s (the watch heard up to %d): the watch sits where the events are not sent", what, i, l.Epoch, f.epoch())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// The same when the slots of users move to another shard while their sessions change: half the
// slots of a primary, as an operator moves them with redis-cli --cluster reshard, some users' with
// them and some left where they were.
func TestWatchesOnAClusterHearEveryChangeAcrossAReshard(t *testing.T) {
	c, e := clusterEngine(t, "reshard")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	from := c.PrimaryOf(t, "{u0}")
	var to *redistest.Server
	for _, n := range c.Nodes {
		if n != from && redistest.IsPrimary(n) {
			to = n
			break
		}
	}
	// Users of the shard that moves half its slots, each with a session, watched and changed.
	type user struct {
		key      lease.Key
		takeover func(i int, what string)
	}
	var users []user
	for i := 0; len(users) < 8 && i < 100; i++ {
		name := fmt.Sprintf("u%d", i)
		if c.PrimaryOf(t, "{"+name+"}") != from {
			continue
		}
		key := lease.Key{User: name, Session: "doc-1"}
		users = append(users, user{key, changer(t, ctx, e, key, follow(ctx, e, key))})
	}
	change := func(i int, what string) {
		t.Helper()
		for _, u := range users {
			u.takeover(i, what+" ("+u.key.User+")")
		}
	}
	change(0, "before the reshard")

	ids := make(map[*redistest.Server]string)
	for _, n := range []*redistest.Server{from, to} {
		cl := redis.NewClient(&redis.Options{Addr: n.Addr(), DisableIdentity: true})
		id, err := cl.Do(ctx, "cluster", "myid").Text()
		cl.Close()
		if err != nil {
			t.Fatal(err)
		}
		ids[n] = id
	}
	moved := make(chan error, 1)
	go func() {
		out, err := exec.CommandContext(ctx, "redis-cli", "--cluster", "reshard", from.Addr(),
			"--cluster-from", ids[from], "--cluster-to", ids[to], "--cluster-slots", "2730", "--cluster-yes").CombinedOutput()
		if err != nil {
			err = fmt.Errorf("%v: %s", err, out)
		}
		moved <- err
	}()
	i := 1
	for ; ; i++ {
		select {
		case err := <-moved:
			if err != nil {
				t.Fatalf("redis-cli --cluster reshard: %v", err)
			}
			for end := i + 5; i < end; i++ {
				change(i, "after the reshard")
			}
			return
		default:
		}
		change(i, "during the reshard")
	}
}
