package leaseredis

import (
	"errors"
	"strings"
	"testing"

	"github.com/tablease/tablease/internal/redistest"
	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/lease/leasetest"
)

// TestDocuments runs the document suite on a namespace of the shared Redis per subtest.
func TestDocuments(t *testing.T) {
	leasetest.RunDocuments(t, func(t *testing.T) leasetest.DocumentStore {
		e, _ := documentEngine(t)
		return e
	})
}

// documentEngine is an engine on a namespace of the shared Redis, and that namespace.
func documentEngine(t *testing.T) (*Engine, *redistest.DB) {
	t.Helper()
	e, _, db := sharedEngine(t, Options{})
	return e, db
}

func TestADocumentIsOneHashUnderThePrefixThatNeverExpires(t *testing.T) {
	e, db := documentEngine(t)
	rdb := db.Client(t)
	ctx := t.Context()
	if _, err := e.PutDocument(ctx, "catalog", lease.Document{Version: "v1", Data: []byte(`{"tools":[]}`)}, lease.IfAbsent); err != nil {
		t.Fatal(err)
	}
	key := db.Prefix() + ":doc:catalog"
	if typ := rdb.Type(ctx, key).Val(); typ != "hash" {
		t.Fatalf("TYPE %s = %q, want hash", key, typ)
	}
	if ttl := rdb.TTL(ctx, key).Val(); ttl >= 0 {
		t.Fatalf("TTL %s = %v, want none", key, ttl)
	}
	m := rdb.HGetAll(ctx, key).Val()
	if m["version"] != "v1" || m["data"] != `{"tools":[]}` || m["updated_us"] == "" {
		t.Fatalf("HGETALL %s = %v", key, m)
	}
}

func TestDocumentCallsAfterCloseAreUnavailable(t *testing.T) {
	e, _ := documentEngine(t)
	_ = e.Close()
	ctx := t.Context()
	if _, err := e.GetDocument(ctx, "catalog"); !errors.Is(err, lease.ErrUnavailable) {
		t.Fatalf("GetDocument after Close: %v", err)
	}
	if _, err := e.PutDocument(ctx, "catalog", lease.Document{Version: "v1"}, lease.AnyVersion); !errors.Is(err, lease.ErrUnavailable) {
		t.Fatalf("PutDocument after Close: %v", err)
	}
}

func TestDocumentScriptDeclaresItsKeysAndArguments(t *testing.T) {
	header, _, _ := strings.Cut(documentLua, "\nlocal ")
	if !strings.HasPrefix(header, "-- document.lua: ") {
		t.Fatalf("document.lua does not start with a header naming it: %q", strings.SplitN(documentLua, "\n", 2)[0])
	}
	for _, want := range []string{"-- KEYS[1]", "-- ARGV[1]", "-- ARGV[2]", "-- ARGV[3]"} {
		if !strings.Contains(header, want) {
			t.Errorf("the header of document.lua does not name %s", want)
		}
	}
	if strings.Contains(documentLua, "KEYS[2]") || strings.Contains(documentLua, "ARGV[4]") || strings.Contains(documentLua, "tostring") {
		t.Error("document.lua uses an undeclared key or argument, or tostring")
	}
}
