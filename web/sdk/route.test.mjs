// Route-bound tools: route patterns in the browser, SPA navigation, and the registry following
// the route (list → detail → another detail → list): `node --test web/sdk/`.
import assert from "node:assert/strict";
import { test } from "node:test";

import { RouteTracker, TabLease, bindOnTool, matchRoute, registerWebMCPTools, syncToolRegistry } from "./tablease.js";
import { profileMatch } from "./route.js";
import { FakeBrowserWindow, FakeClock, FakeServer, fakeOptions, flush } from "./fakes.mjs";

// The demo's profiles (seed 003): the list page asks for an id, the detail page is bound to its
// event and takes {}.
const TOOLS = [
  { name: "search_events", description: "Search.", inputSchema: { type: "object", properties: { q: { type: "string" } }, additionalProperties: false }, annotations: { readOnlyHint: true }, routes: ["/events"] },
  {
    name: "get_event_details",
    description: "Details of an event by id.",
    inputSchema: { type: "object", properties: { event_id: { type: "string" } }, required: ["event_id"], additionalProperties: false },
    annotations: { readOnlyHint: true },
    routes: ["/events"],
  },
  { name: "get_event_details", description: "Details of this event.", inputSchema: { type: "object", additionalProperties: false }, annotations: { readOnlyHint: true }, routes: ["/events/:event_id"] },
  { name: "rename_event", description: "Rename this event.", inputSchema: { type: "object", properties: { event_id: { type: "string" }, name: { type: "string", minLength: 1 } }, required: ["name"], additionalProperties: false }, routes: ["/events/:event_id"] },
  { name: "help", description: "What this page does.", annotations: { readOnlyHint: true } },
];

const handlers = {
  search_events: ({ q = "" }) => ({ q }),
  get_event_details: (args, ctx) => ({ event_id: args.event_id ?? ctx.params.event_id, route: ctx.route, params: ctx.params }),
  rename_event: (args, ctx) => ({ renamed: args.event_id, name: args.name, epoch: ctx.epoch }),
  help: () => ({ help: true }),
};

class ModelContext {
  constructor() {
    this.tools = new Map();
    this.log = [];
  }

  registerTool(tool, { signal } = {}) {
    if (this.tools.has(tool.name)) return Promise.reject(new DOMException("duplicate " + tool.name, "InvalidStateError"));
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

function setup(path = "/events") {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock, { tools: TOOLS });
  const window = new FakeBrowserWindow(path);
  const lease = new TabLease(fakeOptions(server, clock, { window }));
  return { clock, server, window, lease };
}

test("route patterns match as the server's do, with named parameters", () => {
  assert.deepEqual(matchRoute("/events/:event_id", "/events/evt-1"), { event_id: "evt-1" });
  assert.deepEqual(matchRoute("/events/:event_id", "/events/evt%201/"), { event_id: "evt 1" });
  assert.equal(matchRoute("/events/:event_id", "/events"), null);
  assert.equal(matchRoute("/events/:event_id", "/events/evt-1/edit"), null);
  assert.deepEqual(matchRoute("/events/*", "/events/a/b?x=1#y"), { "*": "a/b" });
  assert.deepEqual(matchRoute("/", "/"), {});
  assert.equal(matchRoute("/events/", "/events"), null, "an invalid pattern matches nothing");
  const tool = { routes: ["/events/*", "/events/:event_id", "/events/new"] };
  assert.deepEqual(profileMatch(tool, "/events/new"), { pattern: "/events/new", params: {} }, "a literal beats a parameter");
  assert.deepEqual(profileMatch(tool, "/events/evt-1"), { pattern: "/events/:event_id", params: { event_id: "evt-1" } });
  assert.deepEqual(profileMatch(tool, "/events/evt-1/edit").pattern, "/events/*");
  assert.deepEqual(profileMatch({}, "/anything"), { pattern: null, params: {} }, "no routes: every route");
});

test("RouteTracker follows pushState, replaceState and popstate, counts changes once, and takes the app's word", () => {
  const window = new FakeBrowserWindow("/app/events");
  const tracker = new RouteTracker({ window, base: "/app" });
  const seen = [];
  tracker.on("change", (d) => seen.push(`${d.previous}→${d.route}#${d.generation}`));
  assert.equal(tracker.route, "/events");
  window.history.pushState(null, "", "/app/events/evt-1");
  window.history.pushState(null, "", "/app/events/evt-1/"); // the same route again: no change
  window.history.replaceState(null, "", "/app/events/evt-2");
  window.history.back(); // to the first /app/events/evt-1
  assert.equal(tracker.navigated("/events/evt-9"), true);
  assert.equal(tracker.navigated("/events/evt-9"), false);
  assert.deepEqual(seen, ["/events→/events/evt-1#1", "/events/evt-1→/events/evt-2#2", "/events/evt-2→/events/evt-1#3", "/events/evt-1→/events/evt-9#4"]);
  tracker.close();
  window.history.pushState(null, "", "/app/other");
  assert.equal(seen.length, 4, "a closed tracker follows nothing");
});

test("RouteTracker follows the Navigation API where the browser has it", async () => {
  const window = new FakeBrowserWindow("/events");
  window.navigation = new EventTarget();
  const tracker = new RouteTracker({ window });
  const seen = [];
  tracker.on("change", (d) => seen.push(d.route));
  // A router that intercepts navigate: the URL changes after the event, the entry then changes.
  window.navigation.dispatchEvent(new Event("navigate"));
  window.location.pathname = "/events/evt-1";
  await Promise.resolve();
  assert.deepEqual(seen, ["/events/evt-1"], "read again after the navigate event");
  window.location.pathname = "/events/evt-2";
  window.navigation.dispatchEvent(new Event("currententrychange"));
  assert.deepEqual(seen, ["/events/evt-1", "/events/evt-2"]);
  tracker.close();
});

test("onTool runs the profile of the current page and refuses a tool the page does not offer", async () => {
  const { window, lease } = setup("/events");
  await lease.start();
  const registered = new Map();
  const off = bindOnTool(lease, { onTool: (n, f) => registered.set(n, f) }, { handlers, tools: TOOLS });
  const get = registered.get("get_event_details");
  assert.equal((await get({})).error.code, "INVALID_ARGUMENT", "the list's profile requires event_id");
  assert.equal((await get({ event_id: "evt-7" })).event_id, "evt-7");
  const rename = await registered.get("rename_event")({ name: "x" });
  assert.equal(rename.error.code, "TOOL_UNAVAILABLE");
  assert.deepEqual(rename.error.details, { tool: "rename_event", route: "/events" });
  window.history.pushState(null, "", "/events/evt-3");
  assert.equal((await get({})).event_id, "evt-3", "the same registration runs the event page's profile");
  assert.equal((await get({ event_id: "evt-4" })).error.code, "ENTITY_MISMATCH");
  assert.deepEqual(await registered.get("rename_event")({ name: "New" }), { renamed: "evt-3", name: "New", epoch: lease.epoch });
  assert.equal(off.route, "/events/evt-3");
  assert.equal(off.routeTracker.route, "/events/evt-3");
  const generation = off.generation;
  await off.documentChanged();
  assert.equal(off.generation, generation + 1, "documentChanged() counts a generation, as on the other bridges");
  off();
  await lease.stop({ release: false });
});

test("WebMCP follows SPA navigation: list → detail → another detail → list, and a retired tool's call is refused", async () => {
  const { window, lease } = setup("/events");
  const mc = new ModelContext();
  await lease.start();
  const bridge = registerWebMCPTools(lease, { modelContext: mc, handlers });
  await bridge.sync();
  assert.deepEqual(mc.names(), ["get_event_details", "help", "search_events"]);
  const listDetails = mc.tools.get("get_event_details");
  assert.equal((await listDetails.execute({}, {})).error.code, "INVALID_ARGUMENT", "the list profile requires event_id");

  window.history.pushState(null, "", "/events/evt-1");
  assert.deepEqual(mc.names(), ["help"], "the list's tools are unregistered at once, before the catalog is read again");
  assert.equal((await listDetails.execute({ event_id: "evt-1" }, {})).error.code, "ROUTE_CHANGED");
  await bridge.sync();
  assert.deepEqual(mc.names(), ["get_event_details", "help", "rename_event"]);
  const detail1 = mc.tools.get("get_event_details");
  assert.deepEqual(await detail1.execute({}, {}), { event_id: "evt-1", route: "/events/evt-1", params: { event_id: "evt-1" } });
  const log = mc.log.length;
  window.history.replaceState(null, "", "/events/evt-1"); // the same route rendered again
  await bridge.sync();
  assert.equal(mc.log.length, log, "re-rendering the same route registers nothing twice");

  window.history.pushState(null, "", "/events/evt-2");
  await bridge.sync();
  assert.deepEqual(mc.names(), ["get_event_details", "help", "rename_event"]);
  assert.notEqual(mc.tools.get("get_event_details"), detail1, "another event is another instance");
  const stale = await detail1.execute({}, {});
  assert.equal(stale.error.code, "ROUTE_CHANGED", "evt-1's instance never runs on evt-2's page");
  assert.deepEqual(stale.error.details, { tool: "get_event_details", route: "/events/evt-1", currentRoute: "/events/evt-2" });
  assert.ok(!mc.log.includes("-help"), `a tool on every route stays registered across routes: ${mc.log}`);

  window.history.back(); // evt-1 again: detail1 was retired all the same
  const again = await detail1.execute({}, {});
  assert.equal(again.error.details.currentRoute, "/events/evt-1", "the route shown now, not when it was retired");
  assert.match(again.error.message, /an earlier showing of the page \/events\/evt-1/);
  window.history.back();
  assert.equal((await detail1.execute({}, {})).error.details.currentRoute, "/events");
  await bridge.sync();
  assert.deepEqual(mc.names(), ["get_event_details", "help", "search_events"]);
  assert.equal(bridge.route, "/events");
  assert.equal(bridge.generation >= 4, true);
  bridge.close();
  assert.deepEqual(mc.names(), []);
  await lease.stop({ release: false });
});

test("on a detail page {} and the same id mean this event, another id is ENTITY_MISMATCH, bad input INVALID_ARGUMENT", async () => {
  const { lease } = setup("/events/evt-1");
  await lease.start();
  let defs = [];
  const reg = syncToolRegistry(lease, { sync: (d) => (defs = d) }, { handlers });
  await reg.sync();
  const get = defs.find((d) => d.name === "get_event_details");
  const rename = defs.find((d) => d.name === "rename_event");
  assert.deepEqual(get.params, { event_id: "evt-1" });
  assert.equal((await get.execute({}, {})).event_id, "evt-1");
  assert.equal((await get.execute({ event_id: "evt-1" }, {})).event_id, "evt-1");
  assert.equal((await get.execute({ event_id: null }, {})).event_id, "evt-1", "null is left out");
  const other = await get.execute({ event_id: "evt-2" }, {});
  assert.equal(other.error.code, "ENTITY_MISMATCH");
  assert.deepEqual(other.error.details, { param: "event_id", current: "evt-1", given: "evt-2" });
  assert.equal((await get.execute({ q: "x" }, {})).error.code, "INVALID_ARGUMENT");
  // A schema that declares the bound property gets it filled in for the handler.
  assert.deepEqual(await rename.execute({ name: "New" }, {}), { renamed: "evt-1", name: "New", epoch: lease.epoch });
  const bad = await rename.execute({ name: "" }, {});
  assert.equal(bad.error.code, "INVALID_ARGUMENT");
  assert.equal(bad.error.details.path, "name");
  assert.equal((await rename.execute({ name: 5 }, {})).error.message, "name must be string, not integer.");
  reg.close();
  await lease.stop({ release: false });
});

test("a router that rewrites the URL of the entity shown keeps its route-bound tools callable", async () => {
  const { window, lease } = setup("/events/a%3Ab");
  await lease.start();
  let defs = [];
  const reg = syncToolRegistry(lease, { sync: (d) => (defs = d) }, { handlers });
  await reg.sync();
  const get = defs.find((d) => d.name === "get_event_details");
  assert.deepEqual(get.params, { event_id: "a:b" });
  window.history.replaceState(null, "", "/events/a:b"); // the same event, its URL tidied
  await reg.sync();
  assert.equal((await get.execute({}, {})).event_id, "a:b");
  assert.ok(defs.includes(get), "the same instance stays registered");
  window.history.pushState(null, "", "/events/a:c");
  assert.equal((await get.execute({}, {})).error?.code, "ROUTE_CHANGED", "another event is another page");
  reg.close();
  await lease.stop({ release: false });
});

test("a route parameter bound to a number property is the number: {}, the number and its string are the current entity", async () => {
  const items = [{ name: "get_item", description: "This item.", inputSchema: { type: "object", properties: { id: { type: "integer" } } }, annotations: { readOnlyHint: true }, routes: ["/items/:id"] }];
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock, { tools: items });
  const window = new FakeBrowserWindow("/items/42");
  const lease = new TabLease(fakeOptions(server, clock, { window }));
  await lease.start();
  let defs = [];
  const reg = syncToolRegistry(lease, { sync: (d) => (defs = d) }, { handlers: { get_item: (args) => ({ id: args.id }) } });
  await reg.sync();
  const get = defs.find((d) => d.name === "get_item");
  assert.deepEqual(await get.execute({}, {}), { id: 42 });
  assert.deepEqual(await get.execute({ id: 42 }, {}), { id: 42 });
  assert.deepEqual(await get.execute({ id: "42" }, {}), { id: 42 });
  const other = await get.execute({ id: 7 }, {});
  assert.equal(other.error?.code, "ENTITY_MISMATCH");
  assert.deepEqual(other.error.details, { param: "id", current: 42, given: 7 });
  window.history.pushState(null, "", "/items/007"); // leading zeros: the same digits' number
  await reg.sync();
  assert.deepEqual(await defs.find((d) => d.name === "get_item").execute({}, {}), { id: 7 });
  reg.close();
  await lease.stop({ release: false });
});

test("catalog() sends a route as the server takes it: encoded, and none over 2048 bytes; an outage on a new route keeps the tools of every route", async () => {
  const { window, server, lease } = setup("/events");
  await lease.start();
  const routes = () => server.callsTo("GET", "/catalog").map((c) => c.query.route ?? null);
  assert.deepEqual((await lease.catalog("/events/my event")).tools.map((t) => t.name).sort(), ["get_event_details", "help", "rename_event"]);
  assert.deepEqual((await lease.catalog("/événements")).tools.map((t) => t.name), ["help"]);
  assert.deepEqual((await lease.catalog("/events/" + "x".repeat(2100))).tools.map((t) => t.name), ["help"]);
  assert.deepEqual(routes(), ["/events/my%20event", "/%C3%A9v%C3%A9nements", null]);

  let defs = [];
  const reg = syncToolRegistry(lease, { sync: (d) => (defs = d) }, { handlers });
  await reg.sync();
  assert.deepEqual(defs.map((d) => d.name).sort(), ["get_event_details", "help", "search_events"]);
  server.down = true;
  window.history.pushState(null, "", "/events/evt-9"); // never read
  await reg.sync();
  assert.deepEqual(defs.map((d) => d.name), ["help"], "the tool without routes stays");
  reg.close();
  await lease.stop({ release: false });
});

test("a navigation while the catalog is read registers nothing for the page that was left", async () => {
  const { window, lease } = setup("/events/evt-1");
  await lease.start();
  const synced = [];
  const reg = syncToolRegistry(lease, { sync: (d) => synced.push(d.map((x) => `${x.name}@${x.route}`)) }, { handlers });
  const first = reg.sync(); // reads the catalog for /events/evt-1 …
  window.history.pushState(null, "", "/events/evt-2"); // … while the user moves on
  await first;
  await flush();
  assert.ok(synced.length > 0);
  for (const names of synced) {
    assert.ok(!names.some((n) => n.endsWith("@/events/evt-1")), `an instance of the page left was exposed: ${names}`);
  }
  assert.deepEqual(synced.at(-1).sort(), ["get_event_details@/events/evt-2", "help@null", "rename_event@/events/evt-2"]);
  reg.close();
  await lease.stop({ release: false });
});

test("registry.sync drops the instances a route change retired at once, and sync() brings the new route's", async () => {
  const { window, lease } = setup("/events/evt-1");
  await lease.start();
  const synced = [];
  const reg = syncToolRegistry(lease, { sync: (d) => synced.push(d.map((x) => `${x.name}@${x.route}`)) }, { handlers });
  await reg.sync();
  assert.deepEqual(synced.at(-1).sort(), ["get_event_details@/events/evt-1", "help@null", "rename_event@/events/evt-1"]);
  window.history.pushState(null, "", "/events");
  assert.deepEqual(synced.at(-1), ["help@null"], "synchronously on the navigation");
  await reg.sync();
  await flush();
  assert.deepEqual(synced.at(-1).sort(), ["get_event_details@/events", "help@null", "search_events@/events"]);
  reg.close();
  await lease.stop({ release: false });
});

test("a page's life of navigations keeps no log of generations; a call that runs across them still sees them", async () => {
  const { window, lease } = setup("/events/evt-0");
  const mc = new ModelContext();
  await lease.start();
  let finish;
  let seen;
  const bridge = registerWebMCPTools(lease, {
    modelContext: mc,
    handlers: {
      ...handlers,
      help: async (args, ctx) => {
        await new Promise((resolve) => (finish = resolve));
        seen = ctx;
        return { current: ctx.isCurrent() };
      },
    },
  });
  await bridge.sync();
  const scope = bridge._scope;
  const go = (from, to) => {
    for (let i = from; i <= to; i++) window.history.pushState(null, "", `/events/evt-${i}`);
  };
  go(1, 1000);
  assert.equal(bridge.generation, 1000);
  assert.equal(scope._changes.length, 0, "no call runs: no change is kept");

  // help has no routes: route changes are not its, a document change is.
  let call = mc.tools.get("help").execute({}, {});
  await flush();
  go(1001, 1500);
  assert.deepEqual(scope._changes.map((c) => [c.reason, c.n]), [["route", 500]], "the changes since the running call started are kept, as one run of route changes");
  finish();
  assert.deepEqual(await call, { current: true }, "500 route changes later, the call is current");
  await flush();
  assert.equal(scope._changes.length, 0, "its handler settled: nothing is kept");

  call = mc.tools.get("help").execute({}, {});
  await flush();
  go(1501, 1700);
  await bridge.documentChanged();
  finish();
  assert.deepEqual(await call, { current: false }, "the document change 200 route changes later is seen");
  await flush();
  assert.equal(scope._changes.length, 0);
  assert.equal(seen.isCurrent(), false, "asked after its handler settled, a change since its start still counts");
  assert.equal(bridge.generation, 1701);
  bridge.close();
  await lease.stop({ release: false });
});
