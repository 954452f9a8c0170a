package stream

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/lease/leasemem"
)

// An idle stream handed over from net/http keeps no goroutine: what it waits for starts one only
// while there is something to write, and one goroutine of the process watches every such stream's
// connection for its client going away (hangup_linux.go). Events, and the end of the stream,
// still come at once.
func TestAnIdleStreamHasNoGoroutine(t *testing.T) {
	cfg := testConfig(t)
	eng := cfg.Feed.(*leasemem.Engine)
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user := r.URL.Query().Get("user")
		key := lease.Key{User: user, Session: "doc-1"}
		if err := h.Serve(w, r, Request{Key: key, Tab: lease.Tab{TabID: "tab-a"}}); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	defer h.Close(context.Background())

	const n = 40
	before := runtime.NumGoroutine()
	conns := make([]*bufio.Reader, n)
	for i := range n {
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET /?user=u%d HTTP/1.1\r\nHost: x\r\n\r\n", i)
		conns[i] = bufio.NewReader(c)
		readUntil(t, conns[i], "event: snapshot")
	}
	deadline := time.Now().Add(10 * time.Second)
	most := 3 // the engine's expiry timer, the process's hangup watcher
	if runtime.GOOS != "linux" {
		most = n + 2 // each stream's own reader (hangup_other.go)
	}
	for runtime.NumGoroutine()-before > most {
		if time.Now().After(deadline) {
			t.Fatalf("%d idle streams run %d goroutines, want at most %d", n, runtime.NumGoroutine()-before, most)
		}
		time.Sleep(10 * time.Millisecond)
	}

	key := lease.Key{User: "u7", Session: "doc-1"}
	if _, err := eng.Acquire(context.Background(), lease.AcquireRequest{Key: key, Holder: lease.Holder{TabID: "tab-a"}, TTL: time.Minute, Mode: lease.ModeTry}); err != nil {
		t.Fatal(err)
	}
	readUntil(t, conns[7], "event: lease")

	h.Close(context.Background())
	for i, r := range conns {
		readUntil(t, r, "event: shutdown")
		if i == 0 && h.Open() != 0 {
			t.Errorf("%d streams open after Close", h.Open())
		}
	}
}

// readUntil reads lines of r until one that is want.
func readUntil(t *testing.T, r *bufio.Reader, want string) {
	t.Helper()
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("before %q: %v", want, err)
		}
		if strings.TrimRight(line, "\r\n") == want {
			return
		}
	}
}
