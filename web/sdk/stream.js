// stream.js — the event stream of the browser client: one connection kept open (StreamRunner),
// shared by every tab of the browser through a carrier tab (StreamHub), and the two ways to open
// it (fetch, or EventSource with a ticket).
//
// # Carrier election
//
// Tabs of one browser profile, origin, user and session share one stream. The carrier is the tab
// holding the Web Lock "tablease-stream:<key>"; it runs the connection and re-broadcasts every
// event on the BroadcastChannel "tablease:<key>". The others (followers) queue for the lock and
// listen. Every carrier announces itself with a term one above the highest it has heard of;
// followers listen only to the carrier of the highest term, so a carrier that was frozen and
// wakes up cannot be mistaken for the current one.
//
// A carrier can stop talking without freeing its lock: the page is frozen, hung, or its renderer
// is stuck. So followers check it: a follower that has heard nothing from the carrier for half of
// carrierTimeoutMs pings it (the carrier answers with a beat at once, whatever its timers are
// doing), and one that has heard nothing for carrierTimeoutMs, a ping of its own unanswered for a
// quarter of it included, takes the lock with `steal: true` and carries the stream itself. The
// unanswered ping is what condemns the carrier, not silence: a healthy carrier with nothing to
// say speaks only when pinged, and a hidden follower's timers fire a second or more apart, so at
// each of its checks the carrier has been quiet that long. From the moment a ping is due (half of
// carrierTimeoutMs after it was sent, and carrierTimeoutMs after the carrier last spoke) until the
// carrier answers or another tab carries the stream, news may have been missed, which the lease
// time model turns into "confirm before mutating". A guarded mutation in a follower that has not
// heard the carrier for carrierTimeoutMs pings it first and waits for that answer (heard()).
//
// A tab being frozen (`freeze`) gives the stream up at once (it steps down and leaves the queue),
// and queues again on `resume`. A carrier that closes or crashes frees its lock with its page.

import { DEFAULTS, TabLeaseError, backoffDelay, browserClock, randomId, readAnswer, sleep } from "./http.js";
import { SSEParser, parseData } from "./sse.js";

/**
 * Keeps one event-stream connection open: open({lastEventId, signal, onItem, onOpen}) connects
 * once and resolves when the connection ends (or rejects with a TabLeaseError). StreamRunner
 * reconnects with jittered backoff (the server's retry: as the base, Retry-After respected),
 * resumes with the last event id, and reports live/down.
 */
export class StreamRunner {
  constructor({ open, clock = browserClock, random = Math.random, baseMs = 1000, maxMs = 30000, notFoundMs = DEFAULTS.streamNotFoundMs, lastEventId = "", onEvent = undefined, onStatus = undefined }) {
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
    this._nap = null; // the wait before the next connection: {ac, unanswered}
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

  /**
   * Connects now if the runner is waiting after a connection that ended without an answer from
   * the server (it went away, or could not be reached): its caller heard from the server again. A
   * wait the server asked for (an answer with a status: Retry-After, 403, 404) is kept.
   */
  retryNow() {
    if (this._nap?.unanswered) this._nap.ac.abort();
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
      const nap = { ac: new AbortController(), unanswered: !error || error.code === "NETWORK" };
      const onStop = () => nap.ac.abort();
      signal.addEventListener("abort", onStop, { once: true });
      this._nap = nap;
      await sleep(this._clock, delay, nap.ac.signal);
      this._nap = null;
      signal.removeEventListener("abort", onStop);
    }
  }
}

/** The hubs of this tab, by key: module state, so that every TabLease of the tab shares one. */
export const defaultHubs = new Map();

/**
 * The stream of one key (origin + user + session) inside one tab, shared across the tabs of the
 * browser (see "Carrier election" above). Subscribers are the TabLease instances of this tab:
 * {open(args), onEvent(ev), onStatus({live, carrier})}.
 */
export class StreamHub {
  constructor(key, { locks = undefined, BroadcastChannel: BC = undefined, document = null, clock = browserClock, random = Math.random, carrierTimeoutMs = DEFAULTS.carrierTimeoutMs, runnerOptions = {} } = {}) {
    this.key = key;
    this.id = randomId();
    this._locks = locks;
    this._BC = BC;
    this._document = document;
    this._clock = clock;
    this._random = random;
    this._timeoutMs = carrierTimeoutMs;
    this._runnerOptions = runnerOptions;
    this._subs = new Set();
    /** Whether this tab runs the connection. */
    this.carrier = false;
    /** Whether the connection is up (in this tab, or as the carrier last said). */
    this.live = false;
    this.lastEventId = "";
    this._term = 0; // the highest carrier term heard of
    this._carrierId = null; // the carrier this tab listens to (a follower)
    this._heardAt = -Infinity; // when the carrier was last heard from
    this._stoleAt = -Infinity; // when this tab last asked to take the lock from a silent carrier
    this._pingedAt = -Infinity; // when this tab sent the oldest ping the carrier has not answered
    this._hearers = new Set(); // the waits of heard()
    this._frozen = false;
    this._runner = null;
    this._channel = null;
    this._lock = null; // this tab's lock request: {ac, release}
    this._leading = null; // the lock request this tab carries the stream under
    this._watchTimer = null;
    this._off = [];
  }

  get shared() {
    return Boolean(this._locks?.request && this._BC);
  }

  /**
   * A subscriber heard from the server again after it could not reach it: the stream, if it is
   * down and waits to reconnect after losing the server, connects now, in this tab or, asked over
   * the channel, in the carrier's.
   */
  reconnectNow() {
    if (this.live) return;
    if (this.carrier) this._runner?.retryNow();
    else if (this.shared) this._post({ t: "reconnect" });
  }

  add(sub) {
    this._subs.add(sub);
    if (this._subs.size === 1) this._start();
    else sub.onStatus?.(this._status());
  }

  /** Removes sub; returns true when the hub has no subscriber left (and has stopped). */
  remove(sub) {
    this._subs.delete(sub);
    if (this._subs.size > 0) return false;
    this._stop();
    return true;
  }

  /**
   * The moment from which news may have been missed because the carrier stopped answering: when
   * this tab is a follower with a ping unanswered past its due (see "Carrier election" above),
   * the moment it was due; otherwise -Infinity. The lease time model asks for a confirmation sent
   * after it. It does not wait for a timer, which a browser may delay.
   */
  missedSince(now = this._clock.now()) {
    if (!this.shared || this.carrier || this._frozen || this._subs.size === 0) return -Infinity;
    if (!this._unanswered()) return -Infinity;
    const due = this._pingDue();
    return now >= due ? due : -Infinity;
  }

  /** Whether this tab sent a ping since the carrier last spoke. */
  _unanswered() {
    return this._pingedAt > this._heardAt;
  }

  /** When the carrier should have answered this tab's oldest unanswered ping by. */
  _pingDue() {
    return Math.max(this._heardAt + this._timeoutMs, this._pingedAt + this._timeoutMs / 2);
  }

  /**
   * Resolves once this tab has heard from the carrier within carrierTimeoutMs: at once when it has
   * (or carries the stream, or shares none, or the stream is down anyway); otherwise it pings the
   * carrier and resolves on its answer, or when the ping is due (missedSince then says so). A
   * follower whose timers a browser throttled thus acts on a carrier heard from just now.
   */
  heard() {
    const now = this._clock.now();
    if (!this.shared || this.carrier || this._frozen || !this.live || now - this._heardAt < this._timeoutMs) return Promise.resolve();
    this._ping(now);
    return new Promise((resolve) => {
      const done = () => {
        this._clock.clearTimeout(timer);
        this._hearers.delete(done);
        resolve(undefined);
      };
      const timer = this._clock.setTimeout(done, Math.max(0, this._pingDue() - now));
      this._hearers.add(done);
    });
  }

  /** Pings the carrier; the oldest ping it has not answered is the one its answer is due for. */
  _ping(now) {
    if (!this._unanswered()) this._pingedAt = now;
    this._post({ t: "ping" });
  }

  /** Ends the waits of heard(): the carrier spoke, or this tab no longer follows one. */
  _wakeHearers() {
    for (const done of [...this._hearers]) done();
  }

  _start() {
    if (!this.shared) {
      this._lead(null);
      return;
    }
    this._channel = new this._BC("tablease:" + this.key);
    this._channel.onmessage = (e) => this._onMessage(e.data);
    const doc = this._document;
    if (doc?.addEventListener) {
      const onFreeze = () => this._onFreeze();
      const onResume = () => this._onResume();
      doc.addEventListener("freeze", onFreeze);
      doc.addEventListener("resume", onResume);
      this._off.push(() => doc.removeEventListener("freeze", onFreeze), () => doc.removeEventListener("resume", onResume));
    }
    this._follow();
  }

  _stop() {
    for (const off of this._off.splice(0)) off();
    this._stopWatch();
    this._wakeHearers();
    this._stepDown("leaving");
    this._dropLockRequest();
    try {
      this._channel?.close();
    } catch {}
    this._channel = null;
    this._setLive(false);
  }

  /** Becomes a follower: queues for the lock, says hello, and watches the carrier. */
  _follow() {
    this._heardAt = this._clock.now(); // give the carrier time to answer the hello
    this._requestLock(false);
    this._post({ t: "hello" });
    this._watch();
  }

  _requestLock(steal) {
    this._dropLockRequest();
    const req = { ac: steal ? null : new AbortController(), release: null };
    this._lock = req;
    // steal cannot be combined with a signal: a stolen lock is given back by resolving.
    const options = steal ? { steal: true } : { signal: req.ac.signal };
    this._locks
      .request("tablease-stream:" + this.key, options, () => {
        if (this._lock !== req || this._frozen || this._subs.size === 0) return undefined;
        return new Promise((resolve) => {
          req.release = resolve;
          this._lead(req);
        });
      })
      .then(
        () => this._lockEnded(req),
        () => this._lockEnded(req), // AbortError: dropped while queued, or stolen by another tab
      );
  }

  _dropLockRequest() {
    const req = this._lock;
    this._lock = null;
    if (!req) return;
    req.ac?.abort();
    req.release?.();
  }

  /** The lock of req is gone (given back or stolen): stop carrying under it. */
  _lockEnded(req) {
    if (this._leading !== req || req === null) return;
    this._stepDown("lost");
    if (this._subs.size > 0 && !this._frozen) this._follow();
  }

  /** Carries the stream: this tab holds the lock of req (null: not shared). */
  _lead(req) {
    const sub = this._subs.values().next().value;
    if (!sub) return;
    this._stopWatch();
    this._wakeHearers();
    this._leading = req;
    this.carrier = true;
    this._term += 1;
    this._carrierId = this.id;
    this._post({ t: "lead", live: false });
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
        this._post({ t: "beat", live });
        this._setLive(live);
      },
    });
    this._notifyStatus();
    this._runner.start();
  }

  /** Stops carrying the stream, if this tab does, and gives the lock back. */
  _stepDown(why) {
    if (!this.carrier) return;
    const req = this._leading;
    this._leading = null;
    this.carrier = false;
    this._runner?.stop();
    this._runner = null;
    if (why !== "lost") this._post({ t: "resign" });
    if (req && this._lock === req) this._lock = null;
    req?.release?.();
    this._carrierId = null;
    this._setLive(false);
    this._notifyStatus();
  }

  _onFreeze() {
    // A frozen tab can neither carry the stream nor answer pings: hand it to another tab now,
    // and leave the queue so that the lock is never granted to a page that cannot run.
    this._frozen = true;
    this._stopWatch();
    this._wakeHearers();
    this._stepDown("frozen");
    this._dropLockRequest();
    this._setLive(false);
  }

  _onResume() {
    if (!this._frozen) return;
    this._frozen = false;
    if (this._subs.size > 0 && this.shared) this._follow();
  }

  /** The follower's check of the carrier, every quarter of carrierTimeoutMs. */
  _watch() {
    this._stopWatch();
    if (this.carrier || this._frozen || !this.shared) return;
    this._watchTimer = this._clock.setTimeout(() => {
      this._watchTimer = null;
      if (this.carrier || this._frozen || this._subs.size === 0) return;
      const now = this._clock.now();
      const quiet = now - this._heardAt;
      const unanswered = this._unanswered();
      if (quiet >= this._timeoutMs && unanswered && now - this._pingedAt >= this._timeoutMs / 4 && now - this._stoleAt >= this._timeoutMs) {
        this._carrierSilent();
      } else if (quiet >= this._timeoutMs / 2) {
        this._ping(now);
      }
      this._watch();
    }, Math.max(1, Math.floor(this._timeoutMs / 4 + this._random() * (this._timeoutMs / 8))));
  }

  _stopWatch() {
    if (this._watchTimer != null) this._clock.clearTimeout(this._watchTimer);
    this._watchTimer = null;
  }

  /** The carrier did not answer: take the stream over (the lock, even from a frozen holder). */
  _carrierSilent() {
    this._carrierId = null;
    this._stoleAt = this._clock.now(); // a steal that is not granted is tried again after a while
    this._setLive(false);
    this._requestLock(true);
  }

  _onMessage(m) {
    if (!m || typeof m !== "object" || m.from === this.id || this._frozen) return;
    if (m.t === "hello" || m.t === "ping") {
      if (this.carrier) this._post({ t: "beat", live: this.live });
      return;
    }
    if (m.t === "reconnect") {
      if (this.carrier) this._runner?.retryNow();
      return;
    }
    if (typeof m.term !== "number" || !this._fromCarrier(m)) return;
    const now = this._clock.now();
    if (this.live && this.missedSince(now) !== -Infinity) {
      // The carrier answered a ping of this tab late, and no timer of this tab ran meanwhile to
      // say so (a busy carrier page, a throttled follower): the getters read the stream as down
      // since the ping was due, so it was, and the leases confirm again. The carrier's beat, asked
      // for now, says it is live.
      this._setLive(false);
      this._post({ t: "ping" });
    }
    this._heardAt = now;
    this._wakeHearers();
    switch (m.t) {
      case "lead":
      case "beat":
        this._setLive(Boolean(m.live));
        return;
      case "event":
        if (!m.ev) return;
        if (m.ev.id) this.lastEventId = m.ev.id;
        this._deliver(m.ev);
        return;
      case "resign":
        this._carrierId = null;
        this._setLive(false);
        return;
      default:
    }
  }

  /** Whether m comes from the carrier to listen to: the highest term (then the highest id). */
  _fromCarrier(m) {
    if (m.term < this._term) return false;
    if (m.term === this._term && this._carrierId && m.from !== this._carrierId && m.from < this._carrierId) return false;
    if (this.carrier) {
      // Another tab carries under a newer term: this tab's lock was taken from it.
      this._stepDown("lost");
      this._term = m.term;
      this._carrierId = m.from;
      if (this._subs.size > 0 && !this._frozen) this._follow();
      this._heardAt = this._clock.now();
      return m.t !== "resign";
    }
    this._term = m.term;
    this._carrierId = m.from;
    if (this._watchTimer == null) this._watch();
    return true;
  }

  _post(m) {
    try {
      this._channel?.postMessage({ ...m, from: this.id, term: this._term });
    } catch {}
  }

  _deliver(ev) {
    for (const s of [...this._subs]) s.onEvent?.(ev);
  }

  _setLive(live) {
    if (this.live === live) return;
    this.live = live;
    this._notifyStatus();
  }

  _status() {
    return { live: this.live, carrier: this.carrier };
  }

  _notifyStatus() {
    const st = this._status();
    for (const s of [...this._subs]) s.onStatus?.(st);
  }
}

/** Joins the hub of key in hubs (creating it); returns {hub, leave}. */
export function joinHub(hubs, key, env, sub) {
  let hub = hubs.get(key);
  if (!hub) {
    hub = new StreamHub(key, env);
    hubs.set(key, hub);
  }
  hub.add(sub);
  return {
    hub,
    leave: () => {
      if (hub.remove(sub) && hubs.get(key) === hub) hubs.delete(key);
    },
  };
}

/**
 * An open() for StreamRunner that reads GET …/events with fetch(), so that it can send the
 * Authorization header and Last-Event-ID. query() gives the stream's query at each connect.
 */
export function fetchStreamOpener({ api, fetch, query, clock = browserClock, idleMs = null }) {
  return async ({ lastEventId, signal, onItem, onOpen }) => {
    let refresh = false;
    for (let attempt = 0; attempt < 2; attempt++) {
      const token = await api.token(refresh);
      if (signal.aborted) return; // ended while getToken ran: nothing to open
      const headers = { Authorization: `Bearer ${token}`, Accept: "text/event-stream" };
      if (lastEventId) headers["Last-Event-ID"] = lastEventId;
      let res;
      // Connecting (until the answer's headers) gets the API's request timeout: a connect that
      // is never answered would otherwise keep the stream down for as long as it hangs.
      // (After the headers, pump stops reading when signal aborts.)
      const connect = api.deadline("answer", signal);
      try {
        res = await fetch(api.url("/events", query()), { headers, signal: connect.signal, cache: "no-store" });
      } catch (e) {
        if (signal.aborted) return;
        throw api.networkError("GET", "/events", connect.signal.aborted ? connect.error : e, connect.signal.aborted);
      } finally {
        connect.clear();
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
      await pump(res.body, signal, onItem, clock, idleMs);
      return;
    }
  };
}

/** The silence after which a stream whose server sends a keepalive every keepaliveMs is taken
 *  for stalled: one keepalive, and 5 s or a third of it more, whichever is longer. */
export function idleAfterKeepalive(keepaliveMs) {
  return keepaliveMs + Math.max(5000, Math.round(keepaliveMs / 3));
}

/** Reads body as text/event-stream until it ends, breaks, is silent for too long, or signal
 *  aborts; a body left before its end is cancelled, which closes its connection. Too long is
 *  idleMs when given, else idleAfterKeepalive of the snapshot's keepaliveMs once it came (a stream
 *  held open by a proxy that passes nothing on leaves a tab acting on old news no longer than
 *  that), else DEFAULTS.streamIdleMs. */
async function pump(body, signal, onItem, clock, idleMs) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  const parser = new SSEParser();
  let ms = idleMs ?? DEFAULTS.streamIdleMs;
  let idle = null;
  const arm = () => {
    if (idle != null) clock.clearTimeout(idle);
    idle = clock.setTimeout(() => reader.cancel().catch(() => {}), ms);
  };
  const onAbort = () => reader.cancel().catch(() => {});
  signal.addEventListener("abort", onAbort, { once: true });
  let ended = false;
  arm();
  try {
    while (!signal.aborted) {
      const { value, done } = await reader.read();
      if (done) {
        ended = true;
        break;
      }
      if (signal.aborted) break;
      arm();
      for (const item of parser.feed(decoder.decode(value, { stream: true }))) {
        if (idleMs == null && item.kind === "event" && item.type === "snapshot") {
          const k = keepaliveOf(item.data);
          if (k !== null) {
            ms = idleAfterKeepalive(k);
            arm();
          }
        }
        onItem(item);
      }
    }
  } catch (e) {
    if (!signal.aborted) throw new TabLeaseError({ code: "NETWORK", message: "tablease: event stream broke", retryable: true, cause: e });
  } finally {
    if (idle != null) clock.clearTimeout(idle);
    signal.removeEventListener("abort", onAbort);
    if (!ended) reader.cancel().catch(() => {});
  }
}

/**
 * An open() for StreamRunner that uses EventSource: POST …/events/ticket, then
 * EventSource(…/events?ticket=&lastEventId=). The ticket is single-use, so every reconnect takes
 * a new one.
 */
export function ticketStreamOpener({ api, EventSource: ES, query, tabId }) {
  return async ({ lastEventId, signal, onItem, onOpen }) => {
    if (typeof ES !== "function") throw new TabLeaseError({ code: "UNSUPPORTED", message: "tablease: no EventSource in this environment" });
    const { body } = await api.post("/events/ticket", { tabId });
    if (signal.aborted) return;
    const extra = { ticket: body.ticket };
    if (lastEventId) extra.lastEventId = lastEventId; // EventSource cannot set Last-Event-ID
    const es = new ES(api.url("/events", { ...query(), ...extra }));
    await new Promise((resolve) => {
      const close = () => {
        es.close();
        resolve(undefined);
      };
      signal.addEventListener("abort", close, { once: true });
      es.onopen = () => onOpen();
      es.onerror = () => close(); // reconnect through the runner with a new ticket
      for (const type of ["snapshot", "lease", "tabs", "catalog"]) {
        es.addEventListener(type, (e) => onItem({ kind: "event", type, data: e.data, id: e.lastEventId ?? "" }));
      }
    });
  };
}

/** The keepaliveMs of a snapshot's data, or null when it has none that makes sense. */
function keepaliveOf(data) {
  try {
    const k = JSON.parse(data)?.keepaliveMs;
    return Number.isSafeInteger(k) && k >= 1000 ? k : null;
  } catch {
    return null;
  }
}
