package api

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tablease/tablease/api/stream"
	"github.com/tablease/tablease/lease/leasemem"
)

// Benchmarks of the event stream, over real HTTP to an in-process server on the memory engine.
//
//	TABLEASE_BENCH_STREAMS=10000 go test -run XXX -bench BenchmarkIdleStreams -benchtime 1x ./api/
//	TABLEASE_BENCH_IDLE=10000 go test -run XXX -bench BenchmarkTakeoverLatency -benchtime 2000x ./api/
//
// The sizes come from the environment so that CI stays fast (the defaults are small) while the
// README's figures are for 10,000 streams.

// benchEnvInt reads a positive integer from the environment, or def.
func benchEnvInt(b *testing.B, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// benchServer serves a server on a fresh memory engine (real clock) on a loopback port.
func benchServer(b *testing.B, streams int) (*Server, string) {
	b.Helper()
	eng, err := leasemem.New(leasemem.Options{})
	if err != nil {
		b.Fatal(err)
	}
	opts := Options{
		Engine:  eng,
		Auth:    testAuthConfig(),
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		Streams: stream.Options{PerInstance: streams + 100, PerUser: 1000},
	}
	memoryStores(&opts)
	srv, err := New(opts)
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	b.Cleanup(func() {
		srv.Close()
		_ = hs.Close()
		_ = eng.Close()
	})
	return srv, ln.Addr().String()
}

// BenchmarkIdleStreams opens TABLEASE_BENCH_STREAMS streams (default 500), each of its own user,
// from a client process of its own (so that neither its memory nor its sockets count here), waits
// until every stream has its snapshot and has gone idle, and reports the memory the server
// process gained, per stream, after GCs (which also shrink the stacks of idle goroutines): the
// stream's goroutine and connection, the watch, the presence entry and the
// engine's session entry. Kernel memory (socket buffers) is not in it.
//
//   - bytes/stream: live heap (HeapAlloc) + goroutine stacks (StackInuse)
//   - inuse-bytes/stream: heap spans in use (HeapInuse, which also counts the free room in spans
//     that hold live objects) + goroutine stacks: the larger, more conservative figure
//   - heap-bytes/stream, heap-inuse-bytes/stream, stack-bytes/stream, goroutines/stream: the parts
//   - rss-bytes/stream: what the resident set grew by (Linux), which also counts memory the
//     runtime holds but does not use; only the first run of a process says much, later ones
//     reuse what the first left
func BenchmarkIdleStreams(b *testing.B) {
	n := benchEnvInt(b, "TABLEASE_BENCH_STREAMS", 500)
	if os.Getenv("TABLEASE_BENCH_HEAPPROFILE") != "" {
		runtime.MemProfileRate = 1 // every allocation, for an exact profile
	}
	srv, addr := benchServer(b, n)
	var heap, inuse, stack, goroutines, rss float64
	for range b.N {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&before)
		rss0 := residentBytes()
		g0 := runtime.NumGoroutine()

		stop := idleClients(b, addr, n)
		if got := srv.streams.Open(); got != n {
			b.Fatalf("%d streams open, want %d", got, n)
		}
		time.Sleep(time.Second) // every handler back in its select
		runtime.GC()
		runtime.GC() // the second GC also shrinks the stacks the first found oversized
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&after)
		rss += float64(residentBytes()-rss0) / float64(n)
		g1 := runtime.NumGoroutine()
		if path := os.Getenv("TABLEASE_BENCH_HEAPPROFILE"); path != "" { // where the bytes go
			f, err := os.Create(path)
			if err != nil {
				b.Fatal(err)
			}
			_ = pprof.WriteHeapProfile(f)
			_ = f.Close()
		}

		heap += float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)
		inuse += float64(int64(after.HeapInuse)-int64(before.HeapInuse)) / float64(n)
		stack += float64(int64(after.StackInuse)-int64(before.StackInuse)) / float64(n)
		goroutines += float64(g1-g0) / float64(n)

		stop() // the client exits and its streams end
		deadline := time.Now().Add(30 * time.Second)
		for srv.streams.Open() != 0 {
			if time.Now().After(deadline) {
				b.Fatalf("%d streams still open after the client left", srv.streams.Open())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	heap, inuse, stack, goroutines, rss = heap/float64(b.N), inuse/float64(b.N), stack/float64(b.N), goroutines/float64(b.N), rss/float64(b.N)
	b.ReportMetric(heap+stack, "bytes/stream")
	b.ReportMetric(inuse+stack, "inuse-bytes/stream")
	b.ReportMetric(heap, "heap-bytes/stream")
	b.ReportMetric(inuse, "heap-inuse-bytes/stream")
	b.ReportMetric(stack, "stack-bytes/stream")
	if rss != 0 {
		b.ReportMetric(rss, "rss-bytes/stream")
	}
	b.ReportMetric(goroutines, "goroutines/stream")
	b.ReportMetric(float64(n), "streams")
}

// residentBytes is the resident set of the process (VmRSS), or 0 where /proc does not say.
func residentBytes() int64 {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(status)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// idleClients runs the client process of TestHelperIdleStreamClient with n streams to addr, and
// waits until every stream has its snapshot. stop ends the process, and with it the streams.
func idleClients(b *testing.B, addr string, n int) (stop func()) {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperIdleStreamClient$", "-test.count=1")
	cmd.Env = append(os.Environ(), "TABLEASE_BENCH_CLIENT_ADDR="+addr, "TABLEASE_BENCH_CLIENT_STREAMS="+strconv.Itoa(n))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "ready") {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		b.Fatalf("the client process said %q, %v", line, err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			_ = stdin.Close()
			_ = cmd.Wait()
		})
	}
	b.Cleanup(stop)
	return stop
}

// TestHelperIdleStreamClient is the client process of BenchmarkIdleStreams, not a test: without
// TABLEASE_BENCH_CLIENT_ADDR it returns at once. It opens the streams, reads each one's snapshot,
// prints "ready", and holds the connections, unread, until its stdin closes.
func TestHelperIdleStreamClient(t *testing.T) {
	addr := os.Getenv("TABLEASE_BENCH_CLIENT_ADDR")
	if addr == "" {
		return
	}
	n, _ := strconv.Atoi(os.Getenv("TABLEASE_BENCH_CLIENT_STREAMS"))
	h := &harness{t: t, auth: testAuthConfig()}
	conns := make([]net.Conn, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				user := "user-" + strconv.Itoa(i)
				c, err := openRawStream(addr, eventsPath("doc-1", "tabId=tab-"+strconv.Itoa(i)), h.token(user))
				if err != nil {
					t.Errorf("stream %d: %v", i, err)
					return
				}
				if _, err := c.until("snapshot"); err != nil {
					t.Errorf("stream %d: %v", i, err)
					return
				}
				conns[i] = c.conn
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		os.Exit(1)
	}
	fmt.Println("ready", n)
	_, _ = io.Copy(io.Discard, os.Stdin)
	for _, c := range conns {
		_ = c.Close()
	}
	os.Exit(0) // no test output to confuse the benchmark
}

// rawStream is a stream read from a plain connection, with no goroutine of the client's own.
type rawStream struct {
	conn net.Conn
	body *bufio.Reader
}

func openRawStream(addr, path, token string) (*rawStream, error) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	req, _ := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	if err := req.Write(conn); err != nil {
		conn.Close()
		return nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		conn.Close()
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		conn.Close()
		return nil, fmt.Errorf("%d %s", resp.StatusCode, body)
	}
	return &rawStream{conn: conn, body: bufio.NewReaderSize(resp.Body, 512)}, nil
}

// until reads events until one named name, and answers its data.
func (s *rawStream) until(name string) ([]byte, error) {
	var event string
	for {
		line, err := s.body.ReadSlice('\n')
		if err != nil {
			return nil, err
		}
		line = bytes.TrimRight(line, "\n")
		switch {
		case bytes.HasPrefix(line, []byte("event: ")):
			event = string(line[len("event: "):])
		case bytes.HasPrefix(line, []byte("data: ")) && event == name:
			return bytes.Clone(line[len("data: "):]), nil
		case len(line) == 0:
			event = ""
		}
	}
}

// BenchmarkTakeoverLatency measures the delay from a takeover (the moment its POST is sent) to
// the taken_over event on the stream of the tab that lost the lease, under load: 2×
// TABLEASE_BENCH_SESSIONS (default 50) streams whose sessions change hands as fast as
// 4×GOMAXPROCS clients can take them over, beside TABLEASE_BENCH_IDLE (default 500) idle streams
// (held by a client process of their own).
// It reports the p50, p99 and max delays; each op is one takeover.
func BenchmarkTakeoverLatency(b *testing.B) {
	sessions := benchEnvInt(b, "TABLEASE_BENCH_SESSIONS", 50)
	idle := benchEnvInt(b, "TABLEASE_BENCH_IDLE", 500)
	_, addr := benchServer(b, idle+2*sessions)
	token := func(user string) string {
		tok, err := IssueToken(testAuthConfig(), TokenSpec{Sub: user, TTL: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
		return tok
	}

	idleClients(b, addr, idle)

	type arrival struct {
		epoch int64
		at    time.Time
	}
	// A session is taken over by one worker only, so its fields need no lock.
	type session struct {
		sid    string
		token  string
		holder int             // 0 or 1: the tab holding the lease
		lost   [2]chan arrival // taken_over events seen by each tab's stream
	}
	all := make([]*session, sessions)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	post := func(s *session, tab int) (int64, error) {
		body := fmt.Sprintf(`{"tabId":"tab-%d","mode":"takeover"}`, tab)
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+leasePath(s.sid), strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+s.token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		var l struct {
			Epoch int64 `json:"epoch"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&l); err != nil || resp.StatusCode != 200 {
			return 0, fmt.Errorf("takeover: %d %v", resp.StatusCode, err)
		}
		return l.Epoch, nil
	}
	for i := range all {
		s := &session{sid: "doc-" + strconv.Itoa(i), token: token("busy-" + strconv.Itoa(i))}
		for tab := range 2 {
			st, err := openRawStream(addr, eventsPath(s.sid, "tabId=tab-"+strconv.Itoa(tab)), s.token)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := st.until("snapshot"); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { st.conn.Close() })
			ch := make(chan arrival, 1024)
			s.lost[tab] = ch
			go func() {
				for {
					data, err := st.until("lease")
					if err != nil {
						return
					}
					at := time.Now()
					var ev struct {
						Type     string        `json:"type"`
						Previous *previousJSON `json:"previous"`
						Epoch    int64         `json:"epoch"`
					}
					if json.Unmarshal(data, &ev) == nil && ev.Type == "taken_over" && ev.Previous != nil && ev.Previous.TabID == "tab-"+strconv.Itoa(tab) {
						ch <- arrival{epoch: ev.Epoch, at: at}
					}
				}
			}()
		}
		if _, err := post(s, 0); err != nil {
			b.Fatal(err)
		}
		all[i] = s
	}

	workers := 4 * runtime.GOMAXPROCS(0)
	latencies := make([]time.Duration, 0, b.N)
	var mu sync.Mutex
	var ops atomic.Int64
	b.ResetTimer()
	var wg sync.WaitGroup
	for w := range min(workers, sessions) {
		var owned []*session
		for i := w; i < sessions; i += workers {
			owned = append(owned, all[i])
		}
		wg.Go(func() {
			var mine []time.Duration
			defer func() { mu.Lock(); latencies = append(latencies, mine...); mu.Unlock() }()
			for k := 0; ops.Add(1) <= int64(b.N); k++ {
				s := owned[k%len(owned)]
				old, next := s.holder, 1-s.holder
				start := time.Now()
				epoch, err := post(s, next)
				if err != nil {
					b.Error(err)
					return
				}
			wait:
				for {
					select {
					case a := <-s.lost[old]:
						if a.epoch == epoch {
							mine = append(mine, a.at.Sub(start))
							break wait
						}
					case <-time.After(10 * time.Second):
						b.Errorf("no taken_over event for epoch %d of %s within 10s", epoch, s.sid)
						return
					}
				}
				s.holder = next
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if len(latencies) == 0 {
		return
	}
	slices.Sort(latencies)
	q := func(p float64) float64 {
		return float64(latencies[min(len(latencies)-1, int(p*float64(len(latencies))))]) / float64(time.Millisecond)
	}
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(q(1), "max-ms")
	b.ReportMetric(float64(idle+2*sessions), "streams")
}
