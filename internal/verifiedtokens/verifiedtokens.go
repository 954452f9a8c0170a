// Package verifiedtokens remembers JWTs whose signature and claims were verified, by their exact
// text, with what the verification found, while the time is within the window in which the
// verifier accepts them (Window): a client sends the same token with call after call, and
// verifying its signature is most of the cost of a call that checks it. A caller that keys its
// verification on more than the token and the time (a key set that changes) checks that too on
// each hit. Only good tokens are put: a refusal is decided again every time.
//
// Two generations of PerGeneration tokens (package generations) bound the memory and keep the
// tokens in use; tokens over MaxTokenLen bytes are never remembered.
package verifiedtokens

import (
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/tablease/tablease/internal/generations"
)

// Bounds of the tokens a Cache remembers.
const (
	PerGeneration = 4096 // tokens per generation: at most twice as many are remembered
	MaxTokenLen   = 2048 // longer tokens are verified every time, never remembered
)

// Cache remembers verified tokens and what their verification found (V). The zero value is empty
// and ready; it is safe for concurrent use.
type Cache[V any] struct {
	m generations.Map[string, entry[V]]
}

type entry[V any] struct {
	v           V
	from, until time.Time
}

// Get answers what the verification of token found when it is remembered and now is within its
// window; a token past its window is forgotten.
func (c *Cache[V]) Get(token string, now time.Time) (V, bool) {
	e, ok := c.m.Get(token, PerGeneration)
	if ok && !now.Before(e.from) && now.Before(e.until) {
		return e.v, true
	}
	if ok {
		c.m.Delete(token)
	}
	var zero V
	return zero, false
}

// Put remembers that token was verified as v, accepted from from until until (exclusive).
func (c *Cache[V]) Put(token string, v V, from, until time.Time) {
	if len(token) <= MaxTokenLen {
		c.m.Put(token, entry[V]{v: v, from: from, until: until}, PerGeneration)
	}
}

// Forget drops token.
func (c *Cache[V]) Forget(token string) { c.m.Delete(token) }

// Len is the number of tokens remembered.
func (c *Cache[V]) Len() int { return c.m.Len() }

// Window is when golang-jwt accepts a token of those claims with that leeway: from the later of
// its iat and nbf less the leeway (from the zero time without either) until its exp plus the
// leeway, exclusive (iat, nbf and exp as jwt.WithIssuedAt, nbf and exp are checked).
func Window(c jwt.RegisteredClaims, leeway time.Duration) (from, until time.Time) {
	if c.IssuedAt != nil {
		from = c.IssuedAt.Time
	}
	if c.NotBefore != nil && c.NotBefore.After(from) {
		from = c.NotBefore.Time
	}
	if !from.IsZero() {
		from = from.Add(-leeway)
	}
	return from, c.ExpiresAt.Add(leeway)
}
