package leaseredis

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tablease/tablease/internal/redistest"
	"github.com/tablease/tablease/lease"
)

// pipelineSizes is a go-redis hook that records the number of commands of every pipeline but those
// go-redis sends itself to set up a connection (handshake).
type pipelineSizes struct {
	mu    sync.Mutex
	sizes []int
}

func (h *pipelineSizes) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *pipelineSizes) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *pipelineSizes) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !handshake(cmds) {
			h.mu.Lock()
			h.sizes = append(h.sizes, len(cmds))
			h.mu.Unlock()
		}
		return next(ctx, cmds)
	}
}

func (h *pipelineSizes) get() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]int(nil), h.sizes...)
}

// busyBatcher answers a batcher on a fresh Redis whose flush slots are all taken by calls that
// wait in Redis (BLPOP) until release is called, so that the calls made meanwhile queue; and the
// hook that sees its pipelines.
func busyBatcher(t *testing.T) (b *batcher, client *redis.Client, hook *pipelineSizes, release func()) {
	t.Helper()
	srv := redistest.Start(t)
	// A read timeout longer than the BLPOPs', which go-redis extends only for its BLPop.
	client = redis.NewClient(&redis.Options{Addr: srv.Addr(), ReadTimeout: 30 * time.Second})
	t.Cleanup(func() { _ = client.Close() })
	hook = &pipelineSizes{}
	client.AddHook(hook)
	b = &batcher{client: client}
	return b, client, hook, takeFlushSlots(t, b, srv.Client(t))
}

// takeFlushSlots takes every flush slot of b with a call that waits in Redis (BLPOP, for up to
// 10 s: b's client must read that long) until release is called, which other makes.
func takeFlushSlots(t *testing.T, b *batcher, other redis.Cmdable) (release func()) {
	t.Helper()
	var blocked sync.WaitGroup
	for i := range maxFlushes {
		blocked.Add(1)
		go func() {
			defer blocked.Done()
			cmd := redis.NewCmd(context.Background(), "blpop", "gate:"+strconv.Itoa(i), 10)
			if err := b.do(context.Background(), time.Time{}, cmd); err != nil || cmd.Err() != nil {
				t.Errorf("blpop: %v %v", err, cmd.Err())
			}
		}()
	}
	eventually(t, "every flush slot taken", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.flushing == maxFlushes
	})
	return func() {
		for i := range maxFlushes {
			if err := other.LPush(context.Background(), "gate:"+strconv.Itoa(i), "go").Err(); err != nil {
				t.Fatal(err)
			}
		}
		blocked.Wait()
	}
}

// queueTogether makes calls at once while every flush slot of b is taken (takeFlushSlots, other
// reaching the same Redis), so that all of them queue, then lets them go out together in the next
// pipeline; it returns once each has its answer.
func queueTogether(t *testing.T, b *batcher, other redis.Cmdable, calls ...func()) {
	t.Helper()
	release := takeFlushSlots(t, b, other)
	var wg sync.WaitGroup
	for _, call := range calls {
		wg.Go(call)
	}
	eventually(t, "every call queued", func() bool { return queueLen(b) == len(calls) })
	release()
	wg.Wait()
}

// heldLeases acquires the session "doc" of the users u0 … u(n-1) for tabA on e.
func heldLeases(t *testing.T, e *Engine, n int) []lease.Lease {
	t.Helper()
	leases := make([]lease.Lease, n)
	for i := range leases {
		leases[i] = mustAcquire(t, e, lease.Key{User: "u" + strconv.Itoa(i), Session: "doc"}, tabA, lease.ModeTry) // a TTL of a minute
	}
	return leases
}

func queueLen(b *batcher) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}

func TestCallsMadeWhileRedisWorksGoOutInOnePipelineEachWithItsAnswer(t *testing.T) {
	b, _, hook, release := busyBatcher(t)
	const n = 20
	answers := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := redis.NewCmd(context.Background(), "echo", "call-"+strconv.Itoa(i))
			if errs[i] = b.do(context.Background(), time.Time{}, cmd); errs[i] == nil {
				answers[i], errs[i] = cmd.Text()
			}
		}()
	}
	eventually(t, "every call queued", func() bool { return queueLen(b) == n })
	release()
	wg.Wait()
	for i := range n {
		if errs[i] != nil || answers[i] != "call-"+strconv.Itoa(i) {
			t.Errorf("call %d: %q, %v", i, answers[i], errs[i])
		}
	}
	if got := hook.get(); len(got) != 1 || got[0] != n {
		t.Errorf("pipelines of %v commands, want one of %d", got, n)
	}
}

func TestAQueuedCallWhoseContextEndsIsNeverSent(t *testing.T) {
	b, client, hook, release := busyBatcher(t)
	ctx, cancel := context.WithCancel(context.Background())
	abandoned := make(chan error, 1)
	go func() { abandoned <- b.do(ctx, time.Time{}, redis.NewCmd(ctx, "set", "abandoned", "1")) }()
	eventually(t, "the call queued", func() bool { return queueLen(b) == 1 })
	cancel()
	if err := <-abandoned; !errors.Is(err, context.Canceled) {
		t.Fatalf("abandoned call answered %v, want context.Canceled", err)
	}

	kept := redis.NewCmd(context.Background(), "set", "kept", "1")
	done := make(chan error, 1)
	go func() { done <- b.do(context.Background(), time.Time{}, kept) }()
	eventually(t, "the second call queued", func() bool { return queueLen(b) == 2 })
	release()
	if err := <-done; err != nil || kept.Err() != nil {
		t.Fatalf("kept call: %v, %v", err, kept.Err())
	}
	if n, err := client.Exists(context.Background(), "abandoned", "kept").Result(); err != nil || n != 1 {
		t.Fatalf("%d of the two keys exist (%v), want only kept", n, err)
	}
	if got := hook.get(); len(got) != 0 { // the one call left went alone, not as a pipeline
		t.Errorf("pipelines of %v commands, want none", got)
	}
}

func TestAQueuedCallWhoseDeadlinePassesIsNeverSent(t *testing.T) {
	b, client, _, release := busyBatcher(t)
	deadline := time.Now().Add(50 * time.Millisecond)
	late := make(chan error, 1)
	go func() {
		late <- b.do(context.Background(), deadline, redis.NewCmd(context.Background(), "set", "late", "1"))
	}()
	kept := redis.NewCmd(context.Background(), "set", "kept", "1")
	done := make(chan error, 1)
	go func() { done <- b.do(context.Background(), time.Now().Add(time.Minute), kept) }()
	eventually(t, "both calls queued and the first one's deadline passed", func() bool {
		return queueLen(b) == 2 && time.Now().After(deadline)
	})
	release()
	if err := <-late; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("late call answered %v, want context.DeadlineExceeded", err)
	}
	if err := <-done; err != nil || kept.Err() != nil {
		t.Fatalf("kept call: %v, %v", err, kept.Err())
	}
	if n, err := client.Exists(context.Background(), "late", "kept").Result(); err != nil || n != 1 {
		t.Fatalf("%d of the two keys exist (%v), want only kept", n, err)
	}
}

// stalledBatcher answers a batcher on a fresh Redis that is stopped (SIGSTOP), whose flush slots are
// taken by calls due a second after start, so that the calls made meanwhile queue; and resume,
// which lets Redis run again (at the end of the test, if not before). Only the deadlines bound the
// calls: the client's own timeouts are longer than the tests.
func stalledBatcher(t *testing.T) (b *batcher, start time.Time, resume func()) {
	t.Helper()
	srv := redistest.Start(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1,
		DialTimeout: 5 * time.Minute, ReadTimeout: 5 * time.Minute, WriteTimeout: 5 * time.Minute})
	t.Cleanup(func() { _ = client.Close() })
	b = &batcher{client: client}
	srv.Pause(t)
	var once sync.Once
	resume = func() { once.Do(func() { srv.Resume(t) }) }
	t.Cleanup(resume)
	start = time.Now()
	for range maxFlushes {
		go func() { _ = sendBy(b, start.Add(time.Second), redis.NewCmd(context.Background(), "ping")) }()
	}
	eventually(t, "every flush slot taken", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.flushing == maxFlushes
	})
	return b, start, resume
}

// sendBy sends cmd through b by deadline and answers the call's error, or else the command's.
func sendBy(b *batcher, deadline time.Time, cmd *redis.Cmd) error {
	err := b.do(context.Background(), deadline, cmd)
	if err == nil { // else the pipeline may still write cmd
		err = cmd.Err()
	}
	return err
}

// TestNoCallWaitsPastItsDeadlineWhileRedisStalls: while Redis does not answer, a call that queued
// behind the pipelines in flight is answered by its deadline, though it goes out with a call whose
// deadline is much later.
func TestNoCallWaitsPastItsDeadlineWhileRedisStalls(t *testing.T) {
	b, start, _ := stalledBatcher(t)
	nearDeadline := start.Add(1500 * time.Millisecond)
	near, far := make(chan error, 1), make(chan error, 1)
	go func() { near <- sendBy(b, nearDeadline, redis.NewCmd(context.Background(), "ping")) }()
	eventually(t, "the near call queued", func() bool { return queueLen(b) == 1 })
	go func() { far <- sendBy(b, start.Add(6*time.Second), redis.NewCmd(context.Background(), "ping")) }()
	eventually(t, "both calls queued", func() bool { return queueLen(b) == 2 })
	select {
	case err := <-near:
		if err == nil {
			t.Errorf("the near call answered no error, with Redis stopped")
		}
		// Well past the deadline, for a loaded machine; a pipeline run to the far call's deadline
		// would answer 6 s after the start.
		if late := time.Since(nearDeadline); late > 2500*time.Millisecond {
			t.Errorf("the near call answered %v after its deadline", late)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("the near call is not answered 60 s after its deadline (%v)", nearDeadline)
	}
	<-far
}

// TestACallWithTimeLeftIsAnsweredWhenRedisComesBack: a call that goes out, while Redis does not
// answer, with an older call whose deadline is near is not failed with it: once Redis answers
// again, within the call's own time, the call has its answer.
func TestACallWithTimeLeftIsAnsweredWhenRedisComesBack(t *testing.T) {
	b, start, resume := stalledBatcher(t)
	older, younger := make(chan error, 1), make(chan error, 1)
	go func() {
		older <- sendBy(b, start.Add(1500*time.Millisecond), redis.NewCmd(context.Background(), "set", "older", "1"))
	}()
	eventually(t, "the older call queued", func() bool { return queueLen(b) == 1 })
	go func() {
		younger <- sendBy(b, start.Add(time.Minute), redis.NewCmd(context.Background(), "set", "younger", "1"))
	}()
	eventually(t, "both calls queued", func() bool { return queueLen(b) == 2 })
	if err := <-older; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the older call, with Redis stopped past its deadline: %v, want context.DeadlineExceeded", err)
	}
	resume()
	if err := <-younger; err != nil {
		t.Fatalf("the younger call, Redis answering again within its time: %v, want its answer", err)
	}
}

// TestACallSentAtOnceTakesOnlyTheQueuedCallsDueNoLater: the call that sends a pipeline itself waits
// for all of it, so it takes along only queued calls whose deadline is no later than its own; the
// others stay queued, in their order, for the next pipeline.
func TestACallSentAtOnceTakesOnlyTheQueuedCallsDueNoLater(t *testing.T) {
	now := time.Now()
	queued := func(d time.Duration) *batchCall {
		return &batchCall{deadline: now.Add(d), done: make(chan struct{})}
	}
	early, later, earlier, none := queued(time.Second), queued(3*time.Second), queued(1500*time.Millisecond), &batchCall{done: make(chan struct{})}
	b := &batcher{queue: []*batchCall{early, later, earlier, none}}
	first := &batchCall{deadline: now.Add(2 * time.Second)}
	batch := b.take(first)
	if len(batch) != 3 || batch[0] != early || batch[1] != earlier || batch[2] != first {
		t.Errorf("the batch is %v, want the early call, the earlier one and the first", batch)
	}
	if len(b.queue) != 2 || b.queue[0] != later || b.queue[1] != none {
		t.Errorf("the queue is %v, want the later call and the one with no deadline, in their order", b.queue)
	}
}

func TestAnErrorAnswerInABatchIsItsCallsOnly(t *testing.T) {
	b, client, _, release := busyBatcher(t)
	if err := client.Set(context.Background(), "text", "not a number", 0).Err(); err != nil {
		t.Fatal(err)
	}
	bad := redis.NewCmd(context.Background(), "incr", "text")
	good := redis.NewCmd(context.Background(), "incr", "counter")
	var wg sync.WaitGroup
	for _, cmd := range []*redis.Cmd{bad, good} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := b.do(context.Background(), time.Time{}, cmd); err != nil {
				t.Errorf("do: %v", err)
			}
		}()
	}
	eventually(t, "both calls queued", func() bool { return queueLen(b) == 2 })
	release()
	wg.Wait()
	var reply redis.Error
	if !errors.As(bad.Err(), &reply) {
		t.Errorf("INCR of text: %v, want Redis's error", bad.Err())
	}
	if n, err := good.Int(); err != nil || n != 1 {
		t.Errorf("INCR of counter: %d, %v; want 1", n, err)
	}
}

func TestALoneCallGoesOutAlone(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	hook := &pipelineSizes{}
	client.AddHook(hook)
	b := &batcher{client: client}
	for i := range 10 {
		cmd := redis.NewCmd(context.Background(), "incr", "n")
		if err := b.do(context.Background(), time.Time{}, cmd); err != nil {
			t.Fatal(err)
		}
		if n, err := cmd.Int(); err != nil || n != i+1 {
			t.Fatalf("INCR %d: %d, %v", i, n, err)
		}
	}
	if got := hook.get(); len(got) != 0 {
		t.Errorf("pipelines of %v commands, want none", got)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.flushing != 0 || len(b.queue) != 0 {
		t.Errorf("after the calls: %d flushing, %d queued; want none", b.flushing, len(b.queue))
	}
}

func TestEachPrimaryOfAClusterHasABatcherOfItsOwn(t *testing.T) {
	c := redistest.StartCluster(t)
	addrs := c.Addrs()
	client, err := NewClient("redis://"+addrs[0]+"?cluster=true&addr="+strings.Join(addrs[1:], "&addr="), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	// Two keys of each primary.
	keys := map[string][]string{}
	full := func() bool {
		for _, ks := range keys {
			if len(ks) < 2 {
				return false
			}
		}
		return len(keys) == 3
	}
	for i := 0; i < 1000 && !full(); i++ {
		key := "tablease:{u" + strconv.Itoa(i) + "}:lease:doc"
		p := c.PrimaryOf(t, key).Addr()
		if len(keys[p]) < 2 {
			keys[p] = append(keys[p], key)
		}
	}
	bs := newBatchers(client)
	seen := map[*batcher]string{}
	for p, ks := range keys {
		b := bs.of(t.Context(), ks[0])
		if other := bs.of(t.Context(), ks[1]); other != b {
			t.Errorf("two keys of the primary %s have two batchers", p)
		}
		if q, ok := seen[b]; ok {
			t.Errorf("the primaries %s and %s share a batcher", p, q)
		}
		seen[b] = p
	}
	if len(seen) != 3 {
		t.Errorf("%d batchers for the 3 primaries", len(seen))
	}
}

// patientEngine is an engine on the Redis of url whose client, with hooks, waits 30 s for an
// answer: longer than the BLPOPs that keep the flush slots (takeFlushSlots).
func patientEngine(t *testing.T, url string, hooks ...redis.Hook) (*Engine, redis.UniversalClient) {
	t.Helper()
	client, err := NewClient(url, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	for _, h := range hooks {
		client.AddHook(h)
	}
	e, err := New(client, Options{Prefix: "p", OpTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e, client
}

// fcalls is a go-redis hook that records the function and the number of keys of every FCALL
// sent, alone or in a pipeline.
type fcalls struct {
	mu    sync.Mutex
	calls []string // "<function> <numkeys>"
}

func (h *fcalls) record(cmds ...redis.Cmder) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range cmds {
		if a := c.Args(); len(a) > 2 && a[0] == "fcall" {
			name := strings.TrimPrefix(a[1].(string), libraryName+"_")
			h.calls = append(h.calls, name+" "+strconv.Itoa(a[2].(int)))
		}
	}
}

func (h *fcalls) get() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.calls...)
}

func (h *fcalls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *fcalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { h.record(cmd); return next(ctx, cmd) }
}
func (h *fcalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { h.record(cmds...); return next(ctx, cmds) }
}

// The usual renews that queue while Redis works go out in one call of renew_many.lua, each
// answered as it would be alone; one that needs more (it shortens its lease) is deferred by it
// and made alone with every key, and the others' expiry is the one they asked for.
func TestUsualRenewsThatQueueTogetherShareOneFunctionCall(t *testing.T) {
	srv := redistest.Start(t)
	hook := &fcalls{}
	e, client := patientEngine(t, srv.URL(), hook)
	ctx := t.Context()
	const n = 6
	leases := heldLeases(t, e, n)
	before := len(hook.get())

	renewed := make([]lease.Lease, n)
	errs := make([]error, n)
	calls := make([]func(), n)
	for i := range n {
		ttl := time.Minute
		if i == n-1 {
			ttl = 30 * time.Second // shortens the lease: not the usual renew
		}
		calls[i] = func() {
			renewed[i], errs[i] = e.Renew(ctx, lease.RenewRequest{Key: leases[i].Key, TabID: tabA.TabID, Epoch: leases[i].Epoch, TTL: ttl})
		}
	}
	queueTogether(t, e.batches.shared, srv.Client(t), calls...)
	for i := range n {
		want := time.Minute
		if i == n-1 {
			want = 30 * time.Second
		}
		if l := renewed[i]; errs[i] != nil || !l.HeldBy(tabA.TabID, leases[i].Epoch) || l.TTL != want ||
			l.ExpiresAt.Sub(l.Now) != want || l.Holder != tabA || l.Transitions != leases[i].Transitions {
			t.Errorf("renew %d: %+v, %v; want held by %s at %d for %v", i, l, errs[i], tabA.TabID, leases[i].Epoch, want)
		}
	}
	// Each renew's expiry is in the store as it answered it.
	for i := range n {
		if got, err := client.HGet(ctx, e.stateKey(leases[i].Key), "expires_us").Int64(); err != nil || got != renewed[i].ExpiresAt.UnixMicro() {
			t.Errorf("renew %d: the store's expiry %d (%v), want %d", i, got, err, renewed[i].ExpiresAt.UnixMicro())
		}
	}
	want := []string{"renew_many " + strconv.Itoa(2*n), "renew 8"}
	if got := hook.get()[before:]; !slices.Equal(got, want) {
		t.Errorf("function calls %v, want %v: the queued renews in one, then the deferred one alone with every key", got, want)
	}
}

func TestMergeGroupsAreUsersOnACluster(t *testing.T) {
	for _, c := range []struct {
		key     string
		cluster bool
		want    string
	}{
		{"p:{alice}:lease:doc-1", true, "{alice}"},
		{"p:{alice}:lease:doc-2", true, "{alice}"},
		{"p:{bob}:lease:doc-1", true, "{bob}"},
		{"p:{alice}:lease:doc-1", false, ""},
		{"no-tag", true, "no-tag"},
	} {
		if got := mergeGroup(c.key, c.cluster); got != c.want {
			t.Errorf("mergeGroup(%q, %v) = %q, want %q", c.key, c.cluster, got, c.want)
		}
	}
}

// The changes that queue while Redis works go out in one call of change_many.lua, each answered as
// it would be alone: a grant, a refusal, a release, presence written and removed, and a call whose
// function fails, whose error is its own; and a merged call that go-redis sends again (its answer
// lost) after another tab's call is answered as it was the first time and changes nothing.
func TestChangesThatQueueTogetherShareOneFunctionCall(t *testing.T) {
	for _, resent := range []bool{false, true} {
		t.Run(map[bool]string{false: "sent once", true: "resent"}[resent], func(t *testing.T) {
			srv := redistest.Start(t)
			var between func() // run between the two sends of a resent call
			hook := &fcalls{}
			hooks := []redis.Hook{hook}
			if resent {
				hooks = []redis.Hook{twiceAfter{func() { between() }}, hook} // hook sees both sends
			}
			e, client := patientEngine(t, srv.URL(), hooks...)
			ctx := t.Context()
			key := func(user string) lease.Key { return lease.Key{User: user, Session: "doc"} }
			held := mustAcquire(t, e, key("u0"), tabA, lease.ModeTry)
			released := mustAcquire(t, e, key("u1"), tabA, lease.ModeTry)
			takenOver := mustAcquire(t, e, key("u5"), tabA, lease.ModeTry)
			// Between the two sends of a resent call, tab-c takes u5 over, through another client.
			e2, _ := patientEngine(t, srv.URL())
			tabC := lease.Holder{TabID: "tab-c"}
			between = func() { mustAcquire(t, e2, key("u5"), tabC, lease.ModeTakeover) }
			if _, err := e.Join(ctx, key("u2"), "c-left", lease.Tab{TabID: "tab-l"}, 1); err != nil {
				t.Fatal(err)
			}
			// A state key that is not a hash: the function fails on it (WRONGTYPE).
			if err := client.Set(ctx, e.stateKey(key("u3")), "not a hash", 0).Err(); err != nil {
				t.Fatal(err)
			}
			before := len(hook.get())

			var (
				granted, took              lease.Lease
				tookErr                    error
				grantErr, heldErr, failErr error
				rel                        lease.ReleaseResult
				relErr, joinErr, leaveErr  error
			)
			calls := []func(){
				func() {
					granted, grantErr = e.Acquire(ctx, lease.AcquireRequest{Key: key("u4"), Holder: tabB, Mode: lease.ModeTry})
				},
				func() {
					_, heldErr = e.Acquire(ctx, lease.AcquireRequest{Key: key("u0"), Holder: tabB, Mode: lease.ModeTry})
				},
				func() {
					took, tookErr = e.Acquire(ctx, lease.AcquireRequest{Key: key("u5"), Holder: tabB, Mode: lease.ModeTakeover})
				},
				func() {
					rel, relErr = e.Release(ctx, lease.ReleaseRequest{Key: key("u1"), TabID: tabA.TabID, Epoch: released.Epoch})
				},
				func() { _, joinErr = e.Join(ctx, key("u2"), "c-new", lease.Tab{TabID: "tab-n"}, 1) },
				func() { leaveErr = e.Leave(ctx, key("u2"), "c-left", "tab-l", 2) },
				func() {
					_, failErr = e.Acquire(ctx, lease.AcquireRequest{Key: key("u3"), Holder: tabB, Mode: lease.ModeTry})
				},
			}
			queueTogether(t, e.batches.shared, srv.Client(t), calls...)
			made := hook.get()[before:]

			if grantErr != nil || !granted.Held || granted.Holder != tabB || granted.Transitions != 1 {
				t.Errorf("the grant: %+v, %v; want tab-b holding after one grant", granted, grantErr)
			}
			// A takeover made twice would mint two epochs: a resent one is answered as it was.
			if tookErr != nil || !took.Held || took.Holder != tabB || took.Transitions != 2 || took.Epoch <= takenOver.Epoch {
				t.Errorf("the takeover: %+v, %v; want tab-b holding after two grants", took, tookErr)
			}
			if g, err := e.Get(ctx, key("u5")); err != nil || resent && (g.Holder != tabC || g.Transitions != 3) ||
				!resent && (!g.HeldBy(tabB.TabID, took.Epoch) || g.Transitions != 2) {
				t.Errorf("u5 after the takeover (resent %v, tab-c's takeover in between): %+v, %v", resent, g, err)
			}
			var he *lease.HeldError
			if !errors.As(heldErr, &he) || he.Holder != tabA || he.Epoch != held.Epoch {
				t.Errorf("the try of a held lease: %v; want held by tab-a at %d", heldErr, held.Epoch)
			}
			if relErr != nil || !rel.Released || rel.Lease.Held {
				t.Errorf("the release: %+v, %v; want released", rel, relErr)
			}
			if joinErr != nil || leaveErr != nil {
				t.Errorf("join %v, leave %v; want both made", joinErr, leaveErr)
			}
			var ue *lease.UnavailableError
			if !errors.As(failErr, &ue) || !strings.Contains(failErr.Error(), "WRONGTYPE") {
				t.Errorf("the acquire whose function fails: %v; want unavailable, with Redis's WRONGTYPE", failErr)
			}
			// The store holds what each answered, once.
			// (A function called after the merged call reads the store clock anew.)
			if g, err := e.Get(ctx, key("u4")); err != nil || !g.HeldBy(tabB.TabID, granted.Epoch) || g.Transitions != 1 ||
				!g.Now.After(granted.Now) {
				t.Errorf("u4 after the grant at %v: %+v, %v", granted.Now, g, err)
			}
			if g, err := e.Get(ctx, key("u0")); err != nil || !g.HeldBy(tabA.TabID, held.Epoch) || g.Transitions != 1 {
				t.Errorf("u0 after the refused try: %+v, %v", g, err)
			}
			if g, err := e.Get(ctx, key("u1")); err != nil || g.Held || g.Epoch != released.Epoch {
				t.Errorf("u1 after the release: %+v, %v", g, err)
			}
			if tabs, err := e.Tabs(ctx, key("u2")); err != nil || len(tabs) != 1 || tabs[0].TabID != "tab-n" {
				t.Errorf("u2's presence: %+v, %v; want tab-n alone", tabs, err)
			}
			p, err := e.Audit(ctx, lease.AuditQuery{User: "u4", Limit: 10})
			if err != nil || len(p.Records) != 1 || p.Records[0].Action != lease.AuditGrant {
				t.Errorf("u4's audit: %+v, %v; want its grant once", p.Records, err)
			}
			sent := 1
			if resent {
				sent = 2
			}
			want := slices.Repeat([]string{"change_many " + strconv.Itoa(9*len(calls))}, sent)
			if !slices.Equal(made, want) {
				t.Errorf("function calls %v, want %v: the queued changes in one", made, want)
			}
		})
	}
}

// change_many refuses, before it makes any call, arguments it cannot read as calls: a function it
// does not make (revoke, whose flags differ), a count of arguments past the end, arguments after
// the last call, keys that are not nine per call.
func TestChangeManyRefusesWhatIsNotCallsBeforeMakingAny(t *testing.T) {
	srv := redistest.Start(t)
	e, client := patientEngine(t, srv.URL())
	ctx := t.Context()
	mustAcquire(t, e, alice, tabA, lease.ModeTry) // loads the library
	keys := e.sessionKeys(lease.Key{User: "u", Session: "doc"}, newReply())
	acquire := []any{"acquire", 7, tabB.TabID, "", "0", 60000, "try", 1000, 1000}
	for _, c := range []struct {
		name string
		keys []string
		args []any
	}{
		{"a function it does not make", keys, []any{"revoke", 0}},
		{"a count past the end", keys, []any{"acquire", 8, tabB.TabID, "", "0", 60000, "try", 1000, 1000}},
		{"arguments after the last call", keys, append(slices.Clone(acquire), "release")},
		{"keys that are not nine per call", keys[:8], acquire},
		{"a good call before a bad one", append(slices.Clone(keys), keys...), append(slices.Clone(acquire), "acquire", -1)},
	} {
		err := client.FCall(ctx, changeManyFn.fcall, c.keys, append(slices.Clone(e.common), c.args...)...).Err()
		if err == nil || !strings.Contains(err.Error(), "change_many") {
			t.Errorf("%s: %v, want change_many's refusal", c.name, err)
		}
	}
	if n, err := client.Exists(ctx, keys...).Result(); err != nil || n != 0 {
		t.Errorf("%d keys of the session written (%v), want none", n, err)
	}
}

// twiceAfter is a go-redis hook that sends each call of change_many.lua twice, running between in
// the meantime, and keeps the second answer, as when go-redis sends a command again after losing
// its answer while other clients' calls ran.
type twiceAfter struct{ between func() }

func (twiceAfter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (twiceAfter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h twiceAfter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); len(a) > 1 && a[1] == changeManyFn.fcall {
			if err := next(ctx, cmd.Clone()); err != nil {
				return err
			}
			h.between()
		}
		return next(ctx, cmd)
	}
}

// On a Cluster the changes queued for one primary share a function call per user, whose keys
// share a slot: two users' acquires on one primary go in two calls of change_many.lua, each
// answered (one call for both users would be refused, CROSSSLOT).
func TestChangesOfEachUserShareAFunctionCallOnACluster(t *testing.T) {
	c := redistest.StartCluster(t)
	addrs := c.Addrs()
	url := "redis://" + addrs[0] + "?cluster=true&addr=" + strings.Join(addrs[1:], "&addr=")
	hook := &fcalls{}
	e, _ := patientEngine(t, url, hook)
	ctx := t.Context()
	// Two users whose keys are on one primary.
	var users []string
	var primary string
	for i := 0; i < 1000 && len(users) < 2; i++ {
		u := "u" + strconv.Itoa(i)
		p := c.PrimaryOf(t, e.stateKey(lease.Key{User: u, Session: "doc"})).Addr()
		if primary == "" {
			primary = p
		}
		if p == primary {
			users = append(users, u)
		}
	}
	if len(users) < 2 {
		t.Fatal("no two users on one primary")
	}
	mustAcquire(t, e, lease.Key{User: users[0], Session: "doc"}, tabA, lease.ModeTry) // loads the library on the primary
	_, other := patientEngine(t, url)
	b := e.batches.of(ctx, e.stateKey(lease.Key{User: users[0], Session: "doc"}))
	before := len(hook.get())

	keys := []lease.Key{{User: users[0], Session: "a"}, {User: users[0], Session: "b"},
		{User: users[1], Session: "a"}, {User: users[1], Session: "b"}}
	got := make([]lease.Lease, len(keys))
	errs := make([]error, len(keys))
	calls := make([]func(), len(keys))
	for i, k := range keys {
		calls[i] = func() {
			got[i], errs[i] = e.Acquire(ctx, lease.AcquireRequest{Key: k, Holder: tabA, Mode: lease.ModeTry})
		}
	}
	queueTogether(t, b, other, calls...)
	made := hook.get()[before:]
	for i, k := range keys {
		if errs[i] != nil || !got[i].Held || got[i].Holder != tabA || got[i].Key != k {
			t.Errorf("acquire of %v: %+v, %v; want tab-a holding", k, got[i], errs[i])
		}
	}
	var changes []string
	for _, m := range made {
		if strings.HasPrefix(m, "change_many ") {
			changes = append(changes, m)
		}
	}
	if want := []string{"change_many 18", "change_many 18"}; !slices.Equal(changes, want) {
		t.Errorf("function calls %v, want %v: one per user", made, want)
	}
}

// The usual checks that queue while Redis works go out in one call of check_many.lua, each
// answered as it would be alone; one of an epoch the tab does not hold is deferred by it and made
// alone with every key, which answers it lost.
func TestUsualChecksThatQueueTogetherShareOneFunctionCall(t *testing.T) {
	srv := redistest.Start(t)
	hook := &fcalls{}
	e, _ := patientEngine(t, srv.URL(), hook)
	ctx := t.Context()
	const n = 5
	leases := heldLeases(t, e, n)
	before := len(hook.get())

	checked := make([]lease.Lease, n)
	errs := make([]error, n)
	calls := make([]func(), n)
	for i := range n {
		epoch := leases[i].Epoch
		if i == n-1 {
			epoch-- // not the epoch the tab holds
		}
		calls[i] = func() { checked[i], errs[i] = e.Check(ctx, leases[i].Key, tabA.TabID, epoch) }
	}
	queueTogether(t, e.batches.shared, srv.Client(t), calls...)
	made := hook.get()[before:]
	for i := range n - 1 {
		if l := checked[i]; errs[i] != nil || !l.HeldBy(tabA.TabID, leases[i].Epoch) || !l.ExpiresAt.Equal(leases[i].ExpiresAt) ||
			l.Holder != tabA || l.Transitions != 1 {
			t.Errorf("check %d: %+v, %v; want held by %s at %d until %v", i, l, errs[i], tabA.TabID, leases[i].Epoch, leases[i].ExpiresAt)
		}
	}
	if !errors.Is(errs[n-1], lease.ErrLost) {
		t.Errorf("check of an epoch not held: %v, want lost", errs[n-1])
	}
	if want := []string{"check_many " + strconv.Itoa(2*n), "check 8"}; !slices.Equal(made, want) {
		t.Errorf("function calls %v, want %v: the queued checks in one, then the deferred one alone with every key", made, want)
	}
}
