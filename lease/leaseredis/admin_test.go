package leaseredis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tablease/tablease/internal/redistest"
	"github.com/tablease/tablease/lease"
)

// adminEngine returns an engine with opts (the namespace's prefix, short TTLs allowed unless opts
// has limits) on a namespace of the shared Redis, and a plain client of the same database.
func adminEngine(t *testing.T, opts Options) (*Engine, *redis.Client, *redistest.DB) {
	t.Helper()
	if opts.Limits == (lease.Limits{}) {
		opts.Limits = lease.Limits{Min: 20 * time.Millisecond, Default: time.Second, Max: time.Minute, HiddenMax: time.Minute}
	}
	return sharedEngine(t, opts)
}

// waitStoreMicros polls the store's clock until it is after us.
func waitStoreMicros(t *testing.T, c *redis.Client, us int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for storeMicros(t, c) <= us {
		if time.Now().After(deadline) {
			t.Fatalf("the store's clock did not pass %d µs", us)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// allAudit reads every page of q.
func allAudit(t *testing.T, e *Engine, q lease.AuditQuery) []lease.AuditRecord {
	t.Helper()
	var all []lease.AuditRecord
	for {
		p, err := e.Audit(t.Context(), q)
		if err != nil {
			t.Fatalf("Audit(%+v): %v", q, err)
		}
		all = append(all, p.Records...)
		if p.Next == "" {
			return all
		}
		q.Cursor = p.Next
	}
}

func actions(recs []lease.AuditRecord) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.Key.User + "/" + r.Key.Session + " " + string(r.Action)
	}
	return out
}

func TestTheIndexOfAUserHoldsItsHeldLeasesUnderItsHashTagAndTheUsersIndexHasNone(t *testing.T) {
	e, c, db := adminEngine(t, Options{})
	ctx := t.Context()
	p := db.Prefix()
	index := func(user string) []string {
		t.Helper()
		z, err := c.ZRangeWithScores(ctx, p+":{"+user+"}:sessions", 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		out := make([]string, len(z))
		for i, m := range z {
			if m.Score != 0 {
				t.Errorf("index of %s: %v has score %v, want 0 (ZRANGEBYLEX needs equal scores)", user, m.Member, m.Score)
			}
			out[i] = m.Member.(string)
		}
		return out
	}
	key := func(user, sid string) lease.Key { return lease.Key{User: user, Session: sid} }

	a1 := mustAcquire(t, e, key("alice", "doc-1"), tabA, lease.ModeTry)
	mustAcquire(t, e, key("alice", "doc-2"), tabA, lease.ModeTry)
	mustAcquire(t, e, key("bob", "doc-1"), tabA, lease.ModeTry)
	mustAcquire(t, e, key("alice", "doc-2"), tabB, lease.ModeTakeover) // still held: listed once
	if got := index("alice"); !slices.Equal(got, []string{"doc-1", "doc-2"}) {
		t.Errorf("alice's index after three grants = %q, want doc-1 and doc-2", got)
	}
	for _, k := range []string{p + ":{alice}:sessions", p + ":users"} {
		if typ := c.Type(ctx, k).Val(); typ != "zset" {
			t.Errorf("TYPE %s = %s, want zset", k, typ)
		}
		if ttl := c.TTL(ctx, k).Val(); ttl != -1 {
			t.Errorf("TTL %s = %v, want none", k, ttl)
		}
	}
	if users := c.ZRange(ctx, p+":users", 0, -1).Val(); !slices.Equal(users, []string{"alice", "bob"}) {
		t.Errorf("users index = %q, want alice and bob", users)
	}
	if strings.Contains(e.usersKey(), "{") {
		t.Errorf("the users index %q has a hash tag: it is no user's", e.usersKey())
	}

	// A release and a revoke take their session out, in the same script.
	if r, err := e.Release(ctx, lease.ReleaseRequest{Key: key("alice", "doc-1"), TabID: "tab-a", Epoch: a1.Epoch}); err != nil || !r.Released {
		t.Fatalf("Release = %+v, %v", r, err)
	}
	if _, err := e.Revoke(ctx, lease.RevokeRequest{Key: key("alice", "doc-2"), Admin: "root", Reason: "r"}); err != nil {
		t.Fatal(err)
	}
	if got := index("alice"); len(got) != 0 {
		t.Errorf("alice's index after a release and a revoke = %q, want empty", got)
	}
	if n := c.Exists(ctx, p+":{alice}:sessions").Val(); n != 0 {
		t.Error("alice's empty index still exists")
	}

	// A lease that expires unannounced stays in the index, a listing that finds it free included
	// (which announces nothing), until the call that announces the expiry records it and takes
	// the session out; the engine's sweep is such a call (TestTheSweepAnnouncesExpiriesNobodyElseAnnounces).
	short, err := e.Acquire(ctx, lease.AcquireRequest{Key: key("alice", "doc-3"), Holder: tabA, TTL: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	waitStoreMicros(t, c, short.ExpiresAt.UnixMicro())
	if got := index("alice"); !slices.Equal(got, []string{"doc-3"}) {
		t.Errorf("alice's index after an expiry nobody announced = %q, want doc-3 still", got)
	}
	page, err := e.ListLeases(ctx, lease.ListQuery{User: "alice"})
	if err != nil || len(page.Leases) != 0 {
		t.Fatalf("ListLeases of alice after the expiry = %+v, %v; want none", page, err)
	}
	if got := index("alice"); !slices.Equal(got, []string{"doc-3"}) {
		t.Errorf("alice's index after the listing = %q, want doc-3 still: its expiry is not announced", got)
	}
	if recs := allAudit(t, e, lease.AuditQuery{User: "alice", Session: "doc-3"}); len(recs) != 1 || recs[0].Action != lease.AuditGrant {
		t.Errorf("the audit of the expired lease after the listing = %q, want the grant alone: a listing announces nothing", actions(recs))
	}
	if _, err := e.Get(ctx, key("alice", "doc-3")); err != nil {
		t.Fatal(err)
	}
	if recs := allAudit(t, e, lease.AuditQuery{User: "alice", Session: "doc-3"}); len(recs) != 2 || recs[0].Action != lease.AuditExpire ||
		!recs[0].At.Equal(short.ExpiresAt) {
		t.Errorf("the audit of the expired lease after a Get = %+v, want its expiry at %v, then the grant", recs, short.ExpiresAt)
	}
	if got := index("alice"); len(got) != 0 {
		t.Errorf("alice's index after the expiry was announced = %q, want empty", got)
	}

	// A revoke adds its user to the users index before it runs, for its audit records.
	if _, err := e.Revoke(ctx, lease.RevokeRequest{Key: key("carol", "never"), Admin: "root", Reason: "r", Block: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if users := c.ZRange(ctx, p+":users", 0, -1).Val(); !slices.Equal(users, []string{"alice", "bob", "carol"}) {
		t.Errorf("users index after a block = %q, want carol added", users)
	}
	if n := c.Exists(ctx, p+":{carol}:sessions").Val(); n != 0 {
		t.Error("a block of a free session indexed it as held")
	}
}

func TestAnAcquireWhoseUserCannotBeIndexedGrantsNothing(t *testing.T) {
	e, c, db := adminEngine(t, Options{})
	ctx := t.Context()
	// The users index is written by its own command before the script: when that fails, no lease is
	// granted, so that no held lease is ever missing from the listing.
	if err := c.Set(ctx, db.Prefix()+":users", "not a sorted set", 0).Err(); err != nil {
		t.Fatal(err)
	}
	_, err := e.Acquire(ctx, lease.AcquireRequest{Key: alice, Holder: tabA})
	wantUnavailable(t, "Acquire with a broken users index", "acquire", err)
	if g, err := e.Get(ctx, alice); err != nil || g.Held || g.Epoch != 0 {
		t.Fatalf("Get after the refused acquire = %+v, %v; want nothing granted", g, err)
	}
	_, err = e.Revoke(ctx, lease.RevokeRequest{Key: alice, Admin: "root", Reason: "r", Block: time.Hour})
	wantUnavailable(t, "Revoke with a broken users index", "revoke", err)
	_, err = e.ListLeases(ctx, lease.ListQuery{})
	wantUnavailable(t, "ListLeases with a broken users index", "list leases", err)
	_, err = e.Audit(ctx, lease.AuditQuery{})
	wantUnavailable(t, "Audit with a broken users index", "audit", err)
}

func TestTheAuditLogIsOneStreamPerUserTrimmedToAboutItsLengthAndExpiringWithItsRetention(t *testing.T) {
	const maxRecords, retention = 10, time.Hour
	e, c, db := adminEngine(t, Options{AuditMaxRecords: maxRecords, AuditRetention: retention})
	ctx := t.Context()
	log := db.Prefix() + ":{alice}:audit"
	for i := range 300 {
		tab := tabA
		if i%2 == 1 {
			tab = tabB
		}
		mustAcquire(t, e, alice, tab, lease.ModeTakeover)
	}
	if typ := c.Type(ctx, log).Val(); typ != "stream" {
		t.Fatalf("TYPE %s = %s, want stream", log, typ)
	}
	n := c.XLen(ctx, log).Val()
	if n < maxRecords || n > maxRecords+100 {
		t.Errorf("the audit log holds %d records after 300, want about %d (MAXLEN ~ %d)", n, maxRecords, maxRecords)
	}
	if ttl := c.PTTL(ctx, log).Val(); ttl <= retention-time.Minute || ttl > retention+retention/8 {
		t.Errorf("PTTL %s = %v, want the retention %v and up to an eighth more", log, ttl, retention)
	}
	recs := allAudit(t, e, lease.AuditQuery{User: "alice", Limit: lease.MaxPageLimit})
	if int64(len(recs)) != n || recs[0].Action != lease.AuditTakeover || recs[0].Previous == nil {
		t.Errorf("Audit answered %d records (newest %+v), want the %d kept, newest first", len(recs), recs[0], n)
	}
	// The stream entry is the record's fields, with its session.
	top := c.XRevRangeN(ctx, log, "+", "-", 1).Val()
	if len(top) != 1 || top[0].Values["s"] != "doc-1" || top[0].Values["a"] != "takeover" || top[0].Values["tab"] != "tab-b" ||
		top[0].Values["ptab"] != "tab-a" || top[0].Values["e"] == nil || top[0].Values["at"] == nil || top[0].Values["pep"] == nil {
		t.Errorf("the newest entry = %+v, want the takeover with its fields", top)
	}
	if want := top[0].ID + "-" + "YWxpY2U"; recs[0].ID != want {
		t.Errorf("the newest record's ID = %q, want its stream id and its user %q", recs[0].ID, want)
	}
}

// TestTheAuditLogsExpiryMovesOnlyWhenItWouldEndWithinTheRetention: an append sets the log to
// expire the retention and an eighth after it only when the log would otherwise expire within the
// retention; other appends leave the expiry, which still covers them, alone (admin.lua).
func TestTheAuditLogsExpiryMovesOnlyWhenItWouldEndWithinTheRetention(t *testing.T) {
	// An eighth of it, the slack, is 2 s: the second record comes well within it.
	const retention = 16 * time.Second
	e, c, db := adminEngine(t, Options{AuditRetention: retention})
	ctx := t.Context()
	log := db.Prefix() + ":{alice}:audit"
	expiry := func() int64 { return c.PExpireTime(ctx, log).Val().Milliseconds() }

	first := mustAcquire(t, e, alice, tabA, lease.ModeTry)
	set := expiry()
	if want := first.Now.Add(retention + retention/8).UnixMilli(); set != want {
		t.Fatalf("the first record set the log to expire at %d, want %d: the retention and an eighth after it", set, want)
	}
	second := mustAcquire(t, e, alice, tabB, lease.ModeTakeover)
	if got := expiry(); got != set {
		t.Fatalf("a record within the slack moved the expiry from %d to %d", set, got)
	}
	if set < second.Now.Add(retention).UnixMilli() {
		t.Fatalf("the expiry %d does not cover the second record's retention", set)
	}
	// Once the slack has passed, the log would expire within the retention of the next record.
	waitStoreMicros(t, c, first.Now.Add(retention/8+time.Millisecond).UnixMicro())
	third := mustAcquire(t, e, alice, tabA, lease.ModeTakeover)
	if got, want := expiry(), third.Now.Add(retention+retention/8).UnixMilli(); got != want {
		t.Fatalf("a record the expiry no longer covered set it to %d, want %d", got, want)
	}
	// A log deleted meanwhile (FLUSHALL, eviction) is made again with its expiry, though the
	// library knew the old one late enough (flush_audit appends with NOMKSTREAM then).
	if err := c.Del(ctx, log).Err(); err != nil {
		t.Fatal(err)
	}
	fourth := mustAcquire(t, e, alice, tabB, lease.ModeTakeover)
	if got, want := expiry(), fourth.Now.Add(retention+retention/8).UnixMilli(); got != want {
		t.Fatalf("the record after the log was deleted set it to expire at %d, want %d", got, want)
	}
	if n := c.XLen(ctx, log).Val(); n != 1 {
		t.Fatalf("the log made again holds %d records, want the takeover's", n)
	}
}

func TestAuditRecordsPastTheRetentionAreNeverReadAndTheLogExpires(t *testing.T) {
	// Long enough that the takeover, half a retention after the grant, is still within its own
	// retention when the grant has passed its: only a stall of a second would break that.
	const retention = 2 * time.Second
	e, c, db := adminEngine(t, Options{AuditRetention: retention})
	ctx := t.Context()
	log := db.Prefix() + ":{alice}:audit"
	doc2 := lease.Key{User: "alice", Session: "doc-2"}

	old := mustAcquire(t, e, alice, tabA, lease.ModeTry)
	waitStoreMicros(t, c, old.GrantedAt.Add(retention/2).UnixMicro())
	mid := mustAcquire(t, e, alice, tabB, lease.ModeTakeover) // keeps the log alive past the grant's retention
	// Past the grant's retention, another change appends a record: the grant is still in the
	// stream (a ~ trim drops whole stream nodes only), but no page answers it.
	waitStoreMicros(t, c, old.GrantedAt.Add(retention+2*time.Millisecond).UnixMicro())
	fresh := mustAcquire(t, e, doc2, tabA, lease.ModeTry)
	if n := c.XLen(ctx, log).Val(); n != 3 {
		t.Fatalf("XLEN %s = %d, want the 3 records still stored", log, n)
	}
	want := []string{"alice/doc-2 grant", "alice/doc-1 takeover"}
	if mid.GrantedAt.Add(retention).Before(fresh.Now) {
		t.Fatalf("the store clock moved %v between the takeover and the next grant, past the takeover's retention: the test cannot tell the records apart", fresh.Now.Sub(mid.GrantedAt))
	}
	if recs := allAudit(t, e, lease.AuditQuery{User: "alice"}); !slices.Equal(actions(recs), want) {
		t.Errorf("Audit past the retention of the grant = %q, want %q", actions(recs), want)
	}
	if recs := allAudit(t, e, lease.AuditQuery{}); !slices.Equal(actions(recs), want) {
		t.Errorf("Audit of every user past the retention of the grant = %q, want %q", actions(recs), want)
	}
	// A page after the takeover skips the grant, dropped meanwhile.
	p, err := e.Audit(ctx, lease.AuditQuery{User: "alice", Session: "doc-1", Limit: 1})
	if err != nil || len(p.Records) != 1 || p.Records[0].Action != lease.AuditTakeover || p.Next != "" {
		t.Fatalf("doc-1's records a page of one = %+v, %v; want the takeover alone, and no next page", p, err)
	}
	rest, err := e.Audit(ctx, lease.AuditQuery{User: "alice", Cursor: p.Records[0].ID})
	if err != nil || len(rest.Records) != 0 || rest.Next != "" {
		t.Errorf("the page after the takeover = %+v, %v; want an empty last page", rest, err)
	}

	// The log expires with the retention of its last record; the state outlives it.
	deadline := time.Now().Add(10 * time.Second)
	for c.Exists(ctx, log).Val() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not expire (PTTL %v)", log, c.PTTL(ctx, log).Val())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if recs := allAudit(t, e, lease.AuditQuery{User: "alice"}); len(recs) != 0 {
		t.Errorf("Audit after the log expired = %q, want nothing", actions(recs))
	}
	if g, err := e.Get(ctx, alice); err != nil || !g.HeldBy("tab-b", mid.Epoch) {
		t.Errorf("Get after the log expired = %+v, %v; want the lease unchanged", g, err)
	}
}

func TestRecordsOfOneMillisecondComeByUserAndEveryPageCoversThemOnce(t *testing.T) {
	e, c, db := adminEngine(t, Options{})
	ctx := t.Context()
	// Records of three users with the same stream id, as three changes in one millisecond make:
	// written here by hand, since the store clock cannot be held still.
	ms := storeMicros(t, c)/1000 - 5
	users := []string{"alice", "alice-b", "bob"}
	for _, u := range users {
		if err := c.ZAdd(ctx, db.Prefix()+":users", redis.Z{Member: u}).Err(); err != nil {
			t.Fatal(err)
		}
		for seq := range 2 {
			err := c.XAdd(ctx, &redis.XAddArgs{Stream: db.Prefix() + ":{" + u + "}:audit", ID: fmt.Sprintf("%d-%d", ms, seq),
				Values: []any{"s", "doc-1", "a", "grant", "e", strconv.Itoa(seq + 1), "at", strconv.FormatInt(ms*1000, 10), "tab", "tab-" + u}}).Err()
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	whole := allAudit(t, e, lease.AuditQuery{Limit: lease.MaxPageLimit})
	var got []string
	for _, r := range whole {
		got = append(got, fmt.Sprintf("%s %d", r.Key.User, r.Epoch))
	}
	want := []string{"bob 2", "alice-b 2", "alice 2", "bob 1", "alice-b 1", "alice 1"}
	if !slices.Equal(got, want) {
		t.Fatalf("Audit of every user = %q, want by stream id, then by user, both descending: %q", got, want)
	}
	for _, limit := range []int{1, 2, 4} {
		paged := allAudit(t, e, lease.AuditQuery{Limit: limit})
		if !slices.EqualFunc(paged, whole, func(a, b lease.AuditRecord) bool { return a.ID == b.ID }) {
			t.Errorf("Audit of every user %d at a time = %q, want %q", limit, actions(paged), actions(whole))
		}
	}
	// Each ID names its record: the cursor of one user's list works for every user's.
	seen := map[string]bool{}
	for _, r := range whole {
		if seen[r.ID] {
			t.Errorf("ID %q is not unique", r.ID)
		}
		seen[r.ID] = true
		p, err := parseAuditID(r.ID)
		if err != nil || p.user != r.Key.User || p.String() != r.ID {
			t.Errorf("parseAuditID(%q) = %+v, %v", r.ID, p, err)
		}
	}
	p, err := e.Audit(ctx, lease.AuditQuery{User: "alice-b", Cursor: whole[1].ID})
	if err != nil || len(p.Records) != 1 || p.Records[0].ID != whole[4].ID {
		t.Errorf("alice-b's records after its newest = %+v, %v; want its older one", p.Records, err)
	}
}

func TestAReadAcrossUsersWaitsForTheStoreClockToPassItsHorizon(t *testing.T) {
	e, c, db := adminEngine(t, Options{})
	ctx := t.Context()
	mustAcquire(t, e, alice, tabA, lease.ModeTry)
	log := []string{db.Prefix() + ":{alice}:audit", db.Prefix() + ":{alice}:audit:admin"}
	nowMS := storeMicros(t, c) / 1000
	run := func(horizon int64) []any {
		t.Helper()
		v, err := auditScript.Run(ctx, c, log, "+", "", 10, 10, time.Hour.Milliseconds(), strconv.FormatInt(horizon, 10)).Slice()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v := run(nowMS + time.Minute.Milliseconds()); len(v) != 2 || v[0] != "WAIT" {
		t.Errorf("audit.lua before its horizon = %v, want WAIT and nothing read", v)
	}
	if v := run(nowMS - 1); len(v) != 5 || v[0] != "OK" {
		t.Errorf("audit.lua past its horizon = %v, want the grant", v)
	}
	// A node whose clock never passes the horizon is store trouble, reported within OpTimeout.
	e.opTimeout = 50 * time.Millisecond
	r := &auditReader{e: e, ctx: ctx, count: 10, horizon: nowMS + time.Minute.Milliseconds()}
	start := time.Now()
	err := r.read(&auditSource{user: "alice", from: "+", more: true})
	wantUnavailable(t, "a read before a horizon that does not come", "audit", err)
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the read gave up after %v, want about the OpTimeout", d)
	}
}

func TestAuditCursorsThatNoPageMadeAreInvalid(t *testing.T) {
	e, _, _ := adminEngine(t, Options{})
	for _, cursor := range []string{
		"1-0", "1-0-", "0-0-YWxpY2U", "01-0-YWxpY2U", "1-x-YWxpY2U", "1-0-YWxpY2U=", "1-0-YWxpY2V", "1-0-e2F9", "1-0-Lg",
		"+", "-", "(1-0-YWxpY2U",
	} {
		_, err := e.Audit(t.Context(), lease.AuditQuery{Cursor: cursor})
		if !errors.Is(err, lease.ErrInvalid) {
			t.Errorf("Audit with cursor %q = %v, want lease.ErrInvalid", cursor, err)
		}
	}
	if p, err := parseAuditID("1764680400123-7-YWxpY2U"); err != nil || p.user != "alice" || p.id != (lease.EventID{Millis: 1764680400123, Seq: 7}) {
		t.Errorf("parseAuditID of a good ID = %+v, %v", p, err)
	}
}

// TestARevokeKeepsItsAnswerForTheRetryWindow: a revoke with a request id keeps its answer in a key
// of its own, named by session, admin and request id, that expires with the retry window; the
// state hash is kept as long (keep_us). Once the key is gone, the same request id is a new revoke.
func TestARevokeKeepsItsAnswerForTheRetryWindow(t *testing.T) {
	e, c, db := adminEngine(t, Options{})
	ctx := t.Context()
	key := db.Prefix() + ":{alice}:lease:doc-1"
	answerKey := db.Prefix() + ":{alice}:revoke:doc-1/root/req-1"
	mustAcquire(t, e, alice, tabA, lease.ModeTry)
	req := lease.RevokeRequest{Key: alice, Admin: "root", Reason: "r", Block: time.Hour, RequestID: "req-1"}
	r, err := e.Revoke(ctx, req)
	if err != nil || !r.Revoked {
		t.Fatalf("Revoke = %+v, %v", r, err)
	}
	h := c.HGetAll(ctx, key).Val()
	g, err := e.Get(ctx, alice)
	if err != nil {
		t.Fatal(err)
	}
	at := g.ExpiresAt.UnixMicro() // the time of the revoke
	for f, v := range map[string]string{
		"block_until_us": strconv.FormatInt(at+time.Hour.Microseconds(), 10),
		"keep_us":        strconv.FormatInt(at+lease.RevokeRetryWindow.Microseconds(), 10),
		"ended_epoch":    strconv.FormatInt(r.Epoch, 10),
	} {
		if h[f] != v {
			t.Errorf("field %s = %q, want %q (hash %v)", f, h[f], v, h)
		}
	}
	if _, ok := h["tab"]; ok {
		t.Errorf("the revoked lease keeps its holder: %v", h)
	}
	if ttl := c.PTTL(ctx, answerKey).Val(); ttl <= lease.RevokeRetryWindow-time.Minute || ttl > lease.RevokeRetryWindow {
		t.Errorf("the answer's key %s lives %v, want the retry window %v", answerKey, ttl, lease.RevokeRetryWindow)
	}

	// Within the window a retry answers the same; once the window passed (here: the answer's key
	// deleted, as its expiry would), the same request id is a new revoke.
	if again, err := e.Revoke(ctx, req); err != nil || again.Epoch != r.Epoch || !again.Revoked {
		t.Fatalf("the retry = %+v, %v; want %+v", again, err, r)
	}
	if err := c.Del(ctx, answerKey).Err(); err != nil {
		t.Fatal(err)
	}
	late, err := e.Revoke(ctx, req)
	if err != nil || late.Revoked || late.BlockedUntil.Before(r.BlockedUntil) {
		t.Fatalf("the retry after the window = %+v, %v; want a new revoke of the free lease, blocking anew", late, err)
	}
	if recs := allAudit(t, e, lease.AuditQuery{User: "alice"}); !slices.Equal(actions(recs), []string{
		"alice/doc-1 block", "alice/doc-1 block", "alice/doc-1 revoke", "alice/doc-1 grant",
	}) {
		t.Errorf("the audit log = %q, want the grant, the revoke and its block, and the late retry's block", actions(recs))
	}
}

// TestARevokedSessionIsKeptAsLongAsItsRetryWindow: the state of a session revoked with a request
// id (and no block) expires when the revoke's retry window ends (and up to an eighth of the idle
// retention later, keep's slack), not the retention after it: the window and the retention that
// follows the revoke, a change, run side by side.
func TestARevokedSessionIsKeptAsLongAsItsRetryWindow(t *testing.T) {
	e, c, db := adminEngine(t, Options{})
	ctx := t.Context()
	key := db.Prefix() + ":{alice}:lease:doc-1"
	mustAcquire(t, e, alice, tabA, lease.ModeTry)
	if r, err := e.Revoke(ctx, lease.RevokeRequest{Key: alice, Admin: "root", Reason: "r", RequestID: "req-1"}); err != nil || !r.Revoked {
		t.Fatalf("Revoke = %+v, %v", r, err)
	}
	g, err := e.Get(ctx, alice)
	if err != nil {
		t.Fatal(err)
	}
	at := g.ExpiresAt // the time of the revoke
	exp := c.PExpireTime(ctx, key).Val()
	end := at.Add(lease.RevokeRetryWindow)
	if got := time.UnixMilli(exp.Milliseconds()); got.Before(end.Add(-time.Millisecond)) || got.After(end.Add(lease.DefaultIdleRetention/8+time.Millisecond)) {
		t.Errorf("the revoked session's state expires %v after the revoke, want the retry window, %v (and at most an eighth of the retention more)",
			got.Sub(at).Round(time.Second), lease.RevokeRetryWindow)
	}
}

func TestAdminCallsAfterCloseAreUnavailable(t *testing.T) {
	e, _, _ := adminEngine(t, Options{})
	_ = e.Close()
	ctx := context.Background()
	_, err := e.Revoke(ctx, lease.RevokeRequest{Key: alice, Admin: "root", Reason: "r"})
	wantUnavailable(t, "Revoke after Close", "revoke", err)
	_, err = e.ListLeases(ctx, lease.ListQuery{})
	wantUnavailable(t, "ListLeases after Close", "list leases", err)
	_, err = e.Audit(ctx, lease.AuditQuery{User: "alice"})
	wantUnavailable(t, "Audit after Close", "audit", err)
}

func TestAdminScriptsDeclareTheirKeysAndArguments(t *testing.T) {
	for name, src := range map[string]string{"leases.lua": leasesLua, "audit.lua": auditLua} {
		header, body, _ := strings.Cut(src, "\nlocal ")
		if !strings.HasPrefix(header, "-- "+name+": ") {
			t.Errorf("%s does not start with a header naming it: %q", name, firstLine(src))
		}
		for i := 1; i <= 9; i++ {
			arg := "ARGV[" + strconv.Itoa(i) + "]"
			used := strings.Contains(body, arg) || strings.Contains(body, "arg_int("+strconv.Itoa(i)+",")
			if named := strings.Contains(header, "-- "+arg); used != named {
				t.Errorf("%s: %s is used without a header line, or named and unused", name, arg)
			}
		}
		if !strings.Contains(header, "-- KEYS[1]") || strings.Contains(body, "tostring") {
			t.Errorf("%s does not name KEYS[1], or uses tostring", name)
		}
	}
	if !strings.Contains(leasesLua, "-- KEYS[2..n]") {
		t.Error("leases.lua does not name KEYS[2..n]")
	}
	if !strings.Contains(auditLua, "-- KEYS[2]") || strings.Contains(auditLua, "KEYS[3]") {
		t.Error("audit.lua does not name KEYS[2], or uses a key it does not declare")
	}
}

func TestAListingPrunesTheUsersWithNoKeyLeft(t *testing.T) {
	const retention = time.Second
	e, c, db := sharedEngine(t, Options{IdleRetention: retention, AuditRetention: retention})
	ctx := t.Context()
	users := db.Prefix() + ":users"
	bob := lease.Key{User: "bob", Session: "doc-1"}

	a := mustAcquire(t, e, alice, tabA, lease.ModeTry)
	mustAcquire(t, e, bob, tabA, lease.ModeTry)
	if _, err := e.Release(ctx, lease.ReleaseRequest{Key: alice, TabID: "tab-a", Epoch: a.Epoch}); err != nil {
		t.Fatal(err)
	}
	// A listing while alice's state and audit log are kept prunes nobody.
	if _, err := e.ListLeases(ctx, lease.ListQuery{}); err != nil {
		t.Fatal(err)
	}
	if got := c.ZRange(ctx, users, 0, -1).Val(); !slices.Equal(got, []string{"alice", "bob"}) {
		t.Fatalf("users index %q after a listing, want both users", got)
	}
	// Once alice's keys are gone (the state after the idle retention, the audit log after its
	// retention), a listing prunes her; bob, who holds a lease, stays.
	deadline := time.Now().Add(retention + 10*time.Second)
	for c.Exists(ctx, db.Prefix()+":{alice}:sessions", db.Prefix()+":{alice}:audit", db.Prefix()+":{alice}:known").Val() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("alice's keys outlived their retention")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := e.ListLeases(ctx, lease.ListQuery{}); err != nil {
		t.Fatal(err)
	}
	if got := c.ZRange(ctx, users, 0, -1).Val(); !slices.Equal(got, []string{"bob"}) {
		t.Fatalf("users index %q after a listing, want alice pruned and bob kept", got)
	}
	// Her next acquire puts her back, and her lease is listed.
	mustAcquire(t, e, alice, tabB, lease.ModeTry)
	p, err := e.ListLeases(ctx, lease.ListQuery{})
	if err != nil || len(p.Leases) != 2 || p.Leases[0].Key != alice {
		t.Fatalf("ListLeases after alice acquired again = %+v, %v; want alice's lease and bob's", p.Leases, err)
	}
}

func TestAUsersOwnActionsNeverPushAnAdminsRecordsOutOfTheAuditLog(t *testing.T) {
	const maxRecords = 10
	e, c, db := adminEngine(t, Options{AuditMaxRecords: maxRecords})
	ctx := t.Context()
	bob := lease.Key{User: "bob", Session: "doc-1"}
	mustAcquire(t, e, alice, tabA, lease.ModeTry)
	mustAcquire(t, e, bob, tabA, lease.ModeTry)
	rv, err := e.Revoke(ctx, lease.RevokeRequest{Key: alice, Admin: "root", Reason: "why", Block: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	waitStoreMicros(t, c, rv.BlockedUntil.UnixMicro())
	for i := range 300 {
		tab := tabA
		if i%2 == 1 {
			tab = tabB
		}
		mustAcquire(t, e, alice, tab, lease.ModeTakeover)
	}
	if n := c.XLen(ctx, db.Prefix()+":{alice}:audit").Val(); n > maxRecords+100 {
		t.Fatalf("the user's log holds %d records, want about %d", n, maxRecords)
	}
	for _, q := range []lease.AuditQuery{{User: "alice"}, {}} {
		recs := allAudit(t, e, q)
		var admin []lease.AuditAction
		for _, r := range recs {
			if r.Admin != "" {
				admin = append(admin, r.Action)
			}
		}
		if !slices.Equal(admin, []lease.AuditAction{lease.AuditBlock, lease.AuditRevoke}) {
			t.Errorf("Audit(%+v) after 300 of alice's own changes: the admin's records are %v, want the block and the revoke", q, admin)
		}
		for i := 1; i < len(recs); i++ {
			if recs[i].ID == recs[i-1].ID {
				t.Errorf("Audit(%+v) answers record %s twice", q, recs[i].ID)
			}
		}
	}
	// A page of one session, and paging one record at a time, find them too.
	if recs := allAudit(t, e, lease.AuditQuery{User: "alice", Session: "doc-1", Limit: 1}); len(recs) < 2 ||
		recs[len(recs)-1].Action != lease.AuditRevoke {
		t.Errorf("paging alice's doc-1 one record at a time ends with %+v, want the revoke", recs[len(recs)-1])
	}
}

func TestAdminsRecordsNeverPushAUsersOwnRecordsOutOfTheAuditLog(t *testing.T) {
	const maxRecords = 10
	e, c, db := adminEngine(t, Options{AuditMaxRecords: maxRecords})
	ctx := t.Context()
	for _, tab := range []lease.Holder{tabA, tabB} {
		mustAcquire(t, e, alice, tab, lease.ModeTakeover)
	}
	// Blocks of another session of alice's, each an admin's record: more than a stream node holds.
	other := lease.Key{User: "alice", Session: "doc-9"}
	for i := range 250 {
		if _, err := e.Revoke(ctx, lease.RevokeRequest{Key: other, Admin: "root", Reason: "why " + strconv.Itoa(i), Block: time.Millisecond}); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.XLen(ctx, db.Prefix()+":{alice}:audit").Val(); n != 2 {
		t.Errorf("the user's log holds %d records, want her 2 own", n)
	}
	if n := c.XLen(ctx, db.Prefix()+":{alice}:audit:admin").Val(); n > maxRecords+100 {
		t.Errorf("the admins' log of the user holds %d records, want about %d", n, maxRecords)
	}
	recs := allAudit(t, e, lease.AuditQuery{User: "alice", Session: "doc-1"})
	if len(recs) != 2 || recs[0].Action != lease.AuditTakeover || recs[1].Action != lease.AuditGrant {
		t.Errorf("alice's own records after 250 revokes: %+v, want the takeover and the grant", recs)
	}
	// The ids of both logs are one sequence: every record once.
	seen := map[string]bool{}
	for _, r := range allAudit(t, e, lease.AuditQuery{User: "alice"}) {
		if seen[r.ID] {
			t.Fatalf("Audit answers record %s twice", r.ID)
		}
		seen[r.ID] = true
	}
}

// TestAnAuditLogAheadOfTheClockIsContinued: the records' ids are "<ms>-*" from the store clock;
// when the log's newest id is later (the clock stepped back), the next records continue from it.
func TestAnAuditLogAheadOfTheClockIsContinued(t *testing.T) {
	e, c, db := adminEngine(t, Options{})
	ctx := t.Context()
	log := db.Prefix() + ":{alice}:audit"
	ahead := time.Now().Add(time.Hour).UnixMilli()
	if err := c.XAdd(ctx, &redis.XAddArgs{Stream: log, ID: fmt.Sprintf("%d-5", ahead), Values: []string{"s", "doc-0", "a", "grant", "e", "1", "at", strconv.FormatInt(ahead*1000, 10), "tab", "tab-0"}}).Err(); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, e, alice, tabA, lease.ModeTry)
	mustAcquire(t, e, alice, tabB, lease.ModeTakeover)
	top := c.XRevRangeN(ctx, log, "+", "-", 3).Val()
	want := []string{fmt.Sprintf("%d-7", ahead), fmt.Sprintf("%d-6", ahead), fmt.Sprintf("%d-5", ahead)}
	if len(top) != 3 || top[0].ID != want[0] || top[1].ID != want[1] || top[2].ID != want[2] {
		t.Fatalf("the log's newest ids = %+v, want %q: the grant and the takeover after the entry ahead of the clock", top, want)
	}
	recs := allAudit(t, e, lease.AuditQuery{User: "alice", Limit: 3})
	if len(recs) != 3 || recs[0].Action != lease.AuditTakeover || recs[1].Action != lease.AuditGrant {
		t.Fatalf("Audit = %+v, want the takeover, the grant, then the entry ahead of the clock", recs)
	}
}

// TestAReleaseRecordsNoFieldItImplies checks the audit entries of the usual session, a grant and a
// release: the same five fields, the release's holder before it implied by its tab and epoch
// (admin.lua), and that a release or expiry recorded with ptab and pep, as earlier versions wrote
// them, reads the same.
func TestAReleaseRecordsNoFieldItImplies(t *testing.T) {
	e, c, db := adminEngine(t, Options{})
	ctx := t.Context()
	log := db.Prefix() + ":{alice}:audit"
	a := mustAcquire(t, e, alice, tabA, lease.ModeTry)
	mustReleaseLease(t, e, alice, "tab-a", a.Epoch)
	entries := c.XRange(ctx, log, "-", "+").Val()
	if len(entries) != 2 {
		t.Fatalf("the audit log = %+v, want the grant and the release", entries)
	}
	for _, en := range entries {
		var fields []string
		for f := range en.Values {
			fields = append(fields, f)
		}
		slices.Sort(fields)
		if !slices.Equal(fields, []string{"a", "at", "e", "s", "tab"}) {
			t.Errorf("the %v record's fields = %q, want a, at, e, s, tab", en.Values["a"], fields)
		}
	}

	// The same records as earlier versions wrote them, and an expiry with its epoch written twice.
	epoch := strconv.FormatInt(a.Epoch, 10)
	at := strconv.FormatInt(a.GrantedAt.UnixMicro(), 10)
	for _, values := range [][]any{
		{"s", "doc-2", "a", "release", "e", epoch, "at", at, "tab", "tab-a", "ptab", "tab-a", "pep", epoch},
		{"s", "doc-2", "a", "expire", "e", epoch, "at", at, "ptab", "tab-b", "pep", epoch},
		{"s", "doc-2", "a", "expire", "e", epoch, "at", at, "ptab", "tab-b"},
	} {
		if err := c.XAdd(ctx, &redis.XAddArgs{Stream: log, Values: values}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	recs := allAudit(t, e, lease.AuditQuery{User: "alice"})
	if len(recs) != 5 {
		t.Fatalf("Audit answered %d records, want 5", len(recs))
	}
	want := []lease.Previous{{TabID: "tab-b", Epoch: a.Epoch}, {TabID: "tab-b", Epoch: a.Epoch}, {TabID: "tab-a", Epoch: a.Epoch}, {TabID: "tab-a", Epoch: a.Epoch}}
	for i, w := range want { // newest first: the two expiries, the old release, the new one
		if p := recs[i].Previous; p == nil || *p != w {
			t.Errorf("record %d (%s of %s) Previous = %+v, want %+v", i, recs[i].Action, recs[i].Key.Session, p, w)
		}
	}
	if recs[4].Action != lease.AuditGrant || recs[4].Previous != nil {
		t.Errorf("the grant = %+v, want no holder before it", recs[4])
	}
}
