package jsontext

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf8"
)

// RepeatedKey answers where, anywhere in the JSON value data, an object has a key given twice:
// the path of the second ("properties.a", "anyOf[1].type", `properties["a.b"]`: a key that is
// not a plain name is quoted; a path of more than maxPath bytes keeps its end, after "…"), and
// "" when no object has one, or when data is not valid JSON (the decoder reports that). Keys are compared as decoded, so an
// escaped spelling of a key is the same key. It is for documents whose every level is kept and
// passed on as written (a tool's JSON Schema), where a reader that keeps the first of two values
// and one that keeps the last would read two documents. It walks with a stack of its own, so a
// deeply nested value costs memory in proportion to its size, not goroutine stack.
func RepeatedKey(data []byte) string {
	type level struct {
		object bool
		keys   map[string]bool // an object's keys so far
		key    string          // an object's last key
		atKey  bool            // an object's next token is a key
		index  int             // an array's index of its last element
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var stack []*level
	for {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		var top *level
		if n := len(stack); n > 0 {
			top = stack[n-1]
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			if stack = stack[:len(stack)-1]; len(stack) == 0 {
				return ""
			}
			continue
		}
		if top != nil && top.object && top.atKey {
			k, _ := tok.(string)
			if top.keys[k] {
				// The path: each level's key or index, the last level's being k.
				var b strings.Builder
				for i, l := range stack {
					switch {
					case i == len(stack)-1:
						writeKey(&b, k)
					case l.object:
						writeKey(&b, l.key)
					default:
						b.WriteString("[" + strconv.Itoa(l.index) + "]")
					}
				}
				return shortPath(b.String())
			}
			top.keys[k], top.key, top.atKey = true, k, false
			continue
		}
		switch {
		case top == nil:
		case top.object:
			top.atKey = true
		default:
			top.index++
		}
		if d, ok := tok.(json.Delim); ok {
			l := &level{object: d == '{', atKey: d == '{', index: -1}
			if l.object {
				l.keys = map[string]bool{}
			}
			stack = append(stack, l)
		} else if top == nil {
			return "" // a value that is not an object or array
		}
	}
}

// maxPath bounds the path RepeatedKey answers: a key repeated deep in a document is named by the
// end of its path.
const maxPath = 200

// writeKey writes key as the next step of a path: ".key" (or "key" first) for a plain name, and
// `["key"]` quoted for any other (a key with a dot, a bracket, a space, or none at all), so that
// a path reads one way only.
func writeKey(b *strings.Builder, key string) {
	plain := key != ""
	for _, r := range key {
		if !(r == '_' || r == '-' || r == '$' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			plain = false
			break
		}
	}
	switch {
	case !plain:
		b.WriteString("[" + strconv.Quote(key) + "]")
	case b.Len() > 0:
		b.WriteString("." + key)
	default:
		b.WriteString(key)
	}
}

// shortPath is path, or "…" and its last maxPath bytes (whole characters) when it is longer.
func shortPath(path string) string {
	if len(path) <= maxPath {
		return path
	}
	cut := len(path) - maxPath
	for cut < len(path) && !utf8.RuneStart(path[cut]) {
		cut++
	}
	return "…" + path[cut:]
}
