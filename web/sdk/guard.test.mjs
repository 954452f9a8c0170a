// guard(handler) and the handoff, both sides: `node --test web/sdk/`.
import assert from "node:assert/strict";
import { test } from "node:test";

import { NOT_LEASE_OWNER, TabLease } from "./tablease.js";
import { FakeClock, FakeServer, fakeOptions, flush } from "./fakes.mjs";

function setup({ server: so = {}, lease: lo = {} } = {}) {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock, so);
  const lease = new TabLease(fakeOptions(server, clock, lo));
  return { clock, server, lease };
}

/** Feeds every new server event to the leases, as the shared stream would. */
function wire(server, ...leases) {
  const seen = new Set();
  const orig = server.emit.bind(server);
  server.emit = (type, data) => {
    const id = orig(type, data);
    if (!seen.has(id)) {
      seen.add(id);
      for (const l of leases) l._onStreamEvent({ type, id, data: JSON.parse(JSON.stringify(data)) });
    }
    return id;
  };
}

test("a viewer's guard answers NOT_LEASE_OWNER without running the handler", async () => {
  const { server, lease } = setup();
  server.takeoverBy("t-other", "Events — other tab");
  await lease.start();
  let ran = 0;
  const save = lease.guard(() => ran++);
  const res = await save({ id: "evt-1" });
  assert.equal(ran, 0);
  assert.deepEqual(res, {
    error: {
      code: NOT_LEASE_OWNER,
      message: res.error.message,
      retryable: false,
      details: { sessionId: "s1", tabId: lease.tabId, reason: "viewer", holder: { tabId: "t-other", label: "Events — other tab" }, epoch: server.epoch },
    },
  });
  assert.match(res.error.message, /Another tab controls this session/);
  await lease.stop({ release: false });
});

test("an owner's guard runs the handler with the epoch, the lease token and the caller's context", async () => {
  const { server, lease } = setup();
  await lease.start();
  let got;
  const save = lease.guard(async (args, l, ctx) => {
    got = { args, l, ctx };
    return { saved: args.id };
  });
  const res = await save({ id: "evt-1" }, { toolRequestId: "r-1" });
  assert.deepEqual(res, { saved: "evt-1" });
  assert.equal(got.l.epoch, server.epoch);
  assert.match(got.l.token, /^lt\./);
  assert.deepEqual(got.l.headers, { "Tablease-Lease": got.l.token });
  assert.equal(got.l.tabId, lease.tabId);
  assert.equal(got.l.sessionId, "s1");
  assert.equal(got.l.signal.aborted, false);
  assert.deepEqual(got.ctx, { toolRequestId: "r-1" });
  assert.equal(server.callsTo("POST", "/lease/check").length, 0, "no check while the lease is confirmed");
  await lease.stop({ release: false });
});

test("a handler that waits reads the grant's latest token, which renews replace, until its ownership ends", async () => {
  const { clock, server, lease } = setup();
  await lease.start();
  let resume;
  const seen = [];
  const save = lease.guard(async (args, l) => {
    seen.push(l.token);
    await new Promise((r) => (resume = r));
    seen.push(l.token, l.headers["Tablease-Lease"]);
    await new Promise((r) => (resume = r));
    seen.push(l.token);
    return { saved: true };
  });
  const running = save({});
  await flush();
  await clock.advance(15000); // a renew answers a new token of the same epoch
  assert.notEqual(lease.token, seen[0], "the renew replaced the token");
  resume();
  await flush();
  assert.deepEqual(seen.slice(1), [lease.token, lease.token], "token and headers read the latest token");
  const last = lease.token;
  server.takeoverBy("t-other");
  lease._onStreamEvent({ type: "lease", id: "9-0", data: { type: "taken_over", epoch: server.epoch, holder: { ...server.holder }, previous: null } });
  await clock.advance(15000); // no renew of a lost lease; a later grant would be another epoch
  assert.equal((await running).error.details.mayHaveActed, true, "the call was answered as its ownership ended");
  resume(); // the handler, still running, goes on
  await flush();
  assert.equal(seen[3], last, "once its ownership ended, the handler keeps the last token it had");
  await lease.stop({ release: false });
});

test("a guard refuses once the local deadline has passed and the check says the lease is gone", async () => {
  const { clock, server, lease } = setup();
  server.fail("POST /lease/renew", { network: true, times: 1000 });
  await lease.start();
  await clock.advance(46000); // the server lease expired too
  let ran = false;
  const res = await lease.guard(() => (ran = true))({});
  assert.equal(ran, false);
  assert.equal(res.error.code, NOT_LEASE_OWNER);
  assert.equal(res.error.details.reason, "lost");
  assert.equal(res.error.details.holder, null);
  assert.match(res.error.message, /^This tab no longer controls this session/, "nobody is known to hold it: the message must not blame another tab");
  assert.equal(server.callsTo("POST", "/lease/check").length, 1);
  await lease.stop({ release: false });
});

test("after resume the guard checks with the server before running", async () => {
  const { clock, server, lease } = setup();
  await lease.start();
  lease._document.fire("freeze");
  await clock.advance(5000);
  server.fail("POST /lease/renew", { network: true, times: 1 }); // the resume renew fails
  lease._document.fire("resume");
  await flush();
  assert.equal(lease.role, "viewer");
  let ran = false;
  const res = await lease.guard(() => (ran = true))({});
  assert.equal(server.callsTo("POST", "/lease/check").length, 1, "checked first");
  assert.equal(ran, true, "the check confirmed the lease");
  assert.equal(res, true);
  assert.equal(lease.role, "owner");
  await lease.stop({ release: false });
});

test("after resume, a lease taken meanwhile is refused by the guard's check", async () => {
  const { clock, server, lease } = setup();
  await lease.start();
  lease._document.fire("freeze");
  await clock.advance(5000);
  server.takeoverBy("t-other"); // its event was missed while frozen
  server.fail("POST /lease/renew", { network: true, times: 1 });
  lease._document.fire("resume");
  await flush();
  let ran = false;
  const res = await lease.guard(() => (ran = true))({});
  assert.equal(ran, false);
  assert.equal(res.error.code, NOT_LEASE_OWNER);
  assert.equal(res.error.details.reason, "lost");
  assert.match(res.error.message, /^(Another tab controls|This tab no longer controls) this session/);
  await lease.stop({ release: false });
});

test("check: always asks the server before every call", async () => {
  const { server, lease } = setup();
  await lease.start();
  const strict = lease.guard(() => "ok", { check: "always" });
  assert.equal(await strict({}), "ok");
  assert.equal(await strict({}), "ok");
  assert.equal(server.callsTo("POST", "/lease/check").length, 2);
  await lease.stop({ release: false });
});

test("ownership ending while the handler runs aborts its signal and answers the call at once: it may have acted", async () => {
  const { server, lease } = setup();
  wire(server, lease);
  await lease.start();
  let signal;
  let release;
  const slow = lease.guard((args, l) => {
    signal = l.signal;
    return new Promise((r) => (release = r));
  });
  const p = slow({});
  await flush();
  assert.equal(signal.aborted, false);
  server.takeoverBy("t-other");
  assert.equal(signal.aborted, true);
  const res = await p; // the handler has not settled
  assert.equal(res.error.code, NOT_LEASE_OWNER);
  assert.equal(res.error.details.reason, "lost");
  assert.equal(res.error.details.mayHaveActed, true);
  assert.match(res.error.message, /may have acted/);
  release("late"); // dropped
  await flush();
  assert.equal(lease.inFlight, 0);
  await lease.stop({ release: false });
});

test("a handler that rejects as its signal aborts (its fetch aborted) answers NOT_LEASE_OWNER, not its rejection", async () => {
  const { server, lease } = setup();
  wire(server, lease);
  await lease.start();
  const save = lease.guard(
    (args, l) =>
      new Promise((resolve, reject) => {
        l.signal.addEventListener("abort", () => reject(l.signal.reason), { once: true });
      }),
  );
  const p = save({});
  await flush();
  server.takeoverBy("t-other");
  const res = await p;
  assert.equal(res.error.code, NOT_LEASE_OWNER);
  assert.equal(res.error.details.mayHaveActed, true);
  assert.equal(res.error.details.holder.tabId, "t-other");
  await lease.stop({ release: false });
});

test("a handler that throws still counts down the mutations in flight", async () => {
  const { lease } = setup();
  await lease.start();
  const boom = lease.guard(() => {
    throw new Error("boom");
  });
  await assert.rejects(boom({}), /boom/);
  assert.equal(lease.inFlight, 0);
  await lease.stop({ release: false });
});

/** Tabs A and B of one user with the fake server's events wired to them, started: A holds the
 *  lease. */
async function startedPair() {
  const { clock, server } = setup();
  const a = new TabLease(fakeOptions(server, clock, { label: "A" }));
  const b = new TabLease(fakeOptions(server, clock, { label: "B" }));
  wire(server, a, b);
  await a.start();
  await b.start();
  return { clock, server, a, b };
}

test("the holder asked for a handoff releases at its next safe point, not during a mutation", async () => {
  const { clock, server, a, b } = await startedPair();
  assert.equal(a.role, "owner");
  assert.equal(b.role, "viewer");
  const phases = [];
  a.on("handoff", (d) => phases.push("A:" + d.phase));
  b.on("handoff", (d) => phases.push("B:" + d.phase));

  let finish;
  const saving = a.guard(() => new Promise((r) => (finish = r)))({});
  await flush();
  assert.equal(a.inFlight, 1);

  const handoff = b.requestHandoff({ timeoutMs: 10000 });
  await flush();
  assert.equal(a.handoff, "releasing");
  assert.equal(server.valid() && server.holder.tabId, a.tabId, "not released while the mutation runs");
  const refused = await a.guard(() => "ran")({});
  assert.equal(refused.error.code, NOT_LEASE_OWNER);
  assert.equal(refused.error.details.reason, "handoff");

  finish("saved");
  assert.equal(await saving, "saved");
  await flush();
  assert.equal(a.role, "viewer");
  const result = await handoff;
  assert.equal(result.status, "granted");
  assert.equal(b.role, "owner");
  assert.equal(server.holder.tabId, b.tabId);
  assert.deepEqual(phases, ["B:requesting", "A:requested", "B:waiting", "A:released", "B:granted"]);

  // A does not grab the lease back by itself, even when B later lets it go by expiry: only
  // after someone else was granted does A's automatic acquire come back.
  await clock.advance(20000);
  assert.equal(a.role, "viewer");
  await a.stop({ release: false });
  await b.stop({ release: false });
});

test("a page closed while its handoff request waits says the tab is gone: the holder keeps its lease, and no reservation waits for the closed tab", async () => {
  const { clock, server, a, b } = await startedPair();
  let finish;
  const saving = a.guard(() => new Promise((r) => (finish = r)))({});
  await flush();
  b.requestHandoff({ timeoutMs: 10000 });
  await flush();
  assert.equal(a.handoff, "releasing");
  assert.equal(b.handoff, "requesting");

  b._window.fire("pagehide", { persisted: false });
  assert.deepEqual(server.callsTo("POST", "/lease/release").at(-1)?.body, { tabId: b.tabId, gone: true });
  await clock.advance(10500); // past handoffGraceMs: A's renew shows no request any more
  assert.equal(a.handoff, null);
  finish("saved");
  assert.equal(await saving, "saved");
  await flush();
  assert.equal(a.role, "owner", "the holder keeps its lease");
  assert.equal(server.holder.tabId, a.tabId);
  assert.equal(server.reserved, null);
  await a.stop({ release: false });
});

test("a requester without an event stream polls often enough not to sleep through the reservation", async () => {
  const { server, clock } = setup();
  const a = new TabLease(fakeOptions(server, clock, { handoff: "manual", label: "A" }));
  const b = new TabLease(fakeOptions(server, clock, { label: "B" })); // no stream: nothing wakes B
  wire(server, a);
  await a.start();
  await b.start();
  const handoff = b.requestHandoff({ timeoutMs: 14000 });
  await flush();
  await clock.advance(3000);
  const releasedAt = clock.now();
  await a.release(); // the fake keeps the released lease for B for 5 s
  let result = null;
  handoff.then((r) => (result = r));
  for (let i = 0; i < 40 && !result; i++) await clock.advance(100);
  assert.equal(result?.status, "granted", "B claimed the reservation");
  assert.ok(clock.now() - releasedAt <= 2100, `B polled ${clock.now() - releasedAt} ms after the release; the HANDOFF_PENDING retryAfterMs (the time until the request lapses) must not put it to sleep past the reservation`);
  await a.stop({ release: false });
  await b.stop({ release: false });
});

test("a holder in manual handoff mode is told and decides itself", async () => {
  const { server, clock } = setup();
  const a = new TabLease(fakeOptions(server, clock, { handoff: "manual" }));
  const b = new TabLease(fakeOptions(server, clock));
  wire(server, a, b);
  await a.start();
  await b.start();
  let asked = null;
  a.on("handoff", (d) => d.phase === "requested" && (asked = d.requester));
  const p = b.requestHandoff({ timeoutMs: 10000 });
  await flush();
  assert.deepEqual(asked, { tabId: b.tabId, label: "Tab" });
  assert.equal(a.role, "owner");
  await a.release();
  assert.equal((await p).status, "granted");
  // The release answered the request: once B is gone, A's automatic acquire comes back, as after
  // an automatic handoff.
  await b.stop();
  for (let i = 0; i < 100 && a.role !== "owner"; i++) await clock.advance(100);
  assert.equal(a.role, "owner", "A acquires again when the tab it handed over to lets go");
  // A release that answers no request stops the automatic acquire.
  const c = new TabLease(fakeOptions(server, clock));
  wire(server, c);
  await a.release();
  await c.start();
  await c.stop();
  await clock.advance(10000);
  assert.equal(a.role, "viewer", "A stays released after its own release");
  await a.stop({ release: false });
});

test("a handoff the holder never answers times out, and the requester may then take over", async () => {
  const { clock, server } = setup();
  const b = new TabLease(fakeOptions(server, clock));
  server.takeoverBy("t-stuck", "stuck tab"); // a tab that does not answer
  wire(server, b);
  await b.start();
  const p = b.requestHandoff({ timeoutMs: 5000 });
  await clock.advance(6000);
  assert.deepEqual(await p, { status: "timeout" });
  assert.equal(b.role, "viewer");
  await b.takeover();
  assert.equal(b.role, "owner");
  assert.equal(server.holder.tabId, b.tabId);

  const { clock: c2, server: s2 } = setup();
  const c = new TabLease(fakeOptions(s2, c2));
  s2.takeoverBy("t-stuck");
  await c.start();
  const q = c.requestHandoff({ timeoutMs: 3000, takeoverOnTimeout: true });
  await c2.advance(4000);
  assert.equal((await q).status, "taken_over");
  assert.equal(c.role, "owner");
  await b.stop({ release: false });
  await c.stop({ release: false });
});

for (const latencyMs of [0, 300]) test(`a wait longer than the server's handoff timeout ends when the request lapses, without asking again (latency ${latencyMs} ms)`, async () => {
  const { clock, server } = setup();
  const b = new TabLease(fakeOptions(server, clock));
  server.takeoverBy("t-stuck", "stuck tab"); // a tab that does not answer
  wire(server, b);
  await b.start();
  server.latencyMs = latencyMs;
  const start = clock.now();
  let result = null;
  b.requestHandoff({ timeoutMs: 25000 }).then((r) => (result = { ...r, at: clock.now() }));
  await clock.advance(26000);
  assert.equal(result?.status, "timeout");
  assert.ok(result.at - start <= server.handoffTimeoutMs + 2 * latencyMs + 100, `timed out ${result.at - start} ms after asking, at the request's lapse (${server.handoffTimeoutMs} ms, and a round trip)`);
  // One request filed: the asks after the server answered that it stands are "try", so none can
  // reach the server after the lapse and file another.
  const asks = server.callsTo("POST", "/lease").filter((c) => c.body.mode === "handoff");
  assert.equal(asks.length, 1, `requests filed at ${asks.map((c) => c.at - start)} ms`);
  await b.stop({ release: false });
});

test("other viewers wait while the lease is reserved for the requester", async () => {
  const { clock, server } = setup();
  const a = new TabLease(fakeOptions(server, clock, { label: "A" }));
  const b = new TabLease(fakeOptions(server, clock, { label: "B" }));
  const c = new TabLease(fakeOptions(server, clock, { label: "C" }));
  wire(server, a, b, c);
  await a.start();
  await b.start();
  await c.start();
  const p = b.requestHandoff();
  await clock.advance(2500); // B polls at most every 2 s
  assert.equal((await p).status, "granted");
  assert.equal(server.holder.tabId, b.tabId);
  assert.equal(c.role, "viewer");
  assert.equal(a.role, "viewer");
  for (const l of [a, b, c]) await l.stop({ release: false });
});

test("release() gives the lease up and the tab stays a viewer until asked again", async () => {
  const { clock, server, lease } = setup();
  wire(server, lease);
  await lease.start();
  const res = await lease.release();
  assert.deepEqual(res, { released: true });
  assert.equal(lease.role, "viewer");
  await clock.advance(60000);
  assert.equal(lease.role, "viewer", "no automatic acquire after an explicit release");
  await lease.acquire();
  assert.equal(lease.role, "owner");
  await lease.stop({ release: false });
});

test("after stop() a refusal names no holder when the stop released the lease, and this tab when it kept it", async () => {
  for (const release of [true, false]) {
    const { lease } = setup();
    await lease.start();
    assert.equal(lease.role, "owner");
    const guarded = lease.guard(async () => "ran");
    await lease.stop({ release });
    const r = await guarded({});
    assert.equal(r.error.code, "NOT_LEASE_OWNER");
    assert.equal(r.error.details.reason, "stopped");
    assert.deepEqual(r.error.details.holder, release ? null : { tabId: lease.tabId, label: "Tab" }, `stop({release: ${release}})`);
  }
});

test("a Use here refused by an admin's block leaves the tab taking the lease when the block ends", async () => {
  for (const call of ["takeover", "acquire"]) {
    // With the event stream up, the viewer reads the lease only when an event tells it to.
    const { clock, server, lease } = setup({ lease: { stream: "fetch" } });
    await lease.start();
    await clock.advance(100);
    assert.equal(lease.streamLive, true);
    assert.equal(lease.role, "owner");
    server.revoke({ blockMs: 10000 });
    await clock.advance(1000);
    assert.equal(lease.role, "viewer", "revoked");
    await assert.rejects(lease[call](), { code: "SESSION_BLOCKED" }, `${call}() during the block`);
    await clock.advance(10000);
    assert.equal(lease.role, "owner", `the tab takes the lease when the block ends, after a refused ${call}()`);
    assert.equal(server.holder?.tabId, lease.tabId);
    await lease.stop({ release: false });
  }
});

test("a handoff request refused by an admin's block fails, and the tab takes the free lease when the block ends", async () => {
  const { clock, server, lease } = setup({ lease: { stream: "fetch" } });
  await lease.start();
  await clock.advance(100);
  assert.equal(lease.streamLive, true);
  server.revoke({ blockMs: 10000 });
  await clock.advance(1000);
  assert.equal(lease.role, "viewer", "revoked");
  const r = await lease.requestHandoff();
  assert.equal(r.status, "failed");
  assert.equal(r.error.code, "SESSION_BLOCKED");
  await clock.advance(10000);
  assert.equal(lease.role, "owner", "the tab takes the lease when the block ends, after a refused handoff request");
  await lease.stop({ release: false });
});
