package api

import (
	"bufio"
	"bytes"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// specOperations reads "METHOD /path" of every operation under the top-level paths: of the
// embedded document. The document is YAML with two-space indentation; this reads only the
// lines that name paths (two spaces) and methods (four spaces), which is all the test needs
// without a YAML dependency.
func specOperations(t *testing.T) []string {
	t.Helper()
	pathRE := regexp.MustCompile(`^  (/[^:\s]*):\s*$`)
	methodRE := regexp.MustCompile(`^    (get|put|post|delete|patch|head|options|trace):\s*$`)
	var ops []string
	inPaths, path := false, ""
	sc := bufio.NewScanner(bytes.NewReader(openapiYAML))
	for sc.Scan() {
		line := sc.Text()
		if line != "" && line[0] != ' ' && line[0] != '#' {
			inPaths = strings.HasPrefix(line, "paths:")
			continue
		}
		if !inPaths {
			continue
		}
		if m := pathRE.FindStringSubmatch(line); m != nil {
			path = m[1]
		} else if m := methodRE.FindStringSubmatch(line); m != nil && path != "" {
			ops = append(ops, strings.ToUpper(m[1])+" "+path)
		}
	}
	if len(ops) == 0 {
		t.Fatal("no operation found under paths: in openapi.yaml")
	}
	return ops
}

var echoParam = regexp.MustCompile(`:([A-Za-z0-9_]+)`)

func TestOpenAPIDescribesEveryRoute(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.Dev = true }) // every route registered
	var routes []string
	for _, r := range h.srv.echo.Routes() {
		if !slices.Contains([]string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}, r.Method) {
			continue // Echo's internal route-not-found entries
		}
		p := echoParam.ReplaceAllString(r.Path, "{$1}")
		if rest, ok := strings.CutSuffix(p, "/*"); ok { // a wildcard is documented as {path}
			p = rest + "/{path}"
		}
		routes = append(routes, r.Method+" "+p)
	}
	spec := specOperations(t)
	sort.Strings(routes)
	sort.Strings(spec)
	for _, r := range routes {
		if !slices.Contains(spec, r) {
			t.Errorf("route %s is implemented but missing from openapi.yaml", r)
		}
	}
	for _, s := range spec {
		if !slices.Contains(routes, s) {
			t.Errorf("openapi.yaml lists %s, which is not implemented", s)
		}
	}
	if t.Failed() {
		t.Logf("routes: %v\nspec:   %v", routes, spec)
	}
}

func TestOpenAPIListsEveryErrorCode(t *testing.T) {
	doc := string(openapiYAML)
	for code := range Codes {
		if !strings.Contains(doc, "- "+code+"\n") {
			t.Errorf("openapi.yaml does not list the error code %s in the Error schema", code)
		}
	}
}
