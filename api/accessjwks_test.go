package api

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// idp serves a JWK Set that a test changes, or answers 503 while down.
type idp struct {
	mu   sync.Mutex
	keys map[string]string // kid → the JWK's members but kid
	down bool
}

func (p *idp) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.down {
		http.Error(w, "down", http.StatusServiceUnavailable)
		return
	}
	var keys []string
	for kid, members := range p.keys {
		keys = append(keys, fmt.Sprintf(`{%s,"kid":%q,"use":"sig"}`, members, kid))
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"keys":[%s]}`, strings.Join(keys, ","))
}

func (p *idp) set(f func(p *idp)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f(p)
}

func rsaMembers(k *rsa.PrivateKey) string {
	b := base64.RawURLEncoding.EncodeToString
	return fmt.Sprintf(`"kty":"RSA","alg":"RS256","n":%q,"e":%q`, b(k.N.Bytes()), b(big.NewInt(int64(k.E)).Bytes()))
}

func ecMembers(k *ecdsa.PrivateKey) string {
	raw, _ := k.PublicKey.Bytes()
	b := base64.RawURLEncoding.EncodeToString
	return fmt.Sprintf(`"kty":"EC","crv":"P-256","x":%q,"y":%q`, b(raw[1:33]), b(raw[33:]))
}

// idpHarness serves provider's set and starts a server whose access tokens are verified with
// that set alone (no HS256 secret), on a clock of the test's; it answers the set's URL too.
func idpHarness(t *testing.T, provider *idp) (*harness, *fakeClock, string) {
	t.Helper()
	keysServer := httptest.NewServer(provider)
	t.Cleanup(keysServer.Close)
	h := newHarness(t, func(o *Options) {
		o.Auth.HS256Secret = nil
		o.Auth.JWKSURL = keysServer.URL + "/jwks.json"
	})
	clock := &fakeClock{t: time.Now()}
	h.srv.auth.now = clock.Now
	return h, clock, keysServer.URL
}

// TestAccessTokensFromAJWKSURL: the keys of an identity provider's JWK Set verify access tokens; a
// key it publishes later is fetched when a token names it, one it withdraws refuses its tokens
// once the set is fetched without it, and a key that cannot be had yet is 503 AUTH_UNAVAILABLE
// (retry), never a 401 (which would send the client for a new token in a loop).
func TestAccessTokensFromAJWKSURL(t *testing.T) {
	rsa1, _ := rsa.GenerateKey(rand.Reader, 2048)
	rsa2, _ := rsa.GenerateKey(rand.Reader, 2048)
	ec1, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	provider := &idp{keys: map[string]string{"rsa-1": rsaMembers(rsa1), "ec-1": ecMembers(ec1)}, down: true}
	h, clock, keysURL := idpHarness(t, provider)
	claims := func() jwt.MapClaims { return validClaims(h.auth, "alice") }
	tokenRSA1 := sign(t, jwt.SigningMethodRS256, rsa1, "rsa-1", claims())
	unavailable := func(wantRetryAfter string) string {
		t.Helper()
		rec := h.get(leasePath("doc-1"), tokenRSA1)
		e := wantError(t, rec, http.StatusServiceUnavailable, CodeAuthUnavailable)
		if e.Error.Retryable == nil || !*e.Error.Retryable || rec.Header().Get("Retry-After") != wantRetryAfter {
			t.Fatalf("retryable %v, Retry-After %q, want true, %q", e.Error.Retryable, rec.Header().Get("Retry-After"), wantRetryAfter)
		}
		return e.Error.Message
	}

	// The identity provider is down at the start: the fetch fails, and is logged.
	if err := h.srv.FetchAccessKeys(context.Background()); err == nil {
		t.Fatal("FetchAccessKeys answered nil with the identity provider down")
	}
	if !strings.Contains(h.logs.String(), `"msg":"access-token keys not fetched`) || !strings.Contains(h.logs.String(), "503 Service Unavailable") {
		t.Fatalf("the failed fetch is not logged:\n%s", h.logs.String())
	}
	if msg := unavailable("1"); !strings.Contains(msg, "no JWKS fetched yet") || strings.Contains(msg, keysURL) || strings.Contains(msg, "503") {
		t.Fatalf("message %q: want the reason, without the fetch's own error", msg)
	}

	// Up again: a second later the token's lookup fetches the set.
	provider.set(func(p *idp) { p.down = false })
	clock.Advance(time.Second)
	readLease(t, h.get(leasePath("doc-1"), tokenRSA1))
	readLease(t, h.get(leasePath("doc-1"), sign(t, jwt.SigningMethodES256, ec1, "ec-1", claims())))
	if logs := h.logs.String(); !strings.Contains(logs, `"msg":"access-token keys fetched"`) || !strings.Contains(logs, `rsa-1 RS256`) || !strings.Contains(logs, `ec-1 ES256`) {
		t.Fatalf("the set's keys are not logged:\n%s", logs)
	}
	fetches := h.srv.auth.jwks.Fetches()

	// A kid the set lacks in a token signed after the fetch, within JWKSMinRefresh of it: the set
	// may lack a key published since, so "retry", at the time a fetch may be made; after it, a 401
	// that names the kid.
	clock.Advance(4 * time.Second)
	signedNow := func() jwt.MapClaims { c := claims(); c["iat"] = clock.Now().Unix(); return c }
	tokenRSA2 := sign(t, jwt.SigningMethodRS256, rsa2, "rsa-2", signedNow())
	rec := h.get(leasePath("doc-1"), tokenRSA2)
	wantError(t, rec, http.StatusServiceUnavailable, CodeAuthUnavailable)
	if got := rec.Header().Get("Retry-After"); got != "6" {
		t.Fatalf("Retry-After %q, want 6", got)
	}
	clock.Advance(6 * time.Second)
	e := wantError(t, h.get(leasePath("doc-1"), tokenRSA2), http.StatusUnauthorized, CodeUnauthenticated)
	if want := `the token's kid "rsa-2" names no key of the JWKS of TABLEASE_JWT_JWKS_URL`; e.Error.Message != want {
		t.Fatalf("message %q, want %q", e.Error.Message, want)
	}
	// Made-up kids are held to JWKSMinRefresh: no fetch for them; those of tokens signed before
	// the set was fetched are unknown at once.
	for i := range 20 {
		wantError(t, h.get(leasePath("doc-1"), sign(t, jwt.SigningMethodRS256, rsa2, fmt.Sprint("made-up-", i), signedNow())), http.StatusServiceUnavailable, CodeAuthUnavailable)
		wantError(t, h.get(leasePath("doc-1"), sign(t, jwt.SigningMethodRS256, rsa2, fmt.Sprint("old-", i), claims())), http.StatusUnauthorized, CodeUnauthenticated)
	}
	if got := h.srv.auth.jwks.Fetches(); got != fetches+1 {
		t.Fatalf("%d fetches, want %d", got, fetches+1)
	}

	// A rotation: the provider publishes rsa-2, whose tokens work once the set may be fetched.
	provider.set(func(p *idp) { p.keys["rsa-2"] = rsaMembers(rsa2) })
	clock.Advance(JWKSMinRefresh)
	readLease(t, h.get(leasePath("doc-1"), tokenRSA2))
	if !strings.Contains(h.logs.String(), `rsa-2 RS256`) {
		t.Fatalf("the new set is not logged:\n%s", h.logs.String())
	}

	// A key of another algorithm than the token's is refused, with both named.
	e = wantError(t, h.get(leasePath("doc-1"), sign(t, jwt.SigningMethodRS256, rsa1, "ec-1", claims())), http.StatusUnauthorized, CodeUnauthenticated)
	if want := `the token's kid "ec-1" names a key of ES256, and the token is signed with RS256`; e.Error.Message != want {
		t.Fatalf("message %q, want %q", e.Error.Message, want)
	}

	// The provider withdraws rsa-1. Its token, remembered, is still served while the set has the
	// key; once the set is JWKSMaxAge old it is fetched behind a request, and then the token is
	// refused, 401 at once: the set named the key and no longer does.
	provider.set(func(p *idp) { delete(p.keys, "rsa-1") })
	readLease(t, h.get(leasePath("doc-1"), tokenRSA1))
	clock.Advance(JWKSMaxAge)
	fetches = h.srv.auth.jwks.Fetches()
	readLease(t, h.get(leasePath("doc-1"), tokenRSA1)) // answered from the old set, which is fetched behind
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, found, _ := h.srv.auth.jwks.Cached("rsa-1"); !found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the set was not fetched behind the request (%d fetches, %d before)", h.srv.auth.jwks.Fetches(), fetches)
		}
		time.Sleep(5 * time.Millisecond)
	}
	e = wantError(t, h.get(leasePath("doc-1"), tokenRSA1), http.StatusUnauthorized, CodeUnauthenticated)
	if want := `the token's kid "rsa-1" names no key of the JWKS of TABLEASE_JWT_JWKS_URL`; e.Error.Message != want {
		t.Fatalf("message %q, want %q", e.Error.Message, want)
	}
	readLease(t, h.get(leasePath("doc-1"), tokenRSA2))

	// A set with no key tablease can use is a set: its tokens are refused (401), not "retry" for
	// ever, and the log says what the set held.
	provider.set(func(p *idp) {
		p.keys = map[string]string{"ps": strings.Replace(rsaMembers(rsa2), `"RS256"`, `"PS256"`, 1)}
	})
	clock.Advance(JWKSMaxAge)
	readLease(t, h.get(leasePath("doc-1"), tokenRSA2)) // fetches behind
	deadline = time.Now().Add(5 * time.Second)
	for !strings.Contains(h.logs.String(), "the set has no key tablease can use") {
		if time.Now().After(deadline) {
			t.Fatalf("no warning of a set without keys:\n%s", h.logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !strings.Contains(h.logs.String(), `keys[0] \"ps\": unsupported JWK: kty \"RSA\" with alg \"PS256\"`) {
		t.Fatalf("the warning does not say what was skipped:\n%s", h.logs.String())
	}
	wantError(t, h.get(leasePath("doc-1"), tokenRSA2), http.StatusUnauthorized, CodeUnauthenticated)
}

// TestAKidIsUnknownOnceASetFetchedAfterItsTokenLacksIt: a token signed with a new key, whose first
// request fetches a set that lacks the key, is told to retry (503) however often it comes, not 401
// then 503 then 401, until a set fetched after it was signed (its iat, with the margin) lacks the
// key too; and a key the set publishes late (an identity provider whose set lags its signing) then
// verifies it.
func TestAKidIsUnknownOnceASetFetchedAfterItsTokenLacksIt(t *testing.T) {
	rsa1, _ := rsa.GenerateKey(rand.Reader, 2048)
	rsa2, _ := rsa.GenerateKey(rand.Reader, 2048)
	provider := &idp{keys: map[string]string{"rsa-1": rsaMembers(rsa1)}}
	h, clock, _ := idpHarness(t, provider)
	signedNow := func(kid string, future time.Duration) string {
		c := validClaims(h.auth, "alice")
		c["iat"] = clock.Now().Add(future).Unix()
		return sign(t, jwt.SigningMethodRS256, rsa2, kid, c)
	}
	readLease(t, h.get(leasePath("doc-1"), sign(t, jwt.SigningMethodRS256, rsa1, "rsa-1", validClaims(h.auth, "alice"))))
	clock.Advance(time.Minute) // the set may be fetched again

	lagging, never := signedNow("rsa-2", 0), signedNow("never", 0)
	fetches := h.srv.auth.jwks.Fetches()
	for i, want := range []string{"10", "10", "9"} {
		rec := h.get(leasePath("doc-1"), lagging)
		e := wantError(t, rec, http.StatusServiceUnavailable, CodeAuthUnavailable)
		if rec.Header().Get("Retry-After") != want || !strings.Contains(e.Error.Message, `kid "rsa-2" is not in the JWKS fetched`) {
			t.Fatalf("call %d: Retry-After %q, message %q; want %s and the kid", i, rec.Header().Get("Retry-After"), e.Error.Message, want)
		}
		wantError(t, h.get(leasePath("doc-1"), never), http.StatusServiceUnavailable, CodeAuthUnavailable)
		clock.Advance(time.Second / 2)
	}
	// A token issued in the future (beyond the leeway) is refused as such, without a fetch.
	e := wantError(t, h.get(leasePath("doc-1"), signedNow("never-2", time.Hour)), http.StatusUnauthorized, CodeUnauthenticated)
	if e.Error.Message != "the token was issued in the future" {
		t.Fatalf("message %q", e.Error.Message)
	}
	if got := h.srv.auth.jwks.Fetches(); got != fetches+1 {
		t.Fatalf("%d fetches, want %d (one, by the first call)", got, fetches+1)
	}

	// The provider's set catches up; the next fetch, after the token was signed, has the key, and
	// shows the other kids unknown.
	provider.set(func(p *idp) { p.keys["rsa-2"] = rsaMembers(rsa2) })
	clock.Advance(JWKSMinRefresh)
	readLease(t, h.get(leasePath("doc-1"), lagging))
	e = wantError(t, h.get(leasePath("doc-1"), never), http.StatusUnauthorized, CodeUnauthenticated)
	if want := `the token's kid "never" names no key of the JWKS of TABLEASE_JWT_JWKS_URL`; e.Error.Message != want {
		t.Fatalf("message %q, want %q", e.Error.Message, want)
	}

	// A token without iat counts as signed when its request came: "retry" while the set was
	// fetched before; once a fetch made for one of its requests lacks the kid, 401 for every one
	// after it too, until a set has the key.
	noIat := func() string {
		c := validClaims(h.auth, "alice")
		delete(c, "iat")
		return sign(t, jwt.SigningMethodRS256, rsa2, "no-iat", c)
	}()
	wantError(t, h.get(leasePath("doc-1"), noIat), http.StatusServiceUnavailable, CodeAuthUnavailable)
	clock.Advance(JWKSMinRefresh)
	for range 3 {
		e := wantError(t, h.get(leasePath("doc-1"), noIat), http.StatusUnauthorized, CodeUnauthenticated)
		if !strings.Contains(e.Error.Message, `"no-iat" names no key`) {
			t.Fatalf("message %q", e.Error.Message)
		}
		clock.Advance(JWKSMinRefresh / 4)
	}
	// Published later, the key verifies the token at the next fetch its kid may make.
	provider.set(func(p *idp) { p.keys["no-iat"] = rsaMembers(rsa2) })
	wantError(t, h.get(leasePath("doc-1"), noIat), http.StatusUnauthorized, CodeUnauthenticated)
	clock.Advance(JWKSMinRefresh)
	readLease(t, h.get(leasePath("doc-1"), noIat))

	// A kid that is not a non-empty string names no key: 401 at once, no fetch.
	fetches = h.srv.auth.jwks.Fetches()
	clock.Advance(JWKSMinRefresh)
	for _, kid := range []any{nil, 7, "", map[string]any{"a": 1}} {
		tok := jwt.NewWithClaims(jwt.SigningMethodRS256, validClaims(h.auth, "alice"))
		tok.Header["kid"] = kid
		raw, err := tok.SignedString(rsa2)
		if err != nil {
			t.Fatal(err)
		}
		e := wantError(t, h.get(leasePath("doc-1"), raw), http.StatusUnauthorized, CodeUnauthenticated)
		if !strings.HasPrefix(e.Error.Message, "the token has no kid") {
			t.Fatalf("kid %v: message %q", kid, e.Error.Message)
		}
	}
	if got := h.srv.auth.jwks.Fetches(); got != fetches {
		t.Fatalf("%d fetches for tokens without a kid, want none", got-fetches)
	}
}

// TestAJWKSURLBesideTheOtherKeys: a kid of TABLEASE_JWT_PUBLIC_KEYS is verified with that key,
// without a fetch; HS256 tokens keep their secret; a token without kid is told it needs one.
func TestAJWKSURLBesideTheOtherKeys(t *testing.T) {
	static, _ := rsa.GenerateKey(rand.Reader, 2048)
	provider := &idp{keys: map[string]string{}}
	keysServer := httptest.NewServer(provider)
	t.Cleanup(keysServer.Close)
	h := newHarness(t, func(o *Options) {
		o.Auth.PublicKeys = []PublicKey{{KID: "static", Key: &static.PublicKey}}
		o.Auth.JWKSURL = keysServer.URL
	})
	readLease(t, h.get(leasePath("doc-1"), sign(t, jwt.SigningMethodRS256, static, "static", validClaims(h.auth, "alice"))))
	readLease(t, h.get(leasePath("doc-1"), h.token("alice")))
	if n := h.srv.auth.jwks.Fetches(); n != 0 {
		t.Fatalf("%d fetches for keys the server has", n)
	}
	e := wantError(t, h.get(leasePath("doc-1"), sign(t, jwt.SigningMethodRS256, static, "", validClaims(h.auth, "alice"))), http.StatusUnauthorized, CodeUnauthenticated)
	if want := "the token has no kid: a token signed with a key of TABLEASE_JWT_PUBLIC_KEYS or the JWKS of TABLEASE_JWT_JWKS_URL must name that key in its kid header"; e.Error.Message != want {
		t.Fatalf("message %q, want %q", e.Error.Message, want)
	}
}

func TestAJWKSURLMustNotBeReplaceableOnTheWay(t *testing.T) {
	for u, ok := range map[string]bool{
		"https://idp.example.com/.well-known/jwks.json": true,
		"http://127.0.0.1:8081/jwks":                    true,
		"http://[::1]/jwks":                             true,
		"http://localhost/jwks":                         true,
		"http://idp.example.com/jwks":                   false,
		"http://10.0.0.1/jwks":                          false,
		"/jwks":                                         false,
		"ftp://idp.example.com/jwks":                    false,
	} {
		_, err := newAuthenticator(AuthConfig{JWKSURL: u, Issuer: "i", Audience: "a"}, false, nil)
		if (err == nil) != ok {
			t.Errorf("%s: err = %v, want ok %v", u, err, ok)
		}
	}
}

// TestAJWKSURLIsNotRedirectedToPlainHTTP: a redirect is followed only where the URL itself could
// point, never to plain http elsewhere than a loopback address.
func TestAJWKSURLIsNotRedirectedToPlainHTTP(t *testing.T) {
	redirect := httptest.NewServer(http.RedirectHandler("http://192.0.2.1/jwks.json", http.StatusFound))
	t.Cleanup(redirect.Close)
	a, err := newAuthenticator(AuthConfig{JWKSURL: redirect.URL, Issuer: "i", Audience: "a"}, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.jwks.Refresh(context.Background()); err == nil || !strings.Contains(err.Error(), `"http://192.0.2.1/jwks.json" must be https`) {
		t.Fatalf("Refresh = %v, want the redirect refused", err)
	}
}

// TestMadeUpKidsAreChargedToTheAddress: a flood of tokens naming kids the set lacks (503
// AUTH_UNAVAILABLE until a fetch may be made) is charged to the address as failed
// authentications are, and its request lines are not warnings.
func TestMadeUpKidsAreChargedToTheAddress(t *testing.T) {
	k, _ := rsa.GenerateKey(rand.Reader, 2048)
	provider := &idp{keys: map[string]string{"k": rsaMembers(k)}}
	keysServer := httptest.NewServer(provider)
	t.Cleanup(keysServer.Close)
	h := newHarness(t, func(o *Options) {
		o.Auth.JWKSURL = keysServer.URL
		o.IPRateLimit = 1 // a burst of 2
	})
	if err := h.srv.FetchAccessKeys(context.Background()); err != nil {
		t.Fatal(err)
	}
	var codes []string
	for i := range 4 {
		c := validClaims(h.auth, "alice")
		c["iat"] = time.Now().Unix() // signed after the fetch: its key may be newer than the set
		rec := h.get(leasePath("doc-1"), sign(t, jwt.SigningMethodRS256, k, strings.Repeat("x", 100)+fmt.Sprint(i), c))
		var e errorAnswer
		if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil {
			t.Fatal(err)
		}
		codes = append(codes, e.Error.Code)
		if len(e.Error.Message) > 300 {
			t.Errorf("a message of %d bytes: the kid is not cut", len(e.Error.Message))
		}
	}
	if want := []string{CodeAuthUnavailable, CodeAuthUnavailable, CodeRateLimited, CodeRateLimited}; strings.Join(codes, " ") != strings.Join(want, " ") {
		t.Fatalf("answers %v, want %v", codes, want)
	}
	if strings.Contains(h.logs.String(), `"level":"WARN","msg":"request"`) {
		t.Fatalf("the request lines of made-up kids are warnings:\n%s", h.logs.String())
	}
}

// TestAStreamEndsWhenItsKeyIsWithdrawn: a stream opened with a token of a key of the JWKS ends,
// with its final event, at the first keepalive after a fetch finds the key withdrawn; one opened
// with a key the set keeps goes on.
func TestAStreamEndsWhenItsKeyIsWithdrawn(t *testing.T) {
	gone, _ := rsa.GenerateKey(rand.Reader, 2048)
	kept, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	provider := &idp{keys: map[string]string{"gone": rsaMembers(gone), "kept": ecMembers(kept)}}
	keysServer := httptest.NewServer(provider)
	t.Cleanup(keysServer.Close)
	h := newHarness(t, func(o *Options) {
		o.Auth.JWKSURL = keysServer.URL
		o.Streams.Keepalive = time.Second
	})
	ts := h.serve()
	withdrawn := mustStream(t, ts, eventsPath("doc-1", "tabId=t1&presence=false"), sign(t, jwt.SigningMethodRS256, gone, "gone", validClaims(h.auth, "alice")), nil)
	withdrawn.expect("snapshot", nil)
	still := mustStream(t, ts, eventsPath("doc-1", "tabId=t2&presence=false"), sign(t, jwt.SigningMethodES256, kept, "kept", validClaims(h.auth, "alice")), nil)
	still.expect("snapshot", nil)

	provider.set(func(p *idp) { delete(p.keys, "gone") })
	if err := h.srv.FetchAccessKeys(context.Background()); err != nil {
		t.Fatal(err)
	}
	var sd struct {
		Reason  string `json:"reason"`
		RetryMs int64  `json:"retryMs"`
	}
	withdrawn.expect("shutdown", &sd)
	if !strings.Contains(sd.Reason, "key was withdrawn") {
		t.Fatalf("shutdown %+v, want the reason", sd)
	}
	if rest := withdrawn.expectEnd(); len(rest) != 0 {
		t.Fatalf("after the final event: %+v", rest)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(h.get("/metrics", "").Body.String(), `tablease_event_streams_ended_total{reason="key_withdrawn"} 1`) {
		if time.Now().After(deadline) {
			t.Fatalf("the stream's end is not counted as key_withdrawn")
		}
		time.Sleep(10 * time.Millisecond)
	}
	still.quiet(1500 * time.Millisecond)    // a keepalive passes, and no event
	if it := still.nextItem(); it.IsEvent { // and the stream is still open
		t.Fatalf("an event on the stream whose key is kept: %+v", it)
	}
}
