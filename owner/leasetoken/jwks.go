package leasetoken

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
)

// jwk is the JSON Web Key (RFC 7517, RFC 8037 for OKP) of a public key. It has no member for a
// private part.
type jwk struct {
	Kty string `json:"kty"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Y   string `json:"y,omitempty"`
	Kid string `json:"kid"`
	Alg string `json:"alg"`
	Use string `json:"use"`
}

// thumbprintInput is the RFC 7638 input: the required members only, in lexicographic order
// (encoding/json writes struct fields in declaration order, which is that order here).
func (k PublicKey) thumbprintInput() any {
	switch p := k.key.(type) {
	case ed25519.PublicKey:
		return struct {
			Crv string `json:"crv"`
			Kty string `json:"kty"`
			X   string `json:"x"`
		}{"Ed25519", "OKP", b64(p)}
	case *ecdsa.PublicKey:
		x, y := ecXY(p)
		return struct {
			Crv string `json:"crv"`
			Kty string `json:"kty"`
			X   string `json:"x"`
			Y   string `json:"y"`
		}{"P-256", "EC", x, y}
	}
	return nil
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// ecXY returns the base64url coordinates of a P-256 key, each padded to 32 bytes.
func ecXY(p *ecdsa.PublicKey) (x, y string) {
	raw, err := p.Bytes() // 0x04 || X || Y; checked valid by NewPublicKey
	if err != nil || len(raw) != 65 {
		return "", ""
	}
	return b64(raw[1:33]), b64(raw[33:])
}

func (k PublicKey) jwk() jwk {
	j := jwk{Kid: k.kid, Alg: k.alg, Use: "sig"}
	switch p := k.key.(type) {
	case ed25519.PublicKey:
		j.Kty, j.Crv, j.X = "OKP", "Ed25519", b64(p)
	case *ecdsa.PublicKey:
		j.Kty, j.Crv = "EC", "P-256"
		j.X, j.Y = ecXY(p)
	}
	return j
}

// MarshalJSON encodes the key as a JWK: {"kty","crv","x"[,"y"],"kid","alg","use":"sig"}.
func (k PublicKey) MarshalJSON() ([]byte, error) {
	if k.IsZero() {
		return nil, errors.New("leasetoken: no key")
	}
	return json.Marshal(k.jwk())
}

// EncodeJWKS encodes keys as a JWK Set: {"keys":[…]}, public parts only.
func EncodeJWKS(keys []PublicKey) []byte {
	set := struct {
		Keys []jwk `json:"keys"`
	}{Keys: make([]jwk, 0, len(keys))}
	for _, k := range keys {
		if !k.IsZero() {
			set.Keys = append(set.Keys, k.jwk())
		}
	}
	out, err := json.Marshal(set)
	if err != nil { // cannot happen: only strings
		panic(err)
	}
	return out
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
		var j jwk
		if err := json.Unmarshal(raw, &j); err != nil {
			continue // a member of another type: not a key we use
		}
		if j.Kid == "" || (j.Use != "" && j.Use != "sig") || seen[j.Kid] {
			continue
		}
		var pub PublicKey
		switch {
		case j.Kty == "OKP" && j.Crv == "Ed25519" && (j.Alg == "" || j.Alg == AlgEdDSA):
			x, err := decodeB64(j.X, ed25519.PublicKeySize)
			if err != nil {
				return nil, fmt.Errorf("leasetoken: JWKS keys[%d] %q: x: %w", i, j.Kid, err)
			}
			pub = PublicKey{key: ed25519.PublicKey(x), alg: AlgEdDSA}
		case j.Kty == "EC" && j.Crv == "P-256" && (j.Alg == "" || j.Alg == AlgES256):
			x, err := decodeB64(j.X, 32)
			if err != nil {
				return nil, fmt.Errorf("leasetoken: JWKS keys[%d] %q: x: %w", i, j.Kid, err)
			}
			y, err := decodeB64(j.Y, 32)
			if err != nil {
				return nil, fmt.Errorf("leasetoken: JWKS keys[%d] %q: y: %w", i, j.Kid, err)
			}
			p, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), append(append([]byte{4}, x...), y...))
			if err != nil {
				return nil, fmt.Errorf("leasetoken: JWKS keys[%d] %q: %w", i, j.Kid, err)
			}
			pub = PublicKey{key: p, alg: AlgES256}
		default:
			continue
		}
		pub.kid = j.Kid
		seen[j.Kid] = true
		out = append(out, pub)
	}
	return out, nil
}

func decodeB64(s string, size int) ([]byte, error) {
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil {
		return nil, errors.New("not base64url without padding")
	}
	if len(b) != size {
		return nil, fmt.Errorf("must be %d bytes, not %d", size, len(b))
	}
	return bytes.Clone(b), nil
}
