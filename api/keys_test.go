package api

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
)

func TestThumbprintMatchesTheRFCs(t *testing.T) {
	b64 := func(s string) []byte {
		b, err := base64.RawURLEncoding.DecodeString(s)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	rsaKey := &rsa.PublicKey{
		N: new(big.Int).SetBytes(b64("0vx7agoebGcQSuuPiLJXZptN9nndrQmbXEps2aiAFbWhM78LhWx4cbbfAAtVT86zwu1RK7aPFFxuhDR1L6tSoc_BJECPebWKRXjBZCiFV4n3oknjhMstn64tZ_2W-5JsGY4Hc5n9yBXArwl93lqt7_RN5w6Cf0h4QyQ5v-65YGjQR0_FDW2QvzqY368QQMicAtaSqzs8KJZgnYb9c7d0zgdAZHzu6qMQvRL5hajrn1n91CbOpbISD08qNLyrdkt-bFTWhAI4vMQFh6WeZu0fM4lFd2NcRwr3XPksINHaQ-G_xBniIqbw0Ls1jF44-csFCur-kEgU8awapJzKnqDKgw")),
		E: 65537,
	}
	tests := []struct {
		name string
		key  any
		want string
	}{
		{"the RSA key of RFC 7638 §3.1 has its thumbprint", rsaKey, "NzbLsXh8uDCcd-6MNwXF4W_7noWXFZAfHkxZsRGC9Xs"},
		{"the Ed25519 key of RFC 8037 A.3 has its thumbprint", ed25519.PublicKey(b64("11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo")), "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Thumbprint(tt.key)
			if err != nil || got != tt.want {
				t.Fatalf("Thumbprint = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

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
		if _, err := newAuthenticator(AuthConfig{PublicKeys: keys, Issuer: "i", Audience: "a"}); err != nil {
			t.Fatalf("the keys are refused by the authenticator: %v", err)
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
