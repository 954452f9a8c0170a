package leaseredis

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
	"weak"

	"github.com/redis/go-redis/v9"
)

// NewClient makes a client for New from a URL, with timeouts bounded by opTimeout (0 means
// DefaultOpTimeout). The URL forms are those of go-redis's parsers:
//
//	redis://[user:password@]host:port[/db][?option=value…]     standalone (redis.ParseURL)
//	rediss://…                                                 the same over TLS
//	unix://[user:password@]/path/to/redis.sock[?db=…]          standalone over a Unix socket
//	redis[s]://[user:password@]sentinel:port[/db]?master_name=name[&addr=sentinel2:port…]
//	                                                           Sentinel (redis.ParseFailoverURL)
//	redis[s]://[user:password@]node:port?cluster=true[&addr=node2:port…]
//	                                                           Cluster (redis.ParseClusterURL)
//
// master_name selects Sentinel (the user and password of the URL are the Sentinel's; the
// username and password options are the primary's); cluster=true, which is this function's own
// option, selects Cluster. ca_file=/path/ca.pem, also its own, verifies a rediss:// server (and
// every node or sentinel) against the CA certificates of that PEM file instead of the system's;
// go-redis's skip_verify=true verifies nothing. cert_file=/path/cert.pem&key_file=/path/key.pem,
// its own too, give a rediss:// client the certificate that a Redis asking for one (its
// tls-auth-clients yes, the default) verifies. Other options are go-redis's (max_retries,
// pool_size, read_timeout…) and an unknown one is an error.
//
// Whatever the URL says, the client honours context deadlines (ContextTimeoutEnabled), and its
// dial, read, write and pool timeouts are at most opTimeout. Unless the URL sets them, it retries a
// failed command twice with a backoff of 8 to 100 ms, and a failed dial twice after 50 ms; all of
// it within the context deadline that the engine sets for each operation. Unless the URL sets
// protocol, it speaks RESP2: tablease uses nothing of RESP3, and go-redis looks for RESP3 push
// notifications before it reads each answer (2.7-3.5 % of the CPU of a renew over HTTP, pprof of
// BenchmarkRenewOverHTTPOnRedis).
//
// A Cluster client finds a failover by itself: it reloads the slot map whenever a command gets no
// answer (a dead or unreachable node), and at least every clusterReloadInterval while it is used.
// go-redis alone reloads it only on MOVED, READONLY or after a minute, and keeps sending the slots
// of a dead primary to it until then, long after its replica was promoted.
//
// Errors never contain the URL's password.
func NewClient(rawURL string, opTimeout time.Duration) (redis.UniversalClient, error) {
	switch {
	case opTimeout == 0:
		opTimeout = DefaultOpTimeout
	case opTimeout < 0:
		return nil, fmt.Errorf("leaseredis: negative operation timeout %v", opTimeout)
	}
	newClient, err := parseURL(rawURL, opTimeout)
	if err != nil {
		return nil, err
	}
	return newClient(), nil
}

// CheckURL reports what NewClient would find wrong with rawURL (the same errors, without the
// password), without making a client: for a configuration to refuse a bad URL before it starts
// anything.
func CheckURL(rawURL string) error {
	_, err := parseURL(rawURL, DefaultOpTimeout)
	return err
}

// maxURLConns bounds go-redis's connection counts in a URL (pool_size and the like), and
// maxURLBuffer its buffer sizes (pipeline_read_buffer_size, pipeline_write_buffer_size).
const (
	maxURLConns  = 1000
	maxURLBuffer = 1 << 20
)

// parseURL reads rawURL as NewClient does, and answers the function that makes the client.
func parseURL(rawURL string, opTimeout time.Duration) (func() redis.UniversalClient, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		var urlErr *url.Error
		if errors.As(err, &urlErr) {
			err = urlErr.Err // without the URL, which may hold a password
		}
		var escErr url.EscapeError
		if errors.As(err, &escErr) {
			// Without the escape either, which may be part of the password.
			err = errors.New("invalid URL escape: a % not followed by two hex digits")
		}
		return nil, fmt.Errorf("leaseredis: bad Redis URL: %v", err)
	}
	redact := func(err error) error {
		msg := err.Error()
		if pw, ok := u.User.Password(); ok && pw != "" {
			msg = strings.ReplaceAll(msg, pw, "xxxxx")
		}
		return fmt.Errorf("leaseredis: bad Redis URL: %s", msg)
	}
	switch u.Scheme {
	case "redis", "rediss", "unix":
	default:
		return nil, fmt.Errorf("leaseredis: bad Redis URL: scheme %q is not redis, rediss or unix", u.Scheme)
	}

	// u.Query drops a pair it cannot read (a % not followed by two hex digits) without a word.
	if _, err := url.ParseQuery(u.RawQuery); err != nil {
		return nil, errors.New("leaseredis: bad Redis URL: invalid escape in the query: a % not followed by two hex digits")
	}
	q := u.Query()
	// go-redis dials a port out of range again and again rather than refuse it, in the URL's host
	// (whose port url.Parse only checks for digits) as in an addr=.
	if port := u.Port(); u.Scheme != "unix" && port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, redact(fmt.Errorf("port %s is not from 1 to 65535", port))
		}
	}
	for _, a := range q["addr"] {
		_, port, err := net.SplitHostPort(a)
		if n, perr := strconv.Atoi(port); err != nil || perr != nil || n < 1 || n > 65535 {
			return nil, redact(fmt.Errorf("addr=%q is not host:port with a port from 1 to 65535", a))
		}
	}
	// go-redis takes its counts and sizes as they come: a negative one panics when the client is
	// made (pool_size=-1: makechan), and a huge one dials or allocates as much (min_idle_conns of a
	// million dials until the process has no file left).
	for _, o := range []struct {
		names []string
		most  int
	}{
		{[]string{"pool_size", "min_idle_conns", "max_idle_conns", "max_active_conns", "max_concurrent_dials", "pipeline_pool_size"}, maxURLConns},
		{[]string{"pipeline_read_buffer_size", "pipeline_write_buffer_size"}, maxURLBuffer},
	} {
		for _, name := range o.names {
			for _, v := range q[name] {
				if n, err := strconv.Atoi(v); err != nil || n < 0 || n > o.most {
					return nil, redact(fmt.Errorf("%s=%q is not a whole number from 0 to %d", name, v, o.most))
				}
			}
		}
	}
	// ca_file, this function's own option, names a PEM file of the CAs to verify a rediss://
	// server's certificate against, instead of the system's.
	var roots *x509.CertPool
	if q.Has("ca_file") {
		if u.Scheme != "rediss" {
			return nil, errors.New("leaseredis: bad Redis URL: ca_file is for rediss:// only")
		}
		if roots, err = readCAFile(q.Get("ca_file")); err != nil {
			return nil, fmt.Errorf("leaseredis: bad Redis URL: ca_file: %v", err)
		}
		q.Del("ca_file")
		u.RawQuery = q.Encode()
	}
	// cert_file and key_file, also this function's own, name the PEM files of a client certificate
	// and its key, for a Redis that asks for one (tls-auth-clients yes, Redis's default).
	var certs []tls.Certificate
	if q.Has("cert_file") || q.Has("key_file") {
		if u.Scheme != "rediss" {
			return nil, errors.New("leaseredis: bad Redis URL: cert_file and key_file are for rediss:// only")
		}
		if !q.Has("cert_file") || !q.Has("key_file") {
			return nil, errors.New("leaseredis: bad Redis URL: cert_file and key_file go together")
		}
		cert, err := tls.LoadX509KeyPair(q.Get("cert_file"), q.Get("key_file"))
		if err != nil {
			return nil, fmt.Errorf("leaseredis: bad Redis URL: cert_file and key_file: %v", err)
		}
		certs = []tls.Certificate{cert}
		q.Del("cert_file")
		q.Del("key_file")
		u.RawQuery = q.Encode()
	}
	// withTLS puts the CAs of ca_file and the certificate of cert_file and key_file into go-redis's
	// TLS configuration of a rediss:// URL (nil for any other).
	withTLS := func(c *tls.Config) {
		if c == nil {
			return
		}
		if roots != nil {
			c.RootCAs = roots
		}
		c.Certificates = certs
	}
	cluster := false
	if q.Has("cluster") {
		cluster, err = strconv.ParseBool(q.Get("cluster"))
		if err != nil {
			return nil, fmt.Errorf("leaseredis: bad Redis URL: cluster=%q is not a boolean", q.Get("cluster"))
		}
		q.Del("cluster")
		u.RawQuery = q.Encode()
	}
	// protocol is go-redis's, which takes any number and speaks RESP2 for one it does not know;
	// unless the URL sets it, RESP2, which every parser below then reads.
	switch p := q.Get("protocol"); {
	case !q.Has("protocol"):
		q.Set("protocol", "2")
		u.RawQuery = q.Encode()
	case p != "2" && p != "3":
		return nil, fmt.Errorf("leaseredis: bad Redis URL: protocol=%q is not 2 or 3", p)
	}
	sentinel := q.Get("master_name") != ""
	if u.Scheme == "unix" && (cluster || sentinel) {
		return nil, errors.New("leaseredis: bad Redis URL: unix:// is for a standalone Redis only")
	}
	switch {
	case cluster && sentinel:
		return nil, errors.New("leaseredis: bad Redis URL: cluster=true and master_name exclude each other")
	case cluster:
		if p := strings.TrimPrefix(u.Path, "/"); p != "" && p != "0" {
			return nil, fmt.Errorf("leaseredis: bad Redis URL: a Redis Cluster has database 0 only, not %q", p)
		}
		o, err := redis.ParseClusterURL(u.String())
		if err != nil {
			return nil, redact(err)
		}
		bound(opTimeout, knobs{&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout,
			&o.MaxRetries, &o.MinRetryBackoff, &o.MaxRetryBackoff, &o.DialerRetries, &o.DialerRetryTimeout,
			&o.ContextTimeoutEnabled})
		if o.ClusterStateReloadInterval == 0 {
			o.ClusterStateReloadInterval = clusterReloadInterval
		}
		withTLS(o.TLSConfig)
		return func() redis.UniversalClient {
			c := redis.NewClusterClient(o)
			c.AddHook(reloadOnLoss{c})
			return c
		}, nil
	case sentinel:
		o, err := redis.ParseFailoverURL(u.String())
		if err != nil {
			return nil, redact(err)
		}
		bound(opTimeout, knobs{&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout,
			&o.MaxRetries, &o.MinRetryBackoff, &o.MaxRetryBackoff, &o.DialerRetries, &o.DialerRetryTimeout,
			&o.ContextTimeoutEnabled})
		withTLS(o.TLSConfig)
		return func() redis.UniversalClient {
			c := redis.NewFailoverClient(o)
			rememberSentinels(c, o)
			return c
		}, nil
	}
	o, err := redis.ParseURL(u.String())
	if err != nil {
		return nil, redact(err)
	}
	bound(opTimeout, knobs{&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout, &o.PoolTimeout,
		&o.MaxRetries, &o.MinRetryBackoff, &o.MaxRetryBackoff, &o.DialerRetries, &o.DialerRetryTimeout,
		&o.ContextTimeoutEnabled})
	withTLS(o.TLSConfig)
	return func() redis.UniversalClient { return redis.NewClient(o) }, nil
}

// sentinelsOf holds the options of each Sentinel client that NewClient made, which go-redis keeps
// to itself: the Sentinels' addresses and the master name, for ServerMismatch and Replicas to ask
// the Sentinels. An entry goes with its client, once the client is garbage.
var sentinelsOf sync.Map // weak.Pointer[redis.Client] → *redis.FailoverOptions

func rememberSentinels(c *redis.Client, o *redis.FailoverOptions) {
	k := weak.Make(c)
	sentinelsOf.Store(k, o)
	runtime.AddCleanup(c, func(k weak.Pointer[redis.Client]) { sentinelsOf.Delete(k) }, k)
}

// sentinelOptions answers the options of the Sentinel client c that NewClient made, nil for any
// other client.
func sentinelOptions(c *redis.Client) *redis.FailoverOptions {
	o, _ := sentinelsOf.Load(weak.Make(c))
	fo, _ := o.(*redis.FailoverOptions)
	return fo
}

// readCAFile reads the certificates of a PEM file into a pool.
func readCAFile(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return pool, nil
}

// knobs point at the fields of one of go-redis's option types that NewClient sets.
type knobs struct {
	dial, read, write, pool *time.Duration
	retries                 *int
	minBackoff, maxBackoff  *time.Duration
	dialRetries             *int
	dialRetryBackoff        *time.Duration
	contextTimeoutEnabled   *bool
}

// bound applies NewClient's rules to k.
func bound(op time.Duration, k knobs) {
	*k.contextTimeoutEnabled = true
	for _, d := range []*time.Duration{k.dial, k.read, k.write, k.pool} {
		// Zero is go-redis's default, negative its "no timeout": both would exceed op.
		if *d <= 0 || *d > op {
			*d = op
		}
	}
	if *k.retries == 0 {
		*k.retries = 2
	}
	if *k.minBackoff == 0 {
		*k.minBackoff = 8 * time.Millisecond
	}
	if *k.maxBackoff == 0 {
		*k.maxBackoff = 100 * time.Millisecond
	}
	if *k.dialRetries <= 0 {
		*k.dialRetries = 2
	}
	if *k.dialRetryBackoff == 0 {
		*k.dialRetryBackoff = 50 * time.Millisecond
	}
}

// clusterReloadInterval bounds the age of a Cluster client's slot map while it is used, so that
// even a client whose commands all succeed (its subscription's node died) finds a failover.
const clusterReloadInterval = time.Second

// reloadOnLoss is a hook of a Cluster client that reloads the slot map (lazily: at most one reload
// runs, and another follows 200 ms later while failures continue) after every command or
// pipeline that got no answer from Redis: the node it went to may be dead and its slots served by
// a promoted replica. Redis's own error replies (MOVED and the like) are go-redis's business.
type reloadOnLoss struct{ c *redis.ClusterClient }

func (h reloadOnLoss) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h reloadOnLoss) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.check(ctx, err)
		return err
	}
}

func (h reloadOnLoss) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.check(ctx, err)
		return err
	}
}

func (h reloadOnLoss) check(ctx context.Context, err error) {
	var reply redis.Error
	if err != nil && !errors.As(err, &reply) {
		h.c.ReloadState(ctx)
	}
}
