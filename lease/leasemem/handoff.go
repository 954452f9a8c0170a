package leasemem

import (
	"time"

	"github.com/tablease/tablease/lease"
)

// The engine implements lease.ModeHandoff (its semantics are stated there).
//
// A session's handoff is one record in its entry: the requester, the holder asked to let go (tab
// and epoch), a deadline, and whether it is still a request or already a reservation.
// requestHandoff makes the request. The step that ends the holder's lease turns a pending request
// into a reservation (reserve): Release with the release time, settle with the lease's ExpiresAt,
// so that the reservation is the same whenever the expiry is announced. The grant that claims it,
// every other grant, every revoke and the requester's gone release (Release) drop the record. A request past its deadline, or a
// reservation past its end, counts as none wherever it is read (pendingHandoff, reservation), so a
// lapse needs no timer and appends nothing; the next step that ends the lease or grants it drops
// the record.

// handoff is a handoff request (reserved false) or reservation (reserved true).
type handoff struct {
	requester lease.Holder   // the tab that asked, as it asked
	from      lease.Previous // the holder asked to let go, at its epoch
	until     time.Time      // when the request lapses, or the reservation ends
	reserved  bool
}

// pendingHandoff answers the handoff request pending at now against the lease of s, or nil.
func (s *entry) pendingHandoff(now time.Time) *handoff {
	h := s.handoff
	if h == nil || h.reserved || !s.held(now) || h.from.Epoch != s.epoch || !h.until.After(now) {
		return nil
	}
	return h
}

// reservation answers the reservation of the free lease of s at now, or nil. s may be nil.
func (s *entry) reservation(now time.Time) *handoff {
	if s == nil {
		return nil
	}
	h := s.handoff
	if h == nil || !h.reserved || s.held(now) || !h.until.After(now) {
		return nil
	}
	return h
}

// handoffAt is the handoff in progress at now, as lease.Lease shows it; nil when there is none.
// settle must have run at now, so that an expiry has turned its request into a reservation.
func (s *entry) handoffAt(now time.Time) *lease.HandoffState {
	h := s.pendingHandoff(now)
	if h == nil {
		h = s.reservation(now)
	}
	if h == nil {
		return nil
	}
	return &lease.HandoffState{Requester: h.requester, Until: h.until, Reserved: h.reserved}
}

// requestHandoff answers an acquire in lease.ModeHandoff by requester of the lease of s, which
// another tab holds at now. With a request pending (by requester or any other tab), it changes
// nothing; otherwise it makes the request and appends its EventHandoffRequested. Either way it
// answers the *lease.RetryError of ErrHandoffPending, with the time until the request lapses.
// e.mu must be held.
func (e *Engine) requestHandoff(key lease.Key, s *entry, requester lease.Holder, now time.Time) error {
	if h := s.pendingHandoff(now); h != nil {
		return &lease.RetryError{Err: lease.ErrHandoffPending, RetryAfter: h.until.Sub(now)}
	}
	s.handoff = &handoff{
		requester: requester,
		from:      lease.Previous{TabID: s.holder.TabID, Epoch: s.epoch},
		until:     now.Add(e.handoffTimeout),
	}
	ev := s.event(lease.EventHandoffRequested, now)
	ev.Requester = &requester
	e.emit(key, s, now, ev)
	return &lease.RetryError{Err: lease.ErrHandoffPending, RetryAfter: e.handoffTimeout}
}

// reserve settles the handoff request of s as its lease ends at end (released at end, or expired
// at its ExpiresAt = end), before s records that end: when the request was pending at end, the lease
// is reserved for the requester until end plus the reserve window, and reserve answers (a copy of)
// the requester for the event of the end; otherwise the request is dropped and it answers nil.
// e.mu must be held.
func (e *Engine) reserve(s *entry, end time.Time) *lease.Holder {
	h := s.handoff
	if h == nil || h.reserved {
		return nil
	}
	s.handoff = nil
	if h.from.Epoch != s.epoch || !h.until.After(end) {
		return nil // the request lapsed before the end
	}
	s.handoff = &handoff{requester: h.requester, from: h.from, until: end.Add(e.handoffReserve), reserved: true}
	r := h.requester
	return &r
}
