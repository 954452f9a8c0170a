package leaseredis_test

import (
	"context"
	"errors"
	"strings"
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

// A watch on a Cluster must hear every change, or end and be replayed what it missed: never sit
// on a node that no longer gets the events of its session. After a failover the old primary is a
// replica, which accepts a subscription before its new primary sends it the shard's messages.
func TestWatchesOnAClusterHearEveryChangeAcrossAFailover(t *testing.T) {
	c := redistest.StartCluster(t)
	// As the README's ACL rules let the engine do, on every node.
	url := aclUser(t, clusterURL(c), c.Nodes, "failover", true)
	e := topologyEngine(t, url, leaseredis.Options{Prefix: "failover", OpTimeout: topologyOpTimeout})
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

// The same when the slot of the session's user moves to another shard (a reshard, as redis-cli
// --cluster reshard makes it, key by key), while it changes.
func TestWatchesOnAClusterHearEveryChangeAcrossAReshard(t *testing.T) {
	c := redistest.StartCluster(t)
	url := aclUser(t, clusterURL(c), c.Nodes, "reshard", true)
	e := topologyEngine(t, url, leaseredis.Options{Prefix: "reshard", OpTimeout: topologyOpTimeout})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	key := lease.Key{User: "alice", Session: "doc-1"}
	f := follow(ctx, e, key)
	takeover := changer(t, ctx, e, key, f)
	for i := range 5 {
		takeover(i, "before the reshard")
	}

	from := c.PrimaryOf(t, "{alice}")
	var to *redistest.Server
	for _, n := range c.Nodes {
		if n != from && redistest.IsPrimary(n) {
			to = n
			break
		}
	}
	ids := make(map[*redistest.Server]string)
	var slot int64
	for _, n := range []*redistest.Server{from, to} {
		cl := redis.NewClient(&redis.Options{Addr: n.Addr(), DisableIdentity: true})
		id, err := cl.Do(ctx, "cluster", "myid").Text()
		if err == nil {
			slot, err = cl.Do(ctx, "cluster", "keyslot", "{alice}").Int64()
		}
		cl.Close()
		if err != nil {
			t.Fatal(err)
		}
		ids[n] = id
	}
	srcID, dstID := ids[from], ids[to]

	// The slot moves, key by key, while the changes go on, one every 50 ms, and 40 more after.
	moved := make(chan error, 1)
	go func() { moved <- migrate(ctx, c, from, to, slot, srcID, dstID) }()
	i := 0
	for ; ; i++ {
		select {
		case err := <-moved:
			if err != nil {
				t.Fatalf("moving slot %d: %v", slot, err)
			}
			for end := i + 40; i < end; i++ {
				takeover(i, "after the reshard")
				time.Sleep(50 * time.Millisecond)
			}
			if p := c.PrimaryOf(t, "{alice}"); p != to {
				t.Fatalf("the slot of {alice} is served by %s, want %s", p.Addr(), to.Addr())
			}
			return
		default:
		}
		takeover(i, "during the reshard")
		time.Sleep(50 * time.Millisecond)
	}
}

// migrate moves slot from the primary from (node id srcID) to the primary to (dstID) as redis-cli
// --cluster reshard does: importing and migrating, its keys a hundred at a time, then every
// primary told its new owner.
func migrate(ctx context.Context, c *redistest.Cluster, from, to *redistest.Server, slot int64, srcID, dstID string) error {
	client := func(n *redistest.Server) *redis.Client {
		return redis.NewClient(&redis.Options{Addr: n.Addr(), DisableIdentity: true})
	}
	src, dst := client(from), client(to)
	defer src.Close()
	defer dst.Close()
	if err := dst.Do(ctx, "cluster", "setslot", slot, "importing", srcID).Err(); err != nil {
		return err
	}
	if err := src.Do(ctx, "cluster", "setslot", slot, "migrating", dstID).Err(); err != nil {
		return err
	}
	host, port, _ := strings.Cut(to.Addr(), ":")
	for {
		keys, err := src.Do(ctx, "cluster", "getkeysinslot", slot, 100).StringSlice()
		if err != nil {
			return err
		}
		if len(keys) == 0 {
			break
		}
		args := []any{"migrate", host, port, "", 0, 5000, "keys"}
		for _, k := range keys {
			args = append(args, k)
		}
		if err := src.Do(ctx, args...).Err(); err != nil {
			return err
		}
		time.Sleep(100 * time.Millisecond) // a few changes between the moves
	}
	for _, n := range c.Nodes {
		if redistest.IsPrimary(n) {
			cl := client(n)
			err := cl.Do(ctx, "cluster", "setslot", slot, "node", dstID).Err()
			cl.Close()
			if err != nil {
				return err
			}
		}
	}
	return nil
}
