package leasetoken

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/tablease/tablease/internal/jwk"
)

// toJWK is the JWK of the key, which NewPublicKey or ParseJWKS made.
func (k PublicKey) toJWK() jwk.JWK {
	j, err := jwk.New(k.key, k.kid, k.alg)
	if err != nil { // cannot happen: both check the key
		panic(err)
	}
	return j
}

// MarshalJSON encodes the key as a JWK: {"kty","crv","x"[,"y"],"kid","alg","use":"sig"}.
func (k PublicKey) MarshalJSON() ([]byte, error) {
	if k.IsZero() {
		return nil, errors.New("leasetoken: no key")
	}
	return json.Marshal(k.toJWK())
}

// EncodeJWKS encodes keys as a JWK Set: {"keys":[…]}, public parts only.
func EncodeJWKS(keys []PublicKey) []byte {
	set := make([]jwk.JWK, 0, len(keys))
	for _, k := range keys {
		if !k.IsZero() {
			set = append(set, k.toJWK())
		}
	}
	return jwk.EncodeSet(set)
}

// ParseJWKS reads a JWK Set. It keeps the keys it can verify lease tokens with — OKP Ed25519 and
// EC P-256 keys with a kid, whose "use" (if present) is "sig" and whose "alg" (if present) fits
// the key — and skips the others, as RFC 7517 §5 asks (jwk.ParseSet). Private members are
// ignored. A key the set names twice keeps its first entry. It fails when data is not a JWK Set or
// a usable-looking key is malformed (tablease writes none: the set is not its).
func ParseJWKS(data []byte) ([]PublicKey, error) {
	keys, skipped, err := jwk.ParseSet(data, func(alg string) bool { return alg == AlgEdDSA || alg == AlgES256 })
	if err != nil {
		return nil, fmt.Errorf("leasetoken: %w", err)
	}
	for _, s := range skipped {
		if s.Malformed {
			return nil, fmt.Errorf("leasetoken: JWKS %s", s)
		}
	}
	out := make([]PublicKey, len(keys))
	for i, k := range keys {
		out[i] = PublicKey{key: k.Key, alg: k.Alg, kid: k.KID}
	}
	return out, nil
}
