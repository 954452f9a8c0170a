package api

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tablease/tablease/api/stream"
	"github.com/tablease/tablease/lease"
	"github.com/tablease/tablease/lease/leasemem"
)

// waitFor bounds every wait for something to arrive on a stream; tests poll, never sleep.
const waitFor = 5 * time.Second

// sseItem is one thing read from a stream: an event (a block with a data, event or id field), a
// block with only retry:, or a comment line.
type sseItem struct {
	ID      string
	HasID   bool
	Name    string // "message" when the block has no event: field
	Data    string
	Retry   string
	Comment string
	IsEvent bool
}

// sseClient reads one open stream in a goroutine.
type sseClient struct {
	t      *testing.T
	resp   *http.Response
	cancel context.CancelFunc
	items  chan sseItem // closed at the end of the stream
}

// serve starts a real HTTP server on the harness's handler, on a listener wrapped as cmd/tablease
// serves it (Server.ProtocolErrors). Its client connections are closed at cleanup (before the
// server's Close, which would wait for open streams).
func (h *harness) serve() *httptest.Server {
	h.t.Helper()
	return h.serveOn(func(ln net.Listener) net.Listener { return ln })
}

// serveOn is serve on the listener that wrap makes of the test server's, under ProtocolErrors.
func (h *harness) serveOn(wrap func(net.Listener) net.Listener) *httptest.Server {
	h.t.Helper()
	ts := httptest.NewUnstartedServer(h.srv.Handler())
	ts.Listener = h.srv.ProtocolErrors(wrap(ts.Listener))
	ts.Start()
	h.t.Cleanup(func() { ts.CloseClientConnections(); ts.Close() })
	return ts
}

// stream opens GET path (with its query) with token as a bearer token (none when empty) and
// headers. A 200 is read in the background; anything else is answered as it is, body unread.
func openStream(t *testing.T, ts *httptest.Server, path, token string, headers map[string]string) (*sseClient, *http.Response) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ts.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	client := &http.Client{Transport: &http.Transport{}} // a connection of its own
	resp, err := client.Do(req)
	if err != nil {
		cancel()
		t.Fatalf("GET %s: %v", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Cleanup(cancel)
		return nil, resp
	}
	c := &sseClient{t: t, resp: resp, cancel: cancel, items: make(chan sseItem, 1024)}
	t.Cleanup(c.close)
	go c.read()
	return c, resp
}

// mustStream opens a stream that must answer 200.
func mustStream(t *testing.T, ts *httptest.Server, path, token string, headers map[string]string) *sseClient {
	t.Helper()
	c, resp := openStream(t, ts, path, token, headers)
	if c == nil {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, body)
	}
	return c
}

func (c *sseClient) close() { c.cancel() }

func (c *sseClient) read() {
	defer close(c.items)
	sc := bufio.NewScanner(c.resp.Body)
	var cur sseItem
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			if cur.IsEvent || cur.Retry != "" {
				if cur.IsEvent && cur.Name == "" {
					cur.Name = "message"
				}
				c.items <- cur
			}
			cur = sseItem{}
			continue
		}
		if text, ok := strings.CutPrefix(line, ":"); ok {
			c.items <- sseItem{Comment: strings.TrimPrefix(text, " ")}
			continue
		}
		field, value, _ := strings.Cut(line, ":")
		value = strings.TrimPrefix(value, " ")
		switch field {
		case "id":
			cur.ID, cur.HasID, cur.IsEvent = value, true, true
		case "event":
			cur.Name, cur.IsEvent = value, true
		case "data":
			if cur.Data != "" {
				cur.Data += "\n"
			}
			cur.Data += value
			cur.IsEvent = true
		case "retry":
			cur.Retry = value
		}
	}
}

// nextItem is the next item, comments included.
func (c *sseClient) nextItem() sseItem {
	c.t.Helper()
	select {
	case it, ok := <-c.items:
		if !ok {
			c.t.Fatal("the stream ended while an item was expected")
		}
		return it
	case <-time.After(waitFor):
		c.t.Fatalf("nothing arrived on the stream within %v", waitFor)
	}
	return sseItem{}
}

// next is the next event, skipping comments and retry-only blocks.
func (c *sseClient) next() sseItem {
	c.t.Helper()
	for {
		if it := c.nextItem(); it.IsEvent {
			return it
		}
	}
}

// expect reads the next event, which must be named name, and decodes its data into v (when not
// nil) strictly.
func (c *sseClient) expect(name string, v any) sseItem {
	c.t.Helper()
	it := c.next()
	if it.Name != name {
		c.t.Fatalf("got event %q (%s), want %q", it.Name, it.Data, name)
	}
	if v != nil {
		dec := json.NewDecoder(strings.NewReader(it.Data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(v); err != nil {
			c.t.Fatalf("decoding the %s event %s: %v", name, it.Data, err)
		}
	}
	return it
}

// expectLease reads the next event, which must be a lease event of type typ.
func (c *sseClient) expectLease(typ string) (leaseEventAnswer, sseItem) {
	c.t.Helper()
	var ev leaseEventAnswer
	it := c.expect("lease", &ev)
	if ev.Type != typ {
		c.t.Fatalf("got a lease event %s, want %s: %s", ev.Type, typ, it.Data)
	}
	hasKeys(c.t, it.Data, "type", "sessionId", "epoch", "holder", "previous", "reason", "at")
	if !it.HasID {
		c.t.Fatalf("a lease event without an id: %s", it.Data)
	}
	return ev, it
}

// expectEnd waits until the stream ends.
func (c *sseClient) expectEnd() []sseItem {
	c.t.Helper()
	var seen []sseItem
	deadline := time.After(waitFor)
	for {
		select {
		case it, ok := <-c.items:
			if !ok {
				return seen
			}
			seen = append(seen, it)
		case <-deadline:
			c.t.Fatalf("the stream did not end within %v; read %v", waitFor, seen)
		}
	}
}

// quiet checks that no event arrives within d.
func (c *sseClient) quiet(d time.Duration) {
	c.t.Helper()
	deadline := time.After(d)
	for {
		select {
		case it, ok := <-c.items:
			if ok && it.IsEvent {
				c.t.Fatalf("unexpected event %s: %s", it.Name, it.Data)
			}
			if !ok {
				return
			}
		case <-deadline:
			return
		}
	}
}

// hasKeys checks that the JSON object data has exactly the keys want.
func hasKeys(t *testing.T, data string, want ...string) {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(data), &m); err != nil {
		t.Fatalf("%s: %v", data, err)
	}
	if len(m) != len(want) {
		t.Fatalf("keys of %s: want exactly %v", data, want)
	}
	for _, k := range want {
		if _, ok := m[k]; !ok {
			t.Fatalf("%s lacks %q", data, k)
		}
	}
}

type leaseEventAnswer struct {
	Type      string        `json:"type"`
	SessionID string        `json:"sessionId"`
	Epoch     int64         `json:"epoch"`
	Holder    *holderJSON   `json:"holder"`
	Previous  *previousJSON `json:"previous"`
	Reason    string        `json:"reason"`
	At        string        `json:"at"`
}

type tabAnswer struct {
	TabID       string `json:"tabId"`
	Label       string `json:"label"`
	Hidden      bool   `json:"hidden"`
	ConnectedAt string `json:"connectedAt"`
}

type tabsEventAnswer struct {
	Type      string    `json:"type"`
	SessionID string    `json:"sessionId"`
	Tab       tabAnswer `json:"tab"`
	Reason    string    `json:"reason"`
	At        string    `json:"at"`
}

type snapshotAnswer struct {
	leaseAnswer
	Tabs           []tabAnswer `json:"tabs"`
	Resumed        bool        `json:"resumed"`
	CatalogVersion *string     `json:"catalogVersion"`
	KeepaliveMs    int64       `json:"keepaliveMs"`
}

func eventsPath(sid, query string) string {
	p := "/v1/sessions/" + sid + "/events"
	if query != "" {
		p += "?" + query
	}
	return p
}

// acquire takes the lease of sid for tab over the harness's handler and returns the epoch.
func (h *harness) acquire(token, sid, tab, mode string) int64 {
	h.t.Helper()
	l := readLease(h.t, h.post(leasePath(sid), token, fmt.Sprintf(`{"tabId":%q,"label":"Tab %s","mode":%q}`, tab, tab, mode)))
	return l.Epoch
}

// httpError checks a non-200 answer of a real request: its status and JSON error code.
func httpError(t *testing.T, resp *http.Response, status int, code string) errorAnswer {
	t.Helper()
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d: %s", resp.StatusCode, status, body)
	}
	var e errorAnswer
	if err := json.Unmarshal(body, &e); err != nil || e.Error.Code != code {
		t.Fatalf("body %s, want code %s (%v)", body, code, err)
	}
	return e
}

func idOf(t *testing.T, id string) lease.EventID {
	t.Helper()
	e, err := lease.ParseEventID(id)
	if err != nil {
		t.Fatalf("event id %q: %v", id, err)
	}
	return e
}

func TestTheStreamOpensWithRetryThenASnapshotOfTheLeaseAsGetAnswersIt(t *testing.T) {
	h := newHarness(t)
	ts := h.serve()
	alice := h.token("alice")
	h.acquire(alice, "doc-1", "tab-a", "try")

	c := mustStream(t, ts, eventsPath("doc-1", "tabId=tab-b&label=Calendar&hidden=true"), alice, nil)
	hdr := c.resp.Header
	if hdr.Get("Content-Type") != "text/event-stream" || hdr.Get("X-Accel-Buffering") != "no" ||
		!strings.Contains(hdr.Get("Cache-Control"), "no-cache") {
		t.Fatalf("headers: %v", hdr)
	}
	first := c.nextItem()
	if first.Retry != "2000" || first.IsEvent {
		t.Fatalf("the stream opens with %+v, want retry: 2000", first)
	}
	var snap snapshotAnswer
	it := c.expect("snapshot", &snap)
	hasKeys(t, it.Data, "sessionId", "held", "holder", "epoch", "grantedAt", "expiresAt", "ttlMs",
		"remainingMs", "renewAfterMs", "transitions", "blockedUntil", "role", "tabs", "resumed", "catalogVersion", "keepaliveMs")
	if snap.KeepaliveMs != stream.DefaultKeepalive.Milliseconds() {
		t.Fatalf("keepaliveMs %d, want the default keepalive's", snap.KeepaliveMs)
	}

	got := readLease(t, h.get(leasePath("doc-1")+"?tabId=tab-b", alice))
	want := snap.leaseAnswer
	if want.Role == nil || *want.Role != "viewer" || want.SessionID != "doc-1" || !want.Held || want.Holder.TabID != "tab-a" ||
		want.Epoch != got.Epoch || *want.GrantedAt != *got.GrantedAt || *want.ExpiresAt != *got.ExpiresAt ||
		want.TTLMs != got.TTLMs || want.RemainingMs != got.RemainingMs || want.Transitions != got.Transitions {
		t.Fatalf("snapshot %+v differs from GET's %+v", want, got)
	}
	if len(snap.Tabs) != 1 || snap.Tabs[0].TabID != "tab-b" || snap.Tabs[0].Label != "Calendar" || !snap.Tabs[0].Hidden || snap.Tabs[0].ConnectedAt == "" {
		t.Fatalf("the snapshot lists the tabs %+v, want the stream's own tab", snap.Tabs)
	}
	if snap.Resumed {
		t.Fatal("a first connect is not a resume")
	}
	// The snapshot's id is the position of the log it was read at: the grant's event.
	if !it.HasID {
		t.Fatal("the snapshot of a session with events has no id")
	}
	rel := h.post(leasePath("doc-1")+"/release", alice, fmt.Sprintf(`{"tabId":"tab-a","epoch":%d}`, got.Epoch))
	if rel.Code != 200 {
		t.Fatal(rel.Body)
	}
	_, ev := c.expectLease("released")
	if idOf(t, ev.ID).Compare(idOf(t, it.ID)) <= 0 {
		t.Fatalf("an event id %s is not after the snapshot's %s", ev.ID, it.ID)
	}
}

func TestAStreamOfASessionWithoutEventsOpensWithASnapshotWithoutID(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.Engine = storeParts{o.Engine, o.Engine, noPresence{}, o.Engine} })
	ts := h.serve()
	c := mustStream(t, ts, eventsPath("doc-new", "tabId=tab-a"), h.token("alice"), nil)
	var snap snapshotAnswer
	it := c.expect("snapshot", &snap)
	if it.HasID || snap.Held || snap.Epoch != 0 || snap.Holder != nil || *snap.Role != "viewer" || len(snap.Tabs) != 0 {
		t.Fatalf("snapshot of a new session: %+v %+v", it, snap)
	}
}

func TestLeaseEventsArriveInOrderWithIncreasingIDs(t *testing.T) {
	h := newHarness(t)
	ts := h.serve()
	alice := h.token("alice")
	c := mustStream(t, ts, eventsPath("doc-1", "tabId=tab-a"), alice, nil)
	c.expect("snapshot", nil)

	epochA := h.acquire(alice, "doc-1", "tab-a", "try")
	epochB := h.acquire(alice, "doc-1", "tab-b", "takeover")
	if rec := h.post(leasePath("doc-1")+"/renew", alice, fmt.Sprintf(`{"tabId":"tab-b","epoch":%d,"hidden":true}`, epochB)); rec.Code != 200 {
		t.Fatal(rec.Body)
	}
	if rec := h.post(leasePath("doc-1")+"/release", alice, fmt.Sprintf(`{"tabId":"tab-b","epoch":%d}`, epochB)); rec.Code != 200 {
		t.Fatal(rec.Body)
	}
	h.acquire(alice, "doc-1", "tab-a", "try")
	h.clock.Advance(time.Minute) // past the default TTL: the engine's timer announces the expiry

	var last lease.EventID
	next := func(typ string) leaseEventAnswer {
		t.Helper()
		ev, it := c.expectLease(typ)
		id := idOf(t, it.ID)
		if id.Compare(last) <= 0 {
			t.Fatalf("event id %s is not after %s", it.ID, last)
		}
		last = id
		if ev.SessionID != "doc-1" || ev.At == "" {
			t.Fatalf("event %+v", ev)
		}
		return ev
	}
	g := next("granted")
	if g.Epoch != epochA || g.Holder == nil || g.Holder.TabID != "tab-a" || g.Holder.Label != "Tab tab-a" || g.Previous != nil {
		t.Fatalf("granted: %+v", g)
	}
	to := next("taken_over")
	if to.Epoch != epochB || to.Holder.TabID != "tab-b" || to.Previous == nil || *to.Previous != (previousJSON{TabID: "tab-a", Epoch: epochA}) {
		t.Fatalf("taken_over: %+v", to)
	}
	up := next("updated")
	if up.Epoch != epochB || up.Holder == nil || !up.Holder.Hidden || up.Previous != nil {
		t.Fatalf("updated: %+v", up)
	}
	rel := next("released")
	if rel.Epoch != epochB || rel.Holder != nil || rel.Previous == nil || *rel.Previous != (previousJSON{TabID: "tab-b", Epoch: epochB}) {
		t.Fatalf("released: %+v", rel)
	}
	again := next("granted")
	if again.Epoch <= epochB || again.Holder.TabID != "tab-a" {
		t.Fatalf("granted again: %+v", again)
	}
	exp := next("expired")
	if exp.Epoch != again.Epoch || exp.Holder != nil || exp.Previous == nil || exp.Previous.TabID != "tab-a" {
		t.Fatalf("expired: %+v", exp)
	}
}

func TestLastEventIDReplaysWhatWasMissedAfterASnapshot(t *testing.T) {
	for _, how := range []string{"header", "query"} {
		t.Run("given in the "+how, func(t *testing.T) {
			h := newHarness(t)
			ts := h.serve()
			alice := h.token("alice")
			c := mustStream(t, ts, eventsPath("doc-1", "tabId=tab-a"), alice, nil)
			c.expect("snapshot", nil)
			epochA := h.acquire(alice, "doc-1", "tab-a", "try")
			_, granted := c.expectLease("granted")
			c.close()
			c.expectEnd()
			for len(h.listTabs(alice, "doc-1")) != 0 { // the server has seen the disconnect
				time.Sleep(5 * time.Millisecond)
			}

			epochB := h.acquire(alice, "doc-1", "tab-b", "takeover")
			if rec := h.post(leasePath("doc-1")+"/release", alice, fmt.Sprintf(`{"tabId":"tab-b","epoch":%d}`, epochB)); rec.Code != 200 {
				t.Fatal(rec.Body)
			}

			query, headers := "tabId=tab-a", map[string]string{}
			if how == "header" {
				headers["Last-Event-ID"] = granted.ID
			} else {
				query += "&lastEventId=" + url.QueryEscape(granted.ID)
			}
			r := mustStream(t, ts, eventsPath("doc-1", query), alice, headers)
			var snap snapshotAnswer
			it := r.expect("snapshot", &snap)
			if !snap.Resumed || it.HasID || snap.Held || snap.Epoch != epochB {
				t.Fatalf("the snapshot of a resume: %+v (id %q), want resumed, without id, the lease free at %d", snap, it.ID, epochB)
			}
			// The replay: the old connection's tab leaving, the takeover, the release, and the new
			// connection's tab joining, in the order they happened.
			var got []string
			for range 4 {
				it := r.next()
				var ev struct {
					Type     string        `json:"type"`
					Epoch    int64         `json:"epoch"`
					Previous *previousJSON `json:"previous"`
				}
				if err := json.Unmarshal([]byte(it.Data), &ev); err != nil || !it.HasID {
					t.Fatalf("replayed %+v: %v", it, err)
				}
				got = append(got, it.Name+":"+ev.Type)
				if ev.Type == "taken_over" && (ev.Epoch != epochB || ev.Previous.Epoch != epochA) {
					t.Fatalf("replayed takeover %+v", ev)
				}
			}
			if want := []string{"tabs:left", "lease:taken_over", "lease:released", "tabs:joined"}; !slices.Equal(got, want) {
				t.Fatalf("replay %v, want %v", got, want)
			}
			r.quiet(100 * time.Millisecond)
		})
	}
}

func TestAnIDOlderThanTheLogOrNotAnIDStartsFromAPlainSnapshot(t *testing.T) {
	for _, id := range []string{"1-0", "garbage", "99999999999999999999999-0"} {
		t.Run(id, func(t *testing.T) {
			h := newHarness(t)
			ts := h.serve()
			alice := h.token("alice")
			epoch := h.acquire(alice, "doc-1", "tab-a", "try")
			c := mustStream(t, ts, eventsPath("doc-1", "tabId=tab-a"), alice, map[string]string{"Last-Event-ID": id})
			var snap snapshotAnswer
			it := c.expect("snapshot", &snap)
			if snap.Resumed || !it.HasID || !snap.Held || snap.Epoch != epoch || *snap.Role != "owner" {
				t.Fatalf("snapshot %+v (id %q): want a plain snapshot with the log position", snap, it.ID)
			}
			c.quiet(100 * time.Millisecond) // no replay
		})
	}
}

func TestAnotherUsersEventsNeverAppear(t *testing.T) {
	h := newHarness(t)
	ts := h.serve()
	alice, bob := h.token("alice"), h.token("bob")
	cb := mustStream(t, ts, eventsPath("doc-1", "tabId=tab-b"), bob, nil)
	var snap snapshotAnswer
	cb.expect("snapshot", &snap)
	ca := mustStream(t, ts, eventsPath("doc-1", "tabId=tab-a"), alice, nil)
	ca.expect("snapshot", nil)

	h.acquire(alice, "doc-1", "tab-a", "try")
	h.acquire(alice, "doc-1", "tab-x", "takeover")
	ca.expectLease("granted")
	ca.expectLease("taken_over")
	// Bob's own change is the first thing his stream carries: Alice's events and her tab never
	// reached it.
	h.acquire(bob, "doc-1", "tab-b", "try")
	g, _ := cb.expectLease("granted")
	if g.Holder.TabID != "tab-b" {
		t.Fatalf("bob's stream: %+v", g)
	}
	var list tabsJSON
	decodeStrict(t, h.get("/v1/sessions/doc-1/tabs", bob), &list)
	if len(list.Tabs) != 1 || list.Tabs[0].TabID != "tab-b" {
		t.Fatalf("bob's tabs: %+v", list.Tabs)
	}
	if len(snap.Tabs) != 1 || snap.Tabs[0].TabID != "tab-b" {
		t.Fatalf("bob's snapshot lists %+v", snap.Tabs)
	}
}

func TestATokenRestrictedToOtherSessionsCannotOpenTheStream(t *testing.T) {
	h := newHarness(t)
	ts := h.serve()
	_, resp := openStream(t, ts, eventsPath("doc-1", "tabId=tab-a"), h.token("alice", "doc-2"), nil)
	httpError(t, resp, http.StatusForbidden, CodeForbidden)
}

func TestStreamArgumentsAreValidated(t *testing.T) {
	h := newHarness(t)
	ts := h.serve()
	alice := h.token("alice")
	for _, q := range []string{"", "tabId=", "tabId=bad%20tab", "tabId=t&hidden=yes", "tabId=t&label=" + strings.Repeat("x", 201), "tabId=t&label=%07"} {
		_, resp := openStream(t, ts, eventsPath("doc-1", q), alice, nil)
		if resp == nil || resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("query %q: want 400", q)
		}
		httpError(t, resp, http.StatusBadRequest, CodeInvalidArgument)
	}
	_, resp := openStream(t, ts, eventsPath("bad%20sid", "tabId=t"), alice, nil)
	httpError(t, resp, http.StatusBadRequest, CodeInvalidArgument)
}

// --- tickets ------------------------------------------------------------------------------------

func (h *harness) ticket(token, sid, tab string) string {
	h.t.Helper()
	rec := h.post("/v1/sessions/"+sid+"/events/ticket", token, fmt.Sprintf(`{"tabId":%q}`, tab))
	if rec.Code != 200 {
		h.t.Fatalf("ticket: %d %s", rec.Code, rec.Body)
	}
	var tk ticketJSON
	decodeStrict(h.t, rec, &tk)
	if tk.Ticket == "" || tk.ExpiresInMs <= 0 || tk.ExpiresInMs > 30000 || rec.Header().Get("Cache-Control") != "no-store" {
		h.t.Fatalf("ticket answer %+v, %v", tk, rec.Header())
	}
	return tk.Ticket
}

func TestATicketOpensOneStreamForItsUserSessionAndTab(t *testing.T) {
	h := newHarness(t)
	ts := h.serve()
	alice := h.token("alice")
	tk := h.ticket(alice, "doc-1", "tab-a")

	c := mustStream(t, ts, eventsPath("doc-1", "ticket="+url.QueryEscape(tk)), "", nil)
	var snap snapshotAnswer
	c.expect("snapshot", &snap)
	if *snap.Role != "viewer" || len(snap.Tabs) != 1 || snap.Tabs[0].TabID != "tab-a" {
		t.Fatalf("a ticket's stream is for its tab: %+v", snap)
	}
	h.acquire(alice, "doc-1", "tab-a", "try")
	c.expectLease("granted")

	// Used: refused, whatever else the request says.
	_, resp := openStream(t, ts, eventsPath("doc-1", "tabId=tab-a&ticket="+url.QueryEscape(tk)), "", nil)
	e := httpError(t, resp, http.StatusUnauthorized, CodeUnauthenticated)
	if !strings.Contains(e.Error.Message, "used") {
		t.Fatalf("reuse: %s", e.Error.Message)
	}
	if strings.Contains(h.logs.String(), tk) {
		t.Fatal("a ticket appeared in the logs")
	}
}

func TestTicketsThatAreUsedExpiredForeignOrForgedAreRefused(t *testing.T) {
	h := newHarness(t)
	ts := h.serve()
	alice, bob := h.token("alice"), h.token("bob")
	q := func(tk string) string { return "ticket=" + url.QueryEscape(tk) }

	expired := h.ticket(alice, "doc-1", "tab-a")
	h.clock.Advance(stream.TicketTTL)
	other := h.ticket(alice, "doc-1", "tab-a")
	tampered := []byte(h.ticket(alice, "doc-1", "tab-a"))
	tampered[len(tampered)/2] ^= 1
	otherKey := newHarness(t, func(o *Options) { o.Streams.TicketSecret = []byte(strings.Repeat("k", 32)) })
	forged := otherKey.ticket(alice, "doc-1", "tab-a")
	bobs := h.ticket(bob, "doc-2", "tab-b")

	cases := []struct {
		name, path, token string
		headers           map[string]string
		status            int
		want              string
	}{
		{"an expired ticket is refused", eventsPath("doc-1", q(expired)), "", nil, 401, "expired"},
		{"a ticket for another session is refused", eventsPath("doc-2", q(other)), "", nil, 401, "another session"},
		{"a ticket for another tab is refused", eventsPath("doc-1", "tabId=tab-z&"+q(other)), "", nil, 401, "another tab"},
		{"a tampered ticket is refused", eventsPath("doc-1", q(string(tampered))), "", nil, 401, "not valid"},
		{"a ticket signed with another key is refused", eventsPath("doc-1", q(forged)), "", nil, 401, "not valid"},
		{"garbage is refused", eventsPath("doc-1", "ticket=abc"), "", nil, 401, "not valid"},
		{"a ticket with an Authorization header is refused", eventsPath("doc-1", q(other)), alice, nil, 401, "not both"},
		{"an access token in the query is refused", eventsPath("doc-1", "tabId=tab-a&access_token="+alice), "", nil, 401, "URL"},
		{"an access token in the query is refused even with a header", eventsPath("doc-1", "tabId=tab-a&token="+alice), alice, nil, 401, "URL"},
		{"a ticket is accepted nowhere else", leasePath("doc-1") + "?" + q(other), "", nil, 401, "Authorization"},
		{"another user's ticket opens only that user's session", eventsPath("doc-1", q(bobs)), "", nil, 401, "another session"},
	}
	t.Run("a ticket given twice is refused, as every parameter given twice is", func(t *testing.T) {
		_, resp := openStream(t, ts, eventsPath("doc-1", q(other)+"&"+q(other)), "", nil)
		if resp == nil {
			t.Fatal("the stream opened")
		}
		if e := httpError(t, resp, http.StatusBadRequest, CodeInvalidArgument); e.Error.Details["field"] != "ticket" {
			t.Fatalf("details %v", e.Error.Details)
		}
	})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, resp := openStream(t, ts, tc.path, tc.token, tc.headers)
			if resp == nil {
				t.Fatal("the stream opened")
			}
			e := httpError(t, resp, tc.status, CodeUnauthenticated)
			if !strings.Contains(e.Error.Message, tc.want) {
				t.Fatalf("message %q, want it to say %q", e.Error.Message, tc.want)
			}
			if resp.Header.Get("WWW-Authenticate") == "" {
				t.Fatal("no WWW-Authenticate")
			}
		})
	}
	// None of the refusals used up the ticket they refused for binding reasons.
	c := mustStream(t, ts, eventsPath("doc-1", "tabId=tab-a&"+q(other)), "", nil)
	c.expect("snapshot", nil)
	logs := h.logs.String()
	for _, tk := range []string{expired, other, string(tampered), forged, bobs, alice} {
		if strings.Contains(logs, tk) {
			t.Fatal("a ticket or token appeared in the logs")
		}
	}
}

func TestTicketsNeedAValidBodyAndAToken(t *testing.T) {
	h := newHarness(t)
	alice := h.token("alice")
	wantError(t, h.post("/v1/sessions/doc-1/events/ticket", "", `{"tabId":"t"}`), 401, CodeUnauthenticated)
	wantError(t, h.post("/v1/sessions/doc-1/events/ticket", alice, `{"tabId":"bad tab"}`), 400, CodeInvalidArgument)
	wantError(t, h.post("/v1/sessions/doc-1/events/ticket", alice, `{"tabId":"t","x":1}`), 400, CodeInvalidArgument)
	wantError(t, h.post("/v1/sessions/doc-1/events/ticket", h.token("alice", "doc-2"), `{"tabId":"t"}`), 403, CodeForbidden)
}

func TestATicketIsSingleUseAcrossInstancesSharingTheirNonces(t *testing.T) {
	nonces := leasemem.NewNonceStore(nil)
	a := newHarness(t, func(o *Options) { o.Nonces = nonces })
	b := newHarness(t, func(o *Options) { o.Engine, o.Now, o.Nonces = a.engine, a.clock.Now, nonces })
	tsA, tsB := a.serve(), b.serve()
	tk := a.ticket(a.token("alice"), "doc-1", "tab-a")
	c := mustStream(t, tsB, eventsPath("doc-1", "ticket="+url.QueryEscape(tk)), "", nil)
	c.expect("snapshot", nil)
	_, resp := openStream(t, tsA, eventsPath("doc-1", "ticket="+url.QueryEscape(tk)), "", nil)
	httpError(t, resp, http.StatusUnauthorized, CodeUnauthenticated)
}

// --- limits, presence, catalog, shutdown -------------------------------------------------------------

// TestAStreamOfOneTabTooManyIsRefusedAndCounted: a listing stream of a tab the session's full
// presence list has no room for is 409 TOO_MANY_TABS, counted as a refused stream.
func TestAStreamOfOneTabTooManyIsRefusedAndCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := newHarness(t, func(o *Options) { o.Registry = reg })
	ts := h.serve()
	alice := h.token("alice")
	for i := range lease.MaxPresence {
		h.putTab(alice, "doc-1", fmt.Sprintf("tab-%d", i), "")
	}
	_, resp := openStream(t, ts, eventsPath("doc-1", "tabId=t-new"), alice, nil)
	httpError(t, resp, http.StatusConflict, CodeTooManyTabs)
	if want := `tablease_event_streams_refused_total{reason="too_many_tabs"} 1`; !strings.Contains(h.get("/metrics", "").Body.String(), want) {
		t.Fatalf("/metrics lacks %s", want)
	}
}

func TestStreamsBeyondTheLimitsAreRateLimited(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.Streams = stream.Options{PerUser: 2, PerInstance: 3} })
	ts := h.serve()
	alice, bob, carol := h.token("alice"), h.token("bob"), h.token("carol")
	a1 := mustStream(t, ts, eventsPath("doc-1", "tabId=t1"), alice, nil)
	mustStream(t, ts, eventsPath("doc-2", "tabId=t2"), alice, nil)
	_, resp := openStream(t, ts, eventsPath("doc-3", "tabId=t3"), alice, nil)
	if resp.Header.Get("Retry-After") == "" {
		t.Fatal("no Retry-After")
	}
	e := httpError(t, resp, http.StatusTooManyRequests, CodeRateLimited)
	if e.Error.Details["limit"] != "user" || !*e.Error.Retryable {
		t.Fatalf("per-user refusal: %+v", e.Error)
	}
	mustStream(t, ts, eventsPath("doc-1", "tabId=t1"), bob, nil)
	_, resp = openStream(t, ts, eventsPath("doc-1", "tabId=t1"), carol, nil)
	e = httpError(t, resp, http.StatusTooManyRequests, CodeRateLimited)
	if e.Error.Details["limit"] != "instance" {
		t.Fatalf("per-instance refusal: %+v", e.Error)
	}
	// A stream that ends gives its place back.
	a1.close()
	deadline := time.Now().Add(waitFor)
	for {
		c, resp := openStream(t, ts, eventsPath("doc-1", "tabId=t1"), carol, nil)
		if c != nil {
			break
		}
		resp.Body.Close()
		if time.Now().After(deadline) {
			t.Fatalf("no place after a stream ended: %d", resp.StatusCode)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (h *harness) listTabs(token, sid string) []tabAnswer {
	h.t.Helper()
	rec := h.get("/v1/sessions/"+sid+"/tabs", token)
	if rec.Code != 200 {
		h.t.Fatalf("tabs: %d %s", rec.Code, rec.Body)
	}
	var out struct {
		Tabs []tabAnswer `json:"tabs"`
	}
	decodeStrict(h.t, rec, &out)
	if out.Tabs == nil {
		h.t.Fatalf("tabs is null: %s", rec.Body)
	}
	return out.Tabs
}

func TestAConnectedTabIsListedAndLeavesWithinASecondOfItsDisconnect(t *testing.T) {
	h := newHarness(t)
	ts := h.serve()
	alice := h.token("alice")
	if tabs := h.listTabs(alice, "doc-1"); len(tabs) != 0 {
		t.Fatalf("tabs before any stream: %+v", tabs)
	}
	watcher := mustStream(t, ts, eventsPath("doc-1", "tabId=tab-w"), alice, nil)
	watcher.expect("snapshot", nil)
	h.clock.Advance(time.Second) // tabs are listed in the order they connected
	c := mustStream(t, ts, eventsPath("doc-1", "tabId=tab-a&label="+url.QueryEscape("Events — /events/1")+"&hidden=true"), alice, nil)
	c.expect("snapshot", nil)

	var joined tabsEventAnswer
	it := watcher.expect("tabs", &joined)
	hasKeys(t, it.Data, "type", "sessionId", "tab", "at")
	if joined.Type != "joined" || joined.SessionID != "doc-1" || joined.Tab.TabID != "tab-a" || joined.Tab.Label != "Events — /events/1" || !joined.Tab.Hidden || !it.HasID {
		t.Fatalf("joined: %+v", joined)
	}
	tabs := h.listTabs(alice, "doc-1")
	if len(tabs) != 2 || tabs[0].TabID != "tab-w" || tabs[1] != joined.Tab {
		t.Fatalf("tabs: %+v", tabs)
	}

	c.close()
	start := time.Now()
	var left tabsEventAnswer
	watcher.expect("tabs", &left)
	if left.Type != "left" || left.Tab.TabID != "tab-a" || left.Reason != "" {
		t.Fatalf("left: %+v", left)
	}
	for len(h.listTabs(alice, "doc-1")) != 1 {
		if time.Since(start) > time.Second {
			t.Fatal("the tab was still listed a second after its stream ended")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestEveryStreamIsToldWhenTheCatalogVersionChanges(t *testing.T) {
	h := catalogHarness(t)
	ts := h.serve()
	alice := h.token("alice")
	c1 := mustStream(t, ts, eventsPath("doc-1", "tabId=t1"), alice, nil)
	c2 := mustStream(t, ts, eventsPath("doc-2", "tabId=t2"), h.token("bob"), nil)
	c1.expect("snapshot", nil)
	c2.expect("snapshot", nil)
	if rec := h.putCatalog(h.adminToken("root"), "*", `{"tools":[]}`); rec.Code != 200 {
		t.Fatalf("PUT: %d %s", rec.Code, rec.Body)
	}
	want := mustCatalog(t, `{"tools":[]}`).Version
	for _, c := range []*sseClient{c1, c2} {
		var ev struct {
			Version string `json:"version"`
		}
		it := c.expect("catalog", &ev)
		if ev.Version != want || it.HasID {
			t.Fatalf("catalog event %+v (id %q), want version %s without id", ev, it.ID, want)
		}
	}
}

// A catalog event is not replayed: a stream that was down when the catalog changed learns of it
// from its next snapshot, which names the version served.
func TestTheSnapshotNamesTheCatalogVersionServed(t *testing.T) {
	h := catalogHarness(t)
	ts := h.serve()
	alice := h.token("alice")
	var snap snapshotAnswer
	c := mustStream(t, ts, eventsPath("doc-1", "tabId=t1"), alice, nil)
	c.expect("snapshot", &snap)
	if first := mustCatalog(t, eventsCatalog).Version; snap.CatalogVersion == nil || *snap.CatalogVersion != first {
		t.Fatalf("the snapshot names the catalog version %v, want %s", snap.CatalogVersion, first)
	}
	c.close()

	if rec := h.putCatalog(h.adminToken("root"), "*", `{"tools":[]}`); rec.Code != 200 {
		t.Fatalf("PUT: %d %s", rec.Code, rec.Body)
	}
	snap.CatalogVersion = nil
	c = mustStream(t, ts, eventsPath("doc-1", "tabId=t1"), alice, nil)
	c.expect("snapshot", &snap)
	if next := mustCatalog(t, `{"tools":[]}`).Version; snap.CatalogVersion == nil || *snap.CatalogVersion != next {
		t.Fatalf("after the PUT the snapshot names the catalog version %v, want %s", snap.CatalogVersion, next)
	}
}

func TestCloseEndsEveryStreamWithAFinalEventPromptly(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.Streams.Keepalive = time.Hour })
	ts := h.serve()
	var clients []*sseClient
	for i := range 3 {
		c := mustStream(t, ts, eventsPath("doc-1", "tabId=t"+strconv.Itoa(i)), h.token(fmt.Sprintf("user-%d", i)), nil)
		c.expect("snapshot", nil)
		clients = append(clients, c)
	}
	start := time.Now()
	closed := make(chan struct{})
	go func() { h.srv.Close(); close(closed) }()
	for _, c := range clients {
		var sd struct {
			Reason  string `json:"reason"`
			RetryMs int64  `json:"retryMs"`
		}
		c.expect("shutdown", &sd)
		if sd.RetryMs < 250 || sd.RetryMs > 1250 || sd.Reason == "" {
			t.Fatalf("shutdown event %+v", sd)
		}
		rest := c.expectEnd()
		if len(rest) != 0 {
			t.Fatalf("after the shutdown event: %+v", rest)
		}
	}
	select {
	case <-closed:
	case <-time.After(waitFor):
		t.Fatal("Close did not return")
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Close took %v", d)
	}
	// Their tabs left, and new streams are refused.
	if tabs := h.listTabs(h.token("user-0"), "doc-1"); len(tabs) != 0 {
		t.Fatalf("tabs after Close: %+v", tabs)
	}
	_, resp := openStream(t, ts, eventsPath("doc-1", "tabId=t"), h.token("alice"), nil)
	httpError(t, resp, http.StatusServiceUnavailable, CodeStoreUnavailable)
}

// TestAStreamEndsWhenItsCredentialExpires: a stream is authorized when it opens, so it ends with
// its final event when the access token that opened it stops being accepted (exp plus the
// leeway, none here), whether it was opened with the token or with a ticket issued to it: an
// expired or withdrawn token keeps no view of the session.
func TestAStreamEndsWhenItsCredentialExpires(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.Streams.Keepalive = time.Hour })
	ts := h.serve()
	short, err := IssueToken(h.auth, TokenSpec{Sub: "alice", TTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	exp := time.Unix(time.Now().Add(2*time.Second).Unix(), 0) // exp is in whole seconds
	// Unlisted, so that neither hears of the other's tab.
	byToken := mustStream(t, ts, eventsPath("doc-1", "tabId=t1&presence=false"), short, nil)
	byToken.expect("snapshot", nil)
	byTicket := mustStream(t, ts, eventsPath("doc-1", "presence=false&ticket="+url.QueryEscape(h.ticket(short, "doc-1", "t2"))), "", nil)
	byTicket.expect("snapshot", nil)
	for name, c := range map[string]*sseClient{"token": byToken, "ticket": byTicket} {
		var sd struct {
			Reason  string `json:"reason"`
			RetryMs int64  `json:"retryMs"`
		}
		c.expect("shutdown", &sd)
		if !strings.Contains(sd.Reason, "expired") {
			t.Errorf("the stream opened with a %s ended with %+v, want the reason", name, sd)
		}
		if early := time.Until(exp); early > 100*time.Millisecond {
			t.Errorf("the stream opened with a %s ended %v before its credential expired", name, early)
		}
		if rest := c.expectEnd(); len(rest) != 0 {
			t.Fatalf("after the final event: %+v", rest)
		}
	}
	// A stream of a token that lives on is not ended meanwhile.
	long := mustStream(t, ts, eventsPath("doc-1", "tabId=t3"), h.token("alice"), nil)
	long.expect("snapshot", nil)
	h.acquire(h.token("alice"), "doc-1", "t3", "try")
	long.expectLease("granted")
}

func TestKeepaliveCommentsFlowOnAnIdleStream(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.Streams.Keepalive = 20 * time.Millisecond })
	ts := h.serve()
	c := mustStream(t, ts, eventsPath("doc-1", "tabId=t"), h.token("alice"), nil)
	c.expect("snapshot", nil)
	for range 3 {
		if it := c.nextItem(); it.Comment != "keepalive" {
			t.Fatalf("got %+v, want a keepalive comment", it)
		}
	}
}

func TestAStreamOutlivesTheServersReadTimeout(t *testing.T) {
	h := newHarness(t)
	ts := httptest.NewUnstartedServer(h.srv.Handler())
	ts.Config.ReadTimeout = 200 * time.Millisecond
	ts.Start()
	t.Cleanup(func() { ts.CloseClientConnections(); ts.Close() })
	alice := h.token("alice")
	c := mustStream(t, ts, eventsPath("doc-1", "tabId=t"), alice, nil)
	c.expect("snapshot", nil)
	time.Sleep(600 * time.Millisecond) // three read timeouts; waiting is the point of this test
	h.acquire(alice, "doc-1", "t", "try")
	c.expectLease("granted")
}

// A client that stops reading loses its stream once the capped send buffer of its connection is
// full and a write waits out its deadline (write_failed); and its connection is reset, so that
// the kernel drops at once what it still holds for it, rather than keeping the socket while it
// tries to deliver that through the window the client keeps shut.
func TestAClientThatStopsReadingLosesItsStreamAfterTheWriteTimeout(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.Streams.WriteTimeout = 200 * time.Millisecond })
	ts := h.serve()
	alice := h.token("alice")

	// A client that sends the request and never reads.
	conn, err := net.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.(*net.TCPConn).SetReadBuffer(1024)
	fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", eventsPath("doc-1", "tabId=t"), alice)
	open := h.srv.streams.Open
	deadline := time.Now().Add(waitFor)
	for open() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the stream did not open")
		}
		time.Sleep(5 * time.Millisecond)
	}
	label := strings.Repeat("x", 200)
	for i := 0; open() == 1; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("the stream of a client that does not read was still open after %d events", i)
		}
		rec := h.post(leasePath("doc-1"), alice, fmt.Sprintf(`{"tabId":"t","label":"%s%d"}`, label[:190], i))
		if rec.Code != 200 {
			t.Fatal(rec.Body)
		}
	}
	if logs := h.logs.String(); !strings.Contains(logs, `"reason":"write_failed"`) {
		t.Fatalf("the stream did not end write_failed:\n%s", logs)
	}

	// The client reads again: what reached it, then the reset. An orderly close would deliver
	// every byte the server's socket still held, then the end of the stream.
	_ = conn.SetReadDeadline(time.Now().Add(waitFor))
	buf := make([]byte, 64<<10)
	n := 0
	for {
		k, err := conn.Read(buf)
		n += k
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("the connection of the stream still delivers what the server held for it (%d bytes so far), want a reset", n)
		}
		if err != nil {
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("after %d bytes the connection of the stream ended with %v, want a reset", n, err)
			}
			break
		}
	}
}

// --- resync -------------------------------------------------------------------------------------

// resyncFeed wraps a Feed so that a test can end its watches with lease.ErrResync, as an engine
// does when a reader falls behind or its Pub/Sub link drops. While paused, events stay in the
// inner watch, as if lost.
type resyncFeed struct {
	inner lease.Feed

	mu      sync.Mutex // protects the fields below
	senders []*lease.WatchSender
	paused  bool
	watches int
	refuse  error // what Watch answers instead of watching, when set
}

func (f *resyncFeed) Watch(ctx context.Context, key lease.Key, after string) (*lease.Watch, error) {
	f.mu.Lock()
	refuse := f.refuse
	f.mu.Unlock()
	if refuse != nil {
		return nil, refuse
	}
	in, err := f.inner.Watch(ctx, key, after)
	if err != nil {
		return nil, err
	}
	w, sender := lease.NewWatch(ctx, key, 64, in.Close)
	w.Snapshot, w.Tabs, w.Position, w.Resumed, w.Replay = in.Snapshot, in.Tabs, in.Position, in.Resumed, in.Replay
	f.mu.Lock()
	f.senders = append(f.senders, sender)
	f.watches++
	f.mu.Unlock()
	go func() {
		for ev := range in.Events() {
			for {
				f.mu.Lock()
				paused := f.paused
				f.mu.Unlock()
				if !paused || sender.Done() {
					break
				}
				time.Sleep(time.Millisecond)
			}
			if !sender.Send(*ev) {
				return
			}
		}
	}()
	return w, nil
}

func (f *resyncFeed) pause() { f.mu.Lock(); f.paused = true; f.mu.Unlock() }

// resync ends every watch with lease.ErrResync and lets new ones run.
func (f *resyncFeed) resync() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.senders {
		s.End(lease.ErrResync)
	}
	f.senders, f.paused = nil, false
}

func TestAResyncWatchesAgainFromTheLastIDWithAFreshSnapshotThenTheReplay(t *testing.T) {
	var feed *resyncFeed
	h := newHarness(t, func(o *Options) {
		feed = &resyncFeed{inner: o.Engine}
		o.Engine = storeParts{o.Engine, feed, o.Engine, o.Engine}
	})
	ts := h.serve()
	alice := h.token("alice")
	c := mustStream(t, ts, eventsPath("doc-1", "tabId=tab-a"), alice, nil)
	c.expect("snapshot", nil)
	epochA := h.acquire(alice, "doc-1", "tab-a", "try")
	_, granted := c.expectLease("granted")

	feed.pause()
	epochB := h.acquire(alice, "doc-1", "tab-b", "takeover") // lost by the watch
	c.quiet(50 * time.Millisecond)
	feed.resync()

	var snap snapshotAnswer
	it := c.expect("snapshot", &snap)
	if !snap.Resumed || it.HasID || snap.Epoch != epochB || snap.Holder.TabID != "tab-b" || *snap.Role != "viewer" {
		t.Fatalf("snapshot after the resync: %+v (id %q)", snap, it.ID)
	}
	to, toItem := c.expectLease("taken_over")
	if to.Epoch != epochB || to.Previous.Epoch != epochA || idOf(t, toItem.ID).Compare(idOf(t, granted.ID)) <= 0 {
		t.Fatalf("replay after the resync: %+v %s", to, toItem.ID)
	}
	// The new watch carries on.
	h.acquire(alice, "doc-1", "tab-a", "takeover")
	if back, _ := c.expectLease("taken_over"); back.Holder.TabID != "tab-a" {
		t.Fatalf("after the resync: %+v", back)
	}
	feed.mu.Lock()
	n := feed.watches
	feed.mu.Unlock()
	if n != 2 {
		t.Fatalf("%d watches, want 2", n)
	}
}

// TestAStreamThatCannotWatchAgainEndsWithAFinalEvent: a stream whose watch ends with a resync and
// that cannot watch again (the store does not answer for rewatchFor, or refuses) tells its client
// why with the final event, as at a shutdown, rather than ending bare.
func TestAStreamThatCannotWatchAgainEndsWithAFinalEvent(t *testing.T) {
	for _, tc := range []struct {
		name, reason string
		refuse       error
	}{
		{"the store refuses", "could not watch", &lease.SessionLimitError{Limit: 1}},
		{"the store does not answer", "store does not serve this stream", &lease.UnavailableError{Op: "watch", Err: errors.New("i/o timeout")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var feed *resyncFeed
			h := newHarness(t, func(o *Options) {
				o.Streams.Keepalive = time.Hour
				feed = &resyncFeed{inner: o.Engine}
				o.Engine = storeParts{o.Engine, feed, o.Engine, o.Engine}
			})
			ts := h.serve()
			c := mustStream(t, ts, eventsPath("doc-1", "tabId=tab-a&presence=false"), h.token("alice"), nil)
			c.expect("snapshot", nil)
			feed.mu.Lock()
			feed.refuse = tc.refuse
			feed.mu.Unlock()
			feed.resync()
			var sd struct {
				Reason  string `json:"reason"`
				RetryMs int64  `json:"retryMs"`
			}
			c.expect("shutdown", &sd)
			if !strings.Contains(sd.Reason, tc.reason) || sd.RetryMs < 250 || sd.RetryMs > 1250 {
				t.Errorf("final event %+v, want the reason %q and a retry from 250 to 1250 ms", sd, tc.reason)
			}
			if rest := c.expectEnd(); len(rest) != 0 {
				t.Fatalf("after the final event: %+v", rest)
			}
		})
	}
}

// A resync may follow a store that lost its data, the stream's presence entry with it: the stream
// lists its tab again at once, in the snapshot that follows, not at its next refresh.
func TestAResyncListsTheStreamsTabAgainAtOnce(t *testing.T) {
	var feed *resyncFeed
	var presence *forgetfulPresence
	h := newHarness(t, func(o *Options) {
		feed = &resyncFeed{inner: o.Engine}
		presence = &forgetfulPresence{Presence: o.Engine}
		o.Engine = storeParts{o.Engine, feed, presence, o.Engine}
	})
	ts := h.serve()
	alice := h.token("alice")
	c := mustStream(t, ts, eventsPath("doc-1", "tabId=tab-a"), alice, nil)
	c.expect("snapshot", nil)
	presence.forget(t) // the store lost the entry (here announced: the engine's Leave)
	c.expect("tabs", nil)
	if tabs := h.listTabs(alice, "doc-1"); len(tabs) != 0 {
		t.Fatalf("tabs after the loss: %+v", tabs)
	}
	feed.resync()

	var snap snapshotAnswer
	c.expect("snapshot", &snap)
	if len(snap.Tabs) != 1 || snap.Tabs[0].TabID != "tab-a" {
		t.Fatalf("the snapshot after the resync lists %+v, want the stream's own tab", snap.Tabs)
	}
	if tabs := h.listTabs(alice, "doc-1"); len(tabs) != 1 || tabs[0].TabID != "tab-a" {
		t.Fatalf("GET …/tabs after the resync: %+v, want the stream's tab", tabs)
	}
}

// forgetfulPresence records the entries joined, so that a test can remove them as a store that
// lost its data does.
type forgetfulPresence struct {
	lease.Presence
	mu      sync.Mutex
	entries map[string]lease.Key // conn → key
	tabs    map[string]string    // conn → tab id
}

func (p *forgetfulPresence) Join(ctx context.Context, key lease.Key, conn string, tab lease.Tab, seq int64) (time.Duration, error) {
	p.mu.Lock()
	if p.entries == nil {
		p.entries, p.tabs = make(map[string]lease.Key), make(map[string]string)
	}
	p.entries[conn], p.tabs[conn] = key, tab.TabID
	p.mu.Unlock()
	return p.Presence.Join(ctx, key, conn, tab, seq)
}

func (p *forgetfulPresence) forget(t *testing.T) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	for conn, key := range p.entries {
		if err := p.Presence.Leave(t.Context(), key, conn, p.tabs[conn], 0); err != nil {
			t.Fatal(err)
		}
	}
}

// storeParts is a lease.Store made of parts, for tests that replace one.
type storeParts struct {
	lease.Engine
	lease.Feed
	lease.Presence
	lease.Admin
}

// withAdmin is s with the admin operations of a.
func withAdmin(s lease.Store, a lease.Admin) lease.Store { return storeParts{s, s, s, a} }

// noPresence is a Presence that lists nobody, for tests that want a stream without tabs.
type noPresence struct{}

func (noPresence) Join(context.Context, lease.Key, string, lease.Tab, int64) (time.Duration, error) {
	return time.Minute, nil
}
func (noPresence) Leave(context.Context, lease.Key, string, string, int64) error { return nil }
func (noPresence) Tabs(context.Context, lease.Key) ([]lease.Tab, error)          { return nil, nil }

func TestAStreamKeepsItsTabListedByRefreshingItEveryThirdOfTheTTL(t *testing.T) {
	// A TTL long enough that a loaded machine (the race detector, the other packages' tests)
	// delaying a refresh by up to a second does not drop the entry, and a watch longer than the
	// TTL, so that an entry never refreshed drops out.
	const ttl = 1500 * time.Millisecond
	eng, err := leasemem.New(leasemem.Options{PresenceTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close() })
	h := newHarness(t, func(o *Options) { o.Engine, o.Now = eng, nil })
	ts := h.serve()
	alice := h.token("alice")
	c := mustStream(t, ts, eventsPath("doc-1", "tabId=tab-a"), alice, nil)
	c.expect("snapshot", nil)
	for end := time.Now().Add(ttl + 500*time.Millisecond); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if tabs := h.listTabs(alice, "doc-1"); len(tabs) != 1 {
			t.Fatalf("the tab of an open stream dropped out of the list: %+v", tabs)
		}
	}
	c.quiet(50 * time.Millisecond) // no left/joined churn either
}

// A resync refreshes the stream's presence entry at once (and so moves its next refresh later):
// the stream's timer must still fire for every keepalive and refresh that follow.
func TestAStreamKeepsItsKeepalivesAndPresenceAfterAResync(t *testing.T) {
	eng, err := leasemem.New(leasemem.Options{PresenceTTL: 600 * time.Millisecond}) // refresh every 200 ms
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close() })
	var feed *resyncFeed
	h := newHarness(t, func(o *Options) {
		feed = &resyncFeed{inner: eng}
		o.Engine, o.Now = storeParts{eng, feed, eng, eng}, nil
		o.Streams.Keepalive = 500 * time.Millisecond
	})
	ts := h.serve()
	alice := h.token("alice")
	c := mustStream(t, ts, eventsPath("doc-1", "tabId=tab-a"), alice, nil)
	c.expect("snapshot", nil)
	c.quiet(100 * time.Millisecond)
	feed.resync() // halfway to the first refresh, which the resync's refresh puts 100 ms later
	c.expect("snapshot", nil)
	// Watch the list meanwhile; the watcher ends before the test does, whatever happens.
	stop, watched := make(chan struct{}), make(chan string, 1)
	var once sync.Once
	end := func() string { once.Do(func() { close(stop) }); return <-watched }
	t.Cleanup(func() { end() })
	go func() {
		defer close(watched)
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if tabs := h.listTabs(alice, "doc-1"); len(tabs) != 1 {
				watched <- fmt.Sprintf("%+v", tabs)
				<-stop
				return
			}
		}
	}()
	for i := range 3 {
		if it := c.nextItem(); it.Comment != "keepalive" {
			t.Fatalf("item %d after the resync: %+v, want a keepalive comment", i, it)
		}
	}
	if tabs := end(); tabs != "" {
		t.Fatalf("the tab of the open stream dropped out of the list after the resync: %s", tabs)
	}
}

func TestStoreTroubleBeforeTheStreamBeginsIsUnavailable(t *testing.T) {
	h := newHarness(t)
	ts := h.serve()
	_ = h.engine.Close()
	_, resp := openStream(t, ts, eventsPath("doc-1", "tabId=t"), h.token("alice"), nil)
	e := httpError(t, resp, http.StatusServiceUnavailable, CodeStoreUnavailable)
	if !*e.Error.Retryable {
		t.Fatal("not retryable")
	}
	// The refused stream gave its place back.
	if n := h.srv.streams.Open(); n != 0 {
		t.Fatalf("%d streams counted after a refusal", n)
	}
}

func TestTicketKeysComeFromTheTicketSecretOrTheHS256Secret(t *testing.T) {
	secret := []byte(strings.Repeat("t", 32))
	// Three instances on one store: the engine and the nonces are shared.
	nonces := leasemem.NewNonceStore(nil)
	a := newHarness(t, func(o *Options) { o.Nonces, o.Streams.TicketSecret = nonces, secret })
	b := newHarness(t, func(o *Options) { o.Engine, o.Nonces, o.Streams.TicketSecret = a.engine, nonces, secret })
	c := newHarness(t, func(o *Options) { o.Engine, o.Nonces = a.engine, nonces }) // derived from the HS256 secret
	tsB, tsC := b.serve(), c.serve()
	alice := a.token("alice")

	tk := a.ticket(alice, "doc-1", "tab-a")
	_, resp := openStream(t, tsC, eventsPath("doc-1", "ticket="+url.QueryEscape(tk)), "", nil)
	httpError(t, resp, http.StatusUnauthorized, CodeUnauthenticated)
	s := mustStream(t, tsB, eventsPath("doc-1", "ticket="+url.QueryEscape(tk)), "", nil)
	s.expect("snapshot", nil)
}

func TestStreamOptionsAreChecked(t *testing.T) {
	for name, o := range map[string]stream.Options{
		"a negative per-user limit":     {PerUser: -1},
		"a negative per-instance limit": {PerInstance: -1},
		"a negative keepalive":          {Keepalive: -time.Second},
		"a negative write timeout":      {WriteTimeout: -time.Second},
		"a short ticket secret":         {TicketSecret: []byte("short")},
	} {
		t.Run(name+" is refused", func(t *testing.T) {
			eng, _ := leasemem.New(leasemem.Options{})
			defer eng.Close()
			opts := Options{Engine: eng, Auth: testAuthConfig(), Streams: o}
			memoryStores(&opts)
			if _, err := New(opts); err == nil || !strings.Contains(err.Error(), "Options.Streams") {
				t.Fatalf("New = %v, want an error naming Options.Streams", err)
			}
		})
	}
}

func TestAPercentEncodedSessionIDNamesTheSameSessionForStreamsAndTickets(t *testing.T) {
	h := newHarness(t)
	ts := h.serve()
	alice := h.token("alice", "doc:1")
	tk := h.ticket(alice, "doc%3A1", "tab-a")
	c := mustStream(t, ts, eventsPath("doc%3A1", "ticket="+url.QueryEscape(tk)), "", nil)
	var snap snapshotAnswer
	c.expect("snapshot", &snap)
	if snap.SessionID != "doc:1" {
		t.Fatalf("snapshot of %q", snap.SessionID)
	}
	h.acquire(alice, "doc:1", "tab-a", "try")
	c.expectLease("granted")
	if tabs := h.listTabs(alice, "doc%3A1"); len(tabs) != 1 {
		t.Fatalf("tabs %+v", tabs)
	}
}

func TestLeaseEventDataNamesTheHandoffRequester(t *testing.T) {
	ev := lease.Event{
		ID: "1-0", Key: lease.Key{User: "alice", Session: "doc-1"}, Type: lease.EventHandoffRequested, Epoch: 7,
		Holder: &lease.Holder{TabID: "t1"}, Requester: &lease.Holder{TabID: "t2", Label: "Tab 2"},
		At: time.Date(2026, 12, 2, 13, 0, 0, 0, time.UTC),
	}
	b, err := streamViews{}.Event(ev)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"requester":{"tabId":"t2","label":"Tab 2","hidden":false}`) {
		t.Fatalf("no requester in %s", b)
	}
	ev.Type, ev.Requester = lease.EventGranted, nil
	if b, _ = (streamViews{}).Event(ev); strings.Contains(string(b), "requester") {
		t.Fatalf("a requester where there is none: %s", b)
	}
}
