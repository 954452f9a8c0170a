// Package redistest gives tests a real Redis.
//
// There are two kinds of Redis here:
//
//   - Start starts a private redis-server for one test, on a free loopback port, and stops it in
//     t.Cleanup. The test may stop, restart, pause (SIGSTOP) and resume it: use it for outage
//     tests. It always runs a redis-server found in PATH, even when TABLEASE_TEST_REDIS_URL is set.
//
//   - Shared gives a test its own namespace (a DB number of its own where possible, and always a
//     key prefix of its own) on a Redis shared by the tests of one test binary: a private
//     redis-server started on first use, or the Redis named by TABLEASE_TEST_REDIS_URL. The test
//     must not stop or reconfigure it, and should touch only keys under its prefix (or its DB).
//
//   - StartCluster, StartSentinel and StartReplicated start a whole topology for one test
//     (topology.go): a Redis Cluster of three primaries with a replica each, a primary, a replica
//     and three sentinels, or a primary and a replica alone. The test may stop nodes to make the
//     topology fail over.
//
// Private servers run with --save "" --appendonly no --bind 127.0.0.1 --maxmemory-policy
// noeviction in a temporary directory: they persist nothing (a replica's copy of a full sync is
// deleted before a restart), so a restart loses every key.
//
// A missing redis-server fails the test (t.Fatal): tests that need Redis are never skipped.
//
// # Processes
//
// Every redis-server is started in a process group of its own, from one goroutine locked to its
// OS thread for the life of the test binary, with (on Linux) a parent-death signal of SIGKILL. A
// test's server is killed and reaped in t.Cleanup; the shared server, which has no test to clean it
// up, is killed by the kernel when the test binary exits, however it exits (a panic or a -timeout
// included). Systems without a parent-death signal get a private server per call of Shared instead.
package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// EnvURL names the environment variable that points Shared at an existing Redis, for example
// redis://127.0.0.1:6379/0. That Redis is shared with the tests of every package that runs at the
// same time, so Shared isolates tests by key prefix only, in the URL's database, and never runs
// FLUSHDB or FLUSHALL on it: it deletes only keys under a test's prefix.
const EnvURL = "TABLEASE_TEST_REDIS_URL"

const (
	startTimeout = 10 * time.Second // a server must answer within this long of its start
	stopTimeout  = 10 * time.Second // a killed server must be reaped within this long
	opTimeout    = 5 * time.Second  // bound on the helper's own commands (FLUSHALL, INFO…)
)

// Server is a private redis-server owned by one test. Its methods may be called from the test's
// goroutine; they fail the test with t.Fatal when something goes wrong.
type Server struct {
	bin  string // path of redis-server
	dir  string // its working directory (empty: a directory that is removed once it is up)
	port int    // fixed after the first start, so that Restart keeps the address
	dbs  int    // number of databases
	// role, when set, makes the server a node of a topology (topology.go): it names the config
	// file read first and the arguments that follow the common ones.
	role *role
	// tls, when set, makes the server serve TLS too, on a port of its own (StartTLS).
	tls *tlsPort

	// mu protects the fields below.
	mu     sync.Mutex
	proc   *process // nil while stopped
	paused bool     // stopped with SIGSTOP and not yet continued
}

// process is one run of redis-server.
type process struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd.Wait returned, i.e. the process is reaped
	log    *tailBuffer   // its stdout and stderr, last few KiB
}

// Start starts a private redis-server for t, stopped and reaped in t.Cleanup. It fails the test
// when redis-server is not in PATH or does not come up.
func Start(t testing.TB) *Server {
	t.Helper()
	return launch(t, nil)
}

// tlsPort is the TLS side of a server: its certificate and key (PEM files), and its port.
type tlsPort struct {
	cert, key string
	clientCA  string // when set, the CA that signs the certificates clients must show (StartMutualTLS)
	port      int    // fixed after the first start, as the plain port is
}

// StartTLS starts a private redis-server for t as Start does, that serves TLS as well, on a port
// of its own (TLSAddr), with the certificate and key of the PEM files given. It asks clients for
// no certificate; the plain port stays, for the helper's own commands.
func StartTLS(t testing.TB, certFile, keyFile string) *Server {
	t.Helper()
	return launch(t, &tlsPort{cert: certFile, key: keyFile})
}

// StartMutualTLS starts a server as StartTLS does, whose TLS side asks every client for a
// certificate that the CA of the PEM file caFile signed (tls-auth-clients yes, Redis's default).
func StartMutualTLS(t testing.TB, certFile, keyFile, caFile string) *Server {
	t.Helper()
	return launch(t, &tlsPort{cert: certFile, key: keyFile, clientCA: caFile})
}

// TLSAddr is the host:port of a StartTLS server's TLS side.
func (s *Server) TLSAddr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.tls.port)) }

func launch(t testing.TB, tls *tlsPort) *Server {
	t.Helper()
	bin, err := lookPath("tests of the Redis engine need it")
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	s := &Server{bin: bin, dir: t.TempDir(), dbs: 16, tls: tls}
	// Registered after TempDir, so it runs first: the server is gone before its directory.
	t.Cleanup(func() {
		if err := s.kill(); err != nil {
			t.Errorf("redistest: stopping redis-server: %v", err)
		}
	})
	if err := s.start(); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return s
}

// lookPath finds redis-server, or explains how to get one; hint ends the explanation.
func lookPath(hint string) (string, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", fmt.Errorf("redis-server is not in PATH (%v): install Redis 7 or later "+
			"(for example apt-get install redis-server); %s", err, hint)
	}
	return bin, nil
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// URL is a redis:// URL of the server's database 0.
func (s *Server) URL() string { return "redis://" + s.Addr() + "/0" }

// Client returns a client of database 0 of the server, closed in t.Cleanup.
func (s *Server) Client(t testing.TB) *redis.Client {
	t.Helper()
	return newClient(t, s.Addr(), 0)
}

// Flush deletes every key of every database (FLUSHALL). The server must be running.
func (s *Server) Flush(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	stopped, paused := s.proc == nil, s.paused
	s.mu.Unlock()
	switch {
	case stopped:
		t.Fatal("redistest: Flush of a stopped server")
	case paused:
		t.Fatal("redistest: Flush of a paused server would hang; Resume it first")
	}
	if err := do(s.Addr(), 0, "flushall"); err != nil {
		t.Fatalf("redistest: FLUSHALL: %v", err)
	}
}

// Stop kills the server (SIGKILL) and waits until it is reaped. Connections to it are refused
// until Restart. Stopping a stopped server does nothing.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	if err := s.kill(); err != nil {
		t.Fatalf("redistest: %v", err)
	}
}

// Log answers the last few KiB the running process printed, for a failure message; "" when the
// server is stopped.
func (s *Server) Log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return ""
	}
	return s.proc.log.String()
}

// Restart stops the server if it runs and starts it again on the same port. It comes back empty:
// nothing is persisted.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	if err := s.kill(); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	if err := s.start(); err != nil {
		t.Fatalf("redistest: %v", err)
	}
}

// Pause stops the server's process with SIGSTOP: the kernel still accepts connections and
// buffers commands, but nothing answers, so clients time out instead of being refused. Commands
// sent during the pause run when the server is resumed.
func (s *Server) Pause(t testing.TB) {
	t.Helper()
	if err := s.send(sigStop, true); err != nil {
		t.Fatalf("redistest: pausing redis-server: %v", err)
	}
}

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume(t testing.TB) {
	t.Helper()
	if err := s.send(sigCont, false); err != nil {
		t.Fatalf("redistest: resuming redis-server: %v", err)
	}
}

func (s *Server) send(sig signal, pause bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return errors.New("the server is stopped")
	}
	if err := signalGroup(s.proc.cmd, sig); err != nil {
		return err
	}
	s.paused = pause
	return nil
}

// start runs redis-server on s.port, or on a free port when s.port is 0, and waits until it
// answers. A port taken by someone else is retried: with a new port on a first start, with the
// same port (which may take a moment to be free) on a restart.
func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		return errors.New("redis-server is already running")
	}
	fixed := s.port != 0
	deadline := time.Now().Add(startTimeout)
	for attempt := 1; ; attempt++ {
		port := s.port
		if !fixed {
			p, err := freePort()
			if err != nil {
				return err
			}
			port = p
		}
		if !fixed && s.tls != nil {
			tp, err := freePort()
			if err != nil {
				return err
			}
			s.tls.port = tp
		}
		if !fixed && s.role != nil && s.role.cluster {
			// The cluster bus needs a port of its own, picked again with the client port.
			bus, err := freePort()
			if err != nil {
				return err
			}
			s.role.busPort = bus
		}
		p, err := s.run(port, deadline)
		if err == nil {
			s.proc, s.port, s.paused = p, port, false
			return nil
		}
		if !errors.Is(err, errAddrInUse) || attempt >= 20 || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var errAddrInUse = errors.New("address already in use")

// run starts one redis-server process on port and waits until it answers PING as itself.
func (s *Server) run(port int, deadline time.Time) (*process, error) {
	dir := s.dir
	if dir == "" {
		d, err := os.MkdirTemp("", "redistest-")
		if err != nil {
			return nil, err
		}
		// The server makes it its working directory and never writes to it (no RDB, no AOF, the
		// log goes to a pipe), so it can go as soon as the server is up; nothing must outlive
		// the test binary.
		defer os.RemoveAll(d)
		dir = d
	}
	// A replica saves the data of a full sync to dump.rdb, and a restarted server would load it:
	// removed, so that a restart comes back empty, as Restart says.
	if err := os.Remove(filepath.Join(dir, "dump.rdb")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	var args []string
	if s.role != nil && s.role.conf != "" {
		args = append(args, s.role.conf) // a config file must come first
	}
	args = append(args,
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--maxmemory-policy", "noeviction",
		"--databases", strconv.Itoa(s.dbs),
		"--dir", dir,
		"--daemonize", "no",
		"--logfile", "",
	)
	if s.role != nil {
		args = append(args, s.role.args()...)
	}
	if s.tls != nil {
		args = append(args, "--tls-port", strconv.Itoa(s.tls.port), "--tls-cert-file", s.tls.cert,
			"--tls-key-file", s.tls.key)
		if s.tls.clientCA != "" {
			args = append(args, "--tls-ca-cert-file", s.tls.clientCA, "--tls-auth-clients", "yes")
		} else {
			args = append(args, "--tls-auth-clients", "no")
		}
	}
	cmd := exec.Command(s.bin, args...)
	log := &tailBuffer{max: 8 << 10}
	cmd.Stdout, cmd.Stderr = log, log
	if err := StartChild(cmd); err != nil {
		return nil, fmt.Errorf("starting redis-server: %w", err)
	}
	p := &process{cmd: cmd, exited: make(chan struct{}), log: log}
	go func() {
		_ = cmd.Wait() // reaps it
		close(p.exited)
	}()

	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for {
		select {
		case <-p.exited:
			out := log.String()
			if strings.Contains(out, "already in use") {
				return nil, fmt.Errorf("redis-server on port %d: %w", port, errAddrInUse)
			}
			return nil, fmt.Errorf("redis-server on port %d exited before it answered (%v); its output:\n%s",
				port, cmd.ProcessState, out)
		default:
		}
		// The answer must come from this process: another server may have taken the port.
		if pid, err := serverPID(addr); err == nil && pid == cmd.Process.Pid {
			return p, nil
		}
		if time.Now().After(deadline) {
			_ = p.killAndWait()
			return nil, fmt.Errorf("redis-server on port %d did not answer within %s; its output:\n%s",
				port, startTimeout, log.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// kill stops the running process, if any, and waits until it is reaped.
func (s *Server) kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return nil
	}
	err := s.proc.killAndWait()
	s.proc, s.paused = nil, false
	return err
}

// killAndWait sends SIGKILL to the process group (it ends stopped processes too) and waits for
// the reaper.
func (p *process) killAndWait() error {
	select {
	case <-p.exited:
		return nil
	default:
	}
	if err := signalGroup(p.cmd, sigKill); err != nil {
		_ = p.cmd.Process.Kill()
	}
	select {
	case <-p.exited:
		return nil
	case <-time.After(stopTimeout):
		return fmt.Errorf("redis-server (pid %d) did not exit within %s of SIGKILL", p.cmd.Process.Pid, stopTimeout)
	}
}

// freePort asks the kernel for a free loopback port. Someone else may take it before the server
// binds it; start retries then.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// serverPID asks the server at addr for its process id (INFO server). It speaks RESP itself
// rather than through go-redis, whose logger would report every refused attempt.
func serverPID(addr string) (int, error) {
	conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := conn.Write([]byte("*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n")); err != nil {
		return 0, err
	}
	r := bufio.NewReader(conn)
	head, err := r.ReadString('\n')
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(head, "$")))
	if !strings.HasPrefix(head, "$") || err != nil || n < 0 {
		return 0, fmt.Errorf("unexpected answer to INFO: %q", head) // -LOADING, for instance
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(body), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, errors.New("INFO server has no process_id")
}

// newClient returns a client of database db at addr, closed in t.Cleanup.
func newClient(t testing.TB, addr string, db int) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, DB: db, DisableIdentity: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// do runs one command on a short-lived connection to database db at addr.
func do(addr string, db int, args ...any) error {
	c := redis.NewClient(&redis.Options{Addr: addr, DB: db, DisableIdentity: true, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	return c.Do(ctx, args...).Err()
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	max int
	mu  sync.Mutex // protects b
	b   []byte
}

func (w *tailBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b = append(w.b, p...)
	if over := len(w.b) - w.max; over > 0 {
		w.b = append(w.b[:0], w.b[over:]...)
	}
	return len(p), nil
}

func (w *tailBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.b)
}

// StartChild starts cmd as redistest starts redis-server: in a process group of its own and, on
// Linux, killed when the test binary ends (a parent-death signal), so that no child of a test
// outlives it. Other test helpers that start servers use it too.
func StartChild(cmd *exec.Cmd) error {
	cmd.SysProcAttr = procAttr()
	return startProcess(cmd)
}
