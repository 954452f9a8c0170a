package api

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"strings"
)

// minRSABits is the smallest RSA modulus accepted for RS256.
const minRSABits = 2048

// PublicKey verifies access tokens signed with RS256 (*rsa.PublicKey, at least 2048 bits), ES256
// (*ecdsa.PublicKey on P-256) or EdDSA (ed25519.PublicKey). A token names its key with the `kid`
// header; the algorithm follows from the key type, so a token can only be verified with the
// algorithm its key is meant for.
type PublicKey struct {
	KID string
	Key crypto.PublicKey
}

// keyAlg returns the JWS algorithm of key, or an error when the key is not supported.
func keyAlg(key crypto.PublicKey) (string, crypto.PublicKey, error) {
	switch k := key.(type) {
	case *rsa.PublicKey:
		if k == nil || k.N == nil {
			return "", nil, errors.New("empty RSA key")
		}
		if k.N.BitLen() < minRSABits {
			return "", nil, fmt.Errorf("RSA key of %d bits; at least %d are required", k.N.BitLen(), minRSABits)
		}
		return "RS256", k, nil
	case *ecdsa.PublicKey:
		if k == nil || k.Curve != elliptic.P256() {
			return "", nil, errors.New("ECDSA keys must be on P-256 (ES256)")
		}
		return "ES256", k, nil
	case ed25519.PublicKey:
		if len(k) != ed25519.PublicKeySize {
			return "", nil, errors.New("Ed25519 key of the wrong size")
		}
		return "EdDSA", k, nil
	case *ed25519.PublicKey:
		if k == nil || len(*k) != ed25519.PublicKeySize {
			return "", nil, errors.New("Ed25519 key of the wrong size")
		}
		return "EdDSA", *k, nil
	}
	return "", nil, fmt.Errorf("unsupported key type %T (want RSA, ECDSA P-256 or Ed25519)", key)
}

// ParsePublicKeysPEM reads the public keys of a PEM file: blocks of type PUBLIC KEY (PKIX),
// RSA PUBLIC KEY (PKCS #1) or CERTIFICATE. A block's kid is its "kid" PEM header when it has one,
// and otherwise the key's RFC 7638 JWK thumbprint (base64url SHA-256). Private keys and other
// blocks are errors, so that a misplaced private key is noticed.
func ParsePublicKeysPEM(data []byte) ([]PublicKey, error) {
	var keys []PublicKey
	seen := make(map[string]bool)
	for n := 1; ; n++ {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		var (
			key crypto.PublicKey
			err error
		)
		switch block.Type {
		case "PUBLIC KEY":
			key, err = x509.ParsePKIXPublicKey(block.Bytes)
		case "RSA PUBLIC KEY":
			key, err = x509.ParsePKCS1PublicKey(block.Bytes)
		case "CERTIFICATE":
			var cert *x509.Certificate
			if cert, err = x509.ParseCertificate(block.Bytes); err == nil {
				key = cert.PublicKey
			}
		default:
			return nil, fmt.Errorf("api: PEM block %d: type %q is not a public key", n, block.Type)
		}
		if err != nil {
			return nil, fmt.Errorf("api: PEM block %d: %w", n, err)
		}
		if _, key, err = keyAlg(key); err != nil {
			return nil, fmt.Errorf("api: PEM block %d: %w", n, err)
		}
		kid := strings.TrimSpace(block.Headers["kid"])
		if kid == "" {
			if kid, err = Thumbprint(key); err != nil {
				return nil, fmt.Errorf("api: PEM block %d: %w", n, err)
			}
		}
		if seen[kid] {
			return nil, fmt.Errorf("api: PEM block %d: kid %q appears twice", n, kid)
		}
		seen[kid] = true
		keys = append(keys, PublicKey{KID: kid, Key: key})
	}
	if len(keys) == 0 {
		return nil, errors.New("api: no PEM public key found")
	}
	if len(bytesTrim(data)) > 0 {
		return nil, errors.New("api: data after the last PEM block is not PEM")
	}
	return keys, nil
}

func bytesTrim(b []byte) string { return strings.TrimSpace(string(b)) }

// Thumbprint is the RFC 7638 JWK thumbprint of key (SHA-256, base64url without padding).
func Thumbprint(key crypto.PublicKey) (string, error) {
	b64 := func(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }
	var canon string
	switch k := key.(type) {
	case *rsa.PublicKey:
		e := big.NewInt(int64(k.E)).Bytes()
		canon = fmt.Sprintf(`{"e":"%s","kty":"RSA","n":"%s"}`, b64(e), b64(k.N.Bytes()))
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() {
			return "", errors.New("ECDSA keys must be on P-256")
		}
		raw, err := k.Bytes() // uncompressed point: 0x04 || X || Y
		if err != nil {
			return "", err
		}
		canon = fmt.Sprintf(`{"crv":"P-256","kty":"EC","x":"%s","y":"%s"}`, b64(raw[1:33]), b64(raw[33:65]))
	case ed25519.PublicKey:
		canon = fmt.Sprintf(`{"crv":"Ed25519","kty":"OKP","x":"%s"}`, b64(k))
	default:
		return "", fmt.Errorf("unsupported key type %T", key)
	}
	sum := sha256.Sum256([]byte(canon))
	return b64(sum[:]), nil
}
