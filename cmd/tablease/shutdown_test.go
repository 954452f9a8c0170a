package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tablease/tablease/api/stream"
	"github.com/tablease/tablease/internal/redistest"
	"github.com/tablease/tablease/internal/syncbuf"
)

// TestShutdownEndsInTimeWithAStreamClientThatStopsReading stops the server while one of its
// streams is stuck writing to a client that no longer reads (its socket buffers are full): the
// stop must end within TABLEASE_SHUTDOWN_TIMEOUT, not wait out the stream's write deadline.
func TestShutdownEndsInTimeWithAStreamClientThatStopsReading(t *testing.T) {
	const shutdownTimeout = time.Second
	base, stop := startStoppable(t, map[string]string{"TABLEASE_DEV": "true", "TABLEASE_RATE_LIMIT": "0", "TABLEASE_SHUTDOWN_TIMEOUT": shutdownTimeout.String()})
	resp, err := http.Get(base + "/dev/token?sub=alice")
	if err != nil {
		t.Fatal(err)
	}
	var tok struct {
		Token string `json:"token"`
	}
	err = json.NewDecoder(resp.Body).Decode(&tok)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}

	// A client with the smallest receive buffer the kernel allows, which never reads its stream.
	u, _ := url.Parse(base)
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 1) })
		if err != nil {
			return err
		}
		return serr
	}}
	conn, err := d.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "GET /v1/sessions/doc-1/events?tabId=reader&presence=false HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n\r\n", u.Host, tok.Token)

	// Events (takeovers with long labels) until the stream stops writing them: its writes block.
	c := client{t: t, base: base, token: tok.Token}
	label := strings.Repeat("x", 200)
	deadline := time.Now().Add(2 * time.Minute)
	for written := -1; ; {
		for i := range 100 {
			tab := "tab-" + strconv.Itoa(i%2)
			if code, body := c.do("POST", "/v1/sessions/doc-1/lease", map[string]any{"tabId": tab, "label": label, "mode": "takeover"}); code != 200 {
				t.Fatalf("takeover: %d %v", code, body)
			}
		}
		n := leaseEventsSent(t, base)
		if n == written {
			break // a whole batch of events and not one more written: the stream is stuck
		}
		written = n
		if time.Now().After(deadline) {
			t.Fatalf("the stream never stopped writing (%d events written)", n)
		}
	}

	start := time.Now()
	if code := stop(); code != 0 {
		t.Fatalf("serve exited %d", code)
	}
	took := time.Since(start)
	t.Logf("stopped %v after the signal, with TABLEASE_SHUTDOWN_TIMEOUT=%v", took.Round(time.Millisecond), shutdownTimeout)
	// Without the bound, the stop waits out the rest of the stream's write deadline (10s). The
	// margin is for the work after the deadline (closing connections and the store), on a busy
	// machine; it is well below what waiting out the write takes.
	if limit := shutdownTimeout + 3*time.Second; took > limit {
		t.Fatalf("the stop took %v: more than TABLEASE_SHUTDOWN_TIMEOUT (%v) and a margin; the stream's write deadline is %v",
			took, shutdownTimeout, stream.DefaultWriteTimeout)
	}
}

// leaseEventsSent reads tablease_events_sent_total{event="lease"} from base's /metrics.
func leaseEventsSent(t *testing.T, base string) int {
	t.Helper()
	v, err := metricValue(http.DefaultClient, base, `tablease_events_sent_total{event="lease"}`)
	if err != nil {
		t.Fatal(err)
	}
	return int(v)
}

// metricValue reads the value of series (a name and its labels, as /metrics writes them) from
// base's /metrics.
func metricValue(hc *http.Client, base, series string) (float64, error) {
	resp, err := hc.Get(base + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return 0, fmt.Errorf("no %s in /metrics (%d)", series, resp.StatusCode)
}

// TestShutdownEndsInTimeWhileRedisDoesNotAnswer stops the server, with two streams open and an
// acquire waiting, while its Redis is paused (SIGSTOP: connections stay open, nothing answers).
// Store calls are in flight then: the acquire, the streams leaving the presence list, the
// heartbeat of the event subscription, which closing the engine waits for. go-redis ends them at
// TABLEASE_REDIS_TIMEOUT, not when their context is cancelled, so the stop must fail them when
// TABLEASE_SHUTDOWN_TIMEOUT ends rather than wait for them; and before it closes the connections,
// so that the acquire is answered 503, each stream's end is logged, and "tablease stopped" is the
// last line.
func TestShutdownEndsInTimeWhileRedisDoesNotAnswer(t *testing.T) {
	const shutdownTimeout, redisTimeout = time.Second, 8 * time.Second
	rds := redistest.Start(t)
	s := serveAt(t, map[string]string{
		"TABLEASE_REDIS_URL":         rds.URL(),
		"TABLEASE_REDIS_TIMEOUT":     redisTimeout.String(),
		"TABLEASE_SHUTDOWN_TIMEOUT":  shutdownTimeout.String(),
		"TABLEASE_JWT_HS256_SECRET":  testSecret,
		"TABLEASE_JWT_ISSUER":        "e2e-idp",
		"TABLEASE_JWT_AUDIENCE":      "tablease",
		"TABLEASE_LEASE_SIGNING_KEY": keyFile(t),
	}, "127.0.0.1:0", &syncbuf.Buffer{})
	base, tok := "http://"+s.addr, e2eToken(t, "alice")
	for _, tab := range []string{"tab-a", "tab-b"} {
		openEvents(t, base, "/v1/sessions/doc-1/events?tabId="+tab, tok).must("snapshot", 5*time.Second)
	}

	rds.Pause(t)
	t.Cleanup(func() { rds.Resume(t) }) // before redistest kills it
	type answer struct {
		status int
		body   string
		err    error
	}
	acquired := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/sessions/doc-2/lease", strings.NewReader(`{"tabId":"tab-c"}`))
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			acquired <- answer{err: err}
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		acquired <- answer{status: resp.StatusCode, body: string(b)}
	}()
	// In flight: the acquire (the streams' connections were taken over), and the scrape itself.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if n, err := metricValue(http.DefaultClient, base, "tablease_http_requests_in_flight"); err != nil {
			t.Fatal(err)
		} else if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the acquire was not in flight within 5 s")
		}
	}
	start := time.Now()
	s.stop()
	took := time.Since(start)
	t.Logf("stopped %v after the signal, with TABLEASE_SHUTDOWN_TIMEOUT=%v and TABLEASE_REDIS_TIMEOUT=%v",
		took.Round(time.Millisecond), shutdownTimeout, redisTimeout)
	// The margin is for the work after the timeout on a busy machine; waiting out the Redis
	// timeout takes twice as long.
	if limit := shutdownTimeout + 3*time.Second; took > limit {
		t.Fatalf("the stop took %v: more than TABLEASE_SHUTDOWN_TIMEOUT (%v) and a margin, as if it waited out TABLEASE_REDIS_TIMEOUT (%v); logs:\n%s",
			took.Round(time.Millisecond), shutdownTimeout, redisTimeout, s.logs)
	}
	if a := <-acquired; a.err != nil || a.status != http.StatusServiceUnavailable || !strings.Contains(a.body, `"STORE_UNAVAILABLE"`) {
		t.Errorf("the acquire in flight got %d %q (%v), want 503 STORE_UNAVAILABLE; logs:\n%s", a.status, a.body, a.err, s.logs)
	}
	lines := strings.Split(strings.TrimSpace(s.logs.String()), "\n")
	if last := lines[len(lines)-1]; !strings.Contains(last, `"msg":"tablease stopped"`) {
		t.Errorf("the last line is %s, want \"tablease stopped\"", last)
	}
	if n := strings.Count(s.logs.String(), `"msg":"event stream ended"`); n != 2 {
		t.Errorf("%d \"event stream ended\" lines, want one for each of the 2 streams; logs:\n%s", n, s.logs)
	}
}
