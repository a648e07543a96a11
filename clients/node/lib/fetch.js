'use strict';
// A wrapper for fetch-style handlers (Request -> Response): Hono, Next.js route handlers, Deno-
// and Bun-style servers, Cloudflare-style workers on Node.

const { Client } = require('./client');
const { decide, SidecarWatch } = require('./reply');
const { holdPermit, releasingStream } = require('./permits');

/**
 * `withSluice(handler, { route, client })` returns `async (request, ...rest) => Response`:
 * `route(request)` (may be async; read the body from `request.clone()` for a GraphQL cost)
 * returns a check or null. Denied requests get the documented 429/503 Response; allowed ones go to
 * `handler`, and its Response gets the rate-limit headers. `onFallback`, `logIntervalMs` and
 * `onDenied` as for `sluice()`. A fetch Request carries no peer address: take it from the server
 * (Bun's `server.requestIP(request)`, Deno's `info.remoteAddr`) and pass it to
 * `trustedProxies().clientAddress(peer, request.headers)` in the route. An allowed answer's
 * permit (a concurrency policy) is released once: when the handler throws or rejects (its own
 * timeout, an AbortSignal), when a Response without a body is returned, or when the body stream
 * ends, fails, or is cancelled (the server adapter's client left mid-stream; or the request's
 * signal aborts); a failed release is logged with `log.warn`.
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
    const release = reply.permit ? holdPermit(client, reply.permit, log) : null;
    // A client gone (the adapter aborts the request's signal): given back at once.
    const signal = release && request.signal;
    if (signal) {
      if (signal.aborted) release();
      else signal.addEventListener('abort', release, { once: true });
    }
    let response;
    try {
      response = await handler(request, ...rest);
    } catch (error) {
      if (release) release();
      throw error;
    }
    const names = Object.keys(reply.headers).filter((name) => name !== 'retry-after');
    if (names.length === 0 && !release) return response;
    // A Response's headers may be immutable (one from fetch()): copy it with the headers added.
    const headers = new Headers(response.headers);
    for (const name of names) headers.set(name, reply.headers[name]);
    let { body } = response;
    if (release) {
      if (body) {
        body = releasingStream(body, release);
      } else {
        release();
      }
    }
    return new Response(body, { status: response.status, statusText: response.statusText, headers });
  }
  limited.watch = watch;
  return limited;
}

module.exports = { withSluice };
