// Package numericdate checks the JWT time claims of a token's payload (exp, nbf, iat: RFC 7519
// NumericDate) before golang-jwt reads them: that package also reads a JSON string of digits
// ("9999999999") as a date, which no issuer of ours writes and a verifier must refuse. Both token
// verifiers use it: access tokens (api) and lease tokens (owner/leasetoken).
package numericdate

import (
	"encoding/json"
	"fmt"
)

// names are the claims Check looks at.
var names = []string{"exp", "nbf", "iat"}

// Check answers an error naming the first of names that payload, a JSON object, has with a value
// that is neither a JSON number nor null; nil otherwise, and for a payload that is not a JSON
// object (the JSON decoder reports that).
func Check(payload []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(payload, &raw); err != nil {
		return nil
	}
	for _, name := range names {
		v, ok := raw[name]
		if !ok || string(v) == "null" {
			continue
		}
		var n json.Number
		if len(v) == 0 || v[0] == '"' || json.Unmarshal(v, &n) != nil {
			return fmt.Errorf("%s must be a number", name)
		}
	}
	return nil
}
