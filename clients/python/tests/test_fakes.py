"""The clients against fake daemons that misbehave in ways a real one (or the network) can: close
after reading a check, trickle an answer, send a header line over 64 KiB, an interim 100 Continue,
or nothing at all. Each answer is the library's error, then the route's failure mode; a check the
daemon read is never sent twice; a call has one deadline."""

import asyncio
import io
import json
import logging
import os
import socket
import struct
import sys
import tempfile
import threading
import time
import unittest
from wsgiref.util import setup_testing_defaults

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from sluice_ratelimit import (  # noqa: E402
    CLOSED, AsyncClient, Check, Client, Reply, SluiceASGI, SluiceError, SluiceWSGI)

# The library's warnings stay out of the runner's lines (the Rust side reads them).
logging.getLogger("sluice_ratelimit").addHandler(logging.NullHandler())

OK_BODY = b'{"allowed":true,"policy":"login","limit":10,"remaining":9}'
OK = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-ratelimit-remaining: 9\r\n"
      b"content-length: %d\r\n\r\n" % len(OK_BODY)) + OK_BODY
DENIED_BODY = b'{"allowed":false,"error":"rate_limit","retry_after_sec":7}'
DENIED = (b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nretry-after: 7\r\n"
          b"content-length: %d\r\n\r\n" % len(DENIED_BODY)) + DENIED_BODY
#: Bound on any wait in these tests (a busy machine); the clients' deadlines are far shorter.
BOUND = 10.0


def read_request(conn):
    """One whole request from `conn` (headers and Content-Length body), or None at end of stream."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        body += chunk
    return head


class FakeDaemon:
    """A TCP server on 127.0.0.1: `answer(conn, n)` serves the n-th request (0-based) of a
    connection, after it was read and counted in `requests`; returning False closes."""

    def __init__(self, answer):
        self.answer = answer
        self.requests = 0
        self.lock = threading.Lock()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.url = "http://127.0.0.1:%d" % self.server.getsockname()[1]
        self.stopping = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        deadline = time.monotonic() + 60
        while not self.stopping and time.monotonic() < deadline:
            try:
                conn, _ = self.server.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        conn.settimeout(BOUND)
        try:
            for n in range(100):
                if read_request(conn) is None:
                    return
                with self.lock:
                    self.requests += 1
                if self.answer(conn, n) is False:
                    return
        except OSError:
            pass
        finally:
            conn.close()

    def close(self):
        self.stopping = True
        self.server.close()
        self.thread.join(BOUND)


def close_with_reset(conn):
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


def served_once_then(close):
    """Answers a connection's first request, then reads the second and closes (`close`)."""
    def answer(conn, n):
        if n == 0:
            conn.sendall(OK)
            return True
        close(conn)
        return False
    return answer


def partial_status_line(conn):
    conn.sendall(b"HTTP/1.1 2")
    conn.shutdown(socket.SHUT_WR)


def trickle(conn, n):
    for byte in OK:
        conn.sendall(bytes([byte]))
        time.sleep(0.2)
    return True


def fake(test, answer):
    daemon = FakeDaemon(answer)
    test.addCleanup(daemon.close)
    return daemon


def run_asgi(middleware, path="/login"):
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"served"})

    async def go():
        sent = []

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message):
            sent.append(message)

        limited = middleware(app)
        await limited({"type": "http", "method": "GET", "path": path, "headers": [],
                       "client": ("192.0.2.1", 1)}, receive, send)
        client = getattr(limited, "client", None) or limited.middleware.client
        await client.close()
        return sent[0]["status"], dict(sent[0]["headers"]), b"".join(m.get("body", b"") for m in sent[1:])

    return asyncio.run(go())


def run_wsgi(middleware, path="/login"):
    def app(environ, start_response):
        start_response("200 OK", [])
        return [b"served"]

    environ = {"PATH_INFO": path, "REQUEST_METHOD": "GET", "wsgi.input": io.BytesIO()}
    setup_testing_defaults(environ)
    started = {}

    def start_response(status, headers, exc_info=None):
        started["status"], started["headers"] = int(status.split()[0]), dict(headers)

    out = b"".join(middleware(app)(environ, start_response))
    return started["status"], started["headers"], out


def login_route(on_unreachable=CLOSED):
    return lambda request: Check({"ip": "192.0.2.1"}, policy="login", on_unreachable=on_unreachable)


class ResendTest(unittest.TestCase):
    """A check the daemon read counts: the connection closing afterwards (FIN, RST, or after a
    partial status line) is an error, never a resend (3 checks counted for 2 calls before)."""

    CLOSES = {"fin": lambda conn: conn.shutdown(socket.SHUT_RDWR), "rst": close_with_reset,
              "partial": partial_status_line}

    def test_blocking_client(self):
        for name, close in self.CLOSES.items():
            with self.subTest(name):
                daemon = fake(self, served_once_then(close))
                with Client(url=daemon.url, timeout=2) as client:
                    self.assertEqual(client.check({"ip": "x"}).status, 200)
                    with self.assertRaises(SluiceError):
                        client.check({"ip": "x"})
                self.assertEqual(daemon.requests, 2, f"{name}: one request per call")

    def test_async_client(self):
        for name, close in self.CLOSES.items():
            with self.subTest(name):
                daemon = fake(self, served_once_then(close))

                async def go():
                    client = AsyncClient(url=daemon.url, timeout=2)
                    first = await client.check({"ip": "x"})
                    try:
                        await client.check({"ip": "x"})
                        second = None
                    except SluiceError as error:
                        second = error
                    await client.close()
                    return first, second

                first, second = asyncio.run(go())
                self.assertEqual(first.status, 200)
                self.assertIsInstance(second, SluiceError)
                self.assertEqual(daemon.requests, 2, f"{name}: one request per call")

    def test_an_idle_connection_the_daemon_closed_is_not_used(self):
        daemon = fake(self, served_once_then(lambda conn: None))

        def close_idle(conn, n):
            conn.sendall(OK)
            return False  # close right after answering: the client's kept connection is dead

        daemon.answer = close_idle
        with Client(url=daemon.url, timeout=2) as client:
            self.assertEqual(client.check({"ip": "x"}).status, 200)
            deadline = time.monotonic() + BOUND
            while client._idle and client._idle[0].alive() and time.monotonic() < deadline:
                time.sleep(0.01)
            self.assertEqual(client.check({"ip": "x"}).status, 200, "a fresh connection, no error")
        self.assertEqual(daemon.requests, 2)


class DeadlineTest(unittest.TestCase):
    def test_one_deadline_per_call_not_per_read(self):
        daemon = fake(self, trickle)
        client = Client(url=daemon.url, timeout=0.5)
        self.addCleanup(client.close)
        started = time.monotonic()
        with self.assertRaises(SluiceError):
            client.check({"ip": "x"})
        # The whole answer takes len(OK) * 0.2 s (about 30 s); the call ends near its 0.5 s.
        self.assertLess(time.monotonic() - started, 5.0)
        status, headers, out = run_wsgi(lambda app: SluiceWSGI(app, login_route(), client=client))
        self.assertEqual((status, headers.get("retry-after"), json.loads(out)),
                         (503, "1", {"error": "limiter_unavailable"}))


class UnreadableAnswerTest(unittest.TestCase):
    def test_a_header_line_over_64_kib_is_the_librarys_error_then_the_routes_choice(self):
        def huge(conn, n):
            conn.sendall(b"HTTP/1.1 200 OK\r\nx-pad: " + b"a" * (70 * 1024) + b"\r\ncontent-length: 2\r\n\r\n{}")
            return True

        daemon = fake(self, huge)
        for on_unreachable, expected in ((CLOSED, 503), ("open", 200)):
            status, _, _ = run_asgi(lambda app: SluiceASGI(
                app, login_route(on_unreachable), client=AsyncClient(url=daemon.url, timeout=2)))
            self.assertEqual(status, expected, on_unreachable)
        with self.assertRaises(SluiceError):
            Client(url=daemon.url, timeout=2).check({"ip": "x"})

    def test_an_interim_100_continue_is_skipped(self):
        def continued(conn, n):
            conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n" + OK)
            return True

        daemon = fake(self, continued)
        status, headers, out = run_asgi(lambda app: SluiceASGI(
            app, login_route(), client=AsyncClient(url=daemon.url, timeout=2)))
        self.assertEqual((status, out, headers.get(b"x-ratelimit-remaining")), (200, b"served", b"9"))
        with Client(url=daemon.url, timeout=2) as client:
            self.assertEqual(client.check({"ip": "x"}).status, 200)

    def test_garbage_and_a_short_body_are_errors(self):
        nested = b"[" * 200_000 + b"]" * 200_000
        for raw in (b"SMTP ready\r\n\r\n", b"HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\n{}",
                    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n",
                    b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(nested) + nested):
            def answer(conn, n, raw=raw):
                conn.sendall(raw)
                conn.shutdown(socket.SHUT_WR)
                return False

            daemon = fake(self, answer)
            with self.subTest(raw=raw[:20]):
                with self.assertRaises(SluiceError):
                    Client(url=daemon.url, timeout=2).check({"ip": "x"})

                async def go():
                    await AsyncClient(url=daemon.url, timeout=2).check({"ip": "x"})

                with self.assertRaises(SluiceError):
                    asyncio.run(go())


class HooksTest(unittest.TestCase):
    def test_every_decision_without_the_sidecar_is_counted_and_logged_once_per_interval(self):
        missing = os.path.join(tempfile.gettempdir(), f"sluice-fake-missing-{os.getpid()}.sock")
        for kind in ("wsgi", "asgi"):
            seen = []

            def hook(check, error):
                seen.append((check.policy, type(error).__name__))

            with self.subTest(kind), self.assertLogs("sluice_ratelimit", logging.WARNING) as logs:
                if kind == "wsgi":
                    shared = SluiceWSGI(None, login_route(), client=Client(socket=missing),
                                        on_fallback=hook, log_interval=3600)
                    answers = [run_wsgi(lambda app: _Swap(shared, app)) for _ in range(5)]
                else:
                    shared = SluiceASGI(None, login_route(), client=AsyncClient(socket=missing),
                                        on_fallback=hook, log_interval=3600)
                    answers = [run_asgi(lambda app: _Swap(shared, app)) for _ in range(5)]
            self.assertEqual([(a[0], a[1].get("retry-after", a[1].get(b"retry-after"))) for a in answers],
                             [(503, "1" if kind == "wsgi" else b"1")] * 5)
            self.assertEqual(len(seen), 5, "the hook counts every unreachable decision")
            self.assertEqual(seen[0][0], "login")
            self.assertEqual(len(logs.records), 1, "one line per interval")

    def test_a_denial_can_be_shaped(self):
        def denied(conn, n):
            conn.sendall(DENIED)
            return True

        daemon = fake(self, denied)

        def html(check, answer):
            return Reply(429, [("content-type", "text/html"), ("retry-after", answer.headers["retry-after"])],
                         b"<p>slow down</p>")

        with Client(url=daemon.url, timeout=2) as client:
            status, headers, out = run_wsgi(lambda app: SluiceWSGI(app, login_route(), client=client,
                                                                    on_denied=html))
        self.assertEqual((status, headers["content-type"], headers["retry-after"], out),
                         (429, "text/html", "7", b"<p>slow down</p>"))
        status, _, out = run_asgi(lambda app: SluiceASGI(app, login_route(),
                                                         client=AsyncClient(url=daemon.url, timeout=2)))
        self.assertEqual((status, json.loads(out)), (429, {"error": "rate_limit", "retry_after_sec": 7}))


class _Swap:
    """`middleware` in front of `app` (one middleware, hence one watch, for several requests)."""

    def __init__(self, middleware, app):
        middleware.app = app
        self.middleware = middleware

    def __call__(self, *args):
        return self.middleware(*args)


if __name__ == "__main__":
    unittest.main()
