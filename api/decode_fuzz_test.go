package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strconv"
	"testing"
	"unicode/utf8"

	"github.com/tablease/tablease/api/socket"
	"github.com/tablease/tablease/internal/jsontext"
)

// FuzzDecodeJSON decodes the input into each request body type of the API and compares the
// verdict with an oracle written apart from jsontext.Keys: a body is accepted exactly when it is one
// JSON object (and nothing but whitespace after it) whose keys are field names of the type, spelled
// exactly, each at most once, none null, in valid UTF-8 without lone surrogates, and whose values encoding/json can store
// in the fields. A refusal is a 400 INVALID_ARGUMENT *Error; an accepted body encodes and decodes
// back to the same value, and every integer field reads as a JSON integer literal or is refused
// with its name.
func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{
		`{"tabId":"t-1","label":"x","ttlMs":1000,"hidden":true,"mode":"try"}`,
		`{"tabId":"t-1","epoch":1764680400123456}`, `{"token":"a.b.c"}`, `{"reason":"r","blockMs":60000}`,
		`{}`, ` {} `, `[]`, `"x"`, `{"tabId":"t-1"} {}`, `{"tabId":"t-1"}x`, `{"TABID":"t-1"}`,
		`{"tabId":"a","tabId":"b"}`, `{"epoch":1.5}`, `{"epoch":1e3}`, `{"epoch":-0}`, `{"epoch":99999999999999999999}`,
		`{"epoch":"1"}`, `{"hidden":"true"}`, `{"label":"\ud800"}`, `{"tabId":null}`, `{"epoch":null}`, "{\"tabId\":\"t\xff\"}",
		`{"tabId":"t-1",}`, `{`, ``, `{"mode":1}`, `{"reason":null}`, `{"tabId":{"a":1}}`,
		`{"tabId":"a","epoch":1,"tabId":"b"}`, `{"tabId":"t-1","label":"x","hidden":false,"ttlMs":5,"label":"y"}`,
	} {
		for kind := range byte(len(bodyKinds)) {
			f.Add(kind, []byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, kind byte, data []byte) {
		newBody := bodyKinds[int(kind)%len(bodyKinds)]
		dst := newBody()
		err := decodeJSON(data, dst)
		want, why := oracleAccepts(data, newBody)
		if (err == nil) != want {
			t.Fatalf("decodeJSON(%q) into %T = %v; the oracle says accepted=%v (%s)", data, dst, err, want, why)
		}
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Code != CodeInvalidArgument || e.Message == "" {
				t.Fatalf("decodeJSON(%q) refused with %#v, not a 400 INVALID_ARGUMENT", data, err)
			}
			return
		}
		enc, merr := json.Marshal(dst)
		if merr != nil {
			t.Fatalf("the decoded %T does not encode: %v", dst, merr)
		}
		again := newBody()
		if err := decodeJSON(enc, again); err != nil {
			t.Fatalf("%q, decoded from %q, is refused: %v", enc, data, err)
		}
		if enc2, _ := json.Marshal(again); !bytes.Equal(enc, enc2) {
			t.Fatalf("%q decodes to %s, which decodes to %s", data, enc, enc2)
		}
		checkIntFields(t, dst)
	})
}

// bodyKinds make the request bodies the handlers decode.
var bodyKinds = []func() any{
	func() any { return new(acquireBody) },
	func() any { return new(renewBody) },
	func() any { return new(releaseBody) },
	func() any { return new(checkBody) },
	func() any { return new(revokeBody) },
	func() any { return new(tabPresenceBody) },
	func() any { return new(ticketBody) },
}

// oracleAccepts is the contract of decodeJSON, read with encoding/json's token stream.
func oracleAccepts(data []byte, newBody func() any) (bool, string) {
	if !json.Valid(data) {
		return false, "not JSON"
	}
	if !utf8.Valid(data) {
		return false, "not UTF-8"
	}
	// Lone surrogates escaped: jsontext's own fuzz test holds Check to what encoding/json replaces.
	if jsontext.Check(data) != nil {
		return false, "a lone surrogate"
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, _ := dec.Token(); tok != json.Delim('{') {
		return false, "not an object"
	}
	names := map[string]bool{}
	typ := reflect.TypeOf(newBody()).Elem()
	for i := range typ.NumField() {
		name, _, _ := cutComma(typ.Field(i).Tag.Get("json"))
		names[name] = true
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, _ := dec.Token()
		key := tok.(string)
		if !names[key] {
			return false, "unknown key " + strconv.Quote(key)
		}
		if seen[key] {
			return false, "key given twice " + strconv.Quote(key)
		}
		seen[key] = true
		var skip json.RawMessage
		_ = dec.Decode(&skip)
		if string(skip) == "null" {
			return false, "null for " + strconv.Quote(key)
		}
	}
	if err := json.Unmarshal(data, newBody()); err != nil {
		return false, "encoding/json: " + err.Error()
	}
	return true, "a known object"
}

func cutComma(tag string) (string, string, bool) {
	if i := bytes.IndexByte([]byte(tag), ','); i >= 0 {
		return tag[:i], tag[i+1:], true
	}
	return tag, "", false
}

// checkIntFields reads every json.RawMessage field of an accepted body as intField does, and
// compares with encoding/json: an integer literal is read as its value, anything else is refused
// with the field's name.
func checkIntFields(t *testing.T, body any) {
	v := reflect.ValueOf(body).Elem()
	for i := range v.NumField() {
		raw, ok := v.Field(i).Interface().(json.RawMessage)
		if !ok {
			continue
		}
		name, _, _ := cutComma(v.Type().Field(i).Tag.Get("json"))
		got, present, err := intField(name, raw)
		trimmed := bytes.TrimSpace(raw)
		if len(trimmed) == 0 || string(trimmed) == "null" {
			if present || err != nil {
				t.Fatalf("intField(%s, %q) = present %v, %v for a field left out", name, raw, present, err)
			}
			continue
		}
		var want int64
		isInt := json.Unmarshal(trimmed, &want) == nil && !bytes.ContainsAny(trimmed, ".eE")
		switch {
		case !present:
			t.Fatalf("intField(%s, %q): not present", name, raw)
		case isInt && (err != nil || got != want):
			t.Fatalf("intField(%s, %q) = %d, %v; want %d", name, raw, got, err, want)
		case !isInt && err == nil:
			t.Fatalf("intField(%s, %q) = %d, accepted what is not an integer literal", name, raw, got)
		case !isInt:
			var e *Error
			if !errors.As(err, &e) || e.Details["field"] != name {
				t.Fatalf("intField(%s, %q) refused with %#v, not naming the field", name, raw, err)
			}
		}
	}
}

// FuzzCompactBodiesAgree: every body that the decoder of its own of an acquire, renew, release or
// check body, or of a socket message, accepts decodes as the general decoder decodes it, without
// error; and one it refuses leaves the body zero, for the general decoder.
func FuzzCompactBodiesAgree(f *testing.F) {
	for _, s := range []string{
		`{"tabId":"t-Xk3_9aQz-Lm0PqR7sTuVwY","epoch":1796586853684756}`,
		`{"tabId":"t-1","label":"Editor","hidden":false,"ttlMs":45000,"mode":"takeover","newEpoch":true}`,
		`{"tabId":"t-1","mode":""}`, `{"tabId":"t-1","mode":"x"}`, `{"tabId":"t-1","mode":null}`, `{"tabId":"t-1","mode":1}`,
		`{"tabId":"t-1","gone":true}`, `{"tabId":"t-1","epoch":1,"gone":false}`, `{"token":"a.b.c"}`,
		`{"token":"a.b.c","tabId":"t-1"}`, `{"token":""}`, `{"token":true}`, `{"label":"\u00e9"}`,
		`{"tabId":"t-1","epoch":1,"hidden":true,"ttlMs":30000}`, `{"hidden":false,"ttlMs":0,"epoch":-0,"tabId":""}`,
		`{"tabId":"t-1","epoch":01}`, `{"tabId":"t-1","epoch":1.5}`, `{"tabId":"t-1","epoch":1e3}`,
		`{"tabId":"t-1","tabId":"t-2"}`, `{"tabId":"t\u00e9"}`, `{"tabId":"t\"1"}`, `{"TABID":"t-1"}`,
		`{"tabId":"t-1","epoch":"1"}`, `{"tabId":"t-1","hidden":1}`, `{"tabId":"t-1","epoch":null}`,
		`{"tabId":"t-1",}`, `{"tabId":"t-1"}x`, `{"tabId": "t-1"}`, `{}`, `{"tabId":"t-1","epoch":99999999999999999999}`,
		`{"tabId":"t-1","epoch":true}`, `{"tabId":"t-1","extra":1}`,
		`{"id":1,"op":"renew","sid":"s1","body":{"tabId":"t-1","epoch":7}}`, `{"id":"a","op":"auth","token":"a.b.c"}`,
		`{"id":1,"op":"renew","sid":"s1","body":{"a":1},"x":{}}`, `{"id":1,"body":{"a":1,"a":2}}`,
		`{"id":1,"body":{"a":"\udead"}}`, `{"id":1,"body":{} }`, `{"id":1,"body":{"b":{"c":[1,2]}}}`,
		`{"id":1.5,"op":"renew"}`, `{"id":-1,"sid":"s","body":{}}`, `{"body":{},"id":1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		compactAgrees(t, data, &acquireBody{}, &acquireBody{})
		compactAgrees(t, data, &renewBody{}, &renewBody{})
		compactAgrees(t, data, &releaseBody{}, &releaseBody{})
		compactAgrees(t, data, &checkBody{}, &checkBody{})
		compactAgrees(t, data, &socketMessage{}, &socketMessage{})
	})
}

// socketMessage is a socket.Message with compactMessage as its decoder of its own.
type socketMessage socket.Message

func (m *socketMessage) decodeCompact(data []byte) bool {
	ok := compactMessage(data, (*socket.Message)(m))
	if !ok {
		*m = socketMessage{}
	}
	return ok
}

// compactAgrees checks FuzzCompactBodiesAgree's rule for data, with fast and general two zero
// bodies of one kind.
func compactAgrees[B any, P interface {
	*B
	compactDecoder
}](t *testing.T, data []byte, fast, general P) {
	t.Helper()
	if !fast.decodeCompact(data) {
		if !reflect.DeepEqual(*fast, *new(B)) {
			t.Fatalf("%T.decodeCompact(%q) refused it and left %+v", fast, data, *fast)
		}
		return
	}
	if err := decodeAny(data, general); err != nil {
		t.Fatalf("%T.decodeCompact(%q) accepted what decodeAny refuses: %v", fast, data, err)
	}
	if !reflect.DeepEqual(*fast, *general) {
		t.Fatalf("%q: decodeCompact %+v, decodeAny %+v", data, *fast, *general)
	}
}

// TestClientsBodiesAreCompact: the bodies of the lease calls that the browser client
// (JSON.stringify, web/sdk/lease.js) and a guard (owner/guard, encoding/json) write take their
// body's own decoder.
func TestClientsBodiesAreCompact(t *testing.T) {
	for _, body := range []string{
		`{"tabId":"t-Xk3_9aQz-Lm0PqR7sTuVwY","label":"Quarterly report"}`,
		`{"tabId":"t-Xk3_9aQz-Lm0PqR7sTuVwY","label":"Quarterly report","hidden":true,"ttlMs":150000,"mode":"takeover"}`,
		`{"tabId":"t-Xk3_9aQz-Lm0PqR7sTuVwY","label":"","ttlMs":30000,"mode":"handoff","newEpoch":true}`,
	} {
		var b acquireBody
		if !b.decodeCompact([]byte(body)) || b.TabID == "" {
			t.Errorf("acquire %s: not decoded by decodeCompact (%+v)", body, b)
		}
	}
	for _, body := range []string{
		`{"tabId":"t-Xk3_9aQz-Lm0PqR7sTuVwY","epoch":1796586853684756}`,
		`{"tabId":"t-Xk3_9aQz-Lm0PqR7sTuVwY","gone":true}`,
	} {
		var b releaseBody
		if !b.decodeCompact([]byte(body)) || b.TabID == "" {
			t.Errorf("release %s: not decoded by decodeCompact (%+v)", body, b)
		}
	}
	guardBody, _ := json.Marshal(map[string]string{"token": "eyJhbGciOiJFZERTQSJ9.eyJzaWQiOiJzMSJ9.c2ln"})
	for _, body := range []string{`{"tabId":"t-Xk3_9aQz-Lm0PqR7sTuVwY","epoch":1796586853684756}`, string(guardBody)} {
		var b checkBody
		if !b.decodeCompact([]byte(body)) || (b.TabID == "" && b.Token == nil) {
			t.Errorf("check %s: not decoded by decodeCompact (%+v)", body, b)
		}
	}
	goBody, _ := json.Marshal(map[string]any{"tabId": "tab-1", "epoch": int64(1796586853684756), "ttlMs": 60000, "hidden": false})
	for _, body := range []string{
		`{"tabId":"t-Xk3_9aQz-Lm0PqR7sTuVwY","epoch":1796586853684756}`,
		`{"tabId":"t-Xk3_9aQz-Lm0PqR7sTuVwY","epoch":1796586853684756,"hidden":true,"ttlMs":150000}`,
		`{"tabId":"t-Xk3_9aQz-Lm0PqR7sTuVwY","epoch":1796586853684756,"ttlMs":30000}`,
		string(goBody),
	} {
		var b renewBody
		if !b.decodeCompact([]byte(body)) || b.TabID == "" || len(b.Epoch) == 0 {
			t.Errorf("renew %s: not decoded by decodeCompact (%+v)", body, b)
		}
	}
}
