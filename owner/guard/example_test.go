package guard_test

import (
	"log"
	"net/http"

	"github.com/tablease/tablease/owner/guard"
)

// Example is the sample of the README's "Guards for app backends", which
// TestTheREADMESampleIsThisExample keeps word for word the same: a route of the app's mux that
// changes a session's data, behind the guard.
func Example() {
	mux := http.NewServeMux()

	jwks, err := guard.NewJWKSClient(guard.JWKSOptions{BaseURL: "https://tablease.example.com"})
	if err != nil {
		log.Fatal(err)
	}
	g, err := guard.New(guard.Options{
		Keys:   jwks,
		Issuer: "tablease", // TABLEASE_LEASE_ISSUER; "tablease-dev" against serve --dev
		Target: func(r *http.Request) (sub, sid string, err error) {
			return currentUser(r), r.PathValue("sid"), nil // your authentication; the route's session
		},
		Skip:    guard.SafeMethods, // reads need no lease
		Strict:  true,              // also POST …/lease/check {token} for every write,
		BaseURL: "https://tablease.example.com",
		// with the user's access token for tablease (default: the request's own Authorization
		// header, which a browser call that sends only Tablease-Lease lacks)
		AccessToken: accessTokenFor,
	})
	if err != nil {
		log.Fatal(err)
	}
	mux.Handle("PUT /api/sessions/{sid}/saved/{id}", g.Middleware(http.HandlerFunc(saveEvent)))
}

func saveEvent(w http.ResponseWriter, r *http.Request) {
	lease, _ := guard.FromContext(r.Context())
	// Write with lease.Epoch as the fence (README, Fencing); when a newer epoch wrote first:
	// guard.WriteError(w, guard.NewLeaseLost(lease, map[string]any{"resource": r.PathValue("id")}))
	_ = lease.Epoch
	w.WriteHeader(http.StatusNoContent)
}

// currentUser stands for the app's authentication.
func currentUser(r *http.Request) string { return r.Header.Get("X-User") }

// accessTokenFor stands for the app's own session, which keeps the user's access token for
// tablease (the one the page's getToken is given).
func accessTokenFor(r *http.Request) (string, error) { return r.Header.Get("X-Access-Token"), nil }
