"""The login limit per client address through real servers (uvicorn for ASGI, wsgiref for WSGI)
and a real daemon, with `TrustedProxies` configured as docs/api.md says: a client rotating
X-Forwarded-For gets 10 of 15 logins; two clients behind one trusted proxy get 10 each. uvicorn
runs with `proxy_headers=False` (docs/api.md: its own X-Forwarded-For handling is off). Clients
connect from their own loopback addresses (127.48.x.y) so each scenario has its own partition.
"""

import http.client
import logging
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from sluice_ratelimit import (  # noqa: E402
    CLOSED, AsyncClient, Check, Client, SluiceASGI, SluiceWSGI, TrustedProxies)
from servers import serve_asgi, serve_wsgi, uvicorn  # noqa: E402

# The library's warnings stay out of the runner's lines (the Rust side reads them).
logging.getLogger("sluice_ratelimit").addHandler(logging.NullHandler())

URL = os.environ.get("SLUICE_TEST_URL")
T = 5.0


def route_for(proxies):
    def route(request):
        if request.path == "/login":
            return Check({"ip": request.client_address(proxies)}, policy="login", on_unreachable=CLOSED)
        return None
    return route


def logins(port, source, forwarded, count=15):
    """Statuses of `count` POST /login from `source`, the n-th carrying `forwarded(n)`."""
    statuses = []
    for n in range(count):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=T, source_address=(source, 0))
        try:
            conn.request("POST", "/login", b"", {"X-Forwarded-For": forwarded(n)})
            response = conn.getresponse()
            response.read()
            statuses.append(response.status)
        finally:
            conn.close()
    return statuses


class Scenarios:
    """Each server class gives `serve(proxies) -> port` (stopped at cleanup) and `base`, the
    third byte of its clients' loopback addresses."""

    def test_real_server_rotating_forwarded_for_from_an_untrusted_peer_keeps_one_partition(self):
        port = self.serve(TrustedProxies())
        statuses = logins(port, f"127.48.{self.base}.1", lambda n: f"203.0.113.{n}")
        self.assertEqual((statuses.count(200), statuses.count(429)), (10, 5), statuses)

    def test_real_server_clients_behind_one_trusted_proxy_get_a_partition_each(self):
        port = self.serve(TrustedProxies(["127.48.0.0/16"]))
        proxy = f"127.48.{self.base}.2"
        for client in (f"192.0.2.{self.base}1", f"192.0.2.{self.base}2"):
            # The client rotates what it writes; the proxy appends the address it saw.
            statuses = logins(port, proxy, lambda n: f"198.51.100.{n}, {client}")
            self.assertEqual((statuses.count(200), statuses.count(429)), (10, 5), f"{client}: {statuses}")


class UvicornTest(Scenarios, unittest.TestCase):
    base = 1

    def setUp(self):
        if uvicorn is None:
            self.skipTest("uvicorn is not installed (pip install uvicorn; CI installs it)")

    def serve(self, proxies):
        async def app(scope, receive, send):
            if scope["type"] != "http":
                return
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"welcome"})

        client = AsyncClient(url=URL, timeout=T)
        return serve_asgi(self, SluiceASGI(app, route_for(proxies), client=client), client)


class WsgirefTest(Scenarios, unittest.TestCase):
    base = 2

    def serve(self, proxies):
        def app(environ, start_response):
            start_response("200 OK", [("content-type", "text/plain")])
            return [b"welcome"]

        client = Client(url=URL, timeout=T)
        return serve_wsgi(self, SluiceWSGI(app, route_for(proxies), client=client), client)


if __name__ == "__main__":
    unittest.main()
