package api

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// storeQuiet is how long the store must have answered every call without a failure before an
// outage counts as over. A Cluster shard that fails over fails the calls of its users only, while
// the other shards answer theirs: an outage ends once the failures stop, not at the first answer.
const storeQuiet = time.Second

// storeHealth logs an outage of the store in two lines: a warning at the first call it fails
// ("store calls fail"), and, once calls are served again, a line that says for how long and how
// many calls failed. Each failed request has a line of its own (503); these two say
// when the outage began and that it is over.
type storeHealth struct {
	log *slog.Logger
	now func() time.Time

	down atomic.Bool // an outage is in progress: answered takes the lock only then

	mu       sync.Mutex // protects the fields below
	since    time.Time  // the first failure of the outage
	last     time.Time  // its latest failure
	failures int
	ops      map[string]int // failures by operation
}

func newStoreHealth(log *slog.Logger, now func() time.Time) *storeHealth {
	return &storeHealth{log: log, now: now}
}

// failed records a call of op that the store did not serve.
func (h *storeHealth) failed(op string, err error) {
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.down.Load() {
		h.down.Store(true)
		h.since, h.failures, h.ops = now, 0, map[string]int{}
		h.log.Warn("store calls fail",
			slog.String("op", op), slog.String("error", err.Error()))
	}
	h.last = now
	h.failures++
	h.ops[op]++
}

// answered records a call the store served.
func (h *storeHealth) answered() {
	if !h.down.Load() {
		return
	}
	now := h.now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.down.Load() || now.Sub(h.last) < storeQuiet {
		return
	}
	h.down.Store(false)
	h.log.Info("store calls are served again", h.summary()...)
}

// stopped closes an outage still in progress as the server stops, with the same figures as
// "store calls are served again", so that every "store calls fail" has its closing line.
func (h *storeHealth) stopped() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.down.Load() {
		return
	}
	h.down.Store(false)
	h.log.Warn("store calls still failed as the server stopped", h.summary()...)
}

// summary is what the closing line of an outage says of it. h.mu is held.
func (h *storeHealth) summary() []any {
	attrs := []any{
		slog.Float64("outage_s", h.last.Sub(h.since).Seconds()),
		slog.Int("failed_calls", h.failures),
		slog.Time("first_failure", h.since),
		slog.Time("last_failure", h.last),
	}
	for op, n := range h.ops {
		attrs = append(attrs, slog.Int("failed_"+op, n))
	}
	return attrs
}
