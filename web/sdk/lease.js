// lease.js — TabLease, the lease of one tab for one agent session: a small state machine.
//
// # States (TabLease.state)
//
//   stopped      before start() and after stop()
//   viewer       this tab holds no epoch that could still be valid
//   owner        it holds an epoch, confirmed by the server after the last moment it could have
//                missed news, and the local deadline has not passed: guards run mutations
//   unconfirmed  it holds an epoch, but the deadline passed or news may have been missed (the
//                stream went down, its carrier left a ping unanswered, the page was frozen):
//                read-only until a renew or a check confirms it
//   releasing    it was asked to hand control over: read-only, releasing at its safe point
//   away         the page was hidden for good or put in the back/forward cache (pagehide)
//
// Only `owner` may mutate, and `owner` is checked again against the clock whenever it is read,
// so a timer that a browser delays can never extend it.
//
// # Time model (fail closed)
//
// The browser's wall clock may be wrong, so the client never reads expiresAt. When an answer that
// confirms this tab's lease arrives (acquire, renew, check, a GET naming the tab as owner), the
// local deadline is clock.now() *at the time the request was sent* + remainingMs − margin.
// Epochs strictly increase per session and are never granted twice, so "the lease at epoch E is
// held" makes every epoch below E dead, and "epoch E ended" makes every epoch up to E dead. The
// client keeps only that lower bound (minValidEpoch); late or re-ordered events can only raise it
// to a bound that a newer grant already satisfies.
//
// # Mutations in flight
//
// Each period of ownership has its own AbortController and its own count of guarded handlers
// running. When the period ends its signal aborts and its handlers stop counting, so a handler
// that never settles cannot hold back a handoff or a later period. A holder asked to hand over
// waits for its running handlers at most handoffGraceMs, then aborts them and releases — unless
// one of them has an interaction with the user open (_beginInteraction, counted by call.js): then
// it keeps the lease until the interaction ends or the request lapses.

import { DEFAULTS, SessionApi, TabLeaseError, USER_CHANGED, backoffDelay, browserClock, randomId, sleep, tokenSubject } from "./http.js";
import { defaultHubs, fetchStreamOpener, joinHub, ticketStreamOpener } from "./stream.js";
import { catalogRoute } from "./route.js";
import { LeaseSocket, socketUrl } from "./socket.js";
import { mayHaveActed } from "./call.js";
import { isReadOnlyTool } from "./tools.js";

export { tokenSubject };

/** The code of the error a guard returns when this tab may not mutate. */
export const NOT_LEASE_OWNER = "NOT_LEASE_OWNER";

const ID_RE = /^[A-Za-z0-9._:@|-]{1,128}$/;

/** The least time between two reads of the lease by a viewer's timer. */
const VIEWER_READ_GAP_MS = 1000;

/** How many routes' catalog answers a tab keeps (the latest read), for their ETags and for the
 *  tool adapters to stand in with when the catalog cannot be read. */
const CATALOG_CACHE_ROUTES = 32;

/** The least time a renew waits for its answer, however close its deadline. */
const MIN_RENEW_TIMEOUT_MS = 1000;

/** The states of a TabLease, and the states each may move to. */
const TRANSITIONS = Object.freeze({
  stopped: ["viewer"],
  viewer: ["owner", "unconfirmed", "releasing", "away", "stopped"],
  owner: ["viewer", "unconfirmed", "releasing", "away", "stopped"],
  unconfirmed: ["owner", "viewer", "releasing", "away", "stopped"],
  releasing: ["owner", "viewer", "unconfirmed", "away", "stopped"],
  away: ["viewer", "stopped"],
});

/**
 * A fresh tab id: "t-" and a randomId (24 characters), random per page load, kept in memory only
 * (never in sessionStorage).
 */
export function newTabId() {
  return "t-" + randomId();
}

function makeEvent(type, detail) {
  if (typeof CustomEvent === "function") return new CustomEvent(type, { detail });
  const e = new Event(type);
  /** @type {any} */ (e).detail = detail;
  return e;
}

const MESSAGES = {
  stopped: "The lease client of this tab is not running, so this tab may not change anything.",
  away: "This page is being left, so this tab may not change anything.",
  handoff: "This tab is handing control of the session to another tab.",
  viewer: "Another tab controls this session; mutation tools run only in the controlling tab.",
  lost: "Another tab controls this session now; mutation tools run only in the controlling tab.",
  lostFree: "This tab no longer controls this session (it was taken over, released, expired or revoked); mutation tools run only in the controlling tab.",
  expired: "This tab's control of the session could not be confirmed in time; it is read-only until its lease is renewed.",
  unconfirmed: "This tab's control of the session is being re-confirmed; it is read-only until then.",
};

/** The label as the server takes it (lease.ValidateLabel): printable characters only, at most
 *  200 of them, counted as code points. Spaces, tabs and line breaks become a space; other
 *  characters that are not printable (a control character, a zero-width joiner, a lone surrogate)
 *  are left out. */
export function printableLabel(l) {
  let out = "";
  let n = 0;
  for (const ch of String(l ?? "")) {
    if (n === MAX_LABEL) break;
    if (PRINTABLE.test(ch)) out += ch;
    else if (SPACE.test(ch)) out += " ";
    else continue;
    n++;
  }
  return out;
}
const MAX_LABEL = 200;
const PRINTABLE = /^[\p{L}\p{M}\p{N}\p{P}\p{S} ]$/u; // Go's unicode.IsPrint
const SPACE = /^[\p{Z}\t\n\v\f\r]$/u;

/**
 * The lease of one tab for one agent session. See tablease.d.ts for the API and
 * docs/browser-client.md for the behaviour.
 */
export class TabLease extends EventTarget {
  constructor(options = /** @type {any} */ ({})) {
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
    this._label = label;
    this._ttlMs = options.ttlMs ?? null;
    this._hiddenTtlMs = options.hiddenTtlMs ?? DEFAULTS.hiddenTtlMs;
    this._marginMs = options.marginMs ?? DEFAULTS.marginMs;
    this._autoAcquire = options.autoAcquire ?? true;
    this._handoffMode = options.handoff ?? "auto";
    this._handoffTimeoutMs = options.handoffTimeoutMs ?? DEFAULTS.handoffTimeoutMs;
    this._handoffGraceMs = options.handoffGraceMs ?? DEFAULTS.handoffGraceMs;
    this._hiddenAcquireDelayMs = options.hiddenAcquireDelayMs ?? DEFAULTS.hiddenAcquireDelayMs;
    this._viewerPollMs = options.viewerPollMs ?? DEFAULTS.viewerPollMs;
    this._backoff = { baseMs: options.backoffBaseMs ?? DEFAULTS.backoffBaseMs, maxMs: options.backoffMaxMs ?? DEFAULTS.backoffMaxMs };
    this._clock = options.clock ?? browserClock;
    this._random = options.random ?? Math.random;
    this._document = options.document !== undefined ? options.document : globalThis.document ?? null;
    this._window = options.window !== undefined ? options.window : globalThis.window ?? null;
    this._presenceOn = options.presence ?? true;
    const fetchFn = options.fetch ?? ((input, init) => globalThis.fetch(input, init));
    const origin = options.origin ?? globalThis.location?.origin ?? "";
    // Renews and checks go over a lease socket when the browser has WebSocket and the page does
    // not say otherwise (socket: false), HTTP otherwise and whenever the socket cannot.
    const WebSocketFn = options.WebSocket ?? globalThis.WebSocket;
    const url = socketUrl(this.baseUrl, origin);
    const socket = (options.socket ?? true) && typeof WebSocketFn === "function" && url ? new LeaseSocket({ url, WebSocket: WebSocketFn, clock: this._clock }) : null;
    this._api = new SessionApi({
      baseUrl: this.baseUrl, sessionId, getToken, fetch: fetchFn, origin,
      clock: options.clock ?? browserClock, timeoutMs: options.requestTimeoutMs ?? DEFAULTS.requestTimeoutMs,
      onUserChange: (e, previousToken) => this._userChanged(e, previousToken),
      socket,
    });
    const streamMode = options.stream ?? "fetch"; // "fetch" | "ticket" | false
    this._streamMode = streamMode;
    const share = options.shareStream ?? true;
    this._streamEnv = {
      hubs: options.hubs ?? defaultHubs,
      locks: share ? options.locks ?? globalThis.navigator?.locks : undefined,
      BroadcastChannel: share ? options.BroadcastChannel ?? globalThis.BroadcastChannel : undefined,
      document: this._document,
      clock: this._clock,
      random: this._random,
      carrierTimeoutMs: options.carrierTimeoutMs ?? DEFAULTS.carrierTimeoutMs,
      runnerOptions: { notFoundMs: options.streamNotFoundMs ?? DEFAULTS.streamNotFoundMs },
    };
    const query = () => this._streamQuery();
    this._openStream =
      streamMode === "ticket"
        ? ticketStreamOpener({ api: this._api, EventSource: options.EventSource ?? globalThis.EventSource, query, tabId: this.tabId })
        : fetchStreamOpener({ api: this._api, fetch: fetchFn, query, clock: this._clock, idleMs: options.streamIdleMs ?? null });

    /** @type {"stopped"|"viewer"|"owner"|"unconfirmed"|"releasing"|"away"} */
    this._state = "stopped";
    // When this tab takes a free lease by itself: "auto"; "manual" after release() (until
    // acquire(), takeover() or requestHandoff()); "yield" after it handed control over (until
    // another tab is granted).
    /** @type {"auto"|"manual"|"yield"} */
    this._policy = this._autoAcquire ? "auto" : "manual";
    // The facts the state is computed from.
    this._epoch = 0; // the epoch this tab was last granted; 0 = none
    this._token = null; // the lease token of that grant
    this._deadline = -Infinity;
    this._confirmedAt = -Infinity; // send time of the answer the deadline comes from
    this._minValidEpoch = 0;
    // The highest epoch an answer or an event showed, and when it came (see _storeWentBack).
    this._seen = { epoch: 0, at: -Infinity };
    // The highest epoch the store lost, while this tab has not yet taken an epoch above it (_remint).
    this._lostAbove = 0;
    this._reminting = false; // a _remint request in flight
    // The epoch whose renew the server refused to authenticate (a 401 after a fresh token, a
    // 403): the server may still list this tab at it, which the tab cannot prove. It does not
    // hold it, until an acquire confirms it again (the server gives the holder its epoch back).
    this._unproven = 0;
    this._viewerReadAt = -Infinity; // when the viewer's timer last read the lease
    this._requireConfirmAfter = -Infinity; // the last moment news may have been missed
    this._handoffAsk = null; // {requester, graceTimer}: this holder was asked to hand over
    this._manualAsk = null; // {at, epoch}: so was it, in handoff "manual" (release() answers it)
    this._gen = 0; // bumped by start, stop and release: answers to older requests are ignored
    this._acquiring = 0; // acquire requests waiting for their answers (pagehide says the tab is gone)
    this._givenBack = 0; // the epoch of the last lease listed for this tab that it released unasked (_claimListed)
    this._freezes = 0; // how many times the page was frozen
    this._releasedOnStop = false; // the last stop() released the lease this tab held
    this._period = null; // the current period of ownership: {ac, inFlight}
    this._view = null; // what this tab knows about the lease: {..lease object, at}
    this._hidden = this._document?.visibilityState === "hidden";
    this._renewing = null;
    this._renewAgain = false;
    this._attempts = { renew: 0, acquire: 0, viewer: 0, presence: 0, join: 0 };
    this._timers = { renew: null, role: null, viewer: null, acquire: null, presence: null, join: null };
    this._handoffWait = null; // this tab's pending requestHandoff
    this._stream = null; // {hub, leave} while joined
    this._streamLive = false;
    this._streamCarrier = false;
    this._streamWasLive = false; // live once: a stream live again is back from an outage
    this._streamDownAt = -Infinity; // when the stream last went down
    this._presencePut = null; // the last PUT of this tab's listing: {sentAt, label, hidden, inFlight, again, failed}
    this._presenceSeq = 0; // the number of this tab's last PUT or DELETE of its listing (_presenceSeqNext)
    this._unreachable = false; // the last request got no answer (reported once per outage)
    this._catalogCache = new Map();
    this._catalogReads = new Map(); // route → {news, p}: the read in flight
    this._catalogNews = 0; // catalog events so far (a role or version change)
    this._catalogVersion = null;
    this._listeners = [];
  }

  // --- public state ----------------------------------------------------------------------------

  /** The state, evaluated now (see the top of this file).
   *  @returns {import("./tablease.js").LeaseState} */
  get state() {
    return this._computeState();
  }

  /** "owner" or "viewer", evaluated now (fail closed).
   *  @returns {"owner" | "viewer"} */
  get role() {
    return this._computeState() === "owner" ? "owner" : "viewer";
  }

  /** The epoch this tab holds as owner, or null. */
  get epoch() {
    return this.role === "owner" ? this._epoch : null;
  }

  /** The lease token of the current grant (for backends: header Tablease-Lease), or null. */
  get token() {
    return this.role === "owner" ? this._token : null;
  }

  /** Milliseconds of control left by the local deadline (owner), or 0. */
  get timeLeftMs() {
    return this.role === "owner" ? Math.max(0, Math.floor(this._deadline - this._clock.now())) : 0;
  }

  /** Whether the shared event stream is connected and heard from. */
  get streamLive() {
    return this._streamLive && this._missedSince() === -Infinity;
  }

  /** Whether this tab runs the browser's event stream for the session (the carrier). */
  get streamCarrier() {
    return Boolean(this._stream?.hub.carrier);
  }

  /** Whether a handoff is in progress: "releasing" (asked to let go), "requesting", or null. */
  get handoff() {
    if (this._state === "releasing") return "releasing";
    if (this._handoffWait) return "requesting";
    return null;
  }

  /** The AbortSignal of the current period of ownership (it aborts when the period ends), or
   *  null when this tab is not the owner. */
  get signal() {
    return this.role === "owner" && this._period ? this._period.ac.signal : null;
  }

  /** Number of guarded handlers running in the current period of ownership. */
  get inFlight() {
    return this._period?.inFlight ?? 0;
  }

  /** What this tab knows about the lease, with remainingMs estimated for now.
   *  @returns {import("./tablease.js").LeaseView} */
  get lease() {
    const owner = this.role === "owner";
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
      role: /** @type {"owner" | "viewer"} */ (owner ? "owner" : "viewer"),
      token: owner ? this._token : null,
      streamLive: this.streamLive,
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

  /** Starts: listens to the page lifecycle, joins the shared event stream, announces the tab, and
   *  acquires the lease when it is free (autoAcquire). Resolves with `lease` once the first answer
   *  is in, and after requestTimeoutMs at the latest, whatever getToken and the server do: a page
   *  that awaits start() before it shows the role and registers its tools waits no longer. A
   *  first answer that never came is an `error` event (and retried); one that comes later is a
   *  `rolechange` or `lease` event. */
  async start() {
    if (this._state !== "stopped") return this.lease;
    this._gen++;
    this._hidden = this._document?.visibilityState === "hidden"; // as the page is now
    this._api.socket?.resume(); // (stopped while the page was away, it was suspended)
    this._to("viewer", "started");
    this._installLifecycle();
    const late = new AbortController();
    await Promise.race([this._begin(), sleep(this._clock, this._api.timeoutMs, late.signal)]);
    late.abort();
    return this.lease;
  }

  /** What start() does once running: joins the stream, lists the tab, and acquires the lease or
   *  reads it. The join asks getToken for the token's `sub`, and the acquire for its request: they
   *  run side by side, so that a getToken that answers late delays them once, not one after the
   *  other. Resolves once the first answer is in. */
  async _begin() {
    if (this._streamMode) {
      this._requireConfirmAfter = this._clock.now(); // the stream is not live yet
      this._joinStream();
    }
    this._announce();
    if (this._autoAcquire && !this._hidden) {
      await this._acquireQuietly("try");
    } else {
      await this.refresh().catch((e) => this._requestFailed(e));
      this._maybeAutoAcquire();
    }
    this._scheduleViewerRefresh();
  }

  /** Stops: releases the lease (unless {release: false}), leaves the stream and the list of tabs,
   *  removes listeners. The release and the leaving are sent with the last token getToken gave,
   *  without asking it again (as at pagehide): a getToken that hangs or fails does not hold the
   *  release back, and the lease goes at once rather than at its expiry. A 401 (that token
   *  expired meanwhile) asks getToken for a fresh one and sends the release again. */
  async stop({ release = true } = {}) {
    if (this._state === "stopped") return;
    const holding = this._holdsEpoch();
    const epoch = this._epoch;
    const away = this._state === "away";
    this._gen++;
    this._clearTimers();
    this._removeLifecycle();
    this._handoffWait?.finish({ status: "cancelled" });
    this._endHandoffAsk();
    if (holding) this._learn(epoch + 1);
    this._releasedOnStop = holding && release;
    // Stopped before the stream is left, so that losing it is not taken for news missed (which
    // would renew the lease being given up, and pass through "unconfirmed").
    this._to("stopped", "stopped");
    this._leaveStream();
    this._api.socket?.close();
    const token = this._api.lastToken;
    if (!away && this._presenceOn) this._unlist({ token });
    if (holding && release) await this._api.post("/lease/release", { tabId: this.tabId, epoch }, { token }).catch(() => {});
  }

  // --- operations ------------------------------------------------------------------------------

  /** Acquires the lease if it is free (mode "try"). Resolves with `lease`; rejects with a
   *  TabLeaseError (LEASE_HELD, HANDOFF_PENDING, SESSION_BLOCKED, …). */
  async acquire() {
    this._policy = "auto";
    return this._acquireAsked("try");
  }

  /** Takes control even though another tab holds it (mode "takeover": a new epoch; the other tab
   *  is told taken_over). Call it only on an explicit user action ("Use here"). */
  async takeover() {
    this._policy = "auto";
    this._handoffWait?.finish({ status: "cancelled" });
    return this._acquireAsked("takeover");
  }

  /**
   * Asks the holder to hand control over (mode "handoff"). The holder releases at its next safe
   * point; the lease is then reserved for this tab, which claims it. Resolves with {status}:
   * "granted" (with lease), "timeout" (the holder did not let go in time: the caller may offer
   * takeover(), or pass {takeoverOnTimeout: true}), "taken_over", "cancelled" or "failed" (error).
   */
  requestHandoff({ timeoutMs = this._handoffTimeoutMs, takeoverOnTimeout = false } = {}) {
    this._policy = "auto";
    this._handoffWait?.finish({ status: "cancelled" });
    let finish;
    const done = new Promise((resolve) => (finish = resolve));
    const wait = {
      deadline: this._clock.now() + timeoutMs,
      lapseAt: null, // when the request lapses at the server (its handoff timeout)
      wake: null, // ends the sleep between two asks, while the loop sleeps
      news: false, // the lease was let go while the loop was asking, not sleeping: ask again at once
      done: false,
      finish: (result) => {
        if (wait.done) return;
        wait.done = true;
        if (this._handoffWait === wait) this._handoffWait = null;
        wait.wake?.();
        this._emit("handoff", { phase: result.status, ...result });
        finish(result);
        this._fitStream();
      },
    };
    this._handoffWait = wait;
    this._emit("handoff", { phase: "requesting" });
    this._fitStream(); // the holder's release is news to hear at once
    this._runHandoff(wait, takeoverOnTimeout);
    return done;
  }

  /** Gives the lease up (idempotent). The tab does not take it again by itself until acquire(),
   *  takeover() or requestHandoff() is called; but a release that answers a handoff request
   *  (handoff: "manual") is a handoff like the automatic one: auto-acquire comes back once
   *  another tab was granted ("yield"). */
  async release() {
    const ask = this._manualAsk;
    this._manualAsk = null;
    this._policy = ask && ask.epoch === this._epoch && this._holdsEpoch() ? "yield" : "manual";
    return this._release("released");
  }

  /** The tabs of the session, of every browser of the user, as the server lists them now
   *  (GET …/tabs): [{tabId, label, hidden, connectedAt}]. Read it again on each `tabs` event. */
  async listTabs() {
    const { body } = await this._call("GET", "/tabs");
    return Array.isArray(body?.tabs) ? body.tabs : [];
  }

  /** Re-reads the lease (GET …/lease?tabId=). Confirms this tab's lease when it still holds it. */
  async refresh() {
    const gen = this._gen;
    const sentAt = this._clock.now();
    const { body } = await this._call("GET", "/lease", undefined, { query: { tabId: this.tabId } });
    if (gen !== this._gen) return this.lease;
    if (body.held && body.holder?.tabId === this.tabId && body.role !== "viewer" && body.epoch === this._epoch) {
      this._confirm(body, sentAt, gen);
    } else {
      this._learn(body.held ? body.epoch : (body.epoch ?? 0) + 1);
      this._setView(body, sentAt);
      this._update("refresh");
      this._claimListed();
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
      const { body } = await this._call("POST", "/lease/check", { tabId: this.tabId, epoch });
      if (gen !== this._gen) return false;
      if (body.valid && body.lease) this._confirm(body.lease, sentAt, gen);
      return this.role === "owner";
    } catch (e) {
      if (gen === this._gen && e.code === "LEASE_LOST") this._lost(epoch, e.details, "lost", sentAt);
      else if (!e.retryable) this._emitError(e);
      return false;
    }
  }

  /** Makes the local state fit to admit a mutation on: a follower tab that has not heard from its
   *  stream's carrier for carrierTimeoutMs (a browser throttles a hidden tab's timers) asks the
   *  carrier first, and a lease held unconfirmed asks the server (POST …/lease/check). */
  async _confirmForMutation() {
    const s = this._computeState();
    if (s === "owner" || s === "releasing") await this._stream?.hub.heard();
    if (this._computeState() === "unconfirmed" || (this._state === "releasing" && !this._mayAct())) await this.check();
  }

  /** Whether a guarded handler already running may act now: the tab is owner, or it is releasing
   *  (asked to hand over: its running handlers, and the answer to a question one of them has
   *  open, are what it waits for) with its lease confirmed and within its deadline. New guarded
   *  calls need owner. */
  _mayAct() {
    if (this._state === "owner") return true;
    return this._state === "releasing" && Boolean(this._period) && this._confirmedNow();
  }

  /** Changes the label; the owner re-acquires (same epoch) so that other tabs see it. */
  async setLabel(label) {
    this._label = label;
    this._announce();
    if (this.role === "owner") await this._acquire("try");
  }

  /**
   * Wraps a mutation handler: the returned async (args, ctx) runs handler(args, lease, ctx) only
   * while this tab is the owner, with lease = {epoch, token, tabId, sessionId, signal, headers}
   * (signal aborts when this period of ownership ends; token and headers read the grant's latest
   * token each time, as renews replace it), and otherwise returns
   * {error: {code: "NOT_LEASE_OWNER", message, retryable: false, details}} without running it.
   * When the period ends while the handler runs, the call resolves at once with that answer, its
   * details.mayHaveActed true, and what the handler settles with later is dropped.
   * When the lease is held but unconfirmed it asks the server (POST …/lease/check) first, and a
   * follower tab asks its stream's carrier first when it has not heard from it lately
   * (_confirmForMutation). {check: "always"} asks the server before every call; {check: "never"}
   * trusts the local state.
   */
  guard(handler, { check = "auto" } = {}) {
    if (typeof handler !== "function") throw new TypeError("TabLease.guard: handler must be a function");
    return async (args, ctx) => {
      this._update("guard");
      const state = this._state;
      if (check === "always" && (state === "owner" || state === "unconfirmed")) await this.check();
      else if (check === "auto") await this._confirmForMutation();
      this._update("guard");
      if (this._state !== "owner") return this._notOwner();
      const period = this._period;
      const epoch = this._epoch;
      // The token of the latest renew of this grant while the period lasts (a renew replaces it
      // before it expires, and a handler that waits, on the user say, must send a current one);
      // the last one it had once the period ended.
      let token = this._token;
      const current = () => {
        if (!period.ended && this._epoch === epoch && this._token) token = this._token;
        return token;
      };
      const lease = {
        epoch,
        get token() {
          return current();
        },
        tabId: this.tabId,
        sessionId: this.sessionId,
        signal: period.ac.signal,
        get headers() {
          const t = current();
          return t ? { "Tablease-Lease": t } : {};
        },
      };
      period.inFlight++;
      const handled = (async () => handler(args, lease, ctx))();
      const settled = () => {
        if (!period.ended) {
          period.inFlight--;
          if (period.inFlight === 0 && this.handoff === "releasing") this._releaseAtSafePoint();
        }
      };
      handled.then(settled, settled);
      // The period ending while the handler runs answers the call at once, whatever the handler
      // does with its signal: it may have acted (its request sent, its answer not in). The answer
      // is settled within the abort listener (not after it, as call.js's whenAborted would), so
      // that it comes before the rejection of a handler whose fetch that abort cancels.
      let off = () => {};
      const ended = new Promise((resolve) => {
        const fire = () => resolve(mayHaveActed(this._notOwner()));
        period.ac.signal.addEventListener("abort", fire, { once: true });
        off = () => period.ac.signal.removeEventListener("abort", fire);
      });
      try {
        return await Promise.race([handled, ended]);
      } finally {
        off();
      }
    };
  }

  /**
   * The tools this tab may register on `route`: GET …/catalog?tabId=&route=, cached by ETag, and
   * filtered again by the local role (a viewer never gets a mutation tool, even when the server
   * still counts it as owner). Resolves {role, serverRole, version, epoch, tools}. The route is
   * sent as catalogRoute gives it (percent-encoded; none when over 2048 bytes).
   */
  async catalog(route = "") {
    route = catalogRoute(route);
    const key = route;
    // A read of the route in flight since the last catalog event (a role or version change)
    // answers this call too: the page and the tool adapter reading after one change make one
    // request, where two in flight at once could not use the ETag.
    let read = this._catalogReads.get(key);
    if (!read || read.news !== this._catalogNews) {
      read = { news: this._catalogNews, p: this._readCatalog(route) };
      this._catalogReads.set(key, read);
      const forget = () => {
        if (this._catalogReads.get(key) === read) this._catalogReads.delete(key);
      };
      read.p.then(forget, forget);
    }
    return this._catalogView(await read.p);
  }

  /** GET …/catalog?tabId=&route=, revalidated with the ETag of the route's last answer; resolves
   *  the catalog's body. */
  async _readCatalog(route) {
    const query = { tabId: this.tabId };
    if (route) query.route = route;
    const key = route || "";
    const cached = this._catalogCache.get(key);
    const headers = cached?.etag ? { "If-None-Match": cached.etag } : {};
    const res = await this._call("GET", "/catalog", undefined, { query, headers });
    const fresh = !(res.status === 304 && cached);
    const body = fresh ? res.body : cached.body;
    const entry = fresh && res.etag ? { etag: res.etag, body } : cached;
    if (entry) {
      // The routes are the page's own (one per entity an SPA shows): keep the latest read few.
      this._catalogCache.delete(key);
      this._catalogCache.set(key, entry);
      for (const old of this._catalogCache.keys()) {
        if (this._catalogCache.size <= CATALOG_CACHE_ROUTES) break;
        this._catalogCache.delete(old);
      }
    }
    if (body.version) this._catalogVersion = body.version;
    return body;
  }

  /** What catalog(route) answered last, filtered by the role now, without a request; null when
   *  it was never read (or a new version made the reading stale). The tool adapters stand in with
   *  it when the catalog cannot be read. */
  _lastCatalog(route = "") {
    const cached = this._catalogCache.get(catalogRoute(route));
    return cached ? this._catalogView(cached.body) : null;
  }

  /** The tools without routes, which every route has, of the latest reading of the catalog that
   *  is not stale, filtered by the role now; null when there is none. The tool adapters stand in
   *  with them on a route never read when the catalog cannot be read. */
  _routelessTools() {
    const latest = [...this._catalogCache.values()].at(-1);
    return latest ? this._catalogView(latest.body).tools.filter((t) => !Array.isArray(t.routes) || t.routes.length === 0) : null;
  }

  _catalogView(body) {
    const role = this.role;
    const tools = (body.tools ?? []).filter((t) => !t.disabled && (role === "owner" || isReadOnlyTool(t)));
    return { role, serverRole: body.role ?? null, version: body.version ?? null, epoch: role === "owner" ? this._epoch : null, tools };
  }

  // --- internals: the state machine ------------------------------------------------------------

  _holdsEpoch() {
    return this._epoch > 0 && this._epoch >= this._minValidEpoch && this._epoch !== this._unproven;
  }

  /** The last moment news may have been missed: a stream drop, a freeze, a carrier that left a
   *  ping unanswered. */
  _missedSince() {
    return this._stream ? this._stream.hub.missedSince(this._clock.now()) : -Infinity;
  }

  /** The moment a confirmation must have been sent at or after for the tab to be owner. */
  _confirmNeededAfter() {
    return Math.max(this._requireConfirmAfter, this._missedSince());
  }

  /** The state the facts give now, without acting on a change (a getter never emits). */
  _computeState() {
    const s = this._state;
    if (s === "stopped" || s === "away") return s;
    if (!this._holdsEpoch()) return "viewer";
    if (this._handoffAsk) return "releasing";
    return this._confirmedNow() ? "owner" : "unconfirmed";
  }

  /** Whether the lease this tab holds is confirmed now: by an answer sent since news may have
   *  been missed, and within its local deadline. */
  _confirmedNow() {
    return this._confirmedAt >= this._confirmNeededAfter() && this._clock.now() < this._deadline;
  }

  /** Moves to state `next` (one of TRANSITIONS[current]); emits rolechange when the role changes. */
  _to(next, reason, event = null) {
    const prev = this._state;
    if (prev !== next && !TRANSITIONS[prev].includes(next)) throw new Error(`TabLease: no transition from ${prev} to ${next}`);
    // The period of ownership follows the state, also when it stays the same: staying unconfirmed
    // while the deadline passes ends it (_periodGoesOn).
    if (next === "owner") this._period ??= { ac: new AbortController(), inFlight: 0, interactions: 0, ended: false };
    const ends = next !== "owner" && !this._periodGoesOn(next);
    this._state = next;
    // Ended in the new state, so that the calls it ends answer its reason (stopped, not lost).
    if (ends) this._endPeriod();
    if (prev === next) return false;
    const wasOwner = prev === "owner";
    const isOwner = next === "owner";
    this._emit("state", { state: next, previous: prev, reason });
    if (isOwner !== wasOwner) {
      const role = isOwner ? "owner" : "viewer";
      this._emit("rolechange", { role, previous: wasOwner ? "owner" : "viewer", reason, lease: this.lease, event });
      this._catalogEvent("role");
      this._emit("lease", { lease: this.lease, reason, event });
    }
    return true;
  }

  /** Whether the period of ownership goes on in state `next` (other than owner): through releasing
   *  (its handlers are what the handoff waits for), and through unconfirmed while the epoch is
   *  held and the local deadline has not passed: news may have been missed (a stream handed to
   *  another tab, a frozen page), which is no loss yet, so new guarded calls wait for the renew
   *  that confirms and running ones go on; the loss itself (LEASE_LOST, an event, the deadline)
   *  ends the period. */
  _periodGoesOn(next) {
    return next === "releasing" || (next === "unconfirmed" && this._holdsEpoch() && this._clock.now() < this._deadline);
  }

  /** Counts an interaction with the user that a guarded handler of the current period has open
   *  (a handoff waits for it to end, or for the request to lapse); returns the function that ends
   *  it. */
  _beginInteraction() {
    const p = this._period;
    if (!p) return () => {};
    p.interactions++;
    let done = false;
    return () => {
      if (done) return;
      done = true;
      if (!p.ended) p.interactions--;
    };
  }

  /** Ends the current period of ownership: its signal aborts and its handlers stop counting. */
  _endPeriod() {
    const p = this._period;
    if (!p) return;
    this._period = null;
    p.ended = true;
    p.inFlight = 0;
    p.interactions = 0;
    p.ac.abort(new TabLeaseError({ code: NOT_LEASE_OWNER, message: "tablease: this tab's control of the session ended" }));
  }

  /** Re-evaluates the state from the facts, moves to it, and arms the role timer. */
  _update(reason, event = null) {
    const next = this._computeState();
    const changed = this._to(next, reason, event);
    this._clearTimer("role");
    if (next === "owner" || (next === "unconfirmed" && this._period)) {
      this._timers.role = this._clock.setTimeout(() => {
        this._timers.role = null;
        this._update("expired");
        if (this._state === "unconfirmed") this._renewNow();
      }, Math.max(0, this._deadline - this._clock.now()));
    }
    if (changed) this._scheduleViewerRefresh();
    // An answer that confirmed this tab only up to a deadline already past (it arrived late: the
    // page was frozen, the network slow) is not news of a lease this tab holds now.
    else if ((reason === "confirmed" && next === "owner") || reason === "refresh" || reason === "event") {
      this._emit("lease", { lease: this.lease, reason, event });
    }
    this._fitStream();
  }

  _whyNotOwner() {
    const s = this._state;
    if (s === "stopped" || s === "away") return "stopped";
    if (s === "releasing") return "handoff";
    if (this._epoch === 0) return "viewer";
    if (!this._holdsEpoch()) return "lost";
    if (this._clock.now() >= this._deadline) return "expired";
    return "unconfirmed";
  }

  _notOwner() {
    const reason = this._whyNotOwner();
    const v = this._view;
    // A lease this tab lost, or released as it stopped, is not held by this tab, whatever the
    // view (not updated yet by the release that ended it, as on pagehide) says.
    const gone = reason === "lost" || (reason === "stopped" && this._releasedOnStop);
    const held = Boolean(v?.held && v.holder && !(gone && v.holder.tabId === this.tabId));
    let key = reason === "lost" && !held ? "lostFree" : reason;
    if (reason === "stopped" && this._state === "away") key = "away";
    return {
      error: {
        code: NOT_LEASE_OWNER,
        message: MESSAGES[key] ?? MESSAGES.viewer,
        retryable: false,
        details: {
          sessionId: this.sessionId,
          tabId: this.tabId,
          reason,
          holder: held ? { tabId: v.holder.tabId, label: v.holder.label ?? "" } : null,
          epoch: v?.epoch ?? null,
        },
      },
    };
  }

  /** Raises the bound below which epochs are over. */
  _learn(minValid) {
    if (typeof minValid === "number" && minValid > this._minValidEpoch) this._minValidEpoch = minValid;
    if (!this._holdsEpoch()) this._endHandoffAsk();
  }

  /** Notes an epoch an answer or an event showed, now. */
  _saw(epoch) {
    if (typeof epoch === "number" && epoch > this._seen.epoch) this._seen = { epoch, at: this._clock.now() };
  }

  /** Whether the answer to a request sent at sentAt, showing epoch, comes from a store that lost
   *  the highest epoch this tab has seen: the request was sent after that epoch came, so it
   *  reached the store after the store had it, and only a loss of the store's last writes (a
   *  Redis failover) answers a lower one. Epoch 0, a store with no record of the session, is news
   *  of its own (_setView). */
  _storeWentBack(epoch, sentAt) {
    return this._belowSeen(epoch) && sentAt > this._seen.at;
  }

  /** Whether epoch is one a store holds (not 0) below the highest this tab has seen. */
  _belowSeen(epoch) {
    return typeof epoch === "number" && epoch > 0 && epoch < this._seen.epoch;
  }

  /** Read-only from now until a renew sent from now on confirms this tab's lease (news may have
   *  been missed, or says the lease may be gone); that renew goes now, unless the page is frozen. */
  _confirmFromNow() {
    this._requireConfirmAfter = Math.max(this._requireConfirmAfter, this._clock.now());
    if (this._holdsEpoch() && !this._pageFrozen()) this._renewNow({ after: this._confirmNeededAfter() });
  }

  /** Takes the store as it now is, below epochs it lost: they are forgotten, this tab's own with
   *  them when it was one (a lost grant proves nothing), and the store's epoch is the floor. */
  _forgetLostEpochs(epoch) {
    this._lostAbove = Math.max(this._lostAbove, this._seen.epoch);
    if (this._epoch > epoch) this._epoch = 0;
    this._minValidEpoch = epoch;
    this._seen = { epoch, at: this._clock.now() };
    this._view = null;
  }

  _setView(lease, at) {
    if (!lease || typeof lease !== "object") return;
    const v = this._view;
    // Epochs only grow, so a lower one is older news (an answer overtaken by an event), unless it
    // is 0: the store has no record of the session (it forgot it, or lost its data), and the
    // holder this tab knew of is gone with it; or unless the store lost the higher one.
    let wentBack = false;
    if (v && typeof lease.epoch === "number" && lease.epoch < v.epoch && lease.epoch !== 0) {
      if (!this._storeWentBack(lease.epoch, at)) return;
      this._forgetLostEpochs(lease.held ? lease.epoch : lease.epoch + 1);
      wentBack = true;
    }
    this._saw(lease.epoch);
    // Epoch 0 while this tab holds an epoch: the store has no record of the session, so this tab's
    // lease went with it, unless the news is older than its grant (a stream's snapshot taken before
    // it). The tab acts no more until a renew sent now tells which: LEASE_LOST, or its lease.
    if (lease.epoch === 0 && this._holdsEpoch()) this._confirmFromNow();
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
    // The store gave this tab its lease back, at an epoch below lost ones of its own (it took
    // over in turn before the failover): an acquire, which gives the holder its epoch, makes it
    // the owner again, and then _remint moves it above them.
    if (wentBack && lease.held && lease.holder?.tabId === this.tabId && !this._holdsEpoch() && this._running()) {
      Promise.resolve().then(() => this._acquireQuietly("try"));
    }
  }

  /** Applies an answer that says this tab holds the lease, from a request sent at sentAt. */
  _confirm(lease, sentAt, gen) {
    if (gen !== this._gen || this._state === "stopped") return false;
    const mine = lease && lease.held && lease.holder?.tabId === this.tabId && typeof lease.epoch === "number";
    if (!mine) {
      this._lost(this._epoch, lease, "lost", sentAt);
      return false;
    }
    if (lease.epoch < this._minValidEpoch) {
      if (!this._storeWentBack(lease.epoch, sentAt)) {
        // An event already showed this grant to be over.
        this._update("lost");
        return false;
      }
      this._forgetLostEpochs(lease.epoch); // the store gave this tab its lease back
    }
    this._unproven = 0;
    if (lease.epoch !== this._epoch) {
      this._endHandoffAsk();
      this._epoch = lease.epoch;
      this._token = null;
      this._confirmedAt = -Infinity;
    }
    if (lease.token) this._token = lease.token;
    // Lease answers show a handoff in progress; an answer to a request sent after this holder was
    // asked that shows none means the request lapsed or was answered: stop refusing.
    if (this._handoffAsk && sentAt > this._handoffAsk.at && lease.handoff?.state !== "requested") this._endHandoffAsk();
    if (this._manualAsk && sentAt > this._manualAsk.at && lease.handoff?.state !== "requested") this._manualAsk = null;
    if (this._handoffAsk && lease.handoff?.state === "requested" && typeof lease.handoff.remainingMs === "number") {
      this._handoffAsk.lapseAt = sentAt + lease.handoff.remainingMs;
    }
    if (sentAt >= this._confirmedAt) {
      const ttl = typeof lease.ttlMs === "number" && lease.ttlMs > 0 ? lease.ttlMs : lease.remainingMs;
      const margin = Math.min(this._marginMs, Math.floor(ttl / 4));
      this._confirmedAt = sentAt;
      this._deadline = sentAt + lease.remainingMs - margin;
      this._learn(lease.epoch);
      this._setView(lease, sentAt);
      this._scheduleRenew(sentAt + (lease.renewAfterMs ?? Math.floor(ttl / 3)));
    }
    this._update("confirmed");
    // An answer to a request sent before news may have been missed (the stream dropped while a
    // grant was on its way, say) confirms nothing: a renew sent now does, at once rather than at
    // the next renew's time.
    const needed = this._confirmNeededAfter();
    if (sentAt < needed && !this._pageFrozen()) this._renewNow({ after: needed });
    if (this._lostAbove > lease.epoch) Promise.resolve().then(() => this._remint(lease.epoch));
    else this._lostAbove = 0; // held above them
    return true;
  }

  /** The answer to a request sent at sentAt says this tab's epoch is over; details are what it
   *  says of the lease now. */
  _lost(epoch, details, reason, sentAt) {
    if (epoch > 0) this._learn(epoch + 1);
    if (details && typeof details === "object") {
      const holder = details.holder ?? null;
      if (typeof details.epoch === "number") {
        this._learn(holder ? details.epoch : details.epoch + 1);
        this._setView({ held: Boolean(holder), holder, epoch: details.epoch, remainingMs: details.remainingMs }, sentAt);
      }
    }
    this._clearTimer("renew");
    this._update(reason);
    this._maybeAutoAcquire();
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

  /** A request of the automatic machinery failed: say so once per outage, at every failure of
   *  getToken, and when it is not something a retry fixes. */
  _requestFailed(e) {
    if (e?.code === USER_CHANGED) return; // said once, as the tab started over (_userChanged)
    if (e?.code === "NETWORK") {
      if (this._unreachable) return;
      this._unreachable = true;
    }
    if (e?.code === "NETWORK" || e?.code === "UNAUTHENTICATED" || !e?.retryable) this._emitError(e);
  }

  /** An API call; records whether the server was reachable. */
  async _call(method, path, body = undefined, opts = {}) {
    try {
      const r = await this._api.request(method, path, body, opts);
      this._reached(method, path);
      if (this._timers.join != null) this._joinStream(); // getToken works again: join the stream now
      return r;
    } catch (e) {
      if (e?.code !== "NETWORK" && e?.code !== "CANCELLED") this._reached(method, path); // (CANCELLED: not sent)
      throw e;
    }
  }

  /** The server answered method path (an error answer included). */
  _reached(method, path) {
    if (!this._unreachable) return;
    this._unreachable = false;
    // The server answers again: the stream need not wait out the backoff it grew meanwhile, nor
    // this tab's listing, which the server may have timed out meanwhile (another tab's stream may
    // have stayed up all along, so that its coming back says nothing).
    this._stream?.hub.reconnectNow();
    if (this._attempts.presence > 0 && !(method === "PUT" && path === this._tabPath())) this._announce();
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

  _running() {
    return this._state !== "stopped" && this._state !== "away";
  }

  _scheduleRenew(at) {
    this._clearTimer("renew");
    if (!this._running()) return;
    this._timers.renew = this._clock.setTimeout(() => {
      this._timers.renew = null;
      this._renewNow();
    }, Math.max(0, at - this._clock.now()));
  }

  /** A viewer re-reads the lease when the holder's lease should have ended by what it knows (to
   *  learn it was renewed, or take it), and every viewerPollMs while the stream is down: then up to
   *  a fifth of viewerPollMs later, so that the tabs of a page opened together, each polling, do
   *  not read together ever after. */
  _scheduleViewerRefresh(minDelay = 0) {
    this._clearTimer("viewer");
    if (!this._running() || this._holdsEpoch()) return;
    const now = this._clock.now();
    let at = Infinity;
    const v = this._view;
    if (v?.held && typeof v.remainingMs === "number") at = v.at + v.remainingMs + 250;
    if (v?.held && v.remainingMs == null) at = now + 250; // an event named a new holder: learn its time left
    let jitterMs = 500;
    if (!this._streamLive && now + this._viewerPollMs < at) {
      at = now + this._viewerPollMs;
      jitterMs = Math.max(jitterMs, this._viewerPollMs / 5);
    }
    if (at === Infinity) return;
    // At most one read a second, whatever the answers say: a view that no answer moves forward
    // must not turn into a loop of requests.
    at = Math.max(at, this._viewerReadAt + VIEWER_READ_GAP_MS);
    const delay = Math.max(minDelay, Math.max(0, at - now) + Math.floor(this._random() * jitterMs));
    this._timers.viewer = this._clock.setTimeout(async () => {
      this._timers.viewer = null;
      this._viewerReadAt = this._clock.now();
      let backoff = 0;
      try {
        await this.refresh();
        this._attempts.viewer = 0;
      } catch (e) {
        this._requestFailed(e);
        backoff = backoffDelay(this._attempts.viewer++, { ...this._backoff, random: this._random, retryAfterMs: e.retryAfterMs });
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
    return printableLabel(l);
  }

  /** One acquire request. Resolves {lease} when granted, {error} otherwise (never rejects).
   *  newEpoch asks that the holder's own acquire be granted a new epoch (_remint). */
  async _acquire(mode, { newEpoch = false } = {}) {
    if (!this._running()) return { error: new TabLeaseError({ code: "NOT_STARTED", message: "tablease: call start() first" }) };
    this._clearTimer("acquire");
    const gen = this._gen;
    const sentAt = this._clock.now();
    const body = this._body({ label: this._labelNow() });
    if (mode !== "try") body.mode = mode;
    if (newEpoch) body.newEpoch = true;
    // A takeover is what the user asked for when they asked: one that the page froze before it
    // was sent (getToken may wait on the network) is not sent on resume, when another tab may
    // have taken control since, on a later action of the user.
    const freezes = this._freezes;
    const beforeSend = mode !== "takeover" ? null : () => {
      if (this._freezes !== freezes) {
        throw new TabLeaseError({ code: "CANCELLED", message: "tablease: the page was frozen before the takeover was sent, so it was not sent: ask again" });
      }
    };
    this._acquiring++;
    try {
      const { body: lease, token } = await this._call("POST", "/lease", body, { beforeSend }).finally(() => this._acquiring--);
      if (gen !== this._gen || !this._running()) {
        // released or stopped meanwhile (or the user changed): give back what we were just
        // granted, as the user it was granted to
        if (lease?.holder?.tabId === this.tabId && typeof lease.epoch === "number" && lease.epoch !== this._epoch) {
          this._api.post("/lease/release", { tabId: this.tabId, epoch: lease.epoch }, { token }).catch(() => {});
        }
        return { error: new TabLeaseError({ code: "CANCELLED", message: "tablease: the lease was released while the acquire was in flight" }) };
      }
      if (!(lease?.held && lease.holder?.tabId === this.tabId)) {
        // Not granted (a server that answers a handoff request with the current lease).
        this._setView(lease, sentAt);
        this._update("refresh");
        return { pending: true, error: new TabLeaseError({ code: "HANDOFF_PENDING", message: "the holder has been asked to hand over", details: {} }) };
      }
      this._attempts.acquire = 0;
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

  /** Acquire as the page asked (acquire(), takeover()): resolves with the lease, or rejects with
   *  why not, the automatic policy going on meanwhile (_afterRefusedAcquire). */
  async _acquireAsked(mode) {
    const r = await this._acquire(mode);
    if (r.error) {
      this._afterRefusedAcquire(r.error, { report: false });
      throw r.error;
    }
    return this.lease;
  }

  /** Acquire as the automatic policy does: retries are scheduled, and only what needs a person
   *  becomes an error event. */
  async _acquireQuietly(mode) {
    const r = await this._acquire(mode);
    if (r.error) this._afterRefusedAcquire(r.error, { report: true });
    return r;
  }

  /** The automatic policy after an acquire that was not granted, whether it made it or the page
   *  did (acquire(), takeover(), requestHandoff(): each request cancels the retry scheduled
   *  before it). A wait the server names (a handoff in progress, an admin's block) ends with an
   *  acquire when it is over, and so does a failure worth retrying; report: whether the failure
   *  is an error event (not for the page's own calls, whose promise says it). */
  _afterRefusedAcquire(e, { report }) {
    if (!this._running() || e.code === USER_CHANGED) return; // the tab started over meanwhile
    if (e.code === "LEASE_HELD" || e.code === "CANCELLED") {
      this._attempts.acquire = 0;
    } else if (e.code === "HANDOFF_PENDING" || e.code === "SESSION_BLOCKED" || e.code === "TAB_GONE") {
      // A wait the server names: a handoff, an admin's block, or the window in which it refuses a
      // tab that said it is gone (a page restored from the back/forward cache after pagehide).
      const ms = e.details?.retryAfterMs ?? e.retryAfterMs ?? 1000;
      this._scheduleAcquire(ms + Math.floor(this._random() * 250));
    } else {
      if (report) this._requestFailed(e);
      if (e.retryable || this._listedUnproven()) this._scheduleAcquire(backoffDelay(this._attempts.acquire++, { ...this._backoff, random: this._random, retryAfterMs: e.retryAfterMs }));
    }
    this._scheduleViewerRefresh();
  }

  _mayTakeFreeLease() {
    return this._running() && this._autoAcquire && this._policy === "auto" && !this._handoffWait && !this._holdsEpoch();
  }

  _scheduleAcquire(delay) {
    this._clearTimer("acquire");
    if (!this._running()) return;
    this._timers.acquire = this._clock.setTimeout(() => {
      this._timers.acquire = null;
      if (this._mayTakeFreeLease() && this._freeForThisTab()) this._acquireQuietly("try");
    }, Math.max(0, delay));
  }

  /** Whether the lease is free by what this tab knows, or held by this tab at the epoch it could
   *  not prove, which an acquire gives back. */
  _freeForThisTab() {
    return !this._view?.held || this._listedUnproven();
  }

  /** Whether the server lists this tab as the holder at the epoch it could not prove (_unproven),
   *  as far as this tab knows: until the deadline its last renew gave, past which the lease may
   *  have expired unseen (every read refused too) and this tab is a viewer like any other. */
  _listedUnproven() {
    const v = this._view;
    return this._unproven > 0 && Boolean(v?.held) && v.holder?.tabId === this.tabId && v.epoch === this._unproven &&
      this._clock.now() < this._deadline;
  }

  /** When the lease is free (by what this tab knows) and this tab may take it by itself, it
   *  tries after a short random delay (longer when hidden, so that a visible tab wins). */
  _maybeAutoAcquire() {
    if (!this._mayTakeFreeLease() || !this._freeForThisTab() || this._timers.acquire != null) return;
    const delay = (this._hidden ? this._hiddenAcquireDelayMs : 0) + Math.floor(this._random() * 200);
    this._scheduleAcquire(delay);
  }

  /** Renews now, or joins the renew in flight; {after: t} asks for one more afterwards when the
   *  renew in flight was sent before t (the moment from which news may have been missed). */
  _renewNow({ after = -Infinity } = {}) {
    // Only a renew of this period of ownership is joined: one still waiting from an earlier
    // period can confirm nothing now.
    if (this._renewing && this._renewing.gen === this._gen && this._renewing.epoch === this._epoch) {
      if (this._renewing.sentAt < after) this._renewAgain = true;
      return this._renewing.p;
    }
    if (!this._running() || !this._holdsEpoch()) return Promise.resolve(false);
    this._clearTimer("renew");
    const gen = this._gen;
    const epoch = this._epoch;
    const sentAt = this._clock.now();
    const hidden = this._hidden;
    const freezes = this._freezes;
    let ok = false;
    const p = (async () => {
      try {
        const { body } = await this._call("POST", "/lease/renew", this._body({ epoch }), { timeoutMs: this._renewTimeoutMs(sentAt) });
        this._attempts.renew = 0;
        ok = this._confirm(body, sentAt, gen);
        return ok;
      } catch (e) {
        if (gen !== this._gen || epoch !== this._epoch) return false;
        if (e.code === "LEASE_LOST") {
          this._lost(epoch, e.details, "lost", sentAt);
        } else if (e.retryable) {
          // A renew whose wait the page's freeze cut off says nothing of the server (the renew
          // at resume asks again): no error event for it.
          const frozenMeanwhile = this._freezes !== freezes;
          if ((e.code === "NETWORK" && !frozenMeanwhile) || e.code === "UNAUTHENTICATED") this._requestFailed(e);
          this._scheduleRenew(this._clock.now() + backoffDelay(this._attempts.renew++, { ...this._backoff, random: this._random, retryAfterMs: e.retryAfterMs }));
        } else {
          // 400/401/403: this tab cannot prove it holds the lease; fail closed and say why. The
          // server still lists it, and gives it this epoch back when it acquires: it tries, with
          // backoff, until it can authenticate or the server lists another holder (or none).
          this._unproven = epoch;
          this._endHandoffAsk();
          this._clearTimer("renew");
          this._update("lost");
          this._emitError(e);
          this._scheduleAcquire(backoffDelay(this._attempts.acquire++, { ...this._backoff, random: this._random }));
        }
        return false;
      } finally {
        if (this._renewing?.p === p) {
          this._renewing = null;
          const again = (this._renewAgain && ok) || hidden !== this._hidden;
          this._renewAgain = false;
          if (again && this._running() && this._holdsEpoch()) this._renewNow();
        }
      }
    })();
    this._renewing = { p, gen, epoch, sentAt };
    return p;
  }

  /** How long a renew sent at now waits for its answer: half the time left before the deadline
   *  (at least a second, at most requestTimeoutMs), so that a renew never answered is given up
   *  early enough for a retry to keep the lease, whatever the TTL. */
  _renewTimeoutMs(now) {
    const left = this._deadline - now;
    if (!(left > 0)) return this._api.timeoutMs;
    return Math.max(MIN_RENEW_TIMEOUT_MS, Math.floor(left / 2)); // request() caps it at timeoutMs
  }

  /** After the store lost epochs above epoch, at which it holds this tab's lease (a Redis
   *  failover lost the grants above it), a resource that a write under a lost epoch fenced
   *  refuses this one: the tab asks for a new epoch, which the store floors at its clock, above
   *  them, and keeps the lease meanwhile. A server that does not know newEpoch (an older instance
   *  in a rolling upgrade) refuses the field: the tab then releases and acquires again, which
   *  another tab may win. A request that fails for want of the store is tried again at the next
   *  answer that confirms the lease below them. */
  async _remint(epoch) {
    if (this._epoch !== epoch || !this._holdsEpoch() || !(this._lostAbove > epoch) || this._reminting) return;
    const lostAbove = this._lostAbove;
    this._lostAbove = 0; // once: the new epoch is above them by the store's clock
    this._reminting = true;
    try {
      const r = await this._acquire("try", { newEpoch: true });
      const e = r.error;
      if (e?.code === "INVALID_ARGUMENT" && e.details?.field === "newEpoch") {
        const rel = await this._release("remint");
        if (rel.released && this._running()) await this._acquireQuietly("try");
      } else if (e?.retryable && this._epoch === epoch && this._holdsEpoch()) {
        this._lostAbove = Math.max(this._lostAbove, lostAbove);
      }
    } finally {
      this._reminting = false;
    }
  }

  async _release(why, { keepalive = false, gone = false } = {}) {
    if (!this._holdsEpoch() && !gone) return { released: false };
    const epoch = this._epoch;
    this._gen++; // an acquire in flight gives back what it is granted
    if (this._holdsEpoch()) this._learn(epoch + 1); // read-only from now on, whatever the answer
    this._clearTimer("renew");
    this._update(why);
    // gone: the tab is gone for good (pagehide), whatever epoch it holds or is about to be granted.
    const body = gone ? { tabId: this.tabId, gone: true } : { tabId: this.tabId, epoch };
    for (let attempt = 0; ; attempt++) {
      try {
        const { body: ans } = await this._api.post("/lease/release", body, { keepalive });
        return ans;
      } catch (e) {
        if (!e.retryable || attempt >= 2 || keepalive) return { released: false, error: e };
        await sleep(this._clock, backoffDelay(attempt, { ...this._backoff, random: this._random, retryAfterMs: e.retryAfterMs }));
      }
    }
  }

  // --- internals: handoff ------------------------------------------------------------------------

  _onHandoffRequested(data) {
    this._emit("handoff", { phase: "requested", requester: data.requester ?? null });
    if (this._handoffMode !== "auto") {
      this._manualAsk = { at: this._clock.now(), epoch: this._epoch }; // the app calls release()
      return;
    }
    if (this._handoffAsk) return;
    // Running mutations get handoffGraceMs to finish. Then, if a renew shows the request still
    // stands, they are aborted and the lease goes; if it lapsed, the tab is owner again. While a
    // guarded handler has an interaction with the user open, the tab keeps its lease (renews go
    // on) and waits for the interaction's end (its safe point) or for the request to lapse (the
    // requester is then told "timeout"), whichever comes first.
    const ask = { requester: data.requester ?? null, at: this._clock.now(), graceTimer: null, lapseAt: null };
    const onGrace = async () => {
      if (this._handoffAsk !== ask) return;
      await this._renewNow({ after: this._clock.now() });
      if (this._handoffAsk !== ask) return;
      if ((this._period?.interactions ?? 0) > 0) {
        const now = this._clock.now();
        const next = ask.lapseAt != null && ask.lapseAt > now ? ask.lapseAt - now + 250 : this._handoffGraceMs;
        ask.graceTimer = this._clock.setTimeout(onGrace, Math.min(next, this._handoffGraceMs));
        return;
      }
      this._endPeriod();
      this._releaseForHandoff();
    };
    ask.graceTimer = this._clock.setTimeout(onGrace, this._handoffGraceMs);
    this._handoffAsk = ask;
    this._update("handoff");
    if (this.inFlight === 0) this._releaseForHandoff();
  }

  _endHandoffAsk() {
    const ask = this._handoffAsk;
    if (!ask) return;
    this._handoffAsk = null;
    this._clock.clearTimeout(ask.graceTimer);
  }

  /** The safe point of a handoff, when the last running guarded handler ends: release, unless the
   *  request lapsed at the server meanwhile (a handler that kept the lease with a question open
   *  past the lapse): then renew first, and release only if its answer still shows the request. */
  async _releaseAtSafePoint() {
    const ask = this._handoffAsk;
    if (!ask) return;
    if (ask.lapseAt != null && this._clock.now() >= ask.lapseAt) {
      await this._renewNow({ after: this._clock.now() });
      if (this._handoffAsk !== ask || (this._period?.inFlight ?? 0) > 0) return;
    }
    this._releaseForHandoff();
  }

  _releaseForHandoff() {
    if (!this._handoffAsk) return;
    this._endHandoffAsk();
    this._policy = "yield";
    this._emit("handoff", { phase: "released" });
    this._release("handoff");
  }

  async _runHandoff(wait, takeoverOnTimeout) {
    let attempt = 0;
    while (!wait.done) {
      if (!this._running()) return wait.finish({ status: "cancelled" });
      // The request is filed once: once the server answered that it stands (lapseAt), the next
      // asks are "try", which claims the lease when it was reserved for this tab and files nothing.
      // Another "handoff" that reached the server after the lapse would file a new request and
      // keep the holder handing over past it.
      const lapsed = wait.lapseAt != null && this._clock.now() >= wait.lapseAt;
      wait.news = false;
      const sent = this._clock.now();
      const r = await this._acquire(wait.lapseAt == null ? "handoff" : "try");
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
        // The first answer to the request while the holder still holds says when it lapses,
        // counted from when the ask was sent (the server's lapse is no earlier than that).
        if (e.code === "HANDOFF_PENDING" && !r.pending && wait.lapseAt == null && this._view?.held) wait.lapseAt = sent + ra;
        this._emit("handoff", { phase: "waiting", holder: this._view?.holder ?? null });
      } else if (e.retryable && e.code !== "SESSION_BLOCKED") {
        // (an admin's block is no failure to wait out: the request fails at once, and the tab
        // takes the lease when the block ends, as the automatic policy does)
        delay = backoffDelay(attempt++, { ...this._backoff, random: this._random, retryAfterMs: e.retryAfterMs });
      } else {
        wait.finish({ status: "failed", error: e });
        return this._afterRefusedAcquire(e, { report: false });
      }
      const left = Math.min(wait.deadline, lapsed ? 0 : wait.lapseAt ?? Infinity) - this._clock.now();
      if (left <= 0) {
        if (!takeoverOnTimeout) return wait.finish({ status: "timeout" });
        const t = await this._acquire("takeover");
        return wait.finish(t.lease ? { status: "taken_over", lease: this.lease } : { status: "failed", error: t.error });
      }
      if (wait.news) continue; // the holder let go while we asked: its reservation is ours to claim now
      await new Promise((resolve) => {
        const id = this._clock.setTimeout(resolve, Math.min(delay, left));
        wait.wake = () => {
          this._clock.clearTimeout(id);
          resolve(undefined);
        };
      });
      wait.wake = null;
    }
  }

  // --- internals: presence -----------------------------------------------------------------------

  _tabPath() {
    return "/tabs/" + encodeURIComponent(this.tabId);
  }

  /** Lists this tab (PUT …/tabs/{tabId}), now and every refreshAfterMs the server answers. */
  /**
   * Lists this tab (PUT …/tabs/{tabId}) with its label and hidden flag as they are now. One PUT is
   * in flight at a time, so that the server applies them in the order they were made (two in
   * flight at once may arrive in either order, and the older flag would stay listed): one asked
   * for meanwhile goes when it answers, with the state then. With `since`, a PUT of the same
   * label and flag sent from that moment on, in flight or answered, will do.
   */
  _announce(since = Infinity) {
    if (!this._presenceOn || !this._running()) return;
    const label = this._labelNow();
    const hidden = this._hidden;
    const last = this._presencePut;
    if (last && last.sentAt >= since && last.label === label && last.hidden === hidden && !last.failed) return;
    if (last?.inFlight) {
      last.again = true;
      return;
    }
    this._clearTimer("presence");
    const gen = this._gen;
    const put = { sentAt: this._clock.now(), label, hidden, inFlight: true, again: false, failed: false };
    this._presencePut = put;
    const done = () => {
      put.inFlight = false;
      if (!put.again) return false;
      this._announce();
      return true;
    };
    this._call("PUT", this._tabPath(), { label, hidden, seq: this._presenceSeqNext() }).then(
      ({ body }) => {
        if (gen !== this._gen || !this._running()) return void done();
        this._attempts.presence = 0;
        if (done()) return;
        const every = typeof body?.refreshAfterMs === "number" && body.refreshAfterMs > 0 ? body.refreshAfterMs : 15000;
        this._schedulePresence(every);
      },
      (e) => {
        put.failed = true;
        if (gen !== this._gen || !this._running()) return void done();
        put.inFlight = false; // the retry below sends the state then
        if (e.status === 404 || e.status === 405) return; // a server that does not list tabs
        if (!e.retryable) this._emitError(e);
        this._schedulePresence(backoffDelay(this._attempts.presence++, { ...this._backoff, random: this._random, retryAfterMs: e.retryAfterMs }));
      },
    );
  }

  /** Takes this tab off the list (DELETE …/tabs/{tabId}), with the request options given. */
  _unlist(options) {
    this._api.request("DELETE", this._tabPath(), undefined, { ...options, query: { seq: this._presenceSeqNext() } }).catch(() => {});
  }

  /**
   * The number of this tab's next PUT or DELETE of its listing, above every one before: the
   * server applies none whose number is not above the latest it applied, so that a PUT that
   * arrives after the DELETE the page sent as it went (on another connection, which may be faster)
   * lists nothing, and a page restored from the back/forward cache, which PUTs again, is listed.
   * It follows the wall clock (ms), so that a later page that reuses the tab id starts above.
   */
  _presenceSeqNext() {
    this._presenceSeq = Math.max(this._presenceSeq + 1, Date.now());
    return this._presenceSeq;
  }

  _schedulePresence(ms) {
    this._clearTimer("presence");
    this._timers.presence = this._clock.setTimeout(() => {
      this._timers.presence = null;
      this._announce();
    }, ms);
  }

  // --- internals: the user -----------------------------------------------------------------------

  /**
   * getToken gave a token of another user than the one this tab works as (the user signed out and
   * in as someone else in another tab): what the tab knows (its lease, the holder, its stream
   * group, its listing) is the previous user's session, and none of it may stand for the new
   * user's. The tab is no longer the owner at once; it releases the previous user's lease and
   * leaves that user's list of tabs, with that user's last token (so that the user's other tabs
   * take the lease at once, not at its expiry), leaves that user's stream group, says so (an
   * `error` event, USER_CHANGED), and starts over as the new user, as start() does (the
   * automatic acquire as it was set at construction). A tab stopped or away only forgets: start()
   * and pageshow start over.
   */
  _userChanged(error, previousToken) {
    const running = this._running();
    const held = this._holdsEpoch() ? this._epoch : 0;
    this._gen++;
    this._clearTimers();
    this._handoffWait?.finish({ status: "cancelled" });
    this._endHandoffAsk();
    this._manualAsk = null;
    this._forgetSession();
    this._policy = this._autoAcquire ? "auto" : "manual";
    if (running) this._update("user_changed");
    if (previousToken) {
      if (held) this._api.post("/lease/release", { tabId: this.tabId, epoch: held }, { token: previousToken }).catch(() => {});
      if (running && this._presenceOn) this._unlist({ token: previousToken });
    }
    this._leaveStream();
    this._emitError(error);
    if (running) this._begin();
  }

  /** Forgets what this tab knows of the session's lease and its listing, as before its first
   *  start: they were another user's. */
  _forgetSession() {
    this._epoch = 0;
    this._token = null;
    this._deadline = -Infinity;
    this._confirmedAt = -Infinity;
    this._minValidEpoch = 0;
    this._seen = { epoch: 0, at: -Infinity };
    this._lostAbove = 0;
    this._unproven = 0;
    this._view = null;
    this._viewerReadAt = -Infinity;
    this._renewAgain = false;
    this._presencePut = null;
    this._unreachable = false;
    this._streamWasLive = false;
    for (const name of Object.keys(this._attempts)) this._attempts[name] = 0;
  }

  // --- internals: the event stream ---------------------------------------------------------------

  /** Whether this tab shares its stream with the browser's other tabs: it has Web Locks and
   *  BroadcastChannel (Web Locks need a secure context: https, or localhost) and shareStream. */
  _streamShared() {
    return Boolean(this._streamEnv.locks?.request && this._streamEnv.BroadcastChannel);
  }

  /** Whether this tab keeps an event stream now. A shared stream is one connection for all the
   *  browser's tabs; an unshared one is a connection per tab, and a browser opens six HTTP/1.1
   *  connections per origin: seven tabs' streams would leave none for their renews, and the
   *  lease would expire. So a tab that does not share its stream keeps one only while it is
   *  visible, holds the lease or waits for a handoff it asked for; a hidden viewer reads the
   *  lease every viewerPollMs instead. */
  _wantsStream() {
    return Boolean(this._streamMode) && (this._streamShared() || !this._hidden || this._holdsEpoch() || this._handoffWait != null);
  }

  /** Joins or leaves the stream as _wantsStream says, for a tab that does not share it. */
  _fitStream() {
    if (!this._running() || this._streamShared()) return;
    if (!this._wantsStream()) {
      if (this._stream) this._leaveStream();
    } else if (!this._stream && this._timers.join == null) {
      this._joinStream();
    }
  }

  /** Joins the event stream shared by this browser's tabs of the same user and session. The user
   *  is the access token's `sub`: a tab that cannot tell it yet (getToken failed) would be alone in
   *  a group of its own and open a second stream, so it tries again, with backoff, and at once
   *  when a request of its own gets an answer. */
  async _joinStream() {
    if (!this._wantsStream()) return;
    this._clearTimer("join");
    let sub = "";
    let failed = false;
    try {
      sub = tokenSubject(await this._api.token(false));
    } catch (e) {
      if (e.code === USER_CHANGED) return; // the tab started over, and joins the new user's group
      failed = true;
      this._emitError(e);
    }
    if (!this._running() || this._stream || !this._wantsStream()) return;
    if (failed) {
      const delay = backoffDelay(this._attempts.join++, { ...this._backoff, random: this._random });
      this._timers.join = this._clock.setTimeout(() => {
        this._timers.join = null;
        this._joinStream();
      }, delay);
      return;
    }
    this._attempts.join = 0;
    const base = this.baseUrl || globalThis.location?.origin || "";
    const key = `${base}|${sub}|${this.sessionId}`;
    this._stream = joinHub(this._streamEnv.hubs, key, this._streamEnv, {
      open: (args) => this._openStream(args),
      onEvent: (ev) => this._onStreamEvent(ev),
      onStatus: ({ live, carrier }) => this._onStreamStatus(live, carrier),
    });
  }

  _leaveStream() {
    const s = this._stream;
    this._stream = null;
    s?.leave();
    this._onStreamStatus(false);
  }

  /** The query of the stream: the tab running it; the tabs list themselves (presence=false). */
  _streamQuery() {
    const q = { tabId: this.tabId };
    const label = this._labelNow();
    if (label) q.label = label;
    if (this._hidden) q.hidden = "true";
    if (this._presenceOn) q.presence = "false";
    return q;
  }

  _onStreamStatus(live, carrier = false) {
    if (this._streamLive === live) {
      if (this._streamCarrier !== carrier) {
        this._streamCarrier = carrier;
        this._emit("stream", { live, carrier });
      }
      return;
    }
    this._streamLive = live;
    if (!live) this._streamDownAt = this._clock.now();
    this._streamCarrier = carrier;
    if (live && this._streamWasLive && this._running()) {
      // Back from an outage: a server that restarted, or timed this tab out of the list of tabs
      // meanwhile, lists it again now, not at the next refresh (a listing sent since the stream
      // went down will do).
      this._announce(this._streamDownAt);
    }
    if (live) this._streamWasLive = true;
    if (!live && this._running() && this._streamMode) {
      // We may miss news from now on: read-only until a renew sent after this point confirms.
      this._confirmFromNow();
      this._update("stream_down");
    } else if (live && this._running() && this._holdsEpoch() && !this._pageFrozen() && this._computeState() === "unconfirmed") {
      // The server answers again (an outage ended): confirm now rather than when the renew's
      // backoff, which grew while the stream's did, comes round.
      this._attempts.renew = 0;
      this._renewNow({ after: this._confirmNeededAfter() });
    }
    this._emit("stream", { live, carrier });
    this._scheduleViewerRefresh();
  }

  _onStreamEvent(ev) {
    if (!this._running()) return;
    const now = this._clock.now();
    const d = ev.data;
    switch (ev.type) {
      case "snapshot": {
        if (!d || typeof d !== "object") return;
        if (typeof d.epoch === "number") this._learn(d.held ? d.epoch : d.epoch + 1);
        const mine = d.held && d.holder?.tabId === this.tabId && d.epoch === this._epoch;
        // A snapshot below an epoch this tab has seen is older news (the stream may have been
        // opened before that epoch came), or a store that lost its last writes (a Redis
        // failover): a read sent now tells which (_storeWentBack).
        if (this._belowSeen(d.epoch)) this.refresh().catch(() => {});
        else if (!mine) this._setView(d, now);
        this._afterLeaseNews(d.held, { type: "snapshot", ...d, id: ev.id });
        // A store that lost its data (a Redis restart) lists no tab, and the stream need not drop:
        // a snapshot that does not list this tab is the news, and the tab lists itself again now
        // rather than at its next refresh, unless its listing is in flight (a tab that starts).
        if (Array.isArray(d.tabs) && !d.tabs.some((t) => t?.tabId === this.tabId) && !this._presencePut?.inFlight) this._announce(now);
        // catalog events are not replayed: a version changed while the stream was down shows here.
        if (typeof d.catalogVersion === "string" && this._catalogVersion !== null && d.catalogVersion !== this._catalogVersion) {
          this._catalogChanged(d.catalogVersion);
        }
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
            this._saw(d.epoch);
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
          if (held && (d.type === "granted" || d.type === "taken_over") && this._policy === "yield") this._policy = "auto";
        }
        if (d.type === "handoff_requested" && mine) this._onHandoffRequested(d);
        if (!held && this._handoffWait) {
          const wait = this._handoffWait;
          if (wait.wake) wait.wake();
          else wait.news = true; // it arrived while the loop was asking: not to be slept through
        }
        this._afterLeaseNews(held, { ...d, id: ev.id });
        return;
      }
      case "tabs":
        this._emit("tabs", d);
        return;
      case "catalog":
        this._catalogChanged(d && typeof d === "object" && d.version ? d.version : null);
        return;
      default:
    }
  }

  /** The server serves another catalog version (`version`, or unknown when null): what was cached
   *  is stale. */
  _catalogChanged(version) {
    this._catalogCache.clear();
    if (version) this._catalogVersion = version;
    this._catalogEvent("version");
  }

  /** Says that the catalog to read changed (reason "role" or "version"); reads in flight before
   *  it are not joined after it (catalog()). */
  _catalogEvent(reason) {
    this._catalogNews++;
    this._emit("catalog", { version: this._catalogVersion, reason });
  }

  _afterLeaseNews(held, event) {
    this._update("event", event);
    if (!this._claimListed() && !held) this._maybeAutoAcquire();
    this._scheduleViewerRefresh();
  }

  /** Whether the server lists this tab as the holder of a lease it does not hold, by what this
   *  tab knows: an acquire or takeover answered with an error (a 503, a timeout) that the store
   *  applied after all. Not while an acquire or a handoff request of its own is in flight, whose
   *  answer tells, nor outside the viewer state (a release on its way, a tab that left). */
  _listedNotHeld() {
    const v = this._view;
    return this._state === "viewer" && Boolean(v?.held) && v.holder?.tabId === this.tabId && !this._holdsEpoch() &&
      this._acquiring === 0 && !this._handoffWait;
  }

  /** Settles a lease the server lists for this tab, which it does not hold (_listedNotHeld), and
   *  answers whether there was one: the tab acquires it when it wants control (policy auto: the page asked for it, or the tab takes
   *  free leases by itself), which gives it that epoch back, and releases it otherwise (the page
   *  released, or handed over, since it asked), so that it does not wait out its TTL with no tab
   *  in control. Called on news that lists the tab (an event, a read), once per news: a failed
   *  acquire is tried again at the next news (the viewer's reads), not on a timer, since news
   *  that does not come (every read refused) may mean the lease expired unseen. */
  _claimListed() {
    if (!this._listedNotHeld()) return false;
    if (this._policy === "auto") {
      this._acquireQuietly("try");
    } else if (this._givenBack !== this._view.epoch) {
      this._givenBack = this._view.epoch;
      this._call("POST", "/lease/release", { tabId: this.tabId, epoch: this._givenBack }).catch(() => {});
    }
    return true;
  }

  // --- internals: page lifecycle ---------------------------------------------------------------

  _installLifecycle() {
    const add = (target, type, fn) => {
      if (!target?.addEventListener) return;
      target.addEventListener(type, fn);
      this._listeners.push(() => target.removeEventListener(type, fn));
    };
    add(this._document, "visibilitychange", () => this._onVisibility());
    add(this._document, "freeze", () => this._onFreeze());
    add(this._document, "resume", () => this._onResume());
    add(this._window, "pagehide", (e) => this._onPageHide(e));
    add(this._window, "pageshow", () => this._onPageShow());
    add(this._window, "online", () => this._onOnline());
  }

  _removeLifecycle() {
    for (const off of this._listeners.splice(0)) off();
  }

  _onVisibility() {
    const hidden = this._document?.visibilityState === "hidden";
    if (hidden === this._hidden) return;
    this._hidden = hidden;
    if (!this._running()) return;
    this._fitStream();
    this._announce();
    if (this._holdsEpoch()) {
      this._renewNow(); // at once, with hidden (a longer TTL) or back to the normal TTL
    } else if (!hidden) {
      this.refresh().then(() => this._maybeAutoAcquire(), () => {});
    }
  }

  _onFreeze() {
    // Nothing runs until resume, and what the tab knows may be stale by then: no answer confirms
    // the lease until resume says from when news may have been missed.
    if (!this._running()) return;
    this._freezes++;
    this._requireConfirmAfter = Infinity;
    // The lease socket stays: a renew on its way is answered on resume, and a socket the server
    // closed meanwhile (idle) is replaced by the next call's.
    this._update("frozen");
  }

  _pageFrozen() {
    return this._requireConfirmAfter === Infinity;
  }

  _onResume() {
    if (!this._running()) return;
    // Timers did not run and news may have been missed: confirm before mutating again.
    this._requireConfirmAfter = this._clock.now();
    this._update("resumed");
    this._announce();
    if (this._holdsEpoch()) this._renewNow({ after: this._confirmNeededAfter() });
    else this.refresh().then(() => this._maybeAutoAcquire(), () => {});
  }

  /** The browser's network is back: what waits out a backoff for want of it goes now, not when
   *  the backoff comes round (an owner renews, a viewer reads the lease, the tab lists itself,
   *  and a stream that lost the server reconnects). */
  _onOnline() {
    if (!this._running() || this._pageFrozen()) return;
    this._stream?.hub.reconnectNow();
    if (this._presencePut?.failed) this._announce();
    if (this._holdsEpoch()) this._renewNow();
    else this.refresh().then(() => this._maybeAutoAcquire(), () => {});
  }

  _onPageHide(e) {
    if (!this._running()) return;
    // Release with keepalive (the page may be gone before an answer), leave the stream so that
    // another tab runs it, leave the list of tabs, and stop the timers. A page restored from the
    // back/forward cache starts over in pageshow. A page that is not kept in that cache never
    // comes back, nor does its tab id: it says the tab is gone, which also makes an acquire still
    // on its way grant nothing (TAB_GONE), where its grant would leave the session to a closed tab.
    // So does a page kept in the cache with an acquire on its way, whose grant would go to a page
    // no one sees (restored, its acquires are refused until the server's window ends), and a page
    // waiting for a handoff it asked for, so that the holder's release reserves nothing for it.
    if (this._acquiring > 0 || this._handoffWait || (!e?.persisted && this._holdsEpoch())) {
      this._release("away", { keepalive: true, gone: true });
    } else if (this._holdsEpoch()) {
      this._release("away", { keepalive: true });
    }
    if (this._presenceOn) this._unlist({ keepalive: true });
    if (this._policy === "yield") this._policy = "auto";
    this._clearTimers();
    this._leaveStream();
    // A page with an open WebSocket is not kept in the back/forward cache.
    this._api.socket?.suspend();
    this._to("away", "pagehide");
  }

  _onPageShow() {
    if (this._state !== "away") return;
    this._api.socket?.resume();
    this._requireConfirmAfter = this._clock.now();
    this._to("viewer", "resumed");
    this._update("resumed");
    if (this._streamMode) this._joinStream();
    this._announce();
    if (this._autoAcquire && this._policy === "auto" && !this._hidden) this._acquireQuietly("try");
    else this.refresh().then(() => this._maybeAutoAcquire(), () => {});
  }
}
