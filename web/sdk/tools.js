// tools.js — from the catalog to a tool registry: WebMCP (document.modelContext or the older
// navigator.modelContext), an app's own registry.sync(definitions), or session.onTool(name, fn).
// Read-only tools always run; every other tool goes through lease.guard.

/** Whether a catalog tool is read-only (MCP default: not read-only, so a mutation). */
export function isReadOnlyTool(tool) {
  return tool?.annotations?.readOnlyHint === true;
}

/**
 * The tool definitions this tab may expose now: the catalog for the route (or `tools` when the
 * catalog has none or cannot be read), filtered by role, each with an execute(args, ctx) that
 * runs its handler — mutation handlers through lease.guard. Tools without a handler are left out.
 */
/**
 * @param {import("./tablease.js").TabLease} lease
 * @param {import("./tablease.js").ToolOptions} [options]
 * @returns {Promise<import("./tablease.js").ToolDefinition[]>}
 */
export async function toolDefinitions(lease, { handlers = {}, route = "", tools: fallback = null, onError = undefined } = {}) {
  const r = typeof route === "function" ? route() : route;
  let tools = null;
  try {
    const cat = await lease.catalog(r);
    tools = cat.tools;
    if (tools.length === 0 && fallback) tools = null;
  } catch (e) {
    onError?.(e);
  }
  if (!tools) {
    const role = lease.role;
    tools = (fallback ?? []).filter((t) => !t.disabled && (role === "owner" || isReadOnlyTool(t)));
  }
  return definitionsFor(lease, tools, handlers);
}

function definitionsFor(lease, tools, handlers) {
  const defs = [];
  for (const t of tools) {
    const fn = handlers[t.name];
    if (typeof fn !== "function") continue;
    const readOnly = isReadOnlyTool(t);
    const guarded = readOnly ? null : lease.guard(fn);
    const def = {
      name: t.name,
      description: t.description ?? "",
      inputSchema: t.inputSchema ?? { type: "object" },
      annotations: { ...(t.annotations ?? {}), readOnlyHint: readOnly },
      readOnly,
      execute: readOnly
        ? async (args, ctx) => toObject(await fn(args ?? {}, { tabId: lease.tabId, sessionId: lease.sessionId, epoch: lease.epoch, token: null, signal: null, headers: {} }, ctx))
        : async (args, ctx) => toObject(await guarded(args ?? {}, ctx)),
    };
    if (t.title) def.title = t.title;
    defs.push(def);
  }
  return defs;
}

// WebMCP serializes a tool's result and needs an object.
function toObject(v) {
  if (v === undefined || v === null) return {};
  return typeof v === "object" ? v : { result: v };
}

function fingerprint(def) {
  return JSON.stringify([def.name, def.title ?? "", def.description, def.inputSchema, def.annotations]);
}

/** An AbortSignal that aborts when any of the given ones does. */
function anySignal(signals) {
  if (typeof AbortSignal.any === "function") return AbortSignal.any(signals);
  const ac = new AbortController();
  for (const s of signals) {
    if (s.aborted) {
      ac.abort(s.reason);
      break;
    }
    s.addEventListener("abort", () => ac.abort(s.reason), { once: true });
  }
  return ac.signal;
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

/**
 * Registers the catalog's tools on WebMCP: `document.modelContext.registerTool(tool, {signal})`,
 * or the older `navigator.modelContext.registerTool(tool)` + `unregisterTool(name)`. Read-only
 * tools are always registered; mutation tools only while this tab is the owner, under an
 * AbortSignal that aborts when ownership ends (and every call goes through lease.guard anyway).
 * Re-registers on rolechange and catalog events; call sync() after a route change.
 */
/**
 * @param {import("./tablease.js").TabLease} lease
 * @param {import("./tablease.js").WebMCPOptions} [options]
 * @returns {import("./tablease.js").WebMCPBridge}
 */
export function registerWebMCPTools(lease, options = {}) {
  const { handlers = {}, route = () => globalThis.location?.pathname ?? "", tools = null, onError = undefined, onChange = undefined } = options;
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
  const registered = new Map(); // name → {fp, ac, readOnly}
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
    const signal = def.readOnly ? ac.signal : anySignal([ac.signal, lease.signal ?? AbortSignal.abort()]);
    if (signal.aborted) return;
    const entry = { fp: fingerprint(def), ac, signal, readOnly: def.readOnly };
    registered.set(def.name, entry);
    // Ownership ended (or we unregistered it): the browser drops it, so do we.
    signal.addEventListener("abort", () => {
      if (registered.get(def.name) === entry) registered.delete(def.name);
    }, { once: true });
    const tool = { name: def.name, description: def.description, inputSchema: def.inputSchema, annotations: def.annotations, execute: def.execute };
    if (def.title) tool.title = def.title;
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
      if (!d || fingerprint(d) !== r.fp || r.signal.aborted) unregister(name);
    }
    for (const [name, d] of want) {
      if (registered.has(name)) continue;
      await register(d);
    }
    onChange?.([...registered.keys()]);
  };

  const sync = serialized(async () => {
    if (closed) return;
    const defs = await toolDefinitions(lease, { handlers, route, tools, onError });
    lastTools = defs;
    await apply(defs);
  });

  // On losing ownership, drop mutation tools at once (their signal already aborted them).
  const offRole = lease.on("rolechange", () => {
    if (lastTools && lease.role !== "owner") apply(lastTools.filter((d) => d.readOnly));
    sync();
  });
  const offCatalog = lease.on("catalog", (d) => {
    if (d?.reason === "version") sync();
  });

  return {
    get available() {
      return Boolean(mc);
    },
    get tools() {
      return [...registered.keys()];
    },
    sync,
    close() {
      closed = true;
      offRole();
      offCatalog();
      for (const name of [...registered.keys()]) unregister(name);
    },
  };
}

/**
 * For apps with their own registry (the seeds' `registry.sync(definitions)` pattern): calls
 * registry.sync(defs) with the definitions this tab may expose, on start, on rolechange and
 * catalog events, and whenever sync() is called (after a route change). Each definition has
 * {name, title?, description, inputSchema, annotations, readOnly, execute(args, ctx)}; mutation
 * executes go through lease.guard.
 */
/**
 * @param {import("./tablease.js").TabLease} lease
 * @param {{sync(defs: import("./tablease.js").ToolDefinition[]): unknown}} registry
 * @param {import("./tablease.js").ToolOptions} [options]
 */
export function syncToolRegistry(lease, registry, { handlers = {}, route = "", tools = null, onError = undefined } = {}) {
  let closed = false;
  let last = null;
  const sync = serialized(async () => {
    if (closed) return;
    last = await toolDefinitions(lease, { handlers, route, tools, onError });
    if (!closed) await registry.sync(last);
  });
  const offRole = lease.on("rolechange", () => {
    if (last && lease.role !== "owner") registry.sync(last.filter((d) => d.readOnly));
    sync();
  });
  const offCatalog = lease.on("catalog", (d) => {
    if (d?.reason === "version") sync();
  });
  return {
    sync,
    close() {
      closed = true;
      offRole();
      offCatalog();
    },
  };
}

/**
 * For an `onTool(name, handler)` registry (the seeds' session.onTool): registers every handler
 * once; the ones not marked read-only (by `tools`' annotations, or listed in `readOnly`) go
 * through lease.guard, so a viewer tab answers NOT_LEASE_OWNER without running them. Returns a
 * function that unregisters them all.
 */
export function bindOnTool(lease, session, { handlers = {}, tools = [], readOnly = [] } = {}) {
  const ro = new Set(readOnly);
  for (const t of tools) if (isReadOnlyTool(t)) ro.add(t.name);
  const offs = [];
  for (const [name, fn] of Object.entries(handlers)) {
    const run = ro.has(name)
      ? (args, ctx) => fn(args, { tabId: lease.tabId, sessionId: lease.sessionId, epoch: lease.epoch, token: null, signal: null, headers: {} }, ctx)
      : lease.guard(fn);
    const off = session.onTool(name, run);
    offs.push(typeof off === "function" ? off : () => off?.unsubscribe?.());
  }
  return () => {
    for (const off of offs.splice(0)) off();
  };
}
