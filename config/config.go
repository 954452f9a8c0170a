// Package config reads tablease's configuration from the environment and from the flags of
// `tablease serve`, and validates it. A flag overrides the variable of the same name
// (TABLEASE_TTL_MAX is --ttl-max). Every error names the variable, so that a bad value stops the
// start with one line that says what to fix.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/tablease/tablease/lease"
)

// Config is the validated configuration of `tablease serve`.
type Config struct {
	Addr     string // listen address
	RedisURL string // empty = memory engine

	// HS256Secret verifies access tokens signed with HS256; at least 32 bytes when set.
	HS256Secret []byte
	// PublicKeysFile is a PEM file of RS256/ES256/EdDSA public keys for access tokens.
	PublicKeysFile string
	Issuer         string
	Audience       string
	Leeway         time.Duration // at most 30s

	Limits    lease.Limits
	RateLimit float64 // requests per second per user; 0 = off

	RedisTimeout    time.Duration // bound on one store operation
	ShutdownTimeout time.Duration // bound on graceful shutdown

	LogFormat string // "json" or "text"
	LogLevel  string // "debug", "info", "warn", "error"

	Dev bool // dev mode: memory engine unless RedisURL, generated secret, /dev/token
	// SecretGenerated is true when dev mode made up HS256Secret.
	SecretGenerated bool
}

// Error is a configuration error naming the variable.
type Error struct {
	Var    string // e.g. TABLEASE_TTL_MAX
	Reason string
}

func (e *Error) Error() string { return e.Var + ": " + e.Reason }

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
		if _, _, err := net.SplitHostPort(v); err != nil {
			return fmt.Errorf("must be host:port (%q)", v)
		}
		c.Addr = v
		return nil
	}},
	{"TABLEASE_REDIS_URL", "", "redis:// or rediss:// URL; empty = in-memory engine", func(c *Config, v string) error {
		if v == "" {
			return nil
		}
		u, err := url.Parse(v)
		if err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") || u.Host == "" {
			return errors.New("must be a redis:// or rediss:// URL with a host")
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
		if _, err := os.Stat(v); err != nil {
			return fmt.Errorf("cannot read %q: %v", v, errors.Unwrap(err))
		}
		c.PublicKeysFile = v
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
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || f > 1e6 {
			return fmt.Errorf("must be a number from 0 to 1000000 (%q)", v)
		}
		c.RateLimit = f
		return nil
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
	for _, v := range variables {
		values[v.env] = v.def
		if s, ok := lookup(getenv, v.env); ok {
			values[v.env] = s
		}
	}
	fs := flag.NewFlagSet("tablease serve", flag.ContinueOnError)
	fs.SetOutput(out)
	flagValues := map[string]*string{}
	for _, v := range variables {
		if v.env == "TABLEASE_DEV" {
			continue // a boolean flag, below
		}
		flagValues[v.env] = fs.String(FlagName(v.env), "", v.help+" ("+v.env+")")
	}
	dev := fs.Bool("dev", false, "dev mode (TABLEASE_DEV=true)")
	fs.Usage = func() {
		fmt.Fprintln(out, "usage: tablease serve [flags]\n\nEvery flag may also be set by the environment variable named after it.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("serve: unexpected argument %q", fs.Arg(0))
	}
	fs.Visit(func(f *flag.Flag) {
		for env, p := range flagValues {
			if FlagName(env) == f.Name {
				values[env] = *p
			}
		}
	})
	if *dev {
		values["TABLEASE_DEV"] = "true"
	}

	var c Config
	for _, v := range variables {
		if err := v.set(&c, strings.TrimSpace(values[v.env])); err != nil {
			return Config{}, &Error{Var: v.env, Reason: err.Error()}
		}
	}
	if err := c.finish(); err != nil {
		return Config{}, err
	}
	return c, nil
}

func (c *Config) finish() error {
	if err := c.Limits.Validate(); err != nil {
		var ie *lease.InvalidError
		reason := err.Error()
		if errors.As(err, &ie) {
			reason = ie.Reason
		}
		return &Error{Var: "TABLEASE_TTL_MIN/DEFAULT/MAX/HIDDEN_MAX", Reason: reason}
	}
	if c.Dev {
		host, _, _ := net.SplitHostPort(c.Addr)
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return &Error{Var: "TABLEASE_ADDR", Reason: fmt.Sprintf("dev mode listens on a loopback address only (%q)", c.Addr)}
		}
		if c.Issuer == "" {
			c.Issuer = "tablease-dev"
		}
		if c.Audience == "" {
			c.Audience = "tablease"
		}
		return nil // the secret is generated by the caller when absent
	}
	if len(c.HS256Secret) == 0 && c.PublicKeysFile == "" {
		return &Error{Var: "TABLEASE_JWT_HS256_SECRET", Reason: "required (or TABLEASE_JWT_PUBLIC_KEYS) unless --dev"}
	}
	if c.Issuer == "" {
		return &Error{Var: "TABLEASE_JWT_ISSUER", Reason: "required unless --dev"}
	}
	if c.Audience == "" {
		return &Error{Var: "TABLEASE_JWT_AUDIENCE", Reason: "required unless --dev"}
	}
	return nil
}

func lookup(getenv func(string) string, name string) (string, bool) {
	v := getenv(name)
	return v, v != ""
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
