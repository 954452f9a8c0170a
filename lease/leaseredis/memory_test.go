package leaseredis

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tablease/tablease/internal/redistest"
	"github.com/tablease/tablease/lease"
)

// TestMemoryPerSessionIsBoundedAndFreeSessionsKeepNoLabel measures, on a private redis-server, what
// n sessions of one user cost (INFO used_memory): held with a 200-character label, then released,
// then once the idle retention has passed; and the event log of the one session watched. The memory figures of docs/engines.md are these logs
// (the README's are those of tablease bench). It checks what the figures rest on: a free
// session's state hash does not grow with the label it had, and once the retention has passed
// nothing of the sessions is left but the user's audit log.
func TestMemoryPerSessionIsBoundedAndFreeSessionsKeepNoLabel(t *testing.T) {
	const n = 1000
	const idle = 2 * time.Second
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := t.Context()
	client, err := NewClient(srv.URL(), 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	// A short OpTimeout keeps the answers of calls (kept five OpTimeouts for the driver's retries)
	// out of the figures once they expired.
	// The event logs are kept as long as the state, so that the last figure shows what outlives both.
	e, err := New(client, Options{Prefix: "m", OpTimeout: 100 * time.Millisecond, IdleRetention: idle, EventLogTTL: idle})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })

	// A call that a loaded machine keeps past the short OpTimeout is made again: an acquire by its
	// holder and a release of its epoch answer a retry as they answered the first.
	again := func(what string, call func() error) {
		t.Helper()
		for attempt := 1; ; attempt++ {
			err := call()
			if err == nil {
				return
			}
			if !errors.Is(err, lease.ErrUnavailable) || attempt == 10 {
				t.Fatalf("%s: %v", what, err)
			}
		}
	}
	label := strings.Repeat("L", lease.MaxLabelLen)
	key := func(i int) lease.Key { return lease.Key{User: "alice", Session: "doc-" + strconv.Itoa(i)} }
	used := func(what string) int64 {
		t.Helper()
		// Wait out the answers kept for retries: KEYS deletes the expired keys it meets.
		deadline := time.Now().Add(10 * time.Second)
		for len(c.Keys(ctx, "m:*:reply:*").Val()) > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the answers kept for retries did not expire", what)
			}
			time.Sleep(50 * time.Millisecond)
		}
		return usedMemory(t, ctx, c)
	}

	// One session is watched, so that it has an event log to measure; the others have none. Its
	// first watch subscribes, which a loaded machine may keep past the short OpTimeout too.
	var w *lease.Watch
	again("watch", func() (err error) {
		w, err = e.Watch(ctx, key(0), "")
		return err
	})
	t.Cleanup(w.Close)
	base := used("before")
	var epochs []int64
	for i := range n {
		again("acquire", func() error {
			l, err := e.Acquire(ctx, lease.AcquireRequest{Key: key(i), Holder: lease.Holder{TabID: "tab-" + strconv.Itoa(i), Label: label}, TTL: time.Minute})
			if err == nil {
				epochs = append(epochs, l.Epoch)
			}
			return err
		})
	}
	held := used("held")
	heldHash := c.MemoryUsage(ctx, "m:{alice}:lease:doc-0").Val()
	heldLog := c.MemoryUsage(ctx, "m:{alice}:log:doc-0").Val()
	w.Close()
	for i := range n {
		again("release", func() error {
			_, err := e.Release(ctx, lease.ReleaseRequest{Key: key(i), TabID: "tab-" + strconv.Itoa(i), Epoch: epochs[i]})
			return err
		})
	}
	free := used("free")
	freeHash := c.MemoryUsage(ctx, "m:{alice}:lease:doc-0").Val()

	// The same free session, had its holder no label, takes as much.
	other := lease.Key{User: "bob", Session: "doc-0"}
	var epoch int64
	again("acquire", func() error {
		l, err := e.Acquire(ctx, lease.AcquireRequest{Key: other, Holder: lease.Holder{TabID: "tab-0"}, TTL: time.Minute})
		epoch = l.Epoch
		return err
	})
	again("release", func() error {
		_, err := e.Release(ctx, lease.ReleaseRequest{Key: other, TabID: "tab-0", Epoch: epoch})
		return err
	})
	if unlabelled := c.MemoryUsage(ctx, "m:{bob}:lease:doc-0").Val(); unlabelled != freeHash {
		t.Errorf("MEMORY USAGE of a free session's hash: %d bytes after a holder with a %d-character label, %d after one without; want the same",
			freeHash, len(label), unlabelled)
	}

	// Once the retention has passed, the sessions are forgotten.
	deadline := time.Now().Add(idle + 10*time.Second)
	for c.Exists(ctx, "m:{alice}:lease:doc-"+strconv.Itoa(n-1)).Val() == 1 {
		if time.Now().After(deadline) {
			t.Fatal("the free sessions were not forgotten after the idle retention")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Redis expires keys in the background (KEYS deletes those it meets): wait until only the
	// audit log is left of the user.
	for left := c.Keys(ctx, "m:{alice}:*").Val(); len(left) != 1 || left[0] != "m:{alice}:audit"; left = c.Keys(ctx, "m:{alice}:*").Val() {
		if time.Now().After(deadline) {
			t.Fatalf("keys of the user after the retention: %d (%q…), want its audit log only", len(left), left[:min(len(left), 3)])
		}
		time.Sleep(50 * time.Millisecond)
	}
	forgotten := used("forgotten")

	t.Logf("%d sessions of one user, %d-character labels, Redis %s: held %d B each (state hash %d B; the event log of the watched one %d B), "+
		"free %d B each (state hash %d B), after the idle retention %d B each (the user's audit log)",
		n, len(label), redisVersion(t, ctx, c), (held-base)/n, heldHash, heldLog, (free-base)/n, freeHash, (forgotten-base)/n)
}

func usedMemory(t *testing.T, ctx context.Context, c *redis.Client) int64 {
	t.Helper()
	return mustInt(t, infoField(t, ctx, c, "memory", "used_memory"))
}

func redisVersion(t *testing.T, ctx context.Context, c *redis.Client) string {
	t.Helper()
	return infoField(t, ctx, c, "server", "redis_version")
}

func infoField(t *testing.T, ctx context.Context, c *redis.Client, section, field string) string {
	t.Helper()
	info, err := c.Info(ctx, section).Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return v
		}
	}
	t.Fatalf("INFO %s has no %s", section, field)
	return ""
}
