package jwk

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
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

func TestThumbprintOfAP256KeyHashesItsRequiredMembers(t *testing.T) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	j, err := New(&key.PublicKey, "", ES256)
	if err != nil {
		t.Fatal(err)
	}
	canon, _ := json.Marshal(map[string]string{"crv": j.Crv, "kty": j.Kty, "x": j.X, "y": j.Y}) // sorted keys
	sum := sha256.Sum256(canon)
	got, err := Thumbprint(&key.PublicKey)
	if want := base64.RawURLEncoding.EncodeToString(sum[:]); err != nil || got != want {
		t.Fatalf("Thumbprint = %q, %v; want %q", got, err, want)
	}
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	if _, err := Thumbprint(&p384.PublicKey); err == nil {
		t.Fatal("a P-384 key has a thumbprint")
	}
}

func TestAlg(t *testing.T) {
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	smallRSA, _ := rsa.GenerateKey(rand.Reader, 1024)
	edPub, _, _ := ed25519.GenerateKey(rand.Reader)
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ec384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	for _, tt := range []struct {
		name string
		key  any
		want string // the algorithm, or a part of the error
	}{
		{"RSA of 2048 bits is RS256", &rsaKey.PublicKey, RS256},
		{"P-256 is ES256", &ecKey.PublicKey, ES256},
		{"Ed25519 is EdDSA", edPub, EdDSA},
		{"a pointer to an Ed25519 key is EdDSA", &edPub, EdDSA},
		{"RSA of 1024 bits is refused", &smallRSA.PublicKey, "2048"},
		{"P-384 is refused", &ec384.PublicKey, "P-256"},
		{"a short Ed25519 key is refused", ed25519.PublicKey{1}, "wrong size"},
		{"a nil ECDSA key is refused", (*ecdsa.PublicKey)(nil), "P-256"},
		{"a string is refused", "key", "unsupported key type string"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			alg, key, err := Alg(tt.key)
			if err != nil {
				if !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("err = %v, want one saying %q", err, tt.want)
				}
				return
			}
			if alg != tt.want {
				t.Fatalf("alg = %q, want %q", alg, tt.want)
			}
			if _, ok := key.(*ed25519.PublicKey); ok {
				t.Fatal("the Ed25519 key is still a pointer")
			}
		})
	}
}

func TestJWKRoundTrip(t *testing.T) {
	edPub, _, _ := ed25519.GenerateKey(rand.Reader)
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	for _, tt := range []struct {
		key       any
		alg, want string
	}{
		{edPub, EdDSA, `{"kty":"OKP","crv":"Ed25519","x":"` + base64.RawURLEncoding.EncodeToString(edPub) + `","kid":"k","alg":"EdDSA","use":"sig"}`},
		{&ecKey.PublicKey, ES256, `{"kty":"EC","crv":"P-256","x":"`},
	} {
		j, err := New(tt.key, "k", tt.alg)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := json.Marshal(j)
		if !strings.HasPrefix(string(raw), tt.want) {
			t.Fatalf("JWK %s, want %s", raw, tt.want)
		}
		key, alg, err := j.Decode()
		if err != nil || alg != tt.alg {
			t.Fatalf("Decode = %v, %q, %v", key, alg, err)
		}
		a, _ := Thumbprint(tt.key)
		b, _ := Thumbprint(key)
		if a != b {
			t.Fatalf("the decoded key differs: %s, want %s", b, a)
		}
	}
	if _, err := New("key", "k", EdDSA); err == nil {
		t.Fatal("New accepted a string")
	}
}

func TestDecodeRefuses(t *testing.T) {
	zeros := strings.Repeat("A", 43)
	for _, tt := range []struct {
		name string
		jwk  JWK
		want string // empty for ErrUnsupported
	}{
		{"an RSA key for PS256 is unsupported", JWK{Kty: "RSA", N: rsaN(2048), E: "AQAB", Alg: "PS256"}, ""},
		{"an RSA key of 1024 bits is unsupported", JWK{Kty: "RSA", N: rsaN(1024), E: "AQAB"}, ""},
		{"an RSA key of 8200 bits is unsupported", JWK{Kty: "RSA", N: rsaN(8200), E: "AQAB"}, ""},
		{"an RSA key without n", JWK{Kty: "RSA", E: "AQAB"}, "n: not base64url without padding"},
		{"an RSA key with a padded e", JWK{Kty: "RSA", N: rsaN(2048), E: "AQAB="}, "e: not base64url without padding"},
		{"an RSA key with an even e", JWK{Kty: "RSA", N: rsaN(2048), E: "AQAA"}, "e: must be odd"},
		{"an RSA key with e = 1", JWK{Kty: "RSA", N: rsaN(2048), E: "AQ"}, "e: must be odd"},
		{"an RSA key with e of 2^31+1", JWK{Kty: "RSA", N: rsaN(2048), E: "gAAAAQ"}, "e: must be odd"},
		{"an Ed25519 key for ES256 is unsupported", JWK{Kty: "OKP", Crv: "Ed25519", X: zeros, Alg: ES256}, ""},
		{"a P-384 key is unsupported", JWK{Kty: "EC", Crv: "P-384", X: zeros, Y: zeros}, ""},
		{"a short x", JWK{Kty: "OKP", Crv: "Ed25519", X: "AAAA"}, "x: must be 32 bytes, not 3"},
		{"a padded x", JWK{Kty: "OKP", Crv: "Ed25519", X: "AA=="}, "x: not base64url without padding"},
		{"a short y", JWK{Kty: "EC", Crv: "P-256", X: zeros, Y: "AAAA"}, "y: must be 32 bytes, not 3"},
		{"a point off the curve", JWK{Kty: "EC", Crv: "P-256", X: zeros, Y: zeros}, "not on curve"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := tt.jwk.Decode()
			if tt.want == "" && !errors.Is(err, ErrUnsupported) || tt.want != "" && (err == nil || errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
		})
	}
}

// rsaN is the base64url modulus of bits bits (its top bit set), for keys that are decoded only.
func rsaN(bits int) string {
	n := new(big.Int).Lsh(big.NewInt(1), uint(bits-1))
	return base64.RawURLEncoding.EncodeToString(n.Bytes())
}

func TestDecodeRSA(t *testing.T) {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	j := JWK{Kty: "RSA", N: b64(k.N.Bytes()), E: "AQAB", Alg: RS256}
	key, alg, err := j.Decode()
	if err != nil || alg != RS256 || !k.PublicKey.Equal(key) {
		t.Fatalf("Decode = %v, %q, %v", key, alg, err)
	}
	j.Alg = ""
	if _, alg, err := j.Decode(); err != nil || alg != RS256 {
		t.Fatalf("Decode without alg = %q, %v", alg, err)
	}
}

func TestParseSet(t *testing.T) {
	ed, _, _ := ed25519.GenerateKey(rand.Reader)
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	edJWK := `{"kty":"OKP","crv":"Ed25519","x":"` + b64(ed) + `"`
	rsaJWK := `{"kty":"RSA","n":"` + b64(rk.N.Bytes()) + `","e":"AQAB"`
	doc := `{"keys":[` +
		edJWK + `,"kid":"ed","use":"sig"},` +
		rsaJWK + `,"kid":"rsa","alg":"RS256","x5c":["MII..."]},` +
		rsaJWK + `,"kid":"enc","use":"enc"},` + // an encryption key: skipped
		`{"kty":"oct","k":"c2VjcmV0","kid":"hmac"},` + // a secret: skipped
		rsaJWK + `,"kid":"ps","alg":"PS256"},` + // another algorithm: skipped
		`{"kty":"RSA","n":"` + rsaN(1024) + `","e":"AQAB","kid":"weak"},` + // too small: skipped
		edJWK + `},` + // no kid: skipped
		rsaJWK + `,"kid":"ed"},` + // a kid seen: the first key stays
		rsaJWK + `,"kid":"bad","e":"AQAA"},` + // malformed: skipped, and said so
		`"not a key"]}`
	keys, skipped, err := ParseSet([]byte(doc), func(string) bool { return true })
	if err != nil || len(keys) != 2 || keys[0].KID != "ed" || keys[0].Alg != EdDSA || keys[1].KID != "rsa" || keys[1].Alg != RS256 ||
		!rk.PublicKey.Equal(keys[1].Key) {
		t.Fatalf("ParseSet = %+v, %v", keys, err)
	}
	var said []string
	for _, s := range skipped {
		said = append(said, fmt.Sprintf("%s%s", s, map[bool]string{true: " (malformed)"}[s.Malformed]))
	}
	want := []string{
		`keys[2] "enc": use "enc"`,
		`keys[3] "hmac": unsupported JWK: kty "oct"`,
		`keys[4] "ps": unsupported JWK: kty "RSA" with alg "PS256"`,
		`keys[5] "weak": unsupported JWK: RSA key of 1024 bits`,
		`keys[6] "": no kid`,
		`keys[7] "ed": its kid is given before`,
		`keys[8] "bad": e: must be odd, above 1 and below 2^31 (malformed)`,
		`keys[9] "": not a JWK`,
	}
	if strings.Join(said, "\n") != strings.Join(want, "\n") {
		t.Fatalf("skipped:\n%s\nwant:\n%s", strings.Join(said, "\n"), strings.Join(want, "\n"))
	}
	keys, _, err = ParseSet([]byte(doc), func(alg string) bool { return alg != RS256 })
	if err != nil || len(keys) != 1 || keys[0].KID != "ed" {
		t.Fatalf("ParseSet without RS256 = %+v, %v", keys, err)
	}
	if keys, _, err := ParseSet([]byte(`{"keys":[]}`), func(string) bool { return true }); err != nil || keys == nil || len(keys) != 0 {
		t.Fatalf("an empty set = %v, %v; want no keys and no error", keys, err)
	}
	for doc, want := range map[string]string{
		`{"keys":{}}`:   "JWKS is not valid JSON",
		`{"key":[]}`:    `JWKS has no "keys" array`,
		`{"keys":[]`:    "JWKS is not valid JSON",
		`{"keys":null}`: `JWKS has no "keys" array`,
	} {
		if _, _, err := ParseSet([]byte(doc), func(string) bool { return true }); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseSet(%.60s) = %v, want %q", doc, err, want)
		}
	}
}

func TestEncodeSet(t *testing.T) {
	if got := string(EncodeSet(nil)); got != `{"keys":[]}` {
		t.Fatalf("no keys: %s", got)
	}
	j := JWK{Kty: "OKP", Crv: "Ed25519", X: "x", Kid: "k", Alg: EdDSA, Use: "sig"}
	if got, want := string(EncodeSet([]JWK{j})), `{"keys":[{"kty":"OKP","crv":"Ed25519","x":"x","kid":"k","alg":"EdDSA","use":"sig"}]}`; got != want {
		t.Fatalf("EncodeSet = %s, want %s", got, want)
	}
}
