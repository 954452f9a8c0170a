package leaseredis_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/tablease/tablease/internal/redistest"
)

// The README's ACL rules for the tablease user ("Running it"): its ACL SETUSER line, and the rules
// it adds on a Cluster. The conformance suites run as users made from them, so that what the README
// tells operators to grant is what the tests run with.
var (
	readmeACLLine    = regexp.MustCompile("(?m)^ACL SETUSER tablease on >S3cret (.+)$")
	readmeACLCluster = regexp.MustCompile("On a Cluster add `([^`]+)`")
)

// readmeACL answers the rules of the README's ACL line for the keys and channels of prefix rather
// than of tablease's default prefix, with the Cluster's rules when cluster is true.
func readmeACL(t testing.TB, prefix string, cluster bool) []string {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	line := readmeACLLine.FindSubmatch(readme)
	if line == nil {
		t.Fatal("README.md has no line ACL SETUSER tablease on >S3cret …")
	}
	rules := strings.Fields(string(line[1]))
	if cluster {
		more := readmeACLCluster.FindSubmatch(readme)
		if more == nil {
			t.Fatal("README.md names no ACL rules to add on a Cluster (On a Cluster add `…`)")
		}
		rules = append(rules, strings.Fields(string(more[1]))...)
	}
	for i, r := range rules {
		switch r {
		case "~tablease:*", "&tablease:*":
			rules[i] = r[:1] + prefix + ":*"
		}
	}
	return rules
}

// aclUser makes, on each of nodes, the user named prefix with the README's rules for prefix (see
// readmeACL) and password pw, and answers url with that user's credentials.
func aclUser(t testing.TB, url string, nodes []*redistest.Server, prefix string, cluster bool) string {
	t.Helper()
	const pw = "acl-pw"
	args := []any{"ACL", "SETUSER", prefix, "reset", "on", ">" + pw}
	for _, r := range readmeACL(t, prefix, cluster) {
		args = append(args, r)
	}
	for _, n := range nodes {
		if err := n.Client(t).Do(t.Context(), args...).Err(); err != nil {
			t.Fatalf("ACL SETUSER with the README's rules: %v", err)
		}
	}
	scheme, rest, ok := strings.Cut(url, "://")
	if !ok {
		t.Fatalf("URL %q has no scheme", url)
	}
	return scheme + "://" + prefix + ":" + pw + "@" + rest
}
