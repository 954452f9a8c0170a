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

// An idle stream handed over from net/http keeps one goroutine, the one that reads its connection:
// what it waits for starts a goroutine only while there is something to write. Events, and the
// end of the stream, still come at once.
func TestAnIdleStreamHasNoGoroutineButItsReader(t *testing.T) {
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
	for runtime.NumGoroutine()-before > n+2 { // the engine's expiry timer may run too

		if time.Now().After(deadline) {
			t.Fatalf("%d idle streams run %d goroutines, want one each", n, runtime.NumGoroutine()-before)
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
