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
type NonceStore interface {
	// UseNonce records nonce as used for ttl, in one atomic step of the store, and reports whether
	// it was fresh: true for the first use, false while an earlier use is remembered. Of many
	// concurrent uses of one nonce, exactly one is fresh. After ttl (by the store's clock) the
	// nonce is forgotten.
	//
	// Errors: *lease.InvalidError when nonce is not an identifier (see lease.ValidateID) or ttl is
	// not in [1ms, lease.MaxNonceTTL]; *lease.UnavailableError for store trouble, which never
	// answers fresh.
	UseNonce(ctx context.Context, nonce string, ttl time.Duration) (fresh bool, err error)
}

// NonceFactory makes a NonceStore on a store of its own that starts empty. Closing whatever it
// opened is the factory's job (t.Cleanup).
type NonceFactory func(t *testing.T) NonceStore

// RunNonces is the conformance suite of NonceStore. Engines run it from their tests:
//
//	func TestNonces(t *testing.T) {
//		leasetest.RunNonces(t, func(t *testing.T) leasetest.NonceStore { … })
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
	run  func(t *testing.T, s NonceStore)
}{
	{"a nonce is fresh once and used afterwards", testNonceOnce},
	{"nonces are independent of each other", testNonceIndependent},
	{"of 32 concurrent uses of a nonce exactly one is fresh", testNonceRace},
	{"a nonce is forgotten after its ttl and not before", testNonceForgotten},
	{"bad nonces and ttls are refused and record nothing", testNonceInvalid},
}

func useNonce(t *testing.T, s NonceStore, nonce string, ttl time.Duration) bool {
	t.Helper()
	fresh, err := s.UseNonce(t.Context(), nonce, ttl)
	if err != nil {
		t.Fatalf("UseNonce(%q, %v): %v", nonce, ttl, err)
	}
	return fresh
}

func testNonceOnce(t *testing.T, s NonceStore) {
	if !useNonce(t, s, "n-1", time.Minute) {
		t.Fatal("the first use of a nonce is not fresh")
	}
	for i := range 3 {
		if useNonce(t, s, "n-1", time.Minute) {
			t.Fatalf("use %d of a used nonce is fresh", i+2)
		}
	}
}

func testNonceIndependent(t *testing.T, s NonceStore) {
	for _, n := range []string{"a", "b", "A", "a.b", "a:b|c@d_e-f"} {
		if !useNonce(t, s, n, time.Minute) {
			t.Fatalf("nonce %q is not fresh though only other nonces were used", n)
		}
	}
}

func testNonceRace(t *testing.T, s NonceStore) {
	var fresh atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 32 {
		wg.Go(func() {
			<-start
			ok, err := s.UseNonce(t.Context(), "raced", time.Minute)
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

func testNonceForgotten(t *testing.T, s NonceStore) {
	const ttl = 50 * time.Millisecond
	if !useNonce(t, s, "short", ttl) || !useNonce(t, s, "long", time.Minute) {
		t.Fatal("first uses are not fresh")
	}
	if useNonce(t, s, "short", ttl) {
		t.Fatal("a nonce was forgotten at once")
	}
	deadline := time.Now().Add(waitFor)
	for !useNonce(t, s, "short", ttl) {
		if time.Now().After(deadline) {
			t.Fatalf("a nonce with a ttl of %v was still remembered after %v", ttl, waitFor)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if useNonce(t, s, "long", time.Minute) {
		t.Fatal("a nonce with a long ttl was forgotten with a short one")
	}
}

func testNonceInvalid(t *testing.T, s NonceStore) {
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
	if !useNonce(t, s, "ok", time.Minute) {
		t.Fatal("a refused call recorded its nonce")
	}
}
