// Test doubles for the tablease.js tests (not a test file itself): a fake monotonic clock, a
// fake tablease server that follows DESIGN §3 closely enough to drive the client, and a fake
// document and window for the page lifecycle.

import { profilesFor } from "./route.js";

/** A clock whose time moves only when the test says so. */
export class FakeClock {
  constructor(start = 1000) {
    this._now = start;
    this._timers = new Map();
    this._next = 1;
  }

  now() {
    return this._now;
  }

  setTimeout(fn, ms) {
    const id = this._next++;
    this._timers.set(id, { at: this._now + Math.max(0, ms), fn, id });
    return id;
  }

  clearTimeout(id) {
    this._timers.delete(id);
  }

  /** Pending timers, soonest first: [{at, id}]. */
  pending() {
    return [...this._timers.values()].sort((a, b) => a.at - b.at || a.id - b.id).map(({ at, id }) => ({ at, id }));
  }

  /** Moves time forward by ms, running due timers in order and letting promises settle. */
  async advance(ms) {
    const target = this._now + ms;
    await flush();
    for (;;) {
      const due = [...this._timers.values()].filter((t) => t.at <= target).sort((a, b) => a.at - b.at || a.id - b.id)[0];
      if (!due) break;
      this._timers.delete(due.id);
      this._now = due.at;
      due.fn();
      await flush();
    }
    this._now = target;
    await flush();
  }

  /** A promise resolved after ms of fake time. */
  sleep(ms) {
    return new Promise((resolve) => this.setTimeout(resolve, ms));
  }
}

/** Lets every queued promise job (and I/O callbacks such as stream reads) run. */
export async function flush() {
  for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
}

/** An unsigned JWT-shaped token with the given sub (the client only decodes it to key streams). */
export function fakeJWT(sub, n = 1) {
  const b64 = (o) => Buffer.from(JSON.stringify(o)).toString("base64url");
  return `${b64({ alg: "none" })}.${b64({ sub, n })}.sig`;
}

export class FakeDocument extends EventTarget {
  constructor() {
    super();
    this.visibilityState = "visible";
  }

  setHidden(hidden) {
    this.visibilityState = hidden ? "hidden" : "visible";
    this.dispatchEvent(new Event("visibilitychange"));
  }

  fire(type) {
    this.dispatchEvent(new Event(type));
  }
}

export class FakeWindow extends EventTarget {
  fire(type, props = {}) {
    const e = new Event(type);
    Object.assign(e, props);
    this.dispatchEvent(e);
  }
}

/** A window with location and history, for the route tests: pushState and replaceState change
 *  location.pathname without an event (as browsers do); back() fires popstate. */
export class FakeBrowserWindow extends FakeWindow {
  constructor(path = "/") {
    super();
    this.location = { pathname: path, origin: "http://app.test" };
    const entries = [path];
    let index = 0;
    const win = this;
    this.history = {
      pushState(state, title, url) {
        entries.splice(index + 1, Infinity, new URL(url, "http://app.test").pathname);
        index++;
        win.location.pathname = entries[index];
      },
      replaceState(state, title, url) {
        entries[index] = new URL(url, "http://app.test").pathname;
        win.location.pathname = entries[index];
      },
      back() {
        if (index === 0) return;
        index--;
        win.location.pathname = entries[index];
        win.fire("popstate");
      },
    };
  }
}

const json = (status, body, headers = {}) => ({ status, body, headers });

function errorBody(code, message, details = {}, retryable = false) {
  return { error: { code, message, retryable, details } };
}

/**
 * A tablease server in memory, timed by a FakeClock. fetch is a fetch() for the client. Every
 * request is recorded in calls as {method, path, query, body, headers, keepalive, at}.
 */
export class FakeServer {
  constructor(clock, { sessionId = "s1", ttlMs = 45000, hiddenMaxMs = 150000, latencyMs = 0, tools = [] } = {}) {
    this.clock = clock;
    this.sessionId = sessionId;
    this.defaultTtl = ttlMs;
    this.hiddenMaxMs = hiddenMaxMs;
    this.latencyMs = latencyMs;
    this.epoch = 1000;
    this.holder = null; // {tabId, label, hidden}
    this.expiresAt = 0;
    this.ttlMs = ttlMs;
    this.transitions = 0;
    this.handoff = null; // {requester, at}
    this.handoffTimeoutMs = 15000; // TABLEASE_HANDOFF_TIMEOUT
    this.reserved = null; // {tabId, until}
    this.blockedUntil = 0; // an admin's block: acquires answer 423 SESSION_BLOCKED until then
    this.gone = new Map(); // tabs that said they are gone → until when their acquires answer 409 TAB_GONE
    this.calls = [];
    this.failures = []; // [{match: "POST /lease/renew", status, code, retryAfter, times}]
    this.down = false; // answer every request with a network error
    this.tools = tools;
    this.catalogVersion = "sha256:v1";
    this.streams = new Set();
    this.tabs = new Map(); // tabId → {tabId, label, hidden}: the tabs listed by PUT …/tabs/{tabId}
    this.tabSeqs = new Map(); // tabId → the seq of its latest PUT or DELETE applied (DESIGN §3 Presence)
    this.holds = []; // [{match, gate}]: requests that reach the server only once let go (hold)
    this.eventSeq = 0;
    this.tokenSeq = 0;
    this.knowsNewEpoch = true; // false: an older server, which refuses the acquire's newEpoch
    this.fetch = (url, init = {}) => this._fetch(url, init);
    this.sockets = []; // the FakeSockets opened, in order
    // How new sockets behave: "normal"; "refused" (close before they open, as when the server has
    // no /v1/socket); "hang" (never open: a proxy holding the handshake); "error" (err and never
    // tell a close, as a page's CSP makes them); "silent" (open, and never answer).
    this.socketBehaviour = "normal";
    const server = this;
    /** A WebSocket constructor whose sockets reach this server (FakeSocket). */
    this.WebSocket = class extends FakeSocket {
      constructor(url) {
        super(server, url);
      }
    };
  }

  /** Closes every open socket from the server's side (idle, shutdown). */
  closeSockets(code = 1001) {
    for (const s of this.sockets) if (s.readyState === 1) s.closeFromServer(code);
  }

  valid() {
    return this.holder != null && this.clock.now() < this.expiresAt;
  }

  /** Makes the next `times` requests matching "METHOD /path" fail with status (and code), with a
   *  network error (network), or never be answered until the client aborts them (hang). */
  fail(match, { status = 503, code = "STORE_UNAVAILABLE", retryAfter = null, times = 1, network = false, hang = false } = {}) {
    this.failures.push({ match, status, code, retryAfter, times, network, hang });
  }

  /** Holds the next request matching "METHOD /path" on its way, as a slow connection would: the
   *  server gets it only once the returned function is called. */
  hold(match) {
    let release;
    const gate = new Promise((resolve) => (release = resolve));
    this.holds.push({ match, gate });
    return release;
  }

  lease(tabId) {
    const valid = this.valid();
    const out = {
      sessionId: this.sessionId,
      held: valid,
      holder: valid ? { ...this.holder } : null,
      epoch: this.epoch,
      grantedAt: null,
      expiresAt: null,
      ttlMs: this.ttlMs,
      remainingMs: valid ? Math.max(0, Math.floor(this.expiresAt - this.clock.now())) : 0,
      renewAfterMs: Math.floor(this.ttlMs / 3),
      transitions: this.transitions,
    };
    if (tabId) out.role = valid && this.holder.tabId === tabId ? "owner" : "viewer";
    this.lapseHandoff();
    if (valid && this.handoff) {
      const remainingMs = Math.max(0, this.handoff.at + this.handoffTimeoutMs - this.clock.now());
      out.handoff = { state: "requested", requester: { tabId: this.handoff.requester, label: "" }, remainingMs };
    }
    return out;
  }

  /** A handoff request the holder did not answer within the handoff timeout lapses. */
  lapseHandoff() {
    if (this.handoff && this.clock.now() - this.handoff.at >= this.handoffTimeoutMs) this.handoff = null;
  }

  holderAnswer(tabId) {
    return { ...this.lease(tabId), token: `lt.${this.epoch}.${++this.tokenSeq}` };
  }

  clampTtl(body) {
    const max = body.hidden ? this.hiddenMaxMs : 120000;
    return body.ttlMs ? Math.min(body.ttlMs, max) : this.defaultTtl;
  }

  /** Appends a lease event and sends it to every open stream. */
  emit(type, data) {
    const id = `${Math.floor(this.clock.now())}-${this.eventSeq++}`;
    const frame = `id: ${id}\nevent: ${type}\ndata: ${JSON.stringify(data)}\n\n`;
    for (const s of this.streams) s.send(frame);
    this.lastId = id;
    return id;
  }

  leaseEvent(type, extra = {}) {
    const valid = this.valid();
    return this.emit("lease", { type, sessionId: this.sessionId, epoch: this.epoch, holder: valid ? { ...this.holder } : null, previous: null, reason: "", at: new Date(0).toISOString(), ...extra });
  }

  /** Lets the lease expire now (as if time had passed) and announces it. */
  expireNow() {
    const prev = this.holder;
    this.expiresAt = this.clock.now();
    this.holder = null;
    this.leaseEvent("expired", { previous: prev ? { tabId: prev.tabId, epoch: this.epoch } : null });
  }

  /** An admin revokes the lease (a new epoch, no holder) and blocks new grants for blockMs. */
  revoke({ blockMs = 0, reason = "revoked by an admin" } = {}) {
    const prev = this.holder;
    this.epoch++;
    this.transitions++;
    this.holder = null;
    this.expiresAt = this.clock.now();
    this.blockedUntil = this.clock.now() + blockMs;
    this.leaseEvent("revoked", { previous: prev ? { tabId: prev.tabId, epoch: this.epoch - 1 } : null, reason });
  }

  /** Another tab (not a TabLease) takes the lease over. */
  takeoverBy(tabId, label = "other") {
    const prev = this.holder;
    this.epoch++;
    this.transitions++;
    this.holder = { tabId, label, hidden: false };
    this.ttlMs = this.defaultTtl;
    this.expiresAt = this.clock.now() + this.ttlMs;
    this.leaseEvent("taken_over", { previous: prev ? { tabId: prev.tabId, epoch: this.epoch - 1 } : null });
  }

  /** After the store lost data: the epochs it grants from now on are above floor, as a real
   *  store's clock floors them above every epoch it minted before. */
  floorEpochsAbove(floor) {
    const grant = this.grant.bind(this);
    this.grant = (body, ttl) => {
      this.epoch = Math.max(this.epoch, floor + 1000);
      grant(body, ttl);
    };
  }

  grant(body, ttl) {
    this.epoch++;
    this.transitions++;
    this.holder = { tabId: body.tabId, label: body.label ?? "", hidden: Boolean(body.hidden) };
    this.ttlMs = ttl;
    this.expiresAt = this.clock.now() + ttl;
    this.handoff = null;
  }

  async _fetch(url, init) {
    const u = new URL(url, "http://tablease.test");
    const method = init.method ?? "GET";
    const path = u.pathname.replace(`/v1/sessions/${encodeURIComponent(this.sessionId)}`, "");
    const body = init.body ? JSON.parse(init.body) : undefined;
    const headers = { ...(init.headers ?? {}) };
    const held = this.holds.findIndex((x) => x.match === `${method} ${path}`);
    if (held >= 0) await this.holds.splice(held, 1)[0].gate;
    const call = { method, path, query: Object.fromEntries(u.searchParams), body, headers, keepalive: Boolean(init.keepalive), cache: init.cache, at: this.clock.now(), via: init.via ?? "http" };
    this.calls.push(call);
    if (this.down) throw new TypeError("fetch failed");
    const f = this.failures.find((x) => x.match === `${method} ${path}` && x.times > 0);
    let ans;
    if (f) {
      f.times--;
      if (f.network) throw new TypeError("fetch failed");
      if (f.hang) {
        return new Promise((_, reject) => {
          init.signal?.addEventListener("abort", () => reject(init.signal.reason ?? new DOMException("aborted", "AbortError")), { once: true });
        });
      }
      const h = f.retryAfter != null ? { "Retry-After": String(f.retryAfter) } : {};
      ans = json(f.status, errorBody(f.code, "injected", {}, f.status === 503 || f.status === 429), h);
    } else if (path === "/events" && method === "GET") {
      return this._stream(call, init.signal);
    } else {
      ans = this._handle(method, path, call);
    }
    if (this.latencyMs > 0) await this.clock.sleep(this.latencyMs);
    const h = new Headers({ "Content-Type": "application/json", ...(ans.headers ?? {}) });
    return new Response(ans.status === 304 || ans.status === 204 ? null : JSON.stringify(ans.body), { status: ans.status, headers: h });
  }

  /** Whether a PUT or DELETE of tabId numbered seq comes after one numbered as high or higher was
   *  applied, and so changes nothing; records seq otherwise. */
  staleTabWrite(tabId, seq) {
    if (seq === undefined) return false;
    if (seq <= (this.tabSeqs.get(tabId) ?? 0)) return true;
    this.tabSeqs.set(tabId, seq);
    return false;
  }

  _handle(method, path, { body, query, headers }) {
    const auth = headers.Authorization ?? "";
    if (this.rejectToken && auth === `Bearer ${this.rejectToken}`) return json(401, errorBody("UNAUTHENTICATED", "expired token"));
    const now = this.clock.now();
    this.lapseHandoff();
    if (method === "POST" && path === "/lease") {
      const ttl = this.clampTtl(body);
      const mode = body.mode ?? "try";
      const mine = this.valid() && this.holder.tabId === body.tabId;
      const goneUntil = this.gone.get(body.tabId) ?? -Infinity;
      if (goneUntil > now) return json(409, errorBody("TAB_GONE", "this tab said it is gone", { retryAfterMs: Math.ceil(goneUntil - now) }, true));
      if (body.newEpoch !== undefined && !this.knowsNewEpoch) {
        return json(400, errorBody("INVALID_ARGUMENT", 'request body: unknown field "newEpoch"', { field: "newEpoch" }));
      }
      if (now < this.blockedUntil) {
        return json(423, errorBody("SESSION_BLOCKED", "grants for this session are blocked", { retryAfterMs: Math.ceil(this.blockedUntil - now) }, true));
      }
      if (mine && body.newEpoch === true) {
        const prev = this.epoch;
        this.grant(body, ttl);
        this.leaseEvent("granted", { previous: { tabId: body.tabId, epoch: prev }, reason: "new_epoch" });
        return json(200, this.holderAnswer(body.tabId));
      }
      if (this.reserved && now < this.reserved.until && this.reserved.tabId !== body.tabId && !mine && mode !== "takeover") {
        return json(409, errorBody("HANDOFF_PENDING", "reserved", { retryAfterMs: Math.ceil(this.reserved.until - now) }));
      }
      if (mine) {
        this.holder = { tabId: body.tabId, label: body.label ?? "", hidden: Boolean(body.hidden) };
        this.ttlMs = ttl;
        this.expiresAt = now + ttl;
        return json(200, this.holderAnswer(body.tabId));
      }
      if (!this.valid()) {
        this.reserved = null;
        this.grant(body, ttl);
        this.leaseEvent("granted");
        return json(200, this.holderAnswer(body.tabId));
      }
      if (mode === "takeover") {
        const prev = this.holder;
        this.grant(body, ttl);
        this.leaseEvent("taken_over", { previous: { tabId: prev.tabId, epoch: this.epoch - 1 } });
        return json(200, this.holderAnswer(body.tabId));
      }
      if (mode === "handoff") {
        if (!this.handoff || this.handoff.requester !== body.tabId) {
          this.handoff = { requester: body.tabId, at: now };
          this.leaseEvent("handoff_requested", { requester: { tabId: body.tabId, label: body.label ?? "" } });
        }
        // As the server does: the time until the request lapses (its handoff timeout).
        return json(409, errorBody("HANDOFF_PENDING", "asked the holder", { retryAfterMs: Math.max(1, this.handoffTimeoutMs - (now - this.handoff.at)) }));
      }
      return json(409, errorBody("LEASE_HELD", "held", { holder: { ...this.holder }, remainingMs: Math.floor(this.expiresAt - now), epoch: this.epoch }));
    }
    if (method === "POST" && path === "/lease/renew") {
      if (this.valid() && this.holder.tabId === body.tabId && this.epoch === body.epoch) {
        this.ttlMs = this.clampTtl(body);
        this.expiresAt = now + this.ttlMs;
        this.holder.hidden = Boolean(body.hidden);
        return json(200, this.holderAnswer(body.tabId));
      }
      return json(409, errorBody("LEASE_LOST", "lost", this.valid() ? { holder: { ...this.holder }, epoch: this.epoch } : { epoch: this.epoch }));
    }
    if (method === "POST" && path === "/lease/release") {
      if (body.gone === true) {
        this.gone.set(body.tabId, now + 60000); // lease.GoneWindow
        if (this.handoff?.requester === body.tabId) this.handoff = null; // a closed tab is handed nothing
        if (this.reserved?.tabId === body.tabId) this.reserved = null;
        body = { tabId: body.tabId, epoch: this.valid() && this.holder.tabId === body.tabId ? this.epoch : 0 };
      }
      if (this.valid() && this.holder.tabId === body.tabId && this.epoch === body.epoch) {
        const prev = this.holder;
        this.holder = null;
        this.expiresAt = now;
        if (this.handoff) {
          this.reserved = { tabId: this.handoff.requester, until: now + 5000 };
          this.handoff = null;
        }
        this.leaseEvent("released", { previous: { tabId: prev.tabId, epoch: this.epoch } });
        return json(200, { released: true });
      }
      return json(200, { released: false });
    }
    if (method === "POST" && path === "/lease/check") {
      if (this.valid() && this.holder.tabId === body.tabId && this.epoch === body.epoch) return json(200, { valid: true, lease: this.lease(body.tabId) });
      return json(409, errorBody("LEASE_LOST", "lost", { epoch: this.epoch }));
    }
    if (method === "GET" && path === "/lease") return json(200, this.lease(query.tabId));
    if (method === "GET" && path === "/tabs") return json(200, { tabs: [...this.tabs.values()].map((t) => ({ connectedAt: new Date(0).toISOString(), ...t })) });
    const tab = /^\/tabs\/([^/]+)$/.exec(path);
    if (tab && method === "PUT") {
      const tabId = decodeURIComponent(tab[1]);
      if (this.staleTabWrite(tabId, body?.seq)) return json(200, { tabId, ttlMs: 45000, refreshAfterMs: 15000 });
      const known = this.tabs.has(tabId);
      this.tabs.set(tabId, { tabId, label: body?.label ?? "", hidden: Boolean(body?.hidden) });
      if (!known) this.emit("tabs", { type: "joined", tab: this.tabs.get(tabId) });
      return json(200, { tabId, ttlMs: 45000, refreshAfterMs: 15000 });
    }
    if (tab && method === "DELETE") {
      const tabId = decodeURIComponent(tab[1]);
      if (this.staleTabWrite(tabId, query.seq ? Number(query.seq) : undefined)) return { status: 204, body: null };
      if (this.tabs.delete(tabId)) this.emit("tabs", { type: "left", tab: { tabId } });
      return { status: 204, body: null };
    }
    if (method === "POST" && path === "/events/ticket") return json(200, { ticket: `tk-${++this.tokenSeq}`, expiresInMs: 30000 });
    if (method === "GET" && path === "/catalog") {
      // As the server checks a route (owner/catalog's CheckRoute).
      if (query.route !== undefined && (query.route.length > 2048 || !/^\/[\x21-\x7e]*$/.test(query.route))) {
        return json(400, errorBody("INVALID_ARGUMENT", "route is not a route", { field: "route" }));
      }
      const role = this.valid() && this.holder.tabId === query.tabId ? "owner" : "viewer";
      let tools = this.tools.filter((t) => role === "owner" || t.annotations?.readOnlyHint === true);
      // As the server does (owner/catalog): on a route, the most specific profile per name.
      if (query.route) tools = profilesFor(tools, query.route).map((p) => p.tool);
      else tools = tools.filter((t) => !t.routes?.length);
      const etag = `"${this.catalogVersion}-${role}-${this.epoch}-${query.route ?? ""}"`;
      if (headers["If-None-Match"] === etag) return json(304, null, { ETag: etag });
      return json(200, { role, epoch: role === "owner" ? this.epoch : undefined, version: this.catalogVersion, tools }, { ETag: etag });
    }
    return json(404, errorBody("NOT_FOUND", "no such route"));
  }

  _stream(call, signal) {
    let ctrl;
    const enc = new TextEncoder();
    const stream = {
      call,
      send: (text) => {
        try {
          ctrl.enqueue(enc.encode(text));
        } catch {}
      },
      close: () => {
        this.streams.delete(stream);
        try {
          ctrl.close();
        } catch {}
      },
    };
    const body = new ReadableStream({
      start: (c) => {
        ctrl = c;
      },
      cancel: () => {
        this.streams.delete(stream);
      },
    });
    this.streams.add(stream);
    signal?.addEventListener("abort", () => stream.close(), { once: true });
    stream.tabId = call.query.tabId;
    stream.send(`retry: 1000\n${this.snapshotFrame(stream.tabId)}`);
    return Promise.resolve(new Response(body, { status: 200, headers: { "Content-Type": "text/event-stream" } }));
  }

  snapshotFrame(tabId) {
    const data = { ...this.lease(tabId), tabs: [...this.tabs.values()], catalogVersion: this.catalogVersion };
    if (this.keepaliveMs != null) data.keepaliveMs = this.keepaliveMs; // the server's; the fake sends no keepalive
    return `id: ${Math.floor(this.clock.now())}-${this.eventSeq++}\nevent: snapshot\ndata: ${JSON.stringify(data)}\n\n`;
  }

  /** Sends a fresh snapshot on every open stream, as the server does when a watch starts over
   *  without dropping the connection (a store that lost its data). */
  resnapshot() {
    for (const s of this.streams) s.send(this.snapshotFrame(s.tabId));
  }

  /** Ends every open stream (as a dropped connection would). */
  dropStreams() {
    for (const s of [...this.streams]) s.close();
  }

  callsTo(method, path) {
    return this.calls.filter((c) => c.method === method && c.path === path);
  }
}

/**
 * A lease socket on a FakeServer (DESIGN §3, "Lease socket"): it opens on the next microtask
 * (or behaves as server.socketBehaviour says); an auth message's token is accepted unless it is
 * the server's rejectToken; each call is served as its HTTP request (in server.calls with via
 * "socket"), and a network failure of the server closes the socket. Messages are answered in
 * order.
 */
export class FakeSocket {
  constructor(server, url) {
    this.server = server;
    this.url = url;
    this.readyState = 0;
    this.sent = []; // the messages the client sent, parsed
    this.token = null;
    this._queue = Promise.resolve();
    server.sockets.push(this);
    this.behaviour = server.socketBehaviour;
    this.openedAt = server.clock.now();
    queueMicrotask(() => {
      if (this.readyState !== 0 || this.behaviour === "hang") return;
      if (this.behaviour === "error") {
        this.readyState = 3;
        return this.onerror?.({});
      }
      if (this.behaviour === "refused" || server.down) return this._closed(1006);
      this.readyState = 1;
      this.onopen?.({});
    });
  }

  send(data) {
    if (this.readyState !== 1) throw new Error("not open");
    const m = JSON.parse(data);
    this.sent.push(m);
    this._queue = this._queue.then(() => this._serve(m));
  }

  close() {
    if (this.readyState >= 2) return;
    this.readyState = 2;
    queueMicrotask(() => this._closed(1000));
  }

  closeFromServer(code) {
    this._closed(code);
  }

  _closed(code) {
    if (this.readyState === 3) return;
    this.readyState = 3;
    this.onclose?.({ code });
  }

  _answer(a) {
    if (this.readyState === 1) this.onmessage?.({ data: JSON.stringify(a) });
  }

  async _serve(m) {
    if (this.readyState !== 1 || this.behaviour === "silent") return;
    if (m.op === "auth") {
      if (this.server.rejectToken && m.token === this.server.rejectToken) return this._answer({ id: m.id, status: 401, body: errorBody("UNAUTHENTICATED", "expired token") });
      this.token = m.token;
      return this._answer({ id: m.id, status: 200, body: { sub: "user", expiresInMs: 3600000 } });
    }
    if (!this.token) return this._answer({ id: m.id, status: 401, body: errorBody("UNAUTHENTICATED", "auth first") });
    const path = m.op === "acquire" ? "/lease" : `/lease/${m.op}`;
    let res;
    try {
      res = await this.server._fetch(`/v1/sessions/${encodeURIComponent(m.sid)}${path}`, {
        method: "POST", headers: { Authorization: `Bearer ${this.token}`, "Content-Type": "application/json" }, body: JSON.stringify(m.body), via: "socket",
      });
    } catch {
      return this._closed(1006); // the server is down
    }
    const text = await res.text();
    const a = { id: m.id, status: res.status, body: text ? JSON.parse(text) : undefined };
    const ra = res.headers.get("Retry-After");
    if (ra != null) a.retryAfterMs = Number(ra) * 1000;
    this._answer(a);
  }
}

/** Options for a TabLease wired to the fakes. */
export function fakeOptions(server, clock, extra = {}) {
  return {
    baseUrl: "http://tablease.test",
    sessionId: server.sessionId,
    getToken: async ({ refresh } = {}) => (refresh ? "token-2" : "token-1"),
    label: "Tab",
    fetch: server.fetch,
    clock,
    random: () => 0,
    document: new FakeDocument(),
    window: new FakeWindow(),
    stream: false,
    shareStream: false,
    presence: false, // the presence tests turn it on
    hubs: new Map(), // each lease its own tab: no stream shared through module state across tests
    ...extra,
  };
}

/** Web Locks in memory: exclusive locks granted in request order; abortable while waiting;
 *  {steal: true} takes a held lock at once (the holder's request rejects with AbortError). */
export class FakeLocks {
  constructor() {
    this._held = new Map(); // name → the request holding it, or false
    this._queue = new Map(); // name → [{fn, resolve, reject, signal}]
  }

  request(name, options, fn) {
    if (typeof options === "function") {
      fn = options;
      options = {};
    }
    return new Promise((resolve, reject) => {
      const req = { fn, resolve, reject, signal: options.signal };
      if (req.signal?.aborted) return reject(new DOMException("aborted", "AbortError"));
      req.signal?.addEventListener("abort", () => {
        const q = this._queue.get(name) ?? [];
        const i = q.indexOf(req);
        if (i >= 0) {
          q.splice(i, 1);
          reject(new DOMException("aborted", "AbortError"));
        }
      }, { once: true });
      if (!this._queue.has(name)) this._queue.set(name, []);
      if (options.steal) {
        const holder = this._held.get(name);
        if (holder) {
          holder.stolen = true;
          this._held.set(name, false);
          holder.reject(new DOMException("stolen", "AbortError"));
        }
        this._queue.get(name).unshift(req);
      } else {
        this._queue.get(name).push(req);
      }
      this._grant(name);
    });
  }

  _grant(name) {
    if (this._held.get(name)) return;
    const q = this._queue.get(name) ?? [];
    const req = q.shift();
    if (!req) return;
    this._held.set(name, req);
    Promise.resolve()
      .then(() => req.fn({ name, mode: "exclusive" }))
      .then(req.resolve, req.reject)
      .finally(() => {
        if (req.stolen) return; // freed when it was stolen
        this._held.set(name, false);
        this._grant(name);
      });
  }
}

/**
 * TabLeases for n tabs of one browser: each with its own module state (hubs) and document, all
 * with the same Web Locks and Node's real BroadcastChannel, sharing one event stream.
 */
export function browserTabs(TabLease, n, server, clock, extra = {}) {
  const locks = new FakeLocks();
  return Array.from(
    { length: n },
    (_, i) =>
      new TabLease(
        fakeOptions(server, clock, {
          stream: "fetch",
          shareStream: true,
          locks,
          BroadcastChannel,
          hubs: new Map(),
          getToken: async () => fakeJWT("alice"),
          label: `tab ${i}`,
          ...extra,
        }),
      ),
  );
}

/** Lets promise jobs and BroadcastChannel messages (delivered on the real loop) through, then
 *  advances the clock by ms. */
export async function settle(clock, ms = 0) {
  for (let i = 0; i < 5; i++) {
    await flush();
    await new Promise((r) => setTimeout(r, 5));
  }
  if (ms) await clock.advance(ms);
}
