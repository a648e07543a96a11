'use strict';
// Permits through the middlewares, in real servers (Express; node:http driving a fetch-style
// handler as server adapters do) against the real daemon: `slots` is a concurrency policy of one
// permit per tenant whose `permit_ttl` is an hour (tests/deploy/clients.rs adds it to the shipped
// policies), so a slot that comes back within the test came back by a release. Each path of a
// request is one scenario on a tenant of its own: the slot is seen held while the request runs
// and free after it, asked of the daemon (a dry run: 200 while free, 429 while held); the
// middleware's client counts its releases (exactly one, answered `released: true`).

const test = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const net = require('node:net');

const { Client, CLOSED, sluice, withSluice } = require('..');
const { loadExpress } = require('./support/express');

const env = process.env;
const STORE = env.SLUICE_TEST_STORE || 'memory';
const RUN = env.SLUICE_TEST_RUN || String(process.pid);
const T = 5000;
/** How long a streamed answer lasts when nobody stops it (chunks of 1 KiB every 10 ms). */
const STREAM_CHUNKS = 800;
const express = loadExpress();
const sleep = (ms) => new Promise((resolve) => { setTimeout(resolve, ms); });

const daemon = new Client({ url: env.SLUICE_TEST_URL, timeoutMs: T });
test.after(() => daemon.close());

async function free(tenant) {
  const answer = await daemon.check({ policy: 'slots', descriptors: { tenant }, dryRun: true });
  assert.ok([200, 429].includes(answer.status), JSON.stringify(answer));
  return answer.status === 200;
}

async function eventually(what, predicate, timeoutMs = T) {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await predicate()) return;
    await sleep(20);
  }
  throw new Error(`not within ${timeoutMs} ms: ${what}`);
}

/** A loopback port nothing listens on. */
async function closedPort() {
  const server = net.createServer();
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/** A real client that records each release's `released` (or its error); `fail` releases through
 * a port nothing listens on. */
class CountingClient extends Client {
  constructor(options, dead = null) {
    super(options);
    this.releases = [];
    this.dead = dead;
  }

  async release(permit) {
    try {
      const answer = await (this.dead ? this.dead.release(permit) : super.release(permit));
      this.releases.push(answer.body.released);
      return answer;
    } catch (error) {
      this.releases.push(error);
      throw error;
    }
  }
}

const route = (tenantOf) => (request) => ({ policy: 'slots', descriptors: { tenant: tenantOf(request) }, onUnreachable: CLOSED });

/** One scenario's state: the gate its handler waits on, the paths whose handler ended, the logs. */
function scenario(t) {
  let open;
  const state = {
    gate: new Promise((resolve) => { open = resolve; }),
    finished: new Set(),
    warnings: [],
  };
  state.open = open;
  state.log = { warn: (line) => state.warnings.push(line), error: (line) => state.warnings.push(line) };
  t.after(open);
  return state;
}

async function listen(server, t) {
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.after(() => {
    server.closeAllConnections();
    return new Promise((resolve) => server.close(resolve));
  });
  return server.address().port;
}

async function countingClient(t, fail) {
  const dead = fail ? new Client({ url: `127.0.0.1:${await closedPort()}`, timeoutMs: T }) : null;
  const client = new CountingClient({ url: env.SLUICE_TEST_URL, timeoutMs: T }, dead);
  t.after(() => { client.close(); if (dead) dead.close(); });
  return client;
}

/** Express: the timeout is the application's middleware in front (504 after 1 s). */
async function serveExpress(t, state, client) {
  const app = express();
  app.set('env', 'test'); // the thrown error is answered 500 without a trace on stderr
  app.use((req, res, next) => {
    if (req.path !== '/slow') return next();
    const timer = setTimeout(() => { if (!res.headersSent) res.status(504).end('timeout'); }, 1000);
    res.once('close', () => clearTimeout(timer));
    return next();
  });
  app.use(sluice({ client, log: state.log, route: route((req) => req.query.t) }));
  app.get('/ok', async (req, res) => {
    await state.gate;
    res.write('one,');
    res.write('two,');
    res.end('three');
    state.finished.add('/ok');
  });
  app.get('/throw', async () => {
    await state.gate;
    state.finished.add('/throw');
    throw new Error('the handler failed');
  });
  app.get('/slow', async () => {
    await state.gate; // never answers: the timeout does
  });
  app.get('/stream', async (req, res) => {
    res.writeHead(200, { 'content-type': 'text/plain' });
    // Writes on whether anyone reads or not.
    let over = false;
    state.gate.then(() => { over = true; }); // the scenario is over
    for (let n = 0; n < STREAM_CHUNKS && !over; n++) {
      res.write('chunk'.repeat(200));
      await sleep(10);
    }
    res.end();
    if (!over) state.finished.add('/stream');
  });
  return listen(http.createServer(app), t);
}

/** A fetch-style handler behind withSluice, driven by node:http as server adapters do: the
 * request's signal aborts when the client leaves, the body is cancelled when it cannot be sent. */
async function serveFetch(t, state, client) {
  async function handler(request) {
    const path = new URL(request.url).pathname;
    if (path === '/slow') {
      const signal = AbortSignal.timeout(1000);
      await new Promise((resolve, reject) => {
        signal.addEventListener('abort', () => reject(signal.reason));
        state.gate.then(resolve);
      });
    }
    if (path === '/stream') {
      let n = 0;
      return new Response(new ReadableStream({
        async pull(controller) {
          if (n++ === STREAM_CHUNKS) {
            state.finished.add(path);
            controller.close();
            return;
          }
          await sleep(10);
          controller.enqueue(new TextEncoder().encode('chunk'.repeat(200)));
        },
      }));
    }
    await state.gate;
    if (path === '/throw') {
      state.finished.add(path);
      throw new Error('the handler failed');
    }
    state.finished.add(path);
    const parts = ['one,', 'two,', 'three'];
    return new Response(new ReadableStream({
      pull(controller) {
        if (parts.length) controller.enqueue(new TextEncoder().encode(parts.shift()));
        else controller.close();
      },
    }));
  }
  const limited = withSluice(handler, { client, log: state.log, route: route((request) => new URL(request.url).searchParams.get('t')) });
  const server = http.createServer(async (req, res) => {
    const aborted = new AbortController();
    res.once('close', () => { if (!res.writableFinished) aborted.abort(); });
    let response;
    try {
      response = await limited(new Request(`http://app${req.url}`, { method: req.method, signal: aborted.signal }));
    } catch (error) {
      res.statusCode = error && error.name === 'TimeoutError' ? 504 : 500;
      res.end('failed');
      return;
    }
    res.writeHead(response.status, Object.fromEntries(response.headers));
    if (!response.body) {
      res.end();
      return;
    }
    const reader = response.body.getReader();
    res.once('close', () => { if (!res.writableFinished) reader.cancel().catch(() => {}); });
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        if (res.destroyed) return;
        res.write(value);
      }
      res.end();
    } catch {
      res.destroy();
    }
  });
  return listen(server, t);
}

function get(port, path) {
  return new Promise((resolve) => {
    const request = http.get({ host: '127.0.0.1', port, path, agent: false, timeout: 3 * T }, (response) => {
      const chunks = [];
      response.on('data', (chunk) => chunks.push(chunk));
      response.on('end', () => resolve({ status: response.statusCode, body: Buffer.concat(chunks).toString() }));
      response.on('error', (error) => resolve({ error }));
    });
    request.on('error', (error) => resolve({ error }));
  });
}

const servers = { express: serveExpress, fetch: serveFetch };

/** Serves, asks `path`, and (with `held`) waits until the daemon holds the tenant's slot. */
async function start(t, kind, path, { fail = false, held = true } = {}) {
  const state = scenario(t);
  const client = await countingClient(t, fail);
  const port = await servers[kind](t, state, client);
  const tenant = `${path.slice(1)}-${kind}-${STORE}-${RUN}`;
  assert.ok(await free(tenant), 'the slot is free before the request');
  const outcome = get(port, `${path}?t=${encodeURIComponent(tenant)}`);
  if (held) await eventually('the slot held while the request runs', async () => !(await free(tenant)));
  return { state, client, tenant, outcome, port };
}

/** Serves, and asks `path` on a socket of its own, left open (the tenant's slot free before). */
async function rawGet(t, kind, path, name) {
  const state = scenario(t);
  const client = await countingClient(t, false);
  const port = await servers[kind](t, state, client);
  const tenant = `${name}-${kind}-${STORE}-${RUN}`;
  assert.ok(await free(tenant), 'the slot is free before the request');
  const socket = net.connect(port, '127.0.0.1');
  socket.write(`GET ${path}?t=${tenant} HTTP/1.1\r\nHost: app\r\n\r\n`);
  return { state, client, tenant, socket };
}

async function releasedOnce(client, tenant) {
  await eventually('the slot back', () => free(tenant));
  await eventually('one release', async () => client.releases.length === 1);
  await sleep(100); // a second release would show now
  assert.deepEqual(client.releases, [true], 'released exactly once, and it gave the slot back');
}

for (const kind of ['express', 'fetch']) {
  const skip = kind === 'express' && !express && 'express is not installed (CI installs it)';

  test(`permit: ${kind} releases when the answer is sent`, { skip }, async (t) => {
    const { state, client, tenant, outcome } = await start(t, kind, '/ok');
    state.open();
    assert.deepEqual(await outcome, { status: 200, body: 'one,two,three' });
    await releasedOnce(client, tenant);
  });

  test(`permit: ${kind} releases when the handler throws`, { skip }, async (t) => {
    const { state, client, tenant, outcome } = await start(t, kind, '/throw');
    state.open();
    assert.equal((await outcome).status, 500);
    await releasedOnce(client, tenant);
  });

  test(`permit: ${kind} releases on a timeout`, { skip }, async (t) => {
    const { client, tenant, outcome } = await start(t, kind, '/slow', { held: false });
    assert.equal((await outcome).status, 504);
    await releasedOnce(client, tenant);
  });

  test(`permit: ${kind} releases when the client disconnects mid-stream`, { skip }, async (t) => {
    const { state, client, tenant, socket } = await rawGet(t, kind, '/stream', 'stream');
    await new Promise((resolve, reject) => {
      let seen = '';
      socket.on('data', (data) => {
        seen += data.toString('latin1');
        if (seen.includes('chunk')) resolve();
      });
      socket.on('error', reject);
      setTimeout(() => reject(new Error('no stream')), T);
    });
    assert.equal(await free(tenant), false, 'held while the stream runs');
    socket.resetAndDestroy(); // abandoned mid-stream
    await releasedOnce(client, tenant);
    assert.ok(!state.finished.has('/stream'), 'given back when the client left, not when the stream would have ended');
  });

  test(`permit: ${kind} releases when the client leaves before the answer`, { skip }, async (t) => {
    const { state, client, tenant, socket } = await rawGet(t, kind, '/ok', 'gone');
    socket.on('error', () => {});
    await eventually('the slot held while the handler waits', async () => !(await free(tenant)));
    socket.resetAndDestroy();
    await releasedOnce(client, tenant);
    assert.ok(!state.finished.has('/ok'), 'given back when the client left, not when the handler ended');
    // The handler goes on and ends; that releases nothing more.
    state.open();
    await eventually('the handler ended', async () => state.finished.has('/ok'));
    await sleep(100);
    assert.deepEqual(client.releases, [true]);
  });

  test(`permit: ${kind} logs a release that fails and answers whole`, { skip }, async (t) => {
    const { state, client, tenant, outcome } = await start(t, kind, '/ok', { fail: true });
    state.open();
    assert.deepEqual(await outcome, { status: 200, body: 'one,two,three' });
    await eventually('the release tried', async () => client.releases.length === 1);
    assert.equal(client.releases[0].name, 'SluiceError');
    await eventually('the failure logged', async () => state.warnings.some((line) => line.includes('release failed')));
    assert.equal(await free(tenant), false, 'nothing given back: held until its permit_ttl');
  });
}

test('permit: Client.release gives the slot back once', async () => {
  const tenant = `plain-${STORE}-${RUN}`;
  const first = await daemon.check({ policy: 'slots', descriptors: { tenant } });
  assert.equal(first.status, 200, JSON.stringify(first));
  assert.equal(typeof first.body.permit, 'string');
  assert.equal((await daemon.check({ policy: 'slots', descriptors: { tenant } })).status, 429);
  const released = await daemon.release(first.body.permit);
  assert.deepEqual([released.status, released.body], [200, { released: true, policies: ['slots'] }]);
  assert.equal((await daemon.release(first.body.permit)).body.released, false);
  const bad = await daemon.release('not-a-permit');
  assert.deepEqual([bad.status, bad.body.error], [400, 'bad_permit']);
});
