"""Clients of the check API over a Unix socket or TCP: `Client` (blocking, for WSGI and scripts)
and `AsyncClient` (asyncio, for ASGI). Both keep connections alive in a bounded pool and give
every call a deadline."""

import asyncio
import http.client
import json
import os
import socket
import threading

from .core import MAX_ANSWER_BYTES, Check, SluiceError, decode, parse_url

#: Idle connections kept per client.
MAX_IDLE = 16
#: Default deadline of one call, in seconds (a sidecar answers in well under a millisecond).
DEFAULT_TIMEOUT = 0.5


def _target(socket_path, url):
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


def _as_check(check, kwargs):
    if isinstance(check, Check):
        return check
    return Check(check or {}, **kwargs)


class _UnixConnection(http.client.HTTPConnection):
    """HTTP/1.1 over a Unix socket; the host name only fills the Host header."""

    def __init__(self, path, timeout):
        super().__init__("sluice", timeout=timeout)
        self.socket_path = path

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class Client:
    """A blocking client, safe to share between threads: each call borrows a kept-alive connection
    (or opens one) and returns it after a whole answer. `timeout` bounds connect, send and read."""

    def __init__(self, socket=None, url=None, timeout=DEFAULT_TIMEOUT):
        self.socket_path, self.address = _target(socket, url)
        self.timeout = timeout
        self._idle = []
        self._lock = threading.Lock()

    def check(self, descriptors=None, **kwargs):
        """POST /v1/check; `descriptors` is a dict or a `Check`. Returns an `Answer`; raises
        `SluiceError` when the daemon cannot be asked."""
        return self.call("/v1/check", _as_check(descriptors, kwargs).body())

    def report(self, descriptors=None, **kwargs):
        """POST /v1/report: spend a cost known only afterwards (an LLM's tokens)."""
        return self.call("/v1/report", _as_check(descriptors, kwargs).body())

    def batch(self, checks):
        """POST /v1/check/batch: independent checks in one call; returns the list of answers'
        bodies (dicts) in order, or the whole `Answer` when the batch is refused."""
        answer = self.call("/v1/check/batch", {"checks": [c.body() for c in checks]})
        if answer.status != 200:
            return answer
        return answer.body.get("results", [])

    def call(self, path, body):
        """POST `body` as JSON to `path`; an `Answer`, or `SluiceError`."""
        payload = json.dumps(body).encode()
        conn, reused = self._take()
        try:
            answer = self._exchange(conn, path, payload)
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as error:
            conn.close()
            if not reused:
                raise SluiceError(str(error)) from None
            # The daemon closed an idle kept-alive connection before reading this request:
            # ask once more on a fresh one (never after a timeout: that request may have counted).
            conn = self._fresh()
            try:
                answer = self._exchange(conn, path, payload)
            except (OSError, http.client.HTTPException) as again:
                conn.close()
                raise SluiceError(str(again)) from None
        except (OSError, http.client.HTTPException) as error:
            conn.close()
            raise SluiceError(str(error) or type(error).__name__) from None
        self._give(conn)
        return answer

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()

    def close(self):
        """Closes the idle connections."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _exchange(self, conn, path, payload):
        conn.request("POST", path, payload, {"Content-Type": "application/json"})
        response = conn.getresponse()
        raw = response.read(MAX_ANSWER_BYTES + 1)
        if len(raw) > MAX_ANSWER_BYTES:
            raise SluiceError("the daemon's answer is too large")
        return decode(response.status, raw, response.getheaders())

    def _fresh(self):
        if self.socket_path:
            return _UnixConnection(self.socket_path, self.timeout)
        host, port = self.address
        return http.client.HTTPConnection(host, port, timeout=self.timeout)

    def _take(self):
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        return self._fresh(), False

    def _give(self, conn):
        with self._lock:
            if len(self._idle) < MAX_IDLE:
                self._idle.append(conn)
                return
        conn.close()


class AsyncClient:
    """An asyncio client (one per event loop): HTTP/1.1 on kept-alive streams, each call bounded
    by `timeout` seconds as a whole."""

    def __init__(self, socket=None, url=None, timeout=DEFAULT_TIMEOUT):
        self.socket_path, self.address = _target(socket, url)
        self.timeout = timeout
        self._idle = []

    async def check(self, descriptors=None, **kwargs):
        """POST /v1/check; see `Client.check`."""
        return await self.call("/v1/check", _as_check(descriptors, kwargs).body())

    async def report(self, descriptors=None, **kwargs):
        """POST /v1/report; see `Client.report`."""
        return await self.call("/v1/report", _as_check(descriptors, kwargs).body())

    async def batch(self, checks):
        """POST /v1/check/batch; see `Client.batch`."""
        answer = await self.call("/v1/check/batch", {"checks": [c.body() for c in checks]})
        if answer.status != 200:
            return answer
        return answer.body.get("results", [])

    async def call(self, path, body):
        """POST `body` as JSON to `path`; an `Answer`, or `SluiceError`."""
        payload = json.dumps(body).encode()
        request = (f"POST {path} HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(payload)}\r\n\r\n").encode() + payload
        try:
            return await asyncio.wait_for(self._ask(request), self.timeout)
        except asyncio.TimeoutError:
            raise SluiceError(f"no answer within {self.timeout} s") from None
        except (OSError, asyncio.IncompleteReadError, ValueError) as error:
            raise SluiceError(str(error) or type(error).__name__) from None

    async def close(self):
        """Closes the idle connections."""
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()

    async def _open(self):
        if self.socket_path:
            return await asyncio.open_unix_connection(self.socket_path)
        return await asyncio.open_connection(*self.address)

    async def _ask(self, request):
        if self._idle:
            reader, writer = self._idle.pop()
            try:
                return await self._exchange(reader, writer, request)
            except (ConnectionError, asyncio.IncompleteReadError):
                # A kept-alive connection the daemon closed meanwhile: once more, fresh.
                writer.close()
        reader, writer = await self._open()
        return await self._exchange(reader, writer, request)

    async def _exchange(self, reader, writer, request):
        try:
            writer.write(request)
            await writer.drain()
            status_line = await reader.readuntil(b"\r\n")
            parts = status_line.split(None, 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
                raise SluiceError("the daemon's answer is not HTTP/1.1")
            status = int(parts[1])
            headers, length, chunked, close = [], 0, False, False
            for _ in range(100):
                line = (await reader.readuntil(b"\r\n")).decode("latin-1").strip()
                if not line:
                    break
                name, _, value = line.partition(":")
                name, value = name.strip().lower(), value.strip()
                headers.append((name, value))
                if name == "content-length":
                    length = int(value)
                elif name == "transfer-encoding":
                    chunked = "chunked" in value.lower()
                elif name == "connection":
                    close = value.lower() == "close"
            else:
                raise SluiceError("too many header lines in the daemon's answer")
            raw = await (self._chunks(reader) if chunked else self._exactly(reader, length))
        except BaseException:
            writer.close()
            raise
        if close or len(self._idle) >= MAX_IDLE:
            writer.close()
        else:
            self._idle.append((reader, writer))
        return decode(status, raw, headers)

    @staticmethod
    async def _exactly(reader, length):
        if length > MAX_ANSWER_BYTES:
            raise SluiceError("the daemon's answer is too large")
        return await reader.readexactly(length)

    @staticmethod
    async def _chunks(reader):
        raw = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if len(raw) + size > MAX_ANSWER_BYTES:
                raise SluiceError("the daemon's answer is too large")
            raw += (await reader.readexactly(size + 2))[:size]
            if size == 0:
                return raw
