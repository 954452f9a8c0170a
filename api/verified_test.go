package api

import (
	"context"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

func TestAVerifiedTokenIsRememberedUntilItExpires(t *testing.T) {
	cfg := AuthConfig{HS256Secret: []byte("0123456789abcdef0123456789abcdef"), Issuer: "iss", Audience: "aud", Leeway: 2 * time.Second}
	a, err := newAuthenticator(cfg, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now().Truncate(time.Second)
	now := t0
	a.now = func() time.Time { return now }
	token := sign(t, jwt.SigningMethodHS256, cfg.HS256Secret, "", jwt.MapClaims{
		"iss": "iss", "aud": "aud", "sub": "alice", "scope": "lease:read",
		"iat": t0.Add(-time.Minute).Unix(), "exp": t0.Add(10 * time.Second).Unix(),
	})

	if _, err := a.verify(context.Background(), "x"+token[1:]); err == nil {
		t.Fatal("a tampered token was accepted")
	}
	if n := a.verified.Len(); n != 0 {
		t.Fatalf("a refused token was remembered: %d tokens", n)
	}
	first, err := a.verify(context.Background(), token)
	if err != nil || first.Sub != "alice" || !first.HasScope("lease:read") {
		t.Fatalf("verify = %+v, %v", first, err)
	}
	if n := a.verified.Len(); n != 1 {
		t.Fatalf("%d tokens remembered after one verified, want 1", n)
	}
	now = t0.Add(11 * time.Second) // past exp, within the leeway
	if p, err := a.verify(context.Background(), token); err != nil || p != first {
		t.Fatalf("within the leeway: %+v, %v; want the remembered principal", p, err)
	}
	now = t0.Add(12 * time.Second) // exp plus the leeway: the parser refuses it, and so must the memory
	if _, err := a.verify(context.Background(), token); err == nil {
		t.Fatal("a remembered token was accepted after its exp plus the leeway")
	}
	if n := a.verified.Len(); n != 0 {
		t.Fatalf("an expired token is still remembered: %d tokens", n)
	}
}
