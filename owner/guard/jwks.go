package guard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/tablease/tablease/owner/leasetoken"
)

// JWKSPath is where tablease publishes its lease-token keys.
const JWKSPath = "/.well-known/jwks.json"

// maxJWKSSize bounds the JWKS document the client reads.
const maxJWKSSize = 1 << 20

// unfetchedRefresh bounds MinRefreshInterval while no set has been fetched: a backend that started
// while tablease was down verifies tokens about a second after tablease is back, as its
// Retry-After of 1 told its clients, rather than up to MinRefreshInterval later.
const unfetchedRefresh = time.Second

// JWKSOptions configure a JWKSClient.
type JWKSOptions struct {
	// BaseURL is tablease's base URL (e.g. "https://tablease.example.com"); the JWKS is fetched
	// from BaseURL + JWKSPath. Required unless URL is set.
	BaseURL string
	// URL is the full URL of the JWKS, overriding BaseURL.
	URL string
	// HTTPClient makes the requests; default a client with Timeout.
	HTTPClient *http.Client
	// Timeout bounds one fetch; default 5s.
	Timeout time.Duration
	// MinRefreshInterval is the least time between two fetches, however many unknown kids
	// arrive: an attacker sending tokens with made-up kids gets the JWKS fetched at most once per
	// interval per process. Default 10s. A rotation is seen at once if the new key was published
	// (KeySetOptions.Previous) at least this interval before it signs, or after at most this
	// interval otherwise (its tokens meanwhile fail with ErrKeysUnavailable, see LookupKey).
	// Until a first set has been fetched the interval is at most a second (unfetchedRefresh):
	// every lookup fails then, and the guard's 503 tells the client to retry in a second.
	MinRefreshInterval time.Duration
	// MaxAge is how long a fetched set is used before it is fetched again, so that retired keys
	// disappear; default 5m. A lookup that finds its key in a set older than MaxAge answers with
	// it at once and has the set fetched behind it (one fetch at a time, at most one per
	// MinRefreshInterval): a tablease that does not answer never holds up a lookup whose key is
	// known. Until a fetch succeeds, the old set is used.
	MaxAge time.Duration
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// JWKSClient is a leasetoken.KeySource that fetches tablease's JWKS over HTTP, caches it, and
// fetches it again when a token names an unknown kid (rate-limited, the lookup waits for it) or
// the set is older than MaxAge (behind the lookup). It is safe for concurrent use; concurrent
// lookups share one fetch.
type JWKSClient struct {
	url        string
	client     *http.Client
	timeout    time.Duration
	minRefresh time.Duration
	maxAge     time.Duration
	now        func() time.Time

	fetching chan struct{} // a one-slot semaphore: holding it means fetching

	mu          sync.Mutex // guards the fields below
	keys        leasetoken.PublicKeys
	fetchedAt   time.Time // of the last successful fetch; zero before the first
	fetched     int       // successful fetches so far
	attemptedAt time.Time // of the last fetch, successful or not
	lastErr     error     // of the last fetch
	fetches     int
}

// NewJWKSClient checks opts and makes a client. It fetches nothing until the first lookup (call
// Refresh to fail fast at start).
func NewJWKSClient(opts JWKSOptions) (*JWKSClient, error) {
	u := opts.URL
	if u == "" {
		if opts.BaseURL == "" {
			return nil, errors.New("guard: JWKSOptions needs BaseURL or URL")
		}
		u = strings.TrimRight(opts.BaseURL, "/") + JWKSPath
	}
	parsed, err := url.Parse(u)
	if err != nil || (parsed.Scheme != "https" && parsed.Scheme != "http") || parsed.Host == "" {
		return nil, fmt.Errorf("guard: JWKS URL %q must be an absolute http(s) URL", u)
	}
	if opts.Timeout < 0 || opts.MinRefreshInterval < 0 || opts.MaxAge < 0 {
		return nil, errors.New("guard: JWKSOptions durations must not be negative")
	}
	c := &JWKSClient{
		url:        u,
		client:     opts.HTTPClient,
		timeout:    or(opts.Timeout, 5*time.Second),
		minRefresh: or(opts.MinRefreshInterval, 10*time.Second),
		maxAge:     or(opts.MaxAge, 5*time.Minute),
		now:        opts.Now,
		fetching:   make(chan struct{}, 1),
	}
	if c.client == nil {
		c.client = &http.Client{Timeout: c.timeout}
	}
	if c.now == nil {
		c.now = time.Now
	}
	return c, nil
}

func or(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// URL is the JWKS URL the client fetches.
func (c *JWKSClient) URL() string { return c.url }

// Fetches is how many fetches the client has made (for tests and metrics).
func (c *JWKSClient) Fetches() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fetches
}

// LookupKey finds kid in the cached set. When the set has never been fetched or lacks kid, it
// fetches the set first, unless the last fetch was less than MinRefreshInterval ago; when the set
// has kid but is older than MaxAge, it answers at once and fetches the set behind. It fails with
// leasetoken.ErrUnknownKey when kid is not in a set fetched successfully since the call began
// (its own fetch, or one it waited for), and leasetoken.ErrKeysUnavailable otherwise: no set could
// ever be fetched, the latest fetch failed, or the set was fetched before the call and may not be
// fetched again yet (a key published since, as when a rotation skipped its first step, would be
// refused as forged until the next fetch). That error has a RetryAfter() method giving when a
// fetch may be made again, at least a second.
func (c *JWKSClient) LookupKey(ctx context.Context, kid string) (leasetoken.PublicKey, error) {
	k, found, fresh := c.cached(kid)
	if found {
		if !fresh {
			c.refreshBehind()
		}
		return k, nil
	}
	c.mu.Lock()
	before := c.fetched
	c.mu.Unlock()
	err := c.fetch(ctx, true)
	if err != nil && ctx.Err() != nil {
		return leasetoken.PublicKey{}, &leasetoken.Error{Kind: leasetoken.ErrKeysUnavailable, Err: ctx.Err()}
	}
	if k, found, _ = c.cached(kid); found {
		return k, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.fetchedAt.IsZero():
		return leasetoken.PublicKey{}, &leasetoken.Error{Kind: leasetoken.ErrKeysUnavailable, Reason: "no JWKS fetched yet", Err: c.lastErr}
	case err != nil:
		// The set could not be read now (this fetch, or the last one within MinRefreshInterval,
		// failed): the kid may be a new key of a rotation, so the answer is "try again", not
		// "forged".
		return leasetoken.PublicKey{}, &leasetoken.Error{Kind: leasetoken.ErrKeysUnavailable,
			Reason: fmt.Sprintf("kid %q is not in the JWKS last fetched, and it cannot be fetched again now", kid), Err: err}
	case c.fetched == before:
		// No fetch since the call began: the set may lack a key published since.
		return leasetoken.PublicKey{}, &leasetoken.Error{Kind: leasetoken.ErrKeysUnavailable,
			Reason: fmt.Sprintf("kid %q is not in the JWKS fetched %s ago", kid, c.now().Sub(c.fetchedAt).Round(time.Millisecond)),
			Err:    fetchDue{c.attemptedAt.Add(c.minRefresh).Sub(c.now())}}
	}
	return leasetoken.PublicKey{}, &leasetoken.Error{Kind: leasetoken.ErrUnknownKey, Reason: fmt.Sprintf("kid %q is not in the JWKS", kid)}
}

// fetchDue is why a kid that the set lacks cannot be decided before the next fetch, in wait.
type fetchDue struct{ wait time.Duration }

func (f fetchDue) Error() string {
	return fmt.Sprintf("the JWKS may be fetched again in %s (MinRefreshInterval)", f.RetryAfter())
}

// RetryAfter is when the next fetch may be made, rounded up to whole seconds, at least one.
func (f fetchDue) RetryAfter() time.Duration {
	return max((f.wait+time.Second-1)/time.Second*time.Second, time.Second)
}

func (c *JWKSClient) cached(kid string) (k leasetoken.PublicKey, found, fresh bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, key := range c.keys {
		if key.KeyID() == kid {
			return key, true, c.now().Sub(c.fetchedAt) < c.maxAge
		}
	}
	return leasetoken.PublicKey{}, false, false
}

// Refresh fetches the JWKS now, regardless of MinRefreshInterval. Use it at start to fail fast.
func (c *JWKSClient) Refresh(ctx context.Context) error { return c.fetch(ctx, false) }

// refreshBehind fetches the set in the background, unless a fetch runs already or the last one
// was less than MinRefreshInterval ago.
func (c *JWKSClient) refreshBehind() {
	select {
	case c.fetching <- struct{}{}:
	default:
		return // a fetch runs: it brings the set
	}
	go func() {
		defer func() { <-c.fetching }()
		_ = c.fetchHeld(context.Background(), true)
	}()
}

// fetch fetches the set, at most one at a time; with limited, it skips the fetch when the last
// one was less than MinRefreshInterval ago (including one that finished while it waited).
func (c *JWKSClient) fetch(ctx context.Context, limited bool) error {
	select {
	case c.fetching <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-c.fetching }()
	return c.fetchHeld(ctx, limited)
}

// fetchHeld is fetch, by a caller that holds the fetching slot.
func (c *JWKSClient) fetchHeld(ctx context.Context, limited bool) error {
	c.mu.Lock()
	now := c.now()
	interval := c.minRefresh
	if c.fetchedAt.IsZero() {
		interval = min(interval, unfetchedRefresh)
	}
	if limited && !c.attemptedAt.IsZero() && now.Sub(c.attemptedAt) < interval {
		err := c.lastErr
		c.mu.Unlock()
		return err
	}
	c.attemptedAt = now
	c.fetches++
	c.mu.Unlock()

	// The fetch serves every waiting lookup, so one caller's cancellation must not end it; it is
	// bounded by the timeout instead.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.timeout)
	defer cancel()
	keys, err := c.get(fctx)

	c.mu.Lock()
	defer c.mu.Unlock()
	c.lastErr = err
	if err == nil {
		c.keys, c.fetchedAt = keys, c.now()
		c.fetched++
	}
	return err
}

func (c *JWKSClient) get(ctx context.Context) (leasetoken.PublicKeys, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("guard: fetch JWKS: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return nil, fmt.Errorf("guard: fetch JWKS: %s answered %s", c.url, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKSSize+1))
	if err != nil {
		return nil, fmt.Errorf("guard: fetch JWKS: %w", err)
	}
	if len(body) > maxJWKSSize {
		return nil, errors.New("guard: fetch JWKS: document too large")
	}
	keys, err := leasetoken.ParseJWKS(body)
	if err != nil {
		return nil, fmt.Errorf("guard: fetch JWKS: %w", err)
	}
	if len(keys) == 0 {
		return nil, errors.New("guard: fetch JWKS: no usable key in the set")
	}
	return keys, nil
}
