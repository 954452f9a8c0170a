// Package numericdate checks the JWT time claims of a token's payload (exp, nbf, iat: RFC 7519
// NumericDate) before golang-jwt reads them: that package also reads a JSON string of digits
// ("9999999999") as a date, which no issuer of ours writes and a verifier must refuse, and it turns
// a number beyond int64 seconds (1e19) into a date in the distant past, so that such an exp reads
// as "expired" rather than malformed, and it reads a null as the claim left out, so that
// "nbf": null would pass where the claim's number would not. Both token
// verifiers use it: access tokens (api) and lease tokens (owner/leasetoken).
package numericdate

import (
	"encoding/json"
	"fmt"
)

// names are the claims Check looks at.
var names = []string{"exp", "nbf", "iat"}

// latest is the last second of the year 9999 UTC, the latest date Check accepts.
const latest = 253402300799

// Check answers an error naming the first of names that payload, a JSON object, has with a value
// that is not a JSON number of seconds from 1970 to the end of 9999 (null included); nil otherwise,
// and for a payload that is not a JSON object (the JSON decoder reports that).
func Check(payload []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(payload, &raw); err != nil {
		return nil
	}
	for _, name := range names {
		v, ok := raw[name]
		if !ok {
			continue
		}
		var n json.Number
		if len(v) == 0 || v[0] == '"' || string(v) == "null" || json.Unmarshal(v, &n) != nil {
			return fmt.Errorf("%s must be a number", name)
		}
		if f, err := n.Float64(); err != nil || f < 0 || f > latest {
			return fmt.Errorf("%s must be a date from 1970 to 9999 in seconds", name)
		}
	}
	return nil
}
