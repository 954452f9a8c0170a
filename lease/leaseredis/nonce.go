package leaseredis

import (
	"context"
	"crypto/rand"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tablease/tablease/lease"
)

// Nonces (the contract of leasetest.NonceStore). Two kinds of keys, under one hash tag of their
// own (one Cluster slot, so that one script reads both; nonces are few, one per event ticket):
//
//	<prefix>:{nonces}:generation    the generation: random, made by the first NewNonce that finds
//	                                none; never expires
//	<prefix>:{nonces}:n:<nonce>     a nonce used: a random mark of the call that used it, with the
//	                                nonce's TTL
//
// A nonce is "<generation>.<random>". When Redis loses its data, the generation goes with the
// nonces it remembered, and the next NewNonce makes another: the nonces handed out before the
// loss, used or not, are of another generation and never fresh again. usenonce.lua checks the
// generation and records the use in one step; the mark makes the call idempotent under the
// retries of go-redis: a retried use that finds its own mark (the first try was applied but its
// reply lost) is the same fresh use, not a second one.
//
// The TTL runs on the Redis clock. A nonce holds memory for its TTL only; under maxmemory-policy
// noeviction it is never evicted early, which is what keeps a used ticket used.

//go:embed usenonce.lua
var useNonceLua string

var useNonceScript = redis.NewScript(useNonceLua)

// nonceTag starts the keys of nonces under the prefix.
func (e *Engine) nonceTag() string { return e.prefix + ":{nonces}:" }

// NewNonce answers a new nonce of the store's generation (see leasetest.NonceStore), making the
// generation when there is none (SET NX GET: of concurrent makers, one wins and all read it).
func (e *Engine) NewNonce(ctx context.Context) (string, error) {
	const op = "new nonce"
	if e.closed.Load() {
		return "", &lease.UnavailableError{Op: op, Err: ErrClosed}
	}
	ctx, cancel := context.WithTimeout(ctx, e.opTimeout)
	defer cancel()
	mine := rand.Text()
	gen, err := e.client.SetArgs(ctx, e.nonceTag()+"generation", mine, redis.SetArgs{Mode: "NX", Get: true}).Result()
	switch {
	case errors.Is(err, redis.Nil):
		gen = mine // there was none: this call made it
	case err != nil:
		return "", &lease.UnavailableError{Op: op, Err: err}
	}
	if lease.ValidateID("nonce generation", gen) != nil || strings.Contains(gen, ".") {
		return "", &lease.UnavailableError{Op: op, Err: fmt.Errorf("leaseredis: malformed nonce generation %q", gen)}
	}
	return gen + "." + rand.Text(), nil
}

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
	gen, _, ok := strings.Cut(nonce, ".")
	if !ok {
		return false, nil // not of any generation
	}
	ctx, cancel := context.WithTimeout(ctx, e.opTimeout)
	defer cancel()
	tag := e.nonceTag()
	v, err := useNonceScript.Run(ctx, e.client, []string{tag + "generation", tag + "n:" + nonce},
		gen, rand.Text(), ttl.Milliseconds()).Int64()
	if err != nil {
		return false, &lease.UnavailableError{Op: op, Err: err}
	}
	return v == 1, nil
}
