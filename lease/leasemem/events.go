package leasemem

import (
	"context"
	"time"

	"github.com/tablease/tablease/lease"
)

// The engine is a lease.Store: its Feed and Presence are here, its Admin in admin.go.
var _ lease.Store = (*Engine)(nil)

// eventLog is a ring of the most recent events of a session, oldest first.
type eventLog struct {
	ids    []lease.EventID // ids[i] is the parsed events[i].ID
	events []lease.Event   // grows up to the engine's logLen, then wraps
	head   int             // index of the oldest event once the ring is full
}

func (l *eventLog) len() int { return len(l.events) }

// at returns the i-th oldest event and its id.
func (l *eventLog) at(i int) (lease.EventID, lease.Event) {
	j := (l.head + i) % len(l.events)
	return l.ids[j], l.events[j]
}

func (l *eventLog) push(id lease.EventID, ev lease.Event, limit int) {
	if len(l.events) < limit {
		l.ids = append(l.ids, id)
		l.events = append(l.events, ev)
		return
	}
	l.ids[l.head], l.events[l.head] = id, ev
	l.head = (l.head + 1) % limit
}

// after answers the events after id when the log still holds every one of them: when id is the
// id of an event it keeps. ok is false otherwise (too old, unknown), and for an empty log.
func (l *eventLog) after(id lease.EventID) (events []lease.Event, ok bool) {
	n := l.len()
	if n == 0 {
		return nil, false
	}
	first, _ := l.at(0)
	last, _ := l.at(n - 1)
	if id.Compare(first) < 0 || id.Compare(last) > 0 {
		return nil, false
	}
	found := false
	for i := range n {
		eid, ev := l.at(i)
		switch c := eid.Compare(id); {
		case c == 0:
			found = true
		case c > 0:
			events = append(events, ev)
		}
	}
	if !found { // an id the log never had: unknown
		return nil, false
	}
	return events, true
}

// position is the id of the newest event kept, or empty.
func (l *eventLog) position() string {
	if l.len() == 0 {
		return ""
	}
	_, ev := l.at(l.len() - 1)
	return ev.ID
}

// event is an event of type t about the current lease of s: its epoch and holder, at now.
func (s *entry) event(t lease.EventType, now time.Time) lease.Event {
	h := s.holder
	return lease.Event{Type: t, Epoch: s.epoch, Holder: &h, At: now}
}

// create adds an empty entry for key, which has none. e.mu must be held.
func (e *Engine) create(key lease.Key) *entry {
	s := &entry{}
	e.sessions[key] = s
	e.perUserCount[key.User]++
	e.peak = max(e.peak, len(e.sessions))
	return s
}

// admit creates the entry of key, which has none, for a call of its user that counts against
// Options.SessionsPerUser (Acquire, Join, Watch), or fails with a *lease.SessionLimitError when the user
// has as many entries as it allows. e.mu must be held.
func (e *Engine) admit(key lease.Key) (*entry, error) {
	if e.perUser > 0 && e.perUserCount[key.User] >= e.perUser {
		return nil, &lease.SessionLimitError{Limit: e.perUser}
	}
	return e.create(key), nil
}

// emit appends ev to the log of s with the next id, and hands it to the watchers of s, forgetting
// those that have ended. e.mu must be held: emit is part of the critical section that made the
// change.
func (e *Engine) emit(key lease.Key, s *entry, now time.Time, ev lease.Event) {
	id := lease.NextEventID(s.lastID, now)
	s.lastID = id
	ev.ID, ev.Key = id.String(), key
	s.log.push(id, ev, e.logLen)
	dropped := false
	for w := range s.watchers {
		if !w.Send(ev) {
			delete(s.watchers, w)
			dropped = true
		}
	}
	if dropped {
		e.updateLive(key, s)
	}
}

// settled returns the session of key, nil if there is none, with what expired in it by now
// announced (see settle). e.mu must be held.
func (e *Engine) settled(key lease.Key, now time.Time) *entry {
	s := e.sessions[key]
	if s != nil {
		e.settle(key, s, now)
	}
	return s
}

// settle announces what expired in s by now: the lease, once per epoch, then the tabs whose last
// presence entry expired. e.mu must be held.
func (e *Engine) settle(key lease.Key, s *entry, now time.Time) {
	if s.epoch != 0 && s.ended != s.epoch && !s.held(now) {
		s.ended = s.epoch
		e.emit(key, s, now, lease.Event{
			Type:      lease.EventExpired,
			Epoch:     s.epoch,
			Previous:  &lease.Previous{TabID: s.holder.TabID, Epoch: s.epoch},
			Requester: e.reserve(s, s.expiresAt),
			At:        s.expiresAt,
		})
		e.record(now, lease.AuditRecord{
			Key:      key,
			At:       s.expiresAt,
			Action:   lease.AuditExpire,
			Epoch:    s.epoch,
			Previous: &lease.Previous{TabID: s.holder.TabID, Epoch: s.epoch},
		})
		s.holder = lease.Holder{} // the end is announced: a free lease keeps no holder
	}
	if len(s.present) > 0 {
		e.expirePresence(key, s, now)
	}
}

// nextDeadline is the earliest engine time after now at which something of s will expire that
// has not been announced; ok is false when there is none.
func (s *entry) nextDeadline(now time.Time) (t time.Time, ok bool) {
	if s.epoch != 0 && s.ended != s.epoch && s.held(now) {
		t, ok = s.expiresAt, true
	}
	for _, p := range s.present {
		if !ok || p.expiresAt.Before(t) {
			t, ok = p.expiresAt, true
		}
	}
	return t, ok
}

// updateLive adds s to the live sessions when it has watchers or presence entries, starting the
// expiry timer if need be, and removes it otherwise. e.mu must be held.
func (e *Engine) updateLive(key lease.Key, s *entry) {
	if len(s.watchers) == 0 && len(s.present) == 0 {
		delete(e.live, key)
		return
	}
	if e.live[key] == nil {
		e.live[key] = s
		e.nudge()
	}
	if !e.timerOn && !e.closed {
		e.timerOn, e.timerAt = true, time.Time{}
		e.timers.Add(1)
		go e.runTimer()
	}
}

// deadline tells the expiry timer that something of the session key expires at t, so that it
// wakes earlier than planned if need be. e.mu must be held.
func (e *Engine) deadline(key lease.Key, t time.Time) {
	if e.timerOn && e.live[key] != nil && t.Before(e.timerAt) {
		e.nudge()
	}
}

// nudge makes the expiry timer look at the live sessions again at once.
func (e *Engine) nudge() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// clock is the engine time, as begin reads it.
func (e *Engine) clock() time.Time { return e.now().Truncate(time.Microsecond).UTC() }

// runTimer is the expiry timer: it announces what expired in the live sessions, and sleeps until
// the earliest next expiry or for checkInterval, whichever is first. It stops when no session is
// live or the engine closes.
func (e *Engine) runTimer() {
	defer e.timers.Done()
	timer := time.NewTimer(e.checkInterval)
	defer timer.Stop()
	for {
		e.mu.Lock()
		if e.closed || len(e.live) == 0 {
			e.timerOn = false
			e.mu.Unlock()
			return
		}
		now := e.clock()
		next := now.Add(e.checkInterval)
		for key, s := range e.live {
			e.settle(key, s, now)
			if t, ok := s.nextDeadline(now); ok && t.Before(next) {
				next = t
			}
		}
		e.timerAt = next
		e.mu.Unlock()

		timer.Reset(max(next.Sub(now), time.Millisecond))
		select {
		case <-timer.C:
		case <-e.wake:
			timer.Stop()
		case <-e.done:
			// The loop's top sees e.closed and marks the timer stopped.
		}
	}
}

// Watch implements lease.Feed. A watch of a session that never had a lease starts from a free
// lease at epoch 0.
func (e *Engine) Watch(ctx context.Context, key lease.Key, after string) (*lease.Watch, error) {
	if err := key.Validate(); err != nil {
		return nil, err
	}
	var from lease.EventID
	if after != "" {
		id, err := lease.ParseEventID(after)
		if err != nil {
			return nil, err
		}
		from = id
	}
	now, unlock, err := e.begin(ctx, "watch")
	if err != nil {
		return nil, err
	}
	defer unlock()

	s := e.sessions[key]
	if s == nil {
		if s, err = e.admit(key); err != nil {
			return nil, err
		}
	}
	e.settle(key, s, now)

	var sender *lease.WatchSender
	w, sender := lease.NewWatch(ctx, key, e.watchBuffer, func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.closed || e.sessions[key] != s {
			return
		}
		delete(s.watchers, sender)
		e.updateLive(key, s)
	})
	w.Snapshot = s.lease(key, now)
	w.Tabs = s.tabs()
	w.Position = s.log.position()
	if after != "" {
		w.Replay, w.Resumed = s.log.after(from)
	}
	if s.watchers == nil {
		s.watchers = make(map[*lease.WatchSender]struct{})
	}
	s.watchers[sender] = struct{}{}
	e.updateLive(key, s)
	return w, nil
}
