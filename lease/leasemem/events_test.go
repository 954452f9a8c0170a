package leasemem

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tablease/tablease/lease"
)

const waitFor = 10 * time.Second

// newWatchedEngine is newEngine with a fast expiry timer, for a fake clock.
func newWatchedEngine(t *testing.T, presenceTTL time.Duration) (*Engine, *fakeClock) {
	t.Helper()
	clock := newFakeClock()
	e, err := New(Options{Limits: testLimits, Now: clock.Now, ExpiryCheckInterval: 2 * time.Millisecond, PresenceTTL: presenceTTL})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { e.Close() })
	return e, clock
}

func mustWatch(t *testing.T, e *Engine, key lease.Key, after string) *lease.Watch {
	t.Helper()
	w, err := e.Watch(ctx, key, after)
	if err != nil {
		t.Fatalf("Watch(%+v, %q): %v", key, after, err)
	}
	t.Cleanup(w.Close)
	return w
}

func next(t *testing.T, w *lease.Watch) lease.Event {
	t.Helper()
	select {
	case ev, ok := <-w.Events():
		if !ok {
			t.Fatalf("the watch ended: %v", w.Err())
		}
		return *ev
	case <-time.After(waitFor):
		t.Fatalf("no event within %v", waitFor)
	}
	return lease.Event{}
}

// waitUntil polls cond until it holds.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, waitFor)
		}
		time.Sleep(time.Millisecond)
	}
}

func (e *Engine) timerRunning() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.timerOn
}

func TestNewRefusesNegativeEventOptions(t *testing.T) {
	for name, opts := range map[string]Options{
		"a negative log":                   {EventLogLen: -1},
		"a negative watch buffer":          {WatchBuffer: -1},
		"a negative presence TTL":          {PresenceTTL: -time.Second},
		"a presence TTL under 1ms":         {PresenceTTL: time.Microsecond},
		"a negative expiry check interval": {ExpiryCheckInterval: -time.Second},
	} {
		if _, err := New(opts); !errors.Is(err, lease.ErrInvalid) {
			t.Errorf("New with %s = %v, want lease.ErrInvalid", name, err)
		}
	}
}

func TestTheExpiryTimerFollowsTheEngineClock(t *testing.T) {
	e, clock := newWatchedEngine(t, 0)
	a := mustAcquire(t, e, alice, "tab-a", 10*time.Second, lease.ModeTry)
	w := mustWatch(t, e, alice, "")
	if !e.timerRunning() {
		t.Fatal("no expiry timer with a watcher")
	}

	// Real time passes, engine time does not: nothing expires.
	select {
	case ev := <-w.Events():
		t.Fatalf("an event while the engine clock stood still: %+v", ev)
	case <-time.After(20 * time.Millisecond):
	}
	clock.Advance(10 * time.Second)
	ev := next(t, w)
	if ev.Type != lease.EventExpired || ev.Epoch != a.Epoch || !ev.At.Equal(a.ExpiresAt) {
		t.Errorf("event = %+v, want the expiry of epoch %d at %v", ev, a.Epoch, a.ExpiresAt)
	}

	// The timer stops with the last watcher.
	w.Close()
	waitUntil(t, "the timer stops when nothing is watched", func() bool { return !e.timerRunning() })
}

func TestTheExpiryTimerWakesAtTheExpiryWithARealClock(t *testing.T) {
	// A long interval: only the deadline can wake the timer in time.
	e, err := New(Options{Limits: lease.Limits{Min: 10 * time.Millisecond, Default: time.Second, Max: time.Second, HiddenMax: time.Second},
		ExpiryCheckInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	w := mustWatch(t, e, alice, "")
	a := mustAcquire(t, e, alice, "tab-a", 50*time.Millisecond, lease.ModeTry)
	if ev := next(t, w); ev.Type != lease.EventGranted {
		t.Fatalf("first event = %+v, want granted", ev)
	}
	if ev := next(t, w); ev.Type != lease.EventExpired || ev.Epoch != a.Epoch {
		t.Fatalf("second event = %+v, want expired", ev)
	}
}

func TestEventIDsCountOnWhenTheClockStallsOrStepsBack(t *testing.T) {
	e, clock := newEngine(t)
	w := mustWatch(t, e, alice, "")
	ms := clock.Now().UnixMilli()
	a := mustAcquire(t, e, alice, "tab-a", 0, lease.ModeTry)
	for i := range 3 {
		e.Renew(ctx, lease.RenewRequest{Key: alice, TabID: "tab-a", Epoch: a.Epoch, Hidden: i%2 == 0})
	}
	clock.Advance(-time.Hour)
	e.Renew(ctx, lease.RenewRequest{Key: alice, TabID: "tab-a", Epoch: a.Epoch, Hidden: false})
	for i := range 5 {
		want := fmt.Sprintf("%d-%d", ms, i)
		if ev := next(t, w); ev.ID != want {
			t.Errorf("event %d: id %s, want %s", i, ev.ID, want)
		}
	}
}

func TestTheLogKeepsItsLength(t *testing.T) {
	clock := newFakeClock()
	e, err := New(Options{Limits: testLimits, Now: clock.Now, EventLogLen: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	a := mustAcquire(t, e, alice, "tab-a", 0, lease.ModeTry)
	var ids []string
	for i := range 10 {
		clock.Advance(time.Millisecond)
		e.Renew(ctx, lease.RenewRequest{Key: alice, TabID: "tab-a", Epoch: a.Epoch, Hidden: i%2 == 0})
		ids = append(ids, mustWatch(t, e, alice, "").Position)
	}
	e.mu.Lock()
	n := e.sessions[alice].log.len()
	e.mu.Unlock()
	if n != 4 {
		t.Errorf("the log holds %d events, want 4", n)
	}
	// The log holds the events at ids[6] to ids[9].
	if w := mustWatch(t, e, alice, ids[6]); !w.Resumed || len(w.Replay) != 3 || w.Replay[0].ID != ids[7] {
		t.Errorf("watch after the oldest event kept: Resumed %v, replay %+v; want 3 from %s", w.Resumed, w.Replay, ids[7])
	}
	if w := mustWatch(t, e, alice, ids[9]); !w.Resumed || len(w.Replay) != 0 {
		t.Errorf("watch after the newest event: Resumed %v, replay %+v; want nothing to replay", w.Resumed, w.Replay)
	}
	if w := mustWatch(t, e, alice, ids[5]); w.Resumed {
		t.Errorf("watch after an event the log dropped was resumed")
	}
}

func TestPruningSparesWatchedAndPresentSessions(t *testing.T) {
	e, clock := newWatchedEngine(t, 24*time.Hour)
	watched := lease.Key{User: "alice", Session: "watched"}
	present := lease.Key{User: "alice", Session: "present"}
	idle := lease.Key{User: "alice", Session: "idle"}
	for _, key := range []lease.Key{watched, present, idle} {
		l := mustAcquire(t, e, key, "tab-a", 0, lease.ModeTry)
		mustRelease(t, e, key, "tab-a", l.Epoch)
	}
	w := mustWatch(t, e, watched, "")
	if _, err := e.Join(ctx, present, "conn-1", lease.Tab{TabID: "tab-a"}, 0); err != nil {
		t.Fatal(err)
	}
	other := lease.Key{User: "bob", Session: "doc-1"}
	for range 2 * int(lease.DefaultIdleRetention/SweepInterval) {
		clock.Advance(SweepInterval)
		mustAcquire(t, e, other, "tab-o", 0, lease.ModeTakeover)
	}
	if n := e.size(); n != 3 {
		t.Fatalf("%d entries, want 3: the idle session pruned, the watched and present ones and bob's kept", n)
	}
	w.Close()
	if err := e.Leave(ctx, present, "conn-1", "tab-a", 0); err != nil {
		t.Fatal(err)
	}
	// The watched session's last event is old: it goes. The present one's is the recent leave:
	// it is kept a while for watches that resume.
	clock.Advance(SweepInterval)
	mustAcquire(t, e, other, "tab-o", 0, lease.ModeTakeover)
	if n := e.size(); n != 2 {
		t.Fatalf("%d entries just after the watch and the tab left, want 2", n)
	}
	clock.Advance(lease.DefaultIdleRetention + SweepInterval)
	mustAcquire(t, e, other, "tab-o", 0, lease.ModeTakeover)
	if n := e.size(); n != 1 {
		t.Fatalf("%d entries once idle for long, want 1", n)
	}
}

func TestPresenceEntriesExpireByTheEngineClock(t *testing.T) {
	e, clock := newWatchedEngine(t, 30*time.Second)
	w := mustWatch(t, e, alice, "")
	if _, err := e.Join(ctx, alice, "conn-1", lease.Tab{TabID: "tab-a"}, 0); err != nil {
		t.Fatal(err)
	}
	joinedAt := clock.Now()
	if ev := next(t, w); ev.Type != lease.EventTabJoined {
		t.Fatalf("event = %+v, want joined", ev)
	}
	clock.Advance(20 * time.Second)
	if _, err := e.Join(ctx, alice, "conn-1", lease.Tab{TabID: "tab-a", Label: "again"}, 0); err != nil {
		t.Fatal(err)
	}
	clock.Advance(20 * time.Second)
	tabs, err := e.Tabs(ctx, alice)
	if err != nil || len(tabs) != 1 || tabs[0].Label != "again" || !tabs[0].ConnectedAt.Equal(joinedAt.Truncate(time.Microsecond)) {
		t.Fatalf("Tabs 40s after a join refreshed at 20s = %+v, %v; want tab-a, connected at %v", tabs, err, joinedAt)
	}
	clock.Advance(10 * time.Second)
	if ev := next(t, w); ev.Type != lease.EventTabChanged || ev.Tab == nil || ev.Tab.Label != "again" {
		t.Fatalf("event = %+v, want tab-a changed, labelled again", ev)
	}
	ev := next(t, w)
	if ev.Type != lease.EventTabLeft || ev.Reason != lease.ReasonTimeout || !ev.At.Equal(joinedAt.Add(50*time.Second).Truncate(time.Microsecond)) {
		t.Errorf("event = %+v, want tab-a left by timeout when its refreshed entry expired", ev)
	}
}

func TestCloseStopsTheTimerAndEndsWatches(t *testing.T) {
	e, _ := newWatchedEngine(t, 0)
	w := mustWatch(t, e, alice, "")
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if e.timerRunning() {
		t.Error("the expiry timer runs after Close")
	}
	if _, open := <-w.Events(); open || !errors.Is(w.Err(), ErrClosed) {
		t.Errorf("the watch after Close: open %v, Err %v; want ended with ErrClosed", open, w.Err())
	}
	for name, err := range map[string]error{
		"Join":  func() error { _, err := e.Join(ctx, alice, "c", lease.Tab{TabID: "t"}, 0); return err }(),
		"Leave": e.Leave(ctx, alice, "c", "t", 0),
		"Tabs":  func() error { _, err := e.Tabs(ctx, alice); return err }(),
		"Watch": func() error { _, err := e.Watch(ctx, alice, ""); return err }(),
	} {
		if !errors.Is(err, ErrClosed) || !errors.Is(err, lease.ErrUnavailable) {
			t.Errorf("%s after Close = %v, want ErrUnavailable wrapping ErrClosed", name, err)
		}
	}
}
