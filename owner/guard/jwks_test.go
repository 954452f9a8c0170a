package guard_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tablease/tablease/owner/guard"
	"github.com/tablease/tablease/owner/leasetoken"
)

func TestJWKSClient(t *testing.T) {
	key, _ := leasetoken.GenerateKey()
	var hits atomic.Int32
	var status atomic.Int32
	status.Store(http.StatusOK)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.URL.Path != guard.JWKSPath {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(int(status.Load()))
		_, _ = w.Write(leasetoken.EncodeJWKS([]leasetoken.PublicKey{key.Public()}))
	}))
	defer srv.Close()
	c0 := &clock{now: t0}
	jc, err := guard.NewJWKSClient(guard.JWKSOptions{BaseURL: srv.URL + "/", MinRefreshInterval: 10 * time.Second, MaxAge: time.Minute, Now: c0.Now})
	if err != nil {
		t.Fatal(err)
	}
	if jc.URL() != srv.URL+"/.well-known/jwks.json" {
		t.Fatalf("URL %s", jc.URL())
	}
	ctx := context.Background()

	if k, err := jc.LookupKey(ctx, key.KeyID()); err != nil || k.KeyID() != key.KeyID() {
		t.Fatalf("LookupKey: %v", err)
	}
	if _, err := jc.LookupKey(ctx, key.KeyID()); err != nil || hits.Load() != 1 {
		t.Fatalf("a cached key was fetched again (%d fetches): %v", hits.Load(), err)
	}
	// An unknown kid within the interval causes no fetch, and cannot be decided before the next
	// one; after the interval it causes one, which decides it.
	_, err = jc.LookupKey(ctx, "made-up")
	if !errors.Is(err, leasetoken.ErrKeysUnavailable) || errors.Is(err, leasetoken.ErrUnknownKey) || hits.Load() != 1 {
		t.Fatalf("an unknown kid within the interval: %v, %d fetches", err, hits.Load())
	}
	if got := retryAfter(err); got != 10*time.Second {
		t.Fatalf("an unknown kid within the interval: retry after %s, want 10s", got)
	}
	c0.Add(10 * time.Second)
	if _, err := jc.LookupKey(ctx, "made-up"); !errors.Is(err, leasetoken.ErrUnknownKey) || hits.Load() != 2 {
		t.Fatalf("an unknown kid after the interval: %v, %d fetches, want 2", err, hits.Load())
	}

	// After MaxAge the set is fetched again, behind the lookup; a failing fetch keeps the old set
	// in use.
	c0.Add(2 * time.Minute)
	status.Store(http.StatusInternalServerError)
	if _, err := jc.LookupKey(ctx, key.KeyID()); err != nil {
		t.Fatalf("a stale set with tablease failing: %v", err)
	}
	for deadline := time.Now().Add(5 * time.Second); hits.Load() != 3; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("a stale set was not fetched again: %d fetches", hits.Load())
		}
	}
	if _, err := jc.LookupKey(ctx, key.KeyID()); err != nil || hits.Load() != 3 {
		t.Fatalf("within the interval after the failed fetch: %v, %d fetches", err, hits.Load())
	}
	if err := jc.Refresh(ctx); err == nil || hits.Load() != 4 {
		t.Fatalf("Refresh ignores the interval and reports the failure: %v, %d fetches", err, hits.Load())
	}
	if jc.Fetches() != 4 {
		t.Fatalf("Fetches = %d", jc.Fetches())
	}

	// A kid the set does not have while the set cannot be fetched may be a new key (a rotation
	// during an outage): the keys are unavailable (503, retry), not the token forged (403). Within
	// the interval the failure stands; once a fetch succeeds, a kid it lacks is unknown.
	c0.Add(11 * time.Second)
	for range 2 {
		_, err := jc.LookupKey(ctx, "new-key")
		if !errors.Is(err, leasetoken.ErrKeysUnavailable) || errors.Is(err, leasetoken.ErrUnknownKey) {
			t.Fatalf("an unknown kid while the JWKS fails: %v, want ErrKeysUnavailable", err)
		}
	}
	status.Store(http.StatusOK)
	c0.Add(11 * time.Second)
	if _, err := jc.LookupKey(ctx, "new-key"); !errors.Is(err, leasetoken.ErrUnknownKey) {
		t.Fatalf("an unknown kid once the JWKS answers: %v, want ErrUnknownKey", err)
	}
}

// TestJWKSClientFetchesEverySecondUntilItHasASet: a backend that started while tablease was down
// (every fetch failing) fetches again a second later, not MinRefreshInterval later, so it verifies
// tokens about a second after tablease is back, as the guard's Retry-After of 1 said.
func TestJWKSClientFetchesEverySecondUntilItHasASet(t *testing.T) {
	key, _ := leasetoken.GenerateKey()
	var hits atomic.Int32
	var up atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if !up.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write(leasetoken.EncodeJWKS([]leasetoken.PublicKey{key.Public()}))
	}))
	defer srv.Close()
	c0 := &clock{now: t0}
	jc, err := guard.NewJWKSClient(guard.JWKSOptions{BaseURL: srv.URL, MinRefreshInterval: 10 * time.Second, Now: c0.Now})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := jc.LookupKey(ctx, key.KeyID()); !errors.Is(err, leasetoken.ErrKeysUnavailable) {
		t.Fatalf("with tablease down: %v", err)
	}
	c0.Add(500 * time.Millisecond)
	if _, err := jc.LookupKey(ctx, key.KeyID()); !errors.Is(err, leasetoken.ErrKeysUnavailable) || hits.Load() != 1 {
		t.Fatalf("within the second: %v, %d fetches, want 1", err, hits.Load())
	}
	up.Store(true)
	c0.Add(600 * time.Millisecond)
	if k, err := jc.LookupKey(ctx, key.KeyID()); err != nil || k.KeyID() != key.KeyID() || hits.Load() != 2 {
		t.Fatalf("a second after the failed fetch, with tablease back: %v, %d fetches", err, hits.Load())
	}
	// With a set, made-up kids are held to MinRefreshInterval again.
	c0.Add(2 * time.Second)
	if _, err := jc.LookupKey(ctx, "made-up"); !errors.Is(err, leasetoken.ErrKeysUnavailable) || retryAfter(err) != 8*time.Second || hits.Load() != 2 {
		t.Fatalf("an unknown kid 2s after a fetch: %v, %d fetches, want 2", err, hits.Load())
	}
}

// retryAfter is what err says of when to try again, 0 when nothing.
func retryAfter(err error) time.Duration {
	var due interface{ RetryAfter() time.Duration }
	if errors.As(err, &due) {
		return due.RetryAfter()
	}
	return 0
}

// TestJWKSClientNeverWaitsForAStaleSetsFetch: a tablease that accepts the connection and never
// answers (paused, overloaded) holds up no lookup of a key the client has, when its set is older
// than MaxAge: the fetch runs behind the lookup.
func TestJWKSClientNeverWaitsForAStaleSetsFetch(t *testing.T) {
	key, _ := leasetoken.GenerateKey()
	var hung atomic.Bool
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hung.Load() {
			arrived <- struct{}{}
			<-release
			return
		}
		_, _ = w.Write(leasetoken.EncodeJWKS([]leasetoken.PublicKey{key.Public()}))
	}))
	defer srv.Close()
	defer close(release)
	c0 := &clock{now: t0}
	jc, err := guard.NewJWKSClient(guard.JWKSOptions{BaseURL: srv.URL, MaxAge: time.Minute, Timeout: time.Hour, Now: c0.Now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := jc.LookupKey(t.Context(), key.KeyID()); err != nil {
		t.Fatal(err)
	}
	hung.Store(true)
	c0.Add(2 * time.Minute)
	done := make(chan error, 1)
	go func() {
		for range 3 {
			if k, err := jc.LookupKey(t.Context(), key.KeyID()); err != nil || k.KeyID() != key.KeyID() {
				done <- fmt.Errorf("lookup of a known key with the set stale and tablease hung: %v", err)
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a lookup of a known key waited for the fetch of a stale set from a tablease that does not answer")
	}
	<-arrived // the set is being fetched, behind the lookups
	if jc.Fetches() != 2 {
		t.Fatalf("%d fetches, want one behind the lookups", jc.Fetches())
	}
}

func TestJWKSClientNeverFetched(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`<html>oops</html>`))
	}))
	defer srv.Close()
	jc, err := guard.NewJWKSClient(guard.JWKSOptions{URL: srv.URL + "/keys"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = jc.LookupKey(context.Background(), "k")
	if !errors.Is(err, leasetoken.ErrKeysUnavailable) || errors.Is(err, leasetoken.ErrUnknownKey) {
		t.Fatalf("LookupKey with no JWKS ever fetched: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := jc.LookupKey(ctx, "k"); !errors.Is(err, leasetoken.ErrKeysUnavailable) {
		t.Fatalf("LookupKey with a cancelled context: %v", err)
	}
}
