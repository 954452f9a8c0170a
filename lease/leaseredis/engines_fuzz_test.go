package leaseredis_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tablease/tablease/internal/redistest"
	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/lease/leasemem"
	"github.com/tablease/tablease/lease/leaseredis"
)

// FuzzEnginesAgree runs a program read from the fuzz input (acquires in every mode, renews,
// releases, checks, gets, admin revokes and blocks, presence joins and leaves, watches, lease
// listings, and steps of the clock) against leasemem and against leaseredis on a private Redis, both
// reading the same clock, and requires the same answers, the same events and the same audit
// records from both. It also checks what holds of either engine alone: a lease answer is read at
// the clock's time and is held only before its expiry, an epoch minted is above every epoch seen
// before, a renew or check succeeds exactly when the last state seen says the tab holds the lease,
// event ids strictly increase, and a watch resumed from its first event replays the rest as the
// live watch delivered it.
//
// Same times for both: the Redis scripts read the store clock with redis.call('TIME'); the client
// of this test carries a hook (storeClock) that hands Redis each script with that call reading the
// test's clock from a key instead, which the test sets with every step. leasemem reads the same
// clock through Options.Now. The engines themselves run unchanged.
func FuzzEnginesAgree(f *testing.F) {
	for _, seed := range engineSeeds {
		f.Add(seed)
	}
	srv := redistest.Start(f)
	client, err := leaseredis.NewClient(srv.URL(), fuzzOpTimeout)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = client.Close() })
	clock := newStoreClock(client)
	client.AddHook(clock)
	var runs atomic.Int64
	f.Fuzz(func(t *testing.T, prog []byte) {
		p := startProgram(t, client, clock, fmt.Sprintf("fuzz-%d", runs.Add(1)))
		p.run(prog)
		p.finish()
	})
}

// fuzzOpTimeout bounds each Redis call; a program never waits for a store that does not answer.
const fuzzOpTimeout = 5 * time.Second

// The engines' options: short enough that clock steps of a few seconds cross every boundary.
var (
	fuzzLimits         = lease.Limits{Min: time.Second, Default: 4 * time.Second, Max: 8 * time.Second, HiddenMax: 12 * time.Second}
	fuzzPresenceTTL    = 5 * time.Second
	fuzzHandoffTimeout = 6 * time.Second // longer than the default TTL, shorter than the longest
	fuzzHandoffReserve = 2 * time.Second
	// A log and a watch buffer far longer than a program's events, so that neither trims nor
	// resyncs.
	fuzzLogLen      = 4096
	fuzzWatchBuffer = 4096
)

// engineSeeds start the corpus (besides testdata/fuzz/FuzzEnginesAgree): programs that reach
// each part of the lifecycle and step the clock to its boundaries (see program.step for the
// encoding).
var engineSeeds = [][]byte{
	// try, renew, release; get.
	{opAcquire, 0x00, 0x00, opRenew, 0x00, 0x00, opRelease, 0x00, 0x00, opGet},
	// tab 0 holds; tab 1 tries (held) and takes over; tab 0 renews and checks (lost); tab 1 checks.
	{opAcquire, 0x00, 0x00, opAcquire, 0x01, 0x00, opAcquire, 0x11, 0x00, opRenew, 0x00, 0x01, opCheck, 0x00, 0x01, opCheck, 0x01, 0x00},
	// tab 0 holds; the clock steps exactly to its expiry; tab 1 acquires; tab 0 renews.
	{opAcquire, 0x00, 0x00, opStep, 0x09, 0x00, opAcquire, 0x01, 0x00, opRenew, 0x00, 0x01},
	// the same a millisecond before the expiry, then half a second on, and a check.
	{opAcquire, 0x00, 0x00, opStep, 0x08, 0x00, opAcquire, 0x01, 0x00, opStep, 0x01, 0x00, opCheck, 0x00, 0x00},
	// a handoff: tab 0 holds, tab 1 asks twice, tab 0 releases, tab 2 tries, tab 1 claims.
	{opAcquire, 0x00, 0x00, opAcquire, 0x21, 0x00, opAcquire, 0x21, 0x00, opRelease, 0x00, 0x00, opAcquire, 0x02, 0x00, opAcquire, 0x01, 0x00},
	// a handoff whose holder lets the lease expire: tab 2 tries at the expiry and exactly when the
	// reservation ends.
	{opAcquire, 0x00, 0x00, opAcquire, 0x21, 0x00, opStep, 0x09, 0x00, opAcquire, 0x02, 0x00, opGet, opStep, 0x09, 0x00, opAcquire, 0x02, 0x00},
	// a takeover during a handoff request; a new request, a release that reserves, a revoke of the
	// reserved lease, and a try by another tab.
	{opAcquire, 0x00, 0x00, opAcquire, 0x21, 0x00, opAcquire, 0x12, 0x00, opAcquire, 0x21, 0x00, opRelease, 0x02, 0x00, opRevoke, 0x00, opAcquire, 0x02, 0x00},
	// a revoke with a block and a request id, its retry, an acquire while blocked and exactly at
	// the end of the block.
	{opAcquire, 0x00, 0x00, opRevoke, 0x11, opRevoke, 0x11, opAcquire, 0x01, 0x00, opGet, opStep, 0x09, 0x00, opAcquire, 0x01, 0x00},
	// presence: two tabs join, a watch, one leaves, the other's entry reaches its expiry.
	{opJoin, 0x00, opJoin, 0x11, opTabs, opWatch, opLeave, 0x00, opStep, 0x09, 0x01, opTabs, opList},
	// TTLs clamped (hidden 30 s, 1 ms, a fraction of a millisecond); a step to a millisecond before
	// the expiry, a check, a step of a millisecond, a get.
	{opAcquire, 0x00, 0x44, opRenew, 0x10, 0x00, opRenew, 0x54, 0x00, opStep, 0x08, 0x00, opCheck, 0x00, 0x00, opStep, 0x00, 0x00, opGet},
	// the holder acquires again with another label, renews hidden and visible.
	{opAcquire, 0x00, 0x00, opAcquire, 0x00, 0x01, opRenew, 0x04, 0x00, opRenew, 0x00, 0x00, opGet},
	// invalid arguments: a tab id, a mode, a label, a TTL, an epoch of 0, a block of 1.5 ms.
	{opAcquire, 0x03, 0x00, opAcquire, 0x40, 0x00, opAcquire, 0x00, 0x03, opAcquire, 0x00, 0x60, opAcquire, 0x00, 0x00,
		opRenew, 0x00, 0x0f, opRelease, 0x00, 0x0f, opRevoke, 0x03},
}

// Operations: the first byte of a step, modulo numOps.
const (
	opAcquire = iota
	opRenew
	opRelease
	opCheck
	opGet
	opRevoke
	opJoin
	opLeave
	opTabs
	opWatch
	opList
	opStep
	numOps
)

const maxProgramSteps = 96

// The tabs, labels, TTLs, epochs and steps a program picks from. The last tab id and the last
// label are invalid, so that both engines must refuse them alike.
var (
	fuzzTabs   = []string{"tab-0", "tab-1", "tab-2", "tab 3!"}
	fuzzLabels = []string{"", "Events — /events/evt-1", "x", "\x00bad"}
	fuzzTTLs   = []time.Duration{0, time.Millisecond, 1500 * time.Millisecond, 8 * time.Second, 30 * time.Second,
		1234567 * time.Microsecond, -time.Millisecond}
	fuzzModes  = []lease.Mode{lease.ModeTry, lease.ModeTakeover, lease.ModeHandoff, "", "steal"}
	fuzzBlocks = []time.Duration{0, 2 * time.Second, 5 * time.Second, 1500 * time.Microsecond}
	fuzzReqIDs = []string{"", "rq-1", "rq-2"}
	// fuzzSteps are the fixed clock steps; a step may instead go to a deadline of the state.
	fuzzSteps = []time.Duration{time.Millisecond, 499 * time.Millisecond, time.Second, 3 * time.Second, 7 * time.Second}
)

// storeClock is the clock both engines read in a program: leasemem through Options.Now, Redis
// through the scripts, whose redis.call('TIME') it replaces (as a go-redis hook) with a read of
// the key clockKey, which set writes. Scripts keep their keys and arguments; only the time they
// read changes.
type storeClock struct {
	client redis.UniversalClient
	now    atomic.Int64 // unix microseconds

	mu sync.Mutex
	// shas maps the SHA1 of a script as the engine sends it to the SHA1 of the script Redis runs.
	shas map[string]string
}

const (
	clockKey  = "fuzz:clock"
	clockCall = "redis.call('HMGET', '" + clockKey + "', 's', 'us')"
)

// timeCall is how a script reads the store clock; timeWord finds any other way of naming TIME,
// which the hook could not rewrite.
var (
	timeCall = regexp.MustCompile(`redis\.p?call\(\s*['"]TIME['"]\s*\)`)
	timeWord = regexp.MustCompile(`['"]TIME['"]`)
)

func newStoreClock(client redis.UniversalClient) *storeClock {
	return &storeClock{client: client, shas: make(map[string]string)}
}

// set moves both engines' clock to at.
func (c *storeClock) set(t *testing.T, at time.Time) {
	t.Helper()
	us := at.UnixMicro()
	ctx, cancel := context.WithTimeout(context.Background(), fuzzOpTimeout)
	defer cancel()
	if err := c.client.HSet(ctx, clockKey, "s", us/1e6, "us", us%1e6).Err(); err != nil {
		t.Fatalf("setting the store clock: %v", err)
	}
	c.now.Store(us)
}

// Now is leasemem's clock.
func (c *storeClock) Now() time.Time { return time.UnixMicro(c.now.Load()) }

func (c *storeClock) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *storeClock) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.rewrite(cmd)
		return next(ctx, cmd)
	}
}

func (c *storeClock) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.rewrite(cmd)
		}
		return next(ctx, cmds)
	}
}

// rewrite changes EVAL of a script into EVAL of the script reading the test's clock, EVALSHA of a
// script into EVALSHA of its rewritten form, and FUNCTION LOAD of the library into FUNCTION LOAD
// of the library reading the test's clock (under the same name: the test's Redis is its own). An
// EVALSHA of a script not rewritten yet goes out as it is: Redis, which never saw the original,
// answers NOSCRIPT, and go-redis sends the EVAL.
func (c *storeClock) rewrite(cmd redis.Cmder) {
	args := cmd.Args()
	if len(args) < 2 {
		return
	}
	clocked := func(src string) string {
		mod := timeCall.ReplaceAllLiteralString(src, clockCall)
		if timeWord.MatchString(mod) {
			panic("a script reads TIME in a way the test's clock hook does not rewrite:\n" + src)
		}
		return mod
	}
	name, _ := args[0].(string)
	switch strings.ToLower(name) {
	case "eval", "eval_ro":
		src, _ := args[1].(string)
		mod := clocked(src)
		c.mu.Lock()
		c.shas[sha1Hex(src)] = sha1Hex(mod)
		c.mu.Unlock()
		args[1] = mod
	case "evalsha", "evalsha_ro":
		sha, _ := args[1].(string)
		c.mu.Lock()
		if mod, ok := c.shas[sha]; ok {
			args[1] = mod
		}
		c.mu.Unlock()
	case "function":
		if sub, _ := args[1].(string); strings.EqualFold(sub, "load") {
			src, _ := args[len(args)-1].(string)
			args[len(args)-1] = clocked(src)
		}
	}
}

func sha1Hex(s string) string {
	sum := sha1.Sum([]byte(s))
	return hex.EncodeToString(sum[:])
}

// engine is one side of the comparison.
type engine struct {
	name  string
	store lease.Store
	live  *lease.Watch // watches the session from the start of the program
}

// program runs one fuzz input against both engines.
type program struct {
	t      *testing.T
	ctx    context.Context
	clock  *storeClock
	key    lease.Key
	mem    engine
	redis  engine
	input  []byte
	trace  []string // what ran, for the failure message
	epochs []int64  // every epoch answered, in order
	// last is the lease as last answered in full (nil when an operation changed it without
	// answering it); maxEpoch the highest epoch minted so far.
	last     *lease.Lease
	maxEpoch int64
	// joined maps each connection that joined to the expiry of its entry.
	joined map[string]time.Time
}

func startProgram(t *testing.T, client redis.UniversalClient, clock *storeClock, prefix string) *program {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	// A clock near the real one: Redis still expires keys (the logs' TTLs) in real time.
	clock.set(t, time.Now().Truncate(time.Millisecond))
	mem, err := leasemem.New(leasemem.Options{
		Limits: fuzzLimits, Now: clock.Now, EventLogLen: fuzzLogLen, WatchBuffer: fuzzWatchBuffer,
		PresenceTTL: fuzzPresenceTTL, HandoffTimeout: fuzzHandoffTimeout, HandoffReserve: fuzzHandoffReserve,
	})
	if err != nil {
		t.Fatal(err)
	}
	red, err := leaseredis.New(client, leaseredis.Options{
		Limits: fuzzLimits, Prefix: prefix, OpTimeout: fuzzOpTimeout, EventLogLen: fuzzLogLen,
		WatchBuffer: fuzzWatchBuffer, PresenceTTL: fuzzPresenceTTL,
		HandoffTimeout: fuzzHandoffTimeout, HandoffReserve: fuzzHandoffReserve,
	})
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last registered first: the watches registered below close first, then the
	// engines, then the program's keys go (programs run one at a time per Redis).
	t.Cleanup(func() {
		_ = red.Close()
		_ = mem.Close()
		if err := client.FlushDB(context.Background()).Err(); err != nil {
			t.Errorf("flushing the fuzz Redis: %v", err)
		}
	})
	p := &program{
		t: t, ctx: ctx, clock: clock, key: lease.Key{User: "alice", Session: "doc-1"},
		mem: engine{name: "leasemem", store: mem}, redis: engine{name: "leaseredis", store: red},
		joined: make(map[string]time.Time),
	}
	for _, e := range []*engine{&p.mem, &p.redis} {
		w, err := e.store.Watch(ctx, p.key, "")
		if err != nil {
			t.Fatalf("%s: Watch: %v", e.name, err)
		}
		t.Cleanup(w.Close)
		e.live = w
	}
	return p
}

// next reads the next byte of the input; 0 once it is used up.
func (p *program) next() byte {
	if len(p.input) == 0 {
		return 0
	}
	b := p.input[0]
	p.input = p.input[1:]
	return b
}

func pick[T any](list []T, b byte) T { return list[int(b)%len(list)] }

func (p *program) run(prog []byte) {
	p.input = prog
	for i := 0; i < maxProgramSteps && len(p.input) > 0; i++ {
		p.step()
	}
}

// step runs one operation: the first byte names it, the next ones are its arguments, each an index
// into the lists above (taken modulo their length) in a few bits:
//
//	acquire  tab | mode<<4, label | hidden<<2 | ttl<<4
//	renew    tab | hidden<<2 | ttl<<4, epoch (see program.epoch)
//	release  tab, epoch
//	check    tab, epoch
//	revoke   block | request id<<4
//	join     conn | hidden<<2 | label<<3 | tab<<4
//	leave    conn | tab<<4
//	step     kind, deadline (see program.stepClock)
//
// get, tabs, watch and list take none.
func (p *program) step() {
	switch op := p.next() % numOps; op {
	case opAcquire:
		a, b := p.next(), p.next()
		req := lease.AcquireRequest{
			Key: p.key, Holder: lease.Holder{TabID: pick(fuzzTabs, a&0x0f), Label: pick(fuzzLabels, b&0x03), Hidden: b&0x04 != 0},
			TTL: pick(fuzzTTLs, b>>4), Mode: pick(fuzzModes, a>>4),
		}
		p.logf("acquire %+v", req)
		heldBefore := p.heldBy(req.Holder.TabID, p.maxEpoch)
		m, mErr := p.mem.store.Acquire(p.ctx, req)
		r, rErr := p.redis.store.Acquire(p.ctx, req)
		p.agree("acquire", m, mErr, r, rErr)
		if mErr == nil {
			// A grant mints an epoch above all others; the holder acquiring again keeps its own.
			if m.Epoch > p.maxEpoch {
				p.minted(m.Epoch)
			} else if p.last != nil && !heldBefore {
				p.t.Fatalf("acquire granted epoch %d, not above %d, to a tab that did not hold the lease\n%s", m.Epoch, p.maxEpoch, p.history())
			}
			p.seen(m)
		} else {
			p.seenErr(mErr)
		}
	case opRenew:
		a, b := p.next(), p.next()
		req := lease.RenewRequest{Key: p.key, TabID: pick(fuzzTabs, a&0x03), Epoch: p.epoch(b), TTL: pick(fuzzTTLs, a>>4), Hidden: a&0x04 != 0}
		p.logf("renew %+v", req)
		heldBefore := p.heldBy(req.TabID, req.Epoch)
		m, mErr := p.mem.store.Renew(p.ctx, req)
		r, rErr := p.redis.store.Renew(p.ctx, req)
		p.agree("renew", m, mErr, r, rErr)
		p.sameVerdict("renew", heldBefore, mErr)
		if mErr == nil {
			p.seen(m)
		} else {
			p.seenErr(mErr)
		}
	case opRelease:
		a, b := p.next(), p.next()
		req := lease.ReleaseRequest{Key: p.key, TabID: pick(fuzzTabs, a&0x03), Epoch: p.epoch(b)}
		p.logf("release %+v", req)
		heldBefore := p.heldBy(req.TabID, req.Epoch)
		m, mErr := p.mem.store.Release(p.ctx, req)
		r, rErr := p.redis.store.Release(p.ctx, req)
		p.agree("release", m, mErr, r, rErr)
		if mErr == nil {
			if heldBefore && !m.Released {
				p.t.Fatalf("release of the lease the tab held answered Released false\n%s", p.history())
			}
			p.seen(m.Lease)
		}
	case opCheck:
		a, b := p.next(), p.next()
		tab, epoch := pick(fuzzTabs, a&0x03), p.epoch(b)
		p.logf("check %s %d", tab, epoch)
		heldBefore := p.heldBy(tab, epoch)
		m, mErr := p.mem.store.Check(p.ctx, p.key, tab, epoch)
		r, rErr := p.redis.store.Check(p.ctx, p.key, tab, epoch)
		p.agree("check", m, mErr, r, rErr)
		p.sameVerdict("check", heldBefore, mErr)
		if mErr == nil {
			if !m.HeldBy(tab, epoch) {
				p.t.Fatalf("check confirmed %s at %d but answered %+v\n%s", tab, epoch, m, p.history())
			}
			p.seen(m)
		} else {
			p.seenErr(mErr)
		}
	case opGet:
		p.logf("get")
		m, mErr := p.mem.store.Get(p.ctx, p.key)
		r, rErr := p.redis.store.Get(p.ctx, p.key)
		p.agree("get", m, mErr, r, rErr)
		if mErr == nil {
			p.seen(m)
		}
	case opRevoke:
		a := p.next()
		req := lease.RevokeRequest{Key: p.key, Admin: "admin-1", Reason: "fuzz", Block: pick(fuzzBlocks, a&0x0f), RequestID: pick(fuzzReqIDs, a>>4)}
		p.logf("revoke %+v", req)
		m, mErr := p.mem.store.Revoke(p.ctx, req)
		r, rErr := p.redis.store.Revoke(p.ctx, req)
		p.agree("revoke", m, mErr, r, rErr)
		if mErr == nil && m.Revoked && m.Epoch > p.maxEpoch {
			p.minted(m.Epoch)
		}
		if mErr == nil {
			p.epochs = append(p.epochs, m.Epoch)
		}
		p.last = nil
	case opJoin:
		a := p.next()
		conn, tab := "conn-"+strconv.Itoa(int(a&0x03)), pick(fuzzTabs, a>>4)
		label := pick(fuzzLabels, a>>3&0x01)
		p.logf("join %s %s %q", conn, tab, label)
		in := lease.Tab{TabID: tab, Label: label, Hidden: a&0x04 != 0}
		m, mErr := p.mem.store.Join(p.ctx, p.key, conn, in, 0)
		r, rErr := p.redis.store.Join(p.ctx, p.key, conn, in, 0)
		p.agree("join", m, mErr, r, rErr)
		if mErr == nil {
			p.joined[conn] = p.clock.Now().Add(m)
		}
	case opLeave:
		a := p.next()
		conn := "conn-" + strconv.Itoa(int(a&0x03))
		tab := pick(fuzzTabs, a>>4)
		p.logf("leave %s %s", conn, tab)
		mErr := p.mem.store.Leave(p.ctx, p.key, conn, tab, 0)
		rErr := p.redis.store.Leave(p.ctx, p.key, conn, tab, 0)
		p.agree("leave", nil, mErr, nil, rErr)
	case opTabs:
		p.logf("tabs")
		m, mErr := p.mem.store.Tabs(p.ctx, p.key)
		r, rErr := p.redis.store.Tabs(p.ctx, p.key)
		p.agree("tabs", nonNil(m), mErr, nonNil(r), rErr)
	case opWatch:
		p.logf("watch")
		m := p.snapshot(&p.mem)
		r := p.snapshot(&p.redis)
		p.agree("watch", m, nil, r, nil)
		p.seen(m.Snapshot)
	case opList:
		p.logf("list")
		q := lease.ListQuery{User: p.key.User}
		m, mErr := p.mem.store.ListLeases(p.ctx, q)
		r, rErr := p.redis.store.ListLeases(p.ctx, q)
		m.Leases, r.Leases = nonNil(m.Leases), nonNil(r.Leases)
		p.agree("list", m, mErr, r, rErr)
	case opStep:
		a, b := p.next(), p.next()
		p.stepClock(a, b)
	default:
		panic(fmt.Sprintf("op %d", op))
	}
}

// snapshotView is what a watch started with, without the log position (which names event ids).
type snapshotView struct {
	Snapshot lease.Lease
	Tabs     []lease.Tab
	Resumed  bool
}

func (p *program) snapshot(e *engine) snapshotView {
	w, err := e.store.Watch(p.ctx, p.key, "")
	if err != nil {
		p.t.Fatalf("%s: Watch: %v\n%s", e.name, err, p.history())
	}
	defer w.Close()
	return snapshotView{Snapshot: w.Snapshot, Tabs: nonNil(w.Tabs), Resumed: w.Resumed}
}

// stepClock moves the clock forward: by one of fuzzSteps (kind below 8), or (kind&8) to a deadline
// of the last state that is still ahead, picked by which from its expiry, the end of its block, the
// end of its handoff (and, for a request, its expiry plus the reserve window), then the expiry of
// each presence entry: a millisecond before it (kind&3 is 0 or 3), exactly (1) or a millisecond
// after (2).
func (p *program) stepClock(kind, which byte) {
	now := p.clock.Now()
	to := now.Add(pick(fuzzSteps, kind))
	if kind&0x08 != 0 {
		var deadlines []time.Time
		if p.last != nil {
			deadlines = append(deadlines, p.last.ExpiresAt, p.last.BlockedUntil)
			if h := p.last.Handoff; h != nil {
				deadlines = append(deadlines, h.Until)
				if !h.Reserved && p.last.Held {
					deadlines = append(deadlines, p.last.ExpiresAt.Add(fuzzHandoffReserve))
				}
			}
		}
		for c := range 4 {
			if expires, ok := p.joined["conn-"+strconv.Itoa(c)]; ok {
				deadlines = append(deadlines, expires)
			}
		}
		deadlines = slices.DeleteFunc(deadlines, func(d time.Time) bool { return !d.After(now) })
		if len(deadlines) > 0 {
			to = pick(deadlines, which).Add(time.Duration(int(kind&0x03)%3-1) * time.Millisecond)
		}
	}
	if !to.After(now) {
		p.logf("step: stays at %s", now.Format(time.StampMilli))
		return
	}
	p.logf("step +%v", to.Sub(now))
	p.clock.set(p.t, to)
}

// epoch picks an epoch to present: one answered before (most recent first), one above them all,
// or 0 (invalid).
func (p *program) epoch(b byte) int64 {
	switch {
	case b == 0x0f:
		return 0
	case b == 0x0e || len(p.epochs) == 0:
		return p.maxEpoch + 1
	}
	return p.epochs[len(p.epochs)-1-int(b)%len(p.epochs)]
}

// heldBy says whether the last state seen shows tab holding the lease at epoch now.
func (p *program) heldBy(tab string, epoch int64) bool {
	return p.last != nil && p.last.HeldBy(tab, epoch) && p.last.ExpiresAt.After(p.clock.Now())
}

// sameVerdict checks a valid renew or check against the last state seen, when there is one: it
// must succeed exactly when that state shows the tab holding the lease at its epoch now.
func (p *program) sameVerdict(op string, heldBefore bool, err error) {
	if p.last == nil || errors.Is(err, lease.ErrInvalid) {
		return
	}
	if heldBefore != (err == nil) {
		p.t.Fatalf("%s: the last state seen (%+v) says held=%v at %s, but the engines answered %v\n%s",
			op, *p.last, heldBefore, p.clock.Now().Format(time.StampMilli), err, p.history())
	}
}

// minted records a new epoch, which must be above every epoch minted before.
func (p *program) minted(epoch int64) {
	if epoch <= p.maxEpoch {
		p.t.Fatalf("epoch %d minted after epoch %d\n%s", epoch, p.maxEpoch, p.history())
	}
	p.maxEpoch = epoch
}

// seen records a full lease answer and checks it alone: read at the clock's time, held only
// before its expiry, with a holder exactly when held.
func (p *program) seen(l lease.Lease) {
	now := p.clock.Now()
	switch {
	case !l.Now.Equal(now):
		p.t.Fatalf("lease read at %s, the clock says %s\n%s", l.Now.Format(time.StampMicro), now.Format(time.StampMicro), p.history())
	case l.Held && !l.ExpiresAt.After(now):
		p.t.Fatalf("lease held at %s past its expiry %s\n%s", now.Format(time.StampMilli), l.ExpiresAt.Format(time.StampMilli), p.history())
	case l.Held != (l.Holder != lease.Holder{}):
		p.t.Fatalf("lease Held=%v with holder %+v\n%s", l.Held, l.Holder, p.history())
	case l.Epoch > p.maxEpoch:
		p.t.Fatalf("lease at epoch %d, above every epoch minted (%d)\n%s", l.Epoch, p.maxEpoch, p.history())
	}
	p.last = &l
	p.epochs = append(p.epochs, l.Epoch)
}

// seenErr records what a refusal says about the lease. A refused acquire changes nothing the
// checks here read (it may request a handoff, which leaves the holder, epoch and expiry as they
// are).
func (p *program) seenErr(err error) {
	var lost *lease.LostError
	var held *lease.HeldError
	switch {
	case errors.As(err, &lost):
		p.seen(lost.Current)
	case errors.As(err, &held):
		p.epochs = append(p.epochs, held.Epoch)
	}
}

// agree fails the program unless both engines answered the same.
func (p *program) agree(op string, m any, mErr error, r any, rErr error) {
	p.t.Helper()
	for _, err := range []error{mErr, rErr} {
		if errors.Is(err, lease.ErrUnavailable) {
			p.t.Fatalf("%s: %v\n%s", op, err, p.history())
		}
	}
	mv, rv := describe(m, mErr), describe(r, rErr)
	if mv != rv {
		p.t.Fatalf("%s: the engines disagree\nleasemem:   %s\nleaseredis: %s\n%s", op, mv, rv, p.history())
	}
}

// describe writes an answer for comparison: its value when err is nil, else the error's type and
// fields.
func describe(v any, err error) string {
	if err != nil {
		var retry *lease.RetryError
		if errors.As(err, &retry) {
			return fmt.Sprintf("%T{%v %v}", err, retry.Err, retry.RetryAfter)
		}
		b, _ := json.Marshal(err)
		return fmt.Sprintf("%T%s", err, b)
	}
	b, jerr := json.Marshal(v)
	if jerr != nil {
		return fmt.Sprintf("%#v", v)
	}
	return string(b)
}

func (p *program) logf(format string, args ...any) {
	p.trace = append(p.trace, fmt.Sprintf("%s %s", p.clock.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...)))
}

func (p *program) history() string {
	return "program:\n  " + strings.Join(p.trace, "\n  ")
}

// finish lets both engines announce what is due, waits for each live watch to deliver the whole
// log, and compares the events and audit records.
func (p *program) finish() {
	p.logf("finish")
	for _, e := range []*engine{&p.mem, &p.redis} {
		if _, err := e.store.Get(p.ctx, p.key); err != nil {
			p.t.Fatalf("%s: Get: %v", e.name, err)
		}
		if _, err := e.store.Tabs(p.ctx, p.key); err != nil {
			p.t.Fatalf("%s: Tabs: %v", e.name, err)
		}
	}
	mEvents := p.events(&p.mem)
	rEvents := p.events(&p.redis)
	for _, stream := range []string{"lease", "tabs"} {
		m, r := eventsOf(mEvents, stream), eventsOf(rEvents, stream)
		if m != r {
			p.t.Fatalf("the %s events differ\nleasemem:\n  %s\nleaseredis:\n  %s\n%s", stream,
				strings.ReplaceAll(m, "\n", "\n  "), strings.ReplaceAll(r, "\n", "\n  "), p.history())
		}
	}
	var last int64
	for _, ev := range mEvents {
		if ev.Type == lease.EventGranted || ev.Type == lease.EventTakenOver || ev.Type == lease.EventRevoked {
			if ev.Epoch <= last {
				p.t.Fatalf("%s event at epoch %d after an epoch %d was minted\n%s", ev.Type, ev.Epoch, last, p.history())
			}
			last = ev.Epoch
		}
	}
	q := lease.AuditQuery{User: p.key.User, Session: p.key.Session, Limit: lease.MaxPageLimit}
	m, mErr := p.mem.store.Audit(p.ctx, q)
	r, rErr := p.redis.store.Audit(p.ctx, q)
	for _, page := range []*lease.AuditPage{&m, &r} {
		page.Records = nonNil(page.Records)
		for i := range page.Records {
			page.Records[i].ID = ""
		}
	}
	p.agree("audit", m, mErr, r, rErr)
}

// events waits until e's live watch has delivered every event of the log (up to the position a
// new watch reports), checks their ids strictly increase, and that a watch resumed after the
// first replays all the others.
func (p *program) events(e *engine) []lease.Event {
	w, err := e.store.Watch(p.ctx, p.key, "")
	if err != nil {
		p.t.Fatalf("%s: Watch: %v", e.name, err)
	}
	w.Close()
	var got []lease.Event
	deadline := time.After(30 * time.Second)
	for w.Position != "" && (len(got) == 0 || got[len(got)-1].ID != w.Position) {
		select {
		case ev, ok := <-e.live.Events():
			if !ok {
				p.t.Fatalf("%s: the live watch ended: %v\n%s", e.name, e.live.Err(), p.history())
			}
			got = append(got, *ev)
		case <-deadline:
			p.t.Fatalf("%s: the live watch delivered %d events, none with the id %s of the log's last\n%s", e.name, len(got), w.Position, p.history())
		}
	}
	for i := 1; i < len(got); i++ {
		a, err1 := lease.ParseEventID(got[i-1].ID)
		b, err2 := lease.ParseEventID(got[i].ID)
		if err1 != nil || err2 != nil || a.Compare(b) >= 0 {
			p.t.Fatalf("%s: event id %s after %s\n%s", e.name, got[i].ID, got[i-1].ID, p.history())
		}
	}
	if len(got) > 0 {
		resumed, err := e.store.Watch(p.ctx, p.key, got[0].ID)
		if err != nil {
			p.t.Fatalf("%s: Watch after %s: %v", e.name, got[0].ID, err)
		}
		resumed.Close()
		if !resumed.Resumed || describe(nonNil(resumed.Replay), nil) != describe(nonNil(got[1:]), nil) {
			p.t.Fatalf("%s: resumed=%v after the first event, replaying\n  %s\nwhile the live watch delivered\n  %s\n%s",
				e.name, resumed.Resumed, describe(resumed.Replay, nil), describe(got[1:], nil), p.history())
		}
	}
	return got
}

// nonNil is s, or an empty slice for nil: the engines may answer either for none.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// eventsOf writes the events of one SSE stream ("lease" or "tabs"), one a line, without their
// ids: the engines give the same events the same ids only when they announce them at the same
// time, and an expiry may be announced by an engine's timer or by the next call alike. For the
// same reason the two streams are compared apart: a timer may announce a tab's timeout before a
// lease event that a call announces first.
func eventsOf(evs []lease.Event, stream string) string {
	var lines []string
	for _, ev := range evs {
		if ev.Type.Stream() == stream {
			ev.ID = ""
			lines = append(lines, describe(ev, nil))
		}
	}
	return strings.Join(lines, "\n")
}
