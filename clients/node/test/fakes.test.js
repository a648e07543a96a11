'use strict';
// The client and middleware against fake daemons (node:net servers) that misbehave as a real one
// or the network can: close after reading a check, answer 429 (a hook shapes it), or be absent
// (every decision made without the sidecar counted, one log line per interval, Retry-After).

const test = require('node:test');
const assert = require('node:assert/strict');
const net = require('node:net');
const os = require('node:os');
const path = require('node:path');
const http = require('node:http');

const { Client, SluiceError, sluice, withSluice, CLOSED } = require('..');

const OK_BODY = '{"allowed":true,"policy":"login","limit":10,"remaining":9}';
const OK = `HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-ratelimit-remaining: 9\r\ncontent-length: ${OK_BODY.length}\r\n\r\n${OK_BODY}`;
const DENIED_BODY = '{"allowed":false,"error":"rate_limit","retry_after_sec":7}';
const DENIED = `HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nretry-after: 7\r\ncontent-length: ${DENIED_BODY.length}\r\n\r\n${DENIED_BODY}`;
const MISSING_SOCKET = path.join(os.tmpdir(), `sluice-fake-missing-${process.pid}.sock`);

/** A server on 127.0.0.1 calling `answer(socket, n)` for the n-th whole request of a connection. */
async function fakeDaemon(answer) {
  const state = { requests: 0 };
  const server = net.createServer((socket) => {
    let data = Buffer.alloc(0);
    let n = 0;
    socket.on('error', () => {});
    socket.on('data', (chunk) => {
      data = Buffer.concat([data, chunk]);
      for (;;) {
        const end = data.indexOf('\r\n\r\n');
        if (end < 0) return;
        const length = Number((/content-length: *(\d+)/i.exec(data.subarray(0, end).toString()) || [0, 0])[1]);
        if (data.length < end + 4 + length) return;
        data = data.subarray(end + 4 + length);
        state.requests += 1;
        answer(socket, n);
        n += 1;
      }
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  state.url = `http://127.0.0.1:${server.address().port}`;
  state.close = () => new Promise((resolve) => server.close(resolve));
  return state;
}

const closes = {
  fin: (socket) => socket.end(),
  rst: (socket) => socket.resetAndDestroy(),
  partial: (socket) => socket.end('HTTP/1.1 2'),
};

for (const [name, close] of Object.entries(closes)) {
  test(`a check the daemon read is never sent twice (${name} after reading)`, async () => {
    const daemon = await fakeDaemon((socket, n) => (n === 0 ? socket.write(OK) : close(socket)));
    const client = new Client({ url: daemon.url, timeoutMs: 2000 });
    try {
      assert.equal((await client.check({ policy: 'login', descriptors: { ip: 'x' } })).status, 200);
      await assert.rejects(client.check({ policy: 'login', descriptors: { ip: 'x' } }), SluiceError);
      assert.equal(daemon.requests, 2, 'one request per call');
    } finally {
      client.close();
      await daemon.close();
    }
  });
}

const quietCounter = () => {
  const lines = [];
  return { lines, warn: (line) => lines.push(line), error: (line) => lines.push(line) };
};

/** Runs `handler` (Connect-style) in a real node:http server for `count` requests. */
async function throughExpressStyle(middleware, count) {
  const server = http.createServer((req, res) => middleware(req, res, () => res.end('served')));
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const out = [];
  try {
    for (let n = 0; n < count; n++) {
      const response = await fetch(`http://127.0.0.1:${server.address().port}/login`, { method: 'POST' });
      out.push({ status: response.status, retryAfter: response.headers.get('retry-after'), contentType: response.headers.get('content-type'), body: await response.text() });
    }
  } finally {
    await new Promise((resolve) => server.close(resolve));
  }
  return out;
}

const login = () => ({ policy: 'login', descriptors: { ip: '192.0.2.1' }, onUnreachable: CLOSED });

test('every decision without the sidecar is counted by the hook and logged once per interval', async () => {
  const seen = [];
  const log = quietCounter();
  const middleware = sluice({
    route: login, client: new Client({ socket: MISSING_SOCKET, timeoutMs: 500 }), log,
    onFallback: (check, error) => seen.push([check.policy, error.name]), logIntervalMs: 3600000,
  });
  const answers = await throughExpressStyle(middleware, 5);
  assert.deepEqual(answers.map((a) => [a.status, a.retryAfter]), Array(5).fill([503, '1']));
  assert.deepEqual(seen, Array(5).fill(['login', 'SluiceError']));
  assert.equal(middleware.watch.count, 5);
  assert.equal(log.lines.length, 1, `one line per interval: ${log.lines}`);

  const fetchSeen = [];
  const limited = withSluice(async () => new Response('served'), {
    route: login, client: new Client({ socket: MISSING_SOCKET, timeoutMs: 500 }), log: quietCounter(),
    onFallback: () => fetchSeen.push(1),
  });
  for (let n = 0; n < 3; n++) {
    const response = await limited(new Request('http://app/login', { method: 'POST' }));
    assert.deepEqual([response.status, response.headers.get('retry-after')], [503, '1']);
  }
  assert.equal(fetchSeen.length, 3);
});

test('a denial can be shaped by the onDenied hook', async () => {
  const daemon = await fakeDaemon((socket) => socket.write(DENIED));
  const client = new Client({ url: daemon.url, timeoutMs: 2000 });
  try {
    const html = (check, answer) => ({ status: 429, headers: { 'content-type': 'text/html', 'retry-after': answer.headers['retry-after'] }, body: '<p>slow down</p>' });
    const [shaped] = await throughExpressStyle(sluice({ route: login, client, onDenied: html }), 1);
    assert.deepEqual(shaped, { status: 429, retryAfter: '7', contentType: 'text/html', body: '<p>slow down</p>' });
    const [plain] = await throughExpressStyle(sluice({ route: login, client }), 1);
    assert.deepEqual([plain.status, JSON.parse(plain.body)], [429, { error: 'rate_limit', retry_after_sec: 7 }]);
  } finally {
    client.close();
    await daemon.close();
  }
});

test('an interim 100 Continue is skipped; an oversized header, a trickle and garbage are SluiceErrors', async () => {
  const cases = [
    ['continue', (socket) => socket.write(`HTTP/1.1 100 Continue\r\n\r\n${OK}`), 200],
    ['oversized header', (socket) => socket.write(`HTTP/1.1 200 OK\r\nx-pad: ${'a'.repeat(70 * 1024)}\r\ncontent-length: 2\r\n\r\n{}`), null],
    ['garbage', (socket) => socket.end('SMTP ready\r\n\r\n'), null],
    ['short body', (socket) => socket.end('HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\n{}'), null],
    ['not an object', (socket) => socket.end('HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n[]'), null],
    ['trickle', (socket) => {
      let at = 0;
      const timer = setInterval(() => {
        if (at >= OK.length || socket.destroyed) return clearInterval(timer);
        socket.write(OK[at]);
        at += 1;
      }, 200);
      socket.on('close', () => clearInterval(timer));
    }, null],
  ];
  for (const [name, answer, status] of cases) {
    const daemon = await fakeDaemon(answer);
    const client = new Client({ url: daemon.url, timeoutMs: 1000 });
    const started = performance.now();
    try {
      if (status) {
        assert.equal((await client.check({ policy: 'login', descriptors: { ip: 'x' } })).status, status, name);
      } else {
        await assert.rejects(client.check({ policy: 'login', descriptors: { ip: 'x' } }), SluiceError, name);
        // The trickle would take len(OK) * 200 ms (about 30 s): one deadline for the call.
        assert.ok(performance.now() - started < 10000, `${name}: within its deadline`);
      }
    } finally {
      client.close();
      await daemon.close();
    }
  }
});
