// The client under browser lifecycles: a silent or frozen stream carrier, every tab listed,
// handlers that never settle, a server that cannot be reached: `node --test web/sdk/`.
import assert from "node:assert/strict";
import { test } from "node:test";

import { TabLease } from "./tablease.js";
import { FakeClock, FakeLocks, FakeServer, browserTabs, fakeOptions, flush, settle } from "./fakes.mjs";

/** Advances the fake clock in steps of stepMs, letting channel messages through between them. */
async function run(clock, ms, stepMs = 50) {
  for (let t = 0; t < ms; t += stepMs) await settle(clock, stepMs);
}

/** Makes the carrier of a tab hang: it keeps its lock but sends and hears nothing. */
function hang(lease) {
  const hub = lease._stream.hub;
  hub._channel.onmessage = null;
  hub._post = () => {};
  hub._deliver = () => {};
}

const ran = async () => "ran";

/** Two tabs: a carries the event stream, b (opened second, a follower) holds the lease. */
async function ownerBehindCarrier() {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock);
  const [a, b] = browserTabs(TabLease, 2, server, clock, { autoAcquire: false });
  await a.start();
  await b.start();
  await settle(clock);
  await b.acquire();
  await settle(clock, 100);
  return { clock, server, a, b };
}

test("a silent carrier is taken over within carrierTimeoutMs, and the owner behind it refuses after a takeover elsewhere", async () => {
  const { clock, server, a, b } = await ownerBehindCarrier();
  assert.deepEqual([a.streamCarrier, b.streamCarrier], [true, false]);
  assert.equal(b.role, "owner");

  hang(a);
  server.takeoverBy("t-elsewhere", "another browser");
  await settle(clock);
  assert.equal(b.role, "owner", "b has not heard yet: its carrier is silent");
  await run(clock, 1500);
  assert.equal(b.streamCarrier, true, "b took the stream over");
  assert.equal(b.role, "viewer");
  assert.equal(b.lease.holder?.tabId, "t-elsewhere");
  assert.deepEqual(await b.guard(ran)({}).then((r) => r.error?.code), "NOT_LEASE_OWNER");
  const conns = server.callsTo("GET", "/events");
  assert.equal(conns.length, 2);
  assert.equal(conns[1].query.tabId, b.tabId);
  for (const t of [a, b]) await t.stop({ release: false });
  await settle(clock);
});

test("a hidden follower whose timers fire seconds apart leaves a carrier that answers its pings alone, and its lease confirmed", async () => {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock);
  // b's timers fire at least 1.5 s after they are set, as a hidden page's are (a second or more),
  // longer than carrierTimeoutMs (1 s): at each of its checks the carrier has been quiet that long.
  const throttled = {
    now: () => clock.now(),
    setTimeout: (fn, ms) => clock.setTimeout(fn, Math.max(ms, 1500)),
    clearTimeout: (id) => clock.clearTimeout(id),
    sleep: (ms) => clock.sleep(Math.max(ms, 1500)),
  };
  const locks = new FakeLocks();
  const [a] = browserTabs(TabLease, 1, server, clock, { autoAcquire: false, locks });
  const [b] = browserTabs(TabLease, 1, server, throttled, { autoAcquire: false, locks });
  await a.start();
  await settle(clock);
  await b.start();
  await settle(clock);
  assert.deepEqual([a.streamCarrier, b.streamCarrier], [true, false]);
  await b.acquire();
  await settle(clock);
  const states = [];
  b.on("state", ({ state, reason }) => states.push(`${state}:${reason}`));
  const renews = server.callsTo("POST", "/lease/renew").length;
  await run(clock, 20000, 250);
  assert.equal(b.streamCarrier, false, "b never took the stream from a carrier that answers");
  assert.equal(a.streamCarrier, true);
  assert.equal(server.callsTo("GET", "/events").length, 1, "one connection all along");
  assert.deepEqual(states, [], "the owner behind the carrier stayed owner: the carrier answered every ping");
  const renewed = server.callsTo("POST", "/lease/renew").length - renews;
  assert.ok(renewed <= 2, `the renews of its schedule only (one per third of the TTL): ${renewed} in 20 s`);

  hang(a); // now the carrier does not answer: the first unanswered ping condemns it
  const hungAt = clock.now();
  while (!b.streamCarrier && clock.now() - hungAt < 6000) await run(clock, 250, 250);
  assert.equal(b.streamCarrier, true, "b took over the carrier that stopped answering");
  assert.ok(clock.now() - hungAt <= 4500, `within three of its checks: ${clock.now() - hungAt} ms`);
  for (const t of [a, b]) await t.stop({ release: false });
  await settle(clock);
});

test("a mutation in an owner that has not heard its carrier lately asks the carrier first, then the server if it does not answer", async () => {
  const { clock, server, a, b } = await ownerBehindCarrier();
  // The clock moves without b's timers running (a throttled background tab): a carrier that was
  // not asked anything is not suspect.
  clock._now += 1200;
  assert.equal(b.state, "owner");
  assert.equal(await b.guard(ran)({}), "ran", "the carrier answered the guard's ping");
  assert.equal(server.callsTo("POST", "/lease/check").length, 0, "no need to ask the server");

  hang(a);
  clock._now += 1200;
  assert.equal(b.state, "owner", "nothing asked yet");
  const answer = b.guard(ran)({}); // pings the carrier, which does not answer
  await settle(clock);
  clock._now += 600; // past the ping's due, still without b's timers
  assert.equal(b.role, "viewer", "a ping unanswered past its due: the tab may have missed news");
  assert.equal(b.state, "unconfirmed");
  await settle(clock, 10);
  assert.equal(await answer, "ran", "the guard confirmed with the server first");
  assert.ok(server.callsTo("POST", "/lease/check").length >= 1);
  for (const t of [a, b]) await t.stop({ release: false });
  await settle(clock);
});

test("an owner whose carrier answers a ping late, with no timer of its noticing, confirms with a renew, with state events", async () => {
  const { clock, server, a, b } = await ownerBehindCarrier();
  assert.equal(b.state, "owner");
  const states = [];
  b.on("state", ({ state, reason }) => states.push(`${state}:${reason}`));
  const renews = server.callsTo("POST", "/lease/renew").length;
  // The carrier's page is busy: what it hears waits until it is free.
  const carrier = a._stream.hub._channel;
  const onmessage = carrier.onmessage;
  const waiting = [];
  carrier.onmessage = (e) => waiting.push(e);
  clock._now += 600;
  await settle(clock, 10); // b's check runs once and pings
  assert.ok(waiting.some((e) => e.data.t === "ping"), "b pinged the carrier");
  // Neither tab's timers run for 1 s (a busy carrier page, a throttled follower)…
  clock._now += 1000;
  assert.equal(b.state, "unconfirmed", "the ping went unanswered past its due: news may have been missed");
  // … then the carrier answers.
  carrier.onmessage = onmessage;
  for (const e of waiting) onmessage(e);
  await settle(clock, 50);
  assert.ok(states.includes("unconfirmed:stream_down"), `a state event says why: ${states}`);
  assert.ok(server.callsTo("POST", "/lease/renew").length > renews, "the silence is confirmed away with a renew");
  assert.equal(b.state, "owner");
  assert.equal(states.at(-1), "owner:confirmed", `${states}`);
  for (const t of [a, b]) await t.stop({ release: false });
  await settle(clock);
});

test("a carrier being frozen gives the stream up at once and follows again on resume", async () => {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock);
  const [a, b] = browserTabs(TabLease, 2, server, clock);
  await a.start();
  await b.start();
  await settle(clock, 100);
  assert.deepEqual([a.streamCarrier, b.streamCarrier, a.role], [true, false, "owner"]);

  a._document.fire("freeze");
  assert.equal(a.streamCarrier, false);
  assert.equal(a.role, "viewer", "a frozen page is read-only");
  await settle(clock, 100);
  assert.equal(b.streamCarrier, true, "the next tab carries without waiting for a timeout");
  assert.equal(b.streamLive, true);
  server.takeoverBy("t-elsewhere");
  await settle(clock);
  assert.equal(b.lease.holder?.tabId, "t-elsewhere");

  a._document.fire("resume");
  assert.equal(a.role, "viewer");
  assert.equal(await a.guard(ran)({}).then((r) => r.error?.code), "NOT_LEASE_OWNER", "never runs on a stale lease after resume");
  await run(clock, 600);
  assert.equal(a.streamCarrier, false);
  assert.equal(a.streamLive, true, "a follows the new carrier");
  assert.equal(a.lease.holder?.tabId, "t-elsewhere");
  assert.equal(server.streams.size, 1, "still one connection");
  for (const t of [a, b]) await t.stop({ release: false });
  await settle(clock);
});

test("a frozen owner's renew that answers before resume does not make it owner", async () => {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock);
  const [a] = browserTabs(TabLease, 1, server, clock);
  await a.start();
  await settle(clock, 100);
  assert.equal(a.role, "owner");
  a._document.fire("freeze");
  await settle(clock, 20000); // renews sent before the freeze may answer while frozen
  assert.equal(a.role, "viewer");
  a._document.fire("resume");
  await settle(clock);
  assert.equal(a.role, "owner", "a renew sent after resume confirms");
  await a.stop({ release: false });
  await settle(clock);
});

test("a resumed owner behind a carrier confirms with one renew, and lists itself once", async () => {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock, { latencyMs: 50 }); // the renew is still in flight when the stream is back
  const [a, b] = browserTabs(TabLease, 2, server, clock, { presence: true, autoAcquire: false });
  for (const t of [a, b]) {
    const started = t.start();
    await run(clock, 500);
    await started;
  }
  const acquired = b.acquire();
  await run(clock, 500);
  await acquired;
  assert.equal(b.state, "owner");
  b._document.fire("freeze");
  await run(clock, 5000);
  const renews = server.callsTo("POST", "/lease/renew").length;
  const puts = server.callsTo("PUT", `/tabs/${b.tabId}`).length;
  b._document.fire("resume");
  await run(clock, 1000);
  assert.equal(b.state, "owner");
  assert.equal(server.callsTo("POST", "/lease/renew").length - renews, 1, "the renew sent at resume confirms: the stream back after it needs no other");
  assert.equal(server.callsTo("PUT", `/tabs/${b.tabId}`).length - puts, 1, "the listing sent at resume is the one the stream back asks for");
  for (const t of [a, b]) await t.stop({ release: false });
  await settle(clock);
});

test("a tab's listing is one PUT at a time, the last with the state as it is then", async () => {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock, { latencyMs: 100 });
  const [a] = browserTabs(TabLease, 1, server, clock, { presence: true, autoAcquire: false });
  const started = a.start();
  await run(clock, 1000);
  await started;
  const before = server.callsTo("PUT", `/tabs/${a.tabId}`).length;
  // The page is hidden and shown again and again faster than the server answers.
  for (const hidden of [true, false, true, false, true]) {
    a._document.setHidden(hidden);
    await settle(clock, 10);
  }
  await run(clock, 1000);
  const sent = server.callsTo("PUT", `/tabs/${a.tabId}`).slice(before);
  for (let i = 1; i < sent.length; i++) {
    assert.ok(sent[i].at >= sent[i - 1].at + 100, `PUT ${i} went at ${sent[i].at}, before PUT ${i - 1} (at ${sent[i - 1].at}) answered`);
  }
  assert.equal(sent.length, 2, "the first change, then one for all the others");
  assert.equal(sent.at(-1).body.hidden, true);
  assert.equal(server.tabs.get(a.tabId).hidden, true);
  await a.stop({ release: false });
  await settle(clock);
});

test("a handler that never settles stops counting when ownership ends, and cannot block a later handoff", async () => {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock);
  const other = [];
  const lease = new TabLease(fakeOptions(server, clock));
  await lease.start();
  let signal = null;
  lease.guard(async (args, l) => {
    signal = l.signal;
    return new Promise(() => {}); // ignores its signal, never settles
  })({});
  await flush();
  assert.equal(lease.inFlight, 1);
  server.takeoverBy("t-b", "B");
  lease._onStreamEvent({ type: "lease", id: "1-0", data: { type: "taken_over", epoch: server.epoch, holder: { tabId: "t-b", label: "B" }, previous: null } });
  assert.equal(signal.aborted, true);
  assert.equal(lease.inFlight, 0, "the ended period's handler no longer counts");

  await lease.takeover();
  assert.equal(lease.role, "owner");
  assert.equal(lease.inFlight, 0);
  lease.on("handoff", (d) => other.push(d.phase));
  server.handoff = { requester: "t-b", at: clock.now() };
  lease._onStreamEvent({ type: "lease", id: "2-0", data: { type: "handoff_requested", epoch: lease.epoch, holder: { tabId: lease.tabId }, requester: { tabId: "t-b" } } });
  await flush();
  assert.deepEqual(other, ["requested", "released"]);
  assert.equal(server.valid(), false, "released at once: nothing of this period runs");
  await lease.stop({ release: false });
});

test("a holder asked to hand over waits handoffGraceMs for a stuck handler, then aborts it and releases", async () => {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock);
  const lease = new TabLease(fakeOptions(server, clock, { handoffGraceMs: 5000 }));
  await lease.start();
  let signal = null;
  lease.guard(async (args, l) => {
    signal = l.signal;
    return new Promise(() => {});
  })({});
  await flush();
  server.handoff = { requester: "t-b", at: clock.now() };
  lease._onStreamEvent({ type: "lease", id: "2-0", data: { type: "handoff_requested", epoch: lease.epoch, holder: { tabId: lease.tabId }, requester: { tabId: "t-b" } } });
  assert.equal(lease.state, "releasing");
  assert.equal((await lease.guard(ran)({})).error?.details.reason, "handoff");
  await clock.advance(4900);
  assert.equal(server.valid(), true, "still waiting for the handler");
  await clock.advance(200);
  assert.equal(signal.aborted, true);
  assert.equal(server.valid(), false, "released after the grace");
  assert.equal(lease.handoff, null);
  await lease.stop({ release: false });
});

test("a handoff request that lapsed is cleared and the holder mutates again", async () => {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock);
  const lease = new TabLease(fakeOptions(server, clock, { handoffGraceMs: 5000 }));
  await lease.start();
  lease.guard(async () => new Promise(() => {}))({});
  await flush();
  server.handoff = { requester: "t-b", at: clock.now() };
  lease._onStreamEvent({ type: "lease", id: "2-0", data: { type: "handoff_requested", epoch: lease.epoch, holder: { tabId: lease.tabId }, requester: { tabId: "t-b" } } });
  assert.equal(lease.handoff, "releasing");
  server.handoff = null; // the requester went away and its request lapsed
  await clock.advance(5100);
  assert.equal(lease.handoff, null);
  assert.equal(lease.state, "owner");
  assert.equal(server.valid(), true, "the lease was kept");
  assert.equal(await lease.guard(ran)({}), "ran");
  await lease.stop({ release: false });
});

/** Two tabs of one browser that list themselves (presence), started. */
async function listedPair() {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock);
  const [a, b] = browserTabs(TabLease, 2, server, clock, { presence: true });
  await a.start();
  await b.start();
  return { clock, server, a, b };
}

test("every tab lists itself, refreshes, says when it hides, and leaves on pagehide", async () => {
  const { clock, server, a, b } = await listedPair();
  await settle(clock);
  assert.deepEqual([...server.tabs.keys()].sort(), [a.tabId, b.tabId].sort());
  assert.deepEqual(server.tabs.get(b.tabId), { tabId: b.tabId, label: "tab 1", hidden: false });
  assert.equal(server.callsTo("GET", "/events")[0].query.presence, "false", "the stream does not list its carrier: tabs list themselves");
  const listed = await a.listTabs();
  assert.deepEqual(listed.map((t) => `${t.tabId} ${t.label}`).sort(), [`${a.tabId} tab 0`, `${b.tabId} tab 1`].sort(), "listTabs() reads GET …/tabs");
  assert.equal(server.callsTo("GET", "/tabs").length, 1);
  const seen = [];
  a.on("tabs", (d) => seen.push(`${d.type} ${d.tab.tabId}`));

  const before = server.callsTo("PUT", `/tabs/${b.tabId}`).length;
  await settle(clock, 15000);
  assert.equal(server.callsTo("PUT", `/tabs/${b.tabId}`).length, before + 1, "refreshed every refreshAfterMs");
  b._document.setHidden(true);
  await settle(clock);
  assert.equal(server.tabs.get(b.tabId).hidden, true);

  b._window.fire("pagehide", { persisted: false });
  const del = server.callsTo("DELETE", `/tabs/${b.tabId}`);
  assert.equal(del.length, 1);
  assert.equal(del[0].keepalive, true);
  await settle(clock);
  assert.deepEqual([...server.tabs.keys()], [a.tabId]);
  assert.deepEqual(seen, [`left ${b.tabId}`], "the carrier change did not make a leave and join again");
  for (const t of [a, b]) await t.stop({ release: false });
  await settle(clock);
});

test("a tab's listing that reaches the server after the DELETE of its pagehide lists nothing, and a restored page lists itself again", async () => {
  const { clock, server, a, b } = await listedPair();
  await settle(clock);
  assert.equal(server.tabs.has(b.tabId), true);

  // b lists itself again (it hid), and its page goes before that PUT reached the server: the
  // DELETE of pagehide, on a connection of its own, gets there first.
  const letGo = server.hold(`PUT /tabs/${b.tabId}`);
  b._document.setHidden(true);
  await flush();
  b._window.fire("pagehide", { persisted: true });
  await flush();
  const [del] = server.callsTo("DELETE", `/tabs/${b.tabId}`);
  assert.equal(del.keepalive, true);
  assert.equal(server.tabs.has(b.tabId), false, "the DELETE reached the server");
  letGo();
  await settle(clock);
  const puts = server.callsTo("PUT", `/tabs/${b.tabId}`);
  assert.equal(puts.at(-1).body.hidden, true, "the held PUT reached the server after the DELETE");
  assert.equal(server.tabs.has(b.tabId), false, "the PUT that came late did not list the closed tab");
  assert.ok(puts.at(-1).body.seq < Number(del.query.seq), `the PUT's seq ${puts.at(-1).body.seq} is below the DELETE's ${del.query.seq}`);
  assert.ok(puts.every((p, i) => i === 0 || p.body.seq > puts[i - 1].body.seq), "every PUT has a higher seq than the one before");

  // Restored from the back/forward cache, it lists itself again.
  b._window.fire("pageshow", { persisted: true });
  await settle(clock);
  assert.ok(server.callsTo("PUT", `/tabs/${b.tabId}`).at(-1).body.seq > Number(del.query.seq));
  assert.equal(server.tabs.has(b.tabId), true, "the restored page is listed");
  for (const t of [a, b]) await t.stop({ release: false });
  await settle(clock);
});

test("a server that forgot its tabs (a restart) lists them again as soon as their stream is back", async () => {
  const { clock, server, a, b } = await listedPair();
  await settle(clock, 100);
  assert.equal(server.tabs.size, 2);
  server.down = true;
  server.tabs.clear();
  server.dropStreams();
  await settle(clock, 3000);
  server.down = false;
  await run(clock, 3000);
  assert.equal(a.streamLive || b.streamLive, true, "the stream is back");
  assert.deepEqual([...server.tabs.keys()].sort(), [a.tabId, b.tabId].sort(), "listed again well before the 15 s refresh");
  for (const t of [a, b]) await t.stop({ release: false });
  await settle(clock);
});

test("a store that lost its tabs while the stream stayed up: the next snapshot has every tab list itself again", async () => {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock);
  const [a, b] = browserTabs(TabLease, 2, server, clock, { presence: true, streamIdleMs: 600000 });
  try {
    await a.start();
    await b.start();
    await settle(clock, 100);
    assert.equal(server.tabs.size, 2);
    const puts = server.callsTo("PUT", `/tabs/${a.tabId}`).length + server.callsTo("PUT", `/tabs/${b.tabId}`).length;
    // Redis restarted empty; the instance's watch started over on the same connection.
    server.tabs.clear();
    server.resnapshot();
    await settle(clock, 100);
    assert.deepEqual([...server.tabs.keys()].sort(), [a.tabId, b.tabId].sort(), "listed again at once, not at the 15 s refresh");
    const again = server.callsTo("PUT", `/tabs/${a.tabId}`).length + server.callsTo("PUT", `/tabs/${b.tabId}`).length;
    assert.equal(again - puts, 2, "one PUT each");
    // A snapshot that lists them sends nothing.
    server.resnapshot();
    await settle(clock, 100);
    assert.equal(server.callsTo("PUT", `/tabs/${a.tabId}`).length + server.callsTo("PUT", `/tabs/${b.tabId}`).length, again);
  } finally {
    for (const t of [a, b]) await t.stop({ release: false });
    await settle(clock);
  }
});

test("a tab whose own network comes back lists itself again at its first answer, though the stream stayed up", async () => {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock);
  let offline = false;
  const fetch = (...args) => (offline ? Promise.reject(new TypeError("Failed to fetch")) : server.fetch(...args));
  const locks = new FakeLocks();
  // The stream stays up all along (the fake server sends no keepalives: no idle timeout either).
  const quiet = { presence: true, autoAcquire: false, locks, streamIdleMs: 600000 };
  const [a] = browserTabs(TabLease, 1, server, clock, quiet);
  const [b] = browserTabs(TabLease, 1, server, clock, { ...quiet, fetch });
  await a.start();
  await settle(clock, 100);
  await b.start();
  await settle(clock, 100);
  await b.acquire();
  await settle(clock, 100);
  assert.deepEqual([a.streamCarrier, b.streamCarrier, b.role], [true, false, "owner"]);
  offline = true; // b alone: a carries the stream, which stays up
  await run(clock, 50000, 500);
  server.tabs.delete(b.tabId); // the server timed b out of the list meanwhile
  offline = false;
  const back = clock.now();
  while (!server.tabs.has(b.tabId) && clock.now() - back < 20000) await run(clock, 250, 250);
  assert.ok(server.tabs.has(b.tabId), "b is listed again");
  const ofB = server.calls.filter((c) => c.at >= back && (c.body?.tabId === b.tabId || c.path.endsWith("/tabs/" + b.tabId)));
  const answered = ofB.find((c) => c.method !== "PUT").at;
  const listed = ofB.find((c) => c.method === "PUT").at;
  assert.ok(listed - answered <= 100, `listed ${listed - back} ms after its network came back, its first answer at ${answered - back} ms`);
  assert.equal(server.callsTo("GET", "/events").length, 1, "the stream stayed up");
  for (const t of [a, b]) await t.stop({ release: false });
  await settle(clock);
});

test("a tab whose network comes back (online) renews at once, not when its backoff comes round", async () => {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock, { ttlMs: 20000 });
  let offline = false;
  const fetch = (...args) => (offline ? Promise.reject(new TypeError("Failed to fetch")) : server.fetch(...args));
  const [a] = browserTabs(TabLease, 1, server, clock, { presence: true, fetch, streamIdleMs: 600000 });
  try {
    await a.start();
    await settle(clock, 300);
    assert.equal(a.role, "owner");
    offline = true;
    await run(clock, 12000, 250); // renews fail from 6.7 s on and back off; the deadline is near
    assert.equal(a.role, "owner", "still within its deadline");
    offline = false;
    const back = clock.now();
    a._window.fire("online");
    await settle(clock, 50);
    const renewed = server.calls.filter((c) => c.at >= back && c.path === "/lease/renew");
    assert.equal(renewed.length, 1, "renewed at once");
    assert.ok(renewed[0].at - back <= 10, `renewed ${renewed[0].at - back} ms after online`);
    assert.equal(a.role, "owner");
  } finally {
    await a.stop({ release: false });
    await settle(clock);
  }
});

test("a tab that starts carrying the stream says so, though the stream stayed live", async () => {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock);
  const [a, b] = browserTabs(TabLease, 2, server, clock);
  await a.start();
  await b.start();
  await settle(clock, 100);
  assert.deepEqual([a.streamCarrier, b.streamCarrier, b.streamLive], [true, false, true]);
  const seen = [];
  b.on("stream", (d) => seen.push(d));
  // The carrier's renderer dies: it says nothing, and the browser frees its lock at once.
  hang(a);
  a._stream.hub._leading.release();
  await settle(clock, 100);
  assert.equal(b.streamCarrier, true);
  assert.deepEqual(seen, [{ live: true, carrier: true }], "the stream stayed live: carrier is the news");
  for (const t of [a, b]) await t.stop({ release: false });
  await settle(clock);
});

test("a start that cannot reach the server is an error event that says why, not a silent viewer", async () => {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock);
  server.down = true;
  const lease = new TabLease(fakeOptions(server, clock, { origin: "http://app.test" }));
  const errors = [];
  lease.on("error", ({ error }) => errors.push(error));
  await lease.start();
  assert.equal(lease.role, "viewer");
  assert.equal(errors.length, 1);
  assert.equal(errors[0].code, "NETWORK");
  assert.match(errors[0].message, /POST http:\/\/tablease\.test\/v1\/sessions\/s1\/lease got no answer/);
  assert.match(errors[0].message, /does not allow requests from http:\/\/app\.test/);
  assert.match(errors[0].message, /TABLEASE_CORS_ORIGINS/);
  await clock.advance(5000);
  assert.equal(errors.length, 1, "one error per outage, however often it retries");
  server.down = false;
  await clock.advance(20000);
  assert.equal(lease.role, "owner", "it retried and took the lease");
  await lease.stop({ release: false });
});

test("the state moves only along named transitions", async () => {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock);
  const lease = new TabLease(fakeOptions(server, clock, { stream: "fetch" }));
  const states = [];
  lease.on("state", ({ state, reason }) => states.push(`${state}:${reason}`));
  assert.equal(lease.state, "stopped");
  await lease.start();
  await flush();
  server.takeoverBy("t-b");
  await flush();
  await lease.takeover();
  lease._window.fire("pagehide", { persisted: true });
  await lease.stop();
  assert.deepEqual(states, ["viewer:started", "owner:confirmed", "viewer:event", "owner:confirmed", "viewer:away", "away:pagehide", "stopped:stopped"]);
});

test("stop goes straight to stopped and sends no renew; stop({release: false}) leaves the lease as it was", async () => {
  for (const release of [true, false]) {
    const clock = new FakeClock(1000);
    const server = new FakeServer(clock);
    const lease = new TabLease(fakeOptions(server, clock, { stream: "fetch" }));
    await lease.start();
    await flush();
    assert.equal(lease.role, "owner");
    await clock.advance(5000);
    const expiresAt = server.expiresAt;
    const renews = server.callsTo("POST", "/lease/renew").length;
    const states = [];
    const roles = [];
    lease.on("state", ({ state, reason }) => states.push(`${state}:${reason}`));
    lease.on("rolechange", ({ role, reason }) => roles.push(`${role}:${reason}`));
    await lease.stop({ release });
    await flush();
    assert.equal(server.callsTo("POST", "/lease/renew").length, renews, "no renew of the lease being given up");
    assert.deepEqual(states, ["stopped:stopped"]);
    assert.deepEqual(roles, ["viewer:stopped"]);
    if (release) {
      assert.equal(server.valid(), false, "released");
    } else {
      assert.equal(server.expiresAt, expiresAt, "the lease is left to expire when it would have");
    }
  }
});

test("after the store lost its data, every tab sees the lease free, one takes it, and none polls in a loop", async () => {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock, { ttlMs: 6000 });
  // Some jitter, so that a loop of reads would take fake time (without it, one instant: a hang).
  const tabs = browserTabs(TabLease, 2, server, clock, { random: () => 0.5 });
  try {
    for (const t of tabs) await t.start();
    await run(clock, 500);
    assert.equal(tabs.filter((t) => t.role === "owner").length, 1);
    const lost = server.epoch;

    // The store restarts empty: it holds no lease and answers epoch 0 (nothing granted), and its
    // next grant's epoch is above every earlier one (the floor of the store's clock).
    server.holder = null;
    server.epoch = 0;
    server.transitions = 0;
    server.floorEpochsAbove(lost);
    server.dropStreams();
    const before = server.calls.length;
    await run(clock, 20000);

    const owners = tabs.filter((t) => t.role === "owner");
    assert.equal(owners.length, 1, "one tab took the free lease by itself (autoAcquire)");
    assert.equal(server.holder?.tabId, owners[0].tabId);
    assert.ok(server.epoch > lost);
    for (const t of tabs) {
      assert.equal(t.lease.holder?.tabId, owners[0].tabId, "every tab shows the new holder, not the one the store forgot");
      assert.equal(t.lease.epoch, server.epoch);
    }
    const reads = server.calls.slice(before).filter((c) => c.method === "GET" && c.path === "/lease").length;
    assert.ok(reads <= 20, `the tabs read the lease ${reads} times in 20 s`);
  } finally {
    for (const t of tabs) await t.stop({ release: false });
    await settle(clock);
  }
});

test("after the store lost its data while the stream stayed up, the owner acts no more from the snapshot that shows it", async () => {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock, { latencyMs: 100 });
  const tabs = browserTabs(TabLease, 2, server, clock, { random: () => 0.5 });
  try {
    for (const t of tabs) {
      const started = t.start();
      await run(clock, 500);
      await started;
    }
    await run(clock, 1000);
    const owner = tabs.find((t) => t.role === "owner");
    assert.ok(owner, "a tab took the lease");
    const lost = server.epoch;
    const states = [];
    owner.on("state", ({ state, reason }) => states.push(`${state}:${reason}`));

    // Redis restarted empty, and the instance's watch started over on the same connection: the
    // next snapshot, with the lease free at epoch 0, is the only news of it.
    server.holder = null;
    server.epoch = 0;
    server.transitions = 0;
    server.floorEpochsAbove(lost);
    server.resnapshot();
    await flush();
    assert.equal(owner.state, "unconfirmed", `states ${states}: read-only from the snapshot on, before any answer`);
    assert.equal(owner.role, "viewer");

    await run(clock, 5000);
    const owners = tabs.filter((t) => t.role === "owner");
    assert.equal(owners.length, 1, "one tab took the free lease");
    assert.equal(server.holder?.tabId, owners[0].tabId);
    assert.ok(server.epoch > lost);
    assert.deepEqual(states.slice(0, 2), ["unconfirmed:event", "viewer:lost"], "its renew of the forgotten epoch answered LEASE_LOST");
  } finally {
    for (const t of tabs) await t.stop({ release: false });
    await settle(clock);
  }
});

for (const [name, turns, knowsNewEpoch] of [
  ["a takeover that a Redis failover lost leaves", ["b"], true],
  ["takeovers by both tabs in turn that a Redis failover lost leave", ["b", "a", "b"], true],
  ["a takeover that a Redis failover lost, with a server that does not know newEpoch, leaves", ["b"], false],
]) {
  test(`${name} one owner within a second, every tab showing the store, at an epoch above the lost ones`, async () => {
    const clock = new FakeClock(1000);
    const server = new FakeServer(clock);
    server.knowsNewEpoch = knowsNewEpoch;
    const [a, b] = browserTabs(TabLease, 2, server, clock, { random: () => 0.5 });
    const tabs = { a, b };
    try {
      await a.start();
      await run(clock, 300);
      await b.start();
      await run(clock, 300);
      assert.deepEqual([a.role, b.role], ["owner", "viewer"]);
      const before = { epoch: server.epoch, holder: { ...server.holder }, expiresAt: server.expiresAt };
      for (const t of turns) {
        await tabs[t].takeover();
        await run(clock, 300);
        assert.equal(tabs[t].role, "owner");
      }
      // The epoch the last takeover's backend writes carried: a resource they wrote is fenced at it.
      const lost = server.epoch;

      // The failover loses the takeovers: the new primary has a's lease at its old epoch, and
      // mints new epochs from its clock, above every earlier one.
      Object.assign(server, { epoch: before.epoch, holder: before.holder, expiresAt: before.expiresAt + 5000 });
      server.floorEpochsAbove(lost);
      server.dropStreams();
      const calls = server.calls.length;
      await run(clock, 1000);

      const owners = [a, b].filter((t) => t.role === "owner");
      assert.equal(owners.length, 1, "one tab is owner again");
      assert.equal(server.holder?.tabId, owners[0].tabId, "the store's holder");
      assert.ok(owners[0].epoch > lost, `the owner holds epoch ${owners[0].epoch}, above the lost ${lost}: a backend that fenced at it accepts its writes`);
      const releases = server.calls.slice(calls).filter((c) => c.path === "/lease/release").length;
      if (knowsNewEpoch) {
        // The tab the store gave the lease back to asked for a new epoch: the lease never left it.
        assert.equal(owners[0].tabId, before.holder.tabId, "the tab the store gave the lease back to");
        assert.equal(releases, 0, "the new epoch was asked for, not taken by a release and an acquire");
        assert.ok(server.calls.slice(calls).some((c) => c.path === "/lease" && c.body?.newEpoch === true));
      } else {
        assert.equal(releases, 1, "a server that refuses newEpoch: a release, then an acquire");
      }
      for (const t of [a, b]) {
        assert.equal(t.lease.holder?.tabId, owners[0].tabId, "every tab shows the store's holder");
        assert.equal(t.lease.epoch, server.epoch);
      }
      await run(clock, 4000, 200);
      assert.equal(owners[0].role, "owner");
      assert.ok(server.calls.length - calls < 14, `${server.calls.length - calls} requests in 5 s`);
    } finally {
      for (const t of [a, b]) await t.stop({ release: false });
    }
  });
}

test("a request for a new epoch that the store could not answer is made again at the next renew", async () => {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock);
  const [a, b] = browserTabs(TabLease, 2, server, clock, { random: () => 0.5 });
  try {
    await a.start();
    await run(clock, 300);
    await b.start();
    await run(clock, 300);
    const before = { epoch: server.epoch, holder: { ...server.holder }, expiresAt: server.expiresAt };
    await b.takeover();
    await run(clock, 300);
    const lost = server.epoch;
    Object.assign(server, { epoch: before.epoch, holder: before.holder, expiresAt: before.expiresAt + 5000 });
    server.floorEpochsAbove(lost);
    server.fail("POST /lease", { status: 503 }); // the request for a new epoch
    server.dropStreams();
    const calls = server.calls.length;
    await run(clock, 1000);
    const asked = () => server.calls.slice(calls).filter((c) => c.path === "/lease" && c.body?.newEpoch === true).length;
    assert.equal(asked(), 1, "asked once, and answered 503");
    assert.ok(!(a.epoch > lost) && !(b.epoch > lost), "nobody above the lost epoch yet");
    await run(clock, 20000, 500); // a's next renew confirms it below the lost epoch again
    assert.equal(asked(), 2, "asked again after the renew");
    assert.equal(a.role, "owner");
    assert.ok(a.epoch > lost, `a holds epoch ${a.epoch}, above the lost ${lost}`);
    assert.equal(server.calls.slice(calls).filter((c) => c.path === "/lease/release").length, 0);
  } finally {
    for (const t of [a, b]) await t.stop({ release: false });
  }
});

for (const [what, before] of [
  ["another tab's lease", (mine) => ({ held: true, holder: { tabId: "before", label: "", hidden: false }, epoch: mine - 1, role: "viewer" })],
  ["a session with no state (epoch 0)", () => ({ held: false, holder: null, epoch: 0, transitions: 0, role: "viewer" })],
]) test(`a snapshot below the epoch a tab holds (a stream opened before its grant), showing ${what}, leaves its lease alone`, async () => {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock);
  const [a] = browserTabs(TabLease, 1, server, clock, { autoAcquire: false });
  try {
    await a.start();
    await a.acquire();
    await run(clock, 100);
    const mine = a.epoch;
    // The next stream's snapshot shows the store as it was before the grant.
    const snapshot = before(mine);
    const stream = server._stream.bind(server);
    let stale = true;
    server._stream = (call, signal) => {
      if (!stale) return stream(call, signal);
      stale = false;
      const lease = server.lease;
      server.lease = (tabId) => ({ ...lease.call(server, tabId), ...snapshot });
      try {
        return stream(call, signal);
      } finally {
        server.lease = lease;
      }
    };
    const states = new Set();
    a.on("state", ({ state }) => states.add(state));
    server.dropStreams();
    await run(clock, 3000);
    assert.equal(stale, false, "the stream reconnected and got the stale snapshot");
    assert.equal(a.role, "owner");
    assert.equal(a.epoch, mine);
    assert.ok(!states.has("viewer"), `states ${[...states]}: the tab held its epoch throughout (unconfirmed while its stream was down)`);
    assert.equal(server.calls.filter((c) => c.path === "/lease/release").length, 0);
  } finally {
    await a.stop({ release: false });
  }
});

test("an answer to a request sent before a takeover came is older news, not a store that went back", async () => {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock, { latencyMs: 300 });
  const [a] = browserTabs(TabLease, 1, server, clock, { autoAcquire: false });
  try {
    const started = a.start();
    await run(clock, 700);
    await started;
    const acquired = a.acquire();
    await run(clock, 400);
    await acquired;
    assert.equal(a.role, "owner");
    const mine = a.epoch;
    a.refresh(); // answered 300 ms later, computed now: a at its epoch
    await run(clock, 50);
    server.takeoverBy("elsewhere"); // an event, heard at once
    await run(clock, 500);
    assert.equal(a.role, "viewer", "the late answer does not give the lease back");
    assert.equal(a.lease.holder?.tabId, "elsewhere");
    assert.ok(a.lease.epoch > mine);
    assert.equal(server.calls.filter((c) => c.path === "/lease/release").length, 0);
  } finally {
    await a.stop({ release: false });
  }
});

test("hidden viewers without a shared stream, started together, spread their reads of the lease over a fifth of viewerPollMs", async () => {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock);
  const tabs = browserTabs(TabLease, 7, server, clock, { locks: undefined, autoAcquire: false });
  tabs.forEach((t, i) => {
    let n = i; // a random of its own for each tab, the same on every run: i/7, (i+3)/7, …
    t._random = () => ((n += 3) % 7) / 7;
  });
  for (const t of tabs) t._document.setHidden(true);
  tabs[6]._document.setHidden(false);
  for (const t of tabs) await t.start();
  await settle(clock, 25000);
  const hidden = new Set(tabs.slice(0, 6).map((t) => t.tabId));
  const firstPoll = [...hidden].map((id) => server.calls.find((c) => c.method === "GET" && c.path === "/lease" && c.query.tabId === id && c.at > 1000 + 9000)?.at);
  assert.ok(firstPoll.every((at) => typeof at === "number"), "every hidden viewer read the lease again within its poll");
  const span = Math.max(...firstPoll) - Math.min(...firstPoll);
  assert.ok(span >= 1000, `the six reads came within ${span} ms of each other; want them spread over about 2 s`);
  for (const t of tabs) await t.stop({ release: false });
});

test("tabs that cannot share a stream (no Web Locks: not a secure context) keep one only while visible or holding the lease", async () => {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock);
  const tabs = browserTabs(TabLease, 7, server, clock, { locks: undefined, autoAcquire: false });
  for (const t of tabs) t._document.setHidden(true); // one window: every tab but the last hidden
  tabs[6]._document.setHidden(false);
  for (const t of tabs) await t.start();
  await settle(clock, 100);
  const open = () => [...server.streams].map((s) => s.tabId).sort();
  assert.deepEqual(open(), [tabs[6].tabId], "the visible tab alone streams; six hidden viewers would hold the origin's six connections");

  // A hidden tab that takes the lease streams too; shown, a viewer streams; hidden again, it does not.
  await tabs[0].acquire();
  await settle(clock, 100);
  assert.equal(tabs[0].state, "owner");
  assert.deepEqual(open(), [tabs[0].tabId, tabs[6].tabId].sort());
  tabs[6]._document.setHidden(true);
  tabs[3]._document.setHidden(false);
  await settle(clock, 100);
  assert.deepEqual(open(), [tabs[0].tabId, tabs[3].tabId].sort());

  // A hidden viewer without a stream still learns of a takeover, at its next read of the lease.
  await tabs[3].takeover();
  await settle(clock, 100);
  assert.equal(tabs[0].state, "viewer");
  assert.deepEqual(open(), [tabs[3].tabId], "the old owner, hidden, gave its stream up");
  await settle(clock, 12000);
  for (const t of tabs) assert.equal(t.lease?.holder?.tabId, tabs[3].tabId, "every tab read the new holder within viewerPollMs and its jitter");

  // A hidden viewer that asks for a handoff streams while it waits: the release is news at once.
  let result = null;
  tabs[1].requestHandoff().then((r) => (result = r));
  await settle(clock, 100);
  assert.ok(open().includes(tabs[1].tabId), "the asking tab streams while it waits");
  await settle(clock, 500);
  assert.equal(result?.status, "granted", "granted within half a second of asking, not at the next read of the lease");
  assert.equal(tabs[1].state, "owner");
  assert.deepEqual(open(), [tabs[1].tabId, tabs[3].tabId].sort(), "the new owner, hidden, and the shown tab");
  for (const t of tabs) await t.stop({ release: false });
  await settle(clock);
});
