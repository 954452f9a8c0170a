package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/tablease/tablease/internal/jsontext"
)

// decodeBody reads the JSON body of c into dst strictly: the Content-Type must be
// application/json, the body at most MaxBodyBytes and valid text (internal/jsontext: UTF-8, no
// lone surrogate escaped), one JSON object with only known fields of the right types (none null),
// and nothing after it. Every failure is 400 INVALID_ARGUMENT except an oversized body, which is
// 413 PAYLOAD_TOO_LARGE.
func decodeBody(c echo.Context, dst any) error {
	if err := jsonContentType(c); err != nil {
		return err
	}
	data, err := readBody(c)
	if err != nil {
		return err
	}
	return decodeJSON(data, dst)
}

// jsonSpace is the whitespace JSON allows between tokens (RFC 8259).
const jsonSpace = " \t\r\n"

// decodeOptionalBody is decodeBody for a body that may be left out: an empty body (no bytes at
// all, or JSON whitespace alone), with or without a Content-Type, leaves dst as it is, like the
// empty object. Anything else is read as decodeBody reads it.
func decodeOptionalBody(c echo.Context, dst any) error {
	data, err := readBody(c)
	if err != nil || len(bytes.Trim(data, jsonSpace)) == 0 {
		return err
	}
	if err := jsonContentType(c); err != nil {
		return err
	}
	return decodeJSON(data, dst)
}

func jsonContentType(c echo.Context) error {
	types := c.Request().Header.Values(echo.HeaderContentType)
	if len(types) > 1 {
		return errInvalid("Content-Type is given twice: a body has one type, application/json")
	}
	if ct := c.Request().Header.Get(echo.HeaderContentType); ct != echo.MIMEApplicationJSON { // the usual one needs no parsing
		mt, params, err := mime.ParseMediaType(ct)
		if err != nil || mt != echo.MIMEApplicationJSON {
			return errInvalid("Content-Type must be application/json")
		}
		if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
			return errInvalid("Content-Type: JSON bodies are UTF-8, so the only charset allowed is utf-8")
		}
	}
	// A compressed body would be read as if it were not (nothing here decompresses it).
	for _, enc := range c.Request().Header.Values("Content-Encoding") {
		if !strings.EqualFold(strings.TrimSpace(enc), "identity") {
			return errInvalid("Content-Encoding: bodies are not compressed; send the JSON as it is")
		}
	}
	return nil
}

// queryParams are the query parameters each /v1 route takes, by method (HEAD as GET) and route;
// a /v1 route not listed takes none. The other routes (health, metrics, the static files) read no
// parameter that matters, and are not checked.
var queryParams = map[string][]string{
	"GET /v1/sessions/:sid/lease":          {"tabId"},
	"GET /v1/sessions/:sid/catalog":        {"tabId", "route"},
	"GET /v1/sessions/:sid/events":         {"tabId", "label", "hidden", "presence", "lastEventId", "ticket"},
	"DELETE /v1/sessions/:sid/tabs/:tabId": {"seq"},
	"GET /v1/admin/leases":                 {"sub", "cursor", "limit"},
	"GET /v1/admin/audit":                  {"sub", "sid", "cursor", "limit"},
}

// urlCredentials are the query parameters that carry credentials, which authentication answers.
var urlCredentials = []string{"access_token", "token", "ticket"}

// strictQuery answers 400 for a query string that does not parse (a malformed %-escape, a
// semicolon): net/url would drop the parameter silently, and the handler would act as if the
// client had not sent it. For the same reason it refuses, on a /v1 route, a parameter the route
// does not take (queryParams), as unknown body fields are refused: a misspelled one (?Seq= for
// ?seq=) would be ignored. Credentials (access_token, token, ticket) pass, for authentication to
// answer them with its own 401 (no access token is read from a URL, a ticket only by the stream).
// An OPTIONS is not checked: a browser's preflight carries the query of the request it precedes,
// which that request's answer checks, and a 400 would hide the missing CORS headers it lacks.
func strictQuery(c echo.Context) error {
	q := c.Request().URL.RawQuery
	if q == "" || c.Request().Method == http.MethodOptions {
		return nil
	}
	values, err := url.ParseQuery(q)
	if err != nil {
		return errInvalid("the query string is malformed: " + err.Error())
	}
	// Every parameter is one value: which of two would the handler read?
	for name, v := range values {
		if len(v) > 1 {
			return fieldError(name, "is given more than once")
		}
	}
	if route := c.Path(); strings.HasPrefix(route, "/v1/") {
		method := c.Request().Method
		if method == http.MethodHead {
			method = http.MethodGet
		}
		known := queryParams[method+" "+route]
		for name := range values {
			if !slices.Contains(known, name) && !slices.Contains(urlCredentials, name) {
				takes := "none"
				if len(known) > 0 {
					takes = strings.Join(known, ", ")
				}
				return fieldError(name, "is not a parameter of this route, which takes "+takes)
			}
		}
	}
	return nil
}

// readBody reads the body of c, at most MaxBodyBytes (413 PAYLOAD_TOO_LARGE beyond).
func readBody(c echo.Context) ([]byte, error) {
	return readAtMost(c, MaxBodyBytes, tooLarge)
}

// readInto appends what r reads, until its end, to buf, growing it as io.ReadAll would.
func readInto(r io.Reader, buf []byte) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// readAtMost reads the body of c, at most limit bytes: tooBig's error beyond (made only then, not
// for every body), 408 REQUEST_TIMEOUT when the server's read timeout passed before it all arrived,
// 400 when it could not be read otherwise.
func readAtMost(c echo.Context, limit int64, tooBig func() *Error) ([]byte, error) {
	req := c.Request()
	if req.ContentLength > limit {
		return nil, tooBig()
	}
	if req.Body == nil {
		return nil, nil
	}
	var data []byte
	var err error
	if req.ContentLength >= 0 {
		// net/http reads no more than the Content-Length, no more than limit: read into a buffer
		// of that size, with a byte to spare for the read that finds the end. io.ReadAll's first
		// 512 bytes were 4.4 % of the bytes a renew allocates (go test -memprofile).
		data, err = readInto(req.Body, make([]byte, 0, req.ContentLength+1))
	} else {
		data, err = io.ReadAll(http.MaxBytesReader(c.Response(), req.Body, limit))
	}
	if err != nil {
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			return nil, tooBig()
		case errors.Is(err, os.ErrDeadlineExceeded):
			return nil, &Error{Code: CodeRequestTimeout, Retryable: true,
				Message: "the request body did not arrive within the server's read timeout"}
		}
		return nil, errInvalid("request body could not be read")
	}
	return data, nil
}

// decodeJSON decodes data into dst strictly (see decodeBody).
func decodeJSON(data []byte, dst any) error {
	if c, ok := dst.(compactDecoder); ok && c.decodeCompact(data) {
		return nil
	}
	return decodeAny(data, dst)
}

// compactDecoder is a body with a decoder of its own for the form clients write it in (see
// compactFields), which answers false, leaving the body zero, for any other form; decodeAny then
// decodes it, with the same result for every body decodeCompact accepts
// (FuzzCompactBodiesAgree). The lease calls' bodies (acquire, renew, release, check) have one:
// encoding/json was 2.5 % of tablease's CPU per renew (perf, 64 clients), and 2.5 % per
// acquire+release.
type compactDecoder interface {
	decodeCompact(data []byte) bool
}

// compactField is a field of a body that compactInto decodes: its key, and where its value goes,
// by kind (the one kind the field takes; a value of another kind is refused).
type compactField struct {
	key     string
	str     *string          // a string, without its quotes
	number  *json.RawMessage // an integer, as written
	boolean *bool
	present *bool // set when the key is there
}

// compactInto decodes data, a JSON object in the compact form (compactFields), into fields (at
// most 64): each key one of theirs, at most once, its value of its field's kind. It answers false
// otherwise, having filled some of the fields maybe: the caller then zeroes them.
func compactInto(data []byte, fields []compactField) bool {
	var seen uint64
	return compactFields(data, func(key, v []byte) bool {
		for i := range fields {
			f := &fields[i]
			if string(key) != f.key {
				continue
			}
			if seen&(1<<i) != 0 {
				return false
			}
			seen |= 1 << i
			switch v[0] { // compactFields gives a string, true, false or an integer
			case '"':
				if f.str == nil {
					return false
				}
				*f.str = string(v[1 : len(v)-1])
			case 't', 'f':
				if f.boolean == nil {
					return false
				}
				*f.boolean = v[0] == 't'
			default:
				if f.number == nil {
					return false
				}
				*f.number = v
			}
			if f.present != nil {
				*f.present = true
			}
			return true
		}
		return false
	})
}

// compactFields calls field with each key and the raw value of data, a JSON object in the compact
// form JSON.stringify and encoding/json write: no whitespace, and each value a string of printable
// ASCII without escapes, a number without fraction or exponent, true or false. It answers false
// when data is not of this form, or field answers false (a key it does not know, or seen twice).
func compactFields(data []byte, field func(key, value []byte) bool) bool {
	n := len(data)
	if n < 2 || data[0] != '{' || data[n-1] != '}' {
		return false
	}
	for i := 1; ; {
		k, ok := compactString(data, i)
		if !ok || k >= n || data[k] != ':' {
			return false
		}
		key := data[i+1 : k-1]
		v := k + 1
		end, ok := compactString(data, v)
		if !ok {
			end = compactLiteral(data, v)
		}
		if end == v || end >= n || !field(key, data[v:end]) {
			return false
		}
		switch {
		case end == n-1:
			return true
		case data[end] != ',':
			return false
		}
		i = end + 1
	}
}

// compactString answers the end of the string of printable ASCII without escapes that starts at
// data[i], past its closing quote.
func compactString(data []byte, i int) (int, bool) {
	if i >= len(data) || data[i] != '"' {
		return 0, false
	}
	for j := i + 1; j < len(data); j++ {
		switch c := data[j]; {
		case c == '"':
			return j + 1, true
		case c < 0x20 || c > 0x7e || c == '\\':
			return 0, false
		}
	}
	return 0, false
}

// compactLiteral answers the end of the integer (-?(0|[1-9][0-9]*)), true or false that starts at
// data[i], or i when none does.
func compactLiteral(data []byte, i int) int {
	for _, lit := range []string{"true", "false"} {
		if len(data)-i >= len(lit) && string(data[i:i+len(lit)]) == lit {
			return i + len(lit)
		}
	}
	j := i
	if j < len(data) && data[j] == '-' {
		j++
	}
	switch {
	case j >= len(data) || data[j] < '0' || data[j] > '9':
		return i
	case data[j] == '0':
		j++
	default:
		for j < len(data) && data[j] >= '0' && data[j] <= '9' {
			j++
		}
	}
	if j < len(data) && (data[j] == '.' || data[j] == 'e' || data[j] == 'E' || (data[j] >= '0' && data[j] <= '9')) {
		return i // a fraction, an exponent, or digits after a leading 0: not this form
	}
	return j
}

// decodeAny decodes data into dst as decodeBody says.
func decodeAny(data []byte, dst any) error {
	// encoding/json would store each invalid byte, and each lone surrogate, as U+FFFD.
	if err := jsontext.Check(data); err != nil {
		return errInvalid("request body " + err.Error())
	}
	if err := jsontext.Keys(data, jsontext.Fields(dst)); err != nil {
		return keyError(err)
	}
	// json.Unmarshal rather than a Decoder: it refuses anything but whitespace after the value
	// itself, and the unknown keys are refused above, where every body's fields are; a Decoder,
	// its reader and its buffer cost a renew's decoding 3 of its 11 allocations, 744 of its 1,080
	// bytes and a third of its time (BenchmarkDecodeBody, renew).
	// Every body gets the answer the Decoder gave it (TestDecodeJSONAnswersAsTheDecoder).
	trimmed := bytes.TrimLeft(data, jsonSpace)
	if len(trimmed) == 0 {
		return decodeError(io.EOF)
	}
	if err := json.Unmarshal(data, dst); err != nil {
		var syntax *json.SyntaxError
		if !errors.As(err, &syntax) {
			return decodeError(err)
		}
		switch msg := syntax.Error(); {
		case msg == "unexpected end of JSON input",
			// A literal cut short: the scanner's words for the space it reads after the end.
			syntax.Offset == int64(len(data)) && data[len(data)-1] != ' ' &&
				strings.HasPrefix(msg, "invalid character ' '"):
			return decodeError(io.ErrUnexpectedEOF)
		case strings.HasSuffix(msg, " after top-level value"):
			// The value before the data answers first, as the Decoder read it first.
			if err := decodeValue(data[:syntax.Offset-1], trimmed, dst); err != nil {
				return err
			}
			return errInvalid("request body must hold exactly one JSON object; found data after it")
		}
		return decodeError(err)
	}
	return decodeValue(nil, trimmed, dst)
}

// decodeValue decodes the JSON value data into dst, when data is not nil, and refuses a null:
// encoding/json stores a null as nothing at all, where the body must be an object. trimmed is the
// body without its leading whitespace.
func decodeValue(data, trimmed []byte, dst any) error {
	if data != nil {
		if err := json.Unmarshal(data, dst); err != nil {
			return decodeError(err)
		}
	}
	if bytes.HasPrefix(trimmed, []byte("null")) {
		return errInvalid("request body must be a JSON object")
	}
	return nil
}

// keyError is the answer to a key jsontext.Keys refused.
func keyError(err *jsontext.KeyError) *Error {
	if err.Reason == jsontext.UnknownKey {
		e := errInvalid(fmt.Sprintf("request body: unknown field %q", err.Key))
		e.Details = map[string]any{"field": err.Key}
		return e
	}
	return fieldError(err.Key, string(err.Reason))
}

func decodeError(err error) *Error {
	var (
		syntax *json.SyntaxError
		typ    *json.UnmarshalTypeError
	)
	switch {
	case errors.Is(err, io.EOF):
		return errInvalid("request body is empty; a JSON object is required")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errInvalid("request body is truncated JSON")
	case errors.As(err, &syntax):
		return errInvalid("request body is not valid JSON: " + strings.TrimPrefix(syntax.Error(), "json: "))
	case errors.As(err, &typ):
		if typ.Field == "" {
			return errInvalid("request body must be a JSON object")
		}
		e := errInvalid(typ.Field + " must be " + jsonKind(typ.Type.Kind().String()))
		e.Details = map[string]any{"field": typ.Field}
		return e
	}
	// The remaining decoder errors (unknown field) have no type of their own; their text names
	// the field and is safe to show.
	return errInvalid("request body: " + strings.TrimPrefix(err.Error(), "json: "))
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "struct", "map":
		return "an object"
	case "slice", "array":
		return "an array"
	}
	return "a number"
}

// intField reads a JSON integer named field from raw: a literal made of an optional minus sign and
// digits, no fraction or exponent, within int64. present is false when the field was absent or
// null.
func intField(field string, raw json.RawMessage) (v int64, present bool, err error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return 0, false, nil
	}
	s := string(raw)
	digits := strings.TrimPrefix(s, "-")
	if digits == "" || strings.TrimLeft(digits, "0123456789") != "" {
		if s[0] == '-' || (s[0] >= '0' && s[0] <= '9') {
			return 0, true, fieldError(field, "must be an integer (no fraction or exponent)")
		}
		return 0, true, fieldError(field, "must be a number")
	}
	v, perr := strconv.ParseInt(s, 10, 64)
	if perr != nil {
		return 0, true, fieldError(field, "is out of range")
	}
	return v, true, nil
}

// queryInt reads v, a query parameter, as an integer in [lo, hi] written in decimal digits alone,
// without sign or leading zero.
func queryInt(v string, lo, hi int64) (int64, bool) {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < lo || n > hi || strconv.FormatInt(n, 10) != v {
		return 0, false
	}
	return n, true
}

func fieldError(field, reason string) *Error {
	e := errInvalid(field + " " + reason)
	e.Details = map[string]any{"field": field}
	return e
}

// pathParam is the decoded path parameter name; a malformed escape is left as it is, for
// ValidateID to refuse. Echo routes on the path as sent (URL.RawPath) when net/http kept it, that
// is when it is not the default encoding of the decoded path, and its parameters are then still
// encoded; otherwise on the decoded path, whose parameters must not be decoded again (a%2541 is
// a%41, not aA).
func pathParam(c echo.Context, name string) string {
	v := c.Param(name)
	if c.Request().URL.RawPath == "" {
		return v
	}
	if d, err := url.PathUnescape(v); err == nil {
		return d
	}
	return v
}
