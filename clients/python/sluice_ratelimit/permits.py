"""The permit a middleware holds for a request a concurrency policy admitted: given back exactly
once, whichever way the request ends (answered, raised, cancelled by a timeout, its client gone);
a release that fails is logged and never reaches the application's answer (the permit then
returns by itself at the policy's `permit_ttl`)."""

import asyncio
import threading
from typing import Any, Awaitable, Callable, Dict, Optional, Set

from .core import Answer, SluiceError, log

Message = Dict[str, Any]
Receive = Callable[[], Awaitable[Message]]

#: Releases and disconnect watches under way: kept referenced until they end (the event loop
#: holds tasks only weakly).
_TASKS: Set["asyncio.Task[Any]"] = set()


def _keep(task: "asyncio.Task[Any]") -> "asyncio.Task[Any]":
    _TASKS.add(task)
    task.add_done_callback(_TASKS.discard)
    return task


def _logged(answer: Optional[Answer], error: Optional[BaseException]) -> None:
    """Logs a release that did not give the permit back (never the permit itself: it names the
    partition)."""
    if error is not None:
        log.warning("sluice: a permit's release failed (it returns at its permit_ttl): %s", error)
    elif answer is not None and answer.status != 200:
        log.warning("sluice: the daemon refused a permit's release (%s): %s: %s", answer.status,
                    answer.body.get("error"), answer.body.get("reason"))


class Permit:
    """A blocking client's permit (WSGI): `release()` gives it back once; later calls do nothing."""

    def __init__(self, client: Any, permit: str) -> None:
        self.client = client
        self.permit = permit
        self._lock = threading.Lock()
        self._done = False

    def release(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        try:
            answer = self.client.release(self.permit)
        except Exception as error:  # noqa: BLE001 (a failed release never fails the request)
            _logged(None, error)
        else:
            _logged(answer, None)


class AsyncPermit:
    """An `AsyncClient`'s permit (ASGI): `release()` starts the one release (a task of its own,
    so a cancelled request still completes it); `released()` waits for it."""

    def __init__(self, client: Any, permit: str) -> None:
        self.client = client
        self.permit = permit
        self._task: Optional["asyncio.Task[None]"] = None

    def release(self) -> None:
        if self._task is None:
            self._task = _keep(asyncio.ensure_future(self._release()))

    async def released(self) -> None:
        """Starts the release if nothing has, and waits for it; a cancellation of the caller
        (a timeout) leaves the release running."""
        self.release()
        assert self._task is not None
        try:
            await asyncio.shield(self._task)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 (logged by _release already)
            pass

    async def _release(self) -> None:
        try:
            answer = await self.client.release(self.permit)
        except Exception as error:  # noqa: BLE001 (a failed release never fails the request)
            _logged(None, error)
        else:
            _logged(answer, None)


class DisconnectWatch:
    """An ASGI `receive` that tells when the client is gone: the application's own receives pass
    through until it starts answering; then, while the application is not waiting on `receive`
    itself, a task of the middleware's waits on it (a streamed answer whose application never
    reads again still learns of the disconnect) and hands what it reads to the application.
    `on_disconnect()` is called at the first `http.disconnect`, whoever reads it."""

    def __init__(self, receive: Receive, on_disconnect: Callable[[], None]) -> None:
        self._receive = receive
        self._on_disconnect = on_disconnect
        self._queue: "asyncio.Queue[Message]" = asyncio.Queue(maxsize=1)
        self._task: Optional["asyncio.Task[None]"] = None
        self._waiting = 0
        self._gone = False

    async def receive(self) -> Message:
        if self._task is not None:
            if self._gone and self._queue.empty():
                return {"type": "http.disconnect"}
            return await self._queue.get()
        self._waiting += 1
        try:
            message = await self._receive()
        finally:
            self._waiting -= 1
        self._seen(message)
        return message

    def watch(self) -> None:
        """Called as the answer is sent: start waiting for the disconnect, unless the
        application is waiting on `receive` already (it then reads it itself)."""
        if self._task is None and self._waiting == 0 and not self._gone:
            self._task = _keep(asyncio.ensure_future(self._pump()))

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def _seen(self, message: Message) -> None:
        if message.get("type") == "http.disconnect" and not self._gone:
            self._gone = True
            self._on_disconnect()

    async def _pump(self) -> None:
        while not self._gone:
            message = await self._receive()
            self._seen(message)
            # At most one message waits for the application: a request body it has not read is
            # read no faster than it takes it.
            await self._queue.put(message)
