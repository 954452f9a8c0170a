package api

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tablease/tablease/owner/guard"
	"github.com/tablease/tablease/owner/leasetoken"
)

const testLeaseIssuer = "tablease-test"

// tokenHarness is a server whose lease keys follow the harness clock, so that key retirement can
// be tested; it returns the key set too.
func tokenHarness(t *testing.T, mods ...func(*Options)) (*harness, *leasetoken.KeySet) {
	t.Helper()
	var keys *leasetoken.KeySet
	h := newHarness(t, append([]func(*Options){func(o *Options) {
		key, err := leasetoken.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		keys, err = leasetoken.NewKeySet(key, leasetoken.KeySetOptions{Now: o.Now})
		if err != nil {
			t.Fatal(err)
		}
		o.LeaseKeys, o.LeaseIssuer = keys, testLeaseIssuer
	}}, mods...)...)
	return h, keys
}

// jwksOf fetches the server's JWKS.
func (h *harness) jwksOf() leasetoken.PublicKeys {
	h.t.Helper()
	rec := h.get("/.well-known/jwks.json", "")
	if rec.Code != 200 {
		h.t.Fatalf("JWKS: %d %s", rec.Code, rec.Body)
	}
	keys, err := leasetoken.ParseJWKS(rec.Body.Bytes())
	if err != nil {
		h.t.Fatal(err)
	}
	return keys
}

// verifyOffline verifies tok as a guard would, with the keys of the server's JWKS.
func (h *harness) verifyOffline(tok string) (leasetoken.Claims, error) {
	h.t.Helper()
	v, err := leasetoken.NewVerifier(h.jwksOf(), leasetoken.VerifierOptions{Issuer: testLeaseIssuer, Now: h.clock.Now})
	if err != nil {
		h.t.Fatal(err)
	}
	return v.Verify(context.Background(), tok)
}

func (h *harness) checkToken(sid, access, tok string) *httptest.ResponseRecorder {
	h.t.Helper()
	body, _ := json.Marshal(map[string]string{"token": tok})
	return h.post(leasePath(sid)+"/check", access, string(body))
}

func TestHoldersGetALeaseTokenForTheirLease(t *testing.T) {
	h, keys := tokenHarness(t)
	alice := h.token("alice")
	a := readLease(t, h.post(leasePath("doc-1"), alice, `{"tabId":"tab-a","ttlMs":30000}`))
	if a.Token == nil || *a.Token == "" {
		t.Fatal("the acquire answer has no token")
	}
	c, err := h.verifyOffline(*a.Token)
	if err != nil {
		t.Fatalf("the token does not verify with the published keys: %v", err)
	}
	exp, _ := time.Parse(time.RFC3339Nano, *a.ExpiresAt)
	want := leasetoken.Claims{Issuer: testLeaseIssuer, Subject: "alice", Session: "doc-1", Tab: "tab-a", Epoch: a.Epoch,
		IssuedAt: h.clock.Now().Truncate(time.Second), ExpiresAt: exp.Truncate(time.Second)}
	if c.Issuer != want.Issuer || c.Subject != want.Subject || c.Session != want.Session || c.Tab != want.Tab || c.Epoch != want.Epoch ||
		!c.IssuedAt.Equal(want.IssuedAt) || !c.ExpiresAt.Equal(want.ExpiresAt) {
		t.Fatalf("claims %+v, want %+v", c, want)
	}
	header, _, _ := strings.Cut(*a.Token, ".")
	raw, _ := base64.RawURLEncoding.DecodeString(header)
	var hdr map[string]any
	_ = json.Unmarshal(raw, &hdr)
	if hdr["alg"] != "EdDSA" || hdr["typ"] != leasetoken.TokenType || hdr["kid"] != keys.Active().KeyID() {
		t.Fatalf("token header %v", hdr)
	}

	// A renew in the first half of the token's life answers the same token; one past it, a new
	// token with the new expiry.
	renew := func() leaseAnswer {
		t.Helper()
		r := readLease(t, h.post(leasePath("doc-1")+"/renew", alice, fmt.Sprintf(`{"tabId":"tab-a","epoch":%d,"ttlMs":30000}`, a.Epoch)))
		if r.Token == nil {
			t.Fatal("the renew answer has no token")
		}
		return r
	}
	h.clock.Advance(5 * time.Second)
	if r := renew(); *r.Token != *a.Token {
		t.Fatal("a renew 5 s into a 30 s token answered a new token, want the same one")
	}
	// The holder's own acquire keeps its epoch, in any mode, and so its token too.
	h.clock.Advance(5 * time.Second)
	if r := readLease(t, h.post(leasePath("doc-1"), alice, `{"tabId":"tab-a","ttlMs":30000,"mode":"takeover"}`)); r.Epoch != a.Epoch || r.Token == nil || *r.Token != *a.Token {
		t.Fatalf("the holder's takeover 10 s into a 30 s token answered epoch %d (want %d) and a new token", r.Epoch, a.Epoch)
	}
	h.clock.Advance(6 * time.Second)
	r := renew()
	rc, err := h.verifyOffline(*r.Token)
	if err != nil || !rc.ExpiresAt.After(c.ExpiresAt) || rc.Epoch != a.Epoch {
		t.Fatalf("renewed token %+v, %v; want the same epoch and a later exp than %v", rc, err, c.ExpiresAt)
	}

	// Nobody else gets one: not a reader of the lease, not a check.
	if g := readLease(t, h.get(leasePath("doc-1")+"?tabId=tab-a", alice)); g.Token != nil {
		t.Fatal("GET lease answered a token")
	}
	if strings.Contains(h.logs.String(), *a.Token) {
		t.Fatal("a lease token appeared in the logs")
	}
}

func TestTheJWKSPublishesPublicKeysOnly(t *testing.T) {
	h, keys := tokenHarness(t)
	rec := h.get("/.well-known/jwks.json", "")
	if rec.Code != 200 || rec.Header().Get("Content-Type") != "application/jwk-set+json" || rec.Header().Get("Cache-Control") != "public, max-age=300" {
		t.Fatalf("JWKS answered %d %q %q", rec.Code, rec.Header().Get("Content-Type"), rec.Header().Get("Cache-Control"))
	}
	var set struct {
		Keys []map[string]any `json:"keys"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &set); err != nil {
		t.Fatal(err)
	}
	if len(set.Keys) != 1 || set.Keys[0]["kid"] != keys.Active().KeyID() || set.Keys[0]["kty"] != "OKP" || set.Keys[0]["use"] != "sig" {
		t.Fatalf("JWKS %s", rec.Body)
	}
	for _, private := range []string{"d", "p", "q", "dp", "dq", "qi"} {
		if _, ok := set.Keys[0][private]; ok {
			t.Fatalf("the JWKS has the private member %q: %s", private, rec.Body)
		}
	}
}

func TestCheckByToken(t *testing.T) {
	h, _ := tokenHarness(t)
	alice, bob := h.token("alice"), h.token("bob")
	a := readLease(t, h.post(leasePath("doc-1"), alice, `{"tabId":"tab-a"}`))
	tokA := *a.Token

	t.Run("the holder's token is valid while it holds the lease", func(t *testing.T) {
		rec := h.checkToken("doc-1", alice, tokA)
		var c struct {
			Valid bool        `json:"valid"`
			Lease leaseAnswer `json:"lease"`
		}
		if rec.Code != 200 {
			t.Fatalf("check: %d %s", rec.Code, rec.Body)
		}
		decodeStrict(t, rec, &c)
		if !c.Valid || c.Lease.Epoch != a.Epoch || c.Lease.Role == nil || *c.Lease.Role != "owner" || c.Lease.Token != nil {
			t.Fatalf("check answered %+v", c)
		}
	})
	t.Run("a token for session A is refused for session B", func(t *testing.T) {
		readLease(t, h.post(leasePath("doc-2"), alice, `{"tabId":"tab-a"}`)) // tab-a holds doc-2 too
		wantError(t, h.checkToken("doc-2", alice, tokA), http.StatusForbidden, CodeForbidden)
	})
	t.Run("a token of another user is refused", func(t *testing.T) {
		readLease(t, h.post(leasePath("doc-1"), bob, `{"tabId":"tab-a"}`)) // bob's doc-1 held by a tab-a too
		wantError(t, h.checkToken("doc-1", bob, tokA), http.StatusForbidden, CodeForbidden)
	})
	t.Run("both forms at once are refused", func(t *testing.T) {
		body := fmt.Sprintf(`{"token":%q,"tabId":"tab-a","epoch":%d}`, tokA, a.Epoch)
		e := wantError(t, h.post(leasePath("doc-1")+"/check", alice, body), http.StatusBadRequest, CodeInvalidArgument)
		if e.Error.Details["field"] != "token" {
			t.Fatalf("details %v, want the field named", e.Error.Details)
		}
	})
	t.Run("a tampered token never passes", func(t *testing.T) {
		parts := strings.Split(tokA, ".")
		claims, _ := base64.RawURLEncoding.DecodeString(parts[1])
		forged := strings.Replace(string(claims), fmt.Sprintf(`"epoch":%d`, a.Epoch), fmt.Sprintf(`"epoch":%d`, a.Epoch+1), 1)
		if forged == string(claims) {
			t.Fatalf("the test could not find the epoch in %s", claims)
		}
		sig := []byte(parts[2])
		sig[3] ^= 1
		for name, tok := range map[string]string{
			"changed claims":    parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(forged)) + "." + parts[2],
			"changed signature": parts[0] + "." + parts[1] + "." + string(sig),
			"no signature":      parts[0] + "." + parts[1] + ".",
			"alg none":          base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"tablease-lease+jwt"}`)) + "." + parts[1] + ".",
			"garbage":           "abc.def.ghi",
			"empty":             "",
		} {
			e := wantError(t, h.checkToken("doc-1", alice, tok), http.StatusBadRequest, CodeInvalidArgument)
			if e.Error.Details["field"] != "token" || e.Error.Details["reason"] != "invalid_token" {
				t.Fatalf("%s: details %v", name, e.Error.Details)
			}
		}
	})
	t.Run("a token signed by a key the server does not publish never passes", func(t *testing.T) {
		other, err := leasetoken.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		otherKeys, _ := leasetoken.NewKeySet(other, leasetoken.KeySetOptions{})
		signer, _ := leasetoken.NewSigner(otherKeys, testLeaseIssuer)
		c, err := h.verifyOffline(tokA)
		if err != nil {
			t.Fatal(err)
		}
		c.Issuer = ""
		forged, err := signer.Sign(c)
		if err != nil {
			t.Fatal(err)
		}
		e := wantError(t, h.checkToken("doc-1", alice, forged), http.StatusBadRequest, CodeInvalidArgument)
		if e.Error.Details["reason"] != "unknown_key" {
			t.Fatalf("details %v", e.Error.Details)
		}
		// The log says it loud, naming the kid, at most every 10 s: instances that publish
		// different keys look like this (README, Key rotation).
		wantError(t, h.checkToken("doc-1", alice, forged), http.StatusBadRequest, CodeInvalidArgument)
		logged := h.logs.String()
		warn := `"msg":"a strict check was shown a lease token signed by a key this instance does not publish`
		if n := strings.Count(logged, warn); n != 1 || !strings.Contains(lineWithText(logged, warn), other.KeyID()) {
			t.Errorf("%d warnings naming %s, want one:\n%s", n, other.KeyID(), logged)
		}
		if line := lineWithText(logged, `"error":"unknown_key: `); !strings.Contains(line, `"msg":"request"`) || !strings.Contains(line, other.KeyID()) {
			t.Errorf("no request log line says why the token was refused, with its kid: %q", line)
		}
	})
	t.Run("a token of another issuer never passes", func(t *testing.T) {
		c, _ := h.verifyOffline(tokA)
		signer, err := leasetoken.NewSigner(h.srv.leaseKeys, "someone-else")
		if err != nil {
			t.Fatal(err)
		}
		c.Issuer = ""
		forged, err := signer.Sign(c)
		if err != nil {
			t.Fatal(err)
		}
		wantError(t, h.checkToken("doc-1", alice, forged), http.StatusBadRequest, CodeInvalidArgument)
	})
	t.Run("after a takeover the old holder's token is LEASE_LOST", func(t *testing.T) {
		b := readLease(t, h.post(leasePath("doc-1"), alice, `{"tabId":"tab-b","mode":"takeover"}`))
		e := wantError(t, h.checkToken("doc-1", alice, tokA), http.StatusConflict, CodeLeaseLost)
		holder, _ := e.Error.Details["holder"].(map[string]any)
		if holder["tabId"] != "tab-b" || e.Error.Details["epoch"] != float64(b.Epoch) {
			t.Fatalf("LEASE_LOST details %v", e.Error.Details)
		}
		if rec := h.checkToken("doc-1", alice, *b.Token); rec.Code != 200 {
			t.Fatalf("the new holder's token: %d %s", rec.Code, rec.Body)
		}
	})
}

func TestAnExpiredLeaseTokenIsLeaseLost(t *testing.T) {
	h, _ := tokenHarness(t)
	alice := h.token("alice")
	a := readLease(t, h.post(leasePath("doc-1"), alice, `{"tabId":"tab-a","ttlMs":10000}`))
	tok := *a.Token

	// Renewed: the lease is current, but this token has expired (beyond the 5 s leeway).
	h.clock.Advance(8 * time.Second)
	r := readLease(t, h.post(leasePath("doc-1")+"/renew", alice, fmt.Sprintf(`{"tabId":"tab-a","epoch":%d,"ttlMs":60000}`, a.Epoch)))
	h.clock.Advance(8 * time.Second)
	e := wantError(t, h.checkToken("doc-1", alice, tok), http.StatusConflict, CodeLeaseLost)
	holder, _ := e.Error.Details["holder"].(map[string]any)
	if e.Error.Details["reason"] != "expired_token" || holder["tabId"] != "tab-a" || e.Error.Details["epoch"] != float64(a.Epoch) {
		t.Fatalf("details %v", e.Error.Details)
	}
	if line := lineWithText(h.logs.String(), `"code":"LEASE_LOST"`); !strings.Contains(line, `"error":"expired_token: `) {
		t.Errorf("the request's log line does not say the token expired: %s", line)
	}
	if rec := h.checkToken("doc-1", alice, *r.Token); rec.Code != 200 {
		t.Fatalf("the renewed token: %d %s", rec.Code, rec.Body)
	}

	// Expired with its lease: LEASE_LOST too, the lease shown free.
	h.clock.Advance(2 * time.Minute)
	e = wantError(t, h.checkToken("doc-1", alice, *r.Token), http.StatusConflict, CodeLeaseLost)
	if e.Error.Details["holder"] != nil || e.Error.Details["reason"] != "expired_token" {
		t.Fatalf("details %v", e.Error.Details)
	}

	// An expired token of another user or session is forbidden, as a current one is: it tells
	// nothing of this session's lease.
	wantError(t, h.checkToken("doc-1", h.token("bob"), *r.Token), http.StatusForbidden, CodeForbidden)
	wantError(t, h.checkToken("doc-2", alice, *r.Token), http.StatusForbidden, CodeForbidden)
}

func TestKeyRotationKeepsOldTokensVerifiableUntilTheyExpire(t *testing.T) {
	h, keys := tokenHarness(t)
	alice := h.token("alice")
	a := readLease(t, h.post(leasePath("doc-1"), alice, `{"tabId":"tab-a","ttlMs":60000}`))
	oldKID := keys.Active().KeyID()

	next, err := leasetoken.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := keys.Rotate(next, h.clock.Now()); err != nil {
		t.Fatal(err)
	}
	h.clock.Advance(5 * time.Second)
	r := readLease(t, h.post(leasePath("doc-1")+"/renew", alice, fmt.Sprintf(`{"tabId":"tab-a","epoch":%d,"ttlMs":60000}`, a.Epoch)))

	// Both keys are published, the new one first; both tokens verify offline and by check.
	pub := h.jwksOf()
	if len(pub) != 2 || pub[0].KeyID() != next.KeyID() || pub[1].KeyID() != oldKID {
		t.Fatalf("JWKS after rotation: %v", pub)
	}
	for name, tok := range map[string]string{"old": *a.Token, "new": *r.Token} {
		if _, err := h.verifyOffline(tok); err != nil {
			t.Fatalf("the %s token does not verify offline: %v", name, err)
		}
		if rec := h.checkToken("doc-1", alice, tok); rec.Code != 200 {
			t.Fatalf("check of the %s token: %d %s", name, rec.Code, rec.Body)
		}
	}

	// A guard with a JWKS client against the server sees both keys too.
	ts := httptest.NewServer(h.srv.Handler())
	defer ts.Close()
	jwks, err := guard.NewJWKSClient(guard.JWKSOptions{BaseURL: ts.URL, Now: h.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	v, _ := leasetoken.NewVerifier(jwks, leasetoken.VerifierOptions{Issuer: testLeaseIssuer, Now: h.clock.Now})
	if _, err := v.Verify(context.Background(), *a.Token); err != nil {
		t.Fatalf("a guard cannot verify the token of the previous key: %v", err)
	}

	// After RetireAfter (longer than any lease token lives) the old key is gone.
	h.clock.Advance(leasetoken.DefaultRetireAfter)
	if pub := h.jwksOf(); len(pub) != 1 || pub[0].KeyID() != next.KeyID() {
		t.Fatalf("JWKS after retirement: %v", pub)
	}
}

func TestAnInstanceWithTheNextKeyAcceptsTokensOfThePreviousKey(t *testing.T) {
	// Rotation by configuration: instance A still signs with key 1; instance B signs with key 2
	// and publishes key 1 as a previous key (TABLEASE_LEASE_PREVIOUS_KEYS).
	h, keysA := tokenHarness(t)
	key2, err := leasetoken.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	keysB, err := leasetoken.NewKeySet(key2, leasetoken.KeySetOptions{Previous: []leasetoken.PublicKey{keysA.Active().Public()}})
	if err != nil {
		t.Fatal(err)
	}
	b := newHarness(t, func(o *Options) {
		o.Engine, o.Now, o.LeaseKeys, o.LeaseIssuer = h.engine, h.clock.Now, keysB, testLeaseIssuer
	})
	b.clock = h.clock
	alice := h.token("alice")
	a := readLease(t, h.post(leasePath("doc-1"), alice, `{"tabId":"tab-a"}`))
	if rec := b.checkToken("doc-1", alice, *a.Token); rec.Code != 200 {
		t.Fatalf("instance B refused instance A's token: %d %s", rec.Code, rec.Body)
	}
	if pub := b.jwksOf(); len(pub) != 2 {
		t.Fatalf("instance B publishes %d keys, want its own and the previous one", len(pub))
	}
}
