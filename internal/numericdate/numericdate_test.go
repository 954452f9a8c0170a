package numericdate

import "testing"

func TestCheck(t *testing.T) {
	for payload, ok := range map[string]bool{
		`{"exp":1796337361,"nbf":1796337300,"iat":1796337300}`: true,
		`{"exp":1796337361.5}`:                                 true,
		`{"exp":null}`:                                         false,
		`{"nbf":null}`:                                         false,
		`{"iat":null}`:                                         false,
		`{"sub":"u"}`:                                          true,
		`not json`:                                             true, // the decoder's to report
		`{"exp":"1796337361"}`:                                 false,
		`{"iat":"1"}`:                                          false,
		`{"nbf":true}`:                                         false,
		`{"exp":{"n":1}}`:                                      false,
		`{"exp":[1]}`:                                          false,
		`{"exp":253402300799}`:                                 true,
		`{"nbf":0}`:                                            true,
		`{"exp":253402300800}`:                                 false,
		`{"exp":1e19}`:                                         false,
		`{"exp":10000000000000000000}`:                         false,
		`{"iat":-1}`:                                           false,
		`{"exp":1e400}`:                                        false,
	} {
		if err := Check([]byte(payload)); (err == nil) != ok {
			t.Errorf("Check(%s) = %v, want ok %v", payload, err, ok)
		}
	}
}
