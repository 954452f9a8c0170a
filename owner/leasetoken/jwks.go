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
// the key — and skips the others, as RFC 7517 §5 asks. Private members are ignored. A key the set
// names twice keeps its first entry. It fails when data is not a JWK Set or a usable-looking key
// is malformed.
func ParseJWKS(data []byte) ([]PublicKey, error) {
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(data, &set); err != nil {
		return nil, fmt.Errorf("leasetoken: JWKS is not valid JSON: %w", err)
	}
	if set.Keys == nil {
		return nil, errors.New(`leasetoken: JWKS has no "keys" array`)
	}
	var out []PublicKey
	seen := map[string]bool{}
	for i, raw := range set.Keys {
		var j jwk.JWK
		if err := json.Unmarshal(raw, &j); err != nil {
			continue // a member of another type: not a key we use
		}
		if j.Kid == "" || (j.Use != "" && j.Use != "sig") || seen[j.Kid] {
			continue
		}
		key, alg, err := j.Decode()
		if errors.Is(err, jwk.ErrUnsupported) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("leasetoken: JWKS keys[%d] %q: %w", i, j.Kid, err)
		}
		seen[j.Kid] = true
		out = append(out, PublicKey{key: key, alg: alg, kid: j.Kid})
	}
	return out, nil
}
