package leasetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/tablease/tablease/lease"
)

// eventTests are the events part of the suite (lease.Feed and lease.Presence).
var eventTests = []struct {
	name string
	run  func(t *testing.T, newTarget Factory)
}{
	{"a watch without an event id starts from a snapshot", testWatchSnapshot},
	{"each change produces exactly its events, in order", testEventsOfEachChange},
	{"an expiry is announced once, within a second, with no call touching the session", testExpiryAnnounced},
	{"a call that finds an expired lease announces the expiry before its own event", testExpiryAnnouncedByACall},
	{"a watch resumed from the last event seen replays exactly what it missed", testResume},
	{"an event id older than the log starts from a snapshot", testTooOld},
	{"a watch carries only the events of its own user and session", testWatchSeparate},
	{"a watcher that does not read ends with a resync instead of queueing without bound", testSlowWatcher},
	{"events under racing calls tell exactly the story of the changes", testRacingEvents},
	{"a watch ends with its context and with Close", testWatchEnds},
	{"closing the engine ends its watches", testCloseEndsWatches},
	{"invalid arguments to watches and presence are refused", testEventsInvalid},
	{"presence lists the connected tabs and announces joins and leaves", testPresence},
	{"presence entries that are not refreshed expire and their tabs leave", testPresenceExpiry},
	{"a session lists at most lease.MaxPresence connections; refreshes go on", testPresenceLimit},
	{"numbered joins and leaves of a connection apply in their numbers' order", testPresenceOrder},
	{"events and presence reach another instance", testPeerEvents},
	{"an expiry is announced once when two instances watch the session", testPeerExpiry},
}

func testWatchSnapshot(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	feed := f.feed()
	key := lease.Key{User: "alice", Session: "doc-1"}

	w := f.watch(feed, key, "")
	if w.w.Resumed || w.w.Position != "" {
		t.Errorf("watch of a session that never had a lease: Resumed %v, Position %q; want a snapshot before any event", w.w.Resumed, w.w.Position)
	}
	if s := w.w.Snapshot; s.Held || s.Epoch != 0 || s.Transitions != 0 {
		t.Errorf("Snapshot of a session that never had a lease = %+v, want free at epoch 0", s)
	}

	a := f.acquire(key, "tab-a", long, lease.ModeTry)
	ev := w.next()
	wantEvents(t, "the events of a grant", []lease.Event{ev}, granted(a.Epoch, holder("tab-a")))
	if !nearTime(ev.At, a.GrantedAt) {
		t.Errorf("granted At = %v, want the grant's time %v", ev.At, a.GrantedAt)
	}

	again := f.watch(feed, key, "")
	if again.w.Resumed || len(again.w.Replay) != 0 {
		t.Errorf("a second watch without an id: Resumed %v, %d replayed; want a snapshot", again.w.Resumed, len(again.w.Replay))
	}
	if again.w.Position != ev.ID {
		t.Errorf("Position = %q, want the id of the last event %q", again.w.Position, ev.ID)
	}
	if s := again.w.Snapshot; !s.HeldBy("tab-a", a.Epoch) || s.Holder != holder("tab-a") || !nearTime(s.ExpiresAt, a.ExpiresAt) {
		t.Errorf("Snapshot = %+v, want the grant %+v", s, a)
	}
}

func testEventsOfEachChange(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	feed := f.feed()
	key := lease.Key{User: "alice", Session: "doc-1"}
	w := f.watch(feed, key, "")

	a := f.acquire(key, "tab-a", long, lease.ModeTry)
	// The holder acquiring again unchanged: nothing. Hidden, then renamed: updated twice.
	f.acquire(key, "tab-a", long, lease.ModeTry)
	hidden := lease.Holder{TabID: "tab-a", Label: holder("tab-a").Label, Hidden: true}
	f.acquireReq(lease.AcquireRequest{Key: key, Holder: hidden, TTL: long})
	renamed := lease.Holder{TabID: "tab-a", Label: "renamed", Hidden: true}
	f.acquireReq(lease.AcquireRequest{Key: key, Holder: renamed, TTL: long, Mode: lease.ModeTakeover})
	// A renew that keeps the flag: nothing. One that changes it: updated.
	f.renew(key, "tab-a", a.Epoch, long, true)
	f.renew(key, "tab-a", a.Epoch, long, false)
	visible := lease.Holder{TabID: "tab-a", Label: "renamed"}

	_, err := f.eng.Renew(f.ctx(), lease.RenewRequest{Key: key, TabID: "tab-b", Epoch: a.Epoch, Hidden: true})
	wantLost(t, "Renew by another tab", err)
	_, err = f.eng.Acquire(f.ctx(), lease.AcquireRequest{Key: key, Holder: holder("tab-b"), TTL: long})
	wantHeld(t, "Acquire by another tab", err)
	f.get(key)
	f.check(key, "tab-a", a.Epoch)

	b := f.acquire(key, "tab-b", long, lease.ModeTakeover)
	f.wantReleased(key, "tab-a", a.Epoch, false) // stale: nothing
	f.wantReleased(key, "tab-b", b.Epoch, true)
	f.wantReleased(key, "tab-b", b.Epoch, true) // retried: nothing
	_, err = f.eng.Renew(f.ctx(), lease.RenewRequest{Key: key, TabID: "tab-b", Epoch: b.Epoch})
	wantLost(t, "Renew after release", err)
	c := f.acquire(key, "tab-c", long, lease.ModeTry) // the fence: nothing may come before it

	wanted := []want{
		granted(a.Epoch, holder("tab-a")),
		updated(a.Epoch, hidden),
		updated(a.Epoch, renamed),
		updated(a.Epoch, visible),
		takenOver(b.Epoch, holder("tab-b"), "tab-a", a.Epoch),
		released("tab-b", b.Epoch),
		granted(c.Epoch, holder("tab-c")),
	}
	got := w.nextN(len(wanted))
	wantEvents(t, "the events of the changes", got, wanted...)
	if t.Failed() {
		return
	}
	if !nearTime(got[4].At, b.GrantedAt) {
		t.Errorf("taken_over At = %v, want the takeover's time %v", got[4].At, b.GrantedAt)
	}
	if got[5].At.Before(b.GrantedAt) || got[5].At.After(c.GrantedAt) {
		t.Errorf("released At = %v, want it between the takeover %v and the next grant %v", got[5].At, b.GrantedAt, c.GrantedAt)
	}

	// The log tells the same story to a watch that resumes after the first event.
	r := f.watch(feed, key, got[0].ID)
	if !r.w.Resumed {
		t.Fatalf("a watch after the first event was not resumed")
	}
	wantEvents(t, "the events replayed after the first", r.w.Replay, wanted[1:]...)
	for i, ev := range r.w.Replay {
		if ev.ID != got[i+1].ID {
			t.Errorf("replayed event %d has id %s, but was delivered with id %s", i+1, ev.ID, got[i+1].ID)
		}
	}
}

func testExpiryAnnounced(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	feed := f.feed()
	key := lease.Key{User: "alice", Session: "doc-1"}
	watchers := []*watcher{f.watch(feed, key, ""), f.watch(feed, key, "")}

	const ttl = 200 * time.Millisecond
	a := f.acquire(key, "tab-a", ttl, lease.ModeTry)
	due := time.Now().Add(ttl + expiryBound + eventSlack)
	var ids []string
	for i, w := range watchers {
		wantEvents(t, fmt.Sprintf("watcher %d: the first event", i), []lease.Event{w.next()}, granted(a.Epoch, holder("tab-a")))
		ev := w.next()
		if time.Now().After(due) {
			t.Errorf("watcher %d: expired came more than %v after the expiry", i, expiryBound+eventSlack)
		}
		wantEvents(t, fmt.Sprintf("watcher %d: the event of the expiry", i), []lease.Event{ev}, expired("tab-a", a.Epoch))
		if !nearTime(ev.At, a.ExpiresAt) {
			t.Errorf("watcher %d: expired At = %v, want the lease's ExpiresAt %v", i, ev.At, a.ExpiresAt)
		}
		ids = append(ids, ev.ID)
	}
	if ids[0] != ids[1] {
		t.Errorf("the two watchers got the expiry with ids %s and %s: it was announced twice", ids[0], ids[1])
	}

	// Calls that see the expired lease now announce nothing more.
	f.get(key)
	_, err := f.eng.Renew(f.ctx(), lease.RenewRequest{Key: key, TabID: "tab-a", Epoch: a.Epoch})
	wantLost(t, "Renew after expiry", err)
	b := f.acquire(key, "tab-b", long, lease.ModeTry)
	for i, w := range watchers {
		wantEvents(t, fmt.Sprintf("watcher %d: the event after the expiry", i), []lease.Event{w.next()}, granted(b.Epoch, holder("tab-b")))
	}
}

func testExpiryAnnouncedByACall(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	feed := f.feed()
	clock := lease.Key{User: "alice", Session: "clock"} // read to follow the store's clock
	for i, tc := range []struct {
		name string
		call func(key lease.Key, a lease.Lease) []want // makes the call, answers its own events
	}{
		{"an acquire by another tab", func(key lease.Key, a lease.Lease) []want {
			b := f.acquire(key, "tab-b", long, lease.ModeTry)
			return []want{granted(b.Epoch, holder("tab-b"))}
		}},
		{"an acquire by the same tab", func(key lease.Key, a lease.Lease) []want {
			b := f.acquire(key, "tab-a", long, lease.ModeTry)
			if b.Epoch <= a.Epoch {
				t.Errorf("acquire after expiry: epoch %d, want above %d", b.Epoch, a.Epoch)
			}
			return []want{granted(b.Epoch, holder("tab-a"))}
		}},
		{"a takeover", func(key lease.Key, a lease.Lease) []want {
			b := f.acquire(key, "tab-b", long, lease.ModeTakeover)
			return []want{granted(b.Epoch, holder("tab-b"))}
		}},
		{"a renew", func(key lease.Key, a lease.Lease) []want {
			_, err := f.eng.Renew(f.ctx(), lease.RenewRequest{Key: key, TabID: "tab-a", Epoch: a.Epoch, Hidden: true})
			wantLost(t, "Renew after expiry", err)
			return nil
		}},
		{"a release", func(key lease.Key, a lease.Lease) []want {
			f.wantReleased(key, "tab-a", a.Epoch, false)
			return nil
		}},
		{"a get", func(key lease.Key, a lease.Lease) []want {
			if g := f.get(key); g.Held {
				t.Errorf("Get after expiry = %+v, want free", g)
			}
			return nil
		}},
		{"a check", func(key lease.Key, a lease.Lease) []want {
			_, err := f.eng.Check(f.ctx(), key, "tab-a", a.Epoch)
			wantLost(t, "Check after expiry", err)
			return nil
		}},
	} {
		// The position of the grant, from a watch that ends before the lease does: nobody
		// watches the session when it expires. A watch that comes after the expiry (a slow
		// machine) announces it itself, so the case starts again in a new session with a TTL
		// twice as long.
		var key lease.Key
		var a lease.Lease
		var pos string
		for ttl, j := f.limits.Min, 0; ; ttl, j = 2*ttl, j+1 {
			key = lease.Key{User: "alice", Session: fmt.Sprintf("doc-%d-%d", i, j)}
			a = f.acquire(key, "tab-a", ttl, lease.ModeTry)
			w := f.watch(feed, key, "")
			pos = w.w.Position
			w.w.Close()
			if w.w.Snapshot.HeldBy("tab-a", a.Epoch) {
				break
			}
			if 2*ttl > long {
				t.Fatalf("the lease of %s expired before a watch right after its grant, with TTLs up to %v", tc.name, ttl)
			}
		}
		f.waitStore(clock, a.ExpiresAt.Add(slack))

		own := tc.call(key, a)
		r := f.watch(feed, key, pos)
		if !r.w.Resumed {
			t.Errorf("after %s: a watch after the grant was not resumed", tc.name)
			continue
		}
		wantEvents(t, "the events after "+tc.name, r.w.Replay, append([]want{expired("tab-a", a.Epoch)}, own...)...)
		if len(r.w.Replay) > 0 && !nearTime(r.w.Replay[0].At, a.ExpiresAt) {
			t.Errorf("after %s: expired At = %v, want the lease's ExpiresAt %v", tc.name, r.w.Replay[0].At, a.ExpiresAt)
		}
		// Further calls announce nothing more.
		f.get(key)
		if again := f.watch(feed, key, pos); again.w.Position != r.w.Position {
			t.Errorf("after %s and a Get: position moved from %s to %s, want no new event", tc.name, r.w.Position, again.w.Position)
		}
	}
}

func testResume(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	feed := f.feed()
	key := lease.Key{User: "alice", Session: "doc-1"}
	w := f.watch(feed, key, "")
	a := f.acquire(key, "tab-a", long, lease.ModeTry)
	f.renew(key, "tab-a", a.Epoch, long, true)
	seen := w.nextN(2)
	w.w.Close()
	last, err := lease.ParseEventID(seen[1].ID)
	if err != nil {
		t.Fatal(err)
	}
	// The events missed get ids of a later millisecond, so that the ids of the log have a gap.
	f.waitStore(key, time.UnixMilli(int64(last.Millis)+1))

	// Missed while disconnected.
	b := f.acquire(key, "tab-b", long, lease.ModeTakeover)
	f.wantReleased(key, "tab-b", b.Epoch, true)
	c := f.acquire(key, "tab-c", long, lease.ModeTry)

	r := f.watch(feed, key, seen[1].ID)
	if !r.w.Resumed {
		t.Fatalf("a watch after the last event seen was not resumed")
	}
	wantEvents(t, "the events replayed", r.w.Replay,
		takenOver(b.Epoch, holder("tab-b"), "tab-a", a.Epoch),
		released("tab-b", b.Epoch),
		granted(c.Epoch, holder("tab-c")))
	if s := r.w.Snapshot; !s.HeldBy("tab-c", c.Epoch) {
		t.Errorf("Snapshot of the resumed watch = %+v, want tab-c at %d", s, c.Epoch)
	}
	// Then it goes on live.
	d := f.acquire(key, "tab-d", long, lease.ModeTakeover)
	wantEvents(t, "the first live event after the replay", []lease.Event{r.next()}, takenOver(d.Epoch, holder("tab-d"), "tab-c", c.Epoch))

	// Resuming from the newest event replays nothing.
	now := f.watch(feed, key, r.last.String())
	if !now.w.Resumed || len(now.w.Replay) != 0 || now.w.Position != r.last.String() {
		t.Errorf("a watch after the newest event: Resumed %v, %d replayed, Position %q; want resumed with nothing to replay at %s",
			now.w.Resumed, len(now.w.Replay), now.w.Position, r.last)
	}

	// An id the log never had, after its newest event, is unknown: a snapshot.
	future := lease.EventID{Millis: r.last.Millis + 3_600_000}.String()
	if x := f.watch(feed, key, future); x.w.Resumed {
		t.Errorf("a watch after an id from the future was resumed, want a snapshot")
	} else if !x.w.Snapshot.HeldBy("tab-d", d.Epoch) {
		t.Errorf("Snapshot = %+v, want tab-d at %d", x.w.Snapshot, d.Epoch)
	}
	// So is an id between two events of the log that none of them has.
	between := lease.EventID{Millis: last.Millis, Seq: last.Seq + 1}
	if x := f.watch(feed, key, between.String()); x.w.Resumed {
		t.Errorf("a watch after %s, within the log but not one of its ids, was resumed, want a snapshot", between)
	}
	// So is an id of the session's log for a session that has no log.
	other := lease.Key{User: "alice", Session: "doc-2"}
	if x := f.watch(feed, other, seen[0].ID); x.w.Resumed {
		t.Errorf("a watch of a session without events after an id was resumed, want a snapshot")
	}
}

func testTooOld(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	feed := f.feed()
	key := lease.Key{User: "alice", Session: "doc-1"}
	a := f.acquire(key, "tab-a", long, lease.ModeTry)
	w := f.watch(feed, key, "")
	first := w.w.Position
	w.w.Close()

	// Renews that flip the hidden flag each add an event, until the first one is gone from the log.
	const most = 20000
	hidden := false
	for n := 1; ; n++ {
		hidden = !hidden
		f.renew(key, "tab-a", a.Epoch, long, hidden)
		if n%32 != 0 {
			continue
		}
		x, err := feed.Watch(f.ctx(), key, first)
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		x.Close()
		if x.Resumed {
			if n >= most {
				t.Fatalf("after %d events the log still replays from the first: it is not bounded", n)
			}
			continue
		}
		if len(x.Replay) != 0 {
			t.Errorf("a watch after an id older than the log replayed %d events, want none", len(x.Replay))
		}
		if s := x.Snapshot; !s.HeldBy("tab-a", a.Epoch) || s.Holder.Hidden != hidden {
			t.Errorf("Snapshot after %d events = %+v, want tab-a at %d with hidden %v", n, s, a.Epoch, hidden)
		}
		t.Logf("the log dropped the first event after %d more", n)
		return
	}
}

func testWatchSeparate(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	feed := f.feed()
	key := lease.Key{User: "alice", Session: "doc-1"}
	w := f.watch(feed, key, "")
	for _, other := range []lease.Key{
		{User: "bob", Session: "doc-1"},
		{User: "alice", Session: "doc-2"},
		{User: "alice", Session: "doc-10"},
		{User: "alice:doc", Session: "1"},
	} {
		o := f.acquire(other, "tab-a", long, lease.ModeTry)
		f.renew(other, "tab-a", o.Epoch, long, true)
		f.acquire(other, "tab-b", long, lease.ModeTakeover)
		if _, err := f.presence().Join(f.ctx(), other, "conn-1", lease.Tab{TabID: "tab-a"}, 0); err != nil {
			t.Fatalf("Join(%+v): %v", other, err)
		}
	}
	a := f.acquire(key, "tab-a", long, lease.ModeTry)
	wantEvents(t, "the first event of alice's doc-1", []lease.Event{w.next()}, granted(a.Epoch, holder("tab-a")))
}

func testSlowWatcher(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	feed := f.feed()
	key := lease.Key{User: "alice", Session: "doc-1"}
	a := f.acquire(key, "tab-a", long, lease.ModeTry)
	w := f.watch(feed, key, "")
	buffer := w.w.Buffer()

	// Events the watcher never reads, until the engine gives up on it.
	const most = 20000
	hidden, n := false, 0
	deadline := time.Now().Add(waitFor)
	for !errors.Is(w.w.Err(), lease.ErrResync) {
		if n < most {
			hidden = !hidden
			f.renew(key, "tab-a", a.Epoch, long, hidden)
			n++
			continue
		}
		// Events may still be on their way to the watcher.
		if time.Now().After(deadline) {
			t.Fatalf("a watcher that read none of %d events was not ended with ErrResync (Err = %v)", n, w.w.Err())
		}
		time.Sleep(pollEvery)
	}
	evs, err := w.ended()
	wantErr(t, "Err of the watch that fell behind", err, lease.ErrResync)
	if len(evs) > buffer || len(evs) >= n {
		t.Errorf("the watch buffered %d of %d events, want at most its buffer of %d", len(evs), n, buffer)
	}
	last := lease.EventID{}
	for i, ev := range evs {
		id, perr := lease.ParseEventID(ev.ID)
		if perr != nil || id.Compare(last) <= 0 || ev.Type != lease.EventUpdated || ev.Key != key {
			t.Fatalf("buffered event %d = %s, want an update with an id after %s", i, show(ev), last)
		}
		last = id
	}

	// Watching again from the last event handled resumes or starts from a snapshot.
	again := f.watch(feed, key, last.String())
	if s := again.w.Snapshot; !s.HeldBy("tab-a", a.Epoch) || s.Holder.Hidden != hidden {
		t.Errorf("Snapshot of the new watch = %+v, want tab-a at %d, hidden %v", s, a.Epoch, hidden)
	}
	if again.w.Resumed {
		for _, ev := range again.w.Replay {
			if ev.Type != lease.EventUpdated {
				t.Fatalf("replayed %s, want only updates", show(ev))
			}
		}
	}
	b := f.acquire(key, "tab-b", long, lease.ModeTakeover)
	wantEvents(t, "the first live event of the new watch", []lease.Event{again.next()}, takenOver(b.Epoch, holder("tab-b"), "tab-a", a.Epoch))
}

// testRacingEvents races tabs on one session, then replays the session's log and checks that it is
// exactly the story of what the calls answered: every grant once, in order of epochs, each event
// consistent with the state the events before it describe, and the end state that of Get.
func testRacingEvents(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	feed := f.feed()
	key := lease.Key{User: "alice", Session: "doc-1"}
	// An event before the race, for the replay to start after.
	a0 := f.acquire(key, "tab-0", f.limits.Min, lease.ModeTry)
	start := f.watch(feed, key, "")
	pos := start.w.Position
	start.w.Close()

	const workers, ops = 8, 20 // fewer events than lease.DefaultEventLogLen
	var (
		mu       sync.Mutex
		grants   = map[int64]string{} // epoch → tab, from the answers; guarded by mu
		releases int                  // releases answered true; guarded by mu
	)
	ttls := []time.Duration{f.limits.Min, 50 * time.Millisecond, 200 * time.Millisecond}
	var wg sync.WaitGroup
	for i := range workers {
		tab := fmt.Sprintf("tab-%d", i+1)
		rng := rand.New(rand.NewPCG(uint64(i), 7))
		wg.Go(func() {
			var mine int64
			for range ops {
				ttl := ttls[rng.IntN(len(ttls))]
				switch p := rng.IntN(100); {
				case p < 45:
					mode := lease.ModeTry
					if p < 10 {
						mode = lease.ModeTakeover
					}
					l, err := f.eng.Acquire(f.ctx(), lease.AcquireRequest{Key: key, Holder: holder(tab), TTL: ttl, Mode: mode})
					switch {
					case err == nil:
						mu.Lock()
						grants[l.Epoch] = tab
						mu.Unlock()
						mine = l.Epoch
					case !errors.Is(err, lease.ErrHeld):
						t.Errorf("%s: Acquire: %v", tab, err)
					}
				case p < 65 && mine != 0:
					_, err := f.eng.Renew(f.ctx(), lease.RenewRequest{Key: key, TabID: tab, Epoch: mine, TTL: ttl, Hidden: p%2 == 0})
					if errors.Is(err, lease.ErrLost) {
						mine = 0
					} else if err != nil {
						t.Errorf("%s: Renew: %v", tab, err)
					}
				case p < 85 && mine != 0:
					r, err := f.eng.Release(f.ctx(), lease.ReleaseRequest{Key: key, TabID: tab, Epoch: mine})
					if err != nil {
						t.Errorf("%s: Release: %v", tab, err)
					} else if r.Released {
						mu.Lock()
						releases++
						mu.Unlock()
					}
					mine = 0
				case p < 95:
					if _, err := f.eng.Get(f.ctx(), key); err != nil {
						t.Errorf("%s: Get: %v", tab, err)
					}
				default:
					time.Sleep(time.Duration(1+rng.IntN(20)) * time.Millisecond) // a stalling tab, not a synchronisation
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	r := f.watch(feed, key, pos)
	if !r.w.Resumed {
		t.Fatalf("the log does not hold the %d or so events of the race (a log shorter than %d?)", workers*ops, lease.DefaultEventLogLen)
	}
	end := r.w.Snapshot // the state at the end of the replay

	// Replay the events over the state before the race: tab-0's lease, or none when the watch
	// before the race announced its expiry (a slow machine: its TTL is the minimum).
	type state struct {
		tab   string
		epoch int64
	}
	cur, last := state{}, a0.Epoch
	if start.w.Snapshot.HeldBy("tab-0", a0.Epoch) {
		cur = state{"tab-0", a0.Epoch}
	}
	seenGrants := map[int64]bool{}
	nReleased := 0
	for _, ev := range r.w.Replay {
		bad := func(why string) { t.Errorf("%s: %s (state before: %+v)", show(ev), why, cur) }
		switch ev.Type {
		case lease.EventGranted, lease.EventTakenOver:
			if ev.Holder == nil || grants[ev.Epoch] != ev.Holder.TabID || seenGrants[ev.Epoch] {
				bad("not a grant answered to that tab, or announced twice")
			}
			if ev.Epoch <= last {
				bad("a grant not above the epochs before it")
			}
			if ev.Type == lease.EventGranted && cur.tab != "" {
				bad("granted while the events say the lease is held: an end was not announced")
			}
			if ev.Type == lease.EventTakenOver && (cur.tab == "" || ev.Previous == nil || *ev.Previous != lease.Previous{TabID: cur.tab, Epoch: cur.epoch}) {
				bad("taken over from someone else than the holder")
			}
			seenGrants[ev.Epoch] = true
			last = ev.Epoch
			if ev.Holder != nil {
				cur = state{ev.Holder.TabID, ev.Epoch}
			}
		case lease.EventUpdated:
			if ev.Holder == nil || cur != (state{ev.Holder.TabID, ev.Epoch}) {
				bad("updated a lease that is not the holder's")
			}
		case lease.EventReleased, lease.EventExpired:
			if ev.Previous == nil || cur != (state{ev.Previous.TabID, ev.Epoch}) || ev.Holder != nil {
				bad("ended a lease that is not the current one")
			}
			if ev.Type == lease.EventReleased {
				nReleased++
			}
			cur = state{}
		default:
			bad("an event the race cannot cause")
		}
	}
	for epoch, tab := range grants {
		if !seenGrants[epoch] {
			t.Errorf("the grant of epoch %d to %s has no event", epoch, tab)
		}
	}
	if nReleased != releases {
		t.Errorf("%d released events, but %d releases answered released", nReleased, releases)
	}
	if end.Held != (cur.tab != "") || (end.Held && (end.Holder.TabID != cur.tab || end.Epoch != cur.epoch)) {
		t.Errorf("the events end with %+v, but the snapshot at their end is %+v", cur, end)
	}
}

func testWatchEnds(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	feed := f.feed()
	key := lease.Key{User: "alice", Session: "doc-1"}

	ctx, cancel := context.WithCancel(f.ctx())
	w := f.watchCtx(ctx, feed, key, "")
	cancel()
	_, err := w.ended()
	wantErr(t, "Err of a watch whose context was canceled", err, context.Canceled)

	c := f.watch(feed, key, "")
	c.w.Close()
	c.w.Close()
	if _, err := c.ended(); err != nil {
		t.Errorf("Err of a closed watch = %v, want nil", err)
	}

	// The others go on.
	live := f.watch(feed, key, "")
	a := f.acquire(key, "tab-a", long, lease.ModeTry)
	wantEvents(t, "the event of a watch that was not closed", []lease.Event{live.next()}, granted(a.Epoch, holder("tab-a")))
	// A canceled context refuses the watch, or ends it at once.
	if x, err := feed.Watch(ctx, key, ""); err == nil {
		defer x.Close()
		for range x.Events() {
		}
		wantErr(t, "Err of a watch started with a canceled context", x.Err(), context.Canceled)
	}
}

func testCloseEndsWatches(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	feed := f.feed()
	keys := []lease.Key{{User: "alice", Session: "doc-1"}, {User: "bob", Session: "doc-1"}}
	var ws []*watcher
	for _, key := range keys {
		f.acquire(key, "tab-a", long, lease.ModeTry)
		ws = append(ws, f.watch(feed, key, ""), f.watch(feed, key, ""))
	}
	if err := f.eng.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for i, w := range ws {
		_, err := w.ended()
		if !errors.Is(err, lease.ErrUnavailable) {
			t.Errorf("watch %d after Close: Err = %v, want lease.ErrUnavailable", i, err)
		}
	}
	if x, err := feed.Watch(f.ctx(), keys[0], ""); !errors.Is(err, lease.ErrUnavailable) {
		if err == nil {
			x.Close()
		}
		t.Errorf("Watch after Close = %v, want lease.ErrUnavailable", err)
	}
}

func testEventsInvalid(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	feed := f.feed()
	good := lease.Key{User: "alice", Session: "doc-1"}
	for _, tc := range []struct {
		name  string
		key   lease.Key
		after string
	}{
		{"an empty user", lease.Key{Session: "doc-1"}, ""},
		{"a session with a slash", lease.Key{User: "alice", Session: "a/b"}, ""},
		{"an id that is not a number", good, "abc"},
		{"an id without a sequence", good, "1700000000000"},
		{"an id with a sign", good, "-1-0"},
		{"an id with a space", good, "1 -0"},
		{"an id too large", good, "99999999999999999999999-0"},
	} {
		w, err := feed.Watch(f.ctx(), tc.key, tc.after)
		if err == nil {
			w.Close()
		}
		wantInvalid(t, "Watch with "+tc.name, err)
	}

	p := f.presence()
	tab := lease.Tab{TabID: "tab-a", Label: "A"}
	for _, tc := range []struct {
		name string
		key  lease.Key
		conn string
		tab  lease.Tab
	}{
		{"an invalid key", lease.Key{User: "alice", Session: ""}, "conn-1", tab},
		{"an empty connection", good, "", tab},
		{"a connection with a space", good, "conn 1", tab},
		{"an empty tab id", good, "conn-1", lease.Tab{}},
		{"a label with a newline", good, "conn-1", lease.Tab{TabID: "tab-a", Label: "a\nb"}},
	} {
		_, err := p.Join(f.ctx(), tc.key, tc.conn, tc.tab, 0)
		wantInvalid(t, "Join with "+tc.name, err)
		if tc.tab.Label == tab.Label {
			wantInvalid(t, "Leave with "+tc.name, p.Leave(f.ctx(), tc.key, tc.conn, tc.tab.TabID, 0))
		}
	}
	_, err := p.Tabs(f.ctx(), lease.Key{User: "alice", Session: ".."})
	wantInvalid(t, "Tabs with an invalid key", err)
	if tabs, err := p.Tabs(f.ctx(), good); err != nil || len(tabs) != 0 {
		t.Errorf("Tabs after the invalid calls = %+v, %v; want none", tabs, err)
	}
}

func testPresence(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	feed, p := f.feed(), f.presence()
	key := lease.Key{User: "alice", Session: "doc-1"}
	w := f.watch(feed, key, "")
	join := func(conn string, tab lease.Tab) {
		t.Helper()
		ttl, err := p.Join(f.ctx(), key, conn, tab, 0)
		if err != nil {
			t.Fatalf("Join(%s, %+v): %v", conn, tab, err)
		}
		if ttl <= 0 {
			t.Errorf("Join(%s, %+v) answered a TTL of %v, want it positive", conn, tab, ttl)
		}
	}
	leave := func(conn, tab string) {
		t.Helper()
		if err := p.Leave(f.ctx(), key, conn, tab, 0); err != nil {
			t.Fatalf("Leave(%s, %s): %v", conn, tab, err)
		}
	}
	tabs := func() []lease.Tab {
		t.Helper()
		tabs, err := p.Tabs(f.ctx(), key)
		if err != nil {
			t.Fatalf("Tabs: %v", err)
		}
		return tabs
	}

	join("conn-1", lease.Tab{TabID: "tab-a", Label: "A"})
	ev := w.next()
	wantEvents(t, "the event of the first join", []lease.Event{ev}, tabJoined("tab-a"))
	if ev.Tab != nil && (ev.Tab.Label != "A" || ev.Tab.Hidden || ev.Tab.ConnectedAt.IsZero()) {
		t.Errorf("joined Tab = %+v, want tab-a labelled A, visible, with its ConnectedAt", *ev.Tab)
	}
	join("conn-2", lease.Tab{TabID: "tab-a", Label: "A2", Hidden: true}) // a second connection, another label: changed
	ev = w.next()
	wantEvents(t, "a listed tab's new label", []lease.Event{ev}, tabChanged("tab-a"))
	if ev.Tab != nil && (ev.Tab.Label != "A2" || !ev.Tab.Hidden) {
		t.Errorf("changed Tab = %+v, want tab-a labelled A2, hidden", *ev.Tab)
	}
	join("conn-1", lease.Tab{TabID: "tab-a", Label: "A2", Hidden: true}) // the tab as it is listed: nothing
	join("conn-2", lease.Tab{TabID: "tab-a", Label: "A2", Hidden: true}) // a refresh as it was: nothing
	join("conn-3", lease.Tab{TabID: "tab-b", Label: "B"})

	got := tabs()
	if len(got) != 2 || got[0].TabID != "tab-a" || got[1].TabID != "tab-b" {
		t.Fatalf("Tabs = %+v, want tab-a then tab-b", got)
	}
	if got[0].Label != "A2" || !got[0].Hidden || ev.Tab == nil || !got[0].ConnectedAt.Equal(ev.Tab.ConnectedAt) {
		t.Errorf("Tabs lists tab-a as %+v, want the label and flag of its last join, connected since its first (%+v)", got[0], ev.Tab)
	}
	if got[1].ConnectedAt.Before(got[0].ConnectedAt) {
		t.Errorf("tab-b connected at %v, before tab-a at %v, but is listed after it", got[1].ConnectedAt, got[0].ConnectedAt)
	}
	if snap := f.watch(feed, key, ""); len(snap.w.Tabs) != 2 || snap.w.Tabs[0].TabID != "tab-a" || snap.w.Tabs[1].TabID != "tab-b" {
		t.Errorf("Watch.Tabs = %+v, want tab-a and tab-b", snap.w.Tabs)
	}

	leave("conn-1", "tab-a") // tab-a is still connected through conn-2: nothing
	if got := tabs(); len(got) != 2 {
		t.Errorf("Tabs after one of tab-a's connections left = %+v, want tab-a and tab-b", got)
	}
	leave("conn-2", "tab-a")
	leave("conn-2", "tab-a") // again: nothing
	leave("conn-9", "tab-z") // never joined: nothing
	leave("conn-3", "tab-a") // the connection of another tab: nothing
	if got := tabs(); len(got) != 1 || got[0].TabID != "tab-b" || got[0].Label != "B" {
		t.Errorf("Tabs after tab-a left = %+v, want tab-b", got)
	}
	leave("conn-3", "tab-b")
	wantEvents(t, "the events of presence", w.nextN(3), tabJoined("tab-b"), tabLeft("tab-a", ""), tabLeft("tab-b", ""))
	if got := tabs(); len(got) != 0 {
		t.Errorf("Tabs after every tab left = %+v, want none", got)
	}

	// Presence is per user and session.
	join("conn-4", lease.Tab{TabID: "tab-c"})
	for _, other := range []lease.Key{{User: "bob", Session: "doc-1"}, {User: "alice", Session: "doc-2"}} {
		if got, err := p.Tabs(f.ctx(), other); err != nil || len(got) != 0 {
			t.Errorf("Tabs(%+v) = %+v, %v; want none", other, got, err)
		}
	}
	// A tab that joins again after leaving is announced again.
	leave("conn-4", "tab-c")
	join("conn-5", lease.Tab{TabID: "tab-c"})
	wantEvents(t, "the events of a tab that comes back", w.nextN(3), tabJoined("tab-c"), tabLeft("tab-c", ""), tabJoined("tab-c"))
}

// testPresenceOrder: a client numbers the writes of its tab's entry (PUT …/tabs/{tabId} and the
// DELETE of its page's end, whose requests may arrive in either order); the store applies none
// whose number is not above the latest it applied, and writes without numbers as ever.
func testPresenceOrder(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	feed, p := f.feed(), f.presence()
	key := lease.Key{User: "alice", Session: "doc-1"}
	w := f.watch(feed, key, "")
	join := func(conn string, tab lease.Tab, seq int64) {
		t.Helper()
		if ttl, err := p.Join(f.ctx(), key, conn, tab, seq); err != nil || ttl <= 0 {
			t.Fatalf("Join(%s, %+v, %d) = %v, %v; want a TTL", conn, tab, seq, ttl, err)
		}
	}
	leave := func(conn, tab string, seq int64) {
		t.Helper()
		if err := p.Leave(f.ctx(), key, conn, tab, seq); err != nil {
			t.Fatalf("Leave(%s, %s, %d): %v", conn, tab, seq, err)
		}
	}
	listed := func(what string, want ...lease.Tab) {
		t.Helper()
		got, err := p.Tabs(f.ctx(), key)
		if err != nil {
			t.Fatalf("Tabs: %v", err)
		}
		ok := len(got) == len(want)
		for i := range got {
			ok = ok && got[i].TabID == want[i].TabID && got[i].Label == want[i].Label
		}
		if !ok {
			t.Errorf("Tabs %s = %+v, want %+v", what, got, want)
		}
	}
	other := lease.Tab{TabID: "tab-o", Label: "O"}
	join("conn-o", other, 0)

	// The page's DELETE (7) overtakes the PUT it sent just before (6): the PUT lists nothing.
	a := lease.Tab{TabID: "tab-a", Label: "A"}
	join("conn-a", a, 5)
	leave("conn-a", "tab-a", 7)
	join("conn-a", a, 6)
	join("conn-a", a, 7)
	listed("after a PUT numbered below the DELETE that came first", other)
	// A page restored from the back/forward cache lists itself again, with a higher number.
	join("conn-a", a, 8)
	listed("after a PUT numbered above the DELETE", other, a)
	// Between PUTs, and a DELETE below the PUT applied: the later write stands.
	join("conn-a", lease.Tab{TabID: "tab-a", Label: "A10"}, 10)
	join("conn-a", lease.Tab{TabID: "tab-a", Label: "A9"}, 9)
	leave("conn-a", "tab-a", 9)
	listed("after a PUT and a DELETE numbered below the PUT applied", other, lease.Tab{TabID: "tab-a", Label: "A10"})

	// A DELETE that reaches the store before the tab's first PUT: the PUT lists nothing.
	b := lease.Tab{TabID: "tab-b", Label: "B"}
	leave("conn-b", "tab-b", 3)
	join("conn-b", b, 2)
	listed("after a PUT numbered below the DELETE that came before it", other, lease.Tab{TabID: "tab-a", Label: "A10"})
	join("conn-b", b, 4)
	listed("after a PUT numbered above it", other, lease.Tab{TabID: "tab-a", Label: "A10"}, b)

	// Writes without numbers are applied as ever, and keep the number recorded.
	leave("conn-b", "tab-b", 0)
	join("conn-b", b, 3)
	join("conn-b", b, 4)
	listed("after PUTs numbered up to the one applied before a DELETE without a number", other, lease.Tab{TabID: "tab-a", Label: "A10"})
	join("conn-b", b, 0)
	join("conn-b", lease.Tab{TabID: "tab-b", Label: "B4"}, 4)
	listed("after a PUT without a number", other, lease.Tab{TabID: "tab-a", Label: "A10"}, b)
	c := lease.Tab{TabID: "tab-c", Label: "C"}
	join("conn-c", c, 0)
	leave("conn-c", "tab-c", 0)
	join("conn-c", c, 0)
	listed("after a PUT, a DELETE and a PUT without numbers", other, lease.Tab{TabID: "tab-a", Label: "A10"}, b, c)

	wantEvents(t, "the events", w.nextN(8), tabJoined("tab-o"), tabJoined("tab-a"), tabLeft("tab-a", ""),
		tabJoined("tab-a"), tabChanged("tab-a"), tabJoined("tab-b"), tabLeft("tab-b", ""), tabJoined("tab-b"))
	wantEvents(t, "the events", w.nextN(3), tabJoined("tab-c"), tabLeft("tab-c", ""), tabJoined("tab-c"))

	// A session keeps at most lease.MaxPresence marks: one more forgets the one that lapses first.
	tab := func(i int) lease.Tab { return lease.Tab{TabID: fmt.Sprintf("tab-%03d", i)} }
	for i := range lease.MaxPresence + 1 {
		leave("conn-m", tab(i).TabID, 5)
	}
	join("conn-m", tab(0), 4)
	join("conn-m", tab(1), 4)
	if got, err := p.Tabs(f.ctx(), key); err != nil || len(got) != 5 || got[4].TabID != tab(0).TabID {
		t.Errorf("Tabs after PUTs below the marks of the first two of %d DELETEs = %+v, %v; want %s listed, not %s",
			lease.MaxPresence+1, got, err, tab(0).TabID, tab(1).TabID)
	}
}

func testPresenceExpiry(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	feed, p := f.feed(), f.presence()
	ttl := f.target.PresenceTTL
	if ttl <= 0 || ttl > MaxPresenceTTL {
		t.Skipf("the target's PresenceTTL is %v; the test needs one of at most %v", ttl, MaxPresenceTTL)
	}
	key := lease.Key{User: "alice", Session: "doc-1"}
	quiet := lease.Key{User: "alice", Session: "doc-quiet"} // nobody watches it
	clock := lease.Key{User: "alice", Session: "clock"}
	w := f.watch(feed, key, "")
	join := func(key lease.Key, conn, tab string) time.Time {
		t.Helper()
		got, err := p.Join(f.ctx(), key, conn, lease.Tab{TabID: tab}, 0)
		if err != nil {
			t.Fatalf("Join(%+v, %s): %v", key, conn, err)
		}
		if got != ttl {
			t.Errorf("Join answered a TTL of %v, want the target's %v", got, ttl)
		}
		return time.Now()
	}
	joinedAt := join(key, "conn-a", "tab-a")
	join(key, "conn-b", "tab-b")
	join(quiet, "conn-q", "tab-q")
	storeJoin := f.get(clock).Now
	wantEvents(t, "the joins", w.nextN(2), tabJoined("tab-a"), tabJoined("tab-b"))

	// tab-b is refreshed every quarter of the TTL, tab-a never: tab-a leaves, tab-b stays.
	refresh := time.NewTicker(ttl / 4)
	defer refresh.Stop()
	due := joinedAt.Add(ttl + expiryBound + eventSlack)
	stayUntil := time.Now().Add(2 * ttl)
	var gone []lease.Event
	deadline := time.After(waitFor)
	for len(gone) == 0 || time.Now().Before(stayUntil) {
		select {
		case <-refresh.C:
			join(key, "conn-b", "tab-b")
		case ev, open := <-w.w.Events():
			if !open {
				t.Fatalf("the watch ended: %v", w.w.Err())
			}
			if time.Now().After(due) {
				t.Errorf("%s came more than %v after the entry's expiry", show(*ev), expiryBound+eventSlack)
			}
			gone = append(gone, *ev)
		case <-deadline:
			t.Fatalf("tab-a did not leave within %v of its unrefreshed entry's TTL of %v", waitFor, ttl)
		}
	}
	wantEvents(t, "the events while tab-b is refreshed", gone, tabLeft("tab-a", lease.ReasonTimeout))
	if got, err := p.Tabs(f.ctx(), key); err != nil || len(got) != 1 || got[0].TabID != "tab-b" {
		t.Errorf("Tabs = %+v, %v; want tab-b alone", got, err)
	}
	if err := p.Leave(f.ctx(), key, "conn-b", "tab-b", 0); err != nil {
		t.Fatalf("Leave: %v", err)
	}
	wantEvents(t, "the event of the clean leave", []lease.Event{w.next()}, tabLeft("tab-b", ""))

	// Without a watcher, an expired entry is not listed either.
	f.waitStore(clock, storeJoin.Add(ttl+slack))
	if got, err := p.Tabs(f.ctx(), quiet); err != nil || len(got) != 0 {
		t.Errorf("Tabs of a session whose only entry expired = %+v, %v; want none", got, err)
	}
}

func testPeerEvents(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	feed := f.feed()
	peer := f.peer()
	var peerFeed lease.Feed = peer
	key := lease.Key{User: "alice", Session: "doc-1"}
	here, there := f.watch(feed, key, ""), f.watch(peerFeed, key, "")

	a := f.acquire(key, "tab-a", long, lease.ModeTry)
	b, err := peer.Acquire(f.ctx(), lease.AcquireRequest{Key: key, Holder: holder("tab-b"), TTL: long, Mode: lease.ModeTakeover})
	if err != nil {
		t.Fatalf("Acquire on the peer: %v", err)
	}
	wanted := []want{granted(a.Epoch, holder("tab-a")), takenOver(b.Epoch, holder("tab-b"), "tab-a", a.Epoch)}
	if _, err := peer.Join(f.ctx(), key, "conn-1", lease.Tab{TabID: "tab-c"}, 0); err != nil {
		t.Fatalf("Join on the peer: %v", err)
	}
	wanted = append(wanted, tabJoined("tab-c"))
	if got, err := f.presence().Tabs(f.ctx(), key); err != nil || len(got) != 1 || got[0].TabID != "tab-c" {
		t.Errorf("Tabs of a tab joined on the peer = %+v, %v; want tab-c", got, err)
	}
	h, th := here.nextN(len(wanted)), there.nextN(len(wanted))
	wantEvents(t, "the events on this instance", h, wanted...)
	wantEvents(t, "the events on the peer", th, wanted...)
	for i := range h {
		if i < len(th) && h[i].ID != th[i].ID {
			t.Errorf("event %d has id %s here and %s on the peer", i, h[i].ID, th[i].ID)
		}
	}
}

func testPeerExpiry(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	feed := f.feed()
	peer := f.peer()
	var peerFeed lease.Feed = peer
	key := lease.Key{User: "alice", Session: "doc-1"}
	ws := []*watcher{f.watch(feed, key, ""), f.watch(peerFeed, key, ""), f.watch(feed, key, ""), f.watch(peerFeed, key, "")}

	const ttl = 200 * time.Millisecond
	const rounds = 5
	for round := range rounds {
		tab := fmt.Sprintf("tab-%d", round)
		eng := f.eng
		if round%2 == 1 {
			eng = peer
		}
		a, err := eng.Acquire(f.ctx(), lease.AcquireRequest{Key: key, Holder: holder(tab), TTL: ttl})
		if err != nil {
			t.Fatalf("round %d: Acquire: %v", round, err)
		}
		due := time.Now().Add(ttl + expiryBound + eventSlack)
		var ids []string
		for i, w := range ws {
			wantEvents(t, fmt.Sprintf("round %d, watcher %d", round, i), w.nextN(2), granted(a.Epoch, holder(tab)), expired(tab, a.Epoch))
			if time.Now().After(due) {
				t.Errorf("round %d, watcher %d: expired came more than %v after the expiry", round, i, expiryBound+eventSlack)
			}
			ids = append(ids, w.last.String())
		}
		if len(slices.Compact(slices.Clone(ids))) != 1 {
			t.Errorf("round %d: the watchers got the expiry with ids %v: it was announced more than once", round, ids)
		}
	}
	// No second announcement of any expiry is waiting: the next event is the next grant.
	c := f.acquire(key, "tab-last", long, lease.ModeTry)
	for i, w := range ws {
		wantEvents(t, fmt.Sprintf("watcher %d after the rounds", i), []lease.Event{w.next()}, granted(c.Epoch, holder("tab-last")))
	}
}

func testPresenceLimit(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	p := f.presence()
	key := lease.Key{User: "alice", Session: "doc-1"}
	conn := func(i int) string { return fmt.Sprintf("conn-%d", i) }
	tab := func(i int) lease.Tab { return lease.Tab{TabID: fmt.Sprintf("tab-%d", i%7)} }
	for i := range lease.MaxPresence {
		if _, err := p.Join(f.ctx(), key, conn(i), tab(i), 0); err != nil {
			t.Fatalf("Join of connection %d: %v", i, err)
		}
	}
	_, err := p.Join(f.ctx(), key, conn(lease.MaxPresence), tab(0), 0)
	var le *lease.TabLimitError
	if !errors.Is(err, lease.ErrTooManyTabs) || !errors.As(err, &le) || le.Limit != lease.MaxPresence {
		t.Fatalf("Join of one connection more = %v, want a *lease.TabLimitError of %d", err, lease.MaxPresence)
	}
	// A listed connection is refreshed; the refused one was not listed.
	if _, err := p.Join(f.ctx(), key, conn(3), tab(3), 0); err != nil {
		t.Errorf("a refresh of a listed connection at the limit: %v", err)
	}
	if tabs, err := p.Tabs(f.ctx(), key); err != nil || len(tabs) != 7 {
		t.Errorf("Tabs = %d tabs, %v; want the 7 tabs of the listed connections", len(tabs), err)
	}
	// Once one leaves, a new one is listed.
	if err := p.Leave(f.ctx(), key, conn(5), tab(5).TabID, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Join(f.ctx(), key, conn(lease.MaxPresence), tab(0), 0); err != nil {
		t.Errorf("a Join after a Leave at the limit: %v", err)
	}
	// Another session of the user is not bounded by this one's list.
	if _, err := p.Join(f.ctx(), lease.Key{User: "alice", Session: "doc-2"}, conn(0), tab(0), 0); err != nil {
		t.Errorf("a Join on another session: %v", err)
	}
}
