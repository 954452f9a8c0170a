package catalog_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/tablease/tablease/owner"
	"github.com/tablease/tablease/owner/catalog"
)

// FuzzParse parses the input as a catalog and, when it is accepted, checks what the API and the
// tabs rely on: every hint is explicit; what GET answers (the catalog encoded) parses back to the
// same tools and version; whitespace does not change the version; and for the input's route and
// routes made from the catalog's own patterns, a viewer is given only enabled read-only tools, an
// owner every enabled tool that exists on the route (by a matcher written apart from the
// package's), each name at most once, sorted by name, the viewer's a subset of the owner's. A
// refusal is an *Error matching ErrInvalid.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"tools": []}`,
		`{"tools": [{"name": "search_events", "description": "Search.", "annotations": {"readOnlyHint": true}, "routes": ["/events"]}]}`,
		`{"version": "sha256:0", "tools": [{"name": "a", "description": "d"}]}`,
		`{"tools": [{"name": "get", "description": "list", "annotations": {"readOnlyHint": true}, "routes": ["/events"]},
		  {"name": "get", "description": "one", "inputSchema": {"type": "object", "additionalProperties": false},
		   "annotations": {"readOnlyHint": true}, "routes": ["/events/:id"]},
		  {"name": "rename", "description": "r", "routes": ["/events/:id", "/x/*"]},
		  {"name": "off", "description": "o", "annotations": {"readOnlyHint": true}, "disabled": true}]}`,
		`{"tools": [{"name": "a", "description": "d", "routes": ["/events/:id"]}, {"name": "a", "description": "e", "routes": ["/events/*"]}]}`,
		`{"tools": [{"name": "a", "description": "d", "annotations": {"readOnlyHint": true, "destructiveHint": true}}]}`,
		`{"tools": [{"name": "a", "description": "d", "timeoutMs": 1000, "outputSchema": {"type": "object"}, "title": "T"}]}`,
		`{"tools": [{"name": "a", "description": "d", "inputSchema": {"type": "string"}}]}`,
		`{"tools": [{"name": "a", "description": "d", "extra": 1}]}`,
		`{"tools": [{"name": "a", "description": "d", "routes": ["/", "/a/:b/*"]}]}`,
		`{"tools": null}`, `null`, `{}`, `[]`, `{"tools": [null]}`,
		`{"tools": [{"name": "w", "description": "d", "annotations": {"title": "W", "idempotentHint": true, "destructiveHint": false,
		  "openWorldHint": false, "untrustedContentHint": true}, "routes": ["/a/*"]}]}`,
		readmeCatalog,
	} {
		f.Add([]byte(s), "/events/evt-1?x=1")
	}
	f.Fuzz(func(t *testing.T, data []byte, route string) {
		c, err := catalog.Parse(data)
		if err != nil {
			var e *catalog.Error
			if !errors.As(err, &e) || !errors.Is(err, catalog.ErrInvalid) {
				t.Fatalf("Parse(%q) = %v, not a *catalog.Error", data, err)
			}
			return
		}
		for _, tool := range c.Tools {
			a := tool.Annotations
			if a.ReadOnlyHint == nil || a.DestructiveHint == nil || a.IdempotentHint == nil || a.OpenWorldHint == nil || a.UntrustedContentHint == nil {
				t.Fatalf("tool %q has a hint left implicit: %+v", tool.Name, a)
			}
			if a.ReadOnly() && a.Destructive() {
				t.Fatalf("tool %q is read-only and destructive", tool.Name)
			}
		}
		enc, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		back, err := catalog.Parse(enc)
		if err != nil {
			t.Fatalf("the catalog parsed from %q encodes as %s, which is refused: %v", data, enc, err)
		}
		if enc2, _ := json.Marshal(back); back.Version != c.Version || !bytes.Equal(enc, enc2) {
			t.Fatalf("round trip: %s (%s) became %s (%s)", enc, c.Version, enc2, back.Version)
		}
		var spaced bytes.Buffer
		if json.Indent(&spaced, data, "\n ", "\t") == nil {
			if s, err := catalog.Parse(spaced.Bytes()); err != nil || s.Version != c.Version {
				t.Fatalf("indented, %q parses to %v, %v; it was %s", data, s, err, c.Version)
			}
		}
		for _, r := range routesFor(c, route) {
			checkFor(t, c, r)
		}
	})
}

// readmeCatalog is the example of the README's "Tool catalog".
const readmeCatalog = `{"tools": [
  {"name": "search_events", "description": "Search public events.",
   "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}}},
   "annotations": {"readOnlyHint": true}, "routes": ["/events"]},
  {"name": "get_event_details", "description": "Details of an event by id.",
   "inputSchema": {"type": "object", "properties": {"event_id": {"type": "string"}}, "required": ["event_id"]},
   "annotations": {"readOnlyHint": true}, "routes": ["/events"]},
  {"name": "get_event_details", "description": "Details of the event on this page.",
   "inputSchema": {"type": "object", "additionalProperties": false},
   "annotations": {"readOnlyHint": true}, "routes": ["/events/:id"]},
  {"name": "rename_event", "description": "Rename the event on this page.", "routes": ["/events/:id"]},
  {"name": "save_event", "description": "Save an event to the user's list.",
   "annotations": {"destructiveHint": false, "idempotentHint": true}, "disabled": false}
]}`

// routesFor is route and, for every pattern of c, a route it matches and a route one segment
// longer.
func routesFor(c *catalog.Catalog, route string) []string {
	routes := []string{route, "/", ""}
	for _, tool := range c.Tools {
		for _, p := range tool.Routes {
			var segs []string
			for _, s := range strings.Split(p, "/") {
				switch {
				case s == "":
				case s == "*":
					segs = append(segs, "w1", "w2")
				case s[0] == ':':
					segs = append(segs, "v")
				default:
					segs = append(segs, s)
				}
			}
			r := "/" + strings.Join(segs, "/")
			routes = append(routes, r, r+"/more", r+"/?q")
		}
	}
	return routes
}

func checkFor(t *testing.T, c *catalog.Catalog, route string) {
	viewer := c.For(owner.RoleViewer, route)
	own := c.For(owner.RoleOwner, route)
	for _, tc := range []struct {
		role  owner.Role
		tools []catalog.Tool
	}{{owner.RoleViewer, viewer}, {owner.RoleOwner, own}} {
		var names []string
		for _, tool := range tc.tools {
			if tool.Disabled {
				t.Fatalf("%s on %q is given the disabled tool %q", tc.role, route, tool.Name)
			}
			if tc.role == owner.RoleViewer && !tool.Annotations.ReadOnly() {
				t.Fatalf("a viewer on %q is given the mutation tool %q", route, tool.Name)
			}
			if !existsOn(tool, route) {
				t.Fatalf("%s on %q is given %q, whose routes %q do not match it", tc.role, route, tool.Name, tool.Routes)
			}
			names = append(names, tool.Name)
		}
		if !slices.IsSorted(names) || len(slices.Compact(slices.Clone(names))) != len(names) {
			t.Fatalf("%s on %q is given %q: not sorted, or a name twice", tc.role, route, names)
		}
	}
	want := map[string]bool{}
	for _, tool := range c.Tools {
		if !tool.Disabled && existsOn(tool, route) {
			want[tool.Name] = true
		}
	}
	if len(own) != len(want) {
		t.Fatalf("an owner on %q is given %d tools, %d names exist there", route, len(own), len(want))
	}
	for _, v := range viewer {
		if !slices.ContainsFunc(own, func(o catalog.Tool) bool { return o.Name == v.Name && o.Description == v.Description }) {
			t.Fatalf("a viewer on %q is given %q, which the owner is not", route, v.Name)
		}
	}
}

// existsOn matches route against the tool's patterns, as the package documentation describes them.
func existsOn(tool catalog.Tool, route string) bool {
	if len(tool.Routes) == 0 {
		return true
	}
	if catalog.CheckRoute(route) != nil {
		return false
	}
	if i := strings.IndexAny(route, "?#"); i >= 0 {
		route = route[:i]
	}
	var segs []string
	for _, s := range strings.Split(route, "/") {
		if s != "" {
			segs = append(segs, s)
		}
	}
	for _, p := range tool.Routes {
		var pat []string
		if p != "/" {
			pat = strings.Split(p, "/")[1:]
		}
		if matchSegs(pat, segs) {
			return true
		}
	}
	return false
}

func matchSegs(pat, segs []string) bool {
	for i, p := range pat {
		switch {
		case p == "*":
			return len(segs) > i
		case i >= len(segs):
			return false
		case p[0] == ':':
		case p != segs[i]:
			return false
		}
	}
	return len(pat) == len(segs)
}
