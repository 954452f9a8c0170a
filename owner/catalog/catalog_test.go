package catalog_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tablease/tablease/owner"
	"github.com/tablease/tablease/owner/catalog"
)

// eventsCatalog is the route-profile example of the seeds: get_event_details takes an id on the
// list page and only {} on the detail page.
const eventsCatalog = `{
  "tools": [
    {"name": "search_events", "description": "Search public events.",
     "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}}},
     "annotations": {"readOnlyHint": true}, "routes": ["/events"]},
    {"name": "get_event_details", "description": "Details of an event by id.",
     "inputSchema": {"type": "object", "properties": {"event_id": {"type": "string"}}, "required": ["event_id"]},
     "annotations": {"readOnlyHint": true}, "routes": ["/events"]},
    {"name": "get_event_details", "description": "Details of the event on this page.",
     "inputSchema": {"type": "object", "properties": {}, "additionalProperties": false},
     "annotations": {"readOnlyHint": true}, "routes": ["/events/:id"]},
    {"name": "save_event", "description": "Save the event to the user's list.",
     "inputSchema": {"type": "object", "properties": {"event_id": {"type": "string"}}},
     "routes": ["/events", "/events/:id"]},
    {"name": "delete_account", "description": "Delete the account.", "disabled": true},
    {"name": "help", "description": "Explain what this page does.", "annotations": {"readOnlyHint": true, "openWorldHint": false}}
  ]
}`

func mustParse(t *testing.T, s string) *catalog.Catalog {
	t.Helper()
	c, err := catalog.Parse([]byte(s))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return c
}

func names(tools []catalog.Tool) []string {
	var out []string
	for _, t := range tools {
		out = append(out, t.Name)
	}
	return out
}

func TestForGivesEachRoleAndRouteItsTools(t *testing.T) {
	c := mustParse(t, eventsCatalog)
	tests := []struct {
		name  string
		role  owner.Role
		route string
		want  []string
	}{
		{"an owner on the list page gets the list tools and save_event", owner.RoleOwner, "/events", []string{"get_event_details", "help", "save_event", "search_events"}},
		{"a viewer on the list page gets only read-only tools", owner.RoleViewer, "/events", []string{"get_event_details", "help", "search_events"}},
		{"an owner on a detail page gets the detail profile and save_event", owner.RoleOwner, "/events/evt-1", []string{"get_event_details", "help", "save_event"}},
		{"a viewer on a detail page gets no mutation tool", owner.RoleViewer, "/events/evt-1", []string{"get_event_details", "help"}},
		{"a trailing slash, a query and a fragment are ignored", owner.RoleOwner, "/events/?page=2#top", []string{"get_event_details", "help", "save_event", "search_events"}},
		{"a deeper route matches neither profile", owner.RoleOwner, "/events/evt-1/edit", []string{"help"}},
		{"an unknown route gets only the tools on every route", owner.RoleOwner, "/settings", []string{"help"}},
		{"an empty route gets only the tools on every route", owner.RoleOwner, "", []string{"help"}},
		{"an invalid route gets only the tools on every route", owner.RoleOwner, "events", []string{"help"}},
		{"an unknown role is a viewer", owner.Role("admin"), "/events/evt-1", []string{"get_event_details", "help"}},
		{"a disabled tool is given to nobody", owner.RoleOwner, "/", []string{"help"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := names(c.For(tt.role, tt.route))
			if !slices.Equal(got, tt.want) {
				t.Fatalf("For(%q, %q) = %v, want %v", tt.role, tt.route, got, tt.want)
			}
		})
	}
}

func TestRouteProfilesPickTheirSchema(t *testing.T) {
	c := mustParse(t, eventsCatalog)
	find := func(route string) catalog.Tool {
		for _, tool := range c.For(owner.RoleViewer, route) {
			if tool.Name == "get_event_details" {
				return tool
			}
		}
		t.Fatalf("no get_event_details on %s", route)
		return catalog.Tool{}
	}
	list, detail := find("/events"), find("/events/evt-webmcp-intro")
	if !strings.Contains(string(list.InputSchema), `"required":["event_id"]`) || list.Description != "Details of an event by id." {
		t.Errorf("the list page got %s %q", list.InputSchema, list.Description)
	}
	if string(detail.InputSchema) != `{"type":"object","properties":{},"additionalProperties":false}` {
		t.Errorf("the detail page got %s", detail.InputSchema)
	}
}

func TestAnnotationDefaultsAreExplicit(t *testing.T) {
	c := mustParse(t, `{"tools":[
		{"name":"mutate","description":"d"},
		{"name":"read","description":"d","annotations":{"readOnlyHint":true}},
		{"name":"gentle","description":"d","annotations":{"destructiveHint":false,"idempotentHint":true,"openWorldHint":false,"title":"Gentle"}},
		{"name":"fetch","description":"d","annotations":{"readOnlyHint":true,"untrustedContentHint":true}}
	]}`)
	out, err := json.Marshal(c.Tools)
	if err != nil {
		t.Fatal(err)
	}
	var got []struct {
		Name        string
		InputSchema json.RawMessage
		Annotations map[string]any
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]map[string]any{
		"mutate": {"readOnlyHint": false, "destructiveHint": true, "idempotentHint": false, "openWorldHint": true, "untrustedContentHint": false},
		"read":   {"readOnlyHint": true, "destructiveHint": false, "idempotentHint": true, "openWorldHint": true, "untrustedContentHint": false},
		"gentle": {"readOnlyHint": false, "destructiveHint": false, "idempotentHint": true, "openWorldHint": false, "untrustedContentHint": false, "title": "Gentle"},
		"fetch":  {"readOnlyHint": true, "destructiveHint": false, "idempotentHint": true, "openWorldHint": true, "untrustedContentHint": true},
	}
	for _, g := range got {
		if !equalMaps(g.Annotations, want[g.Name]) {
			t.Errorf("%s: annotations %v, want %v", g.Name, g.Annotations, want[g.Name])
		}
		if g.Name == "mutate" && string(g.InputSchema) != `{"type":"object"}` {
			t.Errorf("a tool without inputSchema got %s", g.InputSchema)
		}
	}
}

func equalMaps(a, b map[string]any) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestTheToolFieldsOfMCPAndWebMCPAreKept(t *testing.T) {
	c := mustParse(t, `{"tools":[
		{"name":"ask_user","title":"Ask the user","description":"Ask a question and wait for the answer.",
		 "inputSchema":{"type":"object","properties":{"question":{"type":"string","minLength":1}},"required":["question"]},
		 "outputSchema":{"type":"object","properties":{"answer":{"type":["string","null"]}}},
		 "timeoutMs":120000, "annotations":{"readOnlyHint":false,"destructiveHint":false}},
		{"name":"plain","description":"d"}
	]}`)
	out, err := json.Marshal(c.Tools)
	if err != nil {
		t.Fatal(err)
	}
	var got []map[string]json.RawMessage
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	ask, plain := got[0], got[1]
	for field, want := range map[string]string{
		"title":        `"Ask the user"`,
		"timeoutMs":    `120000`,
		"outputSchema": `{"type":"object","properties":{"answer":{"type":["string","null"]}}}`,
	} {
		if string(ask[field]) != want {
			t.Errorf("ask_user %s = %s, want %s", field, ask[field], want)
		}
	}
	for _, field := range []string{"timeoutMs", "outputSchema", "title"} {
		if _, ok := plain[field]; ok {
			t.Errorf("a tool without %s answers one: %s", field, plain[field])
		}
	}
	// What For hands out is a copy: changing its timeout changes nothing in the catalog.
	tools := c.For(owner.RoleOwner, "/")
	*tools[0].TimeoutMs = 1
	if *c.For(owner.RoleOwner, "/")[0].TimeoutMs != 120000 {
		t.Error("the timeout of a tool For returned is shared with the catalog")
	}
	// The fields count in the version.
	other := mustParse(t, strings.Replace(string(mustJSON(t, c)), `120000`, `90000`, 1))
	if other.Version == c.Version {
		t.Error("a different timeoutMs gives the same version")
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseErrorsNameTheToolAndField(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want string
	}{
		{"bad JSON", `{"tools":[`, "catalog: invalid JSON: unexpected end of input"},
		{"trailing data", `{"tools":[]} {}`, "catalog: unexpected data after the JSON value"},
		{"an unknown top-level field", `{"tool":[]}`, `catalog: tool: unknown field (a catalog has: version, tools)`},
		{"an unknown tool field", `{"tools":[{"name":"x","description":"d","route":["/"]}]}`,
			`catalog: tools[0] "x": route: unknown field (a tool has: name, title, description, inputSchema, outputSchema, annotations, timeoutMs, routes, disabled)`},
		{"an unknown annotation", `{"tools":[{"name":"x","description":"d","annotations":{"readonly":true}}]}`,
			`catalog: tools[0] "x": annotations.readonly: unknown field (annotations have: title, readOnlyHint, destructiveHint, idempotentHint, openWorldHint, untrustedContentHint)`},
		{"a top-level field in other case", `{"TOOLS":[]}`, `catalog: TOOLS: unknown field (a catalog has: version, tools)`},
		{"a tool field in other case", `{"tools":[{"NAME":"x","description":"d"}]}`, `catalog: tools[0] "x": NAME: unknown field (a tool has: `},
		{"an annotation in other case beside the right one", `{"tools":[{"name":"x","description":"d","annotations":{"readOnlyHint":false,"readonlyhint":true}}]}`,
			`catalog: tools[0] "x": annotations.readonlyhint: unknown field (annotations have: `},
		{"tools given twice", `{"tools":[],"tools":[]}`, `catalog: tools: is given twice`},
		{"a tool field given twice", `{"tools":[{"name":"x","description":"d","name":"y"}]}`, `catalog: tools[0] "y": name: is given twice`},
		{"an annotation given twice", `{"tools":[{"name":"x","description":"d","annotations":{"readOnlyHint":true,"readOnlyHint":false}}]}`,
			`catalog: tools[0] "x": annotations.readOnlyHint: is given twice`},
		{"a property of an input schema given twice", `{"tools":[{"name":"x","description":"d","inputSchema":{"type":"object","properties":{"a":{"type":"number"},"a":{"type":"string"}}}}]}`,
			`catalog: tools[0] "x": inputSchema.properties.a: is given twice`},
		{"a schema's type given twice", `{"tools":[{"name":"x","description":"d","inputSchema":{"type":"string","type":"object"}}]}`,
			`catalog: tools[0] "x": inputSchema.type: is given twice`},
		{"a key given twice deep in an output schema", `{"tools":[{"name":"x","description":"d","outputSchema":{"type":"object","anyOf":[{},{"required":[],"required":["a"]}]}}]}`,
			`catalog: tools[0] "x": outputSchema.anyOf[1].required: is given twice`},
		{"a null title", `{"tools":[{"name":"x","description":"d","title":null}]}`, `catalog: tools[0] "x": title: must not be null: leave it out instead`},
		{"a null hint", `{"tools":[{"name":"x","description":"d","annotations":{"readOnlyHint":null}}]}`,
			`catalog: tools[0] "x": annotations.readOnlyHint: must not be null: leave it out instead`},
		{"a null version", `{"version":null,"tools":[]}`, `catalog: version: must not be null`},
		{"a timeout below a second", `{"tools":[{"name":"x","description":"d","timeoutMs":999}]}`, `catalog: tools[0] "x": timeoutMs: must be from 1000 to 3600000 milliseconds`},
		{"a timeout above an hour", `{"tools":[{"name":"x","description":"d","timeoutMs":3600001}]}`, `timeoutMs: must be from 1000 to 3600000 milliseconds`},
		{"a timeout that is not whole", `{"tools":[{"name":"x","description":"d","timeoutMs":1500.5}]}`, `catalog: tools[0] "x": timeoutMs: must be a whole number, not number`},
		{"a timeout as a string", `{"tools":[{"name":"x","description":"d","timeoutMs":"60s"}]}`, `timeoutMs: must be a whole number, not string`},
		{"an output schema that is not an object schema", `{"tools":[{"name":"x","description":"d","outputSchema":{"type":"array"}}]}`, `catalog: tools[0] "x": outputSchema.type: must be "object"`},
		{"a null output schema", `{"tools":[{"name":"x","description":"d","outputSchema":null}]}`, `outputSchema: must be a JSON object schema (or leave it out)`},
		{"a hint that is not a boolean", `{"tools":[{"name":"x","description":"d","annotations":{"untrustedContentHint":1}}]}`, `annotations.untrustedContentHint: must be a boolean, not number`},
		{"a hint of the wrong type", `{"tools":[{"name":"x","description":"d","annotations":{"readOnlyHint":"yes"}}]}`, `catalog: tools[0] "x": annotations.readOnlyHint: must be a boolean, not string`},
		{"a missing name", `{"tools":[{"description":"d"}]}`, `catalog: tools[0]: name: is required`},
		{"a name with a space", `{"tools":[{"name":"save event","description":"d"}]}`, `catalog: tools[0] "save event": name: may contain only A-Z a-z 0-9 _ . -`},
		{"a name too long", `{"tools":[{"name":"` + strings.Repeat("a", 129) + `","description":"d"}]}`, `name: must be at most 128 characters`},
		{"a missing description", `{"tools":[{"name":"ok"},{"name":"x"}]}`, `catalog: tools[0] "ok": description: is required`},
		{"a schema that is not an object", `{"tools":[{"name":"x","description":"d","inputSchema":[]}]}`, `catalog: tools[0] "x": inputSchema: must be a JSON object schema`},
		{"a null schema", `{"tools":[{"name":"x","description":"d","inputSchema":null}]}`, `inputSchema: must be a JSON object schema (leave it out for {"type":"object"})`},
		{"a schema of type string", `{"tools":[{"name":"x","description":"d","inputSchema":{"type":"string"}}]}`, `catalog: tools[0] "x": inputSchema.type: must be "object"`},
		{"a schema without type", `{"tools":[{"name":"x","description":"d","inputSchema":{"properties":{}}}]}`, `inputSchema.type: must be "object"`},
		{"bad properties", `{"tools":[{"name":"x","description":"d","inputSchema":{"type":"object","properties":{"a":1}}}]}`, `inputSchema.properties.a: must be a schema`},
		{"bad required", `{"tools":[{"name":"x","description":"d","inputSchema":{"type":"object","required":"a"}}]}`, `inputSchema.required: must be an array of strings`},
		{"a read-only destructive tool", `{"tools":[{"name":"x","description":"d","annotations":{"readOnlyHint":true,"destructiveHint":true}}]}`, `annotations.destructiveHint: must not be true for a tool with readOnlyHint true`},
		{"an empty route list", `{"tools":[{"name":"x","description":"d","routes":[]}]}`, `catalog: tools[0] "x": routes: must not be an empty list`},
		{"a relative route", `{"tools":[{"name":"x","description":"d","routes":["/a","events"]}]}`, `catalog: tools[0] "x": routes[1] "events": must start with "/"`},
		{"a trailing slash", `{"tools":[{"name":"x","description":"d","routes":["/events/"]}]}`, `routes[0] "/events/": must not end with "/"`},
		{"a wildcard in the middle", `{"tools":[{"name":"x","description":"d","routes":["/*/edit"]}]}`, `"*" may only be the last segment`},
		{"a bad parameter", `{"tools":[{"name":"x","description":"d","routes":["/events/:"]}]}`, `parameter ":" must be`},
		{"a bad character", `{"tools":[{"name":"x","description":"d","routes":["/events?x"]}]}`, `segment "events?x": character '?' is not allowed`},
		{"a character beyond ASCII, named as itself", `{"tools":[{"name":"x","description":"d","routes":["/ü"]}]}`, `segment "ü": character 'ü' is not allowed`},
		{"a route listed twice", `{"tools":[{"name":"x","description":"d","routes":["/a","/a"]}]}`, `routes[1] "/a": is listed twice`},
		{"a version that is not a string", `{"version":1,"tools":[]}`, `catalog: version: must be a string`},
		{"no tools", `{}`, `catalog: tools: is required: the list of tools, [] for none`},
		{"null tools", `{"version":"v","tools":null}`, `catalog: tools: is required`},
		{"tools that are not a list", `{"tools":{}}`, `tools: must be`},
		{"invalid UTF-8", "{\"tools\":[{\"name\":\"x\",\"description\":\"d\xff\"}]}", `catalog: is not valid UTF-8`},
		{"a lone surrogate escaped", `{"tools":[{"name":"x","description":"d\udead"}]}`, `catalog: escapes a lone UTF-16 surrogate`},
		{"a name twice without routes", `{"tools":[{"name":"x","description":"d"},{"name":"x","description":"e"}]}`,
			`catalog: tools[1] "x": conflicts with tools[0]: both have no routes, so both exist on every route`},
		{"a name on every route and on one", `{"tools":[{"name":"x","description":"d"},{"name":"x","description":"e","routes":["/a"]}]}`,
			`catalog: tools[1] "x": conflicts with tools[0]: that one has no routes, so it exists on every route`},
		{"two profiles that overlap", `{"tools":[{"name":"x","description":"d","routes":["/a/:id"]},{"name":"y","description":"d"},{"name":"x","description":"e","routes":["/b","/a/*"]}]}`,
			`catalog: tools[2] "x": conflicts with tools[0]: routes "/a/:id" and "/a/*" can match the same route`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := catalog.Parse([]byte(tt.doc))
			if err == nil {
				t.Fatal("Parse accepted it")
			}
			if !errors.Is(err, catalog.ErrInvalid) {
				t.Errorf("error %v does not match ErrInvalid", err)
			}
			var ce *catalog.Error
			if !errors.As(err, &ce) {
				t.Errorf("error %T is not a *catalog.Error", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
		})
	}
}

// TestParseErrorsGiveTheFieldApart: Error.Field, which the admin API answers as details.field,
// names the field of every key and type error, not only the message.
func TestParseErrorsGiveTheFieldApart(t *testing.T) {
	for doc, want := range map[string]struct {
		index int
		field string
	}{
		`{"tool":[]}`:             {-1, "tool"},
		`{"tools":[],"tools":[]}`: {-1, "tools"},
		`{"tools":[{"name":"x","description":"d","route":["/"]}]}`:                        {0, "route"},
		`{"tools":[{"name":"x","description":"d","annotations":{"readonly":true}}]}`:      {0, "annotations.readonly"},
		`{"tools":[{"name":"x","description":"d","name":"y"}]}`:                           {0, "name"},
		`{"tools":[{"name":"x","description":"d","timeoutMs":"60s"}]}`:                    {0, "timeoutMs"},
		`{"tools":[{"name":"x","description":"d","annotations":{"readOnlyHint":"yes"}}]}`: {0, "annotations.readOnlyHint"},
		`{"tools":[{"name":"x","description":"d"},{"name":"y","description":"d","x":1}]}`: {1, "x"},
	} {
		_, err := catalog.Parse([]byte(doc))
		var ce *catalog.Error
		if !errors.As(err, &ce) || ce.Index != want.index || ce.Field != want.field {
			t.Errorf("Parse(%s) = %#v, want index %d and field %q", doc, ce, want.index, want.field)
		}
	}
}

func TestOverlapDetection(t *testing.T) {
	tests := []struct {
		a, b    string
		overlap bool
	}{
		{"/events", "/events", true},
		{"/events", "/events/:id", false},
		{"/events", "/events/*", false},
		{"/events/:id", "/events/*", true},
		{"/events/:id", "/events/new", true},
		{"/events/:id", "/events/:other", true},
		{"/events/:id", "/events/:id/edit", false},
		{"/events/:id/edit", "/events/*", true},
		{"/events/*", "/*", true},
		{"/users/*", "/events/*", false},
		{"/*", "/", false},
		{"/", "/", true},
		{"/:a/b", "/a/:b", true},
		{"/:a/b", "/a/c", false},
		{"/a/b/*", "/a/*", true},
		{"/a/b/*", "/a/c/*", false},
		{"/a/:x/c", "/a/*", true},
		{"/a", "/*", true},
		{"/a/b", "/:x", false},
	}
	for _, tt := range tests {
		for _, pair := range [][2]string{{tt.a, tt.b}, {tt.b, tt.a}} {
			doc := `{"tools":[{"name":"x","description":"d","routes":["` + pair[0] + `"]},{"name":"x","description":"e","routes":["` + pair[1] + `"]}]}`
			_, err := catalog.Parse([]byte(doc))
			if got := err != nil; got != tt.overlap {
				t.Errorf("%s and %s: overlap = %v (err %v), want %v", pair[0], pair[1], got, err, tt.overlap)
			}
		}
	}
}

// TestTheRoutesOfANameAreBounded: the profiles of a name are compared pairwise, so their routes
// are bounded before; as many profiles of different names pass.
func TestTheRoutesOfANameAreBounded(t *testing.T) {
	profiles := func(name func(i int) string, n int) []catalog.Tool {
		tools := make([]catalog.Tool, n)
		for i := range tools {
			tools[i] = catalog.Tool{Name: name(i), Description: "d", Routes: []string{fmt.Sprintf("/p%d/:id", i)}}
		}
		return tools
	}
	same := func(int) string { return "x" }
	if _, err := catalog.New(profiles(same, catalog.MaxRoutesPerName)); err != nil {
		t.Fatalf("%d profiles of one name: %v", catalog.MaxRoutesPerName, err)
	}
	start := time.Now()
	_, err := catalog.New(profiles(same, 12000))
	var ce *catalog.Error
	if !errors.As(err, &ce) || ce.Index != catalog.MaxRoutesPerName || ce.Field != "routes" {
		t.Fatalf("12000 profiles of one name: %v, want an error at tools[%d].routes", err, catalog.MaxRoutesPerName)
	}
	t.Logf("refused in %v", time.Since(start))
	if _, err := catalog.New(profiles(func(i int) string { return fmt.Sprintf("t%d", i) }, 2000)); err != nil {
		t.Fatalf("2000 tools of a route each: %v", err)
	}
}

func TestForIsDeterministicAndACopy(t *testing.T) {
	c := mustParse(t, eventsCatalog)
	a := c.For(owner.RoleOwner, "/events")
	a[0].InputSchema[0] = 'X'
	*a[0].Annotations.ReadOnlyHint = false
	a[0].Routes[0] = "/changed"
	b := c.For(owner.RoleOwner, "/events")
	ja, _ := json.Marshal(b)
	for i := 0; i < 20; i++ {
		jb, _ := json.Marshal(c.For(owner.RoleOwner, "/events"))
		if string(ja) != string(jb) {
			t.Fatalf("For changed between calls:\n%s\n%s", ja, jb)
		}
	}
	if b[0].InputSchema[0] != '{' || !*b[0].Annotations.ReadOnlyHint || b[0].Routes[0] != "/events" {
		t.Fatal("changing what For returned changed the catalog")
	}
	if got := c.For(owner.RoleViewer, "/nowhere/at/all"); got == nil {
		t.Fatal("For returned nil; want an empty list (JSON [])")
	}

	// The order of the file does not change what a tab sees.
	var doc struct{ Tools []json.RawMessage }
	if err := json.Unmarshal([]byte(eventsCatalog), &doc); err != nil {
		t.Fatal(err)
	}
	slices.Reverse(doc.Tools)
	rev, _ := json.Marshal(map[string]any{"tools": doc.Tools})
	r := mustParse(t, string(rev))
	for _, route := range []string{"/events", "/events/e", "/"} {
		x, _ := json.Marshal(c.For(owner.RoleOwner, route))
		y, _ := json.Marshal(r.For(owner.RoleOwner, route))
		if string(x) != string(y) {
			t.Errorf("%s: reordering the file changed For:\n%s\n%s", route, x, y)
		}
	}
}

func TestVersionAndETagAreStable(t *testing.T) {
	c := mustParse(t, eventsCatalog)
	if !strings.HasPrefix(c.Version, "sha256:") || len(c.Version) != len("sha256:")+16 {
		t.Fatalf("version %q", c.Version)
	}
	if c.ETag() != `"`+c.Version+`"` {
		t.Fatalf("ETag %s", c.ETag())
	}
	if again := mustParse(t, eventsCatalog); again.Version != c.Version {
		t.Error("parsing the same bytes twice gave two versions")
	}
	compact, _ := json.Marshal(json.RawMessage(eventsCatalog))
	if v := mustParse(t, string(compact)).Version; v != c.Version {
		t.Error("whitespace changed the version")
	}
	// What GET returns can be PUT back: same version.
	out, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if v := mustParse(t, string(out)).Version; v != c.Version {
		t.Errorf("a round trip changed the version: %s -> %s", c.Version, v)
	}
	// Making a default explicit does not change the meaning, nor the version.
	explicit := strings.Replace(eventsCatalog, `"annotations": {"readOnlyHint": true, "openWorldHint": false}`,
		`"annotations": {"readOnlyHint": true, "openWorldHint": false, "destructiveHint": false}`, 1)
	if v := mustParse(t, explicit).Version; v != c.Version {
		t.Error("spelling out a default changed the version")
	}
	changed := strings.Replace(eventsCatalog, "Search public events.", "Search events.", 1)
	if v := mustParse(t, changed).Version; v == c.Version {
		t.Error("a new description kept the version")
	}
	for header, want := range map[string]bool{
		c.ETag():                    true,
		"*":                         true,
		`"x", ` + c.ETag():          true,
		"W/" + c.ETag():             false,
		`"sha256:0000000000000000"`: false,
		"":                          false,
	} {
		if got := c.MatchETag(header); got != want {
			t.Errorf("MatchETag(%q) = %v, want %v", header, got, want)
		}
	}
}

func TestCheckRoute(t *testing.T) {
	for route, ok := range map[string]bool{
		"/": true, "/events/evt-1": true, "/a%20b?x=1#y": true,
		"": false, "events": false, "/a b": false, "/é": false, "/" + strings.Repeat("a", 2048): false,
	} {
		if err := catalog.CheckRoute(route); (err == nil) != ok {
			t.Errorf("CheckRoute(%q) = %v, want ok=%v", route, err, ok)
		}
	}
}

func TestNewDoesNotModifyItsInput(t *testing.T) {
	in := []catalog.Tool{{Name: "x", Description: "d", Routes: []string{"/a"}}}
	c, err := catalog.New(in)
	if err != nil {
		t.Fatal(err)
	}
	if in[0].InputSchema != nil || in[0].Annotations.ReadOnlyHint != nil {
		t.Fatal("New changed its input")
	}
	if got := names(c.For(owner.RoleOwner, "/a")); !slices.Equal(got, []string{"x"}) {
		t.Fatalf("For = %v", got)
	}
}
