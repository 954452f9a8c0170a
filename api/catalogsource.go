package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/owner/catalog"
)

// CatalogDocument is the name of the document that holds the catalog an admin stored (see
// lease.DocumentStore).
const CatalogDocument = "catalog"

// DefaultCatalogMaxAge is how long an instance serves the catalog it read from the store before
// it reads it again (Options.CatalogMaxAge).
const DefaultCatalogMaxAge = 2 * time.Second

// catalogPollTimeout bounds one background read of the store by the catalog poller.
const catalogPollTimeout = 5 * time.Second

// # Which catalog is served
//
// The stored catalog wins: once the store holds the document CatalogDocument (an admin PUT, or the
// seed below), every instance serves it, whatever its TABLEASE_CATALOG_FILE says. SeedCatalog,
// called at start, stores the file's catalog when the store holds none (the first instance to
// start wins; the others find it there). While the store holds none — before the seed, or after
// the store lost its data — an instance serves its own file's catalog (Options.Catalog), and an
// empty catalog when it has no file.
//
// Every instance re-reads the store when what it has is older than CatalogMaxAge (a read of the
// version only, and of the data when the version changed), so all instances serve the same version
// within CatalogMaxAge of a PUT; the instance that took the PUT serves it at once.

// catalogState is the catalog an instance serves.
type catalogState struct {
	cat *catalog.Catalog
	// docVersion is the version of the stored document cat was read from; empty when the store
	// holds no catalog (cat is then the file's, or empty).
	docVersion string
	updatedAt  time.Time // of the stored document; zero when not stored
}

// catalogSource keeps the catalog served, read from the store at most once per maxAge, parsed
// once per version, and tells watchers when its version changes.
type catalogSource struct {
	docs    lease.DocumentStore
	file    *catalog.Catalog // Options.Catalog, or an empty catalog
	hasFile bool
	maxAge  time.Duration
	now     func() time.Time
	log     *slog.Logger

	// reading serializes the reads of the store, so that a burst of requests after maxAge makes
	// one read; it is taken before mu, never while holding mu.
	reading sync.Mutex

	mu      sync.Mutex // protects the fields below
	cur     catalogState
	loaded  bool      // cur has been read from the store (or set by a PUT) at least once
	readAt  time.Time // when cur was last confirmed against the store (by now)
	watches map[uint64]func(version string)
	nextID  uint64
	polling chan struct{} // closed to stop the poller; nil when it is not running
	closed  bool
}

func newCatalogSource(docs lease.DocumentStore, file *catalog.Catalog, maxAge time.Duration, now func() time.Time, log *slog.Logger) (*catalogSource, error) {
	s := &catalogSource{docs: docs, file: file, hasFile: file != nil, maxAge: maxAge, now: now, log: log, watches: make(map[uint64]func(string))}
	if s.file == nil {
		empty, err := catalog.New(nil)
		if err != nil {
			return nil, err
		}
		s.file = empty
	}
	s.cur = catalogState{cat: s.file}
	return s, nil
}

// current is the catalog to serve now: the cached one while younger than maxAge, else what the
// store holds.
func (s *catalogSource) current(ctx context.Context) (catalogState, error) {
	s.mu.Lock()
	if s.loaded && s.now().Sub(s.readAt) < s.maxAge {
		st := s.cur
		s.mu.Unlock()
		return st, nil
	}
	s.mu.Unlock()
	return s.refresh(ctx, false)
}

// fresh reads the store now, whatever the cache's age: for writes, which compare against it.
func (s *catalogSource) fresh(ctx context.Context) (catalogState, error) {
	return s.refresh(ctx, true)
}

func (s *catalogSource) refresh(ctx context.Context, force bool) (catalogState, error) {
	s.reading.Lock()
	defer s.reading.Unlock()
	s.mu.Lock()
	if !force && s.loaded && s.now().Sub(s.readAt) < s.maxAge { // another caller just read it
		st := s.cur
		s.mu.Unlock()
		return st, nil
	}
	cached := s.cur
	s.mu.Unlock()

	meta, err := s.docs.StatDocument(ctx, CatalogDocument)
	var next catalogState
	switch {
	case errors.Is(err, lease.ErrNoDocument):
		next = catalogState{cat: s.file}
	case err != nil:
		return catalogState{}, err
	case meta.Version == cached.docVersion:
		next = cached
		next.updatedAt = meta.UpdatedAt
	default:
		doc, err := s.docs.GetDocument(ctx, CatalogDocument)
		switch {
		case errors.Is(err, lease.ErrNoDocument):
			next = catalogState{cat: s.file}
		case err != nil:
			return catalogState{}, err
		default:
			cat, err := catalog.Parse(doc.Data)
			if err != nil {
				// Written by something other than a PUT, which validates: refuse to guess.
				return catalogState{}, &Error{Code: CodeInternal, Message: "internal error",
					Err: fmt.Errorf("the stored catalog (version %q) is not valid: %w", doc.Version, err)}
			}
			next = catalogState{cat: cat, docVersion: doc.Version, updatedAt: doc.UpdatedAt}
		}
	}
	s.set(next)
	return next, nil
}

// set makes st the catalog served, confirmed now, and tells the watchers when its version
// changed. Watchers are called after mu is released, in the caller's goroutine.
func (s *catalogSource) set(st catalogState) {
	s.mu.Lock()
	changed := s.loaded && st.cat.Version != s.cur.cat.Version
	s.cur, s.loaded, s.readAt = st, true, s.now()
	var notify []func(string)
	if changed {
		for _, fn := range s.watches {
			notify = append(notify, fn)
		}
	}
	s.mu.Unlock()
	for _, fn := range notify {
		fn(st.cat.Version)
	}
}

// put stores cat if the stored catalog is still the one of base (its docVersion, or none), and
// serves it at once.
func (s *catalogSource) put(ctx context.Context, cat *catalog.Catalog, base catalogState) (catalogState, error) {
	data, err := json.Marshal(cat)
	if err != nil {
		return catalogState{}, err
	}
	if len(data) > lease.MaxDocumentSize {
		return catalogState{}, &Error{Code: CodePayloadTooLarge,
			Message: fmt.Sprintf("the catalog is larger than 1 MiB once normalized (%d bytes)", len(data))}
	}
	ifVersion := base.docVersion
	if ifVersion == "" {
		ifVersion = lease.IfAbsent
	}
	doc, err := s.docs.PutDocument(ctx, CatalogDocument, lease.Document{Version: cat.Version, Data: data}, ifVersion)
	if err != nil {
		return catalogState{}, err
	}
	st := catalogState{cat: cat, docVersion: doc.Version, updatedAt: doc.UpdatedAt}
	s.set(st)
	return st, nil
}

// seed stores the file's catalog when the store holds none, and reports what is served.
func (s *catalogSource) seed(ctx context.Context) (CatalogStatus, error) {
	status := CatalogStatus{}
	if s.hasFile {
		status.FileVersion = s.file.Version
		data, err := json.Marshal(s.file)
		if err != nil {
			return status, err
		}
		_, err = s.docs.PutDocument(ctx, CatalogDocument, lease.Document{Version: s.file.Version, Data: data}, lease.IfAbsent)
		switch {
		case err == nil:
			status.Seeded = true
		case errors.Is(err, lease.ErrVersionMismatch): // one is stored already: it wins
		default:
			return status, err
		}
	}
	st, err := s.fresh(ctx)
	if err != nil {
		return status, err
	}
	status.Version, status.UpdatedAt = st.cat.Version, st.updatedAt
	switch {
	case st.docVersion != "":
		status.Source = CatalogFromStore
	case s.hasFile:
		status.Source = CatalogFromFile
	default:
		status.Source = CatalogNone
	}
	return status, nil
}

// watch calls fn with the new version whenever the catalog this instance serves changes: at once
// for a PUT made on this instance, and within about maxAge for a change made through another
// instance (a poller reads the store every maxAge while anyone watches). fn must not block. The
// returned func stops the calls.
func (s *catalogSource) watch(fn func(version string)) (stop func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := s.nextID
	s.nextID++
	s.watches[id] = fn
	if s.polling == nil && !s.closed {
		s.polling = make(chan struct{})
		go s.poll(s.polling)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			delete(s.watches, id)
			if len(s.watches) == 0 && s.polling != nil {
				close(s.polling)
				s.polling = nil
			}
		})
	}
}

// poll reads the store every maxAge until stop is closed, so that watchers learn of changes made
// through other instances even when no request asks for the catalog.
func (s *catalogSource) poll(stop chan struct{}) {
	t := time.NewTicker(s.maxAge)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), catalogPollTimeout)
		if _, err := s.refresh(ctx, true); err != nil {
			s.log.Debug("reading the stored catalog", slog.String("error", err.Error()))
		}
		cancel()
	}
}

// close stops the poller; watchers are no longer called by it.
func (s *catalogSource) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.polling != nil {
		close(s.polling)
		s.polling = nil
	}
}

// Sources of the catalog a server serves (CatalogStatus.Source).
const (
	CatalogFromStore = "store" // the store's document: an admin PUT, or the seed of a file
	CatalogFromFile  = "file"  // the store holds none; Options.Catalog is served
	CatalogNone      = "none"  // neither: an empty catalog is served
)

// CatalogStatus says which catalog a server serves, for the log line at start.
type CatalogStatus struct {
	Version     string    // the version served
	Source      string    // CatalogFromStore, CatalogFromFile or CatalogNone
	FileVersion string    // the version of Options.Catalog; empty without one
	Seeded      bool      // this call stored Options.Catalog, because the store held none
	UpdatedAt   time.Time // when the stored catalog was written; zero unless Source is store
}

// SeedCatalog stores Options.Catalog as the catalog when the store holds none yet (the first
// instance to start wins, the stored catalog wins over every file afterwards), and answers which
// catalog the server serves. Call it at start; a store that does not answer is an error that can
// be logged and ignored: the server then serves its file's catalog until the store answers.
func (s *Server) SeedCatalog(ctx context.Context) (CatalogStatus, error) {
	return s.catalogs.seed(ctx)
}
