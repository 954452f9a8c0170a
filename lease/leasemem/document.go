package leasemem

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/tablease/tablease/lease"
)

// DocumentStore is the in-memory document store (leasetest.DocumentStore), for one tablease instance (a store of its
// own beside the Engine: documents of one process are read by that process only). Each call is
// one critical section under mu, which reads the injected clock, compares and writes, so a
// compare-and-set cannot be split. Data is copied in and out: callers never share a buffer with
// the store. Use NewDocumentStore; the zero value is not usable.
type DocumentStore struct {
	now func() time.Time // immutable after NewDocumentStore

	mu   sync.Mutex                // protects docs
	docs map[string]lease.Document // by name
}

// NewDocumentStore returns an empty store whose clock is now (default time.Now). Times are
// truncated to whole microseconds, in UTC, like those of the Engine.
func NewDocumentStore(now func() time.Time) *DocumentStore {
	if now == nil {
		now = time.Now
	}
	return &DocumentStore{now: now, docs: make(map[string]lease.Document)}
}

// GetDocument implements leasetest.DocumentStore.
func (s *DocumentStore) GetDocument(ctx context.Context, name string) (lease.Document, error) {
	return s.read(ctx, "get document", name, true)
}

// StatDocument implements leasetest.DocumentStore.
func (s *DocumentStore) StatDocument(ctx context.Context, name string) (lease.Document, error) {
	return s.read(ctx, "stat document", name, false)
}

func (s *DocumentStore) read(ctx context.Context, op, name string, withData bool) (lease.Document, error) {
	if err := lease.ValidateDocumentName(name); err != nil {
		return lease.Document{}, err
	}
	if err := ctx.Err(); err != nil {
		return lease.Document{}, &lease.UnavailableError{Op: op, Err: err}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.docs[name]
	if !ok {
		return lease.Document{}, lease.ErrNoDocument
	}
	if withData {
		d.Data = slices.Clone(d.Data)
		if d.Data == nil {
			d.Data = []byte{}
		}
	} else {
		d.Data = nil
	}
	return d, nil
}

// PutDocument implements leasetest.DocumentStore.
func (s *DocumentStore) PutDocument(ctx context.Context, name string, doc lease.Document, ifVersion string) (lease.Document, error) {
	if err := lease.ValidatePut(name, doc, ifVersion); err != nil {
		return lease.Document{}, err
	}
	if err := ctx.Err(); err != nil {
		return lease.Document{}, &lease.UnavailableError{Op: "put document", Err: err}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, exists := s.docs[name]
	switch {
	case ifVersion == lease.AnyVersion:
	case ifVersion == lease.IfAbsent && !exists:
	case exists && cur.Version == ifVersion:
	default:
		return lease.Document{}, &lease.VersionMismatchError{Name: name, Current: cur.Version}
	}
	stored := lease.Document{
		Version:   doc.Version,
		Data:      slices.Clone(doc.Data),
		UpdatedAt: s.now().Truncate(time.Microsecond).UTC(),
	}
	if stored.Data == nil {
		stored.Data = []byte{}
	}
	s.docs[name] = stored
	stored.Data = slices.Clone(stored.Data)
	return stored, nil
}
