package catalog_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"regexp"
	"strings"
	"testing"

	"github.com/tablease/tablease/owner"
	"github.com/tablease/tablease/owner/catalog"
)

// The property tests generate catalogs from a fixed list of seeds, so that a failure is
// reproducible, and compare Parse and For with an oracle written independently: regular
// expressions for route matching and brute force over every concrete route for overlaps.

var propertySeeds = []int64{1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987, 1597}

const catalogsPerSeed = 40

// alphabet is every literal the generated patterns use; concreteRoutes is every route of up to four
// segments over it, which holds a witness for any overlap of the generated patterns (at most three
// fixed segments and a wildcard).
var alphabet = []string{"events", "e1", "edit", "users", "a"}

var patternPool = []string{
	"/", "/*", "/events", "/events/:id", "/events/*", "/events/:id/edit", "/events/e1",
	"/:section", "/:section/edit", "/users/:u", "/users/*", "/a/:x/edit", "/a/edit/*", "/:x/:y/:z/*",
}

var concreteRoutes = func() []string {
	routes := []string{"/"}
	level := []string{""}
	for depth := 0; depth < 4; depth++ {
		var next []string
		for _, prefix := range level {
			for _, s := range alphabet {
				next = append(next, prefix+"/"+s)
			}
		}
		routes = append(routes, next...)
		level = next
	}
	return routes
}()

// extraRoutes are spellings the normalization must handle, and routes no pattern matches.
var extraRoutes = []string{"", "events", "/events/", "//events//e1", "/events?tab=2", "/events/e1#x", "/nowhere", "/a b"}

type genTool struct {
	raw      map[string]any
	name     string
	routes   []string
	readOnly bool // effective readOnlyHint, computed from the generated JSON alone
	disabled bool
}

func genCatalog(r *rand.Rand) []genTool {
	names := []string{"alpha", "beta", "gamma", "delta"}
	hint := func() *bool {
		switch r.Intn(3) {
		case 0:
			return nil
		case 1:
			t := true
			return &t
		}
		f := false
		return &f
	}
	n := r.Intn(9)
	tools := make([]genTool, 0, n)
	for i := 0; i < n; i++ {
		g := genTool{name: names[r.Intn(len(names))]}
		g.raw = map[string]any{"name": g.name, "description": fmt.Sprintf("tool %d", i)}
		ann := map[string]any{}
		ro := hint()
		if ro != nil {
			ann["readOnlyHint"] = *ro
			g.readOnly = *ro
		}
		if d := hint(); d != nil && !(g.readOnly && *d) {
			ann["destructiveHint"] = *d
		}
		if h := hint(); h != nil {
			ann["idempotentHint"] = *h
		}
		if h := hint(); h != nil {
			ann["openWorldHint"] = *h
		}
		if len(ann) > 0 || r.Intn(2) == 0 {
			g.raw["annotations"] = ann
		}
		if r.Intn(4) != 0 {
			k := 1 + r.Intn(3)
			for _, j := range r.Perm(len(patternPool))[:k] {
				g.routes = append(g.routes, patternPool[j])
			}
			g.raw["routes"] = g.routes
		}
		if r.Intn(6) == 0 {
			g.disabled = true
			g.raw["disabled"] = true
		}
		if r.Intn(3) == 0 {
			g.raw["inputSchema"] = map[string]any{"type": "object", "properties": map[string]any{fmt.Sprintf("p%d", i): map[string]any{"type": "string"}}}
		}
		tools = append(tools, g)
	}
	return tools
}

// oracleRegexp translates a pattern into a regular expression over normalized routes.
func oracleRegexp(p string) *regexp.Regexp {
	if p == "/" {
		return regexp.MustCompile(`^/$`)
	}
	var b strings.Builder
	b.WriteString("^")
	for _, seg := range strings.Split(p[1:], "/") {
		switch {
		case seg == "*":
			b.WriteString(`(/[^/]+)+`)
		case strings.HasPrefix(seg, ":"):
			b.WriteString(`/[^/]+`)
		default:
			b.WriteString("/" + regexp.QuoteMeta(seg))
		}
	}
	b.WriteString("$")
	return regexp.MustCompile(b.String())
}

var oracleRegexps = func() map[string]*regexp.Regexp {
	m := map[string]*regexp.Regexp{}
	for _, p := range patternPool {
		m[p] = oracleRegexp(p)
	}
	return m
}()

// oracleNormalize returns the normalized route and whether the route is valid at all.
func oracleNormalize(route string) (string, bool) {
	if !strings.HasPrefix(route, "/") || strings.ContainsAny(route, " ") {
		return "", false
	}
	route, _, _ = strings.Cut(route, "#")
	route, _, _ = strings.Cut(route, "?")
	var segs []string
	for _, s := range strings.Split(route, "/") {
		if s != "" {
			segs = append(segs, s)
		}
	}
	return "/" + strings.Join(segs, "/"), true
}

func (g genTool) existsOn(route string) bool {
	if g.routes == nil {
		return true
	}
	norm, ok := oracleNormalize(route)
	if !ok {
		return false
	}
	for _, p := range g.routes {
		if oracleRegexps[p].MatchString(norm) {
			return true
		}
	}
	return false
}

// oracleConflict reports whether two entries of one name exist on a common concrete route.
func oracleConflict(tools []genTool) bool {
	for i := range tools {
		for j := i + 1; j < len(tools); j++ {
			if tools[i].name != tools[j].name {
				continue
			}
			if tools[i].routes == nil || tools[j].routes == nil {
				return true
			}
			for _, route := range concreteRoutes {
				if tools[i].existsOn(route) && tools[j].existsOn(route) {
					return true
				}
			}
		}
	}
	return false
}

func TestPropertyViewersNeverGetMutationTools(t *testing.T) {
	routes := append(append([]string{}, concreteRoutes...), extraRoutes...)
	parsed, rejected := 0, 0
	for _, seed := range propertySeeds {
		r := rand.New(rand.NewSource(seed))
		for n := 0; n < catalogsPerSeed; n++ {
			gen := genCatalog(r)
			raws := make([]any, len(gen))
			for i, g := range gen {
				raws[i] = g.raw
			}
			doc, _ := json.Marshal(map[string]any{"tools": raws})
			c, err := catalog.Parse(doc)
			wantConflict := oracleConflict(gen)
			if wantConflict {
				if err == nil || !errors.Is(err, catalog.ErrInvalid) || !strings.Contains(err.Error(), "conflicts with") {
					t.Fatalf("seed %d #%d: want a conflict error, got %v\n%s", seed, n, err, doc)
				}
				rejected++
				continue
			}
			if err != nil {
				t.Fatalf("seed %d #%d: Parse: %v\n%s", seed, n, err, doc)
			}
			parsed++
			for _, route := range routes {
				viewer := c.For(owner.RoleViewer, route)
				ownerTools := c.For(owner.RoleOwner, route)
				for _, tool := range viewer {
					if !tool.Annotations.ReadOnly() || tool.Annotations.ReadOnlyHint == nil || !*tool.Annotations.ReadOnlyHint {
						t.Fatalf("seed %d #%d: a viewer on %q got mutation tool %q\n%s", seed, n, route, tool.Name, doc)
					}
				}
				// Independently of the library's defaults: what the oracle says each role gets.
				wantOwner, wantViewer := map[string]string{}, map[string]string{}
				for _, g := range gen {
					if g.disabled || !g.existsOn(route) {
						continue
					}
					wantOwner[g.name] = g.raw["description"].(string)
					if g.readOnly {
						wantViewer[g.name] = g.raw["description"].(string)
					}
				}
				check := func(role string, got []catalog.Tool, want map[string]string) {
					if len(got) != len(want) {
						t.Fatalf("seed %d #%d: %s on %q got %v, want %v\n%s", seed, n, role, route, names(got), want, doc)
					}
					for i, tool := range got {
						if i > 0 && got[i-1].Name >= tool.Name {
							t.Fatalf("seed %d #%d: %s on %q: not sorted by name or a name twice: %v", seed, n, role, route, names(got))
						}
						if want[tool.Name] != tool.Description {
							t.Fatalf("seed %d #%d: %s on %q got profile %q of %q, want %q\n%s", seed, n, role, route, tool.Description, tool.Name, want[tool.Name], doc)
						}
					}
				}
				check("owner", ownerTools, wantOwner)
				check("viewer", viewer, wantViewer)
			}
		}
	}
	if parsed < 100 || rejected < 50 {
		t.Fatalf("the generator is off balance: %d catalogs parsed, %d rejected", parsed, rejected)
	}
	t.Logf("%d catalogs checked on %d routes each; %d rejected for overlapping profiles", parsed, len(routes), rejected)
}
