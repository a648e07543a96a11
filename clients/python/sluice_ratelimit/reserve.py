"""Reserve, then settle, for streamed responses (ASGI): an LLM call's tokens are known only when
its stream ends. `SluiceReserveASGI` reserves an estimate taken from the request (e.g. its
`max_tokens`) with `POST /v1/check` `"reserve": true` before the application runs, and settles
the usage the handler reports with `POST /v1/settle` when the response ends: after its last
body, when the client disconnects mid-stream, when the handler raises or is cancelled. A handler
that reports nothing settles at the estimate. The reserving policies need `reservations: true`
(docs/policies.md, "Reservations")."""

import asyncio
import inspect
from typing import Callable, Optional

from .asgi import (ASGIApp, Receive, Route, Scope, Send, _send_raw, ask, holding, request_of,
                   with_headers)
from .client import AsyncClient
from .core import DEFAULT_LOG_INTERVAL, Answer, DenyHook, FallbackHook, SidecarWatch, SluiceError, log
from .permits import AsyncPermit

#: The scope key under which the application finds the request's `Usage`.
SCOPE_KEY = "sluice.usage"


class Usage:
    """What a reserved request really cost, as its handler reports it: `scope["sluice.usage"]`.
    `set(n)` says the total so far (tokens streamed), `add(n)` adds to it; `cost` is None until
    the handler reports (the settle then uses `estimate`). `reservation` is None when nothing was
    reserved (no policy applied, the sidecar unreachable on an open route): nothing to settle."""

    __slots__ = ("estimate", "reservation", "cost", "settled")

    def __init__(self, estimate: int, reservation: Optional[str]) -> None:
        self.estimate = estimate
        self.reservation = reservation
        self.cost: Optional[int] = None
        #: The daemon's answer to the settle, once sent (None before, or when it could not be).
        self.settled: Optional[Answer] = None

    def set(self, cost: int) -> None:
        """The request's cost so far (replaces what was reported)."""
        self.cost = max(0, int(cost))

    def add(self, cost: int) -> None:
        """Adds `cost` to what was reported."""
        self.cost = (self.cost or 0) + max(0, int(cost))


#: Called after each settle with the request's usage (its `settled` answer, None on an error).
SettledHook = Callable[[Usage], None]


class SluiceReserveASGI:
    """`route(request)` returns the `Check` whose `cost` is the estimate (None: not limited); it
    is sent with `reserve=True`. Denied, unavailable and unreachable as `SluiceASGI` answers
    (429, 503, the route's `on_unreachable`). Allowed: the application runs with
    `scope["sluice.usage"]` (a `Usage`) and the reservation is settled once when the response
    ends, whichever way it ends; `on_settled(usage)` is called then. A concurrency policy's
    permit, when one applied too, is given back as `SluiceASGI` gives it back."""

    def __init__(self, app: ASGIApp, route: Route, client: Optional[AsyncClient] = None,
                 on_fallback: Optional[FallbackHook] = None, log_interval: float = DEFAULT_LOG_INTERVAL,
                 on_denied: Optional[DenyHook] = None, on_settled: Optional[SettledHook] = None) -> None:
        self.app = app
        self.route = route
        self.client = client or AsyncClient()
        self.watch = SidecarWatch(on_fallback, log_interval)
        self.on_denied = on_denied
        self.on_settled = on_settled

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        check = self.route(request_of(scope))
        if inspect.isawaitable(check):
            check = await check
        if check is None:
            return await self.app(scope, receive, send)
        check.reserve = True
        reply, answer = await ask(self.client, check, self.watch, self.on_denied)
        if reply.status is not None:
            return await _send_raw(send, reply.status, reply.headers, reply.body)
        token = answer.body.get("reservation") if answer is not None else None
        usage = Usage(check.cost, token if isinstance(token, str) else None)
        scope = dict(scope)
        scope[SCOPE_KEY] = usage
        permit = answer.permit if answer is not None else None
        sending = with_headers(send, reply.headers)
        try:
            if permit is None:
                await self.app(scope, receive, sending)
            else:
                # A concurrency policy applied too: its permit goes back as `SluiceASGI` gives
                # it back, on every path of the request.
                await holding(self.app, AsyncPermit(self.client, permit), scope, receive, sending)
        finally:
            # Shielded: a request cancelled (its client gone) still settles what it used.
            await asyncio.shield(self._settle(usage))

    async def _settle(self, usage: Usage) -> None:
        if usage.reservation is None:
            return
        cost = usage.cost if usage.cost is not None else usage.estimate
        try:
            usage.settled = await self.client.settle(usage.reservation, cost)
        except SluiceError as error:
            log.warning("sluice: a reservation could not be settled (it settles at its estimate "
                        "when its reservation_ttl ends): %s", error)
        else:
            if usage.settled.status != 200:
                log.warning("sluice: the settle was refused (%s): %s", usage.settled.status,
                            usage.settled.body.get("error"))
        if self.on_settled is not None:
            try:
                self.on_settled(usage)
            except Exception:  # noqa: BLE001 (a broken hook never fails a request)
                log.exception("sluice: the on_settled hook raised")
