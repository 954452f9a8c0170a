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
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), `tablease_events_sent_total{event="lease"} `); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return int(f)
		}
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	t.Fatal("no tablease_events_sent_total{event=\"lease\"} in /metrics")
	return 0
}

// TestShutdownEndsInTimeWhileRedisDoesNotAnswer stops the server, with two streams open, while its
// Redis is paused (SIGSTOP: connections stay open, nothing answers). Store calls are in flight
// then: the streams leaving the presence list, the heartbeat of the event subscription, which
// closing the engine waits for. go-redis ends them at TABLEASE_REDIS_TIMEOUT, not when their
// context is cancelled, so the stop must fail them when TABLEASE_SHUTDOWN_TIMEOUT ends rather than
// wait for them.
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
}
