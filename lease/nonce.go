package lease

import "time"

// MaxNonceTTL bounds how long a nonce is remembered (one hour): nonces protect short-lived
// credentials, and an unbounded TTL would let a caller pin store memory.
const MaxNonceTTL = time.Hour

// ValidateNonce checks the arguments of a nonce store's UseNonce (leasetest.NonceStore states its
// contract): nonce an identifier, ttl in [1ms, MaxNonceTTL].
func ValidateNonce(nonce string, ttl time.Duration) error {
	if err := ValidateID("nonce", nonce); err != nil {
		return err
	}
	if ttl < time.Millisecond || ttl > MaxNonceTTL {
		return &InvalidError{Field: "nonce ttl", Reason: "must be between 1ms and 1h"}
	}
	return nil
}
