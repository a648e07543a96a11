#!/usr/bin/env node
// Ask a sluice daemon whether a request may go through: Node.js, `http` module only.
//
//   node check.js --socket /var/run/sluice/sluice.sock --policy login -d ip=203.0.113.7
//   node check.js --url http://127.0.0.1:7070 -d tenant=acme -d api_key=k1 --cost 5
//
// Defaults come from SLUICE_SOCKET / SLUICE_URL (set by `sluice inject` in every app container).
// Exit code 0 allowed, 1 denied (429), 2 limiter unavailable (503), 64 rejected request (4xx),
// 69 daemon unreachable.
'use strict';

const http = require('node:http');

// One keep-alive agent for the whole process: checks reuse connections.
const agent = new http.Agent({ keepAlive: true, maxSockets: 16 });

/** POST /v1/check; resolves to { status, answer, headers }. */
function check(target, body, timeoutMs = 500) {
  const payload = JSON.stringify(body);
  const where = target.socketPath
    ? { socketPath: target.socketPath, host: 'sluice' }
    : { host: target.url.hostname, port: target.url.port || 80 };
  return new Promise((resolve, reject) => {
    const request = http.request(
      {
        ...where,
        agent,
        method: 'POST',
        path: '/v1/check',
        timeout: timeoutMs,
        headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload) },
      },
      (response) => {
        const chunks = [];
        response.on('data', (chunk) => chunks.push(chunk));
        response.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          resolve({ status: response.statusCode, answer: text ? JSON.parse(text) : {}, headers: response.headers });
        });
      },
    );
    request.on('timeout', () => request.destroy(new Error(`no answer within ${timeoutMs} ms`)));
    request.on('error', reject);
    request.end(payload);
  });
}

/** http://127.0.0.1:7070, 127.0.0.1:7070 or localhost:7070; null when it is not an address. */
function parseUrl(text) {
  try {
    const url = new URL(text.includes('://') ? text : `http://${text}`);
    const ok = url.protocol === 'http:' && url.hostname && url.port && ['', '/'].includes(url.pathname);
    return ok ? url : null;
  } catch {
    return null;
  }
}

async function main(argv) {
  // A usage error exits 64: 1 and 2 mean denied and unavailable.
  const usage = (message) => { console.error(`usage error: ${message}`); return 64; };
  let socketPath = process.env.SLUICE_SOCKET;
  let urlText = process.env.SLUICE_URL || 'http://127.0.0.1:7070';
  const body = { descriptors: {}, cost: 1, dry_run: false };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) throw new Error(`${arg} needs a value`);
      return argv[++i];
    };
    try {
      if (arg === '--socket') socketPath = value();
      else if (arg === '--url') { urlText = value(); socketPath = undefined; }
      else if (arg === '--policy') body.policy = value();
      else if (arg === '--cost') body.cost = Number(value());
      else if (arg === '--dry-run') body.dry_run = true;
      else if (arg === '-d' || arg === '--descriptor') {
        const pair = value();
        const at = pair.indexOf('=');
        if (at < 0) return usage(`descriptor ${pair} is not NAME=VALUE`);
        body.descriptors[pair.slice(0, at)] = pair.slice(at + 1);
      } else {
        return usage(`unknown argument ${arg}`);
      }
    } catch (error) {
      return usage(error.message);
    }
  }
  const url = socketPath ? null : parseUrl(urlText);
  if (!socketPath && !url) return usage(`--url ${urlText} is not an address such as http://127.0.0.1:7070`);
  let reply;
  try {
    reply = await check(socketPath ? { socketPath } : { url }, body);
  } catch (error) {
    // An application chooses here: fail open (serve the request) or closed (refuse it).
    console.error(`sluice unreachable: ${error.message}`);
    return 69;
  } finally {
    agent.destroy();
  }
  const { status, answer, headers } = reply;
  if (status === 200) {
    console.log(`allowed policy=${answer.policy} remaining=${answer.remaining} mode=${answer.mode}`);
    return 0;
  }
  if (status === 429) {
    console.log(`denied policy=${answer.policy} retry_after_sec=${answer.retry_after_sec} retry-after-header=${headers['retry-after']}`);
    return 1;
  }
  if (status === 503) {
    console.log(`unavailable policy=${answer.policy}`);
    return 2;
  }
  console.error(`error ${status}: ${answer.error}: ${answer.reason}`);
  return 64;
}

main(process.argv.slice(2)).then((code) => { process.exitCode = code; });
