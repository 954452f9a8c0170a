package leasetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tablease/tablease/lease"
)

// DocumentStore keeps named, versioned documents in the lease store, so that every instance that
// shares the store reads the same version (the stored tool catalog, catalog.Source, is one).
// Implementations must pass RunDocuments. All methods are safe for concurrent use.
//
// Errors: a bad name, version, ifVersion or an oversized document is a *lease.InvalidError
// (lease.ErrInvalid); store trouble is a *lease.UnavailableError (lease.ErrUnavailable).
type DocumentStore interface {
	// GetDocument reads the current version of the document name, or fails with
	// lease.ErrNoDocument.
	GetDocument(ctx context.Context, name string) (lease.Document, error)
	// StatDocument reads the version and UpdatedAt of the document name without its data (a
	// cheap way to learn whether it changed), or fails with lease.ErrNoDocument.
	StatDocument(ctx context.Context, name string) (lease.Document, error)
	// PutDocument stores doc.Data as version doc.Version of the document name, if the current
	// version is ifVersion: a version, lease.IfAbsent (write only when the document does not
	// exist) or lease.AnyVersion. The comparison and the write are one atomic step in the store.
	// Otherwise it fails with *lease.VersionMismatchError (lease.ErrVersionMismatch) and changes
	// nothing. It answers the document as stored, with UpdatedAt from the store's clock.
	// doc.UpdatedAt is ignored.
	PutDocument(ctx context.Context, name string, doc lease.Document, ifVersion string) (lease.Document, error)
}

// DocumentFactory makes a DocumentStore on a store of its own that starts empty. Closing
// whatever it opened is the factory's job (t.Cleanup).
type DocumentFactory func(t *testing.T) DocumentStore

// RunDocuments is the conformance suite of DocumentStore. Engines run it from their tests:
//
//	func TestDocuments(t *testing.T) {
//		leasetest.RunDocuments(t, func(t *testing.T) leasetest.DocumentStore { … })
//	}
func RunDocuments(t *testing.T, newStore DocumentFactory) {
	for _, tc := range documentTests {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, newStore(t)) })
	}
}

var documentTests = []struct {
	name string
	run  func(t *testing.T, s DocumentStore)
}{
	{"a document that was never written is not found", testDocNotFound},
	{"a document is created only when absent and read back as written", testDocCreate},
	{"a write for the current version replaces the document", testDocReplace},
	{"a write for a stale version is refused with the current version and changes nothing", testDocStale},
	{"a write for any version replaces whatever is there", testDocAnyVersion},
	{"racing writes for the same version have exactly one winner", testDocRace},
	{"documents of different names are independent", testDocIndependent},
	{"the store's data is never shared with callers", testDocCopies},
	{"bad names, versions and oversized documents are refused and change nothing", testDocInvalid},
	{"the largest document is stored whole, binary data included", testDocLargest},
}

func testDocNotFound(t *testing.T, s DocumentStore) {
	ctx := t.Context()
	if _, err := s.GetDocument(ctx, "catalog"); !errors.Is(err, lease.ErrNoDocument) {
		t.Fatalf("GetDocument of a new store: %v, want ErrNoDocument", err)
	}
	if _, err := s.StatDocument(ctx, "catalog"); !errors.Is(err, lease.ErrNoDocument) {
		t.Fatalf("StatDocument of a new store: %v, want ErrNoDocument", err)
	}
}

func mustPut(t *testing.T, s DocumentStore, name, version, data, ifVersion string) lease.Document {
	t.Helper()
	d, err := s.PutDocument(t.Context(), name, lease.Document{Version: version, Data: []byte(data)}, ifVersion)
	if err != nil {
		t.Fatalf("PutDocument(%q, %q, if %q): %v", name, version, ifVersion, err)
	}
	if d.Version != version || string(d.Data) != data || d.UpdatedAt.IsZero() {
		t.Fatalf("PutDocument answered %q %q at %v, want %q %q and the store time", d.Version, d.Data, d.UpdatedAt, version, data)
	}
	return d
}

func mustGet(t *testing.T, s DocumentStore, name, version, data string) lease.Document {
	t.Helper()
	d, err := s.GetDocument(t.Context(), name)
	if err != nil {
		t.Fatalf("GetDocument(%q): %v", name, err)
	}
	if d.Version != version || string(d.Data) != data {
		t.Fatalf("GetDocument(%q) = %q %q, want %q %q", name, d.Version, d.Data, version, data)
	}
	st, err := s.StatDocument(t.Context(), name)
	if err != nil {
		t.Fatalf("StatDocument(%q): %v", name, err)
	}
	if st.Version != version || st.Data != nil || !st.UpdatedAt.Equal(d.UpdatedAt) {
		t.Fatalf("StatDocument(%q) = %q, %d bytes, %v; want %q, no data, %v", name, st.Version, len(st.Data), st.UpdatedAt, version, d.UpdatedAt)
	}
	return d
}

// wantMismatch checks that err is a *VersionMismatchError naming current.
func wantMismatch(t *testing.T, err error, current string) {
	t.Helper()
	var vm *lease.VersionMismatchError
	if !errors.Is(err, lease.ErrVersionMismatch) || !errors.As(err, &vm) {
		t.Fatalf("got %v, want a *VersionMismatchError", err)
	}
	if vm.Current != current {
		t.Fatalf("VersionMismatchError.Current = %q, want %q", vm.Current, current)
	}
}

func testDocCreate(t *testing.T, s DocumentStore) {
	before := time.Now()
	d := mustPut(t, s, "catalog", "v1", `{"tools":[]}`, lease.IfAbsent)
	// The store's clock, not the caller's; it must still be a sane, recent time in UTC.
	if d.UpdatedAt.Location() != time.UTC || d.UpdatedAt.Before(before.Add(-time.Hour)) || d.UpdatedAt.After(before.Add(time.Hour)) {
		t.Fatalf("UpdatedAt = %v, want the store time in UTC", d.UpdatedAt)
	}
	got := mustGet(t, s, "catalog", "v1", `{"tools":[]}`)
	if !got.UpdatedAt.Equal(d.UpdatedAt) {
		t.Fatalf("GetDocument UpdatedAt = %v, PutDocument answered %v", got.UpdatedAt, d.UpdatedAt)
	}
	_, err := s.PutDocument(t.Context(), "catalog", lease.Document{Version: "v2", Data: []byte("x")}, lease.IfAbsent)
	wantMismatch(t, err, "v1")
	mustGet(t, s, "catalog", "v1", `{"tools":[]}`)
}

func testDocReplace(t *testing.T, s DocumentStore) {
	first := mustPut(t, s, "catalog", "v1", "one", lease.IfAbsent)
	second := mustPut(t, s, "catalog", "v2", "two", "v1")
	if second.UpdatedAt.Before(first.UpdatedAt) {
		t.Fatalf("UpdatedAt went back: %v then %v", first.UpdatedAt, second.UpdatedAt)
	}
	mustGet(t, s, "catalog", "v2", "two")
	// Writing the same version again (the same content) is an ordinary write.
	mustPut(t, s, "catalog", "v2", "two", "v2")
	mustGet(t, s, "catalog", "v2", "two")
}

func testDocStale(t *testing.T, s DocumentStore) {
	mustPut(t, s, "catalog", "v1", "one", lease.IfAbsent)
	mustPut(t, s, "catalog", "v2", "two", "v1")
	_, err := s.PutDocument(t.Context(), "catalog", lease.Document{Version: "v3", Data: []byte("three")}, "v1")
	wantMismatch(t, err, "v2")
	mustGet(t, s, "catalog", "v2", "two")
	// A version for a document that does not exist is stale too: nothing is there.
	_, err = s.PutDocument(t.Context(), "other", lease.Document{Version: "v1", Data: []byte("x")}, "v1")
	wantMismatch(t, err, "")
	if _, err := s.GetDocument(t.Context(), "other"); !errors.Is(err, lease.ErrNoDocument) {
		t.Fatalf("a refused write created the document: %v", err)
	}
}

func testDocAnyVersion(t *testing.T, s DocumentStore) {
	mustPut(t, s, "catalog", "v1", "one", lease.AnyVersion)
	mustPut(t, s, "catalog", "v2", "two", lease.AnyVersion)
	mustGet(t, s, "catalog", "v2", "two")
}

func testDocRace(t *testing.T, s DocumentStore) {
	mustPut(t, s, "catalog", "v0", "zero", lease.IfAbsent)
	const writers = 16
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		wins   []string
		others []error
	)
	start := make(chan struct{})
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			v := fmt.Sprintf("v-%d", i)
			_, err := s.PutDocument(context.Background(), "catalog", lease.Document{Version: v, Data: []byte(v)}, "v0")
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				wins = append(wins, v)
			case !errors.Is(err, lease.ErrVersionMismatch):
				others = append(others, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(others) > 0 {
		t.Fatalf("unexpected errors: %v", others)
	}
	if len(wins) != 1 {
		t.Fatalf("%d writers won (%v), want exactly one", len(wins), wins)
	}
	mustGet(t, s, "catalog", wins[0], wins[0])
}

func testDocIndependent(t *testing.T, s DocumentStore) {
	mustPut(t, s, "catalog", "v1", "catalog one", lease.IfAbsent)
	mustPut(t, s, "catalog.next", "v1", "next one", lease.IfAbsent)
	mustPut(t, s, "catalog", "v2", "catalog two", "v1")
	mustGet(t, s, "catalog.next", "v1", "next one")
	mustGet(t, s, "catalog", "v2", "catalog two")
}

func testDocCopies(t *testing.T, s DocumentStore) {
	in := []byte("original")
	out, err := s.PutDocument(t.Context(), "catalog", lease.Document{Version: "v1", Data: in}, lease.IfAbsent)
	if err != nil {
		t.Fatal(err)
	}
	copy(in, "XXXXXXXX")
	copy(out.Data, "YYYYYYYY")
	got := mustGet(t, s, "catalog", "v1", "original")
	copy(got.Data, "ZZZZZZZZ")
	mustGet(t, s, "catalog", "v1", "original")
}

func testDocInvalid(t *testing.T, s DocumentStore) {
	ctx := t.Context()
	mustPut(t, s, "catalog", "v1", "one", lease.IfAbsent)
	doc := lease.Document{Version: "v2", Data: []byte("two")}
	for _, tc := range []struct {
		name      string
		docName   string
		doc       lease.Document
		ifVersion string
	}{
		{"an empty name", "", doc, "v1"},
		{"a name with a brace", "cat{x}", doc, "v1"},
		{"a name with a slash", "a/b", doc, "v1"},
		{"a name of 129 characters", strings.Repeat("n", 129), doc, "v1"},
		{"an empty version", "catalog", lease.Document{Data: []byte("x")}, "v1"},
		{"the version *", "catalog", lease.Document{Version: "*", Data: []byte("x")}, "v1"},
		{"a version with a space", "catalog", lease.Document{Version: "v 2", Data: []byte("x")}, "v1"},
		{"an ifVersion with a quote", "catalog", doc, `"v1"`},
		{"data over 1 MiB", "catalog", lease.Document{Version: "v2", Data: make([]byte, lease.MaxDocumentSize+1)}, "v1"},
	} {
		_, err := s.PutDocument(ctx, tc.docName, tc.doc, tc.ifVersion)
		if !errors.Is(err, lease.ErrInvalid) {
			t.Errorf("PutDocument with %s: %v, want ErrInvalid", tc.name, err)
		}
	}
	for _, name := range []string{"", "a/b", "..", "x y"} {
		if _, err := s.GetDocument(ctx, name); !errors.Is(err, lease.ErrInvalid) {
			t.Errorf("GetDocument(%q): %v, want ErrInvalid", name, err)
		}
		if _, err := s.StatDocument(ctx, name); !errors.Is(err, lease.ErrInvalid) {
			t.Errorf("StatDocument(%q): %v, want ErrInvalid", name, err)
		}
	}
	mustGet(t, s, "catalog", "v1", "one")
}

func testDocLargest(t *testing.T, s DocumentStore) {
	data := make([]byte, lease.MaxDocumentSize)
	for i := range data {
		data[i] = byte(i * 7)
	}
	if _, err := s.PutDocument(t.Context(), "catalog", lease.Document{Version: "big", Data: data}, lease.AnyVersion); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetDocument(t.Context(), "catalog")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Data, data) {
		t.Fatalf("read back %d bytes that differ from the %d written", len(got.Data), len(data))
	}
	// An empty document is a document too.
	mustPut(t, s, "empty", "v1", "", lease.IfAbsent)
	mustGet(t, s, "empty", "v1", "")
}
