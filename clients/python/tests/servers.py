"""Real servers for the suites' scenarios, on a free loopback port each and stopped at the test's
cleanup: uvicorn for an ASGI application, wsgiref for a WSGI one. Not a test module."""

import io
import os
import socket
import threading
import time
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

try:
    import uvicorn
except ImportError:  # CI installs it (.ci/run): there, a missing uvicorn fails the suite
    if os.environ.get("CI") == "true":
        raise
    uvicorn = None

#: How long a server may take to stop.
T = 5.0


def serve_asgi(test, app, client, log_level="warning"):
    """Serves `app` (HTTP scopes) with uvicorn, its own X-Forwarded-For handling off; `client`
    (an AsyncClient: its connections belong to the server's event loop) is closed at the
    server's shutdown. Returns the port."""

    async def with_lifespan(scope, receive, send):
        if scope["type"] != "lifespan":
            return await app(scope, receive, send)
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await client.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    sock = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(with_lifespan, log_level=log_level, lifespan="on", proxy_headers=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()

    def stop():
        server.should_exit = True
        thread.join(T)
        sock.close()

    test.addCleanup(stop)
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.02)
    test.assertTrue(server.started, "uvicorn started")
    return sock.getsockname()[1]


class _QuietHandler(WSGIRequestHandler):
    """No access log, and the applications' raised errors stay out of the runner's lines."""

    def log_message(self, *args):
        pass

    def get_stderr(self):
        return io.StringIO()


class _QuietServer(WSGIServer):
    """Errors of requests whose client left stay quiet too."""

    def handle_error(self, request, client_address):
        pass


def serve_wsgi(test, app, client):
    """Serves `app` with wsgiref (one request at a time); `client` (a Client) is closed when
    the server stops. Returns the port."""
    server = make_server("127.0.0.1", 0, app, server_class=_QuietServer, handler_class=_QuietHandler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()

    def stop():
        server.shutdown()
        server.server_close()
        client.close()
        thread.join(T)

    test.addCleanup(stop)
    return server.server_address[1]
