// Checks that the modules of the browser client implement what tablease.d.ts declares: every
// declared export exists in the module that defines it, with a type the declaration accepts.
// "../tablease.js" resolves to tablease.d.ts (the declarations); the other modules have no .d.ts,
// so TypeScript types them from their JavaScript (allowJs, checkJs). Run: npx tsc -p .

import type * as decl from "../tablease.js";
import * as http from "../http.js";
import * as sse from "../sse.js";
import * as stream from "../stream.js";
import * as lease from "../lease.js";
import * as tools from "../tools.js";
import * as route from "../route.js";
import * as call from "../call.js";

export const checked = {
  DEFAULTS: http.DEFAULTS satisfies typeof decl.DEFAULTS,
  browserClock: http.browserClock satisfies typeof decl.browserClock,
  backoffDelay: http.backoffDelay satisfies typeof decl.backoffDelay,
  parseRetryAfter: http.parseRetryAfter satisfies typeof decl.parseRetryAfter,
  TabLeaseError: http.TabLeaseError satisfies typeof decl.TabLeaseError,
  SSEParser: sse.SSEParser satisfies typeof decl.SSEParser,
  StreamRunner: stream.StreamRunner satisfies typeof decl.StreamRunner,
  StreamHub: stream.StreamHub satisfies typeof decl.StreamHub,
  NOT_LEASE_OWNER: lease.NOT_LEASE_OWNER satisfies typeof decl.NOT_LEASE_OWNER,
  TabLease: lease.TabLease satisfies typeof decl.TabLease,
  newTabId: lease.newTabId satisfies typeof decl.newTabId,
  tokenSubject: lease.tokenSubject satisfies typeof decl.tokenSubject,
  RouteTracker: route.RouteTracker satisfies typeof decl.RouteTracker,
  matchRoute: route.matchRoute satisfies typeof decl.matchRoute,
  CALL_DEFAULTS: call.CALL_DEFAULTS satisfies typeof decl.CALL_DEFAULTS,
  toolError: call.toolError satisfies typeof decl.toolError,
  isReadOnlyTool: tools.isReadOnlyTool satisfies typeof decl.isReadOnlyTool,
  toolDefinitions: tools.toolDefinitions satisfies typeof decl.toolDefinitions,
  registerWebMCPTools: tools.registerWebMCPTools satisfies typeof decl.registerWebMCPTools,
  syncToolRegistry: tools.syncToolRegistry satisfies typeof decl.syncToolRegistry,
  bindOnTool: tools.bindOnTool satisfies typeof decl.bindOnTool,
};

// A TabLease as the declarations describe it must be what the implementation builds.
export function instance(l: lease.TabLease): decl.TabLease {
  return l;
}
