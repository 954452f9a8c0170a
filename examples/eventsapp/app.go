package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/owner/guard"
	"github.com/tablease/tablease/owner/leasetoken"
)

// Options configure the app.
type Options struct {
	// TableaseURL is tablease's base URL: the JWKS comes from there, and strict checks go there.
	TableaseURL string
	// LeaseIssuer is the iss of tablease's lease tokens (TABLEASE_LEASE_ISSUER, default
	// "tablease").
	LeaseIssuer string
	// Keys verify lease tokens; default a guard.JWKSClient on TableaseURL.
	Keys leasetoken.KeySource
	// Strict asks tablease, for every write, whether the token's epoch is still current.
	Strict bool

	// The app's own users sign in with the identity provider tablease trusts too, so the app
	// verifies the same HS256 access tokens (and passes them on to tablease in strict mode).
	AccessSecret   []byte
	AccessIssuer   string
	AccessAudience string

	// HTTPClient talks to tablease; default http.DefaultClient.
	HTTPClient *http.Client
	// Log receives the rejections; nil discards.
	Log *slog.Logger
}

// App is the events backend: an http.Handler.
type App struct {
	mux    *http.ServeMux
	events *eventTable
	parser *jwt.Parser
	secret []byte
	log    *slog.Logger
}

// newApp wires the routes:
//
//	GET  /api/sessions/{sid}/events              list (no lease needed: reading is free)
//	GET  /api/sessions/{sid}/events/{id}         get
//	PUT  /api/sessions/{sid}/events/{id}         save {name, date}: create or replace (fenced)
//	POST /api/sessions/{sid}/events/{id}/rename  rename {name} (fenced)
//	GET  /healthz
//
// Every /api request needs the user's access token; writes need the lease token of the session
// in the Tablease-Lease header too (owner/guard), and are fenced with its epoch.
func newApp(opts Options) (*App, error) {
	if len(opts.AccessSecret) < 32 || opts.AccessIssuer == "" || opts.AccessAudience == "" {
		return nil, errors.New("eventsapp: AccessSecret (at least 32 bytes), AccessIssuer and AccessAudience are required")
	}
	if opts.LeaseIssuer == "" {
		opts.LeaseIssuer = "tablease"
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	keys := opts.Keys
	if keys == nil {
		jwks, err := guard.NewJWKSClient(guard.JWKSOptions{BaseURL: opts.TableaseURL, HTTPClient: opts.HTTPClient})
		if err != nil {
			return nil, err
		}
		keys = jwks
	}
	a := &App{
		mux:    http.NewServeMux(),
		events: newEventTable(),
		parser: jwt.NewParser(jwt.WithValidMethods([]string{"HS256"}), jwt.WithIssuer(opts.AccessIssuer),
			jwt.WithAudience(opts.AccessAudience), jwt.WithExpirationRequired(), jwt.WithStrictDecoding()),
		secret: opts.AccessSecret,
		log:    opts.Log,
	}
	g, err := guard.New(guard.Options{
		Keys:   keys,
		Issuer: opts.LeaseIssuer,
		// The user from the app's own authentication, the session from the route.
		Target: func(r *http.Request) (string, string, error) {
			return userOf(r.Context()), r.PathValue("sid"), nil
		},
		Skip:       guard.SafeMethods,
		Strict:     opts.Strict,
		BaseURL:    opts.TableaseURL,
		HTTPClient: opts.HTTPClient,
		OnReject: func(r *http.Request, e *guard.Error) {
			opts.Log.Info("write refused", "path", r.URL.EscapedPath(), "code", e.Code, "details", e.Details, "err", e.Err)
		},
	})
	if err != nil {
		return nil, err
	}
	write := func(h http.HandlerFunc) http.Handler { return a.authenticate(g.Middleware(h)) }
	a.mux.Handle("GET /api/sessions/{sid}/events", a.authenticate(http.HandlerFunc(a.list)))
	a.mux.Handle("GET /api/sessions/{sid}/events/{id}", a.authenticate(http.HandlerFunc(a.get)))
	a.mux.Handle("PUT /api/sessions/{sid}/events/{id}", write(a.save))
	a.mux.Handle("POST /api/sessions/{sid}/events/{id}/rename", write(a.rename))
	a.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	return a, nil
}

func (a *App) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.mux.ServeHTTP(w, r) }

type userKey struct{}

func userOf(ctx context.Context) string { s, _ := ctx.Value(userKey{}).(string); return s }

// authenticate verifies the user's access token and puts its sub in the context.
func (a *App) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
		var claims jwt.RegisteredClaims
		if !ok || !strings.EqualFold(scheme, "Bearer") {
			guard.WriteError(w, appError(http.StatusUnauthorized, "UNAUTHENTICATED", "An Authorization: Bearer access token is required."))
			return
		}
		if _, err := a.parser.ParseWithClaims(strings.TrimSpace(tok), &claims, func(*jwt.Token) (any, error) { return a.secret, nil }); err != nil ||
			lease.ValidateID("sub", claims.Subject) != nil {
			guard.WriteError(w, appError(http.StatusUnauthorized, "UNAUTHENTICATED", "The access token is not valid."))
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, claims.Subject)))
	})
}

func appError(status int, code, msg string) *guard.Error {
	return &guard.Error{Status: status, Code: code, Message: msg}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// rowKey names an event row: events belong to one session of one user, like the items of
// docs/fencing.md belong to a session.
type rowKey struct{ user, session, id string }

func keyOf(r *http.Request) (rowKey, error) {
	k := rowKey{user: userOf(r.Context()), session: r.PathValue("sid"), id: r.PathValue("id")}
	for _, f := range []struct{ name, v string }{{"sid", k.session}, {"id", k.id}} {
		if f.name == "id" && f.v == "" {
			continue
		}
		if err := lease.ValidateID(f.name, f.v); err != nil {
			return rowKey{}, appError(http.StatusBadRequest, "INVALID_ARGUMENT", err.Error())
		}
	}
	return k, nil
}

// event is a row of the events table. LeaseEpoch is the fence: the highest epoch that wrote it.
type event struct {
	ID         string    `json:"id"`
	Name       string    `json:"name"`
	Date       string    `json:"date,omitempty"`
	LeaseEpoch int64     `json:"leaseEpoch"`
	UpdatedAt  time.Time `json:"updatedAt"`
}

func (a *App) list(w http.ResponseWriter, r *http.Request) {
	k, err := keyOf(r)
	if err != nil {
		guard.WriteError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"events": a.events.list(k.user, k.session)})
}

func (a *App) get(w http.ResponseWriter, r *http.Request) {
	k, err := keyOf(r)
	if err != nil {
		guard.WriteError(w, err)
		return
	}
	ev, ok := a.events.get(k)
	if !ok {
		guard.WriteError(w, appError(http.StatusNotFound, "NOT_FOUND", "No such event."))
		return
	}
	writeJSON(w, http.StatusOK, ev)
}

type eventBody struct {
	Name string `json:"name"`
	Date string `json:"date"`
}

func readBody(r *http.Request) (eventBody, error) {
	var b eventBody
	dec := json.NewDecoder(io.LimitReader(r.Body, 16<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		return b, appError(http.StatusBadRequest, "INVALID_ARGUMENT", "The body must be a JSON object {name, date?}.")
	}
	if b.Name = strings.TrimSpace(b.Name); b.Name == "" || len(b.Name) > 200 {
		return b, appError(http.StatusBadRequest, "INVALID_ARGUMENT", "name must be 1 to 200 characters.")
	}
	return b, nil
}

// guardedWrite reads what a write under the lease needs: the lease claims the guard checked, the
// row and the body. Claims missing from the context mean the route is not behind the guard: a
// wiring bug, never a pass.
func guardedWrite(r *http.Request) (guard.Claims, rowKey, eventBody, error) {
	claims, ok := guard.FromContext(r.Context())
	if !ok {
		return guard.Claims{}, rowKey{}, eventBody{}, errors.New("no lease claims")
	}
	k, err := keyOf(r)
	if err != nil {
		return guard.Claims{}, rowKey{}, eventBody{}, err
	}
	b, err := readBody(r)
	if err != nil {
		return guard.Claims{}, rowKey{}, eventBody{}, err
	}
	return claims, k, b, nil
}

// save creates or replaces an event under the lease of the request (PUT is idempotent).
func (a *App) save(w http.ResponseWriter, r *http.Request) {
	claims, k, b, err := guardedWrite(r)
	if err != nil {
		guard.WriteError(w, err)
		return
	}
	ev, err := a.events.upsert(k, b, claims.Epoch, time.Now())
	if err != nil {
		guard.WriteError(w, fenceError(claims, k, err))
		return
	}
	writeJSON(w, http.StatusOK, ev)
}

// rename renames an existing event under the lease of the request.
func (a *App) rename(w http.ResponseWriter, r *http.Request) {
	claims, k, b, err := guardedWrite(r)
	if err != nil {
		guard.WriteError(w, err)
		return
	}
	ev, err := a.events.rename(k, b.Name, claims.Epoch, time.Now())
	if err != nil {
		guard.WriteError(w, fenceError(claims, k, err))
		return
	}
	writeJSON(w, http.StatusOK, ev)
}

// fenceError answers a write the table refused.
func fenceError(c guard.Claims, k rowKey, err error) error {
	var fenced *fencedError
	switch {
	case errors.As(err, &fenced):
		// A newer holder of this session's lease already wrote this event: the request was made
		// under a lease that is gone. Never retry it with the same token.
		return guard.NewLeaseLost(c, map[string]any{"resource": k.id, "resourceEpoch": fenced.stored})
	case errors.Is(err, errNotFound):
		return appError(http.StatusNotFound, "NOT_FOUND", "No such event.")
	}
	return err
}

// eventTable is the events table, in memory. Each write compares and sets the row's lease_epoch
// in one critical section, like the SQL of docs/fencing.md:
//
//	UPDATE events SET name = $name, lease_epoch = $epoch
//	 WHERE user_id = $user AND session_id = $sid AND id = $id AND lease_epoch <= $epoch;
//
//	INSERT INTO events (user_id, session_id, id, name, date, lease_epoch) VALUES (…, $epoch)
//	ON CONFLICT (user_id, session_id, id) DO UPDATE SET name = EXCLUDED.name, date = EXCLUDED.date,
//	   lease_epoch = EXCLUDED.lease_epoch
//	 WHERE events.lease_epoch <= EXCLUDED.lease_epoch;
//
// Epochs of one (user, session) are ordered; epochs of different sessions are not, which is why the
// fence is per row of one session.
type eventTable struct {
	mu   sync.Mutex // protects rows; every read-compare-write is one critical section
	rows map[rowKey]*event
}

var errNotFound = errors.New("eventsapp: no such event")

// fencedError: a newer epoch already wrote the row.
type fencedError struct{ stored int64 }

func (e *fencedError) Error() string {
	return fmt.Sprintf("eventsapp: the event was written under epoch %d", e.stored)
}

func newEventTable() *eventTable { return &eventTable{rows: make(map[rowKey]*event)} }

func (t *eventTable) list(user, session string) []event {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := []event{}
	for k, ev := range t.rows {
		if k.user == user && k.session == session {
			out = append(out, *ev)
		}
	}
	slices.SortFunc(out, func(a, b event) int { return strings.Compare(a.ID, b.ID) })
	return out
}

func (t *eventTable) get(k rowKey) (event, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ev, ok := t.rows[k]
	if !ok {
		return event{}, false
	}
	return *ev, true
}

// rename is the UPDATE: it fails with errNotFound, or with *fencedError when the row was written
// under a higher epoch.
func (t *eventTable) rename(k rowKey, name string, epoch int64, now time.Time) (event, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ev, ok := t.rows[k]
	switch {
	case !ok:
		return event{}, errNotFound
	case ev.LeaseEpoch > epoch:
		return event{}, &fencedError{stored: ev.LeaseEpoch}
	}
	ev.Name, ev.LeaseEpoch, ev.UpdatedAt = name, epoch, now
	return *ev, nil
}

// upsert is the INSERT … ON CONFLICT DO UPDATE … WHERE: it fails with *fencedError when the row
// exists and was written under a higher epoch.
func (t *eventTable) upsert(k rowKey, b eventBody, epoch int64, now time.Time) (event, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ev, ok := t.rows[k]
	if ok && ev.LeaseEpoch > epoch {
		return event{}, &fencedError{stored: ev.LeaseEpoch}
	}
	if !ok {
		ev = &event{ID: k.id}
		t.rows[k] = ev
	}
	ev.Name, ev.Date, ev.LeaseEpoch, ev.UpdatedAt = b.Name, b.Date, epoch, now
	return *ev, nil
}
