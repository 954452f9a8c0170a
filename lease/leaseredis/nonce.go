package leaseredis

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tablease/tablease/lease"
)

// Nonces (the contract of leasetest.NonceStore). Each nonce used is one string key that expires:
//
//	<prefix>:nonce:<nonce>    a random mark of the call that used it, with the nonce's TTL
//
// written with one command, SET <key> <mark> NX PX <ttl ms> GET, which tests and writes in one
// step: of concurrent uses of a nonce exactly one finds it absent. The mark makes the call
// idempotent under the retries of go-redis: a retried SET that finds its own mark (the first try
// was applied but its reply lost) is the same fresh use, not a second one. NX with GET needs
// Redis 7.0 or later.
//
// The nonce is a validated identifier, so it holds no braces and the key has no hash tag (one key
// per command, on any slot). The TTL runs on the Redis clock. A nonce holds memory for its TTL
// only; under maxmemory-policy noeviction it is never evicted early, which is what keeps a used
// ticket used.

// nonceKey is the key of nonce, which must be valid.
func (e *Engine) nonceKey(nonce string) string { return e.prefix + ":nonce:" + nonce }

// UseNonce records nonce as used for ttl, and reports whether it was fresh (see
// leasetest.NonceStore).
func (e *Engine) UseNonce(ctx context.Context, nonce string, ttl time.Duration) (bool, error) {
	const op = "use nonce"
	if err := lease.ValidateNonce(nonce, ttl); err != nil {
		return false, err
	}
	if e.closed.Load() {
		return false, &lease.UnavailableError{Op: op, Err: ErrClosed}
	}
	mark := rand.Text() // crypto/rand: unique to this call
	ctx, cancel := context.WithTimeout(ctx, e.opTimeout)
	defer cancel()
	v, err := e.client.Do(ctx, "set", e.nonceKey(nonce), mark, "nx", "px", ttl.Milliseconds(), "get").Result()
	switch {
	case errors.Is(err, redis.Nil):
		return true, nil // it was absent: this call used it
	case err != nil:
		return false, &lease.UnavailableError{Op: op, Err: err}
	}
	prev, ok := v.(string)
	if !ok {
		return false, &lease.UnavailableError{Op: op, Err: fmt.Errorf("leaseredis: malformed SET reply %v", v)}
	}
	return prev == mark, nil
}
