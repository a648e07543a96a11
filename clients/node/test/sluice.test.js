'use strict';
// sluice-ratelimit against a real daemon serving the shipped policies (public_api: token bucket,
// burst 150, fail open; login: 10 per 5 min per ip, fail closed). The Rust test
// tests/deploy/clients.rs starts it and sets SLUICE_TEST_URL, SLUICE_TEST_SOCKET (the daemon),
// SLUICE_TEST_STORE (memory or redis), SLUICE_TEST_URL_B (with redis: a second daemon on the same
// Redis), SLUICE_TEST_DOWN_URL (a daemon whose Redis is down) and SLUICE_TEST_RUN (keeps this
// run's partitions apart).

const test = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const os = require('node:os');
const path = require('node:path');

const { Client, SluiceError, sluice, withSluice, CLOSED } = require('..');

const env = process.env;
for (const name of ['SLUICE_TEST_URL', 'SLUICE_TEST_SOCKET', 'SLUICE_TEST_DOWN_URL']) {
  if (!env[name]) throw new Error(`${name} must name a daemon (cargo test --test deploy clients starts them)`);
}
const STORE = env.SLUICE_TEST_STORE || 'memory';
const RUN = env.SLUICE_TEST_RUN || String(process.pid);
const MISSING_SOCKET = path.join(os.tmpdir(), `sluice-missing-${RUN}.sock`);
// Deadline of the tests' calls to a live daemon: generous, for a busy machine (the default is 500 ms).
const T = 5000;
const quiet = { warn() {}, error() {} };

/** A partition of this run alone. */
const ip = (name) => `${name}-${STORE}-${RUN}`;

/** The routes of the test application (the same as the Python and Go tests'). */
function route(get) {
  return (request) => {
    const p = get.path(request);
    if (p === '/login') return { policy: 'login', descriptors: { ip: get.header(request, 'x-test-ip') || '' }, onUnreachable: CLOSED };
    if (p === '/graphql') {
      return get.body(request).then((body) => ({
        policy: 'public_api',
        descriptors: { tenant: 'acme', api_key: get.header(request, 'x-test-key') || '' },
        cost: body.cost ?? 1,
      }));
    }
    if (p === '/broken') return { policy: 'login', descriptors: {} };
    return null;
  };
}

test('checks over the socket and TCP on kept-alive connections', async () => {
  const who = ip('client');
  const overSocket = new Client({ socket: env.SLUICE_TEST_SOCKET , timeoutMs: T });
  const overTcp = new Client({ url: env.SLUICE_TEST_URL , timeoutMs: T });
  try {
    const first = await overSocket.check({ policy: 'login', descriptors: { ip: who } });
    assert.deepEqual([first.status, first.body.remaining, first.body.limit], [200, 9, 10]);
    assert.equal(first.headers['x-ratelimit-remaining'], '9');
    const reused = [];
    for (let n = 0; n < 3; n++) {
      await overTcp.check({ policy: 'login', descriptors: { ip: who }, dryRun: n > 0 });
      reused.push(Object.values(overTcp.agent.freeSockets).flat().length);
    }
    assert.deepEqual(reused, [1, 1, 1], 'one connection, kept alive and reused');
  } finally {
    overSocket.close();
    overTcp.close();
  }
});

test('a denial carries the daemon\'s retry; batch and report', async () => {
  const client = new Client({ url: env.SLUICE_TEST_URL , timeoutMs: T });
  try {
    const who = ip('denied');
    const statuses = [];
    let last;
    for (let n = 0; n < 11; n++) {
      last = await client.check({ policy: 'login', descriptors: { ip: who } });
      statuses.push(last.status);
    }
    assert.deepEqual(statuses, [...Array(10).fill(200), 429]);
    assert.equal(last.body.error, 'rate_limit');
    assert.ok(last.body.retry_after_sec > 0);
    assert.equal(last.headers['retry-after'], String(last.body.retry_after_sec));

    const key = ip('batch');
    const results = await client.batch([
      { policy: 'login', descriptors: { ip: key } },
      { policy: 'public_api', descriptors: { tenant: 'acme', api_key: key }, cost: 50 },
    ]);
    assert.deepEqual(results.map((r) => [r.allowed, r.remaining]), [[true, 9], [true, 100]]);
    const spent = await client.report({ policy: 'public_api', descriptors: { tenant: 'acme', api_key: key }, cost: 200 });
    assert.deepEqual([spent.status, spent.body.within_limit], [200, false]);
    const after = await client.check({ policy: 'public_api', descriptors: { tenant: 'acme', api_key: key } });
    assert.equal(after.status, 429);
  } finally {
    client.close();
  }
});

test('an unreachable daemon is a SluiceError within the deadline', async () => {
  const client = new Client({ socket: MISSING_SOCKET, timeoutMs: 200 });
  await assert.rejects(client.check({ policy: 'login', descriptors: { ip: 'x' } }), SluiceError);
  client.close();
});

// The same scenarios through the Connect/Express middleware (on a real node:http server) and the
// fetch-style wrapper: `call(client, path, headers, body)` -> { status, headers, text }.

async function callExpress(client, urlPath, headers = {}, body = '') {
  const middleware = sluice({
    client,
    log: quiet,
    route: route({
      path: (req) => req.path,
      header: (req, name) => req.headers[name],
      body: async (req) => req.body,
    }),
  });
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      const text = Buffer.concat(chunks).toString();
      req.path = req.url; // what Express sets
      req.body = text ? JSON.parse(text) : {}; // what express.json() sets
      middleware(req, res, (error) => {
        if (error) {
          res.statusCode = 500;
          return res.end(`next(error): ${error.message}`);
        }
        res.setHeader('content-type', 'text/plain');
        return res.end(`served:${text}`);
      });
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  try {
    const response = await fetch(`http://127.0.0.1:${server.address().port}${urlPath}`, {
      method: 'POST', headers, body,
    });
    return { status: response.status, headers: response.headers, text: await response.text() };
  } finally {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
    client.close();
  }
}

async function callFetch(client, urlPath, headers = {}, body = '') {
  const handler = withSluice(
    async (request) => new Response(`served:${await request.text()}`, { headers: { 'content-type': 'text/plain' } }),
    {
      client,
      log: quiet,
      route: route({
        path: (request) => new URL(request.url).pathname,
        header: (request, name) => request.headers.get(name),
        body: async (request) => {
          const text = await request.clone().text();
          return text ? JSON.parse(text) : {};
        },
      }),
    },
  );
  try {
    const response = await handler(new Request(`http://app.example${urlPath}`, { method: 'POST', headers, body }));
    return { status: response.status, headers: response.headers, text: await response.text() };
  } finally {
    client.close();
  }
}

for (const [name, call] of [['express', callExpress], ['fetch', callFetch]]) {
  const tcp = () => new Client({ url: env.SLUICE_TEST_URL , timeoutMs: T });

  test(`${name}: login is denied with the documented 429`, async () => {
    const headers = { 'x-test-ip': ip(`login-${name}`) };
    for (let n = 0; n < 10; n++) {
      const got = await call(tcp(), '/login', headers);
      assert.equal(got.status, 200, got.text);
      assert.equal(got.headers.get('x-ratelimit-remaining'), String(9 - n));
      assert.equal(got.headers.get('retry-after'), null);
    }
    const got = await call(tcp(), '/login', headers);
    assert.equal(got.status, 429);
    const body = JSON.parse(got.text);
    assert.deepEqual(Object.keys(body).sort(), ['error', 'retry_after_sec']);
    assert.equal(body.error, 'rate_limit');
    assert.ok(body.retry_after_sec > 0);
    assert.equal(got.headers.get('retry-after'), String(body.retry_after_sec));
    assert.equal(got.headers.get('x-ratelimit-remaining'), '0');
    assert.equal(got.headers.get('x-ratelimit-limit'), '10');
    assert.ok(got.headers.get('ratelimit'));
    assert.ok(got.headers.get('ratelimit-policy'));
    assert.equal(got.headers.get('content-type'), 'application/json');
  });

  test(`${name}: the cost comes from the request and the body still reaches the app`, async () => {
    const query = JSON.stringify({ query: '{ a b c }', cost: 40 });
    const got = await call(new Client({ socket: env.SLUICE_TEST_SOCKET , timeoutMs: T }), '/graphql',
      { 'x-test-key': ip(`graphql-${name}`) }, query);
    assert.deepEqual([got.status, got.text], [200, `served:${query}`]);
    assert.equal(got.headers.get('x-ratelimit-remaining'), '110');
  });

  test(`${name}: an unreachable sidecar follows the route`, async () => {
    const missing = () => new Client({ socket: MISSING_SOCKET, timeoutMs: 200 });
    let got = await call(missing(), '/login', { 'x-test-ip': 'x' });
    assert.deepEqual([got.status, JSON.parse(got.text)], [503, { error: 'limiter_unavailable' }]);
    got = await call(missing(), '/graphql', { 'x-test-key': 'x' }, '{"cost": 1}');
    assert.deepEqual([got.status, got.text], [200, 'served:{"cost": 1}']);
    got = await call(missing(), '/free');
    assert.deepEqual([got.status, got.text], [200, 'served:']);
  });

  test(`${name}: a fail-closed policy on a store that is down answers 503`, async () => {
    const down = () => new Client({ url: env.SLUICE_TEST_DOWN_URL , timeoutMs: T });
    let got = await call(down(), '/login', { 'x-test-ip': ip(`down-${name}`) });
    assert.deepEqual([got.status, JSON.parse(got.text)], [503, { error: 'limiter_unavailable' }]);
    got = await call(down(), '/graphql', { 'x-test-key': ip(`down-${name}`) }, '{}');
    assert.deepEqual([got.status, got.text], [200, 'served:{}'], 'public_api fails open');
    assert.equal(got.headers.get('x-ratelimit-remaining'), null, 'a fail-open answer carries no quota');
  });

  test(`${name}: a check the daemon rejects is a 500, not an open door`, async () => {
    const got = await call(tcp(), '/broken');
    assert.deepEqual([got.status, JSON.parse(got.text)], [500, { error: 'limiter_rejected' }]);
  });

  test(`${name}: Redis state is shared between daemons`, { skip: STORE !== 'redis' && 'shared state needs Redis' }, async () => {
    assert.ok(env.SLUICE_TEST_URL_B, 'SLUICE_TEST_URL_B names the second daemon on the same Redis');
    const headers = { 'x-test-ip': ip(`shared-${name}`) };
    for (let n = 0; n < 10; n++) assert.equal((await call(tcp(), '/login', headers)).status, 200);
    const got = await call(new Client({ url: env.SLUICE_TEST_URL_B , timeoutMs: T }), '/login', headers);
    assert.deepEqual([got.status, got.headers.get('x-ratelimit-remaining')], [429, '0']);
  });
}
