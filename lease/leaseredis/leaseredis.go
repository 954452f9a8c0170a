// Package leaseredis is the Redis lease.Engine, on a go-redis v9 UniversalClient: standalone,
// Sentinel or Cluster. Several tablease instances may share one Redis.
//
// # Keys
//
// All the state of a session is one hash that never expires:
//
//	<prefix>:{<sub>}:lease:<sessionId>
//
// The braces are the hash tag: every key of a user (each session's lease, and the per-user
// indexes and logs that scripts keep in step with them) lands on one Cluster slot, so one script
// may touch them all without a CROSSSLOT error. Keys are built only from validated identifiers,
// which cannot contain '{' or '}': the user ends at the brace, the session follows a fixed word,
// and nothing a caller sends can move the hash tag. Each
// script names its one key in KEYS. The fields of the hash are described in state.lua. The hash is
// never deleted or given a TTL: it holds the epoch counter (DESIGN §2). Its size is a few hundred
// bytes per session that ever held a lease.
//
// # Time and atomicity
//
// Every call is one Lua script (acquire.lua, renew.lua, release.lua, check.lua, get.lua) that reads
// the store clock with redis.call('TIME'), decides and writes: the caller's clock is never used.
// Reading TIME before writing needs effects replication, the only mode of Redis 7 and the default
// since Redis 5. Scripts run with EVALSHA, falling back to EVAL when the server does not know them (after a
// restart). Every writing script is idempotent under the retries of go-redis: a retried acquire or
// takeover finds its tab holding and keeps the epoch, a retried release finds the release it
// repeats, and a retried renew extends again.
//
// # Errors
//
// Arguments are validated in Go before anything is sent. Anything that goes wrong with the store
// (refused or broken connections, timeouts, a closed client, LOADING, READONLY, OOM, a malformed
// reply) is a *lease.UnavailableError naming the operation, never a decision about a lease.
// Cancellations of the caller's context are reported the same way, wrapping the context's error.
//
// Redis must run with maxmemory-policy noeviction; see Engine.EvictionPolicy.
package leaseredis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tablease/tablease/lease"
)

// Defaults of Options.
const (
	DefaultPrefix    = "tablease"
	DefaultOpTimeout = 2 * time.Second
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
}

// Engine is the Redis lease.Engine. Use New; the zero value is not usable. It is safe for
// concurrent use.
type Engine struct {
	client    redis.UniversalClient // not owned: the caller closes it
	limits    lease.Limits
	prefix    string
	opTimeout time.Duration
	closed    atomic.Bool // set by Close
}

var _ lease.Engine = (*Engine)(nil)

// New returns an engine that keeps its leases in the Redis of client. The engine does not own the
// client: Close leaves it open, and the caller closes it after closing the engine.
//
// It fails with a *lease.InvalidError for bad limits or prefix, and with an error when client is
// nil, OpTimeout is negative, or client is a *redis.Client, *redis.ClusterClient or *redis.Ring
// without ContextTimeoutEnabled (its calls would not be bounded by OpTimeout).
func New(client redis.UniversalClient, opts Options) (*Engine, error) {
	if client == nil {
		return nil, errors.New("leaseredis: nil client")
	}
	limits := opts.Limits
	if limits == (lease.Limits{}) {
		limits = lease.DefaultLimits
	}
	if err := limits.Validate(); err != nil {
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
	return &Engine{client: client, limits: limits, prefix: prefix, opTimeout: timeout}, nil
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

// stateKey is the key of the state hash of k, which must be valid.
func (e *Engine) stateKey(k lease.Key) string {
	return e.prefix + ":{" + k.User + "}:lease:" + k.Session
}

// Acquire implements lease.Engine. A new grant (the lease is free, expired or released, or a
// takeover from another tab) gets the epoch max(last+1, now_us); the holder acquiring again, in
// either mode, keeps its epoch, has its label and hidden flag updated and its lease extended from
// now by the clamped TTL.
func (e *Engine) Acquire(ctx context.Context, req lease.AcquireRequest) (lease.Lease, error) {
	mode, err := req.Validate()
	if err != nil {
		return lease.Lease{}, err
	}
	ttl, err := e.limits.Clamp(req.TTL, req.Holder.Hidden)
	if err != nil {
		return lease.Lease{}, err
	}
	status, l, err := e.run(ctx, "acquire", acquireScript, req.Key,
		req.Holder.TabID, req.Holder.Label, flag(req.Holder.Hidden), ttl.Milliseconds(), string(mode))
	if err != nil {
		return lease.Lease{}, err
	}
	switch status {
	case statusOK:
		return l, nil
	case statusHeld:
		return lease.Lease{}, &lease.HeldError{Holder: l.Holder, Epoch: l.Epoch, Remaining: l.Remaining()}
	case statusExhausted:
		return lease.Lease{}, lease.ErrEpochExhausted
	}
	return lease.Lease{}, unexpected("acquire", status)
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
	status, l, err := e.run(ctx, "renew", renewScript, req.Key,
		req.TabID, strconv.FormatInt(req.Epoch, 10), flag(req.Hidden), ttl.Milliseconds())
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
	status, l, err := e.run(ctx, "release", releaseScript, req.Key, req.TabID, strconv.FormatInt(req.Epoch, 10))
	if err != nil {
		return lease.ReleaseResult{}, err
	}
	switch status {
	case statusReleased:
		return lease.ReleaseResult{Released: true, Lease: l}, nil
	case statusKept:
		return lease.ReleaseResult{Lease: l}, nil
	}
	return lease.ReleaseResult{}, unexpected("release", status)
}

// Get implements lease.Engine.
func (e *Engine) Get(ctx context.Context, key lease.Key) (lease.Lease, error) {
	if err := key.Validate(); err != nil {
		return lease.Lease{}, err
	}
	status, l, err := e.run(ctx, "get", getScript, key)
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
	status, l, err := e.run(ctx, "check", checkScript, key, tabID, strconv.FormatInt(epoch, 10))
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

// Ping implements lease.Engine: PING, bounded by OpTimeout.
func (e *Engine) Ping(ctx context.Context) error {
	if e.closed.Load() {
		return &lease.UnavailableError{Op: "ping", Err: ErrClosed}
	}
	ctx, cancel := context.WithTimeout(ctx, e.opTimeout)
	defer cancel()
	if err := e.client.Ping(ctx).Err(); err != nil {
		return &lease.UnavailableError{Op: "ping", Err: err}
	}
	return nil
}

// Close makes every later call fail with a *lease.UnavailableError wrapping ErrClosed. It does not
// close the client, which the engine does not own, and leaves the leases in Redis. Closing twice is
// not an error.
func (e *Engine) Close() error {
	e.closed.Store(true)
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

// run runs one script on the state hash of key, bounded by OpTimeout, and parses its answer.
func (e *Engine) run(ctx context.Context, op string, s *redis.Script, key lease.Key, args ...any) (string, lease.Lease, error) {
	if e.closed.Load() {
		return "", lease.Lease{}, &lease.UnavailableError{Op: op, Err: ErrClosed}
	}
	ctx, cancel := context.WithTimeout(ctx, e.opTimeout)
	defer cancel()
	v, err := s.Run(ctx, e.client, []string{e.stateKey(key)}, args...).Result()
	if err != nil {
		return "", lease.Lease{}, &lease.UnavailableError{Op: op, Err: err}
	}
	status, l, err := parseReply(key, v)
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
