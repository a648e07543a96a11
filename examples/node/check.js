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

async function main(argv) {
  let socketPath = process.env.SLUICE_SOCKET;
  let url = new URL(process.env.SLUICE_URL || 'http://127.0.0.1:7070');
  const body = { descriptors: {}, cost: 1, dry_run: false };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === '--socket') socketPath = argv[++i];
    else if (arg === '--url') { url = new URL(argv[++i]); socketPath = undefined; }
    else if (arg === '--policy') body.policy = argv[++i];
    else if (arg === '--cost') body.cost = Number(argv[++i]);
    else if (arg === '--dry-run') body.dry_run = true;
    else if (arg === '-d' || arg === '--descriptor') {
      const pair = argv[++i];
      const at = pair.indexOf('=');
      body.descriptors[pair.slice(0, at)] = pair.slice(at + 1);
    } else {
      console.error(`unknown argument ${arg}`);
      return 64;
    }
  }
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
