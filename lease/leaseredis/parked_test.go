package leaseredis

import (
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tablease/tablease/lease"
)

// TestAFreeSessionIsParkedAndReadAsItsHashWas checks the rules of parked sessions (state.lua): a
// free session's state, parked, reads as its hash did; a free session in the hash layout (as
// older versions left it) works alike and is parked by its next change; a block keeps the hash
// while it is in force.
func TestAFreeSessionIsParkedAndReadAsItsHashWas(t *testing.T) {
	e, c, db := sharedEngine(t, Options{})
	ctx := t.Context()
	free := db.Prefix() + ":{alice}:free"
	stateKey := func(k lease.Key) string { return db.Prefix() + ":{alice}:lease:" + k.Session }
	same := func(what string, got, want lease.Lease) {
		t.Helper()
		if got.Held || got.Epoch != want.Epoch || !got.GrantedAt.Equal(want.GrantedAt) || !got.ExpiresAt.Equal(want.ExpiresAt) ||
			got.TTL != want.TTL || got.Transitions != want.Transitions {
			t.Errorf("%s = %+v, want free with the epoch, times, TTL and transitions of %+v", what, got, want)
		}
	}

	// A release parks the session; Get reads it as the release answered it.
	a := mustAcquire(t, e, alice, tabA, lease.ModeTry)
	r := mustReleaseLease(t, e, alice, tabA.TabID, a.Epoch)
	if n := c.Exists(ctx, stateKey(alice)).Val(); n != 0 || !c.HExists(ctx, free, alice.Session).Val() {
		t.Fatalf("after a release: the state hash exists (%d), or the session has no field in %s", n, free)
	}
	g, err := e.Get(ctx, alice)
	if err != nil {
		t.Fatal(err)
	}
	same("Get of a parked session", g, r.Lease)
	// The library keeps what it parked (PARKED in state.lua); one that did not park it, as after a
	// restart, reads the field.
	if err := c.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	g, err = e.Get(ctx, alice)
	if err != nil {
		t.Fatal(err)
	}
	same("Get of a parked session by a library that did not park it", g, r.Lease)

	// A free session in the hash layout reads the same, and its next change parks it.
	legacy := lease.Key{User: "alice", Session: "doc-legacy"}
	b := mustAcquire(t, e, legacy, tabB, lease.ModeTry)
	rb := mustReleaseLease(t, e, legacy, tabB.TabID, b.Epoch)
	parked := parkedState(t, c.HGet(ctx, free, legacy.Session).Val())
	at := mustInt(t, parked["at_ms"])
	delete(parked, "at_ms")
	fields := map[string]any{}
	for f, v := range parked {
		fields[f] = v
	}
	if err := c.HDel(ctx, free, legacy.Session).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.HSet(ctx, stateKey(legacy), fields).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.PExpireAt(ctx, stateKey(legacy), time.UnixMilli(at)).Err(); err != nil {
		t.Fatal(err)
	}
	g, err = e.Get(ctx, legacy)
	if err != nil {
		t.Fatal(err)
	}
	same("Get of a free session in the hash layout", g, rb.Lease)
	if c.Exists(ctx, stateKey(legacy)).Val() != 1 || c.HExists(ctx, free, legacy.Session).Val() {
		t.Fatal("a Get parked the session: only a change should")
	}
	// A release retried (a change: it keeps its answer for retries) answers as the first did.
	again := mustReleaseLease(t, e, legacy, tabB.TabID, b.Epoch)
	if !again.Released {
		t.Errorf("a retried release of a free session in the hash layout = %+v, want released", again)
	}
	if c.Exists(ctx, stateKey(legacy)).Val() != 0 {
		t.Fatal("the change left the hash of a free session: want it parked")
	}
	reparked := parkedState(t, c.HGet(ctx, free, legacy.Session).Val())
	delete(reparked, "at_ms")
	if !maps.Equal(reparked, parked) {
		t.Errorf("parked state after the change = %v, want the hash's %v", reparked, parked)
	}

	// A block is kept in the hash while it lasts; the grant after it ends is above the last epoch.
	blocked := lease.Key{User: "alice", Session: "doc-blocked"}
	d := mustAcquire(t, e, blocked, tabA, lease.ModeTry)
	if _, err := e.Revoke(ctx, lease.RevokeRequest{Key: blocked, Admin: "root", Reason: "r", Block: 300 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if c.Exists(ctx, stateKey(blocked)).Val() != 1 || c.HExists(ctx, free, blocked.Session).Val() {
		t.Fatal("a blocked session was parked: its block is in its hash")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		l, err := e.Acquire(ctx, lease.AcquireRequest{Key: blocked, Holder: tabB, Mode: lease.ModeTry})
		if err == nil {
			if l.Epoch <= d.Epoch+1 || l.Transitions != 3 {
				t.Errorf("grant after the block = %+v, want above the revoke's epoch %d, the third transition", l, d.Epoch+1)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the block did not end: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAnAdmittedSessionDeletesTheParkedStateThatExpired checks admit (admin.lua): a new session
// deletes the parked state of the user's sessions whose expiry passed, with their place in the
// user's known sessions, while the user's free hash lives on for a later session.
func TestAnAdmittedSessionDeletesTheParkedStateThatExpired(t *testing.T) {
	const idle = 400 * time.Millisecond
	e, c, db := sharedEngine(t, Options{IdleRetention: idle, SessionsPerUser: 5})
	ctx := t.Context()
	free, known := db.Prefix()+":{alice}:free", db.Prefix()+":{alice}:known"
	key := func(s string) lease.Key { return lease.Key{User: "alice", Session: s} }

	a := mustAcquire(t, e, key("doc-a"), tabA, lease.ModeTry)
	mustReleaseLease(t, e, key("doc-a"), tabA.TabID, a.Epoch)
	// A lease held for long keeps the user's keys, the free hash included, alive.
	if _, err := e.Acquire(ctx, lease.AcquireRequest{Key: key("doc-b"), Holder: tabB, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	expires := time.UnixMilli(mustInt(t, parkedState(t, c.HGet(ctx, free, "doc-a").Val())["at_ms"]))
	for time.Now().Before(expires.Add(50 * time.Millisecond)) {
		time.Sleep(20 * time.Millisecond)
	}
	if g, err := e.Get(ctx, key("doc-a")); err != nil || g.Epoch != 0 {
		t.Fatalf("Get past the parked state's expiry = %+v, %v; want a session the store forgot", g, err)
	}
	if !c.HExists(ctx, free, "doc-a").Val() {
		t.Fatal("the expired field is gone before any admit: the test shows nothing")
	}
	mustAcquire(t, e, key("doc-c"), tabA, lease.ModeTry)
	if c.HExists(ctx, free, "doc-a").Val() {
		t.Error("a new session's admit left the parked state that expired")
	}
	if _, err := c.ZScore(ctx, known, "doc-a").Result(); err == nil {
		t.Error("a new session's admit left the expired session in the known set")
	}
	if n := c.ZCard(ctx, known).Val(); n != 2 {
		t.Errorf("known sessions after the admit: %d, want 2 (doc-b and doc-c): %v", n, c.ZRange(ctx, known, 0, -1).Val())
	}
}

// TestAParkedSessionStaysWithinACompactHashWhateverItsTabIDs checks the bound of pack_free
// (state.lua): a session released by a tab with a long id (up to 128 characters), or after a lease
// held for a day and a thousand grants, is parked in at most 64 bytes,
// so that the user's free hash stays a listpack; the tab of its last release is kept as a mark
// that still tells a retried release from another tab's, and a hash written before the marks, with
// the whole id, answers a retried release alike.
func TestAParkedSessionStaysWithinACompactHashWhateverItsTabIDs(t *testing.T) {
	e, c, db := sharedEngine(t, Options{})
	ctx := t.Context()
	free := db.Prefix() + ":{alice}:free"
	long := lease.Holder{TabID: strings.Repeat("t-0b6f3c2e-8d1a-4f7b-9c3e-2a5d7e9f1b4c|", 4)[:lease.MaxIDLen]}
	other := lease.Holder{TabID: long.TabID[:lease.MaxIDLen-1] + "x"} // the same id but its last character
	key := lease.Key{User: "alice", Session: "doc-long"}
	fits := func(what string) string {
		t.Helper()
		v := c.HGet(ctx, free, key.Session).Val()
		if len(v) == 0 || len(v) > 64 {
			t.Errorf("%s: parked state %q has %d bytes, want 1 to 64", what, v, len(v))
		}
		if enc := c.ObjectEncoding(ctx, free).Val(); enc != "listpack" {
			t.Errorf("%s: the free hash is a %s, want a listpack", what, enc)
		}
		return v
	}

	a := mustAcquire(t, e, key, long, lease.ModeTry)
	mustReleaseLease(t, e, key, long.TabID, a.Epoch)
	mark := parkedState(t, fits("released by a 128-character tab"))["rel_tab"]
	if len(mark) != 9 || mark[0] != '#' {
		t.Errorf("rel_tab of a 128-character tab = %q, want # and 8 hex digits", mark)
	}
	if r, err := e.Release(ctx, lease.ReleaseRequest{Key: key, TabID: other.TabID, Epoch: a.Epoch}); err != nil || r.Released {
		t.Errorf("release by another tab with the epoch = %+v, %v; want kept: the mark tells the tabs apart", r, err)
	}
	mustReleaseLease(t, e, key, long.TabID, a.Epoch) // retried: released, as the first

	// A lease held for a day that ended a minute ago, its session granted a thousand times, in the
	// hash layout with the whole id as versions before the marks wrote it: a retried release
	// answers as the first, and parks it within the bound.
	const day = int64(24 * time.Hour / time.Microsecond)
	epoch := storeMicros(t, c) - day - int64(time.Minute/time.Microsecond)
	stateKey := db.Prefix() + ":{alice}:lease:" + key.Session
	if err := c.HDel(ctx, free, key.Session).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.HSet(ctx, stateKey, map[string]any{
		"epoch": epoch, "granted_us": epoch, "expires_us": epoch + day,
		"ttl_ms": 3600000, "transitions": 1000, "rel_tab": long.TabID, "rel_epoch": epoch, "ended_epoch": epoch,
		"event_id": strconv.FormatInt((epoch+day)/1000, 10) + "-12",
	}).Err(); err != nil {
		t.Fatal(err)
	}
	if r := mustReleaseLease(t, e, key, long.TabID, epoch); r.Lease.Transitions != 1000 {
		t.Errorf("retried release, the whole id in rel_tab = %+v, want a thousand transitions", r)
	}
	if c.Exists(ctx, stateKey).Val() != 0 {
		t.Fatal("the retried release left the hash: want it parked")
	}
	p := parkedState(t, fits("a day-long lease, a thousand grants"))
	if p["transitions"] != "1000" || p["epoch"] != strconv.FormatInt(epoch, 10) || p["rel_tab"] != mark {
		t.Errorf("parked state %v, want the hash's epoch %d, a thousand transitions and the mark %q", p, epoch, mark)
	}
	mustReleaseLease(t, e, key, long.TabID, epoch) // retried once more, from the parked mark
}
