package verifiedtokens

import (
	"fmt"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

func TestATokenIsRememberedWithinItsWindowOnly(t *testing.T) {
	var c Cache[string]
	t0 := time.Unix(1_700_000_000, 0)
	c.Put("tok", "alice", t0, t0.Add(10*time.Second))
	for _, tc := range []struct {
		at   time.Duration
		want bool
	}{{0, true}, {10*time.Second - time.Nanosecond, true}, {-time.Nanosecond, false}} {
		if v, ok := c.Get("tok", t0.Add(tc.at)); ok != tc.want || (ok && v != "alice") {
			t.Errorf("at %v: %q, %v; want %v", tc.at, v, ok, tc.want)
		}
	}
	if n := c.Len(); n != 0 {
		t.Errorf("a token asked for outside its window is still remembered (%d)", n)
	}
	c.Put("tok", "alice", t0, t0.Add(10*time.Second))
	if _, ok := c.Get("tok", t0.Add(10*time.Second)); ok {
		t.Error("remembered at its until")
	}
	c.Put("tok", "alice", t0, t0.Add(10*time.Second))
	c.Forget("tok")
	if _, ok := c.Get("tok", t0); ok {
		t.Error("remembered after Forget")
	}
}

func TestTheTokensAreBoundedAndKeepTheBusyOnes(t *testing.T) {
	var c Cache[int]
	now := time.Now()
	until := now.Add(time.Hour)
	c.Put("busy", -1, time.Time{}, until)
	for i := range 3 * PerGeneration {
		c.Put(fmt.Sprint("token-", i), i, time.Time{}, until)
		if i%1000 == 0 {
			if v, ok := c.Get("busy", now); !ok || v != -1 {
				t.Fatalf("the busy token was dropped after %d others", i)
			}
		}
	}
	if n := c.Len(); n > 2*PerGeneration {
		t.Fatalf("%d tokens remembered, want at most %d", n, 2*PerGeneration)
	}
	if _, ok := c.Get("token-0", now); ok {
		t.Fatal("the oldest token is still remembered after three generations")
	}
	long := string(make([]byte, MaxTokenLen+1))
	c.Put(long, 1, time.Time{}, until)
	if _, ok := c.Get(long, now); ok {
		t.Fatal("a token longer than the bound was remembered")
	}
}

func TestTheWindowIsTheParsers(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	at := func(d time.Duration) *jwt.NumericDate { return jwt.NewNumericDate(t0.Add(d)) }
	const leeway = 5 * time.Second
	for _, tc := range []struct {
		name       string
		c          jwt.RegisteredClaims
		from, till time.Duration
		noFrom     bool
	}{
		{"iat and exp", jwt.RegisteredClaims{IssuedAt: at(0), ExpiresAt: at(time.Minute)}, -leeway, time.Minute + leeway, false},
		{"a later nbf", jwt.RegisteredClaims{IssuedAt: at(0), NotBefore: at(10 * time.Second), ExpiresAt: at(time.Minute)}, 10*time.Second - leeway, time.Minute + leeway, false},
		{"an earlier nbf", jwt.RegisteredClaims{IssuedAt: at(0), NotBefore: at(-time.Minute), ExpiresAt: at(time.Minute)}, -leeway, time.Minute + leeway, false},
		{"neither", jwt.RegisteredClaims{ExpiresAt: at(time.Minute)}, 0, time.Minute + leeway, true},
	} {
		from, until := Window(tc.c, leeway)
		if (tc.noFrom && !from.IsZero()) || (!tc.noFrom && !from.Equal(t0.Add(tc.from))) || !until.Equal(t0.Add(tc.till)) {
			t.Errorf("%s: [%v, %v)", tc.name, from, until)
		}
	}
}
