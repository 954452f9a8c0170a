package leasetoken

import (
	"bytes"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"os"
	"os/exec"
	"testing"
)

// The signer that signs Ed25519 lease tokens makes crypto/ed25519's signatures, byte for byte,
// for keys and messages of every length a token may have and more.
func TestTheEd25519SignerSignsAsCryptoEd25519(t *testing.T) {
	for i := range 500 {
		pub, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		s, err := newEd25519Signer(priv)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := s.(ed25519Signer); !ok {
			t.Fatalf("newEd25519Signer = %T, want ed25519Signer outside FIPS mode", s)
		}
		msg := make([]byte, i)
		rand.Read(msg)
		got, err := s.Sign(rand.Reader, msg, crypto.Hash(0))
		if err != nil {
			t.Fatal(err)
		}
		if want := ed25519.Sign(priv, msg); string(got) != string(want) {
			t.Fatalf("key %d, message of %d bytes: signature %x, crypto/ed25519's %x", i, len(msg), got, want)
		}
		if !ed25519.Verify(pub, msg, got) {
			t.Fatalf("key %d: crypto/ed25519 does not verify the signature", i)
		}
		if !s.Public().(ed25519.PublicKey).Equal(pub) {
			t.Fatalf("key %d: Public is not the key's public half", i)
		}
	}
}

// It signs messages, not digests (Ed25519ph, which golang-jwt never asks for).
func TestTheEd25519SignerRefusesADigest(t *testing.T) {
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	s, err := newEd25519Signer(priv)
	if err != nil {
		t.Fatal(err)
	}
	if sig, err := s.Sign(rand.Reader, make([]byte, 64), crypto.SHA512); err == nil {
		t.Fatalf("Sign of a SHA-512 digest = %x, want an error", sig)
	}
}

// In FIPS 140-3 mode the tokens are signed by crypto/ed25519, part of Go's FIPS module. The mode is
// chosen when a program starts, so the test runs itself again with GODEBUG=fips140=on.
func TestInFIPSModeCryptoEd25519Signs(t *testing.T) {
	if os.Getenv("LEASETOKEN_FIPS_CHILD") == "1" {
		_, priv, _ := ed25519.GenerateKey(rand.Reader)
		s, err := newEd25519Signer(priv)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := s.(ed25519.PrivateKey); !ok {
			t.Fatalf("newEd25519Signer in FIPS mode = %T, want ed25519.PrivateKey", s)
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestInFIPSModeCryptoEd25519Signs$", "-test.v")
	cmd.Env = append(os.Environ(), "LEASETOKEN_FIPS_CHILD=1", "GODEBUG=fips140=on")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the test in FIPS mode: %v\n%s", err, out)
	}
	if !bytes.Contains(out, []byte("--- PASS: TestInFIPSModeCryptoEd25519Signs")) {
		t.Fatalf("the test in FIPS mode ran nothing:\n%s", out)
	}
}
