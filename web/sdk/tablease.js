// tablease.js — the browser client of tablease: its public entry point. An ES module without
// dependencies or build step; its types are in tablease.d.ts beside it. See
// docs/browser-client.md.
//
//   import { TabLease, registerWebMCPTools } from "/sdk/tablease.js";
//   const lease = new TabLease({ sessionId: "doc-42", getToken, label: "Events" });
//   await lease.start();
//   const save = lease.guard(async (args, { epoch, token }) => api.save(args, token));
//
// The modules beside it, one job each:
//   http.js    a call of the HTTP API, its errors, backoff, defaults and the clock
//   sse.js     the text/event-stream parser
//   stream.js  the event stream, shared by the tabs of a browser through a carrier tab
//   lease.js   TabLease: the lease of one tab, as a small state machine
//   route.js   the page's route: catalog route patterns, and SPA navigation followed
//   call.js    one tool call: bound route parameters, input checks, its signal and deadline,
//              interactions with the user, stale and oversized results
//   tools.js   the catalog's tools on WebMCP or an app's registry, guarded

export { DEFAULTS, TabLeaseError, backoffDelay, browserClock, parseRetryAfter } from "./http.js";
export { SSEParser } from "./sse.js";
export { StreamHub, StreamRunner } from "./stream.js";
export { NOT_LEASE_OWNER, TabLease, newTabId, tokenSubject } from "./lease.js";
export { RouteTracker, matchRoute } from "./route.js";
export { CALL_DEFAULTS, toolError } from "./call.js";
export { bindOnTool, isReadOnlyTool, registerWebMCPTools, syncToolRegistry, toolDefinitions } from "./tools.js";
