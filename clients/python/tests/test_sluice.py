"""sluice-ratelimit against a real daemon serving the shipped policies (public_api: token bucket,
burst 150, fail open; login: 10 per 5 min per ip, fail closed). The Rust test
tests/deploy/clients.rs starts it and sets:

- SLUICE_TEST_URL, SLUICE_TEST_SOCKET: the daemon (TCP and its Unix socket);
- SLUICE_TEST_STORE: `memory` or `redis`;
- SLUICE_TEST_URL_B: with `redis`, a second daemon on the same Redis (shared state);
- SLUICE_TEST_DOWN_URL: a daemon whose Redis is down (login answers 503, public_api fail-open);
- SLUICE_TEST_RUN: a token that keeps this run's partitions apart from other runs'.
"""

import asyncio
import io
import json
import logging
import os
import sys
import tempfile
import unittest
from wsgiref.util import setup_testing_defaults

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from sluice_ratelimit import (  # noqa: E402
    CLOSED, AsyncClient, Check, Client, SluiceASGI, SluiceError, SluiceWSGI)

# The library's warnings stay out of the runner's lines (the Rust side reads them).
logging.getLogger("sluice_ratelimit").addHandler(logging.NullHandler())

URL = os.environ.get("SLUICE_TEST_URL")
SOCKET = os.environ.get("SLUICE_TEST_SOCKET")
STORE = os.environ.get("SLUICE_TEST_STORE", "memory")
URL_B = os.environ.get("SLUICE_TEST_URL_B")
DOWN_URL = os.environ.get("SLUICE_TEST_DOWN_URL")
RUN = os.environ.get("SLUICE_TEST_RUN", str(os.getpid()))
#: Deadline of the tests' calls to a live daemon: generous, for a busy machine (the default is 0.5 s).
T = 5.0
MISSING_SOCKET = os.path.join(tempfile.gettempdir(), f"sluice-missing-{RUN}.sock")

if not URL or not SOCKET or not DOWN_URL:
    raise SystemExit("SLUICE_TEST_URL, SLUICE_TEST_SOCKET and SLUICE_TEST_DOWN_URL must name a daemon "
                     "(cargo test --test deploy clients starts them)")


def ip(name):
    """A partition of this run alone."""
    return f"{name}-{STORE}-{RUN}"


def route(request):
    """The routes of the test application: /login per client ip, fail closed; /graphql on the
    public API, its cost the query's (here a field of the JSON body), fail open; the rest free."""
    if request.path == "/login":
        return Check({"ip": request.headers.get("x-test-ip", "")}, policy="login", on_unreachable=CLOSED)
    if request.path == "/graphql":
        cost = json.loads(request.body or b"{}").get("cost", 1)
        return Check({"tenant": "acme", "api_key": request.headers.get("x-test-key", "")},
                     policy="public_api", cost=cost)
    if request.path == "/broken":
        return Check({}, policy="login")  # no ip: the daemon rejects the check
    return None


def wants_body(request):
    return request.path == "/graphql"


def wsgi_app(environ, start_response):
    body = environ["wsgi.input"].read()
    start_response("200 OK", [("content-type", "text/plain")])
    return [b"served:" + body]


async def asgi_app(scope, receive, send):
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"served:" + body})


def call_wsgi(client, path, headers=None, body=b"", max_body=1 << 20, chunked=None):
    """(status, headers with lower-case names, body) of one request through SluiceWSGI; with
    `chunked`, the body has no CONTENT_LENGTH, and `chunked` says `wsgi.input_terminated`."""
    middleware = SluiceWSGI(wsgi_app, route, client=client, read_body=wants_body, max_body=max_body)
    environ = {"PATH_INFO": path, "REQUEST_METHOD": "POST", "CONTENT_LENGTH": str(len(body)),
               "wsgi.input": io.BytesIO(body)}
    if chunked is not None:
        del environ["CONTENT_LENGTH"]
        environ["HTTP_TRANSFER_ENCODING"] = "chunked"
        if chunked:
            environ["wsgi.input_terminated"] = True
    for name, value in (headers or {}).items():
        environ["HTTP_" + name.upper().replace("-", "_")] = value
    setup_testing_defaults(environ)
    started = {}

    def start_response(status, response_headers, exc_info=None):
        started["status"] = int(status.split()[0])
        started["headers"] = {k.lower(): v for k, v in response_headers}

    out = b"".join(middleware(environ, start_response))
    return started["status"], started["headers"], out


def call_asgi(client, path, headers=None, body=b"", max_body=1 << 20):
    """The same through SluiceASGI, the body sent in two parts."""
    async def run():
        middleware = SluiceASGI(asgi_app, route, client=client(), read_body=wants_body, max_body=max_body)
        scope = {"type": "http", "method": "POST", "path": path, "query_string": b"",
                 "client": ("127.0.0.1", 5000),
                 "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]}
        parts = [{"type": "http.request", "body": body[:3], "more_body": True},
                 {"type": "http.request", "body": body[3:], "more_body": False}]

        async def receive():
            return parts.pop(0) if parts else {"type": "http.disconnect"}

        sent = []

        async def send(message):
            sent.append(message)

        await middleware(scope, receive, send)
        await middleware.client.close()
        start = sent[0]
        out = b"".join(m.get("body", b"") for m in sent[1:])
        return start["status"], {k.decode().lower(): v.decode() for k, v in start["headers"]}, out

    return asyncio.run(run())


class ClientTest(unittest.TestCase):
    def test_checks_over_the_socket_and_tcp_on_kept_alive_connections(self):
        who = ip("client")
        over_socket, over_tcp = Client(socket=SOCKET, timeout=T), Client(url=URL, timeout=T)
        self.addCleanup(over_socket.close)
        self.addCleanup(over_tcp.close)
        first = over_socket.check({"ip": who}, policy="login")
        self.assertEqual((first.status, first.body["remaining"], first.body["limit"]), (200, 9, 10))
        self.assertEqual(first.headers["x-ratelimit-remaining"], "9")
        second = over_tcp.check(Check({"ip": who}, policy="login"))
        self.assertEqual(second.body["remaining"], 8)
        kept = over_tcp._idle[0]
        over_tcp.check({"ip": who}, policy="login", dry_run=True)
        self.assertIs(over_tcp._idle[0], kept, "the connection is reused")
        self.assertEqual(len(over_tcp._idle), 1)

    def test_a_denial_carries_the_daemons_retry(self):
        client, who = Client(url=URL, timeout=T), ip("denied")
        self.addCleanup(client.close)
        answers = [client.check({"ip": who}, policy="login") for _ in range(11)]
        self.assertEqual([a.status for a in answers], [200] * 10 + [429])
        denied = answers[-1]
        self.assertEqual(denied.body["error"], "rate_limit")
        self.assertGreater(denied.body["retry_after_sec"], 0)
        self.assertEqual(denied.headers["retry-after"], str(denied.body["retry_after_sec"]))

    def test_batch_and_report(self):
        client, who = Client(socket=SOCKET, timeout=T), ip("batch")
        self.addCleanup(client.close)
        results = client.batch([Check({"ip": who}, policy="login"),
                                Check({"tenant": "acme", "api_key": who}, policy="public_api", cost=50)])
        self.assertEqual([(r["allowed"], r["remaining"]) for r in results], [(True, 9), (True, 100)])
        spent = client.report({"tenant": "acme", "api_key": who}, policy="public_api", cost=200)
        self.assertEqual((spent.status, spent.body["within_limit"]), (200, False))
        after = client.check({"tenant": "acme", "api_key": who}, policy="public_api")
        self.assertEqual(after.status, 429)

    def test_a_route_choice_other_than_open_or_closed_is_refused(self):
        with self.assertRaises(ValueError):
            Check({"ip": "x"}, policy="login", on_unreachable="maybe")

    def test_an_unreachable_daemon_is_an_error_within_the_deadline(self):
        with self.assertRaises(SluiceError):
            Client(socket=MISSING_SOCKET, timeout=0.2).check({"ip": "x"}, policy="login")

        async def ask():
            await AsyncClient(socket=MISSING_SOCKET, timeout=0.2).check({"ip": "x"}, policy="login")

        with self.assertRaises(SluiceError):
            asyncio.run(ask())

    def test_async_client_keeps_its_connection(self):
        async def run():
            client, who = AsyncClient(socket=SOCKET, timeout=T), ip("async")
            answers = [await client.check({"ip": who}, policy="login") for _ in range(3)]
            idle = len(client._idle)
            await client.close()
            return [a.body["remaining"] for a in answers], idle

        remaining, idle = asyncio.run(run())
        self.assertEqual(remaining, [9, 8, 7])
        self.assertEqual(idle, 1)


class MiddlewareScenarios:
    """The same scenarios through WSGI and ASGI: `call(make_client, path, headers, body)`."""

    def call(self, make_client, path, headers=None, body=b"", max_body=1 << 20):
        raise NotImplementedError

    def test_a_body_over_the_bound_is_a_413_and_spends_nothing(self):
        headers = {"x-test-key": ip(f"big-{self.name}")}
        status, _, out = self.call(lambda: self.client(url=URL, timeout=T), "/graphql", headers,
                                   b'{"cost": 40, "pad": "xxxxxxxx"}', max_body=16)
        self.assertEqual((status, json.loads(out)), (413, {"error": "payload_too_large"}))
        status, got, _ = self.call(lambda: self.client(url=URL, timeout=T), "/graphql", headers, b"{}")
        self.assertEqual((status, got["x-ratelimit-remaining"]), (200, "149"))

    def test_login_is_denied_with_the_documented_429(self):
        headers = {"x-test-ip": ip(f"login-{self.name}")}
        for n in range(10):
            status, got, out = self.call(lambda: self.client(url=URL, timeout=T), "/login", headers)
            self.assertEqual(status, 200, out)
            self.assertEqual(got["x-ratelimit-remaining"], str(9 - n))
            self.assertNotIn("retry-after", got)
        status, got, out = self.call(lambda: self.client(url=URL, timeout=T), "/login", headers)
        self.assertEqual(status, 429)
        body = json.loads(out)
        self.assertEqual(set(body), {"error", "retry_after_sec"})
        self.assertEqual(body["error"], "rate_limit")
        self.assertGreater(body["retry_after_sec"], 0)
        self.assertEqual(got["retry-after"], str(body["retry_after_sec"]))
        self.assertEqual(got["x-ratelimit-remaining"], "0")
        self.assertEqual(got["x-ratelimit-limit"], "10")
        self.assertIn("ratelimit", got)
        self.assertIn("ratelimit-policy", got)
        self.assertEqual(got["content-type"], "application/json")

    def test_the_cost_comes_from_the_request_and_the_body_still_reaches_the_app(self):
        headers = {"x-test-key": ip(f"graphql-{self.name}")}
        query = json.dumps({"query": "{ a b c }", "cost": 40}).encode()
        status, got, out = self.call(lambda: self.client(socket=SOCKET, timeout=T), "/graphql", headers, query)
        self.assertEqual((status, out), (200, b"served:" + query))
        self.assertEqual(got["x-ratelimit-remaining"], "110")

    def test_unreachable_sidecar_follows_the_route(self):
        missing = lambda: self.client(socket=MISSING_SOCKET, timeout=0.2)  # noqa: E731
        status, _, out = self.call(missing, "/login", {"x-test-ip": "x"})
        self.assertEqual((status, json.loads(out)), (503, {"error": "limiter_unavailable"}))
        status, _, out = self.call(missing, "/graphql", {"x-test-key": "x"}, b'{"cost": 1}')
        self.assertEqual((status, out), (200, b'served:{"cost": 1}'))
        status, _, out = self.call(missing, "/free")
        self.assertEqual((status, out), (200, b"served:"))

    def test_a_fail_closed_policy_on_a_store_that_is_down_answers_503(self):
        down = lambda: self.client(url=DOWN_URL, timeout=T)  # noqa: E731
        status, _, out = self.call(down, "/login", {"x-test-ip": ip(f"down-{self.name}")})
        self.assertEqual((status, json.loads(out)), (503, {"error": "limiter_unavailable"}))
        status, got, out = self.call(down, "/graphql", {"x-test-key": ip(f"down-{self.name}")}, b"{}")
        self.assertEqual((status, out), (200, b"served:{}"), "public_api fails open")
        self.assertNotIn("x-ratelimit-remaining", got, "a fail-open answer carries no quota")

    def test_a_check_the_daemon_rejects_is_a_500_not_an_open_door(self):
        status, _, out = self.call(lambda: self.client(url=URL, timeout=T), "/broken")
        self.assertEqual((status, json.loads(out)), (500, {"error": "limiter_rejected"}))

    def test_redis_state_is_shared_between_daemons(self):
        if STORE != "redis":
            self.skipTest("shared state needs Redis")
        self.assertTrue(URL_B, "SLUICE_TEST_URL_B names the second daemon on the same Redis")
        headers = {"x-test-ip": ip(f"shared-{self.name}")}
        statuses = [self.call(lambda: self.client(url=URL, timeout=T), "/login", headers)[0] for _ in range(10)]
        self.assertEqual(statuses, [200] * 10)
        status, got, _ = self.call(lambda: self.client(url=URL_B, timeout=T), "/login", headers)
        self.assertEqual((status, got["x-ratelimit-remaining"]), (429, "0"))


class WsgiTest(MiddlewareScenarios, unittest.TestCase):
    name, client = "wsgi", Client

    def call(self, make_client, path, headers=None, body=b"", max_body=1 << 20):
        with make_client() as client:
            return call_wsgi(client, path, headers, body, max_body)


    def test_a_chunked_body_is_read_when_the_server_ends_it_and_refused_when_it_does_not(self):
        headers = {"x-test-key": ip("graphql-chunked")}
        query = json.dumps({"query": "{ a b c }", "cost": 40}).encode()
        with Client(url=URL, timeout=T) as client:
            status, got, out = call_wsgi(client, "/graphql", headers, query, chunked=True)
            self.assertEqual((status, out), (200, b"served:" + query))
            self.assertEqual(got["x-ratelimit-remaining"], "110", "priced from the body")
            status, _, out = call_wsgi(client, "/graphql", headers, query, max_body=16, chunked=True)
            self.assertEqual((status, json.loads(out)), (413, {"error": "payload_too_large"}))
            status, _, out = call_wsgi(client, "/graphql", headers, query, chunked=False)
            self.assertEqual((status, json.loads(out)), (411, {"error": "length_required"}))
            status, got, _ = call_wsgi(client, "/graphql", headers, b"{}")
            self.assertEqual(got["x-ratelimit-remaining"], "109", "nothing spent by the refusals")


class AsgiTest(MiddlewareScenarios, unittest.TestCase):
    name, client = "asgi", AsyncClient

    def call(self, make_client, path, headers=None, body=b"", max_body=1 << 20):
        return call_asgi(make_client, path, headers, body, max_body)


if __name__ == "__main__":
    unittest.main()
