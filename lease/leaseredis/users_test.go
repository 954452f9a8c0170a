package leaseredis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tablease/tablease/internal/redistest"
	"github.com/tablease/tablease/lease"
)

// sent is a hook that records the name of every command its client sends, one entry per round
// trip (a pipeline is one entry, "pipeline"), but for the handshake of a new connection, and fails
// the commands fail picks.
type sent struct {
	mu    sync.Mutex
	names []string
	fail  func(name string, before []string) error
}

func (h *sent) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *sent) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.mu.Lock()
		before := slices.Clone(h.names)
		h.names = append(h.names, cmd.Name())
		fail := h.fail
		h.mu.Unlock()
		if fail != nil {
			if err := fail(cmd.Name(), before); err != nil {
				return err
			}
		}
		return next(ctx, cmd)
	}
}

func (h *sent) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !handshake(cmds) {
			h.mu.Lock()
			h.names = append(h.names, "pipeline")
			h.mu.Unlock()
		}
		return next(ctx, cmds)
	}
}

// handshake reports whether cmds are what go-redis sends on a new connection, before any of the
// engine's.
func handshake(cmds []redis.Cmder) bool {
	for _, c := range cmds {
		if n := c.Name(); n != "client" && n != "hello" && n != "auth" && n != "select" {
			return false
		}
	}
	return true
}

// take answers the commands sent since the last take, a load of the library that a server lacked
// (fcall, function load, fcall) counted as the one call it is.
func (h *sent) take() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for i, n := range h.names {
		if n == "hello" || n == "client" || n == "function" || (n == "fcall" && i > 0 && h.names[i-1] == "function") {
			continue // a new connection's handshake (the engine sends no CLIENT); loading the library
		}
		out = append(out, n)
	}
	h.names = nil
	return out
}

// countedEngine returns an engine with opts on a namespace of the shared Redis whose client
// records what it sends, and a plain client of the same database.
func countedEngine(t *testing.T, opts Options) (*Engine, *sent, *redis.Client, *redistest.DB) {
	t.Helper()
	h := &sent{}
	e, c, db := sharedEngine(t, opts, h)
	return e, h, c, db
}

var (
	addThenScriptThenAdd = []string{"zadd", "fcall", "zadd"}
	scriptAlone          = []string{"fcall"}
)

func TestAnAcquireOfAUserTheEngineAddedIsOneRoundTrip(t *testing.T) {
	e, h, _, _ := countedEngine(t, Options{})
	ctx := t.Context()
	if e.usersHorizon != maxUsersHorizon {
		t.Fatalf("the horizon with the default retentions = %v, want %v", e.usersHorizon, maxUsersHorizon)
	}
	doc := func(user, sid string) lease.Key { return lease.Key{User: user, Session: sid} }

	// A user's first grant adds the user before and after its script, and records it.
	mustAcquire(t, e, doc("alice", "doc-1"), tabA, lease.ModeTry)
	if got := h.take(); !slices.Equal(got, addThenScriptThenAdd) {
		t.Fatalf("the first acquire of alice sent %q, want %q", got, addThenScriptThenAdd)
	}
	// Then every call of hers that would add sends its script alone: one round trip.
	for _, tc := range []struct {
		what string
		call func() error
	}{
		{"a grant of another session", func() error {
			_, err := e.Acquire(ctx, lease.AcquireRequest{Key: doc("alice", "doc-2"), Holder: tabA})
			return err
		}},
		{"the holder's acquire again", func() error {
			_, err := e.Acquire(ctx, lease.AcquireRequest{Key: doc("alice", "doc-1"), Holder: tabA})
			return err
		}},
		{"a takeover", func() error {
			_, err := e.Acquire(ctx, lease.AcquireRequest{Key: doc("alice", "doc-1"), Holder: tabB, Mode: lease.ModeTakeover})
			return err
		}},
		{"a refused try", func() error {
			_, err := e.Acquire(ctx, lease.AcquireRequest{Key: doc("alice", "doc-1"), Holder: tabA})
			if !errors.Is(err, lease.ErrHeld) {
				return fmt.Errorf("got %v, want lease.ErrHeld", err)
			}
			return nil
		}},
		{"a revoke", func() error {
			_, err := e.Revoke(ctx, lease.RevokeRequest{Key: doc("alice", "doc-2"), Admin: "root", Reason: "r"})
			return err
		}},
	} {
		if err := tc.call(); err != nil {
			t.Fatalf("%s: %v", tc.what, err)
		}
		if got := h.take(); !slices.Equal(got, scriptAlone) {
			t.Errorf("%s of alice sent %q, want %q: one round trip", tc.what, got, scriptAlone)
		}
	}
	// Another user is added as before.
	mustAcquire(t, e, doc("bob", "doc-1"), tabA, lease.ModeTry)
	if got := h.take(); !slices.Equal(got, addThenScriptThenAdd) {
		t.Fatalf("the first acquire of bob sent %q, want %q", got, addThenScriptThenAdd)
	}
	p, err := e.ListLeases(ctx, lease.ListQuery{})
	if err != nil || len(p.Leases) != 2 || p.Leases[0].Key != doc("alice", "doc-1") || p.Leases[1].Key != doc("bob", "doc-1") {
		t.Fatalf("ListLeases = %+v, %v; want alice's doc-1 and bob's", p.Leases, err)
	}

	// Without the record (a zero horizon), every acquire adds twice: three round trips.
	e.usersHorizon = 0
	h.take()
	mustAcquire(t, e, doc("alice", "doc-3"), tabA, lease.ModeTry)
	if got := h.take(); !slices.Equal(got, addThenScriptThenAdd) {
		t.Fatalf("an acquire of alice without the record sent %q, want %q", got, addThenScriptThenAdd)
	}
}

func TestALostUsersIndexEntryIsRepairedByTheFirstAcquireAfterTheHorizon(t *testing.T) {
	e, h, _, db := countedEngine(t, Options{})
	ctx := t.Context()
	clock := time.Now()
	e.now = func() time.Time { return clock }
	doc := func(sid string) lease.Key { return lease.Key{User: "alice", Session: sid} }
	listed := func() []lease.Key {
		t.Helper()
		p, err := e.ListLeases(ctx, lease.ListQuery{})
		if err != nil {
			t.Fatal(err)
		}
		return leaseKeys(p.Leases)
	}

	mustAcquire(t, e, doc("doc-1"), tabA, lease.ModeTry)
	h.take()
	// The data is lost (FLUSHDB, or the prefix's keys on an external Redis): the users index with it.
	db.Flush(t)
	clock = clock.Add(e.usersHorizon - time.Millisecond)
	mustAcquire(t, e, doc("doc-2"), tabA, lease.ModeTry)
	if got := h.take(); !slices.Equal(got, scriptAlone) {
		t.Fatalf("an acquire within the horizon sent %q, want %q", got, scriptAlone)
	}
	// Within the horizon the grant is missing from a listing of every user (the bounded window),
	// but not from a listing of its user, which does not read the users index.
	if got := listed(); len(got) != 0 {
		t.Fatalf("a listing of every user within the horizon after the loss = %v; want none (the test is wrong if the loss was repaired)", got)
	}
	p, err := e.ListLeases(ctx, lease.ListQuery{User: "alice"})
	if err != nil || !slices.Equal(leaseKeys(p.Leases), []lease.Key{doc("doc-2")}) {
		t.Fatalf("ListLeases of alice = %+v, %v; want doc-2", p.Leases, err)
	}

	// Past the horizon, the next acquire adds her again, and every lease of hers is listed.
	clock = clock.Add(time.Millisecond)
	h.take()
	mustAcquire(t, e, doc("doc-3"), tabA, lease.ModeTry)
	if got := h.take(); !slices.Equal(got, addThenScriptThenAdd) {
		t.Fatalf("the first acquire after the horizon sent %q, want %q", got, addThenScriptThenAdd)
	}
	if got, want := listed(), []lease.Key{doc("doc-2"), doc("doc-3")}; !slices.Equal(got, want) {
		t.Fatalf("a listing of every user after the repair = %v, want %v", got, want)
	}
	// And the record starts over from that add.
	clock = clock.Add(e.usersHorizon - time.Millisecond)
	h.take()
	mustAcquire(t, e, doc("doc-4"), tabA, lease.ModeTry)
	if got := h.take(); !slices.Equal(got, scriptAlone) {
		t.Fatalf("an acquire within the horizon of the repair sent %q, want %q", got, scriptAlone)
	}
}

func TestOnlyAnAddThatSucceededAfterAGrantIsRecorded(t *testing.T) {
	e, h, c, db := countedEngine(t, Options{})
	ctx := t.Context()
	users := db.Prefix() + ":users"
	doc := func(sid string) lease.Key { return lease.Key{User: "alice", Session: sid} }

	// The add before the script fails: nothing is granted, nothing recorded.
	if err := c.Set(ctx, users, "not a sorted set", 0).Err(); err != nil {
		t.Fatal(err)
	}
	_, err := e.Acquire(ctx, lease.AcquireRequest{Key: doc("doc-1"), Holder: tabA})
	wantUnavailable(t, "Acquire with a broken users index", "acquire", err)
	if err := c.Del(ctx, users).Err(); err != nil {
		t.Fatal(err)
	}
	h.take()

	// The add after the grant fails: the acquire answers the store's trouble, and records nothing.
	h.fail = func(name string, before []string) error {
		if name == "zadd" && len(before) > 0 && before[len(before)-1] == "fcall" {
			return errors.New("injected: the users index's shard does not answer")
		}
		return nil
	}
	_, err = e.Acquire(ctx, lease.AcquireRequest{Key: doc("doc-1"), Holder: tabA})
	wantUnavailable(t, "Acquire whose second add fails", "acquire", err)
	h.fail = nil
	h.take()
	mustAcquire(t, e, doc("doc-2"), tabA, lease.ModeTry)
	if got := h.take(); !slices.Equal(got, addThenScriptThenAdd) {
		t.Fatalf("the acquire after a failed add sent %q, want %q: a failed add must not be recorded", got, addThenScriptThenAdd)
	}

	// An acquire that does not grant records nothing either.
	_, err = e.Acquire(ctx, lease.AcquireRequest{Key: lease.Key{User: "bob", Session: "doc-1"}, Holder: tabA})
	if err != nil {
		t.Fatal(err)
	}
	e.added = addedUsers{} // forget bob's grant
	h.take()
	_, err = e.Acquire(ctx, lease.AcquireRequest{Key: lease.Key{User: "bob", Session: "doc-1"}, Holder: tabB})
	if !errors.Is(err, lease.ErrHeld) {
		t.Fatalf("a try on bob's held lease = %v, want lease.ErrHeld", err)
	}
	if _, err := e.Revoke(ctx, lease.RevokeRequest{Key: lease.Key{User: "bob", Session: "doc-2"}, Admin: "root", Reason: "r", Block: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if got, want := h.take(), []string{"zadd", "fcall", "zadd", "fcall"}; !slices.Equal(got, want) {
		t.Fatalf("a refused try then a revoke of bob sent %q, want %q: neither records", got, want)
	}
}

func TestTheUsersHorizonStaysWellWithinTheRetentions(t *testing.T) {
	for _, tc := range []struct {
		idle, audit, op, want time.Duration
	}{
		{lease.DefaultIdleRetention, lease.DefaultAuditRetention, DefaultOpTimeout, time.Minute},
		{2 * time.Minute, time.Hour, DefaultOpTimeout, 30 * time.Second},
		{time.Hour, 2 * time.Minute, DefaultOpTimeout, 30 * time.Second},
		{12 * time.Second, time.Hour, DefaultOpTimeout, 2 * time.Second},        // R less 5 OpTimeouts
		{10 * time.Second, time.Hour, DefaultOpTimeout, 0},                      // too short: nothing skipped
		{time.Second, time.Second, DefaultOpTimeout, 0},                         // too short: nothing skipped
		{time.Millisecond, time.Hour, time.Millisecond, 0},                      // too short: nothing skipped
		{time.Second, time.Hour, 10 * time.Millisecond, 250 * time.Millisecond}, // a quarter
	} {
		got := usersHorizon(tc.idle, tc.audit, tc.op)
		if got != tc.want {
			t.Errorf("usersHorizon(%v, %v, %v) = %v, want %v", tc.idle, tc.audit, tc.op, got, tc.want)
		}
		if r := min(tc.idle, tc.audit); got < 0 || got > r/4 || got > maxUsersHorizon || (got > 0 && got+replyKeptFor*tc.op > r) {
			t.Errorf("usersHorizon(%v, %v, %v) = %v: not within the retention less the time a call may take", tc.idle, tc.audit, tc.op, got)
		}
	}
	// The option the engine reads them from.
	e, _, _, _ := countedEngine(t, Options{IdleRetention: time.Second, AuditRetention: time.Second})
	if e.usersHorizon != 0 {
		t.Errorf("an engine with retentions of a second trusts its adds for %v, want 0", e.usersHorizon)
	}
}

func TestTheRecordOfAddedUsersIsBounded(t *testing.T) {
	var a addedUsers
	t0 := time.Now()
	for i := range 2*addedPerGeneration + 1 {
		a.note(fmt.Sprintf("u%d", i), t0.Add(time.Duration(i)))
	}
	if n := a.m.Len(); n > 2*addedPerGeneration {
		t.Fatalf("the record holds %d users, more than %d", n, 2*addedPerGeneration)
	}
	if _, ok := a.at("u0"); ok {
		t.Error("the oldest user is still recorded after two generations")
	}
	for _, u := range []string{fmt.Sprintf("u%d", addedPerGeneration), fmt.Sprintf("u%d", 2*addedPerGeneration)} {
		if _, ok := a.at(u); !ok {
			t.Errorf("%s, of the last two generations, is not recorded", u)
		}
	}
	// A later add moves the time forward, never back.
	last := fmt.Sprintf("u%d", addedPerGeneration)
	at, _ := a.at(last)
	a.note(last, at.Add(-time.Second))
	if got, _ := a.at(last); !got.Equal(at) {
		t.Errorf("an earlier time replaced %v with %v", at, got)
	}
	a.note(last, at.Add(time.Second))
	if got, _ := a.at(last); !got.Equal(at.Add(time.Second)) {
		t.Errorf("a later time left %v", got)
	}
}

func leaseKeys(ls []lease.Lease) []lease.Key {
	out := make([]lease.Key, len(ls))
	for i, l := range ls {
		out[i] = l.Key
	}
	return out
}
