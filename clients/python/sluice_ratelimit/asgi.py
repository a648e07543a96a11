"""ASGI middleware (Starlette, FastAPI, Django's ASGI, any ASGI 3 server)."""

import inspect
import json
from typing import Any, Awaitable, Callable, Dict, List, Optional, Tuple, Union

from .client import AsyncClient
from .core import (DEFAULT_LOG_INTERVAL, Answer, Check, DenyHook, FallbackHook, Reply, SidecarWatch,
                   SluiceError, reply_for)
from .permits import AsyncPermit, DisconnectWatch
from .request import DEFAULT_MAX_BODY, Request

Scope = Dict[str, Any]
Message = Dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
Route = Callable[[Request], Union[Optional[Check], Awaitable[Optional[Check]]]]


class SluiceASGI:
    """Asks sluice about every HTTP request `route(request)` returns a `Check` for (None: not
    limited). `route` may be a coroutine function. `read_body(request)` says whether the route
    needs the body (a GraphQL query's cost): it is then read, up to `max_body` bytes (413 beyond),
    and replayed to the application unchanged.

    Denied: 429 `{"error":"rate_limit","retry_after_sec":N}` with `Retry-After` and the rate-limit
    headers; a fail-closed policy whose store is down: 503 `{"error":"limiter_unavailable"}`;
    sidecar unreachable: the route's `on_unreachable` (503 with `Retry-After: 1` when closed).
    Allowed answers carry the rate-limit headers.

    `on_fallback(check, error)` is called for every decision made without the sidecar (wire it to
    the application's metrics); a warning is logged at most every `log_interval` seconds.
    `on_denied(check, answer)` may return a `Reply` of the application's own for a denial (a
    JSON:API error, an HTML page); None keeps the documented 429.

    An allowed answer that holds a `permit` (a concurrency policy) has it released exactly once
    when the request ends: the application returned, raised or was cancelled (a timeout), or the
    client went away (also mid-way through a streamed answer the application keeps writing). A
    failed release is logged, never raised (the permit returns at its `permit_ttl`).
    """

    def __init__(self, app: ASGIApp, route: Route, client: Optional[AsyncClient] = None,
                 read_body: Optional[Callable[[Request], bool]] = None, max_body: int = DEFAULT_MAX_BODY,
                 on_fallback: Optional[FallbackHook] = None, log_interval: float = DEFAULT_LOG_INTERVAL,
                 on_denied: Optional[DenyHook] = None) -> None:
        self.app = app
        self.route = route
        self.client = client or AsyncClient()
        self.read_body = read_body
        self.max_body = max_body
        self.watch = SidecarWatch(on_fallback, log_interval)
        self.on_denied = on_denied

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request = request_of(scope)
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
        permit = None
        try:
            answer = await self.client.check(check)
        except SluiceError as error:
            reply = reply_for(check, error=error, watch=self.watch)
        else:
            reply = reply_for(check, answer=answer, on_denied=self.on_denied)
            permit = answer.permit
        if reply.status is not None:
            return await _send_raw(send, reply.status, reply.headers, reply.body)
        extra = [(k.encode(), v.encode()) for k, v in reply.headers if k != "retry-after"]

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start" and extra:
                message = dict(message)
                message["headers"] = list(message.get("headers", [])) + extra
            await send(message)

        if permit is None:
            return await self.app(scope, receive, send_with_headers)
        return await self._holding(AsyncPermit(self.client, permit), scope, receive, send_with_headers)

    async def _holding(self, held: AsyncPermit, scope: Scope, receive: Receive, send: Send) -> None:
        await holding(self.app, held, scope, receive, send)


async def holding(app: ASGIApp, held: AsyncPermit, scope: Scope, receive: Receive, send: Send) -> None:
    """Runs `app` while `held` (a concurrency policy's permit) is held: given back when the
    client goes (seen by the application or, once the answer has started, by a watch of the
    middleware's: a streamed answer abandoned mid-way), when a send fails, and in any case when
    the application returns, raises or is cancelled (a timeout). Once."""
    disconnects = DisconnectWatch(receive, held.release)

    async def watched_send(message: Message) -> None:
        try:
            await send(message)
        except BaseException:
            held.release()  # a server that raises on a closed connection: the client is gone
            raise
        if message["type"] in ("http.response.start", "http.response.body"):
            disconnects.watch()

    try:
        await app(scope, disconnects.receive, watched_send)
    finally:
        disconnects.stop()
        await held.released()


async def ask(client: AsyncClient, check: Check, watch: SidecarWatch,
              on_denied: Optional[DenyHook]) -> Tuple[Reply, Optional[Answer]]:
    """The middleware's reply to `check` and the daemon's answer (None when unreachable)."""
    try:
        answer = await client.check(check)
    except SluiceError as error:
        return reply_for(check, error=error, watch=watch), None
    return reply_for(check, answer=answer, on_denied=on_denied), answer


def request_of(scope: Scope) -> Request:
    """The `Request` a route sees of an HTTP scope (header names lowercased, repeats joined)."""
    headers: Dict[str, str] = {}
    for k, v in scope.get("headers", []):
        name, value = k.decode("latin-1").lower(), v.decode("latin-1")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    client = scope.get("client")
    return Request(scope["method"], scope.get("path", "/"),
                   scope.get("query_string", b"").decode("latin-1"), headers,
                   client[0] if client else None, scope)


def with_headers(send: Send, headers: List[Tuple[str, str]]) -> Send:
    """`send`, adding `headers` (but `retry-after`) to the application's response start."""
    extra = [(k.encode(), v.encode()) for k, v in headers if k != "retry-after"]

    async def send_with_headers(message: Message) -> None:
        if message["type"] == "http.response.start" and extra:
            message = dict(message)
            message["headers"] = list(message.get("headers", [])) + extra
        await send(message)

    return send_with_headers


def _replay(messages: List[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


async def _send_raw(send: Send, status: int, headers: List[Tuple[str, str]], body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(k.encode(), str(v).encode()) for k, v in headers]})
    await send({"type": "http.response.body", "body": body})


async def _send_json(send: Send, status: int, headers: List[Tuple[str, str]], value: Any) -> None:
    body = json.dumps(value, separators=(",", ":")).encode()
    headers = list(headers) + [("content-type", "application/json"), ("content-length", str(len(body)))]
    await _send_raw(send, status, headers, body)
