package api

import (
	"time"

	"github.com/tablease/tablease/internal/generations"
)

// Bounds of the verified tokens remembered (see verifiedTokens).
const (
	verifiedPerGeneration = 4096 // tokens per generation: at most twice as many are remembered
	verifiedMaxTokenLen   = 2048 // longer tokens are verified every time, never remembered
)

// verifiedTokens remembers the principal of each access token verified recently, by the token's
// exact text, until the token expires (its exp plus the leeway: when the parser would refuse it
// too). A tab sends the same token with every renew and check for the token's life, and parsing
// it (base64, JSON, the HMAC) was the largest cost of a renew in tablease; a token remembered is
// one whose signature and claims were checked, and nothing in a principal can change before the
// token expires, since the keys and accepted issuers are fixed at start.
//
// Two generations of verifiedPerGeneration tokens (package generations) bound the memory and keep
// the tokens in use; tokens over verifiedMaxTokenLen bytes are never remembered. The zero value is
// empty and ready.
type verifiedTokens struct {
	m generations.Map[string, verified]
}

type verified struct {
	p     *Principal // never changed after verify made it
	until time.Time  // exp plus the leeway
}

// get answers the principal of token when it was verified and has not expired at now.
func (v *verifiedTokens) get(token string, now time.Time) (*Principal, bool) {
	e, ok := v.m.Get(token, verifiedPerGeneration)
	if !ok {
		return nil, false
	}
	if !now.Before(e.until) {
		v.m.Delete(token)
		return nil, false
	}
	return e.p, true
}

// put remembers that token was verified as p and is valid until until.
func (v *verifiedTokens) put(token string, p *Principal, until time.Time) {
	if len(token) <= verifiedMaxTokenLen {
		v.m.Put(token, verified{p: p, until: until}, verifiedPerGeneration)
	}
}

// len is the number of tokens remembered.
func (v *verifiedTokens) len() int { return v.m.Len() }
