package redistest

import (
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// quickClient fails fast, so that an outage shows as an error instead of a long wait.
func quickClient(t *testing.T, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{
		Addr: addr, DisableIdentity: true, MaxRetries: -1, DialerRetries: 1,
		DialTimeout: 300 * time.Millisecond, ReadTimeout: 300 * time.Millisecond, WriteTimeout: 300 * time.Millisecond,
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

func TestStartedServerAnswersAndIsConfiguredForTablease(t *testing.T) {
	s := Start(t)
	c := s.Client(t)
	ctx := ctxT(t, 5*time.Second)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}
	want := map[string]string{"maxmemory-policy": "noeviction", "save": "", "appendonly": "no", "bind": "127.0.0.1"}
	for k, v := range want {
		got, err := c.ConfigGet(ctx, k).Result()
		if err != nil {
			t.Fatalf("CONFIG GET %s: %v", k, err)
		}
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	if !strings.HasPrefix(s.URL(), "redis://127.0.0.1:") {
		t.Errorf("URL() = %q", s.URL())
	}
}

func TestServerIsKilledAndReapedWhenItsTestEnds(t *testing.T) {
	var pid int
	t.Run("uses a server", func(t *testing.T) {
		s := Start(t)
		pid = s.proc.cmd.Process.Pid
		if !alive(pid) {
			t.Fatal("the server is not running")
		}
	})
	// Reaped: not even a zombie is left, so the pid names nothing.
	if alive(pid) {
		t.Fatalf("redis-server pid %d is still there after its test ended", pid)
	}
}

func TestStopRefusesAndRestartComesBackEmptyOnTheSameAddress(t *testing.T) {
	s := Start(t)
	addr := s.Addr()
	c := quickClient(t, addr)
	ctx := ctxT(t, 10*time.Second)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}

	s.Stop(t)
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING answered while the server is stopped")
	}
	s.Stop(t) // stopping twice does nothing

	s.Restart(t)
	if s.Addr() != addr {
		t.Fatalf("restarted on %s, want %s", s.Addr(), addr)
	}
	c2 := quickClient(t, addr)
	n, err := c2.Exists(ctx, "k").Result()
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatal("a key survived the restart; nothing should be persisted")
	}
}

func TestPauseMakesTheServerHangUntilResumed(t *testing.T) {
	s := Start(t)
	c := quickClient(t, s.Addr())
	ctx := ctxT(t, 10*time.Second)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	s.Pause(t)
	err := c.Ping(ctx).Err()
	var netErr interface{ Timeout() bool }
	if err == nil || !errors.As(err, &netErr) || !netErr.Timeout() {
		t.Fatalf("PING of a paused server: %v, want a timeout", err)
	}

	s.Resume(t)
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := c.Ping(ctx).Err()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("PING after resume: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestAPausedServerIsStillKilledAtCleanup(t *testing.T) {
	var pid int
	t.Run("pauses", func(t *testing.T) {
		s := Start(t)
		pid = s.proc.cmd.Process.Pid
		s.Pause(t)
	})
	if alive(pid) {
		t.Fatalf("paused redis-server pid %d outlived its test", pid)
	}
}

func TestFlushDeletesEveryKey(t *testing.T) {
	s := Start(t)
	c := s.Client(t)
	ctx := ctxT(t, 5*time.Second)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Flush(t)
	if n := c.DBSize(ctx).Val(); n != 0 {
		t.Fatalf("DBSIZE after Flush = %d", n)
	}
}

func TestSharedNamespacesAreIsolated(t *testing.T) {
	a, b := Shared(t), Shared(t)
	if a.Prefix() == b.Prefix() {
		t.Fatalf("two namespaces share the prefix %q", a.Prefix())
	}
	if a.Exclusive() && b.Exclusive() && a.Number() == b.Number() {
		t.Fatalf("two exclusive namespaces share database %d", a.Number())
	}
	ca, cb := a.Client(t), b.Client(t)
	ctx := ctxT(t, 5*time.Second)
	if err := ca.Set(ctx, a.Prefix()+":k", "a", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := cb.Set(ctx, b.Prefix()+":k", "b", 0).Err(); err != nil {
		t.Fatal(err)
	}

	a.Flush(t)
	if n := ca.Exists(ctx, a.Prefix()+":k").Val(); n != 0 {
		t.Error("Flush left the namespace's key")
	}
	if v := cb.Get(ctx, b.Prefix()+":k").Val(); v != "b" {
		t.Errorf("Flush of one namespace touched another: got %q", v)
	}
}

func TestSharedDatabaseIsFlushedAndHandedBackAfterItsTest(t *testing.T) {
	if os.Getenv(EnvURL) != "" {
		t.Log("with " + EnvURL + " set, namespaces are prefixes of one database; checking the prefix is emptied")
	}
	var d *DB
	t.Run("writes", func(t *testing.T) {
		d = Shared(t)
		if err := d.Client(t).Set(t.Context(), d.Prefix()+":k", "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
	})
	c, err := d.newClient()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if n := c.Exists(ctxT(t, 5*time.Second), d.Prefix()+":k").Val(); n != 0 {
		t.Fatal("the namespace's key outlived its test")
	}
}

func TestMissingRedisServerIsExplained(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := lookPath("hint")
	if err == nil || !strings.Contains(err.Error(), "redis-server is not in PATH") || !strings.Contains(err.Error(), "hint") {
		t.Fatalf("lookPath with an empty PATH: %v", err)
	}
}
