// The catalog and the tool adapters (WebMCP, registry.sync, onTool): `node --test web/sdk/`.
import assert from "node:assert/strict";
import { test } from "node:test";

import { NOT_LEASE_OWNER, TabLease, bindOnTool, registerWebMCPTools, syncToolRegistry } from "./tablease.js";
import { FakeClock, FakeServer, fakeOptions, flush } from "./fakes.mjs";

const TOOLS = [
  { name: "search_events", description: "Search events.", inputSchema: { type: "object", properties: { q: { type: "string" } } }, annotations: { readOnlyHint: true } },
  { name: "get_event", description: "An event by id.", inputSchema: { type: "object", properties: { event_id: { type: "string" } }, required: ["event_id"] }, annotations: { readOnlyHint: true } },
  { name: "save_event", description: "Save an event.", inputSchema: { type: "object" }, annotations: { readOnlyHint: false, destructiveHint: false }, timeoutMs: 120000 },
  { name: "rename_event", description: "Rename an event.", inputSchema: { type: "object" }, annotations: { readOnlyHint: false } },
];

const handlers = {
  search_events: (args) => ({ results: [args.q] }),
  get_event: (args) => ({ id: args.event_id }),
  save_event: (args, lease) => ({ saved: args.event_id, epoch: lease.epoch }),
  rename_event: (args, lease) => ({ renamed: args.event_id, token: lease.token }),
};

function setup(extra = {}) {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock, { tools: TOOLS });
  const lease = new TabLease(fakeOptions(server, clock, extra));
  return { clock, server, lease };
}

/** document.modelContext: registerTool(tool, {signal}) → Promise; aborting unregisters. */
class ModelContext {
  constructor() {
    this.tools = new Map();
    this.log = [];
  }

  registerTool(tool, { signal } = {}) {
    if (this.tools.has(tool.name)) return Promise.reject(new DOMException("duplicate " + tool.name, "InvalidStateError"));
    if (signal?.aborted) return Promise.resolve();
    this.tools.set(tool.name, tool);
    this.log.push("+" + tool.name);
    signal?.addEventListener("abort", () => {
      if (this.tools.get(tool.name) === tool) {
        this.tools.delete(tool.name);
        this.log.push("-" + tool.name);
      }
    }, { once: true });
    return Promise.resolve();
  }

  names() {
    return [...this.tools.keys()].sort();
  }
}

/** The older navigator.modelContext: registerTool(tool) and unregisterTool(name), no signal. */
class LegacyModelContext {
  constructor() {
    this.tools = new Map();
  }

  registerTool(tool) {
    if (this.tools.has(tool.name)) throw new Error("duplicate");
    this.tools.set(tool.name, tool);
  }

  unregisterTool(name) {
    this.tools.delete(name);
  }

  names() {
    return [...this.tools.keys()].sort();
  }
}

test("catalog() gives a viewer only read-only tools and uses the ETag", async () => {
  const { server, lease } = setup({ autoAcquire: false });
  server.takeoverBy("t-other");
  await lease.start();
  const cat = await lease.catalog("/events");
  assert.equal(cat.role, "viewer");
  assert.deepEqual(cat.tools.map((t) => t.name), ["search_events", "get_event"]);
  assert.equal(cat.version, "sha256:v1");
  const again = await lease.catalog("/events");
  assert.deepEqual(again.tools, cat.tools);
  const calls = server.callsTo("GET", "/catalog");
  assert.equal(calls[0].query.route, "/events");
  assert.equal(calls[0].query.tabId, lease.tabId);
  assert.ok(calls[1].headers["If-None-Match"], "revalidated with the ETag");
  await lease.stop({ release: false });
});

test("catalog() reads of one route made at once, after the same change, make one request", async () => {
  const { server, lease } = setup({ autoAcquire: false });
  await lease.start();
  const reads = () => server.callsTo("GET", "/catalog").length;
  const before = reads();
  const [a, b] = await Promise.all([lease.catalog("/events"), lease.catalog("/events")]);
  assert.equal(reads() - before, 1, "the second read joined the first");
  assert.deepEqual(a, b);
  // A read in flight before a change of role answers nothing after it: the change reads again.
  const early = lease.catalog("/events");
  await lease.acquire();
  const late = lease.catalog("/events");
  const [, l] = await Promise.all([early, late]);
  assert.equal(reads() - before, 3);
  assert.equal(l.role, "owner");
  assert.equal(server.callsTo("GET", "/catalog").at(-1).query.route, "/events");
  await lease.stop({ release: false });
});

test("catalog() keeps the answers of the latest 32 routes only, however many pages an SPA shows", async () => {
  const { server, lease } = setup({ autoAcquire: false });
  await lease.start();
  for (let i = 0; i < 1000; i++) await lease.catalog(`/events/evt-${i}`);
  await lease.catalog("/events/evt-968"); // the oldest kept: read again, it becomes the latest
  await lease.catalog("/events/evt-0"); // forgotten long ago
  await lease.catalog("/events/evt-969"); // the oldest now: pushed out by evt-0
  await lease.catalog("/events/evt-968");
  const revalidated = (route) => server.callsTo("GET", "/catalog").filter((c) => c.query.route === route).at(-1).headers["If-None-Match"] !== undefined;
  assert.equal(revalidated("/events/evt-0"), false, "a route read 999 routes ago is read afresh");
  assert.equal(revalidated("/events/evt-969"), false, "the oldest route was dropped for the latest");
  assert.equal(revalidated("/events/evt-968"), true, "a route read again stays");
  assert.ok(lease._catalogCache.size <= 32);
  await lease.stop({ release: false });
});

test("catalog() filters mutation tools by the local role even when the server still says owner", async () => {
  const { clock, server, lease } = setup();
  server.fail("POST /lease/renew", { network: true, times: 1000 });
  await lease.start();
  assert.equal((await lease.catalog()).tools.length, 4);
  await clock.advance(44000); // past the local deadline, before the server's expiry
  assert.equal(lease.role, "viewer");
  const cat = await lease.catalog();
  assert.equal(cat.serverRole, "owner");
  assert.deepEqual(cat.tools.map((t) => t.name), ["search_events", "get_event"]);
  await lease.stop({ release: false });
});

test("WebMCP: a viewer registers read-only tools; the owner adds mutation tools, dropped when ownership ends", async () => {
  const { server, lease } = setup();
  server.takeoverBy("t-other");
  const mc = new ModelContext();
  await lease.start();
  const bridge = registerWebMCPTools(lease, { modelContext: mc, handlers, route: "/events" });
  await bridge.sync();
  assert.deepEqual(mc.names(), ["get_event", "search_events"]);
  assert.deepEqual(await mc.tools.get("search_events").execute({ q: "webmcp" }, {}), { results: ["webmcp"] });

  await lease.takeover();
  await flush();
  await bridge.sync();
  assert.deepEqual(mc.names(), ["get_event", "rename_event", "save_event", "search_events"]);
  const save = mc.tools.get("save_event");
  assert.deepEqual(await save.execute({ event_id: "evt-1" }, {}), { saved: "evt-1", epoch: lease.epoch });
  assert.equal(mc.tools.get("save_event").annotations.readOnlyHint, false);
  assert.equal(mc.tools.get("save_event").timeoutMs, 120000, "the runtime may read the tool's timeoutMs");
  assert.equal("timeoutMs" in mc.tools.get("search_events"), false, "none when the catalog gives none");

  server.takeoverBy("t-other");
  lease._onStreamEvent({ type: "lease", id: "9-0", data: { type: "taken_over", epoch: server.epoch, holder: { ...server.holder }, previous: null } });
  assert.deepEqual(mc.names(), ["get_event", "search_events"], "mutation tools unregistered synchronously");
  // a caller that kept a reference to the old tool is refused by the guard
  const res = await save.execute({ event_id: "evt-1" }, {});
  assert.equal(res.error.code, NOT_LEASE_OWNER);
  await flush();
  const search = mc.tools.get("search_events");
  bridge.close();
  assert.deepEqual(mc.names(), []);
  // A caller that kept a tool of the closed adapter is told the page closed its tools, not to
  // read tools the catalog no longer offers: it offers them still.
  const closed = await search.execute({ q: "x" }, {});
  assert.equal(closed.error.code, "UI_CONTEXT_CLOSED");
  assert.equal(closed.error.details.reason, "closed");
  await lease.stop({ release: false });
});

test("WebMCP: a mutation tool's definition kept from an earlier lease never runs: refused in a viewer, TOOL_RETIRED in the next lease, also once disabled", async () => {
  for (const disable of [false, true]) {
    const { server, lease } = setup();
    await lease.start();
    const mc = new ModelContext();
    const bridge = registerWebMCPTools(lease, { modelContext: mc, handlers, route: "/events" });
    await bridge.sync();
    const save = mc.tools.get("save_event"); // an agent keeps it

    server.takeoverBy("t-other");
    lease._onStreamEvent({ type: "lease", id: "9-0", data: { type: "taken_over", epoch: server.epoch, holder: { ...server.holder }, previous: null } });
    assert.equal((await save.execute({ event_id: "evt-1" }, {})).error?.code, NOT_LEASE_OWNER);
    if (disable) {
      // The kill switch, while this tab is a viewer.
      server.tools = TOOLS.map((t) => (t.name === "save_event" ? { ...t, disabled: true } : t));
      server.catalogVersion = "sha256:v2";
      lease._onStreamEvent({ type: "catalog", id: "10-0", data: { version: "sha256:v2" } });
      await flush();
    }

    await lease.takeover(); // this tab's next lease
    await flush();
    await bridge.sync();
    assert.equal(lease.role, "owner");
    assert.equal(mc.names().includes("save_event"), !disable);
    const old = await save.execute({ event_id: "evt-1" }, {});
    assert.equal(old.error?.code, "TOOL_RETIRED", `${disable ? "disabled" : "enabled"}: answered ${JSON.stringify(old)}`);
    if (!disable) assert.deepEqual(await mc.tools.get("save_event").execute({ event_id: "evt-1" }, {}), { saved: "evt-1", epoch: lease.epoch });
    bridge.close();
    await lease.stop({ release: false });
  }
});

test("WebMCP: a catalog tool named like what every object has (toString, constructor) gets no handler from the prototype", async () => {
  const inherited = ["constructor", "toString", "valueOf", "hasOwnProperty", "__defineGetter__", "isPrototypeOf"];
  const tools = [TOOLS[0], ...inherited.map((name) => ({ name, description: "Not the app's.", inputSchema: { type: "object" }, annotations: { readOnlyHint: true } }))];
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock, { tools });
  const lease = new TabLease(fakeOptions(server, clock));
  const mc = new ModelContext();
  await lease.start();
  const bridge = registerWebMCPTools(lease, { modelContext: mc, handlers: { search_events: handlers.search_events }, route: "/events" });
  await bridge.sync();
  assert.deepEqual(mc.names(), ["search_events"], "only the tool the app has a handler of its own for");
  // A record that has one of its own gets it, whatever its name.
  const own = { toString: () => ({ ok: true }) };
  const syncs = [];
  const registry = syncToolRegistry(lease, { sync: (defs) => syncs.push(defs.map((d) => d.name)) }, { handlers: own, route: "/events" });
  await registry.sync();
  assert.deepEqual(syncs.at(-1), ["toString"]);
  registry.close();
  bridge.close();
  await lease.stop({ release: false });
});

test("input validation and bound route parameters read a value's own properties only", async () => {
  const { validateInput, bindRouteParams } = await import("./call.js");
  const schema = { type: "object", properties: { constructor: { type: "string" } }, required: ["constructor"] };
  assert.deepEqual(validateInput(schema, {}, ""), { path: "constructor", reason: "is required" }, "an inherited constructor is not the required property");
  assert.equal(validateInput(schema, { constructor: "x" }, ""), null);
  const bound = bindRouteParams({}, { constructor: "c-1" }, schema);
  assert.deepEqual(bound, { args: { constructor: "c-1" } }, "the route's value, not ENTITY_MISMATCH against Object");
});

test("a mutation tool that waits sends the latest token: ctx.token and ctx.headers follow the renews", async () => {
  const { clock, lease } = setup();
  const mc = new ModelContext();
  await lease.start();
  let resume;
  const sent = [];
  const bridge = registerWebMCPTools(lease, {
    modelContext: mc,
    route: "/events",
    handlers: {
      ...handlers,
      save_event: async (args, ctx) => {
        sent.push(ctx.token);
        await new Promise((r) => (resume = r)); // the user answers a question, say
        sent.push(ctx.token, ctx.headers["Tablease-Lease"]);
        return { saved: true };
      },
    },
  });
  await bridge.sync();
  const running = mc.tools.get("save_event").execute({}, {});
  await flush();
  await clock.advance(15000); // a renew answers a new token of the same epoch
  assert.notEqual(lease.token, sent[0]);
  resume();
  assert.deepEqual(await running, { saved: true });
  assert.deepEqual(sent.slice(1), [lease.token, lease.token]);
  bridge.close();
  await lease.stop({ release: false });
});

test("WebMCP: a catalog event re-registers changed tools, and an empty catalog falls back to the app's tools", async () => {
  const { server, lease } = setup();
  const mc = new ModelContext();
  await lease.start();
  server.tools = [];
  const bridge = registerWebMCPTools(lease, { modelContext: mc, handlers, tools: TOOLS, route: "/events" });
  await bridge.sync();
  assert.deepEqual(mc.names(), ["get_event", "rename_event", "save_event", "search_events"]);

  server.tools = [{ ...TOOLS[0], description: "Search public events (v2)." }];
  server.catalogVersion = "sha256:v2";
  lease._onStreamEvent({ type: "catalog", id: "3-0", data: { version: "sha256:v2" } });
  await flush();
  await bridge.sync(); // let the triggered sync finish
  assert.deepEqual(mc.names(), ["search_events"]);
  assert.equal(mc.tools.get("search_events").description, "Search public events (v2).");
  bridge.close();
  await lease.stop({ release: false });
});

test("WebMCP: a catalog changed while the stream was down is read again when the stream is back", async () => {
  const { clock, server, lease } = setup({ stream: "fetch" });
  const mc = new ModelContext();
  await lease.start();
  const bridge = registerWebMCPTools(lease, { modelContext: mc, handlers, route: "/events" });
  await bridge.sync();
  assert.deepEqual(mc.names(), ["get_event", "rename_event", "save_event", "search_events"]);
  const events = [];
  lease.on("catalog", (e) => e.reason === "version" && events.push(e));

  // The stream drops; a kill switch disables save_event meanwhile. Its catalog event reaches no
  // one, and the snapshot of the reconnect names the new version.
  server.down = true;
  server.dropStreams();
  await clock.advance(3000);
  server.tools = TOOLS.filter((t) => t.name !== "save_event");
  server.catalogVersion = "sha256:v2";
  server.down = false;
  for (let t = 0; !lease.streamLive && t < 30000; t += 10) await clock.advance(10);
  assert.equal(lease.streamLive, true, "the stream reconnects");
  await flush();
  await bridge.sync(); // let the triggered sync finish
  assert.deepEqual(events, [{ version: "sha256:v2", reason: "version" }]);
  assert.deepEqual(mc.names(), ["get_event", "rename_event", "search_events"]);

  // A reconnect that finds the same version announces no change.
  server.dropStreams();
  for (let t = 0; lease.streamLive && t < 1000; t += 10) await clock.advance(10);
  for (let t = 0; !lease.streamLive && t < 30000; t += 10) await clock.advance(10);
  await flush();
  assert.equal(lease.streamLive, true);
  assert.equal(events.length, 1, "no catalog event for an unchanged version");
  bridge.close();
  await lease.stop({ release: false });
});

test("WebMCP: a catalog that cannot be read keeps the last reading's tools for the role, and is read again", async () => {
  const { clock, server, lease } = setup();
  await lease.start();
  const mc = new ModelContext();
  const bridge = registerWebMCPTools(lease, { modelContext: mc, handlers, route: "/events" });
  await bridge.sync();
  assert.deepEqual(mc.names(), ["get_event", "rename_event", "save_event", "search_events"]);

  // The server goes down and another tab takes over: the role change's sync cannot read the
  // catalog, and the read-only tools of the last reading stay.
  server.down = true;
  server.takeoverBy("t-other");
  lease._onStreamEvent({ type: "lease", id: "9-0", data: { type: "taken_over", epoch: server.epoch, holder: { ...server.holder }, previous: null } });
  await flush();
  await bridge.sync();
  assert.equal(lease.role, "viewer");
  assert.deepEqual(mc.names(), ["get_event", "search_events"]);

  // Back up, with a changed catalog: the retry reads it without any event.
  server.down = false;
  server.tools = [TOOLS[0]];
  for (let i = 0; i < 100 && mc.names().length !== 1; i++) await clock.advance(500);
  assert.deepEqual(mc.names(), ["search_events"]);
  bridge.close();
  await lease.stop({ release: false });
});

test("registry.sync: a frozen page's role change keeps its read-only tools, and the catalog is read on resume", async () => {
  const { clock, server, lease } = setup();
  await lease.start();
  const got = [];
  const bridge = syncToolRegistry(lease, { sync: (defs) => got.push(defs.map((d) => d.name).sort()) }, { handlers, route: "/events" });
  await bridge.sync();
  assert.deepEqual(got.at(-1), ["get_event", "rename_event", "save_event", "search_events"]);
  const reads = () => server.calls.filter((c) => c.path.endsWith("/catalog")).length;
  const before = reads();
  lease._document.fire("freeze");
  await flush();
  await bridge.sync();
  assert.equal(lease.role, "viewer");
  assert.deepEqual(got.at(-1), ["get_event", "search_events"]);
  assert.equal(reads(), before, "no request while frozen");
  lease._document.fire("resume");
  for (let i = 0; i < 20 && reads() === before; i++) await clock.advance(500);
  assert.ok(reads() > before, "the catalog is read again after the resume");
  bridge.close();
  await lease.stop({ release: false });
});

test("WebMCP: the older navigator.modelContext shape is unregistered with unregisterTool", async () => {
  const { server, lease } = setup();
  const mc = new LegacyModelContext();
  await lease.start();
  const bridge = registerWebMCPTools(lease, { modelContext: mc, legacy: true, handlers, route: "/events" });
  await bridge.sync();
  assert.deepEqual(mc.names(), ["get_event", "rename_event", "save_event", "search_events"]);
  server.takeoverBy("t-other");
  lease._onStreamEvent({ type: "lease", id: "9-0", data: { type: "taken_over", epoch: server.epoch, holder: { ...server.holder }, previous: null } });
  assert.deepEqual(mc.names(), ["get_event", "search_events"]);
  bridge.close();
  assert.deepEqual(mc.names(), []);
  await lease.stop({ release: false });
});

test("registry.sync gets the definitions for the role, with guarded executes", async () => {
  const { server, lease } = setup();
  await lease.start();
  const synced = [];
  const registry = { sync: (defs) => synced.push(defs.map((d) => d.name)) };
  const r = syncToolRegistry(lease, registry, { handlers, route: "/events" });
  await r.sync();
  assert.deepEqual(synced.at(-1), ["search_events", "get_event", "save_event", "rename_event"]);
  server.takeoverBy("t-other");
  lease._onStreamEvent({ type: "lease", id: "9-0", data: { type: "taken_over", epoch: server.epoch, holder: { ...server.holder }, previous: null } });
  assert.deepEqual(synced.at(-1), ["search_events", "get_event"], "read-only at once on losing ownership");
  await flush();
  await r.sync();
  assert.deepEqual(synced.at(-1), ["search_events", "get_event"]);
  r.close();
  await lease.stop({ release: false });
});

test("onTool: mutation handlers answer NOT_LEASE_OWNER in a viewer; read-only ones always run", async () => {
  const { server, lease } = setup();
  server.takeoverBy("t-other");
  await lease.start();
  const registered = new Map();
  const session = {
    onTool(name, fn) {
      registered.set(name, fn);
      return () => registered.delete(name);
    },
  };
  const off = bindOnTool(lease, session, { handlers, tools: TOOLS });
  assert.deepEqual([...registered.keys()].sort(), ["get_event", "rename_event", "save_event", "search_events"]);
  assert.deepEqual(await registered.get("get_event")({ event_id: "evt-1" }, { toolRequestId: "r1" }), { id: "evt-1" });
  const res = await registered.get("rename_event")({ event_id: "evt-1", name: "x" }, { toolRequestId: "r2" });
  assert.equal(res.error.code, NOT_LEASE_OWNER);
  off();
  assert.equal(registered.size, 0);
  await lease.stop({ release: false });
});

test("onTool: a handler not marked read-only is treated as a mutation (MCP default)", async () => {
  const { server, lease } = setup();
  server.takeoverBy("t-other");
  await lease.start();
  const registered = new Map();
  bindOnTool(lease, { onTool: (n, f) => registered.set(n, f) }, { handlers: { mystery: () => "ran" } });
  assert.equal((await registered.get("mystery")({})).error.code, NOT_LEASE_OWNER);
  await lease.stop({ release: false });
});

test("onTool with tools: a name in none of them, or disabled there, answers TOOL_UNAVAILABLE", async () => {
  const { lease } = setup();
  await lease.start();
  const registered = new Map();
  const tools = [...TOOLS.filter((t) => t.name !== "save_event"), { ...TOOLS.find((t) => t.name === "save_event"), disabled: true }];
  bindOnTool(lease, { onTool: (n, f) => registered.set(n, f) }, { handlers: { ...handlers, mystery: () => "ran" }, tools });
  for (const name of ["mystery", "save_event"]) {
    const res = await registered.get(name)({ event_id: "evt-1" });
    assert.equal(res.error?.code, "TOOL_UNAVAILABLE", name);
    assert.equal(res.error.details.tool, name);
  }
  assert.deepEqual(await registered.get("get_event")({ event_id: "evt-1" }), { id: "evt-1" });
  await lease.stop({ release: false });
});
