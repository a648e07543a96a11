#!/usr/bin/env node
// Ask a sluice daemon whether a request may go through, with the sluice-ratelimit library.
//
//   node check.js --socket /var/run/sluice/sluice.sock -p login -d ip=203.0.113.7
//   node check.js --url http://127.0.0.1:7070 -d tenant=acme -d api_key=k1 --cost 5
//
// The flags are `sluice check`'s; defaults come from SLUICE_SOCKET / SLUICE_URL (set by `sluice
// inject` in every app container). Exit code 0 allowed, 1 denied (429), 2 limiter unavailable
// (503), 64 bad usage or rejected request (4xx), 69 daemon unreachable.
'use strict';

let sluice;
try {
  sluice = require('sluice-ratelimit'); // npm install sluice-ratelimit
} catch {
  sluice = require('../../clients/node'); // run from a checkout of the repository
}
const { Client } = sluice;
const { parseCheckArgs, UsageError, HELP, EXIT } = require('./flags');

async function main(argv) {
  let options;
  let client;
  try {
    options = parseCheckArgs(argv);
    if (options.help) {
      console.log(`Usage: check.js [options]\nAsk a sluice daemon whether a request may go through.\n\n${HELP}`);
      return 0;
    }
    // Explicit flags first, then SLUICE_SOCKET, then SLUICE_URL (the client's own defaults).
    client = new Client({ socket: options.socket, url: options.url });
  } catch (error) {
    if (!(error instanceof UsageError || error instanceof TypeError)) throw error;
    console.error(`usage error: ${error.message}`);
    return EXIT.usage;
  }
  let answer;
  try {
    answer = await client.check(options);
  } catch (error) {
    // A middleware chooses here per route: fail open (serve the request) or closed (503).
    console.error(`sluice unreachable: ${error.message}`);
    return EXIT.unreachable;
  } finally {
    client.close();
  }
  const { status, body, headers } = answer;
  if (options.json) console.log(JSON.stringify(body));
  else if (status === 200) console.log(`allowed policy=${body.policy} remaining=${body.remaining} mode=${body.mode}`);
  else if (status === 429) {
    // When to come back: the daemon's own math, also in Retry-After.
    console.log(`denied policy=${body.policy} retry_after_sec=${body.retry_after_sec} retry-after-header=${headers['retry-after']}`);
  } else if (status === 503) console.log(`unavailable policy=${body.policy}`);
  else console.error(`error ${status}: ${body.error}: ${body.reason}`);
  return { 200: EXIT.allowed, 429: EXIT.denied, 503: EXIT.unavailable }[status] ?? EXIT.usage;
}

main(process.argv.slice(2)).then((code) => { process.exitCode = code; });
