// Checks that tablease.d.ts serves an app written in strict TypeScript as the docs show it: the
// examples of README.md and docs/browser-client.md, with the types a TypeScript app adds (a
// handlers record typed Record<string, ToolHandler>, interact's T), and the documented payloads
// of events. Only the declarations are read ("../tablease.js" resolves to tablease.d.ts).
// Run: npx tsc -p tsconfig.usage.json

import { TabLease, registerWebMCPTools, type ToolHandler, type ListedTab } from "../tablease.js";

declare const api: { rename(args: unknown, lease: { epoch: number; token: string }): Promise<unknown> };
declare const modal: { show(q: string, o: { onAnswer(a: string): void; onCancel(): void }): void; setTimeLeft(ms: number): void; close(): void };
declare function confirmModal(ui: { submit(v: { answer: string }): void; cancel(): void }, text: string): () => void;

// docs/browser-client.md, "Use it from a web app"; README.md, "Use it from a web app".
let cached = { token: "", until: 0 };
async function getToken({ refresh, signal }: { refresh?: boolean; signal?: AbortSignal } = {}): Promise<string> {
  if (!refresh && Date.now() < cached.until) return cached.token;
  const res = await fetch("/auth/tablease-token" + (refresh ? "?refresh=1" : ""), { credentials: "include", signal });
  if (!res.ok) throw new Error(`token endpoint: ${res.status}`);
  const { token } = (await res.json()) as { token: string };
  const { exp } = JSON.parse(atob(token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/"))) as { exp: number };
  cached = { token, until: exp * 1000 - 60_000 };
  return token;
}

const lease = new TabLease({
  baseUrl: "https://lease.example.com",
  sessionId: "doc-42",
  getToken,
  label: () => `Events — ${location.pathname}`,
});
const showRole = () => {
  document.body.dataset.role = lease.role;
  const banner = document.getElementById("banner");
  if (banner) banner.hidden = lease.role === "owner";
};
lease.on("rolechange", showRole);
lease.on("error", ({ error }) => {
  const p = document.getElementById("problem");
  if (p) {
    p.textContent = `Control of this session is not available: ${error.message}`;
    p.hidden = false;
  }
});

const handlers: Record<string, ToolHandler> = {
  search_events: async ({ q }) => (await fetch(`/api/events?q=${encodeURIComponent(q ?? "")}`)).json(),
  get_event_details: async (args, { params }) => {
    const id = args.event_id ?? params.event_id;
    return (await fetch(`/api/events/${encodeURIComponent(id)}`)).json();
  },
  save_event: async (args, ctx) => {
    const id = args.event_id ?? ctx.params.event_id;
    if (!ctx.isCurrent()) return ctx.stale();
    const res = await fetch(`/api/sessions/${encodeURIComponent(ctx.sessionId)}/saved/${encodeURIComponent(id)}`, { method: "PUT", headers: ctx.headers, signal: ctx.signal });
    return res.json();
  },
  save_event_destructured: async (args, { headers, signal, params, sessionId, isCurrent, stale }) => {
    if (!isCurrent()) return stale();
    const id = encodeURIComponent(args.event_id ?? params.event_id);
    const url = `/api/sessions/${encodeURIComponent(sessionId)}/saved/${id}`;
    return (await fetch(url, { method: "PUT", headers, signal })).json();
  },
  ask_user: (args, ctx) =>
    ctx.interact<{ answer: string }>((ui) => {
      modal.show(args.question, { onAnswer: (a) => ui.submit({ answer: a }), onCancel: () => ui.cancel() });
      const tick = setInterval(() => modal.setTimeLeft(ui.timeLeftMs()), 250);
      return () => {
        clearInterval(tick);
        modal.close();
      };
    }),
  delete_event: async (args, ctx) => {
    const answer = await ctx.interact<{ answer: string }>((ui) => confirmModal(ui, `Delete ${ctx.params.event_id}?`));
    if (answer.error || answer.cancelled) return answer;
    const said: string = answer.answer;
    if (said !== "yes" || !(await ctx.confirm())) return ctx.stale();
    return (await fetch(`/api/events/${ctx.params.event_id}`, { method: "DELETE", headers: ctx.headers, signal: ctx.signal })).json();
  },
};
const tools = registerWebMCPTools(lease, { handlers });

// The guard, and the lease token it hands a handler.
const rename = lease.guard(async (args, { epoch, token }) => api.rename(args, { epoch, token }));
const guarded = lease.guard(async (_args, { token, signal, headers }) =>
  fetch("/api/x", { method: "POST", headers: { "Tablease-Lease": token, ...headers }, signal }),
);

// Events and their documented payloads.
lease.on("tabs", ({ type, tab, reason }) => console.log(type, tab.tabId, tab.label, tab.hidden, tab.connectedAt, reason));
lease.on("tabs", async () => {
  const tabs: ListedTab[] = await lease.listTabs();
  console.log(tabs.map((t) => `${t.label}${t.hidden ? " (hidden)" : ""}`).join(", "));
});
lease.on("lease", ({ lease: view, reason, event }) => {
  if (event?.type === "snapshot") console.log(event.tabs.length, event.resumed, event.catalogVersion, event.handoff?.requester.hidden);
  else if (event) console.log(event.requester?.hidden, event.previous?.epoch, view.holder?.label, reason);
});
lease.on("handoff", ({ phase, status, requester }) => console.log(phase, status, requester?.hidden));
lease.on("state", ({ state, previous, reason }) => console.log(state, previous, reason));
lease.on("stream", ({ live, carrier }) => console.log(live, carrier));
lease.on("error", ({ error }) => console.log(error.code, error.retryable));

export async function main() {
  await lease.start();
  showRole();
  await tools.sync();
  console.log(await rename({ id: "evt-1", name: "New name" }), await guarded({}));
  const handoff = await lease.requestHandoff({ timeoutMs: 5000 });
  if (handoff.status === "granted") console.log(handoff.lease?.epoch);
  const view = await lease.catalog("/events/evt-1");
  console.log(view.role, view.tools.map((t) => t.name));
  await lease.stop();
  tools.close();
}
