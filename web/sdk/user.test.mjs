// A tab whose getToken starts giving another user's token (the user signed out and in as someone
// else in another tab): it stops acting for the previous user at once and starts over as the new
// one: `node --test web/sdk/`.
import assert from "node:assert/strict";
import { test } from "node:test";

import { TabLease, tokenSubject } from "./tablease.js";
import { SessionApi } from "./http.js";
import { FakeClock, FakeLocks, FakeServer, fakeJWT, fakeOptions, settle } from "./fakes.mjs";

/** A tablease server per user, as the real one keeps each user's sessions apart: a request goes
 *  to the server of its token's `sub`. */
function perUser(clock, users) {
  const servers = Object.fromEntries(users.map((u) => [u, new FakeServer(clock)]));
  const fetch = (url, init = {}) => servers[tokenSubject(String(init.headers?.Authorization ?? "").replace(/^Bearer /, ""))].fetch(url, init);
  return { servers, fetch };
}

test("a tab whose user changes leaves the previous user's lease and stream, and works for the new user", async () => {
  const clock = new FakeClock(1000);
  const { servers, fetch } = perUser(clock, ["alice", "mallory"]);
  servers.mallory.epoch = 10; // epochs of another session: lower than any of alice's
  const locks = new FakeLocks();
  const userOf = { a: "alice", b: "alice" };
  const tab = (name) =>
    new TabLease({
      ...fakeOptions(servers.alice, clock),
      fetch,
      stream: "fetch",
      shareStream: true,
      locks,
      BroadcastChannel,
      hubs: new Map(),
      presence: true,
      label: name,
      getToken: async () => fakeJWT(userOf[name]),
    });
  const a = tab("a");
  const b = tab("b");
  try {
    await switchUser(clock, servers, userOf, a, b);
  } finally {
    for (const t of [a, b]) await t.stop({ release: false });
    await settle(clock);
  }
});

/** Tabs a and b of one browser start as alice, a taking the lease; then a's getToken gives
 *  mallory's tokens. */
async function switchUser(clock, servers, userOf, a, b) {
  const errors = [];
  a.on("error", ({ error }) => errors.push({ error, at: clock.now() }));
  await a.start();
  await settle(clock);
  await b.start();
  await settle(clock);
  assert.deepEqual([a.role, b.role], ["owner", "viewer"]);
  const aliceEpoch = a.epoch;

  // Every tab that reads owner holds its lease at the server of its user, and is in the stream
  // group of that user, if in any: no tab acts on another user's news.
  const group = (t) => t._stream?.hub.key.split("|")[1] ?? null;
  const check = (when) => {
    for (const t of [a, b].filter((x) => x.role === "owner")) {
      const user = Object.keys(servers).find((u) => servers[u].valid() && servers[u].holder.tabId === t.tabId && servers[u].epoch === t.epoch);
      assert.ok(user, `${when}: an owner tab holds a lease`);
      assert.ok(group(t) === null || group(t) === user, `${when}: an owner of ${user}'s session is in ${group(t)}'s stream group`);
    }
  };

  userOf.a = "mallory";
  let bOwnerAt = null;
  for (let t = 0; t < 20000; t += 250) {
    await settle(clock, 250);
    check(`at ${t} ms`);
    if (bOwnerAt === null && b.role === "owner") bOwnerAt = clock.now();
  }
  assert.equal(errors.length, 1, "one error event");
  const [{ error, at: changedAt }] = errors;
  assert.equal(error.code, "USER_CHANGED");
  assert.deepEqual(error.details, { user: "mallory", previousUser: "alice" });
  assert.ok(bOwnerAt !== null && bOwnerAt - changedAt <= 1000, "a released alice's lease: b took it at once, not at its expiry");
  assert.equal(servers.alice.holder.tabId, b.tabId);
  assert.deepEqual([a.role, servers.mallory.holder?.tabId], ["owner", a.tabId], "a acquired mallory's lease");
  assert.ok(a.epoch < aliceEpoch, "what a knew of alice's epochs was forgotten");
  assert.ok(servers.mallory.callsTo("POST", "/lease/renew").every((c) => c.body.epoch !== aliceEpoch), "alice's lease was never renewed as mallory");
  // a left alice's stream group and joined mallory's; b carries alice's.
  assert.deepEqual([...a._streamEnv.hubs.keys()].map((k) => k.split("|")[1]), ["mallory"]);
  assert.deepEqual([...servers.alice.streams].map((s) => s.tabId), [b.tabId]);
  assert.deepEqual([...servers.mallory.streams].map((s) => s.tabId), [a.tabId]);
  assert.deepEqual([a.streamLive, b.streamLive], [true, true]);
  assert.deepEqual([...servers.alice.tabs.keys()], [b.tabId], "a left alice's list of tabs");
  assert.deepEqual([...servers.mallory.tabs.keys()], [a.tabId]);

  // News of mallory's session reaches a at once, over mallory's stream.
  servers.mallory.takeoverBy("t-elsewhere", "another browser");
  await settle(clock);
  assert.equal(a.role, "viewer");
  assert.equal(a.lease.holder?.label, "another browser");
}

test("a user change ends ownership at once: running handlers are aborted, the call that saw it rejects", async () => {
  const clock = new FakeClock(1000);
  const { servers, fetch } = perUser(clock, ["alice", "mallory"]);
  let user = "alice";
  const lease = new TabLease({ ...fakeOptions(servers.alice, clock), fetch, getToken: async () => fakeJWT(user) });
  const states = [];
  lease.on("state", ({ state, reason }) => states.push([state, reason]));
  await lease.start();
  assert.equal(lease.role, "owner");
  let signal = null;
  let finish;
  const run = lease.guard(async (args, l) => {
    signal = l.signal;
    await new Promise((resolve) => (finish = resolve));
    return { done: true };
  })({});
  await settle(clock);
  user = "mallory";
  await assert.rejects(lease.refresh(), (e) => e.code === "USER_CHANGED" && e.retryable === true);
  assert.equal(signal.aborted, true, "the handler's period of ownership ended");
  assert.equal(signal.reason.code, "NOT_LEASE_OWNER");
  assert.ok(servers.alice.callsTo("GET", "/lease").length === 0, "the read that saw the change was not sent");
  assert.equal(servers.alice.valid(), false, "alice's lease was released");
  finish();
  await run;
  await settle(clock);
  assert.deepEqual(states.slice(1, 3), [["owner", "confirmed"], ["viewer", "user_changed"]]);
  assert.deepEqual([lease.role, servers.mallory.holder?.tabId], ["owner", lease.tabId], "and took mallory's free lease");
  await lease.stop({ release: false });
});

test("a request made as the previous user is not sent, even with a token of that user that answers late", async () => {
  const clock = new FakeClock(1000);
  const sent = [];
  const answers = [];
  const changes = [];
  const api = new SessionApi({
    baseUrl: "http://t",
    sessionId: "s",
    clock,
    fetch: async (url, init) => {
      sent.push(init.headers.Authorization);
      return new Response("{}", { status: 200 });
    },
    getToken: () => new Promise((resolve) => answers.push(resolve)),
    onUserChange: (e, previousToken) => changes.push([e.details, previousToken]),
  });
  const first = api.request("GET", "/lease");
  answers.shift()(fakeJWT("alice"));
  await first;
  const slow = api.request("GET", "/lease"); // made as alice; its getToken answers last
  const fast = api.request("GET", "/lease");
  await settle(clock);
  answers[1](fakeJWT("mallory"));
  await assert.rejects(fast, (e) => e.code === "USER_CHANGED");
  answers[0](fakeJWT("alice"));
  await assert.rejects(slow, (e) => e.code === "USER_CHANGED");
  assert.deepEqual(changes, [[{ user: "mallory", previousUser: "alice" }, fakeJWT("alice")]], "told once, with the previous user's token");
  assert.deepEqual(sent, [`Bearer ${fakeJWT("alice")}`], "neither was sent");
  const next = api.request("GET", "/lease");
  answers[2](fakeJWT("mallory"));
  await next;
  assert.equal(sent.at(-1), `Bearer ${fakeJWT("mallory")}`, "the next request goes as the new user");
});
