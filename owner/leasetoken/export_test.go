package leasetoken

import "github.com/tablease/tablease/internal/verifiedtokens"

// Remembered is the number of tokens v remembers as verified.
func (v *Verifier) Remembered() int { return v.verified.Len() }

// ForgetVerified empties the tokens v remembers, so that the next verification is a first one.
func (v *Verifier) ForgetVerified() { v.verified = verifiedtokens.Cache[verifiedToken]{} }
