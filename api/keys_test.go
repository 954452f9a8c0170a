package api

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"testing"

	"github.com/tablease/tablease/internal/jwk"
)

func TestParsePublicKeysPEM(t *testing.T) {
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	edPub, _, _ := ed25519.GenerateKey(rand.Reader)
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	var data []byte
	for _, k := range []any{&rsaKey.PublicKey, edPub, &ecKey.PublicKey} {
		der, err := x509.MarshalPKIXPublicKey(k)
		if err != nil {
			t.Fatal(err)
		}
		data = append(data, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})...)
	}

	keys, err := ParsePublicKeysPEM(data)
	if err != nil {
		t.Fatal(err)
	}
	if edThumb, _ := jwk.Thumbprint(edPub); len(keys) != 3 || keys[1].KID != edThumb {
		t.Fatalf("keys = %+v", keys)
	}
	if _, err := newAuthenticator(AuthConfig{PublicKeys: keys, Issuer: "i", Audience: "a"}, false, nil); err != nil {
		t.Fatalf("the keys are refused by the authenticator: %v", err)
	}

	private := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte("x")})
	_, err = ParsePublicKeysPEM(append(data, private...))
	if want := `api: PEM block 4: type "PRIVATE KEY" is not a public key`; err == nil || err.Error() != want {
		t.Fatalf("err = %v, want %q", err, want)
	}
	if _, err := ParsePublicKeysPEM(nil); err == nil || err.Error() != "api: no PEM public key found" {
		t.Fatalf("err = %v, want the package named", err)
	}
}
