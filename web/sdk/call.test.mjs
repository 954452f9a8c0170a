// One tool call: the signal that combines every reason a call ends, the deadline, interactions
// with the user (and a handoff that waits for them), stale mutations and oversized results:
// `node --test web/sdk/`.
import assert from "node:assert/strict";
import { test } from "node:test";

import { TabLease, syncToolRegistry } from "./tablease.js";
import { anySignal, bindRouteParams, checkResult, validateInput } from "./call.js";
import { FakeBrowserWindow, FakeClock, FakeServer, fakeOptions, flush } from "./fakes.mjs";

const TOOLS = [
  { name: "ask_user", description: "Ask the user.", inputSchema: { type: "object", properties: { question: { type: "string", minLength: 1 } }, required: ["question"] }, annotations: { readOnlyHint: false, destructiveHint: false }, timeoutMs: 10000 },
  { name: "peek", description: "Read something.", annotations: { readOnlyHint: true } },
  { name: "edit", description: "Change this event.", routes: ["/events/:event_id"] },
  { name: "export", description: "A large export.", annotations: { readOnlyHint: true } },
  { name: "confirm", description: "Ask the user to confirm.", annotations: { destructiveHint: false }, timeoutMs: 120000 },
];

async function setup({ path = "/events/evt-1", options = {}, handlers = {}, lease: leaseOpts = {} } = {}) {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock, { tools: TOOLS });
  const window = new FakeBrowserWindow(path);
  const lease = new TabLease(fakeOptions(server, clock, { window, ...leaseOpts }));
  await lease.start();
  let defs = [];
  const reg = syncToolRegistry(lease, { sync: (d) => (defs = d) }, { handlers, ...options });
  await reg.sync();
  const tool = (name) => defs.find((d) => d.name === name);
  return { clock, server, window, lease, reg, tool };
}

/** gate() is a promise that release() resolves: the latest gate, for a handler to wait on. */
function gates() {
  let open = () => {};
  return {
    gate: () => new Promise((r) => (open = r)),
    release: (v) => open(v),
  };
}

/** A handler that opens an interaction and records what the page did with it. */
function asking(seen) {
  return (args, ctx) =>
    ctx.interact((ui) => {
      seen.ui = ui;
      seen.opened = (seen.opened ?? 0) + 1;
      return () => (seen.closed = (seen.closed ?? 0) + 1);
    });
}

test("anySignal aborts with the reason of the first source, and the route parameters bind as seed 003 says", () => {
  const a = new AbortController();
  const b = new AbortController();
  const s = anySignal([a.signal, b.signal]);
  b.abort("b first");
  a.abort("a later");
  assert.equal(s.reason, "b first");
  assert.equal(anySignal([AbortSignal.abort("done")]).aborted, true);
  assert.deepEqual(bindRouteParams({}, { id: "e1" }, { properties: { id: {} } }), { args: { id: "e1" } });
  assert.deepEqual(bindRouteParams({ id: "e1" }, { id: "e1" }, {}), { args: {} });
  assert.equal(bindRouteParams({ id: "e2" }, { id: "e1" }, {}).answer.error.code, "ENTITY_MISMATCH");
  assert.deepEqual(validateInput({ type: "object", properties: { n: { type: "integer", minimum: 1 } } }, { n: 0 }), { path: "n", reason: "must be at least 1" });
  assert.deepEqual(validateInput({ type: "object", properties: { tags: { type: "array", items: { enum: ["a", "b"] } } } }, { tags: ["a", "c"] }), { path: "tags[1]", reason: 'must be one of "a", "b"' });
  assert.equal(validateInput({ type: "object", properties: { n: { type: "number" } } }, { n: 2 }), null, "an integer is a number");
  assert.deepEqual(validateInput({ properties: { n: { exclusiveMinimum: 0 } } }, { n: 0 }), { path: "n", reason: "must be more than 0" });
  assert.deepEqual(validateInput({ properties: { n: { exclusiveMaximum: 1 } } }, { n: 1 }), { path: "n", reason: "must be less than 1" });
  assert.equal(validateInput({ properties: { n: { exclusiveMinimum: 0, exclusiveMaximum: 1 } } }, { n: 0.5 }), null);
  // A pattern is read as Unicode, or else as ECMAScript reads it without u; one that neither
  // reads fails every value rather than none.
  assert.deepEqual(validateInput({ properties: { c: { pattern: "^[a-z\\_]+$" } } }, { c: "DROP TABLE;" }), { path: "c", reason: "must match ^[a-z\\_]+$" });
  assert.equal(validateInput({ properties: { c: { pattern: "^[a-z\\_]+$" } } }, { c: "a_b" }), null);
  assert.equal(validateInput({ properties: { c: { pattern: "([" } } }, { c: "x" }).reason, "cannot be checked: the tool's pattern ([ is not a regular expression");
});

test("an interaction resolves what the user submits, or {cancelled, reason: user_cancelled}, and closes its UI", async () => {
  const seen = {};
  const { lease, reg, tool } = await setup({ handlers: { ask_user: asking(seen) } });
  const p = tool("ask_user").execute({ question: "Which seat?" }, {});
  await flush();
  assert.equal(seen.opened, 1);
  seen.ui.submit({ answer: "12A" });
  assert.deepEqual(await p, { answer: "12A" });
  const q = tool("ask_user").execute({ question: "Which seat?" }, {});
  await flush();
  seen.ui.cancel();
  assert.deepEqual(await q, { cancelled: true, reason: "user_cancelled" });
  assert.equal(seen.closed, 2);
  assert.equal((await tool("ask_user").execute({ question: "" }, {})).error.code, "INVALID_ARGUMENT", "validated before the handler runs");
  for (const input of [[1], "text", 5]) {
    const { error } = await tool("ask_user").execute(input, {});
    assert.deepEqual([error.code, error.details], ["INVALID_ARGUMENT", { path: "(input)", reason: "must be a JSON object" }], `input ${JSON.stringify(input)}`);
  }
  assert.equal(seen.opened, 2);
  reg.close();
  await lease.stop({ release: false });
});

test("every way a call ends resolves it with its code: agent cancel, deadline, route change, ownership loss, pagehide", async () => {
  const seen = {};
  const never = () => new Promise(() => {});
  const { clock, server, window, lease, reg, tool } = await setup({ handlers: { ask_user: asking(seen), peek: never, edit: never } });

  // The agent's per-call signal (WebMCP's execute(input, {signal})).
  const agent = new AbortController();
  const cancelled = tool("peek").execute({}, { signal: agent.signal });
  agent.abort();
  assert.equal((await cancelled).error.code, "CANCELLED");

  // The tool's timeoutMs (10 s) minus the margin (1 s): the modal is closed and the call settled.
  const timed = tool("ask_user").execute({ question: "Still there?" }, {});
  await flush();
  await clock.advance(8999);
  assert.equal(seen.closed ?? 0, 0, "still open a moment before the deadline");
  await clock.advance(1);
  const t = await timed;
  assert.equal(t.error.code, "TIMEOUT");
  assert.equal(t.error.details.timeoutMs, 10000);
  assert.equal(seen.closed, 1);
  // A handler that never settles is settled for it at the default deadline (60 s − 1 s).
  const stuck = tool("peek").execute({}, {});
  await clock.advance(59000);
  assert.equal((await stuck).error.code, "TIMEOUT");

  // The route leaves a route-bound instance: its running call ends with UI_CONTEXT_CLOSED.
  const editing = tool("edit").execute({}, {});
  const oldEdit = tool("edit");
  await flush();
  window.history.pushState(null, "", "/events/evt-2");
  const closed = await editing;
  assert.equal(closed.error.code, "UI_CONTEXT_CLOSED");
  assert.equal(closed.error.details.currentRoute, "/events/evt-2");
  assert.equal((await oldEdit.execute({}, {})).error.code, "ROUTE_CHANGED");
  await reg.sync();

  // An interaction's UI belongs to the page: a route change closes it, whatever the tool.
  const pending = tool("ask_user").execute({ question: "Which seat?" }, {});
  await flush();
  window.history.pushState(null, "", "/events");
  const gone = await pending;
  assert.equal(gone.error.code, "UI_CONTEXT_CLOSED");
  assert.deepEqual(gone.error.details, { reason: "route", route: "/events/evt-2", currentRoute: "/events" }, "the page it was asked on, and the page now");
  window.history.pushState(null, "", "/events/evt-2");
  await reg.sync();

  // Ownership lost (taken over in another tab): the interaction ends with NOT_LEASE_OWNER.
  const asked = tool("ask_user").execute({ question: "Sure?" }, {});
  await flush();
  server.takeoverBy("t-other");
  lease._onStreamEvent({ type: "lease", id: "9-0", data: { type: "taken_over", epoch: server.epoch, holder: { ...server.holder }, previous: null } });
  const lost = await asked;
  assert.equal(lost.error.code, "NOT_LEASE_OWNER");
  assert.equal(lost.error.details.reason, "lost");
  assert.equal(seen.closed, 3);

  // pagehide (the page closes or goes into the back/forward cache).
  const peeking = tool("peek").execute({}, {});
  window.fire("pagehide", { persisted: true });
  const hidden = await peeking;
  assert.equal(hidden.error.code, "UI_CONTEXT_CLOSED");
  assert.equal(hidden.error.details.reason, "page_hidden");
  reg.close();
  await lease.stop({ release: false });
});

test("a mutation cut off by pagehide does not say that another tab controls the session", async () => {
  const never = () => new Promise(() => {});
  const { window, lease, reg, tool } = await setup({ handlers: { edit: never } });
  assert.equal(lease.role, "owner");
  const editing = tool("edit").execute({}, {});
  await flush();
  window.fire("pagehide", { persisted: true });
  const { error } = await editing;
  if (error.code === "NOT_LEASE_OWNER") {
    assert.equal(error.details.holder, null, "this tab released the lease itself: no other tab holds it");
    assert.doesNotMatch(error.message, /Another tab/);
  } else {
    assert.equal(error.code, "UI_CONTEXT_CLOSED");
  }
  reg.close();
  await lease.stop({ release: false });
});

test("with interactions: \"one\" a second interaction answers INTERACTION_ALREADY_OPEN", async () => {
  const seen = {};
  const { lease, reg, tool } = await setup({ handlers: { ask_user: asking(seen) }, options: { interactions: "one" } });
  const first = tool("ask_user").execute({ question: "One?" }, {});
  await flush();
  const second = await tool("ask_user").execute({ question: "Two?" }, {});
  assert.equal(second.error.code, "INTERACTION_ALREADY_OPEN");
  assert.equal(seen.opened, 1);
  seen.ui.submit({ ok: true });
  assert.deepEqual(await first, { ok: true });
  const third = tool("ask_user").execute({ question: "Three?" }, {});
  await flush();
  assert.equal(seen.opened, 2, "free again once the first settled");
  seen.ui.cancel();
  await third;
  reg.close();
  await lease.stop({ release: false });
});

test("with interactions: \"one\" the page's sessions share the one interaction: a second session's answers INTERACTION_ALREADY_OPEN", async () => {
  const seen = {};
  const { clock, window, lease, reg, tool } = await setup({ handlers: { ask_user: asking(seen) }, options: { interactions: "one" } });
  // The same page works on a second session, with a registry of its own.
  const other = new FakeServer(clock, { sessionId: "s2", tools: TOOLS });
  const lease2 = new TabLease(fakeOptions(other, clock, { window, document: lease._document }));
  await lease2.start();
  let defs2 = [];
  const seen2 = {};
  const reg2 = syncToolRegistry(lease2, { sync: (d) => (defs2 = d) }, { handlers: { ask_user: asking(seen2) }, interactions: "one" });
  await reg2.sync();
  const first = tool("ask_user").execute({ question: "One?" }, {});
  await flush();
  const asked = defs2.find((d) => d.name === "ask_user").execute({ question: "Two?" }, {});
  await flush();
  assert.equal(seen2.opened, undefined, "one modal at a time in the page (seed 002)");
  assert.equal((await asked).error?.code, "INTERACTION_ALREADY_OPEN");
  seen.ui.submit({ ok: true });
  assert.deepEqual(await first, { ok: true });
  for (const r of [reg, reg2]) r.close();
  for (const l of [lease, lease2]) await l.stop({ release: false });
});

test("a mutation that finishes after its generation ended answers DOCUMENT_CHANGED, saying it may have acted; a tool without routes does not see route changes", async () => {
  const { gate, release } = gates();
  const ctxs = [];
  const handlers = {
    ask_user: async (args, ctx) => {
      ctxs.push(ctx);
      await gate();
      return { applied: ctx.isCurrent() };
    },
  };
  const { window, lease, reg, tool } = await setup({ handlers });
  // ask_user has no routes: the page it runs on does not matter to it, so a route change
  // neither makes it stale nor withholds what it did.
  const p = tool("ask_user").execute({ question: "q" }, {});
  await flush();
  assert.equal(ctxs[0].isCurrent(), true);
  window.history.pushState(null, "", "/events/evt-3");
  assert.equal(ctxs[0].isCurrent(), true, "a route change is not a change for a tool without routes");
  release();
  assert.deepEqual(await p, { applied: true });
  await reg.sync();
  // The document it works on is replaced: stale() before acting says so; a result after it is
  // withheld, saying that the tool may have acted (so the agent looks before calling again).
  const q = tool("ask_user").execute({ question: "q" }, {});
  await flush();
  const doc = reg.documentChanged();
  assert.equal(ctxs[1].isCurrent(), false);
  const before = ctxs[1].stale();
  assert.equal(before.error.code, "DOCUMENT_CHANGED");
  assert.equal(before.error.details.mayHaveActed, undefined);
  release();
  const after = (await q).error;
  assert.equal(after.code, "DOCUMENT_CHANGED");
  assert.equal(after.details.mayHaveActed, true);
  assert.match(after.message, /may have acted/);
  await doc;
  // Asked after its handler settled, and after later changes let the earlier ones go, stale()
  // still names the change that ended the call.
  for (const path of ["/events/evt-4", "/events/evt-5"]) window.history.pushState(null, "", path);
  await reg.documentChanged();
  assert.equal(ctxs[1].isCurrent(), false);
  assert.equal(ctxs[1].stale().error.code, "DOCUMENT_CHANGED");
  reg.close();
  await lease.stop({ release: false });
});

test("a handler that never settles keeps no change once its call is answered: a page's life of navigations costs no memory", async () => {
  const { clock, window, lease, reg, tool } = await setup({ handlers: { peek: () => new Promise(() => {}) } });
  const p = tool("peek").execute({}, {});
  await clock.advance(60_000);
  assert.equal((await p).error.code, "TIMEOUT");
  for (let i = 0; i < 200; i++) {
    window.history.pushState(null, "", `/events/evt-${i}`);
    reg.documentChanged();
  }
  await flush();
  assert.ok(reg._scope._changes.length <= 1, `${reg._scope._changes.length} changes kept for a call answered long ago`);
  reg.close();
  await lease.stop({ release: false });
});

test("a route segment bound as a number is the number it writes, or stays a string: no other entity's id passes", () => {
  const props = { properties: { id: { type: "integer" } } };
  assert.deepEqual(bindRouteParams({}, { id: "9007199254740991" }, props), { args: { id: 9007199254740991 } });
  for (const segment of ["9007199254740993", "12345678901234567890"]) {
    assert.deepEqual(bindRouteParams({}, { id: segment }, props), { args: { id: segment } }, `${segment} stays a string, which the integer input refuses`);
    const neighbour = Number(segment); // what the digits read as: another entity
    assert.equal(bindRouteParams({ id: neighbour }, { id: segment }, props).answer.error.code, "ENTITY_MISMATCH", segment);
  }
  assert.deepEqual(bindRouteParams({}, { id: "-1.5" }, { properties: { id: { type: "number" } } }), { args: { id: -1.5 } });
  assert.deepEqual(bindRouteParams({}, { id: "0.1234567890123456" }, { properties: { id: { type: "number" } } }), { args: { id: "0.1234567890123456" } });
});

test("a read-only call does not see ownership changes: it stays current and gives its result", async () => {
  const { gate, release } = gates();
  const ctxs = [];
  const handlers = {
    peek: async (args, ctx) => {
      ctxs.push(ctx);
      await gate();
      return ctx.isCurrent() ? { seen: "peeked" } : ctx.stale();
    },
  };
  const { server, lease, reg, tool } = await setup({ handlers });
  assert.equal(lease.role, "owner");
  const p = tool("peek").execute({}, {});
  await flush();
  server.takeoverBy("t-other", "Other tab");
  await lease.refresh();
  assert.equal(lease.role, "viewer");
  assert.equal(ctxs[0].isCurrent(), true);
  release();
  assert.deepEqual(await p, { seen: "peeked" });
  reg.close();
  await lease.stop({ release: false });
});

test("a result over the cap answers RESULT_TOO_LARGE and says to return an id or a URL", async () => {
  const { lease, reg, tool } = await setup({ handlers: { export: () => ({ data: "x".repeat(300 * 1024) }), peek: () => ({ data: "x".repeat(1000) }) }, options: { maxResultBytes: 256 * 1024 } });
  const big = await tool("export").execute({}, {});
  assert.equal(big.error.code, "RESULT_TOO_LARGE");
  assert.match(big.error.message, /an id or a URL/);
  assert.equal(big.error.details.maxBytes, 262144);
  assert.equal((await tool("peek").execute({}, {})).data.length, 1000);
  reg.close();
  await lease.stop({ release: false });
});

test("a result is answered as JSON gives it: a value that is not an object wrapped, what JSON leaves out left out", async () => {
  assert.deepEqual(checkResult("ok", 1000), { result: "ok" });
  assert.deepEqual(checkResult([1, 2], 1000), { result: [1, 2] });
  assert.deepEqual(checkResult(null, 1000), {});
  assert.deepEqual(checkResult(undefined, 1000), {});
  const got = checkResult({ d: new Date(0), m: new Map([["a", 1]]), f: () => 1, n: 1 }, 1000);
  assert.deepEqual(got, { d: "1970-01-01T00:00:00.000Z", m: {}, n: 1 });
  assert.deepEqual(checkResult({ toJSON: () => "text" }, 1000), { result: "text" });
  assert.equal(checkResult({ toJSON: () => undefined }, 1000).error.code, "INVALID_RESULT");
  assert.equal(checkResult({ big: 1n }, 1000).error.code, "INVALID_RESULT");
});

test("a handoff waits for an open interaction: released at its end, the requester granted", async () => {
  const seen = {};
  const { clock, server, lease, reg, tool } = await setup({ handlers: { confirm: asking(seen) }, lease: { handoffGraceMs: 5000 } });
  const asked = tool("confirm").execute({}, {});
  await flush();
  server.handoff = { requester: "t-b", at: clock.now() };
  lease._onStreamEvent({ type: "lease", id: "2-0", data: { type: "handoff_requested", epoch: lease.epoch, holder: { tabId: lease.tabId }, requester: { tabId: "t-b" } } });
  assert.equal(lease.state, "releasing");
  await clock.advance(9000); // past the grace: an interaction is not aborted
  assert.equal(server.valid(), true, "the holder keeps its lease");
  assert.equal(seen.ui.signal.aborted, false);
  const renews = server.callsTo("POST", "/lease/renew").length;
  assert.ok(renews >= 1, "renews went on");
  seen.ui.submit({ answer: "yes" }); // the safe point
  assert.deepEqual(await asked, { answer: "yes" });
  await flush();
  assert.equal(server.valid(), false, "released at the interaction's end");
  assert.equal(server.reserved?.tabId, "t-b", "reserved for the requester");
  reg.close();
  await lease.stop({ release: false });
});

// A holder whose handler `confirm` (handler(seen)) has a question open when another tab asks for
// a handoff: answers {clock, server, holder, asker, seen, asked (the call), wait (the ask), reg}.
async function askedWhileAsking(handler, handoffGraceMs) {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock, { tools: TOOLS });
  const holder = new TabLease(fakeOptions(server, clock, { window: new FakeBrowserWindow("/events/evt-1"), handoffGraceMs }));
  const asker = new TabLease(fakeOptions(server, clock, { window: new FakeBrowserWindow("/events/evt-1"), autoAcquire: false }));
  await holder.start();
  await asker.start();
  const seen = {};
  let defs = [];
  const reg = syncToolRegistry(holder, { sync: (d) => (defs = d) }, { handlers: { confirm: handler(seen) } });
  await reg.sync();
  const asked = defs.find((d) => d.name === "confirm").execute({}, {});
  await flush();
  const wait = asker.requestHandoff();
  await flush();
  // The fake server has no stream here: tell the holder as its stream would.
  holder._onStreamEvent({ type: "lease", id: "2-0", data: { type: "handoff_requested", epoch: holder.epoch, holder: { tabId: holder.tabId }, requester: { tabId: asker.tabId } } });
  assert.equal(holder.state, "releasing");
  return { clock, server, holder, asker, seen, asked, wait, reg };
}

test("a handoff request that lapses while an interaction is open leaves the holder owner; the requester is told timeout", async () => {
  const { clock, server, holder, asker, seen, asked, wait, reg } = await askedWhileAsking(asking, 5000);
  await clock.advance(16000);
  const result = await wait;
  assert.equal(result.status, "timeout", "the requester is told the holder did not let go in time");
  await clock.advance(2000);
  assert.equal(holder.state, "owner", "the request lapsed: owner again");
  assert.equal(seen.ui.signal.aborted, false, "the interaction goes on");
  seen.ui.submit({ answer: "kept" });
  assert.deepEqual(await asked, { answer: "kept" });
  assert.equal(server.holder.tabId, holder.tabId);
  reg.close();
  await asker.stop({ release: false });
  await holder.stop({ release: false });
});

// A mutation that asks first and then confirms, as docs/browser-client.md shows (delete_event).
function askingThenActing(seen) {
  return async (args, ctx) => {
    const answer = await asking(seen)(args, ctx);
    if (answer?.error || answer?.cancelled) return answer;
    if (!(await ctx.confirm())) return ctx.stale();
    seen.acted = { answer: answer.answer, epoch: ctx.epoch, token: ctx.token };
    return { done: answer.answer };
  };
}

test("the answer to a question open when a handoff is asked is applied, then the lease goes to the requester", async () => {
  const seen = {};
  const { clock, server, lease, reg, tool } = await setup({ handlers: { confirm: askingThenActing(seen) }, lease: { handoffGraceMs: 5000 } });
  const epoch = lease.epoch;
  const asked = tool("confirm").execute({}, {});
  await flush();
  server.handoff = { requester: "t-b", at: clock.now() };
  lease._onStreamEvent({ type: "lease", id: "2-0", data: { type: "handoff_requested", epoch, holder: { tabId: lease.tabId }, requester: { tabId: "t-b" } } });
  assert.equal(lease.state, "releasing");
  await clock.advance(3000);
  seen.ui.submit({ answer: "yes" });
  assert.deepEqual(await asked, { done: "yes" }, "the user's answer is applied, not refused as a handoff");
  assert.equal(seen.acted.epoch, epoch);
  assert.ok(seen.acted.token, "with the lease token of the grant");
  await flush();
  assert.equal(server.valid(), false, "released once the handler ended");
  assert.equal(server.reserved?.tabId, "t-b", "reserved for the requester");
  reg.close();
  await lease.stop({ release: false });
});

test("a handler that ends after the handoff request lapsed renews rather than releases: the holder stays owner", async () => {
  // Grace checks at 4, 8 and 12 s, then 250 ms after the lapse the renew of 12 s told of.
  const { clock, server, holder, asker, seen, asked, wait, reg } = await askedWhileAsking(askingThenActing, 4000);
  // The request lapses at the server 15 s after it was filed; the holder learns it at its next
  // renew, 250 ms later. The user answers in between.
  await clock.advance(15100);
  assert.equal(holder.state, "releasing", "the holder has not renewed since the lapse yet");
  seen.ui.submit({ answer: "late" });
  assert.deepEqual(await asked, { done: "late" });
  await flush();
  assert.equal((await wait).status, "timeout");
  assert.equal(holder.state, "owner", "the request lapsed: owner again, not released");
  assert.equal(server.holder?.tabId, holder.tabId);
  reg.close();
  await asker.stop({ release: false });
  await holder.stop({ release: false });
});

test("news that the holder let go, arriving while the handoff request is in flight, is not slept through", async () => {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock, { tools: TOOLS });
  // The asker's first ask in mode handoff is decided by the server at once (HANDOFF_PENDING: the
  // holder still holds), and its answer reaches the asker only when the test lets it.
  let answered = null;
  let asked = null;
  const fetch = (url, init = {}) => {
    const answer = server.fetch(url, init);
    if (answered === null && init.method === "POST" && String(url).endsWith("/lease") && JSON.parse(init.body).mode === "handoff") {
      const held = new Promise((resolve) => (answered = resolve));
      asked?.();
      return held.then(() => answer);
    }
    return answer;
  };
  const holder = new TabLease(fakeOptions(server, clock, { window: new FakeBrowserWindow("/events/evt-1") }));
  const asker = new TabLease(fakeOptions(server, clock, { window: new FakeBrowserWindow("/events/evt-1"), autoAcquire: false, fetch }));
  await holder.start();
  await asker.start();
  await flush();
  const sent = new Promise((resolve) => (asked = resolve));
  const wait = asker.requestHandoff();
  await sent;
  assert.equal(server.handoff?.requester, asker.tabId, "the server has the request");
  // Before the asker reads that answer, the holder lets go and the lease is reserved for the asker,
  // and the news of it arrives, as a stream carried by another tab can bring it first.
  server.holder = null;
  server.expiresAt = clock.now();
  server.reserved = { tabId: asker.tabId, until: clock.now() + 5000 };
  server.handoff = null;
  asker._onStreamEvent({ type: "lease", id: "9-0", data: { type: "released", sessionId: server.sessionId, epoch: server.epoch, holder: null, requester: { tabId: asker.tabId } } });
  answered();
  await flush();
  await clock.advance(100);
  await flush();
  assert.equal(asker.role, "owner", "the asker claimed its reservation at once, not after its sleep between asks");
  assert.equal((await wait).status, "granted");
  await asker.stop({ release: false });
  await holder.stop({ release: false });
});


test("a running mutation and an open question go on through unconfirmed (news may have been missed), and end when the deadline passes unconfirmed", async () => {
  const { gate, release } = gates();
  const seen = {};
  const handlers = {
    ask_user: async (args, ctx) => {
      await gate();
      return { applied: ctx.isCurrent() };
    },
    confirm: asking(seen),
  };
  const { clock, server, lease, reg, tool } = await setup({ handlers, lease: { stream: "fetch" } });
  await flush();
  assert.equal(lease.streamLive, true);
  // Kept: the adapter unregisters them while the tab is not owner.
  const save = tool("ask_user");
  const confirm = tool("confirm");
  const running = save.execute({ question: "q" }, {});
  const asked = confirm.execute({}, {});
  await flush();
  assert.equal(seen.opened, 1);

  // The stream drops (as when the tab carrying it closes or freezes): unconfirmed until the renew
  // sent at once confirms; nothing was lost, so nothing running ends.
  await clock.advance(1000);
  server.latencyMs = 100;
  server.dropStreams();
  await flush();
  assert.equal(lease.state, "unconfirmed");
  await clock.advance(100);
  assert.equal(lease.state, "owner");
  assert.equal(seen.closed, undefined, "the question stays open");
  release();
  assert.deepEqual(await running, { applied: true });
  seen.ui.submit("yes");
  assert.deepEqual(await asked, { result: "yes" });

  // Unconfirmed with no renew getting through until the deadline passes: the period ends, and
  // with it a question still open (its timeoutMs is longer).
  const late = confirm.execute({}, {});
  await flush();
  await clock.advance(1000);
  server.fail("POST /lease/renew", { network: true, times: 1000 });
  server.dropStreams();
  await flush();
  assert.equal(lease.state, "unconfirmed");
  await clock.advance(lease._deadline - clock.now() + 1);
  const ended = await late;
  assert.equal(ended.error.code, "NOT_LEASE_OWNER");
  assert.equal(ended.error.details.reason, "expired");
  release();
  reg.close();
  await lease.stop({ release: false });
});

test("a mutation waiting for the guard's check of the lease is ended by the agent's cancel and by its deadline", async () => {
  let ran = 0;
  const handlers = {
    ask_user: async () => {
      ran++;
      return { applied: true };
    },
  };
  const { clock, server, lease, reg, tool } = await setup({ handlers, lease: { stream: "fetch" } });
  await flush();
  const save = tool("ask_user");
  await clock.advance(1000);
  server.fail("POST /lease/renew", { hang: true, times: 1000 });
  server.fail("POST /lease/check", { hang: true, times: 1000 });
  server.dropStreams();
  await flush();
  assert.equal(lease.state, "unconfirmed");

  const agent = new AbortController();
  const cancelled = save.execute({ question: "q" }, { signal: agent.signal });
  await clock.advance(500);
  agent.abort();
  await flush();
  const c = await cancelled;
  assert.equal(c.error?.code, "CANCELLED", `answered ${JSON.stringify(c)}`);

  const t0 = clock.now();
  const timedOut = save.execute({ question: "q" }, {}); // timeoutMs 10000, settled 1 s before
  let settledAt = null;
  timedOut.then(() => (settledAt = clock.now()));
  await clock.advance(9500);
  assert.equal((await timedOut).error?.code, "TIMEOUT");
  assert.equal(settledAt - t0, 9000, "at the call's deadline, not when the check gives up");
  await clock.advance(30000);
  assert.equal(ran, 0, "a handler whose call was answered never runs");
  reg.close();
  await lease.stop({ release: false });
});

test("a mutation ended while its handler runs says it may have acted; a tool without routes asks on the page shown now", async () => {
  const { gate, release } = gates();
  const seen = {};
  const handlers = {
    edit: async () => {
      await gate(); // its write sent, its answer not in yet
      return { applied: true };
    },
    confirm: async (args, ctx) => {
      await gate();
      return ctx.interact((ui) => {
        seen.ui = ui;
        seen.opened = (seen.opened ?? 0) + 1;
        return () => (seen.closed = (seen.closed ?? 0) + 1);
      });
    },
  };
  const { window, lease, reg, tool } = await setup({ handlers });
  const edit = tool("edit").execute({}, {});
  await flush();
  window.history.pushState(null, "", "/events/evt-2"); // the route leaves the instance
  const e = await edit;
  assert.equal(e.error.code, "UI_CONTEXT_CLOSED");
  assert.equal(e.error.details.mayHaveActed, true);
  assert.match(e.error.message, /may have acted: look at what it did before calling again\.$/, "the message says so too");
  assert.equal(e.error.details.reason, "route");
  release();
  // So does one the agent cancels, or whose deadline passes, while its handler runs.
  await reg.sync();
  const agent = new AbortController();
  const cancelled = tool("edit").execute({}, { signal: agent.signal });
  await flush();
  agent.abort();
  const c = await cancelled;
  assert.equal(c.error.code, "CANCELLED");
  assert.equal(c.error.details?.mayHaveActed, true);
  assert.match(c.error.message, /may have acted/);
  release();

  await reg.sync();
  const asked = tool("confirm").execute({}, {});
  await flush();
  window.history.pushState(null, "", "/events/evt-3"); // before the question is asked
  release();
  await flush();
  assert.equal(seen.opened, 1, "the question is shown, on the page the user sees now");
  seen.ui.submit("yes");
  assert.deepEqual(await asked, { result: "yes" });
  reg.close();
  await lease.stop({ release: false });
});

test("stop() ends a mutation's open question with the reason stopped", async () => {
  const seen = {};
  const { lease, reg, tool } = await setup({ handlers: { confirm: asking(seen) } });
  const asked = tool("confirm").execute({}, {});
  await flush();
  assert.equal(seen.opened, 1);
  await lease.stop();
  const out = await asked;
  assert.equal(out.error.code, "NOT_LEASE_OWNER");
  assert.equal(out.error.details.reason, "stopped");
  assert.equal(seen.closed, 1);
  reg.close();
});

test("a handler that returns after the deadline, before the late timer of a frozen page fires, answers TIMEOUT", async () => {
  const { gate, release } = gates();
  const handlers = {
    ask_user: async (args, ctx) => {
      await gate();
      return { wrote: true, current: ctx.isCurrent() };
    },
    peek: async () => {
      await gate();
      return { read: true };
    },
  };
  const { clock, lease, reg, tool } = await setup({ handlers });
  const frozenPast = (ms) => (clock._now += ms); // time passes; no timer has run yet
  const p = tool("ask_user").execute({ question: "q" }, {}); // timeoutMs 10000: deadline at 9 s
  await flush();
  frozenPast(9500);
  release();
  const m = await p;
  assert.equal(m.error?.code, "TIMEOUT", `answered ${JSON.stringify(m)}`);
  assert.equal(m.error.details.mayHaveActed, true, "a mutation that returned late may have acted");
  assert.match(m.error.message, /may have acted/);
  await clock.advance(0);

  const q = tool("peek").execute({}, {}); // the default timeoutMs, 60000
  await flush();
  frozenPast(60000);
  release();
  const r = await q;
  assert.equal(r.error?.code, "TIMEOUT");
  assert.equal(r.error.details.mayHaveActed, undefined);
  reg.close();
  await lease.stop({ release: false });
});

/** setup with an ask_user handler that counts its runs, and ask_user's definition as the owner
 *  registered it, which an agent keeps. */
async function setupKeptAsk() {
  const runs = { n: 0 };
  const s = await setup({ handlers: { ask_user: async () => ({ applied: ++runs.n }) }, lease: { stream: "fetch" } });
  await flush();
  return { ...s, runs, ask: s.tool("ask_user") };
}

test("a mutation tool unregistered while its lease is re-confirmed runs once it is, unless the catalog changed meanwhile", async () => {
  const { clock, server, lease, reg, tool, runs, ask } = await setupKeptAsk();
  const unconfirm = async () => {
    await clock.advance(1000);
    server.fail("POST /lease/renew", { hang: true });
    server.dropStreams();
    await flush();
    assert.equal(lease.state, "unconfirmed");
    await reg.sync();
    assert.equal(tool("ask_user"), undefined, "unregistered while read-only");
  };

  await unconfirm();
  assert.deepEqual(await ask.execute({ question: "q" }, {}), { applied: 1 }, "the guard confirmed the same lease");

  await unconfirm();
  server.catalogVersion = "sha256:v2";
  lease._onStreamEvent({ type: "catalog", id: "12-0", data: { version: "sha256:v2" } });
  const refused = await ask.execute({ question: "q" }, {});
  assert.equal(refused.error?.code, "NOT_LEASE_OWNER", `answered ${JSON.stringify(refused)}`);
  assert.equal(refused.error.details.reason, "unconfirmed");
  assert.equal(await lease.check(), true);
  assert.equal(lease.state, "owner");
  const retired = await ask.execute({ question: "q" }, {});
  assert.equal(retired.error?.code, "TOOL_RETIRED", `answered ${JSON.stringify(retired)}`);
  assert.equal(runs.n, 1);
  reg.close();
  await lease.stop({ release: false });
});

test("a mutation tool unregistered as its page froze does not run after the resume: the catalog may have changed unheard", async () => {
  const { clock, server, lease, reg, tool, runs, ask } = await setupKeptAsk();
  lease._document.fire("freeze");
  await reg.sync();
  assert.equal(tool("ask_user"), undefined, "unregistered while frozen");
  // The kill switch while the page is frozen: its catalog event does not reach the page.
  server.tools = TOOLS.map((t) => (t.name === "ask_user" ? { ...t, disabled: true } : t));
  server.catalogVersion = "sha256:v2";
  await clock.advance(1000);
  lease._document.fire("resume");
  const answer = await ask.execute({ question: "q" }, {});
  assert.ok(answer.error?.code === "NOT_LEASE_OWNER" || answer.error?.code === "TOOL_RETIRED", `answered ${JSON.stringify(answer)}`);
  for (let t = 0; lease.state !== "owner" && t < 5000; t += 10) await clock.advance(10);
  assert.equal((await ask.execute({ question: "q" }, {})).error?.code, "TOOL_RETIRED");
  assert.equal(runs.n, 0, "the retired definition never ran");
  reg.close();
  await lease.stop({ release: false });
});

test("while unconfirmed a mutation's isCurrent() is false; ctx.confirm() asks the server: written if still the holder, not if another took it", async () => {
  const { gate, release } = gates();
  const handlers = {
    // Seed 002's confirm-then-write: the user answers after the page was frozen, or the stream
    // went quiet; the write goes only if the tab is the owner now.
    ask_user: async (args, ctx) => {
      await gate();
      return ctx.isCurrent() ? { applied: true } : ctx.stale();
    },
    confirm: async (args, ctx) => {
      await gate();
      return (await ctx.confirm()) ? { applied: true } : ctx.stale();
    },
  };
  const { clock, server, lease, reg, tool } = await setup({ handlers, lease: { stream: "fetch" } });
  await flush();
  const kept = { ask_user: tool("ask_user"), confirm: tool("confirm") }; // kept while not owner
  /** Runs tool (as registered now, or as kept while the tab is not owner) until its handler
   *  waits, makes the tab unconfirmed (news may have been missed, the renew hangs), runs
   *  meanwhile, then lets the handler go on; answers the call's answer. */
  const answered = async (name, meanwhile = () => {}) => {
    await reg.sync();
    const p = (tool(name) ?? kept[name]).execute(name === "ask_user" ? { question: "q" } : {}, {});
    await flush();
    await clock.advance(1000);
    server.fail("POST /lease/renew", { hang: true });
    server.dropStreams();
    await flush();
    assert.equal(lease.state, "unconfirmed");
    meanwhile();
    release();
    return p;
  };
  const refused = await answered("ask_user");
  assert.equal(refused.error?.code, "NOT_LEASE_OWNER", `answered ${JSON.stringify(refused)}`);
  assert.equal(refused.error.details.reason, "unconfirmed");

  assert.deepEqual(await answered("confirm"), { applied: true }, "still the holder: confirmed, and written");
  assert.equal(lease.state, "owner");

  const taken = await answered("confirm", () => server.takeoverBy("tab-other"));
  assert.equal(taken.error?.code, "NOT_LEASE_OWNER", `answered ${JSON.stringify(taken)}`);
  assert.equal(taken.error.details.reason, "lost");
  reg.close();
  await lease.stop({ release: false });
});
