package leasetoken

import (
	"github.com/tablease/tablease/internal/jwk"
)

// verifiedToken is what a Verifier remembers of a token it found good (package verifiedtokens,
// while the parser would accept it): its claims, and the key that verified it, which must still
// be the one its kid names in the KeySource when the token is answered from memory, so that a key
// retired or withdrawn refuses its tokens as before. A holder sends the same token with every
// mutation and strict check until it renews past half the token's life (Reuse), and checking its
// signature is nearly all the cost of a verification (an Ed25519 verification takes some 60 µs).
type verifiedToken struct {
	claims Claims
	key    PublicKey
}

// sameKey reports whether a and b are the same public key under the same kid and algorithm.
func sameKey(a, b PublicKey) bool {
	return jwk.SetKey{KID: a.kid, Alg: a.alg, Key: a.key}.Same(jwk.SetKey{KID: b.kid, Alg: b.alg, Key: b.key})
}
