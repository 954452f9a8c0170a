package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/labstack/echo/v4"

	"github.com/tablease/tablease/internal/jsontext"
	"github.com/tablease/tablease/internal/jwk"
	"github.com/tablease/tablease/internal/jwks"
	"github.com/tablease/tablease/internal/jwtparser"
	"github.com/tablease/tablease/internal/loglimit"
	"github.com/tablease/tablease/internal/numericdate"
	"github.com/tablease/tablease/internal/verifiedtokens"
	"github.com/tablease/tablease/lease"
)

// ScopeAdmin is the scope that admin routes require.
const ScopeAdmin = "lease:admin"

// Bounds of access tokens.
const (
	// MinHS256SecretLen is the shortest HS256 secret accepted (32 bytes).
	MinHS256SecretLen = 32
	// MaxLeeway is the largest clock leeway accepted for exp, nbf and iat.
	MaxLeeway = 30 * time.Second
	// maxAuthHeaderLen bounds the Authorization header; longer ones are refused unparsed.
	maxAuthHeaderLen = 8 << 10
	// defaultTokenTTL is the lifetime of tokens from IssueToken when TokenSpec.TTL is zero.
	defaultTokenTTL = time.Hour
)

// AuthConfig says how access tokens are verified. At least one of HS256Secret, PublicKeys and
// JWKSURL is required; Issuer and Audience are required, and tokens must carry both.
type AuthConfig struct {
	// HS256Secret verifies HS256 tokens; at least 32 bytes when set. Empty: HS256 is refused.
	HS256Secret []byte
	// PublicKeys verify RS256, ES256 and EdDSA tokens, chosen by the token's kid.
	PublicKeys []PublicKey
	// JWKSURL is the identity provider's JWK Set, whose RS256, ES256 and EdDSA keys verify the
	// tokens whose kid PublicKeys lacks: an https URL, or http to a loopback address
	// (jwks.CheckSecureURL). The set is fetched when a token names a kid it lacks (at most once
	// every JWKSMinRefresh) and behind the requests once it is JWKSMaxAge old; a token whose key
	// cannot be had yet is answered 503 AUTH_UNAVAILABLE. Call Server.FetchAccessKeys at start.
	JWKSURL string
	// Issuer is the required iss claim.
	Issuer string
	// Audience must be one of the token's aud values.
	Audience string
	// Leeway tolerates clock skew on exp, nbf and iat; at most 30s.
	Leeway time.Duration
}

// Principal is the verified caller of a request.
type Principal struct {
	Sub    string          // the token's sub: the user every lease of the request belongs to
	Scopes map[string]bool // the token's scope claim
	// Sessions is the token's sid claim: nil when the token has none (every session is allowed),
	// otherwise the only sessions allowed (an empty list allows none).
	Sessions []string
	// Expires is when the credential stops being accepted: the token's exp plus the leeway (for a
	// stream opened with a ticket, that of the token the ticket was issued to). An event stream
	// ends then.
	Expires time.Time
	// keyKept, for a token verified with a key of the JWKS of AuthConfig.JWKSURL, says whether the
	// set still names that key: an event stream opened with it ends once the key is withdrawn.
	keyKept func() bool
}

// KeyKept reports whether the key that verified the token is still accepted: always, but for a
// key of the JWKS of AuthConfig.JWKSURL that the identity provider has withdrawn since.
func (p *Principal) KeyKept() bool { return p.keyKept == nil || p.keyKept() }

// AllowsSession reports whether the token may act on session sid.
func (p *Principal) AllowsSession(sid string) bool {
	return p.Sessions == nil || slices.Contains(p.Sessions, sid)
}

// HasScope reports whether the token granted scope.
func (p *Principal) HasScope(scope string) bool { return p.Scopes[scope] }

// principalOf returns the verified caller of the request, or nil before authentication.
func principalOf(c echo.Context) *Principal {
	if s, ok := c.(*served); ok {
		return s.principal
	}
	return nil
}

// setPrincipal stores the verified caller of the request, for principalOf.
func setPrincipal(c echo.Context, p *Principal) { c.(*served).principal = p }

// accessClaims are the claims read from an access token.
type accessClaims struct {
	jwt.RegisteredClaims
	Scope scopeClaim `json:"scope"`
	SID   sidClaim   `json:"sid"`

	issuers []string // the iss values accepted (the authenticator's): Validate checks iss
}

// Validate is the parser's check of iss, beside its own of the other claims: a server accepts
// several issuers (the dev one in dev mode), which jwt.WithIssuer cannot say. Checked there, a
// wrong issuer is one of the failures the parser reports together (an expired token of another
// issuer fails for both), which tokenProblem then names in its order.
func (c *accessClaims) Validate() error {
	if !slices.Contains(c.issuers, c.Issuer) {
		return jwt.ErrTokenInvalidIssuer
	}
	return nil
}

// UnmarshalJSON reads the claims, refusing an exp, nbf or iat that is not a JSON number
// (numericdate.Check), and text that is not UTF-8, a claim given twice or named in another case
// (jsontext.Token).
func (c *accessClaims) UnmarshalJSON(b []byte) error {
	if err := numericdate.Check(b); err != nil {
		return err
	}
	if err := jsontext.Token(b, jsontext.Fields(c)); err != nil {
		return err
	}
	type plain accessClaims // without this method
	return json.Unmarshal(b, (*plain)(c))
}

// scopeClaim is the scope claim: a string of scopes separated by spaces (U+0020 alone, RFC 6749
// §3.3 and RFC 8693), or a list of scopes as some identity providers send it, each element one
// scope as it is. null is no scope.
type scopeClaim []string

func (s *scopeClaim) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*s = nil
		return nil
	}
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*s = slices.DeleteFunc(strings.Split(one, " "), func(v string) bool { return v == "" })
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return errors.New("scope must be a string or a list of strings")
	}
	*s = many
	return nil
}

// sidClaim is the sid claim: a string or a list of strings. Unlike jwt.ClaimStrings it tells an
// absent claim (every session) from an empty list (no session). A null is refused: read as absent
// it would lift the limit the claim was written to set.
type sidClaim struct {
	present bool
	values  []string
}

func (s *sidClaim) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return errors.New("sid must be a string or a list of strings, not null")
	}
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*s = sidClaim{present: true, values: []string{one}}
		return nil
	}
	many := []string{}
	if err := json.Unmarshal(b, &many); err != nil {
		return errors.New("sid must be a string or a list of strings")
	}
	*s = sidClaim{present: true, values: many}
	return nil
}

// The rhythm of fetches of AuthConfig.JWKSURL (package jwks).
const (
	JWKSMinRefresh = 10 * time.Second // the least time between two fetches
	JWKSMaxAge     = 5 * time.Minute  // a set this old is fetched again behind the requests
)

// authenticator verifies access tokens. It is immutable after newAuthenticator (jwks keeps its
// set up to date by itself).
type authenticator struct {
	secret  []byte
	keys    map[string]verifyKey     // by kid
	jwks    *jwks.Client[jwk.SetKey] // nil without AuthConfig.JWKSURL
	issuers []string                 // the iss values accepted
	methods []string                 // the alg values accepted
	leeway  time.Duration
	now     func() time.Time // the parser's clock too
	parser  *jwt.Parser
	// verified remembers the principal of each token verified recently (package verifiedtokens):
	// nothing in a principal can change before the token expires, since the accepted issuers are
	// fixed at start, and so are the keys but those of jwks, whose tokens are answered from it
	// only while their key is still the one the set names by their kid (Principal.KeyKept).
	verified verifiedtokens.Cache[*Principal]

	log           *slog.Logger
	fetchWarnings *loglimit.Limit // the failed fetches of jwks, one warning per JWKSMinRefresh
	logMu         sync.Mutex      // guards the fields below
	skipped       []string        // what the set last parsed skipped, and why
	lastKids      []string        // of the set last fetched, as logged
	lastSkipped   []string
}

type verifyKey struct {
	alg string
	key any
}

// newAuthenticator checks cfg and makes its authenticator. In dev mode tokens of DevIssuer (from
// /dev/token) are accepted besides those of cfg.Issuer; outside it, cfg.Issuer must not be
// DevIssuer.
func newAuthenticator(cfg AuthConfig, dev bool, log *slog.Logger) (*authenticator, error) {
	if len(cfg.HS256Secret) == 0 && len(cfg.PublicKeys) == 0 && cfg.JWKSURL == "" {
		return nil, errors.New("api: Auth.HS256Secret, Auth.PublicKeys or Auth.JWKSURL is required")
	}
	if n := len(cfg.HS256Secret); n > 0 && n < MinHS256SecretLen {
		return nil, fmt.Errorf("api: Auth.HS256Secret must be at least %d bytes (it has %d)", MinHS256SecretLen, n)
	}
	if strings.TrimSpace(cfg.Issuer) == "" {
		return nil, errors.New("api: Auth.Issuer is required")
	}
	if cfg.Issuer == DevIssuer && !dev {
		return nil, fmt.Errorf("api: Auth.Issuer %q is the issuer of dev-mode tokens, accepted in dev mode only", DevIssuer)
	}
	if strings.TrimSpace(cfg.Audience) == "" {
		return nil, errors.New("api: Auth.Audience is required")
	}
	if cfg.Leeway < 0 || cfg.Leeway > MaxLeeway {
		return nil, fmt.Errorf("api: Auth.Leeway must be between 0 and %s", MaxLeeway)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &authenticator{keys: make(map[string]verifyKey), issuers: []string{cfg.Issuer}, leeway: cfg.Leeway, now: time.Now, log: log}
	a.fetchWarnings = loglimit.New(JWKSMinRefresh, func() time.Time { return a.now() })
	if dev && cfg.Issuer != DevIssuer {
		a.issuers = append(a.issuers, DevIssuer)
	}
	var methods []string
	if len(cfg.HS256Secret) > 0 {
		a.secret = slices.Clone(cfg.HS256Secret)
		methods = append(methods, jwt.SigningMethodHS256.Alg())
	}
	for i, pk := range cfg.PublicKeys {
		if pk.KID == "" {
			return nil, fmt.Errorf("api: Auth.PublicKeys[%d].KID is required", i)
		}
		if _, dup := a.keys[pk.KID]; dup {
			return nil, fmt.Errorf("api: Auth.PublicKeys[%d].KID %q appears twice", i, pk.KID)
		}
		alg, key, err := jwk.Alg(pk.Key)
		if err != nil {
			return nil, fmt.Errorf("api: Auth.PublicKeys[%d].Key: %w", i, err)
		}
		a.keys[pk.KID] = verifyKey{alg: alg, key: key}
		if !slices.Contains(methods, alg) {
			methods = append(methods, alg)
		}
	}
	if cfg.JWKSURL != "" {
		if err := jwks.CheckSecureURL(cfg.JWKSURL); err != nil {
			return nil, fmt.Errorf("api: Auth.JWKSURL: %w", err)
		}
		var err error
		if a.jwks, err = jwks.New(jwks.Options[jwk.SetKey]{
			URL:                cfg.JWKSURL,
			Parse:              a.parseAccessJWKS,
			KID:                func(k jwk.SetKey) string { return k.KID },
			Name:               "fetch the access-token JWKS",
			HTTPClient:         jwksHTTPClient,
			MinRefreshInterval: JWKSMinRefresh,
			MaxAge:             JWKSMaxAge,
			OnFetch:            func(keys []jwk.SetKey, err error) { a.fetched(keys, err) },
			Now:                func() time.Time { return a.now() },
		}); err != nil {
			return nil, fmt.Errorf("api: Auth.JWKSURL: %w", err)
		}
		for _, alg := range []string{jwk.RS256, jwk.ES256, jwk.EdDSA} {
			if !slices.Contains(methods, alg) {
				methods = append(methods, alg)
			}
		}
	}
	a.methods = methods
	a.parser = jwtparser.New(
		jwt.WithValidMethods(methods),
		jwt.WithExpirationRequired(),
		jwt.WithAudience(cfg.Audience),
		jwt.WithLeeway(cfg.Leeway),
		jwt.WithIssuedAt(),
		jwt.WithTimeFunc(func() time.Time { return a.now() }),
	)
	return a, nil
}

// jwksHTTPClient fetches the access-token JWKS: within 5 s, and following a redirect only to
// where the URL itself could point (jwks.CheckSecureURL), never from https to plain http.
var jwksHTTPClient = &http.Client{
	Timeout: 5 * time.Second,
	CheckRedirect: func(req *http.Request, via []*http.Request) error {
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		return jwks.CheckSecureURL(req.URL.String())
	},
}

// parseAccessJWKS reads the identity provider's set: its RS256, ES256 and EdDSA keys. What it
// skips is kept for the log of the fetch (fetched).
func (a *authenticator) parseAccessJWKS(data []byte) ([]jwk.SetKey, error) {
	keys, skipped, err := jwk.ParseSet(data, func(string) bool { return true })
	if err != nil && strings.Contains(string(data), `"jwks_uri"`) {
		err = fmt.Errorf(`%w: this is the identity provider's discovery document; TABLEASE_JWT_JWKS_URL is its "jwks_uri"`, err)
	}
	said := make([]string, len(skipped))
	for i, s := range skipped {
		said[i] = s.String()
	}
	a.logMu.Lock()
	a.skipped = said
	a.logMu.Unlock()
	return keys, err
}

// fetched logs a fetch of the access-token JWKS: a failure at warn (at most one every
// JWKSMinRefresh: until a first set is had, fetches are made every second), a set at info when its
// keys or what it skipped differ from the last set's, at warn when it has no key.
func (a *authenticator) fetched(keys []jwk.SetKey, err error) {
	if err != nil {
		if ok, left, _ := a.fetchWarnings.Allow("fetch"); ok {
			a.log.Warn("access-token keys not fetched: tokens signed with a key not fetched yet are answered 503 AUTH_UNAVAILABLE",
				"url", a.jwks.URL(), "err", err, "failures_not_logged", left)
		}
		return
	}
	kids := make([]string, len(keys))
	for i, k := range keys {
		kids[i] = k.KID + " " + k.Alg
	}
	a.logMu.Lock()
	skipped := a.skipped
	changed := a.lastKids == nil || !slices.Equal(kids, a.lastKids) || !slices.Equal(skipped, a.lastSkipped)
	a.lastKids, a.lastSkipped = kids, skipped
	a.logMu.Unlock()
	switch {
	case len(keys) == 0:
		a.log.Warn("access-token keys fetched: the set has no key tablease can use, so every token of a public key is refused (401)", "url", a.jwks.URL(), "skipped", skipped)
	case changed:
		a.log.Info("access-token keys fetched", "url", a.jwks.URL(), "keys", kids, "skipped", skipped)
	}
}

var (
	errNoKey = errors.New("no key for this token")
	errCrit  = errors.New("the token's crit header names extensions this server does not understand")
)

// noKidError is a token signed with a public key that names none by its kid: told apart from an
// unknown kid, since a key is chosen by kid alone, never by trying each.
type noKidError struct{ sources string }

func (e *noKidError) Error() string {
	return "the token has no kid: a token signed with a key of " + e.sources + " must name that key in its kid header"
}

// unknownKidError is a token whose kid names no key of TABLEASE_JWT_PUBLIC_KEYS or of the JWKS of
// TABLEASE_JWT_JWKS_URL, or one of another algorithm (keyAlg, where the token is signed with alg):
// the answer names the kid, so that whoever set up the identity provider can compare it with the
// kids the server logged ("access tokens", "access-token keys fetched").
type unknownKidError struct{ kid, keyAlg, alg, sources string }

func (e *unknownKidError) Error() string {
	kid := e.kid
	if len(kid) > 64 {
		kid = kid[:64] + "..."
	}
	if e.keyAlg != "" {
		return fmt.Sprintf("the token's kid %q names a key of %s, and the token is signed with %s", kid, e.keyAlg, e.alg)
	}
	return fmt.Sprintf("the token's kid %q names no key of %s", kid, e.sources)
}

// headerError is a header jsontext.Header refused: a parameter given twice or named in another
// case, or text that is not UTF-8.
type headerError struct{ err error }

func (e *headerError) Error() string { return "the token's header is ambiguous: " + e.err.Error() }
func (e *headerError) Unwrap() error { return e.err }

// keyFor chooses the verification key: the secret for HS256 and only for HS256; for the others
// the public key named by kid (of AuthConfig.PublicKeys, else of the JWKS), and only when that key
// is meant for the token's algorithm. A key of the JWKS is put in *fromSet; a kid the JWKS cannot
// answer for now is its *jwks.UnavailableError, which verify answers 503 AUTH_UNAVAILABLE (never a
// 401, which would send the client to its identity provider for a new token in a loop).
func (a *authenticator) keyFor(ctx context.Context, t *jwt.Token, fromSet **jwk.SetKey) (any, error) {
	if err := jsontext.Header(t.Raw); err != nil {
		return nil, &headerError{err}
	}
	if _, ok := t.Header["crit"]; ok { // RFC 7515 §4.1.11: extensions it does not understand
		return nil, errCrit
	}
	alg := t.Method.Alg()
	if alg == jwt.SigningMethodHS256.Alg() {
		if a.secret == nil {
			return nil, errNoKey
		}
		return a.secret, nil
	}
	// A kid that is not a string, or is empty, names no key: the token has none.
	kid, _ := t.Header["kid"].(string)
	if kid == "" && (len(a.keys) > 0 || a.jwks != nil) {
		return nil, &noKidError{a.keySources()}
	}
	k, ok := a.keys[kid]
	if !ok && a.jwks != nil {
		// A set fetched after the token was signed and lacking its kid shows the kid unknown (401);
		// one fetched before, "retry" (503). The margin covers an identity provider's clock that
		// runs behind. A token issued in the future is refused as the parser would refuse it after
		// its signature, without a fetch for its kid and without a 503 until that future.
		var signedBy time.Time
		if c, _ := t.Claims.(*accessClaims); c != nil && c.IssuedAt != nil {
			if c.IssuedAt.After(a.now().Add(a.leeway)) {
				return nil, jwt.ErrTokenUsedBeforeIssued
			}
			signedBy = jwks.SignedBy(c.IssuedAt.Time, a.leeway)
		}
		sk, err := a.jwks.LookupSigned(ctx, kid, signedBy)
		if unavailable := (*jwks.UnavailableError)(nil); errors.As(err, &unavailable) {
			return nil, err
		}
		if err == nil {
			k, ok, *fromSet = verifyKey{alg: sk.Alg, key: sk.Key}, true, &sk
		}
	}
	if !ok {
		return nil, &unknownKidError{kid: kid, sources: a.keySources()}
	}
	if k.alg != alg {
		return nil, &unknownKidError{kid: kid, keyAlg: k.alg, alg: alg}
	}
	return k.key, nil
}

// keySources names where the public keys of access tokens come from, for unknownKidError.
func (a *authenticator) keySources() string {
	switch {
	case a.jwks == nil:
		return "TABLEASE_JWT_PUBLIC_KEYS"
	case len(a.keys) == 0:
		return "the JWKS of TABLEASE_JWT_JWKS_URL"
	}
	return "TABLEASE_JWT_PUBLIC_KEYS or the JWKS of TABLEASE_JWT_JWKS_URL"
}

// verify checks a token and returns its principal, or an UNAUTHENTICATED error that says why
// without echoing the token (AUTH_UNAVAILABLE when its key cannot be had now). A token verified
// before and not expired is answered from a.verified, one verified with a key of the JWKS while the
// set still names that key by its kid. The principal is shared: callers must not change it.
func (a *authenticator) verify(ctx context.Context, token string) (*Principal, error) {
	if p, ok := a.verified.Get(token, a.now()); ok {
		if p.KeyKept() {
			return p, nil
		}
		a.verified.Forget(token) // the set no longer names the key: verified again, and refused
	}
	claims := accessClaims{issuers: a.issuers}
	var fromSet *jwk.SetKey
	keyFor := func(t *jwt.Token) (any, error) { return a.keyFor(ctx, t, &fromSet) }
	if tok, err := a.parser.ParseWithClaims(token, &claims, keyFor); err != nil {
		var unavailable *jwks.UnavailableError
		if errors.As(err, &unavailable) { // the message leaves the fetch's own error (addresses, the URL) to the log
			return nil, &Error{Code: CodeAuthUnavailable, Retryable: true, RetryAfter: unavailable.RetryAfter(), Err: err,
				Message: "the access token's key cannot be had now from the identity provider's JWKS; retry later (" + unavailable.Reason + ")"}
		}
		if errors.Is(err, jwt.ErrTokenSignatureInvalid) && tok != nil && tok.Method != nil && !slices.Contains(a.methods, tok.Method.Alg()) {
			// jwt refuses an algorithm it was not given before looking for a key.
			return nil, unauthenticated(fmt.Sprintf("the token is signed with %.16q, which this server does not accept (it accepts %s)",
				tok.Method.Alg(), strings.Join(a.methods, ", ")))
		}
		return nil, unauthenticated(tokenProblem(err))
	}
	if err := lease.ValidateID("sub", claims.Subject); err != nil {
		return nil, unauthenticated("the token's sub claim is missing or is not a valid identifier")
	}
	for _, sid := range claims.SID.values {
		if lease.ValidateID("sid", sid) != nil {
			return nil, unauthenticated("the token's sid claim holds an invalid session id")
		}
	}
	p := &Principal{Sub: claims.Subject, Scopes: make(map[string]bool), Expires: claims.ExpiresAt.Add(a.leeway)}
	if fromSet != nil {
		key := *fromSet
		p.keyKept = func() bool {
			k, found := a.jwks.Current(key.KID)
			return found && k.Same(key)
		}
	}
	if claims.SID.present {
		p.Sessions = append([]string{}, claims.SID.values...) // non-nil: restricted
	}
	for _, s := range claims.Scope {
		p.Scopes[s] = true
	}
	from, until := verifiedtokens.Window(claims.RegisteredClaims, a.leeway) // exp is required: the parser checked it
	a.verified.Put(token, p, from, until)
	return p, nil
}

func tokenProblem(err error) string {
	var ke *jsontext.KeyError
	var he *headerError
	var kid *unknownKidError
	var noKid *noKidError
	switch {
	case errors.As(err, &kid):
		return kid.Error()
	case errors.Is(err, errCrit):
		return errCrit.Error()
	case errors.As(err, &noKid):
		return noKid.Error()
	case errors.As(err, &he):
		return he.Error()
	case errors.As(err, &ke):
		return "the token's claims are ambiguous: " + ke.Error()
	case errors.Is(err, jsontext.ErrNotUTF8):
		return "the token's claims are not valid UTF-8"
	case errors.Is(err, jsontext.ErrLoneSurrogate):
		return "the token's claims escape a lone UTF-16 surrogate, which is not a character"
	case errors.Is(err, jwt.ErrTokenMalformed):
		return "the bearer token is malformed"
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return "the token's signature is not valid (or its algorithm is not allowed)"
	case errors.Is(err, jwt.ErrTokenUsedBeforeIssued): // before Unverifiable: keyFor may say so
		return "the token was issued in the future"
	case errors.Is(err, jwt.ErrTokenUnverifiable):
		return "the token cannot be verified: unknown key or algorithm not allowed"
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		return "the token lacks a required claim (exp, iss or aud)"
	case errors.Is(err, jwt.ErrTokenNotValidYet):
		return "the token is not valid yet"
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return "the token's issuer is not accepted"
	case errors.Is(err, jwt.ErrTokenInvalidAudience):
		return "the token's audience is not accepted"
	case errors.Is(err, jwt.ErrTokenExpired):
		// Last: jwt reports every claim that fails, and a token of another issuer or audience
		// would otherwise read as one to refresh.
		return "the token has expired"
	}
	return "the token is not valid"
}

func unauthenticated(msg string) *Error {
	return &Error{Code: CodeUnauthenticated, Message: msg}
}

func forbidden(msg string) *Error {
	return &Error{Code: CodeForbidden, Message: msg}
}

// bearer extracts the token of an Authorization header of the form "Bearer <token>".
func bearer(header string) (string, bool) {
	scheme, token, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimLeft(token, " ")
	if token == "" {
		return "", false
	}
	for i := 0; i < len(token); i++ {
		if !tokenByte[token[i]] {
			return "", false
		}
	}
	return token, true
}

// tokenByte says which bytes a bearer token may hold: base64url segments, dots and padding.
var tokenByte = func() (t [256]bool) {
	for _, r := range "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.=" {
		t[r] = true
	}
	return t
}()

// authenticate verifies the bearer token of a /v1 request, stores its Principal, and refuses a
// path session that the token's sid claim does not list. Tokens are never read from the URL.
func (s *Server) authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		p, err := s.principal(c.Request())
		if err != nil {
			return err
		}
		setPrincipal(c, p)
		return next(c)
	}
}

// requireSession refuses a token whose sid claim does not list the route's session; it runs after
// rateLimit, which charges the refusal to the user.
func requireSession(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if sid := pathParam(c, "sid"); sid != "" && !principalOf(c).AllowsSession(sid) {
			return forbidden("the access token does not grant this session")
		}
		return next(c)
	}
}

// principal verifies the access token of req, the one Authorization: Bearer header, and answers
// who it names. A request that also carries a token in its URL is refused, header or not: URLs
// end up in logs and histories, and a client that sends one there should learn it at once.
func (s *Server) principal(req *http.Request) (*Principal, error) {
	// (The query of nearly every request is empty, and parsing one costs a map.)
	if req.URL.RawQuery != "" {
		q := req.URL.Query()
		if tokenInURL(q) {
			return nil, unauthenticated("tokens in URLs are refused; send the access token in an Authorization: Bearer header")
		}
		if q.Has("ticket") { // the event stream reads its ticket before it asks for a principal
			return nil, unauthenticated("an event ticket opens GET …/events only; send the access token in an Authorization: Bearer header")
		}
	}
	if len(req.Header.Values(echo.HeaderAuthorization)) > 1 {
		return nil, unauthenticated("send one Authorization header, not several")
	}
	header := req.Header.Get(echo.HeaderAuthorization)
	if header == "" {
		return nil, unauthenticated("an Authorization: Bearer access token is required")
	}
	if len(header) > maxAuthHeaderLen {
		return nil, unauthenticated("the Authorization header is too large")
	}
	token, ok := bearer(header)
	if !ok {
		return nil, unauthenticated(`the Authorization header must be "Bearer <access token>"`)
	}
	return s.auth.verify(req.Context(), token)
}

// tokenInURL reports whether q carries an access token, which is refused on every route: URLs
// end up in logs and histories.
func tokenInURL(q url.Values) bool { return q.Has("access_token") || q.Has("token") }

// FetchAccessKeys fetches the JWKS of AuthConfig.JWKSURL now (nothing without one), within the
// fetch's timeout: at start, so that the first tokens do not wait for it and the log says at once
// whether the keys can be had. A failure is logged; the keys are fetched again when a token needs
// them.
func (s *Server) FetchAccessKeys(ctx context.Context) error {
	if s.auth.jwks == nil {
		return nil
	}
	return s.auth.jwks.Refresh(ctx)
}

// RequireScope refuses, with 403 FORBIDDEN, a request whose token lacks scope. It runs after
// authentication (on /v1 routes).
func RequireScope(scope string) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			p := principalOf(c)
			if p == nil {
				return unauthenticated("an Authorization: Bearer access token is required")
			}
			if !p.HasScope(scope) {
				return forbidden("the access token lacks the scope " + scope)
			}
			return next(c)
		}
	}
}

// requireAdmin guards the admin routes: the token must grant ScopeAdmin and must not be limited to
// sessions by a sid claim (an admin route names other users' sessions, which such a token was
// never meant to reach). It runs after authentication.
func requireAdmin(next echo.HandlerFunc) echo.HandlerFunc {
	return RequireScope(ScopeAdmin)(func(c echo.Context) error {
		if principalOf(c).Sessions != nil {
			return forbidden("a token limited to sessions by a sid claim cannot use admin routes")
		}
		return next(c)
	})
}

// TokenSpec describes a token for IssueToken.
type TokenSpec struct {
	Sub      string        // required; a valid identifier
	Scopes   []string      // the scope claim, space-separated; none when empty
	Sessions []string      // the sid claim: a string for one, a list for several; none when empty
	TTL      time.Duration // lifetime; zero means one hour
}

// IssueToken signs an HS256 access token with cfg.HS256Secret, for dev mode and the CLI. It sets
// iss, aud, sub, iat, nbf, exp, and scope and sid when given.
func IssueToken(cfg AuthConfig, spec TokenSpec) (string, error) {
	return issueToken(cfg, spec, time.Now())
}

func issueToken(cfg AuthConfig, spec TokenSpec, now time.Time) (string, error) {
	if len(cfg.HS256Secret) < MinHS256SecretLen {
		return "", fmt.Errorf("api: IssueToken needs an HS256 secret of at least %d bytes", MinHS256SecretLen)
	}
	if cfg.Issuer == "" || cfg.Audience == "" {
		return "", errors.New("api: IssueToken needs Auth.Issuer and Auth.Audience")
	}
	if err := lease.ValidateID("sub", spec.Sub); err != nil {
		return "", fmt.Errorf("api: IssueToken: %w", err)
	}
	for _, sc := range spec.Scopes {
		if sc == "" || strings.ContainsAny(sc, " \t\r\n") {
			return "", fmt.Errorf("api: IssueToken: scope %q must be one word", sc)
		}
	}
	for _, sid := range spec.Sessions {
		if err := lease.ValidateID("sid", sid); err != nil {
			return "", fmt.Errorf("api: IssueToken: %w", err)
		}
	}
	ttl := spec.TTL
	if ttl == 0 {
		ttl = defaultTokenTTL
	}
	if ttl < 0 {
		return "", errors.New("api: IssueToken: TTL must not be negative")
	}
	now = now.Truncate(time.Second)
	claims := jwt.MapClaims{
		"iss": cfg.Issuer,
		"aud": cfg.Audience,
		"sub": spec.Sub,
		"iat": now.Unix(),
		"nbf": now.Unix(),
		"exp": now.Add(ttl).Unix(),
	}
	if len(spec.Scopes) > 0 {
		claims["scope"] = strings.Join(spec.Scopes, " ")
	}
	switch len(spec.Sessions) {
	case 0:
	case 1:
		claims["sid"] = spec.Sessions[0]
	default:
		claims["sid"] = slices.Clone(spec.Sessions)
	}
	return jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString(cfg.HS256Secret)
}
