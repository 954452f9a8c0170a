package jwk

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"strings"
	"testing"
)

func TestParsePublicKeysPEM(t *testing.T) {
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	edPub, _, _ := ed25519.GenerateKey(rand.Reader)
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ec384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	smallRSA, _ := rsa.GenerateKey(rand.Reader, 1024)
	pkix := func(k any, headers map[string]string) string {
		der, err := x509.MarshalPKIXPublicKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Headers: headers, Bytes: der}))
	}
	pkcs1 := string(pem.EncodeToMemory(&pem.Block{Type: "RSA PUBLIC KEY", Bytes: x509.MarshalPKCS1PublicKey(&rsaKey.PublicKey)}))
	private := string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte("x")}))
	edThumb, _ := Thumbprint(edPub)

	t.Run("keys of every supported type are read with their kids", func(t *testing.T) {
		keys, err := ParsePublicKeysPEM([]byte(pkix(&rsaKey.PublicKey, map[string]string{"kid": "rsa-1"}) + pkix(edPub, nil) + pkix(&ecKey.PublicKey, map[string]string{"kid": "ec-1"})))
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) != 3 || keys[0].KID != "rsa-1" || keys[1].KID != edThumb || keys[2].KID != "ec-1" {
			t.Fatalf("keys = %+v", keys)
		}
	})
	t.Run("a PKCS #1 RSA key is read", func(t *testing.T) {
		if keys, err := ParsePublicKeysPEM([]byte(pkcs1)); err != nil || len(keys) != 1 {
			t.Fatalf("keys %v, err %v", keys, err)
		}
	})
	for _, tt := range []struct {
		name, pem, want string
	}{
		{"a private key is refused", private, "not a public key"},
		{"an empty file is refused", "", "no PEM"},
		{"text after the keys is refused", pkix(edPub, nil) + "garbage", "after the last"},
		{"a P-384 key is refused", pkix(&ec384.PublicKey, nil), "P-256"},
		{"a 1024-bit RSA key is refused", pkix(&smallRSA.PublicKey, nil), "2048"},
		{"two keys with one kid are refused", pkix(edPub, nil) + pkix(edPub, nil), "twice"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParsePublicKeysPEM([]byte(tt.pem))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one saying %q", err, tt.want)
			}
		})
	}
}

func TestParseOnePEMKey(t *testing.T) {
	edPub, edPriv, _ := ed25519.GenerateKey(rand.Reader)
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must := func(der []byte, err error) []byte {
		if err != nil {
			t.Fatal(err)
		}
		return der
	}
	block := func(typ string, der []byte) []byte { return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}) }
	pkcs8 := block("PRIVATE KEY", must(x509.MarshalPKCS8PrivateKey(edPriv)))
	sec1 := block("EC PRIVATE KEY", must(x509.MarshalECPrivateKey(ecKey)))
	pub := block("PUBLIC KEY", must(x509.MarshalPKIXPublicKey(edPub)))

	if k, err := ParsePrivateKeyPEM(pkcs8); err != nil || !edPriv.Equal(k) {
		t.Fatalf("PKCS #8: %v", err)
	}
	if k, err := ParsePrivateKeyPEM(sec1); err != nil || !ecKey.Equal(k) {
		t.Fatalf("SEC 1: %v", err)
	}
	if k, err := ParsePublicKeyPEM(pub); err != nil || !edPub.Equal(k) {
		t.Fatalf("PKIX: %v", err)
	}
	if _, err := ParsePublicKeyPEM(pkcs8); !errors.Is(err, ErrNotPublicKey) {
		t.Fatalf("a private key as public key: %v", err)
	}
	for _, tt := range []struct {
		name string
		fn   func([]byte) (any, error)
		data []byte
		want string
	}{
		{"a private key that is not PEM", func(b []byte) (any, error) { return ParsePrivateKeyPEM(b) }, []byte("hello"), "no PEM block found"},
		{"a public key as private key", func(b []byte) (any, error) { return ParsePrivateKeyPEM(b) }, pub, `PEM block "PUBLIC KEY" is not a private key`},
		{"a private key of garbage", func(b []byte) (any, error) { return ParsePrivateKeyPEM(b) }, block("PRIVATE KEY", []byte{1, 2, 3}), "parse PRIVATE KEY: "},
		{"an encrypted PKCS #8 key", func(b []byte) (any, error) { return ParsePrivateKeyPEM(b) }, block("ENCRYPTED PRIVATE KEY", []byte{1, 2, 3}),
			`PEM block "ENCRYPTED PRIVATE KEY" is an encrypted key, which is not supported: decrypt it first (openssl pkey -in encrypted.pem -out key.pem)`},
		{"a key under OpenSSL's legacy encryption", func(b []byte) (any, error) { return ParsePrivateKeyPEM(b) },
			pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Headers: map[string]string{"Proc-Type": "4,ENCRYPTED", "DEK-Info": "AES-128-CBC,00112233445566778899AABBCCDDEEFF"}, Bytes: []byte{1, 2, 3}}),
			`PEM block "EC PRIVATE KEY" is an encrypted key, which is not supported`},
		{"a public key that is not PEM", func(b []byte) (any, error) { return ParsePublicKeyPEM(b) }, []byte("hello"), "no PEM block found"},
		{"a public key of garbage", func(b []byte) (any, error) { return ParsePublicKeyPEM(b) }, block("PUBLIC KEY", []byte{1, 2, 3}), "parse PUBLIC KEY: "},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := tt.fn(tt.data); err == nil || !strings.HasPrefix(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one starting %q", err, tt.want)
			}
		})
	}
}
