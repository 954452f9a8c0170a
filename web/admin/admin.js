// The tablease admin console: a plain ES module, no build step, no dependencies.
//
// It calls the admin API of the server that serves it (same origin) with an access token of
// scope lease:admin. The token lives in sessionStorage (this tab only, gone with the tab) and is
// never put in a URL. Every value from the server reaches the page through textContent, never as
// HTML. There is no event stream for admins, so the lists are polled every 2 seconds.

const TOKEN_KEY = 'tablease.adminToken';
const DEV_KEY = 'tablease.adminTokenFromDev'; // "1" while the stored token came from /dev/token
const POLL_MS = 2000;
const TIMEOUT_MS = 10000; // a request the server has not answered by then fails (TIMEOUT)
const TICK_MS = 500;
const PAGE_LIMIT = 50;
const ID_RE = /^[A-Za-z0-9._:@|-]{1,128}$/;

const $ = (sel) => document.querySelector(sel);

const state = {
  token: '',
  tokenGen: 0, // +1 at every change of token: a load's answer under another token is dropped
  tokenShown: null, // {how, info, expired}: what the token line says; tick() says it again when the token expires
  authFailed: false, // the server refused the token: polling waits for a new one
  leaseSub: '', // the user filter of the lease list
  leaseCursor: '', // the cursor of the page shown ('' = first page)
  leaseNext: null,
  leaseRows: new Map(), // "sub|sid" → {tr, lease, deadline}
  auditSub: '',
  auditSid: '',
  auditNext: null,
  auditPaged: false, // older records were loaded: polling leaves the log alone
  auditGen: 0, // +1 at every fresh start of the log (resetAudit): an older page asked for before is dropped
  revokeTarget: null, // {sub, sid, opener}
  inFlight: false, // a load of the lists is on its way (refreshAll)
  queued: null, // the options of a load asked for meanwhile: it runs next
  lastStatus: '',
  blockCapped: false, // the block durations offered are those the server allows (capBlockOptions)
};

// ApiError is an error answer of the server, {error: {code, message, details}}.
class ApiError extends Error {
  constructor(code, message, status, details) {
    super(message);
    this.code = code;
    this.status = status;
    this.details = details || {};
  }
  toString() {
    return `${this.code}: ${this.message}`;
  }
}

async function api(method, path, body, requestId) {
  if (!state.token) throw new ApiError('NO_TOKEN', 'no admin token: enter one', 0);
  const headers = { Accept: 'application/json', Authorization: `Bearer ${state.token}` };
  if (requestId) headers['X-Request-ID'] = requestId;
  const init = { method, headers, cache: 'no-store', credentials: 'omit', referrerPolicy: 'no-referrer',
    signal: AbortSignal.timeout(TIMEOUT_MS) };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let res;
  try {
    res = await fetch(path, init);
  } catch (e) {
    if (e.name === 'TimeoutError') throw new ApiError('TIMEOUT', `the server did not answer within ${TIMEOUT_MS / 1000} s`, 0);
    throw new ApiError('NETWORK', `cannot reach the server (${e.message})`, 0);
  }
  let data = null;
  try {
    data = await res.json();
  } catch {
    // not JSON: handled below
  }
  if (!res.ok) {
    const err = data && data.error;
    if (res.status === 401 || res.status === 403) state.authFailed = true;
    throw new ApiError(err?.code || `HTTP_${res.status}`, err?.message || `the server answered ${res.status}`, res.status, err?.details);
  }
  if (data === null) throw new ApiError('BAD_ANSWER', 'the server answered something that is not JSON', res.status);
  return data;
}

const enc = encodeURIComponent;

function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== '' && v !== null && v !== undefined) q.set(k, String(v));
  const s = q.toString();
  return s ? `?${s}` : '';
}

// --- status --------------------------------------------------------------------------------

function setStatus(text, kind = 'info') {
  const el = $('#status');
  if (text === state.lastStatus && el.dataset.kind === kind) return; // polling must not repeat announcements
  state.lastStatus = text;
  el.dataset.kind = kind;
  el.textContent = text;
}

// reportError says why a call failed. A load's failure ('error') is replaced by the next load that
// succeeds; an action's ('failed': a lookup, older records) stays until the next message.
function reportError(what, err, kind = 'error') {
  const msg = err instanceof ApiError ? err.toString() : String(err);
  let hint = '';
  if (err instanceof ApiError && err.status === 401) hint = ' Enter a valid admin token.';
  if (err instanceof ApiError && err.status === 403) hint = ' An admin token needs the scope lease:admin and no sid claim.';
  if (err instanceof ApiError && err.status === 404) hint = ' This server does not serve the admin API (its lease engine offers no admin operations).';
  setStatus(`${what} failed — ${msg}.${hint}`, kind);
}

// --- formatting ----------------------------------------------------------------------------

function fmtLeft(ms) {
  if (ms <= 0) return 'expired';
  const s = Math.ceil(ms / 1000);
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${String(s % 60).padStart(2, '0')} s`;
  return `${Math.floor(m / 60)} h ${String(m % 60).padStart(2, '0')} min`;
}

// fmtSpan is a duration of whole seconds, minutes or hours in words: "90 seconds", "10 minutes".
function fmtSpan(ms) {
  const s = Math.floor(ms / 1000);
  const [n, unit] = s % 3600 === 0 ? [s / 3600, 'hour'] : s % 60 === 0 ? [s / 60, 'minute'] : [s, 'second'];
  return `${n} ${unit}${n === 1 ? '' : 's'}`;
}

function fmtTime(iso) {
  if (!iso) return '';
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : d.toLocaleString();
}

function timeEl(iso) {
  const t = document.createElement('time');
  if (iso) {
    t.dateTime = iso;
    t.textContent = fmtTime(iso);
  }
  return t;
}

// blockedBadge is the "Blocked until …" badge of a lease whose session an admin blocked (the lease
// object's blockedUntil); null when no block is in force.
function blockedBadge(l) {
  if (!l || !l.blockedUntil) return null;
  const span = document.createElement('span');
  span.className = 'badge blocked';
  span.dataset.blockedUntil = l.blockedUntil;
  span.append('Blocked until ', timeEl(l.blockedUntil));
  return span;
}

function cell(content) {
  const td = document.createElement('td');
  if (content instanceof Node) td.append(content);
  else td.textContent = content ?? '';
  return td;
}

// keyOf names a session of a user: "/" is in no identifier ("|" is, so "a|b" / "c" and "a" / "b|c"
// would run together).
function keyOf(sub, sid) {
  return `${sub}/${sid}`;
}

// --- token ---------------------------------------------------------------------------------

function tokenSubject(token) {
  try {
    const part = token.split('.')[1].replace(/-/g, '+').replace(/_/g, '/');
    const claims = JSON.parse(atob(part));
    // scope is space-separated or a list of strings (README, HTTP API).
    const scopes = Array.isArray(claims.scope) ? claims.scope.map(String) : String(claims.scope || '').split(/\s+/);
    return { sub: claims.sub, exp: claims.exp, scopes, sid: claims.sid !== undefined };
  } catch {
    return null;
  }
}

// useToken makes token the one the page calls with and keeps it in sessionStorage; fromDev marks a
// token of /dev/token, which the page may replace with a new one (devTokenAgain), where it never
// replaces a pasted one.
function useToken(token, how, fromDev = false) {
  state.token = token;
  state.authFailed = false;
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
  if (token && fromDev) sessionStorage.setItem(DEV_KEY, '1');
  else sessionStorage.removeItem(DEV_KEY);
  state.tokenGen++;
  state.queued = null;
  state.tokenShown = { how, info: token ? tokenSubject(token) : null, expired: false };
  showTokenState();
}

// showTokenState says which token the page uses and until when; tick() calls it again once the
// token has expired.
function showTokenState() {
  const { how, info } = state.tokenShown;
  const el = $('#token-state');
  if (!state.token) {
    el.textContent = 'No token yet.';
  } else if (info) {
    const expired = typeof info.exp === 'number' && info.exp * 1000 <= Date.now();
    state.tokenShown.expired = expired;
    const exp = info.exp ? `, ${expired ? 'expired' : 'expires'} ${new Date(info.exp * 1000).toLocaleTimeString()}` : '';
    // What the server will refuse on every admin route (403), said before the first call.
    const unfit = !info.scopes.includes('lease:admin') ? ' — it lacks the scope lease:admin'
      : info.sid ? ' — it has a sid claim, which admin routes refuse' : '';
    el.textContent = `${how} a token for “${info.sub}”${exp}${unfit}.`;
  } else {
    el.textContent = `${how} a token that is not a JWT; the server will judge it.`;
  }
}

// loopbackPage reports whether the page was reached by a loopback name (localhost, a name under
// .localhost, a loopback address): the only names a dev-mode server answers /dev/token for
// (loopbackHost in api/dev.go). Under any other name the console does not ask, so that a deployment's
// console makes no request that can only fail.
function loopbackPage() {
  const host = location.hostname.toLowerCase().replace(/\.$/, '');
  return host === 'localhost' || host.endsWith('.localhost') || host === '[::1]' ||
    /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host);
}

async function devToken() {
  if (!loopbackPage()) return '';
  try {
    const res = await fetch('/dev/token?sub=admin&scope=lease:admin', { cache: 'no-store', credentials: 'omit' });
    if (!res.ok) return '';
    const data = await res.json();
    return typeof data.token === 'string' ? data.token : '';
  } catch {
    return '';
  }
}

// devTokenAgain replaces a token of /dev/token that the server refused (a dev server started
// again makes a new secret) or that has expired with a new one, and reports whether it did. A
// pasted token is never replaced.
async function devTokenAgain() {
  if (sessionStorage.getItem(DEV_KEY) !== '1') return false;
  const token = await devToken();
  if (!token || token === state.token) return false;
  useToken(token, 'Dev mode: using', true);
  $('#token').value = token;
  return true;
}

// --- leases --------------------------------------------------------------------------------

function leaseRow(l) {
  const tr = document.createElement('tr');
  tr.dataset.key = keyOf(l.sub, l.sessionId);
  for (let i = 0; i < 6; i++) tr.append(cell(''));
  const btn = document.createElement('button');
  btn.type = 'button';
  btn.textContent = 'Revoke…';
  btn.dataset.action = 'revoke';
  btn.dataset.sub = l.sub;
  btn.dataset.sid = l.sessionId;
  btn.setAttribute('aria-label', `Revoke the lease of ${l.sub} / ${l.sessionId}`);
  tr.append(cell(btn));
  return tr;
}

function fillLeaseRow(tr, l) {
  const c = tr.cells;
  c[0].textContent = l.sub;
  c[1].textContent = l.sessionId;
  c[2].textContent = l.holder ? l.holder.tabId + (l.holder.hidden ? ' (hidden)' : '') : '—';
  c[3].textContent = l.holder ? l.holder.label : '';
  c[4].textContent = String(l.epoch);
}

function renderLeases(leases, fetchedAt) {
  const tbody = $('#leases tbody');
  const keys = leases.map((l) => keyOf(l.sub, l.sessionId));
  const same = keys.length === state.leaseRows.size && keys.every((k, i) => tbody.rows[i]?.dataset.key === k);
  const focusRow = document.activeElement?.closest?.('#leases tr');
  const focusKey = focusRow?.dataset.key;
  const focusIndex = focusRow ? [...tbody.rows].indexOf(focusRow) : -1;
  const rows = new Map();
  leases.forEach((l, i) => {
    const entry = state.leaseRows.get(keys[i]) || { tr: leaseRow(l) };
    entry.lease = l;
    entry.deadline = fetchedAt + l.remainingMs;
    fillLeaseRow(entry.tr, l);
    rows.set(keys[i], entry);
  });
  state.leaseRows = rows;
  if (!same) {
    tbody.replaceChildren(...[...rows.values()].map((e) => e.tr));
    if (focusKey) {
      // Focus stays on its row; when the row left the list (a revoke), it goes to the row now in its
      // place (or the last), so that the list keeps its place, and to the heading when none is left.
      const entries = [...rows.values()];
      const stay = rows.get(focusKey) || entries[Math.min(focusIndex, entries.length - 1)];
      (stay?.tr.querySelector('button') || $('#leases-heading')).focus();
    }
  }
  tick();
  const who = state.leaseSub ? ` of “${state.leaseSub}”` : '';
  const page = state.leaseCursor ? ' (a later page)' : '';
  $('#leases-summary').textContent = leases.length === 0
    ? `No active leases${who}${page}.`
    : `${leases.length} active lease${leases.length === 1 ? '' : 's'}${who}${page}${state.leaseNext ? '; more on the next page' : ''}.`;
  syncPagers();
}

// syncPagers enables the paging buttons that lead somewhere, none while the lists are stale.
function syncPagers() {
  const stale = document.body.hasAttribute('data-stale');
  document.querySelector('[data-action="next-page"]').disabled = stale || !state.leaseNext;
  document.querySelector('[data-action="first-page"]').disabled = stale || !state.leaseCursor;
  document.querySelector('[data-action="audit-more"]').disabled = stale || !state.auditNext;
}

// tick counts down the time left of every listed lease on this tab's monotonic clock.
function tick() {
  const exp = state.tokenShown?.info?.exp;
  if (state.token && typeof exp === 'number' && !state.tokenShown.expired && exp * 1000 <= Date.now()) showTokenState();
  const now = performance.now();
  for (const { tr, deadline } of state.leaseRows.values()) {
    const text = fmtLeft(deadline - now);
    if (tr.cells[5].textContent !== text) tr.cells[5].textContent = text;
    tr.classList.toggle('expired', deadline <= now);
  }
}


// --- audit ---------------------------------------------------------------------------------

function actorOf(r) {
  // An admin's request id is the one its log lines carry: it leads from the record to them.
  if (r.admin) return r.requestId ? `admin ${r.admin} (request ${r.requestId})` : `admin ${r.admin}`;
  if (r.tabId) return `tab ${r.tabId}`;
  return r.action === 'expire' ? '(expiry)' : '—';
}

function auditRow(r) {
  const tr = document.createElement('tr');
  tr.dataset.id = r.id;
  tr.dataset.action = r.action;
  tr.append(
    cell(timeEl(r.at)),
    cell(r.action),
    cell(r.sub),
    cell(r.sessionId),
    cell(String(r.epoch)),
    cell(actorOf(r)),
    cell(r.previous ? `${r.previous.tabId} @ ${r.previous.epoch}` : ''),
    cell(r.reason || ''),
    cell(timeEl(r.until)),
  );
  return tr;
}

function renderAudit(records, append) {
  const tbody = $('#audit tbody');
  const rows = records.map(auditRow);
  if (append) tbody.append(...rows);
  else tbody.replaceChildren(...rows);
  const n = tbody.rows.length;
  const who = [state.auditSub, state.auditSid].filter(Boolean).join(' / ');
  $('#audit-summary').textContent = `${n === 0 ? 'No' : n} audit record${n === 1 ? '' : 's'}${who ? ` for ${who}` : ''}, newest first` +
    (state.auditPaged ? '; with older records shown, the log is not refreshed: Refresh now shows the newest.' : '.');
  syncPagers();
}

// --- refresh -------------------------------------------------------------------------------

// leaseListQuery is the query of the lease list the page shows: its user filter and page.
function leaseListQuery() {
  return query({ sub: state.leaseSub, cursor: state.leaseCursor, limit: PAGE_LIMIT });
}

// refreshAll loads the lists: the active leases and the audit log's first page, or with olderAudit
// its next older page, appended. Loads run one at a time: one asked for while another is on its way
// (a new token, filter or page, a revoke done, older records) runs once that one ends, since that
// one went out with what the page held before, and what it brings back is shown only if the token,
// filters and pages it was sent with are still the page's.
async function refreshAll({ announce = false, retried = false, olderAudit = false } = {}) {
  if (!state.token) return;
  if (state.inFlight) {
    const q = state.queued;
    state.queued = { announce: announce || Boolean(q?.announce), olderAudit: olderAudit || Boolean(q?.olderAudit) };
    return;
  }
  state.inFlight = true;
  const gen = state.tokenGen;
  const leaseQuery = leaseListQuery();
  const older = olderAudit && state.auditNext;
  const auditQuery = !older && state.auditPaged ? null
    : query({ sub: state.auditSub, sid: state.auditSid, cursor: older || '', limit: PAGE_LIMIT });
  const auditGen = state.auditGen;
  let again = false;
  try {
    if (!state.blockCapped) capBlockOptions((await api('GET', '/v1/admin/limits')).maxBlockMs);
    if (gen !== state.tokenGen) return;
    const leases = await api('GET', `/v1/admin/leases${leaseQuery}`);
    if (gen !== state.tokenGen) return;
    let audit = null;
    let auditErr = null;
    if (auditQuery) {
      try {
        audit = await api('GET', `/v1/admin/audit${auditQuery}`);
      } catch (err) {
        if (!older) throw err;
        auditErr = err; // older records failed: the lists are current, the click was not answered
      }
      if (gen !== state.tokenGen) return;
    }
    if (leaseQuery === leaseListQuery()) { // the filter and page it was for are still the page's
      state.leaseNext = leases.nextCursor || null;
      renderLeases(leases.leases || [], performance.now());
    }
    if (audit && auditGen === state.auditGen && (older ? older === state.auditNext : !state.auditPaged)) {
      state.auditNext = audit.nextCursor || null;
      if (older) state.auditPaged = true;
      renderAudit(audit.records || [], Boolean(older));
    }
    setStale(false);
    const t = state.revokeTarget;
    if (t && !t.sending && $('#revoke-dialog').open) {
      try {
        const l = await lookUpLease(t.sub, t.sid);
        if (gen === state.tokenGen && state.revokeTarget === t) noteHolderChange(l);
      } catch {
        // the dialog keeps what it said; the next refresh reads the lease again
      }
    }
    if (auditErr) reportError('Loading older records', auditErr, 'failed');
    else if (announce || $('#status').dataset.kind === 'error') setStatus(`Up to date at ${new Date().toLocaleTimeString()}.`);
  } catch (err) {
    if (gen !== state.tokenGen) return;
    again = !retried && err instanceof ApiError && err.status === 401 && await devTokenAgain();
    if (!again) {
      setStale(true);
      reportError('Loading', err);
    }
  } finally {
    state.inFlight = false;
    if (again) {
      refreshAll({ announce: true, retried: true });
    } else if (state.queued) {
      const next = state.queued;
      state.queued = null;
      refreshAll(next);
    }
  }
}

// resetAudit starts the audit log afresh from its newest records (its filters changed, the admin
// asked for the newest, a revoke was made): an older page on its way is dropped.
function resetAudit() {
  state.auditPaged = false;
  state.auditGen++;
}

// capBlockOptions leaves the block durations the server allows (TABLEASE_ADMIN_MAX_BLOCK, from
// GET /v1/admin/limits), and offers that maximum itself when it is none of them.
function capBlockOptions(maxMs) {
  if (!Number.isSafeInteger(maxMs) || maxMs <= 0) return;
  const select = $('#revoke-block');
  for (const o of [...select.options]) if (Number(o.value) > maxMs) o.remove();
  if (![...select.options].some((o) => Number(o.value) === maxMs)) {
    select.append(new Option(`${fmtSpan(maxMs)} (the longest allowed)`, String(maxMs)));
  }
  state.blockCapped = true;
}

// setStale marks what the page shows as not current (a load failed): the lists are greyed and
// their buttons disabled until a load succeeds.
function setStale(stale) {
  document.body.toggleAttribute('data-stale', stale);
  for (const b of document.querySelectorAll('#leases [data-action="revoke"]')) b.disabled = stale;
  syncPagers();
}

function poll() {
  if (!$('#live').checked || state.authFailed || document.visibilityState !== 'visible' || state.inFlight) return;
  refreshAll();
}

// --- one session ---------------------------------------------------------------------------

// showSessionLease shows the lease of one session, as the "Revoke or block a session" form looked it
// up or as a revoke left it. A blocked session is free, so the list of active leases never shows
// it: this is where its block shows.
function showSessionLease(sub, sid, l) {
  const el = $('#session-lease');
  const held = l.held && l.holder
    ? `held by tab ${l.holder.tabId} at epoch ${l.epoch}`
    : `free (last epoch ${l.epoch})`;
  el.replaceChildren(`${sub} / ${sid}: ${held}. `, blockedBadge(l) || 'Not blocked.');
  el.dataset.key = keyOf(sub, sid);
  el.hidden = false;
}

async function lookUpLease(sub, sid) {
  return api('GET', `/v1/admin/users/${enc(sub)}/sessions/${enc(sid)}/lease`);
}

// --- revoke --------------------------------------------------------------------------------

// newRequestId names one revoke: 32 hex digits (crypto.randomUUID needs a secure context, which a
// console served over plain HTTP under a non-loopback name is not).
function newRequestId() {
  return Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, '0')).join('');
}

function openRevoke(sub, sid, opener, { lease = null, block = 0, lookup = false } = {}) {
  // One dialog is one revoke: confirming again after a failure sends the same X-Request-ID, so a
  // revoke that took effect but whose answer was lost (a timeout, a 503) is answered, not repeated.
  // uncertain: a revoke of this dialog failed in a way that may have taken effect (a timeout, a 5xx).
  state.revokeTarget = { sub, sid, opener, lookup, shown: holderText(lease), requestId: newRequestId(), sending: false, uncertain: false };
  const what = lease && lease.held && lease.holder
    ? `${sub} / ${sid}, held by tab ${lease.holder.tabId}${lease.holder.label ? ` (“${lease.holder.label}”)` : ''} at epoch ${lease.epoch}.`
    : `${sub} / ${sid}${lease ? ' (no tab holds it now: nothing will be revoked, a block still applies)' : ''}.`;
  setRevokeMode(Boolean(lease && !lease.held));
  const badge = blockedBadge(lease);
  $('#revoke-what').replaceChildren(what, ...(badge ? [' ', badge] : []));
  $('#revoke-reason').value = '';
  const select = $('#revoke-block');
  select.value = String(block);
  if (select.selectedIndex < 0) select.selectedIndex = select.options.length - 1; // over the server's maximum
  $('#revoke-error').textContent = '';
  $('#revoke-changed').textContent = '';
  const dlg = $('#revoke-dialog');
  dlg.showModal();
  $('#revoke-reason').focus();
}

// holderText names who holds a lease as the dialog shows it, to tell when a refresh finds another.
function holderText(lease) {
  return lease && lease.held && lease.holder ? `tab ${lease.holder.tabId} at epoch ${lease.epoch}` : 'no tab';
}

// setRevokeMode makes the open dialog a revoke (a tab holds the lease) or a block (none does: a
// block is all it can do).
function setRevokeMode(blockOnly) {
  state.revokeTarget.blockOnly = blockOnly;
  $('#revoke-title').textContent = blockOnly ? 'Block session' : 'Revoke lease';
  $('#revoke-effect').textContent = blockOnly
    ? 'No tab holds the lease: the block below is all this does, and the audit log records it.'
    : 'The holding tab loses control at once: its next renew or check answers LEASE_LOST, and it is told why on its event stream.';
  document.querySelector('[data-action="confirm-revoke"]').textContent = blockOnly ? 'Block' : 'Revoke';
}

// noteHolderChange follows, in the open dialog, the lease of its session as read again with each
// refresh of the lists (lease): when another tab than the dialog showed holds it, or none, the
// dialog says so and becomes a revoke or a block to match, since a revoke revokes whichever tab
// holds the lease when it arrives. After a revoke that may have taken effect (uncertain), a free
// lease is likely its doing: the dialog stays a revoke, whose retry the server answers as it
// answered the first, rather than becoming a block that would not send it.
function noteHolderChange(lease) {
  const t = state.revokeTarget;
  if (!t || t.sending || !$('#revoke-dialog').open) return;
  const now = holderText(lease);
  if (now !== t.shown && !t.uncertain) setRevokeMode(now === 'no tab');
  $('#revoke-changed').textContent = now === t.shown ? ''
    : t.uncertain && now === 'no tab'
      ? 'Changed since this dialog opened: no tab holds the lease now, maybe by the revoke that failed. ' +
        'Revoke again to retry it and have its answer.'
      : `Changed since this dialog opened: ${now === 'no tab' ? 'no tab holds the lease now' : `now held by ${now}`}. ` +
        'Confirming revokes whichever tab holds the lease when the revoke arrives.';
}

// cancelRevoke closes the dialog at the admin's word, saying what is known of its revoke.
function cancelRevoke() {
  const t = state.revokeTarget;
  closeRevoke();
  setStatus(t?.uncertain
    ? `Closed the dialog of a revoke of ${t.sub} / ${t.sid} that may have taken effect: the session's lease and the audit log tell.`
    : 'Revoke cancelled.');
}

function closeRevoke() {
  const dlg = $('#revoke-dialog');
  if (dlg.open) dlg.close();
  const t = state.revokeTarget;
  state.revokeTarget = null;
  // Give focus back to what opened the dialog: the "Revoke or block…" button, or the row's, which a
  // refresh may have replaced (renderLeases moves focus on when the row leaves the list).
  const again = t && [...document.querySelectorAll('[data-action="revoke"]')]
    .find((b) => b.dataset.sub === t.sub && b.dataset.sid === t.sid);
  const target = t?.opener?.isConnected ? t.opener : again || $('#leases-heading');
  target.focus();
}

async function confirmRevoke() {
  const t = state.revokeTarget;
  if (!t) return;
  const reason = $('#revoke-reason').value;
  const errEl = $('#revoke-error');
  if (!reason.trim()) {
    errEl.textContent = 'A reason is required.';
    $('#revoke-reason').focus();
    return;
  }
  const blockMs = Number($('#revoke-block').value) || 0;
  if (t.blockOnly && blockMs === 0) {
    errEl.textContent = 'No tab holds the lease, so there is nothing to revoke: choose how long to block new grants.';
    $('#revoke-block').focus();
    return;
  }
  const confirmBtn = document.querySelector('[data-action="confirm-revoke"]');
  const cancelBtn = document.querySelector('[data-action="cancel-revoke"]');
  confirmBtn.disabled = cancelBtn.disabled = true;
  t.sending = true;
  errEl.textContent = '';
  try {
    const body = blockMs > 0 ? { reason, blockMs } : { reason };
    const res = await api('POST', `/v1/admin/users/${enc(t.sub)}/sessions/${enc(t.sid)}/lease/revoke`, body, t.requestId);
    t.sending = false; // answered: the dialog may close
    let msg = res.revoked
      ? `Revoked the lease of ${t.sub} / ${t.sid}${res.previous ? ` (tab ${res.previous.tabId}, epoch ${res.previous.epoch})` : ''}. New epoch: ${res.epoch}.`
      : `Nothing to revoke: ${t.sub} / ${t.sid} was free (last epoch ${res.epoch}).`;
    if (res.blockedUntil) msg += ` New grants of ${t.sub} / ${t.sid} blocked until ${fmtTime(res.blockedUntil)}.`;
    setStatus(msg, res.revoked ? 'ok' : 'info');
    closeRevoke();
    resetAudit();
    if (t.lookup || res.blockedUntil || $('#session-lease').dataset.key === keyOf(t.sub, t.sid)) {
      // The session leaves the list of active leases: show where it stands, block included.
      try {
        showSessionLease(t.sub, t.sid, await lookUpLease(t.sub, t.sid));
      } catch {
        // the status already says what the revoke did; the next lookup shows the lease
      }
    }
    await refreshAll();
  } catch (err) {
    const uncertain = err instanceof ApiError && (err.code === 'TIMEOUT' || err.code === 'NETWORK' || err.status >= 500);
    t.uncertain ||= uncertain;
    errEl.textContent = `Revoke failed — ${err instanceof ApiError ? err.toString() : err}.` +
      (uncertain
        ? ` It may have taken effect: ${confirmBtn.textContent} again here to retry it; the server answers a retry as it answered the first.`
        : '');
  } finally {
    t.sending = false;
    confirmBtn.disabled = cancelBtn.disabled = false;
  }
}

// --- wiring --------------------------------------------------------------------------------

function validId(value, what) {
  if (value === '' || ID_RE.test(value)) return true;
  setStatus(`${what} must be 1–128 characters of A–Z a–z 0–9 . _ : @ | -.`, 'invalid');
  return false;
}

async function onAction(action, btn) {
  switch (action) {
    case 'forget-token':
      if (state.revokeTarget && !state.revokeTarget.sending) closeRevoke();
      useToken('', '');
      $('#token').value = '';
      state.leaseRows = new Map();
      $('#leases tbody').replaceChildren();
      $('#audit tbody').replaceChildren();
      $('#leases-summary').textContent = 'No leases loaded.';
      $('#audit-summary').textContent = 'No records loaded.';
      $('#session-lease').hidden = true;
      $('#session-lease').replaceChildren();
      delete $('#session-lease').dataset.key;
      state.leaseNext = state.auditNext = null;
      state.leaseCursor = '';
      resetAudit();
      syncPagers();
      setStatus('Token forgotten.');
      return;
    case 'clear-filter':
      $('#filter-sub').value = '';
      state.leaseSub = '';
      state.leaseCursor = '';
      return refreshAll({ announce: true });
    case 'refresh':
      state.authFailed = false;
      resetAudit(); // the newest records, which older ones shown kept out
      return refreshAll({ announce: true });
    case 'first-page':
      state.leaseCursor = '';
      return refreshAll({ announce: true });
    case 'next-page':
      if (!state.leaseNext) return;
      state.leaseCursor = state.leaseNext;
      return refreshAll({ announce: true });
    case 'revoke': {
      const entry = state.leaseRows.get(keyOf(btn.dataset.sub, btn.dataset.sid));
      openRevoke(btn.dataset.sub, btn.dataset.sid, btn, { lease: entry?.lease ? { ...entry.lease, held: true } : null });
      return;
    }
    case 'cancel-revoke':
      if (state.revokeTarget?.sending) return; // disabled meanwhile: the answer decides
      cancelRevoke();
      return;
    case 'audit-clear':
      $('#audit-sub').value = '';
      $('#audit-sid').value = '';
      state.auditSub = '';
      state.auditSid = '';
      resetAudit();
      return refreshAll({ announce: true });
    case 'audit-more':
      if (!state.auditNext) return;
      return refreshAll({ olderAudit: true });
    default:
  }
}

function wire() {
  document.addEventListener('click', (ev) => {
    const btn = ev.target.closest('button[data-action]');
    if (!btn || btn.type === 'submit') return; // submit buttons act through their form
    onAction(btn.dataset.action, btn);
  });

  $('#token-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const token = $('#token').value.trim();
    if (!token) {
      setStatus('Paste an access token with the scope lease:admin.', 'invalid');
      return;
    }
    useToken(token, 'Using');
    resetAudit();
    refreshAll({ announce: true });
  });

  $('#lease-filter').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const sub = $('#filter-sub').value.trim();
    if (!validId(sub, 'The user')) return;
    state.leaseSub = sub;
    state.leaseCursor = '';
    refreshAll({ announce: true });
  });

  $('#audit-filter').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const sub = $('#audit-sub').value.trim();
    const sid = $('#audit-sid').value.trim();
    if (!validId(sub, 'The user') || !validId(sid, 'The session')) return;
    if (sid && !sub) {
      setStatus('Filtering the audit log by session needs a user: sessions are named per user.', 'invalid');
      $('#audit-sub').focus();
      return;
    }
    state.auditSub = sub;
    state.auditSid = sid;
    resetAudit();
    refreshAll({ announce: true });
  });

  $('#block-form').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const sub = $('#block-sub').value.trim();
    const sid = $('#block-sid').value.trim();
    if (!sub || !sid || !validId(sub, 'The user') || !validId(sid, 'The session')) {
      if (!sub || !sid) setStatus('Name the user and the session.', 'invalid');
      return;
    }
    let lease = null;
    const gen = state.tokenGen;
    try {
      lease = await lookUpLease(sub, sid);
    } catch (err) {
      if (gen === state.tokenGen) reportError(`Reading the lease of ${sub} / ${sid}`, err, 'failed');
      return;
    }
    if (gen !== state.tokenGen) return; // the token changed meanwhile: the answer is not the page's
    showSessionLease(sub, sid, lease);
    openRevoke(sub, sid, ev.submitter || null, { lease, block: 300000, lookup: true });
  });

  $('#revoke-form').addEventListener('submit', (ev) => {
    ev.preventDefault(); // method=dialog would close it before the request answers
    confirmRevoke();
  });
  $('#revoke-dialog').addEventListener('cancel', (ev) => {
    if (state.revokeTarget?.sending) {
      // Escape while the revoke is on its way: it cannot be called back, so the dialog stays
      // until its answer says what it did.
      ev.preventDefault();
      $('#revoke-error').textContent = 'The revoke is on its way and cannot be called back: its answer shows here.';
      return;
    }
    // Escape: let the dialog close, then put focus back.
    setTimeout(cancelRevoke, 0);
  });
  $('#revoke-dialog').addEventListener('close', () => {
    // A browser may close a modal dialog at a second Escape whatever its cancel handler says (its
    // close watcher asks a user activation in between): a revoke on its way keeps it open.
    if (state.revokeTarget?.sending) $('#revoke-dialog').showModal();
  });

  document.addEventListener('visibilitychange', () => {
    if (document.visibilityState === 'visible') poll();
  });
  setInterval(poll, POLL_MS);
  setInterval(tick, TICK_MS);
}

async function start() {
  wire();
  let token = sessionStorage.getItem(TOKEN_KEY) || '';
  let fromDev = token !== '' && sessionStorage.getItem(DEV_KEY) === '1';
  const expired = fromDev && (tokenSubject(token)?.exp ?? Infinity) * 1000 <= Date.now();
  if (!token || expired) {
    const dev = await devToken(); // only a dev-mode server on a loopback name answers it
    if (dev) {
      token = dev;
      fromDev = true;
    }
  }
  if (token) {
    useToken(token, fromDev ? 'Dev mode: using' : 'Using', fromDev);
    $('#token').value = token;
    await refreshAll({ announce: true });
  } else {
    setStatus('Enter an admin access token to begin.');
    $('#token').focus();
  }
}

start();
