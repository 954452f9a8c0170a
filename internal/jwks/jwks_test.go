package jwks

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestAFailedFetchAfterASetSaysWhenToRetry: once a set was had, a kid it lacks while the fetch
// fails is "retry" at the time the next fetch may be made, and OnFetch hears every outcome.
func TestAFailedFetchAfterASetSaysWhenToRetry(t *testing.T) {
	var down atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if down.Load() {
			http.Error(w, "down", http.StatusBadGateway)
			return
		}
		w.Write([]byte("a,b"))
	}))
	t.Cleanup(srv.Close)
	now := time.Now()
	var outcomes []string
	c, err := New(Options[string]{
		URL:                srv.URL,
		Parse:              func(b []byte) ([]string, error) { return strings.Split(string(b), ","), nil },
		KID:                func(k string) string { return k },
		MinRefreshInterval: 10 * time.Second,
		OnFetch: func(keys []string, err error) {
			outcomes = append(outcomes, strings.Join(keys, "+")+"|"+errString(err))
		},
		Now: func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	if k, err := c.Lookup(context.Background(), "b"); err != nil || k != "b" {
		t.Fatalf("Lookup(b) = %q, %v", k, err)
	}
	down.Store(true)
	now = now.Add(12 * time.Second)
	_, err = c.Lookup(context.Background(), "c")
	var unavailable *UnavailableError
	if !errors.As(err, &unavailable) || unavailable.RetryAfter() != 10*time.Second || !strings.Contains(err.Error(), "502 Bad Gateway") {
		t.Fatalf("Lookup(c) with the server down = %v", err)
	}
	now = now.Add(10 * time.Second)
	down.Store(false)
	if _, err := c.Lookup(context.Background(), "c"); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("Lookup(c) after a fetch without it = %v", err)
	}
	if want := []string{"a+b|", "|fetch JWKS: " + srv.URL + " answered 502 Bad Gateway", "a+b|"}; strings.Join(outcomes, "\n") != strings.Join(want, "\n") {
		t.Fatalf("OnFetch heard %q, want %q", outcomes, want)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
