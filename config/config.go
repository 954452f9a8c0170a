// Package config reads tablease's configuration from the environment and from the flags of
// `tablease serve`, and validates it. A flag overrides the variable of the same name
// (TABLEASE_TTL_MAX is --ttl-max). Every error names the variable, so that a bad value stops the
// start with one line that says what to fix.
package config

import (
	"bytes"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tablease/tablease/internal/jwk"
	"github.com/tablease/tablease/internal/jwks"
	"github.com/tablease/tablease/internal/origin"
	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/lease/leaseredis"
	"github.com/tablease/tablease/owner/catalog"
	"github.com/tablease/tablease/owner/leasetoken"
)

// Config is the validated configuration of `tablease serve`.
type Config struct {
	Addr     string // listen address
	RedisURL string // empty = memory engine

	// HS256Secret verifies access tokens signed with HS256; at least 32 bytes when set.
	HS256Secret []byte
	// PublicKeys are the RS256/ES256/EdDSA public keys for access tokens, from the PEM file
	// PublicKeysFile.
	PublicKeysFile string
	PublicKeys     []jwk.Key
	// JWKSURL is the identity provider's JWK Set of access-token keys (TABLEASE_JWT_JWKS_URL):
	// https, or http to a loopback address.
	JWKSURL  string
	Issuer   string
	Audience string
	Leeway   time.Duration // at most 30s

	Limits    lease.Limits
	RateLimit float64 // requests per second per user; 0 = off
	// IPRateLimit is the requests per second per client address that fail authentication or
	// match no route (TABLEASE_IP_RATE_LIMIT); 0 = off.
	IPRateLimit float64

	RedisTimeout    time.Duration // bound on one store operation
	ShutdownTimeout time.Duration // bound on graceful shutdown

	LogFormat string // "json" or "text"
	LogLevel  string // "debug", "info", "warn", "error"
	// LogFailedRequestsOnly logs the request lines of answers below 400 at debug rather than
	// info (TABLEASE_LOG_REQUESTS=failed).
	LogFailedRequestsOnly bool

	Dev bool // dev mode: memory engine unless RedisURL, generated secret, /dev/token
	// Demo serves the two-tab demo at /demo outside dev mode too (TABLEASE_DEMO).
	Demo bool
	// SecretGenerated is true when dev mode made up HS256Secret.
	SecretGenerated bool

	// CatalogFile is the JSON tool catalog (TABLEASE_CATALOG_FILE), validated into Catalog; both
	// empty when none is configured.
	CatalogFile string
	Catalog     *catalog.Catalog

	// LeaseSigningKeyFile is the PEM private key that signs lease tokens
	// (TABLEASE_LEASE_SIGNING_KEY), loaded into LeaseSigningKey. Empty: the key is generated at
	// start, which only dev mode and the memory engine allow (one instance: nobody else needs to
	// verify its tokens after a restart).
	LeaseSigningKeyFile string
	LeaseSigningKey     leasetoken.SigningKey
	// LeasePreviousKeysFile is a PEM file of public keys published and accepted besides the
	// signing key (TABLEASE_LEASE_PREVIOUS_KEYS): the previous key after a rotation, or the next
	// one before it. Loaded into LeasePreviousKeys.
	LeasePreviousKeysFile string
	LeasePreviousKeys     []leasetoken.PublicKey
	// LeaseIssuer is the iss of lease tokens (TABLEASE_LEASE_ISSUER); guards require the same.
	LeaseIssuer string

	// AdminMaxBlock bounds the block an admin may set with a revoke (TABLEASE_ADMIN_MAX_BLOCK).
	AdminMaxBlock time.Duration

	// RevokeReplicas is how many replicas must confirm an admin's revoke before it answers 200
	// (TABLEASE_REVOKE_REPLICAS; leaseredis.Options.RevokeReplicas); 0 answers once the primary
	// ran it.
	RevokeReplicas int

	// SessionsPerUser bounds the sessions each user has state for (TABLEASE_SESSIONS_PER_USER;
	// 0 = no bound). AuditRetention is how long audit records are kept
	// (TABLEASE_AUDIT_RETENTION), AuditMaxRecords how many of each user's are kept at most
	// (TABLEASE_AUDIT_MAX_RECORDS).
	SessionsPerUser int
	AuditRetention  time.Duration
	AuditMaxRecords int

	// HandoffTimeout is how long a handoff request waits for the holder to let go
	// (TABLEASE_HANDOFF_TIMEOUT); HandoffReserve how long the lease is then kept for the requester
	// (TABLEASE_HANDOFF_RESERVE).
	HandoffTimeout time.Duration
	HandoffReserve time.Duration

	// Event streams: the most a user (TABLEASE_STREAMS_PER_USER) and the instance
	// (TABLEASE_STREAMS_PER_INSTANCE) may have open, the interval of keepalive comments
	// (TABLEASE_STREAM_KEEPALIVE), and the HMAC key of event tickets (TABLEASE_TICKET_SECRET; empty:
	// derived from HS256Secret, or generated per process).
	StreamsPerUser     int
	StreamsPerInstance int
	StreamKeepalive    time.Duration
	TicketSecret       []byte

	// Lease sockets (GET /v1/socket): the most a user (TABLEASE_SOCKETS_PER_USER) and the
	// instance (TABLEASE_SOCKETS_PER_INSTANCE) may have open, and how long a socket waits for its
	// next message in the goroutine of its last (TABLEASE_SOCKET_LINGER; 0: the default of
	// api.Options.Sockets, from the default TTL).
	SocketsPerUser     int
	SocketsPerInstance int
	SocketLinger       time.Duration

	// CORSOrigins are the origins other than the server's own that may call /v1 from a browser
	// (TABLEASE_CORS_ORIGINS), each as a browser sends it (scheme://host[:port]); "*" (dev mode
	// only) allows every origin. Empty: same origin only.
	CORSOrigins []string
}

// Error is a configuration error naming the variable, and the flag when a flag gave the value.
type Error struct {
	Var    string // e.g. TABLEASE_TTL_MAX
	Flag   string // e.g. --ttl-max, when the value came from that flag
	Reason string
}

func (e *Error) Error() string {
	if e.Flag != "" {
		return e.Flag + " (" + e.Var + "): " + e.Reason
	}
	return e.Var + ": " + e.Reason
}

type variable struct {
	env  string
	def  string
	help string
	set  func(c *Config, v string) error
}

// ErrHelp is returned by Load when -h or --help was asked for; the usage has been printed.
var ErrHelp = flag.ErrHelp

var variables = []variable{
	{"TABLEASE_ADDR", "127.0.0.1:8080", "listen address (host:port)", func(c *Config, v string) error {
		host, port, err := net.SplitHostPort(v)
		if err != nil {
			return fmt.Errorf("must be host:port (%q)", v)
		}
		// What the listen would refuse only once the rest has started.
		if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
			return fmt.Errorf("the port must be a number from 0 to 65535 (%q)", v)
		}
		if host != "" && strings.Trim(host, "0123456789.") == "" && net.ParseIP(host) == nil {
			return fmt.Errorf("the host is made of digits and dots but is no IP address (%q): give an IP address, a host name, or no host for every interface", v)
		}
		c.Addr = v
		return nil
	}},
	{"TABLEASE_REDIS_URL", "", "redis://, rediss:// or unix:// URL; empty = in-memory engine", func(c *Config, v string) error {
		if v == "" {
			return nil
		}
		// leaseredis.CheckURL reads it as the engine will, options included (a Sentinel's
		// master_name, cluster=true, go-redis's own), and names the problem without the password.
		problem := func() string {
			return strings.TrimPrefix(leaseredis.CheckURL(v).Error(), "leaseredis: bad Redis URL: ")
		}
		u, err := url.Parse(v)
		switch {
		case err != nil:
			return fmt.Errorf("must be a redis:// or rediss:// URL with a host, or unix:// with a socket's path (%s)", problem())
		case u.Scheme == "unix" && u.Path == "", u.Scheme != "unix" && ((u.Scheme != "redis" && u.Scheme != "rediss") || u.Host == ""):
			return errors.New("must be a redis:// or rediss:// URL with a host, or unix:// with a socket's path")
		case leaseredis.CheckURL(v) != nil:
			return errors.New(problem())
		}
		c.RedisURL = v
		return nil
	}},
	{"TABLEASE_JWT_HS256_SECRET", "", "HS256 secret for access tokens (at least 32 bytes)", func(c *Config, v string) error {
		if v == "" {
			return nil
		}
		if len(v) < 32 {
			return fmt.Errorf("must be at least 32 bytes (got %d)", len(v))
		}
		c.HS256Secret = []byte(v)
		return nil
	}},
	{"TABLEASE_JWT_PUBLIC_KEYS", "", "PEM file of RS256/ES256/EdDSA public keys for access tokens", func(c *Config, v string) error {
		if v == "" {
			return nil
		}
		keys, err := parseFile(v, 1<<20, jwk.ParsePublicKeysPEM)
		if err != nil {
			return err
		}
		c.PublicKeysFile, c.PublicKeys = v, keys
		return nil
	}},
	{"TABLEASE_JWT_JWKS_URL", "", "URL of the identity provider's JWK Set of RS256/ES256/EdDSA keys for access tokens (https)", func(c *Config, v string) error {
		if v == "" {
			return nil
		}
		if err := jwks.CheckSecureURL(v); err != nil {
			return err
		}
		c.JWKSURL = v
		return nil
	}},
	{"TABLEASE_JWT_ISSUER", "", "required iss claim of access tokens", func(c *Config, v string) error { c.Issuer = v; return nil }},
	{"TABLEASE_JWT_AUDIENCE", "", "required aud claim of access tokens", func(c *Config, v string) error { c.Audience = v; return nil }},
	{"TABLEASE_JWT_LEEWAY", "5s", "clock leeway for exp/nbf/iat (at most 30s)", func(c *Config, v string) error {
		d, err := duration(v, 0, 30*time.Second)
		c.Leeway = d
		return err
	}},
	{"TABLEASE_TTL_MIN", "1s", "shortest lease TTL granted", func(c *Config, v string) (err error) {
		c.Limits.Min, err = duration(v, time.Millisecond, time.Hour)
		return err
	}},
	{"TABLEASE_TTL_DEFAULT", "45s", "lease TTL when none is asked for", func(c *Config, v string) (err error) {
		c.Limits.Default, err = duration(v, time.Millisecond, time.Hour)
		return err
	}},
	{"TABLEASE_TTL_MAX", "120s", "longest lease TTL for a visible tab", func(c *Config, v string) (err error) {
		c.Limits.Max, err = duration(v, time.Millisecond, time.Hour)
		return err
	}},
	{"TABLEASE_TTL_HIDDEN_MAX", "150s", "longest lease TTL for a hidden tab", func(c *Config, v string) (err error) {
		c.Limits.HiddenMax, err = duration(v, time.Millisecond, time.Hour)
		return err
	}},
	{"TABLEASE_RATE_LIMIT", "50", "requests per second per user (burst twice that); 0 = off", func(c *Config, v string) error {
		f, err := rate(v)
		c.RateLimit = f
		return err
	}},
	{"TABLEASE_IP_RATE_LIMIT", "10", "requests per second per client address (burst twice that) that fail authentication or match no route; 0 = off", func(c *Config, v string) error {
		f, err := rate(v)
		c.IPRateLimit = f
		return err
	}},
	{"TABLEASE_REDIS_TIMEOUT", "2s", "bound on one Redis operation", func(c *Config, v string) (err error) {
		c.RedisTimeout, err = duration(v, 10*time.Millisecond, time.Minute)
		return err
	}},
	{"TABLEASE_SHUTDOWN_TIMEOUT", "10s", "bound on graceful shutdown", func(c *Config, v string) (err error) {
		c.ShutdownTimeout, err = duration(v, 0, 10*time.Minute)
		return err
	}},
	{"TABLEASE_LOG_FORMAT", "json", "log format: json or text", func(c *Config, v string) error {
		if v != "json" && v != "text" {
			return fmt.Errorf(`must be "json" or "text" (%q)`, v)
		}
		c.LogFormat = v
		return nil
	}},
	{"TABLEASE_LOG_LEVEL", "info", "log level: debug, info, warn or error", func(c *Config, v string) error {
		switch v {
		case "debug", "info", "warn", "error":
			c.LogLevel = v
			return nil
		}
		return fmt.Errorf("must be debug, info, warn or error (%q)", v)
	}},
	{"TABLEASE_LOG_REQUESTS", "all", "request lines at info: all, or failed (answers of 400 and above; the others at debug)", func(c *Config, v string) error {
		switch v {
		case "all", "failed":
			c.LogFailedRequestsOnly = v == "failed"
			return nil
		}
		return fmt.Errorf(`must be "all" or "failed" (%q)`, v)
	}},
	{"TABLEASE_CATALOG_FILE", "", "JSON file of the tool catalog (validated at start)", func(c *Config, v string) error {
		if v == "" {
			return nil
		}
		cat, err := parseFile(v, lease.MaxDocumentSize, catalog.Parse)
		if err != nil {
			return err
		}
		c.CatalogFile, c.Catalog = v, cat
		return nil
	}},
	{"TABLEASE_LEASE_SIGNING_KEY", "", "PEM file of the Ed25519 (or P-256) private key that signs lease tokens (tablease keygen makes one)", func(c *Config, v string) error {
		if v == "" {
			return nil
		}
		k, err := parseFile(v, 64<<10, leasetoken.ParsePrivateKeyPEM)
		if err != nil {
			return err
		}
		c.LeaseSigningKeyFile, c.LeaseSigningKey = v, k
		return nil
	}},
	{"TABLEASE_LEASE_PREVIOUS_KEYS", "", "PEM file of public keys still accepted for lease tokens (the previous key after a rotation)", func(c *Config, v string) error {
		if v == "" {
			return nil
		}
		keys, err := parseFile(v, 1<<20, parsePublicKeys)
		if err != nil {
			return err
		}
		c.LeasePreviousKeysFile, c.LeasePreviousKeys = v, keys
		return nil
	}},
	{"TABLEASE_LEASE_ISSUER", defaultLeaseIssuer, "iss claim of lease tokens (guards must require the same); tablease-dev in dev mode", func(c *Config, v string) error {
		if v == "" || strings.ContainsAny(v, " \t\r\n") {
			return fmt.Errorf("must be a non-empty word (%q)", v)
		}
		c.LeaseIssuer = v
		return nil
	}},
	{"TABLEASE_HANDOFF_TIMEOUT", "15s", "how long a handoff request waits for the holder to let go", func(c *Config, v string) (err error) {
		c.HandoffTimeout, err = duration(v, 100*time.Millisecond, 10*time.Minute)
		return err
	}},
	{"TABLEASE_HANDOFF_RESERVE", "10s", "how long a released lease is kept for the tab that asked for the handoff", func(c *Config, v string) (err error) {
		c.HandoffReserve, err = duration(v, 100*time.Millisecond, 10*time.Minute)
		return err
	}},
	{"TABLEASE_ADMIN_MAX_BLOCK", "1h", "longest block of new grants an admin may set with a revoke", func(c *Config, v string) (err error) {
		c.AdminMaxBlock, err = duration(v, time.Second, 7*24*time.Hour)
		return err
	}},
	{"TABLEASE_REVOKE_REPLICAS", "0", "replicas of Redis that must confirm an admin's revoke (WAIT) before it answers 200; fewer within TABLEASE_REDIS_TIMEOUT is 503; 0 = answer once the primary ran it", func(c *Config, v string) (err error) {
		c.RevokeReplicas, err = count(v, 0, 100)
		return err
	}},
	{"TABLEASE_SESSIONS_PER_USER", "1000", "sessions one user may have state for (held, or used in the last ten minutes); more are 409 TOO_MANY_SESSIONS; 0 = no bound", func(c *Config, v string) (err error) {
		c.SessionsPerUser, err = count(v, 0, 10_000_000)
		return err
	}},
	{"TABLEASE_AUDIT_RETENTION", "168h", "how long audit records are kept", func(c *Config, v string) (err error) {
		c.AuditRetention, err = duration(v, time.Hour, 366*24*time.Hour)
		return err
	}},
	{"TABLEASE_AUDIT_MAX_RECORDS", "10000", "audit records kept per user at most, the oldest dropped first", func(c *Config, v string) (err error) {
		c.AuditMaxRecords, err = count(v, 100, 10_000_000)
		return err
	}},
	{"TABLEASE_STREAMS_PER_USER", "32", "event streams one user may have open on an instance; more are 429", func(c *Config, v string) (err error) {
		c.StreamsPerUser, err = count(v, 1, 100_000)
		return err
	}},
	{"TABLEASE_STREAMS_PER_INSTANCE", "10000", "event streams an instance serves at most; more are 429", func(c *Config, v string) (err error) {
		c.StreamsPerInstance, err = count(v, 1, 10_000_000)
		return err
	}},
	{"TABLEASE_SOCKETS_PER_USER", "32", "lease sockets one user may have open on an instance; more are 429", func(c *Config, v string) (err error) {
		c.SocketsPerUser, err = count(v, 1, 100_000)
		return err
	}},
	{"TABLEASE_SOCKETS_PER_INSTANCE", "10000", "lease sockets an instance serves at most; more are 429", func(c *Config, v string) (err error) {
		c.SocketsPerInstance, err = count(v, 1, 10_000_000)
		return err
	}},
	{"TABLEASE_SOCKET_LINGER", "", "how long a lease socket waits for its next message in the goroutine of its last call, before it waits with a small stack (default: the renew interval of a lease of TABLEASE_TTL_DEFAULT plus 2s)", func(c *Config, v string) (err error) {
		if v == "" {
			return nil
		}
		c.SocketLinger, err = duration(v, time.Millisecond, time.Hour)
		return err
	}},
	{"TABLEASE_STREAM_KEEPALIVE", "15s", "interval of the keepalive comments of event streams", func(c *Config, v string) (err error) {
		c.StreamKeepalive, err = duration(v, time.Second, 5*time.Minute)
		return err
	}},
	{"TABLEASE_TICKET_SECRET", "", "HMAC secret of event tickets, at least 32 bytes, the same on every instance (default: derived from TABLEASE_JWT_HS256_SECRET)", func(c *Config, v string) error {
		if v == "" {
			return nil
		}
		if len(v) < 32 {
			return fmt.Errorf("must be at least 32 bytes (got %d)", len(v))
		}
		c.TicketSecret = []byte(v)
		return nil
	}},
	{"TABLEASE_CORS_ORIGINS", "", "comma-separated origins (scheme://host[:port]) allowed to call /v1 from a browser; * = every origin, dev mode only; empty = same origin only", func(c *Config, v string) (err error) {
		c.CORSOrigins, err = corsOrigins(v)
		return err
	}},
	{"TABLEASE_DEMO", "false", "serve the two-tab demo at /demo (dev mode always does)", func(c *Config, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("must be true or false (%q)", v)
		}
		c.Demo = b
		return nil
	}},
	{"TABLEASE_DEV", "false", "dev mode: memory engine unless a Redis URL is set, generated secret, /dev/token", func(c *Config, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("must be true or false (%q)", v)
		}
		c.Dev = b
		return nil
	}},
}

// FlagName is the flag of `tablease serve` for an environment variable: TABLEASE_TTL_MAX → ttl-max.
func FlagName(env string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(env, "TABLEASE_")), "_", "-")
}

// Load reads the configuration: defaults, then the environment (through getenv), then the flags in
// args (the arguments after `serve`). Usage goes to out on --help.
func Load(args []string, getenv func(string) string, out io.Writer) (Config, error) {
	values := map[string]string{}
	given := map[string]bool{} // the variables set by the environment or a flag
	for _, v := range variables {
		values[v.env] = v.def
		if s, ok := lookup(getenv, v.env); ok {
			values[v.env], given[v.env] = s, true
		}
	}
	fs := flag.NewFlagSet("tablease serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // a bad flag is the error Load answers, in one line
	fs.Usage = func() {}
	flagValues := map[string]*string{}
	boolValues := map[string]*bool{}
	for _, v := range variables {
		if boolFlags[v.env] {
			// --dev, --demo, and --dev=false, which wins over TABLEASE_DEV=true as every flag does.
			boolValues[v.env] = fs.Bool(FlagName(v.env), false, v.help+" ("+v.env+"=true)")
			continue
		}
		help := v.help + " (" + v.env
		if v.def != "" {
			help += "; default " + v.def // the flag's own default is "": unset, so the variable counts
		}
		flagValues[v.env] = fs.String(FlagName(v.env), "", help+")")
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(out, "usage: tablease serve [flags]\n\nEvery flag may also be set by the environment variable named after it.")
			fs.SetOutput(out)
			fs.PrintDefaults()
			return Config{}, err
		}
		return Config{}, fmt.Errorf("%w (tablease serve --help lists the flags)", err)
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("serve: unexpected argument %q", fs.Arg(0))
	}
	flagged := map[string]bool{} // the variables a flag set
	fs.Visit(func(f *flag.Flag) {
		for env, p := range boolValues {
			if FlagName(env) == f.Name {
				values[env], flagged[env] = strconv.FormatBool(*p), true
			}
		}
		for env, p := range flagValues {
			if FlagName(env) == f.Name {
				values[env], given[env], flagged[env] = *p, true, true
			}
		}
	})

	var c Config
	for _, v := range variables {
		if err := v.set(&c, strings.TrimSpace(values[v.env])); err != nil {
			e := &Error{Var: v.env, Reason: err.Error()}
			if flagged[v.env] {
				e.Flag = "--" + FlagName(v.env)
			}
			return Config{}, e
		}
	}
	if err := c.finish(given); err != nil {
		return Config{}, err
	}
	return c, nil
}

// finish checks what the variables say together; given holds the variables the environment or a
// flag set, so that an error names the one the operator set rather than a default.
func (c *Config) finish(given map[string]bool) error {
	if err := c.Limits.Validate(); err != nil {
		return c.limitsError(err, given)
	}
	if c.RedisURL != "" && !c.Dev && c.LeaseSigningKey.IsZero() {
		return &Error{Var: "TABLEASE_LEASE_SIGNING_KEY", Reason: "required with TABLEASE_REDIS_URL (unless --dev): every instance must sign lease tokens with the same key; create one with `tablease keygen --out lease-key.pem`"}
	}
	if c.RedisURL == "" && c.RevokeReplicas > 0 {
		return &Error{Var: "TABLEASE_REVOKE_REPLICAS", Reason: "needs TABLEASE_REDIS_URL: the memory engine has no replicas"}
	}
	if !c.Dev && slices.Contains(c.CORSOrigins, "*") {
		return &Error{Var: "TABLEASE_CORS_ORIGINS", Reason: `"*" (every origin) is allowed in dev mode only; list the origins of your apps`}
	}
	if c.Dev {
		host, _, _ := net.SplitHostPort(c.Addr)
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return &Error{Var: "TABLEASE_ADDR", Reason: fmt.Sprintf("dev mode listens on a loopback address only (%q)", c.Addr)}
		}
		if c.Issuer == "" {
			c.Issuer = devIssuer
		}
		if c.Audience == "" {
			c.Audience = "tablease"
		}
		// Lease tokens too carry the dev issuer, which no deployment accepts: a dev instance given
		// a deployment's signing key still signs nothing its guards take.
		if c.LeaseIssuer != defaultLeaseIssuer && c.LeaseIssuer != devIssuer {
			return &Error{Var: "TABLEASE_LEASE_ISSUER", Reason: fmt.Sprintf("dev mode signs lease tokens as %q, which only dev setups accept; leave it unset", devIssuer)}
		}
		c.LeaseIssuer = devIssuer
		return nil // the secret is generated by the caller when absent
	}
	if len(c.HS256Secret) == 0 && c.PublicKeysFile == "" && c.JWKSURL == "" {
		return &Error{Var: "TABLEASE_JWT_HS256_SECRET", Reason: "required (or TABLEASE_JWT_PUBLIC_KEYS, or TABLEASE_JWT_JWKS_URL) unless --dev"}
	}
	if c.Issuer == "" {
		return &Error{Var: "TABLEASE_JWT_ISSUER", Reason: "required unless --dev"}
	}
	if c.Issuer == devIssuer {
		return &Error{Var: "TABLEASE_JWT_ISSUER", Reason: fmt.Sprintf("%q is the issuer of dev-mode tokens (/dev/token; tablease token without TABLEASE_JWT_ISSUER), accepted in dev mode only; use your identity provider's", devIssuer)}
	}
	if c.LeaseIssuer == devIssuer {
		return &Error{Var: "TABLEASE_LEASE_ISSUER", Reason: fmt.Sprintf("%q is the issuer of dev-mode lease tokens, which guards of a deployment must refuse; use another", devIssuer)}
	}
	if c.Audience == "" {
		return &Error{Var: "TABLEASE_JWT_AUDIENCE", Reason: "required unless --dev"}
	}
	return nil
}

// devIssuer is api.DevIssuer: the iss of the tokens dev mode mints (access tokens and lease
// tokens), which only dev mode accepts.
const devIssuer = "tablease-dev"

// defaultLeaseIssuer is api.DefaultLeaseIssuer.
const defaultLeaseIssuer = "tablease"

// boolFlags are the variables whose flags are booleans: --dev rather than --dev=true.
var boolFlags = map[string]bool{"TABLEASE_DEV": true, "TABLEASE_DEMO": true}

// readElsewhere are the TABLEASE_ variables that serve does not read and others do: the admin
// CLI's, docker-compose.yml's, and (by prefix) the test suite's and benchmarks'.
var readElsewhere = []string{"TABLEASE_TOKEN", "TABLEASE_URL", "TABLEASE_ENV_FILE", "TABLEASE_VERSION",
	"TABLEASE_ARTIFACTS", "TABLEASE_CHROMIUM", "TABLEASE_TEST_", "TABLEASE_BENCH_"}

// Unknown lists the names of environ (NAME=value pairs, as os.Environ gives them) that start
// with TABLEASE_ and that nothing reads: misspelt, most likely, and so ignored by mistake. Each
// comes with the variable of serve it is one or two letters away from, if any.
func Unknown(environ []string) (names, nearest []string) {
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "TABLEASE_") || known(name) {
			continue
		}
		near := ""
		for _, v := range variables {
			if editDistance(name, v.env) <= 2 {
				near = v.env
				break
			}
		}
		names, nearest = append(names, name), append(nearest, near)
	}
	return names, nearest
}

func known(name string) bool {
	for _, v := range variables {
		if v.env == name {
			return true
		}
	}
	for _, other := range readElsewhere {
		if name == other || (strings.HasSuffix(other, "_") && strings.HasPrefix(name, other)) {
			return true
		}
	}
	return false
}

// editDistance is the Levenshtein distance of a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

func lookup(getenv func(string) string, name string) (string, bool) {
	v := getenv(name)
	return v, strings.TrimSpace(v) != ""
}

// ttlVar is a field of lease.Limits, its variable and its value.
type ttlVar struct {
	field, env string
	value      func(lease.Limits) time.Duration
}

// ttlVars are the fields of lease.Limits in their order.
var ttlVars = []ttlVar{
	{"Min", "TABLEASE_TTL_MIN", func(l lease.Limits) time.Duration { return l.Min }},
	{"Default", "TABLEASE_TTL_DEFAULT", func(l lease.Limits) time.Duration { return l.Default }},
	{"Max", "TABLEASE_TTL_MAX", func(l lease.Limits) time.Duration { return l.Max }},
	{"HiddenMax", "TABLEASE_TTL_HIDDEN_MAX", func(l lease.Limits) time.Duration { return l.HiddenMax }},
}

// limitsError is err, an error of lease.Limits.Validate, as an Error naming variables. When two
// bounds are out of order, it names the one the operator set: raising TABLEASE_TTL_MAX alone
// above the hidden maximum's default is an error of TABLEASE_TTL_MAX.
func (c *Config) limitsError(err error, given map[string]bool) error {
	var ie *lease.InvalidError
	if !errors.As(err, &ie) {
		return &Error{Var: ttlVars[0].env, Reason: err.Error()}
	}
	names := make([]string, 0, 2*len(ttlVars))
	for _, v := range ttlVars {
		names = append(names, v.field, v.env)
	}
	vars := strings.NewReplacer(names...)
	i := slices.IndexFunc(ttlVars, func(v ttlVar) bool { return v.field == ie.Field })
	if i > 0 && !given[ttlVars[i].env] && given[ttlVars[i-1].env] {
		set, other := ttlVars[i-1], ttlVars[i]
		return &Error{Var: set.env, Reason: fmt.Sprintf("%v must not be above %s (%v, its default): raise them together",
			set.value(c.Limits), other.env, other.value(c.Limits))}
	}
	return &Error{Var: vars.Replace(ie.Field), Reason: vars.Replace(ie.Reason)}
}

// corsOrigins reads a comma-separated list of origins, each as origin.Parse reads it, or "*".
// Empty is none; an empty item (",,", a trailing comma) is an error.
func corsOrigins(v string) ([]string, error) {
	if v == "" {
		return nil, nil
	}
	var out []string
	for _, item := range strings.Split(v, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			return nil, errors.New("holds an empty item; give origins separated by commas, such as https://app.example.com,http://localhost:5173")
		}
		if item != "*" {
			o, err := origin.Parse(item)
			if err != nil {
				return nil, fmt.Errorf("%s; give origins such as https://app.example.com", err)
			}
			item = o
		}
		if !slices.Contains(out, item) {
			out = append(out, item)
		}
	}
	return out, nil
}

// rate reads a rate limit: a decimal number (digits, with a fraction after a point) from 0 to
// 1000000. strconv.ParseFloat alone would also take 1_000, 1e3, 0x1p4, +5 and Inf, which are
// not what the README describes.
func rate(v string) (float64, error) {
	bad := fmt.Errorf("must be a decimal number from 0 to 1000000, such as 50 or 0.5 (%q)", v)
	whole, frac, _ := strings.Cut(v, ".")
	if digits := whole + frac; digits == "" || strings.Trim(digits, "0123456789") != "" {
		return 0, bad
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f > 1e6 {
		return 0, bad
	}
	return f, nil
}

// count reads a whole number in [lo, hi].
func count(v string, lo, hi int) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("must be a whole number from %d to %d (%q)", lo, hi, v)
	}
	return n, nil
}

func duration(v string, lo, hi time.Duration) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("must be a Go duration such as 45s (%q)", v)
	}
	if d < lo || d > hi {
		return 0, fmt.Errorf("must be between %s and %s (%s)", lo, hi, d)
	}
	if d%time.Millisecond != 0 {
		return 0, fmt.Errorf("must be whole milliseconds (%s)", d)
	}
	return d, nil
}

// readFile reads a configuration file of at most limit bytes, with an error that names the file
// and fits on one line.
func readFile(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, fmt.Errorf("cannot read %q: %v", path, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("cannot read %q: %v", path, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%q is larger than %d bytes", path, limit)
	}
	return data, nil
}

// parseFile reads the file path, at most limit bytes, and parses it with parse; an error names the
// file and says why on one line.
func parseFile[T any](path string, limit int64, parse func([]byte) (T, error)) (T, error) {
	data, err := readFile(path, limit)
	if err != nil {
		var zero T
		return zero, err
	}
	out, err := parse(data)
	if err != nil {
		return out, fmt.Errorf("%s: %s", path, oneLine(strings.TrimPrefix(err.Error(), "leasetoken: ")))
	}
	return out, nil
}

// parsePublicKeys reads every PEM block of data as a lease-token public key: "PUBLIC KEY" blocks,
// or private keys of which only the public half is kept.
func parsePublicKeys(data []byte) ([]leasetoken.PublicKey, error) {
	var keys []leasetoken.PublicKey
	for n := 1; ; n++ {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		k, err := leasetoken.ParsePublicKeyPEM(pem.EncodeToMemory(block))
		if err != nil {
			return nil, fmt.Errorf("PEM block %d: %s", n, strings.TrimPrefix(err.Error(), "leasetoken: "))
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, errors.New("no PEM block found")
	}
	if len(bytes.TrimSpace(data)) > 0 {
		return nil, errors.New("data after the last PEM block is not PEM")
	}
	return keys, nil
}

// oneLine keeps an error message on one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
