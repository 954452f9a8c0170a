package leasetoken_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tablease/tablease/owner/leasetoken"
)

func TestJWKSHasOnlyPublicParts(t *testing.T) {
	f := newFixture(t, leasetoken.SigningKey{})
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	es, _ := leasetoken.NewSigningKey(ec)
	if err := f.keys.Rotate(es, f.clock.Now()); err != nil {
		t.Fatal(err)
	}
	raw := f.keys.JWKS()
	var set struct{ Keys []map[string]any }
	if err := json.Unmarshal(raw, &set); err != nil {
		t.Fatal(err)
	}
	if len(set.Keys) != 2 {
		t.Fatalf("JWKS has %d keys: %s", len(set.Keys), raw)
	}
	for _, k := range set.Keys {
		for _, private := range []string{"d", "p", "q", "dp", "dq", "qi", "k"} {
			if _, ok := k[private]; ok {
				t.Fatalf("JWKS has a private member %q: %s", private, raw)
			}
		}
		if k["use"] != "sig" || k["kid"] == "" {
			t.Fatalf("key %v", k)
		}
	}
	okp, ec2 := set.Keys[1], set.Keys[0]
	if okp["kty"] != "OKP" || okp["crv"] != "Ed25519" || okp["alg"] != "EdDSA" || okp["kid"] != f.key.KeyID() {
		t.Fatalf("OKP key %v", okp)
	}
	if ec2["kty"] != "EC" || ec2["crv"] != "P-256" || ec2["alg"] != "ES256" || len(ec2["x"].(string)) != 43 || len(ec2["y"].(string)) != 43 {
		t.Fatalf("EC key %v", ec2)
	}
	// What the JWKS publishes is what a guard parses.
	keys, err := leasetoken.ParseJWKS(raw)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 || keys[0].KeyID() != es.KeyID() || keys[1].KeyID() != f.key.KeyID() {
		t.Fatalf("ParseJWKS = %v", keys)
	}
}

func TestParseJWKS(t *testing.T) {
	key, _ := leasetoken.GenerateKey()
	good, _ := json.Marshal(key.Public())
	tests := []struct {
		name    string
		doc     string
		keys    int
		wantErr bool
	}{
		{"one key", `{"keys":[` + string(good) + `]}`, 1, false},
		{"an RSA key is skipped", `{"keys":[{"kty":"RSA","n":"AQAB","e":"AQAB","kid":"r"},` + string(good) + `]}`, 1, false},
		{"an encryption key is skipped", `{"keys":[` + strings.Replace(string(good), `"use":"sig"`, `"use":"enc"`, 1) + `]}`, 0, false},
		{"a key with a foreign alg is skipped", `{"keys":[` + strings.Replace(string(good), `"alg":"EdDSA"`, `"alg":"HS256"`, 1) + `]}`, 0, false},
		{"a key without kid is skipped", `{"keys":[` + strings.Replace(string(good), `"kid":"`+key.KeyID()+`"`, `"kid":""`, 1) + `]}`, 0, false},
		{"a key twice is kept once", `{"keys":[` + string(good) + `,` + string(good) + `]}`, 1, false},
		{"a short x", `{"keys":[{"kty":"OKP","crv":"Ed25519","x":"AAAA","kid":"k"}]}`, 0, true},
		{"an EC point off the curve", `{"keys":[{"kty":"EC","crv":"P-256","x":"` + strings.Repeat("A", 43) + `","y":"` + strings.Repeat("A", 43) + `","kid":"k"}]}`, 0, true},
		{"no keys array", `{}`, 0, true},
		{"not JSON", `<html>`, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			keys, err := leasetoken.ParseJWKS([]byte(tt.doc))
			if (err != nil) != tt.wantErr || len(keys) != tt.keys {
				t.Fatalf("ParseJWKS = %d keys, %v", len(keys), err)
			}
		})
	}
}

func TestRotation(t *testing.T) {
	f := newFixture(t, leasetoken.SigningKey{}) // RetireAfter 5 min
	ctx := context.Background()
	old := f.sign(t, claims(t0, time.Hour)) // a long token, so that only retirement can refuse it

	next, _ := leasetoken.GenerateKey()
	rotatedAt := t0.Add(time.Minute)
	f.clock.Set(rotatedAt)
	if err := f.keys.Rotate(next, rotatedAt); err != nil {
		t.Fatal(err)
	}
	fresh := f.sign(t, claims(rotatedAt, time.Minute))
	if h, _ := decodeParts(t, fresh); h["kid"] != next.KeyID() {
		t.Fatalf("after rotation the signer still signs with %v", h["kid"])
	}
	for _, tok := range []string{old, fresh} {
		if _, err := f.verifier.Verify(ctx, tok); err != nil {
			t.Fatalf("right after rotation: %v", err)
		}
	}
	if kids := kidsOf(t, f.keys.JWKS()); kids != next.KeyID()+","+f.key.KeyID() {
		t.Fatalf("JWKS after rotation: %s", kids)
	}

	f.clock.Set(rotatedAt.Add(5*time.Minute - time.Millisecond))
	if _, err := f.verifier.Verify(ctx, old); err != nil {
		t.Fatalf("just before retirement: %v", err)
	}
	f.clock.Set(rotatedAt.Add(5 * time.Minute))
	if _, err := f.verifier.Verify(ctx, old); !errors.Is(err, leasetoken.ErrUnknownKey) {
		t.Fatalf("after retirement: %v, want ErrUnknownKey", err)
	}
	if kids := kidsOf(t, f.keys.JWKS()); kids != next.KeyID() {
		t.Fatalf("JWKS after retirement: %s", kids)
	}
	if got := f.keys.Published(rotatedAt); len(got) != 2 {
		t.Fatalf("Published(at rotation) = %d keys", len(got))
	}

	// Rotating back to a key still published makes it active without publishing it twice.
	third, _ := leasetoken.GenerateKey()
	now := f.clock.Now()
	if err := f.keys.Rotate(third, now); err != nil {
		t.Fatal(err)
	}
	if err := f.keys.Rotate(next, now); err != nil {
		t.Fatal(err)
	}
	if kids := kidsOf(t, f.keys.JWKS()); kids != next.KeyID()+","+third.KeyID() {
		t.Fatalf("JWKS after rotating back: %s", kids)
	}
	if err := f.keys.Rotate(next, now); err != nil || f.keys.Active().KeyID() != next.KeyID() {
		t.Fatalf("rotating to the active key: %v", err)
	}
}

func TestPreviousKeysStayPublished(t *testing.T) {
	prev, _ := leasetoken.GenerateKey()
	active, _ := leasetoken.GenerateKey()
	c := &clock{now: t0}
	ks, err := leasetoken.NewKeySet(active, leasetoken.KeySetOptions{Previous: []leasetoken.PublicKey{prev.Public(), active.Public()}, Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	c.Add(1000 * time.Hour)
	if kids := kidsOf(t, ks.JWKS()); kids != active.KeyID()+","+prev.KeyID() {
		t.Fatalf("JWKS = %s", kids)
	}
}

func kidsOf(t *testing.T, jwks []byte) string {
	t.Helper()
	keys, err := leasetoken.ParseJWKS(jwks)
	if err != nil {
		t.Fatal(err)
	}
	var kids []string
	for _, k := range keys {
		kids = append(kids, k.KeyID())
	}
	return strings.Join(kids, ",")
}
