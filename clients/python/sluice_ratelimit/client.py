"""Clients of the check API over a Unix socket or TCP: `Client` (blocking, for WSGI and scripts)
and `AsyncClient` (asyncio, for ASGI). Both keep connections alive in a bounded pool and give
every call one deadline, connect to last byte."""

import asyncio
import json
import os
import socket
import threading
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .core import Answer, Check, SluiceError, decode, parse_url
from .wire import AnswerParser

#: Idle connections kept per client.
MAX_IDLE = 16
#: Default deadline of one call, in seconds (a sidecar answers in well under a millisecond).
DEFAULT_TIMEOUT = 0.5


def _target(socket_path: Optional[str], url: Union[str, Tuple[str, int], None]
            ) -> Tuple[Optional[str], Optional[Tuple[str, int]]]:
    """(socket path, None) or (None, (host, port)): explicit arguments, then SLUICE_SOCKET, then
    SLUICE_URL, then http://127.0.0.1:7070 (the order of `sluice check`)."""
    if socket_path and url:
        raise ValueError("give a socket or a url, not both")
    if socket_path:
        return socket_path, None
    if url:
        return None, url if isinstance(url, tuple) else parse_url(url)
    if os.environ.get("SLUICE_SOCKET"):
        return os.environ["SLUICE_SOCKET"], None
    return None, parse_url(os.environ.get("SLUICE_URL") or "http://127.0.0.1:7070")


def _address(address: Optional[Tuple[str, int]]) -> Tuple[str, int]:
    """The (host, port) `_target` gave when it gave no socket."""
    if address is None:
        raise ValueError("no socket and no address")
    return address


def _as_check(check: Union[Check, Mapping[str, str], None], kwargs: Dict[str, Any]) -> Check:
    if isinstance(check, Check):
        return check
    return Check(check or {}, **kwargs)


class _Conn:
    """One kept-alive connection of the blocking client: a socket and the time it was opened."""

    __slots__ = ("sock",)

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def alive(self) -> bool:
        """False when the daemon closed this idle connection (or sent bytes nobody asked for)."""
        try:
            self.sock.setblocking(False)  # a socket with a timeout would wait for a byte
            self.sock.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            return True
        except OSError:
            return False
        return False

    def close(self) -> None:
        self.sock.close()


def _remaining(deadline: float, timeout: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise SluiceError(f"no answer within {timeout} s")
    return left


class Client:
    """A blocking client, safe to share between threads: each call borrows a kept-alive connection
    (or opens one) and returns it after a whole answer. `timeout` bounds each call as a whole:
    connect, send and the whole answer."""

    def __init__(self, socket: Optional[str] = None, url: Union[str, Tuple[str, int], None] = None,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self.socket_path, self.address = _target(socket, url)
        self.timeout = timeout
        self._idle: List[_Conn] = []
        self._lock = threading.Lock()

    def check(self, descriptors: Union[Check, Mapping[str, str], None] = None, **kwargs: Any) -> Answer:
        """POST /v1/check; `descriptors` is a dict or a `Check`. Returns an `Answer`; raises
        `SluiceError` when the daemon cannot be asked."""
        return self.call("/v1/check", _as_check(descriptors, kwargs).body())

    def report(self, descriptors: Union[Check, Mapping[str, str], None] = None, **kwargs: Any) -> Answer:
        """POST /v1/report: spend a cost known only afterwards (an LLM's tokens)."""
        return self.call("/v1/report", _as_check(descriptors, kwargs).body())

    def release(self, permit: str) -> Answer:
        """POST /v1/release: gives back the permit an allowed check answered (`answer.permit`,
        a concurrency policy's). 200 `{"released": true}`, or `false` when nothing was held any
        more (released already, or expired): releasing is idempotent. Raises `SluiceError`
        when the daemon cannot be asked (the permit then returns at its `permit_ttl`)."""
        return self.call("/v1/release", {"permit": permit})

    def settle(self, reservation: str, cost: int) -> Answer:
        """POST /v1/settle: settle a reservation (a `reserve=True` check's answer's
        `body["reservation"]`) at the real cost; 200, or 409 when settled already, 410 after
        its reservation_ttl (it settled at its estimate), 400 for a token not this fleet's."""
        return self.call("/v1/settle", {"reservation": reservation, "cost": cost})

    def batch(self, checks: Sequence[Check]) -> Union[List[Dict[str, Any]], Answer]:
        """POST /v1/check/batch: independent checks in one call; returns the list of answers'
        bodies (dicts) in order, or the whole `Answer` when the batch is refused."""
        answer = self.call("/v1/check/batch", {"checks": [c.body() for c in checks]})
        if answer.status != 200:
            return answer
        results: List[Dict[str, Any]] = answer.body.get("results", [])
        return results

    def call(self, path: str, body: Any) -> Answer:
        """POST `body` as JSON to `path`; an `Answer`, or `SluiceError` (within `timeout`)."""
        request = _request(path, body)
        deadline = time.monotonic() + self.timeout
        conn, reused = self._take(deadline)
        try:
            try:
                self._send(conn, request, deadline)
            except _NothingSent as error:
                conn.close()
                if not reused:
                    raise SluiceError(str(error.__cause__) or "connection closed") from None
                # A kept-alive connection that refused the very first byte: nothing of this
                # check reached the daemon, so it is asked once more on a fresh connection. Once
                # a byte is written the check may count: never resent.
                conn = self._open(deadline)
                self._send(conn, request, deadline)
            answer = self._receive(conn, deadline)
        except _NothingSent as error:
            conn.close()
            raise SluiceError(str(error.__cause__) or "connection closed") from None
        except SluiceError:
            conn.close()
            raise
        except OSError as error:
            conn.close()
            raise SluiceError(str(error) or type(error).__name__) from None
        return answer

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    def close(self) -> None:
        """Closes the idle connections."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _send(self, conn: _Conn, request: bytes, deadline: float) -> None:
        sent = 0
        while sent < len(request):
            conn.sock.settimeout(_remaining(deadline, self.timeout))
            try:
                sent += conn.sock.send(request[sent:])
            except OSError as error:
                if sent == 0 and not isinstance(error, (socket.timeout, TimeoutError)):
                    raise _NothingSent() from error
                raise

    def _receive(self, conn: _Conn, deadline: float) -> Answer:
        parser = AnswerParser()
        while True:
            conn.sock.settimeout(_remaining(deadline, self.timeout))
            try:
                data = conn.sock.recv(65536)
            except (socket.timeout, TimeoutError):
                raise SluiceError(f"no answer within {self.timeout} s") from None
            if parser.feed(data):
                break
        answer = decode(parser.status, bytes(parser.body), parser.headers)
        if parser.reusable:
            self._give(conn)
        else:
            conn.close()
        return answer

    def _open(self, deadline: float) -> _Conn:
        try:
            if self.socket_path:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.settimeout(_remaining(deadline, self.timeout))
                    sock.connect(self.socket_path)
                except BaseException:
                    sock.close()
                    raise
            else:
                host, port = _address(self.address)
                sock = socket.create_connection((host, port), _remaining(deadline, self.timeout))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except (socket.timeout, TimeoutError):
            raise SluiceError(f"no answer within {self.timeout} s") from None
        except OSError as error:
            raise SluiceError(str(error) or type(error).__name__) from None
        return _Conn(sock)

    def _take(self, deadline: float) -> Tuple[_Conn, bool]:
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return self._open(deadline), False
            if conn.alive():
                return conn, True
            conn.close()

    def _give(self, conn: _Conn) -> None:
        with self._lock:
            if len(self._idle) < MAX_IDLE:
                self._idle.append(conn)
                return
        conn.close()


class _NothingSent(Exception):
    """Sending failed before any byte of the request left."""


def _request(path: str, body: Any) -> bytes:
    payload = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload


class AsyncClient:
    """An asyncio client (one per event loop): HTTP/1.1 on kept-alive streams, each call bounded
    by `timeout` seconds as a whole."""

    def __init__(self, socket: Optional[str] = None, url: Union[str, Tuple[str, int], None] = None,
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        self.socket_path, self.address = _target(socket, url)
        self.timeout = timeout
        self._idle: List[Tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def check(self, descriptors: Union[Check, Mapping[str, str], None] = None,
                    **kwargs: Any) -> Answer:
        """POST /v1/check; see `Client.check`."""
        return await self.call("/v1/check", _as_check(descriptors, kwargs).body())

    async def report(self, descriptors: Union[Check, Mapping[str, str], None] = None,
                     **kwargs: Any) -> Answer:
        """POST /v1/report; see `Client.report`."""
        return await self.call("/v1/report", _as_check(descriptors, kwargs).body())

    async def release(self, permit: str) -> Answer:
        """POST /v1/release; see `Client.release`."""
        return await self.call("/v1/release", {"permit": permit})

    async def settle(self, reservation: str, cost: int) -> Answer:
        """POST /v1/settle; see `Client.settle`."""
        return await self.call("/v1/settle", {"reservation": reservation, "cost": cost})

    async def batch(self, checks: Sequence[Check]) -> Union[List[Dict[str, Any]], Answer]:
        """POST /v1/check/batch; see `Client.batch`."""
        answer = await self.call("/v1/check/batch", {"checks": [c.body() for c in checks]})
        if answer.status != 200:
            return answer
        results: List[Dict[str, Any]] = answer.body.get("results", [])
        return results

    async def call(self, path: str, body: Any) -> Answer:
        """POST `body` as JSON to `path`; an `Answer`, or `SluiceError` (within `timeout`)."""
        request = _request(path, body)
        try:
            return await asyncio.wait_for(self._ask(request), self.timeout)
        except asyncio.TimeoutError:
            raise SluiceError(f"no answer within {self.timeout} s") from None
        except SluiceError:
            raise
        except Exception as error:  # noqa: BLE001 (every way a read can fail is the library's error)
            raise SluiceError(str(error) or type(error).__name__) from None

    async def close(self) -> None:
        """Closes the idle connections (and waits until they are: none is left to the garbage
        collector when the event loop ends)."""
        idle, self._idle = self._idle, []
        for _, writer in idle:
            await _closed(writer)

    async def _open(self) -> Tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.socket_path:
            return await asyncio.open_unix_connection(self.socket_path)
        return await asyncio.open_connection(*_address(self.address))

    async def _take_idle(self) -> Optional[Tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
        # A kept-alive stream the daemon closed (or wrote to) meanwhile is dropped before any of
        # this check is written on it: a check is never resent once written.
        while self._idle:
            reader, writer = self._idle.pop()
            if reader.at_eof() or writer.is_closing() or reader._buffer:  # type: ignore[attr-defined]
                await _closed(writer)
                continue
            return reader, writer
        return None

    async def _ask(self, request: bytes) -> Answer:
        stream = await self._take_idle() or await self._open()
        reader, writer = stream
        try:
            writer.write(request)
            await writer.drain()
            parser = AnswerParser()
            while not parser.feed(await reader.read(65536)):
                pass
            answer = decode(parser.status, bytes(parser.body), parser.headers)
        except BaseException:
            writer.close()
            raise
        if parser.reusable and len(self._idle) < MAX_IDLE:
            self._idle.append((reader, writer))
        else:
            await _closed(writer)
        return answer


async def _closed(writer: asyncio.StreamWriter) -> None:
    """Closes `writer` and waits until its socket is closed (an error then is of no interest)."""
    writer.close()
    try:
        await writer.wait_closed()
    except (OSError, asyncio.IncompleteReadError):
        pass
