package leasemem

import (
	"testing"
	"time"

	"github.com/tablease/tablease/lease/leasetest"
)

func TestNonces(t *testing.T) {
	leasetest.RunNonces(t, func(t *testing.T) leasetest.NonceTarget {
		// Memory loses its data when the process restarts: a new store.
		return leasetest.NonceTarget{
			Store:    NewNonceStore(nil),
			LoseData: func(t *testing.T) leasetest.NonceStore { return NewNonceStore(nil) },
		}
	})
}

func TestNonceStoreForgetsOnItsOwnClockAndKeepsMemoryBounded(t *testing.T) {
	clock := &fakeClock{now: time.Date(2026, 12, 2, 13, 0, 0, 0, time.UTC)}
	s := NewNonceStore(clock.Now)
	ctx := t.Context()
	nonces := make([]string, 5000)
	for i := range nonces {
		nonces[i], _ = s.NewNonce(ctx)
		if fresh, err := s.UseNonce(ctx, nonces[i], 30*time.Second); err != nil || !fresh {
			t.Fatalf("use %d: %v, %v", i, fresh, err)
		}
	}
	clock.Advance(30*time.Second - time.Microsecond)
	if fresh, _ := s.UseNonce(ctx, nonces[0], 30*time.Second); fresh {
		t.Fatal("a nonce was forgotten before its ttl on the store's clock")
	}
	clock.Advance(time.Microsecond)
	if fresh, _ := s.UseNonce(ctx, nonces[1], 30*time.Second); !fresh {
		t.Fatal("a nonce was remembered after its ttl on the store's clock")
	}
	// A refused use does not extend a nonce: n-0 is gone with the others, and only n-1, used
	// again, is remembered.
	if n := s.size(); n != 1 {
		t.Fatalf("%d nonces remembered after their ttl, want only the one just used", n)
	}
}
