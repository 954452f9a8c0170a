package api

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/labstack/echo/v4"
)

// claims returns valid claims for sub under the test configuration; edit the map to break them.
func validClaims(cfg AuthConfig, sub string) jwt.MapClaims {
	now := time.Now()
	return jwt.MapClaims{
		"iss": cfg.Issuer,
		"aud": cfg.Audience,
		"sub": sub,
		"iat": now.Add(-time.Minute).Unix(),
		"nbf": now.Add(-time.Minute).Unix(),
		"exp": now.Add(time.Hour).Unix(),
	}
}

func sign(t *testing.T, method jwt.SigningMethod, key any, kid string, claims jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(method, claims)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestAuthRefusesBadTokens(t *testing.T) {
	h := newHarness(t)
	cfg := h.auth
	secret := cfg.HS256Secret
	with := func(edit func(jwt.MapClaims)) jwt.MapClaims {
		c := validClaims(cfg, "alice")
		edit(c)
		return c
	}
	hs := func(c jwt.MapClaims) string { return sign(t, jwt.SigningMethodHS256, secret, "", c) }
	none := sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, "", validClaims(cfg, "alice"))
	valid := hs(validClaims(cfg, "alice"))
	// raw signs a header and payload as written, for what jwt.MapClaims cannot hold (a key twice).
	raw := func(header, payload string) string {
		enc := base64.RawURLEncoding.EncodeToString
		signing := enc([]byte(header)) + "." + enc([]byte(payload))
		sig, err := jwt.SigningMethodHS256.Sign(signing, secret)
		if err != nil {
			t.Fatal(err)
		}
		return signing + "." + enc(sig)
	}
	now := time.Now().Unix()
	payload := func(more string) string {
		return fmt.Sprintf(`{"iss":%q,"aud":%q,"sub":"alice","iat":%d,"exp":%d%s}`, cfg.Issuer, cfg.Audience, now-60, now+3600, more)
	}
	const hs256 = `{"alg":"HS256","typ":"JWT"}`

	tests := []struct {
		name   string
		header string // the Authorization header; empty sends none
		path   string // default leasePath("doc-1")
		status int
		msg    string // a part of the message, when it matters
	}{
		{name: "a request without a token is unauthenticated", status: 401},
		{name: "a token signed with alg none is refused", header: "Bearer " + none, status: 401},
		{name: "a token signed with another secret is refused", header: "Bearer " + sign(t, jwt.SigningMethodHS256, []byte(strings.Repeat("x", 40)), "", validClaims(cfg, "alice")), status: 401},
		{name: "an HS512 token is refused because only HS256 is allowed", header: "Bearer " + sign(t, jwt.SigningMethodHS512, secret, "", validClaims(cfg, "alice")), status: 401},
		{name: "an expired token is refused", header: "Bearer " + hs(with(func(c jwt.MapClaims) { c["exp"] = time.Now().Add(-time.Minute).Unix() })), status: 401, msg: "expired"},
		{name: "a token without exp is refused", header: "Bearer " + hs(with(func(c jwt.MapClaims) { delete(c, "exp") })), status: 401},
		{name: "a token not valid before a future time is refused", header: "Bearer " + hs(with(func(c jwt.MapClaims) { c["nbf"] = time.Now().Add(time.Hour).Unix() })), status: 401},
		{name: "a token issued in the future is refused", header: "Bearer " + hs(with(func(c jwt.MapClaims) { c["iat"] = time.Now().Add(time.Hour).Unix() })), status: 401},
		{name: "a token from another issuer is refused", header: "Bearer " + hs(with(func(c jwt.MapClaims) { c["iss"] = "https://evil.example" })), status: 401},
		{name: "an expired token from another issuer is refused for its issuer", header: "Bearer " + hs(with(func(c jwt.MapClaims) {
			c["iss"], c["exp"] = "https://evil.example", time.Now().Add(-time.Minute).Unix()
		})), status: 401, msg: "issuer"},
		{name: "an expired token for another audience is refused for its audience", header: "Bearer " + hs(with(func(c jwt.MapClaims) {
			c["aud"], c["exp"] = "someone-else", time.Now().Add(-time.Minute).Unix()
		})), status: 401, msg: "audience"},
		{name: "a token without an issuer is refused", header: "Bearer " + hs(with(func(c jwt.MapClaims) { delete(c, "iss") })), status: 401},
		{name: "a token for another audience is refused", header: "Bearer " + hs(with(func(c jwt.MapClaims) { c["aud"] = "someone-else" })), status: 401},
		{name: "a token without sub is refused", header: "Bearer " + hs(with(func(c jwt.MapClaims) { delete(c, "sub") })), status: 401, msg: "sub"},
		{name: "a token whose sub is not an identifier is refused", header: "Bearer " + hs(with(func(c jwt.MapClaims) { c["sub"] = "alice/../bob" })), status: 401, msg: "sub"},
		{name: "a token whose sub is dot-dot is refused", header: "Bearer " + hs(with(func(c jwt.MapClaims) { c["sub"] = ".." })), status: 401},
		{name: "a token whose scope is not a string is refused", header: "Bearer " + hs(with(func(c jwt.MapClaims) { c["scope"] = 42 })), status: 401},
		{name: "a token for another session is forbidden", header: "Bearer " + hs(with(func(c jwt.MapClaims) { c["sid"] = "doc-2" })), status: 403},
		{name: "a token for a list of other sessions is forbidden", header: "Bearer " + hs(with(func(c jwt.MapClaims) { c["sid"] = []string{"doc-2", "doc-3"} })), status: 403},
		{name: "a token whose session list names this session is accepted", header: "Bearer " + hs(with(func(c jwt.MapClaims) { c["sid"] = []string{"doc-2", "doc-1"} })), status: 200},
		{name: "a token whose session list is empty is forbidden every session", header: "Bearer " + hs(with(func(c jwt.MapClaims) { c["sid"] = []string{} })), status: 403},
		{name: "a token whose sid claim is a number is refused", header: "Bearer " + hs(with(func(c jwt.MapClaims) { c["sid"] = 7 })), status: 401},
		{name: "a token whose sid claim is an invalid id is refused", header: "Bearer " + hs(with(func(c jwt.MapClaims) { c["sid"] = "a b" })), status: 401},
		{name: "a token whose sid claim is null is refused: read as absent it would allow every session", header: "Bearer " + hs(with(func(c jwt.MapClaims) { c["sid"] = nil })), status: 401},
		{name: "a valid token is accepted", header: "Bearer " + valid, status: 200},
		{name: "a token signed as written is accepted", header: "Bearer " + raw(hs256, payload("")), status: 200},
		{name: "a token with claims of its issuer's own, null ones included, is accepted", header: "Bearer " + raw(hs256, payload(`,"tenant":"t-1","groups":null`)), status: 200},
		{name: "a token whose header has crit is refused", header: "Bearer " + raw(`{"alg":"HS256","typ":"JWT","crit":["x-ext"],"x-ext":1}`, payload("")), status: 401, msg: "crit"},
		{name: "a token with sub twice is refused", header: "Bearer " + raw(hs256, payload(`,"sub":"mallory"`)), status: 401, msg: "sub is given twice"},
		{name: "a token with SUB beside sub is refused", header: "Bearer " + raw(hs256, payload(`,"SUB":"mallory"`)), status: 401, msg: "only when case is ignored"},
		// A null time claim would be read as the claim left out: "nbf": null skips the check of nbf.
		{name: "a token whose nbf is null is refused", header: "Bearer " + raw(hs256, payload(`,"nbf":null`)), status: 401},
		{name: "a token whose iat is null is refused", header: "Bearer " + raw(hs256, fmt.Sprintf(`{"iss":%q,"aud":%q,"sub":"alice","iat":null,"exp":%d}`, cfg.Issuer, cfg.Audience, now+3600)), status: 401},
		{name: "a token whose claims are not UTF-8 is refused", header: "Bearer " + raw(hs256, payload(",\"x\":\"\xff\"")), status: 401, msg: "not valid UTF-8"},
		{name: "a token whose claims escape a lone surrogate is refused", header: "Bearer " + raw(hs256, payload(`,"x":"\ud800"`)), status: 401, msg: "lone UTF-16 surrogate"},
		{name: "a token whose header names alg twice is refused", header: "Bearer " + raw(`{"alg":"none","alg":"HS256","typ":"JWT"}`, payload("")), status: 401, msg: "header is ambiguous: alg is given twice"},
		{name: "a token whose header names ALG beside alg is refused", header: "Bearer " + raw(`{"alg":"HS256","ALG":"none","typ":"JWT"}`, payload("")), status: 401, msg: "header is ambiguous"},
		{name: "a token whose header is not UTF-8 is refused", header: "Bearer " + raw("{\"alg\":\"HS256\",\"typ\":\"JWT\",\"x\":\"\xff\"}", payload("")), status: 401, msg: "header is ambiguous"},
		{name: "a token whose scope is null has no scope", header: "Bearer " + raw(hs256, payload(`,"scope":null`)), status: 200},
		{name: "the Bearer scheme is case-insensitive", header: "bearer " + valid, status: 200},
		{name: "a bare Bearer is malformed", header: "Bearer", status: 401},
		{name: "Bearer with only spaces is malformed", header: "Bearer    ", status: 401},
		{name: "Basic credentials are refused", header: "Basic x", status: 401},
		{name: "garbage is refused", header: "garbage", status: 401},
		{name: "a token with a space inside is refused", header: "Bearer " + valid[:10] + " " + valid[10:], status: 401},
		{name: "a token that is not a JWT is refused", header: "Bearer not-a-jwt", status: 401},
		{name: "a 12 KiB Authorization header is refused unparsed", header: "Bearer " + strings.Repeat("a", 12<<10), status: 401, msg: "too large"},
		{name: "a token only in access_token of the query is refused", path: leasePath("doc-1") + "?access_token=" + valid, status: 401, msg: "URLs are refused"},
		{name: "a token only in token of the query is refused", path: leasePath("doc-1") + "?token=" + valid, status: 401, msg: "URLs are refused"},
		{name: "a token in the query is refused beside a valid header", header: "Bearer " + valid, path: leasePath("doc-1") + "?access_token=" + valid, status: 401, msg: "URLs are refused"},
		{name: "an event ticket in the query of another route is refused beside a valid header", header: "Bearer " + valid, path: leasePath("doc-1") + "?ticket=x", status: 401, msg: "event ticket opens GET …/events only"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := tt.path
			if path == "" {
				path = leasePath("doc-1")
			}
			req := request{method: http.MethodGet, path: path, headers: map[string]string{}}
			if tt.header != "" {
				req.headers["Authorization"] = tt.header
			}
			rec := h.do(req)
			switch tt.status {
			case 200:
				readLease(t, rec)
				return
			case 401:
				e := wantError(t, rec, 401, CodeUnauthenticated)
				if !strings.Contains(e.Error.Message, tt.msg) {
					t.Errorf("message %q lacks %q", e.Error.Message, tt.msg)
				}
				if rec.Header().Get("WWW-Authenticate") == "" {
					t.Error("401 without WWW-Authenticate")
				}
			case 403:
				wantError(t, rec, 403, CodeForbidden)
			}
		})
	}
}

// respelled is token with the last character of its signature replaced by the one whose lowest bit
// differs: a bit beyond the signature's last byte (HS256 has 2 such bits, RS256, ES256 and EdDSA
// 4), so that a lenient base64url decoder reads the same signature.
func respelled(t *testing.T, token string) string {
	t.Helper()
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	i := strings.IndexByte(alphabet, token[len(token)-1])
	if i < 0 {
		t.Fatalf("token %q does not end in base64url", token)
	}
	other := token[:len(token)-1] + string(alphabet[i^1])
	a, _ := base64.RawURLEncoding.DecodeString(token[strings.LastIndexByte(token, '.')+1:])
	b, _ := base64.RawURLEncoding.DecodeString(other[strings.LastIndexByte(other, '.')+1:])
	if len(a) == 0 || string(a) != string(b) {
		t.Fatalf("the respelling of %q reads as another signature", token)
	}
	return other
}

func TestAnAccessTokenHasOneSpellingOfItsSignature(t *testing.T) {
	edPub, edPriv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(o *Options) { o.Auth.PublicKeys = []PublicKey{{KID: "ed-1", Key: edPub}} })
	for name, token := range map[string]string{
		"HS256": sign(t, jwt.SigningMethodHS256, h.auth.HS256Secret, "", validClaims(h.auth, "alice")),
		"EdDSA": sign(t, jwt.SigningMethodEdDSA, edPriv, "ed-1", validClaims(h.auth, "alice")),
	} {
		t.Run(name, func(t *testing.T) {
			readLease(t, h.get(leasePath("doc-1"), token))
			e := wantError(t, h.get(leasePath("doc-1"), respelled(t, token)), http.StatusUnauthorized, CodeUnauthenticated)
			t.Log(e.Error.Message)
		})
	}
}

func TestAuthWithPublicKeys(t *testing.T) {
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	edPub, edPriv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rsaDER, err := x509.MarshalPKIXPublicKey(&rsaKey.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(o *Options) {
		o.Auth.HS256Secret = nil
		o.Auth.PublicKeys = []PublicKey{
			{KID: "rsa-1", Key: &rsaKey.PublicKey},
			{KID: "ed-1", Key: edPub},
			{KID: "ec-1", Key: &ecKey.PublicKey},
		}
	})
	claims := func() jwt.MapClaims { return validClaims(h.auth, "alice") }

	tests := []struct {
		name  string
		token string
		ok    bool
	}{
		{"an RS256 token with the kid of the RSA key is accepted", sign(t, jwt.SigningMethodRS256, rsaKey, "rsa-1", claims()), true},
		{"an EdDSA token with the kid of the Ed25519 key is accepted", sign(t, jwt.SigningMethodEdDSA, edPriv, "ed-1", claims()), true},
		{"an ES256 token with the kid of the P-256 key is accepted", sign(t, jwt.SigningMethodES256, ecKey, "ec-1", claims()), true},
		{"an RS256 token without a kid is refused", sign(t, jwt.SigningMethodRS256, rsaKey, "", claims()), false},
		{"an RS256 token with an unknown kid is refused", sign(t, jwt.SigningMethodRS256, rsaKey, "rsa-2", claims()), false},
		{"an RS256 token naming the Ed25519 key is refused", sign(t, jwt.SigningMethodRS256, rsaKey, "ed-1", claims()), false},
		{"an RS512 token is refused because only RS256 is allowed", sign(t, jwt.SigningMethodRS512, rsaKey, "rsa-1", claims()), false},
		{"an HS256 token is refused when no secret is configured", sign(t, jwt.SigningMethodHS256, []byte(testSecret), "", claims()), false},
		{"an HS256 token keyed with the RSA public key is refused", sign(t, jwt.SigningMethodHS256, rsaDER, "rsa-1", claims()), false},
		{"an HS256 token keyed with the Ed25519 public key is refused", sign(t, jwt.SigningMethodHS256, []byte(edPub), "ed-1", claims()), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := h.get(leasePath("doc-1"), tt.token)
			if tt.ok {
				readLease(t, rec)
			} else {
				wantError(t, rec, http.StatusUnauthorized, CodeUnauthenticated)
			}
		})
	}
	t.Run("a token without kid is told that it needs one, one with an unknown kid which kid is unknown, and one of another algorithm which are accepted", func(t *testing.T) {
		for token, says := range map[string]string{
			sign(t, jwt.SigningMethodRS256, rsaKey, "", claims()):                       "the token has no kid: a token signed with a key of TABLEASE_JWT_PUBLIC_KEYS must name that key in its kid header",
			sign(t, jwt.SigningMethodRS256, rsaKey, "rsa-2", claims()):                  `the token's kid "rsa-2" names no key of TABLEASE_JWT_PUBLIC_KEYS`,
			sign(t, jwt.SigningMethodRS256, rsaKey, strings.Repeat("k", 100), claims()): `the token's kid "` + strings.Repeat("k", 64) + `..." names no key of TABLEASE_JWT_PUBLIC_KEYS`,
			sign(t, jwt.SigningMethodHS256, []byte(testSecret), "", claims()):           `the token is signed with "HS256", which this server does not accept (it accepts RS256, EdDSA, ES256)`,
			sign(t, jwt.SigningMethodES256, ecKey, "ed-1", claims()):                    `the token's kid "ed-1" names a key of EdDSA, and the token is signed with ES256`,
		} {
			e := wantError(t, h.get(leasePath("doc-1"), token), http.StatusUnauthorized, CodeUnauthenticated)
			if e.Error.Message != says {
				t.Errorf("message %q, want %q", e.Error.Message, says)
			}
			if logged, _ := json.Marshal(says); !strings.Contains(h.logs.String(), `"error":`+string(logged)) {
				t.Errorf("the log does not say %q:\n%s", says, h.logs.String())
			}
		}
	})
}

func TestPublicKeyTokenNeverVerifiedWithTheSecret(t *testing.T) {
	edPub, edPriv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(o *Options) { o.Auth.PublicKeys = []PublicKey{{KID: "ed-1", Key: edPub}} })
	claims := validClaims(h.auth, "alice")
	t.Run("an HS256 token with the kid of a public key is verified with the secret only", func(t *testing.T) {
		// Signed with the secret: valid, the kid is irrelevant to HS256.
		readLease(t, h.get(leasePath("doc-1"), sign(t, jwt.SigningMethodHS256, h.auth.HS256Secret, "ed-1", claims)))
		// Signed with the public key as an HMAC secret: refused.
		wantError(t, h.get(leasePath("doc-1"), sign(t, jwt.SigningMethodHS256, []byte(edPub), "ed-1", claims)), 401, CodeUnauthenticated)
	})
	t.Run("an EdDSA token is accepted alongside the secret", func(t *testing.T) {
		readLease(t, h.get(leasePath("doc-1"), sign(t, jwt.SigningMethodEdDSA, edPriv, "ed-1", claims)))
	})
}

func TestRequireScope(t *testing.T) {
	h := newHarness(t)
	h.srv.echo.GET("/v1/test/admin", func(c echo.Context) error { return c.JSON(200, map[string]bool{"ok": true}) },
		h.srv.authenticate, RequireScope(ScopeAdmin))
	admin, err := IssueToken(h.auth, TokenSpec{Sub: "root", Scopes: []string{"lease:read", ScopeAdmin}})
	if err != nil {
		t.Fatal(err)
	}
	scoped := func(scope any) string {
		c := validClaims(h.auth, "root")
		c["scope"] = scope
		return sign(t, jwt.SigningMethodHS256, h.auth.HS256Secret, "", c)
	}
	tests := []struct {
		name   string
		token  string
		status int
	}{
		{"a token with the admin scope passes", admin, 200},
		{"a token without the admin scope is forbidden", h.token("alice"), 403},
		{"no token is unauthenticated", "", 401},
		{"scopes separated by spaces pass", scoped("lease:read  lease:admin "), 200},
		{"a list of scopes passes", scoped([]string{"lease:read", ScopeAdmin}), 200},
		// RFC 6749 §3.3: scopes are separated by U+0020 alone, and a list element is one scope.
		{"a scope after another kind of space is not the admin scope", scoped("x\u2003lease:admin"), 403},
		{"a scope after a tab is not the admin scope", scoped("x\tlease:admin"), 403},
		{"a list element holding two scopes is not the admin scope", scoped([]string{"lease:read lease:admin"}), 403},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := h.get("/v1/test/admin", tt.token)
			if rec.Code != tt.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tt.status, rec.Body)
			}
		})
	}
}

func TestIssueToken(t *testing.T) {
	cfg := testAuthConfig()
	t.Run("one session is a string claim and several are a list", func(t *testing.T) {
		for _, tt := range []struct {
			sessions []string
			want     any
		}{
			{[]string{"doc-1"}, "doc-1"},
			{[]string{"doc-1", "doc-2"}, []any{"doc-1", "doc-2"}},
		} {
			tok, err := IssueToken(cfg, TokenSpec{Sub: "alice", Sessions: tt.sessions, Scopes: []string{"a", "b"}, TTL: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			c := jwt.MapClaims{}
			if _, err := jwt.ParseWithClaims(tok, c, func(*jwt.Token) (any, error) { return cfg.HS256Secret, nil }, jwt.WithValidMethods([]string{"HS256"})); err != nil {
				t.Fatal(err)
			}
			if got := c["sid"]; !equalJSON(got, tt.want) {
				t.Errorf("sid = %#v, want %#v", got, tt.want)
			}
			if c["scope"] != "a b" || c["iss"] != cfg.Issuer || c["aud"] != cfg.Audience || c["sub"] != "alice" || c["exp"] == nil || c["iat"] == nil || c["nbf"] == nil {
				t.Errorf("claims = %v", c)
			}
		}
	})
	for _, tt := range []struct {
		name string
		cfg  func(*AuthConfig)
		spec TokenSpec
	}{
		{"a short secret is refused", func(c *AuthConfig) { c.HS256Secret = []byte("short") }, TokenSpec{Sub: "alice"}},
		{"an invalid sub is refused", nil, TokenSpec{Sub: "a b"}},
		{"an invalid session is refused", nil, TokenSpec{Sub: "alice", Sessions: []string{".."}}},
		{"a scope with a space is refused", nil, TokenSpec{Sub: "alice", Scopes: []string{"a b"}}},
		{"a negative TTL is refused", nil, TokenSpec{Sub: "alice", TTL: -time.Second}},
		{"a missing issuer is refused", func(c *AuthConfig) { c.Issuer = "" }, TokenSpec{Sub: "alice"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := testAuthConfig()
			if tt.cfg != nil {
				tt.cfg(&c)
			}
			if _, err := IssueToken(c, tt.spec); err == nil {
				t.Fatal("IssueToken succeeded")
			}
		})
	}
}

func equalJSON(a, b any) bool {
	as, aok := a.([]any)
	bs, bok := b.([]any)
	if aok != bok {
		return false
	}
	if !aok {
		return a == b
	}
	if len(as) != len(bs) {
		return false
	}
	for i := range as {
		if as[i] != bs[i] {
			return false
		}
	}
	return true
}
