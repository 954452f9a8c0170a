// Package leasemem is the in-memory lease.Engine: the embedded default when no Redis is
// configured (one tablease instance; tests and `tablease serve --dev`). It implements lease.Feed,
// lease.Presence, lease.Admin and lease.ModeHandoff too, each call as one critical section that
// reads the injected clock, and forgets sessions that have been idle for Options.IdleRetention.
//
// Atomicity, losing data, the expiry timer and bounded memory: docs/engines.md.
package leasemem

import (
	"cmp"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/tablease/tablease/lease"
)

// SweepInterval is the least engine time between two sweeps of idle entries, or a quarter of
// Options.IdleRetention when that is shorter.
const SweepInterval = time.Minute

// ErrClosed is the store error inside the *lease.UnavailableError that every call answers after
// Close.
var ErrClosed = errors.New("leasemem: engine closed")

// Options configure an Engine.
type Options struct {
	// Limits bound the TTLs granted. The zero value means lease.DefaultLimits; anything else must
	// pass Limits.Validate.
	Limits lease.Limits
	// Now is the engine's clock (default time.Now). The engine reads no other clock for its
	// decisions; the expiry timer sleeps in real time (see ExpiryCheckInterval).
	Now func() time.Time
	// EventLogLen is the number of events each session's log keeps for replay (default
	// lease.DefaultEventLogLen). It must not be negative.
	EventLogLen int
	// WatchBuffer is the number of events a watch buffers for a reader that is behind (default
	// lease.DefaultWatchBuffer); one more ends the watch with lease.ErrResync. It must not be
	// negative.
	WatchBuffer int
	// PresenceTTL is how long a presence entry lives unless refreshed (default
	// lease.DefaultPresenceTTL). It must be zero or at least a millisecond; it is truncated to
	// whole milliseconds.
	PresenceTTL time.Duration
	// ExpiryCheckInterval is the longest the expiry timer sleeps, in real time, between two looks
	// at the live sessions (default DefaultExpiryCheckInterval). The timer also wakes at the
	// earliest expiry it knows of, which is exact with a real clock; the interval is what drives a
	// fake clock that tests advance by hand, and bounds the delay after a clock jump. It must not
	// be negative.
	ExpiryCheckInterval time.Duration
	// AuditRetention is how long an audit record is kept after it was appended (default
	// lease.DefaultAuditRetention). It must not be negative.
	AuditRetention time.Duration
	// AuditMaxRecords is the most audit records kept per user, the oldest dropped first (default
	// lease.DefaultAuditMaxRecords). It must not be negative.
	AuditMaxRecords int
	// HandoffTimeout is how long a holder has to let go after a handoff request before the request
	// lapses (default lease.DefaultHandoffTimeout), and HandoffReserve how long the lease then stays
	// reserved for the requester (default lease.DefaultHandoffReserve); see lease.ModeHandoff. Each
	// must be zero or at least a millisecond; they are truncated to whole milliseconds.
	HandoffTimeout time.Duration
	HandoffReserve time.Duration
	// SessionsPerUser bounds the sessions each user has an entry for (see
	// lease.ErrTooManySessions); zero means no bound. It must not be negative.
	SessionsPerUser int
	// IdleRetention is how long the entry of a session is kept after the last thing in it ended
	// (default lease.DefaultIdleRetention, which says what is forgotten and why it is safe). It
	// must be zero or at least a millisecond.
	IdleRetention time.Duration
}

// DefaultExpiryCheckInterval is the default of Options.ExpiryCheckInterval.
const DefaultExpiryCheckInterval = 250 * time.Millisecond

// Engine is an in-memory lease.Engine. Use New; the zero value is not usable.
type Engine struct {
	// Immutable after New.
	limits        lease.Limits
	now           func() time.Time
	logLen        int
	watchBuffer   int
	presenceTTL   time.Duration
	checkInterval time.Duration
	wake          chan struct{} // (capacity 1) makes the expiry timer look again at once
	done          chan struct{} // closed by Close, to stop the expiry timer
	timers        sync.WaitGroup
	// auditRetention and auditMax bound each user's audit log.
	auditRetention time.Duration
	auditMax       int
	// handoffTimeout and handoffReserve time handoffs (see handoff.go).
	handoffTimeout time.Duration
	handoffReserve time.Duration
	perUser        int // Options.SessionsPerUser
	// idle is Options.IdleRetention, and sweepEvery the least engine time between two sweeps.
	idle       time.Duration
	sweepEvery time.Duration

	// mu protects every field below; each call takes it once, for the whole of its decision.
	mu sync.Mutex
	// sessions maps a key to its state. An entry exists from the first Acquire of the key until the
	// sweep deletes it (see sweep). perUserCount counts the entries of each user.
	sessions     map[lease.Key]*entry
	perUserCount map[string]int
	// peak is the largest len(sessions) since the map was last allocated; the sweep reallocates the
	// map when it has shrunk well below it, since Go maps never give back their buckets.
	peak int
	// lastSweep is the engine time of the last sweep of idle entries.
	lastSweep time.Time
	// closed is set by Close; every later call fails with ErrClosed.
	closed bool
	// live holds the entries that have watchers or presence entries: those the expiry timer looks
	// at. An entry in live is never swept.
	live map[lease.Key]*entry
	// timerOn is true while the expiry timer goroutine runs; timerAt is the engine time it will
	// look again at (zero when unknown), so that a change bringing a deadline earlier can wake it.
	timerOn bool
	timerAt time.Time
	// audit holds each user's audit log (see admin.go), apart from the session entries so that it
	// outlives them; auditLast is the id of the last record appended, which the next must exceed.
	audit     map[string]*auditLog
	auditLast lease.EventID
}

// entry is the state of one session; it is only touched with Engine.mu held.
type entry struct {
	holder lease.Holder // the last holder; meaningful while held
	// epoch is the last epoch granted, whether or not the lease is still held.
	epoch int64
	// grantedAt is when epoch was granted. expiresAt is when the lease ends: the grant or last
	// renew plus its TTL, or the time of the release. The lease is held while expiresAt > now.
	grantedAt time.Time
	expiresAt time.Time
	ttl       time.Duration // the TTL of the last grant or renew
	// transitions counts the epochs minted in this session (grants and revokes).
	transitions int64
	// releasedTab and releasedEpoch name the lease that the last successful Release ended, until the
	// next grant (empty and 0 otherwise), so that a retried release answers as the first one did.
	releasedTab   string
	releasedEpoch int64
	// ended is the last epoch whose end (release or expiry) was announced: the expiry marker. An
	// expired lease whose epoch is not ended still has its EventExpired to come.
	ended int64

	// log is the session's recent events; lastID the id of the last event ever appended, which
	// the next id must exceed.
	log    eventLog
	lastID lease.EventID
	// watchers are the session's watches.
	watchers map[*lease.WatchSender]struct{}
	// present holds the session's presence entries by tab and connection.
	present map[presenceKey]*presenceEntry
	// marks holds, per connection, the number of the latest ordered write of an entry a Leave
	// removed, until the entry would have lapsed (lease.Presence.Leave).
	marks map[presenceKey]presenceMark

	// blockedUntil is when grants open again after an admin's block (zero: never blocked).
	blockedUntil time.Time
	// revokes are the revokes of the session with a RequestID within the last
	// lease.RevokeRetryWindow, by admin and RequestID, for their retries; nil if none.
	revokes map[revokeID]revokeMemo
	// handoff is the session's handoff request or reservation, nil if none (see handoff.go).
	handoff *handoff
	// gone holds the tabs that said they are gone (lease.ReleaseRequest.Gone), at most
	// lease.MaxGone, each with the end of its window, until which its acquires are refused.
	gone map[string]time.Time
}

func (s *entry) held(now time.Time) bool { return s.expiresAt.After(now) }

// markGone refuses the acquires of tab for lease.GoneWindow from now, forgetting the marks whose
// window ended, and the one that ends first beyond lease.MaxGone.
func (s *entry) markGone(tab string, now time.Time) {
	if s.gone == nil {
		s.gone = map[string]time.Time{}
	}
	putBounded(s.gone, tab, now.Add(lease.GoneWindow), now, lease.MaxGone,
		func(until time.Time) time.Time { return until }, func(a, b string) bool { return a < b })
}

// putBounded sets m[k] = v, having forgotten the values that lapsed by now; then, while m holds
// more than limit, it forgets the one that lapses first (by until; on a tie, the lesser key by
// less): the marks of a session stay bounded however many calls make them.
func putBounded[K comparable, V any](m map[K]V, k K, v V, now time.Time, limit int, until func(V) time.Time, less func(a, b K) bool) {
	for key, old := range m {
		if !until(old).After(now) {
			delete(m, key)
		}
	}
	m[k] = v
	for len(m) > limit {
		first := k
		for key, old := range m {
			u, f := until(old), until(m[first])
			if u.Before(f) || (u.Equal(f) && less(key, first)) {
				first = key
			}
		}
		delete(m, first)
	}
}

// goneKept reports whether a gone tab's mark keeps s at now: for the retention idle after the
// release that made it, a change, and not before its window ends (as the Redis engine keeps it).
func (s *entry) goneKept(now time.Time, idle time.Duration) bool {
	for _, until := range s.gone {
		if until.After(now) || until.Add(idle-lease.GoneWindow).After(now) {
			return true
		}
	}
	return false
}

func (s *entry) heldBy(tabID string, epoch int64, now time.Time) bool {
	return s.held(now) && s.holder.TabID == tabID && s.epoch == epoch
}

// New returns an empty engine. It fails with a *lease.InvalidError when opts.Limits are not
// ordered (see lease.Limits.Validate) or another option is out of range. It starts no goroutine:
// the expiry timer runs only while some session is watched or has tabs present.
func New(opts Options) (*Engine, error) {
	limits, err := opts.Limits.OrDefault()
	if err != nil {
		return nil, err
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	for _, o := range []struct {
		field, reason string
		bad           bool
	}{
		{"EventLogLen", "must not be negative", opts.EventLogLen < 0},
		{"WatchBuffer", "must not be negative", opts.WatchBuffer < 0},
		{"PresenceTTL", "must be zero (the default) or at least a millisecond", opts.PresenceTTL < 0 || (opts.PresenceTTL > 0 && opts.PresenceTTL < time.Millisecond)},
		{"ExpiryCheckInterval", "must not be negative", opts.ExpiryCheckInterval < 0},
		{"AuditRetention", "must not be negative", opts.AuditRetention < 0},
		{"AuditMaxRecords", "must not be negative", opts.AuditMaxRecords < 0},
		{"HandoffTimeout", "must be zero (the default) or at least a millisecond", opts.HandoffTimeout < 0 || (opts.HandoffTimeout > 0 && opts.HandoffTimeout < time.Millisecond)},
		{"HandoffReserve", "must be zero (the default) or at least a millisecond", opts.HandoffReserve < 0 || (opts.HandoffReserve > 0 && opts.HandoffReserve < time.Millisecond)},
		{"SessionsPerUser", "must not be negative", opts.SessionsPerUser < 0},
		{"IdleRetention", "must be zero (the default) or at least a millisecond", opts.IdleRetention < 0 || (opts.IdleRetention > 0 && opts.IdleRetention < time.Millisecond)},
	} {
		if o.bad {
			return nil, &lease.InvalidError{Field: o.field, Reason: o.reason}
		}
	}
	idle := cmp.Or(opts.IdleRetention, lease.DefaultIdleRetention)
	e := &Engine{
		limits:        limits,
		now:           now,
		logLen:        cmp.Or(opts.EventLogLen, lease.DefaultEventLogLen),
		watchBuffer:   cmp.Or(opts.WatchBuffer, lease.DefaultWatchBuffer),
		presenceTTL:   cmp.Or(opts.PresenceTTL.Truncate(time.Millisecond), lease.DefaultPresenceTTL),
		checkInterval: cmp.Or(opts.ExpiryCheckInterval, DefaultExpiryCheckInterval),
		wake:          make(chan struct{}, 1),
		done:          make(chan struct{}),
		sessions:      make(map[lease.Key]*entry),
		perUserCount:  make(map[string]int),
		perUser:       opts.SessionsPerUser,
		idle:          idle,
		sweepEvery:    min(SweepInterval, idle/4),
		live:          make(map[lease.Key]*entry),

		auditRetention: cmp.Or(opts.AuditRetention, lease.DefaultAuditRetention),
		auditMax:       cmp.Or(opts.AuditMaxRecords, lease.DefaultAuditMaxRecords),
		audit:          make(map[string]*auditLog),

		handoffTimeout: cmp.Or(opts.HandoffTimeout.Truncate(time.Millisecond), lease.DefaultHandoffTimeout),
		handoffReserve: cmp.Or(opts.HandoffReserve.Truncate(time.Millisecond), lease.DefaultHandoffReserve),
	}
	return e, nil
}

var _ lease.Engine = (*Engine)(nil)

// Acquire implements lease.Engine.Acquire, lease.ModeHandoff included.
func (e *Engine) Acquire(ctx context.Context, req lease.AcquireRequest) (lease.Lease, error) {
	mode, err := req.Validate()
	if err != nil {
		return lease.Lease{}, err
	}
	ttl, err := e.limits.Clamp(req.TTL, req.Holder.Hidden)
	if err != nil {
		return lease.Lease{}, err
	}
	now, unlock, err := e.begin(ctx, "acquire")
	if err != nil {
		return lease.Lease{}, err
	}
	defer unlock()
	e.sweep(now)

	s := e.settled(req.Key, now)
	if s != nil {
		if until := s.gone[req.Holder.TabID]; until.After(now) {
			return lease.Lease{}, &lease.RetryError{Err: lease.ErrTabGone, RetryAfter: until.Sub(now)}
		}
		if err := s.blocked(now); err != nil {
			return lease.Lease{}, err
		}
	}
	var previous *lease.Previous // the holder taken over
	var former *lease.Previous   // the holder at its former epoch, when it asked for a new one
	if s != nil && s.held(now) {
		switch {
		case s.holder.TabID == req.Holder.TabID && req.NewEpoch:
			former = &lease.Previous{TabID: s.holder.TabID, Epoch: s.epoch}
		case s.holder.TabID == req.Holder.TabID:
			changed := s.holder != req.Holder
			s.holder = req.Holder
			return e.extend(req.Key, s, now, ttl, changed), nil
		case mode == lease.ModeHandoff:
			return lease.Lease{}, e.requestHandoff(req.Key, s, req.Holder, now)
		case mode == lease.ModeTry:
			return lease.Lease{}, &lease.HeldError{Holder: s.holder, Epoch: s.epoch, Remaining: s.expiresAt.Sub(now)}
		default:
			previous = &lease.Previous{TabID: s.holder.TabID, Epoch: s.epoch}
		}
	}
	// handedBy is the tab that handed the lease over, when this grant claims its reservation.
	var handedBy *lease.Previous
	if r := s.reservation(now); r != nil {
		switch {
		case r.requester.TabID == req.Holder.TabID:
			handedBy = &r.from
		case mode != lease.ModeTakeover:
			return lease.Lease{}, &lease.RetryError{Err: lease.ErrHandoffPending, RetryAfter: r.until.Sub(now)}
		}
	}
	var last int64
	if s != nil {
		last = s.epoch
	}
	epoch, err := lease.NextEpoch(last, now)
	if err != nil {
		return lease.Lease{}, err
	}
	if s == nil {
		if s, err = e.admit(req.Key); err != nil {
			return lease.Lease{}, err
		}
	}
	s.holder = req.Holder
	s.epoch = epoch
	s.grantedAt = now
	s.expiresAt = now.Add(ttl)
	s.ttl = ttl
	s.transitions++
	s.releasedTab, s.releasedEpoch = "", 0
	s.handoff = nil // a new grant ends every handoff in progress
	ev := s.event(lease.EventGranted, now)
	rec := lease.AuditRecord{Key: req.Key, Action: lease.AuditGrant, Epoch: epoch, TabID: req.Holder.TabID}
	switch {
	case previous != nil:
		ev.Type, ev.Previous = lease.EventTakenOver, previous
		rec.Action, rec.Previous = lease.AuditTakeover, clonePrevious(previous)
	case handedBy != nil:
		ev.Previous, ev.Reason = clonePrevious(handedBy), lease.ReasonHandoff
		rec.Action, rec.Previous = lease.AuditHandoff, clonePrevious(handedBy)
	case former != nil:
		ev.Previous, ev.Reason = clonePrevious(former), lease.ReasonNewEpoch
		rec.Previous = clonePrevious(former)
	}
	e.emit(req.Key, s, now, ev)
	e.record(now, rec)
	e.deadline(req.Key, s.expiresAt)
	return s.lease(req.Key, now), nil
}

// Renew implements lease.Engine.
func (e *Engine) Renew(ctx context.Context, req lease.RenewRequest) (lease.Lease, error) {
	if err := req.Validate(); err != nil {
		return lease.Lease{}, err
	}
	ttl, err := e.limits.Clamp(req.TTL, req.Hidden)
	if err != nil {
		return lease.Lease{}, err
	}
	now, unlock, err := e.begin(ctx, "renew")
	if err != nil {
		return lease.Lease{}, err
	}
	defer unlock()
	e.sweep(now)

	s := e.settled(req.Key, now)
	if s == nil || !s.heldBy(req.TabID, req.Epoch, now) {
		return lease.Lease{}, &lease.LostError{Current: e.lease(req.Key, now)}
	}
	changed := s.holder.Hidden != req.Hidden
	s.holder.Hidden = req.Hidden
	return e.extend(req.Key, s, now, ttl, changed), nil
}

// extend extends the lease of s from now by ttl for its holder, keeping the epoch, and announces
// an update when changed says the holder's label or hidden flag changed. e.mu must be held.
func (e *Engine) extend(key lease.Key, s *entry, now time.Time, ttl time.Duration, changed bool) lease.Lease {
	s.expiresAt = now.Add(ttl)
	s.ttl = ttl
	if changed {
		e.emit(key, s, now, s.event(lease.EventUpdated, now))
	}
	e.deadline(key, s.expiresAt)
	return s.lease(key, now)
}

// Release implements lease.Engine. Released is true when this call ended the lease, and also when
// the lease is still free since a release by the same tab and epoch ended it, so that a retried
// release gets the answer of the first one.
func (e *Engine) Release(ctx context.Context, req lease.ReleaseRequest) (lease.ReleaseResult, error) {
	if err := req.Validate(); err != nil {
		return lease.ReleaseResult{}, err
	}
	now, unlock, err := e.begin(ctx, "release")
	if err != nil {
		return lease.ReleaseResult{}, err
	}
	defer unlock()
	e.sweep(now)

	s := e.settled(req.Key, now)
	if req.Gone {
		if s == nil {
			var err error
			if s, err = e.admit(req.Key); err != nil {
				return lease.ReleaseResult{}, err // no mark: see lease.ReleaseRequest.Gone
			}
		}
		s.markGone(req.TabID, now)
		if s.handoff != nil && s.handoff.requester.TabID == req.TabID {
			s.handoff = nil // a closed tab is handed nothing
		}
		switch {
		case s.held(now) && s.holder.TabID == req.TabID:
			req.Epoch = s.epoch
		case s.releasedTab == req.TabID:
			req.Epoch = s.releasedEpoch // a retry: answered as the release that ended the tab's lease
		default:
			return lease.ReleaseResult{Lease: s.lease(req.Key, now)}, nil
		}
	}
	switch {
	case s == nil:
		return lease.ReleaseResult{Lease: e.lease(req.Key, now)}, nil
	case s.heldBy(req.TabID, req.Epoch, now):
		ev := lease.Event{
			Type:     lease.EventReleased,
			Epoch:    s.epoch,
			Previous: &lease.Previous{TabID: req.TabID, Epoch: req.Epoch},
			At:       now,
		}
		ev.Requester = e.reserve(s, now)
		s.expiresAt = now
		s.releasedTab, s.releasedEpoch = req.TabID, req.Epoch
		s.ended = s.epoch
		s.holder = lease.Holder{} // a free lease keeps no holder
		e.emit(req.Key, s, now, ev)
		e.record(now, lease.AuditRecord{
			Key:      req.Key,
			Action:   lease.AuditRelease,
			Epoch:    s.epoch,
			TabID:    req.TabID,
			Previous: &lease.Previous{TabID: req.TabID, Epoch: req.Epoch},
		})
		return lease.ReleaseResult{Released: true, Lease: s.lease(req.Key, now)}, nil
	default:
		retried := !s.held(now) && s.releasedTab == req.TabID && s.releasedEpoch == req.Epoch
		return lease.ReleaseResult{Released: retried, Lease: s.lease(req.Key, now)}, nil
	}
}

// Get implements lease.Engine.
func (e *Engine) Get(ctx context.Context, key lease.Key) (lease.Lease, error) {
	if err := key.Validate(); err != nil {
		return lease.Lease{}, err
	}
	now, unlock, err := e.begin(ctx, "get")
	if err != nil {
		return lease.Lease{}, err
	}
	defer unlock()
	e.sweep(now)        // a session idle for the retention reads as forgotten, as on Redis
	e.settled(key, now) // an expiry is announced before the answer that shows it
	return e.lease(key, now), nil
}

// Check implements lease.Engine.
func (e *Engine) Check(ctx context.Context, key lease.Key, tabID string, epoch int64) (lease.Lease, error) {
	if err := lease.ValidateCheck(key, tabID, epoch); err != nil {
		return lease.Lease{}, err
	}
	now, unlock, err := e.begin(ctx, "check")
	if err != nil {
		return lease.Lease{}, err
	}
	defer unlock()
	s := e.settled(key, now)
	if s == nil || !s.heldBy(tabID, epoch, now) {
		return lease.Lease{}, &lease.LostError{Current: e.lease(key, now)}
	}
	return s.lease(key, now), nil
}

// Ping implements lease.Engine: it answers nil until Close.
func (e *Engine) Ping(ctx context.Context) error {
	_, unlock, err := e.begin(ctx, "ping")
	if err != nil {
		return err
	}
	unlock()
	return nil
}

// Close forgets every lease and ends every watch (whose Err is then a *lease.UnavailableError
// wrapping ErrClosed); later calls fail with a *lease.UnavailableError wrapping ErrClosed. It
// returns once the expiry timer has stopped. Closing twice is not an error.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	for _, s := range e.live {
		for w := range s.watchers {
			w.End(&lease.UnavailableError{Op: "watch", Err: ErrClosed})
		}
	}
	e.sessions, e.live, e.audit = nil, nil, nil
	e.mu.Unlock()
	close(e.done)
	e.timers.Wait()
	return nil
}

// begin starts the critical section of one call: it fails with a *lease.UnavailableError when ctx
// is done or the engine is closed, and otherwise returns the engine time and the func that ends
// the section. The clock is read with e.mu held, so that times follow the order of the sections.
func (e *Engine) begin(ctx context.Context, op string) (time.Time, func(), error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, nil, &lease.UnavailableError{Op: op, Err: err}
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return time.Time{}, nil, &lease.UnavailableError{Op: op, Err: ErrClosed}
	}
	// Truncate strips the monotonic reading; UTC keeps answers independent of the clock's zone.
	return e.now().Truncate(time.Microsecond).UTC(), e.mu.Unlock, nil
}

// lease answers the state of key at now, a free lease with epoch 0 when there is no entry.
// e.mu must be held.
func (e *Engine) lease(key lease.Key, now time.Time) lease.Lease {
	if s := e.sessions[key]; s != nil {
		return s.lease(key, now)
	}
	return lease.Lease{Key: key, Now: now}
}

func (s *entry) lease(key lease.Key, now time.Time) lease.Lease {
	l := lease.Lease{
		Key:         key,
		Held:        s.held(now),
		Epoch:       s.epoch,
		GrantedAt:   s.grantedAt,
		ExpiresAt:   s.expiresAt,
		TTL:         s.ttl,
		Transitions: s.transitions,
		Now:         now,
	}
	if l.Held {
		l.Holder = s.holder
	}
	l.Handoff = s.handoffAt(now)
	if s.blockedUntil.After(now) {
		l.BlockedUntil = s.blockedUntil
	}
	return l
}

// sweep announces the expiries nobody announced yet and deletes the entries that have been idle
// for longer than e.idle, at most once per e.sweepEvery of engine time. e.mu must be held.
func (e *Engine) sweep(now time.Time) {
	if now.Sub(e.lastSweep) < e.sweepEvery && !now.Before(e.lastSweep) {
		return
	}
	e.lastSweep = now
	nowMicros := now.UnixMicro()
	for key, s := range e.sessions {
		// The epoch test keeps fencing safe even if epochs ran ahead of the clock, and the event
		// test keeps event ids increasing if they did.
		idle := e.live[key] == nil && now.Sub(s.expiresAt) > e.idle && s.epoch < nowMicros &&
			now.Sub(time.UnixMilli(int64(s.lastID.Millis))) > e.idle && !s.keptByAdmin(now, e.idle) &&
			(s.handoff == nil || !s.handoff.until.Add(e.idle).After(now)) && !s.goneKept(now, e.idle)
		// An expiry nobody announced yet (nobody watches the session, no call came) is announced
		// here, and so gets its audit record, whether or not the entry goes: as the Redis engine's
		// sweep does.
		e.settle(key, s, now)
		if idle {
			delete(e.sessions, key)
			if e.perUserCount[key.User]--; e.perUserCount[key.User] == 0 {
				delete(e.perUserCount, key.User)
			}
		}
	}
	e.sweepAudit(now)
	// Go maps keep their buckets after deletes: copy a map that shrank to a quarter of its peak.
	if e.peak >= 1024 && len(e.sessions) <= e.peak/4 {
		fresh := make(map[lease.Key]*entry, len(e.sessions))
		for key, s := range e.sessions {
			fresh[key] = s
		}
		e.sessions = fresh
		e.peak = len(fresh)
	}
}
