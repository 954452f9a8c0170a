// Package leaseredis is the Redis lease.Engine, on a go-redis v9 UniversalClient (standalone,
// Sentinel or Cluster), for several tablease instances sharing one Redis. It implements
// lease.Feed, lease.Presence, lease.Admin and lease.ModeHandoff too, each call as one Lua script
// that takes the time from redis.call('TIME'). Redis must run with maxmemory-policy noeviction
// (see Engine.EvictionPolicy).
//
// Key layout, script design, expiry timers, memory and failure semantics: docs/engines.md.
package leaseredis

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tablease/tablease/lease"
)

// Defaults of Options.
const (
	DefaultPrefix      = "tablease"
	DefaultOpTimeout   = 2 * time.Second
	DefaultEventLogTTL = 10 * time.Minute
)

// ErrClosed is the store error inside the *lease.UnavailableError that every call answers after
// Close.
var ErrClosed = errors.New("leaseredis: engine closed")

// Options configure an Engine.
type Options struct {
	// Limits bound the TTLs granted. The zero value means lease.DefaultLimits; anything else must
	// pass Limits.Validate.
	Limits lease.Limits
	// Prefix starts every key (default DefaultPrefix). It must be a valid identifier (see
	// lease.ValidateID): it cannot hold braces, so it never changes the hash tag.
	Prefix string
	// OpTimeout bounds each store operation, retries included (default DefaultOpTimeout). The
	// client must honour context deadlines (ContextTimeoutEnabled; NewClient sets it).
	OpTimeout time.Duration

	// EventLogLen is the number of events each session's log keeps for replay (default
	// lease.DefaultEventLogLen). It must not be negative.
	EventLogLen int
	// EventLogTTL is how long a session's log is kept after its last event or its last watcher
	// (default DefaultEventLogTTL): a watch that resumes after it starts from a snapshot. A session
	// has a log only from its first watch on (events.lua), which each engine watching it keeps
	// every tenth of this TTL (every 100 ms when that is longer), so that it outlives the last
	// watcher by at least nine tenths of it. It must be zero or at least a millisecond; it is
	// truncated to whole milliseconds.
	EventLogTTL time.Duration
	// WatchBuffer is the number of events a watch buffers for a reader that is behind (default
	// lease.DefaultWatchBuffer); one more ends the watch with lease.ErrResync. It must not be
	// negative.
	WatchBuffer int
	// PresenceTTL is how long a presence entry lives unless refreshed by another Join (default
	// lease.DefaultPresenceTTL). It must be zero or at least a millisecond; it is truncated to
	// whole milliseconds. Every instance sharing a prefix should use the same.
	PresenceTTL time.Duration

	// AuditRetention is how long an audit record is kept after it was appended (default
	// lease.DefaultAuditRetention). It must be zero or at least a millisecond; it is truncated to
	// whole milliseconds. Every instance sharing a prefix should use the same.
	AuditRetention time.Duration
	// AuditMaxRecords is the number of audit records kept per user, the oldest dropped first
	// (default lease.DefaultAuditMaxRecords). Redis trims the log with MAXLEN ~, in whole stream
	// nodes, so it may keep up to a hundred more. It must not be negative.
	AuditMaxRecords int

	// HandoffTimeout is how long a holder has to let go after a handoff request before the request
	// lapses (default lease.DefaultHandoffTimeout), and HandoffReserve how long the lease then stays
	// reserved for the requester (default lease.DefaultHandoffReserve); see lease.ModeHandoff. Each
	// must be zero or at least a millisecond; they are truncated to whole milliseconds. A request
	// keeps the reserve window of the instance that accepted it, whichever instance then ends the
	// lease; every instance sharing a prefix should use the same.
	HandoffTimeout time.Duration
	HandoffReserve time.Duration

	// IdleRetention is how long the state of a session is kept after the last thing in it ended
	// (default lease.DefaultIdleRetention, which says what is forgotten and why it is safe). It
	// must be zero or at least a millisecond; it is truncated to whole milliseconds. Every instance
	// sharing a prefix should use the same.
	IdleRetention time.Duration
	// SessionsPerUser bounds the sessions each user has state for (see lease.ErrTooManySessions);
	// zero means no bound. It must not be negative.
	SessionsPerUser int

	// OnSweep, when set, is called after each sweep this engine made (its turn, see sweep.go) with
	// the number of expiries it announced and the store error that ended it, if any, and when
	// taking the turn failed. It runs on the sweep's goroutine, never after Close returns.
	OnSweep func(announced int, err error)

	// OnClockOffset, when set, is called once per sweep period (sweep.go) on every engine, with
	// how far Redis's clock (TIME) is ahead of this process's (negative: behind) and the round trip
	// that bounds the error of that figure; a TIME that fails is passed over. Leases run on Redis's
	// clock, and the lease tokens it dates are checked on others (ClockOffset).
	OnClockOffset func(offset, rtt time.Duration)

	// OnResubscribe, when set, is called each time the engine replaced its subscription because
	// it did not hear its own heartbeat back within silence (see beat in feed.go), before the
	// local watches end with lease.ErrResync. It must not block.
	OnResubscribe func(silence time.Duration)

	// OnLostEvents, when set, is called when the settle script of a session this engine watches
	// found its event log without events its watches were sent (settle.lua: the store lost data
	// without dropping a connection, as a FLUSHALL does), after those watches ended with
	// lease.ErrResync. It must not block.
	OnLostEvents func(key lease.Key)

	// OnMissedEvents, when set, is called when watches of a session this engine watches ended
	// with lease.ErrResync because they missed events: the events of a session are published
	// only while it has an event log (events.lua), and a watched session's log went missing (the
	// store lost it, or the settle scripts that keep it failed for EventLogTTL). It must not block.
	OnMissedEvents func(key lease.Key)

	// RevokeReplicas is how many replicas of the primary that holds a session must confirm a
	// revoke of it (Redis's WAIT, within OpTimeout) before Revoke answers it (revokeCall in
	// admin.go); zero, the default, answers once the primary ran it. It needs a *redis.Client (standalone or
	// Sentinel) or a *redis.ClusterClient, and must not be negative.
	RevokeReplicas int
}

// replyKeptFor is how many OpTimeouts the answer of a call that changes a session is kept for
// its retries (see state.lua): go-redis resends a command only within the call's OpTimeout, and
// the rest covers a Redis that stalls before it reads the resent command.
const replyKeptFor = 5

// AnswersKept is how long an engine of operation timeout opTimeout (0: DefaultOpTimeout) keeps the
// answer of a call that changes a session in Redis, for the call's retries.
func AnswersKept(opTimeout time.Duration) time.Duration {
	return replyKeptFor * cmp.Or(opTimeout, DefaultOpTimeout)
}

// Engine is the Redis lease.Engine. Use New; the zero value is not usable. It is safe for
// concurrent use.
type Engine struct {
	// Immutable after New.
	client      redis.UniversalClient // not owned: the caller closes it
	batches     *batchers             // send the functions' calls (call)
	limits      lease.Limits
	prefix      string
	opTimeout   time.Duration
	logLen      int
	logTTL      time.Duration
	watchBuffer int
	presenceTTL time.Duration
	auditTTL    time.Duration // Options.AuditRetention
	auditLen    int           // Options.AuditMaxRecords
	// handoffTimeout and handoffReserve time handoffs (Options.HandoffTimeout, HandoffReserve).
	handoffTimeout time.Duration
	handoffReserve time.Duration
	idle           time.Duration    // Options.IdleRetention
	perUser        int              // Options.SessionsPerUser
	sweepEvery     time.Duration    // how often the engine offers to sweep (sweep.go)
	onSweep        func(int, error) // Options.OnSweep
	onClockOffset  func(offset, rtt time.Duration)
	onResubscribe  func(time.Duration) // Options.OnResubscribe
	onLostEvents   func(lease.Key)     // Options.OnLostEvents
	onMissedEvents func(lease.Key)     // Options.OnMissedEvents
	revokeReplicas int                 // Options.RevokeReplicas
	// common is the first argument of every session script, the engine's seven options (see
	// state.lua), formatted once.
	common []any
	// usersHorizon is how long the engine trusts its own add of a user to the users index, and now
	// the clock it measures that with (time.Now; tests set both right after New). See "Listing" in
	// admin.go.
	usersHorizon time.Duration
	now          func() time.Time
	// added records the users this engine added to the users index, and when (see admin.go).
	added addedUsers
	// ctx is canceled by Close; it bounds the engine's own store calls (the subscription and the
	// settle timers), which no caller waits for.
	ctx    context.Context
	cancel context.CancelFunc

	closed atomic.Bool // set first thing by Close: every later call fails with ErrClosed
	// loadMu serialises the loads of the library (loadLibrary), and loads counts them.
	loadMu sync.Mutex
	loads  atomic.Uint64
	timers sync.WaitGroup // the settle timers running a script, the sharded subscriptions' goroutines and the sweep loop; Close waits for them

	// mu protects the fields below: the local watchers, their settle timers and the subscription.
	// It is never held during a store call.
	mu sync.Mutex
	// shut is set by Close (under mu): nothing is registered or scheduled after it.
	shut bool
	// sessions holds the sessions this engine has watchers for (see feed.go); an entry exists
	// while it has at least one watcher.
	sessions map[lease.Key]*watched
	// pubsub is the engine's one subscription, to the prefix's channel: nil until the first Watch.
	// subscribed is closed once Redis confirmed it; readerDone once its reader goroutine ended.
	pubsub     *redis.PubSub
	subscribed chan struct{}
	readerDone chan struct{}
	// heartbeat is what this engine publishes on its channel to learn that its subscription still
	// hears what is published (see feed.go); heard is when it last heard it (Unix nanoseconds).
	heartbeat string
	heard     atomic.Int64
	// shards and users are the sharded subscriptions on a Redis Cluster instead (see feed.go): by
	// the address of each shard's primary, and by user; nil until the first Watch.
	shards map[string]*shardSub
	users  map[string]*userSub
}

var _ lease.Engine = (*Engine)(nil)

// New returns an engine that keeps its leases in the Redis of client. The engine does not own the
// client: Close leaves it open, and the caller closes it after closing the engine.
//
// It fails with a *lease.InvalidError for bad limits or prefix, and with an error when client is
// nil, OpTimeout is negative, or client is a *redis.Client, *redis.ClusterClient or *redis.Ring
// without ContextTimeoutEnabled (its calls would not be bounded by OpTimeout), or RevokeReplicas
// is positive and client is neither a *redis.Client nor a *redis.ClusterClient.
func New(client redis.UniversalClient, opts Options) (*Engine, error) {
	if client == nil {
		return nil, errors.New("leaseredis: nil client")
	}
	limits, err := opts.Limits.OrDefault()
	if err != nil {
		return nil, err
	}
	prefix := opts.Prefix
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if err := lease.ValidateID("prefix", prefix); err != nil {
		return nil, err
	}
	timeout := opts.OpTimeout
	switch {
	case timeout == 0:
		timeout = DefaultOpTimeout
	case timeout < 0:
		return nil, fmt.Errorf("leaseredis: negative OpTimeout %v", timeout)
	}
	if !contextTimeoutEnabled(client) {
		return nil, errors.New("leaseredis: the client must be created with ContextTimeoutEnabled " +
			"(NewClient does it), or store calls would outlive OpTimeout")
	}
	if opts.RevokeReplicas > 0 {
		switch client.(type) {
		case *redis.Client, *redis.ClusterClient:
		default:
			return nil, fmt.Errorf("leaseredis: RevokeReplicas needs a *redis.Client or a *redis.ClusterClient, not a %T", client)
		}
	}
	for _, o := range []struct {
		field, reason string
		bad           bool
	}{
		{"EventLogLen", "must not be negative", opts.EventLogLen < 0},
		{"EventLogTTL", "must be zero (the default) or at least a millisecond", opts.EventLogTTL < 0 || (opts.EventLogTTL > 0 && opts.EventLogTTL < time.Millisecond)},
		{"WatchBuffer", "must not be negative", opts.WatchBuffer < 0},
		{"PresenceTTL", "must be zero (the default) or at least a millisecond", opts.PresenceTTL < 0 || (opts.PresenceTTL > 0 && opts.PresenceTTL < time.Millisecond)},
		{"AuditRetention", "must be zero (the default) or at least a millisecond", opts.AuditRetention < 0 || (opts.AuditRetention > 0 && opts.AuditRetention < time.Millisecond)},
		{"AuditMaxRecords", "must not be negative", opts.AuditMaxRecords < 0},
		{"HandoffTimeout", "must be zero (the default) or at least a millisecond", opts.HandoffTimeout < 0 || (opts.HandoffTimeout > 0 && opts.HandoffTimeout < time.Millisecond)},
		{"HandoffReserve", "must be zero (the default) or at least a millisecond", opts.HandoffReserve < 0 || (opts.HandoffReserve > 0 && opts.HandoffReserve < time.Millisecond)},
		{"IdleRetention", "must be zero (the default) or at least a millisecond", opts.IdleRetention < 0 || (opts.IdleRetention > 0 && opts.IdleRetention < time.Millisecond)},
		{"SessionsPerUser", "must not be negative", opts.SessionsPerUser < 0},
		{"RevokeReplicas", "must not be negative", opts.RevokeReplicas < 0},
	} {
		if o.bad {
			return nil, &lease.InvalidError{Field: o.field, Reason: o.reason}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &Engine{
		client:      client,
		batches:     newBatchers(client),
		limits:      limits,
		prefix:      prefix,
		opTimeout:   timeout,
		logLen:      cmp.Or(opts.EventLogLen, lease.DefaultEventLogLen),
		logTTL:      cmp.Or(opts.EventLogTTL.Truncate(time.Millisecond), DefaultEventLogTTL),
		watchBuffer: cmp.Or(opts.WatchBuffer, lease.DefaultWatchBuffer),
		presenceTTL: cmp.Or(opts.PresenceTTL.Truncate(time.Millisecond), lease.DefaultPresenceTTL),
		auditTTL:    cmp.Or(opts.AuditRetention.Truncate(time.Millisecond), lease.DefaultAuditRetention),
		auditLen:    cmp.Or(opts.AuditMaxRecords, lease.DefaultAuditMaxRecords),

		handoffTimeout: cmp.Or(opts.HandoffTimeout.Truncate(time.Millisecond), lease.DefaultHandoffTimeout),
		handoffReserve: cmp.Or(opts.HandoffReserve.Truncate(time.Millisecond), lease.DefaultHandoffReserve),
		idle:           cmp.Or(opts.IdleRetention.Truncate(time.Millisecond), lease.DefaultIdleRetention),
		perUser:        opts.SessionsPerUser,
		onSweep:        opts.OnSweep,
		onClockOffset:  opts.OnClockOffset,
		onResubscribe:  opts.OnResubscribe,
		onLostEvents:   opts.OnLostEvents,
		onMissedEvents: opts.OnMissedEvents,
		revokeReplicas: opts.RevokeReplicas,
		ctx:            ctx,
		cancel:         cancel,
		sessions:       make(map[lease.Key]*watched),
		now:            time.Now,
	}
	e.usersHorizon = usersHorizon(e.idle, e.auditTTL, e.opTimeout)
	e.sweepEvery = sweepPeriod(e.idle)
	var common []string
	for _, n := range []int64{int64(e.logLen), e.logTTL.Milliseconds(), int64(e.auditLen), e.auditTTL.Milliseconds(),
		AnswersKept(e.opTimeout).Milliseconds(), e.idle.Milliseconds(), int64(e.perUser)} {
		common = append(common, strconv.FormatInt(n, 10))
	}
	e.common = []any{strings.Join(common, " ")}
	e.timers.Add(1)
	go e.sweepLoop()
	return e, nil
}

// contextTimeoutEnabled reports whether client honours context deadlines, as far as its type
// tells; an unknown implementation is trusted.
func contextTimeoutEnabled(client redis.UniversalClient) bool {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return true
}

// The keys of a user are named <prefix>:{<user>}:<name><id>: the id is the session of a session's
// key (and more for a revoke's answer), or a call's; the hash tag {<user>} puts them all in one
// Cluster slot (see state.lua).
const (
	nameState      = "lease:"      // the state hash of a session
	nameLog        = "log:"        // the event log of a session
	nameTabs       = "tabs:"       // the presence entries of a session
	nameTabInfo    = "tabinfo:"    // the presence details of a session
	nameIndex      = "sessions"    // the user's index of held leases
	nameAudit      = "audit"       // the user's audit log
	nameKnown      = "known"       // the user's sessions whose state is kept
	nameFree       = "free"        // the state of the user's free sessions
	nameAdminAudit = "audit:admin" // the admins' records of the user
	nameReply      = "reply:"      // the answer of one call, for its retries (newReply)
	nameRevoke     = "revoke:"     // the answer of an admin's revoke with a request id
)

// keyName names a key of a user: <name><id> after the hash tag.
type keyName struct{ name, id string }

// userKey is the key of user, a valid identifier, that name and id name.
func (e *Engine) userKey(user, name, id string) string {
	kn := keyName{name, id}
	var b strings.Builder
	b.Grow(e.keyLen(user, kn))
	e.writeKey(&b, user, kn)
	return b.String()
}

// keyLen is the length of the key of user that kn names.
func (e *Engine) keyLen(user string, kn keyName) int {
	return len(e.prefix) + len(":{}:") + len(user) + len(kn.name) + len(kn.id)
}

// writeKey writes the key of user that kn names to b: the one spelling of a key.
func (e *Engine) writeKey(b *strings.Builder, user string, kn keyName) {
	b.WriteString(e.prefix)
	b.WriteString(":{")
	b.WriteString(user)
	b.WriteString("}:")
	b.WriteString(kn.name)
	b.WriteString(kn.id)
}

// stateKey is the key of the state hash of k, which must be valid.
func (e *Engine) stateKey(k lease.Key) string { return e.userKey(k.User, nameState, k.Session) }

// sessionKeys are the KEYS of every session script for k, which must be valid: the state hash,
// the event log, the two presence keys, the user's index of held leases, the user's audit log, the
// user's sessions whose state is kept and the state of the user's free sessions (see state.lua),
// then the keys of the user that more names. They are substrings of one string, in one slice: two
// allocations rather than one per key (a call that changes a session has nine keys).
func (e *Engine) sessionKeys(k lease.Key, more ...keyName) []string {
	own := [...]keyName{{nameState, k.Session}, {nameLog, k.Session}, {nameTabs, k.Session},
		{nameTabInfo, k.Session}, {nameIndex, ""}, {nameAudit, ""}, {nameKnown, ""}, {nameFree, ""}}
	n := 0
	for _, kn := range own {
		n += e.keyLen(k.User, kn)
	}
	for _, kn := range more {
		n += e.keyLen(k.User, kn)
	}
	// The builder holds them all from the start, so it never moves what it wrote: each key is
	// the end of what String answers once it is written.
	var b strings.Builder
	b.Grow(n)
	keys := make([]string, 0, len(own)+len(more))
	add := func(kn keyName) {
		start := b.Len()
		e.writeKey(&b, k.User, kn)
		keys = append(keys, b.String()[start:])
	}
	for _, kn := range own {
		add(kn)
	}
	for _, kn := range more {
		add(kn)
	}
	return keys
}

// revokeAnswerKey is where the answer of req, a revoke with a request id, is kept for its retries
// (KEYS[11] of revoke.lua, see state.lua).
func (e *Engine) revokeAnswerKey(req lease.RevokeRequest) string {
	return e.userKey(req.Key.User, nameRevoke, req.Key.Session+"/"+req.Admin+"/"+req.RequestID)
}

// knownKey is the key of the sessions of user whose state is kept (see state.lua).
func (e *Engine) knownKey(user string) string { return e.userKey(user, nameKnown, "") }

// newReply names a new key, unique to one call, under which a script that changes a session
// keeps its answer for the retries of that call (KEYS[9], see state.lua): the process's random
// id, which no other process shares, and the number of the call in the process. (A random id per
// call read the system's random source each time, 0.5 % of tablease's CPU per acquire and
// release, perf.)
func newReply() keyName {
	return keyName{replyProcess, strconv.FormatUint(replyCalls.Add(1), 36)}
}

var (
	replyProcess = nameReply + rand.Text() + "-" // 128 random bits
	replyCalls   atomic.Uint64
)

// indexKey is the key of the index of held leases of user, a valid identifier (see admin.lua).
func (e *Engine) indexKey(user string) string { return e.userKey(user, nameIndex, "") }

// auditKey is the key of the audit log of user, a valid identifier (see admin.lua).
func (e *Engine) auditKey(user string) string { return e.userKey(user, nameAudit, "") }

// adminAuditKey is the key of the admins' records of user (see admin.lua).
func (e *Engine) adminAuditKey(user string) string { return e.userKey(user, nameAdminAudit, "") }

// auditKeys are the KEYS of audit.lua for user: its audit log and its admins' records.
func (e *Engine) auditKeys(user string) []string {
	return []string{e.auditKey(user), e.adminAuditKey(user)}
}

// usersKey is the key of the index of users under the prefix (see admin.go). It has no hash tag:
// it is never a key of a script, only of the commands that add users to it and page it.
func (e *Engine) usersKey() string { return e.prefix + ":users" }

// channel is the Pub/Sub channel on which the scripts publish every event under the prefix.
func (e *Engine) channel() string { return e.prefix + ":events" }

// Acquire implements lease.Engine.Acquire, lease.ModeHandoff included, with acquire.lua. The user
// is added to the users index before and after a grant, so that the lease is listed, unless this
// engine added it after a grant less than usersHorizon ago: then the acquire is one round trip, the
// script (see "Listing" in admin.go).
func (e *Engine) Acquire(ctx context.Context, req lease.AcquireRequest) (lease.Lease, error) {
	const op = "acquire"
	mode, err := req.Validate()
	if err != nil {
		return lease.Lease{}, err
	}
	ttl, err := e.limits.Clamp(req.TTL, req.Holder.Hidden)
	if err != nil {
		return lease.Lease{}, err
	}
	indexed := e.indexed(req.Key.User)
	if err := e.addUser(ctx, op, req.Key.User); err != nil {
		return lease.Lease{}, err
	}
	sent := e.now() // before the script runs: the record's time is never after the grant's
	args := []any{req.Holder.TabID, req.Holder.Label, flag(req.Holder.Hidden), ttl.Milliseconds(), string(mode),
		e.handoffTimeout.Milliseconds(), e.handoffReserve.Milliseconds()}
	if req.NewEpoch {
		args = append(args, "1") // only then: each argument costs Redis a string per call
	}
	v, err := e.change(ctx, op, acquireFn, req.Key, args...)
	if err != nil {
		return lease.Lease{}, err
	}
	status, l, until, err := parseReply(req.Key, v)
	if err != nil {
		return lease.Lease{}, &lease.UnavailableError{Op: op, Err: err}
	}
	switch status {
	case statusOK:
		if !indexed {
			// Again after the grant, for a listing that pruned the user meanwhile; once it
			// succeeded, the next calls of the user may skip both (see admin.go).
			if err := e.addUser(ctx, op, req.Key.User); err != nil {
				return lease.Lease{}, err
			}
			e.added.note(req.Key.User, sent)
		}
		return l, nil
	case statusHeld:
		return lease.Lease{}, &lease.HeldError{Holder: l.Holder, Epoch: l.Epoch, Remaining: l.Remaining()}
	case statusBlocked:
		if until.After(l.Now) {
			return lease.Lease{}, &lease.RetryError{Err: lease.ErrBlocked, RetryAfter: until.Sub(l.Now)}
		}
	case statusPending:
		if until.After(l.Now) {
			return lease.Lease{}, &lease.RetryError{Err: lease.ErrHandoffPending, RetryAfter: until.Sub(l.Now)}
		}
	case statusExhausted:
		return lease.Lease{}, lease.ErrEpochExhausted
	case statusFull:
		return lease.Lease{}, &lease.SessionLimitError{Limit: e.perUser}
	case statusGone:
		if until.After(l.Now) {
			return lease.Lease{}, &lease.RetryError{Err: lease.ErrTabGone, RetryAfter: until.Sub(l.Now)}
		}
	}
	return lease.Lease{}, unexpected(op, status)
}

// Renew implements lease.Engine. It is the one change without a reply key (see renew.lua).
func (e *Engine) Renew(ctx context.Context, req lease.RenewRequest) (lease.Lease, error) {
	if err := req.Validate(); err != nil {
		return lease.Lease{}, err
	}
	ttl, err := e.limits.Clamp(req.TTL, req.Hidden)
	if err != nil {
		return lease.Lease{}, err
	}
	v, err := e.usual(ctx, "renew", renewFn, req.Key,
		req.TabID, strconv.FormatInt(req.Epoch, 10), flag(req.Hidden), ttl.Milliseconds())
	status, l, err := leaseAnswer("renew", req.Key, v, err)
	if err != nil {
		return lease.Lease{}, err
	}
	switch status {
	case statusOK:
		return l, nil
	case statusLost:
		return lease.Lease{}, &lease.LostError{Current: l}
	}
	return lease.Lease{}, unexpected("renew", status)
}

// Release implements lease.Engine. Released is true when this call ended the lease, and also when
// the lease is still free since a release by the same tab and epoch ended it, so that a retried
// release gets the answer of the first one.
func (e *Engine) Release(ctx context.Context, req lease.ReleaseRequest) (lease.ReleaseResult, error) {
	if err := req.Validate(); err != nil {
		return lease.ReleaseResult{}, err
	}
	args := []any{req.TabID, strconv.FormatInt(req.Epoch, 10)}
	if req.Gone {
		args = []any{req.TabID, "gone", lease.GoneWindow.Milliseconds(), lease.MaxGone}
	}
	v, err := e.change(ctx, "release", releaseFn, req.Key, args...)
	status, l, err := leaseAnswer("release", req.Key, v, err)
	if err != nil {
		return lease.ReleaseResult{}, err
	}
	switch status {
	case statusReleased:
		return lease.ReleaseResult{Released: true, Lease: l}, nil
	case statusKept:
		return lease.ReleaseResult{Lease: l}, nil
	case statusFull:
		return lease.ReleaseResult{}, &lease.SessionLimitError{Limit: e.perUser}
	}
	return lease.ReleaseResult{}, unexpected("release", status)
}

// Get implements lease.Engine.
func (e *Engine) Get(ctx context.Context, key lease.Key) (lease.Lease, error) {
	if err := key.Validate(); err != nil {
		return lease.Lease{}, err
	}
	v, err := e.eval(ctx, "get", getFn, key)
	status, l, err := leaseAnswer("get", key, v, err)
	if err != nil {
		return lease.Lease{}, err
	}
	if status != statusOK {
		return lease.Lease{}, unexpected("get", status)
	}
	return l, nil
}

// Check implements lease.Engine. It runs on the primary, like every call: a replica may lag.
func (e *Engine) Check(ctx context.Context, key lease.Key, tabID string, epoch int64) (lease.Lease, error) {
	if err := lease.ValidateCheck(key, tabID, epoch); err != nil {
		return lease.Lease{}, err
	}
	v, err := e.usual(ctx, "check", checkFn, key, tabID, strconv.FormatInt(epoch, 10))
	status, l, err := leaseAnswer("check", key, v, err)
	if err != nil {
		return lease.Lease{}, err
	}
	switch status {
	case statusOK:
		return l, nil
	case statusLost:
		return lease.Lease{}, &lease.LostError{Current: l}
	}
	return lease.Lease{}, unexpected("check", status)
}

// pingKey is the session whose keys Ping names (ping.lua reads none of them).
var pingKey = lease.Key{User: "tablease", Session: "ping"}

// Ping implements lease.Engine: it calls ping.lua, a function of the library that touches no key,
// so that a Redis that answers PING but would refuse the engine's calls (no @scripting or channel
// for the ACL user, a read-only replica, no CLUSTER MYID on a Cluster) is not ready. Bounded by
// OpTimeout.
func (e *Engine) Ping(ctx context.Context) error {
	const op = "ping"
	topology := "single"
	if _, ok := e.client.(*redis.ClusterClient); ok {
		topology = "cluster"
	}
	v, err := e.call(ctx, op, pingFn, []string{e.stateKey(pingKey), e.knownKey(pingKey.User)}, []any{topology})
	if err != nil {
		return err
	}
	if v != "PONG" {
		return &lease.UnavailableError{Op: op, Err: fmt.Errorf("leaseredis: malformed script reply %v", v)}
	}
	return nil
}

// Close makes every later call fail with a *lease.UnavailableError wrapping ErrClosed, and ends
// every watch with one. It returns once the engine's goroutines (the subscription's reader and the
// settle timers) have stopped. It does not close the client, which the engine does not own, and
// leaves the leases in Redis. Closing twice is not an error.
func (e *Engine) Close() error {
	e.closed.Store(true)
	e.mu.Lock()
	if e.shut {
		e.mu.Unlock()
		return nil
	}
	e.shut = true
	for _, s := range e.sessions {
		for x := range s.watchers.all() {
			x.sender.End(&lease.UnavailableError{Op: "watch", Err: ErrClosed})
		}
		s.stopTimer()
	}
	e.sessions = nil
	ps, done := e.pubsub, e.readerDone
	e.mu.Unlock()

	e.cancel()
	if ps != nil {
		_ = ps.Close()
		<-done
	}
	e.timers.Wait()
	return nil
}

// EvictionPolicy answers the maxmemory-policy of the Redis (CONFIG GET; of one node of a Cluster).
// Anything but "noeviction" may evict lease state: the server should warn or refuse to start. It
// fails when the server does not allow CONFIG (some managed services do not), and with a
// *lease.UnavailableError when the store does not answer.
func (e *Engine) EvictionPolicy(ctx context.Context) (string, error) {
	if e.closed.Load() {
		return "", &lease.UnavailableError{Op: "config get", Err: ErrClosed}
	}
	ctx, cancel := context.WithTimeout(ctx, e.opTimeout)
	defer cancel()
	m, err := e.client.ConfigGet(ctx, "maxmemory-policy").Result()
	var redisErr redis.Error
	switch {
	case errors.As(err, &redisErr):
		return "", fmt.Errorf("leaseredis: reading maxmemory-policy: %w", err)
	case err != nil:
		return "", &lease.UnavailableError{Op: "config get", Err: err}
	}
	policy, ok := m["maxmemory-policy"]
	if !ok {
		return "", errors.New("leaseredis: CONFIG GET maxmemory-policy answered nothing")
	}
	return policy, nil
}

// Replicas answers how many replicas each primary of the engine's Redis has connected (INFO
// replication), by the primary's address: a revoke of a session that a primary holds cannot be
// confirmed by more (Options.RevokeReplicas). A Cluster has an entry for each primary; the
// primary of a Sentinel client of NewClient has the address that the Sentinels give. Bounded by
// OpTimeout.
func (e *Engine) Replicas(ctx context.Context) (map[string]int, error) {
	if e.closed.Load() {
		return nil, &lease.UnavailableError{Op: "info", Err: ErrClosed}
	}
	ctx, cancel := context.WithTimeout(ctx, e.opTimeout)
	defer cancel()
	var mu sync.Mutex
	counts := make(map[string]int)
	count := func(ctx context.Context, c *redis.Client) error {
		info := c.InfoMap(ctx, "replication")
		if err := info.Err(); err != nil {
			return err
		}
		v := info.Item("Replication", "connected_slaves")
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("leaseredis: INFO replication: connected_slaves %q", v)
		}
		addr := c.Options().Addr
		if o := sentinelOptions(c); o != nil {
			// go-redis's address of a Sentinel client is "FailoverClient".
			primary := askSentinels(ctx, o).primary
			addr = cmp.Or(primary, "the primary of master_name="+o.MasterName)
		}
		mu.Lock()
		defer mu.Unlock()
		counts[addr] = n
		return nil
	}
	var err error
	switch c := e.client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, count)
	case *redis.Client:
		err = count(ctx, c)
	default:
		err = fmt.Errorf("leaseredis: cannot read the replicas of a %T", e.client)
	}
	if err != nil {
		return nil, &lease.UnavailableError{Op: "info", Err: err}
	}
	return counts, nil
}

// ServerMismatch reports what the URL of the engine's client gets wrong about the servers it
// reached, as they answer it:
//
//   - a URL of one server (neither Sentinel nor Cluster) that reached a Cluster node, whose
//     functions publish on shard channels that the plain client does not hear (events would be
//     lost); a replica, which refuses every change with READONLY; a Sentinel, which knows none
//     of the engine's commands; or a server without the URL's database, which refuses the
//     connection's SELECT;
//   - a Sentinel URL of NewClient whose master_name none of the Sentinels that answer knows (no
//     primary to find: go-redis says only that the Sentinels are unreachable);
//   - a Cluster URL whose nodes, those that answer, all have cluster support disabled (no slot
//     map to read).
//
// A Sentinel client is then checked as a URL of one server, on the primary the Sentinels name.
// Only a definitive answer is a mismatch: it answers nil when no server answers (nothing to tell
// yet), when the question is refused (an ACL user who may not ask it), when one Sentinel knows
// the name, and when one node is in a Cluster. Bounded by OpTimeout.
func (e *Engine) ServerMismatch(ctx context.Context) error {
	if e.closed.Load() {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, e.opTimeout)
	defer cancel()
	var c *redis.Client
	switch client := e.client.(type) {
	case *redis.ClusterClient:
		return clusterMismatch(ctx, client.Options())
	case *redis.Client:
		c = client
	default:
		return nil
	}
	if o := sentinelOptions(c); o != nil {
		switch a := askSentinels(ctx, o); {
		case a.primary != "":
		case len(a.denied) > 0 && serverSaid(a.deniedErr, "NOAUTH"):
			return fmt.Errorf("the Sentinels at %s ask for a password, which the URL does not give (%v); with master_name the URL's user and password are the Sentinels', and username= and password= the primary's",
				strings.Join(a.denied, ", "), a.deniedErr)
		case len(a.denied) > 0:
			return fmt.Errorf("the Sentinels at %s refused the URL's user and password (%v); with master_name they are the Sentinels', and username= and password= the primary's",
				strings.Join(a.denied, ", "), a.deniedErr)
		case len(a.unaware) > 0:
			return fmt.Errorf("no Sentinel at %s knows a primary named %q; set master_name to a name that SENTINEL MASTERS lists",
				strings.Join(a.unaware, ", "), o.MasterName)
		case len(a.servers) > 0:
			return fmt.Errorf("%s Redis, not Sentinel (SENTINEL is an unknown command): with master_name the URL names the Sentinels (port 26379 by default); to use one server, drop master_name",
				serversAt(a.servers))
		}
	}
	info, err := c.Info(ctx, "server", "cluster", "replication").Result()
	if unknownCommand(err) && strings.Contains(err.Error(), "'select'") {
		// The SELECT of the connection's set-up (a database other than 0) is unknown there: a
		// Sentinel. (A server without INFO, renamed away by its operator, is not refused.)
		return fmt.Errorf("the server does not know a command of tablease's (%v); a Sentinel is named with master_name=<name> and database 0", err)
	}
	if serverSaid(err, "DB index is out of range") {
		return fmt.Errorf("the server has no database %d (%v); use a database below its `databases` setting (16 by default)", c.Options().DB, err)
	}
	if refusedCredentials(err) {
		noPassword := serverSaid(err, "NOAUTH") // no password was sent: WRONGPASS answers one
		switch {
		case sentinelOptions(c) != nil && noPassword:
			return fmt.Errorf("the primary asks for a password, which the URL's password= does not give (%v)", err)
		case sentinelOptions(c) != nil:
			return fmt.Errorf("the primary refused the user and password of username= and password= (%v)", err)
		case noPassword:
			return fmt.Errorf("the server asks for a password, which the URL does not give (%v)", err)
		}
		return fmt.Errorf("the server refused the URL's user and password (%v)", err)
	}
	if err != nil {
		return nil
	}
	switch {
	case strings.Contains(info, "redis_mode:sentinel"):
		return errors.New("the server is a Redis Sentinel; name the primary it monitors with master_name=<name>, and the other Sentinels with addr=<host:port>")
	case strings.Contains(info, "cluster_enabled:1"):
		return errors.New("the server is a node of a Redis Cluster; add cluster=true to the URL")
	case strings.Contains(info, "role:slave"):
		return errors.New("the server is a replica, which refuses every change; name the primary, or its Sentinels")
	}
	return nil
}

// sentinelAnswers are what the Sentinels of a URL answered (askSentinels).
type sentinelAnswers struct {
	primary   string   // the address of the primary one of them gave
	unaware   []string // the Sentinels that answered that they know no primary of that name
	servers   []string // the addresses whose servers do not know the command (Redis, not Sentinels)
	denied    []string // the addresses that refused the credentials (WRONGPASS, NOAUTH)
	deniedErr error    // one of their answers
}

// askSentinels asks every Sentinel of o at once for the address of the primary named
// o.MasterName. A server that does not answer, or refuses the question (NOPERM), is in none of
// the lists; the lists are sorted.
func askSentinels(ctx context.Context, o *redis.FailoverOptions) (a sentinelAnswers) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, addr := range o.SentinelAddrs {
		wg.Go(func() {
			s := redis.NewSentinelClient(&redis.Options{Addr: addr, ClientName: o.ClientName, Dialer: o.Dialer,
				Username: o.SentinelUsername, Password: o.SentinelPassword, TLSConfig: o.TLSConfig,
				DialTimeout: o.DialTimeout, DialerRetries: o.DialerRetries, DialerRetryTimeout: o.DialerRetryTimeout,
				ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout, ContextTimeoutEnabled: true,
				MaxRetries: -1, PoolSize: 1, DisableIdentity: o.DisableIdentity})
			defer s.Close()
			hostPort, err := s.GetMasterAddrByName(ctx, o.MasterName).Result()
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil && len(hostPort) == 2:
				a.primary = net.JoinHostPort(hostPort[0], hostPort[1])
			case errors.Is(err, redis.Nil):
				a.unaware = append(a.unaware, addr)
			case unknownCommand(err):
				a.servers = append(a.servers, addr)
			case refusedCredentials(err):
				a.denied = append(a.denied, addr)
				a.deniedErr = err
			}
		})
	}
	wg.Wait()
	slices.Sort(a.unaware)
	slices.Sort(a.servers)
	slices.Sort(a.denied)
	return a
}

// serverSaid reports whether err is an error reply of the server that holds text.
func serverSaid(err error, text string) bool {
	var reply redis.Error
	return errors.As(err, &reply) && strings.Contains(reply.Error(), text)
}

// refusedCredentials reports whether err is a server's refusal of the client's user and password:
// wrong ones (WRONGPASS), or none where the server asks for them (NOAUTH, the answer when the URL
// gives no password, which the messages of ServerMismatch say).
func refusedCredentials(err error) bool {
	return serverSaid(err, "WRONGPASS") || serverSaid(err, "NOAUTH")
}

// unknownCommand reports whether err is a server's answer that it does not know the command.
func unknownCommand(err error) bool { return serverSaid(err, "ERR unknown command") }

// outOfMemory reports whether err is Redis's refusal of a write at its maxmemory.
func outOfMemory(err error) bool { return serverSaid(err, "OOM ") }

// serversAt is "the server at a is" or "the servers at a, b are", for the sorted addresses addrs.
func serversAt(addrs []string) string {
	if len(addrs) == 1 {
		return "the server at " + addrs[0] + " is"
	}
	return "the servers at " + strings.Join(addrs, ", ") + " are"
}

// clusterMismatch asks every node that o names (its seeds) at once for the slot map, and reports
// the nodes that answer that they have cluster support disabled, or do not know the command (a
// Sentinel), or refuse the URL's credentials, when no node answers with the map.
func clusterMismatch(ctx context.Context, o *redis.ClusterOptions) error {
	if o.ClusterSlots != nil {
		return nil // the client does not ask the nodes for the slot map
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	inCluster, standalone, denied := false, []string(nil), []string(nil)
	var deniedErr error
	for _, addr := range o.Addrs {
		wg.Go(func() {
			c := redis.NewClient(&redis.Options{Addr: addr, ClientName: o.ClientName, Dialer: o.Dialer, Protocol: o.Protocol,
				Username: o.Username, Password: o.Password, CredentialsProvider: o.CredentialsProvider,
				CredentialsProviderContext: o.CredentialsProviderContext, TLSConfig: o.TLSConfig,
				DialTimeout: o.DialTimeout, DialerRetries: o.DialerRetries, DialerRetryTimeout: o.DialerRetryTimeout,
				ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout, ContextTimeoutEnabled: true,
				MaxRetries: -1, PoolSize: 1, DisableIdentity: o.DisableIdentity})
			defer c.Close()
			// CLUSTER SLOTS is what go-redis reads the slot map with, and what the README's ACL
			// rules of a Cluster allow (go-redis's ClusterSlots method is deprecated).
			err := c.Do(ctx, "cluster", "slots").Err()
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				inCluster = true
			case serverSaid(err, "cluster support disabled"), unknownCommand(err):
				standalone = append(standalone, addr)
			case refusedCredentials(err):
				denied = append(denied, addr)
				deniedErr = err
			}
		})
	}
	wg.Wait()
	if inCluster {
		return nil
	}
	if len(denied) > 0 {
		slices.Sort(denied)
		if serverSaid(deniedErr, "NOAUTH") {
			return fmt.Errorf("the nodes at %s ask for a password, which the URL does not give (%v)", strings.Join(denied, ", "), deniedErr)
		}
		return fmt.Errorf("the nodes at %s refused the URL's user and password (%v)", strings.Join(denied, ", "), deniedErr)
	}
	if len(standalone) == 0 {
		return nil
	}
	slices.Sort(standalone)
	return fmt.Errorf("%s outside a Redis Cluster (CLUSTER SLOTS answers no slot map); remove cluster=true", serversAt(standalone))
}

// eval runs one session script that does not change the session (it may announce what expired,
// which is the same whoever runs it, however often) on the keys of key with the common arguments
// (see state.lua) and then args, bounded by OpTimeout.
func (e *Engine) eval(ctx context.Context, op string, f *function, key lease.Key, args ...any) (any, error) {
	return e.call(ctx, op, f, e.sessionKeys(key), args)
}

// usual runs f, renew or check, in the lease form (see state.lua), which does the usual renew or
// check with two keys instead of eight, and runs it again with every key, as eval, when it answers
// that the call needs more. Both calls together are bounded by OpTimeout.
func (e *Engine) usual(ctx context.Context, op string, f *function, key lease.Key, args ...any) (any, error) {
	start := time.Now()
	v, err := e.call(ctx, op, f, []string{e.stateKey(key), e.knownKey(key.User)}, args)
	if s, ok := v.(string); ok && s == statusDefer && err == nil {
		ctx, cancel := context.WithDeadline(ctx, start.Add(e.opTimeout))
		defer cancel()
		return e.eval(ctx, op, f, key, args...)
	}
	return v, err
}

// change runs one session script that changes the session, like eval, with a reply key of its
// own (KEYS[9]): when go-redis sends the script again after losing its answer, the script answers
// what it answered the first time and changes nothing, whatever ran in between.
func (e *Engine) change(ctx context.Context, op string, f *function, key lease.Key, args ...any) (any, error) {
	return e.call(ctx, op, f, e.sessionKeys(key, newReply()), args)
}

// call runs the function f of the library with keys, the common arguments and args, bounded by
// OpTimeout. A server without the library (a new one, or one restarted without its data) gets
// it, on the primary of keys[0], and the call is made again: up to three times, since on a
// Cluster another node's load may have answered for this one's.
func (e *Engine) call(ctx context.Context, op string, f *function, keys []string, args []any) (any, error) {
	return e.callOn(ctx, nil, op, f, keys, args)
}

// callOn is call sent on conn, one connection of the primary of keys[0], instead of through the
// batcher when conn is not nil.
func (e *Engine) callOn(ctx context.Context, conn *redis.Conn, op string, f *function, keys []string, args []any) (any, error) {
	if e.closed.Load() {
		return nil, &lease.UnavailableError{Op: op, Err: ErrClosed}
	}
	// The call's deadline is OpTimeout from now, or the caller's when earlier (usual's second
	// call). The batcher bounds a call by it as a time (see batcher); what else the call may do
	// takes a context with it, made only then: a call on conn, finding the node of a key on a
	// Cluster (which may load the slot map), loading the library.
	deadline := time.Now().Add(e.opTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	var bounded context.Context
	cancel := context.CancelFunc(func() {})
	defer func() { cancel() }()
	withDeadline := func() context.Context {
		if bounded == nil {
			bounded, cancel = context.WithDeadline(ctx, deadline)
		}
		return bounded
	}
	nodeCtx := ctx // read by the batchers of a Cluster alone
	if e.batches.cluster != nil {
		nodeCtx = withDeadline()
	}
	// FCALL name numkeys keys... common... args..., as go-redis's FCall makes it.
	cmdArgs := make([]any, 0, 3+len(keys)+len(e.common)+len(args))
	cmdArgs = append(cmdArgs, "fcall", f.fcall, len(keys))
	for _, k := range keys {
		cmdArgs = append(cmdArgs, k)
	}
	cmdArgs = append(append(cmdArgs, e.common...), args...)
	// A renew in the lease form, or a change, may go with others in one function call (mergeable
	// in batch.go).
	var merge *mergeable
	if f.merged != nil && len(keys) == f.merged.callKeys && conn == nil {
		merge = &mergeable{fn: f.merged, group: mergeGroup(keys[0], e.batches.cluster != nil),
			keys: keys, common: e.common, args: args}
		if f.merged.named {
			merge.head = []any{f.name, len(args)}
		}
	}
	var v any
	var err error
	for attempt := 0; ; attempt++ {
		loads := e.loads.Load()
		cmd := redis.NewCmd(ctx, cmdArgs...)
		cmd.SetFirstKeyPos(3)
		if conn != nil {
			err = conn.Process(withDeadline(), cmd)
		} else {
			err = e.batches.of(nodeCtx, keys[0]).doMerging(ctx, deadline, cmd, merge)
		}
		if err == nil {
			v, err = cmd.Result()
		}
		if err == nil || attempt == 2 || !strings.HasPrefix(err.Error(), "ERR Function not found") {
			break
		}
		if err = e.loadLibrary(withDeadline(), keys[0], loads); err != nil {
			break
		}
	}
	if err != nil {
		return nil, &lease.UnavailableError{Op: op, Err: err}
	}
	return v, nil
}

// loadLibrary loads the library of the session scripts on the primary that holds key (FUNCTION
// LOAD REPLACE: instances loading it at once load the same source), unless it was loaded since
// the caller read e.loads (loads): the calls that find it missing at once (every call in flight,
// after a restart) load it once. Redis keeps it with the data (RDB, AOF) and replicates it, so a
// promoted replica has it already.
func (e *Engine) loadLibrary(ctx context.Context, key string, loads uint64) error {
	e.loadMu.Lock()
	defer e.loadMu.Unlock()
	if e.loads.Load() != loads {
		return nil // loaded meanwhile: call again (on a Cluster, maybe on another node: see call)
	}
	primary, err := e.primaryOf(ctx, key)
	if err != nil {
		return err
	}
	if err := primary.FunctionLoadReplace(ctx, library).Err(); err != nil {
		return err
	}
	e.loads.Add(1)
	return nil
}

// primaryOf answers the client of the primary that holds key: the engine's own client, unless it
// is a Cluster's.
func (e *Engine) primaryOf(ctx context.Context, key string) (redis.UniversalClient, error) {
	if c, ok := e.client.(*redis.ClusterClient); ok {
		return c.MasterForKey(ctx, key)
	}
	return e.client, nil
}

// leaseAnswer parses the answer v of a lease script run by eval or change for op on key, which
// failed with err when err is not nil.
func leaseAnswer(op string, key lease.Key, v any, err error) (string, lease.Lease, error) {
	if err != nil {
		return "", lease.Lease{}, err
	}
	status, l, _, err := parseReply(key, v)
	if err != nil {
		return "", lease.Lease{}, &lease.UnavailableError{Op: op, Err: err}
	}
	return status, l, nil
}

// unexpected is the error for a status a script should not answer: a bug or a foreign script under
// the same name. It is not a decision about the lease.
func unexpected(op, status string) error {
	return &lease.UnavailableError{Op: op, Err: fmt.Errorf("leaseredis: unexpected script status %q", status)}
}

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}
