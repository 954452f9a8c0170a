package leasetest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tablease/tablease/lease"
)

func testRaceTry(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	key := lease.Key{User: "alice", Session: "doc-1"}
	const tabs, rounds = 64, 50
	var last int64
	for round := range rounds {
		type answer struct {
			tab string
			l   lease.Lease
			err error
		}
		answers := make([]answer, tabs)
		gate := make(chan struct{})
		var wg sync.WaitGroup
		for i := range tabs {
			tab := fmt.Sprintf("tab-%d", i)
			wg.Go(func() {
				<-gate
				l, err := f.eng.Acquire(f.ctx(), lease.AcquireRequest{Key: key, Holder: holder(tab), TTL: long, Mode: lease.ModeTry})
				answers[i] = answer{tab, l, err}
			})
		}
		close(gate)
		wg.Wait()

		var winners []answer
		for _, a := range answers {
			if a.err == nil {
				winners = append(winners, a)
			}
		}
		if len(winners) != 1 {
			t.Fatalf("round %d: %d tabs won, want exactly one: %+v", round, len(winners), winners)
		}
		w := winners[0]
		if !w.l.HeldBy(w.tab, w.l.Epoch) || w.l.Epoch <= last {
			t.Fatalf("round %d: the winner %s got %+v, want it held at an epoch above %d", round, w.tab, w.l, last)
		}
		for _, a := range answers {
			if a.err == nil {
				continue
			}
			var held *lease.HeldError
			if !errors.As(a.err, &held) || !errors.Is(a.err, lease.ErrHeld) {
				t.Fatalf("round %d: %s got %v, want a *lease.HeldError", round, a.tab, a.err)
			}
			if held.Holder.TabID != w.tab || held.Epoch != w.l.Epoch {
				t.Fatalf("round %d: %s was told %s holds at %d, but %s won at %d", round, a.tab, held.Holder.TabID, held.Epoch, w.tab, w.l.Epoch)
			}
		}
		last = w.l.Epoch
		f.wantReleased(key, w.tab, w.l.Epoch, true)
	}
	if g := f.get(key); g.Transitions != rounds {
		t.Errorf("Transitions after %d rounds = %d, want %d", rounds, g.Transitions, rounds)
	}
}

func testRaceTryRelease(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	key := lease.Key{User: "alice", Session: "doc-1"}
	const tabs, tries = 64, 20
	var (
		holders atomic.Int32 // tabs that hold the lease by their own account
		mu      sync.Mutex
		epochs  []int64 // the epochs won, in the order of the wins; guarded by mu
	)
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i := range tabs {
		tab := fmt.Sprintf("tab-%d", i)
		wg.Go(func() {
			<-gate
			for range tries {
				l, err := f.eng.Acquire(f.ctx(), lease.AcquireRequest{Key: key, Holder: holder(tab), TTL: long, Mode: lease.ModeTry})
				if errors.Is(err, lease.ErrHeld) {
					continue
				}
				if err != nil {
					t.Errorf("%s: Acquire: %v", tab, err)
					return
				}
				if n := holders.Add(1); n != 1 {
					t.Errorf("%s won epoch %d while %d other tabs held the lease", tab, l.Epoch, n-1)
				}
				mu.Lock()
				epochs = append(epochs, l.Epoch)
				mu.Unlock()
				if _, err := f.eng.Check(f.ctx(), key, tab, l.Epoch); err != nil {
					t.Errorf("%s: Check of the epoch it just won: %v", tab, err)
				}
				// Let go of the count before the store lets go of the lease, so the next winner
				// cannot count itself before this tab is done.
				holders.Add(-1)
				r, err := f.eng.Release(f.ctx(), lease.ReleaseRequest{Key: key, TabID: tab, Epoch: l.Epoch})
				if err != nil || !r.Released {
					t.Errorf("%s: Release of the epoch it won = %+v, %v; want released", tab, r, err)
				}
			}
		})
	}
	close(gate)
	wg.Wait()

	if len(epochs) == 0 {
		t.Fatal("no tab ever won the lease")
	}
	for i := 1; i < len(epochs); i++ {
		if epochs[i] <= epochs[i-1] {
			t.Errorf("win %d got epoch %d, not above the previous win's %d", i+1, epochs[i], epochs[i-1])
		}
	}
	if g := f.get(key); g.Held || g.Transitions != int64(len(epochs)) {
		t.Errorf("Get at the end = %+v, want free after %d grants", g, len(epochs))
	}
}

// observation is one answer of the store in testHistory that says tab held epoch at the store time
// at: the answer of an acquire, renew, check or get, which also says until when (expiresAt), or of
// a release that ended the lease at at.
type observation struct {
	op        string // "acquire", "renew", "check", "get" or "release"
	key       lease.Key
	tab       string
	epoch     int64
	grantedAt time.Time // zero for a release
	expiresAt time.Time // zero for a release
	at        time.Time
}

func observe(op, tab string, l lease.Lease) observation {
	return observation{op, l.Key, tab, l.Epoch, l.GrantedAt, l.ExpiresAt, l.Now}
}

// testHistory runs many tabs doing everything at once on a few sessions, records every answer that
// says a tab holds a lease, and checks the record afterwards (see checkHistory).
func testHistory(t *testing.T, newTarget Factory) {
	f := start(t, newTarget, limits)
	var keys []lease.Key
	for _, user := range []string{"alice", "bob"} {
		for _, session := range []string{"doc-1", "doc-2", "doc-3"} {
			keys = append(keys, lease.Key{User: user, Session: session})
		}
	}
	const workers, ops = 16, 250
	ttls := []time.Duration{f.limits.Min, 50 * time.Millisecond, 200 * time.Millisecond}

	var (
		mu   sync.Mutex
		seen []observation // guarded by mu
	)
	record := func(o observation) {
		mu.Lock()
		seen = append(seen, o)
		mu.Unlock()
	}
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		tab := fmt.Sprintf("tab-%d", w)
		rng := rand.New(rand.NewPCG(uint64(w), 42))
		wg.Go(func() {
			<-gate
			mine := make(map[lease.Key]int64) // the epoch this tab believes it holds, per session
			for range ops {
				key := keys[rng.IntN(len(keys))]
				ttl := ttls[rng.IntN(len(ttls))]
				epoch, believes := mine[key]
				if !believes {
					epoch = 1 + rng.Int64N(1<<40) // a stale epoch, for the calls that must fail
				}
				switch p := rng.IntN(100); {
				case p < 30:
					mode := lease.ModeTry
					if p < 5 {
						mode = lease.ModeTakeover
					}
					l, err := f.eng.Acquire(f.ctx(), lease.AcquireRequest{Key: key, Holder: holder(tab), TTL: ttl, Mode: mode})
					switch {
					case err == nil:
						mine[key] = l.Epoch
						record(observe("acquire", tab, l))
					case !errors.Is(err, lease.ErrHeld) || mode == lease.ModeTakeover:
						t.Errorf("%s: Acquire(%s): %v", tab, mode, err)
					}
				case p < 55:
					l, err := f.eng.Renew(f.ctx(), lease.RenewRequest{Key: key, TabID: tab, Epoch: epoch, TTL: ttl, Hidden: p%2 == 0})
					switch {
					case err == nil:
						if !believes {
							t.Errorf("%s: Renew at an epoch it was never granted (%d) succeeded", tab, epoch)
						}
						record(observe("renew", tab, l))
					case errors.Is(err, lease.ErrLost):
						delete(mine, key)
					default:
						t.Errorf("%s: Renew: %v", tab, err)
					}
				case p < 70:
					l, err := f.eng.Check(f.ctx(), key, tab, epoch)
					switch {
					case err == nil:
						record(observe("check", tab, l))
					case errors.Is(err, lease.ErrLost):
						delete(mine, key)
					default:
						t.Errorf("%s: Check: %v", tab, err)
					}
				case p < 82:
					r, err := f.eng.Release(f.ctx(), lease.ReleaseRequest{Key: key, TabID: tab, Epoch: epoch})
					switch {
					case err != nil:
						t.Errorf("%s: Release: %v", tab, err)
					case r.Released:
						record(observation{op: "release", key: key, tab: tab, epoch: epoch, at: r.Lease.Now})
					}
					delete(mine, key)
				case p < 95:
					l, err := f.eng.Get(f.ctx(), key)
					switch {
					case err != nil:
						t.Errorf("%s: Get: %v", tab, err)
					case l.Held:
						record(observe("get", l.Holder.TabID, l))
					}
				default:
					// A tab that stalls, so that some leases expire while their holder still
					// believes in them. Not a synchronisation.
					time.Sleep(time.Duration(1+rng.IntN(30)) * time.Millisecond)
				}
			}
		})
	}
	close(gate)
	wg.Wait()
	if t.Failed() {
		return
	}
	checkHistory(t, f, keys, seen)
}

// checkHistory checks, per session, what testHistory recorded:
//   - every epoch was granted to one tab at one time, and epochs follow the order of their grants;
//   - every answer that a tab held an epoch names the tab it was granted to;
//   - no answer says an epoch was held after a later epoch was granted, after it was released, or
//     after the latest expiry any earlier answer gave it (a lease is never resurrected);
//   - the store counted exactly the grants it answered, and its last epoch is the last one granted.
//
// Store times may be rounded: a time reported as r happened in [r, r+resolution), where
// resolution is a millisecond if every such time reported was a whole millisecond, else a
// microsecond. Only what is certain from the rounded times is flagged.
func checkHistory(t *testing.T, f *fixture, keys []lease.Key, seen []observation) {
	resolution := func(times func(o observation) time.Time) time.Duration {
		for _, o := range seen {
			if tm := times(o); !tm.IsZero() && !tm.Equal(tm.Truncate(time.Millisecond)) {
				return time.Microsecond
			}
		}
		return time.Millisecond
	}
	resGranted := resolution(func(o observation) time.Time { return o.grantedAt })
	resExpires := resolution(func(o observation) time.Time { return o.expiresAt })
	resAt := resolution(func(o observation) time.Time { return o.at })

	// certainlyBefore reports whether a time reported as a (with resolution res) was before b.
	certainlyBefore := func(a time.Time, res time.Duration, b time.Time) bool { return !a.Add(res).After(b) }

	type grant struct {
		tab string
		at  time.Time
	}
	for _, key := range keys {
		var mine []observation
		for _, o := range seen {
			if o.key == key {
				mine = append(mine, o)
			}
		}
		slices.SortStableFunc(mine, func(a, b observation) int { return a.at.Compare(b.at) })

		grants := make(map[int64]grant)
		for _, o := range mine {
			if o.op != "acquire" {
				continue
			}
			g, ok := grants[o.epoch]
			switch {
			case !ok:
				grants[o.epoch] = grant{o.tab, o.grantedAt}
			case g.tab != o.tab:
				t.Errorf("%+v: epoch %d was granted to %s and to %s", key, o.epoch, g.tab, o.tab)
			case !nearTime(g.at, o.grantedAt):
				t.Errorf("%+v: epoch %d was granted at %v and at %v", key, o.epoch, g.at, o.grantedAt)
			}
		}
		epochs := make([]int64, 0, len(grants))
		for e := range grants {
			epochs = append(epochs, e)
		}
		slices.Sort(epochs)
		for i := 1; i < len(epochs); i++ {
			if grants[epochs[i]].at.Before(grants[epochs[i-1]].at) {
				t.Errorf("%+v: epoch %d was granted at %v, before the lower epoch %d at %v",
					key, epochs[i], grants[epochs[i]].at, epochs[i-1], grants[epochs[i-1]].at)
			}
		}

		// Per epoch, in the order of the store's answers: the latest expiry answered so far, and
		// the release, if any.
		type life struct {
			expires  time.Time
			released time.Time
		}
		lives := make(map[int64]*life)
		for _, o := range mine {
			g, ok := grants[o.epoch]
			if !ok {
				t.Errorf("%+v: %s answered that %s held epoch %d, which no acquire granted", key, o.op, o.tab, o.epoch)
				continue
			}
			if g.tab != o.tab {
				t.Errorf("%+v: %s answered that %s held epoch %d, which was granted to %s", key, o.op, o.tab, o.epoch, g.tab)
			}
			if !o.grantedAt.IsZero() && !nearTime(g.at, o.grantedAt) {
				t.Errorf("%+v: %s answered epoch %d granted at %v, but it was granted at %v", key, o.op, o.epoch, o.grantedAt, g.at)
			}
			if i, _ := slices.BinarySearch(epochs, o.epoch); i+1 < len(epochs) {
				if next := grants[epochs[i+1]]; certainlyBefore(next.at, resGranted, o.at) {
					t.Errorf("%+v: %s answered at %v that %s held epoch %d, after epoch %d was granted to %s at %v",
						key, o.op, o.at, o.tab, o.epoch, epochs[i+1], next.tab, next.at)
				}
			}
			lf := lives[o.epoch]
			if lf == nil {
				lf = &life{}
				lives[o.epoch] = lf
			}
			if !lf.released.IsZero() && certainlyBefore(lf.released, resAt, o.at) {
				t.Errorf("%+v: %s answered at %v that %s held epoch %d, after it was released at %v",
					key, o.op, o.at, o.tab, o.epoch, lf.released)
			}
			if o.op != "acquire" && !lf.expires.IsZero() && certainlyBefore(lf.expires, resExpires, o.at) {
				t.Errorf("%+v: %s answered at %v that %s held epoch %d, after it expired at %v: a resurrection",
					key, o.op, o.at, o.tab, o.epoch, lf.expires)
			}
			if o.op == "release" {
				if lf.released.IsZero() {
					lf.released = o.at
				}
			} else if o.expiresAt.After(lf.expires) {
				lf.expires = o.expiresAt
			}
		}

		l := f.get(key)
		var maxEpoch int64
		if len(epochs) > 0 {
			maxEpoch = epochs[len(epochs)-1]
		}
		if l.Epoch != maxEpoch || l.Transitions != int64(len(epochs)) {
			t.Errorf("%+v: Get at the end = epoch %d, %d transitions; want the last grant %d and the %d grants answered",
				key, l.Epoch, l.Transitions, maxEpoch, len(epochs))
		}
	}
}
