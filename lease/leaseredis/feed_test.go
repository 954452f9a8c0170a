package leaseredis

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tablease/tablease/internal/redistest"
	"github.com/tablease/tablease/lease"
)

const waitFor = 10 * time.Second

// next receives the next event of w, failing the test when none comes within waitFor.
func next(t *testing.T, w *lease.Watch) lease.Event {
	t.Helper()
	select {
	case ev, ok := <-w.Events():
		if !ok {
			t.Fatalf("the watch of %+v ended: %v", w.Key, w.Err())
		}
		return *ev
	case <-time.After(waitFor):
		t.Fatalf("no event on the watch of %+v within %v", w.Key, waitFor)
	}
	return lease.Event{}
}

// drain receives what w still delivers until it ends, and answers it with Err.
func drain(t *testing.T, w *lease.Watch) ([]lease.Event, error) {
	t.Helper()
	deadline := time.After(waitFor)
	var evs []lease.Event
	for {
		select {
		case ev, ok := <-w.Events():
			if !ok {
				return evs, w.Err()
			}
			evs = append(evs, *ev)
		case <-deadline:
			t.Fatalf("the watch of %+v did not end within %v", w.Key, waitFor)
		}
	}
}

func mustWatch(t *testing.T, e *Engine, key lease.Key, after string) *lease.Watch {
	t.Helper()
	w, err := e.Watch(t.Context(), key, after)
	if err != nil {
		t.Fatalf("Watch(%+v, %q): %v", key, after, err)
	}
	t.Cleanup(w.Close)
	return w
}

// pubsubClients counts the server's Pub/Sub connections (CLIENT LIST TYPE pubsub).
func pubsubClients(t *testing.T, c *redis.Client) int {
	t.Helper()
	list, err := c.ClientList(t.Context()).Result() // all types: go-redis has no TYPE argument
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for line := range strings.SplitSeq(strings.TrimSpace(list), "\n") {
		// A subscribed connection has sub=1 (or psub/ssub) and is in the pubsub state.
		if strings.Contains(line, " sub=1 ") {
			n++
		}
	}
	return n
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen within %v", what, waitFor)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestALostSubscriptionEndsEveryWatchWithResyncAndTheLogReplaysWhatWasMissed(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	e := engineOn(t, srv.URL(), "p", time.Second)
	peer := engineOn(t, srv.URL(), "p", time.Second) // another instance, which changes the lease
	ctx := t.Context()
	bob := lease.Key{User: "bob", Session: "doc-1"}

	w := mustWatch(t, e, alice, "")
	other := mustWatch(t, e, bob, "")
	a, err := peer.Acquire(ctx, lease.AcquireRequest{Key: alice, Holder: tabA, TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	granted := next(t, w) // the subscription is live
	if granted.Type != lease.EventGranted || granted.Epoch != a.Epoch {
		t.Fatalf("first event = %+v, want the grant", granted)
	}

	// The subscription's connection dies; meanwhile the peer takes the lease over.
	if err := admin.Do(ctx, "client", "kill", "type", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	b, err := peer.Acquire(ctx, lease.AcquireRequest{Key: alice, Holder: tabB, TTL: time.Minute, Mode: lease.ModeTakeover})
	if err != nil {
		t.Fatal(err)
	}

	// Every watch of the engine ends with ErrResync once go-redis has subscribed again, whether or
	// not the takeover came through before.
	got, err := drain(t, w)
	if !errors.Is(err, lease.ErrResync) {
		t.Fatalf("Err of the watch after the subscription was lost = %v, want lease.ErrResync", err)
	}
	if _, err := drain(t, other); !errors.Is(err, lease.ErrResync) {
		t.Errorf("Err of the other session's watch = %v, want lease.ErrResync", err)
	}

	// Watching again after the last event handled replays what the watch did not get.
	last := granted.ID
	if len(got) > 0 {
		last = got[len(got)-1].ID
	}
	r := mustWatch(t, e, alice, last)
	if !r.Resumed {
		t.Fatalf("a watch after %s was not resumed", last)
	}
	story := append(got, r.Replay...)
	if len(story) != 1 || story[0].Type != lease.EventTakenOver || story[0].Epoch != b.Epoch ||
		story[0].Previous == nil || *story[0].Previous != (lease.Previous{TabID: "tab-a", Epoch: a.Epoch}) {
		t.Fatalf("delivered %+v then replayed %+v; want the takeover once", got, r.Replay)
	}
	t.Logf("the takeover was delivered before the resync: %v", len(got) == 1)
	if !r.Snapshot.HeldBy("tab-b", b.Epoch) {
		t.Errorf("Snapshot of the new watch = %+v, want tab-b at %d", r.Snapshot, b.Epoch)
	}

	// And the new watch is live.
	if _, err := peer.Release(ctx, lease.ReleaseRequest{Key: alice, TabID: "tab-b", Epoch: b.Epoch}); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, r); ev.Type != lease.EventReleased || ev.Epoch != b.Epoch {
		t.Errorf("first live event of the new watch = %+v, want the release", ev)
	}
}

func TestAnEngineHasOneSubscriptionWhateverItWatches(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	e := engineOn(t, srv.URL(), "p", time.Second)
	if n := pubsubClients(t, admin); n != 0 {
		t.Fatalf("%d Pub/Sub connections before any watch, want none: an engine subscribes on its first watch", n)
	}
	for i := range 50 {
		mustWatch(t, e, lease.Key{User: fmt.Sprintf("user-%d", i%5), Session: fmt.Sprintf("doc-%d", i)}, "")
	}
	if n := pubsubClients(t, admin); n != 1 {
		t.Errorf("%d Pub/Sub connections for 50 watches of one engine, want 1", n)
	}
	peer := engineOn(t, srv.URL(), "p", time.Second)
	mustWatch(t, peer, alice, "")
	if n := pubsubClients(t, admin); n != 2 {
		t.Errorf("%d Pub/Sub connections for two engines, want 2", n)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the closed engine's subscription ending", func() bool { return pubsubClients(t, admin) == 1 })
}

func TestAllKeysOfASessionShareTheUsersHashTagAndTheLogIsBounded(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	client, err := NewClient(srv.URL(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	// Long enough that the tab's entry outlives the 500 renews below on a loaded machine.
	const presenceTTL = time.Minute
	e, err := New(client, Options{Prefix: "p", PresenceTTL: presenceTTL, EventLogLen: 50})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	ctx := t.Context()
	mustWatch(t, e, alice, "") // a session has an event log while it is watched

	a := mustAcquire(t, e, alice, tabA, lease.ModeTry)
	if _, err := e.Join(ctx, alice, "conn-1", lease.Tab{TabID: "tab-a"}, 0); err != nil {
		t.Fatal(err)
	}
	for i := range 500 {
		if _, err := e.Renew(ctx, lease.RenewRequest{Key: alice, TabID: "tab-a", Epoch: a.Epoch, TTL: time.Minute, Hidden: i%2 == 0}); err != nil {
			t.Fatal(err)
		}
	}
	keys, err := c.Keys(ctx, "p:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"p:{alice}:lease:doc-1":   "hash",
		"p:{alice}:log:doc-1":     "list",
		"p:{alice}:tabs:doc-1":    "zset",
		"p:{alice}:tabinfo:doc-1": "hash",
		"p:{alice}:sessions":      "zset",   // the user's index of held leases
		"p:{alice}:audit":         "stream", // the user's audit log
		"p:{alice}:known":         "zset",   // the user's sessions whose state is kept
		"p:users":                 "zset",   // the users index: the one key without a tag, no script's
	}
	replies := 0
	for _, k := range keys {
		typ, ok := want[k]
		if strings.HasPrefix(k, "p:{alice}:reply:") {
			// The answer of one call that changed the session, kept a while for its retries.
			replies++
			typ, ok = "string", true
			if ttl := c.PTTL(ctx, k).Val(); ttl <= 0 || ttl > 5*DefaultOpTimeout {
				t.Errorf("PTTL %s = %v, want at most 5 OpTimeouts", k, ttl)
			}
		}
		if !ok {
			t.Errorf("unexpected key %q", k)
			continue
		}
		if got := c.Type(ctx, k).Val(); got != typ {
			t.Errorf("TYPE %s = %s, want %s", k, got, typ)
		}
		// The hash tag, which picks the Cluster slot, is what lies between the first '{' and the next '}'.
		if k == "p:users" {
			continue
		}
		if open, end := strings.IndexByte(k, '{'), strings.IndexByte(k, '}'); open < 0 || end < open || k[open+1:end] != "alice" {
			t.Errorf("the hash tag of %s is not the user's", k)
		}
	}
	if len(keys)-replies != len(want) || replies != 2 {
		t.Errorf("keys = %q, want %d and the answers of the acquire and the join (a renew keeps none)", keys, len(want))
	}
	if n := c.LLen(ctx, "p:{alice}:log:doc-1").Val(); n != 50 {
		t.Errorf("the log holds %d events after 502, want the last 50", n)
	}
	for _, k := range []string{"p:{alice}:tabs:doc-1", "p:{alice}:tabinfo:doc-1"} {
		if ttl := c.PTTL(ctx, k).Val(); ttl <= DefaultEventLogTTL || ttl > DefaultEventLogTTL+presenceTTL {
			t.Errorf("PTTL %s = %v, want the presence TTL plus the log's (%v)", k, ttl, DefaultEventLogTTL+presenceTTL)
		}
	}
	// The last tab leaving empties the presence keys, which Redis then deletes.
	if err := e.Leave(ctx, alice, "conn-1", "tab-a", 0); err != nil {
		t.Fatal(err)
	}
	if n := c.Exists(ctx, "p:{alice}:tabs:doc-1", "p:{alice}:tabinfo:doc-1").Val(); n != 0 {
		t.Errorf("%d presence keys remain after the last tab left", n)
	}
}

func TestARenewThatShortensTheLeaseStillHasItsExpiryAnnouncedInTime(t *testing.T) {
	e, _, _ := newEngine(t)
	ctx := t.Context()
	a := mustAcquire(t, e, alice, tabA, lease.ModeTry) // a minute
	w := mustWatch(t, e, alice, "")
	// Same hidden flag: no event, only the hint that the deadline moved earlier.
	r, err := e.Renew(ctx, lease.RenewRequest{Key: alice, TabID: "tab-a", Epoch: a.Epoch, TTL: lease.DefaultLimits.Min})
	if err != nil {
		t.Fatal(err)
	}
	ev := next(t, w)
	if ev.Type != lease.EventExpired || ev.Epoch != a.Epoch {
		t.Fatalf("event after the short renew = %+v, want the expiry", ev)
	}
	if late := time.Since(r.ExpiresAt); late > 2*time.Second {
		t.Errorf("the expiry came %v after the lease expired", late)
	}
}

func TestMessagesOnTheChannelThatAreNotEventsAreIgnored(t *testing.T) {
	e, c, _ := newEngine(t)
	ctx := t.Context()
	w := mustWatch(t, e, alice, "")
	for _, junk := range []string{"", "not json", `{"u":"alice"}`, `{"u":"alice","s":"doc-1","now":"x"}`, `[1,2]`} {
		if err := c.Publish(ctx, e.channel(), junk).Err(); err != nil {
			t.Fatal(err)
		}
	}
	a := mustAcquire(t, e, alice, tabA, lease.ModeTry)
	if ev := next(t, w); ev.Type != lease.EventGranted || ev.Epoch != a.Epoch {
		t.Errorf("first event after the junk = %+v, want the grant", ev)
	}
}

func TestAWatchWhileTheStoreIsDownIsUnavailableAndWorksOnceItIsBack(t *testing.T) {
	srv := redistest.Start(t)
	e := engineOn(t, srv.URL(), "p", 300*time.Millisecond)
	srv.Stop(t)
	_, err := e.Watch(t.Context(), alice, "")
	wantUnavailable(t, "Watch with the server stopped", "watch", err)

	srv.Restart(t)
	var w *lease.Watch
	eventually(t, "a watch after the restart", func() bool {
		w, err = e.Watch(t.Context(), alice, "")
		return err == nil
	})
	t.Cleanup(w.Close)
	a := mustAcquire(t, e, alice, tabA, lease.ModeTry)
	if ev := next(t, w); ev.Type != lease.EventGranted || ev.Epoch != a.Epoch {
		t.Errorf("first event = %+v, want the grant", ev)
	}
}

// TestEventsThatArriveWhileAWatchStartsAreSortedOutAgainstItsPosition drives the engine's side of
// a watch by hand: events that the subscription delivers while the watch script runs are held,
// and when it answers, those at or before its position are dropped and the others delivered,
// unless one after the position was dropped from the full hold, which is a gap.
func TestEventsThatArriveWhileAWatchStartsAreSortedOutAgainstItsPosition(t *testing.T) {
	client, err := NewClient("redis://127.0.0.1:1/0", time.Second) // never dialled
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	e, err := New(client, Options{WatchBuffer: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	publish := func(ms int) {
		e.deliver(fmt.Sprintf(`{"u":"alice","s":"doc-1","id":"%d-0","ev":{"type":"updated","epoch":"1","holder":{"tab":"tab-a","label":"","hidden":false},"at":"%d"},"now":"%d","next":"0"}`,
			ms, ms*1000, ms*1000))
	}
	begin := func() (*lease.Watch, *watcher) {
		x := &watcher{}
		w, sender := lease.NewWatch(t.Context(), alice, e.watchBuffer, func() { e.forget(alice, x) })
		x.sender = sender
		if err := e.register(alice, x); err != nil {
			t.Fatalf("register refused: %v", err)
		}
		t.Cleanup(w.Close)
		return w, x
	}
	ids := func(evs []lease.Event) string {
		var s []string
		for _, ev := range evs {
			s = append(s, ev.ID)
		}
		return strings.Join(s, " ")
	}

	t.Run("held events after the position are delivered, the others dropped", func(t *testing.T) {
		w, x := begin()
		for ms := 1; ms <= 3; ms++ {
			publish(ms)
		}
		if len(w.Events()) != 0 {
			t.Fatal("a watch that is not started got events")
		}
		e.start(alice, x, "2-0", 0, 0)
		publish(3) // again, as a late duplicate: dropped
		publish(4)
		if got := ids([]lease.Event{next(t, w), next(t, w)}); got != "3-0 4-0" {
			t.Errorf("events = %s, want 3-0 4-0", got)
		}
	})
	t.Run("a full hold that dropped only events before the position is no gap", func(t *testing.T) {
		w, x := begin()
		for ms := 10; ms <= 14; ms++ { // 10 and 11 are dropped from the hold of 3
			publish(ms)
		}
		e.start(alice, x, "11-0", 0, 0)
		if got := ids([]lease.Event{next(t, w), next(t, w), next(t, w)}); got != "12-0 13-0 14-0" {
			t.Errorf("events = %s, want 12-0 13-0 14-0", got)
		}
	})
	t.Run("a full hold that dropped an event after the position ends the watch with a resync", func(t *testing.T) {
		w, x := begin()
		for ms := 20; ms <= 24; ms++ { // 20 and 21 are dropped from the hold of 3
			publish(ms)
		}
		e.start(alice, x, "20-0", 0, 0)
		if evs, err := drain(t, w); len(evs) != 0 || !errors.Is(err, lease.ErrResync) {
			t.Errorf("watch = %s, %v; want no event and lease.ErrResync", ids(evs), err)
		}
	})
	t.Run("an event of the session whose id cannot be read ends its watches with a resync", func(t *testing.T) {
		w, x := begin()
		e.start(alice, x, "", 0, 0)
		e.deliver(`{"u":"alice","s":"doc-1","id":"x","ev":{"type":"updated","at":"1"},"now":"1","next":"0"}`)
		if _, err := drain(t, w); !errors.Is(err, lease.ErrResync) {
			t.Errorf("Err = %v, want lease.ErrResync", err)
		}
	})
	t.Run("an event naming the event before it follows the watch's last, or ends the watch with a resync", func(t *testing.T) {
		withPrev := func(ms int, prev string) {
			e.deliver(fmt.Sprintf(`{"u":"alice","s":"doc-1","id":"%d-0","p":"%s","ev":{"type":"updated","at":"1"},"now":"1","next":"0"}`, ms, prev))
		}
		w, x := begin()
		withPrev(31, "30-0") // held, then delivered after the position it follows
		e.start(alice, x, "30-0", 0, 0)
		withPrev(31, "30-0") // a late duplicate: dropped, whatever it names
		withPrev(32, "31-0")
		if got := ids([]lease.Event{next(t, w), next(t, w)}); got != "31-0 32-0" {
			t.Errorf("events = %s, want 31-0 32-0", got)
		}
		withPrev(34, "33-0") // 33-0 was not published: a gap
		if evs, err := drain(t, w); len(evs) != 0 || !errors.Is(err, lease.ErrResync) {
			t.Errorf("watch after a gap = %s, %v; want no event and lease.ErrResync", ids(evs), err)
		}
		// The first event of a session names none; one held across the start is checked alike.
		w, x = begin()
		withPrev(41, "")
		e.start(alice, x, "", 0, 0)
		if ev := next(t, w); ev.ID != "41-0" {
			t.Errorf("the session's first event = %+v, want 41-0", ev)
		}
		w, x = begin()
		withPrev(51, "49-0")
		e.start(alice, x, "50-0", 0, 0)
		if evs, err := drain(t, w); len(evs) != 0 || !errors.Is(err, lease.ErrResync) {
			t.Errorf("watch after a held gap = %s, %v; want no event and lease.ErrResync", ids(evs), err)
		}
		// One that cannot be read is no event of the engine's.
		w, x = begin()
		e.start(alice, x, "", 0, 0)
		withPrev(61, "x")
		if _, err := drain(t, w); !errors.Is(err, lease.ErrResync) {
			t.Errorf("Err after an unreadable p = %v, want lease.ErrResync", err)
		}
	})
	t.Run("a message is decoded only when its start does not tell a session this engine does not watch", func(t *testing.T) {
		_, x := begin()
		e.start(alice, x, "", 0, 0)
		for payload, want := range map[string]bool{
			`{"u":"alice","s":"doc-1","id":"1-0","p":"","ev":{}}`: true,
			`{"u":"alice","s":"doc-2","id":"1-0","p":"","ev":{}}`: false,
			`{"u":"bob","s":"doc-1","id":"1-0","p":"","ev":{}}`:   false,
			`{"now":"1","u":"bob","s":"doc-1","next":"2"}`:        true, // a hint, in cjson's order
			`{"u":"bob","now":"1"}`:                               true,
			`{"u":"bob","s":"doc-1`:                               true,
			`{"u":"bob`:                                           true,
			`not json`:                                            true,
		} {
			if got := e.watching(payload); got != want {
				t.Errorf("watching(%s) = %v, want %v", payload, got, want)
			}
		}
	})
	t.Run("events of other sessions never reach the watch", func(t *testing.T) {
		w, x := begin()
		e.start(alice, x, "", 0, 0)
		e.deliver(`{"u":"alice","s":"doc-2","id":"99-0","ev":{"type":"updated","at":"1"},"now":"1","next":"0"}`)
		e.deliver(`{"u":"bob","s":"doc-1","id":"99-0","ev":{"type":"updated","at":"1"},"now":"1","next":"0"}`)
		publish(100)
		if ev := next(t, w); ev.ID != "100-0" || ev.Key != alice {
			t.Errorf("event = %+v, want 100-0 of alice/doc-1", ev)
		}
	})
}

// The log is a list of the session's last EventLogLen events, each "<id> <event JSON>": a watch
// after any id it holds replays exactly the events after it, however far back (the script reads
// the list from its end in chunks), and one after an id trimmed out starts from a snapshot.
func TestTheLogReplaysAfterEveryEventItHoldsAndNoEarlier(t *testing.T) {
	const logLen, events = 40, 61
	e, c, db := sharedEngine(t, Options{EventLogLen: logLen, WatchBuffer: 2 * events})
	ctx := t.Context()

	live := mustWatch(t, e, alice, "")
	a := mustAcquire(t, e, alice, tabA, lease.ModeTry)
	for i := range events - 1 { // each renew flips the hidden flag: an "updated" event
		if _, err := e.Renew(ctx, lease.RenewRequest{Key: alice, TabID: "tab-a", Epoch: a.Epoch, TTL: time.Minute, Hidden: i%2 == 0}); err != nil {
			t.Fatal(err)
		}
	}
	var evs []lease.Event
	for range events {
		evs = append(evs, next(t, live))
	}

	entries := c.LRange(ctx, db.Prefix()+":{alice}:log:doc-1", 0, -1).Val()
	if len(entries) != logLen {
		t.Fatalf("the log holds %d entries after %d events, want the last %d", len(entries), events, logLen)
	}
	for i, en := range entries {
		ev := evs[events-logLen+i]
		if id, data, _ := strings.Cut(en, " "); id != ev.ID || !strings.Contains(data, `"type":"`+string(ev.Type)+`"`) {
			t.Fatalf("entry %d of the log = %q, want the %s event %s", i, en, ev.Type, ev.ID)
		}
	}

	for k, ev := range evs {
		w, err := e.Watch(ctx, alice, ev.ID)
		if err != nil {
			t.Fatal(err)
		}
		w.Close()
		if held := k >= events-logLen; w.Resumed != held || w.Position != evs[events-1].ID {
			t.Fatalf("a watch after event %d of %d: Resumed %v, Position %s; want Resumed %v (the log holds the last %d) at %s",
				k, events, w.Resumed, w.Position, held, logLen, evs[events-1].ID)
		}
		want := evs[k+1:]
		if !w.Resumed {
			want = nil
		}
		if len(w.Replay)+len(want) > 0 && !reflect.DeepEqual(w.Replay, want) {
			t.Fatalf("a watch after event %d of %d replayed %d events (%v), want %d", k, events, len(w.Replay), w.Replay, len(want))
		}
	}
}

// TestEachEventNamesTheSessionsNextDeadline reads the "next" of the published events, which the
// instances time their settle timers by: the expiry of the earliest presence entry, as it is after
// the call that announced the event, joins and leaves included.
func TestEachEventNamesTheSessionsNextDeadline(t *testing.T) {
	e, client, db := newEngine(t)
	sub := client.Subscribe(t.Context(), db.Prefix()+":events")
	defer sub.Close()
	if _, err := sub.Receive(t.Context()); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}
	key := lease.Key{User: "u-deadline", Session: "doc"}
	mustWatch(t, e, key, "") // the events of a session nobody watches are not published
	published := func(what string) (now, next int64) {
		t.Helper()
		var m struct{ Now, Next string }
		for {
			msg, err := sub.ReceiveTimeout(t.Context(), waitFor)
			if err != nil {
				t.Fatalf("%s: no message: %v", what, err)
			}
			if json.Unmarshal([]byte(msg.(*redis.Message).Payload), &m) == nil {
				break
			}
			// The engine's heartbeat, which is not JSON.
		}
		now, _ = strconv.ParseInt(m.Now, 10, 64)
		next, _ = strconv.ParseInt(m.Next, 10, 64)
		return now, next
	}
	ttl := e.presenceTTL.Microseconds()

	if _, err := e.Join(t.Context(), key, "c1", lease.Tab{TabID: "t1"}, 0); err != nil {
		t.Fatal(err)
	}
	if now, next := published("the first join"); next != now+ttl {
		t.Errorf("after the first join, next is %d, want the entry's expiry %d", next, now+ttl)
	}
	if err := e.Leave(t.Context(), key, "c1", "t1", 0); err != nil {
		t.Fatal(err)
	}
	if _, next := published("the leave"); next != 0 {
		t.Errorf("after the leave of the only entry, next is %d, want 0", next)
	}
	if _, err := e.Join(t.Context(), key, "c2", lease.Tab{TabID: "t2"}, 0); err != nil {
		t.Fatal(err)
	}
	if now, next := published("the second join"); next != now+ttl {
		t.Errorf("after the second join, next is %d, want the entry's expiry %d", next, now+ttl)
	}
}

// TestASessionHasAnEventLogWhileWatched checks that the log is kept only for watched sessions
// (events.lua): none for a session nobody watches, one from a watch on, with the session's last
// event as its mark, kept through a quiet spell longer than its TTL while the watch lasts, and
// gone its TTL after the last watch.
func TestASessionHasAnEventLogWhileWatched(t *testing.T) {
	const ttl = 1500 * time.Millisecond
	e, c, db := sharedEngine(t, Options{EventLogTTL: ttl})
	ctx := t.Context()
	log := db.Prefix() + ":{alice}:log:doc-1"
	entries := func() []string { return c.LRange(ctx, log, 0, -1).Val() }
	resume := func(after string, want ...lease.Event) {
		t.Helper()
		w, err := e.Watch(ctx, alice, after)
		if err != nil {
			t.Fatal(err)
		}
		w.Close()
		if !w.Resumed || len(w.Replay)+len(want) > 0 && !reflect.DeepEqual(w.Replay, want) {
			t.Fatalf("a watch after %s: Resumed %v, Replay %v; want resumed with %v", after, w.Resumed, w.Replay, want)
		}
	}

	// Unwatched: no log, but the events have their ids all the same.
	a := mustAcquire(t, e, alice, tabA, lease.ModeTry)
	mustReleaseLease(t, e, alice, "tab-a", a.Epoch)
	if n := c.Exists(ctx, log).Val(); n != 0 {
		t.Fatalf("a session nobody watched has an event log: %q", entries())
	}
	released := parkedState(t, c.HGet(ctx, db.Prefix()+":{alice}:free", "doc-1").Val())["event_id"]

	// A watch starts the log with its mark: the last event, from which it resumes.
	w := mustWatch(t, e, alice, "")
	if w.Position != released || !slices.Equal(entries(), []string{released}) {
		t.Fatalf("the first watch: Position %q, log %q; want the release's id %q as both", w.Position, entries(), released)
	}
	resume(released)
	granted := mustAcquire(t, e, alice, tabB, lease.ModeTry)
	ev := next(t, w)
	if got := entries(); len(got) != 2 || !strings.HasPrefix(got[1], ev.ID+" {") {
		t.Fatalf("the log after a grant = %q, want the mark and the %s event %s", got, ev.Type, ev.ID)
	}
	resume(released, ev)

	// A quiet spell twice the log's TTL: the watch keeps the log, which holds the next event.
	quiet := time.Now()
	for time.Since(quiet) < 2*ttl {
		if n := c.Exists(ctx, log).Val(); n != 1 {
			t.Fatalf("the log of a watched session expired %v into a quiet spell (TTL %v)", time.Since(quiet), ttl)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := e.Renew(ctx, lease.RenewRequest{Key: alice, TabID: "tab-b", Epoch: granted.Epoch, TTL: time.Minute, Hidden: true}); err != nil {
		t.Fatal(err)
	}
	updated := next(t, w)
	resume(ev.ID, updated)

	// Unwatched again: the log expires, and events are not logged.
	w.Close()
	eventually(t, "the log's expiry after the last watch", func() bool { return c.Exists(ctx, log).Val() == 0 })
	mustReleaseLease(t, e, alice, "tab-b", granted.Epoch)
	if n := c.Exists(ctx, log).Val(); n != 0 {
		t.Fatalf("a session nobody watches logged its release: %q", entries())
	}

	// A session with no event yet: the mark is "0-0", the position empty, and the first event
	// is replayed after it.
	bob := lease.Key{User: "bob", Session: "doc-2"}
	bobLog := db.Prefix() + ":{bob}:log:doc-2"
	wb := mustWatch(t, e, bob, "")
	if got := c.LRange(ctx, bobLog, 0, -1).Val(); wb.Position != "" || !slices.Equal(got, []string{"0-0"}) {
		t.Fatalf("a watch of a session without events: Position %q, log %q; want none and the mark 0-0", wb.Position, got)
	}
	mustAcquire(t, e, bob, tabA, lease.ModeTry)
	first := next(t, wb)
	w2, err := e.Watch(ctx, bob, first.ID)
	if err != nil {
		t.Fatal(err)
	}
	w2.Close()
	if !w2.Resumed || len(w2.Replay) != 0 || w2.Position != first.ID {
		t.Fatalf("a watch after the first event: Resumed %v, Replay %v, Position %q; want resumed at %s with nothing to replay",
			w2.Resumed, w2.Replay, w2.Position, first.ID)
	}
}

// A store that loses a watched session's data without dropping a connection (FLUSHALL) is found
// by each instance's next settle, whose log lacks the events its watches were sent: each of their
// watches starts over from what the store holds, whichever instance's settle ran first.
func TestWatchesOfASessionWhoseEventsTheStoreLostStartOver(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	ctx := t.Context()
	type instance struct {
		e    *Engine
		lost chan lease.Key
	}
	var instances []instance
	for range 2 {
		client, err := NewClient(srv.URL(), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = client.Close() })
		lost := make(chan lease.Key, 1)
		e, err := New(client, Options{Prefix: "p", OpTimeout: time.Second, OnLostEvents: func(k lease.Key) { lost <- k }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close() })
		instances = append(instances, instance{e, lost})
	}
	a, err := instances[0].e.Acquire(ctx, lease.AcquireRequest{Key: alice, Holder: tabA, TTL: lease.DefaultLimits.Min})
	if err != nil {
		t.Fatal(err)
	}
	var watches []*lease.Watch
	for _, in := range instances {
		watches = append(watches, mustWatch(t, in.e, alice, ""))
	}
	if err := admin.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// The settles at the lease's expiry find neither the lease nor its events: the first recreates
	// the log, with no event, and the second finds it so.
	for i, w := range watches {
		evs, err := drain(t, w)
		if !errors.Is(err, lease.ErrResync) || len(evs) != 0 {
			t.Fatalf("instance %d: watch after FLUSHALL = %v, %v; want no event and lease.ErrResync", i, evs, err)
		}
		// The watch ends before the callback is called (both under the engine's lock, which the
		// drain does not take): wait for it.
		select {
		case k := <-instances[i].lost:
			if k != alice {
				t.Errorf("instance %d: OnLostEvents(%+v), want %+v", i, k, alice)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("instance %d: OnLostEvents was not called within 5 s of the watch's end", i)
		}
	}
	again := mustWatch(t, instances[1].e, alice, "")
	if l := again.Snapshot; l.Held || l.Epoch != 0 {
		t.Errorf("the new watch's lease = %+v, want the store's as it is now (free, epoch 0; %d before)", l, a.Epoch)
	}
}

// missingLogEngines starts a private Redis and n engines on it with prefix "p", each telling its
// OnMissedEvents on its channel, and answers them with a client of the server.
func missingLogEngines(t *testing.T, n int, opts Options) ([]*Engine, []chan lease.Key, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t)
	var engines []*Engine
	var missed []chan lease.Key
	for range n {
		client, err := NewClient(srv.URL(), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = client.Close() })
		ch := make(chan lease.Key, 4)
		o := opts
		o.Prefix, o.OpTimeout = "p", time.Second
		o.OnMissedEvents = func(k lease.Key) { ch <- k }
		e, err := New(client, o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close() })
		engines, missed = append(engines, e), append(missed, ch)
	}
	return engines, missed, srv.Client(t)
}

// The events of a session nobody watches are not published; those of a watched one are, each
// naming the event before it.
func TestOnlyTheEventsOfWatchedSessionsArePublished(t *testing.T) {
	engines, _, admin := missingLogEngines(t, 1, Options{})
	e, ctx := engines[0], t.Context()
	sub := admin.Subscribe(ctx, "p:events")
	t.Cleanup(func() { _ = sub.Close() })
	if _, err := sub.Receive(ctx); err != nil { // the confirmation
		t.Fatal(err)
	}
	bob := lease.Key{User: "bob", Session: "doc-2"}
	mustReleaseLease(t, e, bob, "tab-a", mustAcquire(t, e, bob, tabA, lease.ModeTry).Epoch)
	w := mustWatch(t, e, alice, "")
	mustAcquire(t, e, alice, tabA, lease.ModeTry)
	ev := next(t, w)
	// The first message of an event on the channel is alice's: bob's two were published before
	// it, had they been published.
	for {
		msg, err := sub.ReceiveMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var m wireMessage
		if json.Unmarshal([]byte(msg.Payload), &m) != nil || m.Event == nil {
			continue // a heartbeat
		}
		if m.User != alice.User || m.ID != ev.ID || m.Prev == nil || *m.Prev != w.Position {
			t.Fatalf("the first event published: %s; want alice's %s after %q", msg.Payload, ev.ID, w.Position)
		}
		return
	}
}

// A watch that missed events appended while its session's log was missing (unpublished, see
// events.lua) ends with lease.ErrResync at the next event it receives, which names another event
// before it; a watch that started after them gets that event.
func TestAWatchThatMissedUnpublishedEventsStartsOverAtTheNextEvent(t *testing.T) {
	engines, missed, admin := missingLogEngines(t, 2, Options{})
	ctx := t.Context()
	w1 := mustWatch(t, engines[0], alice, "")
	if err := admin.Del(ctx, "p:{alice}:log:doc-1").Err(); err != nil {
		t.Fatal(err)
	}
	a := mustAcquire(t, engines[0], alice, tabA, lease.ModeTry) // not published: no log
	w2 := mustWatch(t, engines[1], alice, "")                   // makes the log again
	mustReleaseLease(t, engines[0], alice, "tab-a", a.Epoch)
	if evs, err := drain(t, w1); !errors.Is(err, lease.ErrResync) || len(evs) != 0 {
		t.Fatalf("the watch that missed the grant: %v, %v; want no event and lease.ErrResync", evs, err)
	}
	select {
	case k := <-missed[0]:
		if k != alice {
			t.Errorf("OnMissedEvents(%+v), want %+v", k, alice)
		}
	case <-time.After(waitFor):
		t.Error("OnMissedEvents was not called")
	}
	if ev := next(t, w2); ev.Type != lease.EventReleased || ev.Epoch != a.Epoch {
		t.Fatalf("the watch that started after the grant got %+v, want its release", ev)
	}
	if len(missed[1]) != 0 {
		t.Error("OnMissedEvents was called for the watch that missed nothing")
	}
}

// A watch that missed events appended while its session's log was missing, and gets no event
// after them, ends with lease.ErrResync once a settle found the log ahead of it and the next,
// a silence limit later, still does.
func TestAWatchBehindTheLogForASilenceLimitStartsOver(t *testing.T) {
	// A short log TTL: the settle that keeps the log runs every 200 ms.
	engines, missed, admin := missingLogEngines(t, 1, Options{EventLogTTL: 2 * time.Second})
	ctx := t.Context()
	w := mustWatch(t, engines[0], alice, "")
	if err := admin.Del(ctx, "p:{alice}:log:doc-1").Err(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	mustAcquire(t, engines[0], alice, tabA, lease.ModeTry) // not published: no log
	if evs, err := drain(t, w); !errors.Is(err, lease.ErrResync) || len(evs) != 0 {
		t.Fatalf("the watch behind the log: %v, %v; want no event and lease.ErrResync", evs, err)
	}
	if d := time.Since(start); d < engines[0].silenceLimit() {
		t.Errorf("the watch ended %v after the grant, before the silence limit %v", d, engines[0].silenceLimit())
	}
	select {
	case <-missed[0]:
	case <-time.After(waitFor):
		t.Error("OnMissedEvents was not called")
	}
}

// A session's watchers are one without a map, and a map once a second one comes; removing while
// ranging over them is allowed, and the set empties whichever form it has.
func TestAWatcherSetHoldsOneWithoutAMapAndMoreInOne(t *testing.T) {
	a, b, c := &watcher{}, &watcher{}, &watcher{}
	members := func(ws *watcherSet) map[*watcher]bool {
		got := map[*watcher]bool{}
		for x := range ws.all() {
			got[x] = true
		}
		return got
	}
	var ws watcherSet
	ws.add(a)
	if ws.many != nil || !ws.has(a) || ws.has(b) || ws.len() != 1 || len(members(&ws)) != 1 {
		t.Fatalf("one watcher: %+v", ws)
	}
	ws.add(b)
	ws.add(c)
	if ws.one != nil || ws.len() != 3 || !ws.has(a) || !ws.has(b) || !ws.has(c) || len(members(&ws)) != 3 {
		t.Fatalf("three watchers: %+v", ws)
	}
	for x := range ws.all() {
		ws.remove(x)
	}
	if ws.len() != 0 || ws.has(a) || len(members(&ws)) != 0 {
		t.Fatalf("after removing each while ranging: %+v", ws)
	}
	var one watcherSet
	one.add(a)
	for x := range one.all() {
		one.remove(x)
	}
	if one.len() != 0 || one.has(a) {
		t.Fatalf("one watcher removed while ranging: %+v", one)
	}
}
