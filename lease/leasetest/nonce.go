package leasetest

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tablease/tablease/lease"
)

// NonceStore remembers single-use values for a while, so that a credential carrying a nonce (the
// event ticket of an EventSource, api/stream) is accepted once across every instance that shares
// the store. The Redis engine is one; leasemem.NonceStore is one for a single instance.
//
// A store hands out the nonces it accepts: each carries the store's generation, which changes when
// the store loses its data (a Redis restart without persistence, FLUSHALL, a new process for the
// memory store), and a nonce of another generation is never fresh. So a credential used before
// the loss, which the store no longer remembers, is not accepted again after it: the loss makes
// every nonce handed out before it used, as the epoch floor makes every epoch before it old.
type NonceStore interface {
	// NewNonce answers a new nonce of the store's current generation: an identifier (see
	// lease.ValidateID) that no other call answers. Errors: *lease.UnavailableError for store
	// trouble.
	NewNonce(ctx context.Context) (string, error)
	// UseNonce records nonce as used for ttl, in one atomic step of the store, and reports whether
	// it was fresh: true for the first use of a nonce of the store's current generation (as NewNonce
	// makes them), false while an earlier use is remembered, and false for a nonce of another
	// generation or of none (the store need not tell the nonces it answered from others that carry
	// its generation: the credentials that carry nonces are signed by their issuer). Of many
	// concurrent uses of one nonce, exactly one is fresh. After ttl (by the store's clock) the
	// nonce is forgotten.
	//
	// Errors: *lease.InvalidError when nonce is not an identifier (see lease.ValidateID) or ttl is
	// not in [1ms, lease.MaxNonceTTL]; *lease.UnavailableError for store trouble, which never
	// answers fresh.
	UseNonce(ctx context.Context, nonce string, ttl time.Duration) (fresh bool, err error)
}

// NonceTarget is one NonceStore under test, on a store of its own that starts empty.
type NonceTarget struct {
	Store NonceStore
	// LoseData makes the store lose its data, as a Redis restart without persistence or a new
	// process would, and returns the store to use afterwards (the same one for Redis after
	// FLUSHALL, a new one for memory).
	LoseData func(t *testing.T) NonceStore
}

// NonceFactory makes a NonceTarget. Closing whatever it opened is the factory's job (t.Cleanup).
type NonceFactory func(t *testing.T) NonceTarget

// RunNonces is the conformance suite of NonceStore. Engines run it from their tests:
//
//	func TestNonces(t *testing.T) {
//		leasetest.RunNonces(t, func(t *testing.T) leasetest.NonceTarget { … })
//	}
//
// It runs in real time: the forgetting test waits, polling with a deadline, for a TTL of 50 ms.
func RunNonces(t *testing.T, newStore NonceFactory) {
	for _, tc := range nonceTests {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, newStore(t)) })
	}
}

var nonceTests = []struct {
	name string
	run  func(t *testing.T, s NonceTarget)
}{
	{"a nonce is fresh once and used afterwards", testNonceOnce},
	{"nonces are independent of each other", testNonceIndependent},
	{"of 32 concurrent uses of a nonce exactly one is fresh", testNonceRace},
	{"a nonce is forgotten after its ttl and not before", testNonceForgotten},
	{"a nonce of another generation or of none is never fresh", testNonceForeign},
	{"a nonce used before the store lost its data is not fresh again", testNonceLoss},
	{"bad nonces and ttls are refused and record nothing", testNonceInvalid},
}

func newNonce(t *testing.T, s NonceStore) string {
	t.Helper()
	n, err := s.NewNonce(t.Context())
	if err != nil {
		t.Fatalf("NewNonce: %v", err)
	}
	if err := lease.ValidateID("nonce", n); err != nil {
		t.Fatalf("NewNonce answered %q, not an identifier: %v", n, err)
	}
	return n
}

func useNonce(t *testing.T, s NonceStore, nonce string, ttl time.Duration) bool {
	t.Helper()
	fresh, err := s.UseNonce(t.Context(), nonce, ttl)
	if err != nil {
		t.Fatalf("UseNonce(%q, %v): %v", nonce, ttl, err)
	}
	return fresh
}

func testNonceOnce(t *testing.T, target NonceTarget) {
	s := target.Store
	n := newNonce(t, s)
	if !useNonce(t, s, n, time.Minute) {
		t.Fatal("the first use of a nonce is not fresh")
	}
	for i := range 3 {
		if useNonce(t, s, n, time.Minute) {
			t.Fatalf("use %d of a used nonce is fresh", i+2)
		}
	}
}

func testNonceIndependent(t *testing.T, target NonceTarget) {
	s := target.Store
	seen := map[string]bool{}
	var nonces []string
	for range 5 {
		n := newNonce(t, s)
		if seen[n] {
			t.Fatalf("NewNonce answered %q twice", n)
		}
		seen[n] = true
		nonces = append(nonces, n)
	}
	for _, n := range nonces {
		if !useNonce(t, s, n, time.Minute) {
			t.Fatalf("nonce %q is not fresh though only other nonces were used", n)
		}
	}
}

func testNonceRace(t *testing.T, target NonceTarget) {
	s := target.Store
	n := newNonce(t, s)
	var fresh atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 32 {
		wg.Go(func() {
			<-start
			ok, err := s.UseNonce(t.Context(), n, time.Minute)
			if err != nil {
				t.Errorf("UseNonce: %v", err)
			}
			if ok {
				fresh.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	if n := fresh.Load(); n != 1 {
		t.Fatalf("%d of 32 concurrent uses were fresh, want exactly 1", n)
	}
}

func testNonceForgotten(t *testing.T, target NonceTarget) {
	s := target.Store
	const ttl = 50 * time.Millisecond
	short, long := newNonce(t, s), newNonce(t, s)
	if !useNonce(t, s, short, ttl) || !useNonce(t, s, long, time.Minute) {
		t.Fatal("first uses are not fresh")
	}
	if useNonce(t, s, short, ttl) {
		t.Fatal("a nonce was forgotten at once")
	}
	deadline := time.Now().Add(waitFor)
	for !useNonce(t, s, short, ttl) {
		if time.Now().After(deadline) {
			t.Fatalf("a nonce with a ttl of %v was still remembered after %v", ttl, waitFor)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if useNonce(t, s, long, time.Minute) {
		t.Fatal("a nonce with a long ttl was forgotten with a short one")
	}
}

func testNonceForeign(t *testing.T, target NonceTarget) {
	s := target.Store
	n := newNonce(t, s)
	gen, _, _ := strings.Cut(n, ".")
	for _, foreign := range []string{"n-1", "a", gen, "x" + n, gen[1:] + "." + gen} {
		if useNonce(t, s, foreign, time.Minute) {
			t.Errorf("UseNonce(%q), a nonce not of the store's generation, is fresh", foreign)
		}
	}
	if !useNonce(t, s, n, time.Minute) {
		t.Fatal("a nonce the store handed out is not fresh")
	}
}

func testNonceLoss(t *testing.T, target NonceTarget) {
	if target.LoseData == nil {
		t.Fatal("the NonceTarget has no LoseData")
	}
	s := target.Store
	used, unused := newNonce(t, s), newNonce(t, s)
	if !useNonce(t, s, used, time.Minute) {
		t.Fatal("the first use is not fresh")
	}
	s = target.LoseData(t)
	if useNonce(t, s, used, time.Minute) {
		t.Fatal("a nonce used before the store lost its data is fresh again")
	}
	if useNonce(t, s, unused, time.Minute) {
		t.Fatal("a nonce handed out before the store lost its data is fresh")
	}
	n := newNonce(t, s)
	if n == used || n == unused {
		t.Fatalf("NewNonce after the loss answered %q again", n)
	}
	if !useNonce(t, s, n, time.Minute) || useNonce(t, s, n, time.Minute) {
		t.Fatal("a nonce handed out after the loss is not fresh once, then used")
	}
}

func testNonceInvalid(t *testing.T, target NonceTarget) {
	s := target.Store
	cases := []struct {
		nonce string
		ttl   time.Duration
	}{
		{"", time.Minute},
		{"has space", time.Minute},
		{"{tag}", time.Minute},
		{"..", time.Minute},
		{strings.Repeat("n", lease.MaxIDLen+1), time.Minute},
		{"ok", 0},
		{"ok", time.Millisecond - 1},
		{"ok", -time.Second},
		{"ok", lease.MaxNonceTTL + time.Millisecond},
	}
	for _, tc := range cases {
		fresh, err := s.UseNonce(t.Context(), tc.nonce, tc.ttl)
		var ie *lease.InvalidError
		if fresh || !errors.As(err, &ie) || !errors.Is(err, lease.ErrInvalid) {
			t.Errorf("UseNonce(%.20q, %v) = %v, %v; want an *InvalidError", tc.nonce, tc.ttl, fresh, err)
		}
	}
	ok := newNonce(t, s)
	if fresh, err := s.UseNonce(t.Context(), ok, 0); fresh || !errors.Is(err, lease.ErrInvalid) {
		t.Fatalf("UseNonce with a ttl of 0 = %v, %v; want an *InvalidError", fresh, err)
	}
	if !useNonce(t, s, ok, time.Minute) {
		t.Fatal("a refused call recorded its nonce")
	}
}
