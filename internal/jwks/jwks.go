// Package jwks fetches a JWK Set over HTTP and keeps it, for verifiers that choose a token's key
// by its kid: owner/guard's JWKSClient (tablease's lease-token keys) and the API's access tokens
// (an identity provider's keys, TABLEASE_JWT_JWKS_URL). It is the one copy of the rules of when a
// set is fetched again: when a token names a kid the set lacks (the lookup waits, and fetches are
// at most one per MinRefreshInterval, however many made-up kids arrive), and when the set is older
// than MaxAge (behind the lookup, which answers from the set it has).
package jwks

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// MaxSize bounds the document a Client reads.
const MaxSize = 1 << 20

// maxWithdrawn bounds the kids of withdrawn keys a Client remembers, so that a server that renames
// its keys at every fetch costs no more; past it they are forgotten, and their tokens are refused
// as the tokens of kids never seen are (retry, then unknown once a fetch may be made).
const maxWithdrawn = 256

// unfetchedRefresh bounds MinRefreshInterval while no set has been fetched: a verifier that
// started while the keys' server was down verifies tokens about a second after it is back, as the
// Retry-After of 1 told its clients, rather than up to MinRefreshInterval later.
const unfetchedRefresh = time.Second

// Options configure a Client. URL and Parse are required; the zero durations take the defaults.
type Options[K any] struct {
	// URL is the absolute http(s) URL of the JWK Set.
	URL string
	// Parse reads the document into the keys the verifier can use; KID names each.
	Parse func([]byte) ([]K, error)
	KID   func(K) string
	// Name prefixes the errors of fetches ("guard: fetch JWKS").
	Name string
	// HTTPClient makes the requests; default a client with Timeout.
	HTTPClient *http.Client
	// Timeout bounds one fetch; default 5s.
	Timeout time.Duration
	// MinRefreshInterval is the least time between two fetches; default 10s. Until a first set has
	// been fetched it is at most a second.
	MinRefreshInterval time.Duration
	// MaxAge is how long a fetched set is used before it is fetched again; default 5m.
	MaxAge time.Duration
	// OnFetch, when set, is told the outcome of every fetch (keys when err is nil), after the
	// Client has taken it in: a place to log.
	OnFetch func(keys []K, err error)
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Client keeps a JWK Set fetched from a URL. It is safe for concurrent use; concurrent lookups
// share one fetch.
type Client[K any] struct {
	opts Options[K]

	fetching chan struct{} // a one-slot semaphore: holding it means fetching

	mu        sync.Mutex // guards the fields below
	keys      []K
	withdrawn map[string]bool // kids of earlier sets that the last lacks (at most maxWithdrawn)
	// absent are kids that a fetch made while a lookup of them, for a token that does not say
	// when it was signed, waited found missing, and that the last set still lacks (at most
	// maxWithdrawn): they are unknown for every lookup until a set has them.
	absent      map[string]bool
	fetchedAt   time.Time // of the last successful fetch; zero before the first
	fetched     int       // successful fetches so far
	attemptedAt time.Time // of the last fetch, successful or not
	lastErr     error     // of the last fetch
	fetches     int
}

// ErrUnknownKey is the error of a lookup whose kid is not in a set fetched since the lookup began,
// or that a set named and the set fetched after it no longer does (a key withdrawn).
var ErrUnknownKey = errors.New("unknown key")

// UnavailableError is the error of a lookup that the keys cannot answer now: no set could ever be
// fetched, the latest fetch failed, or the set was fetched before the lookup and may not be fetched
// again yet (a key published since would be refused as forged until the next fetch). The caller
// answers "retry", not "forged".
type UnavailableError struct {
	Reason string
	Err    error         // the fetch's error, when there is one
	wait   time.Duration // until a fetch may be made again
}

func (e *UnavailableError) Error() string {
	if e.Err != nil {
		return e.Reason + ": " + e.Err.Error()
	}
	return e.Reason
}

func (e *UnavailableError) Unwrap() error { return e.Err }

// RetryAfter is when a lookup may be answered from a new fetch, rounded up to whole seconds, at
// least one.
func (e *UnavailableError) RetryAfter() time.Duration {
	return max((e.wait+time.Second-1)/time.Second*time.Second, time.Second)
}

// CheckURL says whether u can be a Client's URL: an absolute http(s) URL with a host.
func CheckURL(u string) error {
	parsed, err := url.Parse(u)
	if err != nil || (parsed.Scheme != "https" && parsed.Scheme != "http") || parsed.Host == "" {
		return fmt.Errorf("JWKS URL %q must be an absolute http(s) URL", u)
	}
	return nil
}

// CheckSecureURL says whether u can be the URL of keys that whoever controls the network between
// must not be able to replace: an absolute https URL, or http to a loopback address.
func CheckSecureURL(u string) error {
	if err := CheckURL(u); err != nil {
		return err
	}
	parsed, _ := url.Parse(u)
	host := parsed.Hostname()
	if ip := net.ParseIP(host); parsed.Scheme == "https" || host == "localhost" || (ip != nil && ip.IsLoopback()) {
		return nil
	}
	return fmt.Errorf("JWKS URL %q must be https (http only to a loopback address): keys fetched over plain http can be replaced on the way", u)
}

// New checks opts and makes a client. It fetches nothing until the first lookup or Refresh.
func New[K any](opts Options[K]) (*Client[K], error) {
	if err := CheckURL(opts.URL); err != nil {
		return nil, err
	}
	if opts.Parse == nil || opts.KID == nil {
		return nil, errors.New("jwks: Options.Parse and Options.KID are required")
	}
	if opts.Timeout < 0 || opts.MinRefreshInterval < 0 || opts.MaxAge < 0 {
		return nil, errors.New("JWKS durations must not be negative")
	}
	opts.Timeout = or(opts.Timeout, 5*time.Second)
	opts.MinRefreshInterval = or(opts.MinRefreshInterval, 10*time.Second)
	opts.MaxAge = or(opts.MaxAge, 5*time.Minute)
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{Timeout: opts.Timeout}
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Name == "" {
		opts.Name = "fetch JWKS"
	}
	return &Client[K]{opts: opts, fetching: make(chan struct{}, 1)}, nil
}

func or(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// URL is the URL the client fetches.
func (c *Client[K]) URL() string { return c.opts.URL }

// Fetches is how many fetches the client has made.
func (c *Client[K]) Fetches() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fetches
}

// Lookup finds kid in the set. When the set has never been fetched or lacks kid, it fetches the
// set first, unless the last fetch was less than MinRefreshInterval ago; when the set has kid but
// is older than MaxAge, it answers at once and fetches the set behind. It fails with ErrUnknownKey
// when kid is not in a set fetched successfully since the call began (its own fetch, or one it
// waited for) or since an earlier lookup of kid that such a fetch showed it missing began (absent),
// or was withdrawn (in the set fetched before the last, not in the last), and with an
// *UnavailableError otherwise.
func (c *Client[K]) Lookup(ctx context.Context, kid string) (K, error) {
	return c.LookupSigned(ctx, kid, time.Time{})
}

// SignedBy is the latest instant a token issued at iat was signed, as LookupSigned takes it: its
// iat plus the verifier's leeway, and at least 5 s, for a signer whose clock runs behind.
func SignedBy(iat time.Time, leeway time.Duration) time.Time {
	return iat.Add(max(leeway, 5*time.Second))
}

// LookupSigned is Lookup for a token that was signed before signedBy (its iat, with a margin for
// the clocks): whether a set that lacks kid shows the kid unknown depends on when it was fetched,
// not on which call fetched it. Fetched after signedBy, it does (ErrUnknownKey); fetched before,
// even by this call, it may lack a key published since (an identity provider whose set lags its
// signing), and the answer is "retry" (*UnavailableError) until the set may be fetched again.
func (c *Client[K]) LookupSigned(ctx context.Context, kid string, signedBy time.Time) (K, error) {
	var zero K
	k, found, fresh := c.Cached(kid)
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
		return zero, &UnavailableError{Reason: "the lookup ended before the JWKS was fetched", Err: ctx.Err()}
	}
	if k, found, _ = c.Cached(kid); found {
		return k, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	shown := kid
	if len(shown) > 64 {
		shown = shown[:64] + "..."
	}
	switch {
	case c.withdrawn[kid]:
		return zero, fmt.Errorf("kid %q was withdrawn from the JWKS: %w", shown, ErrUnknownKey)
	case c.fetchedAt.IsZero():
		return zero, &UnavailableError{Reason: "no JWKS fetched yet", Err: c.lastErr, wait: c.untilFetch()}
	case err != nil:
		// The set could not be read now (this fetch, or the last one within MinRefreshInterval,
		// failed): the kid may be a new key of a rotation, so the answer is "try again", not
		// "forged".
		return zero, &UnavailableError{Reason: fmt.Sprintf("kid %q is not in the JWKS last fetched, and it cannot be fetched again now", shown),
			Err: err, wait: c.untilFetch()}
	case signedBy.IsZero() && c.absent[kid]:
		// A fetch made for an earlier lookup of the kid found it missing, and no set has had it
		// since: the same answer as that lookup's, however often the token comes.
		return zero, fmt.Errorf("kid %q is not in the JWKS: %w", shown, ErrUnknownKey)
	case !signedBy.IsZero() && c.fetchedAt.After(signedBy):
		// The set was fetched after the token was signed: its key was not published then, so it
		// is not the server's.
		return zero, fmt.Errorf("kid %q is not in the JWKS fetched after the token was signed: %w", shown, ErrUnknownKey)
	case !signedBy.IsZero() || c.fetched == before:
		// The set was fetched before the token was signed, or, for a token that does not say
		// when it was, before this call: it may lack a key published since.
		wait := c.untilFetch()
		return zero, &UnavailableError{Reason: fmt.Sprintf("kid %q is not in the JWKS fetched %s ago; it may be fetched again in %s (MinRefreshInterval)",
			shown, c.opts.Now().Sub(c.fetchedAt).Round(time.Millisecond), (&UnavailableError{wait: wait}).RetryAfter()), wait: wait}
	}
	// Fetched by this call, for a token that does not say when it was signed: unknown, for this
	// lookup and the next ones (absent).
	if c.absent == nil {
		c.absent = make(map[string]bool)
	}
	c.absent[kid] = true
	return zero, fmt.Errorf("kid %q is not in the JWKS: %w", shown, ErrUnknownKey)
}

// untilFetch is how long until a limited fetch may be made again; c.mu is held.
func (c *Client[K]) untilFetch() time.Duration {
	interval := c.opts.MinRefreshInterval
	if c.fetchedAt.IsZero() {
		interval = min(interval, unfetchedRefresh)
	}
	return c.attemptedAt.Add(interval).Sub(c.opts.Now())
}

// Cached looks kid up in the set fetched last, without fetching: found says whether it is there,
// fresh whether that set is younger than MaxAge.
func (c *Client[K]) Cached(kid string) (k K, found, fresh bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, key := range c.keys {
		if c.opts.KID(key) == kid {
			return key, true, c.opts.Now().Sub(c.fetchedAt) < c.opts.MaxAge
		}
	}
	return k, false, false
}

// Current finds kid in the set fetched last, as Lookup does when the set has it (fetching a set
// older than MaxAge behind the call), but never waits for a fetch: for a holder of a key verified
// before that asks whether the set still names it.
func (c *Client[K]) Current(kid string) (K, bool) {
	k, found, fresh := c.Cached(kid)
	if !fresh {
		c.refreshBehind()
	}
	return k, found
}

// Refresh fetches the set now, regardless of MinRefreshInterval.
func (c *Client[K]) Refresh(ctx context.Context) error { return c.fetch(ctx, false) }

// refreshBehind fetches the set in the background, unless a fetch runs already or the last one
// was less than MinRefreshInterval ago.
func (c *Client[K]) refreshBehind() {
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
func (c *Client[K]) fetch(ctx context.Context, limited bool) error {
	select {
	case c.fetching <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-c.fetching }()
	return c.fetchHeld(ctx, limited)
}

// fetchHeld is fetch, by a caller that holds the fetching slot.
func (c *Client[K]) fetchHeld(ctx context.Context, limited bool) error {
	c.mu.Lock()
	if limited && !c.attemptedAt.IsZero() && c.untilFetch() > 0 {
		err := c.lastErr
		c.mu.Unlock()
		return err
	}
	c.attemptedAt = c.opts.Now()
	c.fetches++
	c.mu.Unlock()

	// The fetch serves every waiting lookup, so one caller's cancellation must not end it; it is
	// bounded by the timeout instead.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.Timeout)
	defer cancel()
	keys, err := c.get(fctx)

	c.mu.Lock()
	c.lastErr = err
	if err == nil {
		if c.withdrawn == nil || len(c.withdrawn) > maxWithdrawn {
			c.withdrawn = make(map[string]bool)
		}
		for _, k := range c.keys {
			c.withdrawn[c.opts.KID(k)] = true
		}
		if len(c.absent) > maxWithdrawn {
			c.absent = nil
		}
		for _, k := range keys {
			delete(c.withdrawn, c.opts.KID(k))
			delete(c.absent, c.opts.KID(k))
		}
		c.keys, c.fetchedAt = keys, c.opts.Now()
		c.fetched++
	}
	c.mu.Unlock()
	if c.opts.OnFetch != nil {
		c.opts.OnFetch(keys, err)
	}
	return err
}

func (c *Client[K]) get(ctx context.Context) ([]K, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.opts.URL, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.opts.HTTPClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.opts.Name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return nil, fmt.Errorf("%s: %s answered %s", c.opts.Name, c.opts.URL, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.opts.Name, err)
	}
	if len(body) > MaxSize {
		return nil, fmt.Errorf("%s: document too large", c.opts.Name)
	}
	keys, err := c.opts.Parse(body)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.opts.Name, err)
	}
	return keys, nil // none is a set too: its server withdrew every key
}
