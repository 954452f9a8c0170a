package leasetoken

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/tablease/tablease/internal/jwk"
)

// Algorithms of lease tokens.
const (
	AlgEdDSA = jwk.EdDSA // Ed25519, the default
	AlgES256 = jwk.ES256 // ECDSA P-256 with SHA-256
)

// SigningKey is a private key that signs lease tokens, with its algorithm and key id. The zero
// value is not a key. It never prints its private part (String and GoString).
type SigningKey struct {
	priv   crypto.Signer // ed25519.PrivateKey or *ecdsa.PrivateKey on P-256
	signer crypto.Signer // what signs with priv: ed25519Signer for Ed25519 (ed25519.go), else priv
	pub    PublicKey
	header string // the header segment of the tokens it signs (tokenHeader)
}

// PublicKey is a public key that verifies lease tokens, with its algorithm and key id.
type PublicKey struct {
	key crypto.PublicKey // ed25519.PublicKey or *ecdsa.PublicKey on P-256
	alg string
	kid string
}

// GenerateKey makes a new Ed25519 signing key, for dev mode and tests.
func GenerateKey() (SigningKey, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return SigningKey{}, fmt.Errorf("leasetoken: generate key: %w", err)
	}
	return NewSigningKey(priv)
}

// NewSigningKey wraps an ed25519.PrivateKey (EdDSA) or an *ecdsa.PrivateKey on P-256 (ES256).
// The key id is the RFC 7638 JWK thumbprint of the public key, so every instance that loads the
// same key names it the same.
func NewSigningKey(priv crypto.PrivateKey) (SigningKey, error) {
	switch k := priv.(type) {
	case ed25519.PrivateKey:
		if len(k) != ed25519.PrivateKeySize {
			return SigningKey{}, errors.New("leasetoken: malformed Ed25519 private key")
		}
		pub, err := NewPublicKey(k.Public())
		if err != nil {
			return SigningKey{}, err
		}
		signer, err := newEd25519Signer(k)
		if err != nil {
			return SigningKey{}, err
		}
		return SigningKey{priv: k, signer: signer, pub: pub, header: tokenHeader(pub)}, nil
	case *ecdsa.PrivateKey:
		pub, err := NewPublicKey(&k.PublicKey)
		if err != nil {
			return SigningKey{}, err
		}
		return SigningKey{priv: k, signer: k, pub: pub, header: tokenHeader(pub)}, nil
	}
	return SigningKey{}, fmt.Errorf("leasetoken: unsupported private key type %T (want Ed25519 or ECDSA P-256)", priv)
}

// NewPublicKey wraps an ed25519.PublicKey (EdDSA) or an *ecdsa.PublicKey on P-256 (ES256), with
// the RFC 7638 thumbprint as key id.
func NewPublicKey(pub crypto.PublicKey) (PublicKey, error) {
	switch p := pub.(type) {
	case ed25519.PublicKey:
		if len(p) != ed25519.PublicKeySize {
			return PublicKey{}, errors.New("leasetoken: malformed Ed25519 public key")
		}
	case *ecdsa.PublicKey:
	default:
		return PublicKey{}, fmt.Errorf("leasetoken: unsupported public key type %T (want Ed25519 or ECDSA P-256)", pub)
	}
	alg, key, err := jwk.Alg(pub)
	if err != nil {
		return PublicKey{}, fmt.Errorf("leasetoken: %w", err)
	}
	kid, err := jwk.Thumbprint(key)
	if err != nil {
		return PublicKey{}, fmt.Errorf("leasetoken: malformed ECDSA public key: %w", err)
	}
	return PublicKey{key: key, alg: alg, kid: kid}, nil
}

// KeyID is the key id (the kid header of the tokens it signs).
func (k SigningKey) KeyID() string { return k.pub.kid }

// Algorithm is AlgEdDSA or AlgES256.
func (k SigningKey) Algorithm() string { return k.pub.alg }

// Public is the public half.
func (k SigningKey) Public() PublicKey { return k.pub }

// IsZero reports whether k is the zero value (no key).
func (k SigningKey) IsZero() bool { return k.priv == nil }

func (k SigningKey) String() string {
	if k.IsZero() {
		return "leasetoken.SigningKey{}"
	}
	return fmt.Sprintf("leasetoken.SigningKey{alg: %s, kid: %s}", k.pub.alg, k.pub.kid)
}

// GoString keeps %#v from printing the private key.
func (k SigningKey) GoString() string { return k.String() }

// MarshalPEM encodes the private key as a PKCS#8 "PRIVATE KEY" PEM block, the format
// ParsePrivateKeyPEM reads.
func (k SigningKey) MarshalPEM() ([]byte, error) {
	if k.IsZero() {
		return nil, errors.New("leasetoken: no key")
	}
	der, err := x509.MarshalPKCS8PrivateKey(k.priv)
	if err != nil {
		return nil, fmt.Errorf("leasetoken: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// KeyID is the key id.
func (k PublicKey) KeyID() string { return k.kid }

// Algorithm is AlgEdDSA or AlgES256.
func (k PublicKey) Algorithm() string { return k.alg }

// Key is the crypto public key: ed25519.PublicKey or *ecdsa.PublicKey.
func (k PublicKey) Key() crypto.PublicKey { return k.key }

// IsZero reports whether k is the zero value (no key).
func (k PublicKey) IsZero() bool { return k.key == nil }

// MarshalPEM encodes the public key as a PKIX "PUBLIC KEY" PEM block.
func (k PublicKey) MarshalPEM() ([]byte, error) {
	if k.IsZero() {
		return nil, errors.New("leasetoken: no key")
	}
	der, err := x509.MarshalPKIXPublicKey(k.key)
	if err != nil {
		return nil, fmt.Errorf("leasetoken: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}

// ParsePrivateKeyPEM reads the first PEM block of data: "PRIVATE KEY" (PKCS#8, Ed25519 or ECDSA
// P-256, as `openssl genpkey -algorithm ed25519` writes) or "EC PRIVATE KEY" (SEC 1, P-256).
func ParsePrivateKeyPEM(data []byte) (SigningKey, error) {
	priv, err := jwk.ParsePrivateKeyPEM(data)
	if err != nil {
		return SigningKey{}, fmt.Errorf("leasetoken: %w", err)
	}
	return NewSigningKey(priv)
}

// LoadPrivateKeyFile reads a signing key from a PEM file (see ParsePrivateKeyPEM).
func LoadPrivateKeyFile(path string) (SigningKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return SigningKey{}, fmt.Errorf("leasetoken: %w", err)
	}
	k, err := ParsePrivateKeyPEM(data)
	if err != nil {
		return SigningKey{}, fmt.Errorf("%w (in %s)", err, path)
	}
	return k, nil
}

// ParsePublicKeyPEM reads the first PEM block of data: a "PUBLIC KEY" (PKIX), or a private key
// (see ParsePrivateKeyPEM) of which it keeps the public half.
func ParsePublicKeyPEM(data []byte) (PublicKey, error) {
	pub, err := jwk.ParsePublicKeyPEM(data)
	if errors.Is(err, jwk.ErrNotPublicKey) {
		k, err := ParsePrivateKeyPEM(data)
		return k.Public(), err
	}
	if err != nil {
		return PublicKey{}, fmt.Errorf("leasetoken: %w", err)
	}
	return NewPublicKey(pub)
}

// KeySource finds the public key a token names. Implementations: *KeySet (tablease's own keys),
// PublicKeys (a fixed list), and guard.JWKSClient (tablease's JWKS over HTTP).
type KeySource interface {
	// LookupKey returns the key with id kid. It fails with an error matching ErrUnknownKey when
	// there is no such key, and ErrKeysUnavailable when the keys could not be had at all.
	LookupKey(ctx context.Context, kid string) (PublicKey, error)
}

// SignedKeySource is a KeySource that fetches its keys (guard.JWKSClient), which the Verifier
// tells when a token was signed at the latest: LookupKeySigned fails with ErrUnknownKey only when
// a set fetched after signedBy lacks kid, and with ErrKeysUnavailable while the set it has was
// fetched before (a key published since may be missing from it), so that one token gets one
// answer however often it comes.
type SignedKeySource interface {
	KeySource
	LookupKeySigned(ctx context.Context, kid string, signedBy time.Time) (PublicKey, error)
}

// PublicKeys is a fixed KeySource.
type PublicKeys []PublicKey

// LookupKey finds kid in the list.
func (ks PublicKeys) LookupKey(_ context.Context, kid string) (PublicKey, error) {
	for _, k := range ks {
		if k.kid == kid && !k.IsZero() {
			return k, nil
		}
	}
	return PublicKey{}, &Error{Kind: ErrUnknownKey, Reason: fmt.Sprintf("no key with kid %q", kid)}
}
