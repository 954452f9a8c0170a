package leasetoken

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// DefaultRetireAfter is how long a rotated-out key stays published by default: comfortably more
// than the longest lease token (the hidden TTL maximum, 150 s by default) plus leeway and the time
// guards cache a JWKS.
const DefaultRetireAfter = 10 * time.Minute

// KeySetOptions configure a KeySet.
type KeySetOptions struct {
	// RetireAfter is how long a key that Rotate replaced stays published and accepted. It must be
	// at least the lifetime of the longest lease token (the hidden TTL maximum) plus the
	// verifiers' leeway, or tokens signed just before a rotation would fail before they expire.
	// Default DefaultRetireAfter.
	RetireAfter time.Duration
	// Previous are public keys published and accepted besides the active key, with no retire
	// time: the keys of an earlier deployment while a rotation by configuration rolls out. They
	// stay until the process starts without them.
	Previous []PublicKey
	// Now is the clock that JWKS and LookupKey use to drop retired keys. Default time.Now.
	Now func() time.Time
}

// KeySet is tablease's lease-token keys: one active signing key and the public keys that are
// still published. It is safe for concurrent use.
type KeySet struct {
	retireAfter time.Duration
	now         func() time.Time

	mu       sync.RWMutex // guards active and previous
	active   SigningKey
	previous []retiring // newest first
}

type retiring struct {
	key      PublicKey
	retireAt time.Time // zero: never
}

// NewKeySet makes a KeySet whose active key is active.
func NewKeySet(active SigningKey, opts KeySetOptions) (*KeySet, error) {
	if active.IsZero() {
		return nil, errors.New("leasetoken: a key set needs an active signing key")
	}
	if opts.RetireAfter < 0 {
		return nil, errors.New("leasetoken: RetireAfter must not be negative")
	}
	if opts.RetireAfter == 0 {
		opts.RetireAfter = DefaultRetireAfter
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &KeySet{retireAfter: opts.RetireAfter, now: opts.Now, active: active}
	for i, k := range opts.Previous {
		if k.IsZero() {
			return nil, fmt.Errorf("leasetoken: Previous[%d] is not a key", i)
		}
		if k.kid == active.KeyID() || slices.ContainsFunc(s.previous, func(r retiring) bool { return r.key.kid == k.kid }) {
			continue
		}
		s.previous = append(s.previous, retiring{key: k})
	}
	return s, nil
}

// Active is the key that signs new tokens.
func (s *KeySet) Active() SigningKey {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.active
}

// Rotate makes next the active key. The key it replaces keeps being published and accepted until
// now + RetireAfter. Rotating to the active key changes nothing; rotating to a key that is still
// published makes it active again.
func (s *KeySet) Rotate(next SigningKey, now time.Time) error {
	if next.IsZero() {
		return errors.New("leasetoken: cannot rotate to no key")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if next.KeyID() == s.active.KeyID() {
		return nil
	}
	prev := slices.DeleteFunc(s.previous, func(r retiring) bool {
		return r.key.kid == next.KeyID() || (!r.retireAt.IsZero() && !now.Before(r.retireAt))
	})
	s.previous = append([]retiring{{key: s.active.Public(), retireAt: now.Add(s.retireAfter)}}, prev...)
	s.active = next
	return nil
}

// Published is the public keys valid at now: the active key first, then the previous keys not yet
// retired, newest first.
func (s *KeySet) Published(now time.Time) []PublicKey {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := []PublicKey{s.active.Public()}
	for _, r := range s.previous {
		if r.retireAt.IsZero() || now.Before(r.retireAt) {
			out = append(out, r.key)
		}
	}
	return out
}

// JWKS is the JWK Set of the keys published now (by the KeySet's clock), for
// /.well-known/jwks.json: {"keys":[{"kty":"OKP","crv":"Ed25519","x":…,"kid":…,"alg":"EdDSA",
// "use":"sig"}, …]}. It never contains a private part.
func (s *KeySet) JWKS() []byte { return EncodeJWKS(s.Published(s.now())) }

// LookupKey finds a key published now (by the KeySet's clock); a retired key is unknown.
func (s *KeySet) LookupKey(ctx context.Context, kid string) (PublicKey, error) {
	return PublicKeys(s.Published(s.now())).LookupKey(ctx, kid)
}
