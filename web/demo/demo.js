// The two-tab demo of tablease: an events app whose agent tools are split by the lease. Open
// /demo in two tabs: one controls the session (owner), the other reads (viewer) and can take
// control with "Use here". The events "backend" lives in localStorage so both tabs see one store,
// and it fences writes with the lease epoch (docs/fencing.md): a write under an older epoch than
// one that already wrote is refused.
import { NOT_LEASE_OWNER, TabLease, bindOnTool, registerWebMCPTools, syncToolRegistry } from "/sdk/tablease.js";

const params = new URLSearchParams(location.search);
const sessionId = params.get("session") || "demo";
const sub = params.get("sub") || "demo";
const baseUrl = params.get("base") || "";
const streamMode = params.get("stream") === "ticket" ? "ticket" : "fetch"; // ?stream=ticket tries EventSource

const $ = (sel) => document.querySelector(sel);
const field = (name) => document.querySelector(`[data-field="${name}"]`);
const action = (name) => document.querySelector(`[data-action="${name}"]`);

// --- the tools: the same definitions as web/demo/catalog.json -----------------------------------

export const DEMO_TOOLS = [
  {
    name: "search_events",
    description: "Search the public events by words in their name, place or tags. Returns ids to use with get_event.",
    inputSchema: { type: "object", properties: { q: { type: "string", description: "Words to look for; empty lists everything." } }, additionalProperties: false },
    annotations: { readOnlyHint: true, title: "Search events" },
  },
  {
    name: "get_event",
    description: "Details of one event: name, date, place, seats left, and whether it is in the user's list.",
    inputSchema: { type: "object", properties: { event_id: { type: "string", description: "An id from search_events." } }, required: ["event_id"], additionalProperties: false },
    annotations: { readOnlyHint: true, title: "Event details" },
  },
  {
    name: "save_event",
    description: "Save an event to the user's list.",
    inputSchema: { type: "object", properties: { event_id: { type: "string" } }, required: ["event_id"], additionalProperties: false },
    annotations: { readOnlyHint: false, destructiveHint: false, idempotentHint: true, title: "Save event" },
  },
  {
    name: "rename_event",
    description: "Rename an event in the user's list.",
    inputSchema: { type: "object", properties: { event_id: { type: "string" }, name: { type: "string", minLength: 1, maxLength: 120 } }, required: ["event_id", "name"], additionalProperties: false },
    annotations: { readOnlyHint: false, destructiveHint: true, idempotentHint: true, title: "Rename event" },
  },
];

// --- the "backend": one store per user and session, shared by the tabs through localStorage ----

const SEED = [
  { id: "evt-webmcp-intro", name: "WebMCP intro workshop", date: "2027-01-23", place: "Taipei Frontend Co-learning Space", seats: 8, tags: ["webmcp", "agents", "taipei"] },
  { id: "evt-a11y-night", name: "Accessibility night", date: "2027-02-04", place: "Kaohsiung Design Hub", seats: 20, tags: ["a11y", "design"] },
  { id: "evt-edge-cache", name: "Caching at the edge", date: "2027-02-18", place: "Online", seats: 120, tags: ["http", "cdn"] },
  { id: "evt-ts-types", name: "Types for tool schemas", date: "2027-03-02", place: "Taichung Makers", seats: 0, tags: ["typescript", "webmcp", "json-schema"] },
  { id: "evt-lease-talk", name: "Fencing tokens in practice", date: "2027-03-15", place: "Taipei Frontend Co-learning Space", seats: 35, tags: ["distributed", "locks", "taipei"] },
];

const storeKey = `tablease-demo:${sub}:${sessionId}`;

function loadStore() {
  try {
    const s = JSON.parse(localStorage.getItem(storeKey));
    if (s && Array.isArray(s.events)) return s;
  } catch {}
  return { events: SEED.map((e) => ({ ...e })), saved: [], fence: {} };
}

function saveStore(s) {
  localStorage.setItem(storeKey, JSON.stringify(s));
}

const backend = {
  search(q) {
    const words = String(q ?? "").toLowerCase().split(/\s+/).filter(Boolean);
    const s = loadStore();
    return s.events
      .filter((e) => words.every((w) => [e.name, e.place, ...e.tags].join(" ").toLowerCase().includes(w)))
      .map((e) => ({ event_id: e.id, name: e.name, date: e.date, saved: s.saved.includes(e.id) }));
  },
  get(id) {
    const s = loadStore();
    const e = s.events.find((x) => x.id === id);
    return e ? { event_id: e.id, name: e.name, date: e.date, place: e.place, seats_left: e.seats, saved: s.saved.includes(e.id) } : null;
  },
  // A write under epoch e is accepted only when e >= the highest epoch that wrote this event, and
  // records e in the same step (here: one synchronous localStorage update).
  write(id, epoch, change) {
    const s = loadStore();
    const e = s.events.find((x) => x.id === id);
    if (!e) return { error: { code: "NOT_FOUND", message: `No event ${id}.`, retryable: false } };
    const seen = s.fence[id] ?? 0;
    if (epoch < seen) {
      return { error: { code: "LEASE_LOST", message: "A newer controlling tab has written this event; this write was refused by the fence.", retryable: false, details: { epoch, fencedAt: seen } } };
    }
    change(s, e);
    s.fence[id] = epoch;
    saveStore(s);
    return null;
  },
};

// The tool handlers. Mutation handlers get the lease context {epoch, token} from lease.guard and
// hand the epoch to the backend, as a real app would send it (with the token as Tablease-Lease).
const handlers = {
  search_events: async ({ q = "" } = {}) => ({ events: backend.search(q) }),
  get_event: async ({ event_id } = {}) => {
    const e = backend.get(event_id);
    return e ?? { error: { code: "NOT_FOUND", message: `No event ${event_id}; use an id from search_events.`, retryable: false } };
  },
  save_event: async ({ event_id } = {}, lease) => {
    const err = backend.write(event_id, lease.epoch, (s) => {
      if (!s.saved.includes(event_id)) s.saved.push(event_id);
    });
    return err ?? { saved: true, event_id, epoch: lease.epoch };
  },
  rename_event: async ({ event_id, name } = {}, lease) => {
    const n = String(name ?? "").trim();
    if (!n || n.length > 120) return { error: { code: "INVALID_ARGUMENT", message: "name must be 1–120 characters.", retryable: false } };
    const err = backend.write(event_id, lease.epoch, (s, e) => {
      e.name = n;
    });
    return err ?? { renamed: true, event_id, name: n, epoch: lease.epoch };
  },
};

// --- routing (in the hash, so /demo serves every route) ----------------------------------------

function route() {
  const r = location.hash.replace(/^#/, "");
  return /^\/events(\/[A-Za-z0-9._-]+)?$/.test(r) ? r : "/events";
}

function currentEventId() {
  const m = route().match(/^\/events\/(.+)$/);
  return m ? m[1] : null;
}

// --- the token ------------------------------------------------------------------------------

let token = null;

async function devToken() {
  const res = await fetch(`${baseUrl}/dev/token?sub=${encodeURIComponent(sub)}`, { cache: "no-store" });
  if (!res.ok) throw new Error(`/dev/token answered ${res.status}`);
  const body = await res.json();
  return body.token;
}

async function firstToken() {
  try {
    return await devToken();
  } catch {
    const form = $("#token-form");
    form.hidden = false;
    return new Promise((resolve) => {
      form.addEventListener("submit", (e) => {
        e.preventDefault();
        const t = field("token").value.trim();
        if (!t) return;
        form.hidden = true;
        resolve(t);
      });
    });
  }
}

async function getToken({ refresh } = {}) {
  if (refresh) {
    try {
      token = await devToken();
    } catch {}
  }
  return token;
}

// --- the page -------------------------------------------------------------------------------

let lease = null;
let results = [];

function setRole(role) {
  if (document.body.dataset.role !== role) document.body.dataset.role = role;
}

function fmtMs(ms) {
  if (ms == null) return "—";
  return `${(ms / 1000).toFixed(ms < 10000 ? 1 : 0)} s`;
}

function renderStatus() {
  if (!lease) return;
  const l = lease.lease;
  setRole(l.role); // body.dataset.role is owner or viewer at all times
  field("role").textContent = l.role;
  const h = l.held && l.holder ? l.holder : null;
  field("holder").textContent = h ? (h.tabId === lease.tabId ? `this tab (${h.label || "no label"})` : `${h.label || h.tabId}${h.hidden ? " · hidden" : ""}`) : "nobody";
  field("holder").title = h ? h.tabId : "";
  const other = h && h.tabId !== lease.tabId;
  field("holder-label").textContent = other ? ` — “${h.label || h.tabId}”` : "";
  if (other) {
    field("banner-title").textContent = "Controlled in another tab";
    field("banner-text").textContent = "Reading stays on here; changes are made in the controlling tab.";
  } else if (h) {
    field("banner-title").textContent = "Confirming control";
    field("banner-text").textContent = "This tab holds the lease but is read-only until the server confirms it.";
  } else {
    field("banner-title").textContent = "No tab controls this session";
    field("banner-text").textContent = "Reading stays on; take control to make changes here.";
  }
  field("epoch").textContent = l.epoch ? String(l.epoch) : "—";
  field("time-left").textContent = l.role === "owner" ? fmtMs(l.remainingMs) : l.held && l.remainingMs != null ? `${fmtMs(l.remainingMs)} (holder's)` : "—";
  field("stream").textContent = lease.streamLive ? "live" : "reconnecting (read-only until confirmed)";
  field("tab-id").textContent = lease.tabId;
  const owner = l.role === "owner";
  action("save-event").disabled = !owner || !currentEventId();
  $("#rename-form button").disabled = !owner;
}

function log(text) {
  const li = document.createElement("li");
  li.textContent = `${new Date().toLocaleTimeString()} ${text}`;
  const ol = field("log");
  ol.prepend(li);
  while (ol.children.length > 40) ol.lastChild.remove();
}

function show(el, text, bad = false) {
  el.hidden = !text;
  el.textContent = text ?? "";
  el.classList.toggle("bad", bad);
}

function renderResults() {
  const ul = $("#results");
  ul.replaceChildren();
  for (const e of results) {
    const li = document.createElement("li");
    const left = document.createElement("div");
    const name = document.createElement("div");
    name.textContent = e.name;
    const meta = document.createElement("div");
    meta.className = "meta";
    meta.textContent = `${e.date} · ${e.event_id}`;
    left.append(name, meta);
    if (e.saved) {
      const mark = document.createElement("span");
      mark.className = "saved-mark";
      mark.textContent = "saved";
      meta.append(" · ", mark);
    }
    const open = document.createElement("button");
    open.type = "button";
    open.textContent = "Details";
    open.dataset.action = "open-event";
    open.dataset.eventId = e.event_id;
    open.addEventListener("click", () => (location.hash = `#/events/${e.event_id}`));
    li.append(left, open);
    ul.append(li);
  }
  if (results.length === 0) ul.innerHTML = '<li class="muted">No events.</li>';
}

async function runSearch(q) {
  const r = await handlers.search_events({ q });
  results = r.events;
  renderResults();
}

async function renderDetail() {
  const id = currentEventId();
  const box = $("#detail");
  $("#rename-form").hidden = !id;
  action("back").hidden = !id;
  if (!id) {
    box.innerHTML = '<p class="muted">Pick an event.</p>';
    renderStatus();
    return;
  }
  const e = await handlers.get_event({ event_id: id });
  if (e.error) {
    box.textContent = e.error.message;
    return;
  }
  const dl = document.createElement("dl");
  for (const [k, v] of [["Name", e.name], ["Date", e.date], ["Place", e.place], ["Seats left", String(e.seats_left)], ["In my list", e.saved ? "yes" : "no"], ["Id", e.event_id]]) {
    const dt = document.createElement("dt");
    dt.textContent = k;
    const dd = document.createElement("dd");
    dd.textContent = v;
    dd.dataset.field = "event-" + k.toLowerCase().replace(/\s+/g, "-");
    dl.append(dt, dd);
  }
  box.replaceChildren(dl);
  renderStatus();
}

function refreshViews() {
  runSearch($("#search-form").q.value);
  renderDetail();
}

// Calls a tool as the agent would: through the onTool registry (bindOnTool), where mutation
// handlers are guarded.
const registry = new Map();
const session = {
  onTool(name, fn) {
    registry.set(name, fn);
    return () => registry.delete(name);
  },
};

async function callTool(name, args) {
  const fn = registry.get(name);
  if (!fn) return { error: { code: "UNKNOWN_TOOL", message: `No tool ${name}.`, retryable: false } };
  const res = await fn(args, { toolRequestId: "manual-" + Date.now(), tool: name, sessionId });
  if (!res?.error) refreshViews();
  return res;
}

function describeError(res) {
  if (res?.error?.code === NOT_LEASE_OWNER) return `Refused: ${res.error.message}`;
  return res?.error ? `${res.error.code}: ${res.error.message}` : null;
}

// --- wiring -----------------------------------------------------------------------------------

async function main() {
  setRole("viewer");
  field("session").textContent = sessionId;
  token = await firstToken();

  lease = new TabLease({
    baseUrl,
    sessionId,
    getToken,
    label: () => `Events — ${route()}`,
    stream: streamMode,
  });
  window.tablease = lease; // for the console and end-to-end tests

  lease.on("rolechange", ({ role, reason }) => {
    renderStatus();
    log(`role → ${role} (${reason})`);
  });
  lease.on("lease", ({ event }) => {
    renderStatus();
    if (event && event.type !== "snapshot") {
      const who = event.holder ? event.holder.label || event.holder.tabId : "nobody";
      log(`${event.type} · epoch ${event.epoch} · holder ${who}`);
    }
  });
  lease.on("stream", ({ live }) => {
    renderStatus();
    log(live ? "event stream connected" : "event stream down");
  });
  lease.on("handoff", (d) => {
    const note = field("handoff-status");
    const ownerNote = field("owner-note");
    switch (d.phase) {
      case "requested":
        show(ownerNote, "Another tab asked for control: handing over as soon as no change is running…");
        break;
      case "released":
        show(ownerNote, "");
        break;
      case "requesting":
      case "waiting":
        show(note, "Asked the controlling tab to hand over…");
        break;
      case "granted":
        show(note, "");
        break;
      case "timeout":
        show(note, "The other tab did not answer. “Use here” takes control anyway.", true);
        break;
      case "failed":
        show(note, `Could not ask for control: ${d.error?.message ?? "error"}`, true);
        break;
      default:
        show(note, "");
    }
    log(`handoff: ${d.phase}`);
  });
  lease.on("error", ({ error }) => log(`error: ${error.code} ${error.message}`));

  bindOnTool(lease, session, { handlers, tools: DEMO_TOOLS });

  // What an agent sees now, through the registry.sync pattern and WebMCP when the browser has it.
  const exposed = { sync: (defs) => (field("exposed").textContent = defs.map((d) => d.name).join(", ") || "—") };
  const reg = syncToolRegistry(lease, exposed, { handlers, tools: DEMO_TOOLS, route });
  const webmcp = registerWebMCPTools(lease, {
    handlers,
    tools: DEMO_TOOLS,
    route,
    onChange: (names) => (field("webmcp").textContent = `WebMCP: registered ${names.join(", ") || "nothing"}`),
    onError: (e) => log(`tools: ${e?.message ?? e}`),
  });
  if (!webmcp.available) field("webmcp").textContent = "WebMCP: not available in this browser; the agent panel calls the same tools.";

  action("use-here").addEventListener("click", async () => {
    try {
      await lease.takeover();
    } catch (e) {
      show(field("handoff-status"), `Could not take control: ${e.message}`, true);
    }
    renderStatus();
  });
  action("request-handoff").addEventListener("click", () => lease.requestHandoff());
  action("release").addEventListener("click", () => lease.release());

  $("#search-form").addEventListener("submit", (e) => {
    e.preventDefault();
    runSearch(e.target.q.value);
  });
  action("back").addEventListener("click", () => (location.hash = "#/events"));
  action("save-event").addEventListener("click", async () => {
    const res = await callTool("save_event", { event_id: currentEventId() });
    show(field("detail-result"), describeError(res) ?? "Saved to your list.", Boolean(res?.error));
  });
  $("#rename-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const res = await callTool("rename_event", { event_id: currentEventId(), name: e.target.name.value });
    show(field("detail-result"), describeError(res) ?? `Renamed to “${res.name}”.`, Boolean(res?.error));
    if (!res?.error) e.target.name.value = "";
  });

  const examples = {
    search_events: { q: "webmcp" },
    get_event: { event_id: "evt-webmcp-intro" },
    save_event: { event_id: "evt-webmcp-intro" },
    rename_event: { event_id: "evt-webmcp-intro", name: "WebMCP intro workshop (renamed)" },
  };
  field("tool").addEventListener("change", (e) => (field("args").value = JSON.stringify(examples[e.target.value])));
  $("#agent-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const out = field("agent-result");
    let args;
    try {
      args = JSON.parse(field("args").value || "{}");
    } catch {
      out.textContent = "The arguments are not JSON.";
      out.classList.add("bad");
      return;
    }
    const name = field("tool").value;
    const res = await callTool(name, args);
    out.textContent = `${name}(${JSON.stringify(args)})\n→ ${JSON.stringify(res, null, 2)}`;
    out.classList.toggle("bad", Boolean(res?.error));
    out.dataset.code = res?.error?.code ?? "ok";
    log(`agent: ${name} → ${res?.error ? res.error.code : "ok"}`);
  });

  window.addEventListener("hashchange", () => {
    renderDetail();
    lease.setLabel(() => `Events — ${route()}`);
    reg.sync();
    webmcp.sync();
  });
  window.addEventListener("storage", (e) => {
    if (e.key === storeKey) refreshViews();
  });

  await runSearch("");
  await renderDetail();
  await lease.start();
  renderStatus();
  reg.sync();
  webmcp.sync();
  setInterval(renderStatus, 250);
}

main().catch((e) => {
  console.error(e);
  log(`start failed: ${e.message}`);
});
