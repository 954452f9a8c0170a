package leasetoken_test

import (
	"context"
	"testing"
	"time"

	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/owner/leasetoken"
)

// Benchmarks of a lease token's life: signing (Ed25519, once per half-life per holder), the
// renew that reuses it, and a guard's verification (of a token seen for the first time, and
// again).
//
//	go test -run XXX -bench . -count 10 ./owner/leasetoken/ | benchstat -

func benchFixture(b *testing.B) (*leasetoken.Signer, *leasetoken.Verifier) {
	b.Helper()
	key, err := leasetoken.GenerateKey()
	if err != nil {
		b.Fatal(err)
	}
	now := func() time.Time { return t0 }
	keys, err := leasetoken.NewKeySet(key, leasetoken.KeySetOptions{Now: now})
	if err != nil {
		b.Fatal(err)
	}
	signer, err := leasetoken.NewSigner(keys, issuer)
	if err != nil {
		b.Fatal(err)
	}
	verifier, err := leasetoken.NewVerifier(keys, leasetoken.VerifierOptions{Issuer: issuer, Now: now})
	if err != nil {
		b.Fatal(err)
	}
	return signer, verifier
}

func BenchmarkSign(b *testing.B) {
	signer, _ := benchFixture(b)
	c := claims(t0, time.Minute)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := signer.Sign(c); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReuseOnRenew is what a renew costs in tokens once the holder has one: the lease moves
// on, the token is answered again until its half-life.
func BenchmarkReuseOnRenew(b *testing.B) {
	signer, _ := benchFixture(b)
	r := leasetoken.NewReuse(0)
	l := lease.Lease{Key: lease.Key{User: "user-1", Session: "doc-42"}, Held: true, Holder: lease.Holder{TabID: "t-9f2c"},
		Epoch: 1764680400123456, GrantedAt: t0, ExpiresAt: t0.Add(time.Minute), TTL: time.Minute, Now: t0}
	if _, err := r.Token(l, signer.Sign); err != nil {
		b.Fatal(err)
	}
	l.Now = t0.Add(time.Second)
	l.ExpiresAt = l.Now.Add(time.Minute)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Token(l, signer.Sign); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerify(b *testing.B) {
	signer, verifier := benchFixture(b)
	tok, err := signer.Sign(claims(t0, time.Minute))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	for _, again := range []bool{false, true} {
		name := map[bool]string{false: "first", true: "again"}[again]
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if !again {
					verifier.ForgetVerified()
				}
				if _, err := verifier.Verify(ctx, tok); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
