package jsontext

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
)

// RepeatedKey answers where, anywhere in the JSON value data, an object has a key given twice:
// the path of the second ("properties.a", "anyOf[1].type"), and "" when no object has one, or
// when data is not valid JSON (the decoder reports that). Keys are compared as decoded, so an
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
						if b.Len() > 0 {
							b.WriteByte('.')
						}
						b.WriteString(k)
					case l.object:
						if b.Len() > 0 {
							b.WriteByte('.')
						}
						b.WriteString(l.key)
					default:
						b.WriteString("[" + strconv.Itoa(l.index) + "]")
					}
				}
				return b.String()
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
			stack = append(stack, &level{object: d == '{', keys: map[string]bool{}, atKey: d == '{', index: -1})
		} else if top == nil {
			return "" // a value that is not an object or array
		}
	}
}
