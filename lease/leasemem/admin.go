package leasemem

import (
	"container/heap"
	"context"
	"slices"
	"sort"
	"time"

	"github.com/tablease/tablease/lease"
)

// The engine implements lease.Admin.
//
// # Revokes and blocks
//
// A revoke is one critical section like every call: it announces an expiry first (settle), then
// mints the epoch, clears the holder, marks the new epoch ended (so that no expiry is ever
// announced for it), appends the EventRevoked and the audit records. The block of a session and its
// revokes with a RequestID of the last lease.RevokeRetryWindow live in the session's entry; the
// sweep keeps an entry while it is blocked and for lease.RevokeRetryWindow after its last such
// revoke.
//
// # Audit log
//
// Each user's records are a slice in the order they were appended, outside the session entries,
// so that pruning a session keeps its history. Records get ids from one engine-wide sequence
// (lease.NextEventID of the last id and the clock), so ids increase across users in the order of
// the changes, and a page across users is a merge of the users' logs by id. A user's log keeps,
// for Options.AuditRetention (counted from when each was appended), at most
// Options.AuditMaxRecords records of the user's own actions and, apart, at most as many records
// of admins (revoke, block), so that a user's own actions never push an admin's records out; the
// oldest of each go first, on append and in the sweep, and a query skips the records past their
// retention whether or not the sweep has run yet.

var _ lease.Admin = (*Engine)(nil)

// auditEntry is one record of a user's audit log.
type auditEntry struct {
	id    lease.EventID
	added time.Time // the engine time it was appended; retention counts from it
	rec   lease.AuditRecord
}

// auditLog is the audit log of one user, oldest first (ids increasing). admins counts the entries
// that record an admin's action (with an Admin).
type auditLog struct {
	entries []auditEntry
	admins  int
}

// revokeID names a revoke for its retries: the admin and the RequestID.
type revokeID struct{ admin, requestID string }

// revokeMemo is a revoke of a session that had a RequestID, and what it answered.
type revokeMemo struct {
	at     time.Time // the engine time of the revoke
	result lease.RevokeResult
}

// keptByAdmin reports whether the sweep must keep s although its lease is free: an admin's block
// ended less than idle (the engine's retention) ago, or the retry window of a revoke it remembers
// has not ended (lease.DefaultIdleRetention).
func (s *entry) keptByAdmin(now time.Time, idle time.Duration) bool {
	if s.blockedUntil.Add(idle).After(now) {
		return true
	}
	for _, m := range s.revokes {
		if now.Sub(m.at) <= lease.RevokeRetryWindow {
			return true
		}
	}
	return false
}

// retriedRevoke answers the revoke of s that id names, when it was made within
// lease.RevokeRetryWindow, and forgets those made before: a session keeps only the revokes that
// may still be retried.
func (s *entry) retriedRevoke(id revokeID, now time.Time) (lease.RevokeResult, bool) {
	for k, m := range s.revokes {
		if now.Sub(m.at) > lease.RevokeRetryWindow {
			delete(s.revokes, k)
		}
	}
	m, ok := s.revokes[id]
	return cloneResult(m.result), ok
}

// blocked answers the *lease.RetryError of an acquire while grants of s are blocked, and nil
// otherwise.
func (s *entry) blocked(now time.Time) error {
	if !s.blockedUntil.After(now) {
		return nil
	}
	return &lease.RetryError{Err: lease.ErrBlocked, RetryAfter: s.blockedUntil.Sub(now)}
}

// record appends rec to the audit log of its user, with the next id and At = now unless set.
// e.mu must be held: record is part of the critical section that made the change.
func (e *Engine) record(now time.Time, rec lease.AuditRecord) {
	id := lease.NextEventID(e.auditLast, now)
	e.auditLast = id
	rec.ID = id.String()
	if rec.At.IsZero() {
		rec.At = now
	}
	l := e.audit[rec.Key.User]
	if l == nil {
		l = &auditLog{}
		e.audit[rec.Key.User] = l
	}
	l.entries = append(l.entries, auditEntry{id: id, added: now, rec: rec})
	if rec.Admin != "" {
		l.admins++
	}
	e.trimAudit(l, now)
}

// trimAudit drops the records of l past retention from the front, then the oldest records of
// each kind (the user's own, an admin's) beyond AuditMaxRecords of that kind. e.mu must be held.
func (e *Engine) trimAudit(l *auditLog, now time.Time) {
	drop := 0
	for drop < len(l.entries) && !e.auditKept(l.entries[drop], now) {
		if l.entries[drop].rec.Admin != "" {
			l.admins--
		}
		drop++
	}
	if drop > 0 {
		clear(l.entries[:drop]) // let go of the records' strings before the array is reallocated
		l.entries = l.entries[drop:]
	}
	ownOver, adminOver := len(l.entries)-l.admins-e.auditMax, l.admins-e.auditMax
	if ownOver <= 0 && adminOver <= 0 {
		return
	}
	// The usual case, a log at its bound that grew by a record of the user: the records to drop
	// are the oldest, all the user's own, and go from the front at once rather than by copying the
	// log, which would make every change of a busy user's session cost the length of its log.
	if adminOver <= 0 {
		n := 0
		for n < ownOver && l.entries[n].rec.Admin == "" {
			n++
		}
		if n == ownOver {
			clear(l.entries[:n])
			l.entries = l.entries[n:]
			return
		}
	}
	kept := l.entries[:0]
	for _, a := range l.entries {
		switch {
		case a.rec.Admin != "" && adminOver > 0:
			adminOver--
			l.admins--
		case a.rec.Admin == "" && ownOver > 0:
			ownOver--
		default:
			kept = append(kept, a)
		}
	}
	clear(l.entries[len(kept):])
	l.entries = kept
}

func (e *Engine) auditKept(a auditEntry, now time.Time) bool {
	return now.Sub(a.added) <= e.auditRetention
}

// sweepAudit trims every user's audit log and forgets the empty ones. e.mu must be held.
func (e *Engine) sweepAudit(now time.Time) {
	for user, l := range e.audit {
		e.trimAudit(l, now)
		if len(l.entries) == 0 {
			delete(e.audit, user)
		}
	}
}

// Revoke implements lease.Admin.
func (e *Engine) Revoke(ctx context.Context, req lease.RevokeRequest) (lease.RevokeResult, error) {
	if err := req.Validate(); err != nil {
		return lease.RevokeResult{}, err
	}
	now, unlock, err := e.begin(ctx, "revoke")
	if err != nil {
		return lease.RevokeResult{}, err
	}
	defer unlock()
	e.sweep(now)

	s := e.settled(req.Key, now)
	id := revokeID{admin: req.Admin, requestID: req.RequestID}
	if s != nil && req.RequestID != "" {
		if res, ok := s.retriedRevoke(id, now); ok {
			res.Retried = true
			return res, nil
		}
	}
	if s == nil && (req.Block > 0 || req.RequestID != "") {
		s = e.create(req.Key)
	}
	var res lease.RevokeResult
	if s != nil {
		s.handoff = nil // a revoke ends the handoff in progress, requested or reserved
	}
	if s != nil && s.held(now) {
		epoch, err := lease.NextEpoch(s.epoch, now)
		if err != nil {
			return lease.RevokeResult{}, err
		}
		res.Revoked = true
		res.Previous = &lease.Previous{TabID: s.holder.TabID, Epoch: s.epoch}
		s.holder = lease.Holder{}
		s.epoch = epoch
		s.grantedAt, s.expiresAt = now, now
		s.transitions++
		s.releasedTab, s.releasedEpoch = "", 0
		s.ended = epoch // a revoked lease never expires: nothing is left to announce
		e.emit(req.Key, s, now, lease.Event{Type: lease.EventRevoked, Epoch: epoch, Previous: clonePrevious(res.Previous), Reason: req.Reason, At: now})
		e.record(now, lease.AuditRecord{Key: req.Key, Action: lease.AuditRevoke, Epoch: epoch, Admin: req.Admin, Previous: clonePrevious(res.Previous), Reason: req.Reason, RequestID: req.AuditRequestID})
	}
	if req.Block > 0 {
		// A new block replaces the old one, even one that would have ended later.
		s.blockedUntil = now.Add(req.Block)
		e.record(now, lease.AuditRecord{Key: req.Key, Action: lease.AuditBlock, Epoch: s.epoch, Admin: req.Admin, Reason: req.Reason, Until: s.blockedUntil, RequestID: req.AuditRequestID})
	}
	if s != nil {
		res.Epoch = s.epoch
		if s.blockedUntil.After(now) {
			res.BlockedUntil = s.blockedUntil
		}
		if req.RequestID != "" {
			if s.revokes == nil {
				s.revokes = map[revokeID]revokeMemo{}
			}
			s.revokes[id] = revokeMemo{at: now, result: cloneResult(res)}
		}
	}
	return res, nil
}

// ListLeases implements lease.Admin. It looks at every session (an admin call on a one-instance
// engine), and announces nothing.
func (e *Engine) ListLeases(ctx context.Context, q lease.ListQuery) (lease.LeasePage, error) {
	limit, err := q.Validate()
	if err != nil {
		return lease.LeasePage{}, err
	}
	var after lease.Key
	if q.Cursor != "" {
		if after, err = lease.ParseLeaseCursor(q.Cursor); err != nil {
			return lease.LeasePage{}, err
		}
	}
	now, unlock, err := e.begin(ctx, "list leases")
	if err != nil {
		return lease.LeasePage{}, err
	}
	defer unlock()

	var keys []lease.Key
	for key, s := range e.sessions {
		if !s.held(now) || (q.User != "" && key.User != q.User) || (q.Cursor != "" && key.Compare(after) <= 0) {
			continue
		}
		keys = append(keys, key)
	}
	slices.SortFunc(keys, lease.Key.Compare)
	var page lease.LeasePage
	if len(keys) > limit {
		keys = keys[:limit]
		page.Next = lease.LeaseCursor(keys[limit-1])
	}
	page.Leases = make([]lease.Lease, 0, len(keys))
	for _, key := range keys {
		page.Leases = append(page.Leases, e.sessions[key].lease(key, now))
	}
	return page, nil
}

// Audit implements lease.Admin. The cursor is the ID of the last record of the previous page.
func (e *Engine) Audit(ctx context.Context, q lease.AuditQuery) (lease.AuditPage, error) {
	limit, err := q.Validate()
	if err != nil {
		return lease.AuditPage{}, err
	}
	var before lease.EventID // zero: from the newest
	if q.Cursor != "" {
		if before, err = lease.ParseEventID(q.Cursor); err != nil || before.IsZero() {
			return lease.AuditPage{}, &lease.InvalidError{Field: "cursor", Reason: "must be the next cursor of an earlier page"}
		}
	}
	now, unlock, err := e.begin(ctx, "audit")
	if err != nil {
		return lease.AuditPage{}, err
	}
	defer unlock()

	// One cursor per user log, at the newest record before the page's cursor.
	var logs []*auditLog
	if q.User != "" {
		if l := e.audit[q.User]; l != nil {
			logs = append(logs, l)
		}
	} else {
		logs = make([]*auditLog, 0, len(e.audit))
		for _, l := range e.audit {
			logs = append(logs, l)
		}
	}
	m := make(auditMerge, 0, len(logs))
	for _, l := range logs {
		i := len(l.entries) - 1
		if !before.IsZero() {
			i = sort.Search(len(l.entries), func(i int) bool { return l.entries[i].id.Compare(before) >= 0 }) - 1
		}
		if i >= 0 {
			m = append(m, auditCursor{log: l, i: i})
		}
	}
	heap.Init(&m)

	var page lease.AuditPage
	for m.Len() > 0 {
		c := &m[0]
		a := c.log.entries[c.i]
		if c.i--; c.i >= 0 {
			heap.Fix(&m, 0)
		} else {
			heap.Pop(&m)
		}
		if !e.auditKept(a, now) || (q.Session != "" && a.rec.Key.Session != q.Session) {
			continue
		}
		if len(page.Records) == limit {
			page.Next = page.Records[limit-1].ID
			break
		}
		page.Records = append(page.Records, cloneRecord(a.rec))
	}
	return page, nil
}

// clonePrevious, cloneResult and cloneRecord copy what a pointer shares, so that no caller holds
// the engine's data.
func clonePrevious(p *lease.Previous) *lease.Previous {
	if p == nil {
		return nil
	}
	c := *p
	return &c
}

func cloneResult(r lease.RevokeResult) lease.RevokeResult {
	r.Previous = clonePrevious(r.Previous)
	return r
}

func cloneRecord(r lease.AuditRecord) lease.AuditRecord {
	r.Previous = clonePrevious(r.Previous)
	return r
}

// auditCursor is a position in one user's log: the next record of a page is entries[i].
type auditCursor struct {
	log *auditLog
	i   int
}

// auditMerge is a max-heap of the users' cursors by the id of their next record: popping it gives
// the records of every user newest first.
type auditMerge []auditCursor

func (m auditMerge) Len() int { return len(m) }
func (m auditMerge) Less(i, j int) bool {
	return m[i].log.entries[m[i].i].id.Compare(m[j].log.entries[m[j].i].id) > 0
}
func (m auditMerge) Swap(i, j int) { m[i], m[j] = m[j], m[i] }
func (m *auditMerge) Push(x any)   { *m = append(*m, x.(auditCursor)) }
func (m *auditMerge) Pop() any {
	old := *m
	x := old[len(old)-1]
	*m = old[:len(old)-1]
	return x
}

// RecordCatalog implements lease.Admin.
func (e *Engine) RecordCatalog(ctx context.Context, admin, reason string) error {
	if err := lease.ValidateCatalogRecord(admin, reason); err != nil {
		return err
	}
	now, unlock, err := e.begin(ctx, "record catalog")
	if err != nil {
		return err
	}
	defer unlock()
	e.record(now, lease.AuditRecord{Key: lease.Key{User: admin, Session: lease.CatalogSession}, Action: lease.AuditCatalog,
		Admin: admin, Reason: reason})
	return nil
}
