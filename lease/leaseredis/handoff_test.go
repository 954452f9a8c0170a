package leaseredis

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tablease/tablease/internal/redistest"
	"github.com/tablease/tablease/lease"
)

// handoffFields are the fields of the state hash that hold a handoff (see state.lua).
var handoffFields = []string{"ho_tab", "ho_label", "ho_hidden", "ho_from_tab", "ho_from_epoch", "ho_until_us",
	"ho_reserved", "ho_reserve_ms"}

// handoffHash answers the handoff fields of the state hash of key that are set.
func handoffHash(t *testing.T, c *redis.Client, db *redistest.DB, key lease.Key) map[string]string {
	t.Helper()
	all, err := c.HGetAll(t.Context(), db.Prefix()+":{"+key.User+"}:lease:"+key.Session).Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, f := range handoffFields {
		if v, ok := all[f]; ok {
			out[f] = v
		}
	}
	return out
}

// wantNoHandoffFields fails unless the state hash of key holds no handoff field.
func wantNoHandoffFields(t *testing.T, what string, c *redis.Client, db *redistest.DB, key lease.Key) {
	t.Helper()
	if h := handoffHash(t, c, db, key); len(h) != 0 {
		t.Errorf("%s: the state hash holds the handoff fields %v, want none", what, h)
	}
}

// requestHandoff makes tab ask for a handoff of key and answers the RetryAfter of the
// *lease.RetryError of ErrHandoffPending it must get.
func requestHandoff(t *testing.T, e *Engine, key lease.Key, h lease.Holder) time.Duration {
	t.Helper()
	l, err := e.Acquire(t.Context(), lease.AcquireRequest{Key: key, Holder: h, TTL: time.Minute, Mode: lease.ModeHandoff})
	var retry *lease.RetryError
	if !errors.Is(err, lease.ErrHandoffPending) || !errors.As(err, &retry) {
		t.Fatalf("Acquire by %s in mode handoff = %+v, %v; want a *lease.RetryError of ErrHandoffPending", h.TabID, l, err)
	}
	return retry.RetryAfter
}

func mustGetLease(t *testing.T, e *Engine, key lease.Key) lease.Lease {
	t.Helper()
	g, err := e.Get(t.Context(), key)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	return g
}

func mustReleaseLease(t *testing.T, e *Engine, key lease.Key, tab string, epoch int64) lease.ReleaseResult {
	t.Helper()
	r, err := e.Release(t.Context(), lease.ReleaseRequest{Key: key, TabID: tab, Epoch: epoch})
	if err != nil || !r.Released {
		t.Fatalf("Release by %s at %d = %+v, %v; want Released", tab, epoch, r, err)
	}
	return r
}

func micro(ti time.Time) string { return strconv.FormatInt(ti.UnixMicro(), 10) }

func TestAHandoffLivesInTheStateHashFromTheRequestToTheClaim(t *testing.T) {
	e, c, db := adminEngine(t, Options{HandoffTimeout: 3 * time.Second, HandoffReserve: 4 * time.Second})
	a := mustAcquire(t, e, alice, tabA, lease.ModeTry)
	wantNoHandoffFields(t, "after a grant", c, db, alice)

	requester := lease.Holder{TabID: "tab-b", Label: "Calendar", Hidden: true}
	if retry := requestHandoff(t, e, alice, requester); retry != 3*time.Second {
		t.Errorf("a new request: RetryAfter %v, want the handoff timeout 3s exactly", retry)
	}
	g := mustGetLease(t, e, alice)
	if !g.HeldBy("tab-a", a.Epoch) || g.Handoff == nil || g.Handoff.Reserved || g.Handoff.Requester != requester {
		t.Fatalf("Get after the request = %+v (Handoff %+v), want tab-a holding with tab-b's request", g, g.Handoff)
	}
	want := map[string]string{
		"ho_tab": "tab-b", "ho_label": "Calendar", "ho_hidden": "1",
		"ho_from_tab": "tab-a", "ho_from_epoch": strconv.FormatInt(a.Epoch, 10),
		"ho_until_us": micro(g.Handoff.Until), "ho_reserved": "0", "ho_reserve_ms": "4000",
	}
	if h := handoffHash(t, c, db, alice); !equalMaps(h, want) {
		t.Errorf("the handoff fields after the request = %v, want %v", h, want)
	}

	r := mustReleaseLease(t, e, alice, "tab-a", a.Epoch)
	until := r.Lease.Now.Add(4 * time.Second)
	if ho := r.Lease.Handoff; ho == nil || !ho.Reserved || !ho.Until.Equal(until) || ho.Requester != requester {
		t.Fatalf("the release answered Handoff %+v, want reserved for tab-b until %v", ho, until)
	}
	want["ho_reserved"], want["ho_until_us"] = "1", micro(until)
	if h := handoffHash(t, c, db, alice); !equalMaps(h, want) {
		t.Errorf("the handoff fields after the release = %v, want %v (the holder kept in ho_from_*)", h, want)
	}

	b, err := e.Acquire(t.Context(), lease.AcquireRequest{Key: alice, Holder: requester, TTL: time.Minute})
	if err != nil || b.Epoch <= a.Epoch || b.Handoff != nil {
		t.Fatalf("the requester's claim = %+v, %v; want a grant above %d without a handoff", b, err, a.Epoch)
	}
	wantNoHandoffFields(t, "after the claim", c, db, alice)
	recs := allAudit(t, e, lease.AuditQuery{User: alice.User, Session: alice.Session})
	if len(recs) == 0 || recs[0].Action != lease.AuditHandoff || recs[0].TabID != "tab-b" || recs[0].Epoch != b.Epoch ||
		recs[0].Previous == nil || *recs[0].Previous != (lease.Previous{TabID: "tab-a", Epoch: a.Epoch}) {
		t.Errorf("the newest audit record = %+v, want tab-b's handoff from tab-a at %d", recs, a.Epoch)
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestEveryGrantAndRevokeDeletesTheHandoffFields(t *testing.T) {
	e, c, db := adminEngine(t, Options{})
	ctx := t.Context()
	tabC := lease.Holder{TabID: "tab-c"}
	for _, tc := range []struct {
		name     string
		released bool // the holder releases after the request: the lease is reserved
		end      func(t *testing.T, key lease.Key)
	}{
		{"a takeover during a request", false, func(t *testing.T, key lease.Key) { mustAcquire(t, e, key, tabC, lease.ModeTakeover) }},
		{"a takeover during a reservation", true, func(t *testing.T, key lease.Key) { mustAcquire(t, e, key, tabC, lease.ModeTakeover) }},
		{"the requester's takeover during a request", false, func(t *testing.T, key lease.Key) { mustAcquire(t, e, key, tabB, lease.ModeTakeover) }},
		{"a revoke during a request", false, func(t *testing.T, key lease.Key) {
			if rv, err := e.Revoke(ctx, lease.RevokeRequest{Key: key, Admin: "root", Reason: "support"}); err != nil || !rv.Revoked {
				t.Fatalf("Revoke = %+v, %v", rv, err)
			}
		}},
		{"a revoke during a reservation", true, func(t *testing.T, key lease.Key) {
			if rv, err := e.Revoke(ctx, lease.RevokeRequest{Key: key, Admin: "root", Reason: "support"}); err != nil || rv.Revoked {
				t.Fatalf("Revoke of the free lease = %+v, %v; want Revoked false", rv, err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := lease.Key{User: "alice", Session: strings.ReplaceAll(tc.name, " ", "-")}
			key.Session = strings.ReplaceAll(key.Session, "'", "")
			a := mustAcquire(t, e, key, tabA, lease.ModeTry)
			requestHandoff(t, e, key, tabB)
			if tc.released {
				mustReleaseLease(t, e, key, "tab-a", a.Epoch)
			}
			if len(handoffHash(t, c, db, key)) != len(handoffFields) {
				t.Fatalf("the handoff fields before the end = %v, want all of %v", handoffHash(t, c, db, key), handoffFields)
			}
			tc.end(t, key)
			wantNoHandoffFields(t, tc.name, c, db, key)
			if g := mustGetLease(t, e, key); g.Handoff != nil {
				t.Errorf("Get after %s: Handoff %+v, want none", tc.name, g.Handoff)
			}
		})
	}
}

func TestALapsedRequestIsDeletedByTheReleaseThatReservesNothing(t *testing.T) {
	e, c, db := adminEngine(t, Options{HandoffTimeout: 50 * time.Millisecond})
	a := mustAcquire(t, e, alice, tabA, lease.ModeTry)
	requestHandoff(t, e, alice, tabB)
	until := mustGetLease(t, e, alice).Handoff.Until
	waitStoreMicros(t, c, until.UnixMicro())

	// A lapse needs no write: the fields stay, and count as none.
	if h := handoffHash(t, c, db, alice); h["ho_tab"] != "tab-b" || h["ho_reserved"] != "0" {
		t.Errorf("the handoff fields after the lapse = %v, want the request as it was", h)
	}
	if g := mustGetLease(t, e, alice); !g.HeldBy("tab-a", a.Epoch) || g.Handoff != nil {
		t.Errorf("Get after the lapse = %+v (Handoff %+v), want tab-a holding, no handoff", g, g.Handoff)
	}
	if ls, err := e.ListLeases(t.Context(), lease.ListQuery{User: alice.User}); err != nil || len(ls.Leases) != 1 || ls.Leases[0].Handoff != nil {
		t.Errorf("ListLeases after the lapse = %+v, %v; want tab-a's lease without a handoff", ls, err)
	}
	r := mustReleaseLease(t, e, alice, "tab-a", a.Epoch)
	if r.Lease.Handoff != nil {
		t.Errorf("the release after the lapse answered Handoff %+v, want none", r.Lease.Handoff)
	}
	wantNoHandoffFields(t, "after the release", c, db, alice)
	mustAcquire(t, e, alice, lease.Holder{TabID: "tab-c"}, lease.ModeTry)
}

func TestAnExpiryReservesFromExpiresAtWithTheWindowOfTheRequest(t *testing.T) {
	e, c, db := adminEngine(t, Options{HandoffTimeout: 10 * time.Second, HandoffReserve: 3 * time.Second})
	// Another instance on the same prefix, with another reserve window, announces the expiry.
	other := engineOn(t, db.URL(), db.Prefix(), DefaultOpTimeout)
	w := mustWatch(t, other, alice, "")
	a, err := e.Acquire(t.Context(), lease.AcquireRequest{Key: alice, Holder: tabA, TTL: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	requestHandoff(t, e, alice, tabB)
	for _, typ := range []lease.EventType{lease.EventGranted, lease.EventHandoffRequested} {
		if ev := next(t, w); ev.Type != typ {
			t.Fatalf("event %+v, want %s", ev, typ)
		}
	}
	// The watching instance's timer announces the expiry, with the requester.
	ev := next(t, w)
	if ev.Type != lease.EventExpired || !ev.At.Equal(a.ExpiresAt) || ev.Requester == nil || *ev.Requester != tabB {
		t.Fatalf("the expiry event = %+v, want expired at %v with the requester tab-b", ev, a.ExpiresAt)
	}
	until := a.ExpiresAt.Add(3 * time.Second)
	h := handoffHash(t, c, db, alice)
	if h["ho_reserved"] != "1" || h["ho_until_us"] != micro(until) {
		t.Errorf("the handoff fields after the expiry = %v, want reserved until the expiry plus the request's 3s (%s)", h, micro(until))
	}
	g := mustGetLease(t, other, alice)
	if g.Held || g.Handoff == nil || !g.Handoff.Reserved || !g.Handoff.Until.Equal(until) || g.Handoff.Requester != tabB {
		t.Errorf("Get after the expiry = %+v (Handoff %+v), want free and reserved for tab-b until %v", g, g.Handoff, until)
	}
}

func TestAReleaseByAnotherInstanceReservesWithTheWindowOfTheRequest(t *testing.T) {
	e, c, db := adminEngine(t, Options{HandoffReserve: 3 * time.Second})
	other := engineOn(t, db.URL(), db.Prefix(), DefaultOpTimeout) // the default reserve window, 10 s
	a := mustAcquire(t, e, alice, tabA, lease.ModeTry)
	requestHandoff(t, e, alice, tabB)
	r := mustReleaseLease(t, other, alice, "tab-a", a.Epoch)
	until := r.Lease.Now.Add(3 * time.Second)
	if ho := r.Lease.Handoff; ho == nil || !ho.Reserved || !ho.Until.Equal(until) {
		t.Errorf("the release answered Handoff %+v, want reserved until %v", ho, until)
	}
	if h := handoffHash(t, c, db, alice); h["ho_until_us"] != micro(until) {
		t.Errorf("the handoff fields after the release = %v, want ho_until_us %s", h, micro(until))
	}
}

// logTypes answers the types of the events in the log of key, oldest first.
func logTypes(t *testing.T, c *redis.Client, db *redistest.DB, key lease.Key) []string {
	t.Helper()
	entries, err := c.LRange(t.Context(), db.Prefix()+":{"+key.User+"}:log:"+key.Session, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, en := range entries {
		var ev struct {
			Type      string `json:"type"`
			Requester *struct {
				Tab string `json:"tab"`
			} `json:"requester"`
			Reason string `json:"reason"`
		}
		_, data, isEvent := strings.Cut(en, " ") // "<id> <event JSON>", or the log's mark "<id>"
		if !isEvent {
			continue
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatal(err)
		}
		s := ev.Type
		if ev.Requester != nil {
			s += " for " + ev.Requester.Tab
		}
		if ev.Reason != "" {
			s += " (" + ev.Reason + ")"
		}
		out = append(out, s)
	}
	return out
}

func TestAHandoffIsIdempotentWhenTheDriverRetriesIt(t *testing.T) {
	db := redistest.Shared(t)
	client, err := NewClient(db.URL(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	client.AddHook(twice{})
	const timeout, reserve = 5 * time.Second, 5 * time.Second
	e, err := New(client, Options{Prefix: db.Prefix(), HandoffTimeout: timeout, HandoffReserve: reserve})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	c := db.Client(t)
	mustWatch(t, e, alice, "") // a session has an event log while it is watched

	a := mustAcquire(t, e, alice, tabA, lease.ModeTry)
	// Sent twice: the second finds the first's request pending, and answers its time left.
	if retry := requestHandoff(t, e, alice, tabB); retry <= 0 || retry > timeout {
		t.Errorf("a request sent twice: RetryAfter %v, want in (0, %v]", retry, timeout)
	}
	first := handoffHash(t, c, db, alice)
	if first["ho_tab"] != "tab-b" || first["ho_reserved"] != "0" {
		t.Fatalf("the handoff fields after a request sent twice = %v, want tab-b's request", first)
	}
	// A repeat by the requester (sent twice again) changes nothing either.
	requestHandoff(t, e, alice, tabB)
	if h := handoffHash(t, c, db, alice); !equalMaps(h, first) {
		t.Errorf("the handoff fields after a repeat = %v, want them unchanged %v", h, first)
	}

	r := mustReleaseLease(t, e, alice, "tab-a", a.Epoch)
	if ho := r.Lease.Handoff; ho == nil || !ho.Reserved || ho.Requester.TabID != "tab-b" {
		t.Fatalf("a release sent twice answered Handoff %+v, want the reservation for tab-b", ho)
	}
	reserved := handoffHash(t, c, db, alice)
	if reserved["ho_until_us"] != micro(r.Lease.Handoff.Until) {
		t.Errorf("the handoff fields after a release sent twice = %v, want ho_until_us %s", reserved, micro(r.Lease.Handoff.Until))
	}

	b, err := e.Acquire(t.Context(), lease.AcquireRequest{Key: alice, Holder: tabB, TTL: time.Minute, Mode: lease.ModeHandoff})
	if err != nil || b.Epoch <= a.Epoch || b.Transitions != 2 {
		t.Fatalf("a claim sent twice = %+v, %v; want one new epoch above %d, 2 transitions", b, err, a.Epoch)
	}
	wantNoHandoffFields(t, "after a claim sent twice", c, db, alice)

	wantLog := []string{"granted", "handoff_requested for tab-b", "released for tab-b", "granted (handoff)"}
	if got := logTypes(t, c, db, alice); strings.Join(got, ", ") != strings.Join(wantLog, ", ") {
		t.Errorf("the event log = %q, want %q: one event per change", got, wantLog)
	}
	recs := allAudit(t, e, lease.AuditQuery{User: alice.User, Session: alice.Session})
	if got := actions(recs); strings.Join(got, ", ") != "alice/doc-1 handoff, alice/doc-1 release, alice/doc-1 grant" {
		t.Errorf("the audit log = %q, want the grant, the release and the handoff, once each", got)
	}
}

func TestParseLeasesReadsThePendingRequest(t *testing.T) {
	lease1 := []any{"doc-1", "tab-a", "A", int64(0), int64(5), int64(4), int64(9), int64(5), int64(1)}
	// with appends the handoff fields, and then no block (block_until_us 0), to lease1.
	with := func(ho ...any) []any { return append(append(append([]any{int64(6)}, lease1...), ho...), int64(0)) }
	ls, err := parseLeases("alice", with("tab-b", "B", int64(1), int64(8)))
	if err != nil || len(ls) != 1 || ls[0].Handoff == nil ||
		*ls[0].Handoff != (lease.HandoffState{Requester: lease.Holder{TabID: "tab-b", Label: "B", Hidden: true}, Until: time.UnixMicro(8).UTC()}) {
		t.Fatalf("parseLeases with a request = %+v, %v", ls, err)
	}
	if ls, err := parseLeases("alice", with("", "", int64(0), int64(0))); err != nil || len(ls) != 1 || ls[0].Handoff != nil ||
		!ls[0].BlockedUntil.IsZero() {
		t.Fatalf("parseLeases without a request = %+v, %v", ls, err)
	}
	blocked := append(append([]any{int64(6)}, lease1...), "", "", int64(0), int64(0), int64(7))
	if ls, err := parseLeases("alice", blocked); err != nil || len(ls) != 1 || !ls[0].BlockedUntil.Equal(time.UnixMicro(7)) {
		t.Fatalf("parseLeases with a block = %+v, %v", ls, err)
	}
	for name, v := range map[string][]any{
		"the old stride":              append([]any{int64(6)}, lease1...),
		"the stride before the block": append(append([]any{int64(6)}, lease1...), "", "", int64(0), int64(0)),
		"a block that ended":          append(append([]any{int64(6)}, lease1...), "", "", int64(0), int64(0), int64(6)),
		"a negative block":            append(append([]any{int64(6)}, lease1...), "", "", int64(0), int64(0), int64(-7)),
		"a requester without until":   with("tab-b", "", int64(0), int64(0)),
		"an until without requester":  with("", "", int64(0), int64(8)),
		"a request that lapsed":       with("tab-b", "", int64(0), int64(6)),
		"a requester that is no text": with(int64(1), "", int64(0), int64(8)),
	} {
		if _, err := parseLeases("alice", v); err == nil {
			t.Errorf("parseLeases(%s) = nil error", name)
		}
	}
}
