package leaseredis

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tablease/tablease/internal/redistest"
	"github.com/tablease/tablease/lease"
)

// The live key of a held lease (see state.lua), which the fast renew extends without a function.

// waitForStoreTime polls Redis's clock until it is past t.
func waitForStoreTime(t *testing.T, c *redis.Client, t0 time.Time) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		now, err := c.Time(t.Context()).Result()
		if err != nil {
			t.Fatal(err)
		}
		if now.After(t0) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Redis's clock did not pass %v", t0)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// liveEngine is an engine with opts on a Redis of its own, whose command counts are the engine's
// alone, with a plain client of it.
func liveEngine(t *testing.T, opts Options) (*Engine, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t)
	client, err := NewClient(srv.URL(), DefaultOpTimeout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	e, err := New(client, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e, srv.Client(t)
}

// calls runs op and answers the calls Redis counted of each command meanwhile.
func calls(t *testing.T, c *redis.Client, op func()) map[string]int {
	t.Helper()
	if err := c.ConfigResetStat(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	op()
	return redistest.CommandCalls(t, c)
}

// liveKeyOf is the live key of l, as the engine names it.
func liveKeyOf(e *Engine, l lease.Lease) string {
	return e.liveKey(l.Key, l.Epoch, l.Holder.Hidden, l.TTL.Milliseconds(), l.Holder.TabID)
}

func TestAFastRenewKeepsTheLeasePastTheHashsExpiryForEveryCall(t *testing.T) {
	e, c := liveEngine(t, Options{})
	ctx := t.Context()
	g, err := e.Acquire(ctx, lease.AcquireRequest{Key: alice, Holder: tabA, TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// The first renew is the function's, which writes the live key.
	a, err := e.Renew(ctx, lease.RenewRequest{Key: alice, TabID: tabA.TabID, Epoch: g.Epoch, TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	waitForStoreTime(t, c, a.Now.Add(300*time.Millisecond))
	var r lease.Lease
	n := calls(t, c, func() {
		r, err = e.Renew(ctx, lease.RenewRequest{Key: alice, TabID: tabA.TabID, Epoch: a.Epoch, TTL: time.Second})
	})
	if err != nil || !r.HeldBy(tabA.TabID, a.Epoch) || r.Holder != tabA || r.Transitions != a.Transitions ||
		!r.GrantedAt.Equal(a.GrantedAt) || r.ExpiresAt.Sub(r.Now) != time.Second || !r.ExpiresAt.After(a.ExpiresAt) {
		t.Fatalf("Renew = %+v, %v; want the grant %+v extended by a second", r, err, a)
	}
	if n["getex"] != 1 || n["fcall"] != 0 {
		t.Fatalf("the renew ran %v, want the fast one", n)
	}
	if w := c.PExpireTime(ctx, liveKeyOf(e, a)).Val(); w+time.Millisecond != time.Duration(r.ExpiresAt.UnixMilli())*time.Millisecond {
		t.Fatalf("the live key expires at %v, want the millisecond before the renew's expiry %v: Redis keeps it to the end of that millisecond", w, r.ExpiresAt)
	}
	if got := c.HGet(ctx, e.stateKey(alice), "expires_us").Val(); got != strconv.FormatInt(a.ExpiresAt.UnixMicro(), 10) {
		t.Fatalf("the state hash's expires_us = %s, want the first renew's: a fast renew writes the live key alone", got)
	}

	// Past the hash's expires_us, every call reads the lease as the live key extended it.
	waitForStoreTime(t, c, a.ExpiresAt)
	g, err = e.Get(ctx, alice)
	if err != nil || !g.HeldBy(tabA.TabID, a.Epoch) || g.ExpiresAt.Before(r.ExpiresAt) {
		t.Fatalf("Get = %+v, %v; want it held until %v at least", g, err, r.ExpiresAt)
	}
	if k, err := e.Check(ctx, alice, tabA.TabID, a.Epoch); err != nil || !k.HeldBy(tabA.TabID, a.Epoch) {
		t.Fatalf("Check = %+v, %v; want it held", k, err)
	}
	var held *lease.HeldError
	if _, err := e.Acquire(ctx, lease.AcquireRequest{Key: alice, Holder: tabB, TTL: time.Second}); !errors.As(err, &held) ||
		held.Holder.TabID != tabA.TabID || held.Remaining <= 0 {
		t.Fatalf("another tab's Acquire: %v, want it held by %s", err, tabA.TabID)
	}
	page, err := e.ListLeases(ctx, lease.ListQuery{User: alice.User})
	if err != nil || len(page.Leases) != 1 || !page.Leases[0].HeldBy(tabA.TabID, a.Epoch) {
		t.Fatalf("ListLeases = %+v, %v; want the lease held", page, err)
	}
	if _, err := e.sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if ended := c.HGet(ctx, e.stateKey(alice), "ended_epoch").Val(); ended == strconv.FormatInt(a.Epoch, 10) {
		t.Fatal("the sweep announced the expiry of a lease the live key extended")
	}

	// Past the live key's expiry, the lease has expired, and a renew never resurrects it.
	waitForStoreTime(t, c, r.ExpiresAt.Add(time.Millisecond))
	if g, err := e.Get(ctx, alice); err != nil || g.Held || g.Epoch != a.Epoch {
		t.Fatalf("Get = %+v, %v; want the lease expired at epoch %d", g, err, a.Epoch)
	}
	var lost *lease.LostError
	if _, err := e.Renew(ctx, lease.RenewRequest{Key: alice, TabID: tabA.TabID, Epoch: a.Epoch, TTL: time.Second}); !errors.As(err, &lost) {
		t.Fatalf("a renew after the expiry: %v, want the lease lost", err)
	}
}

func TestALiveKeyGoesWithItsLease(t *testing.T) {
	e, c := liveEngine(t, Options{})
	ctx := t.Context()
	exists := func(l lease.Lease) bool { return c.Exists(ctx, liveKeyOf(e, l)).Val() == 1 }
	mark := func() string { return c.HGet(ctx, e.stateKey(alice), "keep_us").Val() }
	renew := func(l lease.Lease, hidden bool) (lease.Lease, error) {
		return e.Renew(ctx, lease.RenewRequest{Key: alice, TabID: l.Holder.TabID, Epoch: l.Epoch, TTL: time.Minute, Hidden: hidden})
	}
	a := mustAcquire(t, e, alice, tabA, lease.ModeTry)
	if exists(a) || mark() != "" {
		t.Fatal("a grant wrote a live key, or its mark: the first renew does")
	}
	if _, err := renew(a, false); err != nil {
		t.Fatal(err)
	}
	if !exists(a) || mark() != "live" {
		t.Fatal("the first renew wrote no live key, or no mark of it")
	}

	// A takeover: the old holder's key goes; its renew is lost.
	b, err := e.Acquire(ctx, lease.AcquireRequest{Key: alice, Holder: tabB, TTL: time.Minute, Mode: lease.ModeTakeover})
	if err != nil {
		t.Fatal(err)
	}
	if exists(a) {
		t.Fatal("the old holder's live key outlived the takeover")
	}
	var lost *lease.LostError
	if _, err := renew(a, false); !errors.As(err, &lost) {
		t.Fatalf("the old holder's renew: %v, want lost", err)
	}
	if _, err := renew(b, false); err != nil || !exists(b) {
		t.Fatalf("the new holder's first renew: %v, or no live key", err)
	}

	// A handoff request: the key goes, and the holder's renews are the function's, which tells of
	// the request.
	if _, err := e.Acquire(ctx, lease.AcquireRequest{Key: alice, Holder: tabA, TTL: time.Minute, Mode: lease.ModeHandoff}); !errors.Is(err, lease.ErrHandoffPending) {
		t.Fatalf("a handoff request: %v", err)
	}
	if exists(b) {
		t.Fatal("the live key outlived the handoff request")
	}
	if r, err := renew(b, false); err != nil || r.Handoff == nil || r.Handoff.Requester.TabID != tabA.TabID || exists(b) {
		t.Fatalf("a renew during the handoff = %+v, %v; want the request told, and no live key", r, err)
	}

	// A renew that changes the hidden flag is the function's, with its event, and writes the key
	// of its new name, which the next fast renew extends.
	d, err := e.Acquire(ctx, lease.AcquireRequest{Key: alice, Holder: tabA, TTL: time.Minute, Mode: lease.ModeTakeover})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := renew(d, false); err != nil || !exists(d) {
		t.Fatalf("the first renew: %v, or no live key", err)
	}
	w := mustWatch(t, e, alice, "")
	r, err := renew(d, true)
	if err != nil || !r.Holder.Hidden || exists(d) || !exists(r) {
		t.Fatalf("a hidden renew = %+v, %v; want the key of the hidden lease alone", r, err)
	}
	if ev := next(t, w); ev.Type != lease.EventUpdated || !ev.Holder.Hidden {
		t.Fatalf("event %+v, want the holder updated as hidden", ev)
	}
	n := calls(t, c, func() { r, err = renew(d, true) })
	if err != nil || !r.Holder.Hidden || n["getex"] != 1 || n["fcall"] != 0 {
		t.Fatalf("the next renew = %+v, %v, running %v; want the fast one", r, err, n)
	}

	// A release and a revoke end the lease and its key; the mark goes with the holder.
	if _, err := e.Release(ctx, lease.ReleaseRequest{Key: alice, TabID: tabA.TabID, Epoch: d.Epoch}); err != nil {
		t.Fatal(err)
	}
	if exists(r) {
		t.Fatal("the live key outlived the release")
	}
	f := mustAcquire(t, e, alice, tabB, lease.ModeTry)
	if _, err := renew(f, false); err != nil || !exists(f) {
		t.Fatalf("the first renew: %v, or no live key", err)
	}
	if _, err := e.Revoke(ctx, lease.RevokeRequest{Key: alice, Admin: "root", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	if exists(f) {
		t.Fatal("the live key outlived the revoke")
	}
	if m := mark(); m != "" {
		t.Fatalf("keep_us = %q after the revoke, want the mark gone with the holder", m)
	}
}

// TestFastRenewsKeepTheStateTheIdleRetentionPastTheLease: the state outlives the lease by the idle
// retention however long fast renews keep it: a renew past the live key's by_ms is followed by a
// check, which moves the state's expiry and the key's by_ms.
func TestFastRenewsKeepTheStateTheIdleRetentionPastTheLease(t *testing.T) {
	const idle = 3 * time.Second // an eighth of it, 375 ms, is keep's slack: the function's about that often
	e, c := liveEngine(t, Options{IdleRetention: idle})
	ctx := t.Context()
	a, err := e.Acquire(ctx, lease.AcquireRequest{Key: alice, Holder: tabA, TTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	until := a.GrantedAt.Add(2 * time.Second)
	renews := 0
	n := calls(t, c, func() {
		for {
			r, err := e.Renew(ctx, lease.RenewRequest{Key: alice, TabID: tabA.TabID, Epoch: a.Epoch, TTL: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			renews++
			kept := c.PExpireTime(ctx, e.stateKey(alice)).Val()
			if want := time.Duration(r.ExpiresAt.UnixMilli())*time.Millisecond + idle; kept < want {
				t.Fatalf("after renew %d the state expires at %v, before the lease's end %v and the idle retention", renews, kept, r.ExpiresAt)
			}
			if r.Now.After(until) {
				break
			}
			time.Sleep(20 * time.Millisecond) // a renew every 20 ms or so, for two seconds
		}
	})
	if fast, checks := n["getex"], n["fcall"]; fast != renews || checks < 2 || checks >= renews/2 {
		t.Fatalf("%d renews: %d fast, %d checks after them; want every one fast, a check after a few", renews, fast, checks)
	}
}
