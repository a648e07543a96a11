"""Reserve, then settle, through a real uvicorn and a real daemon (`SLUICE_TEST_RESERVE_URL`:
a daemon whose policy `llm` takes reservations, started by tests/deploy/clients.rs). An app
streams one chunk per token and reports each to `scope["sluice.usage"]`; the counter then holds
exactly what the app used, not the estimate: after a whole stream, after a client that
disconnects mid-stream, and after a handler that raises mid-stream; beside a concurrency
policy's permit, the slot comes back too. A denial reserves nothing.
"""

import asyncio
import http.client
import logging
import os
import socket
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from sluice_ratelimit import CLOSED, AsyncClient, Check, Client, SluiceReserveASGI  # noqa: E402
from servers import T, serve_asgi, uvicorn  # noqa: E402

logging.getLogger("sluice_ratelimit").addHandler(logging.NullHandler())

URL = os.environ.get("SLUICE_TEST_RESERVE_URL")
RUN = os.environ.get("SLUICE_TEST_RUN", str(os.getpid()))
#: The estimate each request reserves; the `llm` policy's limit is 1000.
ESTIMATE = 100
LIMIT = 1000


def left(tenant):
    """What the `llm` counter of `tenant` has left (a dry run of 1 answers what is left after it)."""
    with Client(url=URL, timeout=T) as client:
        answer = client.check({"tenant": tenant}, policy="llm", dry_run=True)
    return answer.body["remaining"] + 1 if answer.allowed else 0


def eventually(what, done, within=10.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if done():
            return
        time.sleep(0.02)
    raise AssertionError(f"{what} within {within} s")


class ReserveThroughUvicorn(unittest.TestCase):
    def setUp(self):
        if URL is None:
            if os.environ.get("CI") == "true":
                self.fail("SLUICE_TEST_RESERVE_URL is not set")
            self.skipTest("SLUICE_TEST_RESERVE_URL is not set (tests/deploy/clients.rs sets it)")
        if uvicorn is None:
            self.skipTest("uvicorn is not installed (pip install uvicorn; CI installs it)")
        #: Per request path: the tokens the app reported, and the usage once settled.
        self.streamed = {}
        self.settled = {}
        self.port = self.serve()

    def serve(self):
        streamed = self.streamed

        async def stream(scope, send):
            usage = scope["sluice.usage"]
            fail_at = 5 if scope["path"].startswith("/raise") else None
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/plain")]})
            streamed[scope["path"]] = 0
            for n in range(20):
                if n == fail_at:
                    raise RuntimeError("the model failed mid-stream")
                usage.add(1)
                streamed[scope["path"]] += 1
                await send({"type": "http.response.body", "body": b"token\n", "more_body": True})
                await asyncio.sleep(0.05)
            await send({"type": "http.response.body", "body": b""})

        async def app(scope, receive, send):
            # As Starlette's StreamingResponse does: the stream stops when the client leaves.
            streaming = asyncio.ensure_future(stream(scope, send))

            async def until_disconnect():
                while (await receive())["type"] != "http.disconnect":
                    pass

            watching = asyncio.ensure_future(until_disconnect())
            await asyncio.wait([streaming, watching], return_when=asyncio.FIRST_COMPLETED)
            for task in (streaming, watching):
                task.cancel()
            await asyncio.gather(watching, return_exceptions=True)
            if streaming.done() and not streaming.cancelled():
                streaming.result()  # the handler's error, if it raised

        def route(request):
            tenant = request.path.rsplit("/", 1)[-1]
            if request.path.startswith("/both/"):
                # Every policy that applies: `llm` and the concurrency policy `slots` (1 slot).
                return Check({"tenant": tenant, "route": "both"}, cost=ESTIMATE, on_unreachable=CLOSED)
            return Check({"tenant": tenant}, policy="llm", cost=ESTIMATE, on_unreachable=CLOSED)

        client = AsyncClient(url=URL, timeout=T)
        settled = self.settled
        limited = SluiceReserveASGI(app, route, client=client,
                                    on_settled=lambda usage: settled.__setitem__(usage.reservation, usage))
        # A handler that raises is logged by uvicorn: kept out of the runner's lines.
        return serve_asgi(self, limited, client, log_level="critical")

    def tenant(self, case):
        return f"{RUN}-{case}"

    def test_reserve_a_whole_stream_settles_what_it_used(self):
        tenant = self.tenant("whole")
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=T)
        conn.request("GET", f"/stream/{tenant}")
        response = conn.getresponse()
        body = response.read()
        conn.close()
        self.assertEqual((response.status, body.count(b"token")), (200, 20))
        eventually("the settle", lambda: len(self.settled) == 1)
        usage = next(iter(self.settled.values()))
        self.assertEqual((usage.cost, usage.settled.status), (20, 200), usage.settled)
        self.assertEqual(usage.settled.body["policies"][0]["refunded"], ESTIMATE - 20)
        self.assertEqual(left(tenant), LIMIT - 20)

    def test_reserve_a_client_that_disconnects_mid_stream_settles_what_was_used(self):
        tenant = self.tenant("gone")
        path = f"/stream/{tenant}"
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=T)
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        received = b""
        while received.count(b"token") < 3:
            chunk = sock.recv(4096)
            self.assertTrue(chunk, "the stream ended early")
            received += chunk
        sock.close()
        eventually("the settle after the disconnect", lambda: len(self.settled) == 1)
        usage = next(iter(self.settled.values()))
        used = self.streamed[path]
        self.assertLess(used, 20, "the stream stopped when its client left")
        self.assertEqual((usage.cost, usage.settled.status), (used, 200), usage.settled)
        self.assertEqual(left(tenant), LIMIT - used)

    def test_reserve_a_handler_that_raises_settles_what_was_used(self):
        tenant = self.tenant("raise")
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=T)
        conn.request("GET", f"/raise/{tenant}")
        try:
            conn.getresponse().read()
        except (http.client.HTTPException, OSError):
            pass  # the response ended abruptly: what the server does with a failed app
        conn.close()
        eventually("the settle after the error", lambda: len(self.settled) == 1)
        usage = next(iter(self.settled.values()))
        self.assertEqual((usage.cost, usage.settled.status), (5, 200), usage.settled)
        self.assertEqual(left(tenant), LIMIT - 5)

    def test_reserve_beside_a_permit_gives_the_slot_back_and_settles(self):
        tenant = self.tenant("both")
        for n in range(2):
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=T)
            conn.request("GET", f"/both/{tenant}")
            response = conn.getresponse()
            body = response.read()
            conn.close()
            # The second request gets the one slot only if the first gave it back.
            self.assertEqual((response.status, body.count(b"token")), (200, 20), f"request {n}")
            eventually("the settle", lambda: len(self.settled) == n + 1)
        self.assertEqual(left(tenant), LIMIT - 40)

    def test_reserve_a_denial_reserves_nothing(self):
        tenant = self.tenant("over")
        with Client(url=URL, timeout=T) as client:
            answer = client.check({"tenant": tenant}, policy="llm", cost=LIMIT - 50)
        self.assertEqual(answer.status, 200, answer)
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=T)
        conn.request("GET", f"/stream/{tenant}")
        response = conn.getresponse()
        response.read()
        conn.close()
        self.assertEqual(response.status, 429)
        self.assertEqual((self.settled, left(tenant)), ({}, 50))


if __name__ == "__main__":
    unittest.main()
