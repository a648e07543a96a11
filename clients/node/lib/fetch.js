'use strict';
// A wrapper for fetch-style handlers (Request -> Response): Hono, Next.js route handlers, Deno-
// and Bun-style servers, Cloudflare-style workers on Node.

const { Client } = require('./client');
const { decide } = require('./reply');

/**
 * `withSluice(handler, { route, client })` returns `async (request, ...rest) => Response`:
 * `route(request)` (may be async; read the body from `request.clone()` for a GraphQL cost)
 * returns a check or null. Denied requests get the documented 429/503 Response; allowed ones go to
 * `handler`, and its Response gets the rate-limit headers.
 */
function withSluice(handler, { route, client = new Client(), log = console } = {}) {
  if (typeof route !== 'function') throw new TypeError('withSluice(handler, { route }) needs a route function');
  return async function limited(request, ...rest) {
    const check = await route(request);
    if (!check) return handler(request, ...rest);
    const reply = await decide(client, check, log);
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
  };
}

module.exports = { withSluice };
