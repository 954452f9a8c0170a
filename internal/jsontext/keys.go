package jsontext

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"sync"
)

// KeyReason is why Keys refuses a key.
type KeyReason string

// The reasons of a KeyError (the text of the others is said of the key: "tabId is given twice").
const (
	UnknownKey   KeyReason = "is not a field"
	DuplicateKey KeyReason = "is given twice"
	NullValue    KeyReason = "must not be null: leave it out instead"
	CaseOnlyKey  KeyReason = "matches a field only when case is ignored" // Claims only: Keys says UnknownKey
)

// A KeyError is a key of a JSON object that Keys refuses.
type KeyError struct {
	Key    string
	Reason KeyReason
}

// Error is "unknown field \"key\"" for an unknown key (the text encoding/json's own refusal has),
// and the key and its reason otherwise, the key quoted when it holds a character that Go quotes
// (a control or format character, a quote, a backslash): a token's claims may give any key twice,
// and the text goes into answers and log lines.
func (e *KeyError) Error() string {
	q := strconv.Quote(e.Key)
	if e.Reason == UnknownKey {
		return "unknown field " + q
	}
	if q[1:len(q)-1] == e.Key {
		q = e.Key
	}
	return q + " " + string(e.Reason)
}

// Keys refuses, in the top-level object of data, what encoding/json lets through: a key that
// matches a field only when case is ignored ("TABID"; fields holds the exact names), a key given
// twice (encoding/json keeps the last), and a null (which encoding/json reads as the field left
// out, where no field may be null: it is left out instead). It reads the keys and steps over their
// values without decoding them (the decoder's token stream did the same at ten times the cost);
// anything malformed, or data that is not an object, is left for the decoder to report (nil).
func Keys(data []byte, fields map[string]bool) *KeyError {
	return walkKeys(data, fields, true)
}

// Claims is Keys for the claims of a token, which may hold keys of their own and nulls (identity
// providers add claims): it refuses only a key given twice and a key that matches one of fields
// only when case is ignored ("SUB"), either of which encoding/json would read otherwise than
// another verifier of the same token.
func Claims(data []byte, fields map[string]bool) *KeyError {
	return walkKeys(data, fields, false)
}

// walkKeys is Keys when strict, and Claims otherwise.
func walkKeys(data []byte, fields map[string]bool, strict bool) *KeyError {
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return nil
	}
	var buf [16][]byte
	seen := buf[:0]
	for i = skipSpace(data, i+1); i < len(data) && data[i] == '"'; {
		end, escaped := stringEnd(data, i)
		if end < 0 {
			return nil
		}
		key := data[i+1 : end-1]
		if escaped {
			var k string
			if json.Unmarshal(data[i:end], &k) != nil {
				return nil
			}
			key = []byte(k)
		}
		if !fields[string(key)] {
			if strict {
				return &KeyError{Key: string(key), Reason: UnknownKey}
			}
			if otherCase(fields, key) {
				return &KeyError{Key: string(key), Reason: CaseOnlyKey}
			}
		}
		for _, k := range seen {
			if bytes.Equal(k, key) {
				return &KeyError{Key: string(key), Reason: DuplicateKey}
			}
		}
		seen = append(seen, key)
		if i = skipSpace(data, end); i >= len(data) || data[i] != ':' {
			return nil
		}
		if i = skipSpace(data, i+1); strict && bytes.HasPrefix(data[i:], []byte("null")) {
			return &KeyError{Key: string(key), Reason: NullValue}
		}
		if i = skipValue(data, i); i < 0 {
			return nil
		}
		if i = skipSpace(data, i); i >= len(data) || data[i] != ',' {
			return nil
		}
		i = skipSpace(data, i+1)
	}
	return nil
}

// otherCase reports whether key is one of fields when case is ignored.
func otherCase(fields map[string]bool, key []byte) bool {
	for f := range fields {
		if strings.EqualFold(f, string(key)) {
			return true
		}
	}
	return false
}

func skipSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\r' || data[i] == '\n') {
		i++
	}
	return i
}

// stringEnd answers the index after the closing quote of the JSON string that starts at data[i],
// and whether it holds an escape; -1 when it does not end.
func stringEnd(data []byte, i int) (int, bool) {
	escaped := false
	for j := i + 1; j < len(data); j++ {
		switch data[j] {
		case '\\':
			escaped = true
			j++
		case '"':
			return j + 1, escaped
		}
	}
	return -1, escaped
}

// skipValue answers the index after the JSON value that starts at data[i], -1 when it does not
// end. It does not validate the value: the decoder does.
func skipValue(data []byte, i int) int {
	depth := 0
	for i < len(data) {
		switch data[i] {
		case '"':
			end, _ := stringEnd(data, i)
			if end < 0 || depth == 0 {
				return end
			}
			i = end
			continue
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i
			}
			if depth--; depth == 0 {
				return i + 1
			}
		case ',', ' ', '\t', '\r', '\n':
			if depth == 0 {
				return i
			}
		}
		i++
	}
	if depth == 0 {
		return i
	}
	return -1
}

// fieldsByType caches Fields by type: the types decoded are few and fixed.
var fieldsByType sync.Map // reflect.Type → map[string]bool, read-only once stored

// Fields lists the JSON names of the fields of the struct dst is or points to, for Keys.
func Fields(dst any) map[string]bool {
	t := reflect.TypeOf(dst)
	if f, ok := fieldsByType.Load(t); ok {
		return f.(map[string]bool)
	}
	fields := structFields(t)
	fieldsByType.Store(t, fields)
	return fields
}

func structFields(t reflect.Type) map[string]bool {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	fields := make(map[string]bool)
	if t.Kind() != reflect.Struct {
		return fields
	}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			for n := range structFields(f.Type) { // its fields are the struct's, as encoding/json reads them
				fields[n] = true
			}
			continue
		}
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		fields[name] = true
	}
	return fields
}

// Token checks a part of a token, its claims or its header, as decoded from base64: Check, then
// Claims. A verifier that reads such a part otherwise than another one does (a character it
// replaced, a key it read twice) may accept what the other refuses.
func Token(data []byte, fields map[string]bool) error {
	if err := Check(data); err != nil {
		return err
	}
	if err := Claims(data, fields); err != nil {
		return err
	}
	return nil
}

// headerFields are the header parameters of RFC 7515 that tablease's tokens and verifiers read.
var headerFields = map[string]bool{"alg": true, "typ": true, "kid": true, "crit": true}

// Header checks the header of the compact JWS token (its first part, base64url without padding)
// with Token: {"alg":"none","alg":"HS256"} names its algorithm twice. A header that does not
// decode is left for the parser to report (nil).
func Header(token string) error {
	part, _, ok := strings.Cut(token, ".")
	if !ok {
		return nil
	}
	data, err := base64.RawURLEncoding.DecodeString(part)
	if err != nil {
		return nil
	}
	return Token(data, headerFields)
}
