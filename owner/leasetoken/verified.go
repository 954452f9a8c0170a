package leasetoken

import (
	"crypto"
	"time"

	"github.com/tablease/tablease/internal/generations"
)

// Bounds of the tokens a Verifier remembers (see verifiedTokens).
const (
	verifiedPerGeneration = 4096 // tokens per generation: at most twice as many are remembered
	verifiedMaxTokenLen   = 2048 // longer tokens are verified every time, never remembered
)

// verifiedTokens remembers, by their exact text, the tokens a Verifier found good, with their
// claims, the key that verified them and when the parser would accept them: a holder sends the
// same token with every mutation and strict check until it renews past half the token's life
// (Reuse), and checking its signature is nearly all the cost of a verification (an Ed25519
// verification takes some 60 µs). A token remembered is answered without parsing it again while
// the time is within the window the parser checked (iat, nbf and exp, with the leeway) and its kid
// still names the same key in the KeySource; otherwise it is forgotten and verified as the first
// time, so that a key retired or withdrawn refuses its tokens as before, and an expired token gets
// the parser's own error. Only good tokens are remembered: a refusal is decided again every time.
//
// Two generations of verifiedPerGeneration tokens (package generations) bound the memory (a
// lease token is some 500 bytes) and keep the tokens in use. The zero value is empty and ready.
type verifiedTokens struct {
	m generations.Map[string, verifiedToken]
}

type verifiedToken struct {
	claims Claims
	key    PublicKey
	// from and until bound when the parser accepts the token: from max(iat, nbf) less the leeway,
	// until exp plus the leeway (exclusive).
	from, until time.Time
}

// get answers the token's entry when it was verified, and the time now is within its window.
func (v *verifiedTokens) get(token string, now time.Time) (verifiedToken, bool) {
	e, ok := v.m.Get(token, verifiedPerGeneration)
	if !ok {
		return verifiedToken{}, false
	}
	if now.Before(e.from) || !now.Before(e.until) {
		v.m.Delete(token)
		return verifiedToken{}, false
	}
	return e, true
}

// put remembers that token was verified as e.
func (v *verifiedTokens) put(token string, e verifiedToken) {
	if len(token) <= verifiedMaxTokenLen {
		v.m.Put(token, e, verifiedPerGeneration)
	}
}

// forget drops token, after its key was found withdrawn or changed.
func (v *verifiedTokens) forget(token string) { v.m.Delete(token) }

// len is the number of tokens remembered.
func (v *verifiedTokens) len() int { return v.m.Len() }

// sameKey reports whether a and b are the same public key under the same kid and algorithm.
func sameKey(a, b PublicKey) bool {
	if a.kid != b.kid || a.alg != b.alg || a.key == nil {
		return false
	}
	k, ok := a.key.(interface{ Equal(crypto.PublicKey) bool })
	return ok && k.Equal(b.key)
}
