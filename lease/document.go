package lease

import (
	"errors"
	"fmt"
	"time"
)

// Documents are small named blobs that every tablease instance sharing a store reads the same
// (the stored tool catalog is one). Engines keep them next to the leases; a write is a
// compare-and-set on the version, atomic in the store. leasetest.DocumentStore states the
// contract.

// MaxDocumentSize bounds the data of a document (1 MiB).
const MaxDocumentSize = 1 << 20

// Values of the ifVersion argument of a document store's PutDocument (leasetest.DocumentStore) besides a version. A version is an
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

// ValidateDocumentName checks the name of a document: an identifier (see ValidateID).
func ValidateDocumentName(name string) error { return ValidateID("document name", name) }

// ValidatePut checks the arguments of a document store's PutDocument, as every store does before it
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
