package lease

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// # Documents
//
// A document is a small named blob that every tablease instance sharing a store reads the same:
// the tool catalog an admin replaced at run time is one. Engines store documents next to the
// leases (a hash per document in Redis, a map in memory); writes are compare-and-set on the
// version, atomic in the store, so that two admins replacing a document at once cannot both win.

// MaxDocumentSize bounds the data of a document (1 MiB).
const MaxDocumentSize = 1 << 20

// Values of the ifVersion argument of DocumentStore.PutDocument besides a version. A version is an
// identifier (ValidateID), so it can be neither of them.
const (
	// IfAbsent writes only when the document does not exist yet.
	IfAbsent = ""
	// AnyVersion writes whatever the current version, and whether or not the document exists.
	AnyVersion = "*"
)

// Document is one version of a named document.
type Document struct {
	// Version names this content. The writer chooses it (the catalog uses a hash of its content);
	// it is an identifier (see ValidateID).
	Version string
	// Data is the content, at most MaxDocumentSize bytes. StatDocument leaves it nil.
	Data []byte
	// UpdatedAt is the store time of the write that stored this version; the store sets it.
	UpdatedAt time.Time
}

// Sentinel errors of document stores.
var (
	// ErrNoDocument: no document has that name.
	ErrNoDocument = errors.New("lease: no such document")
	// ErrVersionMismatch: the document's current version is not the one the write was made for.
	ErrVersionMismatch = errors.New("lease: document version mismatch")
)

// VersionMismatchError says what the version of a document is now, for a write that expected
// another one.
type VersionMismatchError struct {
	Name string
	// Current is the version stored now; empty when the document does not exist.
	Current string
}

func (e *VersionMismatchError) Error() string {
	if e.Current == "" {
		return fmt.Sprintf("lease: document %q does not exist", e.Name)
	}
	return fmt.Sprintf("lease: document %q is at version %q", e.Name, e.Current)
}

// Is makes errors.Is(err, ErrVersionMismatch) true.
func (e *VersionMismatchError) Is(target error) bool { return target == ErrVersionMismatch }

// DocumentStore keeps named, versioned documents in the lease store, so that every instance that
// shares the store reads the same version. Implementations must pass leasetest.RunDocuments. All
// methods are safe for concurrent use.
//
// Errors: a bad name, version, ifVersion or an oversized document is an *InvalidError
// (ErrInvalid); store trouble is an *UnavailableError (ErrUnavailable).
type DocumentStore interface {
	// GetDocument reads the current version of the document name, or fails with ErrNoDocument.
	GetDocument(ctx context.Context, name string) (Document, error)
	// StatDocument reads the version and UpdatedAt of the document name without its data (a
	// cheap way to learn whether it changed), or fails with ErrNoDocument.
	StatDocument(ctx context.Context, name string) (Document, error)
	// PutDocument stores doc.Data as version doc.Version of the document name, if the current
	// version is ifVersion: a version, IfAbsent (write only when the document does not exist) or
	// AnyVersion. The comparison and the write are one atomic step in the store. Otherwise it fails
	// with *VersionMismatchError (ErrVersionMismatch) and changes nothing. It answers the document
	// as stored, with UpdatedAt from the store's clock. doc.UpdatedAt is ignored.
	PutDocument(ctx context.Context, name string, doc Document, ifVersion string) (Document, error)
}

// ValidateDocumentName checks the name of a document: an identifier (see ValidateID).
func ValidateDocumentName(name string) error { return ValidateID("document name", name) }

// ValidatePut checks the arguments of DocumentStore.PutDocument, as every store does before it
// touches anything.
func ValidatePut(name string, doc Document, ifVersion string) error {
	if err := ValidateDocumentName(name); err != nil {
		return err
	}
	if err := ValidateID("document version", doc.Version); err != nil {
		return err
	}
	if len(doc.Data) > MaxDocumentSize {
		return &InvalidError{Field: "document", Reason: fmt.Sprintf("must be at most %d bytes (1 MiB); it has %d", MaxDocumentSize, len(doc.Data))}
	}
	if ifVersion != IfAbsent && ifVersion != AnyVersion {
		if err := ValidateID("ifVersion", ifVersion); err != nil {
			return err
		}
	}
	return nil
}
