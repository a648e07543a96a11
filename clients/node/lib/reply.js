'use strict';
// The answer a middleware gives for a check: the documented 429 and 503 bodies and headers.

/** What a route may do when the sidecar cannot be reached (or does not answer in time). */
const OPEN = 'open';
const CLOSED = 'closed';

/**
 * The middleware's reply to `check` given the daemon's `answer` or the `error` met asking:
 * `{ status: null, headers }` lets the request through with the rate-limit headers; otherwise
 * `{ status, headers, body }` (body a JSON string):
 * - 429 `{"error":"rate_limit","retry_after_sec":N}` with `Retry-After` and the rate-limit headers;
 * - 503 `{"error":"limiter_unavailable"}` for a fail-closed policy whose store is down, and for an
 *   unreachable sidecar on a route whose `onUnreachable` is 'closed' ('open', the default, lets
 *   the request through);
 * - any other status (the daemon rejected the check: the route asks wrongly) is a 500
 *   `{"error":"limiter_rejected"}`, never an open door.
 */
function replyFor(check, answer, error, log = console) {
  const onUnreachable = check.onUnreachable || OPEN;
  if (error) {
    log.warn(`sluice unreachable (${onUnreachable}): ${error.message}`);
    if (onUnreachable === OPEN) return { status: null, headers: {} };
    return json(503, {}, { error: 'limiter_unavailable' });
  }
  const headers = { ...answer.headers };
  if (answer.status === 200) return { status: null, headers };
  if (answer.status === 429) {
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

/** Asks `client` about `check` and returns the reply (never rejects for the daemon's sake). */
async function decide(client, check, log) {
  validate(check);
  try {
    return replyFor(check, await client.check(check), null, log);
  } catch (error) {
    if (error && error.name === 'SluiceError') return replyFor(check, null, error, log);
    throw error;
  }
}

module.exports = { OPEN, CLOSED, replyFor, decide };
