// The local deadline and the fail-closed role: `node --test web/sdk/`.
import assert from "node:assert/strict";
import { test } from "node:test";

import { TabLease } from "./tablease.js";
import { FakeClock, FakeServer, fakeOptions, flush } from "./fakes.mjs";

function setup({ server: so = {}, lease: lo = {} } = {}) {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock, so);
  const lease = new TabLease(fakeOptions(server, clock, lo));
  const roles = [];
  lease.on("rolechange", (d) => roles.push([d.role, d.reason, clock.now()]));
  return { clock, server, lease, roles };
}

test("the deadline is the send time plus remainingMs minus the margin", async () => {
  const { lease } = setup({ lease: { marginMs: 1500 } });
  await lease.start();
  assert.equal(lease.role, "owner");
  // sent at 1000, remainingMs 45000, margin 1500
  assert.equal(lease.timeLeftMs, 45000 - 1500);
  assert.equal(lease._deadline, 1000 + 45000 - 1500);
  await lease.stop({ release: false });
});

test("a slow answer does not move the deadline: it counts from when the request was sent", async () => {
  const { clock, lease, server } = setup({ server: { latencyMs: 5000 }, lease: { marginMs: 1000 } });
  const started = lease.start();
  await clock.advance(5000);
  await started;
  assert.equal(lease.role, "owner");
  assert.equal(lease._deadline, 1000 + 45000 - 1000);
  assert.equal(lease.timeLeftMs, 45000 - 1000 - 5000);
  server.latencyMs = 0;
  await lease.stop({ release: false });
});

test("the margin is capped at a quarter of the granted TTL, so short TTLs still give control", async () => {
  const { lease } = setup({ server: { ttlMs: 2000 }, lease: { marginMs: 1500 } });
  await lease.start();
  assert.equal(lease.role, "owner");
  assert.equal(lease._deadline, 1000 + 2000 - 500);
  await lease.stop({ release: false });
});

test("the tab turns viewer the moment the deadline passes without a confirmed renew", async () => {
  const { clock, server, lease, roles } = setup({ lease: { marginMs: 1000 } });
  server.fail("POST /lease/renew", { network: true, times: 1000 });
  await lease.start();
  assert.equal(lease.role, "owner");
  await clock.advance(44000 - 1); // deadline = 1000 + 45000 - 1000 = 45000
  assert.equal(clock.now(), 44999);
  assert.equal(lease.role, "owner");
  await clock.advance(1);
  assert.equal(lease.role, "viewer");
  assert.deepEqual(roles.at(-1), ["viewer", "expired", 45000]);
  await lease.stop({ release: false });
});

test("a renew that confirms after the deadline makes the tab owner again", async () => {
  const { clock, server, lease, roles } = setup({ lease: { marginMs: 1000 } });
  server.fail("POST /lease/renew", { status: 503, times: 1000 });
  await lease.start();
  await clock.advance(44000); // past the deadline; the server lease (expires 46000) still stands
  assert.equal(lease.role, "viewer");
  server.failures.length = 0;
  // the next scheduled retry confirms
  const next = clock.pending()[0];
  await clock.advance(next.at - clock.now());
  assert.equal(lease.role, "owner");
  assert.deepEqual(roles.map((r) => r.slice(0, 2)), [["owner", "confirmed"], ["viewer", "expired"], ["owner", "confirmed"]]);
  await lease.stop({ release: false });
});

test("a renew answered LEASE_LOST ends ownership at once and that epoch is never renewed again", async () => {
  const { clock, server, lease } = setup();
  await lease.start();
  const lost = lease.epoch;
  server.takeoverBy("t-other");
  await clock.advance(15000); // renewAfterMs
  assert.equal(lease.role, "viewer");
  assert.equal(lease.lease.holder.tabId, "t-other");
  const before = server.callsTo("POST", "/lease/renew").length;
  await clock.advance(20000); // the other tab still holds it (until 46000)
  assert.equal(server.callsTo("POST", "/lease/renew").length, before, "no renew after LEASE_LOST");
  await clock.advance(40000); // it expired: this tab acquires a new epoch and renews that one
  assert.equal(lease.role, "owner");
  assert.ok(lease.epoch > lost);
  assert.ok(server.callsTo("POST", "/lease/renew").slice(before).every((c) => c.body.epoch !== lost));
  await lease.stop({ release: false });
});

test("an event showing a newer epoch ends ownership before any renew; an older one is ignored", async () => {
  const { lease } = setup();
  await lease.start();
  const epoch = lease.epoch;
  lease._onStreamEvent({ type: "lease", id: "1-0", data: { type: "granted", epoch: epoch - 1, holder: { tabId: "t-old" }, previous: null } });
  assert.equal(lease.role, "owner", "a late event about an older grant changes nothing");
  lease._onStreamEvent({ type: "lease", id: "2-0", data: { type: "taken_over", epoch: epoch + 1, holder: { tabId: "t-other", label: "B" }, previous: { tabId: lease.tabId, epoch } } });
  assert.equal(lease.role, "viewer");
  assert.equal(lease.lease.holder.label, "B");
  await lease.stop({ release: false });
});

test("an expired or released event for the held epoch ends ownership", async () => {
  for (const type of ["expired", "released", "revoked"]) {
    const { lease } = setup({ lease: { autoAcquire: false } });
    await lease.start();
    await lease.acquire();
    const epoch = lease.epoch;
    const changes = [];
    lease.on("rolechange", (d) => changes.push(d));
    lease._onStreamEvent({ type: "lease", id: "1-0", data: { type, epoch: type === "revoked" ? epoch + 1 : epoch, holder: null, previous: { tabId: lease.tabId, epoch }, reason: type === "revoked" ? "stuck tab" : "" } });
    assert.equal(lease.role, "viewer", type);
    // The rolechange carries the event, so that a page tells an admin's revoke (and its reason)
    // from any other end.
    assert.equal(changes.length, 1, type);
    assert.equal(changes[0].reason, "event", type);
    assert.equal(changes[0].event?.type, type);
    if (type === "revoked") assert.equal(changes[0].event.reason, "stuck tab");
    await lease.stop({ release: false });
  }
});

test("while the stream is down the owner is read-only until a renew sent after the drop confirms", async () => {
  const { clock, server, lease, roles } = setup({ server: { latencyMs: 100 }, lease: { stream: "fetch" } });
  const p = lease.start();
  await clock.advance(100);
  await p;
  assert.equal(lease.role, "owner");
  assert.equal(lease.streamLive, true);
  await clock.advance(1000);
  server.dropStreams();
  await flush();
  assert.equal(lease.streamLive, false);
  assert.equal(lease.role, "viewer", "read-only the moment the stream drops");
  assert.equal(roles.at(-1)[1], "stream_down");
  assert.equal(server.callsTo("POST", "/lease/renew").length, 1, "renews at once");
  await clock.advance(100);
  assert.equal(lease.role, "owner");
  await lease.stop({ release: false });
});

test("when the stream is back after an outage, the owner renews at once instead of waiting out its backoff", async () => {
  const { clock, server, lease } = setup({ server: { latencyMs: 50 }, lease: { stream: "fetch" } });
  const p = lease.start();
  await clock.advance(50);
  await p;
  assert.equal(lease.role, "owner");
  server.down = true;
  server.dropStreams();
  await clock.advance(7000); // renews and stream reconnects fail, each backing off on its own
  assert.equal(lease.role, "viewer");
  server.down = false;
  for (let t = 0; !lease.streamLive && t < 30000; t += 10) await clock.advance(10);
  assert.equal(lease.streamLive, true, "the stream reconnects");
  const back = clock.now();
  await clock.advance(120); // one renew: sent at once, answered 50 ms later
  assert.equal(lease.role, "owner", "owner again a round trip after the stream is back");
  const renews = server.callsTo("POST", "/lease/renew").filter((c) => c.at >= back);
  assert.equal(renews.length, 1, "one renew, when the stream came back");
  assert.ok(renews[0].at - back <= 10, `renewed ${renews[0].at - back} ms after the stream came back`);
  await lease.stop({ release: false });
});

test("when a renew reaches the server again after an outage, the stream reconnects at once instead of waiting out its backoff", async () => {
  const { clock, server, lease } = setup({ server: { latencyMs: 50 }, lease: { stream: "fetch" } });
  const p = lease.start();
  await clock.advance(50);
  await p;
  server.down = true;
  server.dropStreams();
  await clock.advance(3700); // renews and stream reconnects fail: the renew's next try comes first
  server.down = false;
  const up = clock.now();
  for (let t = 0; !(lease.streamLive && lease.role === "owner") && t < 30000; t += 10) await clock.advance(10);
  assert.equal(lease.role, "owner");
  assert.equal(lease.streamLive, true);
  const [renew] = server.callsTo("POST", "/lease/renew").filter((c) => c.at >= up);
  const [open] = server.callsTo("GET", "/events").filter((c) => c.at >= up);
  assert.ok(renew.at < open.at, `the renew (${renew.at - up} ms after the server was back) came first`);
  // The stream connects as the renew's answer comes in (50 ms), not when its backoff ends.
  assert.ok(open.at - renew.at <= 60, `reconnected ${open.at - renew.at} ms after the renew was sent`);
  await lease.stop({ release: false });
});

test("after resume the tab is read-only until a renew confirms", async () => {
  const { clock, server, lease } = setup({ server: { latencyMs: 50 } });
  const p = lease.start();
  await clock.advance(50);
  await p;
  lease._document.fire("freeze");
  await clock.advance(10000);
  lease._document.fire("resume");
  assert.equal(lease.role, "viewer");
  await flush();
  assert.equal(server.callsTo("POST", "/lease/renew").length, 1);
  await clock.advance(50);
  assert.equal(lease.role, "owner");
  await lease.stop({ release: false });
});

test("a renew whose wait a freeze cut off is no error event: the renew at resume asks again", async () => {
  const { clock, server, lease } = setup();
  const errors = [];
  lease.on("error", ({ error }) => errors.push(error.code));
  await lease.start();
  server.fail("POST /lease/renew", { hang: true }); // the renew due at 15 s, sent as the page hides
  await clock.advance(15000);
  lease._document.fire("freeze");
  await clock.advance(12000); // frozen: the renew's deadline passes meanwhile
  lease._document.fire("resume");
  await clock.advance(100);
  assert.deepEqual(errors, [], "no NETWORK error for the renew the freeze cut off");
  assert.equal(lease.role, "owner", "the renew at resume confirmed");
  // Without a freeze, a renew that gets no answer is an error event, as before.
  server.fail("POST /lease/renew", { hang: true });
  await clock.advance(30000);
  assert.deepEqual(errors, ["NETWORK"]);
  await lease.stop({ release: false });
});

test("a tab that finds the lease held is a viewer that knows the holder and the time left", async () => {
  const { clock, server, lease } = setup();
  server.takeoverBy("t-other", "Events — /events");
  await clock.advance(5000);
  await lease.start();
  assert.equal(lease.role, "viewer");
  assert.deepEqual(lease.lease.holder, { tabId: "t-other", label: "Events — /events", hidden: false });
  assert.equal(lease.lease.remainingMs, 40000);
  await lease.stop({ release: false });
});

test("a viewer takes the lease when the holder's lease ends, and not before", async () => {
  const { clock, server, lease } = setup();
  server.takeoverBy("t-other");
  await lease.start();
  assert.equal(lease.role, "viewer");
  await clock.advance(30000);
  assert.equal(lease.role, "viewer");
  await clock.advance(16000); // the other tab never renewed: expired at 46000
  assert.equal(lease.role, "owner");
  await lease.stop({ release: false });
});

test("start, stop and restart never leave a stale owner", async () => {
  const { server, lease } = setup();
  await lease.start();
  assert.equal(lease.role, "owner");
  await lease.stop();
  assert.equal(lease.role, "viewer");
  assert.equal(server.valid(), false, "stop released the lease");
  await lease.start();
  assert.equal(lease.role, "owner");
  await lease.stop();
});

test("a viewer learns the new holder's time left soon after an event names it, and backs off on errors", async () => {
  const { clock, server, lease } = setup({ lease: { autoAcquire: false, stream: "fetch" } });
  await lease.start();
  await clock.advance(1000);
  server.takeoverBy("t-other", "B");
  await clock.advance(0);
  assert.equal(lease.lease.holder.tabId, "t-other");
  assert.equal(lease.lease.remainingMs, null, "events carry no time left");
  await clock.advance(250);
  assert.equal(lease.lease.remainingMs, 45000 - 250);
  server.takeoverBy("t-third", "C");
  server.down = true;
  const before = server.callsTo("GET", "/lease").length;
  await clock.advance(5000);
  const during = server.callsTo("GET", "/lease").length - before;
  assert.ok(during >= 3 && during <= 8, `a few backed-off re-reads in 5 s, not one every 250 ms (${during})`);
  server.down = false;
  await lease.stop({ release: false });
});

test("a takeover answered 503 that took effect after all makes the tab owner at that epoch", async () => {
  const { clock, server, lease } = setup();
  server.takeoverBy("t-a", "A");
  await lease.start();
  assert.equal(lease.role, "viewer");
  server.fail("POST /lease");
  await assert.rejects(lease.takeover(), { code: "STORE_UNAVAILABLE" });
  // The store applied it after the answer was lost: the server lists this tab at a new epoch.
  server.takeoverBy(lease.tabId, "B");
  const epoch = server.epoch;
  await flush();
  await clock.advance(10_000);
  assert.equal(lease.role, "owner", "the tab the server lists as holder is its owner, not a viewer showing Use here");
  assert.equal(lease.epoch, epoch, "the epoch the server granted, given back by the holder's acquire");
  assert.equal(server.epoch, epoch);
  await lease.stop({ release: false });
});

test("a takeover that took effect after the page released is given back", async () => {
  const { clock, server, lease } = setup();
  server.takeoverBy("t-a", "A");
  await lease.start();
  server.fail("POST /lease");
  await assert.rejects(lease.takeover(), { code: "STORE_UNAVAILABLE" });
  await lease.release(); // the page gave up: this tab takes no lease by itself now
  server.takeoverBy(lease.tabId, "B");
  await flush();
  await clock.advance(10_000);
  assert.equal(lease.role, "viewer");
  assert.equal(server.valid(), false, "the lease listed for a tab that does not want it is released, not left to expire");
  await lease.stop({ release: false });
});
