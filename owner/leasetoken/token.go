// Package leasetoken makes and checks lease tokens: the JWTs tablease gives the holder of a lease
// so that someone other than tablease — an application backend, through package guard — can tell
// offline that a request comes from the tab that holds the lease, and at which epoch.
//
// # Tokens
//
// A lease token is a JWS in compact form, signed with EdDSA (Ed25519) by default or ES256, with
// the header {"alg", "kid", "typ": "tablease-lease+jwt"} and the claims
//
//	iss    tablease's issuer name (configured)
//	sub    the user the lease belongs to
//	sid    the session
//	tab    the holding tab
//	epoch  the fencing token of the grant (an integer below 2^53)
//	iat    when it was issued
//	exp    when the lease expires, as the store granted it
//
// The explicit typ (RFC 8725 §3.11) keeps a lease token from being taken for any other JWT signed
// with the same key and vice versa. A token proves that the tab held the lease at that epoch until
// exp; it does not prove that the epoch is still current. Whoever needs that asks tablease
// (/lease/check) or fences its writes with the epoch (docs/fencing.md).
//
// # Keys
//
// Keys are named by their RFC 7638 thumbprint (kid). A KeySet has one active signing key and the
// public keys still published; after a rotation, the old public key stays published and accepted
// for RetireAfter, which must outlast every token it signed. Signing and verifying go through
// golang-jwt with the algorithms pinned: the verifier picks the key by kid and requires the
// token's alg to be that key's algorithm, so "none", HS256 and algorithm confusion are refused.
package leasetoken

import (
	"context"
	"crypto"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/tablease/tablease/internal/jsontext"
	"github.com/tablease/tablease/internal/jwks"
	"github.com/tablease/tablease/internal/jwtparser"
	"github.com/tablease/tablease/internal/numericdate"
	"github.com/tablease/tablease/internal/verifiedtokens"
	"github.com/tablease/tablease/lease"
)

// TokenType is the typ header of every lease token.
const TokenType = "tablease-lease+jwt"

// MaxTokenLen bounds the length of a token the verifier reads at all.
const MaxTokenLen = 4096

// Sentinel errors. Verify returns *Error values that match them with errors.Is; every verification
// failure except ErrKeysUnavailable also matches ErrTokenInvalid, so a caller that only needs
// "refuse" checks that one.
var (
	// ErrTokenInvalid: malformed, wrongly signed, of the wrong type or algorithm, wrong issuer,
	// missing or malformed claims.
	ErrTokenInvalid = errors.New("leasetoken: invalid token")
	// ErrTokenExpired: correctly signed, but exp has passed (beyond the leeway).
	ErrTokenExpired = errors.New("leasetoken: token expired")
	// ErrUnknownKey: the kid names no key the verifier knows (never published, or retired).
	ErrUnknownKey = errors.New("leasetoken: unknown key")
	// ErrKeysUnavailable: the verifier could not get the keys to check with (JWKS unreachable).
	// Not a decision about the token.
	ErrKeysUnavailable = errors.New("leasetoken: keys unavailable")
)

// Error is a verification failure: Kind is one of the sentinels, Reason says why.
type Error struct {
	Kind   error
	Reason string
	Err    error // the underlying error, if any
}

func (e *Error) Error() string {
	msg := e.Kind.Error()
	if e.Reason != "" {
		msg += ": " + e.Reason
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is matches Kind, and ErrTokenInvalid for every kind but ErrKeysUnavailable.
func (e *Error) Is(target error) bool {
	return target == e.Kind || (target == ErrTokenInvalid && e.Kind != ErrKeysUnavailable)
}

// Unwrap exposes the underlying error.
func (e *Error) Unwrap() error { return e.Err }

// Claims are the claims of a lease token.
type Claims struct {
	Issuer    string    // iss
	Subject   string    // sub: the user
	Session   string    // sid
	Tab       string    // tab: the holding tab
	Epoch     int64     // epoch: the fencing token
	IssuedAt  time.Time // iat
	ExpiresAt time.Time // exp: the lease's expiry
}

// ClaimsFor are the claims of a token for the holder of l, issued at the store time l.Now and
// expiring with the lease. The Signer fills in the issuer.
func ClaimsFor(l lease.Lease) Claims {
	return Claims{
		Subject:   l.Key.User,
		Session:   l.Key.Session,
		Tab:       l.Holder.TabID,
		Epoch:     l.Epoch,
		IssuedAt:  l.Now,
		ExpiresAt: l.ExpiresAt,
	}
}

// times are the iat and exp a token of c carries: NumericDates of whole seconds here, rounded
// down, which keeps exp within the lease; a lease with less than a second left gets an iat one
// second before its exp rather than none.
func (c Claims) times() (iat, exp time.Time) {
	iat, exp = c.IssuedAt.Truncate(time.Second), c.ExpiresAt.Truncate(time.Second)
	if !exp.After(iat) {
		iat = exp.Add(-time.Second)
	}
	return iat, exp
}

// Key is the lease key the claims are about.
func (c Claims) Key() lease.Key { return lease.Key{User: c.Subject, Session: c.Session} }

// validate checks what every token must carry, on both sides.
func (c Claims) validate() error {
	if c.Issuer == "" {
		return errors.New("iss is missing")
	}
	for _, f := range []struct{ name, v string }{{"sub", c.Subject}, {"sid", c.Session}, {"tab", c.Tab}} {
		if err := lease.ValidateID(f.name, f.v); err != nil {
			return err
		}
	}
	if err := lease.ValidateEpoch(c.Epoch); err != nil {
		return err
	}
	if c.IssuedAt.IsZero() {
		return errors.New("iat is missing")
	}
	if c.ExpiresAt.IsZero() {
		return errors.New("exp is missing")
	}
	if !c.ExpiresAt.After(c.IssuedAt) {
		return errors.New("exp must be after iat")
	}
	return nil
}

// wireClaims is the JSON payload.
type wireClaims struct {
	jwt.RegisteredClaims
	Sid   string `json:"sid"`
	Tab   string `json:"tab"`
	Epoch int64  `json:"epoch"`
}

// UnmarshalJSON reads the claims, refusing an exp or iat that is not a JSON number
// (numericdate.Check), and text that is not UTF-8, a claim given twice or named in another case
// (jsontext.Token).
func (w *wireClaims) UnmarshalJSON(b []byte) error {
	if err := numericdate.Check(b); err != nil {
		return err
	}
	if err := jsontext.Token(b, jsontext.Fields(w)); err != nil {
		return err
	}
	type plain wireClaims // without this method
	return json.Unmarshal(b, (*plain)(w))
}

// Validate is called by golang-jwt after the signature and the registered claims checked out.
func (w wireClaims) Validate() error { return w.claims().validate() }

func (w wireClaims) claims() Claims {
	c := Claims{Issuer: w.Issuer, Subject: w.Subject, Session: w.Sid, Tab: w.Tab, Epoch: w.Epoch}
	if w.IssuedAt != nil {
		c.IssuedAt = w.IssuedAt.Time
	}
	if w.ExpiresAt != nil {
		c.ExpiresAt = w.ExpiresAt.Time
	}
	return c
}

// Signer signs lease tokens with the active key of a KeySet.
type Signer struct {
	keys   *KeySet
	issuer string
	// payloadHead starts the JSON payload of every token: {"iss":<issuer, as encoding/json
	// writes it>,"sub":" (appendPayload).
	payloadHead string
}

// NewSigner makes a Signer that signs as issuer with the active key of keys.
func NewSigner(keys *KeySet, issuer string) (*Signer, error) {
	if keys == nil {
		return nil, errors.New("leasetoken: NewSigner needs a key set")
	}
	if issuer == "" {
		return nil, errors.New("leasetoken: NewSigner needs an issuer")
	}
	iss, _ := json.Marshal(issuer) // a string: no error
	return &Signer{keys: keys, issuer: issuer, payloadHead: `{"iss":` + string(iss) + `,"sub":"`}, nil
}

// Sign signs c with the active key. An empty Issuer is the signer's; another one is an error.
// Times are written in whole seconds, truncated, so a token never outlives its lease.
// Sub, sid and tab must be valid identifiers (lease.ValidateID), the epoch in [1, 2^53), and
// exp after iat.
func (s *Signer) Sign(c Claims) (string, error) {
	if c.Issuer == "" {
		c.Issuer = s.issuer
	} else if c.Issuer != s.issuer {
		return "", fmt.Errorf("leasetoken: claims name issuer %q, the signer is %q", c.Issuer, s.issuer)
	}
	if err := c.validate(); err != nil {
		return "", fmt.Errorf("leasetoken: cannot sign: %w", err)
	}
	iat, exp := c.times()
	key := s.keys.Active()
	// What jwt.Token's SignedString makes of this header and these claims
	// (TestATokenIsWhatGolangJWTSigns), in one buffer: the header encoded once per key (its JSON, a
	// map, took 6 % of BenchmarkSign), the payload written as encoding/json writes wireClaims
	// (appendPayload; json.Marshal and the strings between the parts were a fifth of Sign's CPU in
	// a server under load, perf).
	var payload [payloadMax]byte
	p := s.appendPayload(payload[:0], c, iat, exp)
	tok := make([]byte, 0, len(key.header)+1+base64.RawURLEncoding.EncodedLen(len(p))+1+maxSignatureB64)
	tok = append(append(tok, key.header...), '.')
	tok = base64.RawURLEncoding.AppendEncode(tok, p)
	var sig []byte
	var err error
	if key.pub.alg == AlgEdDSA {
		// golang-jwt's EdDSA method is the signer's Sign of the signing input, pure Ed25519.
		sig, err = key.signer.Sign(nil, tok, crypto.Hash(0))
	} else {
		sig, err = signingMethod(key.pub).Sign(string(tok), key.signer)
	}
	if err != nil {
		return "", fmt.Errorf("leasetoken: sign: %w", err)
	}
	tok = base64.RawURLEncoding.AppendEncode(append(tok, '.'), sig)
	return string(tok), nil
}

// payloadMax holds the payload of most tokens on the stack (a longer one grows on the heap), and
// maxSignatureB64 is an Ed25519 or ES256 signature (64 bytes) in unpadded base64url.
const (
	payloadMax      = 512
	maxSignatureB64 = 86
)

// appendPayload appends the JSON payload of the claims c, issued at iat and expiring at exp (whole
// seconds), as encoding/json writes wireClaims for them (FuzzPayloadIsWhatEncodingJSONWrites): its
// issuer is the signer's (payloadHead), and identifiers (lease.ValidateID) hold no character that
// JSON escapes.
func (s *Signer) appendPayload(b []byte, c Claims, iat, exp time.Time) []byte {
	b = append(append(b, s.payloadHead...), c.Subject...)
	b = strconv.AppendInt(append(b, `","exp":`...), exp.Unix(), 10)
	b = strconv.AppendInt(append(b, `,"iat":`...), iat.Unix(), 10)
	b = append(append(b, `,"sid":"`...), c.Session...)
	b = append(append(b, `","tab":"`...), c.Tab...)
	b = strconv.AppendInt(append(b, `","epoch":`...), c.Epoch, 10)
	return append(b, '}')
}

// signingMethod is golang-jwt's method of the algorithm of pub.
func signingMethod(pub PublicKey) jwt.SigningMethod {
	if pub.alg == AlgES256 {
		return jwt.SigningMethodES256
	}
	return jwt.SigningMethodEdDSA
}

// tokenHeader is the header segment of the tokens signed with the private half of pub:
// {"alg", "kid", "typ": TokenType} as golang-jwt encodes a token's header (the JSON of a map, its
// keys in order, in unpadded base64url).
func tokenHeader(pub PublicKey) string {
	h, _ := json.Marshal(map[string]string{"alg": signingMethod(pub).Alg(), "kid": pub.kid, "typ": TokenType}) // strings: no error
	return base64.RawURLEncoding.EncodeToString(h)
}

// DefaultLeeway and MaxLeeway bound the clock skew a Verifier tolerates on exp and iat.
const (
	DefaultLeeway = 5 * time.Second
	MaxLeeway     = 30 * time.Second
)

// VerifierOptions configure a Verifier.
type VerifierOptions struct {
	// Issuer is the required iss. Required.
	Issuer string
	// Leeway is the clock skew tolerated on exp and iat; default DefaultLeeway, at most
	// MaxLeeway. A token is accepted up to Leeway after its lease expired: fence writes with the
	// epoch, do not rely on exp.
	Leeway time.Duration
	// Algorithms are the accepted algorithms; default AlgEdDSA and AlgES256. Whatever the list,
	// a token's alg must also be the algorithm of the key its kid names.
	Algorithms []string
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Verifier checks lease tokens offline against a KeySource. It remembers the tokens it found
// good (verifiedToken), so that a token checked again costs a lookup rather than a signature
// verification. It is safe for concurrent use.
type Verifier struct {
	keys     KeySource
	parser   *jwt.Parser
	issuer   string
	leeway   time.Duration
	now      func() time.Time
	verified verifiedtokens.Cache[verifiedToken]
}

// NewVerifier makes a Verifier that finds keys in keys.
func NewVerifier(keys KeySource, opts VerifierOptions) (*Verifier, error) {
	if keys == nil {
		return nil, errors.New("leasetoken: NewVerifier needs a key source")
	}
	if opts.Issuer == "" {
		return nil, errors.New("leasetoken: VerifierOptions.Issuer is required")
	}
	switch {
	case opts.Leeway < 0:
		return nil, errors.New("leasetoken: VerifierOptions.Leeway must not be negative")
	case opts.Leeway > MaxLeeway:
		return nil, fmt.Errorf("leasetoken: VerifierOptions.Leeway must be at most %s", MaxLeeway)
	case opts.Leeway == 0:
		opts.Leeway = DefaultLeeway
	}
	if opts.Algorithms == nil {
		opts.Algorithms = []string{AlgEdDSA, AlgES256}
	}
	for _, a := range opts.Algorithms {
		if a != AlgEdDSA && a != AlgES256 {
			return nil, fmt.Errorf("leasetoken: algorithm %q is not allowed for lease tokens (want EdDSA or ES256)", a)
		}
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Verifier{
		keys:   keys,
		issuer: opts.Issuer,
		leeway: opts.Leeway,
		now:    opts.Now,
		parser: jwtparser.New(
			jwt.WithValidMethods(opts.Algorithms),
			jwt.WithIssuer(opts.Issuer),
			jwt.WithExpirationRequired(),
			jwt.WithIssuedAt(),
			jwt.WithLeeway(opts.Leeway),
			jwt.WithTimeFunc(opts.Now),
		),
	}, nil
}

// lookup finds the key kid in v.keys, for a token issued at iat (nil when it says not): by when it
// was signed at the latest when the source fetches its keys (SignedKeySource). A token issued
// after now beyond the leeway is looked up as one that says not: the parser refuses it anyway.
func (v *Verifier) lookup(ctx context.Context, kid string, iat *jwt.NumericDate, now time.Time) (PublicKey, error) {
	if signed, ok := v.keys.(SignedKeySource); ok && iat != nil && !iat.After(now.Add(v.leeway)) {
		return signed.LookupKeySigned(ctx, kid, jwks.SignedBy(iat.Time, v.leeway))
	}
	return v.keys.LookupKey(ctx, kid)
}

// Verify checks token and returns its claims. Errors are *Error matching ErrTokenInvalid,
// ErrTokenExpired, ErrUnknownKey or ErrKeysUnavailable (see Error.Is). Expiry is reported only for
// a token whose signature is good, and with its claims, so that a caller can tell whose lease the
// expired token was for; with every other error the claims are zero.
func (v *Verifier) Verify(ctx context.Context, token string) (Claims, error) {
	if token == "" {
		return Claims{}, &Error{Kind: ErrTokenInvalid, Reason: "empty token"}
	}
	if len(token) > MaxTokenLen {
		return Claims{}, &Error{Kind: ErrTokenInvalid, Reason: "token too long"}
	}
	now := v.now()
	if e, ok := v.verified.Get(token, now); ok {
		if k, err := v.keys.LookupKey(ctx, e.key.kid); err == nil && sameKey(k, e.key) {
			return e.claims, nil
		}
		v.verified.Forget(token) // verified again below, as the first time
	}
	var keyErr error
	var used PublicKey // the key the token was checked with
	var w wireClaims
	_, err := v.parser.ParseWithClaims(token, &w, func(t *jwt.Token) (any, error) {
		if err := jsontext.Header(t.Raw); err != nil {
			keyErr = &Error{Kind: ErrTokenInvalid, Reason: "the header is ambiguous: " + err.Error()}
			return nil, keyErr
		}
		if typ, _ := t.Header["typ"].(string); typ != TokenType {
			keyErr = &Error{Kind: ErrTokenInvalid, Reason: fmt.Sprintf("typ must be %q", TokenType)}
			return nil, keyErr
		}
		if _, ok := t.Header["crit"]; ok { // RFC 7515 §4.1.11: extensions it does not understand
			keyErr = &Error{Kind: ErrTokenInvalid, Reason: "crit names header extensions this verifier does not understand"}
			return nil, keyErr
		}
		kid, _ := t.Header["kid"].(string)
		if kid == "" {
			keyErr = &Error{Kind: ErrTokenInvalid, Reason: "kid is missing"}
			return nil, keyErr
		}
		k, err := v.lookup(ctx, kid, w.IssuedAt, now)
		if err != nil {
			keyErr = err
			return nil, err
		}
		if t.Method.Alg() != k.Algorithm() {
			keyErr = &Error{Kind: ErrTokenInvalid, Reason: fmt.Sprintf("alg %s does not fit key %q (%s)", t.Method.Alg(), kid, k.Algorithm())}
			return nil, keyErr
		}
		used = k
		return k.Key(), nil
	})
	switch {
	case err == nil:
		c := w.claims()
		from, until := verifiedtokens.Window(w.RegisteredClaims, v.leeway)
		v.verified.Put(token, verifiedToken{claims: c, key: used}, from, until)
		return c, nil
	case keyErr != nil:
		var e *Error
		if errors.As(keyErr, &e) {
			return Claims{}, keyErr
		}
		if errors.Is(keyErr, ErrUnknownKey) {
			return Claims{}, &Error{Kind: ErrUnknownKey, Err: keyErr}
		}
		return Claims{}, &Error{Kind: ErrKeysUnavailable, Err: keyErr}
	case errors.Is(err, jwt.ErrTokenExpired):
		// Expiry is told only of a token whose other claims hold: jwt reports every claim that
		// fails, so an expired token of another issuer would read as expired, and a guard whose
		// Issuer is wrong would learn it only from tokens still valid. The claims are checked again
		// at the token's expiry, when it was not expired.
		at := w.ExpiresAt.Time
		if err := jwt.NewValidator(jwt.WithIssuer(v.issuer), jwt.WithExpirationRequired(), jwt.WithIssuedAt(),
			jwt.WithLeeway(v.leeway), jwt.WithTimeFunc(func() time.Time { return at })).Validate(w); err != nil {
			return Claims{}, &Error{Kind: ErrTokenInvalid, Err: err}
		}
		return w.claims(), &Error{Kind: ErrTokenExpired, Err: err}
	}
	return Claims{}, &Error{Kind: ErrTokenInvalid, Err: err}
}
