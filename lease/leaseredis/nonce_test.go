package leaseredis

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tablease/tablease/internal/redistest"
	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/lease/leasetest"
)

// TestNonces runs the nonce suite on a namespace of the shared Redis per subtest.
func TestNonces(t *testing.T) {
	leasetest.RunNonces(t, func(t *testing.T) leasetest.NonceTarget {
		e, _, db := newEngine(t)
		return leasetest.NonceTarget{
			Store: e,
			LoseData: func(t *testing.T) leasetest.NonceStore {
				db.Flush(t)
				return e
			},
		}
	})
}

func TestANonceIsOneKeyUnderThePrefixThatExpiresWithItsTTL(t *testing.T) {
	e, rdb, db := newEngine(t)
	ctx := t.Context()
	n, err := e.NewNonce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if fresh, err := e.UseNonce(ctx, n, 30*time.Second); err != nil || !fresh {
		t.Fatalf("UseNonce: %v, %v", fresh, err)
	}
	gen, _, _ := strings.Cut(n, ".")
	if got := rdb.Get(ctx, db.Prefix()+":{nonces}:generation").Val(); got != gen {
		t.Fatalf("the generation key holds %q, want the nonce's generation %q", got, gen)
	}
	if ttl := rdb.TTL(ctx, db.Prefix()+":{nonces}:generation").Val(); ttl != -1 {
		t.Fatalf("TTL of the generation = %v, want none", ttl)
	}
	key := db.Prefix() + ":{nonces}:n:" + n
	if typ := rdb.Type(ctx, key).Val(); typ != "string" {
		t.Fatalf("TYPE %s = %q, want string", key, typ)
	}
	if ttl := rdb.PTTL(ctx, key).Val(); ttl <= 29*time.Second || ttl > 30*time.Second {
		t.Fatalf("PTTL %s = %v, want about 30s", key, ttl)
	}
}

// setTwice is a hook that sends every script twice and keeps the second answer, as when go-redis
// retries a command whose first answer was lost after the server ran it.
type setTwice struct{}

func (setTwice) DialHook(next redis.DialHook) redis.DialHook { return next }
func (setTwice) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (setTwice) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n == "evalsha" || n == "eval" {
			if err := next(ctx, cmd.Clone()); err != nil && !errors.Is(err, redis.Nil) {
				return err
			}
		}
		return next(ctx, cmd)
	}
}

func TestAUseOfANonceIsIdempotentWhenTheDriverRetriesIt(t *testing.T) {
	db := redistest.Shared(t)
	client, err := NewClient(db.URL(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	client.AddHook(setTwice{})
	e, err := New(client, Options{Prefix: db.Prefix()})
	if err != nil {
		t.Fatal(err)
	}
	n, err := e.NewNonce(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if fresh, err := e.UseNonce(t.Context(), n, time.Minute); err != nil || !fresh {
		t.Fatalf("a first use sent twice = %v, %v; want fresh", fresh, err)
	}
	if fresh, err := e.UseNonce(t.Context(), n, time.Minute); err != nil || fresh {
		t.Fatalf("a second use sent twice = %v, %v; want used", fresh, err)
	}
}

func TestNonceCallsAfterCloseAreUnavailable(t *testing.T) {
	e, _, _ := newEngine(t)
	_ = e.Close()
	if fresh, err := e.UseNonce(t.Context(), "g.n-1", time.Minute); fresh || !errors.Is(err, lease.ErrUnavailable) || !errors.Is(err, ErrClosed) {
		t.Fatalf("UseNonce after Close = %v, %v; want unavailable", fresh, err)
	}
	if n, err := e.NewNonce(t.Context()); n != "" || !errors.Is(err, lease.ErrUnavailable) || !errors.Is(err, ErrClosed) {
		t.Fatalf("NewNonce after Close = %q, %v; want unavailable", n, err)
	}
}
