'use strict';
// The flags of `sluice check` for check.js (the CLI's, so that the two take one flag set):
// -p/--policy NAME, -d/--descriptor NAME=VALUE (repeatable), --cost N, --dry-run, --socket PATH,
// --url/--http ADDRESS, --json, -h/--help. `-c/--config` (the daemon's settings file) is the CLI's
// alone.

const { parseArgs } = require('node:util');
let parseUrl;
try {
  ({ parseUrl } = require('sluice-ratelimit'));
} catch {
  ({ parseUrl } = require('../../clients/node')); // run from a checkout of the repository
}

/** Exit codes shared with `sluice check`. */
const EXIT = { allowed: 0, denied: 1, unavailable: 2, usage: 64, unreachable: 69 };

/** A bad flag or value (exit 64). */
class UsageError extends Error {
  constructor(message) {
    super(message);
    this.name = 'UsageError';
  }
}

const HELP = `Options:
  -p, --policy NAME            check only this policy
  -d, --descriptor NAME=VALUE  a descriptor, repeatable: -d ip=203.0.113.7
      --cost N                 units to spend (default 1)
      --dry-run                evaluate without spending
      --socket PATH            daemon's Unix socket (default: $SLUICE_SOCKET, else $SLUICE_URL)
      --url, --http URL        daemon's TCP address: http://127.0.0.1:7070, 127.0.0.1:7070 or localhost:7070
      --json                   print the daemon's JSON answer as is
  -h, --help                   print this help`;

/**
 * The options of a check from `argv` (without node and the script): `{ help }` (print `HELP`,
 * exit 0) or `{ policy, descriptors, cost, dryRun, socket, url, json }`; throws UsageError.
 */
function parseCheckArgs(argv) {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      strict: true,
      allowPositionals: false,
      options: {
        policy: { type: 'string', short: 'p' },
        descriptor: { type: 'string', short: 'd', multiple: true },
        cost: { type: 'string' },
        'dry-run': { type: 'boolean' },
        socket: { type: 'string' },
        url: { type: 'string' },
        http: { type: 'string' },
        json: { type: 'boolean' },
        help: { type: 'boolean', short: 'h' },
      },
    }));
  } catch (error) {
    throw new UsageError(error.message);
  }
  if (values.help) return { help: true };
  if (values.url !== undefined && values.http !== undefined) throw new UsageError('--url and --http name the same address: give one');
  const urlText = values.url ?? values.http;
  if (values.socket !== undefined && urlText !== undefined) throw new UsageError('--socket and --url cannot be used together');
  let url;
  if (urlText !== undefined) {
    try {
      url = parseUrl(urlText);
    } catch (error) {
      throw new UsageError(`--url ${error.message}`);
    }
  }
  let cost = 1;
  if (values.cost !== undefined) {
    if (!/^[0-9]+$/.test(values.cost)) throw new UsageError(`--cost ${JSON.stringify(values.cost)} is not a whole number`);
    cost = Number(values.cost);
  }
  const descriptors = {};
  for (const pair of values.descriptor || []) {
    const at = pair.indexOf('=');
    if (at <= 0) throw new UsageError(`descriptor ${JSON.stringify(pair)} is not NAME=VALUE`);
    descriptors[pair.slice(0, at)] = pair.slice(at + 1);
  }
  return {
    help: false,
    policy: values.policy,
    descriptors,
    cost,
    dryRun: Boolean(values['dry-run']),
    socket: values.socket,
    url: url && `http://${url.hostname.includes(':') ? `[${url.hostname}]` : url.hostname}:${url.port}`,
    json: Boolean(values.json),
  };
}

module.exports = { parseCheckArgs, UsageError, HELP, EXIT };
