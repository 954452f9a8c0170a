package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/lease/leasemem"
	"github.com/tablease/tablease/owner/catalog"
)

// eventsCatalog has read-only tools, route profiles of one name, mutation tools with and without
// annotations, and a disabled tool.
const eventsCatalog = `{"tools": [
  {"name": "search_events", "description": "Search public events.",
   "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}}},
   "annotations": {"readOnlyHint": true}, "routes": ["/events"]},
  {"name": "get_event_details", "description": "Details of an event by id.",
   "inputSchema": {"type": "object", "properties": {"event_id": {"type": "string"}}, "required": ["event_id"]},
   "annotations": {"readOnlyHint": true}, "routes": ["/events"]},
  {"name": "get_event_details", "description": "Details of the event on this page.",
   "inputSchema": {"type": "object", "additionalProperties": false},
   "annotations": {"readOnlyHint": true}, "routes": ["/events/:id"]},
  {"name": "save_event", "description": "Save an event to the user's list.",
   "inputSchema": {"type": "object", "properties": {"event_id": {"type": "string"}}},
   "annotations": {"destructiveHint": false, "idempotentHint": true}},
  {"name": "rename_event", "description": "Rename the event on this page.", "routes": ["/events/:id"]},
  {"name": "delete_event", "description": "Delete the event on this page.",
   "annotations": {"readOnlyHint": false, "destructiveHint": true}, "routes": ["/events/:id"]},
  {"name": "help", "description": "What this page can do.", "annotations": {"readOnlyHint": true}},
  {"name": "export_all", "description": "Export everything.", "annotations": {"readOnlyHint": true}, "disabled": true}
]}`

func mustCatalog(t *testing.T, src string) *catalog.Catalog {
	t.Helper()
	c, err := catalog.Parse([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// catalogHarness is a server with eventsCatalog as its file's catalog, seeded into its store.
func catalogHarness(t *testing.T, mods ...func(*Options)) *harness {
	t.Helper()
	h := newHarness(t, append([]func(*Options){func(o *Options) { o.Catalog = mustCatalog(t, eventsCatalog) }}, mods...)...)
	if _, err := h.srv.SeedCatalog(t.Context()); err != nil {
		t.Fatal(err)
	}
	return h
}

// adminToken is an access token with the admin scope.
func (h *harness) adminToken(sub string) string {
	h.t.Helper()
	tok, err := IssueToken(h.auth, TokenSpec{Sub: sub, Scopes: []string{ScopeAdmin}, TTL: time.Hour})
	if err != nil {
		h.t.Fatal(err)
	}
	return tok
}

type catalogAnswer struct {
	Role    string `json:"role"`
	Epoch   *int64 `json:"epoch"`
	Version string `json:"version"`
	Tools   []tool `json:"tools"`
}

type tool struct {
	Name        string          `json:"name"`
	Title       string          `json:"title"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"inputSchema"`
	Annotations struct {
		Title           string `json:"title"`
		ReadOnlyHint    *bool  `json:"readOnlyHint"`
		DestructiveHint *bool  `json:"destructiveHint"`
		IdempotentHint  *bool  `json:"idempotentHint"`
		OpenWorldHint   *bool  `json:"openWorldHint"`
		Untrusted       *bool  `json:"untrustedContentHint"`
	} `json:"annotations"`
	Routes   []string `json:"routes"`
	Disabled bool     `json:"disabled"`
}

func names(tools []tool) []string {
	out := make([]string, 0, len(tools))
	for _, t := range tools {
		out = append(out, t.Name)
	}
	return out
}

func (h *harness) catalogFor(token, sid, query string) catalogAnswer {
	h.t.Helper()
	rec := h.get("/v1/sessions/"+sid+"/catalog"+query, token)
	if rec.Code != http.StatusOK {
		h.t.Fatalf("GET catalog%s: %d %s", query, rec.Code, rec.Body)
	}
	var a catalogAnswer
	decodeStrict(h.t, rec, &a)
	return a
}

func TestCatalogByRoleAndRoute(t *testing.T) {
	h := catalogHarness(t)
	alice := h.token("alice")
	owner := readLease(t, h.post(leasePath("doc-1"), alice, `{"tabId":"tab-a"}`))
	version := mustCatalog(t, eventsCatalog).Version

	cases := []struct {
		name      string
		query     string
		wantRole  string
		wantTools []string
	}{
		{"the owner on the list page gets the list's tools and every route-free mutation tool",
			"?tabId=tab-a&route=/events", "owner", []string{"get_event_details", "help", "save_event", "search_events"}},
		{"the owner on a detail page gets the page's mutation tools",
			"?tabId=tab-a&route=/events/evt-1", "owner", []string{"delete_event", "get_event_details", "help", "rename_event", "save_event"}},
		{"a viewer on a detail page gets only read-only tools",
			"?tabId=tab-b&route=/events/evt-1", "viewer", []string{"get_event_details", "help"}},
		{"a viewer on the list page gets only read-only tools",
			"?tabId=tab-b&route=/events", "viewer", []string{"get_event_details", "help", "search_events"}},
		{"a request without a tab is a viewer", "?route=/events", "viewer", []string{"get_event_details", "help", "search_events"}},
		{"without a route only the tools without routes exist", "?tabId=tab-a", "owner", []string{"help", "save_event"}},
		{"a query and a trailing slash of the route are ignored", "?tabId=tab-b&route=/events/?q=go", "viewer", []string{"get_event_details", "help", "search_events"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := h.catalogFor(alice, "doc-1", tc.query)
			if a.Role != tc.wantRole || a.Version != version {
				t.Fatalf("role %q version %q, want %q %q", a.Role, a.Version, tc.wantRole, version)
			}
			if got := names(a.Tools); !slices.Equal(got, tc.wantTools) {
				t.Fatalf("tools %v, want %v (sorted by name)", got, tc.wantTools)
			}
			switch {
			case a.Role == "owner" && (a.Epoch == nil || *a.Epoch != owner.Epoch):
				t.Fatalf("the owner's answer has epoch %v, want %d", a.Epoch, owner.Epoch)
			case a.Role == "viewer" && a.Epoch != nil:
				t.Fatalf("a viewer's answer has an epoch %d", *a.Epoch)
			}
			for _, tl := range a.Tools {
				if tl.Disabled || tl.Name == "export_all" {
					t.Fatalf("a disabled tool was given out: %+v", tl)
				}
				if tl.Annotations.ReadOnlyHint == nil || tl.Annotations.DestructiveHint == nil ||
					tl.Annotations.IdempotentHint == nil || tl.Annotations.OpenWorldHint == nil {
					t.Fatalf("tool %s has hints left implicit: %+v", tl.Name, tl.Annotations)
				}
			}
		})
	}
}

func TestAViewerNeverSeesAMutationTool(t *testing.T) {
	h := catalogHarness(t)
	alice := h.token("alice")
	readLease(t, h.post(leasePath("doc-1"), alice, `{"tabId":"tab-a"}`))
	routes := []string{"", "/", "/events", "/events/", "/events/evt-1", "/events/evt-1/edit", "/events/evt-1?x=1#y", "/users/u1", "/nowhere"}
	query := func(tabID, route string) string {
		q := url.Values{}
		if tabID != "" {
			q.Set("tabId", tabID)
		}
		if route != "" {
			q.Set("route", route)
		}
		if len(q) == 0 {
			return ""
		}
		return "?" + q.Encode()
	}
	sawMutation := false
	for _, route := range routes {
		// tab-b is a viewer, tab-z has never been seen, and a request without a tab is a viewer.
		for _, tab := range []string{"tab-b", "tab-z", ""} {
			a := h.catalogFor(alice, "doc-1", query(tab, route))
			if a.Role != "viewer" {
				t.Fatalf("tab %q on %q: role %q", tab, route, a.Role)
			}
			for _, tl := range a.Tools {
				if tl.Annotations.ReadOnlyHint == nil || !*tl.Annotations.ReadOnlyHint {
					t.Fatalf("tab %q on %q: a viewer got the mutation tool %s", tab, route, tl.Name)
				}
			}
		}
		for _, tl := range h.catalogFor(alice, "doc-1", query("tab-a", route)).Tools {
			sawMutation = sawMutation || !*tl.Annotations.ReadOnlyHint
		}
	}
	if !sawMutation {
		t.Fatal("the owner never got a mutation tool: the test proves nothing")
	}

	// After a takeover the old owner is a viewer and loses the mutation tools at once.
	readLease(t, h.post(leasePath("doc-1"), alice, `{"tabId":"tab-b","mode":"takeover"}`))
	for _, tl := range h.catalogFor(alice, "doc-1", "?tabId=tab-a&route=/events/evt-1").Tools {
		if !*tl.Annotations.ReadOnlyHint {
			t.Fatalf("the tab that was taken over still gets the mutation tool %s", tl.Name)
		}
	}
	// And after the lease expires, nobody is the owner.
	h.clock.Advance(time.Minute)
	if a := h.catalogFor(alice, "doc-1", "?tabId=tab-b&route=/events/evt-1"); a.Role != "viewer" || slices.Contains(names(a.Tools), "rename_event") {
		t.Fatalf("after expiry tab-b got %s %v", a.Role, names(a.Tools))
	}
}

func TestRouteProfilesPickTheSchemaOfTheRoute(t *testing.T) {
	h := catalogHarness(t)
	alice := h.token("alice")
	find := func(a catalogAnswer, name string) tool {
		t.Helper()
		for _, tl := range a.Tools {
			if tl.Name == name {
				return tl
			}
		}
		t.Fatalf("no tool %s in %v", name, names(a.Tools))
		return tool{}
	}
	list := find(h.catalogFor(alice, "doc-1", "?route=/events"), "get_event_details")
	detail := find(h.catalogFor(alice, "doc-1", "?route=/events/evt-1"), "get_event_details")
	if string(list.InputSchema) != `{"type":"object","properties":{"event_id":{"type":"string"}},"required":["event_id"]}` ||
		list.Description != "Details of an event by id." || !slices.Equal(list.Routes, []string{"/events"}) {
		t.Fatalf("the list page got the profile %s %q %v", list.InputSchema, list.Description, list.Routes)
	}
	if string(detail.InputSchema) != `{"type":"object","additionalProperties":false}` || detail.Description != "Details of the event on this page." {
		t.Fatalf("the detail page got the profile %s %q", detail.InputSchema, detail.Description)
	}
	// A tool without inputSchema gets the default.
	readLease(t, h.post(leasePath("doc-1"), alice, `{"tabId":"tab-a"}`))
	if rn := find(h.catalogFor(alice, "doc-1", "?tabId=tab-a&route=/events/evt-1"), "rename_event"); string(rn.InputSchema) != `{"type":"object"}` ||
		*rn.Annotations.ReadOnlyHint || !*rn.Annotations.DestructiveHint {
		t.Fatalf("a tool without annotations is not a destructive mutation tool: %+v", rn)
	}
}

func TestCatalogAnswersAreDeterministicAndRevalidatedWithETags(t *testing.T) {
	h := catalogHarness(t)
	alice := h.token("alice")
	readLease(t, h.post(leasePath("doc-1"), alice, `{"tabId":"tab-a"}`))
	path := "/v1/sessions/doc-1/catalog?tabId=tab-a&route=/events/evt-1"

	first := h.get(path, alice)
	second := h.get(path, alice)
	etag := first.Header().Get("ETag")
	if first.Code != 200 || first.Body.String() != second.Body.String() || etag == "" || etag != second.Header().Get("ETag") {
		t.Fatalf("two reads differ: %d %q %q / %q", first.Code, etag, first.Body, second.Body)
	}
	if cc := first.Header().Get("Cache-Control"); cc != "private, no-cache" {
		t.Fatalf("Cache-Control %q", cc)
	}

	for _, inm := range []string{etag, "W/" + etag, `"other", ` + etag, "*"} {
		rec := h.do(request{method: http.MethodGet, path: path, token: alice, headers: map[string]string{"If-None-Match": inm}})
		if rec.Code != http.StatusNotModified || rec.Body.Len() != 0 || rec.Header().Get("ETag") != etag {
			t.Fatalf("If-None-Match %s: %d %q ETag %q, want 304 without a body", inm, rec.Code, rec.Body, rec.Header().Get("ETag"))
		}
	}
	if rec := h.do(request{method: http.MethodGet, path: path, token: alice, headers: map[string]string{"If-None-Match": `"other"`}}); rec.Code != 200 {
		t.Fatalf("a stale If-None-Match answered %d", rec.Code)
	}

	// The answer of another role, another route or another epoch has another tag.
	viewer := h.get("/v1/sessions/doc-1/catalog?tabId=tab-b&route=/events/evt-1", alice)
	otherRoute := h.get("/v1/sessions/doc-1/catalog?tabId=tab-a&route=/events", alice)
	readLease(t, h.post(leasePath("doc-1"), alice, `{"tabId":"tab-c","mode":"takeover"}`))
	newOwner := h.get("/v1/sessions/doc-1/catalog?tabId=tab-c&route=/events/evt-1", alice)
	tags := map[string]bool{etag: true}
	for _, rec := range []*httptest.ResponseRecorder{viewer, otherRoute, newOwner} {
		tag := rec.Header().Get("ETag")
		if tags[tag] {
			t.Fatalf("two different answers share the tag %s", tag)
		}
		tags[tag] = true
	}
	rec := h.do(request{method: http.MethodGet, path: path, token: alice, headers: map[string]string{"If-None-Match": etag}})
	if rec.Code != 200 {
		t.Fatalf("after a takeover the old owner's tag still answered %d", rec.Code)
	}
}

func TestCatalogRefusesBadArguments(t *testing.T) {
	h := catalogHarness(t)
	alice := h.token("alice")
	for _, q := range []string{"?route=events", "?route=/a%20b", "?tabId=bad%20tab", "?route=" + "/" + strings.Repeat("a", 2048)} {
		wantError(t, h.get("/v1/sessions/doc-1/catalog"+q, alice), http.StatusBadRequest, CodeInvalidArgument)
	}
	wantError(t, h.get("/v1/sessions/doc-1/catalog", ""), http.StatusUnauthorized, CodeUnauthenticated)
	wantError(t, h.get("/v1/sessions/doc-1/catalog", h.token("alice", "doc-2")), http.StatusForbidden, CodeForbidden)
}

func TestAdminCatalogNeedsTheAdminScope(t *testing.T) {
	h := catalogHarness(t)
	alice := h.token("alice")
	wantError(t, h.get("/v1/admin/catalog", alice), http.StatusForbidden, CodeForbidden)
	rec := h.do(request{method: http.MethodPut, path: "/v1/admin/catalog", token: alice, body: eventsCatalog, headers: map[string]string{"If-Match": "*"}})
	wantError(t, rec, http.StatusForbidden, CodeForbidden)
	wantError(t, h.get("/v1/admin/catalog", ""), http.StatusUnauthorized, CodeUnauthenticated)
}

func (h *harness) putCatalog(token, ifMatch, body string) *httptest.ResponseRecorder {
	h.t.Helper()
	headers := map[string]string{}
	if ifMatch != "" {
		headers["If-Match"] = ifMatch
	}
	return h.do(request{method: http.MethodPut, path: "/v1/admin/catalog", token: token, body: body, headers: headers})
}

type adminCatalogAnswer struct {
	Version string `json:"version"`
	Tools   []tool `json:"tools"`
}

func TestAdminReplacesTheCatalogWithIfMatch(t *testing.T) {
	h := catalogHarness(t)
	admin := h.adminToken("root")
	alice := h.token("alice")
	readLease(t, h.post(leasePath("doc-1"), alice, `{"tabId":"tab-a"}`))
	v1 := mustCatalog(t, eventsCatalog)

	rec := h.get("/v1/admin/catalog", admin)
	var got adminCatalogAnswer
	decodeStrict(t, rec, &got)
	if got.Version != v1.Version || rec.Header().Get("ETag") != v1.ETag() || len(got.Tools) != 8 || rec.Header().Get("Last-Modified") == "" {
		t.Fatalf("GET answered %q (ETag %q, Last-Modified %q) with %d tools", got.Version, rec.Header().Get("ETag"), rec.Header().Get("Last-Modified"), len(got.Tools))
	}
	if rec := h.do(request{method: http.MethodGet, path: "/v1/admin/catalog", token: admin, headers: map[string]string{"If-None-Match": v1.ETag()}}); rec.Code != http.StatusNotModified {
		t.Fatalf("GET with If-None-Match answered %d", rec.Code)
	}

	// The kill switch: rename_event is disabled without touching the front end.
	killed := strings.Replace(rec.Body.String(), `"name":"rename_event","description":"Rename the event on this page.",`, `"name":"rename_event","description":"Rename the event on this page.","disabled":true,`, 1)
	if killed == rec.Body.String() {
		t.Fatalf("the test could not find rename_event in %s", rec.Body)
	}

	wantError(t, h.putCatalog(admin, "", killed), http.StatusPreconditionRequired, CodePreconditionRequired)
	e := wantError(t, h.putCatalog(admin, `"sha256:0000000000000000"`, killed), http.StatusPreconditionFailed, CodePreconditionFailed)
	if e.Error.Details["version"] != v1.Version {
		t.Fatalf("412 details %v, want the current version %s", e.Error.Details, v1.Version)
	}
	wantError(t, h.putCatalog(admin, "W/"+v1.ETag(), killed), http.StatusPreconditionFailed, CodePreconditionFailed)
	// The body's version without its quotes is no ETag: 400, not a 412 that blames another admin.
	if e := wantError(t, h.putCatalog(admin, v1.Version, killed), http.StatusBadRequest, CodeInvalidArgument); !strings.Contains(e.Error.Message, "in quotes") {
		t.Fatalf("an unquoted If-Match answered %q, want it to ask for the quoted ETag", e.Error.Message)
	}

	rec = h.putCatalog(admin, v1.ETag(), killed)
	var put adminCatalogAnswer
	decodeStrict(t, rec, &put)
	v2 := mustCatalog(t, killed)
	if rec.Code != 200 || put.Version != v2.Version || put.Version == v1.Version || rec.Header().Get("ETag") != v2.ETag() {
		t.Fatalf("PUT answered %d %q ETag %q, want %s", rec.Code, put.Version, rec.Header().Get("ETag"), v2.Version)
	}
	a := h.catalogFor(alice, "doc-1", "?tabId=tab-a&route=/events/evt-1")
	if a.Version != v2.Version || slices.Contains(names(a.Tools), "rename_event") {
		t.Fatalf("after the kill switch the owner got %s %v", a.Version, names(a.Tools))
	}

	// The same If-Match again is stale now: the first of two admins wins.
	e = wantError(t, h.putCatalog(admin, v1.ETag(), eventsCatalog), http.StatusPreconditionFailed, CodePreconditionFailed)
	if e.Error.Details["version"] != v2.Version {
		t.Fatalf("412 details %v, want %s", e.Error.Details, v2.Version)
	}
	// "*" replaces whatever is there; putting back what GET answered round-trips.
	rec = h.putCatalog(admin, "*", eventsCatalog)
	if rec.Code != 200 || rec.Header().Get("ETag") != v1.ETag() {
		t.Fatalf(`PUT with If-Match "*" answered %d %s`, rec.Code, rec.Body)
	}
	if a := h.catalogFor(alice, "doc-1", "?tabId=tab-a&route=/events/evt-1"); !slices.Contains(names(a.Tools), "rename_event") {
		t.Fatalf("re-enabling did not bring rename_event back: %v", names(a.Tools))
	}
	if !strings.Contains(h.logs.String(), `"msg":"catalog replaced"`) {
		t.Fatalf("no log line for the replacement:\n%s", h.logs)
	}
}

// racingDocuments, once armed, lets another write of the catalog in just before the next PUT's own.
type racingDocuments struct {
	catalog.Documents
	other lease.Document
	armed bool
}

func (r *racingDocuments) PutDocument(ctx context.Context, name string, doc lease.Document, ifVersion string) (lease.Document, error) {
	if r.armed {
		r.armed = false
		if _, err := r.Documents.PutDocument(ctx, name, r.other, lease.AnyVersion); err != nil {
			return lease.Document{}, err
		}
	}
	return r.Documents.PutDocument(ctx, name, doc, ifVersion)
}

// TestAdminPutThatLosesARaceAnswers412WithTheWinnersETag: a PUT whose If-Match matched when it was
// read, but which another PUT beat to the write, answers 412 with the winner's version in details
// and as its ETag, as a stale If-Match does.
func TestAdminPutThatLosesARaceAnswers412WithTheWinnersETag(t *testing.T) {
	winner := mustCatalog(t, `{"tools": [{"name": "search_events", "description": "Search.", "annotations": {"readOnlyHint": true}}]}`)
	data, err := json.Marshal(winner)
	if err != nil {
		t.Fatal(err)
	}
	doc := lease.Document{Version: winner.Version, Data: data}
	docs := &racingDocuments{other: doc}
	h := catalogHarness(t, func(o *Options) { docs.Documents = o.Documents; o.Documents = docs })
	docs.armed = true // the catalog was seeded: the next PUT is raced
	v1 := mustCatalog(t, eventsCatalog)
	rec := h.putCatalog(h.adminToken("root"), v1.ETag(), strings.Replace(eventsCatalog, `"rename_event"`, `"rename_it"`, 1))
	e := wantError(t, rec, http.StatusPreconditionFailed, CodePreconditionFailed)
	got := e.Error.Details["version"]
	if got != winner.Version || rec.Header().Get("ETag") != winner.ETag() {
		t.Fatalf("412 with details.version %v and ETag %q, want the winner's version in both", got, rec.Header().Get("ETag"))
	}
}

func TestAdminPutRefusesAnInvalidCatalog(t *testing.T) {
	h := catalogHarness(t)
	admin := h.adminToken("root")
	e := wantError(t, h.putCatalog(admin, "*", `{"tools":[{"name":"x","description":"d","routes":["events"]}]}`), http.StatusBadRequest, CodeInvalidArgument)
	if e.Error.Details["index"] != float64(0) || e.Error.Details["tool"] != "x" || !strings.Contains(fmt.Sprint(e.Error.Details["field"]), "routes[0]") {
		t.Fatalf("details %v of %q", e.Error.Details, e.Error.Message)
	}
	wantError(t, h.putCatalog(admin, "*", `{"tools":[{"name":"x","description":"d","annotations":{"readOnlyHint":true,"destructiveHint":true}}]}`), http.StatusBadRequest, CodeInvalidArgument)
	for body, field := range map[string]string{
		`{"tools":[], "extra": 1}`:                                                    "extra",
		`{"tools":[{"name":"ok","description":"d","foo":1}]}`:                         "foo",
		`{"tools":[{"name":"ok","description":"d","annotations":{"readonly":true}}]}`: "annotations.readonly",
	} {
		e := wantError(t, h.putCatalog(admin, "*", body), http.StatusBadRequest, CodeInvalidArgument)
		if e.Error.Details["field"] != field {
			t.Errorf("an unknown field: details %v of %q, want field %s", e.Error.Details, e.Error.Message, field)
		}
	}
	wantError(t, h.putCatalog(admin, "*", `not json`), http.StatusBadRequest, CodeInvalidArgument)
	// The type, charset and encoding rules of every body (decode.go), here too.
	for _, r := range []request{
		{headers: map[string]string{"Content-Type": "text/plain"}},
		{headers: map[string]string{"Content-Type": "application/json; charset=latin1"}},
		{headers: map[string]string{"Content-Encoding": "gzip"}},
		{also: http.Header{"Content-Type": {"text/plain"}}},
	} {
		r.method, r.path, r.token, r.body = http.MethodPut, "/v1/admin/catalog", admin, `{"tools":[]}`
		if r.headers == nil {
			r.headers = map[string]string{}
		}
		r.headers["If-Match"] = "*"
		wantError(t, h.do(r), http.StatusBadRequest, CodeInvalidArgument)
	}
	big := `{"tools":[{"name":"x","description":"` + strings.Repeat("d", MaxCatalogBytes) + `"}]}`
	wantError(t, h.putCatalog(admin, "*", big), http.StatusRequestEntityTooLarge, CodePayloadTooLarge)
	// Bodies larger than 16 KiB but within 1 MiB are fine for a catalog.
	mid := `{"tools":[{"name":"x","description":"` + strings.Repeat("d", 64<<10) + `"}]}`
	if rec := h.putCatalog(admin, "*", mid); rec.Code != 200 {
		t.Fatalf("a 64 KiB catalog answered %d %.200s", rec.Code, rec.Body)
	}
}

// twoInstances are two servers on one engine and one document store, as two tablease instances
// on one Redis.
func twoInstances(t *testing.T, maxAge time.Duration) (a, b *harness) {
	t.Helper()
	docs := leasemem.NewDocumentStore(nil)
	a = newHarness(t, func(o *Options) {
		o.Documents, o.Catalog, o.CatalogMaxAge = docs, mustCatalog(t, eventsCatalog), maxAge
	})
	b = newHarness(t, func(o *Options) {
		o.Engine, o.Documents, o.Catalog, o.CatalogMaxAge = a.engine, docs, mustCatalog(t, `{"tools":[]}`), maxAge
		o.Now = a.clock.Now
	})
	b.engine, b.clock = a.engine, a.clock
	return a, b
}

func TestTheStoredCatalogWinsOverTheFile(t *testing.T) {
	a, b := twoInstances(t, time.Second)
	fileA, fileB := mustCatalog(t, eventsCatalog), mustCatalog(t, `{"tools":[]}`)

	st, err := a.srv.SeedCatalog(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !st.Seeded || st.Source != catalog.FromStore || st.Version != fileA.Version || st.FileVersion != fileA.Version || st.UpdatedAt.IsZero() {
		t.Fatalf("the first instance reported %+v, want its file seeded", st)
	}
	st, err = b.srv.SeedCatalog(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.Seeded || st.Source != catalog.FromStore || st.Version != fileA.Version || st.FileVersion != fileB.Version {
		t.Fatalf("the second instance reported %+v, want the stored catalog served over its file", st)
	}
	alice := a.token("alice")
	if v := b.catalogFor(alice, "doc-1", "").Version; v != fileA.Version {
		t.Fatalf("the second instance serves %s, want the stored %s", v, fileA.Version)
	}

	// Without a stored catalog (and without a seed), an instance serves its file; without a file,
	// an empty catalog.
	solo := newHarness(t, func(o *Options) { o.Catalog = fileB })
	if v := solo.catalogFor(alice, "doc-1", "").Version; v != fileB.Version {
		t.Fatalf("an unseeded instance serves %s, want its file's %s", v, fileB.Version)
	}
	none := newHarness(t)
	st, err = none.srv.SeedCatalog(t.Context())
	if err != nil || st.Source != catalog.FromNone || st.Seeded || st.FileVersion != "" {
		t.Fatalf("an instance without a file reported %+v, %v", st, err)
	}
	if a := none.catalogFor(alice, "doc-1", "?tabId=t"); a.Version != fileB.Version || len(a.Tools) != 0 {
		t.Fatalf("an instance without a catalog answered %+v, want the empty catalog", a)
	}
}

func TestEveryInstanceServesTheNewVersionWithinTheMaxAge(t *testing.T) {
	const maxAge = time.Second
	a, b := twoInstances(t, maxAge)
	if _, err := a.srv.SeedCatalog(t.Context()); err != nil {
		t.Fatal(err)
	}
	alice := a.token("alice")
	v1 := b.catalogFor(alice, "doc-1", "").Version

	var mu sync.Mutex
	var seenA []string
	stop := a.srv.catalogs.Watch(func(v string) { mu.Lock(); seenA = append(seenA, v); mu.Unlock() })
	defer stop()

	killed := strings.Replace(eventsCatalog, `"name": "save_event",`, `"name": "save_event", "disabled": true,`, 1)
	if rec := a.putCatalog(a.adminToken("root"), `"`+v1+`"`, killed); rec.Code != 200 {
		t.Fatalf("PUT: %d %s", rec.Code, rec.Body)
	}
	v2 := mustCatalog(t, killed).Version
	mu.Lock()
	if !slices.Equal(seenA, []string{v2}) {
		t.Fatalf("the instance that took the PUT told its watchers %v, want [%s] at once", seenA, v2)
	}
	mu.Unlock()
	if v := a.catalogFor(alice, "doc-1", "").Version; v != v2 {
		t.Fatalf("the instance that took the PUT serves %s", v)
	}
	// The other instance serves what it read until its copy is maxAge old, then the new version.
	if v := b.catalogFor(alice, "doc-1", "").Version; v != v1 {
		t.Fatalf("the other instance re-read the store before maxAge: %s", v)
	}
	a.clock.Advance(maxAge)
	if v := b.catalogFor(alice, "doc-1", "").Version; v != v2 {
		t.Fatalf("after maxAge the other instance serves %s, want %s", v, v2)
	}
}

// A stream's snapshot names the version GET …/catalog would answer: an instance whose copy is
// older than the max age reads the store again before it, rather than naming the copy.
func TestASnapshotOnAnotherInstanceNamesTheVersionAPutStored(t *testing.T) {
	const maxAge = time.Second
	a, b := twoInstances(t, maxAge)
	if _, err := a.srv.SeedCatalog(t.Context()); err != nil {
		t.Fatal(err)
	}
	alice := a.token("alice")
	b.catalogFor(alice, "doc-1", "") // b's copy, read now
	if rec := a.putCatalog(a.adminToken("root"), "*", `{"tools":[]}`); rec.Code != 200 {
		t.Fatalf("PUT: %d %s", rec.Code, rec.Body)
	}
	want := mustCatalog(t, `{"tools":[]}`).Version
	a.clock.Advance(maxAge)
	var snap snapshotAnswer
	c := mustStream(t, b.serve(), eventsPath("doc-1", "tabId=t1"), alice, nil)
	c.expect("snapshot", &snap)
	if got := snap.CatalogVersion; got == nil || *got != want {
		t.Fatalf("the snapshot names the catalog version %q, want %s, which GET answers: %s", deref(got), want, b.catalogFor(alice, "doc-1", "").Version)
	}
}

func TestWatchersOfAnotherInstanceLearnOfAChangeWithoutRequests(t *testing.T) {
	a, b := twoInstances(t, 20*time.Millisecond) // the poller runs on the real clock
	if _, err := a.srv.SeedCatalog(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := b.srv.SeedCatalog(t.Context()); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 4)
	stop := b.srv.catalogs.Watch(func(v string) { got <- v })
	defer stop()
	if rec := a.putCatalog(a.adminToken("root"), "*", `{"tools":[]}`); rec.Code != 200 {
		t.Fatalf("PUT: %d %s", rec.Code, rec.Body)
	}
	want := mustCatalog(t, `{"tools":[]}`).Version
	select {
	case v := <-got:
		if v != want {
			t.Fatalf("watcher told %s, want %s", v, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the other instance's watcher was not told within 10s")
	}
}

// failingDocs is a document store that cannot be reached.
type failingDocs struct{}

func (failingDocs) GetDocument(context.Context, string) (lease.Document, error) {
	return lease.Document{}, &lease.UnavailableError{Op: "get document", Err: errors.New("connection refused")}
}

func (failingDocs) StatDocument(context.Context, string) (lease.Document, error) {
	return lease.Document{}, &lease.UnavailableError{Op: "stat document", Err: errors.New("connection refused")}
}

func (failingDocs) PutDocument(context.Context, string, lease.Document, string) (lease.Document, error) {
	return lease.Document{}, &lease.UnavailableError{Op: "put document", Err: errors.New("connection refused")}
}

func TestCatalogStoreTroubleIsUnavailable(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.Documents = failingDocs{}; o.Catalog = mustCatalog(t, eventsCatalog) })
	if _, err := h.srv.SeedCatalog(t.Context()); !errors.Is(err, lease.ErrUnavailable) {
		t.Fatalf("SeedCatalog: %v", err)
	}
	e := wantError(t, h.get("/v1/sessions/doc-1/catalog", h.token("alice")), http.StatusServiceUnavailable, CodeStoreUnavailable)
	if !*e.Error.Retryable {
		t.Fatal("STORE_UNAVAILABLE is not retryable")
	}
	wantError(t, h.putCatalog(h.adminToken("root"), "*", eventsCatalog), http.StatusServiceUnavailable, CodeStoreUnavailable)
}

func TestAStoredCatalogThatIsNotValidIsNeverServed(t *testing.T) {
	docs := leasemem.NewDocumentStore(nil)
	if _, err := docs.PutDocument(t.Context(), catalog.DocumentName, lease.Document{Version: "v-bad", Data: []byte(`{"tools":[{"name":"x"}]}`)}, lease.IfAbsent); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(o *Options) { o.Documents = docs; o.Catalog = mustCatalog(t, eventsCatalog) })
	wantError(t, h.get("/v1/sessions/doc-1/catalog", h.token("alice")), http.StatusInternalServerError, CodeInternal)
	if !strings.Contains(h.logs.String(), "the stored catalog") {
		t.Fatalf("the cause was not logged:\n%s", h.logs)
	}
}

func deref(s *string) string {
	if s == nil {
		return "<none>"
	}
	return *s
}
