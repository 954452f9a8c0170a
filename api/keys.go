package api

import (
	"crypto"
	"fmt"

	"github.com/tablease/tablease/internal/jwk"
)

// PublicKey verifies access tokens signed with RS256 (*rsa.PublicKey, at least 2048 bits), ES256
// (*ecdsa.PublicKey on P-256) or EdDSA (ed25519.PublicKey). A token names its key with the `kid`
// header; the algorithm follows from the key type, so a token can only be verified with the
// algorithm its key is meant for.
type PublicKey struct {
	KID string
	Key crypto.PublicKey
}

// ParsePublicKeysPEM reads the public keys of a PEM file: blocks of type PUBLIC KEY (PKIX),
// RSA PUBLIC KEY (PKCS #1) or CERTIFICATE. A block's kid is its "kid" PEM header when it has one,
// and otherwise the key's RFC 7638 JWK thumbprint (base64url SHA-256). Private keys and other
// blocks are errors, so that a misplaced private key is noticed.
func ParsePublicKeysPEM(data []byte) ([]PublicKey, error) {
	keys, err := jwk.ParsePublicKeysPEM(data)
	if err != nil {
		return nil, fmt.Errorf("api: %w", err)
	}
	out := make([]PublicKey, len(keys))
	for i, k := range keys {
		out[i] = PublicKey(k)
	}
	return out, nil
}
