package guard

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/tablease/tablease/internal/jwks"
	"github.com/tablease/tablease/owner/leasetoken"
)

// JWKSPath is where tablease publishes its lease-token keys.
const JWKSPath = "/.well-known/jwks.json"

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
	// Until a first set has been fetched the interval is at most a second: every lookup fails then, and the guard's 503 tells the client to retry in a second.
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
	c *jwks.Client[leasetoken.PublicKey]
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
	c, err := jwks.New(jwks.Options[leasetoken.PublicKey]{
		URL:                u,
		Parse:              leasetoken.ParseJWKS,
		KID:                leasetoken.PublicKey.KeyID,
		Name:               "guard: fetch JWKS",
		HTTPClient:         opts.HTTPClient,
		Timeout:            opts.Timeout,
		MinRefreshInterval: opts.MinRefreshInterval,
		MaxAge:             opts.MaxAge,
		Now:                opts.Now,
	})
	if err != nil {
		return nil, fmt.Errorf("guard: %w", err)
	}
	return &JWKSClient{c: c}, nil
}

// URL is the JWKS URL the client fetches.
func (c *JWKSClient) URL() string { return c.c.URL() }

// Fetches is how many fetches the client has made (for tests and metrics).
func (c *JWKSClient) Fetches() int { return c.c.Fetches() }

// LookupKey finds kid in the cached set. When the set has never been fetched or lacks kid, it
// fetches the set first, unless the last fetch was less than MinRefreshInterval ago; when the set
// has kid but is older than MaxAge, it answers at once and fetches the set behind. It fails with
// leasetoken.ErrUnknownKey when kid is not in a set fetched successfully since the call began
// (its own fetch, or one it waited for; or since an earlier lookup of kid began, which such a fetch
// showed missing), and leasetoken.ErrKeysUnavailable otherwise: no set could
// ever be fetched, the latest fetch failed, or the set was fetched before the call and may not be
// fetched again yet (a key published since, as when a rotation skipped its first step, would be
// refused as forged until the next fetch). That error has a RetryAfter() method giving when a
// fetch may be made again, at least a second.
func (c *JWKSClient) LookupKey(ctx context.Context, kid string) (leasetoken.PublicKey, error) {
	return c.LookupKeySigned(ctx, kid, time.Time{})
}

// LookupKeySigned is LookupKey for a token signed before signedBy (leasetoken.SignedKeySource,
// which the Verifier uses): whether a set that lacks kid shows it unknown depends on when the set
// was fetched, not on which lookup fetched it. A set fetched after signedBy shows it unknown
// (leasetoken.ErrUnknownKey); one fetched before, even by this lookup, may lack a key published
// since (a tablease instance behind the same URL that had not the rotation's new key yet), and the
// answer is leasetoken.ErrKeysUnavailable with the time until a fetch may be made.
func (c *JWKSClient) LookupKeySigned(ctx context.Context, kid string, signedBy time.Time) (leasetoken.PublicKey, error) {
	k, err := c.c.LookupSigned(ctx, kid, signedBy)
	var unavailable *jwks.UnavailableError
	switch {
	case err == nil:
		return k, nil
	case errors.As(err, &unavailable):
		return leasetoken.PublicKey{}, &leasetoken.Error{Kind: leasetoken.ErrKeysUnavailable, Err: err}
	}
	return leasetoken.PublicKey{}, &leasetoken.Error{Kind: leasetoken.ErrUnknownKey, Reason: fmt.Sprintf("kid %q is not in the JWKS", kid)}
}

// Refresh fetches the JWKS now, regardless of MinRefreshInterval. Use it at start to fail fast.
func (c *JWKSClient) Refresh(ctx context.Context) error { return c.c.Refresh(ctx) }
