package api

import (
	"bytes"
	"context"
	"encoding/json"
	"mime"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.yaml.in/yaml/v3"
)

// The OpenAPI document is what clients generate code from and validate against: these tests
// parse it as YAML (as every tool does) and validate real answers of the server, and the data of
// real events, against the schemas it gives them.

// specURL names the document, as JSON, for the schema compiler.
const specURL = "https://tablease.invalid/openapi.json"

// apiSpec is the embedded document, parsed, with a compiler of its schemas.
type apiSpec struct {
	doc      map[string]any
	compiler *jsonschema.Compiler
}

func loadSpec(t *testing.T) *apiSpec {
	t.Helper()
	var doc map[string]any
	if err := yaml.Unmarshal(openapiYAML, &doc); err != nil {
		t.Fatalf("openapi.yaml is not valid YAML: %v", err)
	}
	raw, err := json.Marshal(doc)
	if err != nil {
		t.Fatalf("openapi.yaml does not convert to JSON: %v", err)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020) // OpenAPI 3.1's dialect
	c.AssertFormat()
	if err := c.AddResource(specURL, inst); err != nil {
		t.Fatal(err)
	}
	return &apiSpec{doc: doc, compiler: c}
}

// pointerToken escapes one JSON Pointer token, then for a URL fragment.
func pointerToken(s string) string {
	s = strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
	return url.PathEscape(s)
}

// schema compiles the schema at the JSON Pointer ptr of the document ("/components/schemas/X").
func (s *apiSpec) schema(t *testing.T, ptr string) *jsonschema.Schema {
	t.Helper()
	sch, err := s.compiler.Compile(specURL + "#" + ptr)
	if err != nil {
		t.Fatalf("compiling %s: %v", ptr, err)
	}
	return sch
}

// lookup walks the document along keys.
func (s *apiSpec) lookup(keys ...string) (any, bool) {
	var v any = s.doc
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = m[k]; !ok {
			return nil, false
		}
	}
	return v, true
}

// responsePointer is the pointer of the schema that the document gives the answer status of the
// operation method path (a path as the document spells it, with {parameters}) in the media type
// mediaType, following a $ref to a shared response. It fails the test when the document does not
// list the status.
func (s *apiSpec) responsePointer(t *testing.T, method, path string, status int, mediaType string) string {
	t.Helper()
	code := strconv.Itoa(status)
	resp, ok := s.lookup("paths", path, strings.ToLower(method), "responses", code)
	if !ok {
		t.Fatalf("%s %s answered %d, which openapi.yaml does not list", method, path, status)
	}
	ptr := "/paths/" + pointerToken(path) + "/" + strings.ToLower(method) + "/responses/" + code
	if m, ok := resp.(map[string]any); ok {
		if ref, ok := m["$ref"].(string); ok {
			ptr = strings.TrimPrefix(ref, "#")
		}
	}
	return ptr + "/content/" + pointerToken(mediaType) + "/schema"
}

// check validates the answer rec of method path against the document: its status must be listed,
// and its body (JSON) valid against the schema listed for it and its Content-Type.
func (s *apiSpec) check(t *testing.T, method, path string, rec *httptest.ResponseRecorder) {
	t.Helper()
	mediaType, _, _ := mime.ParseMediaType(rec.Header().Get("Content-Type"))
	s.validate(t, method+" "+path, s.responsePointer(t, method, path, rec.Code, mediaType), rec.Body.Bytes())
}

// validate validates body against the schema at ptr; what names it in a failure.
func (s *apiSpec) validate(t *testing.T, what, ptr string, body []byte) {
	t.Helper()
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("%s: the body is not JSON: %v\n%s", what, err, body)
	}
	if err := s.schema(t, ptr).Validate(inst); err != nil {
		t.Errorf("%s: the body does not match its schema in openapi.yaml (%s): %v\n%s", what, ptr, err, body)
	}
}

func TestOpenAPIIsValidYAMLAndItsSchemasCompile(t *testing.T) {
	s := loadSpec(t)
	schemas, ok := s.lookup("components", "schemas")
	if !ok {
		t.Fatal("openapi.yaml has no components/schemas")
	}
	for name := range schemas.(map[string]any) {
		s.schema(t, "/components/schemas/"+pointerToken(name))
	}
}

// TestOpenAPIIsAValidOpenAPIDocument loads the document as code generators and validators do
// (kin-openapi), which also checks where each OpenAPI 3.1 field may appear.
func TestOpenAPIIsAValidOpenAPIDocument(t *testing.T) {
	doc, err := openapi3.NewLoader().LoadFromData(openapiYAML)
	if err != nil {
		t.Fatalf("openapi.yaml does not load as OpenAPI: %v", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("openapi.yaml is not a valid OpenAPI document: %v", err)
	}
}

func TestAnswersMatchTheirSchemasInOpenAPI(t *testing.T) {
	s := loadSpec(t)
	h := newHarness(t, func(o *Options) { o.Dev = true })
	alice, admin := h.token("alice"), h.adminToken("root")
	const lease = "/v1/sessions/{sid}/lease"
	type step struct {
		req  request
		path string // the operation's path in the document
	}
	steps := []step{
		{request{method: "POST", path: "/v1/sessions/doc-1/lease", token: alice, body: `{"tabId":"t1","label":"Tab 1"}`}, lease},
		{request{method: "POST", path: "/v1/sessions/doc-1/lease", token: alice, body: `{"tabId":"t2"}`}, lease},                  // 409 LEASE_HELD
		{request{method: "POST", path: "/v1/sessions/doc-1/lease", token: alice, body: `{"tabId":"t2","mode":"handoff"}`}, lease}, // 409 HANDOFF_PENDING
		{request{method: "GET", path: "/v1/sessions/doc-1/lease?tabId=t2", token: alice}, lease},
		{request{method: "GET", path: "/v1/sessions/doc-1/lease", token: alice}, lease},
		{request{method: "GET", path: "/v1/sessions/doc-1/lease"}, lease},                                                           // 401
		{request{method: "POST", path: "/v1/sessions/doc-1/lease", token: alice, body: `{"tabId":"t1","mode":"sometimes"}`}, lease}, // 400
		{request{method: "GET", path: "/v1/sessions/doc-1/catalog?tabId=t1&route=/events", token: alice}, "/v1/sessions/{sid}/catalog"},
		{request{method: "POST", path: "/v1/sessions/doc-1/events/ticket", token: alice, body: `{"tabId":"t1"}`}, "/v1/sessions/{sid}/events/ticket"},
		{request{method: "PUT", path: "/v1/sessions/doc-1/tabs/t3", token: alice, body: `{"label":"Tab 3","hidden":true}`}, "/v1/sessions/{sid}/tabs/{tabId}"},
		{request{method: "GET", path: "/v1/sessions/doc-1/tabs", token: alice}, "/v1/sessions/{sid}/tabs"},
		{request{method: "GET", path: "/v1/admin/leases", token: admin}, "/v1/admin/leases"},
		{request{method: "GET", path: "/v1/admin/leases", token: alice}, "/v1/admin/leases"}, // 403
		{request{method: "GET", path: "/v1/admin/users/alice/sessions/doc-1/lease", token: admin}, "/v1/admin/users/{sub}/sessions/{sid}/lease"},
		{request{method: "GET", path: "/v1/admin/catalog", token: admin}, "/v1/admin/catalog"},
		{request{method: "PUT", path: "/v1/admin/catalog", token: admin, body: `{"tools":[{"name":"save","description":"Save."}]}`,
			headers: map[string]string{"If-Match": "*"}}, "/v1/admin/catalog"},
		{request{method: "GET", path: "/.well-known/jwks.json"}, "/.well-known/jwks.json"},
		{request{method: "GET", path: "/healthz"}, "/healthz"},
		{request{method: "GET", path: "/readyz"}, "/readyz"},
		{request{method: "GET", path: "/dev/token?sub=bob", host: "127.0.0.1:8080", remote: "127.0.0.1:5000"}, "/dev/token"},
	}
	for _, st := range steps {
		rec := h.do(st.req)
		s.check(t, st.req.method, st.path, rec)
	}

	// The holder's renew (with its token), a guard's check, then a revoke and the audit log.
	var held struct {
		Epoch int64  `json:"epoch"`
		Token string `json:"token"`
	}
	rec := h.post("/v1/sessions/doc-1/lease/renew", alice, `{"tabId":"t1","epoch":`+epochOf(t, h, alice)+`}`)
	s.check(t, "POST", "/v1/sessions/{sid}/lease/renew", rec)
	if err := json.Unmarshal(rec.Body.Bytes(), &held); err != nil || held.Token == "" {
		t.Fatalf("renew: %v %s", err, rec.Body)
	}
	rec = h.post("/v1/sessions/doc-1/lease/check", alice, `{"token":"`+held.Token+`"}`)
	s.check(t, "POST", "/v1/sessions/{sid}/lease/check", rec)
	rec = h.post("/v1/sessions/doc-1/lease/check", alice, `{"tabId":"t2","epoch":`+strconv.FormatInt(held.Epoch, 10)+`}`)
	s.check(t, "POST", "/v1/sessions/{sid}/lease/check", rec) // 409 LEASE_LOST
	rec = h.post("/v1/sessions/doc-1/lease/release", alice, `{"tabId":"t1","epoch":`+strconv.FormatInt(held.Epoch, 10)+`}`)
	s.check(t, "POST", "/v1/sessions/{sid}/lease/release", rec)
	rec = h.post("/v1/admin/users/alice/sessions/doc-1/lease/revoke", admin, `{"reason":"audit","blockMs":1000}`)
	s.check(t, "POST", "/v1/admin/users/{sub}/sessions/{sid}/lease/revoke", rec)
	rec = h.post("/v1/sessions/doc-1/lease", alice, `{"tabId":"t1"}`)
	s.check(t, "POST", lease, rec) // 423 SESSION_BLOCKED
	rec = h.get("/v1/admin/audit?sub=alice", admin)
	s.check(t, "GET", "/v1/admin/audit", rec)
}

// epochOf is the epoch of the lease of doc-1 as alice's GET answers it.
func epochOf(t *testing.T, h *harness, token string) string {
	t.Helper()
	var l struct {
		Epoch int64 `json:"epoch"`
	}
	if err := json.Unmarshal(h.get("/v1/sessions/doc-1/lease", token).Body.Bytes(), &l); err != nil {
		t.Fatal(err)
	}
	return strconv.FormatInt(l.Epoch, 10)
}

func TestEventDataMatchesItsSchemasInOpenAPI(t *testing.T) {
	s := loadSpec(t)
	h := newHarness(t)
	ts := h.serve()
	alice := h.token("alice")
	h.acquire(alice, "doc-1", "t1", "try")
	c := mustStream(t, ts, eventsPath("doc-1", "tabId=t2"), alice, nil)
	snap := c.expect("snapshot", nil)
	s.validate(t, "the snapshot", "/components/schemas/Snapshot", []byte(snap.Data))
	h.do(request{method: "PUT", path: "/v1/sessions/doc-1/tabs/t3", token: alice})
	tabs := c.expect("tabs", nil) // t3 joins
	s.validate(t, "a tabs event", "/components/schemas/TabsEvent", []byte(tabs.Data))
	h.acquire(alice, "doc-1", "t2", "takeover")
	_, ev := c.expectLease("taken_over")
	s.validate(t, "a lease event", "/components/schemas/LeaseEvent", []byte(ev.Data))

	// A resume: the snapshot says resumed, and the replay follows.
	c.close()
	h.acquire(alice, "doc-1", "t1", "takeover")
	r := mustStream(t, ts, eventsPath("doc-1", "tabId=t2"), alice, map[string]string{"Last-Event-ID": ev.ID})
	snap = r.expect("snapshot", nil)
	s.validate(t, "a resumed snapshot", "/components/schemas/Snapshot", []byte(snap.Data))
	if !strings.Contains(snap.Data, `"resumed":true`) {
		t.Fatalf("the snapshot after Last-Event-ID %s is not a resume: %s", ev.ID, snap.Data)
	}
}

// TestRequestSchemasAgreeWithTheServer: a body the server refuses as INVALID_ARGUMENT is one its
// schema in openapi.yaml refuses, and the other way round, for the bodies whose rules combine
// fields (a client that validates against the document sends nothing the server refuses).
func TestRequestSchemasAgreeWithTheServer(t *testing.T) {
	s := loadSpec(t)
	h := newHarness(t)
	alice := h.token("alice")
	acquired := readLease(t, h.do(request{method: "POST", path: "/v1/sessions/doc-1/lease", token: alice, body: `{"tabId":"t1"}`}))
	token := strconv.Quote(*acquired.Token)
	for _, tt := range []struct{ schema, path, body string }{
		{"CheckRequest", "/v1/sessions/doc-1/lease/check", `{"tabId":"t1","epoch":1}`},
		{"CheckRequest", "/v1/sessions/doc-1/lease/check", `{"token":` + token + `}`},
		{"CheckRequest", "/v1/sessions/doc-1/lease/check", `{"tabId":"t1","token":` + token + `}`},
		{"CheckRequest", "/v1/sessions/doc-1/lease/check", `{"epoch":1,"token":` + token + `}`},
		{"CheckRequest", "/v1/sessions/doc-1/lease/check", `{"tabId":"t1","epoch":1,"token":` + token + `}`},
		{"CheckRequest", "/v1/sessions/doc-1/lease/check", `{"tabId":"t1"}`},
		{"CheckRequest", "/v1/sessions/doc-1/lease/check", `{}`},
		{"ReleaseRequest", "/v1/sessions/doc-2/lease/release", `{"tabId":"t1","epoch":1}`},
		{"ReleaseRequest", "/v1/sessions/doc-2/lease/release", `{"tabId":"t1","gone":true}`},
		{"ReleaseRequest", "/v1/sessions/doc-2/lease/release", `{"tabId":"t1","epoch":1,"gone":true}`},
		{"ReleaseRequest", "/v1/sessions/doc-2/lease/release", `{"tabId":"t1"}`},
	} {
		rec := h.do(request{method: "POST", path: tt.path, token: alice, body: tt.body})
		refused := rec.Code == 400
		inst, err := jsonschema.UnmarshalJSON(strings.NewReader(tt.body))
		if err != nil {
			t.Fatal(err)
		}
		invalid := s.schema(t, "/components/schemas/"+tt.schema).Validate(inst) != nil
		if refused != invalid {
			t.Errorf("%s %s: the server answers %d %s, the schema %s finds it valid: %v", tt.path, tt.body, rec.Code, rec.Body, tt.schema, !invalid)
		}
	}
}
