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
	// after runs f after d (time.AfterFunc), to end an outage whose calls were all served within
	// the quiet second after its last failure.
	after func(d time.Duration, f func()) *time.Timer

	down atomic.Bool // an outage is in progress: answered takes the lock only then

	mu       sync.Mutex // protects the fields below
	since    time.Time  // the first failure of the outage
	last     time.Time  // its latest failure
	served   time.Time  // the latest call served during the outage
	failures int
	ops      map[string]int // failures by operation
	recheck  *time.Timer    // set while an end is due at last + storeQuiet
}

func newStoreHealth(log *slog.Logger, now func() time.Time) *storeHealth {
	return &storeHealth{log: log, now: now, after: time.AfterFunc}
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
	if !h.down.Load() {
		return
	}
	h.served = now
	h.endIfQuiet(now)
}

// endIfQuiet ends the outage once a call was served after its last failure and a quiet second has
// passed since that failure; when the second has not passed yet, it looks again then, so that an
// outage whose calls were all served within that second (a client's retry right after Redis came
// back, and nothing since) is ended all the same. h.mu is held.
func (h *storeHealth) endIfQuiet(now time.Time) {
	if h.served.Before(h.last) {
		return // no call served since the last failure
	}
	if quiet := now.Sub(h.last); quiet < storeQuiet {
		if h.recheck == nil {
			h.recheck = h.after(storeQuiet-quiet, func() {
				h.mu.Lock()
				defer h.mu.Unlock()
				h.recheck = nil
				if h.down.Load() {
					h.endIfQuiet(h.now())
				}
			})
		}
		return
	}
	h.down.Store(false)
	h.stopRecheck()
	h.log.Info("store calls are served again", h.summary()...)
}

// stopRecheck stops a look at the outage that is due. h.mu is held.
func (h *storeHealth) stopRecheck() {
	if h.recheck != nil {
		h.recheck.Stop()
		h.recheck = nil
	}
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
	h.stopRecheck()
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
