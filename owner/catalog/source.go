package catalog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/tablease/tablease/lease"
)

// DocumentName is the name of the document that holds the catalog an admin stored.
const DocumentName = "catalog"

// DefaultMaxAge is how long an instance serves the catalog it read from the store before it
// reads it again.
const DefaultMaxAge = 2 * time.Second

// pollTimeout bounds one background read of the store by the poller.
const pollTimeout = 5 * time.Second

// Documents is where the stored catalog lives: the lease store's named, versioned documents,
// which every instance sharing the store reads the same. The Redis engine is one;
// leasemem.DocumentStore suits one instance only. leasetest.DocumentStore states the contract.
type Documents interface {
	GetDocument(ctx context.Context, name string) (lease.Document, error)
	StatDocument(ctx context.Context, name string) (lease.Document, error)
	PutDocument(ctx context.Context, name string, doc lease.Document, ifVersion string) (lease.Document, error)
}

// Errors of a Source besides the store's own.
var (
	// ErrTooLarge: a catalog is larger than lease.MaxDocumentSize (1 MiB) once normalized.
	ErrTooLarge = errors.New("catalog: larger than 1 MiB once normalized")
	// ErrStoredInvalid: the stored catalog does not parse. Only a write that bypassed Put can do
	// that; the Source refuses to guess and serves nothing until the store holds a valid one.
	ErrStoredInvalid = errors.New("catalog: the stored catalog is not valid")
)

// State is the catalog an instance serves.
type State struct {
	Catalog *Catalog
	// DocVersion is the version of the stored document Catalog was read from; empty when the
	// store holds no catalog (Catalog is then the file's, or empty).
	DocVersion string
	UpdatedAt  time.Time // of the stored document; zero when not stored
}

// Source is the catalog an instance serves. The stored catalog wins: once the store holds the
// document DocumentName (an admin's Put, or Seed), every instance serves it, whatever its own
// file says. Seed, called at start (and again until the store answers), stores the file's catalog
// when the store holds none (the first instance to start wins). While the store holds none —
// before the seed, or after the store lost its data — an instance serves its file's catalog, or an
// empty one without a file.
//
// A Source re-reads the store when what it has is older than maxAge (a read of the version only,
// and of the data when the version changed), so all instances serve the same version within
// maxAge of a Put; the instance that took the Put serves it at once. It parses each version once
// and tells watchers when the version changes. Its methods are safe for concurrent use.
type Source struct {
	docs    Documents
	file    *Catalog // the configuration's catalog, or an empty catalog
	hasFile bool
	maxAge  time.Duration
	now     func() time.Time
	log     *slog.Logger

	mu sync.Mutex // protects the fields below
	// reading is the read of the store in progress, nil when none: the callers that need one
	// meanwhile share it, so that a burst of requests after maxAge makes one read, and a store
	// that does not answer holds each of them one store timeout, not one per caller before it.
	reading *read
	cur     State
	loaded  bool      // cur has been read from the store (or set by a PUT) at least once
	readAt  time.Time // when cur was last confirmed against the store (by now)
	watches map[uint64]func(version string)
	nextID  uint64
	polling chan struct{} // closed to stop the poller; nil when it is not running
	closed  bool
}

// NewSource makes the Source of an instance whose configuration holds file (nil: none), reading
// docs at most once per maxAge by the clock now. The poller's failures go to log at debug level.
func NewSource(docs Documents, file *Catalog, maxAge time.Duration, now func() time.Time, log *slog.Logger) (*Source, error) {
	s := &Source{docs: docs, file: file, hasFile: file != nil, maxAge: maxAge, now: now, log: log, watches: make(map[uint64]func(string))}
	if s.file == nil {
		empty, err := New(nil)
		if err != nil {
			return nil, err
		}
		s.file = empty
	}
	s.cur = State{Catalog: s.file}
	return s, nil
}

// Current is the catalog to serve now: the cached one while younger than maxAge, else what the
// store holds.
func (s *Source) Current(ctx context.Context) (State, error) {
	s.mu.Lock()
	if s.loaded && s.now().Sub(s.readAt) < s.maxAge {
		st := s.cur
		s.mu.Unlock()
		return st, nil
	}
	s.mu.Unlock()
	return s.refresh(ctx, false)
}

// Served is the version of the catalog this instance serves, without reading the store: what the
// last read (or Put) gave, kept within maxAge of the store by the poller while anyone watches.
// ok is false until the store has been read once.
func (s *Source) Served() (version string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur.Catalog.Version, s.loaded
}

// Fresh reads the store now, whatever the cache's age: for writes, which compare against it.
func (s *Source) Fresh(ctx context.Context) (State, error) {
	return s.refresh(ctx, true)
}

// read is one read of the store, which every caller that needs it waits for; st and err are set
// before done is closed.
type read struct {
	done  chan struct{}
	stale bool // a Put was served while it read, so what it read is older (protected by Source.mu)
	st    State
	err   error
}

// refresh answers the catalog as the store holds it: the cached one when another caller
// confirmed it within maxAge (unless force), else the result of the read in progress, which it
// starts when there is none. A forced caller may get a read that began just before its call: the
// writes it serves are conditional on the version it read, so an older one only makes them fail.
// Each caller waits at most until ctx ends; the read goes on without it.
func (s *Source) refresh(ctx context.Context, force bool) (State, error) {
	s.mu.Lock()
	if !force && s.loaded && s.now().Sub(s.readAt) < s.maxAge { // another caller just read it
		st := s.cur
		s.mu.Unlock()
		return st, nil
	}
	r := s.reading
	if r == nil {
		r = &read{done: make(chan struct{})}
		s.reading = r
		cached := s.cur
		// The read is shared: no one caller's end may cut it short. The store bounds it.
		go s.readStore(context.WithoutCancel(ctx), r, cached)
	}
	s.mu.Unlock()
	select {
	case <-r.done:
		return r.st, r.err
	case <-ctx.Done():
		return State{}, ctx.Err()
	}
}

// readStore makes the read r, starting from the catalog cached, serves what it read (unless a
// Put was served meanwhile, which is newer: its catalog is the answer), and hands the result to
// the callers waiting for r.
func (s *Source) readStore(ctx context.Context, r *read, cached State) {
	st, err := s.load(ctx, cached)
	var tell []func(string)
	s.mu.Lock()
	s.reading = nil
	switch {
	case err != nil:
	case r.stale:
		st = s.cur
	default:
		tell = s.serve(st)
	}
	s.mu.Unlock()
	for _, fn := range tell {
		fn(st.Catalog.Version)
	}
	r.st, r.err = st, err
	close(r.done)
}

// load reads what the store holds: the version only when it is that of cached, else the
// document, parsed.
func (s *Source) load(ctx context.Context, cached State) (State, error) {
	meta, err := s.docs.StatDocument(ctx, DocumentName)
	switch {
	case errors.Is(err, lease.ErrNoDocument):
		return State{Catalog: s.file}, nil
	case err != nil:
		return State{}, err
	case meta.Version == cached.DocVersion:
		next := cached
		next.UpdatedAt = meta.UpdatedAt
		return next, nil
	}
	doc, err := s.docs.GetDocument(ctx, DocumentName)
	switch {
	case errors.Is(err, lease.ErrNoDocument):
		return State{Catalog: s.file}, nil
	case err != nil:
		return State{}, err
	}
	cat, err := Parse(doc.Data)
	if err != nil {
		return State{}, fmt.Errorf("%w (version %q): %w", ErrStoredInvalid, doc.Version, err)
	}
	return State{Catalog: cat, DocVersion: doc.Version, UpdatedAt: doc.UpdatedAt}, nil
}

// serve makes st the catalog served, confirmed now, and answers the watchers to tell when its
// version changed; the caller calls them after it released mu, in its goroutine. s.mu must be
// held.
func (s *Source) serve(st State) (tell []func(string)) {
	changed := s.loaded && st.Catalog.Version != s.cur.Catalog.Version
	s.cur, s.loaded, s.readAt = st, true, s.now()
	if changed {
		for _, fn := range s.watches {
			tell = append(tell, fn)
		}
	}
	return tell
}

// Put stores cat if the stored catalog is still the one of base (its DocVersion, or none), and
// serves it at once. A store that holds another version by now fails with
// *lease.VersionMismatchError; a catalog too large to store, with ErrTooLarge.
func (s *Source) Put(ctx context.Context, cat *Catalog, base State) (State, error) {
	data, err := json.Marshal(cat)
	if err != nil {
		return State{}, err
	}
	if len(data) > lease.MaxDocumentSize {
		return State{}, fmt.Errorf("%w (%d bytes)", ErrTooLarge, len(data))
	}
	ifVersion := base.DocVersion
	if ifVersion == "" {
		ifVersion = lease.IfAbsent
	}
	doc, err := s.docs.PutDocument(ctx, DocumentName, lease.Document{Version: cat.Version, Data: data}, ifVersion)
	if err != nil {
		return State{}, err
	}
	st := State{Catalog: cat, DocVersion: doc.Version, UpdatedAt: doc.UpdatedAt}
	s.mu.Lock()
	if s.reading != nil {
		s.reading.stale = true // it began before this Put: it must not bring the older catalog back
	}
	tell := s.serve(st)
	s.mu.Unlock()
	for _, fn := range tell {
		fn(st.Catalog.Version)
	}
	return st, nil
}

// Seed stores the file's catalog when the store holds none yet (the first instance to start
// wins; the stored catalog wins over every file afterwards), and reports which catalog is served.
// Call it at start, and again while it fails because the store does not answer: the file's
// catalog is served meanwhile, but only Seed stores it, so that every instance serves it.
func (s *Source) Seed(ctx context.Context) (Status, error) {
	status := Status{}
	if s.hasFile {
		status.FileVersion = s.file.Version
		data, err := json.Marshal(s.file)
		if err != nil {
			return status, err
		}
		_, err = s.docs.PutDocument(ctx, DocumentName, lease.Document{Version: s.file.Version, Data: data}, lease.IfAbsent)
		switch {
		case err == nil:
			status.Seeded = true
		case errors.Is(err, lease.ErrVersionMismatch): // one is stored already: it wins
		default:
			return status, err
		}
	}
	st, err := s.Fresh(ctx)
	if err != nil {
		return status, err
	}
	status.Version, status.UpdatedAt = st.Catalog.Version, st.UpdatedAt
	switch {
	case st.DocVersion != "":
		status.Source = FromStore
	case s.hasFile:
		status.Source = FromFile
	default:
		status.Source = FromNone
	}
	return status, nil
}

// Watch calls fn with the new version whenever the catalog this instance serves changes: at once
// for a PUT made on this instance, and within about maxAge for a change made through another
// instance (a poller reads the store every maxAge while anyone watches). fn must not block. The
// returned func stops the calls.
func (s *Source) Watch(fn func(version string)) (stop func()) {
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
func (s *Source) poll(stop chan struct{}) {
	t := time.NewTicker(s.maxAge)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), pollTimeout)
		if _, err := s.refresh(ctx, true); err != nil {
			s.log.Debug("reading the stored catalog", slog.String("error", err.Error()))
		}
		cancel()
	}
}

// Close stops the poller; watchers are no longer called by it.
func (s *Source) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.polling != nil {
		close(s.polling)
		s.polling = nil
	}
}

// Where the catalog served comes from (Status.Source).
const (
	FromStore = "store" // the store's document: an admin's Put, or the seed of a file
	FromFile  = "file"  // the store holds none; the configuration's file is served
	FromNone  = "none"  // neither: an empty catalog is served
)

// Status says which catalog an instance serves, for the log line at start.
type Status struct {
	Version     string    // the version served
	Source      string    // FromStore, FromFile or FromNone
	FileVersion string    // the version of the file's catalog; empty without one
	Seeded      bool      // this call stored the file's catalog, because the store held none
	UpdatedAt   time.Time // when the stored catalog was written; zero unless Source is FromStore
}
