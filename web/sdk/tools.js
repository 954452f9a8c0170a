// tools.js — from the catalog to a tool registry: WebMCP (document.modelContext or the older
// navigator.modelContext), an app's own registry.sync(definitions), or session.onTool(name, fn).
// Read-only tools always run; every other tool goes through lease.guard. Each bridge follows the
// page's route (route.js) and runs every call through call.js: route-bound instances, one
// AbortSignal per call, deadlines, interactions, stale results.

import { CALL_DEFAULTS, abortAnswer, anySignal, endReason, runToolCall, toolError } from "./call.js";
import { RouteTracker, normalizeRoute, profileMatch, profilesFor } from "./route.js";

/** Whether a catalog tool is read-only (MCP default: not read-only, so a mutation). */
export function isReadOnlyTool(tool) {
  return tool?.annotations?.readOnlyHint === true;
}

function fingerprint(tool) {
  return JSON.stringify([tool.name, tool.title ?? "", tool.description ?? "", tool.inputSchema ?? null, tool.outputSchema ?? null, tool.annotations ?? {}, tool.timeoutMs ?? null]);
}

const STALE = {
  route: ["ROUTE_CHANGED", "The page the user sees changed while the tool ran, so its result was not given: read the current page and call again if it still applies."],
  document: ["DOCUMENT_CHANGED", "The document the tool worked on was replaced while it ran, so its result was not given: read the current document and call again if it still applies."],
};

// The same, for a mutation whose handler returned after the change: it may have acted.
const STALE_AFTER = {
  route: ["ROUTE_CHANGED", "The page the user sees changed while the tool ran, and the tool finished after that, so its result was not given; it may have acted: read the current page to see what it did before calling again."],
  document: ["DOCUMENT_CHANGED", "The document the tool worked on was replaced while it ran, and the tool finished after that, so its result was not given; it may have acted: read the current document to see what it did before calling again."],
};

/**
 * The world of one bridge's calls: the route (a RouteTracker, a function, or a fixed string),
 * the generation (every route change, ownership change and documentChanged() adds one), the tool
 * instances registered now (one per profile and bound route parameters), and the signal that ends
 * every call on pagehide, stop() or close().
 */
class ToolScope {
  constructor(lease, options, { track, listen = true }) {
    this.lease = lease;
    this.options = {
      timeoutMs: options.timeoutMs ?? CALL_DEFAULTS.timeoutMs,
      timeoutMarginMs: options.timeoutMarginMs ?? CALL_DEFAULTS.timeoutMarginMs,
      maxResultBytes: options.maxResultBytes ?? CALL_DEFAULTS.maxResultBytes,
      interactions: options.interactions ?? "any",
    };
    const win = lease._window;
    const r = options.route;
    this.tracker = null;
    this._ownTracker = false;
    this._fixed = "";
    if (r instanceof RouteTracker) this.tracker = r;
    else if (track && win && (r === undefined || typeof r === "function")) {
      this.tracker = new RouteTracker({ window: win, route: typeof r === "function" ? r : undefined, base: options.base });
      this._ownTracker = true;
    } else if (typeof r === "function") this._fixed = r;
    else this._fixed = typeof r === "string" ? r : "";
    // The changes of generation a running call may still ask about (changeSince), as runs of
    // changes alike: {reason, answer (for "owner": the call's NOT_LEASE_OWNER), n (how many)}, the
    // first of them generation _base, _count in all. The older ones, before the generation the
    // oldest running call started in, are dropped (_compact), so that a page's life of
    // navigations keeps none of them; and changes alike in a row are one run, so that a call still
    // running through many navigations (a tool without routes, which does not end with the page)
    // keeps one run of route changes, not one entry each.
    this._changes = [];
    this._base = 0;
    this._count = 0;
    this._held = new Map(); // generation → how many running calls started in it (hold)
    this.instances = new Map(); // key → instance
    this._life = new AbortController();
    this._page = new AbortController(); // the page on screen: aborts when the route changes
    this._pageRoute = this.route(); // its route
    this._offs = [];
    this._routeListeners = [];
    this._period = lease._period;
    if (this.tracker) this._offs.push(this.tracker.on("change", () => this._onRoute()));
    if (!listen) return; // a one-off list of definitions: nothing to close it, so nothing to remove
    this._offs.push(
      lease.on("state", ({ state }) => {
        if (lease._period !== this._period) {
          this._period = lease._period;
          this.bump("owner", lease._notOwner()); // why the calls of the period that ended end
        }
        if (state === "stopped") this._endLife("The agent session ended in this tab before the call completed.", "session_ended");
      }),
    );
    if (win?.addEventListener) {
      const hide = () => this._endLife("The page was hidden or closed before the call completed.", "page_hidden");
      win.addEventListener("pagehide", hide);
      this._offs.push(() => win.removeEventListener("pagehide", hide));
    }
  }

  /** The route now ("/events/evt-1"). */
  route() {
    if (this.tracker) return this.tracker.route;
    const r = typeof this._fixed === "function" ? this._fixed() : this._fixed;
    return r ? normalizeRoute(r) : "";
  }

  get generation() {
    return this._base + this._count;
  }

  /** The signal every call of this scope includes: it aborts on pagehide, stop() and close(). */
  get signal() {
    return this._life.signal;
  }

  /** The signal of the page on screen: it aborts when the route changes. Interactions with the
   *  user include it, whatever tool opened them: their UI belongs to the page. */
  get pageSignal() {
    return this._page.signal;
  }

  bump(reason, answer = null) {
    const last = this._changes.at(-1);
    if (last && last.reason === reason && reason !== "owner") last.n++; // an owner change has its answer
    else this._changes.push({ reason, answer, n: 1 });
    this._count++;
    this._compact();
  }

  /** Keeps the changes since generation gen while a call that started in it runs; the function
   *  it answers, called once the call's handler has settled, lets them go. */
  hold(gen) {
    this._held.set(gen, (this._held.get(gen) ?? 0) + 1);
    let held = true;
    return () => {
      if (!held) return;
      held = false;
      const n = this._held.get(gen) - 1;
      if (n > 0) this._held.set(gen, n);
      else this._held.delete(gen);
      this._compact();
    };
  }

  _compact() {
    let oldest = this.generation;
    for (const gen of this._held.keys()) if (gen < oldest) oldest = gen;
    while (this._changes.length > 0 && this._base < oldest) {
      const first = this._changes[0];
      const drop = Math.min(first.n, oldest - this._base);
      first.n -= drop;
      this._base += drop;
      this._count -= drop;
      if (first.n === 0) this._changes.shift();
    }
  }

  /** The first change since generation gen that a call of this kind sees, or null: a read-only
   *  call ({mutation: false}) does not see ownership changes, nor a call of a tool without
   *  routes ({routed: false}) route changes (its interactions still close with the page). The
   *  changes before the ones kept (asked about by a handler that has settled) are a route change:
   *  whatever they were, that call's page is gone. */
  changeSince(gen, { mutation, routed }) {
    if (gen < this._base) return { reason: "route" };
    let g = this._base; // the generation the run below starts from
    for (const c of this._changes) {
      const after = g + c.n > gen; // the run has changes made at or after generation gen
      g += c.n;
      if (!after || (c.reason === "owner" && !mutation) || (c.reason === "route" && !routed)) continue;
      return c;
    }
    return null;
  }

  /** The answer of a call of that kind that started in generation gen and sees the change c since
   *  (changeSince by default; a route change when it sees none); finished: its handler returned
   *  after it. */
  staleAnswer(gen, kind, finished = false, c = this.changeSince(gen, kind)) {
    c ??= { reason: "route" };
    if (c.reason === "owner") return c.answer;
    const [code, message] = (finished ? STALE_AFTER : STALE)[c.reason] ?? STALE.route;
    const details = { generation: gen, currentGeneration: this.generation, route: this.route() };
    if (finished) details.mayHaveActed = true;
    return toolError(code, message, details);
  }

  onRouteChange(fn) {
    this._routeListeners.push(fn);
  }

  _endLife(message, reason) {
    const life = this._life;
    this._life = new AbortController();
    life.abort(endReason(toolError("UI_CONTEXT_CLOSED", message, { reason })));
  }

  _onRoute() {
    this.bump("route");
    const route = this.route();
    const page = this._page;
    const left = this._pageRoute;
    this._page = new AbortController();
    this._pageRoute = route;
    page.abort(endReason(toolError("UI_CONTEXT_CLOSED", "The page changed before the user answered.", { reason: "route", route: left, currentRoute: route })));
    for (const inst of [...this.instances.values()]) {
      if (this.routeLeft(inst, route)) this.retire(inst, "route");
    }
    for (const fn of this._routeListeners) fn(route);
  }

  /** Whether route is not inst's page: a route-bound instance whose profile does not match route
   *  with the same parameters. The raw routes may differ on one page ("/events/a%3Ab" tidied to
   *  "/events/a:b" by the app's router). */
  routeLeft(inst, route) {
    if (inst.pattern === null) return false;
    const m = profileMatch(inst.tool, route);
    return !m || m.pattern !== inst.pattern || JSON.stringify(m.params) !== JSON.stringify(inst.params);
  }

  /** The instance of tool's profile for match ({pattern, params}), made once per key. */
  instanceFor(tool, match, handler, route = this.route()) {
    const key = fingerprint(tool) + "|" + (match.pattern ?? "") + "|" + JSON.stringify(match.params);
    let inst = this.instances.get(key);
    if (inst && inst.handler === handler) return inst;
    if (inst) this.retire(inst, "catalog");
    const ac = new AbortController(); // registered: aborts when retired
    const calls = new AbortController(); // its running calls: aborts when the route leaves it
    inst = { key, tool, handler, route, pattern: match.pattern, params: match.params, ac, signal: ac.signal, calls, callSignal: calls.signal, refusal: null, pending: null, def: null };
    this.instances.set(key, inst);
    return inst;
  }

  /** Unregisters an instance: its signal aborts and later calls that reach it are refused. When
   *  the route left it, its running calls end too (UI_CONTEXT_CLOSED); when the role or the
   *  catalog changed they go on (ownership ends them through the lease's signal). */
  retire(inst, why) {
    if (inst.refusal) return;
    if (this.instances.get(inst.key) === inst) this.instances.delete(inst.key);
    if (why === "route") {
      inst.refusal = this.routeChanged(inst);
    } else if (why === "closed") {
      // The catalog may well offer it still: the page closed its tools (the adapter's close()).
      inst.refusal = toolError("UI_CONTEXT_CLOSED", "The page's tools were closed: this page offers no tools now.", { reason: "closed", route: inst.route });
    } else {
      inst.refusal = toolError("TOOL_RETIRED", `${inst.tool.name} is no longer offered on this page: read the page's tools again.`, { tool: inst.tool.name, route: inst.route });
      // A mutation tool unregistered because the tab is not owner now (read-only while its
      // lease is re-confirmed, say): a call that reaches it waits for the guard, which lets it
      // run if this lease is confirmed and the catalog did not change meanwhile, as far as the
      // tab can know: not after news may have been missed since (a freeze, a stream drop), when
      // a catalog change may not have reached it.
      const lease = this.lease;
      if (!isReadOnlyTool(inst.tool) && lease.role !== "owner" && lease._epoch > 0) {
        inst.pending = { epoch: lease._epoch, version: lease._catalogVersion, at: lease._clock.now() };
      }
    }
    inst.ac.abort(endReason(this.refusalNow(inst)));
    if (why === "route" || why === "closed") {
      const message = why === "route" ? "The page changed before the call completed." : "The page's tools were closed before the call completed.";
      inst.calls.abort(endReason(toolError("UI_CONTEXT_CLOSED", message, { reason: why, route: inst.route, currentRoute: this.route() })));
    }
  }

  /** The answer to a call of inst, retired because the route left it, naming the route shown now
   *  (the user may have come back to inst's page, which has an instance of its own then). */
  routeChanged(inst) {
    const now = this.route();
    const left = now === inst.route ? `an earlier showing of the page ${inst.route}, which the user left and came back to` : `the page ${inst.route}, which the user has left (now ${now})`;
    return toolError("ROUTE_CHANGED", `${inst.tool.name} belonged to ${left}: read the tools of the current page and call one of them.`, {
      tool: inst.tool.name,
      route: inst.route,
      currentRoute: now,
    });
  }

  /** The answer to a call of inst, retired: ROUTE_CHANGED when the route left it; else, for a
   *  mutation tool of a tab that is not owner, the guard's NOT_LEASE_OWNER with the lease's
   *  details, and TOOL_RETIRED once the tab is owner again (with another lease, or another
   *  catalog, than when it was retired: see retire). */
  refusalNow(inst) {
    if (inst.refusal.error.code === "ROUTE_CHANGED") return this.routeChanged(inst);
    if (inst.refusal.error.code === "UI_CONTEXT_CLOSED") return inst.refusal;
    if (!isReadOnlyTool(inst.tool) && this.lease.role !== "owner") return this.lease._notOwner();
    return inst.refusal;
  }

  /** Runs a call of inst. */
  call(inst, args, callerCtx) {
    const p = inst.pending;
    const lease = this.lease;
    const waits = p && p.epoch === lease._epoch && p.version === lease._catalogVersion && lease._confirmNeededAfter() <= p.at;
    if (inst.refusal && !waits) return Promise.resolve(this.refusalNow(inst));
    if (inst.callSignal.aborted) return Promise.resolve(abortAnswer(inst.callSignal));
    if (this.route() && this.routeLeft(inst, this.route())) {
      this.retire(inst, "route");
      return Promise.resolve(inst.refusal);
    }
    const readOnly = isReadOnlyTool(inst.tool);
    return runToolCall(
      inst.handler,
      {
        lease,
        scope: this,
        instance: inst,
        tool: inst.tool.name,
        schema: inst.tool.inputSchema ?? { type: "object" },
        mutation: !readOnly,
        timeoutMs: inst.tool.timeoutMs,
        readContext: () => ({ tabId: lease.tabId, sessionId: lease.sessionId, epoch: lease.epoch, token: null, signal: null, headers: {} }),
      },
      args,
      callerCtx,
    );
  }

  /** The definitions this tab may expose now (see toolDefinitions). Instances of the previous
   *  definitions that are not among them are retired. Null when the route changed while the
   *  catalog was read: the sync that change started gives the new route's. When the catalog
   *  cannot be read (the server is down, or the page is frozen, when browsers refuse requests),
   *  the tools of its last reading for this route stand in, filtered by the role now, then the
   *  caller's fallback, then the tools without routes of the latest reading of another route: a
   *  tab never loses its read-only tools to an outage. readFailed says so. */
  async definitions({ handlers = {}, tools: fallback = null, onError = undefined }) {
    const route = this.route();
    let tools = null;
    let failed = false;
    try {
      if (this.lease._pageFrozen?.()) {
        failed = true; // browsers refuse the requests of a frozen page: read it on resume
      } else {
        const cat = await this.lease.catalog(route);
        tools = cat.tools;
        if (tools.length === 0 && fallback) tools = null;
      }
    } catch (e) {
      failed = true;
      onError?.(e);
    }
    if (this.route() !== route) return null;
    this.readFailed = failed;
    if (!tools && failed) tools = this.lease._lastCatalog(route)?.tools ?? null;
    if (!tools && fallback) {
      const role = this.lease.role;
      const mine = fallback.filter((t) => !t.disabled && (role === "owner" || isReadOnlyTool(t)));
      tools = route ? profilesFor(mine, route).map((p) => p.tool) : mine;
    }
    if (!tools && failed) tools = this.lease._routelessTools();
    tools ??= [];
    const keep = new Set();
    const defs = [];
    for (const t of tools) {
      // Own properties alone, as bindOnTool reads them: "constructor" and "toString" are valid
      // tool names, and every object has functions of those names.
      const fn = Object.hasOwn(handlers, t.name) ? handlers[t.name] : undefined;
      if (typeof fn !== "function") continue;
      const match = (route && profileMatch(t, route)) || { pattern: null, params: {} };
      const inst = this.instanceFor(t, match, fn, route);
      keep.add(inst);
      inst.def ??= this._define(inst);
      defs.push(inst.def);
    }
    for (const inst of [...this.instances.values()]) if (!keep.has(inst)) this.retire(inst, "catalog");
    return defs;
  }

  _define(inst) {
    const t = inst.tool;
    const readOnly = isReadOnlyTool(t);
    const def = {
      name: t.name,
      description: t.description ?? "",
      inputSchema: t.inputSchema ?? { type: "object" },
      annotations: { ...(t.annotations ?? {}), readOnlyHint: readOnly },
      readOnly,
      route: inst.pattern === null ? null : inst.route,
      params: { ...inst.params },
      signal: inst.signal,
      execute: (args, ctx) => this.call(inst, args, ctx),
    };
    if (t.title) def.title = t.title;
    if (t.outputSchema) def.outputSchema = t.outputSchema;
    if (typeof t.timeoutMs === "number") def.timeoutMs = t.timeoutMs;
    return def;
  }

  /** Keeps sync going while the catalog cannot be read: answers the function an adapter calls
   *  after each of its syncs, which, when the read failed (readFailed), runs sync again after a
   *  delay that doubles from 1 s to 30 s (a frozen page's timers wait for its resume); and sync
   *  runs at once when the event stream is live again after a failed read. close() stops both. */
  retryWhileUnread(sync) {
    const clock = this.lease._clock;
    let timer = null;
    let delay = 0;
    const clear = () => {
      if (timer !== null) clock.clearTimeout(timer);
      timer = null;
    };
    this._offs.push(clear, this.lease.on("stream", ({ live }) => live && this.readFailed && sync()));
    return () => {
      clear();
      if (!this.readFailed) {
        delay = 0;
        return;
      }
      delay = Math.min(delay ? delay * 2 : 1000, 30000);
      timer = clock.setTimeout(() => {
        timer = null;
        sync();
      }, delay);
    };
  }

  close() {
    for (const off of this._offs.splice(0)) off();
    if (this._ownTracker) this.tracker.close();
    this._endLife("The page's tools were closed before the call completed.", "closed");
    for (const inst of [...this.instances.values()]) this.retire(inst, "closed");
  }
}

/**
 * The tool definitions this tab may expose now: the catalog for the route (or `tools` when the
 * catalog has none or cannot be read), filtered by role, each with an execute(args, ctx) that
 * runs its handler — mutation handlers through lease.guard. Tools without a handler are left out.
 * A one-off list: its calls end on the agent's cancel, their deadline and lost control, but it
 * follows no navigation and no pagehide; the adapters below do.
 */
/**
 * @param {import("./tablease.js").TabLease} lease
 * @param {import("./tablease.js").ToolOptions} [options]
 * @returns {Promise<import("./tablease.js").ToolDefinition[]>}
 */
export async function toolDefinitions(lease, options = {}) {
  return new ToolScope(lease, { ...options, route: options.route ?? "" }, { track: false, listen: false }).definitions(options);
}

/** Runs fn one at a time; a call made while one runs makes it run once more afterwards. */
function serialized(fn) {
  let running = null;
  let again = false;
  const run = async () => {
    if (running) {
      again = true;
      return running;
    }
    running = (async () => {
      try {
        do {
          again = false;
          await fn();
        } while (again);
      } finally {
        running = null;
      }
    })();
    return running;
  };
  return run;
}

/** Adds to a bridge what it answers about its route and generation. */
function withScope(bridge, scope) {
  return Object.defineProperties(bridge, {
    route: { get: () => scope.route(), enumerable: true },
    generation: { get: () => scope.generation, enumerable: true },
    routeTracker: { get: () => scope.tracker, enumerable: true },
    _scope: { value: scope }, // for tests
  });
}

/**
 * Registers the catalog's tools on WebMCP: `document.modelContext.registerTool(tool, {signal})`,
 * or the older `navigator.modelContext.registerTool(tool)` + `unregisterTool(name)`. Read-only
 * tools are always registered; mutation tools only while this tab is the owner, under an
 * AbortSignal that aborts when ownership ends (and every call goes through lease.guard anyway).
 * Follows the route (route-bound instances are unregistered at once when the route leaves them)
 * and re-registers on rolechange and catalog events.
 */
/**
 * @param {import("./tablease.js").TabLease} lease
 * @param {import("./tablease.js").WebMCPOptions} [options]
 * @returns {import("./tablease.js").WebMCPBridge}
 */
export function registerWebMCPTools(lease, options = {}) {
  const { handlers = {}, tools = null, onError = undefined, onChange = undefined } = options;
  let mc = options.modelContext;
  let legacy = options.legacy ?? false;
  if (!mc) {
    /** @type {any} */
    const g = globalThis;
    if (g.document?.modelContext?.registerTool) mc = g.document.modelContext;
    else if (g.navigator?.modelContext?.registerTool) {
      mc = g.navigator.modelContext;
      legacy = true;
    }
  }
  const scope = new ToolScope(lease, options, { track: true });
  const registered = new Map(); // name → {def, ac, signal}
  let closed = false;
  let lastTools = null;

  const unregister = (name) => {
    const r = registered.get(name);
    if (!r) return;
    registered.delete(name);
    r.ac.abort();
  };

  const register = async (def) => {
    const ac = new AbortController();
    const signal = anySignal(def.readOnly ? [ac.signal, def.signal] : [ac.signal, def.signal, lease.signal ?? AbortSignal.abort()]);
    if (signal.aborted) return;
    const entry = { def, ac, signal };
    registered.set(def.name, entry);
    // Ownership ended, the route left the instance, or we unregistered it: the browser drops it,
    // so do we.
    signal.addEventListener("abort", () => {
      if (registered.get(def.name) === entry) registered.delete(def.name);
      onChange?.([...registered.keys()]);
    }, { once: true });
    const tool = { name: def.name, description: def.description, inputSchema: def.inputSchema, annotations: def.annotations, execute: def.execute };
    if (def.title) tool.title = def.title;
    if (def.outputSchema) tool.outputSchema = def.outputSchema;
    // WebMCP has no standard member for it: passed as it is for the runtimes that read it (a
    // browser ignores a member it does not know); the client settles the call before it anyway.
    if (typeof def.timeoutMs === "number") tool.timeoutMs = def.timeoutMs;
    try {
      const ret = mc.registerTool(tool, { signal });
      if (legacy) {
        signal.addEventListener("abort", () => {
          try {
            if (typeof ret?.unregister === "function") ret.unregister();
            else mc.unregisterTool?.(def.name);
          } catch {}
        }, { once: true });
      }
      await ret;
    } catch (e) {
      if (registered.get(def.name) === entry) registered.delete(def.name);
      onError?.(e);
    }
  };

  const apply = async (defs) => {
    if (!mc || closed) return;
    const want = new Map(defs.map((d) => [d.name, d]));
    for (const [name, r] of [...registered]) {
      const d = want.get(name);
      if (!d || d !== r.def || r.signal.aborted) unregister(name);
    }
    for (const [name, d] of want) {
      if (registered.has(name) || d.signal.aborted) continue;
      await register(d);
    }
    onChange?.([...registered.keys()]);
  };

  const sync = serialized(async () => {
    if (closed) return;
    const defs = await scope.definitions({ handlers, tools, onError });
    if (!defs) return;
    lastTools = defs;
    await apply(defs);
    retry();
  });
  const retry = scope.retryWhileUnread(sync);

  // On losing ownership, drop mutation tools at once (their signal already aborted them).
  const offRole = lease.on("rolechange", () => {
    if (lastTools && lease.role !== "owner") apply(lastTools.filter((d) => d.readOnly));
    sync();
  });
  const offCatalog = lease.on("catalog", (d) => {
    if (d?.reason === "version") sync();
  });
  scope.onRouteChange(() => sync());

  return withScope({
    get available() {
      return Boolean(mc);
    },
    get tools() {
      return [...registered.keys()];
    },
    sync,
    documentChanged() {
      scope.bump("document");
      return sync();
    },
    close() {
      closed = true;
      offRole();
      offCatalog();
      for (const name of [...registered.keys()]) unregister(name);
      scope.close();
    },
  }, scope);
}

/**
 * For apps with their own registry (the seeds' `registry.sync(definitions)` pattern): calls
 * registry.sync(defs) with the definitions this tab may expose on rolechange, catalog and route
 * changes, and whenever sync() is called (once after start(): a tab that starts as viewer has no
 * rolechange). Each definition has {name, title?, description, inputSchema, outputSchema?,
 * annotations, timeoutMs?, readOnly, route, params, signal, execute(args, ctx)}; the same instance
 * keeps the same object, so a registry can compare them; mutation executes go through lease.guard.
 */
/**
 * @param {import("./tablease.js").TabLease} lease
 * @param {{sync(defs: import("./tablease.js").ToolDefinition[]): unknown}} registry
 * @param {import("./tablease.js").ToolOptions} [options]
 */
export function syncToolRegistry(lease, registry, options = {}) {
  const { handlers = {}, tools = null, onError = undefined } = options;
  const scope = new ToolScope(lease, options, { track: true });
  let closed = false;
  let last = null;
  const sync = serialized(async () => {
    if (closed) return;
    const defs = await scope.definitions({ handlers, tools, onError });
    if (!defs || closed) return;
    last = defs;
    await registry.sync(last);
    retry();
  });
  const retry = scope.retryWhileUnread(sync);
  const offRole = lease.on("rolechange", () => {
    if (last && lease.role !== "owner") registry.sync((last = last.filter((d) => d.readOnly)));
    sync();
  });
  const offCatalog = lease.on("catalog", (d) => {
    if (d?.reason === "version") sync();
  });
  scope.onRouteChange(() => {
    // The instances the route left are retired already: the registry drops them at once.
    if (last && !closed) registry.sync((last = last.filter((d) => !d.signal.aborted)));
    sync();
  });
  return withScope({
    sync,
    documentChanged() {
      scope.bump("document");
      return sync();
    },
    close() {
      closed = true;
      offRole();
      offCatalog();
      scope.close();
    },
  }, scope);
}

/**
 * For an `onTool(name, handler)` registry (the seeds' session.onTool): registers every handler
 * once; the ones not marked read-only (by `tools`' annotations, or listed in `readOnly`) go
 * through lease.guard, so a viewer tab answers NOT_LEASE_OWNER without running them. A call runs
 * the profile in `tools` for the current route (its schema, timeout and bound parameters); a
 * name whose profiles all belong to other routes answers TOOL_UNAVAILABLE. Returns a function
 * that unregisters them all (also as its close()), which answers route, generation, routeTracker
 * and documentChanged() as the other bridges do.
 */
export function bindOnTool(lease, session, options = {}) {
  const { handlers = {}, tools = [], readOnly = [] } = options;
  const scope = new ToolScope(lease, options, { track: true });
  const ro = new Set(readOnly);
  const offs = [];
  for (const [name, fn] of Object.entries(handlers)) {
    // With tools, a name runs only by a profile of its own (none: TOOL_UNAVAILABLE, as a disabled
    // one); without, every handler runs, by its name alone.
    const profiles = tools.filter((t) => t.name === name && !t.disabled);
    const run = (args, ctx) => {
      const route = scope.route();
      let tool = { name, annotations: { readOnlyHint: ro.has(name) } };
      let match = { pattern: null, params: {} };
      if (tools.length > 0 && profiles.length === 0) return Promise.resolve(toolError("TOOL_UNAVAILABLE", `${name} is not offered (it is in none of the tools given, or disabled there).`, { tool: name, route }));
      if (profiles.length > 0) {
        // The profile of this page; without a route, the one for every route (or the first).
        const found = route ? profilesFor(profiles, route)[0] : { tool: profiles.find((p) => !p.routes?.length) ?? profiles[0], pattern: null, params: {} };
        if (!found) return Promise.resolve(toolError("TOOL_UNAVAILABLE", `${name} is not offered on this page (${route}).`, { tool: name, route }));
        tool = ro.has(name) ? { ...found.tool, annotations: { ...(found.tool.annotations ?? {}), readOnlyHint: true } } : found.tool;
        match = { pattern: found.pattern, params: found.params };
      }
      return scope.call(scope.instanceFor(tool, match, fn), args, ctx);
    };
    const off = session.onTool(name, run);
    offs.push(typeof off === "function" ? off : () => off?.unsubscribe?.());
  }
  const unbind = () => {
    for (const off of offs.splice(0)) off();
    scope.close();
  };
  unbind.close = unbind;
  // The handlers stay registered: a document change only makes the calls that began before it stale.
  unbind.documentChanged = () => {
    scope.bump("document");
    return Promise.resolve();
  };
  return withScope(unbind, scope);
}
