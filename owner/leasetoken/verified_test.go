package leasetoken_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/tablease/tablease/owner/leasetoken"
)

// A token verified once is answered from memory while the parser would accept it, and with the
// parser's own answer outside that window.
func TestAVerifiedTokenIsRememberedWhileItIsAccepted(t *testing.T) {
	f := newFixture(t, leasetoken.SigningKey{}) // leeway 1 s
	ctx := context.Background()
	iat := t0.Add(2 * time.Second)
	tok := f.sign(t, claims(iat, 10*time.Second))
	f.clock.Set(iat)
	first, err := f.verifier.Verify(ctx, tok)
	if err != nil {
		t.Fatal(err)
	}
	if n := f.verifier.Remembered(); n != 1 {
		t.Fatalf("%d tokens remembered after one verification, want 1", n)
	}
	f.clock.Set(iat.Add(10*time.Second + 900*time.Millisecond)) // within exp's leeway
	if again, err := f.verifier.Verify(ctx, tok); err != nil || again != first {
		t.Fatalf("again: %+v, %v; want %+v", again, err, first)
	}

	// Before iat less the leeway (a clock set back): refused as the parser refuses it.
	f.clock.Set(iat.Add(-1001 * time.Millisecond))
	if _, err := f.verifier.Verify(ctx, tok); !errors.Is(err, leasetoken.ErrTokenInvalid) || !strings.Contains(err.Error(), "before issued") {
		t.Fatalf("before iat: %v, want the parser's ErrTokenInvalid", err)
	}
	f.clock.Set(iat.Add(-time.Second)) // iat less the leeway exactly: accepted
	if _, err := f.verifier.Verify(ctx, tok); err != nil {
		t.Fatalf("at iat less the leeway: %v", err)
	}

	// At exp plus the leeway: expired, with its claims, as the first time.
	f.clock.Set(iat.Add(11 * time.Second))
	got, err := f.verifier.Verify(ctx, tok)
	if !errors.Is(err, leasetoken.ErrTokenExpired) || got != first {
		t.Fatalf("at exp plus the leeway: %+v, %v; want the claims and ErrTokenExpired", got, err)
	}
	if n := f.verifier.Remembered(); n != 0 {
		t.Fatalf("%d tokens remembered after the token expired, want 0", n)
	}
}

// A refusal is never remembered: the same token is decided again every time.
func TestARefusedTokenIsNotRemembered(t *testing.T) {
	f := newFixture(t, leasetoken.SigningKey{})
	tok := f.sign(t, claims(t0, time.Minute))
	forged := tok[:len(tok)-2] + map[bool]string{true: "AA", false: "BA"}[!strings.HasSuffix(tok, "AA")]
	for range 2 {
		if _, err := f.verifier.Verify(context.Background(), forged); !errors.Is(err, leasetoken.ErrTokenInvalid) {
			t.Fatalf("a forged signature: %v", err)
		}
	}
	if n := f.verifier.Remembered(); n != 0 {
		t.Fatalf("%d tokens remembered after refusals, want 0", n)
	}
}

// mutableKeys is a KeySource whose keys change, as a JWKS does.
type mutableKeys struct {
	mu   sync.Mutex
	keys leasetoken.PublicKeys
}

func (m *mutableKeys) set(keys ...leasetoken.PublicKey) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.keys = keys
}

func (m *mutableKeys) LookupKey(ctx context.Context, kid string) (leasetoken.PublicKey, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.keys.LookupKey(ctx, kid)
}

// A remembered token whose key is withdrawn is refused as before, and one whose kid comes to name
// another key is verified again with that key.
func TestARememberedTokenFollowsItsKey(t *testing.T) {
	f := newFixture(t, leasetoken.SigningKey{})
	ctx := context.Background()
	src := &mutableKeys{}
	src.set(f.key.Public())
	v, err := leasetoken.NewVerifier(src, leasetoken.VerifierOptions{Issuer: issuer, Now: f.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	tok := f.sign(t, claims(t0, time.Minute))
	if _, err := v.Verify(ctx, tok); err != nil {
		t.Fatal(err)
	}
	src.set()
	if _, err := v.Verify(ctx, tok); !errors.Is(err, leasetoken.ErrUnknownKey) {
		t.Fatalf("after its key was withdrawn: %v, want ErrUnknownKey", err)
	}
	src.set(f.key.Public())
	if _, err := v.Verify(ctx, tok); err != nil {
		t.Fatalf("with its key back: %v", err)
	}
	other, err := leasetoken.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	src.set(renamed(t, other.Public(), f.key.KeyID()))
	if _, err := v.Verify(ctx, tok); !errors.Is(err, leasetoken.ErrTokenInvalid) {
		t.Fatalf("its kid naming another key: %v, want ErrTokenInvalid", err)
	}
}

// renamed is k under the key id kid, as a JWKS that names keys otherwise would publish it.
func renamed(t *testing.T, k leasetoken.PublicKey, kid string) leasetoken.PublicKey {
	t.Helper()
	jwks := strings.Replace(string(leasetoken.EncodeJWKS([]leasetoken.PublicKey{k})), k.KeyID(), kid, 1)
	keys, err := leasetoken.ParseJWKS([]byte(jwks))
	if err != nil || len(keys) != 1 {
		t.Fatalf("ParseJWKS: %v, %d keys", err, len(keys))
	}
	return keys[0]
}

// A token longer than the bound of the tokens remembered is verified every time.
func TestALongTokenIsNotRemembered(t *testing.T) {
	f := newFixture(t, leasetoken.SigningKey{})
	tok := jwt.NewWithClaims(jwt.SigningMethodEdDSA, jwt.MapClaims{"iss": issuer, "sub": "u", "sid": "s",
		"tab": "t", "epoch": 1, "iat": t0.Unix(), "exp": t0.Add(time.Minute).Unix(), "note": strings.Repeat("x", 2048)})
	tok.Header["kid"], tok.Header["typ"] = f.key.KeyID(), leasetoken.TokenType
	s, err := tok.SignedString(mustPriv(t, f.key))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.verifier.Verify(context.Background(), s); err != nil {
		t.Fatalf("a long token: %v", err)
	}
	if n := f.verifier.Remembered(); n != 0 {
		t.Fatalf("a token of %d bytes is remembered", len(s))
	}
}
