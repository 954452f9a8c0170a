package lease

import (
	"context"
	"time"
)

// MaxNonceTTL bounds how long a nonce is remembered (one hour): nonces protect short-lived
// credentials, and an unbounded TTL would let a caller pin store memory.
const MaxNonceTTL = time.Hour

// Nonces remembers single-use values for a while, so that a credential carrying a nonce (the event
// ticket of an EventSource) is accepted once across every instance that shares the store. Engines
// may implement it beside Engine; leasetest.RunNonces is its conformance suite.
type Nonces interface {
	// UseNonce records nonce as used for ttl, in one atomic step of the store, and reports whether
	// it was fresh: true for the first use, false while an earlier use is remembered. Of many
	// concurrent uses of one nonce, exactly one is fresh. After ttl (by the store's clock) the
	// nonce is forgotten.
	//
	// Errors: *InvalidError when nonce is not an identifier (see ValidateID) or ttl is not in
	// [1ms, MaxNonceTTL]; *UnavailableError for store trouble, which never answers fresh.
	UseNonce(ctx context.Context, nonce string, ttl time.Duration) (fresh bool, err error)
}

// ValidateNonce checks the arguments of Nonces.UseNonce.
func ValidateNonce(nonce string, ttl time.Duration) error {
	if err := ValidateID("nonce", nonce); err != nil {
		return err
	}
	if ttl < time.Millisecond || ttl > MaxNonceTTL {
		return &InvalidError{Field: "nonce ttl", Reason: "must be between 1ms and 1h"}
	}
	return nil
}
