'use strict';
// Express/Connect middleware: `app.use(sluice({ client, route }))`.

const { Client } = require('./client');
const { decide, SidecarWatch } = require('./reply');
const { holdPermit } = require('./permits');

/**
 * Middleware `(req, res, next)` asking sluice about every request `route(req)` returns a check for
 * (`{ descriptors, policy, cost, dryRun, onUnreachable }`, or null: not limited). `route` may be
 * async; it takes the cost from the request (a GraphQL query's, tokens), so put a body parser
 * before this middleware when the cost is in the body. Denied: 429 with the documented body and
 * headers; allowed: through with the rate-limit headers. `onFallback(check, error)` is called for
 * every decision made without the sidecar (a warning is logged at most every `logIntervalMs`);
 * `onDenied(check, answer)` may return `{ status, headers, body }` to answer a denial its own way.
 * The middleware's `watch.count` counts the decisions made without the sidecar. An allowed
 * answer's permit (a concurrency policy) is released once, at the response's `close` (sent
 * whole: success, an error answered by the error handler, a timeout that destroys
 * the socket, a client that leaves, also mid-stream); a failed release is logged with `log.warn`.
 */
function sluice({ route, client = new Client(), log = console, onFallback = null, logIntervalMs, onDenied = null } = {}) {
  if (typeof route !== 'function') throw new TypeError('sluice({ route }) needs a route function');
  const watch = new SidecarWatch({ onFallback, logIntervalMs, log });
  function sluiceMiddleware(req, res, next) {
    Promise.resolve()
      .then(() => route(req))
      .then(async (check) => {
        if (!check) return next();
        const reply = await decide(client, check, log, { watch, onDenied });
        for (const [name, value] of Object.entries(reply.headers)) {
          if (reply.status !== null || name !== 'retry-after') res.setHeader(name, value);
        }
        if (reply.status === null) {
          if (reply.permit) {
            // Given back once at the response's `close`: emitted after it is sent whole (also an
            // error handler's answer), or when its connection closes first (the client left,
            // a server timeout destroyed the socket).
            res.once('close', holdPermit(client, reply.permit, log));
          }
          return next();
        }
        res.statusCode = reply.status;
        res.setHeader('content-length', Buffer.byteLength(reply.body));
        return res.end(reply.body);
      })
      .catch(next);
  }
  sluiceMiddleware.watch = watch;
  return sluiceMiddleware;
}

module.exports = { sluice };
