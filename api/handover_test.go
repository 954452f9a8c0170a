package api

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Streams on HTTP/1.1 are handed over (the connection is hijacked from net/http once the stream
// has begun, see handOver); HTTP/2 and HTTP/1.0 streams stay with net/http. These tests check both
// paths end to end: events, the client's disconnect, Close.

// connStates records the states net/http reports for the connections of a test server.
type connStates struct {
	mu     sync.Mutex // protects states
	states []http.ConnState
}

func (c *connStates) hook(_ net.Conn, s http.ConnState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.states = append(c.states, s)
}

func (c *connStates) saw(s http.ConnState) bool { return c.count(s) > 0 }

// count is how many times a connection entered the state s.
func (c *connStates) count(s http.ConnState) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, x := range c.states {
		if x == s {
			n++
		}
	}
	return n
}

// startServer starts a test server on the harness's handler, with HTTP/2 over TLS when h2.
func (h *harness) startServer(h2 bool) (*httptest.Server, *connStates) {
	h.t.Helper()
	states := &connStates{}
	ts := httptest.NewUnstartedServer(h.srv.Handler())
	ts.Config.ConnState = states.hook
	if h2 {
		ts.EnableHTTP2 = true
		ts.StartTLS()
	} else {
		ts.Start()
	}
	h.t.Cleanup(func() { ts.CloseClientConnections(); ts.Close() })
	return ts, states
}

// streamRequestLogged reports whether the request line of a stream has been logged, which
// observe does when the handler returns.
func (h *harness) streamRequestLogged() bool {
	return strings.Contains(h.logs.String(), `"route":"/v1/sessions/:sid/events"`)
}

// waitTabs waits up to a second for the tabs of sid to number n.
func (h *harness) waitTabs(token, sid string, n int) {
	h.t.Helper()
	start := time.Now()
	for len(h.listTabs(token, sid)) != n {
		if time.Since(start) > time.Second {
			h.t.Fatalf("tabs of %s: %+v a second later, want %d", sid, h.listTabs(token, sid), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestAnHTTP11StreamIsHandedOverAndEndsWithTheLastChunk(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.Streams.Keepalive = time.Hour })
	ts, states := h.startServer(false)
	alice := h.token("alice")

	req, _ := http.NewRequest(http.MethodGet, ts.URL+eventsPath("doc-1", "tabId=tab-a"), nil)
	req.Header.Set("Authorization", "Bearer "+alice)
	resp, err := (&http.Client{Transport: &http.Transport{}}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.ProtoMajor != 1 || resp.ProtoMinor != 1 || len(resp.TransferEncoding) != 1 || resp.TransferEncoding[0] != "chunked" {
		t.Fatalf("%s %d, transfer encoding %v: want a chunked HTTP/1.1 200", resp.Proto, resp.StatusCode, resp.TransferEncoding)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" || resp.Header.Get("X-Request-Id") == "" {
		t.Fatalf("headers %v", resp.Header)
	}
	body := &rawStream{body: bufio.NewReader(resp.Body)}
	if _, err := body.until("snapshot"); err != nil {
		t.Fatal(err)
	}
	h.waitTabs(alice, "doc-1", 1)
	// The connection leaves net/http and the handler returns, while the stream goes on.
	for deadline := time.Now().Add(waitFor); !states.saw(http.StateHijacked) || !h.streamRequestLogged(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the stream was not handed over (hijacked %v, handler returned %v)", states.saw(http.StateHijacked), h.streamRequestLogged())
		}
	}
	h.acquire(alice, "doc-1", "tab-a", "try")
	if data, err := body.until("lease"); err != nil || !strings.Contains(string(data), `"granted"`) {
		t.Fatalf("%s, %v: want the granted event", data, err)
	}

	// Close ends it with the final event and the last chunk: a clean end of the body.
	go h.srv.Close()
	if _, err := body.until("shutdown"); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(body.body)
	if err != nil || len(strings.TrimSpace(string(rest))) != 0 {
		t.Fatalf("after the shutdown event: %q, %v; want the clean end of the body", rest, err)
	}
	h.waitTabs(alice, "doc-1", 0)
}

func TestAnHTTP2StreamIsServedByItsHandler(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.Streams.Keepalive = time.Hour })
	ts, states := h.startServer(true)
	alice := h.token("alice")
	client := ts.Client()

	open := func(tab string) *sseClient {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, ts.URL+eventsPath("doc-1", "tabId="+tab), nil)
		req.Header.Set("Authorization", "Bearer "+alice)
		resp, err := client.Do(req)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		if resp.StatusCode != 200 || resp.ProtoMajor != 2 {
			cancel()
			t.Fatalf("%s %d: want an HTTP/2 200", resp.Proto, resp.StatusCode)
		}
		c := &sseClient{t: t, resp: resp, cancel: cancel, items: make(chan sseItem, 1024)}
		t.Cleanup(c.close)
		go c.read()
		c.expect("snapshot", nil)
		return c
	}
	a, b := open("tab-a"), open("tab-b")
	a.expect("tabs", nil) // b joined
	if states.saw(http.StateHijacked) || h.streamRequestLogged() {
		t.Fatal("an HTTP/2 stream left its handler")
	}
	h.acquire(alice, "doc-1", "tab-a", "try")
	a.expectLease("granted")
	b.expectLease("granted")

	// A client that goes away leaves the tabs within a second.
	h.waitTabs(alice, "doc-1", 2)
	a.close()
	h.waitTabs(alice, "doc-1", 1)
	b.expect("tabs", nil) // a left

	go h.srv.Close()
	b.expect("shutdown", nil)
	if rest := b.expectEnd(); len(rest) != 0 {
		t.Fatalf("after the shutdown event: %+v", rest)
	}
	h.waitTabs(alice, "doc-1", 0)
}

func TestAnHTTP10StreamIsServedByItsHandlerAndEndsWithItsConnection(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.Streams.Keepalive = time.Hour })
	ts, states := h.startServer(false)
	alice := h.token("alice")

	conn, err := net.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(waitFor))
	fmt.Fprintf(conn, "GET %s HTTP/1.0\r\nAuthorization: Bearer %s\r\n\r\n", eventsPath("doc-1", "tabId=tab-a"), alice)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || len(resp.TransferEncoding) != 0 || !resp.Close {
		t.Fatalf("%d, transfer encoding %v, close %v: want a 200 whose body ends with the connection", resp.StatusCode, resp.TransferEncoding, resp.Close)
	}
	body := &rawStream{conn: conn, body: bufio.NewReader(resp.Body)}
	if _, err := body.until("snapshot"); err != nil {
		t.Fatal(err)
	}
	h.acquire(alice, "doc-1", "tab-a", "try")
	if _, err := body.until("lease"); err != nil {
		t.Fatal(err)
	}
	if states.saw(http.StateHijacked) || h.streamRequestLogged() {
		t.Fatal("an HTTP/1.0 stream left its handler")
	}
	h.waitTabs(alice, "doc-1", 1)
	conn.Close()
	h.waitTabs(alice, "doc-1", 0)
}

// maxStrayBytes is what package stream lets a client send after the request of its stream.
const maxStrayBytes = 4 << 10

func TestWhatAClientSendsAfterItsRequestIsDroppedUpToALimit(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.Streams.Keepalive = time.Hour })
	ts, _ := h.startServer(false)
	alice := h.token("alice")
	c, err := openRawStream(ts.Listener.Addr().String(), eventsPath("doc-1", "tabId=tab-a"), alice)
	if err != nil {
		t.Fatal(err)
	}
	defer c.conn.Close()
	_ = c.conn.SetDeadline(time.Now().Add(waitFor))
	if _, err := c.until("snapshot"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.conn.Write([]byte("GET / HTTP/1.1\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	h.acquire(alice, "doc-1", "tab-a", "try")
	if _, err := c.until("lease"); err != nil {
		t.Fatalf("the stream after a few stray bytes: %v", err)
	}
	if _, err := c.conn.Write(make([]byte, maxStrayBytes)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.until("never"); err != io.EOF {
		t.Fatalf("the stream of a client that sent %d bytes after its request: %v, want its end", maxStrayBytes, err)
	}
	h.waitTabs(alice, "doc-1", 0)
}

// A stream taken over ends as soon as its client goes away, by closing its connection or by
// resetting it, long before any write to the client would fail: its tab leaves the list at once.
// Many streams at once, so that each is told apart from the others that stay.
func TestAStreamTakenOverEndsAtOnceWhenItsClientGoesAway(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.Streams.Keepalive = time.Hour })
	ts, states := h.startServer(false)
	alice := h.token("alice")
	const n = 6
	streams := make([]*rawStream, n)
	for i := range streams {
		c, err := openRawStream(ts.Listener.Addr().String(), eventsPath("doc-1", "tabId=tab-"+strconv.Itoa(i)), alice)
		if err != nil {
			t.Fatal(err)
		}
		defer c.conn.Close()
		c.body = bufio.NewReaderSize(c.body, 16<<10) // a snapshot lists the tabs open before
		_ = c.conn.SetDeadline(time.Now().Add(waitFor))
		if _, err := c.until("snapshot"); err != nil {
			t.Fatal(err)
		}
		streams[i] = c
	}
	h.waitTabs(alice, "doc-1", n)
	for deadline := time.Now().Add(waitFor); states.count(http.StateHijacked) < n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d streams handed over", states.count(http.StateHijacked), n)
		}
	}
	// Closed, then reset (SO_LINGER 0), one after the other; the others go on.
	for i, c := range streams[:n-1] {
		if i%2 == 1 {
			_ = c.conn.(*net.TCPConn).SetLinger(0)
		}
		_ = c.conn.Close()
		h.waitTabs(alice, "doc-1", n-1-i)
	}
	last := streams[n-1]
	h.acquire(alice, "doc-1", "tab-0", "try")
	if _, err := last.until("lease"); err != nil {
		t.Fatalf("the stream whose client stayed: %v", err)
	}
}
