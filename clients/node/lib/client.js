'use strict';
// A client of the check API over a Unix socket or TCP: a keep-alive agent of its own, a deadline
// per call, the daemon's answer as { status, body, headers }.

const http = require('node:http');

/** Default deadline of one call, in milliseconds (a sidecar answers in well under one). */
const DEFAULT_TIMEOUT_MS = 500;
/** Longest answer read from the daemon (its answers are a few hundred bytes). */
const MAX_ANSWER_BYTES = 1 << 20;
/** The rate-limit headers the daemon sets (lower case), copied onto the application's answers. */
const RATE_LIMIT_HEADERS = ['retry-after', 'x-ratelimit-limit', 'x-ratelimit-remaining',
  'x-ratelimit-reset', 'ratelimit-policy', 'ratelimit'];

/** The daemon could not be asked: unreachable, too slow, or an answer that is not JSON. */
class SluiceError extends Error {
  constructor(message) {
    super(message);
    this.name = 'SluiceError';
  }
}

/**
 * http://127.0.0.1:7070, 127.0.0.1:7070 or localhost:7070 -> { hostname, port }; throws a
 * TypeError otherwise.
 */
function parseUrl(text) {
  let url = null;
  try {
    url = new URL(String(text).includes('://') ? text : `http://${text}`);
  } catch {
    url = null;
  }
  const ok = url && url.protocol === 'http:' && url.hostname && url.port
    && ['', '/'].includes(url.pathname) && !url.search && !url.hash && !url.username;
  if (!ok) throw new TypeError(`${JSON.stringify(String(text))} is not an address such as http://127.0.0.1:7070`);
  return { hostname: url.hostname.replace(/^\[|\]$/g, ''), port: Number(url.port) };
}

/** The body of POST /v1/check from a check ({ descriptors, policy, cost, dryRun }). */
function checkBody(check) {
  const body = { descriptors: check.descriptors || {}, cost: check.cost ?? 1, dry_run: Boolean(check.dryRun) };
  if (check.policy) body.policy = check.policy;
  return body;
}

class Client {
  /**
   * `socket` (a Unix socket path) or `url`; without either, SLUICE_SOCKET, then SLUICE_URL, then
   * http://127.0.0.1:7070 (the order of `sluice check`). `timeoutMs` bounds each call whole.
   */
  constructor({ socket, url, timeoutMs = DEFAULT_TIMEOUT_MS, maxSockets = 16 } = {}) {
    if (socket && url) throw new TypeError('give a socket or a url, not both');
    if (!socket && !url) {
      if (process.env.SLUICE_SOCKET) socket = process.env.SLUICE_SOCKET;
      else url = process.env.SLUICE_URL || 'http://127.0.0.1:7070';
    }
    this.where = socket ? { socketPath: socket, host: 'sluice' } : parseUrl(url);
    this.timeoutMs = timeoutMs;
    this.agent = new http.Agent({ keepAlive: true, maxSockets, maxFreeSockets: maxSockets });
  }

  /** POST /v1/check: resolves to { status, body, headers }; rejects with SluiceError. */
  check(check) {
    return this.call('/v1/check', checkBody(check));
  }

  /** POST /v1/report: spend a cost known only afterwards (an LLM's tokens). */
  report(check) {
    return this.call('/v1/report', checkBody(check));
  }

  /**
   * POST /v1/release: gives back the permit an allowed check answered (`answer.body.permit`, a
   * concurrency policy's). Resolves to { status, body }: 200 with `released` true, or false when
   * nothing was held any more (released already, or expired): releasing is idempotent. Rejects
   * with SluiceError when the daemon cannot be asked (the permit returns at its `permit_ttl`).
   */
  release(permit) {
    return this.call('/v1/release', { permit });
  }

  /** POST /v1/check/batch: independent checks in one call; resolves to the answers' bodies. */
  async batch(checks) {
    const answer = await this.call('/v1/check/batch', { checks: checks.map(checkBody) });
    if (answer.status !== 200) throw new SluiceError(`batch refused (${answer.status}): ${answer.body.reason}`);
    return answer.body.results;
  }

  /** POST `body` as JSON to `path`. */
  call(path, body) {
    return this.send(path, JSON.stringify(body), true);
  }

  send(path, payload, mayRetry) {
    return new Promise((resolve, reject) => {
      const fail = (error) => reject(error instanceof SluiceError ? error : new SluiceError(error.message));
      const request = http.request({
        ...this.where,
        agent: this.agent,
        method: 'POST',
        path,
        headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload) },
      }, (response) => {
        const chunks = [];
        let size = 0;
        response.on('data', (chunk) => {
          size += chunk.length;
          if (size > MAX_ANSWER_BYTES) request.destroy(new SluiceError("the daemon's answer is too large"));
          else chunks.push(chunk);
        });
        response.on('end', () => {
          clearTimeout(timer);
          let parsed;
          try {
            const text = Buffer.concat(chunks).toString('utf8');
            parsed = text ? JSON.parse(text) : {};
          } catch (error) {
            return fail(new SluiceError(`the daemon's answer is not JSON: ${error.message}`));
          }
          if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) {
            return fail(new SluiceError("the daemon's answer is not a JSON object"));
          }
          const headers = {};
          for (const name of RATE_LIMIT_HEADERS) {
            if (response.headers[name] !== undefined) headers[name] = response.headers[name];
          }
          return resolve({ status: response.statusCode, body: parsed, headers });
        });
        response.on('error', fail);
      });
      // One deadline for the whole call: connect, send, answer.
      const timer = setTimeout(() => request.destroy(new SluiceError(`no answer within ${this.timeoutMs} ms`)), this.timeoutMs);
      // What the socket had written before this request: on an error, an unchanged count means
      // none of this check left, so it may be asked once more. Once a byte is written the check
      // may count (the daemon may have read it, then closed): never resent.
      let writtenBefore = null;
      request.on('socket', (socket) => {
        writtenBefore = socket.bytesWritten;
      });
      request.on('error', (error) => {
        clearTimeout(timer);
        const nothingWritten = request.reusedSocket && request.socket && writtenBefore !== null
          && request.socket.bytesWritten === writtenBefore;
        if (mayRetry && nothingWritten && !(error instanceof SluiceError)) {
          resolve(this.send(path, payload, false));
        } else {
          fail(error);
        }
      });
      request.end(payload);
    });
  }

  /** Closes the kept-alive connections. */
  close() {
    this.agent.destroy();
  }
}

module.exports = { Client, SluiceError, parseUrl, checkBody, RATE_LIMIT_HEADERS, DEFAULT_TIMEOUT_MS };
