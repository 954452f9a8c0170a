package catalog

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
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

// stallingDocs is a store whose reads are slow: each StatDocument reads the store, waits for gate
// (nil: none) and answers what it read; or, when stall is set, waits that long and fails with an
// unavailable error, as a store that does not answer within its timeout.
type stallingDocs struct {
	*leasemem.DocumentStore
	stall   time.Duration
	gate    chan struct{}
	entered chan struct{} // receives once per StatDocument begun, when not nil
	calls   atomic.Int64  // the StatDocuments begun
}

func (d *stallingDocs) StatDocument(ctx context.Context, name string) (lease.Document, error) {
	d.calls.Add(1)
	if d.stall > 0 {
		time.Sleep(d.stall)
		return lease.Document{}, &lease.UnavailableError{Op: "stat document", Err: context.DeadlineExceeded}
	}
	doc, err := d.DocumentStore.StatDocument(ctx, name)
	if d.entered != nil {
		d.entered <- struct{}{}
	}
	if d.gate != nil {
		<-d.gate
	}
	return doc, err
}

// A store that does not answer costs each waiting request one store timeout, not one per request
// that came before it: the requests of a burst share one read.
func TestRequestsShareOneReadOfAStoreThatDoesNotAnswer(t *testing.T) {
	docs := &stallingDocs{DocumentStore: leasemem.NewDocumentStore(nil), stall: time.Second}
	s := newTestSource(t, docs, nil, time.Second)
	const callers = 30
	errs := make(chan error, callers)
	for range callers {
		go func() {
			_, err := s.Current(context.Background())
			errs <- err
		}()
	}
	for range callers {
		if err := <-errs; !errors.Is(err, lease.ErrUnavailable) {
			t.Fatalf("a request during the stall: %v, want the store's unavailable error", err)
		}
	}
	// The callers all begin within the first read's second: they share it (a second read only for
	// those that came after it ended), where each used to make its own, one after another.
	if n := docs.calls.Load(); n > 2 {
		t.Fatalf("%d requests made %d reads of the store, one after another; want them to share one", callers, n)
	}
}

// A read of the store that began before a Put does not bring back the catalog the Put replaced.
func TestAReadThatBeganBeforeAPutDoesNotUndoIt(t *testing.T) {
	docs := &stallingDocs{DocumentStore: leasemem.NewDocumentStore(nil), gate: make(chan struct{}), entered: make(chan struct{}, 1)}
	s := newTestSource(t, docs, mustNew(t, `{"tools":[]}`), time.Second)
	read := make(chan State, 1)
	go func() {
		st, err := s.Current(context.Background())
		if err != nil {
			t.Error(err)
		}
		read <- st
	}()
	<-docs.entered // the read waits at the gate, having seen no catalog stored
	put := mustNew(t, `{"tools":[{"name":"save","description":"Save."}]}`)
	if _, err := s.Put(context.Background(), put, State{}); err != nil {
		t.Fatal(err)
	}
	close(docs.gate)
	if st := <-read; st.Catalog.Version != put.Version {
		t.Fatalf("the read that began before the Put answered %s, want the Put's %s", st.Catalog.Version, put.Version)
	}
	s.mu.Lock()
	served := s.cur.Catalog.Version
	s.mu.Unlock()
	if served != put.Version {
		t.Fatalf("after the read, the source serves %s, want the Put's %s", served, put.Version)
	}
}
