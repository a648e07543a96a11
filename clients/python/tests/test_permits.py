"""Permits through the middlewares, in real servers (uvicorn for ASGI, wsgiref for WSGI) against
the real daemon: `slots` is a concurrency policy of one permit per tenant whose `permit_ttl` is an
hour (tests/deploy/clients.rs adds it to the shipped policies), so a slot that comes back within
the test came back by a release. Each path of a request is one scenario, on a tenant of its own:
the slot is seen held while the request runs and free after it, asked of the daemon (a dry run:
200 while free, 429 while held); the middleware's client counts its releases (exactly one, and
the daemon answered `released: true` to it).
"""

import asyncio
import http.client
import logging
import os
import socket
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from sluice_ratelimit import CLOSED, AsyncClient, Check, Client, SluiceASGI, SluiceError, SluiceWSGI  # noqa: E402
from servers import serve_asgi, serve_wsgi, uvicorn  # noqa: E402

logging.getLogger("sluice_ratelimit").addHandler(logging.NullHandler())

URL = os.environ.get("SLUICE_TEST_URL")
STORE = os.environ.get("SLUICE_TEST_STORE", "memory")
RUN = os.environ.get("SLUICE_TEST_RUN", str(os.getpid()))
T = 5.0
#: How long a streamed answer lasts when nobody stops it (chunks of 1 KiB every 10 ms).
STREAM_CHUNKS = 800


def closed_port():
    """A loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def eventually(what, predicate, timeout=T):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"not within {timeout} s: {what}")


def route(request):
    """`/<path>?<tenant>`: one permit of `slots` per tenant, fail closed."""
    return Check({"tenant": request.query}, policy="slots", on_unreachable=CLOSED)


class Counted:
    """What the middleware's client did with permits: each release's answer (`released`), or
    the error it met."""

    def __init__(self, fail=False):
        self.releases = []
        self.fail = fail
        self.dead = Client(url=f"127.0.0.1:{closed_port()}", timeout=T)


class CountingClient(Client):
    def __init__(self, counted, **kwargs):
        super().__init__(**kwargs)
        self.counted = counted

    def release(self, permit):
        try:
            answer = (self.counted.dead if self.counted.fail else super()).release(permit)
        except SluiceError as error:
            self.counted.releases.append(error)
            raise
        self.counted.releases.append(answer.body.get("released"))
        return answer


class CountingAsyncClient(AsyncClient):
    def __init__(self, counted, **kwargs):
        super().__init__(**kwargs)
        self.counted = counted

    async def release(self, permit):
        if self.counted.fail:
            dead = AsyncClient(url=self.counted.dead.address, timeout=T)
            try:
                return await dead.release(permit)
            except SluiceError as error:
                self.counted.releases.append(error)
                raise
        answer = await super().release(permit)
        self.counted.releases.append(answer.body.get("released"))
        return answer


class Scenarios:
    """Each server class gives `serve(counted) -> port` (stopped at cleanup), `gate` (a
    threading.Event the applications wait on before answering) and `finished` (the paths whose
    application has returned)."""

    daemon = None

    @classmethod
    def setUpClass(cls):
        cls.daemon = Client(url=URL, timeout=T)

    @classmethod
    def tearDownClass(cls):
        cls.daemon.close()

    def tenant(self):
        """The scenario's own partition."""
        return f"{self._testMethodName}-{self.kind}-{STORE}-{RUN}"

    def free(self, tenant):
        answer = self.daemon.check({"tenant": tenant}, policy="slots", dry_run=True)
        self.assertIn(answer.status, (200, 429), answer)
        return answer.status == 200

    def start(self, path, fail=False, held=True):
        """Serves, asks `path` in a thread, and (`held`) waits until the daemon holds the tenant's slot.
        Returns (tenant, counted, the thread's outcome: a dict filled when it ends, thread)."""
        self.gate = threading.Event()
        self.finished = set()
        counted = Counted(fail)
        self.addCleanup(counted.dead.close)
        port = self.serve(counted)
        tenant = self.tenant()
        self.assertTrue(self.free(tenant), "the slot is free before the request")
        outcome = {}

        def ask():
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3 * T)
            try:
                conn.request("GET", f"{path}?{tenant}")
                response = conn.getresponse()
                outcome["status"], outcome["body"] = response.status, response.read()
            except Exception as error:  # noqa: BLE001 (the scenario asserts on it)
                outcome["error"] = error
            finally:
                conn.close()

        thread = threading.Thread(target=ask, daemon=True)
        thread.start()
        self.addCleanup(self.gate.set)
        if held:
            eventually("the slot held while the request runs", lambda: not self.free(tenant))
        return tenant, counted, outcome, thread

    def finish(self, tenant, counted, thread):
        self.gate.set()
        thread.join(3 * T)
        eventually("the slot back", lambda: self.free(tenant))
        eventually("one release", lambda: len(counted.releases) == 1)
        time.sleep(0.1)  # a second release would show now
        self.assertEqual(counted.releases, [True], "released exactly once, and it gave the slot back")

    def test_permit_released_when_the_answer_is_sent(self):
        tenant, counted, outcome, thread = self.start("/ok")
        self.finish(tenant, counted, thread)
        self.assertEqual((outcome.get("status"), outcome.get("body")), (200, b"one,two,three"), outcome)

    def test_permit_released_when_the_application_raises(self):
        tenant, counted, outcome, thread = self.start("/raise")
        self.finish(tenant, counted, thread)
        self.assertEqual(outcome.get("status"), 500, outcome)

    def test_permit_released_when_the_application_raises_mid_stream(self):
        tenant, counted, outcome, thread = self.start("/raise-late")
        self.finish(tenant, counted, thread)
        self.assertIn("/raise-late", self.finished)

    def test_permit_released_on_a_timeout(self):
        tenant, counted, outcome, thread = self.start("/slow", held=False)
        # No gate: the server's timeout (ASGI: a cancellation after 1 s; WSGI: the
        # application's own upstream call timing out after 0.5 s) ends the request.
        thread.join(3 * T)
        eventually("the slot back", lambda: self.free(tenant))
        self.assertEqual(counted.releases, [True])
        self.assertEqual(outcome.get("status"), self.timeout_status, outcome)

    def test_permit_released_when_the_client_disconnects_mid_stream(self):
        self.gate = threading.Event()
        self.finished = set()
        counted = Counted()
        self.addCleanup(counted.dead.close)
        port = self.serve(counted)
        self.addCleanup(self.gate.set)
        tenant = self.tenant()
        self.assertTrue(self.free(tenant))
        sock = socket.create_connection(("127.0.0.1", port), timeout=T)
        try:
            sock.sendall(f"GET /stream?{tenant} HTTP/1.1\r\nHost: app\r\n\r\n".encode())
            received = b""
            while b"chunk" not in received:
                data = sock.recv(4096)
                self.assertTrue(data, "the stream started")
                received += data
            self.assertFalse(self.free(tenant), "held while the stream runs")
        finally:
            # Abandoned mid-stream, with unread bytes: the peer resets the connection.
            sock.close()
        eventually("the slot back after the client left", lambda: self.free(tenant))
        self.assertNotIn("/stream", self.finished,
                         "given back when the client left, not when the stream would have ended")
        if self.kind == "asgi":
            # The application goes on after the client left; its end releases nothing more.
            self.gate.set()
            eventually("the application ended", lambda: "/stream" in self.finished)
        time.sleep(0.1)
        self.assertEqual(counted.releases, [True], "released exactly once")

    def test_permit_release_that_fails_is_logged_and_the_answer_is_whole(self):
        with self.assertLogs("sluice_ratelimit", "WARNING") as logs:
            tenant, counted, outcome, thread = self.start("/ok", fail=True)
            self.gate.set()
            thread.join(3 * T)
            eventually("the release tried", lambda: len(counted.releases) == 1)
        self.assertEqual((outcome.get("status"), outcome.get("body")), (200, b"one,two,three"), outcome)
        self.assertTrue(any("release failed" in line for line in logs.output), logs.output)
        self.assertIsInstance(counted.releases[0], SluiceError)
        # Nothing was given back: the slot stays held (until its permit_ttl).
        self.assertFalse(self.free(tenant))


class UvicornTest(Scenarios, unittest.TestCase):
    kind = "asgi"
    timeout_status = 504

    def setUp(self):
        if uvicorn is None:
            self.skipTest("uvicorn is not installed (pip install uvicorn; CI installs it)")

    def serve(self, counted):
        gate, finished = self.gate, self.finished

        async def app(scope, receive, send):
            path = scope["path"]
            try:
                if path == "/slow":
                    await asyncio.sleep(30)
                if path != "/stream":
                    await asyncio.get_running_loop().run_in_executor(None, gate.wait, 3 * T)
                if path == "/raise":
                    raise RuntimeError("the handler failed")
                await send({"type": "http.response.start", "status": 200, "headers": []})
                if path == "/stream":
                    # Writes on whether anyone reads or not (uvicorn drops writes to a client gone).
                    for _ in range(STREAM_CHUNKS):
                        if gate.is_set():  # the scenario is over
                            return
                        await send({"type": "http.response.body", "body": b"chunk" * 200, "more_body": True})
                        await asyncio.sleep(0.01)
                elif path == "/raise-late":
                    await send({"type": "http.response.body", "body": b"one,", "more_body": True})
                    raise RuntimeError("the stream failed")
                else:
                    for part in (b"one,", b"two,"):
                        await send({"type": "http.response.body", "body": part, "more_body": True})
                await send({"type": "http.response.body", "body": b"three"})
            finally:
                finished.add(path)

        client = CountingAsyncClient(counted, url=URL, timeout=T)
        limited = SluiceASGI(app, route, client=client)

        async def with_timeout(scope, receive, send):
            started = []

            async def sending(message):
                started.append(True)
                await send(message)

            try:
                await asyncio.wait_for(limited(scope, receive, sending), 1.0 if scope["path"] == "/slow" else 3 * T)
            except asyncio.TimeoutError:
                if not started:
                    await send({"type": "http.response.start", "status": 504, "headers": []})
                    await send({"type": "http.response.body", "body": b"timeout"})

        return serve_asgi(self, with_timeout, client, log_level="critical")


class WsgirefTest(Scenarios, unittest.TestCase):
    kind = "wsgi"
    timeout_status = 500

    def serve(self, counted):
        gate, finished = self.gate, self.finished

        def app(environ, start_response):
            path = environ["PATH_INFO"]
            if path == "/slow":
                # An upstream call that times out: in WSGI a timeout is the application's own
                # exception.
                threading.Event().wait(0.5)
                finished.add(path)
                raise TimeoutError("the upstream did not answer within 0.5 s")
            if path != "/stream":
                gate.wait(3 * T)
            if path == "/raise":
                finished.add(path)
                raise RuntimeError("the handler failed")
            start_response("200 OK", [("content-type", "text/plain")])

            def body():
                # `finished` only when the body ran to its end (or raised): the server closing
                # it early (a client gone) is not an end.
                if path == "/stream":
                    for _ in range(STREAM_CHUNKS):
                        if gate.is_set():  # the scenario is over
                            return
                        yield b"chunk" * 200
                        time.sleep(0.01)
                elif path == "/raise-late":
                    yield b"one,"
                    finished.add(path)
                    raise RuntimeError("the stream failed")
                else:
                    yield b"one,"
                    yield b"two,"
                yield b"three"
                finished.add(path)

            return body()

        client = CountingClient(counted, url=URL, timeout=T)
        return serve_wsgi(self, SluiceWSGI(app, route, client=client), client)


class PlainReleaseTest(unittest.TestCase):
    """`Client.release` and `AsyncClient.release`: the slot back once, then `released: false`;
    what is not a permit refused with the daemon's reason."""

    def test_permit_release_call(self):
        tenant = f"plain-{STORE}-{RUN}"
        with Client(url=URL, timeout=T) as client:
            first = client.check({"tenant": tenant}, policy="slots")
            self.assertEqual(first.status, 200, first)
            self.assertIsNotNone(first.permit, first)
            self.assertEqual(client.check({"tenant": tenant}, policy="slots").status, 429)
            released = client.release(first.permit)
            self.assertEqual((released.status, released.body), (200, {"released": True, "policies": ["slots"]}))
            again = client.release(first.permit)
            self.assertEqual((again.status, again.body["released"]), (200, False))
            bad = client.release("not-a-permit")
            self.assertEqual((bad.status, bad.body["error"]), (400, "bad_permit"))

        async def on_async():
            client = AsyncClient(url=URL, timeout=T)
            try:
                answer = await client.check({"tenant": tenant}, policy="slots")
                self.assertEqual(answer.status, 200, answer)
                released = await client.release(answer.permit)
                self.assertEqual(released.body["released"], True)
            finally:
                await client.close()

        asyncio.run(on_async())


if __name__ == "__main__":
    unittest.main()
