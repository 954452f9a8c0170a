package jwk

import (
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
)

// ErrNotPublicKey is the error, wrapped, of a PEM block that does not hold a public key.
var ErrNotPublicKey = errors.New("not a public key")

// Key is a public key with its key id.
type Key struct {
	KID string
	Key crypto.PublicKey
}

// ParsePublicKeysPEM reads the public keys of a PEM file: blocks of type PUBLIC KEY (PKIX),
// RSA PUBLIC KEY (PKCS #1) or CERTIFICATE, each a key Alg accepts, returned in the form Alg
// returns. A block's kid is its "kid" PEM header when it has one, and otherwise the key's
// Thumbprint. Private keys and other blocks are errors (wrapping ErrNotPublicKey), so that a
// misplaced private key is noticed; so are two blocks with one kid, no block at all, and text
// after the last block.
func ParsePublicKeysPEM(data []byte) ([]Key, error) {
	var keys []Key
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
			return nil, fmt.Errorf("PEM block %d: type %q is %w", n, block.Type, ErrNotPublicKey)
		}
		if err != nil {
			return nil, fmt.Errorf("PEM block %d: %w", n, err)
		}
		if _, key, err = Alg(key); err != nil {
			return nil, fmt.Errorf("PEM block %d: %w", n, err)
		}
		kid := strings.TrimSpace(block.Headers["kid"])
		if kid == "" {
			if kid, err = Thumbprint(key); err != nil {
				return nil, fmt.Errorf("PEM block %d: %w", n, err)
			}
		}
		if seen[kid] {
			return nil, fmt.Errorf("PEM block %d: kid %q appears twice", n, kid)
		}
		seen[kid] = true
		keys = append(keys, Key{KID: kid, Key: key})
	}
	if len(keys) == 0 {
		return nil, errors.New("no PEM public key found")
	}
	if strings.TrimSpace(string(data)) != "" {
		return nil, errors.New("data after the last PEM block is not PEM")
	}
	return keys, nil
}

// ParsePublicKeyPEM reads the first PEM block of data as a PUBLIC KEY (PKIX). A block of another
// type is an error wrapping ErrNotPublicKey.
func ParsePublicKeyPEM(data []byte) (crypto.PublicKey, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM block found")
	}
	if block.Type != "PUBLIC KEY" {
		return nil, fmt.Errorf("PEM block %q is %w", block.Type, ErrNotPublicKey)
	}
	pub, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse PUBLIC KEY: %w", err)
	}
	return pub, nil
}

// ParsePrivateKeyPEM reads the first PEM block of data as a private key: "PRIVATE KEY" (PKCS #8,
// as `openssl genpkey` writes) or "EC PRIVATE KEY" (SEC 1). It returns the key x509 parses; the
// caller checks its type.
func ParsePrivateKeyPEM(data []byte) (crypto.PrivateKey, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM block found")
	}
	if block.Type == "ENCRYPTED PRIVATE KEY" || strings.Contains(block.Headers["Proc-Type"], "ENCRYPTED") {
		// PKCS #8 encrypted (openssl genpkey with a cipher) or the legacy encryption header of
		// OpenSSL's PEM: there is no passphrase to ask for.
		return nil, fmt.Errorf("PEM block %q is an encrypted key, which is not supported: decrypt it first (openssl pkey -in encrypted.pem -out key.pem)", block.Type)
	}
	var (
		priv crypto.PrivateKey
		err  error
	)
	switch block.Type {
	case "PRIVATE KEY":
		priv, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		priv, err = x509.ParseECPrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf("PEM block %q is not a private key (want \"PRIVATE KEY\" or \"EC PRIVATE KEY\")", block.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", block.Type, err)
	}
	return priv, nil
}
