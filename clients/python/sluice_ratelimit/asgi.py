"""ASGI middleware (Starlette, FastAPI, Django's ASGI, any ASGI 3 server)."""

import inspect
import json

from .client import AsyncClient
from .core import SluiceError, reply_for
from .request import DEFAULT_MAX_BODY, Request


class SluiceASGI:
    """Asks sluice about every HTTP request `route(request)` returns a `Check` for (None: not
    limited). `route` may be a coroutine function. `read_body(request)` says whether the route
    needs the body (a GraphQL query's cost): it is then read, up to `max_body` bytes (413 beyond),
    and replayed to the application unchanged.

    Denied: 429 `{"error":"rate_limit","retry_after_sec":N}` with `Retry-After` and the rate-limit
    headers; a fail-closed policy whose store is down: 503 `{"error":"limiter_unavailable"}`;
    sidecar unreachable: the route's `on_unreachable`. Allowed answers carry the rate-limit headers.
    """

    def __init__(self, app, route, client=None, read_body=None, max_body=DEFAULT_MAX_BODY):
        self.app = app
        self.route = route
        self.client = client or AsyncClient()
        self.read_body = read_body
        self.max_body = max_body

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        client = scope.get("client")
        request = Request(scope["method"], scope.get("path", "/"),
                          scope.get("query_string", b"").decode("latin-1"), headers,
                          client[0] if client else None, scope)
        if self.read_body and self.read_body(request):
            messages, body = [], b""
            while True:
                message = await receive()
                messages.append(message)
                if message["type"] != "http.request":
                    break
                body += message.get("body", b"")
                if len(body) > self.max_body:
                    return await _send_json(send, 413, [], {"error": "payload_too_large"})
                if not message.get("more_body", False):
                    break
            request.body = body
            receive = _replay(messages, receive)
        check = self.route(request)
        if inspect.isawaitable(check):
            check = await check
        if check is None:
            return await self.app(scope, receive, send)
        try:
            reply = reply_for(check, answer=await self.client.check(check))
        except SluiceError as error:
            reply = reply_for(check, error=error)
        if reply.status is not None:
            return await _send_raw(send, reply.status, reply.headers, reply.body)
        extra = [(k.encode(), v.encode()) for k, v in reply.headers if k != "retry-after"]

        async def send_with_headers(message):
            if message["type"] == "http.response.start" and extra:
                message = dict(message)
                message["headers"] = list(message.get("headers", [])) + extra
            await send(message)

        return await self.app(scope, receive, send_with_headers)


def _replay(messages, receive):
    pending = list(messages)

    async def replayed():
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


async def _send_raw(send, status, headers, body):
    await send({"type": "http.response.start", "status": status,
                "headers": [(k.encode(), str(v).encode()) for k, v in headers]})
    await send({"type": "http.response.body", "body": body})


async def _send_json(send, status, headers, value):
    body = json.dumps(value, separators=(",", ":")).encode()
    headers = list(headers) + [("content-type", "application/json"), ("content-length", str(len(body)))]
    await _send_raw(send, status, headers, body)
