package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/tablease/tablease/api"
	"github.com/tablease/tablease/internal/redistest"
	"github.com/tablease/tablease/internal/syncbuf"
)

// sseEvent is one event read from a stream.
type sseEvent struct {
	id, name, data string
}

// eventStream reads an open event stream in a goroutine.
type eventStream struct {
	t      *testing.T
	events chan sseEvent // closed when the stream ends
	cancel context.CancelFunc
}

// openEvents opens GET base+path with token as a bearer token (none when empty). It fails the
// test with a clear message when the stream does not open.
func openEvents(t *testing.T, base, path, token string) *eventStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	resp, err := getEvents(ctx, base+path, token, "")
	if err != nil {
		cancel()
		t.Fatalf("GET %s: %v", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, body)
	}
	s := &eventStream{t: t, events: make(chan sseEvent, 256), cancel: cancel}
	t.Cleanup(cancel)
	go func() {
		defer close(s.events)
		defer resp.Body.Close()
		readSSE(resp.Body, func(ev sseEvent) { s.events <- ev })
	}()
	return s
}

// followEvents opens GET base+path as openEvents does, and follows it as an EventSource does: when
// the stream ends (as the server may end it while Redis fails over), it opens it again, with the
// id of the last event it read as Last-Event-ID, until the test ends. Its events are those of
// every connection in turn, each starting with its snapshot.
func followEvents(t *testing.T, base, path, token string) *eventStream {
	t.Helper()
	s := openEvents(t, base, path, token)
	first := s.events
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	out := &eventStream{t: t, events: make(chan sseEvent, 256), cancel: cancel}
	forward := func(ev sseEvent) bool {
		select {
		case out.events <- ev:
			return true
		case <-ctx.Done():
			return false
		}
	}
	go func() {
		defer close(out.events)
		last := ""
		for ev := range first {
			if ev.id != "" {
				last = ev.id
			}
			if !forward(ev) {
				return
			}
		}
		for ctx.Err() == nil {
			resp, err := getEvents(ctx, base+path, token, last)
			if err == nil && resp.StatusCode == http.StatusOK {
				readSSE(resp.Body, func(ev sseEvent) {
					if ev.id != "" {
						last = ev.id
					}
					forward(ev)
				})
			}
			if resp != nil {
				resp.Body.Close()
			}
			select { // the next attempt, as a client would retry
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
			}
		}
	}()
	return out
}

// getEvents sends GET url with token as a bearer token (none when empty) and lastID as
// Last-Event-ID (none when empty).
func getEvents(ctx context.Context, url, token, lastID string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	return (&http.Client{Transport: &http.Transport{}}).Do(req)
}

// readSSE reads the events of an event stream from body until it ends, handing each to emit.
func readSSE(body io.Reader, emit func(sseEvent)) {
	sc := bufio.NewScanner(body)
	var cur sseEvent
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			if cur.name != "" {
				emit(cur)
			}
			cur = sseEvent{}
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "id":
			cur.id = value
		case "event":
			cur.name = value
		case "data":
			cur.data = value
		}
	}
}

// next is the next event, or ok false when none came before deadline or the stream ended.
func (s *eventStream) next(deadline time.Time) (ev sseEvent, ok bool) {
	select {
	case ev, ok = <-s.events:
		return ev, ok
	case <-time.After(time.Until(deadline)):
		return sseEvent{}, false
	}
}

// must is the next event, which must be named name, within d.
func (s *eventStream) must(name string, d time.Duration) map[string]any {
	s.t.Helper()
	ev, ok := s.next(time.Now().Add(d))
	if !ok {
		s.t.Fatalf("no %s event within %v", name, d)
	}
	if ev.name != name {
		s.t.Fatalf("got event %s %s, want %s", ev.name, ev.data, name)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(ev.data), &m); err != nil {
		s.t.Fatalf("event data %q: %v", ev.data, err)
	}
	return m
}

// holderOf is the tab id of the holder in an event or snapshot, "" when null.
func holderOf(m map[string]any) string {
	h, _ := m["holder"].(map[string]any)
	id, _ := h["tabId"].(string)
	return id
}

// redisPair starts two `tablease serve` on one private Redis, as two instances behind a load
// balancer, and a client of each for alice.
func redisPair(t *testing.T) (c1, c2 client, rds *redistest.Server) {
	t.Helper()
	rds = redistest.Start(t)
	env := e2eRedisEnv(t, rds)
	base1, _ := startServer(t, env)
	base2, _ := startServer(t, env)
	tok, err := api.IssueToken(api.AuthConfig{HS256Secret: []byte(testSecret), Issuer: "e2e-idp", Audience: "tablease"},
		api.TokenSpec{Sub: "alice", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return client{t: t, base: base1, token: tok}, client{t: t, base: base2, token: tok}, rds
}

func TestAStreamThroughOneInstanceSeesATakeoverMadeThroughAnotherWithinASecond(t *testing.T) {
	c1, c2, _ := redisPair(t)
	const lease = "/v1/sessions/doc-1/lease"
	if code, body := c1.do("POST", lease, map[string]any{"tabId": "tab-a", "label": "Tab A"}); code != 200 {
		t.Fatalf("A acquires through instance 1: %d %v", code, body)
	}
	s := openEvents(t, c1.base, "/v1/sessions/doc-1/events?tabId=tab-a&label=Tab+A", c1.token)
	snap := s.must("snapshot", 5*time.Second)
	if holderOf(snap) != "tab-a" || snap["role"] != "owner" {
		t.Fatalf("snapshot through instance 1: %v", snap)
	}
	// The tab is listed through the other instance too.
	code, tabs := c2.do("GET", "/v1/sessions/doc-1/tabs", nil)
	list, _ := tabs["tabs"].([]any)
	if code != 200 || len(list) != 1 || list[0].(map[string]any)["tabId"] != "tab-a" {
		t.Fatalf("tabs through instance 2: %d %v", code, tabs)
	}

	code, b := c2.do("POST", lease, map[string]any{"tabId": "tab-b", "label": "Tab B", "mode": "takeover"})
	if code != 200 {
		t.Fatalf("B takes over through instance 2: %d %v", code, b)
	}
	deadline := time.Now().Add(time.Second)
	for {
		ev, ok := s.next(deadline)
		if !ok {
			t.Fatal("the stream through instance 1 did not carry the takeover made through instance 2 within 1s")
		}
		if ev.name != "lease" {
			continue // tabs events may come first
		}
		var m map[string]any
		_ = json.Unmarshal([]byte(ev.data), &m)
		if m["type"] != "taken_over" || holderOf(m) != "tab-b" || epochOf(t, m) != epochOf(t, b) {
			t.Fatalf("lease event %v, want the takeover by tab-b", m)
		}
		break
	}
}

func TestATicketIssuedByOneInstanceOpensOneStreamOnAnother(t *testing.T) {
	c1, c2, _ := redisPair(t)
	code, tk := c2.do("POST", "/v1/sessions/doc-1/events/ticket", map[string]any{"tabId": "tab-a"})
	ticket, _ := tk["ticket"].(string)
	if code != 200 || ticket == "" {
		t.Fatalf("ticket through instance 2: %d %v", code, tk)
	}
	path := "/v1/sessions/doc-1/events?ticket=" + url.QueryEscape(ticket)
	s := openEvents(t, c1.base, path, "")
	s.must("snapshot", 5*time.Second)
	resp, err := http.Get(c2.base + path)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the ticket used through instance 1 answered %d through instance 2, want 401", resp.StatusCode)
	}
}

func TestAStreamConvergesAfterItsInstanceLosesPubSub(t *testing.T) {
	c1, c2, rds := redisPair(t)
	const lease = "/v1/sessions/doc-1/lease"
	if code, body := c1.do("POST", lease, map[string]any{"tabId": "tab-a"}); code != 200 {
		t.Fatalf("A acquires: %d %v", code, body)
	}
	s := openEvents(t, c1.base, "/v1/sessions/doc-1/events?tabId=tab-a", c1.token)
	if snap := s.must("snapshot", 5*time.Second); holderOf(snap) != "tab-a" {
		t.Fatalf("snapshot: %v", snap)
	}

	// Every Pub/Sub connection of both instances is cut, and the lease changes meanwhile.
	rdb := rds.Client(t)
	killed, err := rdb.Do(t.Context(), "client", "kill", "type", "pubsub").Int()
	if err != nil || killed == 0 {
		t.Fatalf("CLIENT KILL TYPE pubsub = %d, %v; want the instances' subscriptions killed", killed, err)
	}
	code, b := c2.do("POST", lease, map[string]any{"tabId": "tab-b", "mode": "takeover"})
	if code != 200 {
		t.Fatalf("B takes over: %d %v", code, b)
	}
	epochB := epochOf(t, b)

	// The instance re-sends a snapshot (DESIGN: after a reconnect each instance re-sends the
	// snapshots of the sessions it serves), and the stream converges: the fresh snapshot or the
	// replay after it shows B's takeover.
	deadline := time.Now().Add(10 * time.Second)
	var resent, converged bool
	var seen []string
	for !resent || !converged {
		ev, ok := s.next(deadline)
		if !ok {
			t.Fatalf("within 10s of the Pub/Sub loss: snapshot re-sent %v, takeover shown %v; events %v", resent, converged, seen)
		}
		seen = append(seen, ev.name+" "+ev.data)
		var m map[string]any
		_ = json.Unmarshal([]byte(ev.data), &m)
		resent = resent || ev.name == "snapshot"
		if (ev.name == "lease" || ev.name == "snapshot") && holderOf(m) == "tab-b" && epochOf(t, m) == epochB {
			converged = true
		}
	}
}

// startStoppable runs `tablease serve` in-process like startServer, and returns a stop that
// cancels it (as SIGTERM does) and answers its exit code.
func startStoppable(t *testing.T, env map[string]string) (base string, stop func() int) {
	t.Helper()
	logs := &syncbuf.Buffer{}
	addrs := make(chan string, 1)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	p := Program{Stdout: io.Discard, Stderr: logs, Getenv: func(k string) string { return env[k] }, OnListen: func(a string) { addrs <- a }}
	done := make(chan int, 1)
	go func() { done <- p.Main(ctx, []string{"serve", "--addr", "127.0.0.1:0"}) }()
	select {
	case addr := <-addrs:
		base = "http://" + addr
	case code := <-done:
		t.Fatalf("serve exited %d before listening; logs:\n%s", code, logs)
	case <-time.After(15 * time.Second):
		t.Fatalf("serve did not listen within 15s; logs:\n%s", logs)
	}
	return base, func() int {
		cancel()
		select {
		case code := <-done:
			return code
		case <-time.After(15 * time.Second):
			t.Fatalf("serve did not stop within 15s of the signal; logs:\n%s", logs)
		}
		return -1
	}
}

func TestSIGTERMEndsStreamsWithAShutdownEventAndExitsPromptly(t *testing.T) {
	base, stop := startStoppable(t, map[string]string{"TABLEASE_DEV": "true", "TABLEASE_SHUTDOWN_TIMEOUT": "30s"})
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
	c := client{t: t, base: base, token: tok.Token}
	s := openEvents(t, base, "/v1/sessions/doc-1/events?tabId=tab-a", tok.Token)
	s.must("snapshot", 5*time.Second)
	if code, body := c.do("POST", "/v1/sessions/doc-1/lease", map[string]any{"tabId": "tab-a"}); code != 200 {
		t.Fatalf("acquire: %d %v", code, body)
	}
	if ev := s.must("lease", 5*time.Second); ev["type"] != "granted" {
		t.Fatalf("event %v", ev)
	}

	start := time.Now()
	if code := stop(); code != 0 {
		t.Fatalf("serve exited %d", code)
	}
	// Shutdown waits for nothing: the stream was ended first (a stream left open would have held
	// it for the whole 30s shutdown timeout).
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("serve took %v to stop with a stream open", d)
	}
	for {
		ev, ok := s.next(time.Now().Add(5 * time.Second))
		if !ok {
			t.Fatal("the stream ended without a shutdown event")
		}
		if ev.name == "shutdown" {
			break
		}
	}
	if ev, ok := s.next(time.Now().Add(5 * time.Second)); ok {
		t.Fatalf("after the shutdown event: %+v", ev)
	}
}
