// The two-tab demo of tablease: an events app whose agent tools are split by the lease. Open
// /demo in two tabs: one controls the session (owner), the other reads (viewer) and can take
// control with "Use here". The events "backend" lives in localStorage so both tabs see one store,
// and it fences writes with the lease epoch (docs/fencing.md): a write under an older epoch than
// one that already wrote is refused.
//
// It is a single-page app with two pages, /demo/events (the list) and /demo/events/{id} (one
// event), reached with history.pushState. Its tools are route profiles (web/demo/catalog.json):
// on the list get_event_details asks for an id, on an event's page it takes {} and means that
// event. ask_user asks the user in a modal, with a Cancel button and its deadline shown.
import { NOT_LEASE_OWNER, RouteTracker, TabLease, bindOnTool, registerWebMCPTools, syncToolRegistry } from "/sdk/tablease.js";

const params = new URLSearchParams(location.search);
const sessionId = params.get("session") || "demo";
const sub = params.get("sub") || "demo";
const baseUrl = sameOriginBase(params.get("base")); // ?base= may name only this page's origin (a path on it)
const streamMode = params.get("stream") === "ticket" ? "ticket" : "fetch"; // ?stream=ticket tries EventSource
const socket = params.get("socket") !== "false"; // ?socket=false: renews and checks over HTTP only

// A link must not point the demo's requests, and the tokens they carry, at another server: a base
// of another origin is ignored.
function sameOriginBase(base) {
  try {
    const u = new URL(base || "", location.href);
    return base && u.origin === location.origin ? u.origin + u.pathname.replace(/\/+$/, "") : "";
  } catch {
    return "";
  }
}

const $ = (sel) => document.querySelector(sel);
const field = (name) => document.querySelector(`[data-field="${name}"]`);
const action = (name) => document.querySelector(`[data-action="${name}"]`);

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

// The tool handlers. They get the call's context from the client: the route's params (on an
// event's page, params.event_id is that event), and for mutations the lease context {epoch, token}
// from lease.guard, whose epoch they hand to the backend, as a real app would send it (with the
// token as Tablease-Lease). A mutation checks isCurrent() right before it writes: the page or the
// ownership may have changed while it waited.
const eventOf = (args, ctx) => args.event_id ?? ctx.params.event_id;
const notFound = (id) => ({ error: { code: "NOT_FOUND", message: `No event ${id}; use an id from search_events.`, retryable: false } });

const handlers = {
  search_events: async ({ q = "" } = {}) => ({ events: backend.search(q) }),
  get_event_details: async (args, ctx) => backend.get(eventOf(args, ctx)) ?? notFound(eventOf(args, ctx)),
  save_event: async (args, ctx) => {
    const id = eventOf(args, ctx);
    if (!ctx.isCurrent()) return ctx.stale();
    const err = backend.write(id, ctx.epoch, (s) => {
      if (!s.saved.includes(id)) s.saved.push(id);
    });
    return err ?? { saved: true, event_id: id, epoch: ctx.epoch };
  },
  rename_event: async (args, ctx) => {
    const id = eventOf(args, ctx);
    const n = String(args.name ?? "").trim();
    if (!n) return { error: { code: "INVALID_ARGUMENT", message: "name must not be blank.", retryable: false } };
    if (!ctx.isCurrent()) return ctx.stale();
    const err = backend.write(id, ctx.epoch, (s, e) => {
      e.name = n;
    });
    return err ?? { renamed: true, event_id: id, name: n, epoch: ctx.epoch };
  },
  ask_user: (args, ctx) => ctx.interact((ui) => openQuestion(args.question, ui)),
};

// --- ask_user's modal -------------------------------------------------------------------------

/** Shows the question; the answer, Cancel (or Escape) settle the call. Returns what closes it,
 *  which the client runs on every path: answer, cancel, deadline, page change, lost control. */
function openQuestion(question, ui) {
  const dialog = $("#ask-modal");
  const form = $("#ask-form");
  field("ask-question").textContent = question;
  field("ask-answer").value = "";
  const tick = () => (field("ask-deadline").textContent = fmtMs(ui.timeLeftMs()));
  tick();
  const timer = setInterval(tick, 250);
  const submit = (e) => {
    e.preventDefault();
    ui.submit({ answer: field("ask-answer").value });
  };
  const cancel = () => ui.cancel();
  const escape = (e) => {
    e.preventDefault();
    ui.cancel();
  };
  form.addEventListener("submit", submit);
  action("ask-cancel").addEventListener("click", cancel);
  dialog.addEventListener("cancel", escape);
  dialog.showModal();
  log(`ask_user: asking “${question}”`);
  return () => {
    clearInterval(timer);
    form.removeEventListener("submit", submit);
    action("ask-cancel").removeEventListener("click", cancel);
    dialog.removeEventListener("cancel", escape);
    dialog.close();
    log("ask_user: closed");
  };
}

// --- routing: /demo/events and /demo/events/{id}, with history.pushState ---------------------

const BASE = "/demo";
const tracker = new RouteTracker({ base: BASE }); // the tools follow it too

function route() {
  return tracker.route;
}

function currentEventId() {
  const m = /^\/events\/([^/]+)$/.exec(route());
  return m ? decodeURIComponent(m[1]) : null;
}

function navigate(to) {
  history.pushState(null, "", BASE + to + location.search);
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
    open.addEventListener("click", () => navigate(`/events/${encodeURIComponent(e.event_id)}`));
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

/** Shows the page of the route: the list, or one event. */
async function renderPage() {
  const id = currentEventId();
  document.body.dataset.page = id ? "detail" : "list";
  field("route").textContent = route();
  show(field("detail-result"), "");
  if (!id) {
    renderStatus();
    return;
  }
  const box = $("#detail");
  const e = backend.get(id);
  if (!e) {
    box.textContent = notFound(id).error.message;
    renderStatus();
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
  renderPage();
}

// Calls a tool as the agent would: through the onTool registry (bindOnTool), where every tool is
// registered once, runs the profile of the current page, and mutation handlers are guarded. The
// agent's cancel is the signal it passes ("Cancel the call").
const registry = new Map();
const session = {
  onTool(name, fn) {
    registry.set(name, fn);
    return () => registry.delete(name);
  },
};
let pendingCall = null; // the AbortController of the agent panel's call in flight

async function callTool(name, args) {
  const fn = registry.get(name);
  if (!fn) return { error: { code: "UNKNOWN_TOOL", message: `No tool ${name}.`, retryable: false } };
  const ac = new AbortController();
  pendingCall = ac;
  action("cancel-call").disabled = false;
  try {
    const res = await fn(args, { toolRequestId: "manual-" + Date.now(), tool: name, sessionId, signal: ac.signal });
    if (!res?.error) refreshViews();
    return res;
  } finally {
    if (pendingCall === ac) {
      pendingCall = null;
      action("cancel-call").disabled = true;
    }
  }
}

function describeError(res) {
  if (res?.error?.code === NOT_LEASE_OWNER) return `Refused: ${res.error.message}`;
  return res?.error ? `${res.error.code}: ${res.error.message}` : null;
}

// --- wiring -----------------------------------------------------------------------------------

async function main() {
  setRole("viewer");
  field("session").textContent = sessionId;
  if (!currentEventId() && route() !== "/events") history.replaceState(null, "", BASE + "/events" + location.search);
  // The tools are the catalog file's: the server hands out the same (TABLEASE_CATALOG_FILE), and
  // the client falls back to these when the server's catalog is empty.
  const catalogFile = await fetch("/demo/catalog.json", { cache: "no-store" }).then((r) => r.json());
  const tools = catalogFile.tools;
  token = await firstToken();

  lease = new TabLease({
    baseUrl,
    sessionId,
    getToken,
    label: () => `Events — ${route()}`,
    stream: streamMode,
    socket,
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
  // The stream event also says when this tab starts or stops carrying the stream: log only
  // the connection going up or down.
  let streamLive = false;
  lease.on("stream", ({ live }) => {
    renderStatus();
    if (live !== streamLive) log(live ? "event stream connected" : "event stream down");
    streamLive = live;
  });
  lease.on("handoff", (d) => {
    const note = field("handoff-status");
    const ownerNote = field("owner-note");
    switch (d.phase) {
      case "requested":
        show(ownerNote, "Another tab asked for control: handing over as soon as no change is running and no question is open…");
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
        show(note, "The other tab did not let go in time (a change or a question of it is still open). “Use here” takes control anyway.", true);
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

  // Three ways to hand the tools out, all following the one route tracker and allowing one
  // interaction with the user at a time in this tab.
  const toolOptions = { handlers, tools, route: tracker, interactions: "one" };
  bindOnTool(lease, session, toolOptions);

  // What an agent sees now, through the registry.sync pattern and WebMCP when the browser has it.
  const exposed = new Map(); // name → the definition exposed now (its execute is the agent's call)
  const reg = syncToolRegistry(
    lease,
    {
      sync: (defs) => {
        exposed.clear();
        for (const d of defs) exposed.set(d.name, d);
        field("exposed").textContent = defs.map((d) => d.name).join(", ") || "—";
      },
    },
    toolOptions,
  );
  const webmcp = registerWebMCPTools(lease, {
    ...toolOptions,
    onChange: (names) => (field("webmcp").textContent = `WebMCP: registered ${names.join(", ") || "nothing"}`),
    onError: (e) => log(`tools: ${e?.message ?? e}`),
  });
  if (!webmcp.available) field("webmcp").textContent = "WebMCP: not available in this browser; the agent panel calls the same tools.";
  window.demo = { exposed, navigate, tracker }; // for the console and end-to-end tests

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
  action("back").addEventListener("click", () => navigate("/events"));
  action("cancel-call").addEventListener("click", () => pendingCall?.abort());
  action("save-event").addEventListener("click", async () => {
    const res = await callTool("save_event", {});
    show(field("detail-result"), describeError(res) ?? "Saved to your list.", Boolean(res?.error));
  });
  $("#rename-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    const res = await callTool("rename_event", { name: e.target.name.value });
    show(field("detail-result"), describeError(res) ?? `Renamed to “${res.name}”.`, Boolean(res?.error));
    if (!res?.error) e.target.name.value = "";
  });

  // Example arguments for the page the user is on.
  const example = (name) => {
    const id = currentEventId();
    switch (name) {
      case "search_events":
        return { q: "webmcp" };
      case "get_event_details":
      case "save_event":
        return id ? {} : { event_id: "evt-webmcp-intro" };
      case "rename_event":
        return { name: "WebMCP intro workshop (renamed)" };
      default:
        return { question: "Which seat do you prefer?" };
    }
  };
  field("tool").addEventListener("change", (e) => (field("args").value = JSON.stringify(example(e.target.value))));
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

  // The adapters follow the route themselves; the page shows it and tells other tabs.
  tracker.on("change", () => {
    renderPage();
    lease.setLabel(() => `Events — ${route()}`);
  });
  window.addEventListener("storage", (e) => {
    if (e.key === storeKey) refreshViews();
  });

  await runSearch("");
  await renderPage();
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
