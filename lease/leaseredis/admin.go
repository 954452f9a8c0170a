package leaseredis

import (
	"container/heap"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tablease/tablease/internal/generations"

	"github.com/tablease/tablease/lease"
)

// The engine implements lease.Admin.
//
// # Revokes and blocks
//
// A revoke is one session script, revoke.lua, like every change: it settles, answers a retry from
// the key that keeps the answer of the admin's revoke with that request id (named by session,
// admin and request id, expiring after lease.RevokeRetryWindow), revokes a held lease (a new epoch, no holder, the
// epoch marked ended, a "revoked" event and an audit record), and blocks. The block is a field of
// the state hash, block_until_us, which acquire.lua checks after it settles.
//
// # Listing
//
// Each user has an index of the sessions whose lease is held, <prefix>:{<sub>}:sessions, kept in
// step by the scripts that grant and end leases (see admin.lua), so it shares the user's slot. To
// list every user, the engine keeps one more sorted set, <prefix>:users, of the users that had a
// lease acquired or revoked: it is added to with its own idempotent ZADD before the acquire or
// revoke script runs, and again after an acquire that granted, never by a script (its slot is not
// the user's), except while the engine knows the user is there (see "Skipping the adds" below). A
// user in it whose leases ended only has an empty index. A listing of every user prunes the users
// it finds with no key left (no held lease, no session whose state is kept, no audit log): it
// checks, removes the user, checks again, and puts back a user whose keys came back meanwhile. So
// a lease is never held by a user missing from it, except for an acquire that ran between a
// prune's two checks, until that acquire's second ZADD or the prune's putting back a moment later,
// and a user whose key was lost (see below). ListLeases pages the users in byte order from the
// cursor's user, and each user's index from the cursor's session (ZRANGEBYLEX), and reads the
// state hashes of the sessions it found with leases.lua, which answers those held at the store's
// clock and drops the others from the index. A lease held throughout a listing is in its user's
// index throughout, so paging never skips it; the cursor is lease.LeaseCursor of the last lease of
// the page. A listing of one user reads that user's index alone, never the users index.
//
// # Skipping the adds
//
// The users index has no hash tag: on a Cluster it lives on a shard of its own, so each ZADD is one
// more round trip, to another node, and while that node fails over every call that adds stalls. So
// each engine records the users it added (addedUsers): after an acquire that granted and whose
// second ZADD succeeded, the user, with the local time read before the script was sent. For the
// horizon H after that time (Engine.usersHorizon) the engine's Acquire, Revoke and RecordCatalog
// of that user send no ZADD, and an acquire is one round trip, its script. Only an add that
// succeeded after a grant is recorded: a failed ZADD, a call that did not grant, and a call that
// skipped its adds record nothing, so the first call of the user after H adds again (an acquire
// that grants then takes three round trips), at most once per user, engine and H. The record is
// two maps, the current and the previous generation, of at most addedPerGeneration users each;
// when the current one is full it becomes the previous and the older is dropped. A user dropped
// early costs its next call the adds, never correctness.
//
// Why a skipped add loses nothing. Let T be the recorded time and S the store time at which the
// grant's script ran, after T. That script left the user keys that a prune checks for, which live
// until S + R at least, R = min(IdleRetention, AuditRetention): the session's entry in the user's
// known set, scored with the expiry of the state hash, IdleRetention after the script's change at
// least (keep in admin.lua; the set expires with its highest score, and no later script lowers the
// score below that, as expires_us never goes back before a change), and for a new grant its audit
// record, kept AuditRetention. A prune removes only a user whose keys its first check found gone,
// so none removes the user while those keys live; one whose first check ran before S and whose
// removal came after the recorded ZADD finds the keys at its second check, after S, and puts the
// user back (the moment between is the window of any acquire between a prune's two checks, above).
// A call that skips its adds is sent before T + H and runs within replyKeptFor × OpTimeout of
// that, go-redis's retries and a stalled Redis included (the reply key's lifetime, see state.lua),
// so before S + H + replyKeptFor × OpTimeout <= S + R: while the recorded grant's keys live and the
// user is in the index; a lease it grants then keeps the user a key (the user's index of held
// leases) for as long as it is held, and so keeps the user in the users index. H is therefore a
// quarter of R, at most maxUsersHorizon (a minute), and at most R - replyKeptFor × OpTimeout; when
// retentions are too short for a positive H, it is zero and nothing is skipped. The argument
// counts the retentions of this engine, and the local clock and the store's only as running at the
// same rate: every instance sharing a prefix uses the same retentions (see Options), and another
// engine's adds and prunes are store operations like any.
//
// What it does not cover is a loss of data the engine cannot see: a FLUSHALL, a Redis restarted
// without persistence, a Cluster failover without persistence of the users index's shard (which
// loses the user's entry) or of the user's (which loses the user's keys, and a listing then prunes
// the user). Until H has passed since the recorded add, the engine's acquires of the user skip
// their adds, and a lease they grant is missing from a listing of every user; the first acquire
// (or revoke) of the user at least H after the recorded add adds the user again, where without
// the record the first acquire after the loss did: a lease is missing from the listing for at most
// H longer than without it, as long as the user acquires again. A lease that is only renewed stays
// missing until such an acquire, with or without the record: the repair has always been the
// user's next add. A listing of one user does not read the users index.
//
// # Audit log
//
// Each user's records are a stream, <prefix>:{<sub>}:audit, appended by the script that makes each
// change (see admin.lua). A record's ID is its stream id and its user, "<ms>-<seq>-<base64url of
// the user>", unique across users. A page of one user's records reads that stream backwards from
// the cursor; a page across users merges every listed user's stream, newest first by stream id and
// then by user (descending), which is the order of the changes per user and their order by append
// time, to the millisecond, across users. The cursor is the ID of the page's last record: each
// stream is read from strictly after it in that order. So that records appended after a first page
// cannot sort after its cursor (in the same millisecond, for a user that sorts lower), the first
// page across users reads only the records appended up to a horizon, the store's millisecond when
// the call began, and reads each log only once the clock of its node has passed it (a wait of at
// most a millisecond): every record appended to that log later has a later id, newer than any
// cursor of the listing. (The exceptions need clocks that disagree: a node's clock stepping back,
// or a user first listed after the first page, on a Cluster node whose clock lags.) Records past
// the retention are never read, whether or not Redis trimmed them yet. A page across users reads
// the log of every user of the users index (a pipeline per batch of users, then more of the logs
// it merges from), so its cost grows with the number of users; a page of one user reads that
// user's log alone.

var _ lease.Admin = (*Engine)(nil)

// Batches of the admin reads.
const (
	usersBatch  = 256  // users per ZRANGEBYLEX of the users index, and per pipeline
	auditBudget = 1000 // audit entries audit.lua looks at per call
	auditFill   = 32   // records per user per read, when merging users
)

// maxStreamSeq is the largest sequence of a stream id: "<ms>-<maxStreamSeq>" is the last id of a
// millisecond.
const maxStreamSeq = uint64(math.MaxUint64)

// store runs f bounded by OpTimeout and reports its failure as a *lease.UnavailableError for op.
func (e *Engine) store(ctx context.Context, op string, f func(ctx context.Context) error) error {
	if e.closed.Load() {
		return &lease.UnavailableError{Op: op, Err: ErrClosed}
	}
	ctx, cancel := context.WithTimeout(ctx, e.opTimeout)
	defer cancel()
	if err := f(ctx); err != nil {
		return &lease.UnavailableError{Op: op, Err: err}
	}
	return nil
}

// addUser adds user to the users index: one idempotent ZADD, before the script that may give the
// user a held lease or audit records; none while the engine knows the user is there (indexed).
func (e *Engine) addUser(ctx context.Context, op, user string) error {
	if e.indexed(user) {
		return nil
	}
	return e.store(ctx, op, func(ctx context.Context) error {
		return e.client.ZAdd(ctx, e.usersKey(), redis.Z{Member: user}).Err()
	})
}

// indexed reports whether the adds of user to the users index may be skipped: this engine
// recorded an add after a grant less than usersHorizon ago (see "Skipping the adds").
func (e *Engine) indexed(user string) bool {
	if e.usersHorizon <= 0 {
		return false
	}
	at, ok := e.added.at(user)
	return ok && e.now().Sub(at) < e.usersHorizon
}

// maxUsersHorizon bounds usersHorizon, and so how long a lost entry of the users index may stay
// unrepaired beyond the user's next acquire (see "Skipping the adds").
const maxUsersHorizon = time.Minute

// usersHorizon is H of "Skipping the adds" for the retentions idle and audit and the operation
// timeout: a quarter of the shorter retention R, at most maxUsersHorizon and at most R less
// replyKeptFor operation timeouts; zero, skipping nothing, when that is not positive.
func usersHorizon(idle, audit, opTimeout time.Duration) time.Duration {
	r := min(idle, audit)
	return max(min(r/4, maxUsersHorizon, r-replyKeptFor*opTimeout), 0)
}

// addedPerGeneration bounds each of the two generations of addedUsers: the record holds at most
// twice as many users (a few MB at most).
const addedPerGeneration = 50_000

// addedUsers is the record of the users an engine added to the users index after a grant, with the
// local time read before that grant's script was sent (see "Skipping the adds"): two generations
// of at most addedPerGeneration users (package generations). The zero value is empty and ready.
// It is safe for concurrent use.
type addedUsers struct {
	m generations.Map[string, time.Time]
}

// at answers when user was recorded last, if it still is.
func (a *addedUsers) at(user string) (time.Time, bool) {
	return a.m.Get(user, addedPerGeneration)
}

// note records user as added at t, unless it is recorded with a later time already. (Two notes at
// once may leave the earlier time, which only shortens how long the add is trusted.)
func (a *addedUsers) note(user string, t time.Time) {
	if prev, ok := a.at(user); ok && !t.After(prev) {
		return
	}
	a.m.Put(user, t, addedPerGeneration)
}

// Revoke implements lease.Admin with revoke.lua. The driver's retries of the script are answered
// from its reply key like those of every change (see state.lua); a RequestID makes the caller's
// own retries, which are new calls, answer as the first call did.
func (e *Engine) Revoke(ctx context.Context, req lease.RevokeRequest) (lease.RevokeResult, error) {
	const op = "revoke"
	if err := req.Validate(); err != nil {
		return lease.RevokeResult{}, err
	}
	// At maxmemory Redis refuses the add, and runs the revoke (revokeFn.allowOOM): the user of a
	// lease to end is in the index since its grant, and one that is not (a block of a user this
	// store never saw) has its records listed by user until an add of the user succeeds.
	if err := e.addUser(ctx, op, req.Key.User); err != nil && !outOfMemory(err) {
		return lease.RevokeResult{}, err
	}
	keys := e.sessionKeys(req.Key, newReply(), keyName{nameAdminAudit, ""})
	if req.RequestID != "" {
		keys = append(keys, e.revokeAnswerKey(req))
	}
	v, err := e.revokeCall(ctx, op, keys, []any{req.Admin, req.Reason, req.Block.Milliseconds(),
		req.RequestID, lease.RevokeRetryWindow.Milliseconds(), req.AuditRequestID})
	if err != nil {
		var repl *lease.ReplicationError
		if errors.As(err, &repl) {
			if status, res, perr := parseRevoke(v); perr == nil && status == statusOK {
				repl.Revoke = &res
			}
		}
		return lease.RevokeResult{}, err
	}
	status, res, err := parseRevoke(v)
	switch {
	case err != nil:
		return lease.RevokeResult{}, &lease.UnavailableError{Op: op, Err: err}
	case status == statusExhausted:
		return lease.RevokeResult{}, lease.ErrEpochExhausted
	case status != statusOK:
		return lease.RevokeResult{}, unexpected(op, status)
	}
	return res, nil
}

// revokeCall runs revoke.lua with keys and args and, when the engine confirms revokes on
// replicas (Options.RevokeReplicas), sends Redis's WAIT for them on the same connection: WAIT
// counts the replicas that received every write that connection sent, the revoke's (or, for a
// retry that replays its answer, the replay's, which comes after it: see replayed in state.lua).
// Both are bounded by OpTimeout, and WAIT by three quarters of what is left of it, so that Redis
// answers how many confirmed before the call's time runs out. Fewer than asked is a
// *lease.ReplicationError, with the primary's answer: the revoke took effect there, and may still
// reach them.
func (e *Engine) revokeCall(ctx context.Context, op string, keys []string, args []any) (any, error) {
	if e.revokeReplicas == 0 {
		return e.call(ctx, op, revokeFn, keys, args)
	}
	ctx, cancel := context.WithTimeout(ctx, e.opTimeout)
	defer cancel()
	primary, err := e.primaryOf(ctx, keys[0])
	if err != nil {
		return nil, &lease.UnavailableError{Op: op, Err: err}
	}
	conn := primary.(*redis.Client).Conn() // New refused other clients with RevokeReplicas
	defer conn.Close()
	v, err := e.callOn(ctx, conn, op, revokeFn, keys, args)
	if err != nil {
		return nil, err
	}
	deadline, _ := ctx.Deadline()
	// Never WAIT 0, which waits for ever.
	wait := max(time.Until(deadline)*3/4, time.Millisecond)
	acked, err := conn.Wait(ctx, e.revokeReplicas, wait).Result()
	if err != nil {
		return nil, &lease.UnavailableError{Op: op, Err: err}
	}
	if acked < int64(e.revokeReplicas) {
		return v, &lease.ReplicationError{Op: op, Wanted: e.revokeReplicas, Acked: int(acked)}
	}
	return v, nil
}

// parseRevoke reads revoke.lua's answer: {status, revoked, epoch, until_us, previous tab, previous
// epoch, now_us}, its status "RETRIED" as "OK" with Retried set.
func parseRevoke(v any) (string, lease.RevokeResult, error) {
	bad := fmt.Errorf("leaseredis: malformed revoke reply %v", v)
	a, ok := v.([]any)
	if !ok || len(a) != 7 {
		return "", lease.RevokeResult{}, bad
	}
	status, ok1 := a[0].(string)
	revoked, ok2 := a[1].(int64)
	epoch, ok3 := a[2].(int64)
	until, ok4 := a[3].(int64)
	prevTab, ok5 := a[4].(string)
	prevEpoch, ok6 := a[5].(int64)
	now, ok7 := a[6].(int64)
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || !ok6 || !ok7 || epoch < 0 || epoch >= lease.MaxEpoch || until < 0 ||
		now <= 0 || (revoked == 1) != (prevTab != "") {
		return "", lease.RevokeResult{}, bad
	}
	r := lease.RevokeResult{Revoked: revoked == 1, Epoch: epoch}
	if status == statusRetried {
		status, r.Retried = statusOK, true
	}
	if until != 0 {
		r.BlockedUntil = micros(until)
	}
	if r.Revoked {
		r.Previous = &lease.Previous{TabID: prevTab, Epoch: prevEpoch}
	}
	return status, r, nil
}

// ListLeases implements lease.Admin (see "Listing" above). It announces nothing.
func (e *Engine) ListLeases(ctx context.Context, q lease.ListQuery) (lease.LeasePage, error) {
	limit, err := q.Validate()
	if err != nil {
		return lease.LeasePage{}, err
	}
	var after *lease.Key
	if q.Cursor != "" {
		k, err := lease.ParseLeaseCursor(q.Cursor)
		if err != nil {
			return lease.LeasePage{}, err
		}
		after = &k
	}
	l := &lister{e: e, ctx: ctx, need: limit + 1, after: after}
	switch {
	case q.User == "":
		err = l.everyUser()
	case after == nil || after.User <= q.User:
		err = l.user(q.User, nil, 0)
	}
	if err != nil {
		return lease.LeasePage{}, err
	}
	page := lease.LeasePage{Leases: l.found}
	if len(page.Leases) > limit {
		page.Leases = page.Leases[:limit]
		page.Next = lease.LeaseCursor(page.Leases[limit-1].Key)
	}
	if page.Leases == nil {
		page.Leases = []lease.Lease{}
	}
	return page, nil
}

// lister gathers one page of ListLeases: need leases (one more than the page holds, to know
// whether a next page exists), in key order, strictly after after (nil: from the start).
type lister struct {
	e     *Engine
	ctx   context.Context
	need  int
	after *lease.Key
	found []lease.Lease
}

const opList = "list leases"

func (l *lister) full() bool { return len(l.found) >= l.need }

// batch is how many sessions to read from an index at a time: what the page still needs, within
// bounds (a few more, as some may have ended).
func (l *lister) batch() int64 { return int64(min(max(l.need-len(l.found), 8), lease.MaxPageLimit+1)) }

// from is where user's index is read from: after the cursor's session for the cursor's user,
// from the start for the others.
func (l *lister) from(user string) string {
	if l.after != nil && l.after.User == user {
		return "(" + l.after.Session
	}
	return "-"
}

// everyUser pages the users index from the cursor's user, reading the first batch of the index of
// each user of a page of users in one pipeline.
func (l *lister) everyUser() error {
	from := "-"
	if l.after != nil {
		from = "[" + l.after.User
	}
	for !l.full() {
		var users []string
		err := l.e.store(l.ctx, opList, func(ctx context.Context) (err error) {
			users, err = l.e.client.ZRangeByLex(ctx, l.e.usersKey(), &redis.ZRangeBy{Min: from, Max: "+", Count: usersBatch}).Result()
			return err
		})
		if err != nil || len(users) == 0 {
			return err
		}
		firsts := make([]*redis.StringSliceCmd, len(users))
		n := l.batch()
		err = l.e.store(l.ctx, opList, func(ctx context.Context) error {
			_, err := l.e.client.Pipelined(ctx, func(p redis.Pipeliner) error {
				for i, u := range users {
					firsts[i] = p.ZRangeByLex(ctx, l.e.indexKey(u), &redis.ZRangeBy{Min: l.from(u), Max: "+", Count: n})
				}
				return nil
			})
			return err
		})
		if err != nil {
			return err
		}
		var empty []string
		for i, u := range users {
			if len(firsts[i].Val()) == 0 && l.from(u) == "-" {
				empty = append(empty, u)
			}
		}
		if err := l.e.prune(l.ctx, empty); err != nil {
			return err
		}
		for i, u := range users {
			if l.full() {
				return nil
			}
			if err := l.user(u, firsts[i].Val(), n); err != nil {
				return err
			}
		}
		if len(users) < usersBatch {
			return nil
		}
		from = "(" + users[len(users)-1]
	}
	return nil
}

// prune removes from the users index those of users that have no key left (see "Listing" above):
// a check, the removal, a second check that puts back whoever has keys again.
func (e *Engine) prune(ctx context.Context, users []string) error {
	if len(users) == 0 {
		return nil
	}
	gone := func(candidates []string) ([]string, error) {
		counts := make([]*redis.IntCmd, len(candidates))
		err := e.store(ctx, opList, func(ctx context.Context) error {
			_, err := e.client.Pipelined(ctx, func(p redis.Pipeliner) error {
				for i, u := range candidates {
					counts[i] = p.Exists(ctx, e.indexKey(u), e.auditKey(u), e.adminAuditKey(u), e.knownKey(u))
				}
				return nil
			})
			return err
		})
		if err != nil {
			return nil, err
		}
		var out []string
		for i, u := range candidates {
			if counts[i].Val() == 0 {
				out = append(out, u)
			}
		}
		return out, nil
	}
	members := func(us []string) []any {
		out := make([]any, len(us))
		for i, u := range us {
			out[i] = u
		}
		return out
	}
	first, err := gone(users)
	if err != nil || len(first) == 0 {
		return err
	}
	if err := e.store(ctx, opList, func(ctx context.Context) error {
		return e.client.ZRem(ctx, e.usersKey(), members(first)...).Err()
	}); err != nil {
		return err
	}
	second, err := gone(first)
	if err != nil {
		return err
	}
	var back []redis.Z
	for _, u := range first {
		if !slices.Contains(second, u) {
			back = append(back, redis.Z{Member: u})
		}
	}
	if len(back) == 0 {
		return nil
	}
	return e.store(ctx, opList, func(ctx context.Context) error {
		return e.client.ZAdd(ctx, e.usersKey(), back...).Err()
	})
}

// user lists the held leases of user from its index until the page is full. When the caller read
// the first batch of the index already, asking for n sessions, sessions holds it; otherwise n is
// 0, and user reads it.
func (l *lister) user(user string, sessions []string, n int64) error {
	from, read := l.from(user), n > 0
	if !read {
		n = l.batch()
	}
	for !l.full() {
		if !read {
			err := l.e.store(l.ctx, opList, func(ctx context.Context) (err error) {
				sessions, err = l.e.client.ZRangeByLex(ctx, l.e.indexKey(user), &redis.ZRangeBy{Min: from, Max: "+", Count: n}).Result()
				return err
			})
			if err != nil {
				return err
			}
		}
		if len(sessions) == 0 {
			return nil
		}
		if err := l.read(user, sessions); err != nil {
			return err
		}
		if int64(len(sessions)) < n {
			return nil
		}
		from, n, read = "("+sessions[len(sessions)-1], l.batch(), false
	}
	return nil
}

// read runs leases.lua on sessions of user and adds the leases held to the page.
func (l *lister) read(user string, sessions []string) error {
	keys := make([]string, 0, len(sessions)+1)
	keys = append(keys, l.e.indexKey(user))
	for _, sid := range sessions {
		keys = append(keys, l.e.stateKey(lease.Key{User: user, Session: sid}))
	}
	var v any
	err := l.e.store(l.ctx, opList, func(ctx context.Context) (err error) {
		v, err = leasesScript.Run(ctx, l.e.client, keys).Result()
		return err
	})
	if err != nil {
		return err
	}
	leases, err := parseLeases(user, v)
	if err != nil {
		return &lease.UnavailableError{Op: opList, Err: err}
	}
	l.found = append(l.found, leases...)
	return nil
}

// parseLeases reads leases.lua's answer: {now_us, sid, tab, label, hidden, epoch, granted_us,
// expires_us, ttl_ms, transitions, ho_tab, ho_label, ho_hidden, ho_until_us, block_until_us, …}.
func parseLeases(user string, v any) ([]lease.Lease, error) {
	const stride = 14
	bad := fmt.Errorf("leaseredis: malformed leases reply %v", v)
	a, ok := v.([]any)
	if !ok || len(a) == 0 || (len(a)-1)%stride != 0 {
		return nil, bad
	}
	now, ok := a[0].(int64)
	if !ok || now <= 0 {
		return nil, bad
	}
	var out []lease.Lease
	for i := 1; i < len(a); i += stride {
		sid, ok1 := a[i].(string)
		tab, ok2 := a[i+1].(string)
		label, ok3 := a[i+2].(string)
		hoTab, ok4 := a[i+9].(string)
		hoLabel, ok5 := a[i+10].(string)
		// hidden, epoch, granted_us, expires_us, ttl_ms, transitions; then ho_hidden, ho_until_us,
		// block_until_us
		var n [9]int64
		for j, k := range []int{3, 4, 5, 6, 7, 8, 11, 12, 13} {
			x, ok := a[i+k].(int64)
			if !ok || x < 0 {
				return nil, bad
			}
			n[j] = x
		}
		key := lease.Key{User: user, Session: sid}
		if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || key.Validate() != nil || n[1] >= lease.MaxEpoch || n[3] <= now ||
			(hoTab == "") != (n[7] == 0) || (n[7] != 0 && n[7] <= now) || (n[8] != 0 && n[8] <= now) {
			return nil, bad
		}
		l := lease.Lease{
			Key:         key,
			Held:        true,
			Holder:      lease.Holder{TabID: tab, Label: label, Hidden: n[0] == 1},
			Epoch:       n[1],
			GrantedAt:   micros(n[2]),
			ExpiresAt:   micros(n[3]),
			TTL:         time.Duration(n[4]) * time.Millisecond,
			Transitions: n[5],
			Now:         micros(now),
		}
		if hoTab != "" {
			l.Handoff = &lease.HandoffState{
				Requester: lease.Holder{TabID: hoTab, Label: hoLabel, Hidden: n[6] == 1},
				Until:     micros(n[7]),
			}
		}
		if n[8] != 0 {
			l.BlockedUntil = micros(n[8])
		}
		out = append(out, l)
	}
	return out, nil
}

// Audit implements lease.Admin (see "Audit log" above). The cursor is the ID of the last record
// of the previous page.
func (e *Engine) Audit(ctx context.Context, q lease.AuditQuery) (lease.AuditPage, error) {
	const op = "audit"
	limit, err := q.Validate()
	if err != nil {
		return lease.AuditPage{}, err
	}
	var cursor *auditPos
	if q.Cursor != "" {
		p, err := parseAuditID(q.Cursor)
		if err != nil {
			return lease.AuditPage{}, err
		}
		cursor = &p
	}
	need := limit + 1
	r := &auditReader{e: e, ctx: ctx, session: q.Session, count: need}

	users := []string{q.User}
	if q.User == "" {
		if users, err = e.allUsers(ctx, op); err != nil {
			return lease.AuditPage{}, err
		}
		if len(users) == 0 {
			return lease.AuditPage{Records: []lease.AuditRecord{}}, nil
		}
		r.count = min(need, auditFill)
	}
	newest := func(string) string { return "+" }
	switch {
	case cursor != nil:
		newest = cursor.newest
	case q.User == "":
		// The first page across users: up to a horizon the store's clock has passed.
		var now time.Time
		err := e.store(ctx, op, func(ctx context.Context) (err error) {
			now, err = e.client.Time(ctx).Result()
			return err
		})
		if err != nil {
			return lease.AuditPage{}, err
		}
		r.horizon = now.UnixMilli()
		time.Sleep(time.UnixMilli(r.horizon + 1).Sub(now)) // at most a millisecond
		last := fmt.Sprintf("%d-%d", r.horizon, maxStreamSeq)
		newest = func(string) string { return last }
	}

	sources := make([]*auditSource, len(users))
	for i, u := range users {
		sources[i] = &auditSource{user: u, from: newest(u), more: true}
	}
	if err := r.fill(sources); err != nil {
		return lease.AuditPage{}, err
	}
	m := make(auditMerge, 0, len(sources))
	for _, s := range sources {
		if len(s.buf) > 0 {
			m = append(m, s)
		}
	}
	heap.Init(&m)
	var page lease.AuditPage
	for m.Len() > 0 && len(page.Records) < need {
		s := m[0]
		page.Records = append(page.Records, s.buf[0].rec)
		s.buf = s.buf[1:]
		if len(s.buf) == 0 && s.more && len(page.Records) < need {
			if err := r.read(s); err != nil {
				return lease.AuditPage{}, err
			}
		}
		if len(s.buf) == 0 {
			heap.Pop(&m)
		} else {
			heap.Fix(&m, 0)
		}
	}
	if len(page.Records) > limit {
		page.Records = page.Records[:limit]
		page.Next = page.Records[limit-1].ID
	}
	if page.Records == nil {
		page.Records = []lease.AuditRecord{}
	}
	return page, nil
}

// allUsers reads the whole users index, in byte order.
func (e *Engine) allUsers(ctx context.Context, op string) ([]string, error) {
	var all []string
	err := e.usersPages(ctx, op, 4*usersBatch, func(users []string) bool {
		all = append(all, users...)
		return true
	})
	if err != nil {
		return nil, err
	}
	return all, nil
}

// usersPages calls fn with each page of the users index, in byte order, n users at most, until fn
// answers false or the index ends; it stops at the first store error (reported as op's).
func (e *Engine) usersPages(ctx context.Context, op string, n int64, fn func(users []string) bool) error {
	from := "-"
	for {
		var users []string
		err := e.store(ctx, op, func(ctx context.Context) (err error) {
			users, err = e.client.ZRangeByLex(ctx, e.usersKey(), &redis.ZRangeBy{Min: from, Max: "+", Count: n}).Result()
			return err
		})
		if err != nil {
			return err
		}
		if (len(users) > 0 && !fn(users)) || int64(len(users)) < n {
			return nil
		}
		from = "(" + users[len(users)-1]
	}
}

// auditPos is the position of a record in the order of Audit: its stream id, then its user.
type auditPos struct {
	id   lease.EventID
	user string
}

// auditID is the ID of the record at p: "<ms>-<seq>-<base64url of the user>", printable ASCII
// without spaces, unique across users (stream ids are unique per user).
func (p auditPos) String() string {
	return p.id.String() + "-" + base64.RawURLEncoding.EncodeToString([]byte(p.user))
}

// after reports whether p comes after (is older than) o in the order of Audit: newest first by
// stream id, then by user, descending.
func (p auditPos) after(o auditPos) bool {
	if c := p.id.Compare(o.id); c != 0 {
		return c < 0
	}
	return p.user < o.user
}

// newest is the newest stream id of user's log that a page after p may hold, as the end argument
// of XREVRANGE: p's id itself for a user that sorts lower (its records of that id come after p),
// strictly before it otherwise.
func (p auditPos) newest(user string) string {
	if user < p.user {
		return p.id.String()
	}
	return "(" + p.id.String()
}

// parseAuditID reads the ID of a record, as a cursor; an *InvalidError for anything else.
func parseAuditID(s string) (auditPos, error) {
	bad := &lease.InvalidError{Field: "cursor", Reason: "must be the next cursor of an earlier page"}
	ms, rest, ok1 := strings.Cut(s, "-")
	seq, user64, ok2 := strings.Cut(rest, "-")
	if !ok1 || !ok2 {
		return auditPos{}, bad
	}
	id, err := lease.ParseEventID(ms + "-" + seq)
	if err != nil || id.IsZero() {
		return auditPos{}, bad
	}
	user, err := base64.RawURLEncoding.Strict().DecodeString(user64)
	if err != nil || lease.ValidateID("sub", string(user)) != nil {
		return auditPos{}, bad
	}
	return auditPos{id: id, user: string(user)}, nil
}

// auditSource is one user's audit log as a page reads it: the records read and not merged yet,
// and where to read on.
type auditSource struct {
	user string
	from string // the newest id to read next (ARGV[1] of audit.lua)
	more bool   // older records within retention may remain
	buf  []auditEntry
}

type auditEntry struct {
	pos auditPos
	rec lease.AuditRecord
}

// auditReader reads the users' logs for one page.
type auditReader struct {
	e       *Engine
	ctx     context.Context
	session string // the session filter, or ""
	count   int    // records per read
	horizon int64  // the first page's horizon in ms (see "Audit log"), or 0 for none
}

// fill makes the first read of every source: a pipeline per batch of users, then one by one the
// sources that need more (nothing kept yet but more to look at, a horizon not passed yet, or a
// script Redis does not know yet).
func (r *auditReader) fill(sources []*auditSource) error {
	const op = "audit"
	for start := 0; start < len(sources); start += usersBatch {
		batch := sources[start:min(start+usersBatch, len(sources))]
		cmds := make([]*redis.Cmd, len(batch))
		err := r.e.store(r.ctx, op, func(ctx context.Context) error {
			_, err := r.e.client.Pipelined(ctx, func(p redis.Pipeliner) error {
				for i, s := range batch {
					cmds[i] = auditScript.EvalSha(ctx, p, r.e.auditKeys(s.user), r.args(s)...)
				}
				return nil
			})
			if err != nil && !redis.HasErrorPrefix(err, "NOSCRIPT") {
				return err
			}
			return nil
		})
		if err != nil {
			return err
		}
		for i, s := range batch {
			waited := false
			if err := cmds[i].Err(); err == nil {
				if waited, err = r.take(s, cmds[i].Val()); err != nil {
					return err
				}
			}
			if cmds[i].Err() != nil || waited || (len(s.buf) == 0 && s.more) {
				if err := r.read(s); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// args are the ARGV of audit.lua for the next read of s.
func (r *auditReader) args(s *auditSource) []any {
	horizon := ""
	if r.horizon > 0 {
		horizon = strconv.FormatInt(r.horizon, 10)
	}
	return []any{s.from, r.session, r.count, auditBudget, r.e.auditTTL.Milliseconds(), horizon}
}

// read reads s on until it has records or nothing more to read, waiting for the store's clock to
// pass the horizon if it has not yet: for at most OpTimeout, which only a node whose clock is
// behind another's (on a Cluster) may need.
func (r *auditReader) read(s *auditSource) error {
	const op = "audit"
	waits := 0
	for len(s.buf) == 0 && s.more {
		var v any
		err := r.e.store(r.ctx, op, func(ctx context.Context) (err error) {
			v, err = auditScript.Run(ctx, r.e.client, r.e.auditKeys(s.user), r.args(s)...).Result()
			return err
		})
		if err != nil {
			return err
		}
		waited, err := r.take(s, v)
		if err != nil {
			return err
		}
		if waited {
			if waits++; time.Duration(waits)*time.Millisecond > r.e.opTimeout {
				return &lease.UnavailableError{Op: op, Err: fmt.Errorf(
					"leaseredis: the clock of the node of user %q did not pass the horizon %d ms within %v", s.user, r.horizon, r.e.opTimeout)}
			}
			select {
			case <-r.ctx.Done():
				return &lease.UnavailableError{Op: op, Err: r.ctx.Err()}
			case <-time.After(time.Millisecond):
			}
		}
	}
	return nil
}

// take reads audit.lua's answer v into s; waited is true when the script answered WAIT (the
// horizon is not past on the store's clock) and s is unchanged.
func (r *auditReader) take(s *auditSource, v any) (waited bool, err error) {
	bad := &lease.UnavailableError{Op: "audit", Err: fmt.Errorf("leaseredis: malformed audit reply %v", v)}
	a, ok := v.([]any)
	if !ok || len(a) < 2 {
		return false, bad
	}
	if status, _ := a[0].(string); status == "WAIT" && len(a) == 2 {
		return true, nil
	} else if status != statusOK || len(a) < 4 {
		return false, bad
	}
	more, ok1 := a[2].(int64)
	from, ok2 := a[3].(string)
	if !ok1 || !ok2 || from == "" {
		return false, bad
	}
	for _, x := range a[4:] {
		entry, err := parseAuditEntry(s.user, x)
		if err != nil {
			return false, &lease.UnavailableError{Op: "audit", Err: err}
		}
		s.buf = append(s.buf, entry)
	}
	s.from, s.more = from, more == 1
	return false, nil
}

// parseAuditEntry reads one stream entry of user's audit log, {id, {field, value, …}} (see
// admin.lua).
func parseAuditEntry(user string, x any) (auditEntry, error) {
	bad := fmt.Errorf("leaseredis: malformed audit entry %v", x)
	e, ok := x.([]any)
	if !ok || len(e) != 2 {
		return auditEntry{}, bad
	}
	rawID, ok1 := e[0].(string)
	list, ok2 := e[1].([]any)
	if !ok1 || !ok2 || len(list)%2 != 0 {
		return auditEntry{}, bad
	}
	id, err := lease.ParseEventID(rawID)
	if err != nil {
		return auditEntry{}, bad
	}
	f := make(map[string]string, len(list)/2)
	for i := 0; i < len(list); i += 2 {
		k, ok1 := list[i].(string)
		v, ok2 := list[i+1].(string)
		if !ok1 || !ok2 {
			return auditEntry{}, bad
		}
		f[k] = v
	}
	num := func(name string) (int64, bool) {
		s, ok := f[name]
		if !ok {
			return 0, true
		}
		n, err := strconv.ParseInt(s, 10, 64)
		return n, err == nil && n >= 0
	}
	epoch, ok1 := num("e")
	at, ok2 := num("at")
	pep, ok3 := num("pep")
	until, ok4 := num("until")
	pos := auditPos{id: id, user: user}
	rec := lease.AuditRecord{
		ID:     pos.String(),
		Key:    lease.Key{User: user, Session: f["s"]},
		Action: lease.AuditAction(f["a"]),
		Epoch:  epoch,
		TabID:  f["tab"],
		Admin:  f["adm"],
		Reason: f["r"],
		// Records written before request ids were kept have none.
		RequestID: f["rid"],
	}
	if !ok1 || !ok2 || !ok3 || !ok4 || at <= 0 || rec.Action == "" || rec.Key.Validate() != nil || epoch >= lease.MaxEpoch {
		return auditEntry{}, bad
	}
	rec.At = micros(at)
	if until != 0 {
		rec.Until = micros(until)
	}
	// A release's holder before it, and an expiry's epoch before it, are implied (admin.lua).
	ptab, hasPrevious := f["ptab"]
	if !hasPrevious && rec.Action == lease.AuditRelease {
		ptab, hasPrevious = rec.TabID, true
	}
	if _, ok := f["pep"]; !ok {
		pep = epoch
	}
	if hasPrevious {
		rec.Previous = &lease.Previous{TabID: ptab, Epoch: pep}
	}
	return auditEntry{pos: pos, rec: rec}, nil
}

// auditMerge is a heap of the sources that have records, by their next record: popping gives the
// records of every user in the order of Audit.
type auditMerge []*auditSource

func (m auditMerge) Len() int           { return len(m) }
func (m auditMerge) Less(i, j int) bool { return m[j].buf[0].pos.after(m[i].buf[0].pos) }
func (m auditMerge) Swap(i, j int)      { m[i], m[j] = m[j], m[i] }
func (m *auditMerge) Push(x any)        { *m = append(*m, x.(*auditSource)) }
func (m *auditMerge) Pop() any {
	old := *m
	x := old[len(old)-1]
	*m = old[:len(old)-1]
	return x
}

// RecordCatalog implements lease.Admin with catalog.lua, in the admin's own logs. The admin is
// added to the users index first, since the record is in the admin's audit log (unless the engine
// knows it is there, see "Skipping the adds").
func (e *Engine) RecordCatalog(ctx context.Context, admin, reason string) error {
	const op = "record catalog"
	if err := lease.ValidateCatalogRecord(admin, reason); err != nil {
		return err
	}
	if err := e.addUser(ctx, op, admin); err != nil {
		return err
	}
	return e.store(ctx, op, func(ctx context.Context) error {
		return catalogScript.Run(ctx, e.client, e.auditKeys(admin), admin, reason, e.auditLen, e.auditTTL.Milliseconds()).Err()
	})
}
