package leaseredis

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/tablease/tablease/lease"
)

// Documents (leasetest.DocumentStore). Each document is one hash that never expires:
//
//	<prefix>:doc:<name>    fields version, data, updated_us (store clock, µs)
//
// The name is a validated identifier, so it holds no braces and the key has no hash tag: on a
// Cluster each document is a key of its own on its own slot, which is all a document needs (every
// operation touches one key). Reads are one HMGET; a write is document.lua, which compares the
// version and writes in one step with the time from redis.call('TIME').

var (
	//go:embed document.lua
	documentLua    string
	documentScript = redis.NewScript(documentLua)
)

// Statuses of document.lua.
const (
	docStatusOK       = "OK"
	docStatusMismatch = "MISMATCH"
)

// documentKey is the key of the document name, which must be valid.
func (e *Engine) documentKey(name string) string { return e.prefix + ":doc:" + name }

// GetDocument implements leasetest.DocumentStore.
func (e *Engine) GetDocument(ctx context.Context, name string) (lease.Document, error) {
	return e.readDocument(ctx, "get document", name, true)
}

// StatDocument implements leasetest.DocumentStore. It does not transfer the data.
func (e *Engine) StatDocument(ctx context.Context, name string) (lease.Document, error) {
	return e.readDocument(ctx, "stat document", name, false)
}

func (e *Engine) readDocument(ctx context.Context, op, name string, withData bool) (lease.Document, error) {
	if err := lease.ValidateDocumentName(name); err != nil {
		return lease.Document{}, err
	}
	if e.closed.Load() {
		return lease.Document{}, &lease.UnavailableError{Op: op, Err: ErrClosed}
	}
	ctx, cancel := context.WithTimeout(ctx, e.opTimeout)
	defer cancel()
	fields := []string{"version", "updated_us"}
	if withData {
		fields = append(fields, "data")
	}
	v, err := e.client.HMGet(ctx, e.documentKey(name), fields...).Result()
	if err != nil {
		return lease.Document{}, &lease.UnavailableError{Op: op, Err: err}
	}
	if len(v) != len(fields) || v[0] == nil {
		return lease.Document{}, lease.ErrNoDocument
	}
	version, ok1 := v[0].(string)
	updated, ok2 := v[1].(string)
	us, err := strconv.ParseInt(updated, 10, 64)
	if !ok1 || !ok2 || err != nil || us <= 0 {
		return lease.Document{}, &lease.UnavailableError{Op: op, Err: fmt.Errorf("leaseredis: malformed document %q", name)}
	}
	doc := lease.Document{Version: version, UpdatedAt: micros(us)}
	if withData {
		data, ok := v[2].(string)
		if !ok {
			return lease.Document{}, &lease.UnavailableError{Op: op, Err: fmt.Errorf("leaseredis: document %q has no data", name)}
		}
		doc.Data = []byte(data)
	}
	return doc, nil
}

// PutDocument implements leasetest.DocumentStore with document.lua.
func (e *Engine) PutDocument(ctx context.Context, name string, doc lease.Document, ifVersion string) (lease.Document, error) {
	const op = "put document"
	if err := lease.ValidatePut(name, doc, ifVersion); err != nil {
		return lease.Document{}, err
	}
	if e.closed.Load() {
		return lease.Document{}, &lease.UnavailableError{Op: op, Err: ErrClosed}
	}
	ctx, cancel := context.WithTimeout(ctx, e.opTimeout)
	defer cancel()
	v, err := documentScript.Run(ctx, e.client, []string{e.documentKey(name)}, ifVersion, doc.Version, doc.Data).Result()
	if err != nil {
		return lease.Document{}, &lease.UnavailableError{Op: op, Err: err}
	}
	a, ok := v.([]any)
	if !ok || len(a) != 3 {
		return lease.Document{}, &lease.UnavailableError{Op: op, Err: fmt.Errorf("leaseredis: malformed script reply %v", v)}
	}
	status, ok1 := a[0].(string)
	version, ok2 := a[1].(string)
	us, ok3 := a[2].(int64)
	if !ok1 || !ok2 || !ok3 {
		return lease.Document{}, &lease.UnavailableError{Op: op, Err: fmt.Errorf("leaseredis: malformed script reply %v", v)}
	}
	switch {
	case status == docStatusOK && us > 0:
		data := append([]byte{}, doc.Data...)
		return lease.Document{Version: version, Data: data, UpdatedAt: micros(us)}, nil
	case status == docStatusMismatch:
		return lease.Document{}, &lease.VersionMismatchError{Name: name, Current: version}
	}
	return lease.Document{}, unexpected(op, status)
}
