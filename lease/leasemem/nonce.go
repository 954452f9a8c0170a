package leasemem

import (
	"container/heap"
	"context"
	"crypto/rand"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tablease/tablease/lease"
)

// NonceStore is the in-memory nonce store (leasetest.NonceStore), for one tablease instance (a store of its own beside
// the Engine, like DocumentStore: nonces used through one process are known to that process
// only). Each call is one critical section under mu that reads the injected clock, forgets the
// nonces that expired, and records the new one, so of concurrent uses of a nonce exactly one is
// fresh. Memory is bounded by the nonces used within their TTL. Its generation is random, made by
// NewNonceStore: a new process, which remembers none of the nonces used before, accepts none of
// them. Use NewNonceStore; the zero value is not usable.
type NonceStore struct {
	now func() time.Time // immutable after NewNonceStore
	gen string           // the generation, the prefix of every nonce NewNonce answers; immutable

	mu      sync.Mutex           // protects used and expiry
	used    map[string]time.Time // nonce → when it is forgotten
	expiry  nonceHeap            // the same nonces, soonest forgotten first
	maxSize int                  // the largest len(used) since the map was allocated
}

// NewNonceStore returns an empty store whose clock is now (default time.Now).
func NewNonceStore(now func() time.Time) *NonceStore {
	if now == nil {
		now = time.Now
	}
	return &NonceStore{now: now, gen: rand.Text(), used: make(map[string]time.Time)}
}

// NewNonce answers a new nonce of the store's generation (see leasetest.NonceStore).
func (s *NonceStore) NewNonce(ctx context.Context) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", &lease.UnavailableError{Op: "new nonce", Err: err}
	}
	return s.gen + "." + rand.Text(), nil
}

// UseNonce records nonce as used for ttl, and reports whether it was fresh (see
// leasetest.NonceStore).
func (s *NonceStore) UseNonce(ctx context.Context, nonce string, ttl time.Duration) (bool, error) {
	if err := lease.ValidateNonce(nonce, ttl); err != nil {
		return false, err
	}
	if err := ctx.Err(); err != nil {
		return false, &lease.UnavailableError{Op: "use nonce", Err: err}
	}
	if gen, _, ok := strings.Cut(nonce, "."); !ok || gen != s.gen {
		return false, nil // not handed out by this store
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	s.forget(now)
	if _, ok := s.used[nonce]; ok {
		return false, nil
	}
	until := now.Add(ttl)
	s.used[nonce] = until
	heap.Push(&s.expiry, nonceEntry{nonce: nonce, until: until})
	s.maxSize = max(s.maxSize, len(s.used))
	return true, nil
}

// forget drops the nonces whose time is up at now. s.mu must be held.
func (s *NonceStore) forget(now time.Time) {
	for len(s.expiry) > 0 && !s.expiry[0].until.After(now) {
		e := heap.Pop(&s.expiry).(nonceEntry)
		delete(s.used, e.nonce)
	}
	// Go maps never give back their buckets: reallocate once a burst has passed.
	if s.maxSize > 1024 && len(s.used) < s.maxSize/4 {
		fresh := make(map[string]time.Time, len(s.used))
		for k, v := range s.used {
			fresh[k] = v
		}
		s.used, s.maxSize = fresh, len(fresh)
		s.expiry = slices.Clone(s.expiry)
	}
}

type nonceEntry struct {
	nonce string
	until time.Time
}

// nonceHeap is a min-heap of nonces by the time they are forgotten.
type nonceHeap []nonceEntry

func (h nonceHeap) Len() int           { return len(h) }
func (h nonceHeap) Less(i, j int) bool { return h[i].until.Before(h[j].until) }
func (h nonceHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *nonceHeap) Push(x any)        { *h = append(*h, x.(nonceEntry)) }
func (h *nonceHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nonceEntry{}
	*h = old[:len(old)-1]
	return e
}
