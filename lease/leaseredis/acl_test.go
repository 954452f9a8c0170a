package leaseredis_test

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/tablease/tablease/internal/redistest"
	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/lease/leaseredis"
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

// TestTheREADMEsACLUserIsRefusedNothingOnOneServer runs an engine as a user made from the README's
// ACL line alone (no Cluster rules) on one server, as the README tells operators of a standalone
// Redis to run it, and requires Redis to have refused that user nothing: each refusal is an entry
// of ACL LOG and a rejected call, which operators watch for attacks, and the functions must not
// make one with every grant and release (they ask CLUSTER MYID whether they run on a Cluster).
func TestTheREADMEsACLUserIsRefusedNothingOnOneServer(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	if err := admin.FunctionFlush(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	const prefix = "readmeacl"
	eng := clientEngine(t, aclUser(t, srv.URL(), []*redistest.Server{srv}, prefix, false), conformanceOpTimeout,
		leaseredis.Options{Prefix: prefix, OpTimeout: conformanceOpTimeout})
	t.Cleanup(func() { _ = eng.Close() })
	for i := range 3 {
		key := lease.Key{User: "u1", Session: fmt.Sprintf("doc-%d", i)}
		l, err := eng.Acquire(t.Context(), lease.AcquireRequest{Key: key, Holder: lease.Holder{TabID: "t-1"}, Mode: lease.ModeTry})
		if err != nil {
			t.Fatalf("acquire: %v", err)
		}
		if _, err := eng.Release(t.Context(), lease.ReleaseRequest{Key: key, TabID: "t-1", Epoch: l.Epoch}); err != nil {
			t.Fatalf("release: %v", err)
		}
	}
	if err := eng.Ping(t.Context()); err != nil {
		t.Fatalf("ping: %v", err)
	}
	entries, err := admin.Do(t.Context(), "ACL", "LOG").Slice()
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Errorf("Redis refused the README's ACL user %d kind(s) of call on one server: %v", len(entries), entries)
	}
}
