// Command eventsapp is an example application backend protected by tablease: an "events"
// resource that tabs of an agent session read freely and write only while they hold the session's
// lease.
//
// Writes go through owner/guard, which verifies the lease token of the Tablease-Lease header
// against tablease's JWKS (and, with EVENTSAPP_STRICT=true, asks tablease whether its epoch is
// still current), and then through a fence: each event row keeps the highest lease epoch that
// wrote it and refuses writes under a lower one (docs/fencing.md). The guard keeps most stale
// writes out; the fence keeps a tab that lost the lease from overwriting what a newer holder
// wrote. A new event, an event the newer holder has not written, and any write after an admin's
// revoke are refused only in strict mode (docs/fencing.md, "What each layer stops").
//
//	export TABLEASE_JWT_HS256_SECRET=$(openssl rand -hex 32)   # one identity provider for both
//	go run ./cmd/tablease serve --dev &                        # tablease on 127.0.0.1:8080
//	go run ./examples/eventsapp                                # the app on 127.0.0.1:8090
//
// Routes, each with the user's access token (Authorization: Bearer, the token tablease takes),
// and the writes also with the tab's lease token (Tablease-Lease):
//
//	GET  /api/sessions/{sid}/events              list
//	GET  /api/sessions/{sid}/events/{id}         get
//	PUT  /api/sessions/{sid}/events/{id}         save (write)
//	POST /api/sessions/{sid}/events/{id}/rename  rename (write)
//	GET  /healthz
//
// Environment: EVENTSAPP_ADDR (default 127.0.0.1:8090), TABLEASE_URL (default
// http://127.0.0.1:8080), EVENTSAPP_STRICT (default false), TABLEASE_LEASE_ISSUER (default
// tablease-dev, as tablease signs in dev mode; set it to the server's TABLEASE_LEASE_ISSUER
// otherwise), and the access-token settings the app shares with tablease:
// TABLEASE_JWT_HS256_SECRET, TABLEASE_JWT_ISSUER (default tablease-dev), TABLEASE_JWT_AUDIENCE
// (default tablease).
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/tablease/tablease/api"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "eventsapp:", err)
		os.Exit(1)
	}
}

// optionsFromEnv reads the app's options and address from the environment (getenv). Its defaults
// are those of the quick start above: a tablease in dev mode on this machine.
func optionsFromEnv(getenv func(string) string) (Options, string, error) {
	env := func(k, def string) string {
		if v := getenv(k); v != "" {
			return v
		}
		return def
	}
	strict, err := strconv.ParseBool(env("EVENTSAPP_STRICT", "false"))
	if err != nil {
		return Options{}, "", fmt.Errorf("EVENTSAPP_STRICT: %w", err)
	}
	if len(getenv("TABLEASE_JWT_HS256_SECRET")) < 32 {
		return Options{}, "", errors.New("TABLEASE_JWT_HS256_SECRET: set it to the secret tablease verifies access tokens with (at least 32 bytes), so that both accept the same tokens")
	}
	return Options{
		TableaseURL:    env("TABLEASE_URL", "http://127.0.0.1:8080"),
		LeaseIssuer:    env("TABLEASE_LEASE_ISSUER", api.DevIssuer),
		Strict:         strict,
		AccessSecret:   []byte(getenv("TABLEASE_JWT_HS256_SECRET")),
		AccessIssuer:   env("TABLEASE_JWT_ISSUER", api.DevIssuer),
		AccessAudience: env("TABLEASE_JWT_AUDIENCE", "tablease"),
	}, env("EVENTSAPP_ADDR", "127.0.0.1:8090"), nil
}

func run() error {
	opts, addr, err := optionsFromEnv(os.Getenv)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	opts.Log = log
	app, err := newApp(opts)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv := &http.Server{Addr: addr, Handler: app, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	log.Info("eventsapp listening", "addr", srv.Addr, "strict", opts.Strict)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
