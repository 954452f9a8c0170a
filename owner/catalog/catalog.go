// Package catalog is the tool catalog of tablease: the MCP-style tool definitions a tab may
// register on WebMCP (Parse), the part of them each tab gets for its role and its current route
// (Catalog.For), and the catalog an instance serves, shared through the lease store (Source).
// docs/catalog.md is the format and its rules.
package catalog

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/tablease/tablease/internal/jsontext"
	"github.com/tablease/tablease/owner"
)

// ErrInvalid is matched (errors.Is) by every error Parse and New return about the catalog's
// content.
var ErrInvalid = errors.New("catalog: invalid")

// Error says what is wrong in a catalog and where.
type Error struct {
	// Index is the position of the tool in "tools", or -1 for the catalog as a whole.
	Index int
	// Name is the tool's name as given (may be empty or invalid).
	Name string
	// Field is the path of the field inside the tool (or the catalog), e.g. "routes[1]" or
	// "annotations.readOnlyHint"; empty for the tool as a whole.
	Field string
	// Reason is a human sentence.
	Reason string
}

func (e *Error) Error() string {
	var where []string
	if e.Index >= 0 {
		tool := fmt.Sprintf("tools[%d]", e.Index)
		if e.Name != "" {
			tool += fmt.Sprintf(" %q", e.Name)
		}
		where = append(where, tool)
	}
	if e.Field != "" {
		where = append(where, e.Field)
	}
	return "catalog: " + strings.Join(append(where, e.Reason), ": ")
}

// Is makes errors.Is(err, ErrInvalid) true.
func (e *Error) Is(target error) bool { return target == ErrInvalid }

// Tool is one tool definition (one profile of a tool name).
type Tool struct {
	Name        string          `json:"name"`
	Title       string          `json:"title,omitempty"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"inputSchema"`
	// OutputSchema describes structured results (MCP); nil when the tool gives none.
	OutputSchema json.RawMessage `json:"outputSchema,omitempty"`
	Annotations  Annotations     `json:"annotations"`
	// TimeoutMs is how long the agent's runtime waits for a result; nil means the client's
	// default (60 s). The browser client settles a call a margin before it.
	TimeoutMs *int64 `json:"timeoutMs,omitempty"`
	// Routes are the route patterns this profile exists on; empty means every route.
	Routes []string `json:"routes,omitempty"`
	// Disabled tools are in the catalog but given to nobody.
	Disabled bool `json:"disabled,omitempty"`

	patterns []pattern // parsed Routes; set by New
}

// Annotations are MCP tool annotations. After Parse or New every hint is non-nil; on a Tool built
// by hand a nil hint means the MCP default, which the methods apply.
type Annotations struct {
	Title           string `json:"title,omitempty"`
	ReadOnlyHint    *bool  `json:"readOnlyHint"`
	DestructiveHint *bool  `json:"destructiveHint"`
	IdempotentHint  *bool  `json:"idempotentHint"`
	OpenWorldHint   *bool  `json:"openWorldHint"`
	// UntrustedContentHint (WebMCP) says the result holds content the site does not vouch for.
	UntrustedContentHint *bool `json:"untrustedContentHint"`
}

// ReadOnly is the effective readOnlyHint (default false).
func (a Annotations) ReadOnly() bool { return deref(a.ReadOnlyHint, false) }

// Destructive is the effective destructiveHint (default true, false for a read-only tool).
func (a Annotations) Destructive() bool { return deref(a.DestructiveHint, !a.ReadOnly()) }

// Idempotent is the effective idempotentHint (default false, true for a read-only tool).
func (a Annotations) Idempotent() bool { return deref(a.IdempotentHint, a.ReadOnly()) }

// OpenWorld is the effective openWorldHint (default true).
func (a Annotations) OpenWorld() bool { return deref(a.OpenWorldHint, true) }

// UntrustedContent is the effective untrustedContentHint (default false).
func (a Annotations) UntrustedContent() bool { return deref(a.UntrustedContentHint, false) }

func deref(p *bool, def bool) bool {
	if p == nil {
		return def
	}
	return *p
}

func ptr(b bool) *bool { return &b }

// Catalog is a validated, versioned list of tools. Catalogs returned by Parse and New must not be
// modified; they are safe for concurrent use.
type Catalog struct {
	Version string `json:"version"`
	Tools   []Tool `json:"tools"`
}

// Limits on a tool's text fields.
const (
	MaxNameLen  = 128
	MaxTitleLen = 200
)

// MaxRoutesPerName bounds the route patterns of all the profiles of one name (a profile without
// routes counts one): checkProfiles compares each pair of them, so a catalog of many thousands
// would take seconds of CPU to refuse or accept.
const MaxRoutesPerName = 256

// Bounds of a tool's timeoutMs.
const (
	MinTimeoutMs = 1000
	MaxTimeoutMs = 3600000
)

// catalogFields, toolFields and annotationFields are what an unknown field's message lists.
const (
	catalogFields    = "a catalog has: version, tools"
	toolFields       = "a tool has: name, title, description, inputSchema, outputSchema, annotations, timeoutMs, routes, disabled"
	annotationFields = "annotations have: title, readOnlyHint, destructiveHint, idempotentHint, openWorldHint, untrustedContentHint"
)

// DefaultInputSchema is the inputSchema of a tool that gives none.
var DefaultInputSchema = json.RawMessage(`{"type":"object"}`)

// Parse reads a catalog from JSON (see the package documentation for the format) and validates it
// as New does. Errors are *Error and match ErrInvalid.
func Parse(data []byte) (*Catalog, error) {
	if err := jsontext.Check(data); err != nil { // encoding/json would store U+FFFD instead
		return nil, &Error{Index: -1, Reason: err.Error()}
	}
	var doc struct {
		Version json.RawMessage    `json:"version"` // accepted and ignored
		Tools   *[]json.RawMessage `json:"tools"`   // nil when left out or null
	}
	if err := keyError(jsontext.Keys(data, jsontext.Fields(&doc)), "", catalogFields); err != nil {
		return nil, parseError(-1, "", err)
	}
	if err := decodeStrict(data, &doc); err != nil {
		return nil, parseError(-1, "", err)
	}
	if doc.Tools == nil {
		return nil, &Error{Index: -1, Field: "tools", Reason: "is required: the list of tools, [] for none"}
	}
	if len(doc.Version) > 0 {
		var v *string
		if err := json.Unmarshal(doc.Version, &v); err != nil {
			return nil, &Error{Index: -1, Field: "version", Reason: "must be a string (it is ignored: the version is derived from the content)"}
		}
	}
	tools := make([]Tool, 0, len(*doc.Tools))
	for i, raw := range *doc.Tools {
		var t Tool
		err := toolKeys(raw)
		if err == nil {
			err = decodeStrict(raw, &t)
		}
		if err != nil {
			var named struct {
				Name string `json:"name"`
			}
			_ = json.Unmarshal(raw, &named)
			return nil, parseError(i, named.Name, err)
		}
		tools = append(tools, t)
	}
	return New(tools)
}

// toolKeys checks the keys of the tool raw and of its annotations with jsontext.Keys: names of
// exactly the case of the fields, each once, none null. encoding/json alone would read
// "readonlyhint" as readOnlyHint, and the last of two as the value, so that a catalog that reads
// as a mutation could give the tool to viewers. The schemas are JSON Schema, served as written:
// a key given twice at any level of one (jsontext.RepeatedKey) would be read one way by a
// client that keeps the first value and another way by one that keeps the last.
func toolKeys(raw json.RawMessage) error {
	if err := keyError(jsontext.Keys(raw, jsontext.Fields(&Tool{})), "", toolFields); err != nil {
		return err
	}
	var t struct {
		// The keys' case is exact: checked above.
		Annotations  json.RawMessage `json:"annotations"`
		InputSchema  json.RawMessage `json:"inputSchema"`
		OutputSchema json.RawMessage `json:"outputSchema"`
	}
	if json.Unmarshal(raw, &t) != nil {
		return nil // the decoder reports it
	}
	for _, s := range []struct {
		name   string
		schema json.RawMessage
	}{{"inputSchema", t.InputSchema}, {"outputSchema", t.OutputSchema}} {
		if at := jsontext.RepeatedKey(s.schema); at != "" {
			return &problem{s.name + "." + at, string(jsontext.DuplicateKey)}
		}
	}
	if len(t.Annotations) == 0 {
		return nil
	}
	return keyError(jsontext.Keys(t.Annotations, jsontext.Fields(&Annotations{})), "annotations.", annotationFields)
}

// problem is what a document of the catalog has wrong where: the path of the field (empty for the
// document as a whole) and why. parseError makes it the *Error of a tool or of the catalog.
type problem struct{ field, reason string }

func (p *problem) Error() string {
	if p.field == "" {
		return p.reason
	}
	return p.field + ": " + p.reason
}

// parseError is the *Error of err in the tool at index (-1: the catalog) named name.
func parseError(index int, name string, err error) *Error {
	e := &Error{Index: index, Name: name, Reason: err.Error()}
	var p *problem
	if errors.As(err, &p) {
		e.Field, e.Reason = p.field, p.reason
	}
	return e
}

// keyError is the problem of a key jsontext.Keys refused in an object of the catalog, whose
// fields are named after the prefix in ("annotations.", or nothing for the catalog and a tool);
// fields is what an unknown key's message lists. It is nil for a null that the catalog's own
// checks refuse with a message of their own (tools: "is required"; a schema: what to write
// instead).
func keyError(err *jsontext.KeyError, in, fields string) error {
	switch {
	case err == nil:
		return nil
	case err.Reason == jsontext.UnknownKey:
		return &problem{in + err.Key, "unknown field (" + fields + ")"}
	case err.Reason == jsontext.NullValue && (err.Key == "tools" || err.Key == "inputSchema" || err.Key == "outputSchema"):
		return nil
	}
	return &problem{in + err.Key, string(err.Reason)}
}

// decodeStrict decodes exactly one JSON value into v, refusing unknown fields and trailing data,
// with error messages free of Go type names.
func decodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("unexpected data after the JSON value")
	}
	return nil
}

func jsonError(err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return fmt.Errorf("invalid JSON at byte %d: %s", syn.Offset, strings.TrimPrefix(syn.Error(), "json: "))
	case errors.As(err, &typ):
		if typ.Field != "" {
			return &problem{typ.Field, fmt.Sprintf("must be %s, not %s", jsonKind(typ.Type.Kind().String()), typ.Value)}
		}
		return fmt.Errorf("must be %s, not %s", jsonKind(typ.Type.Kind().String()), typ.Value)
	case errors.Is(err, io.EOF):
		return errors.New("empty document")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errors.New("invalid JSON: unexpected end of input")
	}
	return errors.New(strings.TrimPrefix(err.Error(), "json: "))
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string":
		return "a string"
	case "bool", "ptr":
		return "a boolean"
	case "int64":
		return "a whole number"
	case "slice":
		return "an array"
	case "struct", "map":
		return "an object"
	}
	return "a " + goKind
}

// New validates tools, applies the defaults (inputSchema, annotations) and computes the version.
// It does not modify tools. Errors are *Error and match ErrInvalid.
func New(tools []Tool) (*Catalog, error) {
	c := &Catalog{Tools: make([]Tool, 0, len(tools))}
	for i, t := range tools {
		n, err := normalize(t)
		if err != nil {
			err.Index, err.Name = i, t.Name
			return nil, err
		}
		c.Tools = append(c.Tools, n)
	}
	if err := checkProfiles(c.Tools); err != nil {
		return nil, err
	}
	canon, err := json.Marshal(struct {
		Tools []Tool `json:"tools"`
	}{c.Tools})
	if err != nil {
		return nil, &Error{Index: -1, Reason: err.Error()}
	}
	sum := sha256.Sum256(canon)
	c.Version = "sha256:" + hex.EncodeToString(sum[:8])
	return c, nil
}

func normalize(t Tool) (Tool, *Error) {
	if err := checkName(t.Name); err != nil {
		return Tool{}, &Error{Field: "name", Reason: err.Error()}
	}
	if err := checkText(t.Title, MaxTitleLen); err != nil {
		return Tool{}, &Error{Field: "title", Reason: err.Error()}
	}
	if err := checkText(t.Annotations.Title, MaxTitleLen); err != nil {
		return Tool{}, &Error{Field: "annotations.title", Reason: err.Error()}
	}
	if strings.TrimSpace(t.Description) == "" {
		return Tool{}, &Error{Field: "description", Reason: "is required"}
	}
	if !utf8.ValidString(t.Description) {
		return Tool{}, &Error{Field: "description", Reason: "must be valid UTF-8"}
	}
	schema, err := checkSchema("inputSchema", t.InputSchema)
	if err != nil {
		return Tool{}, err
	}
	var output json.RawMessage
	if len(t.OutputSchema) > 0 {
		if output, err = checkSchema("outputSchema", t.OutputSchema); err != nil {
			return Tool{}, err
		}
	}
	if t.TimeoutMs != nil && (*t.TimeoutMs < MinTimeoutMs || *t.TimeoutMs > MaxTimeoutMs) {
		return Tool{}, &Error{Field: "timeoutMs", Reason: fmt.Sprintf("must be from %d to %d milliseconds (leave it out for the client's default, 60000)", MinTimeoutMs, MaxTimeoutMs)}
	}
	a := t.Annotations
	if a.ReadOnly() && a.DestructiveHint != nil && *a.DestructiveHint {
		return Tool{}, &Error{Field: "annotations.destructiveHint", Reason: "must not be true for a tool with readOnlyHint true"}
	}
	n := Tool{
		Name:         t.Name,
		Title:        t.Title,
		Description:  t.Description,
		InputSchema:  schema,
		OutputSchema: output,
		Annotations: Annotations{
			Title:                a.Title,
			ReadOnlyHint:         ptr(a.ReadOnly()),
			DestructiveHint:      ptr(a.Destructive()),
			IdempotentHint:       ptr(a.Idempotent()),
			OpenWorldHint:        ptr(a.OpenWorld()),
			UntrustedContentHint: ptr(a.UntrustedContent()),
		},
		Disabled: t.Disabled,
	}
	if t.TimeoutMs != nil {
		n.TimeoutMs = new(int64)
		*n.TimeoutMs = *t.TimeoutMs
	}
	if t.Routes != nil {
		if len(t.Routes) == 0 {
			return Tool{}, &Error{Field: "routes", Reason: "must not be an empty list (leave routes out for a tool on every route)"}
		}
		n.Routes = slices.Clone(t.Routes)
		n.patterns = make([]pattern, 0, len(t.Routes))
		for j, r := range t.Routes {
			p, err := parsePattern(r)
			if err != nil {
				return Tool{}, &Error{Field: fmt.Sprintf("routes[%d] %q", j, r), Reason: err.Error()}
			}
			if slices.Contains(t.Routes[:j], r) {
				return Tool{}, &Error{Field: fmt.Sprintf("routes[%d] %q", j, r), Reason: "is listed twice"}
			}
			n.patterns = append(n.patterns, p)
		}
	}
	return n, nil
}

func checkName(s string) error {
	if s == "" {
		return errors.New("is required")
	}
	if len(s) > MaxNameLen {
		return fmt.Errorf("must be at most %d characters", MaxNameLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '.', c == '-':
		default:
			return errors.New("may contain only A-Z a-z 0-9 _ . -")
		}
	}
	return nil
}

func checkText(s string, maxLen int) error {
	if !utf8.ValidString(s) {
		return errors.New("must be valid UTF-8")
	}
	if utf8.RuneCountInString(s) > maxLen {
		return fmt.Errorf("must be at most %d characters", maxLen)
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return errors.New("must contain only printable characters")
		}
	}
	return nil
}

// checkSchema checks the structure an MCP/WebMCP inputSchema (or outputSchema, named by field) needs — a JSON object with "type":
// "object", "properties" (if any) an object of schemas, "required" (if any) an array of strings —
// and returns it compacted. It does not validate the rest of JSON Schema: browsers and models read
// it, tablease does not evaluate it.
func checkSchema(field string, raw json.RawMessage) (json.RawMessage, *Error) {
	if len(raw) == 0 {
		return slices.Clone(DefaultInputSchema), nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		return nil, &Error{Field: field, Reason: `must be a JSON object schema` + leaveOut(field)}
	}
	var typ string
	if err := json.Unmarshal(obj["type"], &typ); err != nil || typ != "object" {
		return nil, &Error{Field: field + ".type", Reason: `must be "object"`}
	}
	if p, ok := obj["properties"]; ok {
		var props map[string]json.RawMessage
		if err := json.Unmarshal(p, &props); err != nil || props == nil {
			return nil, &Error{Field: field + ".properties", Reason: "must be an object"}
		}
		for k, v := range props {
			if v := bytes.TrimSpace(v); len(v) == 0 || (v[0] != '{' && !bytes.Equal(v, []byte("true")) && !bytes.Equal(v, []byte("false"))) {
				return nil, &Error{Field: field + ".properties." + k, Reason: "must be a schema (an object or a boolean)"}
			}
		}
	}
	if r, ok := obj["required"]; ok {
		var req []string
		if err := json.Unmarshal(r, &req); err != nil || req == nil {
			return nil, &Error{Field: field + ".required", Reason: "must be an array of strings"}
		}
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return nil, &Error{Field: field, Reason: "must be valid JSON"}
	}
	return buf.Bytes(), nil
}

func leaveOut(field string) string {
	if field == "inputSchema" {
		return ` (leave it out for {"type":"object"})`
	}
	return " (or leave it out)"
}

// checkProfiles refuses two entries of one name that can match the same concrete route, and more
// than MaxRoutesPerName routes of one name, before comparing them.
func checkProfiles(tools []Tool) *Error {
	routes := map[string]int{}
	for i, t := range tools {
		if routes[t.Name] += max(len(t.patterns), 1); routes[t.Name] > MaxRoutesPerName {
			return &Error{Index: i, Name: t.Name, Field: "routes", Reason: fmt.Sprintf("are more than %d across the profiles of this name", MaxRoutesPerName)}
		}
	}
	byName := map[string][]int{}
	for i, t := range tools {
		for _, j := range byName[t.Name] {
			if msg, ok := conflict(tools[j], t); ok {
				return &Error{Index: i, Name: t.Name, Reason: fmt.Sprintf("conflicts with tools[%d]: %s; each route may see only one profile of a name", j, msg)}
			}
		}
		byName[t.Name] = append(byName[t.Name], i)
	}
	return nil
}

func conflict(a, b Tool) (string, bool) {
	switch {
	case len(a.patterns) == 0 && len(b.patterns) == 0:
		return "both have no routes, so both exist on every route", true
	case len(a.patterns) == 0:
		return "that one has no routes, so it exists on every route", true
	case len(b.patterns) == 0:
		return "this one has no routes, so it exists on every route", true
	}
	for _, p := range a.patterns {
		for _, q := range b.patterns {
			if overlaps(p, q) {
				return fmt.Sprintf("routes %q and %q can match the same route", p.src, q.src), true
			}
		}
	}
	return "", false
}

// ETag is the version as a strong HTTP entity tag: the version in double quotes.
func (c *Catalog) ETag() string { return `"` + c.Version + `"` }

// MatchETag reports whether an If-Match header value matches this catalog: "*", or a
// comma-separated list of entity tags one of which equals ETag (strong comparison, so a weak
// W/"…" tag never matches).
func (c *Catalog) MatchETag(ifMatch string) bool {
	ifMatch = strings.TrimSpace(ifMatch)
	if ifMatch == "*" {
		return true
	}
	for _, tag := range strings.Split(ifMatch, ",") {
		if strings.TrimSpace(tag) == c.ETag() {
			return true
		}
	}
	return false
}

// For is the list of tools a tab with role sees on route: the enabled tools that exist on the
// route (see CheckRoute for what a route is; an empty or invalid route matches only the tools
// without routes), all of them for RoleOwner and only those whose effective readOnlyHint is true
// for anyone else (an unknown role is treated as a viewer). Sorted by name; at most one profile per
// name. The result is a deep copy and never nil.
func (c *Catalog) For(role owner.Role, route string) []Tool {
	segs, routed := routeSegments(route)
	type hit struct {
		t    Tool
		spec pattern // the matching pattern, for ordering
		any  bool    // the tool has no routes
	}
	var hits []hit
	for _, t := range c.Tools {
		if t.Disabled || (role != owner.RoleOwner && !t.Annotations.ReadOnly()) {
			continue
		}
		pats := t.patterns
		if pats == nil && len(t.Routes) > 0 { // a Catalog built by hand
			for _, r := range t.Routes {
				if p, err := parsePattern(r); err == nil {
					pats = append(pats, p)
				}
			}
			if pats == nil {
				continue
			}
		}
		if len(pats) == 0 {
			hits = append(hits, hit{t: t, any: true})
			continue
		}
		if !routed {
			continue
		}
		var best *pattern
		for i := range pats {
			if pats[i].match(segs) && (best == nil || compareSpecificity(pats[i], *best) < 0) {
				best = &pats[i]
			}
		}
		if best != nil {
			hits = append(hits, hit{t: t, spec: *best})
		}
	}
	slices.SortStableFunc(hits, func(a, b hit) int {
		if c := strings.Compare(a.t.Name, b.t.Name); c != 0 {
			return c
		}
		switch {
		case a.any && b.any:
			return 0
		case a.any:
			return 1
		case b.any:
			return -1
		}
		return compareSpecificity(a.spec, b.spec)
	})
	out := make([]Tool, 0, len(hits))
	for _, h := range hits {
		out = append(out, h.t.clone())
	}
	return out
}

// clone copies t deeply, so that callers cannot change the catalog through it.
func (t Tool) clone() Tool {
	t.InputSchema = slices.Clone(t.InputSchema)
	t.OutputSchema = slices.Clone(t.OutputSchema)
	t.Routes = slices.Clone(t.Routes)
	if t.TimeoutMs != nil {
		ms := *t.TimeoutMs
		t.TimeoutMs = &ms
	}
	a := &t.Annotations
	for _, p := range []**bool{&a.ReadOnlyHint, &a.DestructiveHint, &a.IdempotentHint, &a.OpenWorldHint, &a.UntrustedContentHint} {
		if *p != nil {
			*p = ptr(**p)
		}
	}
	t.patterns = nil
	return t
}
