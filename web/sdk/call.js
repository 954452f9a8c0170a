// call.js — one tool call from start to answer: the route-bound entity rule, input validation
// against inputSchema, one AbortSignal for every reason the call must end, the deadline, user
// interactions, stale results and the size of the result. tools.js builds the handlers' world
// (routes, generations, instances) and calls runToolCall.

/** The defaults of tool calls. */
export const CALL_DEFAULTS = Object.freeze({
  timeoutMs: 60000, // what an agent's runtime waits when a tool gives no timeoutMs
  timeoutMarginMs: 1000, // the call settles this much before (at most a tenth of the timeout)
  maxResultBytes: 256 * 1024,
});

/** A tool error answer: {error: {code, message, retryable, details?}}. */
export function toolError(code, message, details = undefined, retryable = false) {
  const error = { code, message, retryable };
  if (details !== undefined) error.details = details;
  return { error };
}

/** An AbortSignal that aborts when any of the given ones does, with its reason. */
export function anySignal(signals) {
  const list = signals.filter(Boolean);
  if (typeof AbortSignal.any === "function") return AbortSignal.any(list);
  const ac = new AbortController();
  for (const s of list) {
    if (s.aborted) {
      ac.abort(s.reason);
      break;
    }
    s.addEventListener("abort", () => ac.abort(s.reason), { once: true });
  }
  return ac.signal;
}

/** The reason of an abort, as the answer the call gives: {error} (see the codes in
 *  docs/browser-client.md). Reasons made by this client are {answer}. */
export function abortAnswer(signal) {
  const r = signal?.reason;
  if (r && typeof r === "object" && r.answer) return r.answer;
  if (r && typeof r === "object" && typeof r.code === "string") return toolError(r.code, r.message ?? "The call was ended.", r.details);
  return toolError("CANCELLED", "The agent cancelled the call.");
}

/** An abort reason that carries the answer the call gives. */
export function endReason(answer) {
  return { answer, code: answer.error?.code };
}

// --- the seed-003 rule of route-bound tools ------------------------------------------------------

/**
 * Applies the route's parameters to a call's input. For each parameter the route binds
 * (`/events/:event_id` on `/events/evt-1` binds event_id = "evt-1"): left out (or null), it means
 * the current entity; the same value is the current entity; another value is ENTITY_MISMATCH. The
 * input property is then set to the current value when the schema declares it, and removed when it
 * does not (so a profile whose schema takes only {} accepts the same id too). A property typed
 * number or integer (and not string) is bound as the number the segment's digits write ("42" is
 * 42, "007" is 7), and either form is the current entity. Returns {args} or {answer} (the error).
 */
export function bindRouteParams(args, params, schema) {
  const out = { ...args };
  const props = schema && typeof schema === "object" && schema.properties && typeof schema.properties === "object" ? schema.properties : {};
  for (const [name, segment] of Object.entries(params ?? {})) {
    if (name === "*") continue;
    const current = Object.hasOwn(props, name) ? paramValue(segment, props[name]) : segment;
    const given = Object.hasOwn(out, name) ? out[name] : undefined;
    if (given !== undefined && given !== null && given !== current && given !== segment) {
      return {
        answer: toolError(
          "ENTITY_MISMATCH",
          `This tool acts on the ${name} of the page the user sees (${JSON.stringify(current)}), not ${JSON.stringify(given)}: leave ${name} out for the current one, or open the page of the other one first.`,
          { param: name, current, given },
        ),
      };
    }
    if (Object.hasOwn(props, name)) out[name] = current;
    else delete out[name];
  }
  return { args: out };
}

/** A route segment as the input property prop takes it: the number its decimal digits write
 *  ("42", "007" is 7, "-1.5"; not "1e3" or "0x10") when prop is typed number or integer and not
 *  string, and that number is exactly what they write, else itself. A number is not exact past
 *  what a double holds: an integer beyond 2^53 - 1, or a decimal of more than 15 significant
 *  digits, would bind the number of another entity ("9007199254740993" reads as ...992): such a
 *  segment stays a string, which a number-typed input refuses (INVALID_ARGUMENT) rather than act
 *  on a neighbour. */
function paramValue(segment, prop) {
  const t = prop && typeof prop === "object" ? prop.type : undefined;
  const types = Array.isArray(t) ? t : [t];
  if (types.includes("string") || !(types.includes("number") || types.includes("integer"))) return segment;
  if (!/^-?\d+(\.\d+)?$/.test(segment)) return segment;
  const n = Number(segment);
  const exact = segment.includes(".") ? segment.replace(/^-/, "").replace(".", "").replace(/^0+/, "").length <= 15 : Number.isSafeInteger(n);
  return exact ? n : segment;
}

// --- input validation ----------------------------------------------------------------------------

function typeOf(v) {
  if (v === null) return "null";
  if (Array.isArray(v)) return "array";
  if (typeof v === "number") return Number.isInteger(v) ? "integer" : "number";
  return typeof v;
}

function typeMatches(want, v) {
  const t = typeOf(v);
  return want === t || (want === "number" && t === "integer");
}

/**
 * Checks value against the JSON Schema keywords a tool's inputSchema uses: type (one or a list),
 * enum, const, properties, required, additionalProperties (false or a schema), items, minItems,
 * maxItems, minLength, maxLength, pattern, minimum, maximum, exclusiveMinimum, exclusiveMaximum.
 * Other keywords are not checked. A pattern this browser cannot compile fails every value: an
 * input that cannot be checked is not let through. Returns null, or {path, reason} for the first
 * problem.
 */
export function validateInput(schema, value, path = "") {
  if (schema === true || schema == null || typeof schema !== "object") return null;
  if (schema === false) return { path: path || "(input)", reason: "is not allowed" };
  const at = path || "(input)";
  if (schema.type !== undefined) {
    const types = Array.isArray(schema.type) ? schema.type : [schema.type];
    if (!types.some((t) => typeMatches(t, value))) return { path: at, reason: `must be ${types.join(" or ")}, not ${typeOf(value)}` };
  }
  if (Array.isArray(schema.enum) && !schema.enum.some((e) => JSON.stringify(e) === JSON.stringify(value))) {
    return { path: at, reason: `must be one of ${schema.enum.map((e) => JSON.stringify(e)).join(", ")}` };
  }
  if (schema.const !== undefined && JSON.stringify(schema.const) !== JSON.stringify(value)) return { path: at, reason: `must be ${JSON.stringify(schema.const)}` };
  if (typeof value === "string") {
    const n = [...value].length;
    if (typeof schema.minLength === "number" && n < schema.minLength) return { path: at, reason: `must have at least ${schema.minLength} characters` };
    if (typeof schema.maxLength === "number" && n > schema.maxLength) return { path: at, reason: `must have at most ${schema.maxLength} characters` };
    if (typeof schema.pattern === "string") {
      const re = compilePattern(schema.pattern);
      if (!re) return { path: at, reason: `cannot be checked: the tool's pattern ${schema.pattern} is not a regular expression` };
      if (!re.test(value)) return { path: at, reason: `must match ${schema.pattern}` };
    }
  }
  if (typeof value === "number") {
    if (typeof schema.minimum === "number" && value < schema.minimum) return { path: at, reason: `must be at least ${schema.minimum}` };
    if (typeof schema.maximum === "number" && value > schema.maximum) return { path: at, reason: `must be at most ${schema.maximum}` };
    if (typeof schema.exclusiveMinimum === "number" && value <= schema.exclusiveMinimum) return { path: at, reason: `must be more than ${schema.exclusiveMinimum}` };
    if (typeof schema.exclusiveMaximum === "number" && value >= schema.exclusiveMaximum) return { path: at, reason: `must be less than ${schema.exclusiveMaximum}` };
  }
  if (Array.isArray(value)) {
    if (typeof schema.minItems === "number" && value.length < schema.minItems) return { path: at, reason: `must have at least ${schema.minItems} items` };
    if (typeof schema.maxItems === "number" && value.length > schema.maxItems) return { path: at, reason: `must have at most ${schema.maxItems} items` };
    if (schema.items && typeof schema.items === "object") {
      for (let i = 0; i < value.length; i++) {
        const p = validateInput(schema.items, value[i], `${path}[${i}]`);
        if (p) return p;
      }
    }
  }
  if (typeOf(value) === "object") {
    const props = schema.properties && typeof schema.properties === "object" ? schema.properties : {};
    for (const name of Array.isArray(schema.required) ? schema.required : []) {
      if (!Object.hasOwn(value, name) || value[name] === undefined) return { path: join(path, name), reason: "is required" };
    }
    for (const [name, v] of Object.entries(value)) {
      if (v === undefined) continue;
      if (Object.hasOwn(props, name)) {
        const p = validateInput(props[name], v, join(path, name));
        if (p) return p;
      } else if (schema.additionalProperties === false) {
        const known = Object.keys(props);
        return { path: join(path, name), reason: `is not a parameter of this tool${known.length ? ` (it takes: ${known.join(", ")})` : " (it takes {})"}` };
      } else if (schema.additionalProperties && typeof schema.additionalProperties === "object") {
        const p = validateInput(schema.additionalProperties, v, join(path, name));
        if (p) return p;
      }
    }
  }
  return null;
}

/** A schema's pattern as a RegExp: read as Unicode, as JSON Schema asks, or else as ECMAScript
 *  reads it without the u flag ("\\_" is "_" there); null when neither compiles. */
function compilePattern(src) {
  for (const flags of ["u", ""]) {
    try {
      return new RegExp(src, flags);
    } catch {}
  }
  return null;
}

function join(path, name) {
  return path ? `${path}.${name}` : name;
}

// --- the result ----------------------------------------------------------------------------------

// WebMCP serializes a tool's result and needs an object.
function toObject(v) {
  if (v === undefined || v === null) return {};
  return typeof v === "object" && !Array.isArray(v) ? v : { result: v };
}

/** The result as the agent gets it, its JSON read back (a Date as its string, what JSON leaves out
 *  left out), or RESULT_TOO_LARGE when its JSON is over maxBytes. */
export function checkResult(value, maxBytes) {
  let json;
  try {
    json = JSON.stringify(toObject(value));
  } catch (e) {
    return toolError("INVALID_RESULT", `The tool's result cannot be sent as JSON (${e?.message ?? e}).`);
  }
  if (json === undefined) return toolError("INVALID_RESULT", "The tool's result cannot be sent as JSON (its toJSON gave nothing).");
  const bytes = new TextEncoder().encode(json).length;
  if (bytes > maxBytes) {
    return toolError(
      "RESULT_TOO_LARGE",
      `The result is ${bytes} bytes, more than the ${maxBytes} a tool of this page may return: the page should keep large data and return an id or a URL to it instead.`,
      { bytes, maxBytes },
    );
  }
  return toObject(JSON.parse(json)); // (a toJSON may give something other than an object)
}

// --- interactions --------------------------------------------------------------------------------

// The interaction open now, per page: by its document, which every TabLease of the page shares (a
// page working on two sessions shows one modal at a time, seed 002), or by the TabLease without one.
const openInteractions = new WeakMap();

/**
 * Opens an interaction with the user for a call: open(ui) shows it (a modal) and may return a
 * function that closes it; ui.submit(value) and ui.cancel() settle it. It settles with the
 * call's end answer (TIMEOUT, UI_CONTEXT_CLOSED, NOT_LEASE_OWNER, CANCELLED) when the call's
 * signal aborts first, or with UI_CONTEXT_CLOSED when the route changes (its UI belongs to the
 * page), and the close function runs on every path.
 */
function interact(call, open, { exclusive }) {
  const { lease, tool } = call;
  const page = lease._document ?? lease;
  const signal = anySignal([call.signal, call.pageSignal]);
  if (typeof open !== "function") throw new TypeError("interact: open must be a function that shows the interaction");
  if (signal.aborted) return Promise.resolve(abortAnswer(signal));
  const current = openInteractions.get(page);
  if (exclusive && current) {
    return Promise.resolve(
      toolError("INTERACTION_ALREADY_OPEN", `Another interaction with the user is open (${current.tool}); answer or cancel it first.`, { tool: current.tool }, true),
    );
  }
  return new Promise((resolve) => {
    const mine = { tool };
    let done = false;
    let close = null;
    const endCount = call.mutation ? lease._beginInteraction() : () => {};
    const finish = (value) => {
      if (done) return;
      done = true;
      signal.removeEventListener("abort", onAbort);
      if (openInteractions.get(page) === mine) openInteractions.delete(page);
      endCount();
      try {
        close?.();
      } catch (e) {
        globalThis.reportError?.(e);
      }
      resolve(value);
    };
    const onAbort = () => finish(abortAnswer(signal));
    signal.addEventListener("abort", onAbort, { once: true });
    if (!current) openInteractions.set(page, mine);
    const ui = {
      signal,
      deadline: call.deadline,
      timeLeftMs: call.timeLeftMs,
      submit: (value) => finish(value),
      cancel: (reason = "user_cancelled") => finish({ cancelled: true, reason }),
    };
    try {
      const c = open(ui);
      if (typeof c === "function") {
        if (done) c();
        else close = c;
      }
    } catch (e) {
      finish(toolError("INTERACTION_FAILED", `The page could not show the interaction: ${e?.message ?? e}`));
    }
  });
}

// --- one call ------------------------------------------------------------------------------------

/**
 * Runs one call of a tool instance. `call` holds what tools.js knows:
 *   lease, tool (name), schema, mutation, timeoutMs, readContext (the lease context of read-only
 *   tools), instance (route, pattern, params, callSignal), scope (route(), generation,
 *   staleAnswer(gen), signal, options). callerCtx is the agent's: its signal is the agent's cancel.
 * Mutations run inside lease.guard, which gives the lease context and counts the call.
 */
export async function runToolCall(handler, call, args, callerCtx) {
  const { lease, scope, instance } = call;
  let input = args && typeof args === "object" && !Array.isArray(args) ? args : args == null ? {} : args;
  if (typeof input !== "object" || Array.isArray(input)) return toolError("INVALID_ARGUMENT", "The input must be a JSON object.", { path: "(input)", reason: "must be a JSON object" });
  const bound = bindRouteParams(input, instance.params, call.schema);
  if (bound.answer) return bound.answer;
  input = bound.args;
  const bad = validateInput(call.schema, input);
  if (bad) return toolError("INVALID_ARGUMENT", `${bad.path} ${bad.reason}.`, bad);

  // The call's deadline and the agent's cancel run from the start: a mutation's guard may first
  // wait for the server to confirm the lease, and that wait is the call's.
  const clock = lease._clock;
  const opts = scope.options;
  const timeoutMs = typeof call.timeoutMs === "number" && call.timeoutMs > 0 ? call.timeoutMs : opts.timeoutMs;
  const margin = Math.min(opts.timeoutMarginMs, Math.floor(timeoutMs / 10));
  const start = clock.now();
  const deadline = start + timeoutMs - margin;
  const timeout = () => toolError("TIMEOUT", `The tool did not finish within ${timeoutMs} ms (its timeoutMs); it was ended so that the agent gets an answer.`, { timeoutMs });
  const ac = new AbortController();
  const timer = clock.setTimeout(() => ac.abort(endReason(timeout())), deadline - start);
  const agent = callerCtx && typeof callerCtx === "object" && callerCtx.signal && typeof callerCtx.signal.addEventListener === "function" ? callerCtx.signal : null;
  // The agent's and the lease's signals give this call's answer when they abort.
  const agentEnd = mapAbort(agent, () => toolError("CANCELLED", "The agent cancelled the call."));
  const early = anySignal([ac.signal, agentEnd.signal]);
  // The deadline is a timer, which a hidden or frozen page runs late: it is also read from the
  // clock, before the handler starts, when it returns, and by isCurrent().
  const late = () => clock.now() >= deadline;
  let started = false; // the handler runs: its call's end answers from run, saying it may have acted

  const run = async (leaseCtx) => {
    const ownerEnd = mapAbort(leaseCtx.signal, () => lease._notOwner());
    const signal = anySignal([early, ownerEnd.signal, instance.callSignal, scope.signal]);
    const generation = scope.generation;
    const kind = { mutation: call.mutation, routed: instance.pattern !== null };
    // Current: not ended, not past the deadline (a frozen page's timers run late), the page and
    // document as they were and, for a mutation, the lease confirmed now (after a freeze or a
    // silence, another tab may have taken over); a tab asked to hand over lets the handlers it
    // waits for act while it holds the lease confirmed (_mayAct).
    const owner = () => !call.mutation || lease._mayAct();
    // The changes since generation are held while the call may still ask about them (below); the
    // first of them, when there is one as they are let go, is kept for a later ctx.stale().
    let kept = null;
    const changed = () => kept ?? scope.changeSince(generation, kind);
    const current = () => !signal.aborted && !late() && !changed() && owner();
    const stale = () => {
      if (signal.aborted) return abortAnswer(signal);
      if (!owner()) return lease._notOwner();
      if (late()) return timeout();
      return scope.staleAnswer(generation, kind, false, changed());
    };
    // isCurrent(), after confirming as the guard does (a mutation's tab that holds the lease
    // unconfirmed asks the server): a user's answer that came after a freeze is applied once
    // confirmed.
    const confirm = async () => {
      if (call.mutation && !signal.aborted) {
        const ended = whenAborted(signal);
        await Promise.race([lease._confirmForMutation(), ended.promise]);
        ended.off();
      }
      return current();
    };
    const ctx = {
      ...leaseCtx,
      signal,
      tool: call.tool,
      route: instance.pattern === null ? scope.route() : instance.route,
      params: { ...instance.params },
      generation,
      deadline,
      timeLeftMs: () => Math.max(0, Math.floor(deadline - clock.now())),
      isCurrent: current,
      confirm,
      stale,
      interact: (open) => interact(ctxFor, open, { exclusive: opts.interactions === "one" }),
    };
    // Readings of the lease context's, whose token renews replace (guard).
    Object.defineProperties(ctx, {
      token: { get: () => leaseCtx.token, enumerable: true },
      headers: { get: () => leaseCtx.headers, enumerable: true },
    });
    // The page's signal as interact() is called: a tool without routes, whose call outlives a
    // route change, asks its question on the page shown then.
    const ctxFor = { signal, get pageSignal() { return scope.pageSignal; }, lease, tool: call.tool, mutation: call.mutation, deadline, timeLeftMs: ctx.timeLeftMs };
    // The changes since generation are kept until the handler settles, even after the call was
    // answered: it may still ask isCurrent() before it acts. A call answered by its end (its
    // signal, its deadline) is never current again, and its stale() answers from that end: its
    // changes go then, or a handler that never settles would keep every later change.
    const hold = scope.hold(generation);
    const release = () => {
      kept ??= scope.changeSince(generation, kind);
      hold();
    };
    let handled = null;
    try {
      if (signal.aborted) return abortAnswer(signal);
      if (late()) return timeout();
      const ended = whenAborted(signal);
      started = true;
      handled = Promise.resolve().then(() => handler(input, ctx, callerCtx));
      const out = await Promise.race([handled.then((value) => ({ ended: false, value })), ended.promise.then(() => ({ ended: true, value: undefined }))]);
      ended.off();
      // A mutation ended while its handler ran may have acted (its write sent, its answer not
      // in yet): the agent looks before it calls again.
      if (out.ended) return call.mutation ? mayHaveActed(abortAnswer(signal)) : abortAnswer(signal);
      if (late()) return call.mutation ? mayHaveActed(timeout()) : timeout();
      if (call.mutation && scope.changeSince(generation, kind) && !isError(out.value)) return scope.staleAnswer(generation, kind, true);
      return checkResult(out.value, opts.maxResultBytes);
    } finally {
      if (!handled || signal.aborted || late()) release();
      else handled.then(release, release);
      ownerEnd.off();
    }
  };
  try {
    if (!call.mutation) return await run(call.readContext());
    // The guard's handler checks the signal before it runs: one that runs after the call was
    // answered (the check came back later) never starts. Ended once the handler runs, the call
    // answers from run, which says the handler may have acted.
    const guarded = lease.guard((a, leaseCtx) => run(leaseCtx))(input, callerCtx);
    const ended = whenAborted(early);
    const out = await Promise.race([guarded, ended.promise.then(() => (started ? guarded : abortAnswer(early)))]);
    ended.off();
    return out;
  } finally {
    clock.clearTimeout(timer);
    agentEnd.off();
  }
}

/** {promise, off}: a promise that resolves once signal aborts (at once if it has), and off(),
 *  which stops listening to a signal that outlives the wait. */
function whenAborted(signal) {
  let off = () => {};
  const promise = new Promise((resolve) => {
    if (signal.aborted) return resolve();
    signal.addEventListener("abort", resolve, { once: true });
    off = () => signal.removeEventListener("abort", resolve);
  });
  return { promise, off };
}

/** The answer of an ended mutation, saying that it may have acted (in its details, and to an
 *  agent that reads only the message). */
export function mayHaveActed(answer) {
  if (!isError(answer)) return answer;
  const message = `${answer.error.message ?? ""} Its handler was running, so it may have acted: look at what it did before calling again.`.trim();
  return { ...answer, error: { ...answer.error, message, details: { ...(answer.error.details ?? {}), mayHaveActed: true } } };
}

function isError(v) {
  return Boolean(v && typeof v === "object" && v.error && typeof v.error === "object");
}

/** {signal, off}: a signal that aborts when source (if any) does, with the answer answerFn gives
 *  at that moment; off() stops listening to source (a lease's signal outlives many calls). */
function mapAbort(source, answerFn) {
  if (!source) return { signal: null, off: () => {} };
  const ac = new AbortController();
  const fire = () => ac.abort(endReason(answerFn()));
  if (source.aborted) fire();
  else source.addEventListener("abort", fire, { once: true });
  return { signal: ac.signal, off: () => source.removeEventListener("abort", fire) };
}
