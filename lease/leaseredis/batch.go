package leaseredis

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// batcher sends the function calls of concurrent operations to Redis together, in one pipeline:
// one write and one read for many calls rather than one each. Sent alone, a call's write and read
// were a quarter of tablease's CPU per renew (pprof); with 64 clients renewing, batching cut
// tablease's CPU per renew by 10-15 % and Redis's by about 15 % (scripts/bench).
//
// A call never waits for a timer or for more calls. While fewer than maxFlushes pipelines are in
// flight it is sent at once, alone or with the calls queued before it; otherwise it queues, and
// the next pipeline to come back takes the queue (up to maxBatch calls) with it. So a lone call
// goes out as it would without batching, and under load the calls that arrive while Redis works
// go out in the next write.
//
// A Redis node has a batcher of its own (batchers), so that a node that does not answer (a
// Cluster shard failing over) holds up only the calls of its keys.
//
// Each call has a deadline, given as a time rather than as a context with a timer of its own (a
// timer per call was 3 % of tablease's CPU per renew, perf). A pipeline, of one call or many, runs
// until the latest deadline of its calls, not canceled by their contexts, and a call of it whose
// deadline comes first is answered context.DeadlineExceeded then, by one timer per pipeline
// (expireQueued); a queued call whose deadline passed or whose context ended is not sent, and
// answers context.DeadlineExceeded or the context's error. So no call fails before its deadline
// while Redis may still answer it in time, and none waits past it.
//
// Redis runs each function of a pipeline on its own, as if sent alone, and go-redis sends a
// pipeline again after losing its answers as it would a single call; the functions are written
// for both (state.lua). The usual renews and checks of a pipeline, and its changes, go further:
// each kind is sent together in one function call (mergeable), each call answered as it would be
// alone.
type batcher struct {
	client redis.UniversalClient

	mu       sync.Mutex
	flushing int          // pipelines in flight, at most maxFlushes
	queue    []*batchCall // waiting for a pipeline to come back
}

// batchers are the batchers of the Redis nodes of a client. Use newBatchers.
type batchers struct {
	client  redis.UniversalClient
	cluster *redis.ClusterClient // client, when it is a Cluster client
	shared  *batcher             // of a client with one primary (standalone, Sentinel)

	mu    sync.Mutex
	nodes map[string]*batcher // of a Cluster client: by the address of the primary
}

// newBatchers makes the batchers of client.
func newBatchers(client redis.UniversalClient) *batchers {
	c, _ := client.(*redis.ClusterClient)
	return &batchers{client: client, cluster: c, shared: &batcher{client: client}, nodes: map[string]*batcher{}}
}

// of answers the batcher of the primary that holds key.
func (bs *batchers) of(ctx context.Context, key string) *batcher {
	if bs.cluster == nil {
		return bs.shared
	}
	node, err := bs.cluster.MasterForKey(ctx, key)
	if err != nil {
		// No slot map yet, or no node for the slot: the Cluster client finds the node as it
		// sends, or fails.
		return bs.shared
	}
	addr := node.Options().Addr
	bs.mu.Lock()
	defer bs.mu.Unlock()
	b := bs.nodes[addr]
	if b == nil {
		// It sends through the Cluster client all the same, which follows a slot that moved.
		b = &batcher{client: bs.client}
		bs.nodes[addr] = b
	}
	return b
}

const (
	// maxFlushes is how many pipelines may be in flight at once: while Redis runs one, the next
	// is on its way. More give Redis smaller batches and more system calls; fewer leave it idle
	// between batches.
	maxFlushes = 2
	// maxBatch bounds the calls of one pipeline, and so the bytes of one write (a call is well
	// under 1 KB).
	maxBatch = 128
)

// batchCall is one call in a batch.
type batchCall struct {
	deadline time.Time // zero: none (the client's timeouts bound it)
	cmd      *redis.Cmd
	done     chan struct{} // of a queued call: closed once cmd has its answer or error
	// abandoned is set (under the batcher's mu) by a queued call whose context ended: no
	// pipeline sends it.
	abandoned bool
	// answered is set by whatever answers a queued call first (see answer), err with it.
	answered atomic.Bool
	err      error
	// merge, when not nil, lets a pipeline send the call with others in one function call.
	merge *mergeable
}

// mergeable is a call that a pipeline sends together with the other calls of its group in one
// call of the function that makes several at once (function.merged), when it has several: a
// function call costs Redis its own work and the store clock's reading whatever it does, which the
// calls made together share. The usual renews (renew.lua in the lease form) go in renew_many.lua,
// where this is a quarter of the instructions of the usual renew (scripts/redis-instructions); the
// usual checks in check_many.lua; the changes (acquire, release, join, leave) in change_many.lua.
// Each gets the answer its function would have given it alone, so its caller does not tell the
// difference: a renew's or a check's "DEFER" sends it again alone, with every key (usual in
// leaseredis.go).
type mergeable struct {
	fn *function // the function that makes several calls at once (function.merged)
	// group: the calls of a group may share a function call. On a Cluster, whose functions take
	// the keys of one slot, the calls of one user (the hash tag of its keys, mergeGroup); one
	// group elsewhere.
	group  string
	keys   []string // the call's keys, fn.callKeys of them
	common []any    // the engine's common arguments
	head   []any    // for a function that makes calls of several (fn.named): the call's function and count of arguments
	args   []any    // the call's own arguments
}

// mergeGroup is the group (mergeable) of a call on the session whose state key is key: its hash
// tag on a Cluster, "" elsewhere.
func mergeGroup(key string, cluster bool) string {
	if !cluster {
		return ""
	}
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i:], '}'); j > 0 {
			return key[i : i+j+1]
		}
	}
	return key
}

// merged is a call of a function that makes several calls at once, and the calls it carries.
type merged struct {
	cmd   *redis.Cmd
	calls []*batchCall
}

// combine answers the commands of a pipeline of batch: each call's own, but that the mergeable
// calls of a group, when it has several, are one call of their merged function (merged), in the order of
// their first call.
func combine(batch []*batchCall) (cmds []redis.Cmder, merges []merged) {
	var groups map[string][]*batchCall
	var order []string
	for _, c := range batch {
		if c.merge == nil {
			cmds = append(cmds, c.cmd)
			continue
		}
		if groups == nil {
			groups = map[string][]*batchCall{}
		}
		g := c.merge.fn.name + " " + c.merge.group
		if _, ok := groups[g]; !ok {
			order = append(order, g)
		}
		groups[g] = append(groups[g], c)
	}
	for _, g := range order {
		calls := groups[g]
		if len(calls) == 1 {
			cmds = append(cmds, calls[0].cmd)
			continue
		}
		first := calls[0].merge
		size := 3 + len(first.common)
		for _, c := range calls {
			size += len(c.merge.keys) + len(c.merge.head) + len(c.merge.args)
		}
		args := make([]any, 0, size)
		args = append(args, "fcall", first.fn.fcall, first.fn.callKeys*len(calls))
		for _, c := range calls {
			for _, k := range c.merge.keys {
				args = append(args, k)
			}
		}
		args = append(args, first.common...)
		for _, c := range calls {
			args = append(append(args, c.merge.head...), c.merge.args...)
		}
		cmd := redis.NewCmd(context.Background(), args...)
		cmd.SetFirstKeyPos(3)
		cmds = append(cmds, cmd)
		merges = append(merges, merged{cmd, calls})
	}
	return cmds, merges
}

// split gives each call of m its entry of m's answer (an error reply its error), or m's error.
func (m merged) split() {
	v, err := m.cmd.Result()
	a, ok := v.([]any)
	if err == nil && (!ok || len(a) != len(m.calls)) {
		err = fmt.Errorf("leaseredis: malformed %s reply %v", m.calls[0].merge.fn.name, v)
	}
	for i, c := range m.calls {
		if err != nil {
			c.cmd.SetErr(err)
		} else if e, ok := a[i].(error); ok {
			c.cmd.SetErr(e)
		} else {
			c.cmd.SetVal(a[i])
		}
	}
}

// do sends cmd by deadline (zero: none), alone or with the commands of other calls, and answers
// once cmd has its answer (cmd.Result) or the context ended (ctx.Err, and cmd may or may not have
// run). A call whose deadline passed while it queued answers context.DeadlineExceeded, unsent.
func (b *batcher) do(ctx context.Context, deadline time.Time, cmd *redis.Cmd) error {
	return b.doMerging(ctx, deadline, cmd, nil)
}

// doMerging is do of a call that a pipeline may merge with others (merge, when not nil; cmd is
// then the call alone).
func (b *batcher) doMerging(ctx context.Context, deadline time.Time, cmd *redis.Cmd, merge *mergeable) error {
	c := &batchCall{deadline: deadline, cmd: cmd, merge: merge}
	b.mu.Lock()
	if b.flushing < maxFlushes {
		b.flushing++
		batch := b.take(c)
		b.mu.Unlock()
		b.flush(batch)
		b.mu.Lock()
		if len(b.queue) > 0 {
			go b.drain() // keeps the slot
		} else {
			b.flushing--
		}
		b.mu.Unlock()
		return nil
	}
	c.done = make(chan struct{})
	b.queue = append(b.queue, c)
	b.mu.Unlock()
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
	}
	b.mu.Lock()
	c.abandoned = true // unless a pipeline took it already: its answer is then dropped
	b.mu.Unlock()
	return ctx.Err()
}

// take answers the next batch, first (when not nil) and then up to maxBatch calls of the queue,
// without the abandoned ones and those whose deadline passed (which it answers), and leaves the
// rest queued. With first, whose caller waits for the whole pipeline (see flush), it takes only
// calls whose deadline is no later than first's: the others (first is usually the latest, but
// the second call of usual keeps the first's deadline) go in the next pipeline. b.mu is held.
func (b *batcher) take(first *batchCall) []*batchCall {
	n := min(len(b.queue), maxBatch)
	batch := make([]*batchCall, 0, n+1)
	kept := 0 // b.queue[:kept] stay queued, in their order
	now := time.Now()
	for _, c := range b.queue[:n] {
		switch {
		case c.abandoned:
		case !c.deadline.IsZero() && !now.Before(c.deadline):
			c.answer(context.DeadlineExceeded)
		case first != nil && !first.deadline.IsZero() && (c.deadline.IsZero() || c.deadline.After(first.deadline)):
			b.queue[kept] = c
			kept++
		default:
			batch = append(batch, c)
		}
	}
	if first != nil {
		batch = append(batch, first)
	}
	rest := kept + copy(b.queue[kept:], b.queue[n:])
	clear(b.queue[rest:])
	b.queue = b.queue[:rest]
	return batch
}

// drain flushes the queue, batch after batch, until it is empty, in one of the flush slots.
func (b *batcher) drain() {
	for {
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.flushing--
			b.mu.Unlock()
			return
		}
		batch := b.take(nil)
		b.mu.Unlock()
		b.flush(batch)
	}
}

// flush sends batch, and tells each call its command has its answer.
func (b *batcher) flush(batch []*batchCall) {
	if len(batch) == 0 {
		return
	}
	// Until the latest deadline of its calls (see batcher); a call without one (none that the
	// engine makes) leaves the pipeline to the client's read and write timeouts.
	var deadline time.Time
	for _, c := range batch {
		if c.deadline.IsZero() {
			deadline = time.Time{}
			break
		}
		if c.deadline.After(deadline) {
			deadline = c.deadline
		}
	}
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	if !deadline.IsZero() {
		ctx, cancel = context.WithDeadline(ctx, deadline)
	}
	defer cancel()
	if len(batch) == 1 {
		_ = b.client.Process(ctx, batch[0].cmd)
		batch[0].answer(nil)
		return
	}
	defer expireQueued(batch, deadline)()
	cmds, merges := combine(batch)
	if len(cmds) == 1 {
		_ = b.client.Process(ctx, cmds[0])
	} else {
		_, _ = b.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, cmd := range cmds {
				_ = p.Process(ctx, cmd)
			}
			return nil
		})
	}
	for _, m := range merges {
		m.split()
	}
	for _, c := range batch {
		c.answer(nil)
	}
}

// expireQueued answers context.DeadlineExceeded, at its deadline, each queued call of batch whose
// deadline comes before end (the pipeline's, zero for none) and that is not answered by then: with
// one timer at a time, for the earliest deadline to come. It answers the function that stops it.
// The command of a call so answered may still run.
func expireQueued(batch []*batchCall, end time.Time) (stop func()) {
	var mu sync.Mutex
	stopped := false
	var timer *time.Timer
	var arm func()
	arm = func() {
		now := time.Now()
		var next time.Time
		for _, c := range batch {
			if c.done == nil || c.deadline.IsZero() || c.answered.Load() || (!end.IsZero() && !c.deadline.Before(end)) {
				continue
			}
			if !c.deadline.After(now) {
				c.answer(context.DeadlineExceeded)
			} else if next.IsZero() || c.deadline.Before(next) {
				next = c.deadline
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if !next.IsZero() && !stopped {
			timer = time.AfterFunc(next.Sub(now), arm)
		}
	}
	arm()
	return func() {
		mu.Lock()
		defer mu.Unlock()
		stopped = true
		if timer != nil {
			timer.Stop()
		}
	}
}

// answer tells a queued call that it has its answer, its command's (err nil) or err, unless it
// was answered already (a pipeline and expireQueued may both answer it); the call that sent its
// command itself needs no telling.
func (c *batchCall) answer(err error) {
	if c.done != nil && c.answered.CompareAndSwap(false, true) {
		c.err = err
		close(c.done)
	}
}
