// The lease socket: renews and checks over it, HTTP whenever it cannot: `node --test web/sdk/`.
import assert from "node:assert/strict";
import { test } from "node:test";

import { TabLease } from "./tablease.js";
import { SOCKET_RETRY_MS, socketUrl } from "./socket.js";
import { FakeClock, FakeServer, fakeOptions, flush } from "./fakes.mjs";

function setup({ server: so = {}, lease: lo = {} } = {}) {
  const clock = new FakeClock(1000);
  const server = new FakeServer(clock, so);
  const lease = new TabLease(fakeOptions(server, clock, { WebSocket: server.WebSocket, origin: "http://app.test", ...lo }));
  return { clock, server, lease };
}

const renews = (server) => server.callsTo("POST", "/lease/renew");

test("the socket's URL is the server's, with ws: or wss:", () => {
  assert.equal(socketUrl("http://tablease.test", ""), "ws://tablease.test/v1/socket");
  assert.equal(socketUrl("https://lease.example:8443/base", ""), "wss://lease.example:8443/base/v1/socket");
  assert.equal(socketUrl("", "https://app.example"), "wss://app.example/v1/socket");
  assert.equal(socketUrl("", ""), "", "no origin to resolve it against: no socket");
});

test("renews go over the socket, authenticated once, with the bodies HTTP would carry", async () => {
  const { clock, server, lease } = setup();
  await lease.start();
  await clock.advance(15000);
  await clock.advance(15000);
  const r = renews(server);
  assert.equal(r.length, 2);
  assert.ok(r.every((c) => c.via === "socket" && c.body.epoch === lease.epoch && c.body.tabId === lease.tabId));
  assert.equal(server.callsTo("POST", "/lease")[0].via, "http", "the acquire goes over HTTP");
  assert.equal(server.sockets.length, 1);
  const [s] = server.sockets;
  assert.equal(s.url, "ws://tablease.test/v1/socket");
  assert.deepEqual(s.sent.map((m) => m.op), ["auth", "renew", "renew"]);
  assert.equal(s.sent[0].token, "token-1");
  assert.deepEqual(Object.keys(s.sent[1]).sort(), ["body", "id", "op", "sid"]);
  assert.equal(lease.role, "owner");
  await lease.stop({ release: false });
  assert.equal(s.readyState, 3, "stop closes the socket");
});

test("a renew's error answer over the socket is the error HTTP would give", async () => {
  const { clock, server, lease } = setup();
  await lease.start();
  server.takeoverBy("t-other");
  await clock.advance(15000);
  assert.equal(renews(server).at(-1).via, "socket");
  assert.equal(lease.role, "viewer", "LEASE_LOST over the socket ends the tab's control");
  await lease.stop({ release: false });
});

test("a 401 over the socket asks getToken for a fresh token, sent in a new auth message", async () => {
  const { clock, server, lease } = setup();
  await lease.start();
  await clock.advance(15000);
  server.rejectToken = "token-1"; // expired on the server
  await clock.advance(15000);
  const [s] = server.sockets;
  // The socket accepted token-1 before: the renew is 401; token-2 is then sent first.
  assert.deepEqual(s.sent.map((m) => m.op + (m.token ? ":" + m.token : "")), ["auth:token-1", "renew", "renew", "auth:token-2", "renew"]);
  assert.equal(renews(server).length, 3);
  assert.ok(renews(server).every((c) => c.via === "socket"));
  assert.equal(renews(server)[2].headers.Authorization, "Bearer token-2");
  assert.equal(lease.role, "owner");
  await lease.stop({ release: false });
});

test("a socket that cannot open leaves renews to HTTP, and is tried again later", async () => {
  const { clock, server, lease } = setup();
  server.socketBehaviour = "refused";
  await lease.start();
  await clock.advance(15000);
  assert.equal(renews(server).length, 1);
  assert.equal(renews(server)[0].via, "http");
  await clock.advance(15000);
  assert.equal(server.sockets.length, 1, "no new socket before the retry delay");
  assert.equal(renews(server)[1].via, "http");
  server.socketBehaviour = "normal";
  await clock.advance(SOCKET_RETRY_MS);
  assert.ok(server.sockets.length >= 2);
  assert.equal(renews(server).at(-1).via, "socket");
  assert.equal(lease.role, "owner");
  await lease.stop({ release: false });
});

test("a renew the socket closed on is made over HTTP at once", async () => {
  const { clock, server, lease } = setup();
  await lease.start();
  await clock.advance(15000);
  assert.equal(renews(server)[0].via, "socket");
  const release = server.hold("POST /lease/renew");
  clock.advance(15000);
  await flush();
  server.closeSockets(1001); // the instance shuts down with the renew on its way
  release();
  await clock.advance(0);
  const r = renews(server);
  assert.equal(r.at(-1).via, "http", "made again over HTTP");
  assert.equal(lease.role, "owner");
  // The next renew opens a new socket.
  await clock.advance(15000);
  assert.equal(server.sockets.length, 2);
  assert.equal(renews(server).at(-1).via, "socket");
  await lease.stop({ release: false });
});

test("a frozen page keeps its socket; one the server closed meanwhile is replaced; leaving the page closes it", async () => {
  const { clock, server, lease } = setup();
  await lease.start();
  await clock.advance(15000);
  const [s] = server.sockets;
  assert.equal(s.readyState, 1);
  lease._document.dispatchEvent(new Event("freeze"));
  await flush();
  assert.equal(s.readyState, 1, "freeze keeps it");
  lease._document.dispatchEvent(new Event("resume"));
  await clock.advance(0);
  assert.equal(server.sockets.length, 1);
  assert.equal(renews(server).at(-1).via, "socket", "the renew after resume goes over it");
  lease._document.dispatchEvent(new Event("freeze"));
  server.closeSockets(1000); // idle while the page was frozen
  lease._document.dispatchEvent(new Event("resume"));
  await clock.advance(0);
  assert.equal(server.sockets.length, 2, "the renew after resume opens another");
  assert.equal(renews(server).at(-1).via, "socket");
  lease._window.dispatchEvent(Object.assign(new Event("pagehide"), { persisted: true }));
  await flush();
  assert.equal(server.sockets[1].readyState, 3, "pagehide closes it");
  assert.equal(lease._api.socket.usable(), false, "and none is opened while the page is away");
  lease._window.dispatchEvent(new Event("pageshow"));
  await clock.advance(15000);
  assert.equal(server.sockets.length, 3, "back from the cache, the next renew opens one");
  assert.equal(renews(server).at(-1).via, "socket");
  await lease.stop({ release: false });
});

test("a client stopped while its page was away and started again renews over a socket", async () => {
  const { clock, server, lease } = setup();
  await lease.start();
  lease._window.dispatchEvent(Object.assign(new Event("pagehide"), { persisted: true }));
  await lease.stop({ release: false });
  await lease.start();
  await clock.advance(15000);
  assert.equal(renews(server).at(-1).via, "socket");
  await lease.stop({ release: false });
});

test("socket: false keeps every call on HTTP", async () => {
  const { clock, server, lease } = setup({ lease: { socket: false } });
  await lease.start();
  await clock.advance(15000);
  assert.equal(server.sockets.length, 0);
  assert.equal(renews(server)[0].via, "http");
  await lease.stop({ release: false });
});

test("a guarded mutation's check goes over the socket", async () => {
  const { clock, server, lease } = setup();
  await lease.start();
  await clock.advance(15000); // the socket opens with the first renew
  lease._document.dispatchEvent(new Event("freeze"));
  lease._document.dispatchEvent(new Event("resume"));
  await clock.advance(0);
  const run = lease.guard(async () => "done")();
  await clock.advance(0);
  assert.equal(await run, "done");
  const checks = server.callsTo("POST", "/lease/check");
  const confirmations = [...checks, ...renews(server)].filter((c) => c.at >= 16000);
  assert.ok(confirmations.length > 0 && confirmations.every((c) => c.via === "socket"), "confirmed over the socket");
  await lease.stop({ release: false });
});

test("an auth message the socket refuses leaves the call to HTTP and the socket closed", async () => {
  const { clock, server, lease } = setup();
  await lease.start();
  server.rejectToken = "token-1";
  await clock.advance(15000);
  const [s, s2] = server.sockets;
  assert.deepEqual(s.sent.map((m) => m.op), ["auth", "renew"]);
  assert.equal(s.readyState, 3);
  // The 401 of HTTP asks for token-2, which a new socket carries.
  assert.deepEqual(renews(server).map((c) => [c.via, c.headers.Authorization]), [["http", "Bearer token-1"], ["socket", "Bearer token-2"]]);
  assert.deepEqual(s2.sent.map((m) => m.op + ":" + (m.token ?? "")), ["auth:token-2", "renew:"]);
  assert.equal(lease.role, "owner");
  await lease.stop({ release: false });
});

for (const [behaviour, what] of [
  ["hang", "a socket whose handshake is never answered"],
  ["error", "a socket the page's CSP forbids (an error, and no close)"],
  ["silent", "a socket that opens and never answers"],
]) {
  test(`${what} costs a renew half its time, not the lease: HTTP makes it, and carries the next ones`, async () => {
    const { clock, server, lease } = setup();
    const errors = [];
    lease.on("error", ({ error }) => errors.push(error));
    await lease.start();
    server.socketBehaviour = behaviour;
    const epoch = lease.epoch;
    await clock.advance(15000); // the renew is due; it waits for the socket at most 5 s
    await clock.advance(5000);
    assert.deepEqual(renews(server).map((c) => c.via), ["http"], "made over HTTP within its deadline");
    assert.equal(lease.role, "owner");
    assert.equal(lease.epoch, epoch);
    await clock.advance(30000);
    assert.deepEqual(renews(server).map((c) => c.via), ["http", "http", "http"], "HTTP carries the next renews");
    assert.equal(server.sockets.length, 1, "no other socket is tried meanwhile");
    assert.deepEqual(errors, [], "no error event: every renew was answered");
    assert.equal(lease.epoch, epoch);
    await lease.stop({ release: false });
  });
}

test("calls that share a socket which fails to open all go over HTTP", async () => {
  const { clock, server, lease } = setup();
  await lease.start();
  server.socketBehaviour = "hang";
  const errors = [];
  lease.on("error", ({ error }) => errors.push(error));
  const a = lease.check();
  const b = lease.check();
  await clock.advance(6000);
  assert.equal(await a, true);
  assert.equal(await b, true);
  assert.deepEqual(server.callsTo("POST", "/lease/check").map((c) => c.via), ["http", "http"]);
  assert.equal(lease.role, "owner");
  assert.deepEqual(errors, []);
  await lease.stop({ release: false });
});

test("a socket that opens and never answers is given up for a minute, then two: the wait doubles until one answers", async () => {
  const { clock, server, lease } = setup();
  await lease.start();
  server.socketBehaviour = "silent";
  const tried = () => server.sockets.map((s) => Math.round(s.openedAt / 1000));
  // Renews every 15 s; a socket tried at a renew and given up 5 s later (half its time).
  await clock.advance(240000);
  const t = tried();
  assert.equal(t.length, 3, `sockets tried at ${t} s`);
  assert.ok(t[1] - t[0] >= 65 && t[1] - t[0] <= 80, `a minute after the first gave up: ${t} s`);
  assert.ok(t[2] - t[1] >= 125 && t[2] - t[1] <= 140, `then two: ${t} s`);
  assert.ok(renews(server).every((c) => c.via === "http"));
  assert.equal(lease.role, "owner");
  await lease.stop({ release: false });
});
