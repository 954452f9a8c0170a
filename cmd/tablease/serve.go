package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/tablease/tablease/api"
	"github.com/tablease/tablease/api/socket"
	"github.com/tablease/tablease/api/stream"
	"github.com/tablease/tablease/config"
	"github.com/tablease/tablease/internal/jwk"
	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/lease/leasemem"
	"github.com/tablease/tablease/lease/leaseredis"
	"github.com/tablease/tablease/owner/catalog"
	"github.com/tablease/tablease/owner/leasetoken"
)

func (p Program) serve(ctx context.Context, args []string) int {
	cfg, err := config.Load(args, p.Getenv, p.Stdout) // --help is asked for: its usage is the answer
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(p.Stderr, "tablease: configuration:", err)
		return 2
	}
	log := newLogger(p, cfg)
	serveLog.Store(log)
	if p.Environ != nil {
		names, nearest := config.Unknown(p.Environ())
		for i, name := range names {
			attrs := []any{"variable", name}
			if nearest[i] != "" {
				attrs = append(attrs, "did_you_mean", nearest[i])
			}
			log.Warn("an environment variable named like tablease's is read by nothing, and ignored", attrs...)
		}
	}
	if err := p.run(ctx, cfg, log); err != nil {
		var bad *configError
		if errors.As(err, &bad) {
			// Written by the log, in its format, as its last line: a log pipeline reads it as
			// it reads the lines before it.
			log.Error("tablease stopped", "err", "configuration: "+bad.err.Error())
			return 2
		}
		log.Error("tablease stopped", "err", err)
		return 1
	}
	return 0
}

// A configError is a bad value that only the start finds (a key file that does not parse, a Redis
// URL of the wrong server): serve exits with code 2, as for config.Load's errors, its log's last
// line "tablease stopped" naming it.
type configError struct{ err error }

func (e *configError) Error() string { return e.err.Error() }
func (e *configError) Unwrap() error { return e.err }

func newLogger(p Program, cfg config.Config) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(p.Stderr, opts))
	}
	return slog.New(slog.NewJSONHandler(p.Stderr, opts))
}

func (p Program) run(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	if len(cfg.HS256Secret) == 0 && cfg.Dev {
		secret := make([]byte, 32)
		if _, err := rand.Read(secret); err != nil {
			return err
		}
		cfg.HS256Secret = []byte(hex.EncodeToString(secret))
		cfg.SecretGenerated = true
	}

	// The key files first: a bad one is a configuration error, reported before anything starts.
	auth := api.AuthConfig{HS256Secret: cfg.HS256Secret, JWKSURL: cfg.JWKSURL, Issuer: cfg.Issuer, Audience: cfg.Audience, Leeway: cfg.Leeway}
	accessKeys := make([]string, 0, len(cfg.PublicKeys)) // "<kid> <alg>", for whoever sets up the identity provider
	for _, k := range cfg.PublicKeys {
		auth.PublicKeys = append(auth.PublicKeys, api.PublicKey(k))
		if alg, _, err := jwk.Alg(k.Key); err == nil {
			accessKeys = append(accessKeys, k.KID+" "+alg)
		}
	}
	log.Info("access tokens", "issuer", cfg.Issuer, "audience", cfg.Audience, "hs256", len(cfg.HS256Secret) > 0, "keys", accessKeys, "jwks", cfg.JWKSURL)
	leaseKeys, err := leaseKeySet(cfg, log)
	if err != nil {
		return err
	}

	// The start's calls to the store (the server check, the eviction policy, the catalog) share one
	// TABLEASE_REDIS_TIMEOUT: a Redis that does not answer delays listening by that much at most,
	// and the server then answers 503 (and /readyz 503) until it does.
	startCtx, cancelStart := context.WithTimeout(ctx, cfg.RedisTimeout)
	defer cancelStart()
	registry := prometheus.NewRegistry()
	registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	store, err := openStore(startCtx, cfg, log, registry)
	if err != nil {
		return err
	}
	// onStore is what may still be calling the store when run returns (the catalog's late seed).
	// It is waited for after the store is closed, since closing it ends a call Redis does not
	// answer, which a cancelled context does not (go-redis reads until its deadline): the stop
	// does not wait out a TABLEASE_REDIS_TIMEOUT.
	var onStore sync.WaitGroup
	defer func() {
		_ = store.close(context.Background()) // on a return before the shutdown, which closes it within its timeout
		onStore.Wait()
	}()
	if cfg.Dev && cfg.RedisURL != "" {
		log.Warn("dev mode on Redis: /dev/token mints tokens for any user, so whoever reaches this instance can act on every lease of this store; never point dev mode at a Redis that a deployment uses")
	}

	srv, err := api.New(api.Options{
		Engine:   store.engine,
		Limits:   cfg.Limits,
		Auth:     auth,
		Logger:   log,
		Registry: registry,

		LogFailedRequestsOnly: cfg.LogFailedRequestsOnly,

		RateLimit:   cfg.RateLimit,
		IPRateLimit: cfg.IPRateLimit,
		Dev:         cfg.Dev,
		Demo:        cfg.Demo,
		Version:     Version(),

		Catalog:     cfg.Catalog,
		Documents:   store.documents,
		LeaseKeys:   leaseKeys,
		LeaseIssuer: cfg.LeaseIssuer,

		MaxBlock: cfg.AdminMaxBlock,

		Nonces:  store.nonces,
		Streams: streamOptions(cfg, log),
		Sockets: socket.Options{PerUser: cfg.SocketsPerUser, PerInstance: cfg.SocketsPerInstance, Linger: cfg.SocketLinger},

		CORSOrigins: cfg.CORSOrigins,
	})
	if err != nil {
		return err
	}
	if err := seedCatalog(startCtx, srv, cfg, log); storeDidNotAnswer(err) {
		seedCtx, stopSeeding := context.WithCancel(ctx)
		defer stopSeeding() // runs before the store is closed: the try the close fails is the last
		onStore.Go(func() { seedCatalogLater(seedCtx, srv, cfg, log) })
	}
	cancelStart()
	// The identity provider's keys, before the first request needs them: the fetch logs what it
	// found ("access-token keys fetched") or why it failed, and a failure does not stop the start
	// (the keys are fetched again when a token needs them).
	_ = srv.FetchAccessKeys(ctx)

	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		srv.Close()
		return fmt.Errorf("TABLEASE_ADDR: %w", err)
	}
	addr := ln.Addr().String()
	httpServer := &http.Server{
		Handler:           srv.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    api.MaxHeaderBytes,
		// "OPTIONS *" goes to the api, which answers it as any request of no route (net/http
		// would answer 200 with no headers).
		DisableGeneralOptionsHandler: true,
		ErrorLog:                     slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- httpServer.Serve(srv.ProtocolErrors(ln)) }()

	log.Info("tablease listening", append([]any{"addr", addr, "engine", store.name, "version", Version(), "dev", cfg.Dev}, store.attrs...)...)
	log.Info("tablease settings", settingsAttrs(cfg)...)
	if cfg.Dev {
		fmt.Fprintf(p.Stderr, "\ntablease dev mode on http://%[1]s (%[2]s engine)\n"+
			"  the demo:  http://%[1]s/demo   (open it in two tabs)\n"+
			"  admin:     http://%[1]s/admin\n"+
			"  a token:   curl 'http://%[1]s/dev/token?sub=alice'\n"+
			"  the API:   http://%[1]s/openapi.yaml\n\n", addr, store.name)
	}
	if p.OnListen != nil {
		p.OnListen(addr)
	}

	select {
	case err := <-served:
		srv.Close()
		return err
	case <-ctx.Done():
	}
	log.Info("tablease shutting down", "timeout", cfg.ShutdownTimeout.String())
	shutdownCtx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	// The last quarter of the timeout (at most a second) is for the calls still waiting for a Redis
	// that does not answer when the rest has run out: the store is closed then, which fails them,
	// so that they answer 503 and their streams log their end before the connections close.
	drainCtx, cancelDrain := context.WithTimeout(shutdownCtx, cfg.ShutdownTimeout-min(cfg.ShutdownTimeout/4, time.Second))
	defer cancelDrain()
	// Streams end first (Shutdown never ends a connection that never goes idle), within the same
	// bound: a stream whose client stopped reading is cut by srv.Shutdown or httpServer.Close.
	srv.Shutdown(drainCtx)
	if err := httpServer.Shutdown(drainCtx); err != nil {
		store.close(drainCtx) // done: fails the calls Redis has not answered
		srv.Shutdown(shutdownCtx)
		if err := httpServer.Shutdown(shutdownCtx); err != nil {
			log.Warn("shutdown did not finish in time; closing connections", "err", err)
			httpServer.Close()
		}
	}
	// The store last, before the last line, within what is left of the timeout: once it ends, the
	// calls still waiting for a Redis that does not answer (the engine's own) are failed rather
	// than awaited. (Closing it again does nothing.)
	store.close(shutdownCtx)
	onStore.Wait() // ended by ctx, and by the close if it waits for Redis
	srv.Stopped()
	log.Info("tablease stopped")
	return nil
}

// store is what the server keeps its state in: the lease engine, and the document store (the
// catalog) and nonce store (event tickets) beside it.
type store struct {
	engine    lease.Store
	documents catalog.Documents
	nonces    stream.Nonces
	name      string // "memory" or "redis"
	attrs     []any  // what the start's log says of it: for Redis, which server and library
	// close closes the engine, then the Redis client, which the engine does not own. When ctx
	// ends first, it closes the client at once, failing the calls that Redis has not answered
	// (the engine's own, which its Close waits for, and any a stream still makes). Closing again
	// does nothing.
	close func(ctx context.Context) error
}

// openStore opens the lease engine and the stores beside it: the Redis engine is all three; the
// memory engine has memory stores of this process beside it (one instance). ctx bounds its checks
// of the Redis server; the Redis engine's sweeps are counted in reg.
func openStore(ctx context.Context, cfg config.Config, log *slog.Logger, reg prometheus.Registerer) (store, error) {
	if cfg.RedisURL == "" {
		e, err := leasemem.New(leasemem.Options{Limits: cfg.Limits, HandoffTimeout: cfg.HandoffTimeout, HandoffReserve: cfg.HandoffReserve,
			SessionsPerUser: cfg.SessionsPerUser, AuditRetention: cfg.AuditRetention, AuditMaxRecords: cfg.AuditMaxRecords})
		if err != nil {
			return store{}, err
		}
		return store{engine: e, documents: leasemem.NewDocumentStore(nil), nonces: leasemem.NewNonceStore(nil), name: "memory",
			close: func(context.Context) error { return e.Close() }}, nil
	}
	client, err := leaseredis.NewClient(cfg.RedisURL, cfg.RedisTimeout)
	if err != nil {
		return store{}, fmt.Errorf("TABLEASE_REDIS_URL: %w", err)
	}
	sweeps := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tablease_sweeps_total",
		Help: "Sweeps of the expiries nobody announced that this instance made (docs/engines.md, Expiry timers), by result: ok, or failed (a store error passed over or ending it).",
	}, []string{"result"})
	swept := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tablease_sweep_expiries_total",
		Help: "Expiries the sweeps of this instance announced (and so recorded in the audit log).",
	})
	resubscribed := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tablease_event_resubscriptions_total",
		Help: "Times this instance replaced its event subscription because it did not hear its own heartbeat back (docs/engines.md): a subscription left on a node that no longer gets the writes, as after a Sentinel failover.",
	})
	clock := newClockWatch(log)
	if err := errors.Join(reg.Register(sweeps), reg.Register(swept), reg.Register(resubscribed), reg.Register(clock.gauge)); err != nil {
		client.Close()
		return store{}, err
	}
	sweeps.WithLabelValues("ok")
	sweeps.WithLabelValues("failed")
	e, err := leaseredis.New(client, leaseredis.Options{Limits: cfg.Limits, OpTimeout: cfg.RedisTimeout, HandoffTimeout: cfg.HandoffTimeout, HandoffReserve: cfg.HandoffReserve,
		SessionsPerUser: cfg.SessionsPerUser, AuditRetention: cfg.AuditRetention, AuditMaxRecords: cfg.AuditMaxRecords,
		RevokeReplicas: cfg.RevokeReplicas,
		OnResubscribe: func(silence time.Duration) {
			resubscribed.Inc()
			log.Warn("the event subscription did not hear this instance's heartbeat back: subscribed again; the event streams start over with a snapshot",
				"silence", silence.String())
		},
		OnClockOffset: clock.observe,
		OnLostEvents: func(key lease.Key) {
			log.Warn("the event log of a watched session lacks events its streams were sent, so the store lost data (a FLUSHALL, a failover that lost writes): those streams start over with a snapshot",
				"sub", key.User, "sid", key.Session)
		},
		OnMissedEvents: func(key lease.Key) {
			log.Warn("event streams of a session missed events appended while its event log was missing (the store lost it, or keeping it failed): those streams start over with a snapshot",
				"sub", key.User, "sid", key.Session)
		},
		OnSweep: func(n int, err error) {
			swept.Add(float64(n))
			if err != nil {
				sweeps.WithLabelValues("failed").Inc()
				log.Warn("the sweep of expiries nobody announced met a store error; the next one starts over", "announced", n, "err", err)
				return
			}
			sweeps.WithLabelValues("ok").Inc()
			if n > 0 {
				log.Debug("the sweep announced expiries nobody else announced", "announced", n)
			}
		}})
	if err != nil {
		client.Close()
		return store{}, err
	}
	if err := e.ServerMismatch(ctx); err != nil {
		_ = e.Close()
		client.Close()
		return store{}, &configError{fmt.Errorf("TABLEASE_REDIS_URL: %w", err)}
	}
	if offset, rtt, err := e.ClockOffset(ctx); err == nil {
		clock.observe(offset, rtt) // and once a sweep period from now on
	}
	lateChecks, stopLateChecks := context.WithCancel(context.Background())
	if checkEvictionPolicy(ctx, e.EvictionPolicy, log, false) != nil {
		go checkEvictionPolicyLater(lateChecks, e.EvictionPolicy, log, evictionPolicyRetry)
	}
	if cfg.RevokeReplicas > 0 {
		counts, err := e.Replicas(ctx)
		if err != nil {
			log.Warn("could not read how many replicas Redis has; TABLEASE_REVOKE_REPLICAS asks revokes to wait for them", "err", err)
		}
		for _, addr := range slices.Sorted(maps.Keys(counts)) {
			if n := counts[addr]; n < cfg.RevokeReplicas {
				log.Warn("a Redis primary has fewer replicas than TABLEASE_REVOKE_REPLICAS: the revokes of its sessions answer 503 until enough connect",
					"primary", addr, "replicas", n, "revoke_replicas", cfg.RevokeReplicas)
			}
		}
	}
	closeClient := sync.OnceValue(client.Close)
	closeStore := func(ctx context.Context) error {
		// go-redis ends a call at its context's deadline, not when the context is cancelled: the
		// engine's Close cancels its calls, yet waits for one in flight until OpTimeout. Closing
		// the client's connections is what ends it at once.
		stopLateChecks()
		abandon := context.AfterFunc(ctx, func() { _ = closeClient() })
		err := e.Close()
		abandon()
		return errors.Join(err, closeClient())
	}
	return store{engine: e, documents: e, nonces: e, name: "redis", close: closeStore,
		attrs: []any{"redis", redisTarget(cfg.RedisURL), "redis_functions", leaseredis.LibraryName()}}, nil
}

// leaseKeySet is the key set of lease tokens: the configured signing key, or one generated for
// this process (dev mode, and the memory engine with a warning), with the previous keys.
func leaseKeySet(cfg config.Config, log *slog.Logger) (*leasetoken.KeySet, error) {
	key := cfg.LeaseSigningKey
	if key.IsZero() {
		var err error
		if key, err = leasetoken.GenerateKey(); err != nil {
			return nil, fmt.Errorf("generating a lease-token key: %w", err)
		}
		if !cfg.Dev {
			log.Warn("TABLEASE_LEASE_SIGNING_KEY is not set: lease tokens are signed with a key generated for this process, "+
				"so tokens issued before a restart will not verify after it; create one with `tablease keygen --out lease-key.pem`",
				"kid", key.KeyID())
		}
	} else if fi, err := os.Stat(cfg.LeaseSigningKeyFile); err == nil && fi.Mode().Perm()&0o077 != 0 {
		log.Warn("the lease signing key file can be read by other users; chmod 600 it",
			"file", cfg.LeaseSigningKeyFile, "mode", fi.Mode().Perm().String())
	}
	keys, err := leasetoken.NewKeySet(key, leasetoken.KeySetOptions{Previous: cfg.LeasePreviousKeys})
	if err != nil {
		return nil, &configError{fmt.Errorf("TABLEASE_LEASE_PREVIOUS_KEYS: %w", err)}
	}
	published := make([]string, 0, 4)
	for _, k := range keys.Published(time.Now()) {
		published = append(published, k.KeyID())
	}
	log.Info("lease tokens", "issuer", cfg.LeaseIssuer, "alg", key.Algorithm(), "kid", key.KeyID(), "published", published,
		"generated", cfg.LeaseSigningKey.IsZero())
	return keys, nil
}

// seedCatalog stores the file's catalog when the store holds none, and says which catalog is
// served. A store that does not answer is logged and returned: the file's catalog is served
// meanwhile, and seedCatalogLater makes the seed once the store answers.
func seedCatalog(ctx context.Context, srv *api.Server, cfg config.Config, log *slog.Logger) error {
	st, err := srv.SeedCatalog(ctx)
	logSeed(st, err, cfg, log)
	return err
}

// logSeed says what a seed of the catalog found: which catalog is served, and whether this
// instance stored it.
func logSeed(st catalog.Status, err error, cfg config.Config, log *slog.Logger) {
	switch {
	case err != nil && !storeDidNotAnswer(err):
		log.Error("the stored tool catalog is not valid; catalog requests fail (500) until an admin replaces it (PUT /v1/admin/catalog)", "err", err)
	case err != nil && cfg.CatalogFile == "":
		log.Warn("could not read the stored catalog; serving an empty one until the store answers", "err", err)
	case err != nil:
		log.Warn("could not read the stored catalog; serving the file's catalog until the store answers", "err", err, "file", cfg.CatalogFile)
	case st.Source == catalog.FromNone:
		log.Info("no tool catalog: serving an empty one (set TABLEASE_CATALOG_FILE or PUT /v1/admin/catalog)")
	case st.Seeded:
		log.Info("tool catalog: stored the file's catalog, which every instance now serves", "version", st.Version, "file", cfg.CatalogFile)
	case st.FileVersion != "" && st.FileVersion != st.Version:
		log.Warn("tool catalog: serving the STORED catalog, not TABLEASE_CATALOG_FILE's: the stored one wins once it exists; "+
			"PUT the file to /v1/admin/catalog to serve it",
			"version", st.Version, "updated_at", st.UpdatedAt, "file", cfg.CatalogFile, "file_version", st.FileVersion)
	default:
		log.Info("tool catalog", "version", st.Version, "source", st.Source, "updated_at", st.UpdatedAt)
	}
}

// storeDidNotAnswer reports whether err is a store that could not be reached or did not answer in
// time, which a later try may find answering (unlike a stored catalog that is not valid).
func storeDidNotAnswer(err error) bool {
	return errors.Is(err, lease.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)
}

// The waits between the tries of seedCatalogLater double from the first up to the longest, so that
// a store back within a second is seeded at once and one that stays down costs a try per 10 s.
const (
	seedRetryFirst = 250 * time.Millisecond
	seedRetryMax   = 10 * time.Second
)

// seedCatalogLater makes the seed the start could not make because the store did not answer.
// Without it this instance would serve its file's catalog alone, never stored, while the other
// instances serve what the store holds (an empty catalog, when they have no file). It tries again,
// each try within one TABLEASE_REDIS_TIMEOUT, until the store answers or ctx ends (the shutdown),
// and logs what the seed found as the start does.
func seedCatalogLater(ctx context.Context, srv *api.Server, cfg config.Config, log *slog.Logger) {
	untilStoreAnswers(ctx, seedRetryFirst, seedRetryMax, func(ctx context.Context) error {
		tryCtx, cancel := context.WithTimeout(ctx, cfg.RedisTimeout)
		defer cancel()
		st, err := srv.SeedCatalog(tryCtx)
		switch {
		case ctx.Err() != nil: // stopped: the try was cut short, it did not fail
		case storeDidNotAnswer(err):
			log.Debug("the store still does not answer; the catalog is seeded once it does", "err", err)
		default:
			logSeed(st, err, cfg, log)
		}
		return err
	})
}

// untilStoreAnswers makes try again, after a wait of first doubling up to most, until it gets an
// answer of the store (its error is not one of storeDidNotAnswer) or ctx ends: what the start
// could not do because the store did not answer is done once it does.
func untilStoreAnswers(ctx context.Context, first, most time.Duration, try func(context.Context) error) {
	for wait := first; ; wait = min(2*wait, most) {
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
		if err := try(ctx); ctx.Err() != nil || !storeDidNotAnswer(err) {
			return
		}
	}
}

// redisTarget is the Redis URL u as the start's log names it: without its user, password or any
// query parameter that holds one.
func redisTarget(u string) string {
	parsed, err := url.Parse(u)
	if err != nil {
		return "(unparsable)" // config refused it before
	}
	parsed.User = nil
	q := parsed.Query()
	for k := range q {
		if lk := strings.ToLower(k); strings.Contains(lk, "password") || strings.Contains(lk, "user") {
			q.Del(k)
		}
	}
	parsed.RawQuery = q.Encode()
	return parsed.String()
}

// settingsAttrs are the settings the start's log lists, so that an operator sees what the
// instance runs with (the others are in the line before and in those of the tokens and keys).
func settingsAttrs(cfg config.Config) []any {
	requests := "all"
	if cfg.LogFailedRequestsOnly {
		requests = "failed"
	}
	cors := strings.Join(cfg.CORSOrigins, " ")
	if cors == "" {
		cors = "(same origin only)"
	}
	return []any{
		"ttl_min", cfg.Limits.Min.String(), "ttl_default", cfg.Limits.Default.String(),
		"ttl_max", cfg.Limits.Max.String(), "ttl_hidden_max", cfg.Limits.HiddenMax.String(),
		"rate_limit", cfg.RateLimit, "ip_rate_limit", cfg.IPRateLimit,
		"sessions_per_user", cfg.SessionsPerUser,
		"streams_per_user", cfg.StreamsPerUser, "streams_per_instance", cfg.StreamsPerInstance,
		"stream_keepalive", cfg.StreamKeepalive.String(),
		"sockets_per_user", cfg.SocketsPerUser, "sockets_per_instance", cfg.SocketsPerInstance,
		"socket_linger", cmp.Or(cfg.SocketLinger, api.SocketLinger(cfg.Limits.Default)).String(),
		"handoff_timeout", cfg.HandoffTimeout.String(), "handoff_reserve", cfg.HandoffReserve.String(),
		"admin_max_block", cfg.AdminMaxBlock.String(), "revoke_replicas", cfg.RevokeReplicas,
		"audit_retention", cfg.AuditRetention.String(), "audit_max_records", cfg.AuditMaxRecords,
		"jwt_leeway", cfg.Leeway.String(),
		"redis_timeout", cfg.RedisTimeout.String(), "shutdown_timeout", cfg.ShutdownTimeout.String(),
		"cors_origins", cors, "log_requests", requests,
	}
}

// evictionPolicyRetry is how often the eviction policy is asked again when Redis did not answer
// at the start.
const evictionPolicyRetry = 2 * time.Second

// checkEvictionPolicy reads Redis's maxmemory-policy with read and warns, loudly, unless it is
// noeviction, or when it cannot be read (an ACL that refuses CONFIG GET). It answers read's error
// when Redis did not answer (storeDidNotAnswer), saying so unless late (a check made again after
// the start), and nil otherwise.
func checkEvictionPolicy(ctx context.Context, read func(context.Context) (string, error), log *slog.Logger, late bool) error {
	policy, err := read(ctx)
	switch {
	case storeDidNotAnswer(err):
		if !late {
			log.Warn("could not read Redis maxmemory-policy, Redis did not answer: it is read again once Redis answers; it must be noeviction or leases may be evicted", "err", err)
		}
		return err
	case err != nil:
		log.Warn("could not read Redis maxmemory-policy; it must be noeviction or leases may be evicted", "err", err)
	case policy != "noeviction":
		log.Warn("REDIS MAXMEMORY-POLICY IS NOT noeviction: under memory pressure Redis may evict lease state and break the guarantees; set maxmemory-policy noeviction", "policy", policy)
	case late:
		log.Info("Redis maxmemory-policy is noeviction")
	}
	return nil
}

// checkEvictionPolicyLater checks the eviction policy every interval until Redis answers or ctx
// ends: a Redis that did not answer at the start may evict all the same.
func checkEvictionPolicyLater(ctx context.Context, read func(context.Context) (string, error), log *slog.Logger, every time.Duration) {
	untilStoreAnswers(ctx, every, every, func(ctx context.Context) error {
		return checkEvictionPolicy(ctx, read, log, true)
	})
}
