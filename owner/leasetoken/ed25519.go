package leasetoken

import (
	"bytes"
	"crypto"
	"crypto/ed25519"
	"crypto/fips140"
	"errors"
	"io"

	voied "github.com/oasisprotocol/curve25519-voi/primitives/ed25519"
)

// ed25519Signer signs with curve25519-voi's Ed25519 (the Ed25519 of CometBFT and Oasis Core),
// which makes the same signatures as crypto/ed25519, byte for byte (Ed25519 signatures are
// deterministic, RFC 8032 §5.1.6), in half the time: its fixed-base multiplication uses larger
// precomputed tables and an AVX2 backend where the CPU has one. A grant signs a token every time,
// and the signature was 26–30 % of tablease's CPU per acquire and release (README, Cost per
// operation). Verification stays crypto/ed25519's (golang-jwt's).
//
// It is a crypto.Signer, asked for pure Ed25519 (crypto.Hash(0)) of a token's signing input, as
// golang-jwt's EdDSA method asks it (Signer.Sign in token.go calls it so itself); Public answers
// the ed25519.PublicKey that method checks for.
type ed25519Signer struct {
	pub ed25519.PublicKey
	key voied.PrivateKey
}

func (s ed25519Signer) Public() crypto.PublicKey { return s.pub }

func (s ed25519Signer) Sign(_ io.Reader, message []byte, opts crypto.SignerOpts) ([]byte, error) {
	if opts.HashFunc() != crypto.Hash(0) {
		return nil, errors.New("leasetoken: Ed25519 signs the message itself, not a digest")
	}
	return voied.Sign(s.key, message), nil
}

// ed25519Probe is what newEd25519Signer signs with both implementations before it answers a signer.
var ed25519Probe = []byte("tablease lease token signer probe")

// newEd25519Signer is the signer of the Ed25519 key priv: ed25519Signer, once it signed a probe
// as crypto/ed25519 does; crypto/ed25519 itself in FIPS 140-3 mode (GODEBUG=fips140=on), whose
// module the other is not part of.
func newEd25519Signer(priv ed25519.PrivateKey) (crypto.Signer, error) {
	if fips140.Enabled() {
		return priv, nil
	}
	s := ed25519Signer{pub: priv.Public().(ed25519.PublicKey), key: voied.PrivateKey(priv)}
	got, err := s.Sign(nil, ed25519Probe, crypto.Hash(0))
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(got, ed25519.Sign(priv, ed25519Probe)) {
		return nil, errors.New("leasetoken: curve25519-voi's Ed25519 signature differs from crypto/ed25519's")
	}
	return s, nil
}
