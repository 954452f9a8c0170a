package jsontext

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	tests := []struct {
		doc  string
		want error
	}{
		{`{"label":"plain"}`, nil},
		{`{"label":"caf\u00e9 \u263a"}`, nil},
		{`{"label":"\ud83d\ude00"}`, nil}, // a pair: U+1F600
		{`{"label":"\uD83D\uDE00"}`, nil},
		{`{"label":"\\udead"}`, nil}, // an escaped backslash, then text
		{`{"label":"\\\ud83d\ude00"}`, nil},
		{`{"label":"\"\n\t\/"}`, nil},
		{`{"label":"\udead"}`, ErrLoneSurrogate},
		{`{"label":"\ud83d"}`, ErrLoneSurrogate},
		{`{"label":"\ud83dx"}`, ErrLoneSurrogate},
		{`{"label":"\ud83d\u0041"}`, ErrLoneSurrogate},
		{`{"label":"\ud83d\ud83d"}`, ErrLoneSurrogate},
		{`{"label":"\ude00\ud83d"}`, ErrLoneSurrogate},
		{`{"label":"\\\udead"}`, ErrLoneSurrogate},
		{"{\"label\":\"\xff\"}", ErrNotUTF8},
		{`{"label":"\u12"}`, nil}, // malformed: the decoder's to refuse
		{`"\`, nil},
	}
	for _, tt := range tests {
		if got := Check([]byte(tt.doc)); !errors.Is(got, tt.want) {
			t.Errorf("Check(%s) = %v, want %v", tt.doc, got, tt.want)
		}
	}
}

// What Check refuses is exactly what encoding/json would replace: for valid JSON, Check passes
// a document if and only if decoding it yields no U+FFFD that the text did not hold as such.
func FuzzCheckAgreesWithTheDecoder(f *testing.F) {
	for _, s := range []string{`"\udead"`, `"\ud83d\ude00"`, `"\\udead"`, `"a\u00e9"`, `"\ufffd"`, `"�"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, doc string) {
		var s string
		if json.Unmarshal([]byte(doc), &s) != nil {
			return
		}
		err := Check([]byte(doc))
		if errors.Is(err, ErrNotUTF8) {
			return // encoding/json replaced the invalid bytes
		}
		replaced := strings.Count(s, "\uFFFD") > ownReplacements(doc)
		if replaced != (err != nil) {
			t.Fatalf("Check(%q) = %v, but decoding gives %q", doc, err, s)
		}
	})
}

// ownReplacements counts the replacement characters the text of doc holds itself: as UTF-8, or
// as \ufffd escapes (an escaped backslash before "ufffd" is not one).
func ownReplacements(doc string) int {
	n := strings.Count(doc, "\uFFFD")
	for i := 0; i+1 < len(doc); i++ {
		if doc[i] != '\\' {
			continue
		}
		if doc[i+1] == 'u' && i+6 <= len(doc) && strings.EqualFold(doc[i+2:i+6], "fffd") {
			n++
		}
		i++ // past the escaped character
	}
	return n
}
