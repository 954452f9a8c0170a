// The event stream: the SSE parser, reconnects with Last-Event-ID, and one stream per browser
// shared through Web Locks + BroadcastChannel: `node --test web/sdk/`.
import assert from "node:assert/strict";
import { test } from "node:test";

import { SSEParser, StreamRunner, TabLease, tokenSubject } from "./tablease.js";
import { SessionApi } from "./http.js";
import { fetchStreamOpener } from "./stream.js";
import { FakeClock, FakeLocks, FakeServer, browserTabs, fakeJWT, fakeOptions, flush, settle } from "./fakes.mjs";

test("the SSE parser handles chunks split anywhere, CRLF, comments, ids and retry", () => {
  const text = "\uFEFFretry: 2500\r\n: keepalive\r\nid: 1-0\r\nevent: lease\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\nid: 2-0\n\n:x\ndata:no space\n\r\nevent: catalog\rdata: {\"version\":\"v2\"}\r\r";
  const whole = new SSEParser().feed(text);
  for (let size = 1; size <= 7; size++) {
    const p = new SSEParser();
    const out = [];
    for (let i = 0; i < text.length; i += size) out.push(...p.feed(text.slice(i, i + size)));
    assert.deepEqual(out, whole, `chunks of ${size}`);
  }
  assert.deepEqual(whole, [
    { kind: "retry", ms: 2500 },
    { kind: "comment", text: "keepalive" },
    { kind: "event", type: "lease", data: '{"a":\n1}', id: "1-0" },
    { kind: "comment", text: "x" },
    { kind: "event", type: "message", data: "no space", id: "2-0" },
    { kind: "event", type: "catalog", data: '{"version":"v2"}', id: "2-0" },
  ]);
});

test("the SSE parser ignores unknown fields, bad retry values and ids with NUL", () => {
  const p = new SSEParser();
  const out = p.feed("foo: bar\nretry: 1s\nid: a\0b\ndata: x\n\n");
  assert.deepEqual(out, [{ kind: "event", type: "message", data: "x", id: "" }]);
});

test("the stream sends the token and tabId, and resumes with Last-Event-ID after a drop", async () => {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock);
  const lease = new TabLease(fakeOptions(server, clock, { stream: "fetch" }));
  const events = [];
  lease.on("lease", (d) => d.event && events.push(d.event.type));
  await lease.start();
  await flush();
  const [first] = server.callsTo("GET", "/events");
  assert.equal(first.headers.Authorization, "Bearer token-1");
  assert.equal(first.headers.Accept, "text/event-stream");
  assert.deepEqual(first.query, { tabId: lease.tabId, label: "Tab" });
  assert.equal(first.headers["Last-Event-ID"], undefined);
  assert.equal(lease.streamLive, true);

  server.takeoverBy("t-other", "B");
  await flush();
  assert.equal(lease.role, "viewer", "the taken_over event arrived over the stream");
  assert.deepEqual(events.slice(-1), ["taken_over"]);
  const lastId = server.lastId;

  server.dropStreams();
  await flush();
  assert.equal(lease.streamLive, false);
  await clock.advance(1000); // retry: 1000 from the server, equal jitter with random() = 0 → 500
  const second = server.callsTo("GET", "/events")[1];
  assert.ok(second, "reconnected");
  assert.equal(second.headers["Last-Event-ID"], lastId);
  await lease.stop({ release: false });
});

test("a stream connect that is never answered is given up after requestTimeoutMs and tried again", async () => {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock);
  server.fail("GET /events", { hang: true });
  const lease = new TabLease(fakeOptions(server, clock, { stream: "fetch" }));
  await lease.start();
  await flush();
  assert.equal(lease.streamLive, false);
  await clock.advance(10000 + 1000); // the timeout, then the runner's first backoff (at most 1 s)
  assert.equal(server.callsTo("GET", "/events").length, 2, "connected again");
  assert.equal(lease.streamLive, true);
  await lease.stop({ release: false });
});

test("a stream the server does not have yet (404) is retried slowly and the lease still works", async () => {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock);
  server.fail("GET /events", { status: 404, code: "NOT_FOUND", times: 100 });
  const lease = new TabLease(fakeOptions(server, clock, { stream: "fetch", streamNotFoundMs: 60000 }));
  await lease.start();
  assert.equal(lease.role, "owner");
  await clock.advance(59000);
  assert.equal(server.callsTo("GET", "/events").length, 1);
  await clock.advance(2000);
  assert.equal(server.callsTo("GET", "/events").length, 2);
  assert.equal(lease.role, "owner");
  await lease.stop({ release: false });
});

test("a silent stream is dropped after the idle timeout and reconnected", async () => {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock);
  const lease = new TabLease(fakeOptions(server, clock, { stream: "fetch", streamIdleMs: 45000 }));
  await lease.start();
  await flush();
  assert.equal(lease.streamLive, true);
  await clock.advance(45000 - 1);
  assert.equal(server.callsTo("GET", "/events").length, 1);
  await clock.advance(1 + 500); // idle, then the reconnect delay (retry: 1000, equal jitter)
  assert.equal(server.callsTo("GET", "/events").length, 2);
  await lease.stop({ release: false });
});

test("a silent stream is dropped a keepalive and some slack after its last byte, as the snapshot's keepaliveMs says", async () => {
  for (const { keepaliveMs, streamIdleMs, after } of [
    { keepaliveMs: 15000, streamIdleMs: undefined, after: 20000 },
    { keepaliveMs: 60000, streamIdleMs: undefined, after: 80000 },
    { keepaliveMs: 15000, streamIdleMs: 45000, after: 45000 }, // the option wins
  ]) {
    const clock = new FakeClock(1000);
    const server = new FakeServer(clock);
    server.keepaliveMs = keepaliveMs;
    const lease = new TabLease(fakeOptions(server, clock, { stream: "fetch", streamIdleMs }));
    await lease.start();
    await flush();
    assert.equal(lease.streamLive, true);
    await clock.advance(after - 1);
    assert.equal(server.callsTo("GET", "/events").length, 1, `keepaliveMs ${keepaliveMs}, streamIdleMs ${streamIdleMs}: dropped before ${after} ms`);
    await clock.advance(1 + 500);
    assert.equal(server.callsTo("GET", "/events").length, 2, `keepaliveMs ${keepaliveMs}, streamIdleMs ${streamIdleMs}: not dropped at ${after} ms`);
    await lease.stop({ release: false });
  }
});

test("the runner reports live on open and down on a failure, then backs off", async () => {
  const clock = new FakeClock(0);
  const status = [];
  let opens = 0;
  const runner = new StreamRunner({
    clock,
    random: () => 0,
    baseMs: 1000,
    open: async ({ onOpen, onItem }) => {
      opens++;
      if (opens === 1) {
        onOpen();
        onItem({ kind: "event", type: "lease", data: '{"epoch":5}', id: "7-0" });
        return;
      }
      throw Object.assign(new Error("503"), { retryAfterMs: 4000 });
    },
    onStatus: (live) => status.push([live, clock.now()]),
    onEvent: () => {},
  });
  runner.start();
  await flush();
  assert.equal(runner.lastEventId, "7-0");
  await clock.advance(500);
  assert.equal(opens, 2);
  await clock.advance(3999);
  assert.equal(opens, 2, "Retry-After respected");
  await clock.advance(1);
  assert.equal(opens, 3);
  runner.stop();
  assert.deepEqual(status, [[true, 0], [false, 0]]);
});

test("retryNow ends the runner's wait after a failure without an answer, and keeps a wait the server asked for", async () => {
  const clock = new FakeClock(0);
  const failures = [
    Object.assign(new Error("fetch failed"), { code: "NETWORK" }),
    Object.assign(new Error("fetch failed"), { code: "NETWORK" }),
    Object.assign(new Error("503"), { code: "STORE_UNAVAILABLE", status: 503, retryAfterMs: 4000 }),
  ];
  const opens = [];
  const runner = new StreamRunner({
    clock,
    random: () => 0,
    baseMs: 1000,
    open: async () => {
      opens.push(clock.now());
      throw failures.shift() ?? new Error("no more");
    },
  });
  runner.start();
  await flush();
  assert.deepEqual(opens, [0]);
  await clock.advance(100);
  runner.retryNow(); // the first wait (500 ms) follows a network failure
  await flush();
  assert.deepEqual(opens, [0, 100], "connected at once");
  await clock.advance(100);
  runner.retryNow(); // so does the second
  await flush();
  assert.deepEqual(opens, [0, 100, 200]);
  await clock.advance(100);
  runner.retryNow(); // the third follows a 503 with Retry-After: 4 s
  await flush();
  assert.deepEqual(opens, [0, 100, 200], "Retry-After kept");
  await clock.advance(3900);
  assert.deepEqual(opens, [0, 100, 200, 4200]);
  runner.stop();
});

test("tokenSubject reads sub from a JWT without verifying it", () => {
  assert.equal(tokenSubject(fakeJWT("alice")), "alice");
  assert.equal(tokenSubject("not-a-jwt"), "");
});

test("three tabs share one event-stream connection and all hear every event", async () => {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock);
  const [a, b, c] = browserTabs(TabLease, 3, server, clock);
  await a.start();
  await b.start();
  await c.start();
  await settle(clock);
  assert.equal(server.callsTo("GET", "/events").length, 1, "one connection for three tabs");
  assert.equal(server.streams.size, 1);
  assert.deepEqual([a, b, c].map((t) => t.streamLive), [true, true, true]);
  assert.deepEqual([a, b, c].map((t) => t.role), ["owner", "viewer", "viewer"]);

  server.takeoverBy("t-elsewhere", "another browser");
  await settle(clock);
  assert.deepEqual([a, b, c].map((t) => t.role), ["viewer", "viewer", "viewer"]);
  assert.deepEqual([a, b, c].map((t) => t.lease.holder?.label), ["another browser", "another browser", "another browser"]);
  for (const t of [a, b, c]) await t.stop({ release: false });
  await settle(clock);
});

test("when the tab running the stream closes, another tab takes it over and resumes from the last id", async () => {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock);
  const [a, b] = browserTabs(TabLease, 2, server, clock);
  await a.start();
  await b.start();
  await settle(clock);
  assert.equal(server.callsTo("GET", "/events").length, 1);
  const first = server.callsTo("GET", "/events")[0];
  assert.equal(first.query.tabId, a.tabId, "the first tab runs the stream");
  server.leaseEvent("updated");
  await settle(clock);

  const lastBeforeClose = server.lastId;
  await a.stop(); // closing the tab: its lock is freed, and it releases the lease
  await settle(clock);
  const conns = server.callsTo("GET", "/events");
  assert.equal(conns.length, 2, "the other tab connected");
  assert.equal(conns[1].query.tabId, b.tabId);
  assert.equal(conns[1].headers["Last-Event-ID"], lastBeforeClose, "resumed from the last id heard over the channel");
  assert.equal(server.streams.size, 1);
  await settle(clock, 1000);
  assert.equal(b.role, "owner", "b took the lease a released");
  await b.stop({ release: false });
  await settle(clock);
});

test("a tab whose getToken fails when it joins (a page restored offline) shares the stream once it gets a token", async () => {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock);
  let failures = 2; // b's first calls of getToken throw: an identity provider out of reach
  const tokenOf = (tab) => async () => {
    if (tab === "b" && failures-- > 0) throw new Error("the identity provider is out of reach");
    return fakeJWT("alice");
  };
  const [a] = browserTabs(TabLease, 1, server, clock, { getToken: tokenOf("a") });
  const locks = a._streamEnv.locks; // the browser's: b is another tab of it
  const b = new TabLease({
    ...fakeOptions(server, clock),
    stream: "fetch",
    shareStream: true,
    locks,
    BroadcastChannel,
    hubs: new Map(),
    getToken: tokenOf("b"),
  });
  const errors = [];
  b.on("error", ({ error }) => errors.push(error));
  await a.start();
  await b.start();
  for (let i = 0; i < 40; i++) await settle(clock, 250);
  assert.ok(errors.length >= 1, "the failure was told");
  assert.equal(server.callsTo("GET", "/events").length, 1, "one connection: b joined a's, not one of its own");
  assert.equal(server.streams.size, 1);
  assert.deepEqual([a.streamLive, b.streamLive], [true, true]);
  server.takeoverBy("t-elsewhere", "another browser");
  await settle(clock);
  assert.equal(b.lease.holder?.label, "another browser", "b hears the shared stream");
  for (const t of [a, b]) await t.stop({ release: false });
  await settle(clock);
});

test("streams of different sessions or users are not shared", async () => {
  const clock = new FakeClock(1000);
  const s1 = new FakeServer(clock, { sessionId: "doc-1" });
  const locks = new FakeLocks();
  const mk = (sub, sessionId) =>
    new TabLease({
      ...fakeOptions(s1, clock),
      sessionId,
      stream: "fetch",
      shareStream: true,
      locks,
      BroadcastChannel,
      hubs: new Map(),
      autoAcquire: false,
      getToken: async () => fakeJWT(sub),
    });
  const a = mk("alice", "doc-1");
  const b = mk("bob", "doc-1");
  const c = mk("alice", "doc-2");
  await a.start();
  await b.start();
  await c.start();
  await settle(clock);
  assert.equal(s1.calls.filter((x) => x.method === "GET" && x.path.endsWith("/events")).length, 3);
  for (const t of [a, b, c]) await t.stop({ release: false });
  await settle(clock);
});

test("ticket mode takes a single-use ticket for every EventSource it opens", async () => {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock);
  const sources = [];
  class FakeEventSource extends EventTarget {
    constructor(url) {
      super();
      this.url = url;
      this.closed = false;
      sources.push(this);
      queueMicrotask(() => this.onopen?.());
    }
    close() {
      this.closed = true;
    }
    emit(type, data, id) {
      const e = new Event(type);
      e.data = JSON.stringify(data);
      e.lastEventId = id;
      this.dispatchEvent(e);
    }
  }
  const lease = new TabLease(fakeOptions(server, clock, { stream: "ticket", EventSource: FakeEventSource }));
  await lease.start();
  await flush();
  assert.equal(sources.length, 1);
  const u = new URL(sources[0].url);
  assert.equal(u.pathname, "/v1/sessions/s1/events");
  assert.equal(u.searchParams.get("tabId"), lease.tabId);
  assert.match(u.searchParams.get("ticket"), /^tk-/);
  assert.deepEqual(server.callsTo("POST", "/events/ticket")[0].body, { tabId: lease.tabId });
  assert.equal(lease.streamLive, true);
  assert.equal(lease.role, "owner");

  sources[0].emit("lease", { type: "taken_over", epoch: lease.epoch + 1, holder: { tabId: "t-b", label: "B" }, previous: null }, "5-0");
  assert.equal(lease.role, "viewer");

  sources[0].onerror();
  await flush();
  assert.equal(sources[0].closed, true);
  assert.equal(lease.streamLive, false);
  await clock.advance(1000);
  assert.equal(sources.length, 2, "reconnected");
  const u2 = new URL(sources[1].url);
  assert.notEqual(u2.searchParams.get("ticket"), u.searchParams.get("ticket"), "a new ticket");
  assert.equal(u2.searchParams.get("lastEventId"), "5-0", "resumes from the last id it saw");
  await lease.stop({ release: false });
});

// A stream opened with fetch() whose opener is ended at each step of its opening: it must leave
// no connection behind, or a few such ends use up the browser's connections to the server (six
// per origin over HTTP/1.1) and every request of the page waits.
test("a stream ended while it opens leaves no connection open: not while getToken runs, nor once answered", async () => {
  const clock = new FakeClock(1000);
  const opened = [];
  const fetch = async (url, init) => {
    let cancelled = false;
    const body = new ReadableStream({
      start(c) {
        c.enqueue(new TextEncoder().encode("event: snapshot\ndata: {}\n\n"));
      },
      cancel() {
        cancelled = true;
      },
    });
    opened.push({ init, cancelled: () => cancelled });
    return new Response(body, { headers: { "Content-Type": "text/event-stream" } });
  };
  let giveToken;
  const api = new SessionApi({ baseUrl: "http://t", sessionId: "s", clock, fetch, getToken: () => new Promise((resolve) => (giveToken = resolve)) });
  const open = fetchStreamOpener({ api, fetch, clock, query: () => ({}) });

  // Ended while getToken runs: nothing is fetched.
  let ac = new AbortController();
  let done = open({ lastEventId: "", signal: ac.signal, onOpen() {}, onItem() {} });
  await flush();
  ac.abort();
  giveToken("tok");
  await done;
  assert.equal(opened.length, 0, "a stream ended before its token came is not fetched");

  // Ended once the answer's headers came, while the body is read: the body is cancelled.
  ac = new AbortController();
  const items = [];
  done = open({ lastEventId: "", signal: ac.signal, onOpen() {}, onItem: (i) => items.push(i) });
  await flush();
  giveToken("tok");
  await flush();
  assert.equal(items.length, 1, "the snapshot was read");
  ac.abort();
  await done;
  assert.equal(opened.length, 1);
  assert.equal(opened[0].cancelled(), true, "the body of an ended stream is cancelled");

  // Ended between the answer and the first read: the body is cancelled all the same.
  ac = new AbortController();
  done = open({ lastEventId: "", signal: ac.signal, onOpen: () => ac.abort(), onItem() {} });
  await flush();
  giveToken("tok");
  await done;
  assert.equal(opened.length, 2);
  assert.equal(opened[1].cancelled(), true, "a body never read is cancelled");
});
