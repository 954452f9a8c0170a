package leasetoken_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/owner/leasetoken"
)

const issuer = "https://tablease.test"

var t0 = time.Date(2026, 12, 2, 13, 0, 0, 0, time.UTC)

// clock is a settable clock shared by a KeySet and a Verifier.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Set(t time.Time)     { c.mu.Lock(); defer c.mu.Unlock(); c.now = t }
func (c *clock) Add(d time.Duration) { c.Set(c.Now().Add(d)) }

type fixture struct {
	clock    *clock
	key      leasetoken.SigningKey
	keys     *leasetoken.KeySet
	signer   *leasetoken.Signer
	verifier *leasetoken.Verifier
}

func newFixture(t *testing.T, key leasetoken.SigningKey) *fixture {
	t.Helper()
	f := &fixture{clock: &clock{now: t0}, key: key}
	var err error
	if f.key.IsZero() {
		if f.key, err = leasetoken.GenerateKey(); err != nil {
			t.Fatal(err)
		}
	}
	if f.keys, err = leasetoken.NewKeySet(f.key, leasetoken.KeySetOptions{RetireAfter: 5 * time.Minute, Now: f.clock.Now}); err != nil {
		t.Fatal(err)
	}
	if f.signer, err = leasetoken.NewSigner(f.keys, issuer); err != nil {
		t.Fatal(err)
	}
	if f.verifier, err = leasetoken.NewVerifier(f.keys, leasetoken.VerifierOptions{Issuer: issuer, Leeway: time.Second, Now: f.clock.Now}); err != nil {
		t.Fatal(err)
	}
	return f
}

func claims(now time.Time, ttl time.Duration) leasetoken.Claims {
	return leasetoken.Claims{Subject: "user-1", Session: "doc-42", Tab: "t-9f2c", Epoch: 1764680400123456, IssuedAt: now, ExpiresAt: now.Add(ttl)}
}

func (f *fixture) sign(t *testing.T, c leasetoken.Claims) string {
	t.Helper()
	tok, err := f.signer.Sign(c)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestSignVerifyRoundTrip(t *testing.T) {
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	es256, err := leasetoken.NewSigningKey(ec)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []leasetoken.SigningKey{{}, es256} {
		f := newFixture(t, key)
		t.Run(f.key.Algorithm(), func(t *testing.T) {
			want := claims(t0.Add(300*time.Millisecond), 45*time.Second)
			tok := f.sign(t, want)
			got, err := f.verifier.Verify(context.Background(), tok)
			if err != nil {
				t.Fatalf("Verify: %v", err)
			}
			want.Issuer = issuer
			want.IssuedAt = want.IssuedAt.Truncate(time.Second)
			want.ExpiresAt = want.ExpiresAt.Truncate(time.Second)
			if !got.IssuedAt.Equal(want.IssuedAt) || !got.ExpiresAt.Equal(want.ExpiresAt) {
				t.Fatalf("times: got %v..%v, want %v..%v", got.IssuedAt, got.ExpiresAt, want.IssuedAt, want.ExpiresAt)
			}
			got.IssuedAt, got.ExpiresAt, want.IssuedAt, want.ExpiresAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}
			if got != want {
				t.Fatalf("claims: got %+v, want %+v", got, want)
			}
			header, payload := decodeParts(t, tok)
			if header["typ"] != leasetoken.TokenType || header["kid"] != f.key.KeyID() || header["alg"] != f.key.Algorithm() {
				t.Fatalf("header %v", header)
			}
			if _, ok := payload["epoch"].(float64); !ok {
				t.Fatalf("epoch is not a JSON number: %v", payload["epoch"])
			}
		})
	}
}

// A token is what golang-jwt's SignedString makes of the same header and claims (Sign encodes the
// header once per key): an Ed25519 signature is deterministic, so the two are the same text.
func TestATokenIsWhatGolangJWTSigns(t *testing.T) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	key, err := leasetoken.NewSigningKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, key)
	c := claims(t0.Add(300*time.Millisecond), 45*time.Second)
	type wireClaims struct {
		jwt.RegisteredClaims
		Sid   string `json:"sid"`
		Tab   string `json:"tab"`
		Epoch int64  `json:"epoch"`
	}
	want := jwt.NewWithClaims(jwt.SigningMethodEdDSA, wireClaims{
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer:    issuer,
			Subject:   c.Subject,
			IssuedAt:  jwt.NewNumericDate(c.IssuedAt.Truncate(time.Second)),
			ExpiresAt: jwt.NewNumericDate(c.ExpiresAt.Truncate(time.Second)),
		},
		Sid: c.Session, Tab: c.Tab, Epoch: c.Epoch,
	})
	want.Header["kid"], want.Header["typ"] = key.KeyID(), leasetoken.TokenType
	wantTok, err := want.SignedString(priv)
	if err != nil {
		t.Fatal(err)
	}
	if got := f.sign(t, c); got != wantTok {
		t.Fatalf("Sign = %s\nwant %s (golang-jwt's SignedString)", got, wantTok)
	}
}

func TestALeaseWithLessThanASecondLeftGetsAToken(t *testing.T) {
	f := newFixture(t, leasetoken.SigningKey{})
	now := t0.Add(200 * time.Millisecond)
	f.clock.Set(now)
	tok := f.sign(t, claims(now, 500*time.Millisecond))
	c, err := f.verifier.Verify(context.Background(), tok)
	if err != nil {
		t.Fatal(err)
	}
	if !c.ExpiresAt.Equal(t0) || !c.IssuedAt.Equal(t0.Add(-time.Second)) {
		t.Fatalf("iat %v exp %v", c.IssuedAt, c.ExpiresAt)
	}
}

func TestClaimsForALease(t *testing.T) {
	l := lease.Lease{Key: lease.Key{User: "u", Session: "s"}, Held: true, Holder: lease.Holder{TabID: "t"}, Epoch: 9, Now: t0, ExpiresAt: t0.Add(45 * time.Second)}
	c := leasetoken.ClaimsFor(l)
	if c.Subject != "u" || c.Session != "s" || c.Tab != "t" || c.Epoch != 9 || !c.IssuedAt.Equal(t0) || !c.ExpiresAt.Equal(l.ExpiresAt) {
		t.Fatalf("ClaimsFor = %+v", c)
	}
	if c.Key() != l.Key {
		t.Fatalf("Key = %v", c.Key())
	}
}

func TestSignRefusesBadClaims(t *testing.T) {
	f := newFixture(t, leasetoken.SigningKey{})
	for name, mutate := range map[string]func(*leasetoken.Claims){
		"an empty sub":            func(c *leasetoken.Claims) { c.Subject = "" },
		"a sid with a slash":      func(c *leasetoken.Claims) { c.Session = "a/b" },
		"no tab":                  func(c *leasetoken.Claims) { c.Tab = "" },
		"epoch zero":              func(c *leasetoken.Claims) { c.Epoch = 0 },
		"an epoch beyond 2^53":    func(c *leasetoken.Claims) { c.Epoch = lease.MaxEpoch },
		"no expiry":               func(c *leasetoken.Claims) { c.ExpiresAt = time.Time{} },
		"expiry before issue":     func(c *leasetoken.Claims) { c.ExpiresAt = c.IssuedAt.Add(-time.Second) },
		"another signer's issuer": func(c *leasetoken.Claims) { c.Issuer = "someone-else" },
	} {
		t.Run(name, func(t *testing.T) {
			c := claims(t0, time.Minute)
			mutate(&c)
			if tok, err := f.signer.Sign(c); err == nil {
				t.Fatalf("Sign accepted %+v: %s", c, tok)
			}
		})
	}
}

func decodeParts(t *testing.T, tok string) (header, payload map[string]any) {
	t.Helper()
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		t.Fatalf("token %q has %d parts", tok, len(parts))
	}
	for i, dst := range []*map[string]any{&header, &payload} {
		raw, err := base64.RawURLEncoding.DecodeString(parts[i])
		if err != nil {
			t.Fatal(err)
		}
		d := json.NewDecoder(strings.NewReader(string(raw)))
		if err := d.Decode(dst); err != nil {
			t.Fatal(err)
		}
	}
	return header, payload
}

func encodePart(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

func TestVerifyRefuses(t *testing.T) {
	f := newFixture(t, leasetoken.SigningKey{})
	good := f.sign(t, claims(t0, time.Minute))
	parts := strings.Split(good, ".")
	header, payload := decodeParts(t, good)

	withPayload := func(change func(map[string]any)) string {
		p := map[string]any{}
		for k, v := range payload {
			p[k] = v
		}
		change(p)
		return parts[0] + "." + encodePart(t, p) + "." + parts[2]
	}
	withHeader := func(change func(map[string]any)) string {
		h := map[string]any{}
		for k, v := range header {
			h[k] = v
		}
		change(h)
		return encodePart(t, h) + "." + parts[1] + "." + parts[2]
	}
	sig := []byte(parts[2])
	sig[5] ^= 1
	if sig[5] == '-' || sig[5] == '_' || sig[5] > 'z' {
		sig[5] = 'A'
	}

	// A correctly signed token with whatever claims and header: what an attacker who had the key
	// could not make, but a confused issuer could.
	signedWith := func(method jwt.SigningMethod, key any, hdr map[string]any, c jwt.MapClaims) string {
		tok := jwt.NewWithClaims(method, c)
		for k, v := range hdr {
			tok.Header[k] = v
		}
		s, err := tok.SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	okClaims := func() jwt.MapClaims {
		return jwt.MapClaims{"iss": issuer, "sub": "user-1", "sid": "doc-42", "tab": "t", "epoch": 5, "iat": t0.Unix(), "exp": t0.Add(time.Minute).Unix()}
	}
	priv := func() ed25519.PrivateKey {
		der, err := f.key.MarshalPEM()
		if err != nil {
			t.Fatal(err)
		}
		block, _ := pem.Decode(der)
		k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		return k.(ed25519.PrivateKey)
	}()
	// signedParts signs the header and payload as written, for what a map cannot hold (a claim
	// twice); signedRaw, the payload under the usual header.
	signedParts := func(header, payload string) string {
		signing := base64.RawURLEncoding.EncodeToString([]byte(header)) + "." + base64.RawURLEncoding.EncodeToString([]byte(payload))
		sig, err := jwt.SigningMethodEdDSA.Sign(signing, priv)
		if err != nil {
			t.Fatal(err)
		}
		return signing + "." + base64.RawURLEncoding.EncodeToString(sig)
	}
	rawHeader := fmt.Sprintf(`{"alg":"EdDSA","kid":%q,"typ":%q`, f.key.KeyID(), leasetoken.TokenType)
	signedRaw := func(payload string) string { return signedParts(rawHeader+"}", payload) }
	rawClaims := fmt.Sprintf(`{"iss":%q,"sub":"user-1","sid":"doc-42","tab":"t","epoch":5,"iat":%d,"exp":%d`, issuer, t0.Unix(), t0.Add(time.Minute).Unix())
	pubBytes := []byte(f.key.Public().Key().(ed25519.PublicKey))
	kidHdr := map[string]any{"kid": f.key.KeyID(), "typ": leasetoken.TokenType}
	otherKey, _ := leasetoken.GenerateKey()

	tests := []struct {
		name  string
		token string
		want  error
	}{
		{"an empty token", "", leasetoken.ErrTokenInvalid},
		{"garbage", "not.a.token", leasetoken.ErrTokenInvalid},
		{"a huge token", strings.Repeat("a", 5000), leasetoken.ErrTokenInvalid},
		{"a tampered epoch", withPayload(func(p map[string]any) { p["epoch"] = 1764680400123457 }), leasetoken.ErrTokenInvalid},
		{"a tampered sub", withPayload(func(p map[string]any) { p["sub"] = "user-2" }), leasetoken.ErrTokenInvalid},
		{"a tampered and expired token", withPayload(func(p map[string]any) { p["exp"] = t0.Add(-time.Hour).Unix() }), leasetoken.ErrTokenInvalid},
		{"a tampered signature", parts[0] + "." + parts[1] + "." + string(sig), leasetoken.ErrTokenInvalid},
		{"no signature", parts[0] + "." + parts[1] + ".", leasetoken.ErrTokenInvalid},
		{"alg none", withHeader(func(h map[string]any) { h["alg"] = "none" }), leasetoken.ErrTokenInvalid},
		{"alg none, unsigned", encodePart(t, map[string]any{"alg": "none", "kid": f.key.KeyID(), "typ": leasetoken.TokenType}) + "." + parts[1] + ".", leasetoken.ErrTokenInvalid},
		{"HS256 with the public key as secret", signedWith(jwt.SigningMethodHS256, pubBytes, kidHdr, okClaims()), leasetoken.ErrTokenInvalid},
		{"HS256 with the JWKS x as secret", signedWith(jwt.SigningMethodHS256, []byte(base64.RawURLEncoding.EncodeToString(pubBytes)), kidHdr, okClaims()), leasetoken.ErrTokenInvalid},
		{"a wrong typ", signedWith(jwt.SigningMethodEdDSA, priv, map[string]any{"kid": f.key.KeyID(), "typ": "JWT"}, okClaims()), leasetoken.ErrTokenInvalid},
		{"no kid", signedWith(jwt.SigningMethodEdDSA, priv, map[string]any{"typ": leasetoken.TokenType}, okClaims()), leasetoken.ErrTokenInvalid},
		{"a crit extension (RFC 7515 §4.1.11: not understood, so refused)", signedWith(jwt.SigningMethodEdDSA, priv,
			map[string]any{"kid": f.key.KeyID(), "typ": leasetoken.TokenType, "crit": []string{"exp-ext"}, "exp-ext": true}, okClaims()), leasetoken.ErrTokenInvalid},
		{"an unknown kid", withHeader(func(h map[string]any) { h["kid"] = otherKey.KeyID() }), leasetoken.ErrUnknownKey},
		{"a key we do not know", signedWith(jwt.SigningMethodEdDSA, mustPriv(t, otherKey), map[string]any{"kid": otherKey.KeyID(), "typ": leasetoken.TokenType}, okClaims()), leasetoken.ErrUnknownKey},
		{"another key under our kid", signedWith(jwt.SigningMethodEdDSA, mustPriv(t, otherKey), kidHdr, okClaims()), leasetoken.ErrTokenInvalid},
		{"a wrong issuer", signedWith(jwt.SigningMethodEdDSA, priv, kidHdr, with(okClaims(), "iss", "https://evil.test")), leasetoken.ErrTokenInvalid},
		{"no exp", signedWith(jwt.SigningMethodEdDSA, priv, kidHdr, with(okClaims(), "exp", nil)), leasetoken.ErrTokenInvalid},
		{"no iat", signedWith(jwt.SigningMethodEdDSA, priv, kidHdr, with(okClaims(), "iat", nil)), leasetoken.ErrTokenInvalid},
		{"an iat in the future", signedWith(jwt.SigningMethodEdDSA, priv, kidHdr, with(okClaims(), "iat", t0.Add(10*time.Second).Unix())), leasetoken.ErrTokenInvalid},
		{"no sid", signedWith(jwt.SigningMethodEdDSA, priv, kidHdr, with(okClaims(), "sid", nil)), leasetoken.ErrTokenInvalid},
		{"an exp as a string", signedWith(jwt.SigningMethodEdDSA, priv, kidHdr, with(okClaims(), "exp", strconv.FormatInt(t0.Add(time.Minute).Unix(), 10))), leasetoken.ErrTokenInvalid},
		{"an iat as a string", signedWith(jwt.SigningMethodEdDSA, priv, kidHdr, with(okClaims(), "iat", strconv.FormatInt(t0.Unix(), 10))), leasetoken.ErrTokenInvalid},
		{"an epoch as a string", signedWith(jwt.SigningMethodEdDSA, priv, kidHdr, with(okClaims(), "epoch", "5")), leasetoken.ErrTokenInvalid},
		{"a fractional epoch", signedWith(jwt.SigningMethodEdDSA, priv, kidHdr, with(okClaims(), "epoch", 5.5)), leasetoken.ErrTokenInvalid},
		{"a negative epoch", signedWith(jwt.SigningMethodEdDSA, priv, kidHdr, with(okClaims(), "epoch", -1)), leasetoken.ErrTokenInvalid},
		{"an epoch of 2^53", signedWith(jwt.SigningMethodEdDSA, priv, kidHdr, with(okClaims(), "epoch", int64(1)<<53)), leasetoken.ErrTokenInvalid},
		{"an expired token", signedWith(jwt.SigningMethodEdDSA, priv, kidHdr, expired(okClaims())), leasetoken.ErrTokenExpired},
		{"an expired token of a wrong issuer", signedWith(jwt.SigningMethodEdDSA, priv, kidHdr, with(expired(okClaims()), "iss", "https://evil.test")), leasetoken.ErrTokenInvalid},
		{"an expired token without a sid", signedWith(jwt.SigningMethodEdDSA, priv, kidHdr, with(expired(okClaims()), "sid", nil)), leasetoken.ErrTokenInvalid},
		{"an expired token issued after its expiry", signedWith(jwt.SigningMethodEdDSA, priv, kidHdr, with(okClaims(), "exp", t0.Add(-2*time.Second).Unix())), leasetoken.ErrTokenInvalid},
		{"an epoch given twice", signedRaw(rawClaims + `,"epoch":6}`), leasetoken.ErrTokenInvalid},
		{"a sid beside SID", signedRaw(rawClaims + `,"SID":"doc-43"}`), leasetoken.ErrTokenInvalid},
		{"a null nbf", signedRaw(rawClaims + `,"nbf":null}`), leasetoken.ErrTokenInvalid},
		{"claims that are not UTF-8", signedRaw(rawClaims + ",\"x\":\"\xff\"}"), leasetoken.ErrTokenInvalid},
		{"claims that escape a lone surrogate", signedRaw(rawClaims + `,"x":"\ud800"}`), leasetoken.ErrTokenInvalid},
		{"a header that names alg twice", signedParts(`{"alg":"none",`+rawHeader[1:]+"}", rawClaims+"}"), leasetoken.ErrTokenInvalid},
		{"a header that names kid beside KID", signedParts(rawHeader+`,"KID":"x"}`, rawClaims+"}"), leasetoken.ErrTokenInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := f.verifier.Verify(context.Background(), tt.token)
			t.Log(err)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Verify = %v, want %v", err, tt.want)
			}
			if !errors.Is(err, leasetoken.ErrTokenInvalid) {
				t.Fatalf("%v does not match ErrTokenInvalid", err)
			}
			if tt.want == leasetoken.ErrTokenInvalid && (errors.Is(err, leasetoken.ErrTokenExpired) || errors.Is(err, leasetoken.ErrUnknownKey)) {
				t.Fatalf("%v matches a more specific error than %v", err, tt.want)
			}
		})
	}
	// The good token itself passes, so the refusals above are about what was changed.
	if _, err := f.verifier.Verify(context.Background(), good); err != nil {
		t.Fatal(err)
	}
	if _, err := f.verifier.Verify(context.Background(), signedWith(jwt.SigningMethodEdDSA, priv, kidHdr, okClaims())); err != nil {
		t.Fatal(err)
	}
}

// expired is c issued a minute before t0 and expired two seconds before it.
func expired(c jwt.MapClaims) jwt.MapClaims {
	return with(with(c, "iat", t0.Add(-time.Minute).Unix()), "exp", t0.Add(-2*time.Second).Unix())
}

func with(c jwt.MapClaims, k string, v any) jwt.MapClaims {
	if v == nil {
		delete(c, k)
	} else {
		c[k] = v
	}
	return c
}

func mustPriv(t *testing.T, k leasetoken.SigningKey) any {
	t.Helper()
	p, err := k.MarshalPEM()
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(p)
	priv, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return priv
}

func TestExpiryAndLeeway(t *testing.T) {
	f := newFixture(t, leasetoken.SigningKey{})
	tok := f.sign(t, claims(t0, 10*time.Second))
	f.clock.Set(t0.Add(10*time.Second + 900*time.Millisecond)) // within the 1 s leeway
	if _, err := f.verifier.Verify(context.Background(), tok); err != nil {
		t.Fatalf("within the leeway: %v", err)
	}
	f.clock.Set(t0.Add(11*time.Second + time.Millisecond))
	_, err := f.verifier.Verify(context.Background(), tok)
	if !errors.Is(err, leasetoken.ErrTokenExpired) {
		t.Fatalf("after exp+leeway: %v, want ErrTokenExpired", err)
	}
}

func TestESAndEdDSAAreNotInterchangeable(t *testing.T) {
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	es, _ := leasetoken.NewSigningKey(ec)
	f := newFixture(t, es)
	// An EdDSA-only verifier refuses ES256 tokens even from a key it publishes.
	v, err := leasetoken.NewVerifier(f.keys, leasetoken.VerifierOptions{Issuer: issuer, Algorithms: []string{leasetoken.AlgEdDSA}, Now: f.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(context.Background(), f.sign(t, claims(t0, time.Minute))); !errors.Is(err, leasetoken.ErrTokenInvalid) {
		t.Fatalf("ES256 token on an EdDSA-only verifier: %v", err)
	}
	// A token whose alg header does not fit the key its kid names is refused.
	tok := jwt.NewWithClaims(jwt.SigningMethodEdDSA, jwt.MapClaims{"iss": issuer, "sub": "u", "sid": "s", "tab": "t", "epoch": 1, "iat": t0.Unix(), "exp": t0.Add(time.Minute).Unix()})
	tok.Header["kid"], tok.Header["typ"] = es.KeyID(), leasetoken.TokenType
	_, edPriv, _ := ed25519.GenerateKey(rand.Reader)
	s, _ := tok.SignedString(edPriv)
	if _, err := f.verifier.Verify(context.Background(), s); !errors.Is(err, leasetoken.ErrTokenInvalid) || !strings.Contains(err.Error(), "does not fit key") {
		t.Fatalf("EdDSA token under an ES256 kid: %v", err)
	}
}

func TestVerifierOptions(t *testing.T) {
	f := newFixture(t, leasetoken.SigningKey{})
	for name, opts := range map[string]leasetoken.VerifierOptions{
		"no issuer":      {},
		"a huge leeway":  {Issuer: issuer, Leeway: time.Minute},
		"HS256 allowed":  {Issuer: issuer, Algorithms: []string{"HS256"}},
		"a negative one": {Issuer: issuer, Leeway: -time.Second},
	} {
		if _, err := leasetoken.NewVerifier(f.keys, opts); err == nil {
			t.Errorf("NewVerifier accepted %s", name)
		}
	}
	if _, err := leasetoken.NewSigner(f.keys, ""); err == nil {
		t.Error("NewSigner accepted no issuer")
	}
	if _, err := leasetoken.NewKeySet(leasetoken.SigningKey{}, leasetoken.KeySetOptions{}); err == nil {
		t.Error("NewKeySet accepted no key")
	}
}

func TestKeysUnavailableIsNotInvalid(t *testing.T) {
	f := newFixture(t, leasetoken.SigningKey{})
	v, err := leasetoken.NewVerifier(downSource{}, leasetoken.VerifierOptions{Issuer: issuer, Now: f.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	_, err = v.Verify(context.Background(), f.sign(t, claims(t0, time.Minute)))
	if !errors.Is(err, leasetoken.ErrKeysUnavailable) || errors.Is(err, leasetoken.ErrTokenInvalid) {
		t.Fatalf("Verify = %v, want ErrKeysUnavailable only", err)
	}
}

type downSource struct{}

func (downSource) LookupKey(context.Context, string) (leasetoken.PublicKey, error) {
	return leasetoken.PublicKey{}, errors.New("connection refused")
}

func TestPEM(t *testing.T) {
	dir := t.TempDir()
	key, _ := leasetoken.GenerateKey()
	p, err := key.MarshalPEM()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "lease.pem")
	if err := os.WriteFile(path, p, 0o600); err != nil {
		t.Fatal(err)
	}
	loaded, err := leasetoken.LoadPrivateKeyFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if loaded.KeyID() != key.KeyID() || loaded.Algorithm() != leasetoken.AlgEdDSA {
		t.Fatalf("loaded %v, want %v", loaded, key)
	}

	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	sec1, _ := x509.MarshalECPrivateKey(ec)
	es, err := leasetoken.ParsePrivateKeyPEM(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: sec1}))
	if err != nil || es.Algorithm() != leasetoken.AlgES256 {
		t.Fatalf("SEC 1 P-256: %v %v", es, err)
	}

	pubPEM, _ := key.Public().MarshalPEM()
	pub, err := leasetoken.ParsePublicKeyPEM(pubPEM)
	if err != nil || pub.KeyID() != key.KeyID() {
		t.Fatalf("public PEM: %v %v", pub.KeyID(), err)
	}
	if pub2, err := leasetoken.ParsePublicKeyPEM(p); err != nil || pub2.KeyID() != key.KeyID() {
		t.Fatalf("public half of a private PEM: %v", err)
	}

	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	der384, _ := x509.MarshalPKCS8PrivateKey(p384)
	for name, data := range map[string][]byte{
		"no PEM":      []byte("hello"),
		"a P-384 key": pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der384}),
		"a cert":      pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1}}),
		"garbage":     pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1, 2, 3}}),
	} {
		if _, err := leasetoken.ParsePrivateKeyPEM(data); err == nil {
			t.Errorf("ParsePrivateKeyPEM accepted %s", name)
		}
	}
	if _, err := leasetoken.LoadPrivateKeyFile(filepath.Join(dir, "missing.pem")); err == nil {
		t.Error("LoadPrivateKeyFile accepted a missing file")
	}
	for _, s := range []string{key.String(), key.GoString()} {
		if strings.Contains(s, base64.RawURLEncoding.EncodeToString(mustPriv(t, key).(ed25519.PrivateKey).Seed())) || !strings.Contains(s, key.KeyID()) {
			t.Errorf("String leaks or lacks the kid: %s", s)
		}
	}
}

// TestThumbprint checks the kid against the RFC 8037 appendix A.3 example.
func TestThumbprint(t *testing.T) {
	x, _ := base64.RawURLEncoding.DecodeString("11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo")
	k, err := leasetoken.NewPublicKey(ed25519.PublicKey(x))
	if err != nil {
		t.Fatal(err)
	}
	if want := "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"; k.KeyID() != want {
		t.Fatalf("kid %s, want %s", k.KeyID(), want)
	}
}
