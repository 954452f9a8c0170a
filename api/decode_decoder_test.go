package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/tablease/tablease/internal/jsontext"
)

// decoderAnswer is decodeJSON as it was with a json.Decoder (DisallowUnknownFields, then a Token
// for the data after the value): the answers decodeJSON must keep.
func decoderAnswer(data []byte, dst any) error {
	if err := jsontext.Check(data); err != nil {
		return errInvalid("request body " + err.Error())
	}
	if err := jsontext.Keys(data, jsontext.Fields(dst)); err != nil {
		return keyError(err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return decodeError(err)
	}
	if bytes.HasPrefix(bytes.TrimLeft(data, jsonSpace), []byte("null")) {
		return errInvalid("request body must be a JSON object")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errInvalid("request body must hold exactly one JSON object; found data after it")
	}
	return nil
}

// decodedBodies are the types of the bodies decodeBody reads, new values of each.
var decodedBodies = []func() any{
	func() any { return &revokeBody{} }, func() any { return &acquireBody{} },
	func() any { return &renewBody{} }, func() any { return &releaseBody{} },
	func() any { return &checkBody{} }, func() any { return &tabPresenceBody{} },
	func() any { return &ticketBody{} },
}

// checkDecodesAsTheDecoder fails t when decodeJSON answers data otherwise than decoderAnswer, or
// decodes another value, for any body type.
func checkDecodesAsTheDecoder(t *testing.T, data []byte) {
	t.Helper()
	for _, body := range decodedBodies {
		got, want := body(), body()
		errGot, errWant := decodeJSON(data, got), decoderAnswer(data, want)
		if (errGot == nil) != (errWant == nil) || (errGot != nil && errGot.Error() != errWant.Error()) {
			t.Errorf("%T %q: %v; the Decoder: %v", got, data, errGot, errWant)
		} else if errGot == nil && !reflect.DeepEqual(got, want) {
			t.Errorf("%T %q: %+v; the Decoder: %+v", got, data, got, want)
		}
	}
}

func TestDecodeJSONAnswersAsTheDecoder(t *testing.T) {
	inputs := []string{``, ` `, "\n\t", `{`, `{"tabId":"tab-a"`, `{"tabId":"tab-a"} x`, `{} {}`, `null`,
		`null x`, ` null `, `[]`, `"x"`, `1`, `{"tabId":1}`, `{"tabId":1} x`, `{"x":1}`,
		`{"tabId":"a","epoch":{"a":1}}`, `{"tabId":"a","hidden":"no"}`, `{"tabId":"a",}`, `{"tabId":"a"}}`,
		`{"tabId":"a"}]`, `tru`, `tru `, "tru\n", `t`, `n`, `-`, `-0e`, `1.`, `"abc`, `{"a":tru}`,
		`{"tabId":"a","epoch":1e3}`, `{"tabId":"\ud800"}`, "{\"tabId\":\"\xff\"}",
		`{"tabId":"a","epoch":12,"ttlMs":5,"hidden":true}`, `{"TABID":"a"}`, `{"tabId":"a","tabId":"b"}`,
		`{"tabId":null}`, `{"tabId":"a"}  `, "{\"tabId\":\"a\"}\n\t", `{"mode":"try","tabId":"a"}`,
		`{"mode":1}`, `{"expiresInMs":5}`, `{"expiresInMs":5.5}`, `{"expiresInMs":"5"} 1`, `{"gone":true}x`}
	for _, in := range inputs {
		checkDecodesAsTheDecoder(t, []byte(in))
	}
	// And the corpus of FuzzDecodeJSON.
	files, _ := filepath.Glob("testdata/fuzz/FuzzDecodeJSON/*")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			line = strings.TrimSpace(line)
			if i := strings.Index(line, "("); i > 0 && strings.HasSuffix(line, ")") {
				if s, err := strconv.Unquote(line[i+1 : len(line)-1]); err == nil {
					checkDecodesAsTheDecoder(t, []byte(s))
				}
			}
		}
	}
}

func FuzzDecodeJSONAnswersAsTheDecoder(f *testing.F) {
	for _, s := range []string{`{"tabId":"a","epoch":12}`, `{"tabId":"a"} x`, `tru`, `null x`, `{"mode":1} {`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) { checkDecodesAsTheDecoder(t, data) })
}

// TestDecodedBodiesAreFlat: decodeJSON refuses unknown keys only at the top of a body
// (jsontext.Keys), which is where every body's fields are: no field is an object of fields.
func TestDecodedBodiesAreFlat(t *testing.T) {
	raw := reflect.TypeFor[json.RawMessage]()
	for _, body := range decodedBodies {
		typ := reflect.TypeOf(body()).Elem()
		for f := range typ.Fields() {
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			switch {
			case ft == raw:
			case ft.Kind() == reflect.Struct, ft.Kind() == reflect.Map, ft.Kind() == reflect.Slice,
				ft.Kind() == reflect.Array, ft.Kind() == reflect.Interface:
				t.Errorf("%s.%s is a %s: json.Unmarshal would let unknown keys in it through", typ, f.Name, ft)
			}
		}
	}
}
