'use strict';
// A wrapper for fetch-style handlers (Request -> Response): Hono, Next.js route handlers, Deno-
// and Bun-style servers, Cloudflare-style workers on Node.

const { Client } = require('./client');
const { decide, SidecarWatch } = require('./reply');

/**
 * `withSluice(handler, { route, client })` returns `async (request, ...rest) => Response`:
 * `route(request)` (may be async; read the body from `request.clone()` for a GraphQL cost)
 * returns a check or null. Denied requests get the documented 429/503 Response; allowed ones go to
 * `handler`, and its Response gets the rate-limit headers. `onFallback`, `logIntervalMs` and
 * `onDenied` as for `sluice()`. A fetch Request carries no peer address: take it from the server
 * (Bun's `server.requestIP(request)`, Deno's `info.remoteAddr`) and pass it to
 * `trustedProxies().clientAddress(peer, request.headers)` in the route.
 */
function withSluice(handler, { route, client = new Client(), log = console, onFallback = null, logIntervalMs, onDenied = null } = {}) {
  if (typeof route !== 'function') throw new TypeError('withSluice(handler, { route }) needs a route function');
  const watch = new SidecarWatch({ onFallback, logIntervalMs, log });
  async function limited(request, ...rest) {
    const check = await route(request, ...rest);
    if (!check) return handler(request, ...rest);
    const reply = await decide(client, check, log, { watch, onDenied });
    if (reply.status !== null) {
      return new Response(reply.body, { status: reply.status, headers: reply.headers });
    }
    const response = await handler(request, ...rest);
    const names = Object.keys(reply.headers).filter((name) => name !== 'retry-after');
    if (names.length === 0) return response;
    // A Response's headers may be immutable (one from fetch()): copy it with the headers added.
    const headers = new Headers(response.headers);
    for (const name of names) headers.set(name, reply.headers[name]);
    return new Response(response.body, { status: response.status, statusText: response.statusText, headers });
  }
  limited.watch = watch;
  return limited;
}

module.exports = { withSluice };
