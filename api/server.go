// Package api is the HTTP face of tablease: the Echo v4 routes under /v1 (lease.go, tabs.go,
// catalog.go, admin.go, leasetokens.go; event streams through package stream), access-token auth
// (auth.go), strict JSON decoding (decode.go), the one table from domain errors to the JSON error
// shape (errors.go), the JSON views (views.go), and /healthz, /readyz, /metrics, /openapi.yaml.
// docs/DESIGN.md is the normative HTTP contract; api/openapi.yaml is checked against the routes.
package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tablease/tablease/api/socket"
	"github.com/tablease/tablease/api/stream"
	"github.com/tablease/tablease/internal/loglimit"
	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/owner/catalog"
	"github.com/tablease/tablease/owner/leasetoken"
)

// MaxBodyBytes bounds a request body (16 KiB).
const MaxBodyBytes = 16 << 10

// MaxHeaderBytes is the http.Server.MaxHeaderBytes to serve the api with: net/http reads up to
// 4 KiB more than it, so that a request line and headers of more than 16 KiB in all are refused by
// net/http itself, before the api sees them (431 HEADERS_TOO_LARGE through ProtocolErrors), on a
// connection's first request; the api refuses them on the next ones (boundedHead). An
// Authorization header is refused with a 401 from 8 KiB (maxAuthHeaderLen).
const MaxHeaderBytes = 16<<10 - 4<<10

// readyTimeout bounds the store probe of /readyz (lease.Engine.Ping).
const readyTimeout = 2 * time.Second

// Options configure a Server. New checks them and names the field that is wrong.
type Options struct {
	// Engine stores the leases, serves their events and the tabs present (GET …/events, GET
	// …/tabs) and the admin lease routes (list, read, revoke, audit under /v1/admin, scope
	// lease:admin). Required.
	Engine lease.Store
	// Limits are the TTL bounds the engine was built with; zero means lease.DefaultLimits. The
	// engine clamps TTLs itself: New only refuses bounds that are not ordered.
	Limits lease.Limits
	// Auth verifies access tokens. Required.
	Auth AuthConfig
	// Logger receives one line per request and the errors behind 500s; nil discards.
	Logger *slog.Logger
	// LogFailedRequestsOnly writes the request lines of answers below 400 at debug, not info.
	LogFailedRequestsOnly bool
	// Registry receives the metrics served at /metrics; nil makes a new one (with the Go and
	// process collectors).
	Registry *prometheus.Registry
	// RateLimit is the number of requests per second allowed per user (the token's sub), with a
	// burst of twice that; 0 turns the limit off.
	RateLimit float64
	// IPRateLimit is the number of requests per second allowed per client address (the peer of
	// the connection; an IPv6 /64) that fail authentication or match no route without a token,
	// with a burst of twice that (limitFailure in middleware.go); 0 turns the limit off.
	IPRateLimit float64
	// Dev enables GET /dev/token, answered only to loopback addresses, and the demo. It needs
	// Auth.HS256Secret.
	Dev bool
	// Demo serves the two-tab demo at /demo outside dev mode too (TABLEASE_DEMO).
	Demo bool
	// Version is the build version, served in /openapi.yaml as info.x-build-version.
	Version string

	// Catalog is the tool catalog of the configuration (TABLEASE_CATALOG_FILE); nil means none.
	// The stored catalog wins over it once the store holds one (see SeedCatalog).
	Catalog *catalog.Catalog
	// Documents stores the catalog that admins PUT, so that every instance on the same store
	// serves the same version. Required: the Redis engine is one; a store of one process, such as
	// leasemem.DocumentStore, suits one instance only.
	Documents catalog.Documents
	// CatalogMaxAge is how long the catalog read from the store is served before it is read again
	// (a version check); it bounds how long an instance serves a version another instance
	// replaced. Default catalog.DefaultMaxAge.
	CatalogMaxAge time.Duration
	// LeaseKeys sign the lease tokens given to holders and are published at
	// /.well-known/jwks.json. Nil: a key generated for this process, which other instances
	// cannot verify (one instance only).
	LeaseKeys *leasetoken.KeySet
	// LeaseIssuer is the iss of lease tokens; guards require it. Default DefaultLeaseIssuer.
	LeaseIssuer string
	// Now is the clock that checks the exp and iat of lease tokens presented to /lease/check and
	// ages the cached catalog; default time.Now. (Leases themselves use the engine's clock.)
	Now func() time.Time

	// MaxBlock bounds the blockMs of a revoke (TABLEASE_ADMIN_MAX_BLOCK); zero means
	// DefaultMaxBlock (1h).
	MaxBlock time.Duration

	// Nonces makes the tickets of event streams single use (package stream; events.go,
	// tickets.go). Required: the Redis engine is one; a store of one process, such as
	// leasemem.NonceStore, suits one instance only.
	Nonces stream.Nonces
	// Streams bounds and tunes the event streams; zero values are the defaults.
	Streams stream.Options
	// Sockets bounds the lease sockets (socket.go); zero values are the defaults, but for
	// Linger, which is then SocketLinger(Limits.Default).
	Sockets socket.Options

	// CORSOrigins are the origins, besides the server's own, whose pages may call /v1 (cors.go):
	// each written as a browser sends it in the Origin header (scheme://host[:port], lower case,
	// no default port), or AnyOrigin, which only Dev allows. Empty: same origin only, and no CORS
	// header is sent.
	CORSOrigins []string
}

// route is a method and a route pattern, as Echo registers them: a key of routeSet that a request's
// method and pattern make without a string of their own.
type route struct{ method, pattern string }

// Server is the HTTP server of tablease. Make it with New.
type Server struct {
	engine     lease.Store
	auth       *authenticator
	authCfg    AuthConfig
	log        *slog.Logger
	failedOnly bool // Options.LogFailedRequestsOnly
	metrics    *metrics
	limiter    *userLimiter // nil when rate limiting is off
	// checkLimiter is the users' buckets of lease checks (rateLimitChecks); nil when rate
	// limiting is off.
	checkLimiter *userLimiter
	ipLimit      *userLimiter // failed and unauthenticated requests per client address; nil when off
	dev          bool
	demo         bool   // serve /demo (Options.Demo); dev mode serves it anyway
	spec         []byte // the OpenAPI document served
	echo         *echo.Echo
	routeSet     map[route]bool // every registered route; read-only after New
	registry     *prometheus.Registry

	catalogs   *catalog.Source
	leaseKeys  *leasetoken.KeySet
	signer     *leasetoken.Signer
	tokens     *leasetoken.Reuse // the holders' tokens, signed once per half-life
	verifier   *leasetoken.Verifier
	unknownKey *loglimit.Limit // the warnings of strict checks shown tokens of keys this server does not publish

	admin    lease.Admin   // the Engine's admin operations
	maxBlock time.Duration // bound on the blockMs of a revoke

	streams *stream.Handler
	sockets *socket.Handler
	gone    *goneRetries // the gone releases the store did not answer, sent again

	cors *corsPolicy // nil: same origin only
}

// New checks opts and builds the server with its routes.
func New(opts Options) (*Server, error) {
	if opts.Engine == nil {
		return nil, errors.New("api: Options.Engine is required")
	}
	limits, err := opts.Limits.OrDefault()
	if err != nil {
		return nil, fmt.Errorf("api: Options.Limits: %w", err)
	}
	if math.IsNaN(opts.RateLimit) || math.IsInf(opts.RateLimit, 0) || opts.RateLimit < 0 {
		return nil, errors.New("api: Options.RateLimit must be a finite number >= 0")
	}
	if math.IsNaN(opts.IPRateLimit) || math.IsInf(opts.IPRateLimit, 0) || opts.IPRateLimit < 0 {
		return nil, errors.New("api: Options.IPRateLimit must be a finite number >= 0")
	}
	if opts.Dev && len(opts.Auth.HS256Secret) == 0 {
		return nil, errors.New("api: Options.Dev needs Auth.HS256Secret to sign /dev/token tokens")
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	auth, err := newAuthenticator(opts.Auth, opts.Dev, logger)
	if err != nil {
		return nil, err
	}
	reg := opts.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	m, err := newMetrics(reg, newStoreHealth(logger, now))
	if err != nil {
		return nil, fmt.Errorf("api: Options.Registry: %w", err)
	}
	keys := opts.LeaseKeys
	if keys == nil {
		k, err := leasetoken.GenerateKey()
		if err != nil {
			return nil, fmt.Errorf("api: generating a lease-token key: %w", err)
		}
		if keys, err = leasetoken.NewKeySet(k, leasetoken.KeySetOptions{}); err != nil {
			return nil, fmt.Errorf("api: %w", err)
		}
	}
	issuer := opts.LeaseIssuer
	if issuer == "" {
		issuer = DefaultLeaseIssuer
	}
	signer, err := leasetoken.NewSigner(keys, issuer)
	if err != nil {
		return nil, fmt.Errorf("api: Options.LeaseIssuer: %w", err)
	}
	verifier, err := leasetoken.NewVerifier(keys, leasetoken.VerifierOptions{Issuer: issuer, Now: now})
	if err != nil {
		return nil, fmt.Errorf("api: %w", err)
	}
	docs := opts.Documents
	if docs == nil {
		return nil, errors.New("api: Options.Documents is required")
	}
	maxAge := opts.CatalogMaxAge
	switch {
	case maxAge == 0:
		maxAge = catalog.DefaultMaxAge
	case maxAge < 0:
		return nil, errors.New("api: Options.CatalogMaxAge must not be negative")
	}
	maxBlock := opts.MaxBlock
	switch {
	case maxBlock == 0:
		maxBlock = DefaultMaxBlock
	case maxBlock < 0 || maxBlock%time.Millisecond != 0:
		return nil, errors.New("api: Options.MaxBlock must be positive whole milliseconds (or zero for the default)")
	}
	cors, err := newCORSPolicy(opts.CORSOrigins, opts.Dev)
	if err != nil {
		return nil, err
	}
	catalogs, err := catalog.NewSource(docs, opts.Catalog, maxAge, now, logger)
	if err != nil {
		return nil, fmt.Errorf("api: %w", err)
	}

	s := &Server{
		engine:     opts.Engine,
		auth:       auth,
		authCfg:    opts.Auth,
		log:        logger,
		failedOnly: opts.LogFailedRequestsOnly,
		metrics:    m,
		dev:        opts.Dev,
		demo:       opts.Demo,
		spec:       specWithVersion(opts.Version),
		registry:   reg,
		routeSet:   make(map[route]bool),
		gone:       newGoneRetries(opts.Engine, limits, logger, m),

		catalogs:   catalogs,
		leaseKeys:  keys,
		signer:     signer,
		tokens:     leasetoken.NewReuse(0),
		verifier:   verifier,
		unknownKey: loglimit.New(unknownKeyEvery, now),

		admin:    opts.Engine,
		maxBlock: maxBlock,

		cors: cors,
	}
	if opts.RateLimit > 0 {
		s.limiter = newUserLimiter(opts.RateLimit, defaultLimiterCap, time.Now)
		s.checkLimiter = newUserLimiter(opts.RateLimit, defaultLimiterCap, time.Now)
	}
	if opts.IPRateLimit > 0 {
		s.ipLimit = newUserLimiter(opts.IPRateLimit, ipLimiterCap, time.Now)
	}
	if s.streams, err = newStreams(opts, now, logger, reg, s.storeCall, catalogs); err != nil {
		return nil, err
	}
	if s.sockets, err = s.newSockets(opts, limits, reg); err != nil {
		return nil, err
	}
	s.echo = s.newEcho()
	return s, nil
}

// Handler is the Echo instance, ready to be served by an http.Server.
func (s *Server) Handler() http.Handler { return s.echo }

// Shutdown ends every event stream (each gets a final `event: shutdown` and leaves the presence
// list; Shutdown waits for that, at most a write deadline and a few seconds, and never past the
// end of ctx), refuses new ones, and stops the server's background work (the catalog poller).
// Call it before http.Server.Shutdown, which never ends a stream by itself, and does not even
// know the HTTP/1.1 connections that streams took over from net/http: Shutdown ends those
// (closing any that outlive its wait). A stream still served by net/http when ctx ends (its
// client stopped reading) ends when the caller closes the http.Server. It does not close the
// engine, which the caller owns. It may be called more than once. Lease sockets end the same
// way: each answers the call it is serving and closes (1001); new ones are refused.
func (s *Server) Shutdown(ctx context.Context) {
	s.streams.Close(ctx) // every stream gets its final event and ends
	s.sockets.Close(ctx) // every socket answers the call it serves and ends
	s.catalogs.Close()
	s.gone.close()
}

// Stopped says, as the last thing the server logs, that an outage of the store was still in
// progress ("store calls still failed as the server stopped"), closing its "store calls fail"
// line. Call it once the http.Server has stopped serving.
func (s *Server) Stopped() { s.metrics.store.stopped() }

// Close is Shutdown with no deadline but the streams' own.
func (s *Server) Close() { s.Shutdown(context.Background()) }

// router is what *echo.Echo and *echo.Group have in common for getAndHead.
type router interface {
	GET(path string, h echo.HandlerFunc, m ...echo.MiddlewareFunc) *echo.Route
	HEAD(path string, h echo.HandlerFunc, m ...echo.MiddlewareFunc) *echo.Route
}

// getAndHead registers h behind m for GET and HEAD on path: a HEAD is answered as the GET would
// be, without the body, which net/http drops (RFC 9110 §9.3.2). Every GET route but the event
// stream has both.
func getAndHead(r router, path string, h echo.HandlerFunc, m ...echo.MiddlewareFunc) {
	h = chain(h, m...)
	r.GET(path, h)
	r.HEAD(path, h)
}

// chain is h behind the middleware m, the first outermost, as Echo orders a route's middleware;
// but built once, where Echo builds a route's middleware anew for every request (an allocation
// each). Routes are registered with chain(h, m...) rather than with m.
func chain(h echo.HandlerFunc, m ...echo.MiddlewareFunc) echo.HandlerFunc {
	for i := len(m) - 1; i >= 0; i-- {
		h = m[i](h)
	}
	return h
}

// wholeSegments answers 404 for a path with more segments than the route it reached: Echo gives
// a route's last parameter the rest of the path, so /v1/sessions/s/tabs/t/x would reach the
// handlers of /v1/sessions/{sid}/tabs/{tabId} with tabId "t/x" (a 400 for PUT, a 405 for GET).
// Routes ending in * take the rest of the path on purpose.
func wholeSegments(c echo.Context) error {
	route := c.Path()
	if route != "" && !strings.HasSuffix(route, "*") &&
		strings.Count(c.Request().URL.EscapedPath(), "/") != strings.Count(route, "/") {
		c.SetPath("") // logged and counted as no route, as Echo's own 404s are
		return echo.ErrNotFound
	}
	return nil
}

// routed is the middleware of what the route asks of the request's path and query, after CORS
// (their 400 and 404 carry its headers, so that a page can read them): the query
// (strictQuery), then the path's segments (wholeSegments). One middleware for both, as Echo
// builds the closure of each middleware anew for every request.
func routed(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if err := strictQuery(c); err != nil {
			return err
		}
		if err := wholeSegments(c); err != nil {
			return err
		}
		return next(c)
	}
}

func (s *Server) newEcho() *echo.Echo {
	e := echo.New()
	e.HideBanner = true
	e.HidePort = true
	e.Logger.SetOutput(io.Discard)
	e.HTTPErrorHandler = s.handleError
	e.Use(s.observe, framing)
	if s.cors != nil {
		e.Use(s.cors.cors)
	}
	e.Use(routed)

	getAndHead(e, "/healthz", s.healthz)
	getAndHead(e, "/readyz", s.readyz)
	getAndHead(e, "/metrics", echo.WrapHandler(promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{})))
	getAndHead(e, "/openapi.yaml", s.openapi)
	getAndHead(e, "/.well-known/jwks.json", s.jwks)
	if s.dev {
		getAndHead(e, "/dev/token", s.devToken)
	}

	v1 := e.Group("/v1") // no group middleware: it would turn unknown /v1 routes into 401s
	authed := []echo.MiddlewareFunc{s.authenticate, s.rateLimit, requireSession}
	v1.POST("/sessions/:sid/lease", chain(s.acquire, authed...))
	getAndHead(v1, "/sessions/:sid/lease", s.get, authed...)
	v1.POST("/sessions/:sid/lease/renew", chain(s.renew, authed...))
	v1.POST("/sessions/:sid/lease/release", chain(s.release, authed...))
	v1.POST("/sessions/:sid/lease/check", chain(s.check, s.authenticate, s.rateLimitChecks, requireSession))
	getAndHead(v1, "/sessions/:sid/catalog", s.sessionCatalog, authed...)
	s.registerStreams(v1, authed)
	v1.GET("/socket", s.openSocket) // authenticated by its messages (socket.go)

	admin := append(authed[:len(authed):len(authed)], requireAdmin)
	getAndHead(v1, "/admin/catalog", s.adminCatalog, admin...)
	v1.PUT("/admin/catalog", chain(s.putCatalog, admin...))
	s.registerAdmin(v1, admin)
	s.registerStatic(e)

	for _, r := range e.Routes() {
		s.routeSet[route{r.Method, r.Path}] = true
	}
	return e
}

func (s *Server) healthz(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) readyz(c echo.Context) error {
	ctx, cancel := contextWithTimeout(c, readyTimeout)
	defer cancel()
	if err := s.engine.Ping(ctx); err != nil {
		s.metrics.storeFailed("ping", err)
		if !errors.Is(err, lease.ErrUnavailable) {
			err = &lease.UnavailableError{Op: "ping", Err: err}
		}
		return err
	}
	s.metrics.store.answered()
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}
