package leaseredis

import (
	"context"
	"errors"
	"maps"
	"math"
	"net"
	"reflect"
	"regexp"
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

var (
	alice = lease.Key{User: "alice", Session: "doc-1"}
	tabA  = lease.Holder{TabID: "tab-a", Label: "Events — /events/evt-1"}
	tabB  = lease.Holder{TabID: "tab-b", Label: "Calendar"}
)

// newEngine returns an engine on a namespace of the shared Redis, with the namespace's prefix, and
// a plain client of the same database for looking at the keys.
func newEngine(t *testing.T) (*Engine, *redis.Client, *redistest.DB) {
	t.Helper()
	db := redistest.Shared(t)
	return engineOn(t, db.URL(), db.Prefix(), DefaultOpTimeout), db.Client(t), db
}

func engineOn(t *testing.T, url, prefix string, opTimeout time.Duration) *Engine {
	t.Helper()
	client, err := NewClient(url, opTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	e, err := New(client, Options{Prefix: prefix, OpTimeout: opTimeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// sharedEngine is an engine with opts on a namespace of the shared Redis (opts.Prefix is the
// namespace's), whose client carries hooks, with a plain client of the same database and the
// namespace.
func sharedEngine(t *testing.T, opts Options, hooks ...redis.Hook) (*Engine, *redis.Client, *redistest.DB) {
	t.Helper()
	db := redistest.Shared(t)
	client, err := NewClient(db.URL(), DefaultOpTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	for _, h := range hooks {
		client.AddHook(h)
	}
	opts.Prefix = db.Prefix()
	e, err := New(client, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e, db.Client(t), db
}

func mustAcquire(t *testing.T, e *Engine, key lease.Key, h lease.Holder, mode lease.Mode) lease.Lease {
	t.Helper()
	l, err := e.Acquire(t.Context(), lease.AcquireRequest{Key: key, Holder: h, TTL: time.Minute, Mode: mode})
	if err != nil {
		t.Fatalf("Acquire by %s: %v", h.TabID, err)
	}
	return l
}

// storeMicros is the store's clock.
func storeMicros(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	now, err := c.Time(t.Context()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.UnixMicro()
}

// wantUnavailable fails unless err is a *lease.UnavailableError for op and no decision.
func wantUnavailable(t *testing.T, what, op string, err error) *lease.UnavailableError {
	t.Helper()
	var u *lease.UnavailableError
	switch {
	case errors.Is(err, lease.ErrLost) || errors.Is(err, lease.ErrHeld) || errors.Is(err, lease.ErrInvalid):
		t.Fatalf("%s = %v: store trouble must not be reported as a decision", what, err)
	case !errors.Is(err, lease.ErrUnavailable) || !errors.As(err, &u):
		t.Fatalf("%s = %v, want a *lease.UnavailableError", what, err)
	case u.Op != op:
		t.Errorf("%s: UnavailableError.Op = %q, want %q", what, u.Op, op)
	}
	return u
}

func TestStateKeyPutsEveryKeyOfAUserInOneHashTagThatIdentifiersCannotForge(t *testing.T) {
	e := &Engine{prefix: "tablease"}
	if got, want := e.stateKey(alice), "tablease:{alice}:lease:doc-1"; got != want {
		t.Fatalf("stateKey = %q, want %q", got, want)
	}
	seen := map[string]lease.Key{}
	for _, k := range []lease.Key{
		{User: "a|b", Session: "c"}, {User: "a", Session: "b|c"},
		{User: "a:b", Session: "c"}, {User: "a", Session: "b:c"},
		{User: "a.b", Session: "c"}, {User: "a", Session: "b.c"},
		{User: "a", Session: "b"}, {User: "b", Session: "a"},
	} {
		key := e.stateKey(k)
		if other, ok := seen[key]; ok {
			t.Errorf("%+v and %+v share the key %q", k, other, key)
		}
		seen[key] = k
		// The hash tag is what lies between the first '{' and the next '}'.
		open, end := strings.IndexByte(key, '{'), strings.IndexByte(key, '}')
		if tag := key[open+1 : end]; tag != k.User {
			t.Errorf("hash tag of %+v = %q", k, tag)
		}
	}
	// What makes it safe: no identifier may hold the characters the layout relies on.
	for _, c := range []string{"{", "}"} {
		if lease.ValidateID("sub", "a"+c+"b") == nil {
			t.Errorf("an identifier may contain %q, which the key layout relies on", c)
		}
	}
}

// TestTheStateIsKeptForTheIdleRetentionAfterItsLastUse follows the state of a session through a
// grant, a renew, a release, a grant and an expiry: a hash while the lease is held, the session's
// field of the user's free hash while it is free (parked, see state.lua), kept the idle retention
// after the lease ended or the last change, with the same expiry as the session's score in the
// user's known sessions.
func TestTheStateIsKeptForTheIdleRetentionAfterItsLastUse(t *testing.T) {
	const idle = 1500 * time.Millisecond
	e, c, db := sharedEngine(t, Options{IdleRetention: idle})
	ctx := t.Context()
	key := db.Prefix() + ":{alice}:lease:doc-1"
	log := db.Prefix() + ":{alice}:log:doc-1"
	// The keys of the user and of the prefix that admins read (see admin_test.go), the user's
	// sessions whose state is kept and the state of its free sessions.
	index, audit, users := db.Prefix()+":{alice}:sessions", db.Prefix()+":{alice}:audit", db.Prefix()+":users"
	known, free := db.Prefix()+":{alice}:known", db.Prefix()+":{alice}:free"

	// wantState checks the keys after a change: the state is kept until the idle retention after
	// keptFrom (the end of the lease, or the change), and the user's known sessions say the same;
	// held says whether the lease is held, and so listed in the user's index, with its state in a
	// hash rather than parked. It answers the fields of the state.
	wantState := func(when string, held bool, keptFrom time.Time) map[string]string {
		t.Helper()
		var at time.Duration
		var fields map[string]string
		want := []string{users, audit, known}
		if held {
			if typ := c.Type(ctx, key).Val(); typ != "hash" {
				t.Fatalf("%s: TYPE %s = %q, want hash", when, key, typ)
			}
			at = c.PExpireTime(ctx, key).Val()
			fields = c.HGetAll(ctx, key).Val()
			want = append(want, key, index)
		} else {
			v, err := c.HGet(ctx, free, "doc-1").Result()
			if err != nil {
				t.Fatalf("%s: HGET %s doc-1: %v, want the parked state", when, free, err)
			}
			fields = parkedState(t, v)
			at = time.Duration(mustInt(t, fields["at_ms"])) * time.Millisecond
			if kept := c.PExpireTime(ctx, free).Val(); kept != c.PExpireTime(ctx, known).Val() || kept < at {
				t.Fatalf("%s: PEXPIRETIME %s = %v, want that of %s, and not before the field's %v", when, free, kept, known, at)
			}
			want = append(want, free)
		}
		if want := time.Duration(keptFrom.UnixMilli())*time.Millisecond + idle; at < want-time.Millisecond || at > want+time.Second {
			t.Fatalf("%s: the state expires at %v, want the idle retention after %v (%v)", when, at, keptFrom, want)
		}
		if score := c.ZScore(ctx, known, "doc-1").Val(); int64(score) != at.Milliseconds() {
			t.Fatalf("%s: the session's score in %s = %v, want the state's expiry %d", when, known, score, at.Milliseconds())
		}
		// Nobody watches the session: it has no event log (TestASessionHasAnEventLogWhileWatched).
		keys, err := c.Keys(ctx, db.Prefix()+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		// The answers kept for retries, and the sweep's turn (sweep.go), which the sweep of every
		// second takes whatever the session's keys are.
		keys = slices.DeleteFunc(keys, func(k string) bool {
			return strings.HasPrefix(k, db.Prefix()+":{alice}:reply:") || k == e.sweepKey()
		})
		slices.Sort(keys)
		slices.Sort(want)
		if !slices.Equal(keys, want) {
			t.Fatalf("%s: keys under the prefix = %q, want %q", when, keys, want)
		}
		return fields
	}

	if _, err := e.Get(ctx, alice); err != nil {
		t.Fatal(err)
	}
	if n := c.Exists(ctx, key, log, known, free).Val(); n != 0 {
		t.Fatal("Get created the state, the log or the known sessions; only a grant should")
	}

	a, err := e.Acquire(ctx, lease.AcquireRequest{Key: alice, Holder: lease.Holder{TabID: "tab-a", Label: "L", Hidden: true}, TTL: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	h := wantState("after a grant", true, a.ExpiresAt)
	want := map[string]string{
		"tab": "tab-a", "label": "L", "hidden": "1",
		"epoch":       strconv.FormatInt(a.Epoch, 10),
		"granted_us":  strconv.FormatInt(a.GrantedAt.UnixMicro(), 10),
		"expires_us":  strconv.FormatInt(a.ExpiresAt.UnixMicro(), 10),
		"ttl_ms":      "1500",
		"transitions": "1",
	}
	grantEvent, err := lease.ParseEventID(h["event_id"])
	if err != nil || grantEvent.Seq != 0 {
		t.Errorf("field event_id = %q, want the id of the grant's event", h["event_id"])
	}
	for f, v := range want {
		if h[f] != v {
			t.Errorf("field %s = %q, want %q (hash %v)", f, h[f], v, h)
		}
	}
	if a.Epoch != a.GrantedAt.UnixMicro() {
		t.Errorf("first epoch %d, want the grant time in µs %d", a.Epoch, a.GrantedAt.UnixMicro())
	}

	r1, err := e.Renew(ctx, lease.RenewRequest{Key: alice, TabID: "tab-a", Epoch: a.Epoch, TTL: 1200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	wantState("after a renew", true, r1.ExpiresAt)
	r, err := e.Release(ctx, lease.ReleaseRequest{Key: alice, TabID: "tab-a", Epoch: a.Epoch})
	if err != nil || !r.Released {
		t.Fatalf("Release = %+v, %v", r, err)
	}
	h = wantState("after a release", false, r.Lease.ExpiresAt)
	wantFree := map[string]string{
		"epoch": want["epoch"], "granted_us": want["granted_us"], "expires_us": strconv.FormatInt(r.Lease.ExpiresAt.UnixMicro(), 10),
		"ttl_ms": "1200", "transitions": "1", "rel_tab": "tab-a", "rel_epoch": want["epoch"], "ended_epoch": want["epoch"],
	}
	for f, v := range wantFree {
		if h[f] != v {
			t.Errorf("parked field %s = %q, want %q (state %v)", f, h[f], v, h)
		}
	}
	if id, err := lease.ParseEventID(h["event_id"]); err != nil || id.Compare(grantEvent) <= 0 {
		t.Errorf("parked event_id = %q, want the release's event, after the grant's %q", h["event_id"], grantEvent)
	}
	// The retried release is answered as the first, from the parked state.
	if again, err := e.Release(ctx, lease.ReleaseRequest{Key: alice, TabID: "tab-a", Epoch: a.Epoch}); err != nil || !again.Released || again.Lease.Epoch != a.Epoch {
		t.Errorf("a retried Release = %+v, %v; want released, at epoch %d", again, err, a.Epoch)
	}

	b, err := e.Acquire(ctx, lease.AcquireRequest{Key: alice, Holder: tabB, TTL: lease.DefaultLimits.Min})
	if err != nil {
		t.Fatal(err)
	}
	h = wantState("after a second grant", true, b.ExpiresAt)
	if _, ok := h["rel_tab"]; ok || h["transitions"] != "2" || h["ended_epoch"] != want["epoch"] || h["event_id"] == "" {
		t.Errorf("hash after a new grant = %v, want the last release forgotten, two transitions, the first epoch's end and the last event", h)
	}
	// Expiry is a comparison with the store clock: the state stays, with its epoch.
	deadline := time.Now().Add(10 * time.Second)
	var announced lease.Lease
	for {
		g, err := e.Get(ctx, alice)
		if err != nil {
			t.Fatal(err)
		}
		if !g.Held {
			if g.Epoch != b.Epoch {
				t.Fatalf("Get after expiry: epoch %d, want %d", g.Epoch, b.Epoch)
			}
			announced = g
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the lease did not expire: %+v", g)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The Get that found it expired announced it, marked its epoch ended and parked the session,
	// which keeps no holder.
	h = wantState("after expiry", false, announced.Now)
	if h["ended_epoch"] != strconv.FormatInt(b.Epoch, 10) || h["transitions"] != "2" || h["rel_tab"] != "" {
		t.Errorf("state after expiry = %v, want ended_epoch %d, two transitions and no release", h, b.Epoch)
	}
	// Idle for the retention, the session is forgotten; the epoch floor keeps the next grant above.
	for c.Exists(ctx, free).Val() == 1 {
		if time.Now().After(deadline.Add(idle)) {
			t.Fatalf("the parked state is still there %v after its expiry", time.Until(deadline))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if g, err := e.Get(ctx, alice); err != nil || g.Epoch != 0 || g.Transitions != 0 {
		t.Fatalf("Get of a forgotten session = %+v, %v; want epoch 0 and no transitions", g, err)
	}
	if n := c.Exists(ctx, known).Val(); n != 0 {
		t.Errorf("the user's known sessions outlive the last of their states")
	}
	if l := mustAcquire(t, e, alice, tabA, lease.ModeTry); l.Epoch <= b.Epoch {
		t.Errorf("epoch %d after the session was forgotten, want above its last epoch %d", l.Epoch, b.Epoch)
	}
}

// parkedState reads the field v of a parked session (pack_free in state.lua) into the fields of
// the state hash it stands for (those it has), and at_ms, its expiry.
func parkedState(t *testing.T, v string) map[string]string {
	t.Helper()
	p := strings.SplitN(v, " ", 10)
	if len(p) != 10 {
		t.Fatalf("parked state %q: %d fields, want 10", v, len(p))
	}
	hex := func(s string) int64 {
		t.Helper()
		n, err := strconv.ParseInt(s, 16, 64)
		if err != nil {
			t.Fatalf("parked state %q: %q is not a hex integer", v, s)
		}
		return n
	}
	dec := func(n int64) string { return strconv.FormatInt(n, 10) }
	epoch := hex(p[0])
	granted := epoch + hex(p[1])
	expires := granted + hex(p[2])
	endMS := expires / 1000
	f := map[string]string{
		"epoch": dec(epoch), "granted_us": dec(granted), "expires_us": dec(expires),
		"ttl_ms": dec(hex(p[3])), "transitions": dec(hex(p[4])), "at_ms": dec(endMS + hex(p[8])),
	}
	if p[5] != "" {
		f["rel_epoch"] = dec(epoch - hex(p[5]))
	}
	if p[6] != "" {
		f["ended_epoch"] = dec(epoch - hex(p[6]))
	}
	if p[7] != "" {
		i := strings.LastIndexByte(p[7], '-')
		if i <= 0 {
			t.Fatalf("parked state %q: event id %q", v, p[7])
		}
		f["event_id"] = dec(endMS+hex(p[7][:i])) + "-" + dec(hex(p[7][i+1:]))
	}
	if p[9] != "" {
		f["rel_tab"] = p[9]
	}
	return f
}

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("%q is not an integer", s)
	}
	return n
}

func TestLeaseNowIsTheStoreTimeOfTheAnswer(t *testing.T) {
	e, c, _ := newEngine(t)
	before := storeMicros(t, c)
	l := mustAcquire(t, e, alice, tabA, lease.ModeTry)
	after := storeMicros(t, c)
	if now := l.Now.UnixMicro(); now < before || now > after {
		t.Errorf("Now = %d µs, want the store time, between %d and %d", now, before, after)
	}
	if l.Now.Location() != time.UTC || l.GrantedAt.Location() != time.UTC {
		t.Errorf("times are not in UTC: %v, %v", l.Now, l.GrantedAt)
	}
	if l.Epoch < before || l.Epoch > after {
		t.Errorf("first epoch %d, want the store clock in µs (between %d and %d)", l.Epoch, before, after)
	}
}

func TestEpochsSurviveAFlushBecauseTheyAreFlooredAtTheStoreClock(t *testing.T) {
	e, c, db := newEngine(t)
	ctx := t.Context()
	var last int64
	for i := range 3 {
		a := mustAcquire(t, e, alice, tabA, lease.ModeTry)
		b := mustAcquire(t, e, alice, tabB, lease.ModeTakeover)
		if a.Epoch <= last || b.Epoch <= a.Epoch {
			t.Fatalf("round %d: epochs %d then %d after %d, want increasing", i, a.Epoch, b.Epoch, last)
		}
		last = b.Epoch
		// Wait until the store clock has passed the last epoch (takeovers may run ahead of it).
		for storeMicros(t, c) <= last {
			time.Sleep(time.Millisecond)
		}
		db.Flush(t) // FLUSHDB of the test's own database, or its keys on an external Redis
		g, err := e.Get(ctx, alice)
		if err != nil {
			t.Fatal(err)
		}
		if g.Held || g.Epoch != 0 || g.Transitions != 0 {
			t.Fatalf("Get after the flush = %+v, want a session the store forgot", g)
		}
	}
	if l := mustAcquire(t, e, alice, tabA, lease.ModeTry); l.Epoch <= last || l.Transitions != 1 {
		t.Fatalf("grant after the last flush: epoch %d, transitions %d; want above %d, 1", l.Epoch, l.Transitions, last)
	}
}

func TestEpochsAreExactUpTo2To53AndThenExhausted(t *testing.T) {
	e, c, db := newEngine(t)
	ctx := t.Context()
	key := db.Prefix() + ":{alice}:lease:doc-1"
	mustAcquire(t, e, alice, tabA, lease.ModeTry)

	// An odd value above 2^52, where a float with fewer bits than a double would round.
	const big = 1<<52 + 1
	if err := c.HSet(ctx, key, "epoch", strconv.FormatInt(big, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	b := mustAcquire(t, e, alice, tabB, lease.ModeTakeover)
	if b.Epoch != big+1 {
		t.Fatalf("takeover after epoch %d = %d, want %d", int64(big), b.Epoch, int64(big+1))
	}
	if got := c.HGet(ctx, key, "epoch").Val(); got != strconv.FormatInt(big+1, 10) {
		t.Fatalf("stored epoch %q, want %d written as an integer", got, int64(big+1))
	}
	if _, err := e.Check(ctx, alice, "tab-b", big+1); err != nil {
		t.Fatalf("Check at %d: %v", int64(big+1), err)
	}
	if _, err := e.Check(ctx, alice, "tab-b", big); !errors.Is(err, lease.ErrLost) {
		t.Fatalf("Check at %d, one below: %v, want ErrLost", int64(big), err)
	}

	// The last epoch there is, and then none.
	if err := c.HSet(ctx, key, "epoch", strconv.FormatInt(lease.MaxEpoch-2, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	l := mustAcquire(t, e, alice, tabA, lease.ModeTakeover)
	if l.Epoch != lease.MaxEpoch-1 {
		t.Fatalf("takeover after 2^53-2 = %d, want 2^53-1", l.Epoch)
	}
	if _, err := e.Renew(ctx, lease.RenewRequest{Key: alice, TabID: "tab-a", Epoch: lease.MaxEpoch - 1}); err != nil {
		t.Fatalf("Renew at 2^53-1: %v", err)
	}
	_, err := e.Acquire(ctx, lease.AcquireRequest{Key: alice, Holder: tabB, Mode: lease.ModeTakeover})
	if !errors.Is(err, lease.ErrEpochExhausted) || errors.Is(err, lease.ErrInvalid) {
		t.Fatalf("takeover after 2^53-1 = %v, want lease.ErrEpochExhausted (a fault of the store, not of the caller)", err)
	}
	if g, err := e.Get(ctx, alice); err != nil || !g.HeldBy("tab-a", lease.MaxEpoch-1) {
		t.Fatalf("Get after the refused takeover = %+v, %v; want tab-a unchanged", g, err)
	}
}

// twice is a hook that sends every script twice and keeps the second answer, as when go-redis
// retries a command whose first answer was lost after the server ran it.
type twice struct{}

func (twice) DialHook(next redis.DialHook) redis.DialHook { return next }
func (twice) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (twice) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "fcall" {
			if err := next(ctx, cmd.Clone()); err != nil && !strings.HasPrefix(err.Error(), "ERR Function not found") {
				return err
			}
		}
		return next(ctx, cmd)
	}
}

func TestEveryWriteIsIdempotentWhenTheDriverRetriesIt(t *testing.T) {
	db := redistest.Shared(t)
	client, err := NewClient(db.URL(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	client.AddHook(twice{})
	e, err := New(client, Options{Prefix: db.Prefix()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()

	a := mustAcquire(t, e, alice, tabA, lease.ModeTry)
	if a.Transitions != 1 {
		t.Fatalf("acquire sent twice: transitions %d, want 1", a.Transitions)
	}
	b := mustAcquire(t, e, alice, tabB, lease.ModeTakeover)
	if b.Transitions != 2 || b.Epoch <= a.Epoch {
		t.Fatalf("takeover sent twice: epoch %d, transitions %d; want one new epoch above %d", b.Epoch, b.Transitions, a.Epoch)
	}
	if _, err := e.Check(ctx, alice, "tab-b", b.Epoch); err != nil {
		t.Fatalf("Check of the takeover's epoch: %v", err)
	}
	r, err := e.Renew(ctx, lease.RenewRequest{Key: alice, TabID: "tab-b", Epoch: b.Epoch, TTL: time.Minute})
	if err != nil || r.Epoch != b.Epoch {
		t.Fatalf("renew sent twice = %+v, %v; want epoch %d", r, err, b.Epoch)
	}
	rel, err := e.Release(ctx, lease.ReleaseRequest{Key: alice, TabID: "tab-b", Epoch: b.Epoch})
	if err != nil || !rel.Released || rel.Lease.Held {
		t.Fatalf("release sent twice = %+v, %v; want Released", rel, err)
	}
	c := mustAcquire(t, e, alice, tabA, lease.ModeTakeover)
	if c.Transitions != 3 || c.Epoch <= b.Epoch {
		t.Fatalf("takeover of a free session sent twice: epoch %d, transitions %d", c.Epoch, c.Transitions)
	}
	req := lease.RevokeRequest{Key: alice, Admin: "root", Reason: "sent twice", Block: time.Minute, RequestID: "req-1"}
	rv, err := e.Revoke(ctx, req)
	if err != nil || !rv.Revoked || rv.Previous == nil || rv.Previous.Epoch != c.Epoch || rv.BlockedUntil.IsZero() {
		t.Fatalf("revoke with a request id sent twice = %+v, %v; want tab-a at %d revoked and a block", rv, err, c.Epoch)
	}
	p, err := e.Audit(ctx, lease.AuditQuery{User: alice.User, Limit: 2})
	if err != nil || len(p.Records) != 2 || p.Records[0].Action != lease.AuditBlock || p.Records[1].Action != lease.AuditRevoke ||
		!p.Records[0].Until.Equal(rv.BlockedUntil) {
		t.Fatalf("the newest audit records after a revoke sent twice = %+v, %v; want its block and its revoke, once", p.Records, err)
	}
}

// TestADriverRetryAfterAnotherCallIsAnsweredAsTheFirst sends each script that changes a session
// a second time, as go-redis does when a reply was lost, after another tab's call ran in between:
// the resent script must answer exactly what the first answered and change nothing.
func TestADriverRetryAfterAnotherCallIsAnsweredAsTheFirst(t *testing.T) {
	ms := func(d time.Duration) int64 { return d.Milliseconds() }
	for _, tc := range []struct {
		name   string
		before func(t *testing.T, e *Engine) // the state the first call finds
		script *function
		args   func(e *Engine) []any
		// between is the other tab's call; check checks the state after the resent call.
		between func(t *testing.T, e *Engine)
		check   func(t *testing.T, e *Engine, c *redis.Client, first any)
	}{
		{
			name:   "a takeover mints one epoch",
			before: func(t *testing.T, e *Engine) { mustAcquire(t, e, alice, tabB, lease.ModeTry) },
			script: acquireFn,
			args: func(e *Engine) []any {
				return []any{"tab-a", "Tab A: plans ✓", "0", int64(60000), "takeover", ms(e.handoffTimeout), ms(e.handoffReserve)}
			},
			between: func(t *testing.T, e *Engine) { mustAcquire(t, e, alice, tabB, lease.ModeTakeover) },
			check: func(t *testing.T, e *Engine, c *redis.Client, first any) {
				if g, _ := e.Get(t.Context(), alice); g.Holder.TabID != "tab-b" || g.Transitions != 3 {
					t.Errorf("after the resent takeover: %+v; want tab-b holding after three grants", g)
				}
			},
		},
		{
			name:   "a try that granted does not answer held",
			script: acquireFn,
			args: func(e *Engine) []any {
				return []any{"tab-a", "", "0", int64(60000), "try", ms(e.handoffTimeout), ms(e.handoffReserve)}
			},
			between: func(t *testing.T, e *Engine) { mustAcquire(t, e, alice, tabB, lease.ModeTakeover) },
			check: func(t *testing.T, e *Engine, c *redis.Client, first any) {
				if g, _ := e.Get(t.Context(), alice); g.Holder.TabID != "tab-b" || g.Transitions != 2 {
					t.Errorf("after the resent try: %+v; want tab-b holding after two grants", g)
				}
			},
		},
		{
			name:   "a release that released does not answer kept",
			before: func(t *testing.T, e *Engine) { mustAcquire(t, e, alice, tabA, lease.ModeTry) },
			script: releaseFn,
			args: func(e *Engine) []any {
				g, _ := e.Get(context.Background(), alice)
				return []any{"tab-a", strconv.FormatInt(g.Epoch, 10)}
			},
			between: func(t *testing.T, e *Engine) { mustAcquire(t, e, alice, tabB, lease.ModeTry) },
			check: func(t *testing.T, e *Engine, c *redis.Client, first any) {
				if g, _ := e.Get(t.Context(), alice); g.Holder.TabID != "tab-b" {
					t.Errorf("after the resent release: %+v; want tab-b still holding", g)
				}
			},
		},
		{
			name:   "a revoke without a request id revokes once",
			before: func(t *testing.T, e *Engine) { mustAcquire(t, e, alice, tabA, lease.ModeTry) },
			script: revokeFn,
			args: func(e *Engine) []any {
				return []any{"root", "why", int64(0), "", ms(lease.RevokeRetryWindow)}
			},
			between: func(t *testing.T, e *Engine) { mustAcquire(t, e, alice, tabB, lease.ModeTry) },
			check: func(t *testing.T, e *Engine, c *redis.Client, first any) {
				if g, _ := e.Get(t.Context(), alice); g.Holder.TabID != "tab-b" || g.Transitions != 3 {
					t.Errorf("after the resent revoke: %+v; want tab-b still holding", g)
				}
			},
		},
		{
			name:   "a join does not list a tab that left since",
			script: joinFn,
			args: func(e *Engine) []any {
				return []any{"conn-1", "tab-a", "", "0", ms(e.presenceTTL), lease.MaxPresence, int64(0)}
			},
			between: func(t *testing.T, e *Engine) {
				if err := e.Leave(t.Context(), alice, "conn-1", "tab-a", 0); err != nil {
					t.Fatal(err)
				}
			},
			check: func(t *testing.T, e *Engine, c *redis.Client, first any) {
				if tabs, err := e.Tabs(t.Context(), alice); err != nil || len(tabs) != 0 {
					t.Errorf("after the resent join: tabs %+v, %v; want none", tabs, err)
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, c, db := newEngine(t)
			ctx := t.Context()
			if tc.before != nil {
				tc.before(t, e)
			}
			keys := e.sessionKeys(alice, newReply())
			if tc.script == revokeFn {
				keys = append(keys, e.adminAuditKey(alice.User))
			}
			first, err := e.call(ctx, "first", tc.script, keys, tc.args(e))
			if err != nil {
				t.Fatal(err)
			}
			tc.between(t, e)
			log := c.LLen(ctx, db.Prefix()+":{alice}:log:doc-1").Val()
			audit := c.XLen(ctx, db.Prefix()+":{alice}:audit").Val()
			again, err := e.call(ctx, "resent", tc.script, keys, tc.args(e))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(again, first) {
				t.Errorf("the resent script answered %v, want what it answered first: %v", again, first)
			}
			if n, m := c.LLen(ctx, db.Prefix()+":{alice}:log:doc-1").Val(), c.XLen(ctx, db.Prefix()+":{alice}:audit").Val(); n != log || m != audit {
				t.Errorf("the resent script appended %d events and %d audit records, want none", n-log, m-audit)
			}
			tc.check(t, e, c, first)
		})
	}
}

func TestStoreTroubleIsUnavailableNeverADecision(t *testing.T) {
	t.Run("a corrupted state key", func(t *testing.T) {
		e, c, db := newEngine(t)
		if err := c.Set(t.Context(), db.Prefix()+":{alice}:lease:doc-1", "not a hash", 0).Err(); err != nil {
			t.Fatal(err)
		}
		forEachCall(t, e, func(op string, err error) {
			u := wantUnavailable(t, op, op, err)
			if !redis.HasErrorPrefix(errors.Unwrap(u), "WRONGTYPE") && !strings.Contains(u.Error(), "WRONGTYPE") {
				t.Errorf("%s: %v, want the WRONGTYPE of Redis inside", op, err)
			}
		})
	})

	t.Run("a read-only replica", func(t *testing.T) {
		srv := redistest.Start(t)
		c := srv.Client(t)
		e := engineOn(t, srv.URL(), "", time.Second)
		l := mustAcquire(t, e, alice, tabA, lease.ModeTry)
		// Replicate from a port nobody listens on: the server keeps its data and refuses writes.
		port := unusedPort(t)
		if err := c.Do(t.Context(), "replicaof", "127.0.0.1", port).Err(); err != nil {
			t.Fatal(err)
		}
		for _, op := range []struct {
			name string
			err  error
		}{
			{"acquire", func() error {
				_, err := e.Acquire(t.Context(), lease.AcquireRequest{Key: alice, Holder: tabB, Mode: lease.ModeTakeover})
				return err
			}()},
			{"renew", func() error {
				_, err := e.Renew(t.Context(), lease.RenewRequest{Key: alice, TabID: "tab-a", Epoch: l.Epoch})
				return err
			}()},
			{"release", func() error {
				_, err := e.Release(t.Context(), lease.ReleaseRequest{Key: alice, TabID: "tab-a", Epoch: l.Epoch})
				return err
			}()},
		} {
			wantUnavailable(t, op.name+" on a read-only replica", op.name, op.err)
		}
		// Reads refuse too: a read-only replica may be a primary demoted by a failover, whose
		// answers are stale (a check there could confirm a lease taken over on the new primary).
		_, err := e.Get(t.Context(), alice)
		wantUnavailable(t, "get on a read-only replica", "get", err)
		_, err = e.Check(t.Context(), alice, "tab-a", l.Epoch)
		wantUnavailable(t, "check on a read-only replica", "check", err)
		// Nothing was written.
		if h := c.HGetAll(t.Context(), e.stateKey(alice)).Val(); h["tab"] != "tab-a" || h["expires_us"] != strconv.FormatInt(l.ExpiresAt.UnixMicro(), 10) {
			t.Fatalf("the state hash on the replica = %v; want tab-a's lease unchanged", h)
		}
	})

	t.Run("a server out of memory", func(t *testing.T) {
		srv := redistest.Start(t)
		c := srv.Client(t)
		e := engineOn(t, srv.URL(), "", time.Second)
		l := mustAcquire(t, e, alice, tabA, lease.ModeTry)
		if err := c.ConfigSet(t.Context(), "maxmemory", "1").Err(); err != nil {
			t.Fatal(err)
		}
		_, err := e.Acquire(t.Context(), lease.AcquireRequest{Key: lease.Key{User: "alice", Session: "doc-2"}, Holder: tabB})
		wantUnavailable(t, "Acquire with the server out of memory", "acquire", err)
		if _, err := e.Check(t.Context(), alice, "tab-a", l.Epoch); err != nil {
			t.Fatalf("Check with the server out of memory: %v", err)
		}
		// The holder keeps its lease: a renew changes only fields the state hash has.
		if r, err := e.Renew(t.Context(), lease.RenewRequest{Key: alice, TabID: "tab-a", Epoch: l.Epoch, TTL: time.Minute}); err != nil || !r.ExpiresAt.After(l.ExpiresAt) {
			t.Fatalf("Renew with the server out of memory = %+v, %v; want the lease extended", r, err)
		}
		// An admin can still end it, and block the session, from an instance that has not seen the
		// user yet (whose add of the user to the users index Redis refuses).
		res, err := engineOn(t, srv.URL(), "", time.Second).Revoke(t.Context(), lease.RevokeRequest{Key: alice, Admin: "root", Reason: "incident", Block: time.Minute})
		if err != nil || !res.Revoked || res.BlockedUntil.IsZero() {
			t.Fatalf("Revoke with the server out of memory = %+v, %v; want the lease revoked and the session blocked", res, err)
		}
		if _, err := e.Check(t.Context(), alice, "tab-a", l.Epoch); !errors.Is(err, lease.ErrLost) {
			t.Fatalf("Check after the revoke = %v, want lost", err)
		}
	})

	t.Run("a stopped server, then restarted empty", func(t *testing.T) {
		srv := redistest.Start(t)
		e := engineOn(t, srv.URL(), "", 300*time.Millisecond)
		l := mustAcquire(t, e, alice, tabA, lease.ModeTry)
		srv.Stop(t)
		forEachCall(t, e, func(op string, err error) { wantUnavailable(t, op+" with the server stopped", op, err) })
		if err := e.Ping(t.Context()); err == nil {
			t.Fatal("Ping with the server stopped answered nil")
		} else {
			wantUnavailable(t, "Ping with the server stopped", "ping", err)
		}

		srv.Restart(t)
		deadline := time.Now().Add(15 * time.Second)
		for e.Ping(t.Context()) != nil {
			if time.Now().After(deadline) {
				t.Fatal("the engine did not come back after the restart")
			}
			time.Sleep(20 * time.Millisecond)
		}
		// The restarted server lost everything (nothing is persisted); the floor keeps epochs rising.
		g, err := e.Get(t.Context(), alice)
		if err != nil || g.Epoch != 0 {
			t.Fatalf("Get after the restart = %+v, %v; want the session forgotten", g, err)
		}
		if n := mustAcquire(t, e, alice, tabB, lease.ModeTry); n.Epoch <= l.Epoch {
			t.Fatalf("epoch after the restart %d, want above %d", n.Epoch, l.Epoch)
		}
	})

	t.Run("a paused server is bounded by the operation timeout", func(t *testing.T) {
		srv := redistest.Start(t)
		e := engineOn(t, srv.URL(), "", 200*time.Millisecond)
		mustAcquire(t, e, alice, tabA, lease.ModeTry)
		srv.Pause(t)
		defer srv.Resume(t)
		start := time.Now()
		_, err := e.Get(context.Background(), alice)
		wantUnavailable(t, "Get with the server paused", "get", err)
		if !errors.Is(err, context.DeadlineExceeded) {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				t.Errorf("Get with the server paused = %v, want a timeout inside", err)
			}
		}
		if d := time.Since(start); d > 200*time.Millisecond+2*time.Second {
			t.Errorf("Get with the server paused took %v", d)
		}
	})

	t.Run("a cancelled caller", func(t *testing.T) {
		e, _, _ := newEngine(t)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := e.Acquire(ctx, lease.AcquireRequest{Key: alice, Holder: tabA})
		wantUnavailable(t, "Acquire with a cancelled context", "acquire", err)
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Acquire with a cancelled context = %v, want context.Canceled inside", err)
		}
	})
}

// forEachCall makes every lease call on alice once, and a revoke, and hands each error to check.
func forEachCall(t *testing.T, e *Engine, check func(op string, err error)) {
	t.Helper()
	ctx := t.Context()
	_, err := e.Acquire(ctx, lease.AcquireRequest{Key: alice, Holder: tabB})
	check("acquire", err)
	_, err = e.Renew(ctx, lease.RenewRequest{Key: alice, TabID: "tab-a", Epoch: 1})
	check("renew", err)
	_, err = e.Release(ctx, lease.ReleaseRequest{Key: alice, TabID: "tab-a", Epoch: 1})
	check("release", err)
	_, err = e.Get(ctx, alice)
	check("get", err)
	_, err = e.Check(ctx, alice, "tab-a", 1)
	check("check", err)
	_, err = e.Revoke(ctx, lease.RevokeRequest{Key: alice, Admin: "root", Reason: "why", Block: time.Second, RequestID: "req-1"})
	check("revoke", err)
}

func unusedPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

func TestCloseStopsTheEngineButNotTheClient(t *testing.T) {
	e, _, _ := newEngine(t)
	mustAcquire(t, e, alice, tabA, lease.ModeTry)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	forEachCall(t, e, func(op string, err error) {
		if u := wantUnavailable(t, op+" after Close", op, err); !errors.Is(u, ErrClosed) {
			t.Errorf("%s after Close = %v, want ErrClosed inside", op, err)
		}
	})
	if err := e.Ping(t.Context()); !errors.Is(err, ErrClosed) {
		t.Errorf("Ping after Close = %v, want ErrClosed", err)
	}
	if _, err := e.EvictionPolicy(t.Context()); !errors.Is(err, ErrClosed) {
		t.Errorf("EvictionPolicy after Close = %v, want ErrClosed", err)
	}
	if err := e.client.Ping(t.Context()).Err(); err != nil {
		t.Errorf("the client stopped working with the engine: %v", err)
	}
}

func TestEvictionPolicyReadsTheServerSetting(t *testing.T) {
	srv := redistest.Start(t)
	e := engineOn(t, srv.URL(), "", time.Second)
	if p, err := e.EvictionPolicy(t.Context()); err != nil || p != "noeviction" {
		t.Fatalf("EvictionPolicy = %q, %v; want noeviction", p, err)
	}
	if err := srv.Client(t).ConfigSet(t.Context(), "maxmemory-policy", "volatile-lru").Err(); err != nil {
		t.Fatal(err)
	}
	if p, err := e.EvictionPolicy(t.Context()); err != nil || p != "volatile-lru" {
		t.Fatalf("EvictionPolicy = %q, %v; want volatile-lru", p, err)
	}
	srv.Stop(t)
	_, err := e.EvictionPolicy(t.Context())
	wantUnavailable(t, "EvictionPolicy with the server stopped", "config get", err)
}

func TestNewChecksItsOptions(t *testing.T) {
	ok, err := NewClient("redis://127.0.0.1:1/0", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer ok.Close()
	plain := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer plain.Close()

	for _, tc := range []struct {
		name    string
		client  redis.UniversalClient
		opts    Options
		invalid bool // a *lease.InvalidError
	}{
		{"a nil client", nil, Options{}, false},
		{"a client that ignores context deadlines", plain, Options{}, false},
		{"a negative operation timeout", ok, Options{OpTimeout: -time.Second}, false},
		{"limits out of order", ok, Options{Limits: lease.Limits{Min: time.Second, Default: time.Millisecond, Max: time.Second, HiddenMax: time.Second}}, true},
		{"a prefix with braces", ok, Options{Prefix: "a{b}"}, true},
		{"a prefix with a slash", ok, Options{Prefix: "a/b"}, true},
		{"a prefix with a space", ok, Options{Prefix: "a b"}, true},
		{"a negative event log length", ok, Options{EventLogLen: -1}, true},
		{"an event log TTL under a millisecond", ok, Options{EventLogTTL: time.Microsecond}, true},
		{"a negative watch buffer", ok, Options{WatchBuffer: -1}, true},
		{"a negative presence TTL", ok, Options{PresenceTTL: -time.Second}, true},
		{"a presence TTL under a millisecond", ok, Options{PresenceTTL: 999 * time.Microsecond}, true},
		{"a negative audit retention", ok, Options{AuditRetention: -time.Hour}, true},
		{"an audit retention under a millisecond", ok, Options{AuditRetention: time.Microsecond}, true},
		{"a negative audit length", ok, Options{AuditMaxRecords: -1}, true},
		{"a negative handoff timeout", ok, Options{HandoffTimeout: -time.Second}, true},
		{"a handoff timeout under a millisecond", ok, Options{HandoffTimeout: time.Microsecond}, true},
		{"a negative handoff reserve window", ok, Options{HandoffReserve: -time.Second}, true},
		{"a handoff reserve window under a millisecond", ok, Options{HandoffReserve: 999 * time.Microsecond}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, err := New(tc.client, tc.opts)
			if err == nil {
				t.Fatalf("New = %+v, want an error", e)
			}
			if got := errors.Is(err, lease.ErrInvalid); got != tc.invalid {
				t.Errorf("New = %v; InvalidError %v, want %v", err, got, tc.invalid)
			}
		})
	}

	e, err := New(ok, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if e.prefix != DefaultPrefix || e.opTimeout != DefaultOpTimeout || e.limits != lease.DefaultLimits {
		t.Errorf("defaults = prefix %q, timeout %v, limits %+v", e.prefix, e.opTimeout, e.limits)
	}
	if e.logLen != lease.DefaultEventLogLen || e.logTTL != DefaultEventLogTTL || e.watchBuffer != lease.DefaultWatchBuffer ||
		e.presenceTTL != lease.DefaultPresenceTTL {
		t.Errorf("event defaults = log %d for %v, watch buffer %d, presence TTL %v", e.logLen, e.logTTL, e.watchBuffer, e.presenceTTL)
	}
	if e.auditLen != lease.DefaultAuditMaxRecords || e.auditTTL != lease.DefaultAuditRetention {
		t.Errorf("audit defaults = %d records for %v", e.auditLen, e.auditTTL)
	}
	if e.handoffTimeout != lease.DefaultHandoffTimeout || e.handoffReserve != lease.DefaultHandoffReserve {
		t.Errorf("handoff defaults = timeout %v, reserve %v", e.handoffTimeout, e.handoffReserve)
	}
	_ = e.Close()
}

func TestNewClientParsesURLsAndBoundsTimeouts(t *testing.T) {
	const op = 700 * time.Millisecond
	t.Run("standalone", func(t *testing.T) {
		for _, tc := range []struct {
			url     string
			addr    string
			db      int
			tls     bool
			retries int
		}{
			{"redis://127.0.0.1:6380/3", "127.0.0.1:6380", 3, false, 2},
			{"redis://user:pw@redis.example:6379", "redis.example:6379", 0, false, 2},
			{"rediss://redis.example:6380/1?max_retries=1&read_timeout=10s&dial_timeout=100ms", "redis.example:6380", 1, true, 1},
			{"redis://h:1?read_timeout=-1&write_timeout=0&pool_timeout=1h", "h:1", 0, false, 2},
		} {
			c, err := NewClient(tc.url, op)
			if err != nil {
				t.Fatalf("NewClient(%q): %v", tc.url, err)
			}
			o := c.(*redis.Client).Options()
			_ = c.Close()
			if o.Addr != tc.addr || o.DB != tc.db || (o.TLSConfig != nil) != tc.tls || o.MaxRetries != tc.retries {
				t.Errorf("NewClient(%q): addr %q db %d tls %v retries %d; want %q %d %v %d",
					tc.url, o.Addr, o.DB, o.TLSConfig != nil, o.MaxRetries, tc.addr, tc.db, tc.tls, tc.retries)
			}
			if !o.ContextTimeoutEnabled {
				t.Errorf("NewClient(%q): ContextTimeoutEnabled is off", tc.url)
			}
			if o.Protocol != 2 {
				t.Errorf("NewClient(%q): protocol %d, want RESP2 unless the URL says", tc.url, o.Protocol)
			}
			for name, d := range map[string]time.Duration{"dial": o.DialTimeout, "read": o.ReadTimeout, "write": o.WriteTimeout, "pool": o.PoolTimeout} {
				if d <= 0 || d > op {
					t.Errorf("NewClient(%q): %s timeout %v, want in (0, %v]", tc.url, name, d, op)
				}
			}
		}
		c, err := NewClient("rediss://redis.example:6380/1?dial_timeout=100ms", op)
		if err != nil {
			t.Fatal(err)
		}
		if d := c.(*redis.Client).Options().DialTimeout; d != 100*time.Millisecond {
			t.Errorf("a shorter dial timeout from the URL became %v", d)
		}
		_ = c.Close()
		if c, err = NewClient("redis://h:1?pool_size=5", op); err != nil {
			t.Fatal(err)
		}
		if n := c.(*redis.Client).Options().PoolSize; n != 5 {
			t.Errorf("pool_size=5 in the URL became %d", n)
		}
		_ = c.Close()
		if c, err = NewClient("redis://h:1?protocol=3", op); err != nil {
			t.Fatal(err)
		}
		if n := c.(*redis.Client).Options().Protocol; n != 3 {
			t.Errorf("protocol=3 in the URL became %d", n)
		}
		_ = c.Close()
		for _, p := range []string{"4", "1", "0", "", "resp3"} {
			if _, err := NewClient("redis://h:1?protocol="+p, op); err == nil || !strings.Contains(err.Error(), "is not 2 or 3") {
				t.Errorf("protocol=%s in the URL: %v, want it refused", p, err)
			}
		}
	})

	t.Run("unix socket", func(t *testing.T) {
		c, err := NewClient("unix:///run/redis.sock?db=2", op)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if o := c.(*redis.Client).Options(); o.Network != "unix" || o.Addr != "/run/redis.sock" || o.DB != 2 {
			t.Errorf("unix URL: network %q addr %q db %d", o.Network, o.Addr, o.DB)
		}
	})

	t.Run("cluster", func(t *testing.T) {
		c, err := NewClient("redis://n1:7000?cluster=true&addr=n2:7000&addr=n3:7000", op)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		cc, ok := c.(*redis.ClusterClient)
		if !ok {
			t.Fatalf("cluster=true made a %T", c)
		}
		o := cc.Options()
		if strings.Join(o.Addrs, ",") != "n1:7000,n2:7000,n3:7000" || !o.ContextTimeoutEnabled || o.ReadTimeout > op || o.ReadTimeout <= 0 || o.Protocol != 2 {
			t.Errorf("cluster options: addrs %v, context timeouts %v, read timeout %v, protocol %d", o.Addrs, o.ContextTimeoutEnabled, o.ReadTimeout, o.Protocol)
		}
	})

	t.Run("sentinel", func(t *testing.T) {
		c, err := NewClient("redis://s1:26379/2?master_name=main&addr=s2:26379", op)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		cl, ok := c.(*redis.Client)
		if !ok {
			t.Fatalf("master_name made a %T", c)
		}
		if o := cl.Options(); o.DB != 2 || !o.ContextTimeoutEnabled || o.ReadTimeout > op || o.ReadTimeout <= 0 || o.Protocol != 2 {
			t.Errorf("sentinel options: db %d, context timeouts %v, read timeout %v, protocol %d", o.DB, o.ContextTimeoutEnabled, o.ReadTimeout, o.Protocol)
		}
	})

	t.Run("zero timeout means the default", func(t *testing.T) {
		c, err := NewClient("redis://h:1", 0)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if d := c.(*redis.Client).Options().ReadTimeout; d != DefaultOpTimeout {
			t.Errorf("read timeout %v, want %v", d, DefaultOpTimeout)
		}
	})

	t.Run("bad URLs", func(t *testing.T) {
		for _, u := range []string{
			"",
			"127.0.0.1:6379",
			"http://u:s3cret@h:6379",
			"redis://u:s3cret@h:notaport",
			"redis://u:s3cret@h:6379/notadb",
			"redis://u:s3cret@h:6379/0?bogus=1",
			"redis://u:s3cret@h:6379/0?cluster=maybe",
			"redis://u:s3cret@h:6379?cluster=true&master_name=m",
			"unix://u:s3cret@/run/redis.sock?cluster=true",
			"redis://u:s3cret@h:6379/0?max_retries=many",
			"redis://u:s3cret@h:6379/0?cluster=true&db=3x",
			"redis://u:s3cret@h:6379/0?master_name=m&dial_timeout=soon",
			"redis://u:s3c%zzret@h:6379/0",
			"redis://u:s3cret@[::1",
			"redis://u:s3cret@h:6379/0?master_name=m&addr=bad%zz",
			"redis://u:s3cret@h:6379?cluster=true&addr=x:notaport",
			"redis://u:s3cret@h:6379?cluster=true&addr=x",
			"redis://u:s3cret@h:6379/5?cluster=true",
		} {
			c, err := NewClient(u, op)
			if err == nil {
				_ = c.Close()
				t.Errorf("NewClient(%q) = nil error", u)
				continue
			}
			if strings.Contains(err.Error(), "s3c") {
				t.Errorf("NewClient(%q) = %q: the error shows the password", u, err)
			}
			if !strings.HasPrefix(err.Error(), "leaseredis: ") {
				t.Errorf("NewClient(%q) = %q, want it prefixed", u, err)
			}
			// CheckURL, which configurations call before anything starts, finds the same.
			if cerr := CheckURL(u); cerr == nil || cerr.Error() != err.Error() {
				t.Errorf("CheckURL(%q) = %v, want NewClient's %q", u, cerr, err)
			}
		}
		for _, u := range []string{"redis://h:6379/0", "rediss://u:p@h:6379?cluster=true&addr=h2:6379", "redis://s:26379?master_name=m"} {
			if err := CheckURL(u); err != nil {
				t.Errorf("CheckURL(%q) = %v, want nil", u, err)
			}
		}
		if _, err := NewClient("redis://h:1", -time.Second); err == nil {
			t.Error("NewClient with a negative timeout = nil error")
		}
	})
}

// numberArgument is a command called with a number among its arguments (see
// TestScriptsDeclareTheirKeysAndArgumentsAndNeverPrintNumbers).
var numberArgument = regexp.MustCompile(`\b(rcall|rpcall|redis\.p?call)\([^()]*,\s*-?[0-9]+\s*[,)]`)

func TestScriptsDeclareTheirKeysAndArgumentsAndNeverPrintNumbers(t *testing.T) {
	preludes := map[string]string{"state.lua": stateLua, "admin.lua": adminLua, "events.lua": eventsLua, "presence.lua": presenceLua}
	scripts := map[string]string{
		"acquire.lua": acquireLua, "renew.lua": renewLua, "release.lua": releaseLua,
		"check.lua": checkLua, "get.lua": getLua, "watch.lua": watchLua, "settle.lua": settleLua,
		"join.lua": joinLua, "leave.lua": leaveLua, "tabs.lua": tabsLua, "revoke.lua": revokeLua,
	}
	split := func(src string) (header, body string) {
		var h, code []string
		inHeader := true
		for line := range strings.SplitSeq(src, "\n") {
			comment := strings.HasPrefix(strings.TrimSpace(line), "--")
			if inHeader && comment {
				h = append(h, line)
				continue
			}
			inHeader = false
			if !comment {
				code = append(code, line)
			}
		}
		return strings.Join(h, "\n"), strings.Join(code, "\n")
	}
	all := maps.Clone(preludes)
	maps.Copy(all, scripts)
	for name, src := range all {
		h, body := split(src)
		if !strings.HasPrefix(h, "-- "+name+": ") {
			t.Errorf("%s does not start with a header naming it: %q", name, firstLine(src))
		}
		// Numbers go through string.format('%d') or integer replies, never tostring (1.7e+15).
		if strings.Contains(body, "tostring") {
			t.Errorf("%s uses tostring", name)
		}
		// Commands are given strings: Redis writes a number given to redis.call with "%.17g", about
		// 2,200 instructions on every call (state.lua).
		if m := numberArgument.FindString(body); m != "" {
			t.Errorf("%s gives a command a number: %q", name, m)
		}
		// Keys are named once, in state.lua, whose header declares every one it uses.
		if name == "state.lua" {
			for i := 1; i <= 11; i++ {
				k := "KEYS[" + strconv.Itoa(i) + "]"
				if used, named := strings.Contains(body, k), strings.Contains(h, k); used != named || (i <= 9 && !used) {
					t.Errorf("state.lua: %s is used without a header line, or named and unused", k)
				}
			}
		} else if strings.Contains(body, "KEYS[") || strings.Contains(body, "redis.call('EVAL") {
			t.Errorf("%s uses KEYS directly; the keys are named in state.lua", name)
		}
		if _, ok := preludes[name]; ok {
			if name != "state.lua" && (strings.Contains(body, "ARGV[") || strings.Contains(body, "arg_int(")) {
				t.Errorf("prelude %s reads ARGV; only state.lua and the scripts do", name)
			}
			continue
		}
		if !strings.Contains(h, "-- KEYS[1..8]") || !strings.Contains(h, "-- ARGV[1] ") {
			t.Errorf("%s: the header does not name the session's KEYS and the common ARGV:\n%s", name, h)
		}
		// A script that changes the session answers the retries of its call from KEYS[9].
		if changes := strings.Contains(body, "replayed()"); changes != strings.Contains(h, "-- KEYS[9]") {
			t.Errorf("%s: replayed() is called without a KEYS[9] header line, or the reverse", name)
		}
		for i := 1; i <= 16; i++ {
			arg := "ARGV[" + strconv.Itoa(i) + "]"
			used := strings.Contains(body, arg) || strings.Contains(body, "arg_int("+strconv.Itoa(i)+",")
			named := strings.Contains(h, "-- "+arg)
			switch {
			case i == 1 && used:
				t.Errorf("%s reads %s, which state.lua reads for every script", name, arg)
			case i > 1 && used != named:
				t.Errorf("%s: %s is used without a header line, or named and unused", name, arg)
			}
		}
		// Every path that returns after settle appends and publishes what it announced (the lease
		// form's "DEFER" comes before anything is announced: see state.lua).
		if i := strings.Index(body, "settle(s, now)"); i >= 0 {
			for line := range strings.SplitSeq(body[i:], "\n") {
				if strings.HasPrefix(strings.TrimSpace(line), "return ") && !strings.Contains(line, "finish(") &&
					strings.TrimSpace(line) != "return replay" && strings.TrimSpace(line) != "return 'DEFER'" &&
					!strings.Contains(body, "flush(s, now)") {
					t.Errorf("%s returns without finish or flush: %q", name, line)
				}
			}
		}
	}
}

func firstLine(s string) string { line, _, _ := strings.Cut(s, "\n"); return line }

func TestParseReplyRefusesMalformedAnswers(t *testing.T) {
	// noHandoff is the handoff fields when there is none, then no block (block_until_us 0).
	noHandoff := []any{int64(0), "", "", int64(0), int64(0), int64(0)}
	good := append([]any{"OK", int64(1), "tab-a", "L", int64(0), int64(5), int64(4), int64(9), int64(5), int64(1), int64(6), int64(0)}, noHandoff...)
	if _, l, until, err := parseReply(alice, good); err != nil || !l.HeldBy("tab-a", 5) || l.TTL != 5*time.Millisecond || !until.IsZero() ||
		l.Handoff != nil || !l.BlockedUntil.IsZero() {
		t.Fatalf("parseReply(good) = %+v, %v, %v", l, until, err)
	}
	blocked := append(append(append([]any{"BLOCKED", int64(0), "", "", int64(0)}, good[5:11]...), int64(7)), noHandoff[:5]...)
	blocked = append(blocked, int64(7))
	if status, l, until, err := parseReply(alice, blocked); err != nil || status != statusBlocked || until.UnixMicro() != 7 ||
		l.Held || !l.BlockedUntil.Equal(time.UnixMicro(7)) || l.BlockedUntil.Location() != time.UTC {
		t.Fatalf("parseReply(blocked) = %q, %+v, %v, %v", status, l, until, err)
	}
	// with replaces the handoff fields of good, and answers no block.
	with := func(ho ...any) []any { return append(append(append([]any{}, good[:12]...), ho...), int64(0)) }
	// withBlock replaces the block field of good.
	withBlock := func(b any) []any { return append(append([]any{}, good[:17]...), b) }
	requested := with(int64(1), "tab-b", "B", int64(1), int64(8))
	if _, l, _, err := parseReply(alice, requested); err != nil || l.Handoff == nil ||
		*l.Handoff != (lease.HandoffState{Requester: lease.Holder{TabID: "tab-b", Label: "B", Hidden: true}, Until: time.UnixMicro(8).UTC()}) {
		t.Fatalf("parseReply(requested) = %+v, %v", l.Handoff, err)
	}
	free := append(append([]any{"PENDING", int64(0), "", "", int64(0)}, good[5:11]...), int64(8))
	pending := append(append([]any{}, free...), int64(2), "tab-b", "", int64(0), int64(8), int64(0))
	if status, l, until, err := parseReply(alice, pending); err != nil || status != statusPending || until.UnixMicro() != 8 ||
		l.Held || l.Handoff == nil || !l.Handoff.Reserved || l.Handoff.Requester.TabID != "tab-b" {
		t.Fatalf("parseReply(pending) = %q, %+v, %v, %v", status, l, until, err)
	}
	for name, v := range map[string]any{
		"nil":                              nil,
		"a string":                         "OK",
		"too short":                        good[:12],
		"the short answer as a table":      good[:11],
		"the old length":                   good[:17],
		"a block that ended":               withBlock(int64(6)),
		"a negative block":                 withBlock(int64(-7)),
		"a block as a string":              withBlock("7"),
		"a number as str":                  append(append([]any{}, good[:5]...), append([]any{"5"}, good[6:]...)...),
		"an epoch of 2^53":                 append(append([]any{}, good[:5]...), append([]any{int64(lease.MaxEpoch)}, good[6:]...)...),
		"a negative time":                  append(append(append([]any{}, good[:10]...), int64(-1), int64(0)), noHandoff...),
		"no store time":                    append(append(append([]any{}, good[:10]...), int64(0), int64(0)), noHandoff...),
		"a float":                          append(append(append([]any{}, good[:10]...), math.Pi, int64(0)), noHandoff...),
		"a negative until":                 append(append(append([]any{}, good[:11]...), int64(-1)), noHandoff...),
		"a handoff of 3":                   with(int64(3), "tab-b", "", int64(0), int64(8)),
		"a handoff without requester":      with(int64(1), "", "", int64(0), int64(8)),
		"a handoff that ended":             with(int64(1), "tab-b", "", int64(0), int64(6)),
		"a requester without handoff":      with(int64(0), "tab-b", "", int64(0), int64(0)),
		"a reservation of a held lease":    with(int64(2), "tab-b", "", int64(0), int64(8)),
		"a request of a free lease":        append(append([]any{}, free...), int64(1), "tab-b", "", int64(0), int64(8), int64(0)),
		"a requester that is not a string": with(int64(1), int64(1), "", int64(0), int64(8)),
		"a negative handoff until":         with(int64(1), "tab-b", "", int64(0), int64(-8)),
	} {
		if _, _, _, err := parseReply(alice, v); err == nil {
			t.Errorf("parseReply(%s) = nil error", name)
		}
	}
}

// TestAServerWithoutTheLibraryGetsItOnce: after FUNCTION FLUSH (as after a restart without data),
// the calls in flight all answer, and the library is loaded once for them.
func TestAServerWithoutTheLibraryGetsItOnce(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	e := engineOn(t, srv.URL(), "", time.Second)
	l := mustAcquire(t, e, alice, tabA, lease.ModeTry)
	loads := func() int {
		t.Helper()
		return redistest.CommandCalls(t, c)["function|load"]
	}
	before := loads()
	if err := c.FunctionFlush(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for range 32 {
		wg.Go(func() {
			_, err := e.Check(t.Context(), alice, "tab-a", l.Epoch)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("a check after FUNCTION FLUSH: %v", err)
		}
	}
	if n := loads() - before; n != 1 {
		t.Fatalf("the library was loaded %d times for 32 calls, want once", n)
	}
}

// TestTheUsualRenewAndCheckReadOnlyTheLease: a renew that only extends the lease its tab holds is
// one FCALL in the lease form (two keys, see state.lua) that runs three commands in Redis, and a
// check that confirms it one of two, whatever else the state hash holds (the PEXPIRETIME of keep
// only when what the last of them learnt of the hash's expiry does not tell: keep_held); with a handoff in
// progress both defer to a second FCALL with every key, read the whole state, and answer the
// handoff. Only renew and check take the lease form.
func TestTheUsualRenewAndCheckReadOnlyTheLease(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	e := engineOn(t, srv.URL(), "", time.Second)
	ctx := t.Context()
	// commands runs op and answers the commands Redis ran for it, by name, FCALL left out.
	commands := func(op func()) map[string]int {
		t.Helper()
		if err := c.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		op()
		got := redistest.CommandCalls(t, c)
		for _, name := range []string{"info", "config|resetstat"} {
			delete(got, name)
		}
		return got
	}
	l := mustAcquire(t, e, alice, tabA, lease.ModeTry)
	if _, err := e.Release(ctx, lease.ReleaseRequest{Key: alice, TabID: tabA.TabID, Epoch: l.Epoch}); err != nil {
		t.Fatal(err)
	}
	l = mustAcquire(t, e, alice, tabA, lease.ModeTry) // the hash holds more than the lease now
	renew := func() lease.Lease {
		t.Helper()
		r, err := e.Renew(ctx, lease.RenewRequest{Key: alice, TabID: tabA.TabID, Epoch: l.Epoch, TTL: time.Minute})
		if err != nil || !r.HeldBy(tabA.TabID, l.Epoch) {
			t.Fatalf("Renew = %+v, %v; want it held by %s at %d", r, err, tabA.TabID, l.Epoch)
		}
		return r
	}
	check := func() lease.Lease {
		t.Helper()
		r, err := e.Check(ctx, alice, tabA.TabID, l.Epoch)
		if err != nil || !r.HeldBy(tabA.TabID, l.Epoch) {
			t.Fatalf("Check = %+v, %v; want it held by %s at %d", r, err, tabA.TabID, l.Epoch)
		}
		return r
	}
	renew() // the first renew may move the hash's expiry (keep); the usual one does not
	want := map[string]int{"fcall": 1, "time": 1, "hmget": 1, "hset": 1}
	var r lease.Lease
	if got := commands(func() { r = renew() }); !maps.Equal(got, want) {
		t.Errorf("a renew ran %v, want %v", got, want)
	}
	if r.Holder != tabA || r.Transitions != l.Transitions || !r.GrantedAt.Equal(l.GrantedAt) || !r.ExpiresAt.After(l.ExpiresAt) {
		t.Errorf("renew answered %+v after the grant %+v", r, l)
	}
	want = map[string]int{"fcall": 1, "time": 1, "hmget": 1}
	if got := commands(func() { r = check() }); !maps.Equal(got, want) {
		t.Errorf("a check ran %v, want %v", got, want)
	}
	if r.Holder != tabA || r.Transitions != l.Transitions {
		t.Errorf("check answered %+v after the grant %+v", r, l)
	}

	if _, err := e.Acquire(ctx, lease.AcquireRequest{Key: alice, Holder: tabB, TTL: time.Minute, Mode: lease.ModeHandoff}); !errors.Is(err, lease.ErrHandoffPending) {
		t.Fatalf("a handoff request: %v, want %v", err, lease.ErrHandoffPending)
	}
	for name, op := range map[string]func() lease.Lease{"renew": renew, "check": check} {
		var r lease.Lease
		if got := commands(func() { r = op() }); got["fcall"] != 2 {
			t.Errorf("a %s during a handoff ran %v, want two FCALLs", name, got)
		}
		if r.Handoff == nil || r.Handoff.Requester.TabID != tabB.TabID {
			t.Errorf("a %s during a handoff answered the handoff %+v, want the request of %s", name, r.Handoff, tabB.TabID)
		}
	}

	// In the lease form, a renew that needs more defers having changed nothing, and the functions
	// that need every key refuse it.
	keys := []string{e.stateKey(alice), e.knownKey(alice.User)}
	before, err := c.HGetAll(ctx, keys[0]).Result()
	if err != nil {
		t.Fatal(err)
	}
	args := append(slices.Clone(e.common), tabA.TabID, strconv.FormatInt(l.Epoch+1, 10), "0", "60000")
	if v, err := c.FCall(ctx, renewFn.fcall, keys, args...).Result(); v != statusDefer || err != nil {
		t.Errorf("a renew of another epoch in the lease form answered %v, %v; want %s", v, err, statusDefer)
	}
	if after, err := c.HGetAll(ctx, keys[0]).Result(); err != nil || !maps.Equal(before, after) {
		t.Errorf("a renew that deferred changed the state hash from %v to %v (%v)", before, after, err)
	}
	args = append(slices.Clone(e.common), tabA.TabID, "", "0", "60000", "try", "1000", "1000")
	if err := c.FCall(ctx, acquireFn.fcall, keys, args...).Err(); err == nil || !strings.Contains(err.Error(), "takes the keys of the session") {
		t.Errorf("an acquire in the lease form: %v, want it refused", err)
	}
}

// TestServerMismatchNamesRefusedCredentials: a user or password that Redis refuses (WRONGPASS),
// or none where it asks for one (NOAUTH), is a mismatch, not an outage: no retry makes it work.
func TestServerMismatchNamesRefusedCredentials(t *testing.T) {
	rds := redistest.Start(t)
	addr := rds.Addr()
	if err := rds.Client(t).Do(t.Context(), "ACL", "SETUSER", "app", "on", ">right", "~*", "&*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	mismatch := func(url string) error { return engineOn(t, url, "", time.Second).ServerMismatch(t.Context()) }
	const refused = "the server refused the URL's user and password ("
	for _, url := range []string{"redis://app:wrong@" + addr + "/0", "redis://ghost:right@" + addr + "/0"} {
		if err := mismatch(url); err == nil || !strings.HasPrefix(err.Error(), refused+"WRONGPASS") {
			t.Errorf("ServerMismatch of %s = %v, want %q…WRONGPASS", url, err, refused)
		}
	}
	if err := mismatch("redis://app:right@" + addr + "/0"); err != nil {
		t.Errorf("ServerMismatch of the right user and password = %v, want none", err)
	}

	if err := rds.Client(t).ConfigSet(t.Context(), "requirepass", "pw").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c := redis.NewClient(&redis.Options{Addr: addr, Password: "pw"})
		defer c.Close()
		if err := c.ConfigSet(context.Background(), "requirepass", "").Err(); err != nil {
			t.Error(err)
		}
	})
	const noPassword = "the server asks for a password, which the URL does not give (NOAUTH"
	for _, url := range []string{"redis://" + addr + "/0", "redis://app@" + addr + "/0"} {
		if err := mismatch(url); err == nil || !strings.HasPrefix(err.Error(), noPassword) {
			t.Errorf("ServerMismatch of %s, without the password Redis asks for = %v, want %q…", url, err, noPassword)
		}
	}
	if err := mismatch("redis://:pw@" + addr + "/0"); err != nil {
		t.Errorf("ServerMismatch with requirepass's password = %v, want none", err)
	}
}

// TestServerMismatchNamesAReplica: a URL of one server that reached a replica is a mismatch; one
// that reached a primary is not, nor one whose server does not answer.
func TestServerMismatchNamesAReplica(t *testing.T) {
	primary, replica := redistest.Start(t), redistest.Start(t)
	host, port, _ := net.SplitHostPort(primary.Addr())
	if err := replica.Client(t).ReplicaOf(t.Context(), host, port).Err(); err != nil {
		t.Fatal(err)
	}
	if err := engineOn(t, replica.URL(), "", time.Second).ServerMismatch(t.Context()); err == nil || !strings.Contains(err.Error(), "replica") {
		t.Errorf("ServerMismatch of a replica = %v, want it named", err)
	}
	if err := engineOn(t, primary.URL(), "", time.Second).ServerMismatch(t.Context()); err != nil {
		t.Errorf("ServerMismatch of a primary = %v, want none", err)
	}
	// redis-server has databases 0 to 15 unless configured otherwise.
	if err := engineOn(t, "redis://"+primary.Addr()+"/99", "", time.Second).ServerMismatch(t.Context()); err == nil ||
		!strings.Contains(err.Error(), "no database 99") {
		t.Errorf("ServerMismatch of database 99 = %v, want it named", err)
	}
	down := engineOn(t, primary.URL(), "", 200*time.Millisecond)
	primary.Stop(t)
	if err := down.ServerMismatch(t.Context()); err != nil {
		t.Errorf("ServerMismatch of a server that does not answer = %v, want none", err)
	}
}

// TestServerMismatchNamesAServerOutsideACluster: a Cluster URL (cluster=true) whose nodes answer
// that their cluster support is disabled is a mismatch that names them, whether or not another
// node of the URL answers at all; not when no node answers, nor when the user may not ask for the
// slot map.
func TestServerMismatchNamesAServerOutsideACluster(t *testing.T) {
	s := redistest.Start(t)
	down := net.JoinHostPort("127.0.0.1", unusedPort(t))
	want := "the server at " + s.Addr() + " is outside a Redis Cluster (CLUSTER SLOTS answers no slot map); remove cluster=true"
	for _, url := range []string{"redis://" + s.Addr() + "?cluster=true", "redis://" + down + "?cluster=true&addr=" + s.Addr()} {
		if err := engineOn(t, url, "", time.Second).ServerMismatch(t.Context()); err == nil || err.Error() != want {
			t.Errorf("ServerMismatch of %s = %v, want %q", url, err, want)
		}
	}
	if err := engineOn(t, "redis://"+down+"?cluster=true", "", 200*time.Millisecond).ServerMismatch(t.Context()); err != nil {
		t.Errorf("ServerMismatch of a Cluster URL whose node does not answer = %v, want none", err)
	}
	if err := s.Client(t).Do(t.Context(), "ACL", "SETUSER", "noslots", "on", ">pw", "~*", "&*", "+@all", "-cluster|slots").Err(); err != nil {
		t.Fatal(err)
	}
	if err := engineOn(t, "redis://noslots:pw@"+s.Addr()+"?cluster=true", "", time.Second).ServerMismatch(t.Context()); err != nil {
		t.Errorf("ServerMismatch as an ACL user who may not ask CLUSTER SLOTS = %v, want none", err)
	}
}

// TestPingFailsWhereTheCallsWould checks that Ping runs a function of the library: ready on a
// primary (loading the library when it is missing), not ready for an ACL user that may not run
// scripts or TIME or publish on the prefix's channels, nor on a read-only replica, though they
// answer PING.
func TestPingFailsWhereTheCallsWould(t *testing.T) {
	primary, replica := redistest.Start(t), redistest.Start(t)
	c := primary.Client(t)
	e := engineOn(t, primary.URL(), "", time.Second)
	if err := e.Ping(t.Context()); err != nil {
		t.Fatalf("Ping of a primary = %v", err)
	}
	if err := c.FunctionFlush(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.Ping(t.Context()); err != nil {
		t.Fatalf("Ping of a primary without the library = %v, want it loaded", err)
	}
	if libs := c.FunctionList(t.Context(), redis.FunctionListQuery{}).Val(); len(libs) != 1 {
		t.Errorf("libraries after Ping = %d, want the engine's", len(libs))
	}

	if err := c.Do(t.Context(), "ACL", "SETUSER", "noscripts", "on", ">pw", "~*", "&*", "+@all", "-@scripting").Err(); err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(primary.Addr())
	noScripts := engineOn(t, "redis://noscripts:pw@"+primary.Addr()+"/0", "", time.Second)
	if err := noScripts.client.Ping(t.Context()).Err(); err != nil {
		t.Fatalf("PING as an ACL user without @scripting: %v, want PONG", err)
	}
	if err := noScripts.Ping(t.Context()); !errors.Is(err, lease.ErrUnavailable) || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("Ping as an ACL user without @scripting = %v, want unavailable with NOPERM", err)
	}
	// TIME, which every session script reads first, is in no category but @fast.
	// Events are published on the prefix's channel: a user whose channels leave it out would see
	// every call that announces something refused.
	if err := c.Do(t.Context(), "ACL", "SETUSER", "nochannel", "on", ">pw", "~*", "resetchannels", "&other:*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	if err := engineOn(t, "redis://nochannel:pw@"+primary.Addr()+"/0", "", time.Second).Ping(t.Context()); !errors.Is(err, lease.ErrUnavailable) ||
		!strings.Contains(err.Error(), "can't publish to the channel") {
		t.Errorf("Ping as an ACL user without the prefix's channels = %v, want unavailable, the script refused to publish", err)
	}
	if err := c.Do(t.Context(), "ACL", "SETUSER", "notime", "on", ">pw", "~*", "&*", "+@all", "-time").Err(); err != nil {
		t.Fatal(err)
	}
	if err := engineOn(t, "redis://notime:pw@"+primary.Addr()+"/0", "", time.Second).Ping(t.Context()); !errors.Is(err, lease.ErrUnavailable) ||
		!strings.Contains(err.Error(), "can't run this command") {
		t.Errorf("Ping as an ACL user without TIME = %v, want unavailable, the script refused its command", err)
	}

	if err := replica.Client(t).ReplicaOf(t.Context(), host, port).Err(); err != nil {
		t.Fatal(err)
	}
	onReplica := engineOn(t, replica.URL(), "", time.Second)
	if err := replica.Client(t).Ping(t.Context()).Err(); err != nil {
		t.Fatalf("PING of the replica: %v", err)
	}
	// Once synced, the replica has the library (functions are replicated), and refuses to run it.
	deadline := time.Now().Add(10 * time.Second)
	for len(replica.Client(t).FunctionList(t.Context(), redis.FunctionListQuery{}).Val()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the replica did not get the library")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := onReplica.Ping(t.Context()); !errors.Is(err, lease.ErrUnavailable) || !strings.Contains(err.Error(), "READONLY") {
		t.Errorf("Ping of a replica = %v, want unavailable with READONLY", err)
	}
}

// TestClockOffsetReadsRedisAgainstThisProcess: on one machine Redis's clock is this process's, so
// the offset is within the round trip, in the right unit.
func TestClockOffsetReadsRedisAgainstThisProcess(t *testing.T) {
	e, _, _ := newEngine(t)
	offset, rtt, err := e.ClockOffset(context.Background())
	if err != nil || rtt <= 0 || offset.Abs() > rtt/2+10*time.Millisecond {
		t.Fatalf("ClockOffset = %v, rtt %v, %v; want within the round trip", offset, rtt, err)
	}
}

// TestParseShortReadsAsTheLongAnswer: the short answer (reply in state.lua) reads as the long one
// with no refusal's end, no handoff and no block, held or free, and a malformed one is refused.
func TestParseShortReadsAsTheLongAnswer(t *testing.T) {
	tail := []any{int64(0), int64(0), "", "", int64(0), int64(0), int64(0)}
	for short, long := range map[string][]any{
		"OK 1 6 4 1 5006 5 1 5 tab-a a label": {"OK", int64(1), "tab-a", "a label", int64(1), int64(5), int64(4), int64(5006), int64(5), int64(1), int64(6)},
		"OK 1 6 4 1 5006 5 0 5 tab-a ":        {"OK", int64(1), "tab-a", "", int64(0), int64(5), int64(4), int64(5006), int64(5), int64(1), int64(6)},
		"RELEASED 0 6 4 2 6 5 0 5  ":          {"RELEASED", int64(0), "", "", int64(0), int64(5), int64(4), int64(6), int64(5), int64(2), int64(6)},
		"KEPT 0 6 0 0 0 0 0 0  ":              {"KEPT", int64(0), "", "", int64(0), int64(0), int64(0), int64(0), int64(0), int64(0), int64(6)},
	} {
		status, l, until, err := parseReply(alice, short)
		wantStatus, want, _, werr := parseReply(alice, append(long, tail...))
		if err != nil || werr != nil || status != wantStatus || l != want || !until.IsZero() {
			t.Errorf("parseReply(%q) = %q, %+v, %v, %v; want %q, %+v (%v)", short, status, l, until, err, wantStatus, want, werr)
		}
	}
	for _, a := range []string{
		"", "OK", "OK ", " 1 6 4 1 5006 5 1 5 tab-a L", "OK 1 6 4 1 5006 5 1 5", "OK 1 6 4 1 5006 5 1 5 tab-a",
		"OK 1 0 4 1 5006 5 1 5 tab-a L", "OK 1 6 0 1 5006 5 1 5 tab-a L", "OK 1 6 4 -1 5006 5 1 5 tab-a L",
		"OK 1 6 4 1 6 5 1 5 tab-a L", "OK 1 6 4 1 5006 0 1 5 tab-a L", "OK 1 6 4 1 5006 5 2 5 tab-a L",
		"OK 2 6 4 1 5006 5 1 5 tab-a L", "OK 1 6 4 1 5006 5 1 5  L", "OK 1 6.5 4 1 5006 5 1 5 tab-a L",
		"OK 1 6  4 1 5006 5 1 5 tab-a L", "OK 1 x 4 1 5006 5 1 5 tab-a L", "OK 1 6 4 99999999999999999999 5006 5 1 5 tab-a L",
		"OK 1 6 4 1 5006 5 1 9007199254740992 tab-a L", "RELEASED 0 6 4 2 6 5 0 5 tab-a ", "RELEASED 0 6 4 2 6 5 0 5  L",
		"RELEASED 0 6 4 2 6 5 1 5  ",
	} {
		if _, _, _, err := parseReply(alice, a); err == nil {
			t.Errorf("parseReply(%q) = nil error", a)
		}
	}
}

func TestSessionKeysAreEachKeyOfTheSessionAndTheUser(t *testing.T) {
	e := &Engine{prefix: "tl"}
	k := lease.Key{User: "u:1", Session: "s|2"}
	got := e.sessionKeys(k, keyName{nameReply, "R"}, keyName{nameAdminAudit, ""})
	want := []string{"tl:{u:1}:lease:s|2", "tl:{u:1}:log:s|2", "tl:{u:1}:tabs:s|2", "tl:{u:1}:tabinfo:s|2",
		"tl:{u:1}:sessions", "tl:{u:1}:audit", "tl:{u:1}:known", "tl:{u:1}:free", "tl:{u:1}:reply:R",
		"tl:{u:1}:audit:admin"}
	if !slices.Equal(got, want) {
		t.Fatalf("sessionKeys = %q\nwant %q", got, want)
	}
	if got[0] != e.stateKey(k) || got[5] != e.auditKey(k.User) || got[6] != e.knownKey(k.User) ||
		got[4] != e.indexKey(k.User) || got[9] != e.adminAuditKey(k.User) {
		t.Fatal("sessionKeys and the keys of one name differ")
	}
	if n := testing.AllocsPerRun(100, func() { e.sessionKeys(k, newReply()) }); n > 3 {
		t.Fatalf("sessionKeys with a reply key took %v allocations, want 3 (the reply id, the keys and their slice)", n)
	}
}
