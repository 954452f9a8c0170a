package catalog

import (
	"errors"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/lease/leasemem"
)

func newTestSource(t *testing.T, docs Documents, file *Catalog, maxAge time.Duration) *Source {
	t.Helper()
	s, err := NewSource(docs, file, maxAge, time.Now, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func mustNew(t *testing.T, data string) *Catalog {
	t.Helper()
	c, err := Parse([]byte(data))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestThePollerRunsOnlyWhileSomeoneWatches(t *testing.T) {
	s := newTestSource(t, leasemem.NewDocumentStore(nil), nil, 10*time.Millisecond)
	polling := func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.polling != nil
	}
	if polling() {
		t.Fatal("the poller runs before anyone watches")
	}
	stop1 := s.Watch(func(string) {})
	stop2 := s.Watch(func(string) {})
	if !polling() {
		t.Fatal("the poller does not run while two watch")
	}
	stop1()
	stop1() // stopping twice is harmless
	if !polling() {
		t.Fatal("the poller stopped while one still watches")
	}
	stop2()
	if polling() {
		t.Fatal("the poller still runs after the last watcher stopped")
	}
}

func TestASourceRefusesACatalogTooLargeToStore(t *testing.T) {
	s := newTestSource(t, leasemem.NewDocumentStore(nil), nil, time.Second)
	base, err := s.Fresh(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// Every tool is valid; together they are more than 1 MiB once normalized.
	tools := make([]string, 800)
	for i := range tools {
		tools[i] = `{"name":"t` + strconv.Itoa(i) + `","description":"` + strings.Repeat("x", 1400) + `"}`
	}
	cat := mustNew(t, `{"tools":[`+strings.Join(tools, ",")+`]}`)
	if _, err := s.Put(t.Context(), cat, base); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Put of a catalog over 1 MiB: %v, want ErrTooLarge", err)
	}
	if _, err := s.docs.GetDocument(t.Context(), DocumentName); !errors.Is(err, lease.ErrNoDocument) {
		t.Fatalf("the refused catalog was stored: %v", err)
	}
}

func TestAStoredCatalogThatDoesNotParseIsAnErrorNotAGuess(t *testing.T) {
	docs := leasemem.NewDocumentStore(nil)
	if _, err := docs.PutDocument(t.Context(), DocumentName, lease.Document{Version: "v-bad", Data: []byte(`{"tools":[{"name":"x"}]}`)}, lease.IfAbsent); err != nil {
		t.Fatal(err)
	}
	s := newTestSource(t, docs, mustNew(t, `{"tools":[]}`), time.Second)
	if _, err := s.Current(t.Context()); !errors.Is(err, ErrStoredInvalid) {
		t.Fatalf("Current with an invalid stored catalog: %v, want ErrStoredInvalid", err)
	}
}
