'use strict';
// trustedProxies(): the client's address from the socket peer and the proxies' header, walked
// from the right; and through a real Express server and a real daemon (SLUICE_TEST_URL), set up
// as docs/api.md says ('trust proxy' left off, clientAddress(req, proxies)): a client rotating
// X-Forwarded-For gets 10 of 15 logins, two clients behind one trusted proxy 10 each. Clients
// connect from loopback addresses of their own (127.48.3.x) so each scenario has its partition.

const test = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');

const { Client, CLOSED, sluice, trustedProxies, clientAddress, parseAddress } = require('..');
const { loadExpress } = require('./support/express');

const xff = (value) => ({ 'x-forwarded-for': value });

test('trusting nothing, the peer is the client whatever the header', () => {
  const proxies = trustedProxies();
  const seen = new Set();
  for (let n = 0; n < 20; n++) seen.add(proxies.clientAddress('198.51.100.9', xff(`203.0.113.${n}`)));
  assert.deepEqual([...seen], ['198.51.100.9']);
  assert.equal(clientAddress({ socket: { remoteAddress: '::ffff:198.51.100.9' }, headers: xff('1.2.3.4') }), '198.51.100.9');
});

test('behind trusted proxies the rightmost untrusted entry is the client', () => {
  const proxies = trustedProxies({ trusted: ['10.0.0.0/8'] });
  assert.equal(proxies.clientAddress('10.0.0.5', xff('1.1.1.1, 203.0.113.7')), '203.0.113.7');
  assert.equal(proxies.clientAddress('10.0.0.5', { 'x-forwarded-for': ['1.1.1.1, 203.0.113.7', '10.1.2.3'] }), '203.0.113.7');
  assert.equal(proxies.clientAddress('198.51.100.1', xff('203.0.113.7')), '198.51.100.1');
  assert.equal(proxies.clientAddress('10.0.0.5', {}), '10.0.0.5');
  assert.equal(proxies.clientAddress('10.0.0.5', xff('junk, 10.9.9.9')), '10.9.9.9');
  const hops = trustedProxies({ hops: 2 });
  assert.equal(hops.clientAddress('192.0.2.1', xff('1.1.1.1, 203.0.113.7, 192.0.2.9')), '203.0.113.7');
  assert.equal(trustedProxies({ hops: 1 }).clientAddress('192.0.2.1', new Headers(xff('1.1.1.1, 203.0.113.7'))), '203.0.113.7');
  const forwarded = trustedProxies({ trusted: ['127.0.0.1/32', '::1/128'], header: 'forwarded' });
  assert.equal(forwarded.clientAddress('::1', { forwarded: 'for=1.1.1.1, for="[2001:db8::7]:4711";proto=https' }), '2001:db8::7');
  assert.equal(forwarded.clientAddress('127.0.0.1', { forwarded: 'for=unknown' }), '127.0.0.1');
  assert.equal(trustedProxies({ trusted: ['unix'] }).clientAddress(undefined, xff('203.0.113.7')), '203.0.113.7');
  assert.equal(trustedProxies().clientAddress(undefined, xff('203.0.113.7')), null);
  assert.equal(parseAddress('_hidden'), null);
  assert.throws(() => trustedProxies({ trusted: ['10.0.0.0/33'] }), TypeError);
  assert.throws(() => trustedProxies({ trusted: '10.0.0.0/8' }), TypeError);
  assert.throws(() => trustedProxies({ trusted: ['10.0.0.0/8'], hops: 1 }), TypeError);
});

const express = loadExpress();

async function logins(port, source, forwarded, count = 15) {
  const statuses = [];
  for (let n = 0; n < count; n++) {
    statuses.push(await new Promise((resolve, reject) => {
      const request = http.request({ host: '127.0.0.1', port, localAddress: source, method: 'POST', path: '/login', headers: { 'x-forwarded-for': forwarded(n) }, agent: false }, (response) => {
        response.resume();
        response.on('end', () => resolve(response.statusCode));
      });
      request.on('error', reject);
      request.end();
    }));
  }
  return statuses;
}

async function serveExpress(proxies, t) {
  const app = express();
  const client = new Client({ url: process.env.SLUICE_TEST_URL, timeoutMs: 5000 });
  app.use(sluice({ client, route: (req) => (req.path === '/login' ? { policy: 'login', descriptors: { ip: clientAddress(req, proxies) }, onUnreachable: CLOSED } : null) }));
  app.post('/login', (req, res) => res.send('welcome'));
  const server = http.createServer(app);
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.after(() => {
    client.close();
    server.closeAllConnections();
    return new Promise((resolve) => server.close(resolve));
  });
  return server.address().port;
}

const count = (statuses) => [statuses.filter((s) => s === 200).length, statuses.filter((s) => s === 429).length];

test('real Express server: rotating X-Forwarded-For from an untrusted peer keeps one partition', { skip: !express && 'express is not installed (CI installs it)' }, async (t) => {
  const port = await serveExpress(trustedProxies(), t);
  const statuses = await logins(port, '127.48.3.1', (n) => `203.0.113.${n}`);
  assert.deepEqual(count(statuses), [10, 5], String(statuses));
});

test('real Express server: clients behind one trusted proxy get a partition each', { skip: !express && 'express is not installed (CI installs it)' }, async (t) => {
  const port = await serveExpress(trustedProxies({ trusted: ['127.48.0.0/16'] }), t);
  for (const client of ['192.0.2.31', '192.0.2.32']) {
    const statuses = await logins(port, '127.48.3.2', (n) => `198.51.100.${n}, ${client}`);
    assert.deepEqual(count(statuses), [10, 5], `${client}: ${statuses}`);
  }
});
