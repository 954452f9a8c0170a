// Types of tablease.js, the browser client of tablease (docs/browser-client.md). Checked against
// the modules by web/sdk/typecheck/ (scripts/test runs it).

export type Role = "owner" | "viewer";

/** The holder of a lease, as the server describes it. */
export interface Holder {
  tabId: string;
  label: string;
  hidden: boolean;
}

/** The lease object of the HTTP API (DESIGN §3). */
export interface LeaseObject {
  sessionId: string;
  held: boolean;
  holder: Holder | null;
  epoch: number;
  grantedAt: string | null;
  expiresAt: string | null;
  ttlMs: number;
  remainingMs: number;
  renewAfterMs: number;
  transitions: number;
  /** When an admin's block of the session ends (RFC 3339); null when no block is in force. */
  blockedUntil: string | null;
  role?: Role;
  /** Only in answers to the holder (acquire, renew). */
  token?: string;
  /** A handoff in progress; absent when there is none (DESIGN §3). */
  handoff?: {
    state: "requested" | "reserved";
    requester: Holder;
    until: string;
    remainingMs: number;
  };
}

/** A tab of the session's list (GET …/tabs, the `tabs` events, a snapshot's `tabs`). */
export interface ListedTab {
  tabId: string;
  label: string;
  hidden: boolean;
  connectedAt: string;
}

/** The first event of a stream: the lease as GET …/lease?tabId= answers it, the tabs connected,
 *  whether a replay follows, and the version of the tool catalog served (once read). */
export interface SnapshotEvent extends LeaseObject {
  type: "snapshot";
  tabs: ListedTab[];
  resumed: boolean;
  catalogVersion?: string;
  /** The interval of the server's keepalive comments (TABLEASE_STREAM_KEEPALIVE). */
  keepaliveMs: number;
  id?: string;
}

/** A `tabs` event: a tab joined, left, or changed its label or hidden flag (`tab` as now
 *  listed); `reason: "timeout"` when it left because its entry expired. */
export interface TabsEvent {
  type: "joined" | "left" | "changed";
  sessionId: string;
  tab: ListedTab;
  reason?: "timeout";
  at: string;
}

/** What a tab knows about its session's lease (TabLease.lease). */
export interface LeaseView {
  sessionId: string;
  tabId: string;
  held: boolean;
  holder: Holder | null;
  epoch: number;
  ttlMs: number | null;
  renewAfterMs: number | null;
  /** Owner: time left by the local (fail-closed) deadline. Viewer: the holder's time left as last
   *  learnt, or null when unknown. */
  remainingMs: number | null;
  transitions: number | null;
  role: Role;
  /** The lease token, only while this tab is the owner. */
  token: string | null;
  streamLive: boolean;
}

/** A `lease` event of the event stream (DESIGN §3). */
export interface LeaseEvent {
  type: "granted" | "released" | "expired" | "taken_over" | "revoked" | "handoff_requested" | "updated";
  sessionId: string;
  epoch: number;
  holder: Holder | null;
  previous: { tabId: string; epoch: number } | null;
  reason: string;
  at: string;
  /** handoff_requested: the tab that asked; released or expired: the tab the lease is now reserved
   *  for, when a handoff request reserved it (DESIGN §3, Event stream). */
  requester?: Holder | null;
  /** The SSE id of the event. */
  id?: string;
}

/** The error object a guard (and a tool) returns when this tab may not mutate. */
export interface NotLeaseOwnerError {
  error: {
    code: "NOT_LEASE_OWNER";
    message: string;
    retryable: false;
    details: {
      sessionId: string;
      tabId: string;
      /** viewer: another tab holds it · lost: it was taken, released or expired · expired: the
       *  local deadline passed without a confirmed renew · unconfirmed: after a stream drop or a
       *  freeze, no renew has confirmed yet · handoff: this tab is handing over · stopped. */
      reason: "viewer" | "lost" | "expired" | "unconfirmed" | "handoff" | "stopped";
      holder: { tabId: string; label: string } | null;
      epoch: number | null;
      /** Set when the handler was running as this tab's control ended: it may have acted. */
      mayHaveActed?: true;
    };
  };
}

export declare const NOT_LEASE_OWNER: "NOT_LEASE_OWNER";

/** What a guarded handler receives as its second argument. */
export interface LeaseContext {
  /** The fencing token of this grant: send it to the backend with every write. */
  epoch: number;
  /** The signed lease token (send it as the `Tablease-Lease` header): the latest renew's while the
   *  period of ownership lasts, the last one it had after. */
  token: string;
  tabId: string;
  sessionId: string;
  /** Aborts when this tab's ownership ends (taken over, expired, released…). */
  signal: AbortSignal;
  /** `{"Tablease-Lease": token}`, ready for fetch(). */
  headers: Record<string, string>;
}

export interface Clock {
  /** Monotonic milliseconds (performance.now()). */
  now(): number;
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(id: unknown): void;
}

export interface TabLeaseOptions {
  /** Origin (and path prefix) of tablease, e.g. "https://lease.example.com"; "" = this origin. */
  baseUrl?: string;
  /** The agent session: 1–128 characters of [A-Za-z0-9._:@|-]. */
  sessionId: string;
  /** Returns the access token (JWT). Called before each request; {refresh: true} after a 401;
   *  signal aborts when the client gives up on the call (requestTimeoutMs).
   *  When it throws, answers anything but a non-empty string, or takes longer than
   *  requestTimeoutMs, the request fails with TabLeaseError UNAUTHENTICATED, retryable (the thrown
   *  value as its cause): a renew keeps the lease until its deadline and retries, as after a
   *  network error. A token of another user (`sub`) than the first one's is not sent: the request
   *  fails with TabLeaseError USER_CHANGED, and the tab gives up the previous user's lease and
   *  stream and starts over as the new user (an `error` event USER_CHANGED). */
  getToken: (opts: { refresh?: boolean; signal?: AbortSignal }) => string | Promise<string>;
  /** Shown to other tabs ("Events — /events/evt-1"); sent as its first 200 printable characters
   *  (code points; tabs and line breaks as spaces, other characters that are not printable left out). */
  label?: string | (() => string);
  /** TTL asked for while visible; default: the server's. */
  ttlMs?: number;
  /** TTL asked for while hidden (with hidden: true). Default 150000. */
  hiddenTtlMs?: number;
  /** Subtracted from remainingMs for the local deadline (at most a quarter of the TTL). Default 1500. */
  marginMs?: number;
  /** Take the lease by itself when it is free (on start and when it frees). Default true. */
  autoAcquire?: boolean;
  /** "auto": release at the next safe point when asked for a handoff; "manual": only emit the
   *  `handoff` event ({phase: "requested"}) and let the app call release(). Default "auto". */
  handoff?: "auto" | "manual";
  /** How long requestHandoff() waits by default. Default 15000. */
  handoffTimeoutMs?: number;
  /** How long a holder asked to hand over waits for its running guarded handlers before it
   *  aborts them and releases (if a renew shows the request still stands). Default 10000. */
  handoffGraceMs?: number;
  /** A hidden tab waits this long before taking a free lease. Default 3000. */
  hiddenAcquireDelayMs?: number;
  /** A viewer re-reads the lease this often while its stream is down, each read up to a fifth of
   *  it later (so that tabs opened together spread their reads); a hidden viewer that cannot share
   *  the browser's stream gives its own up and reads so (docs/browser-client.md). Default 10000. */
  viewerPollMs?: number;
  backoffBaseMs?: number;
  backoffMaxMs?: number;
  /** getToken, and then each request with its answer, get this long; a request not answered by
   *  then is aborted and fails as NETWORK (retried like one); a renew waits at most half the
   *  time left before its deadline (at least 1000). Default 10000. */
  requestTimeoutMs?: number;
  /** "fetch" (default): GET …/events with the Authorization header and Last-Event-ID;
   *  "ticket": POST …/events/ticket then EventSource(…?ticket=); false: no stream. */
  stream?: "fetch" | "ticket" | false;
  /** Renew the lease and check it over a lease socket (GET /v1/socket, one WebSocket per
   *  TabLease), each call a third cheaper for the server than an HTTP request; HTTP whenever the
   *  socket cannot (it does not open, closes, or the browser has no WebSocket). The socket is
   *  closed when the page is left (pagehide) and on stop(). false: HTTP only. Default true. */
  socket?: boolean;
  /** Share one stream per browser (Web Locks + BroadcastChannel). Default true. */
  shareStream?: boolean;
  /** Reconnect when the stream sends nothing for this long. Default: the server's keepalive
   *  interval (the snapshot's keepaliveMs) and 5 s or a third of it more, whichever is longer
   *  (20000 at the server's default); 45000 until the snapshot came. */
  streamIdleMs?: number;
  /** Wait before reconnecting when the server has no stream (404). Default 60000. */
  streamNotFoundMs?: number;
  /** A stream carrier tab that leaves a follower's ping unanswered (frozen, hung) and has been
   *  silent this long is taken over by the follower, whose lease needs a confirmation meanwhile.
   *  Default 1000. */
  carrierTimeoutMs?: number;
  /** List this tab with PUT …/tabs/{tabId} (refreshed, DELETE on pagehide). Default true. */
  presence?: boolean;
  /** The page's origin, named in the error of a request that got no answer. Default
   *  location.origin. */
  origin?: string;
  /** A fixed tab id (tests). Default: random per TabLease, in memory only. */
  tabId?: string;
  // Injection points (tests, unusual environments).
  fetch?: typeof fetch;
  clock?: Clock;
  random?: () => number;
  document?: Document | EventTarget | null;
  window?: Window | EventTarget | null;
  locks?: LockManager;
  BroadcastChannel?: typeof BroadcastChannel;
  EventSource?: typeof EventSource;
  WebSocket?: typeof WebSocket;
  hubs?: Map<string, StreamHub>;
}

export interface RoleChangeDetail {
  role: Role;
  previous: Role;
  /** confirmed · expired · lost · released · handoff · stopped · stream_down · resumed · frozen ·
   *  event · refresh · guard · away · pagehide · remint (a release to take a new epoch after a
   *  Redis failover lost higher ones, from an instance that does not know newEpoch:
   *  docs/browser-client.md, "When a tab is the owner") · user_changed (getToken gave another
   *  user's token: docs/browser-client.md, "One event stream per browser") */
  reason: string;
  lease: LeaseView;
  /** The stream event behind the change (reason "event": a LeaseEvent, whose type tells a takeover
   *  from an admin's revoke and whose reason is the admin's, or a snapshot), null otherwise. */
  event: LeaseEvent | SnapshotEvent | null;
}

/** The state of a TabLease (docs/browser-client.md, "States"). Only "owner" may mutate. */
export type LeaseState = "stopped" | "viewer" | "owner" | "unconfirmed" | "releasing" | "away";

export interface StateDetail {
  state: LeaseState;
  previous: LeaseState;
  reason: string;
}

export interface LeaseDetail {
  lease: LeaseView;
  reason: string;
  /** The stream event behind the change (a LeaseEvent, or a snapshot), if any. */
  event: LeaseEvent | SnapshotEvent | null;
}

export interface CatalogDetail {
  version: string | null;
  /** "version": the catalog changed on the server (a catalog event, or a reconnect's snapshot
   *  naming another version than the one read); "role": this tab's role changed. */
  reason: "version" | "role";
}

export interface HandoffDetail {
  /** Holder side: requested, released. Requester side: requesting, waiting (again at each of
   *  the requester's polls while the holder still holds: every 2–5 s with the event stream
   *  live, 0.25–2 s without), granted, timeout, taken_over, cancelled, failed. */
  phase: string;
  /** Requester side, at the end (granted, timeout, taken_over, cancelled, failed): the same as
   *  phase, as requestHandoff() resolves it (HandoffResult). */
  status?: HandoffResult["status"];
  requester?: Holder | null;
  holder?: Holder | null;
  lease?: LeaseView;
  error?: TabLeaseError;
}

export interface TabLeaseEventMap {
  rolechange: RoleChangeDetail;
  lease: LeaseDetail;
  catalog: CatalogDetail;
  handoff: HandoffDetail;
  state: StateDetail;
  /** The stream went up or down, or this tab started or stopped carrying it. */
  stream: { live: boolean; carrier: boolean };
  tabs: TabsEvent;
  error: { error: TabLeaseError };
}

export interface HandoffResult {
  status: "granted" | "timeout" | "taken_over" | "cancelled" | "failed";
  lease?: LeaseView;
  error?: TabLeaseError;
}

export interface CatalogTool {
  name: string;
  title?: string;
  description: string;
  inputSchema?: object;
  annotations?: {
    readOnlyHint?: boolean;
    destructiveHint?: boolean;
    idempotentHint?: boolean;
    openWorldHint?: boolean;
    untrustedContentHint?: boolean;
    title?: string;
  };
  outputSchema?: object;
  /** How long the agent's runtime waits for a result (default 60000). */
  timeoutMs?: number;
  routes?: string[];
  disabled?: boolean;
}

export interface CatalogView {
  /** The local role the tools were filtered for. */
  role: Role;
  /** The role the server counted this tab as. */
  serverRole: Role | null;
  version: string | null;
  epoch: number | null;
  tools: CatalogTool[];
}

export declare class TabLease extends EventTarget {
  constructor(options: TabLeaseOptions);
  readonly sessionId: string;
  readonly baseUrl: string;
  /** Random per page load, in memory only. */
  readonly tabId: string;
  /** "owner" or "viewer", evaluated now (fail closed). */
  readonly role: Role;
  /** The state, evaluated now; role is "owner" exactly when state is "owner". */
  readonly state: LeaseState;
  readonly lease: LeaseView;
  /** The epoch this tab holds as owner, or null. */
  readonly epoch: number | null;
  /** The lease token of the current grant, or null. */
  readonly token: string | null;
  /** Milliseconds of control left by the local deadline, 0 when not owner. */
  readonly timeLeftMs: number;
  /** Whether the shared event stream is up and its carrier heard from. */
  readonly streamLive: boolean;
  /** Whether this tab runs the browser's event stream for the session (the carrier). */
  readonly streamCarrier: boolean;
  /** "releasing" (this holder was asked to hand over, and hands over by itself: not with
   *  `handoff: "manual"`), "requesting", or null. */
  readonly handoff: "releasing" | "requesting" | null;
  /** Guarded handlers running in the current period of ownership. */
  readonly inFlight: number;
  /** Aborts when the current period of ownership ends; null when not owner. */
  readonly signal: AbortSignal | null;

  /** Listens to the page lifecycle, joins the shared stream, acquires when free (autoAcquire).
   *  Resolves once the first answer is in, and after requestTimeoutMs at the latest (a viewer
   *  then; a later answer is a rolechange or lease event). */
  start(): Promise<LeaseView>;
  /** Releases (unless {release: false}), leaves the stream, removes the page-lifecycle listeners
   *  start() installed (those given to on() stay, for a later start()). The release is
   *  sent with the last token getToken gave, without waiting for getToken (a 401 asks it for a
   *  fresh one). */
  stop(opts?: { release?: boolean }): Promise<void>;
  /** Mode "try". Rejects with TabLeaseError (LEASE_HELD, HANDOFF_PENDING, SESSION_BLOCKED…;
   *  CANCELLED when the tab released meanwhile: it answered a handoff request, or stopped, while
   *  the request was in flight, and gives back what the answer granted). */
  acquire(): Promise<LeaseView>;
  /** Mode "takeover": only on an explicit user action ("Use here"). Rejects as acquire() does,
   *  CANCELLED included, and with CANCELLED, having sent nothing, when the page was frozen before
   *  the takeover was sent. */
  takeover(): Promise<LeaseView>;
  /** Mode "handoff": asks the holder to let go at its next safe point. Resolves "timeout" after
   *  timeoutMs (default 15 s), or earlier when the request lapses at the server. */
  requestHandoff(opts?: { timeoutMs?: number; takeoverOnTimeout?: boolean }): Promise<HandoffResult>;
  /** Gives the lease up; no automatic acquire afterwards until acquire/takeover/requestHandoff.
   *  A release that answers a handoff request (handoff: "manual") is a handoff: automatic
   *  acquire comes back once another tab was granted, as after an automatic one. */
  release(): Promise<{ released: boolean; error?: TabLeaseError }>;
  /** GET …/lease?tabId=. */
  refresh(): Promise<LeaseView>;
  /** POST …/lease/check: is this tab's lease still current? */
  check(): Promise<boolean>;
  /** The tabs of the session, of every browser of the user, as the server lists them now
   *  (GET …/tabs). Read it again on each `tabs` event (docs/browser-client.md, "Every tab is listed"). */
  listTabs(): Promise<ListedTab[]>;
  /** Changes the label; the owner re-acquires (same epoch) so other tabs see it. */
  setLabel(label: string | (() => string)): Promise<void>;
  /** Runs handler only while this tab is the owner; otherwise resolves a NotLeaseOwnerError.
   *  Control ending while handler runs resolves the call at once with one whose
   *  details.mayHaveActed is true; what handler settles with later is dropped. */
  guard<A, R, C = unknown>(
    handler: (args: A, lease: LeaseContext, ctx: C) => R | Promise<R>,
    opts?: { check?: "auto" | "always" | "never" },
  ): (args: A, ctx?: C) => Promise<R | NotLeaseOwnerError>;
  /** GET …/catalog?tabId=&route=, filtered by the local role. */
  catalog(route?: string): Promise<CatalogView>;
  /** addEventListener with the detail; returns a function that removes the listener. */
  on<K extends keyof TabLeaseEventMap>(type: K, fn: (detail: TabLeaseEventMap[K], event: CustomEvent<TabLeaseEventMap[K]>) => void): () => void;
}

export declare class TabLeaseError extends Error {
  constructor(init?: { status?: number; code?: string; message?: string; retryable?: boolean; details?: object; retryAfterMs?: number | null; cause?: unknown });
  /** HTTP status; 0 for a network failure. */
  status: number;
  /** The API's error code (LEASE_HELD, LEASE_LOST, …), NETWORK, or USER_CHANGED (getToken gave
   *  another user's token). */
  code: string;
  retryable: boolean;
  details: Record<string, any>;
  retryAfterMs: number | null;
}

/** A tool error answer (every path of a call resolves; only a handler's own failure throws). */
export interface ToolErrorAnswer {
  error: { code: string; message: string; retryable: boolean; details?: Record<string, any> };
}

/** What the handler of a tool run by an adapter receives as its second argument. */
export interface ToolCallContext {
  /** The epoch this tab holds (null for a read-only tool in a viewer). */
  epoch: number | null;
  /** The lease token (mutation tools only; null for read-only ones). */
  token: string | null;
  tabId: string;
  sessionId: string;
  /** `{"Tablease-Lease": token}` for mutation tools, `{}` otherwise. */
  headers: Record<string, string>;
  /** Aborts when the call must end: the agent's cancel, the deadline, ownership lost (mutations),
   *  the route leaving the tool's instance, pagehide, stop() or the adapter's close(). */
  signal: AbortSignal;
  tool: string;
  /** The route the call belongs to ("/events/evt-1"). */
  route: string;
  /** The route's parameters by name ({event_id: "evt-1"} on "/events/:event_id"). */
  params: Record<string, string>;
  /** The generation the call started in: +1 on every route change, ownership change and
   *  documentChanged(). A read-only call does not see ownership changes, nor a call of a tool
   *  without routes route changes (isCurrent). */
  generation: number;
  /** When the call settles at the latest (the tool's timeoutMs minus a margin), on the client's
   *  clock: performance.now() in a browser, not Date.now(); timeLeftMs() is what to show. */
  deadline: number;
  timeLeftMs(): number;
  /** Whether the page (for a route-bound tool), the document and the ownership (for a mutation
   *  tool: the tab is the confirmed owner now, not unconfirmed, or it is handing over and waits
   *  for this call: docs/browser-client.md, Handoff) are still those the call started with, and
   *  the deadline has not passed; check after each await, right before writing. Asked after the
   *  handler settled, false after any change. */
  isCurrent(): boolean;
  /** isCurrent(), after confirming as the guard does, within the call's signal (a mutation
   *  tool): a lease held unconfirmed asks the server (POST …/lease/check), and a follower tab that
   *  has not heard its stream's carrier lately pings it first. What a handler awaits right before
   *  writing after a wait, such as a question. */
  confirm(): Promise<boolean>;
  /** Call it once isCurrent() or confirm() said false: the answer for a call that is no longer
   *  current (NOT_LEASE_OWNER, TIMEOUT, ROUTE_CHANGED, DOCUMENT_CHANGED, or the end of its
   *  signal). A mutation whose handler returns after a route
   *  or document change or after its deadline, or is ended while its handler runs, gets such an
   *  answer instead of its result, with details.mayHaveActed: true. */
  stale(): ToolErrorAnswer;
  /** Opens an interaction with the user: open(ui) shows it and may return a function that closes
   *  it; resolves what ui.submit(value) gives, {cancelled: true, reason} for ui.cancel(reason)
   *  (reason "user_cancelled" by default), or the call's end (TIMEOUT, UI_CONTEXT_CLOSED,
   *  NOT_LEASE_OWNER, CANCELLED); INTERACTION_ALREADY_OPEN when another is open and the adapter
   *  has interactions: "one". Give T (what ui.submit takes) explicitly: TypeScript cannot infer it. */
  interact<T = unknown>(open: (ui: InteractionUI<T>) => void | (() => void)): Promise<InteractionResult<T>>;
}

/** What ctx.interact() resolves. Each variant has the others' `error` and `cancelled` as absent, so
 *  that `if (answer.error || answer.cancelled) return answer;` narrows to the submitted value. */
export type InteractionResult<T> =
  | (T & { error?: undefined; cancelled?: undefined })
  | { cancelled: true; reason: string; error?: undefined }
  | (ToolErrorAnswer & { cancelled?: undefined });

export interface InteractionUI<T = unknown> {
  signal: AbortSignal;
  /** The call's deadline, on the client's clock (performance.now(), not Date.now()). */
  deadline: number;
  timeLeftMs(): number;
  submit(value: T): void;
  cancel(reason?: string): void;
}

/** A tool handler: (args, the call's context, the caller's context). */
export type ToolHandler = (args: any, ctx: ToolCallContext, caller?: any) => unknown;

export interface ToolDefinition {
  name: string;
  title?: string;
  description: string;
  inputSchema: object;
  outputSchema?: object;
  annotations: CatalogTool["annotations"] & { readOnlyHint: boolean };
  timeoutMs?: number;
  readOnly: boolean;
  /** The route the instance is bound to, or null for a tool on every route. */
  route: string | null;
  params: Record<string, string>;
  /** Aborts when the instance is retired (its route left, the catalog or the role changed). */
  signal: AbortSignal;
  execute(args: object, ctx?: unknown): Promise<object>;
}

export interface ToolOptions {
  /** Handlers by tool name, the record's own properties (not inherited ones: a catalog tool
   *  named "toString" has no handler unless the record has one of its own); tools without one are
   *  not exposed. */
  handlers?: Record<string, ToolHandler>;
  /** The route: a RouteTracker (shared by adapters), a function giving it (followed through
   *  navigation), or a fixed string. Default: a RouteTracker on location.pathname; for
   *  toolDefinitions, "" (no route: the catalog's tools without routes, no parameters bound). */
  route?: string | (() => string) | RouteTracker;
  /** The path prefix the app is mounted under ("/demo"), for the default tracker. */
  base?: string;
  /** Used when the catalog is empty, or cannot be read and was never read for the route (the
   *  adapters keep its last reading otherwise); filtered by role and route the same way. */
  tools?: CatalogTool[] | null;
  onError?: (error: unknown) => void;
  /** A tool's timeout when the catalog gives none (60000). */
  timeoutMs?: number;
  /** The call settles this long before the timeout (1000; at most a tenth of it). */
  timeoutMarginMs?: number;
  /** The largest result, as JSON bytes (262144); larger ones answer RESULT_TOO_LARGE. */
  maxResultBytes?: number;
  /** "one": one interaction with the user at a time in this tab, whatever session's call asks
   *  (INTERACTION_ALREADY_OPEN). */
  interactions?: "one" | "any";
}

/** What every adapter tells about the route it follows. */
export interface RouteBound {
  readonly route: string;
  readonly generation: number;
  readonly routeTracker: RouteTracker | null;
  /** The app replaced the document its tools work on: +1 generation (DOCUMENT_CHANGED), sync. */
  documentChanged(): Promise<void>;
}

/** The page's route, followed through pushState/replaceState, popstate, hashchange and the Navigation API. */
export declare class RouteTracker extends EventTarget {
  constructor(opts?: { window?: any; base?: string; route?: () => string });
  readonly route: string;
  readonly generation: number;
  /** The app's router says the route changed (or, without an argument, to read it again). */
  navigated(route?: string): boolean;
  on(type: "change", fn: (detail: { route: string; previous: string; generation: number }) => void): () => void;
  close(): void;
}

/** Matches a concrete route against a catalog route pattern: its parameters, or null. */
export declare function matchRoute(pattern: string, route: string): Record<string, string> | null;

export declare const CALL_DEFAULTS: Readonly<{ timeoutMs: number; timeoutMarginMs: number; maxResultBytes: number }>;

/** {error: {code, message, retryable, details?}}. */
export declare function toolError(code: string, message: string, details?: Record<string, any>, retryable?: boolean): ToolErrorAnswer;

/** The definitions this tab may expose now, executes wired (mutations through guard). */
export declare function toolDefinitions(lease: TabLease, opts: ToolOptions): Promise<ToolDefinition[]>;

export interface WebMCPBridge extends RouteBound {
  /** Whether a WebMCP modelContext was found. */
  readonly available: boolean;
  /** Names registered now. */
  readonly tools: string[];
  /** Re-reads the catalog and re-registers (call after a route change). */
  sync(): Promise<void>;
  /** Unregisters everything and stops listening. */
  close(): void;
}

/**
 * Registers catalog tools on WebMCP: document.modelContext.registerTool(tool, {signal}), or the
 * older navigator.modelContext.registerTool(tool) + unregisterTool(name). Read-only tools always;
 * mutation tools under a signal that aborts when ownership ends. Re-registers on rolechange and
 * catalog events.
 */
export interface WebMCPOptions extends ToolOptions {
  /** The registry: default document.modelContext, else the older navigator.modelContext. */
  modelContext?: any;
  /** Whether modelContext is the older shape (unregisterTool(name)). */
  legacy?: boolean;
  /** Called with the registered tool names after each change. */
  onChange?: (names: string[]) => void;
}

export declare function registerWebMCPTools(lease: TabLease, opts: WebMCPOptions): WebMCPBridge;

/** Calls registry.sync(definitions) whenever the role, the catalog or (on sync()) the route changes. */
export declare function syncToolRegistry(
  lease: TabLease,
  registry: { sync(defs: ToolDefinition[]): unknown },
  opts: ToolOptions,
): RouteBound & { sync(): Promise<void>; close(): void };

/** Registers handlers on an onTool(name, handler) registry; mutations go through guard. With
 *  tools, a call runs its name's profile for the route, and answers TOOL_UNAVAILABLE when it has
 *  none (the catalog is not read: pass its tools). Answers a function that unregisters them all
 *  (also as close()). */
export declare function bindOnTool(
  lease: TabLease,
  session: { onTool(name: string, handler: (args: any, ctx?: any) => unknown): unknown },
  opts: ToolOptions & { handlers: Record<string, ToolHandler>; tools?: CatalogTool[]; readOnly?: string[] },
): (() => void) & RouteBound & { close(): void };

// Building blocks, exported for tests and for apps that need them.

export declare const DEFAULTS: Readonly<{
  marginMs: number;
  hiddenTtlMs: number;
  backoffBaseMs: number;
  backoffMaxMs: number;
  requestTimeoutMs: number;
  handoffTimeoutMs: number;
  handoffGraceMs: number;
  hiddenAcquireDelayMs: number;
  viewerPollMs: number;
  streamIdleMs: number;
  streamNotFoundMs: number;
  carrierTimeoutMs: number;
}>;
export declare const browserClock: Clock;
export declare function backoffDelay(attempt: number, opts?: { baseMs?: number; maxMs?: number; random?: () => number; retryAfterMs?: number | null }): number;
export declare function parseRetryAfter(value: string | null | undefined, wallNow?: number): number | null;
export declare function isReadOnlyTool(tool: CatalogTool): boolean;
/** A fresh tab id: "t-" and 22 random characters of A-Z a-z 0-9 - _ (132 bits), 24 in all. */
export declare function newTabId(): string;
export declare function tokenSubject(token: string): string;

export type SSEItem =
  | { kind: "event"; type: string; data: string; id: string }
  | { kind: "retry"; ms: number }
  | { kind: "comment"; text: string };

export declare class SSEParser {
  lastEventId: string;
  feed(text: string): SSEItem[];
}

export interface StreamOpenArgs {
  lastEventId: string;
  signal: AbortSignal;
  onOpen(): void;
  onItem(item: SSEItem): void;
}

export declare class StreamRunner {
  constructor(opts: {
    open(args: StreamOpenArgs): Promise<void>;
    clock?: Clock;
    random?: () => number;
    baseMs?: number;
    maxMs?: number;
    notFoundMs?: number;
    lastEventId?: string;
    onEvent?(ev: { type: string; id: string; data: unknown }): void;
    onStatus?(live: boolean): void;
  });
  readonly live: boolean;
  lastEventId: string;
  start(): void;
  /** Connects now if waiting after a connection that ended without an answer from the server (a wait the server asked for is kept). */
  retryNow(): void;
  stop(): void;
}

export interface StreamSubscriber {
  open(args: StreamOpenArgs): Promise<void>;
  onEvent?(ev: { type: string; id: string; data: unknown }): void;
  onStatus?(status: { live: boolean; carrier: boolean }): void;
}

/** The stream of one key (origin|sub|session) in one tab, shared across the browser's tabs. */
export declare class StreamHub {
  constructor(
    key: string,
    env?: {
      locks?: LockManager;
      BroadcastChannel?: typeof BroadcastChannel;
      document?: Document | EventTarget | null;
      clock?: Clock;
      random?: () => number;
      carrierTimeoutMs?: number;
      runnerOptions?: { notFoundMs?: number };
    },
  );
  readonly key: string;
  readonly id: string;
  /** Whether this tab runs the connection. */
  readonly carrier: boolean;
  readonly live: boolean;
  readonly shared: boolean;
  lastEventId: string;
  add(sub: StreamSubscriber): void;
  remove(sub: StreamSubscriber): boolean;
  /** When news may have been missed from because the carrier left a ping unanswered past its
   *  due; -Infinity if not. */
  missedSince(now?: number): number;
  /** Resolves once this tab has heard from the carrier within carrierTimeoutMs (asking it with a
   *  ping when it has not), or when that ping's answer is due. */
  heard(): Promise<void>;
  /** A subscriber heard from the server again: a stream waiting to reconnect connects now (in
   *  this tab, or asked over the channel, in the carrier's). */
  reconnectNow(): void;
}
