'use strict';
// The answer a middleware gives for a check: the documented 429 and 503 bodies and headers.

/** What a route may do when the sidecar cannot be reached (or does not answer in time). */
const OPEN = 'open';
const CLOSED = 'closed';
/** Retry-After (seconds) of the 503 a fail-closed route answers when the sidecar is unreachable. */
const UNREACHABLE_RETRY_AFTER = '1';
/** Default milliseconds between two log lines about decisions made without the sidecar. */
const DEFAULT_LOG_INTERVAL_MS = 10000;

/**
 * What a middleware does about a sidecar it cannot reach: calls `onFallback(check, error)` for
 * every decision made without it (wire it to the application's metrics) and logs one warning at
 * most every `logIntervalMs`, with how many such decisions the interval saw. `count` is the total.
 */
class SidecarWatch {
  constructor({ onFallback = null, logIntervalMs = DEFAULT_LOG_INTERVAL_MS, log = console } = {}) {
    if (onFallback !== null && typeof onFallback !== 'function') throw new TypeError('onFallback is a function');
    this.onFallback = onFallback;
    this.logIntervalMs = logIntervalMs;
    this.log = log;
    this.count = 0;
    this.unlogged = 0;
    this.lastLog = null;
  }

  record(check, error) {
    this.count += 1;
    this.unlogged += 1;
    const now = performance.now();
    if (this.lastLog === null || now - this.lastLog >= this.logIntervalMs) {
      this.log.warn(`sluice unreachable: ${this.unlogged} decision(s) without the sidecar in the last ${this.logIntervalMs} ms (this one: ${check.onUnreachable || OPEN}): ${error.message}`);
      this.lastLog = now;
      this.unlogged = 0;
    }
    if (this.onFallback) {
      try {
        this.onFallback(check, error);
      } catch (hookError) {
        this.log.error(`sluice: the onFallback hook threw: ${hookError && hookError.message}`);
      }
    }
  }
}

/**
 * The middleware's reply to `check` given the daemon's `answer` or the `error` met asking
 * (`options`: `watch`, a SidecarWatch counting decisions made without the sidecar; `onDenied(check,
 * answer)`, which may return a reply `{ status, headers, body }` of the application's own for a
 * denial, or null for the documented 429):
 * `{ status: null, headers }` lets the request through with the rate-limit headers; otherwise
 * `{ status, headers, body }` (body a JSON string):
 * - 429 `{"error":"rate_limit","retry_after_sec":N}` with `Retry-After` and the rate-limit headers;
 * - 503 `{"error":"limiter_unavailable"}` for a fail-closed policy whose store is down, and (with
 *   `Retry-After: 1`) for an unreachable sidecar on a route whose `onUnreachable` is 'closed'
 *   ('open', the default, lets the request through);
 * - any other status (the daemon rejected the check: the route asks wrongly) is a 500
 *   `{"error":"limiter_rejected"}`, never an open door.
 */
function replyFor(check, answer, error, log = console, { watch = null, onDenied = null } = {}) {
  const onUnreachable = check.onUnreachable || OPEN;
  if (error) {
    (watch || defaultWatch(log)).record(check, error);
    if (onUnreachable === OPEN) return { status: null, headers: {} };
    return json(503, { 'retry-after': UNREACHABLE_RETRY_AFTER }, { error: 'limiter_unavailable' });
  }
  const headers = { ...answer.headers };
  if (answer.status === 200) return { status: null, headers };
  if (answer.status === 429) {
    if (onDenied) {
      const shaped = onDenied(check, answer);
      if (shaped) return shaped;
    }
    return json(429, headers, { error: 'rate_limit', retry_after_sec: answer.body.retry_after_sec ?? 0 });
  }
  if (answer.status === 503) return json(503, headers, { error: 'limiter_unavailable' });
  log.error(`sluice rejected the check (${answer.status}): ${answer.body.error}: ${answer.body.reason}`);
  return json(500, {}, { error: 'limiter_rejected' });
}

function json(status, headers, value) {
  return { status, headers: { ...headers, 'content-type': 'application/json' }, body: JSON.stringify(value) };
}

/** Validates a route's check; throws a TypeError on a bad `onUnreachable`. */
function validate(check) {
  if (check.onUnreachable !== undefined && ![OPEN, CLOSED].includes(check.onUnreachable)) {
    throw new TypeError(`onUnreachable is 'open' or 'closed', not ${JSON.stringify(check.onUnreachable)}`);
  }
  return check;
}

const watches = new WeakMap();
function defaultWatch(log) {
  if (!watches.has(log)) watches.set(log, new SidecarWatch({ log }));
  return watches.get(log);
}

/** Asks `client` about `check` and returns the reply (never rejects for the daemon's sake). */
async function decide(client, check, log, options = {}) {
  validate(check);
  let answer;
  try {
    answer = await client.check(check);
  } catch (error) {
    if (error && error.name === 'SluiceError') return replyFor(check, null, error, log, options);
    throw error;
  }
  const reply = replyFor(check, answer, null, log, options);
  // An allowed answer of a concurrency policy holds a permit: the middleware gives it back.
  const permit = answer.body.permit;
  if (reply.status === null && answer.status === 200 && typeof permit === 'string' && permit) reply.permit = permit;
  return reply;
}

module.exports = { OPEN, CLOSED, replyFor, decide, SidecarWatch, UNREACHABLE_RETRY_AFTER, DEFAULT_LOG_INTERVAL_MS };
