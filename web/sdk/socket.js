// socket.js — the lease socket (docs/DESIGN.md §3, "Lease socket"): one WebSocket per TabLease
// that carries its renews and lease checks, each a third cheaper for the server than an HTTP
// request. HTTP carries them whenever the socket cannot (SessionApi.request): a call the socket
// did not answer within half its time, because it could not open, closed, refused the token or is
// stalled, is made over HTTP at once; renews and checks change nothing when made twice.

/** How long after a socket that could not open or answer in time (or refused the token) the calls
 *  go over HTTP before another is tried; doubled after each failure in a row, up to
 *  SOCKET_RETRY_MAX_MS. */
export const SOCKET_RETRY_MS = 60000;
const SOCKET_RETRY_MAX_MS = 10 * 60000;

/** The error of a call the socket did not answer: the caller makes it over HTTP. */
class SocketFailed extends Error {}

/** The URL of the lease socket of the server at baseUrl ("" for the page's origin), or "" when
 *  it cannot be made (no page origin to resolve it against). */
export function socketUrl(baseUrl, origin) {
  try {
    const u = new URL(`${baseUrl}/v1/socket`, origin || undefined);
    if (u.protocol !== "http:" && u.protocol !== "https:") return "";
    u.protocol = u.protocol === "https:" ? "wss:" : "ws:";
    return u.href;
  } catch {
    return "";
  }
}

export class LeaseSocket {
  /** url: socketUrl's; WebSocket: the browser's constructor; clock: now() and timers. */
  constructor({ url, WebSocket, clock }) {
    this._url = url;
    this._WebSocket = WebSocket;
    this._clock = clock;
    this._ws = null;
    this._opening = null; // the promise of the socket being opened
    this._giveUpOpening = null; // rejects it
    this._token = null; // the access token of the last auth message sent on this socket
    this._pending = new Map(); // id → {resolve, reject}
    this._nextId = 1;
    this._retryAt = 0; // no socket is tried before then
    this._failures = 0; // sockets in a row that could not open, answer in time, or refused the token
    this._suspended = false; // between suspend() and resume()
  }

  /** Whether calls may try the socket now. */
  usable() {
    return Boolean(this._url && this._WebSocket) && !this._suspended && this._clock.now() >= this._retryAt;
  }

  /** The page is left (pagehide): the socket is closed, and no call opens another until resume()
   *  (pageshow): a call still on its way goes over HTTP, and a page with an open WebSocket would
   *  not be kept in the back/forward cache. */
  suspend() {
    this._suspended = true;
    this.close();
  }

  resume() {
    this._suspended = false;
  }

  /** Makes the call op of session sid with body and the access token: resolves {status, body,
   *  retryAfterMs} as the server answered it (an error status included); rejects with
   *  SocketFailed when the socket did not answer within budgetMs (it did not open, closed,
   *  refused the token, or is stalled), or with signal's reason when signal aborted first.
   *  Nothing else. A socket that did not open or answer in time is given up: HTTP carries the
   *  calls for a while. */
  async call(op, sid, body, token, signal, budgetMs) {
    let onAbort = () => {};
    let timer = null;
    const ended = new Promise((_, reject) => {
      onAbort = () => reject(signal.reason);
      if (signal?.aborted) onAbort();
      else signal?.addEventListener("abort", onAbort, { once: true });
      timer = this._clock.setTimeout(() => {
        this._failed();
        reject(new SocketFailed(`the lease socket did not answer within ${budgetMs} ms`));
      }, budgetMs);
    });
    try {
      const ws = await Promise.race([this._open(), ended]);
      const answers = [];
      if (this._token !== token) {
        this._token = token;
        answers.push(this._send(ws, { op: "auth", token }).then((a) => {
          // Refused, the call's answer is never read: HTTP makes it. An expired token (401) is
          // replaced by the next attempt's fresh one, which a new socket may carry at once.
          if (a.status === 401) this.close();
          else if (a.status !== 200) this._failed();
        }));
      }
      const answer = this._send(ws, { op, sid, body });
      answers.push(answer);
      await Promise.race([Promise.all(answers), ended]);
      return await answer;
    } catch (e) {
      if (signal?.aborted) {
        this.close(); // a call it did not answer in time: it is stalled
        throw signal.reason;
      }
      throw e instanceof SocketFailed ? e : new SocketFailed(`the lease socket failed: ${e?.message ?? e}`);
    } finally {
      this._clock.clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
    }
  }

  /** Closes the socket (the page is frozen or left, or the client stopped): the calls waiting
   *  fail with SocketFailed, and the next call opens another. */
  close() {
    const ws = this._ws;
    this._ws = null;
    this._opening = null;
    this._giveUpOpening?.();
    this._giveUpOpening = null;
    this._token = null;
    for (const p of this._pending.values()) p.reject(new SocketFailed("the lease socket was closed"));
    this._pending.clear();
    try {
      ws?.close(1000);
    } catch {}
  }

  /** The socket could not open, or refused the token for another reason than its expiry: HTTP
   *  carries the calls for a while. */
  _failed() {
    this._failures++;
    this._retryAt = this._clock.now() + Math.min(SOCKET_RETRY_MAX_MS, SOCKET_RETRY_MS * 2 ** (this._failures - 1));
    this.close();
  }

  _send(ws, message) {
    const id = this._nextId++;
    return new Promise((resolve, reject) => {
      this._pending.set(id, { resolve, reject });
      try {
        ws.send(JSON.stringify({ id, ...message }));
      } catch (e) {
        this._pending.delete(id);
        reject(new SocketFailed(`the lease socket could not send: ${e?.message ?? e}`));
      }
    });
  }

  /** The open socket: resolves once it is open; rejects with SocketFailed when it cannot be made,
   *  or errs or closes before it opens (refused, no server, a CSP that forbids it), and when it is
   *  closed meanwhile. */
  _open() {
    if (this._ws && this._ws.readyState === 1) return Promise.resolve(this._ws);
    if (this._opening) return this._opening;
    if (this._ws) this.close(); // closing, its close not yet told: its calls fail now
    let ws;
    try {
      ws = new this._WebSocket(this._url);
    } catch (e) {
      this._failed();
      return Promise.reject(new SocketFailed(`the lease socket could not be made: ${e?.message ?? e}`));
    }
    this._ws = ws;
    const opening = new Promise((resolve, reject) => {
      this._giveUpOpening = () => reject(new SocketFailed("the lease socket was closed before it opened"));
      ws.onopen = () => {
        if (this._ws !== ws) return;
        this._opening = null;
        this._giveUpOpening = null;
        resolve(ws);
      };
      // A socket that errs or closes before it opens fails, and HTTP carries the calls for a
      // while (a socket refused by the page's CSP errs and may never tell its close); one that
      // was open is replaced by the next call's (idle, shutdown, the network).
      const ended = () => {
        if (this._ws !== ws) return;
        if (this._opening) this._failed();
        else this.close();
      };
      ws.onerror = ended;
      ws.onclose = ended;
    });
    opening.catch(() => {}); // (a caller that gave up does not await it)
    ws.onmessage = (e) => {
      if (this._ws !== ws) return;
      let a = null;
      try {
        a = JSON.parse(e.data);
      } catch {}
      const p = a && this._pending.get(a.id);
      if (!p) {
        // An answer to a message the server could not read, or not an answer: not this client's.
        if (!a || a.id === null) this._failed();
        return; // (an answer to a call given up on: its id is gone)
      }
      this._pending.delete(a.id);
      this._failures = 0; // it answers: the next failure waits a minute again
      p.resolve({ status: a.status, body: a.body ?? null, retryAfterMs: typeof a.retryAfterMs === "number" ? a.retryAfterMs : null });
    };
    this._opening = opening;
    return opening;
  }
}
