// Package jwk is the one place tablease handles public-key formats: it reads public and private
// keys from PEM, names a public key by its RFC 7638 JWK thumbprint, and writes JSON Web Keys
// (RFC 7517, RFC 8037) and JWK Sets, and reads them (ParseSet). Public keys are Ed25519, ECDSA on
// P-256 or RSA of MinRSABits to MaxRSABits; private keys are Ed25519 or ECDSA on P-256, and so are
// the JWKs it writes. The callers decide which of these they accept and add their own prefix to
// the errors.
package jwk

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
)

// JWS algorithms of the keys.
const (
	RS256 = "RS256" // RSA PKCS #1 v1.5 with SHA-256
	ES256 = "ES256" // ECDSA P-256 with SHA-256
	EdDSA = "EdDSA" // Ed25519
)

// MinRSABits and MaxRSABits bound the RSA moduli accepted for RS256 (a larger one only makes
// every verification slower).
const (
	MinRSABits = 2048
	MaxRSABits = 8192
)

// ErrUnsupported is returned by JWK.Decode for a key of a type, curve or algorithm it does not
// read; RFC 7517 §5 asks that such keys be skipped.
var ErrUnsupported = errors.New("unsupported JWK")

// Alg returns the JWS algorithm of key and the key itself (an *ed25519.PublicKey becomes an
// ed25519.PublicKey), or an error when the key is not supported: RS256 for RSA of at least
// MinRSABits, ES256 for ECDSA on P-256, EdDSA for Ed25519. The algorithm follows from the key type,
// so a key is only ever used with the algorithm it is meant for.
func Alg(key crypto.PublicKey) (string, crypto.PublicKey, error) {
	switch k := key.(type) {
	case *rsa.PublicKey:
		if k == nil || k.N == nil {
			return "", nil, errors.New("empty RSA key")
		}
		if k.N.BitLen() < MinRSABits || k.N.BitLen() > MaxRSABits {
			return "", nil, fmt.Errorf("RSA key of %d bits; %d to %d are accepted", k.N.BitLen(), MinRSABits, MaxRSABits)
		}
		return RS256, k, nil
	case *ecdsa.PublicKey:
		if k == nil || k.Curve != elliptic.P256() {
			return "", nil, errors.New("ECDSA keys must be on P-256 (ES256)")
		}
		return ES256, k, nil
	case ed25519.PublicKey:
		if len(k) != ed25519.PublicKeySize {
			return "", nil, errors.New("Ed25519 key of the wrong size")
		}
		return EdDSA, k, nil
	case *ed25519.PublicKey:
		if k == nil || len(*k) != ed25519.PublicKeySize {
			return "", nil, errors.New("Ed25519 key of the wrong size")
		}
		return EdDSA, *k, nil
	}
	return "", nil, fmt.Errorf("unsupported key type %T (want RSA, ECDSA P-256 or Ed25519)", key)
}

// Thumbprint is the RFC 7638 JWK thumbprint of key (SHA-256, base64url without padding): the
// hash of the key's required JWK members in lexicographic order. tablease uses it as key id.
func Thumbprint(key crypto.PublicKey) (string, error) {
	var canon string
	switch k := key.(type) {
	case *rsa.PublicKey:
		e := big.NewInt(int64(k.E)).Bytes()
		canon = fmt.Sprintf(`{"e":"%s","kty":"RSA","n":"%s"}`, b64(e), b64(k.N.Bytes()))
	case *ecdsa.PublicKey:
		x, y, err := ecXY(k)
		if err != nil {
			return "", err
		}
		canon = fmt.Sprintf(`{"crv":"P-256","kty":"EC","x":"%s","y":"%s"}`, x, y)
	case ed25519.PublicKey:
		canon = fmt.Sprintf(`{"crv":"Ed25519","kty":"OKP","x":"%s"}`, b64(k))
	default:
		return "", fmt.Errorf("unsupported key type %T", key)
	}
	sum := sha256.Sum256([]byte(canon))
	return b64(sum[:]), nil
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// ecXY returns the base64url coordinates of a P-256 key, each padded to 32 bytes.
func ecXY(k *ecdsa.PublicKey) (x, y string, err error) {
	if k.Curve != elliptic.P256() {
		return "", "", errors.New("ECDSA keys must be on P-256")
	}
	raw, err := k.Bytes() // uncompressed point: 0x04 || X || Y
	if err != nil {
		return "", "", err
	}
	return b64(raw[1:33]), b64(raw[33:65]), nil
}

// JWK is the JSON Web Key of an Ed25519 (OKP), P-256 (EC) or RSA public key, in the member order
// tablease writes (it writes only the first two). It has no member for a private part.
type JWK struct {
	Kty string `json:"kty"`
	Crv string `json:"crv,omitempty"`
	X   string `json:"x,omitempty"`
	Y   string `json:"y,omitempty"`
	N   string `json:"n,omitempty"` // RSA modulus
	E   string `json:"e,omitempty"` // RSA public exponent
	Kid string `json:"kid"`
	Alg string `json:"alg"`
	Use string `json:"use"`
}

// New builds the signing JWK ("use":"sig") of an ed25519.PublicKey or a *ecdsa.PublicKey on
// P-256, with key id kid and algorithm alg.
func New(key crypto.PublicKey, kid, alg string) (JWK, error) {
	j := JWK{Kid: kid, Alg: alg, Use: "sig"}
	switch k := key.(type) {
	case ed25519.PublicKey:
		j.Kty, j.Crv, j.X = "OKP", "Ed25519", b64(k)
	case *ecdsa.PublicKey:
		x, y, err := ecXY(k)
		if err != nil {
			return JWK{}, err
		}
		j.Kty, j.Crv, j.X, j.Y = "EC", "P-256", x, y
	default:
		return JWK{}, fmt.Errorf("unsupported key type %T (want Ed25519 or ECDSA P-256)", key)
	}
	return j, nil
}

// Decode returns the public key of an OKP Ed25519 JWK (algorithm EdDSA), an EC P-256 JWK (ES256)
// or an RSA JWK (RS256) of MinRSABits to MaxRSABits, with its algorithm. A JWK of another type or
// curve, or whose "alg" (when present) does not fit its key, fails with ErrUnsupported, and so does
// an RSA key of another size; one with malformed members with an error that names the member. It
// reads neither "kid" nor "use".
func (j JWK) Decode() (crypto.PublicKey, string, error) {
	switch {
	case j.Kty == "OKP" && j.Crv == "Ed25519" && (j.Alg == "" || j.Alg == EdDSA):
		x, err := decodeB64(j.X, ed25519.PublicKeySize)
		if err != nil {
			return nil, "", fmt.Errorf("x: %w", err)
		}
		return ed25519.PublicKey(x), EdDSA, nil
	case j.Kty == "EC" && j.Crv == "P-256" && (j.Alg == "" || j.Alg == ES256):
		x, err := decodeB64(j.X, 32)
		if err != nil {
			return nil, "", fmt.Errorf("x: %w", err)
		}
		y, err := decodeB64(j.Y, 32)
		if err != nil {
			return nil, "", fmt.Errorf("y: %w", err)
		}
		p, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), append(append([]byte{4}, x...), y...))
		if err != nil {
			return nil, "", err
		}
		return p, ES256, nil
	case j.Kty == "RSA" && (j.Alg == "" || j.Alg == RS256):
		return decodeRSA(j.N, j.E)
	case j.Alg != "":
		return nil, "", fmt.Errorf("%w: kty %q with alg %q", ErrUnsupported, j.Kty, j.Alg)
	case j.Crv != "":
		return nil, "", fmt.Errorf("%w: kty %q on curve %q", ErrUnsupported, j.Kty, j.Crv)
	}
	return nil, "", fmt.Errorf("%w: kty %q", ErrUnsupported, j.Kty)
}

// decodeRSA reads an RSA key's modulus and exponent (RFC 7518 §6.3.1: unsigned big-endian
// integers in base64url). The exponent must be odd, above 1 and below 2^31, as crypto/rsa wants.
func decodeRSA(n, e string) (crypto.PublicKey, string, error) {
	nb, err := base64.RawURLEncoding.Strict().DecodeString(n)
	if err != nil || len(nb) == 0 {
		return nil, "", errors.New("n: not base64url without padding")
	}
	eb, err := base64.RawURLEncoding.Strict().DecodeString(e)
	if err != nil || len(eb) == 0 {
		return nil, "", errors.New("e: not base64url without padding")
	}
	ev := new(big.Int).SetBytes(eb)
	if !ev.IsInt64() || ev.Int64() < 3 || ev.Int64() >= 1<<31 || ev.Bit(0) == 0 {
		return nil, "", errors.New("e: must be odd, above 1 and below 2^31")
	}
	key := &rsa.PublicKey{N: new(big.Int).SetBytes(nb), E: int(ev.Int64())}
	if bits := key.N.BitLen(); bits < MinRSABits || bits > MaxRSABits {
		return nil, "", fmt.Errorf("%w: RSA key of %d bits", ErrUnsupported, bits)
	}
	return key, RS256, nil
}

// SetKey is a key of a JWK Set, with its kid and algorithm.
type SetKey struct {
	KID string
	Alg string
	Key crypto.PublicKey
}

// Same reports whether k and o are the same key under the same kid and algorithm.
func (k SetKey) Same(o SetKey) bool {
	key, ok := k.Key.(interface{ Equal(crypto.PublicKey) bool })
	return k.KID == o.KID && k.Alg == o.Alg && ok && key.Equal(o.Key)
}

// Skipped is a member of a JWK Set that ParseSet did not keep, and why; Malformed when it would
// have been kept but for a malformed member.
type Skipped struct {
	Index     int
	KID       string
	Reason    string
	Malformed bool
}

func (s Skipped) String() string {
	kid := s.KID
	if len(kid) > 64 {
		kid = kid[:64] + "..."
	}
	return fmt.Sprintf("keys[%d] %q: %s", s.Index, kid, s.Reason)
}

// ParseSet reads a JWK Set and keeps the keys a verifier can use: those Decode reads, with a kid,
// whose "use" (if present) is "sig", and whose algorithm accept takes. It skips the others, as
// RFC 7517 §5 asks, and says why in skipped, a malformed key among them; private members are
// ignored; a kid the set names twice keeps its first key. It fails only when data is not a JWK Set.
func ParseSet(data []byte, accept func(alg string) bool) (keys []SetKey, skipped []Skipped, err error) {
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(data, &set); err != nil {
		return nil, nil, fmt.Errorf("JWKS is not valid JSON: %w", err)
	}
	if set.Keys == nil {
		return nil, nil, errors.New(`JWKS has no "keys" array`)
	}
	keys = []SetKey{}
	seen := map[string]bool{}
	for i, raw := range set.Keys {
		var j JWK
		skip := func(reason string) { skipped = append(skipped, Skipped{Index: i, KID: j.Kid, Reason: reason}) }
		if err := json.Unmarshal(raw, &j); err != nil {
			skip("not a JWK") // a member of another type: not a key we use
			continue
		}
		switch {
		case j.Kid == "":
			skip("no kid")
			continue
		case j.Use != "" && j.Use != "sig":
			skip(fmt.Sprintf("use %q", j.Use))
			continue
		case seen[j.Kid]:
			skip("its kid is given before")
			continue
		}
		key, alg, err := j.Decode()
		switch {
		case errors.Is(err, ErrUnsupported):
			skip(err.Error())
		case err != nil:
			skipped = append(skipped, Skipped{Index: i, KID: j.Kid, Reason: err.Error(), Malformed: true})
		case !accept(alg):
			skip(alg + " keys are not used here")
		default:
			seen[j.Kid] = true
			keys = append(keys, SetKey{KID: j.Kid, Alg: alg, Key: key})
		}
	}
	return keys, skipped, nil
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

// EncodeSet encodes keys as a JWK Set: {"keys":[…]}, with [] for no keys.
func EncodeSet(keys []JWK) []byte {
	if keys == nil {
		keys = []JWK{}
	}
	out, err := json.Marshal(struct {
		Keys []JWK `json:"keys"`
	}{keys})
	if err != nil { // cannot happen: only strings
		panic(err)
	}
	return out
}
