// Renew scheduling, backoff, token refresh and the page lifecycle: `node --test web/sdk/`.
import assert from "node:assert/strict";
import { test } from "node:test";

import { TabLease, TabLeaseError, backoffDelay, parseRetryAfter } from "./tablease.js";
import { FakeClock, FakeServer, fakeJWT, fakeOptions, flush } from "./fakes.mjs";

function setup({ server: so = {}, lease: lo = {} } = {}) {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock, so);
  const lease = new TabLease(fakeOptions(server, clock, lo));
  return { clock, server, lease };
}

/** setup with a getToken that answers the token setToken gave ("token-1" first), and the error
 *  events collected. */
function withToken() {
  let token = "token-1";
  const t = setup({ lease: { getToken: async () => token } });
  const errors = [];
  t.lease.on("error", ({ error }) => errors.push(error));
  return { ...t, errors, setToken: (v) => (token = v) };
}

test("backoff doubles from the base, is capped, and keeps half of each step fixed", () => {
  const low = (n) => backoffDelay(n, { baseMs: 250, maxMs: 15000, random: () => 0 });
  const high = (n) => backoffDelay(n, { baseMs: 250, maxMs: 15000, random: () => 1 });
  assert.deepEqual([0, 1, 2, 3, 4].map(low), [125, 250, 500, 1000, 2000]);
  assert.deepEqual([0, 1, 2, 3, 4].map(high), [250, 500, 1000, 2000, 4000]);
  assert.equal(high(10), 15000);
  assert.equal(low(100), 7500, "large attempt numbers stay finite and capped");
});

test("backoff never comes back before a Retry-After, even past the cap", () => {
  assert.equal(backoffDelay(0, { baseMs: 250, random: () => 0, retryAfterMs: 2000 }), 2000);
  assert.equal(backoffDelay(0, { baseMs: 250, maxMs: 1000, random: () => 1, retryAfterMs: 30000 }), 30000);
  assert.equal(backoffDelay(3, { baseMs: 250, random: () => 1, retryAfterMs: 10 }), 2000);
});

test("Retry-After is read as seconds or as an HTTP date", () => {
  assert.equal(parseRetryAfter("3"), 3000);
  assert.equal(parseRetryAfter(null), null);
  assert.equal(parseRetryAfter("soon"), null);
  const wall = Date.parse("2026-12-02T13:00:00Z");
  assert.equal(parseRetryAfter("Wed, 02 Dec 2026 13:00:05 GMT", wall), 5000);
  assert.equal(parseRetryAfter("Wed, 02 Dec 2026 12:00:00 GMT", wall), 0);
});

test("the owner renews every renewAfterMs, counted from when each renew was sent", async () => {
  const { clock, server, lease } = setup({ server: { latencyMs: 200 } });
  const p = lease.start();
  await clock.advance(200);
  await p;
  await clock.advance(60000);
  const times = server.callsTo("POST", "/lease/renew").map((c) => c.at);
  // acquire sent at 1000, renewAfterMs 15000
  assert.deepEqual(times, [16000, 31000, 46000, 61000]);
  assert.ok(server.callsTo("POST", "/lease/renew").every((c) => c.body.epoch === lease.epoch && c.body.tabId === lease.tabId));
  assert.equal(lease.role, "owner");
  await lease.stop({ release: false });
});

test("the renew body carries exactly the contract's fields", async () => {
  const { clock, server, lease } = setup();
  await lease.start();
  await clock.advance(15000);
  const [renew] = server.callsTo("POST", "/lease/renew");
  assert.deepEqual(Object.keys(renew.body).sort(), ["epoch", "tabId"]);
  const [acq] = server.callsTo("POST", "/lease");
  assert.deepEqual(Object.keys(acq.body).sort(), ["label", "tabId"]);
  assert.equal(acq.headers.Authorization, "Bearer token-1");
  assert.equal(acq.headers["Content-Type"], "application/json");
  await lease.stop({ release: false });
});

test("hiding the tab renews at once with hidden and the hidden TTL; showing it renews back", async () => {
  const { clock, server, lease } = setup({ lease: { hiddenTtlMs: 150000 } });
  await lease.start();
  await clock.advance(3000);
  lease._document.setHidden(true);
  await flush();
  let renews = server.callsTo("POST", "/lease/renew");
  assert.equal(renews.length, 1);
  assert.equal(renews[0].at, 4000);
  assert.deepEqual(renews[0].body, { tabId: lease.tabId, epoch: lease.epoch, hidden: true, ttlMs: 150000 });
  assert.equal(server.holder.hidden, true);
  // hidden: the next renew comes a third of the longer TTL later
  await clock.advance(50000 - 1);
  assert.equal(server.callsTo("POST", "/lease/renew").length, 1);
  await clock.advance(1);
  assert.equal(server.callsTo("POST", "/lease/renew").length, 2);
  lease._document.setHidden(false);
  await flush();
  renews = server.callsTo("POST", "/lease/renew");
  assert.equal(renews.length, 3);
  assert.deepEqual(renews[2].body, { tabId: lease.tabId, epoch: lease.epoch });
  assert.equal(server.holder.hidden, false);
  await lease.stop({ release: false });
});

test("a visibility change during a renew in flight is followed by a renew with the new flag", async () => {
  const { clock, server, lease } = setup({ server: { latencyMs: 100 } });
  const p = lease.start();
  await clock.advance(100);
  await p;
  await clock.advance(15000 - 100); // a scheduled renew is now in flight
  assert.equal(server.callsTo("POST", "/lease/renew").length, 1);
  lease._document.setHidden(true);
  await clock.advance(100);
  await flush();
  const renews = server.callsTo("POST", "/lease/renew");
  assert.equal(renews.length, 2);
  assert.equal(renews[1].body.hidden, true);
  await clock.advance(100);
  await lease.stop({ release: false });
});

test("a 503 renew is retried with jittered exponential backoff that respects Retry-After", async () => {
  const { clock, server, lease } = setup({ lease: { backoffBaseMs: 250, backoffMaxMs: 15000 } });
  await lease.start();
  server.fail("POST /lease/renew", { status: 503, times: 4 });
  server.fail("POST /lease/renew", { status: 503, retryAfter: 3, times: 1 });
  await clock.advance(15000 + 10000);
  const times = server.callsTo("POST", "/lease/renew").map((c) => c.at);
  // random() = 0: delays 125, 250, 500, 1000; then Retry-After 3 s
  assert.deepEqual(times, [16000, 16125, 16375, 16875, 17875, 20875]);
  assert.equal(lease.role, "owner", "a failed renew before the deadline keeps the lease");
  const last = times.at(-1);
  await clock.advance(15000 - (clock.now() - last)); // back to the normal schedule after success
  assert.equal(server.callsTo("POST", "/lease/renew").at(-1).at, last + 15000);
  await lease.stop({ release: false });
});

test("network errors back off the same way and the tab stays owner until its deadline", async () => {
  const { clock, server, lease } = setup({ lease: { marginMs: 1000 } });
  await lease.start();
  server.down = true;
  await clock.advance(43999);
  assert.equal(lease.role, "owner");
  await clock.advance(1);
  assert.equal(lease.role, "viewer");
  assert.ok(server.callsTo("POST", "/lease/renew").length > 5);
  server.down = false;
  await clock.advance(16000);
  assert.equal(lease.role, "owner", "a lease the server still holds is confirmed again (it expires at 46000)");
  await lease.stop({ release: false });
});

test("a renew that is never answered is given up after requestTimeoutMs and retried: the tab keeps the lease", async () => {
  const { clock, server, lease } = setup({ lease: { origin: "http://app.test" } }); // a page of another origin
  const errors = [];
  lease.on("error", ({ error }) => errors.push(error));
  await lease.start();
  server.fail("POST /lease/renew", { hang: true });
  await clock.advance(15000 + 10000 + 125);
  const times = server.callsTo("POST", "/lease/renew").map((c) => c.at);
  // sent at 16000, aborted at 26000, retried after the first backoff step (random() = 0: 125 ms)
  assert.deepEqual(times, [16000, 26125]);
  assert.equal(lease.role, "owner");
  assert.equal(errors.length, 1);
  assert.equal(errors[0].code, "NETWORK");
  assert.match(errors[0].message, /no answer within 10 s/);
  // No request that a browser refused for CORS waits for a deadline: the hint would mislead.
  assert.match(errors[0].message, /did not answer in time/);
  assert.doesNotMatch(errors[0].message, /TABLEASE_CORS_ORIGINS/);
  await clock.advance(15000);
  assert.equal(server.callsTo("POST", "/lease/renew").length, 3, "renews go on at their pace");
  await lease.stop({ release: false });
});

test("under a short TTL a renew that is never answered is given up in time for a retry to keep the lease", async () => {
  // TTL 6 s: renewed every 2 s, deadline 4.5 s after it was sent (margin a quarter of the TTL).
  // A renew waiting requestTimeoutMs (10 s) would outlive the lease.
  const { clock, server, lease } = setup({ server: { ttlMs: 6000 } });
  await lease.start();
  const epoch = lease.epoch;
  server.fail("POST /lease/renew", { hang: true });
  await clock.advance(2000 + 1250 + 125);
  const times = server.callsTo("POST", "/lease/renew").map((c) => c.at);
  // sent at 3000 with 2500 ms left before the deadline: given up at half of it, retried after
  // the first backoff step (random() = 0: 125 ms)
  assert.deepEqual(times, [3000, 4375]);
  await clock.advance(10000);
  assert.equal(lease.role, "owner");
  assert.equal(lease.epoch, epoch, "the same lease, kept");
  assert.equal(server.epoch, epoch);
  await lease.stop({ release: false });
});

test("a renew still waiting from an earlier period holds back none of the next one's renews", async () => {
  const { clock, server, lease } = setup({ lease: { stream: "fetch" } });
  await lease.start();
  const first = lease.epoch;
  server.fail("POST /lease/renew", { hang: true });
  await clock.advance(15000 + 1000); // the renew is sent and hangs (given up only about 14 s later)
  server.expireNow(); // meanwhile the server ends the lease and says so: the tab takes it again
  await clock.advance(1000);
  assert.equal(lease.role, "owner");
  assert.notEqual(lease.epoch, first, "a new period of ownership");
  server.dropStreams(); // the owner renews at once to confirm
  await clock.advance(500);
  const epochs = server.callsTo("POST", "/lease/renew").map((c) => c.body.epoch);
  assert.equal(epochs[0], first);
  assert.ok(epochs.length > 1 && epochs.slice(1).every((e) => e === lease.epoch), `the new period renews, though the old renew still waits: ${epochs}`);
  assert.equal(lease.role, "owner");
  await lease.stop({ release: false });
});

test("a getToken that fails keeps the lease until its deadline, as a network error does", async () => {
  let down = false;
  const getToken = async () => {
    if (down) throw new TypeError("Failed to fetch");
    return "token-1";
  };
  const { clock, server, lease } = setup({ lease: { getToken } });
  const errors = [];
  lease.on("error", ({ error }) => errors.push(error));
  await lease.start();
  const epoch = lease.epoch;
  down = true;
  await clock.advance(15000 + 10000);
  assert.equal(lease.role, "owner", "a token that cannot be had now says nothing about the lease");
  assert.ok(errors.length > 0 && errors.every((e) => e.code === "UNAUTHENTICATED" && e.retryable));
  down = false;
  await clock.advance(16000); // the next retry, within the backoff's cap
  assert.equal(lease.role, "owner");
  assert.equal(lease.epoch, epoch, "the same lease, renewed");
  assert.ok(server.callsTo("POST", "/lease/renew").length > 0);
  await lease.stop({ release: false });
});

test("only GETs bypass the HTTP cache: another method's no-store would stop the browser caching CORS preflights", async () => {
  const { clock, server, lease } = setup({ lease: { presence: true } });
  await lease.start();
  await clock.advance(16000);
  const modes = new Set(server.calls.map((c) => `${c.method} ${c.cache ?? "default"}`));
  assert.deepEqual([...modes].sort(), ["POST default", "PUT default"]);
  await lease.refresh();
  assert.equal(server.calls.at(-1).method, "GET");
  assert.equal(server.calls.at(-1).cache, "no-store");
  await lease.stop({ release: false });
});

test("a getToken that never answers fails after requestTimeoutMs, and its signal tells it to stop", async () => {
  let hang = false;
  const signals = [];
  const getToken = ({ signal } = {}) => {
    signals.push(signal);
    return hang ? new Promise(() => {}) : Promise.resolve("token-1");
  };
  const { clock, server, lease } = setup({ lease: { getToken } });
  const errors = [];
  lease.on("error", ({ error }) => errors.push(error));
  await lease.start();
  hang = true;
  await clock.advance(15000 + 10000);
  assert.equal(errors.length, 1);
  assert.match(errors[0].message, /getToken failed: no token within 10 s/);
  assert.ok(signals.every((s) => s instanceof AbortSignal), "every call gets a signal");
  assert.equal(signals.filter((s) => s.aborted).length, 1, "the call given up on is told so");
  hang = false;
  await clock.advance(1000);
  assert.equal(server.callsTo("POST", "/lease/renew").length, 1, "the retry renews");
  assert.equal(lease.role, "owner");
  await lease.stop({ release: false });
});

test("start() resolves within requestTimeoutMs when getToken never answers, and the tab works once it does", async () => {
  let hang = true;
  const getToken = () => (hang ? new Promise(() => {}) : Promise.resolve(fakeJWT("alice")));
  const { clock, server, lease } = setup({ lease: { getToken, stream: "fetch" } });
  server.takeoverBy("t-other", "Other"); // a viewer: it reads the lease and joins the stream
  const errors = [];
  lease.on("error", ({ error }) => errors.push(error));
  let started = false;
  const p = lease.start().then(() => (started = true));
  await clock.advance(10000 - 1);
  assert.equal(started, false, "the first answer is still awaited");
  await clock.advance(1);
  assert.equal(started, true, "start() resolved at requestTimeoutMs (10 s), not once per step");
  await p;
  assert.equal(lease.role, "viewer");
  assert.ok(errors.length > 0 && errors.every((e) => e.code === "UNAUTHENTICATED"));
  hang = false;
  await clock.advance(2000); // the retries' backoff
  assert.equal(lease.streamLive, true, "the tab joined its stream");
  assert.equal(lease.lease.holder?.tabId, "t-other", "and knows the holder");
  server.expireNow();
  await clock.advance(500);
  assert.equal(lease.role, "owner", "a free lease is taken as at start");
  await lease.stop({ release: false });
});

test("stop() of an owner releases with the last token at once when getToken never answers", async () => {
  let hang = false;
  const getToken = () => (hang ? new Promise(() => {}) : Promise.resolve("token-1"));
  const { clock, server, lease } = setup({ lease: { getToken, presence: true } });
  await lease.start();
  assert.equal(lease.role, "owner");
  hang = true;
  let stopped = false;
  const p = lease.stop().then(() => (stopped = true));
  await clock.advance(0);
  assert.equal(stopped, true, "stop() waited for no getToken");
  await p;
  const rel = server.callsTo("POST", "/lease/release");
  assert.equal(rel.length, 1);
  assert.equal(rel[0].headers.Authorization, "Bearer token-1", "sent with the last token");
  assert.equal(server.valid(), false, "the lease is free at once, not at its expiry");
  assert.equal(server.tabs.size, 0, "the tab left the list of tabs");
});

test("stop() asks getToken for a fresh token when the last one was refused", async () => {
  const { server, lease } = setup();
  await lease.start();
  server.rejectToken = "token-1"; // it expired
  await lease.stop();
  assert.deepEqual(server.callsTo("POST", "/lease/release").map((c) => c.headers.Authorization), ["Bearer token-1", "Bearer token-2"]);
  assert.equal(server.valid(), false);
});

test("a getToken that answers no token (a token endpoint that failed) keeps the lease and is retried", async () => {
  const { clock, server, lease, errors, setToken } = withToken();
  await lease.start();
  const epoch = lease.epoch;
  setToken(undefined); // e.g. `(await res.json()).token` of an error answer
  await clock.advance(15000);
  assert.equal(lease.role, "owner", "no token proves nothing about the lease");
  assert.ok(errors.length >= 1);
  assert.equal(errors[0].code, "UNAUTHENTICATED");
  assert.equal(errors[0].retryable, true);
  assert.match(errors[0].message, /getToken returned no token \(undefined\)/);
  setToken("token-1");
  await clock.advance(3000);
  assert.ok(server.callsTo("POST", "/lease/renew").length >= 1, "the retry renews");
  assert.equal(lease.role, "owner");
  assert.equal(lease.epoch, epoch);
  await lease.stop({ release: false });
});

test("a 401 asks getToken for a fresh token once and retries", async () => {
  const asked = [];
  const getToken = async (o) => {
    asked.push(Boolean(o?.refresh));
    return o?.refresh ? "token-new" : "token-old";
  };
  const { clock, server, lease } = setup({ lease: { getToken } });
  server.rejectToken = "token-old";
  await lease.start();
  assert.equal(lease.role, "owner");
  const acq = server.callsTo("POST", "/lease");
  assert.deepEqual(acq.map((c) => c.headers.Authorization), ["Bearer token-old", "Bearer token-new"]);
  assert.deepEqual(asked, [false, true]);
  void clock;
  await lease.stop({ release: false });
});

test("a getToken that throws is a TabLeaseError UNAUTHENTICATED, with what it threw as its cause", async () => {
  let down = true;
  const getToken = async () => {
    if (down) throw new Error("idp down");
    return "token-1";
  };
  const { clock, lease } = setup({ lease: { getToken, autoAcquire: false } });
  const errors = [];
  lease.on("error", ({ error }) => errors.push(error));
  await lease.start();
  const err = await lease.acquire().then(
    () => null,
    (e) => e,
  );
  assert.ok(err instanceof TabLeaseError, `rejected with ${err}`);
  assert.equal(err.code, "UNAUTHENTICATED");
  assert.match(err.message, /getToken failed: idp down/);
  assert.equal(err.cause.message, "idp down");
  assert.ok(errors.length > 0 && errors.every((e) => e instanceof TabLeaseError && e.code === "UNAUTHENTICATED"), "error events carry TabLeaseErrors");
  down = false;
  await lease.acquire();
  assert.equal(lease.role, "owner");
  void clock;
  await lease.stop({ release: false });
});

test("pagehide releases with a keepalive fetch sent synchronously with the last token", async () => {
  let watching = false;
  let sync = null;
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock);
  const fetch = (url, init) => {
    if (watching) sync ??= init;
    return server.fetch(url, init);
  };
  const lease = new TabLease(fakeOptions(server, clock, { fetch }));
  await lease.start();
  const epoch = lease.epoch;
  watching = true;
  lease._window.fire("pagehide", { persisted: true }); // into the back/forward cache: it may come back
  assert.ok(sync, "the release fetch was made inside the pagehide handler");
  assert.equal(sync.keepalive, true);
  assert.equal(sync.headers.Authorization, "Bearer token-1");
  assert.deepEqual(JSON.parse(sync.body), { tabId: lease.tabId, epoch });
  assert.equal(lease.role, "viewer");
  await flush();
  assert.equal(server.valid(), false);
  await lease.stop({ release: false });
});

test("pagehide of a page that is not kept says the tab is gone: its lease ends, and a takeover on its way takes nothing", async () => {
  for (const late of ["answer", "request"]) {
    // The takeover's answer is late (the server granted it), or the request itself is (the
    // server gets it after the page said it is gone).
    const clock = new FakeClock(1000);
    const server = new FakeServer(clock);
    let deliver = null;
    const fetch = (url, init) => {
      if (init.method !== "POST" || !url.endsWith("/lease") || !JSON.parse(init.body).mode) return server.fetch(url, init);
      if (late === "answer") {
        const answer = server.fetch(url, init);
        return new Promise((resolve) => (deliver = () => resolve(answer)));
      }
      return new Promise((resolve) => (deliver = () => resolve(server.fetch(url, init))));
    };
    const lease = new TabLease(fakeOptions(server, clock, { fetch }));
    server.takeoverBy("t-holder");
    await lease.start();
    assert.equal(lease.role, "viewer");
    const takeover = lease.takeover().catch((e) => e);
    await flush();
    assert.ok(deliver, "the takeover is on its way");
    lease._window.fire("pagehide", { persisted: false });
    const gone = server.callsTo("POST", "/lease/release").at(-1);
    assert.deepEqual(gone?.body, { tabId: lease.tabId, gone: true }, late);
    assert.equal(gone.keepalive, true);
    deliver();
    await takeover;
    await flush();
    assert.ok(!(server.valid() && server.holder.tabId === lease.tabId), `${late}: the closed tab holds nothing`);
    if (late === "request") assert.equal(server.holder?.tabId, "t-holder", "the holder keeps its lease");
    await lease.stop({ release: false });
  }
});

test("a page that enters the back/forward cache with a takeover on its way says the tab is gone, and acquires once restored and the window is over", async () => {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock);
  let deliver = null;
  const fetch = (url, init) => {
    if (init.method === "POST" && url.endsWith("/lease") && JSON.parse(init.body).mode === "takeover") {
      const answer = server.fetch(url, init); // granted now, answered after the page went
      return new Promise((resolve) => (deliver = () => resolve(answer)));
    }
    return server.fetch(url, init);
  };
  const lease = new TabLease(fakeOptions(server, clock, { fetch }));
  server.takeoverBy("t-holder");
  await lease.start();
  const took = lease.takeover().catch((e) => e);
  await flush();
  lease._window.fire("pagehide", { persisted: true });
  assert.deepEqual(server.callsTo("POST", "/lease/release").at(-1)?.body, { tabId: lease.tabId, gone: true });
  deliver();
  await took;
  await flush();
  assert.equal(server.valid(), false, "the grant that went to the cached page was given up");
  await clock.advance(5000);
  lease._window.fire("pageshow", { persisted: true });
  await flush();
  assert.equal(lease.role, "viewer", "refused for the rest of the window");
  const gone = server.callsTo("POST", "/lease").length;
  for (let t = 0; lease.role !== "owner" && t < 70000; t += 500) await clock.advance(500);
  assert.equal(lease.role, "owner", "owner once the window is over");
  assert.ok(clock.now() >= 61000, `owner at ${clock.now()}, not before the window's end`);
  assert.ok(server.callsTo("POST", "/lease").length - gone <= 3, "no stream of refused acquires meanwhile");
  await lease.stop({ release: false });
});

test("a page restored from the back/forward cache acquires again before it may mutate", async () => {
  const { clock, server, lease } = setup();
  await lease.start();
  const first = lease.epoch;
  lease._window.fire("pagehide", { persisted: true });
  await clock.advance(60000);
  assert.equal(server.callsTo("POST", "/lease/renew").length, 0, "no timers while in the cache");
  lease._window.fire("pageshow", { persisted: true });
  assert.equal(lease.role, "viewer");
  await flush();
  assert.equal(lease.role, "owner");
  assert.ok(lease.epoch > first, "a new grant after the release");
  await lease.stop({ release: false });
});

test("a tab id is fresh per TabLease and never stored", async () => {
  const clock = new FakeClock();
  const server = new FakeServer(clock);
  const a = new TabLease(fakeOptions(server, clock));
  const b = new TabLease(fakeOptions(server, clock));
  assert.notEqual(a.tabId, b.tabId);
  assert.match(a.tabId, /^[A-Za-z0-9._:@|-]{1,128}$/);
});

test("bad options are refused with a clear message", () => {
  assert.throws(() => new TabLease({ sessionId: "a b", getToken: () => "t" }), /sessionId/);
  assert.throws(() => new TabLease({ sessionId: "..", getToken: () => "t" }), /sessionId/);
  assert.throws(() => new TabLease({ sessionId: "doc-1" }), /getToken/);
});

test("a renew answer that arrives after its deadline announces no confirmed lease", async () => {
  const { clock, server, lease } = setup();
  await lease.start();
  const confirmed = [];
  lease.addEventListener("lease", (e) => {
    if (e.detail.reason === "confirmed") confirmed.push({ at: clock.now(), state: lease.state });
  });
  // The renew sent at 16000 is answered 50 s later (a frozen page, a stalled network), when the
  // deadline it gives (16000 + 45000 - 1500) has passed: news of a lease this tab no longer knows
  // it holds.
  server.latencyMs = 50000;
  await clock.advance(65001);
  const [renew] = server.callsTo("POST", "/lease/renew");
  assert.equal(renew.at, 16000);
  assert.equal(lease.state, "unconfirmed");
  assert.deepEqual(confirmed, [], "no lease event said this tab's lease was confirmed");
  await lease.stop({ release: false });
});

test("a renew the server refuses to authenticate ends ownership, and the tab takes the same lease back once it authenticates", async () => {
  const { clock, server, lease, errors, setToken } = withToken();
  await lease.start();
  const epoch = lease.epoch;
  server.rejectToken = "token-1"; // a session the identity provider ended: every token refused
  await clock.advance(15000 + 100); // the renew: 401, a fresh token, 401 again
  assert.equal(lease.role, "viewer", "the tab cannot prove it holds the lease");
  assert.ok(errors.some((e) => e.code === "UNAUTHENTICATED" && !e.retryable));
  await clock.advance(4000); // still refused: no owner on this side
  assert.equal(lease.role, "viewer");
  setToken("token-2"); // the user signed in again, 20 s before the lease would expire
  await clock.advance(10000);
  assert.equal(lease.role, "owner", "taken back as soon as the tab authenticates, not when the lease expires");
  assert.equal(lease.epoch, epoch, "the server still listed this tab: the same epoch");
  assert.equal(server.epoch, epoch);
  await lease.stop({ release: false });
});

test("a tab that cannot authenticate stops trying to take its lease back once the server no longer lists it", async () => {
  const { clock, server, lease } = setup({ lease: { getToken: async () => "token-1" } });
  await lease.start();
  server.rejectToken = "token-1";
  await clock.advance(15000 + 100);
  assert.equal(lease.role, "viewer");
  await clock.advance(45000); // the lease expires on the server meanwhile
  assert.equal(server.valid(), false);
  const before = server.callsTo("POST", "/lease").length;
  await clock.advance(120000);
  const during = server.callsTo("POST", "/lease").length - before;
  assert.ok(during <= 1, `${during} acquires in 2 minutes with the lease free and every token refused`);
  assert.equal(lease.role, "viewer");
  await lease.stop({ release: false });
});

test("a label is sent as the server takes it: 200 printable code points", async () => {
  const { printableLabel } = await import("./lease.js");
  assert.equal(printableLabel("a".repeat(199) + "😀tail"), "a".repeat(199) + "😀", "an emoji past the 200th UTF-16 unit is kept whole");
  assert.equal(printableLabel("Events\t—\n/evt\u00a01"), "Events — /evt 1", "tabs, line breaks and other spaces become a space");
  assert.equal(printableLabel("👩\u200d💻 dev\u0000\ud800"), "👩💻 dev", "a joiner, a control character and a lone surrogate are left out");
  assert.equal(printableLabel(null), "");
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock);
  const lease = new TabLease(fakeOptions(server, clock, { label: "x".repeat(199) + "😀😀" }));
  await lease.start();
  const sent = server.callsTo("POST", "/lease")[0].body.label;
  assert.equal([...sent].length, 200);
  assert.ok(sent.endsWith("😀"));
  await lease.stop({ release: false });
});

test("a grant whose answer arrives after the stream dropped and came back is confirmed by a renew sent at once", async () => {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock);
  let deliver = null;
  const fetch = (url, init) => {
    if (init.method !== "POST" || !url.endsWith("/lease") || !JSON.parse(init.body).mode) return server.fetch(url, init);
    const answer = server.fetch(url, init); // granted now, answered late
    return new Promise((resolve) => (deliver = () => resolve(answer)));
  };
  const lease = new TabLease(fakeOptions(server, clock, { fetch, stream: "fetch" }));
  server.takeoverBy("t-holder");
  await lease.start();
  await clock.advance(10);
  assert.equal(lease.role, "viewer");
  const takeover = lease.takeover();
  await flush();
  assert.ok(deliver, "the takeover is on its way");
  await clock.advance(5);
  server.dropStreams(); // after the takeover left: news may have been missed since
  await clock.advance(1500); // the stream reconnects (retry: 1000) and is live again
  assert.equal(server.streams.size, 1, "the stream is back");
  const renewsBefore = server.callsTo("POST", "/lease/renew").length;
  deliver();
  await takeover;
  await clock.advance(10);
  assert.ok(server.callsTo("POST", "/lease/renew").length > renewsBefore, "a renew went at once");
  assert.equal(lease.state, "owner");
  await lease.stop();
});

test("a takeover the page froze before it was sent is not sent on resume: it rejects with CANCELLED", async () => {
  for (const frozen of [true, false]) {
    const clock = new FakeClock(1000);
    const server = new FakeServer(clock);
    let hold = false;
    const waiting = [];
    const release = () => waiting.splice(0).forEach((resolve) => resolve("token-1"));
    const getToken = () => (hold ? new Promise((resolve) => waiting.push(resolve)) : Promise.resolve("token-1"));
    const lease = new TabLease(fakeOptions(server, clock, { getToken }));
    server.takeoverBy("t-holder");
    await lease.start();
    hold = true; // getToken waits on the network, as one that fetches the token does
    const takeover = lease.takeover().then(() => "granted", (e) => e.code);
    await flush();
    if (frozen) {
      lease._document.fire("freeze");
      await clock.advance(100); // meanwhile the user takes control in another tab
      server.takeoverBy("t-other");
      lease._document.fire("resume");
    }
    hold = false;
    release();
    const outcome = await takeover;
    await flush();
    const sent = server.callsTo("POST", "/lease").filter((c) => c.body.mode === "takeover" && c.body.tabId === lease.tabId);
    if (frozen) {
      assert.equal(outcome, "CANCELLED");
      assert.equal(sent.length, 0, "the takeover was not sent");
      assert.equal(server.holder.tabId, "t-other", "the later takeover keeps control");
    } else {
      assert.equal(outcome, "granted");
      assert.equal(server.holder.tabId, lease.tabId);
    }
    await lease.stop({ release: false });
  }
});
