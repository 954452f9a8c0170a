package api

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/owner/leasetoken"
)

// DefaultLeaseIssuer is the iss of lease tokens when Options.LeaseIssuer is empty.
const DefaultLeaseIssuer = "tablease"

// jwksMaxAge is the Cache-Control max-age of /.well-known/jwks.json, in seconds. Guards that
// cache the set longer still fetch it again when a token names a kid they do not know.
const jwksMaxAge = "300"

// # Lease tokens
//
// Every answer to the holder — acquire and renew — carries `token`, a lease token (see package
// leasetoken): sub, sid, tab, epoch, iat = the store time it was signed, exp = the lease's expiry
// then, signed with the active key of Options.LeaseKeys. A renew, and the holder's own acquire
// that keeps its epoch, answers the token answered before to the same holder and epoch while the
// rule of leasetoken.Reuse lets it (docs/DESIGN.md, lease tokens); otherwise a new one. The
// public keys are published at /.well-known/jwks.json.
//
// POST /v1/sessions/{sid}/lease/check with {token} checks a token for guards (strict mode):
//
//   - a token that is not tablease's — malformed, wrongly signed, of another type or issuer, or
//     signed by a key this server does not publish (never, or retired) — is 400 INVALID_ARGUMENT
//     (details.field "token", details.reason): it proves nothing, and never passes;
//   - a genuine token that has expired (beyond the leeway) is 409 LEASE_LOST with details.reason
//     "expired_token", whatever the lease is now: the holder renews and uses the new token;
//   - a genuine token of another user (the access token's sub) or session (the path's sid) is
//     403 FORBIDDEN: it is no proof for this request, whatever the state of its own lease;
//   - otherwise the engine checks the token's tab and epoch atomically: 200 {valid, lease}, or
//     409 LEASE_LOST after a takeover, release, expiry or revoke.
//
// A guard (owner/guard) turns 400, 401 and 403 into 403 NOT_LEASE_OWNER and 409 into 409 LEASE_LOST.

// Reasons in details.reason of check answers about tokens.
const (
	reasonInvalidToken = "invalid_token"
	reasonUnknownKey   = "unknown_key"
	reasonExpiredToken = "expired_token"
)

// jwks answers GET /.well-known/jwks.json: the public keys of lease tokens, never a private part.
func (s *Server) jwks(c echo.Context) error {
	h := c.Response().Header()
	h.Set("Cache-Control", "public, max-age="+jwksMaxAge)
	return c.Blob(http.StatusOK, "application/jwk-set+json", s.leaseKeys.JWKS())
}

// signLease is the lease token of l for its holder: the one answered before while it has half
// its life left (leasetoken.Reuse), else a new one.
func (s *Server) signLease(l lease.Lease) (string, error) {
	tok, err := s.tokens.Token(l, s.signer.Sign)
	if err != nil {
		return "", &Error{Code: CodeInternal, Message: "internal error", Err: err}
	}
	return tok, nil
}

// holderAnswer answers c with l for its holder tabID, with a lease token; the answer, which
// carries that token, is marked Cache-Control: no-store.
func (s *Server) holderAnswer(c echo.Context, l lease.Lease, tabID string) error {
	c.Response().Header().Set(echo.HeaderCacheControl, "no-store")
	tok, err := s.signLease(l)
	if err != nil {
		return err
	}
	return writeLeaseAnswer(c, l, tabID, tok, false)
}

// checkToken is POST …/lease/check with {token}: see "Lease tokens" above.
func (s *Server) checkToken(ctx context.Context, key lease.Key, token string) (lease.Lease, *leasetoken.Claims, error) {
	claims, err := s.verifier.Verify(ctx, token)
	switch {
	case err == nil:
	case errors.Is(err, leasetoken.ErrTokenExpired):
		// Genuine but expired: LEASE_LOST, with the lease as it is now for the details; a token of
		// another user or session is forbidden whether or not it expired, and reads nothing.
		if claims.Subject != key.User || claims.Session != key.Session {
			return lease.Lease{}, nil, forbidden("the lease token is for another user or session")
		}
		l, gerr := s.engine.Get(ctx, key)
		s.metrics.observeOp("get", gerr)
		if gerr != nil {
			return lease.Lease{}, nil, gerr
		}
		return lease.Lease{}, nil, expiredToken(l)
	case errors.Is(err, leasetoken.ErrKeysUnavailable): // not with the server's own keys
		return lease.Lease{}, nil, &Error{Code: CodeInternal, Message: "internal error", Err: err}
	case errors.Is(err, leasetoken.ErrUnknownKey):
		s.warnUnknownKey(err)
		return lease.Lease{}, nil, tokenRefused(reasonUnknownKey, "the lease token is signed by a key this server does not publish", err)
	default:
		return lease.Lease{}, nil, tokenRefused(reasonInvalidToken, "the lease token is not valid", err)
	}
	if claims.Subject != key.User || claims.Session != key.Session {
		return lease.Lease{}, nil, forbidden("the lease token is for another user or session")
	}
	l, err := s.engine.Check(ctx, key, claims.Tab, claims.Epoch)
	s.metrics.observeOp("check", err)
	return l, &claims, err
}

func tokenRefused(reason, msg string, cause error) *Error {
	return &Error{
		Code:    CodeInvalidArgument,
		Message: msg,
		Details: map[string]any{"field": "token", "reason": reason},
		Err:     cause,
	}
}

// expiredToken is the LEASE_LOST answer for a genuine lease token that has expired, with the
// current holder and epoch and the reason.
func expiredToken(current lease.Lease) *Error {
	var holder any // JSON null when free
	if current.Held {
		holder = holderView(current.Holder)
	}
	return &Error{
		Code:    CodeLeaseLost,
		Message: "the lease token has expired; renew the lease and use the new token",
		Details: map[string]any{"holder": holder, "epoch": current.Epoch, "reason": reasonExpiredToken},
	}
}

// unknownKeyEvery is how often at most the log warns that strict checks were shown lease tokens
// signed by a key this server does not publish.
const unknownKeyEvery = 10 * time.Second

// warnUnknownKey warns, at most every unknownKeyEvery (s.unknownKey), that a strict check was
// shown a lease token signed by a key this server does not publish, refused with cause (which
// names its kid). Forged tokens do that, but so do the tokens of another instance when a key
// rotation reached some instances only: the instances then publish different keys, and every
// guard that meets them refuses the holders' writes (README, Key rotation), which the request
// log's 400 alone does not tell an operator.
func (s *Server) warnUnknownKey(cause error) {
	ok, missed, _ := s.unknownKey.Allow("")
	if !ok {
		return
	}
	s.log.Warn("a strict check was shown a lease token signed by a key this instance does not publish; if another instance signs with that key, the instances publish different keys and guards refuse holders' writes (README, Key rotation)",
		"error", cause.Error(), "left_out", missed)
}
