package jsontext

import "testing"

type claimsOf struct {
	embedded
	Scope string `json:"scope"`
}

type embedded struct {
	Subject string `json:"sub"`
}

func TestKeysAndClaims(t *testing.T) {
	fields := Fields(&claimsOf{})
	if !fields["sub"] || !fields["scope"] || len(fields) != 2 {
		t.Fatalf("Fields = %v, want sub (from the embedded struct) and scope", fields)
	}
	for _, tt := range []struct {
		doc          string
		keys, claims KeyReason // "" for accepted
	}{
		{`{"sub":"a","scope":"x"}`, "", ""},
		{`{"sub":"a","tenant":"t"}`, UnknownKey, ""},
		{`{"sub":"a","groups":null}`, UnknownKey, ""},
		{`{"sub":null}`, NullValue, ""},
		{`{"sub":"a","sub":"b"}`, DuplicateKey, DuplicateKey},
		{`{"sub":"a","SUB":"b"}`, UnknownKey, CaseOnlyKey},
		{`{"s\u0075b":"a","sub":"b"}`, DuplicateKey, DuplicateKey},
		{`{"tenant":1,"tenant":2}`, UnknownKey, DuplicateKey},
		{`not json`, "", ""},
	} {
		reason := func(e *KeyError) KeyReason {
			if e == nil {
				return ""
			}
			return e.Reason
		}
		if got := reason(Keys([]byte(tt.doc), fields)); got != tt.keys {
			t.Errorf("Keys(%s) = %q, want %q", tt.doc, got, tt.keys)
		}
		if got := reason(Claims([]byte(tt.doc), fields)); got != tt.claims {
			t.Errorf("Claims(%s) = %q, want %q", tt.doc, got, tt.claims)
		}
	}
}
