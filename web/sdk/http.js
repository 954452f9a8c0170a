// http.js — the browser client's side of the HTTP contract (docs/DESIGN.md §3): one call with
// its token, its errors, and the retry timing that every caller shares.

/** Defaults of the TabLease options, in milliseconds. */
export const DEFAULTS = Object.freeze({
  marginMs: 1500, // subtracted from remainingMs (capped at a quarter of the granted TTL)
  hiddenTtlMs: 150000, // asked for while the tab is hidden (the server clamps it)
  backoffBaseMs: 250, // first retry delay after a 503, 429 or network error
  backoffMaxMs: 15000, // cap of the exponential backoff (a longer Retry-After is respected)
  requestTimeoutMs: 10000, // a call (getToken, then the request and its answer) not done by then fails as NETWORK
  handoffTimeoutMs: 15000, // how long requestHandoff waits for the holder to let go
  handoffGraceMs: 10000, // how long a holder asked to hand over waits for running mutations
  hiddenAcquireDelayMs: 3000, // a hidden tab waits this long before taking a free lease
  viewerPollMs: 10000, // a viewer re-reads the lease this often while the event stream is down
  streamIdleMs: 45000, // no byte for this long: reconnect (until the snapshot gives the server's keepaliveMs: idleAfterKeepalive)
  streamNotFoundMs: 60000, // wait before reconnecting when the server has no event stream (404)
  carrierTimeoutMs: 1000, // a stream carrier silent this long is taken over by another tab
});

/** The clock of the browser: a monotonic now() and timers. Tests pass a fake one. */
export const browserClock = Object.freeze({
  now: () => performance.now(),
  setTimeout: (fn, ms) => setTimeout(fn, ms),
  clearTimeout: (id) => clearTimeout(id),
});

/**
 * An error answer of the tablease API (`{error: {code, message, retryable, details}}`), or a
 * network failure (code "NETWORK", status 0).
 */
export class TabLeaseError extends Error {
  constructor({ status = 0, code = "INTERNAL", message = "", retryable = false, details = {}, retryAfterMs = null, cause = undefined } = {}) {
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
/**
 * @param {number} attempt
 * @param {{baseMs?: number, maxMs?: number, random?: () => number, retryAfterMs?: number | null}} [options]
 * @returns {number}
 */
export function backoffDelay(attempt, { baseMs = DEFAULTS.backoffBaseMs, maxMs = DEFAULTS.backoffMaxMs, random = Math.random, retryAfterMs = null } = {}) {
  const cap = Math.min(maxMs, baseMs * 2 ** Math.min(attempt, 30));
  const jittered = cap / 2 + random() * (cap / 2);
  return Math.round(Math.max(jittered, retryAfterMs ?? 0));
}

/** The `sub` claim of a JWT, read without verifying it (only to key the shared stream, and to
 *  tell when getToken gives another user's token). */
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

/** The code of the error of a request not sent because getToken gave another user's token. */
export const USER_CHANGED = "USER_CHANGED";

/** Resolves after ms of clock time (true), or at once when signal aborts (false). */
export function sleep(clock, ms, signal = undefined) {
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

/**
 * The API of one session as one tab calls it: every call carries a fresh access token from
 * getToken, a 401 asks getToken({refresh: true}) once and tries again, and every failure is a
 * TabLeaseError. A request that never reaches the server says why it may not have (the server is
 * down, or it does not allow this page's origin). getToken, and then each request with its
 * answer, get timeoutMs each: a request that is never answered (a connection that went silent, a
 * proxy that holds it) fails as NETWORK and is aborted, so that no caller waits on it for ever and
 * it holds none of the browser's few connections to the server.
 *
 * Every request is made as one user, the `sub` of the tokens the tab works with: a token of
 * another user (the user signed out and in as someone else in another tab) is never sent on the
 * previous user's behalf. The request fails with USER_CHANGED, and the first to see the change
 * tells onUserChange, which starts the tab over as the new user.
 */
export class SessionApi {
  constructor({ baseUrl, sessionId, getToken, fetch, origin = globalThis.location?.origin ?? "", clock = browserClock, timeoutMs = DEFAULTS.requestTimeoutMs, onUserChange = undefined, socket = null }) {
    this.baseUrl = baseUrl;
    /** The lease socket that carries renews and checks when it can (socket.js); null: HTTP only.
     *  @type {import("./socket.js").LeaseSocket | null} */
    this.socket = socket;
    this.sessionId = sessionId;
    this._getToken = getToken;
    this._fetch = fetch;
    this._origin = origin;
    this._clock = clock;
    /** How long getToken, and each request with its answer, may take.
     *  @type {number} */
    this.timeoutMs = timeoutMs;
    /** The last access token getToken gave for the user: what a request during pagehide sends. */
    this.lastToken = null;
    /** The user the tab works as: the `sub` of its tokens ("" for a token without one); null
     *  until getToken first answers. */
    this.user = null;
    this._onUserChange = onUserChange;
  }

  url(path, query = undefined) {
    let url = `${this.baseUrl}/v1/sessions/${encodeURIComponent(this.sessionId)}${path}`;
    if (query) {
      const qs = new URLSearchParams(query).toString();
      if (qs) url += "?" + qs;
    }
    return url;
  }

  /** A deadline ms (default timeoutMs) from now: signal aborts with error ("no <what> within
   *  N s") when it passes, or with the reason of follow when that aborts first; clear() ends both. */
  deadline(what, follow = undefined, ms = this.timeoutMs) {
    const ac = new AbortController();
    const error = new Error(`no ${what} within ${ms / 1000} s`);
    const timer = this._clock.setTimeout(() => ac.abort(error), ms);
    const onFollow = () => ac.abort(follow?.reason);
    if (follow?.aborted) onFollow();
    else follow?.addEventListener("abort", onFollow, { once: true });
    const clear = () => {
      this._clock.clearTimeout(timer);
      follow?.removeEventListener("abort", onFollow);
    };
    return { signal: ac.signal, error, clear };
  }

  /** The access token (a fresh one from the identity provider when refresh), for a request made
   *  as user `as` (null: whoever the tab works as when getToken answers). getToken failing
   *  (throwing, answering late, or answering anything but a non-empty string) proves nothing
   *  about the lease (an identity provider down, the network): the error is retryable, and the
   *  caller retries as it does after a network error. A token of another user fails with
   *  USER_CHANGED. */
  async token(refresh = false, as = this.user) {
    let t;
    // getToken gets the signal, so that one that fetches can stop when the client gives up.
    const d = this.deadline("token");
    try {
      const late = new Promise((_, reject) => d.signal.addEventListener("abort", () => reject(d.error), { once: true }));
      const { signal } = d;
      t = await Promise.race([this._getToken(refresh ? { refresh: true, signal } : { signal }), late]);
    } catch (e) {
      throw new TabLeaseError({ status: 401, code: "UNAUTHENTICATED", message: `tablease: getToken failed: ${e?.message ?? e}`, retryable: true, cause: e });
    } finally {
      d.clear();
    }
    if (typeof t !== "string" || t === "") {
      throw new TabLeaseError({ status: 401, code: "UNAUTHENTICATED", message: `tablease: getToken returned no token (${t === "" ? "an empty string" : typeof t})`, retryable: true });
    }
    const user = tokenSubject(t);
    const mine = as ?? this.user;
    // (mine !== this.user: the change was seen while getToken ran, and a request made as the
    // previous user is not sent, even with a token of that user that answered late.)
    if (mine !== null && (user !== mine || mine !== this.user)) {
      const e = new TabLeaseError({
        code: USER_CHANGED,
        message: "tablease: getToken gave another user's token: the request was not sent, and this tab starts over as that user",
        retryable: true,
        details: { user, previousUser: mine },
      });
      if (mine === this.user) {
        // The first request to see it: from now on the tab works as the new user.
        const previousToken = this.lastToken;
        this.user = user;
        this.lastToken = t;
        this._onUserChange?.(e, previousToken);
      }
      throw e;
    }
    this.user = user;
    this.lastToken = t;
    return t;
  }

  post(path, body, opts = {}) {
    return this.request("POST", path, body, opts);
  }

  /** One call: JSON in, JSON out. Resolves {status, body, etag, token} (token: the access token
   *  it was sent with); rejects with a TabLeaseError. A renew or a check goes over the lease
   *  socket when there is one that can take it, else (and when the socket does not answer it) as
   *  an HTTP request: the same call, the same answer.
   *  timeoutMs (at most the client's) bounds the request and its answer. With token, the first
   *  attempt sends it without asking getToken (a release that must not wait on it), and a 401
   *  asks getToken for a fresh one as usual, of that token's user. beforeSend, when given, runs
   *  just before each attempt is sent, once its token is there, and may throw to send nothing. */
  async request(method, path, body = undefined, { query = undefined, headers: extra = {}, keepalive = false, timeoutMs = this.timeoutMs, token: given = null, beforeSend = null } = {}) {
    const as = given ? tokenSubject(given) : this.user; // the user the request is made as
    for (let attempt = 0; ; attempt++) {
      let token;
      if (given && attempt === 0) token = given;
      else if (keepalive && this.lastToken) token = this.lastToken; // no await while the page goes
      else token = await this.token(attempt > 0, as);
      beforeSend?.();
      const headers = { Authorization: `Bearer ${token}`, Accept: "application/json", ...extra };
      if (body !== undefined) headers["Content-Type"] = "application/json";
      // A keepalive request outlives the page: nothing waits for it.
      const d = keepalive ? null : this.deadline("answer", undefined, Math.min(timeoutMs, this.timeoutMs));
      try {
        const op = d && method === "POST" && query === undefined && SOCKET_CALLS[path];
        if (op && this.socket?.usable()) {
          // The socket gets half the call's time: one that does not answer by then (it does not
          // open, or is stalled) leaves the other half to HTTP.
          const budgetMs = Math.max(1, Math.floor(Math.min(timeoutMs, this.timeoutMs) / 2));
          let a = null;
          try {
            a = await this.socket.call(op, this.sessionId, body, token, d.signal, budgetMs);
          } catch {
            if (d.signal.aborted) throw this.networkError(method, path, d.error, true);
            // (SocketFailed, the one other way call ends: HTTP below.)
          }
          if (a) {
            if (a.status === 401 && attempt === 0) continue;
            return { ...settle(a.status, a.body, a.retryAfterMs, method, path), token };
          }
          // The socket did not answer: the call goes over HTTP, within the same deadline.
        }
        let res;
        try {
          res = await this._fetch(this.url(path, query), {
            method,
            headers,
            body: body === undefined ? undefined : JSON.stringify(body),
            keepalive,
            // Only a GET's answer could be cached. Another method's cache mode "no-store" would
            // also keep the browser from caching a CORS preflight (Access-Control-Max-Age), so
            // that every call of a page on another origin would be preflighted.
            cache: method === "GET" || method === "HEAD" ? "no-store" : undefined,
            signal: d?.signal,
          });
        } catch (e) {
          throw this.networkError(method, path, d?.signal.aborted ? d.error : e, d?.signal.aborted);
        }
        if (res.status === 401 && attempt === 0 && !keepalive) continue;
        let answer = null;
        let failed = null;
        try {
          answer = await readAnswer(res, method, path);
        } catch (e) {
          failed = e;
        }
        // An answer whose body stopped coming is no answer.
        if (d?.signal.aborted) throw this.networkError(method, path, d.error, true);
        if (failed) throw failed;
        return { ...answer, token };
      } finally {
        d?.clear();
      }
    }
  }

  /** The error of a request that got no answer (timedOut: not within the client's deadline),
   *  with what an operator should look at. A request the browser refused for CORS fails at once,
   *  never by the deadline. */
  networkError(method, path, cause, timedOut = false) {
    let why = "the server is down or unreachable";
    const server = this._serverOrigin();
    if (timedOut) {
      why = "the server did not answer in time (overloaded, or the network is slow or down)";
    } else if (server && this._origin && server !== this._origin) {
      why = `the server is down or unreachable, or it does not allow requests from ${this._origin} (set TABLEASE_CORS_ORIGINS on the server)`;
    }
    return new TabLeaseError({
      status: 0,
      code: "NETWORK",
      message: `tablease: ${method} ${this.url(path)} got no answer (${cause?.message ?? cause}): ${why}`,
      retryable: true,
      cause,
    });
  }

  _serverOrigin() {
    try {
      return new URL(this.baseUrl || "/", this._origin || undefined).origin;
    } catch {
      return "";
    }
  }
}

/** The calls the lease socket carries, by path: a renew and a check change nothing when made
 *  twice, so that one the socket did not answer is made again over HTTP. */
const SOCKET_CALLS = Object.freeze({ "/lease/renew": "renew", "/lease/check": "check" });

/** Reads an answer: {status, body, etag} when it is a success, a TabLeaseError otherwise. */
export async function readAnswer(res, method, path) {
  const etag = res.headers?.get?.("ETag") ?? null;
  if (res.status === 304 || res.status === 204) return { status: res.status, body: null, etag };
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
  if (res.ok && body === null && text) {
    throw new TabLeaseError({ status: res.status, code: "INTERNAL", message: `tablease: ${method} ${path} answered something that is not JSON`, retryable: false });
  }
  return { ...settle(res.status, body, parseRetryAfter(res.headers?.get?.("Retry-After")), method, path), etag };
}

/** The answer {status, body} of a call answered status with body (its JSON, or null), when it is
 *  a success; a TabLeaseError otherwise (retryAfterMs: its Retry-After, or null). */
function settle(status, body, retryAfterHeaderMs, method, path) {
  if (status >= 200 && status < 300) return { status, body: body ?? {}, etag: null };
  const err = body?.error ?? {};
  const retryAfterMs = retryAfterHeaderMs ?? (typeof err.details?.retryAfterMs === "number" ? err.details.retryAfterMs : null);
  throw new TabLeaseError({
    status,
    code: err.code ?? (status === 404 ? "NOT_FOUND" : status >= 500 ? "UNAVAILABLE" : "HTTP_" + status),
    message: err.message ?? `tablease: ${method} ${path} answered ${status}`,
    retryable: err.retryable ?? (status === 429 || status === 502 || status === 503 || status === 504),
    details: err.details ?? {},
    retryAfterMs,
  });
}

const ID_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/**
 * A random id: 22 characters of A-Z a-z 0-9 - _ (132 random bits), all of them characters of
 * tablease ids. Shorter than a UUID's 36 for as many random bits, which matters where the id is
 * stored: a tab's id is in each audit record of its leases.
 */
export function randomId() {
  const bytes = new Uint8Array(22);
  const c = globalThis.crypto;
  if (c?.getRandomValues) c.getRandomValues(bytes);
  else for (let i = 0; i < bytes.length; i++) bytes[i] = Math.floor(Math.random() * 256);
  return Array.from(bytes, (b) => ID_ALPHABET[b & 63]).join("");
}
