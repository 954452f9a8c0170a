package leaseredis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tablease/tablease/internal/redistest"
	"github.com/tablease/tablease/lease"
)

func TestSweepPeriod(t *testing.T) {
	for _, tc := range []struct{ idle, want time.Duration }{
		{lease.DefaultIdleRetention, time.Minute}, // a quarter would be 2.5 minutes
		{2 * time.Minute, 30 * time.Second},
		{time.Second, time.Second}, // never under a second
	} {
		if got := sweepPeriod(tc.idle); got != tc.want {
			t.Errorf("sweepPeriod(%v) = %v, want %v", tc.idle, got, tc.want)
		}
	}
}

// TestTheSweepAnnouncesExpiriesNobodyElseAnnounces lets leases expire where nobody watches and no
// call comes, and sweeps by hand (the default period, a minute, is longer than the test): each
// expiry is announced and recorded once, at the lease's end, across several pages of users and of
// one user's index, whichever engine sweeps; a held lease is left alone; an engine sweeps only
// when no engine of the prefix took the turn in the period.
func TestTheSweepAnnouncesExpiriesNobodyElseAnnounces(t *testing.T) {
	e, c, db := adminEngine(t, Options{})
	ctx := t.Context()
	client, err := NewClient(db.URL(), DefaultOpTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	other, err := New(client, Options{Prefix: db.Prefix(), Limits: e.limits})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Close() })

	short := func(k lease.Key) lease.Lease {
		t.Helper()
		l, err := e.Acquire(ctx, lease.AcquireRequest{Key: k, Holder: tabA, TTL: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	// More users than a page of the users index, and a user with more sessions than a page of
	// its index.
	var expiring []lease.Lease
	for i := range usersBatch + 1 {
		expiring = append(expiring, short(lease.Key{User: fmt.Sprintf("u%03d", i), Session: "doc-1"}))
	}
	for i := range usersBatch + 1 {
		expiring = append(expiring, short(lease.Key{User: "alice", Session: fmt.Sprintf("doc-%03d", i)}))
	}
	held := mustAcquire(t, e, lease.Key{User: "alice", Session: "held"}, tabB, lease.ModeTry)
	last := expiring[len(expiring)-1]
	waitStoreMicros(t, c, last.ExpiresAt.UnixMicro())

	n, turn, err := other.sweepTurn(ctx)
	if err != nil || !turn || n != len(expiring) {
		t.Fatalf("the sweep announced %d expiries (its turn: %t), %v; want %d", n, turn, err, len(expiring))
	}
	expires := func(k lease.Key) []lease.AuditRecord {
		t.Helper()
		var out []lease.AuditRecord
		for _, r := range allAudit(t, e, lease.AuditQuery{User: k.User, Session: k.Session}) {
			if r.Action == lease.AuditExpire {
				out = append(out, r)
			}
		}
		return out
	}
	for _, l := range []lease.Lease{expiring[0], expiring[usersBatch], expiring[usersBatch+1], last} {
		if recs := expires(l.Key); len(recs) != 1 || !recs[0].At.Equal(l.ExpiresAt) || recs[0].Previous == nil || recs[0].Previous.TabID != tabA.TabID {
			t.Errorf("the expiry records of %v = %+v, want one, at %v, of %s", l.Key, recs, l.ExpiresAt, tabA.TabID)
		}
	}
	if recs := expires(held.Key); len(recs) != 0 {
		t.Errorf("the held lease has expiry records %+v", recs)
	}
	if got := c.ZRange(ctx, db.Prefix()+":{alice}:sessions", 0, -1).Val(); !slices.Equal(got, []string{"held"}) {
		t.Errorf("alice's index after the sweep = %q, want the held lease alone", got)
	}

	// The turn is taken for this period: neither engine sweeps again, and an expiry since stays
	// unannounced until the next period's sweep, which announces it alone.
	late := short(lease.Key{User: "bob", Session: "doc-1"})
	waitStoreMicros(t, c, late.ExpiresAt.UnixMicro())
	for _, x := range []*Engine{e, other} {
		if n, turn, err := x.sweepTurn(ctx); err != nil || turn || n != 0 {
			t.Fatalf("a sweep within the period announced %d expiries (its turn: %t), %v; want no turn", n, turn, err)
		}
	}
	if recs := expires(late.Key); len(recs) != 0 {
		t.Fatalf("an expiry was announced by a sweep within the period: %+v", recs)
	}
	if ttl := c.PTTL(ctx, e.sweepKey()).Val(); ttl <= 0 || ttl > e.sweepEvery {
		t.Errorf("PTTL of the sweep's turn = %v, want within the period %v", ttl, e.sweepEvery)
	}
	c.Del(ctx, e.sweepKey()) // the period passed
	if n, turn, err := e.sweepTurn(ctx); err != nil || !turn || n != 1 {
		t.Fatalf("the next period's sweep announced %d expiries (its turn: %t), %v; want 1", n, turn, err)
	}
	if recs := expires(late.Key); len(recs) != 1 || !recs[0].At.Equal(late.ExpiresAt) {
		t.Errorf("the expiry records of %v = %+v, want one at %v", late.Key, recs, late.ExpiresAt)
	}
	if n, err := other.sweep(ctx); err != nil || n != 0 {
		t.Errorf("a sweep after everything was announced announced %d expiries, %v; want none", n, err)
	}
}

// TestASweepPassesOverTheUsersWhoseKeysFail: users whose keys Redis cannot read (as on a Cluster
// shard that is down) cost their own expiries this period, not the others', however many they
// are: a store call that some keys answered is no failure in a row.
func TestASweepPassesOverTheUsersWhoseKeysFail(t *testing.T) {
	e, c, db := adminEngine(t, Options{})
	ctx := t.Context()
	good := []string{"amy", "cat", "zed"}
	var bad []string
	for i := range 2 * maxSweepFailures {
		bad = append(bad, fmt.Sprintf("bob%02d", i))
	}
	var last lease.Lease
	for _, u := range append(slices.Clone(good), bad...) {
		l, err := e.Acquire(ctx, lease.AcquireRequest{Key: lease.Key{User: u, Session: "doc"}, Holder: tabA, TTL: 20 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		last = l
	}
	waitStoreMicros(t, c, last.ExpiresAt.UnixMicro())
	for _, u := range bad {
		broken := db.Prefix() + ":{" + u + "}:sessions"
		if err := c.Del(ctx, broken).Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.Set(ctx, broken, "not a sorted set", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	n, err := e.sweep(ctx)
	var u *lease.UnavailableError
	if n != len(good) || !errors.As(err, &u) || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("the sweep announced %d expiries, %v; want the %d of %q, and the others' error", n, err, len(good), good)
	}
	for _, user := range good {
		recs := allAudit(t, e, lease.AuditQuery{User: user})
		if len(recs) != 2 || recs[0].Action != lease.AuditExpire {
			t.Errorf("%s's audit = %q, want the expiry, then the grant", user, actions(recs))
		}
	}
}

// TestTheSweepRunsAtMaxmemory: Redis at its maxmemory refuses the SET of the turn but runs
// get.lua, which announces expiries; the engine sweeps without the turn then.
func TestTheSweepRunsAtMaxmemory(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	client, err := NewClient(srv.URL(), DefaultOpTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	e, err := New(client, Options{Limits: lease.Limits{Min: 20 * time.Millisecond, Default: time.Second, Max: time.Minute, HiddenMax: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	ctx := t.Context()
	l, err := e.Acquire(ctx, lease.AcquireRequest{Key: lease.Key{User: "alice", Session: "doc"}, Holder: tabA, TTL: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	waitStoreMicros(t, c, l.ExpiresAt.UnixMicro())
	if err := c.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.ConfigSet(context.Background(), "maxmemory", "0").Err() })
	if err := c.Set(ctx, "probe", "x", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "OOM ") {
		t.Fatalf("a SET at maxmemory: %v, want OOM", err)
	}
	n, turn, err := e.sweepTurn(ctx)
	if err != nil || !turn || n != 1 {
		t.Fatalf("the sweep at maxmemory announced %d expiries (its turn: %t), %v; want 1", n, turn, err)
	}
	if recs := allAudit(t, e, lease.AuditQuery{User: "alice"}); len(recs) != 2 || recs[0].Action != lease.AuditExpire {
		t.Errorf("alice's audit = %q, want the expiry, then the grant", actions(recs))
	}
}

// TestEveryEngineSweepsByItself runs the sweep loop of an engine whose idle retention makes the
// period a second: an expiry nobody watches is recorded without any call, and OnSweep hears of
// each sweep, and of the error that ended one.
func TestEveryEngineSweepsByItself(t *testing.T) {
	type report struct {
		n   int
		err error
	}
	reports := make(chan report, 100)
	e, c, db := adminEngine(t, Options{IdleRetention: 4 * time.Second, OnSweep: func(n int, err error) {
		select {
		case reports <- report{n, err}:
		default:
		}
	}})
	ctx := t.Context()
	if e.sweepEvery != time.Second {
		t.Fatalf("the sweep period = %v, want a second", e.sweepEvery)
	}
	key := lease.Key{User: "alice", Session: "doc-1"}
	l, err := e.Acquire(ctx, lease.AcquireRequest{Key: key, Holder: tabA, TTL: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	next := func(what string) report {
		t.Helper()
		select {
		case r := <-reports:
			return r
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: no sweep reported in 20s", what)
		}
		return report{}
	}
	for r := next("the expiry"); r.n == 0; r = next("the expiry") {
		if r.err != nil {
			t.Fatalf("a sweep failed: %v", r.err)
		}
	}
	recs := allAudit(t, e, lease.AuditQuery{User: key.User, Session: key.Session})
	if len(recs) != 2 || recs[0].Action != lease.AuditExpire || !recs[0].At.Equal(l.ExpiresAt) {
		t.Fatalf("the audit after the sweep = %q, want the expiry at %v, then the grant", actions(recs), l.ExpiresAt)
	}

	// A users index Redis cannot page ends the next sweep with its error.
	if err := c.Set(ctx, db.Prefix()+":users", "not a sorted set", 0).Err(); err != nil {
		t.Fatal(err)
	}
	for r := next("the error"); ; r = next("the error") {
		var u *lease.UnavailableError
		if errors.As(r.err, &u) && strings.Contains(r.err.Error(), "WRONGTYPE") {
			break
		}
	}
}
