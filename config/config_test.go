package config

import (
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tablease/tablease/owner/leasetoken"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

var goodSecret = strings.Repeat("s", 32)

func TestLoadDefaultsInDevMode(t *testing.T) {
	c, err := Load([]string{"--dev"}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Addr != "127.0.0.1:8080" || !c.Dev || c.Limits.Default != 45*time.Second || c.Limits.HiddenMax != 150*time.Second || c.RateLimit != 50 {
		t.Fatalf("unexpected defaults: %+v", c)
	}
	if c.Issuer == "" || c.Audience == "" {
		t.Fatalf("dev mode should default issuer and audience: %+v", c)
	}
}

func TestFlagsOverrideTheEnvironment(t *testing.T) {
	c, err := Load([]string{"--ttl-max", "90s", "--addr", "127.0.0.1:0"}, env(map[string]string{
		"TABLEASE_TTL_MAX": "100s", "TABLEASE_JWT_HS256_SECRET": goodSecret,
		"TABLEASE_JWT_ISSUER": "idp", "TABLEASE_JWT_AUDIENCE": "tablease",
	}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Limits.Max != 90*time.Second || c.Addr != "127.0.0.1:0" {
		t.Fatalf("flags did not win: %+v", c)
	}
}

// A bad value a flag gave is named by the flag as well as its variable: the operator typed the flag.
func TestABadFlagIsNamedAsTyped(t *testing.T) {
	_, err := Load([]string{"--dev", "--rate-limit="}, env(nil), io.Discard)
	var e *Error
	if !errors.As(err, &e) || e.Var != "TABLEASE_RATE_LIMIT" || !strings.HasPrefix(err.Error(), "--rate-limit (TABLEASE_RATE_LIMIT): ") {
		t.Fatalf("Load = %v", err)
	}
	_, err = Load([]string{"--dev"}, env(map[string]string{"TABLEASE_RATE_LIMIT": "x"}), io.Discard)
	if err == nil || !strings.HasPrefix(err.Error(), "TABLEASE_RATE_LIMIT: ") {
		t.Fatalf("from the environment: %v", err)
	}
}

// TestTheDevFlagWinsBothWays: --dev=false turns off the dev mode TABLEASE_DEV asks for, as every
// flag wins over its variable.
func TestTheDevFlagWinsBothWays(t *testing.T) {
	prod := map[string]string{"TABLEASE_DEV": "true", "TABLEASE_JWT_HS256_SECRET": goodSecret,
		"TABLEASE_JWT_ISSUER": "idp", "TABLEASE_JWT_AUDIENCE": "tablease"}
	if c, err := Load([]string{"--dev=false"}, env(prod), io.Discard); err != nil || c.Dev {
		t.Errorf("--dev=false with TABLEASE_DEV=true: dev mode %v, %v; want it off", c.Dev, err)
	}
	if c, err := Load(nil, env(prod), io.Discard); err != nil || !c.Dev {
		t.Errorf("TABLEASE_DEV=true alone: dev mode %v, %v; want it on", c.Dev, err)
	}
	if c, err := Load([]string{"--dev"}, env(nil), io.Discard); err != nil || !c.Dev {
		t.Errorf("--dev: dev mode %v, %v; want it on", c.Dev, err)
	}
}

func TestBadValuesNameTheirVariable(t *testing.T) {
	base := map[string]string{"TABLEASE_JWT_HS256_SECRET": goodSecret, "TABLEASE_JWT_ISSUER": "idp", "TABLEASE_JWT_AUDIENCE": "aud"}
	cases := []struct {
		name, key, value, wantVar string
	}{
		{"a short HS256 secret is refused", "TABLEASE_JWT_HS256_SECRET", "short", "TABLEASE_JWT_HS256_SECRET"},
		{"a TTL that is not a duration is refused", "TABLEASE_TTL_MAX", "ten", "TABLEASE_TTL_MAX"},
		{"a leeway over 30s is refused", "TABLEASE_JWT_LEEWAY", "31s", "TABLEASE_JWT_LEEWAY"},
		{"an address without a port is refused", "TABLEASE_ADDR", "localhost", "TABLEASE_ADDR"},
		{"a port out of range is refused", "TABLEASE_ADDR", "127.0.0.1:99999", "TABLEASE_ADDR"},
		{"a port that is not a number is refused", "TABLEASE_ADDR", "127.0.0.1:abc", "TABLEASE_ADDR"},
		{"a host that is no IP address is refused", "TABLEASE_ADDR", "256.1.1.1:80", "TABLEASE_ADDR"},
		{"a non-redis URL is refused", "TABLEASE_REDIS_URL", "http://x", "TABLEASE_REDIS_URL"},
		{"a unix URL without a path is refused", "TABLEASE_REDIS_URL", "unix://", "TABLEASE_REDIS_URL"},
		{"a malformed Redis URL is refused", "TABLEASE_REDIS_URL", "redis://[::1", "TABLEASE_REDIS_URL"},
		{"a Sentinel URL with a bad option is refused", "TABLEASE_REDIS_URL", "redis://s:26379?master_name=m&dial_timeout=soon", "TABLEASE_REDIS_URL"},
		{"a Cluster URL with a bad option is refused", "TABLEASE_REDIS_URL", "redis://n:6379?cluster=true&pool_size=many", "TABLEASE_REDIS_URL"},
		{"a Redis URL with an unknown option is refused", "TABLEASE_REDIS_URL", "redis://n:6379?pool=9", "TABLEASE_REDIS_URL"},
		{"a negative rate limit is refused", "TABLEASE_RATE_LIMIT", "-1", "TABLEASE_RATE_LIMIT"},
		{"a rate limit that is not a number is refused", "TABLEASE_RATE_LIMIT", "NaN", "TABLEASE_RATE_LIMIT"},
		{"an address rate limit that is not a number is refused", "TABLEASE_IP_RATE_LIMIT", "nan", "TABLEASE_IP_RATE_LIMIT"},
		{"an unknown log format is refused", "TABLEASE_LOG_FORMAT", "xml", "TABLEASE_LOG_FORMAT"},
		{"a handoff timeout of an hour is refused", "TABLEASE_HANDOFF_TIMEOUT", "1h", "TABLEASE_HANDOFF_TIMEOUT"},
		{"a handoff reserve that is not a duration is refused", "TABLEASE_HANDOFF_RESERVE", "soon", "TABLEASE_HANDOFF_RESERVE"},
		// Two bounds out of order: the error names the one set, not the other's default.
		{"a default above the maximum is refused", "TABLEASE_TTL_DEFAULT", "200s", "TABLEASE_TTL_DEFAULT"},
		{"a minimum above the default is refused", "TABLEASE_TTL_MIN", "50s", "TABLEASE_TTL_MIN"},
		{"a maximum above the hidden maximum is refused", "TABLEASE_TTL_MAX", "200s", "TABLEASE_TTL_MAX"},
		{"a hidden maximum below the maximum is refused", "TABLEASE_TTL_HIDDEN_MAX", "100s", "TABLEASE_TTL_HIDDEN_MAX"},
		{"a missing issuer is refused outside dev mode", "TABLEASE_JWT_ISSUER", "", "TABLEASE_JWT_ISSUER"},
		{"a missing public keys file is refused", "TABLEASE_JWT_PUBLIC_KEYS", "/nonexistent/keys.pem", "TABLEASE_JWT_PUBLIC_KEYS"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := map[string]string{}
			for k, v := range base {
				m[k] = v
			}
			m[tc.key] = tc.value
			_, err := Load(nil, env(m), io.Discard)
			var ce *Error
			if !errors.As(err, &ce) || ce.Var != tc.wantVar {
				t.Fatalf("got %v, want an error naming %s", err, tc.wantVar)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error spans lines: %q", err)
			}
			if tc.key == "TABLEASE_JWT_HS256_SECRET" && strings.Contains(err.Error(), tc.value) {
				t.Fatalf("error leaks the secret: %q", err)
			}
		})
	}
}

func TestSecretIsRequiredOutsideDevMode(t *testing.T) {
	_, err := Load(nil, env(map[string]string{"TABLEASE_JWT_ISSUER": "i", "TABLEASE_JWT_AUDIENCE": "a"}), io.Discard)
	var ce *Error
	if !errors.As(err, &ce) || ce.Var != "TABLEASE_JWT_HS256_SECRET" {
		t.Fatalf("got %v", err)
	}
}

func TestFlagNames(t *testing.T) {
	if got := FlagName("TABLEASE_TTL_HIDDEN_MAX"); got != "ttl-hidden-max" {
		t.Fatal(got)
	}
}

func TestDevModeListensOnLoopbackOnly(t *testing.T) {
	_, err := Load([]string{"--dev", "--addr", "0.0.0.0:8080"}, env(nil), io.Discard)
	var ce *Error
	if !errors.As(err, &ce) || ce.Var != "TABLEASE_ADDR" {
		t.Fatalf("got %v", err)
	}
	for _, addr := range []string{"127.0.0.1:0", "[::1]:8080", "localhost:8080"} {
		if _, err := Load([]string{"--dev", "--addr", addr}, env(nil), io.Discard); err != nil {
			t.Fatalf("%s: %v", addr, err)
		}
	}
}

// writeFile writes data to a file in a temporary directory and returns its path.
func writeFile(t *testing.T, name, data string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func prodEnv(extra map[string]string) map[string]string {
	m := map[string]string{"TABLEASE_JWT_HS256_SECRET": goodSecret, "TABLEASE_JWT_ISSUER": "idp", "TABLEASE_JWT_AUDIENCE": "aud"}
	for k, v := range extra {
		m[k] = v
	}
	return m
}

func TestTheCatalogFileIsValidatedAtStart(t *testing.T) {
	good := writeFile(t, "catalog.json", `{"tools":[{"name":"search_events","description":"Search.","annotations":{"readOnlyHint":true}}]}`)
	c, err := Load(nil, env(prodEnv(map[string]string{"TABLEASE_CATALOG_FILE": good})), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Catalog == nil || len(c.Catalog.Tools) != 1 || c.CatalogFile != good {
		t.Fatalf("catalog not loaded: %+v", c.Catalog)
	}

	cases := []struct {
		name, data, want string
	}{
		{"a read-only tool marked destructive", `{"tools":[{"name":"x","description":"d","annotations":{"readOnlyHint":true,"destructiveHint":true}}]}`, `tools[0] "x": annotations.destructiveHint`},
		{"an unknown field", `{"tools":[{"name":"x","description":"d","colour":"red"}]}`, `tools[0] "x"`},
		{"two profiles for one route", `{"tools":[{"name":"x","description":"d"},{"name":"x","description":"e","routes":["/a"]}]}`, `tools[1] "x"`},
		{"a bad route pattern", `{"tools":[{"name":"x","description":"d","routes":["events"]}]}`, `routes[0]`},
		{"JSON that does not parse", "{\n\"tools\": [\n", "catalog:"},
	}
	for _, tc := range cases {
		t.Run(tc.name+" is refused with one line naming the variable and the problem", func(t *testing.T) {
			p := writeFile(t, "catalog.json", tc.data)
			_, err := Load(nil, env(prodEnv(map[string]string{"TABLEASE_CATALOG_FILE": p})), io.Discard)
			var ce *Error
			if !errors.As(err, &ce) || ce.Var != "TABLEASE_CATALOG_FILE" {
				t.Fatalf("got %v, want an error naming TABLEASE_CATALOG_FILE", err)
			}
			if msg := err.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, tc.want) || !strings.Contains(msg, p) {
				t.Fatalf("error %q should be one line naming the file and %q", msg, tc.want)
			}
		})
	}
	_, err = Load(nil, env(prodEnv(map[string]string{"TABLEASE_CATALOG_FILE": "/nonexistent/catalog.json"})), io.Discard)
	var ce *Error
	if !errors.As(err, &ce) || ce.Var != "TABLEASE_CATALOG_FILE" {
		t.Fatalf("a missing file: %v", err)
	}
}

func TestLeaseSigningKeys(t *testing.T) {
	key, err := leasetoken.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	privPEM, _ := key.MarshalPEM()
	pubPEM, _ := key.Public().MarshalPEM()
	other, _ := leasetoken.GenerateKey()
	otherPub, _ := other.Public().MarshalPEM()
	keyFile := writeFile(t, "lease-key.pem", string(privPEM))

	t.Run("the signing key is loaded from its PEM file", func(t *testing.T) {
		c, err := Load(nil, env(prodEnv(map[string]string{"TABLEASE_LEASE_SIGNING_KEY": keyFile})), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if c.LeaseSigningKey.KeyID() != key.KeyID() || c.LeaseIssuer != "tablease" {
			t.Fatalf("key %s issuer %q", c.LeaseSigningKey.KeyID(), c.LeaseIssuer)
		}
	})
	t.Run("previous keys are read from every PEM block, private ones as their public half", func(t *testing.T) {
		prev := writeFile(t, "previous.pem", string(pubPEM)+string(otherPub))
		c, err := Load(nil, env(prodEnv(map[string]string{"TABLEASE_LEASE_PREVIOUS_KEYS": prev})), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if len(c.LeasePreviousKeys) != 2 || c.LeasePreviousKeys[0].KeyID() != key.KeyID() || c.LeasePreviousKeys[1].KeyID() != other.KeyID() {
			t.Fatalf("previous keys %v", c.LeasePreviousKeys)
		}
		c, err = Load(nil, env(prodEnv(map[string]string{"TABLEASE_LEASE_PREVIOUS_KEYS": keyFile})), io.Discard)
		if err != nil || len(c.LeasePreviousKeys) != 1 || c.LeasePreviousKeys[0].KeyID() != key.KeyID() {
			t.Fatalf("a private key as previous key: %v %v", c.LeasePreviousKeys, err)
		}
	})
	bad := []struct {
		name, key, data string
	}{
		{"a public key as the signing key", "TABLEASE_LEASE_SIGNING_KEY", string(pubPEM)},
		{"a signing key that is not PEM", "TABLEASE_LEASE_SIGNING_KEY", "not a key"},
		{"previous keys that are not PEM", "TABLEASE_LEASE_PREVIOUS_KEYS", "not a key"},
		{"previous keys followed by garbage", "TABLEASE_LEASE_PREVIOUS_KEYS", string(pubPEM) + "garbage"},
	}
	for _, tc := range bad {
		t.Run(tc.name+" is refused", func(t *testing.T) {
			p := writeFile(t, "k.pem", tc.data)
			_, err := Load(nil, env(prodEnv(map[string]string{tc.key: p})), io.Discard)
			var ce *Error
			if !errors.As(err, &ce) || ce.Var != tc.key || strings.Contains(err.Error(), "\n") {
				t.Fatalf("got %v, want one line naming %s", err, tc.key)
			}
		})
	}
	t.Run("an encrypted signing key is refused as encrypted", func(t *testing.T) {
		p := writeFile(t, "k.pem", "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAQID\n-----END ENCRYPTED PRIVATE KEY-----\n")
		_, err := Load(nil, env(prodEnv(map[string]string{"TABLEASE_LEASE_SIGNING_KEY": p})), io.Discard)
		if err == nil || !strings.HasPrefix(err.Error(), "TABLEASE_LEASE_SIGNING_KEY: ") ||
			!strings.Contains(err.Error(), "is an encrypted key, which is not supported: decrypt it first (openssl pkey") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("a signing key is required with Redis outside dev mode", func(t *testing.T) {
		_, err := Load(nil, env(prodEnv(map[string]string{"TABLEASE_REDIS_URL": "redis://127.0.0.1:6379/0"})), io.Discard)
		var ce *Error
		if !errors.As(err, &ce) || ce.Var != "TABLEASE_LEASE_SIGNING_KEY" || !strings.Contains(err.Error(), "tablease keygen") {
			t.Fatalf("got %v", err)
		}
		if _, err := Load(nil, env(prodEnv(map[string]string{"TABLEASE_REDIS_URL": "redis://127.0.0.1:6379/0", "TABLEASE_LEASE_SIGNING_KEY": keyFile})), io.Discard); err != nil {
			t.Fatalf("with a key: %v", err)
		}
		if c, err := Load(nil, env(prodEnv(map[string]string{"TABLEASE_REDIS_URL": "unix:///run/redis/redis.sock?db=2", "TABLEASE_LEASE_SIGNING_KEY": keyFile})), io.Discard); err != nil || c.RedisURL == "" {
			t.Fatalf("a Unix socket's URL, which leaseredis.NewClient reads: %+v, %v", c.RedisURL, err)
		}
		if _, err := Load([]string{"--dev"}, env(map[string]string{"TABLEASE_REDIS_URL": "redis://127.0.0.1:6379/0"}), io.Discard); err != nil {
			t.Fatalf("dev mode generates one: %v", err)
		}
		if _, err := Load(nil, env(prodEnv(nil)), io.Discard); err != nil {
			t.Fatalf("the memory engine may generate one: %v", err)
		}
	})
	t.Run("revokes wait for replicas of Redis only", func(t *testing.T) {
		c, err := Load(nil, env(prodEnv(map[string]string{"TABLEASE_REDIS_URL": "redis://127.0.0.1:6379/0",
			"TABLEASE_LEASE_SIGNING_KEY": keyFile, "TABLEASE_REVOKE_REPLICAS": "2"})), io.Discard)
		if err != nil || c.RevokeReplicas != 2 {
			t.Fatalf("RevokeReplicas = %d, %v; want 2", c.RevokeReplicas, err)
		}
		for _, tc := range []struct{ name, value, want string }{
			{"the memory engine", "1", "needs TABLEASE_REDIS_URL"},
			{"a negative count", "-1", "TABLEASE_REVOKE_REPLICAS"},
		} {
			_, err := Load(nil, env(prodEnv(map[string]string{"TABLEASE_REVOKE_REPLICAS": tc.value})), io.Discard)
			var ce *Error
			if !errors.As(err, &ce) || ce.Var != "TABLEASE_REVOKE_REPLICAS" || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: %v, want an error of TABLEASE_REVOKE_REPLICAS saying %q", tc.name, err, tc.want)
			}
		}
	})
}

// TestVariablesOfSpacesAloneAreUnset: a variable of spaces alone counts as unset, as an empty one
// does (README "Configuration").
func TestVariablesOfSpacesAloneAreUnset(t *testing.T) {
	c, err := Load([]string{"--dev"}, env(map[string]string{"TABLEASE_LOG_LEVEL": " ", "TABLEASE_TTL_MAX": " \t"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Limits.Max != 120*time.Second {
		t.Errorf("TTL max = %v, want the default", c.Limits.Max)
	}
}

// TestBooleanFlagsAndBadFlags: --demo is a switch like --dev, and a bad flag is one line of error
// (no usage dump), while --help writes the usage to the writer given.
func TestBooleanFlagsAndBadFlags(t *testing.T) {
	c, err := Load([]string{"--dev", "--demo"}, env(nil), io.Discard)
	if err != nil || !c.Demo {
		t.Fatalf("--dev --demo: demo %v, %v", c.Demo, err)
	}
	var out strings.Builder
	for _, args := range [][]string{{"--bogus"}, {"--ttl-max"}} {
		_, err := Load(args, env(nil), &out)
		if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "--help") {
			t.Errorf("Load(%q) = %v, want one line that points to --help", args, err)
		}
	}
	if out.Len() != 0 {
		t.Errorf("bad flags wrote %q, want nothing", out.String())
	}
	if _, err := Load([]string{"--help"}, env(nil), &out); !errors.Is(err, flag.ErrHelp) || !strings.Contains(out.String(), "-demo") {
		t.Errorf("--help: %v, usage %q", err, out.String())
	}
}

func TestUnknownNamesTheVariablesNothingReads(t *testing.T) {
	names, nearest := Unknown([]string{
		"HOME=/root", "TABLEASE_TTL_MAX=120s", "TABLEASE_TTL_MAXX=5s", "TABLEASE_REDIS=redis://r",
		"TABLEASE_TOKEN=t", "TABLEASE_URL=u", "TABLEASE_TEST_REDIS_URL=redis://t", "TABLEASE_BENCH_IDLE=9",
		"TABLEASE_SOMETHING_ELSE=x", "TABLEASE_=",
	})
	want := []string{"TABLEASE_TTL_MAXX", "TABLEASE_REDIS", "TABLEASE_SOMETHING_ELSE", "TABLEASE_"}
	wantNear := []string{"TABLEASE_TTL_MAX", "", "", ""}
	if !slices.Equal(names, want) || !slices.Equal(nearest, wantNear) {
		t.Fatalf("Unknown = %q, %q; want %q, %q", names, nearest, want, wantNear)
	}
}

// The rate limits are decimal numbers, as the README says: not Go's float syntax, which would
// take 1_000 as 1000.
func TestRateLimitsAreDecimalNumbers(t *testing.T) {
	for _, name := range []string{"TABLEASE_RATE_LIMIT", "TABLEASE_IP_RATE_LIMIT"} {
		for v, want := range map[string]float64{"0": 0, "50": 50, "0.5": 0.5, "1000000": 1e6, "007.50": 7.5} {
			c, err := Load([]string{"--dev"}, env(map[string]string{name: v}), io.Discard)
			if err != nil || (name == "TABLEASE_RATE_LIMIT" && c.RateLimit != want) || (name == "TABLEASE_IP_RATE_LIMIT" && c.IPRateLimit != want) {
				t.Errorf("%s=%s: %v, want %v", name, v, err, want)
			}
		}
		for _, v := range []string{"1_000", "1e3", "0x1p4", "+5", "-1", "Inf", "NaN", ".", "1.2.3", "1000000.5"} {
			_, err := Load([]string{"--dev"}, env(map[string]string{name: v}), io.Discard)
			var ce *Error
			if !errors.As(err, &ce) || ce.Var != name || !strings.Contains(err.Error(), "must be a decimal number from 0 to 1000000") {
				t.Errorf("%s=%q: %v, want it refused as no decimal number", name, v, err)
			}
		}
	}
}

// A host of digits and dots that is no IP address is refused, with a message that does not deny
// that a name is a host.
func TestAnAddressLikeAnIPv4AddressMustBeOne(t *testing.T) {
	_, err := Load([]string{"--dev"}, env(map[string]string{"TABLEASE_ADDR": "256.1.1.1:7620"}), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "is no IP address") || !strings.Contains(err.Error(), "a host name") {
		t.Fatalf("got %v", err)
	}
	if c, err := Load([]string{"--dev"}, env(map[string]string{"TABLEASE_ADDR": "localhost:7620"}), io.Discard); err != nil || c.Addr != "localhost:7620" {
		t.Fatalf("a host name: %v", err)
	}
}
