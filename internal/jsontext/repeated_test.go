package jsontext

import (
	"strings"
	"testing"
)

func TestRepeatedKey(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{`{"a":1,"b":2}`, ""},
		{`{"a":1,"a":2}`, "a"},
		{`{"a":1,"\u0061":2}`, "a"},
		{`{"type":"object","properties":{"a":{"type":"number"},"a":{"type":"string"}}}`, "properties.a"},
		{`{"type":"string","type":"object"}`, "type"},
		{`{"anyOf":[{"type":"string"},{"type":"number","type":"null"}]}`, "anyOf[1].type"},
		{`{"a":{"x":1},"b":{"x":1},"c":[{"x":1},{"x":1}]}`, ""}, // the same key in different objects
		{`[{"k":1},[{"k":1,"k":2}]]`, "[1][0].k"},
		{`{"a":[1,2,{"b":{"c":{}}}],"d":{"e":[],"e":0}}`, "d.e"},
		{`"a string"`, ""},
		{`{"a":1,"a"`, "a"},     // found before the document ends
		{`{"a":1,,"a":2}`, ""},  // malformed: the decoder reports it
		{`{"a":1} {"a":2}`, ""}, // one value: what follows it is the decoder's to refuse
		{`{"properties":{"a.b":{"c":1,"c":2}}}`, `properties["a.b"].c`},
		{`{"properties":{"a":{"b":{"c":1,"c":2}}}}`, `properties.a.b.c`},
		{`{"":{"":1,"":2}}`, `[""][""]`},
		{`{"x":[{"a b":1,"a b":2}]}`, `x[0]["a b"]`},
	} {
		if got := RepeatedKey([]byte(tc.doc)); got != tc.want {
			t.Errorf("RepeatedKey(%s) = %q, want %q", tc.doc, got, tc.want)
		}
	}
	// Deep nesting is walked without recursion, and named by the end of its path.
	deep := strings.Repeat(`{"a":`, 100000) + `{"b":1,"b":2}` + strings.Repeat(`}`, 100000)
	full := strings.Repeat("a.", 100000) + "b"
	if got := RepeatedKey([]byte(deep)); got != "…"+full[len(full)-maxPath:] {
		t.Errorf("RepeatedKey of 100,000 levels = %q, want \"…\" and the last %d bytes of the path to b", got, maxPath)
	}
}
