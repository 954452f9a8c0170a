package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
)

// sharedDBs is the number of databases of the shared private server. Database 0 is never handed
// out on its own; it holds the tests that find every other database taken.
const sharedDBs = 1024

// DB is one test's namespace on a shared Redis: a key prefix of its own and, on the shared private
// server, a database of its own.
type DB struct {
	addr      string
	url       string
	db        int
	prefix    string
	exclusive bool // the test owns database db, so Flush may FLUSHDB it
	external  bool // the Redis of EnvURL: clients are made from url, which may hold a password
}

// shared is the Redis that Shared hands out namespaces of, set up on first use.
var shared struct {
	once sync.Once
	err  error  // why it could not be set up; every later test fails with it
	addr string // host:port
	url  string // set for an external Redis (EnvURL)
	db   int    // the database of an external Redis

	mu   sync.Mutex // protects free
	free []int      // databases of the private server not handed out
}

var prefixSeq atomic.Int64

// Shared returns a namespace for t on the Redis shared by the tests of this binary: the Redis of
// TABLEASE_TEST_REDIS_URL when it is set, otherwise a private redis-server started on first use
// (see the package comment for its life). On the private server the namespace is a database of its
// own, flushed and handed back in t.Cleanup; on an external Redis it is the key prefix only, and
// t.Cleanup deletes the keys under it.
func Shared(t testing.TB) *DB {
	t.Helper()
	if os.Getenv(EnvURL) == "" && !parentDeathSignal {
		// Nothing would stop a shared server at exit: give the test one of its own.
		s := Start(t)
		return &DB{addr: s.Addr(), url: s.URL(), db: 0, prefix: newPrefix(), exclusive: true}
	}
	shared.once.Do(setupShared)
	if shared.err != nil {
		t.Fatalf("redistest: %v", shared.err)
	}
	d := &DB{addr: shared.addr, url: shared.url, db: shared.db, prefix: newPrefix(), external: shared.url != ""}
	if !d.external {
		d.db, d.exclusive = takeDB()
		d.url = fmt.Sprintf("redis://%s/%d", d.addr, d.db)
	}
	t.Cleanup(func() {
		if err := d.flush(); err != nil {
			t.Errorf("redistest: cleaning up %s: %v", d, err)
			return // a database that may hold keys is not handed out again
		}
		if d.exclusive {
			giveDB(d.db)
		}
	})
	return d
}

func setupShared() {
	if u := os.Getenv(EnvURL); u != "" {
		opts, err := redis.ParseURL(u)
		if err != nil {
			shared.err = fmt.Errorf("%s is not a Redis URL: %v", EnvURL, err)
			return
		}
		c := redis.NewClient(opts)
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		if err := c.Ping(ctx).Err(); err != nil {
			shared.err = fmt.Errorf("the Redis of %s does not answer PING: %v", EnvURL, err)
			return
		}
		shared.addr, shared.url, shared.db = opts.Addr, u, opts.DB
		return
	}
	bin, err := lookPath("or set " + EnvURL)
	if err != nil {
		shared.err = err
		return
	}
	// No dir and no test: the server outlives every test and dies with the test binary.
	s := &Server{bin: bin, dbs: sharedDBs}
	if err := s.start(); err != nil {
		shared.err = fmt.Errorf("starting the shared redis-server: %v", err)
		return
	}
	shared.addr = s.Addr()
	for db := sharedDBs - 1; db >= 1; db-- {
		shared.free = append(shared.free, db)
	}
}

// takeDB hands out a database of the shared private server, or database 0, shared and not
// exclusive, when every other one is taken.
func takeDB() (int, bool) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	n := len(shared.free)
	if n == 0 {
		return 0, false
	}
	db := shared.free[n-1]
	shared.free = shared.free[:n-1]
	return db, true
}

func giveDB(db int) {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	shared.free = append(shared.free, db)
}

// newPrefix returns a key prefix that no other test, in this binary or another, uses. It is made
// of [a-z0-9-] only, so it is safe in key patterns and as an identifier.
func newPrefix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return "rt" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(prefixSeq.Add(1), 10) + "-" + hex.EncodeToString(b[:])
}

// Addr is the host:port of the Redis.
func (d *DB) Addr() string { return d.addr }

// URL is a redis:// URL that selects the namespace's database.
func (d *DB) URL() string { return d.url }

// Number is the database number of the namespace.
func (d *DB) Number() int { return d.db }

// Prefix is the test's key prefix, made of [a-z0-9-]. Keys under it belong to the test alone.
func (d *DB) Prefix() string { return d.prefix }

// Exclusive reports whether the test owns its database alone, in which case it may use any key
// of it.
func (d *DB) Exclusive() bool { return d.exclusive }

func (d *DB) String() string { return fmt.Sprintf("db %d prefix %s at %s", d.db, d.prefix, d.addr) }

// Client returns a client of the namespace's database, closed in t.Cleanup.
func (d *DB) Client(t testing.TB) *redis.Client {
	t.Helper()
	c, err := d.newClient()
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Flush deletes the namespace's data, as a Redis that lost its data would have lost it: the whole
// database when the test owns it (FLUSHDB), otherwise every key under the prefix.
func (d *DB) Flush(t testing.TB) {
	t.Helper()
	if err := d.flush(); err != nil {
		t.Fatalf("redistest: flushing %s: %v", d, err)
	}
}

// newClient returns a client of the namespace's database; an external Redis keeps everything its
// URL says (password, TLS…).
func (d *DB) newClient() (*redis.Client, error) {
	if !d.external {
		return redis.NewClient(&redis.Options{Addr: d.addr, DB: d.db, DisableIdentity: true}), nil
	}
	opts, err := redis.ParseURL(d.url)
	if err != nil {
		return nil, err
	}
	opts.DisableIdentity = true
	return redis.NewClient(opts), nil
}

func (d *DB) flush() error {
	c, err := d.newClient()
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if d.exclusive {
		return c.FlushDB(ctx).Err()
	}
	// The prefix holds no glob characters (see newPrefix).
	iter := c.Scan(ctx, 0, d.prefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
		if len(keys) == 1000 {
			if err := c.Unlink(ctx, keys...).Err(); err != nil {
				return err
			}
			keys = keys[:0]
		}
	}
	if err := iter.Err(); err != nil {
		return err
	}
	if len(keys) > 0 {
		return c.Unlink(ctx, keys...).Err()
	}
	return nil
}
