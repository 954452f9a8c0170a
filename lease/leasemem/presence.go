package leasemem

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/tablease/tablease/lease"
)

// presenceKey names one connection of one tab.
type presenceKey struct{ tabID, conn string }

// presenceEntry is one connection of a tab to the session's event stream.
type presenceEntry struct {
	label       string
	hidden      bool
	connectedAt time.Time // when this connection first joined
	refreshedAt time.Time // when it last joined
	expiresAt   time.Time // the entry is gone at expiresAt and after
	seq         int64     // the highest number of the ordered writes applied (lease.Presence.Join)
}

// presenceMark is what a Leave keeps of a connection's entry: the number of its latest ordered
// write, until the entry would have lapsed (lease.Presence.Leave).
type presenceMark struct {
	seq   int64
	until time.Time // the mark is gone at until and after
}

// recorded is the number of the latest ordered write of pk applied by now: its entry's, else its
// mark's, else 0.
func (s *entry) recorded(pk presenceKey, now time.Time) int64 {
	if p := s.present[pk]; p != nil {
		return p.seq
	}
	if m, ok := s.marks[pk]; ok && m.until.After(now) {
		return m.seq
	}
	return 0
}

// mark keeps seq for pk until now+ttl, forgetting the marks that lapsed, and the one that lapses
// first beyond lease.MaxPresence.
func (s *entry) mark(pk presenceKey, seq int64, now time.Time, ttl time.Duration) {
	if s.marks == nil {
		s.marks = make(map[presenceKey]presenceMark)
	}
	putBounded(s.marks, pk, presenceMark{seq: seq, until: now.Add(ttl)}, now, lease.MaxPresence,
		func(m presenceMark) time.Time { return m.until },
		func(a, b presenceKey) bool { return a.tabID < b.tabID || (a.tabID == b.tabID && a.conn < b.conn) })
}

// Join implements lease.Presence.
func (e *Engine) Join(ctx context.Context, key lease.Key, conn string, tab lease.Tab, seq int64) (time.Duration, error) {
	if err := lease.ValidateJoin(key, conn, tab, seq); err != nil {
		return 0, err
	}
	now, unlock, err := e.begin(ctx, "join")
	if err != nil {
		return 0, err
	}
	defer unlock()
	s := e.sessions[key]
	if s == nil {
		if s, err = e.admit(key); err != nil {
			return 0, err
		}
	}
	e.settle(key, s, now)

	pk := presenceKey{tab.TabID, conn}
	recorded := s.recorded(pk, now)
	if seq > 0 && seq <= recorded {
		return e.presenceTTL, nil // a later write is applied already
	}
	p := s.present[pk]
	if p == nil && len(s.present) >= lease.MaxPresence { // settle dropped the expired entries
		return 0, &lease.TabLimitError{Limit: lease.MaxPresence}
	}
	listed := s.listed(tab.TabID)
	var before lease.Tab // the tab as listed before this join
	if listed {
		before = s.tab(tab.TabID)
	}
	if p == nil {
		p = &presenceEntry{connectedAt: now}
		if s.present == nil {
			s.present = make(map[presenceKey]*presenceEntry)
		}
		s.present[pk] = p
		delete(s.marks, pk)
	}
	p.seq = max(seq, recorded)
	p.label, p.hidden = tab.Label, tab.Hidden
	p.refreshedAt, p.expiresAt = now, now.Add(e.presenceTTL)
	if t := s.tab(tab.TabID); !listed {
		e.emit(key, s, now, lease.Event{Type: lease.EventTabJoined, Tab: &t, At: now})
	} else if t.Label != before.Label || t.Hidden != before.Hidden {
		e.emit(key, s, now, lease.Event{Type: lease.EventTabChanged, Tab: &t, At: now})
	}
	e.updateLive(key, s)
	e.deadline(key, p.expiresAt)
	return e.presenceTTL, nil
}

// Leave implements lease.Presence.
func (e *Engine) Leave(ctx context.Context, key lease.Key, conn, tabID string, seq int64) error {
	if err := lease.ValidateLeave(key, conn, tabID, seq); err != nil {
		return err
	}
	now, unlock, err := e.begin(ctx, "leave")
	if err != nil {
		return err
	}
	defer unlock()
	s := e.sessions[key]
	if s == nil {
		return nil
	}
	e.settle(key, s, now)
	pk := presenceKey{tabID, conn}
	recorded := s.recorded(pk, now)
	if seq > 0 && seq <= recorded {
		return nil // a later write is applied already
	}
	p := s.present[pk]
	if (seq > 0 && len(s.present) > 0) || (p != nil && p.seq > 0) {
		s.mark(pk, max(seq, recorded), now, e.presenceTTL)
	}
	if p == nil {
		return nil
	}
	t := s.tab(tabID)
	delete(s.present, pk)
	if !s.listed(tabID) {
		e.emit(key, s, now, lease.Event{Type: lease.EventTabLeft, Tab: &t, At: now})
	}
	e.updateLive(key, s)
	return nil
}

// Tabs implements lease.Presence.
func (e *Engine) Tabs(ctx context.Context, key lease.Key) ([]lease.Tab, error) {
	if err := key.Validate(); err != nil {
		return nil, err
	}
	now, unlock, err := e.begin(ctx, "tabs")
	if err != nil {
		return nil, err
	}
	defer unlock()
	s := e.sessions[key]
	if s == nil {
		return nil, nil
	}
	e.settle(key, s, now)
	return s.tabs(), nil
}

// expirePresence removes the presence entries of s that expired by now, and announces the tabs
// that left with them, in the order they left. e.mu must be held.
func (e *Engine) expirePresence(key lease.Key, s *entry, now time.Time) {
	type gone struct {
		tab lease.Tab // as listed before its entries expired
		at  time.Time // when the last of them expired
	}
	var left []gone
	for pk, p := range s.present {
		if p.expiresAt.After(now) {
			continue
		}
		i := slices.IndexFunc(left, func(g gone) bool { return g.tab.TabID == pk.tabID })
		if i < 0 {
			left = append(left, gone{tab: s.tab(pk.tabID)})
			i = len(left) - 1
		}
		left[i].at = later(left[i].at, p.expiresAt)
	}
	if len(left) == 0 {
		return
	}
	for pk, p := range s.present {
		if !p.expiresAt.After(now) {
			delete(s.present, pk)
		}
	}
	left = slices.DeleteFunc(left, func(g gone) bool { return s.listed(g.tab.TabID) })
	slices.SortFunc(left, func(a, b gone) int {
		return cmp.Or(a.at.Compare(b.at), cmp.Compare(a.tab.TabID, b.tab.TabID))
	})
	for _, g := range left {
		e.emit(key, s, now, lease.Event{Type: lease.EventTabLeft, Tab: &g.tab, Reason: lease.ReasonTimeout, At: g.at})
	}
	e.updateLive(key, s)
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// listed reports whether tabID has a presence entry in s.
func (s *entry) listed(tabID string) bool {
	for pk := range s.present {
		if pk.tabID == tabID {
			return true
		}
	}
	return false
}

// tab is tabID as listed: connected since its earliest entry, with the label and hidden flag of
// its latest refresh (of entries refreshed at the same time, the greatest connection id's, as
// leaseredis picks them: map order must not decide).
func (s *entry) tab(tabID string) lease.Tab {
	t := lease.Tab{TabID: tabID}
	var refreshed time.Time
	var conn string
	for pk, p := range s.present {
		if pk.tabID != tabID {
			continue
		}
		if t.ConnectedAt.IsZero() || p.connectedAt.Before(t.ConnectedAt) {
			t.ConnectedAt = p.connectedAt
		}
		if refreshed.IsZero() || p.refreshedAt.After(refreshed) || (p.refreshedAt.Equal(refreshed) && pk.conn > conn) {
			refreshed, conn = p.refreshedAt, pk.conn
			t.Label, t.Hidden = p.label, p.hidden
		}
	}
	return t
}

// tabs lists the tabs of s, in the order they connected, then by tab id.
func (s *entry) tabs() []lease.Tab {
	var tabs []lease.Tab
	for pk := range s.present {
		if !slices.ContainsFunc(tabs, func(t lease.Tab) bool { return t.TabID == pk.tabID }) {
			tabs = append(tabs, s.tab(pk.tabID))
		}
	}
	slices.SortFunc(tabs, func(a, b lease.Tab) int {
		return cmp.Or(a.ConnectedAt.Compare(b.ConnectedAt), cmp.Compare(a.TabID, b.TabID))
	})
	return tabs
}
