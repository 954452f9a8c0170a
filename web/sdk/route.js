// route.js — the page's route as tools see it: catalog route patterns matched in the browser (the
// same rules as the server's, docs/catalog.md "Route patterns"), and RouteTracker, which follows SPA
// navigation (history.pushState/replaceState, popstate, the Navigation API) and counts route
// changes.

/**
 * A route pattern parsed: {src, segs: [{kind: "lit", lit} | {kind: "param", name} | {kind: "wild"}]},
 * or null when it is not a valid pattern.
 */
export function parseRoutePattern(src) {
  if (typeof src !== "string" || src === "" || src[0] !== "/") return null;
  if (src === "/") return { src, segs: [] };
  if (src.endsWith("/")) return null;
  const parts = src.slice(1).split("/");
  const segs = [];
  for (let i = 0; i < parts.length; i++) {
    const p = parts[i];
    if (p === "") return null;
    if (p === "*") {
      if (i !== parts.length - 1) return null;
      segs.push({ kind: "wild" });
    } else if (p[0] === ":") {
      if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(p.slice(1))) return null;
      segs.push({ kind: "param", name: p.slice(1) });
    } else {
      segs.push({ kind: "lit", lit: p });
    }
  }
  return { src, segs };
}

/** The segments of a concrete route: the query and fragment dropped, empty segments ignored. */
export function routeSegments(route) {
  let r = String(route ?? "");
  const cut = r.search(/[?#]/);
  if (cut >= 0) r = r.slice(0, cut);
  return r.split("/").filter(Boolean);
}

/** A concrete route in its normal form: "/" and the segments ("/events/" is "/events"). */
export function normalizeRoute(route) {
  return "/" + routeSegments(route).join("/");
}

// The longest route the catalog endpoint takes, in bytes (owner/catalog's CheckRoute).
const MAX_ROUTE_BYTES = 2048;

const utf8 = new TextEncoder();

/** route as the catalog endpoint takes it: in its normal form, with every character that is not
 *  printable ASCII (a space, "é", as an app's route function may give them) percent-encoded as
 *  UTF-8, the way location.pathname has them. "" (no route: the server then answers the tools of
 *  every route alone) for no route or one over the endpoint's 2048 bytes. */
export function catalogRoute(route) {
  if (!route) return "";
  const r = normalizeRoute(route).replace(/[^\x21-\x7e]/gu, (c) => Array.from(utf8.encode(c), (b) => "%" + b.toString(16).toUpperCase().padStart(2, "0")).join(""));
  return r.length > MAX_ROUTE_BYTES ? "" : r;
}

const KIND_ORDER = { lit: 0, param: 1, wild: 2 };

/** <0 when pattern a is more specific than b: segment by segment a literal beats a parameter,
 *  which beats a wildcard; then the longer pattern wins (as the server orders them). */
function compareSpecificity(a, b) {
  const n = Math.min(a.segs.length, b.segs.length);
  for (let i = 0; i < n; i++) {
    const d = KIND_ORDER[a.segs[i].kind] - KIND_ORDER[b.segs[i].kind];
    if (d !== 0) return d;
  }
  return b.segs.length - a.segs.length;
}

/**
 * Matches a concrete route against a pattern (a string or a parsed one). Returns the parameters
 * by name ({event_id: "evt-1"}, percent-decoded when valid) or null when it does not match. A
 * final "*" matches one or more segments, given as params["*"] ("a/b").
 * @param {string | {src: string, segs: any[]}} pattern
 * @param {string} route
 * @returns {Record<string, string> | null}
 */
export function matchRoute(pattern, route) {
  const p = typeof pattern === "string" ? parseRoutePattern(pattern) : pattern;
  if (!p) return null;
  const segs = routeSegments(route);
  const wild = p.segs.length > 0 && p.segs[p.segs.length - 1].kind === "wild";
  const fixed = wild ? p.segs.slice(0, -1) : p.segs;
  if (wild ? segs.length <= fixed.length : segs.length !== fixed.length) return null;
  const params = /** @type {Record<string, string>} */ ({});
  for (let i = 0; i < fixed.length; i++) {
    const s = fixed[i];
    if (s.kind === "lit" && s.lit !== segs[i]) return null;
    if (s.kind === "param") params[s.name] = decode(segs[i]);
  }
  if (wild) params["*"] = segs.slice(fixed.length).map(decode).join("/");
  return params;
}

function decode(seg) {
  try {
    return decodeURIComponent(seg);
  } catch {
    return seg;
  }
}

/**
 * Where a tool profile exists on route: {pattern, params} for its most specific matching route
 * pattern, {pattern: null, params: {}} for a tool without routes (every route), or null when the
 * profile does not exist there.
 */
export function profileMatch(tool, route) {
  const routes = tool?.routes;
  if (!Array.isArray(routes) || routes.length === 0) return { pattern: null, params: {} };
  let best = null;
  for (const src of routes) {
    const p = parseRoutePattern(src);
    if (!p) continue;
    const params = matchRoute(p, route);
    if (params && (!best || compareSpecificity(p, best.p) < 0)) best = { p, params };
  }
  return best ? { pattern: best.p.src, params: best.params } : null;
}

/**
 * The profiles of tools that exist on route, at most one per name (the most specific), each as
 * {tool, pattern, params}. The catalog server already answers only these; this is for the app's
 * own tool list (the fallback when the catalog is empty) and to learn the route parameters.
 */
export function profilesFor(tools, route) {
  const byName = new Map();
  for (const tool of tools ?? []) {
    const m = profileMatch(tool, route);
    if (!m) continue;
    const prev = byName.get(tool.name);
    if (!prev || better(m, prev)) byName.set(tool.name, { tool, ...m });
  }
  return [...byName.values()];
}

function better(m, prev) {
  if (prev.pattern === null) return m.pattern !== null;
  if (m.pattern === null) return false;
  return compareSpecificity(parseRoutePattern(m.pattern), parseRoutePattern(prev.pattern)) < 0;
}

// --- following navigation ----------------------------------------------------------------------

/** The event a RouteTracker's window gets after history.pushState or replaceState. */
export const HISTORY_EVENT = "tablease:history";

const patched = new WeakSet();

/** Wraps history.pushState and replaceState of win once, so that each call is followed by a
 *  HISTORY_EVENT on win (SPA routers call them, and no browser event says so). */
function patchHistory(win) {
  const h = win?.history;
  if (!h || patched.has(h)) return;
  patched.add(h);
  for (const name of ["pushState", "replaceState"]) {
    const orig = h[name];
    if (typeof orig !== "function") continue;
    h[name] = function (...args) {
      const r = orig.apply(this, args);
      try {
        win.dispatchEvent(new Event(HISTORY_EVENT));
      } catch {}
      return r;
    };
  }
}

/**
 * The page's current route, followed through SPA navigation: history.pushState/replaceState,
 * popstate, hashchange, and where the browser has the Navigation API its navigate and
 * currententrychange events. `navigated(route?)` is the hook for an app's router that wants to
 * say it explicitly. Every change of the route (its normal form) increases `generation` and
 * emits `change` {route, previous, generation}.
 *
 * Options: `window` (default globalThis.window), `base` (a path prefix the app is mounted under,
 * e.g. "/demo": "/demo/events/evt-1" is the route "/events/evt-1"), `route` (a function giving
 * the route, instead of location.pathname minus base).
 */
export class RouteTracker extends EventTarget {
  constructor(options = {}) {
    super();
    this._window = options.window !== undefined ? options.window : globalThis.window ?? null;
    this._base = normalizeRoute(options.base ?? "/") === "/" ? "" : normalizeRoute(options.base);
    this._read = typeof options.route === "function" ? options.route : null;
    this._route = this._readRoute();
    this._generation = 0;
    this._offs = [];
    const w = this._window;
    if (w?.addEventListener) {
      patchHistory(w);
      const check = () => this.navigated();
      const later = () => queueMicrotask(check); // navigate fires before the URL changes
      this._listen(w, HISTORY_EVENT, check);
      this._listen(w, "popstate", check);
      this._listen(w, "hashchange", check);
      const nav = w.navigation;
      if (nav?.addEventListener) {
        this._listen(nav, "navigate", later);
        this._listen(nav, "currententrychange", check);
      }
    }
  }

  /** The current route, e.g. "/events/evt-1". */
  get route() {
    return this._route;
  }

  /** How many times the route changed since this tracker was made. */
  get generation() {
    return this._generation;
  }

  /** addEventListener with the event's detail; returns a function that removes the listener. */
  on(type, fn) {
    const h = (e) => fn(e.detail, e);
    this.addEventListener(type, h);
    return () => this.removeEventListener(type, h);
  }

  /** The app's router tells the route (or, without an argument, says it may have changed: the
   *  tracker reads it again). Returns whether it changed. */
  navigated(route = undefined) {
    const next = route === undefined ? this._readRoute() : normalizeRoute(route);
    if (next === this._route) return false;
    const previous = this._route;
    this._route = next;
    this._generation++;
    const detail = { route: next, previous, generation: this._generation };
    const e = typeof CustomEvent === "function" ? new CustomEvent("change", { detail }) : Object.assign(new Event("change"), { detail });
    this.dispatchEvent(e);
    return true;
  }

  /** Stops following navigation. */
  close() {
    for (const off of this._offs.splice(0)) off();
  }

  _listen(target, type, fn) {
    target.addEventListener(type, fn);
    this._offs.push(() => target.removeEventListener(type, fn));
  }

  _readRoute() {
    if (this._read) return normalizeRoute(this._read());
    let path = normalizeRoute(this._window?.location?.pathname ?? "/");
    if (this._base) {
      if (path === this._base) path = "/";
      else if (path.startsWith(this._base + "/")) path = path.slice(this._base.length);
    }
    return path;
  }
}
