package leasetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tablease/tablease/lease"
)

const (
	// expiryBound is how long after an expiry its event may come (DESIGN §3), and eventSlack what
	// the suite adds to it for a loaded machine and the rounding of store times.
	expiryBound = time.Second
	eventSlack  = time.Second
)

// feed answers the Feed of the target.
func (f *fixture) feed() lease.Feed { return f.target.Engine }

// presence answers the Presence of the target.
func (f *fixture) presence() lease.Presence { return f.target.Engine }

// peer answers another engine on the same store, and skips the test when the target has none.
func (f *fixture) peer() lease.Store {
	f.t.Helper()
	if f.target.Peer == nil {
		f.t.Skip("the store cannot be shared by two engines (Peer is nil)")
	}
	eng := f.target.Peer(f.t)
	if eng == nil {
		f.t.Fatal("Peer returned no engine")
	}
	f.closeAtCleanup(eng)
	return eng
}

// watcher is a watch under test: it checks every event it receives against the key watched and
// the ids before it.
type watcher struct {
	f    *fixture
	name string
	w    *lease.Watch
	key  lease.Key
	last lease.EventID // the id of the last event received, replayed or of the position
}

// watch starts a watch of key on feed after the id after, and closes it at cleanup.
func (f *fixture) watch(feed lease.Feed, key lease.Key, after string) *watcher {
	f.t.Helper()
	return f.watchCtx(f.ctx(), feed, key, after)
}

func (f *fixture) watchCtx(ctx context.Context, feed lease.Feed, key lease.Key, after string) *watcher {
	f.t.Helper()
	w, err := feed.Watch(ctx, key, after)
	if err != nil {
		f.t.Fatalf("Watch(%+v, %q): %v", key, after, err)
	}
	f.t.Cleanup(w.Close)
	x := &watcher{f: f, name: fmt.Sprintf("the watch of %s/%s after %q", key.User, key.Session, after), w: w, key: key}
	if w.Key != key {
		f.t.Errorf("%s: Key = %+v, want %+v", x.name, w.Key, key)
	}
	if w.Snapshot.Key != key || w.Snapshot.Now.IsZero() {
		f.t.Errorf("%s: Snapshot = %+v, want a lease of %+v read at the store time", x.name, w.Snapshot, key)
	}
	if !w.Resumed && len(w.Replay) > 0 {
		f.t.Errorf("%s: not Resumed, but Replay holds %d events", x.name, len(w.Replay))
	}
	if w.Position != "" {
		x.last = x.parse("Position", w.Position)
	}
	if w.Resumed {
		from := x.parse("after", after)
		for _, ev := range w.Replay {
			x.check("replayed", ev)
			if id := x.parse("a replayed ID", ev.ID); id.Compare(from) <= 0 {
				f.t.Errorf("%s: replayed event %s, not after %s", x.name, ev.ID, after)
			}
			from = x.parse("a replayed ID", ev.ID)
		}
		if n := len(w.Replay); n > 0 && w.Replay[n-1].ID != w.Position {
			f.t.Errorf("%s: the last event replayed is %s, but Position is %s", x.name, w.Replay[n-1].ID, w.Position)
		}
		if len(w.Replay) == 0 && w.Position != after {
			f.t.Errorf("%s: resumed with nothing to replay, but Position is %s", x.name, w.Position)
		}
	}
	return x
}

func (x *watcher) parse(what, id string) lease.EventID {
	x.f.t.Helper()
	parsed, err := lease.ParseEventID(id)
	if err != nil {
		x.f.t.Fatalf("%s: %s %q is not an event id: %v", x.name, what, id, err)
	}
	return parsed
}

// check fails unless ev is an event of the key watched, with an id and a time.
func (x *watcher) check(how string, ev lease.Event) {
	x.f.t.Helper()
	if ev.Key != x.key {
		x.f.t.Errorf("%s: %s an event of %+v: %+v", x.name, how, ev.Key, ev)
	}
	if ev.At.IsZero() {
		x.f.t.Errorf("%s: %s an event without At: %+v", x.name, how, ev)
	}
	x.parse(how+" ID", ev.ID)
}

// next receives the next event, failing the test when none comes within waitFor or the watch ends.
func (x *watcher) next() lease.Event {
	x.f.t.Helper()
	ev, ok := x.nextWithin(waitFor)
	if !ok {
		x.f.t.Fatalf("%s: no event within %v", x.name, waitFor)
	}
	return ev
}

// nextWithin receives the next event within d; ok is false when none came. It fails the test when
// the watch ends.
func (x *watcher) nextWithin(d time.Duration) (lease.Event, bool) {
	x.f.t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case ev, open := <-x.w.Events():
		if !open {
			x.f.t.Fatalf("%s ended: %v", x.name, x.w.Err())
		}
		x.check("received", *ev)
		id := x.parse("a received ID", ev.ID)
		if id.Compare(x.last) <= 0 {
			x.f.t.Errorf("%s: received event %s after %s: ids must strictly increase", x.name, ev.ID, x.last)
		}
		x.last = id
		return *ev, true
	case <-timer.C:
		return lease.Event{}, false
	}
}

// nextN receives n events.
func (x *watcher) nextN(n int) []lease.Event {
	x.f.t.Helper()
	evs := make([]lease.Event, n)
	for i := range evs {
		evs[i] = x.next()
	}
	return evs
}

// ended waits until the watch ends, draining it, and answers the events drained and Err.
func (x *watcher) ended() ([]lease.Event, error) {
	x.f.t.Helper()
	deadline := time.NewTimer(waitFor)
	defer deadline.Stop()
	var evs []lease.Event
	for {
		select {
		case ev, open := <-x.w.Events():
			if !open {
				return evs, x.w.Err()
			}
			evs = append(evs, *ev)
		case <-deadline.C:
			x.f.t.Fatalf("%s did not end within %v", x.name, waitFor)
		}
	}
}

// want describes an expected event. A zero epoch is not checked.
type want struct {
	typ    lease.EventType
	epoch  int64
	holder *lease.Holder   // nil: no holder
	prev   *lease.Previous // nil: no previous
	tab    string          // the tab of a tabs event
	reason string
	// requester is the Requester of a handoff event; nil: none.
	requester *lease.Holder
}

func granted(epoch int64, h lease.Holder) want {
	return want{typ: lease.EventGranted, epoch: epoch, holder: &h}
}

func updated(epoch int64, h lease.Holder) want {
	return want{typ: lease.EventUpdated, epoch: epoch, holder: &h}
}

func takenOver(epoch int64, h lease.Holder, prevTab string, prevEpoch int64) want {
	return want{typ: lease.EventTakenOver, epoch: epoch, holder: &h, prev: &lease.Previous{TabID: prevTab, Epoch: prevEpoch}}
}

func released(tab string, epoch int64) want {
	return want{typ: lease.EventReleased, epoch: epoch, prev: &lease.Previous{TabID: tab, Epoch: epoch}}
}

func expired(tab string, epoch int64) want {
	return want{typ: lease.EventExpired, epoch: epoch, prev: &lease.Previous{TabID: tab, Epoch: epoch}}
}

func tabJoined(tab string) want { return want{typ: lease.EventTabJoined, tab: tab} }

func tabLeft(tab, reason string) want { return want{typ: lease.EventTabLeft, tab: tab, reason: reason} }

func tabChanged(tab string) want { return want{typ: lease.EventTabChanged, tab: tab} }

func (w want) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s", w.typ)
	if w.epoch != 0 {
		fmt.Fprintf(&b, " epoch %d", w.epoch)
	}
	if w.holder != nil {
		fmt.Fprintf(&b, " holder %+v", *w.holder)
	}
	if w.prev != nil {
		fmt.Fprintf(&b, " previous %+v", *w.prev)
	}
	if w.tab != "" {
		fmt.Fprintf(&b, " tab %s", w.tab)
	}
	if w.reason != "" {
		fmt.Fprintf(&b, " reason %q", w.reason)
	}
	if w.requester != nil {
		fmt.Fprintf(&b, " requester %+v", *w.requester)
	}
	return b.String()
}

func show(ev lease.Event) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s epoch %d", ev.ID, ev.Type, ev.Epoch)
	if ev.Holder != nil {
		fmt.Fprintf(&b, " holder %+v", *ev.Holder)
	}
	if ev.Previous != nil {
		fmt.Fprintf(&b, " previous %+v", *ev.Previous)
	}
	if ev.Tab != nil {
		fmt.Fprintf(&b, " tab %+v", *ev.Tab)
	}
	if ev.Reason != "" {
		fmt.Fprintf(&b, " reason %q", ev.Reason)
	}
	if ev.Requester != nil {
		fmt.Fprintf(&b, " requester %+v", *ev.Requester)
	}
	return b.String()
}

func (w want) matches(ev lease.Event) bool {
	if ev.Type != w.typ || (w.epoch != 0 && ev.Epoch != w.epoch) || ev.Reason != w.reason {
		return false
	}
	if (ev.Holder == nil) != (w.holder == nil) || (w.holder != nil && *ev.Holder != *w.holder) {
		return false
	}
	if (ev.Previous == nil) != (w.prev == nil) || (w.prev != nil && *ev.Previous != *w.prev) {
		return false
	}
	if (ev.Requester == nil) != (w.requester == nil) || (w.requester != nil && *ev.Requester != *w.requester) {
		return false
	}
	if w.tab != "" {
		return ev.Tab != nil && ev.Tab.TabID == w.tab
	}
	return ev.Tab == nil
}

// wantEvents fails unless got are exactly the events wanted, in order.
func wantEvents(t *testing.T, what string, got []lease.Event, wanted ...want) {
	t.Helper()
	ok := len(got) == len(wanted)
	for i := 0; ok && i < len(got); i++ {
		ok = wanted[i].matches(got[i])
	}
	if ok {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: got %d events:\n", what, len(got))
	for _, ev := range got {
		fmt.Fprintf(&b, "\t%s\n", show(ev))
	}
	fmt.Fprintf(&b, "want %d:\n", len(wanted))
	for _, w := range wanted {
		fmt.Fprintf(&b, "\t%s\n", w)
	}
	t.Error(b.String())
}

// wantErr fails unless err matches target.
func wantErr(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Errorf("%s: got %v, want %v", what, err, target)
	}
}
