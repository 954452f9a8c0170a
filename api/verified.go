package api

import (
	"sync"
	"time"
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
// Two generations bound the memory: a lookup looks in the current one, then in the previous one
// (moving the token into the current); when the current one is full it becomes the previous one,
// and the one before is dropped. So at most 2 × verifiedPerGeneration tokens of at most
// verifiedMaxTokenLen bytes are kept, and a busy token is never dropped.
type verifiedTokens struct {
	mu       sync.Mutex
	cur, old map[string]verified
}

type verified struct {
	p     *Principal // never changed after verify made it
	until time.Time  // exp plus the leeway
}

// get answers the principal of token when it was verified and has not expired at now.
func (v *verifiedTokens) get(token string, now time.Time) (*Principal, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	e, ok := v.cur[token]
	if !ok {
		if e, ok = v.old[token]; !ok {
			return nil, false
		}
		delete(v.old, token)
		v.add(token, e)
	}
	if !now.Before(e.until) {
		delete(v.cur, token)
		return nil, false
	}
	return e.p, true
}

// put remembers that token was verified as p and is valid until until.
func (v *verifiedTokens) put(token string, p *Principal, until time.Time) {
	if len(token) > verifiedMaxTokenLen {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.add(token, verified{p: p, until: until})
}

func (v *verifiedTokens) add(token string, e verified) {
	if v.cur == nil || len(v.cur) >= verifiedPerGeneration {
		v.old, v.cur = v.cur, make(map[string]verified)
	}
	v.cur[token] = e
}

// len is the number of tokens remembered.
func (v *verifiedTokens) len() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.cur) + len(v.old)
}
