package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tablease/tablease/internal/redistest"
)

const (
	readyTimeout = 20 * time.Second // an instance or the cluster must be ready within this long
	killTimeout  = 10 * time.Second // a killed instance must be reaped within this long
)

var (
	buildOnce sync.Once
	buildDir  string
	buildBin  string
	buildErr  error
)

// Binary builds the tablease binary once per test binary and answers its path.
func Binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "tablease-chaos-")
		if buildErr != nil {
			return
		}
		goBin, err := exec.LookPath("go")
		if err != nil {
			buildErr = fmt.Errorf("no go command on PATH to build ./cmd/tablease: %v", err)
			return
		}
		buildBin = filepath.Join(buildDir, "tablease")
		out, err := exec.Command(goBin, "build", "-o", buildBin, "github.com/tablease/tablease/cmd/tablease").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ./cmd/tablease: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatalf("chaos: %v", buildErr)
	}
	return buildBin
}

// RemoveBinary removes what Binary built; TestMain calls it once the tests ran.
func RemoveBinary() {
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
}

// Cluster is a private Redis, a Proxy in front of it, and tablease instances that reach Redis
// through the proxy; or (StartSentinelCluster) a Sentinel setup that the instances reach directly.
type Cluster struct {
	Redis     *redistest.Server
	Proxy     *Proxy
	Sentinel  *redistest.Sentinel
	Instances []*Instance
	Token     string // an access token of the user "chaos", valid for two hours
	HTTP      *http.Client
}

// Instance is one tablease process.
type Instance struct {
	Name string
	Addr string // host:port it listens on
	Log  string // file its output is appended to

	bin string
	env []string

	mu     sync.Mutex // protects cmd and exited
	cmd    *exec.Cmd
	exited chan struct{}
}

// URL is the instance's base URL.
func (i *Instance) URL() string { return "http://" + i.Addr }

// StartCluster starts a cluster of n tablease instances for t, stopped in t.Cleanup.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	c := &Cluster{Redis: redistest.Start(t), HTTP: &http.Client{Timeout: 5 * time.Second}}
	p, err := NewProxy(c.Redis.Addr())
	if err != nil {
		t.Fatalf("chaos: proxy: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	c.Proxy = p
	c.start(t, n, "redis://"+p.Addr()+"/0")
	return c
}

// StartSentinelCluster starts n tablease instances for t that reach a primary and its replica
// through three sentinels (redistest.StartSentinel), all stopped in t.Cleanup.
func StartSentinelCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	c := &Cluster{Sentinel: redistest.StartSentinel(t), HTTP: &http.Client{Timeout: 5 * time.Second}}
	addrs := c.Sentinel.Addrs()
	c.start(t, n, "redis://"+addrs[0]+"/0?master_name="+redistest.MasterName+"&addr="+strings.Join(addrs[1:], "&addr="))
	return c
}

// start starts n tablease instances on the Redis of redisURL, with a signing key and a token.
func (c *Cluster) start(t testing.TB, n int, redisURL string) {
	t.Helper()
	bin := Binary(t)
	dir := t.TempDir()
	key := filepath.Join(dir, "lease-key.pem")
	if out, err := exec.Command(bin, "keygen", "--out", key).CombinedOutput(); err != nil {
		t.Fatalf("chaos: tablease keygen: %v\n%s", err, out)
	}
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	env := []string{
		"TABLEASE_REDIS_URL=" + redisURL,
		"TABLEASE_JWT_HS256_SECRET=" + hex.EncodeToString(secret),
		"TABLEASE_JWT_ISSUER=tablease-chaos",
		"TABLEASE_JWT_AUDIENCE=tablease",
		"TABLEASE_LEASE_SIGNING_KEY=" + key,
		"TABLEASE_RATE_LIMIT=0",
		// Every session of a run is the one test user's, and a long run's outnumber the default
		// bound of a user's sessions within the idle retention.
		"TABLEASE_SESSIONS_PER_USER=0",
		"TABLEASE_TTL_DEFAULT=30m",
		"TABLEASE_TTL_MAX=30m",
		"TABLEASE_TTL_HIDDEN_MAX=30m",
		"TABLEASE_REDIS_TIMEOUT=300ms",
		"TABLEASE_LOG_FORMAT=text",
		"TABLEASE_LOG_LEVEL=warn",
	}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TABLEASE_") {
			env = append(env, kv)
		}
	}
	tok := exec.Command(bin, "token", "--sub", "chaos", "--ttl", "2h")
	tok.Env = env
	out, err := tok.Output()
	if err != nil {
		t.Fatalf("chaos: tablease token: %v", err)
	}
	c.Token = strings.TrimSpace(string(out))

	for i := range n {
		port, err := freePort()
		if err != nil {
			t.Fatalf("chaos: %v", err)
		}
		in := &Instance{
			Name: fmt.Sprintf("tablease-%d", i),
			Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
			Log:  filepath.Join(dir, fmt.Sprintf("tablease-%d.log", i)),
			bin:  bin,
		}
		in.env = append([]string{"TABLEASE_ADDR=" + in.Addr}, env...)
		t.Cleanup(func() {
			if err := in.Kill(); err != nil {
				t.Errorf("chaos: %v", err)
			}
		})
		if err := in.Start(); err != nil {
			t.Fatalf("chaos: %v", err)
		}
		c.Instances = append(c.Instances, in)
	}
	if err := c.WaitReady(); err != nil {
		t.Fatalf("chaos: %v", err)
	}
}

// URLs are the base URLs of the instances.
func (c *Cluster) URLs() []string {
	urls := make([]string, len(c.Instances))
	for i, in := range c.Instances {
		urls[i] = in.URL()
	}
	return urls
}

// WaitReady waits until every instance answers /readyz, i.e. reaches Redis.
func (c *Cluster) WaitReady() error {
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	for _, in := range c.Instances {
		if err := Ready(ctx, c.HTTP, in.URL()); err != nil {
			return fmt.Errorf("%w; its log: %s", err, in.tail())
		}
	}
	return nil
}

// Start starts the instance's process. It fails when the process runs already.
func (i *Instance) Start() error {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.cmd != nil {
		return fmt.Errorf("%s runs already", i.Name)
	}
	log, err := os.OpenFile(i.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(i.bin, "serve")
	cmd.Env = i.env
	cmd.Stdout, cmd.Stderr = log, log
	if err := redistest.StartChild(cmd); err != nil {
		_ = log.Close()
		return fmt.Errorf("starting %s: %w", i.Name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		_ = log.Close()
		close(exited)
	}()
	i.cmd, i.exited = cmd, exited
	return nil
}

// Kill kills the instance's process (SIGKILL) and waits until it is reaped. Killing a stopped
// instance does nothing.
func (i *Instance) Kill() error {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.cmd == nil {
		return nil
	}
	_ = i.cmd.Process.Kill()
	select {
	case <-i.exited:
	case <-time.After(killTimeout):
		return fmt.Errorf("%s (pid %d) did not exit within %s of SIGKILL", i.Name, i.cmd.Process.Pid, killTimeout)
	}
	i.cmd, i.exited = nil, nil
	return nil
}

// tail answers the end of the instance's log.
func (i *Instance) tail() string {
	b, err := os.ReadFile(i.Log)
	if err != nil {
		return err.Error()
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// freePort asks the kernel for a free loopback port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
