// tablease.js — the browser client of tablease (DESIGN §5). An ES module without dependencies;
// its types are in tablease.d.ts beside it.
//
//   import { TabLease, registerWebMCPTools } from "/sdk/tablease.js";
//   const lease = new TabLease({ sessionId: "doc-42", getToken, label: "Events" });
//   await lease.start();
//   const save = lease.guard(async (args, { epoch, token }) => api.save(args, token));
//
// # Time model (fail closed)
//
// The browser's wall clock may be wrong, so the client never reads expiresAt. When an answer that
// confirms this tab's lease arrives (acquire, renew, check, a GET naming the tab as owner), the
// local deadline is clock.now() *at the time the request was sent* + remainingMs − margin. The tab
// is the owner only while all of these hold:
//   - it holds an epoch that no event or answer has shown to be over (a newer grant, a release,
//     an expiry, a revoke, LEASE_LOST);
//   - clock.now() is before the local deadline;
//   - the last confirmation was sent after the last moment the tab could have missed news: the
//     event stream going down, or the page being frozen or restored from the back/forward cache.
// Otherwise it is a viewer: read-only until a renew (or check) confirms the lease again.
//
// Epochs strictly increase per session and are never granted twice, so "the lease at epoch E is
// held" makes every epoch below E dead, and "epoch E ended" makes every epoch up to E dead. The
// client keeps only that lower bound (minValidEpoch); late or re-ordered events can only raise it
// to a bound that a newer grant already satisfies.

/** The code of the error a guard returns when this tab may not mutate. */
export const NOT_LEASE_OWNER = "NOT_LEASE_OWNER";

/** Defaults of the TabLease options, in milliseconds. */
export const DEFAULTS = Object.freeze({
  marginMs: 1500, // subtracted from remainingMs (capped at a quarter of the granted TTL)
  hiddenTtlMs: 150000, // asked for while the tab is hidden (the server clamps it)
  backoffBaseMs: 250, // first retry delay after a 503, 429 or network error
  backoffMaxMs: 15000, // cap of the exponential backoff (a longer Retry-After is respected)
  handoffTimeoutMs: 15000, // how long requestHandoff waits for the holder to let go
  hiddenAcquireDelayMs: 3000, // a hidden tab waits this long before taking a free lease
  viewerPollMs: 10000, // a viewer re-reads the lease this often while the event stream is down
  streamIdleMs: 45000, // no byte for this long (the server sends a comment every 15 s): reconnect
  streamNotFoundMs: 60000, // wait before reconnecting when the server has no event stream (404)
});

const ID_RE = /^[A-Za-z0-9._:@|-]{1,128}$/;

/** The clock of the browser: a monotonic now() and timers. Tests pass a fake one. */
export const browserClock = Object.freeze({
  now: () => performance.now(),
  setTimeout: (fn, ms) => setTimeout(fn, ms),
  clearTimeout: (id) => clearTimeout(id),
});

// ---------------------------------------------------------------------------------------------
// Errors

/**
 * An error answer of the tablease API (`{error: {code, message, retryable, details}}`), or a
 * network failure (code "NETWORK", status 0).
 */
export class TabLeaseError extends Error {
  constructor({ status = 0, code = "INTERNAL", message = "", retryable = false, details = {}, retryAfterMs = null, cause } = {}) {
    super(message || code, cause === undefined ? undefined : { cause });
    this.name = "TabLeaseError";
    this.status = status;
    this.code = code;
    this.retryable = retryable;
    this.details = details ?? {};
    this.retryAfterMs = retryAfterMs;
  }
}

/** Milliseconds of a Retry-After header (delta-seconds or an HTTP date), or null. */
export function parseRetryAfter(value, wallNow = Date.now()) {
  if (value == null || value === "") return null;
  const s = String(value).trim();
  if (/^\d+$/.test(s)) return Number(s) * 1000;
  const t = Date.parse(s);
  return Number.isNaN(t) ? null : Math.max(0, t - wallNow);
}

/**
 * The delay before retry number `attempt` (0 for the first retry): exponential from baseMs,
 * capped at maxMs, with "equal jitter" (half fixed, half random, so retries of many tabs spread
 * out but never come back at once), and never shorter than a Retry-After the server sent.
 */
export function backoffDelay(attempt, { baseMs = DEFAULTS.backoffBaseMs, maxMs = DEFAULTS.backoffMaxMs, random = Math.random, retryAfterMs = null } = {}) {
  const cap = Math.min(maxMs, baseMs * 2 ** Math.min(attempt, 30));
  const jittered = cap / 2 + random() * (cap / 2);
  return Math.round(Math.max(jittered, retryAfterMs ?? 0));
}

// ---------------------------------------------------------------------------------------------
// Server-Sent Events

/**
 * An incremental parser of text/event-stream (the WHATWG "event stream interpretation"): feed it
 * decoded text as it arrives; it returns what completed. Items: {kind: "event", type, data, id}
 * (id is the last event id so far, "" when none), {kind: "retry", ms}, {kind: "comment", text}.
 */
export class SSEParser {
  constructor() {
    this._buf = "";
    this._sawCR = false;
    this._first = true;
    this._data = "";
    this._hasData = false;
    this._type = "";
    this.lastEventId = "";
  }

  feed(text) {
    const out = [];
    if (this._first && text.length > 0) {
      if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
      this._first = false;
    }
    let i = 0;
    if (this._sawCR && text[0] === "\n") i = 1; // the \n of a \r\n split across chunks
    this._sawCR = false;
    let start = i;
    for (; i < text.length; i++) {
      const c = text[i];
      if (c !== "\n" && c !== "\r") continue;
      this._line(this._buf + text.slice(start, i), out);
      this._buf = "";
      if (c === "\r") {
        if (i + 1 < text.length) {
          if (text[i + 1] === "\n") i++;
        } else {
          this._sawCR = true;
        }
      }
      start = i + 1;
    }
    this._buf += text.slice(start);
    return out;
  }

  _line(line, out) {
    if (line === "") {
      if (this._hasData) {
        out.push({ kind: "event", type: this._type || "message", data: this._data.endsWith("\n") ? this._data.slice(0, -1) : this._data, id: this.lastEventId });
      }
      this._data = "";
      this._hasData = false;
      this._type = "";
      return;
    }
    if (line[0] === ":") {
      out.push({ kind: "comment", text: line.slice(1).replace(/^ /, "") });
      return;
    }
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value[0] === " ") value = value.slice(1);
    switch (field) {
      case "event":
        this._type = value;
        break;
      case "data":
        this._data += value + "\n";
        this._hasData = true;
        break;
      case "id":
        if (!value.includes("\0")) this.lastEventId = value;
        break;
      case "retry":
        if (/^\d+$/.test(value)) out.push({ kind: "retry", ms: Number(value) });
        break;
      default: // ignored, as the standard says
    }
  }
}

/** Parses the data of a stream event as JSON; the raw string when it is not JSON. */
function parseData(data) {
  try {
    return JSON.parse(data);
  } catch {
    return data;
  }
}

// ---------------------------------------------------------------------------------------------
// Small helpers

function sleep(clock, ms, signal) {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve(false);
    const id = clock.setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve(true);
    }, Math.max(0, ms));
    function onAbort() {
      clock.clearTimeout(id);
      resolve(false);
    }
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

function randomId() {
  const c = globalThis.crypto;
  if (c?.randomUUID) return c.randomUUID();
  const bytes = new Uint8Array(16);
  if (c?.getRandomValues) c.getRandomValues(bytes);
  else for (let i = 0; i < 16; i++) bytes[i] = Math.floor(Math.random() * 256);
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** A fresh tab id: random per page load, kept in memory only (never in sessionStorage). */
export function newTabId() {
  return "t-" + randomId();
}

/** The `sub` claim of a JWT, read without verifying it (only to key the shared stream). */
export function tokenSubject(token) {
  try {
    const part = String(token).split(".")[1];
    if (!part) return "";
    const b64 = part.replace(/-/g, "+").replace(/_/g, "/").padEnd(Math.ceil(part.length / 4) * 4, "=");
    const json = typeof atob === "function" ? atob(b64) : globalThis.Buffer.from(b64, "base64").toString("binary");
    const sub = JSON.parse(decodeURIComponent(escape(json))).sub;
    return typeof sub === "string" ? sub : "";
  } catch {
    return "";
  }
}

function makeEvent(type, detail) {
  if (typeof CustomEvent === "function") return new CustomEvent(type, { detail });
  const e = new Event(type);
  e.detail = detail;
  return e;
}

/** Whether a catalog tool is read-only (MCP default: not read-only, so a mutation). */
export function isReadOnlyTool(tool) {
  return tool?.annotations?.readOnlyHint === true;
}

// ---------------------------------------------------------------------------------------------
// The event stream: one connection, reconnected with backoff

/**
 * Keeps one event-stream connection open: open({lastEventId, signal, onItem, onOpen}) connects
 * once and resolves when the connection ends (or rejects with a TabLeaseError). StreamRunner
 * reconnects with jittered backoff (the server's retry: as the base, Retry-After respected),
 * resumes with the last event id, and reports live/down.
 */
export class StreamRunner {
  constructor({ open, clock = browserClock, random = Math.random, baseMs = 1000, maxMs = 30000, notFoundMs = DEFAULTS.streamNotFoundMs, lastEventId = "", onEvent, onStatus }) {
    this._open = open;
    this._clock = clock;
    this._random = random;
    this._baseMs = baseMs;
    this._maxMs = maxMs;
    this._notFoundMs = notFoundMs;
    this.lastEventId = lastEventId;
    this._onEvent = onEvent;
    this._onStatus = onStatus;
    this.live = false;
    this._ac = null;
  }

  start() {
    if (this._ac) return;
    this._ac = new AbortController();
    this._loop(this._ac.signal);
  }

  stop() {
    if (!this._ac) return;
    this._ac.abort();
    this._ac = null;
    this._setLive(false);
  }

  _setLive(live) {
    if (this.live === live) return;
    this.live = live;
    this._onStatus?.(live);
  }

  async _loop(signal) {
    let attempt = 0;
    while (!signal.aborted) {
      let error = null;
      const conn = new AbortController();
      const onAbort = () => conn.abort();
      signal.addEventListener("abort", onAbort, { once: true });
      try {
        await this._open({
          lastEventId: this.lastEventId,
          signal: conn.signal,
          onOpen: () => {
            attempt = 0;
            this._setLive(true);
          },
          onItem: (item) => {
            if (item.kind === "retry") this._baseMs = Math.max(100, item.ms);
            if (item.kind !== "event") return;
            if (item.id) this.lastEventId = item.id;
            this._onEvent?.({ type: item.type, id: item.id, data: parseData(item.data) });
          },
        });
      } catch (e) {
        error = e;
      } finally {
        signal.removeEventListener("abort", onAbort);
        conn.abort();
      }
      if (signal.aborted) break;
      this._setLive(false);
      let delay = backoffDelay(attempt++, { baseMs: this._baseMs, maxMs: this._maxMs, random: this._random, retryAfterMs: error?.retryAfterMs ?? null });
      if (error?.status === 404 || error?.status === 405) delay = Math.max(delay, this._notFoundMs);
      if (error?.status === 403) delay = Math.max(delay, this._maxMs);
      await sleep(this._clock, delay, signal);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// One stream per browser: Web Locks elect the tab that runs it, BroadcastChannel shares it

const defaultHubs = new Map();

/**
 * The stream of one key (origin + user + session) inside one tab. Subscribers are the TabLease
 * instances of this tab; across tabs, the tab that holds the Web Lock "tablease-stream:<key>"
 * runs the one connection and re-broadcasts every event on the BroadcastChannel "tablease:<key>";
 * the other tabs wait for the lock and listen. When the running tab closes (or is discarded, or
 * stops), the browser frees its lock, the next tab in line gets it and connects, resuming from
 * the last event id it heard.
 */
export class StreamHub {
  constructor(key, { locks, BroadcastChannel: BC, clock = browserClock, random = Math.random, runnerOptions = {} } = {}) {
    this.key = key;
    this._locks = locks;
    this._BC = BC;
    this._clock = clock;
    this._random = random;
    this._runnerOptions = runnerOptions;
    this._subs = new Set();
    this.leader = false;
    this.live = false;
    this.lastEventId = "";
    this._runner = null;
    this._channel = null;
    this._lockAbort = null;
    this._releaseLock = null;
  }

  get shared() {
    return Boolean(this._locks?.request && this._BC);
  }

  add(sub) {
    this._subs.add(sub);
    if (this._subs.size === 1) this._start();
    else sub.onStatus?.({ live: this.live, leader: this.leader });
  }

  /** Removes sub; returns true when the hub has no subscriber left (and has stopped). */
  remove(sub) {
    this._subs.delete(sub);
    if (this._subs.size > 0) return false;
    this._stop();
    return true;
  }

  _start() {
    if (!this.shared) {
      this._lead();
      return;
    }
    const name = "tablease:" + this.key;
    this._channel = new this._BC(name);
    this._channel.onmessage = (e) => this._onMessage(e.data);
    this._lockAbort = new AbortController();
    const lockAbort = this._lockAbort;
    this._locks
      .request("tablease-stream:" + this.key, { signal: lockAbort.signal }, () => {
        if (lockAbort.signal.aborted) return undefined;
        return new Promise((resolve) => {
          this._releaseLock = resolve;
          this._lead();
        });
      })
      .catch(() => {}); // AbortError when we stop while waiting
    this._post({ t: "hello" });
  }

  _stop() {
    this._lockAbort?.abort();
    this._lockAbort = null;
    if (this.leader) {
      this._runner?.stop();
      this._runner = null;
      this.leader = false;
      this._post({ t: "status", live: false, leaving: true });
    }
    this._releaseLock?.();
    this._releaseLock = null;
    try {
      this._channel?.close();
    } catch {}
    this._channel = null;
    this._setStatus(false);
  }

  _lead() {
    const sub = this._subs.values().next().value;
    if (!sub) return;
    this.leader = true;
    this._runner = new StreamRunner({
      clock: this._clock,
      random: this._random,
      ...this._runnerOptions,
      lastEventId: this.lastEventId,
      // Whoever subscribes first in this tab lends its connection (its tabId and token).
      open: (args) => {
        const s = this._subs.values().next().value;
        return (s ?? sub).open(args);
      },
      onEvent: (ev) => {
        if (ev.id) this.lastEventId = ev.id;
        this._post({ t: "event", ev });
        this._deliver(ev);
      },
      onStatus: (live) => {
        this._post({ t: "status", live });
        this._setStatus(live);
      },
    });
    this._post({ t: "status", live: false });
    this._notifyStatus();
    this._runner.start();
  }

  _onMessage(m) {
    if (!m || typeof m !== "object") return;
    if (m.t === "hello") {
      if (this.leader) this._post({ t: "status", live: this.live });
      return;
    }
    if (this.leader) return; // only one tab runs the stream; ignore echoes of a stale leader
    if (m.t === "event" && m.ev) {
      if (m.ev.id) this.lastEventId = m.ev.id;
      this._deliver(m.ev);
    } else if (m.t === "status") {
      this._setStatus(Boolean(m.live));
    }
  }

  _post(m) {
    try {
      this._channel?.postMessage(m);
    } catch {}
  }

  _deliver(ev) {
    for (const s of [...this._subs]) s.onEvent?.(ev);
  }

  _setStatus(live) {
    if (this.live === live) return;
    this.live = live;
    this._notifyStatus();
  }

  _notifyStatus() {
    for (const s of [...this._subs]) s.onStatus?.({ live: this.live, leader: this.leader });
  }
}

function joinHub(hubs, key, env, sub) {
  let hub = hubs.get(key);
  if (!hub) {
    hub = new StreamHub(key, env);
    hubs.set(key, hub);
  }
  hub.add(sub);
  return () => {
    if (hub.remove(sub) && hubs.get(key) === hub) hubs.delete(key);
  };
}

// ---------------------------------------------------------------------------------------------
// TabLease

/**
 * The lease of one tab for one agent session. See tablease.d.ts for the API and DESIGN §5 for
 * the behaviour.
 */
export class TabLease extends EventTarget {
  constructor(options = {}) {
    super();
    const { baseUrl = "", sessionId, getToken, label = "" } = options;
    if (typeof sessionId !== "string" || !ID_RE.test(sessionId) || sessionId === "." || sessionId === "..") {
      throw new TypeError("TabLease: sessionId must be 1–128 characters of [A-Za-z0-9._:@|-]");
    }
    if (typeof getToken !== "function") throw new TypeError("TabLease: getToken must be a function returning the access token");
    if (typeof baseUrl !== "string") throw new TypeError("TabLease: baseUrl must be a string");
    this.sessionId = sessionId;
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.tabId = options.tabId ?? newTabId();
    if (!ID_RE.test(this.tabId)) throw new TypeError("TabLease: tabId must be 1–128 characters of [A-Za-z0-9._:@|-]");
    this._getTokenFn = getToken;
    this._label = label;
    this._ttlMs = options.ttlMs ?? null;
    this._hiddenTtlMs = options.hiddenTtlMs ?? DEFAULTS.hiddenTtlMs;
    this._marginMs = options.marginMs ?? DEFAULTS.marginMs;
    this._autoAcquire = options.autoAcquire ?? true;
    this._handoffMode = options.handoff ?? "auto";
    this._handoffTimeoutMs = options.handoffTimeoutMs ?? DEFAULTS.handoffTimeoutMs;
    this._hiddenAcquireDelayMs = options.hiddenAcquireDelayMs ?? DEFAULTS.hiddenAcquireDelayMs;
    this._viewerPollMs = options.viewerPollMs ?? DEFAULTS.viewerPollMs;
    this._backoff = { baseMs: options.backoffBaseMs ?? DEFAULTS.backoffBaseMs, maxMs: options.backoffMaxMs ?? DEFAULTS.backoffMaxMs };
    this._fetch = options.fetch ?? ((...a) => globalThis.fetch(...a));
    this._clock = options.clock ?? browserClock;
    this._random = options.random ?? Math.random;
    this._document = options.document !== undefined ? options.document : globalThis.document ?? null;
    this._window = options.window !== undefined ? options.window : globalThis.window ?? null;
    this._streamMode = options.stream ?? "fetch"; // "fetch" | "ticket" | false
    this._EventSource = options.EventSource ?? globalThis.EventSource;
    this._streamIdleMs = options.streamIdleMs ?? DEFAULTS.streamIdleMs;
    this._streamNotFoundMs = options.streamNotFoundMs ?? DEFAULTS.streamNotFoundMs;
    const share = options.shareStream ?? true;
    this._shareEnv = {
      locks: share ? options.locks ?? globalThis.navigator?.locks : undefined,
      BroadcastChannel: share ? options.BroadcastChannel ?? globalThis.BroadcastChannel : undefined,
      hubs: options.hubs ?? defaultHubs,
    };

    // Lease state (see the time model at the top of this file).
    this._started = false;
    this._epoch = 0; // the epoch this tab was last granted; 0 = none
    this._token = null; // the lease token of that grant
    this._deadline = -Infinity;
    this._confirmedAt = -Infinity; // send time of the answer the deadline comes from
    this._minValidEpoch = 0;
    this._requireConfirmAfter = -Infinity;
    this._gen = 0; // bumped by release/stop: answers to older requests are ignored
    this._role = "viewer";
    this._ownerAC = null; // aborted when the current ownership ends
    this._view = null; // what this tab knows about the lease: {..lease object, at}
    this._hidden = this._document?.visibilityState === "hidden";
    this._inFlight = 0; // guarded handlers running
    this._renewing = null;
    this._renewAttempt = 0;
    this._acquireAttempt = 0;
    this._viewerAttempt = 0;
    this._timers = { renew: null, role: null, viewer: null, acquire: null };
    this._yieldUntilGrant = false; // after a handoff: no auto-acquire until someone else is granted
    this._releasedByUser = false; // after release(): no auto-acquire until acquire()/takeover()
    this._handoffRelease = false; // the holder was asked to hand off; release at the next safe point
    this._handoffWait = null; // the requester's pending requestHandoff
    this._hiddenForPage = false; // pagehide ran (bfcache or unload)
    this._streamLive = false;
    this._leaveHub = null;
    this._lastToken = null;
    this._catalogCache = new Map();
    this._catalogVersion = null;
    this._listeners = [];
  }

  // --- public state ----------------------------------------------------------------------------

  /** "owner" or "viewer", evaluated now (fail closed). */
  get role() {
    return this._ownerNow() ? "owner" : "viewer";
  }

  /** The epoch this tab holds as owner, or null. */
  get epoch() {
    return this._ownerNow() ? this._epoch : null;
  }

  /** The lease token of the current grant (for backends: header Tablease-Lease), or null. */
  get token() {
    return this._ownerNow() ? this._token : null;
  }

  /** Milliseconds of control left by the local deadline (owner), or 0. */
  get timeLeftMs() {
    return this._ownerNow() ? Math.max(0, Math.floor(this._deadline - this._clock.now())) : 0;
  }

  /** Whether the shared event stream is connected. */
  get streamLive() {
    return this._streamLive;
  }

  /** Whether a handoff is in progress: "releasing" (asked to let go), "requesting", or null. */
  get handoff() {
    if (this._handoffRelease) return "releasing";
    if (this._handoffWait) return "requesting";
    return null;
  }

  /** Number of guarded handlers running now. */
  get inFlight() {
    return this._inFlight;
  }

  /** What this tab knows about the lease, with remainingMs estimated for now. */
  get lease() {
    const owner = this._ownerNow();
    const v = this._view;
    const base = {
      sessionId: this.sessionId,
      tabId: this.tabId,
      held: false,
      holder: null,
      epoch: 0,
      ttlMs: null,
      renewAfterMs: null,
      remainingMs: null,
      transitions: null,
      role: owner ? "owner" : "viewer",
      token: owner ? this._token : null,
      streamLive: this._streamLive,
    };
    if (!v) return base;
    let remainingMs = null;
    if (owner) remainingMs = Math.max(0, Math.floor(this._deadline - this._clock.now()));
    else if (v.held && typeof v.remainingMs === "number") remainingMs = Math.max(0, Math.floor(v.at + v.remainingMs - this._clock.now()));
    return {
      ...base,
      held: Boolean(v.held),
      holder: v.holder ? { ...v.holder } : null,
      epoch: v.epoch ?? 0,
      ttlMs: v.ttlMs ?? null,
      renewAfterMs: v.renewAfterMs ?? null,
      remainingMs,
      transitions: v.transitions ?? null,
    };
  }

  /** addEventListener with the event's detail; returns a function that removes the listener. */
  on(type, fn) {
    const h = (e) => fn(e.detail, e);
    this.addEventListener(type, h);
    return () => this.removeEventListener(type, h);
  }

  // --- lifecycle -------------------------------------------------------------------------------

  /** Starts: listens to the page lifecycle, joins the shared event stream, and acquires the lease
   *  when it is free (autoAcquire). Resolves with `lease` once the first answer is in. */
  async start() {
    if (this._started) return this.lease;
    this._started = true;
    this._gen++;
    this._installLifecycle();
    if (this._streamMode) {
      this._requireConfirmAfter = this._clock.now(); // the stream is not live yet
      await this._joinStream();
    }
    if (!this._started) return this.lease;
    if (this._autoAcquire && !this._hidden) {
      await this._acquireQuietly("try");
    } else {
      await this.refresh().catch((e) => this._emitError(e));
      if (this._autoAcquire) this._maybeAutoAcquire();
    }
    this._scheduleViewerRefresh();
    return this.lease;
  }

  /** Stops: releases the lease (unless {release: false}), leaves the stream, removes listeners. */
  async stop({ release = true } = {}) {
    if (!this._started) return;
    const holding = this._holdsEpoch();
    const epoch = this._epoch;
    this._started = false;
    this._gen++;
    this._clearTimers();
    this._removeLifecycle();
    this._leaveStream();
    this._handoffWait?.finish({ status: "cancelled" });
    this._handoffRelease = false;
    if (holding) this._minValidEpoch = Math.max(this._minValidEpoch, epoch + 1);
    this._update("stopped");
    if (holding && release) {
      await this._post("/lease/release", { tabId: this.tabId, epoch }).catch(() => {});
    }
  }

  // --- operations ------------------------------------------------------------------------------

  /** Acquires the lease if it is free (mode "try"). Resolves with `lease`; rejects with a
   *  TabLeaseError (LEASE_HELD, HANDOFF_PENDING, SESSION_BLOCKED, …). */
  async acquire() {
    this._releasedByUser = false;
    this._yieldUntilGrant = false;
    const r = await this._acquire("try");
    if (r.error) throw r.error;
    return this.lease;
  }

  /** Takes control even though another tab holds it (mode "takeover": a new epoch; the other tab
   *  is told taken_over). Call it only on an explicit user action ("Use here"). */
  async takeover() {
    this._releasedByUser = false;
    this._yieldUntilGrant = false;
    this._handoffWait?.finish({ status: "cancelled" });
    const r = await this._acquire("takeover");
    if (r.error) throw r.error;
    return this.lease;
  }

  /**
   * Asks the holder to hand control over (mode "handoff"). The holder releases at its next safe
   * point; the lease is then reserved for this tab, which claims it. Resolves with {status}:
   * "granted" (with lease), "timeout" (the holder did not let go in time: the caller may offer
   * takeover(), or pass {takeoverOnTimeout: true}), "taken_over", "cancelled" or "failed" (error).
   */
  requestHandoff({ timeoutMs = this._handoffTimeoutMs, takeoverOnTimeout = false } = {}) {
    this._releasedByUser = false;
    this._yieldUntilGrant = false;
    this._handoffWait?.finish({ status: "cancelled" });
    let finish;
    const done = new Promise((resolve) => (finish = resolve));
    const wait = {
      deadline: this._clock.now() + timeoutMs,
      wake: null,
      done: false,
      finish: (result) => {
        if (wait.done) return;
        wait.done = true;
        if (this._handoffWait === wait) this._handoffWait = null;
        wait.wake?.();
        this._emit("handoff", { phase: result.status, ...result });
        finish(result);
      },
    };
    this._handoffWait = wait;
    this._emit("handoff", { phase: "requesting" });
    this._runHandoff(wait, takeoverOnTimeout);
    return done;
  }

  /** Gives the lease up (idempotent). The tab does not take it again by itself until acquire(),
   *  takeover() or requestHandoff() is called. */
  async release() {
    this._releasedByUser = true;
    return this._release("user");
  }

  /** Re-reads the lease (GET …/lease?tabId=). Confirms this tab's lease when it still holds it. */
  async refresh() {
    const gen = this._gen;
    const sentAt = this._clock.now();
    const { body } = await this._request("GET", "/lease", undefined, { query: { tabId: this.tabId } });
    if (gen !== this._gen) return this.lease;
    if (body.held && body.holder?.tabId === this.tabId && body.role !== "viewer" && body.epoch === this._epoch) {
      this._confirm(body, sentAt, gen);
    } else {
      this._learn(body.held ? body.epoch : (body.epoch ?? 0) + 1);
      this._setView(body, sentAt);
      this._update("refresh");
    }
    return this.lease;
  }

  /** Asks the server whether this tab's lease is still current (POST …/lease/check), and
   *  confirms it. Resolves true or false. */
  async check() {
    if (!this._holdsEpoch()) return false;
    const gen = this._gen;
    const epoch = this._epoch;
    const sentAt = this._clock.now();
    try {
      const { body } = await this._post("/lease/check", { tabId: this.tabId, epoch });
      if (gen !== this._gen) return false;
      if (body.valid && body.lease) this._confirm(body.lease, sentAt, gen);
      return this._ownerNow();
    } catch (e) {
      if (gen === this._gen && e.code === "LEASE_LOST") this._lost(epoch, e.details, "lost");
      else if (!e.retryable) this._emitError(e);
      return false;
    }
  }

  /** Changes the label; the owner re-acquires (same epoch) so that other tabs see it. */
  async setLabel(label) {
    this._label = label;
    if (this._ownerNow()) await this._acquire("try");
  }

  /**
   * Wraps a mutation handler: the returned async (args, ctx) runs handler(args, lease, ctx) only
   * while this tab is the owner, with lease = {epoch, token, tabId, sessionId, signal, headers}
   * (signal aborts when ownership ends), and otherwise returns
   * {error: {code: "NOT_LEASE_OWNER", message, retryable: false, details}} without running it.
   * After the page was frozen or restored, or while the lease is unconfirmed, it asks the server
   * (POST …/lease/check) first. {check: "always"} asks before every call; {check: "never"}
   * trusts the local state.
   */
  guard(handler, { check = "auto" } = {}) {
    if (typeof handler !== "function") throw new TypeError("TabLease.guard: handler must be a function");
    return async (args, ctx) => {
      if (this._started && !this._handoffRelease && this._holdsEpoch()) {
        if (check === "always" || (check === "auto" && !this._ownerNow())) await this.check();
      }
      if (!this._ownerNow() || this._handoffRelease) return this._notOwner();
      const lease = {
        epoch: this._epoch,
        token: this._token,
        tabId: this.tabId,
        sessionId: this.sessionId,
        signal: this._ownerAC.signal,
        headers: this._token ? { "Tablease-Lease": this._token } : {},
      };
      this._inFlight++;
      try {
        return await handler(args, lease, ctx);
      } finally {
        this._inFlight--;
        if (this._inFlight === 0 && this._handoffRelease) this._releaseForHandoff();
      }
    };
  }

  /**
   * The tools this tab may register on `route`: GET …/catalog?tabId=&route=, cached by ETag, and
   * filtered again by the local role (a viewer never gets a mutation tool, even when the server
   * still counts it as owner). Resolves {role, version, epoch, tools}.
   */
  async catalog(route = "") {
    const query = { tabId: this.tabId };
    if (route) query.route = route;
    const key = route || "";
    const cached = this._catalogCache.get(key);
    const headers = cached?.etag ? { "If-None-Match": cached.etag } : {};
    const res = await this._request("GET", "/catalog", undefined, { query, headers });
    let body = res.body;
    if (res.status === 304 && cached) body = cached.body;
    else if (res.etag) this._catalogCache.set(key, { etag: res.etag, body });
    const role = this.role;
    const tools = (body.tools ?? []).filter((t) => !t.disabled && (role === "owner" || isReadOnlyTool(t)));
    if (body.version) this._catalogVersion = body.version;
    return { role, serverRole: body.role ?? null, version: body.version ?? null, epoch: role === "owner" ? this._epoch : null, tools };
  }

  // --- internals: state ------------------------------------------------------------------------

  _holdsEpoch() {
    return this._epoch > 0 && this._epoch >= this._minValidEpoch;
  }

  _ownerNow() {
    return this._started && this._holdsEpoch() && this._clock.now() < this._deadline && this._confirmedAt >= this._requireConfirmAfter;
  }

  _whyNotOwner() {
    if (!this._started) return "stopped";
    if (this._handoffRelease) return "handoff";
    if (this._epoch === 0) return "viewer";
    if (!this._holdsEpoch()) return "lost";
    if (this._clock.now() >= this._deadline) return "expired";
    if (this._confirmedAt < this._requireConfirmAfter) return "unconfirmed";
    return "viewer";
  }

  _notOwner() {
    const reason = this._whyNotOwner();
    const messages = {
      stopped: "The lease client of this tab is not running, so this tab may not change anything.",
      handoff: "This tab is handing control of the session to another tab.",
      viewer: "Another tab controls this session; mutation tools run only in the controlling tab.",
      lost: "Another tab controls this session now; mutation tools run only in the controlling tab.",
      lostFree: "This tab no longer controls this session (it was taken over, released, expired or revoked); mutation tools run only in the controlling tab.",
      expired: "This tab's control of the session could not be confirmed in time; it is read-only until its lease is renewed.",
      unconfirmed: "This tab's control of the session is being re-confirmed; it is read-only until then.",
    };
    const v = this._view;
    const held = Boolean(v?.held && v.holder);
    const key = reason === "lost" && !held ? "lostFree" : reason;
    return {
      error: {
        code: NOT_LEASE_OWNER,
        message: messages[key] ?? messages.viewer,
        retryable: false,
        details: {
          sessionId: this.sessionId,
          tabId: this.tabId,
          reason,
          holder: v?.held && v.holder ? { tabId: v.holder.tabId, label: v.holder.label ?? "" } : null,
          epoch: v?.epoch ?? null,
        },
      },
    };
  }

  /** Raises the bound below which epochs are over. */
  _learn(minValid) {
    if (typeof minValid === "number" && minValid > this._minValidEpoch) this._minValidEpoch = minValid;
  }

  _setView(lease, at) {
    if (!lease || typeof lease !== "object") return;
    const v = this._view;
    if (v && typeof lease.epoch === "number" && lease.epoch < v.epoch) return; // older news
    this._view = {
      held: Boolean(lease.held),
      holder: lease.held ? lease.holder ?? null : null,
      epoch: typeof lease.epoch === "number" ? lease.epoch : v?.epoch ?? 0,
      ttlMs: lease.ttlMs ?? null,
      renewAfterMs: lease.renewAfterMs ?? null,
      remainingMs: typeof lease.remainingMs === "number" ? lease.remainingMs : null,
      transitions: lease.transitions ?? null,
      at,
    };
  }

  /** Applies an answer that says this tab holds the lease, from a request sent at sentAt. */
  _confirm(lease, sentAt, gen) {
    if (gen !== this._gen || !this._started) return false;
    const mine = lease && lease.held && lease.holder?.tabId === this.tabId && typeof lease.epoch === "number";
    if (!mine) {
      this._lost(this._epoch, lease, "lost");
      return false;
    }
    if (lease.epoch < this._minValidEpoch) {
      // An event already showed this grant to be over.
      this._update("lost");
      return false;
    }
    if (lease.epoch !== this._epoch) {
      this._epoch = lease.epoch;
      this._token = null;
      this._confirmedAt = -Infinity;
    }
    if (lease.token) this._token = lease.token;
    if (sentAt >= this._confirmedAt) {
      const ttl = typeof lease.ttlMs === "number" && lease.ttlMs > 0 ? lease.ttlMs : lease.remainingMs;
      const margin = Math.min(this._marginMs, Math.floor(ttl / 4));
      this._confirmedAt = sentAt;
      this._deadline = sentAt + lease.remainingMs - margin;
      this._renewAfterMs = lease.renewAfterMs;
      this._learn(lease.epoch);
      this._setView(lease, sentAt);
      this._scheduleRenew(sentAt + (lease.renewAfterMs ?? Math.floor(ttl / 3)));
    }
    this._update("confirmed");
    return true;
  }

  _lost(epoch, details, reason) {
    if (epoch > 0) this._learn(epoch + 1);
    if (details && typeof details === "object") {
      const holder = details.holder ?? null;
      if (typeof details.epoch === "number") {
        this._learn(holder ? details.epoch : details.epoch + 1);
        this._setView({ held: Boolean(holder), holder, epoch: details.epoch, remainingMs: details.remainingMs }, this._clock.now());
      }
    }
    this._clearTimer("renew");
    this._update(reason);
    this._maybeAutoAcquire();
  }

  /** Re-evaluates the role; emits rolechange (and catalog) when it changed; arms the role timer. */
  _update(reason, event = null) {
    const owner = this._ownerNow();
    const role = owner ? "owner" : "viewer";
    this._clearTimer("role");
    if (owner) {
      this._timers.role = this._clock.setTimeout(() => {
        this._timers.role = null;
        this._update("expired");
        if (!this._ownerNow() && this._holdsEpoch() && this._started) this._renewNow();
      }, Math.max(0, this._deadline - this._clock.now()));
    }
    const previous = this._role;
    if (role !== previous) {
      this._role = role;
      if (owner) this._ownerAC = new AbortController();
      else this._ownerAC?.abort();
      this._emit("rolechange", { role, previous, reason, lease: this.lease });
      this._emit("catalog", { version: this._catalogVersion, reason: "role" });
      this._emit("lease", { lease: this.lease, reason, event });
      this._scheduleViewerRefresh();
    } else if (reason === "confirmed" || reason === "refresh" || reason === "event") {
      this._emit("lease", { lease: this.lease, reason, event });
    }
  }

  _emit(type, detail) {
    try {
      this.dispatchEvent(makeEvent(type, detail));
    } catch (e) {
      // A listener's exception must not break the lease machinery.
      globalThis.reportError?.(e);
    }
  }

  _emitError(error) {
    this._emit("error", { error });
  }

  // --- internals: timers -----------------------------------------------------------------------

  _clearTimer(name) {
    if (this._timers[name] != null) {
      this._clock.clearTimeout(this._timers[name]);
      this._timers[name] = null;
    }
  }

  _clearTimers() {
    for (const name of Object.keys(this._timers)) this._clearTimer(name);
  }

  _scheduleRenew(at) {
    this._clearTimer("renew");
    if (!this._started) return;
    this._timers.renew = this._clock.setTimeout(() => {
      this._timers.renew = null;
      this._renewNow();
    }, Math.max(0, at - this._clock.now()));
  }

  /** A viewer re-reads the lease when the holder's lease should have ended by what it knows (to
   *  learn it was renewed, or take it), and every viewerPollMs while the stream is down. */
  _scheduleViewerRefresh(minDelay = 0) {
    this._clearTimer("viewer");
    if (!this._started || this._hiddenForPage || this._holdsEpoch()) return;
    const now = this._clock.now();
    let at = Infinity;
    const v = this._view;
    if (v?.held && typeof v.remainingMs === "number") at = v.at + v.remainingMs + 250;
    if (v?.held && v.remainingMs == null) at = now + 250; // an event named a new holder: learn its time left
    if (!this._streamLive) at = Math.min(at, now + this._viewerPollMs);
    if (at === Infinity) return;
    const delay = Math.max(minDelay, Math.max(0, at - now) + Math.floor(this._random() * 500));
    this._timers.viewer = this._clock.setTimeout(async () => {
      this._timers.viewer = null;
      let backoff = 0;
      try {
        await this.refresh();
        this._viewerAttempt = 0;
      } catch (e) {
        if (!e.retryable) this._emitError(e);
        backoff = backoffDelay(this._viewerAttempt++, { ...this._backoff, random: this._random, retryAfterMs: e.retryAfterMs });
      }
      this._maybeAutoAcquire();
      if (this._timers.viewer == null) this._scheduleViewerRefresh(backoff);
    }, delay);
  }

  // --- internals: acquire, renew, release --------------------------------------------------------

  _body(extra) {
    const body = { tabId: this.tabId, ...extra };
    if (this._hidden) {
      body.hidden = true;
      body.ttlMs = this._hiddenTtlMs;
    } else if (this._ttlMs != null) {
      body.ttlMs = this._ttlMs;
    }
    return body;
  }

  _labelNow() {
    const l = typeof this._label === "function" ? this._label() : this._label;
    return String(l ?? "").slice(0, 200);
  }

  /** One acquire request. Resolves {lease} when granted, {error} otherwise (never rejects). */
  async _acquire(mode) {
    if (!this._started) return { error: new TabLeaseError({ code: "NOT_STARTED", message: "call start() first" }) };
    this._clearTimer("acquire");
    const gen = this._gen;
    const sentAt = this._clock.now();
    const body = this._body({ label: this._labelNow() });
    if (mode !== "try") body.mode = mode;
    try {
      const { body: lease } = await this._post("/lease", body);
      if (gen !== this._gen || !this._started) {
        // released or stopped meanwhile: give back what we were just granted
        if (lease?.holder?.tabId === this.tabId && typeof lease.epoch === "number" && lease.epoch !== this._epoch) {
          this._post("/lease/release", { tabId: this.tabId, epoch: lease.epoch }).catch(() => {});
        }
        return { error: new TabLeaseError({ code: "CANCELLED", message: "the lease was released while the acquire was in flight" }) };
      }
      if (!(lease?.held && lease.holder?.tabId === this.tabId)) {
        // Not granted (a server that answers a handoff request with the current lease).
        this._setView(lease, sentAt);
        this._update("refresh");
        return { pending: true, error: new TabLeaseError({ code: "HANDOFF_PENDING", message: "the holder has been asked to hand over", details: {} }) };
      }
      this._acquireAttempt = 0;
      this._confirm(lease, sentAt, gen);
      return { lease };
    } catch (e) {
      if (gen !== this._gen) return { error: e };
      const d = e.details ?? {};
      if (e.code === "LEASE_HELD" || e.code === "HANDOFF_PENDING" || e.code === "SESSION_BLOCKED") {
        if (d.holder || typeof d.epoch === "number") {
          const epoch = typeof d.epoch === "number" ? d.epoch : this._view?.epoch ?? 0;
          if (d.holder && typeof d.epoch === "number") this._learn(d.epoch);
          this._setView({ held: Boolean(d.holder), holder: d.holder ?? null, epoch, remainingMs: d.remainingMs }, sentAt);
        }
        this._update("refresh");
      }
      return { error: e };
    }
  }

  /** Acquire as the automatic policy does: errors are quiet, retries are scheduled. */
  async _acquireQuietly(mode) {
    const r = await this._acquire(mode);
    if (!r.error || !this._started) return r;
    const e = r.error;
    if (e.code === "LEASE_HELD" || e.code === "CANCELLED") {
      this._acquireAttempt = 0;
    } else if (e.code === "HANDOFF_PENDING" || e.code === "SESSION_BLOCKED") {
      const ms = e.details?.retryAfterMs ?? e.retryAfterMs ?? 1000;
      this._scheduleAcquire(ms + Math.floor(this._random() * 250));
    } else if (e.retryable) {
      this._scheduleAcquire(backoffDelay(this._acquireAttempt++, { ...this._backoff, random: this._random, retryAfterMs: e.retryAfterMs }));
    } else {
      this._emitError(e);
    }
    this._scheduleViewerRefresh();
    return r;
  }

  _scheduleAcquire(delay) {
    this._clearTimer("acquire");
    if (!this._started) return;
    this._timers.acquire = this._clock.setTimeout(() => {
      this._timers.acquire = null;
      if (this._autoAcquire && !this._holdsEpoch() && !this._view?.held && !this._releasedByUser && !this._yieldUntilGrant && !this._handoffWait) this._acquireQuietly("try");
    }, Math.max(0, delay));
  }

  /** When the lease is free (by what this tab knows) and this tab may take it by itself, it
   *  tries after a short random delay (longer when hidden, so that a visible tab wins). */
  _maybeAutoAcquire() {
    if (!this._started || !this._autoAcquire || this._hiddenForPage) return;
    if (this._holdsEpoch() || this._releasedByUser || this._yieldUntilGrant || this._handoffWait) return;
    if (this._view && this._view.held) return;
    if (this._timers.acquire != null) return;
    const delay = (this._hidden ? this._hiddenAcquireDelayMs : 0) + Math.floor(this._random() * 200);
    this._scheduleAcquire(delay);
  }

  /** Renews now, or joins the renew in flight; {fresh: true} asks for one more afterwards
   *  when the renew in flight was sent before news could have been missed. */
  _renewNow({ fresh = false } = {}) {
    if (this._renewing) {
      if (fresh) this._renewAgain = true;
      return this._renewing;
    }
    if (!this._started || !this._holdsEpoch()) return Promise.resolve(false);
    this._clearTimer("renew");
    const gen = this._gen;
    const epoch = this._epoch;
    const sentAt = this._clock.now();
    const hidden = this._hidden;
    let ok = false;
    const p = (async () => {
      try {
        const { body } = await this._post("/lease/renew", this._body({ epoch }));
        this._renewAttempt = 0;
        ok = this._confirm(body, sentAt, gen);
        return ok;
      } catch (e) {
        if (gen !== this._gen || epoch !== this._epoch) return false;
        if (e.code === "LEASE_LOST") {
          this._lost(epoch, e.details, "lost");
        } else if (e.retryable) {
          this._scheduleRenew(this._clock.now() + backoffDelay(this._renewAttempt++, { ...this._backoff, random: this._random, retryAfterMs: e.retryAfterMs }));
        } else {
          // 400/401/403: this tab cannot keep the lease; fail closed and say why.
          this._lost(epoch, null, "lost");
          this._emitError(e);
        }
        return false;
      } finally {
        this._renewing = null;
        const again = (this._renewAgain && ok) || hidden !== this._hidden;
        this._renewAgain = false;
        if (again && this._started && this._holdsEpoch()) this._renewNow();
      }
    })();
    this._renewing = p;
    return p;
  }

  async _release(why, { keepalive = false } = {}) {
    if (!this._holdsEpoch()) return { released: false };
    const epoch = this._epoch;
    this._gen++;
    this._learn(epoch + 1); // read-only from now on, whatever the answer
    this._clearTimer("renew");
    this._update(why === "handoff" ? "handoff" : "released");
    const body = { tabId: this.tabId, epoch };
    for (let attempt = 0; ; attempt++) {
      try {
        const { body: ans } = await this._post("/lease/release", body, { keepalive });
        return ans;
      } catch (e) {
        if (!e.retryable || attempt >= 2 || keepalive) return { released: false, error: e };
        await sleep(this._clock, backoffDelay(attempt, { ...this._backoff, random: this._random, retryAfterMs: e.retryAfterMs }));
      }
    }
  }

  _releaseForHandoff() {
    this._handoffRelease = false;
    this._yieldUntilGrant = true;
    this._emit("handoff", { phase: "released" });
    this._release("handoff");
  }

  _onHandoffRequested(data) {
    this._emit("handoff", { phase: "requested", requester: data.requester ?? null });
    if (this._handoffMode !== "auto") return; // the app calls release() itself
    this._handoffRelease = true;
    this._update("handoff");
    if (this._inFlight === 0) this._releaseForHandoff();
  }

  async _runHandoff(wait, takeoverOnTimeout) {
    let attempt = 0;
    while (!wait.done) {
      if (!this._started) return wait.finish({ status: "cancelled" });
      const r = await this._acquire("handoff");
      if (wait.done) return;
      if (r.lease) return wait.finish({ status: "granted", lease: this.lease });
      const e = r.error;
      let delay;
      if (r.pending || e.code === "HANDOFF_PENDING" || e.code === "LEASE_HELD") {
        attempt = 0;
        // retryAfterMs of a pending request is the time until it lapses (up to the handoff
        // timeout), longer than the reservation that follows a release: poll at most every 2 s
        // without a stream so the reservation is never slept through, and every 5 s with one
        // (its released/expired event wakes us at once).
        const ra = e.details?.retryAfterMs ?? e.retryAfterMs ?? 1000;
        delay = this._streamLive ? Math.min(Math.max(ra, 2000), 5000) : Math.min(Math.max(ra, 250), 2000);
        this._emit("handoff", { phase: "waiting", holder: this._view?.holder ?? null });
      } else if (e.retryable) {
        delay = backoffDelay(attempt++, { ...this._backoff, random: this._random, retryAfterMs: e.retryAfterMs });
      } else {
        return wait.finish({ status: "failed", error: e });
      }
      const left = wait.deadline - this._clock.now();
      if (left <= 0) {
        if (!takeoverOnTimeout) return wait.finish({ status: "timeout" });
        const t = await this._acquire("takeover");
        return wait.finish(t.lease ? { status: "taken_over", lease: this.lease } : { status: "failed", error: t.error });
      }
      await new Promise((resolve) => {
        const id = this._clock.setTimeout(resolve, Math.min(delay, left));
        wait.wake = () => {
          this._clock.clearTimeout(id);
          resolve();
        };
      });
      wait.wake = null;
    }
  }

  // --- internals: HTTP -------------------------------------------------------------------------

  _url(path, query) {
    let url = `${this.baseUrl}/v1/sessions/${encodeURIComponent(this.sessionId)}${path}`;
    if (query) {
      const qs = new URLSearchParams(query).toString();
      if (qs) url += "?" + qs;
    }
    return url;
  }

  async _freshToken(refresh) {
    const t = await this._getTokenFn(refresh ? { refresh: true } : {});
    if (typeof t !== "string" || t === "") throw new TabLeaseError({ status: 401, code: "UNAUTHENTICATED", message: "getToken returned no token" });
    this._lastToken = t;
    return t;
  }

  _post(path, body, opts = {}) {
    return this._request("POST", path, body, opts);
  }

  /** One API call: JSON in, JSON out; a 401 asks getToken({refresh: true}) once and retries.
   *  Resolves {status, body, etag}; rejects with a TabLeaseError. */
  async _request(method, path, body, { query, headers: extra = {}, keepalive = false } = {}) {
    for (let attempt = 0; ; attempt++) {
      let token;
      if (keepalive && this._lastToken) token = this._lastToken; // no await while the page goes
      else token = await this._freshToken(attempt > 0);
      const headers = { Authorization: `Bearer ${token}`, Accept: "application/json", ...extra };
      if (body !== undefined) headers["Content-Type"] = "application/json";
      let res;
      try {
        res = await this._fetch(this._url(path, query), {
          method,
          headers,
          body: body === undefined ? undefined : JSON.stringify(body),
          keepalive,
          cache: "no-store",
        });
      } catch (e) {
        throw new TabLeaseError({ status: 0, code: "NETWORK", message: `tablease: ${method} ${path} failed: ${e?.message ?? e}`, retryable: true, cause: e });
      }
      if (res.status === 401 && attempt === 0 && !keepalive) continue;
      return readAnswer(res, method, path);
    }
  }

  // --- internals: the event stream ---------------------------------------------------------------

  async _joinStream() {
    let sub = "";
    try {
      sub = tokenSubject(await this._freshToken(false));
    } catch (e) {
      this._emitError(e);
    }
    if (!this._started) return;
    const base = this.baseUrl || globalThis.location?.origin || "";
    const key = `${base}|${sub}|${this.sessionId}`;
    const env = {
      locks: this._shareEnv.locks,
      BroadcastChannel: this._shareEnv.BroadcastChannel,
      clock: this._clock,
      random: this._random,
      runnerOptions: { notFoundMs: this._streamNotFoundMs },
    };
    this._leaveHub = joinHub(this._shareEnv.hubs, key, env, {
      open: (args) => (this._streamMode === "ticket" ? this._openTicketStream(args) : this._openFetchStream(args)),
      onEvent: (ev) => this._onStreamEvent(ev),
      onStatus: ({ live }) => this._onStreamStatus(live),
    });
  }

  _leaveStream() {
    const leave = this._leaveHub;
    this._leaveHub = null;
    leave?.();
    this._onStreamStatus(false);
  }

  async _openFetchStream({ lastEventId, signal, onItem, onOpen }) {
    let refresh = false;
    for (let attempt = 0; attempt < 2; attempt++) {
      const token = await this._freshToken(refresh);
      const headers = { Authorization: `Bearer ${token}`, Accept: "text/event-stream" };
      if (lastEventId) headers["Last-Event-ID"] = lastEventId;
      let res;
      try {
        res = await this._fetch(this._url("/events", this._streamQuery()), { headers, signal, cache: "no-store" });
      } catch (e) {
        if (signal.aborted) return;
        throw new TabLeaseError({ code: "NETWORK", message: "tablease: event stream failed", retryable: true, cause: e });
      }
      if (res.status === 401 && attempt === 0) {
        refresh = true;
        continue;
      }
      if (!res.ok) await readAnswer(res, "GET", "/events"); // throws
      const type = res.headers?.get?.("Content-Type") ?? "";
      if (!type.startsWith("text/event-stream") || !res.body) {
        throw new TabLeaseError({ status: res.status, code: "INTERNAL", message: "tablease: the event stream answered " + (type || "no content type"), retryable: true });
      }
      onOpen();
      await this._pump(res.body, signal, onItem);
      return;
    }
  }

  async _pump(body, signal, onItem) {
    const reader = body.getReader();
    const decoder = new TextDecoder();
    const parser = new SSEParser();
    let idle = null;
    const arm = () => {
      if (idle != null) this._clock.clearTimeout(idle);
      idle = this._clock.setTimeout(() => reader.cancel().catch(() => {}), this._streamIdleMs);
    };
    const onAbort = () => reader.cancel().catch(() => {});
    signal.addEventListener("abort", onAbort, { once: true });
    arm();
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done || signal.aborted) break;
        arm();
        for (const item of parser.feed(decoder.decode(value, { stream: true }))) onItem(item);
      }
    } catch (e) {
      if (!signal.aborted) throw new TabLeaseError({ code: "NETWORK", message: "tablease: event stream broke", retryable: true, cause: e });
    } finally {
      if (idle != null) this._clock.clearTimeout(idle);
      signal.removeEventListener("abort", onAbort);
    }
  }

  /** The EventSource path: POST …/events/ticket, then EventSource(…/events?tabId=&ticket=
   *  &lastEventId=). The ticket is single-use, so every reconnect takes a new one. */
  /** The query of the stream: the tab (with its label and hidden flag, for the server's list of
   *  connected tabs; with a shared stream that is the tab running it). */
  _streamQuery(extra = {}) {
    const q = { tabId: this.tabId };
    const label = this._labelNow();
    if (label) q.label = label;
    if (this._hidden) q.hidden = "true";
    return { ...q, ...extra };
  }

  async _openTicketStream({ lastEventId, signal, onItem, onOpen }) {
    const ES = this._EventSource;
    if (typeof ES !== "function") throw new TabLeaseError({ code: "UNSUPPORTED", message: "no EventSource in this environment" });
    const { body } = await this._post("/events/ticket", { tabId: this.tabId });
    if (signal.aborted) return;
    const extra = { ticket: body.ticket };
    if (lastEventId) extra.lastEventId = lastEventId; // EventSource cannot set Last-Event-ID
    const es = new ES(this._url("/events", this._streamQuery(extra)));
    await new Promise((resolve) => {
      const close = () => {
        es.close();
        resolve();
      };
      signal.addEventListener("abort", close, { once: true });
      es.onopen = () => onOpen();
      es.onerror = () => close(); // reconnect through the runner with a new ticket
      for (const type of ["snapshot", "lease", "tabs", "catalog"]) {
        es.addEventListener(type, (e) => onItem({ kind: "event", type, data: e.data, id: e.lastEventId ?? "" }));
      }
    });
  }

  _onStreamStatus(live) {
    if (this._streamLive === live) return;
    this._streamLive = live;
    if (!live && this._started && this._streamMode) {
      // We may miss news from now on: read-only until a renew sent after this point confirms.
      this._requireConfirmAfter = this._clock.now();
      this._update("stream_down");
      if (this._holdsEpoch()) this._renewNow({ fresh: true });
    }
    this._emit("stream", { live });
    this._scheduleViewerRefresh();
  }

  _onStreamEvent(ev) {
    if (!this._started) return;
    const now = this._clock.now();
    const d = ev.data;
    switch (ev.type) {
      case "snapshot": {
        if (!d || typeof d !== "object") return;
        if (typeof d.epoch === "number") this._learn(d.held ? d.epoch : d.epoch + 1);
        const mine = d.held && d.holder?.tabId === this.tabId && d.epoch === this._epoch;
        if (!mine) this._setView(d, now);
        this._afterLeaseNews(d.held, { type: "snapshot", ...d, id: ev.id });
        return;
      }
      case "lease": {
        if (!d || typeof d !== "object" || typeof d.epoch !== "number") return;
        const held = d.holder != null && d.type !== "released" && d.type !== "expired" && d.type !== "revoked";
        this._learn(held ? d.epoch : d.epoch + 1);
        const mine = held && d.holder.tabId === this.tabId && d.epoch === this._epoch;
        if (!mine) {
          const v = this._view;
          if (!v || d.epoch >= v.epoch) {
            const same = v && v.held && held && v.epoch === d.epoch;
            this._view = {
              held,
              holder: held ? d.holder : null,
              epoch: d.epoch,
              ttlMs: same ? v.ttlMs : null,
              renewAfterMs: same ? v.renewAfterMs : null,
              remainingMs: same ? v.remainingMs : null,
              transitions: v?.transitions ?? null,
              at: same ? v.at : now,
            };
          }
          if (held && (d.type === "granted" || d.type === "taken_over")) this._yieldUntilGrant = false;
        }
        if (d.type === "handoff_requested" && mine) this._onHandoffRequested(d);
        if (!held && this._handoffWait) this._handoffWait.wake?.();
        this._afterLeaseNews(held, { ...d, id: ev.id });
        return;
      }
      case "tabs":
        this._emit("tabs", d);
        return;
      case "catalog":
        this._catalogCache.clear();
        if (d && typeof d === "object" && d.version) this._catalogVersion = d.version;
        this._emit("catalog", { version: this._catalogVersion, reason: "version" });
        return;
      default:
    }
  }

  _afterLeaseNews(held, event) {
    this._update("event", event);
    if (!held) this._maybeAutoAcquire();
    this._scheduleViewerRefresh();
  }

  // --- internals: page lifecycle ---------------------------------------------------------------

  _installLifecycle() {
    const doc = this._document;
    const win = this._window;
    const add = (target, type, fn) => {
      if (!target?.addEventListener) return;
      target.addEventListener(type, fn);
      this._listeners.push(() => target.removeEventListener(type, fn));
    };
    add(doc, "visibilitychange", () => this._onVisibility());
    add(doc, "freeze", () => this._onFreeze());
    add(doc, "resume", () => this._onResume());
    add(win, "pagehide", () => this._onPageHide());
    add(win, "pageshow", () => this._onPageShow());
  }

  _removeLifecycle() {
    for (const off of this._listeners.splice(0)) off();
  }

  _onVisibility() {
    const hidden = this._document?.visibilityState === "hidden";
    if (hidden === this._hidden) return;
    this._hidden = hidden;
    if (!this._started || this._hiddenForPage) return;
    if (this._holdsEpoch()) {
      this._renewNow(); // at once, with hidden (a longer TTL) or back to the normal TTL
    } else if (!hidden) {
      this.refresh().then(() => this._maybeAutoAcquire(), () => {});
    }
  }

  _onFreeze() {
    this._frozen = true;
  }

  _onResume() {
    this._frozen = false;
    if (!this._started) return;
    // Timers did not run and news may have been missed: confirm before mutating again.
    this._requireConfirmAfter = this._clock.now();
    this._update("resumed");
    if (this._holdsEpoch()) this._renewNow({ fresh: true });
    else this.refresh().then(() => this._maybeAutoAcquire(), () => {});
  }

  _onPageHide() {
    if (!this._started || this._hiddenForPage) return;
    this._hiddenForPage = true;
    // Release with keepalive (the page may be gone before an answer), leave the stream so that
    // another tab runs it, and stop the timers. A page restored from the back/forward cache
    // starts over in pageshow.
    if (this._holdsEpoch()) this._release("pagehide", { keepalive: true });
    this._yieldUntilGrant = false;
    this._clearTimers();
    this._leaveStream();
  }

  _onPageShow() {
    if (!this._started || !this._hiddenForPage) return;
    this._hiddenForPage = false;
    this._requireConfirmAfter = this._clock.now();
    this._update("resumed");
    if (this._streamMode) this._joinStream();
    if (this._autoAcquire && !this._releasedByUser && !this._hidden) this._acquireQuietly("try");
    else this.refresh().then(() => this._maybeAutoAcquire(), () => {});
  }
}

async function readAnswer(res, method, path) {
  const etag = res.headers?.get?.("ETag") ?? null;
  if (res.status === 304) return { status: 304, body: null, etag };
  let text = "";
  try {
    text = await res.text();
  } catch {}
  let body = null;
  if (text) {
    try {
      body = JSON.parse(text);
    } catch {}
  }
  if (res.ok) {
    if (body === null && text) throw new TabLeaseError({ status: res.status, code: "INTERNAL", message: `tablease: ${method} ${path} answered something that is not JSON`, retryable: false });
    return { status: res.status, body: body ?? {}, etag };
  }
  const err = body?.error ?? {};
  const retryAfterMs = parseRetryAfter(res.headers?.get?.("Retry-After")) ?? (typeof err.details?.retryAfterMs === "number" ? err.details.retryAfterMs : null);
  const status = res.status;
  throw new TabLeaseError({
    status,
    code: err.code ?? (status === 404 ? "NOT_FOUND" : status >= 500 ? "UNAVAILABLE" : "HTTP_" + status),
    message: err.message ?? `tablease: ${method} ${path} answered ${status}`,
    retryable: err.retryable ?? (status === 429 || status === 502 || status === 503 || status === 504),
    details: err.details ?? {},
    retryAfterMs,
  });
}

// ---------------------------------------------------------------------------------------------
// Tools: from the catalog to WebMCP or an app's own registry

/**
 * The tool definitions this tab may expose now: the catalog for the route (or `tools` when the
 * catalog has none or cannot be read), filtered by role, each with an execute(args, ctx) that
 * runs its handler — mutation handlers through lease.guard. Tools without a handler are left out.
 */
export async function toolDefinitions(lease, { handlers = {}, route = "", tools: fallback = null, onError } = {}) {
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
export function registerWebMCPTools(lease, options = {}) {
  const { handlers = {}, route = () => globalThis.location?.pathname ?? "", tools = null, onError, onChange } = options;
  let mc = options.modelContext;
  let legacy = options.legacy ?? false;
  if (!mc) {
    if (globalThis.document?.modelContext?.registerTool) mc = globalThis.document.modelContext;
    else if (globalThis.navigator?.modelContext?.registerTool) {
      mc = globalThis.navigator.modelContext;
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
    const signal = def.readOnly ? ac.signal : anySignal([ac.signal, lease._ownerAC?.signal ?? AbortSignal.abort()]);
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
export function syncToolRegistry(lease, registry, { handlers = {}, route = "", tools = null, onError } = {}) {
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
