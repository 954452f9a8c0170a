package leasetoken

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/tablease/tablease/lease"
)

// countingSigner signs with a counter, so that a test sees which answers are new signatures.
type countingSigner struct{ n int }

func (s *countingSigner) sign(c Claims) (string, error) {
	s.n++
	return c.Tab + "/" + strconv.FormatInt(c.Epoch, 10) + "/" + strconv.Itoa(s.n), nil
}

func heldLease(user, sid, tab string, epoch int64, now time.Time, ttl time.Duration) lease.Lease {
	return lease.Lease{Key: lease.Key{User: user, Session: sid}, Held: true, Holder: lease.Holder{TabID: tab},
		Epoch: epoch, Now: now, ExpiresAt: now.Add(ttl), TTL: ttl}
}

func TestATokenIsReusedUntilHalfItsLife(t *testing.T) {
	r, s := NewReuse(0), &countingSigner{}
	t0 := time.Unix(1_700_000_000, 0)
	const ttl = 30 * time.Second
	first, err := r.Token(heldLease("alice", "doc", "a", 7, t0, ttl), s.sign)
	if err != nil {
		t.Fatal(err)
	}
	// Renews before the half-life extend the lease and get the same token back.
	for _, at := range []time.Duration{time.Second, 10 * time.Second, 15*time.Second - time.Microsecond} {
		got, _ := r.Token(heldLease("alice", "doc", "a", 7, t0.Add(at), ttl), s.sign)
		if got != first {
			t.Fatalf("renew at +%v: a new token %q, want %q reused", at, got, first)
		}
	}
	if s.n != 1 {
		t.Fatalf("%d signatures for one half-life, want 1", s.n)
	}
	// At the half-life a new token, expiring with the renewed lease; then that one is reused.
	second, _ := r.Token(heldLease("alice", "doc", "a", 7, t0.Add(15*time.Second), ttl), s.sign)
	if second == first || s.n != 2 {
		t.Fatalf("at the half-life: %q after %d signatures, want a new token", second, s.n)
	}
	if got, _ := r.Token(heldLease("alice", "doc", "a", 7, t0.Add(16*time.Second), ttl), s.sign); got != second {
		t.Fatalf("after the new token: %q, want it reused", got)
	}
}

func TestTheHalfLifeIsCountedInTheWholeSecondsATokenCarries(t *testing.T) {
	r, s := NewReuse(0), &countingSigner{}
	// Signed at …000.9 s for 3 s: the token says iat …000 and exp …003, so its half-life ends at
	// …001.5, not at …002.4 as the lease's own times would have it.
	t0 := time.Unix(1_700_000_000, 900_000_000)
	const ttl = 3 * time.Second
	first, _ := r.Token(heldLease("alice", "doc", "a", 7, t0, ttl), s.sign)
	if got, _ := r.Token(heldLease("alice", "doc", "a", 7, t0.Add(500*time.Millisecond), ttl), s.sign); got != first {
		t.Fatalf("at …001.4: a new token, want the first reused")
	}
	if got, _ := r.Token(heldLease("alice", "doc", "a", 7, t0.Add(700*time.Millisecond), ttl), s.sign); got == first || s.n != 2 {
		t.Fatalf("at …001.6, past the half-life of the token's claims: the first token reused (%d signatures)", s.n)
	}
}

func TestATokenIsNeverReusedForAnotherHolderOrALeaseItWouldOutlive(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	const ttl = 30 * time.Second
	for _, tc := range []struct {
		name string
		next lease.Lease
	}{
		{"another epoch", heldLease("alice", "doc", "a", 8, t0.Add(time.Second), ttl)},
		{"another tab", heldLease("alice", "doc", "b", 7, t0.Add(time.Second), ttl)},
		{"another session", heldLease("alice", "doc2", "a", 7, t0.Add(time.Second), ttl)},
		{"another user", heldLease("bob", "doc", "a", 7, t0.Add(time.Second), ttl)},
		{"a lease renewed shorter than the token", heldLease("alice", "doc", "a", 7, t0.Add(time.Second), 5*time.Second)},
		{"a store clock that went back", heldLease("alice", "doc", "a", 7, t0.Add(-time.Second), ttl)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, s := NewReuse(0), &countingSigner{}
			first, _ := r.Token(heldLease("alice", "doc", "a", 7, t0, ttl), s.sign)
			got, err := r.Token(tc.next, s.sign)
			if err != nil || got == first || s.n != 2 {
				t.Fatalf("got %q (%v) after %d signatures, want a new token", got, err, s.n)
			}
		})
	}
}

// A renew that lengthens the lease (a tab that goes hidden asks for a longer TTL) gets a token
// that outlives the holder's next renew, not the old one, which would expire long before it.
func TestARenewThatLengthensTheLeaseGetsATokenThatOutlivesItsNextRenew(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	for _, tc := range []struct {
		name        string
		first, then time.Duration // the TTLs of the grant and of the renew
		at          time.Duration // when the renew comes, within the first token's half-life
	}{
		{"hidden: 45 s, then 150 s", 45 * time.Second, 150 * time.Second, 20 * time.Second},
		{"3 s, then 45 s", 3 * time.Second, 45 * time.Second, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, s := NewReuse(0), &countingSigner{}
			first, _ := r.Token(heldLease("alice", "doc", "a", 7, t0, tc.first), s.sign)
			l := heldLease("alice", "doc", "a", 7, t0.Add(tc.at), tc.then)
			got, _ := r.Token(l, s.sign)
			if got == first || s.n != 2 {
				t.Fatalf("the first token answered (%d signatures): it expires %v before the next renew is due",
					s.n, t0.Add(tc.at).Add(lease.RenewAfter(tc.then)).Sub(t0.Add(tc.first)))
			}
		})
	}
}

func TestReuseRemembersAtMostMaxTokens(t *testing.T) {
	r, s := NewReuse(3), &countingSigner{}
	t0 := time.Unix(1_700_000_000, 0)
	for i := range 10 {
		if _, err := r.Token(heldLease("u", "doc-"+strconv.Itoa(i), "a", 1, t0, time.Minute), s.sign); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(r.tokens); n != 3 {
		t.Fatalf("remembers %d tokens, want at most 3", n)
	}
}

func TestReuseForgetsTheTokensPastTheirHalfLife(t *testing.T) {
	r, s := NewReuse(0), &countingSigner{}
	t0 := time.Unix(1_700_000_000, 0)
	const ttl = 30 * time.Second // tokens of 30 s: past their half-life 15 s after they were signed
	for i := range 1000 {        // leases granted once and never renewed (released, lapsed, taken over)
		if _, err := r.Token(heldLease("u", "doc-"+strconv.Itoa(i), "a", 1, t0, ttl), s.sign); err != nil {
			t.Fatal(err)
		}
	}
	// A renew a little later keeps them all: none is past its half-life yet.
	renewed := heldLease("u", "doc-0", "a", 1, t0.Add(10*time.Second), ttl)
	if _, err := r.Token(renewed, s.sign); err != nil {
		t.Fatal(err)
	}
	if n := len(r.tokens); n != 1000 {
		t.Fatalf("remembers %d tokens 10 s on, want the 1,000 still in their first half", n)
	}
	// A grant a minute later forgets every token past its half-life, and keeps its own.
	if _, err := r.Token(heldLease("u", "new", "b", 1, t0.Add(reusePrune+time.Second), ttl), s.sign); err != nil {
		t.Fatal(err)
	}
	if n := len(r.tokens); n != 1 {
		t.Fatalf("remembers %d tokens a minute on, want only the new one", n)
	}
}

func TestASigningFailureIsReturnedAndNotRemembered(t *testing.T) {
	r := NewReuse(0)
	l := heldLease("alice", "doc", "a", 1, time.Unix(1_700_000_000, 0), time.Minute)
	boom := errors.New("no key")
	if _, err := r.Token(l, func(Claims) (string, error) { return "", boom }); !errors.Is(err, boom) {
		t.Fatalf("got %v, want the signer's error", err)
	}
	if len(r.tokens) != 0 {
		t.Fatal("a failed signature was remembered")
	}
}
