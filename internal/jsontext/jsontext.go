// Package jsontext checks the text of a JSON document for what encoding/json would silently
// accept rather than refuse: bytes that are not UTF-8, and \u escapes of lone UTF-16 surrogates
// ("\udead"), which name no character and which it would store as U+FFFD (Check); and keys of an
// object that match a field only when case is ignored, keys given twice and null values (Keys;
// Claims, for the claims of a token, only the first two; Token and Header, for a token's claims
// and header, Check and Claims). Request bodies, catalogs and tokens are refused with a clear
// error instead of being read otherwise than they were written.
package jsontext

import (
	"errors"
	"unicode/utf8"
)

// Errors of Check.
var (
	ErrNotUTF8       = errors.New("is not valid UTF-8")
	ErrLoneSurrogate = errors.New(`escapes a lone UTF-16 surrogate (such as "\udead"), which is not a character`)
)

// Check answers ErrNotUTF8 or ErrLoneSurrogate when data has what the package comment names, nil
// otherwise. It reads every backslash as the start of an escape, as it is in valid JSON (where a
// backslash appears only within strings); invalid JSON is for the decoder to report.
func Check(data []byte) error {
	if !utf8.Valid(data) {
		return ErrNotUTF8
	}
	for i := 0; i < len(data); i++ {
		if data[i] != '\\' {
			continue
		}
		r, ok := escaped(data, i)
		switch {
		case !ok:
			i++ // a two-character escape, or something the decoder refuses
		case r >= 0xD800 && r <= 0xDBFF:
			if low, ok := escaped(data, i+6); !ok || low < 0xDC00 || low > 0xDFFF {
				return ErrLoneSurrogate
			}
			i += 11
		case r >= 0xDC00 && r <= 0xDFFF:
			return ErrLoneSurrogate
		default:
			i += 5
		}
	}
	return nil
}

// escaped reads the \uXXXX escape at data[i:], answering its code unit, and false when there is
// none there.
func escaped(data []byte, i int) (rune, bool) {
	if i+6 > len(data) || data[i] != '\\' || data[i+1] != 'u' {
		return 0, false
	}
	var r rune
	for _, c := range data[i+2 : i+6] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}
