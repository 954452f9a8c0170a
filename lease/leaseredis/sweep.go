package leaseredis

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tablease/tablease/lease"
)

// The sweep announces the expiries that nothing else announces. An expiry is announced by the
// next script that touches its session, or by the settle timer of an engine that watches it (see
// "Expiry timers" in docs/engines.md); a lease that expires in a session nobody watches and no
// call touches again would otherwise keep its holder in the state until the state expires, and
// its expiry would get neither its "expired" event nor its "expire" audit record.
//
// So every engine, once per sweep period, offers to sweep: it sets <prefix>:sweep with NX and an
// expiry just under the period, and the engine that set it sweeps, so that the instances sharing a
// prefix sweep about once per period between them, whichever of them run. The sweep pages the
// users index (see "Listing" in admin.go) and the index of held leases of each user, reads the
// holder, the expiry and the epochs of each indexed session (one pipeline per batch), and runs
// get.lua, which settles like every session script, on each lease that expired unannounced by the
// store's clock at the sweep's start (those that expire later are the next sweep's). A session is
// in its user's index from its grant until the announcement of its end (leases.lua leaves an
// expired lease there until then), and its state outlives the lease by IdleRetention (keep in
// admin.lua), so a sweep period of at most a quarter of IdleRetention announces every expiry
// whose user is in the users index, while its state lives. Each announcement is once per epoch
// whoever makes it (settle_lease in events.lua): a sweep that overlaps a call, a timer or another
// sweep announces nothing twice.
//
// The sweep costs one ZRANGEBYLEX per user of the users index and one HMGET per held lease, per
// period, on one instance, and a script per expiry it announces. A user whose keys fail (a Cluster
// shard down) is passed over, so that the others' expiries are announced; the sweep stops at an
// error of the users index or after maxSweepFailures, and the next period's starts again from the
// first user.

// sweepPeriod is how often an engine of idle retention idle offers to sweep: a quarter of it, at
// least a second and at most a minute.
func sweepPeriod(idle time.Duration) time.Duration {
	return min(max(idle/4, time.Second), time.Minute)
}

// sweepKey is the key whose setter sweeps this period (see above). It has no hash tag.
func (e *Engine) sweepKey() string { return e.prefix + ":sweep" }

// sweepLoop offers to sweep every sweep period until Close.
func (e *Engine) sweepLoop() {
	defer e.timers.Done()
	t := time.NewTicker(e.sweepEvery)
	defer t.Stop()
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-t.C:
			if e.onClockOffset != nil {
				if offset, rtt, err := e.ClockOffset(e.ctx); err == nil && e.ctx.Err() == nil {
					e.onClockOffset(offset, rtt)
				}
			}
			// A sweep that failed is the next period's to do.
			if n, turn, err := e.sweepTurn(e.ctx); (turn || err != nil) && e.onSweep != nil && e.ctx.Err() == nil {
				e.onSweep(n, err)
			}
		}
	}
}

// ClockOffset answers how far Redis's clock is ahead of this process's (negative: behind), read
// with one TIME, and the round trip of that TIME, which bounds the error of the offset (it is
// taken from the middle of the round trip). The lease tokens of a grant are dated by Redis's clock
// and checked by tablease (POST …/lease/check with a token) and by guards on their own: clocks
// that disagree by more than the checks' leeway refuse every fresh token (an iat in the future)
// or accept expired ones.
func (e *Engine) ClockOffset(ctx context.Context) (offset, rtt time.Duration, err error) {
	err = e.store(ctx, "time", func(ctx context.Context) error {
		before := time.Now()
		t, err := e.client.Time(ctx).Result()
		after := time.Now()
		rtt = after.Sub(before)
		offset = t.Sub(before.Add(rtt / 2))
		return err
	})
	return offset, rtt, err
}

// sweepTurn sweeps when no engine sharing the prefix took the turn in the last period, and
// answers how many expiries it announced and whether it took the turn.
func (e *Engine) sweepTurn(ctx context.Context) (n int, turn bool, err error) {
	var mine bool
	err = e.store(ctx, opSweep, func(ctx context.Context) (err error) {
		// Nine tenths of the period, so that the key has expired by the setter's next tick.
		mine, err = e.client.SetNX(ctx, e.sweepKey(), "1", e.sweepEvery*9/10).Result()
		if outOfMemory(err) {
			// Redis at its maxmemory refuses the SET but runs get.lua, which announces what
			// expired: every engine sweeps then, rather than none (each expiry is announced once).
			mine, err = true, nil
		}
		return err
	})
	if err != nil || !mine {
		return 0, false, err
	}
	n, err = e.sweep(ctx)
	return n, true, err
}

// opSweep names the sweep's store calls in errors.
const opSweep = "sweep"

// maxSweepFailures is how many store calls in a row may fail entirely before a sweep stops: a
// user whose keys fail (a Cluster shard down, a key of the wrong type) is passed over, so that the
// others' expiries are announced, and a pipeline that some shards answered is no failure in a
// row; but a Redis that stopped answering altogether ends the sweep within a few OpTimeouts
// rather than one per page of users.
const maxSweepFailures = 8

// sweeping is one sweep: what it announced, and the store errors it passed over.
type sweeping struct {
	e         *Engine
	ctx       context.Context
	nowUS     int64 // the store's clock when the sweep began: later expiries are the next sweep's
	announced int
	inARow    int   // store calls that failed entirely, in a row
	err       error // the first error
}

// result notes how a store call went, whose commands failed (errs of them, the first err) or
// not, and answers whether the sweep goes on.
func (sw *sweeping) result(errs, all int, err error) bool {
	if errs == 0 {
		sw.inARow = 0
		return true
	}
	if sw.err == nil {
		sw.err = storeError(err)
	}
	if errs < all {
		sw.inARow = 0 // some shards answered
		return true
	}
	sw.inARow++
	return sw.inARow < maxSweepFailures
}

// sweep announces the expiries of the leases that expired unannounced in every user's index, and
// answers how many it announced and the first store error it met (it stops at an error of the
// users index, or after maxSweepFailures others).
func (e *Engine) sweep(ctx context.Context) (int, error) {
	sw := &sweeping{e: e, ctx: ctx}
	err := e.store(ctx, opSweep, func(ctx context.Context) error {
		t, err := e.client.Time(ctx).Result()
		sw.nowUS = t.UnixMicro()
		return err
	})
	if err != nil {
		return 0, err
	}
	if err := e.usersPages(ctx, opSweep, usersBatch, sw.users); err != nil {
		return sw.announced, err
	}
	return sw.announced, sw.err
}

// users sweeps one page of the users index, and answers whether the sweep goes on.
func (sw *sweeping) users(users []string) bool {
	held, ok := sw.heldLeases(users)
	if !ok {
		return false
	}
	expired, ok := sw.expiredUnannounced(held)
	if !ok {
		return false
	}
	for _, k := range expired {
		// get.lua settles, which announces the expiry (unless a call did since the read).
		_, err := sw.e.Get(sw.ctx, k)
		if !sw.call(err) {
			return false
		}
		if err == nil {
			sw.announced++
		}
	}
	return true
}

// heldLeases answers the sessions in the indexes of held leases of users (the first batch of
// each in one pipeline, then the rest of each index that filled its batch), and whether the sweep
// goes on. A user whose index cannot be read is passed over.
func (sw *sweeping) heldLeases(users []string) ([]lease.Key, bool) {
	e := sw.e
	firsts := make([]*redis.StringSliceCmd, len(users))
	// The pipeline's error is one command's: each is looked at below (on a Cluster the commands
	// of the shards that answered have their results).
	_ = e.store(sw.ctx, opSweep, func(ctx context.Context) error {
		_, err := e.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, u := range users {
				firsts[i] = p.ZRangeByLex(ctx, e.indexKey(u), &redis.ZRangeBy{Min: "-", Max: "+", Count: usersBatch})
			}
			return nil
		})
		return err
	})
	if !sw.result(failures(firsts)) {
		return nil, false
	}
	var keys []lease.Key
	for i, u := range users {
		page, err := firsts[i].Result()
		if err != nil {
			continue // passed over: counted above
		}
		for {
			for _, s := range page {
				keys = append(keys, lease.Key{User: u, Session: s})
			}
			if len(page) < usersBatch {
				break
			}
			from := "(" + page[len(page)-1]
			err := e.store(sw.ctx, opSweep, func(ctx context.Context) (err error) {
				page, err = e.client.ZRangeByLex(ctx, e.indexKey(u), &redis.ZRangeBy{Min: from, Max: "+", Count: usersBatch}).Result()
				return err
			})
			if !sw.call(err) {
				return nil, false
			}
			if err != nil {
				break
			}
		}
	}
	return keys, true
}

// failures answers how many of cmds failed, of how many, and the first error.
func failures[C redis.Cmder](cmds []C) (errs, all int, first error) {
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			if errs == 0 {
				first = err
			}
			errs++
		}
	}
	return errs, len(cmds), first
}

// call is result for a store call of one command.
func (sw *sweeping) call(err error) bool {
	if err != nil {
		return sw.result(1, 1, err)
	}
	return sw.result(0, 1, nil)
}

// expiredUnannounced answers those of keys whose lease expired by the sweep's start and whose end
// was not announced, from their state hashes, read in pipelines of usersBatch, and whether the
// sweep goes on. A session with no hash (parked, or forgotten) has no holder; one whose hash
// cannot be read is passed over.
func (sw *sweeping) expiredUnannounced(keys []lease.Key) ([]lease.Key, bool) {
	e := sw.e
	var expired []lease.Key
	for start := 0; start < len(keys); start += usersBatch {
		batch := keys[start:min(start+usersBatch, len(keys))]
		reads := make([]*redis.SliceCmd, len(batch))
		_ = e.store(sw.ctx, opSweep, func(ctx context.Context) error {
			_, err := e.client.Pipelined(ctx, func(p redis.Pipeliner) error {
				for i, k := range batch {
					reads[i] = p.HMGet(ctx, e.stateKey(k), "tab", "expires_us", "epoch", "ended_epoch")
				}
				return nil
			})
			return err
		})
		if !sw.result(failures(reads)) {
			return nil, false
		}
		for i, k := range batch {
			v, err := reads[i].Result()
			if err != nil || len(v) != 4 {
				continue
			}
			tab, _ := v[0].(string)
			expires, epoch, ended := number(v[1]), number(v[2]), number(v[3])
			if tab != "" && epoch != 0 && ended != epoch && expires <= sw.nowUS {
				expired = append(expired, k)
			}
		}
	}
	return expired, true
}

// storeError is err of a sweep's command as the engine reports store errors (an error of a call
// such as Get is one already).
func storeError(err error) error {
	var u *lease.UnavailableError
	if errors.As(err, &u) {
		return err
	}
	return &lease.UnavailableError{Op: opSweep, Err: err}
}

// number reads an integer field of an HMGET answer; a missing or malformed one is zero.
func number(v any) int64 {
	s, _ := v.(string)
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}
